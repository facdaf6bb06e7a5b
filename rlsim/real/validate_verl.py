"""`rlsim validate --verl-metrics FILE --log DIR`: a user's own veRL run against the simulator.

veRL logs one dict of metrics per training step: `timing_s/gen` (rollout), `timing_s/step`,
`response_length/mean` and so on. Its file backend writes them as JSON Lines,
`{"step": N, "data": {...}}` (a flat `{"step": N, "timing_s/gen": ...}` is read too), and its
console backend as `step:N - timing_s/gen:12.3 - ...` lines, which may sit inside a longer
console log. The same steps' responses, from veRL's `rollout_data_dir` dump or a PolyTrace log
(anything `rlsim trace import` reads), become a trace whose `step` column makes the simulation
generate the log's prompts in the log's order. The simulation runs on a chosen profile and GPU
count, and prints the same real-against-simulated table as `rlsim validate RUN_DIR`, per step
and on average, so a user checks the simulator against their own cluster.

`validate_config` (`rlsim validate --from verl:CONFIG --metrics FILE`) takes the run from its
own config instead (`rlsim.frameworks`): its GPUs, engine, trainer, batch and mode, and holds
every phase veRL times to the simulation's, generation, old log-prob, reference, update, weight
sync and the step. The lengths are the run's where the user has them (`--trace`, or the rollout
dump `--log`); otherwise a stand-in, named in the output: the DAPO preset rescaled so that its
mean response is the log's `response_length/mean`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlsim.config import ClusterConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.profile import load_profile
from rlsim.real.validate import diff_pct
from rlsim.sim.simulate import simulate
from rlsim.trace.importers import import_logs

# veRL metric -> (label, the simulator's steps-table column)
METRICS = (
    ("timing_s/gen", "rollout time (s, mean)", "timing_s/gen"),
    ("timing_s/step", "step time (s, mean)", "timing_s/step"),
    ("response_length/mean", "response length (tokens, mean)", "response_length/mean"),
)
_CONSOLE = re.compile(r"step:(\d+) - (.*)$")
# the phases veRL times every step (`timing_s/*`), as the simulator's steps table names them
PHASES = (
    ("timing_s/gen", "generation"), ("timing_s/old_log_prob", "old log-prob"), ("timing_s/ref", "reference"),
    ("timing_s/update_actor", "update"), ("timing_s/update_weights", "weight sync"), ("timing_s/step", "step"),
    ("response_length/mean", "response length (tokens)"),
)  # fmt: skip
STAND_IN = "dapo-qwen2.5-32b"


def read_verl_metrics(path: Path, flag: str = "--verl-metrics") -> pd.DataFrame:
    """One row per step (column `step`), numeric metrics as columns; one sentence if unreadable,
    naming the option (`flag`) the user gave the file with. Read strictly (`_Steps`): in JSON Lines
    every line must parse, but for a last line with no newline (a run still writing), skipped and
    named; one metric with two values at one step is refused; a step logged again after a later
    one starts a resumed run's block, which wins; a timing must be a finite number >= 0. Console
    lines that are not metrics are skipped. What was skipped or superseded is in `attrs["notes"]`."""
    path = Path(path)
    if not path.is_file():
        raise RlsimError(f"{flag} {path} is not a file")
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    jsonl = any(_step_object(line) for line in lines)  # veRL's file logger (else its console)
    steps = _Steps(path)
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if jsonl:  # veRL's file logger: JSON Lines, every line a step's metrics
            cut = n == len(lines) and not text.endswith("\n")
            row = _json_row(line, path, n, cut)
            if row is None:
                steps.notes.append(f"{path}: line {n}, the last, has no newline and does not parse (a run still "
                                   "writing?): skipped")  # fmt: skip
                continue
        else:
            row = _console_row(line)
            if row is None:
                continue  # a console log's other lines
        steps.add(row, n)
    if not steps.rows:
        raise RlsimError(f"{path} holds no veRL metrics lines (JSON Lines with 'step', or 'step:N - key:value')")
    frame = pd.DataFrame([{"step": s, **{k: v for k, (v, _) in r.items()}} for s, r in sorted(steps.rows.items())])
    frame.attrs["notes"] = steps.notes
    if "timing_s/gen" not in frame.columns:
        raise RlsimError(f"{path} has no 'timing_s/gen' metric: not a veRL PPO trainer's metrics")
    return frame


class _Steps:
    """The steps read so far: step -> metric -> (value, line). Lines of one step merge; a step lower
    than the last line's starts a resumed run's block, which drops the steps it logs again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[int, dict[str, tuple[float, int]]] = {}
        self.notes: list[str] = []
        self.last = None

    def add(self, row: dict[str, Any], n: int) -> None:
        step = row.pop("step", None)
        if not isinstance(step, int | float) or isinstance(step, bool) or step != int(step):
            raise RlsimError(f"{self.path}:{n}: a metrics line without an integer 'step'")
        step = int(step)
        if self.last is not None and step < self.last:  # a resumed run logs its steps again: the later block wins
            again = sorted(s for s in self.rows if s >= step)
            for s in again:
                del self.rows[s]
            if again:
                self.notes.append(f"{self.path}: steps {again[0]}-{again[-1]} logged again from line {n} (a resumed "
                                  "run): the later lines are used")  # fmt: skip
        self.last = step
        have = self.rows.setdefault(step, {})
        for key, value in row.items():
            if key.startswith("timing_s/") and not (_number(value) and value >= 0):
                shown = value if isinstance(value, str) else float(value)
                raise RlsimError(f"{self.path}:{n}: step {step}: {key} is {shown!r}: a timing must be a finite "
                                 "number of seconds >= 0")  # fmt: skip
            if not _number(value):
                continue  # (other metrics that are not numbers: not read)
            old = have.get(key)
            if old is not None and old[0] != value:
                raise RlsimError(f"{self.path}: step {step}: {key} is {old[0]!r} on line {old[1]} and {value!r} on "
                                 f"line {n}; a step logs each metric once")  # fmt: skip
            have[key] = (float(value), n)


