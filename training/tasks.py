"""Task definitions for the Trainer: what each objective's step computes, as sums.

See training/trainer.py for the contract (sums_fn, loss_terms, metrics).
"""

from __future__ import annotations

from modeling import losses
from training.trainer import Task


def bert_pretraining_task(model) -> Task:
    """Masked LM + next sentence prediction on pretraining TFRecord batches (BERT sec. 3.1).

    The loss is the original's: mean cross-entropy over real masked predictions plus mean NSP
    cross-entropy over sequences.
    """

    def sums_fn(batch, training):
        out = model(batch, training=training)
        mlm = losses.masked_lm_sums(
            out["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"]
        )
        nsp = losses.classification_sums(out["nsp_logits"], batch["next_sentence_labels"])
        return {f"mlm_{k}": v for k, v in mlm.items()} | {f"nsp_{k}": v for k, v in nsp.items()}

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("mlm_loss_sum", "mlm_weight"), ("nsp_loss_sum", "nsp_count")],
        metrics={
            "masked_lm_loss": ("mlm_loss_sum", "mlm_weight"),
            "masked_lm_accuracy": ("mlm_correct", "mlm_weight"),
            "next_sentence_loss": ("nsp_loss_sum", "nsp_count"),
            "next_sentence_accuracy": ("nsp_correct", "nsp_count"),
        },
    )
