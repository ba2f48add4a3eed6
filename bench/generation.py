"""Greedy and beam-search generation, new tokens/s: Cloze's encoder-decoder decoding
(t5.greedy_decode, t5.beam_search: a key / value cache, the encoder and each step compiled by
XLA) against keras-hub's Seq2SeqLM.generate (its own cache, the whole loop compiled by XLA),
BART and T5 over the same weights; and GPT-2's greedy continuation (gpt.generate) against
keras-hub's GPT2CausalLM.generate.

Each family is built once from seeded weights scaled up (scramble_weights: at their initial
scale random models repeat one token, which a decoder ignoring its inputs would also produce),
converted to the other side (bart.from_keras_hub; t5.to_keras_hub), and both decode the same
batch of sources for the same number of new tokens with no stop token, so each side does the
same work. The ids are compared first (their share equal is reported). Timed rounds alternate
sides; tokens/s is the best round's, the ratio the median of the rounds' ratios. Cloze without
its cache (each step runs the whole prefix) is timed in two rounds, for the cache's own gain.
Then beam search of 4 (t5.beam_search, the batch decoded together) against keras-hub's
BeamSampler, the same way (at most 3 rounds).
"""

from __future__ import annotations

import statistics

import numpy as np

from bench import timing

# Published shapes: facebook/bart-base and t5-small (vocabularies as released).
# scale: the factor on every matrix (module doc). T5 has no 1/sqrt(d) in its attention, so 4x
# made its scores so sharp that float32 round-off (eager against XLA, 0.01 in the encoder
# output) flipped 40% of the ids; at 2x both sides agree on every id.
SIZES = {
    "bart-base": dict(
        family="bart", hidden=768, layers=6, heads=12, ffn=3072, vocab=50265, scale=4.0
    ),
    "t5-small": dict(
        family="t5", hidden=512, layers=6, heads=8, ffn=2048, vocab=32128, d_kv=64, scale=2.0
    ),
    # GPT-2 small; the sources are its prompts (gpt.generate, greedy; no beam search in Cloze's
    # GPT). At its initial scale its ids already vary.
    "gpt2": dict(family="gpt", hidden=768, layers=12, heads=12, ffn=3072, vocab=50257, scale=1.0),
}
QUICK_SIZES = {
    "bart-tiny": dict(family="bart", hidden=16, layers=1, heads=2, ffn=24, vocab=97, scale=4.0),
    "t5-tiny": dict(family="t5", hidden=16, layers=1, heads=2, ffn=24, vocab=97, d_kv=8, scale=2.0),
    "gpt2-tiny": dict(family="gpt", hidden=16, layers=1, heads=2, ffn=24, vocab=97, scale=4.0),
}


