"""The error bands' two tables (`error_bands`, `ratio_bands`), from what `rlsim.package_data.bands` builds.

    python -m doctables.error_bands [--markdown | --readme]   # --readme also writes rlsim/bands.json

The bands are read from the accuracy tables (see `rlsim.package_data.bands`); `--readme` writes the
tables and the bands file both (`rlsim.package_data.bands.write`, what `python -m
rlsim.package_data bands` runs).
"""

from __future__ import annotations

import sys

from rlsim.package_data import bands
from rlsim.package_data.markers import emit

ENGINE = {"vllm": "vLLM", "sglang": "SGLang"}
FW_NAME = {"nemo-rl": "NeMo RL", "verl": "veRL", "roll": "ROLL", "any": "any (pooled)"}


def tables(data: dict) -> dict[str, str]:
    lines = ["| basis | engine | framework | trainer | model class | GPU | held-back configurations (runs) | "
             "median abs error | worst | median signed | per model, signed | widest release spread |",
             "|---|---|---|---|---|---|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for key, b in data["bands"].items():
        basis, engine, fw, backend, cls, gpu = key.split("/")
        if b["configurations"] < data["min_configurations"]:
            cells = ["fewer than three configurations", "", "", ""]
        else:
            per_model = "; ".join(f"{m} {v:+.0f}%" for m, v in b["by_model_median_pct"].items())
            cells = [f"{b['median_abs_pct']:.0f}%", f"{b['worst_abs_pct']:.0f}%", f"{b['median_pct']:+.0f}%",
                     per_model + (" (signs split)" if b["signs_split"] else "")]  # fmt: skip
        spread = "" if b["release_spread_pct"] is None else f"{b['release_spread_pct']:.0f}%"
        model = "MoE" if cls == "moe" else "dense"
        lines.append(f"| {basis} | {ENGINE[engine]} | {FW_NAME[fw]} | {backend} | {model} | {gpu.upper()} | "
                     f"{b['configurations']} ({b['runs']}) | " + " | ".join(cells) + f" | {spread} |")  # fmt: skip
    ratio = ["| basis | engine | framework | held-back pairs | median abs error of the ratio | worst | median signed |",
             "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for key, b in data["ratio_bands"].items():
        basis, engine, fw = key.split("/")
        if b["runs"] < data["min_configurations"]:
            cells = ["fewer than three pairs", "", ""]
        else:
            cells = [f"{b['median_abs_pct']:.0f}%", f"{b['worst_abs_pct']:.0f}%", f"{b['median_pct']:+.0f}%"]
        ratio.append(f"| {basis} | {ENGINE[engine]} | {FW_NAME[fw]} | {b['runs']} | " + " | ".join(cells) + " |")
    return {"error_bands": "\n".join(lines) + "\n", "ratio_bands": "\n".join(ratio) + "\n"}


def main(argv: list[str]) -> None:
    data = bands.build()
    if "--readme" in argv:
        bands.write(data)
    for name, body in tables(data).items():
        emit(name, body, argv)
    if not {"--markdown", "--readme"} & set(argv):
        print("\n".join(tables(data).values()))


if __name__ == "__main__":
    main(sys.argv[1:])
