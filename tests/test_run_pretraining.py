"""Smoke runs of run_pretraining.py, its resume, its bad-input errors, and strategy selection."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from modeling import flops, layers
from tests import helpers
from tests.conftest import ROOT
from training import distribute

S, P = 11, 3


def run(args, check=True, script="run_pretraining.py"):
    """The entrypoint in this process (helpers.run_main); the SIGTERM test below is the one real
    command-line run of run_pretraining.py (app.run, exit code 42, a signal from outside)."""
    result = helpers.run_main(script, args)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-4000:])
    return result


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("pretrain")
    helpers.write_synthetic_pretraining_file(d / "a.tfrecord", 30, S, P, helpers.TINY["vocab_size"])
    helpers.write_synthetic_pretraining_file(
        d / "b.tfrecord", 30, S, P, helpers.TINY["vocab_size"], seed=1
    )
    config = d / "bert_config.json"
    config.write_text(helpers.tiny_config().to_json_string())
    return d, config


def common(d, config, out, steps):
    return [
        f"--bert_config_file={config}",
        f"--input_file={d}/*.tfrecord",
        f"--output_dir={out}",
        f"--max_seq_length={S}",
        f"--max_predictions_per_seq={P}",
        "--train_batch_size=6",
        "--eval_batch_size=5",
        f"--num_train_steps={steps}",
        "--num_warmup_steps=1",
        "--save_checkpoints_steps=2",
        "--iterations_per_loop=2",
        "--max_eval_steps=3",
        "--learning_rate=1e-3",
    ]


def test_train_eval_writes_everything_and_resumes(setup, tmp_path):
    d, config = setup
    out = tmp_path / "out"
    peak = 1e-4  # TFLOP/s
    result = run(
        [
            *common(d, config, out, 4),
            "--do_train",
            "--do_eval",
            "--keep_checkpoint_max=1",
            f"--peak_tflops={peak}",
        ]
    )
    assert "examples/s" in result.stderr and "ETA" in result.stderr  # progress line
    # The tiny encoder keeps one pass (bert.auto_encoder_branches; the 128-wide case below).
    assert "--encoder_branches=1 by default (hidden_size 12 < 128)" in result.stderr
    # ... with the token throughput: S positions an example, fewer of them not padding; and the
    # FLOP/s of modeling/flops.py's count (3 passes an example) with its share of the peak.
    speeds = re.findall(
        r"([\d.]+) examples/s \| ([\d,]+) tokens/s \(([\d,]+) not padding, (\d+)%\) \|",
        result.stderr,
    )
    assert len(speeds) == 2  # a compiled call of 2 steps each
    for examples, total, real, percent in speeds:
        examples, total, real = (float(x.replace(",", "")) for x in (examples, total, real))
        assert abs(total - examples * S) <= 0.05 * examples * S + 1  # the log rounds both
        assert 0 < real < total and 0 < int(percent) < 100
    per_example = 3 * flops.mlm_pretraining_flops(helpers.tiny_config(), S, P)
    assert len(helpers.logged_speeds(result.stderr)) == 2
    helpers.check_logged_flops(result.stderr, per_example, per_example, peak_tflops=peak)
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert set(results) >= {
        "masked_lm_accuracy",
        "masked_lm_loss",
        "next_sentence_accuracy",
        "next_sentence_loss",
        "global_step",
    }
    assert int(results["global_step"]) == 4
    assert 0.0 <= float(results["masked_lm_accuracy"]) <= 1.0
    assert float(results["masked_lm_loss"]) > 0
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-4")
    assert sorted(p.name for p in out.glob("ckpt-*.index")) == ["ckpt-4.index"]  # keep max 1
    assert (out / "training_curves.png").stat().st_size > 1000
    assert list((out / "train").glob("events.out.tfevents.*"))
    evals = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 4]  # untrained, then every checkpoint
    # A rerun with more steps resumes at step 4 rather than starting over.
    result = run([*common(d, config, out, 6), "--do_train", "--keep_checkpoint_max=3"])
    assert "resumed from" in result.stderr and "ckpt-4" in result.stderr
    helpers.check_logged_flops(result.stderr, per_example, per_example)  # no share
    assert "of the peak" not in result.stderr  # no --peak_tflops
    assert sorted(p.name for p in out.glob("ckpt-*.index")) == ["ckpt-4.index", "ckpt-6.index"]
    steps = [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_tfrecords_made_with_other_flags_are_named(setup, tmp_path):
    d, config = setup
    args = [a for a in common(d, config, tmp_path, 2) if not a.startswith("--max_seq_length")]
    result = run([*args, "--max_seq_length=13", "--do_train"], check=False)
    assert result.returncode != 0
    assert "a.tfrecord" in result.stderr and "--max_seq_length" in result.stderr
    assert "length 13" in result.stderr and "length 11" in result.stderr
    assert not list(tmp_path.glob("ckpt-*"))


def test_tpu_strategy_builds_the_resolver_from_the_flag():
    resolver = distribute.tpu_cluster_resolver("grpc://10.1.2.3:8470")
    assert resolver.master() == "grpc://10.1.2.3:8470"
    with pytest.raises(ValueError, match="--tpu"):
        distribute.get_strategy("tpu", "")
    with pytest.raises(ValueError, match="expected one of"):
        distribute.get_strategy("horovod")
    assert distribute.get_strategy("mirrored").num_replicas_in_sync == 2  # conftest's two CPUs


def test_setup_checks_batches_divide_over_replicas():
    strategy, workers, index = distribute.setup("mirrored", "", {"train_batch_size": 4})
    assert (strategy.num_replicas_in_sync, workers, index) == (2, 1, 0)
    with pytest.raises(ValueError, match="--eval_batch_size=5 is not divisible by 2 replicas"):
        distribute.setup("mirrored", "", {"train_batch_size": 4, "eval_batch_size": 5})


# ---------------------------------------------------------------------------------------------
# Other recipes end to end: records -> run_pretraining -> run_classifier from its checkpoint


def write_recipe_records(d, name, **recipe):
    """Records from a small corpus of test_glue's words, made by the library as the script does."""
    import random

    from data_prep import pretraining_data
    from data_prep.tokenization import FullTokenizer
    from tests.test_glue import WORDS

    rng = random.Random(0)
    lines = []
    for _ in range(12):
        lines += [" ".join(rng.choice(WORDS[:-3]) for _ in range(rng.randint(2, 6))) + " ."
                  for _ in range(rng.randint(1, 5))] + [""]  # fmt: skip
    (d / "corpus.txt").write_text("\n".join(lines))
    tokenizer = FullTokenizer(str(d / "vocab.txt"))
    objective = recipe.get("sentence_objective", "nsp")
    docs = pretraining_data.read_documents([str(d / "corpus.txt")], tokenizer, objective)
    instances = pretraining_data.create_training_instances(
        docs, tokenizer.vocab, S, 3, 0.1, 0.15, P, random.Random(1), **recipe
    )
    path = d / f"{name}.tfrecord"
    pretraining_data.write_instances(instances, [str(path)], S, P, tokenizer.vocab, num_logged=0)
    return path


