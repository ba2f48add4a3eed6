"""GPT (Radford et al. 2018) and GPT-2 (Radford et al. 2019): decoder-only Transformer LMs.

Read top to bottom: `GptConfig` (OpenAI's hparams.json names), `CausalSelfAttention` (fused
c_attn, a key/value cache for incremental decoding), `GptBlock` (GPT-1 post-LayerNorm or GPT-2
pre-LayerNorm, by config), `GptModel` (the backbone), `GptLM` (the tied output embedding),
`GptClassifier` (GPT-1's fine-tuning: the vector at the extract token, plus the LM loss as an
auxiliary), and `generate` (temperature / top-k / top-p sampling with the cache).
Shapes: B batch, T new positions, S positions attended (the cache length), H hidden, N heads,
D head depth, V vocab, C classes, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import ClassVar

import keras
import numpy as np
from keras import ops

from modeling import bert, heads, layers

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

REQUIRED = ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")  # OpenAI's hparams.json


def is_gpt_config(values: dict) -> bool:
    """Whether a config dict is a GPT one (OpenAI's names) rather than a BERT-family one."""
    return isinstance(values, dict) and "n_vocab" in values


@dataclasses.dataclass(frozen=True)
class GptConfig(bert.JsonConfig):
    """GPT hyper-parameters with the names of OpenAI's released `hparams.json`.

    The five fields of that file are required, so a released hparams.json loads unchanged; the
    others default to GPT-2's values. `layer_norm_position` is "pre" for GPT-2 (LayerNorm before
    each sub-block and a final one, sec. 2.3) or "post" for GPT-1 (after each residual sum, as
    BERT). `activation_function` "gelu" is the tanh approximation both papers used. `n_inner`
    None means 4 * n_embd. `summary_first_dropout` (Hugging Face's name): the dropout on the
    fine-tuning classifier's input, GPT-1's clf_pdrop 0.1.
    """

    n_vocab: int
    n_ctx: int = 1024
    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu"
    layer_norm_position: str = "pre"
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    summary_first_dropout: float = 0.1

    # bert.config_from_dict requires every field not in OPTIONAL: set below the class.
    OPTIONAL: ClassVar[frozenset] = frozenset()
    FAMILY: ClassVar[str] = "GPT"
    FILE_KIND: ClassVar[str] = "a GPT config file"

    def __post_init__(self):
        for name in REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GptConfig.{name}: expected a positive integer, found {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GptConfig: n_embd {self.n_embd} is not a multiple of n_head")
        if self.layer_norm_position not in ("pre", "post"):
            raise ValueError(
                f"GptConfig.layer_norm_position: expected 'pre' (GPT-2) or 'post' (GPT-1), "
                f"found {self.layer_norm_position!r}"
            )
        layers.get_activation(self.activation_function)

    @property
    def inner_size(self) -> int:
        return self.n_inner or 4 * self.n_embd


# Only the REQUIRED keys must be given; every other field has its default.
GptConfig.OPTIONAL = frozenset(f.name for f in dataclasses.fields(GptConfig)) - set(REQUIRED)


# ---------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------


def _big_negative(dtype) -> float:
    # Large enough to zero a softmax term, small enough to stay finite in half precision.
    return -1e9 if str(dtype) in ("float32", "float64") else -3e4


@keras.saving.register_keras_serializable(package="cloze")
class CausalSelfAttention(keras.layers.Layer):
    """Masked multi-head self-attention: position t attends to positions <= t only.

    call(x, cache=None, cache_index=0, attention_mask=None, training=False):
      x: float (B, T, H), the new positions cache_index .. cache_index + T - 1.
      cache: None, or [keys, values], each float (B, N, S, D), of every position so far (S is
        the cache length, fixed; entries past cache_index + T are ignored by the causal mask).
        See layers.write_cache.
      attention_mask: None or int (B, S') with 1 for real tokens; S' = S with a cache, else T.
    Returns (output float (B, T, H), the updated cache or None).
    """

    def __init__(self, n_embd, n_head, attn_pdrop=0.1, resid_pdrop=0.1, init_range=0.02, **kw):
        super().__init__(**kw)
        self.n_embd, self.n_head = n_embd, n_head
        self.attn_pdrop, self.resid_pdrop, self.init_range = attn_pdrop, resid_pdrop, init_range
        self.c_attn = layers.Dense(3 * n_embd, initializer_range=init_range, name="c_attn")
        self.c_proj = layers.Dense(n_embd, initializer_range=init_range, name="c_proj")
        self.attn_dropout = layers.Dropout(attn_pdrop)

    def build(self, input_shape):
        self.c_attn.build(input_shape)
        self.c_proj.build(input_shape)

    def call(self, x, cache=None, cache_index=0, attention_mask=None, training=False):
        b, t = ops.shape(x)[0], ops.shape(x)[1]
        n, d = self.n_head, self.n_embd // self.n_head
        if cache is None:
            return self._uncached(x, attention_mask, training), None
        # Decoding: x's keys and values written into the cache, the queries against all of it.
        qkv = ops.reshape(self.c_attn(x), (b, t, 3, n, d))  # (B, T, 3, N, D)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each (B, T, N, D)
        cache = layers.write_cache(cache, cache_index, k, v)
        k, v = cache  # (B, N, S, D)
        s = ops.shape(k)[2]
        scores = ops.einsum("btnd,bnsd->bnts", q, k) / math.sqrt(d)  # (B, N, T, S)
        query_pos = ops.arange(t) + cache_index  # (T,)
        allowed = ops.arange(s)[None, :] <= query_pos[:, None]  # (T, S): keys at or before
        allowed = allowed[None, None]  # (1, 1, T, S)
        if attention_mask is not None:
            allowed = ops.logical_and(allowed, ops.cast(attention_mask, "bool")[:, None, None, :])
        scores = ops.where(allowed, scores, _big_negative(scores.dtype))
        probs = self.attn_dropout(ops.softmax(scores, axis=-1), training=training)
        context = ops.einsum("bnts,bnsd->btnd", probs, v)  # (B, T, N, D)
        return self.c_proj(ops.reshape(context, (b, t, self.n_embd))), cache

    def _uncached(self, x, attention_mask, training):
        """call() without a cache (training, scoring): the same values up to float rounding,
        laid out as layers.SelfAttention (BERT's): one transpose puts the heads first and
        splits Q / K / V as contiguous blocks (strided slices' gradients are zero-filled
        copies), the 1/sqrt(D) scale on q rather than on the (B, N, T, T) scores, and the
        causal mask added as one (T, T) bias. On 2 AVX2 cores two GPT-2-wide blocks' forward
        and backward (B 8, T 128, best of 6) went 0.80 -> 0.65 s with oneDNN off and
        0.65 -> 0.61 s with it on, where keras-hub's GPT2Backbone took 0.83-0.94 s and
        0.62-0.67 s in the same runs (fifty-fourth session)."""
        b, t = ops.shape(x)[0], ops.shape(x)[1]
        n, d = self.n_head, self.n_embd // self.n_head
        qkv = ops.reshape(self.c_attn(x), (b, t, 3, n, d))  # (B, T, 3, N, D)
        q, k, v = layers.split_leading(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3)  # (B, N, T, D)
        scores = ops.einsum("bntd,bnsd->bnts", q * (1.0 / math.sqrt(d)), k)  # (B, N, T, T)
        # Keys after the query, or padding: one bias of _big_negative (never twice: a sum of two
        # would leave float16's range). Without padding the bias is (T, T), not (1, 1, T, T):
        # TensorFlow's oneDNN build fuses the score product, scale and a (1, 1, T, T) addend
        # into a matmul that only oneDNN's reference code runs, 330x slower (992 against 3 ms
        # for GPT-2's (8, 12, 128, 64) scores, 2 AVX-512 cores, 57th session; every other
        # addend shape tried ran its fast kernel).
        blocked = ops.arange(t)[None, :] > ops.arange(t)[:, None]  # (T, T)
        if attention_mask is not None:
            padding = ops.logical_not(ops.cast(attention_mask, "bool"))[:, None, None, :]
            blocked = ops.logical_or(blocked, padding)  # (B, 1, T, T)
        scores = scores + ops.cast(blocked, scores.dtype) * _big_negative(scores.dtype)
        probs = self.attn_dropout(ops.softmax(scores, axis=-1), training=training)
        context = ops.einsum("bnts,bnsd->bntd", probs, v)  # (B, N, T, D)
        context = ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (b, t, self.n_embd))
        return self.c_proj(context)

    def get_config(self):
        return {
            **super().get_config(),
            "n_embd": self.n_embd,
            "n_head": self.n_head,
            "attn_pdrop": self.attn_pdrop,
            "resid_pdrop": self.resid_pdrop,
            "init_range": self.init_range,
        }


@keras.saving.register_keras_serializable(package="cloze")
class GptBlock(keras.layers.Layer):
    """One decoder block. Pre-LN (GPT-2): x + attn(ln_1(x)), then x + mlp(ln_2(x)).
    Post-LN (GPT-1): ln_1(x + attn(x)), then ln_2(x + mlp(x)).

    call(x, cache, cache_index, attention_mask, training) -> (float (B, T, H), cache).
    """

    def __init__(self, config: GptConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = GptConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        self.attn = CausalSelfAttention(
            c.n_embd, c.n_head, c.attn_pdrop, c.resid_pdrop, c.initializer_range, name="attn"
        )
        eps = c.layer_norm_epsilon
        self.ln_1 = keras.layers.LayerNormalization(epsilon=eps, name="ln_1")
        self.ln_2 = keras.layers.LayerNormalization(epsilon=eps, name="ln_2")
        self.c_fc = layers.Dense(
            c.inner_size, c.activation_function, c.initializer_range, name="c_fc"
        )
        # GPT-2 sec. 2.3: residual projections start scaled by 1/sqrt(number of residual layers).
        scale = 1 / math.sqrt(2 * c.n_layer) if c.layer_norm_position == "pre" else 1.0
        self.c_proj = layers.Dense(
            c.n_embd, initializer_range=c.initializer_range * scale, name="c_proj"
        )
        self.dropout = layers.Dropout(c.resid_pdrop)

    def build(self, input_shape):
        self.attn.build(input_shape)
        self.ln_1.build(input_shape)
        self.ln_2.build(input_shape)
        self.c_fc.build(input_shape)
        self.c_proj.build((*input_shape[:-1], self.config.inner_size))

    def call(self, x, cache=None, cache_index=0, attention_mask=None, training=False):
        kw = dict(cache_index=cache_index, attention_mask=attention_mask, training=training)

        def mlp(h):
            return self.dropout(self.c_proj(self.c_fc(h)), training=training)

        if self.config.layer_norm_position == "pre":
            a, cache = self.attn(self.ln_1(x), cache=cache, **kw)
            x = x + self.dropout(a, training=training)
            return x + mlp(self.ln_2(x)), cache
        a, cache = self.attn(x, cache=cache, **kw)
        x = self.ln_1(x + self.dropout(a, training=training))
        return self.ln_2(x + mlp(x)), cache

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


# ---------------------------------------------------------------------------------------------
# Backbone and heads
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class GptModel(keras.Model):
    """Token + learned position embeddings, n_layer blocks, and (pre-LN) a final LayerNorm.

    call(inputs, cache=None, cache_index=0, training=False, word_table=None): inputs a dict with
    int (B, T) `input_ids` and optionally `input_mask` (1 real, 0 padding; (B, S) with a cache);
    word_table a view of wte to look the ids up in (a tied head's, heads.tied_table_views).
    Returns a dict: sequence_output float (B, T, H); encoder_outputs, the L + 1 hidden states
    (embeddings, then every block; the last is sequence_output's input for pre-LN models);
    cache, the updated per-layer caches ([keys, values] each, as CausalSelfAttention's) when a
    cache was given.
    """

    def __init__(self, config: GptConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = GptConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        self.drop = layers.Dropout(c.embd_pdrop)
        # One attribute per block: tf.train.Checkpoint does not follow Keras' TrackedList.
        for i in range(c.n_layer):
            setattr(self, f"h_{i}", GptBlock(c, name=f"h_{i}"))
        self.ln_f = (
            keras.layers.LayerNormalization(epsilon=c.layer_norm_epsilon, name="ln_f")
            if c.layer_norm_position == "pre"
            else None
        )

    @property
    def blocks(self) -> list:
        return [getattr(self, f"h_{i}") for i in range(self.config.n_layer)]

    def build(self, input_shape=None):
        c = self.config
        init = keras.initializers.RandomNormal(stddev=c.initializer_range)
        # Read as float32 under a mixed policy (layers.lookup_rows): autocast=False.
        self.wte = self.add_weight(
            name="wte", shape=(c.n_vocab, c.n_embd), initializer=init, autocast=False
        )
        self.wpe = self.add_weight(
            name="wpe", shape=(c.n_ctx, c.n_embd), initializer=init, autocast=False
        )
        for block in self.blocks:
            block.build((None, None, c.n_embd))
        if self.ln_f is not None:
            self.ln_f.build((None, None, c.n_embd))
        self.built = True

    def empty_cache(self, batch_size: int, length: int | None = None) -> list:
        """Zero caches for incremental decoding of up to `length` (default n_ctx) positions."""
        c = self.config
        shape = (batch_size, c.n_head, length or c.n_ctx, c.n_embd // c.n_head)
        return [[ops.zeros(shape, self.compute_dtype)] * 2 for _ in self.blocks]

    def call(self, inputs, cache=None, cache_index=0, training=False, word_table=None):
        ids = inputs["input_ids"]
        mask = inputs.get("input_mask")
        positions = ops.arange(ops.shape(ids)[1]) + cache_index  # (T,)
        dtype = self.compute_dtype
        table = self.wte if word_table is None else word_table
        x = layers.lookup_rows(table, ids, dtype)  # (B, T, H)
        x = x + layers.lookup_rows(self.wpe, positions, dtype)[None]
        x = self.drop(x, training=training)  # (B, T, H)
        outputs, new_cache = [x], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(
                x,
                cache=None if cache is None else cache[i],
                cache_index=cache_index,
                attention_mask=mask,
                training=training,
            )
            outputs.append(x)
            new_cache.append(layer_cache)
        if self.ln_f is not None:
            x = self.ln_f(x)
        out = {"sequence_output": x, "encoder_outputs": outputs}
        if cache is not None:
            out["cache"] = new_cache
        return out

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="cloze")
class GptLM(keras.Model):
    """The language model: the backbone and the transposed token embedding (tied, both papers).

    call(inputs, cache=None, cache_index=0, training=False, lm_terms=False) -> dict with
    lm_logits float32 (B, T, V) (and cache when given). Position t's logits predict token t + 1.
    With lm_terms (training, no cache), lm_xent and lm_hits float32 (B, T - 1) instead: each
    position's next-token cross-entropy and argmax hit, computed without the (B, T, V) logits
    (next_token_terms).
    """

    def __init__(self, config: GptConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = GptConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        self.encoder = GptModel(c, name="encoder")

    def build(self, input_shape=None):
        self.encoder.build()
        self.built = True

    def output_logits(self, h):
        """float32 (B, T, V) logits of hidden states float (B, T, H): the tied output embedding.
        (This equation: TensorFlow's einsum took about 5x as long with "...h,vh->...v" at
        (8, 160, 768) x GPT-2's table, eagerly.)"""
        logits = ops.einsum("bth,vh->btv", h, ops.cast(self.encoder.wte, h.dtype))
        return ops.cast(logits, "float32")

    def call(self, inputs, cache=None, cache_index=0, training=False, lm_terms=False):
        if lm_terms:
            if cache is not None:
                raise ValueError("GptLM: lm_terms are for training, without a cache")
            out = next_token_terms(self.encoder, inputs, training)
            return {"lm_xent": out["lm_xent"], "lm_hits": out["lm_hits"]}
        out = self.encoder(inputs, cache=cache, cache_index=cache_index, training=training)
        result = {"lm_logits": self.output_logits(out["sequence_output"])}  # (B, T, V)
        if cache is not None:
            result["cache"] = out["cache"]
        return result

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="cloze")
class GptClassifier(keras.Model):
    """GPT-1's fine-tuning model (Radford et al. 2018, sec. 3.2-3.3): inputs are
    `start text [delim text] extract`; a linear layer reads the last block's vector at the
    extract token (the last real token), and the LM logits come along for the auxiliary loss.

    call(inputs, training, lm_terms=False) with int (B, T) input_ids and input_mask (right
    padding) returns a dict: logits float32 (B, C) and lm_logits float32 (B, T, V); with
    lm_terms, lm_xent and lm_hits float32 (B, T - 1) instead of lm_logits (next_token_terms).
    Multiple choice (sec. 3.3, `start context delim answer_k extract` for each answer k, scored
    independently and normalised by a softmax): with num_classes=1, (B, K, T) inputs give
    logits (B, K), each answer's one logit; the LM outputs stay per sequence, (B*K, ...).
    dropout_rate: on the extract token's vector; None takes the config's summary_first_dropout.
    """

    def __init__(self, config: GptConfig | dict, num_classes: int, dropout_rate=None, **kwargs):
        super().__init__(**kwargs)
        c = GptConfig.from_dict(config) if isinstance(config, dict) else config
        if dropout_rate is None:
            dropout_rate = c.summary_first_dropout
        self.config, self.num_classes, self.dropout_rate = c, num_classes, dropout_rate
        self.lm = GptLM(c, name="lm")
        self.encoder = self.lm.encoder  # the name run scripts load pretrained weights into
        self.dropout = layers.Dropout(dropout_rate)
        self.classifier = layers.Dense(num_classes, initializer_range=0.02, name="classifier")

    def build(self, input_shape=None):
        self.lm.build()
        self.classifier.build((None, self.config.n_embd))
        self.built = True

    def call(self, inputs, training=False, lm_terms=False):
        if len(inputs["input_ids"].shape) == 3:  # multiple choice
            if self.num_classes != 1:
                raise ValueError(f"(B, K, T) answers need num_classes=1, not {self.num_classes}")
            flat, choices = layers.flatten_choices(inputs, ("input_ids", "input_mask"))
            out = self.call(flat, training=training, lm_terms=lm_terms)  # B*K sequences
            return out | {"logits": ops.reshape(out["logits"], choices)}  # (B*K, 1) -> (B, K)
        if lm_terms:
            out = next_token_terms(self.encoder, inputs, training)
            h = out.pop("sequence_output")
        else:
            h = self.encoder(inputs, training=training)["sequence_output"]  # (B, T, H)
            out = {"lm_logits": self.lm.output_logits(h)}
        last = ops.sum(ops.cast(inputs["input_mask"], "int32"), axis=1) - 1  # (B,)
        extract = ops.take_along_axis(h, last[:, None, None], axis=1)[:, 0]  # (B, H)
        logits = self.classifier(self.dropout(extract, training=training))
        return {"logits": ops.cast(logits, "float32"), **out}

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config.to_dict(),
            "num_classes": self.num_classes,
            "dropout_rate": self.dropout_rate,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def next_token_terms(encoder: GptModel, inputs: dict, training=False) -> dict:
    """The next-token loss terms of `encoder` with its tied output embedding, without the
    (B, T, V) logits: a dict of lm_xent and lm_hits float32 (B, T - 1), position t's
    cross-entropy and argmax hit against token t + 1 (GptLM.call's lm_logits would give the
    same up to float rounding), and sequence_output float (B, T, H).

    The vocabulary projection is most of a small GPT's step (GPT-2's 50,257 tokens at every
    position): heads.tied_xent_and_hits runs it as one vocabulary-major matmul and the softmax
    down its columns, and the lookup's and the head's gradients meet in one pass over the table
    (heads.tied_table_views).
    """
    (lookup_table,), table = heads.tied_table_views(encoder.wte, encoder.compute_dtype)
    h = encoder(inputs, training=training, word_table=lookup_table)["sequence_output"]
    ids = inputs["input_ids"]
    xent, hits = heads.tied_xent_and_hits(h[:, :-1], table, None, ids[:, 1:])
    return {"lm_xent": xent, "lm_hits": hits, "sequence_output": h}


def to_keras_hub(model: GptLM):
    """A keras_hub.models.GPT2Backbone holding a GPT-2 (pre-LN, tanh GELU) model's weights:
    keras-hub's GPT2CausalLM then generates with them (bench/generation.py's peer, and
    tests/test_gpt.py's independent implementation). c_attn's fused (H, 3H) kernel is split
    into keras-hub's query / key / value kernels (H, N, D); GPT-1's post-LN is refused.
    Reaches into keras-hub's layer attributes (_self_attention_layer, ...): its GPT-2 converter
    does the same, and a keras-hub release that renames them fails here, not silently."""
    import keras_hub

    c = model.config
    if (
        c.layer_norm_position != "pre"
        or c.activation_function != "gelu"
        or (c.layer_norm_epsilon != 1e-5)
    ):
        raise ValueError(
            "to_keras_hub: keras-hub's GPT2Backbone is pre-LN with the tanh GELU and LayerNorm "
            f"epsilon 1e-5; found layer_norm_position={c.layer_norm_position!r}, "
            f"activation_function={c.activation_function!r}, "
            f"layer_norm_epsilon={c.layer_norm_epsilon}"
        )
    enc = model.encoder
    ref = keras_hub.models.GPT2Backbone(
        vocabulary_size=c.n_vocab,
        num_layers=c.n_layer,
        num_heads=c.n_head,
        hidden_dim=c.n_embd,
        intermediate_dim=c.inner_size,
        dropout=0.0,
        max_sequence_length=c.n_ctx,
    )
    n, d, h = c.n_head, c.n_embd // c.n_head, c.n_embd
    ref.get_layer("token_embedding").embeddings.assign(enc.wte)
    ref.get_layer("position_embedding").position_embeddings.assign(enc.wpe)
    for i, block in enumerate(enc.blocks):
        layer = ref.get_layer(f"transformer_layer_{i}")
        att = layer._self_attention_layer
        kernel = np.asarray(block.attn.c_attn.kernel).reshape(h, 3, n, d)  # (H, 3, N, D)
        bias = np.asarray(block.attn.c_attn.bias).reshape(3, n, d)
        for j, dense in enumerate((att._query_dense, att._key_dense, att._value_dense)):
            dense.kernel.assign(kernel[:, j])
            dense.bias.assign(bias[j])
        att._output_dense.kernel.assign(np.asarray(block.attn.c_proj.kernel).reshape(n, d, h))
        att._output_dense.bias.assign(block.attn.c_proj.bias)
        for ours, theirs in (
            (block.ln_1, layer._self_attention_layer_norm),
            (block.ln_2, layer._feedforward_layer_norm),
        ):
            theirs.gamma.assign(ours.gamma)
            theirs.beta.assign(ours.beta)
        layer._feedforward_intermediate_dense.kernel.assign(block.c_fc.kernel)
        layer._feedforward_intermediate_dense.bias.assign(block.c_fc.bias)
        layer._feedforward_output_dense.kernel.assign(block.c_proj.kernel)
        layer._feedforward_output_dense.bias.assign(block.c_proj.bias)
    ref.get_layer("layer_norm").gamma.assign(enc.ln_f.gamma)
    ref.get_layer("layer_norm").beta.assign(enc.ln_f.beta)
    return ref


def save_keras_hub(model: GptLM, output_dir, vocab_dir) -> list:
    """A keras-hub preset of a GPT-2 (to_keras_hub's backbone and a GPT2Tokenizer of the
    byte-level BPE in vocab_dir, either naming): `keras_hub.models.GPT2CausalLM.from_preset
    (output_dir)` loads it offline and generates. Raises ValueError for a model keras-hub's
    GPT2Backbone cannot compute or a folder without the BPE files."""
    import keras_hub

    from data_prep import bpe

    backbone = to_keras_hub(model)  # first: it refuses what keras-hub's GPT-2 cannot compute
    files = bpe.folder_files(vocab_dir) if vocab_dir else None
    if files is None:
        raise ValueError("a keras-hub preset needs the model's BPE files (encoder.json + "
                         "vocab.bpe, or vocab.json + merges.txt) beside it")  # fmt: skip
    backbone.save_to_preset(str(output_dir))
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=str(files[0]), merges=str(files[1]))
    tokenizer.save_to_preset(str(output_dir))
    return sorted(str(p) for p in Path(output_dir).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# Hugging Face's files: GPT-2 (GPT2LMHeadModel) and GPT-1 (OpenAIGPTLMHeadModel)
# ---------------------------------------------------------------------------------------------

HF_PREFIX = "transformer."
# model_type -> layer_norm_position: GPT-2 is pre-LN, GPT-1 ("openai-gpt") post-LN.
HF_MODEL_TYPES = {"gpt2": "pre", "openai-gpt": "post"}
# Keys of each config.json that change what the LM computes, with the one value Cloze computes.
HF_FIXED = {
    "gpt2": {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
             "add_cross_attention": False},
    "openai-gpt": {"n_special": 0},
}  # fmt: skip
# Keys that do not: the sequence-summary head of transformers' *DoubleHeadsModel (Cloze's
# classifier is its own), reorder_and_upcast_attn (a float16 attention order; Cloze's scores are
# float32 there anyway), GPT-1's predict_special_tokens, and n_ctx, which older configs repeat
# beside n_positions (checked equal).
HF_IGNORED = frozenset(
    """summary_type summary_use_proj summary_activation summary_proj_to_labels
    reorder_and_upcast_attn predict_special_tokens n_ctx""".split()
)
# GPT-1's `afn` (its ACT_FNS, where "gelu" is the tanh approximation) -> Cloze's names.
HF_GPT1_ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}
# Fine-tuning heads of transformers' GPT2For* / OpenAIGPTFor* / *DoubleHeadsModel: not converted.
HF_TASK_HEADS = ("score.", "multiple_choice_head.", "classifier.", "qa_outputs.")


def config_from_hf(values: dict, source: str = "config.json") -> GptConfig:
    """A Hugging Face GPT-2 or GPT-1 `config.json` as published -> GptConfig (OpenAI's names).

    HF_FIXED's keys must have their value; HF_IGNORED's and modeling/checkpoints.py's
    _HF_IGNORED are dropped; any other unknown key is an error naming `source`.
    """
    from data_prep.errors import input_error
    from modeling import checkpoints

    model_type = values.get("model_type") if isinstance(values, dict) else None
    if model_type not in HF_MODEL_TYPES:
        where = f"{source}: model_type"
        raise input_error(where, f"one of {sorted(HF_MODEL_TYPES)}", repr(model_type))
    fixed = HF_FIXED[model_type]
    checkpoints.check_hf_fixed(values, fixed, source, "GPT")
    gpt2 = model_type == "gpt2"
    act_key = "activation_function" if gpt2 else "afn"
    own = {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", act_key, "resid_pdrop",
           "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "initializer_range",
           "summary_first_dropout", *(["n_inner"] if gpt2 else [])}  # fmt: skip
    known = own | set(fixed) | {"model_type"} | HF_IGNORED | checkpoints._HF_IGNORED
    unknown = sorted(set(values) - known)
    if unknown:
        raise input_error(source, f"the keys of a Hugging Face {model_type} config", f"{unknown}")
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        if key not in values:
            raise input_error(f"{source}: {key}", "a positive integer", "nothing (missing)")
    if values.get("n_ctx", values["n_positions"]) != values["n_positions"]:
        where = f"{source}: n_ctx"
        raise input_error(where, f"n_positions ({values['n_positions']})", repr(values["n_ctx"]))
    names = checkpoints.HF_TO_CLOZE_ACTIVATION if gpt2 else HF_GPT1_ACTIVATIONS
    activation = values.get(act_key, "gelu_new" if gpt2 else "gelu")
    if activation not in names:
        raise input_error(f"{source}: {act_key}", f"one of {sorted(names)}", repr(activation))
    optional = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon",
                "initializer_range", "summary_first_dropout", "n_inner")  # fmt: skip
    return GptConfig.from_dict(
        {
            "n_vocab": values["vocab_size"], "n_ctx": values["n_positions"],
            "n_embd": values["n_embd"], "n_head": values["n_head"], "n_layer": values["n_layer"],
            "activation_function": names[activation],
            "layer_norm_position": HF_MODEL_TYPES[model_type],
            **{k: values[k] for k in optional if k in values},
        },
        source,
    )  # fmt: skip


def hf_config(config: GptConfig) -> dict:
    """The config.json transformers writes for a GPT2LMHeadModel (pre-LN) or an
    OpenAIGPTLMHeadModel (post-LN) of this config. Raises ValueError for what GPT-1's class
    cannot hold (an activation other than its "gelu" / "relu", an inner size other than 4H)."""
    from modeling import checkpoints

    c = config
    common = {
        "vocab_size": c.n_vocab, "n_positions": c.n_ctx, "n_embd": c.n_embd,
        "n_layer": c.n_layer, "n_head": c.n_head, "resid_pdrop": c.resid_pdrop,
        "embd_pdrop": c.embd_pdrop, "attn_pdrop": c.attn_pdrop,
        "layer_norm_epsilon": c.layer_norm_epsilon, "initializer_range": c.initializer_range,
        "summary_first_dropout": c.summary_first_dropout, "tie_word_embeddings": True,
    }  # fmt: skip
    if c.layer_norm_position == "pre":
        return {
            **common, **HF_FIXED["gpt2"], "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"], "n_inner": c.n_inner,
            "activation_function": checkpoints.CLOZE_TO_HF_ACTIVATION[c.activation_function],
        }  # fmt: skip
    afn = {mine: theirs for theirs, mine in HF_GPT1_ACTIVATIONS.items()}
    if c.activation_function not in afn or c.inner_size != 4 * c.n_embd:
        raise ValueError(
            f"activation_function {c.activation_function!r}, inner size {c.inner_size}: "
            f"Hugging Face's GPT-1 (openai-gpt) computes {sorted(afn)} with 4 * n_embd only"
        )
    return {
        **common, "model_type": "openai-gpt",
        "architectures": ["OpenAIGPTLMHeadModel"], "afn": afn[c.activation_function],
    }  # fmt: skip


