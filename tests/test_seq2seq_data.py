"""Encoder-decoder denoising data: the special-id layout, chunking, and create_seq2seq_data's
records round-tripping back to the corpus text (T5 by reconstruction, BART by its target)."""

import itertools
import re

import numpy as np
import pytest

from data_prep import bpe, noising, seq2seq_data
from data_prep.errors import InputError

CORPUS = (
    "The cat sat on the mat.\nIt was a sunny day.\nThe dog barked twice at noon.\n\n"
    "Birds sing in the early morning.\nA quiet river runs past the old mill.\n"
    "Children play near the water.\nThe mill wheel turns slowly.\n\n"
    "Short.\n"
)


def tiny_bpe(tmp_path, special_tokens=(bpe.GPT2_END_OF_TEXT,)) -> tuple[str, str]:
    merges = bpe.learn_bpe(bpe.byte_words([CORPUS]), 40, 2)
    tok = bpe.ByteLevelBPE(bpe.byte_level_vocab(merges, special_tokens), merges)
    return tok.save(tmp_path / "bpe")


def test_special_ids_follow_the_bpe_vocabulary_with_sentinels_counted_down(tmp_path):
    vocab = seq2seq_data.Seq2SeqVocab.from_files(*tiny_bpe(tmp_path), num_sentinels=5)
    n = len(vocab.tokenizer.encoder)
    assert (vocab.pad_id, vocab.eos_id, vocab.mask_id) == (n, n + 1, n + 2)
    assert vocab.sentinel_ids == (n + 7, n + 6, n + 5, n + 4, n + 3)
    assert vocab.size == n + 8
    ids = vocab.encode("The cat") + [vocab.sentinel_ids[1], vocab.eos_id, 5]
    assert vocab.decode(ids) == "The cat<extra_id_1>"
    assert vocab.decode(ids, stop_at_eos=False).startswith("The cat<extra_id_1></s>")


def test_bart_vocab_adds_bos_after_mask_and_leaves_t5_ids_alone(tmp_path):
    files = tiny_bpe(tmp_path)
    t5_vocab = seq2seq_data.Seq2SeqVocab.from_files(*files, num_sentinels=5)
    vocab = seq2seq_data.Seq2SeqVocab.from_files(*files, num_sentinels=0, bos=True)
    n = len(vocab.tokenizer.encoder)
    assert t5_vocab.bos_id is None and vocab.bos_id == n + 3 and vocab.size == n + 4
    assert (vocab.pad_id, vocab.eos_id, vocab.mask_id) == (n, n + 1, n + 2)
    assert vocab.wrap([7, 8]) == [n + 3, 7, 8, n + 1] and t5_vocab.wrap([7, 8]) == [7, 8, n + 1]
    assert vocab.decode(vocab.wrap(vocab.encode("The cat"))) == "The cat"
    # A RoBERTa / BART vocabulary already holds <s>: its id is kept.
    specials = ("<s>", "<pad>", "</s>", "<mask>")
    vocab = seq2seq_data.Seq2SeqVocab.from_files(*tiny_bpe(tmp_path, specials), 0, bos=True)
    enc = vocab.tokenizer.encoder
    assert (vocab.bos_id, vocab.pad_id, vocab.eos_id) == (enc["<s>"], enc["<pad>"], enc["</s>"])
    with pytest.raises(ValueError, match="<s>"):
        seq2seq_data.bart_instance([[1, 2]], t5_vocab, np.random.default_rng(0))


def test_special_tokens_already_in_the_encoder_keep_their_ids(tmp_path):
    specials = ("<pad>", "</s>", "<mask>", "<extra_id_0>", "<extra_id_1>")
    vocab = seq2seq_data.Seq2SeqVocab.from_files(*tiny_bpe(tmp_path, specials), num_sentinels=3)
    enc = vocab.tokenizer.encoder
    assert (vocab.pad_id, vocab.eos_id, vocab.mask_id) == (enc["<pad>"], enc["</s>"], enc["<mask>"])
    assert vocab.sentinel_ids[:2] == (enc["<extra_id_0>"], enc["<extra_id_1>"])
    assert vocab.sentinel_ids[2] == len(enc) and vocab.size == len(enc) + 1


def test_config_must_fit_the_vocabulary(tmp_path):
    from modeling import t5

    vocab = seq2seq_data.Seq2SeqVocab.from_files(*tiny_bpe(tmp_path), num_sentinels=5)
    good = t5.T5Config(
        vocab.size,
        pad_token_id=vocab.pad_id,
        eos_token_id=vocab.eos_id,
        decoder_start_token_id=vocab.pad_id,
    )
    vocab.check_config(good, "c.json")
    with pytest.raises(InputError, match=r"c.json: .*vocab_size 3"):
        vocab.check_config(t5.T5Config(3), "c.json")


