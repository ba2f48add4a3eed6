"""Pre-training losses and their metric counts, returned as sums so replicas can be combined.

The original BERT divides the masked-LM loss by the number of real predictions in the batch.
Under a distribution strategy each replica sees part of the batch, so these functions return
sums (numerators) and counts (denominators); the train step divides by the *global* totals, which
makes N replicas compute exactly the one-device loss. Shapes: B batch, P predictions, V vocab.
"""

from __future__ import annotations

import keras
from keras import ops

from modeling import layers


def xent_and_hits_tf(logits, labels, class_axis: int = 1):
    """Softmax cross-entropy and argmax hits of float32 logits against int labels (N,), with a
    hand-written gradient: TensorFlow only. Logits are (N, V) with class_axis 1, or
    vocabulary-major (V, N) with class_axis 0 (heads.tied_xent_and_hits).

    Written by hand because the library path was measured slow on the MLM head's (160, 30522)
    logits (2 CPU cores, forward + backward + hits): Keras' sparse_categorical_crossentropy
    plus its argmax took 20.9 ms, TensorFlow's fused SparseSoftmaxCrossEntropyWithLogits with a
    plain ArgMax 16.2 ms, this 9.2 ms (bench/results/kernels_2026-11-23_s7.json). Keras' argmax
    adds four full passes over the logits (a negative-zero fix-up); here the row maximum the
    softmax needs anyway gives the hits. `python -m bench.kernel_speed` re-measures it.

    A hit is a label whose logit equals its row's maximum; argmax differs only where another
    entry ties that maximum exactly (argmax takes the first).
    """
    import tensorflow as tf

    if class_axis not in (0, 1):
        raise ValueError(f"class_axis must be 0 or 1, got {class_axis}")
    # The scopes name these ops in traces (bench/step_profile.py: forward and backward).
    with tf.name_scope("softmax_xent"):
        labels = tf.cast(labels, tf.int32)
        pairs = [tf.range(tf.shape(labels)[0]), labels]  # (prediction, label) of each
        # An out-of-range label makes gather_nd below raise on CPU, as TensorFlow's own op does.
        scatter_index = tf.stack(pairs if class_axis == 1 else pairs[::-1], axis=1)

        @tf.custom_gradient
        def xent(x):
            row_max = tf.reduce_max(x, axis=class_axis, keepdims=True)  # (N, 1) or (1, N)
            exp = tf.exp(x - row_max)  # kept for the gradient
            total = tf.reduce_sum(exp, axis=class_axis, keepdims=True)
            label_logit = tf.gather_nd(x, scatter_index)  # (N,)
            ce = tf.squeeze(tf.math.log(total) + row_max, class_axis) - label_logit
            hits = tf.cast(label_logit >= tf.squeeze(row_max, class_axis), tf.float32)

            def grad(d_ce, d_hits=None):
                # d ce / d x = softmax(x) - one_hot(label), scaled by the incoming d_ce per row.
                # (A custom gradient's ops are outside the tape's scope: named here instead.)
                with tf.name_scope("softmax_xent_backward"):
                    softmax_part = exp * (tf.expand_dims(d_ce, class_axis) / total)
                    return tf.tensor_scatter_nd_sub(softmax_part, scatter_index, d_ce)

            return (ce, tf.stop_gradient(hits)), grad

        return xent(logits)


# biased_xent_and_hits_tf's XLA kernels only for static (V, N) logits of at least this many
# elements: every new shape costs an XLA compile (~0.1-0.3 s), which tiny models (the tests)
# would pay without gain.
FUSED_XENT_MIN_SIZE = 1 << 16

_FUSED_XENT_CACHE = {}


