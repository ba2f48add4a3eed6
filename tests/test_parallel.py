"""Ordered work on worker processes (data_prep/parallel.py): order kept, a bounded window, and
results equal to one process's under either start method."""

from __future__ import annotations

import pytest

from data_prep import bpe, parallel
from data_prep.errors import InputError


def test_ordered_map_keeps_order_and_a_bounded_window():
    pulled = []

    def items():
        for i in range(9):
            pulled.append(i)
            yield -i

    results = parallel.ordered_map(abs, items(), num_workers=2, window=3)
    for consumed, value in enumerate(results, start=1):
        assert value == consumed - 1
        assert len(pulled) - consumed <= 3  # never more than the window ahead


def test_text_batches_hold_every_text_once_in_order():
    texts = [f"t{i}" * (i % 5) for i in range(23)]  # some empty
    batches = list(parallel.text_batches(texts, 7))
    assert [t for b in batches for t in b] == texts
    assert all(sum(map(len, b)) >= 7 for b in batches[:-1])
    # a batch closes at the first text that reaches the size: without its last text it is short
    assert all(sum(map(len, b[:-1])) < 7 for b in batches)
    assert list(parallel.text_batches([], 7)) == []


def test_start_method_forks_only_without_tensorflow(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorflow", object())
    assert parallel.start_method() == "spawn"
    monkeypatch.delitem(sys.modules, "tensorflow")
    assert parallel.start_method() == ("fork" if sys.platform == "linux" else "spawn")


SENTENCES = [
    "Shall I compare thee to a summer's day?",
    "Thou art more lovely and more temperate:",
    "Rough winds do shake the darling buds of May,",
    "  and summer's lease hath all too short a date; 1609 \u00e9t\u00e9 \u4e00",
    "",
]


@pytest.mark.parametrize("workers", [1, 3])
def test_map_texts_equals_one_process_on_spawned_workers(monkeypatch, workers):
    # Spawned: the tokenizer is pickled to each worker (ByteLevelBPE as its vocabulary and
    # merges); forked workers are create_lm_data.py's, tested in tests/test_lm_data.py.
    monkeypatch.setattr(parallel, "start_method", lambda: "spawn")
    merges = bpe.learn_bpe(bpe.byte_words(SENTENCES), 60)
    tok = bpe.ByteLevelBPE(bpe.byte_level_vocab(merges), merges)
    texts = [SENTENCES[(7 * i) % len(SENTENCES)] * (i % 4) for i in range(40)]
    want = [tok.encode(t) for t in texts]
    got = list(parallel.map_texts(tok.encode, iter(texts), workers, batch_chars=90))
    assert got == want and len(got) == 40


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_count_files_sums_the_pieces_on_workers(tmp_path, monkeypatch, method):
    monkeypatch.setattr(parallel, "start_method", lambda: method)
    texts = [SENTENCES[(3 * i) % len(SENTENCES)] for i in range(50)]
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    paths[0].write_text("\n".join(texts[:30]) + "\n", encoding="utf-8")
    paths[1].write_text("\r\n".join(texts[30:]), encoding="utf-8")  # no final line end
    sizes = []
    got = parallel.count_files(
        bpe.count_pretokens, map(str, paths), 2, piece_bytes=100, progress=sizes.append
    )
    assert got == bpe.count_pretokens(texts)
    assert len(sizes) > 4 and sum(sizes) == sum(p.stat().st_size for p in paths)  # every byte


def test_a_bad_byte_met_on_a_worker_reaches_the_caller(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"fine text\n" * 40 + b"bad \xff here\n" + b"more\n" * 10)
    with pytest.raises(InputError, match=r"corpus.txt:41: expected UTF-8 text, found byte 0xff"):
        parallel.count_files(bpe.count_pretokens, [str(path)], 2, piece_bytes=64)


def test_an_error_reading_the_texts_reaches_the_caller_with_workers_running(monkeypatch):
    # A bad line met while batches are on the workers (create_lm_data.py's InputError for bad
    # UTF-8): raised to the caller after the results before it, the pool shut down, no hang.
    monkeypatch.setattr(parallel, "start_method", lambda: "spawn")

    def texts():
        for i in range(30):
            yield "x" * i
        raise ValueError("corpus.txt:31: bad line")

    got = []
    with pytest.raises(ValueError, match="corpus.txt:31"):
        for ids in parallel.map_texts(len, texts(), 2, batch_chars=40):
            got.append(ids)
    assert got == list(range(len(got))) and len(got) < 30
