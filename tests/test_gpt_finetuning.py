"""GPT-1 fine-tuning (training/gpt_finetuning.py): delimiter layout, the auxiliary LM loss weight,
and run_classifier.py taking the GPT path for a GPT config."""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import bpe, glue
from data_prep.errors import InputError
from modeling import flops, gpt
from tests import helpers
from tests.helpers import run_classifier_on_two_sentences
from training import gpt_finetuning

TEXT = ["The cat sat.", "The dog barked.", "A bird sang twice.", "Fish swim."]


def tiny_bpe(tmp_path, specials=(bpe.GPT2_END_OF_TEXT,)):
    merges = bpe.learn_bpe(bpe.byte_words(TEXT), 20)
    tok = bpe.ByteLevelBPE(bpe.byte_level_vocab(merges, specials), merges)
    tok.save(tmp_path / "bpe")
    return tok


def test_delimiters_and_layout(tmp_path):
    tok = tiny_bpe(tmp_path)
    loaded = gpt_finetuning.load_bpe(str(tmp_path / "bpe"))
    assert loaded.encoder == gpt_finetuning.load_bpe(str(tmp_path / "bpe/encoder.json")).encoder
    eot = tok.encoder[bpe.GPT2_END_OF_TEXT]
    assert gpt_finetuning.delimiter_ids(tok) == (eot, eot, eot)
    own = tiny_bpe(tmp_path / "own", (*gpt_finetuning.DELIMITERS, bpe.GPT2_END_OF_TEXT))
    start, delim, extract = gpt_finetuning.delimiter_ids(own)
    assert len({start, delim, extract, own.encoder[bpe.GPT2_END_OF_TEXT]}) == 4
    ids = gpt_finetuning.encode_example(own, (start, delim, extract), "The cat", "Fish", 64)
    assert ids == ([start, *own.encode("The cat"), delim, *own.encode("Fish"), extract], False)
    short = gpt_finetuning.encode_example(own, (start, delim, extract), "The cat sat.", None, 5)
    assert short == ([start, *own.encode("The cat sat.")[:3], extract], True)
    with pytest.raises(Exception, match="encoder.json and vocab.bpe"):
        gpt_finetuning.load_bpe(str(tmp_path / "nothing"))
    # Multiple choice (sec. 3.3): one `start context delim answer extract` row per answer.
    swag = glue.get_task("swag")
    ex = glue.Example("f:2", "0", "The cat", "It", "1", endings=("sat.", "ran.", "sang.", "x."))
    encoded = gpt_finetuning.encode_split(own, (start, delim, extract), swag, [ex], 9)
    split = encoded.features
    assert split["input_ids"].shape == split["input_mask"].shape == (1, 4, 9)
    cuts = []
    for j, ending in enumerate(ex.endings):
        ids, cut = gpt_finetuning.encode_example(
            own, (start, delim, extract), "The cat", f"It {ending}", 9
        )
        cuts.append(cut)
        assert split["input_ids"][0, j].tolist() == ids + [0] * (9 - len(ids))
        assert split["input_mask"][0, j].tolist() == [1] * len(ids) + [0] * (9 - len(ids))
    assert split["label_ids"].tolist() == [1]
    assert any(cuts) and encoded.truncated == ["f:2"]  # a choice cut: the example is named
    whole = gpt_finetuning.encode_split(own, (start, delim, extract), swag, [ex], 16)
    assert whole.truncated == []
    three = dataclasses.replace(ex, guid="f:7", endings=ex.endings[:3])
    with pytest.raises(InputError, match="f:7: expected 4 endings, found 3"):
        gpt_finetuning.encode_split(own, (start, delim, extract), swag, [three], 9)


