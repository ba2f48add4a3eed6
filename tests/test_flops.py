"""modeling/flops.py: every count equals the matrix products of the model's traced forward graph
(helpers.graph_matmul_flops reads them from the ops' shapes), and the pretraining and
fine-tuning tasks' FLOPs (what the train log turns into FLOP/s) are 3 such passes, for any batch
shape."""

from __future__ import annotations

from types import SimpleNamespace

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
    ],
)
def test_masked_lm_pretrainers_count_what_their_graph_multiplies(family, objective, span_boundary):
    if family == "albert":  # E != H: the embedding projection and narrower heads are counted
        config = albert.AlbertConfig.from_dict(
            helpers.TINY | {"embedding_size": 5, "num_hidden_groups": 1, "inner_group_num": 1}
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
    tied decoder at the targets) and classifier (segments, summary, head): the task counts are
    3 forward passes of the traced graph's matrix products, at two batch sizes (the per-batch
    terms do not scale with the rows)."""
    config = test_xlnet.tiny_config()
    pretrainer = xlnet.XLNetPretrainer(config)
    pretrainer.build()
    plm = plm_tasks.permutation_lm_task(pretrainer)
    classifier = xlnet.XLNetClassifier(config, C)
    classifier.build()
    fine_tune = finetune_tasks.classification_task(classifier)
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

        inputs = {
            k: tf.TensorSpec([rows, S], tf.int32)
            for k in ("input_ids", "input_mask", "segment_ids")
        }
        forward = helpers.graph_matmul_flops(lambda x: classifier(x, training=False), inputs)
        assert flops.xlnet_classifier_flops(config, S, rows, C) == forward
        batch = {k: tf.ones(v.shape, tf.int32) for k, v in inputs.items()}
        assert float(traced(fine_tune.flops_fn)(batch)) == pytest.approx(3 * forward, rel=1e-6)


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


def test_finetuning_models_not_counted_log_no_flops():
    """A frozen encoder (its backward pass skips it: not 3 passes), a BiLSTM tagger, ELMo's
    classifier and the fine-tuning tasks on them get no flops_fn, so their runs log no FLOP/s
    rather than a wrong one; the counted models' tasks get one."""
    config = helpers.tiny_config()
    frozen = tagging.BertTagger(config, C, feature_mode="last")
    lstm = tagging.BertTagger(config, C, lstm_units=3, lstm_layers=1)
    elmo_model = elmo.ElmoClassifier(test_elmo.config(), C)
    for model in (frozen, lstm, elmo_model):
        assert finetune_tasks.flops_fn(model) is None
    assert finetune_tasks.token_tagging_task(frozen).flops_fn is None
    assert finetune_tasks.classification_task(elmo_model).flops_fn is None
    classifier = finetuning_model("classifier", config)
    for task in (
        finetune_tasks.classification_task(classifier),
        finetune_tasks.regression_task(finetuning.BertClassifier(config, 1)),
        finetune_tasks.token_tagging_task(tagging.BertTagger(config, C)),
        squad_eval.span_qa_task(finetuning_model("span", config)),
    ):
        assert task.flops_fn is not None


def test_counts_grow_as_the_formulas_say():
    """Hand-checked small cases, so a formula cannot drift with its graph test."""
    # One layer, S = 2, H = 1, I = 1: 8*2 + 4*4 + 4*2 = 40; the last layer at Q = 1: 4*2 + 4 +
    # 4*2 + 4 = 24; with E = 3 the projection adds 2*2*3 = 12.
    assert flops.encoder_flops(2, 1, 1, 1) == 40
    assert flops.encoder_flops(2, 1, 1, 1, q=1) == 24
    assert flops.encoder_flops(2, 1, 1, 1, e=3) == 52
    assert flops.encoder_flops(2, 1, 1, 1, e=1) == 40  # E = H: no projection
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
    assert flops.elmo_lm_flops(SimpleNamespace(lstm=lstm, char_cnn=None, n_tokens_vocab=1), 1) == 40
    # Tensors in, the same numbers out (what the tasks pass in a step).
    s = tf.constant(2.0)
    assert float(flops.encoder_flops(s, 1, 1, 1, q=s / 2)) == 24
    assert float(flops.xlnet_flops(x, s, tf.constant(1.0), p=s / 2)) == 76 + 52 + 12 + 6
