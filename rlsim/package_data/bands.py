"""The error bands rlsim prints beside a prediction, built from the accuracy tables (never tuned to).

    python -m rlsim.package_data bands [--check]              # writes rlsim/bands.json
    python -m doctables.error_bands [--markdown | --readme]   # its two tables (--readme: bands.json too)

Every published run that rlsim predicts in an accuracy table is a run here, with the table's
published and predicted seconds: NeMo RL's rows and its k-step row (`published_runs`, DGX-H100 and
GB200), veRL's per-phase steps (`verl_phases`, H20) and RollPacker's Figure 11 baselines on ROLL
(`paper_checks`, H800). CI holds each of those tables equal to its own script's output
(`tests/test_readme_tables.py`), so this reads the tables rather than simulating them again, and
CI holds `rlsim/bands.json` equal to what it builds from them.

A run's **kind** is its framework, its trainer backend (FSDP or Megatron), its model class (dense
or MoE) and its GPU; its **basis** is how its profile was set up: `derived` (the model's config and
the GPU's datasheet, no term fitted) or `fitted` (NeMo RL's shipped terms, `--terms nemo-rl`, laid
over it). A run is **held back** when nothing was fitted on it: every `derived` run (the
derivation's constants come from Vidur's operator tables, slime's fit and TorchTitan's MFU, none
of them these runs), and under `fitted` the rows outside NeMo RL's fit half (the validation set,
docs/accuracy.md). A band counts **configurations**, not runs: NeMo RL publishes one
configuration in up to three releases, and those repeats are one error (their median). The band
of a kind is the median and worst |error| over its held-back configurations, with the count of
configurations and of runs, the signed median of each model (where they split in sign, the band
averages opposite biases and says so), and the widest spread across releases of any of its
configurations published with a byte-identical recipe (`python -m doctables.release_spread`: the
floor of a prediction from the recipe alone); a kind with fewer than three configurations says so.

A **pair** is two published runs of one setup family whose step times the same source publishes,
so that a ratio of them is published too: NeMo RL's rows of one release, system and model (on
policy against one step off, one GPU count against another), veRL's synchronous step against
`fully_async` per 512 prompts, RollPacker's tail batching against eta 1.0 and against veRL. The
ratio's error (predicted ratio / published ratio - 1, the ratio taken slower over faster as
published) is what `rlsim plan` weighs two candidates of one model and GPU with.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics

from rlsim.errors import RlsimError
from rlsim.frameworks.verl import read_verl
from rlsim.package_data import ROOT
from rlsim.package_data.markers import read_table
from rlsim.package_data.nemo_rl import release_spreads

BANDS = ROOT / "rlsim" / "bands.json"
TRANSFER = ROOT / "published_runs" / "transfer.json"  # written by `python -m doctables.transfer`
# veRL's runs (the `verl_phases` table's), each by the launch script it was published with
VERL_SCRIPTS = ROOT / "published_runs" / "verl"
VERL_RUNS = {"Qwen3-30B-A3B": "grpo_30b_a3b_base_math_megatron_96_32.overrides",
             "Qwen2.5-Math-7B": "dapo_7b_math_fsdp2_32_32.overrides"}  # fmt: skip
MIN_RUNS = 3  # a kind with fewer held-back configurations has no band
MOE = ("DeepSeek", "Qwen3-235B", "Qwen3-30B")
POLICY = {"On policy": "sync", "1-step Off": "one_step_off", "8-step Off": "k_step_off(k=8)"}


def _rows(name: str) -> list[list[str]]:
    """The table's body rows, each a list of its cells."""
    lines = [ln for ln in read_table(name).splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def _model_class(model: str) -> str:
    return "moe" if model.startswith(MOE) else "dense"


def _err(pred: float, pub: float) -> float:
    return round(100 * (pred / pub - 1), 1)


def _config(system: str, model: str, policy: str, gpus: str) -> str:
    """A NeMo RL row's configuration, as `rows.csv` names it (model, GPU, precision, policy, GPUs):
    its releases are repeats of one configuration, counted once in a band."""
    gpu, _, fp8 = system.partition(" ")
    return f"{model}|{gpu}|{'fp8' if fp8 else 'bf16'}|{policy}|{gpus}"


def nemo_rl_runs() -> list[dict]:
    """Each published row twice: derived (held back) and fitted (held back outside the fit half)."""
    out = []
    for r in _rows("published_runs"):
        release, system, model, policy, gpus, gen_tp, layout, pub, derived, fitted = r[:10]
        half = r[-1]
        base = {
            "source": "NeMo RL performance summary", "framework": "nemo-rl", "model": model,
            "model_class": _model_class(model), "gpu": system.split()[0], "policy": POLICY[policy],
            "label": f"{release} {system} {model} {policy} {gpus} GPUs", "published_s": float(pub),
            "release": release, "system": system, "half": half, "backend": layout.split()[0],
            "config": _config(system, model, policy, gpus),
        }  # fmt: skip
        out.append({**base, "basis": "derived", "held_back": True, "predicted_s": float(derived)})
        out.append({**base, "basis": "fitted", "held_back": half.startswith("validation"),
                    "predicted_s": float(fitted)})  # fmt: skip
    for r in _rows("published_async"):
        release, system, model, policy, _, gpus, pub, derived, fitted = r[:9]
        base = {
            "source": "NeMo RL performance summary", "framework": "nemo-rl", "model": model,
            "model_class": _model_class(model), "gpu": system.split()[0], "policy": POLICY[policy],
            "label": f"{release} {system} {model} {policy} {gpus} GPUs", "published_s": float(pub),
            "release": release, "system": system, "half": "after the fit", "backend": "megatron",
            "config": _config(system, model, policy, gpus),
        }  # fmt: skip
        out.append({**base, "basis": "derived", "held_back": True, "predicted_s": float(derived)})
        out.append({**base, "basis": "fitted", "held_back": True, "predicted_s": float(fitted)})
    return out


def verl_runs() -> list[dict]:
    """veRL's colocated synchronous steps (fully_async_policy README), derived, no term."""
    backend = {}
    for model, script in VERL_RUNS.items():
        trainer = read_verl(VERL_SCRIPTS / script).trainer.backend
        backend[model] = "fsdp" if trainer.startswith("fsdp") else trainer
    out = []
    for run, phase, pub, sim, _ in _rows("verl_phases"):
        if phase != "step":
            continue
        model, gpus = run.split(", ")
        out.append({
            "source": "veRL fully_async_policy README", "framework": "verl", "model": model,
            "model_class": _model_class(model), "gpu": gpus.split()[1].lower(), "policy": "sync",
            "label": f"{model} {gpus}", "published_s": float(pub), "predicted_s": float(sim),
            "basis": "derived", "held_back": True, "backend": backend[model], "config": f"{model} {gpus}",
        })  # fmt: skip
    return out


def _paper(check: str) -> list[list[str]]:
    return [r for r in _rows("paper_checks") if r[0].startswith(check)]


def _where(check_cell: str) -> tuple[str, str, str]:
    """(cap, model, GPUs) of a RollPacker check: '..., 8k, qwen2.5-7b at TP 1 on 16 H800s'."""
    m = re.search(r"(\d+k), (\S+) at TP \d+ on (\d+ H800s)", check_cell)
    if m is None:
        raise RlsimError(f"paper_checks: a RollPacker check names no cap, model and GPUs: {check_cell!r}")
    return m.group(1), m.group(2), m.group(3)


def rollpacker_runs() -> list[dict]:
    """RollPacker's Figure 11 baselines on ROLL: derived (ROLL's setting) and with NeMo RL's terms."""
    out = []
    for check, _, paper, sim, _ in _paper("RollPacker Figure 11 baseline"):
        cap, model, gpus = _where(check)
        pub = float(re.match(r"([\d.]+) s", paper).group(1))
        derived = float(re.match(r"([\d.]+) s", sim).group(1))
        fitted = float(re.search(r"NeMo RL's terms: ([\d.]+) s", sim).group(1))
        base = {
            "source": "RollPacker Figure 11", "framework": "roll", "model": model, "model_class": "dense",
            "gpu": "h800", "policy": "sync", "label": f"{model} {cap} on {gpus}", "published_s": pub,
            "backend": "megatron", "config": f"{model} {cap} on {gpus}",
        }  # fmt: skip
        out.append({**base, "basis": "derived", "held_back": True, "predicted_s": derived})
        out.append({**base, "basis": "fitted", "held_back": True, "predicted_s": fitted})
    return out


def runs() -> list[dict]:
    """Every run; each rolled out with vLLM (NeMo RL's and veRL's recipes name it, and RollPacker
    runs vLLM inside ROLL): no published run in these tables used SGLang."""
    out = nemo_rl_runs() + verl_runs() + rollpacker_runs()
    for r in out:
        r["rollout_engine"] = "vllm"
        r["error_pct"] = _err(r["predicted_s"], r["published_s"])
    return out


def _pair(source: str, framework: str, basis: str, label: str, pub: float, pred: float, held: bool) -> dict:
    if pub < 1:  # slower over faster, as published
        pub, pred = 1 / pub, 1 / pred
    return {"source": source, "framework": framework, "basis": basis, "rollout_engine": "vllm", "label": label,
            "published_ratio": round(pub, 4),
            "predicted_ratio": round(pred, 4), "error_pct": _err(pred, pub), "held_back": held}  # fmt: skip


def pairs(all_runs: list[dict]) -> list[dict]:
    """Every published ratio of two runs of one setup family, with its predicted ratio."""
    out = []
    nemo = [r for r in all_runs if r["framework"] == "nemo-rl"]
    for basis in ("derived", "fitted"):
        rows = [r for r in nemo if r["basis"] == basis]
        fam = lambda r: (r["release"], r["system"], r["model"])  # noqa: E731
        for _, group in itertools.groupby(sorted(rows, key=fam), key=fam):
            for a, b in itertools.combinations(list(group), 2):
                if a["published_s"] == b["published_s"]:
                    continue  # no order published
                out.append(_pair("NeMo RL performance summary", "nemo-rl", basis, f"{a['label']} / {b['label']}",
                                 a["published_s"] / b["published_s"], a["predicted_s"] / b["predicted_s"],
                                 a["held_back"] and b["held_back"]))  # fmt: skip
    for r in _rows("verl_fully_async"):
        gpus = r[0]
        pub = float(r[5].split("x")[0])  # the step's speedup
        pred = float(r[6].rstrip("x"))
        out.append(_pair("veRL fully_async_policy README", "verl", "derived", f"sync / fully_async, {gpus} GPUs",
                         pub, pred, True))  # fmt: skip
    for prefix, what in (("RollPacker both factors 1.25 over eta 1.0", "eta 1.0 / both factors 1.25"),
                         ("RollPacker tail batching end to end over veRL", "veRL / tail batching")):  # fmt: skip
        for check, _, paper, sim, _ in _paper(prefix):
            cap, model, gpus = _where(check)
            pub = float(re.search(r"([\d.]+)x", paper).group(1))
            pred = float(re.search(r"([\d.]+)x", sim).group(1))
            out.append(_pair("RollPacker", "roll", "derived", f"{what}, {model} {cap} on {gpus}", pub, pred, True))
    return out


def _band(errors: list[float]) -> dict:
    a = [abs(e) for e in errors]
    return {"runs": len(a), "median_abs_pct": round(statistics.median(a), 1) if a else None,
            "worst_abs_pct": round(max(a), 1) if a else None,
            "median_pct": round(statistics.median(errors), 1) if errors else None}  # fmt: skip


def _config_band(runs: list[dict], spread: dict[str, float]) -> dict:
    """A band over distinct configurations: each configuration's runs (its release repeats) are
    one error, their median; the band's median and worst |error| and signed median are over those;
    per model, the signed median of its configurations (a band whose models' signs split averages
    opposite biases, and says so); the widest release spread of its identical recipes."""
    by_config: dict[str, list[dict]] = {}
    for r in runs:
        by_config.setdefault(r["config"], []).append(r)
    errors = {c: statistics.median(r["error_pct"] for r in rs) for c, rs in by_config.items()}
    out = _band(list(errors.values()))
    out["runs"] = len(runs)
    out["configurations"] = len(errors)
    by_model: dict[str, list[float]] = {}
    for c, rs in by_config.items():
        by_model.setdefault(rs[0]["model"], []).append(errors[c])
    out["by_model_median_pct"] = {m: round(statistics.median(e), 1) for m, e in sorted(by_model.items())}
    signs = {v > 0 for v in out["by_model_median_pct"].values() if v != 0}
    out["signs_split"] = len(signs) > 1
    spreads = [spread[c] for c in errors if c in spread]
    out["release_spread_pct"] = round(100 * max(spreads), 1) if spreads else None
    return out


def _identical_spreads() -> dict[str, float]:
    """Each configuration published with an identical recipe across releases, its spread
    (`python -m doctables.release_spread`)."""
    s = release_spreads()
    return {r.config: float(r.spread) for _, r in s[s.identical].iterrows()}


def _transfer() -> dict:
    """The calibrated band's summary (`python -m doctables.transfer` writes it); refused if missing."""
    if not TRANSFER.is_file():
        raise RlsimError(f"{TRANSFER} is missing: run `python -m doctables.transfer --readme` first")
    return json.loads(TRANSFER.read_text())


def build() -> dict:
    """`rlsim/bands.json`: every run and pair, and the bands of every kind and basis."""
    rs = runs()
    ps = pairs(rs)
    spread = _identical_spreads()
    kinds: dict[str, dict] = {}
    for r in rs:
        if not r["held_back"]:
            continue
        for fw in (r["framework"], "any"):
            key = f"{r['basis']}/{r['rollout_engine']}/{fw}/{r['backend']}/{r['model_class']}/{r['gpu']}"
            kinds.setdefault(key, {"runs": [], "by_framework": {}})
            kinds[key]["runs"].append(r)
            kinds[key]["by_framework"][r["framework"]] = kinds[key]["by_framework"].get(r["framework"], 0) + 1
    bands = {k: {**_config_band(v["runs"], spread), "by_framework": v["by_framework"]}
             for k, v in sorted(kinds.items())}  # fmt: skip
    ratio: dict[str, list] = {}
    for p in ps:
        if not p["held_back"]:
            continue
        for fw in (p["framework"], "any"):
            ratio.setdefault(f"{p['basis']}/{p['rollout_engine']}/{fw}", []).append(p["error_pct"])
    return {
        "about": "Published runs rlsim predicts in its accuracy tables, with their errors, and the bands of every "
                 "kind (basis/rollout engine/framework/trainer backend/model class/GPU) and of predicted ratios "
                 "(basis/rollout engine/framework), held-back runs only. A kind's band is over its distinct "
                 "configurations (a configuration published in several releases is one error, the median of its "
                 "runs'), with the count of each, the signed median of each model, and the widest spread across "
                 "releases of a configuration published with an identical recipe. Written by "
                 "python -m rlsim.package_data bands from docs/accuracy.md, docs/policies.md and docs/simulate.md; "
                 "see the module's docstring.",
        "min_configurations": MIN_RUNS,
        "bands": bands,
        "ratio_bands": {k: _band(v) for k, v in sorted(ratio.items())},
        "release_spread_pct": {c: round(100 * v, 1) for c, v in sorted(spread.items())},
        # the band a calibrated prediction prints: `python -m doctables.transfer`'s summary at the stand-in's lengths
        "transfer": _transfer(),
        "runs": rs,
        "pairs": ps,
    }  # fmt: skip


def text(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def stale() -> list[str]:
    """Why the committed bands are not what the accuracy tables give now (empty: they are)."""
    if not BANDS.is_file():
        return [f"{BANDS.name} missing"]
    return [] if BANDS.read_text() == text(build()) else [f"{BANDS.name} is not what the accuracy tables give"]


def write(data: dict | None = None) -> None:
    """Write `rlsim/bands.json`: `data` as `build()` gave it, or a build now."""
    BANDS.write_text(text(data if data is not None else build()))
