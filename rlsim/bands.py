"""Error bands: how far rlsim's predictions of published runs of a prediction's kind were off.

`rlsim/bands.json` (package data, written by `python -m rlsim.package_data bands` from the accuracy
tables, which CI holds equal to their scripts' output) lists every published run rlsim predicts
there, with its error, and the bands: for each **kind** (the profile's basis, the rollout
engine, the framework, the trainer backend, the model class and the GPU) the median and worst |error| over its held-back
configurations (a configuration's release repeats are one error) and their count, each model's
signed median (a band whose models' signs split says so) and the widest spread across releases
of a configuration published with an identical recipe; for each
basis, engine and framework the same of **predicted ratios** (two published runs of one setup
family, such as a synchronous step against one step off-policy or `fully_async`).

The basis is `derived` when `rlsim profile derive` set the profile up with no term, `fitted` when
framework terms were laid over it (`--terms`), `measured` otherwise (a calibrated profile, which
no published run was predicted from), and `calibrated` when the terms were calibrated on the
user's own logged runs (`rlsim calibrate run`): its band is that calibration's held-out residual
and the transfer band (`transfer` in bands.json: calibrating on one published run and predicting
the others of its family, `doctables/transfer.py`). The engine is the one whose rules the simulation runs
(every published run there rolled out with vLLM, so one under SGLang's rules has no band yet).
The framework is the one a `--from` config names; a prediction that names none pools every
framework's runs (`any`). The model class is `moe` when the model's active parameters are fewer
than its parameters, and the GPU is the `gpus.json` entry the profile's hardware names. A kind
with fewer than `min_configurations` held-back configurations has no band: it says so and how
many it has. The trainer backend is the profile's (`fsdp` for veRL's FSDP and NeMo RL's DTensor
policy, `megatron`), so a dense FSDP run is not given a band built from Megatron runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from typing import Any

from rlsim.profile import Profile
from rlsim.rollout_engines import rollout_engine as engine_entry

FRAMEWORK_NAMES = {"nemo-rl": "NeMo RL", "verl": "veRL", "roll": "ROLL", "any": "every framework"}
WHERE = "docs/accuracy.md, Error bands"


@cache
def _data() -> dict[str, Any]:
    return json.loads((resources.files("rlsim") / "bands.json").read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class Kind:
    basis: str  # derived | fitted | measured | calibrated
    rollout_engine: str  # a registered rollout engine (`rlsim.rollout_engines`)
    framework: str  # nemo-rl | verl | roll | any
    model_class: str  # dense | moe | unknown
    gpu: str  # a gpus.json key, or the profile's hardware where none matches
    backend: str = "unknown"  # the trainer's: fsdp | megatron | unknown

    def text(self) -> str:
        cls = {"moe": "MoE", "dense": "dense"}.get(self.model_class, "model class unknown")
        fw = FRAMEWORK_NAMES.get(self.framework, self.framework)
        trainer = {"fsdp": "FSDP", "megatron": "Megatron"}.get(self.backend, "trainer unknown")
        engine = engine_entry(self.rollout_engine).label
        return f"{self.basis} profile, {engine}, {trainer}, {cls}, {self.gpu.upper()}, {fw}"


def _gpu_key(hardware: str) -> str:
    from rlsim.derive.gpus import shipped_gpus

    name = hardware.split("x ", 1)[-1]
    for key, gpu in shipped_gpus().items():
        if gpu.get("name") == name:
            return key
    return name.lower()


def kind_of(profile: Profile, rollout_engine: str = "vllm", framework: str | None = None) -> Kind:
    """The kind of a prediction made with `profile` under `rollout_engine`'s rules, of a run of
    `framework` (None: not named)."""
    prov = profile.provenance if isinstance(profile.provenance, dict) else {}
    derived = str(prov.get("kind", "")).startswith("derived")
    basis = ("fitted" if prov.get("fitted_terms") else "derived") if derived else "measured"
    if prov.get("calibrated"):  # terms calibrated on the user's own runs, over whatever profile
        basis = "calibrated"
    facts = profile.model_facts or {}
    total, active = facts.get("num_params"), facts.get("num_active_params")
    model_class = "unknown" if not total or not active else ("moe" if active < total else "dense")
    backend = (profile.train.backend or "") if profile.train is not None else ""
    backend = "fsdp" if backend.startswith("fsdp") else (backend if backend == "megatron" else "unknown")
    return Kind(basis, rollout_engine, framework or "any", model_class, _gpu_key(profile.hardware), backend)


def _key(kind: Kind) -> str:
    return f"{kind.basis}/{kind.rollout_engine}/{kind.framework}/{kind.backend}/{kind.model_class}/{kind.gpu}"


def band(kind: Kind) -> dict[str, Any]:
    """The band of `kind`: held-back configurations (and their runs), median and worst |error|
    (percent) over the configurations, the signed median, each model's signed median and whether
    their signs split, the widest release spread of an identical recipe, runs by framework, and
    `enough` (at least `min_configurations`; otherwise no figure is given)."""
    data = _data()
    got = data["bands"].get(_key(kind), {"runs": 0, "configurations": 0, "by_framework": {}})
    enough = got["configurations"] >= data["min_configurations"]
    out = {"kind": asdict(kind), "runs": got["runs"], "configurations": got["configurations"],
           "by_framework": got.get("by_framework", {}), "enough": enough}  # fmt: skip
    if enough:
        keys = ("median_abs_pct", "worst_abs_pct", "median_pct", "by_model_median_pct", "signs_split",
                "release_spread_pct")  # fmt: skip
        out |= {k: got[k] for k in keys}
    return out


def ratio_band(kind: Kind) -> dict[str, Any]:
    """The band of predicted ratios for `kind`'s basis and framework (pairs pooled over models and
    GPUs: two candidates of one model and GPU share that bias, their ratio carries what is left)."""
    data = _data()
    got = data["ratio_bands"].get(f"{kind.basis}/{kind.rollout_engine}/{kind.framework}", {"runs": 0})
    enough = got["runs"] >= data["min_configurations"]
    out = {"basis": kind.basis, "rollout_engine": kind.rollout_engine, "framework": kind.framework,
           "pairs": got["runs"], "enough": enough}  # fmt: skip
    if enough:
        out |= {k: got[k] for k in ("median_abs_pct", "worst_abs_pct", "median_pct")}
    return out


def _calibrated(profile: Profile, kind: Kind) -> dict[str, Any]:
    """The band of a calibrated prediction: its own held-out residual and the transfer band (a
    calibration on one published run predicting the others of its family, `doctables/transfer.py`)."""
    cal = (profile.provenance or {}).get("calibrated") or {}
    transfer = _data().get("transfer") or {}
    return {"kind": asdict(kind), "calibrated": cal, "transfer": transfer.get("steps"), "enough": True}


def _calibrated_text(b: dict[str, Any]) -> str:
    cal, tr = b["calibrated"], b.get("transfer")
    runs = cal.get("runs") or 0
    out = (f"error band (calibrated on {cal.get('steps')} steps of {runs} run{'s' if runs != 1 else ''}, "
           f"{cal.get('terms_file')}): ")  # fmt: skip
    res = cal.get("step_residual_pct")
    out += (f"its held-out steps were off by at most {res:.1f}%" if res is not None
            else "no held-out step residual recorded")  # fmt: skip
    if tr:
        out += (f"; calibrating on one published run and predicting the others of its family was off by a median "
                f"{tr['median_abs_pct']:.0f}%, worst {tr['worst_abs_pct']:.0f}% ({tr['predictions']} predictions, "
                f"{WHERE.split(',')[0]}, Transfer)")  # fmt: skip
    return out


def band_text(b: dict[str, Any]) -> str:
    """One line for a prediction's band."""
    kind = Kind(**b["kind"])
    if kind.basis == "calibrated":
        return _calibrated_text(b)
    if kind.basis == "measured":
        return (
            "error band: none; the profile was measured, and no published run was predicted from a measured "
            "profile (rlsim validate holds a prediction against your own run)"
        )
    if not b["enough"]:
        return (
            f"error band ({kind.text()}): fewer than three published configurations of this kind "
            f"({b['configurations']}), so no band; every kind's is in {WHERE}"
        )
    by = ", ".join(f"{FRAMEWORK_NAMES[f]} {n}" for f, n in sorted(b["by_framework"].items()))
    side = "shorter" if b["median_pct"] < 0 else "longer"
    out = (
        f"error band ({kind.text()}): held-back published configurations of this kind were off by a median "
        f"{b['median_abs_pct']:.0f}%, worst {b['worst_abs_pct']:.0f}% ({b['configurations']} configurations, "
        f"{b['runs']} runs: {by}; rlsim's median {abs(b['median_pct']):.0f}% {side})"
    )
    if b["signs_split"]:
        models = ", ".join(f"{m} {v:+.0f}%" for m, v in b["by_model_median_pct"].items())
        out += f"; its models' biases are opposite ({models}), so your model's error may be larger than the band's"
    if b["release_spread_pct"] is not None:
        out += (f"; one of its configurations, published again with the same recipe, moved "
                f"{b['release_spread_pct']:.0f}% between releases")  # fmt: skip
    return out