def run_script(script, args):
    return run(args, check=False, script=script)


def eval_results(out):
    return dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())


def test_recipes_pretrain_and_fine_tune_from_their_checkpoints(tmp_path):
    from data_prep import glue
    from tests.test_albert import TINY as ALBERT_TINY
    from tests.test_glue import VOCAB, write_task

    d = tmp_path
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (d / "albert_config.json").write_text(json.dumps(ALBERT_TINY))
    (d / "bert_config.json").write_text(helpers.tiny_config().to_json_string())
    span = write_recipe_records(d, "sop_span", sentence_objective="sop", masking_scheme="span")
    full = write_recipe_records(
        d, "full", sentence_objective="none", full_sentences=True, static_masking=False
    )

    def pretrain(config, records, out, *extra):
        args = [a for a in common(d, config, out, 2) if not a.startswith("--input_file")]
        return run_script(
            "run_pretraining.py", [*args, f"--input_file={records}", "--do_train", *extra]
        )

    jobs = {
        # ALBERT: SOP (its default) with SpanBERT spans and the span boundary objective.
        "albert": (d / "albert_config.json", span, d / "albert", "--span_boundary_objective"),
        # RoBERTa's recipe on BERT: FULL-SENTENCES records masked in tf.data, no NSP.
        "roberta": (d / "bert_config.json", full, d / "roberta", "--masking=dynamic",
                    f"--vocab_file={d / 'vocab.txt'}", "--sentence_objective=none"),
        # Dynamic masking of records that already hold masks is refused, naming the file.
        "mismatch": (d / "bert_config.json", span, d / "mismatch", "--masking=dynamic",
                     f"--vocab_file={d / 'vocab.txt'}", "--sentence_objective=sop"),
    }  # fmt: skip
    for job in jobs.values():
        job[2].mkdir()
    results = {name: pretrain(*job[:2], *job[2:]) for name, job in jobs.items()}
    for name in ("albert", "roberta"):
        assert results[name].returncode == 0, results[name].stderr[-4000:]
    albert_log = [
        json.loads(x) for x in (d / "albert" / "train_log.jsonl").read_text().split("\n") if x
    ]
    assert [r["step"] for r in albert_log] == [1, 2]
    assert {"sentence_order_accuracy", "span_boundary_loss", "span_boundary_accuracy"} <= set(
        albert_log[-1]
    )
    # The logged loss is the sum of the three objectives (SpanBERT sec. 3.2: L_MLM + L_SBO).
    r = albert_log[-1]
    total = r["masked_lm_loss"] + r["sentence_order_loss"] + r["span_boundary_loss"]
    assert r["span_boundary_loss"] > 0 and abs(r["loss"] - total) < 1e-5
    roberta_log = [
        json.loads(x) for x in (d / "roberta" / "train_log.jsonl").read_text().split("\n") if x
    ]
    assert "masked_lm_accuracy" in roberta_log[-1]
    assert not any("sentence" in k for k in roberta_log[-1])
    assert "sentence objective none, dynamic masking" in results["roberta"].stderr
    bad = results["mismatch"]
    assert bad.returncode != 0 and "sop_span.tfrecord record 0" in bad.stderr
    assert "--masking=static" in bad.stderr and not list((d / "mismatch").glob("ckpt-*"))

    # Fine-tuning from each checkpoint through run_classifier (SST-2 layout).
    data = d / "SST-2"
    write_task(data, glue.get_task("sst-2"), sizes=(6, 4, 3))

    def fine_tune(config, pretrained):
        return run_script(
            "run_classifier.py",
            [
                "--task_name=sst-2",
                f"--data_dir={data}",
                f"--vocab_file={d / 'vocab.txt'}",
                f"--bert_config_file={config}",
                f"--init_checkpoint={pretrained}",
                f"--output_dir={pretrained}-sst2",
                "--max_seq_length=13",
                "--train_batch_size=3",
                "--eval_batch_size=4",
                "--num_train_epochs=1",
                "--save_checkpoints_steps=2",
                "--iterations_per_loop=2",
                "--do_train",
                "--do_eval",
            ],
        )

    tuned = [
        fine_tune(d / "albert_config.json", d / "albert"),
        fine_tune(d / "bert_config.json", d / "roberta"),
    ]
    for result, name in zip(tuned, ("albert", "roberta")):
        assert result.returncode == 0, result.stderr[-4000:]
        assert "initialised the encoder from" in result.stderr
        assert 0.0 <= float(eval_results(d / f"{name}-sst2")["accuracy"]) <= 1.0


