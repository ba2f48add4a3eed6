"""The train loop: Mirrored over two CPUs equals one device; resume equals an uninterrupted run."""

import collections
import contextlib
import dataclasses
import gc
import json
import math
import os
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import features
from modeling import bert, flops
from tests import helpers
from training import optimization, tasks, trainer

S, P, B = 11, 3, 6


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.tfrecord"
    helpers.write_synthetic_pretraining_file(path, 40, S, P, helpers.TINY["vocab_size"])
    return str(path)


def build(
    strategy,
    config,
    seed=7,
    steps=20,
    use_xla=False,
    precision="fp32",
    accumulation=1,
    optimizer="adamw",
    initial_scale=2.0**15,
    learning_rate=1e-2,
    parallel=1,
    branches=1,
    remove_padding=False,
    xla_weight_gradients=False,
):
    keras.utils.set_random_seed(seed)
    with strategy.scope(), optimization.dtype_policy(precision):
        model = bert.BertPretrainer(config)
        model.build()
        bert.set_execution_options(model, branches, remove_padding, xla_weight_gradients)
        opt = optimization.create_optimizer(learning_rate, steps, 2, optimizer=optimizer)
        opt = optimization.with_loss_scaling(opt, precision, initial_scale)
        opt.build(model.trainable_variables)
    return trainer.Trainer(
        strategy,
        tasks.bert_pretraining_task(model),
        opt,
        use_xla=use_xla,
        gradient_accumulation_steps=accumulation,
        parallel_micro_batches=parallel,
    )


def strategy_for(where: str):
    """Mirrored over two CPUs for "mirrored", else one CPU device (the tests' `where` cases)."""
    if where == "mirrored":
        return helpers.mirrored_strategy()
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def without_denominators(task):
    """`task` without its denominators_fn, which splitting a batch needs."""
    return dataclasses.replace(task, denominators_fn=None)


def dataset(path):
    return features.pretraining_dataset([path], B, S, P, is_training=True, seed=3)


def weights(model):
    return [np.array(v.numpy()) for v in model.trainable_variables]


@dataclasses.dataclass(frozen=True)
class Trained:
    """What a trainer did on the test batches: its per-step rows and weights before and after."""

    rows: np.ndarray
    before: list
    after: list


REFERENCE_STEPS = 3


def train(fit, data_file, steps=REFERENCE_STEPS) -> Trained:
    """`steps` steps of `fit` in one call on the test batches, from their start."""
    before = weights(fit.task.model)
    rows = fit.train_steps(iter(dataset(data_file)), steps)
    return Trained(rows, before, weights(fit.task.model))


def where_args(where: str) -> dict:
    """build()'s arguments for a `where` case: the whole step under XLA, or 3 micro-batches."""
    return {"use_xla": where == "xla", "accumulation": 3 if where == "accumulation" else 1}


@pytest.fixture(scope="module")
def reference(data_file):
    """`reference(where)`: the plain trainer (tiny config, dropout off, seed 7) over
    REFERENCE_STEPS steps, for `where` in one_device, mirrored, xla and accumulation (3
    micro-batches of 2). The tests below compare their trainers with it; each case is trained
    once per module (a trace and a run each) instead of once per comparison."""
    done = {}

    def get(where):
        if where not in done:
            fit = build(strategy_for(where), helpers.tiny_config(), **where_args(where))
            done[where] = train(fit, data_file)
        return done[where]

    return get


def assert_train_alike(a: Trained, b: Trained, rows_rtol, weights_rtol=1e-4, atol=1e-6):
    """Both trainings start from the same weights, give the same per-step rows and final weights
    on the same batches, and moved the weights."""
    for x, y in zip(a.before, b.before):
        np.testing.assert_array_equal(x, y)  # same seed, same init
    np.testing.assert_allclose(a.rows, b.rows, rtol=rows_rtol, atol=atol)
    moved = False
    for x, y, init in zip(a.after, b.after, a.before):
        np.testing.assert_allclose(x, y, rtol=weights_rtol, atol=atol)
        moved |= not np.allclose(x, init)
    assert moved, "training did not change the weights"


def _ran_graphs(fn):
    """fn() and the graphs of the functions instantiated meanwhile, as they ran (after the graph
    passes): (result, a Counter of op types per graph)."""
    from tensorflow.python.eager import context

    context.context().enable_run_metadata()
    try:
        result = fn()
        ran = context.context().export_run_metadata()  # since enable_run_metadata
    finally:
        context.context().disable_run_metadata()
    graphs = [g.post_optimization_graph.node for g in ran.function_graphs]
    return result, [collections.Counter(n.op for n in nodes) for nodes in graphs]


def _optimized_steps(graphs) -> int:
    """How many of `graphs` (_ran_graphs') are training steps (they hold a backward pass:
    BiasAddGrad) that Grappler optimized: it folds the index arithmetic of the losses and the
    attention into constants, so no FloorDiv is left, where the traced step has several. Each
    graph is asked on its own: a process that traced other steps before may instantiate their
    graphs again meanwhile (seen in the thirty-eighth session)."""
    return sum(1 for g in graphs if g["BiasAddGrad"] and not g["FloorDiv"])


# The trainings test_the_*_under_grappler_* compare: reference's three cases and bf16 with the
# encoder in 2 branches (the bench's setting).
GRAPPLER_CASES = ("one_device", "mirrored", "accumulation", "bf16")


def train_case(case, data_file):
    """One of GRAPPLER_CASES trained as `reference` trains its cases: _ran_graphs' pair."""
    if case == "bf16":
        strategy, args = strategy_for("one_device"), {"precision": "bf16", "branches": 2}
    else:
        strategy, args = strategy_for(case), where_args(case)
    return _ran_graphs(lambda: train(build(strategy, helpers.tiny_config(), **args), data_file))


_UNDER_GRAPPLER = """
import json, sys
import numpy as np
import tensorflow as tf
import tests.conftest  # the test processes' set-up: two logical CPUs, Grappler off
from tests import test_trainer as t

data_file, out = sys.argv[1:]
arrays, marks = {}, {}
for setting, cases in (("off", ("one_device", "bf16")), ("on", t.GRAPPLER_CASES)):
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": setting == "off"})
    for case in cases:
        done, graphs = t.train_case(case, data_file)
        key = f"{case}/{setting}"
        arrays[f"{key}/rows"] = done.rows
        for i, (before, after) in enumerate(zip(done.before, done.after)):
            arrays[f"{key}/before/{i}"], arrays[f"{key}/after/{i}"] = before, after
        fused = any(g["_FusedMatMul"] for g in graphs)
        marks[key] = {"optimized_steps": t._optimized_steps(graphs), "fused": fused}
np.savez(out + ".npz", **arrays)
with open(out + ".json", "w") as f:
    json.dump(marks, f)
"""


