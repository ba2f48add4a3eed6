"""T5 (Raffel et al. 2020): the encoder-decoder Transformer with relative position biases.

Read top to bottom: `T5Config` (the field names of T5's published config.json), `relative_bucket`
(the bucketing of key-minus-query distances, sec. 2.1), `T5Attention` (no biases, no 1/sqrt(d)
scaling: T5 folds it into the initialisation), `T5Block` (pre-norm residual sub-blocks with RMS
LayerNorm), `T5Model` (shared embedding, encoder, decoder, tied output), and the decoding
helpers `greedy_decode` and `beam_search`. The relative bias is computed by each stack's first
layer and shared by the others, as in T5.
Shapes: B batch, T target (decoder) length, S source (encoder) length, Q query length, K key
length, H d_model, N heads, D d_kv, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import ClassVar

import keras
import numpy as np
from keras import ops

from modeling import bert, layers

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
class T5Config:
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

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> T5Config:
        """Builds a config from a dict (vocab_size required, the rest optional); errors name
        `source`."""
        return bert.config_from_dict(cls, values, source, "T5")

    @classmethod
    def from_json_file(cls, path) -> T5Config:
        return cls.from_dict(bert.read_config_json(path, "a T5 config file"), source=str(path))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


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
        variance = ops.mean(ops.square(ops.cast(x, "float32")), axis=-1, keepdims=True)
        x = ops.cast(x * ops.rsqrt(variance + self.epsilon), self.compute_dtype)
        return self.weight * x


class T5Attention(keras.layers.Layer):
    """Multi-head attention without biases or score scaling; the first layer of each stack also
    owns the relative-position bias table.

    call(x, kv, attention_mask, position_bias, training): x float (B, Q, H); kv float (B, K, H)
    or None (self-attention); attention_mask bool (B, 1, Q, K) or (B, 1, 1, K); position_bias
    float (1, N, Q, K) or None (computed here when this layer owns the table, else zeros).
    Returns (float (B, Q, H), the position bias it used, for the next layers).
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
            )

    def compute_bias(self, q_len, k_len):
        c = self.config
        relative = ops.arange(k_len)[None, :] - ops.arange(q_len)[:, None]  # (Q, K)
        buckets = relative_bucket(
            relative,
            self.bidirectional,
            c.relative_attention_num_buckets,
            c.relative_attention_max_distance,
        )
        bias = ops.take(self.relative_attention_bias, buckets, axis=0)  # (Q, K, N)
        return ops.transpose(bias, (2, 0, 1))[None]  # (1, N, Q, K)

    def call(self, x, kv=None, attention_mask=None, position_bias=None, training=False):
        c = self.config
        b, q_len = ops.shape(x)[0], ops.shape(x)[1]
        source = x if kv is None else kv
        k_len = ops.shape(source)[1]

        def heads(t):
            return ops.reshape(t, (b, -1, c.num_heads, c.d_kv))  # (B, L, N, D)

        q, k, v = heads(self.q(x)), heads(self.k(source)), heads(self.v(source))
        scores = ops.einsum("bqnd,bknd->bnqk", q, k)  # (B, N, Q, K), unscaled as T5
        if position_bias is None:
            if self.has_bias:
                position_bias = self.compute_bias(q_len, k_len)
            else:
                position_bias = ops.zeros((1, c.num_heads, q_len, k_len), scores.dtype)
        scores = scores + ops.cast(position_bias, scores.dtype)
        if attention_mask is not None:
            scores = ops.where(attention_mask, scores, -1e9)
        probs = self.dropout(ops.softmax(ops.cast(scores, "float32"), axis=-1), training=training)
        context = ops.einsum("bnqk,bknd->bqnd", ops.cast(probs, v.dtype), v)  # (B, Q, N, D)
        context = ops.reshape(context, (b, q_len, c.num_heads * c.d_kv))
        return self.o(context), position_bias


class T5Block(keras.layers.Layer):
    """One encoder (self-attention, feed-forward) or decoder (causal self-attention,
    cross-attention, feed-forward) block; each sub-block is x + dropout(f(norm(x)))."""

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
        training=False,
    ):
        a, position_bias = self.self_attention(
            self.self_norm(x),
            attention_mask=attention_mask,
            position_bias=position_bias,
            training=training,
        )
        x = x + self.dropout(a, training=training)
        if self.is_decoder:
            a, _ = self.cross_attention(
                self.cross_norm(x),
                kv=encoder_output,
                attention_mask=encoder_mask,
                training=training,
            )
            x = x + self.dropout(a, training=training)
        h = self.ff_norm(x)
        inner = self._act(self.wi(h))
        if self.gated:
            inner = inner * self.wi_1(h)
        h = self.wo(self.dropout(inner, training=training))
        return x + self.dropout(h, training=training), position_bias


