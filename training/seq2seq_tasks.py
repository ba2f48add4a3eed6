"""The encoder-decoder task for the Trainer: teacher-forced cross-entropy on the decoder targets.

One task serves denoising pre-training (T5 span corruption, BART infilling) and text-to-text
fine-tuning: both are batches of input_ids, input_mask, target_ids, target_mask (see
data_prep/seq2seq_data.py). See training/trainer.py for the contract (sums_fn, loss_terms,
metrics).
"""

from __future__ import annotations

import tensorflow as tf

from modeling import bart, flops, losses, t5
from training.trainer import Task, float_shape


def decoder_input_ids(target_ids, start_id: int):
    """Teacher forcing: int (B, T) targets moved one right after start_id (T5's shift_right)."""
    start = tf.fill([tf.shape(target_ids)[0], 1], tf.cast(start_id, target_ids.dtype))  # (B, 1)
    return tf.concat([start, target_ids[:, :-1]], axis=1)  # (B, T)


def seq2seq_task(model) -> Task:
    """Mean cross-entropy over the real target tokens (every target token is predicted, </s>
    included; Raffel et al. 2020 sec. 3.1.4, Lewis et al. 2020 sec. 2.2). `model` a
    t5.T5Model or bart.BartModel (each config names its decoder start). Metrics: target_loss,
    target_accuracy (argmax == target, teacher forced); perplexity is exp(target_loss). Cloze's
    models return the loss terms, not the (B, T, V) logits (their lm_terms); another model with
    only lm_logits is scored from those."""
    terms = isinstance(model, t5.T5Model | bart.BartModel)

    def sums_fn(batch, training):
        inputs = {
            "input_ids": batch["input_ids"],
            "input_mask": batch["input_mask"],
            "decoder_input_ids": decoder_input_ids(
                batch["target_ids"], model.config.decoder_start_token_id
            ),
        }
        if terms:
            out = model(
                inputs | {"target_ids": batch["target_ids"]}, training=training, lm_terms=True
            )
            return losses.masked_lm_sums_of(out["lm_xent"], out["lm_hits"], batch["target_mask"])
        out = model(inputs, training=training)
        return losses.masked_lm_sums(out["lm_logits"], batch["target_ids"], batch["target_mask"])

    config = getattr(model, "config", None)
    count = {t5.T5Config: flops.t5_flops, bart.BartConfig: flops.bart_flops}.get(type(config))

    def flops_fn(batch):
        b, s = tf.unstack(float_shape(batch))
        return 3.0 * b * count(config, s, float_shape(batch, "target_ids")[1])

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "weight")],
        metrics={"target_loss": ("loss_sum", "weight"), "target_accuracy": ("correct", "weight")},
        flops_fn=flops_fn if count else None,  # another model logs no FLOP/s
    )
