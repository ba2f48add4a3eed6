"""ELMo's published files (options.json + weights.hdf5, bilm-tf's layout) into and out of Cloze,
against AllenNLP (tests/fixtures/elmo_bilm_tiny, written by tests/make_elmo_golden.py: seeded
weights in that layout and what allennlp.modules.elmo's own _ElmoBiLm computed with them), so CI
checks Cloze against an implementation no one here wrote without installing PyTorch."""

import json
import shutil

import h5py
import numpy as np
import pytest
import tensorflow as tf

from modeling import elmo
from tests import helpers
from tests.conftest import ROOT
from training import trainer

FIXTURE = ROOT / "tests" / "fixtures" / "elmo_bilm_tiny"
TOLERANCE = 1e-5  # max absolute difference in float32


def golden():
    g = dict(np.load(FIXTURE / "golden.npz"))
    return g, json.loads(str(g["sentences"]))


def datasets(path) -> dict:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, d: out.update({n: d[...]}) if isinstance(d, h5py.Dataset) else None)
    return out


def restore_bilm(folder, config=None):
    """The biLM of a Cloze ELMo checkpoint, as convert_checkpoint --from=cloze reads it."""
    config = config or elmo.ElmoConfig.from_json_file(folder / "bert_config.json")
    bilm = elmo.ElmoBiLM(config, name="encoder")
    bilm.build()
    trainer.restore_model_weights(tf.train.Checkpoint(encoder=bilm), str(folder))
    return bilm


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("elmo") / "cloze"
    r = helpers.convert_checkpoint(
        "--from=bilm_hdf5", "--to=cloze", f"--input_dir={FIXTURE}", f"--output_dir={out}"
    )
    assert "converted ELMo --from=bilm_hdf5 to --to=cloze" in r.stdout
    assert "RNN_1/RNN/MultiRNNCell/Cell*/LSTMCell/B (96) -> backward_*/cell/bias  (x2)" in r.stdout
    return out


def test_character_ids_equal_allennlps_mapper():
    """ELMoCharacterMapper's ids of the fixture's words (bytes + 1, its word markers, padding,
    a word cut to 48 bytes) are sentence_char_ids' rows between <S> and </S>."""
    g, sentences = golden()
    chars, mask = elmo.sentence_char_ids(sentences, 50)
    words = g["mask"].astype(bool)
    assert np.array_equal(mask[:, 2:], g["mask"])
    assert np.array_equal(chars[:, 1:-1][words], g["char_ids"][words])
    assert (g["char_ids"][~words] == 0).all()  # padding words: all-zero rows, in both
    assert (chars[:, 0] == elmo.token_char_ids(elmo.SENTENCE_START, 50)).all()
    for b, n in enumerate(g["mask"].sum(axis=1)):
        assert (chars[b, n + 1] == elmo.token_char_ids(elmo.SENTENCE_END, 50)).all()
        assert (chars[b, n + 2 :] == 0).all()


def test_converted_bilm_computes_what_allennlp_computed(converted):
    """Every layer (the token layer [x; x] and both LSTM layers [forward; backward]) at every word
    of a right-padded batch within TOLERANCE of AllenNLP's _ElmoBiLm, and zero at padding."""
    g, sentences = golden()
    layers, mask = elmo.sentence_layer_outputs(restore_bilm(converted), sentences)
    assert np.array_equal(mask, g["mask"])
    assert len(layers) == len(g["layers"]) == 3
    for k, (ours, theirs) in enumerate(zip(layers, g["layers"])):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOLERANCE, err_msg=f"layer {k}")
    assert np.abs(g["layers"][2]).max() > 3.0  # the residual sum passes the clipping


def test_converted_bilm_loads_into_the_feature_models(converted):
    """extract_features' ELMo model and run_classifier's take the converted folder as
    --init_checkpoint (the whole model, or its `model/encoder`), the same weights as the direct
    load."""
    config = elmo.ElmoConfig.from_json_file(converted / "bert_config.json")
    assert config.n_tokens_vocab is None  # the published options.json counts no vocabulary
    direct = restore_bilm(converted).weights
    for model, part in ((elmo.ElmoFeatures(config, mix=False), "model"),
                        (elmo.ElmoClassifier(config, 2), "encoder")):  # fmt: skip
        model.build()
        assert trainer.init_from_checkpoint(model, str(converted))[1] == part
        for a, b in zip(model.encoder.weights, direct, strict=True):
            assert np.array_equal(a.numpy(), b.numpy())


