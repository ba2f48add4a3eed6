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
from typing import TYPE_CHECKING

import numpy as np

from data_prep.errors import input_error
from data_prep.pretraining_shards import int64_example, packed_varints, write_round_robin
from data_prep.tokenization import read_utf8_lines

if TYPE_CHECKING:
    import tensorflow as tf

WRITE_BATCH = 512  # blocks serialized together: packed_varints works on a whole batch at once


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


def lm_feature_spec(block_size: int) -> dict:
    import tensorflow as tf

    return {"input_ids": tf.io.FixedLenFeature([block_size], tf.int64)}


def write_lm_tfrecords(blocks: Iterable[np.ndarray], output_files: Sequence[str]) -> int:
    """Writes blocks round-robin over the output files (block n to file n mod the file count);
    returns how many were written."""
    return write_round_robin(
        blocks, lambda batch: serialize_lm_examples(np.stack(batch)), output_files, WRITE_BATCH
    )


def _kind(reuse_len: int) -> str:
    return f"two-segment records, reuse_len {reuse_len}" if reuse_len else "blocks"


def check_lm_files(files: Sequence[str], block_size: int) -> int:
    """Reads each file's first record and checks it is an LM block of block_size ids, or
    XLNet's two-segment record of that many (data_prep/xlnet_data.py) in every file alike;
    raises InputError naming the file (masked BERT records, another length or a mix of kinds are
    refused here, not as a shape error deep in tf.data). Returns the records' reuse_len: 0 for
    blocks."""
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
            kinds.setdefault(reuse, path)
            if len(kinds) > 1:
                kind, first = next(iter(kinds.items()))
                raise input_error(
                    path, f"records like {first}'s ({_kind(kind)})", f"{_kind(reuse)}"
                )
            break
        else:
            raise input_error(path, "at least one record", "an empty file")
    return next(iter(kinds), 0)


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
) -> tf.data.Dataset:
    """Batches for a model with segment recurrence (XLNet's memory): row j of batch t+1
    is the block that follows row j of batch t in the corpus, as the released XLNet data's
    bsz_per_host streams and Transformer-XL's batchify. The N blocks of `files` (corpus_order)
    make batch_size x num_shards streams of n = N // (batch_size x num_shards) consecutive
    blocks (the rest dropped); this shard's batches hold streams shard_index x batch_size onward,
    repeated from the start of each stream every n batches (one pass of n without `repeat`),
    without shuffling. `spec`: the records' features (lm_dataset's).

    Reading: every epoch each stream skips to its start through the records before it, so a
    pass costs about batch_size / 2 reads of the shard's part of the files (record framing
    only; no parsing)."""
    import tensorflow as tf

    ordered = corpus_order(files)
    total = int(ordered.reduce(0, lambda count, _: count + 1))
    streams = batch_size * num_shards
    n = total // streams
    if n < 1:
        raise input_error(
            files[0],
            f"at least {streams} blocks (one for each of the batch's {streams} streams)",
            f"{total} blocks in {len(files)} file(s)",
        )
    first = shard_index * batch_size
    starts = tf.data.Dataset.range(first, first + batch_size).map(lambda g: g * n)
    rows = starts.interleave(
        lambda start: ordered.skip(start).take(n),
        cycle_length=batch_size,
        block_length=1,
        deterministic=True,
    )
    rows = rows.repeat() if repeat else rows
    return parsed_blocks(rows.batch(batch_size, drop_remainder=True), block_size, spec)
