"""Fine-tuning models and their training pieces: shapes, pooling, multiple choice, config round
trips, init from a pretraining checkpoint, layer-wise learning rates, prediction under
MirroredStrategy, the best-checkpoint keeper and the weighted task sums."""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from modeling import albert, bert, electra, finetuning, losses, span_qa, tagging, xlnet
from tests import helpers
from training import finetune_tasks, optimization, trainer

B, C, S = 3, 4, 7


def inputs(shape, seed=0, vocab=helpers.TINY["vocab_size"]):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=shape).astype(np.int32)
    mask = np.ones(shape, np.int32)
    mask[..., -2:] = 0  # two padding positions
    ids[..., -2:] = 0
    segments = np.zeros(shape, np.int32)
    segments[..., 3:-2] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def build(cls, *args, seed=1, **kwargs):
    keras.utils.set_random_seed(seed)
    model = cls(helpers.tiny_config(), *args, **kwargs)
    model.build()
    return model


def test_classifier_shapes_and_mean_pooling_ignores_padding():
    x = inputs((B, S))
    for pooling in ("cls", "mean"):
        model = build(finetuning.BertClassifier, 5, pooling=pooling)
        logits = model(x)
        assert logits.shape == (B, 5) and logits.dtype == "float32"
        y = {**x, "input_ids": x["input_ids"].copy()}
        y["input_ids"][:, -2:] = 7  # other tokens at masked positions: same output
        np.testing.assert_allclose(model(y), logits, atol=1e-6)
        pooler_trains = any("pooler" in v.path for v in model.trainable_variables)
        assert pooler_trains == (pooling == "cls")  # mean: no gradient reaches the pooler
        assert any("pooler" in v.path for v in model.weights)  # still saved and loaded
    assert build(finetuning.BertClassifier, 1)(x).shape == (B, 1)  # the STS-B regressor
    with pytest.raises(ValueError, match="pooling"):
        finetuning.BertClassifier(helpers.tiny_config(), 2, pooling="max")


def test_pooled_output_gets_dropout_only_in_training():
    model = build(finetuning.BertClassifier, 5, dropout_rate=0.5)
    x = inputs((B, S))
    np.testing.assert_array_equal(model(x, training=False), model(x, training=False))
    assert not np.allclose(model(x, training=True), model(x, training=False))


def test_multiple_choice_scores_each_choice_with_the_shared_head():
    model = build(finetuning.BertMultipleChoice)
    x = inputs((B, C, S))
    scores = model(x)
    assert scores.shape == (B, C)
    for j in range(C):  # choice j alone through the same encoder and vector
        one = {k: v[:, j] for k, v in x.items()}
        pooled = model.encoder(one)["pooled_output"]
        np.testing.assert_allclose(scores[:, j], model.classifier(pooled)[:, 0], atol=1e-5)


def test_get_config_round_trip():
    for model in (
        build(finetuning.BertClassifier, 5, pooling="mean", dropout_rate=0.2),
        build(finetuning.BertMultipleChoice),
    ):
        config = model.get_config()
        clone = type(model).from_config(json.loads(json.dumps(config)))
        assert clone.get_config() == config


