"""Streaming pre-training data: bounded memory, parallel workers, deterministic shards.

The original algorithm (data_prep/pretraining_data.py) holds the whole corpus and every instance in
memory and runs on one core: memory grows with the corpus and time with it on one core. This is the
same algorithm applied to bounded chunks of the corpus:

  iter_text_chunks   each input file is cut, at document boundaries, into chunks of about
                     `chunk_bytes` of text (at least two documents each; a short tail joins the
                     chunk before it). A chunk is named by (file index, chunk index in the file), so
                     the cut depends only on the file, never on the worker count or the runner.
  tokenize_chunk     text -> documents of ids, in the worker (FullTokenizer: the same ids as
                     the tensorflow-text tokenizer, and faster than it once its start-up counts).
  chunk_records      the pure function of one chunk: `dupe_factor` passes of
                     create_training_instances over the chunk's documents (random next segments
                     drawn from the chunk's other documents; the chunk's instances shuffled
                     together), masked and serialized. Its randomness is seeded from
                     (random_seed, file index, chunk index) alone.
  shard_of           record j of chunk (f, c) goes to shard (f + c + j) mod num_shards; a shard
                     holds its records ordered by (f, c, j).
  chunk_shards       a worker's job: tokenize_chunk, chunk_records, then frame the records as
                     TFRecords (frame_records) and deal them to the shards (deal_framed).
  create_shards      reads and cuts the text, hands chunks to `num_workers` processes with at
                     most 2 x num_workers chunks in flight, and appends the blocks they return
                     to the shard files in chunk order. No process imports TensorFlow (its
                     import alone took longer than the default corpus' records at dupe 1).

So the output bytes depend on the text, the vocabulary, the flags, `chunk_bytes` and the seed,
not on the number of workers, and a distributed runner that maps chunk_records over the same chunks
and orders each shard by (f, c, j) writes the same files.

What differs from the original's records, by design: a random next segment comes from another
document of the same chunk instead of the whole corpus, and instances are shuffled within their
chunk instead of globally (a shard holds runs of records from one chunk, mixed at training time by
the reader's shuffle buffer). `--compat_original` in create_pretraining_data.py keeps the
original's whole-corpus behaviour and records.

Speed: for BERT's recipe the pairs come from `nsp_pairs`, a faster equal of
create_training_instances (bisection over sentence offsets instead of a walk over sentences, one
slice per side; pair for pair the same, tested); the masks of a batch of instances are chosen
with numpy at once (`mask_batch`, the same distribution as create_masked_lm_predictions, other
random draws), and records are serialized by `ExampleEncoder` rather than through
tf.train.Example: protobuf message construction took about as long as everything else together
here (measured, see bench/), and the bytes are equal to protobuf's deterministic serialization
(tested).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
import struct
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence

import google_crc32c
import numpy as np
from absl import logging

from data_prep.files import open_file, write_atomically
from data_prep.parallel import ordered_map
from data_prep.pretraining_data import (
    Document,
    MaskingVocab,
    TrainingInstance,
    _tokenize_lines,
    check_documents,
    create_training_instances,
    serialize_instance,
)
from data_prep.tokenization import read_utf8_lines

# Instances masked and serialized per numpy batch: large enough to amortize numpy's per-call cost
# (mask_batch takes P small steps over the batch), small enough that its [n, S] int32 arrays
# stay about a MB.
_MASK_BATCH = 2048


@dataclasses.dataclass(frozen=True)
class ChunkSettings:
    """Everything chunk_records needs besides the chunk (the flags of create_pretraining_data)."""

    vocab: MaskingVocab
    max_seq_length: int
    max_predictions_per_seq: int
    dupe_factor: int
    short_seq_prob: float
    masked_lm_prob: float
    random_seed: int
    sentence_objective: str = "nsp"
    masking_scheme: str = "token"
    static_masking: bool = True
    full_sentences: bool = False

    def create_instances(
        self,
        documents: Sequence[Document],
        rng: random.Random,
        static_masking: bool | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[TrainingInstance]:
        """create_training_instances with these settings (static_masking overridable)."""
        return create_training_instances(
            documents,
            self.vocab,
            self.max_seq_length,
            self.dupe_factor,
            self.short_seq_prob,
            self.masked_lm_prob,
            self.max_predictions_per_seq,
            rng,
            progress=progress,
            sentence_objective=self.sentence_objective,
            masking_scheme=self.masking_scheme,
            static_masking=self.static_masking if static_masking is None else static_masking,
            full_sentences=self.full_sentences,
        )


@dataclasses.dataclass(frozen=True)
class TextChunk:
    """Consecutive documents of one input file, as text.

    Attributes:
      file_index, chunk_index: the chunk's name: input file number, and chunk number in that file.
      path, first_line, last_line: where its text is (1-based, inclusive), for error messages.
      documents: the documents, each a list of non-blank stripped lines.
      num_bytes: UTF-8 bytes of its lines, line ends (as one byte) and blank lines included.
    """

    file_index: int
    chunk_index: int
    path: str
    first_line: int
    last_line: int
    documents: list[list[str]]
    num_bytes: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.first_line}-{self.last_line}"


def iter_text_chunks(
    input_files: Sequence[str], chunk_bytes: int, min_documents: int = 2
) -> Iterator[TextChunk]:
    """The chunks of every input file in turn (see iter_file_chunks); file i's are named (i, c)."""
    for file_index, path in enumerate(input_files):
        yield from iter_file_chunks(file_index, path, chunk_bytes, min_documents)