def test_electra_and_distilbert_pretrain_and_fine_tune_from_their_checkpoints(setup, tmp_path):
    """ELECTRA from an ELECTRA config and DistilBERT from a teacher checkpoint, two steps each on
    the static records; each checkpoint then fine-tunes through run_classifier (ELECTRA's
    discriminator, the student). Incompatible flags and a teacher of another vocabulary fail
    fast, saying what to change."""
    from data_prep import glue
    from modeling import bert
    from tests.test_electra import TINY as ELECTRA_TINY
    from tests.test_glue import VOCAB, write_task

    d, _ = setup
    # Vocabulary 53 as the synthetic records; fine-tuning's 28-token vocab fits in it.
    (tmp_path / "electra.json").write_text(json.dumps(ELECTRA_TINY))
    teacher_config = helpers.tiny_config(num_hidden_layers=4)
    student = tmp_path / "student.json"
    student.write_text(teacher_config.replace(num_hidden_layers=2).to_json_string())
    (tmp_path / "bad_student.json").write_text(
        teacher_config.replace(num_hidden_layers=2, vocab_size=55).to_json_string()
    )
    teacher_dir = tmp_path / "teacher"
    teacher = bert.BertPretrainer(teacher_config)
    teacher.build()
    tf.train.Checkpoint(model=teacher).save(str(teacher_dir / "ckpt"))
    (teacher_dir / "model_config.json").write_text(teacher_config.to_json_string())

    def pretrain(config, out, *extra):
        return run([*common(d, config, tmp_path / out, 2), "--do_train", *extra], check=False)

    # --encoder_branches=2 and --remove_padding on ELECTRA's generator and discriminator, and
    # on the student and its teacher (2 row slices of each batch of 2, each on its real tokens);
    # the teacher computes at the student's --precision too.
    speed = ("--encoder_branches=2", "--remove_padding")
    mixed = (*speed, "--precision=bf16")
    jobs = [
        (tmp_path / "electra.json", "electra", "--disc_weight=40", *speed),
        (student, "student", f"--teacher_checkpoint={teacher_dir}", "--do_eval", *mixed),
        (tmp_path / "electra.json", "electra_nsp", "--sentence_objective=nsp"),
        (tmp_path / "bad_student.json", "bad_student", f"--teacher_checkpoint={teacher_dir}"),
    ]
    electra_run, student_run, nsp_run, bad_run = [pretrain(*j) for j in jobs]
    assert electra_run.returncode == 0, electra_run.stderr[-4000:]
    for job in (electra_run, student_run):  # both of ELECTRA's encoders; the student's
        assert "--remove_padding: " in job.stderr and "run on each batch's real tokens" in (
            job.stderr
        )
    log = [
        json.loads(x) for x in (tmp_path / "electra" / "train_log.jsonl").read_text().splitlines()
    ]
    r = log[-1]
    assert {"sampled_masked_lm_accuracy", "disc_accuracy", "disc_precision"} <= set(r)
    assert r["loss"] == pytest.approx(r["masked_lm_loss"] + 40 * r["disc_loss"], rel=1e-6)
    assert student_run.returncode == 0, student_run.stderr[-4000:]
    assert "initialised the student from teacher layers [0, 2]" in student_run.stderr
    assert "(4 layers, computing in bfloat16)" in student_run.stderr
    # The plot has a panel for each of the three losses and the MLM accuracy.
    panels = "masked_lm_loss, masked_lm_accuracy, soft_target_loss, cosine_loss"
    assert f"training_curves.png ({panels})" in student_run.stderr
    results = eval_results(tmp_path / "student")
    assert {"soft_target_loss", "cosine_loss", "masked_lm_loss"} <= set(results)
    assert all(math.isfinite(float(results[k])) for k in ("soft_target_loss", "cosine_loss"))
    assert nsp_run.returncode != 0
    assert "--sentence_objective=nsp: ELECTRA trains no sentence-level objective" in nsp_run.stderr
    assert bad_run.returncode != 0 and not list((tmp_path / "bad_student").glob("ckpt-*"))
    assert "bad_student.json: vocab_size=55 differs from the teacher's vocab_size=53" in (
        bad_run.stderr
    )

    data = tmp_path / "SST-2"
    write_task(data, glue.get_task("sst-2"), sizes=(6, 4, 3))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")

    def fine_tune(config, pretrained):
        return run_script(
            "run_classifier.py",
            [
                "--task_name=sst-2",
                f"--data_dir={data}",
                f"--vocab_file={tmp_path / 'vocab.txt'}",
                f"--bert_config_file={config}",
                f"--init_checkpoint={tmp_path / pretrained}",
                f"--output_dir={tmp_path / pretrained}-sst2",
                "--max_seq_length=13",
                "--train_batch_size=3",
                "--eval_batch_size=4",
                "--num_train_epochs=1",
                "--save_checkpoints_steps=2",
                "--iterations_per_loop=2",
                "--do_train",
                "--do_eval",
            ],
        )

    tuned = [fine_tune(tmp_path / "electra.json", "electra"), fine_tune(student, "student")]
    for result, name in zip(tuned, ("electra", "student")):
        assert result.returncode == 0, result.stderr[-4000:]
        assert "initialised the encoder from" in result.stderr
        assert 0.0 <= float(eval_results(tmp_path / f"{name}-sst2")["accuracy"]) <= 1.0


