"""modeling/checkpoints.py: the name maps against checkpoints written with the original names, a
numpy reference forward pass, round trips through every format, and the bad-input errors.

The numpy reference below is written from the papers' equations and the published weight layouts
(PyTorch (out, in) kernels, TF1 (in, out) kernels, separate Q/K/V), in float64, sharing no code
with Cloze; tests/test_convert_checkpoint.py runs it on the real MiniLM weights too.
"""

from __future__ import annotations

import json
import math
import shutil
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import tokenization
from data_prep.errors import InputError
from modeling import bert, checkpoints
from tests import helpers
from training import trainer

B, S = 3, 7

# ---------------------------------------------------------------------------------------------
# An independent reference: BERT's forward pass in numpy float64
# ---------------------------------------------------------------------------------------------


def _gelu(x, act):
    if act == "gelu_exact":  # Hugging Face "gelu": x * Phi(x)
        return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    # The original TF1 BERT's tanh approximation (modeling.py gelu)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def params_from_hf(w: dict, num_layers: int, prefix: str = "") -> dict:
    """Hugging Face BertModel / BertForPreTraining names -> the reference's (in, out) layout."""
    f64 = {k: np.asarray(v, np.float64) for k, v in w.items()}

    def dense(name):
        return f64[f"{name}.weight"].T, f64[f"{name}.bias"]

    def norm(name):
        return f64[f"{name}.weight"], f64[f"{name}.bias"]

    e = f"{prefix}embeddings"
    p = {
        "word": f64[f"{e}.word_embeddings.weight"],
        "type": f64[f"{e}.token_type_embeddings.weight"],
        "position": f64[f"{e}.position_embeddings.weight"],
        "embedding_norm": norm(f"{e}.LayerNorm"),
        "pooler": dense(f"{prefix}pooler.dense"),
        "layers": [],
    }
    for n in range(num_layers):
        a = f"{prefix}encoder.layer.{n}"
        p["layers"].append(
            {
                "query": dense(f"{a}.attention.self.query"),
                "key": dense(f"{a}.attention.self.key"),
                "value": dense(f"{a}.attention.self.value"),
                "attention_output": dense(f"{a}.attention.output.dense"),
                "attention_norm": norm(f"{a}.attention.output.LayerNorm"),
                "intermediate": dense(f"{a}.intermediate.dense"),
                "output": dense(f"{a}.output.dense"),
                "output_norm": norm(f"{a}.output.LayerNorm"),
            }
        )
    if "cls.predictions.bias" in f64:
        p["mlm"] = {
            "transform": dense("cls.predictions.transform.dense"),
            "norm": norm("cls.predictions.transform.LayerNorm"),
            "bias": f64["cls.predictions.bias"],
        }
        p["nsp"] = dense("cls.seq_relationship")
    return p


def params_from_tf1(w: dict, num_layers: int) -> dict:
    """google-research/bert names (kernels already (in, out)) -> the reference's layout."""
    f64 = {k: np.asarray(v, np.float64) for k, v in w.items()}

    def dense(name):
        return f64[f"{name}/kernel"], f64[f"{name}/bias"]

    def norm(name):
        return f64[f"{name}/gamma"], f64[f"{name}/beta"]

    p = {
        "word": f64["bert/embeddings/word_embeddings"],
        "type": f64["bert/embeddings/token_type_embeddings"],
        "position": f64["bert/embeddings/position_embeddings"],
        "embedding_norm": norm("bert/embeddings/LayerNorm"),
        "pooler": dense("bert/pooler/dense"),
        "layers": [],
    }
    for n in range(num_layers):
        a = f"bert/encoder/layer_{n}"
        p["layers"].append(
            {
                "query": dense(f"{a}/attention/self/query"),
                "key": dense(f"{a}/attention/self/key"),
                "value": dense(f"{a}/attention/self/value"),
                "attention_output": dense(f"{a}/attention/output/dense"),
                "attention_norm": norm(f"{a}/attention/output/LayerNorm"),
                "intermediate": dense(f"{a}/intermediate/dense"),
                "output": dense(f"{a}/output/dense"),
                "output_norm": norm(f"{a}/output/LayerNorm"),
            }
        )
    p["mlm"] = {
        "transform": dense("cls/predictions/transform/dense"),
        "norm": norm("cls/predictions/transform/LayerNorm"),
        "bias": f64["cls/predictions/output_bias"],
    }
    # The original stores the NSP classifier as output_weights (2, H): logits = x W^T + b.
    p["nsp"] = (
        f64["cls/seq_relationship/output_weights"].T,
        f64["cls/seq_relationship/output_bias"],
    )
    return p


