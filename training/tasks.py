"""Task definitions for the Trainer: what each objective's step computes, as sums.

See training/trainer.py for the contract (sums_fn, loss_terms, metrics).
"""

from __future__ import annotations

from modeling import losses
from training.trainer import Task

# Metric names of the sentence-level objectives; "next_sentence" keeps the original BERT names.
SENTENCE_METRIC_PREFIX = {"nsp": "next_sentence", "sop": "sentence_order"}


def bert_pretraining_task(model) -> Task:
    """Masked LM plus the model's sentence-level and span objectives, on pretraining batches.

    Any pretrainer with BertPretrainer's outputs and its `sentence_objective` and `span_boundary`
    attributes (BertPretrainer, AlbertPretrainer). The loss is the original's: mean cross-entropy
    over real masked predictions plus mean NSP (BERT sec. 3.1) or SOP (ALBERT sec. 4.2)
    cross-entropy over sequences, none under "none" (RoBERTa sec. 4.2); with span_boundary, plus
    the span boundary loss over the same predictions (SpanBERT sec. 3.2: L_MLM + L_SBO).
    """
    objective = getattr(model, "sentence_objective", "nsp")
    span_boundary = getattr(model, "span_boundary", False)

    def sums_fn(batch, training):
        out = model(batch, training=training)
        mlm = losses.masked_lm_sums(
            out["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"]
        )
        sums = {f"mlm_{k}": v for k, v in mlm.items()}
        if objective != "none":
            nsp = losses.classification_sums(out["nsp_logits"], batch["next_sentence_labels"])
            sums |= {f"nsp_{k}": v for k, v in nsp.items()}
        if span_boundary:
            sbo = losses.masked_lm_sums(
                out["sbo_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"]
            )
            sums |= {f"sbo_{k}": v for k, v in sbo.items()}
        return sums

    loss_terms = [("mlm_loss_sum", "mlm_weight")]
    metrics = {
        "masked_lm_loss": ("mlm_loss_sum", "mlm_weight"),
        "masked_lm_accuracy": ("mlm_correct", "mlm_weight"),
    }
    if objective != "none":
        prefix = SENTENCE_METRIC_PREFIX[objective]
        loss_terms.append(("nsp_loss_sum", "nsp_count"))
        metrics[f"{prefix}_loss"] = ("nsp_loss_sum", "nsp_count")
        metrics[f"{prefix}_accuracy"] = ("nsp_correct", "nsp_count")
    if span_boundary:
        loss_terms.append(("sbo_loss_sum", "sbo_weight"))
        metrics["span_boundary_loss"] = ("sbo_loss_sum", "sbo_weight")
        metrics["span_boundary_accuracy"] = ("sbo_correct", "sbo_weight")
    return Task(model=model, sums_fn=sums_fn, loss_terms=loss_terms, metrics=metrics)
