"""BART: keras-hub's BartBackbone as an independent implementation (weights copied by the
converter), the decoder's causality, the encoder's padding mask, config and Keras round trips,
decoding, and BART through run_pretraining and run_text2text."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep.errors import InputError
from modeling import bart, t5

TINY = dict(
    vocab_size=23,
    d_model=12,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=3,
    decoder_attention_heads=3,
    encoder_ffn_dim=17,
    decoder_ffn_dim=17,
    max_position_embeddings=11,
    dropout=0.0,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=1,
    decoder_start_token_id=1,
)


def tiny(**changes):
    keras.utils.set_random_seed(5)
    model = bart.BartModel(bart.BartConfig(**{**TINY, **changes}))
    model.build()
    return model


def batch(b=3, s=7, t=5, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, 23, (b, s)).astype("int32")
    mask = np.ones_like(ids)
    mask[0, 5:] = 0
    mask[2, 6:] = 0
    return {
        "input_ids": ids,
        "input_mask": mask,
        "decoder_input_ids": rng.integers(2, 23, (b, t)).astype("int32"),
    }


def keras_hub_backbone():
    import keras_hub

    keras.utils.set_random_seed(11)
    ref = keras_hub.models.BartBackbone(
        vocabulary_size=23,
        num_layers=2,
        num_heads=3,
        hidden_dim=12,
        intermediate_dim=17,
        dropout=0.0,
        max_sequence_length=11,
    )
    # Random layer-norm and bias values, so that a weight copied to the wrong place shows.
    rng = np.random.default_rng(3)
    for w in ref.weights:
        if "gamma" in w.path or "beta" in w.path or "bias" in w.path:
            w.assign(rng.normal(0.0, 0.3, w.shape).astype("float32") + ("gamma" in w.path))
    return ref


def test_equals_keras_hub_bart_backbone_after_conversion():
    ref = keras_hub_backbone()
    model = bart.from_keras_hub(ref, pad_token_id=0, bos_token_id=None, eos_token_id=1,
                                decoder_start_token_id=1)  # fmt: skip
    assert model.config.encoder_layers == 2 and model.config.max_position_embeddings == 11
    x = batch(s=11, t=9)  # the whole position table
    ours = model(x)
    theirs = ref(
        {
            "encoder_token_ids": x["input_ids"],
            "encoder_padding_mask": x["input_mask"],
            "decoder_token_ids": x["decoder_input_ids"],
            "decoder_padding_mask": np.ones_like(x["decoder_input_ids"]),
        }
    )
    real = x["input_mask"].astype(bool)
    enc, ref_enc = np.asarray(ours["encoder_output"]), np.asarray(theirs["encoder_sequence_output"])
    np.testing.assert_allclose(enc[real], ref_enc[real], atol=2e-5)
    dec = np.asarray(ours["decoder_output"])
    np.testing.assert_allclose(dec, np.asarray(theirs["decoder_sequence_output"]), atol=2e-5)
    assert np.abs(dec).max() > 0.1  # not a trivially equal pair of zeros
    # The tied output layer: logits are decoder states times the token embedding (plus a zero
    # final_logits_bias), as keras-hub's BartSeq2SeqLM reverses its token embedding.
    want = np.asarray(ref.token_embedding(theirs["decoder_sequence_output"], reverse=True))
    np.testing.assert_allclose(np.asarray(ours["lm_logits"]), want, atol=5e-5)
    # A wrong size is refused with the weight's name.
    other = bart.BartModel(bart.BartConfig(**{**TINY, "decoder_ffn_dim": 19}))
    other.build()
    with pytest.raises(ValueError, match="expected shape"):
        bart.copy_from_keras_hub(ref, other)


def test_positions_start_at_row_two_and_embedding_is_scaled_by_config():
    model = tiny()
    x = batch()
    base = np.asarray(model(x)["lm_logits"])
    # Rows 0 and 1 of each table are never read (fairseq's offset); row 2 is position 0.
    for table in (model.encoder_embed_positions, model.decoder_embed_positions):
        table.assign(np.concatenate([np.full((2, 12), 9.0, "float32"), table.numpy()[2:]]))
    np.testing.assert_allclose(np.asarray(model(x)["lm_logits"]), base, atol=1e-5)
    rows = model.decoder_embed_positions.numpy()
    rows[2] += np.linspace(-1.0, 1.0, 12)  # not a constant: layernorm_embedding removes those
    model.decoder_embed_positions.assign(rows)
    assert np.abs(np.asarray(model(x)["lm_logits"]) - base).max() > 1e-3
    scaled = tiny(scale_embedding=True)
    assert scaled.embed_scale == pytest.approx(math.sqrt(12)) and tiny().embed_scale == 1.0
    with pytest.raises(ValueError, match="at most max_position_embeddings=11"):
        model.encode(np.ones((1, 12), "int32"), np.ones((1, 12), "int32"))


def test_decoder_never_sees_later_targets_and_encoder_ignores_padding():
    model = tiny()
    x = batch()
    base = np.asarray(model(x)["lm_logits"])
    for t in range(1, 5):
        changed = dict(x, decoder_input_ids=x["decoder_input_ids"].copy())
        changed["decoder_input_ids"][:, t] = (changed["decoder_input_ids"][:, t] + 1) % 23
        out = np.asarray(model(changed)["lm_logits"])
        np.testing.assert_allclose(out[:, :t], base[:, :t], atol=1e-5)
        assert np.abs(out[:, t:] - base[:, t:]).max() > 1e-5
    padded = dict(x, input_ids=x["input_ids"].copy())
    padded["input_ids"][0, 5:] = 3  # behind the mask of row 0
    out = model(padded)
    np.testing.assert_allclose(np.asarray(out["lm_logits"]), base, atol=1e-5)
    enc = np.asarray(model(x)["encoder_output"])
    np.testing.assert_allclose(np.asarray(out["encoder_output"])[0, :5], enc[0, :5], atol=1e-5)
    # A real source token does change the output.
    real = dict(x, input_ids=x["input_ids"].copy())
    real["input_ids"][0, 4] = (real["input_ids"][0, 4] + 1) % 23
    assert np.abs(np.asarray(model(real)["lm_logits"])[0] - base[0]).max() > 1e-5


def test_config_json_round_trip_unknown_keys_and_keras_config(tmp_path):
    config = bart.BartConfig(**TINY)
    path = tmp_path / "bart.json"
    path.write_text(config.to_json_string())
    assert bart.BartConfig.from_json_file(path) == config
    assert bart.BartConfig.from_dict({"vocab_size": 50265}).decoder_start_token_id == 2
    with pytest.raises(InputError, match=r"bart.json: unknown key\(s\) \['num_layers'\]"):
        path.write_text(json.dumps({**TINY, "num_layers": 2}))
        bart.BartConfig.from_json_file(path)
    for bad, match in (
        ({"activation_function": "swish"}, "activation_function"),
        ({"encoder_attention_heads": 5}, "divisor of d_model"),
        ({"encoder_layerdrop": 0.1}, "LayerDrop"),
        ({"eos_token_id": 23}, "below vocab_size"),
    ):
        with pytest.raises(InputError, match=match):
            bart.BartConfig.from_dict({**TINY, **bad}, "c.json")
    repo_config = json.loads((t5_root() / "configs" / "bart_tiny.json").read_text())
    assert bart.is_bart_config(repo_config) and not t5.is_t5_config(repo_config)
    assert bart.BartConfig.from_dict(repo_config).vocab_size == repo_config["vocab_size"]
    for name in ("t5_tiny", "xlnet_tiny", "gpt_tiny", "bert_tiny", "elmo_tiny"):
        assert not bart.is_bart_config(
            json.loads((t5_root() / "configs" / f"{name}.json").read_text())
        )
    model = tiny()
    clone = bart.BartModel.from_config(model.get_config())
    clone.build()
    assert clone.config == model.config
    assert [w.shape for w in clone.weights] == [w.shape for w in model.weights]
    clone.set_weights(model.get_weights())
    x = batch()
    np.testing.assert_allclose(
        np.asarray(clone(x)["lm_logits"]), np.asarray(model(x)["lm_logits"]), atol=1e-6
    )


def t5_root():
    from tests.conftest import ROOT

    return ROOT


def test_learns_to_copy_then_greedy_and_beam_decoding_agree_and_repeat():
    """Teacher-forced training on copying 32 sequences; both decoders (t5's, shared) then
    reproduce them, starting from BART's decoder start (</s>), and give the same ids twice."""
    from training import optimization

    model = tiny(d_model=24, encoder_ffn_dim=48, decoder_ffn_dim=48)
    rng = np.random.default_rng(0)
    src = rng.integers(3, 23, (32, 4)).astype("int32")
    targets = np.concatenate([src, np.ones((32, 1), np.int32)], axis=1)  # then eos (id 1)
    opt = optimization.create_optimizer(5e-3, 300, 20)

    @tf.function
    def step(ids, tgt):
        with tf.GradientTape() as tape:
            out = model(
                {
                    "input_ids": ids,
                    "input_mask": tf.ones_like(ids),
                    "decoder_input_ids": tf.concat([tf.ones_like(tgt[:, :1]), tgt[:, :-1]], 1),
                },
                training=True,
            )
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(
                    tgt, out["lm_logits"], from_logits=True
                )
            )
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    for i in range(300):
        j = (i * 16) % 32
        loss = float(step(src[j : j + 16], targets[j : j + 16]))
    assert loss < 0.05, loss
    test, mask = src[:3], np.ones((3, 4), "int32")
    expected = np.concatenate([test, np.ones((3, 1), np.int32)], axis=1)
    greedy = t5.greedy_decode(model, test, mask, 8)
    np.testing.assert_array_equal(greedy, expected)
    np.testing.assert_array_equal(t5.greedy_decode(model, test, mask, 8), greedy)
    beams = t5.beam_search(model, test, mask, 8, num_beams=3)
    np.testing.assert_array_equal(beams, expected)
    np.testing.assert_array_equal(t5.beam_search(model, test, mask, 8, num_beams=3), beams)
