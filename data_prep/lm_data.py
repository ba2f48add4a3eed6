"""Left-to-right language-model data: corpus documents -> byte-level BPE ids -> contiguous blocks.

GPT-2's recipe (Radford et al. 2019, sec. 2.3, and its released training code): documents are
concatenated with an end-of-text token after each, and the stream is cut into blocks of exactly
`block_size` tokens, so no position is padding and a block may hold the end of one document and
the start of the next. Position t of a block is trained to predict token t + 1.

  read_lm_documents   the BERT corpus format (one sentence a line, blank lines between documents)
                      -> one text per document, sentences joined by newlines
  pack_blocks         streams documents' ids into full blocks (bounded memory: one block buffered)
  write_lm_tfrecords  blocks -> TFRecord shards, feature `input_ids` (int64, block_size)
  lm_dataset          shuffled, repeated, batched blocks for training, or one pass for evaluation

Making blocks imports no TensorFlow: records are serialized and framed as the streaming pretraining
data's are (data_prep/pretraining_shards.py; the same bytes as tf.train.Example and
tf.io.TFRecordWriter, tested), so create_lm_data.py forks its tokenizing workers
(data_prep/parallel.py) and skips TensorFlow's start-up. The readers import it when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from data_prep.errors import input_error
from data_prep.pretraining_shards import int64_example, packed_varints, write_round_robin
from data_prep.tokenization import read_utf8_lines

if TYPE_CHECKING:
    import tensorflow as tf

WRITE_BATCH = 512  # blocks serialized together: packed_varints works on a whole batch at once
# XLNet's bidirectional data (the release's bi_data): 1 on the records made from the text read
# backward, 0 on the others; create_lm_data.py --bi_data writes the forward records, then these.
BACKWARD = "backward"


class LMKind(NamedTuple):
    """What check_lm_files found: reuse_len > 0 for XLNet's two-segment records (0: blocks);
    bi_data for records in both directions (each with its BACKWARD flag)."""

    reuse_len: int = 0
    bi_data: bool = False

    def __str__(self) -> str:
        kind = f"two-segment records, reuse_len {self.reuse_len}" if self.reuse_len else "blocks"
        return kind + (" in both directions (bi_data)" if self.bi_data else "")


def read_lm_documents(
    paths: Sequence[str], progress: Callable[[int], None] | None = None
) -> Iterator[str]:
    """Yields each document of the corpus files as one text, its sentences joined by "\\n".

    A file's end also ends a document. Bad UTF-8 raises InputError naming the file and line.
    progress(n), if given, is called before each document with the UTF-8 bytes of the lines
    read since the last call (each line ending counted as one byte), and at each file's end,
    for a progress bar over the files' sizes.
    """
    for path in paths:
        current: list[str] = []
        read = 0
        for _, line in read_utf8_lines(path):
            if progress is not None:
                read += (len(line) if line.isascii() else len(line.encode("utf-8"))) + 1
            if line.strip():
                current.append(line.strip())
            elif current:
                if progress is not None:
                    progress(read)
                    read = 0
                yield "\n".join(current)
                current = []
        if progress is not None and read:
            progress(read)
        if current:
            yield "\n".join(current)


def pack_blocks(
    documents: Iterable[Sequence[int]], block_size: int, separator_id: int
) -> Iterator[np.ndarray]:
    """Concatenates documents (each followed by separator_id) and yields int32 blocks of exactly
    block_size ids; the final partial block is dropped. Holds at most one block plus one
    document in memory."""
    if block_size < 2:
        raise ValueError(
            f"block_size must be at least 2 (an input and its next token): {block_size}"
        )
    buffer: list[int] = []
    for ids in documents:
        buffer.extend(ids)
        buffer.append(separator_id)
        while len(buffer) >= block_size:
            yield np.asarray(buffer[:block_size], np.int32)
            del buffer[:block_size]


def serialize_lm_examples(blocks: np.ndarray) -> list[bytes]:
    """Each row of a non-negative [n, block_size] id array as a tf.train.Example with the int64
    feature `input_ids`."""
    return [int64_example({"input_ids": ids}) for ids in packed_varints(blocks)]


def serialize_records(records: Sequence[dict]) -> list[bytes]:
    """Records (dicts of non-negative int arrays, every record with the first one's keys) as
    tf.train.Examples of int64 features."""
    packed = {k: packed_varints(np.stack([r[k] for r in records])) for k in records[0]}
    return [int64_example({k: v[i] for k, v in packed.items()}) for i in range(len(records))]


def bidirectional(forward: Iterable[dict], backward: Iterable[dict]) -> Iterator[dict]:
    """XLNet's bidirectional data: the forward records, then the backward ones (made from the
    corpus read backward: backward_documents), each with its BACKWARD flag. One write keeps
    that order in the files (block n in file n mod the file count), which stream_dataset reads."""
    for flag, records in enumerate((forward, backward)):
        for record in records:
            yield {**record, BACKWARD: np.array([flag], np.int32)}


def backward_documents(documents: Sequence[Sequence]) -> Iterator[list]:
    """The corpus read backward: the documents last to first, each one's ids reversed (a
    document of sentences: the sentences last to first, each one's ids reversed), so the
    separator written after each still ends it in the reading direction."""
    for doc in reversed(documents):
        if len(doc) and isinstance(doc[0], Sequence | np.ndarray):
            yield [list(sentence)[::-1] for sentence in reversed(doc)]
        else:
            yield list(doc)[::-1]


def lm_feature_spec(block_size: int) -> dict:
    import tensorflow as tf

    return {"input_ids": tf.io.FixedLenFeature([block_size], tf.int64)}


def write_lm_tfrecords(blocks: Iterable[np.ndarray], output_files: Sequence[str]) -> int:
    """Writes blocks round-robin over the output files (block n to file n mod the file count);
    returns how many were written."""
    return write_round_robin(
        blocks, lambda batch: serialize_lm_examples(np.stack(batch)), output_files, WRITE_BATCH
    )


def check_lm_files(files: Sequence[str], block_size: int, xlnet: bool = False) -> LMKind:
    """Reads each file's first record and checks it is an LM block of block_size ids, or with
    `xlnet` also XLNet's two-segment record of that many (data_prep/xlnet_data.py) or a record
    of its bidirectional data, in every file alike; raises InputError naming the file (masked
    BERT records, another length, XLNet's records for another model or a mix of kinds are
    refused here, not as a shape error deep in tf.data). Returns the records' LMKind."""
    import tensorflow as tf

    kinds = {}
    for path in files:
        for raw in tf.data.TFRecordDataset(path).take(1):
            example = tf.train.Example.FromString(raw.numpy())
            feats = example.features.feature
            if "input_ids" not in feats or "masked_lm_positions" in feats:
                raise input_error(
                    path, "language-model blocks (feature input_ids only)", f"{sorted(feats)}"
                )
            found = len(feats["input_ids"].int64_list.value)
            if found != block_size:
                raise input_error(path, f"blocks of {block_size} ids (n_ctx)", f"{found} ids")
            reuse = feats["reuse_len"].int64_list.value[0] if "reuse_len" in feats else 0
            kind = LMKind(reuse, BACKWARD in feats)
            if kind != LMKind() and not xlnet:
                raise input_error(path, "language-model blocks (feature input_ids only)", str(kind))
            kinds.setdefault(kind, path)
            if len(kinds) > 1:
                first_kind, first = next(iter(kinds.items()))
                raise input_error(path, f"records like {first}'s ({first_kind})", str(kind))
            break
        else:
            raise input_error(path, "at least one record", "an empty file")
    return next(iter(kinds))


