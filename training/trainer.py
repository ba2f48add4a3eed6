"""The train and eval loops every entrypoint uses: distributed steps, checkpoints, logs, plots.

A *task* says what a step computes: `sums_fn(batch, training) -> dict of float32 scalars` (sums
and counts over the replica's slice of the batch, see modeling/losses.py), `loss_terms` (pairs of
a numerator and a denominator key, or triples with a weight; the loss is the sum of
weight * numerator / *global* denominator) and `metrics` (name -> (numerator, denominator) key
pairs). Dividing by global totals makes N replicas compute exactly the one-device gradient.

Input: one plain tf.data iterator per worker feeds the global batch, and each replica takes its
slice (experimental_distribute_values_from_function). A plain iterator can be saved in a
checkpoint while a distributed one cannot (tensorflow issue 56372), so a resumed run continues at
the exact input position: no batch is replayed or skipped, under any strategy. Under
MultiWorkerMirroredStrategy every worker saves its own checkpoints (its own iterator's position);
a restart resumes all workers from the newest step they all hold (agreed_checkpoint).

Preemption: a SIGTERM makes the run save the checkpoint at the current step and exit with code
42 (Preempted). Under MultiWorkerMirroredStrategy a SIGTERM to any one worker stops every worker
at the same step: after each compiled call the workers share their "SIGTERM seen" flags in one
collective (distribute.workers_flagged), so all of them save that step and exit 42 together, and
a restart of all resumes there. tf.distribute.experimental.PreemptionCheckpointHandler does the
same agreement through the coordination service, but does not fit here (TF 2.21's
failure_handling.py): (1) it picks its behaviour by probing the Google Cloud metadata server
over HTTP at start-up; on a Google Cloud CPU VM it then handles no signal at all (a warning
only), and on a GCE GPU VM it ignores SIGTERM and polls the metadata server instead, training on
through a one-hour grace period and exiting 143; (2) it restores the manager's latest
checkpoint when built, bypassing agreed_checkpoint, so workers whose newest checkpoints differ
would resume at different steps; (3) it counts calls of single-step functions in a
`checkpointed_runs` variable it adds to the checkpoint, so checkpoints written before would no
longer restore whole; (4) it replaces the process's SIGTERM handler for good.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from modeling import bert, layers
from training import distribute, optimization


@dataclasses.dataclass
class Task:
    """What a train / eval step computes; see the module docstring.

    denominators_fn: optional `(batch) -> dict` of the loss terms' denominator keys computed from
    the batch alone (no model). Gradient accumulation needs it: every micro-batch's loss is
    divided by the whole batch's global denominators, known before the first micro-batch runs.

    flops_fn: optional `(batch) -> float32 scalar`, the matrix-multiply FLOPs one training step
    spends on `batch` (3 forward passes, modeling/flops.py), computed from its shapes so a batch
    cut by dynamic padding counts what it runs. The train log reports FLOP/s from it.

    state: variables outside the model that the task's training steps carry from one step to
    the next (XLNet's segment memory, training/plm_tasks.py); saved in the training checkpoints
    with the model, so a resume continues from them.

    eval_start: optional `() -> None`, run before every evaluation (XLNet: empty the memory its
    eval steps carry from batch to batch).
    """

    model: object
    sums_fn: Callable
    loss_terms: list
    metrics: dict
    denominators_fn: Callable | None = None
    flops_fn: Callable | None = None
    state: list = dataclasses.field(default_factory=list)
    eval_start: Callable | None = None


@dataclasses.dataclass
class TrainSettings:
    """Plain run settings, read from flags by the entrypoint."""

    output_dir: str
    num_train_steps: int
    save_checkpoints_steps: int = 1000
    iterations_per_loop: int = 100
    clip_norm: float = 1.0
    max_checkpoints_to_keep: int = 5
    config_json: str = ""  # the model config, kept in output_dir to refuse mismatched resumes
    # Run settings (JSON object, flag name -> value) besides the model config that shape what a
    # checkpoint holds, e.g. the input pipeline's flags: its saved position restores only into
    # the same pipeline. Kept in output_dir/run_settings.json; a resume with other values is
    # refused naming each changed flag (check_run_settings).
    run_settings_json: str = ""
    # The TFRecord files the training input reads: a DataLossError (TensorFlow names no file)
    # is re-raised as an InputError naming the damaged files and records.
    input_files: tuple[str, ...] = ()
    # A step with a non-finite loss or gradient is never applied (see Trainer); "stop" then ends
    # the run, "skip" goes on and gives up after max_consecutive_nonfinite such steps in a row.
    on_nonfinite: str = "stop"
    max_consecutive_nonfinite: int = 10
    # A SIGTERM is seen only between compiled calls (Python runs signal handlers when the main
    # thread is back in the interpreter), so with slow steps one call of iterations_per_loop
    # steps could outlast a preemption notice (about 30 s on cloud VMs). A single-worker run
    # therefore shortens its calls to about this many seconds, from the last call's step time;
    # which steps a call holds never changes what they compute. Multi-worker runs keep
    # iterations_per_loop: their workers must agree on each call's length.
    max_seconds_per_loop: float = 10.0
    # The hardware's peak FLOP/s at the run's precision (0: unknown). With it the log gives the
    # step's FLOP/s (Task.flops_fn) as a share of the peak, the FLOPs utilisation.
    peak_flops: float = 0.0
    # The panels of output_dir/training_curves.png (plot_training_curves), redrawn after
    # checkpoint saves (_CurveRedraws), so a long run shows its curves so far; () draws none.
    curves: tuple = ()


# The exit code after SIGTERM: the checkpoint at the current step is saved, rerun to continue.
# 42 is what tf.distribute's PreemptionCheckpointHandler exits with, so a scheduler set up for it
# restarts Cloze the same way.
PREEMPTED_EXIT_CODE = 42


class Preempted(SystemExit):
    """Raised by run_training after a SIGTERM, once the checkpoint at the current step is saved.

    A SystemExit with code PREEMPTED_EXIT_CODE, so an entrypoint exits cleanly with that code
    without handling it; a library caller can catch it.
    """

    def __init__(self, step: int, checkpoint: str):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step = step
        self.checkpoint = checkpoint


class _SigtermFlag:
    """Records a SIGTERM instead of dying of it, while the training loop runs.

    Python runs the handler between bytecodes, so a signal that arrives during a compiled loop
    is seen when the loop returns. Only the main thread can install handlers; elsewhere (a run
    started from a worker thread) SIGTERM keeps its default action.
    """

    def __init__(self):
        self.received = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        del signum, frame
        self.received = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def seed_states(model) -> list:
    """The dropout seed-generator states of a Keras 3 model.

    `tf.train.Checkpoint(model=...)` does not hold them (shared/NOTES.md), and without them a
    resumed run draws different dropout masks than an uninterrupted one.
    """
    return [v for v in model.non_trainable_variables if "seed_generator_state" in v.path]


def slice_for_replica(strategy, batch):
    """Splits a worker's batch dict into equal per-replica slices (a distributed value)."""
    local = len(strategy.extended.worker_devices)

    def value_fn(ctx):
        i = ctx.replica_id_in_sync_group % local
        return {k: tf.split(v, local, axis=0)[i] if local > 1 else v for k, v in batch.items()}

    return strategy.experimental_distribute_values_from_function(value_fn)


def _stack_sums(sums: dict, keys: list):
    return tf.stack([tf.cast(sums[k], tf.float32) for k in keys])


# What train_steps returns after the summed metrics: the step's token counts (token_counts) and
# its matrix-multiply FLOPs (Task.flops_fn; 0 where the task has none), summed over the global
# batch, then EXTRA_COLUMNS, one column each, in this order.
THROUGHPUT_COLUMNS = ("tokens", "real_tokens", "flops")
EXTRA_COLUMNS = ("grad_norm", "learning_rate", "loss_scale", "overflow", "applied")
# Loss scaling (fp16) never lowers the scale below this: an overflow at scale 1 is a real
# non-finite gradient, handled as any other (--on_nonfinite).
MIN_LOSS_SCALE = 1.0


def token_counts(batch: dict):
    """float32 (2,): the token positions `batch` holds and how many of them are not padding
    (THROUGHPUT_COLUMNS' first two), for the throughput the train log reports. The elements of
    input_ids, of which input_mask (1 real, 0 padding: the BERT convention every Cloze reader
    and model follows) marks the real ones where the batch has one; plus, in an encoder-decoder
    batch, those of target_ids (target_mask). A batch cut to its longest example (dynamic padding)
    counts the positions it computes; a batch without input_ids counts 0."""
    positions, real = tf.constant(0.0), tf.constant(0.0)
    for ids, mask in (("input_ids", "input_mask"), ("target_ids", "target_mask")):
        if ids in batch:
            n = tf.cast(tf.size(batch[ids]), tf.float32)
            positions += n
            real += tf.reduce_sum(tf.cast(batch[mask], tf.float32)) if mask in batch else n
    return tf.stack([positions, real])


def float_shape(batch: dict, key: str = "input_ids"):
    """float32 (rank,): the shape of batch[key] as the step runs it (a batch cut by dynamic
    padding: its cut length), what every Task.flops_fn counts from."""
    return tf.cast(tf.shape(batch[key]), tf.float32)


def rows_per_sequence(model, batch: dict):
    """float32 scalar, or None: where the encoders inside `model` run with remove_padding, the
    rows their layers' per-position work runs at on `batch` (bert.unpadded_rows of its
    input_mask) per sequence, the `rows` of modeling/flops' encoder counts; None where they run
    on the padded layout (its count is the batch's shape)."""
    rows = bert.unpadded_rows(model, batch.get("input_mask"))  # a model without one reads none
    if rows is None:
        return None
    sequences = tf.reduce_prod(float_shape(batch, "input_mask")[:-1])
    return rows / tf.maximum(sequences, 1.0)


def split_batch(batch: dict, parts: int) -> list[dict]:
    """`batch` (a dict of tensors sharing their first dimension) as `parts` consecutive equal
    slices. Raises ValueError when a static batch size does not split evenly; a dynamic one is
    checked when the step runs."""
    first = next(iter(batch.values()))
    size = first.shape[0]
    if size is not None:
        if size % parts:
            raise ValueError(
                f"a batch of {size} does not split into {parts} parallel micro-batches"
            )
        step = size // parts
    else:
        size = tf.shape(first)[0]
        check = tf.debugging.assert_equal(
            size % parts, 0, message=f"the batch does not split into {parts} parallel micro-batches"
        )
        with tf.control_dependencies([check]):
            step = tf.identity(size // parts)
    return [{k: v[i * step : (i + 1) * step] for k, v in batch.items()} for i in range(parts)]


def _batch_split_count(task: Task, value, name: str, what: str) -> int:
    """A Trainer setting that splits each batch into `value` parts (`name`, described as
    `what` in errors): at least 1, and above 1 only for a task with a denominators_fn (every
    part's loss is divided by the whole batch's denominators, known before any part runs)."""
    count = int(value)
    if count < 1:
        raise ValueError(f"{name} must be >= 1, not {count}")
    if count > 1 and task.denominators_fn is None:
        raise ValueError(
            f"{what}: needs the task's denominators_fn (the loss denominators of a batch "
            "without running the model); this task has none"
        )
    return count


class Trainer:
    """Runs distributed training and evaluation of one Task with one optimizer."""

    def __init__(
        self,
        strategy,
        task: Task,
        optimizer,
        clip_norm: float = 1.0,
        use_xla: bool = False,
        gradient_accumulation_steps: int = 1,
        parallel_micro_batches: int = 1,
    ):
        """Args:
        optimizer: a Keras optimizer, or a keras.optimizers.LossScaleOptimizer around one (fp16,
          see optimization.with_loss_scaling): the loss is multiplied by its dynamic scale, the
          gradients divided by it before clipping, and the inner optimizer applies them; a step
          whose loss is finite but whose scaled gradients overflow halves the scale and is not
          applied (column `overflow`), without counting as a non-finite step.
        use_xla: compile each replica's step (forward, backward, clipping, the finiteness check
          and the conditional update) as one XLA function. Only with one replica: the step's
          cross-replica sums cannot be compiled on CPU/GPU replicas here, so with more
          replicas this is refused. On TPU, XLA is always on.
        gradient_accumulation_steps: N > 1 splits each replica's batch into N micro-batches run
          one after another, summing their gradients, then clips and applies once: the same
          update as the whole batch at once (up to float rounding and dropout masks), in about
          1/N of the activation memory. Needs task.denominators_fn.
        parallel_micro_batches: K > 1 splits each (micro-)batch into K parts whose forward and
          backward passes are independent in the step's graph, their gradients summed: the same
          update up to float rounding and dropout masks, in the same memory. TensorFlow's
          executor interleaves the K passes, filling the cores that one pass leaves idle
          between its dependent ops (single-threaded element-wise kernels, small ops). On 2
          AVX-512 CPU cores, K = 2 made the L4/H256 fp32 pretraining step 1.03-1.07x faster at
          batch 8 and 1.08x at batch 32, BERT-base's 1.01-1.02x; under bf16 the small step
          was 0.99x, under use_xla (L2/H128, batch 32) 0.95x, and K = 4 0.84x (README,
          fourteenth session). The batch must split evenly. Needs task.denominators_fn.
        """
        self.strategy = strategy
        self.task = task
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.loss_scale = (
            optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else None
        )
        self._inner = optimizer.inner_optimizer if self.loss_scale else optimizer
        # An optimizer with apply_scaled (optimization.AdamW) takes the unclipped gradients and
        # the clipping factor, multiplied in inside its update kernels; others get clipped ones.
        self._fold_clip = callable(getattr(self._inner, "apply_scaled", None))
        self.accumulation = _batch_split_count(
            task,
            gradient_accumulation_steps,
            "gradient_accumulation_steps",
            "gradient accumulation",
        )
        self.parallel = _batch_split_count(
            task, parallel_micro_batches, "parallel_micro_batches", "parallel micro-batches"
        )
        if task.state and self.accumulation * self.parallel > 1:
            raise ValueError(
                "gradient accumulation / parallel micro-batches: this task carries state from "
                "step to step (XLNet's segment memory), which each part of a batch would move"
            )
        # (numerator, denominator, weight): a pair is weighted 1.
        self.loss_terms = [
            (t[0], t[1], float(t[2]) if len(t) > 2 else 1.0) for t in task.loss_terms
        ]
        self.sum_keys = sorted(
            {k for pair in task.metrics.values() for k in pair}
            | {k for n, d, _ in self.loss_terms for k in (n, d)}
        )
        self._train_fn = None
        self._eval_fn = None
        self.use_xla = use_xla
        if use_xla and strategy.num_replicas_in_sync > 1:
            raise ValueError(
                "--use_xla needs a single replica (--distribution_strategy=one_device); "
                f"this strategy has {strategy.num_replicas_in_sync}"
            )
        # The whole step in one XLA function, update inside (see train_steps).
        self._fused_step = tf.function(self._replica_fused_step, jit_compile=True, autograph=False)

    # -- one step, in replica context ----------------------------------------------------------
    def _scale(self):
        if self.loss_scale is None:
            return tf.constant(1.0)
        return tf.convert_to_tensor(self.loss_scale.dynamic_scale, tf.float32)

    def _global_denominators(self, batch) -> list:
        """The loss terms' denominators of `batch` summed over replicas, float32."""
        ctx = tf.distribute.get_replica_context()
        dens = self.task.denominators_fn(batch)
        return ctx.all_reduce("sum", [tf.cast(dens[d], tf.float32) for _, d, _ in self.loss_terms])

    def _loss_and_grads(self, batch, dens, scale):
        """Forward and backward over `batch`, as one pass or as self.parallel independent ones
        (see __init__) under one tape, whose gradient sums the parts' contributions to each
        variable. `dens`: the loss terms' global denominators, or None to all-reduce this
        batch's. Returns (the stacked sums and throughput counts, loss, unscaled gradients)."""
        variables = self.task.model.trainable_variables
        parts = [batch]
        if self.parallel > 1:
            parts = split_batch(batch, self.parallel)
            if dens is None:
                dens = self._global_denominators(batch)
        with tf.GradientTape() as tape:
            all_sums, losses = [], []
            for part in parts:
                sums = self.task.sums_fn(part, training=True)
                if dens is None:
                    ctx = tf.distribute.get_replica_context()
                    dens = ctx.all_reduce("sum", [sums[d] for _, d, _ in self.loss_terms])
                terms = [
                    sums[n] / tf.maximum(d, 1.0) for (n, _, _), d in zip(self.loss_terms, dens)
                ]
                losses.append(
                    tf.add_n(
                        [t if w == 1.0 else w * t for t, (_, _, w) in zip(terms, self.loss_terms)]
                    )
                )
                all_sums.append(
                    tf.concat([_stack_sums(sums, self.sum_keys), self._throughput_counts(part)], 0)
                )
            loss = losses[0] if len(losses) == 1 else tf.add_n(losses)
            scaled = loss if self.loss_scale is None else loss * scale
        grads = tape.gradient(scaled, variables)
        # A variable the loss does not reach (a pooler under mean pooling) has no gradient; a
        # zero keeps clipping and the optimizer's update well defined. Embedding gradients come
        # as IndexedSlices holding a row once per occurrence in the batch: made dense (summing
        # repeats) so the global norm is the true one (the original's tf.clip_by_global_norm
        # over the slices counts a repeated token's row several times, inflating the norm) and
        # so micro-batch gradients add up. Keras' Adam densifies them in its update anyway.
        grads = [
            tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, variables)
        ]
        if self.loss_scale is not None:
            grads = [g / scale for g in grads]
        sums = all_sums[0] if len(all_sums) == 1 else tf.add_n(all_sums)
        return sums, loss, grads

    def _throughput_counts(self, batch):
        """float32 (3,): THROUGHPUT_COLUMNS of `batch` (token_counts, then Task.flops_fn)."""
        flops = tf.constant(0.0) if self.task.flops_fn is None else self.task.flops_fn(batch)
        return tf.concat([token_counts(batch), [tf.cast(flops, tf.float32)]], 0)

    def _accumulate(self, batch, scale):
        """_loss_and_grads over `self.accumulation` micro-batches of `batch`, summed."""
        n = self.accumulation
        dens = self._global_denominators(batch)
        size = tf.shape(next(iter(batch.values())))[0]
        tf.debugging.assert_equal(
            size % n, 0, message=f"the batch does not split into {n} micro-batches"
        )
        micro = size // n

        def body(i, sums, loss, grads):
            part = {k: v[i * micro : (i + 1) * micro] for k, v in batch.items()}
            part_sums, part_loss, part_grads = self._loss_and_grads(part, dens, scale)
            summed = [a + b for a, b in zip(grads, part_grads)]
            return i + 1, sums + part_sums, loss + part_loss, summed

        variables = self.task.model.trainable_variables
        zeros = (
            tf.zeros([len(self.sum_keys) + len(THROUGHPUT_COLUMNS)]),
            tf.constant(0.0),
            [tf.zeros_like(v) for v in variables],
        )
        _, sums, loss, grads = tf.while_loop(
            lambda i, *_: i < n, body, (tf.constant(0), *zeros), parallel_iterations=1
        )
        return sums, loss, grads

    def _replica_train_step(self, batch):
        ctx = tf.distribute.get_replica_context()
        scale = self._scale()
        if self.accumulation == 1:
            sums, loss, grads = self._loss_and_grads(batch, None, scale)
        else:
            sums, loss, grads = self._accumulate(batch, scale)
        # Sum over replicas here, once: clipping must see the global gradient (the optimizer's
        # own all-reduce is off, see training/optimization.py).
        # The loss rides along so every replica sees the same global loss for the check below.
        *grads, global_loss = ctx.all_reduce("sum", [*grads, loss])
        if self._fold_clip:  # clipped inside the update (_replica_apply_step)
            norm = tf.linalg.global_norm(grads)
        else:
            grads, norm = optimization.clip_by_global_norm(grads, self.clip_norm)
        lr = tf.cast(self._inner.learning_rate, tf.float32)  # the rate this step applies
        # Checked before the update, on global values, so every replica decides alike.
        loss_ok = tf.cast(tf.math.is_finite(global_loss), tf.float32)
        grads_ok = tf.cast(tf.math.is_finite(norm), tf.float32)
        # Every replica holds the same values; the caller sums over replicas.
        extra = tf.stack([norm, lr, scale, loss_ok, grads_ok]) / tf.cast(
            self.strategy.num_replicas_in_sync, tf.float32
        )
        return sums, extra, grads

    def _clip_scale(self, extra):
        """The clipping factor from a step's EXTRA_COLUMNS (their global gradient norm) where the
        optimizer folds it into its update, else None (the gradients are clipped already)."""
        if not self._fold_clip:
            return None
        return optimization.clip_scale(extra[0], self.clip_norm)

    def _replica_apply_step(self, grads, clip_scale=None):
        variables = self.task.model.trainable_variables
        if clip_scale is None:
            self._inner.apply(grads, variables)
        else:
            self._inner.apply_scaled(grads, variables, clip_scale)

    def _decide(self, extra, apply_fn):
        """Applies the step (apply_fn) when its loss and gradient are finite; on a loss-scale
        overflow lowers the scale instead. Returns the 5 EXTRA_COLUMNS values."""
        norm, lr, scale, loss_ok, grads_ok = tf.unstack(extra)
        applied = (loss_ok > 0.5) & (grads_ok > 0.5)
        overflow = tf.constant(False)
        if self.loss_scale is None:
            tf.cond(applied, lambda: apply_fn() or tf.no_op(), tf.no_op)
        else:
            # Keras' LossScaleOptimizer's rule (halve on overflow, double after
            # dynamic_growth_steps finite steps), on its own variables, decided here since the
            # gradients were unscaled and clipped before the update.
            lso = self.loss_scale
            overflow = (loss_ok > 0.5) & (grads_ok < 0.5) & (scale > MIN_LOSS_SCALE)

            def grow():
                apply_fn()
                count = lso.step_counter + 1
                full = count >= lso.dynamic_growth_steps
                lso.step_counter.assign(tf.where(full, tf.zeros_like(count), count))
                lso.dynamic_scale.assign(tf.where(full, scale * 2.0, scale))
                return tf.no_op()

            def shrink():
                lso.step_counter.assign(0)
                lso.dynamic_scale.assign(tf.maximum(scale * 0.5, MIN_LOSS_SCALE))
                return tf.no_op()

            tf.cond(applied, grow, lambda: tf.cond(overflow, shrink, tf.no_op))
        return tf.stack(
            [norm, lr, scale, tf.cast(overflow, tf.float32), tf.cast(applied, tf.float32)]
        )

    def _replica_fused_step(self, batch):
        """Step, check and update in one function (one replica: the update's cond is then
        allowed in replica context)."""
        sums, extra, grads = self._replica_train_step(batch)
        clip_scale = self._clip_scale(extra)
        return sums, self._decide(extra, lambda: self._replica_apply_step(grads, clip_scale))

    def _replica_eval_step(self, batch):
        return _stack_sums(self.task.sums_fn(batch, training=False), self.sum_keys)

    @tf.autograph.experimental.do_not_convert
    def _train_step(self, iterator):
        """One step of train_fn's loop on the next global batch: its row (train_steps).

        Left alone by AutoGraph, and so is everything it calls. A tf.function rewrites the Python
        it traces with AutoGraph: every function reached from it (here the step, the task's
        sums_fn, the losses, the FLOP counts) is parsed, transformed and recompiled at its first
        call in a process, and each call in the rewritten code goes through AutoGraph's
        converted_call. The one thing the train loop asks of AutoGraph is train_fn's
        `for i in tf.range(n)`; the step uses tf.cond and tf.while_loop explicitly, and the
        models are keras.ops code that also runs under JAX, where nothing rewrites Python.
        Measured in fresh processes (the tiny pretraining model, one device, 2 slow AVX2 cores,
        35th session): the first train_steps call took 6.9, 6.4, 7.3 and 5.7 s with the step
        converted and 3.9, 4.1, 3.1 and 4.6 s without, alternating, the same rows to the bit; a
        second model's first call in the same process ~3 s either way (conversions are cached
        per process). Code under it that needed AutoGraph would fail when traced (a tensor used
        as a Python bool), not silently.
        """
        dist = slice_for_replica(self.strategy, next(iterator))
        # A non-finite step is skipped whole: no variable or Adam moment changes and the
        # optimizer's iteration (hence the learning-rate schedule) stays; the input and the
        # dropout seeds have moved on. Zeroing the gradient would not do: Adam's moments and
        # weight decay would still move.
        if self.use_xla:
            sums, extra = self.strategy.run(self._fused_step, args=(dist,))
            extra = self.strategy.reduce("sum", extra, axis=None)
        else:
            sums, extra, grads = self.strategy.run(self._replica_train_step, args=(dist,))
            extra = self.strategy.reduce("sum", extra, axis=None)
            # One clipping factor from the global norm, for every replica.
            clip_scale = self._clip_scale(extra)
            # The cond sits outside the replica function since MirroredStrategy refuses the
            # optimizer's merge_call inside control flow there.
            extra = self._decide(
                extra,
                lambda: self.strategy.run(self._replica_apply_step, args=(grads, clip_scale)),
            )
        return tf.concat([self.strategy.reduce("sum", sums, axis=None), extra], 0)

    # -- compiled loops ------------------------------------------------------------------------
    def train_steps(self, iterator, num_steps: int) -> np.ndarray:
        """Runs `num_steps` steps in one tf.function call (no Python between steps).

        Returns a float64 array (num_steps, len(sum_keys) + 8): the per-step metric sums over the
        global batch, its THROUGHPUT_COLUMNS (token_counts: token positions, and those not
        padding; the task's matrix-multiply FLOPs, 0 without a flops_fn), then EXTRA_COLUMNS:
        the global gradient norm before clipping, the learning rate, the loss scale the step used
        (1 without loss scaling), 1.0 where a loss-scale overflow lowered the scale, and 1.0
        where the update was applied or 0.0 where it was skipped (a non-finite loss or gradient,
        or an overflow).
        """
        if self._train_fn is None:

            @tf.function
            def train_fn(iterator, n):
                out = tf.TensorArray(tf.float32, size=n)
                for i in tf.range(n):  # AutoGraph's one job in the step: a tf.while_loop
                    out = out.write(i, self._train_step(iterator))
                return out.stack()

            self._train_fn = train_fn
        with layers.custom_gradients_released():  # a trace's graph is not kept for good
            rows = self._train_fn(iterator, tf.constant(num_steps))
        return rows.numpy().astype(np.float64)

    def evaluate(self, dataset, max_steps: int) -> dict:
        """Runs up to `max_steps` eval batches (all, if the dataset ends first) and returns the
        task's metrics computed over the whole evaluated set."""
        if self._eval_fn is None:

            @tf.function(autograph=False)  # nothing to convert: see _train_step
            def eval_fn(batch):
                dist = slice_for_replica(self.strategy, batch)
                sums = self.strategy.run(self._replica_eval_step, args=(dist,))
                return self.strategy.reduce("sum", sums, axis=None)

            self._eval_fn = eval_fn
        total = np.zeros(len(self.sum_keys))
        steps = 0
        if self.task.eval_start is not None:
            self.task.eval_start()
        # Once around the loop, not per batch: only a call that traces registers anything.
        with layers.custom_gradients_released():  # the losses' custom gradients
            for batch in dataset.take(max_steps):
                total += self._eval_fn(batch).numpy()
                steps += 1
        if steps == 0:
            raise ValueError(
                "evaluation saw no batch: the eval input holds fewer examples than one batch"
            )
        return self.metrics_from_sums(total) | {"eval_steps": steps}

    def throughput_from_row(self, row) -> dict:
        """A row of train_steps' THROUGHPUT_COLUMNS as a dict: the step's token positions, those
        not padding and its matrix-multiply FLOPs, over the global batch."""
        k = len(self.sum_keys)
        values = [float(x) for x in row[k : k + len(THROUGHPUT_COLUMNS)]]
        return dict(zip(THROUGHPUT_COLUMNS, values))

    def metrics_from_sums(self, sums) -> dict:
        """The task's metrics from summed values (a row of train_steps: its leading sums)."""
        s = dict(zip(self.sum_keys, [float(x) for x in sums[: len(self.sum_keys)]]))
        return {name: s[n] / max(s[d], 1e-12) for name, (n, d) in self.task.metrics.items()}

    def loss_from_sums(self, sums) -> float:
        """The loss the step minimised, from one row of summed metrics (train_steps)."""
        s = dict(zip(self.sum_keys, [float(x) for x in sums[: len(self.sum_keys)]]))
        return sum(w * s[n] / max(s[d], 1.0) for n, d, w in self.loss_terms)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def clean_temp_checkpoints(output_dir: str) -> list[str]:
    """Removes the `*_temp*` folders a checkpoint save killed mid-write leaves behind."""
    removed = []
    if not os.path.isdir(output_dir):
        return removed
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if "_temp" in name and name.startswith("ckpt") and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def check_output_dir_config(output_dir: str, config_json: str) -> None:
    """Refuses to resume in an output_dir whose checkpoint belongs to another model config;
    writes the config there on first use (atomically). A config left by a run that failed before
    its first checkpoint describes no checkpoint: it is replaced, not held against a rerun."""
    path = os.path.join(output_dir, "model_config.json")
    if os.path.exists(path) and tf.train.latest_checkpoint(output_dir):
        old = json.loads(Path(path).read_text())
        new = json.loads(config_json)
        if old != new:
            diff = {
                k: (old.get(k), new.get(k)) for k in set(old) | set(new) if old.get(k) != new.get(k)
            }
            raise ValueError(
                f"{output_dir} holds a checkpoint of a different model config (field: (in "
                f"output_dir, given) = {diff}); use another --output_dir or the same config"
            )
        return
    os.makedirs(output_dir, exist_ok=True)
    _write_atomically(path, config_json)


RUN_SETTINGS_FILE = "run_settings.json"


def check_run_settings(output_dir: str, settings_json: str) -> None:
    """Refuses to resume when a setting recorded in output_dir/run_settings.json (by the run
    that wrote its checkpoints) differs from `settings_json`, naming each change and what to
    do. Settings not recorded there are not compared (a folder from before they were kept)."""
    path = os.path.join(output_dir, RUN_SETTINGS_FILE)
    if not os.path.exists(path):
        return
    old, new = json.loads(Path(path).read_text()), json.loads(settings_json)
    changed = {k: (old[k], new[k]) for k in sorted(set(old) & set(new)) if old[k] != new[k]}
    if changed:
        what = ", ".join(f"--{k} was {a!r} and is now {b!r}" for k, (a, b) in changed.items())
        back = " ".join(f"--{k}={a}" for k, (a, _) in changed.items())
        raise ValueError(
            f"{output_dir}: {what} since its checkpoints were written; they hold that run's "
            "input position and model, which do not restore into this one. Rerun with "
            f"{back} to resume, or give a new --output_dir to start over with the new settings"
        )


def _write_atomically(path: str, text: str) -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


def restore_for_resume(ckpt, prefix: str) -> None:
    """Restores a run's checkpoint (model, optimizer, step, input position, dropout seeds).

    A checkpoint written by a run with another input pipeline or other model parts (a flag such
    as --skip_corrupt_records or --span_boundary_objective toggled in the same output_dir) fails
    in TensorFlow with a message about iterators or unmatched objects; this raises ValueError
    saying which part did not fit and what to do.
    """
    try:
        ckpt.restore(prefix).assert_existing_objects_matched()
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as e:
        if "iterator" not in e.message.lower():
            raise
        part = "its saved input position belongs to another input pipeline"
        detail = e.message.split(".")[0][:300]
    except AssertionError as e:
        part = "this run's model has parts the checkpoint lacks"
        detail = str(e)[:300]
    else:
        return
    raise ValueError(
        f"{prefix}: this run cannot resume from that checkpoint: {part} (a flag that changes the "
        "input pipeline or the model, such as --skip_corrupt_records, --masking or "
        "--span_boundary_objective, differs from the run that wrote it). Rerun with that run's "
        f"flags to resume, or give a new --output_dir. TensorFlow said: {detail}"
    ) from None


def held_checkpoint_steps(manager) -> list[int]:
    """The steps of the manager's checkpoints (its latest included, which a pointer file
    written without timestamps lists alone) whose files exist, oldest first."""
    paths = {*manager.checkpoints, manager.latest_checkpoint} - {None}
    return sorted(
        int(path.rsplit("-", 1)[1]) for path in paths if tf.io.gfile.exists(path + ".index")
    )


def common_checkpoint_step(held: dict[int, list[int]]) -> int | None:
    """The newest checkpoint step every worker holds (held: worker index -> its steps), or None
    when no worker holds any. Raises ValueError naming each worker's newest step when some
    worker holds checkpoints and the workers share none: resuming them at different steps
    would train from a mix of two states."""
    if not any(held.values()):
        return None
    common = set.intersection(*(set(steps) for steps in held.values()))
    if common:
        return max(common)
    newest = ", ".join(
        f"worker {w}: {f'ckpt-{max(steps)}' if steps else 'no checkpoint'}"
        for w, steps in sorted(held.items())
    )
    raise ValueError(
        f"the workers hold no common checkpoint to resume from ({newest}; each worker's "
        "checkpoints in its --output_dir). Restore the missing checkpoint files, or clear every "
        "worker's --output_dir to start over"
    )


def agreed_checkpoint(strategy, manager) -> str | None:
    """The checkpoint to resume from: the newest one held (files present) by this worker and,
    under MultiWorkerMirroredStrategy, by every other worker too, agreed by a collective.

    A kill between two workers' saves of step N leaves one worker with ckpt-N and the other
    with an older one; both then resume from the newest step they share (common_checkpoint_step,
    which fails naming the steps when there is none) instead of at different steps.
    """
    mine = held_checkpoint_steps(manager)
    held = distribute.gather_from_workers(strategy, mine)
    step = common_checkpoint_step(held)
    if step is None:
        return None
    if any(steps and max(steps) != step for steps in held.values()):
        newest = ", ".join(f"worker {w}: ckpt-{max(s)}" for w, s in sorted(held.items()))
        logging.warning(
            "the workers' newest checkpoints differ (%s), as after a kill between their saves: "
            "every worker resumes from ckpt-%d, the newest one they all hold",
            newest,
            step,
        )
    return os.path.join(manager.directory, f"ckpt-{step}")


def weights_are_finite(variables) -> bool:
    return all(
        bool(tf.reduce_all(tf.math.is_finite(v))) for v in variables if "float" in str(v.dtype)
    )


# ---------------------------------------------------------------------------------------------
# Logs and plots
# ---------------------------------------------------------------------------------------------


def _throughput(trainer: Trainer, rows, steps_per_second: float, peak_flops: float = 0.0) -> dict:
    """Throughput of one compiled call's `rows` (train_steps) at `steps_per_second` (the log's
    smoothed examples/s over the global batch): tokens_per_second (positions computed) and
    real_tokens_per_second (those not padding) where the batches hold input_ids;
    flops_per_second where the task counts its FLOPs, and flops_utilization (of peak_flops)
    where that is given too. Empty where there is nothing to count."""
    counts = [trainer.throughput_from_row(r) for r in rows]
    per_step = {k: sum(c[k] for c in counts) / len(counts) for k in THROUGHPUT_COLUMNS}
    out = {}
    if per_step["tokens"] > 0:
        out["tokens_per_second"] = per_step["tokens"] * steps_per_second
        out["real_tokens_per_second"] = per_step["real_tokens"] * steps_per_second
    if per_step["flops"] > 0:
        out["flops_per_second"] = per_step["flops"] * steps_per_second
        if peak_flops > 0:
            out["flops_utilization"] = out["flops_per_second"] / peak_flops
    return out


def _fmt_flops(flops_per_second: float) -> str:
    """'41.2 GFLOP/s': three significant figures in the largest unit at or below the figure."""
    value, prefix = flops_per_second, ""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if flops_per_second >= scale:
            value, prefix = flops_per_second / scale, unit
            break
    decimals = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{decimals}f} {prefix}FLOP/s"


