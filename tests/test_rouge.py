"""ROUGE-L against hand-computed cases and google-research's rouge-score."""

import numpy as np
import pytest
from rouge_score import rouge_scorer

from training import rouge


def test_hand_computed_cases():
    # LCS of "the cat sat on the mat" / "the cat was on a mat": the cat on mat = 4 of 6 and 6.
    s = rouge.rouge_l("the cat sat on the mat", "the cat was on a mat")
    assert (s.precision, s.recall, s.fmeasure) == pytest.approx((4 / 6, 4 / 6, 4 / 6))
    # Prediction 2 tokens, reference 4, LCS 2: P 1, R 1/2, F 2/3.
    s = rouge.rouge_l("police killed", "police killed the gunman")
    assert (s.precision, s.recall, s.fmeasure) == pytest.approx((1.0, 0.5, 2 / 3))
    # Order matters for a subsequence: "b a" vs "a b" share one token in order.
    assert rouge.rouge_l("b a", "a b").fmeasure == pytest.approx(0.5)
    assert rouge.rouge_l("Hello, World!", "hello world").fmeasure == 1.0
    assert rouge.rouge_l("", "x").fmeasure == 0.0
    assert rouge.rouge_l("a", "b").fmeasure == 0.0
    assert rouge.lcs_length("ABCBDAB", "BDCABA") == 4  # the textbook example (CLRS 15.4)
    assert rouge.mean_rouge_l(["a b", "c"], ["a b", "d"]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="as many predictions"):
        rouge.mean_rouge_l(["a"], [])


def test_parity_with_rouge_score_on_random_texts():
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rng = np.random.default_rng(0)
    words = ["the", "cat", "Sat", "on", "mat,", "a", "dog's", "42", "x-ray", "!"]
    for _ in range(200):
        p = " ".join(rng.choice(words, rng.integers(0, 12)))
        r = " ".join(rng.choice(words, rng.integers(0, 12)))
        want = scorer.score(r, p)["rougeL"]  # rouge-score takes (target, prediction)
        got = rouge.rouge_l(p, r)
        assert (got.precision, got.recall, got.fmeasure) == pytest.approx(
            (want.precision, want.recall, want.fmeasure), abs=1e-12
        ), (p, r)
