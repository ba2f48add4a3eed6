"""Denoising objectives for encoder-decoder pre-training: T5 span corruption and BART's noising.

Pure functions on token-id lists with an explicit numpy Generator: the same rng state gives the
same corruption. Each returns what the model sees and what it must produce, plus enough to undo
it, so tests reconstruct the original exactly.

  t5_span_corruption   Raffel et al. 2020, sec. 3.1.4 and 3.3.4: 15% of tokens in spans of mean
                       length 3; each span becomes one sentinel in the input, and the target lists
                       every sentinel followed by the tokens it hides.
  bart_text_infilling  Lewis et al. 2020, sec. 2.2: span lengths drawn from Poisson(3) until 30% of
                       tokens are covered; each span (a length-0 one too) becomes one mask token.
  permute_sentences    Lewis et al. 2020, sec. 2.2: the document's sentences in a random order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> list[int]:
    """Splits num_items into num_segments positive lengths, uniformly over such splits (T5's
    `random_segmentation`: choose num_segments - 1 distinct cut points)."""
    if not 1 <= num_segments <= num_items:
        raise ValueError(f"cannot split {num_items} items into {num_segments} non-empty segments")
    cuts = np.sort(rng.choice(np.arange(1, num_items), num_segments - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [num_items]])).astype(int).tolist()


def t5_span_corruption(
    tokens: Sequence[int],
    sentinel_ids: Sequence[int],
    rng: np.random.Generator,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
) -> tuple[list[int], list[int]]:
    """Returns (inputs, targets) of T5's span corruption.

    num_noise = round(len * noise_density) (at least 1, at most len - 1), split into
    round(num_noise / mean_noise_span_length) spans (at least 1); the kept tokens are split into
    as many spans, and the two alternate, starting with kept text (T5's noise_span_to_unique
    sentinel recipe). Span i is replaced by sentinel_ids[i] in the inputs; the targets are
    sentinel_ids[0] span_0 sentinel_ids[1] span_1 ... (end-of-sequence tokens are the caller's).
    """
    n = len(tokens)
    if n < 2:
        raise ValueError(f"span corruption needs at least 2 tokens, found {n}")
    num_noise = min(max(int(round(n * noise_density)), 1), n - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    num_spans = min(num_spans, num_noise, n - num_noise)
    if num_spans > len(sentinel_ids):
        raise ValueError(
            f"{num_spans} noise spans need as many sentinels; {len(sentinel_ids)} given"
        )
    noise_lengths = random_segmentation(num_noise, num_spans, rng)
    keep_lengths = random_segmentation(n - num_noise, num_spans, rng)
    inputs, targets, pos = [], [], 0
    for i, (keep, noise) in enumerate(zip(keep_lengths, noise_lengths)):
        inputs.extend(tokens[pos : pos + keep])
        pos += keep
        inputs.append(sentinel_ids[i])
        targets.append(sentinel_ids[i])
        targets.extend(tokens[pos : pos + noise])
        pos += noise
    return inputs, targets


def t5_reconstruct(inputs: Sequence[int], targets: Sequence[int], sentinel_ids) -> list[int]:
    """Undoes t5_span_corruption: each sentinel in the inputs becomes the tokens that follow it in
    the targets."""
    sentinels = set(sentinel_ids)
    spans: dict[int, list[int]] = {}
    current = None
    for t in targets:
        if t in sentinels:
            current = spans.setdefault(t, [])
        elif current is not None:
            current.append(t)
    return [x for t in inputs for x in (spans[t] if t in sentinels else [t])]


def bart_text_infilling(
    tokens: Sequence[int],
    mask_id: int,
    rng: np.random.Generator,
    mask_ratio: float = 0.3,
    poisson_lambda: float = 3.0,
) -> tuple[list[int], list[tuple[int, int]]]:
    """Returns (noised tokens, spans): spans are (start, length) in the original, non-overlapping
    and sorted; each is replaced by a single mask_id (a length-0 span inserts one). Spans are drawn
    with Poisson(poisson_lambda) lengths at random starts until round(len * mask_ratio) tokens are
    covered (the last span is shortened to the budget). The target is the original tokens."""
    n = len(tokens)
    budget = int(round(n * mask_ratio))
    covered = np.zeros(n + 1, bool)  # position n: insertion at the end is allowed
    spans: list[tuple[int, int]] = []
    used, attempts = 0, 0
    while used < budget and attempts < 100 * (n + 1):
        attempts += 1
        length = min(int(rng.poisson(poisson_lambda)), budget - used)
        start = int(rng.integers(0, n + 1 - length))
        # A span may not touch another (adjacent spans would merge into one mask).
        lo, hi = max(start - 1, 0), min(start + length + 1, n + 1)
        if covered[lo:hi].any():
            continue
        covered[start : start + max(length, 1)] = True
        spans.append((start, length))
        used += length
    spans.sort()
    out, pos = [], 0
    for start, length in spans:
        out.extend(tokens[pos:start])
        out.append(mask_id)
        pos = start + length
    out.extend(tokens[pos:])
    return out, spans


def bart_reconstruct(noised: Sequence[int], spans, original: Sequence[int], mask_id: int):
    """Checks a text-infilling result: filling each mask with its span of the original gives the
    original back. Returns the reconstruction."""
    out, it = [], iter(spans)
    for t in noised:
        if t == mask_id:
            start, length = next(it)
            out.extend(original[start : start + length])
        else:
            out.append(t)
    return out


def permute_sentences(sentences: Sequence, rng: np.random.Generator) -> tuple[list, list[int]]:
    """Returns (the sentences in a random order, the order: result[i] = sentences[order[i]])."""
    order = rng.permutation(len(sentences)).tolist()
    return [sentences[i] for i in order], order
