"""ELECTRA: config and generator sizes, seeded sampling, the replaced-token label rule with
degenerate generators, shared embeddings, the loss weighting and its gradients, and the original
TF1 checkpoint layout read by the converter."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep.errors import InputError
from modeling import albert, checkpoints, electra, finetuning, losses
from tests.test_checkpoints import random_arrays, write_tf1_checkpoint
from training import tasks, trainer

B, S, P, V = 3, 7, 2, 53
TINY = dict(
    vocab_size=V,
    hidden_size=12,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=17,
    hidden_act="gelu_exact",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=16,
    type_vocab_size=2,
    initializer_range=0.02,
    embedding_size=5,
    generator_hidden_size=0.25,
    generator_layers=1.0,
)


def tiny(**changes) -> electra.ElectraConfig:
    return electra.ElectraConfig(**{**TINY, **changes})


def batch(seed=0):
    """Pretraining features: row 2 has one real prediction and one padding prediction at 0."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, V, size=(B, S)).astype("int32")
    mask = np.ones((B, S), "int32")
    mask[1, 5:] = 0
    positions = np.array([[1, 2], [3, 4], [5, 0]], "int32")
    originals = np.take_along_axis(ids, positions, axis=1).copy()
    originals[2, 1] = 0
    weights = np.array([[1, 1], [1, 1], [1, 0]], "float32")
    masked = ids.copy()
    for b in range(B):
        for p in range(P):
            if weights[b, p]:
                masked[b, positions[b, p]] = 4  # [MASK]
    return {
        "input_ids": masked,
        "input_mask": mask,
        "segment_ids": np.zeros((B, S), "int32"),
        "masked_lm_positions": positions,
        "masked_lm_ids": originals,
        "masked_lm_weights": weights,
    }, ids


def test_configs_round_trip_and_generator_follows_the_original_rule(tmp_path):
    small = electra.ElectraConfig.from_json_file("configs/electra_small.json")
    assert small.to_dict() == json.loads(open("configs/electra_small.json").read())
    # get_generator_config: hidden 256 * 0.25, 4 x hidden FFN, one head per 64 units.
    g = small.generator_config()
    assert (g.hidden_size, g.num_hidden_layers, g.intermediate_size, g.num_attention_heads) == (
        64,
        12,
        256,
        1,
    )
    base = electra.ElectraConfig.from_json_file("configs/electra_base.json").generator_config()
    assert (base.hidden_size, base.num_attention_heads) == (256, 4)
    # Told apart from ALBERT (which also has embedding_size) and BERT by the loader.
    (tmp_path / "e.json").write_text(json.dumps(TINY))
    assert isinstance(albert.load_encoder_config(tmp_path / "e.json", S), electra.ElectraConfig)
    assert isinstance(
        albert.load_encoder_config("configs/albert_tiny.json", S), albert.AlbertConfig
    )
    (tmp_path / "bad.json").write_text(json.dumps({**TINY, "generator_hidden_size": 0.01}))
    with pytest.raises(InputError, match="bad.json.*generator of hidden size 0"):
        albert.load_encoder_config(tmp_path / "bad.json", S)
    (tmp_path / "typo.json").write_text(json.dumps({**TINY, "generator_layer": 1.0}))
    with pytest.raises(InputError, match=r"typo.json.*unknown key\(s\) \['generator_layer'\]"):
        albert.load_encoder_config(tmp_path / "typo.json", S)


def test_sampling_is_seeded_and_follows_the_softmax():
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(B, P, V)), tf.float32)
    a = electra.sample_tokens(logits, tf.constant([1, 2], tf.int64))
    np.testing.assert_array_equal(a, electra.sample_tokens(logits, tf.constant([1, 2], tf.int64)))
    draws = [electra.sample_tokens(logits, tf.constant([1, k], tf.int64)) for k in range(3, 9)]
    assert any(not np.array_equal(a, d) for d in draws)
    # A one-hot generator always gives its token.
    one_hot = tf.one_hot(tf.fill((B, P), 11), V) * 1e4
    np.testing.assert_array_equal(electra.sample_tokens(one_hot, tf.constant([3, 4])), 11)
    # Frequencies over many draws match the softmax (Gumbel-max), at T = 1 and T = 0.5.
    probs = np.array([0.2, 0.3, 0.5])
    many = tf.constant(np.log(np.tile(probs, (1, 20000, 1))), tf.float32)  # (1, 20000, 3)
    for t in (1.0, 0.5):
        drawn = electra.sample_tokens(many, tf.constant([5, 6], tf.int64), temperature=t)
        want = probs ** (1 / t) / (probs ** (1 / t)).sum()
        np.testing.assert_allclose(
            np.bincount(drawn.numpy().ravel(), minlength=3) / 20000, want, atol=0.015
        )


