"""How far apart NeMo RL publishes one configuration across releases with its recipe unchanged:
the floor of any prediction made from a recipe alone.

    python benchmarks/release_spread.py [--markdown | --readme]

A configuration (`rows.csv` `config`: model, GPU, precision, policy, GPUs) published in two or more
releases is **identical** across them when its recipe file is byte-identical at every release's
commit (`published_runs/nemo_rl/<commit>/<recipe>`) and no row of it takes the published table's
layout over its recipe's (`nemo_rl.TABLE_NOT_RECIPE`). Its spread is the slowest published step
over the fastest, less one. The recipes' shared parent (`grpo_math_1B.yaml`) and NeMo RL's own
code do change between releases; what the spread measures is everything the recipe does not say.
`benchmarks/error_bands.py` gives each band the spread of its configurations beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from nemo_rl import RECIPES, ROWS, TABLE_NOT_RECIPE
from readme_tables import emit


def spreads() -> pd.DataFrame:
    """One row per configuration published in two or more releases: its releases, whether its
    recipe is identical across them (and why not), its published steps and its spread."""
    d = pd.read_csv(ROWS)
    out = []
    for config, part in d.groupby("config"):
        if part.release.nunique() < 2:
            continue
        texts = {(Path(RECIPES) / str(r.commit) / str(r.recipe)).read_bytes() for _, r in part.iterrows()}
        overlay = any((str(r.release), Path(r.recipe).name) in TABLE_NOT_RECIPE for _, r in part.iterrows())
        why = "table's layout over the recipe" if overlay else ("" if len(texts) == 1 else "recipe changed")
        steps = part.sort_values("release").step_s
        out.append({"config": config, "model": part.model.iloc[0], "half": part.half.iloc[0],
                    "releases": ", ".join(part.sort_values("release").release.astype(str)),
                    "steps": " / ".join(f"{s:.1f}" for s in steps), "identical": not why, "why_not": why,
                    "spread": float(steps.max() / steps.min() - 1)})  # fmt: skip
    return pd.DataFrame(out)


def table(s: pd.DataFrame) -> str:
    lines = ["| configuration | releases | published step (s) | recipe | spread |", "|---|---|---|---|---:|"]
    for _, r in s.sort_values(["identical", "spread"], ascending=[False, False]).iterrows():
        recipe = "identical" if r.identical else f"not identical ({r.why_not})"
        lines.append(f"| {r.config.replace('|', ', ')} | {r.releases} | {r.steps} | {recipe} | {r.spread:.0%} |")
    same = s[s.identical]
    lines.append("")
    lines.append(f"{len(same)} configurations published with an identical recipe in two or more releases: spread "
                 f"median {same.spread.median():.0%}, from {same.spread.min():.0%} to {same.spread.max():.0%}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    body = table(spreads())
    emit("release_spread", body, sys.argv)
    if not {"--markdown", "--readme"} & set(sys.argv):
        print(body)


if __name__ == "__main__":
    main()
