"""Smoke runs of run_pretraining.py, its resume, its bad-input errors, and strategy selection."""

import json
import subprocess
import sys

import pytest
import tensorflow as tf

from tests import helpers
from tests.conftest import ROOT
from training import distribute

S, P = 11, 3


def run(args, check=True):
    result = subprocess.run(
        [sys.executable, "run_pretraining.py", *args], cwd=ROOT, capture_output=True, text=True
    )
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
    result = run([*common(d, config, out, 4), "--do_train", "--do_eval"])
    assert "examples/s" in result.stderr and "ETA" in result.stderr  # progress line
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
    assert (out / "training_curves.png").stat().st_size > 1000
    assert list((out / "train").glob("events.out.tfevents.*"))
    evals = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 4]  # untrained, then every checkpoint
    # A rerun with more steps resumes at step 4 rather than starting over.
    result = run([*common(d, config, out, 6), "--do_train"])
    assert "resumed from" in result.stderr and "ckpt-4" in result.stderr
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
