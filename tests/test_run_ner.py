"""Smoke runs of run_ner.py on a tiny model: fine-tuning on CoNLL-2003-layout IOB1 files with
sentences split into windows (train, dev eval with conlleval scores, labelled test), then predicting
an unlabelled one-column file from the kept checkpoint; a feature-based arm (frozen encoder,
scalar mix, BiLSTM) through the WNUT comparison driver; an ALBERT checkpoint fine-tuned and an
ELECTRA discriminator's cached outputs shared by two feature modes, equal to recomputing them; and
bad input stopping before output_dir exists."""

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from data_prep import conll, fetch, tokenization, wnut
from data_prep.tokenization import RESERVED_TOKENS
from modeling import albert, bert, electra, elmo, flops, tagging
from tests import helpers
from training import ner_eval, trainer

ELMO = {
    "lstm": {"dim": 17, "projection_dim": 5, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 3], [2, 5]], "n_highway": 1,
                 "max_characters_per_token": 9, "n_characters": 262, "activation": "relu"},
    "dropout": 0.0,
}  # fmt: skip
S = 11  # tiny config: max_position_embeddings 16
NAMES = {"john": "PER", "mary": "PER", "paris": "geo-loc", "london": "geo-loc", "acme": "ORG"}
OTHER = "the a in of went to saw works at visited city".split()
VOCAB = [*RESERVED_TOKENS, *NAMES, *OTHER, ".", ",", "new", "york"]


def run(args, check=True):
    """run_ner.py in this process (helpers.run_main); the WNUT driver's feature arm below runs it
    as the real command line (wnut.run_arm starts it as a subprocess)."""
    result = helpers.run_main("run_ner.py", args)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-4000:])
    return result


def sentences(rng, n):
    """(words, BIO tags): names are entities, "new york" a two-word geo-loc."""
    out = []
    for _ in range(n):
        words, spans = [], []
        for _ in range(int(rng.integers(2, 15))):
            r = rng.random()
            if r < 0.25:
                name = str(rng.choice(list(NAMES)))
                spans.append((NAMES[name], len(words), len(words)))
                words.append(name.capitalize())
            elif r < 0.32:
                spans.append(("geo-loc", len(words), len(words) + 1))
                words += ["New", "York"]
            else:
                words.append(str(rng.choice(OTHER)))
        out.append((words, conll.encode(spans, len(words), "bio")))
    return out