def lm_dataset(
    files: Sequence[str],
    batch_size: int,
    block_size: int,
    is_training: bool,
    seed: int = 12345,
    num_shards: int = 1,
    shard_index: int = 0,
    spec: dict | None = None,
) -> tf.data.Dataset:
    """Batches of {"input_ids": int32 (B, block_size)} (or of every feature of `spec`, int32).
    Training repeats and shuffles with a fixed seed (a plain iterator, checkpointable for exact
    resume); evaluation is one pass. Batches drop the remainder so every replica gets equal
    slices."""
    import tensorflow as tf

    records = tf.data.TFRecordDataset(list(files))
    if num_shards > 1:
        records = records.shard(num_shards, shard_index)
    if is_training:
        records = records.repeat().shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
    return parsed_blocks(records.batch(batch_size, drop_remainder=True), block_size, spec)


def parsed_blocks(
    batches: tf.data.Dataset, block_size: int, spec: dict | None = None
) -> tf.data.Dataset:
    """Batches of serialized blocks -> {"input_ids": int32 (B, block_size)} (or every feature
    of `spec`, as int32), prefetched."""
    import tensorflow as tf

    spec = spec or lm_feature_spec(block_size)

    def parse(serialized):
        return {k: tf.cast(v, tf.int32) for k, v in tf.io.parse_example(serialized, spec).items()}

    return batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(
        tf.data.AUTOTUNE
    )


