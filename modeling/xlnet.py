"""XLNet (Yang et al. 2019): permutation language modelling with two-stream self-attention.

Read top to bottom: `XLNetConfig` (the released xlnet_config.json names), `attention_masks` (the
factorisation order's perm_mask -> what each stream may see), `relative_positional_encoding`
(Transformer-XL's sinusoids of relative distances), `TwoStreamRelativeAttention` (content and
query streams sharing one set of projections, with the r_w_bias / r_r_bias / r_s_bias terms),
`XLNetLayer` (attention + feed-forward, post-LayerNorm, applied to both streams), `XLNetModel`
(the backbone), `XLNetPretrainer` (the tied softmax over the query stream at the predicted
positions) and `XLNetClassifier` (fine-tuning on the last token's content stream).

The two streams (sec. 2.3): the content stream h_i sees the content of every position before i
in the factorisation order and of i itself; the query stream g_i sees the content of the
positions before i but never x_i, and starts from a learned vector (mask_emb) so it carries only
the position i (through the relative encoding). The query stream of the last layer predicts x_i.

Transformer-XL's segment recurrence (sec. 2.5) is the optional `mems` input (cache_mems makes
the next one), and the release's bidirectional data (bi_data) the optional `backward` input: rows
that read their text backward, whose relative distances are negated. Segment encoding (relative,
sec. 2.5) is there and optional: without segment_ids every token is in segment 0.

Shapes: B batch, S length, P predicted positions, H d_model, N n_head, D d_head, I d_inner,
V n_token, R = 2S - 1 relative distances, L layers, C classes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import keras
import numpy as np
from keras import ops

from data_prep import glue
from modeling import bert, layers

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

# The eight fields of the released xlnet_config.json (xlnet_cased_L-12_H-768_A-12 and others).
REQUIRED = (
    "d_head",
    "d_inner",
    "d_model",
    "ff_activation",
    "n_head",
    "n_layer",
    "n_token",
    "untie_r",
)


def is_xlnet_config(values: dict) -> bool:
    """Whether a config dict is an XLNet one (the released names n_token and d_head)."""
    return isinstance(values, dict) and "n_token" in values and "d_head" in values


@dataclasses.dataclass(frozen=True)
class XLNetConfig(bert.JsonConfig):
    """XLNet hyper-parameters with the names of the released `xlnet_config.json`.

    Those eight fields are required, so a released config loads unchanged. The optional ones are
    flags of the original train scripts, under the same names: `dropout`, `dropatt` (attention
    probabilities), `init_std` (stddev of the normal initializer, the original's default
    init="normal") and `clamp_len` (relative distances are clipped to +-clamp_len; -1: none).
    `ff_activation` "gelu" is the tanh approximation the original code computes; `untie_r` gives
    every layer its own r_w_bias, r_r_bias and r_s_bias (one shared set otherwise).
    """

    d_head: int
    d_inner: int
    d_model: int
    ff_activation: str
    n_head: int
    n_layer: int
    n_token: int
    untie_r: bool
    dropout: float = 0.1
    dropatt: float = 0.1
    init_std: float = 0.02
    clamp_len: int = -1

    OPTIONAL: ClassVar[frozenset] = frozenset()  # set below the class
    FAMILY: ClassVar[str] = "XLNet"
    FILE_KIND: ClassVar[str] = "an xlnet_config.json file"

    def __post_init__(self):
        for name in ("d_head", "d_inner", "d_model", "n_head", "n_layer", "n_token"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"XLNetConfig.{name}: expected a positive integer, found {value!r}"
                )
        if self.d_model % 2:
            # The sinusoid encoding pairs a sine and a cosine per frequency.
            raise ValueError(f"XLNetConfig.d_model: expected an even number, found {self.d_model}")
        if not isinstance(self.untie_r, bool):
            raise ValueError(f"XLNetConfig.untie_r: expected true or false, found {self.untie_r!r}")
        for name in ("dropout", "dropatt"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(
                    f"XLNetConfig.{name}: expected [0, 1), found {getattr(self, name)}"
                )
        if self.ff_activation not in layers.ACTIVATIONS:
            raise ValueError(
                f"XLNetConfig.ff_activation: expected one of {sorted(layers.ACTIVATIONS)}, "
                f"found {self.ff_activation!r}"
            )


XLNetConfig.OPTIONAL = frozenset(f.name for f in dataclasses.fields(XLNetConfig)) - set(REQUIRED)


# ---------------------------------------------------------------------------------------------
# Masks and relative positions
# ---------------------------------------------------------------------------------------------


def attention_masks(length, perm_mask=None, input_mask=None, mem_length=0, mem_mask=None):
    """What each stream may attend to, as bool (B or 1, S, M + S) masks, [b, i, M + j] True when
    position i may read the content of position j, and [b, i, m] (m < M) of memory slot m.

    perm_mask: float or int (B, S, S) with XLNet's meaning, 1 where i may NOT see j (j is not
      before i in the factorisation order; data_prep/permutation.py); None: every position sees
      every other (fine-tuning, sec. 2.3's "standard self-attention").
    input_mask: int (B, S), 1 for real tokens, 0 for padding (the BERT convention, not XLNet's
      inverted one); padded keys are hidden from both streams.
    mem_length: M, the memory's length (segment recurrence, cache_mems); both streams see all
      of it, as the released code and Hugging Face's (their perm and input masks are 0 there),
      or, with mem_mask int or bool (B, M), the slots it marks (a memory not yet filled).
    Returns (content, query): the query mask is perm_mask's complement; the content stream may
    in addition always see its own position (sec. 2.3, eq. 5: h attends to z_{<=t}).
    """
    allowed = ops.ones((1, length, length), "bool")
    if perm_mask is not None:
        allowed = ops.logical_and(allowed, ops.equal(perm_mask, 0))
    if input_mask is not None:
        allowed = ops.logical_and(allowed, ops.cast(input_mask, "bool")[:, None, :])
    eye = ops.cast(ops.eye(length), "bool")[None]  # (1, S, S)
    content = ops.logical_or(allowed, eye)
    if isinstance(mem_length, int) and mem_length == 0:
        return content, allowed
    if mem_mask is None:
        memory = ops.ones((ops.shape(allowed)[0], length, mem_length), "bool")
    else:
        b = ops.shape(mem_mask)[0]
        memory = ops.broadcast_to(ops.cast(mem_mask, "bool")[:, None, :], (b, length, mem_length))
        content = ops.broadcast_to(content, (b, length, length))
        allowed = ops.broadcast_to(allowed, (b, length, length))
    return ops.concatenate([memory, content], 2), ops.concatenate([memory, allowed], 2)


def relative_positional_encoding(
    length, d_model: int, clamp_len: int = -1, dtype="float32", mem_length=0
):
    """Transformer-XL's sinusoid encoding (Dai et al. 2019, sec. 3.3) of the relative distances
    between a query i of the block and a key j of the memory (M slots) and the block, i + M - j:
    row k holds distance K - 1 - k (K = M + S), so rows run from K - 1 down to -(S - 1).
    Returns float (R, H), R = K + S - 1: sines then cosines. Negated distances (the release's
    bi_data backward rows) are these with the sines negated."""
    freq = ops.arange(0, d_model, 2, dtype="float32")  # (H/2,)
    inv_freq = 1.0 / ops.power(10000.0, freq / d_model)
    distance = ops.arange(length + mem_length - 1, -length, -1, dtype="float32")  # (R,)
    if clamp_len > 0:
        distance = ops.clip(distance, -clamp_len, clamp_len)
    angle = ops.einsum("r,f->rf", distance, inv_freq)  # (R, H/2)
    return ops.cast(ops.concatenate([ops.sin(angle), ops.cos(angle)], axis=-1), dtype)


def _normal(stddev):
    # The original's default (init="normal"): every weight from a normal of stddev init_std.
    # layers.Dense (the feed-forward and heads) draws a truncated normal of the same stddev.
    return keras.initializers.RandomNormal(stddev=stddev)


# ---------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class TwoStreamRelativeAttention(keras.layers.Layer):
    """Relative multi-head attention for the content stream and, optionally, the query stream.

    Both streams use the same q/k/v/o/r projections (the original's [H, N, D] kernels, no bias);
    keys and values always come from the content stream. The score of query i and key j is
    ((q_i + r_w_bias) . k_j + (q_i + r_r_bias) . r_{i-j} + (q_i + r_s_bias) . s_ij) / sqrt(D)
    (Transformer-XL sec. 3.3 plus XLNet's relative segment term, sec. 2.5).

    call(h, pos, biases, content_mask, g=None, query_mask=None, target_mapping=None,
         seg_mat=None, training=False, mem=None):
      h: float (B, S, H) content stream. pos: float (R, H) relative encoding, or (2, R, H) the
        forward and the backward rows' with `backward`.
      biases: (r_w_bias, r_r_bias, r_s_bias, seg_embed) float (N, D), (N, D), (N, D), (2, N, D).
      content_mask, query_mask: bool (B, S, K) from attention_masks.
      g: float (B, P, H) query stream of the predicted positions; target_mapping float (B, P, S)
        one-hot, which position each of the P queries sits at.
      seg_mat: None or bool (B, S, K), True where i and j are in different segments.
      mem: None or float (B, M, H), this layer's memory (the content stream it read for earlier
        segments): keys and values are then its M slots followed by h's S positions (K = M + S).
      backward: None or int (B,), 1 for the rows that take pos[1] (bi_data's backward rows).
    Returns (attention output for h (B, S, H), for g (B, P, H) or None), before the residual.
    """

    def __init__(self, d_model, n_head, d_head, dropatt=0.1, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.d_head = d_model, n_head, d_head
        self.dropatt, self.init_std = dropatt, init_std
        self.attn_dropout = layers.Dropout(dropatt)

    def build(self, input_shape=None):
        shape = (self.d_model, self.n_head, self.d_head)
        for name in ("q", "k", "v", "o", "r"):
            setattr(
                self,
                name,
                self.add_weight(name=name, shape=shape, initializer=_normal(self.init_std)),
            )

    def _attend(self, q, k, v, pos_k, biases, allowed, seg_mat, training):
        """q float (B, S, N, D); k, v float (B, K, N, D), the memory's M slots then the block's
        S positions (K = S without memory); pos_k float (R, N, D), or (B, R, N, D) one for each
        row; allowed bool (B, S, K).
        Returns float (B, S, N, D)."""
        r_w_bias, r_r_bias, r_s_bias, seg_embed = biases
        s = ops.shape(q)[1]
        content = ops.einsum("bind,bjnd->bnij", q + r_w_bias, k)  # (B, N, S, K)
        rows = "rnd" if len(pos_k.shape) == 3 else "brnd"
        by_distance = ops.einsum(f"bind,{rows}->bnir", q + r_r_bias, pos_k)  # (B, N, S, R)
        # Key j is at distance i + M - j from query i, at row K - 1 - (i + M - j) = S - 1 - i + j
        # (relative_positional_encoding). A gather rather than Transformer-XL's pad-and-reshape
        # "rel_shift": the same numbers, and readable; memory is S x K either way.
        i = ops.arange(s)[:, None]
        j = ops.arange(ops.shape(k)[1])[None, :]
        index = ops.broadcast_to((s - 1 - i + j)[None, None], ops.shape(content))
        position = ops.take_along_axis(by_distance, index, axis=-1)  # (B, N, S, K)
        scores = content + position
        if seg_mat is not None:
            by_segment = ops.einsum("bind,end->bnie", q + r_s_bias, seg_embed)  # (B, N, S, 2)
            scores = scores + ops.where(
                seg_mat[:, None], by_segment[..., 1:], by_segment[..., :1]
            )  # (B, N, S, K): s_ij is seg_embed[1] across segments, seg_embed[0] within
        scores = scores / math.sqrt(self.d_head)
        allowed = allowed[:, None]  # (B, 1, S, K)
        # -1e30 as the original in float32 (-3e4 stays finite in half precision); the product
        # below makes a row with nothing to see (the first position of the order, in the query
        # stream) attend to nothing instead of spreading evenly over hidden keys, so no content
        # can leak through it.
        hidden = -1e30 if str(scores.dtype) in ("float32", "float64") else -3e4
        probs = ops.softmax(ops.where(allowed, scores, hidden), axis=-1)
        probs = probs * ops.cast(allowed, probs.dtype)
        probs = self.attn_dropout(probs, training=training)
        return ops.einsum("bnij,bjnd->bind", probs, v)  # (B, S, N, D)

    def call(
        self,
        h,
        pos,
        biases,
        content_mask,
        g=None,
        query_mask=None,
        target_mapping=None,
        seg_mat=None,
        training=False,
        mem=None,
        backward=None,
    ):
        kv = h if mem is None else ops.concatenate([ops.cast(mem, h.dtype), h], axis=1)
        k = ops.einsum("bih,hnd->bind", kv, self.k)  # (B, K, N, D)
        v = ops.einsum("bih,hnd->bind", kv, self.v)
        if backward is None:
            pos_k = ops.einsum("rh,hnd->rnd", pos, self.r)  # (R, N, D)
        else:  # projected once per direction, then picked for each row: (B, R, N, D)
            pos_k = ops.take(ops.einsum("trh,hnd->trnd", pos, self.r), backward, axis=0)
        q_h = ops.einsum("bih,hnd->bind", h, self.q)
        out_h = self._attend(q_h, k, v, pos_k, biases, content_mask, seg_mat, training)
        out_h = ops.einsum("bind,hnd->bih", out_h, self.o)  # (B, S, H)
        if g is None:
            return out_h, None
        q_g = ops.einsum("bph,hnd->bpnd", g, self.q)  # (B, P, N, D)
        q_g = ops.einsum("bpnd,bps->bsnd", q_g, target_mapping)  # (B, S, N, D) at its positions
        out_g = self._attend(q_g, k, v, pos_k, biases, query_mask, seg_mat, training)
        out_g = ops.einsum("bsnd,bps->bpnd", out_g, target_mapping)  # (B, P, N, D)
        return out_h, ops.einsum("bpnd,hnd->bph", out_g, self.o)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "n_head": self.n_head,
            "d_head": self.d_head,
            "dropatt": self.dropatt,
            "init_std": self.init_std,
        }


@keras.saving.register_keras_serializable(package="cloze")
class XLNetLayer(keras.layers.Layer):
    """One XLNet layer: relative attention, then the feed-forward network, each followed by
    dropout, the residual sum and LayerNorm (post-LN as Transformer-XL); both streams go
    through the same weights.

    call(h, pos, biases, content_mask, g=None, query_mask=None, target_mapping=None,
         seg_mat=None, training=False, mem=None, backward=None) -> (h float (B, S, H), g float
         (B, P, H) or None); mem: this layer's memory, backward: bi_data's backward rows
         (TwoStreamRelativeAttention).
    """

    def __init__(self, config: XLNetConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = XLNetConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        self.rel_attn = TwoStreamRelativeAttention(
            c.d_model, c.n_head, c.d_head, c.dropatt, c.init_std, name="rel_attn"
        )
        # epsilon 1e-12: the original's tf.contrib.layers.layer_norm default.
        self.attn_layer_norm = keras.layers.LayerNormalization(epsilon=1e-12, name="attn_ln")
        self.ff_layer_norm = keras.layers.LayerNormalization(epsilon=1e-12, name="ff_ln")
        self.layer_1 = layers.Dense(c.d_inner, c.ff_activation, c.init_std, name="layer_1")
        self.layer_2 = layers.Dense(c.d_model, initializer_range=c.init_std, name="layer_2")
        self.dropout = layers.Dropout(c.dropout)

    def build(self, input_shape=None):
        shape = (None, None, self.config.d_model)
        self.rel_attn.build()
        self.attn_layer_norm.build(shape)
        self.ff_layer_norm.build(shape)
        self.layer_1.build(shape)
        self.layer_2.build((None, None, self.config.d_inner))

    def _post(self, x, attended, training):
        x = layers.residual_layer_norm(self.attn_layer_norm, x, attended, self.dropout, training)
        inner = self.dropout(self.layer_1(x), training=training)
        h = self.layer_2(inner)
        return layers.residual_layer_norm(self.ff_layer_norm, x, h, self.dropout, training)

    def call(
        self,
        h,
        pos,
        biases,
        content_mask,
        g=None,
        query_mask=None,
        target_mapping=None,
        seg_mat=None,
        training=False,
        mem=None,
        backward=None,
    ):
        a_h, a_g = self.rel_attn(
            h,
            pos,
            biases,
            content_mask,
            g=g,
            query_mask=query_mask,
            target_mapping=target_mapping,
            seg_mat=seg_mat,
            training=training,
            mem=mem,
            backward=backward,
        )
        h_out = self._post(h, a_h, training)
        return h_out, (None if g is None else self._post(g, a_g, training))

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


# ---------------------------------------------------------------------------------------------
# Backbone and heads
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class XLNetModel(keras.Model):
    """Word embeddings, the relative encoding and n_layer two-stream layers.

    call(inputs, training=False): inputs a dict with int (B, S) `input_ids`, and optionally
    `input_mask` (B, S) (1 real, 0 padding), `segment_ids` (B, S), and for permutation LM both
    `perm_mask` float (B, S, S) and `target_mapping` float (B, P, S) (data_prep/permutation.py),
    and for the segment recurrence `mems`, L float (B, M, H) tensors: what each layer read for
    the segments before (cache_mems of their encoder_outputs), seen by every position as
    segment 0 at distances M + i - m (Transformer-XL's relative positions), optionally with
    `mem_mask` (B, M), 1 at the slots that hold something (0: hidden from both streams); and
    for the release's bidirectional data `backward` int (B,) (or (B, 1)), 1 for the rows whose
    ids run backward through the text: their relative distances are negated (as its bi_data
    relative encoding, which puts those rows in the second half of the batch).
    Returns a dict: sequence_output float (B, S, H), the last content stream; encoder_outputs,
    the L + 1 content streams (embeddings, then every layer); with perm_mask also query_output
    float (B, P, H) and query_outputs, the L + 1 query streams (mask_emb, then every layer).
    """

    def __init__(self, config: XLNetConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = XLNetConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        self.drop = layers.Dropout(c.dropout)
        # One attribute per layer: tf.train.Checkpoint does not follow Keras' TrackedList.
        for i in range(c.n_layer):
            setattr(self, f"layer_{i}", XLNetLayer(c, name=f"layer_{i}"))

    @property
    def layers_(self) -> list:
        return [getattr(self, f"layer_{i}") for i in range(self.config.n_layer)]

    def build(self, input_shape=None):
        c = self.config
        init = _normal(c.init_std)
        self.word_embedding = self.add_weight(  # float32 under a mixed policy (lookup_rows)
            name="word_embedding", shape=(c.n_token, c.d_model), initializer=init, autocast=False
        )
        self.mask_emb = self.add_weight(name="mask_emb", shape=(1, 1, c.d_model), initializer=init)
        # The original's variable names and shapes: [L, N, D] with untie_r, else [N, D].
        bias_shape = (c.n_layer, c.n_head, c.d_head) if c.untie_r else (c.n_head, c.d_head)
        for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
            setattr(self, name, self.add_weight(name=name, shape=bias_shape, initializer=init))
        self.seg_embed = self.add_weight(
            name="seg_embed", shape=(c.n_layer, 2, c.n_head, c.d_head), initializer=init
        )
        for layer in self.layers_:
            layer.build()
        self.built = True

    def layer_biases(self, i: int) -> tuple:
        """Layer i's (r_w_bias, r_r_bias, r_s_bias, seg_embed)."""
        pick = (lambda w: w[i]) if self.config.untie_r else (lambda w: w)
        return (pick(self.r_w_bias), pick(self.r_r_bias), pick(self.r_s_bias), self.seg_embed[i])

    def call(self, inputs, training=False):
        c = self.config
        ids = inputs["input_ids"]
        b, s = ops.shape(ids)[0], ops.shape(ids)[1]
        perm_mask = inputs.get("perm_mask")
        mems = inputs.get("mems")
        if mems is not None and len(mems) != c.n_layer:
            raise ValueError(f"mems: expected {c.n_layer} tensors (one a layer), found {len(mems)}")
        m = 0 if mems is None else ops.shape(mems[0])[1]
        content_mask, query_mask = attention_masks(
            s, perm_mask, inputs.get("input_mask"), m, inputs.get("mem_mask")
        )
        content_mask = ops.broadcast_to(content_mask, (b, s, s + m))
        query_mask = ops.broadcast_to(query_mask, (b, s, s + m))
        seg_mat = None
        if inputs.get("segment_ids") is not None:
            seg = inputs["segment_ids"]
            keys = seg if mems is None else ops.pad(seg, ((0, 0), (m, 0)))  # memory: segment 0
            seg_mat = ops.not_equal(seg[:, :, None], keys[:, None, :])  # (B, S, M + S)
        h = layers.lookup_rows(self.word_embedding, ids, self.compute_dtype)  # (B, S, H)
        h = self.drop(h, training=training)
        pos = relative_positional_encoding(s, c.d_model, c.clamp_len, h.dtype, m)  # (R, H)
        backward = inputs.get("backward")
        if backward is not None:  # (2, R, H): the forward rows', the backward rows' (negated)
            backward = ops.reshape(ops.cast(backward, "int32"), (-1,))
            sines, cosines = ops.split(pos, 2, axis=-1)
            pos = ops.stack([pos, ops.concatenate([-sines, cosines], axis=-1)])
        pos = self.drop(pos, training=training)
        g = target_mapping = None
        if perm_mask is not None:
            target_mapping = ops.cast(inputs["target_mapping"], h.dtype)
            p = ops.shape(target_mapping)[1]
            g = self.drop(
                ops.broadcast_to(ops.cast(self.mask_emb, h.dtype), (b, p, c.d_model)),
                training=training,
            )  # (B, P, H)
        content, query = [h], [g]
        for i, layer in enumerate(self.layers_):
            h, g = layer(
                h,
                pos,
                self.layer_biases(i),
                content_mask,
                g=g,
                query_mask=query_mask,
                target_mapping=target_mapping,
                seg_mat=seg_mat,
                training=training,
                mem=None if mems is None else mems[i],
                backward=backward,
            )
            content.append(h)
            query.append(g)
        out = {"sequence_output": self.drop(h, training=training), "encoder_outputs": content}
        if perm_mask is not None:
            out["query_output"] = self.drop(g, training=training)
            out["query_outputs"] = query
        return out

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def cache_mems(mems, encoder_outputs, mem_len: int, reuse_len: int = 0) -> list:
    """The memory the next segment reads (Transformer-XL's segment recurrence, XLNet sec. 2.5):
    per layer, the last mem_len slots of the old memory followed by the content stream that
    layer read for this segment (encoder_outputs[l], the layer's input) at its first reuse_len
    positions (all of them with 0), without gradient, as the released code's _cache_mem and
    Hugging Face's cache_mem.

    mems: None (the first segment) or L float (B, M, H); encoder_outputs: XLNetModel's L + 1
    content streams (the last, the final output, is not cached). Returns L float (B, M', H),
    M' = min(mem_len, M + reuse_len or S)."""
    if mem_len < 1:
        raise ValueError(f"mem_len: expected at least 1, found {mem_len}")
    new = []
    for i, h in enumerate(encoder_outputs[:-1]):
        current = h[:, :reuse_len] if reuse_len else h
        if mems is not None:
            current = ops.concatenate([ops.cast(mems[i], h.dtype), current], axis=1)
        new.append(ops.stop_gradient(current[:, -mem_len:]))
    return new


@keras.saving.register_keras_serializable(package="cloze")
class XLNetPretrainer(keras.Model):
    """Permutation LM: the query stream at each predicted position scores the vocabulary through
    the transposed word embedding (tied, as the original's lm_loss) plus a softmax bias.

    call(inputs, training) with XLNetModel's inputs (perm_mask and target_mapping required)
    returns a dict: plm_logits float32 (B, P, V), and the backbone's outputs.
    """

    def __init__(self, config: XLNetConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = XLNetConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        self.encoder = XLNetModel(c, name="encoder")

    def build(self, input_shape=None):
        self.encoder.build()
        self.softmax_bias = self.add_weight(
            name="softmax_bias", shape=(self.config.n_token,), initializer="zeros"
        )
        self.built = True

    def call(self, inputs, training=False):
        if inputs.get("perm_mask") is None or inputs.get("target_mapping") is None:
            raise ValueError("XLNetPretrainer needs perm_mask and target_mapping inputs")
        out = self.encoder(inputs, training=training)
        g = out["query_output"]
        logits = ops.einsum("bph,vh->bpv", g, ops.cast(self.encoder.word_embedding, g.dtype))
        return {**out, "plm_logits": ops.cast(logits + self.softmax_bias, "float32")}

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def last_token_index(input_mask):
    """Index of each row's last real token: int32 (B,) from input_mask (B, S). Works for right
    padding and for XLNet's own left padding (where it is S - 1)."""
    s = ops.shape(input_mask)[1]
    reversed_mask = ops.flip(ops.cast(input_mask, "int32"), axis=1)
    return ops.cast(s - 1 - ops.argmax(reversed_mask, axis=1), "int32")


@keras.saving.register_keras_serializable(package="cloze")
class XLNetClassifier(keras.Model):
    """Sequence classification as XLNet fine-tunes it: the content stream of the last real token
    (XLNet puts its <cls> last, sec. 3.1 / the released classifier's summary_type "last") through
    a tanh projection (its summary use_proj), dropout and a linear layer. No permutation: every
    position sees every real token.

    call(inputs, training) with int (B, S) input_ids, input_mask and optionally segment_ids
    returns float32 logits (B, C), the shape training/finetune_tasks.classification_task reads.
    Multiple choice (as XLNet's released code fine-tunes RACE): with num_classes=1, (B, C, S)
    inputs, one packed sequence per choice, give (B, C) scores, each choice's one logit.
    """

    def __init__(self, config: XLNetConfig | dict, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        c = XLNetConfig.from_dict(config) if isinstance(config, dict) else config
        self.config, self.num_classes = c, num_classes
        self.encoder = XLNetModel(c, name="encoder")
        self.summary = layers.Dense(c.d_model, "tanh", c.init_std, name="summary")
        self.dropout = layers.Dropout(c.dropout)
        self.classifier = layers.Dense(num_classes, initializer_range=c.init_std, name="logit")

    def build(self, input_shape=None):
        self.encoder.build()
        self.summary.build((None, self.config.d_model))
        self.classifier.build((None, self.config.d_model))
        self.built = True

    def call(self, inputs, training=False):
        keys = ("input_ids", "input_mask", "segment_ids")
        if len(inputs["input_ids"].shape) == 3:  # multiple choice
            if self.num_classes != 1:
                raise ValueError(f"(B, C, S) choices need num_classes=1, not {self.num_classes}")
            flat, choices = layers.flatten_choices(inputs, keys)  # (B*C, S)
            return ops.reshape(self.call(flat, training=training), choices)  # (B*C, 1) -> (B, C)
        encoder_inputs = {k: inputs[k] for k in keys if k in inputs}
        h = self.encoder(encoder_inputs, training=training)["sequence_output"]  # (B, S, H)
        mask = inputs.get("input_mask")
        if mask is None:
            mask = ops.ones(ops.shape(inputs["input_ids"]), "int32")
        last = last_token_index(mask)
        summary = ops.take_along_axis(h, last[:, None, None], axis=1)[:, 0]  # (B, H)
        summary = self.dropout(self.summary(summary), training=training)
        return ops.cast(self.classifier(summary), "float32")

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config.to_dict(),
            "num_classes": self.num_classes,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="cloze")
class XLNetSpanQA(keras.Model):
    """Span prediction (SQuAD) on XLNet's content stream: a linear layer gives every position a
    start and an end logit, as Hugging Face's XLNetForQuestionAnsweringSimple (the released
    code's beam-searched end logits conditioned on the start are not reproduced). Inputs are
    packed `question <sep> window <sep> <cls>` (glue.xlnet_packing); "no answer" is read at
    the <cls> (data_prep/squad.InputFeatures.null_index).

    call(inputs, training) with int (B, S) input_ids, input_mask and segment_ids returns float32
    (B, S, 2), start logits in [..., 0] and end logits in [..., 1], as span_qa.BertSpanQA.
    """

    def __init__(self, config: XLNetConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = XLNetConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = c
        self.encoder = XLNetModel(c, name="encoder")
        self.qa_outputs = layers.Dense(2, initializer_range=c.init_std, name="qa")

    def build(self, input_shape=None):
        self.encoder.build()
        self.qa_outputs.build((None, None, self.config.d_model))
        self.built = True

    def call(self, inputs, training=False):
        keys = ("input_ids", "input_mask", "segment_ids")
        h = self.encoder({k: inputs[k] for k in keys if k in inputs}, training=training)
        return ops.cast(self.qa_outputs(h["sequence_output"]), "float32")  # (B, S, 2)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def answer_positions(segment_ids, input_mask):
    """bool (B, S) positions of `question <sep> window <sep> <cls>` windows (glue.xlnet_packing
    in data_prep/squad.py) that may start or end an answer: the window's tokens (segment 1 but
    its closing <sep>) and the <cls>, where "no answer" is read; and int32 (B,) the <cls>'s
    index (segment 2). The released code's p_mask, inverted."""
    seg = ops.convert_to_tensor(segment_ids, "int32")
    real = ops.cast(input_mask, "bool")
    following = ops.pad(seg[:, 1:], ((0, 0), (0, 1)))  # each position's next segment id
    window = ops.logical_and(ops.equal(seg, 1), ops.equal(following, 1))
    cls = ops.logical_and(ops.equal(seg, 2), real)
    allowed = ops.logical_and(ops.logical_or(window, cls), real)
    return allowed, ops.cast(ops.argmax(ops.cast(cls, "int32"), axis=1), "int32")


@keras.saving.register_keras_serializable(package="cloze")
class XLNetBeamSpanQA(keras.Model):
    """SQuAD with the released XLNet's span head (its run_squad.py; Hugging Face's
    XLNetForQuestionAnswering): start logits at every position; end logits conditioned on a
    start (the start's content state beside each position's, a dense layer to H, tanh,
    LayerNorm, a dense layer to 1); an answer-class logit from a start state and the <cls>
    state (dense to H, tanh, dense to 1 without bias) for SQuAD 2.0's "no answer", trained with
    the span. Positions outside the window (answer_positions) get -1e30 logits.

    call(inputs, training) with int (B, S) input_ids, input_mask, segment_ids:
      with int (B,) start_positions in inputs (training): float32 start_logits (B, S), end_logits
        (B, S) conditioned on the given starts, cls_logits (B,) from the given starts' states,
        and cls_index int32 (B,), the <cls>'s position (answer_positions);
      without: the beam of top_n starts and for each its top_n ends, as the released code
        searches it: start_top_log_probs, start_top_index (B, K), end_top_log_probs,
        end_top_index (B, K, K) (start rank, end rank), and cls_logits (B,) from the starts'
        expected state (the start probabilities' weighted sum of the content states).
    top_n: K, the released code's start_n_top = end_n_top = 5.
    """

    def __init__(self, config: XLNetConfig | dict, top_n: int = 5, **kwargs):
        super().__init__(**kwargs)
        c = XLNetConfig.from_dict(config) if isinstance(config, dict) else config
        self.config, self.top_n = c, top_n
        self.encoder = XLNetModel(c, name="encoder")
        h, std = c.d_model, c.init_std
        self.start_dense = layers.Dense(1, initializer_range=std, name="start_dense")
        # Its weights only: _end_logits applies its two halves of rows apart, then tanh.
        self.end_dense_0 = layers.Dense(h, initializer_range=std, name="end_dense_0")
        self.end_norm = keras.layers.LayerNormalization(epsilon=1e-12, name="end_ln")
        self.end_dense_1 = layers.Dense(1, initializer_range=std, name="end_dense_1")
        self.cls_dense_0 = layers.Dense(h, "tanh", initializer_range=std, name="cls_dense_0")
        self.cls_dense_1 = layers.Dense(
            1, initializer_range=std, use_bias=False, name="cls_dense_1"
        )

    def build(self, input_shape=None):
        h = self.config.d_model
        self.encoder.build()
        self.start_dense.build((None, None, h))
        self.end_dense_0.build((None, None, 2 * h))
        self.end_norm.build((None, None, h))
        self.end_dense_1.build((None, None, h))
        self.cls_dense_0.build((None, 2 * h))
        self.cls_dense_1.build((None, h))
        self.built = True

    def _end_logits(self, h, start_states, allowed):
        """float32 (B, K, S) end logits of content states h (B, S, H) beside each of K start
        states (B, K, H). end_dense_0 reads [position; start] (2H wide): its two halves of rows
        are applied once each, to the S positions and to the K starts, and summed by
        broadcasting, rather than to K x S concatenated rows (the same values; K times fewer
        products at the beam's K = 5)."""
        dense, hd = self.end_dense_0, self.config.d_model
        kernel = ops.cast(dense.kernel, h.dtype)
        positions = ops.matmul(h, kernel[:hd])[:, None]  # (B, 1, S, H)
        starts = ops.matmul(start_states, kernel[hd:])[:, :, None]  # (B, K, 1, H)
        x = ops.tanh(positions + starts + ops.cast(dense.bias, h.dtype))  # (B, K, S, H)
        x = ops.cast(self.end_dense_1(self.end_norm(x))[..., 0], "float32")
        return ops.where(allowed[:, None], x, -1e30)

    def _cls_logits(self, h, start_states, cls_index):
        cls_states = ops.take_along_axis(h, cls_index[:, None, None], axis=1)[:, 0]  # (B, H)
        x = self.cls_dense_0(ops.concatenate([start_states, cls_states], axis=-1))
        return ops.cast(self.cls_dense_1(x)[:, 0], "float32")  # (B,)

    def call(self, inputs, training=False):
        keys = ("input_ids", "input_mask", "segment_ids")
        h = self.encoder({k: inputs[k] for k in keys}, training=training)["sequence_output"]
        allowed, cls_index = answer_positions(inputs["segment_ids"], inputs["input_mask"])
        start = ops.where(allowed, ops.cast(self.start_dense(h)[..., 0], "float32"), -1e30)
        if "start_positions" in inputs:  # training: the gold starts
            given = ops.cast(inputs["start_positions"], "int32")[:, None, None]
            start_states = ops.take_along_axis(h, given, axis=1)  # (B, 1, H)
            end = self._end_logits(h, start_states, allowed)[:, 0]  # (B, S)
            cls = self._cls_logits(h, start_states[:, 0], cls_index)
            return {"start_logits": start, "end_logits": end, "cls_logits": cls,
                    "cls_index": cls_index}  # fmt: skip
        k = self.top_n
        start_log_probs = ops.log_softmax(start, axis=-1)  # (B, S)
        start_top, start_index = ops.top_k(start_log_probs, k)  # (B, K)
        start_states = ops.take_along_axis(h, start_index[:, :, None], axis=1)  # (B, K, H)
        end = self._end_logits(h, start_states, allowed)  # (B, K, S)
        end_top, end_index = ops.top_k(ops.log_softmax(end, axis=-1), k)  # (B, K, K)
        expected = ops.einsum("bs,bsh->bh", ops.exp(start_log_probs), ops.cast(h, "float32"))
        cls = self._cls_logits(h, ops.cast(expected, h.dtype), cls_index)
        b = ops.shape(h)[0]
        beam = [start_top, start_index, end_top, end_index, cls[:, None]]
        return {
            "start_top_log_probs": start_top,
            "start_top_index": ops.cast(start_index, "int32"),
            "end_top_log_probs": end_top,
            "end_top_index": ops.cast(end_index, "int32"),
            "cls_logits": cls,
            # All of it in one float32 row per window (unpack_beam), for predictors that gather
            # one array; the indices are exact in float32 below 2^24 positions.
            "beam": ops.concatenate(
                [ops.reshape(ops.cast(x, "float32"), (b, -1)) for x in beam], 1
            ),
        }

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(), "top_n": self.top_n}

    def unpack_beam(self, row) -> tuple:
        """One window's `beam` row -> (start_log_probs (K,), start_index (K,), end_log_probs
        (K, K), end_index (K, K), cls_logit), numpy."""
        k = self.top_n
        row = np.array(row, np.float32)  # a copy: views of it must not keep a chunk alive
        parts = np.split(row, np.cumsum([k, k, k * k, k * k]))
        return (parts[0], parts[1].astype(np.int64), parts[2].reshape(k, k),
                parts[3].reshape(k, k).astype(np.int64), float(parts[4][0]))  # fmt: skip

    @classmethod
    def from_config(cls, config):
        return cls(**config)


# ---------------------------------------------------------------------------------------------
# Hugging Face's XLNet files (transformers' XLNetModel / XLNetLMHeadModel), both ways
# ---------------------------------------------------------------------------------------------

# An XLNetLMHeadModel holds the network under `transformer.`; a bare XLNetModel has no prefix.
HF_PREFIX = "transformer."
# ff_activation: Hugging Face's names (its ACT2FN) -> Cloze's (layers.ACTIVATIONS). Hugging
# Face's "gelu" is the exact erf form; the original XLNet code's "gelu", and Cloze's, the tanh
# approximation, which Hugging Face calls "gelu_new".
HF_ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "relu": "relu", "tanh": "tanh"}
# Keys of a Hugging Face XLNet config.json that change what one block computes, with the only
# value Cloze's XLNet computes (bidirectional attention, no bidirectional data, the original's
# LayerNorm epsilon).
HF_FIXED = {"model_type": "xlnet", "attn_type": "bi", "bi_data": False, "layer_norm_eps": 1e-12}
# The segment recurrence's and the task heads' settings: they do not change what XLNetModel
# computes on one block without memory.
HF_IGNORED = frozenset(
    """mem_len reuse_len same_length use_mems_eval use_mems_train summary_type summary_use_proj
    summary_activation summary_last_dropout summary_proj_to_labels start_n_top end_n_top""".split()
)
# Fine-tuning heads of transformers' XLNetFor* models: not converted (Cloze's start fresh).
HF_TASK_HEADS = ("sequence_summary.", "logits_proj.", "classifier.", "qa_outputs.", "start_logits.",
                 "end_logits.", "answer_class.")  # fmt: skip
_BIASES = ("r_w_bias", "r_r_bias", "r_s_bias")


def config_from_hf(values: dict, source: str = "config.json") -> XLNetConfig:
    """A Hugging Face XLNet `config.json` as published -> XLNetConfig (the released names).

    HF_FIXED's keys must have their value; the keys of HF_IGNORED and modeling/checkpoints.py's
    _HF_IGNORED are dropped; any other unknown key is an error naming `source`. Hugging Face
    keeps r_w_bias, r_r_bias and r_s_bias in every layer whatever its untie_r says, so the config
    has untie_r true; its one `dropout` is also the attention's (dropatt).
    """
    from data_prep.errors import input_error
    from modeling import checkpoints

    checkpoints.check_hf_fixed(values, HF_FIXED, source, "XLNet")
    own = {"vocab_size", "d_model", "n_layer", "n_head", "d_head", "d_inner", "ff_activation",
           "untie_r", "dropout", "initializer_range", "clamp_len"}  # fmt: skip
    unknown = sorted(set(values) - own - set(HF_FIXED) - HF_IGNORED - checkpoints._HF_IGNORED)
    if unknown:
        raise input_error(source, "the keys of a Hugging Face XLNet config", f"{unknown}")
    for key in ("vocab_size", "d_model", "n_layer", "n_head", "d_inner"):
        if key not in values:
            raise input_error(f"{source}: {key}", "a positive integer", "nothing (missing)")
    activation = values.get("ff_activation", "gelu")
    if activation not in HF_ACTIVATIONS:
        raise input_error(
            f"{source}: ff_activation", f"one of {sorted(HF_ACTIVATIONS)}", repr(activation)
        )
    d_model, n_head = values["d_model"], values["n_head"]
    d_head = values.get("d_head", d_model // n_head if n_head else 0)
    if not isinstance(n_head, int) or n_head <= 0 or d_head * n_head != d_model:
        raise input_error(
            f"{source}: d_head", f"d_model / n_head = {d_model} / {n_head}", repr(d_head)
        )
    dropout = values.get("dropout", 0.1)
    return XLNetConfig.from_dict(
        {
            "d_head": d_head, "d_inner": values["d_inner"], "d_model": d_model,
            "ff_activation": HF_ACTIVATIONS[activation], "n_head": n_head,
            "n_layer": values["n_layer"], "n_token": values["vocab_size"], "untie_r": True,
            "dropout": dropout, "dropatt": dropout,
            "init_std": values.get("initializer_range", 0.02),
            "clamp_len": values.get("clamp_len", -1),
        },
        source,
    )  # fmt: skip


def hf_config(config: XLNetConfig) -> dict:
    """The config.json transformers writes for an XLNetLMHeadModel of this config."""
    activation = {mine: theirs for theirs, mine in HF_ACTIVATIONS.items()}
    if config.ff_activation not in activation:
        raise ValueError(
            f"ff_activation {config.ff_activation!r}: Hugging Face's XLNet computes "
            f"{sorted(activation)} only"
        )
    if config.dropout != config.dropatt:
        raise ValueError(
            f"dropout {config.dropout} and dropatt {config.dropatt}: Hugging Face's XLNet has "
            "one dropout for both"
        )
    return {
        **HF_FIXED,
        "architectures": ["XLNetLMHeadModel"],
        "vocab_size": config.n_token,
        "d_model": config.d_model,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "d_head": config.d_head,
        "d_inner": config.d_inner,
        "ff_activation": activation[config.ff_activation],
        "untie_r": True,  # every layer's own biases, repeated from a tied model's one set
        "dropout": config.dropout,
        "initializer_range": config.init_std,
        "clamp_len": config.clamp_len,
        "tie_word_embeddings": True,
    }


def _stacked(target: str, sources: tuple, shape, tied: bool):
    """Per-layer Hugging Face parameters (each `shape`) onto one Cloze variable: stacked on a
    new first axis ([L, ...]), or with tied=True the one set every layer uses (they must be
    equal; written to every layer)."""
    import numpy as np

    from data_prep.errors import InputError
    from modeling.checkpoints import Entry

    def tie(arrays):
        if any(not np.array_equal(a, arrays[0]) for a in arrays[1:]):
            raise InputError(f"{sources[0]}: expected the same values in every layer (untie_r "
                             "false), found different ones")  # fmt: skip
        return arrays[0]

    if tied:
        return Entry(target, sources, (tuple(shape),) * len(sources), tie,
                     lambda x: [x] * len(sources))  # fmt: skip
    return Entry(target, sources, (tuple(shape),) * len(sources), lambda a: np.stack(a),
                 lambda x: list(x))  # fmt: skip


def hf_entries(config: XLNetConfig, prefix: str = HF_PREFIX, heads: bool = True) -> list:
    """Hugging Face's XLNet parameter names (modeling_xlnet.py) onto XLNetPretrainer's variables
    (paths below the model). The q / k / v / o / r projections are [H, N, D] in both; the
    feed-forward's nn.Linear weights are transposed; each layer's r_*_bias and seg_embed stack
    into Cloze's [L, ...] variables; lm_loss.bias is the softmax bias (its weight is the tied
    word embedding)."""
    from modeling.checkpoints import _copy, _hf_linear_entries, _hf_norm_entries

    c = config
    h, n, d, L = c.d_model, c.n_head, c.d_head, c.n_layer
    out = [
        _copy("encoder/word_embedding", f"{prefix}word_embedding.weight", (c.n_token, h)),
        _copy("encoder/mask_emb", f"{prefix}mask_emb", (1, 1, h)),
    ]
    layer = [f"{prefix}layer.{i}" for i in range(L)]
    for name in _BIASES:
        sources = tuple(f"{src}.rel_attn.{name}" for src in layer)
        out.append(_stacked(f"encoder/{name}", sources, (n, d), tied=not c.untie_r))
    sources = tuple(f"{src}.rel_attn.seg_embed" for src in layer)
    out.append(_stacked("encoder/seg_embed", sources, (2, n, d), tied=False))
    for i, src in enumerate(layer):
        dst = f"encoder/layer_{i}"
        out += [_copy(f"{dst}/rel_attn/{w}", f"{src}.rel_attn.{w}", (h, n, d)) for w in "qkvor"]
        out += _hf_norm_entries(f"{dst}/attn_ln", f"{src}.rel_attn.layer_norm", h)
        out += _hf_norm_entries(f"{dst}/ff_ln", f"{src}.ff.layer_norm", h)
        out += _hf_linear_entries(f"{dst}/layer_1", f"{src}.ff.layer_1", h, c.d_inner)
        out += _hf_linear_entries(f"{dst}/layer_2", f"{src}.ff.layer_2", c.d_inner, h)
    if heads:
        out.append(_copy("softmax_bias", "lm_loss.bias", (c.n_token,)))
    return out


def hf_qa_head_entries(config: XLNetConfig) -> list:
    """Hugging Face's XLNetForQuestionAnswering heads (start_logits, end_logits, answer_class)
    onto XLNetBeamSpanQA's layers."""
    from modeling.checkpoints import _hf_linear_entries, _hf_norm_entries, _transposed

    h = config.d_model
    return [
        *_hf_linear_entries("start_dense", "start_logits.dense", h, 1),
        *_hf_linear_entries("end_dense_0", "end_logits.dense_0", 2 * h, h),
        *_hf_norm_entries("end_ln", "end_logits.LayerNorm", h),
        *_hf_linear_entries("end_dense_1", "end_logits.dense_1", h, 1),
        *_hf_linear_entries("cls_dense_0", "answer_class.dense_0", 2 * h, h),
        _transposed("cls_dense_1/kernel", "answer_class.dense_1.weight", (1, h)),
    ]


def load_hf_qa(weights, config: XLNetConfig, config_where: str = "config.json", skip=None,
               trust_pickle: bool = False):  # fmt: skip
    """A fine-tuned Hugging Face XLNetForQuestionAnswering (folder, file or shard index) ->
    (XLNetBeamSpanQA with its encoder and heads, checkpoints.ConversionReport)."""
    from modeling import checkpoints

    source = checkpoints._hf_source(weights, trust_pickle)
    prefix = checkpoints._prefix_of(source.shapes, HF_PREFIX)
    model = XLNetBeamSpanQA(config)
    model.build()
    entries = hf_entries(config, prefix, heads=False) + hf_qa_head_entries(config)
    where = f"{config_where} (XLNet span QA: {config.n_layer} layers, d_model={config.d_model})"
    report = checkpoints.convert_into(
        model, entries, source, where, checkpoints._hf_ignore({}, source), skip, heads=True
    )
    return model, report


def load_hf(weights, config: XLNetConfig, config_where: str = "config.json", skip=None,
            trust_pickle: bool = False):  # fmt: skip
    """Hugging Face XLNet weights (folder, file or shard index of an XLNetLMHeadModel, an
    XLNetModel or an XLNetFor* task model) -> (XLNetPretrainer, checkpoints.ConversionReport).
    lm_loss.weight, the tied word embedding, is checked equal and not converted; without
    lm_loss.bias (a bare XLNetModel or a task model) the softmax bias stays zeros; task heads are
    listed as not converted, but for a fine-tuned XLNetForQuestionAnswering's: that one becomes
    an XLNetBeamSpanQA with its heads (load_hf_qa), which run_squad.py predicts with."""
    from modeling import checkpoints

    source = checkpoints._hf_source(weights, trust_pickle)
    if (
        "start_logits.dense.weight" in source.shapes
        and "answer_class.dense_1.weight" in source.shapes
    ):
        return load_hf_qa(weights, config, config_where, skip, trust_pickle)
    prefix = checkpoints._prefix_of(source.shapes, HF_PREFIX)
    heads = "lm_loss.bias" in source.shapes
    model = XLNetPretrainer(config)
    model.build()
    where = (
        f"{config_where} (XLNet: {config.n_layer} layers, d_model={config.d_model}, "
        f"n_token={config.n_token})"
    )
    tied = {"lm_loss.weight": f"{prefix}word_embedding.weight"}
    heads_of_tasks = {
        name: "a fine-tuning head (Cloze's task heads start fresh)"
        for name in source.shapes
        if name.startswith(HF_TASK_HEADS)
    }
    report = checkpoints.convert_into(
        model, hf_entries(config, prefix, heads), source, where,
        checkpoints._hf_ignore(tied, source, heads_of_tasks), skip, heads=heads,
        fresh=() if heads else ("softmax_bias",),
    )  # fmt: skip
    if not heads:
        report.notes.append("no lm_loss.bias: the softmax bias starts at zeros")
    return model, report


def save_hf(model: XLNetPretrainer | XLNetBeamSpanQA, output_dir) -> list:
    """Writes model.safetensors and config.json as transformers' save_pretrained does for an
    XLNetLMHeadModel (`transformer.`-prefixed names, the tied lm_loss.weight left out), or for
    an XLNetBeamSpanQA an XLNetForQuestionAnswering (its heads' names, start_n_top = end_n_top =
    top_n)."""
    from modeling import checkpoints

    config = hf_config(model.config)  # first: it refuses what Hugging Face's XLNet cannot hold
    if isinstance(model, XLNetBeamSpanQA):
        entries = hf_entries(model.config, heads=False) + hf_qa_head_entries(model.config)
        config |= {"architectures": ["XLNetForQuestionAnswering"], "start_n_top": model.top_n,
                   "end_n_top": model.top_n}  # fmt: skip
    else:
        entries = hf_entries(model.config)
    arrays = checkpoints.export_arrays(model, entries)
    return checkpoints.write_hf_files(output_dir, arrays, config)


# ---------------------------------------------------------------------------------------------
# Classifier inputs, laid out as XLNet's run_classifier packs them
# ---------------------------------------------------------------------------------------------

# Segment ids of the released classifier_utils.py: text A, text B, the <cls> token, padding.
SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD = 0, 1, 2, 4


def pack_classifier_ids(
    ids_a: list[int], ids_b: list[int] | None, max_seq_length: int, sep_id: int, cls_id: int
):
    """`a <sep> <cls>` or `a <sep> b <sep> <cls>`, left padded to max_seq_length, the layout of
    the released XLNet classifier (its <cls> is last, where XLNetClassifier reads the summary).

    A pair too long loses tokens from the longer text first (glue.truncate_pair, as BERT's
    packing); a single text loses its end. Each <sep> takes its text's segment id, <cls> has
    SEG_ID_CLS and padding SEG_ID_PAD with id 0 and input_mask 0 (1 marks real tokens here, not
    XLNet's inverted mask). Returns (input_ids, input_mask, segment_ids) lists of
    max_seq_length ints and whether tokens were dropped.
    """
    specials = 2 if ids_b is None else 3
    if max_seq_length < specials + 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for a text")
    if ids_b is None:
        a, b = list(ids_a[: max_seq_length - specials]), []
    else:
        a, b = glue.truncate_pair(list(ids_a), list(ids_b), max_seq_length - specials)
    ids = [*a, sep_id]
    segments = [SEG_ID_A] * (len(a) + 1)
    if ids_b is not None:
        ids += [*b, sep_id]
        segments += [SEG_ID_B] * (len(b) + 1)
    ids.append(cls_id)
    segments.append(SEG_ID_CLS)
    pad = max_seq_length - len(ids)
    truncated = len(a) + len(b) < len(ids_a) + len(ids_b or [])
    return [0] * pad + ids, [0] * pad + [1] * len(ids), [SEG_ID_PAD] * pad + segments, truncated