def test_label_rule_with_degenerate_generators():
    inputs, original = batch()
    args = [inputs[k] for k in ("input_ids", "masked_lm_positions", "masked_lm_ids")]
    w = inputs["masked_lm_weights"]
    # A generator that always reproduces the original: the original input, all labels 0.
    ids, labels = electra.replace_tokens(*args, w, inputs["masked_lm_ids"])
    np.testing.assert_array_equal(ids, original)
    assert not labels.numpy().any()
    # One that never does: labels 1 exactly at the real masked positions (not at the padding
    # prediction's position 0), and those positions hold the samples.
    wrong = (inputs["masked_lm_ids"] + 1) % V
    ids, labels = electra.replace_tokens(*args, w, wrong)
    expected = np.zeros((B, S), "int32")
    for b in range(B):
        for p in range(P):
            if w[b, p]:
                expected[b, inputs["masked_lm_positions"][b, p]] = 1
    np.testing.assert_array_equal(labels, expected)
    np.testing.assert_array_equal(ids.numpy()[expected == 0], original[expected == 0])
    np.testing.assert_array_equal(ids.numpy()[expected == 1], wrong[w > 0])
    # Through the model: an output bias that makes the generator one-hot on token 9.
    model = electra.ElectraPretrainer(tiny())
    model.build()
    bias = np.zeros(V, "float32")
    bias[9] = 1e4
    model.generator_predictions.output_bias.assign(bias)
    for label, expect in ((9, np.zeros_like(expected)), (10, expected)):
        feed = dict(inputs, masked_lm_ids=np.where(w > 0, label, 0).astype("int32"))
        out = model(feed, seed=tf.constant([0, 1], tf.int64))
        np.testing.assert_array_equal(out["sampled_ids"], 9)
        np.testing.assert_array_equal(out["disc_labels"], expect)


def test_shared_embeddings_heads_and_fine_tuning_models():
    config = tiny()
    model = electra.ElectraPretrainer(config)
    model.build()
    assert model.generator.embeddings is model.encoder.embeddings
    variables = model.trainable_variables
    assert len({id(v) for v in variables}) == len(variables)  # shared ones listed once
    assert sum(v.shape == (V, 5) for v in variables) == 1  # one (V, E) table for both
    g = model.generator
    assert g.embeddings_project.kernel.shape == (5, 3)  # E -> H_g = 12 * 0.25
    assert model.encoder.embeddings_project.kernel.shape == (5, 12)  # E -> H
    assert model.generator_predictions.transform.kernel.shape == (3, 5)  # H_g -> E, tied table
    inputs, _ = batch()
    out = model(inputs)
    assert out["mlm_logits"].shape == (B, P, V) and out["disc_logits"].shape == (B, S)
    table = model.encoder.embeddings.word_embeddings
    table.assign(table * 3.0)
    assert not np.allclose(model(inputs)["mlm_logits"], out["mlm_logits"])
    # E == H: no projection, as the original.
    square = electra.ElectraEncoder(tiny(embedding_size=12))
    square.build()
    assert square.embeddings_project is None
    # The discriminator is `encoder`: task models wrap an ElectraEncoder, whose pooled output is
    # the [CLS] vector (no pooler), and serialise.
    classifier = finetuning.BertClassifier(config.to_dict(), 3, pooling="mean")
    classifier.build()
    assert isinstance(classifier.encoder, electra.ElectraEncoder)
    enc = classifier.encoder(inputs)
    np.testing.assert_array_equal(enc["pooled_output"], enc["sequence_output"][:, 0])
    clone = finetuning.BertClassifier.from_config(classifier.get_config())
    assert isinstance(clone.encoder, electra.ElectraEncoder)
    again = electra.ElectraPretrainer.from_config(model.get_config())
    assert again.generator.embeddings is again.encoder.embeddings


