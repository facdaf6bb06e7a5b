"""`rlsim run --real --calibrate`: the decode grid measured on the run's own engines, between its steps.

A profile calibrated in another process, minutes earlier, describes a different engine (another
wrapper, other buffers) on a machine whose speed has moved since: on a shared 2-core VM the
iteration model's error against a run swung between -35% and +11% from one window to the next,
and the same grid cells ran 7-14% faster or slower half a minute apart. With `--calibrate GRID`
the run measures `rlsim calibrate decode`'s grid (`GRIDS[GRID]`, the same cells and lengths,
`rlsim.calibration.grid.cell_lengths`) on its own engines, every instance measuring at once as the
run's instances decode at once, in two passes:

- *before* the first step, in a seeded order: fitted (`rlsim.calibration.fit.fit_iterations`) into the
  profile the run uses (written into config.json), with the engines' own KV capacity and limits;
  training cost and weight sync come from `--profile`;
- *during* the run, in another order: a few cells at every step boundary where all engines are
  idle, with the run's clock stopped (`RealEngine.clock_stopped`), spread so the pass ends with
  the last step; cells no boundary could take run after it. The fit on this pass, measured in
  the run's own window, is `calibration/profile.json`, and `rlsim validate` simulates with it.
  How much longer the same cells took during the run than before it is `drift_pct`.

Neither pass counts as the run's: the clock does not run while a cell is measured, and the
cells' iterations go to `calibration/iterations.parquet` (with `at_step`: -1 before the steps,
else the number of steps finished), not the run's.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlsim.calibration.fit import fit_iterations, repeat_noise
from rlsim.calibration.grid import GRIDS, SAMPLING_TEMPERATURE, DecodeConfig, cell_lengths, check_grid
from rlsim.errors import RlsimError
from rlsim.files import atomic_write_bytes
from rlsim.hostload import LoadMeter, speed_probe
from rlsim.profile import Profile, default_async_scheduling
from rlsim.real.engine import RealEngine
from rlsim.real.run_config import profile_from
from rlsim.real.run_files import write_parquet
from rlsim.report import to_json

PASSES = ("before", "during")


def grid_cells(grid: str, seed: int, pass_idx: int) -> list[tuple[int, int]]:
    """The (batch size, prompt length) cells of one pass, in that pass's seeded order."""
    batch_sizes, prompt_lens, _ = GRIDS[grid]
    cells = [(b, p) for p in prompt_lens for b in batch_sizes]
    order = np.random.default_rng([seed, pass_idx]).permutation(len(cells))
    return [cells[k] for k in order]


def check_grid_fits(grid: str, facts: list[dict]) -> None:
    """The grid's largest cell must fit every engine (one sentence naming what does not)."""
    b, p, n = GRIDS[grid]
    cfg = DecodeConfig(model="", out=Path("."), batch_sizes=b, prompt_lens=p, output_len=n)
    for f in facts:
        try:
            check_grid(cfg, f)
        except RlsimError as exc:
            raise RlsimError(f"--calibrate {grid}: {exc}") from None


def cell_requests(grid: str, b: int, p: int, vocab: int, rng: np.random.Generator, tag: str) -> list[dict]:
    """One cell's requests, lengths as `rlsim calibrate decode` gives them, sampled as the run samples."""
    plens, outs = cell_lengths(b, p, GRIDS[grid][2])
    return [
        {"request_id": f"calib-{tag}-{i}", "prompt_token_ids": rng.integers(2, vocab, plens[i]).tolist(),
         "max_tokens": outs[i], "min_tokens": outs[i], "ignore_eos": True, "temperature": SAMPLING_TEMPERATURE}
        for i in range(b)
    ]  # fmt: skip


def measure_cells(backend, facts: list[dict], grid: str, seed: int, which: str, ks: list[int]) -> pd.DataFrame:  # noqa: ANN001
    """Cells `ks` (positions in the pass's order) on every instance at once; rows as
    `rlsim calibrate decode` writes them (phase "grid", `cell` numbered in measuring order across
    passes, `cell_batch`, `cell_prompt_len`), plus `instance` and `pass`. A cell's requests
    depend only on the seed, the pass and its position, however the pass is split up."""
    pass_idx = PASSES.index(which)
    cells = grid_cells(grid, seed, pass_idx)
    rows: list[dict] = []
    for k in ks:
        b, p = cells[k]
        rng = np.random.default_rng([seed, 7, pass_idx, k])
        reqs = [cell_requests(grid, b, p, f["vocab_size"], rng, f"{which}{k}i{i}") for i, f in enumerate(facts)]
        for i, got in enumerate(backend.call_all("measure", reqs)):
            cell = (pass_idx * len(cells) + k) * len(facts) + i
            rows += [dict(r, phase="grid", cell=cell, cell_batch=b, cell_prompt_len=p, instance=i, **{"pass": which})
                     for r in got]  # fmt: skip
    return pd.DataFrame(rows)


