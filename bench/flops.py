"""Analytic FLOP counts of BERT pretraining and the machine's measured dense matmul peak.

MFU (model FLOPs utilisation, PaLM appendix B) = model FLOPs per step / step time / peak FLOP/s,
where the model FLOPs are counted from the shapes (bert_pretraining_flops), not from what a
particular implementation happens to execute, so two implementations of one model are compared
on the same numerator.
"""

from __future__ import annotations

import time

from modeling import flops as modeling_flops


def bert_pretraining_flops(
    config,
    batch: int,
    seq: int,
    predictions: int,
    sentence_head: bool = True,
    train: bool = True,
    last_layer_queries: int | None = None,
) -> float:
    """FLOPs of one BERT MLM (+ NSP) step over `batch` sequences of `seq` tokens with
    `predictions` masked positions each, from modeling/flops.py's counts (its docstring has the
    formulas): the encoder, the MLM head at the P masked positions (as the original BERT
    computes it) and, with sentence_head, NSP; x 3 when train (the backward pass costs two
    forward passes), else the forward alone. `config` is anything with BertConfig's field names
    (hidden_size, num_hidden_layers, intermediate_size, vocab_size).

    By default every layer runs at all S positions: the model's count, the MFU numerator for
    every implementation. With last_layer_queries = Q, the FLOPs executed by an encoder whose
    last layer computes only Q positions (BertEncoder's output_positions: [CLS] + the P
    predictions, Q = 1 + P; K and V stay at all S positions), the numerator of the hardware
    FLOPs utilisation (what the matmul units really did).
    """
    h, v = config.hidden_size, config.vocab_size
    encoder = modeling_flops.encoder_flops(
        seq, h, config.num_hidden_layers, config.intermediate_size, q=last_layer_queries
    )
    forward = encoder + modeling_flops.mlm_head_flops(predictions, h, h, v)
    if sentence_head:
        forward += modeling_flops.sentence_head_flops(h)
    return float((3 if train else 1) * batch * forward)


def bert_encoder_flops(config, batch: int, seq: int) -> float:
    """Forward FLOPs of the encoder alone (inference), as in bert_pretraining_flops."""
    h, n_layers, i = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    return float(batch * modeling_flops.encoder_flops(seq, h, n_layers, i))


def matmul_peak_flops(sizes=(2048, 3072, 4096), repeats: int = 3, dtype: str = "float32") -> dict:
    """The best dense matmul throughput TensorFlow reaches here: n x n @ n x n for each size,
    `repeats` timed runs each after one warm-up, 2 * n^3 FLOPs per product.

    Returns {"flops_per_s": best, "by_size": {n: best FLOP/s at n}, "dtype": dtype}.
    """
    import tensorflow as tf

    by_size = {}

    @tf.function
    def product(a, b):
        # Reduced to a scalar so the result is surely computed yet nothing large is copied out.
        return tf.reduce_sum(tf.matmul(a, b))

    for n in sizes:
        a = tf.random.stateless_normal((n, n), seed=(1, n), dtype=dtype)
        b = tf.random.stateless_normal((n, n), seed=(2, n), dtype=dtype)
        product(a, b).numpy()  # warm-up and trace
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            product(a, b).numpy()
            best = min(best, time.perf_counter() - start)
        by_size[int(n)] = 2.0 * n**3 / best
    return {"flops_per_s": max(by_size.values()), "by_size": by_size, "dtype": dtype}