def _fused_xent_kernels(logits_dtype: str):
    """(forward, backward) XLA kernels of biased_xent_and_hits_tf for (V, N) logits of
    `logits_dtype`, built once per dtype; float32 inside."""
    if logits_dtype not in _FUSED_XENT_CACHE:
        import tensorflow as tf

        def biased(logits, bias):  # (V, N) float32
            return layers.kernel_cast(logits, tf.float32) + tf.cast(bias, tf.float32)[:, None]

        def forward(logits, bias, labels):
            z = biased(logits, bias)
            row_max = tf.reduce_max(z, axis=0)  # (N,)
            total = tf.reduce_sum(tf.exp(z - row_max[None, :]), axis=0)
            label_logit = tf.gather_nd(z, tf.stack([labels, tf.range(tf.shape(z)[1])], axis=1))
            ce = tf.math.log(total) + row_max - label_logit
            return ce, tf.cast(label_logit >= row_max, tf.float32), row_max, total

        def backward(logits, bias, labels, row_max, total, d_ce):
            # d ce / d z = softmax(z) - one_hot(label), scaled by d_ce per column; exp(z - max)
            # is recomputed rather than kept from the forward (a (V, N) float32 tensor).
            z = biased(logits, bias)
            one_hot = tf.range(tf.shape(z)[0])[:, None] == labels[None, :]
            d_z = tf.exp(z - row_max[None, :]) * (d_ce / total)[None, :]
            d_z = d_z - tf.where(one_hot, d_ce[None, :], tf.zeros_like(d_z))
            return layers.kernel_cast(d_z, logits_dtype), tf.reduce_sum(d_z, axis=1)

        _FUSED_XENT_CACHE[logits_dtype] = layers.xla_kernels(forward, backward)
    return _FUSED_XENT_CACHE[logits_dtype]


def biased_xent_and_hits_tf(logits, bias, labels):
    """xent_and_hits_tf of vocabulary-major logits plus a bias, in float32: float (V, N) of any
    float dtype, (V,) and int (N,) -> float32 (N,) cross-entropy and (N,) hits. TensorFlow only.

    For static logits of at least FUSED_XENT_MIN_SIZE elements, off TPU, the bias add, the
    softmax cross-entropy, the hits and the gradients to the logits and the bias run as two
    XLA-compiled kernels (float32 inside; the logits' gradient in their dtype).
    Why by hand: xent_and_hits_tf's ops make about ten passes over the (V, N) logits (the bias
    add, max, subtract, exp, sum; the gradient's multiply and scatter; the bias' Sum). Measured
    on 2 AVX-512 cores at the MLM head's (30522, 160), forward + backward to the logits and the
    bias: 7.5 -> 5.2 ms (thirteenth session). Out-of-range labels raise InvalidArgumentError
    either way.
    """
    import tensorflow as tf

    size = layers.static_size(logits)
    if (
        size is None
        or size < FUSED_XENT_MIN_SIZE
        or isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy)
    ):
        z = tf.cast(logits, tf.float32) + tf.cast(bias, tf.float32)[:, None]
        return xent_and_hits_tf(z, labels, class_axis=0)
    labels = tf.cast(labels, tf.int32)
    vocab = logits.shape[0]
    # XLA's gather clamps an out-of-range index where TensorFlow's raises: checked here.
    checks = [
        tf.debugging.assert_non_negative(labels, message="masked LM label below 0"),
        tf.debugging.assert_less(
            labels, tf.constant(vocab, tf.int32), message=f"masked LM label >= vocab size {vocab}"
        ),
    ]
    with tf.control_dependencies(checks):
        labels = tf.identity(labels)
    forward, backward = _fused_xent_kernels(logits.dtype.name)

    @tf.custom_gradient
    def fused(logits, bias):
        ce, hits, row_max, total = forward(logits, bias, labels)

        def grad(d_ce, d_hits=None):
            d_logits, d_bias = backward(logits, bias, labels, row_max, total, d_ce)
            return d_logits, tf.cast(d_bias, bias.dtype)

        return (ce, tf.stop_gradient(hits)), grad

    with tf.name_scope("softmax_xent"):
        return fused(logits, tf.convert_to_tensor(bias))


