"""Convert real rollout logs into rlsim traces (`rlsim trace import`), so real lengths replay.

Three formats, each read by its own module into a raw table (`rlsim.trace.rawlog.RawLog`); this module finds the
log folder, detects the format and turns the raw table into a trace with what the logs do not
say inferred from what they do, every inference stated in `Imported.notes`:

- **polytrace** (`rlsim.trace.import_polytrace`): PolyTrace's veRL/rLLM packed-length logs.
- **polytrace_multiturn** (`rlsim.trace.import_polytrace_turns`): PolyTrace's multi-turn (tool-calling)
  workload logs, read into a schema-2 trace with turns (its own cap and model length, from the log).
- **verl** (`rlsim.trace.import_verl`): veRL `trainer.rollout_data_dir` dumps, `{global_step}.jsonl`.
- **slime** (`rlsim.trace.import_slime`): slime `--save-debug-rollout-data` dumps, `{rollout_id}.pt`.

The response cap: given, or inferred from a pile-up of responses at one maximum length (a run
truncates at its cap, so 15% of a long-reasoning run can sit at exactly 16,000 tokens), or, for
slime, from the samples marked truncated. When the cap cannot be inferred, the smallest common
cap above the longest response is assumed, and said. A given cap that disagrees with the data
is warned about. The model name: given, else a model name found in the log's path, else
"unknown". Step boundaries are kept in the `step` column: the simulator's dataloader then
serves prompts in the log's order, `prompts_per_step` at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlsim.errors import RlsimError
from rlsim.trace.format import Trace, TraceMeta
from rlsim.trace.import_polytrace import read_polytrace
from rlsim.trace.import_polytrace_turns import read_turns
from rlsim.trace.import_slime import read_slime
from rlsim.trace.import_verl import read_verl
from rlsim.trace.rawlog import RawLog

FORMATS = ("polytrace", "polytrace_multiturn", "verl", "slime")
COMMON_CAPS = (1024, 2048, 3072, 4096, 8192, 16384, 20480, 24576, 32768, 40960, 65536, 131072)
MODEL_PATTERN = re.compile(
    r"(qwen[\d.]*(?:[-_](?:math|coder))?[-_]?\d+(?:\.\d+)?b|llama[-_]?[\d.]+[-_]?\d+b|deepseek[-\w.]*?\d+b"
    r"|deepcoder[-_]?\d+(?:\.\d+)?b|mistral[-_]?\d+b|gemma[-_]?[\d.]*[-_]?\d+b)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Imported:
    """A trace converted from logs and the sentences that say what was inferred."""

    trace: Trace
    notes: tuple[str, ...]


def _has_polytrace(d: Path) -> bool:
    return any(d.glob("packed_lengths_step_*.jsonl"))


def _has_polytrace_turns(d: Path) -> bool:
    return any(d.glob("multiturn_workload_step_*.jsonl"))


def _has_verl(d: Path) -> bool:
    return any(p.stem.isdigit() for p in d.glob("*.jsonl"))


def _has_slime(d: Path) -> bool:
    return any(re.search(r"\d+$", p.stem) and not p.stem.startswith("eval_") for p in d.glob("*.pt"))


DETECTORS = {
    "polytrace": _has_polytrace, "polytrace_multiturn": _has_polytrace_turns, "verl": _has_verl, "slime": _has_slime,
}
DESCRIPTIONS = {
    "polytrace": "PolyTrace packed_lengths_step_*.jsonl logs",
    "polytrace_multiturn": "PolyTrace multi-turn multiturn_workload_step_*.jsonl logs",
    "verl": "veRL rollout dumps ({step}.jsonl)",
    "slime": "slime rollout dumps ({rollout_id}.pt)",
}


def _formats_in(d: Path) -> list[str]:
    return [name for name, has in DETECTORS.items() if has(d)]


def find_log_dir(src: Path, fmt: str = "auto") -> tuple[Path, str, list[str]]:
    """(folder holding the logs, format, notes). Looks in `src`, then one level down, where
    training frameworks put one folder per run (`packed_length_log/<run>/`)."""
    if not src.exists():
        raise RlsimError(f"{src}: no such directory")
    if not src.is_dir():
        raise RlsimError(f"{src} is not a directory of logs")
    here = _formats_in(src)
    if fmt != "auto" and fmt not in here and here:
        raise RlsimError(
            f"{src} holds {DESCRIPTIONS[here[0]]}, not {DESCRIPTIONS[fmt]}: use --format {here[0]} (or auto)"
        )
    if here:
        return src, (here[0] if fmt == "auto" else fmt), []
    runs = sorted(d for d in src.iterdir() if d.is_dir() and _formats_in(d))
    if fmt != "auto":
        wanted = [d for d in runs if fmt in _formats_in(d)]
        if not wanted and runs:
            other = _formats_in(runs[0])[0]
            raise RlsimError(
                f"{runs[0]} holds {DESCRIPTIONS[other]}, not {DESCRIPTIONS[fmt]}: use --format {other} (or auto)"
            )
        runs = wanted
    if not runs:
        raise RlsimError(
            f"{src} holds neither PolyTrace packed_lengths_step_*.jsonl or multiturn_workload_step_*.jsonl, "
            "veRL {step}.jsonl nor slime {rollout_id}.pt files, nor does any folder inside it"
        )
    if len(runs) > 1:
        names = ", ".join(d.name for d in runs)
        raise RlsimError(f"{src} holds {len(runs)} runs ({names}): give the folder of one")
    run = runs[0]
    kind = _formats_in(run)[0] if fmt == "auto" else fmt
    return run, kind, [f"logs found in the run folder {run.name}/"]


def detect_format(src: Path) -> str:
    """The format of the logs in `src` (or in its one run folder)."""
    return find_log_dir(src)[1]


def infer_cap(lengths: np.ndarray, given: int | None, truncated: np.ndarray | None = None) -> tuple[int, list[str]]:
    """The run's response cap and the sentences that say how it was found (see module docstring)."""
    lengths = np.asarray(lengths)
    longest = int(lengths.max())
    inferred = None
    how = ""
    if truncated is not None and truncated.any():
        inferred = int(lengths[truncated].max())
        how = f"{int(truncated.sum()):,} responses the engine marked truncated stop at {inferred:,} tokens"
    else:
        at_max = int((lengths == longest).sum())
        top = lengths[lengths >= np.quantile(lengths, 0.9)]
        values, counts = np.unique(top[top < longest], return_counts=True)
        runner_up = int(counts.max()) if len(values) else 0
        if at_max >= 2 and at_max > runner_up:
            inferred = longest
            how = f"{at_max:,} responses ({at_max / len(lengths):.1%}) stop at exactly {longest:,} tokens"
    if given is not None:
        if longest > given:
            over = int((lengths > given).sum())
            raise RlsimError(
                f"{over:,} responses are longer than --max-response-len {given:,} (the longest {longest:,} tokens)"
            )
        if inferred is not None and inferred != given:
            return given, [
                f"warning: {how}, below the given cap {given:,}: the run's cap looks like {inferred:,} "
                f"(pass --max-response-len {inferred:,}); with {given:,} they count as finished, not clipped"
            ]
        return given, []
    if inferred is not None:
        return inferred, [f"max_response_len {inferred:,} inferred: {how}"]
    cap = next((c for c in COMMON_CAPS if c > longest), 1 << int(np.ceil(np.log2(longest + 1))))
    return cap, [
        f"max_response_len {cap:,} assumed: no responses pile up at one maximum (the longest, {longest:,} "
        "tokens, is not a cap), so the cap is not in the data; pass --max-response-len"
    ]


