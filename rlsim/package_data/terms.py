"""NeMo RL's fitted terms (`rlsim/derive/terms_nemo-rl.json`, `--terms nemo-rl`): the set of terms
that cross-validation chose, fitted on the fit half of NeMo RL's published rows.

    python -m rlsim.package_data terms [--check]     # the fit: hundreds of simulations of the rows
    python -m doctables.published_runs --term-sets      # which terms ship (`term_sets`), before a fit

The fit (`rlsim.package_data.nemo_rl.fit`) reads only the fit half of `published_runs/rows.csv` and
fits the set `published_runs/term_sets.json` chose (`term_sets`: two-fold cross-validation inside
the fit half). The file records a digest of those two inputs (the rows and the chosen set), and
`--check` fails while they are not the ones the committed terms were fitted on. A change to the
simulator that would move the fit is not seen by the check (refitting simulates the fit half's
rows hundreds of times, so CI does not): the accuracy tables, which CI re-runs, show its effect on every row.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import sys
import time
from dataclasses import asdict

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.package_data import nemo_rl

TERM_SETS_FILE = nemo_rl.ROWS.parent / "term_sets.json"
SOURCE = "NeMo RL performance summary v0.4, v0.5, v0.6 (github.com/NVIDIA-NeMo/RL, docs/about/performance-summary.md)"
FITTED_ON = (
    "the fit half of published_runs/rows.csv (configurations alternating within each model, committed before "
    "fitting; the configurations generation across nodes added alternate among themselves), mean squared log error "
    "of the mean step time over steps 2-5"
)


def _chosen() -> dict:
    if not TERM_SETS_FILE.is_file():
        raise RlsimError(f"{TERM_SETS_FILE} is missing: run `python -m doctables.published_runs --term-sets` first")
    return json.loads(TERM_SETS_FILE.read_text())


def inputs_digest() -> str:
    """The digest of what the fit reads: the published rows and the chosen set of terms (with its unit)."""
    chosen = _chosen()
    what = {"chosen": chosen["chosen"], "terms": chosen["terms"][chosen["chosen"]], "unit": chosen["unit"]}
    h = hashlib.sha256(nemo_rl.ROWS.read_bytes())
    h.update(json.dumps(what, sort_keys=True).encode())
    return h.hexdigest()[:16]


def stale() -> list[str]:
    """Why the committed terms are not the fit of the current inputs (empty: they are)."""
    if not nemo_rl.FITTED.is_file():
        return [f"{nemo_rl.FITTED.name} missing"]
    found = json.loads(nemo_rl.FITTED.read_text()).get("inputs_digest")
    now = inputs_digest()
    return [] if found == now else [f"{nemo_rl.FITTED.name} was fitted on inputs {found}, and they are now {now}"]


def build(jobs: int = 2) -> dict:
    """The chosen terms fitted on the fit half (a pool of `jobs` processes simulates the rows)."""
    chosen = _chosen()
    keep = tuple(chosen["terms"][chosen["chosen"]])
    if not keep:
        raise RlsimError(f"{TERM_SETS_FILE.name}: the derived profile ships (no term): nothing to fit")
    d = nemo_rl.load_rows()
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        terms, loss = nemo_rl.fit(d, unit=chosen["unit"], keep=keep, pool=pool)
    others = ", ".join(f"{k} {v}" for k, v in chosen["losses"].items() if k != chosen["chosen"])
    return {
        "terms": asdict(terms), "fitted_terms": list(keep),
        "cross_validated": f"{chosen['chosen']}: loss {chosen['losses'][chosen['chosen']]} against {others} "
        "(published_runs/term_sets.json)",
        "fit_loss_mean_sq_log_error": round(loss, 5), "fitted_on": FITTED_ON,
        "rows": int(nemo_rl.fit_half(d).shape[0]), "source": SOURCE, "inputs_digest": inputs_digest(),
    }  # fmt: skip


def write(jobs: int = 2) -> None:
    t0 = time.time()
    say = "terms: fitting on the fit half of NeMo RL's rows (Nelder-Mead, up to 240 simulations of them)"
    print(say, file=sys.stderr, flush=True)
    nemo_rl.FITTED.write_text(json.dumps(build(jobs), indent=2) + "\n")
    print(f"terms: wrote {nemo_rl.FITTED} in {time.time() - t0:.0f} s", file=sys.stderr)


def term_sets(jobs: int = 2) -> dict:
    """Each set of terms (`nemo_rl.TERM_SETS`) cross-validated inside the fit half, the folds' fits
    on a process pool; the set that ships (`nemo_rl.choose`), written to `TERM_SETS_FILE`."""
    d = nemo_rl.load_rows()
    work = [(name, k) for name in nemo_rl.TERM_SETS for k in (0, 1)]
    errors: dict[str, list] = {name: [] for name in nemo_rl.TERM_SETS}
    t0 = time.time()
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        args = [(d, nemo_rl.SHIPPED_UNIT, nemo_rl.TERM_SETS[name], k) for name, k in work]
        for (name, k), err in zip(work, pool.imap(nemo_rl._fold_errors, args), strict=True):
            errors[name].append(err)
            print(f"{name}, fold {k} predicted: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    losses = {name: float(np.mean(np.log1p(pd.concat(e)) ** 2)) for name, e in errors.items()}
    out = {
        "losses": {k: round(v, 5) for k, v in losses.items()},
        "terms": {k: list(v) for k, v in nemo_rl.TERM_SETS.items()},
        "chosen": nemo_rl.choose(losses), "tie": nemo_rl.TIE, "unit": nemo_rl.SHIPPED_UNIT,
        "how": "two-fold cross-validation inside the fit half (folds by configuration, alternating within each "
        "model): the set's terms fitted on one fold, the other fold's mean squared log error of the step time, "
        "over both folds' rows; the lowest loss ships, a set within the tie of it ties and the smaller set ships",
    }  # fmt: skip
    TERM_SETS_FILE.write_text(json.dumps(out, indent=2) + "\n")
    return out
