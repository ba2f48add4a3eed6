"""Smoke runs of data_prep/create_pretraining_data.py as a script, on a corpus the test writes."""

from __future__ import annotations

import json
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
from tests import helpers

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


ALBERT_SPIECE = REPO / "tests" / "fixtures" / "albert_spiece"


def albert_corpus(path: Path) -> list[str]:
    """README prose (the text the fixture's SentencePiece model was trained on) as documents of
    four lines; returns the lines, blank lines between documents."""
    from tests.make_xlnet_golden import training_text

    lines = [line for line in training_text().splitlines() if len(line.split()) > 4][:120]
    text = [line for k, line in enumerate(lines) for line in ([line, ""] if k % 4 == 3 else [line])]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return text


def test_albert_sentencepiece_records_hold_its_pieces_with_whole_words_masked(tmp_path):
    """--vocab_file an ALBERT spiece.model folder: records of its lower-cased pieces on two
    worker processes, each segment a run of the corpus's own ids, [CLS] / [SEP] its control
    pieces, and whole-word masking over ALBERT's word starts (pretraining_data.spiece_word_start:
    a piece with the word boundary, or punctuation) masks every piece of a word or none."""
    from data_prep import spiece
    from data_prep.pretraining_data import spiece_word_start

    corpus = albert_corpus(tmp_path / "corpus.txt")
    out = tmp_path / "albert.tfrecord"
    r = helpers.run_main("data_prep/create_pretraining_data.py", [
        f"--input_file={tmp_path / 'corpus.txt'}", f"--output_file={out}",
        f"--vocab_file={ALBERT_SPIECE}", "--max_seq_length=48", "--max_predictions_per_seq=8",
        "--dupe_factor=2", "--sentence_objective=sop", "--do_whole_word_mask", "--num_workers=2",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    tok = spiece.SentencePieceTokenizer(ALBERT_SPIECE / "spiece.model", do_lower_case=True)
    stream = " " + " ".join(str(i) for line in corpus for i in tok.encode(line)) + " "
    cls, sep = tok.vocab["[CLS]"], tok.vocab["[SEP]"]
    records = [tf.train.Example.FromString(x.numpy()) for x in tf.data.TFRecordDataset(str(out))]
    assert len(records) > 40
    labels, whole = set(), 0
    for example in records:
        f = {k: list(v.int64_list.value or v.float_list.value)
             for k, v in example.features.feature.items()}  # fmt: skip
        ids = f["input_ids"][: sum(f["input_mask"])]
        masked = {p for p, w in zip(f["masked_lm_positions"], f["masked_lm_weights"]) if w}
        for p, i, w in zip(f["masked_lm_positions"], f["masked_lm_ids"], f["masked_lm_weights"]):
            if w:
                ids[p] = i  # the original piece back
        assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2
        first_sep = ids.index(sep)
        for segment in (ids[1:first_sep], ids[first_sep + 1 : -1]):
            assert f" {' '.join(map(str, segment))} " in stream  # a run of the corpus's ids
        assert f["segment_ids"][: len(ids)] == [0] * (first_sep + 1) + [1] * (
            len(ids) - first_sep - 1
        )
        pieces = tok.convert_ids_to_tokens(ids)
        words, current = [], []
        for p, piece in enumerate(pieces):
            if ids[p] in (cls, sep):
                continue
            if current and (spiece_word_start(piece) or current[-1] != p - 1):
                words.append(current)
                current = []
            current.append(p)
        words.append(current)
        for word in words:
            assert set(word) <= masked or not set(word) & masked, (pieces, word, masked)
            whole += len(word) > 1 and set(word) <= masked
        labels.add(f["next_sentence_labels"][0])
    assert labels == {0, 1} and whole > 5  # both orders; words of several pieces masked whole


def test_albert_pretrains_on_its_sentencepiece_records_with_dynamic_masks(tmp_path):
    """run_pretraining.py --masking=dynamic --vocab_file=the spiece.model folder: [MASK] and the
    other ids come from the SentencePiece model; an ALBERT of its 300 pieces trains on them."""
    albert_corpus(tmp_path / "corpus.txt")
    out = tmp_path / "albert.tfrecord"
    r = helpers.run_main("data_prep/create_pretraining_data.py", [
        f"--input_file={tmp_path / 'corpus.txt'}", f"--output_file={out}",
        f"--vocab_file={ALBERT_SPIECE}", "--max_seq_length=32", "--sentence_objective=sop",
        "--masking=dynamic", "--num_workers=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    config = tmp_path / "albert_config.json"
    values = json.loads((REPO / "configs" / "albert_tiny.json").read_text())
    config.write_text(json.dumps({**values, "vocab_size": 300, "hidden_size": 32,
                                  "intermediate_size": 64, "embedding_size": 16}))  # fmt: skip
    run = tmp_path / "run"
    r = helpers.run_main("run_pretraining.py", [
        f"--bert_config_file={config}", f"--input_file={out}", f"--output_dir={run}",
        f"--vocab_file={ALBERT_SPIECE}", "--masking=dynamic", "--sentence_objective=sop",
        "--max_seq_length=32", "--max_predictions_per_seq=5", "--train_batch_size=4",
        "--eval_batch_size=4", "--num_train_steps=3", "--num_warmup_steps=1",
        "--save_checkpoints_steps=3", "--iterations_per_loop=3", "--do_train", "--do_eval",
        "--max_eval_steps=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    results = (run / "eval_results.txt").read_text()
    assert "global_step = 3" in results and "sentence_order_accuracy" in results
    r = helpers.run_main("data_prep/create_pretraining_data.py", [
        f"--input_file={tmp_path / 'corpus.txt'}", f"--output_file={tmp_path / 'no.tfrecord'}",
        f"--vocab_file={ALBERT_SPIECE}", "--compat_original",
    ])  # fmt: skip
    assert r.returncode != 0 and "is a SentencePiece model" in r.stderr
    assert not (tmp_path / "no.tfrecord").exists()
