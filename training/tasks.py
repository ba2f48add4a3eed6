"""Task definitions for the Trainer: what each objective's step computes, as sums.

See training/trainer.py for the contract (sums_fn, loss_terms, metrics).
"""

from __future__ import annotations

import tensorflow as tf

from modeling import albert, bert, flops, gpt, losses
from training.trainer import Task, float_shape, rows_per_sequence

# Metric names of the sentence-level objectives; "next_sentence" keeps the original BERT names.
SENTENCE_METRIC_PREFIX = {"nsp": "next_sentence", "sop": "sentence_order"}


def _predictions(batch):
    """float32 scalar: the masked positions per sequence, P of masked_lm_positions (B, P)."""
    return float_shape(batch, "masked_lm_positions")[1]


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
        if "mlm_xent" in out:  # the pretrainer's fused head (bert.pretraining_outputs)
            mlm = losses.masked_lm_sums_of(
                out["mlm_xent"], out["mlm_hits"], batch["masked_lm_weights"]
            )
        else:
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

    def denominators_fn(batch):
        masked = tf.reduce_sum(tf.cast(batch["masked_lm_weights"], tf.float32))
        rows = tf.cast(tf.shape(batch["input_ids"])[0], tf.float32)
        return {"mlm_weight": masked, "nsp_count": rows, "sbo_weight": masked}

    def flops_fn(batch):
        b, s = tf.unstack(float_shape(batch))
        forward = flops.mlm_pretraining_flops(
            model.config,
            s,
            _predictions(batch),
            objective != "none",
            span_boundary,
            rows=rows_per_sequence(model, batch),
        )
        return 3.0 * b * forward

    # Counted for Cloze's pretrainers (their config, their last layer cut to what the heads
    # read); another model with these outputs (the bench's keras-hub one) logs no FLOP/s.
    counted = isinstance(getattr(model, "config", None), bert.BertConfig | albert.AlbertConfig)
    return Task(model, sums_fn, loss_terms, metrics, denominators_fn, flops_fn if counted else None)


def causal_lm_task(model) -> Task:
    """Next-token prediction on language-model blocks (GPT, Radford et al. 2018 sec. 3.1): mean
    cross-entropy over every position but the last. Perplexity is exp(lm_loss). The model
    returns the loss terms, not the (B, T, V) logits (gpt.GptLM's lm_terms); another model
    with only lm_logits is scored from those."""

    def sums_fn(batch, training):
        inputs = {"input_ids": batch["input_ids"]}
        if isinstance(model, gpt.GptLM):
            out = model(inputs, training=training, lm_terms=True)
            return losses.causal_lm_sums_of(out["lm_xent"], out["lm_hits"])
        out = model(inputs, training=training)
        return losses.causal_lm_sums(out["lm_logits"], batch["input_ids"])

    def denominators_fn(batch):
        shape = tf.shape(batch["input_ids"])  # every position but the last predicts
        return {"weight": tf.cast(shape[0] * (shape[1] - 1), tf.float32)}

    def flops_fn(batch):
        b, s = tf.unstack(float_shape(batch))
        return 3.0 * b * flops.causal_lm_flops(model.config, s)

    # Counted for a GPT config; another model (the bench's keras-hub one) logs no FLOP/s.
    counted = isinstance(getattr(model, "config", None), gpt.GptConfig)
    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "weight")],
        metrics={"lm_loss": ("loss_sum", "weight"), "lm_accuracy": ("correct", "weight")},
        denominators_fn=denominators_fn,
        flops_fn=flops_fn if counted else None,
    )


# ELECTRA's discriminator loss weight lambda (Clark et al. 2020, sec. 2 and Appendix A: 50).
ELECTRA_DISC_WEIGHT = 50.0


def sampling_seed(seed: int, step):
    """A stateless seed (int64 (2,)) for one step's random draws: the run's seed folded with the
    step counter and the replica, so a resumed run draws what an uninterrupted one would and
    replicas draw independently. `step`: the optimizer's iterations (constant during eval)."""
    context = tf.distribute.get_replica_context()
    replica = 0 if context is None else context.replica_id_in_sync_group
    base = tf.constant([seed, 0], tf.int64)
    folded = tf.random.experimental.stateless_fold_in(base, tf.cast(step, tf.int64))
    return tf.random.experimental.stateless_fold_in(folded, tf.cast(replica, tf.int64))


