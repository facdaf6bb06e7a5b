"""Measure speculative-decoding acceptance under real vLLM: HistoSpec's drafter and vLLM's own.

    rlsim calibrate spec --model PATH_OR_ID --trace TRACE.parquet --out DIR
        [--num-prompts 16] [--max-tokens 128] [--temperature 0] [--methods histospec,ngram]

Runs the trace's first prompts twice, as two visits of an RL epoch. Visit 1 runs with the
HistoSpec drafter and no history, so it may not draft; its responses become the history. Visit 2
runs the same prompts with the drafter fed that history (`rlsim.real.histospec_proposer`, the
`rlsim.spec.drafter` module behind vLLM's `custom_class` hook), and with each other method the
installed vLLM supports (`ngram`; `suffix` needs Arctic Inference). Every acceptance figure comes
from vLLM's own speculative-decoding counters (`SpecDecodingStats`, per position), not from the
drafter's bookkeeping.

Writes DIR/spec.json (per method and visit: drafts, draft tokens, accepted tokens, per-position
acceptance, mean acceptance length = 1 + accepted / drafts) and DIR/spec_iterations.parquet
(verify iterations, which let `rlsim calibrate fit` separate alpha from gamma). Prompts come from
the trace's `prompt_text` through the model's tokenizer when present, else random token ids of
the trace's prompt lengths (seeded by prompt id).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.calibration.grid import check_records_dir
from rlsim.errors import RlsimError
from rlsim.real.vllm_engine import Engine, require_vllm
from rlsim.trace.format import load

PROPOSER = "rlsim.real.histospec_proposer.HistoSpecProposer"


def prompts_from_trace(path: Path, n: int, vocab: int, model: str) -> list[list[int]]:
    trace = load(path)
    first = trace.visit(0).drop_duplicates("prompt_id").head(n)
    if "prompt_text" in first.columns and first["prompt_text"].notna().all():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        return [tok.encode(t, add_special_tokens=False) for t in first["prompt_text"]]
    out = []
    for pid, plen in zip(first["prompt_id"], first["num_prompt_tokens"], strict=True):
        rng = np.random.default_rng(int(pid))
        out.append(rng.integers(2, vocab, max(1, min(int(plen), 1024))).tolist())
    return out


def _summary(spec: dict) -> dict:
    drafts, dtoks, acc = spec["num_drafts"], spec["num_draft_tokens"], spec["num_accepted_tokens"]
    per_pos = [round(a / d, 4) if d else None for a, d in spec.get("per_pos", [])]
    return {
        "num_drafts": drafts,
        "num_draft_tokens": dtoks,
        "num_accepted_tokens": acc,
        "acceptance_rate": round(acc / dtoks, 4) if dtoks else 0.0,
        "mean_acceptance_length": round(1 + acc / drafts, 4) if drafts else 1.0,
        "per_position": per_pos,
        "per_pos_counts": spec.get("per_pos", []),
        "total_s": round(spec.get("total_s", 0.0), 4),
    }


def run(model: str, trace: Path, out: Path, num_prompts: int = 16, max_tokens: int = 128, temperature: float = 0.0,
        methods: tuple[str, ...] = ("histospec", "ngram"), k: int = 16, seed: int = 0, say=None) -> dict:  # fmt: skip

    require_vllm()
    out.mkdir(parents=True, exist_ok=True)
    check_records_dir(out, model)
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    unknown = set(methods) - {"histospec", "ngram", "suffix"}
    if unknown:
        raise RlsimError(f"unknown speculative method(s) {', '.join(sorted(unknown))}; choose histospec, ngram, suffix")
    history = Path(tempfile.mkdtemp(prefix="rlsim-histospec-")) / "history.jsonl"
    history.write_text("")
    os.environ["RLSIM_HISTOSPEC_HISTORY"] = str(history)
    hs = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}

    def requests(prompts: list[list[int]], tag: str) -> list[dict]:
        return [
            {
                "request_id": f"{tag}{i}",
                "prompt_token_ids": p,
                "max_tokens": max_tokens,
                "min_tokens": max_tokens,
                "temperature": temperature,
                "seed": seed + i,
            }  # fmt: skip
            for i, p in enumerate(prompts)
        ]

    max_len = 1024 + max_tokens + k + 8
    eng = Engine(model, seed=seed, max_model_len=max_len, speculative_config=hs)
    vocab = int(eng.engine.vllm_config.model_config.get_vocab_size())
    prompts = prompts_from_trace(trace, num_prompts, vocab, model)
    rec1 = eng.run(requests(prompts, "v1_"), phase="spec")
    results: dict = {"histospec": {"visit1": _summary(rec1.spec)}}
    say(f"visit 1 (histospec, no history): {results['histospec']['visit1']}")
    by_id = {r["request_id"]: r["output_token_ids"] for r in rec1.requests}
    history.write_text(
        "".join(
            json.dumps({"prompt_token_ids": p, "responses": [by_id[f"v1_{i}"]]}) + "\n" for i, p in enumerate(prompts)
        )
    )
    facts = dict(eng.facts)
    del eng
    iterations = [dict(r, method="histospec", visit=1) for r in rec1.iterations]
    configs = {
        "histospec": hs,
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": min(k, 8),
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        },
        "suffix": {"method": "suffix", "num_speculative_tokens": k},
    }
    for method in methods:
        try:
            eng = Engine(model, seed=seed, max_model_len=max_len, speculative_config=configs[method])
        except RlsimError as exc:
            results[method] = {"unsupported": str(exc)}
            say(f"{method}: not supported by this vLLM ({exc})")
            continue
        rec = eng.run(requests(prompts, f"v2_{method}_"), phase="spec")
        results.setdefault(method, {})["visit2"] = _summary(rec.spec)
        same = sum(r["output_token_ids"] == by_id[f"v1_{r['request_id'].rsplit('_', 1)[1]}"] for r in rec.requests)
        results[method]["visit2"]["identical_responses"] = f"{same}/{len(prompts)}"
        iterations += [dict(r, method=method, visit=2) for r in rec.iterations]
        say(f"visit 2 ({method}): {results[method]['visit2']}")
        del eng
    v2 = results["histospec"].get("visit2", {})
    record = {
        "model": model,
        "method": "histospec",
        "num_prompts": len(prompts),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "num_speculative_tokens": k,
        "mean_acceptance_length": v2.get("mean_acceptance_length", 1.0),
        "acceptance_rate": v2.get("acceptance_rate", 0.0),
        "per_position": v2.get("per_position", []),
        "results": results,
        "vllm_version": facts["vllm_version"],
        "hardware": facts["hardware"],
    }
    (out / "spec.json").write_text(json.dumps(record, indent=2) + "\n")
    pd.DataFrame(iterations).to_parquet(out / "spec_iterations.parquet", index=False)
    return record