def test_pretraining_checkpoint_initialises_the_encoder_only(tmp_path):
    keras.utils.set_random_seed(3)
    pre = bert.BertPretrainer(helpers.tiny_config())
    pre.build()
    prefix = tf.train.Checkpoint(model=pre).save(str(tmp_path / "pre" / "ckpt"))
    model = build(finetuning.BertClassifier, 2)
    head = model.classifier.dense.kernel.numpy()
    assert trainer.init_from_checkpoint(model, str(tmp_path / "pre")) == (prefix, "encoder")
    for a, b in zip(model.encoder.weights, pre.encoder.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(model.classifier.dense.kernel.numpy(), head)
    # A fine-tuned checkpoint of the same model loads whole, head included.
    tuned = tf.train.Checkpoint(model=model).save(str(tmp_path / "tuned" / "ckpt"))
    other = build(finetuning.BertClassifier, 2, seed=9)
    assert trainer.init_from_checkpoint(other, tuned) == (tuned, "model")
    np.testing.assert_array_equal(other.classifier.dense.kernel.numpy(), head)
    keras.utils.set_random_seed(3)
    wrong = finetuning.BertClassifier(helpers.tiny_config(hidden_size=6), 2)  # other widths
    wrong.build()
    with pytest.raises(ValueError):
        trainer.init_from_checkpoint(wrong, prefix)


def test_layerwise_multipliers_follow_electra():
    f = finetune_tasks.layerwise_lr_multiplier
    L, d = 2, 0.5  # head 1, pooler d, layer_1 d^2, layer_0 d^3, embeddings d^4
    assert f("bert_classifier/classifier/dense/kernel", L, d) == 1.0
    assert f("bert_classifier/encoder/pooler/kernel", L, d) == 0.5
    assert f("bert_classifier/encoder/layer_1/attention/qkv/kernel", L, d) == 0.25
    assert f("bert_classifier/encoder/layer_0/output/bias", L, d) == 0.125
    assert f("bert_classifier/encoder/embeddings/word_embeddings", L, d) == 0.0625
    # ELECTRA's embedding projection is an input of layer 0 (its `_get_layer_lrs`), as ALBERT's.
    assert f("bert_classifier/encoder/embeddings_project/kernel", L, d) == 0.0625
    assert f("bert_classifier/encoder/embedding_hidden_mapping_in/bias", L, d) == 0.0625
    # 5 layers in 2 ALBERT groups: layers 0-2 run group 0, 3-4 group 1 (int(l / L * G)); a
    # shared group learns at its highest layer's rate.
    group = "bert_classifier/encoder/group_{}/inner_group_0/output/kernel"
    assert f(group.format(0), 5, d, num_groups=2) == d ** (5 + 2 - 3)
    assert f(group.format(1), 5, d, num_groups=2) == d ** (5 + 2 - 5)
    assert f(group.format(0), 5, d, num_groups=5) == d**6  # unshared: group g is layer g
    with pytest.raises(ValueError, match="group_0"):  # an ALBERT path without its group count
        f(group.format(0), 5, d)
    # XLNet: the word and mask embeddings are inputs; per-layer stacks get one rate per slice;
    # biases tied over the layers (untie_r=False) learn at the top layer's rate.
    assert f("xl_net_classifier/encoder/word_embedding", L, d, (29, 12)) == 0.0625
    assert f("xl_net_classifier/encoder/mask_emb", L, d, (1, 1, 12)) == 0.0625
    assert f("xl_net_classifier/encoder/layer_1/rel_attn/q", L, d, (12, 3, 5)) == 0.25
    assert f("xl_net_classifier/summary/kernel", L, d, (12, 12)) == 1.0
    stacked = f("xl_net_classifier/encoder/seg_embed", L, d, (2, 2, 3, 5))
    assert stacked.shape == (2, 1, 1, 1) and stacked.dtype == np.float32
    np.testing.assert_array_equal(stacked.ravel(), [0.125, 0.25])
    np.testing.assert_array_equal(f("m/encoder/r_w_bias", L, d, (2, 3, 5)).ravel(), [0.125, 0.25])
    assert f("xl_net_classifier/encoder/r_r_bias", L, d, (3, 5)) == 0.25
    # An encoder variable of no known part is refused rather than trained at the head's rate.
    with pytest.raises(ValueError, match="encoder/new_part/kernel"):
        f("bert_classifier/encoder/new_part/kernel", L, d)


def _xlnet_config(**changes):
    from tests.test_xlnet import tiny_config

    return tiny_config(**changes)


# Every encoder family's fine-tuning models, their ALBERT group count and the depths their
# variables take (L = 2, or 3 for ALBERT): each variable's depth is known (no error) and the
# depths found are these, so a renamed layer cannot drop to the head's rate. No pooler (depth
# L + 1) where the model does not train one: span QA and tagging read the sequence, ELECTRA has
# none, and XLNet's summary belongs to its head.
LAYERWISE_MODELS = {
    "bert": (lambda: finetuning.BertClassifier(helpers.tiny_config(), 2), None, {0, 1, 2, 3, 4}),
    "bert_multiple_choice": (
        lambda: finetuning.BertMultipleChoice(helpers.tiny_config()),
        None,
        {0, 1, 2, 3, 4},
    ),
    "bert_span_qa": (lambda: span_qa.BertSpanQA(helpers.tiny_config()), None, {0, 1, 2, 4}),
    "bert_tagger": (
        lambda: tagging.tagger_class(helpers.tiny_config(), False)(helpers.tiny_config(), 5),
        None,
        {0, 1, 2, 4},
    ),
    "electra": (  # embedding_size 4 != hidden 12: an embeddings_project layer
        lambda: finetuning.BertClassifier(
            electra.ElectraConfig(**helpers.TINY, embedding_size=4, generator_hidden_size=0.5), 2
        ),
        None,
        {0, 1, 2, 4},
    ),
    # 3 layers in 2 groups: layers 0 and 1 run group 0, which learns at layer 1's rate (depth 2).
    "albert": (
        lambda: finetuning.BertClassifier(
            albert.AlbertConfig(
                **{**helpers.TINY, "num_hidden_layers": 3, "num_hidden_groups": 2},
                embedding_size=4,
            ),
            2,
        ),
        2,
        {0, 2, 3, 4, 5},
    ),
    "xlnet": (lambda: xlnet.XLNetClassifier(_xlnet_config(), 2), None, {0, 1, 2, 4}),
    "xlnet_span_qa": (lambda: xlnet.XLNetSpanQA(_xlnet_config()), None, {0, 1, 2, 4}),
    "xlnet_tied": (
        lambda: xlnet.XLNetClassifier(_xlnet_config(untie_r=False), 2),
        None,
        {0, 1, 2, 4},
    ),
}


@pytest.mark.parametrize("family", sorted(LAYERWISE_MODELS))
def test_layerwise_depths_cover_every_encoder_variable(family):
    make, num_groups, expected = LAYERWISE_MODELS[family]
    model = make()
    model.build()
    config = model.encoder.config
    L = getattr(config, "num_hidden_layers", None) or config.n_layer
    depths = {}
    for v in model.trainable_variables:
        depth = finetune_tasks.layer_depth(v.path, v.shape, L, num_groups)
        for k in np.ravel(depth):
            depths.setdefault(int(k), []).append(v.path)
    head = [p for p in depths[L + 2] if "/encoder/" in p]
    assert head == [], head  # the head's rate only outside the encoder
    assert set(depths) == expected, {k: len(v) for k, v in depths.items()}


def _one_grad_step(optimizer, model, steps=1, vocab=helpers.TINY["vocab_size"]):
    x = inputs((B, S), vocab=vocab)
    labels = np.array([0, 1, 1])
    optimizer.build(model.trainable_variables)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(labels, model(x), from_logits=True)
            )
        grads = tape.gradient(loss, model.trainable_variables)
        pairs = [(g, v) for g, v in zip(grads, model.trainable_variables) if g is not None]
        optimizer.apply(*zip(*pairs))
    out = {}
    for v, g in zip(model.trainable_variables, grads):
        if g is None:  # XLNet's mask_emb starts the query stream, unused in classification
            continue
        counts = None
        if isinstance(g, tf.IndexedSlices):  # embedding lookups: how often each row was used
            counts = np.bincount(g.indices.numpy(), minlength=v.shape[0])
        out[v.path] = (tf.convert_to_tensor(g).numpy(), counts)
    return out