def iter_file_chunks(
    file_index: int, path: str, chunk_bytes: int, min_documents: int = 2, opener=None
) -> Iterator[TextChunk]:
    """Cuts one file into chunks of whole documents (blank lines and the file end end documents).

    A chunk closes at the first document end where it holds at least `chunk_bytes` of text and
    `min_documents` documents. The file's last, short chunk (fewer than `min_documents`
    documents) is joined to the chunk before it, so one chunk is held back while the next fills:
    at most about 2 x chunk_bytes plus one document of text is held at once. `opener`: as
    read_utf8_lines takes it (another filesystem).

    Raises:
      InputError: naming the file and line for text that is not UTF-8.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, found {chunk_bytes}")
    held: TextChunk | None = None
    index = 0
    documents: list[list[str]] = []
    current: list[str] = []
    size, first, number = 0, 1, 0
    for number, text in read_utf8_lines(path, opener):
        size += len(text.encode("utf-8")) + 1  # with its line end: chunks add up to the file
        text = text.strip()
        if text:
            current.append(text)
            continue
        if current:
            documents.append(current)
            current = []
        if size >= chunk_bytes and len(documents) >= min_documents:
            chunk = TextChunk(file_index, 0, path, first, number, documents, size)
            if held is not None:
                yield dataclasses.replace(held, chunk_index=index)
                index += 1
            held = chunk
            documents, size, first = [], 0, number + 1
    if current:
        documents.append(current)
    if documents and held is not None and len(documents) < min_documents:
        held = TextChunk(
            file_index,
            0,
            path,
            held.first_line,
            number,
            held.documents + documents,
            held.num_bytes + size,
        )
        documents = []
    if held is not None:
        yield dataclasses.replace(held, chunk_index=index)
        index += 1
    if documents:
        yield TextChunk(file_index, index, path, first, number, documents, size)


def tokenize_chunk(chunk: TextChunk, tokenizer, sentence_objective: str) -> list[Document]:
    """The chunk's documents as ids (lines that tokenize to nothing and empty documents dropped),
    checked as read_documents checks a corpus, with the chunk's file and line range in errors."""
    from array import array

    ids = iter(_tokenize_lines(tokenizer, [s for d in chunk.documents for s in d]))
    documents = []
    for document in chunk.documents:
        sentences = [array("i", line) for line in (next(ids) for _ in document) if line]
        if sentences:
            documents.append(sentences)
    check_documents(documents, f"{chunk.where} (one chunk of --chunk_bytes)", sentence_objective)
    return documents


def shard_of(file_index: int, chunk_index: int, record_index: int, num_shards: int) -> int:
    """The output shard of record `record_index` of chunk (file_index, chunk_index)."""
    return (file_index + chunk_index + record_index) % num_shards


# --------------------------------------------------------------------------------------------
# The pure function of one chunk


