"""Pre-training losses and their metric counts, returned as sums so replicas can be combined.

The original BERT divides the masked-LM loss by the number of real predictions in the batch.
Under a distribution strategy each replica sees part of the batch, so these functions return
sums (numerators) and counts (denominators); the train step divides by the *global* totals, which
makes N replicas compute exactly the one-device loss. Shapes: B batch, P predictions, V vocab.
"""

from __future__ import annotations

from keras import ops


def masked_lm_sums(logits, label_ids, label_weights):
    """Sums for the masked-LM loss and accuracy.

    Args:
      logits: float (B, P, V) at the masked positions.
      label_ids: int (B, P), the original token ids (0 where padded).
      label_weights: float (B, P), 1.0 for real predictions, 0.0 for padding.
    Returns a dict of float32 scalars: loss_sum (sum of weighted cross-entropy), correct
    (weighted count of argmax hits) and weight (number of real predictions).
    """
    logits = ops.cast(logits, "float32")
    w = ops.cast(label_weights, "float32")
    ce = ops.sparse_categorical_crossentropy(label_ids, logits, from_logits=True)  # (B, P)
    hits = ops.cast(ops.equal(ops.argmax(logits, axis=-1), ops.cast(label_ids, "int64")), "float32")
    return {
        "loss_sum": ops.sum(ce * w),
        "correct": ops.sum(hits * w),
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
