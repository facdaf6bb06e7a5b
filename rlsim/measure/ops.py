"""Time the operators of a decode iteration with torch alone (no vLLM), at a model's real shapes.

    rlsim calibrate ops --model PATH --out DIR [--tp 1] [--device cuda|cpu]
    torchrun --nproc-per-node 2 -m rlsim.cli calibrate ops --model PATH --out DIR   # TP 2: all-reduce measured

`PATH` is a Hugging Face model directory (or its `config.json`): only the shapes are read, and the
weights are random tensors of those shapes, one tensor-parallel rank's shard each, so a 32B model
needs no checkpoint. Per grid cell (running batch B x context per sequence, and prefill chunks)
it times one decoder layer's operators, each the median of `--repeats` runs after a warm-up:
- the linear layers at B tokens (QKV, output projection, gate/up, down; RMSNorms),
- attention: `scaled_dot_product_attention` of B one-token queries over B x context cached keys
  and values (grouped-query, the rank's heads), causal over the chunk for prefill,
- the all-reduce of B x hidden activations, twice, when run under `torchrun` with several ranks,
and once per iteration the LM head and the sampler (softmax and a draw over the vocabulary).
An iteration is layers x layer + LM head + sampler. What an engine adds around its operators
(scheduling, input preparation) is not an operator: calibrate with vLLM (`rlsim calibrate decode`) to
measure it; the profile's provenance says it is missing.

Writes DIR/facts.json, DIR/iterations.parquet (the same columns as `rlsim calibrate decode`, phase
`grid`) and DIR/train.json (one layer's forward and backward at the same shapes, times the layer
count), so that `rlsim calibrate fit DIR` makes a profile exactly as from vLLM records. Runs on a
CPU too, with a tiny model (the tests). Bad input is one sentence and exit code 2.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rlsim.errors import RlsimError

GPU_BATCHES, GPU_CONTEXTS, GPU_PREFILL = (1, 4, 16, 32, 64, 128, 256), (1024, 4096, 8192, 16384), (512, 2048, 8192)
CPU_BATCHES, CPU_CONTEXTS, CPU_PREFILL = (1, 2, 4, 8, 16, 32), (64, 256, 1024), (64, 256, 512)


@dataclass(frozen=True, slots=True)
class Shapes:
    """What the operators need of a model, from its Hugging Face config."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def num_params(self) -> float:
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def read_shapes(model: str) -> tuple[Shapes, str]:
    """Shapes and model name from a model directory or config.json; one sentence if unusable."""
    path = Path(model).expanduser()
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.exists():
        raise RlsimError(f"model path {model} does not exist or holds no config.json")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RlsimError(f"{cfg_path} is not valid JSON") from None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else cfg
    need = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    missing = [k for k in need if not isinstance(cfg, dict) or not isinstance(cfg.get(k), int) or cfg[k] <= 0]
    if missing:
        raise RlsimError(f"{cfg_path} lacks a positive integer '{missing[0]}' (not a decoder-only model config)")
    heads = cfg["num_attention_heads"]
    shapes = Shapes(
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"],
        heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads), vocab=cfg["vocab_size"],
    )  # fmt: skip
    name = path.parent.name if path.suffix == ".json" else path.name
    return shapes, name


class Layer:
    """One decoder layer's weights, one tensor-parallel rank's shard, random."""

    def __init__(self, torch: Any, s: Shapes, tp: int, dtype: Any, device: Any) -> None:
        if s.heads % tp or s.kv_heads % tp and tp % s.kv_heads or s.intermediate % tp:
            raise RlsimError(f"TP {tp} does not divide the model's heads ({s.heads}, {s.kv_heads} KV) and MLP")
        self.t, self.s, self.tp = torch, s, tp
        self.h, self.kvh = s.heads // tp, max(1, s.kv_heads // tp)
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, generator=g) * 0.02).to(device=device, dtype=dtype)

        self.qkv = w((self.h + 2 * self.kvh) * s.head_dim, s.hidden)
        self.o = w(s.hidden, self.h * s.head_dim)
        self.gate_up = w(2 * s.intermediate // tp, s.hidden)
        self.down = w(s.hidden, s.intermediate // tp)
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.dtype, self.device = dtype, device

    def linear(self, x: Any) -> Any:
        """Norms and projections around attention at len(x) tokens (attention itself apart)."""
        F = self.t.nn.functional
        y = F.rms_norm(x, (self.s.hidden,), self.norm)
        qkv = F.linear(y, self.qkv)
        a = F.linear(qkv[:, : self.h * self.s.head_dim], self.o)  # the queries stand in for attention's output
        y = F.rms_norm(x + a, (self.s.hidden,), self.norm)
        gu = F.linear(y, self.gate_up)
        gate, up = gu.chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down)

    def decode_attention(self, q: Any, k: Any, v: Any) -> Any:
        return self.t.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=self.h != self.kvh)

    def prefill_attention(self, q: Any, k: Any, v: Any) -> Any:
        return self.t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kvh)


