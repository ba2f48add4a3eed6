"""BERT modeling: config round trips and errors (every family's config through bert.JsonConfig),
Keras contract, save/load, and parity of the forward pass with keras-hub's independent
BertBackbone at an explicit tolerance."""

import json
from pathlib import Path

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from data_prep.errors import InputError
from modeling import albert, bart, bert, electra, elmo, gpt, layers, t5, xlnet
from tests import helpers

B, S = 3, 7
ROOT = Path(__file__).resolve().parents[1]


def random_inputs(config, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, size=(B, S)).astype("int32")
    mask = np.ones((B, S), "int32")
    mask[1, 5:] = 0  # padding in one row
    seg = np.zeros((B, S), "int32")
    seg[:, 4:] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": seg}


def test_published_configs_load_unchanged_and_round_trip(tmp_path):
    for name in ("tiny", "mini", "small", "medium", "base", "large"):
        c = bert.BertConfig.from_json_file(f"configs/bert_{name}.json")
        path = tmp_path / f"{name}.json"
        path.write_text(c.to_json_string())
        assert bert.BertConfig.from_json_file(path) == c
    base = bert.BertConfig.from_json_file("configs/bert_base.json")
    assert (base.hidden_size, base.num_hidden_layers, base.intermediate_size) == (768, 12, 3072)
    # The exact text of Google's uncased_L-12_H-768_A-12/bert_config.json loads as is.
    published = (
        '{"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,'
        ' "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,'
        ' "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12,'
        ' "type_vocab_size": 2, "vocab_size": 30522}'
    )
    (tmp_path / "bert_config.json").write_text(published)
    assert bert.BertConfig.from_json_file(tmp_path / "bert_config.json") == base


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_sise": 12}, r"unknown key\(s\) \['hidden_sise'\]"),
        ({"__drop__": "num_hidden_layers"}, r"missing key\(s\) \['num_hidden_layers'\]"),
        ({"hidden_act": "swishy"}, "hidden_act"),
        ({"num_attention_heads": 5}, "not a multiple"),
        ({"num_hidden_layers": "2"}, "expected an integer"),
    ],
)
def test_bad_config_errors_name_file_and_key(tmp_path, change, message):
    values = dict(helpers.TINY)
    if "__drop__" in change:
        del values[change["__drop__"]]
    else:
        values.update(change)
    path = tmp_path / "bad_config.json"
    path.write_text(json.dumps(values))
    with pytest.raises(InputError, match=message) as err:
        bert.BertConfig.from_json_file(path)
    assert "bad_config.json" in str(err.value)


def test_config_json_syntax_error_names_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  "vocab_size": 5,\n  oops\n}')
    with pytest.raises(InputError, match=r"c.json:3"):
        bert.BertConfig.from_json_file(path)


def test_shapes_and_padding_does_not_leak():
    config = helpers.tiny_config()
    model = bert.BertEncoder(config)
    inputs = random_inputs(config)
    out = model(inputs)
    assert out["sequence_output"].shape == (B, S, 12)
    assert out["pooled_output"].shape == (B, 12)
    assert len(out["encoder_outputs"]) == config.num_hidden_layers + 1
    # Changing a padded token must not change any real position's output.
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["input_ids"][1, 6] = (changed["input_ids"][1, 6] + 1) % config.vocab_size
    out2 = model(changed)
    np.testing.assert_allclose(
        out["sequence_output"][1, :5], out2["sequence_output"][1, :5], atol=1e-6
    )


def test_pretrainer_heads_and_weight_tying():
    config = helpers.tiny_config()
    model = bert.BertPretrainer(config)
    inputs = random_inputs(config) | {"masked_lm_positions": np.array([[1, 2], [0, 3], [4, 6]])}
    out = model(inputs)
    assert out["mlm_logits"].shape == (B, 2, config.vocab_size)
    assert out["nsp_logits"].shape == (B, 2)
    # The MLM output matrix is the input embedding (tied), not a separate variable.
    assert not any("masked_lm" in v.path and v.shape == (53, 12) for v in model.weights)
    emb = model.encoder.embeddings.word_embeddings
    emb.assign(emb * 2.0)
    assert not np.allclose(model(inputs)["mlm_logits"], out["mlm_logits"])