@pytest.fixture(scope="module")
def under_grappler(data_file, tmp_path_factory):
    """GRAPPLER_CASES trained in a fresh process with TensorFlow's graph optimizer on, as real
    runs and the benchmarks have it, and one_device and bf16 before that with it off, as the
    test processes have it (tests/subprocess_site: faster traces): {(case, "off" | "on"):
    (Trained, {"optimized_steps": n, "fused": bool})}, the marks read off the graphs as they
    ran (_ran_graphs). In a process of its own:
    collecting those graphs (TensorFlow's run metadata) in a worker raised its peak memory over
    the rest of this file by 1.4 GB (3.2 -> 4.7 GB; thirty-eighth session)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = tmp_path_factory.mktemp("grappler") / "cases"
    done = subprocess.run(  # the tests that read this skip under CLOZE_TEST_GRAPPLER=1
        [sys.executable, "-c", _UNDER_GRAPPLER, data_file, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    arrays = np.load(f"{out}.npz")
    marks = json.loads(Path(f"{out}.json").read_text())

    def trained(key):
        n = len([k for k in arrays.files if k.startswith(f"{key}/after/")])
        return Trained(
            arrays[f"{key}/rows"],
            [arrays[f"{key}/before/{i}"] for i in range(n)],
            [arrays[f"{key}/after/{i}"] for i in range(n)],
        )

    return {tuple(key.split("/")): (trained(key), mark) for key, mark in marks.items()}


_GRAPPLER_EVERYWHERE = pytest.mark.skipif(
    bool(os.environ.get("CLOZE_TEST_GRAPPLER")), reason="CLOZE_TEST_GRAPPLER=1: on in every test"
)


@_GRAPPLER_EVERYWHERE
@pytest.mark.parametrize("where", ["one_device", "mirrored", "accumulation"])
def test_the_step_under_grappler_trains_as_without_it(under_grappler, reference, where):
    # Without this a Grappler-only numerical bug would pass the suite: its fusions and rewrites
    # (the tied table's in-place gradient sum, AdamW's fused kernels, the accumulation loop,
    # Mirrored's all-reduce) must give the same rows and weights as the graphs every other test
    # runs (reference's). Grappler did rewrite the step (_optimized_steps), and in float32
    # fused MatMul + BiasAdd into one op; without it, neither.
    optimized, on = under_grappler[where, "on"]
    assert_train_alike(optimized, reference(where), rows_rtol=1e-5, weights_rtol=1e-5, atol=1e-6)
    off = under_grappler["one_device", "off"][1]  # the same step's graphs, Grappler off
    assert on["optimized_steps"] >= 1 and on["fused"], on
    assert off["optimized_steps"] == 0 and not off["fused"], off


@_GRAPPLER_EVERYWHERE
def test_the_bf16_step_in_branches_under_grappler_trains_as_without_it(under_grappler):
    # The same under mixed_bfloat16 with the encoder in 2 branches: the ops Grappler may
    # reorder or fuse run in bfloat16 there, so the rows agree to bfloat16's rounding (0.4%)
    # and not to float32's; the weights are left out (AdamW turns a gradient's rounding-level
    # sign flip into a whole step). In bfloat16 Grappler fuses MatMul + BiasAdd only where
    # oneDNN is on, so that is not asked here. With oneDNN's fused products the rows differ in
    # their last bits; without, they are the same bits.
    (optimized, on), (plain, off) = under_grappler["bf16", "on"], under_grappler["bf16", "off"]
    assert on["optimized_steps"] >= 1 and off["optimized_steps"] == 0, (on, off)
    np.testing.assert_allclose(optimized.rows, plain.rows, rtol=4e-3, atol=1e-6)


def test_mirrored_two_cpus_matches_one_device(reference):
    assert strategy_for("mirrored").num_replicas_in_sync == 2
    assert_train_alike(reference("mirrored"), reference("one_device"), rows_rtol=1e-5)


def test_rows_count_each_steps_tokens_those_not_padding_and_its_flops(reference, data_file):
    """train_steps' THROUGHPUT_COLUMNS: the global batch's positions, its input_mask's sum and
    the task's FLOPs (3 passes of modeling/flops.py's count per sequence), the same whether the
    batch ran on one device, two replicas, as micro-batches or under XLA."""
    keras.utils.set_random_seed(7)  # as build() left it when train() made the dataset
    step_flops = 3 * B * flops.mlm_pretraining_flops(helpers.tiny_config(), S, P)
    want = [
        [m.size, m.sum(), step_flops]
        for m in (b["input_mask"].numpy() for b in dataset(data_file).take(REFERENCE_STEPS))
    ]
    assert all(real < size for size, real, _ in want)  # the records hold padding
    k = len(trainer.EXTRA_COLUMNS)
    for where in ("one_device", "mirrored", "xla", "accumulation"):
        rows = reference(where).rows
        np.testing.assert_allclose(
            rows[:, -k - len(trainer.THROUGHPUT_COLUMNS) : -k], want, rtol=1e-6
        )


def test_token_counts_read_the_masks_of_inputs_and_targets():
    ids, mask = tf.ones((2, 3), tf.int32), tf.constant([[1, 1, 0], [1, 0, 0]])
    targets, target_mask = tf.ones((2, 2), tf.int32), tf.constant([[1, 0], [1, 1]])
    count = trainer.token_counts
    assert count({"input_ids": ids, "input_mask": mask}).numpy().tolist() == [6, 3]
    assert count({"input_ids": ids}).numpy().tolist() == [6, 6]  # LM blocks: no padding
    both = {"input_ids": ids, "input_mask": mask, "target_ids": targets, "target_mask": target_mask}
    assert count(both).numpy().tolist() == [10, 6]
    assert count({"label_ids": ids}).numpy().tolist() == [0, 0]


def test_throughput_in_the_log_line():
    assert trainer._fmt_throughput({}) == ""
    tokens = {"tokens_per_second": 3210.4, "real_tokens_per_second": 2889.0}
    line = trainer._fmt_throughput(tokens)
    assert line == " | 3,210 tokens/s (2,889 not padding, 90%)"
    with_flops = tokens | {"flops_per_second": 41.23e9}
    assert trainer._fmt_throughput(with_flops) == line + " | 41.2 GFLOP/s"
    peak = with_flops | {"flops_utilization": 0.384}
    assert trainer._fmt_throughput(peak) == line + " | 41.2 GFLOP/s (38% of the peak)"
    units = [trainer._fmt_flops(x) for x in (2.5e15, 989e12, 1e12, 999e6, 1.67e5, 12.0, 0.5)]
    want = ["2.50 PFLOP/s", "989 TFLOP/s", "1.00 TFLOP/s", "999 MFLOP/s", "167 kFLOP/s"]
    assert units == [*want, "12.0 FLOP/s", "0.50 FLOP/s"]


def test_throughput_from_rows():
    """_throughput turns a call's rows into per-second figures at the log's step rate: tokens
    where counted, FLOP/s where the task counts FLOPs, their share of a given peak."""
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config())
    k = len(fit.sum_keys)
    rows = np.zeros((2, k + len(trainer.THROUGHPUT_COLUMNS) + len(trainer.EXTRA_COLUMNS)))
    rows[:, k : k + 3] = [[100, 80, 4e9], [100, 90, 6e9]]
    got = trainer._throughput(fit, rows, steps_per_second=2.0, peak_flops=40e9)
    assert got == {
        "tokens_per_second": 200.0,
        "real_tokens_per_second": 170.0,
        "flops_per_second": 10e9,
        "flops_utilization": 0.25,
    }
    assert "flops_utilization" not in trainer._throughput(fit, rows, 2.0)  # no peak given
    rows[:, k + 2] = 0  # a task without flops_fn
    assert set(trainer._throughput(fit, rows, 2.0)) == {
        "tokens_per_second",
        "real_tokens_per_second",
    }


def test_loss_decreases_on_repeated_batch(data_file):
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config(), steps=60)
    one_batch = features.pretraining_dataset([data_file], B, S, P, is_training=False).take(1)
    rows = fit.train_steps(iter(one_batch.repeat()), 60)
    metrics = [fit.metrics_from_sums(r) for r in rows]
    assert metrics[-1]["masked_lm_loss"] < 0.5 * metrics[0]["masked_lm_loss"]


def poisoned(path, bad_steps):
    """`dataset(path)` with NaN masked_lm_weights in the batches of `bad_steps` (1-based), so
    those steps' loss and gradients are NaN."""

    def poison(i, batch):
        bad = tf.reduce_any(tf.equal(i + 1, tf.constant(list(bad_steps) or [-1], tf.int64)))
        w = batch["masked_lm_weights"]
        return batch | {"masked_lm_weights": tf.where(bad, w * np.nan, w)}

    return dataset(path).enumerate().map(poison)