def softmax_xent_and_hits(logits, labels):
    """Softmax cross-entropy and argmax hits over the last axis: float (..., V) and int (...)
    -> float32 (...) and float32 (...) of 1.0 / 0.0.

    On TensorFlow a fused hand-written form (see xent_and_hits_tf); elsewhere Keras ops.
    """
    logits = ops.cast(logits, "float32")
    if keras.backend.backend() != "tensorflow":
        ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        hits = ops.equal(ops.argmax(logits, axis=-1), ops.cast(labels, "int64"))
        return ce, ops.cast(hits, "float32")
    shape = ops.shape(labels)
    ce, hits = xent_and_hits_tf(
        ops.reshape(logits, (-1, ops.shape(logits)[-1])), ops.reshape(labels, (-1,))
    )
    return ops.reshape(ce, shape), ops.reshape(hits, shape)


def masked_lm_sums(logits, label_ids, label_weights):
    """Sums for the masked-LM loss and accuracy.

    Args:
      logits: float (B, P, V) at the masked positions.
      label_ids: int (B, P), the original token ids (0 where padded).
      label_weights: float (B, P), 1.0 for real predictions, 0.0 for padding.
    Returns a dict of float32 scalars: loss_sum (sum of weighted cross-entropy), correct
    (weighted count of argmax hits) and weight (number of real predictions).
    """
    ce, hits = softmax_xent_and_hits(logits, label_ids)  # (B, P) each
    return masked_lm_sums_of(ce, hits, label_weights)


def masked_lm_sums_of(xent, hits, label_weights):
    """masked_lm_sums from per-prediction cross-entropy and hits, float (B, P) each, as a
    pretrainer returns them in training (heads.tied_xent_and_hits)."""
    w = ops.cast(label_weights, "float32")
    return {
        "loss_sum": ops.sum(ops.cast(xent, "float32") * w),
        "correct": ops.sum(ops.cast(hits, "float32") * w),
        "weight": ops.sum(w),
    }


def classification_sums(logits, labels, weights=None):
    """Sums for a softmax classification loss (NSP, GLUE).

    logits float (B, C); labels int (B,) or (B, 1); weights float (B,), 0 for rows that only pad
    a set to full batches (None: all 1). Returns float32 scalars loss_sum, correct and count (the
    sum of weights).
    """
    logits = ops.cast(logits, "float32")
    labels = ops.reshape(labels, (-1,))
    w = ops.ones(ops.shape(labels), "float32") if weights is None else ops.cast(weights, "float32")
    ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)  # (B,)
    hits = ops.cast(ops.equal(ops.argmax(logits, axis=-1), ops.cast(labels, "int64")), "float32")
    return {"loss_sum": ops.sum(ce * w), "correct": ops.sum(hits * w), "count": ops.sum(w)}


def regression_sums(scores, targets, weights):
    """Weighted squared-error sums: scores float (B, 1) or (B,), targets float (B,), weights (B,).

    Returns float32 scalars loss_sum (sum of squared errors) and count.
    """
    scores = ops.reshape(ops.cast(scores, "float32"), (-1,))
    targets = ops.reshape(ops.cast(targets, "float32"), (-1,))
    return {
        "loss_sum": ops.sum(ops.square(scores - targets) * weights),
        "count": ops.sum(weights),
    }


def causal_lm_sums(logits, input_ids, input_mask=None):
    """Sums for next-token prediction: position t's logits score token t + 1.

    logits float (B, T, V); input_ids int (B, T); input_mask (B, T) or None (every position real:
    packed blocks have no padding). A prediction counts when its target is real. Returns float32
    scalars loss_sum, correct and weight (the number of predictions, B * (T - 1) when unpadded).
    """
    targets = input_ids[:, 1:]  # (B, T-1)
    ce, hits = softmax_xent_and_hits(logits[:, :-1], targets)  # (B, T-1) each
    return causal_lm_sums_of(ce, hits, input_mask)


