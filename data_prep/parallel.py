"""Ordered work over worker processes, with a bounded window (no TensorFlow imported here).

  ordered_map  fn(item) for each item, in order, on `num_workers` processes, at most `window`
               items taken ahead of the results consumed (memory bounded however long the input)
  map_texts    encode(text) for each text, in order, the texts sent in batches of about
               `batch_chars` characters (the tokenizing step of create_lm_data.py and
               create_seq2seq_data.py)
  count_files  the sum of count(lines) -> Counter over pieces of text files, each read by a
               worker (build_vocab.py's word and pre-token counts)
  worker_pool  the processes themselves, for work that is not a map (the WordPiece learner's
               passes, tokenization._learn_like_tf_text)

Used by the streaming pretraining data (data_prep/pretraining_shards.py), the language-model
blocks (data_prep/create_lm_data.py), the denoising records (data_prep/create_seq2seq_data.py)
and vocabulary learning (data_prep/build_vocab.py, data_prep/tokenization.py).
Results never depend on the number of workers.
"""

from __future__ import annotations

import collections
import functools
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

from data_prep import tokenization


def worker_count(requested: int | None) -> int:
    """The scripts' --num_workers: `requested`, or without one the cores this process may use."""
    return requested or len(os.sched_getaffinity(0))


def start_method() -> str:
    """fork where this process has not imported TensorFlow (on Linux), else spawn: forking a
    process with TensorFlow's thread pools running can deadlock the child, while a spawned worker
    pays a fresh interpreter and its imports (about 0.35 CPU-s each here, a tenth of the default
    corpus' work at dupe_factor 1)."""
    return "spawn" if "tensorflow" in sys.modules or sys.platform != "linux" else "fork"


def worker_pool(
    num_workers: int, initializer: Callable | None = None, initargs: tuple = ()
) -> ProcessPoolExecutor:
    """A pool of `num_workers` processes started by start_method(), each first running
    initializer(*initargs) (inherited, not pickled, where they fork)."""
    context = multiprocessing.get_context(start_method())
    return ProcessPoolExecutor(
        num_workers, mp_context=context, initializer=initializer, initargs=initargs
    )


def ordered_map(
    fn: Callable,
    items: Iterable,
    num_workers: int,
    window: int | None = None,
    initializer: Callable | None = None,
    initargs: tuple = (),
) -> Iterator:
    """fn(item) for each item, in order. With num_workers > 1, on that many processes
    (start_method), each first running initializer(*initargs), taking at most `window`
    (default 2 x num_workers) items from `items` ahead of the results consumed, so memory stays
    bounded however long `items` is. With one worker, initializer and fn run in this process."""
    if num_workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, items)
        return
    window = window or 2 * num_workers
    with worker_pool(num_workers, initializer, initargs) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def text_batches(texts: Iterable[str], batch_chars: int) -> Iterator[list[str]]:
    """Consecutive texts in lists of at least batch_chars characters (the last may hold fewer);
    every text in exactly one list, in order."""
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


_worker_encode = None  # set in each worker process by _set_encode


def _set_encode(encode: Callable) -> None:
    global _worker_encode
    _worker_encode = encode


def _encode_batch(texts: list[str]) -> list:
    return list(map(_worker_encode, texts))


def map_texts(
    encode: Callable[[str], object],
    texts: Iterable[str],
    num_workers: int = 1,
    batch_chars: int = 1 << 18,
) -> Iterator:
    """encode(text) for each text, in order; with num_workers > 1 the texts go to that many
    processes in batches of about batch_chars characters (ordered_map: at most 2 x num_workers
    batches in flight). `encode` reaches the workers once, as the pool starts (pickled only where
    they are spawned: a bound method of a picklable tokenizer)."""
    if num_workers <= 1:
        yield from map(encode, texts)
        return
    batches = text_batches(texts, batch_chars)
    for encoded in ordered_map(
        _encode_batch, batches, num_workers, initializer=_set_encode, initargs=(encode,)
    ):
        yield from encoded


# count_files' default piece: large, so that a worker's Counter, sent back whole, costs little
# beside the counting.
COUNT_BATCH_BYTES = 1 << 20


def count_files(
    count: Callable[[list[str]], collections.Counter],
    paths: Iterable[str],
    num_workers: int,
    piece_bytes: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> collections.Counter:
    """The sum of count(lines) over the UTF-8 files' pieces of about `piece_bytes` bytes
    (tokenization.utf8_line_ranges; default COUNT_BATCH_BYTES), counted on `num_workers`
    processes. Each worker reads and decodes its own pieces (tokenization.read_utf8_range): this
    process sends only their offsets, where sending the lines themselves cost it more than a
    tenth of the counting on the default corpus. `count` must be picklable (a module's function
    or a functools.partial of one); progress(bytes), if given, is called after each piece."""
    counts: collections.Counter = collections.Counter()
    pieces = (
        (path, start, end)
        for path in paths
        for start, end in tokenization.utf8_line_ranges(path, piece_bytes or COUNT_BATCH_BYTES)
    )
    for part, size in ordered_map(functools.partial(_count_piece, count), pieces, num_workers):
        counts.update(part)
        if progress is not None:
            progress(size)
    return counts


def _count_piece(count, piece: tuple[str, int, int]) -> tuple[collections.Counter, int]:
    path, start, end = piece
    return count(tokenization.read_utf8_range(path, start, end)), end - start
