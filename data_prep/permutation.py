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

Span-based prediction (sec. A.1, as XLNet's release trains; run_pretraining's
--xlnet_span_prediction): the targets are spans of 1 to 5 tokens (length L drawn with
probability proportional to 1 / L), each starting at a word and chosen within a context of
L * mask_alpha / mask_beta tokens (XLNet's mask_alpha 6, mask_beta 1: about one token in six),
topped up with single tokens to P. Then, as the release's permutation, the context tokens see
each other and are seen by every position, while a target sees the context and the targets
before it in z (and no context token sees a target). Without it, every position, context or
target, follows z strictly.

Two-segment records (data_prep/xlnet_data.py, create_lm_data.py --reuse_len): as the release's
parser, P - P // 2 targets are drawn among the reused part's positions and P // 2 among the
rest's, never at <sep> or <cls> (with span prediction: spans, each part walked on its own, as
the release samples them); the targets follow z and the other tokens are context (as with
spans); and no position of the reused part sees one after it, so the states a model with memory
caches there hold nothing of the text the next record predicts. The release also orders <sep>
and <cls> in z as targets without a loss; here they are context, seen by all (they carry no
token to leak).

  num_predict_for_k       the paper's K -> tokens predicted per block
  word_start_table        a vocabulary -> which of its tokens begin a word
  span_targets            a batch's span targets, from a stateless seed
  permutation_lm_features a batch of blocks + a stateless seed -> model inputs and targets
  two_segment_features    the same for two-segment records, with their segment ids
  permutation_lm_dataset  LM blocks from data_prep/create_lm_data.py -> those, seeded per batch
Shapes: B batch, S block length, P predicted positions per block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from data_prep import lm_data, xlnet_data

# Span-based prediction: lengths 1 .. MAX_SPAN tokens, drawn with probability proportional to
# 1 / length (XLNet's release, max_gram 5).
MAX_SPAN = 5


def fold(seed, data: int):
    """A stateless seed derived from `seed` (int64 (2,)) and `data`."""
    return tf.random.experimental.stateless_fold_in(seed, data)


def num_predict_for_k(length: int, k: float) -> int:
    """Tokens predicted per block of `length` under the paper's K = |z| / (|z| - c): the nearest
    integer to length / K, at least 1. Raises ValueError for K < 1."""
    if not k >= 1:
        raise ValueError(f"partial prediction K: expected K >= 1 (K = 1 predicts all), found {k}")
    return max(1, int(round(length / k)))


def word_start_table(vocab_file) -> np.ndarray:
    """bool (V,): which tokens of the vocabulary --vocab_file names begin a word, for span
    targets. A byte-level BPE folder (GPT-2's encoder.json or vocab.json): tokens with a leading
    space ("Ġ") or not starting with a letter or digit; a SentencePiece model (or a folder with
    spiece.model): XLNet's rule (pretraining_data.spiece_word_start); a WordPiece vocab.txt:
    tokens without "##". Raises InputError naming the file."""
    from data_prep import bpe, pretraining_data, spiece, tokenization

    if files := bpe.folder_files(vocab_file):
        encoder = bpe.read_encoder(files[0])
        starts = {t: t.startswith(bpe.BYTE_TO_CHAR[32]) or not t[:1].isalnum() for t in encoder}
        ids = encoder
    elif model := spiece.model_file(vocab_file):
        pieces = spiece.SentencePieceTokenizer(model, False)
        ids = pieces.vocab
        starts = {t: pretraining_data.spiece_word_start(t) for t in ids}
    else:
        ids = tokenization.load_vocab(vocab_file)
        starts = {t: not t.startswith(tokenization.SUFFIX_INDICATOR) for t in ids}
    table = np.zeros(max(ids.values()) + 1, bool)
    for token, i in ids.items():
        table[i] = starts[token]
    return table


