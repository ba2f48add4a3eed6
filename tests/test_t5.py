"""T5: relative buckets by hand, keras-hub's T5Backbone as an independent implementation, the
decoder's causality, teacher forcing, and greedy / beam decoding on a model taught to copy."""

import numpy as np
import pytest
from keras import ops

from bench import generation
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
    model = tiny(feed_forward_proj="gated-relu" if gated else "relu")
    ref = t5.to_keras_hub(model)
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
    # The same without the key / value cache (each step runs the whole prefix).
    np.testing.assert_array_equal(t5.greedy_decode(model, test, mask, 8, use_cache=False), expected)
    beams = t5.beam_search(model, test, mask, 8, num_beams=3, use_cache=False)
    np.testing.assert_array_equal(beams, expected)
    np.testing.assert_array_equal(t5.shift_right(expected, 0)[:, 1:], expected[:, :-1])
    # The float32 weights run at run_text2text's --precision=bf16 / fp16: the same ids.
    for precision in ("bf16", "fp16"):
        mixed = helpers.at_precision(lambda: tiny(d_model=24, d_kv=8, d_ff=48), model, precision)
        np.testing.assert_array_equal(t5.greedy_decode(mixed, test, mask, 8), expected)
        np.testing.assert_array_equal(t5.beam_search(mixed, test, mask, 8, 3), expected)


def _family(name, factor):
    """A tiny T5 (plain or gated) or BART with scrambled weights."""
    if name == "bart":
        from tests import test_bart

        model = test_bart.tiny(max_position_embeddings=12)
    else:
        model = tiny(feed_forward_proj="gated-gelu" if name == "t5_gated" else "relu")
    helpers.scramble_weights(model, factor)
    return model


@pytest.mark.parametrize("family", ["t5", "t5_untied", "bart"])
def test_lm_terms_equal_the_logits_path_in_loss_and_every_gradient(family):
    # lm_terms (output_xent_and_hits: heads.tied_xent_and_hits, vocabulary-major, without the
    # (B, T, V) logits; BART's bias inside) against masked_lm_sums of lm_logits, the path they
    # replace in seq2seq training: the same sums and gradients to every weight, with padded
    # targets (weight 0) and padded sources.
    from modeling import losses

    if family == "t5_untied":
        model = tiny(tie_word_embeddings=False)
        helpers.scramble_weights(model, 1.0)
    else:
        model = _family(family, 1.0)
    x = batch()
    targets = np.roll(x["decoder_input_ids"], -1, axis=1)
    target_mask = np.ones_like(targets)
    target_mask[2, 3:] = 0
    inputs = x | {"target_ids": targets}

    def fast():
        out = model(inputs, lm_terms=True)
        assert "lm_logits" not in out and out["lm_xent"].shape == (3, 5)
        sums = losses.masked_lm_sums_of(out["lm_xent"], out["lm_hits"], target_mask)
        return sums, sums["loss_sum"]

    def plain():
        sums = losses.masked_lm_sums(model(x)["lm_logits"], targets, target_mask)
        assert float(sums["weight"]) == 13
        return sums, sums["loss_sum"]

    helpers.check_loss_paths_agree(model, fast, plain)


@pytest.mark.parametrize("family", ["t5", "t5_gated", "bart"])
def test_cached_decoding_equals_running_the_whole_prefix(family):
    """The key / value cache: two positions, then one or three at a time, give the logits of
    the whole prefix at once (within 1e-5; relative positions, learned positions and the causal
    mask all depend on the cache index), and greedy and beam search with and without it agree.
    The logits are compared at the initial weight scale: at 4x, where decoding is checked, the
    float32 round-off of two summation orders grows to 2e-4 through the sharper softmaxes.
    (Decoded sequences that vary are checked on models taught to copy, and against keras-hub.)"""
    model = _family(family, 1.0)
    x = batch(t=10)
    enc = model.encode(x["input_ids"], x["input_mask"])
    _, full = model.decode(x["decoder_input_ids"], enc, x["input_mask"])
    cache = model.decoder_cache(enc, 10)
    # [keys, values] per layer, heads before positions: (B, N, K, D).
    assert [np.asarray(t).shape for t in cache["self"][0]] == [(3, 3, 10, 4)] * 2
    parts, index = [], 0
    for width in (2, 1, 1, 3, 1, 1, 1):
        ids = x["decoder_input_ids"][:, index : index + width]
        _, logits, cache = model.decode(ids, None, x["input_mask"], cache=cache, cache_index=index)
        parts.append(np.asarray(logits))
        index += width
    assert index == 10
    np.testing.assert_allclose(np.concatenate(parts, axis=1), np.asarray(full), atol=1e-5)
    model = _family(family, 4.0)
    src, mask = x["input_ids"], x["input_mask"]
    greedy = t5.greedy_decode(model, src, mask, 10)
    np.testing.assert_array_equal(greedy, t5.greedy_decode(model, src, mask, 10, use_cache=False))
    beams = t5.beam_search(model, src, mask, 10, num_beams=3)
    np.testing.assert_array_equal(
        beams, t5.beam_search(model, src, mask, 10, num_beams=3, use_cache=False)
    )