def hf_entries(config: GptConfig, prefix: str = HF_PREFIX) -> list:
    """Hugging Face's GPT-2 / GPT-1 parameter names (modeling_gpt2.py, modeling_openai.py) onto
    GptLM's variables (paths below the model). Their Conv1D weights are (in, out) as Keras
    kernels, and c_attn's 3H columns are q | k | v with the heads inside each, as
    CausalSelfAttention splits them: every entry is a copy. GPT-1 names its embeddings
    tokens_embed / positions_embed and has no ln_f."""
    from modeling.checkpoints import _copy, _hf_norm_entries

    c = config
    h, inner = c.n_embd, c.inner_size
    pre = c.layer_norm_position == "pre"
    words, positions = ("wte", "wpe") if pre else ("tokens_embed", "positions_embed")

    def conv1d(dst, src, n_in, n_out):
        return [_copy(f"{dst}/kernel", f"{src}.weight", (n_in, n_out)),
                _copy(f"{dst}/bias", f"{src}.bias", (n_out,))]  # fmt: skip

    out = [
        _copy("encoder/wte", f"{prefix}{words}.weight", (c.n_vocab, h)),
        _copy("encoder/wpe", f"{prefix}{positions}.weight", (c.n_ctx, h)),
    ]
    for i in range(c.n_layer):
        src, dst = f"{prefix}h.{i}", f"encoder/h_{i}"
        out += conv1d(f"{dst}/attn/c_attn", f"{src}.attn.c_attn", h, 3 * h)
        out += conv1d(f"{dst}/attn/c_proj", f"{src}.attn.c_proj", h, h)
        out += _hf_norm_entries(f"{dst}/ln_1", f"{src}.ln_1", h)
        out += _hf_norm_entries(f"{dst}/ln_2", f"{src}.ln_2", h)
        out += conv1d(f"{dst}/c_fc", f"{src}.mlp.c_fc", h, inner)
        out += conv1d(f"{dst}/c_proj", f"{src}.mlp.c_proj", inner, h)
    if pre:
        out += _hf_norm_entries("encoder/ln_f", f"{prefix}ln_f", h)
    return out


