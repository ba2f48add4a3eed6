"""ALBERT modeling: the original config file, factorised embedding and layer sharing, a TF1 name
table that covers every variable one to one, parity with keras-hub's independent AlbertBackbone,
save/load, and the fine-tuning models built on its encoder."""

import json

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from data_prep.errors import InputError
from modeling import albert, finetuning
from training import trainer

B, S = 3, 7
TINY = dict(
    vocab_size=53,
    embedding_size=5,
    hidden_size=12,
    num_hidden_layers=4,
    num_hidden_groups=2,
    inner_group_num=2,
    num_attention_heads=3,
    intermediate_size=17,
    hidden_act="gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=16,
    type_vocab_size=2,
    initializer_range=0.02,
)


def tiny(**changes) -> albert.AlbertConfig:
    return albert.AlbertConfig(**{**TINY, **changes})


def random_inputs(seed=0, vocab_size=53):
    rng = np.random.default_rng(seed)
    mask = np.ones((B, S), "int32")
    mask[1, 5:] = 0
    seg = np.zeros((B, S), "int32")
    seg[:, 4:] = 1
    ids = rng.integers(0, vocab_size, size=(B, S)).astype("int32")
    return {"input_ids": ids, "input_mask": mask, "segment_ids": seg}


def test_published_albert_config_loads_and_round_trips(tmp_path):
    path = "configs/albert_base.json"
    config = albert.AlbertConfig.from_json_file(path)
    assert config.to_dict() == json.loads(open(path).read())  # all 18 published keys
    assert (config.embedding_size, config.hidden_size, config.num_hidden_groups) == (128, 768, 1)
    values = json.loads(open(path).read())
    for unused in albert.AlbertConfig.OPTIONAL:
        del values[unused]  # the four keys no ALBERT code reads may be left out
    (tmp_path / "short.json").write_text(json.dumps(values))
    assert albert.AlbertConfig.from_json_file(tmp_path / "short.json") == config
    tiny_file = albert.AlbertConfig.from_json_file("configs/albert_tiny.json")
    assert tiny_file.embedding_size < tiny_file.hidden_size


def test_albert_base_has_the_published_parameter_count():
    # Lan et al. 2020, Table 1: ALBERT base 12M parameters (BERT base 108M) without the heads;
    # the factorised embedding (30000 x 128 + 128 x 768) and one shared block make it so.
    encoder = albert.AlbertEncoder(albert.AlbertConfig.from_json_file("configs/albert_base.json"))
    encoder.build()
    count = sum(int(np.prod(v.shape)) for v in encoder.trainable_variables)
    assert 11.5e6 < count < 12.0e6


@pytest.mark.parametrize(
    "change, message",
    [
        ({"embedding_sise": 5}, r"unknown key\(s\) \['embedding_sise'\]"),
        ({"gap_size": 2}, "gap_size: expected 0"),
        ({"num_hidden_groups": 5}, "num_hidden_groups 5 must be in"),
        ({"inner_group_num": 0}, "inner_group_num 0"),
    ],
)
def test_bad_albert_config_names_file_and_key(tmp_path, change, message):
    path = tmp_path / "albert_config.json"
    path.write_text(json.dumps({**TINY, **change}))
    with pytest.raises(InputError, match=message) as err:
        albert.AlbertConfig.from_json_file(path)
    assert "albert_config.json" in str(err.value)


def test_load_encoder_config_tells_the_families_apart(tmp_path):
    from modeling import bert

    assert isinstance(
        albert.load_encoder_config("configs/albert_tiny.json", 16), albert.AlbertConfig
    )
    assert isinstance(albert.load_encoder_config("configs/bert_tiny.json", 16), bert.BertConfig)
    with pytest.raises(InputError, match="shorter than --max_seq_length=600"):
        albert.load_encoder_config("configs/albert_tiny.json", 600)


