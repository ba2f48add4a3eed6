"""Smoke runs of run_classifier.py, one per task type: pair classification with two dev sets and
three submission files (MNLI + AX), regression (STS-B, then predicting from the kept best), and
multiple choice (SWAG); plus bad input stopping before output_dir exists. Also, in this process,
a user's own --task_name=tsv under --distribution_strategy=mirrored (two replicas over conftest's
two logical CPUs) and --tfds_name reading through tensorflow-datasets (tfds.testing.mock_data,
never the network)."""

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from data_prep import glue, rt_polarity
from modeling import flops
from tests import helpers
from tests.test_glue import VOCAB, WORDS, write_task
from training import distribute

S = 13  # tiny config: max_position_embeddings 16
PEAK = 1e-4  # TFLOP/s, a made-up peak for the log's FLOPs utilisation


def run(args, check=True):
    """run_classifier.py in this process (helpers.run_main); the rt-polarity arm below runs it as
    the real command line (rt_polarity.finetune_arm starts it as a subprocess)."""
    result = helpers.run_main("run_classifier.py", args)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-4000:])
    return result


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (d / "bert_config.json").write_text(helpers.tiny_config().to_json_string())
    return d


def common(model_files, data_dir, out, task):
    return [
        f"--task_name={task}",
        f"--data_dir={data_dir}",
        f"--vocab_file={model_files / 'vocab.txt'}",
        f"--bert_config_file={model_files / 'bert_config.json'}",
        f"--output_dir={out}",
        f"--max_seq_length={S}",
        "--train_batch_size=3",
        "--eval_batch_size=4",
        "--predict_batch_size=4",  # as eval: one traced predict step serves both
        "--learning_rate=1e-3",
        "--num_train_epochs=1",
        "--save_checkpoints_steps=2",
        "--iterations_per_loop=2",
    ]


def results(out):
    return {
        k: float(v)
        for k, v in (
            line.split(" = ") for line in (out / "eval_results.txt").read_text().split("\n") if line
        )
    }


def check_submission(path, test_file_rows, allowed):
    rows = glue.read_submission(path)
    assert [i for i, _ in rows] == [r["index"] for r in test_file_rows]
    assert all(p in allowed for _, p in rows), rows


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, model_files):
    """Runs the three smoke jobs in this process, one after the other, while the rt-polarity arm
    (a subprocess) runs beside them. Returns {job: (output_dir, expected rows per split,
    [helpers.Completed])}."""
    root = tmp_path_factory.mktemp("smoke")
    jobs = {}
    data = root / "glue" / "MNLI"
    expected = write_task(data, glue.get_task("mnli"), sizes=(11, 5, 5))
    args = [*common(model_files, data, root / "mnli", "MNLI"), "--do_train", "--do_eval"]
    jobs["mnli"] = (root / "mnli", expected, [[*args, "--do_predict", f"--peak_tflops={PEAK}"]])
    data = root / "STS-B"
    expected = write_task(data, glue.get_task("sts-b"), sizes=(9, 5, 5))
    args = [*common(model_files, data, root / "stsb", "sts-b"), "--pooling=mean"]
    # Train and evaluate, then a second run predicts from the kept best checkpoint.
    jobs["stsb"] = (
        root / "stsb",
        expected,
        [[*args, "--do_train", "--do_eval"], [*args, "--do_predict"]],
    )
    data = root / "swag"
    expected = write_task(data, glue.get_task("swag"), sizes=(6, 4, 5))
    args = [*common(model_files, data, root / "swag", "swag"), "--do_train", "--do_eval"]
    jobs["swag"] = (root / "swag", expected, [[*args, "--do_predict", "--layerwise_lr_decay=0.8"]])

    # The rt-polarity comparison's path: one arm, one seed, on a small SST-2-layout split.
    rows = [(str(y), f"{'a good fun' if y == 1 else 'a dull bad'} film {i} .") for i, y in
            enumerate([1, -1] * 8)]  # fmt: skip
    rt_polarity.write_sst2_layout(root / "rt" / "sst2", rows[:10], rows[10:13], rows[13:])
    settings = {
        "max_seq_length": S, "train_batch_size": 3, "eval_batch_size": 3,
        "predict_batch_size": 3, "learning_rate": 1e-3, "num_train_epochs": 1,
        "save_checkpoints_steps": 2, "iterations_per_loop": 2,
    }  # fmt: skip
    arm = (model_files / "vocab.txt", model_files / "bert_config.json", settings)

    def run_all(commands):
        done = []
        for command in commands:
            done.append(run(command, check=False))
            if done[-1].returncode:
                break
        return done

    with ThreadPoolExecutor(1) as pool:
        rt_job = pool.submit(rt_polarity.finetune_arm, root / "rt", "scratch", "", [5], *arm)
        out = {name: (*job[:2], run_all(job[2])) for name, job in jobs.items()}
    return out | {"rt": (root / "rt", rt_job)}