def test_layerwise_adamw_with_decay_one_is_the_pretraining_adamw():
    a, b = build(finetuning.BertClassifier, 2), build(finetuning.BertClassifier, 2)
    _one_grad_step(optimization.create_optimizer(1e-2, 10, 2), a, steps=3)
    opt = finetune_tasks.LayerwiseAdamW(
        optimization.WarmupLinearDecay(1e-2, 10, 2), num_layers=2, layer_decay=1.0
    )
    _one_grad_step(opt, b, steps=3)
    for va, vb in zip(a.trainable_variables, b.trainable_variables, strict=True):
        np.testing.assert_allclose(va.numpy(), vb.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family", ["bert", "xlnet"])
def test_layerwise_adamw_scales_each_variables_step(family):
    lr, d = 1e-3, 0.5
    if family == "bert":
        model, vocab = build(finetuning.BertClassifier, 2), helpers.TINY["vocab_size"]
    else:  # XLNet's per-layer stacks take one rate per slice
        keras.utils.set_random_seed(1)
        model, vocab = xlnet.XLNetClassifier(_xlnet_config(), 2), _xlnet_config().n_token
        model.build()
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    opt = finetune_tasks.create_finetuning_optimizer(lr, 10, 0, num_layers=2, layer_decay=d)
    grads = _one_grad_step(opt, model, vocab=vocab)
    # One AdamW step, exactly: decoupled decay lr * factor * 0.01 * w, then Adam's first step
    # lr * factor * sign(g) * r with r = sqrt(1 - b2) |g| / (sqrt(1 - b2) |g| + eps), since Keras
    # adds epsilon before the bias correction (b2 = 0.999, eps = 1e-6 as BERT).
    root = np.sqrt(1 - 0.999)
    for v in (v for v in model.trainable_variables if v.path in grads):
        factor = finetune_tasks.layerwise_lr_multiplier(v.path, 2, d, v.shape)
        (g, counts), w = grads[v.path], before[v.path]
        decay = 0.0 if any(p in v.name for p in optimization.NO_DECAY_PATTERNS) else 0.01
        r = root * np.abs(g) / (root * np.abs(g) + 1e-6)
        expected = -lr * factor * (decay * w + np.sign(g) * r)
        got = v.numpy() - w
        if counts is not None:
            # Keras' Adam squares a sparse gradient per occurrence before summing, so embedding
            # rows looked up twice or more follow another formula; compare the others.
            got, expected = got[counts <= 1], expected[counts <= 1]
        # atol: the float32 spacing at the weight's size (w + step rounds to it; gamma ~ 1).
        atol = max(2e-8, float(np.abs(w).max()) * np.finfo(np.float32).eps)
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=atol, err_msg=v.path)
    with pytest.raises(ValueError, match="layerwise_lr_decay"):
        finetune_tasks.create_finetuning_optimizer(lr, 10, 0, 2, 1.5)