def pending_cells(rows: pd.DataFrame | None, grid: str, num_instances: int, which: str = "during") -> list[int]:
    """Positions of the cells of pass `which` not measured yet, in measuring order."""
    pass_idx = PASSES.index(which)
    n = len(grid_cells(grid, 0, pass_idx))
    done = set() if rows is None or rows.empty else set(rows["cell"].astype(int) // num_instances - pass_idx * n)
    return [k for k in range(n) if k not in done]


def fit_profile(
    base: Profile, rows: pd.DataFrame, facts: list[dict], grid: str, host_load: dict | None,
    both: pd.DataFrame | None = None,
) -> Profile:
    """`base` with the iteration model fitted to `rows` and the engines' own limits. With `both`
    (the rows of both passes), the noise between the passes' measurements of the same cells
    (`rlsim.calibration.fit.repeat_noise`) and their drift (`pass_drift`) go into the profile."""
    fit = fit_iterations(rows)
    noise = fit.noise if both is None else repeat_noise(both)
    drift = None if both is None else pass_drift(both)
    f0 = facts[0]
    passes = sorted(set(rows["pass"]), key=PASSES.index)
    provenance = {
        "kind": "calibrated",
        "source": "rlsim run --real --calibrate: the decode grid on the run's own engines, "
        + " and ".join({"before": "before the steps", "during": "between the steps"}[p] for p in passes),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": f0.get("host"),
        "hardware": f0["hardware"],
        "vllm_version": f0.get("vllm_version"),
        **({"sglang_version": f0["sglang_version"]} if "sglang_version" in f0 else {}),
        "torch_version": f0.get("torch_version"),
        "dtype": f0.get("dtype"),
        "grid": grid,
        "passes": passes,
        "host_load": host_load,
        "train": f"from profile {base.name}",
        "notes": list(fit.notes),
    }
    if drift is not None:
        provenance["drift_pct"] = round(100 * drift, 2)  # during vs before, the same cells
    return dataclasses.replace(
        base,
        name=f"run-calibrated-{Path(str(f0['model'])).name}-tp{f0['tensor_parallel_size']}",
        hardware=f0["hardware"],
        model=str(f0["model"]),
        tensor_parallel_size=int(f0["tensor_parallel_size"]),
        **{k: round(v, 12) for k, v in fit.coeffs.items()},
        kv_capacity_tokens=min(int(f["kv_capacity_tokens"]) for f in facts),
        rollout_engine=str(f0.get("rollout_engine", "vllm")),  # whose engine measured the costs
        engine=dataclasses.replace(  # the engine the run's instances ran (facts.json)
            base.engine,
            block_size=int(f0["block_size"]),
            async_scheduling=bool(f0.get("async_scheduling", default_async_scheduling(str(f0["hardware"])))),
            max_num_seqs=int(f0["max_num_seqs"]),
            max_num_batched_tokens=int(f0["max_num_batched_tokens"]),
        ),
        provenance=provenance,
        fit_error={
            "heldout_mape": round(fit.mape, 4),
            "heldout_mape_by_batch": fit.mape_by_batch,
            "heldout_total_time_error": round(fit.heldout_total_error, 4),
            "heldout_total_time_error_by_batch": fit.total_error_by_batch,
            "grid_repeat_noise": None if noise is None else round(noise, 4),
            "iterations_fit": fit.n_fit,
            "iterations_heldout": fit.n_holdout,
        },
        # the base's model and GPU facts cost training and sync when they describe this model
        model_facts=base.model_facts if base.model == str(f0["model"]) else {},
        gpu_facts=base.gpu_facts if base.model == str(f0["model"]) else {},
    )


def pass_drift(rows: pd.DataFrame) -> float | None:
    """How much slower (+) or faster (-) the pass during the steps ran the same cells than the
    pass before them: the ratio of their summed iteration times over the cells both measured
    (None with one pass)."""
    if set(rows["pass"]) != set(PASSES):
        return None
    tot = rows.groupby(["pass", "instance", "cell_batch", "cell_prompt_len"])["step_s"].sum().unstack("pass").dropna()
    return float(tot["during"].sum() / tot["before"].sum() - 1.0) if len(tot) else None


def read_run_profile(run_dir: Path) -> dict[str, Any] | None:
    """The profile fitted on the cells measured between a `--calibrate` run's steps, or None."""
    path = run_dir / "calibration" / "profile.json"
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RlsimError(f"{path} is not readable JSON ({str(exc).splitlines()[0]})") from None
    return raw if isinstance(raw, dict) else None


class RunCalibration:
    """`RealRun`'s calibration passes and machine probes (a mixin over its state)."""

    def _measure_cells(self, which: str, ks: list[int], backend, facts: list[dict], at_step: int) -> pd.DataFrame:  # noqa: ANN001
        """Measure cells `ks` of pass `which`; append them to calibration/iterations.parquet and
        this pass's load to calibration/host.json; answer every row measured so far."""
        meter = LoadMeter()
        new = measure_cells(backend, facts, self.real.calibrate, self.rl.seed, which, ks).assign(at_step=at_step)
        folder = self.out / "calibration"
        folder.mkdir(exist_ok=True)
        path, host_path = folder / "iterations.parquet", folder / "host.json"
        rows = new
        if path.exists():
            old = pd.read_parquet(path)
            if which == "before":  # a run restarted before its first step measures the pass again
                old = old[old["pass"] != which]
            rows = pd.concat([old, new], ignore_index=True)
        write_parquet(path, rows.sort_values("cell", kind="stable").reset_index(drop=True))
        loads = json.loads(host_path.read_text()) if host_path.exists() else {}
        loads.setdefault(which, []).append(meter.read())
        atomic_write_bytes(host_path, to_json(loads).encode())
        return rows

    def _pass_load(self, which: str, backend, facts: list[dict]) -> dict[str, float]:  # noqa: ANN001
        """The pass's mean load from calibration/host.json, with the speed and engine probes now."""
        loads = json.loads((self.out / "calibration" / "host.json").read_text())[which]
        out = {k: round(float(np.nanmean([ld[k] for ld in loads])), 3) for k in loads[0]}
        out["host/probe_ms"] = speed_probe()
        ms = [backend.call(i, "probe", f["vocab_size"]) for i, f in zip(range(self.n), facts, strict=True)]
        out["host/engine_probe_ms"] = round(float(np.mean(ms)), 3)
        return out

    def _calibrate_before(self, backend, facts: list[dict], say) -> Profile:  # noqa: ANN001
        """The first pass, whole, before the steps: its fit becomes the run's profile (config.json)."""
        grid = self.real.calibrate
        check_grid_fits(grid, facts)
        n = len(grid_cells(grid, self.rl.seed, 0))
        say(f"calibrating before the steps: rlsim calibrate decode's {grid} grid, {n} cells on {self.n} engine(s)")
        t0 = time.perf_counter()
        rows = self._measure_cells("before", list(range(n)), backend, facts, -1)
        prof = fit_profile(profile_from(self.config["profile"]), rows, facts, grid,
                           self._pass_load("before", backend, facts))  # fmt: skip
        self.config["profile"] = prof.to_dict()
        self.config["profile_name"] = prof.name
        atomic_write_bytes(self.out / "config.json", to_json(self.config).encode())
        say(f"calibrated in {time.perf_counter() - t0:.0f} s: held-out MAPE {prof.fit_error['heldout_mape']:.1%}; "
            f"the second pass runs between the steps, with the run's clock stopped")  # fmt: skip
        return prof

    def _pending(self) -> list[int]:
        path = self.out / "calibration" / "iterations.parquet"
        rows = pd.read_parquet(path) if path.exists() else None
        rows = None if rows is None else rows[rows["pass"] == "during"]
        return pending_cells(rows, self.real.calibrate, self.n)

    def _calibrate_between(self, engine: RealEngine, backend, facts: list[dict], done: int) -> None:  # noqa: ANN001
        """A share of the second pass at this step boundary, if every engine is idle: the cells
        left over the boundaries left (one after each step still to run, and this one)."""
        pending = self._pending()
        left = max(1, self.total_steps() - done + 1)
        if not pending or not engine.idle() or not all(backend.call(i, "idle") for i in range(self.n)):
            return
        take = pending[: -(-len(pending) // left)]
        with engine.clock_stopped():
            self._measure_cells("during", take, backend, facts, done)

    def _calibrate_end(self, backend, facts: list[dict], done: int, say) -> None:  # noqa: ANN001
        """The second pass's remaining cells, then its fit: calibration/profile.json."""
        pending = self._pending()
        if pending:
            self._measure_cells("during", pending, backend, facts, done)
        rows = pd.read_parquet(self.out / "calibration" / "iterations.parquet")
        during = rows[rows["pass"] == "during"]
        prof = fit_profile(profile_from(self.config["profile"]), during, facts, self.real.calibrate,
                           self._pass_load("during", backend, facts), rows)  # fmt: skip
        drift = prof.provenance.get("drift_pct", 0.0)
        atomic_write_bytes(self.out / "calibration" / "profile.json", to_json(prof.to_dict()).encode())
        say(f"calibrated between the steps: {len(during) and during['cell'].nunique() // self.n} cells at "
            f"{during['at_step'].nunique()} step boundaries; held-out MAPE {prof.fit_error['heldout_mape']:.1%}; the "
            f"same cells took {drift:+.1f}% longer than before the steps")  # fmt: skip

    def _probe(self, when: str, backend, facts: list[dict]) -> None:  # noqa: ANN001
        """The machine's speed before and after the steps, kept in host.json (a resumed run adds
        its own pair): `rlsim.hostload.speed_probe`, and with the engines up, the engine probe
        calibration also times (`rlsim.real.vllm_engine.probe_requests`), the mean over instances."""
        path = self.out / "host.json"
        host = json.loads(path.read_text()) if path.exists() else {"probes": []}
        row = {"when": when, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "probe_ms": speed_probe()}
        if backend is not None:
            ms = [backend.call(i, "probe", f["vocab_size"]) for i, f in zip(range(self.n), facts, strict=True)]
            row["engine_probe_ms"] = round(float(np.mean(ms)), 3)
        host["probes"].append(row)
        atomic_write_bytes(path, to_json(host).encode())