def load_hf(weights, config: GptConfig, config_where: str = "config.json", skip=None,
            trust_pickle: bool = False):  # fmt: skip
    """Hugging Face GPT-2 / GPT-1 weights (folder, file or shard index of a *LMHeadModel, a bare
    GPT2Model / OpenAIGPTModel, or a task model) -> (GptLM, checkpoints.ConversionReport).
    lm_head.weight, the tied word embedding, is checked equal and not converted; the causal-mask
    buffers older GPT-2 files hold (`attn.bias`, `attn.masked_bias`) and task heads are listed
    as not converted."""
    from modeling import checkpoints

    source = checkpoints._hf_source(weights, trust_pickle)
    prefix = checkpoints._prefix_of(source.shapes, HF_PREFIX)
    model = GptLM(config)
    model.build()
    where = (
        f"{config_where} (GPT, {config.layer_norm_position}-LN: {config.n_layer} layers, "
        f"n_embd={config.n_embd}, n_vocab={config.n_vocab})"
    )
    words = "wte" if config.layer_norm_position == "pre" else "tokens_embed"
    tied = {"lm_head.weight": f"{prefix}{words}.weight"}
    extra = {}
    for name in source.shapes:
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            extra[name] = "a buffer (the causal mask), not a weight"
        elif name.startswith(HF_TASK_HEADS):
            extra[name] = "a fine-tuning head (Cloze's task heads start fresh)"
    report = checkpoints.convert_into(
        model, hf_entries(config, prefix), source, where,
        checkpoints._hf_ignore(tied, source, extra), skip, heads=True,
    )  # fmt: skip
    return model, report


