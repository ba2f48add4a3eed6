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

from bench import pretrain_throughput
from data_prep import features
from modeling import bert
from training import optimization, tasks, trainer


def build(
    config,
    precision="fp32",
    use_xla=False,
    split_xla=False,
    remove_padding=False,
    encoder_branches=1,
    seed=12345,
):
    keras.utils.set_random_seed(seed)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        with optimization.dtype_policy(precision):
            model = bert.BertPretrainer(config)
            model.build()
            bert.set_remove_padding(model, remove_padding)
            bert.set_encoder_branches(model, encoder_branches)
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


# Each setting's build() arguments; --settings picks among them (fp32, the baseline, always runs).
SETTINGS = {
    "fp32": {},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "xla_fused": {"use_xla": True},
    "xla_split": {"split_xla": True},
    "bf16_xla": {"precision": "bf16", "use_xla": True},
    # The records' padding skipped by the encoder's layers (--remove_padding)
    "remove_padding": {"remove_padding": True},
    # The encoder's layers in K row slices (--encoder_branches; fp32 above is one pass, and
    # run_pretraining's default on CPUs is 2: bert.auto_encoder_branches, which 3 and 4 check)
    "branches2": {"encoder_branches": 2},
    "branches3": {"encoder_branches": 3},
    "branches4": {"encoder_branches": 4},
}


def run(config, path: str, names, seq=128, preds=20, batch=32, steps=10, rounds=5) -> dict:
    """The median steps/s of each setting in `names` (fp32 added first when missing) over
    `rounds` round-robin rounds of `steps` steps on the records at `path`, its ratio to fp32's,
    and the records' padding fraction. Raises ValueError for an unknown setting, and
    FloatingPointError when a setting's step gives a non-finite loss."""
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise ValueError(f"speed settings: unknown {unknown}; expected some of {list(SETTINGS)}")
    names = ["fp32", *(n for n in names if n != "fp32")]
    runs = {}
    for name in names:
        fit = build(config, **SETTINGS[name])
        it = iter(features.pretraining_dataset([path], batch, seq, preds, True))
        fit.train_steps(it, steps)  # trace and compile
        runs[name] = (fit, it, [])
    # The sums and throughput columns; EXTRA_COLUMNS' gradient norm is inf on an fp16 overflow,
    # a step loss scaling skips by design.
    sums = slice(0, -len(trainer.EXTRA_COLUMNS))
    for _ in range(rounds):
        for name, (fit, it, times) in runs.items():
            t = time.perf_counter()
            rows = fit.train_steps(it, steps)
            times.append(steps / (time.perf_counter() - t))
            if not np.isfinite(rows[:, sums]).all():
                raise FloatingPointError(f"speed setting {name}: a step's loss is not finite")
    base = statistics.median(runs["fp32"][2])
    result = {
        name: {
            "steps_per_s": round(statistics.median(t), 3),
            "ratio_to_fp32": round(statistics.median(t) / base, 3),
        }
        for name, (_, _, t) in runs.items()
    }
    padding = pretrain_throughput.padding_fraction(path, seq, 20000)["padding_fraction"]
    return result | {"padding_fraction": round(padding, 4)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--preds", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="steps per timed call")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, of SETTINGS")
    args = p.parse_args()
    config = bert.BertConfig.from_json_file(args.config)
    names = [n for n in args.settings.split(",") if n]
    keys = ("seq", "preds", "batch", "steps", "rounds")
    result = run(config, args.input, names, **{k: getattr(args, k) for k in keys})
    result["settings"] = vars(args)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
