"""The Apache Beam pipeline (data_prep/beam_pipeline.py) writes the local streaming path's shards
byte for byte, on Beam's DirectRunner in this process."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import tensorflow as tf

from data_prep import beam_pipeline
from data_prep.errors import InputError
from data_prep.pretraining_data import MaskingVocab
from data_prep.pretraining_shards import ChunkSettings, create_shards
from data_prep.tokenization import FullTokenizer, InGraphTokenizer
from tests.test_pretraining_shards import VOCAB, write_corpus


@pytest.fixture(scope="module")
def vocab():
    return {token: i for i, token in enumerate(VOCAB)}


@pytest.fixture(scope="module")
def tokenizer(vocab):
    return InGraphTokenizer(vocab, do_lower_case=True)


def make_tokenizer(vocab):
    """The workers' tokenizer factory, as pretraining_data.vocab_tokenizer makes it."""
    return functools.partial(FullTokenizer.from_vocab, vocab, do_lower_case=True)


def settings(vocab, **overrides) -> ChunkSettings:
    base = dict(
        vocab=MaskingVocab.from_vocab(vocab),
        max_seq_length=19,
        max_predictions_per_seq=4,
        dupe_factor=2,
        short_seq_prob=0.2,
        masked_lm_prob=0.15,
        random_seed=3,
    )
    return ChunkSettings(**(base | overrides))


def file_bytes(paths) -> list[bytes]:
    return [Path(p).read_bytes() for p in paths]


@pytest.mark.parametrize(
    "overrides, num_shards",
    [
        ({}, 3),  # BERT's recipe: nsp_pairs and batch masking
        # the general path, and more shards than records: the empty shards are written too
        (dict(sentence_objective="sop", masking_scheme="whole_word"), 131),
    ],
)
def test_direct_runner_writes_the_local_shards(tmp_path, vocab, tokenizer, overrides, num_shards):
    corpus = [str(write_corpus(tmp_path / f"c{k}.txt", 11 + 4 * k, seed=k)) for k in range(2)]
    conf = settings(vocab, **overrides)
    local = [str(tmp_path / "local" / f"s{k}.tfrecord") for k in range(num_shards)]
    on_beam = [str(tmp_path / "beam" / f"s{k}.tfrecord") for k in range(num_shards)]
    for folder in ("local", "beam"):
        (tmp_path / folder).mkdir()
    counts = create_shards(corpus, local, tokenizer, conf, num_workers=1, chunk_bytes=250)
    beam_pipeline.run(corpus, on_beam, make_tokenizer(vocab), conf, chunk_bytes=250)
    assert sum(counts) > 40 and (0 in counts) == (num_shards == 131)
    assert file_bytes(on_beam) == file_bytes(local)
    assert sorted(p.name for p in (tmp_path / "beam").iterdir()) == sorted(
        Path(p).name for p in on_beam
    )  # no temporary file left behind
    if num_shards == 3:  # another chunk size changes the records: the comparison can fail
        other = [str(tmp_path / "beam" / f"o{k}.tfrecord") for k in range(num_shards)]
        beam_pipeline.run(corpus, other, make_tokenizer(vocab), conf, chunk_bytes=400)
        assert file_bytes(other) != file_bytes(local)


def test_deal_matches_shard_of_and_keeps_order():
    records = [bytes([j]) for j in range(7)]
    dealt = list(beam_pipeline.deal(2, 5, records, 3))
    # (f + c + j) mod 3 with f + c = 7: j = 0 -> shard 1, j = 1 -> shard 2, j = 2 -> shard 0 ...
    assert dealt == [
        (0, (2, 5, [records[2], records[5]])),
        (1, (2, 5, [records[0], records[3], records[6]])),
        (2, (2, 5, [records[1], records[4]])),
    ]


def test_a_bad_chunk_fails_the_pipeline_naming_its_lines(tmp_path, vocab):
    corpus = tmp_path / "one_doc.txt"
    corpus.write_text("the cat sat.\nthe dog ran.\n")
    out = tmp_path / "x.tfrecord"
    with pytest.raises(Exception) as raised:
        beam_pipeline.run([str(corpus)], [str(out)], make_tokenizer(vocab), settings(vocab))
    # Beam wraps a worker's exception in its own; the InputError's message is in the chain.
    chain, error = [], raised.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, InputError) for e in chain) or "one_doc.txt:1-2" in str(raised.value)
    assert "one_doc.txt:1-2" in "".join(map(str, chain))
    assert not out.exists()


def test_the_pipeline_reads_through_tf_gfile_for_urls(tmp_path, monkeypatch):
    # A path with a scheme is opened with tf.io.gfile (gs://, hdfs://); ram:// is TF's in-memory
    # filesystem, so this runs offline.
    path = "ram://beam_test/corpus.txt"
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("a b.\nc d.\n\ne f.\n")
    chunks = list(beam_pipeline.read_chunks((4, path), chunk_bytes=1))
    assert [(c.file_index, c.chunk_index, c.documents) for c in chunks] == [
        (4, 0, [["a b.", "c d."], ["e f."]])
    ]


def test_direct_runner_writes_the_local_shards_of_an_albert_sentencepiece_model(tmp_path, vocab):
    """pretraining_data.vocab_tokenizer's factory for an ALBERT spiece.model goes to the workers
    (pickled with the pipeline): the same bytes as the local streaming path."""
    from data_prep.pretraining_data import vocab_tokenizer
    from tests.test_create_pretraining_data import ALBERT_SPIECE

    make, _, masking_vocab = vocab_tokenizer(ALBERT_SPIECE, do_lower_case=True)
    corpus = [str(write_corpus(tmp_path / "c.txt", 15, seed=4))]
    conf = dataclasses.replace(settings(vocab), vocab=masking_vocab, sentence_objective="sop")
    local, on_beam = ([str(tmp_path / f"{name}{k}.tfrecord") for k in range(2)]
                      for name in ("local", "beam"))  # fmt: skip
    counts = create_shards(corpus, local, make(), conf, num_workers=1, chunk_bytes=300)
    beam_pipeline.run(corpus, on_beam, make, conf, chunk_bytes=300)
    assert sum(counts) > 20 and file_bytes(on_beam) == file_bytes(local)
