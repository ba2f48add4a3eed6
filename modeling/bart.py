"""BART (Lewis et al. 2020): the encoder-decoder Transformer with learned absolute positions.

Read top to bottom: `BartConfig` (the field names of BART's published config.json; a config.json
as Hugging Face publishes it loads through `BartConfig.from_hf_config`),
`_attention` (multi-head attention with biases and a key / value cache for decoding),
`BartEncoderLayer` / `BartDecoderLayer` (post-LN residual sub-blocks:
x = LayerNorm(x + dropout(f(x))), as BERT and the original Transformer), `BartModel` (shared
token embedding, a learned position table per stack with fairseq's offset of 2,
layernorm_embedding, the tied output embedding plus final_logits_bias), and `from_keras_hub`
(keras-hub's BartBackbone weights into a BartModel: the converter for the checkpoints keras-hub
loads). Decoding is t5.greedy_decode / t5.beam_search, which take any encoder-decoder with
encode / decoder_cache / decode.
Shapes: B batch, T target (decoder) length, S source (encoder) length, Q query length, K key
length, H d_model, N heads, D head depth (H / N), F ffn_dim, V vocab, P position table rows.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import keras
import numpy as np
from keras import ops

from modeling import bert, heads, layers, t5

# fairseq's LearnedPositionalEmbedding numbers positions from padding_idx + 1 = 2, so the released
# BART tables have max_position_embeddings + 2 rows and position 0 reads row 2 (Hugging Face's
# BartLearnedPositionalEmbedding keeps this offset for checkpoint compatibility).
POSITION_OFFSET = 2
# Hugging Face's ACT2FN names: "gelu" is the exact erf form (BART's released models), "gelu_new"
# the tanh approximation.
ACTIVATIONS = {
    "gelu": lambda x: keras.activations.gelu(x, approximate=False),
    "gelu_new": lambda x: keras.activations.gelu(x, approximate=True),
    "relu": keras.activations.relu,
}
# BART's LayerNorm epsilon (torch.nn.LayerNorm's default, kept by fairseq and Hugging Face).
LAYER_NORM_EPSILON = 1e-5


def is_bart_config(values: dict) -> bool:
    """Whether a config dict is a BART one: its config.json names encoder_layers /
    encoder_attention_heads (T5's has num_layers / num_heads, BERT's num_hidden_layers)."""
    return (
        isinstance(values, dict)
        and "vocab_size" in values
        and (
            "encoder_layers" in values
            or "encoder_attention_heads" in values
            or values.get("model_type") == "bart"
        )
    )


@dataclasses.dataclass(frozen=True)
class BartConfig(bert.JsonConfig):
    """BART hyper-parameters under the names of Hugging Face's BartConfig (config.json); the
    defaults are its defaults (bart-large's sizes).

    Only vocab_size is required. encoder_layerdrop / decoder_layerdrop exist so published configs
    load; only 0.0 (no LayerDrop) is implemented. bos_token_id is the <s> that starts inputs and
    targets (data_prep/create_seq2seq_data.py writes them so, as BART was pretrained); null is
    accepted for data without one. decoder_start_token_id is BART's </s> (eos) in the released
    models: the decoder reads `</s> <s> ...`.
    """

    vocab_size: int
    max_position_embeddings: int = 1024
    encoder_layers: int = 12
    encoder_ffn_dim: int = 4096
    encoder_attention_heads: int = 16
    decoder_layers: int = 12
    decoder_ffn_dim: int = 4096
    decoder_attention_heads: int = 16
    encoder_layerdrop: float = 0.0
    decoder_layerdrop: float = 0.0
    activation_function: str = "gelu"
    d_model: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    init_std: float = 0.02
    scale_embedding: bool = False
    pad_token_id: int = 1
    bos_token_id: int | None = 0
    eos_token_id: int = 2
    decoder_start_token_id: int = 2

    OPTIONAL: ClassVar[frozenset] = frozenset()  # set below the class: all but vocab_size
    FAMILY: ClassVar[str] = "BART"
    FILE_KIND: ClassVar[str] = "a BART config file"

    def __post_init__(self):
        positive = (
            "vocab_size",
            "max_position_embeddings",
            "encoder_layers",
            "encoder_ffn_dim",
            "encoder_attention_heads",
            "decoder_layers",
            "decoder_ffn_dim",
            "decoder_attention_heads",
            "d_model",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BartConfig.{name}: expected a positive integer, found {value!r}")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, name):
                raise ValueError(
                    f"BartConfig.{name}: expected a divisor of d_model {self.d_model}, "
                    f"found {getattr(self, name)}"
                )
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"BartConfig.activation_function: expected one of {sorted(ACTIVATIONS)}, "
                f"found {self.activation_function!r}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"BartConfig.{name}: expected a number, found {value!r}")
            if not 0.0 <= value < 1.0:
                raise ValueError(f"BartConfig.{name}: expected a value in [0, 1), found {value!r}")
        for name in ("encoder_layerdrop", "decoder_layerdrop"):
            if getattr(self, name) != 0.0:
                raise ValueError(
                    f"BartConfig.{name}: expected 0.0 (LayerDrop is not implemented), "
                    f"found {getattr(self, name)!r}"
                )
        ids = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
        for name in ids:
            value = getattr(self, name)
            if value is None and name == "bos_token_id":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value:
                raise ValueError(f"BartConfig.{name}: expected a token id >= 0, found {value!r}")
            if value >= self.vocab_size:
                raise ValueError(
                    f"BartConfig.{name}: expected an id below vocab_size {self.vocab_size}, "
                    f"found {value}"
                )
        if not isinstance(self.scale_embedding, bool):
            raise ValueError(
                "BartConfig.scale_embedding: expected true or false, "
                f"found {self.scale_embedding!r}"
            )

    @classmethod
    def from_hf_config(cls, values: dict, source: str = "config.json") -> BartConfig:
        """A Hugging Face BART `config.json` as published (with its bookkeeping and generation
        keys) -> BartConfig. Keys that change the computation must have the value BART has
        (HF_FIXED: e.g. mBART's pre-LN normalize_before is refused); the keys of HF_IGNORED and
        modeling/checkpoints.py's _HF_IGNORED are dropped; any other unknown key is an error."""
        from data_prep.errors import input_error
        from modeling import checkpoints

        checkpoints.check_hf_fixed(values, HF_FIXED, source, "BART")
        layers = values.get("num_hidden_layers", values.get("encoder_layers"))
        if layers != values.get("encoder_layers", layers):
            raise input_error(f"{source}: num_hidden_layers", "encoder_layers' value", repr(layers))
        ignored = set(HF_FIXED) | HF_IGNORED | checkpoints._HF_IGNORED | {"num_hidden_layers"}
        fields = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in values.items() if k in fields or k not in ignored}
        return cls.from_dict(kept, source)


BartConfig.OPTIONAL = frozenset(f.name for f in dataclasses.fields(BartConfig)) - {"vocab_size"}

# Keys of Hugging Face's BART config.json that change the computation, with BART's value (mBART
# and friends differ: pre-LN, a final layer norm, ...); extra_pos_embeddings is the offset.
HF_FIXED = {
    "model_type": "bart",
    "is_encoder_decoder": True,
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": True,
    "add_bias_logits": False,
    "static_position_embeddings": False,
    "extra_pos_embeddings": POSITION_OFFSET,
}
# Generation and classification-head settings of a BART config.json: they do not change what
# BartModel computes.
HF_IGNORED = frozenset(
    """classif_dropout forced_bos_token_id forced_eos_token_id early_stopping num_beams
    no_repeat_ngram_size max_length min_length length_penalty output_past""".split()
)


def _dense(units, config: BartConfig, name: str, activation=None):
    # Hugging Face's BartPreTrainedModel._init_weights: normal(0, init_std) kernels, zero biases.
    return keras.layers.Dense(
        units,
        activation=activation,
        kernel_initializer=keras.initializers.RandomNormal(stddev=config.init_std),
        name=name,
    )


def _layer_norm(name: str):
    return keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=name)


