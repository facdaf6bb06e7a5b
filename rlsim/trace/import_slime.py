"""slime rollout dumps (`--save-debug-rollout-data DIR/{rollout_id}.pt`, github.com/THUDM/slime):
one torch file per rollout step holding

    {rollout_id, samples: [Sample.to_dict(), ...], metadata (newer slime)}

where a sample is `{group_index, index, prompt, tokens: prompt + response token ids, response,
response_length, reward: float or {key: value}, status: completed | truncated | aborted | ...}`.
Evaluation dumps (`eval_{id}.pt`) are skipped. A group (`group_index`) is one prompt's GRPO
group; the same prompt (text) in a later rollout is a later visit (epoch = visit index). The
response's real token ids are kept, `truncated` samples mark the cap, and a dict reward is read
at `--reward-key` or its single numeric entry. Reading needs torch (`torch.load` with
`weights_only=True`: the dumps hold only plain Python values).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.trace.rawlog import PromptVisits, RawLog, step_of


def _files(src: Path) -> list[Path]:
    return sorted(
        (p for p in src.glob("*.pt") if re.search(r"\d+$", p.stem) and not p.stem.startswith("eval_")), key=step_of
    )


def _load(path: Path) -> dict:
    try:
        import torch
    except ImportError:
        raise RlsimError("slime dumps are torch files: the slime importer needs torch (pip install torch)") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise RlsimError(f"{path} is not a readable slime rollout dump ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise RlsimError(f"{path} is not a slime rollout dump: it holds no 'samples' list")
    return data


def _reward(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        numeric = [float(v) for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numeric) == 1:
            return numeric[0]
    return None


def read_slime(src: Path) -> RawLog:
    """Read a folder of slime rollout dumps (see module docstring)."""
    files = _files(src)
    if not files:
        raise RlsimError(f"{src} has no slime {{rollout_id}}.pt dumps")
    visit_of = PromptVisits()
    records = []
    aborted = 0
    for path in files:
        data = _load(path)
        step = int(data.get("rollout_id", step_of(path)))
        groups: dict[object, list[dict]] = {}
        for n, sample in enumerate(data["samples"]):
            if not isinstance(sample, dict) or "tokens" not in sample or "response_length" not in sample:
                raise RlsimError(f"{path}: sample {n} lacks the 'tokens' and 'response_length' of a slime Sample")
            if sample.get("status") in ("aborted", "failed"):
                aborted += 1
                continue
            groups.setdefault(sample.get("group_index", n), []).append(sample)
        for members in groups.values():
            members.sort(key=lambda s: (s.get("index") is None, s.get("index") or 0))
            prompt = members[0].get("prompt", "")
            key = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
            pid, epoch = visit_of(key, step)
            for s, sample in enumerate(members):
                tokens, length = list(sample["tokens"]), int(sample["response_length"])
                if length <= 0 or length >= len(tokens):
                    raise RlsimError(
                        f"{path}: a sample's response_length {length} does not fit its {len(tokens)} tokens"
                    )
                records.append(
                    (
                        step, epoch, pid, s, len(tokens) - length, length,
                        np.asarray(tokens[-length:], dtype=np.int32), key,
                        sample.get("status") == "truncated", _reward(sample.get("reward")),
                    )
                )  # fmt: skip
    cols = ["step", "epoch", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens"]
    cols += ["output_token_ids", "prompt_text", "truncated", "reward"]
    df = pd.DataFrame(records, columns=cols)
    notes = []
    if aborted:
        notes.append(f"{aborted:,} aborted or failed samples skipped")
    if df["reward"].notna().all():
        df["reward"] = df["reward"].astype(np.float32)
        notes.append("rewards imported from the samples' 'reward'")
    else:
        df = df.drop(columns="reward")
    return RawLog(df, f"real:slime/{src.name}", {"format": "slime", "files": len(files)}, notes, token_ids="real")