def write_conll2003(path, rows):
    """Four columns, -DOCSTART- lines, tags in IOB1 (as the original CoNLL-2003 files)."""
    lines = ["-DOCSTART- -X- -X- O", ""]
    for words, tags in rows:
        iob1 = conll.encode(conll.chunks(tags), len(tags), "iob1")
        lines += [f"{w} NNP I-NP {t}" for w, t in zip(words, iob1)] + [""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ner")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    config = helpers.tiny_config(num_hidden_layers=3)
    (d / "bert_config.json").write_text(config.to_json_string())
    rng = np.random.default_rng(0)
    rows = {"train": sentences(rng, 15), "dev": sentences(rng, 7), "test": sentences(rng, 5)}
    for split, name in (("train", "eng.train"), ("dev", "eng.testa"), ("test", "eng.testb")):
        write_conll2003(d / "conll" / name, rows[split])
    # An unlabelled test file: one column.
    (d / "unlabelled").mkdir()
    (d / "unlabelled" / "test.txt").write_text(
        "\n\n".join("\n".join(w) for w, _ in rows["test"]) + "\n"
    )
    # WNUT-16's layout for the driver: token<TAB>TAG, sentences separated by a tab-only line.
    wnut_lines = []
    for words, tags in sentences(rng, 20):
        wnut_lines += [f"{w}\t{t}" for w, t in zip(words, tags)] + ["\t"]
    (d / "wnut.txt").write_text("\n".join(wnut_lines) + "\n")
    pre = bert.BertPretrainer(config)
    pre.build()
    prefix = tf.train.Checkpoint(model=pre).save(str(d / "pretrain" / "ckpt"))
    return {"dir": d, "rows": rows, "config": config, "pretrain": prefix}


def common(files, data_dir, out):
    d = files["dir"]
    return [
        f"--data_dir={data_dir}",
        f"--vocab_file={d / 'vocab.txt'}",
        f"--bert_config_file={d / 'bert_config.json'}",
        f"--output_dir={out}",
        f"--max_seq_length={S}",
        "--window_overlap=3",
        "--eval_batch_size=4",
        "--predict_batch_size=4",  # as eval: one traced predict step serves both
    ]


@pytest.fixture(scope="module")
def smoke(files, tmp_path_factory):
    """The fine-tune + predict-only pair (in this process) and the driver's feature arm (a
    subprocess) side by side."""
    root = tmp_path_factory.mktemp("runs")
    d = files["dir"]
    tuned = root / "tuned"
    train_args = [
        *common(files, d / "conll", tuned), "--do_train", "--do_eval", "--do_predict",
        "--train_batch_size=3", "--learning_rate=5e-3", "--num_train_epochs=1",
        "--save_checkpoints_steps=3", "--iterations_per_loop=3",
    ]  # fmt: skip
    predict_args = [*common(files, d / "unlabelled", tuned), "--do_predict"]

    def finetune_then_predict():
        first = run(train_args)
        return first, run(predict_args)

    settings = {
        "max_seq_length": S, "window_overlap": 3, "train_batch_size": 3, "eval_batch_size": 4,
        "predict_batch_size": 4, "num_train_epochs": 1, "save_checkpoints_steps": 2,
        "iterations_per_loop": 2, "learning_rate": 5e-2, "lstm_units": 3,
    }  # fmt: skip

    def feature_arm():
        wnut.prepare(root / "wnut", 1, d / "wnut.txt")
        arm = ("features", files["pretrain"], "sum_last_four")
        return wnut.run_arm(
            root / "wnut", arm, [2], d / "vocab.txt", d / "bert_config.json", settings
        )

    with ThreadPoolExecutor(1) as pool:
        features = pool.submit(feature_arm)
        pair = finetune_then_predict()
    return {"tuned": (tuned, *pair), "features": (root / "wnut", features)}


def results(path):
    return {k: float(v) for k, v in (line.split(" = ") for line in path.read_text().splitlines())}


def test_finetune_eval_and_labelled_test(smoke, files):
    out, trained, _ = smoke["tuned"]
    log = trained.stderr
    assert "tag scheme iob1 (detected)" in log and "IOB1 tags converted to BIO" in log
    assert "split into overlapping windows" in log and "examples/s" in log
    for name in ("evaluating dev", "predicting test"):  # each pass's progress bar
        assert re.search(rf"{name}: 100%.*\[[0-9:]+<00:00, .* batches/s\]", log), name
    # The log's FLOP/s: 3 passes of modeling/flops.py's count per example (the encoder and the
    # tag layer at every position), the batches cut to 8 or 11 positions; no --peak_tflops.
    tags = len(json.loads((out / "model_config.json").read_text())["labels"])
    config = helpers.tiny_config(num_hidden_layers=3)
    per_example = [3 * flops.token_classifier_flops(config, s, tags) for s in (8, S)]
    helpers.check_logged_flops(log, *per_example)
    helpers.check_training_curves(log, out, "tagging_loss / held-out loss, token_accuracy, f1")
    r = results(out / "eval_results.txt")
    assert {"f1", "precision", "recall", "token_accuracy", "loss", "f1_PER", "f1_geo-loc",
            "global_step", "best_f1", "best_step"} <= set(r)  # fmt: skip
    assert 0 <= r["f1"] <= 1 and r["loss"] > 0 and r["best_step"] > 0
    evals = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in evals]
    assert steps[0] == 0 and steps[-1] == r["global_step"] and len(steps) >= 3
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["score"] == max(e["f1"] for e in evals if e["step"] > 0)
    saved = json.loads((out / "model_config.json").read_text())
    assert saved["tag_scheme"] == "iob1" and saved["labels"][:3] == ["O", "B-ORG", "I-ORG"]
    # dev_predictions.txt is conlleval's input: its gold column is the dev file in BIO, and its
    # scores are the ones reported.
    pred = conll.read_conll(out / "dev_predictions.txt")
    assert pred.columns == 3
    gold = [t for _, t in files["rows"]["dev"]]
    lines = (out / "dev_predictions.txt").read_text().split("\n\n")
    assert [[x.split(" ")[1] for x in block.splitlines()] for block in lines if block] == gold
    scores = ner_eval.evaluate(gold, [list(s.tags) for s in pred.sentences])
    assert scores["f1"] == pytest.approx(r["f1"])
    assert (out / "dev_conlleval.txt").read_text() == ner_eval.report(scores)
    if shutil.which("perl"):
        (script,) = fetch.fetch_package_files(
            "seqeval==1.2.2", lambda n: n.endswith("tests/conlleval.pl"), binary=False
        )
        with open(out / "dev_predictions.txt") as f:
            perl = subprocess.run(["perl", str(script)], stdin=f, capture_output=True, text=True)
        assert perl.stdout == (out / "dev_conlleval.txt").read_text()
    t = results(out / "test_results.txt")
    assert 0 <= t["f1"] <= 1 and (out / "test_conlleval.txt").exists()
    assert len(conll.read_conll(out / "test_predictions.txt").sentences) == 5