def chunk_records(
    file_index: int, chunk_index: int, documents: Sequence[Document], settings: ChunkSettings
) -> list[bytes]:
    """Serialized tf.train.Example records of one chunk, in their order within the chunk.

    Pure: the output depends only on the arguments (randomness seeded from settings.random_seed,
    file_index and chunk_index), so any process, pool or runner computes the same bytes.
    """
    s = settings
    # random.Random seeds a str through SHA-512, the same in every process (no hash seed).
    rng = random.Random(f"cloze-chunk/{s.random_seed}/{file_index}/{chunk_index}")
    encoder = example_encoder(
        s.max_seq_length, s.max_predictions_per_seq, len(s.vocab.is_continuation)
    )
    masked = s.static_masking
    if s.sentence_objective != "nsp" or (masked and s.masking_scheme != "token"):
        # Other recipes: the general instance code, one instance at a time.
        return [encoder.encode_instance(i) for i in s.create_instances(documents, rng)]
    # BERT's recipe (and its unmasked form for dynamic masking): the pairs come from nsp_pairs
    # (the same pairs as create_training_instances), token masking for a whole batch at once.
    pairs = nsp_pairs(documents, s.max_seq_length, s.short_seq_prob, s.dupe_factor, s.vocab, rng)
    np_rng = np.random.default_rng(rng.getrandbits(128)) if masked else None
    zeros, ones = encoder.zeros, encoder.ones
    records: list[bytes] = []
    for start in range(0, len(pairs), _MASK_BATCH):
        batch = pairs[start : start + _MASK_BATCH]
        ids, lengths = pad_pairs(batch, s.max_seq_length)
        segments = [zeros[a + 2] + ones[b + 1] for _, a, b, _ in batch]
        labels = [int(p[3]) for p in batch]
        if not masked:
            for packed_ids, n, segment_ids, label in zip(
                packed_varints(ids), lengths.tolist(), segments, labels, strict=True
            ):
                records.append(encoder.encode_unmasked(packed_ids, n, segment_ids, label))
            continue
        out, positions, counts = mask_batch(
            ids, lengths, s.vocab, s.masked_lm_prob, s.max_predictions_per_seq, np_rng
        )
        targets = np.take_along_axis(ids, positions, axis=1)
        targets[np.arange(positions.shape[1])[None, :] >= counts[:, None]] = 0
        for packed_ids, n, segment_ids, packed_positions, packed_targets, k, label in zip(
            packed_varints(out), lengths.tolist(), segments, packed_varints(positions),
            packed_varints(targets), counts.tolist(), labels, strict=True,
        ):  # fmt: skip
            records.append(
                encoder.encode_masked(
                    packed_ids, n, segment_ids, packed_positions, packed_targets, k, label
                )
            )
    return records


# A pair as nsp_pairs makes it: ([CLS] A [SEP] B [SEP] as native int32 bytes, len(A), len(B),
# is_random_next).
Pair = tuple[bytes, int, int, bool]


def nsp_pairs(
    documents: Sequence[Document],
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    vocab: MaskingVocab,
    rng: random.Random,
) -> list[Pair]:
    """The unmasked instances of create_training_instances(sentence_objective="nsp",
    static_masking=False), drawn from `rng` in the same order, so equal pair for pair (tested).

    Hand-written because pairing was the largest cost of a record here: the general code walks
    sentence by sentence and copies ids into lists; this finds each chunk's and each random next
    segment's last sentence by bisection over the document's sentence offsets, cuts each side
    once from the document's flat int32 bytes, and counts truncate_seq_pair's removals from its
    draws (which side loses a token depends only on the two lengths, never on a draw).
    """
    if len(documents) < 2:
        raise ValueError(
            f"need at least two documents for random next sentences, got {len(documents)}"
        )
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for A and B (need >= 5)")
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    flat = []
    for document in documents:
        starts = [0]
        for sentence in document:
            starts.append(starts[-1] + len(sentence))
        flat.append((b"".join(s.tobytes() for s in document), starts))
    # create_training_instances' document shuffle; random next documents index this order.
    rng.shuffle(flat)
    cls = array("i", [vocab.cls_id]).tobytes()
    sep = array("i", [vocab.sep_id]).tobytes()
    # randint(a, b) is a + _randbelow(b - a + 1) in every CPython 3 (randrange's body); calling
    # it directly skips randrange's argument checks, a third of the pairing time. Same draws.
    random_, below = rng.random, rng._randbelow
    num_documents = len(flat)
    pairs: list[Pair] = []
    for _ in range(dupe_factor):
        for index, (ids, starts) in enumerate(flat):
            num_sentences = len(starts) - 1
            target = max_num_tokens
            if random_() < short_seq_prob:
                target = 2 + below(max_num_tokens - 1)
            first = 0
            while first < num_sentences:
                # The chunk: sentences first..end, the first prefix of at least target tokens.
                end = min(bisect_left(starts, starts[first] + target, first + 1), num_sentences)
                size = end - first  # sentences in the chunk
                a_end = first + (1 + below(size - 1) if size >= 2 else 1)
                a0, a1 = starts[first], starts[a_end]
                if size == 1 or random_() < 0.5:
                    is_random_next = True
                    while True:
                        other = below(num_documents)
                        if other != index:
                            break
                    b_ids, b_starts = flat[other]
                    j = below(len(b_starts) - 1)
                    # Sentences j.. until B holds target - len(A) tokens, or the document ends.
                    b_end = bisect_left(b_starts, b_starts[j] + target - (a1 - a0), j + 1)
                    b0, b1 = b_starts[j], b_starts[min(b_end, len(b_starts) - 1)]
                    first = a_end  # the chunk's sentences after A start the next chunk
                else:
                    is_random_next = False
                    b_ids, b0, b1 = ids, a1, starts[end]
                    first = end
                front_a, back_a, front_b, back_b = _trim(a1 - a0, b1 - b0, max_num_tokens, random_)
                a0, a1, b0, b1 = a0 + front_a, a1 - back_a, b0 + front_b, b1 - back_b
                pairs.append(
                    (
                        b"".join((cls, ids[4 * a0 : 4 * a1], sep, b_ids[4 * b0 : 4 * b1], sep)),
                        a1 - a0,
                        b1 - b0,
                        is_random_next,
                    )
                )
    rng.shuffle(pairs)  # the final shuffle of all passes' instances
    return pairs