def _run(
    out_dir, data_file, steps, config, bad_steps=(), build_args=None, strategy=None, **settings
):
    strategy = strategy or tf.distribute.OneDeviceStrategy("/cpu:0")
    fit = build(strategy, config, steps=12, **(build_args or {}))
    trainer.run_training(
        fit,
        lambda: poisoned(data_file, bad_steps) if bad_steps else dataset(data_file),
        trainer.TrainSettings(
            str(out_dir),
            steps,
            save_checkpoints_steps=3,
            iterations_per_loop=2,
            config_json=config.to_json_string(),
            **settings,
        ),
        global_batch_size=B,
    )
    return fit


def _straight_and_resumed(tmp_path, data_file, steps, resume_at, config, **run_args):
    """A straight run of `steps` in a/ (a checkpoint every 3 steps), and its resumption: b/ is
    a copy of a/ without the checkpoints after step `resume_at`, as a run killed after it had
    logged those steps but before their saves leaves its folder; b/ resumes from its
    checkpoint at step `resume_at` (the log cut back to it) to `steps`. One trainer fewer to
    trace than a separate first-half run. Returns (straight, resumed) and the two train logs
    (b's without the marks). `run_args` go to both _run calls."""
    straight = _run(tmp_path / "a", data_file, steps, config, **run_args)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    later = [
        p for p in (tmp_path / "b").glob("ckpt-*.*") if int(p.name[5:].split(".")[0]) > resume_at
    ]
    assert later, "the straight run saved nothing after the resume point"
    for path in later:
        path.unlink()
    # Each copied log line is marked: a resumption from ckpt-`resume_at` keeps exactly the
    # lines up to it (a fresh start would delete them all, and would train to the same weights).
    log_b = tmp_path / "b" / "train_log.jsonl"
    marked = [json.dumps(r | {"copied": True}) for r in trainer.read_jsonl(str(log_b))]
    log_b.write_text("\n".join(marked) + "\n")
    resumed = _run(tmp_path / "b", data_file, steps, config, **run_args)
    rows = trainer.read_jsonl(str(log_b))
    assert [r["step"] for r in rows if r.pop("copied", False)] == list(range(1, resume_at + 1))
    return straight, resumed, [trainer.read_jsonl(str(tmp_path / "a" / "train_log.jsonl")), rows]


def test_resume_equals_uninterrupted_run_bit_for_bit(tmp_path, data_file):
    # Dropout on: the dropout seed states must be in the checkpoint for this to hold.
    config = helpers.tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    straight, resumed, (log_a, log_b) = _straight_and_resumed(tmp_path, data_file, 12, 6, config)
    for a, b in zip(weights(straight.task.model), weights(resumed.task.model)):
        np.testing.assert_array_equal(a, b)
    assert [r["step"] for r in log_b] == list(range(1, 13))
    assert log_a == log_b


def test_resume_refuses_other_config(tmp_path, data_file):
    _run(tmp_path, data_file, 3, helpers.tiny_config())
    with pytest.raises(ValueError, match="different model config"):
        _run(tmp_path, data_file, 6, helpers.tiny_config(intermediate_size=19))


def test_temp_checkpoint_folders_are_cleaned(tmp_path, data_file):
    (tmp_path / "ckpt-3_temp").mkdir(parents=True)
    (tmp_path / "ckpt-3_temp" / "junk").write_text("x")
    _run(tmp_path, data_file, 3, helpers.tiny_config())
    assert not (tmp_path / "ckpt-3_temp").exists()
    assert json.loads((tmp_path / "model_config.json").read_text())["intermediate_size"] == 17


def test_curve_series_reads_both_logs_and_averages_the_training_rows():
    # 40 training rows (every other one without "acc"), held-out rows at 0, 20 and 40.
    train = [
        {"step": i, "loss": float(i)} | ({"acc": i / 100} if i % 2 else {}) for i in range(1, 41)
    ]
    evals = [{"step": i, "loss": 50.0 - i, "f1": i / 40} for i in (0, 20, 40)]
    series = trainer.curve_series(train, evals, "loss")
    np.testing.assert_array_equal(series["train"][0], np.arange(1, 41))
    assert series["window"] == 2  # 40 rows // 20
    np.testing.assert_array_equal(series["smooth"][0], np.arange(2, 41))
    np.testing.assert_allclose(series["smooth"][1], np.arange(1.5, 40))
    np.testing.assert_array_equal(series["heldout"][1], [50.0, 30.0, 10.0])
    # A key some training rows lack: the rows holding it, averaged among themselves.
    acc = trainer.curve_series(train, evals, "acc")
    np.testing.assert_array_equal(acc["train"][0], np.arange(1, 41, 2))
    assert acc["window"] == 1 and "heldout" not in acc
    # A pair of keys: training "tagging_loss", held-out "loss" (run_ner's).
    pair = trainer.curve_series([{"step": 1, "tagging_loss": 3.0}], evals, ("tagging_loss", "loss"))
    assert pair["train"][1].tolist() == [3.0] and pair["heldout"][0].tolist() == [0, 20, 40]
    assert set(trainer.curve_series(train, evals, "f1")) == {"heldout"}
    assert trainer.curve_series(train, evals, "missing") == {}
    assert trainer.panel_title(("tagging_loss", "loss")) == "tagging_loss / held-out loss"
    # A skipped step's non-finite loss is left out, not spread over the later means.
    skipped = [r | {"loss": math.nan} if r["step"] == 5 else r for r in train]
    series = trainer.curve_series(skipped, evals, "loss")
    assert 5 not in series["train"][0] and np.isfinite(series["smooth"][1]).all()
    # A million-row line is drawn at every k-th row and its last.
    steps = np.arange(1, 1_000_001)
    drawn, values = trainer._thinned(steps, steps * 2.0)
    assert len(drawn) <= trainer.CURVE_POINTS + 1 and drawn[-1] == 1_000_000
    assert drawn[0] == 1 and (values == drawn * 2.0).all()


