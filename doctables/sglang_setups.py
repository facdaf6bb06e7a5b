"""The setups of record that ran SGLang, re-run under SGLang's scheduling rules.

    python -m doctables.sglang_setups [--markdown | --readme]

APRIL (Qwen3-4B and 8B on 8 MI300X) and Seer (Moonlight-16B-A3B and Qwen2-VL-72B on H800s, its
Table 3) rolled out with SGLang; their checks (`doctables/paper_checks.py`) run under vLLM's
rules, the only ones rlsim had. Each figure here is computed under both, the same setup of
record (`doctables/paper_setups.py`) and the same band, so the table shows what SGLang's rules
change. Nothing is fitted: the profiles are derived with NeMo RL's fitted terms, as there. Under
SGLang's rules Seer runs without its grouped drafting (speculation is modelled under vLLM's rules
only), so its throughput row there is its scheduling alone. slime's published figures that the
docs quote are weight sync and fitted decode costs, which no scheduling rule moves.
"""

from __future__ import annotations

import sys

from doctables.paper_setups import SEER, april, seer
from rlsim.package_data.markers import emit

APRIL = (("qwen3-4b", "GRPO +31.3%, DAPO +10.8%"), ("qwen3-8b", "GRPO +36.9%, DAPO +9.1%"))


def band(x: float, lo: float, hi: float) -> str:
    return f"{x:+.0%} ({'pass' if lo <= x <= hi else 'FAIL'})"


def rows() -> list[tuple[str, ...]]:
    out = []
    for model, paper in APRIL:
        gains = [april(model, rollout_engine=e) for e in ("vllm", "sglang")]
        cells = [band(g["april"] / g["sync"] - 1, 0.10, 0.40) for g in gains]
        out.append((f"APRIL over sync, {model}, 32 x 8, 16k cap, 8 MI300X at TP 2", f"{paper} (band +10% to +40%)",
                    *cells))  # fmt: skip
    for model, gpus, tp, prompts, samples, cap, mean, (paper_verl, paper_seer) in SEER:
        where = f"{model}, {prompts} x {samples}, {cap // 1024}k cap, {gpus} H800s at TP {tp}"
        runs = [seer(model, gpus, tp, prompts, samples, cap, mean, rollout_engine=e) for e in ("vllm", "sglang")]
        out.append((f"Seer's veRL baseline rollout seconds, {where}", f"{paper_verl:,} s",
                    *(f"{r['verl']['gen_s']:,.0f} s ({r['verl']['gen_s'] / paper_verl - 1:+.0%})" for r in runs)))
        vllm_gain, sglang_gain = (r["seer"]["tok_s"] / r["verl"]["tok_s"] - 1 for r in runs)
        out.append((f"Seer throughput over veRL, {where}", f"+{paper_verl / paper_seer - 1:.0%} (band +55% to +115%)",
                    f"{band(vllm_gain, 0.55, 1.15)}, grouped drafting on",
                    f"{band(sglang_gain, 0.55, 1.15)}, scheduling alone"))  # fmt: skip
    return out


def table() -> str:
    lines = ["| setup of record | the paper (SGLang) | under vLLM's rules | under SGLang's rules |",
             "|---|---|---|---|"]  # fmt: skip
    return "\n".join(lines + [f"| {' | '.join(r)} |" for r in rows()])


if __name__ == "__main__":
    body = table()
    emit("sglang_setups", body, sys.argv[1:])
    if not {"--markdown", "--readme"} & set(sys.argv[1:]):
        print(body)