def _attention(config: BartConfig, heads: int, name: str):
    """Multi-head attention with q / k / v / out biases; keras' layer scales the queries by
    D^-0.5 as BART's BartAttention does. keras-hub's subclass of it (the same variables, the
    same computation) is the layer keras-hub's BART is built from; decoding reads its
    projections through `_cached_attention` and `_key_value_cache`."""
    import keras_hub  # here, not at module level: config checks import this file

    return keras_hub.layers.CachedMultiHeadAttention(
        num_heads=heads,
        key_dim=config.d_model // heads,
        dropout=config.attention_dropout,
        kernel_initializer=keras.initializers.RandomNormal(stddev=config.init_std),
        name=name,
    )


def _key_value_cache(attention, source) -> list:
    """[keys, values], each float (B, N, S, D), of source float (B, S, H) under `attention`'s
    projections (an _attention layer)."""
    return [
        layers.heads_first(attention._key_dense(source)),
        layers.heads_first(attention._value_dense(source)),
    ]


def _cached_attention(attention, x, cache, mask, cache_index=None):
    """An _attention layer's output for queries x float (B, T, H) against cached keys and values
    ([keys, values], each float (B, N, K, D)), and the cache: with cache_index, x's own keys
    and values are first written into it there (self-attention); without, it is read as it is
    (cross-attention). mask bool (B, T, K). Decoding only (no dropout).
    Why not keras-hub's cached call on the same layer: its cache is one (B, 2, K, N, D) stack
    (layers.write_cache says what that cost). The projections are the layer's own (keras'
    MultiHeadAttention sublayers, which keras-hub's layer reads the same way)."""
    query = attention._query_dense(x) * (attention.key_dim**-0.5)  # (B, T, N, D)
    if cache_index is not None:
        new_k, new_v = attention._key_dense(x), attention._value_dense(x)
        cache = layers.write_cache(cache, cache_index, new_k, new_v)
    keys, values = cache
    # Masked and normalised in float32, as keras' masked softmax does under a mixed policy.
    scores = ops.cast(ops.einsum("btnd,bnkd->bntk", query, keys), "float32")
    scores = ops.where(mask[:, None], scores, -1e9)
    probs = ops.cast(ops.softmax(scores, axis=-1), values.dtype)
    context = ops.einsum("bntk,bnkd->btnd", probs, values)
    return attention._output_dense(context), cache


