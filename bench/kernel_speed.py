"""The pretraining step's hand-written kernels, timed against the library forms they replace.

1. The tied vocabulary projection (modeling/heads.tied_logits), forward + backward to the rows,
   the table and a bias: rows-first `matmul(x, table, transpose_b=True)` against Cloze's
   vocabulary-first `transpose(matmul(table, x, transpose_b=True))`.
2. Cross-entropy plus argmax hits of (N, V) logits (modeling/losses.softmax_xent_and_hits),
   forward + backward to the logits: Keras' sparse_categorical_crossentropy + argmax, TensorFlow's
   SparseSoftmaxCrossEntropyWithLogits + ArgMax, and Cloze's fused form.
3. GELU (tanh form) over the (B*S, I) intermediate activations, forward + backward: Cloze's
   plain `gelu_tanh` under autodiff, tf.nn.gelu(approximate=True), and the two XLA kernels of
   modeling/layers.fused_activation that Dense uses in training.
4. The whole MLM loss from the head's vectors, forward + backward to the rows, the table and the
   bias: tied_logits + bias, then softmax_xent_and_hits, against the vocabulary-major
   modeling/heads.tied_xent_and_hits that pretrainers use in training.

Each variant's gradients, loss (and hit count) must equal the first variant's (atol 1e-5
relative to the largest value, 1e-4 for the summed loss: XLA's tanh rounds differently), else
ValueError. Best of `repeats` rounds of `iterations` calls of one tf.function,
after a warm-up. Times are milliseconds per call on this machine; compare them only within a run.

  python -m bench.kernel_speed --rows=160 --hidden=256 --vocab=30522 --tokens=1024 \
    --intermediate=3072 --output=/tmp/kernels.json
"""

from __future__ import annotations

import argparse
import json
import time


def _best_ms(fn, repeats: int, iterations: int) -> float:
    fn()  # warm-up: traces the graph
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            out = fn()
        float(out[0][0, 0])  # waits for the last call
        best = min(best, (time.perf_counter() - start) / iterations)
    return best * 1e3


def _check_equal(name, got, want):
    import numpy as np

    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        tol = (1e-4 if w.size == 1 else 1e-5) * max(1.0, float(np.abs(w).max()))
        if g.shape != w.shape or not np.allclose(g, w, rtol=0, atol=tol):
            raise ValueError(f"{name}: gradients differ from the reference (atol {tol:g})")


def run(
    rows=160,
    hidden=256,
    vocab=30522,
    tokens=1024,
    intermediate=3072,
    repeats=3,
    iterations=10,
    seed=0,
) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf
    from keras import ops

    from modeling import heads, layers, losses

    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "bench.kernel_speed times TensorFlow paths: run with KERAS_BACKEND=tensorflow"
        )

    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(rows, hidden)).astype(np.float32))
    table = tf.Variable(rng.normal(size=(vocab, hidden)).astype(np.float32) * 0.02)
    bias = tf.Variable(np.zeros(vocab, np.float32))
    labels = tf.constant(rng.integers(0, vocab, rows).astype(np.int32))
    logits = tf.constant(rng.normal(size=(rows, vocab)).astype(np.float32))
    pre = tf.constant(rng.normal(size=(tokens, intermediate)).astype(np.float32))
    pre_up = tf.constant(rng.normal(size=(tokens, intermediate)).astype(np.float32))

    def timed_step(sources, loss_and_counts):
        """A tf.function returning d loss / d sources, then each count of loss_and_counts()
        and the loss as (1, 1) tensors: the loss is returned, or Grappler prunes the forward
        work it alone needs."""

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                tape.watch(sources)
                loss, *counts = loss_and_counts()
            grads = tape.gradient(loss, sources)
            return [*grads, *(tf.reshape(v, (1, 1)) for v in (*counts, loss))]

        return step

    def projection(form):
        def loss():
            if form == "rows_first":
                out = tf.linalg.matmul(x, table, transpose_b=True) + bias
            else:
                out = heads.tied_logits(x[None], table)[0] + bias
            # A fixed non-uniform upstream gradient, so every output position matters.
            return (tf.reduce_sum(out * logits),)

        return timed_step([x, table, bias], loss)

    def xent(form):
        def loss_and_hits():
            if form == "keras":
                ce = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
                hits = ops.cast(
                    ops.equal(ops.argmax(logits, -1), ops.cast(labels, "int64")), "float32"
                )
            elif form == "tf_fused_op":
                ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                hits = tf.cast(
                    tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32
                )
            else:
                ce, hits = losses.softmax_xent_and_hits(logits, labels)
            return tf.reduce_sum(ce * tf.range(1.0, rows + 1.0) / rows), tf.reduce_sum(hits)

        return timed_step([logits], loss_and_hits)

    def gelu(form):
        act = {
            "autodiff_gelu_tanh": layers.gelu_tanh,
            "tf_nn_gelu": lambda v: tf.nn.gelu(v, approximate=True),
            "cloze_fused_xla": layers.fused_activation("gelu"),
        }[form]
        return timed_step([pre], lambda: (tf.reduce_sum(act(pre) * pre_up),))

    def mlm_loss(form):
        def loss_and_hits():
            if form == "logits_then_xent":
                logits = heads.tied_logits(x[None], table)[0] + bias
                ce, hits = losses.softmax_xent_and_hits(logits, labels)
            else:
                ce, hits = heads.tied_xent_and_hits(x[None], table, bias, labels[None])
            ce, hits = tf.reshape(ce, (-1,)), tf.reshape(hits, (-1,))
            return tf.reduce_sum(ce * tf.range(1.0, rows + 1.0) / rows), tf.reduce_sum(hits)

        return timed_step([x, table, bias], loss_and_hits)

    result = {
        "rows": rows,
        "hidden": hidden,
        "vocab": vocab,
        "tokens": tokens,
        "intermediate": intermediate,
        "projection_ms": {},
        "xent_ms": {},
        "gelu_ms": {},
        "mlm_loss_ms": {},
    }
    for key, forms, make in (
        ("projection_ms", ("rows_first", "cloze_vocab_first"), projection),
        ("xent_ms", ("keras", "tf_fused_op", "cloze_fused"), xent),
        ("gelu_ms", ("autodiff_gelu_tanh", "tf_nn_gelu", "cloze_fused_xla"), gelu),
        ("mlm_loss_ms", ("logits_then_xent", "cloze_vocab_major"), mlm_loss),
    ):
        reference = None
        for form in forms:
            fn = make(form)
            grads = fn()
            if reference is None:
                reference = grads
            else:
                _check_equal(f"{key} {form}", grads, reference)
            result[key][form] = _best_ms(fn, repeats, iterations)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=160, help="masked positions per batch (B * P)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--tokens", type=int, default=1024, help="GELU rows (B * S)")
    p.add_argument("--intermediate", type=int, default=3072, help="GELU width (I)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--output", default="")
    args = p.parse_args()
    result = run(
        args.rows,
        args.hidden,
        args.vocab,
        args.tokens,
        args.intermediate,
        args.repeats,
        args.iterations,
    )
    for key in ("projection_ms", "xent_ms", "gelu_ms", "mlm_loss_ms"):
        print(key + ": " + ", ".join(f"{k} {v:.1f}" for k, v in result[key].items()))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