def corpus_order(files: Sequence[str]) -> tf.data.Dataset:
    """The serialized blocks of one write_lm_tfrecords output (`files` its shards, in order) in
    the order they were made: block n sits in file n mod the file count."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(list(files)).interleave(
        tf.data.TFRecordDataset, cycle_length=len(files), block_length=1, deterministic=True
    )


def stream_dataset(
    files: Sequence[str],
    batch_size: int,
    block_size: int,
    num_shards: int = 1,
    shard_index: int = 0,
    spec: dict | None = None,
    repeat: bool = True,
    bi_data: bool = False,
) -> tf.data.Dataset:
    """Batches for a model with segment recurrence (XLNet's memory): row j of batch t+1
    is the block that follows row j of batch t in the corpus, as the released XLNet data's
    bsz_per_host streams and Transformer-XL's batchify. The N blocks of `files` (corpus_order)
    make batch_size x num_shards streams of n = N // (batch_size x num_shards) consecutive
    blocks (the rest dropped); this shard's batches hold streams shard_index x batch_size onward,
    repeated from the start of each stream every n batches (one pass of n without `repeat`),
    without shuffling. `spec`: the records' features (lm_dataset's). bi_data: the files hold
    forward records, then backward ones (lm_data.bidirectional); each direction makes
    batch_size / 2 x num_shards streams of n = min(forward, backward) // that many, and every
    batch holds this shard's forward streams, then its backward ones.

    Reading: every epoch each stream skips to its start, which TFRecordDataset does by its
    record headers alone (skipping 200,000 records of 128 ids through corpus_order's interleave
    took 0.1 s, 67th session); the files are counted once per build, in batches."""
    import tensorflow as tf

    ordered = corpus_order(files)
    if bi_data:
        if batch_size % 2:
            raise ValueError(f"bi_data: expected an even batch size, found {batch_size}")
        forward, backward = direction_counts(ordered, files)
        per_direction, offsets, each = batch_size // 2, (0, forward), " each way"
        total = min(forward, backward)
        found = f"{forward} forward and {backward} backward blocks in {len(files)} file(s)"
    else:
        total = count_records(ordered)
        per_direction, offsets, each = batch_size, (0,), ""
        found = f"{total} blocks in {len(files)} file(s)"
    streams = per_direction * num_shards
    n = total // streams
    if n < 1:
        where = f"one for each of the batch's {streams} streams{each}"
        raise input_error(files[0], f"at least {streams} blocks{each} ({where})", found)
    first = shard_index * per_direction
    starts = [offset + g * n for offset in offsets for g in range(first, first + per_direction)]
    rows = tf.data.Dataset.from_tensor_slices(tf.constant(starts, tf.int64)).interleave(
        lambda start: ordered.skip(start).take(n),
        cycle_length=batch_size,
        block_length=1,
        deterministic=True,
    )
    rows = rows.repeat() if repeat else rows
    return parsed_blocks(rows.batch(batch_size, drop_remainder=True), block_size, spec)


def count_records(records: tf.data.Dataset) -> int:
    """How many elements `records` (serialized records) holds, read in batches: a reduce over
    single records costs about 50 us each in tf.data's loop (200,000 records of 128 ids: 9.3 s
    against 0.7 s in batches of 8,192, 67th session)."""
    import tensorflow as tf

    def add(count, batch):
        return count + tf.shape(batch, out_type=tf.int64)[0]

    return int(records.batch(8192).reduce(tf.constant(0, tf.int64), add))


def direction_counts(ordered: tf.data.Dataset, files: Sequence[str]) -> tuple[int, int]:
    """(forward, backward) records of bidirectional data in corpus order (their BACKWARD
    flags); raises InputError naming the first file if a forward record follows a backward one
    (bidirectional's order, which stream_dataset's streams rely on)."""
    import tensorflow as tf

    spec = {BACKWARD: tf.io.FixedLenFeature([1], tf.int64)}
    flags = ordered.batch(4096).map(lambda x: tf.io.parse_example(x, spec)[BACKWARD][:, 0])

    def count(state, flag):
        forward, backward, misplaced = state
        turns = tf.reduce_sum(tf.cast(flag[1:] < flag[:-1], tf.int64))  # a 0 after a 1
        late = tf.cast(backward > 0, tf.int64) * tf.reduce_sum(1 - flag)  # a 0 after earlier 1s
        n = tf.reduce_sum(flag)
        return forward + tf.size(flag, tf.int64) - n, backward + n, misplaced + turns + late

    zero = tf.constant(0, tf.int64)
    forward, backward, misplaced = (int(v) for v in flags.reduce((zero, zero, zero), count))
    if misplaced:
        raise input_error(
            files[0],
            "forward records, then backward ones (create_lm_data.py --bi_data's order)",
            "a forward record after a backward one",
        )
    return forward, backward