def finished(job):
    out, expected, done = job
    for result in done:
        assert result.returncode == 0, result.stderr[-4000:]
    return out, expected, done


def test_pair_classification_mnli_with_ax(smoke):
    out, expected, (result,) = finished(smoke["mnli"])
    assert "examples/s" in result.stderr and "were truncated" in result.stderr
    # Each evaluation and prediction pass shows its progress bar (batches, rate, time left).
    for name in ("evaluating matched", "evaluating mismatched", "predicting ax"):
        assert re.search(rf"{name}: 100%.*\[[0-9:]+<00:00, .* batches/s\]", result.stderr), name
    # The log's FLOP/s: 3 passes of modeling/flops.py's count per example (3 classes, the last
    # layer at [CLS]), the batches cut to 8 or 13 positions, and its share of --peak_tflops.
    per_example = [
        3 * flops.sequence_classifier_flops(helpers.tiny_config(), s, 3, True, True) for s in (8, S)
    ]
    helpers.check_logged_flops(result.stderr, *per_example, peak_tflops=PEAK)
    r = results(out)
    assert set(r) == {
        "accuracy", "score", "loss", "mismatched_accuracy", "mismatched_score",
        "mismatched_loss", "global_step",
    }  # fmt: skip
    assert r["global_step"] == 3 and 0 <= r["accuracy"] <= 1 and r["loss"] > 0
    evals = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 3]
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["score"] == max(e["score"] for e in evals)
    assert best["step"] == next(e["step"] for e in evals if e["score"] == best["score"])
    labels = set(glue.get_task("mnli").labels)
    for name, rows in zip(("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"), expected[-3:], strict=True):
        check_submission(out / name, rows, labels)
    assert (out / "train.tf_record").exists()
    helpers.check_training_curves(result.stderr, out, "loss, accuracy, mismatched_accuracy")


def test_regression_stsb_then_predict_from_best(smoke):
    out, expected, (trained, predicted) = finished(smoke["stsb"])
    r = results(out)
    assert {"pearson", "spearman", "score", "loss"} <= set(r)
    assert r["score"] == pytest.approx((r["pearson"] + r["spearman"]) / 2)
    assert "STS-B.tsv" not in trained.stderr and "best/ckpt" in predicted.stderr
    # No accuracy for a regression: its loss, then the dev split's held-out correlations.
    helpers.check_training_curves(trained.stderr, out, "loss, pearson, spearman")
    rows = glue.read_submission(out / "STS-B.tsv")
    assert [i for i, _ in rows] == [e["index"] for e in expected[-1]]
    assert all(len(p.split(".")[1]) == 3 and float(p) == float(p) for _, p in rows)


def test_multiple_choice_swag(smoke):
    out, expected, _ = finished(smoke["swag"])
    assert set(results(out)) == {"accuracy", "score", "loss", "global_step"}
    check_submission(out / "SWAG.tsv", expected[-1], set(glue.get_task("swag").labels))