def causal_lm_sums_of(xent, hits, input_mask=None):
    """causal_lm_sums from each position's next-token cross-entropy and hits, float (B, T-1)
    each, as a GPT returns them in training (gpt.next_token_terms); input_mask (B, T) or None."""
    if input_mask is None:
        weights = ops.ones(ops.shape(xent), "float32")
    else:
        weights = ops.cast(input_mask[:, 1:], "float32")
    return masked_lm_sums_of(xent, hits, weights)


def replaced_token_sums(logits, labels, input_mask):
    """Sums for ELECTRA's replaced token detection (Clark et al. 2020, sec. 2): sigmoid
    cross-entropy at every real token, as the original's discriminator loss.

    logits float (B, S), > 0 meaning replaced; labels int (B, S), 1 where replaced; input_mask
    (B, S). Returns float32 scalars loss_sum, correct, count (real tokens), and for precision
    and recall true_positive, predicted (tokens called replaced) and replaced (tokens that were).
    """
    logits = ops.cast(logits, "float32")
    y = ops.cast(labels, "float32")
    w = ops.cast(input_mask, "float32")
    ce = ops.binary_crossentropy(y, logits, from_logits=True)  # (B, S)
    called = ops.cast(logits > 0, "float32")
    return {
        "loss_sum": ops.sum(ce * w),
        "correct": ops.sum(ops.cast(ops.equal(called, y), "float32") * w),
        "count": ops.sum(w),
        "true_positive": ops.sum(called * y * w),
        "predicted": ops.sum(called * w),
        "replaced": ops.sum(y * w),
    }


def soft_target_sums(student_logits, teacher_logits, weights, temperature: float):
    """Sums for distillation's soft-target loss (Hinton et al. 2015; DistilBERT, Sanh et al.
    2019, sec. 2): KL(softmax(t / T) || softmax(s / T)) * T^2 per prediction.

    The KL divergence is the soft-target cross-entropy minus the teacher's entropy, which has no
    gradient, so it trains the same and is 0 when the student matches the teacher (DistilBERT's
    `loss_ce` computes this KL too). The T^2 factor keeps the gradient scale independent of T
    (Hinton et al. sec. 2). student_logits, teacher_logits float (B, P, V); weights float (B, P).
    Returns float32 scalars loss_sum and weight.
    """
    s = ops.cast(student_logits, "float32") / temperature
    t = ops.cast(teacher_logits, "float32") / temperature
    log_p_t = ops.log_softmax(t, axis=-1)
    kl = ops.sum(ops.exp(log_p_t) * (log_p_t - ops.log_softmax(s, axis=-1)), axis=-1)  # (B, P)
    w = ops.cast(weights, "float32")
    return {"loss_sum": ops.sum(kl * w) * temperature**2, "weight": ops.sum(w)}


def cosine_sums(student_hidden, teacher_hidden, input_mask):
    """Sums for DistilBERT's cosine embedding loss: 1 - cos(student, teacher) of the last hidden
    states at every real token (Sanh et al. 2019, sec. 2, "aligns the directions").

    student_hidden, teacher_hidden float (B, S, H); input_mask (B, S). Returns float32 scalars
    loss_sum and count.
    """
    a = ops.cast(student_hidden, "float32")
    b = ops.cast(teacher_hidden, "float32")
    dot = ops.sum(a * b, axis=-1)  # (B, S)
    norms = ops.sqrt(ops.sum(a * a, axis=-1) * ops.sum(b * b, axis=-1))
    # 1e-8 as torch.nn.CosineEmbeddingLoss's epsilon (DistilBERT's loss), for zero vectors.
    cos = dot / ops.maximum(norms, 1e-8)
    w = ops.cast(input_mask, "float32")
    return {"loss_sum": ops.sum((1.0 - cos) * w), "count": ops.sum(w)}