# ---------------------------------------------------------------------------------------------
# Reliability (#10): damaged records, SIGTERM


def test_damaged_records_are_named_validated_and_skipped(setup, tmp_path):
    d, config = setup
    data = (d / "a.tfrecord").read_bytes()
    size = len(data) // 30  # fixed-length records
    flipped = bytearray(data)
    flipped[20 * size + 20] ^= 0x01  # a payload byte of record 20
    (tmp_path / "flipped.tfrecord").write_bytes(bytes(flipped))
    (tmp_path / "b.tfrecord").write_bytes((d / "b.tfrecord").read_bytes())

    def job(out, *extra):
        args = [a for a in common(tmp_path, config, tmp_path / out, 4) if "input_file" not in a]
        return run([*args, f"--input_file={tmp_path}/*.tfrecord", "--do_train", *extra], False)

    check = job("v", "--validate_input")
    plain = job("p")
    skipping = job("s", "--skip_corrupt_records")
    assert check.returncode == 1, check.stderr[-2000:]
    assert f"{tmp_path}/b.tfrecord: 30 good records" in check.stdout
    assert f"record 20 (byte {20 * size}): corrupted (CRC mismatch)" in check.stderr
    assert not (tmp_path / "v").exists()  # before any model is built
    # Without skipping, training stops (no record is lost silently) and names the file.
    assert plain.returncode == 1 and "flipped.tfrecord: 20 good records" in plain.stderr
    assert not list((tmp_path / "p").glob("ckpt-*"))
    assert skipping.returncode == 0, skipping.stderr[-3000:]
    assert "skipping 10 records of" in skipping.stderr and "flipped.tfrecord" in skipping.stderr
    assert "10 of 60 records skipped" in skipping.stderr
    assert (tmp_path / "s" / "ckpt-4.index").exists()