def test_gelu_variants():
    x = np.linspace(-4, 4, 9).astype("float32")
    exact = np.array(layers.gelu_exact(x))
    tanh = np.array(layers.gelu_tanh(x))
    import math

    want = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(exact, want, atol=1e-6)
    assert 0 < np.max(np.abs(tanh - exact)) < 1e-3  # close but not the same function


def test_get_config_round_trip_and_keras_file(tmp_path):
    config = helpers.tiny_config()
    model = bert.BertEncoder(config)
    inputs = random_inputs(config)
    want = model(inputs)["sequence_output"]
    clone = bert.BertEncoder.from_config(model.get_config())
    clone(inputs)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(inputs)["sequence_output"], want, atol=1e-6)
    path = tmp_path / "encoder.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(loaded(inputs)["sequence_output"], want, atol=1e-6)


def test_checkpoint_holds_every_variable(tmp_path):
    config = helpers.tiny_config()
    model = bert.BertPretrainer(config)
    model.build()
    prefix = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    stored = {n for n, _ in tf.train.list_variables(prefix)}
    assert sum("VARIABLE_VALUE" in n and n.startswith("model/") for n in stored) == len(
        model.trainable_variables
    )
    other = bert.BertPretrainer(config)
    other.build()
    tf.train.Checkpoint(model=other).restore(prefix).assert_existing_objects_matched()
    for a, b in zip(model.trainable_variables, other.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def copy_into_keras_hub(model: bert.BertEncoder, hub) -> None:
    """Copies Cloze BERT weights into keras_hub.models.BertBackbone (an independent
    implementation with separate Q/K/V EinsumDense layers)."""
    c = model.config
    n, d, h = c.num_attention_heads, c.hidden_size // c.num_attention_heads, c.hidden_size
    e = model.embeddings
    hub.get_layer("token_embedding").embeddings.assign(e.word_embeddings)
    hub.get_layer("position_embedding").position_embeddings.assign(e.position_embeddings)
    hub.get_layer("segment_embedding").embeddings.assign(e.token_type_embeddings)
    hub.get_layer("embeddings_layer_norm").set_weights(e.layer_norm.get_weights())
    for block, layer in zip(model.blocks, hub.transformer_layers):
        kernel = block.attention.qkv.kernel.numpy().reshape(h, 3, n, d)  # (H, 3H) -> (H, 3, N, D)
        bias = block.attention.qkv.bias.numpy().reshape(3, n, d)
        att = layer._self_attention_layer
        for i, part in enumerate((att._query_dense, att._key_dense, att._value_dense)):
            part.set_weights([kernel[:, i], bias[i]])
        out = block.attention.output_dense
        att._output_dense.set_weights([out.kernel.numpy().reshape(n, d, h), out.bias.numpy()])
        layer._self_attention_layer_norm.set_weights(block.attention_layer_norm.get_weights())
        layer._feedforward_intermediate_dense.set_weights(block.intermediate.get_weights())
        layer._feedforward_output_dense.set_weights(block.output_dense.get_weights())
        layer._feedforward_layer_norm.set_weights(block.output_layer_norm.get_weights())
    hub.get_layer("pooled_dense").set_weights(model.pooler.get_weights())


def test_forward_pass_matches_keras_hub_bert_backbone():
    config = helpers.tiny_config(initializer_range=0.5)  # large weights make differences visible
    model = bert.BertEncoder(config)
    inputs = random_inputs(config, seed=1)
    ours = model(inputs)
    hub = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        dropout=0.0,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size,
    )
    copy_into_keras_hub(model, hub)
    theirs = hub(
        {
            "token_ids": inputs["input_ids"],
            "segment_ids": inputs["segment_ids"],
            "padding_mask": inputs["input_mask"],
        }
    )
    real = inputs["input_mask"].astype(bool)  # keras-hub zeroes nothing, but compare real tokens
    np.testing.assert_allclose(
        np.array(ours["sequence_output"])[real],
        np.array(theirs["sequence_output"])[real],
        atol=2e-5,
    )
    np.testing.assert_allclose(ours["pooled_output"], theirs["pooled_output"], atol=2e-5)


