"""modeling/flops.py: every count equals the matrix products of the model's traced forward graph
(helpers.graph_matmul_flops reads them from the ops' shapes), and the pretraining and
fine-tuning tasks' FLOPs (what the train log turns into FLOP/s) are 3 such passes, for any batch
shape; a frozen encoder's 1 (checked on TensorFlow's gradient graph too)."""

from __future__ import annotations

from types import SimpleNamespace

import keras
import pytest
import tensorflow as tf

from bench import pretrain_throughput
from modeling import (
    albert,
    bart,
    bert,
    electra,
    elmo,
    finetuning,
    flops,
    gpt,
    layers,
    span_qa,
    t5,
    tagging,
    xlnet,
)
from tests import helpers, test_bart, test_elmo, test_t5, test_xlnet
from training import (
    bilm_tasks,
    finetune_tasks,
    gpt_finetuning,
    plm_tasks,
    seq2seq_tasks,
    squad_eval,
    tasks,
)

B, S, P = 3, 7, 2
# E = 5 differs from H = 12 and from the generator's H_g = 3 (a quarter): every projection runs.
ELECTRA = helpers.TINY | {
    "embedding_size": 5,
    "generator_hidden_size": 0.25,
    "generator_layers": 1.0,
}


def traced(flops_fn):
    """`flops_fn` as the train step runs it: in a tf.function (autograph turns a Python
    conditional on a tensor into a tf.cond, whose branches must agree)."""
    return tf.function(flops_fn)


def spec(**extra):
    names = ["input_ids", "input_mask", "segment_ids"]
    out = {k: tf.TensorSpec([B, S], tf.int32) for k in names}
    out["masked_lm_positions"] = tf.TensorSpec([B, P], tf.int32)
    return out | {k: tf.TensorSpec([B, P], dtype) for k, dtype in extra.items()}


def batch_of(spec_, seed=0):
    """Random int tensors in [1, S) (ones for floats) of `spec_`'s shapes (ids, positions)."""
    rng = tf.random.Generator.from_seed(seed)
    return {
        k: (
            rng.uniform(v.shape, 0, S - 1, tf.int32) + 1
            if v.dtype == tf.int32
            else tf.ones(v.shape, v.dtype)
        )
        for k, v in spec_.items()
    }


@pytest.mark.parametrize(
    "family, objective, span_boundary",
    [
        ("bert", "nsp", False),
        ("bert", "none", False),
        ("bert", "nsp", True),
        ("albert", "sop", False),
        ("albert_inner", "sop", False),
    ],
)
def test_masked_lm_pretrainers_count_what_their_graph_multiplies(family, objective, span_boundary):
    if family.startswith("albert"):  # E != H: the embedding projection and narrower heads
        # albert_inner: 2 blocks a layer (inner_group_num), so 2 L blocks run, the last cut.
        inner = 2 if family == "albert_inner" else 1
        config = albert.AlbertConfig.from_dict(
            helpers.TINY | {"embedding_size": 5, "num_hidden_groups": 1, "inner_group_num": inner}
        )
        model = albert.AlbertPretrainer(config, objective)
    else:
        config = helpers.tiny_config()
        model = bert.BertPretrainer(config, objective, span_boundary=span_boundary)
    model.build()
    boundaries = {"masked_lm_span_left": tf.int32, "masked_lm_span_right": tf.int32}
    inputs = spec(**boundaries) if span_boundary else spec()
    forward = helpers.graph_matmul_flops(lambda x: model(x, training=False), inputs)
    if objective == "none":
        # The 2-way head exists in every BertPretrainer; RoBERTa trains none and its loss reads
        # none, so it is not counted (in a training step TensorFlow prunes it).
        forward -= B * flops.sentence_head_flops(config.hidden_size)
    counted = flops.mlm_pretraining_flops(config, S, P, objective != "none", span_boundary)
    assert B * counted == forward


def test_distillation_counts_every_position_of_student_and_teacher():
    config = helpers.tiny_config()
    model = bert.BertPretrainer(config)
    model.build()
    forward = helpers.graph_matmul_flops(
        lambda x: tasks._encode_and_predict(model, x, training=False), spec()
    )
    # The encoder's pooler (H x H on [CLS]) is traced too, but no output reads it: not counted
    # (a step's graph prunes it), by the graph counter nor by the task.
    assert B * flops.mlm_pretraining_flops(config, S, P, sentence_head=False, cut=False) == forward
    cut = flops.mlm_pretraining_flops(config, S, P, sentence_head=False)
    assert cut < forward / B  # the last layer at 1 + P of S positions costs less