def test_plot_training_curves_draws_each_panel_and_warns_of_an_empty_one(tmp_path, caplog):
    import matplotlib.image

    rows = [{"step": i, "loss": 1.0 / i, "accuracy": i / 10} for i in range(1, 11)]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval_log.jsonl").write_text(json.dumps({"step": 10, "f1": 0.5}) + "\n")
    with caplog.at_level("INFO"):
        path = trainer.plot_training_curves(str(tmp_path), "loss", "f1", "mcc")
    # Three panels of 6 x 4 inches at 100 dpi; written whole, no temporary file left behind.
    assert matplotlib.image.imread(path).shape[:2] == (400, 1800)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "eval_log.jsonl", "train_log.jsonl", "training_curves.png"
    ]  # fmt: skip
    assert f"training curves: {path} (loss, f1, mcc)" in caplog.text
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == ["training curves: no values logged for mcc"]


def test_curves_are_redrawn_at_the_first_and_last_save_and_at_most_1_percent_between(
    tmp_path, monkeypatch
):
    clock = [1000.0]
    drawn = []

    def plot(output_dir, *panels):  # each redraw takes 2 s of the fake clock
        drawn.append(clock[0])
        clock[0] += 2.0

    monkeypatch.setattr(trainer.time, "time", lambda: clock[0])
    monkeypatch.setattr(trainer, "plot_training_curves", plot)
    redraws = trainer._CurveRedraws(str(tmp_path), ("loss",))
    for step, seconds_later in enumerate([0, 150, 60, 150, 10], start=1):
        clock[0] += seconds_later
        redraws.after_save(step, last=step == 5)
    # The first; not 150 s after a 2 s redraw (under 100 x 2 s); 210 s after it; not 150 s
    # after that one; the last.
    assert drawn == [1000.0, 1212.0, 1374.0]


def test_run_training_draws_the_curves_and_trains_on_when_a_plot_fails(
    tmp_path, data_file, monkeypatch, caplog
):
    drawn = []

    def plot(output_dir, *panels):
        drawn.append((len(trainer.read_jsonl(f"{output_dir}/train_log.jsonl")), panels))
        if len(drawn) == 1:
            raise OSError("No space left on device")  # the first plot fails; training goes on
        return plot_training_curves(output_dir, *panels)

    plot_training_curves = trainer.plot_training_curves
    monkeypatch.setattr(trainer, "plot_training_curves", plot)
    _run(tmp_path, data_file, 6, helpers.tiny_config(), curves=("masked_lm_loss",))
    assert drawn == [(3, ("masked_lm_loss",)), (6, ("masked_lm_loss",))]
    assert (tmp_path / "training_curves.png").stat().st_size > 1000
    assert "training curves not drawn at step 3: OSError('No space left on device')" in caplog.text
    assert (tmp_path / "ckpt-6.index").exists()


def test_warmup_linear_decay_schedule():
    sched = optimization.WarmupLinearDecay(1.0, num_train_steps=10, num_warmup_steps=4)
    got = [float(sched(s)) for s in range(12)]
    want = [0, 0.25, 0.5, 0.75, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0]
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_clip_handles_inf_without_nan():
    grads = [tf.constant([3.0, 4.0]), tf.constant([float("inf")])]
    clipped, norm = optimization.clip_by_global_norm(grads, 1.0)
    assert not np.isfinite(norm.numpy())
    assert clipped[0].numpy().tolist() == [3.0, 4.0]  # left for the caller to reject, not NaN
    clipped, norm = optimization.clip_by_global_norm([tf.constant([3.0, 4.0])], 1.0)
    np.testing.assert_allclose(clipped[0].numpy(), [0.6, 0.8], rtol=1e-6)
    assert float(norm) == pytest.approx(5.0)


def test_weight_decay_skips_layer_norm_and_bias():
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config())
    opt = fit.optimizer
    decayed = {v.path for v in fit.task.model.trainable_variables if opt._use_weight_decay(v)}
    assert any(p.endswith("word_embeddings") for p in decayed)
    assert any(p.endswith("qkv/kernel") for p in decayed)
    assert not any(p.endswith(("gamma", "beta", "bias")) for p in decayed)


def test_init_from_encoder_only_checkpoint_loads_encoder_and_keeps_heads(tmp_path):
    config = helpers.tiny_config()
    source = bert.BertPretrainer(config)
    source.build()
    # An encoder-only checkpoint, as convert_checkpoint.py writes for a published encoder.
    prefix = tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=source.encoder)).save(
        str(tmp_path / "enc")
    )
    target = bert.BertPretrainer(config)
    target.build()
    head_before = target.masked_lm.transform.kernel.numpy().copy()
    loaded, part = trainer.init_from_checkpoint(target, prefix)
    assert (loaded, part) == (prefix, "encoder")
    for a, b in zip(source.encoder.trainable_variables, target.encoder.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(target.masked_lm.transform.kernel.numpy(), head_before)
    full = tf.train.Checkpoint(model=source).save(str(tmp_path / "full"))
    assert trainer.init_from_checkpoint(target, full) == (full, "model")
    with pytest.raises(ValueError, match="expected a checkpoint"):
        trainer.init_from_checkpoint(target, str(tmp_path / "empty_dir_that_does_not_exist"))


def test_xla_step_matches_plain_step(reference):
    assert_train_alike(
        reference("xla"), reference("one_device"), rows_rtol=1e-4, weights_rtol=1e-3, atol=1e-5
    )
    xla = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config(), use_xla=True)
    with pytest.raises(ValueError, match="single replica"):
        trainer.Trainer(helpers.mirrored_strategy(), xla.task, xla.optimizer, use_xla=True)


def test_train_and_warmup_steps_as_the_original():
    assert optimization.train_and_warmup_steps(1000, 32, 3.0, 0.1) == (93, 9)
    with pytest.raises(ValueError, match="give no training step"):
        optimization.train_and_warmup_steps(10, 32, 1.0, 0.1)


# ---------------------------------------------------------------------------------------------
# Non-finite steps: checked before the update, never applied, never saved


@pytest.mark.parametrize("where", ["one_device", "mirrored", "xla", "accumulation"])
def test_nonfinite_step_changes_nothing_and_training_goes_on(data_file, where):
    strategy = strategy_for(where)
    fit = build(strategy, helpers.tiny_config(), **where_args(where))
    batches = iter(poisoned(data_file, [3]))
    assert fit.train_steps(batches, 2)[:, -1].tolist() == [1.0, 1.0]
    model_before = weights(fit.task.model)
    optimizer_before = [np.array(v.numpy()) for v in fit.optimizer.variables]
    row = fit.train_steps(batches, 1)[0]
    assert row[-1] == 0.0 and not np.isfinite(fit.loss_from_sums(row))
    for a, b in zip(model_before, weights(fit.task.model)):
        np.testing.assert_array_equal(a, b)
    # Adam's moments and the iteration (hence the learning rate) are untouched too.
    for a, v in zip(optimizer_before, fit.optimizer.variables):
        np.testing.assert_array_equal(a, v.numpy(), err_msg=v.path)
    assert int(fit.optimizer.iterations.numpy()) == 2
    rows = fit.train_steps(batches, 2)
    assert rows[:, -1].tolist() == [1.0, 1.0] and np.isfinite(rows).all()
    assert int(fit.optimizer.iterations.numpy()) == 4
    after = weights(fit.task.model)
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(model_before, after))