def end_of_text_id(vocab_dir) -> int | None:
    """The id of <|endoftext|> in the byte-level BPE folder `vocab_dir` (either naming), or None
    when there is no such folder or token."""
    import json

    from data_prep import bpe

    files = bpe.folder_files(vocab_dir) if vocab_dir else None
    if files is None:
        return None
    return json.loads(files[0].read_text(encoding="utf-8")).get(bpe.GPT2_END_OF_TEXT)


def tokenizer_class(vocab_dir) -> str:
    """Hugging Face's tokenizer class of the BPE folder `vocab_dir`: OpenAIGPTTokenizer for
    GPT-1's word-end BPE ("</w>" units), else (also without a folder) GPT2Tokenizer."""
    from data_prep import bpe

    files = bpe.folder_files(vocab_dir) if vocab_dir else None
    if files and any(t.endswith(bpe.END_OF_WORD) for t in bpe.read_encoder(files[0])):
        return "OpenAIGPTTokenizer"
    return "GPT2Tokenizer"


def save_hf(
    model: GptLM, output_dir, eos_token_id: int | None = None, tokenizer: str = "GPT2Tokenizer"
) -> list:
    """Writes model.safetensors and config.json as transformers' save_pretrained does for a
    GPT2LMHeadModel or an OpenAIGPTLMHeadModel (`transformer.`-prefixed names, the tied
    lm_head.weight left out), and tokenizer_config.json naming `tokenizer` (tokenizer_class of
    the vocabulary: the byte-level BPE's GPT2Tokenizer, or GPT-1's OpenAIGPTTokenizer).
    eos_token_id (end_of_text_id of the vocabulary) becomes the config's bos and eos token, as
    GPT-2's 50256; None writes null, not transformers' default 50256, which a vocabulary of
    another size does not hold."""
    import json

    from modeling import checkpoints

    config = {**hf_config(model.config), "bos_token_id": eos_token_id, "eos_token_id": eos_token_id}
    arrays = checkpoints.export_arrays(model, hf_entries(model.config))
    files = checkpoints.write_hf_files(output_dir, arrays, config)
    written = files[0].parent / "tokenizer_config.json"
    written.write_text(json.dumps({"tokenizer_class": tokenizer}, indent=2) + "\n")
    return [*files, written]