def scramble_weights(model, factor: float, seed: int = 0) -> None:
    """Multiplies every matrix (kernels, embedding tables) by factor and draws layer-norm scales
    in [0.5, 2]; vectors otherwise stay. A tiny or random model at its initial scale decodes one
    token over and over, which a decoder that ignores positions or the source would also do
    (the tests scramble their models with this too)."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        if "norm" in w.path and len(w.shape) == 1 and "beta" not in w.path:
            w.assign(rng.uniform(0.5, 2.0, w.shape).astype("float32"))
        elif len(w.shape) >= 2:
            w.assign(np.asarray(w.numpy()) * factor)


def keras_hub_inputs(input_ids, input_mask, start_id: int, new_tokens: int) -> dict:
    """keras-hub Seq2SeqLM.generate's inputs (preprocessor=None) for decoding new_tokens ids
    after start_id from the sources: the decoder ids hold the start, then room."""
    b = np.asarray(input_ids).shape[0]
    start = np.zeros((b, new_tokens + 1), np.int32)
    start[:, 0] = start_id
    return {
        "encoder_token_ids": np.asarray(input_ids),
        "encoder_padding_mask": np.asarray(input_mask).astype(bool),
        "decoder_token_ids": start,
        "decoder_padding_mask": np.arange(new_tokens + 1)[None].repeat(b, 0) == 0,
    }


def cloze_config(spec: dict, dropout: float = 0.0, width: int = 1024):
    """Cloze's config of a size spec (SIZES, QUICK_SIZES) with `dropout` wherever the family
    has one: GPT's GptConfig (n_ctx `width`), BART's BartConfig (max_position_embeddings
    `width`; attention_dropout too, as keras-hub's layers drop attention probabilities) or
    T5's T5Config."""
    from modeling import bart, gpt, t5

    if spec["family"] == "gpt":
        return gpt.GptConfig(
            n_vocab=spec["vocab"],
            n_ctx=width,
            n_embd=spec["hidden"],
            n_head=spec["heads"],
            n_layer=spec["layers"],
            n_inner=spec["ffn"],
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            resid_pdrop=dropout,
        )
    if spec["family"] == "bart":
        return bart.BartConfig(
            vocab_size=spec["vocab"],
            max_position_embeddings=width,
            encoder_layers=spec["layers"],
            decoder_layers=spec["layers"],
            encoder_attention_heads=spec["heads"],
            decoder_attention_heads=spec["heads"],
            encoder_ffn_dim=spec["ffn"],
            decoder_ffn_dim=spec["ffn"],
            d_model=spec["hidden"],
            dropout=dropout,
            attention_dropout=dropout,
        )
    return t5.T5Config(
        vocab_size=spec["vocab"],
        d_model=spec["hidden"],
        d_kv=spec["d_kv"],
        d_ff=spec["ffn"],
        num_layers=spec["layers"],
        num_heads=spec["heads"],
        dropout_rate=dropout,
    )


def build(spec: dict, source_length: int, new_tokens: int, seed: int = 0):
    """(Cloze model, keras-hub Seq2SeqLM or GPT2CausalLM compiled with the greedy sampler,
    decoder start id or None for GPT) holding the same weights."""
    import keras
    import keras_hub

    from modeling import bart, gpt, t5

    keras.utils.set_random_seed(seed)
    if spec["family"] == "gpt":
        model = gpt.GptLM(cloze_config(spec, width=max(1024, source_length + new_tokens)))
        model.build()
        scramble_weights(model, spec["scale"], seed)
        lm = keras_hub.models.GPT2CausalLM(backbone=gpt.to_keras_hub(model), preprocessor=None)
        lm.compile(sampler="greedy")
        return model, lm, None
    if spec["family"] == "bart":
        backbone = keras_hub.models.BartBackbone(
            vocabulary_size=spec["vocab"],
            num_layers=spec["layers"],
            num_heads=spec["heads"],
            hidden_dim=spec["hidden"],
            intermediate_dim=spec["ffn"],
            dropout=0.0,
            max_sequence_length=max(source_length, new_tokens + 1),
        )
        scramble_weights(backbone, spec["scale"], seed)
        # Hugging Face's BART ids: <s> 0, <pad> 1, </s> 2, decoding from </s>.
        model = bart.from_keras_hub(
            backbone, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2
        )
        lm = keras_hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=None)
    else:
        model = t5.T5Model(cloze_config(spec))
        model.build()
        scramble_weights(model, spec["scale"], seed)
        lm = keras_hub.models.T5Seq2SeqLM(backbone=t5.to_keras_hub(model), preprocessor=None)
    lm.compile(sampler="greedy")
    return model, lm, model.config.decoder_start_token_id


def run(
    sizes=tuple(SIZES),
    batch: int = 8,
    source_length: int = 128,
    new_tokens: int = 32,
    rounds: int = 5,
    specs: dict | None = None,
) -> dict:
    """{"sizes": [per size: tokens/s of both sides, the ratio, ids equal, the cache's gain, and
    "beam": the same for beam search (encoder-decoders)]}."""
    specs = specs or {**SIZES, **QUICK_SIZES}
    out = {"batch": batch, "source_length": source_length, "new_tokens": new_tokens, "sizes": []}
    for name in sizes:
        row = one_size(specs[name], batch, source_length, new_tokens, rounds)
        out["sizes"].append({"size": name, "family": specs[name]["family"], **row})
    return out


def _time_sides(sides: dict, rounds: int, extra: dict | None = None) -> tuple[dict, dict]:
    """({side: (ids of its first call, that call's seconds: tracing and compilation)}, {side:
    [seconds per round]}): timing.alternating_rounds, `extra` sides after the two in its first
    two rounds."""
    first, timed = timing.alternating_rounds(sides, rounds, extra)
    every = {**sides, **(extra or {})}
    times = {side: [r[side] for r in timed if side in r] for side in every}
    return {side: (np.asarray(ids), s) for side, (ids, s) in first.items()}, times