class _FeedForward(keras.layers.Layer):
    """fc2(dropout(act(fc1(x)))) with activation_dropout inside (BART's fc1 / fc2).

    In training a GELU runs as layers.fused_activation's two XLA kernels, as BERT's and GPT's
    feed-forwards do (the same formula, computed in float32); elsewhere (decoding, a SavedModel)
    as keras' gelu. Why: TensorFlow runs GELU as about ten element-wise ops each way over the
    (B*L, F) activations. Measured in bench/lm_training.py's bart-base step on 2 AVX-512 cores
    (fifty-sixth session): 0.97-1.07x in three probes of alternating rounds in one process
    (medians 1.01-1.05x); the benchmark went from 0.98x to 1.03x keras-hub (bench/HISTORY.md).
    """

    def __init__(self, config: BartConfig, ffn_dim: int, **kwargs):
        super().__init__(**kwargs)
        self.config, self.ffn_dim = config, ffn_dim
        self.fc1 = _dense(ffn_dim, config, "fc1")
        self.fc2 = _dense(config.d_model, config, "fc2")
        self.activation_dropout = layers.Dropout(config.activation_dropout)
        from modeling import checkpoints  # here, not at module level, as BartConfig's loader

        # Hugging Face's activation names (BART's) under Cloze's: None where there is no kernel.
        act = checkpoints.HF_TO_CLOZE_ACTIVATION[config.activation_function]
        self._fused_act = layers.fused_activation(act)

    def build(self, input_shape):
        self.fc1.build(input_shape)
        self.fc2.build((*input_shape[:-1], self.ffn_dim))

    def call(self, x, training=False):
        h = self.fc1(x)  # (B, L, F)
        if training and self._fused_act is not None:
            h = self._fused_act(h)
        else:
            h = ACTIVATIONS[self.config.activation_function](h)
        return self.fc2(self.activation_dropout(h, training=training))


class BartEncoderLayer(keras.layers.Layer):
    """Self-attention then feed-forward, each x = LayerNorm(x + dropout(f(x))) (post-LN).

    call(x, attention_mask, training): x float (B, S, H); attention_mask bool (B, S, S).
    """

    def __init__(self, config: BartConfig, **kwargs):
        super().__init__(**kwargs)
        c = self.config = config
        self.self_attn = _attention(c, c.encoder_attention_heads, "self_attn")
        self.self_attn_layer_norm = _layer_norm("self_attn_layer_norm")
        self.ffn = _FeedForward(c, c.encoder_ffn_dim, name="ffn")
        self.final_layer_norm = _layer_norm("final_layer_norm")
        self.dropout = layers.Dropout(c.dropout)

    def build(self, input_shape):
        self.self_attn.build(input_shape, input_shape)
        self.self_attn_layer_norm.build(input_shape)
        self.ffn.build(input_shape)
        self.final_layer_norm.build(input_shape)

    def call(self, x, attention_mask=None, training=False):
        a = self.self_attn(x, x, attention_mask=attention_mask, training=training)
        x = layers.residual_layer_norm(self.self_attn_layer_norm, x, a, self.dropout, training)
        h = self.ffn(x, training=training)
        return layers.residual_layer_norm(self.final_layer_norm, x, h, self.dropout, training)