# ---------------------------------------------------------------------------------------------
# OpenAI's released GPT-2 files (github.com/openai/gpt-2, download_model.py)
# ---------------------------------------------------------------------------------------------

# model.ckpt.* under src/model.py's names, hparams.json (REQUIRED's five keys, which the
# released code reads and no other), encoder.json and vocab.bpe (Cloze's own BPE file names).
TF1_CHECKPOINT = "model.ckpt"
TF1_HPARAMS = "hparams.json"


def tf1_entries(config: GptConfig) -> list:
    """OpenAI's GPT-2 TF1 names (src/model.py: scope `model`, blocks h0 .. h{L-1}, each conv1d a
    `w` of (1, in, out) and a `b`, each norm a `g` and a `b`) onto GptLM's variables."""
    from modeling.checkpoints import _copy, _reshaped

    c = config
    h, inner = c.n_embd, c.inner_size

    def conv1d(dst, src, n_in, n_out):
        return [_reshaped(f"{dst}/kernel", f"{src}/w", (1, n_in, n_out), (n_in, n_out)),
                _copy(f"{dst}/bias", f"{src}/b", (n_out,))]  # fmt: skip

    def norm(dst, src):
        return [_copy(f"{dst}/gamma", f"{src}/g", (h,)), _copy(f"{dst}/beta", f"{src}/b", (h,))]

    out = [_copy("encoder/wte", "model/wte", (c.n_vocab, h)),
           _copy("encoder/wpe", "model/wpe", (c.n_ctx, h))]  # fmt: skip
    for i in range(c.n_layer):
        src, dst = f"model/h{i}", f"encoder/h_{i}"
        out += norm(f"{dst}/ln_1", f"{src}/ln_1")
        out += conv1d(f"{dst}/attn/c_attn", f"{src}/attn/c_attn", h, 3 * h)
        out += conv1d(f"{dst}/attn/c_proj", f"{src}/attn/c_proj", h, h)
        out += norm(f"{dst}/ln_2", f"{src}/ln_2")
        out += conv1d(f"{dst}/c_fc", f"{src}/mlp/c_fc", h, inner)
        out += conv1d(f"{dst}/c_proj", f"{src}/mlp/c_proj", inner, h)
    return out + norm("encoder/ln_f", "model/ln_f")