def electra_pretraining_task(
    model, seed: int, step, disc_weight: float = ELECTRA_DISC_WEIGHT
) -> Task:
    """ELECTRA (Clark et al. 2020, sec. 2): L_MLM(generator) + disc_weight * L_Disc.

    `model` an electra.ElectraPretrainer. The generator's loss is the mean cross-entropy over
    real masked predictions; the discriminator's the mean sigmoid cross-entropy over real tokens.
    Samples are drawn with sampling_seed(seed, step). Metrics keep the original's names:
    sampled_masked_lm_accuracy is how often the sample equals the original token.
    """

    def sums_fn(batch, training):
        out = model(batch, training=training, seed=sampling_seed(seed, step))
        w = batch["masked_lm_weights"]
        mlm = losses.masked_lm_sums(out["mlm_logits"], batch["masked_lm_ids"], w)
        disc = losses.replaced_token_sums(
            out["disc_logits"], out["disc_labels"], batch["input_mask"]
        )
        same = tf.cast(
            tf.equal(out["sampled_ids"], tf.cast(batch["masked_lm_ids"], tf.int32)), tf.float32
        )
        sums = {f"mlm_{k}": v for k, v in mlm.items()} | {f"disc_{k}": v for k, v in disc.items()}
        sums |= detection_balance_sums(out["disc_logits"], out["disc_labels"], batch["input_mask"])
        return sums | {"sampled_correct": tf.reduce_sum(same * tf.cast(w, tf.float32))}

    def denominators_fn(batch):
        return {
            "mlm_weight": tf.reduce_sum(tf.cast(batch["masked_lm_weights"], tf.float32)),
            "disc_count": tf.reduce_sum(tf.cast(batch["input_mask"], tf.float32)),
        }

    def flops_fn(batch):
        b, s = tf.unstack(float_shape(batch))
        rows = rows_per_sequence(model, batch)
        return 3.0 * b * flops.electra_pretraining_flops(model.config, s, _predictions(batch), rows)

    return Task(
        model=model,
        sums_fn=sums_fn,
        denominators_fn=denominators_fn,
        flops_fn=flops_fn,
        loss_terms=[("mlm_loss_sum", "mlm_weight"), ("disc_loss_sum", "disc_count", disc_weight)],
        metrics={
            "masked_lm_loss": ("mlm_loss_sum", "mlm_weight"),
            "masked_lm_accuracy": ("mlm_correct", "mlm_weight"),
            "sampled_masked_lm_accuracy": ("sampled_correct", "mlm_weight"),
            "disc_loss": ("disc_loss_sum", "disc_count"),
            "disc_accuracy": ("disc_correct", "disc_count"),
            "disc_precision": ("disc_true_positive", "disc_predicted"),
            "disc_recall": ("disc_true_positive", "disc_replaced"),
            # Class balance: a discriminator calling every token original scores
            # 1 - replaced_fraction in disc_accuracy, 1.0 in disc_original_accuracy, 0 recall, and
            # an AUC of 0.5 unless it ranks replaced tokens above original ones.
            "disc_replaced_fraction": ("disc_replaced", "disc_count"),
            "disc_original_accuracy": ("disc_true_negative", "disc_original"),
            "disc_replaced_prob": ("disc_prob_replaced", "disc_replaced"),
            "disc_original_prob": ("disc_prob_original", "disc_original"),
            "disc_auc": ("disc_ordered_pairs", "disc_pairs"),
        },
    )


def detection_balance_sums(logits, labels, input_mask) -> dict:
    """Sums for replaced-token detection per class, so a collapse to the majority class shows.

    logits float (B, S), > 0 meaning replaced; labels int (B, S); input_mask (B, S). Returns
    float32 scalars: true_negative and original (real tokens called / that are original),
    prob_replaced and prob_original (sums of sigmoid(logit) over each class), and for the ROC
    AUC within each batch (Mann-Whitney: the fraction of (replaced, original) pairs of the
    batch's real tokens where the replaced one scores higher) ordered_pairs and pairs. Ties,
    which float logits almost never make, count as ordered or not by the sort's order.
    """
    z = tf.reshape(tf.cast(logits, tf.float32), [-1])  # (B*S,)
    y = tf.reshape(tf.cast(labels, tf.float32), [-1])
    w = tf.reshape(tf.cast(input_mask, tf.float32), [-1])
    called = tf.cast(z > 0, tf.float32)
    p = tf.sigmoid(z)
    n_r = tf.reduce_sum(y * w)
    n_o = tf.reduce_sum((1.0 - y) * w)
    # Padding sorts below every real token; a replaced token's rank (0-based, ascending) counts
    # the padding, the replaced tokens and the original tokens below it: keep the last.
    ranked = tf.where(w > 0, z, tf.fill(tf.shape(z), -3.0e38))
    rank = tf.cast(tf.argsort(tf.argsort(ranked, stable=True), stable=True), tf.float32)
    n_pad = tf.reduce_sum(1.0 - w)
    ordered = tf.reduce_sum(rank * y * w) - n_r * n_pad - n_r * (n_r - 1.0) / 2.0
    return {
        "disc_true_negative": tf.reduce_sum((1.0 - called) * (1.0 - y) * w),
        "disc_original": n_o,
        "disc_prob_replaced": tf.reduce_sum(p * y * w),
        "disc_prob_original": tf.reduce_sum(p * (1.0 - y) * w),
        "disc_ordered_pairs": ordered,
        "disc_pairs": n_r * n_o,
    }