def test_round_trip_is_bit_for_bit_and_allennlp_reads_the_export(converted, tmp_path):
    helpers.convert_checkpoint(
        "--from=cloze",
        "--to=bilm_hdf5",
        f"--input_dir={converted}",
        f"--output_dir={tmp_path / 'h'}",
    )
    ours, theirs = datasets(tmp_path / "h" / "weights.hdf5"), datasets(FIXTURE / "weights.hdf5")
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and np.array_equal(ours[name], theirs[name])
    options = json.loads((tmp_path / "h" / "options.json").read_text())
    published = json.loads((FIXTURE / "options.json").read_text())
    assert options["lstm"] == published["lstm"] and options["char_cnn"] == published["char_cnn"]


def test_a_wordpiece_bilm_goes_out_and_back_with_its_vocabulary(tmp_path):
    """A biLM as run_pretraining saves it (ElmoLM, WordPieces spelled into its character table)
    to weights.hdf5 (the softmax left out) and back with the vocab.txt carried along: the table
    is spelled again from the vocabulary and every layer is the same."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat", "é"]
    values = json.loads((FIXTURE / "options.json").read_text()) | {"n_tokens_vocab": len(tokens)}
    config = elmo.ElmoConfig.from_dict(values)
    lm = elmo.ElmoLM(config)
    lm.build()
    lm.encoder.set_char_table(tokens)
    source = tmp_path / "pretrained"
    tf.train.Checkpoint(model=lm).save(str(source / "ckpt"))
    (source / "bert_config.json").write_text(config.to_json_string())
    (source / "vocab.txt").write_text("\n".join(tokens) + "\n")
    r = helpers.convert_checkpoint(
        "--from=cloze", "--to=bilm_hdf5", f"--input_dir={source}", f"--output_dir={tmp_path / 'h'}"
    )
    assert "a softmax is not converted" in r.stdout
    assert "softmax" not in " ".join(datasets(tmp_path / "h" / "weights.hdf5"))
    helpers.convert_checkpoint(
        "--from=bilm_hdf5", "--to=cloze", f"--input_dir={tmp_path / 'h'}",
        f"--output_dir={tmp_path / 'back'}",
    )  # fmt: skip
    back = restore_bilm(tmp_path / "back")
    assert back.config == config
    assert np.array_equal(back.char_table.numpy(), lm.encoder.char_table.numpy())
    ids = np.array([[2, 5, 6, 7, 8, 3], [2, 9, 3, 0, 0, 0]], np.int32)
    mask = (np.arange(6) < np.array([[6], [3]])).astype(np.int32)
    for a, b in zip(
        elmo.elmo_layer_outputs(lm, ids, mask), elmo.elmo_layer_outputs(back, ids, mask)
    ):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


def test_without_its_vocabulary_a_counted_bilm_reads_words_alone(tmp_path):
    """An options.json as bilm-tf's training writes it (its vocabulary size and run settings):
    without the vocabulary the biLM reads words, the run settings are named and left out; a
    vocabulary of another size is refused naming both files."""
    source = tmp_path / "published"
    shutil.copytree(FIXTURE, source)
    run = {"batch_size": 128, "n_epochs": 10, "unroll_steps": 20}  # bilm-tf's train.py's
    values = json.loads((source / "options.json").read_text()) | {"n_tokens_vocab": 793471}
    (source / "options.json").write_text(json.dumps(values | run))
    r = helpers.convert_checkpoint(
        "--from=bilm_hdf5", "--to=cloze", f"--input_dir={source}", f"--output_dir={tmp_path / 'c'}"
    )
    assert "n_tokens_vocab=793471" in r.stderr and "left out of the written config" in r.stderr
    assert "run settings not kept: batch_size, n_epochs, unroll_steps" in r.stderr
    assert "n_tokens_vocab" not in json.loads((tmp_path / "c" / "bert_config.json").read_text())
    (source / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    r = helpers.run_main(
        "convert_checkpoint.py",
        [
            "--from=bilm_hdf5",
            "--to=cloze",
            f"--input_dir={source}",
            f"--output_dir={tmp_path / 'd'}",
        ],
    )
    assert r.returncode == 1 and "vocab.txt" in r.stderr and "793471" in r.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "damage, message",
    [
        ("drop", "CNN_proj/b_proj: missing (expected shape (8))"),
        ("reshape", "CNN/W_cnn_1: expected shape (1, 2, 4, 6), found (1, 3, 4, 6)"),
        ("extra", "softmax/W (5, 8): has no place in this model"),
        ("garbage", "a readable HDF5 file"),
    ],
)
def test_a_damaged_weights_file_is_named_and_nothing_is_written(tmp_path, damage, message):
    source = tmp_path / "published"
    shutil.copytree(FIXTURE, source)
    weights = source / "weights.hdf5"
    if damage == "garbage":
        weights.write_bytes(b"not an hdf5 file")
    else:
        with h5py.File(weights, "a") as f:
            if damage == "drop":
                del f["CNN_proj/b_proj"]
            elif damage == "reshape":
                del f["CNN/W_cnn_1"]
                f["CNN/W_cnn_1"] = np.zeros((1, 3, 4, 6), np.float32)
            else:
                f["softmax/W"] = np.zeros((5, 8), np.float32)
    out = tmp_path / "out"
    r = helpers.run_main(
        "convert_checkpoint.py",
        ["--from=bilm_hdf5", "--to=cloze", f"--input_dir={source}", f"--output_dir={out}"],
    )
    assert r.returncode == 1, r.stdout
    assert str(weights) in r.stderr and message in r.stderr
    assert "nothing was written" in r.stderr and not out.exists()


def test_other_targets_and_families_are_refused(converted, tmp_path):
    r = helpers.run_main(
        "convert_checkpoint.py",
        ["--from=cloze", "--to=hf", f"--input_dir={converted}", f"--output_dir={tmp_path / 'a'}"],
    )
    assert r.returncode == 1 and "cloze or bilm_hdf5 for an ELMo biLM" in r.stderr
    bert = tmp_path / "bert"
    bert.mkdir()
    shutil.copyfile(ROOT / "configs" / "bert_tiny.json", bert / "bert_config.json")
    r = helpers.run_main(
        "convert_checkpoint.py",
        ["--from=cloze", "--to=bilm_hdf5", f"--input_dir={bert}", f"--output_dir={tmp_path / 'b'}"],
    )
    assert r.returncode == 1 and "holds ELMO models only" in r.stderr
    twice = tmp_path / "twice"
    shutil.copytree(FIXTURE, twice)
    (twice / "options.json").rename(twice / "a_options.json")
    shutil.copyfile(twice / "a_options.json", twice / "b_options.json")
    r = helpers.run_main(
        "convert_checkpoint.py",
        [
            "--from=bilm_hdf5",
            "--to=cloze",
            f"--input_dir={twice}",
            f"--output_dir={tmp_path / 'c'}",
        ],
    )
    assert r.returncode == 1 and "a_options.json, b_options.json" in r.stderr
    tokens = tmp_path / "tokens"  # a token-embedding biLM: the hdf5 layout has no place for it
    tokens.mkdir()
    options = {"lstm": json.loads((FIXTURE / "options.json").read_text())["lstm"],
               "n_tokens_vocab": 9}  # fmt: skip
    (tokens / "bert_config.json").write_text(json.dumps(options))
    r = helpers.run_main(
        "convert_checkpoint.py",
        [
            "--from=cloze",
            "--to=bilm_hdf5",
            f"--input_dir={tokens}",
            f"--output_dir={tmp_path / 'd'}",
        ],
    )
    assert r.returncode == 1 and "no char_cnn: a token-embedding biLM" in r.stderr


def test_extract_features_gives_each_word_what_allennlp_computed(converted, tmp_path):
    """A converted published biLM needs no --vocab_file: extract_features splits each line into
    words, wraps them in <S> ... </S> and writes every word's L + 1 representations (within
    TOLERANCE of AllenNLP's) and their scalar mix; a line past max_seq_length is cut with a
    warning naming it, and a pair line is refused naming its line."""
    from data_prep import feature_files

    g, sentences = golden()
    text = tmp_path / "input.txt"
    text.write_text("".join(" ".join(words) + "\n" for words in sentences))
    args = [
        f"--input_file={text}", f"--bert_config_file={converted / 'bert_config.json'}",
        f"--init_checkpoint={converted}", "--max_seq_length=12", "--batch_size=3",
        "--elmo_word_split=whitespace", f"--npz_file={tmp_path / 'f.npz'}",
    ]  # fmt: skip
    r = helpers.run_main("extract_features.py", args)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = list(feature_files.read_npz(tmp_path / "f.npz"))
    assert [line.tokens for line in lines] == [list(w) for w in sentences]
    for b, line in enumerate(lines):
        n = len(line.tokens)
        assert line.layers == (0, 1, 2, 3) and line.values.shape == (n, 4, 16)
        for k in range(3):
            np.testing.assert_allclose(
                line.values[:, k], g["layers"][k, b, :n], rtol=0, atol=TOLERANCE
            )
        np.testing.assert_allclose(
            line.values[:, 3], g["layers"][:, b, :n].mean(axis=0), rtol=0, atol=TOLERANCE
        )
    # BERT's basic split (the default): punctuation is split off, the case is kept.
    text.write_text("Zürich, (again)!\n" + " ".join(["w"] * 11) + "\n")
    args[-1] = f"--npz_file={tmp_path / 'g.npz'}"
    r = helpers.run_main("extract_features.py", [a for a in args if "word_split" not in a])
    assert r.returncode == 0, r.stderr[-3000:]
    first, long = feature_files.read_npz(tmp_path / "g.npz")
    assert first.tokens == ["Zürich", ",", "(", "again", ")", "!"]
    assert long.tokens == ["w"] * 10 and f"{text}:2" in r.stderr and "were cut" in r.stderr
    text.write_text("one\na ||| b\n")
    r = helpers.run_main("extract_features.py", args)
    assert r.returncode == 1 and f"{text}:2: expected one text a line" in r.stderr


def test_run_ner_tags_words_with_a_converted_published_bilm(converted, tmp_path):
    """ELMo's NER recipe on a converted published biLM, no --vocab_file: each CoNLL word is one
    token and each window `<S> words </S>`, so the cached layers of a one-window sentence are the
    ones AllenNLP's computation gives it (sentence_layer_outputs, checked against AllenNLP above);
    the tagger trains on their scalar mix and tags every test word; a second run reads the cache
    (its key holds the run's words)."""
    from data_prep import conll
    from tests.test_run_ner import results, sentences, write_conll2003

    rng = np.random.default_rng(4)
    rows = {split: sentences(rng, n) for split, n in (("train", 12), ("dev", 5), ("test", 4))}
    rows["train"][0] = (["John", "visited", "New", "York", "."], ["B-PER", "O", "B-geo-loc",
                        "I-geo-loc", "O"])  # fmt: skip
    for split, name in (("train", "eng.train"), ("dev", "eng.testa"), ("test", "eng.testb")):
        write_conll2003(tmp_path / "conll" / name, rows[split])
    cache = tmp_path / "cache"
    args = [
        f"--data_dir={tmp_path / 'conll'}", f"--bert_config_file={converted / 'bert_config.json'}",
        f"--init_checkpoint={converted}", "--max_seq_length=11", "--window_overlap=3",
        "--feature_mode=sum_all", f"--feature_cache={cache}", "--do_train", "--do_eval",
        "--do_predict", "--train_batch_size=3", "--eval_batch_size=4", "--predict_batch_size=4",
        "--num_train_epochs=2", "--learning_rate=5e-2", "--save_checkpoints_steps=4",
    ]  # fmt: skip
    first = helpers.run_main("run_ner.py", [*args, f"--output_dir={tmp_path / 'a'}"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "train: encoder outputs (" in first.stderr
    layers = np.load(cache / "train.npz")["layer_features"]  # (W, S, L + 1, 2 P)
    expected, _ = elmo.sentence_layer_outputs(restore_bilm(converted), [rows["train"][0][0]])
    for k in range(3):
        np.testing.assert_allclose(
            layers[0, 1:6, k], expected[k][0], rtol=0, atol=TOLERANCE, err_msg=f"layer {k}"
        )
    assert 0 <= results(tmp_path / "a" / "eval_results.txt")["f1"] <= 1
    tagged = conll.read_conll(tmp_path / "a" / "test_predictions.txt").sentences
    assert [list(x.words) for x in tagged] == [w for w, _ in rows["test"]]
    second = helpers.run_main("run_ner.py", [*args, f"--output_dir={tmp_path / 'b'}"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "train: (" in second.stderr and "read from" in second.stderr
    # Without the cache the tagger runs the biLM on the run's words itself.
    plain = [a for a in args if not a.startswith(("--feature_cache", "--do_predict"))]
    uncached = helpers.run_main("run_ner.py", [*plain, f"--output_dir={tmp_path / 'd'}"])
    assert uncached.returncode == 0, uncached.stderr[-3000:]
    assert 0 <= results(tmp_path / "d" / "eval_results.txt")["f1"] <= 1
    # Other words under the same ids must not read the first run's outputs.
    rows["train"][0] = (["Mary", "visited", "New", "York", "."], rows["train"][0][1])
    write_conll2003(tmp_path / "conll" / "eng.train", rows["train"])
    third = helpers.run_main("run_ner.py", [*args, f"--output_dir={tmp_path / 'c'}"])
    assert third.returncode == 0, third.stderr[-3000:]
    assert "train: encoder outputs (" in third.stderr


def test_word_ids_read_through_the_runs_words_equal_the_sentences_characters(converted):
    """The ids path the run scripts take (tokenization.WordTokenizer's ids, [CLS] words [SEP],
    ElmoBiLM.read_words spelling [CLS] / [SEP] as <S> / </S>) computes what the character path
    does on the same sentences, which is AllenNLP's; a word the run did not see is [UNK]."""
    from data_prep import tokenization

    g, sentences = golden()
    tokenizer = tokenization.WordTokenizer(w for words in sentences for w in words)
    assert tokenizer.convert_tokens_to_ids(["unseen"]) == [tokenizer.vocab["[UNK]"]]
    bilm = restore_bilm(converted)
    bilm.read_words(tokenizer.spelled_tokens())
    longest = max(map(len, sentences)) + 2
    ids = np.zeros((len(sentences), longest), np.int32)
    for b, words in enumerate(sentences):
        ids[b, : len(words) + 2] = tokenizer.convert_tokens_to_ids(["[CLS]", *words, "[SEP]"])
    layers = elmo.elmo_layer_outputs(bilm, ids, (ids > 0).astype(np.int32))
    for k, layer in enumerate(layers):
        got = np.asarray(layer)[:, 1:-1] * g["mask"][:, :, None]
        np.testing.assert_allclose(got, g["layers"][k], rtol=0, atol=TOLERANCE)
    with pytest.raises(ValueError, match="reads a vocabulary's ids"):
        elmo.ElmoBiLM(
            elmo.ElmoConfig.from_dict(
                json.loads((FIXTURE / "options.json").read_text()) | {"n_tokens_vocab": 9}
            )
        ).read_words(["a"])


def test_run_classifier_learns_on_a_converted_published_bilm(converted, tmp_path):
    """run_classifier.py with the converted folder's options.json and no --vocab_file: the
    sentences' words (BasicTokenizer, cased) are the tokens, the frozen biLM is loaded and the
    scalar mix and softmax learn the two sentences."""
    from data_prep import glue

    args, out = helpers.two_sentences_args(
        tmp_path, converted / "bert_config.json", f"--init_checkpoint={converted}",
        "--max_seq_length=9", "--num_train_epochs=10", "--learning_rate=5e-2",
        "--iterations_per_loop=10", "--save_checkpoints_steps=30",
    )  # fmt: skip
    r = helpers.run_main("run_classifier.py", [a for a in args if "--vocab_file" not in a])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "an ELMo that reads words: 6 distinct words in the data" in r.stderr  # The ... .
    assert f"initialised the encoder from {converted / 'ckpt-1'}" in r.stderr
    results = dict(x.split(" = ") for x in (out / "eval_results.txt").read_text().splitlines())
    assert float(results["accuracy"]) == 1.0, results
    assert glue.read_submission(out / "SST-2.tsv") == [("4", "0"), ("8", "1")]


@pytest.mark.parametrize("script", ["run_classifier.py", "run_ner.py", "extract_features.py"])
def test_every_other_model_still_needs_its_vocab_file(tmp_path, script):
    config = f"--bert_config_file={ROOT / 'configs' / 'bert_tiny.json'}"
    args = {
        "run_classifier.py": ["--task_name=sst-2", f"--data_dir={tmp_path}", "--do_train"],
        "run_ner.py": [f"--data_dir={tmp_path}", "--do_train"],
        "extract_features.py": [f"--input_file={tmp_path / 'in.txt'}", "--init_checkpoint=x",
                                f"--output_file={tmp_path / 'f.jsonl'}"],
    }[script]  # fmt: skip
    (tmp_path / "in.txt").write_text("a line\n")
    out = [] if script == "extract_features.py" else [f"--output_dir={tmp_path / 'out'}"]
    r = helpers.run_main(script, [*args, config, *out])
    assert r.returncode == 1 and "--vocab_file is required" in r.stderr, r.stderr[-2000:]