def test_sigterm_checkpoints_exits_42_and_resume_matches_an_uninterrupted_run(setup, tmp_path):
    import signal
    import threading

    d, config = setup
    steps = 300

    def args(out):
        flags_ = common(d, config, tmp_path / out, steps)
        flags_ = [a for a in flags_ if "save_checkpoints_steps" not in a and "iterations" not in a]
        return [*flags_, "--do_train", "--save_checkpoints_steps=100", "--iterations_per_loop=1"]

    # The run to be killed is the real command line (app.run's exit code, a signal from outside);
    # a thread watches its log and sends SIGTERM while the uninterrupted run trains in-process.
    killed = subprocess.Popen(
        [sys.executable, "run_pretraining.py", *args("killed")], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen = []

    def watch():
        for line in killed.stderr:
            seen.append(line)
            if f"step 3/{steps}" in line:
                killed.send_signal(signal.SIGTERM)
                break
        seen.append(killed.communicate(timeout=600)[1])

    watcher = threading.Thread(target=watch)
    watcher.start()
    straight = run(args("straight"))
    watcher.join(timeout=600)
    rest = seen[-1]
    assert killed.returncode == 42, "".join(seen)[-5000:]
    saved = [int(p.name[5:-6]) for p in (tmp_path / "killed").glob("ckpt-*.index")]
    assert len(saved) == 1 and 3 <= saved[0] < 100, saved  # between two periodic saves
    assert "SIGTERM: saved" in rest and f"at step {saved[0]}" in rest
    resumed = run(args("killed"))
    assert f"ckpt-{saved[0]} at step {saved[0]}" in resumed.stderr
    assert straight.returncode == 0
    a = tf.train.load_checkpoint(str(tmp_path / "straight"))
    b = tf.train.load_checkpoint(str(tmp_path / "killed"))
    names = [
        n
        for n in a.get_variable_to_shape_map()
        if n.endswith("VARIABLE_VALUE") and not n.startswith(("save_counter", "iterator"))
    ]  # the weights, Adam's moments and iteration, the step, the dropout seeds
    assert len(names) > 50 and "global_step/.ATTRIBUTES/VARIABLE_VALUE" in names
    for name in names:
        assert (a.get_tensor(name) == b.get_tensor(name)).all(), name


# ---------------------------------------------------------------------------------------------
# Speed flags and the original's two-phase 128 -> 512 recipe, on tiny sizes


def test_encoder_branches_default_to_two_for_wide_cpu_steps_and_train_as_one(setup, tmp_path):
    # --encoder_branches unset, an encoder 128 wide, fp32 on the CPU, 6 rows a step: 2 branches
    # (bert.auto_encoder_branches, logged), which train as --encoder_branches=1 does with
    # dropout on (0.1; each slice draws its rows of one pass' masks): the same losses within
    # 1e-5 relative and the same final checkpoint values within 1e-4.
    d, _ = setup
    config = tmp_path / "bert_config.json"
    dropout = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    wide = helpers.tiny_config(hidden_size=128, num_attention_heads=2, intermediate_size=256)
    config.write_text(wide.replace(**dropout).to_json_string())
    auto = run([*common(d, config, tmp_path / "auto", 3), "--do_train"])
    assert "--encoder_branches=2 by default (an fp32 step on CPUs, hidden_size 128" in auto.stderr
    one = run([*common(d, config, tmp_path / "one", 3), "--do_train", "--encoder_branches=1"])
    assert "by default" not in one.stderr
    logs = [
        [json.loads(x)["loss"] for x in (tmp_path / n / "train_log.jsonl").read_text().splitlines()]
        for n in ("auto", "one")
    ]
    assert len(logs[0]) == 3
    np.testing.assert_allclose(logs[0], logs[1], rtol=1e-5)
    a, b = (tf.train.load_checkpoint(str(tmp_path / n)) for n in ("auto", "one"))
    names = [n for n in a.get_variable_to_shape_map() if n.endswith("/VARIABLE_VALUE")]
    assert any(n.startswith("seed_states/") for n in names)  # the dropout generators' too
    for name in names:
        np.testing.assert_allclose(a.get_tensor(name), b.get_tensor(name), rtol=1e-4,
                                   atol=1e-6, err_msg=name)  # fmt: skip


def test_speed_flags_train_and_log(setup, tmp_path):
    d, config = setup
    out = tmp_path / "bf16"
    # 6 examples a step in 3 micro-batches of 2, bfloat16 compute, LAMB, the encoder's layers
    # in 2 branches of each micro-batch, on the real tokens alone.
    flags_ = [
        "--precision=bf16",
        "--optimizer=lamb",
        "--gradient_accumulation_steps=3",
        "--encoder_branches=2",
        "--remove_padding",
    ]
    job = run([*common(d, config, out, 4), "--do_train", "--do_eval", *flags_])
    assert "--remove_padding: encoder run on each batch's real tokens" in job.stderr
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 and "loss_scale" not in r for r in log)
    assert "global_step = 4" in (out / "eval_results.txt").read_text()
    out = tmp_path / "fp16"
    # fp16 loss scaling, the whole step under XLA, each batch of 6 as 2 parallel parts of 3.
    run(
        [
            *common(d, config, out, 4),
            "--do_train",
            "--precision=fp16",
            "--use_xla",
            "--parallel_micro_batches=2",
        ]
    )
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["loss_scale"] == 2.0**15  # Keras' initial dynamic scale
    # Its checkpoints hold the loss scale's state: a resume at another precision is refused.
    bad = run([*common(d, config, out, 6), "--do_train", "--precision=bf16"], False)
    assert bad.returncode != 0 and "--precision was 'fp16' and is now 'bf16'" in bad.stderr
    bad = run(
        [*common(d, config, tmp_path / "x", 2), "--do_train", "--gradient_accumulation_steps=4"],
        False,
    )
    assert (
        bad.returncode != 0 and "does not split into --gradient_accumulation_steps=4" in bad.stderr
    )
    bad = run(
        [*common(d, config, tmp_path / "y", 2), "--do_train", "--parallel_micro_batches=4"], False
    )
    assert bad.returncode != 0 and "does not split into --parallel_micro_batches=4" in bad.stderr
    # Every dense layer's kernel gradient as an XLA dot (11 layers at 2 encoder layers); fp32 only.
    out = tmp_path / "xla_wg"
    job = run([*common(d, config, out, 2), "--do_train", "--xla_weight_gradients"])
    assert "--xla_weight_gradients: 11 dense layers' kernel gradients" in job.stderr
    # A warning where TensorFlow's oneDNN kernels are off (the option is for them).
    warned = "--xla_weight_gradients with TensorFlow's oneDNN kernels off" in job.stderr
    assert warned == (not layers.onednn_enabled())
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all(r["loss"] > 0 for r in log)
    bad = run(
        [*common(d, config, tmp_path / "v", 2), "--do_train", "--precision=bf16"]
        + ["--xla_weight_gradients"],
        False,
    )
    assert bad.returncode != 0 and "--xla_weight_gradients: XLA weight gradients: " in bad.stderr
    assert "computes in bfloat16; expected float32 (--precision=fp32)" in bad.stderr
    assert not list((tmp_path / "v").glob("ckpt-*"))
    bad = run([*common(d, config, tmp_path / "z", 2), "--do_train", "--encoder_branches=0"], False)
    assert bad.returncode != 0 and "--encoder_branches=0: encoder branches: expected" in bad.stderr
    bad = run(
        [*common(d, config, tmp_path / "w", 2), "--do_train", "--use_xla", "--remove_padding"],
        False,
    )
    assert bad.returncode != 0 and "--remove_padding: remove padding: --use_xla compiles" in (
        bad.stderr
    )
    assert not list((tmp_path / "w").glob("ckpt-*"))