def test_shapes_sharing_and_group_schedule():
    config = tiny()
    encoder = albert.AlbertEncoder(config)
    inputs = random_inputs()
    out = encoder(inputs)
    assert out["sequence_output"].shape == (B, S, 12)
    assert out["pooled_output"].shape == (B, 12)
    assert len(out["encoder_outputs"]) == 4 * 2 + 1  # projected embeddings, then every block
    assert encoder.embeddings.word_embeddings.shape == (53, 5)  # V x E
    assert encoder.embedding_hidden_mapping_in.kernel.shape == (5, 12)  # E x H
    # int(l / L * G): layers 0, 1 run group 0 and layers 2, 3 group 1; with L=3, G=2: 0, 0, 1.
    assert [encoder.group_of_layer(i) for i in range(4)] == [0, 0, 1, 1]
    three = albert.AlbertEncoder(tiny(num_hidden_layers=3))
    assert [three.group_of_layer(i) for i in range(3)] == [0, 0, 1]
    # The same layers applied by hand, in that order.
    mask = inputs["input_mask"]
    x = encoder.embedding_hidden_mapping_in(
        encoder.embeddings(inputs["input_ids"], inputs["segment_ids"])
    )
    for g in (0, 0, 1, 1):
        for block in encoder.groups[g].blocks:
            x = block(x, mask)
    np.testing.assert_allclose(out["sequence_output"], x, atol=1e-6)
    # Sharing: more layers add no parameters.
    count = sum(int(np.prod(v.shape)) for v in encoder.trainable_variables)
    deeper = albert.AlbertEncoder(tiny(num_hidden_layers=12))
    deeper(inputs)
    assert sum(int(np.prod(v.shape)) for v in deeper.trainable_variables) == count
    # E == H: no projection, as the original (and its checkpoints).
    square = albert.AlbertEncoder(tiny(embedding_size=12))
    square(inputs)
    assert square.embedding_hidden_mapping_in is None
    assert not any("mapping" in v.path for v in square.weights)


def test_padding_does_not_leak_and_mlm_ties_to_the_factorised_table():
    config = tiny()
    model = albert.AlbertPretrainer(config)
    inputs = random_inputs() | {"masked_lm_positions": np.array([[1, 2], [0, 3], [4, 6]])}
    out = model(inputs)
    assert out["mlm_logits"].shape == (B, 2, 53) and out["nsp_logits"].shape == (B, 2)
    assert model.masked_lm.transform.kernel.shape == (12, 5)  # H -> E
    assert not any(v.shape == (53, 5) for v in model.masked_lm.weights)  # tied, not a copy
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["input_ids"][1, 6] = (changed["input_ids"][1, 6] + 1) % 53
    seq = model.encoder(inputs)["sequence_output"]
    np.testing.assert_allclose(
        seq[1, :5], model.encoder(changed)["sequence_output"][1, :5], atol=1e-6
    )
    emb = model.encoder.embeddings.word_embeddings
    emb.assign(emb * 2.0)
    assert not np.allclose(model(inputs)["mlm_logits"], out["mlm_logits"])
    assert model.sentence_objective == "sop"  # ALBERT's objective by default


