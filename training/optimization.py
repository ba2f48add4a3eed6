"""Optimization as the original BERT recipe: AdamW, linear warmup then linear decay, clipping.

Differences from the original `optimization.py`, on purpose: Keras' AdamW applies Adam's bias
correction (the original AdamWeightDecayOptimizer does not); with beta2 = 0.999 the two agree after
a few thousand steps and the warmup hides the early difference.
"""

from __future__ import annotations

import keras
import tensorflow as tf

# Variables the original excludes from weight decay ("LayerNorm", "layer_norm", "bias"); in Keras 3
# the LayerNorm weights are named gamma / beta.
NO_DECAY_PATTERNS = ("gamma", "beta", "bias")


@keras.saving.register_keras_serializable(package="cloze")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr * step / warmup for step < warmup, else lr * (1 - step / total), floored at 0.

    The original computes the decay over all `num_train_steps` and lets warmup override the first
    `num_warmup_steps` (optimization.create_optimizer); this is the same function.
    """

    def __init__(self, learning_rate, num_train_steps, num_warmup_steps):
        self.learning_rate = float(learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        total = tf.cast(max(self.num_train_steps, 1), tf.float32)
        decayed = self.learning_rate * tf.maximum(0.0, 1.0 - step / total)
        if self.num_warmup_steps <= 0:
            return decayed
        warm = self.learning_rate * step / float(self.num_warmup_steps)
        return tf.where(step < self.num_warmup_steps, warm, decayed)

    def get_config(self):
        return {
            "learning_rate": self.learning_rate,
            "num_train_steps": self.num_train_steps,
            "num_warmup_steps": self.num_warmup_steps,
        }


def create_optimizer(
    learning_rate: float,
    num_train_steps: int,
    num_warmup_steps: int,
    weight_decay: float = 0.01,
) -> keras.optimizers.Optimizer:
    """AdamW with BERT's hyper-parameters (beta1 0.9, beta2 0.999, epsilon 1e-6, decay 0.01).

    Gradients reach `apply` already summed over replicas and clipped by the train step (see
    training/trainer.py), so the optimizer's own cross-replica sum is turned off here; clipping
    inside the optimizer would act per replica, not on the global gradient.
    """
    optimizer = keras.optimizers.AdamW(
        learning_rate=WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps),
        weight_decay=weight_decay,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
    )
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY_PATTERNS))
    if not hasattr(optimizer, "_all_reduce_sum_gradients"):
        raise RuntimeError(
            "this Keras version has no optimizer._all_reduce_sum_gradients; the train step's "
            "own all-reduce would be applied twice. Pin keras as requirements.txt does."
        )
    # The train step sums gradients over replicas itself, before clipping (see docstring).
    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars
    return optimizer


def clip_by_global_norm(grads, clip_norm: float):
    """Clips gradients by their global norm, as the original (clip_norm 1.0).

    Returns (clipped grads, global norm). A non-finite norm is returned as is with the grads left
    unclipped, since tf.clip_by_global_norm would turn every gradient into NaN when one is Inf;
    the caller checks finiteness and decides (shared/NOTES.md).
    """
    norm = tf.linalg.global_norm(grads)
    scale = tf.where(
        tf.math.is_finite(norm), clip_norm / tf.maximum(norm, clip_norm), tf.constant(1.0)
    )
    return [g * scale for g in grads], norm


def train_and_warmup_steps(
    num_examples: int, batch_size: int, num_epochs: float, warmup_proportion: float
) -> tuple[int, int]:
    """Fine-tuning step counts as the original scripts: epochs over examples, warmup a fraction.

    Raises ValueError when the settings give no training step at all.
    """
    steps = int(num_examples / batch_size * num_epochs)
    if steps < 1:
        raise ValueError(
            f"{num_examples} training examples, --train_batch_size={batch_size} and "
            f"--num_train_epochs={num_epochs} give no training step"
        )
    return steps, int(steps * warmup_proportion)