def test_chunks_keep_every_token_in_order_within_the_length():
    sentences = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11], [12, 13]]
    chunks = seq2seq_data.chunk_sentences(sentences, 4)
    assert [t for c in chunks for s in c for t in s] == list(range(1, 14))
    assert all(sum(len(s) for s in c) <= 4 for c in chunks)
    assert chunks[0] == [[1, 2, 3], [4]]


def test_t5_chunk_length_is_the_longest_that_fits():
    n = seq2seq_data.t5_chunk_length(41, 11)
    assert seq2seq_data.t5_lengths(n, 0.15, 3.0)[0] <= 41
    assert seq2seq_data.t5_lengths(n, 0.15, 3.0)[1] <= 11
    longer = seq2seq_data.t5_lengths(n + 1, 0.15, 3.0)
    assert longer[0] > 41 or longer[1] > 11
    # T5's own setting: 568 raw tokens -> 512 inputs and 114 targets (random_spans_helper).
    assert seq2seq_data.t5_chunk_length(512, 114) == 568


def test_degenerate_bart_rates_give_the_original_or_its_permutation(tmp_path):
    vocab = seq2seq_data.Seq2SeqVocab.from_files(*tiny_bpe(tmp_path), 0, bos=True)
    bos, eos = vocab.bos_id, vocab.eos_id
    sentences = [[1, 2], [3, 4, 5], [6]]
    rng = np.random.default_rng(3)
    inputs, targets = seq2seq_data.bart_instance(sentences, vocab, rng, mask_ratio=0.0)
    assert inputs == targets == [bos, 1, 2, 3, 4, 5, 6, eos]
    inputs, targets = seq2seq_data.bart_instance(
        sentences, vocab, np.random.default_rng(3), mask_ratio=0.0, permute=True
    )
    assert targets == [bos, 1, 2, 3, 4, 5, 6, eos]
    order = noising.permute_sentences(sentences, np.random.default_rng(3))[0]
    assert inputs == [bos] + [t for s in order for t in s] + [eos]