def check_tf1(config: GptConfig) -> None:
    """Raises ValueError unless the released GPT-2 code computes this config: pre-LN, the tanh
    GELU, an inner size of 4 * n_embd and LayerNorm epsilon 1e-5, which it fixes."""
    c = config
    fixed = {"layer_norm_position": "pre", "activation_function": "gelu",
             "inner_size": 4 * c.n_embd, "layer_norm_epsilon": 1e-5}  # fmt: skip
    other = {k: getattr(c, k) for k, v in fixed.items() if getattr(c, k) != v}
    if other:
        raise ValueError(f"{other}: OpenAI's GPT-2 code computes {fixed} only")


def load_tf1(checkpoint, config: GptConfig, config_where: str = TF1_HPARAMS, skip=None):
    """OpenAI's GPT-2 checkpoint (a prefix, or a folder with its `checkpoint` file or
    model.ckpt) -> (GptLM, checkpoints.ConversionReport)."""
    from modeling import checkpoints

    check_tf1(config)
    source = checkpoints.TFCheckpointSource(
        checkpoints.resolve_checkpoint_prefix(checkpoint, TF1_CHECKPOINT)
    )
    model = GptLM(config)
    model.build()
    where = f"{config_where} (GPT-2: {config.n_layer} layers, n_embd={config.n_embd})"
    report = checkpoints.convert_into(
        model, tf1_entries(config), source, where, skip=skip, heads=True
    )
    return model, report