@keras.saving.register_keras_serializable(package="cloze")
class T5Model(keras.Model):
    """The whole encoder-decoder with its language-model output.

    call(inputs, training) with int (B, S) `input_ids`, `input_mask` (encoder side) and int
    (B, T) `decoder_input_ids` (the targets shifted right, starting with decoder_start_token_id)
    and optionally `decoder_mask`. Returns a dict: encoder_output float (B, S, H),
    decoder_output float (B, T, H), lm_logits float32 (B, T, V).
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
        x = self.dropout(ops.take(self.shared, input_ids, axis=0), training=training)
        mask = ops.cast(input_mask, "bool")[:, None, None, :]  # (B, 1, 1, S)
        bias = None
        for block in self.blocks(False):
            x, bias = block(x, attention_mask=mask, position_bias=bias, training=training)
        return self.dropout(self.encoder_norm(x), training=training)

    def decode(
        self, decoder_input_ids, encoder_output, input_mask, decoder_mask=None, training=False
    ):
        """float (B, T, H) decoder states and float32 (B, T, V) logits."""
        t = ops.shape(decoder_input_ids)[1]
        x = self.dropout(ops.take(self.shared, decoder_input_ids, axis=0), training=training)
        causal = ops.arange(t)[None, :] <= ops.arange(t)[:, None]  # (T, T) keys at or before
        mask = causal[None, None]  # (1, 1, T, T)
        if decoder_mask is not None:
            mask = ops.logical_and(mask, ops.cast(decoder_mask, "bool")[:, None, None, :])
        encoder_mask = ops.cast(input_mask, "bool")[:, None, None, :]  # (B, 1, 1, S)
        bias = None
        for block in self.blocks(True):
            x, bias = block(
                x,
                attention_mask=mask,
                position_bias=bias,
                encoder_output=encoder_output,
                encoder_mask=encoder_mask,
                training=training,
            )
        x = self.dropout(self.decoder_norm(x), training=training)
        if self.config.tie_word_embeddings:
            # Tied output embedding: T5 rescales by d_model^-0.5 first (mesh_tensorflow).
            logits = ops.einsum("bth,vh->btv", x * self.config.d_model**-0.5, self.shared)
        else:
            logits = ops.einsum("bth,vh->btv", x, self.lm_head)
        return x, ops.cast(logits, "float32")

    def call(self, inputs, training=False):
        return encoder_decoder_outputs(self, inputs, training)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def encoder_decoder_outputs(model, inputs: dict, training=False) -> dict:
    """The `call` of an encoder-decoder with encode / decode (T5Model, bart.BartModel): the
    encoder once, then the teacher-forced decoder over it."""
    enc = model.encode(inputs["input_ids"], inputs["input_mask"], training=training)
    dec, logits = model.decode(
        inputs["decoder_input_ids"],
        enc,
        inputs["input_mask"],
        inputs.get("decoder_mask"),
        training=training,
    )
    return {"encoder_output": enc, "decoder_output": dec, "lm_logits": logits}


def shift_right(targets: np.ndarray, start_id: int) -> np.ndarray:
    """Decoder inputs for teacher forcing: the targets moved one to the right after start_id."""
    targets = np.asarray(targets)
    start = np.full((targets.shape[0], 1), start_id, targets.dtype)
    return np.concatenate([start, targets[:, :-1]], axis=1)


# The decoders below serve any encoder-decoder with T5Model's interface: encode(ids, mask) ->
# (B, S, H), decode(prefix, encoder_output, mask) -> (states, logits (B, T, V)) and a config with
# decoder_start_token_id, eos_token_id and pad_token_id (T5Model, bart.BartModel).


def greedy_decode(model, input_ids, input_mask, max_length: int) -> np.ndarray:
    """The most likely token at each step until every row has produced eos_token_id (or
    max_length tokens). Returns int32 (B, <= max_length), padded with pad_token_id after eos."""
    c = model.config
    enc = model.encode(input_ids, input_mask)
    b = np.asarray(input_ids).shape[0]
    out = np.full((b, 1), c.decoder_start_token_id, np.int32)
    done = np.zeros(b, bool)
    for _ in range(max_length):
        _, logits = model.decode(out, enc, input_mask)
        nxt = np.argmax(np.asarray(logits[:, -1]), axis=-1).astype(np.int32)
        nxt = np.where(done, c.pad_token_id, nxt)
        out = np.concatenate([out, nxt[:, None]], axis=1)
        done |= nxt == c.eos_token_id
        if done.all():
            break
    return out[:, 1:]


def beam_search(
    model, input_ids, input_mask, max_length: int, num_beams: int = 4, alpha: float = 0.6
) -> np.ndarray:
    """Beam search with GNMT's length penalty ((5 + len) / 6) ** alpha (Wu et al. 2016), one
    source at a time. Returns the best hypothesis per row, int32 (B, <= max_length), padded."""
    c = model.config
    results = []
    for row in range(np.asarray(input_ids).shape[0]):
        ids, mask = np.asarray(input_ids)[row : row + 1], np.asarray(input_mask)[row : row + 1]
        enc = model.encode(ids, mask)
        beams = [([c.decoder_start_token_id], 0.0)]
        finished: list[tuple[list[int], float]] = []
        for _ in range(max_length):
            prefixes = np.array([p for p, _ in beams], np.int32)
            k = len(beams)
            _, logits = model.decode(
                prefixes, ops.repeat(enc, k, axis=0), np.repeat(mask, k, axis=0)
            )
            logp = np.asarray(ops.log_softmax(logits[:, -1], axis=-1))  # (k, V)
            candidates = []
            for (prefix, score), row_logp in zip(beams, logp):
                for tok in np.argsort(-row_logp)[:num_beams]:
                    candidates.append((prefix + [int(tok)], score + float(row_logp[tok])))
            candidates.sort(key=lambda x: -x[1])
            beams = []
            for prefix, score in candidates:
                if prefix[-1] == c.eos_token_id:
                    finished.append((prefix, score / ((5 + len(prefix) - 1) / 6) ** alpha))
                else:
                    beams.append((prefix, score))
                if len(beams) == num_beams:
                    break
            if not beams or len(finished) >= num_beams:
                break
        finished += [(p, s / ((5 + len(p) - 1) / 6) ** alpha) for p, s in beams]
        results.append(max(finished, key=lambda x: x[1])[0][1:])
    width = max(len(r) for r in results)
    return np.array([r + [c.pad_token_id] * (width - len(r)) for r in results], np.int32)