def run_create(tmp_path, *extra) -> tuple[str, list, str]:
    """create_seq2seq_data.py on CORPUS in a fresh interpreter (helpers.run_data_script_alone):
    its stdout, [TensorFlow imported, the workers' start method] and its stderr."""
    from tests import helpers

    encoder, merges = tiny_bpe(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    args = [
        f"--input_file={corpus}",
        f"--encoder_file={encoder}",
        f"--merges_file={merges}",
        "--num_sentinels=10",
        *extra,
    ]
    return helpers.run_data_script_alone("data_prep/create_seq2seq_data.py", args)


def _in_order(pieces, sequence) -> bool:
    """Whether the pieces occur in `sequence` in order and without overlap."""
    pos = 0
    for piece in pieces:
        for start in range(pos, len(sequence) - len(piece) + 1):
            if sequence[start : start + len(piece)] == piece:
                pos = start + len(piece)
                break
        else:
            return False
    return True


def test_create_seq2seq_data_round_trips_to_the_corpus(tmp_path):
    from tests import helpers

    out_t5 = [tmp_path / "t5a.tfrecord", tmp_path / "t5b.tfrecord"]
    stdout, (tensorflow_imported, start_method), stderr = run_create(
        tmp_path,
        f"--output_file={out_t5[0]},{out_t5[1]}",
        "--max_seq_length=13",
        "--max_target_length=7",
        "--num_workers=2",
    )
    # Written without TensorFlow, its tokenizing workers forked, "2 worker(s)"
    assert not tensorflow_imported and start_method == "fork" and "2 worker(s)" in stdout
    assert re.search(r"encoding: 100%.*\[[0-9:]+<00:00, .*B/s\]", stderr), stderr  # its bar
    vocab = seq2seq_data.Seq2SeqVocab.from_files(
        tmp_path / "bpe/encoder.json", tmp_path / "bpe/vocab.bpe", 10
    )
    assert f"vocab_size >= {vocab.size}" in stdout
    # The bytes one process writes through protobuf and TensorFlow, from the same seed
    documents = seq2seq_data.read_sentence_documents([str(tmp_path / "corpus.txt")])
    docs = [seq2seq_data.encode_sentences(vocab, d) for d in documents]
    settings = seq2seq_data.NoisingSettings("t5_span", 13, 7)
    rng = np.random.default_rng(12345)  # the script's --random_seed default
    want = []
    for inputs, targets in seq2seq_data.create_instances(docs, vocab, settings, rng):
        pad = vocab.pad_id
        want.append(
            {
                "input_ids": inputs + [pad] * (13 - len(inputs)),
                "input_mask": [1] * len(inputs) + [0] * (13 - len(inputs)),
                "target_ids": targets + [pad] * (7 - len(targets)),
                "target_mask": [1] * len(targets) + [0] * (7 - len(targets)),
            }
        )
    theirs = [tmp_path / "ta.tfrecord", tmp_path / "tb.tfrecord"]
    helpers.write_tensorflow_records(want, theirs)
    assert [f.read_bytes() for f in out_t5] == [f.read_bytes() for f in theirs]
    texts = []
    a, b = (list(seq2seq_data.read_seq2seq_records(str(f))) for f in out_t5)
    records = [r for pair in itertools.zip_longest(a, b) for r in pair if r]  # round-robin
    assert len(records) > 5
    for inputs, targets in records:
        assert len(inputs) <= 13 and len(targets) <= 7
        assert inputs[-1] == targets[-1] == vocab.eos_id
        assert any(t in vocab.sentinel_ids for t in inputs)
        texts.append(vocab.decode(noising.t5_reconstruct(inputs, targets, vocab.sentinel_ids)))
    assert "".join(texts).replace("\n", "") == CORPUS.replace("\n", "")

    # BART through the same writer in-process (one entrypoint start per test is slow enough),
    # with the published BART layout: `<s> ... </s>` on both sides.
    vocab = seq2seq_data.Seq2SeqVocab.from_files(
        tmp_path / "bpe/encoder.json", tmp_path / "bpe/vocab.bpe", 0, bos=True
    )
    out_bart = tmp_path / "bart.tfrecord"
    docs = [
        seq2seq_data.encode_sentences(vocab, d)
        for d in seq2seq_data.read_sentence_documents([str(tmp_path / "corpus.txt")])
    ]
    settings = seq2seq_data.NoisingSettings("bart_infill", 17, 17)
    instances = seq2seq_data.create_instances(docs, vocab, settings, np.random.default_rng(7))
    seq2seq_data.write_seq2seq_tfrecords(instances, [str(out_bart)], 17, 17, vocab.pad_id)
    texts = []
    for inputs, targets in seq2seq_data.read_seq2seq_records(str(out_bart)):
        assert vocab.mask_id in inputs
        for ids in (inputs, targets):
            assert ids[0] == vocab.bos_id and ids[-1] == vocab.eos_id
            assert ids.count(vocab.bos_id) == ids.count(vocab.eos_id) == 1
        # The input is the target with spans replaced by masks: the unmasked runs in order.
        runs, run = [], []
        for t in inputs[1:-1]:
            if t == vocab.mask_id:
                runs.append(run)
                run = []
            else:
                run.append(t)
        assert _in_order([r for r in runs + [run] if r], targets[1:-1])
        texts.append(vocab.decode(targets))
    assert "".join(texts).replace("\n", "") == CORPUS.replace("\n", "")


def test_same_seed_same_instances_and_bad_settings_are_refused(tmp_path):
    vocab = seq2seq_data.Seq2SeqVocab.from_files(*tiny_bpe(tmp_path), num_sentinels=10)
    docs = [seq2seq_data.encode_sentences(vocab, d.split("\n")) for d in CORPUS.split("\n\n")]
    for noising_name in seq2seq_data.NOISINGS:
        bart = noising_name == "bart_infill"
        vocab = seq2seq_data.Seq2SeqVocab.from_files(*tiny_bpe(tmp_path), 10, bos=bart)
        settings = seq2seq_data.NoisingSettings(noising_name, 19, 11)
        runs = [
            list(seq2seq_data.create_instances(docs, vocab, settings, np.random.default_rng(5)))
            for _ in range(2)
        ]
        assert runs[0] == runs[1] and len(runs[0]) > 3
    with pytest.raises(ValueError, match="bart_infill"):
        seq2seq_data.NoisingSettings("t5_span", 19, 11, permute_sentences=True)
    with pytest.raises(ValueError, match="no chunk"):
        seq2seq_data.NoisingSettings("t5_span", 3, 2).chunk_length()
    with pytest.raises(ValueError, match="no chunk"):
        seq2seq_data.NoisingSettings("bart_infill", 3, 9).chunk_length()
    a, b = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    seq2seq_data.write_seq2seq_tfrecords(runs[0], [str(a)], 19, 11, vocab.pad_id)
    assert seq2seq_data.seq2seq_file_lengths([str(a)])[:2] == (19, 11)
    from data_prep import lm_data

    lm_data.write_lm_tfrecords([np.arange(5)], [str(b)])
    with pytest.raises(InputError, match="b.tfrecord: expected seq2seq records"):
        seq2seq_data.seq2seq_file_lengths([str(a), str(b)])