def test_two_phase_recipe_continues_from_phase_one_with_longer_sequences(tmp_path):
    """The original recipe (BERT sec. A.2): phase 1 at a short length, then a new run at the long
    length from phase 1's weights with a fresh optimizer and step count; here 16 then 32."""
    config = tmp_path / "bert_config.json"
    config.write_text(helpers.tiny_config(max_position_embeddings=32).to_json_string())
    vocab = helpers.TINY["vocab_size"]
    helpers.write_synthetic_pretraining_file(tmp_path / "short.tfrecord", 24, 16, 3, vocab)
    helpers.write_synthetic_pretraining_file(tmp_path / "long.tfrecord", 24, 32, 5, vocab, seed=1)

    def phase(out, records, seq, preds, steps, *extra):
        return run([
            f"--bert_config_file={config}", f"--input_file={tmp_path}/{records}",
            f"--output_dir={tmp_path / out}", f"--max_seq_length={seq}",
            f"--max_predictions_per_seq={preds}", "--train_batch_size=6",
            f"--num_train_steps={steps}", "--num_warmup_steps=1", "--save_checkpoints_steps=2",
            "--iterations_per_loop=2", "--learning_rate=1e-3", "--do_train", *extra,
        ])  # fmt: skip

    phase("phase1", "short.tfrecord", 16, 3, 4)
    # Phase 2 with another seed: had its weights not come from phase 1, they would differ from
    # phase 1's by about the initializer's stddev (0.02), not by two Adam steps of 1e-3.
    phase2 = ["--init_checkpoint=" + str(tmp_path / "phase1"), "--random_seed=99"]
    first = phase("phase2", "long.tfrecord", 32, 5, 2, *phase2)
    assert "initialised the whole model from" in first.stderr and "ckpt-4" in first.stderr
    from modeling import bert
    from training import trainer

    def restored(out):
        model = bert.BertPretrainer(helpers.tiny_config(max_position_embeddings=32))
        model.build()
        trainer.restore_model_weights(model, str(tmp_path / out))
        return model

    one, two = restored("phase1"), restored("phase2")
    # The position table is sized max_position_embeddings (32), whatever the phase's length.
    assert one.encoder.embeddings.position_embeddings.shape == (32, helpers.TINY["hidden_size"])
    for a, b in zip(one.trainable_variables, two.trainable_variables):
        diff = abs(a.numpy() - b.numpy()).max()
        assert diff < 3e-3, (a.path, diff)
    one = tf.train.load_checkpoint(str(tmp_path / "phase1"))
    two = tf.train.load_checkpoint(str(tmp_path / "phase2"))
    step = "global_step/.ATTRIBUTES/VARIABLE_VALUE"
    assert (one.get_tensor(step), two.get_tensor(step)) == (4, 2)  # a fresh step count
    # A restart of phase 2 (same command, more steps) resumes phase 2, not phase 1.
    again = phase("phase2", "long.tfrecord", 32, 5, 4, *phase2)
    assert "resumed from" in again.stderr and "phase2/ckpt-2" in again.stderr
    assert "initialised the whole model" not in again.stderr
    log = [
        json.loads(x) for x in (tmp_path / "phase2" / "train_log.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