def span_targets(
    word_start,
    num_predict: int,
    seed,
    mask_alpha: int = 6,
    mask_beta: int = 1,
    allowed=None,
    backward=None,
):
    """bool (B, S): exactly num_predict targets in each row, from span sampling over the rows'
    word starts (word_start bool (B, S): True where a token begins a word). Each row walks its
    block left to right: draw a span length L in 1 .. MAX_SPAN (probability proportional to 1 / L,
    at most the targets still wanted), take a context of C = max(1, L * mask_alpha // mask_beta)
    tokens, start the span at a random offset below C moved on to the next word start, mark its
    L tokens and skip the rest of the context; a span that would reach the block's end stops the
    walk, and random single tokens then make up num_predict (XLNet's release, sec. A.1).
    allowed: None, or bool (B, S) with at least num_predict True per row: only those positions
    become targets (a span covering another is passed over and the walk goes on).
    backward: None, or int (B,) 1 for rows whose ids run backward through the text (XLNet's
    bi_data): those are walked turned around, as the release samples them, so their spans too
    start at a word start and cover its word's pieces in reading order.

    Pure TensorFlow with stateless random ops keyed by `seed` (int (2,)), the row and the step:
    the same inputs give the same targets, and it can sit in a tf.data pipeline whose iterator
    is checkpointed (a numpy function there cannot be saved)."""
    word_start = tf.cast(tf.convert_to_tensor(word_start), tf.bool)
    s = tf.shape(word_start)[1]
    positions = tf.range(s)
    seed = tf.cast(seed, tf.int64)
    logits = tf.math.log(1.0 / tf.range(1, MAX_SPAN + 1, dtype=tf.float32))[None]  # (1, 5)
    p = tf.constant(num_predict, tf.int32)

    if allowed is None:
        allowed = tf.ones_like(word_start)
    allowed = tf.cast(tf.convert_to_tensor(allowed), tf.bool)
    flip = None if backward is None else tf.cast(tf.reshape(backward, (-1, 1)), tf.bool)

    def turn(x):  # the backward rows turned around (and back)
        return x if flip is None else tf.where(flip, tf.reverse(x, [1]), x)

    word_start, allowed = turn(word_start), turn(allowed)

    def row(args):
        starts, free, index = args
        key = tf.random.experimental.stateless_fold_in(seed, index)

        def more(cursor, count, mask, step, stop):
            return tf.logical_and(tf.logical_not(stop), tf.logical_and(cursor < s, count < p))

        def span(cursor, count, mask, step, stop):
            draw = tf.random.experimental.stateless_fold_in(key, step)
            n = tf.cast(tf.random.stateless_categorical(logits, 1, draw)[0, 0], tf.int32) + 1
            n = tf.minimum(n, p - count)
            context = tf.maximum(1, n * mask_alpha // mask_beta)
            offset = tf.random.experimental.stateless_fold_in(draw, 1)
            left = tf.random.stateless_uniform([], offset, 0, context, tf.int32)
            candidates = tf.logical_and(tf.logical_and(starts, free), positions >= cursor + left)
            begin = tf.cast(tf.argmax(tf.cast(candidates, tf.int32)), tf.int32)
            inside = tf.logical_and(tf.reduce_any(candidates), begin + n < s)
            covered = tf.logical_and(positions >= begin, positions < begin + n)
            fits = tf.logical_and(inside, tf.reduce_all(tf.logical_or(free, ~covered)))
            mask = tf.where(fits, tf.logical_or(mask, covered), mask)
            count = tf.where(fits, count + n, count)
            cursor = begin + n + context - left
            return cursor, count, mask, step + 1, tf.logical_not(inside)

        zero = tf.constant(0, tf.int32)
        state = (zero, zero, tf.zeros([s], tf.bool), zero, tf.constant(False))
        _, count, mask, _, _ = tf.while_loop(more, span, state)
        # Top up with random free positions: the p - count smallest keys among them.
        top_up = tf.random.experimental.stateless_fold_in(key, 1 << 30)  # no step reaches it
        keys = tf.random.stateless_uniform([s], top_up)
        keys = tf.where(tf.logical_or(mask, ~free), 2.0, keys)
        _, extra = tf.math.top_k(-keys, p - count)
        return tf.logical_or(mask, tf.reduce_any(positions[:, None] == extra[None, :], axis=1))

    rows = tf.range(tf.shape(word_start)[0], dtype=tf.int64)
    out = tf.TensorSpec([None], tf.bool)
    return turn(tf.map_fn(row, (word_start, allowed, rows), fn_output_signature=out))


def permutation_lm_features(input_ids, seed, num_predict: int, is_target=None) -> dict:
    """Samples one factorisation order per block and builds the model inputs and targets.

    Pure: the same ids and seed give the same output (stateless random ops), so it can run in
    tf.data and a resumed run redraws what an uninterrupted one drew.
    Args:
      input_ids: int (B, S) blocks.
      seed: int (2,), a stateless seed (tf.random.stateless_uniform's).
      num_predict: P, how many positions of each block are predicted (the last P of its order).
      is_target: None, or bool (B, S) with P True per row (span_targets): those are the
        predicted positions, and the masks follow the release (see the module docstring).
    Returns a dict:
      input_ids int32 (B, S), unchanged;
      perm_mask float32 (B, S, S), [b, i, j] = 1 where i may not see j: j is not before i in
        the order (its diagonal is all 1); with is_target, j is a target not before i (a
        context i sees no target; the diagonal is 1 at targets);
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
    if is_target is None:
        before = rank[:, None, :] < rank[:, :, None]  # (B, S, S): [b, i, j] j precedes i
        perm_mask = 1.0 - tf.cast(before, tf.float32)
        targets = tf.sort(order[:, s - num_predict :], axis=1)  # (B, P) the last P steps'
    else:
        is_target = tf.cast(is_target, tf.bool)
        # A target's step in z; a context token's is -1, and it may read only what comes
        # before step 0 among the targets: none of them.
        step = tf.where(is_target, rank, -1)
        reads_below = tf.where(is_target, step, 0)  # (B, S): i reads targets with step < this
        hidden = tf.logical_and(is_target[:, None, :], reads_below[:, :, None] <= step[:, None, :])
        perm_mask = tf.cast(hidden, tf.float32)
        targets = tf.reshape(tf.where(is_target)[:, 1], (-1, num_predict))  # row-major: sorted
        targets = tf.cast(targets, tf.int32)
    return {
        "input_ids": ids,
        "perm_mask": perm_mask,
        "target_mapping": tf.one_hot(targets, s, dtype=tf.float32),
        "target_ids": tf.gather(ids, targets, batch_dims=1),
        "target_weights": tf.ones(tf.shape(targets), tf.float32),
    }


def two_segment_targets(
    segment_ids, seed, num_predict: int, reuse_len: int, word_start=None, **span_args
):
    """bool (B, S): num_predict - num_predict // 2 positions drawn uniformly among the first
    reuse_len of each row and num_predict // 2 among the rest, never a functional one (<cls>,
    segment 2, or a <sep>, the last position of segment 0 or 1). seed: int (2,), stateless.
    word_start: None, or bool (B, S) as span_targets': the two parts' targets are spans, each
    part walked on its own (as the release samples the reused part and the rest apart), with
    span_args (mask_alpha, mask_beta, backward) and the seed folded with 0 and 1."""
    seg = tf.cast(segment_ids, tf.int32)
    s = tf.shape(seg)[1]
    functional = tf.logical_or(
        tf.equal(seg, 2),
        tf.concat([tf.not_equal(seg[:, :-1], seg[:, 1:]), tf.zeros_like(seg[:, :1], tf.bool)], 1),
    )
    rest = num_predict // 2
    if word_start is not None:
        seed, free = tf.cast(seed, tf.int64), tf.logical_not(functional)
        word_start = tf.cast(word_start, tf.bool)
        first = span_targets(word_start[:, :reuse_len], num_predict - rest, fold(seed, 0),
                             allowed=free[:, :reuse_len], **span_args)  # fmt: skip
        second = span_targets(word_start[:, reuse_len:], rest, fold(seed, 1),
                              allowed=free[:, reuse_len:], **span_args)  # fmt: skip
        return tf.concat([first, second], axis=1)
    reused = tf.range(s)[None, :] < reuse_len
    keys = tf.random.stateless_uniform(tf.shape(seg), seed=tf.cast(seed, tf.int64))

    def drawn(eligible, k):
        top = tf.math.top_k(tf.where(eligible, keys, -1.0), k).indices  # (B, k)
        return tf.reduce_any(tf.cast(tf.one_hot(top, s), tf.bool), axis=1)

    first = drawn(tf.logical_and(reused, tf.logical_not(functional)), num_predict - rest)
    if not rest:
        return first
    second = drawn(tf.logical_and(tf.logical_not(reused), tf.logical_not(functional)), rest)
    return tf.logical_or(first, second)


def two_segment_features(
    input_ids, segment_ids, seed, num_predict: int, reuse_len: int, word_start=None, **span_args
) -> dict:
    """permutation_lm_features of two-segment records (module docstring), with their int32
    segment_ids (B, S) added. The targets are drawn with a seed folded from `seed`, so they do
    not follow the order's own draw; word_start and span_args: span targets
    (two_segment_targets)."""
    seed = tf.cast(seed, tf.int64)
    is_target = two_segment_targets(
        segment_ids, fold(seed, 1), num_predict, reuse_len, word_start, **span_args
    )
    out = permutation_lm_features(input_ids, seed, num_predict, is_target)
    position = tf.range(tf.shape(out["input_ids"])[1])
    forward = tf.logical_and(position[:, None] < reuse_len, position[None, :] >= reuse_len)
    out["perm_mask"] = tf.maximum(out["perm_mask"], tf.cast(forward, tf.float32)[None])
    out["segment_ids"] = tf.cast(segment_ids, tf.int32)
    return out


def permutation_lm_dataset(
    files: Sequence[str],
    batch_size: int,
    block_size: int,
    num_predict: int,
    is_training: bool,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
    word_starts=None,
    mask_alpha: int = 6,
    mask_beta: int = 1,
    streams: bool = False,
    reuse_len: int = 0,
    bi_data: bool = False,
) -> tf.data.Dataset:
    """lm_data.lm_dataset's batches with permutation_lm_features applied; batch n of shard k
    draws its orders with the stateless seed (seed, n * num_shards + k), so evaluation sees the
    same orders every time, workers draw different ones, and a training iterator restored from a
    checkpoint continues the same sequence. word_starts (word_start_table's, indexed by id):
    span-based targets (span_targets with mask_alpha / mask_beta), drawn with the same pair.
    streams: batches whose rows continue the rows before (lm_data.stream_dataset), for the
    segment memory; training repeats them, evaluation is one pass. reuse_len > 0: the files
    hold two-segment records with that reused part (two_segment_features). bi_data: the files
    hold XLNet's bidirectional data (lm_data.bidirectional): the batches carry `backward` int32
    (B,), for the model and for turning those rows' spans around (span_targets)."""
    if not 1 <= num_predict <= block_size:
        raise ValueError(
            f"num_predict: expected 1 .. {block_size} (the block size), found {num_predict}"
        )
    spec = xlnet_data.feature_spec(block_size) if reuse_len else lm_data.lm_feature_spec(block_size)
    if bi_data:
        spec[lm_data.BACKWARD] = tf.io.FixedLenFeature([1], tf.int64)
    if streams:
        blocks = lm_data.stream_dataset(
            files, batch_size, block_size, num_shards, shard_index, spec, is_training, bi_data
        )
    else:
        blocks = lm_data.lm_dataset(
            files, batch_size, block_size, is_training, seed, num_shards, shard_index, spec
        )
    table = None if word_starts is None else tf.constant(np.asarray(word_starts, bool))

    def features(n, batch):
        draw = tf.cast(n, tf.int64) * num_shards + shard_index
        pair = tf.stack([tf.constant(seed, tf.int64), draw])
        starts = None
        backward = batch[lm_data.BACKWARD][:, 0] if bi_data else None
        if word_starts is not None:
            starts = tf.gather(table, tf.clip_by_value(batch["input_ids"], 0, len(word_starts) - 1))
        if reuse_len:
            out = two_segment_features(
                batch["input_ids"], batch["segment_ids"], pair, num_predict, reuse_len, starts,
                mask_alpha=mask_alpha, mask_beta=mask_beta, backward=backward,
            )  # fmt: skip
        else:
            is_target = None
            if starts is not None:
                is_target = span_targets(
                    starts, num_predict, pair, mask_alpha, mask_beta, backward=backward
                )
            out = permutation_lm_features(batch["input_ids"], pair, num_predict, is_target)
        return out if backward is None else out | {lm_data.BACKWARD: backward}

    return blocks.enumerate().map(features, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