def test_predictor_under_mirrored_keeps_row_order():
    strategy = helpers.mirrored_strategy()
    assert strategy.num_replicas_in_sync == 2
    keras.utils.set_random_seed(4)
    with strategy.scope():
        model = finetuning.BertClassifier(helpers.tiny_config(), 3)
        model.build()
    x = inputs((10, S), seed=5)
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(4, drop_remainder=True)
    got = finetune_tasks.Predictor(strategy, model)(dataset)
    np.testing.assert_allclose(got, model({k: v[:8] for k, v in x.items()}), atol=1e-5)


def test_predictor_shows_a_progress_bar_when_given_a_name(capsys):
    # run_classifier and run_ner name their evaluation and prediction passes: a bar of batches
    # with its total, rate and time left on stderr; unnamed (the library's default), nothing.
    model = build(finetuning.BertClassifier, 3)
    x = inputs((10, S), seed=5)
    predictor = finetune_tasks.Predictor(tf.distribute.OneDeviceStrategy("/cpu:0"), model)
    three = tf.data.Dataset.from_tensor_slices(x).batch(4)
    quiet = predictor(three)
    assert capsys.readouterr().err == ""
    np.testing.assert_array_equal(predictor(three, desc="evaluating dev"), quiet)
    err = capsys.readouterr().err
    assert re.search(r"evaluating dev: 100%.* 3/3 \[[0-9:]+<00:00, .* batches/s\]", err), err
    # A dataset of unknown length: the bar counts without a total.
    predictor(three.filter(lambda batch: True), desc="predicting test")
    err = capsys.readouterr().err
    assert re.search(r"predicting test: 3 batches \[", err), err


def test_best_checkpoint_never_takes_a_worse_score(tmp_path):
    model = build(finetuning.BertClassifier, 2)
    best = finetune_tasks.BestCheckpoint(tmp_path / "best", model)
    assert best.info is None and best.prefix is None
    assert best.update(0.6, 10, {"accuracy": 0.6})
    kernel = model.classifier.dense.kernel.numpy().copy()
    model.classifier.dense.kernel.assign(kernel + 1.0)
    assert not best.update(0.55, 20, {}) and not best.update(0.6, 30, {})  # worse, tie
    assert not best.update(float("nan"), 40, {})
    assert best.info["step"] == 10 and best.info["score"] == 0.6
    trainer.restore_model_weights(model, best.prefix)
    np.testing.assert_array_equal(model.classifier.dense.kernel.numpy(), kernel)
    # Survives a restart, and a kill between its two renames (best moved aside, new not in).
    (tmp_path / "best").rename(tmp_path / "best.old")
    again = finetune_tasks.BestCheckpoint(tmp_path / "best", model)
    assert again.info["score"] == 0.6 and not (tmp_path / "best.old").exists()
    assert again.update(0.7, 50, {}) and again.info["step"] == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


@pytest.mark.parametrize("first_candidate", [0, 1])
def test_dev_selection_offers_scores_from_its_first_candidate_and_reuses_the_last_pass(
    tmp_path, first_candidate
):
    model = build(finetuning.BertClassifier, 2)
    best = finetune_tasks.BestCheckpoint(tmp_path / "best", model)
    passes, step = [], [0]
    scores = {0: 0.9, 10: 0.5, 20: 0.7}

    def evaluate():
        passes.append(step[0])
        return {"score": scores[step[0]]}

    selection = finetune_tasks.DevSelection(
        best, evaluate, "score", lambda: step[0], first_candidate=first_candidate
    )
    for step[0] in (0, 10, 20):
        assert selection() == {"score": scores[step[0]]}
    # Step 0's 0.9 is kept when step 0 is a candidate; else 0.5 at 10, then 0.7 at 20.
    kept = (0, 0.9) if first_candidate == 0 else (20, 0.7)
    assert (best.info["step"], best.info["score"]) == kept
    assert selection.results_at(20) == {"score": 0.7} and passes == [0, 10, 20]  # no new pass
    step[0] = 10
    assert selection.results_at(10) == {"score": 0.5} and passes == [0, 10, 20, 10]  # a pass