def infer_model(src: Path, given: str | None) -> tuple[str, list[str]]:
    """The model name: given, else a model name in the log's path, else "unknown" (none of the
    supported formats records the model)."""
    if given:
        return given, []
    for part in reversed(src.resolve().parts):
        match = MODEL_PATTERN.search(part)
        if match:
            return match.group(1), [f"model {match.group(1)} guessed from the folder name {part}; pass --model"]
    return "unknown", ["model unknown: not in the logs or their path; pass --model"]


def to_trace(raw: RawLog, src: Path, max_response_len: int | None, model: str | None) -> Imported:
    """Apply the cap, finish reasons, samples per prompt and metadata to a format's raw table."""
    df = raw.table
    if df.empty:
        raise RlsimError(f"{src}: the logs hold no training responses")
    notes = list(raw.notes)
    truncated = df.pop("truncated").to_numpy(bool) if "truncated" in df.columns else None
    cap, cap_notes = infer_cap(df["num_output_tokens"].to_numpy(), max_response_len, truncated)
    notes += cap_notes
    df["finish_reason"] = np.where(df["num_output_tokens"] >= cap, "length", "stop")
    if truncated is not None and max_response_len is None:
        df.loc[truncated, "finish_reason"] = "length"
    counts = df.groupby(["epoch", "prompt_id"]).size()
    samples = int(counts.min())
    if counts.max() != samples:
        keep = df.groupby(["epoch", "prompt_id"]).cumcount() < samples
        notes.append(
            f"groups hold {samples} to {int(counts.max())} responses: the first {samples} of each are kept "
            f"({int((~keep).sum()):,} dropped)"
        )
        df = df[keep.to_numpy()].reset_index(drop=True)
    name, model_notes = infer_model(src, model)
    notes += model_notes
    steps = np.sort(df["step"].unique())
    per_step = df[df["epoch"] == df["epoch"].min()].groupby("step")["prompt_id"].nunique()
    params = {
        **raw.params,
        "steps": [int(s) for s in steps],
        "prompts_per_step": int(per_step.median()),
        "cap_inferred": max_response_len is None,
    }
    notes.append(
        f"{len(steps)} steps of {params['prompts_per_step']} prompts x {samples} samples kept in the `step` "
        "column: a simulation replays them in the log's order"
    )
    meta = TraceMeta(
        model=name,
        max_response_len=cap,
        samples_per_prompt=samples,
        source=raw.source,
        source_params=params,
        output_token_ids=raw.token_ids,
    )
    return Imported(Trace(df.reset_index(drop=True), meta), tuple(notes))