def test_electra_counts_generator_and_discriminator():
    config = electra.ElectraConfig.from_dict(ELECTRA)
    assert config.generator_sizes() == (3, 2)  # E differs from both H and H_g
    model = electra.ElectraPretrainer(config)
    model.build()
    inputs = spec(masked_lm_ids=tf.int32, masked_lm_weights=tf.float32)
    forward = helpers.graph_matmul_flops(
        lambda x: model(x, training=False, seed=tf.constant([7, 8])), inputs
    )
    assert B * flops.electra_pretraining_flops(config, S, P) == forward


def test_gpt_counts_every_layer_and_the_vocabulary_at_every_position():
    config = gpt.GptConfig(n_vocab=53, n_ctx=16, n_embd=12, n_head=3, n_layer=2, n_inner=17)
    model = gpt.GptLM(config)
    model.build()
    inputs = {"input_ids": tf.TensorSpec([B, S], tf.int32)}
    forward = helpers.graph_matmul_flops(lambda x: model(x, training=False)["lm_logits"], inputs)
    assert B * flops.causal_lm_flops(config, S) == forward


T = 5  # target positions of the encoder-decoders
# The T5 and BART tests' tiny configs with a deeper decoder (and, T5, heads x d_kv = 15 apart
# from d_model = 12; BART, a wider decoder FFN).
T5_VALUES = test_t5.TINY | {"d_kv": 5, "num_decoder_layers": 3}
BART_VALUES = test_bart.TINY | {"decoder_layers": 3, "decoder_ffn_dim": 19}


@pytest.mark.parametrize("family", ["t5", "t5 gated", "bart"])
def test_encoder_decoders_count_what_their_graph_multiplies(family):
    """Heads x d_kv (15) differs from d_model (12), the decoder is deeper than the encoder and
    (BART) its FFN wider, so a swapped width or layer count cannot pass."""
    if family == "bart":
        config, count = bart.BartConfig(**BART_VALUES), flops.bart_flops
        model = helpers.tiny_encoder_decoder(bart.BartModel, bart.BartConfig, BART_VALUES)
    else:
        proj = "gated-gelu" if family == "t5 gated" else "relu"
        values = T5_VALUES | {"feed_forward_proj": proj}
        config, count = t5.T5Config(**values), flops.t5_flops
        model = helpers.tiny_encoder_decoder(t5.T5Model, t5.T5Config, values)
    inputs = {
        "input_ids": tf.TensorSpec([B, S], tf.int32),
        "input_mask": tf.TensorSpec([B, S], tf.int32),
        "decoder_input_ids": tf.TensorSpec([B, T], tf.int32),
    }
    forward = helpers.graph_matmul_flops(lambda x: model(x, training=False)["lm_logits"], inputs)
    assert B * count(config, S, T) == forward


def test_the_tasks_count_three_passes_of_the_batch_they_get():
    """Task.flops_fn evaluates the same polynomials on the batch's own shapes (a cut batch
    counts less), within float32 rounding."""
    config = helpers.tiny_config()
    model = bert.BertPretrainer(config)
    model.build()
    task = tasks.bert_pretraining_task(model)
    full = batch_of(spec())
    want = 3 * B * flops.mlm_pretraining_flops(config, S, P)
    assert float(task.flops_fn(full)) == pytest.approx(want, rel=1e-6)
    cut = {k: v[:2, :5] if k != "masked_lm_positions" else v[:2] for k, v in full.items()}
    assert float(task.flops_fn(cut)) == pytest.approx(
        3 * 2 * flops.mlm_pretraining_flops(config, 5, P), rel=1e-6
    )
    # keras-hub's pretrainer in the bench has these outputs but runs its own last layer whole:
    # not counted, so its runs log no FLOP/s rather than a wrong one.
    hub = tasks.bert_pretraining_task(pretrain_throughput.KerasHubPretrainer(config))
    assert hub.flops_fn is None
    roberta = tasks.bert_pretraining_task(bert.BertPretrainer(config, "none"))
    no_head = 3 * B * flops.mlm_pretraining_flops(config, S, P, sentence_head=False)
    assert float(roberta.flops_fn(full)) == pytest.approx(no_head, rel=1e-6)

    gpt_config = gpt.GptConfig(n_vocab=53, n_ctx=16, n_embd=12, n_head=3, n_layer=2)
    lm = tasks.causal_lm_task(gpt.GptLM(gpt_config))
    ids = {"input_ids": tf.zeros([B, S], tf.int32)}
    assert float(lm.flops_fn(ids)) == pytest.approx(
        3 * B * flops.causal_lm_flops(gpt_config, S), rel=1e-6
    )

    teacher = bert.BertPretrainer(helpers.tiny_config(num_hidden_layers=3))
    distil = tasks.distillation_task(model, teacher)
    student_pass, teacher_pass = (
        flops.mlm_pretraining_flops(m.config, S, P, sentence_head=False, cut=False)
        for m in (model, teacher)
    )
    assert teacher_pass > student_pass  # three layers against two
    assert float(distil.flops_fn(full)) == pytest.approx(
        B * (3 * student_pass + teacher_pass), rel=1e-6
    )

    t5_config = t5.T5Config(**T5_VALUES)
    seq2seq = seq2seq_tasks.seq2seq_task(
        helpers.tiny_encoder_decoder(t5.T5Model, t5.T5Config, T5_VALUES)
    )
    pairs = {"input_ids": full["input_ids"], "target_ids": tf.zeros([B, T], tf.int32)}
    assert float(seq2seq.flops_fn(pairs)) == pytest.approx(
        3 * B * flops.t5_flops(t5_config, S, T), rel=1e-6
    )
    bart_model = helpers.tiny_encoder_decoder(bart.BartModel, bart.BartConfig, BART_VALUES)
    assert float(seq2seq_tasks.seq2seq_task(bart_model).flops_fn(pairs)) == pytest.approx(
        3 * B * flops.bart_flops(bart.BartConfig(**BART_VALUES), S, T), rel=1e-6
    )

    e_config = electra.ElectraConfig.from_dict(ELECTRA)
    e_task = tasks.electra_pretraining_task(electra.ElectraPretrainer(e_config), 1, 0)
    assert float(e_task.flops_fn(full)) == pytest.approx(
        3 * B * flops.electra_pretraining_flops(e_config, S, P), rel=1e-6
    )