@pytest.mark.parametrize("family", ["t5", "bart"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_logits_stay_float32_near_it_and_the_cache_agrees(family, precision):
    """Under a mixed policy (run_text2text's and run_pretraining's --precision) the float32
    weights give float32 logits near float32's (bfloat16 keeps 8 bits of mantissa, float16 11:
    within 3% and 0.5% of the largest logit) but not equal to them, and the cached steps give
    the mixed whole-prefix pass's logits within the dtype's rounding. A source with no real
    token (an empty example padding a batch) stays finite: T5's mask of -1e9 became -inf in
    float16, and its rows NaN, until it moved to the float32 scores. (BART's whole-prefix pass
    outside a Keras call failed too: its float32 final_logits_bias added to bfloat16 logits.)"""
    reference = _family(family, 1.0)
    model = helpers.at_precision(lambda: _family(family, 1.0), reference, precision)
    assert model.compute_dtype == {"bf16": "bfloat16", "fp16": "float16"}[precision]
    x = batch(t=10)
    x["input_mask"][2] = 0

    def logits(m):
        enc = m.encode(x["input_ids"], x["input_mask"])
        _, full = m.decode(x["decoder_input_ids"], enc, x["input_mask"])
        cache, parts = m.decoder_cache(enc, 10), []
        for index, width in ((0, 4), (4, 1), (5, 3), (8, 2)):
            ids = x["decoder_input_ids"][:, index : index + width]
            _, part, cache = m.decode(ids, None, x["input_mask"], cache=cache, cache_index=index)
            parts.append(np.asarray(part))
        return np.asarray(full), np.concatenate(parts, axis=1), full.dtype

    want, _, _ = logits(reference)
    full, cached, dtype = logits(model)
    assert dtype == "float32" and np.isfinite(full).all()
    scale = np.abs(want).max()
    difference = np.abs(full - want).max() / scale
    assert 0 < difference < helpers.MIXED_LOGITS_TOLERANCE[precision], difference
    rounding = {"bf16": 2.0**-8, "fp16": 2.0**-11}[precision]
    np.testing.assert_allclose(cached, full, atol=4 * rounding * scale)


def test_beam_search_goes_on_while_a_live_hypothesis_can_still_win():
    """At step 2 two hypotheses end (the weak branch's first choice, the strong branch's second)
    and fill num_beams=2 finished while the strongest is live. The search goes on, since that
    one's score over the largest length penalty could still beat them, and returns it with its
    end token. Stopping at num_beams finished returned [2, 2]: live, without the end token,
    ranked as if it had ended."""
    eos, alpha, max_length = 1, 0.6, 5

    def logp(*rows):  # next-token probabilities over a vocabulary of 4, one row per live one
        return np.log(np.array(rows, np.float64))

    search = t5._Beams(0, 2, eos, alpha, max_length)
    search.advance(logp([0.0001, 0.1, 0.5999, 0.3]))  # [2] and [3] live
    assert [p for p, _ in search.live] == [[0, 2], [0, 3]] and not search.finished
    search.advance(logp([0.04, 0.05, 0.9, 0.01], [0.05, 0.9, 0.03, 0.02]))
    assert sorted(p for p, _ in search.finished) == [[0, 2, 1], [0, 3, 1]]  # two finished ...
    assert [p for p, _ in search.live][0] == [0, 2, 2] and not search.done  # ... it could win
    search.advance(logp([0.02, 0.95, 0.02, 0.01], [0.02, 0.95, 0.02, 0.01]))
    assert search.best() == [2, 2, eos]
    # What is live now ([2, 2, 0] and the like) can reach at most its score over the penalty at
    # max_length, below the second-best finished ([3, 1]): done.
    assert search.done
    # Out of steps, the live hypotheses count too (cut at max_length): the best one wins.
    short = t5._Beams(0, 2, eos, alpha, 1)
    short.advance(logp([0.0001, 0.1, 0.5999, 0.3]))
    assert not short.done and short.best() == [2]


def test_batched_beam_search_equals_one_source_at_a_time_when_sources_finish_apart():
    """The cached beam search decodes the batch together (num_beams rows per source): with an
    end token the scrambled model produces at different steps, sources finish apart, some
    idle while others go on, and every source's result is what the search over it alone gives
    (without the cache, and with it one source at a time)."""
    model = tiny(eos_token_id=4)
    helpers.scramble_weights(model, 4.0)
    x = helpers.encoder_decoder_batch(5, 7, 5, 2, padded=((0, 5), (3, 2)))
    src, mask = x["input_ids"], x["input_mask"]
    together = t5.beam_search(model, src, mask, 10, num_beams=3)
    alone = t5.beam_search(model, src, mask, 10, num_beams=3, use_cache=False)
    np.testing.assert_array_equal(together, alone)
    lengths = {int(np.sum(row != 0)) for row in together}  # pad 0 after the end
    assert len(lengths) >= 3 and (together == 4).any(), together
    for i in range(5):
        one = t5.beam_search(model, src[i : i + 1], mask[i : i + 1], 10, num_beams=3)
        np.testing.assert_array_equal(one[0], together[i, : one.shape[1]])


def test_greedy_decoding_equals_keras_hub_t5_seq2seq_lm_generate():
    """keras-hub's T5Seq2SeqLM (its own cached generation, greedy sampler) over the same
    weights produces the same ids as greedy_decode."""
    import keras_hub

    model = tiny()
    helpers.scramble_weights(model, 4.0)
    lm = keras_hub.models.T5Seq2SeqLM(backbone=t5.to_keras_hub(model), preprocessor=None)
    lm.compile(sampler="greedy")
    x = batch(s=11)
    inputs = generation.keras_hub_inputs(x["input_ids"], x["input_mask"], 0, 10)
    theirs = lm.generate(inputs, stop_token_ids=None)["decoder_token_ids"][:, 1:]
    ours = t5.greedy_decode(model, x["input_ids"], x["input_mask"], 10)
    assert len(np.unique(ours)) >= 3, ours
    np.testing.assert_array_equal(ours, theirs)
    # keras-hub's gated GELU is the exact one, T5's the tanh form: refused, not converted.
    with pytest.raises(ValueError, match="gated-gelu"):
        t5.to_keras_hub(tiny(feed_forward_proj="gated-gelu"))