def original_tf1_names(config: albert.AlbertConfig) -> dict:
    """The original TF1 ALBERT checkpoint variables (google-research/albert modeling.py and
    run_pretraining.py) with their shapes, written from the published layout."""
    c = config
    e, h, i, v = c.embedding_size, c.hidden_size, c.intermediate_size, c.vocab_size
    names = {
        "bert/embeddings/word_embeddings": (v, e),
        "bert/embeddings/token_type_embeddings": (c.type_vocab_size, e),
        "bert/embeddings/position_embeddings": (c.max_position_embeddings, e),
        "bert/embeddings/LayerNorm/gamma": (e,),
        "bert/embeddings/LayerNorm/beta": (e,),
        "bert/encoder/embedding_hidden_mapping_in/kernel": (e, h),
        "bert/encoder/embedding_hidden_mapping_in/bias": (h,),
        "bert/pooler/dense/kernel": (h, h),
        "bert/pooler/dense/bias": (h,),
        "cls/predictions/transform/dense/kernel": (h, e),
        "cls/predictions/transform/dense/bias": (e,),
        "cls/predictions/transform/LayerNorm/gamma": (e,),
        "cls/predictions/transform/LayerNorm/beta": (e,),
        "cls/predictions/output_bias": (v,),
        "cls/seq_relationship/output_weights": (2, h),
        "cls/seq_relationship/output_bias": (2,),
    }
    for g in range(c.num_hidden_groups):
        for k in range(c.inner_group_num):
            p = f"bert/encoder/transformer/group_{g}/inner_group_{k}"
            for part in ("query", "key", "value"):
                names[f"{p}/attention_1/self/{part}/kernel"] = (h, h)
                names[f"{p}/attention_1/self/{part}/bias"] = (h,)
            names |= {
                f"{p}/attention_1/output/dense/kernel": (h, h),
                f"{p}/attention_1/output/dense/bias": (h,),
                f"{p}/LayerNorm/gamma": (h,),
                f"{p}/LayerNorm/beta": (h,),
                f"{p}/ffn_1/intermediate/dense/kernel": (h, i),
                f"{p}/ffn_1/intermediate/dense/bias": (i,),
                f"{p}/ffn_1/intermediate/output/dense/kernel": (i, h),
                f"{p}/ffn_1/intermediate/output/dense/bias": (h,),
                f"{p}/LayerNorm_1/gamma": (h,),
                f"{p}/LayerNorm_1/beta": (h,),
            }
    return names


# The whole name map from Cloze's checkpoint paths to the original's, as rewrite rules in order:
# what convert_checkpoint will need for ALBERT (the Q|K|V fusion as for BERT).
TF1_RULES = [
    ("encoder/embeddings/layer_norm/", "bert/embeddings/LayerNorm/"),
    ("encoder/embeddings/", "bert/embeddings/"),
    ("encoder/embedding_hidden_mapping_in/", "bert/encoder/embedding_hidden_mapping_in/"),
    ("encoder/pooler/", "bert/pooler/dense/"),
    ("/attention/qkv/", "/attention_1/self/{query,key,value}/"),
    ("/attention/output_dense/", "/attention_1/output/dense/"),
    ("/attention_layer_norm/", "/LayerNorm/"),
    ("/intermediate/", "/ffn_1/intermediate/dense/"),
    ("/output_dense/", "/ffn_1/intermediate/output/dense/"),
    ("/output_layer_norm/", "/LayerNorm_1/"),
    ("encoder/group_", "bert/encoder/transformer/group_"),
    ("masked_lm/layer_norm/", "cls/predictions/transform/LayerNorm/"),
    ("masked_lm/transform/", "cls/predictions/transform/dense/"),
    ("masked_lm/output_bias", "cls/predictions/output_bias"),
    ("next_sentence/dense/kernel", "cls/seq_relationship/output_weights"),
    ("next_sentence/dense/bias", "cls/seq_relationship/output_bias"),
]


def test_checkpoint_variables_map_one_to_one_onto_the_original_tf1_names(tmp_path):
    config = tiny()
    model = albert.AlbertPretrainer(config)
    model.build()
    prefix = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    ours = {
        n[len("model/") : -len("/.ATTRIBUTES/VARIABLE_VALUE")]: tuple(s)
        for n, s in tf.train.list_variables(prefix)
        if n.startswith("model/") and n.endswith("VARIABLE_VALUE")
    }
    assert len(ours) == len(model.trainable_variables)
    theirs = original_tf1_names(config)
    mapped = {}
    for name, shape in ours.items():
        target = name
        for old, new in TF1_RULES:
            target = target.replace(old, new)
        if "{" in target:  # the fused Q|K|V: three originals, concatenated on the last axis
            head, rest = target.split("{")
            parts, tail = rest.split("}")
            sources = [head + p + tail for p in parts.split(",")]
            assert shape[-1] == 3 * theirs[sources[0]][-1]
        else:
            sources = [target]
            want = theirs[target]
            assert shape == (want[::-1] if "output_weights" in target else want), name
        for source in sources:
            assert source in theirs, (name, source)
            assert source not in mapped, source
            mapped[source] = name
    assert set(mapped) == set(theirs)  # every original variable has exactly one Cloze home


