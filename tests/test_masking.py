"""Tests for data_prep/masking.py: n-gram and span masking (exact at degenerate rates, distributions
over fixed seeds) and stateless dynamic masking (exact at degenerate rates, frequencies, and the
same masks after an input-pipeline resume)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from data_prep import features, masking
from data_prep.pretraining_data import MaskingVocab
from tests.test_pretraining_data import CLS, FIRST_CONTINUATION, MASK, MVOCAB, SEP, VOCAB

# ---------------------------------------------------------------------------------------------
# Static n-gram and span masking


def sequence(num_words, seed=0, pieces=0):
    """[CLS] words [SEP] words [SEP]; word starts < FIRST_CONTINUATION, "##" pieces above."""
    rng = random.Random(seed)
    ids = [CLS]
    for k in range(num_words):
        if k == num_words // 2:
            ids.append(SEP)
        ids.append(rng.randrange(10, FIRST_CONTINUATION))
        ids += [rng.randrange(FIRST_CONTINUATION, 1000) for _ in range(rng.randint(0, pieces))]
    return ids + [SEP]


def test_word_groups_never_cross_a_separator():
    ids = [CLS, 10, 700, 701, 11, SEP, 702, 12, 703, SEP]
    # The "##" piece right after [SEP] (B truncated mid-word) is a word of its own.
    assert masking.word_groups(ids, MVOCAB) == [[1, 2, 3], [4], [6], [7, 8]]


def test_geometric_span_lengths_follow_geo_02_limited_to_10():
    rng = random.Random(0)
    lengths = Counter(masking.geometric_span_length(rng, 0.2, 10) for _ in range(40_000))
    n = sum(lengths.values())
    assert set(lengths) == set(range(1, 11))
    z = 1 - 0.8**10  # the mass of 1..10, renormalised
    for k in range(1, 11):
        assert abs(lengths[k] / n - 0.2 * 0.8 ** (k - 1) / z) < 0.01, k
    mean = sum(k * c for k, c in lengths.items()) / n
    assert abs(mean - 3.8) < 0.05  # SpanBERT sec. 3.1: "mean span length 3.8"
    assert masking.geometric_span_length(rng, 1.0, 10) == 1


@pytest.mark.parametrize("scheme", ["span", "ngram"])
def test_rate_one_masks_every_word_and_rate_zero_one_token(scheme):
    ids = sequence(23, seed=1, pieces=2)
    n = len(ids)
    out, positions, labels, left, right = masking.create_span_masked_lm_predictions(
        ids, 1.0, n, MVOCAB, random.Random(3), scheme
    )
    assert positions == [i for i, t in enumerate(ids) if t not in (CLS, SEP)]
    assert labels == [ids[p] for p in positions]
    # masked_lm_prob 0 predicts max(1, 0) = 1 token: a one-piece word, never a piece of one.
    for seed in range(20):
        out, positions, labels, _, _ = masking.create_span_masked_lm_predictions(
            ids, 0.0, n, MVOCAB, random.Random(seed), scheme
        )
        (p,) = positions
        assert [p] in masking.word_groups(ids, MVOCAB)
        assert [i for i, (a, b) in enumerate(zip(ids, out)) if a != b] in ([], [p])


@pytest.mark.parametrize("scheme", ["span", "ngram"])
def test_spans_are_whole_words_inside_a_segment_and_within_budget(scheme):
    for seed in range(60):
        ids = sequence(40, seed=seed, pieces=2)
        prob, cap = (0.15, 0.4, 0.9)[seed % 3], (5, 20, 200)[seed % 3]
        budget = min(cap, max(1, round(len(ids) * prob)))
        words = masking.word_groups(ids, MVOCAB)
        spans = (masking.choose_spans if scheme == "span" else masking.choose_ngram_spans)(
            words, budget, random.Random(seed)
        )
        chosen = [p for s in spans for p in s]
        assert len(chosen) == len(set(chosen)) <= budget
        starts = {w[0] for w in words}
        for span in spans:
            assert span == list(range(span[0], span[-1] + 1))  # adjacent positions
            assert span[0] in starts and (span[-1] + 1 in starts or ids[span[-1] + 1] == SEP)
            assert not {ids[p] for p in span} & {CLS, SEP}
            if scheme == "ngram":
                assert sum(1 for p in span if p in starts) <= masking.NGRAM_MAX_WORDS


def test_span_masking_replaces_whole_spans_alike_and_records_boundaries():
    kinds = Counter()
    for seed in range(200):
        ids = sequence(60, seed=seed, pieces=1)
        out, positions, labels, left, right = masking.create_span_masked_lm_predictions(
            ids, 0.15, 40, MVOCAB, random.Random(seed), "span"
        )
        assert labels == [ids[p] for p in positions]
        spans: dict = {}
        for p, lo, hi in zip(positions, left, right):
            assert 0 <= lo < p < hi < len(ids)
            spans.setdefault((lo, hi), []).append(p)
        for (lo, hi), members in spans.items():
            assert members == list(range(lo + 1, hi))  # the span is exactly (lo, hi)
            if len(members) < 2:
                continue
            # One decision per span (SpanBERT sec. 3.1): per-token decisions would leave a
            # 3-token span all [MASK] only 0.8 ** 3 = 51% of the time.
            if all(out[p] == MASK for p in members):
                kinds["mask"] += 1
            elif all(out[p] == ids[p] for p in members):
                kinds["keep"] += 1
            else:
                kinds["random"] += 1
    total = sum(kinds.values())
    assert total > 500
    assert abs(kinds["mask"] / total - 0.8) < 0.04
    assert abs(kinds["random"] / total - 0.1) < 0.03


def test_span_lengths_in_words_keep_the_geometric_mean():
    lengths = []
    for seed in range(150):
        words = [[i] for i in range(1, 400)]  # one long segment of one-piece words
        spans = masking.choose_spans(words, 60, random.Random(seed))
        lengths += [len(s) for s in spans]
    # Cut spans (at the budget or an earlier span) shorten a few; most keep Geo(0.2)'s 3.8.
    assert 3.3 < np.mean(lengths) < 3.9
    assert max(lengths) == 10


def test_ngram_sizes_follow_one_over_n():
    sizes = Counter()
    for seed in range(300):
        words = [[i] for i in range(1, 300)]
        spans = masking.choose_ngram_spans(words, 45, random.Random(seed))
        sizes.update(len(s) for s in spans[:8])  # early picks: no budget or neighbour cuts
    n = sum(sizes.values())
    for k, want in ((1, 6 / 11), (2, 3 / 11), (3, 2 / 11)):
        assert abs(sizes[k] / n - want) < 0.03, (k, sizes)


def test_span_masking_same_seed_same_output():
    ids = sequence(50, seed=4, pieces=2)
    a, b, c = (
        masking.create_span_masked_lm_predictions(ids, 0.15, 20, MVOCAB, random.Random(s), "span")
        for s in (1, 1, 2)
    )
    assert a == b and a != c


# ---------------------------------------------------------------------------------------------
# Dynamic masking

PAD = 0
SPEC = masking.DynamicMasking(
    masked_lm_prob=0.15,
    max_predictions_per_seq=5,
    mask_id=MASK,
    vocab_size=len(VOCAB),
    special_ids=(PAD, CLS, SEP),
)


def batch_of(lengths, s=11, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), s), "int32")
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(10, 900, size=n)
        ids[row, 0], ids[row, n // 2], ids[row, n - 1] = CLS, SEP, SEP
    return ids, (ids > 0).astype("int32")


def test_dynamic_rate_one_predicts_every_real_token_in_order():
    ids, mask = batch_of([11, 7, 4])
    spec = masking.DynamicMasking(1.0, 11, MASK, len(VOCAB), (PAD, CLS, SEP))
    out = {k: v.numpy() for k, v in masking.mask_dynamic(ids, mask, [3, 4], spec).items()}
    for row in range(3):
        want = [i for i, t in enumerate(ids[row]) if t not in (PAD, CLS, SEP)]
        k = len(want)
        assert out["masked_lm_positions"][row].tolist() == want + [0] * (11 - k)
        assert out["masked_lm_ids"][row].tolist() == [ids[row, i] for i in want] + [0] * (11 - k)
        assert out["masked_lm_weights"][row].tolist() == [1.0] * k + [0.0] * (11 - k)
        unchanged = [i for i in range(11) if i not in want]
        assert (out["input_ids"][row, unchanged] == ids[row, unchanged]).all()


def test_dynamic_rate_zero_predicts_one_token_and_counts_round_half_even():
    ids, mask = batch_of([11, 7, 5])
    zero = masking.DynamicMasking(0.0, 5, MASK, len(VOCAB), (PAD, CLS, SEP))
    out = masking.mask_dynamic(ids, mask, [0, 0], zero)
    assert out["masked_lm_weights"].numpy().sum(axis=1).tolist() == [1, 1, 1]
    half = masking.DynamicMasking(0.5, 5, MASK, len(VOCAB), (PAD, CLS, SEP))
    out = masking.mask_dynamic(ids, mask, [0, 0], half)
    # round(11 * .5) = 6 -> capped at P = 5; round(3.5) = 4 but only 4 candidates; round(2.5) = 2.
    assert out["masked_lm_weights"].numpy().sum(axis=1).tolist() == [5, 4, 2]


def test_dynamic_80_10_10_frequencies_and_specials_never_chosen():
    ids, mask = batch_of([11] * 400 + [6] * 200, seed=1)
    spec = masking.DynamicMasking(0.5, 11, MASK, len(VOCAB), (PAD, CLS, SEP))
    out = {k: v.numpy() for k, v in masking.mask_dynamic(ids, mask, [7, 8], spec).items()}
    weights = out["masked_lm_weights"].astype(bool)
    pos = out["masked_lm_positions"]
    rows = np.nonzero(weights)[0]
    original = ids[rows, pos[weights]]
    assert not np.isin(original, [PAD, CLS, SEP]).any()
    now = out["input_ids"][rows, pos[weights]]
    n = len(now)
    assert n > 2000
    assert abs(np.mean(now == MASK) - 0.8) < 0.03
    assert abs(np.mean(now == original) - 0.1) < 0.02  # (a random id hits the original ~never)
    changed = out["input_ids"] != ids
    for row in range(len(ids)):  # only predicted positions change
        assert set(np.nonzero(changed[row])[0]) <= set(pos[row][weights[row]])


def test_dynamic_masks_are_a_function_of_the_seed():
    ids, mask = batch_of([11, 9, 8], seed=2)

    def masks(seed):
        return masking.mask_dynamic(ids, mask, seed, SPEC)["masked_lm_positions"].numpy()

    assert (masks([1, 5]) == masks([1, 5])).all()
    assert any((masks([1, 5]) != masks([1, k])).any() for k in (6, 7))


def write_unmasked(path, rows, s):
    with tf.io.TFRecordWriter(str(path)) as w:
        for ids in rows:
            w.write(features.serialize_packed_example(ids, [0] * len(ids), 0, s))


def unmask(batch) -> np.ndarray:
    """The ids before masking: the labels put back at the predicted positions."""
    ids = batch["input_ids"].numpy().copy()
    for row, (pos, labels, w) in enumerate(
        zip(batch["masked_lm_positions"], batch["masked_lm_ids"], batch["masked_lm_weights"])
    ):
        real = w.numpy() > 0
        ids[row, pos.numpy()[real]] = labels.numpy()[real]
    return ids


def test_pipeline_masks_each_epoch_anew_and_resumes_with_the_same_masks(tmp_path):
    rng = np.random.default_rng(0)
    rows = [[CLS, *rng.integers(10, 900, size=7).tolist(), SEP] for _ in range(3)]
    path = tmp_path / "packed.tfrecord"
    write_unmasked(path, rows, 11)

    def dataset():
        return features.pretraining_dataset(
            [str(path)], 3, 11, 5, is_training=True, seed=9, dynamic_masking=SPEC
        )

    it = iter(dataset())
    first = [next(it) for _ in range(2)]
    saved = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt"))
    after = [next(it) for _ in range(4)]
    seen: dict = {}
    for index, batch in enumerate(first + after):
        # Batch i is mask_dynamic of its unmasked rows with seed (run seed, i).
        original = unmask(batch)
        want = masking.mask_dynamic(original, batch["input_mask"], [9, index], SPEC)
        for key, value in want.items():
            np.testing.assert_array_equal(batch[key].numpy(), value.numpy())
        for ids, positions in zip(original, batch["masked_lm_positions"].numpy()):
            seen.setdefault(tuple(ids), set()).add(tuple(positions))
    # Each of the 3 sequences came back in later epochs with other masks.
    assert len(seen) == 3 and all(len(masks) > 1 for masks in seen.values())
    # A restored iterator continues with exactly the masks the uninterrupted one drew.
    fresh = iter(dataset())
    tf.train.Checkpoint(iterator=fresh).restore(saved)
    for want_batch in after:
        got = next(fresh)
        for key in want_batch:
            np.testing.assert_array_equal(got[key].numpy(), want_batch[key].numpy())
    assert set(first[0]) == set(features.PACKED_FEATURES) | {
        "masked_lm_positions",
        "masked_lm_ids",
        "masked_lm_weights",
    }


def test_masking_vocab_gives_the_dynamic_ids():
    v = MaskingVocab.from_vocab(VOCAB)
    assert (v.mask_id, v.cls_id, v.sep_id) == (MASK, CLS, SEP)
