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
