"""Optimization as the original BERT recipe: AdamW (or LAMB), linear warmup then decay, clipping.

Differences from the original `optimization.py`, on purpose: Keras' AdamW applies Adam's bias
correction (the original AdamWeightDecayOptimizer does not); with beta2 = 0.999 the two agree after
a few thousand steps and the warmup hides the early difference.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf
from keras import ops

from training import precision

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


@keras.saving.register_keras_serializable(package="cloze")
class Lamb(keras.optimizers.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2).

    Per variable x with gradient g, at step t (bias-corrected Adam moments):
      m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
      r = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * x
      x = x - lr * ratio * r,  ratio = ||x|| / ||r|| (1 where either norm is 0)
    Variables matching `exclude_from_weight_decay` (BERT: LayerNorm and biases) get neither the
    decay term nor the trust ratio (ratio 1), as the LAMB used for BERT in the paper's sec. 4
    and NVIDIA's / TF-Addons' implementations (exclude_from_layer_adaptation defaults to the
    weight-decay exclusions).

    Written here rather than taken from keras.optimizers.Lamb because that one (Keras 3.15)
    differs from the paper in both respects: its weight decay is the base optimizer's decoupled
    `x -= lr * wd * x` outside the trust ratio, and it applies the trust ratio to every variable,
    LayerNorm and biases included (tests/test_optimization.py pins the difference).
    """

    def __init__(
        self,
        learning_rate=0.001,
        weight_decay_rate=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        name="lamb",
        **kwargs,
    ):
        # The base class's weight_decay stays None: its decoupled decay is not LAMB's.
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.weight_decay_rate = float(weight_decay_rate)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"]
        )

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        g = ops.cast(gradient, dtype)
        t = ops.cast(self.iterations + 1, dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        self.assign(m, self.beta_1 * m + (1.0 - self.beta_1) * g)
        self.assign(v, self.beta_2 * v + (1.0 - self.beta_2) * ops.square(g))
        m_hat = m / (1.0 - ops.power(ops.cast(self.beta_1, dtype), t))
        v_hat = v / (1.0 - ops.power(ops.cast(self.beta_2, dtype), t))
        r = m_hat / (ops.sqrt(v_hat) + self.epsilon)
        if self._use_weight_decay(variable):  # also decides the layer adaptation (docstring)
            r = r + self.weight_decay_rate * variable
            w_norm = ops.sqrt(ops.sum(ops.square(variable)))
            r_norm = ops.sqrt(ops.sum(ops.square(r)))
            positive = ops.logical_and(w_norm > 0, r_norm > 0)
            ratio = ops.where(positive, w_norm / ops.where(positive, r_norm, 1.0), 1.0)
            r = ratio * r
        self.assign_sub(variable, lr * r)

    def get_config(self):
        return {
            **super().get_config(),
            "weight_decay_rate": self.weight_decay_rate,
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
        }


@keras.saving.register_keras_serializable(package="cloze")
class AdamW(keras.optimizers.AdamW):
    """Keras' AdamW whose per-variable update runs as fused kernels on TensorFlow.

    Same update, same optimizer variables (so checkpoints load either way). Keras' update_step
    makes about ten element-wise passes over every variable and its two moments, and its
    decoupled weight decay two more multiplies and an assignment (`var -= var * wd * lr`). Here:
    - variables of at least `fused_min_size` elements (the weight matrices, above all the
      30522-row tied embedding table): decay and Adam in one XLA-compiled element-wise kernel,
      `_fused_adamw_kernel`: one read of the variable, its gradient and moments, one write;
    - smaller ones (biases, LayerNorm): the decay as one multiply by the scalar lr * wd, then
      TensorFlow's fused ApplyAdam. An XLA compile per new shape (~0.1 s) would not pay there.
    Both compute lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t), m += (g - m)(1 - b1),
    v += (g^2 - v)(1 - b2), x -= lr_t m / (sqrt(v) + eps), the decay first, as Keras does.
    Measured on 2 CPU cores over BERT-base's largest matrices (32 M parameters): Keras' decay +
    ApplyAdam 120 ms, the XLA kernel 55 ms; the whole update of BERT-base's 110 M parameters
    259 -> 187 ms, of the L4/H256 size 29 -> 23 ms (best of 7). The update was 16% of a small
    BERT step's op time before ApplyAdam and 6% of a base step's after it
    (bench/step_profile.py). Other backends, AMSGrad and IndexedSlices gradients use Keras'
    update unchanged.

    apply_scaled(grads, variables, scale) is apply() of every gradient times `scale` (the
    Trainer's global-norm clipping), the multiply done inside the update kernels rather than as
    one op writing a new tensor per gradient: measured in the L4/H256 pretraining step on 2
    AVX-512 cores, leaving the clipping multiply out made the step 1.023x faster (median of 30
    alternating rounds; thirteenth session).

    The scalars every variable's update shares (the bias corrections' powers, lr_t, the decay
    factor, the cast hyperparameters) are computed once per apply, not once per variable as
    Keras' update_step does: about 15 scalar ops per variable, 930 of the 2,214 ops in the
    L4/H256 pretraining step with --encoder_branches=2 (62 variables), each paying the
    executor's per-op cost. Measured in that step on 2 AVX-512 cores (medians of 24 alternating
    rounds of 10 steps, sixteenth session): 1.020x without the branches, 1.005x with them.
    """

    fused_min_size = 1 << 16
    # Set by apply_scaled for the duration of one apply: the float32 scalar every gradient is
    # multiplied by, or None.
    _gradient_scale = None
    # Set by apply for the duration of one apply: {(dtype, learning rate tensor id): scalars}, so
    # the variables' updates share one computation of them (_shared_scalars).
    _step_scalars = None

    def apply(self, grads, trainable_variables=None):
        self._step_scalars = {}
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._step_scalars = None

    def _shared_scalars(self, dtype, learning_rate) -> dict:
        """The update's scalars as `dtype` tensors: beta_1, beta_2, epsilon, lr, beta powers,
        lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) and the decay factor lr * weight_decay
        (None without weight decay); once per apply (and per dtype and learning rate tensor)."""
        key = (dtype, id(learning_rate))
        cache = self._step_scalars
        if cache is not None and key in cache:
            return cache[key]
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        beta_1_power, beta_2_power = tf.pow(beta_1, step), tf.pow(beta_2, step)
        lr = tf.cast(learning_rate, dtype)
        scalars = {
            "beta_1": beta_1,
            "beta_2": beta_2,
            "epsilon": tf.cast(self.epsilon, dtype),
            "lr": lr,
            "beta_1_power": beta_1_power,
            "beta_2_power": beta_2_power,
            "lr_t": lr * tf.sqrt(1.0 - beta_2_power) / (1.0 - beta_1_power),
            "decay": None if self.weight_decay is None else lr * tf.cast(self.weight_decay, dtype),
            "no_decay": tf.zeros([], dtype),
            "one": tf.ones([], dtype),
        }
        if cache is not None:
            cache[key] = scalars
        return scalars

    def apply_scaled(self, grads, variables, scale):
        """apply([g * scale for g in grads], variables), `scale` a float32 scalar tensor."""
        self._gradient_scale = scale
        try:
            return self.apply(grads, variables)
        finally:
            self._gradient_scale = None

    def _tensorflow_update(self) -> bool:
        return keras.backend.backend() == "tensorflow" and not self.amsgrad

    def _apply_weight_decay(self, variables):
        if not self._tensorflow_update():
            return super()._apply_weight_decay(variables)
        # Applied by update_step, each variable just before its own Adam update.
        return None

    def update_step(self, gradient, variable, learning_rate):
        # Inside a strategy's update() these resolve to the variable's copy on this device.
        var = variable.value if isinstance(variable, keras.Variable) else variable
        dtype = var.dtype
        decay = None
        if self._tensorflow_update() and self.weight_decay is not None:
            if self._use_weight_decay(variable):
                decay = self._shared_scalars(dtype, learning_rate)["decay"]
        scale = self._gradient_scale
        if not self._tensorflow_update() or isinstance(gradient, tf.IndexedSlices):
            if scale is not None:
                if isinstance(gradient, tf.IndexedSlices):
                    gradient = tf.IndexedSlices(
                        gradient.values * tf.cast(scale, gradient.values.dtype),
                        gradient.indices,
                        gradient.dense_shape,
                    )
                else:
                    gradient = gradient * ops.cast(scale, gradient.dtype)
            if decay is not None:
                var.assign_sub(var * decay)
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index].value, self._velocities[index].value
        c = self._shared_scalars(dtype, learning_rate)
        gradient = tf.cast(gradient, dtype)
        if var.shape.num_elements() is not None and var.shape.num_elements() >= (
            self.fused_min_size
        ):
            _fused_adamw_kernel()(
                var, m, v, gradient, c["one"] if scale is None else tf.cast(scale, dtype),
                c["lr_t"], c["no_decay"] if decay is None else decay, c["beta_1"], c["beta_2"],
                c["epsilon"],
            )  # fmt: skip
            return
        if scale is not None:
            gradient = gradient * tf.cast(scale, dtype)
        if decay is not None:
            var.assign_sub(var * decay)
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=c["beta_1_power"],
            beta2_power=c["beta_2_power"],
            lr=c["lr"],
            beta1=c["beta_1"],
            beta2=c["beta_2"],
            epsilon=c["epsilon"],
            grad=gradient,
        )


