"""T5 (Raffel et al. 2020): the encoder-decoder Transformer with relative position biases.

Read top to bottom: `T5Config` (the field names of T5's published config.json), `relative_bucket`
(the bucketing of key-minus-query distances, sec. 2.1), `T5Attention` (no biases, no 1/sqrt(d)
scaling: T5 folds it into the initialisation), `T5Block` (pre-norm residual sub-blocks with RMS
LayerNorm), `T5Model` (shared embedding, encoder, decoder, tied output; `decoder_cache` and
`decode(..., cache=, cache_index=)` for incremental decoding), and the decoding helpers
`greedy_decode` and `beam_search`, which keep each decoder layer's keys and values between steps.
The relative bias is computed by each stack's first layer and shared by the others, as in T5.
Shapes: B batch, T target (decoder) length, S source (encoder) length, Q query length, K key
length, H d_model, N heads, D d_kv, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import keras
import numpy as np
from keras import ops

from modeling import bert, heads, layers

FEED_FORWARD = ("relu", "gated-relu", "gated-gelu")


def is_t5_config(values: dict) -> bool:
    """Whether a config dict is a T5 one (its config.json names vocab_size with d_model / d_kv)
    rather than a BERT-family, GPT or XLNet one (XLNet's d_model comes with n_token) or a BART one
    (d_model with encoder_layers / encoder_attention_heads: modeling/bart.py)."""
    from modeling import bart

    return (
        isinstance(values, dict)
        and "vocab_size" in values
        and ("d_model" in values or "d_kv" in values)
        and not bart.is_bart_config(values)
    )


@dataclasses.dataclass(frozen=True)
class T5Config(bert.JsonConfig):
    """T5 hyper-parameters under the names of its published config.json.

    feed_forward_proj "relu" is the original T5 (relu(x wi) wo); "gated-gelu" is T5 v1.1 (gelu(x
    wi_0) * (x wi_1), then wo; gelu's tanh approximation). num_decoder_layers None = num_layers.
    """

    vocab_size: int
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    num_decoder_layers: int | None = None
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    initializer_factor: float = 1.0
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0

    # bert.config_from_dict requires every field not in OPTIONAL: set below the class.
    OPTIONAL: ClassVar[frozenset] = frozenset()
    FAMILY: ClassVar[str] = "T5"
    FILE_KIND: ClassVar[str] = "a T5 config file"

    def __post_init__(self):
        if self.feed_forward_proj not in FEED_FORWARD:
            raise ValueError(
                f"T5Config.feed_forward_proj: expected one of {FEED_FORWARD}, "
                f"found {self.feed_forward_proj!r}"
            )
        for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"T5Config.{name}: expected a positive integer, found {value!r}")

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers


# Only vocab_size must be given; every other field has its default.
T5Config.OPTIONAL = frozenset(f.name for f in dataclasses.fields(T5Config)) - {"vocab_size"}


def relative_bucket(relative_position, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucket of each key-minus-query distance (int tensor): half the buckets exact for
    small distances, the rest logarithmic up to max_distance; bidirectional (the encoder) uses
    separate halves for keys after and before the query, unidirectional (the decoder) only
    looks back."""
    buckets = 0
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets += ops.cast(relative_position > 0, "int32") * n
        distance = ops.abs(relative_position)
    else:
        distance = -ops.minimum(relative_position, 0)
    exact = n // 2
    is_small = distance < exact
    log_ratio = ops.log(ops.maximum(ops.cast(distance, "float32"), 1.0) / exact)
    large = exact + ops.cast(log_ratio / math.log(max_distance / exact) * (n - exact), "int32")
    large = ops.minimum(large, n - 1)
    return buckets + ops.where(is_small, distance, large)


class _Dense(keras.layers.Layer):
    """A bias-free projection `x @ kernel` (T5 has no biases), normal(0, stddev) initialised."""

    def __init__(self, units, stddev, **kwargs):
        super().__init__(**kwargs)
        self.units, self.stddev = units, stddev

    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel",
            shape=(input_shape[-1], self.units),
            initializer=keras.initializers.RandomNormal(stddev=self.stddev),
        )

    def call(self, x):
        return ops.matmul(x, self.kernel)


class T5LayerNorm(keras.layers.Layer):
    """RMS normalisation with a learned scale and no mean subtraction or bias (T5 sec. 2.1)."""

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.weight = self.add_weight(name="weight", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        x = ops.cast(x, "float32")
        variance = ops.mean(ops.square(x), axis=-1, keepdims=True)
        # In float32, then the compute dtype (Hugging Face's T5LayerNorm): under a mixed policy
        # x arrives in bfloat16, and TensorFlow refused bfloat16 * float32 (until the
        # thirty-seventh session a T5 step under mixed_bfloat16 failed there; JAX promoted).
        x = ops.cast(x * ops.rsqrt(variance + self.epsilon), self.compute_dtype)
        return self.weight * x


class T5Attention(keras.layers.Layer):
    """Multi-head attention without biases or score scaling; the first layer of each stack also
    owns the relative-position bias table.

    call(x, kv, attention_mask, position_bias, cache, cache_index, training): x float (B, Q, H);
    kv float (B, K, H) or None (self-attention); attention_mask bool (B, 1, Q, K) or
    (B, 1, 1, K); position_bias float (1, N, Q, K) or None (computed here when this layer owns
    the table, else zeros).
    cache: None, or [keys, values], each float (B, N, K, D). With cache_index (an int or int
    scalar tensor) x's positions start there, and their keys and values are written into the
    cache at that index (decoder self-attention; K is the cache's fixed length, later entries
    are masked by the caller). Without it the cache holds the keys and values to attend
    (cross-attention over an encoder output, from `key_value_cache`); see layers.write_cache.
    Returns (float (B, Q, H), the position bias it used, for the next layers, and the cache or
    None).
    """

    def __init__(self, config: T5Config, has_bias: bool, bidirectional: bool, **kwargs):
        super().__init__(**kwargs)
        c = config
        self.config, self.has_bias, self.bidirectional = c, has_bias, bidirectional
        inner = c.num_heads * c.d_kv
        f = c.initializer_factor
        # T5's initialisation (mesh_tensorflow): the query absorbs the 1/sqrt(d_kv) scaling.
        self.q = _Dense(inner, f * (c.d_model * c.d_kv) ** -0.5, name="q")
        self.k = _Dense(inner, f * c.d_model**-0.5, name="k")
        self.v = _Dense(inner, f * c.d_model**-0.5, name="v")
        self.o = _Dense(c.d_model, f * inner**-0.5, name="o")
        self.dropout = layers.Dropout(c.dropout_rate)

    def build(self, input_shape):
        c = self.config
        for dense in (self.q, self.k, self.v):
            dense.build(input_shape)
        self.o.build((*input_shape[:-1], c.num_heads * c.d_kv))
        if self.has_bias:
            self.relative_attention_bias = self.add_weight(
                name="relative_attention_bias",
                shape=(c.relative_attention_num_buckets, c.num_heads),
                initializer=keras.initializers.RandomNormal(
                    stddev=c.initializer_factor * c.d_model**-0.5
                ),
                autocast=False,  # Q x K lookups of a few rows: summed in float32 (lookup_rows)
            )

    def compute_bias(self, q_len, k_len, query_offset=0):
        """float (1, N, Q, K): the bias of keys 0 .. K-1 for queries at query_offset + 0 .. Q-1."""
        c = self.config
        queries = ops.arange(q_len) + query_offset  # (Q,)
        relative = ops.arange(k_len)[None, :] - queries[:, None]  # (Q, K)
        buckets = relative_bucket(
            relative,
            self.bidirectional,
            c.relative_attention_num_buckets,
            c.relative_attention_max_distance,
        )
        bias = layers.lookup_rows(self.relative_attention_bias, buckets, self.compute_dtype)
        return ops.transpose(bias, (2, 0, 1))[None]  # (1, N, Q, K)

    def _heads(self, t):
        c = self.config
        return ops.reshape(t, (ops.shape(t)[0], -1, c.num_heads, c.d_kv))  # (B, L, N, D)

    def key_value_cache(self, source):
        """[keys, values], each float (B, N, K, D), of source float (B, K, H), computed once for
        `call(..., cache=)` (cross-attention while decoding)."""
        return [
            layers.heads_first(self._heads(self.k(source))),
            layers.heads_first(self._heads(self.v(source))),
        ]

    def call(
        self,
        x,
        kv=None,
        attention_mask=None,
        position_bias=None,
        cache=None,
        cache_index=None,
        training=False,
    ):
        c = self.config
        b, q_len = ops.shape(x)[0], ops.shape(x)[1]
        q = self._heads(self.q(x))
        if cache is None:
            source = x if kv is None else kv
            k, v = self._heads(self.k(source)), self._heads(self.v(source))  # (B, K, N, D)
            keys = "bknd"
        else:
            if cache_index is not None:
                new_k, new_v = self._heads(self.k(x)), self._heads(self.v(x))
                cache = layers.write_cache(cache, cache_index, new_k, new_v)
            k, v = cache  # (B, N, K, D)
            keys = "bnkd"
        k_len = ops.shape(k)[keys.index("k")]
        scores = ops.einsum(f"bqnd,{keys}->bnqk", q, k)  # (B, N, Q, K), unscaled as T5
        if position_bias is None:
            if self.has_bias:
                offset = 0 if cache_index is None else cache_index
                position_bias = self.compute_bias(q_len, k_len, offset)
            else:
                position_bias = ops.zeros((1, c.num_heads, q_len, k_len), scores.dtype)
        # Masked in float32, where the softmax runs: -1e9 is past float16's range.
        scores = ops.cast(scores + ops.cast(position_bias, scores.dtype), "float32")
        if attention_mask is not None:
            scores = ops.where(attention_mask, scores, -1e9)
        probs = self.dropout(ops.softmax(scores, axis=-1), training=training)
        context = ops.einsum(f"bnqk,{keys}->bqnd", ops.cast(probs, v.dtype), v)  # (B, Q, N, D)
        context = ops.reshape(context, (b, q_len, c.num_heads * c.d_kv))
        return self.o(context), position_bias, cache


class T5Block(keras.layers.Layer):
    """One encoder (self-attention, feed-forward) or decoder (causal self-attention,
    cross-attention, feed-forward) block; each sub-block is x + dropout(f(norm(x))).

    call(x, attention_mask, position_bias, encoder_output, encoder_mask, self_cache,
    cross_cache, cache_index, training) returns (float (B, T, H), the position bias, the
    updated self_cache or None); the caches are T5Attention's (decoding only)."""

    def __init__(self, config: T5Config, is_decoder: bool, has_bias: bool, **kwargs):
        super().__init__(**kwargs)
        c = config
        self.config, self.is_decoder = c, is_decoder
        eps = c.layer_norm_epsilon
        self.self_attention = T5Attention(c, has_bias, not is_decoder, name="self_attention")
        self.self_norm = T5LayerNorm(eps, name="self_norm")
        if is_decoder:
            self.cross_attention = T5Attention(c, False, True, name="cross_attention")
            self.cross_norm = T5LayerNorm(eps, name="cross_norm")
        f = c.initializer_factor
        self.wi = _Dense(c.d_ff, f * c.d_model**-0.5, name="wi")
        self.gated = c.feed_forward_proj.startswith("gated")
        if self.gated:
            self.wi_1 = _Dense(c.d_ff, f * c.d_model**-0.5, name="wi_1")
        self.wo = _Dense(c.d_model, f * c.d_ff**-0.5, name="wo")
        self.ff_norm = T5LayerNorm(eps, name="ff_norm")
        self.dropout = layers.Dropout(c.dropout_rate)

    def build(self, input_shape):
        c = self.config
        self.self_attention.build(input_shape)
        self.self_norm.build(input_shape)
        if self.is_decoder:
            self.cross_attention.build(input_shape)
            self.cross_norm.build(input_shape)
        self.wi.build(input_shape)
        if self.gated:
            self.wi_1.build(input_shape)
        self.wo.build((*input_shape[:-1], c.d_ff))
        self.ff_norm.build(input_shape)

    def _act(self, h):
        if self.config.feed_forward_proj == "gated-gelu":
            return keras.activations.gelu(h, approximate=True)
        return ops.relu(h)

    def call(
        self,
        x,
        attention_mask=None,
        position_bias=None,
        encoder_output=None,
        encoder_mask=None,
        self_cache=None,
        cross_cache=None,
        cache_index=None,
        training=False,
    ):
        a, position_bias, self_cache = self.self_attention(
            self.self_norm(x),
            attention_mask=attention_mask,
            position_bias=position_bias,
            cache=self_cache,
            cache_index=cache_index,
            training=training,
        )
        x = x + self.dropout(a, training=training)
        if self.is_decoder:
            a, _, _ = self.cross_attention(
                self.cross_norm(x),
                kv=encoder_output,
                attention_mask=encoder_mask,
                cache=cross_cache,
                training=training,
            )
            x = x + self.dropout(a, training=training)
        h = self.ff_norm(x)
        inner = self._act(self.wi(h))
        if self.gated:
            inner = inner * self.wi_1(h)
        h = self.wo(self.dropout(inner, training=training))
        return x + self.dropout(h, training=training), position_bias, self_cache


@keras.saving.register_keras_serializable(package="cloze")
class T5Model(keras.Model):
    """The whole encoder-decoder with its language-model output.

    call(inputs, training) with int (B, S) `input_ids`, `input_mask` (encoder side) and int
    (B, T) `decoder_input_ids` (the targets shifted right, starting with decoder_start_token_id)
    and optionally `decoder_mask`. Returns a dict: encoder_output float (B, S, H),
    decoder_output float (B, T, H), lm_logits float32 (B, T, V). call(inputs, training,
    lm_terms=True) with int (B, T) `target_ids` in inputs: lm_xent and lm_hits float32 (B, T)
    instead of lm_logits (encoder_decoder_outputs).
    """

    def __init__(self, config: T5Config | dict, **kwargs):
        super().__init__(**kwargs)
        c = T5Config.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        # One attribute per block: tf.train.Checkpoint does not follow Keras' TrackedList.
        for i in range(c.num_layers):
            setattr(self, f"encoder_{i}", T5Block(c, False, i == 0, name=f"encoder_{i}"))
        for i in range(c.decoder_layers):
            setattr(self, f"decoder_{i}", T5Block(c, True, i == 0, name=f"decoder_{i}"))
        self.encoder_norm = T5LayerNorm(c.layer_norm_epsilon, name="encoder_norm")
        self.decoder_norm = T5LayerNorm(c.layer_norm_epsilon, name="decoder_norm")
        self.dropout = layers.Dropout(c.dropout_rate)

    def blocks(self, decoder: bool) -> list:
        c = self.config
        n = c.decoder_layers if decoder else c.num_layers
        return [getattr(self, f"{'decoder' if decoder else 'encoder'}_{i}") for i in range(n)]

    def build(self, input_shape=None):
        c = self.config
        self.shared = self.add_weight(
            name="shared",
            shape=(c.vocab_size, c.d_model),
            initializer=keras.initializers.RandomNormal(stddev=c.initializer_factor),
            autocast=False,  # read as float32 under a mixed policy (layers.lookup_rows)
        )
        if not c.tie_word_embeddings:
            self.lm_head = self.add_weight(
                name="lm_head",
                shape=(c.vocab_size, c.d_model),
                initializer=keras.initializers.RandomNormal(stddev=c.initializer_factor),
            )
        shape = (None, None, c.d_model)
        for block in self.blocks(False) + self.blocks(True):
            block.build(shape)
        self.encoder_norm.build(shape)
        self.decoder_norm.build(shape)
        self.built = True

    def encode(self, input_ids, input_mask, training=False):
        """float (B, S, H) encoder states."""
        x = layers.lookup_rows(self.shared, input_ids, self.compute_dtype)
        x = self.dropout(x, training=training)
        mask = ops.cast(input_mask, "bool")[:, None, None, :]  # (B, 1, 1, S)
        bias = None
        for block in self.blocks(False):
            x, bias, _ = block(x, attention_mask=mask, position_bias=bias, training=training)
        return self.dropout(self.encoder_norm(x), training=training)

    def decoder_cache(self, encoder_output, max_length: int) -> dict:
        """The caches for decoding up to max_length positions over encoder_output (B, S, H):
        "self", zero keys and values, float (B, N, max_length, D) each, per decoder block, and
        "cross", each block's cross-attention keys and values of the encoder output, float
        (B, N, S, D) each (T5Attention's cache)."""
        c = self.config
        b = ops.shape(encoder_output)[0]
        zeros = ops.zeros((b, c.num_heads, max_length, c.d_kv), encoder_output.dtype)
        blocks = self.blocks(True)
        return {
            "self": [[zeros, zeros] for _ in blocks],
            "cross": [blk.cross_attention.key_value_cache(encoder_output) for blk in blocks],
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
        with_logits: a loss then reads the states through output_xent_and_hits).

        With cache (from `decoder_cache`) and cache_index, decoder_input_ids are the positions
        cache_index .. cache_index + T - 1 after those already cached, and the updated cache
        comes third: (states, logits, cache). Each step then costs one position, not the whole
        prefix, with the same logits (tested). The cache holds the encoder output's keys and
        values, so encoder_output may then be None."""
        t = ops.shape(decoder_input_ids)[1]
        x = layers.lookup_rows(self.shared, decoder_input_ids, self.compute_dtype)
        x = self.dropout(x, training=training)
        queries = ops.arange(t) + (0 if cache is None else cache_index)  # (T,)
        keys = ops.arange(t if cache is None else ops.shape(cache["self"][0][0])[2])
        mask = (keys[None, :] <= queries[:, None])[None, None]  # (1, 1, T, K) at or before
        if decoder_mask is not None:
            mask = ops.logical_and(mask, ops.cast(decoder_mask, "bool")[:, None, None, :])
        encoder_mask = ops.cast(input_mask, "bool")[:, None, None, :]  # (B, 1, 1, S)
        bias, new_self = None, []
        for i, block in enumerate(self.blocks(True)):
            x, bias, layer_cache = block(
                x,
                attention_mask=mask,
                position_bias=bias,
                encoder_output=encoder_output,
                encoder_mask=encoder_mask,
                self_cache=None if cache is None else cache["self"][i],
                cross_cache=None if cache is None else cache["cross"][i],
                cache_index=cache_index,
                training=training,
            )
            new_self.append(layer_cache)
        x = self.dropout(self.decoder_norm(x), training=training)
        logits = self.output_logits(x) if with_logits else None
        if cache is not None:
            return x, logits, {"self": new_self, "cross": cache["cross"]}
        return x, logits

    def _projection(self, x):
        """The output projection's rows and (V, H) table for decoder states x (B, T, H)."""
        if self.config.tie_word_embeddings:
            # Tied output embedding: T5 rescales by d_model^-0.5 first (mesh_tensorflow).
            return x * self.config.d_model**-0.5, ops.cast(self.shared, x.dtype)
        return x, ops.cast(self.lm_head, x.dtype)

    def output_logits(self, x):
        """float32 (B, T, V) logits of decoder states float (B, T, H)."""
        rows, table = self._projection(x)
        return ops.cast(ops.einsum("bth,vh->btv", rows, table), "float32")

    def output_xent_and_hits(self, x, labels):
        """float32 (B, T) cross-entropy and argmax hits of output_logits(x) against int (B, T)
        labels, without the logits (heads.tied_xent_and_hits: vocabulary-major)."""
        rows, table = self._projection(x)
        return heads.tied_xent_and_hits(rows, table, None, labels)

    def call(self, inputs, training=False, lm_terms=False):
        return encoder_decoder_outputs(self, inputs, training, lm_terms)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def encoder_decoder_outputs(model, inputs: dict, training=False, lm_terms=False) -> dict:
    """The `call` of an encoder-decoder with encode / decode (T5Model, bart.BartModel): the
    encoder once, then the teacher-forced decoder over it. Returns encoder_output,
    decoder_output and lm_logits float32 (B, T, V); with lm_terms (training), lm_xent and
    lm_hits float32 (B, T) against inputs' target_ids instead of lm_logits: the loss terms
    without the logits (output_xent_and_hits; the vocabulary projection at every target is
    most of a small model's step)."""
    enc = model.encode(inputs["input_ids"], inputs["input_mask"], training=training)
    dec, logits = model.decode(
        inputs["decoder_input_ids"],
        enc,
        inputs["input_mask"],
        inputs.get("decoder_mask"),
        training=training,
        with_logits=not lm_terms,
    )
    out = {"encoder_output": enc, "decoder_output": dec}
    if lm_terms:
        out["lm_xent"], out["lm_hits"] = model.output_xent_and_hits(dec, inputs["target_ids"])
    else:
        out["lm_logits"] = logits
    return out


def to_keras_hub(model: T5Model):
    """A keras_hub.models.T5Backbone holding model's weights, variable for variable (its
    T5Seq2SeqLM then generates with them: the peer of bench/generation.py, and tests/test_t5.py's
    independent implementation). keras-hub's gated GELU is the exact one, T5's the tanh
    approximation, so "gated-gelu" is refused."""
    import keras_hub

    c = model.config
    fixed = (c.relative_attention_num_buckets, c.relative_attention_max_distance) == (32, 128)
    if (
        c.feed_forward_proj == "gated-gelu"
        or not c.tie_word_embeddings
        or c.decoder_layers != c.num_layers
        or not fixed
    ):
        raise ValueError(
            "to_keras_hub: keras-hub's T5Backbone has relu or gated-relu feed-forwards, a tied "
            "output, as many decoder as encoder layers and 32 relative buckets up to 128; found "
            f"feed_forward_proj={c.feed_forward_proj!r}, "
            f"tie_word_embeddings={c.tie_word_embeddings}, {c.num_layers} + {c.decoder_layers} "
            f"layers, {c.relative_attention_num_buckets} buckets up to "
            f"{c.relative_attention_max_distance}"
        )
    ref = keras_hub.models.T5Backbone(
        vocabulary_size=c.vocab_size,
        num_layers=c.num_layers,
        num_heads=c.num_heads,
        hidden_dim=c.d_model,
        intermediate_dim=c.d_ff,
        key_value_dim=c.d_kv,
        dropout=0.0,
        activation="relu",
        use_gated_activation=c.feed_forward_proj == "gated-relu",
        layer_norm_epsilon=c.layer_norm_epsilon,
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
            if block.gated:
                layer.gate_projector.kernel.assign(block.wi_1.kernel)
            layer.output_projector.kernel.assign(block.wo.kernel)
    ref.get_layer("encoder_output_layer_norm").weight.assign(model.encoder_norm.weight)
    ref.get_layer("decoder_output_layer_norm").weight.assign(model.decoder_norm.weight)
    return ref


# ---------------------------------------------------------------------------------------------
# Hugging Face's files (T5ForConditionalGeneration / T5Model safetensors)
# ---------------------------------------------------------------------------------------------

# Keys of Hugging Face's T5 config.json that change the computation, with the one value Cloze's
# T5 has (umT5 and LongT5 differ in more than these and have their own model_type).
HF_FIXED = {"model_type": "t5", "is_encoder_decoder": True, "is_decoder": False}
# Keys that do not change what T5Model computes: generation settings, the legacy n_positions,
# and dense_act_fn / is_gated_act, which transformers derives from feed_forward_proj (checked
# equal to what it derives). scale_decoder_outputs is read below.
HF_IGNORED = frozenset(
    "n_positions output_past dense_act_fn is_gated_act scale_decoder_outputs".split()
)
# feed_forward_proj -> transformers' derived dense_act_fn ("gelu_new": the tanh approximation).
HF_ACTIVATIONS = {"relu": "relu", "gated-relu": "relu", "gated-gelu": "gelu_new"}


def config_from_hf(values: dict, source: str = "config.json") -> T5Config:
    """A Hugging Face T5 `config.json` as published (t5-small's, a T5 v1.1's, FLAN-T5's) ->
    T5Config (the same names). HF_FIXED's keys must have their value; the keys of HF_IGNORED
    and modeling/checkpoints.py's _HF_IGNORED are dropped; any other unknown key is an error
    naming `source`, as is a feed_forward_proj Cloze does not compute."""
    from data_prep.errors import input_error
    from modeling import checkpoints

    checkpoints.check_hf_fixed(values, HF_FIXED, source, "T5")
    ff = values.get("feed_forward_proj", "relu")
    if ff not in HF_ACTIVATIONS:
        raise input_error(
            f"{source}: feed_forward_proj", f"one of {list(HF_ACTIVATIONS)}", repr(ff)
        )
    derived = {"dense_act_fn": HF_ACTIVATIONS[ff], "is_gated_act": ff.startswith("gated")}
    for key, want in derived.items():
        if values.get(key, want) != want:
            where = f"{source}: {key}"
            raise input_error(where, f"{want!r} (feed_forward_proj {ff!r})", repr(values[key]))
    own = {f.name for f in dataclasses.fields(T5Config)}
    known = own | set(HF_FIXED) | HF_IGNORED | checkpoints._HF_IGNORED
    unknown = sorted(set(values) - known)
    if unknown:
        raise input_error(source, "the keys of a Hugging Face T5 config", f"{unknown}")
    kept = {k: v for k, v in values.items() if k in own}
    # The published configs say tie_word_embeddings false for T5 v1.1's own, unscaled lm_head;
    # transformers 5 writes true always and says it with scale_decoder_outputs false instead.
    if "scale_decoder_outputs" in values:
        kept["tie_word_embeddings"] = bool(values["scale_decoder_outputs"])
    return T5Config.from_dict(kept, source)


def hf_config(config: T5Config) -> dict:
    """The config.json transformers writes for a T5ForConditionalGeneration of this config."""
    return {
        **config.to_dict(),
        **HF_FIXED,
        "architectures": ["T5ForConditionalGeneration"],
        "dense_act_fn": HF_ACTIVATIONS[config.feed_forward_proj],
        "is_gated_act": config.feed_forward_proj.startswith("gated"),
    }


def hf_entries(config: T5Config) -> list:
    """Hugging Face's T5 parameter names (modeling_t5.py) onto T5Model's variables (paths below
    the model). Every nn.Linear weight is (out, in), transposed; a gated feed-forward's wi_0 is
    Cloze's activated wi; relative_attention_bias (buckets, N) is the first block's of each
    stack in both; lm_head (V, H) only when untied."""
    from modeling.checkpoints import _copy, _transposed

    c = config
    h, inner = c.d_model, c.num_heads * c.d_kv
    out = [_copy("shared", "shared.weight", (c.vocab_size, h))]
    if not c.tie_word_embeddings:
        out.append(_copy("lm_head", "lm_head.weight", (c.vocab_size, h)))

    def attention(dst, src, has_bias):
        parts = [_transposed(f"{dst}/{w}/kernel", f"{src}.{w}.weight", (inner, h)) for w in "qkv"]
        parts.append(_transposed(f"{dst}/o/kernel", f"{src}.o.weight", (h, inner)))
        if has_bias:
            shape = (c.relative_attention_num_buckets, c.num_heads)
            bias = f"{src}.relative_attention_bias.weight"
            parts.append(_copy(f"{dst}/relative_attention_bias", bias, shape))
        return parts

    for side, n in (("encoder", c.num_layers), ("decoder", c.decoder_layers)):
        for i in range(n):
            dst, src = f"{side}_{i}", f"{side}.block.{i}.layer"
            out += attention(f"{dst}/self_attention", f"{src}.0.SelfAttention", i == 0)
            out.append(_copy(f"{dst}/self_norm/weight", f"{src}.0.layer_norm.weight", (h,)))
            ff = 1
            if side == "decoder":
                out += attention(f"{dst}/cross_attention", f"{src}.1.EncDecAttention", False)
                out.append(_copy(f"{dst}/cross_norm/weight", f"{src}.1.layer_norm.weight", (h,)))
                ff = 2
            dense = f"{src}.{ff}.DenseReluDense"
            if c.feed_forward_proj.startswith("gated"):
                out.append(_transposed(f"{dst}/wi/kernel", f"{dense}.wi_0.weight", (c.d_ff, h)))
                out.append(_transposed(f"{dst}/wi_1/kernel", f"{dense}.wi_1.weight", (c.d_ff, h)))
            else:
                out.append(_transposed(f"{dst}/wi/kernel", f"{dense}.wi.weight", (c.d_ff, h)))
            out.append(_transposed(f"{dst}/wo/kernel", f"{dense}.wo.weight", (h, c.d_ff)))
            out.append(_copy(f"{dst}/ff_norm/weight", f"{src}.{ff}.layer_norm.weight", (h,)))
        out.append(_copy(f"{side}_norm/weight", f"{side}.final_layer_norm.weight", (h,)))
    return out


def load_hf(weights, config: T5Config, config_where: str = "config.json", skip=None,
            trust_pickle: bool = False):  # fmt: skip
    """Hugging Face T5 weights (folder, file or shard index of a T5ForConditionalGeneration or
    T5Model) -> (T5Model, checkpoints.ConversionReport). The copies of `shared` (encoder /
    decoder embed_tokens, and lm_head when the config ties it) are checked equal and not
    converted. An untied config without lm_head.weight (transformers 5 leaves out a v1.1's head
    equal to `shared`) takes `shared` as its lm_head."""
    from modeling import checkpoints

    source = checkpoints._hf_source(weights, trust_pickle)
    if not config.tie_word_embeddings and "lm_head.weight" not in source.shapes:
        shared = source
        source = checkpoints.with_array(shared, "lm_head.weight", shared.shapes["shared.weight"],
                                        lambda: shared.read("shared.weight"))  # fmt: skip
    tied = {f"{side}.embed_tokens.weight": "shared.weight" for side in ("encoder", "decoder")}
    if config.tie_word_embeddings:
        tied["lm_head.weight"] = "shared.weight"
    model = T5Model(config)
    model.build()
    where = (
        f"{config_where} (T5: {config.num_layers} + {config.decoder_layers} layers, "
        f"d_model={config.d_model}, {config.feed_forward_proj})"
    )
    report = checkpoints.convert_into(
        model, hf_entries(config), source, where, checkpoints._hf_ignore(tied, source), skip,
        heads=True,
    )  # fmt: skip
    return model, report


def save_hf(model: T5Model, output_dir) -> list:
    """Writes model.safetensors and config.json as transformers' save_pretrained does for a
    T5ForConditionalGeneration (the tied embed_tokens and lm_head left out: transformers ties
    them on load)."""
    from modeling import checkpoints

    arrays = checkpoints.export_arrays(model, hf_entries(model.config))
    return checkpoints.write_hf_files(output_dir, arrays, hf_config(model.config))


def save_keras_hub(model: T5Model, output_dir, vocab_dir) -> list:
    """A keras-hub preset of a T5 (to_keras_hub's backbone and a T5Tokenizer of the
    spiece.model in vocab_dir): `keras_hub.models.T5Backbone.from_preset(output_dir)` and
    `T5Tokenizer.from_preset` load it offline. Raises ValueError for a model keras-hub's
    T5Backbone cannot compute or a folder without its SentencePiece model."""
    from pathlib import Path

    import keras_hub

    from data_prep import spiece

    backbone = to_keras_hub(model)  # first: it refuses what keras-hub's T5 cannot compute
    proto = spiece.model_file(vocab_dir) if vocab_dir else None
    if proto is None:
        raise ValueError("a keras-hub preset needs the model's spiece.model beside it")
    backbone.save_to_preset(str(output_dir))
    keras_hub.models.T5Tokenizer(proto=str(proto)).save_to_preset(str(output_dir))
    return sorted(str(p) for p in Path(output_dir).rglob("*") if p.is_file())


def shift_right(targets: np.ndarray, start_id: int) -> np.ndarray:
    """Decoder inputs for teacher forcing: the targets moved one to the right after start_id."""
    targets = np.asarray(targets)
    start = np.full((targets.shape[0], 1), start_id, targets.dtype)
    return np.concatenate([start, targets[:, :-1]], axis=1)


# The decoders below serve any encoder-decoder with T5Model's interface: encode(ids, mask) ->
# (B, S, H), decoder_cache(encoder_output, max_length), decode(prefix, encoder_output, mask,
# cache=, cache_index=) -> (states, logits (B, T, V)[, cache]) and a config with
# decoder_start_token_id, eos_token_id and pad_token_id (T5Model, bart.BartModel). With
# use_cache (the default) each step runs the decoder on one new position against the cached keys
# and values; without it, on the whole prefix again (the reference the cache is tested against).


def reorder_cache(cache: dict, rows, parts=("self", "cross")) -> dict:
    """The cache of the rows `rows` (int (B',)), in that order, for the `parts` named (the
    others as they are): beam search's surviving hypotheses take their parents' keys and
    values."""
    return {
        part: keras.tree.map_structure(lambda t: ops.take(t, rows, axis=0), tensors)
        if part in parts
        else tensors
        for part, tensors in cache.items()
    }


def _start(model, input_ids, input_mask, max_length: int):
    """(encoder output, decoder cache for max_length positions), compiled."""

    def start(ids, mask, length):
        enc = model.encode(ids, mask)
        return enc, model.decoder_cache(enc, length)

    return layers.compiled_for_decoding(model, "start", start)(input_ids, input_mask, max_length)


def _cached_step(model):
    """model's one-position decoder step against its cache, compiled: (tokens int (B, 1),
    mask int (B, S), cache, index int32 scalar, rows int (B,) or None) -> (float32 (B, V)
    logits, cache); with rows the self-attention cache is first reordered to those rows (beam
    search: rows stay within their source, whose rows all hold its cross-attention cache, so
    that one is left as it is). The encoder output is in the cache."""

    def step(tokens, mask, cache, index, rows):
        if rows is not None:
            cache = reorder_cache(cache, rows, parts=("self",))
        _, logits, cache = model.decode(tokens, None, mask, cache=cache, cache_index=index)
        return logits[:, -1], cache

    return layers.compiled_for_decoding(model, "step", step)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def greedy_decode(
    model, input_ids, input_mask, max_length: int, use_cache: bool = True
) -> np.ndarray:
    """The most likely token at each step until every row has produced eos_token_id (or
    max_length tokens). Returns int32 (B, <= max_length), padded with pad_token_id after eos."""
    c = model.config
    if use_cache:
        enc, state = _start(model, input_ids, input_mask, max_length)
    else:
        enc, state = model.encode(input_ids, input_mask), None
    b = np.asarray(input_ids).shape[0]
    out = np.full((b, 1), c.decoder_start_token_id, np.int32)
    done = np.zeros(b, bool)
    mask = np.asarray(input_mask)
    for step in range(max_length):
        if use_cache:
            index = ops.convert_to_tensor(step, "int32")
            logits, state = _cached_step(model)(out[:, -1:], mask, state, index, None)
        else:
            logits = model.decode(out, enc, mask)[1][:, -1]
        nxt = np.argmax(np.asarray(logits), axis=-1).astype(np.int32)
        nxt = np.where(done, c.pad_token_id, nxt)
        out = np.concatenate([out, nxt[:, None]], axis=1)
        done |= nxt == c.eos_token_id
        if done.all():
            break
    return out[:, 1:]


class _Beams:
    """One source's beam search state: the live hypotheses (token lists from the decoder start,
    summed log-probabilities), each one's row among the source's cache rows, and the finished
    ones with GNMT's length penalty ((5 + len) / 6) ** alpha applied.

    The search is done when no hypothesis is live, or when num_beams have finished and no live
    one can still beat the worst of the num_beams best finished: a live score can only fall
    with more tokens, so its best is that score over the largest penalty it could reach by
    max_length (tensor2tensor's beam search, which T5 decoded with, stops the same way). Then
    the best finished hypothesis is the result. A search that runs out of steps also ranks its
    live hypotheses, cut at max_length.
    Why not stop at num_beams finished: low-scoring hypotheses that end early fill that count
    while the best one is still live, and a live hypothesis ranked as if it had ended wins on
    the end token's missing log-probability (a trained copy model's beam gave its sequence
    without the end token, where greedy decoding ended it; fifty-fifth session)."""

    def __init__(self, start_id: int, num_beams: int, eos_id: int, alpha: float, max_length: int):
        self.live: list[tuple[list[int], float]] = [([start_id], 0.0)]
        self.parents = [0]
        self.finished: list[tuple[list[int], float]] = []
        self.num_beams, self.eos_id, self.alpha = num_beams, eos_id, alpha
        self.max_length = max_length

    def _penalty(self, tokens: int) -> float:
        return ((5 + tokens) / 6) ** self.alpha

    def _penalised(self, prefix, score):
        return prefix, score / self._penalty(len(prefix) - 1)

    @property
    def done(self) -> bool:
        if not self.live:
            return True
        if len(self.finished) < self.num_beams:
            return False
        kept = sorted((score for _, score in self.finished), reverse=True)[self.num_beams - 1]
        tokens = len(self.live[0][0]) - 1  # every live hypothesis has had the same steps
        # The largest penalty still reachable: at max_length (at the current length if alpha < 0).
        penalty = max(self._penalty(tokens), self._penalty(self.max_length))
        return max(score for _, score in self.live) / penalty <= kept

    def advance(self, logp: np.ndarray) -> None:
        """logp: float (len(live), V) log-probabilities of each live hypothesis' next token."""
        # Each hypothesis' num_beams best tokens: a partition, not a sort of the vocabulary
        # (a sort of 32k scores per row per step was most of a step's time at batch 8).
        k = min(self.num_beams, logp.shape[1])
        top = np.argpartition(-logp, k - 1, axis=1)[:, :k]  # (live, k), unordered
        candidates = []
        for parent, ((prefix, score), row_logp, row_top) in enumerate(zip(self.live, logp, top)):
            for tok in row_top[np.argsort(-row_logp[row_top], kind="stable")]:
                candidates.append((prefix + [int(tok)], score + float(row_logp[tok]), parent))
        candidates.sort(key=lambda x: -x[1])
        self.live, self.parents = [], []
        for prefix, score, parent in candidates:
            if prefix[-1] == self.eos_id:
                self.finished.append(self._penalised(prefix, score))
            else:
                self.live.append((prefix, score))
                self.parents.append(parent)
            if len(self.live) == self.num_beams:
                break

    def best(self) -> list[int]:
        """The best hypothesis' tokens after the decoder start (class docstring)."""
        ranked = list(self.finished)
        if not self.done:  # out of steps: the live ones count, cut at max_length
            ranked += [self._penalised(p, s) for p, s in self.live]
        return max(ranked, key=lambda x: x[1])[0][1:]


def beam_search(
    model,
    input_ids,
    input_mask,
    max_length: int,
    num_beams: int = 4,
    alpha: float = 0.6,
    use_cache: bool = True,
) -> np.ndarray:
    """Beam search with GNMT's length penalty ((5 + len) / 6) ** alpha (Wu et al. 2016).
    Returns the best hypothesis per row, int32 (B, <= max_length), padded.

    With the cache, the whole batch decodes together: every step runs B x num_beams rows (one
    compiled step), source b in rows b * num_beams onwards; while a source has fewer live
    hypotheses (or none: it has finished) its spare rows repeat one, and their logits are
    dropped. Without it, one source at a time runs its whole prefixes (the reference)."""
    c = model.config
    ids, mask = np.asarray(input_ids), np.asarray(input_mask)
    b, k = ids.shape[0], num_beams
    searches = [
        _Beams(c.decoder_start_token_id, k, c.eos_token_id, alpha, max_length) for _ in range(b)
    ]
    if use_cache:
        _, state = _start(model, ids, mask, max_length)  # the encoder output is in the cache
        state = reorder_cache(state, np.repeat(np.arange(b), k))  # k rows per source
        masks = np.repeat(mask, k, axis=0)
        for step in range(max_length):
            rows, tokens = [], []
            for i, search in enumerate(searches):
                live = search.live or [([c.pad_token_id], 0.0)]  # a finished source idles
                parents = search.parents if search.live else [0]
                spare = k - len(live)
                rows += [i * k + p for p in parents + [parents[0]] * spare]
                tokens += [p[-1] for p, _ in live] + [live[0][0][-1]] * spare
            logits, state = _cached_step(model)(
                np.array(tokens, np.int32)[:, None], masks, state,
                ops.convert_to_tensor(step, "int32"), np.array(rows, np.int32),
            )  # fmt: skip
            logp = _log_softmax(np.asarray(logits))  # (B * k, V)
            for i, search in enumerate(searches):
                if not search.done:
                    search.advance(logp[i * k : i * k + len(search.live)])
            if all(search.done for search in searches):
                break
    else:
        for i, search in enumerate(searches):
            enc = model.encode(ids[i : i + 1], mask[i : i + 1])
            for _ in range(max_length):
                n = len(search.live)
                prefixes = np.array([p for p, _ in search.live], np.int32)
                _, logits = model.decode(
                    prefixes, ops.repeat(enc, n, axis=0), np.repeat(mask[i : i + 1], n, axis=0)
                )
                search.advance(_log_softmax(np.asarray(logits[:, -1])))
                if search.done:
                    break
    results = [search.best() for search in searches]
    width = max(len(r) for r in results)
    return np.array([r + [c.pad_token_id] * (width - len(r)) for r in results], np.int32)
