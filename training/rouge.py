"""ROUGE-L (Lin 2004, sec. 3): the longest common subsequence of a prediction and a reference.

Tokens as google-research's rouge-score (the scorer papers report with) makes them by default:
lower-cased, every run of characters other than a-z and 0-9 a separator, no stemming. Recall is
LCS / reference length, precision LCS / prediction length, F their harmonic mean (beta 1, as
rouge-score's fmeasure). Written by hand so the run scripts need no nltk (rouge-score imports it);
tests/test_rouge.py checks parity with rouge-score and hand-computed cases.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return _NON_ALNUM.sub(" ", text.lower()).split()


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence: the O(len(a) * len(b)) dynamic programme, one
    row at a time."""
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


@dataclasses.dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    fmeasure: float


def rouge_l(prediction: str, reference: str) -> Score:
    """ROUGE-L of one prediction against one reference; 0 when either has no token."""
    p, r = tokenize(prediction), tokenize(reference)
    if not p or not r:
        return Score(0.0, 0.0, 0.0)
    lcs = lcs_length(p, r)
    precision, recall = lcs / len(p), lcs / len(r)
    f = 0.0 if lcs == 0 else 2 * precision * recall / (precision + recall)
    return Score(precision, recall, f)


def mean_rouge_l(predictions: Sequence[str], references: Sequence[str]) -> float:
    """The mean ROUGE-L F over pairs (rouge-score's per-example scores, averaged)."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(
            f"expected as many predictions as references (at least one), found "
            f"{len(predictions)} and {len(references)}"
        )
    return sum(rouge_l(p, r).fmeasure for p, r in zip(predictions, references)) / len(predictions)