def _trim(len_a: int, len_b: int, max_num_tokens: int, random_) -> tuple[int, int, int, int]:
    """truncate_seq_pair's (front_a, back_a, front_b, back_b) removals with the same draws.

    It removes from the longer side (B on a tie) one token per draw, from the front when the
    draw is < 0.5. So the first draws all go to the side that starts longer until the two are
    level (B then one shorter than A), after which the sides alternate, starting with the other.
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0, 0, 0
    draws = [random_() for _ in range(excess)]
    a_first = len_a > len_b
    lead = min(len_a - len_b if a_first else len_b - len_a + 1, excess)
    first_side = draws[:lead] + draws[lead + 1 :: 2]
    other_side = draws[lead::2]
    front_first = len([d for d in first_side if d < 0.5])
    front_other = len([d for d in other_side if d < 0.5])
    if a_first:
        return (
            front_first,
            len(first_side) - front_first,
            front_other,
            len(other_side) - front_other,
        )
    return front_other, len(other_side) - front_other, front_first, len(first_side) - front_first


def pad_pairs(pairs: Sequence[Pair], max_seq_length: int):
    """(ids, lengths): the pairs' ids as int32 [n, S] padded with 0, and int64 [n]."""
    lengths = np.fromiter((len(p[0]) >> 2 for p in pairs), np.int64, len(pairs))
    flat = np.frombuffer(b"".join(p[0] for p in pairs), np.int32)
    ids = np.zeros((len(pairs), max_seq_length), np.int32)
    ids[np.arange(max_seq_length)[None, :] < lengths[:, None]] = flat  # row-major fill, [n, S]
    return ids, lengths


def mask_batch(
    ids: np.ndarray,
    lengths: np.ndarray,
    vocab: MaskingVocab,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    rng: np.random.Generator,
):
    """BERT's token masking (section 3.1) for a batch at once, as create_masked_lm_predictions does
    it one instance at a time: min(P, max(1, round(L * masked_lm_prob))) positions (never [CLS] or
    [SEP], never more than there are) chosen uniformly without replacement; of those 80% become
    [MASK], 10% a random vocabulary id, 10% stay.

    The positions are the first steps of a Fisher-Yates shuffle of each row's candidates, one
    step for all rows at a time: P random numbers a row instead of sorting S random keys a row
    (the sort was most of this function's time), and the 80/10/10 draws only for the P slots.

    Args:
      ids: int32 [n, S], the unmasked ids padded with 0; lengths: [n] real lengths L.
      rng: numpy Generator, the only randomness.

    Returns:
      (output_ids int32 [n, S], positions int64 [n, P] ascending and padded with 0, counts [n]).
    """
    n, seq = ids.shape
    p = max_predictions_per_seq
    in_length = np.arange(seq)[None, :] < lengths[:, None]  # [n, S]
    candidate = in_length & (ids != vocab.cls_id) & (ids != vocab.sep_id)
    rows, columns = np.nonzero(candidate)  # row-major: each row's candidates, ascending
    available = np.bincount(rows, minlength=n)  # [n]
    # np.rint rounds half to even, as Python's round() in the original.
    wanted = np.maximum(1, np.rint(lengths * masked_lm_prob).astype(np.int64))
    counts = np.minimum(np.minimum(wanted, p), available)  # [n]
    # Row r's candidates are pool[start[r] : start[r] + available[r]]; the extra last slot is
    # scratch for rows whose sample is complete (their swaps land there and are never read).
    pool = np.append(columns, 0)
    scratch = len(columns)
    start = np.cumsum(available) - available  # [n]
    steps = rng.random((p, n))  # [P, n]
    for t in range(int(counts.max(initial=0))):
        active = t < counts  # [n]
        i = np.where(active, start + t, scratch)
        # j uniform in row r's slots t .. available - 1 (the minimum guards u * k rounding to k)
        offset = np.minimum((steps[t] * (available - t)).astype(np.int64), available - t - 1)
        j = np.where(active, i + offset, scratch)
        swapped = pool[i]
        pool[i] = pool[j]
        pool[j] = swapped
    slots = np.arange(p)
    taken = slots[None, :] < counts[:, None]  # [n, P]
    picked = pool[np.minimum(start[:, None] + slots[None, :], scratch)]  # [n, P]
    positions = np.sort(np.where(taken, picked, seq), axis=1)  # chosen ascending, then seq
    draw = rng.random((n, p))  # [n, P], slot by slot in position order
    random_ids = np.asarray(vocab.random_ids, np.int32)
    replacement = random_ids[rng.integers(0, len(random_ids), (n, p))]
    out = ids.copy()
    row = np.broadcast_to(np.arange(n)[:, None], (n, p))
    # BERT section 3.1: 80% [MASK], 10% a random token, 10% unchanged (see
    # pretraining_data.create_masked_lm_predictions for why).
    to_mask = taken & (draw < 0.8)
    out[row[to_mask], positions[to_mask]] = vocab.mask_id
    to_random = taken & (draw >= 0.9)
    out[row[to_random], positions[to_random]] = replacement[to_random]
    return out, np.where(taken, positions, 0), counts


