"""The biLM pretraining task (ELMo, Peters et al. 2018, sec. 3.1) for the Trainer.

See training/trainer.py for the contract (sums_fn, loss_terms, metrics).
"""

from __future__ import annotations

import tensorflow as tf

from modeling import elmo, flops, losses
from training.trainer import Task, float_shape


def bilm_sums(forward_logits, backward_logits, input_ids) -> dict:
    """Sums of both directions' language-model losses on one block.

    forward_logits, backward_logits float (B, S, V): position t of the forward LM scores token
    t + 1, of the backward LM token t - 1; input_ids int (B, S), packed blocks without padding.
    Returns float32 scalars forward_* and backward_* (loss_sum, correct, weight) and their
    totals loss_sum and weight (bilm_sums_of).
    """
    forward = losses.softmax_xent_and_hits(forward_logits[:, :-1], input_ids[:, 1:])
    backward = losses.softmax_xent_and_hits(backward_logits[:, 1:], input_ids[:, :-1])
    return bilm_sums_of(*forward, *backward)


def bilm_sums_of(forward_xent, forward_hits, backward_xent, backward_hits) -> dict:
    """bilm_sums from each prediction's cross-entropy and hits, float (B, S - 1) each, as
    elmo.ElmoLM returns them with lm_terms (every prediction counts: no padding)."""
    forward = losses.causal_lm_sums_of(forward_xent, forward_hits)
    backward = losses.causal_lm_sums_of(backward_xent, backward_hits)
    sums = {f"forward_{k}": v for k, v in forward.items()}
    sums |= {f"backward_{k}": v for k, v in backward.items()}
    # Both directions make B * (S - 1) predictions, so the pooled mean is their average:
    # bilm-tf's loss, 0.5 * (forward + backward).
    sums["loss_sum"] = forward["loss_sum"] + backward["loss_sum"]
    sums["weight"] = forward["weight"] + backward["weight"]
    return sums


def bilm_task(model) -> Task:
    """Joint forward and backward LM on language-model blocks (an elmo.ElmoLM): the mean
    cross-entropy over both directions' predictions. Perplexities are exp(*_lm_loss)."""

    def sums_fn(batch, training):
        inputs = {"input_ids": batch["input_ids"]}
        if isinstance(model, elmo.ElmoLM):  # the loss terms without the (B, S, V) logits
            out = model(inputs, training=training, lm_terms=True)
            return bilm_sums_of(
                *(out[f"{d}_{k}"] for d in ("forward", "backward") for k in ("xent", "hits"))
            )
        out = model(inputs, training=training)
        return bilm_sums(out["forward_logits"], out["backward_logits"], batch["input_ids"])

    metrics = {"lm_loss": ("loss_sum", "weight")}
    for d in ("forward", "backward"):
        metrics[f"{d}_lm_loss"] = (f"{d}_loss_sum", f"{d}_weight")
        metrics[f"{d}_lm_accuracy"] = (f"{d}_correct", f"{d}_weight")

    def flops_fn(batch):
        """3 forward passes (modeling/flops.py) of the batch's (B, S) sequences."""
        b, s = tf.unstack(float_shape(batch))
        return 3.0 * b * flops.elmo_lm_flops(model.config, s)

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "weight")],
        metrics=metrics,
        flops_fn=flops_fn,
    )