def _encode_and_predict(model, batch, training):
    """A BertPretrainer's last hidden states (B, S, H) and MLM logits (B, P, V), in one pass."""
    out = model.encoder(batch, training=training)
    table = model.encoder.embeddings.word_embeddings
    logits = model.masked_lm(out["sequence_output"], batch["masked_lm_positions"], table)
    return out["sequence_output"], logits


def distillation_task(
    student,
    teacher,
    temperature: float = 2.0,
    alpha_ce: float = 5.0,
    alpha_mlm: float = 2.0,
    alpha_cos: float = 1.0,
) -> Task:
    """DistilBERT (Sanh et al. 2019, sec. 2): alpha_ce * soft-target loss at `temperature` +
    alpha_mlm * masked LM + alpha_cos * cosine loss of the last hidden states.

    `student` and `teacher` are BertPretrainers of one vocabulary and hidden size; the teacher
    runs without dropout and is not trained (its variables are not the student's). The soft
    targets are the teacher's MLM distributions at the masked positions (the MLM head scores only
    those; DistilBERT's --restrict_ce_to_mask); the cosine loss covers every real token.
    """

    def sums_fn(batch, training):
        hidden, logits = _encode_and_predict(student, batch, training)
        t_hidden, t_logits = _encode_and_predict(teacher, batch, False)
        t_hidden, t_logits = tf.stop_gradient(t_hidden), tf.stop_gradient(t_logits)
        w = batch["masked_lm_weights"]
        mlm = losses.masked_lm_sums(logits, batch["masked_lm_ids"], w)
        soft = losses.soft_target_sums(logits, t_logits, w, temperature)
        cos = losses.cosine_sums(hidden, t_hidden, batch["input_mask"])
        return (
            {f"mlm_{k}": v for k, v in mlm.items()}
            | {f"soft_{k}": v for k, v in soft.items()}
            | {f"cos_{k}": v for k, v in cos.items()}
        )

    def denominators_fn(batch):
        masked = tf.reduce_sum(tf.cast(batch["masked_lm_weights"], tf.float32))
        tokens = tf.reduce_sum(tf.cast(batch["input_mask"], tf.float32))
        return {"soft_weight": masked, "mlm_weight": masked, "cos_count": tokens}

    def flops_fn(batch):
        # Both encoders run every layer at every position (the cosine loss reads all hidden
        # states); the student trains (3 passes), the frozen teacher runs forward only.
        b, s = tf.unstack(float_shape(batch))
        p = _predictions(batch)
        student_pass, teacher_pass = (
            flops.mlm_pretraining_flops(
                m.config, s, p, sentence_head=False, cut=False, rows=rows_per_sequence(m, batch)
            )
            for m in (student, teacher)
        )
        return b * (3.0 * student_pass + teacher_pass)

    return Task(
        model=student,
        sums_fn=sums_fn,
        denominators_fn=denominators_fn,
        flops_fn=flops_fn,
        loss_terms=[
            ("soft_loss_sum", "soft_weight", alpha_ce),
            ("mlm_loss_sum", "mlm_weight", alpha_mlm),
            ("cos_loss_sum", "cos_count", alpha_cos),
        ],
        metrics={
            "masked_lm_loss": ("mlm_loss_sum", "mlm_weight"),
            "masked_lm_accuracy": ("mlm_correct", "mlm_weight"),
            "soft_target_loss": ("soft_loss_sum", "soft_weight"),
            "cosine_loss": ("cos_loss_sum", "cos_count"),
        },
    )
