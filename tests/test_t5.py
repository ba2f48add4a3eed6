"""T5: relative buckets by hand, keras-hub's T5Backbone as an independent implementation, the
decoder's causality, teacher forcing, and greedy / beam decoding on a model taught to copy."""

import numpy as np
import pytest
from keras import ops

from data_prep.errors import InputError
from modeling import t5
from tests import helpers

TINY = dict(vocab_size=23, d_model=12, d_kv=4, d_ff=17, num_layers=2, num_heads=3, dropout_rate=0.0)


def tiny(**changes):
    return helpers.tiny_encoder_decoder(t5.T5Model, t5.T5Config, {**TINY, **changes})


def batch(b=3, s=7, t=5, seed=0):
    return helpers.encoder_decoder_batch(b, s, t, seed, padded=((0, 5),))


def test_relative_buckets_match_hand_computed_values():
    rel = ops.convert_to_tensor(
        np.array([-200, -20, -9, -8, -7, -1, 0, 1, 7, 8, 20, 200], np.int32)
    )
    bi = np.asarray(t5.relative_bucket(rel, True, 32, 128)).tolist()
    # 16 buckets a side: 0..7 exact, then log-spaced up to distance 128 (bucket 15);
    # keys after the query use buckets 16..31.
    assert bi == [15, 10, 8, 8, 7, 1, 0, 17, 23, 24, 26, 31]
    uni = np.asarray(t5.relative_bucket(rel, False, 32, 128)).tolist()
    # Decoder: only the past; 0..15 exact, log-spaced up to 128 (bucket 31), future -> 0.
    assert uni == [31, 17, 9, 8, 7, 1, 0, 0, 0, 0, 0, 0]  # 20: 16 + int(ln(20/16) / ln 8 * 16)


def test_config_names_and_errors():
    c = t5.T5Config.from_dict({"vocab_size": 32128, "d_model": 512, "feed_forward_proj": "relu"})
    assert c.decoder_layers == 6 and c.tie_word_embeddings
    with pytest.raises(InputError, match="unknown key"):
        t5.T5Config.from_dict({"vocab_size": 5, "hidden_size": 4})
    with pytest.raises(InputError, match="feed_forward_proj"):
        t5.T5Config.from_dict({"vocab_size": 5, "feed_forward_proj": "swish"})


@pytest.mark.parametrize("gated", [False, True])
def test_equals_keras_hub_t5_backbone(gated):
    import keras_hub

    model = tiny(feed_forward_proj="gated-relu" if gated else "relu")
    ref = keras_hub.models.T5Backbone(
        vocabulary_size=23,
        num_layers=2,
        num_heads=3,
        hidden_dim=12,
        intermediate_dim=17,
        key_value_dim=4,
        dropout=0.0,
        activation="relu",
        use_gated_activation=gated,
    )
    ref.get_layer("token_embedding").embeddings.assign(model.shared)
    for side in ("encoder", "decoder"):
        for i, block in enumerate(model.blocks(side == "decoder")):
            layer = ref.get_layer(f"transformer_{side}_layer_{i}")
            pairs = [(block.self_attention, layer.self_attention)]
            if side == "decoder":
                pairs.append((block.cross_attention, layer.cross_attention))
            for ours, theirs in pairs:
                for name in ("query", "key", "value", "output"):
                    getattr(theirs, f"{name}_projector").kernel.assign(
                        getattr(ours, name[0]).kernel
                    )
                if ours.has_bias:
                    theirs.relative_attention_bias.assign(ours.relative_attention_bias)
            layer.self_attention_layer_norm.weight.assign(block.self_norm.weight)
            if side == "decoder":
                layer.cross_attention_layer_norm.weight.assign(block.cross_norm.weight)
            layer.layer_norm.weight.assign(block.ff_norm.weight)
            layer.input_projector.kernel.assign(block.wi.kernel)
            if gated:
                layer.gate_projector.kernel.assign(block.wi_1.kernel)
            layer.output_projector.kernel.assign(block.wo.kernel)
    ref.get_layer("encoder_output_layer_norm").weight.assign(model.encoder_norm.weight)
    ref.get_layer("decoder_output_layer_norm").weight.assign(model.decoder_norm.weight)
    x = batch()
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
    np.testing.assert_allclose(
        np.asarray(ours["encoder_output"])[real],
        np.asarray(theirs["encoder_sequence_output"])[real],
        atol=2e-5,
    )
    np.testing.assert_allclose(
        np.asarray(ours["decoder_output"]),
        np.asarray(theirs["decoder_sequence_output"]),
        atol=2e-5,
    )


def test_decoder_never_sees_later_targets_and_ignores_padded_sources():
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
    np.testing.assert_allclose(np.asarray(model(padded)["lm_logits"])[0], base[0], atol=1e-5)


def test_learns_to_copy_and_greedy_and_beam_decoding_agree():
    """Teacher-forced training on copying 32 sequences; both decoders then reproduce them."""
    model = tiny(d_model=24, d_kv=8, d_ff=48, num_heads=3)
    src, loss = helpers.train_to_copy(model, decoder_start_id=0, steps=500, warmup=20)
    assert loss < 0.05, loss
    test = src[:3]  # sequences it was taught: the decoders must give what teacher forcing learned
    mask = np.ones_like(test)
    expected = np.concatenate([test, np.ones((3, 1), np.int32)], axis=1)
    np.testing.assert_array_equal(t5.greedy_decode(model, test, mask, 8), expected)
    np.testing.assert_array_equal(t5.beam_search(model, test, mask, 8, num_beams=3), expected)
    np.testing.assert_array_equal(t5.shift_right(expected, 0)[:, 1:], expected[:, :-1])