def _step_object(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        raw = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(raw, dict) and "step" in raw


def _json_row(line: str, path: Path, n: int, cut: bool) -> dict[str, Any] | None:
    """A JSON Lines metrics line (`{"step": N, "data": {...}}` or flat); None for a last line cut short."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        if cut:
            return None
        raise RlsimError(f"{path}:{n}: not a JSON line ({exc.msg}, column {exc.colno})") from None
    if not isinstance(raw, dict) or "step" not in raw:
        raise RlsimError(f"{path}:{n}: a metrics line without an integer 'step'")
    data = raw.get("data") if isinstance(raw.get("data"), dict) else raw
    out: dict[str, Any] = {k: v for k, v in data.items() if k != "step"}
    out["step"] = raw["step"]
    return out


def _console_row(line: str) -> dict[str, Any] | None:
    m = _CONSOLE.search(line)
    if m is None:
        return None
    out: dict[str, Any] = {"step": int(m.group(1))}
    for part in m.group(2).split(" - "):
        key, _, val = part.rpartition(":")
        key = key.strip()
        value = _float(val)
        if value is not None:
            out[key] = value
        elif key.startswith("timing_s/"):
            out[key] = val.strip()  # refused as a timing (`_Steps.add`)
    return out


def _float(text: str) -> float | None:
    """A console value as a number, or None where it is not one."""
    try:
        return float(text)
    except ValueError:
        return None


def _number(v: Any) -> bool:  # noqa: ANN401
    return isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)


def validate_verl(
    metrics: Path,
    log: Path,
    profile: str,
    gpus: int,
    policy: str = "sync",
    fmt: str = "auto",
    tokenizer: Path | None = None,
    max_response_len: int | None = None,
) -> dict[str, Any]:
    """Simulate the logged steps on `profile` x `gpus` and compare with veRL's own timings."""
    real = read_verl_metrics(metrics)
    trace = import_logs(Path(log), fmt, max_response_len, None, tokenizer).trace
    logged = [int(s) for s in trace.meta.source_params.get("steps", [])]
    shared = [s for s in logged if s in set(real["step"].astype(int))]
    if not shared:
        raise RlsimError(
            f"{metrics} and {log} share no step (metrics steps {_span(real['step'])}, log steps {_span(logged)})"
        )
    prof = load_profile(profile)
    cluster = ClusterConfig(num_gpus=gpus, profile=prof.name)
    rl = RLConfig(
        prompts_per_step=int(trace.meta.source_params["prompts_per_step"]),
        samples_per_prompt=trace.meta.samples_per_prompt,
        max_response_len=trace.meta.max_response_len,
        epochs=len(trace.epochs),
        max_steps=len(logged),
    )
    res = simulate(trace, policy, cluster, rl, profile=prof)
    sim = res.steps.assign(step=logged[: len(res.steps)])  # the simulation's i-th step is the log's i-th
    both = real.merge(sim, on="step", suffixes=("_real", "_sim"))
    keys = [k for k, _, _ in METRICS if f"{k}_real" in both.columns]
    per_step = [
        {"step": int(r["step"])} | {f"{k}/{side}": float(r[f"{k}_{side}"]) for k in keys for side in ("real", "sim")}
        for _, r in both.iterrows()
    ]
    rows = []
    for key, label, _ in METRICS:
        if f"{key}_real" not in both.columns:
            continue
        a, b = float(both[f"{key}_real"].mean()), float(both[f"{key}_sim"].mean())
        rows.append({"metric": key, "label": label, "real": a, "sim": b, "diff_pct": diff_pct(a, b)})
    return {
        "metrics": str(metrics),
        "log": str(log),
        "policy": policy,
        "profile": prof.name,
        "gpus": gpus,
        "steps": len(both),
        "instances": cluster.num_instances(prof.tensor_parallel_size),
        "rows": rows,
        "per_step": per_step,
        "notes": real.attrs.get("notes", []),
    }


def _span(steps: Any) -> str:  # noqa: ANN401
    s = sorted(int(x) for x in steps)
    return f"{s[0]}-{s[-1]}" if s else "none"


def stand_in_lengths(real: pd.DataFrame, metrics: Path, setup, policy: str, give: str = "--trace or --log"):  # noqa: ANN001, ANN201
    """The stand-in trace for a log without its lengths: the preset at the setup's batch and cap,
    scaled to the log's mean response (and its share at the cap, where logged), as many steps as
    it logs (two more ahead for an asynchronous mode), with its one-line description."""
    from rlsim.trace.synth import describe_stand_in, synthesize_to_mean

    if "response_length/mean" not in real.columns:
        raise RlsimError(f"{metrics} logs no response_length/mean: give the run's lengths with {give}")
    mean = float(real["response_length/mean"].mean())
    # veRL's share of responses cut at the cap, where the log has it: the stand-in matches it too
    clipped = "response_length/clip_ratio" in real.columns
    clip = float(real["response_length/clip_ratio"].mean()) if clipped else None
    spare = 2 if policy != "sync" else 0  # an asynchronous run generates ahead of the trainer
    trace = synthesize_to_mean(STAND_IN, setup.prompts_per_step, setup.samples_per_prompt, len(real) + spare,
                               setup.max_response_len, mean, clip_share=clip)  # fmt: skip
    text = (f"{describe_stand_in(trace)}, standing in for the log's mean response of {mean:,.0f} tokens "
            f"(the run's own lengths: {give})")  # fmt: skip
    return trace, text


def validate_config(
    metrics: Path,
    setup,  # noqa: ANN001 - rlsim.frameworks.run_setup.RunSetup
    profile: str,
    engine,  # noqa: ANN001 - rlsim.config.EngineConfig
    policy: str,
    trace=None,  # noqa: ANN001 - the run's lengths (rlsim.trace.format.Trace), or None: a stand-in
) -> dict[str, Any]:
    """The run `setup` describes, simulated for as many steps as `metrics` logs, against them phase by phase."""
    real = read_verl_metrics(metrics, "--metrics")
    steps = [int(s) for s in real["step"]]
    stand_in = None
    if trace is None:
        trace, stand_in = stand_in_lengths(real, metrics, setup, policy)
    cluster = ClusterConfig(num_gpus=setup.num_gpus, profile=profile, placement=setup.placement,
                            train_gpus=setup.train_gpus)  # fmt: skip
    rl = RLConfig(prompts_per_step=setup.prompts_per_step, samples_per_prompt=setup.samples_per_prompt,
                  max_response_len=setup.max_response_len, epochs=len(trace.epochs), max_steps=len(steps),
                  use_kl_loss=setup.use_kl_loss, max_model_len=setup.max_model_len)  # fmt: skip
    res = simulate(trace, policy, cluster, rl, engine_cfg=engine)
    sim = res.steps.assign(step=steps[: len(res.steps)])  # the simulation's i-th step is the log's i-th
    both = real.merge(sim, on="step", suffixes=("_real", "_sim"))
    rows = []
    for key, label in PHASES:
        if f"{key}_real" not in both.columns or f"{key}_sim" not in both.columns:
            continue
        a, b = float(both[f"{key}_real"].mean()), float(both[f"{key}_sim"].mean())
        rows.append({"metric": key, "label": label, "real": a, "sim": b, "diff_pct": diff_pct(a, b)})
    prof = load_profile(profile)
    return {
        "metrics": str(metrics), "config": setup.source, "policy": policy, "profile": prof.name,
        "gpus": setup.num_gpus, "steps": len(both), "instances": cluster.num_instances(prof.instance_gpus),
        "rows": rows, "stand_in": stand_in, "notes": real.attrs.get("notes", []),
        "per_step": [{"step": int(r["step"])} | {f"{k}/{side}": float(r[f"{k}_{side}"]) for k, _ in PHASES
                      if f"{k}_real" in both.columns and f"{k}_sim" in both.columns for side in ("real", "sim")}
                     for _, r in both.iterrows()],
    }  # fmt: skip
