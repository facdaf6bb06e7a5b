"""Shipped GPU profiles against the memory roofline, before and after a change, as markdown.

    python -m doctables.profile_table [--before-rev 879e9c8] [--markdown | --readme]

Prints (1) each profile's decode tok/s at batch 64 and 256 for 1k and 8k context, at the revision
`--before-rev` (read with `git show`, so run it in a clone with history) and now, with the roofline
fraction now; (2) each profile's roofline fraction over batch 32/64/128/256 x context
1k/4k/8k/16k, `*` where the KV does not fit. Pure arithmetic on the profiles: no simulation.
`--markdown` prints table (1) alone; `--readme` also writes it into README.md, where
`tests/test_readme_tables.py` holds it equal to this script's output.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

from rlsim.package_data.markers import emit
from rlsim.profile import load_profile, profile_from_dict, shipped_profiles
from rlsim.roofline import BATCHES, CONTEXTS, cell, has_roofline

REPO = Path(__file__).resolve().parents[1]


def _before(rev: str, name: str):  # noqa: ANN202
    for folder in ("rlsim/profiles", "calibrate/profiles"):  # (where they lie, and where they lay before)
        try:
            text = subprocess.run(["git", "show", f"{rev}:{folder}/{name}.json"], cwd=REPO, check=True,
                                  capture_output=True, text=True).stdout  # fmt: skip
            break
        except (subprocess.CalledProcessError, FileNotFoundError):
            continue
    else:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return profile_from_dict(json.loads(text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before-rev", default="879e9c8")
    ap.add_argument("--markdown", action="store_true", help="print the before/after table only")
    ap.add_argument("--readme", action="store_true", help="also write it into README.md")
    args = ap.parse_args()
    names = [n for n in shipped_profiles() if has_roofline(load_profile(n))]
    points = [(64, 1024), (64, 8192), (256, 1024), (256, 8192)]
    head = " | ".join(f"B {b}, {c // 1024}k" for b, c in points)
    rows = [f"| profile | {head} |\n|---|" + "---|" * len(points)]
    for name in names:
        now, old = load_profile(name), _before(args.before_rev, name)
        cells = []
        for b, c in points:
            x = cell(now, b, c)
            was = cell(old, b, c).tokens_per_s if old else None
            if was is None:
                was = "new: "
            elif round(was) == round(x.tokens_per_s):
                was = ""  # unchanged
            else:
                was = f"{was:,.0f} -> "
            cells.append(f"{was}{x.tokens_per_s:,.0f} ({x.roofline_fraction:.0%}){'' if x.kv_fits else ' *'}")
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    if args.markdown or args.readme:
        emit("profile_table", "\n".join(rows), sys.argv)
        return
    print("\n".join(rows) + "\n")
    for name in names:
        p = load_profile(name)
        print(f"`{name}`: fraction of the roofline (batch x context)\n")
        print("| batch | " + " | ".join(f"{c // 1024}k" for c in CONTEXTS) + " |\n|---|" + "---|" * len(CONTEXTS))
        for b in BATCHES:
            row = [f"{cell(p, b, c).roofline_fraction:.0%}{'' if cell(p, b, c).kv_fits else ' *'}" for c in CONTEXTS]
            print(f"| {b} | " + " | ".join(row) + " |")
        print()


if __name__ == "__main__":
    main()