_FUSED_ADAMW = []


def _fused_adamw_kernel():
    """AdamW.update_step's one-pass kernel (built once, XLA-compiled per variable shape):
    (var, m, v, grad, grad_scale, lr_t, decay, beta_1, beta_2, epsilon), the gradient
    multiplied by grad_scale and var -= decay * var first."""
    if not _FUSED_ADAMW:

        def update(var, m, v, grad, grad_scale, lr_t, decay, beta_1, beta_2, epsilon):
            grad = grad * grad_scale
            m_new = m + (grad - m) * (1.0 - beta_1)
            v_new = v + (grad * grad - v) * (1.0 - beta_2)
            decayed = var - var * decay
            var.assign(decayed - lr_t * m_new / (tf.sqrt(v_new) + epsilon))
            m.assign(m_new)
            v.assign(v_new)

        _FUSED_ADAMW.append(tf.function(update, jit_compile=True, autograph=False))
    return _FUSED_ADAMW[0]


OPTIMIZERS = ("adamw", "lamb")


def create_optimizer(
    learning_rate: float,
    num_train_steps: int,
    num_warmup_steps: int,
    weight_decay: float = 0.01,
    optimizer: str = "adamw",
) -> keras.optimizers.Optimizer:
    """AdamW (or LAMB) with BERT's hyper-parameters (beta1 0.9, beta2 0.999, epsilon 1e-6,
    decay 0.01), LayerNorm and biases excluded from weight decay.

    Gradients reach `apply` already summed over replicas and clipped by the train step (see
    training/trainer.py), so the optimizer's own cross-replica sum is turned off here; clipping
    inside the optimizer would act per replica, not on the global gradient.
    """
    schedule = WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps)
    if optimizer == "adamw":
        opt = AdamW(
            learning_rate=schedule,
            weight_decay=weight_decay,
            beta_1=0.9,
            beta_2=0.999,
            epsilon=1e-6,
        )
    elif optimizer == "lamb":
        opt = Lamb(
            learning_rate=schedule,
            weight_decay_rate=weight_decay,
            beta_1=0.9,
            beta_2=0.999,
            epsilon=1e-6,
        )
    else:
        raise ValueError(f"optimizer: expected one of {OPTIMIZERS}, found {optimizer!r}")
    opt.exclude_from_weight_decay(var_names=list(NO_DECAY_PATTERNS))
    if not hasattr(opt, "_all_reduce_sum_gradients"):
        raise RuntimeError(
            "this Keras version has no optimizer._all_reduce_sum_gradients; the train step's "
            "own all-reduce would be applied twice. Pin keras as requirements.txt does."
        )
    # The train step sums gradients over replicas itself, before clipping (see docstring).
    opt._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars
    return opt