def test_loss_is_mlm_plus_fifty_times_detection_and_the_generator_learns_only_mlm():
    keras.utils.set_random_seed(0)
    model = electra.ElectraPretrainer(tiny())
    model.build()
    step = tf.Variable(3, dtype=tf.int64)
    task = tasks.electra_pretraining_task(model, seed=12345, step=step)
    fit = trainer.Trainer(tf.distribute.get_strategy(), task, keras.optimizers.SGD())
    inputs, _ = batch()
    feed = {k: tf.constant(v) for k, v in inputs.items()}
    sums = task.sums_fn(feed, training=False)
    row = [float(sums[k]) for k in fit.sum_keys]
    metrics = fit.metrics_from_sums(row)
    assert fit.loss_from_sums(row) == pytest.approx(
        metrics["masked_lm_loss"] + 50.0 * metrics["disc_loss"], rel=1e-6
    )
    assert 0.0 < metrics["disc_loss"] and metrics["disc_recall"] <= 1.0
    # The same step draws the same samples; the next step others.
    again = task.sums_fn(feed, training=False)
    assert all(float(again[k]) == float(sums[k]) for k in sums)
    assert not np.array_equal(tasks.sampling_seed(12345, 3), tasks.sampling_seed(12345, 4))
    # Samples are drawn under stop_gradient: the detection loss reaches no generator-only weight.
    generator_only = model.generator.blocks[0].trainable_variables
    with tf.GradientTape() as tape:
        out = model(feed, training=True, seed=tf.constant([1, 2], tf.int64))
        disc = losses.replaced_token_sums(
            out["disc_logits"], out["disc_labels"], feed["input_mask"]
        )
    grads = tape.gradient(
        disc["loss_sum"], generator_only + [model.encoder.blocks[0].attention.qkv.kernel]
    )
    assert all(g is None for g in grads[:-1]) and grads[-1] is not None


# ---------------------------------------------------------------------------------------------
# The original TF1 checkpoint layout (google-research/electra model/modeling.py, run_pretraining)


def original_electra_names(config: electra.ElectraConfig, heads: bool = True) -> dict:
    """The variables an original ELECTRA pretraining run saves (default untied_generator=True,
    untied_generator_embeddings=False), by name, with shapes; written from the published code's
    variable scopes, independently of modeling/checkpoints.py."""
    c = config
    e, v = c.embedding_size, c.vocab_size
    names = {
        "electra/embeddings/word_embeddings": (v, e),
        "electra/embeddings/token_type_embeddings": (c.type_vocab_size, e),
        "electra/embeddings/position_embeddings": (c.max_position_embeddings, e),
        "electra/embeddings/LayerNorm/gamma": (e,),
        "electra/embeddings/LayerNorm/beta": (e,),
    }
    scopes = [("electra", c.hidden_size, c.num_hidden_layers, c.intermediate_size)]
    if heads:
        g = c.generator_config()
        scopes.append(("generator", g.hidden_size, g.num_hidden_layers, g.intermediate_size))
    for scope, h, layers, i in scopes:
        if e != h:
            names[f"{scope}/embeddings_project/kernel"] = (e, h)
            names[f"{scope}/embeddings_project/bias"] = (h,)
        for n in range(layers):
            a = f"{scope}/encoder/layer_{n}"
            for part in ("query", "key", "value"):
                names[f"{a}/attention/self/{part}/kernel"] = (h, h)
                names[f"{a}/attention/self/{part}/bias"] = (h,)
            names |= {
                f"{a}/attention/output/dense/kernel": (h, h),
                f"{a}/attention/output/dense/bias": (h,),
                f"{a}/attention/output/LayerNorm/gamma": (h,),
                f"{a}/attention/output/LayerNorm/beta": (h,),
                f"{a}/intermediate/dense/kernel": (h, i),
                f"{a}/intermediate/dense/bias": (i,),
                f"{a}/output/dense/kernel": (i, h),
                f"{a}/output/dense/bias": (h,),
                f"{a}/output/LayerNorm/gamma": (h,),
                f"{a}/output/LayerNorm/beta": (h,),
            }
    if heads:
        hg, h = c.generator_config().hidden_size, c.hidden_size
        names |= {
            "generator_predictions/dense/kernel": (hg, e),
            "generator_predictions/dense/bias": (e,),
            "generator_predictions/LayerNorm/gamma": (e,),
            "generator_predictions/LayerNorm/beta": (e,),
            "generator_predictions/output_bias": (v,),
            "discriminator_predictions/dense/kernel": (h, h),
            "discriminator_predictions/dense/bias": (h,),
            "discriminator_predictions/dense_1/kernel": (h, 1),
            "discriminator_predictions/dense_1/bias": (1,),
        }
    return names