def test_bad_input_stops_before_output_dir_exists(model_files, tmp_path):
    data = tmp_path / "SST-2"
    write_task(data, glue.get_task("sst-2"), sizes=(6, 4, 3))
    with open(data / "dev.tsv", "a") as f:
        f.write("a film\tmaybe\n")
    out = tmp_path / "out"
    result = run([*common(model_files, data, out, "sst-2"), "--do_train", "--do_eval"], False)
    assert result.returncode != 0
    assert f"{data / 'dev.tsv'}:6: expected a label in ['0', '1'], found 'maybe'" in result.stderr
    assert not out.exists()


def test_rt_polarity_arm_runs_and_summarises_seeds(smoke):
    out, job = smoke["rt"]
    summary = job.result()  # re-raises a failed run_classifier.py, with its exit code
    run_dir = out / "finetune" / "scratch" / "seed_5"
    assert (run_dir / "SST-2.tsv").exists() and (run_dir / "best" / "best.json").exists()
    assert [r["seed"] for r in summary["runs"]] == [5]
    assert summary["test_accuracy"]["n"] == 1 and 0 <= summary["test_accuracy"]["mean"] <= 1
    saved = json.loads((out / "finetune" / "scratch" / "summary.json").read_text())
    assert saved["runs"] == summary["runs"] and saved["settings"]["max_seq_length"] == S


def test_user_tsv_task_trains_evaluates_and_predicts_under_mirrored(
    tmp_path, model_files, monkeypatch
):
    built = []

    def get_strategy(name, tpu_address):
        # One MirroredStrategy per process (helpers.mirrored_strategy says why): the flag's
        # strategy is the shared one, and setup() still checks the batches against its replicas.
        assert name == "mirrored"
        built.append(helpers.mirrored_strategy())
        return built[-1]

    monkeypatch.setattr(distribute, "get_strategy", get_strategy)
    task = glue.get_task("tsv", ["neg", "pos"])
    data, out = tmp_path / "mine", tmp_path / "out"
    expected = write_task(data, task, sizes=(12, 5, 7))
    args = [*common(model_files, data, out, "tsv"), "--label_list=neg,pos"]
    args = [a for a in args if "batch_size" not in a]
    args += ["--distribution_strategy=mirrored", "--eval_batch_size=4", "--predict_batch_size=4"]
    odd = helpers.run_main("run_classifier.py", [*args, "--train_batch_size=3", "--do_train"])
    assert odd.returncode == 1 and "--train_batch_size=3 is not divisible by 2" in odd.stderr
    bad = helpers.run_main("run_classifier.py", [*args, "--do_eval", "--encoder_branches=0"])
    assert bad.returncode == 1 and "--encoder_branches=0: encoder branches: expected" in bad.stderr
    # The encoder's layers in 2 row slices of each replica's batch of 2 (run_layer_stack), each
    # on its real tokens alone, every dense layer's kernel gradient an XLA dot.
    run = helpers.run_main(
        "run_classifier.py",
        [*args, "--train_batch_size=4", "--do_train", "--do_eval", "--do_predict"]
        + ["--encoder_branches=2", "--remove_padding", "--xla_weight_gradients"],
    )
    assert run.returncode == 0, run.stderr[-4000:]
    # 4 a layer at 2 layers, the pooler and the classifier
    assert "--xla_weight_gradients: 10 dense layers' kernel gradients" in run.stderr
    assert "--remove_padding: encoder run on each batch's real tokens" in run.stderr
    assert "the logged FLOP/s count the products they run" in run.stderr
    assert built and built[-1].num_replicas_in_sync == 2
    r = results(out)
    assert r["global_step"] == 3 and 0.0 <= r["accuracy"] <= 1.0  # 12 examples / batch 4
    (submission,) = out.glob("*.tsv")
    rows = glue.read_submission(submission)
    assert [i for i, _ in rows] == [e["index"] for e in expected[-1]]  # every row, in order
    assert {p for _, p in rows} <= {"neg", "pos"}


def test_tfds_name_fine_tunes_from_tensorflow_datasets(tmp_path, model_files):
    import tensorflow_datasets as tfds

    out = tmp_path / "out"
    args = [*common(model_files, tmp_path / "tfds", out, "sst-2"), "--tfds_name=glue/sst2"]
    with tfds.testing.mock_data(num_examples=9):
        run = helpers.run_main("run_classifier.py", [*args, "--do_train", "--do_eval"])
    assert run.returncode == 0, run.stderr[-4000:]
    r = results(out)
    assert r["global_step"] == 3 and 0.0 <= r["accuracy"] <= 1.0  # 9 examples / batch 3