def copy_block(block, layer, n, d, h):
    """Cloze TransformerBlock -> keras-hub TransformerEncoder (separate Q/K/V EinsumDense)."""
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


def test_forward_pass_matches_keras_hub_albert_backbone():
    config = tiny(initializer_range=0.5)  # large weights make differences visible
    model = albert.AlbertEncoder(config)
    inputs = random_inputs(seed=1)
    ours = model(inputs)
    hub = keras_hub.models.AlbertBackbone(
        vocabulary_size=53,
        num_layers=4,
        num_heads=3,
        embedding_dim=5,
        hidden_dim=12,
        intermediate_dim=17,
        num_groups=2,
        num_inner_repetitions=2,
        dropout=0.0,
        max_sequence_length=16,
        num_segments=2,
    )
    e = model.embeddings
    hub.get_layer("token_embedding").embeddings.assign(e.word_embeddings)
    hub.get_layer("position_embedding").position_embeddings.assign(e.position_embeddings)
    hub.get_layer("segment_embedding").embeddings.assign(e.token_type_embeddings)
    hub.get_layer("embeddings_layer_norm").set_weights(e.layer_norm.get_weights())
    hub.get_layer("embedding_projection").set_weights(
        model.embedding_hidden_mapping_in.get_weights()
    )
    for group, hub_group in zip(model.groups, hub.transformer_layers, strict=True):
        for block, layer in zip(group.blocks, hub_group, strict=True):
            copy_block(block, layer, 3, 4, 12)
    hub.get_layer("pooled_dense").set_weights(model.pooler.get_weights())
    theirs = hub(
        {
            "token_ids": inputs["input_ids"],
            "segment_ids": inputs["segment_ids"],
            "padding_mask": inputs["input_mask"],
        }
    )
    real = inputs["input_mask"].astype(bool)
    np.testing.assert_allclose(
        np.array(ours["sequence_output"])[real],
        np.array(theirs["sequence_output"])[real],
        atol=2e-5,
    )
    np.testing.assert_allclose(ours["pooled_output"], theirs["pooled_output"], atol=2e-5)


def test_keras_file_round_trip_and_classifier_from_a_pretraining_checkpoint(tmp_path):
    config = tiny()
    encoder = albert.AlbertEncoder(config)
    inputs = random_inputs()
    want = encoder(inputs)["sequence_output"]
    encoder.save(tmp_path / "encoder.keras")
    loaded = keras.saving.load_model(tmp_path / "encoder.keras", safe_mode=True)
    np.testing.assert_allclose(loaded(inputs)["sequence_output"], want, atol=1e-6)

    pretrainer = albert.AlbertPretrainer(config)
    pretrainer.build()
    prefix = tf.train.Checkpoint(model=pretrainer).save(str(tmp_path / "ckpt"))
    classifier = finetuning.BertClassifier(config.to_dict(), 3)  # the dict says ALBERT
    classifier.build()
    assert isinstance(classifier.encoder, albert.AlbertEncoder)
    _, part = trainer.init_from_checkpoint(classifier, prefix)
    assert part == "encoder"
    np.testing.assert_allclose(
        classifier.encoder(inputs)["sequence_output"],
        pretrainer.encoder(inputs)["sequence_output"],
        atol=1e-6,
    )
    clone = finetuning.BertClassifier.from_config(classifier.get_config())
    assert isinstance(clone.encoder, albert.AlbertEncoder)
    assert classifier(inputs).shape == (B, 3)


