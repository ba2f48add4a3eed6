"""Masking schemes beyond BERT's single tokens, and dynamic masking inside the tf.data pipeline.

Static schemes, chosen when the TFRecords are written (pure Python, one `random.Random`):
  "ngram"  ALBERT's n-gram masking (Lan et al. 2020, sec. 4.1, after Joshi et al.): from a random
           word, an n-gram of n <= 3 whole words with p(n) proportional to 1/n; 80/10/10 per token.
  "span"   SpanBERT's span masking (Joshi et al. 2020, sec. 3.1): span lengths in whole words from
           Geo(p=0.2) limited to 10, a uniformly random word start, until the budget of
           masked_lm_prob of the tokens is spent; 80/10/10 per *span*. Each prediction also gets
           its span's boundary positions s - 1 and e + 1 for the span boundary objective.
(BERT's "token" and "whole_word" schemes stay in pretraining_data.py, where they reproduce the
original script's output exactly.)

Dynamic masking (RoBERTa, Liu et al. 2019, sec. 4.1): `mask_dynamic` masks a batch of unmasked
sequences with BERT's 80/10/10 each time the batch is drawn, with stateless random ops seeded by
(seed, batch index), so the same run masks the same way after a resume.

Shapes: B batch, S length, P predictions per sequence.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import tensorflow as tf

# SpanBERT sec. 3.1: "l ~ Geo(p = 0.2) ... clip l at l_max = 10 ... mean span length 3.8".
SPAN_GEOMETRIC_P = 0.2
SPAN_MAX_WORDS = 10
# ALBERT sec. 4.1 / its create_pretraining_data.py: n-grams up to 3 words, p(n) ~ 1/n.
NGRAM_MAX_WORDS = 3

STATIC_SCHEMES = ("token", "whole_word", "ngram", "span")


# --------------------------------------------------------------------------------------------
# Static n-gram and span masking (pure Python)


def word_groups(input_ids: Sequence[int], vocab) -> list[list[int]]:
    """Positions grouped into whole words: a piece and the `##` pieces right after it.

    [CLS] and [SEP] belong to no word, and a `##` piece starts a word of its own when the
    position before it is not in a word (B front-truncated mid-word), so every word is a run of
    adjacent positions inside one segment. `vocab`: a pretraining_data.MaskingVocab.
    """
    groups: list[list[int]] = []
    for i, token_id in enumerate(input_ids):
        if token_id == vocab.cls_id or token_id == vocab.sep_id:
            continue
        if groups and vocab.is_continuation[token_id] and groups[-1][-1] == i - 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _adjacent(words: list[list[int]], k: int) -> bool:
    """Whether word k + 1 starts right where word k ends (no [SEP] between them)."""
    return k + 1 < len(words) and words[k + 1][0] == words[k][-1] + 1


def geometric_span_length(rng: random.Random, p: float, max_length: int) -> int:
    """A span length from Geo(p) truncated to {1, ..., max_length} and renormalised:
    P(l) = p (1 - p)^(l - 1) / Z. One rng.random() per draw.

    SpanBERT says "clip", but the mean 3.8 it reports is this distribution's (3.797 at p = 0.2,
    l_max = 10); clipping, i.e. piling the tail onto l_max, would give a mean of 4.46.
    """
    weights = [p * (1.0 - p) ** (k - 1) for k in range(1, max_length + 1)]
    return rng.choices(range(1, max_length + 1), weights=weights)[0]


def choose_ngram_spans(
    words: list[list[int]], budget: int, rng: random.Random, max_ngram: int = NGRAM_MAX_WORDS
) -> list[list[int]]:
    """ALBERT's n-gram choice: visits words in random order; from each uncovered one draws n in
    1..m (m: up to max_ngram uncovered adjacent words from it) with p(n) ~ 1/n and takes n whole
    words, trying shorter n-grams while one would overshoot the token budget (as ALBERT's code).

    Unlike ALBERT's code, an n-gram stops at a covered word instead of being dropped, and never
    runs across [SEP]. Returns the chosen spans, each a list of adjacent positions.
    """
    covered = [False] * len(words)
    starts = list(range(len(words)))
    rng.shuffle(starts)
    spans, total = [], 0
    for s in starts:
        if total >= budget:
            break
        if covered[s]:
            continue
        m = 1
        while m < max_ngram and _adjacent(words, s + m - 1) and not covered[s + m]:
            m += 1
        n = rng.choices(range(1, m + 1), weights=[1.0 / k for k in range(1, m + 1)])[0]
        while n > 0 and total + sum(len(w) for w in words[s : s + n]) > budget:
            n -= 1
        if n == 0:
            continue
        span = [p for w in words[s : s + n] for p in w]
        covered[s : s + n] = [True] * n
        spans.append(span)
        total += len(span)
    return spans


def choose_spans(
    words: list[list[int]],
    budget: int,
    rng: random.Random,
    p: float = SPAN_GEOMETRIC_P,
    max_words: int = SPAN_MAX_WORDS,
) -> list[list[int]]:
    """SpanBERT's span choice: until `budget` tokens are chosen, draw a length l ~ Geo(p) limited
    to max_words (geometric_span_length) and a uniformly random uncovered word start that still
    fits the budget, and take up to l whole words from there.

    SpanBERT rejects a span that overlaps an earlier one and draws again; drawing the start among
    uncovered words is the same distribution for the start, and a span that runs into a covered
    word, a [SEP] or the end of the budget is cut there. That keeps the loop finite at any rate
    (at masked_lm_prob 1.0 every word that fits is taken). Returns spans of adjacent positions.
    """
    covered = [False] * len(words)
    spans, total = [], 0
    while total < budget:
        free = [k for k, w in enumerate(words) if not covered[k] and total + len(w) <= budget]
        if not free:
            break
        length = geometric_span_length(rng, p, max_words)
        k = free[rng.randrange(len(free))]
        span: list[int] = []
        for n in range(length):
            w = words[k + n]
            if covered[k + n] or total + len(span) + len(w) > budget:
                break
            span.extend(w)
            covered[k + n] = True
            if not _adjacent(words, k + n):
                break
        spans.append(span)
        total += len(span)
    return spans


def create_span_masked_lm_predictions(
    input_ids: Sequence[int],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab,
    rng: random.Random,
    scheme: str,
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Chooses n-grams ("ngram") or SpanBERT spans ("span") to predict and corrupts them.

    The token budget is the original's min(max_predictions_per_seq, max(1, round(len * prob))).
    80% [MASK] / 10% random token / 10% unchanged (BERT sec. 3.1), decided per token for
    "ngram" as ALBERT, per span for "span": SpanBERT sec. 3.1 replaces all tokens of a span alike.

    Returns (output_ids, masked_lm_positions, masked_lm_ids, span_left, span_right), positions
    sorted, and for each prediction the positions just outside its span (s - 1 and e + 1; never
    outside the sequence, since [CLS] and the last [SEP] are never in a span).
    """
    if scheme not in ("ngram", "span"):
        raise ValueError(f"scheme: expected 'ngram' or 'span', found {scheme!r}")
    budget = min(max_predictions_per_seq, max(1, int(round(len(input_ids) * masked_lm_prob))))
    words = word_groups(input_ids, vocab)
    if scheme == "span":
        spans = choose_spans(words, budget, rng)
    else:
        spans = choose_ngram_spans(words, budget, rng)
    output_ids = list(input_ids)
    random_ids = vocab.random_ids

    def draw():
        # The original's order of draws: one for [MASK]; if not, one for keep vs random.
        if rng.random() < 0.8:
            return "mask"
        return "keep" if rng.random() < 0.5 else "random"

    boundary = {}
    for span in spans:
        choice = draw() if scheme == "span" else None
        for index in span:
            what = choice or draw()
            if what == "mask":
                output_ids[index] = vocab.mask_id
            elif what == "random":
                output_ids[index] = random_ids[rng.randint(0, len(random_ids) - 1)]
            boundary[index] = (span[0] - 1, span[-1] + 1)
    positions = sorted(boundary)
    return (
        output_ids,
        positions,
        [input_ids[p] for p in positions],
        [boundary[p][0] for p in positions],
        [boundary[p][1] for p in positions],
    )


# --------------------------------------------------------------------------------------------
# Dynamic masking (TensorFlow, stateless)


@dataclasses.dataclass(frozen=True)
class DynamicMasking:
    """What `mask_dynamic` needs besides the batch and the seed.

    Attributes:
      masked_lm_prob: fraction of each sequence's tokens to predict.
      max_predictions_per_seq: P, the padded number of predictions.
      mask_id: id of [MASK].
      vocab_size: random replacements are drawn uniformly from [0, vocab_size), the whole
        vocabulary as the original drew from `vocab.keys()`.
      special_ids: ids never predicted ([CLS], [SEP], [PAD]).
      mask_token_prob, random_token_prob: of the predicted positions, the fraction that become
        [MASK] and the fraction that get a random id; the rest keep their token. BERT's 80/10/10
        (sec. 3.1) by default; ELECTRA's original code masks 85% and keeps 15%
        (electra.DYNAMIC_MASKING).
    """

    masked_lm_prob: float
    max_predictions_per_seq: int
    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1

    def __post_init__(self):
        m, r = self.mask_token_prob, self.random_token_prob
        if not (0.0 <= m and 0.0 <= r and m + r <= 1.0):
            raise ValueError(
                f"DynamicMasking: mask_token_prob {m} and random_token_prob {r} must be >= 0 "
                "with a sum <= 1 (the rest of the predicted tokens stay as they are)"
            )


def mask_dynamic(input_ids, input_mask, seed, spec: DynamicMasking) -> dict:
    """Masks a batch as create_pretraining_data would, drawing from stateless random ops.

    tensorflow-text's `mask_language_model` with `RandomItemSelector` and `MaskValuesChooser` does
    the same job, but MaskValuesChooser draws from the stateful `tf.random.uniform` with no seed
    argument, so a resumed run would mask differently from an uninterrupted one; and its selector
    takes ceil(rate * selectable) items rather than the original's round(rate * length). Written
    here with `tf.random.stateless_*` instead: the output is a pure function of the inputs and
    `seed`.

    Per row: min(P, max(1, round(length * masked_lm_prob))) positions are predicted (the original
    count; fewer only when the row has fewer candidates), chosen uniformly among real tokens that
    are not special; by default 80% become [MASK], 10% a random id, 10% stay (BERT sec. 3.1;
    spec.mask_token_prob and spec.random_token_prob set the first two).

    Args:
      input_ids, input_mask: int32 (B, S).
      seed: int32 or int64 (2,), e.g. (run seed, batch index).
      spec: the masking settings.
    Returns a dict: input_ids int32 (B, S), the corrupted ids; masked_lm_positions and
    masked_lm_ids int32 (B, P), sorted positions padded with 0; masked_lm_weights float32 (B, P).
    """
    ids = tf.cast(input_ids, tf.int32)
    real = tf.cast(input_mask, tf.bool)
    shape = tf.shape(ids)
    s = shape[1]
    p = spec.max_predictions_per_seq
    choose_seed, kind_seed, token_seed = tf.unstack(
        tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
    )
    candidate = real
    for special in spec.special_ids:
        candidate &= tf.not_equal(ids, special)
    length = tf.reduce_sum(tf.cast(real, tf.float32), axis=1)  # (B,)
    # tf.round rounds half to even, as Python's round() in the original.
    wanted = tf.maximum(1.0, tf.round(length * spec.masked_lm_prob))
    num = tf.minimum(tf.cast(wanted, tf.int32), p)
    num = tf.minimum(num, tf.reduce_sum(tf.cast(candidate, tf.int32), axis=1))  # (B,)

    # A uniform random score per position; non-candidates score -1 and sort last.
    scores = tf.random.stateless_uniform(shape, choose_seed)
    scores = tf.where(candidate, scores, -1.0)
    order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)  # (B, S)
    rank = tf.argsort(order, axis=1, stable=True)  # (B, S): each position's place in the order
    chosen = candidate & (rank < num[:, None])  # (B, S)

    # Chosen positions in increasing order first, then the rest, cut to P.
    index = tf.broadcast_to(tf.range(s)[None, :], shape)  # (B, S)
    key = tf.where(chosen, index, index + s)
    first = tf.sort(key, axis=1)[:, :p]  # (B, P)
    is_real = first < s
    positions = tf.where(is_real, first, 0)
    labels = tf.where(is_real, tf.gather(ids, positions, batch_dims=1), 0)

    u = tf.random.stateless_uniform(shape, kind_seed)
    random_ids = tf.random.stateless_uniform(
        shape, token_seed, minval=0, maxval=spec.vocab_size, dtype=tf.int32
    )
    corrupted = tf.where(chosen & (u < spec.mask_token_prob), spec.mask_id, ids)
    # 1 - random_token_prob: 0.9 for BERT's rates (the draws of the fixed 80/10/10 kept exactly);
    # 1.0 (never, u < 1) for ELECTRA's.
    corrupted = tf.where(chosen & (u >= 1.0 - spec.random_token_prob), random_ids, corrupted)
    return {
        "input_ids": corrupted,
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "masked_lm_weights": tf.cast(is_real, tf.float32),
    }