def _timer(torch: Any, device: Any, repeats: int):  # noqa: ANN202
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run(fn) -> float:  # noqa: ANN001
        fn()  # warm-up
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return run


def measure(model: str, out: Path, tp: int = 1, device: str | None = None, repeats: int = 5,
            batches: tuple[int, ...] | None = None, contexts: tuple[int, ...] | None = None,
            prefill: tuple[int, ...] | None = None, gpu_memory_utilization: float = 0.9,
            kv_capacity_tokens: int | None = None) -> dict:  # fmt: skip
    """Time the grid and write the records; returns facts.json's content."""
    try:
        import torch
    except ImportError:
        raise RlsimError("rlsim calibrate ops needs torch: pip install torch") from None

    shapes, name = read_shapes(model)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist = world > 1
    if dist:
        tp = world
    if tp < 1:
        raise RlsimError(f"--tp must be >= 1, got {tp}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RlsimError("--device cuda asked but torch sees no CUDA GPU")
    dev_type = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(dev_type, int(os.environ.get("LOCAL_RANK", "0")) if dev_type == "cuda" else None)
    if dev_type == "cuda":
        torch.cuda.set_device(dev)
    if dist and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if dev_type == "cuda" else "gloo")
    dtype = torch.bfloat16 if dev_type == "cuda" else torch.float32
    dtype_bytes = 2 if dtype == torch.bfloat16 else 4
    gpu = dev_type == "cuda"
    batches = batches or (GPU_BATCHES if gpu else CPU_BATCHES)
    contexts = contexts or (GPU_CONTEXTS if gpu else CPU_CONTEXTS)
    prefill = prefill or (GPU_PREFILL if gpu else CPU_PREFILL)
    layer = Layer(torch, shapes, tp, dtype, dev)
    lm_head = (torch.randn(shapes.vocab // tp, shapes.hidden) * 0.02).to(dev, dtype)
    run = _timer(torch, dev, repeats)
    d, h, kvh, L = shapes.head_dim, layer.h, layer.kvh, shapes.layers

    def allreduce(n: int) -> float:
        if not dist:
            return 0.0
        buf = torch.randn(n, shapes.hidden, device=dev, dtype=dtype)
        return run(lambda: torch.distributed.all_reduce(buf))

    def head_and_sampler(n: int) -> float:
        x = torch.randn(n, shapes.hidden, device=dev, dtype=dtype)

        def fn() -> None:
            logits = torch.nn.functional.linear(x, lm_head).float()
            torch.multinomial(torch.softmax(logits, dim=-1), 1)

        return run(fn)

    rows: list[dict] = []
    total = len(batches) * len(contexts) + len(prefill)
    k = 0
    with torch.no_grad():
        for b in batches:
            x = torch.randn(b, shapes.hidden, device=dev, dtype=dtype)
            t_lin = run(lambda: layer.linear(x))  # noqa: B023
            t_ar = 2 * allreduce(b)
            t_head = head_and_sampler(b)
            for ctx in contexts:
                k += 1
                q = torch.randn(b, h, 1, d, device=dev, dtype=dtype)
                kv = torch.randn(b, kvh, ctx, d, device=dev, dtype=dtype)
                t_attn = run(lambda: layer.decode_attention(q, kv, kv))  # noqa: B023
                step = L * (t_lin + t_attn + t_ar) + t_head
                rows.append(_row("grid", b, b * ctx, b, 0, 0, step, t_lin * L, t_attn * L, t_ar * L, t_head))
                if rank == 0:
                    print(
                        f"cell {k}/{total}: batch {b}, context {ctx}: {step * 1e3:.3f} ms", file=sys.stderr, flush=True
                    )
                del kv
        for n in prefill:
            k += 1
            x = torch.randn(n, shapes.hidden, device=dev, dtype=dtype)
            q = torch.randn(1, h, n, d, device=dev, dtype=dtype)
            kv = torch.randn(1, kvh, n, d, device=dev, dtype=dtype)
            t_lin = run(lambda: layer.linear(x))  # noqa: B023
            t_attn = run(lambda: layer.prefill_attention(q, kv, kv))  # noqa: B023
            t_ar = 2 * allreduce(n)
            t_head = head_and_sampler(1)
            step = L * (t_lin + t_attn + t_ar) + t_head
            rows.append(_row("grid", 0, 0, 0, 1, n, step, t_lin * L, t_attn * L, t_ar * L, t_head))
            if rank == 0:
                print(f"cell {k}/{total}: prefill {n} tokens: {step * 1e3:.3f} ms", file=sys.stderr, flush=True)
    train = _train_cost(torch, layer, shapes, dev, run, name)
    kv_bytes_rank = 2 * L * kvh * d * dtype_bytes
    weight_bytes_rank = shapes.num_params * dtype_bytes / tp
    if kv_capacity_tokens is None:
        if gpu:
            _, total_mem = torch.cuda.mem_get_info(dev)
            budget = total_mem * gpu_memory_utilization - weight_bytes_rank
        else:
            budget = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")) * 2**30  # vLLM's CPU default
        kv_capacity_tokens = int(budget // kv_bytes_rank) // 16 * 16
    if kv_capacity_tokens <= 0:
        raise RlsimError(f"the model's weights leave no KV memory at gpu_memory_utilization {gpu_memory_utilization}")
    facts = {
        "model": name,
        "source": "rlsim calibrate ops",
        "tensor_parallel_size": tp,
        "dtype": str(dtype).replace("torch.", ""),
        "num_gpu_blocks": kv_capacity_tokens // 16 + 1,
        "block_size": 16,
        "kv_capacity_tokens": kv_capacity_tokens,
        "max_num_seqs": max(batches),
        "max_num_batched_tokens": max(max(prefill), max(batches)),
        "vocab_size": shapes.vocab,
        "vllm_version": None,
        "torch_version": str(torch.__version__),
        "hardware": _hardware(torch, dev, tp),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "grid": {"batches": list(batches), "contexts": list(contexts), "prefill": list(prefill), "repeats": repeats},
        "allreduce": "measured" if dist else ("none (TP 1)" if tp == 1 else f"not measured: TP {tp} in one process"),
        "not_measured": "engine time around the operators (scheduling, input preparation): rlsim calibrate decode "
        "measures it",
        "model_facts": {
            "num_params": shapes.num_params,
            "num_layers": L,
            "hidden_size": shapes.hidden,
            "num_kv_heads": shapes.kv_heads,
            "head_dim": d,
            "dtype_bytes": dtype_bytes,
        },  # fmt: skip
    }
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(out / "iterations.parquet", index=False)
        (out / "train.json").write_text(json.dumps(train, indent=2) + "\n")
        (out / "facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    if dist:
        torch.distributed.destroy_process_group()
    return facts


def _row(phase: str, gen_req: int, ctx_tokens: int, gen_tokens: int, pre_req: int, pre_tokens: int, step: float,
         lin: float, attn: float, ar: float, head: float) -> dict:  # fmt: skip
    return {
        "phase": phase, "num_generation_requests": gen_req, "num_ctx_requests": pre_req, "context_tokens": ctx_tokens,
        "num_generation_tokens": gen_tokens, "num_ctx_tokens": pre_tokens, "step_s": step, "linear_s": lin,
        "attention_s": attn, "allreduce_s": ar, "lm_head_sampler_s": head,
    }  # fmt: skip


def _train_cost(torch: Any, layer: Layer, s: Shapes, dev: Any, run, model: str) -> dict:  # noqa: ANN001
    """One layer's linear forward and backward at 512 and 2,048 tokens, times the layer count."""
    params = [t.detach().clone().requires_grad_(True) for t in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    for p, name in zip(params, ("qkv", "o", "gate_up", "down"), strict=True):
        setattr(layer, name, p)
    points = []
    for n in (512, 2048):
        x = torch.randn(n, s.hidden, device=dev, dtype=layer.dtype)

        def step() -> None:
            layer.linear(x).float().sum().backward()  # noqa: B023

        points.append((n, run(step) * s.layers))
    (n0, t0), (n1, t1) = points
    per_token = max((t1 - t0) / (n1 - n0), t1 / n1 / 4)
    flops = 6.0 * s.num_params
    t_sync = run(lambda: [p.detach().clone() for p in params]) * s.layers
    return {
        "model": model,
        "hardware": layer.device.type,
        "num_params": s.num_params,
        "points": [{"tokens": n, "seconds": t} for n, t in points],
        "seconds_per_token": per_token,
        "fixed_s": max(t0 - per_token * n0, 0.0),
        "flops_per_token": flops,
        "achieved_flops_per_device": flops / per_token,
        "weight_sync_s": t_sync,
        "source": "rlsim calibrate ops: one layer's linear forward and backward, times the layer count",
    }


def _hardware(torch: Any, dev: Any, tp: int) -> str:
    if dev.type == "cuda":
        return f"{tp}x {torch.cuda.get_device_name(dev)}"
    return f"CPU {platform.machine()} x{os.cpu_count()}"