C = 4  # classes, choices or tags


def encoder_config(family):
    """The tiny encoder of `family`; ALBERT's and ELECTRA's E = 5 differs from H = 12."""
    if family == "albert":
        extra = {"embedding_size": 5, "num_hidden_groups": 1, "inner_group_num": 1}
        return albert.AlbertConfig.from_dict(helpers.TINY | extra)
    if family == "electra":
        return electra.ElectraConfig.from_dict(ELECTRA)
    return helpers.tiny_config()


def finetuning_model(kind, config, pooling="cls"):
    if kind == "classifier":
        model = finetuning.BertClassifier(config, C, pooling=pooling)
    elif kind == "choice":
        model = finetuning.BertMultipleChoice(config, pooling=pooling)
    elif kind == "span":
        model = span_qa.BertSpanQA(config)
    else:
        model = tagging.BertTagger(config, C)
    model.build()
    return model


@pytest.mark.parametrize(
    "kind, family, pooling",
    [
        ("classifier", "bert", "cls"),
        ("classifier", "bert", "mean"),
        ("classifier", "electra", "cls"),
        ("classifier", "albert", "cls"),
        ("choice", "bert", "cls"),
        ("choice", "electra", "mean"),
        ("span", "albert", None),
        ("span", "electra", None),
        ("tagger", "bert", None),
    ],
)
def test_finetuning_models_count_what_their_graph_multiplies(kind, family, pooling):
    """finetune_tasks.flops_fn (what run_classifier, run_squad and run_ner log) is 3 forward
    passes of the traced graph's matrix products per sequence, at two lengths (dynamic padding
    cuts batches)."""
    config = encoder_config(family)
    model = finetuning_model(kind, config, pooling)
    rows = (B, C) if kind == "choice" else (B,)
    count = finetune_tasks.flops_fn(model)
    for s in (S, 4):
        inputs = {
            k: tf.TensorSpec([*rows, s], tf.int32)
            for k in ("input_ids", "input_mask", "segment_ids")
        }
        # The encoder's pooler, traced but read by no output under mean pooling or a span or
        # tag head, is left out by the graph counter, as a step prunes it.
        forward = helpers.graph_matmul_flops(lambda x: model(x, training=False), inputs)
        batch = {k: tf.ones(v.shape, tf.int32) for k, v in inputs.items()}
        assert float(traced(count)(batch)) == pytest.approx(3 * forward, rel=1e-6)