def test_hugging_face_roberta_converts_and_fine_tunes_with_its_own_bpe(tmp_path):
    """A Hugging Face RoBERTa folder (RobertaForMaskedLM weights, LayerNorm epsilon 1e-5,
    positions from 2, RoBERTa's vocab.json + merges.txt) goes through convert_checkpoint.py
    --from=hf --to=cloze, whose folder is run_classifier.py's --vocab_file, --bert_config_file
    and --init_checkpoint: the pairs are byte-level BPE as <s> a </s></s> b </s> padded with
    <pad>, and the run starts from the converted weights; run_ner.py and run_squad.py fine-tune
    with the same folder, and extract_features.py reads the converted encoder's values.
    Formats that cannot hold the epsilon refuse it."""
    import numpy as np
    import tensorflow as tf

    from data_prep import bpe
    from modeling import bert, checkpoints

    hf, conv, out = tmp_path / "hf", tmp_path / "conv", tmp_path / "out"
    helpers.roberta_bpe_folder(hf)
    config = helpers.tiny_config(
        vocab_size=50261,
        position_offset=2,
        type_vocab_size=1,
        max_position_embeddings=50,  # 48 positions for run_squad below
        hidden_act="gelu_exact",
        layer_norm_eps=1e-5,
    )
    model = bert.BertPretrainer(config, "none")
    model.build()
    checkpoints.save_hf(model, hf)
    hf_config = json.loads((hf / "config.json").read_text())
    assert (hf_config["model_type"], hf_config["layer_norm_eps"]) == ("roberta", 1e-5)
    hf_config |= {"bos_token_id": 0, "eos_token_id": 2}  # as roberta-base's config.json
    (hf / "config.json").write_text(json.dumps(hf_config))
    # roberta-base's and roberta-large's RobertaForMaskedLM weights hold no pooler.
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(hf / "model.safetensors"))
    assert {"roberta.pooler.dense.weight", "roberta.pooler.dense.bias"} <= set(arrays)
    arrays = {k: v for k, v in arrays.items() if ".pooler." not in k}
    save_file(arrays, str(hf / "model.safetensors"), metadata={"format": "pt"})

    args = ["--from=hf", f"--input_dir={hf}", f"--output_dir={conv}"]
    converted = helpers.run_main("convert_checkpoint.py", [*args, "--to=cloze"])
    assert converted.returncode == 0, converted.stderr[-4000:]
    assert "the checkpoint has no pooler" in converted.stderr
    assert bpe.folder_files(conv) == (conv / "vocab.json", conv / "merges.txt")
    read = bert.BertConfig.from_json_file(conv / "bert_config.json")
    assert (read.layer_norm_eps, read.position_offset) == (1e-5, 2)
    # And back to Hugging Face with its BPE: keras-hub's own RoBERTa tokenizer reads the folder
    # as Cloze does, and its config is the same RoBERTa. (keras-hub's RobertaBackbone loader
    # wants RobertaForMaskedLM's "roberta." names; this encoder-only folder has RobertaModel's:
    # test_checkpoints compares the weights through a pretrainer's export.)
    import keras_hub

    back = tmp_path / "back"
    exported = helpers.run_main(
        "convert_checkpoint.py",
        ["--from=cloze", "--to=hf", f"--input_dir={conv}", f"--output_dir={back}"],
    )
    assert exported.returncode == 0, exported.stderr[-4000:]
    tokenizer_config = json.loads((back / "tokenizer_config.json").read_text())
    assert tokenizer_config == {"tokenizer_class": "RobertaTokenizer"}
    hub_tokenizer = keras_hub.models.RobertaTokenizer.from_preset(str(back))
    text = "RoBERTa's tokenizer, read back: naïve café 東京."
    ours = bpe.RobertaTokenizer.from_folder(conv)
    assert np.asarray(hub_tokenizer(text)).tolist() == ours.convert_tokens_to_ids(
        ours.tokenize(text)
    )
    assert checkpoints.read_any_config(back / "config.json") == read
    # A BERT (positions from 0) with RoBERTa's epsilon: formats whose BERT fixes 1e-12 refuse.
    bert_eps = tmp_path / "bert_eps"
    bert_eps.mkdir()
    as_bert = read.replace(position_offset=0, hidden_act="gelu")
    (bert_eps / "bert_config.json").write_text(as_bert.to_json_string())
    for f in [*conv.glob("ckpt-*"), conv / "checkpoint"]:
        (bert_eps / f.name).write_bytes(f.read_bytes())
    refused = helpers.run_main(
        "convert_checkpoint.py",
        ["--from=cloze", "--to=tf1_bert", f"--input_dir={bert_eps}", f"--output_dir={out}"],
    )
    assert refused.returncode == 1 and "keeps layer_norm_eps=1e-05" in refused.stderr
    assert not out.exists()

    data = tmp_path / "MRPC"
    write_task(data, glue.get_task("mrpc"), sizes=(6, 4, 3))
    args = [
        "--task_name=MRPC",
        f"--data_dir={data}",
        f"--vocab_file={conv}",
        f"--bert_config_file={conv / 'bert_config.json'}",
        f"--init_checkpoint={conv}",
        f"--output_dir={out}",
        f"--max_seq_length={S}",
        "--train_batch_size=3",
        "--eval_batch_size=4",
        "--num_train_epochs=1",
        "--learning_rate=0",  # the trained encoder stays the converted one
        "--do_train",
        "--do_eval",
    ]
    result = run(args)
    assert "no position_offset" not in result.stderr
    r = results(out)
    assert r["global_step"] == 2 and 0.0 <= r["accuracy"] <= 1.0  # 6 examples / batch 3
    # The records it trained on: <s> a </s></s> b </s>, one segment, a and b decoding back to
    # the starts of the file's texts (truncated to 13 tokens).
    texts = [line.split("\t")[3:5] for line in (data / "train.tsv").read_text().splitlines()[1:]]
    tokenizer = bpe.RobertaTokenizer.from_folder(conv)
    for record in tf.data.TFRecordDataset(str(out / "train.tf_record")):
        f = tf.train.Example.FromString(record.numpy()).features.feature
        ids = list(f["input_ids"].int64_list.value)
        n = sum(f["input_mask"].int64_list.value)
        assert set(f["segment_ids"].int64_list.value) == {0} and set(ids[n:]) <= {1}  # <pad>
        ids = ids[:n]
        assert ids[0] == 0 and ids[-1] == 2 and ids.count(2) == 3 and 1 not in ids
        cut = ids.index(2)
        assert ids[cut + 1] == 2
        a, b = tokenizer.bpe.decode(ids[1:cut]), tokenizer.bpe.decode(ids[cut + 2 : -1])
        assert any(ta.startswith(a) and tb.startswith(b) and a and b for ta, tb in texts), (a, b)
    # It started from the converted weights (the learning rate is 0).
    (latest,) = {tf.train.latest_checkpoint(str(out))} - {None}
    (name,) = [
        n
        for n, shape in tf.train.list_variables(latest)
        if n.startswith("optimizer/_trainable_variables/") and shape == [50261, 12]
    ]
    table = tf.train.load_checkpoint(latest).get_tensor(name)
    np.testing.assert_array_equal(table, model.encoder.embeddings.word_embeddings.numpy())

    # run_ner.py with the same folder: each word's tokens with a leading space, <s> ... </s>.
    from tests.test_run_ner import sentences, write_conll2003

    rng = np.random.default_rng(1)
    rows = {name: sentences(rng, 6) for name in ("eng.train", "eng.testa")}  # train, dev
    for name, split_rows in rows.items():
        write_conll2003(tmp_path / "conll" / name, split_rows)
    ner_out = tmp_path / "ner"
    ner_args = [
        f"--data_dir={tmp_path / 'conll'}",
        f"--vocab_file={conv}",
        f"--bert_config_file={conv / 'bert_config.json'}",
        f"--init_checkpoint={conv}",
        f"--output_dir={ner_out}",
        f"--max_seq_length={S}",
        "--window_overlap=3",
        "--train_batch_size=3",
        "--eval_batch_size=4",
        "--num_train_epochs=1",
        "--do_train",
        "--do_eval",
    ]
    ner = helpers.run_main("run_ner.py", ner_args)
    assert ner.returncode == 0, ner.stderr[-4000:]
    assert "no position_offset" not in ner.stderr
    assert "f1 = " in (ner_out / "eval_results.txt").read_text()
    # Its windows: <s> words </s> padded with <pad>, every word with its leading space.
    lines = [" " + " ".join(words) for words, _ in rows["eng.train"]]
    for record in tf.data.TFRecordDataset(str(ner_out / "train.tf_record")):
        f = tf.train.Example.FromString(record.numpy()).features.feature
        ids = list(f["input_ids"].int64_list.value)
        n = sum(f["input_mask"].int64_list.value)
        assert ids[0] == 0 and ids[n - 1] == 2 and set(ids[n:]) <= {1}
        text = tokenizer.bpe.decode(ids[1 : n - 1])
        assert text.startswith(" ") and any(text in line for line in lines), text
    # run_squad.py with the same folder on the real SQuAD sample: <s> question </s></s> window
    # </s>; every predicted answer is text of its own context.
    from data_prep import fetch

    (sample,) = fetch.fetch_package_files(
        "allennlp==0.9.0", lambda n: n.endswith("tests/fixtures/data/squad.json"), binary=True
    )
    qa_out = tmp_path / "squad"
    qa = helpers.run_main(
        "run_squad.py",
        [
            f"--vocab_file={conv}",
            f"--bert_config_file={conv / 'bert_config.json'}",
            f"--init_checkpoint={conv}",
            f"--train_file={sample}",
            f"--predict_file={sample}",
            f"--output_dir={qa_out}",
            "--max_seq_length=48",
            "--doc_stride=16",
            "--max_query_length=12",
            "--train_batch_size=4",
            "--predict_batch_size=8",
            "--num_train_epochs=1",
            "--do_train",
            "--do_predict",
            "--do_eval",
        ],
    )
    assert qa.returncode == 0, qa.stderr[-4000:]
    assert "no position_offset" not in qa.stderr
    predictions = json.loads((qa_out / "predictions.json").read_text())
    contexts = {
        q["id"]: p["context"]
        for article in json.loads(sample.read_text())["data"]
        for p in article["paragraphs"]
        for q in p["qas"]
    }
    assert predictions.keys() == contexts.keys()
    assert all(text and text in contexts[qid] for qid, text in predictions.items()), predictions
    scores = (qa_out / "eval_results.txt").read_text()
    assert "exact_match = " in scores and "f1 = " in scores
    # extract_features.py with the same folder: <s> a </s></s> b </s>, and the last layer's
    # values are the converted encoder's at those ids.
    from data_prep import feature_files

    (tmp_path / "input.txt").write_text("Hello world ||| naïve café\nOne line only.\n")
    extracted = helpers.run_main(
        "extract_features.py",
        [
            f"--input_file={tmp_path / 'input.txt'}",
            f"--npz_file={tmp_path / 'features.npz'}",
            f"--vocab_file={conv}",
            f"--bert_config_file={conv / 'bert_config.json'}",
            f"--init_checkpoint={conv}",
            f"--max_seq_length={S}",
            "--layers=-1",
        ],
    )
    assert extracted.returncode == 0, extracted.stderr[-4000:]
    lines = list(feature_files.read_npz(tmp_path / "features.npz"))
    # Byte-level tokens show UTF-8 bytes as characters: "ï" is "Ã¯".
    assert [line.tokens for line in lines] == [
        ["<s>", "Hello", "Ġworld", "</s>", "</s>", "na", "Ã¯ve", "ĠcafÃ©", "</s>"],
        ["<s>", "One", "Ġline", "Ġonly", ".", "</s>"],
    ]
    for line in lines:
        ids = np.array([tokenizer.convert_tokens_to_ids(line.tokens)], "int32")
        assert ids[0, 0] == 0 and ids[0, -1] == 2 and 1 not in ids
        inputs = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": 0 * ids}
        want = np.asarray(model.encoder(inputs)["sequence_output"])[0]
        np.testing.assert_allclose(line.values[:, 0], want, atol=1e-5)
    # An ELMo biLM reads WordPiece: both scripts refuse the BPE folder with it.
    from tests.test_run_ner import ELMO

    options = tmp_path / "options.json"
    options.write_text(json.dumps({**ELMO, "n_tokens_vocab": 50261}))

    def with_elmo(script_args):
        kept = [
            a for a in script_args if not a.startswith(("--bert_config_file=", "--output_dir="))
        ]
        return [*kept, f"--bert_config_file={options}", f"--output_dir={tmp_path / 'elmo'}"]

    for script, script_args in (
        ("run_classifier.py", with_elmo(args)),
        ("run_ner.py", [*with_elmo(ner_args), "--feature_mode=sum_all"]),
    ):
        refused = helpers.run_main(script, script_args)
        assert refused.returncode == 1 and "an ELMo biLM reads the WordPiece" in refused.stderr
        assert not (tmp_path / "elmo").exists()