def test_original_tf1_checkpoint_converts_every_variable_once(tmp_path):
    config = tiny()
    weights = random_arrays(original_electra_names(config))
    state = {f"{n}/adam_m": np.zeros_like(a) for n, a in weights.items()}
    write_tf1_checkpoint(tmp_path / "electra_small", weights | state | {"global_step": np.int64(7)})
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "electra_small"\n')
    model, report = checkpoints.load_tf1_electra(tmp_path, config)
    assert isinstance(model, electra.ElectraPretrainer)
    assert report.num_source_variables == len(weights)
    assert len(report.ignored) == len(state) + 1  # optimizer slots and the step counter
    np.testing.assert_array_equal(
        model.generator.embeddings.word_embeddings, weights["electra/embeddings/word_embeddings"]
    )
    q, k, v = (
        weights[f"generator/encoder/layer_1/attention/self/{p}/kernel"]
        for p in ("query", "key", "value")
    )
    np.testing.assert_array_equal(
        model.generator.blocks[1].attention.qkv.kernel, np.concatenate([q, k, v], -1)
    )
    np.testing.assert_array_equal(
        model.discriminator_predictions.dense_1.kernel,
        weights["discriminator_predictions/dense_1/kernel"],
    )
    np.testing.assert_array_equal(
        model.generator_predictions.layer_norm.gamma,
        weights["generator_predictions/LayerNorm/gamma"],
    )
    # The map run backwards gives the original arrays bit for bit.
    back = checkpoints.export_arrays(model, checkpoints.tf1_electra_entries(config, True))
    assert back.keys() == weights.keys()
    for name in weights:
        np.testing.assert_array_equal(back[name], weights[name], err_msg=name)
    # The discriminator's first hidden state against numpy: LayerNorm(emb) @ embeddings_project.
    inputs, _ = batch()
    ids, seg = inputs["input_ids"], inputs["segment_ids"]
    w = {k: a.astype(np.float64) for k, a in weights.items()}
    x = (
        w["electra/embeddings/word_embeddings"][ids]
        + w["electra/embeddings/token_type_embeddings"][seg]
    )
    x = x + w["electra/embeddings/position_embeddings"][:S]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    x = x * w["electra/embeddings/LayerNorm/gamma"] + w["electra/embeddings/LayerNorm/beta"]
    x = x @ w["electra/embeddings_project/kernel"] + w["electra/embeddings_project/bias"]
    ours = model.encoder(inputs)["encoder_outputs"][0]
    np.testing.assert_allclose(ours, x, atol=1e-5)

    # Into a Cloze checkpoint, which fine-tunes the discriminator.
    prefix = checkpoints.save_cloze(model, tmp_path / "cloze")
    classifier = finetuning.BertClassifier(config, 2)
    classifier.build()
    assert trainer.init_from_checkpoint(classifier, prefix)[1] == "encoder"
    np.testing.assert_array_equal(
        classifier.encoder.blocks[1].output_dense.kernel,
        weights["electra/encoder/layer_1/output/dense/kernel"],
    )


def test_discriminator_only_and_mismatched_tf1_checkpoints(tmp_path):
    config = tiny(embedding_size=12)  # E == H: the original makes no electra/embeddings_project
    names = original_electra_names(config, heads=False)
    assert not any("embeddings_project" in n for n in names)
    write_tf1_checkpoint(tmp_path / "disc", random_arrays(names))
    model, report = checkpoints.load_tf1_electra(tmp_path / "disc", config)
    assert isinstance(model, electra.ElectraEncoder) and not report.heads
    # Untied generator embeddings (generator/embeddings/...) have no place: named, not dropped.
    untied = original_electra_names(config) | {"generator/embeddings/word_embeddings": (V, 12)}
    write_tf1_checkpoint(tmp_path / "untied", random_arrays(untied))
    with pytest.raises(InputError, match="generator/embeddings/word_embeddings .*no place"):
        checkpoints.load_tf1_electra(tmp_path / "untied", config)
    with pytest.raises(InputError, match="embeddings_project/kernel: missing"):
        checkpoints.load_tf1_electra(tmp_path / "disc", tiny(embedding_size=6))