def reference_forward(p, ids, segment_ids, mask, num_heads, act, positions=None) -> dict:
    """BERT (Devlin et al. 2019) in numpy float64.

    Returns hidden_states (L+1 arrays (B, S, H)), pooled (B, H), and with `positions` (B, P) and
    heads in `p`: mlm_logits (B, P, V), nsp_logits (B, 2).
    """

    def linear(x, wb):
        return x @ wb[0] + wb[1]

    s = ids.shape[1]
    x = p["word"][ids] + p["type"][segment_ids] + p["position"][:s][None]
    x = _layer_norm(x, *p["embedding_norm"])
    hidden = [x]
    h = x.shape[-1]
    d = h // num_heads
    for layer in p["layers"]:

        def heads(t):
            return t.reshape(t.shape[0], s, num_heads, d).transpose(0, 2, 1, 3)  # (B, N, S, D)

        q, k, v = (heads(linear(x, layer[n])) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)  # (B, N, S, S)
        scores = np.where(mask[:, None, None, :] > 0, scores, -np.inf)  # padding gets no weight
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(x.shape)  # (B, N, S, D) -> (B, S, H)
        x = _layer_norm(x + linear(context, layer["attention_output"]), *layer["attention_norm"])
        inner = _gelu(linear(x, layer["intermediate"]), act)
        x = _layer_norm(x + linear(inner, layer["output"]), *layer["output_norm"])
        hidden.append(x)
    pooled = np.tanh(linear(x[:, 0], p["pooler"]))
    out = {"hidden_states": hidden, "pooled": pooled}
    if positions is not None and "mlm" in p:
        picked = np.take_along_axis(x, positions[..., None], axis=1)  # (B, P, H)
        t = _layer_norm(_gelu(linear(picked, p["mlm"]["transform"]), act), *p["mlm"]["norm"])
        out["mlm_logits"] = t @ p["word"].T + p["mlm"]["bias"]
        out["nsp_logits"] = linear(pooled, p["nsp"])
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints with the original names, written the way the original code wrote them
# ---------------------------------------------------------------------------------------------


def original_tf1_shapes(c: bert.BertConfig, heads: bool = True) -> dict:
    """The variables google-research/bert's modeling.py + run_pretraining.py create, by name."""
    h, i, v = c.hidden_size, c.intermediate_size, c.vocab_size
    out = {
        "bert/embeddings/word_embeddings": (v, h),
        "bert/embeddings/token_type_embeddings": (c.type_vocab_size, h),
        "bert/embeddings/position_embeddings": (c.max_position_embeddings, h),
        "bert/embeddings/LayerNorm/beta": (h,),
        "bert/embeddings/LayerNorm/gamma": (h,),
    }
    for n in range(c.num_hidden_layers):
        a = f"bert/encoder/layer_{n}"
        for part in ("query", "key", "value"):
            out[f"{a}/attention/self/{part}/kernel"] = (h, h)
            out[f"{a}/attention/self/{part}/bias"] = (h,)
        out |= {
            f"{a}/attention/output/dense/kernel": (h, h),
            f"{a}/attention/output/dense/bias": (h,),
            f"{a}/attention/output/LayerNorm/beta": (h,),
            f"{a}/attention/output/LayerNorm/gamma": (h,),
            f"{a}/intermediate/dense/kernel": (h, i),
            f"{a}/intermediate/dense/bias": (i,),
            f"{a}/output/dense/kernel": (i, h),
            f"{a}/output/dense/bias": (h,),
            f"{a}/output/LayerNorm/beta": (h,),
            f"{a}/output/LayerNorm/gamma": (h,),
        }
    out |= {"bert/pooler/dense/kernel": (h, h), "bert/pooler/dense/bias": (h,)}
    if heads:
        out |= {
            "cls/predictions/transform/dense/kernel": (h, h),
            "cls/predictions/transform/dense/bias": (h,),
            "cls/predictions/transform/LayerNorm/beta": (h,),
            "cls/predictions/transform/LayerNorm/gamma": (h,),
            "cls/predictions/output_bias": (v,),
            "cls/seq_relationship/output_weights": (2, h),
            "cls/seq_relationship/output_bias": (2,),
        }
    return out


def random_arrays(shapes: dict, seed: int = 0, scale: float = 0.5) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        value = rng.normal(0.0, scale, size=shape)
        if name.endswith(("gamma", "LayerNorm.weight")):
            value = 1.0 + 0.1 * value  # layer-norm scales near 1, as trained ones are
        out[name] = value.astype(np.float32)
    return out


def write_tf1_checkpoint(prefix, arrays: dict) -> None:
    """Writes a name-based checkpoint with tf.compat.v1.train.Saver in a TF1 graph, as the original
    run_pretraining.py did (its Estimator saved through the same Saver), so every key is the
    variable's graph name."""
    with tf.Graph().as_default():
        variables = [
            tf.compat.v1.get_variable(name, initializer=tf.constant(value), use_resource=False)
            for name, value in arrays.items()
        ]
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(prefix), write_meta_graph=False)


def random_inputs(config, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, size=(B, S)).astype("int32")
    mask = np.ones((B, S), "int32")
    mask[1, 5:] = 0  # padding in one row
    seg = np.zeros((B, S), "int32")
    seg[:, 4:] = 1
    positions = np.array([[1, 2], [0, 3], [4, 6]], "int32")
    return {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": seg,
        "masked_lm_positions": positions,
    }