def test_task_sums_ignore_padding_rows():
    logits = tf.constant([[2.0, 0.0], [0.0, 2.0], [5.0, -5.0]])
    labels = tf.constant([0, 0, 1])
    w = tf.constant([1.0, 1.0, 0.0])
    s = losses.classification_sums(logits, labels, w)
    ce = np.log1p(np.exp(-2.0))
    assert float(s["count"]) == 2.0 and float(s["correct"]) == 1.0
    assert float(s["loss_sum"]) == pytest.approx(ce + (2.0 + ce), rel=1e-5)
    r = losses.regression_sums(tf.constant([[1.0], [2.0], [9.0]]), [1.5, 2.0, 0.0], w)
    assert float(r["loss_sum"]) == pytest.approx(0.25) and float(r["count"]) == 2.0


def test_classification_task_learns_a_repeated_batch():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    keras.utils.set_random_seed(2)
    with strategy.scope():
        model = finetuning.BertClassifier(helpers.tiny_config(), 3, dropout_rate=0.0)
        model.build()
        opt = optimization.create_optimizer(1e-2, 40, 2)
        opt.build(model.trainable_variables)
    fit = trainer.Trainer(strategy, finetune_tasks.classification_task(model), opt)
    batch = {**inputs((6, S)), "label_ids": np.array([0, 1, 2, 2, 1, 0], np.int32)}
    batches = tf.data.Dataset.from_tensors(batch).repeat()
    rows = fit.train_steps(iter(batches), 40)
    first, last = (fit.metrics_from_sums(rows[i][:-2]) for i in (0, -1))
    assert last["classifier_loss"] < 0.3 * first["classifier_loss"]
    assert last["accuracy"] == 1.0