def _figures(first: dict, times: dict, tokens: int) -> dict:
    """tokens/s per side (best round), the median of the rounds' keras-hub / Cloze time ratios,
    and the share of equal ids."""
    ours, theirs = first["cloze"][0], first["keras_hub"][0]
    ratios = [k / c for c, k in zip(times["cloze"], times["keras_hub"])]
    return {
        **{
            side: {
                "tokens_per_s": tokens / min(t),
                "seconds_rounds": t,
                **({"first_call_s": first[side][1]} if side in first else {}),
            }
            for side, t in times.items()
        },
        "ratio": statistics.median(ratios),
        "ratio_rounds": ratios,
        "ids_equal": float((ours == theirs).mean()) if ours.shape == theirs.shape else 0.0,
        "distinct_ids": int(len(np.unique(ours))),
    }


def _greedy_figures(ours, theirs, rounds: int, tokens: int) -> dict:
    """_figures of ours(use_cache=True) against theirs(), plus "cache_gain": ours with its cache
    against ours without it (two rounds)."""
    first, times = _time_sides(
        {"cloze": ours, "keras_hub": theirs}, rounds, {"cloze_no_cache": lambda: ours(False)}
    )
    out = _figures(first, times, tokens)
    out["cache_gain"] = min(times["cloze_no_cache"]) / min(times["cloze"])
    return out


def one_size(
    spec: dict, batch: int, source_length: int, new_tokens: int, rounds: int, num_beams: int = 4
) -> dict:
    """The figures of one size (see run): greedy, and beam search of num_beams (keras-hub's
    BeamSampler: with no stop token both keep the most probable beam, the same ids)."""
    import keras_hub

    from modeling import t5

    model, lm, start_id = build(spec, source_length, new_tokens)
    if spec["family"] == "gpt":
        return _one_gpt_size(model, lm, spec, batch, source_length, new_tokens, rounds)
    rng = np.random.default_rng(1)
    ids = rng.integers(3, spec["vocab"], (batch, source_length)).astype(np.int32)
    lengths = rng.integers(source_length // 2, source_length + 1, batch)
    mask = (np.arange(source_length)[None, :] < lengths[:, None]).astype(np.int32)
    ids = ids * mask + model.config.pad_token_id * (1 - mask)
    inputs = keras_hub_inputs(ids, mask, start_id, new_tokens)
    # No stop token on either side: Cloze's decoders stop once rows produce eos_token_id, so
    # the (frozen) config's eos is moved out of the vocabulary for the timing.
    object.__setattr__(model.config, "eos_token_id", -1)

    def theirs():
        return lm.generate(inputs, stop_token_ids=None)["decoder_token_ids"][:, 1:]

    def ours(use_cache=True):
        return t5.greedy_decode(model, ids, mask, new_tokens, use_cache=use_cache)

    out = _greedy_figures(ours, theirs, rounds, batch * new_tokens)
    lm.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=num_beams))
    # keras-hub's beam search is the slow side (6x): fewer rounds.
    first, times = _time_sides(
        {
            "cloze": lambda: t5.beam_search(model, ids, mask, new_tokens, num_beams),
            "keras_hub": theirs,
        },
        min(rounds, 3),
    )
    out["beam"] = {"num_beams": num_beams, **_figures(first, times, batch * new_tokens)}
    return out


def _one_gpt_size(model, lm, spec, batch, prompt_length, new_tokens, rounds) -> dict:
    """GPT's figures: greedy continuations of random prompts (all real ids: gpt.generate takes
    prompts of one length) against keras-hub's GPT2CausalLM.generate, and the cache's gain."""
    from modeling import gpt

    rng = np.random.default_rng(1)
    prompt = rng.integers(0, spec["vocab"], (batch, prompt_length)).astype(np.int32)
    width = prompt_length + new_tokens
    inputs = {
        "token_ids": np.concatenate([prompt, np.zeros((batch, new_tokens), np.int32)], 1),
        "padding_mask": np.arange(width)[None].repeat(batch, 0) < prompt_length,
    }

    def ours(use_cache=True):
        out = gpt.generate(model, prompt, new_tokens, temperature=0, use_cache=use_cache)
        return out[:, prompt_length:]

    def theirs():
        return lm.generate(inputs, stop_token_ids=None)["token_ids"][:, prompt_length:]

    return _greedy_figures(ours, theirs, rounds, batch * new_tokens)