# --precision values and the Keras dtype policies they build a model with (training/precision.py).
PRECISIONS = precision.POLICIES


@contextlib.contextmanager
def dtype_policy(precision: str):
    """Builds models made inside at `precision` (a PRECISIONS key): sets Keras' global dtype
    policy and restores the previous one on exit. A layer keeps the policy it was made with, so
    a model made inside computes at that precision for its whole life."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {tuple(PRECISIONS)}, found {precision!r}")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(PRECISIONS[precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def with_loss_scaling(
    optimizer, precision: str, initial_scale: float = 2.0**15, dynamic_growth_steps: int = 2000
):
    """fp16 wraps `optimizer` in Keras' LossScaleOptimizer (dynamic loss scaling, Micikevicius et
    al. 2018, sec. 3.2: float16 gradients underflow without it); bf16 has float32's exponent
    range and needs none. The Trainer scales the loss, unscales before clipping and runs the
    scale's halving / doubling (training/trainer.py); the defaults are Keras'."""
    if precision != "fp16":
        return optimizer
    return keras.optimizers.LossScaleOptimizer(
        optimizer, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps
    )


def clip_by_global_norm(grads, clip_norm: float):
    """Clips gradients by their global norm, as the original (clip_norm 1.0).

    Returns (clipped grads, global norm). A non-finite norm is returned as is with the grads left
    unclipped, since tf.clip_by_global_norm would turn every gradient into NaN when one is Inf;
    the caller checks finiteness and decides (shared/NOTES.md).
    """
    norm = tf.linalg.global_norm(grads)
    scale = clip_scale(norm, clip_norm)
    return [g * scale for g in grads], norm


def clip_scale(norm, clip_norm: float):
    """The factor clip_by_global_norm multiplies the gradients by, from their global norm:
    clip_norm / max(norm, clip_norm), or 1 where the norm is not finite."""
    return tf.where(
        tf.math.is_finite(norm), clip_norm / tf.maximum(norm, clip_norm), tf.constant(1.0)
    )


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