class BartDecoderLayer(keras.layers.Layer):
    """Causal self-attention, cross-attention over the encoder, feed-forward; each post-LN.

    call(x, encoder_output, self_mask, cross_mask, self_cache, cross_cache, cache_index,
    training): x float (B, T, H); encoder_output float (B, S, H); self_mask bool (B, T, K);
    cross_mask bool (B, T, S). Without caches K = T and the output is float (B, T, H). While
    decoding, self_cache ([keys, values], each float (B, N, K, D)) gets x's keys and values at
    cache_index and cross_cache holds the encoder output's (from `cross_cache`); the output is
    then (float (B, T, H), the updated self_cache).
    """

    def __init__(self, config: BartConfig, **kwargs):
        super().__init__(**kwargs)
        c = self.config = config
        self.self_attn = _attention(c, c.decoder_attention_heads, "self_attn")
        self.self_attn_layer_norm = _layer_norm("self_attn_layer_norm")
        self.encoder_attn = _attention(c, c.decoder_attention_heads, "encoder_attn")
        self.encoder_attn_layer_norm = _layer_norm("encoder_attn_layer_norm")
        self.ffn = _FeedForward(c, c.decoder_ffn_dim, name="ffn")
        self.final_layer_norm = _layer_norm("final_layer_norm")
        self.dropout = layers.Dropout(c.dropout)

    def build(self, input_shape):
        self.self_attn.build(input_shape, input_shape)
        self.self_attn_layer_norm.build(input_shape)
        self.encoder_attn.build(input_shape, input_shape)
        self.encoder_attn_layer_norm.build(input_shape)
        self.ffn.build(input_shape)
        self.final_layer_norm.build(input_shape)

    def cross_cache(self, encoder_output):
        """[keys, values], each float (B, N, S, D): the cross-attention keys and values of
        encoder_output, computed once per decoding."""
        return _key_value_cache(self.encoder_attn, encoder_output)

    def call(
        self,
        x,
        encoder_output,
        self_mask=None,
        cross_mask=None,
        self_cache=None,
        cross_cache=None,
        cache_index=None,
        training=False,
    ):
        if self_cache is None:
            a = self.self_attn(x, x, attention_mask=self_mask, training=training)
        else:
            a, self_cache = _cached_attention(self.self_attn, x, self_cache, self_mask, cache_index)
        x = layers.residual_layer_norm(self.self_attn_layer_norm, x, a, self.dropout, training)
        if cross_cache is None:
            a = self.encoder_attn(x, encoder_output, attention_mask=cross_mask, training=training)
        else:  # the encoder output's keys and values come from the cache
            a, _ = _cached_attention(self.encoder_attn, x, cross_cache, cross_mask)
        x = layers.residual_layer_norm(self.encoder_attn_layer_norm, x, a, self.dropout, training)
        h = self.ffn(x, training=training)
        x = layers.residual_layer_norm(self.final_layer_norm, x, h, self.dropout, training)
        return x if self_cache is None else (x, self_cache)


