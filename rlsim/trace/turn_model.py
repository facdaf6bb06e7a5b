"""A generator of multi-turn trajectories fitted to a log (`rlsim trace fit` on a multi-turn trace,
`rlsim trace synth --preset search-r1`).

What is fitted, each as empirical quantile knots (`LEVELS`, interpolated linearly in log space, so
the body and the tail are the log's own, not a parametric guess):

- the **turn count** (its probabilities, 1 to the most the log holds);
- **output tokens per turn**, by the turn's place: the first turn of a multi-turn trajectory (a
  query), a middle turn, the last turn (the answer), and the only turn of a one-turn trajectory;
  the last and only turns also keep the share cut at the per-turn cap (`max_response_len`);
- the **tokens a tool call appends** (the tool's answer and the chat template around it);
- the **tool latency**;
- the **prompt tokens**.

Draws are independent (a trajectory's turns are not correlated with each other, nor with the
prompt): what this leaves out is said in the fit's check, which holds trajectory lengths, turn
counts and context sizes of a generated trace against the log's held-out steps. A trajectory
whose context would pass `max_model_len` ends at the turn that reaches it, cut there ("length"),
as an engine cuts it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.files import atomic_write_text
from rlsim.trace.format import Trace, TraceMeta
from rlsim.trace.turns import TOOL

LEVELS = (0.0, 0.001, 0.005, 0.01, 0.025, *[round(0.05 * k, 2) for k in range(1, 20)], 0.975, 0.99, 0.995, 0.999, 1.0)
PLACES = ("first", "middle", "last", "only")
KIND = "multi_turn"
PRESET_DIR = Path(__file__).with_name("turn_presets")


@dataclass(frozen=True)
class TurnModel:
    """A fitted multi-turn generator: knots are `LEVELS`-quantiles of log(1 + x)."""

    name: str
    model: str
    max_response_len: int  # per turn
    max_model_len: int
    turn_count_p: tuple[float, ...]  # P(1 turn), P(2 turns), ...
    prompt_tokens: tuple[float, ...]
    output_tokens: dict  # place -> knots
    clip_share: dict  # "last"/"only" -> share at the per-turn cap
    append_tokens: tuple[float, ...]
    tool_latency_s: tuple[float, ...]
    fitted_on: str = ""

    def to_json(self) -> str:
        return json.dumps({"kind": KIND, **asdict(self)}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> TurnModel:
        try:
            raw = json.loads(text)
            if raw.pop("kind", None) != KIND:
                raise ValueError("not a multi-turn preset")
            raw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
            raw["output_tokens"] = {k: tuple(v) for k, v in raw["output_tokens"].items()}
            return cls(**raw)
        except (json.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise RlsimError(f"{where} is not a multi-turn preset ({exc})") from None


def _knots(x: np.ndarray) -> tuple[float, ...]:
    if len(x) == 0:
        raise RlsimError("the log has no values to fit a multi-turn knot set to")
    return tuple(round(float(v), 6) for v in np.quantile(np.log1p(np.asarray(x, float)), LEVELS))


def _draw(knots: tuple[float, ...], u: np.ndarray) -> np.ndarray:
    return np.expm1(np.interp(u, LEVELS, knots))


def turn_rows(trace: Trace) -> pd.DataFrame:
    """The trace's turns, one row each: row, place, output tokens (and the row's turn count)."""
    df = trace.table
    n = df["turn_output_tokens"].map(len).to_numpy()
    out = np.concatenate([np.asarray(v) for v in df["turn_output_tokens"]])
    row = np.repeat(np.arange(len(df)), n)
    k = np.arange(len(out)) - np.repeat(np.r_[0, np.cumsum(n)[:-1]], n)
    count = np.repeat(n, n)
    place = np.where(count == 1, "only", np.where(k == 0, "first", np.where(k == count - 1, "last", "middle")))
    return pd.DataFrame({"row": row, "turn": k, "turns": count, "place": place, "tokens": out})


def fit(trace: Trace, name: str) -> TurnModel:
    """Fit the generator to a multi-turn trace (see the module docstring)."""
    if "turn_output_tokens" not in trace.table.columns:
        raise RlsimError("the trace has no turns (schema 2 multi-turn columns): fit it with the single-turn generator")
    if trace.meta.max_model_len is None:
        raise RlsimError("the multi-turn trace does not say its max_model_len")
    df, turns = trace.table, turn_rows(trace)
    counts = np.bincount(df["turn_output_tokens"].map(len).to_numpy())[1:]
    cap = trace.meta.max_response_len
    outs, clip = {}, {}
    for place in PLACES:
        x = turns.loc[turns["place"] == place, "tokens"].to_numpy()
        if place in ("last", "only"):
            clip[place] = round(float((x >= cap).mean()), 6) if len(x) else 0.0
            x = x[x < cap]
        outs[place] = _knots(x) if len(x) else _knots(np.ones(1))
    adds = np.concatenate([np.asarray(v) for v in df["tool_append_tokens"]])
    lats = np.concatenate([np.asarray(v) for v in df["tool_latency_s"]])
    steps = sorted(int(s) for s in df["step"].unique()) if "step" in df.columns else []
    return TurnModel(
        name=name, model=trace.meta.model, max_response_len=cap, max_model_len=trace.meta.max_model_len,
        turn_count_p=tuple(round(float(c), 6) for c in counts / counts.sum()),
        prompt_tokens=_knots(df["num_prompt_tokens"].to_numpy()), output_tokens=outs, clip_share=clip,
        append_tokens=_knots(adds), tool_latency_s=_knots(lats),
        fitted_on=f"{trace.meta.source}" + (f", steps {steps[0]}-{steps[-1]}" if steps else ""),
    )  # fmt: skip


def synthesize(m: TurnModel, num_prompts: int, samples_per_prompt: int, epochs: int = 1, seed: int = 0) -> Trace:
    """A seeded multi-turn trace drawn from the generator."""
    if min(num_prompts, samples_per_prompt, epochs) <= 0:
        raise RlsimError("num_prompts, samples_per_prompt and epochs must be positive")
    rng = np.random.default_rng(seed)
    prompts = np.maximum(1, np.round(_draw(m.prompt_tokens, rng.random(num_prompts)))).astype(int)
    rows = []
    p_turns = np.asarray(m.turn_count_p) / sum(m.turn_count_p)
    for epoch in range(epochs):
        for pid in range(num_prompts):
            for s in range(samples_per_prompt):
                n = int(rng.choice(len(p_turns), p=p_turns)) + 1
                ctx = int(prompts[pid])
                outs, reasons, lats, adds = [], [], [], []
                for k in range(n):
                    place = "only" if n == 1 else "first" if k == 0 else "last" if k == n - 1 else "middle"
                    cut = place in ("last", "only") and rng.random() < m.clip_share.get(place, 0.0)
                    drawn = round(_draw(m.output_tokens[place], rng.random()))
                    tok = m.max_response_len if cut else int(np.clip(drawn, 1, m.max_response_len))
                    room = m.max_model_len - ctx
                    if tok >= room:  # the context cap cuts the turn, and ends the trajectory
                        tok, cut = max(1, room), True
                    outs.append(tok)
                    ctx += tok
                    if cut or k == n - 1:
                        reasons.append("length" if cut else "stop")
                        break
                    add = int(round(_draw(m.append_tokens, rng.random())))
                    if ctx + add + 1 >= m.max_model_len:  # no room for another turn after this answer
                        reasons.append("stop")
                        break
                    reasons.append(TOOL)
                    adds.append(add)
                    lats.append(round(float(_draw(m.tool_latency_s, rng.random())), 6))
                    ctx += add
                rows.append((epoch, pid, s, int(prompts[pid]), sum(outs), reasons[-1], outs, reasons, lats, adds))
    cols = ["epoch", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens", "finish_reason",
            "turn_output_tokens", "turn_finish_reason", "tool_latency_s", "tool_append_tokens"]  # fmt: skip
    df = pd.DataFrame(rows, columns=cols)
    meta = TraceMeta(
        model=m.model, max_response_len=m.max_response_len, samples_per_prompt=samples_per_prompt,
        source=f"synthetic:{m.name}", source_params={"preset": m.name, "seed": seed, "fitted_on": m.fitted_on},
        max_model_len=m.max_model_len,
    )  # fmt: skip
    return Trace(df, meta)


def shipped() -> dict[str, Path]:
    """Shipped multi-turn presets by name."""
    return {p.name.removesuffix(".json"): p for p in sorted(PRESET_DIR.glob("*.json"))}


def load_model(name_or_path: str | Path) -> TurnModel | None:
    """A shipped multi-turn preset by name, or a preset file that is one; None for anything else."""
    path = shipped().get(str(name_or_path))
    if path is None:
        path = Path(name_or_path)
        if path.suffix != ".json" or not path.is_file():
            return None
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("kind") != KIND:
                return None
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            return None
    return TurnModel.from_json(path.read_text(encoding="utf-8"), str(path))


def save_model(m: TurnModel, path: Path) -> Path:
    return atomic_write_text(path, m.to_json())


def trajectory_stats(trace: Trace) -> dict[str, float]:
    """What the fit is checked on: turns, trajectory lengths, context and tool calls."""
    df = trace.table
    length = df["num_output_tokens"].to_numpy(float)
    adds = np.concatenate([np.asarray(v, float) for v in df["tool_append_tokens"]])
    lats = np.concatenate([np.asarray(v, float) for v in df["tool_latency_s"]])
    context = df["num_prompt_tokens"].to_numpy() + length + np.array([sum(v) for v in df["tool_append_tokens"]])
    turns = turn_rows(trace)
    return {
        "turns per trajectory": float(df["turn_output_tokens"].map(len).mean()),
        "share with a tool call": float((df["turn_output_tokens"].map(len) > 1).mean()),
        "trajectory length mean": float(length.mean()),
        "trajectory length p50": float(np.percentile(length, 50)),
        "trajectory length p90": float(np.percentile(length, 90)),
        "trajectory length p99": float(np.percentile(length, 99)),
        "tokens per turn mean": float(turns["tokens"].mean()),
        "appended tokens per call mean": float(adds.mean()) if len(adds) else float("nan"),
        "final context mean": float(context.mean()),
        "tool latency p50 (s)": float(np.percentile(lats, 50)) if len(lats) else float("nan"),
        "tool latency p90 (s)": float(np.percentile(lats, 90)) if len(lats) else float("nan"),
    }