def test_predict_only_reads_the_runs_settings_and_tags_unlabelled_text(smoke, files):
    out, _, predicted = smoke["tuned"]
    assert "model_config.json" in predicted.stderr and "best/ckpt" in predicted.stderr
    data = conll.read_conll(out / "test_predictions.txt")
    assert data.columns == 2  # token, predicted
    assert [s.words for s in data.sentences] == [tuple(w) for w, _ in files["rows"]["test"]]
    labels = json.loads((out / "model_config.json").read_text())["labels"]
    assert all(t in labels for s in data.sentences for t in s.tags)


def test_feature_arm_trains_the_mix_and_leaves_the_encoder_frozen(smoke, files):
    out, job = smoke["features"]
    summary = job.result()  # re-raises a failed run_ner.py
    assert summary["feature_mode"] == "sum_last_four" and summary["test_f1"]["n"] == 1
    run_dir = out / "ner" / "features" / "seed_2"
    assert (run_dir / "test_predictions.txt").exists()
    assert json.loads((run_dir / "command.json").read_text())[0] == "run_ner.py"
    labels = json.loads((run_dir / "model_config.json").read_text())["labels"]
    assert "B-geo-loc" in labels and "I-geo-loc" in labels
    model = tagging.BertTagger(files["config"], len(labels), "sum_last_four", lstm_units=3)
    model.build()
    trainer.restore_model_weights(model, str(run_dir))
    pre = bert.BertPretrainer(files["config"])
    pre.build()
    tf.train.Checkpoint(model=pre).restore(files["pretrain"]).expect_partial()
    for a, b in zip(pre.encoder.weights, model.encoder.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # frozen: exactly the pretrained
    assert np.abs(model.scalar_mix.scalar_weights.numpy()).max() > 0  # the mix did train
    _, table = wnut.comparison_table(out)
    assert "| features |" in table and "sum_last_four" in table


def test_bad_input_stops_before_output_dir_exists(files, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "train.txt").write_text("John B-PER\nlives O\n\nMary B-PER\nin\n")
    (d / "dev.txt").write_text("John B-PER\n")
    out = tmp_path / "out"
    args = [*common(files, d, out), "--do_train", "--do_eval"]
    result = run(args, check=False)
    assert result.returncode != 0 and not out.exists()
    assert f"{d / 'train.txt'}:5: expected 2 columns as line 1, found 1: 'in'" in result.stderr
    (d / "train.txt").write_text("John B-PER\nlives O\n\nin O\nParis I-LOC\n")
    result = run([*args, "--tag_scheme=bio", "--invalid_tags=reject"], check=False)
    assert result.returncode != 0 and not out.exists()
    assert f"{d / 'train.txt'}:5: expected tags valid in strict bio, found 'I-LOC'" in (
        result.stderr
    )
    (d / "dev.txt").write_text("\n")
    result = run([*args, "--tag_scheme=bio"], check=False)
    assert f"{d / 'dev.txt'}: expected sentences" in result.stderr and not out.exists()
    result = run([*args, "--label_list=O,B-PER"], check=False)
    assert f"{d / 'train.txt'}:5: expected a tag in --label_list" in result.stderr


@pytest.fixture(scope="module")
def families(files, tmp_path_factory):
    """ALBERT fine-tuned, ELMo's frozen biLM tagging, and ELECTRA feature modes over one
    --feature_cache, one after the other in this process."""
    root = tmp_path_factory.mktemp("families")
    d = files["dir"]
    small = dict(
        vocab_size=len(VOCAB), embedding_size=5, hidden_size=12, num_attention_heads=3,
        intermediate_size=17, max_position_embeddings=16, type_vocab_size=2,
        initializer_range=0.02,
    )  # fmt: skip
    configs = {
        "albert": albert.AlbertConfig(num_hidden_layers=2, inner_group_num=2, **small),
        "electra": electra.ElectraConfig(
            num_hidden_layers=4, generator_hidden_size=0.25, generator_layers=1.0, **small
        ),
    }
    configs["elmo"] = elmo.ElmoConfig.from_dict(dict(ELMO, n_tokens_vocab=len(VOCAB)))
    prefixes = {}
    for name, cfg in configs.items():
        (root / f"{name}_config.json").write_text(cfg.to_json_string())
        model = {"albert": albert.AlbertPretrainer, "electra": electra.ElectraPretrainer,
                 "elmo": elmo.ElmoLM}[name](cfg)  # fmt: skip
        model.build()
        if name == "elmo":
            model.encoder.set_char_table(VOCAB)
        prefixes[name] = tf.train.Checkpoint(model=model).save(str(root / f"pre_{name}" / "ckpt"))

    def args(name, out, *extra):
        base = [a for a in common(files, d / "conll", out) if not a.startswith("--bert_config")]
        return [*base, f"--bert_config_file={root / f'{name}_config.json'}",
                f"--init_checkpoint={prefixes[name]}", "--do_train", "--do_eval",
                "--train_batch_size=3", "--num_train_epochs=1", "--save_checkpoints_steps=3",
                "--iterations_per_loop=3", *extra]  # fmt: skip

    def cached_pair():
        cache = f"--feature_cache={root / 'cache'}"
        # The cache's encoder outputs computed in 3 row slices (--encoder_branches), each on
        # its real tokens alone (--remove_padding): the test below tags with the same head on
        # the plain encoder and gets the same tags.
        first = run(args("electra", root / "sum_all", "--feature_mode=sum_all", cache,
                         "--learning_rate=5e-2", "--encoder_branches=3",
                         "--remove_padding"))  # fmt: skip
        second = run(args("electra", root / "last", "--feature_mode=last", cache,
                          "--learning_rate=5e-2", "--do_predict"))  # fmt: skip
        return first, second

    def albert_then_elmo():
        tuned = run(args("albert", root / "albert", "--learning_rate=5e-3", "--encoder_branches=2",
                         "--remove_padding", "--xla_weight_gradients"))  # fmt: skip
        # ELMo's downstream tagger: the scalar mix of the biLM's cached layers, then a tagger.
        bilm = run(args("elmo", root / "elmo", "--feature_mode=sum_all", "--learning_rate=5e-2",
                        f"--feature_cache={root / 'elmo_cache'}", "--do_predict"))  # fmt: skip
        refused = run(args("elmo", root / "elmo_tuned"), check=False)
        no_branches = run(args("elmo", root / "elmo_branches", "--feature_mode=sum_all",
                               "--encoder_branches=2"), check=False)  # fmt: skip
        no_unpadding = run(args("elmo", root / "elmo_unpadded", "--feature_mode=sum_all",
                                "--remove_padding"), check=False)  # fmt: skip
        return tuned, bilm, refused, (no_branches, no_unpadding)

    tuned, bilm, refused, (no_branches, no_unpadding) = albert_then_elmo()
    return {"root": root, "configs": configs, "prefixes": prefixes, "albert": tuned,
            "elmo": (bilm, refused, no_branches, no_unpadding),
            "electra": cached_pair()}  # fmt: skip


def test_an_albert_checkpoint_fine_tunes(families):
    out = families["root"] / "albert"
    assert "initialised the encoder from" in families["albert"].stderr
    assert "--remove_padding: encoder run on each batch's real tokens" in families["albert"].stderr
    # ALBERT's embedding projection, its 2 shared inner layers' 4 each, the pooler, the tagger's
    assert "--xla_weight_gradients: 11 dense layers' kernel gradients" in families["albert"].stderr
    assert 0 <= results(out / "eval_results.txt")["f1"] <= 1
    saved = json.loads((out / "model_config.json").read_text())
    assert saved["bert_config"]["inner_group_num"] == 2  # read as ALBERT, not as BERT


def test_an_elmo_bilm_tags_through_its_scalar_mix_and_is_never_fine_tuned(families, files):
    bilm, refused, no_branches, no_unpadding = families["elmo"]
    out = families["root"] / "elmo"
    saved = json.loads((out / "model_config.json").read_text())
    assert saved["bert_config"]["lstm"]["n_layers"] == 2 and saved["feature_mode"] == "sum_all"
    assert "train: encoder outputs (" in bilm.stderr  # L + 1 = 3 representations, 2 P = 10 wide
    cached = np.load(families["root"] / "elmo_cache" / "train.npz")["layer_features"]
    assert cached.shape[2:] == (3, 10)
    # The log's FLOP/s: on cached features no encoder runs, only the head trains (3 passes of
    # its linear layer over the 10-wide mix at all S positions: cached windows are not cut).
    per_example = 3 * flops.tagger_head_flops(S, 10, len(saved["labels"]))
    helpers.check_logged_flops(bilm.stderr, per_example, per_example)
    assert 0 <= results(out / "eval_results.txt")["f1"] <= 1
    tagged = conll.read_conll(out / "test_predictions.txt").sentences
    assert [len(x.words) for x in tagged] == [len(w) for w, _ in files["rows"]["test"]]
    # The trained mix sits under BertTagger's names and loads into an ElmoTagger on the biLM.
    model = tagging.ElmoTagger(families["configs"]["elmo"], len(saved["labels"]), "sum_all")
    model.build()
    trainer.init_from_checkpoint(model, families["prefixes"]["elmo"])
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(out)).expect_partial()
    assert abs(float(model.scalar_mix.gamma.numpy()) - 1.0) > 1e-4  # gamma trained
    assert refused.returncode != 0 and "an ELMo biLM stays frozen" in refused.stderr
    # --encoder_branches runs a Transformer encoder's layers in row slices; a biLM has none.
    assert no_branches.returncode != 0
    assert "--encoder_branches=2: expected 1, or more for a Transformer" in no_branches.stderr
    assert "(found an ELMo biLM)" in no_branches.stderr
    assert no_unpadding.returncode != 0  # nor does it run on the real tokens alone
    want = "--remove_padding: runs a Transformer encoder's layers on the real tokens alone"
    assert f"{want} (found an ELMo biLM)" in no_unpadding.stderr