def test_multiple_choice_scores_each_answer_as_its_own_sequence():
    """(B, K, T) answers: each answer's logit is the one-output classifier's on that sequence
    alone, and the task's LM terms count every answer's real next-token targets."""
    keras.utils.set_random_seed(1)
    config = gpt.GptConfig(n_vocab=29, n_ctx=13, n_embd=12, n_head=3, n_layer=2, n_inner=17)
    model = gpt.GptClassifier(config, 1)
    model.build()
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 29, (2, 3, 7)).astype(np.int32)
    lengths = np.array([[7, 4, 6], [5, 7, 3]])
    mask = (np.arange(7) < lengths[..., None]).astype(np.int32)  # (2, 3, 7)
    logits = np.asarray(model({"input_ids": ids, "input_mask": mask})["logits"])
    assert logits.shape == (2, 3)
    for b in range(2):
        for k in range(3):
            one = model({"input_ids": ids[b, k][None], "input_mask": mask[b, k][None]})
            np.testing.assert_allclose(logits[b, k], np.asarray(one["logits"])[0, 0], atol=1e-5)
    assert np.ptp(logits) > 1e-3  # the answers score differently (the check can fail)
    batch = {"input_ids": ids, "input_mask": mask, "label_ids": np.array([2, 0], np.int32)}
    sums = gpt_finetuning.gpt_classification_task(model, 0.5).sums_fn(batch, False)
    assert float(sums["lm_weight"]) == np.sum(lengths - 1) and float(sums["cls_count"]) == 2
    with pytest.raises(ValueError, match="need num_classes=1, not 3"):
        gpt.GptClassifier(config, 3)({"input_ids": ids, "input_mask": mask})


def test_the_lm_loss_is_added_with_its_weight():
    keras.utils.set_random_seed(0)
    config = gpt.GptConfig(n_vocab=29, n_ctx=13, n_embd=12, n_head=3, n_layer=2, n_inner=17)
    model = gpt.GptClassifier(config, 3)
    model.build()
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": tf.constant(rng.integers(0, 29, (3, 7)), tf.int32),
        "input_mask": tf.constant([[1] * 7, [1] * 4 + [0] * 3, [1] * 6 + [0]], tf.int32),
        "label_ids": tf.constant([0, 2, 1], tf.int32),
    }
    task = gpt_finetuning.gpt_classification_task(model, 0.5)
    assert task.loss_terms == [("cls_loss_sum", "cls_count"), ("lm_loss_sum", "lm_weight", 0.5)]
    sums = task.sums_fn(batch, False)
    assert float(sums["lm_weight"]) == 6 + 3 + 5  # next-token targets at real positions only
    assert float(sums["cls_count"]) == 3
    assert gpt_finetuning.gpt_classification_task(model, 0.0).loss_terms == [
        ("cls_loss_sum", "cls_count")
    ]


def test_run_classifier_fine_tunes_a_gpt_config(tmp_path):
    tok = tiny_bpe(tmp_path)
    config = tmp_path / "gpt.json"
    config.write_text(
        json.dumps(dict(n_vocab=len(tok.encoder), n_ctx=16, n_embd=12, n_head=3, n_layer=1))
    )
    r, out = run_classifier_on_two_sentences(
        tmp_path,
        config,
        "--max_seq_length=16",
        "--num_train_epochs=10",
        "--iterations_per_loop=10",
        "--peak_tflops=1e-4",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # The log's FLOP/s: 3 passes of modeling/flops.py's count (16 positions, 2 classes) per
    # example, and its share of --peak_tflops.
    gpt_config = gpt.GptConfig.from_json_file(config)
    per_example = 3 * flops.gpt_classifier_flops(gpt_config, 16, 2)
    helpers.check_logged_flops(r.stderr, per_example, per_example, peak_tflops=1e-4)
    helpers.check_training_curves(r.stderr, out, "loss, accuracy, lm_loss")
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert int(results["global_step"]) == 30
    assert float(results["accuracy"]) == 1.0  # two sentences, learnt in 30 steps
    # The dev split scored at the start and at the save; the best kept and predicting.
    evals = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 30] and evals[0]["accuracy"] < 1.0
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 30
    assert f"predicting with the best dev checkpoint {out / 'best' / 'ckpt-'}" in r.stderr
    assert glue.read_submission(out / "SST-2.tsv") == [("4", "0"), ("8", "1")]
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert "lm_loss" in log[-1] and log[-1]["lm_loss"] < log[0]["lm_loss"]
    refused, _ = run_classifier_on_two_sentences(
        tmp_path, config, "--max_seq_length=16", "--encoder_branches=2"
    )
    assert refused.returncode == 1
    assert "--encoder_branches=2: a GPT config has no encoder that runs" in refused.stderr
    refused, _ = run_classifier_on_two_sentences(
        tmp_path, config, "--max_seq_length=16", "--remove_padding"
    )
    assert refused.returncode == 1
    assert "--remove_padding: a GPT config has no encoder that runs on its real" in refused.stderr


