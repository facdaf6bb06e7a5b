"""DAPO's rule-based math reward: +1 when the response's answer matches the ground truth, else -1.

DAPO's prompt asks for the answer on the last line as `Answer: $Answer` (DAPO, arXiv:2503.14476;
veRL's `math_dapo.compute_score`). The answer is the text after the last `Answer:`. It is compared
with Hugging Face's `math-verify` (https://github.com/huggingface/Math-Verify) when that package
is installed (the `real` extra installs it), which accepts equivalent forms (`1/2`, `0.5`,
`\\frac{1}{2}`); otherwise by veRL's normalisation of the two strings (units, spaces, `\\text{}`,
`\\boxed{}` and trailing dots removed).
"""

from __future__ import annotations

import re

import pyarrow.parquet as pq

from rlsim.paths import MATH17K_PROMPTS, bundled

_ANSWER = re.compile(r"Answer\s*:\s*(.+)", re.IGNORECASE)
_REMOVE = (r"\\text\{[^}]*\}", r"\\mathrm\{[^}]*\}", r"\\!", r"\\,", r"\$", r"\s+", r"\.$")


def extract_answer(text: str) -> str | None:
    """The text after the last `Answer:` (its line only), or None."""
    found = _ANSWER.findall(text or "")
    return found[-1].strip() if found else None


def normalize(answer: str) -> str:
    s = answer.strip()
    boxed = re.search(r"\\boxed\{(.*)\}", s)
    if boxed:
        s = boxed.group(1)
    for pat in _REMOVE:
        s = re.sub(pat, "", s)
    return s.replace("dfrac", "frac").replace("tfrac", "frac").lower()


def score(text: str, ground_truth: str) -> float:
    """+1.0 for a correct answer, -1.0 otherwise (no answer line counts as wrong)."""
    answer = extract_answer(text)
    if answer is None:
        return -1.0
    try:
        from math_verify import parse, verify
    except ImportError:
        return 1.0 if normalize(answer) == normalize(ground_truth) else -1.0
    try:
        ok = verify(parse(f"${ground_truth}$"), parse(f"${answer}$"))
    except Exception:  # noqa: BLE001 - math-verify raises on unparsable input
        ok = False
    return 1.0 if ok or normalize(answer) == normalize(ground_truth) else -1.0


def answers_for(texts: dict[int, str]) -> dict[int, str]:
    """Ground-truth answers of the trace's prompts, from the bundled DAPO-Math-17k prompt file,
    for prompts whose text matches it (other traces get no rewards)."""
    path = bundled(MATH17K_PROMPTS)
    if not path.exists() or "ground_truth" not in pq.read_schema(path).names:
        return {}
    df = pq.read_table(path, columns=["prompt_id", "prompt_text", "ground_truth"]).to_pandas()
    known = dict(zip(df["prompt_id"].astype(int), zip(df["prompt_text"], df["ground_truth"], strict=True), strict=True))
    return {p: known[p][1] for p, t in texts.items() if p in known and known[p][0] == t}