def test_dynamically_masked_batches_feed_the_task(tmp_path):
    """--masking=dynamic: tf.data masks the records (80/10/10); the discriminator then sees
    the original sequence with samples at exactly the predicted positions."""
    from data_prep import features, masking

    rng = np.random.default_rng(1)
    rows = [[2, *rng.integers(5, V, size=8).tolist(), 3] for _ in range(6)]
    with tf.io.TFRecordWriter(str(tmp_path / "packed.tfrecord")) as w:
        for ids in rows:
            w.write(features.serialize_packed_example(ids, [0] * len(ids), 0, 11))
    spec = masking.DynamicMasking(0.3, 3, mask_id=4, vocab_size=V, special_ids=(0, 2, 3))
    data = features.pretraining_dataset(
        [str(tmp_path / "packed.tfrecord")], 3, 11, 3, False, dynamic_masking=spec
    )
    feed = next(iter(data))
    model = electra.ElectraPretrainer(tiny())
    model.build()
    out = model(feed, seed=tf.constant([7, 8], tf.int64))
    original = np.array([r + [0] for r in rows[:3]])  # padded to 11
    corrupted, _ = electra.replace_tokens(
        feed["input_ids"],
        feed["masked_lm_positions"],
        feed["masked_lm_ids"],
        feed["masked_lm_weights"],
        out["sampled_ids"],
    )
    predicted = np.zeros((3, 11), bool)
    for b in range(3):
        for p, w in zip(feed["masked_lm_positions"][b].numpy(), feed["masked_lm_weights"][b]):
            predicted[b, p] |= bool(w)
    assert predicted.sum() == 3 * 3  # round(10 * 0.3) predictions per row
    np.testing.assert_array_equal(corrupted.numpy()[~predicted], original[~predicted])
    labels = out["disc_labels"].numpy()
    assert not labels[~predicted].any()
    np.testing.assert_array_equal(
        labels[predicted], (corrupted.numpy() != original)[predicted].astype(int)
    )


def hf_electra_shapes(config: electra.ElectraConfig) -> dict:
    """Hugging Face ElectraForPreTraining's state-dict names and shapes (transformers'
    modeling_electra: nn.Linear weights are (out, in); no pooler), from the published layout."""
    c = config
    e, h, i, v = c.embedding_size, c.hidden_size, c.intermediate_size, c.vocab_size
    out = {
        "electra.embeddings.word_embeddings.weight": (v, e),
        "electra.embeddings.position_embeddings.weight": (c.max_position_embeddings, e),
        "electra.embeddings.token_type_embeddings.weight": (c.type_vocab_size, e),
        "electra.embeddings.LayerNorm.weight": (e,),
        "electra.embeddings.LayerNorm.bias": (e,),
        "electra.embeddings_project.weight": (h, e),
        "electra.embeddings_project.bias": (h,),
        "discriminator_predictions.dense.weight": (h, h),
        "discriminator_predictions.dense.bias": (h,),
        "discriminator_predictions.dense_prediction.weight": (1, h),
        "discriminator_predictions.dense_prediction.bias": (1,),
    }
    for n in range(c.num_hidden_layers):
        p = f"electra.encoder.layer.{n}."
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            out |= {f"{p}attention.{name}.weight": (h, h), f"{p}attention.{name}.bias": (h,)}
        out |= {
            f"{p}attention.output.LayerNorm.weight": (h,),
            f"{p}attention.output.LayerNorm.bias": (h,),
            f"{p}intermediate.dense.weight": (i, h),
            f"{p}intermediate.dense.bias": (i,),
            f"{p}output.dense.weight": (h, i),
            f"{p}output.dense.bias": (h,),
            f"{p}output.LayerNorm.weight": (h,),
            f"{p}output.LayerNorm.bias": (h,),
        }
    return out