def import_logs(
    src: Path,
    fmt: str = "auto",
    max_response_len: int | None = None,
    model: str | None = None,
    tokenizer: Path | None = None,
) -> Imported:
    """Read a log folder (or a folder holding one run folder) of any supported format."""
    if fmt not in ("auto", *FORMATS):
        raise RlsimError(f"unknown log format {fmt!r}; choose auto, {', '.join(FORMATS)}")
    if max_response_len is not None and max_response_len <= 0:
        raise RlsimError(f"--max-response-len must be positive, got {max_response_len}")
    folder, kind, notes = find_log_dir(Path(src), fmt)
    if kind == "polytrace_multiturn":
        trace, turn_notes = read_turns(folder, model)
        if max_response_len is not None and max_response_len != trace.meta.max_response_len:
            raise RlsimError(
                f"--max-response-len {max_response_len:,} differs from the log's own cap "
                f"{trace.meta.max_response_len:,}: leave it out"
            )
        return Imported(trace, (*notes, *turn_notes))
    if kind == "polytrace":
        raw = read_polytrace(folder)
    elif kind == "verl":
        raw = read_verl(folder, tokenizer, max_response_len)
    else:
        raw = read_slime(folder)
    raw.notes[:0] = notes
    return to_trace(raw, folder, max_response_len, model)


def import_polytrace(src: Path, max_response_len: int | None = None, model: str | None = None) -> Trace:
    """A PolyTrace packed-length log folder as a trace (see `import_logs`)."""
    return import_logs(src, "polytrace", max_response_len, model).trace


def import_verl(src: Path, tokenizer: Path | None, max_response_len: int | None, model: str | None = None) -> Trace:
    """A veRL rollout_data_dir as a trace (see `import_logs`)."""
    return import_logs(src, "verl", max_response_len, model, tokenizer).trace


def import_slime(src: Path, max_response_len: int | None = None, model: str | None = None) -> Trace:
    """A folder of slime rollout dumps as a trace (see `import_logs`)."""
    return import_logs(src, "slime", max_response_len, model).trace