def _fmt_throughput(throughput: dict) -> str:
    """The log line's throughput part: ' | 3,210 tokens/s (2,890 not padding, 90%)', then
    ' | 41.2 GFLOP/s' where the FLOPs are counted, with ' (38% of the peak)' where the peak
    is known; '' where nothing is counted."""
    line = ""
    if "tokens_per_second" in throughput:
        total, real = throughput["tokens_per_second"], throughput["real_tokens_per_second"]
        line += f" | {total:,.0f} tokens/s ({real:,.0f} not padding, {100 * real / total:.0f}%)"
    if "flops_per_second" in throughput:
        line += f" | {_fmt_flops(throughput['flops_per_second'])}"
        if "flops_utilization" in throughput:
            line += f" ({100 * throughput['flops_utilization']:.0f}% of the peak)"
    return line


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _truncate_jsonl(path: str, max_step: int) -> None:
    """Drops log lines past the restored step: those steps are trained again after a resume."""
    if not os.path.exists(path):
        return
    keep = [
        line
        for line in Path(path).read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= max_step
    ]
    _write_atomically(path, "".join(line + "\n" for line in keep))


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def curve_series(train: list[dict], evals: list[dict], panel) -> dict:
    """One panel's lines from train_log.jsonl's and eval_log.jsonl's rows.

    panel: a key both logs may hold (e.g. "masked_lm_accuracy"), or a (training key, held-out key)
    pair where they name one quantity differently (run_ner's training "tagging_loss" is the dev
    "loss"). Returns the parts that have values: "train" (steps, values) of the rows holding a
    finite value of the training key, "smooth" (steps, means) their moving average over
    "window" rows (~5% of them; the steps where each window ends), and "heldout" (steps,
    values) from the held-out rows.
    """
    train_key, heldout_key = (panel, panel) if isinstance(panel, str) else panel
    out = {}
    # Not a skipped step's non-finite value: it would spread over every later running mean.
    rows = [(r["step"], r[train_key]) for r in train if math.isfinite(r.get(train_key, math.nan))]
    if rows:
        steps, values = (np.array(x) for x in zip(*rows))
        window = max(1, len(rows) // 20)
        # Running sums, O(rows) (np.convolve is O(rows x window): minutes at a million rows).
        sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
        means = (sums[window:] - sums[:-window]) / window
        out |= {"train": (steps, values), "smooth": (steps[window - 1 :], means), "window": window}
    points = [(r["step"], r[heldout_key]) for r in evals if heldout_key in r]
    if points:
        out["heldout"] = tuple(np.array(x) for x in zip(*points))
    return out


# The most points drawn of one line: a million-step log is drawn at every k-th row.
CURVE_POINTS = 2000


def _thinned(steps, values):
    """Every k-th point and the last, at most about CURVE_POINTS (drawing a million points
    took most of a 35 s redraw)."""
    k = -(-len(steps) // CURVE_POINTS)
    keep = np.unique(np.r_[np.arange(0, len(steps), k), len(steps) - 1])
    return steps[keep], values[keep]


def panel_title(panel) -> str:
    """'loss', or 'tagging_loss / held-out loss' for a pair of keys."""
    return panel if isinstance(panel, str) else f"{panel[0]} / held-out {panel[1]}"


def plot_training_curves(output_dir: str, *panels) -> str:
    """Writes training_curves.png, one panel per entry of `panels` (see curve_series): the
    training values against step with their moving average, and the held-out values; logs the
    path and the panels, and warns of a panel neither log holds. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = read_jsonl(os.path.join(output_dir, "train_log.jsonl"))
    evals = read_jsonl(os.path.join(output_dir, "eval_log.jsonl"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        series = curve_series(train, evals, panel)
        if "train" in series:
            ax.plot(*_thinned(*series["train"]), color="tab:blue", alpha=0.2, lw=0.8)
            label = f"train ({series['window']}-step mean)"
            ax.plot(*_thinned(*series["smooth"]), color="tab:blue", label=label)
        if "heldout" in series:
            ax.plot(*series["heldout"], "o-", color="tab:orange", label="held-out")
        ax.set_xlabel("step")
        ax.set_title(panel_title(panel))
        ax.grid(alpha=0.3)
        if series:
            ax.legend()
        else:
            logging.warning("training curves: no values logged for %s", panel_title(panel))
    fig.tight_layout()
    path = os.path.join(output_dir, "training_curves.png")
    fig.savefig(path + ".tmp", dpi=100, format="png")  # whole or not at all, for a viewer
    plt.close(fig)
    os.replace(path + ".tmp", path)
    logging.info("training curves: %s (%s)", path, ", ".join(map(panel_title, panels)))
    return path


# ---------------------------------------------------------------------------------------------
# The training run
# ---------------------------------------------------------------------------------------------


def run_training(
    trainer: Trainer,
    train_dataset_fn: Callable[[], tf.data.Dataset],
    settings: TrainSettings,
    global_batch_size: int,
    eval_fn: Callable[[], dict] | None = None,
    init_fn: Callable[[], None] | None = None,
) -> dict:
    """Trains to `settings.num_train_steps`, resuming from output_dir's latest checkpoint.

    Args:
      trainer: the Trainer (model and optimizer already built under the strategy's scope).
      train_dataset_fn: builds this worker's training dataset of global (per-worker) batches.
      settings: run settings.
      global_batch_size: examples per step over all replicas (for examples/s).
      eval_fn: optional; called on a fresh start (step 0) and after every checkpoint save, returns
        metrics that go to eval_log.jsonl and TensorBoard.
      init_fn: optional; called once on a fresh start (no checkpoint in output_dir) to load
        initial weights (--init_checkpoint).
    Returns the last logged training metrics.
    """
    out = settings.output_dir
    os.makedirs(out, exist_ok=True)
    for path in clean_temp_checkpoints(out):
        logging.warning("removed a checkpoint folder left half-written by a killed save: %s", path)
    if settings.config_json:
        check_output_dir_config(out, settings.config_json)

    strategy = trainer.strategy
    model = trainer.task.model
    with strategy.scope():
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    dataset = train_dataset_fn()
    iterator = iter(dataset)
    ckpt = tf.train.Checkpoint(
        model=model,
        optimizer=trainer.optimizer,
        global_step=step_var,
        iterator=iterator,
        seed_states=seed_states(model),
        **({"task_state": trainer.task.state} if trainer.task.state else {}),
    )
    manager = tf.train.CheckpointManager(
        ckpt, out, max_to_keep=settings.max_checkpoints_to_keep, checkpoint_name="ckpt"
    )
    train_log = os.path.join(out, "train_log.jsonl")
    eval_log = os.path.join(out, "eval_log.jsonl")
    # int(step_var.numpy()), not int(step_var): under MultiWorkerMirroredStrategy the step is a
    # MirroredVariable, which int() refuses (TypeError).
    resume = agreed_checkpoint(strategy, manager)
    if resume and settings.run_settings_json:
        check_run_settings(out, settings.run_settings_json)
    if resume:
        restore_for_resume(ckpt, resume)
        logging.info("resumed from %s at step %d", resume, int(step_var.numpy()))
        _truncate_jsonl(train_log, int(step_var.numpy()))
        _truncate_jsonl(eval_log, int(step_var.numpy()))
    else:
        for stale in (train_log, eval_log):
            if os.path.exists(stale):
                os.remove(stale)
        if init_fn:
            init_fn()
        if eval_fn:
            _log_eval(eval_fn, 0, eval_log, out)
    if settings.run_settings_json:  # they fit the checkpoint restored, or start the folder
        _write_atomically(os.path.join(out, RUN_SETTINGS_FILE), settings.run_settings_json)

    if settings.on_nonfinite not in ("stop", "skip"):
        raise ValueError(f"on_nonfinite must be 'stop' or 'skip', not {settings.on_nonfinite!r}")
    writer = tf.summary.create_file_writer(os.path.join(out, "train"))
    metric_names = list(trainer.task.metrics)
    rate, loops = 0.0, 0  # examples/s: a moving average over loops, seeded by the second loop
    last: dict = {}
    # Skipped (non-finite) steps so far, counted from the log so a resumed run keeps the total.
    skipped = sum(1 for r in read_jsonl(train_log) if r.get("skipped"))
    in_a_row = 0
    single_worker = distribute.num_workers(trainer.strategy) == 1
    seconds_per_step = None  # of the last call (its first includes tracing: an overestimate)
    # Multi-worker: the workers a SIGTERM reached, as every worker agreed after the last call.
    # A worker that stopped on its own flag alone would leave the others failing mid-collective.
    sigterm_on: list[int] = []
    curves = _CurveRedraws(out, settings.curves)
    with _SigtermFlag() as sigterm:
        while True:
            if sigterm.received if single_worker else sigterm_on:
                _exit_preempted(manager, model, int(step_var.numpy()), sigterm_on)
            if int(step_var.numpy()) >= settings.num_train_steps:
                break
            t_loop = time.time()
            step = int(step_var.numpy())
            to_save = settings.save_checkpoints_steps - step % settings.save_checkpoints_steps
            n = min(settings.iterations_per_loop, to_save, settings.num_train_steps - step)
            if seconds_per_step and single_worker:
                n = max(1, min(n, int(settings.max_seconds_per_loop / seconds_per_step)))
            try:
                rows = trainer.train_steps(iterator, n)
            except tf.errors.DataLossError as e:
                named = _damaged_input(settings.input_files, e)
                if named is None:
                    raise
                raise named from None
            records = []
            for i, row in enumerate(rows):
                metrics = trainer.metrics_from_sums(row)
                rec = {"step": step + i + 1, "loss": trainer.loss_from_sums(row), **metrics}
                extra = dict(zip(EXTRA_COLUMNS, row[-len(EXTRA_COLUMNS) :].tolist()))
                rec |= {"grad_norm": extra["grad_norm"], "learning_rate": extra["learning_rate"]}
                if trainer.loss_scale is not None:
                    rec["loss_scale"] = extra["loss_scale"]
                records.append(rec)
                if extra["applied"] > 0.5:
                    in_a_row = 0
                    continue
                if extra["overflow"] > 0.5:
                    # fp16 loss scaling: the scaled gradient overflowed; the scale was halved and
                    # the step not applied. Expected now and then, not a non-finite failure.
                    rec["overflow"] = True
                    logging.info(
                        "step %d: loss-scale overflow at scale %g; lowered to %g, not applied",
                        rec["step"],
                        extra["loss_scale"],
                        max(extra["loss_scale"] / 2, MIN_LOSS_SCALE),
                    )
                    continue
                rec["skipped"] = True
                skipped += 1
                in_a_row += 1
                logging.warning(
                    "step %d: non-finite loss %s or gradient norm %s; the update was not applied "
                    "(%d in a row, %d skipped in this run)",
                    rec["step"],
                    rec["loss"],
                    rec["grad_norm"],
                    in_a_row,
                    skipped,
                )
                stop = settings.on_nonfinite == "stop"
                if stop or in_a_row >= settings.max_consecutive_nonfinite:
                    _append_jsonl(train_log, records)  # up to the bad step, for the post-mortem
                    why = (
                        "with --on_nonfinite=stop"
                        if stop
                        else f"{in_a_row} in a row (--max_consecutive_nonfinite), giving up"
                    )
                    raise FloatingPointError(
                        f"non-finite loss ({rec['loss']}) or gradient norm ({rec['grad_norm']}) "
                        f"at step {rec['step']}, {why}. Its update was not applied and nothing "
                        "was saved after the last checkpoint, "
                        f"{manager.latest_checkpoint or 'none (no checkpoint yet)'}, which is "
                        "intact; a rerun resumes there. Lower --learning_rate, check the input "
                        "data, or pass --on_nonfinite=skip."
                    )
            step_var.assign_add(n)
            step = int(step_var.numpy())
            _append_jsonl(train_log, records)
            applied = [r for r in records if not (r.get("skipped") or r.get("overflow"))]
            with writer.as_default(step=step):
                for key in applied[-1] if applied else ():
                    if key != "step":
                        tf.summary.scalar(key, np.mean([r[key] for r in applied]))
                tf.summary.scalar("skipped_steps", skipped)
            last = records[-1]
            seconds_per_step = max(time.time() - t_loop, 1e-9) / n
            loop_rate = global_batch_size / seconds_per_step
            loops += 1
            # The first loop also traces and compiles the step, so the second one replaces it.
            rate = loop_rate if loops <= 2 else 0.7 * rate + 0.3 * loop_rate
            eta = (settings.num_train_steps - step) * global_batch_size / max(rate, 1e-9)
            throughput = _throughput(trainer, rows, rate / global_batch_size, settings.peak_flops)
            with writer.as_default(step=step):
                tf.summary.scalar("examples_per_second", rate)
                for key, value in throughput.items():
                    tf.summary.scalar(key, value)
            shown = " ".join(
                f"{k} {np.mean([r[k] for r in applied]):.4f}"
                for k in (["loss", *metric_names] if applied else [])
            )
            logging.info(
                "step %d/%d | %s | %.1f examples/s%s | ETA %s%s",
                step,
                settings.num_train_steps,
                shown or "all steps skipped",
                rate,
                _fmt_throughput(throughput),
                _fmt_duration(eta),
                f" | {skipped} non-finite steps skipped" if skipped else "",
            )
            if not single_worker:
                sigterm_on = distribute.workers_flagged(strategy, sigterm.received)
            if step % settings.save_checkpoints_steps == 0 or step >= settings.num_train_steps:
                _save(manager, model, step)
                # Multi-worker: the eval's collectives run on every worker or on none.
                if eval_fn and not (sigterm.received if single_worker else sigterm_on):
                    _log_eval(eval_fn, step, eval_log, out)
                if settings.curves:
                    curves.after_save(step, step >= settings.num_train_steps)
    writer.flush()
    return last


class _CurveRedraws:
    """Redraws training_curves.png after checkpoint saves: the first and the last, and any
    other once the time since the last redraw is at least REDRAW_FACTOR times its cost, so
    redraws take at most about 1% of a run (a million-row log takes seconds to read). A redraw
    that fails is logged and training goes on: a plot is never worth a run."""

    REDRAW_FACTOR = 100

    def __init__(self, output_dir: str, panels: tuple):
        self.output_dir, self.panels = output_dir, panels
        self.drawn_at, self.cost = None, 0.0  # the last redraw's end and its seconds

    def after_save(self, step: int, last: bool) -> None:
        now = time.time()
        if not (
            last or self.drawn_at is None or now - self.drawn_at >= self.REDRAW_FACTOR * self.cost
        ):
            return
        try:
            plot_training_curves(self.output_dir, *self.panels)
        except Exception as e:
            logging.warning("training curves not drawn at step %d: %r", step, e)
        self.drawn_at = time.time()
        self.cost = self.drawn_at - now


def _damaged_input(files, error):
    if not files:
        return None
    from data_prep import features

    return features.damaged_input_error(files, error)


def _append_jsonl(path: str, records: list[dict]) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _exit_preempted(manager, model, step: int, sigterm_on: list[int]) -> None:
    """Saves the checkpoint at `step` (unless there is one) and raises Preempted.

    sigterm_on: under MultiWorkerMirroredStrategy, the workers the SIGTERM reached (every
    worker stops here at the same step); empty for a single worker.
    """
    latest = manager.latest_checkpoint
    if not latest or not latest.endswith(f"ckpt-{step}"):
        _save(manager, model, step)
    logging.warning(
        "SIGTERM%s: saved %s at step %d; exiting with code %d, rerun to continue",
        f" on worker {', '.join(map(str, sigterm_on))}, every worker stops" if sigterm_on else "",
        manager.latest_checkpoint,
        step,
        PREEMPTED_EXIT_CODE,
    )
    raise Preempted(step, manager.latest_checkpoint)


def _save(manager, model, step: int) -> None:
    # Never overwrite good state with bad: non-finite weights are not saved (the step's finiteness
    # check keeps them finite in practice; this guards weights that went bad another way).
    if not weights_are_finite(model.trainable_variables):
        raise FloatingPointError(
            f"non-finite weights at step {step}; not saved. Last good checkpoint: "
            f"{manager.latest_checkpoint}"
        )
    path = manager.save(checkpoint_number=step)
    logging.info("saved checkpoint %s", path)


def _log_eval(eval_fn, step: int, eval_log: str, out: str) -> dict:
    metrics = eval_fn()
    rec = {"step": step, **metrics}
    with open(eval_log, "a") as f:
        f.write(json.dumps(rec) + "\n")
    with tf.summary.create_file_writer(os.path.join(out, "eval")).as_default(step=step):
        for k, v in metrics.items():
            tf.summary.scalar(k, v)
    logging.info("eval at step %d: %s", step, " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return rec


def restore_model_weights(model, path: str, attribute: str = "model") -> str:
    """Loads model weights from a Cloze checkpoint (a file prefix or a directory: its latest).

    Every object of `model` must be in the checkpoint (extra objects in the checkpoint, such as an
    optimizer, are ignored); raises ValueError naming the path otherwise. To load only part of a
    model (a pretraining checkpoint's encoder into a task model), use init_from_checkpoint.
    """
    prefix = tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path) else path
    if not prefix or not tf.io.gfile.exists(prefix + ".index"):
        raise ValueError(
            f"{path}: expected a checkpoint prefix or a folder holding one, found none"
        )
    status = tf.train.Checkpoint(**{attribute: model}).restore(prefix)
    status.expect_partial()
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise ValueError(f"{prefix}: checkpoint does not fit this model: {str(e)[:500]}") from None
    return prefix


def init_from_checkpoint(model, path: str) -> tuple[str, str]:
    """Loads `--init_checkpoint` into a model that has an `encoder` attribute.

    A checkpoint of the same model loads whole; otherwise (a pretraining checkpoint into a task
    model, an encoder-only converted checkpoint into a pretrainer, another task's head) only
    `model/encoder` is loaded and the rest keeps its initialisation. Returns (checkpoint prefix,
    "model" or "encoder"); raises ValueError naming the path when neither fits.
    """
    try:
        return restore_model_weights(model, path), "model"
    except ValueError:
        pass
    holder = tf.train.Checkpoint(encoder=model.encoder)
    return restore_model_weights(holder, path), "encoder"


def write_eval_results(output_dir: str, results: dict) -> str:
    """Writes `eval_results.txt` as the original scripts did (`key = value`, sorted), atomically,
    and logs it. Returns the path.

    `global_step` (the entrypoints write the optimizer's iteration count) counts the updates
    applied, which is what the learning-rate schedule saw. A step whose update was not applied
    (a non-finite loss or gradient under --on_nonfinite=skip, an fp16 loss-scale overflow) is
    logged and numbered but not counted there, so when output_dir's training log holds such
    steps two keys are added: `train_steps`, the last logged step (the numbering of
    train_log.jsonl and of the ckpt-N checkpoints), and `skipped_steps`, the logged steps not
    applied. For a run trained in this folder, train_steps = global_step + skipped_steps.
    """
    log = read_jsonl(os.path.join(output_dir, "train_log.jsonl"))
    skipped = sum(1 for r in log if r.get("skipped") or r.get("overflow"))
    if "global_step" in results and skipped:
        results = results | {"train_steps": log[-1]["step"], "skipped_steps": skipped}
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "eval_results.txt")
    with open(path + ".tmp", "w") as f:
        f.writelines(f"{key} = {results[key]}\n" for key in sorted(results))
    os.replace(path + ".tmp", path)
    logging.info("***** Eval results (%s) *****", path)
    for key in sorted(results):
        logging.info("  %s = %s", key, results[key])
    return path
