"""LM blocks: packing across documents with a separator, TFRecord round trip, file checks."""

import numpy as np
import pytest

from data_prep import lm_data
from data_prep.errors import InputError


def test_blocks_are_the_separated_stream_cut_exactly():
    docs = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11]]
    blocks = list(lm_data.pack_blocks(docs, 4, 0))
    stream = [1, 2, 3, 0, 4, 0, 5, 6, 7, 8, 9, 0, 10, 11, 0]
    assert [b.tolist() for b in blocks] == [stream[0:4], stream[4:8], stream[8:12]]
    assert all(b.dtype == np.int32 for b in blocks)
    assert list(lm_data.pack_blocks([[1]], 4, 0)) == []  # too short for one block: none
    with pytest.raises(ValueError, match="at least 2"):
        list(lm_data.pack_blocks(docs, 1, 0))


def test_documents_come_from_the_corpus_format(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("One .\nTwo .\n\n\nThree .\n", encoding="utf-8")
    b.write_text("Four .\n", encoding="utf-8")
    assert list(lm_data.read_lm_documents([str(a), str(b)])) == [
        "One .\nTwo .",
        "Three .",
        "Four .",
    ]
    a.write_bytes(b"ok\n\xff\n")
    with pytest.raises(InputError, match="a.txt:2"):
        list(lm_data.read_lm_documents([str(a)]))


def test_tfrecords_round_trip_and_bad_files_are_named(tmp_path):
    from tests import helpers

    blocks = [np.arange(i, i + 7, dtype=np.int32) for i in range(0, 50, 7)]
    files = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    assert lm_data.write_lm_tfrecords(blocks, files) == 8
    lm_data.check_lm_files(files, 7)
    got = [b["input_ids"].numpy() for b in lm_data.lm_dataset(files, 3, 7, is_training=False)]
    assert [x.shape for x in got] == [(3, 7), (3, 7)]  # 8 blocks, remainder dropped
    seen = {tuple(r) for r in np.concatenate(got)}
    assert seen <= {tuple(b) for b in blocks} and len(seen) == 6
    train = lm_data.lm_dataset(files, 3, 7, is_training=True, seed=1)
    first = [b["input_ids"].numpy() for b in train.take(5)]
    again = [b["input_ids"].numpy() for b in lm_data.lm_dataset(files, 3, 7, True, seed=1).take(5)]
    np.testing.assert_array_equal(first, again)  # seeded: the same order every time
    with pytest.raises(InputError, match=r"a.tfrecord: expected blocks of 9 ids"):
        lm_data.check_lm_files(files, 9)
    bert = tmp_path / "bert.tfrecord"
    helpers.write_synthetic_pretraining_file(bert, 2, 7, 2, 30)
    with pytest.raises(InputError, match=r"bert.tfrecord: expected language-model blocks"):
        lm_data.check_lm_files([str(bert)], 7)
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty file"):
        lm_data.check_lm_files([str(empty)], 7)
