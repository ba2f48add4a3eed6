"""XLNet's released pretraining records: a reused part, then two segments (Yang et al. 2019,
sec. 2.5 and A.1; the release's data_utils.py create_tfrecords).

The corpus is one stream of SentencePiece ids with a sentence id per token that flips at every
sentence (`<eod>` ends each document, glued to its last sentence as the release's use_eod puts
it). Record t starts at t x reuse_len: its first reuse_len ids continue the text where record t-1's
began (the part a model with memory caches for the next record), then segment A (whole sentences
from there, cut at a sentence boundary), `<sep>`, segment B (half of the time the sentences that
follow A, label 1, otherwise a random run of sentences elsewhere in the stream, label 0),
`<sep>`, `<cls>`, seq_len ids in all. Segment ids: 0 over the reused part, A and its `<sep>`, 1
over B and its `<sep>`, 2 at `<cls>`. Written as `input_ids`, `segment_ids` and
`next_sentence_labels` (BERT's feature names) and `reuse_len` (the release's flag; every record
says how much of it continues the record before, so a reader cannot take another value), in
corpus order over the output files as the language-model blocks are (data_prep/lm_data.py:
serialize_records, and bidirectional for the release's bi_data), so lm_data.stream_dataset cuts
them into streams whose rows continue each other.

Pure: the same ids, sentence ids and seed give the same records (a random.Random of the seed
draws what the release's module-level `random` drew).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

FUNCTIONAL_SEGMENT = 2  # the segment id of <cls>
SPECIAL_POSITIONS = 3  # <sep>, <sep>, <cls>


def encode_sentences(encode, text: str) -> list:
    """A document's text (sentences joined by newlines, lm_data.read_lm_documents) -> each
    sentence's ids, each tokenized alone as the release's data_utils.py does."""
    return [encode(sentence) for sentence in text.split("\n")]


def sentence_stream(
    documents: Iterable[Sequence[Sequence[int]]], eod_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Documents (each a list of its sentences' ids) -> int32 ids and bool sentence ids of the
    whole stream: the sentence id flips at every non-empty sentence, and each document's
    `eod_id` carries its last sentence's id (the release's use_eod)."""
    ids: list[int] = []
    sentence_ids: list[bool] = []
    flag = True
    for sentences in documents:
        for sentence in sentences:
            if not len(sentence):
                continue
            ids.extend(sentence)
            sentence_ids.extend([flag] * len(sentence))
            flag = not flag
        ids.append(eod_id)
        sentence_ids.append(not flag)  # the last sentence's id
    return np.asarray(ids, np.int32), np.asarray(sentence_ids, bool)


def split_a_and_b(ids, sentence_ids, begin: int, total: int, rng: random.Random):
    """Segments A and B of `total` ids at most from position `begin` (the release's
    _split_a_and_b with extend_target): A runs from `begin` to a sentence boundary; B is the
    rest up to the boundary past `total` (label 1), or with probability 1/2 (always when no
    boundary falls inside) whole sentences from a random place (label 0); the longer of the two
    is cut at its end until they fit. Returns (a, b, label), or None when the stream ends too
    soon."""
    n = len(ids)
    if begin + total >= n:
        return None
    end = begin + 1
    cuts = []
    while end < n:
        if sentence_ids[end] != sentence_ids[end - 1]:
            if end - begin >= total:
                break
            cuts.append(end)
        end += 1
    if not cuts or rng.random() < 0.5:
        label = 0
        a_end = rng.choice(cuts) if cuts else end
        b_len = max(1, total - (a_end - begin))
        b_begin = rng.randint(0, n - 1 - b_len)
        b_end = b_begin + b_len
        while b_begin > 0 and sentence_ids[b_begin - 1] == sentence_ids[b_begin]:
            b_begin -= 1
        while b_end < n - 1 and sentence_ids[b_end - 1] == sentence_ids[b_end]:
            b_end += 1
    else:
        label = 1
        a_end = rng.choice(cuts)
        b_begin, b_end = a_end, end
    while a_end - begin + b_end - b_begin > total:
        if a_end - begin > b_end - b_begin:
            a_end -= 1
        else:
            b_end -= 1
    if a_end >= n or b_end >= n:  # the release keeps one id past each for its LM targets
        return None
    return ids[begin:a_end], ids[b_begin:b_end], label


def two_segment_records(
    ids: np.ndarray,
    sentence_ids: np.ndarray,
    seq_len: int,
    reuse_len: int,
    sep_id: int,
    cls_id: int,
    seed: int,
) -> Iterator[dict[str, np.ndarray]]:
    """The stream's records in order (module docstring): dicts of int32 input_ids and
    segment_ids (seq_len), next_sentence_labels and reuse_len (1), record t starting at
    t x reuse_len, until the stream cannot fill one more."""
    if not 0 < reuse_len < seq_len - SPECIAL_POSITIONS:
        raise ValueError(
            f"reuse_len: expected 1 .. seq_len - 4 = {seq_len - 4} (room for <sep> A <sep> B "
            f"<cls>), found {reuse_len}"
        )
    rng = random.Random(seed)
    total = seq_len - reuse_len - SPECIAL_POSITIONS
    i = 0
    while i + seq_len <= len(ids):
        split = split_a_and_b(ids, sentence_ids, i + reuse_len, total, rng)
        if split is None:
            return
        a, b, label = split
        input_ids = np.concatenate([ids[i : i + reuse_len], a, [sep_id], b, [sep_id, cls_id]])
        segment_ids = np.concatenate(
            [np.zeros(reuse_len + len(a) + 1), np.ones(len(b) + 1), [FUNCTIONAL_SEGMENT]]
        )
        yield {
            "input_ids": input_ids.astype(np.int32),
            "segment_ids": segment_ids.astype(np.int32),
            "next_sentence_labels": np.array([label], np.int32),
            "reuse_len": np.array([reuse_len], np.int32),
        }
        i += reuse_len


def feature_spec(seq_len: int) -> dict:
    """What the permutation-LM input pipeline reads of a record."""
    import tensorflow as tf

    return {
        "input_ids": tf.io.FixedLenFeature([seq_len], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([seq_len], tf.int64),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