def test_gpt_classifier_counts_its_language_model_and_head():
    config = gpt.GptConfig(n_vocab=53, n_ctx=16, n_embd=12, n_head=3, n_layer=2)
    model = gpt.GptClassifier(config, C)
    model.build()
    inputs = {k: tf.TensorSpec([B, S], tf.int32) for k in ("input_ids", "input_mask")}
    forward = helpers.graph_matmul_flops(lambda x: model(x, training=False), inputs)
    assert B * flops.gpt_classifier_flops(config, S, C) == forward
    task = gpt_finetuning.gpt_classification_task(model)
    batch = {k: tf.ones(v.shape, tf.int32) for k, v in inputs.items()}
    assert float(traced(task.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)


def test_xlnet_counts_both_streams_and_its_heads():
    """XLNet's pretrainer (content and query streams, the relative positions once a batch, the
    tied decoder at the targets), classifier (segments, summary, head) and span models (start and
    end logits at every position; the beam head's end and answer class from the gold starts):
    the task counts are
    3 forward passes of the traced graph's matrix products, at two batch sizes (the per-batch
    terms do not scale with the rows)."""
    config = test_xlnet.tiny_config()
    pretrainer = xlnet.XLNetPretrainer(config)
    pretrainer.build()
    plm = plm_tasks.permutation_lm_task(pretrainer)
    classifier = xlnet.XLNetClassifier(config, C)
    classifier.build()
    fine_tune = finetune_tasks.classification_task(classifier)
    span = xlnet.XLNetSpanQA(config)
    span.build()
    span_task = squad_eval.span_qa_task(span)
    beam = xlnet.XLNetBeamSpanQA(config)
    beam.build()
    beam_task = squad_eval.beam_span_qa_task(beam)
    for rows in (B, 1):
        inputs = {
            "input_ids": tf.TensorSpec([rows, S], tf.int32),
            "perm_mask": tf.TensorSpec([rows, S, S], tf.float32),
            "target_mapping": tf.TensorSpec([rows, P, S], tf.float32),
        }
        forward = helpers.graph_matmul_flops(lambda x: pretrainer(x, training=False), inputs)
        assert flops.xlnet_pretraining_flops(config, S, P, rows) == forward
        batch = {k: tf.ones(v.shape, v.dtype) for k, v in inputs.items()}
        assert float(traced(plm.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)
        # With a memory of M slots (segment recurrence): its keys and values, M more keys and
        # distances; the task counts its SegmentMemory's.
        M = 3
        mems = [tf.TensorSpec([rows, M, config.d_model], tf.float32)] * config.n_layer
        forward = helpers.graph_matmul_flops(
            lambda x: pretrainer(x, training=False), inputs | {"mems": mems}
        )
        assert flops.xlnet_pretraining_flops(config, S, P, rows, M) == forward
        remembers = plm_tasks.permutation_lm_task(
            pretrainer, plm_tasks.SegmentMemory(config, rows, M)
        )
        assert float(traced(remembers.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)

        inputs = {
            k: tf.TensorSpec([rows, S], tf.int32)
            for k in ("input_ids", "input_mask", "segment_ids")
        }
        forward = helpers.graph_matmul_flops(lambda x: classifier(x, training=False), inputs)
        assert flops.xlnet_classifier_flops(config, S, rows, C) == forward
        batch = {k: tf.ones(v.shape, tf.int32) for k, v in inputs.items()}
        assert float(traced(fine_tune.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)
        forward = helpers.graph_matmul_flops(lambda x: span(x, training=False), inputs)
        assert flops.xlnet_span_qa_flops(config, S, rows) == forward
        assert float(traced(span_task.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)
        # The beam head in training: the gold starts' end logits and answer class.
        beam_inputs = {**inputs, "start_positions": tf.TensorSpec([rows], tf.int32)}
        forward = helpers.graph_matmul_flops(lambda x: beam(x, training=False), beam_inputs)
        assert flops.xlnet_beam_span_qa_flops(config, S, rows) == forward
        batch = {k: tf.ones(v.shape, tf.int32) for k, v in beam_inputs.items()}
        assert float(traced(beam_task.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)


@pytest.mark.parametrize("char_cnn", [True, False])
def test_elmo_counts_its_convolutions_every_lstm_step_and_both_softmaxes(char_cnn):
    """ElmoLM (character CNN or token embeddings): each LSTM's loop body counted once a time
    step, and the bilm task's count is 3 such passes."""
    config = test_elmo.config(char_cnn=char_cnn)
    model = elmo.ElmoLM(config)
    model.build()
    inputs = {"input_ids": tf.TensorSpec([B, S], tf.int32)}
    forward = helpers.graph_matmul_flops(lambda x: model(x, training=False), inputs, S)
    assert B * flops.elmo_lm_flops(config, S) == forward
    task = bilm_tasks.bilm_task(model)
    batch = {"input_ids": tf.ones([B, S], tf.int32)}
    assert float(traced(task.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)


MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")


def tagger(config, mode="finetune", lstm_units=0, cached=False):
    """A built tagger of modeling/tagging.py: BertTagger or ElmoTagger by the config, or a
    FeatureTagger (`cached`), with a two-layer BiLSTM of `lstm_units` when given (the second
    layer reads the first's 2 units)."""
    model = tagging.tagger_class(config, cached)(
        config, C, feature_mode=mode, lstm_units=lstm_units, lstm_layers=2
    )
    model.build()
    return model


def tagger_inputs(model, s):
    config = model.config
    names = ("input_ids", "input_mask") if tagging.is_elmo(config) else MODEL_INPUTS
    out = {k: tf.TensorSpec([B, s], tf.int32) for k in names}
    if isinstance(model, tagging.FeatureTagger) and not isinstance(model, tagging.ElmoTagger):
        n = tagging.encoder_layers(config) + 1
        out["layer_features"] = tf.TensorSpec([B, s, n, tagging.feature_width(config)])
    return out


def frozen_forward(model, inputs, s):
    """The matrix products of the frozen encoder's forward pass alone (what model.features or
    the biLM computes for the outputs the model reads); 0 where the features come cached."""
    if isinstance(model, elmo.ElmoClassifier):
        return helpers.graph_matmul_flops(
            lambda x: elmo.elmo_layer_outputs(model.encoder, x["input_ids"], x["input_mask"]),
            inputs,
            s,
        )
    if not model.frozen or not hasattr(model, "features"):
        return 0
    return helpers.graph_matmul_flops(lambda x: model.features(x), inputs, s)


@pytest.mark.parametrize(
    "family, mode, lstm_units, cached",
    [
        ("bert", "finetune", 3, False),  # a fine-tuned encoder under a BiLSTM
        ("bert", "second_to_last", 0, False),  # frozen, the top block pruned
        ("albert", "concat_last_four", 2, False),  # ALBERT's inner blocks, 4 H wide features
        ("bert", "embeddings", 0, False),  # no block runs
        ("bert", "sum_all", 3, True),  # run_ner --feature_cache: the head alone
        ("elmo", "sum_all", 0, False),  # ELMo's frozen biLM, every layer
        # Its token layer alone, a BiLSTM over it: every biLM layer still runs (stateful loops)
        ("elmo", "embeddings", 3, False),
        ("elmo", "sum_all", 2, True),
        ("xlnet", "finetune", 0, False),  # XLNet's content streams, fine-tuned
        ("xlnet", "second_to_last", 2, False),  # frozen, the top layer pruned
        ("xlnet", "embeddings", 0, False),  # no layer runs
    ],
)
def test_frozen_encoders_count_once_and_their_heads_three_times(family, mode, lstm_units, cached):
    """A frozen encoder runs forward only (no trained weight below it: its backward pass is
    skipped): a Transformer up to the deepest layer the tagger reads, ELMo's biLM whole; the
    head (the BiLSTM's every step, the linear layer) trains, 3 passes. Both parts equal the
    traced graph's products, at two lengths. ALBERT's case runs 2 inner blocks a layer; XLNet's
    content streams count their relative positions once a batch."""
    if family == "elmo":
        config = test_elmo.config(n_tokens_vocab=helpers.TINY["vocab_size"])
    elif family == "xlnet":
        config = test_xlnet.tiny_config()
    elif family == "albert":
        config = encoder_config("albert")
        config = albert.AlbertConfig.from_dict(config.to_dict() | {"inner_group_num": 2})
    else:
        config = encoder_config(family)
    model = tagger(config, mode, lstm_units, cached)
    count = finetune_tasks.token_tagging_task(model).flops_fn
    for s in (S, 4):
        inputs = tagger_inputs(model, s)
        forward = helpers.graph_matmul_flops(lambda x: model(x, training=False), inputs, s)
        encoder = frozen_forward(model, inputs, s)
        assert forward > encoder
        if mode == "second_to_last" and family != "xlnet":  # the top block feeds nothing
            below_top = flops.backbone_flops(config, s, blocks=config.num_hidden_layers - 1)
            assert encoder == B * below_top < B * flops.backbone_flops(config, s)
        batch = {k: tf.ones(v.shape, v.dtype) for k, v in inputs.items()}
        want = 3 * (forward - encoder) + encoder
        assert float(traced(count)(batch)) == pytest.approx(want, rel=1e-6)


def test_elmo_classifier_counts_its_bilm_once_and_its_head_three_times():
    config = test_elmo.config(n_tokens_vocab=helpers.TINY["vocab_size"])
    inputs = {k: tf.TensorSpec([B, S], tf.int32) for k in ("input_ids", "input_mask")}
    batch = {k: tf.ones(v.shape, v.dtype) for k, v in inputs.items()}
    for outputs, task_of in (
        (C, finetune_tasks.classification_task),
        (1, finetune_tasks.regression_task),
    ):
        model = elmo.ElmoClassifier(config, outputs)
        model.build()
        forward = helpers.graph_matmul_flops(lambda x, m=model: m(x, training=False), inputs, S)
        encoder = frozen_forward(model, inputs, S)
        assert B * flops.elmo_bilm_flops(config, S) == encoder
        assert forward - encoder == B * 2 * config.output_dim * outputs  # the head, pooled
        want = 3 * (forward - encoder) + encoder
        assert float(traced(task_of(model).flops_fn)(batch)) == pytest.approx(want, rel=1e-6)


def gradients_of(model):
    """x -> the gradients of a loss of model(x) with respect to its trained weights."""

    def gradients(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=False) ** 2)
        return tape.gradient(loss, model.trainable_variables)

    return gradients


def test_a_frozen_encoders_backward_pass_is_skipped_as_counted():
    """The convention's claim, checked on TensorFlow's own gradient graph: the products the
    gradients of a frozen-feature tagger's loss (a scalar mix, so its head's input needs a
    gradient too) need are the encoder's forward pass once and the head's three; a fine-tuned
    tagger's are exactly three forward passes. (The counts stop at the gradients: the
    optimizer's update has no matrix products.)"""
    config = helpers.tiny_config(num_hidden_layers=3)  # 4 outputs: the last four's mix
    for mode in ("sum_last_four", "finetune"):
        model = tagger(config, mode)
        inputs = tagger_inputs(model, S)
        step = helpers.graph_matmul_flops(gradients_of(model), inputs)
        batch = {k: tf.ones(v.shape, v.dtype) for k, v in inputs.items()}
        count = float(traced(finetune_tasks.token_tagging_task(model).flops_fn)(batch))
        assert step == pytest.approx(count, rel=1e-6), mode


def test_models_not_counted_log_no_flops():
    """A model modeling/flops has no count for (keras-hub's classifier in the bench) gets no
    flops_fn, so its run logs no FLOP/s rather than a wrong one."""
    hub = keras.Model()
    assert finetune_tasks.flops_fn(hub) is None
    assert finetune_tasks.classification_task(hub).flops_fn is None


def test_counts_grow_as_the_formulas_say():
    """Hand-checked small cases, so a formula cannot drift with its graph test."""
    # One layer, S = 2, H = 1, I = 1: 8*2 + 4*4 + 4*2 = 40; the last layer at Q = 1: 4*2 + 4 +
    # 4*2 + 4 = 24; with E = 3 the projection adds 2*2*3 = 12.
    assert flops.encoder_flops(2, 1, 1, 1) == 40
    assert flops.encoder_flops(2, 1, 1, 1, q=1) == 24
    assert flops.encoder_flops(2, 1, 1, 1, e=3) == 52
    assert flops.encoder_flops(2, 1, 1, 1, e=1) == 40  # E = H: no projection
    # remove_padding at 1 row of the 2 positions: a full layer skips one position's projections
    # and FFN, 8 + 4 = 12; a last layer at Q = 1 one position's K and V, 4.
    assert flops.encoder_flops(2, 1, 1, 1, rows=1) == 28
    assert flops.encoder_flops(2, 1, 1, 1, q=1, rows=1) == 20
    assert flops.encoder_flops(2, 1, 1, 1, e=3, rows=1) == 40  # the projection stays padded
    assert flops.mlm_head_flops(2, 3, 5, 7) == 2 * 2 * 3 * 5 + 2 * 2 * 5 * 7
    assert flops.sentence_head_flops(3) == 18 + 12
    # XLNet, one layer, S = 2 (R = 3 distances), H = 2, one head of depth 1, F = 1: the content
    # stream 8*2*2 + (4*4 + 2*2*3) + 4*2*2 = 76, the distances' keys 2*3*2 = 12 a batch, the
    # sinusoids 3*2 = 6; the query stream at P = 1 adds 4*2 + 4*2 + 28 + 4*2 = 52 a sequence.
    x = SimpleNamespace(d_model=2, n_head=1, d_head=1, d_inner=1, n_layer=1)
    assert flops.xlnet_flops(x, 2, 1) == 76 + 12 + 6
    assert flops.xlnet_flops(x, 2, 2) == 2 * 76 + 12 + 6  # the per-batch terms once
    assert flops.xlnet_flops(x, 2, 1, p=1) == 76 + 52 + 12 + 6
    assert flops.xlnet_flops(x, 2, 1, segments=True) == 76 + 8 + 12 + 6  # 4*2*1 by segment
    # With m = 1 slot of memory: R = 4, K = 3 keys: the content stream 8*2*2 + 4*1*2 (the
    # memory's K and V) + (4*2*3 + 2*2*4) + 4*2*2 = 96, the distances' keys 2*4*2 = 16, the
    # sinusoids 4*2 = 8.
    assert flops.xlnet_flops(x, 2, 1, m=1) == 96 + 16 + 8
    # ELMo, S = 1, P = 1, D = 1, one layer, V = 1: the cells 2 directions x (16 + 2), the two
    # softmaxes 2*2 = 40; a character CNN over C = 3 characters of E = 1 with filters of widths
    # 1 and 2 (one each): 2*3*1 + 2*2*2 = 14, one highway layer over F = 2: 4*2*2 = 16, the
    # projection 2*2*1 = 4.
    cnn = SimpleNamespace(
        max_characters_per_token=3,
        embedding=SimpleNamespace(dim=1),
        filters=[(1, 1), (2, 1)],
        num_filters=2,
        n_highway=1,
    )
    lstm = SimpleNamespace(projection_dim=1, dim=1, n_layers=1)
    assert flops.char_cnn_flops(cnn, 1) == 14 + 16 + 4
    # A BiLSTM, S = 1, W = 1, U = 1: per direction the four gates' input and recurrent products
    # 2*4 + 2*4 = 16, both directions 32; a second layer reads W = 2: 2 x (2*4*2 + 2*4) = 48.
    # A tagger head over it adds the linear layer 2*2*2 = 8 (2 U wide in, C = 2).
    assert flops.bilstm_flops(1, 1, 1, 1) == 32
    assert flops.bilstm_flops(1, 1, 1, 2) == 32 + 48
    assert flops.tagger_head_flops(1, 1, 2, 1, 2) == 80 + 8
    assert flops.tagger_head_flops(1, 3, 2) == 2 * 3 * 2  # no BiLSTM: the linear layer
    # ALBERT runs L x inner_group_num blocks.
    assert flops.transformer_blocks(SimpleNamespace(num_hidden_layers=3, inner_group_num=2)) == 6
    assert flops.elmo_lm_flops(SimpleNamespace(lstm=lstm, char_cnn=None, n_tokens_vocab=1), 1) == 40
    # Tensors in, the same numbers out (what the tasks pass in a step).
    s = tf.constant(2.0)
    assert float(flops.encoder_flops(s, 1, 1, 1, q=s / 2)) == 24
    assert float(flops.xlnet_flops(x, s, tf.constant(1.0), p=s / 2)) == 76 + 52 + 12 + 6


# A batch with padding for the remove_padding counts: 12 sequences of 16 positions, 93 real
# (lengths 16, 9, 4, 2 in turn), so the rows run (93 counted up to 128 in one branch, 56 and 37
# up to 64 each in two) are fewer than the 192 positions, and more than the real tokens.
UNPAD_LENGTHS = [16, 9, 4, 2] * 3


def unpadded_batch(kind):
    """A batch of UNPAD_LENGTHS' sequences for a model of `kind` (multiple choice: 6 x 2)."""
    s = helpers.TINY["max_position_embeddings"]
    rng = tf.random.Generator.from_seed(3)
    mask = tf.sequence_mask(UNPAD_LENGTHS, s, tf.int32)
    batch = {
        "input_ids": (rng.uniform(mask.shape, 1, helpers.TINY["vocab_size"], tf.int32)) * mask,
        "input_mask": mask,
        "segment_ids": tf.zeros_like(mask),
    }
    if kind in ("pretrainer", "electra", "distillation"):
        positions = tf.tile(tf.constant([[1, 0]], tf.int32), [len(UNPAD_LENGTHS), 1])
        batch |= {
            "masked_lm_positions": positions,
            "masked_lm_ids": tf.ones_like(positions),
            "masked_lm_weights": tf.cast(positions > 0, tf.float32),
            # SpanBERT's boundaries (the positions' neighbours); other models ignore them.
            "masked_lm_span_left": tf.maximum(positions - 1, 0),
            "masked_lm_span_right": positions + 1,
        }
    if kind == "choice":
        batch = {k: tf.reshape(v, [6, 2, s]) for k, v in batch.items()}
    return batch


@pytest.mark.parametrize("branches", [1, 2])
@pytest.mark.parametrize(
    "kind, family",
    [
        ("pretrainer", "bert"),
        ("pretrainer", "albert"),
        ("pretrainer", "spanbert"),
        ("electra", "electra"),
        ("distillation", "bert"),
        ("classifier", "bert"),
        ("classifier_mean", "electra"),
        ("choice", "albert"),
        ("span", "bert"),
        ("tagger", "bert"),
        ("tagger_frozen", "bert"),
    ],
)
def test_remove_padding_counts_the_products_it_runs(kind, family, branches):
    """Under remove_padding (bert.set_remove_padding) every task's FLOPs are 3 passes (a frozen
    encoder's 1) of the products a run of the batch executes, their shapes read at run time
    (the rows are the batch's real tokens, counted up per branch), and fewer than the padded
    layout's count: the logged FLOP/s measure the work run."""
    config = encoder_config(family if family != "spanbert" else "bert")
    teacher = None

    def forward(m, x):
        return m(x, training=False)

    if kind == "pretrainer":
        span = family == "spanbert"
        model = (
            albert.AlbertPretrainer(config, "sop")
            if family == "albert"
            else bert.BertPretrainer(config, span_boundary=span)
        )
        model.build()
        task = tasks.bert_pretraining_task(model)
    elif kind == "electra":
        model = electra.ElectraPretrainer(config)
        model.build()
        task = tasks.electra_pretraining_task(model, 1, 0)

        def forward(m, x):
            return m(x, training=False, seed=tf.constant([7, 8]))

    elif kind == "distillation":
        model = bert.BertPretrainer(config)
        model.build()
        teacher = bert.BertPretrainer(helpers.tiny_config(num_hidden_layers=3))
        teacher.build()
        task = tasks.distillation_task(model, teacher)

        def forward(m, x):
            return tasks._encode_and_predict(m, x, training=False)

    elif kind.startswith("tagger"):
        model = tagger(config, "second_to_last" if kind == "tagger_frozen" else "finetune")
        task = finetune_tasks.token_tagging_task(model)
    else:
        pooling = "mean" if kind == "classifier_mean" else "cls"
        model = finetuning_model(kind.removesuffix("_mean"), config, pooling)
        task = finetune_tasks.classification_task(model)

    batch = unpadded_batch(kind)
    padded = float(traced(task.flops_fn)(batch))
    for m in (model, teacher) if teacher else (model,):
        bert.set_encoder_branches(m, branches)
        bert.set_remove_padding(m, True)
    counted = float(traced(task.flops_fn)(batch))
    run = helpers.executed_matmul_flops(lambda x: forward(model, x), batch)
    if kind == "distillation":
        want = 3 * run + helpers.executed_matmul_flops(lambda x: forward(teacher, x), batch)
    elif kind == "tagger_frozen":
        encoder = helpers.executed_matmul_flops(lambda x: model.features(x), batch)
        want = 3 * (run - encoder) + encoder
    else:
        want = 3 * run
    assert counted == pytest.approx(want, rel=1e-6)
    assert counted < padded
    # The rows: 128 in one branch or two (UNPAD_LENGTHS), against 192 positions.
    assert float(bert.unpadded_rows(model, batch["input_mask"])) == 128


def test_remove_padding_counts_the_training_steps_products():
    """The 3-pass convention under remove_padding, on TensorFlow's own gradient graph run on a
    padded batch: the products a fine-tuned tagger's gradients need (forward and backward,
    scattered and gathered rows) are the task's count."""
    model = tagger(helpers.tiny_config())
    bert.set_remove_padding(model, True)
    batch = unpadded_batch("tagger")
    step = helpers.executed_matmul_flops(gradients_of(model), batch)
    count = float(traced(finetune_tasks.token_tagging_task(model).flops_fn)(batch))
    assert step == pytest.approx(count, rel=1e-6)


def test_unpadded_rows_need_one_setting_and_count_the_real_tokens_up():
    """bert.unpadded_rows: None on the padded layout; the rows layers.Unpadded runs, per
    branch; encoders that differ in the setting are an error rather than a wrong count."""
    model = finetuning_model("classifier", helpers.tiny_config())
    mask = tf.sequence_mask([16, 9, 4, 2], 16, tf.int32)
    assert bert.unpadded_rows(model, mask) is None
    bert.set_remove_padding(model, True)
    assert float(bert.unpadded_rows(model, mask)) == 64  # 31 real
    assert float(bert.unpadded_rows(model, tf.zeros([2, 16], tf.int32))) == 64  # one row, up
    assert float(bert.unpadded_rows(model, tf.zeros([0, 16], tf.int32))) == 0
    bert.set_encoder_branches(model, 3)  # slices of 2, 1, 1 rows: 25, 4, 2 real
    assert float(bert.unpadded_rows(model, mask)) == 3 * 64
    assert int(layers.unpadded_rows(tf.ones([3, 43], tf.int32))) == 192  # 129 real
    pair = keras.layers.Layer()
    pair.first, pair.second = model.encoder, bert.BertEncoder(helpers.tiny_config())
    with pytest.raises(ValueError, match="differ in"):
        bert.unpadded_rows(pair, mask)