def test_skip_counts_and_logs_nonfinite_steps(tmp_path, data_file):
    fit = _run(tmp_path, data_file, 8, helpers.tiny_config(), [4, 5], on_nonfinite="skip")
    log = trainer.read_jsonl(str(tmp_path / "train_log.jsonl"))
    assert [r["step"] for r in log] == list(range(1, 9))
    assert [r["step"] for r in log if r.get("skipped")] == [4, 5]
    assert all(np.isfinite(r["loss"]) for r in log if not r.get("skipped"))
    assert int(fit.optimizer.iterations.numpy()) == 6  # 8 batches, 6 updates
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-8")
    # eval_results: global_step (the entrypoints' optimizer.iterations) counts updates applied;
    # train_steps and skipped_steps say how it relates to the logged step and ckpt-8.
    path = trainer.write_eval_results(str(tmp_path), {"global_step": 6, "loss": 1.5})
    lines = open(path).read().splitlines()
    assert lines == ["global_step = 6", "loss = 1.5", "skipped_steps = 2", "train_steps = 8"]
    # A run where every step applied writes the original's keys only.
    clean = tmp_path / "clean"
    _run(clean, data_file, 3, helpers.tiny_config())
    path = trainer.write_eval_results(str(clean), {"global_step": 3, "loss": 1.5})
    assert open(path).read().splitlines() == ["global_step = 3", "loss = 1.5"]


def test_stop_names_the_step_and_saves_nothing_after_it(tmp_path, data_file):
    with pytest.raises(FloatingPointError, match=r"at step 5, with --on_nonfinite=stop.*ckpt-3"):
        _run(tmp_path, data_file, 8, helpers.tiny_config(), [5])
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.index")) == ["ckpt-3.index"]
    # A rerun resumes at the intact checkpoint (and here stops at the same batch again).
    with pytest.raises(FloatingPointError, match="at step 5"):
        _run(tmp_path, data_file, 8, helpers.tiny_config(), [5])


def test_nonfinite_weights_are_never_saved(tmp_path):
    # Weights that went bad some other way than a step (the step's check keeps them finite).
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config())
    model = fit.task.model
    ckpt = tf.train.Checkpoint(model=model)
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path), 3, checkpoint_name="ckpt")
    trainer._save(manager, model, 4)
    v = model.trainable_variables[5]
    v.assign(tf.tensor_scatter_nd_update(v, [[0] * len(v.shape)], [np.inf]))  # one Inf entry
    with pytest.raises(
        FloatingPointError, match=r"non-finite weights at step 5; not saved.*ckpt-4"
    ):
        trainer._save(manager, model, 5)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.index")) == ["ckpt-4.index"]


def test_skip_gives_up_after_too_many_in_a_row(tmp_path, data_file):
    with pytest.raises(FloatingPointError, match=r"at step 4, 3 in a row.*giving up"):
        _run(
            tmp_path,
            data_file,
            8,
            helpers.tiny_config(),
            [2, 3, 4],
            on_nonfinite="skip",
            max_consecutive_nonfinite=3,
        )
    # Step 3 (saved) was skipped too, but its weights are step 1's, finite; nothing after step 4.
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.index")) == ["ckpt-3.index"]


# ---------------------------------------------------------------------------------------------
# Speed features against the plain path: steps per call, mixed precision, accumulation


def test_several_steps_per_call_equal_one_step_per_call(data_file, reference):
    many = reference("one_device")  # REFERENCE_STEPS steps in one call
    one = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config())
    batches = iter(dataset(data_file))
    rows_one = np.concatenate([one.train_steps(batches, 1) for _ in range(REFERENCE_STEPS)])
    np.testing.assert_allclose(many.rows, rows_one, rtol=1e-6, atol=1e-7)
    for a, b in zip(many.after, weights(one.task.model)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_slow_steps_shorten_the_compiled_calls_and_change_nothing(tmp_path, data_file):
    # A SIGTERM is only seen between calls: with steps slower than max_seconds_per_loop allows,
    # each call after the first holds one step, and the run is the same bit for bit.
    config = helpers.tiny_config(hidden_dropout_prob=0.1)
    plain = _run(tmp_path / "a", data_file, 8, config)  # calls of 2, 1, 2, 1, 2
    calls = []
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), config, steps=12)
    steps_fn = fit.train_steps
    fit.train_steps = lambda iterator, n: calls.append(n) or steps_fn(iterator, n)
    settings = trainer.TrainSettings(
        str(tmp_path / "b"),
        8,
        save_checkpoints_steps=3,
        iterations_per_loop=4,
        config_json=config.to_json_string(),
        max_seconds_per_loop=1e-9,
    )
    trainer.run_training(fit, lambda: dataset(data_file), settings, global_batch_size=B)
    assert calls == [3, 1, 1, 1, 1, 1], calls  # the first call: to the save at step 3
    for a, b in zip(weights(plain.task.model), weights(fit.task.model)):
        np.testing.assert_array_equal(a, b)
    log_a = trainer.read_jsonl(str(tmp_path / "a" / "train_log.jsonl"))
    assert log_a == trainer.read_jsonl(str(tmp_path / "b" / "train_log.jsonl"))


def test_bf16_loss_is_close_to_fp32_and_variables_stay_float32(tmp_path, data_file):
    config = helpers.tiny_config()
    fp32 = build(tf.distribute.OneDeviceStrategy("/cpu:0"), config)
    bf16 = build(tf.distribute.OneDeviceStrategy("/cpu:0"), config, precision="bf16")
    assert bf16.task.model.encoder.blocks[0].attention.qkv.compute_dtype == "bfloat16"
    assert keras.config.dtype_policy().name == "float32"  # restored after building
    for a, b in zip(weights(fp32.task.model), weights(bf16.task.model)):
        np.testing.assert_array_equal(a, b)  # same float32 initial values
    rows32 = fp32.train_steps(iter(dataset(data_file)), 3)
    rows16 = bf16.train_steps(iter(dataset(data_file)), 3)
    loss32 = [fp32.loss_from_sums(r) for r in rows32]
    loss16 = [bf16.loss_from_sums(r) for r in rows16]
    # bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4%); summed over the network
    # the per-step loss stays within 2% of fp32 here.
    np.testing.assert_allclose(loss16, loss32, rtol=2e-2)
    assert loss16 != loss32, "bf16 computed exactly as fp32: the policy was not applied"
    assert all(v.dtype == "float32" for v in bf16.task.model.variables if "seed" not in v.path)
    prefix = tf.train.Checkpoint(model=bf16.task.model).save(str(tmp_path / "ckpt"))
    saved = dict(
        (name, tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()[name])
        for name, _ in tf.train.list_variables(prefix)
        if name.startswith("model/") and "seed_generator" not in name
    )
    assert saved and set(saved.values()) == {tf.float32}