def test_output_metrics_from_gathered_outputs():
    out = finetune_tasks.output_metrics([[0.0, 0.0], [np.log(3.0), 0.0]], [0, 1], ("accuracy",))
    assert out["accuracy"] == 0.5 and out["score"] == 0.5  # a tie goes to the first class
    assert out["loss"] == pytest.approx((np.log(2.0) + np.log(4.0)) / 2)
    out = finetune_tasks.output_metrics(
        [[1.0], [2.0], [4.0]], [1.0, 3.0, 2.0], ("pearson", "spearman"), regression=True
    )
    assert out["loss"] == pytest.approx(5 / 3) and out["spearman"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------
# Work no output reads: the last layer at [CLS] alone, batches cut to their longest example
# ---------------------------------------------------------------------------------------------


def _family_config(family):
    from tests import test_albert, test_electra

    return {
        "bert": helpers.tiny_config,
        "albert": test_albert.tiny,  # 4 layers over 2 shared groups of 2 inner blocks
        "electra": test_electra.tiny,  # no pooler: [CLS] itself
    }[family]()


def _logits_and_grads(model, x):
    with tf.GradientTape() as tape:
        logits = model(x, training=False)
        loss = tf.reduce_sum(logits * tf.range(1.0, logits.shape[-1] + 1.0))
    grads = tape.gradient(loss, model.trainable_variables)
    return logits.numpy(), {v.path: g for v, g in zip(model.trainable_variables, grads)}


def _assert_same(a, b, tol):
    """Logits and every gradient equal within `tol` of each tensor's largest entry (at least 1):
    float rounding of sums taken in another order."""

    def close(x, y, what):
        x, y = np.asarray(tf.convert_to_tensor(x)), np.asarray(tf.convert_to_tensor(y))
        np.testing.assert_allclose(x, y, atol=tol * max(1.0, np.abs(y).max()), err_msg=what)

    close(a[0], b[0], "logits")
    assert a[1].keys() == b[1].keys()
    for path, g in a[1].items():
        h = b[1][path]
        if g is None or h is None:
            assert g is None and h is None, path
            continue
        close(g, h, path)


@pytest.mark.parametrize("family", ["bert", "albert", "electra"])
def test_cls_pooling_runs_the_last_layer_at_cls_alone_with_the_same_logits(family, monkeypatch):
    config = _family_config(family)
    asked = []
    real = bert.last_layer_queries

    def spy(positions):
        asked.append(None if positions is None else tuple(positions.shape))
        return real(positions)

    monkeypatch.setattr(bert, "last_layer_queries", spy)
    for make, x in (
        (lambda: finetuning.BertClassifier(config, 3), inputs((B, S), vocab=config.vocab_size)),
        (lambda: finetuning.BertMultipleChoice(config), inputs((B, C, S), vocab=config.vocab_size)),
    ):
        keras.utils.set_random_seed(1)
        model = make()
        model.build()
        asked.clear()
        cls_only = _logits_and_grads(model, x)
        rows = B * C if isinstance(model, finetuning.BertMultipleChoice) else B
        assert asked == [(rows, 0)]  # the encoder was asked for [CLS] and no other position
        with monkeypatch.context() as m:
            m.setattr(finetuning, "pooled_only_positions", lambda ids, pooling: None)
            asked.clear()
            whole = _logits_and_grads(model, x)
            assert asked == [None]  # the negative control: every position
        _assert_same(cls_only, whole, tol=1e-6)
        # The [CLS] query also splits with the rows when the encoder runs in branches.
        bert.set_encoder_branches(model, 2)
        _assert_same(_logits_and_grads(model, x), whole, tol=1e-6)
    # Mean pooling reads every position of the last layer.
    assert finetuning.pooled_only_positions(tf.zeros((B, S), tf.int32), "mean") is None


def _right_padded(lengths, seq, seed=0, vocab=helpers.TINY["vocab_size"], choices=0):
    rng = np.random.default_rng(seed)
    shape = (len(lengths), choices, seq) if choices else (len(lengths), seq)
    mask = np.zeros(shape, np.int32)
    for row, n in enumerate(lengths):
        mask[row, ..., :n] = 1
    ids = rng.integers(5, vocab, shape).astype(np.int32) * mask
    segments = np.zeros(shape, np.int32)
    segments[..., 2:] = 1
    return {
        "input_ids": tf.constant(ids),
        "input_mask": tf.constant(mask),
        "segment_ids": tf.constant(segments * mask),
        "label_ids": tf.constant(np.arange(len(lengths)), tf.int32),  # (B,): not cut
    }


def test_trim_to_longest_cuts_sequence_features_to_the_longest_example():
    from data_prep import features

    batch = _right_padded([3, 6, 5], 16)
    cut = features.trim_to_longest(batch)
    assert {k: tuple(v.shape) for k, v in cut.items()} == {
        "input_ids": (3, 8),
        "input_mask": (3, 8),
        "segment_ids": (3, 8),
        "label_ids": (3,),
    }
    for key in ("input_ids", "input_mask", "segment_ids"):
        np.testing.assert_array_equal(cut[key], batch[key][:, :8])
        np.testing.assert_array_equal(batch[key][:, 8:], 0)  # only padding was cut
    np.testing.assert_array_equal(cut["label_ids"], batch["label_ids"])
    lengths = {  # longest real length -> kept length, rounded up to the multiple, within S
        (9, 16, 8): 16,
        (9, 16, 4): 12,
        (8, 16, 8): 8,
        (16, 16, 8): 16,
        (10, 13, 8): 13,
        (0, 16, 8): 8,  # padding rows alone keep a [CLS] position
        (1, 16, 8): 8,
    }
    for (longest, seq, multiple), expected in lengths.items():
        got = features.trim_to_longest(_right_padded([1, longest], seq), multiple)
        assert got["input_ids"].shape[-1] == expected, (longest, seq, multiple)
    # Multiple choice (B, C, S) and a tagger's (B, S) labels are cut alike.
    mc = features.trim_to_longest(_right_padded([2, 7], 16, choices=4))
    assert mc["input_ids"].shape == (2, 4, 8) and mc["label_ids"].shape == (2,)
    tags = {**batch, "label_ids": batch["input_ids"], "label_weights": tf.ones((3, 16))}
    assert features.trim_to_longest(tags)["label_weights"].shape == (3, 8)


@pytest.mark.parametrize("family", ["bert", "albert", "electra"])
def test_dynamic_padding_gives_the_same_logits_and_gradients(family):
    from data_prep import features

    config = _family_config(family)
    lengths = [3, 6, 5, 2]
    for model, batch in (
        (finetuning.BertClassifier(config, 3), _right_padded(lengths, 16, vocab=53)),
        (finetuning.BertMultipleChoice(config), _right_padded(lengths, 16, vocab=53, choices=2)),
        (finetuning.BertClassifier(config, 3, pooling="mean"), _right_padded(lengths, 16, 1, 53)),
    ):
        model.build()
        x = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}
        cut = features.trim_to_longest(x)
        assert cut["input_ids"].shape[-1] == 8
        _assert_same(_logits_and_grads(model, cut), _logits_and_grads(model, x), tol=1e-6)