def save_tf1(model: GptLM, output_dir) -> list:
    """Writes OpenAI's GPT-2 layout: model.ckpt.* and `checkpoint` (tf1_entries' names) and
    hparams.json with the five keys the released code reads."""
    import json
    from pathlib import Path

    from modeling import checkpoints

    check_tf1(model.config)
    arrays = checkpoints.export_arrays(model, tf1_entries(model.config))
    prefix = checkpoints._save_tf1_arrays(arrays, output_dir, TF1_CHECKPOINT)
    hparams = {name: getattr(model.config, name) for name in REQUIRED}
    (Path(output_dir) / TF1_HPARAMS).write_text(json.dumps(hparams, indent=2) + "\n")
    return [prefix, Path(output_dir) / TF1_HPARAMS]


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------


def filter_logits(logits, top_k: int = 0, top_p: float = 1.0):
    """Keeps the top_k largest logits (0: all) and the smallest set whose probability reaches
    top_p (nucleus sampling, Holtzman et al. 2020); the rest become -inf.
    logits: float (B, V). Returns float (B, V)."""
    logits = ops.convert_to_tensor(logits, "float32")
    if top_k:
        kth = ops.top_k(logits, top_k)[0][:, -1:]  # (B, 1)
        logits = ops.where(logits < kth, -np.inf, logits)
    if top_p < 1.0:
        order = ops.argsort(-logits, axis=-1)  # (B, V) best first
        sorted_logits = ops.take_along_axis(logits, order, axis=-1)
        probs = ops.softmax(sorted_logits, axis=-1)
        before = ops.cumsum(probs, axis=-1) - probs  # mass of the better tokens
        keep_sorted = before < top_p  # the best token is always kept
        inverse = ops.argsort(order, axis=-1)
        keep = ops.take_along_axis(keep_sorted, inverse, axis=-1)
        logits = ops.where(keep, logits, -np.inf)
    return logits