def test_fp16_overflow_lowers_the_scale_and_is_not_a_nonfinite_failure(tmp_path, data_file):
    # An initial scale of 2^24 makes the float16 backward pass overflow to Inf (the MLM logits'
    # gradient times 2^24 exceeds float16's 65504), as a too-high scale does in a real run.
    args = {"precision": "fp16", "initial_scale": 2.0**24}
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config(), **args)
    before = weights(fit.task.model)
    row = fit.train_steps(iter(dataset(data_file)), 1)[0]
    extra = dict(zip(trainer.EXTRA_COLUMNS, row[-5:]))
    assert (extra["overflow"], extra["applied"], extra["loss_scale"]) == (1.0, 0.0, 2.0**24)
    assert np.isfinite(fit.loss_from_sums(row)) and not np.isfinite(extra["grad_norm"])
    for a, b in zip(before, weights(fit.task.model)):
        np.testing.assert_array_equal(a, b)
    assert float(fit.optimizer.dynamic_scale.numpy()) == 2.0**23
    assert int(fit.optimizer.iterations.numpy()) == 0
    # Through run_training with --on_nonfinite=stop: overflows are logged, not failures, and
    # the scale falls until steps apply.
    fit = _run(tmp_path / "a", data_file, 12, helpers.tiny_config(), build_args=args)
    log = trainer.read_jsonl(str(tmp_path / "a" / "train_log.jsonl"))
    overflows = [r["step"] for r in log if r.get("overflow")]
    assert overflows and overflows == list(range(1, len(overflows) + 1)) and len(overflows) < 12
    assert not any(r.get("skipped") for r in log)
    scales = [r["loss_scale"] for r in log]
    assert scales[: len(overflows) + 1] == [2.0**24 / 2**i for i in range(len(overflows) + 1)]
    assert int(fit.optimizer.iterations.numpy()) == 12 - len(overflows)
    assert all(np.isfinite(w).all() for w in weights(fit.task.model))
    # A non-finite loss (injected NaN in the data) is a real failure under fp16 too.
    with pytest.raises(FloatingPointError, match="at step 5, with --on_nonfinite=stop"):
        _run(tmp_path / "b", data_file, 8, helpers.tiny_config(), [5], {"precision": "fp16"})


@pytest.mark.parametrize("where", ["mirrored", "xla", "accumulation"])
def test_fp16_speed_features_train_as_the_plain_fp16_step(data_file, where):
    # fp16's loss scaling with each speed feature against the plain fp16 step on one device:
    # over two replicas, the whole step under XLA, 3 micro-batches. The same rows and weights
    # within float16's rounding (10 significant bits; the micro-batches' and replicas' sums are
    # taken in another order), and the same loss scale.
    plain = train(
        build(strategy_for("one_device"), helpers.tiny_config(), precision="fp16"), data_file
    )
    other = build(strategy_for(where), helpers.tiny_config(), precision="fp16", **where_args(where))
    fast = train(other, data_file)
    assert_train_alike(fast, plain, rows_rtol=5e-4, weights_rtol=2e-2, atol=2e-4)
    scale = trainer.EXTRA_COLUMNS.index("loss_scale") - len(trainer.EXTRA_COLUMNS)
    assert list(fast.rows[:, scale]) == list(plain.rows[:, scale]) == [2.0**15] * REFERENCE_STEPS


