"""Permutation-LM features: the mask is a strict total order, targets are the last of it,
sampling is seeded and covers every order, degenerate K, and the tf.data pipeline over LM
blocks."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from data_prep import lm_data, permutation


def blocks(batch=3, length=7, seed=0):
    return np.random.default_rng(seed).integers(0, 50, (batch, length)).astype("int32")


def order_of(perm_mask):
    """Each row's factorisation order recovered from perm_mask: position i's step is how many
    positions it may see."""
    rank = (1 - np.asarray(perm_mask)).sum(-1).astype(int)  # (B, S)
    return np.argsort(rank, axis=1), rank


def test_the_mask_is_the_sampled_order():
    x = blocks()
    f = permutation.permutation_lm_features(x, [3, 1], num_predict=2)
    mask = np.asarray(f["perm_mask"])
    order, rank = order_of(mask)
    for b in range(3):
        # The steps are a permutation of 0..S-1 (a strict total order: no ties, no cycles) ...
        assert sorted(rank[b]) == list(range(7))
        # ... and i may see j exactly when j comes before i in it.
        for i, j in itertools.product(range(7), repeat=2):
            assert mask[b, i, j] == (0.0 if rank[b, j] < rank[b, i] else 1.0)
    assert (np.diagonal(mask, axis1=1, axis2=2) == 1).all()  # nobody sees itself here
    np.testing.assert_array_equal(f["input_ids"], x)


def test_targets_are_the_last_of_the_order():
    x = blocks(seed=4)
    f = permutation.permutation_lm_features(x, [9, 9], num_predict=3)
    order, rank = order_of(f["perm_mask"])
    mapping = np.asarray(f["target_mapping"])
    assert mapping.shape == (3, 3, 7) and (mapping.sum(-1) == 1).all()
    positions = mapping.argmax(-1)  # (B, P)
    np.testing.assert_array_equal(positions, np.sort(order[:, -3:], axis=1))
    np.testing.assert_array_equal(f["target_ids"], np.take_along_axis(x, positions, 1))
    np.testing.assert_array_equal(f["target_weights"], np.ones((3, 3)))
    assert (np.take_along_axis(rank, positions, 1) >= 4).all()


def test_degenerate_k_predicts_all_or_one():
    assert permutation.num_predict_for_k(128, 6) == 21  # the paper's K = 6
    assert permutation.num_predict_for_k(7, 1) == 7
    assert permutation.num_predict_for_k(7, 7) == 1 and permutation.num_predict_for_k(7, 50) == 1
    with pytest.raises(ValueError, match="K >= 1"):
        permutation.num_predict_for_k(7, 0.5)
    x = blocks()
    every = permutation.permutation_lm_features(x, [1, 1], num_predict=7)
    np.testing.assert_array_equal(np.asarray(every["target_mapping"]).argmax(-1), [range(7)] * 3)
    one = permutation.permutation_lm_features(x, [1, 1], num_predict=1)
    _, rank = order_of(one["perm_mask"])
    position = np.asarray(one["target_mapping"])[:, 0].argmax(-1)
    np.testing.assert_array_equal(rank[np.arange(3), position], [6, 6, 6])  # sees all others
    with pytest.raises(ValueError, match="num_predict: expected 1 .. 7"):
        permutation.permutation_lm_features(x, [1, 1], num_predict=8)


def test_sampling_is_seeded_and_reaches_every_order():
    x = blocks()
    a = permutation.permutation_lm_features(x, [5, 6], 3)
    b = permutation.permutation_lm_features(x, [5, 6], 3)
    c = permutation.permutation_lm_features(x, [5, 7], 3)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["perm_mask"], c["perm_mask"])
    # All 3! orders of a 3-token block appear over 300 draws, each about 1/6 of the time.
    seen = {}
    for s in range(30):
        f = permutation.permutation_lm_features(np.zeros((10, 3), "int32"), [s, 0], 1)
        for row in order_of(f["perm_mask"])[0]:
            seen[tuple(row)] = seen.get(tuple(row), 0) + 1
    assert len(seen) == 6 and min(seen.values()) > 25


def test_dataset_over_lm_blocks_is_repeatable(tmp_path):
    path = str(tmp_path / "lm.tfrecord")
    written = [np.arange(i, i + 9, dtype="int32") % 31 for i in range(5)]
    lm_data.write_lm_tfrecords(written, [path])

    def first_pass():
        ds = permutation.permutation_lm_dataset([path], 2, 9, 4, is_training=False, seed=3)
        return [{k: v.numpy() for k, v in batch.items()} for batch in ds]

    a, b = first_pass(), first_pass()
    assert len(a) == 2 and a[0]["perm_mask"].shape == (2, 9, 9)
    assert a[0]["target_ids"].shape == (2, 4) and a[0]["target_ids"].dtype == np.int32
    for x, y in zip(a, b):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    np.testing.assert_array_equal(a[1]["input_ids"], np.stack(written[2:4]))
    # Batch n draws with seed (3, n): the same as calling the transform directly.
    direct = permutation.permutation_lm_features(tf.constant(a[1]["input_ids"]), [3, 1], 4)
    np.testing.assert_array_equal(direct["perm_mask"], a[1]["perm_mask"])
    with pytest.raises(ValueError, match="num_predict"):
        permutation.permutation_lm_dataset([path], 2, 9, 10, is_training=False)
