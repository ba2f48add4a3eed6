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


def runs(mask):
    """(start, length) of each maximal run of True."""
    out, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i - start))
            start = None
    return out


def test_span_targets_start_at_words_within_their_context():
    """With few targets in a long block the walk alone places them: spans of 1-5 tokens, each at
    a word start, apart from each other, lengths near 1 / L, about one in mask_alpha tokens;
    the same seed gives the same targets, another seed others."""
    rng = np.random.default_rng(0)
    word_start = rng.random((30, 1200)) < 0.6
    spans = tf.function(permutation.span_targets)  # traced once: eager map_fn loops are slow
    masks = spans(word_start, 60, [4, 2]).numpy()
    lengths, ends = [], []
    for row, mask in zip(word_start, masks):
        assert mask.sum() == 60
        found = runs(mask)
        assert all(row[start] and 1 <= n <= permutation.MAX_SPAN for start, n in found)
        lengths += [n for _, n in found]
        ends.append(max(start + n for start, n in found))
    share = np.bincount(lengths, minlength=6)[1:] / len(lengths)
    expected = (1 / np.arange(1, 6)) / (1 / np.arange(1, 6)).sum()
    np.testing.assert_allclose(share, expected, atol=0.06)  # 1,800 targets, about 800 spans
    # mask_alpha = 6: a span of L sits in a context of 6 L, so 60 targets take about 360 tokens.
    assert 250 < np.mean(ends) < 500
    np.testing.assert_array_equal(spans(word_start, 60, [4, 2]), masks)
    assert (spans(word_start, 60, [4, 3]).numpy() != masks).any()


def test_span_targets_are_topped_up_to_exactly_p():
    """Asking for more than the walk places (here up to every token) tops up with single
    tokens; a block without word starts gets single tokens only."""
    word_start = np.ones((3, 12), bool)
    for p in (1, 7, 10, 12):
        assert (permutation.span_targets(word_start, p, [p, 0]).numpy().sum(1) == p).all()
    none = permutation.span_targets(np.zeros((2, 12), bool), 5, [1, 1]).numpy()
    assert (none.sum(1) == 5).all()


def test_span_targets_keep_to_the_allowed_positions_and_walk_past_the_others():
    """allowed: no target at a position it forbids, none of the spans covers one (a span that
    would is passed over and the walk goes on: the targets stay near the row's start, where
    top-ups alone would spread over all of it), still exactly p per row."""
    word_start = np.ones((20, 300), bool)
    allowed = np.broadcast_to(np.arange(300) % 5 != 4, (20, 300))
    masks = tf.function(permutation.span_targets)(word_start, 20, [3, 1], allowed=allowed).numpy()
    assert (masks.sum(1) == 20).all() and not masks[~allowed].any()
    found = [run for mask in masks for run in runs(mask)]
    assert max(n for _, n in found) == 4  # spans of up to 4 fit between two forbidden ones
    ends = [max(start + n for start, n in runs(mask)) for mask in masks]
    assert np.mean(ends) < 220, ends


def test_span_masks_let_every_position_see_the_context_and_targets_follow_z():
    """With given targets: the targets are exactly them, ascending; a context position is seen
    by every position and sees no target; a target sees the targets before it in z (not
    itself), which is the order the features drew."""
    ids = blocks(batch=4, length=9, seed=2)
    rng = np.random.default_rng(5)
    is_target = np.stack([rng.permutation(9) < 3 for _ in range(4)])
    out = permutation.permutation_lm_features(tf.constant(ids), [7, 1], 3, is_target)
    hidden = out["perm_mask"].numpy().astype(bool)
    rank = np.argsort(np.argsort(tf.random.stateless_uniform((4, 9), [7, 1]).numpy(), axis=1,
                                 kind="stable"), axis=1, kind="stable")  # fmt: skip
    for b in range(4):
        t = is_target[b]
        want = t[None, :] & (~t[:, None] | (rank[b][None, :] >= rank[b][:, None]))
        np.testing.assert_array_equal(hidden[b], want)
        positions = np.flatnonzero(t)
        np.testing.assert_array_equal(out["target_mapping"][b].numpy().argmax(-1), positions)
        np.testing.assert_array_equal(out["target_ids"][b], ids[b, positions])
    # Context columns are all visible; every target's own diagonal entry is hidden.
    assert not hidden[np.broadcast_to(~is_target[:, None, :], hidden.shape)].any()
    assert hidden[:, np.arange(9), np.arange(9)][is_target].all()


def test_span_dataset_is_repeatable_and_counts_p_targets(tmp_path):
    path = str(tmp_path / "lm.tfrecord")
    written = [np.arange(i, i + 16, dtype="int32") % 31 for i in range(4)]
    lm_data.write_lm_tfrecords(written, [path])
    starts = np.arange(31) % 3 != 1

    def first_pass(seed=3):
        ds = permutation.permutation_lm_dataset(
            [path], 2, 16, 5, is_training=False, seed=seed, word_starts=starts
        )
        return [{k: v.numpy() for k, v in batch.items()} for batch in ds]

    a, b, other = first_pass(), first_pass(), first_pass(seed=4)
    for x, y in zip(a, b):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert a[0]["target_mapping"].shape == (2, 5, 16)
    assert (a[0]["target_mapping"].sum(axis=(1, 2)) == 5).all()
    assert any((x["target_mapping"] != y["target_mapping"]).any() for x, y in zip(a, other))
    # Batch 1 drew its spans with the seed (3, 1), as span_targets does directly.
    want = permutation.span_targets(starts[a[1]["input_ids"]], 5, [3, 1]).numpy()
    for row, mask in enumerate(want):
        np.testing.assert_array_equal(a[1]["target_mapping"][row].argmax(-1), np.flatnonzero(mask))


def test_word_start_tables_of_the_three_vocabulary_kinds(tmp_path):
    import json

    from data_prep import spiece
    from tests.conftest import ROOT

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\n,\n")
    assert permutation.word_start_table(vocab).tolist() == [True] * 6 + [False, True]
    bpe_dir = tmp_path / "bpe"
    bpe_dir.mkdir()
    (bpe_dir / "vocab.json").write_text(json.dumps({"Ġthe": 0, "cat": 1, ",": 2, "s": 3}))
    (bpe_dir / "merges.txt").write_text("#version: 0.2\n")
    assert permutation.word_start_table(bpe_dir).tolist() == [True, False, True, False]
    model = ROOT / "tests" / "fixtures" / "xlnet_tiny" / "spiece.model"
    table = permutation.word_start_table(model)
    pieces = spiece.SentencePieceTokenizer(model).vocab
    assert 0 < table.sum() < len(table)  # some pieces begin a word, some continue one
    assert all(table[i] == (p.startswith(("▁", "<")) or p in ",.!?;:") for p, i in pieces.items()
               if p.startswith("▁") or p.isalpha())  # fmt: skip
