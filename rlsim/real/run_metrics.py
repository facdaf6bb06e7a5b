"""A logged run's per-step metrics, in veRL's names, from whichever framework wrote them.

- veRL's own (`rlsim.real.validate_verl.read_verl_metrics`: its file logger's JSON Lines, or its
  console lines);
- an rlsim run directory (`rlsim run --real`, which logs under veRL's names): its `steps.parquet`,
  steps counted from 1 as veRL counts them;
- NeMo RL's: its TensorBoard scalars dumped to JSON (`{tag: {step: value}}`, as NeMo RL's own tests
  dump them), or its TensorBoard event files (a `events.out.tfevents.*` file or a folder of them,
  read with the `tensorboard` package), its timing tags renamed:

| NeMo RL | veRL |
|---|---|
| `timing/train/total_step_time` | `timing_s/step` |
| `timing/train/generation` | `timing_s/gen` |
| `timing/train/policy_and_reference_logprobs` | `timing_s/log_probs` (the old log-probs and the reference's together) |
| `timing/train/policy_training` | `timing_s/update_actor` |
| `timing/train/prepare_for_generation/total` | `timing_s/update_weights` (the refit) |
| `train/mean_gen_tokens_per_sample` | `response_length/mean` |
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rlsim.errors import RlsimError
from rlsim.real.validate_verl import read_verl_metrics

NEMO_RL = {
    "timing/train/total_step_time": "timing_s/step",
    "timing/train/generation": "timing_s/gen",
    "timing/train/policy_and_reference_logprobs": "timing_s/log_probs",
    "timing/train/policy_training": "timing_s/update_actor",
    "timing/train/prepare_for_generation/total": "timing_s/update_weights",
    "train/mean_gen_tokens_per_sample": "response_length/mean",
}


def read_run_metrics(path: Path, flag: str = "--metrics") -> tuple[pd.DataFrame, str]:
    """(one row per step: `step` and veRL's names; the format read), or one sentence naming the file."""
    path = Path(path)
    if not path.exists():
        raise RlsimError(f"{flag} {path} does not exist")
    if path.is_dir() and (path / "steps.parquet").is_file():
        return _rlsim_run(path / "steps.parquet"), "an rlsim run directory (steps.parquet)"
    events = sorted(path.glob("**/events.out.tfevents.*")) if path.is_dir() else []
    if events or path.name.startswith("events.out.tfevents."):
        return _nemo_rl(_tensorboard(events or [path], flag), path), "NeMo RL's TensorBoard event files"
    if path.is_dir():
        raise RlsimError(
            f"{flag} {path} is a folder with neither an rlsim run's steps.parquet nor TensorBoard event files"
        )
    if path.suffix == ".json":
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RlsimError(f"{flag} {path} is not JSON ({str(exc).splitlines()[0]})") from None
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise RlsimError(f"{flag} {path}: a JSON dump of TensorBoard scalars is {{tag: {{step: value}}}}")
        return _nemo_rl(raw, path), "NeMo RL's TensorBoard scalars dumped to JSON"
    return read_verl_metrics(path, flag), "veRL's metrics"


def _rlsim_run(steps_path: Path) -> pd.DataFrame:
    steps = pd.read_parquet(steps_path)
    keep = [c for c in steps.columns if c.startswith(("timing_s/", "response_length/"))]
    return steps[keep].assign(step=steps["step"].astype(int) + 1)[["step", *keep]]


def _nemo_rl(raw: dict, where: Path) -> pd.DataFrame:
    rows: dict[int, dict[str, float]] = {}
    for tag, name in NEMO_RL.items():
        for step, value in (raw.get(tag) or {}).items():
            try:
                rows.setdefault(int(step), {})[name] = float(value)
            except (TypeError, ValueError):
                raise RlsimError(f"{where}: {tag} at step {step!r} is not a number ({value!r})") from None
    if not rows or not any("timing_s/step" in r or "timing_s/gen" in r for r in rows.values()):
        raise RlsimError(
            f"{where} has none of NeMo RL's step timings ({', '.join(list(NEMO_RL)[:2])}): not a NeMo RL GRPO run's"
        )
    return pd.DataFrame([{"step": s, **r} for s, r in sorted(rows.items())])


def _tensorboard(files: list[Path], flag: str) -> dict:
    """Every scalar of the event files, `{tag: {step: value}}` (the last value of a step wins)."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError:
        raise RlsimError(
            f"{flag}: reading TensorBoard event files needs the tensorboard package (pip install 'rlsim[logs]'), "
            "or give their JSON dump ({tag: {step: value}})"
        ) from None
    out: dict[str, dict[str, float]] = {}
    for f in files:
        for event in EventFileLoader(str(f)).Load():
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    value = float(v.simple_value)
                elif v.HasField("tensor"):
                    value = float(tensor_util.make_ndarray(v.tensor).reshape(-1)[0])
                else:
                    continue
                out.setdefault(v.tag, {})[str(event.step)] = value
    return out
