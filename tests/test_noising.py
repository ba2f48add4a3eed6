"""Denoising objectives: every corruption is undone exactly, rates and span statistics hold with
fixed seeds, and degenerate cases behave."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep import noising

SENTINELS = list(range(1000, 900, -1))  # T5 counts its sentinels down from the vocabulary's end
MASK = 4


def test_random_segmentation_is_a_positive_split():
    rng = np.random.default_rng(0)
    for n, k in [(10, 1), (10, 10), (17, 5)]:
        parts = noising.random_segmentation(n, k, rng)
        assert sum(parts) == n and len(parts) == k and min(parts) >= 1
    with pytest.raises(ValueError):
        noising.random_segmentation(3, 4, rng)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(5, 800), min_size=2, max_size=300), st.integers(0, 2**32 - 1))
def test_t5_span_corruption_reconstructs_the_original(tokens, seed):
    rng = np.random.default_rng(seed)
    inputs, targets = noising.t5_span_corruption(tokens, SENTINELS, rng)
    assert noising.t5_reconstruct(inputs, targets, SENTINELS) == tokens
    spans = [t for t in inputs if t in SENTINELS]
    assert spans == SENTINELS[: len(spans)]  # sentinels in order, one per span
    assert [t for t in targets if t in SENTINELS] == spans
    hidden = len(targets) - len(spans)
    assert hidden == min(max(round(len(tokens) * 0.15), 1), len(tokens) - 1)


def test_t5_noise_statistics_on_long_text():
    rng = np.random.default_rng(7)
    tokens = list(range(5, 505))  # 500 tokens: 75 noise tokens in round(75 / 3) = 25 spans
    inputs, targets = noising.t5_span_corruption(tokens, SENTINELS, rng)
    assert len(targets) == 75 + 25 and len(inputs) == 425 + 25
    assert inputs[0] == 5  # first kept span is non-empty, so the input opens with text
    same = noising.t5_span_corruption(tokens, SENTINELS, np.random.default_rng(7))
    assert same == (inputs, targets)
    with pytest.raises(ValueError, match="sentinels"):
        noising.t5_span_corruption(tokens, SENTINELS[:3], np.random.default_rng(0))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(5, 800), min_size=0, max_size=200), st.integers(0, 2**32 - 1))
def test_bart_text_infilling_reconstructs_the_original(tokens, seed):
    rng = np.random.default_rng(seed)
    noised, spans = noising.bart_text_infilling(tokens, MASK, rng)
    assert noised.count(MASK) == len(spans)  # one mask per span, length-0 spans too
    assert noising.bart_reconstruct(noised, spans, tokens, MASK) == tokens
    assert sum(length for _, length in spans) <= round(len(tokens) * 0.3)
    # No two spans touch: a kept token separates every pair, so no two masks are adjacent.
    assert all(s1 + n1 < s2 for (s1, n1), (s2, _) in zip(spans, spans[1:]))
    assert all(a != MASK or b != MASK for a, b in zip(noised, noised[1:]))


def test_bart_infilling_statistics_and_degenerate_rates():
    tokens = list(range(10, 2010))
    noised, spans = noising.bart_text_infilling(tokens, MASK, np.random.default_rng(3))
    masked = sum(n for _, n in spans)
    assert masked == 600  # 30% of 2,000, the last span cut to the budget
    lengths = [n for _, n in spans][:-1]
    assert 2.5 < np.mean(lengths) < 3.5  # Poisson(3)
    assert any(n == 0 for n in lengths)  # insertions happen (P(0) = e^-3, about 5%)
    none, spans0 = noising.bart_text_infilling(tokens, MASK, np.random.default_rng(0), 0.0)
    assert none == tokens and spans0 == []


def test_sentence_permutation_is_a_seeded_permutation():
    sents = [[1, 2], [3], [4, 5, 6], [7]]
    out, order = noising.permute_sentences(sents, np.random.default_rng(5))
    assert sorted(order) == [0, 1, 2, 3] and out == [sents[i] for i in order]
    assert noising.permute_sentences(sents, np.random.default_rng(5)) == (out, order)
