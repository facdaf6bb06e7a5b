"""Measure what `rlsim profile derive` predicts on a real GPU, with torch alone (no vLLM needed).

    python -m benchmarks.gpu_operators --out DIR [--smoke]
    python -m benchmarks.gpu_operators --shapes CONFIG_JSON --tp N   # the per-rank shapes it measures

Writes three CSV files to DIR, which `tests/test_derive_measured.py` and
`doctables/derive_table.py` hold the derivation against:

- `linear_layers.csv`: one decoder layer's linear layers on one TP rank, for dense models of the
  shipped table at every TP vLLM accepts (the heads divide), at 1..4,096 tokens. Each layer's
  weights have vLLM's per-rank shapes (QKV column-parallel, KV heads replicated past as many ranks
  as there are KV heads; O row-parallel; gate/up merged; down row-parallel) and are distinct, so no
  layer is served from L2. Timed as vLLM runs decode, in a CUDA graph, two ways: the four GEMMs
  alone (`gemm_s`), and the layer body with its RMSNorms, SiLU-and-multiply and residual adds
  (`layer_s`: torch's kernels, not vLLM's fused ones). Attention, the all-reduces and the LM head
  are not in it (the derivation charges them apart).
- `device.csv`: achieved HBM bandwidth (a device-to-device copy of 4 GiB) and bf16 GEMM FLOP/s
  (8192 x 8192 x 8192), against which the datasheet's figures are read.
- `train_mfu.csv`: a Hugging Face model (Qwen2.5-7B's and 14B's layer shapes, 8 layers, random
  weights, SDPA attention, bf16) forward and backward over one packed sequence, as veRL's FSDP
  trainer computes a micro-batch on one GPU (no optimizer step, no sharding traffic); its MFU under
  rlsim's FLOP count (`rlsim.step_costs.forward_flops`, the update three forwards).

`--smoke` runs a few tiny cases on whatever device torch finds, to check the script itself.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it runs: `--shapes` prints shapes() without torch
    import torch

MODELS_JSON = Path(__file__).resolve().parents[1] / "rlsim" / "derive" / "models.json"
DENSE = ("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "llama-3.1-8b")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
MIN_BYTES = 2 * 2**30  # enough distinct layers that the weights stream from HBM, not L2


def shapes(cfg: dict, tp: int) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer on one rank, as vLLM shards them."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    kv_rank = max(1, kv // tp)  # vLLM replicates KV heads past as many ranks as there are
    inter = cfg["intermediate_size"]
    return {
        "qkv": (h, (heads // tp + 2 * kv_rank) * hd),
        "o": (heads // tp * hd, h),
        "gate_up": (h, 2 * inter // tp),
        "down": (inter // tp, h),
    }


def _time_graph(fn, reps: int) -> float:  # noqa: ANN001 - a callable
    """Median seconds of one replay of `fn` captured in a CUDA graph (or timed eagerly on CPU)."""
    import torch

    if not torch.cuda.is_available():
        fn()
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def linear_layers(models: dict, dev: str, dtype: torch.dtype, tokens: tuple[int, ...], reps: int) -> list[dict]:
    import torch

    rows = []
    for name, cfg in models.items():
        for tp in (1, 2, 4, 8):
            if cfg["num_attention_heads"] % tp:
                continue  # vLLM refuses a TP that does not divide the heads
            sh = shapes(cfg, tp)
            per_layer = sum(i * o for i, o in sh.values()) * 2
            n = max(2, min(cfg["num_hidden_layers"], -(-MIN_BYTES // per_layer)))
            layers = [
                {k: torch.randn(o, i, device=dev, dtype=dtype) * 0.02 for k, (i, o) in sh.items()} for _ in range(n)
            ]
            h = cfg["hidden_size"]
            norm_w = torch.ones(h, device=dev, dtype=dtype)
            for t in tokens:
                x = torch.randn(t, h, device=dev, dtype=dtype)
                attn = torch.randn(t, sh["o"][0], device=dev, dtype=dtype)  # what attention hands O
                act = torch.randn(t, sh["down"][0], device=dev, dtype=dtype)

                def gemms(x=x, attn=attn, act=act, layers=layers) -> None:  # noqa: ANN001
                    for w in layers:
                        torch.nn.functional.linear(x, w["qkv"])
                        torch.nn.functional.linear(attn, w["o"])
                        torch.nn.functional.linear(x, w["gate_up"])
                        torch.nn.functional.linear(act, w["down"])

                def body(x=x, attn=attn, layers=layers, h=h, norm_w=norm_w) -> None:  # noqa: ANN001
                    r = x
                    for w in layers:
                        y = torch.nn.functional.rms_norm(r, (h,), norm_w, 1e-6)
                        torch.nn.functional.linear(y, w["qkv"])
                        r = r + torch.nn.functional.linear(attn, w["o"])
                        y = torch.nn.functional.rms_norm(r, (h,), norm_w, 1e-6)
                        u = torch.nn.functional.linear(y, w["gate_up"])
                        d = u.shape[1] // 2
                        r = r + torch.nn.functional.linear(torch.nn.functional.silu(u[:, :d]) * u[:, d:], w["down"])

                g, b = _time_graph(gemms, reps) / n, _time_graph(body, reps) / n
                rows.append(
                    {
                        "model": name,
                        "tp": tp,
                        "tokens": t,
                        "gemm_s": f"{g:.6e}",
                        "layer_s": f"{b:.6e}",
                        "layers_timed": n,
                    }
                )
                print(f"{name} tp{tp} {t:5d} tokens: gemm {g * 1e6:8.1f} us  layer {b * 1e6:8.1f} us", flush=True)
            del layers
            if dev == "cuda":
                torch.cuda.empty_cache()
    return rows


def device_facts(dev: str, dtype: torch.dtype, smoke: bool) -> list[dict]:
    import torch

    n = 2**20 if smoke else 2 * 2**30  # elements of bf16: 4 GiB
    src = torch.empty(n, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    copy_s = _time_graph(lambda: dst.copy_(src), 10)
    k = 256 if smoke else 8192
    a, b = torch.randn(k, k, device=dev, dtype=dtype), torch.randn(k, k, device=dev, dtype=dtype)
    mm_s = _time_graph(lambda: a @ b, 10)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    props = torch.cuda.get_device_properties(0) if dev == "cuda" else None
    return [
        {"fact": "device", "value": name},
        {"fact": "memory_bytes", "value": props.total_memory if props else 0},
        {"fact": "hbm_copy_bytes_per_s", "value": f"{2 * n * 2 / copy_s:.4e}"},
        {"fact": "bf16_gemm_flops_per_s", "value": f"{2 * k**3 / mm_s:.4e}"},
        {"fact": "torch", "value": torch.__version__},
    ]


def train_mfu(models: dict, dev: str, smoke: bool) -> list[dict]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM  # the trainer's own model classes

    rows = []
    for name in ("qwen2.5-7b", "qwen2.5-14b"):
        raw = dict(models[name])
        layers = 1 if smoke else 8
        cfg = AutoConfig.for_model(
            raw["model_type"], hidden_size=raw["hidden_size"] // (16 if smoke else 1),
            intermediate_size=raw["intermediate_size"] // (16 if smoke else 1), num_hidden_layers=layers,
            num_attention_heads=raw["num_attention_heads"] // (4 if smoke else 1),
            num_key_value_heads=raw["num_key_value_heads"] // (4 if smoke else 1),
            vocab_size=raw["vocab_size"] // (64 if smoke else 1), tie_word_embeddings=False,
            attn_implementation="sdpa", torch_dtype=torch.bfloat16, use_cache=False,
        )  # fmt: skip
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).to(dev)
        model.train()
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        hd = hidden // cfg.num_attention_heads
        layer_params = (hidden * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
                        + cfg.num_attention_heads * hd * hidden + 3 * hidden * inter)  # fmt: skip
        params = layers * layer_params + cfg.vocab_size * hidden  # linear layers and the LM head
        for seq in (128,) if smoke else (2048, 4096, 8192):
            ids = torch.randint(0, cfg.vocab_size, (1, seq), device=dev)

            def step(ids=ids, model=model) -> None:  # noqa: ANN001
                out = model(input_ids=ids, labels=ids)
                out.loss.backward()

            for _ in range(1 if smoke else 3):
                step()
            if dev == "cuda":
                torch.cuda.synchronize()
            reps = 1 if smoke else 5
            t = time.perf_counter()
            for _ in range(reps):
                step()
            if dev == "cuda":
                torch.cuda.synchronize()
            s = (time.perf_counter() - t) / reps
            flops = 3 * (2 * params * seq + 2 * layers * hidden * seq * seq)  # rlsim's count: update = 3 forwards
            rows.append(
                {
                    "model_shapes": name,
                    "layers": layers,
                    "seq_len": seq,
                    "step_s": f"{s:.5e}",
                    "model_flops": f"{flops:.5e}",
                    "achieved_flops_per_s": f"{flops / s:.5e}",
                }
            )
            rate = flops / s / 1e12
            print(f"train {name} x{layers} layers seq {seq}: {s * 1e3:.1f} ms, {rate:.0f} TFLOP/s", flush=True)
            model.zero_grad(set_to_none=True)
        del model
        if dev == "cuda":
            torch.cuda.empty_cache()
    return rows


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shapes", metavar="CONFIG_JSON", help="Print the per-rank (in, out) shapes of a model's "
                    "config (a JSON object) at --tp as JSON, measure nothing.")  # fmt: skip
    ap.add_argument("--tp", type=int, default=1)
    args = ap.parse_args()
    if args.shapes:
        print(json.dumps(shapes(json.loads(args.shapes), args.tp)))
        return
    if args.out is None:
        ap.error("--out DIR is required to measure")
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    raw = json.loads(MODELS_JSON.read_text())
    models = {k: raw[k] for k in DENSE}
    if args.smoke:
        models = {
            "qwen2.5-7b": dict(
                raw["qwen2.5-7b"],
                hidden_size=256,
                intermediate_size=512,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=64,
            )
        }
    t0 = time.perf_counter()
    _write(args.out / "device.csv", device_facts(dev, dtype, args.smoke))
    _write(
        args.out / "linear_layers.csv",
        linear_layers(models, dev, dtype, (1, 8) if args.smoke else TOKENS, 3 if args.smoke else 20),
    )
    _write(args.out / "train_mfu.csv", train_mfu(raw, dev, args.smoke))
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