def test_original_tf1_checkpoint_converts_every_variable_once(tmp_path):
    from modeling import checkpoints
    from tests.test_checkpoints import random_arrays, write_tf1_checkpoint

    config = tiny()
    weights = random_arrays(original_tf1_names(config))
    # ALBERT trained with LAMB: its slots and the step counter are in every released checkpoint.
    state = {f"{n}/lamb_m": np.zeros_like(a) for n, a in weights.items()}
    write_tf1_checkpoint(
        tmp_path / "model.ckpt-best", weights | state | {"global_step": np.int64(3)}
    )
    model, report = checkpoints.load_tf1_albert(tmp_path, config)  # the release's default name
    assert isinstance(model, albert.AlbertPretrainer)
    assert report.num_source_variables == len(weights) and len(report.ignored) == len(state) + 1
    group = "bert/encoder/transformer/group_1/inner_group_0"
    q, k, v = (weights[f"{group}/attention_1/self/{p}/kernel"] for p in ("query", "key", "value"))
    block = model.encoder.groups[1].blocks[0]
    np.testing.assert_array_equal(block.attention.qkv.kernel, np.concatenate([q, k, v], -1))
    np.testing.assert_array_equal(
        block.output_dense.kernel, weights[f"{group}/ffn_1/intermediate/output/dense/kernel"]
    )
    np.testing.assert_array_equal(
        model.next_sentence.dense.kernel, weights["cls/seq_relationship/output_weights"].T
    )
    back = checkpoints.export_arrays(model, checkpoints.tf1_albert_entries(config, True))
    assert back.keys() == weights.keys()
    for name in weights:
        np.testing.assert_array_equal(back[name], weights[name], err_msg=name)
    # The encoder alone (no cls/), and a config with other group counts named variable by variable.
    encoder_only = {n: a for n, a in weights.items() if not n.startswith("cls/")}
    write_tf1_checkpoint(tmp_path / "encoder" / "model.ckpt-best", encoder_only)
    encoder, _ = checkpoints.load_tf1_albert(tmp_path / "encoder", config)
    assert isinstance(encoder, albert.AlbertEncoder)
    with pytest.raises(InputError, match="group_1/inner_group_0/LayerNorm/gamma .*no place"):
        checkpoints.load_tf1_albert(tmp_path, config.replace(num_hidden_groups=1))


def hf_albert_shapes(config: albert.AlbertConfig) -> dict:
    """Hugging Face AlbertForPreTraining's state-dict names and shapes (transformers'
    modeling_albert: nn.Linear weights are (out, in)), written from the published layout."""
    c = config
    e, h, i, v = c.embedding_size, c.hidden_size, c.intermediate_size, c.vocab_size
    out = {
        "albert.embeddings.word_embeddings.weight": (v, e),
        "albert.embeddings.position_embeddings.weight": (c.max_position_embeddings, e),
        "albert.embeddings.token_type_embeddings.weight": (c.type_vocab_size, e),
        "albert.embeddings.LayerNorm.weight": (e,),
        "albert.embeddings.LayerNorm.bias": (e,),
        "albert.encoder.embedding_hidden_mapping_in.weight": (h, e),
        "albert.encoder.embedding_hidden_mapping_in.bias": (h,),
        "albert.pooler.weight": (h, h),
        "albert.pooler.bias": (h,),
        "predictions.LayerNorm.weight": (e,),
        "predictions.LayerNorm.bias": (e,),
        "predictions.dense.weight": (e, h),
        "predictions.dense.bias": (e,),
        "predictions.bias": (v,),
        "sop_classifier.classifier.weight": (2, h),
        "sop_classifier.classifier.bias": (2,),
    }
    for g in range(c.num_hidden_groups):
        for k in range(c.inner_group_num):
            p = f"albert.encoder.albert_layer_groups.{g}.albert_layers.{k}."
            for name in ("query", "key", "value", "dense"):
                out |= {f"{p}attention.{name}.weight": (h, h), f"{p}attention.{name}.bias": (h,)}
            out |= {
                f"{p}attention.LayerNorm.weight": (h,),
                f"{p}attention.LayerNorm.bias": (h,),
                f"{p}ffn.weight": (i, h),
                f"{p}ffn.bias": (i,),
                f"{p}ffn_output.weight": (h, i),
                f"{p}ffn_output.bias": (h,),
                f"{p}full_layer_layer_norm.weight": (h,),
                f"{p}full_layer_layer_norm.bias": (h,),
            }
    return out