def generate(
    model: GptLM,
    prompt_ids,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    use_cache: bool = True,
) -> np.ndarray:
    """Continues prompts token by token. temperature 0 is greedy decoding.

    prompt_ids: int (B, T0), prompts of one length. Sampling draws from stateless random ops
    keyed by (seed, step), so the same seed gives the same text. With use_cache, each step runs
    the model on the one new token against the cached keys and values (the prompt once), as an
    XLA program (layers.compiled_for_decoding); the token is then picked eagerly. Without it,
    each step runs the whole sequence again (the reference the cache is tested against).
    Returns int32 (B, T0 + max_new_tokens).
    """
    import tensorflow as tf

    ids = np.asarray(prompt_ids, np.int32)
    b, t0 = ids.shape
    total = t0 + max_new_tokens
    if total > model.config.n_ctx:
        raise ValueError(f"prompt + new tokens = {total} exceeds n_ctx {model.config.n_ctx}")

    def pick(logits, step):
        if temperature == 0:
            return ops.argmax(logits, axis=-1)
        logits = filter_logits(logits / temperature, top_k, top_p)
        draw = tf.random.stateless_categorical(logits, 1, seed=[seed, step])
        return draw[:, 0]

    def cached(tokens, cache, index):
        # The last position's logits (B, V) and the cache; one XLA program per input shape
        # (the prompt's, then one token's). Only the last position goes through the output
        # embedding: the prompt's others are not needed (at GPT-2 small's 50,257 rows, batch 8
        # and a 128-id prompt, 79 GFLOP of the prompt pass's 258).
        out = model.encoder({"input_ids": tokens}, cache=cache, cache_index=index)
        return model.output_logits(out["sequence_output"][:, -1:])[:, 0], out["cache"]

    if use_cache:
        step_fn = layers.compiled_for_decoding(model, "cached", cached)
        cache = model.encoder.empty_cache(b, total)
        logits, cache = step_fn(ids, cache, ops.convert_to_tensor(0, "int32"))
    for step in range(max_new_tokens):
        if not use_cache:
            logits = model({"input_ids": ids})["lm_logits"][:, -1]
        new = np.asarray(pick(logits, step), np.int32)[:, None]  # (B, 1)
        ids = np.concatenate([ids, new], axis=1)
        if use_cache and step + 1 < max_new_tokens:
            index = ops.convert_to_tensor(t0 + step, "int32")
            logits, cache = step_fn(new, cache, index)
    return ids


def continue_prompts(
    model: GptLM,
    prompts: list,
    max_new_tokens: int,
    batch_size: int = 8,
    stop_id: int | None = None,
    progress=None,
    **sampling,
) -> list:
    """New ids for each of `prompts` (lists of ids, any lengths), in their order: prompts of one
    length go through generate together, batch_size at a time (the key / value cache has no
    padding), the k-th batch sampling with seed `sampling["seed"] + k`, so the same prompts and
    settings give the same ids. Each continuation ends before its first stop_id (GPT-2's
    <|endoftext|>) when given. sampling: generate's temperature, top_k, top_p, seed.
    progress: called with the number of prompts each batch finished."""
    seed = sampling.pop("seed", 0)
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(prompts):
        if not ids:
            raise ValueError(f"prompt {i}: no ids (start it with an end-of-text token)")
        by_length.setdefault(len(ids), []).append(i)
    out: list = [None] * len(prompts)
    batch = 0
    for length, rows in sorted(by_length.items()):
        for start in range(0, len(rows), batch_size):
            part = rows[start : start + batch_size]
            ids = generate(model, [prompts[i] for i in part], max_new_tokens, seed=seed + batch,
                           **sampling)  # fmt: skip
            for i, row in zip(part, ids[:, length:].tolist()):
                out[i] = row[: row.index(stop_id)] if stop_id in row else row
            batch += 1
            if progress is not None:
                progress(len(part))
    return out