def test_classifier_dataset_with_dynamic_padding_cuts_each_batch(tmp_path):
    from data_prep import features

    path = tmp_path / "train.tf_record"
    rows = [(3, 0), (12, 1), (4, 0), (5, 1), (2, 0), (6, 1)]  # (length, label), S = 16
    with tf.io.TFRecordWriter(str(path)) as w:
        for n, label in rows:
            ids = np.array([2] + [9] * (n - 1) + [0] * (16 - n))
            w.write(features.serialize_classifier_example(ids, (ids > 0) * 1, ids * 0, label))
    kwargs = dict(batch_size=3, max_seq_length=16, seed=3, shuffle_buffer=1)
    plain = features.classifier_dataset([str(path)], **kwargs)
    cut = features.classifier_dataset([str(path)], **kwargs, dynamic_padding=True)
    assert cut.element_spec["input_ids"].shape.as_list() == [3, None]
    assert plain.element_spec["input_ids"].shape.as_list() == [3, 16]
    for a, b in zip(plain.take(4), cut.take(4)):  # the same examples, in the same order
        n = b["input_ids"].shape[1]
        longest = int(tf.reduce_max(tf.reduce_sum(a["input_mask"], 1)))
        assert n == min(16, -(-longest // 8) * 8)
        for key in a:
            np.testing.assert_array_equal(
                a[key][..., :n] if a[key].shape.rank == 2 else a[key], b[key]
            )


def _varied_lengths_file(path, lengths, seq, kind="classifier"):
    """A training file of examples whose first token is their 1-based index (so each one is known
    again after any shuffle) and whose real length is `lengths[i]`; labels are i % 2 (tagging:
    the ids, with weight 1 at real tokens; SQuAD windows: unique id i + 1, the answer span
    (i % 2, n - 1), impossible when i % 2 == 0)."""
    from data_prep import features

    with tf.io.TFRecordWriter(str(path)) as w:
        for i, n in enumerate(lengths):
            ids = np.array([i + 1] + [9] * (n - 1) + [0] * (seq - n))
            mask = (ids > 0) * 1
            if kind == "tagging":
                w.write(features.serialize_tagging_example(ids, mask, ids * 0, ids, mask * 1.0))
            elif kind == "squad":
                w.write(features.serialize_squad_example(
                    i + 1, ids, mask, ids * 0, i % 2, n - 1, i % 2 == 0))  # fmt: skip
            else:
                w.write(features.serialize_classifier_example(ids, mask, ids * 0, i % 2))


@pytest.mark.parametrize("kind", ["classifier", "tagging", "squad"])
def test_group_by_length_sorts_each_group_into_shorter_batches_of_the_same_examples(tmp_path, kind):
    """--group_by_length's pipeline (length_group_batches=4, batch 3): the stream of examples
    leaving the shuffle is the plain pipeline's, cut into groups of 12 that are each sorted by
    length (stably) and batched again; every batch it yields is one of those, whole, at most once,
    with every feature of its rows (a tagger's labels and weights, a SQuAD window's id, span and
    impossibility too), cut to its longest. The cut positions add up to less than the plain
    batches'. The same seed gives the same batches, and an iterator restored from a checkpoint
    goes on as the one saved."""
    from data_prep import features

    seq, batch, groups = 40, 3, 4
    lengths = np.random.default_rng(0).integers(2, seq + 1, size=24)
    path = tmp_path / "train.tf_record"
    _varied_lengths_file(path, lengths, seq, kind)
    make = {
        "classifier": features.classifier_dataset,
        "tagging": features.tagging_dataset,
        "squad": features.squad_dataset,
    }[kind]
    kwargs = dict(batch_size=batch, max_seq_length=seq, seed=3, shuffle_buffer=24)
    plain = make([str(path)], **kwargs, dynamic_padding=True)
    grouped = make([str(path)], **kwargs, dynamic_padding=True, length_group_batches=groups)
    assert grouped.element_spec["input_ids"].shape.as_list() == [batch, None]
    # Each pipeline is iterated once: a second iterator of the same dataset draws another shuffle
    # (reshuffle_each_iteration, as training's epochs). The plain stream's first 5 groups (the
    # first 8 grouped batches come from the first 2 groups and the shuffle buffer of 4 batches,
    # so from the first 3), sorted and cut into batches.
    plain_batches = list(plain.take(5 * groups))
    stream = [int(i) for b in plain_batches for i in b["input_ids"][:, 0]]
    expected = []
    for g in range(5):
        ids = stream[g * groups * batch : (g + 1) * groups * batch]
        ids = sorted(ids, key=lambda i: lengths[i - 1])  # stable: ties keep the stream's order
        expected += [tuple(ids[k : k + batch]) for k in range(0, len(ids), batch)]
    seen, cut_grouped = [], 0
    grouped_batches = list(grouped.take(2 * groups))
    for b in grouped_batches:
        rows = tuple(int(i) for i in b["input_ids"][:, 0])
        # The stream repeats its 24 examples, so two groups can make the same batch: each
        # batch takes the first of its copies not taken yet (None: it is none of them).
        k = next((k for k, e in enumerate(expected) if e == rows and k not in seen), None)
        assert k is not None, (rows, expected)
        seen.append(k)
        longest = max(lengths[i - 1] for i in rows)
        assert b["input_ids"].shape[1] == min(seq, -(-longest // 8) * 8)
        cut_grouped += b["input_ids"].shape[1]
        for r, i in enumerate(rows):  # every feature travelled with its row
            n = lengths[i - 1]
            np.testing.assert_array_equal(
                b["input_mask"][r], np.arange(b["input_mask"].shape[1]) < n
            )
            if kind == "tagging":
                np.testing.assert_array_equal(b["label_ids"][r][:n], [i] + [9] * (n - 1))
                assert float(tf.reduce_sum(b["label_weights"][r])) == n
            elif kind == "squad":
                assert int(b["unique_ids"][r]) == i
                span = (int(b["start_positions"][r]), int(b["end_positions"][r]))
                assert span == ((i - 1) % 2, n - 1)
                assert int(b["is_impossible"][r]) == int((i - 1) % 2 == 0)
            else:
                assert int(b["label_ids"][r]) == (i - 1) % 2
    assert max(seen) < 3 * groups
    assert seen != sorted(seen)  # the batches were shuffled, not yielded shortest first
    cut_plain = sum(b["input_ids"].shape[1] for b in plain_batches[: 2 * groups])
    assert cut_grouped < cut_plain, (cut_grouped, cut_plain)

    def rows(iterator, n):
        return [tuple(int(i) for i in next(iterator)["input_ids"][:, 0]) for _ in range(n)]

    def again():
        return make([str(path)], **kwargs, dynamic_padding=True, length_group_batches=groups)

    it = iter(again())
    assert rows(it, 5) == [tuple(int(i) for i in b["input_ids"][:, 0]) for b in grouped_batches[:5]]
    saved = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt"))
    want = rows(it, 9)
    fresh = iter(again())
    tf.train.Checkpoint(iterator=fresh).restore(saved)
    assert rows(fresh, 9) == want


def test_sort_by_length_orders_rows_and_multiple_choice_by_their_longest_choice():
    from data_prep import features

    batch = _right_padded([5, 2, 7, 2], 8)
    batch["label_ids"] = tf.constant([10, 11, 12, 13])
    got = features.sort_by_length(batch)
    np.testing.assert_array_equal(got["label_ids"], [11, 13, 10, 12])  # 2, 2 (stable), 5, 7
    np.testing.assert_array_equal(tf.reduce_sum(got["input_mask"], 1), [2, 2, 5, 7])
    mask = np.zeros((3, 2, 8), np.int32)  # choices of lengths (1, 6), (4, 4), (5, 2)
    for row, choice_lengths in enumerate([(1, 6), (4, 4), (5, 2)]):
        for c, n in enumerate(choice_lengths):
            mask[row, c, :n] = 1
    mc = {"input_mask": tf.constant(mask), "label_ids": tf.constant([0, 1, 2])}
    np.testing.assert_array_equal(features.sort_by_length(mc)["label_ids"], [1, 2, 0])
    path = "unused.tf_record"
    with pytest.raises(ValueError, match="length_group_batches needs dynamic_padding"):
        features.classifier_dataset([path], 3, 8, length_group_batches=2)
    with pytest.raises(ValueError, match="length_group_batches: expected >= 0, found -1"):
        features.classifier_dataset([path], 3, 8, dynamic_padding=True, length_group_batches=-1)
