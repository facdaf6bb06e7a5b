"""The knobs table of docs/policies.md, from the policy registry itself (what `rlsim policies`
prints), so the page cannot drift from the code.

    python -m doctables.policy_table [--markdown | --readme]
"""

from __future__ import annotations

import sys

from policies.registry import describe
from rlsim.package_data.markers import emit


def main() -> None:
    lines = ["| name | knobs (defaults) | what and where from |", "|---|---|---|"]
    for name, knobs, what in describe():
        lines.append(f"| `{name}` | {knobs.replace('|', '/')} | {what.replace('|', '/')} |")
    body = "\n".join(lines) + "\n"
    emit("policy_knobs", body, sys.argv)
    if "--markdown" not in sys.argv and "--readme" not in sys.argv:
        print(body)


if __name__ == "__main__":
    main()