def test_dynamic_padding_evaluates_the_same_loss_and_is_refused_where_it_cannot_apply(
    model_files, tmp_path
):
    data = tmp_path / "SST-2"
    words = WORDS[:-3]
    for split, n in (("train", 6), ("dev", 7)):  # 2-4 words: at most 7 of 16 positions
        rows = [f"{' '.join(words[i % 9 : i % 9 + 2 + i % 3])} .\t{i % 2}" for i in range(n)]
        (data / f"{split}.tsv").parent.mkdir(exist_ok=True)
        (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    args = [*common(model_files, data, out, "sst-2"), "--max_seq_length=16"]  # sentences: < 8
    trained = run([*args, "--do_train"])
    real = re.search(r"train.tsv: ([\d.]+)% of the 16 positions are real tokens; each batch is cut "
                     r"to its longest example", trained.stderr)  # fmt: skip
    assert real and float(real.group(1)) < 7 / 16 * 100, trained.stderr[-3000:]
    losses = {}
    for flag in ("--dynamic_padding", "--nodynamic_padding"):
        run([*args, "--do_eval", flag])  # the latest checkpoint, dev batches cut or not
        losses[flag] = results(out)["loss"]
    assert losses["--dynamic_padding"] == pytest.approx(losses["--nodynamic_padding"], abs=1e-6)
    xlnet_config = tmp_path / "xlnet_config.json"
    from tests.test_xlnet import TINY as XLNET_TINY

    xlnet_config.write_text(json.dumps(XLNET_TINY))
    refusals = {
        f"--bert_config_file={xlnet_config}": "XLNet pads on the left",
        "--distribution_strategy=tpu": "a TPU needs static shapes",
    }
    for flag, why in refusals.items():
        result = run(
            [*args, "--do_eval", flag, "--dynamic_padding", f"--output_dir={tmp_path / 'x'}"], False
        )
        assert result.returncode != 0
        assert f"--dynamic_padding: not here ({why}); drop the flag" in result.stderr
        assert not (tmp_path / "x").exists()
    # --group_by_length: another input pipeline, so resuming the run above with it is refused
    # naming the flag; it needs cut batches; in a fresh folder it trains and evaluates.
    toggled = run([*args, "--do_train", "--group_by_length"], False)
    assert toggled.returncode != 0
    assert "--group_by_length was False and is now True" in toggled.stderr, toggled.stderr[-3000:]
    grouped = tmp_path / "grouped"
    helpers.check_group_by_length(run, args, grouped)
    grouped_results = results(grouped)
    assert grouped_results["global_step"] == 2 and math.isfinite(grouped_results["loss"])


def test_mixed_precision_fine_tunes_and_a_resume_keeps_its_precision(model_files, tmp_path):
    # --precision as run_pretraining's: the same seeds, data and weights at the start, so bf16
    # and fp16 runs end near the fp32 one but not on it (their products are rounded); fp16
    # trains with Keras' dynamic loss scale (logged per step); a resume with another precision
    # is refused, naming the flag, before anything is written.
    data = tmp_path / "SST-2"
    words = WORDS[:-3]
    for split, n in (("train", 6), ("dev", 7)):
        rows = [f"{' '.join(words[i % 9 : i % 9 + 2 + i % 3])} .\t{i % 2}" for i in range(n)]
        (data / f"{split}.tsv").parent.mkdir(exist_ok=True)
        (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    loss = {}
    for precision in ("fp32", "bf16", "fp16"):
        out = tmp_path / precision
        args = [*common(model_files, data, out, "sst-2"), "--do_train", "--do_eval"]
        run([*args, f"--precision={precision}"])
        loss[precision] = results(out)["loss"]
        helpers.check_precision_run(out, precision)
    for precision in ("bf16", "fp16"):
        assert 0 < abs(loss[precision] - loss["fp32"]) < 0.05, loss
    checkpoints = sorted(p.name for p in (tmp_path / "fp16").glob("ckpt-*"))
    # fp16's folder, now at fp32
    helpers.check_precision_resume_refused(run([*args, "--num_train_epochs=2"], False))
    assert sorted(p.name for p in (tmp_path / "fp16").glob("ckpt-*")) == checkpoints


def test_two_workers_train_on_batches_cut_to_different_lengths_as_on_full_ones(
    model_files, tmp_path
):
    """Two MultiWorkerMirroredStrategy workers (one CPU replica each, a batch of 1 a worker)
    fine-tune the dropout-free tiny config: with --dynamic_padding each worker cuts its batch to
    its own example (8 or 16 of the 16 positions: short and long sentences alternate in the file
    the workers split record by record), the gradients are summed over workers as ever, and the
    run evaluates the same dev loss (1e-5) and predicts the same labels as with
    --nodynamic_padding."""
    data = tmp_path / "SST-2"
    data.mkdir()
    words = WORDS[:-3]
    rows = []
    for i in range(8):  # worker 0 reads the even records: 2-4 words (at most 7 positions, cut to
        # 8); worker 1 the odd: 9-11 words (at least 12 positions, cut to 16)
        n = 2 + i % 3 if i % 2 == 0 else 9 + i % 3
        rows.append(f"{' '.join(words[(i + k) % len(words)] for k in range(n))} .\t{i // 2 % 2}")
    (data / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (data / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[::-1][:6]) + "\n")
    (data / "test.tsv").write_text(
        "index\tsentence\n" + "\n".join(f"{k}\t{r.split(chr(9))[0]}" for k, r in enumerate(rows))
    )
    outs = {}
    for flag in ("--dynamic_padding", "--nodynamic_padding"):
        base = tmp_path / flag.strip("-")
        workers = helpers.run_workers(
            "run_classifier.py",
            [
                [*common(model_files, data, base / f"w{i}", "sst-2"), "--max_seq_length=16", flag]
                + ["--train_batch_size=2", "--eval_batch_size=2", "--predict_batch_size=2"]
                + ["--distribution_strategy=multi_worker_mirrored"]
                + ["--do_train", "--do_eval", "--do_predict"]
                for i in range(2)
            ],
        )
        for worker in workers:
            assert worker.returncode == 0, worker.stderr[-4000:]
        assert results(base / "w0") == results(base / "w1")  # each gathered every worker's rows
        outs[flag] = base / "w0"
    cut, full = (results(outs[f]) for f in ("--dynamic_padding", "--nodynamic_padding"))
    assert cut["global_step"] == full["global_step"] == 4  # 8 examples, 2 a step
    assert cut["loss"] == pytest.approx(full["loss"], abs=1e-5)
    (a,), (b,) = (sorted(outs[f].glob("*.tsv")) for f in outs)
    assert a.read_text() == b.read_text()