def outputs(model, inputs) -> dict:
    """Every output of an encoder or pretrainer as numpy, for exact comparisons."""
    encoder = model if isinstance(model, bert.BertEncoder) else model.encoder
    enc = encoder({k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")})
    out = {f"hidden_{i}": np.array(x) for i, x in enumerate(enc["encoder_outputs"])}
    out["pooled"] = np.array(enc["pooled_output"])
    if isinstance(model, bert.BertPretrainer):
        out |= {k: np.array(v) for k, v in model(inputs).items()}
    return out


def assert_same_outputs(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture(scope="module")
def tf1_setup(tmp_path_factory):
    """A TF1 checkpoint of the tiny config, heads included, with the optimizer slots and step
    counter that the original run_pretraining.py leaves in every checkpoint."""
    folder = tmp_path_factory.mktemp("tf1")
    config = helpers.tiny_config(hidden_act="gelu")
    weights = random_arrays(original_tf1_shapes(config))
    state = {f"{n}/adam_m": np.zeros_like(v) for n, v in weights.items()}
    state |= {f"{n}/adam_v": np.zeros_like(v) for n, v in weights.items()}
    state["global_step"] = np.array(1000, np.int64)
    write_tf1_checkpoint(folder / "bert_model.ckpt", weights | state)
    (folder / "bert_config.json").write_text(config.to_json_string())
    return folder, config, weights, state


# ---------------------------------------------------------------------------------------------
# TF1
# ---------------------------------------------------------------------------------------------


def test_tf1_checkpoint_loads_every_variable_once_and_matches_reference(tf1_setup):
    folder, config, weights, state = tf1_setup
    stored = {n for n, _ in tf.train.list_variables(str(folder / "bert_model.ckpt"))}
    assert stored == set(weights) | set(state)  # the writer kept the original names exactly
    model, report = checkpoints.load_tf1_bert(folder, config)
    assert isinstance(model, bert.BertPretrainer)
    mapped = [n for e in report.entries for n in e.sources]
    assert sorted(mapped) == sorted(weights)  # every weight used, and exactly once
    assert set(report.ignored) == set(state)  # optimizer slots and global_step, nothing else
    assert len(report.entries) == len(model.trainable_variables)
    assert "cls/seq_relationship/output_weights (2, 12) -> next_sentence/dense/kernel" in (
        report.summary()
    )

    inputs = random_inputs(config)
    ours = outputs(model, inputs)
    ref = reference_forward(
        params_from_tf1(weights, config.num_hidden_layers),
        inputs["input_ids"],
        inputs["segment_ids"],
        inputs["input_mask"],
        config.num_attention_heads,
        config.hidden_act,
        inputs["masked_lm_positions"],
    )
    real = inputs["input_mask"].astype(bool)
    for i, want in enumerate(ref["hidden_states"]):
        np.testing.assert_allclose(ours[f"hidden_{i}"][real], want[real], atol=2e-5)
    np.testing.assert_allclose(ours["pooled"], ref["pooled"], atol=2e-5)
    np.testing.assert_allclose(ours["mlm_logits"], ref["mlm_logits"], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(ours["nsp_logits"], ref["nsp_logits"], atol=2e-5)


def test_tf1_export_has_the_original_names_and_round_trips(tf1_setup, tmp_path):
    folder, config, weights, _ = tf1_setup
    model, _ = checkpoints.load_tf1_bert(folder, config)
    prefix = checkpoints.save_tf1_bert(model, tmp_path)
    reader = tf.train.load_checkpoint(prefix)
    assert set(reader.get_variable_to_shape_map()) == set(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value, err_msg=name)
    again, _ = checkpoints.load_tf1_bert(tmp_path, config)  # a folder: via its `checkpoint` file
    inputs = random_inputs(config)
    assert_same_outputs(outputs(model, inputs), outputs(again, inputs))


def test_tf1_encoder_only_checkpoint_gives_an_encoder(tmp_path):
    config = helpers.tiny_config()
    weights = random_arrays(original_tf1_shapes(config, heads=False))
    write_tf1_checkpoint(tmp_path / "bert_model.ckpt", weights)
    model, report = checkpoints.load_tf1_bert(tmp_path / "bert_model.ckpt", config)
    assert isinstance(model, bert.BertEncoder) and not report.heads
    assert sorted(n for e in report.entries for n in e.sources) == sorted(weights)


# ---------------------------------------------------------------------------------------------
# Hugging Face
# ---------------------------------------------------------------------------------------------


def random_pretrainer(config, seed=3):
    model = checkpoints.build_model(config, heads=True)
    rng = np.random.default_rng(seed)
    for v in model.trainable_variables:  # large random weights, so a swapped axis shows
        v.assign(rng.normal(0.0, 0.5, size=v.shape).astype(np.float32))
    return model


@pytest.mark.parametrize("heads", [True, False])
def test_hf_round_trip_is_exact(tmp_path, heads):
    from safetensors import safe_open

    config = helpers.tiny_config(hidden_act="gelu_exact")
    model = random_pretrainer(config)
    if not heads:
        model = model.encoder
    checkpoints.save_hf_bert(model, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "numpy") as f:
        names = set(f.keys())
        assert f.metadata() == {"format": "pt"}  # transformers refuses files without it
    prefix = "bert." if heads else ""
    assert f"{prefix}encoder.layer.1.attention.self.value.weight" in names
    assert ("cls.seq_relationship.weight" in names) == heads
    # Q, K, V kernels and biases are 6 tensors where Cloze has 2 (fused) per layer.
    assert len(names) == len(model.trainable_variables) + 4 * config.num_hidden_layers

    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert hf_config["hidden_act"] == "gelu"  # HF's "gelu" is the exact erf form
    assert hf_config["architectures"] == ["BertForPreTraining" if heads else "BertModel"]
    read_back = checkpoints.read_any_config(tmp_path / "config.json")
    assert read_back == config
    again, report = checkpoints.load_hf_bert(tmp_path, read_back)
    assert report.heads == heads and not report.ignored
    inputs = random_inputs(config)
    assert_same_outputs(outputs(model, inputs), outputs(again, inputs))


def test_hf_sharded_and_bfloat16_weights_load(tmp_path):
    """A sharded export (model.safetensors.index.json) and bfloat16 tensors, as large published
    checkpoints come, load with the same checks."""
    from safetensors.numpy import load_file, save_file
    from safetensors.tensorflow import save_file as save_tf_file

    config = helpers.tiny_config(hidden_act="gelu_exact")
    model = random_pretrainer(config, seed=7).encoder
    checkpoints.save_hf_bert(model, tmp_path)
    arrays = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(arrays)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({n: arrays[n] for n in first}, str(tmp_path / "model-00001-of-00002.safetensors"))
    bf16 = {n: tf.cast(arrays[n], tf.bfloat16) for n in second}
    save_tf_file(bf16, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map |= {n: "model-00002-of-00002.safetensors" for n in second}
    index = {"metadata": {}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded, report = checkpoints.load_hf_bert(tmp_path, config)
    assert report.num_source_variables == len(names)
    want = dict(arrays) | {n: tf.cast(v, tf.float32).numpy() for n, v in bf16.items()}
    again = checkpoints.export_arrays(loaded, checkpoints.hf_bert_entries(config, heads=False))
    for name in names:
        np.testing.assert_array_equal(again[name], want[name], err_msg=name)
    assert any(not np.array_equal(want[n], arrays[n]) for n in second)  # bf16 did round


def test_hf_weights_match_reference_and_tied_decoder_is_checked(tmp_path):
    from safetensors.numpy import save_file

    config = helpers.tiny_config(hidden_act="gelu_exact")
    model = random_pretrainer(config, seed=5)
    checkpoints.save_hf_bert(model, tmp_path)
    from safetensors.numpy import load_file

    arrays = load_file(str(tmp_path / "model.safetensors"))
    inputs = random_inputs(config)
    ref = reference_forward(
        params_from_hf(arrays, config.num_hidden_layers, "bert."),
        inputs["input_ids"],
        inputs["segment_ids"],
        inputs["input_mask"],
        config.num_attention_heads,
        "gelu_exact",
        inputs["masked_lm_positions"],
    )
    ours = outputs(model, inputs)
    real = inputs["input_mask"].astype(bool)
    np.testing.assert_allclose(ours["hidden_2"][real], ref["hidden_states"][2][real], atol=2e-5)
    np.testing.assert_allclose(ours["mlm_logits"], ref["mlm_logits"], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(ours["nsp_logits"], ref["nsp_logits"], atol=2e-5)

    # A file that stores the tied decoder (as some exports do) loads; an untied one is refused.
    word = arrays["bert.embeddings.word_embeddings.weight"]
    tied = dict(arrays, **{"cls.predictions.decoder.weight": word.copy()})
    (tmp_path / "tied").mkdir()
    save_file(tied, str(tmp_path / "tied" / "model.safetensors"))
    _, report = checkpoints.load_hf_bert(tmp_path / "tied" / "model.safetensors", config)
    assert "cls.predictions.decoder.weight" in report.ignored
    tied["cls.predictions.decoder.weight"] = word + 1.0
    save_file(tied, str(tmp_path / "tied" / "model.safetensors"))
    with pytest.raises(InputError, match=r"cls\.predictions\.decoder\.weight.*different values"):
        checkpoints.load_hf_bert(tmp_path / "tied" / "model.safetensors", config)


def test_hf_config_translation(tmp_path):
    minilm = {
        "_name_or_path": "nreimers/MiniLM-L6-H384-uncased",
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "gradient_checkpointing": False,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 384,
        "initializer_range": 0.02,
        "intermediate_size": 1536,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "model_type": "bert",
        "num_attention_heads": 12,
        "num_hidden_layers": 6,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "transformers_version": "4.8.2",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": 30522,
    }
    config = checkpoints.hf_config_to_bert_config(minilm)
    assert config.hidden_act == "gelu_exact" and config.num_hidden_layers == 6
    tanh = checkpoints.hf_config_to_bert_config(dict(minilm, hidden_act="gelu_new"))
    assert tanh.hidden_act == "gelu"  # the original TF1 tanh approximation
    for config in (helpers.tiny_config(), helpers.tiny_config(hidden_act="gelu_exact")):
        hf = checkpoints.bert_config_to_hf_config(config, heads=True)
        assert checkpoints.hf_config_to_bert_config(hf) == config
    # Another LayerNorm epsilon is read, not refused (RoBERTa's checkpoints use 1e-5), and
    # written back; ALBERT's and ELECTRA's configs have no such field and still refuse it.
    eps = checkpoints.hf_config_to_bert_config(dict(minilm, layer_norm_eps=1e-5))
    assert eps.layer_norm_eps == 1e-5 and eps.to_dict()["layer_norm_eps"] == 1e-5
    assert checkpoints.bert_config_to_hf_config(eps, heads=False)["layer_norm_eps"] == 1e-5
    assert "layer_norm_eps" not in config.to_dict()  # the default is not written
    # read_any_config tells the two apart: a Cloze config holding layer_norm_eps keeps Cloze's
    # names ("gelu" = tanh), a Hugging Face one without model_type has keys Cloze's lack.
    cloze_json = tmp_path / "bert_config.json"
    cloze_json.write_text(eps.replace(hidden_act="gelu").to_json_string())
    assert checkpoints.read_any_config(cloze_json) == eps.replace(hidden_act="gelu")
    hf_json = tmp_path / "config.json"
    hf_json.write_text(json.dumps({k: v for k, v in minilm.items() if k != "model_type"}))
    assert checkpoints.read_any_config(hf_json).hidden_act == "gelu_exact"
    for family in ("albert", "electra"):
        with pytest.raises(InputError, match=r"layer_norm_eps: expected 1e-12"):
            checkpoints.hf_config_to_config(
                dict(minilm, model_type=family, layer_norm_eps=1e-5, embedding_size=64)
            )
    bad = [
        ({"layer_norm_eps": 0.0}, r"layer_norm_eps 0.0 must be in \(0, 1\)"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"model_type": "roberta"}, "model_type"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"rotary_dim": 8}, r"unknown key\(s\) \['rotary_dim'\]"),
    ]
    for change, message in bad:
        with pytest.raises(InputError, match=message) as err:
            checkpoints.hf_config_to_bert_config(minilm | change, source="some/config.json")
        assert "some/config.json" in str(err.value)


def test_roberta_position_offset_is_written_as_hugging_face_roberta(tmp_path):
    """A BERT config with position_offset (RoBERTa) goes to Hugging Face as model_type roberta
    with pad_token_id = offset - 1 (its positions start at padding_idx + 1), not as a BERT that
    would number positions from 0: keras-hub's own RoBERTa converter reads the folder and
    computes what Cloze computes, and it reads back into the same config and encoder."""
    import keras_hub

    config = helpers.tiny_config(
        position_offset=2,
        type_vocab_size=1,
        max_position_embeddings=S + 2,
        hidden_act="gelu_exact",
        layer_norm_eps=1e-5,  # RoBERTa's, which keras-hub's RobertaBackbone computes
    )
    keras.utils.set_random_seed(11)  # the same weights whichever tests ran before in this process
    model = bert.BertPretrainer(config, "none")
    model.build()
    # keras-hub's RobertaBackbone has no token-type table; RoBERTa's single row is zeroed here so
    # both compute the same sum.
    table = model.encoder.embeddings.token_type_embeddings
    table.assign(np.zeros(table.shape, "float32"))
    _, notes = checkpoints.save_hf(model, tmp_path / "hf")
    assert notes == ["not written: the next-sentence head (RoBERTa has none)"]
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (hf["model_type"], hf["pad_token_id"]) == ("roberta", 1)
    assert hf["layer_norm_eps"] == 1e-5
    hub = keras_hub.models.RobertaBackbone.from_preset(str(tmp_path / "hf"))
    inputs = random_inputs(config, seed=4)
    inputs["segment_ids"] = np.zeros_like(inputs["segment_ids"])
    theirs = np.array(hub({"token_ids": inputs["input_ids"], "padding_mask": inputs["input_mask"]}))
    ours = np.array(model.encoder(inputs)["sequence_output"])
    real = inputs["input_mask"].astype(bool)
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-5)  # measured <= 2.4e-7
    shifted = bert.BertEncoder(config.replace(position_offset=0))
    shifted.build()
    shifted.set_weights(model.encoder.get_weights())
    assert np.abs(np.array(shifted(inputs)["sequence_output"])[real] - theirs[real]).max() > 1e-2
    # BERT's epsilon in the same weights moves the outputs past the tolerance above (measured
    # 3.4e-5: freshly initialised embeddings have variance ~1e-3), so the 1e-5 is really applied.
    bert_eps = bert.BertEncoder(config.replace(layer_norm_eps=1e-12))
    bert_eps.build()
    bert_eps.set_weights(model.encoder.get_weights())
    assert np.abs(np.array(bert_eps(inputs)["sequence_output"])[real] - theirs[real]).max() > 1e-5

    read = checkpoints.read_any_config(tmp_path / "hf" / "config.json")
    assert read == config
    encoder, report = checkpoints.load_hf(tmp_path / "hf", read)
    assert any("RoBERTa's MLM head" in why for why in report.ignored.values())
    np.testing.assert_array_equal(
        encoder(inputs)["sequence_output"], model.encoder(inputs)["sequence_output"]
    )
    assert not report.notes
    # The published RoBERTa weights hold no pooler: it keeps its initialisation, with a note.
    # Any other missing variable is still an error.
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for name, left_out in (("no_pooler", ".pooler."), ("no_norm", "layer.0.output.LayerNorm")):
        folder = tmp_path / name
        shutil.copytree(tmp_path / "hf", folder)
        kept = {k: v for k, v in arrays.items() if left_out not in k}
        assert len(kept) == len(arrays) - 2
        save_file(kept, str(folder / "model.safetensors"), metadata={"format": "pt"})
        if name == "no_pooler":
            encoder, report = checkpoints.load_hf(folder, read)
            assert len(report.notes) == 1 and "no pooler" in report.notes[0]
            np.testing.assert_array_equal(
                encoder(inputs)["sequence_output"], model.encoder(inputs)["sequence_output"]
            )
        else:
            with pytest.raises(InputError, match=r"LayerNorm.weight: missing"):
                checkpoints.load_hf(folder, read)


# ---------------------------------------------------------------------------------------------
# Cloze's own checkpoints
# ---------------------------------------------------------------------------------------------


def test_cloze_checkpoints_round_trip_and_feed_init_checkpoint(tmp_path):
    from training import optimization

    config = helpers.tiny_config(hidden_dropout_prob=0.1)  # dropout adds RNG state to skip
    model = random_pretrainer(config)
    # A checkpoint as training/trainer.py writes it: model, optimizer, step.
    opt = optimization.create_optimizer(1e-4, 10, 1)
    opt.build(model.trainable_variables)
    step = tf.Variable(7, dtype=tf.int64)
    tf.train.Checkpoint(model=model, optimizer=opt, global_step=step).save(
        str(tmp_path / "run/ckpt")
    )
    loaded, report = checkpoints.load_cloze(tmp_path / "run", config)
    assert isinstance(loaded, bert.BertPretrainer)
    assert len(report.entries) == len(model.trainable_variables)
    assert any("training-state" in n for n in report.notes)
    inputs = random_inputs(config)
    assert_same_outputs(outputs(model, inputs), outputs(loaded, inputs))

    # What run scripts do with --init_checkpoint: a converted pretrainer loads whole, and an
    # encoder alone is saved as `model.encoder`, the layout a task model's encoder loads from
    # (as training/trainer.init_from_checkpoint does).
    checkpoints.save_cloze(loaded, tmp_path / "pretrainer")
    fresh = checkpoints.build_model(config, heads=True)
    trainer.restore_model_weights(fresh, str(tmp_path / "pretrainer"))
    assert_same_outputs(outputs(loaded, inputs), outputs(fresh, inputs))
    checkpoints.save_cloze(loaded.encoder, tmp_path / "encoder")
    fresh = checkpoints.build_model(config, heads=True)
    holder = tf.train.Checkpoint(encoder=fresh.encoder)
    trainer.restore_model_weights(holder, str(tmp_path / "encoder"))
    assert_same_outputs(outputs(loaded.encoder, inputs), outputs(fresh.encoder, inputs))
    encoder, report = checkpoints.load_cloze(tmp_path / "encoder", config)
    assert isinstance(encoder, bert.BertEncoder) and not report.heads
    # A checkpoint whose `model` is a bare encoder loads too.
    tf.train.Checkpoint(model=loaded.encoder).save(str(tmp_path / "bare/ckpt"))
    bare, _ = checkpoints.load_cloze(tmp_path / "bare", config)
    assert_same_outputs(outputs(loaded.encoder, inputs), outputs(bare, inputs))

    # The same strictness as the foreign formats: one layer fewer in the config is an error.
    with pytest.raises(InputError, match=r"model/encoder/layer_1/attention/qkv/kernel.*unused"):
        checkpoints.load_cloze(tmp_path / "run", helpers.tiny_config(num_hidden_layers=1))


def test_a_spanbert_pretrainer_loads_without_its_span_boundary_head(tmp_path):
    """run_pretraining --span_boundary_objective's checkpoint: the encoder and BERT's heads load
    (and so convert to every BERT format); the span boundary head is listed as not converted."""
    config = helpers.tiny_config()
    model = bert.BertPretrainer(config, span_boundary=True)
    model.build()
    tf.train.Checkpoint(model=model).save(str(tmp_path / "spanbert/ckpt"))
    loaded, report = checkpoints.load_cloze(tmp_path / "spanbert", config)
    assert isinstance(loaded, bert.BertPretrainer) and not loaded.span_boundary
    assert "SpanBERT's span boundary head (the BERT formats have no place for it)" in (
        report.summary()
    )
    inputs = random_inputs(config)
    assert_same_outputs(outputs(model.encoder, inputs), outputs(loaded.encoder, inputs))


# ---------------------------------------------------------------------------------------------
# .keras file and the output folder
# ---------------------------------------------------------------------------------------------


def test_keras_file_round_trip(tmp_path):
    config = helpers.tiny_config()
    model = random_pretrainer(config)
    checkpoints.export_keras(model, tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    inputs = random_inputs(config)
    assert_same_outputs(outputs(model, inputs), outputs(loaded, inputs))


def test_atomic_output_dir_writes_all_or_nothing(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with checkpoints.AtomicOutputDir(dest) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("conversion failed half way")
    assert list(tmp_path.iterdir()) == []  # no destination, no temporary folder left
    with checkpoints.AtomicOutputDir(dest) as tmp:
        (tmp / "done.txt").write_text("ok")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (dest / "done.txt").read_text() == "ok"
    with pytest.raises(InputError, match="non-empty"):
        with checkpoints.AtomicOutputDir(dest):
            pass
    assert (dest / "done.txt").read_text() == "ok"  # untouched


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors naming the variable or file
# ---------------------------------------------------------------------------------------------


def test_checkpoint_of_another_architecture_names_the_variables(tf1_setup):
    folder, config, _, _ = tf1_setup
    deeper = config.replace(num_hidden_layers=3)
    with pytest.raises(InputError) as err:
        checkpoints.load_tf1_bert(folder, deeper, "bert_config.json")
    message = str(err.value)
    assert "bert/encoder/layer_2/attention/self/query/kernel: missing" in message
    assert "num_hidden_layers=3" in message and "bert_config.json" in message
    with pytest.raises(InputError, match=r"bert/encoder/layer_1/output/dense/kernel.*unused"):
        checkpoints.load_tf1_bert(folder, config.replace(num_hidden_layers=1))
    wider = config.replace(intermediate_size=20)
    with pytest.raises(
        InputError,
        match=r"bert/encoder/layer_0/intermediate/dense/kernel: expected shape \(12, 20\), "
        r"found \(12, 17\)",
    ):
        checkpoints.load_tf1_bert(folder, wider)
    # --skip_variables lets a user drop what they mean to drop, and only that.
    _, report = checkpoints.load_tf1_bert(
        folder, config.replace(num_hidden_layers=1), skip=r"^bert/encoder/layer_1/"
    )
    assert sum("skip" in why for why in report.ignored.values()) == 16


def test_vocab_size_disagreeing_with_embeddings(tf1_setup, tmp_path):
    folder, config, _, _ = tf1_setup
    vocab = tmp_path / "vocab.txt"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(50)]
    vocab.write_text("\n".join(tokens) + "\n")
    with pytest.raises(InputError, match=r"vocab.txt: expected 53 tokens .* found 55 tokens"):
        checkpoints.check_vocab_size(vocab, config, "bert_config.json")
    with pytest.raises(
        InputError,
        match=r"bert/embeddings/word_embeddings: expected shape \(55, 12\), found \(53, 12\)",
    ):
        checkpoints.load_tf1_bert(folder, config.replace(vocab_size=55))


def test_missing_truncated_and_pickled_files(tmp_path, tf1_setup):
    config = helpers.tiny_config()
    with pytest.raises(InputError, match=r"empty.*bert_model.ckpt.index"):
        (tmp_path / "empty").mkdir()
        checkpoints.load_tf1_bert(tmp_path / "empty", config)
    with pytest.raises(InputError, match=r"nowhere.*no such"):
        checkpoints.load_hf_bert(tmp_path / "nowhere", config)
    with pytest.raises(InputError, match=r"empty: expected model.safetensors"):
        checkpoints.load_hf_bert(tmp_path / "empty", config)

    # A safetensors file cut short (an interrupted download) names the file.
    model = random_pretrainer(config)
    (tmp_path / "hf").mkdir()
    checkpoints.save_hf_bert(model, tmp_path / "hf")
    data = (tmp_path / "hf" / "model.safetensors").read_bytes()
    (tmp_path / "hf" / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(InputError, match=r"hf/model.safetensors: expected a complete safetensors"):
        checkpoints.load_hf_bert(tmp_path / "hf", config)

    # A TF1 checkpoint whose data file is cut short names the data file and the variable.
    folder = tmp_path / "tf1"
    folder.mkdir()
    weights = random_arrays(original_tf1_shapes(config, heads=False))
    write_tf1_checkpoint(folder / "bert_model.ckpt", weights)
    data_file = next(folder.glob("bert_model.ckpt.data-*"))
    data_file.write_bytes(data_file.read_bytes()[:200])
    with pytest.raises(InputError, match=r"bert_model.ckpt.data-\*: expected the value of bert/"):
        checkpoints.load_tf1_bert(folder, config)

    # Pickles are refused unless trusted.
    (tmp_path / "pt").mkdir()
    (tmp_path / "pt" / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(InputError, match=r"pytorch_model.bin: .*pickle.*--trust_pickle"):
        checkpoints.load_hf_bert(tmp_path / "pt", config)


def test_hf_export_loads_in_transformers(tmp_path):
    """Where PyTorch and transformers are installed (not in CI, see tests/requirements.txt): the
    exported folder loads in transformers.BertForPreTraining with no missing or unexpected weight
    and computes Cloze's numbers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = helpers.tiny_config(hidden_act="gelu_exact")
    model = random_pretrainer(config, seed=11)
    checkpoints.save_hf_bert(model, tmp_path)
    theirs, info = transformers.BertForPreTraining.from_pretrained(
        str(tmp_path), output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    inputs = random_inputs(config)
    with torch.no_grad():
        out = theirs.eval()(
            input_ids=torch.tensor(inputs["input_ids"], dtype=torch.long),
            token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["input_mask"], dtype=torch.long),
            output_hidden_states=True,
        )
    ours = outputs(model, inputs)
    real = inputs["input_mask"].astype(bool)
    for i, hidden in enumerate(out.hidden_states):
        np.testing.assert_allclose(ours[f"hidden_{i}"][real], hidden.numpy()[real], atol=2e-5)
    picked = np.take_along_axis(
        out.prediction_logits.numpy(), inputs["masked_lm_positions"][..., None], axis=1
    )
    np.testing.assert_allclose(ours["mlm_logits"], picked, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(ours["nsp_logits"], out.seq_relationship_logits.numpy(), atol=2e-5)


# ---------------------------------------------------------------------------------------------
# keras-hub presets
# ---------------------------------------------------------------------------------------------

KERAS_HUB_TOLERANCE = 1e-5  # max absolute difference between Cloze and keras-hub's backbone


def keras_hub_outputs(backbone, inputs) -> dict:
    out = backbone(
        {
            "token_ids": inputs["input_ids"],
            "segment_ids": inputs["segment_ids"],
            "padding_mask": inputs["input_mask"],
        }
    )
    return {k: np.array(v) for k, v in out.items()}


def test_keras_hub_preset_computes_clozes_outputs_and_loads_back(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    config = helpers.tiny_config(
        type_vocab_size=3, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1
    )
    model = random_pretrainer(config, seed=5)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "##s", "zurich", ","]
    vocab += [f"w{i}" for i in range(config.vocab_size - len(vocab))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    preset = tmp_path / "preset"
    preset.mkdir()
    notes = checkpoints.export_keras_hub(model, preset, tmp_path / "vocab.txt")
    assert notes == ["not exported: the MLM and NSP heads (a keras-hub BertBackbone has none)"]

    backbone = keras_hub.models.BertBackbone.from_preset(str(preset))
    inputs = random_inputs(config, seed=2)
    inputs["segment_ids"][0, 2:4] = 2  # the third segment row is mapped too
    theirs = keras_hub_outputs(backbone, inputs)
    ours = model.encoder({k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")})
    for key in ("sequence_output", "pooled_output"):  # every position, padding included
        diff = np.abs(theirs[key] - np.array(ours[key])).max()
        assert diff < KERAS_HUB_TOLERANCE, (key, diff)
    assert np.abs(theirs["sequence_output"]).max() > 0.5  # not a trivially small output

    # The tokenizer saved beside it is the original uncased WordPiece (lower case, no accents).
    tokenizer = keras_hub.models.BertTokenizer.from_preset(str(preset))
    text = "Cafés ZÜRICH, w3 w12"
    ours_ids = tokenization.FullTokenizer(tmp_path / "vocab.txt").tokenize(text)
    assert np.array(tokenizer(text)).tolist() == [vocab.index(t) for t in ours_ids]

    # And back: the preset's config is the model's, its weights bit for bit.
    back_config = checkpoints.read_keras_hub_config(preset / "config.json")
    assert back_config == config
    back, report = checkpoints.load_keras_hub(preset, back_config)
    assert isinstance(back, bert.BertEncoder) and not report.heads
    want = checkpoints.cloze_variables(model.encoder)
    for name, variable in checkpoints.cloze_variables(back).items():
        np.testing.assert_array_equal(variable.numpy(), want[name].numpy(), err_msg=name)


def test_keras_hub_refuses_what_its_backbone_cannot_compute(tmp_path):
    config = helpers.tiny_config(hidden_act="gelu_exact")
    with pytest.raises(InputError) as error:
        checkpoints.check_keras_hub_config(config, "cfg.json")
    assert str(error.value) == (
        "cfg.json: hidden_act: expected one of ['gelu', 'gelu_new'] (the tanh GELU, the only "
        "activation keras-hub's BertBackbone computes), found 'gelu_exact'; pass "
        "--allow_gelu_approximation to accept the tanh approximation"
    )
    (note,) = checkpoints.check_keras_hub_config(config, "cfg.json", True)
    assert note.startswith("WARNING: hidden_act=gelu_exact") and "approximation" in note
    for act in ("relu", "tanh", "linear"):  # no flag makes these computable
        with pytest.raises(InputError, match=f"found '{act}'$"):
            checkpoints.check_keras_hub_config(config.replace(hidden_act=act), "c", True)
    assert checkpoints.check_keras_hub_config(helpers.tiny_config(), "c") == []
    notes = checkpoints.check_keras_hub_config(
        helpers.tiny_config(attention_probs_dropout_prob=0.2), "c"
    )
    assert "attention_probs_dropout_prob=0.2 is not kept" in notes[0]
    # A preset of another architecture is named as such.
    other = tmp_path / "config.json"
    other.write_text(json.dumps({"registered_name": "keras_hub>RobertaBackbone", "config": {}}))
    with pytest.raises(InputError, match=r"config.json: registered_name: expected 'keras_hub>Bert"):
        checkpoints.read_keras_hub_config(other)
    with pytest.raises(InputError, match=r"nowhere: expected a keras-hub preset folder"):
        checkpoints.load_keras_hub(tmp_path / "nowhere", helpers.tiny_config())
    (tmp_path / "tokenizer.json").write_text(json.dumps({"config": {"lowercase": "yes"}}))
    with pytest.raises(InputError, match=r"config.lowercase: expected true or false, found 'yes'"):
        checkpoints.keras_hub_lowercase(tmp_path)
    assert checkpoints.keras_hub_lowercase(tmp_path / "nowhere") is None


# ---------------------------------------------------------------------------------------------
# PyTorch pickles: read only with --trust_pickle, and then only tensors
# ---------------------------------------------------------------------------------------------


def test_trusted_pickle_without_torch_says_so(tmp_path, monkeypatch):
    """The gate in both directions, with or without PyTorch installed: refused untrusted before
    torch is looked for; trusted, it gets as far as needing torch (simulated absent here)."""
    config = helpers.tiny_config()
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    refusal = r"pytorch_model.bin: expected a safetensors file, .*pickle.*pass --trust_pickle"
    with pytest.raises(InputError, match=refusal):
        checkpoints.load_hf_bert(tmp_path, config)
    with pytest.raises(InputError) as error:
        checkpoints.load_hf_bert(tmp_path, config, trust_pickle=True)
    assert str(error.value) == (
        f"{tmp_path / 'pytorch_model.bin'}: expected PyTorch installed to read this pickle "
        "(--trust_pickle), found no torch"
    )


class _RunsCode:
    """Unpickling this runs `touch`: what a malicious pickle does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_trusted_pickle_loads_tensors_only(tmp_path):
    """Where PyTorch is installed (not in CI): a trusted pytorch_model.bin loads the same model
    as its safetensors twin; a pickle that would run code, or holds more than tensors, is still
    refused with the file named."""
    import pickle

    torch = pytest.importorskip("torch")
    config = helpers.tiny_config(hidden_act="gelu_exact")
    model = random_pretrainer(config, seed=8)
    (tmp_path / "st").mkdir()
    checkpoints.save_hf_bert(model, tmp_path / "st")
    from safetensors.numpy import load_file

    state = {
        k: torch.from_numpy(v) for k, v in load_file(tmp_path / "st/model.safetensors").items()
    }
    (tmp_path / "pt").mkdir()
    torch.save(state, tmp_path / "pt" / "pytorch_model.bin")
    loaded, report = checkpoints.load_hf_bert(tmp_path / "pt", config, trust_pickle=True)
    assert_same_outputs(
        outputs(loaded, random_inputs(config)), outputs(model, random_inputs(config))
    )
    assert any("--trust_pickle" in note for note in report.notes)

    marker = tmp_path / "code-ran"
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsCode(marker)))
    refusal = r"evil/pytorch_model.bin: expected a PyTorch state dict that loads with weights_only"
    with pytest.raises(InputError, match=refusal):
        checkpoints.load_hf_bert(tmp_path / "evil", config, trust_pickle=True)
    assert not marker.exists()
    (tmp_path / "nested").mkdir()
    torch.save({"state_dict": state}, tmp_path / "nested" / "pytorch_model.bin")
    with pytest.raises(InputError, match=r"pytorch_model.bin: state_dict: expected a tensor"):
        checkpoints.load_hf_bert(tmp_path / "nested", config, trust_pickle=True)