@keras.saving.register_keras_serializable(package="cloze")
class BartModel(keras.Model):
    """The whole encoder-decoder with its language-model output (BartForConditionalGeneration).

    call(inputs, training) with int (B, S) `input_ids`, `input_mask` (encoder side) and int
    (B, T) `decoder_input_ids` (the targets shifted right after decoder_start_token_id) and
    optionally `decoder_mask`. Returns a dict: encoder_output float (B, S, H), decoder_output
    float (B, T, H), lm_logits float32 (B, T, V). S and T at most max_position_embeddings.
    With lm_terms and int (B, T) `target_ids` in inputs: lm_xent and lm_hits float32 (B, T)
    instead of lm_logits, as t5.T5Model's.
    """

    def __init__(self, config: BartConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = BartConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        # One attribute per layer: tf.train.Checkpoint does not follow Keras' TrackedList.
        for i in range(c.encoder_layers):
            setattr(self, f"encoder_{i}", BartEncoderLayer(c, name=f"encoder_{i}"))
        for i in range(c.decoder_layers):
            setattr(self, f"decoder_{i}", BartDecoderLayer(c, name=f"decoder_{i}"))
        self.encoder_layernorm_embedding = _layer_norm("encoder_layernorm_embedding")
        self.decoder_layernorm_embedding = _layer_norm("decoder_layernorm_embedding")
        self.dropout = layers.Dropout(c.dropout)
        # BartScaledWordEmbedding: sqrt(d_model) when scale_embedding (fairseq's embed_scale).
        self.embed_scale = float(np.sqrt(c.d_model)) if c.scale_embedding else 1.0

    def layers_of(self, decoder: bool) -> list:
        c = self.config
        n = c.decoder_layers if decoder else c.encoder_layers
        return [getattr(self, f"{'decoder' if decoder else 'encoder'}_{i}") for i in range(n)]

    def build(self, input_shape=None):
        c = self.config
        init = keras.initializers.RandomNormal(stddev=c.init_std)
        # The looked-up tables read as float32 under a mixed policy (layers.lookup_rows).
        self.shared = self.add_weight(
            name="shared", shape=(c.vocab_size, c.d_model), initializer=init, autocast=False
        )
        rows = c.max_position_embeddings + POSITION_OFFSET
        self.encoder_embed_positions = self.add_weight(
            name="encoder_embed_positions", shape=(rows, c.d_model), initializer=init,
            autocast=False,
        )  # fmt: skip
        self.decoder_embed_positions = self.add_weight(
            name="decoder_embed_positions", shape=(rows, c.d_model), initializer=init,
            autocast=False,
        )  # fmt: skip
        # A buffer of zeros in the released models (Hugging Face registers it, never trains it);
        # kept so converted checkpoints carry it. Read as float32 under a mixed policy too: it is
        # added to the float32 logits.
        self.final_logits_bias = self.add_weight(
            name="final_logits_bias", shape=(c.vocab_size,), initializer="zeros",
            trainable=False, autocast=False,
        )  # fmt: skip
        shape = (None, None, c.d_model)
        for layer in self.layers_of(False) + self.layers_of(True):
            layer.build(shape)
        self.encoder_layernorm_embedding.build(shape)
        self.decoder_layernorm_embedding.build(shape)
        self.built = True

    def _embed(self, ids, table, norm, training, first=0):
        """layernorm_embedding(tokens * embed_scale + positions), then dropout: float (B, L, H);
        positions first .. first + L - 1 (first: an int or int scalar tensor)."""
        length = ops.shape(ids)[1]
        if isinstance(length, int) and isinstance(first, int):
            if first + length > self.config.max_position_embeddings:
                raise ValueError(
                    f"BART: expected at most max_position_embeddings="
                    f"{self.config.max_position_embeddings} ids per sequence, found "
                    f"{first + length}"
                )
        dtype = self.compute_dtype
        tokens = layers.lookup_rows(self.shared, ids, dtype) * self.embed_scale  # (B, L, H)
        if isinstance(first, int):
            start, size = (POSITION_OFFSET + first, 0), (length, self.config.d_model)
            # convert_to_tensor: under JAX, slicing the variable itself fails when traced now
            # that it is not autocast (autocast, the read was already an array).
            positions = ops.cast(ops.slice(ops.convert_to_tensor(table), start, size), dtype)
        else:
            # At a cache index (a tensor) a gather, not a slice: XLA compiles a slice's start as
            # a constant, so the decoding step recompiled at every position (0.6 s each).
            rows = ops.arange(length) + (POSITION_OFFSET + first)
            positions = layers.lookup_rows(table, rows, dtype)
        return self.dropout(norm(tokens + positions[None]), training=training)

    def encode(self, input_ids, input_mask, training=False):
        """float (B, S, H) encoder states (padded positions hold values no real one reads)."""
        x = self._embed(
            input_ids, self.encoder_embed_positions, self.encoder_layernorm_embedding, training
        )
        keys = ops.cast(input_mask, "bool")[:, None, :]  # (B, 1, S)
        mask = ops.logical_and(keys, ops.ones_like(keys)[:, 0, :, None])  # (B, S, S)
        for layer in self.layers_of(False):
            x = layer(x, attention_mask=mask, training=training)
        return x

    def decoder_cache(self, encoder_output, max_length: int) -> dict:
        """The caches for decoding up to max_length positions over encoder_output (B, S, H):
        "self", zero keys and values, float (B, N, max_length, D) each, per decoder layer, and
        "cross", each layer's cross-attention keys and values of the encoder output, float
        (B, N, S, D) each (`_cached_attention`'s cache)."""
        c = self.config
        if max_length > c.max_position_embeddings:
            raise ValueError(
                f"BART: expected at most max_position_embeddings={c.max_position_embeddings} "
                f"decoder positions, found {max_length}"
            )
        b, heads = ops.shape(encoder_output)[0], c.decoder_attention_heads
        zeros = ops.zeros((b, heads, max_length, c.d_model // heads), encoder_output.dtype)
        decoder = self.layers_of(True)
        return {
            "self": [[zeros, zeros] for _ in decoder],
            "cross": [layer.cross_cache(encoder_output) for layer in decoder],
        }

    def decode(
        self,
        decoder_input_ids,
        encoder_output,
        input_mask,
        decoder_mask=None,
        cache=None,
        cache_index=None,
        training=False,
        with_logits=True,
    ):
        """float (B, T, H) decoder states and float32 (B, T, V) logits (None without
        with_logits), as t5.T5Model.decode.

        With cache (from `decoder_cache`) and cache_index, decoder_input_ids are the positions
        cache_index .. cache_index + T - 1 after those already cached, and the updated cache
        comes third: (states, logits, cache), as t5.T5Model.decode; encoder_output may then
        be None (its keys and values are in the cache)."""
        t = ops.shape(decoder_input_ids)[1]
        first = 0 if cache is None else cache_index
        x = self._embed(
            decoder_input_ids, self.decoder_embed_positions, self.decoder_layernorm_embedding,
            training, first,
        )  # fmt: skip
        keys = ops.arange(t if cache is None else ops.shape(cache["self"][0][0])[2])
        causal = keys[None, :] <= (ops.arange(t) + first)[:, None]  # (T, K) keys at or before
        queries = ops.ones_like(ops.cast(decoder_input_ids, "bool"))[:, :, None]  # (B, T, 1)
        self_mask = ops.logical_and(queries, causal[None])  # (B, T, K)
        if decoder_mask is not None:
            self_mask = ops.logical_and(self_mask, ops.cast(decoder_mask, "bool")[:, None, :])
        cross_mask = ops.logical_and(queries, ops.cast(input_mask, "bool")[:, None, :])  # (B, T, S)
        new_self = []
        for i, layer in enumerate(self.layers_of(True)):
            kw = dict(self_mask=self_mask, cross_mask=cross_mask, training=training)
            if cache is None:
                x = layer(x, encoder_output, **kw)
            else:
                x, layer_cache = layer(
                    x, encoder_output, self_cache=cache["self"][i],
                    cross_cache=cache["cross"][i], cache_index=cache_index, **kw,
                )  # fmt: skip
                new_self.append(layer_cache)
        logits = self.output_logits(x) if with_logits else None
        if cache is not None:
            return x, logits, {"self": new_self, "cross": cache["cross"]}
        return x, logits

    def output_logits(self, x):
        """float32 (B, T, V) logits of decoder states float (B, T, H): the tied output embedding
        plus the vocabulary bias (BartForConditionalGeneration.lm_head)."""
        table = ops.cast(self.shared, x.dtype)
        # In float32: under a mixed policy the product is bfloat16 / float16, and the bias float32
        # in and out of a Keras call (TensorFlow refuses a sum of the two dtypes).
        return ops.cast(ops.einsum("bth,vh->btv", x, table), "float32") + self.final_logits_bias

    def output_xent_and_hits(self, x, labels):
        """float32 (B, T) cross-entropy and argmax hits of output_logits(x) against int (B, T)
        labels, without the logits (heads.tied_xent_and_hits: vocabulary-major, the bias and
        the softmax in float32)."""
        return heads.tied_xent_and_hits(x, self.shared, self.final_logits_bias, labels)

    def call(self, inputs, training=False, lm_terms=False):
        return t5.encoder_decoder_outputs(self, inputs, training, lm_terms)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def config_from_keras_hub(backbone, **token_ids) -> BartConfig:
    """The BartConfig of a keras_hub.models.BartBackbone (equal encoder and decoder sizes, exact
    GELU, no embedding scaling, as keras-hub builds it); token_ids (pad_token_id, eos_token_id,
    ...) override Hugging Face's defaults, which are the released BART vocabulary's."""
    return BartConfig(
        vocab_size=backbone.vocabulary_size,
        max_position_embeddings=backbone.max_sequence_length,
        encoder_layers=backbone.num_layers,
        encoder_ffn_dim=backbone.intermediate_dim,
        encoder_attention_heads=backbone.num_heads,
        decoder_layers=backbone.num_layers,
        decoder_ffn_dim=backbone.intermediate_dim,
        decoder_attention_heads=backbone.num_heads,
        d_model=backbone.hidden_dim,
        dropout=backbone.dropout,
        activation_function="gelu",
        **token_ids,
    )


def copy_from_keras_hub(backbone, model: BartModel) -> None:
    """Assigns every weight of a keras_hub.models.BartBackbone to a built BartModel of the same
    sizes (config_from_keras_hub). keras-hub drops the first POSITION_OFFSET rows of the released
    position tables (they are never read); they become zeros here. final_logits_bias stays zero
    (keras-hub's BartSeq2SeqLM has none; the released models' is zeros)."""
    c = model.config
    model.shared.assign(backbone.token_embedding.embeddings)
    for side, table, norm in (
        ("encoder", model.encoder_embed_positions, model.encoder_layernorm_embedding),
        ("decoder", model.decoder_embed_positions, model.decoder_layernorm_embedding),
    ):
        theirs = np.asarray(backbone.get_layer(f"{side}_position_embedding").position_embeddings)
        if theirs.shape != (c.max_position_embeddings, c.d_model):
            raise ValueError(
                f"keras-hub {side} position table: expected "
                f"{(c.max_position_embeddings, c.d_model)}, found {theirs.shape}"
            )
        zeros = np.zeros((POSITION_OFFSET, c.d_model), theirs.dtype)
        table.assign(np.concatenate([zeros, theirs]))  # (P, H): rows 0-1 unused
        ln = backbone.get_layer(f"{side}_embeddings_layer_norm")
        norm.gamma.assign(ln.gamma)
        norm.beta.assign(ln.beta)
    model.final_logits_bias.assign(np.zeros(c.vocab_size, np.float32))
    for decoder in (False, True):
        side = "decoder" if decoder else "encoder"
        for i, ours in enumerate(model.layers_of(decoder)):
            theirs = backbone.get_layer(f"transformer_{side}_layer_{i}")
            pairs = [
                (ours.self_attn, theirs._self_attention_layer),
                (ours.self_attn_layer_norm, theirs._self_attention_layer_norm),
                (ours.ffn.fc1, theirs._feedforward_intermediate_dense),
                (ours.ffn.fc2, theirs._feedforward_output_dense),
                (ours.final_layer_norm, theirs._feedforward_layer_norm),
            ]
            if decoder:
                pairs += [
                    (ours.encoder_attn, theirs._cross_attention_layer),
                    (ours.encoder_attn_layer_norm, theirs._cross_attention_layer_norm),
                ]
            for mine, source in pairs:
                # Same Keras classes underneath (MultiHeadAttention, Dense, LayerNormalization),
                # so the weights line up one to one in creation order.
                if len(mine.weights) != len(source.weights):
                    raise ValueError(f"{source.path}: {len(source.weights)} weights, expected "
                                     f"{len(mine.weights)} for {mine.path}")  # fmt: skip
                for w, v in zip(mine.weights, source.weights):
                    if tuple(w.shape) != tuple(v.shape):
                        raise ValueError(
                            f"{v.path}: expected shape {tuple(w.shape)}, found {tuple(v.shape)}"
                        )
                    w.assign(v)


def from_keras_hub(backbone, **token_ids) -> BartModel:
    """A BartModel holding a keras_hub.models.BartBackbone's weights (e.g. one from
    BartBackbone.from_preset, where presets can be had)."""
    model = BartModel(config_from_keras_hub(backbone, **token_ids))
    model.build()
    copy_from_keras_hub(backbone, model)
    return model


# ---------------------------------------------------------------------------------------------
# Hugging Face's BART checkpoints (BartForConditionalGeneration / BartModel safetensors)
# ---------------------------------------------------------------------------------------------

# A BartForConditionalGeneration holds the network under `model.`; a bare BartModel has no prefix.
HF_PREFIX = "model."


def _hf_attention_entries(dst: str, src: str, h: int, n: int) -> list:
    """One BartAttention: nn.Linear q / k / v_proj ((out, in) weights) onto Keras
    MultiHeadAttention's per-head kernels (H, N, D) and biases (N, D); out_proj onto (N, D, H)."""
    from modeling.checkpoints import Entry

    d = h // n
    out = []
    for mine, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        out.append(Entry(
            f"{dst}/{mine}/kernel", (f"{src}.{theirs}.weight",), ((h, h),),
            lambda a: a[0].T.reshape(h, n, d), lambda x: [x.reshape(h, h).T],
        ))  # fmt: skip
        out.append(Entry(
            f"{dst}/{mine}/bias", (f"{src}.{theirs}.bias",), ((h,),),
            lambda a: a[0].reshape(n, d), lambda x: [x.reshape(h)],
        ))  # fmt: skip
    out.append(Entry(
        f"{dst}/attention_output/kernel", (f"{src}.out_proj.weight",), ((h, h),),
        lambda a: a[0].T.reshape(n, d, h), lambda x: [x.reshape(h, h).T],
    ))  # fmt: skip
    out.append(Entry(f"{dst}/attention_output/bias", (f"{src}.out_proj.bias",), ((h,),),
                     lambda a: a[0], lambda x: [x]))  # fmt: skip
    return out


def hf_entries(config: BartConfig, prefix: str = HF_PREFIX) -> list:
    """Hugging Face's BART parameter names (modeling_bart.py) onto BartModel's variables.

    final_logits_bias is (1, V) there; positions keep fairseq's offset rows in both."""
    from modeling.checkpoints import Entry, _copy, _hf_linear_entries, _hf_norm_entries

    c, h = config, config.d_model
    rows = c.max_position_embeddings + POSITION_OFFSET
    out = [
        _copy("shared", f"{prefix}shared.weight", (c.vocab_size, h)),
        Entry("final_logits_bias", ("final_logits_bias",), ((1, c.vocab_size),),
              lambda a: a[0][0], lambda x: [x[None]]),
    ]  # fmt: skip
    for side, n_layers, ffn in (
        ("encoder", c.encoder_layers, c.encoder_ffn_dim),
        ("decoder", c.decoder_layers, c.decoder_ffn_dim),
    ):
        heads = getattr(c, f"{side}_attention_heads")
        scope = f"{prefix}{side}"
        out.append(_copy(f"{side}_embed_positions", f"{scope}.embed_positions.weight", (rows, h)))
        out += _hf_norm_entries(f"{side}_layernorm_embedding", f"{scope}.layernorm_embedding", h)
        for i in range(n_layers):
            dst, src = f"{side}_{i}", f"{scope}.layers.{i}"
            attentions = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            for a in attentions:
                out += _hf_attention_entries(f"{dst}/{a}", f"{src}.{a}", h, heads)
                out += _hf_norm_entries(f"{dst}/{a}_layer_norm", f"{src}.{a}_layer_norm", h)
            out += _hf_linear_entries(f"{dst}/ffn/fc1", f"{src}.fc1", h, ffn)
            out += _hf_linear_entries(f"{dst}/ffn/fc2", f"{src}.fc2", ffn, h)
            out += _hf_norm_entries(f"{dst}/final_layer_norm", f"{src}.final_layer_norm", h)
    return out


def hf_config(config: BartConfig) -> dict:
    """The config.json transformers writes for a BartForConditionalGeneration of this config
    (HF_FIXED's values, num_hidden_layers = encoder_layers as BartConfig sets it)."""
    values = {k: v for k, v in config.to_dict().items()}
    return {
        **values,
        **HF_FIXED,
        "architectures": ["BartForConditionalGeneration"],
        "num_hidden_layers": config.encoder_layers,
        "tie_word_embeddings": True,
    }


def load_hf(weights, config: BartConfig, config_where: str = "config.json", skip=None,
            trust_pickle: bool = False):  # fmt: skip
    """Hugging Face BART weights (folder, file or shard index of a BartForConditionalGeneration
    or BartModel) -> (BartModel, checkpoints.ConversionReport). The tied copies of `shared`
    (encoder / decoder embed_tokens, lm_head) are checked equal and not converted; a missing
    final_logits_bias (a bare BartModel) is zeros, as transformers makes it."""
    from modeling import checkpoints

    source = checkpoints._hf_source(weights, trust_pickle)
    prefix = checkpoints._prefix_of(source.shapes, HF_PREFIX)
    shared = f"{prefix}shared.weight"
    tied = {f"{prefix}{s}.embed_tokens.weight": shared for s in ("encoder", "decoder")}
    tied["lm_head.weight"] = shared
    if "final_logits_bias" not in source.shapes:
        shape = (1, config.vocab_size)
        source = checkpoints.with_array(source, "final_logits_bias", shape,
                                        lambda: np.zeros(shape, np.float32))  # fmt: skip
    model = BartModel(config)
    model.build()
    where = (
        f"{config_where} (BART: {config.encoder_layers} + {config.decoder_layers} layers, "
        f"d_model={config.d_model}, vocab_size={config.vocab_size})"
    )
    # The LM head (tied to `shared`, plus final_logits_bias) is BART's pre-training head.
    report = checkpoints.convert_into(
        model, hf_entries(config, prefix), source, where,
        checkpoints._hf_ignore(tied, source), skip, heads=True,
    )  # fmt: skip
    return model, report


def save_hf(model: BartModel, output_dir) -> list:
    """Writes model.safetensors and config.json as transformers' save_pretrained does for a
    BartForConditionalGeneration: `model.`-prefixed names, the tied embed_tokens / lm_head
    left out (transformers ties them on load), final_logits_bias (1, V)."""
    from modeling import checkpoints

    arrays = checkpoints.export_arrays(model, hf_entries(model.config))
    return checkpoints.write_hf_files(output_dir, arrays, hf_config(model.config))
