"""LM blocks: packing across documents with a separator, TFRecord round trip, file checks, and
create_lm_data.py's records: protobuf's and TensorFlow's bytes, written without TensorFlow."""

import re

import numpy as np
import pytest
from tqdm import tqdm

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
    sizes = []  # the progress callback: the lines' bytes before each document and at file ends
    assert list(lm_data.read_lm_documents([str(a), str(b)], progress=sizes.append)) == [
        "One .\nTwo .",
        "Three .",
        "Four .",
    ]
    assert sizes == [13, 9, 7] and sum(sizes) == a.stat().st_size + b.stat().st_size
    b.write_text("\u00e9t\u00e9 .\n", encoding="utf-8")  # two-byte characters
    sizes.clear()
    assert list(lm_data.read_lm_documents([str(b)], progress=sizes.append)) == ["\u00e9t\u00e9 ."]
    assert sizes == [b.stat().st_size] == [8]
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


def tensorflow_records(blocks, output_files) -> None:
    """What the blocks' files were before records were written without TensorFlow."""
    from tests import helpers

    helpers.write_tensorflow_records(({"input_ids": b} for b in blocks), output_files)


def test_records_are_tensorflows_bytes(tmp_path, monkeypatch):
    import tensorflow as tf

    rng = np.random.default_rng(3)
    # ids of one, two and three varint bytes (GPT-2's vocabulary reaches 50,256), 11 blocks
    # written 4 at a time so the last batch is short
    blocks = [rng.integers(0, 60_000, 9).astype(np.int32) for _ in range(10)]
    blocks.append(np.array([0, 1, 127, 128, 16383, 16384, 50256, 5, 2], np.int32))
    monkeypatch.setattr(lm_data, "WRITE_BATCH", 4)
    ours = [tmp_path / "a.tfrecord", tmp_path / "b.tfrecord", tmp_path / "c.tfrecord"]
    theirs = [tmp_path / "ta.tfrecord", tmp_path / "tb.tfrecord", tmp_path / "tc.tfrecord"]
    assert lm_data.write_lm_tfrecords(iter(blocks), [str(f) for f in ours]) == 11
    tensorflow_records(blocks, theirs)
    assert [f.read_bytes() for f in ours] == [f.read_bytes() for f in theirs]
    first = next(iter(tf.data.TFRecordDataset(str(theirs[0])))).numpy()
    assert lm_data.serialize_lm_examples(np.stack(blocks[:1]))[0] == first


def test_create_lm_data_forks_its_workers_without_tensorflow_and_equals_one_process(tmp_path):
    """The script in a fresh interpreter, 2 workers over a corpus of several tokenizing batches:
    no TensorFlow imported (so the workers were forked), and the files are those that one
    process writes through TensorFlow."""
    from data_prep import bpe
    from tests import helpers

    documents = [
        "\n".join(f"Line {d}.{i}: word{(d * 7 + i) % 13} \u00e9t\u00e9 {d * i}." for i in range(60))
        for d in range(500)
    ]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    assert corpus.stat().st_size > 3 * (1 << 18)  # more batches (map_texts) than workers
    merges = bpe.learn_bpe(bpe.byte_words(documents[:20]), 80)
    tok = bpe.ByteLevelBPE(bpe.byte_level_vocab(merges), merges)
    enc, mer = tok.save(tmp_path / "bpe")
    outputs = [str(tmp_path / "out" / "a.tfrecord"), str(tmp_path / "out" / "b.tfrecord")]
    stdout, (tensorflow_imported, start_method), stderr = helpers.run_data_script_alone(
        "data_prep/create_lm_data.py",
        [
            f"--input_file={corpus}",
            f"--output_file={','.join(outputs)}",
            f"--encoder_file={enc}",
            f"--merges_file={mer}",
            "--block_size=64",
            "--num_workers=2",
        ],
    )
    assert not tensorflow_imported and start_method == "fork"
    assert "500 documents" in stdout and "2 worker(s)" in stdout
    # The progress bar over the corpus' bytes, done (tqdm's last line: size, rate, time left)
    size = tqdm.format_sizeof(corpus.stat().st_size)
    assert re.search(rf"encoding: 100%.*{size}/{size} \[[0-9:]+<00:00, .*B/s\]", stderr), stderr
    ids = [tok.encode(d) for d in documents]
    theirs = [tmp_path / "ta.tfrecord", tmp_path / "tb.tfrecord"]
    tensorflow_records(lm_data.pack_blocks(ids, 64, tok.encoder["<|endoftext|>"]), theirs)
    assert [open(f, "rb").read() for f in outputs] == [f.read_bytes() for f in theirs]


@pytest.mark.parametrize("n", [0, 1, 8192, 2 * 8192 + 5])
def test_count_records_counts_every_record_across_batches(n):
    """count_records reads in batches of 8,192: empty, one, exactly a batch and a part batch."""
    import tensorflow as tf

    records = tf.data.Dataset.range(n).map(tf.strings.as_string)
    assert lm_data.count_records(records) == n
