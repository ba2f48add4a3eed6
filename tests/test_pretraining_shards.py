"""Streaming pre-training data (data_prep/pretraining_shards.py): protobuf-equal records, valid
masks, bounded buffers, and bytes that depend on the seed but not on the worker count."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from data_prep import masking, pretraining_data, pretraining_shards
from data_prep.errors import InputError
from data_prep.features import check_pretraining_files
from data_prep.pretraining_data import MaskingVocab, TrainingInstance, serialize_instance
from data_prep.pretraining_shards import (
    ChunkSettings,
    ExampleEncoder,
    chunk_records,
    create_shards,
    iter_text_chunks,
    mask_batch,
    nsp_pairs,
    packed_varints,
    tokenize_chunk,
)
from data_prep.tokenization import FullTokenizer
from tests import helpers

WORDS = "the a cat dog sat ran on mat big red un ##believ ##able play ##ing house tree . !".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


@pytest.fixture
def tokenizer(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return FullTokenizer(str(path), do_lower_case=True)


def write_corpus(path: Path, num_docs: int, seed: int) -> Path:
    rng = random.Random(seed)
    plain = [w for w in WORDS if not w.startswith("##") and w not in ".!"]
    lines = []
    for _ in range(num_docs):
        for _ in range(rng.randint(1, 6)):
            words = [
                rng.choice([*plain, "unbelievable", "playing"]) for _ in range(rng.randint(2, 9))
            ]
            lines.append(" ".join(words) + rng.choice(".!"))
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def settings(tokenizer, **overrides) -> ChunkSettings:
    base = dict(
        vocab=MaskingVocab.from_vocab(tokenizer.vocab),
        max_seq_length=23,
        max_predictions_per_seq=5,
        dupe_factor=3,
        short_seq_prob=0.1,
        masked_lm_prob=0.15,
        random_seed=11,
    )
    return ChunkSettings(**(base | overrides))


def random_instance(rng, seq, predictions, vocab_size, masked=True):
    n = rng.randint(1, seq)
    k = rng.randint(0, min(predictions, n))
    return TrainingInstance(
        array("i", [rng.randrange(vocab_size) for _ in range(n)]),
        bytes(rng.randint(0, 1) for _ in range(n)),
        rng.random() < 0.5,
        array("i", sorted(rng.sample(range(seq), k))) if masked else None,
        array("i", [rng.randrange(vocab_size) for _ in range(k)]) if masked else None,
    )


@pytest.mark.parametrize("seq, predictions, vocab_size", [(7, 3, 31), (301, 47, 70_001)])
def test_encoder_bytes_equal_protobufs_serialization(seq, predictions, vocab_size):
    # The reference is protobuf's own deterministic serializer (via serialize_instance); the
    # second size needs 2- and 3-byte varints for ids, positions and lengths.
    rng = random.Random(seq)
    encoder = ExampleEncoder(seq, predictions, vocab_size)
    for masked in (True, False):
        for _ in range(60):
            instance = random_instance(rng, seq, predictions, vocab_size, masked)
            assert encoder.encode_instance(instance) == serialize_instance(
                instance, seq, predictions
            )


def test_packed_varints_match_the_one_at_a_time_encoder():
    # _varint is what ExampleEncoder's table holds (a table of 2^22 entries takes seconds)
    rng = np.random.default_rng(3)
    for high in (2, 128, 129, 1 << 14, (1 << 14) + 1, 1 << 21, 1 << 22):
        values = rng.integers(0, high, (5, 13))
        values[0, 0] = high - 1  # the largest value sets the width
        want = [b"".join(map(pretraining_shards._varint, row)) for row in values.tolist()]
        assert packed_varints(values) == want
    encoder = ExampleEncoder(9, 2, 300)
    assert encoder.packed([0, 127, 128, 299]) == b"".join(
        map(pretraining_shards._varint, [0, 127, 128, 299])
    )


def corpus_documents(tokenizer, tmp_path, num_docs=19, seed=4):
    corpus = write_corpus(tmp_path / "docs.txt", num_docs, seed=seed)
    return pretraining_data.read_documents([str(corpus)], tokenizer)


@pytest.mark.parametrize("seq, short_seq_prob, dupe", [(23, 0.1, 3), (9, 0.5, 2), (5, 1.0, 1)])
def test_nsp_pairs_equal_the_general_instances(tmp_path, tokenizer, seq, short_seq_prob, dupe):
    # The reference: create_training_instances on the same rng state, unmasked.
    documents = corpus_documents(tokenizer, tmp_path)
    vocab = MaskingVocab.from_vocab(tokenizer.vocab)
    want = pretraining_data.create_training_instances(
        documents, vocab, seq, dupe, short_seq_prob, 0.15, 5, random.Random(7), static_masking=False
    )
    rng = random.Random(7)
    got = nsp_pairs(documents, seq, short_seq_prob, dupe, vocab, rng)
    assert len(got) == len(want) > 20
    labels = {label for *_, label in got}
    assert labels == ({True, False} if seq > 5 else {True})  # seq 5: one-token chunks
    for (ids, len_a, len_b, label), instance in zip(got, want, strict=True):
        assert ids == instance.input_ids.tobytes()
        assert bytes(len_a + 2) + b"\x01" * (len_b + 1) == instance.segment_ids
        assert label == instance.is_random_next
    reference_rng = random.Random(7)
    pretraining_data.create_training_instances(
        documents, vocab, seq, dupe, short_seq_prob, 0.15, 5, reference_rng, static_masking=False
    )
    assert rng.random() == reference_rng.random()  # the same number of draws consumed
    with pytest.raises(ValueError, match="two documents"):
        nsp_pairs(documents[:1], seq, short_seq_prob, dupe, vocab, rng)


def test_trim_draws_as_truncate_seq_pair():
    for len_a in range(0, 13):
        for len_b in range(0, 13):
            for limit in (1, 4, 9):
                tokens_a, tokens_b = list(range(len_a)), list(range(100, 100 + len_b))
                want = pretraining_data.truncate_seq_pair(
                    tokens_a, tokens_b, limit, random.Random(len_a * 31 + len_b)
                )
                rng = random.Random(len_a * 31 + len_b)
                fa, ba, fb, bb = pretraining_shards._trim(len_a, len_b, limit, rng.random)
                got = tokens_a[fa : len_a - ba], tokens_b[fb : len_b - bb]
                assert got == want, (len_a, len_b, limit)


def masking_batch(n, seq, rng):
    lengths = rng.integers(5, seq + 1, n)
    ids = np.zeros((n, seq), np.int32)
    for r, length in enumerate(lengths):
        a = rng.integers(1, length - 3)
        row = [2, *rng.integers(5, 24, a), 3, *rng.integers(5, 24, length - a - 3), 3]
        ids[r, :length] = row
    return ids, lengths


def test_mask_batch_chooses_valid_positions():
    rng = np.random.default_rng(0)
    vocab = MaskingVocab(2, 3, 4, tuple(range(24)), bytes(24))
    ids, lengths = masking_batch(31, 13, rng)
    out, positions, counts = mask_batch(ids, lengths, vocab, 0.3, 3, rng)
    assert out.shape == ids.shape and positions.shape == (31, 3)
    for r in range(31):
        k, length = counts[r], lengths[r]
        assert k == min(3, max(1, round(length * 0.3)))
        chosen = positions[r, :k].tolist()
        assert chosen == sorted(set(chosen)) and all(p < length for p in chosen)
        assert all(ids[r, p] not in (2, 3) for p in chosen)  # never [CLS] or [SEP]
        assert (positions[r, k:] == 0).all()
        untouched = np.setdiff1d(np.arange(13), chosen)
        assert (out[r, untouched] == ids[r, untouched]).all()


def test_mask_batch_rates_all_and_80_10_10():
    rng = np.random.default_rng(1)
    vocab = MaskingVocab(2, 3, 4, tuple(range(1000, 1024)), bytes(1024))
    ids, lengths = masking_batch(2001, 17, rng)
    candidates = (np.arange(17)[None] < lengths[:, None]) & (ids != 2) & (ids != 3)
    # Degenerate rate: masked_lm_prob 1.0 with room for all predicts every candidate.
    out, positions, counts = mask_batch(ids, lengths, vocab, 1.0, 17, rng)
    assert (counts == candidates.sum(1)).all()
    chosen = np.zeros_like(candidates)
    np.put_along_axis(chosen, positions, True, axis=1)
    chosen[:, 0] = False  # padding slots point at 0, which is [CLS]
    assert (chosen == candidates).all()
    # BERT's 80 / 10 / 10 over ~26k chosen positions (random ids are 1000+, never an input id).
    total = candidates.sum()
    assert abs((out[candidates] == 4).sum() / total - 0.8) < 0.01
    assert abs((out[candidates] >= 1000).sum() / total - 0.1) < 0.01
    assert abs((out[candidates] == ids[candidates]).sum() / total - 0.1) < 0.01


def test_mask_batch_samples_every_subset_equally_often():
    # Rows of 8 positions, [CLS] x x [SEP] x x x [SEP]: 5 candidates, 2 chosen (round(8 * 0.25)):
    # each of the 10 pairs is a tenth of 20,000 rows (binomial sd ~42, i.e. 2%; bound 10%).
    import itertools

    vocab = MaskingVocab(2, 3, 4, (9,), bytes(10))
    ids = np.tile(np.array([2, 5, 6, 3, 7, 8, 5, 3], np.int32), (20_000, 1))
    lengths = np.full(20_000, 8)
    _, positions, counts = mask_batch(ids, lengths, vocab, 0.25, 3, np.random.default_rng(5))
    assert (counts == 2).all() and (positions[:, 2] == 0).all()
    seen = {}
    for pair in map(tuple, positions[:, :2].tolist()):
        seen[pair] = seen.get(pair, 0) + 1
    assert set(seen) == set(itertools.combinations([1, 2, 4, 5, 6], 2))
    assert all(abs(c - 2000) < 200 for c in seen.values()), seen


def test_chunks_are_bounded_whole_documents(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "a.txt", 60, seed=1)
    documents = [d.split("\n") for d in corpus.read_text().strip("\n").split("\n\n")]
    longest = max(len("\n".join(d).encode()) + 2 for d in documents)  # + its end and a blank
    lines_read = []
    real = pretraining_shards.read_utf8_lines

    def counting(path, opener=None):
        for number, text in real(path, opener):
            lines_read.append(number)
            yield number, text

    monkeypatch.setattr(pretraining_shards, "read_utf8_lines", counting)
    chunks = iter_text_chunks([str(corpus), str(corpus)], chunk_bytes=300)
    first = next(chunks)
    # Lazy: the first chunk comes out while the second fills, not after the whole file is read.
    assert len(lines_read) < 0.5 * len(corpus.read_text().splitlines())
    got = [first, *chunks]
    assert [(c.file_index, c.chunk_index) for c in got if c.file_index == 0] == [
        (0, i) for i in range(sum(c.file_index == 0 for c in got))
    ]
    for chunk in got:
        assert len(chunk.documents) >= 2
        # closes at the first document end past chunk_bytes; a short tail (< 2 documents) joins
        assert chunk.num_bytes < 300 + 2 * longest
    assert [d for c in got if c.file_index == 0 for d in c.documents] == documents
    assert got[0].first_line == 1 and got[1].first_line == got[0].last_line + 1


def read_records(paths):
    return [[r.numpy() for r in tf.data.TFRecordDataset(str(p))] for p in paths]


def test_records_depend_on_the_seed_not_the_workers(tmp_path, tokenizer):
    corpus = [str(write_corpus(tmp_path / f"c{k}.txt", 17, seed=k)) for k in range(2)]
    s = settings(tokenizer)

    def run(name, workers, seed=11, shards=3):
        out = [tmp_path / name / f"s{k}.tfrecord" for k in range(shards)]
        out[0].parent.mkdir()
        conf = s if seed == 11 else settings(tokenizer, random_seed=seed)
        counts = create_shards(corpus, [str(p) for p in out], tokenizer, conf, workers, 200)
        assert counts == [len(r) for r in read_records(out)]
        return out

    one, two = run("one", 1), run("two", 2)
    assert read_records(one) == read_records(two)  # bytes equal, file by file
    assert sum(map(len, read_records(one))) > 150
    check_pretraining_files([str(p) for p in one], 23, 5)
    other = run("seed", 1, seed=12)
    assert read_records(other) != read_records(one)
    # Another shard count only deals the same records out differently.
    single = run("single", 1, shards=1)
    assert sorted(read_records(single)[0]) == sorted(sum(read_records(one), []))

    # Each chunk is the pure function of its documents: recompute the first file's first chunk.
    chunk = next(iter_text_chunks(corpus, 200))
    records = chunk_records(0, 0, tokenize_chunk(chunk, tokenizer, "nsp"), s)
    assert read_records(single)[0][: len(records)] == records


def test_a_failed_run_keeps_the_previous_shards_and_leaves_no_temporary_file(tmp_path, tokenizer):
    # create_shards writes through files.write_atomically: an error after some chunks were
    # written (here the progress callback) replaces nothing and removes the temporary files.
    corpus = [str(write_corpus(tmp_path / "c.txt", 17, seed=3))]
    out = [tmp_path / "out" / f"s{k}.tfrecord" for k in range(2)]
    out[0].parent.mkdir()
    for p in out:
        p.write_bytes(b"previous")

    def fail(num_bytes, num_records):
        raise RuntimeError("stopped after a chunk")

    with pytest.raises(RuntimeError, match="stopped after a chunk"):
        create_shards(corpus, [str(p) for p in out], tokenizer, settings(tokenizer), 1, 200, fail)
    assert [p.read_bytes() for p in out] == [b"previous", b"previous"]
    assert sorted(x.name for x in out[0].parent.iterdir()) == ["s0.tfrecord", "s1.tfrecord"]


@pytest.mark.parametrize(
    "overrides, masking_mode",
    [
        (dict(sentence_objective="sop", masking_scheme="whole_word"), "static"),
        (dict(sentence_objective="none", full_sentences=True, static_masking=False), "dynamic"),
        (dict(masking_scheme="span"), "static"),
    ],
)
def test_recipes_stream_valid_records(tmp_path, tokenizer, overrides, masking_mode):
    corpus = str(write_corpus(tmp_path / "c.txt", 13, seed=5))
    out = [str(tmp_path / "a.tfrecord")]
    create_shards([corpus], out, tokenizer, settings(tokenizer, **overrides), 1, 150)
    spans = overrides.get("masking_scheme") == "span"
    check_pretraining_files(out, 23, 5, masking=masking_mode, span_boundaries=spans)


def test_a_chunk_the_objective_cannot_use_is_named(tmp_path, tokenizer):
    corpus = tmp_path / "one_doc.txt"
    corpus.write_text("the cat sat.\nthe dog ran.\n")
    with pytest.raises(InputError, match=r"one_doc.txt:1-2 .*at least two documents"):
        create_shards([str(corpus)], [str(tmp_path / "x")], tokenizer, settings(tokenizer))
    assert not (tmp_path / "x").exists()


def test_workers_never_import_tensorflow():
    code = (
        "import sys; import data_prep.pretraining_shards; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    helpers.run_python(code)
    assert pretraining_data.MASKING_SCHEMES == masking.STATIC_SCHEMES


def test_framed_records_are_tf_record_writer_bytes(tmp_path):
    # The reference: TensorFlow's own writer, over lengths around the varint and 4-byte steps.
    rng = random.Random(9)
    sizes = [0, 1, 3, 4, 5, 127, 128, 129, 301, 16_385, *(rng.randrange(900) for _ in range(40))]
    records = [rng.randbytes(n) for n in sizes]
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    assert b"".join(pretraining_shards.frame_records(records)) == path.read_bytes()
    assert pretraining_shards.frame_records([]) == []


def test_deal_framed_puts_record_j_in_shard_of(tmp_path):
    records = [bytes([j]) * (j + 1) for j in range(11)]
    blocks = pretraining_shards.deal_framed(2, 5, records, 4)
    assert [shard for shard, _, _ in blocks] == [0, 1, 2, 3]
    for shard, block, count in blocks:
        path = tmp_path / f"{shard}.tfrecord"
        path.write_bytes(block)
        want = [
            r for j, r in enumerate(records) if pretraining_shards.shard_of(2, 5, j, 4) == shard
        ]
        assert read_records([path])[0] == want and count == len(want)
    assert [s for s, _, _ in pretraining_shards.deal_framed(0, 0, records[:2], 5)] == [0, 1]


def test_decode_example_reads_what_tf_train_example_reads():
    rng = random.Random(2)
    encoder = ExampleEncoder(13, 4, 300)
    for masked in (True, False):
        for _ in range(20):
            record = encoder.encode_instance(random_instance(rng, 13, 4, 300, masked))
            parsed = tf.train.Example.FromString(record).features.feature
            want = {k: list(v.int64_list.value or v.float_list.value) for k, v in parsed.items()}
            assert pretraining_shards.decode_example(record) == want
    # protobuf's own bytes, with a negative int64 and floats
    example = tf.train.Example()
    example.features.feature["a"].int64_list.value.extend([-3, 0, 1 << 40])
    example.features.feature["w"].float_list.value.extend([0.5, -2.0])
    got = pretraining_shards.decode_example(example.SerializeToString())
    assert got == {"a": [-3, 0, 1 << 40], "w": [0.5, -2.0]}


def test_streaming_entrypoint_never_imports_tensorflow(tmp_path):
    # Its import takes longer than the whole run on the default corpus at --dupe_factor=1.
    corpus = write_corpus(tmp_path / "c.txt", 9, seed=3)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    out = tmp_path / "out" / "a.tfrecord"
    code = (
        "import sys; from absl import flags; "
        "from data_prep import create_pretraining_data as m; "
        f"flags.FLAGS(['x', '--input_file={corpus}', '--output_file={out}', "
        f"'--vocab_file={vocab}', '--max_seq_length=23', '--max_predictions_per_seq=5', "
        "'--num_workers=2']); m.main(['x']); "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    result = helpers.run_python(code)
    assert "*** Example ***" in result.stderr  # the first records, decoded for the log
    check_pretraining_files([str(out)], 23, 5)
    # Its workers were forked (no TensorFlow there): the same bytes as one worker in this process
    # with the flags' defaults.
    tokenizer = FullTokenizer(str(vocab))
    conf = settings(tokenizer, dupe_factor=10, random_seed=12345)
    create_shards([str(corpus)], [str(tmp_path / "here.tfrecord")], tokenizer, conf, 1, 1 << 20)
    assert (tmp_path / "here.tfrecord").read_bytes() == out.read_bytes()