def test_run_classifier_gpt_path_under_mirrored_and_two_workers(tmp_path, monkeypatch):
    """--distribution_strategy reaches the GPT path (it ran on one device whatever the flag until
    the sixty-first session): over two replicas, dropout off, the run trains, scores dev at every
    save and predicts as on one device, its dev loss within 1e-5; two MultiWorkerMirrored
    workers (each training on its half of the examples) gather every dev row, so both score the
    untrained model as one device does and agree on every later score and prediction. A batch
    that does not split over the replicas is refused naming the flag, and so are the BERT path's
    flags that GPT fine-tuning does not read."""
    from training import distribute

    get_strategy = distribute.get_strategy

    def shared_mirrored(name, tpu_address):  # one MirroredStrategy per process (helpers)
        return helpers.mirrored_strategy() if name == "mirrored" else get_strategy(name, "")

    monkeypatch.setattr(distribute, "get_strategy", shared_mirrored)
    tok = tiny_bpe(tmp_path)
    config = tmp_path / "gpt.json"
    no_dropout = dict(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0, summary_first_dropout=0.0)
    config.write_text(
        json.dumps(
            dict(n_vocab=len(tok.encoder), n_ctx=16, n_embd=12, n_head=3, n_layer=1) | no_dropout
        )
    )
    flags = ["--max_seq_length=16", "--num_train_epochs=2", "--save_checkpoints_steps=3"]

    def folder(name):  # run_classifier_on_two_sentences reads the BPE from folder/bpe
        (tmp_path / name).mkdir()
        (tmp_path / name / "bpe").symlink_to(tmp_path / "bpe")
        return tmp_path / name

    evals = {}
    for strategy in ("one_device", "mirrored"):
        r, out = run_classifier_on_two_sentences(
            folder(strategy), config, *flags, f"--distribution_strategy={strategy}"
        )
        assert r.returncode == 0, r.stderr[-3000:]
        replicas = 2 if strategy == "mirrored" else 1
        assert f"{strategy}: {replicas} replicas in sync on 1 workers, this is worker 0" in r.stderr
        evals[strategy] = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
        assert glue.read_submission(out / "SST-2.tsv")[0][0] == "4"  # rows in input order
    assert [e["step"] for e in evals["mirrored"]] == [0, 3, 6]
    for a, b in zip(evals["one_device"], evals["mirrored"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
    assert evals["mirrored"][-1]["loss"] < evals["mirrored"][0]["loss"]
    runs = [
        helpers.two_sentences_args(folder(f"w{i}"), config, *flags)
        + (["--distribution_strategy=multi_worker_mirrored"],)
        for i in range(2)
    ]
    workers = helpers.run_workers("run_classifier.py", [args + more for args, _, more in runs])
    for i, worker in enumerate(workers):
        assert worker.returncode == 0, worker.stderr[-4000:]
        want = f"multi_worker_mirrored: 2 replicas in sync on 2 workers, this is worker {i}"
        assert want in worker.stderr
    logs = [(out / "eval_log.jsonl").read_text() for _, out, _ in runs]
    assert logs[0] == logs[1]  # every dev row gathered by both
    untrained = json.loads(logs[0].splitlines()[0])
    assert untrained["loss"] == pytest.approx(evals["one_device"][0]["loss"], rel=1e-5)
    submissions = [(out / "SST-2.tsv").read_text() for _, out, _ in runs]
    assert submissions[0] == submissions[1] and submissions[0].splitlines()[1].startswith("4")
    odd, _ = run_classifier_on_two_sentences(
        folder("odd"), config, *flags, "--distribution_strategy=mirrored", "--eval_batch_size=3"
    )
    assert odd.returncode == 1 and "--eval_batch_size=3 is not divisible by 2" in odd.stderr
    refusing = folder("refused")
    for flag in ("--group_by_length", "--layerwise_lr_decay=0.8", "--pooling=mean"):
        refused, _ = run_classifier_on_two_sentences(refusing, config, flag)
        assert refused.returncode == 1
        assert f"{flag.split('=')[0]}: not for a GPT config" in refused.stderr


def test_run_classifier_fine_tunes_a_gpt_config_on_multiple_choice(tmp_path):
    """SWAG's layout through the GPT path: every answer its own sequence, two examples learnt
    by heart, the FLOP/s counting every answer; a regression task is refused."""
    tok = tiny_bpe(tmp_path)
    config = tmp_path / "gpt.json"
    config.write_text(
        json.dumps(dict(n_vocab=len(tok.encoder), n_ctx=20, n_embd=12, n_head=3, n_layer=1))
    )
    flags = ["--max_seq_length=20", "--peak_tflops=1e-4"]
    r, out = helpers.run_classifier_on_swag_by_heart(tmp_path, config, *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    # "It purred." is 10 byte-level ids, "The cat sat." 8: with the 3 delimiters, one too many.
    want = "train.csv: 12 of 12 examples were longer than max_seq_length=20 and were truncated"
    assert want in r.stderr
    # 3 passes of the GPT classifier count (4 answers of 20 positions, one output) per example.
    per_example = 4 * 3 * flops.gpt_classifier_flops(gpt.GptConfig.from_json_file(config), 20, 1)
    helpers.check_logged_flops(r.stderr, per_example, per_example, peak_tflops=1e-4)
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert int(results["global_step"]) == 60 and float(results["accuracy"]) == 1.0
    assert glue.read_submission(out / "SWAG.tsv") == [("0", "1"), ("1", "0")]
    refused, _ = run_classifier_on_two_sentences(tmp_path / "stsb", config, "--task_name=sts-b")
    assert refused.returncode == 1
    assert "covers classification and multiple choice; sts-b is regression" in refused.stderr


def test_run_classifier_fine_tunes_a_gpt_config_in_mixed_precision(tmp_path):
    """--precision reaches the GPT path (it was ignored there until the forty-fourth session):
    from the same seeds and data, bf16 and fp16 end within 0.05 of fp32's dev loss but not on
    it; fp16 logs Keras' dynamic loss scale at every step; a resume at another precision is
    refused naming the flag."""
    loss = {}
    for precision in ("fp32", "bf16", "fp16"):
        folder = tmp_path / precision
        tok = tiny_bpe(folder)
        config = folder / "gpt.json"
        config.write_text(
            json.dumps(dict(n_vocab=len(tok.encoder), n_ctx=16, n_embd=12, n_head=3, n_layer=1))
        )
        flags = ["--max_seq_length=16", "--num_train_epochs=1", f"--precision={precision}"]
        r, out = run_classifier_on_two_sentences(folder, config, *flags)
        assert r.returncode == 0, r.stderr[-3000:]
        results = dict(
            line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
        )
        loss[precision] = float(results["loss"])
        helpers.check_precision_run(out, precision)
    for precision in ("bf16", "fp16"):
        assert 0 < abs(loss[precision] - loss["fp32"]) < 0.05, loss
    toggled, _ = run_classifier_on_two_sentences(folder, config, "--max_seq_length=16")
    helpers.check_precision_resume_refused(toggled)
