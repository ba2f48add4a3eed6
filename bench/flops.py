"""Analytic FLOP counts of BERT pretraining and the machine's measured dense matmul peak.

MFU (model FLOPs utilisation, PaLM appendix B) = model FLOPs per step / step time / peak FLOP/s,
where the model FLOPs are counted from the shapes (bert_pretraining_flops), not from what a
particular implementation happens to execute, so two implementations of one model are compared
on the same numerator.
"""

from __future__ import annotations

import time


def bert_pretraining_flops(
    config,
    batch: int,
    seq: int,
    predictions: int,
    sentence_head: bool = True,
    train: bool = True,
    last_layer_queries: int | None = None,
) -> float:
    """FLOPs of one BERT MLM (+ NSP) step, counting 2 FLOPs per multiply-add of every matmul.

    With L layers, hidden H, intermediate I, vocabulary V, batch B, length S, predictions P:

      encoder forward  = B * L * (2 * S * (4 * H^2 + 2 * H * I) + 4 * S^2 * H)
                         (Q, K, V and output projections: 4 H x H; FFN: H x I and I x H;
                          attention scores Q K^T and probabilities x V: 2 * S^2 * H each)
      MLM head forward = B * P * (2 * H^2 + 2 * H * V)
                         (the transform dense, then the tied vocabulary projection, only at
                          the P masked positions as the original BERT computes it)
      NSP forward      = B * (2 * H^2 + 2 * H * 2)   (pooler dense, 2-way classifier)
      step             = 3 * forward when train (backward = 2 x forward: gradients with respect
                         to activations and to weights), else 1 * forward.

    Embedding lookups, softmax, layer norm, GELU and the optimizer update are left out: they are
    not matmuls and are a few percent of the total at these sizes. `config` is anything with
    BertConfig's field names (hidden_size, num_hidden_layers, intermediate_size, vocab_size).

    That is the model's count, the MFU numerator for every implementation. With
    last_layer_queries = Q, the FLOPs executed by an encoder whose last layer computes only Q
    positions (BertEncoder's output_positions: [CLS] + the P predictions, Q = 1 + P): there the
    K and V projections stay at all S positions and the rest runs at Q,
      last layer forward = B * (2 * S * 2 * H^2 + 2 * Q * (2 * H^2 + 2 * H * I) + 4 * Q * S * H),
    the numerator of the hardware FLOPs utilisation (what the matmul units really did).
    """
    h, n_layers = config.hidden_size, config.num_hidden_layers
    i, v = config.intermediate_size, config.vocab_size
    layer = 2 * seq * (4 * h * h + 2 * h * i) + 4 * seq * seq * h
    encoder = batch * n_layers * layer
    if last_layer_queries is not None and n_layers:
        q = last_layer_queries
        last = 2 * seq * 2 * h * h + 2 * q * (2 * h * h + 2 * h * i) + 4 * q * seq * h
        encoder = batch * ((n_layers - 1) * layer + last)
    mlm = batch * predictions * (2 * h * h + 2 * h * v)
    nsp = batch * (2 * h * h + 2 * h * 2) if sentence_head else 0
    return float((3 if train else 1) * (encoder + mlm + nsp))


def bert_encoder_flops(config, batch: int, seq: int) -> float:
    """Forward FLOPs of the encoder alone (inference), as in bert_pretraining_flops."""
    h, n_layers, i = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    return float(batch * n_layers * (2 * seq * (4 * h * h + 2 * h * i) + 4 * seq * seq * h))


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
