"""Measure the training cost per trained token: forward + backward + optimizer step with torch.

    python -m calibrate.train --model PATH_OR_ID --out DIR [--seq-len 256] [--batches 1,2,4,8]

Loads the model with transformers (bf16 on a GPU, float32 on a CPU), runs AdamW steps on random
token batches of `seq_len x batch` tokens (one warm-up, then the median of `--repeats`), and fits
`seconds = fixed_s + tokens * seconds_per_token`. It also times one in-memory copy of all weights,
a lower bound on a weight sync. Writes DIR/train.json, which `rlsim calibrate fit` turns into the
profile's `train` block (6 x params FLOPs per token at the achieved rate) and `weight_sync_s`.
One device only: on a multi-GPU node the per-GPU rate is what the profile needs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rlsim.errors import RlsimError


def measure(model: str, seq_len: int = 256, batches: tuple[int, ...] = (1, 2, 4, 8), repeats: int = 3) -> dict:
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise RlsimError("calibrate.train needs torch and transformers: pip install -e '.[real]'") from None
    from calibrate.engine import check_model, hardware

    check_model(model)
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    try:
        net = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    except Exception as exc:  # transformers raises many types for a model it cannot load
        raise RlsimError(f"transformers could not load model {model} ({str(exc).splitlines()[0]})") from None
    dev = torch.device("cuda" if cuda else "cpu")
    net.to(dev).train()
    params = sum(p.numel() for p in net.parameters())
    vocab = net.config.vocab_size
    opt = torch.optim.AdamW(net.parameters(), lr=1e-6)
    gen = torch.Generator().manual_seed(0)

    def step(b: int) -> float:
        ids = torch.randint(0, vocab, (b, seq_len), generator=gen).to(dev)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    step(batches[0])  # warm-up
    rows = []
    for b in batches:
        rows.append((b * seq_len, statistics.median(step(b) for _ in range(repeats))))
    tokens = [r[0] for r in rows]
    secs = [r[1] for r in rows]
    slope, intercept = _line(tokens, secs)
    if slope <= 0:
        # A noisy machine can time a bigger batch faster than a smaller one; then the cost per
        # token is the line through the origin instead, which is always positive.
        slope = sum(t * s for t, s in rows) / sum(t * t for t in tokens)
        intercept = 0.0
    with torch.no_grad():
        t0 = time.perf_counter()
        copies = [p.detach().clone() for p in net.parameters()]
        if cuda:
            torch.cuda.synchronize()
        sync_s = time.perf_counter() - t0
        del copies
    flops = 6.0 * params
    return {
        "model": model,
        "hardware": hardware(),
        "dtype": str(dtype).replace("torch.", ""),
        "num_params": int(params),
        "seq_len": seq_len,
        "points": [{"tokens": t, "seconds": s} for t, s in rows],
        "seconds_per_token": slope,
        "fixed_s": max(intercept, 0.0),
        "flops_per_token": flops,
        "achieved_flops_per_device": flops / slope if slope > 0 else 0.0,
        "weight_sync_s": sync_s,
        "torch_version": str(torch.__version__),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        return my / mx, 0.0
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
    return slope, my - slope * mx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        from calibrate.decode import check_records_dir, parse_ints

        args.out.mkdir(parents=True, exist_ok=True)
        check_records_dir(args.out, args.model)
        rec = measure(args.model, args.seq_len, parse_ints(args.batches), args.repeats)
    except RlsimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (args.out / "train.json").write_text(json.dumps(rec, indent=2) + "\n")
    print(
        f"{rec['seconds_per_token'] * 1e3:.4g} ms per trained token, fixed {rec['fixed_s']:.3g} s; "
        f"wrote {args.out}/train.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
