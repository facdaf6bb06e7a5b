"""How far apart NeMo RL publishes one configuration across releases with its recipe unchanged:
the floor of any prediction made from a recipe alone.

    python -m doctables.release_spread [--markdown | --readme]

A configuration (`rows.csv` `config`: model, GPU, precision, policy, GPUs) published in two or more
releases is **identical** across them when its recipe file is byte-identical at every release's
commit (`published_runs/nemo_rl/<commit>/<recipe>`) and no row of it takes the published table's
layout over its recipe's (`nemo_rl.TABLE_NOT_RECIPE`). Its spread is the slowest published step
over the fastest, less one. The recipes' shared parent (`grpo_math_1B.yaml`) and NeMo RL's own
code do change between releases; what the spread measures is everything the recipe does not say.
The error bands (`rlsim.package_data.bands`) give each band the spread of its configurations beside it.
"""

from __future__ import annotations

import sys

import pandas as pd

from rlsim.package_data.markers import emit
from rlsim.package_data.nemo_rl import release_spreads as spreads


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
