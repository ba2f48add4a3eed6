"""Steps/s of run_pretraining's speed settings against fp32, as ratios measured in one process.

Not a test (performance is never asserted); tests/test_trainer.py checks each setting's results
against the plain path. Runs the settings round-robin so load from other processes on a shared
machine hits them alike, and prints the median steps/s of each and its ratio to fp32, plus the
padding fraction of the records (the share of positions that are [PAD]).

  nice -n 10 python -m bench.speed_features \
    --config=default_run/bert_config.json --input=default_run/data/train.tfrecord
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

from data_prep import features
from modeling import bert
from training import optimization, tasks, trainer


def build(
    config, precision="fp32", use_xla=False, split_xla=False, remove_padding=False, seed=12345
):
    keras.utils.set_random_seed(seed)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        with optimization.dtype_policy(precision):
            model = bert.BertPretrainer(config)
            model.build()
            bert.set_remove_padding(model, remove_padding)
        opt = optimization.with_loss_scaling(
            optimization.create_optimizer(1e-4, 10000, 100), precision
        )
        opt.build(model.trainable_variables)
    fit = trainer.Trainer(strategy, tasks.bert_pretraining_task(model), opt, use_xla=use_xla)
    if split_xla:
        # The former layout: the step and the update as two XLA functions, the finiteness cond
        # between them in the plain graph.
        fit._replica_train_step = tf.function(fit._replica_train_step, jit_compile=True)
        fit._replica_apply_step = tf.function(fit._replica_apply_step, jit_compile=True)
    return fit


def padding_fraction(path: str, seq: int, preds: int, limit: int) -> float:
    ds = features.pretraining_dataset([path], 256, seq, preds, is_training=False)
    real = total = 0
    for batch in ds.take(max(1, limit // 256)):
        mask = batch["input_mask"].numpy()
        real, total = real + int(mask.sum()), total + mask.size
    return 1.0 - real / total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--preds", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="steps per timed call")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    config = bert.BertConfig.from_json_file(args.config)
    settings = {
        "fp32": {},
        "bf16": {"precision": "bf16"},
        "fp16": {"precision": "fp16"},
        "xla_fused": {"use_xla": True},
        "xla_split": {"split_xla": True},
        "bf16_xla": {"precision": "bf16", "use_xla": True},
        # The records' padding skipped by the encoder's layers (--remove_padding)
        "remove_padding": {"remove_padding": True},
    }
    runs = {}
    for name, kw in settings.items():
        fit = build(config, **kw)
        it = iter(
            features.pretraining_dataset([args.input], args.batch, args.seq, args.preds, True)
        )
        fit.train_steps(it, args.steps)  # trace and compile
        runs[name] = (fit, it, [])
    for _ in range(args.rounds):
        for fit, it, times in runs.values():
            t = time.perf_counter()
            rows = fit.train_steps(it, args.steps)
            times.append(args.steps / (time.perf_counter() - t))
            assert np.isfinite(rows[:, -1]).all()
    base = statistics.median(runs["fp32"][2])
    result = {
        name: {
            "steps_per_s": round(statistics.median(t), 3),
            "ratio_to_fp32": round(statistics.median(t) / base, 3),
        }
        for name, (_, _, t) in runs.items()
    }
    result["padding_fraction"] = round(padding_fraction(args.input, args.seq, args.preds, 20000), 4)
    result["settings"] = vars(args)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
