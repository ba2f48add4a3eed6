"""Permutation language-model inputs (XLNet, Yang et al. 2019): a sampled factorisation order per
block, the masks it implies, and the partial-prediction targets.

For each block of ids a permutation z of its positions is drawn uniformly. Position i may read
the content of position j when j comes before i in z (rank[j] < rank[i]); that is `perm_mask`,
with XLNet's meaning (1 = i may NOT see j). The model derives its two streams from it
(modeling/xlnet.attention_masks): the query stream uses it as is, so it never sees its own
token; the content stream may also see itself.

Partial prediction (sec. 2.3): only the last tokens of z are predicted, the first c act as
context only; the paper sets K = |z| / (|z| - c) (K = 6 for XLNet-Large, Appendix A), i.e.
predicts about |z| / K tokens of each block: num_predict_for_k(). K = 1 predicts every token
(the first one of z from its position alone); num_predict = 1 predicts only the last one of z.

Left out: span-based prediction (the release predicts whole n-gram spans, sec. A.1) and the
release's choice of letting context tokens see each other bidirectionally; here every position,
context or target, follows z strictly.

  num_predict_for_k       the paper's K -> tokens predicted per block
  permutation_lm_features a batch of blocks + a stateless seed -> model inputs and targets
  permutation_lm_dataset  LM blocks from data_prep/create_lm_data.py -> those, seeded per batch
Shapes: B batch, S block length, P predicted positions per block.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from data_prep import lm_data


def num_predict_for_k(length: int, k: float) -> int:
    """Tokens predicted per block of `length` under the paper's K = |z| / (|z| - c): the nearest
    integer to length / K, at least 1. Raises ValueError for K < 1."""
    if not k >= 1:
        raise ValueError(f"partial prediction K: expected K >= 1 (K = 1 predicts all), found {k}")
    return max(1, int(round(length / k)))


def permutation_lm_features(input_ids, seed, num_predict: int) -> dict:
    """Samples one factorisation order per block and builds the model inputs and targets.

    Pure: the same ids and seed give the same output (stateless random ops), so it can run in
    tf.data and a resumed run redraws what an uninterrupted one drew.
    Args:
      input_ids: int (B, S) blocks.
      seed: int (2,), a stateless seed (tf.random.stateless_uniform's).
      num_predict: P, how many positions of each block are predicted (the last P of its order).
    Returns a dict:
      input_ids int32 (B, S), unchanged;
      perm_mask float32 (B, S, S), [b, i, j] = 1 where j is not before i in the order
        (its diagonal is all 1);
      target_mapping float32 (B, P, S), one-hot rows: the predicted positions, ascending;
      target_ids int32 (B, P), the tokens at those positions; target_weights float32 (B, P), 1.
    """
    ids = tf.cast(tf.convert_to_tensor(input_ids), tf.int32)
    shape = tf.shape(ids)
    s = ids.shape[1] if ids.shape[1] is not None else shape[1]
    if isinstance(s, int) and not 1 <= num_predict <= s:
        raise ValueError(f"num_predict: expected 1 .. {s} (the block length), found {num_predict}")
    # A uniform random permutation per row: the argsort of i.i.d. uniform keys.
    keys = tf.random.stateless_uniform(shape, seed=tf.cast(seed, tf.int64))
    order = tf.argsort(keys, axis=1, stable=True)  # (B, S): order[b, t] = position at step t
    rank = tf.argsort(order, axis=1, stable=True)  # (B, S): rank[b, i] = step of position i
    before = rank[:, None, :] < rank[:, :, None]  # (B, S, S): [b, i, j] j precedes i
    perm_mask = 1.0 - tf.cast(before, tf.float32)
    targets = tf.sort(order[:, s - num_predict :], axis=1)  # (B, P) the last P steps' positions
    return {
        "input_ids": ids,
        "perm_mask": perm_mask,
        "target_mapping": tf.one_hot(targets, s, dtype=tf.float32),
        "target_ids": tf.gather(ids, targets, batch_dims=1),
        "target_weights": tf.ones(tf.shape(targets), tf.float32),
    }


def permutation_lm_dataset(
    files: Sequence[str],
    batch_size: int,
    block_size: int,
    num_predict: int,
    is_training: bool,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
) -> tf.data.Dataset:
    """lm_data.lm_dataset's batches with permutation_lm_features applied; batch n of shard k
    draws its orders with the stateless seed (seed, n * num_shards + k), so evaluation sees the
    same orders every time, workers draw different ones, and a training iterator restored from a
    checkpoint continues the same sequence."""
    if not 1 <= num_predict <= block_size:
        raise ValueError(
            f"num_predict: expected 1 .. {block_size} (the block size), found {num_predict}"
        )
    blocks = lm_data.lm_dataset(
        files, batch_size, block_size, is_training, seed, num_shards, shard_index
    )

    def features(n, batch):
        draw = tf.cast(n, tf.int64) * num_shards + shard_index
        pair = tf.stack([tf.constant(seed, tf.int64), draw])
        return permutation_lm_features(batch["input_ids"], pair, num_predict)

    return blocks.enumerate().map(features, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
