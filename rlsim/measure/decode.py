"""Measure a real vLLM engine's decode iterations over a grid of batch sizes and context lengths.

    rlsim calibrate decode --model PATH_OR_ID [--tp N] --out DIR [--grid small|default]
        [--batch-sizes 1,4,16,64] [--prompt-lens 64,512,2048] [--output-len 256]

Each grid cell submits B requests with random prompts of P tokens and exactly L output tokens
(`min_tokens = max_tokens = L`, `ignore_eos`, prefix caching off) and steps the engine until they
finish, recording every iteration (wall time of `LLMEngine.step()`, KV context, prefill and decode
tokens, vLLM's own iteration details) and every request (vLLM's timestamps). Cells run twice in a
seeded random order. A `workload` phase, a mixed RL-like batch (prompts x samples, long-tailed
lengths), runs three times spread between the cells (the median total counts); the fit never
sees it: `rlsim calibrate fit` replays it in the simulator and reports the prediction error.

Writes DIR/facts.json (engine facts: `num_gpu_blocks` x `block_size` = KV capacity in tokens,
`max_num_seqs`, vLLM and torch versions, hardware), DIR/iterations.parquet,
DIR/requests.parquet and DIR/workload.json. Exit code 2 with one sentence for a missing model, a
grid that does not fit the KV cache, or a DIR holding another model's records.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.calibration.grid import (
    SAMPLING_TEMPERATURE,
    DecodeConfig,
    cell_lengths,
    check_grid,
    check_records_dir,
)
from rlsim.hostload import LoadMeter, describe, speed_probe
from rlsim.real.vllm_engine import PROBE_REPEATS, Engine, probe_requests, warmup_requests


def engine_probe_ms(eng, vocab: int, tag: str) -> float:  # noqa: ANN001 - rlsim.real.vllm_engine.Engine
    """Milliseconds the engine takes for the probe batch (`rlsim.real.vllm_engine.probe_requests`),
    median of its repeats; not part of the records the fit sees."""
    times = [eng.run(probe_requests(vocab, f"{tag}{k}"), phase="probe").spec["total_s"] for k in range(PROBE_REPEATS)]
    return 1e3 * float(np.median(times))


def workload_requests(cfg: DecodeConfig, vocab: int, rng: np.random.Generator) -> list[dict]:
    """An RL-like batch: prompts x samples, lognormal lengths (sigma 0.8), prompt-correlated."""
    reqs = []
    for p in range(cfg.workload_prompts):
        plen = int(rng.integers(16, 128))
        prompt = rng.integers(2, vocab, plen).tolist()
        a = rng.standard_normal()
        for s in range(cfg.workload_samples):
            z = 0.6 * a + 0.8 * rng.standard_normal()
            n = int(np.clip(round(cfg.workload_median * np.exp(0.8 * z)), 2, 8 * cfg.workload_median))
            reqs.append(
                {
                    "request_id": f"w{p}_{s}",
                    "prompt_id": p,
                    "sample_idx": s,
                    "prompt_token_ids": prompt,
                    "max_tokens": n,
                    "temperature": SAMPLING_TEMPERATURE,
                }
            )
    return reqs


def run(cfg: DecodeConfig, progress=None) -> Path:
    cfg.out.mkdir(parents=True, exist_ok=True)
    check_records_dir(cfg.out, cfg.model)
    max_len = max(cfg.prompt_lens) * 3 // 2 + 1 + max(cfg.output_len, 8 * cfg.workload_median) + 16
    eng = Engine(
        cfg.model,
        tp=cfg.tp,
        seed=cfg.seed,
        max_model_len=max_len,
        max_num_seqs=min(max(256, max(cfg.batch_sizes)), 1024),
    )
    facts = dict(eng.facts)
    facts["vocab_size"] = int(eng.engine.vllm_config.model_config.get_vocab_size())
    check_grid(cfg, facts)
    rng = np.random.default_rng(cfg.seed)
    vocab = facts["vocab_size"]
    iterations, requests = [], []
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))

    warm = [
        {"request_id": f"warm{i}", "prompt_token_ids": rng.integers(2, vocab, 32).tolist(), "max_tokens": 32}
        for i in range(4)
    ]
    widest = min(max(max(cfg.batch_sizes), cfg.workload_prompts * cfg.workload_samples), facts["max_num_seqs"])
    say(f"warm-up: {len(warm)} short requests, then every batch width up to {widest} (not recorded)")
    t0 = time.perf_counter()
    eng.run(warm, phase="warmup")
    eng.run(warmup_requests(vocab, widest), phase="warmup")
    ncells = len(cfg.batch_sizes) * len(cfg.prompt_lens)
    took = time.perf_counter() - t0
    say(f"warm-up done in {took:.1f} s; measuring {ncells} grid cells, {cfg.grid_repeats} times each")
    meter = LoadMeter()  # what other processes took of the CPUs while the grid was measured
    probes = [speed_probe()]  # and how fast the machine itself was, before and after
    engine_probes = [engine_probe_ms(eng, vocab, "before")]
    # Grid cells (each twice) in a seeded random order, with the workload runs spread evenly
    # between them: a machine whose speed drifts then biases neither the fit nor the replay.
    cells = [(b, p) for p in cfg.prompt_lens for b in cfg.batch_sizes] * cfg.grid_repeats
    order = rng.permutation(len(cells))
    work = workload_requests(cfg, vocab, rng)
    at = {int(round(i * len(cells) / max(cfg.workload_repeats - 1, 1))) for i in range(cfg.workload_repeats)}
    totals: list[float] = []
    for k in range(len(cells) + 1):
        if k in at and len(totals) < cfg.workload_repeats:
            rep = len(totals)
            batch = [dict(r, request_id=f"{r['request_id']}_r{rep}") for r in work]
            rec = eng.run(batch, phase="workload")
            for row in rec.iterations:
                row["repeat"] = rep
            iterations += rec.iterations
            requests += rec.requests
            totals.append(rec.spec["total_s"])
            say(f"workload {rep + 1}/{cfg.workload_repeats}: {len(work)} requests, {totals[-1]:.2f} s")
        if k == len(cells):
            break
        b, p = cells[order[k]]
        plens, outs = cell_lengths(b, p, cfg.output_len)
        reqs = [
            {
                "request_id": f"g{k}_{i}",
                "prompt_token_ids": rng.integers(2, vocab, plens[i]).tolist(),
                "max_tokens": outs[i],
                "temperature": SAMPLING_TEMPERATURE,
            }
            for i in range(b)
        ]
        rec = eng.run(reqs, phase="grid")
        for row in rec.iterations:
            row.update(cell=k, cell_batch=b, cell_prompt_len=p)
        iterations += rec.iterations
        requests += rec.requests
        say(
            f"cell {k + 1}/{len(cells)}: batch {b}, prompt {p}: "
            f"{len(rec.iterations)} iterations, {rec.spec['total_s']:.2f} s"
        )

    engine_probes.append(engine_probe_ms(eng, vocab, "after"))
    host_load = meter.read()
    probes.append(speed_probe())
    host_load["host/probe_ms"] = round(float(np.mean(probes)), 3)
    host_load["host/engine_probe_ms"] = round(float(np.mean(engine_probes)), 3)
    say(f"host load during the measurements: {describe(host_load)}")
    for r in requests:
        r.pop("output_token_ids", None)
    pd.DataFrame(iterations).to_parquet(cfg.out / "iterations.parquet", index=False)
    pd.DataFrame(requests).to_parquet(cfg.out / "requests.parquet", index=False)
    (cfg.out / "workload.json").write_text(
        json.dumps(
            {
                "model": cfg.model,
                "measured_total_s": float(np.median(totals)),
                "measured_totals_s": totals,
                # the load the repeats ran under (1, 5, 15 min): a neighbour's work shows here
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "requests": [
                    {k: r[k] for k in ("prompt_id", "sample_idx", "max_tokens")}
                    | {"num_prompt_tokens": len(r["prompt_token_ids"])}
                    for r in work
                ],
            }
        )
    )
    facts["host_load"] = host_load
    facts["grid"] = {
        "batch_sizes": list(cfg.batch_sizes),
        "prompt_lens": list(cfg.prompt_lens),
        "output_len": cfg.output_len,
    }
    (cfg.out / "facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    return cfg.out