def write_hf_albert(folder, config: albert.AlbertConfig, arrays: dict) -> None:
    """A Hugging Face ALBERT folder as save_pretrained writes it (safetensors + config.json)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    c = config
    hf_config = {
        "architectures": ["AlbertForPreTraining"],
        "model_type": "albert",
        **{k: v for k, v in c.to_dict().items() if k not in albert.AlbertConfig.OPTIONAL},
        "hidden_act": "gelu_new",  # transformers' name for the tanh GELU (Cloze's "gelu")
        "layer_norm_eps": 1e-12,
        "classifier_dropout_prob": 0.1,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
    }
    (folder / "config.json").write_text(json.dumps(hf_config))


def test_hugging_face_albert_matches_keras_hubs_own_converter(tmp_path):
    """The same Hugging Face ALBERT folder loaded by keras-hub (AlbertBackbone.from_preset with
    its transformers converter) and by Cloze (checkpoints.load_hf): the same outputs; and Cloze
    writes the folder back (save_hf) tensor for tensor."""
    from modeling import checkpoints
    from tests.test_checkpoints import random_arrays

    config = tiny()
    arrays = random_arrays(hf_albert_shapes(config), seed=3)
    write_hf_albert(tmp_path / "hf", config, arrays)
    read = checkpoints.read_any_config(tmp_path / "hf" / "config.json")
    assert read == config
    model, report = checkpoints.load_hf(tmp_path / "hf", read)
    assert isinstance(model, albert.AlbertPretrainer)
    assert report.num_source_variables == len(arrays)
    np.testing.assert_array_equal(
        model.next_sentence.dense.kernel, arrays["sop_classifier.classifier.weight"].T
    )
    hub = keras_hub.models.AlbertBackbone.from_preset(str(tmp_path / "hf"))
    inputs = random_inputs(seed=4)
    theirs = hub(
        {
            "token_ids": inputs["input_ids"],
            "segment_ids": inputs["segment_ids"],
            "padding_mask": inputs["input_mask"],
        }
    )
    ours = model.encoder(inputs)
    real = inputs["input_mask"].astype(bool)
    np.testing.assert_allclose(
        np.array(ours["sequence_output"])[real],
        np.array(theirs["sequence_output"])[real],
        atol=2e-5,
    )
    np.testing.assert_allclose(ours["pooled_output"], theirs["pooled_output"], atol=2e-5)

    _, notes = checkpoints.save_hf(model, tmp_path / "back")
    assert notes == []
    from safetensors.numpy import load_file

    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert back.keys() == arrays.keys()
    for name in arrays:
        np.testing.assert_array_equal(back[name], arrays[name], err_msg=name)
    assert checkpoints.read_any_config(tmp_path / "back" / "config.json") == config


def test_hugging_face_albert_with_equal_widths_needs_an_identity_projection(tmp_path):
    """Hugging Face ALBERT always has embedding_hidden_mapping_in; Cloze's (as the original's)
    exists only when E != H. With E == H an identity maps (and is written back); a trained one
    is refused, naming the tensor."""
    from modeling import checkpoints

    config = tiny(embedding_size=12)
    encoder = albert.AlbertEncoder(config)
    encoder.build()
    _, notes = checkpoints.save_hf(encoder, tmp_path / "hf")
    assert notes and "identity" in notes[0]
    loaded, _ = checkpoints.load_hf(tmp_path / "hf", config)
    inputs = random_inputs(seed=5)
    np.testing.assert_array_equal(
        loaded(inputs)["sequence_output"], encoder(inputs)["sequence_output"]
    )
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(tmp_path / "hf" / "model.safetensors"))
    arrays["encoder.embedding_hidden_mapping_in.weight"][0, 1] = 0.5
    save_file(arrays, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(InputError, match="embedding_hidden_mapping_in.weight.*identity"):
        checkpoints.load_hf(tmp_path / "hf", config)
