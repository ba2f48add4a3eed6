"""XLNet's segment recurrence in pretraining: stream batches (row j continues row j), the
SegmentMemory a training step reads and leaves (equal to the model given that memory by hand,
on one device and Mirrored over two CPUs), and run_pretraining --mem_len saving and resuming it.
The model's memory against transformers: tests/test_xlnet_convert.py."""

import dataclasses
import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import lm_data, permutation
from data_prep.errors import InputError
from modeling import xlnet
from tests import helpers
from tests.test_xlnet import TINY, tiny_pretrainer
from training import optimization, plm_tasks
from training.trainer import EXTRA_COLUMNS, Trainer, slice_for_replica

S, P, B, MEM_LEN = 4, 2, 4, 6


def numbered_blocks(tmp_path, count, files=3, length=S):
    """`count` blocks, block n all n, written round-robin over `files` shards (block n in file
    n mod files, as create_lm_data.py writes them)."""
    paths = [str(tmp_path / f"lm-{i:05d}-of-{files:05d}.tfrecord") for i in range(files)]
    lm_data.write_lm_tfrecords([np.full(length, n, np.int32) for n in range(count)], paths)
    return paths


def test_stream_batches_continue_every_row_across_shards_and_epochs(tmp_path):
    """23 blocks over 3 files, 2 shards of 2 rows: 4 streams of 5 consecutive blocks (the last 3
    dropped); shard k's row j at batch t is block (2k + j) x 5 + t, and every stream starts over
    after 5 batches. Fewer blocks than streams are refused, naming the file."""
    files = numbered_blocks(tmp_path, 23)
    assert [int(b[0]) for b in lm_data.corpus_order(files).map(
        lambda r: tf.io.parse_single_example(r, lm_data.lm_feature_spec(S))["input_ids"])
    ] == list(range(23))  # fmt: skip
    for shard in (0, 1):
        batches = lm_data.stream_dataset(files, 2, S, num_shards=2, shard_index=shard).take(7)
        rows = [b["input_ids"].numpy()[:, 0].tolist() for b in batches]
        base = 10 * shard
        want = [[base + t % 5, base + 5 + t % 5] for t in range(7)]
        assert rows == want
    with pytest.raises(InputError, match=r"lm-00000-of-00003.*at least 24 blocks.*found 23"):
        lm_data.stream_dataset(files, 12, S, num_shards=2)


def memory_steps(strategy, weights, batches):
    """Three training-mode passes of the permutation-LM task with a SegmentMemory under
    `strategy` (no update): each step's summed loss, and the memory after each."""
    with strategy.scope():
        model = xlnet.XLNetPretrainer(xlnet.XLNetConfig(**TINY, dropout=0.0, dropatt=0.0))
        model.build()
        model.set_weights(weights)
        memory = plm_tasks.SegmentMemory(model.config, B, MEM_LEN)
        task = plm_tasks.permutation_lm_task(model, memory)

    @tf.function
    def step(batch):
        sums = strategy.run(lambda b: task.sums_fn(b, training=True)["loss_sum"], (batch,))
        return strategy.reduce("sum", sums, axis=None)

    losses, states = [], []
    for batch in batches:
        losses.append(float(step(slice_for_replica(strategy, batch))))
        states.append((memory.states.numpy(), int(memory.filled.numpy())))
    return losses, states


def test_training_steps_read_the_memory_the_step_before_left():
    """S = 4, a memory of 6: the first step reads an empty memory (the same loss as no memory),
    the second the first block's layer inputs (4 slots filled), the third the last 6 of both
    (xlnet.cache_mems), each equal to the model given that memory by hand; Mirrored over two
    CPUs (2 rows a replica, gathered) equals one device. Evaluation reads no memory."""
    model = tiny_pretrainer()
    weights = model.get_weights()
    rng = np.random.default_rng(0)
    batches = [
        permutation.permutation_lm_features(rng.integers(0, 29, (B, S)), [1, t], P)
        for t in range(3)
    ]
    losses, states = memory_steps(tf.distribute.OneDeviceStrategy("/cpu:0"), weights, batches)
    assert [filled for _, filled in states] == [4, 6, 6]
    mems, want = None, []
    for batch in batches:
        inputs = {k: batch[k] for k in plm_tasks.PLM_INPUTS} | ({"mems": mems} if mems else {})
        out = model(inputs)
        sums = plm_tasks.losses.masked_lm_sums(
            out["plm_logits"], batch["target_ids"], batch["target_weights"]
        )
        want.append(float(sums["loss_sum"]))
        mems = xlnet.cache_mems(mems, out["encoder_outputs"], MEM_LEN)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_allclose(states[-1][0], np.stack(mems), atol=1e-6)
    assert abs(losses[1] - float(plm_tasks.losses.masked_lm_sums(
        model({k: batches[1][k] for k in plm_tasks.PLM_INPUTS})["plm_logits"],
        batches[1]["target_ids"], batches[1]["target_weights"])["loss_sum"])) > 1e-3  # fmt: skip
    mirrored, mirrored_states = memory_steps(helpers.mirrored_strategy(), weights, batches)
    np.testing.assert_allclose(mirrored, losses, rtol=1e-5)
    np.testing.assert_allclose(mirrored_states[-1][0], states[-1][0], atol=1e-6)