# --------------------------------------------------------------------------------------------
# Serialization


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def packed_varints(values: np.ndarray) -> list[bytes]:
    """Each row of a non-negative int32 [n, K] array as protobuf packed varints, for the whole
    batch in numpy at once (7 bits per byte, low bits first, high bit set on all but the last)."""
    v = np.asarray(values)
    n, k = v.shape
    if n and int(v.min()) < 0:
        raise ValueError(f"packed_varints: negative value {int(v.min())}")
    top = int(v.max(initial=0))
    width = max(1, (top.bit_length() + 6) // 7)  # bytes of the largest value
    if width == 1:  # all below 128: one byte each, every row k bytes
        flat = v.astype(np.uint8).tobytes()
        return [flat[i * k : (i + 1) * k] for i in range(n)]
    # Byte g of every value in one pass per g, in the narrowest integer type that holds them
    # (the passes over [n, K] dominate; 16-bit halves their memory traffic for BERT's vocabulary).
    rest = v.astype(np.uint16 if top < 1 << 16 else np.uint32)
    data = np.empty((n, k, width), np.uint8)  # [n, K, W]
    keep = np.empty((n, k, width), bool)  # byte g is written: the value has more than g groups
    keep[..., 0] = True
    for group in range(width):
        more = rest > 0x7F  # [n, K]
        data[..., group] = (rest & 0x7F) | (more.view(np.uint8) << 7)
        if group + 1 < width:
            keep[..., group + 1] = more
            rest = rest >> 7
    flat = data[keep].tobytes()  # row-major: row, value, byte
    ends = np.cumsum(keep.reshape(n, -1).sum(axis=1)).tolist()
    return [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def feature_entry_parts(key: bytes, packed: bytes, field: int = 3, length=_varint) -> list[bytes]:
    """One entry of Features.feature (with its own tag and length) whose Feature holds the packed
    `value` of an Int64List (field 3) or FloatList (field 2), as parts to join; `length` gives a
    varint (ExampleEncoder passes its table's lookup)."""
    lv = length(len(packed))
    inner = 1 + len(lv) + len(packed)  # the Int64List / FloatList message
    li = length(inner)
    feature = 1 + len(li) + inner
    lf = length(feature)
    head = b"\x0a" + length(len(key)) + key + b"\x12"  # the entry's key, then its value's tag
    entry = len(head) + len(lf) + feature
    tag = b"\x1a" if field == 3 else b"\x12"
    return [b"\x0a", length(entry), head, lf, tag, li, b"\x0a", lv, packed]


def int64_example(features: dict[str, bytes]) -> bytes:
    """A tf.train.Example of int64 list features, each given as its packed varints
    (packed_varints), in the bytes of protobuf's deterministic serialization (map entries in key
    order; the wire format is ExampleEncoder's). For records of a few features, such as the
    language-model blocks of data_prep/lm_data.py."""
    data = b"".join(
        b"".join(feature_entry_parts(key.encode("utf-8"), features[key]))
        for key in sorted(features)
    )
    return b"\x0a" + _varint(len(data)) + data


@functools.lru_cache(maxsize=8)
def example_encoder(max_seq_length: int, max_predictions_per_seq: int, vocab_size: int):
    return ExampleEncoder(max_seq_length, max_predictions_per_seq, vocab_size)


class ExampleEncoder:
    """Writes a pretraining tf.train.Example's wire format directly.

    Hand-written because building the protobuf messages cost more per record than pairing and
    masking together; the bytes equal `example.SerializeToString(deterministic=True)` of
    data_prep/features.py (feature map entries in sorted key order, packed int64 and float lists;
    tested against protobuf for masked, unmasked and multi-byte-varint records). Entries whose
    bytes depend only on a length or a count are made once; a record is one bytes.join.

    Wire format: Example.features (field 1) -> Features.feature, a map whose entries (field 1)
    hold key (1) and Feature (2); Feature.int64_list is field 3 and float_list field 2, each
    holding its packed `value` (field 1). Every length-delimited field is tag, varint length, data.
    """

    def __init__(self, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int):
        self.seq = max_seq_length
        self.predictions = max_predictions_per_seq
        # Every id, position and length this writer meets has its varint in one table lookup.
        size = max(vocab_size, 8 * max_seq_length + 64, 8 * max_predictions_per_seq + 64)
        self._v = tuple(_varint(v) for v in range(size))
        self._mask = {}  # length -> input_mask entry
        self._pads = [b"\x00" * n for n in range(max_seq_length + 1)]
        # segment_ids data of a pair: zeros[len(A) + 2] + ones[len(B) + 1]
        self.zeros = self._pads
        self.ones = [b"\x01" * n for n in range(max_seq_length + 1)]
        self._packed_heads = {}  # (key, len(packed)) -> the entry's bytes up to packed
        ones = b"\x00\x00\x80\x3f"  # 1.0f little-endian
        self._weights = [
            self._entry(
                b"masked_lm_weights", ones * k + bytes(4 * (max_predictions_per_seq - k)), 2
            )
            for k in range(max_predictions_per_seq + 1)
        ]
        self._labels = [self._entry(b"next_sentence_labels", self._v[k]) for k in (0, 1)]
        # segment_ids: S values of 0 or 1, always S bytes packed, so all but the data is fixed.
        self._segments = self._entry(b"segment_ids", bytes(max_seq_length))[:-max_seq_length]

    def _len(self, n: int) -> bytes:
        return self._v[n] if n < len(self._v) else _varint(n)

    def _entry_parts(self, key: bytes, packed: bytes, field: int = 3) -> list[bytes]:
        return feature_entry_parts(key, packed, field, self._len)

    def _packed_head(self, key: bytes, size: int) -> bytes:
        """The bytes of an int64 entry up to its packed values, for `size` bytes of them."""
        head = self._packed_heads.get((key, size))
        if head is None:
            parts = self._entry_parts(key, b"\x00" * size)
            head = self._packed_heads[key, size] = b"".join(parts[:-1])
        return head

    def _entry(self, key: bytes, packed: bytes, field: int = 3) -> bytes:
        return b"".join(self._entry_parts(key, packed, field))

    def _mask_entry(self, length: int) -> bytes:
        entry = self._mask.get(length)
        if entry is None:
            packed = b"\x01" * length + self._pads[self.seq - length]
            entry = self._mask[length] = self._entry(b"input_mask", packed)
        return entry

    def packed(self, values: Iterable[int]) -> bytes:
        """Packed varints of `values` (ids, positions), one at a time; see packed_varints."""
        return b"".join(map(self._v.__getitem__, values))

    def encode_masked(self, ids, length, segment_ids, positions, labels, count, label) -> bytes:
        """Args: ids, the S padded (masked) input ids as packed varints (`packed`); length, L;
        segment_ids, L bytes; positions and labels, P padded values as packed varints, of which
        `count` are real; label, 0 or 1."""
        head = self._packed_head
        body = b"".join(
            (
                head(b"input_ids", len(ids)),
                ids,
                self._mask.get(length) or self._mask_entry(length),
                head(b"masked_lm_ids", len(labels)),
                labels,
                head(b"masked_lm_positions", len(positions)),
                positions,
                self._weights[count],
                self._labels[label],
                self._segments,
                segment_ids,
                self._pads[self.seq - length],
            )
        )
        return b"\x0a" + self._len(len(body)) + body

    def encode_unmasked(self, ids, length, segment_ids, label) -> bytes:
        """The PACKED_FEATURES record (no masked_lm_*), arguments as encode_masked."""
        body = b"".join(
            (
                self._packed_head(b"input_ids", len(ids)),
                ids,
                self._mask.get(length) or self._mask_entry(length),
                self._labels[label],
                self._segments,
                segment_ids,
                self._pads[self.seq - length],
            )
        )
        return b"\x0a" + self._len(len(body)) + body

    def encode_instance(self, instance: TrainingInstance) -> bytes:
        """Any TrainingInstance, as pretraining_data.serialize_instance writes it."""
        n = len(instance.input_ids)
        if n > self.seq or len(instance.segment_ids) != n:
            raise ValueError(f"instance of length {n} does not fit max_seq_length={self.seq}")
        if instance.masked_lm_span_left is not None:  # rare: span masking, through protobuf
            return serialize_instance(instance, self.seq, self.predictions)
        row = [*instance.input_ids, *([0] * (self.seq - n))]
        label = int(instance.is_random_next)
        segments = bytes(instance.segment_ids)
        if instance.masked_lm_positions is None:
            return self.encode_unmasked(self.packed(row), n, segments, label)
        k = len(instance.masked_lm_positions)
        if k > self.predictions:
            raise ValueError(f"{k} predictions > max_predictions_per_seq={self.predictions}")
        pad = [0] * (self.predictions - k)
        return self.encode_masked(
            self.packed(row),
            n,
            segments,
            self.packed([*instance.masked_lm_positions, *pad]),
            self.packed([*instance.masked_lm_ids, *pad]),
            k,
            label,
        )


# --------------------------------------------------------------------------------------------
# TFRecord framing without TensorFlow
#
# A TFRecord file is records one after the other, each framed as: its length (uint64, little
# endian), the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data. The
# workers frame their records themselves, so no process of the streaming path imports
# TensorFlow (its import alone takes longer than making the default corpus' records at
# dupe_factor 1). The CRC-32C is google-crc32c's (the C library Google's storage clients use;
# tested against tf.io.TFRecordWriter's bytes).


def _masked_crc(data: bytes) -> bytes:
    # TFRecord stores CRCs rotated right by 15 bits plus a constant (TensorFlow's crc32c Mask).
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def frame_records(records: Sequence[bytes]) -> list[bytes]:
    """Each record framed as tf.io.TFRecordWriter writes it (uncompressed); concatenated framed
    records are a TFRecord file."""
    out: list[bytes] = []
    for record in records:
        length = struct.pack("<Q", len(record))
        out.append(b"".join((length, _masked_crc(length), record, _masked_crc(record))))
    return out


def write_round_robin(
    items: Iterable,
    serialize: Callable[[list], Sequence[bytes]],
    output_files: Sequence[str],
    batch_size: int,
) -> int:
    """Serializes `items` batch_size at a time (serialize(list of items) -> one record each),
    frames the records and writes record n to output file n mod the file count (the
    language-model blocks' and the denoising records' layout); returns the records written.
    Every opened file is closed, also on an error."""
    items = iter(items)
    files = []
    n = 0
    try:
        for path in output_files:
            files.append(open_file(path, "wb"))
        while batch := list(itertools.islice(items, batch_size)):
            for record in frame_records(serialize(batch)):
                files[n % len(files)].write(record)
                n += 1
    finally:
        for file in files:
            file.close()
    return n


def decode_example(record: bytes) -> dict[str, list]:
    """A serialized tf.train.Example as {feature name: values} (int64_list and float_list), read
    from the wire format without TensorFlow (for logging records in a process without it)."""

    def fields(data: bytes):
        """(field number, wire type, value) of a message: ints for varints, bytes otherwise."""
        i = 0
        while i < len(data):
            key, i = varint(data, i)
            kind = key & 7
            if kind == 0:
                value, i = varint(data, i)
            elif kind == 2:
                size, i = varint(data, i)
                value, i = data[i : i + size], i + size
            elif kind == 5:
                value, i = data[i : i + 4], i + 4
            else:
                raise ValueError(f"decode_example: unsupported wire type {kind}")
            yield key >> 3, kind, value

    def varint(data: bytes, i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, i

    out: dict[str, list] = {}
    for _, _, features in fields(record):  # Example.features
        for _, _, entry in fields(features):  # Features.feature map entries
            parts = {number: value for number, _, value in fields(entry)}
            values: list = []
            for kind_field, _, payload in fields(parts.get(2, b"")):  # Feature's one list
                for _, wire, value in fields(payload):
                    if kind_field == 3:  # int64_list: packed (bytes) or one varint each
                        if wire == 2:
                            j = 0
                            while j < len(value):
                                v, j = varint(value, j)
                                values.append(v - (1 << 64) if v >= 1 << 63 else v)
                        else:
                            values.append(value - (1 << 64) if value >= 1 << 63 else value)
                    elif kind_field == 2:  # float_list
                        values.extend(np.frombuffer(value, "<f4").tolist())
                    else:
                        raise ValueError("decode_example: bytes_list features are not read")
            out[parts[1].decode("utf-8")] = values
    return out


# --------------------------------------------------------------------------------------------
# Running it: a bounded window of chunks over worker processes, results written in order


@dataclasses.dataclass(frozen=True)
class ChunkShards:
    """What a worker returns for one chunk: its records framed and dealt to the shards.

    Attributes:
      file_index, chunk_index, num_bytes: the chunk's name and text size.
      num_records: records made from it.
      blocks: (shard, concatenated framed records of this chunk for that shard, their count),
        for each shard that gets records, in shard order.
      head: the chunk's first records, unframed (for logging examples).
    """

    file_index: int
    chunk_index: int
    num_bytes: int
    num_records: int
    blocks: list[tuple[int, bytes, int]]
    head: list[bytes]


def deal_framed(
    file_index: int, chunk_index: int, records: Sequence[bytes], num_shards: int
) -> list[tuple[int, bytes, int]]:
    """(shard, framed records, count) per shard that gets any of a chunk's records (shard_of),
    each shard's in their order within the chunk."""
    framed = frame_records(records)
    first = (file_index + chunk_index) % num_shards  # the shard of record 0
    blocks = []
    for shard in range(num_shards):
        mine = framed[(shard - first) % num_shards :: num_shards]  # j = shard - f - c (mod S)
        if mine:
            blocks.append((shard, b"".join(mine), len(mine)))
    return blocks


_worker_tokenizer = None  # set in each worker process by _set_tokenizer


def _set_tokenizer(tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def chunk_shards(chunk: TextChunk, settings: ChunkSettings, num_shards: int) -> ChunkShards:
    """A worker's whole job for one chunk: tokenize it (with the tokenizer _set_tokenizer gave
    this process), make its records, frame and deal them."""
    documents = tokenize_chunk(chunk, _worker_tokenizer, settings.sentence_objective)
    f, c = chunk.file_index, chunk.chunk_index
    records = chunk_records(f, c, documents, settings)
    blocks = deal_framed(f, c, records, num_shards)
    return ChunkShards(f, c, chunk.num_bytes, len(records), blocks, records[:5])


def create_shards(
    input_files: Sequence[str],
    output_files: Sequence[str],
    tokenizer,
    settings: ChunkSettings,
    num_workers: int = 1,
    chunk_bytes: int = 1 << 20,
    progress: Callable[[int, int], None] | None = None,
    log_records: Callable[[list[bytes]], None] | None = None,
) -> list[int]:
    """Writes the streaming records of `input_files` to `output_files` (see the module docstring).

    This process only reads and cuts the text and writes the blocks the workers return; each
    worker tokenizes, makes, frames and deals a chunk's records (chunk_shards). Neither imports
    TensorFlow for local paths. Files are written under temporary names and renamed into place
    only when all are complete.

    Args:
      tokenizer: a FullTokenizer (pickled once to each worker; its ASCII path is the fastest
        here), or with num_workers=1 anything read_documents takes.
      num_workers: processes for chunk_shards (1: all in this process).
      chunk_bytes: text per chunk: memory, and the documents a random next segment is drawn from.
      progress: called with (text bytes, records) after each chunk is written.
      log_records: called once with the first chunk's first records (for logging examples).

    Returns:
      Records written per output file.
    """
    num_shards = len(output_files)
    counts = [0] * num_shards
    tasks = ((chunk, settings, num_shards) for chunk in iter_text_chunks(input_files, chunk_bytes))

    def write(paths: list[str]) -> int:
        files = []
        try:
            for path in paths:
                files.append(open_file(path, "wb"))  # each opened one is closed below
            results = ordered_map(
                _chunk_shards_task,
                tasks,
                num_workers,
                initializer=_set_tokenizer,
                initargs=(tokenizer,),
            )
            for number, result in enumerate(results):
                if number == 0 and log_records is not None:
                    log_records(result.head)
                for shard, block, count in result.blocks:
                    files[shard].write(block)
                    counts[shard] += count
                if progress is not None:
                    progress(result.num_bytes, result.num_records)
        finally:
            for file in files:
                file.close()
        return sum(counts)

    start = time.perf_counter()
    total = write_atomically(list(output_files), write)
    seconds = time.perf_counter() - start
    logging.info(
        "%d records in %.1f s (%.0f instances/s) with %d worker(s): %s",
        total,
        seconds,
        total / max(seconds, 1e-9),
        num_workers,
        counts,
    )
    return counts


def _chunk_shards_task(task) -> ChunkShards:
    return chunk_shards(*task)