def hub_from_hf_arrays(config, arrays):
    """keras-hub's independent ElectraBackbone holding the Hugging Face tensors, each put in
    place here from its published name (keras-hub ships no ELECTRA converter)."""
    import keras_hub

    c = config
    h, n = c.hidden_size, c.num_attention_heads
    d = h // n
    hub = keras_hub.models.ElectraBackbone(
        vocab_size=c.vocab_size,
        num_layers=c.num_hidden_layers,
        num_heads=n,
        hidden_dim=h,
        embedding_dim=c.embedding_size,
        intermediate_dim=c.intermediate_size,
        dropout=0.0,
        max_sequence_length=c.max_position_embeddings,
        num_segments=c.type_vocab_size,
    )
    a = {k.removeprefix("electra."): x for k, x in arrays.items()}
    hub.token_embedding.embeddings.assign(a["embeddings.word_embeddings.weight"])
    hub.position_embedding.position_embeddings.assign(a["embeddings.position_embeddings.weight"])
    hub.segment_embedding.embeddings.assign(a["embeddings.token_type_embeddings.weight"])
    ln = ("LayerNorm.weight", "LayerNorm.bias")
    hub.embeddings_layer_norm.set_weights([a[f"embeddings.{x}"] for x in ln])
    hub.embeddings_projection.set_weights(
        [a["embeddings_project.weight"].T, a["embeddings_project.bias"]]
    )
    for k, layer in enumerate(hub.transformer_layers):
        p = f"encoder.layer.{k}."
        att = layer._self_attention_layer
        for part, dense in (("query", att._query_dense), ("key", att._key_dense)) + (
            ("value", att._value_dense),
        ):
            w = a[f"{p}attention.self.{part}.weight"].T.reshape(h, n, d)  # (H, H) -> (H, N, D)
            dense.set_weights([w, a[f"{p}attention.self.{part}.bias"].reshape(n, d)])
        out_w = a[f"{p}attention.output.dense.weight"].T.reshape(n, d, h)  # (H, H) -> (N, D, H)
        att._output_dense.set_weights([out_w, a[f"{p}attention.output.dense.bias"]])
        layer._self_attention_layer_norm.set_weights([a[f"{p}attention.output.{x}"] for x in ln])
        layer._feedforward_intermediate_dense.set_weights(
            [a[f"{p}intermediate.dense.weight"].T, a[f"{p}intermediate.dense.bias"]]
        )
        layer._feedforward_output_dense.set_weights(
            [a[f"{p}output.dense.weight"].T, a[f"{p}output.dense.bias"]]
        )
        layer._feedforward_layer_norm.set_weights([a[f"{p}output.{x}"] for x in ln])
    return hub


def write_hf_electra(folder, config: electra.ElectraConfig, arrays: dict) -> None:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    generator = ("generator_hidden_size", "generator_layers")
    hf_config = {
        "architectures": ["ElectraForPreTraining"],
        "model_type": "electra",
        **{k: v for k, v in config.to_dict().items() if k not in generator},
        "hidden_act": "gelu_new",  # the tanh GELU, which keras-hub's backbone computes
        "layer_norm_eps": 1e-12,
        "summary_type": "first",
        "summary_use_proj": True,
        "summary_activation": "gelu",
        "summary_last_dropout": 0.1,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
    }
    (folder / "config.json").write_text(json.dumps(hf_config))


def test_hugging_face_electra_matches_keras_hub_electra_backbone(tmp_path):
    """A Hugging Face ELECTRA discriminator folder read by Cloze (load_hf) computes what
    keras-hub's ElectraBackbone computes with the same tensors; the discriminator head is listed
    as not converted, and an encoder written back (save_hf) has every tensor unchanged."""
    config = tiny(hidden_act="gelu")
    arrays = random_arrays(hf_electra_shapes(config), seed=7)
    write_hf_electra(tmp_path / "hf", config, arrays)
    read = checkpoints.read_any_config(tmp_path / "hf" / "config.json")
    assert read == config  # generator fields: the original's defaults, as TINY
    encoder, report = checkpoints.load_hf(tmp_path / "hf", read)
    assert isinstance(encoder, electra.ElectraEncoder)
    assert sum("discriminator head" in why for why in report.ignored.values()) == 4
    features, _ = batch(seed=2)
    inputs = {k: features[k] for k in ("input_ids", "input_mask")}
    inputs["segment_ids"] = np.repeat([[0, 0, 0, 0, 1, 1, 1]], B, axis=0).astype("int32")
    ours = np.array(encoder(inputs)["sequence_output"])
    hub = hub_from_hf_arrays(config, arrays)
    theirs = hub(
        {
            "token_ids": inputs["input_ids"],
            "segment_ids": inputs["segment_ids"],
            "padding_mask": inputs["input_mask"],
        }
    )
    real = np.asarray(inputs["input_mask"]).astype(bool)
    np.testing.assert_allclose(ours[real], np.array(theirs["sequence_output"])[real], atol=2e-5)

    checkpoints.save_hf(encoder, tmp_path / "back")
    from safetensors.numpy import load_file

    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    mine = {k.removeprefix("electra."): a for k, a in arrays.items() if k.startswith("electra.")}
    assert back.keys() == mine.keys()
    for name in mine:
        np.testing.assert_array_equal(back[name], mine[name], err_msg=name)