def test_load_config_checks_sequence_length_and_vocab(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(helpers.tiny_config().to_json_string())
    assert bert.load_config(path, 16, 53).vocab_size == 53
    with pytest.raises(InputError, match=r"max_position_embeddings=16 .*--max_seq_length=17"):
        bert.load_config(path, 17)
    with pytest.raises(InputError, match=r"vocab_size=53 is smaller than the vocabulary's 54"):
        bert.load_config(path, 16, 54)


def test_layer_norm_eps_reaches_every_layer_norm_and_survives_serialization():
    """BertConfig.layer_norm_eps (RoBERTa's 1e-5) is the epsilon of the embeddings', every
    block's and the heads' LayerNorms, and of a block rebuilt from its Keras config; the
    default is the original BERT's 1e-12."""
    import keras

    model = bert.BertPretrainer(helpers.tiny_config(layer_norm_eps=1e-5), span_boundary=True)
    model.build()
    norms = [x for x in model._flatten_layers() if isinstance(x, keras.layers.LayerNormalization)]
    assert len(norms) == 1 + 2 * helpers.TINY["num_hidden_layers"] + 1 + 2
    assert {n.epsilon for n in norms} == {1e-5}
    block = model.encoder.blocks[0]
    again = type(block).from_config(block.get_config())
    assert again.output_layer_norm.epsilon == again.attention_layer_norm.epsilon == 1e-5
    plain = bert.BertEncoder(helpers.tiny_config())
    assert plain.blocks[0].output_layer_norm.epsilon == 1e-12
    with pytest.raises(ValueError, match="layer_norm_eps 0 must be in"):
        helpers.tiny_config(layer_norm_eps=0)


def test_roberta_config_position_offset_and_one_segment_type(tmp_path):
    roberta = bert.BertConfig.from_json_file("configs/roberta_base.json")
    assert (roberta.position_offset, roberta.type_vocab_size, roberta.layer_norm_eps) == (
        2,
        1,
        1e-5,
    )
    assert (roberta.max_position_embeddings, roberta.hidden_act) == (514, "gelu_exact")
    path = tmp_path / "roberta.json"
    path.write_text(roberta.to_json_string())
    assert bert.BertConfig.from_json_file(path) == roberta
    # The optional fields are written only when set: published configs keep their eleven keys.
    assert not {"position_offset", "layer_norm_eps"} & set(helpers.tiny_config().to_dict())
    # Positions start at row 2: the same as an offset-0 model whose table starts there.
    config = helpers.tiny_config(position_offset=2, type_vocab_size=1)
    shifted = bert.BertEncoder(config)
    inputs = random_inputs(config) | {"segment_ids": np.zeros((B, S), "int32")}
    want = shifted(inputs)["sequence_output"]
    plain = bert.BertEncoder(helpers.tiny_config(type_vocab_size=1, max_position_embeddings=14))
    plain(inputs)
    for a, b in zip(plain.weights, shifted.weights, strict=True):
        value = b.numpy()[2:] if "position_embeddings" in b.path else b.numpy()
        a.assign(value)
    np.testing.assert_allclose(plain(inputs)["sequence_output"], want, atol=1e-6)
    assert bert.load_config("configs/roberta_base.json", 512).position_offset == 2
    with pytest.raises(InputError, match="--max_seq_length=513 plus position_offset=2"):
        bert.load_config("configs/roberta_base.json", 513)  # 513 + 2 > 514
    path.write_text(json.dumps({**helpers.TINY, "position_offset": 16}))
    with pytest.raises(InputError, match="position_offset 16 must be in"):
        bert.BertConfig.from_json_file(path)


def test_pretrainer_without_sentence_objective_freezes_the_head_but_keeps_it(tmp_path):
    config = helpers.tiny_config()
    none = bert.BertPretrainer(config, sentence_objective="none")
    none.build()
    trainable = {v.path for v in none.trainable_variables}
    assert not any("next_sentence" in p or "pooler" in p for p in trainable)
    # One checkpoint layout for every objective: a "none" checkpoint loads into an NSP model.
    prefix = tf.train.Checkpoint(model=none).save(str(tmp_path / "ckpt"))
    nsp = bert.BertPretrainer(config)
    nsp.build()
    tf.train.Checkpoint(model=nsp).restore(prefix).assert_existing_objects_matched()
    clone = bert.BertPretrainer.from_config(none.get_config())
    assert clone.sentence_objective == "none" and not clone.span_boundary
    with pytest.raises(ValueError, match="sentence_objective: expected one of"):
        bert.BertPretrainer(config, sentence_objective="nsp2")


def test_span_boundary_head_reads_only_the_boundaries_and_the_offset():
    config = helpers.tiny_config()
    model = bert.BertPretrainer(config, "sop", span_boundary=True)
    positions = np.array([[2, 3], [1, 2], [5, 5]])
    left, right = np.array([[1, 1], [0, 0], [4, 4]]), np.array([[4, 4], [3, 3], [6, 6]])
    inputs = random_inputs(config) | {
        "masked_lm_positions": positions,
        "masked_lm_span_left": left,
        "masked_lm_span_right": right,
    }
    out = model(inputs)
    assert out["sbo_logits"].shape == (B, 2, config.vocab_size)
    head, seq = model.span_boundary_head, model.encoder(inputs)["sequence_output"]
    table = model.encoder.embeddings.word_embeddings
    # Vectors inside the span do not matter; the two boundary vectors and the offset do.
    noisy = np.array(seq).copy()
    noisy[0, 2:4] += 5.0
    same = head(noisy, positions, left, right, table)
    np.testing.assert_allclose(same, out["sbo_logits"], atol=1e-5)
    noisy[0, 1] += 5.0
    assert not np.allclose(head(noisy, positions, left, right, table)[0], same[0])
    # Row 0: offsets 0 and 1 within the same span give different predictions.
    assert not np.allclose(out["sbo_logits"][0, 0], out["sbo_logits"][0, 1])


# bert.JsonConfig: the JSON round trip every family's config shares

# Each shipped config file and the class that reads it.
SHIPPED = [
    ("bert_tiny.json", bert.BertConfig),
    ("roberta_base.json", bert.BertConfig),
    ("albert_tiny.json", albert.AlbertConfig),
    ("electra_small.json", electra.ElectraConfig),
    ("gpt_tiny.json", gpt.GptConfig),
    ("t5_tiny.json", t5.T5Config),
    ("bart_tiny.json", bart.BartConfig),
    ("xlnet_tiny.json", xlnet.XLNetConfig),
    ("elmo_tiny.json", elmo.ElmoConfig),
]


@pytest.mark.parametrize("name, cls", SHIPPED, ids=[n for n, _ in SHIPPED])
def test_shipped_configs_round_trip_and_name_their_family_in_errors(tmp_path, name, cls):
    assert issubclass(cls, bert.JsonConfig)
    path = ROOT / "configs" / name
    config = cls.from_json_file(path)
    # The file's keys come back with their values (BERT and ELMo leave out the optional ones a
    # file left out; the others write every field).
    written, values = config.to_dict(), json.loads(path.read_text())
    assert {k: written[k] for k in values} == values
    again = tmp_path / name
    again.write_text(config.to_json_string())
    assert again.read_text().endswith("}\n") and cls.from_json_file(again) == config
    assert cls.from_dict(config.to_dict()) == config
    # replace: a new config with one field changed (each family's vocabulary size) and the
    # rest as they were.
    vocab = next(f for f in ("vocab_size", "n_vocab", "n_token", "n_tokens_vocab") if f in values)
    changed = config.replace(**{vocab: values[vocab] + 1})
    assert getattr(changed, vocab) == values[vocab] + 1 and getattr(config, vocab) == values[vocab]
    assert changed.replace(**{vocab: values[vocab]}) == config

    with pytest.raises(InputError, match=rf"nothing\.json: expected {cls.FILE_KIND}, found no"):
        cls.from_json_file(tmp_path / "nothing.json")
    with pytest.raises(InputError, match=rf"{name}: unknown key\(s\) \['speed'\]; a {cls.FAMILY} "):
        cls.from_dict({**config.to_dict(), "speed": 1}, name)
    (tmp_path / "broken.json").write_text('{\n  "vocab_size": 3,\n}\n')
    with pytest.raises(InputError, match=r"broken\.json:3: expected JSON, found a syntax error"):
        cls.from_json_file(tmp_path / "broken.json")


def test_each_family_names_itself():
    families = [cls.FAMILY for _, cls in SHIPPED[1:]]
    assert families == ["BERT", "ALBERT", "ELECTRA", "GPT", "T5", "BART", "XLNet", "ELMo"]
    assert len({cls.FILE_KIND for _, cls in SHIPPED[1:]}) == 8