@pytest.mark.parametrize("where", ["mirrored", "xla", "accumulation"])
def test_fp16_overflow_skips_the_whole_step_once(data_file, where):
    # An overflowing scale (2^24, as in the test above) with each speed feature: the step is
    # skipped whole (no weight moves, the optimizer's iteration stays) and the scale halves once
    # per step, not once per micro-batch or replica.
    args = {"precision": "fp16", "initial_scale": 2.0**24, **where_args(where)}
    fit = build(strategy_for(where), helpers.tiny_config(), **args)
    before = weights(fit.task.model)
    row = fit.train_steps(iter(dataset(data_file)), 1)[0]
    extra = dict(zip(trainer.EXTRA_COLUMNS, row[-len(trainer.EXTRA_COLUMNS) :]))
    assert (extra["overflow"], extra["applied"], extra["loss_scale"]) == (1.0, 0.0, 2.0**24)
    for a, b in zip(before, weights(fit.task.model)):
        np.testing.assert_array_equal(a, b)
    assert float(fit.optimizer.dynamic_scale.numpy()) == 2.0**23
    assert int(fit.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("where", ["one_device", "mirrored"])
def test_accumulated_steps_equal_large_batch_steps(data_file, reference, where):
    # Dropout off (the reference's tiny config): micro-batches draw other masks.
    strategy = strategy_for(where)
    # B = 6: 3 micro-batches of 2 on one device (the reference's accumulation case), of 1 per
    # replica on two.
    if where == "one_device":
        accumulated = reference("accumulation")
    else:
        accumulated = train(build(strategy, helpers.tiny_config(), accumulation=3), data_file)
    assert_train_alike(accumulated, reference(where), rows_rtol=1e-4)
    large = build(strategy, helpers.tiny_config())
    with pytest.raises(ValueError, match="gradient accumulation: needs the task's denominators_fn"):
        trainer.Trainer(
            strategy,
            without_denominators(large.task),
            large.optimizer,
            gradient_accumulation_steps=2,
        )


@pytest.mark.parametrize("where", ["one_device", "mirrored", "xla", "accumulation"])
def test_parallel_micro_batches_equal_the_whole_batch(data_file, reference, where):
    # K independent forward and backward passes over slices of each batch, their gradients
    # summed: the same rows and weights as the whole batch in one pass (dropout off: the passes
    # draw other masks). On one device (6 = 2 x 3), Mirrored over two CPUs (3 per replica, K = 3),
    # the whole step under XLA, and inside each of 3 accumulated micro-batches of 2 (a size known
    # only when the step runs). The task's forward is traced once per part, at the part's size,
    # so the parts really are separate.
    strategy = strategy_for(where)
    k = 3 if where == "mirrored" else 2
    whole = reference(where)
    split = build(strategy, helpers.tiny_config(), parallel=k, **where_args(where))
    calls = []
    sums_fn = split.task.sums_fn

    def counted(batch, training):
        calls.append(batch["input_ids"].shape[0])
        return sums_fn(batch, training=training)

    split.task = dataclasses.replace(split.task, sums_fn=counted)
    assert_train_alike(train(split, data_file), whole, rows_rtol=1e-4)
    assert calls and len(calls) % k == 0, calls
    if where != "accumulation":  # there the slices' size is dynamic (None)
        assert set(calls) == {B // strategy.num_replicas_in_sync // k}, calls


@pytest.mark.parametrize("where", ["one_device", "mirrored", "xla", "accumulation"])
def test_encoder_branches_train_as_one_pass(data_file, reference, where, monkeypatch):
    # The encoder's layers in K = 4 row slices of each batch (bert.run_layer_stack): the same
    # rows and weights as one pass (dropout off here; with it below). Uneven slices on
    # one device and under XLA (6 rows: 2, 2, 1, 1), Mirrored over two CPUs (3 per replica: 1,
    # 1, 1), and micro-batches of 2 whose size is known only when the step runs (1, 1, 0, 0: two
    # empty slices). Each block really runs once per slice, at the slice's size.
    from modeling import layers

    config = helpers.tiny_config()
    whole = reference(where)  # trained before the count below starts
    split = build(strategy_for(where), config, branches=4, **where_args(where))
    sizes = []
    block_call = layers.TransformerBlock.call

    def counted(self, x, *a, **k):
        sizes.append(x.shape[0])
        return block_call(self, x, *a, **k)

    monkeypatch.setattr(layers.TransformerBlock, "call", counted)
    assert_train_alike(train(split, data_file), whole, rows_rtol=1e-4)
    # Block calls by batch size, only the slices' (per trace, per layer: one call per slice).
    count = collections.Counter(sizes)
    layers_n = config.num_hidden_layers
    if where == "mirrored":
        assert set(count) == {1} and count[1] % (3 * layers_n) == 0, count
    elif where == "accumulation":
        assert set(count) == {None} and count[None] % (4 * layers_n) == 0, count
    else:
        assert set(count) == {2, 1} and count[2] == count[1], count
        assert count[2] % (2 * layers_n) == 0, count


@pytest.mark.parametrize("where", ["one_device", "mirrored", "accumulation"])
def test_encoder_branches_train_as_one_pass_with_dropout(data_file, where):
    # The same with dropout on (0.2, hidden and attention): the K = 4 slices draw their rows of
    # one pass' masks (layers.RowSlice), so the steps' rows and the weights are one pass' again,
    # on one device, Mirrored over two CPUs (each replica traced in a thread of its own), and in
    # micro-batches whose slices' sizes and offsets are known only when the step runs (under
    # XLA: tests/test_step_speed's keep_mask_rows test).
    config = helpers.tiny_config(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
    whole = train(build(strategy_for(where), config, **where_args(where)), data_file)
    split = train(build(strategy_for(where), config, branches=4, **where_args(where)), data_file)
    assert_train_alike(split, whole, rows_rtol=1e-4)


@pytest.mark.parametrize("where", ["one_device", "mirrored", "xla", "accumulation"])
def test_xla_weight_gradients_train_as_the_plain_step(data_file, reference, where, monkeypatch):
    # Every Dense's kernel gradient as an XLA-compiled dot (--xla_weight_gradients): the same
    # rows and weights as the plain step (1e-4, as the other speed options: Adam turns float32
    # rounding of two matmul kernels into small weight differences), on one device, Mirrored
    # over two CPUs, inside 3 micro-batches of 2, and under XLA, where the whole step is
    # compiled and the Dense layers take the plain path (no custom gradient traced).
    whole = reference(where)
    calls = helpers.count_xla_weight_gradient_calls(monkeypatch)
    fit = build(strategy_for(where), helpers.tiny_config(), xla_weight_gradients=True,
                **where_args(where))  # fmt: skip
    assert_train_alike(train(fit, data_file), whole, rows_rtol=1e-4)
    if where == "xla":
        assert not calls
    else:  # traced for every Dense the step calls: 4 a layer, the heads' 3, less the last
        # layer's Q/K/V, whose kernel is split to project queries at the output positions alone
        assert calls and len(calls) % (4 * helpers.tiny_config().num_hidden_layers + 2) == 0


@pytest.mark.parametrize("where", ["one_device", "mirrored", "accumulation", "branches"])
def test_remove_padding_trains_as_the_padded_layout(data_file, reference, where, monkeypatch):
    # The encoder's layers on the real tokens' rows alone (bert.run_layer_stack, layers.Unpadded;
    # the test records are 6-11 real tokens of 11): the same rows and weights as the padded
    # layout, dropout off. On one device, Mirrored over two CPUs, inside 3 micro-batches of 2,
    # and in 2 branches of 3 rows. The blocks really run on rows: each call's x is (1, R, H),
    # R unknown when traced.
    from modeling import layers

    base = "one_device" if where == "branches" else where
    whole = reference(base)
    unpadded = build(
        strategy_for(base),
        helpers.tiny_config(),
        remove_padding=True,
        branches=2 if where == "branches" else 1,
        **where_args(base),
    )
    shapes = []
    block_call = layers.TransformerBlock.call

    def recorded(self, x, *a, **k):
        shapes.append(tuple(x.shape))
        return block_call(self, x, *a, **k)

    monkeypatch.setattr(layers.TransformerBlock, "call", recorded)
    trained = train(unpadded, data_file)
    # The FLOPs column counts the products run, at the rows (tests/test_flops.py checks the
    # count): it differs from the padded layout's; every other column is the same.
    column = trainer.THROUGHPUT_COLUMNS.index("flops") - len(trainer.THROUGHPUT_COLUMNS)
    column -= len(trainer.EXTRA_COLUMNS)
    assert np.all(trained.rows[:, column] > 0)
    assert not np.allclose(trained.rows[:, column], whole.rows[:, column], rtol=1e-3)
    same = dataclasses.replace(trained, rows=np.delete(trained.rows, column, axis=1))
    assert_train_alike(
        same, dataclasses.replace(whole, rows=np.delete(whole.rows, column, axis=1)), 1e-4
    )
    assert shapes and set(shapes) == {(1, None, helpers.TINY["hidden_size"])}, shapes


def test_remove_padding_is_refused_under_xla(data_file):
    fit = build(tf.distribute.OneDeviceStrategy("/cpu:0"), helpers.tiny_config(), use_xla=True)
    bert.set_remove_padding(fit.task.model, True)
    with pytest.raises(ValueError, match="remove padding: XLA"):
        fit.train_steps(iter(dataset(data_file)), 1)


def test_parallel_micro_batches_refuse_uneven_batches_and_tasks_without_denominators(data_file):
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    fit = build(one, helpers.tiny_config(), parallel=4)  # B = 6
    with pytest.raises(ValueError, match="batch of 6 does not split into 4 parallel"):
        fit.train_steps(iter(dataset(data_file)), 1)
    with pytest.raises(ValueError, match="parallel_micro_batches must be >= 1"):
        build(one, helpers.tiny_config(), parallel=0)
    with pytest.raises(ValueError, match="parallel micro-batches: needs the task's denomin"):
        trainer.Trainer(
            one, without_denominators(fit.task), fit.optimizer, parallel_micro_batches=2
        )


@pytest.mark.parametrize("args", [{"accumulation": 2}, {"parallel": 2}, {"branches": 2}])
def test_accumulation_checkpoints_at_apply_boundaries_and_resumes_bit_for_bit(
    tmp_path, data_file, args
):
    # The N micro-batches (or K parallel parts) of a step run inside that step, so a checkpoint
    # (taken between steps) never holds a half-accumulated gradient; with dropout on, resume
    # still equals a straight run bit for bit (the parts draw their masks in a fixed order).
    config = helpers.tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    straight, resumed, (log_a, log_b) = _straight_and_resumed(
        tmp_path, data_file, 6, 3, config, build_args=args
    )
    for a, b in zip(weights(straight.task.model), weights(resumed.task.model)):
        np.testing.assert_array_equal(a, b)
    assert [r["step"] for r in log_b] == list(range(1, 7)) and log_a == log_b


def test_lamb_trains_through_the_trainer(data_file):
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    # LAMB moves each layer by about lr * ||w|| per step: a larger rate than Adam's here.
    fit = build(one, helpers.tiny_config(), steps=30, optimizer="lamb", learning_rate=0.1)
    assert isinstance(fit.optimizer, optimization.Lamb)
    one_batch = features.pretraining_dataset([data_file], B, S, P, is_training=False).take(1)
    rows = fit.train_steps(iter(one_batch.repeat()), 30)
    losses = [fit.loss_from_sums(r) for r in rows]
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("where", ["one_device", "mirrored", "xla", "bf16"])
def test_fused_residual_norm_trains_as_the_layers(data_file, where, monkeypatch):
    # layers.residual_layer_norm's XLA kernels inside the real train step (one device, Mirrored
    # over two CPUs, the whole step under XLA, mixed bf16), with dropout on: the same rows and
    # weights as the layers' path, since both draw the same masks from the same seeds. The
    # tiny model is below FUSED_NORM_MIN_SIZE, so the fused trainer is traced with it at 0.
    from modeling import layers

    config = helpers.tiny_config(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.1)

    def make():
        strategy = strategy_for(where)
        precision = "bf16" if where == "bf16" else "fp32"
        return build(strategy, config, use_xla=where == "xla", precision=precision)

    fused, plain = make(), make()
    init = weights(fused.task.model)
    built = []
    kernels = layers._fused_norm_kernels
    monkeypatch.setattr(layers, "_fused_norm_kernels", lambda *a: built.append(a) or kernels(*a))
    monkeypatch.setattr(layers, "FUSED_NORM_MIN_SIZE", 0)
    rows_fused = fused.train_steps(iter(dataset(data_file)), 4)
    assert {a[1] for a in built} == {0.0, 0.2}  # the embeddings' LayerNorm and the blocks'
    monkeypatch.setattr(layers, "FUSED_NORM_MIN_SIZE", 1 << 62)
    built.clear()
    rows_plain = plain.train_steps(iter(dataset(data_file)), 4)
    assert not built
    # bf16: float32 inside the kernels against bf16 sums in the layers, over 4 steps.
    rtol = 2e-2 if where == "bf16" else 1e-5
    np.testing.assert_allclose(rows_fused, rows_plain, rtol=rtol, atol=1e-6)
    moved = False
    for a, b, start in zip(weights(fused.task.model), weights(plain.task.model), init):
        np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=1e-3 if where == "bf16" else 1e-6)
        moved |= not np.allclose(a, start)
    assert moved


@pytest.mark.parametrize("where", ["one_device", "mirrored", "xla", "accumulation"])
def test_clipping_inside_the_update_equals_clipping_the_gradients(data_file, where):
    # The Trainer hands AdamW the unclipped gradients and the clipping factor (apply_scaled);
    # with the fold turned off it clips them first as before. Same rows (grad_norm included)
    # and weights over 4 steps with clipping active (every norm above clip_norm 0.5, checked),
    # on one device, Mirrored over two CPUs, the whole step under XLA, and accumulating.
    def make(fold):
        strategy = strategy_for(where)
        fit = build(
            strategy,
            helpers.TINY,
            use_xla=where == "xla",
            accumulation=2 if where == "accumulation" else 1,
        )
        fit.clip_norm = 0.5
        assert fit._fold_clip
        fit._fold_clip = fold
        return fit

    folded, clipped = make(True), make(False)
    rows = folded.train_steps(iter(dataset(data_file)), 4)
    want = clipped.train_steps(iter(dataset(data_file)), 4)
    norms = rows[:, -len(trainer.EXTRA_COLUMNS)]
    assert (norms > 0.5).all() and (rows[:, -1] == 1.0).all()  # clipped, applied
    np.testing.assert_allclose(rows, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(weights(folded.task.model), weights(clipped.task.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def custom_gradient_names() -> set:
    """The "CustomGradient-N" names in TensorFlow's global gradient registry: one per
    graph-mode call of a tf.custom_gradient function, each holding its traced graph."""
    from tensorflow.python.framework import ops as tf_ops

    return {n for n in tf_ops.gradient_registry.list() if n.startswith("CustomGradient-")}


def traced_graphs(name: str) -> int:
    """How many FuncGraphs called `name` (a tf.function's Python name) are alive."""
    from tensorflow.python.framework import func_graph

    gc.collect()
    return sum(isinstance(o, func_graph.FuncGraph) and o.name == name for o in gc.get_objects())


def train_eval_predict(data_file):
    """A new trainer's train and eval functions and a Predictor's step, each traced once and
    run over two batches."""
    from modeling import finetuning
    from training import finetune_tasks

    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    fit = build(one, helpers.tiny_config())
    fit.train_steps(iter(dataset(data_file)), 2)
    fit.evaluate(dataset(data_file), 2)
    with one.scope():
        classifier = finetuning.BertClassifier(helpers.tiny_config(), 2)
        classifier.build()
    batches = dataset(data_file).take(2)
    assert finetune_tasks.Predictor(one, classifier)(batches).shape == (2 * B, 2)


def test_autograph_rewrites_the_train_loop_and_nothing_under_it(data_file, monkeypatch):
    """AutoGraph converts train_fn (its `for` over tf.range) and none of the step, task, losses
    or FLOP counts under it (Trainer._train_step: seconds at a process' first trace); the eval
    function and a Predictor's step convert nothing. The negative control converts the step as
    before: the record then holds the step's functions, and the rows are the same to the bit."""
    # What AutoGraph converts is seen only through its transpiler (TensorFlow-internal); each
    # conversion passes there, cached or not.
    from tensorflow.python.autograph.pyct import transpiler

    from modeling import finetuning
    from training import finetune_tasks

    converted = []
    transform = transpiler.PyToPy.transform_function

    def record(self, fn, user_context):
        converted.append(getattr(fn, "__qualname__", repr(fn)))
        return transform(self, fn, user_context)

    monkeypatch.setattr(transpiler.PyToPy, "transform_function", record)
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    config = helpers.tiny_config(hidden_dropout_prob=0.1)

    def train_converting(step):
        monkeypatch.setattr(trainer.Trainer, "_train_step", step)
        fit = build(one, config)
        batches = iter(dataset(data_file))  # its map functions are converted here
        converted.clear()
        return fit, fit.train_steps(batches, 2), set(converted)

    as_written = trainer.Trainer._train_step
    fit, rows, during_train = train_converting(as_written)
    assert during_train == {"Trainer.train_steps.<locals>.train_fn"}
    eval_batches = dataset(data_file)
    converted.clear()
    fit.evaluate(eval_batches, 2)
    assert converted == []
    with one.scope():
        classifier = finetuning.BertClassifier(helpers.tiny_config(), 2)
        classifier.build()
    batches = dataset(data_file).take(2)
    converted.clear()
    assert finetune_tasks.Predictor(one, classifier)(batches).shape == (2 * B, 2)
    assert converted == []

    _, rows_converted, during = train_converting(as_written.__wrapped__)
    assert {"Trainer._replica_train_step", "Trainer._loss_and_grads", "Trainer._decide"} <= during
    np.testing.assert_array_equal(rows, rows_converted)


@pytest.mark.parametrize("released", [True, False])
def test_traced_steps_do_not_keep_their_graphs(data_file, released, monkeypatch):
    """The train, eval and predict functions' traces free their graphs once the trainer and the
    model are gone: their custom gradients' registrations (modeling/layers'
    custom_gradients_released) are dropped. The negative control (released=False: the release
    turned off) shows that the traces do register custom gradients, and that those keep every
    traced graph alive. A first round fills the module-level caches of compiled kernels (a
    cached function's first trace holds the graph it was traced in, once per process)."""
    from modeling import layers

    train_eval_predict(data_file)
    if not released:
        monkeypatch.setattr(layers, "custom_gradients_released", contextlib.nullcontext)
    graphs = {name: traced_graphs(name) for name in ("train_fn", "eval_fn", "step")}
    names = custom_gradient_names()
    train_eval_predict(data_file)
    if released:
        assert custom_gradient_names() == names
        assert {name: traced_graphs(name) for name in graphs} == graphs
    else:  # the step, the eval and the predictor each register some (the fused kernels, the
        # losses, the last layer's gathered positions), and each graph stays
        assert len(custom_gradient_names() - names) >= 3
        for name, count in graphs.items():
            assert traced_graphs(name) == count + 1, name
