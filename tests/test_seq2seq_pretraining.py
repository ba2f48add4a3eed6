"""T5 denoising pre-training: the task's teacher forcing, learning on a repeated batch, and
run_pretraining.py dispatching a T5 config to the encoder-decoder path."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import seq2seq_data
from modeling import flops, t5
from tests import helpers
from tests.conftest import ROOT
from training import seq2seq_tasks

TINY = dict(
    vocab_size=37,
    d_model=12,
    d_kv=4,
    d_ff=17,
    num_layers=2,
    num_heads=3,
    dropout_rate=0.0,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)


def batch(rng, b=3, s=7, t=5, vocab=37):
    ids = rng.integers(2, vocab, (b, s)).astype(np.int32)
    mask = np.ones((b, s), np.int32)
    mask[0, 5:] = 0
    ids[0, 5:] = 0
    targets = rng.integers(2, vocab, (b, t)).astype(np.int32)
    targets[:, -1] = 1
    target_mask = np.ones((b, t), np.int32)
    target_mask[1, 3:] = 0
    targets[1, 2], targets[1, 3:] = 1, 0
    return {"input_ids": ids, "input_mask": mask, "target_ids": targets, "target_mask": target_mask}


def test_is_t5_config_tells_the_families_apart():
    assert t5.is_t5_config(TINY)
    assert not t5.is_t5_config({"n_vocab": 5, "n_ctx": 8})
    assert not t5.is_t5_config({"vocab_size": 5, "hidden_size": 8})
    # XLNet's released config shares d_model with T5's; its n_token (no vocab_size) tells it apart.
    for name in ("xlnet_tiny", "gpt_tiny", "bert_tiny", "elmo_tiny"):
        values = json.loads((ROOT / "configs" / f"{name}.json").read_text())
        assert not t5.is_t5_config(values), name
    assert t5.is_t5_config(json.loads((ROOT / "configs" / "t5_tiny.json").read_text()))


def test_decoder_inputs_are_the_targets_shifted_right():
    targets = np.array([[5, 6, 1], [7, 1, 0]], np.int32)
    got = seq2seq_tasks.decoder_input_ids(tf.constant(targets), 3).numpy()
    np.testing.assert_array_equal(got, t5.shift_right(targets, 3))
    np.testing.assert_array_equal(got, [[3, 5, 6], [3, 7, 1]])


def test_the_task_learns_a_repeated_batch_and_ignores_padded_targets():
    keras.utils.set_random_seed(4)
    model = t5.T5Model(t5.T5Config(**TINY))
    model.build()
    task = seq2seq_tasks.seq2seq_task(model)
    data = {k: tf.constant(v) for k, v in batch(np.random.default_rng(0)).items()}
    sums = task.sums_fn(data, False)
    assert float(sums["weight"]) == 3 * 5 - 2  # row 1 has 3 real targets
    # Changing a padded target changes nothing; changing a real one changes the loss.
    padded = dict(data, target_ids=tf.tensor_scatter_nd_update(data["target_ids"], [[1, 4]], [9]))
    assert float(task.sums_fn(padded, False)["loss_sum"]) == pytest.approx(float(sums["loss_sum"]))
    real = dict(data, target_ids=tf.tensor_scatter_nd_update(data["target_ids"], [[0, 0]], [9]))
    assert float(task.sums_fn(real, False)["loss_sum"]) != pytest.approx(float(sums["loss_sum"]))
    optimizer = keras.optimizers.Adam(1e-2)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            s = task.sums_fn(data, True)
            loss = s["loss_sum"] / s["weight"]
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(step()) for _ in range(25)]
    assert losses[-1] < 0.3 * losses[0], losses
    s = task.sums_fn(data, False)
    assert float(s["correct"]) / float(s["weight"]) > 0.9


BART_TINY = dict(
    vocab_size=37, d_model=12, encoder_layers=2, decoder_layers=2, encoder_attention_heads=3,
    decoder_attention_heads=3, encoder_ffn_dim=17, decoder_ffn_dim=17, max_position_embeddings=9,
    dropout=0.0, pad_token_id=0, bos_token_id=None, eos_token_id=1, decoder_start_token_id=1,
)  # fmt: skip


@pytest.mark.parametrize("family", ["t5", "bart"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_task_runs_under_mixed_precision_close_to_float32(family, precision):
    # run_pretraining's and run_text2text's --precision set these global policies. T5's RMS
    # norm multiplied its bfloat16 input by a float32 scale, which TensorFlow refuses: until the
    # thirty-seventh session a T5 step under mixed_bfloat16 failed at the first norm.
    from modeling import bart

    data = {k: tf.constant(v) for k, v in batch(np.random.default_rng(0)).items()}
    if family == "t5":
        make, values = t5.T5Model, t5.T5Config(**TINY)
    else:
        make, values = bart.BartModel, bart.BartConfig(**BART_TINY)
    keras.utils.set_random_seed(4)
    reference = make(values)
    reference.build()
    expected = seq2seq_tasks.seq2seq_task(reference).sums_fn(data, False)

    def built():
        model = make(values)
        model.build()
        return model

    model = helpers.at_precision(built, reference, precision)
    task = seq2seq_tasks.seq2seq_task(model)
    with tf.GradientTape() as tape:
        sums = task.sums_fn(data, True)
    grads = tape.gradient(sums["loss_sum"], model.trainable_variables)
    assert model.compute_dtype == {"bf16": "bfloat16", "fp16": "float16"}[precision]
    # bfloat16 keeps 8 bits of mantissa, float16 11: the loss within 2% of float32's, not on it.
    loss, want = float(sums["loss_sum"]), float(expected["loss_sum"])
    assert loss == pytest.approx(want, rel=2e-2) and loss != want
    assert all(g is not None for g in grads)
    grads = [tf.convert_to_tensor(g) for g in grads]  # the shared table's: IndexedSlices
    assert all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)
    assert all(g.dtype == tf.float32 for g in grads)  # float32 variables, float32 gradients


def test_run_pretraining_trains_a_t5_config_on_denoising_records(tmp_path):
    rng = np.random.default_rng(1)
    instances = []
    for _ in range(8):
        b = batch(rng, 3, 9, 6)
        for row in range(3):
            instances.append(
                (
                    b["input_ids"][row][b["input_mask"][row] == 1].tolist(),
                    b["target_ids"][row][b["target_mask"][row] == 1].tolist(),
                )
            )
    records = tmp_path / "t5.tfrecord"
    seq2seq_data.write_seq2seq_tfrecords(instances, [str(records)], 9, 6, 0)
    config = tmp_path / "t5.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "out"
    args = [
        f"--bert_config_file={config}",
        f"--input_file={records}", f"--output_dir={out}", "--max_seq_length=9",
        "--train_batch_size=4", "--eval_batch_size=4", "--num_train_steps=6",
        "--num_warmup_steps=1", "--save_checkpoints_steps=3", "--iterations_per_loop=3",
        "--max_eval_steps=6", "--learning_rate=1e-2", "--do_train", "--do_eval",
    ]  # fmt: skip
    r = helpers.run_main("run_pretraining.py", args)
    assert r.returncode == 0, r.stderr[-3000:]
    # The log's FLOP/s: 3 passes of modeling/flops.py's T5 count (9 inputs, 6 targets) an example.
    assert len(helpers.logged_speeds(r.stderr)) == 2, r.stderr[-3000:]  # two calls of 3 steps
    per_example = 3 * flops.t5_flops(t5.T5Config(**TINY), 9, 6)
    helpers.check_logged_flops(r.stderr, per_example, per_example)
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert int(results["global_step"]) == 6
    assert float(results["perplexity"]) == pytest.approx(math.exp(float(results["target_loss"])))
    first = json.loads((out / "eval_log.jsonl").read_text().splitlines()[0])
    assert float(results["target_loss"]) < first["target_loss"]
    assert 0.0 <= float(results["target_accuracy"]) <= 1.0
    bad = [a if not a.startswith("--max_seq_length") else "--max_seq_length=8" for a in args]
    r = helpers.run_main("run_pretraining.py", bad)
    assert r.returncode != 0 and "t5.tfrecord: expected inputs of --max_seq_length=8" in r.stderr
