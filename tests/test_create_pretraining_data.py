"""Smoke runs of data_prep/create_pretraining_data.py as a script, on a corpus the test writes."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from data_prep.features import check_pretraining_files
from data_prep.pretraining_data import (
    MaskingVocab,
    create_training_instances,
    read_documents,
    serialize_instance,
)
from data_prep.pretraining_shards import ChunkSettings, create_shards
from data_prep.tokenization import FullTokenizer

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "data_prep/create_pretraining_data.py"

WORDS = (
    "the a cat dog sat ran on mat big small red un ##believ ##able play ##ing ##ed "
    "house garden tree bird sang . , ! ?"
).split()


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return str(path)


def write_corpus(folder: Path, name: str, num_docs: int, seed: int) -> Path:
    rng = random.Random(seed)
    plain = [w for w in WORDS if not w.startswith("##") and w not in ".,!?"]
    lines = []
    for _ in range(num_docs):
        for _ in range(rng.randint(2, 7)):
            words = [rng.choice(plain + ["unbelievable", "playing", "played"]) for _ in range(6)]
            lines.append(" ".join(words).capitalize() + rng.choice(".!?"))
        lines.append("")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("\n".join(lines))
    return path


def script_flags(corpus, shards, vocab_file, *extra):
    return [
        f"--input_file={corpus}",
        f"--output_file={','.join(shards)}",
        f"--vocab_file={vocab_file}",
        "--max_seq_length=24",
        "--max_predictions_per_seq=4",
        "--dupe_factor=3",
        "--random_seed=7",
        *extra,
    ]


def test_smoke_run_writes_shards_equal_to_the_library(tmp_path, vocab_file):
    corpus = [write_corpus(tmp_path / "corpus", f"part-{k}.txt", 6, seed=k) for k in range(2)]
    out = tmp_path / "out" / "sub"  # does not exist yet: the script creates it
    shards = [str(out / "train-0.tfrecord"), str(out / "train-1.tfrecord")]
    pattern = tmp_path / "corpus" / "*.txt"
    result = run_script(*script_flags(pattern, shards, vocab_file, "--compat_original=True"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["train-0.tfrecord", "train-1.tfrecord"]
    check_pretraining_files(shards, 24, 4)
    assert "*** Example ***" in result.stderr and "instances/s" in result.stderr

    # The same instances, made in this process with the reference tokenizer, serialize to the
    # same records in the same round-robin order.
    tokenizer = FullTokenizer(vocab_file, do_lower_case=True)
    documents = read_documents([str(p) for p in corpus], tokenizer)
    instances = create_training_instances(
        documents, tokenizer.vocab, 24, 3, 0.1, 0.15, 4, random.Random(7)
    )
    assert len(instances) > 20
    for k, shard in enumerate(shards):
        records = [r.numpy() for r in tf.data.TFRecordDataset(shard)]
        # Bytes made in another process: the feature map order must not depend on the process.
        assert records == [serialize_instance(i, 24, 4) for i in instances[k::2]]


def test_streaming_run_writes_the_library_shards(tmp_path, vocab_file):
    """The default (streaming) mode on two worker processes writes the bytes that
    pretraining_shards.create_shards writes in this process with the reference tokenizer."""
    corpus = [write_corpus(tmp_path / "corpus", f"part-{k}.txt", 9, seed=k) for k in range(2)]
    shards = [str(tmp_path / "out" / f"train-{k}.tfrecord") for k in range(2)]
    pattern = tmp_path / "corpus" / "*.txt"
    extra = ("--num_workers=2", "--chunk_bytes=300", "--do_whole_word_mask=True")
    result = run_script(*script_flags(pattern, shards, vocab_file, *extra))
    assert result.returncode == 0, result.stderr[-3000:]
    check_pretraining_files(shards, 24, 4)
    assert "*** Example ***" in result.stderr and "instances/s" in result.stderr

    tokenizer = FullTokenizer(vocab_file, do_lower_case=True)
    settings = ChunkSettings(
        MaskingVocab.from_vocab(tokenizer.vocab), 24, 4, 3, 0.1, 0.15, 7,
        masking_scheme="whole_word",
    )  # fmt: skip
    expected = [str(tmp_path / f"expected-{k}.tfrecord") for k in range(2)]
    files = sorted(str(p) for p in corpus)
    counts = create_shards(files, expected, tokenizer, settings, num_workers=1, chunk_bytes=300)
    assert sum(counts) > 40
    for got, want in zip(shards, expected, strict=True):
        assert Path(got).read_bytes() == Path(want).read_bytes()


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--masked_lm_prob=1.5", "--masked_lm_prob=1.5: must be a probability in [0, 1]"),
        ("--short_seq_prob=-0.1", "--short_seq_prob=-0.1: must be a probability in [0, 1]"),
        ("--max_predictions_per_seq=200", "cannot exceed --max_seq_length"),
        ("--max_seq_length=4", "--max_seq_length=4: must be at least 5"),
        ("--output_file=a.tfrecord,a.tfrecord", "must name one or more distinct files"),
        ("--full_sentences", "--full_sentences packs one segment per sequence"),
        ("--sentence_objective=bad", "--sentence_objective"),
        ("--num_workers=0", "--num_workers=0: must be at least 1"),
        ("--chunk_bytes=0", "--chunk_bytes=0: must be at least 1"),
        ("--masking=dynamic --masking_scheme=span", "--masking=dynamic leaves the choice of masks"),
        ("--masking=dynamic --do_whole_word_mask", "drop --masking_scheme / --do_whole_word_mask"),
        ("--beam --compat_original", "--compat_original is the whole-corpus one: pick one"),
        ("--beam_options=--runner=DirectRunner", "--beam_options without --beam"),
    ],
)
def test_bad_flags_are_refused_with_a_message(flag, message):
    args = ["--input_file=x.txt", "--output_file=out.tfrecord", "--vocab_file=vocab.txt"]
    args += flag.split()
    result = run_script(*args)
    assert result.returncode != 0
    assert message in result.stderr


def test_corpus_error_names_the_file(tmp_path, vocab_file):
    corpus = tmp_path / "single.txt"
    corpus.write_text("The cat sat.\n\nThe dog ran.\n\nA bird sang.\n")
    out = tmp_path / "out.tfrecord"
    result = run_script(
        f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={vocab_file}"
    )
    assert result.returncode == 1
    # Streaming names the chunk's lines (the whole tiny file here).
    assert f"{corpus}:1-5 (one chunk of --chunk_bytes): expected at least one document with two " \
        "or more sentences" in result.stderr  # fmt: skip
    assert not out.exists()


def test_recipe_flags_write_the_library_records(tmp_path, vocab_file):
    """RoBERTa's records (FULL-SENTENCES, unmasked) from the script equal the library's, and a
    corpus of one-sentence documents is refused for SOP with the flag to change."""
    corpus = write_corpus(tmp_path / "corpus", "part.txt", 8, seed=3)
    out = str(tmp_path / "full.tfrecord")
    recipe = ["--sentence_objective=none", "--full_sentences", "--masking=dynamic"]
    result = run_script(
        f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={vocab_file}",
        "--max_seq_length=24", "--dupe_factor=2", "--random_seed=5", "--compat_original", *recipe,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--sentence_objective=none --masking=dynamic to run_pretraining" in result.stderr
    check_pretraining_files([out], 24, 20, masking="dynamic")
    tokenizer = FullTokenizer(vocab_file, do_lower_case=True)
    documents = read_documents([str(corpus)], tokenizer, "none")
    instances = create_training_instances(
        documents, tokenizer.vocab, 24, 2, 0.1, 0.15, 20, random.Random(5),
        sentence_objective="none", static_masking=False, full_sentences=True,
    )  # fmt: skip
    records = [r.numpy() for r in tf.data.TFRecordDataset(out)]
    assert records == [serialize_instance(i, 24, 20) for i in instances]

    single = tmp_path / "single.txt"
    single.write_text("The cat sat.\n\nThe dog ran.\n\nA bird sang.\n")
    result = run_script(
        f"--input_file={single}", f"--output_file={out}", f"--vocab_file={vocab_file}",
        "--sentence_objective=sop",
    )  # fmt: skip
    assert result.returncode == 1
    assert "sentence-order prediction" in result.stderr
    assert "use --sentence_objective=none" in result.stderr
