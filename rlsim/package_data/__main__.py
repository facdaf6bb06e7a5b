"""`python -m rlsim.package_data [profiles] [core] [bands] [terms] [--check]`: write the package data, or check it."""

from __future__ import annotations

import argparse
import sys

from rlsim.errors import RlsimError
from rlsim.package_data import bands, checkout, core, profiles, terms

PARTS = {"profiles": profiles, "core": core, "bands": bands, "terms": terms}
# what a bare build writes: all but the terms' fit (up to 240 simulations of the rows), named to run it; a bare
# --check checks every part
QUICK = ("profiles", "core", "bands")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlsim.package_data", description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="*", metavar="PART", help=f"what to write: {', '.join(PARTS)} "
                    f"(default: {', '.join(QUICK)}; --check: all)")  # fmt: skip
    ap.add_argument("--check", action="store_true", help="Write nothing; exit 1 naming each stale part.")
    args = ap.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    try:
        if unknown:
            raise RlsimError(f"unknown part {unknown[0]!r}: use {', '.join(PARTS)}")
        checkout()
        parts = args.parts or list(PARTS if args.check else QUICK)
        if args.check:
            found = {p: PARTS[p].stale() for p in parts}
            for p, what in found.items():
                print(f"{p}: " + ("current" if not what else "stale: " + "; ".join(what)))
            bad = [p for p, what in found.items() if what]
            if bad:
                print(f"run `python -m rlsim.package_data {' '.join(bad)}` and commit what it writes", file=sys.stderr)
            return 1 if bad else 0
        for p in parts:
            PARTS[p].write()
    except RlsimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