def trained_with_memory(strategy, weights, files, use_xla=False):
    """Three Trainer steps (AdamW, updates applied) with a SegmentMemory on stream batches of
    `files`: the rows, the weights and the memory after."""
    with strategy.scope():
        model = xlnet.XLNetPretrainer(xlnet.XLNetConfig(**TINY, dropout=0.0, dropatt=0.0))
        model.build()
        model.set_weights(weights)
        task = plm_tasks.permutation_lm_task(
            model, plm_tasks.SegmentMemory(model.config, B, MEM_LEN)
        )
        opt = optimization.create_optimizer(1e-2, 10, 1)
        opt.build(model.trainable_variables)
    fit = Trainer(strategy, task, opt, use_xla=use_xla)
    data = permutation.permutation_lm_dataset(files, B, S, P, True, streams=True)
    rows = fit.train_steps(iter(data), 3)
    return rows, model.get_weights(), task.state[0].numpy()


@pytest.mark.parametrize("where", ["xla", "mirrored"])
def test_trainer_steps_with_memory_equal_one_device(tmp_path, where):
    """Whole training steps with the memory (read, updated, gathered over replicas, updates
    applied): the whole step under XLA, and Mirrored over two CPUs, give the one-device rows,
    weights and memory."""
    files = numbered_blocks(tmp_path, 20)  # 5 streams' worth: each row's blocks continue
    weights = tiny_pretrainer().get_weights()
    one = trained_with_memory(tf.distribute.OneDeviceStrategy("/cpu:0"), weights, files)
    if where == "xla":
        other = trained_with_memory(
            tf.distribute.OneDeviceStrategy("/cpu:0"), weights, files, use_xla=True
        )
    else:
        other = trained_with_memory(helpers.mirrored_strategy(), weights, files)
    # The FLOPs column aside: each replica also computes the per-batch relative-position terms.
    flops_column = len(other[0][0]) - len(EXTRA_COLUMNS) - 1
    keep = np.arange(len(one[0][0])) != flops_column
    np.testing.assert_allclose(other[0][:, keep], one[0][:, keep], rtol=1e-5, atol=1e-6)
    for a, b in zip(other[1], one[1]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(other[2], one[2], atol=1e-5)
    assert np.abs(one[2]).max(axis=-1).all()  # every slot filled after 3 steps of 4


def test_pretraining_with_memory_resumes_where_an_uninterrupted_run_is(tmp_path):
    """run_pretraining --mem_len on stream batches, 4 steps saved every 2; a copy of its folder
    without ckpt-4 (a run killed after step 2's save) resumes to the same losses and memory bit
    for bit (the memory is in the checkpoint: without it step 3 would read an empty one); the
    run settings refuse another --mem_len; --mem_len is refused for BERT and with gradient
    accumulation (as XLNet always is: its task has no denominators_fn)."""
    rng = np.random.default_rng(0)
    data = [str(tmp_path / f"lm-{i:05d}-of-00002.tfrecord") for i in range(2)]
    lm_data.write_lm_tfrecords([rng.integers(5, 29, 8) for _ in range(40)], data)
    config = tmp_path / "xlnet_config.json"
    config.write_text(json.dumps(TINY))
    args = [
        f"--bert_config_file={config}", f"--input_file={tmp_path}/lm-*", "--max_seq_length=8",
        "--max_predictions_per_seq=3", "--train_batch_size=4", "--eval_batch_size=4",
        "--num_warmup_steps=1", "--save_checkpoints_steps=2", "--iterations_per_loop=2",
        "--max_eval_steps=1", "--do_train", "--mem_len=12", "--num_train_steps=4",
    ]  # fmt: skip

    def run(out, *more):
        return helpers.run_main("run_pretraining.py", [*args, f"--output_dir={out}", *more])

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    r = run(whole)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "a memory of 12 (streams)" in r.stderr
    shutil.copytree(whole, parts)
    for path in parts.glob("ckpt-4.*"):
        path.unlink()
    r = run(parts)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {parts / 'ckpt-2'} at step 2" in r.stderr

    def losses(out):
        return [row["plm_loss"] for row in map(json.loads, open(out / "train_log.jsonl"))]

    def memory(out):
        reader = tf.train.load_checkpoint(str(out / "ckpt-4"))
        state, filled = (
            reader.get_tensor(f"task_state/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in (0, 1)
        )
        return state, int(filled)

    assert len(losses(whole)) == 4 and losses(parts) == losses(whole)
    (kept, filled), (want, _) = memory(parts), memory(whole)
    assert kept.shape == (2, 4, 12, 12) and filled == 12 and np.abs(kept).max(axis=-1).all()
    np.testing.assert_array_equal(kept, want)
    r = run(parts, "--mem_len=8")
    assert r.returncode == 1 and "--mem_len was 12 and is now 8" in r.stderr
    r = run(tmp_path / "accumulated", "--gradient_accumulation_steps=2")
    assert r.returncode == 1 and "--gradient_accumulation_steps" in r.stderr
    bert_config = tmp_path / "bert_config.json"
    bert_config.write_text(helpers.tiny_config().to_json_string())
    r = run(tmp_path / "bert", f"--bert_config_file={bert_config}")
    assert r.returncode == 1 and "--mem_len: XLNet's permutation LM only" in r.stderr


@pytest.mark.parametrize("split", ["gradient_accumulation_steps", "parallel_micro_batches"])
def test_a_task_that_carries_state_refuses_split_batches(split):
    """Each part of a split batch would move the memory: the Trainer refuses, even for a task
    that could split its batches (a denominators_fn)."""
    model = tiny_pretrainer()
    task = plm_tasks.permutation_lm_task(model, plm_tasks.SegmentMemory(model.config, B, 3))
    task = dataclasses.replace(task, denominators_fn=lambda batch: {})
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with pytest.raises(ValueError, match="carries state from step to step"):
        Trainer(strategy, task, keras.optimizers.Adam(), **{split: 2})