def test_electra_pretrainer_to_hugging_face_discriminator_and_generator(tmp_path):
    """An ElectraPretrainer written as Hugging Face folders: the discriminator
    (ElectraForPreTraining, with its head) and the generator (generator/, ElectraForMaskedLM
    with the shared embeddings and its own sizes); each reads back into the same encoder."""
    config = tiny()
    model = electra.ElectraPretrainer(config)
    model.build()
    files, _ = checkpoints.save_hf(model, tmp_path / "hf")
    from safetensors.numpy import load_file

    disc = load_file(str(tmp_path / "hf" / "model.safetensors"))
    np.testing.assert_array_equal(
        disc["discriminator_predictions.dense_prediction.weight"],
        model.discriminator_predictions.dense_1.kernel.numpy().T,
    )
    gen_config = checkpoints.read_any_config(tmp_path / "hf" / "generator" / "config.json")
    h_g, l_g = config.generator_sizes()
    assert (gen_config.hidden_size, gen_config.num_hidden_layers) == (h_g, l_g)
    assert gen_config.embedding_size == config.embedding_size
    generator, report = checkpoints.load_hf(tmp_path / "hf" / "generator", gen_config)
    assert any("generator's MLM head" in why for why in report.ignored.values())
    discriminator, _ = checkpoints.load_hf(
        tmp_path / "hf", checkpoints.read_any_config(tmp_path / "hf" / "config.json")
    )
    inputs, _ = batch(seed=3)
    for ours, theirs in ((discriminator, model.encoder), (generator, model.generator)):
        np.testing.assert_array_equal(
            ours(inputs)["sequence_output"], theirs(inputs)["sequence_output"]
        )
    gen = load_file(str(tmp_path / "hf" / "generator" / "model.safetensors"))
    np.testing.assert_array_equal(
        gen["generator_lm_head.bias"], model.generator_predictions.output_bias.numpy()
    )


# ---------------------------------------------------------------------------------------------
# Replaced-token detection: class balance metrics, learning, and ELECTRA's dynamic masking


def test_detection_balance_sums_match_sklearn_per_class_and_auc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(B, S)).astype("float32")
    labels = (rng.random((B, S)) < 0.3).astype("int32")
    labels[0, :2] = 1
    labels[0, 2] = 0
    mask = np.ones((B, S), "int32")
    mask[1, 4:] = 0
    logits[1, 4:] = 50.0  # padding scoring highest must not count
    labels[1, 5] = 1
    got = {k: float(v) for k, v in tasks.detection_balance_sums(logits, labels, mask).items()}
    real = mask.astype(bool)
    z, y = logits[real], labels[real].astype(bool)
    assert got["disc_ordered_pairs"] / got["disc_pairs"] == pytest.approx(
        roc_auc_score(y, z), abs=1e-6
    )
    assert got["disc_pairs"] == y.sum() * (~y).sum()
    p = 1 / (1 + np.exp(-z))
    assert got["disc_prob_replaced"] == pytest.approx(p[y].sum(), rel=1e-5)
    assert got["disc_prob_original"] == pytest.approx(p[~y].sum(), rel=1e-5)
    assert got["disc_original"] == (~y).sum()
    assert got["disc_true_negative"] == ((z <= 0) & ~y).sum()