def ratio_text(r: dict[str, Any]) -> str:
    """One line for the band of a ratio of two predictions (a speedup, a plan's ranking)."""
    fw = FRAMEWORK_NAMES.get(r["framework"], r["framework"])
    if r["basis"] == "calibrated":
        tr = r.get("transfer")
        if not tr:
            return "ratio band (calibrated): no transfer figures for ratios yet"
        return (f"ratio band (calibrated): calibrating on one published run, its family's async-against-sync ratios "
                f"were off by a median {tr['median_abs_pct']:.0f}%, worst {tr['worst_abs_pct']:.0f}% "
                f"({tr['predictions']} ratios)")  # fmt: skip
    if r["basis"] == "measured":
        return "ratio band: none; no published pair was predicted from a measured profile"
    kind = f"{r['basis']}, {engine_entry(r['rollout_engine']).label}, {fw}"
    if not r["enough"]:
        return f"ratio band ({kind}): fewer than three published pairs ({r['pairs']}), so no band"
    return (
        f"ratio band ({kind}): published ratios (such as sync "
        "against one step off or fully_async) "
        f"were off by a median {r['median_abs_pct']:.0f}%, worst {r['worst_abs_pct']:.0f}% ({r['pairs']} pairs)"
    )


def for_prediction(profile: Profile, rollout_engine: str = "vllm", framework: str | None = None) -> dict[str, Any]:
    """`error_band` (for absolute times) and `ratio_band` (for ratios of two predictions) of a
    prediction made with `profile`."""
    kind = kind_of(profile, rollout_engine, framework)
    if kind.basis == "calibrated":
        ratios = (_data().get("transfer") or {}).get("ratios")
        return {"error_band": _calibrated(profile, kind),
                "ratio_band": {"basis": "calibrated", "rollout_engine": rollout_engine, "framework": kind.framework,
                               "transfer": ratios, "enough": bool(ratios),
                               **({"median_abs_pct": ratios["median_abs_pct"]} if ratios else {})}}  # fmt: skip
    return {"error_band": band(kind), "ratio_band": ratio_band(kind)}