def test_feature_modes_share_one_cache_and_equal_the_recomputed_encoder(families, files):
    root, (first, second) = families["root"], families["electra"]
    for split in ("train", "dev"):
        assert f"{split}: encoder outputs (" in first.stderr  # computed once ...
        assert f"{split}: (" in second.stderr and "read from" in second.stderr  # ... then read
    assert "run on each batch's real tokens" in first.stderr  # the cache's encoder, unpadded
    assert "test: encoder outputs (" in second.stderr  # a split not cached before
    assert (root / "last" / "test_predictions.txt").exists()
    # The head trained on cached outputs, put on the ELECTRA encoder itself, tags dev the same.
    out = root / "sum_all"
    labels = json.loads((out / "model_config.json").read_text())["labels"]
    model = tagging.BertTagger(families["configs"]["electra"], len(labels), "sum_all")
    model.build()
    trainer.init_from_checkpoint(model, families["prefixes"]["electra"])
    final = tf.train.latest_checkpoint(out)  # dev_predictions.txt: the final weights' tags
    tf.train.Checkpoint(model=model).restore(final).expect_partial()
    head = tagging.FeatureTagger(families["configs"]["electra"], len(labels), "sum_all")
    head.build()
    trainer.restore_model_weights(head, final)
    for a, b in zip(head.weights, model.scalar_mix.weights + model.classifier.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert abs(float(model.scalar_mix.gamma.numpy()) - 1.0) > 1e-4  # the head did train
    dev = conll.read_conll(out / "dev_predictions.txt").sentences  # tags: the predicted column
    tokenizer = tokenization.FullTokenizer(str(files["dir"] / "vocab.txt"), True)
    encoded = conll.encode_sentences(dev, labels, tokenizer, S, 3)
    logits = model(
        {k: encoded.features[k] for k in ("input_ids", "input_mask", "segment_ids")}
    ).numpy()
    tags = conll.reassemble(encoded, np.argmax(logits, axis=-1), labels)
    assert tags == [list(x.tags) for x in dev]


def test_mixed_precision_tags_near_float32_and_fp16_trains_with_a_loss_scale(files, tmp_path):
    # --precision on a fine-tuned tagger with a BiLSTM head: the same seeds, data and starting
    # weights, so the bf16 and fp16 runs' dev loss ends near fp32's but not on it; fp16 logs
    # Keras' dynamic loss scale at every step; the precision is a run setting a resume keeps.
    rng = np.random.default_rng(5)
    rows = [(words[:4], tags[:4]) for words, tags in sentences(rng, 14)]
    write_conll2003(tmp_path / "data" / "eng.train", rows[:8])
    write_conll2003(tmp_path / "data" / "eng.testa", rows[8:])
    loss = {}
    for precision in ("fp32", "bf16", "fp16"):
        out = tmp_path / precision
        args = [
            *common(files, tmp_path / "data", out), "--max_seq_length=16", "--lstm_units=3",
            "--train_batch_size=4", "--learning_rate=5e-3", "--num_train_epochs=1",
            "--save_checkpoints_steps=2", "--iterations_per_loop=2", "--do_train", "--do_eval",
        ]  # fmt: skip
        run([*args, f"--precision={precision}"])
        loss[precision] = results(out / "eval_results.txt")["loss"]
        helpers.check_precision_run(out, precision)
    for precision in ("bf16", "fp16"):
        assert 0 < abs(loss[precision] - loss["fp32"]) < 0.05, loss
    # fp16's folder, now at fp32
    helpers.check_precision_resume_refused(run([*args, "--num_train_epochs=2"], False))


def test_dynamic_padding_tags_the_same_and_is_refused_where_it_cannot_apply(files, tmp_path):
    rng = np.random.default_rng(3)
    rows = [(words[:4], tags[:4]) for words, tags in sentences(rng, 14)]  # at most 7 of 16 pieces
    write_conll2003(tmp_path / "data" / "eng.train", rows[:8])
    write_conll2003(tmp_path / "data" / "eng.testa", rows[8:])
    out = tmp_path / "out"
    args = [
        *common(files, tmp_path / "data", out), "--max_seq_length=16", "--lstm_units=3",
        "--train_batch_size=4", "--learning_rate=5e-3", "--num_train_epochs=1",
        "--save_checkpoints_steps=2", "--iterations_per_loop=2",
    ]  # fmt: skip
    trained = run([*args, "--do_train"])
    # The log's FLOP/s: 3 passes of the encoder, the 2-layer BiLSTM of 3 units and the tag
    # layer per window, the batches cut to at most 9 positions ([CLS], 7 pieces, [SEP]).
    tags = len(json.loads((out / "model_config.json").read_text())["labels"])
    config = helpers.tiny_config(num_hidden_layers=3)
    h = config.hidden_size
    per_example = [
        3 * (flops.backbone_flops(config, s) + flops.tagger_head_flops(s, h, tags, 3, 2))
        for s in (3, 9)
    ]
    helpers.check_logged_flops(trained.stderr, *per_example)
    # Without --do_eval no held-out panel, so none is empty.
    helpers.check_training_curves(
        trained.stderr, out, "tagging_loss / held-out loss, token_accuracy"
    )
    real = re.search(r"train: ([\d.]+)% of the 16 positions are real tokens; each batch is cut "
                     r"to its longest window", trained.stderr)  # fmt: skip
    assert real and float(real.group(1)) < 7 / 16 * 100, trained.stderr[-3000:]
    scores, tagged = {}, {}
    for flag in ("--dynamic_padding", "--nodynamic_padding"):
        run([*args, "--do_eval", flag])  # the latest checkpoint; the BiLSTM reads the mask
        scores[flag] = results(out / "eval_results.txt")
        tagged[flag] = (out / "dev_predictions.txt").read_text()
    cut, full = scores["--dynamic_padding"], scores["--nodynamic_padding"]
    assert cut["loss"] == pytest.approx(full["loss"], abs=1e-6)
    assert cut["f1"] == full["f1"] and tagged["--dynamic_padding"] == tagged["--nodynamic_padding"]
    cache = ["--feature_mode=sum_last_four", f"--feature_cache={tmp_path / 'cache'}",
             f"--init_checkpoint={files['pretrain']}"]  # fmt: skip
    refusals = {
        "--feature_cache holds full-length windows": cache,
        "a TPU needs static shapes": ["--distribution_strategy=tpu"],
    }
    fresh = tmp_path / "fresh"
    for why, flags in refusals.items():
        result = run([*args, "--do_train", *flags, "--dynamic_padding", f"--output_dir={fresh}"],
                     False)  # fmt: skip
        assert result.returncode != 0
        assert f"--dynamic_padding: not here ({why}); drop the flag" in result.stderr
    assert not fresh.exists() and not (tmp_path / "cache").exists()  # refused before writing
    # --group_by_length needs cut batches; with them it trains (windows sorted in groups of 50
    # batches of 4 from the repeated 8) and tags the dev set.
    helpers.check_group_by_length(run, args, fresh)
    assert results(fresh / "eval_results.txt")["global_step"] == 2