def test_discriminator_learns_to_flag_replaced_tokens_on_a_repeated_batch():
    """On one batch seen again and again the discriminator can remember the original tokens, so
    replaced ones (new samples every step) become detectable: within 60 steps it must rank them
    above the originals (AUC) and call most of them replaced, on samples it has not seen. A
    label, sampling or loss-weight bug (labels never 1, samples equal to the input, the
    detection loss not reaching the encoder) leaves it at the base rate: AUC near 0.5, recall 0.
    """
    from training import optimization

    v, b, s, p = 61, 5, 13, 3
    config = tiny(vocab_size=v, hidden_size=24, embedding_size=24, intermediate_size=37)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, v, size=(b, s)).astype("int32")
    positions = np.stack([np.sort(rng.choice(np.arange(1, s), p, replace=False)) for _ in ids])
    positions = positions.astype("int32")
    masked = ids.copy()
    np.put_along_axis(masked, positions, 4, axis=1)
    feed = {
        "input_ids": masked,
        "input_mask": np.ones((b, s), "int32"),
        "segment_ids": np.zeros((b, s), "int32"),
        "masked_lm_positions": positions,
        "masked_lm_ids": np.take_along_axis(ids, positions, axis=1),
        "masked_lm_weights": np.ones((b, p), "float32"),
    }
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = electra.ElectraPretrainer(config)
        model.build()
        optimizer = optimization.create_optimizer(3e-3, 60, 6)
        optimizer.build(model.trainable_variables)
    task = tasks.electra_pretraining_task(model, seed=5, step=optimizer.iterations)
    fit = trainer.Trainer(strategy, task, optimizer)
    batches = iter(tf.data.Dataset.from_tensors(feed).repeat())

    def held_out(step):  # fresh samples: seeds the training steps never used
        rows = []
        for k in range(4):
            out = model(feed, seed=tf.constant([99, 100 * step + k], tf.int64))
            sums = tasks.detection_balance_sums(
                out["disc_logits"], out["disc_labels"], feed["input_mask"]
            )
            called = out["disc_logits"].numpy() > 0
            y = out["disc_labels"].numpy().astype(bool)
            rows.append([float(sums["disc_ordered_pairs"]), float(sums["disc_pairs"])])
            rows[-1] += [(called & y).sum(), y.sum()]
        a = np.sum(rows, axis=0)
        return a[0] / a[1], a[2] / a[3]

    auc0, _ = held_out(0)
    rows = fit.train_steps(batches, 60)
    auc, recall = held_out(1)
    metrics = fit.metrics_from_sums(rows[-10:].sum(0))
    assert abs(auc0 - 0.5) < 0.2, auc0
    assert auc > 0.9 and recall > 0.5, (auc, recall)
    # The training-time metrics agree: replaced fraction p / s (the generator rarely samples
    # the original), detection well above chance, originals still called original.
    assert metrics["disc_replaced_fraction"] == pytest.approx(p / s, abs=0.04)
    assert metrics["disc_auc"] > 0.8 and metrics["disc_original_accuracy"] > 0.9


def test_electra_dynamic_masking_is_85_mask_15_kept_and_bert_keeps_80_10_10():
    from data_prep import masking

    rng = np.random.default_rng(2)
    ids = rng.integers(5, 400, size=(64, 40)).astype("int32")
    mask = np.ones_like(ids)
    seed = tf.constant([4, 2], tf.int64)
    spec = dict(masked_lm_prob=1.0, max_predictions_per_seq=40, mask_id=4, vocab_size=400)
    out = {}
    for name, rates in (("bert", {}), ("electra", electra.DYNAMIC_MASKING)):
        s = masking.DynamicMasking(**spec, special_ids=(0, 2, 3), **rates)
        corrupted = masking.mask_dynamic(ids, mask, seed, s)["input_ids"].numpy()
        out[name] = (
            (corrupted == 4).mean(),
            (corrupted == ids).mean(),
            ((corrupted != 4) & (corrupted != ids)).mean(),
        )
    # 2,560 predictions each: 4 standard errors of a fraction near 0.1-0.15 are about 0.03.
    np.testing.assert_allclose(out["electra"][:2], (0.85, 0.15), atol=0.03)
    assert out["electra"][2] == 0.0  # no random token: what the generator sees is real or [MASK]
    np.testing.assert_allclose(out["bert"], (0.8, 0.1, 0.1), atol=0.03)
    with pytest.raises(ValueError, match="mask_token_prob 0.9 and random_token_prob 0.2"):
        masking.DynamicMasking(**spec, special_ids=(0,), mask_token_prob=0.9, random_token_prob=0.2)
