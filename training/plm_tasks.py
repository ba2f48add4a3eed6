"""The permutation language-model task (XLNet) for the Trainer, as sums.

See training/trainer.py for the contract (sums_fn, loss_terms, metrics).
"""

from __future__ import annotations

import tensorflow as tf

from modeling import flops, losses
from training.trainer import Task, float_shape

PLM_INPUTS = ("input_ids", "perm_mask", "target_mapping")


def permutation_lm_task(model) -> Task:
    """XLNet's objective with partial prediction (Yang et al. 2019, sec. 2.3, eq. 5): the mean
    cross-entropy of the predicted tokens given the content of the positions before them in the
    sampled order. `model` an xlnet.XLNetPretrainer; batches from
    data_prep/permutation.permutation_lm_features. Perplexity is exp(plm_loss)."""

    def sums_fn(batch, training):
        out = model({k: batch[k] for k in PLM_INPUTS}, training=training)
        return losses.masked_lm_sums(
            out["plm_logits"], batch["target_ids"], batch["target_weights"]
        )

    def flops_fn(batch):
        """3 forward passes (modeling/flops.py) of the batch: target_mapping (B, P, S)."""
        b, p, s = tf.unstack(float_shape(batch, "target_mapping"))
        return 3.0 * flops.xlnet_pretraining_flops(model.config, s, p, b)

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "weight")],
        metrics={"plm_loss": ("loss_sum", "weight"), "plm_accuracy": ("correct", "weight")},
        flops_fn=flops_fn,
    )
