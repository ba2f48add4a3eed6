"""Checkpoint conversion: explicit name maps between Cloze and the formats people hold, and exports.

Formats read and written:
  tf1_bert  google-research/bert `bert_model.ckpt` (name-based TF1 checkpoint: `bert/`, `cls/`)
  tf1_albert, tf1_electra  the original ALBERT and ELECTRA TF1 checkpoints (read only)
  hf        Hugging Face BertModel / BertForPreTraining: `model.safetensors` + `config.json`
  cloze     Cloze's own object-based tf.train.Checkpoint (`model=` a BertPretrainer, or anything
            with an `encoder`), as training/trainer.py writes it
  keras_hub a keras-hub preset folder of keras_hub.models.BertBackbone (encoder only)
and exported: a SavedModel whose signatures take raw strings (export_saved_model) and a `.keras`
file (export_keras).

How a conversion works. A *name map* is a list of `Entry`s, built from the config alone: each says
which source variables (with their expected shapes) make one Cloze variable, and how (copy,
transpose, or concatenate Q|K|V into Cloze's fused kernel). `convert_into` checks the whole map
before it assigns anything and fails, naming every offending variable, when a source variable is
missing, has another shape, or is left unused, or when a Cloze variable gets no value. The same
entries run backwards (`export_arrays`) to write a format. Optimizer state (TF1 `adam_m`, the
`optimizer/` part of a Cloze checkpoint) and non-weight buffers are the only things skipped
silently, and they are listed in the report.

Other families' original TF1 layouts are read the same way (an `*_entries(config, heads)` each,
sharing the block and embedding helpers): tf1_albert (google-research/albert: `bert/` with E-wide
embeddings, `bert/encoder/embedding_hidden_mapping_in`, one scope per shared block
`bert/encoder/transformer/group_g/inner_group_k/` with `attention_1/self/query`,
`ffn_1/intermediate/dense`, `LayerNorm`, `LayerNorm_1`) and tf1_electra (google-research/electra:
the discriminator as BERT's layout under `electra/` with `electra/embeddings_project` and no
pooler, the generator under `generator/` sharing `electra/embeddings`, `generator_predictions/`,
`discriminator_predictions/dense` and `dense_1`). Both are read only (--from), into Cloze's
checkpoint or `.keras` file.

Shapes: H hidden, I intermediate, V vocab, T type vocab, P positions, N heads, D head depth.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from data_prep.errors import InputError, input_error

# modeling.bert (and with it Keras and TensorFlow) is imported inside the functions that need it,
# so the command line checks paths and refuses a bad output folder in a blink.
if TYPE_CHECKING:
    from modeling import bert

# ---------------------------------------------------------------------------------------------
# Name-map entries
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    """One Cloze variable and the source variables it is made of.

    to_cloze(list of source arrays, in `sources` order) -> the Cloze array;
    from_cloze(Cloze array) -> list of source arrays. Both are exact (copies, transposes,
    concatenations), so a round trip through any format is bit for bit.
    """

    target: str
    sources: tuple[str, ...]
    source_shapes: tuple[tuple[int, ...], ...]
    to_cloze: Callable
    from_cloze: Callable


def _copy(target: str, source: str, shape) -> Entry:
    return Entry(target, (source,), (tuple(shape),), lambda a: a[0], lambda x: [x])


def _transposed(target: str, source: str, shape) -> Entry:
    """A source stored as (out, in) (PyTorch nn.Linear, TF1 `output_weights`) for a Cloze (in, out)
    kernel; `shape` is the source's."""
    return Entry(target, (source,), (tuple(shape),), lambda a: a[0].T, lambda x: [x.T])


def _fused(target: str, sources: Iterable[str], shape, transpose: bool) -> Entry:
    """Q, K and V (each `shape`) concatenated on the last axis into Cloze's fused (H, 3H) kernel or
    (3H,) bias. The (3, N, D) order inside 3H is what layers.SelfAttention reshapes to."""
    sources = tuple(sources)

    def to_cloze(arrays):
        return np.concatenate([a.T if transpose else a for a in arrays], axis=-1)

    def from_cloze(x):
        parts = np.split(x, len(sources), axis=-1)
        return [p.T if transpose else p for p in parts]

    return Entry(target, sources, (tuple(shape),) * len(sources), to_cloze, from_cloze)


# ---------------------------------------------------------------------------------------------
# Cloze's side: the variables of an encoder and of the pre-training heads, by attribute path
# ---------------------------------------------------------------------------------------------


def _block_variables(block, path: str) -> dict:
    """A layers.TransformerBlock's variables under `path` (its attribute names)."""
    out = {}
    parts = {
        "attention/qkv": block.attention.qkv,
        "attention/output_dense": block.attention.output_dense,
        "intermediate": block.intermediate,
        "output_dense": block.output_dense,
    }
    for name, dense in parts.items():
        out[f"{path}/{name}/kernel"] = dense.kernel
        out[f"{path}/{name}/bias"] = dense.bias
    for name in ("attention_layer_norm", "output_layer_norm"):
        out[f"{path}/{name}/gamma"] = getattr(block, name).gamma
        out[f"{path}/{name}/beta"] = getattr(block, name).beta
    return out


def _embedding_variables(e, path: str = "encoder/embeddings") -> dict:
    """A bert.BertEmbeddings layer's variables."""
    return {
        f"{path}/word_embeddings": e.word_embeddings,
        f"{path}/token_type_embeddings": e.token_type_embeddings,
        f"{path}/position_embeddings": e.position_embeddings,
        f"{path}/layer_norm/gamma": e.layer_norm.gamma,
        f"{path}/layer_norm/beta": e.layer_norm.beta,
    }


def _dense_variables(dense, path: str) -> dict:
    if dense is None:  # an optional projection the config leaves out
        return {}
    return {f"{path}/kernel": dense.kernel, f"{path}/bias": dense.bias}


def _mlm_variables(head, path: str = "masked_lm") -> dict:
    """A heads.MaskedLMHead's variables."""
    return _dense_variables(head.transform, f"{path}/transform") | {
        f"{path}/layer_norm/gamma": head.layer_norm.gamma,
        f"{path}/layer_norm/beta": head.layer_norm.beta,
        f"{path}/output_bias": head.output_bias,
    }


def _albert_variables(model) -> dict:
    from modeling import albert

    encoder = model if isinstance(model, albert.AlbertEncoder) else model.encoder
    out = _embedding_variables(encoder.embeddings)
    out |= _dense_variables(
        encoder.embedding_hidden_mapping_in, "encoder/embedding_hidden_mapping_in"
    )
    for g, group in enumerate(encoder.groups):
        for k, block in enumerate(group.blocks):
            out |= _block_variables(block, f"encoder/group_{g}/inner_group_{k}")
    out |= _dense_variables(encoder.pooler, "encoder/pooler")
    if isinstance(model, albert.AlbertPretrainer):
        out |= _mlm_variables(model.masked_lm)
        out |= _dense_variables(model.next_sentence.dense, "next_sentence/dense")
    return out


def _electra_variables(model) -> dict:
    from modeling import electra

    pretrainer = isinstance(model, electra.ElectraPretrainer)
    out = {}
    for name in ("encoder", "generator") if pretrainer else ("encoder",):
        encoder = getattr(model, name) if pretrainer else model
        if name == "encoder":  # the generator's embeddings are these (shared)
            out |= _embedding_variables(encoder.embeddings)
        out |= _dense_variables(encoder.embeddings_project, f"{name}/embeddings_project")
        for n, block in enumerate(encoder.blocks):
            out |= _block_variables(block, f"{name}/layer_{n}")
    if pretrainer:
        out |= _mlm_variables(model.generator_predictions, "generator_predictions")
        head = model.discriminator_predictions
        out |= _dense_variables(head.dense, "discriminator_predictions/dense")
        out |= _dense_variables(head.dense_1, "discriminator_predictions/dense_1")
    return out


def cloze_variables(model) -> dict:
    """The variables of a model of any encoder family (BERT, ALBERT, ELECTRA; an encoder or its
    pretrainer) under their attribute paths from the model (`encoder/layer_0/attention/qkv/kernel`),
    the names a Cloze checkpoint holds under `model/`.

    Walks the attributes explicitly (not Keras' `v.path`, which holds layer names such as `output`
    rather than the attribute `output_dense` that checkpoints use), then checks that the walk found
    every trainable variable of the model, so a layer added later cannot be skipped silently.
    """
    from modeling import albert, bart, bert, electra, elmo, gpt, t5, xlnet

    if isinstance(model, elmo.ElmoBiLM):
        return elmo.bilm_variables(model)
    whole = (bart.BartModel, xlnet.XLNetPretrainer, xlnet.XLNetBeamSpanQA, gpt.GptLM, t5.T5Model)
    if isinstance(model, whole):
        # Their name maps (bart / xlnet / gpt / t5.hf_entries) use the Keras paths below the model
        # (`encoder_0/self_attn/query/kernel`, `encoder/layer_0/rel_attn/q`, `encoder/h_0/ln_1`).
        root = model.name + "/"
        out = {v.path[len(root) :]: v for v in model.weights if v.path.startswith(root)}
    elif isinstance(model, (albert.AlbertEncoder, albert.AlbertPretrainer)):
        out = _albert_variables(model)
    elif isinstance(model, (electra.ElectraEncoder, electra.ElectraPretrainer)):
        out = _electra_variables(model)
    else:
        encoder = model if isinstance(model, bert.BertEncoder) else model.encoder
        out = _embedding_variables(encoder.embeddings)
        for n, block in enumerate(encoder.blocks):
            out |= _block_variables(block, f"encoder/layer_{n}")
        out |= _dense_variables(encoder.pooler, "encoder/pooler")
        if isinstance(model, bert.BertPretrainer):
            out |= _mlm_variables(model.masked_lm)
            out |= _dense_variables(model.next_sentence.dense, "next_sentence/dense")
    walked = {id(v) for v in out.values()}
    missed = [v.path for v in model.trainable_variables if id(v) not in walked]
    if missed:
        raise RuntimeError(f"cloze_variables does not know these model variables: {missed}")
    return out


def build_model(config: bert.BertConfig, heads: bool):
    """A built pretrainer (heads=True) or encoder of the config's family (a BertConfig,
    AlbertConfig or ElectraConfig), ready to take converted weights."""
    from modeling import albert, bert, electra

    pretrainer, encoder = {
        albert.AlbertConfig: (albert.AlbertPretrainer, albert.AlbertEncoder),
        electra.ElectraConfig: (electra.ElectraPretrainer, electra.ElectraEncoder),
    }.get(type(config), (bert.BertPretrainer, bert.BertEncoder))
    model = pretrainer(config) if heads else encoder(config)
    model.build()
    return model


def has_heads(model) -> bool:
    """Whether `model` is a pretrainer (it holds its encoder as `encoder`), not a bare encoder."""
    return hasattr(model, "encoder")


# ---------------------------------------------------------------------------------------------
# google-research/bert TF1 names
# ---------------------------------------------------------------------------------------------

# Present in a checkpoint with pre-training heads (run_pretraining.py's `cls/` scope).
TF1_HEAD_MARKERS = ("cls/predictions/output_bias", "cls/seq_relationship/output_weights")


# Each Cloze TransformerBlock part and its variable scope inside one original TF1 layer: BERT's
# (modeling.py transformer_model; ELECTRA's is the same) and ALBERT's (its attention_ffn_block).
TF1_BERT_BLOCK = {
    "qkv": "attention/self/{}",
    "attention_output": "attention/output/dense",
    "attention_norm": "attention/output/LayerNorm",
    "intermediate": "intermediate/dense",
    "output": "output/dense",
    "output_norm": "output/LayerNorm",
}
TF1_ALBERT_BLOCK = {
    "qkv": "attention_1/self/{}",
    "attention_output": "attention_1/output/dense",
    "attention_norm": "LayerNorm",
    "intermediate": "ffn_1/intermediate/dense",
    "output": "ffn_1/intermediate/output/dense",
    "output_norm": "LayerNorm_1",
}


def _tf1_block_entries(dst: str, src: str, h: int, i: int, names: dict) -> list[Entry]:
    """One Transformer block: Cloze `dst` (attribute path) from TF1 scope `src`; Q, K and V
    fused into Cloze's (H, 3H) kernel, the rest copied ((in, out) kernels in both)."""
    qkv = [f"{src}/{names['qkv'].format(part)}" for part in ("query", "key", "value")]
    out_dense, att_norm = f"{src}/{names['attention_output']}", f"{src}/{names['attention_norm']}"
    inter, output, norm = (f"{src}/{names[k]}" for k in ("intermediate", "output", "output_norm"))
    return [
        _fused(f"{dst}/attention/qkv/kernel", [f"{q}/kernel" for q in qkv], (h, h), False),
        _fused(f"{dst}/attention/qkv/bias", [f"{q}/bias" for q in qkv], (h,), False),
        _copy(f"{dst}/attention/output_dense/kernel", f"{out_dense}/kernel", (h, h)),
        _copy(f"{dst}/attention/output_dense/bias", f"{out_dense}/bias", (h,)),
        _copy(f"{dst}/attention_layer_norm/gamma", f"{att_norm}/gamma", (h,)),
        _copy(f"{dst}/attention_layer_norm/beta", f"{att_norm}/beta", (h,)),
        _copy(f"{dst}/intermediate/kernel", f"{inter}/kernel", (h, i)),
        _copy(f"{dst}/intermediate/bias", f"{inter}/bias", (i,)),
        _copy(f"{dst}/output_dense/kernel", f"{output}/kernel", (i, h)),
        _copy(f"{dst}/output_dense/bias", f"{output}/bias", (h,)),
        _copy(f"{dst}/output_layer_norm/gamma", f"{norm}/gamma", (h,)),
        _copy(f"{dst}/output_layer_norm/beta", f"{norm}/beta", (h,)),
    ]


def _embedding_tables(config, width: int, name: Callable[[str], str], dst: str) -> list:
    """The word, token-type and position tables (width E); `name(table)` is each one's source
    name in the format."""
    c = config
    rows = {
        "word_embeddings": c.vocab_size,
        "token_type_embeddings": c.type_vocab_size,
        "position_embeddings": c.max_position_embeddings,
    }
    return [_copy(f"{dst}/{table}", name(table), (n, width)) for table, n in rows.items()]


def _tf1_embedding_entries(config, width: int, scope: str, dst="encoder/embeddings") -> list:
    """The word, segment and position tables (width E) and their LayerNorm under `scope`."""
    return _embedding_tables(config, width, lambda t: f"{scope}/{t}", dst) + [
        _copy(f"{dst}/layer_norm/gamma", f"{scope}/LayerNorm/gamma", (width,)),
        _copy(f"{dst}/layer_norm/beta", f"{scope}/LayerNorm/beta", (width,)),
    ]


def _tf1_dense_entries(dst: str, src: str, n_in: int, n_out: int) -> list[Entry]:
    return [
        _copy(f"{dst}/kernel", f"{src}/kernel", (n_in, n_out)),
        _copy(f"{dst}/bias", f"{src}/bias", (n_out,)),
    ]


def _tf1_mlm_entries(dst: str, src: str, h: int, e: int, v: int, dense: str, norm: str) -> list:
    """The MLM head: transform H -> E (scope `dense`), its LayerNorm (`norm`), the output bias."""
    return _tf1_dense_entries(f"{dst}/transform", f"{src}/{dense}", h, e) + [
        _copy(f"{dst}/layer_norm/gamma", f"{src}/{norm}/gamma", (e,)),
        _copy(f"{dst}/layer_norm/beta", f"{src}/{norm}/beta", (e,)),
        _copy(f"{dst}/output_bias", f"{src}/output_bias", (v,)),
    ]


def _tf1_nsp_entries(h: int) -> list[Entry]:
    # The original stores the 2-way classifier as output_weights (2, H): transposed here.
    return [
        _transposed("next_sentence/dense/kernel", "cls/seq_relationship/output_weights", (2, h)),
        _copy("next_sentence/dense/bias", "cls/seq_relationship/output_bias", (2,)),
    ]


def tf1_bert_entries(config: bert.BertConfig, heads: bool, scope: str = "bert") -> list[Entry]:
    """google-research/bert modeling.py's variable names (scope `bert`) onto Cloze's.

    Kernels are (in, out) in both, so only Q|K|V is reshaped (fused) and the NSP
    `output_weights`, which the original stores as (2, H), is transposed.
    """
    c = config
    h, i, v = c.hidden_size, c.intermediate_size, c.vocab_size
    out = _tf1_embedding_entries(c, h, f"{scope}/embeddings")
    for n in range(c.num_hidden_layers):
        src = f"{scope}/encoder/layer_{n}"
        out += _tf1_block_entries(f"encoder/layer_{n}", src, h, i, TF1_BERT_BLOCK)
    out += _tf1_dense_entries("encoder/pooler", f"{scope}/pooler/dense", h, h)
    if heads:
        out += _tf1_mlm_entries(
            "masked_lm", "cls/predictions", h, h, v, "transform/dense", "transform/LayerNorm"
        )
        out += _tf1_nsp_entries(h)
    return out


def tf1_albert_entries(config, heads: bool) -> list[Entry]:
    """google-research/albert's names (modeling.py, run_pretraining.py) onto an AlbertEncoder or
    AlbertPretrainer: BERT's scopes with E-wide embeddings, `embedding_hidden_mapping_in` (only
    when E != H, as the original creates it), and one scope per shared block,
    `bert/encoder/transformer/group_g/inner_group_k` (TF1_ALBERT_BLOCK names inside)."""
    c = config
    e, h, i, v = c.embedding_size, c.hidden_size, c.intermediate_size, c.vocab_size
    out = _tf1_embedding_entries(c, e, "bert/embeddings")
    if e != h:
        out += _tf1_dense_entries(
            "encoder/embedding_hidden_mapping_in", "bert/encoder/embedding_hidden_mapping_in", e, h
        )
    for g in range(c.num_hidden_groups):
        for k in range(c.inner_group_num):
            src = f"bert/encoder/transformer/group_{g}/inner_group_{k}"
            out += _tf1_block_entries(
                f"encoder/group_{g}/inner_group_{k}", src, h, i, TF1_ALBERT_BLOCK
            )
    out += _tf1_dense_entries("encoder/pooler", "bert/pooler/dense", h, h)
    if heads:
        out += _tf1_mlm_entries(
            "masked_lm", "cls/predictions", h, e, v, "transform/dense", "transform/LayerNorm"
        )
        out += _tf1_nsp_entries(h)
    return out


def tf1_electra_entries(config, heads: bool) -> list[Entry]:
    """google-research/electra's names (model/modeling.py, run_pretraining.py) onto an
    ElectraEncoder (the discriminator) or ElectraPretrainer.

    The discriminator is BERT's layout under `electra/` with E-wide embeddings, an
    `electra/embeddings_project` when E != H, and no pooler (the original has none). With heads:
    the generator under `generator/` (its embeddings are the shared `electra/embeddings`, the
    original's default untied_generator_embeddings=False; a `generator/embeddings_project` when
    E != H_g), `generator_predictions/{dense,LayerNorm,output_bias}` and
    `discriminator_predictions/{dense,dense_1}`.
    """
    c = config
    e, h, v = c.embedding_size, c.hidden_size, c.vocab_size
    out = _tf1_embedding_entries(c, e, "electra/embeddings")
    parts = [("encoder", "electra", c)]
    if heads:
        parts.append(("generator", "generator", c.generator_config()))
    for dst, scope, part in parts:
        hp = part.hidden_size
        if e != hp:
            out += _tf1_dense_entries(
                f"{dst}/embeddings_project", f"{scope}/embeddings_project", e, hp
            )
        for n in range(part.num_hidden_layers):
            src = f"{scope}/encoder/layer_{n}"
            out += _tf1_block_entries(
                f"{dst}/layer_{n}", src, hp, part.intermediate_size, TF1_BERT_BLOCK
            )
    if heads:
        hg = c.generator_config().hidden_size
        out += _tf1_mlm_entries(
            "generator_predictions", "generator_predictions", hg, e, v, "dense", "LayerNorm"
        )
        d = "discriminator_predictions"
        out += _tf1_dense_entries(f"{d}/dense", f"{d}/dense", h, h)
        out += _tf1_dense_entries(f"{d}/dense_1", f"{d}/dense_1", h, 1)
    return out


# Optimizer state and counters that original training runs leave in a checkpoint: the original
# AdamWeightDecayOptimizer's `<var>/adam_m` and `<var>/adam_v` slots, tf.train.AdamOptimizer's
# `<var>/Adam` and `<var>/Adam_1`, LAMB's `lamb_m` / `lamb_v` (ALBERT), the step counter and the
# loss-scale state of mixed-precision runs. Not weights: listed in the report, never converted.
_TF1_TRAINING_STATE = re.compile(
    r"(^|/)(adam_m|adam_v|Adam|Adam_1|lamb_m|lamb_v|Momentum)$|^(global_step|good_steps|"
    r"loss_scale|current_loss_scale)$"
)


def tf1_training_state(name: str) -> bool:
    return bool(_TF1_TRAINING_STATE.search(name))


# ---------------------------------------------------------------------------------------------
# Hugging Face names and config.json
# ---------------------------------------------------------------------------------------------

HF_HEAD_MARKERS = ("cls.predictions.bias", "cls.seq_relationship.weight")
# Tied copies Hugging Face may store: the MLM decoder is the word embedding (and its bias the
# head's bias), as Cloze's MaskedLMHead, so they are checked equal and not converted.
_HF_TIED = {
    "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def hf_prefix(names: Iterable[str]) -> str:
    """`bert.` for a BertForPreTraining / BertFor* file, `` for a bare BertModel."""
    return "bert." if any(n.startswith("bert.") for n in names) else ""


# Each Cloze TransformerBlock part and its name inside one Hugging Face layer: BertLayer's (also
# ELECTRA's and RoBERTa's) and AlbertLayer's.
HF_DISTILBERT_BLOCK = {
    "qkv": "attention.{}",
    "qkv_parts": ("q_lin", "k_lin", "v_lin"),
    "attention_output": "attention.out_lin",
    "attention_norm": "sa_layer_norm",
    "intermediate": "ffn.lin1",
    "output": "ffn.lin2",
    "output_norm": "output_layer_norm",
}
HF_BERT_BLOCK = {
    "qkv": "attention.self.{}",
    "attention_output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
    "output_norm": "output.LayerNorm",
}
HF_ALBERT_BLOCK = {
    "qkv": "attention.{}",
    "attention_output": "attention.dense",
    "attention_norm": "attention.LayerNorm",
    "intermediate": "ffn",
    "output": "ffn_output",
    "output_norm": "full_layer_layer_norm",
}


def _hf_linear_entries(dst: str, src: str, n_in: int, n_out: int) -> list[Entry]:
    """An nn.Linear `src` ((out, in) weight, transposed) onto a Cloze Dense `dst`."""
    return [
        _transposed(f"{dst}/kernel", f"{src}.weight", (n_out, n_in)),
        _copy(f"{dst}/bias", f"{src}.bias", (n_out,)),
    ]


def _hf_norm_entries(dst: str, src: str, width: int) -> list[Entry]:
    """An nn.LayerNorm (`weight`, `bias`) onto a Keras LayerNormalization (`gamma`, `beta`)."""
    return [
        _copy(f"{dst}/gamma", f"{src}.weight", (width,)),
        _copy(f"{dst}/beta", f"{src}.bias", (width,)),
    ]


def _hf_block_entries(dst: str, src: str, h: int, i: int, names: dict) -> list[Entry]:
    """One Transformer block: Cloze `dst` from Hugging Face layer `src`; Q, K and V ((out, in)
    each) transposed and fused into Cloze's (H, 3H) kernel. names["qkv_parts"] (default query,
    key, value) fill names["qkv"]."""
    parts = names.get("qkv_parts", ("query", "key", "value"))
    qkv = [f"{src}.{names['qkv'].format(part)}" for part in parts]
    return [
        _fused(f"{dst}/attention/qkv/kernel", [f"{q}.weight" for q in qkv], (h, h), True),
        _fused(f"{dst}/attention/qkv/bias", [f"{q}.bias" for q in qkv], (h,), False),
        *_hf_linear_entries(
            f"{dst}/attention/output_dense", f"{src}.{names['attention_output']}", h, h
        ),
        *_hf_norm_entries(f"{dst}/attention_layer_norm", f"{src}.{names['attention_norm']}", h),
        *_hf_linear_entries(f"{dst}/intermediate", f"{src}.{names['intermediate']}", h, i),
        *_hf_linear_entries(f"{dst}/output_dense", f"{src}.{names['output']}", i, h),
        *_hf_norm_entries(f"{dst}/output_layer_norm", f"{src}.{names['output_norm']}", h),
    ]


def _hf_embedding_entries(config, width: int, scope: str, dst="encoder/embeddings") -> list:
    """The word, token-type and position tables (width E) and their LayerNorm under `scope`."""
    return _embedding_tables(config, width, lambda t: f"{scope}.{t}.weight", dst) + (
        _hf_norm_entries(f"{dst}/layer_norm", f"{scope}.LayerNorm", width)
    )


def hf_bert_entries(config: bert.BertConfig, heads: bool, prefix: str = "") -> list[Entry]:
    """Hugging Face BertModel (`prefix=""`) or BertForPreTraining (`prefix="bert."`) names.

    nn.Linear stores weights as (out, in), so every dense kernel is transposed; LayerNorm's
    `weight` / `bias` are Keras' `gamma` / `beta`.
    """
    c = config
    h, i, v = c.hidden_size, c.intermediate_size, c.vocab_size
    out = _hf_embedding_entries(c, h, f"{prefix}embeddings")
    for n in range(c.num_hidden_layers):
        out += _hf_block_entries(
            f"encoder/layer_{n}", f"{prefix}encoder.layer.{n}", h, i, HF_BERT_BLOCK
        )
    out += _hf_linear_entries("encoder/pooler", f"{prefix}pooler.dense", h, h)
    if heads:
        p = "cls.predictions"
        out += [
            *_hf_linear_entries("masked_lm/transform", f"{p}.transform.dense", h, h),
            *_hf_norm_entries("masked_lm/layer_norm", f"{p}.transform.LayerNorm", h),
            _copy("masked_lm/output_bias", f"{p}.bias", (v,)),
            _transposed("next_sentence/dense/kernel", "cls.seq_relationship.weight", (2, h)),
            _copy("next_sentence/dense/bias", "cls.seq_relationship.bias", (2,)),
        ]
    return out


def hf_buffer(name: str) -> bool:
    # `embeddings.position_ids` is a registered buffer (arange(512)) older transformers saved with
    # the weights; it is not a parameter.
    return name.endswith("embeddings.position_ids")


# Hugging Face's `hidden_act` strings -> Cloze's (modeling/layers.ACTIVATIONS). HF "gelu" is the
# exact erf form; "gelu_new" and "gelu_pytorch_tanh" are the tanh approximation, which is what the
# original TF1 code and Cloze call "gelu".
HF_TO_CLOZE_ACTIVATION = {
    "gelu": "gelu_exact",
    "gelu_python": "gelu_exact",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "relu": "relu",
    "tanh": "tanh",
    "linear": "linear",
}
CLOZE_TO_HF_ACTIVATION = {
    "gelu": "gelu_new",
    "gelu_new": "gelu_new",
    "gelu_exact": "gelu",
    "relu": "relu",
    "tanh": "tanh",
    "linear": "linear",
}
# Keys of a Hugging Face config that change the computation, with the only value Cloze computes.
# layer_norm_eps: fixed at the original BERT's 1e-12 for ALBERT and ELECTRA; a BERT or RoBERTa
# config reads it into BertConfig.layer_norm_eps (RoBERTa's checkpoints use 1e-5).
_HF_FIXED = {
    "model_type": "bert",
    "layer_norm_eps": 1e-12,
    "position_embedding_type": "absolute",
    "is_decoder": False,
    "add_cross_attention": False,
}
# Keys of a Hugging Face config that do not change what the encoder computes (bookkeeping,
# generation and fine-tuning settings PretrainedConfig writes).
_HF_IGNORED = frozenset(
    """_name_or_path architectures transformers_version torch_dtype dtype gradient_checkpointing
    use_cache pad_token_id bos_token_id eos_token_id sep_token_id decoder_start_token_id
    tie_word_embeddings classifier_dropout id2label label2id num_labels problem_type
    finetuning_task output_attentions output_hidden_states return_dict torchscript
    chunk_size_feed_forward pruned_heads tokenizer_class prefix task_specific_params
    directionality pooler_fc_size pooler_num_attention_heads pooler_num_fc_layers
    pooler_size_per_head pooler_type use_return_dict""".split()
)


def check_hf_fixed(values, fixed: dict, source: str, family: str) -> None:
    """Refuses a Hugging Face config.json that is no JSON object, or whose keys of `fixed` (those
    that change the computation) hold other than the one value Cloze's `family` computes."""
    if not isinstance(values, dict):
        raise input_error(source, "a JSON object", type(values).__name__)
    for key, want in fixed.items():
        if key in values and values[key] != want:
            raise input_error(
                f"{source}: {key}", f"{want!r} (the only value Cloze's {family} computes)",
                repr(values[key]),
            )  # fmt: skip


def hf_config_to_bert_config(values: dict, source: str = "config.json") -> bert.BertConfig:
    """A Hugging Face BERT `config.json` (as a dict) -> BertConfig; errors name `source` and key.

    A key that changes the computation and that Cloze does not implement (e.g. relative position
    embeddings, another layer-norm epsilon) is an error, as is an unknown key: a config that
    computes something else must not load as if it were BERT. Other families:
    hf_config_to_config.
    """
    if isinstance(values, dict) and values.get("model_type", "bert") != "bert":
        raise input_error(
            f"{source}: model_type",
            "'bert' (the only value Cloze's BERT computes)",
            repr(values["model_type"]),
        )
    return hf_config_to_config(values, source)


def bert_config_to_hf_config(config: bert.BertConfig, heads: bool) -> dict:
    """BertConfig -> a Hugging Face `config.json` dict that transformers' BertModel /
    BertForPreTraining loads with the same computation."""
    values = config.to_dict()
    values["hidden_act"] = CLOZE_TO_HF_ACTIVATION[config.hidden_act]
    return {
        "architectures": ["BertForPreTraining" if heads else "BertModel"],
        "model_type": "bert",
        **values,
        "layer_norm_eps": config.layer_norm_eps,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
    }


# Hugging Face model types Cloze reads and writes, and the keys of each family's config.json that
# do not change what the encoder computes, beyond _HF_IGNORED. RoBERTa's `pad_token_id` is read:
# its positions start at pad_token_id + 1 (BertConfig.position_offset).
HF_MODEL_TYPES = ("bert", "roberta", "albert", "electra")
_HF_FAMILY_IGNORED = {
    "bert": frozenset(),
    "roberta": frozenset(),
    "albert": frozenset({"classifier_dropout_prob"}),
    "electra": frozenset(
        {"summary_type", "summary_use_proj", "summary_activation", "summary_last_dropout"}
    ),
}
# ELECTRA's generator size is a pretraining hparam, not in a Hugging Face discriminator config:
# the original's defaults (ElectraConfig) are used, with a generator as wide as the
# discriminator when a quarter of it does not divide into 64-unit heads.
_ELECTRA_GENERATOR_FIELDS = ("generator_hidden_size", "generator_layers")


def hf_config_to_config(values: dict, source: str = "config.json"):
    """A Hugging Face `config.json` (as a dict) of model_type bert, roberta, albert or electra ->
    BertConfig (RoBERTa: with position_offset = pad_token_id + 1), AlbertConfig or ElectraConfig
    (the discriminator's; see _ELECTRA_GENERATOR_FIELDS); distilbert -> distilbert_config's
    BertConfig. Checks as hf_config_to_bert_config."""
    from modeling import albert, bert, electra

    if not isinstance(values, dict):
        raise input_error(source, "a JSON object", type(values).__name__)
    model_type = values.get("model_type", "bert")
    if model_type == "distilbert":
        return distilbert_config(values, source)
    if model_type not in HF_MODEL_TYPES:
        kinds = [*HF_MODEL_TYPES, "distilbert"]
        raise input_error(f"{source}: model_type", f"one of {kinds}", model_type)
    family = {"albert": albert.AlbertConfig, "electra": electra.ElectraConfig}.get(
        model_type, bert.BertConfig
    )
    own = {f.name for f in dataclasses.fields(family)}  # read into the config, not fixed
    for key, want in _HF_FIXED.items():
        if key != "model_type" and key not in own and key in values and values[key] != want:
            raise input_error(
                f"{source}: {key}",
                f"{want!r} (the only value Cloze's {model_type} computes)",
                repr(values[key]),
            )
    skipped = {"position_offset", *_ELECTRA_GENERATOR_FIELDS, *albert.AlbertConfig.OPTIONAL}
    fields = [f.name for f in dataclasses.fields(family) if f.name not in skipped]
    ignored = _HF_IGNORED | _HF_FAMILY_IGNORED[model_type]
    unknown = sorted(set(values) - set(fields) - set(_HF_FIXED) - ignored)
    if unknown:
        raise input_error(
            source,
            f"the keys of a Hugging Face {model_type} config",
            f"unknown key(s) {unknown}; remove them if they do not change the model",
        )
    act = values.get("hidden_act")
    if act not in HF_TO_CLOZE_ACTIVATION:
        raise input_error(
            f"{source}: hidden_act", f"one of {sorted(HF_TO_CLOZE_ACTIVATION)}", repr(act)
        )
    config = {k: values[k] for k in fields if k in values}
    config["hidden_act"] = HF_TO_CLOZE_ACTIVATION[act]
    if model_type == "roberta":
        pad = values.get("pad_token_id", 1)
        if not isinstance(pad, int) or pad < 0:
            raise input_error(f"{source}: pad_token_id", "a token id >= 0", repr(pad))
        config["position_offset"] = pad + 1  # positions are numbered from padding_idx + 1
    if model_type == "electra":
        config |= {"generator_hidden_size": 0.25, "generator_layers": 1.0}
        h = config.get("hidden_size", 0)
        quarter = int(round(h * 0.25))
        if quarter < 1 or quarter % electra.generator_heads(quarter):
            config["generator_hidden_size"] = 1.0
    return family.from_dict(config, source=source)


# A Hugging Face DistilBERT config.json's keys and the BertConfig fields they are; its other
# keys are task-head dropouts and bookkeeping (_HF_IGNORED).
_DISTILBERT_FIELDS = {
    "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size", "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings", "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob", "initializer_range": "initializer_range",
}  # fmt: skip
_DISTILBERT_IGNORED = frozenset({"qa_dropout", "seq_classif_dropout", "tie_weights_"})


def distilbert_config(values: dict, source: str = "config.json") -> bert.BertConfig:
    """A Hugging Face DistilBERT config.json -> the BertConfig that computes its encoder: BERT's
    post-LN layers without token types (type_vocab_size 2 whose rows load_hf_distilbert sets to
    zero, so segment ids change nothing, as in DistilBERT). `sinusoidal_pos_embds` may be either:
    the position table is in the weights. Unknown keys and other activations are errors."""
    from modeling import bert

    unknown = sorted(
        set(values) - set(_DISTILBERT_FIELDS) - _DISTILBERT_IGNORED - _HF_IGNORED
        - {"model_type", "activation", "sinusoidal_pos_embds"}
    )  # fmt: skip
    if unknown:
        raise input_error(
            source,
            "the keys of a Hugging Face distilbert config",
            f"unknown key(s) {unknown}; remove them if they do not change the model",
        )
    act = values.get("activation", "gelu")
    if act not in ("gelu", "relu"):
        raise input_error(f"{source}: activation", "'gelu' or 'relu'", repr(act))
    config = {field: values[key] for key, field in _DISTILBERT_FIELDS.items() if key in values}
    config["hidden_act"] = HF_TO_CLOZE_ACTIVATION[act]
    return bert.BertConfig.from_dict(config | {"type_vocab_size": 2}, source=source)


def hf_distilbert_entries(config: bert.BertConfig, prefix: str = "") -> list[Entry]:
    """Hugging Face DistilBertModel (`prefix=""`) or DistilBertFor* (`prefix="distilbert."`)
    names onto a BertEncoder (its pooler excepted: DistilBERT has none). The token-type table
    is `embeddings.token_type_embeddings.weight`, which the files lack: load_hf_distilbert
    supplies zeros under that name."""
    c = config
    h, i = c.hidden_size, c.intermediate_size
    out = _hf_embedding_entries(c, h, f"{prefix}embeddings")
    for n in range(c.num_hidden_layers):
        out += _hf_block_entries(
            f"encoder/layer_{n}", f"{prefix}transformer.layer.{n}", h, i, HF_DISTILBERT_BLOCK
        )
    return out


def config_to_hf_config(config, heads: bool) -> dict:
    """A Cloze config -> the Hugging Face `config.json` dict of the same computation: BERT,
    RoBERTa (a BertConfig with position_offset > 0: pad_token_id = offset - 1), ALBERT or ELECTRA
    (the discriminator's; electra_generator_hf_config gives the generator's)."""
    from modeling import albert, electra

    if isinstance(config, albert.AlbertConfig):
        values = {
            k: v for k, v in config.to_dict().items() if k not in albert.AlbertConfig.OPTIONAL
        }
        model_type, arch = "albert", "AlbertForPreTraining" if heads else "AlbertModel"
        pad = 0
    elif isinstance(config, electra.ElectraConfig):
        values = {k: v for k, v in config.to_dict().items() if k not in _ELECTRA_GENERATOR_FIELDS}
        model_type, arch = "electra", "ElectraForPreTraining" if heads else "ElectraModel"
        pad = 0
    elif config.position_offset:
        values = {k: v for k, v in config.to_dict().items() if k != "position_offset"}
        model_type, arch = "roberta", "RobertaForMaskedLM" if heads else "RobertaModel"
        pad = config.position_offset - 1
    else:
        return bert_config_to_hf_config(config, heads)
    values["hidden_act"] = CLOZE_TO_HF_ACTIVATION[config.hidden_act]
    return {
        "architectures": [arch],
        "model_type": model_type,
        **values,
        "layer_norm_eps": getattr(config, "layer_norm_eps", _HF_FIXED["layer_norm_eps"]),
        "position_embedding_type": "absolute",
        "pad_token_id": pad,
    }


def electra_generator_hf_config(config) -> dict:
    """The Hugging Face config.json of an ELECTRA pretrainer's generator (ElectraForMaskedLM):
    the generator's own sizes (ElectraConfig.generator_config) with the shared embedding width."""
    values = config_to_hf_config(config.generator_config(), heads=True)
    return values | {"architectures": ["ElectraForMaskedLM"]}


def hf_albert_entries(config, heads: bool, prefix: str = "") -> list[Entry]:
    """Hugging Face AlbertModel (`prefix=""`) or AlbertForPreTraining (`prefix="albert."`) names
    onto an AlbertEncoder or AlbertPretrainer. `encoder.embedding_hidden_mapping_in` maps only
    when E != H (Hugging Face always has it; load_hf_albert checks it is the identity otherwise);
    `predictions.*` is the MLM head (dense H -> E), `sop_classifier.classifier` the SOP head."""
    c = config
    e, h, i, v = c.embedding_size, c.hidden_size, c.intermediate_size, c.vocab_size
    out = _hf_embedding_entries(c, e, f"{prefix}embeddings")
    if e != h:
        out += _hf_linear_entries(
            "encoder/embedding_hidden_mapping_in",
            f"{prefix}encoder.embedding_hidden_mapping_in",
            e,
            h,
        )
    for g in range(c.num_hidden_groups):
        for k in range(c.inner_group_num):
            out += _hf_block_entries(
                f"encoder/group_{g}/inner_group_{k}",
                f"{prefix}encoder.albert_layer_groups.{g}.albert_layers.{k}",
                h,
                i,
                HF_ALBERT_BLOCK,
            )
    out += _hf_linear_entries("encoder/pooler", f"{prefix}pooler", h, h)
    if heads:
        out += [
            *_hf_linear_entries("masked_lm/transform", "predictions.dense", h, e),
            *_hf_norm_entries("masked_lm/layer_norm", "predictions.LayerNorm", e),
            _copy("masked_lm/output_bias", "predictions.bias", (v,)),
            *_hf_linear_entries("next_sentence/dense", "sop_classifier.classifier", h, 2),
        ]
    return out


# Where save_hf puts an ELECTRA pretrainer's generator: its own Hugging Face folder (as the
# released google/electra-*-generator), its variables named with this prefix in the name map.
HF_GENERATOR_DIR = "generator"


def hf_electra_entries(config, heads: bool, prefix: str = "") -> list[Entry]:
    """Hugging Face ElectraModel (`prefix=""`) or ElectraForPreTraining (`prefix="electra."`)
    names onto an ElectraEncoder (the discriminator: BERT's layer names, E-wide embeddings,
    `embeddings_project` when E != H, no pooler). With heads (an ElectraPretrainer), also the
    discriminator head (`discriminator_predictions.dense`, `dense_prediction`) and the
    generator as an ElectraForMaskedLM, its names under `generator/` (HF_GENERATOR_DIR)."""
    c = config
    e, h, i, v = c.embedding_size, c.hidden_size, c.intermediate_size, c.vocab_size
    out = _hf_embedding_entries(c, e, f"{prefix}embeddings")
    if e != h:
        out += _hf_linear_entries("encoder/embeddings_project", f"{prefix}embeddings_project", e, h)
    for n in range(c.num_hidden_layers):
        out += _hf_block_entries(
            f"encoder/layer_{n}", f"{prefix}encoder.layer.{n}", h, i, HF_BERT_BLOCK
        )
    if heads:
        d = "discriminator_predictions"
        out += _hf_linear_entries(f"{d}/dense", f"{d}.dense", h, h)
        out += _hf_linear_entries(f"{d}/dense_1", f"{d}.dense_prediction", h, 1)
        g = c.generator_config()
        hg, gp = g.hidden_size, f"{HF_GENERATOR_DIR}/electra."
        if e != hg:
            out += _hf_linear_entries(
                "generator/embeddings_project", f"{gp}embeddings_project", e, hg
            )
        for n in range(g.num_hidden_layers):
            out += _hf_block_entries(
                f"generator/layer_{n}",
                f"{gp}encoder.layer.{n}",
                hg,
                g.intermediate_size,
                HF_BERT_BLOCK,
            )
        p = f"{HF_GENERATOR_DIR}/generator_predictions"
        out += [
            *_hf_linear_entries("generator_predictions/transform", f"{p}.dense", hg, e),
            *_hf_norm_entries("generator_predictions/layer_norm", f"{p}.LayerNorm", e),
            _copy(
                "generator_predictions/output_bias",
                f"{HF_GENERATOR_DIR}/generator_lm_head.bias",
                (v,),
            ),
        ]
    return out


def hf_roberta_entries(config: bert.BertConfig, heads: bool, prefix: str = "") -> list[Entry]:
    """Hugging Face RobertaModel (`prefix=""`) or RobertaForMaskedLM (`prefix="roberta."`) names:
    BERT's encoder names (the position table is the whole table, offset rows included), the
    pooler kept under `pooler.dense` also with heads (transformers drops it with a warning), and
    `lm_head.{dense,layer_norm,bias}` as the MLM head. RoBERTa has no next-sentence head."""
    h, v = config.hidden_size, config.vocab_size
    out = [
        e
        for e in hf_bert_entries(config, heads=False, prefix=prefix)
        if not e.target.startswith(("masked_lm/", "next_sentence/"))
    ]
    if heads:
        out += [
            *_hf_linear_entries("masked_lm/transform", "lm_head.dense", h, h),
            *_hf_norm_entries("masked_lm/layer_norm", "lm_head.layer_norm", h),
            _copy("masked_lm/output_bias", "lm_head.bias", (v,)),
        ]
    return out


# ---------------------------------------------------------------------------------------------
# keras-hub's BertBackbone (keras_hub.models.BertBackbone presets)
# ---------------------------------------------------------------------------------------------

# Cloze activations keras-hub's BertBackbone computes exactly: its TransformerEncoder layers are
# built with keras.activations.gelu(approximate=True), the tanh approximation, which is the
# original TF1 BERT's and Cloze's "gelu". Its layer norms use epsilon 1e-12 as Cloze's.
KERAS_HUB_ACTIVATIONS = ("gelu", "gelu_new")


def _reshaped(target: str, source: str, shape, cloze_shape) -> Entry:
    """A source of `shape` that is the Cloze variable of `cloze_shape` reshaped (no reordering:
    keras-hub's per-head (H, N, D) kernels are Cloze's (H, N*D) columns)."""
    shape, cloze_shape = tuple(shape), tuple(cloze_shape)
    return Entry(
        target,
        (source,),
        (shape,),
        lambda a: a[0].reshape(cloze_shape),
        lambda x: [x.reshape(shape)],
    )


def _fused_reshaped(target: str, sources: Iterable[str], shape) -> Entry:
    """Q, K and V (each `shape`, heads on their own axes) into Cloze's fused (H, 3H) kernel or
    (3H,) bias: each is flattened to (..., H) and concatenated on the last axis."""
    sources, shape = tuple(sources), tuple(shape)
    flat = (shape[0], -1) if len(shape) == 3 else (-1,)  # (H, N, D) -> (H, H); (N, D) -> (H,)

    def to_cloze(arrays):
        return np.concatenate([a.reshape(flat) for a in arrays], axis=-1)

    def from_cloze(x):
        return [p.reshape(shape) for p in np.split(x, len(sources), axis=-1)]

    return Entry(target, sources, (shape,) * len(sources), to_cloze, from_cloze)


def keras_hub_entries(config: bert.BertConfig) -> list[Entry]:
    """keras_hub.models.BertBackbone's variable paths (`v.path`) onto Cloze's encoder.

    keras-hub keeps attention kernels per head: query/key/value (H, N, D) and biases (N, D), the
    attention output (N, D, H); every other kernel is (in, out) as Cloze's. A BertBackbone has no
    pre-training heads, so only the encoder maps.
    """
    c = config
    h, i, v = c.hidden_size, c.intermediate_size, c.vocab_size
    n = c.num_attention_heads
    d = h // n
    out = [
        _copy("encoder/embeddings/word_embeddings", "token_embedding/embeddings", (v, h)),
        _copy(
            "encoder/embeddings/token_type_embeddings",
            "segment_embedding/embeddings",
            (c.type_vocab_size, h),
        ),
        _copy(
            "encoder/embeddings/position_embeddings",
            "position_embedding/embeddings",
            (c.max_position_embeddings, h),
        ),
        _copy("encoder/embeddings/layer_norm/gamma", "embeddings_layer_norm/gamma", (h,)),
        _copy("encoder/embeddings/layer_norm/beta", "embeddings_layer_norm/beta", (h,)),
    ]
    for k in range(c.num_hidden_layers):
        src, dst = f"transformer_layer_{k}", f"encoder/layer_{k}"
        att = f"{src}/self_attention_layer"
        qkv = [f"{att}/{part}" for part in ("query", "key", "value")]
        out += [
            _fused_reshaped(f"{dst}/attention/qkv/kernel", [f"{q}/kernel" for q in qkv], (h, n, d)),
            _fused_reshaped(f"{dst}/attention/qkv/bias", [f"{q}/bias" for q in qkv], (n, d)),
            _reshaped(
                f"{dst}/attention/output_dense/kernel",
                f"{att}/attention_output/kernel",
                (n, d, h),
                (h, h),
            ),
            _copy(f"{dst}/attention/output_dense/bias", f"{att}/attention_output/bias", (h,)),
            _copy(
                f"{dst}/attention_layer_norm/gamma", f"{src}/self_attention_layer_norm/gamma", (h,)
            ),
            _copy(
                f"{dst}/attention_layer_norm/beta", f"{src}/self_attention_layer_norm/beta", (h,)
            ),
            _copy(
                f"{dst}/intermediate/kernel", f"{src}/feedforward_intermediate_dense/kernel", (h, i)
            ),
            _copy(f"{dst}/intermediate/bias", f"{src}/feedforward_intermediate_dense/bias", (i,)),
            _copy(f"{dst}/output_dense/kernel", f"{src}/feedforward_output_dense/kernel", (i, h)),
            _copy(f"{dst}/output_dense/bias", f"{src}/feedforward_output_dense/bias", (h,)),
            _copy(f"{dst}/output_layer_norm/gamma", f"{src}/feedforward_layer_norm/gamma", (h,)),
            _copy(f"{dst}/output_layer_norm/beta", f"{src}/feedforward_layer_norm/beta", (h,)),
        ]
    out += [
        _copy("encoder/pooler/kernel", "pooled_dense/kernel", (h, h)),
        _copy("encoder/pooler/bias", "pooled_dense/bias", (h,)),
    ]
    return out


def check_keras_hub_config(
    config: bert.BertConfig, where: str, allow_gelu_approximation: bool = False
) -> list[str]:
    """Refuses a config keras-hub's BertBackbone cannot compute; returns notes to print.

    BertBackbone has no activation argument: it always computes the tanh GELU. A model trained
    with the exact erf GELU (hidden_act="gelu_exact", as Hugging Face checkpoints) is refused
    unless allow_gelu_approximation, and then computes slightly different numbers. Its single
    `dropout` stands for both of Cloze's dropout rates (training only; inference is unchanged).
    """
    act = config.hidden_act
    notes = []
    if act not in KERAS_HUB_ACTIVATIONS:
        if act == "gelu_exact" and allow_gelu_approximation:
            notes.append(
                "WARNING: hidden_act=gelu_exact written into keras-hub's BertBackbone, which "
                "computes the tanh approximation of GELU: its outputs differ slightly from this "
                "model's (--allow_gelu_approximation)"
            )
        else:
            extra = (
                "; pass --allow_gelu_approximation to accept the tanh approximation"
                if act == "gelu_exact"
                else ""
            )
            raise input_error(
                f"{where}: hidden_act",
                f"one of {list(KERAS_HUB_ACTIVATIONS)} (the tanh GELU, the only activation "
                "keras-hub's BertBackbone computes)",
                f"{act!r}{extra}",
            )
    if config.hidden_dropout_prob != config.attention_probs_dropout_prob:
        notes.append(
            f"keras-hub's one dropout rate is hidden_dropout_prob={config.hidden_dropout_prob}; "
            f"attention_probs_dropout_prob={config.attention_probs_dropout_prob} is not kept "
            "(dropout acts only in training)"
        )
    return notes


def read_json(path) -> dict:
    """Reads a JSON file; errors name the file (and the line of a syntax error)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise input_error(str(path), "a JSON file", "no such file") from None
    except UnicodeDecodeError as e:
        raise input_error(str(path), "UTF-8 JSON", f"a bad byte at offset {e.start}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise input_error(f"{path}:{e.lineno}", "JSON", f"a syntax error ({e.msg})") from None


def read_any_config(path):
    """A config file in either field set: Hugging Face's `config.json` (it has `model_type`, or
    `layer_norm_eps` beside keys no Cloze config has; bert, roberta, distilbert, albert or
    electra) or the
    original names (bert_config.json, albert_config.json or an ELECTRA config; a Cloze
    BertConfig may hold layer_norm_eps too). Returns a BertConfig, AlbertConfig or
    ElectraConfig."""

    from modeling import albert, bert

    values = read_json(path)
    if isinstance(values, dict):
        own = {f.name for f in dataclasses.fields(bert.BertConfig)}
        keys = set(values)
        if "model_type" in keys or ("layer_norm_eps" in keys and not keys <= own):
            return hf_config_to_config(values, source=str(path))
    # The original field names: told apart by their keys (albert.encoder_config_from_dict).
    return albert.encoder_config_from_dict(values, source=str(path))


# ---------------------------------------------------------------------------------------------
# Sources: what a checkpoint holds, read lazily (shapes first, arrays only after the check)
# ---------------------------------------------------------------------------------------------


class Source:
    """A set of named arrays: `shapes` (name -> shape), `dtypes` (name -> str), `read(name)`.

    `label` names the file(s) in error messages.
    """

    label: str = ""
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]

    def read(self, name: str) -> np.ndarray:
        raise NotImplementedError


class ArraySource(Source):
    """In-memory arrays (a PyTorch state dict, tests)."""

    def __init__(self, arrays: dict[str, np.ndarray], label: str):
        self.arrays = arrays
        self.label = label
        self.shapes = {k: tuple(np.shape(a)) for k, a in arrays.items()}
        self.dtypes = {k: str(np.asarray(a).dtype) for k, a in arrays.items()}

    def read(self, name):
        return np.asarray(self.arrays[name])


def resolve_checkpoint_prefix(path, default_name: str | None = None) -> str:
    """A TF checkpoint prefix from a prefix or a folder (its `checkpoint` file, else
    `default_name`). Raises InputError naming what was looked for."""
    import tensorflow as tf

    path = str(path)
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        if default_name and os.path.exists(os.path.join(path, default_name + ".index")):
            return os.path.join(path, default_name)
        wanted = f"{default_name}.index or " if default_name else ""
        raise input_error(
            path, f"a folder holding a checkpoint ({wanted}a `checkpoint` file)", "none"
        )
    for suffix in (".index", ".meta"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    if re.search(r"\.data-\d{5}-of-\d{5}$", path):
        path = path[: path.rindex(".data-")]
    if not os.path.exists(path + ".index"):
        raise input_error(path, f"a checkpoint prefix (a file {path}.index)", "no such file")
    return path


class TFCheckpointSource(Source):
    """A name-based (TF1) checkpoint: variables by their graph names."""

    def __init__(self, prefix: str):
        import tensorflow as tf

        self.prefix = prefix
        self.label = prefix
        try:
            self.reader = tf.train.load_checkpoint(prefix)
        except (tf.errors.OpError, ValueError) as e:
            raise input_error(prefix, "a readable TensorFlow checkpoint", _tf_message(e)) from None
        self.shapes = {k: tuple(s) for k, s in self.reader.get_variable_to_shape_map().items()}
        self.dtypes = {k: d.name for k, d in self.reader.get_variable_to_dtype_map().items()}
        self.keys = {k: k for k in self.shapes}

    def read(self, name):
        import tensorflow as tf

        try:
            return self.reader.get_tensor(self.keys[name])
        except (tf.errors.OpError, IndexError, ValueError) as e:  # IndexError: data file cut short
            raise input_error(
                f"{self.prefix}.data-*", f"the value of {name}", _tf_message(e)
            ) from None


class ClozeCheckpointSource(TFCheckpointSource):
    """An object-based Cloze checkpoint, its variables named by attribute path from the root
    (`model/encoder/layer_0/attention/qkv/kernel`), read from the checkpoint's object graph.

    Only what hangs under `model` is exposed; the optimizer, step counter and data iterator are
    training state and counted in `training_state`.
    """

    def __init__(self, prefix: str, root: str = "model"):
        super().__init__(prefix)
        from tensorflow.core.protobuf import trackable_object_graph_pb2

        if "_CHECKPOINTABLE_OBJECT_GRAPH" not in self.shapes:
            raise input_error(
                prefix,
                "an object-based (TF2) Cloze checkpoint",
                "a name-based TF1 checkpoint; use --from=tf1_bert",
            )
        graph = trackable_object_graph_pb2.TrackableObjectGraph.FromString(
            self.reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
        )
        top = {c.local_name: c.node_id for c in graph.nodes[0].children}
        if root not in top:
            raise input_error(prefix, f"a checkpoint with a `{root}` object", f"only {sorted(top)}")
        paths: dict[int, str] = {}
        queue = [(top[root], root)]
        while queue:  # breadth first, so each variable gets its shortest attribute path
            node_id, path = queue.pop(0)
            if node_id in paths:
                continue
            paths[node_id] = path
            queue += [(c.node_id, f"{path}/{c.local_name}") for c in graph.nodes[node_id].children]
        keys = {}
        for node_id, path in paths.items():
            for attr in graph.nodes[node_id].attributes:
                if attr.name == "VARIABLE_VALUE":
                    keys[path] = attr.checkpoint_key
        self.training_state = sum(
            "VARIABLE_VALUE" in k for k in self.shapes if k not in set(keys.values())
        )
        self.keys = keys
        self.shapes = {p: self.shapes[k] for p, k in keys.items()}
        self.dtypes = {p: self.dtypes[k] for p, k in keys.items()}


def _tf_message(e: Exception) -> str:
    return getattr(e, "message", None) or str(e).splitlines()[0]


class SafetensorsSource(Source):
    """One or several (sharded) `.safetensors` files, read with the `safetensors` package.

    Opening reads and checks each header (a truncated file fails here, naming it); arrays are read
    one at a time. bfloat16 has no numpy dtype, so such tensors are read through TensorFlow.
    """

    def __init__(self, files: list):
        from safetensors import SafetensorError, safe_open

        self.files = [Path(f) for f in files]
        self.label = str(self.files[0]) if len(self.files) == 1 else f"{self.files[0].parent}/*"
        self.shapes, self.dtypes, self.where = {}, {}, {}
        for path in self.files:
            if not path.exists():
                raise input_error(str(path), "a safetensors file", "no such file")
            try:
                with safe_open(str(path), framework="numpy") as f:
                    for name in f.keys():
                        if name in self.where:
                            raise input_error(
                                str(path), "each tensor in one file", f"{name} also in another"
                            )
                        piece = f.get_slice(name)
                        self.shapes[name] = tuple(piece.get_shape())
                        self.dtypes[name] = piece.get_dtype()
                        self.where[name] = path
            except SafetensorError as e:
                raise input_error(
                    str(path), "a complete safetensors file", f"a damaged one ({e})"
                ) from None

    def read(self, name):
        from safetensors import SafetensorError, safe_open

        path = self.where[name]
        framework = "tf" if self.dtypes[name] == "BF16" else "numpy"
        try:
            with safe_open(str(path), framework=framework) as f:
                value = f.get_tensor(name)
        except SafetensorError as e:
            raise input_error(str(path), f"the value of {name}", str(e)) from None
        return value.numpy() if framework == "tf" else value


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def open_torch_pickle(path, trust_pickle: bool) -> ArraySource:
    """A PyTorch `pytorch_model.bin`-style file. Pickles can run code when loaded, so this refuses
    unless `trust_pickle`; even then it loads with torch's restricted `weights_only=True`."""
    path = Path(path)
    if not trust_pickle:
        raise input_error(
            str(path),
            "a safetensors file",
            "a Python pickle, which can run arbitrary code when loaded; refused. Convert it to "
            "safetensors, or pass --trust_pickle if you trust where this file came from",
        )
    try:
        import torch
    except ImportError:
        raise input_error(
            str(path), "PyTorch installed to read this pickle (--trust_pickle)", "no torch"
        ) from None
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad or unsafe pickle
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise input_error(
            str(path),
            "a PyTorch state dict that loads with weights_only=True (tensors only)",
            f"{type(e).__name__}: {first}",
        ) from None
    if not isinstance(state, dict):
        raise input_error(str(path), "a state dict", type(state).__name__)
    arrays = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise input_error(
                f"{path}: {name}", "a tensor (a flat state dict)", type(tensor).__name__
            )
        if tensor.is_floating_point():
            tensor = tensor.float()
        arrays[name] = tensor.numpy()
    return ArraySource(arrays, f"{path} (pickle, loaded because of --trust_pickle)")


# ---------------------------------------------------------------------------------------------
# The conversion itself
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ConversionReport:
    """What a conversion did: every mapping, and every source variable it did not convert."""

    source: str
    entries: list[Entry]
    heads: bool
    ignored: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> why
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def num_source_variables(self) -> int:
        return sum(len(e.sources) for e in self.entries)

    @property
    def num_parameters(self) -> int:
        return sum(int(np.prod(s)) for e in self.entries for s in e.source_shapes)

    def summary(self) -> str:
        """A few dozen lines: the map with layer numbers folded (`layer_*`, x L), then what was
        not converted and why."""
        lines = [
            f"source: {self.source}",
            f"mapped {self.num_source_variables} source variables onto {len(self.entries)} "
            f"Cloze variables ({self.num_parameters:,} parameters); pre-training heads: "
            f"{'included' if self.heads else 'none (encoder only)'}",
        ]
        folded: dict[str, int] = {}
        for e in self.entries:
            line = f"  {_brace(e.sources)} {_shape(e.source_shapes[0])} -> {e.target}"
            line = _fold_layer_numbers(line)
            folded[line] = folded.get(line, 0) + 1
        lines += [f"{line}{f'  (x{n})' if n > 1 else ''}" for line, n in folded.items()]
        if self.ignored:
            reasons: dict[str, list[str]] = {}
            for name, why in self.ignored.items():
                reasons.setdefault(why, []).append(name)
            for why, names in reasons.items():
                shown = ", ".join(names[:4]) + (
                    f", ... ({len(names)} in all)" if len(names) > 4 else ""
                )
                lines.append(f"not converted ({why}): {shown}")
        lines += self.notes
        return "\n".join(lines)


def _fold_layer_numbers(line: str) -> str:
    """A summary line with its layer numbers as `*`, so each layer's variables share one line:
    BERT's layer_N / layer.N, BART's layers.N, GPT's h.N / h_N / OpenAI's hN, T5's block.N (its
    layer.N after it numbers sub-blocks, and stays), bilm-tf's ELMo CellN and Cloze's encoder_N /
    decoder_N and biLM forward_N / backward_N."""
    if re.search(r"\bblock\.\d+\.", line):
        line = re.sub(r"\bblock\.\d+\.", "block.*.", line)
    else:
        line = re.sub(r"(\blayers?[._]|\bh[._]?)\d+", r"\1*", line)
    line = re.sub(r"\bCell\d+/", "Cell*/", line)
    return re.sub(r"\b(encoder|decoder|forward|backward)_\d+", r"\1_*", line)


def _shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _brace(names: tuple[str, ...]) -> str:
    """("a/query/k", "a/key/k", "a/value/k") -> "a/{query,key,value}/k"."""
    if len(names) == 1:
        return names[0]
    head = os.path.commonprefix(names)
    tail = os.path.commonprefix([n[len(head) :][::-1] for n in names])[::-1]
    middles = [n[len(head) : len(n) - len(tail)] for n in names]
    return f"{head}{{{','.join(middles)}}}{tail}"


_FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16", "F16", "F32", "F64", "BF16")


def convert_into(
    model,
    entries: list[Entry],
    source: Source,
    context: str,
    ignore: Callable[[str], str | None] = lambda name: None,
    skip: str | None = None,
    heads: bool | None = None,
    fresh: Iterable[str] = (),
) -> ConversionReport:
    """Checks `entries` against `source` and `model`, then assigns every Cloze variable.

    Args:
      model: a built BertEncoder or BertPretrainer (see build_model).
      entries: the name map for the source format and the model's config.
      source: the checkpoint.
      context: where the config came from, for messages, e.g. "bert_config.json (6 layers...)".
      ignore: name -> a reason when the source variable is not a weight (optimizer state, a
        buffer, a tied copy), else None.
      skip: a regex; source variables it matches (re.search) are deliberately left out.
      heads: whether the model holds its pre-training head(s), for the report; None = a
        pretrainer of the BERT family (has_heads). Sequence-to-sequence models say it themselves.
      fresh: Cloze variables the checkpoint does not hold on purpose, which keep their
        initialisation (a RoBERTa MLM checkpoint's pooler).
    Raises:
      InputError: before anything is assigned, listing every source variable that is missing,
        has another shape or dtype, or has no place in the model, and every Cloze variable the
        map leaves without a value.
    """
    targets = cloze_variables(model)
    problems = []
    used: dict[str, str] = {}
    for e in entries:
        if e.target not in targets:
            raise RuntimeError(f"name map names {e.target}, which the model does not have")
        for name, shape in zip(e.sources, e.source_shapes):
            if name in used:
                raise RuntimeError(f"name map uses {name} twice ({used[name]}, {e.target})")
            used[name] = e.target
            if name not in source.shapes:
                problems.append(f"{name}: missing (expected shape {_shape(shape)})")
            elif source.shapes[name] != shape:
                problems.append(
                    f"{name}: expected shape {_shape(shape)}, found {_shape(source.shapes[name])}"
                )
            elif source.dtypes.get(name, "float32") not in _FLOAT_DTYPES:
                problems.append(f"{name}: expected floating point, found {source.dtypes[name]}")
    unmapped = sorted(set(targets) - {e.target for e in entries} - set(fresh))
    problems += [f"Cloze variable {t}: no source variable maps onto it" for t in unmapped]
    ignored = {}
    pattern = re.compile(skip) if skip else None
    for name in sorted(source.shapes):
        if name in used:
            continue
        why = ignore(name)
        if why:
            ignored[name] = why
        elif pattern and pattern.search(name):
            ignored[name] = "matched --skip_variables"
        else:
            problems.append(
                f"{name} {_shape(source.shapes[name])}: has no place in this model (left unused)"
            )
    if problems:
        shown = problems[:30] + (
            [f"... and {len(problems) - 30} more"] if len(problems) > 30 else []
        )
        raise InputError(
            f"{source.label}: does not fit the model of {context}: {len(problems)} problem(s):\n  "
            + "\n  ".join(shown)
            + "\n(a checkpoint of another architecture than its config, or the wrong config? To "
            "leave source variables out on purpose, name them with --skip_variables.)"
        )
    for e in entries:
        value = e.to_cloze([np.asarray(source.read(n), np.float32) for n in e.sources])
        var = targets[e.target]
        if tuple(value.shape) != tuple(var.shape):
            raise RuntimeError(f"{e.target}: map made {value.shape}, variable is {var.shape}")
        var.assign(value)
    return ConversionReport(
        source.label, entries, has_heads(model) if heads is None else heads, ignored
    )


def export_arrays(model, entries: list[Entry], leave_out=()) -> dict[str, np.ndarray]:
    """The model's weights under the source format's names (the map run backwards).

    leave_out: prefixes of Cloze variables the format has no place for (written nowhere).
    Raises RuntimeError when the map does not cover every other model variable exactly once.
    """
    targets = {
        k: v for k, v in cloze_variables(model).items() if not k.startswith(tuple(leave_out))
    }
    covered = [e.target for e in entries]
    if sorted(covered) != sorted(targets):
        raise RuntimeError(
            f"name map does not cover the model: missing {sorted(set(targets) - set(covered))}"
        )
    out = {}
    for e in entries:
        parts = e.from_cloze(np.asarray(targets[e.target].numpy(), np.float32))
        for name, shape, part in zip(e.sources, e.source_shapes, parts):
            if tuple(part.shape) != shape:
                raise RuntimeError(f"{name}: map made {part.shape}, expected {shape}")
            out[name] = np.ascontiguousarray(part)
    return out


def describe(config: bert.BertConfig, where: str) -> str:
    c = config
    return (
        f"{where} (num_hidden_layers={c.num_hidden_layers}, hidden_size={c.hidden_size}, "
        f"intermediate_size={c.intermediate_size}, vocab_size={c.vocab_size}, "
        f"type_vocab_size={c.type_vocab_size}, "
        f"max_position_embeddings={c.max_position_embeddings}"
        + (f", embedding_size={c.embedding_size}" if hasattr(c, "embedding_size") else "")
        + ")"
    )


def check_vocab_size(vocab_file, config: bert.BertConfig, where: str) -> int:
    """Refuses a vocab whose token count differs from the config's vocab_size (the embedding rows):
    ids past the matrix would fail at run time, and a shorter vocab means another tokenizer."""
    from data_prep import tokenization

    size = len(tokenization.load_vocab(vocab_file))
    if size != config.vocab_size:
        raise input_error(
            str(vocab_file),
            f"{config.vocab_size} tokens (vocab_size of {where}, the rows of the word-embedding "
            "matrix)",
            f"{size} tokens",
        )
    return size


# ---------------------------------------------------------------------------------------------
# Loading each format
# ---------------------------------------------------------------------------------------------


def _load_tf1(checkpoint, config, config_where, skip, entries_fn, markers, default_name):
    """A name-based TF1 checkpoint (prefix or folder) -> (Cloze model, report): a pretrainer when
    any of `markers` (head variables) is in it, else an encoder; `entries_fn(config, heads)` is
    the family's name map."""
    source = TFCheckpointSource(resolve_checkpoint_prefix(checkpoint, default_name))
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in source.shapes:
        raise input_error(
            source.label,
            "a name-based TF1 checkpoint",
            "an object-based TF2 checkpoint (Cloze's own); use --from=cloze",
        )
    heads = any(m in source.shapes for m in markers)
    model = build_model(config, heads)

    def ignore(name):
        return "optimizer state and step counter" if tf1_training_state(name) else None

    report = convert_into(
        model, entries_fn(config, heads), source, describe(config, config_where), ignore, skip
    )
    return model, report


def load_tf1_bert(checkpoint, config: bert.BertConfig, config_where: str = "the config", skip=None):
    """A google-research/bert checkpoint (prefix or folder) -> (Cloze model, report).

    With `cls/` head variables in the checkpoint the model is a BertPretrainer, else a BertEncoder.
    """
    return _load_tf1(
        checkpoint,
        config,
        config_where,
        skip,
        tf1_bert_entries,
        TF1_HEAD_MARKERS,
        "bert_model.ckpt",
    )


def load_tf1_albert(checkpoint, config, config_where: str = "the config", skip=None):
    """A google-research/albert checkpoint (prefix or folder; the release's `model.ckpt-best`)
    and an AlbertConfig -> (AlbertPretrainer with `cls/` heads in it, else AlbertEncoder,
    report)."""
    return _load_tf1(
        checkpoint,
        config,
        config_where,
        skip,
        tf1_albert_entries,
        TF1_HEAD_MARKERS,
        "model.ckpt-best",
    )


# Present in an ELECTRA pretraining checkpoint (generator and discriminator heads).
TF1_ELECTRA_HEAD_MARKERS = (
    "generator_predictions/output_bias",
    "discriminator_predictions/dense/kernel",
)


def load_tf1_electra(checkpoint, config, config_where: str = "the config", skip=None):
    """A google-research/electra checkpoint (prefix or folder with a `checkpoint` file) and an
    ElectraConfig -> (ElectraPretrainer when the generator and heads are in it, else the
    discriminator's ElectraEncoder, report). The original's "gelu" is the exact erf form:
    the config should say hidden_act "gelu_exact" (configs/electra_*.json do)."""
    return _load_tf1(
        checkpoint, config, config_where, skip, tf1_electra_entries, TF1_ELECTRA_HEAD_MARKERS, None
    )


def hf_weight_files(input_path) -> list[Path]:
    """The weight file(s) of a Hugging Face model folder, or the given file.

    Prefers `model.safetensors`, then a sharded `model.safetensors.index.json`; a pickle
    (`pytorch_model.bin`) is returned only when nothing else is there (open_torch_pickle refuses
    it unless trusted).
    """
    path = Path(input_path)
    if path.is_file():
        if path.name.endswith(".index.json"):
            index = read_json(path)
            shards = sorted(set((index.get("weight_map") or {}).values()))
            if not shards:
                raise input_error(str(path), "a `weight_map` of tensor -> shard file", "none")
            return [path.parent / s for s in shards]
        return [path]
    if not path.is_dir():
        raise input_error(str(path), "a Hugging Face model folder or weights file", "no such path")
    for name in ("model.safetensors", "model.safetensors.index.json"):
        if (path / name).exists():
            return hf_weight_files(path / name)
    pickles = [path / n for n in ("pytorch_model.bin", "model.pt") if (path / n).exists()]
    if pickles:
        return pickles[:1]
    found = sorted(p.name for p in path.iterdir())[:10]
    raise input_error(
        str(path), "model.safetensors (or model.safetensors.index.json)", f"only {found}"
    )


def open_hf_weights(files: list[Path], trust_pickle: bool = False) -> Source:
    if len(files) == 1 and files[0].suffix in PICKLE_SUFFIXES:
        return open_torch_pickle(files[0], trust_pickle)
    return SafetensorsSource(files)


def load_hf_bert(
    weights,
    config: bert.BertConfig,
    config_where: str = "config.json",
    skip=None,
    trust_pickle=False,
):
    """Hugging Face BERT weights (folder, file or shard index) -> (Cloze model, report).

    BertForPreTraining weights (with `cls.predictions` and `cls.seq_relationship`) give a
    BertPretrainer, BertModel weights a BertEncoder. Tied copies of the word embedding are checked
    equal and not converted.
    """
    source = open_hf_weights(hf_weight_files(weights), trust_pickle)
    if any(".transformer.layer." in f".{n}" for n in source.shapes):  # DistilBERT's names
        return load_hf_distilbert(source, config, config_where, skip)
    prefix = hf_prefix(source.shapes)
    heads = any(m in source.shapes for m in HF_HEAD_MARKERS)
    model = build_model(config, heads)
    tied = {k: (prefix + v if v.startswith("embeddings") else v) for k, v in _HF_TIED.items()}

    def ignore(name):
        if hf_buffer(name):
            return "a buffer, not a weight"
        if name in tied:
            return f"tied to {tied[name]}, checked equal"
        return None

    report = convert_into(
        model,
        hf_bert_entries(config, heads, prefix),
        source,
        describe(config, config_where),
        ignore,
        skip,
    )
    for name, partner in tied.items():
        if name in source.shapes and partner in source.shapes:
            if not np.array_equal(source.read(name), source.read(partner)):
                raise input_error(
                    f"{source.label}: {name}",
                    f"a copy of {partner} (Cloze ties the MLM output to the embedding)",
                    "different values",
                )
    if isinstance(source, ArraySource):  # only pickles are read into memory whole
        report.notes.append(f"WARNING: loaded a pickle because --trust_pickle was given: {weights}")
    return model, report


def load_hf_distilbert(source, config, config_where: str = "config.json", skip=None):
    """DistilBertModel or DistilBertFor* weights (an open Source) -> (BertEncoder, report): the
    encoder, with zero token-type rows (DistilBERT has no token types) and the pooler as
    initialised (it has none either; the classifiers build on it fine-tune it). A masked-LM or
    task head is listed as not converted."""
    prefix = _prefix_of(source.shapes, "distilbert.")
    zeros = f"{prefix}embeddings.token_type_embeddings.weight"
    shape = (config.type_vocab_size, config.hidden_size)
    source = with_array(source, zeros, shape, lambda: np.zeros(shape, np.float32))
    heads = ("vocab_transform", "vocab_layer_norm", "vocab_projector", "pre_classifier",
             "classifier", "qa_outputs")  # fmt: skip

    def ignore(name):
        if name.split(".")[0] in heads:
            return "a DistilBERT head (masked LM or task), not converted: the encoder fine-tunes"
        return "a buffer, not a weight" if hf_buffer(name) else None

    model = build_model(config, heads=False)
    where = describe(config, config_where) + " from a DistilBERT"
    fresh = [k for k in cloze_variables(model) if k.startswith("encoder/pooler/")]
    report = convert_into(
        model, hf_distilbert_entries(config, prefix), source, where, ignore, skip, fresh=fresh
    )
    report.notes.append(
        "DistilBERT has no token types and no pooler: the token-type rows are zero (segment ids "
        "change nothing) and the pooler keeps its initialisation"
    )
    return model, report


def _hf_source(weights, trust_pickle: bool):
    source = open_hf_weights(hf_weight_files(weights), trust_pickle)
    if isinstance(source, ArraySource):  # only pickles are read into memory whole
        source.label += " (WARNING: a pickle, loaded because of --trust_pickle)"
    return source


def with_array(source: Source, name: str, shape, read: Callable[[], np.ndarray]) -> Source:
    """`source` plus one float32 array `name` of `shape` that `read()` makes (what a format
    leaves out because it is implied: BART's zero final_logits_bias, the lm_head a T5 ties)."""
    inner = source

    class With(Source):
        label = inner.label
        shapes = {**inner.shapes, name: tuple(shape)}
        dtypes = {**inner.dtypes, name: "float32"}

        def read(self, key):
            return read() if key == name else inner.read(key)

    return With()


def _hf_ignore(tied: dict, source: Source, extra: dict | None = None):
    """The `ignore` of convert_into for Hugging Face files: buffers, tied copies (checked equal
    here, before anything is assigned) and `extra` names with their reasons."""
    extra = extra or {}
    for name, partner in tied.items():
        if name in source.shapes and partner in source.shapes:
            if not np.array_equal(source.read(name), source.read(partner)):
                raise input_error(
                    f"{source.label}: {name}",
                    f"a copy of {partner} (Cloze ties the MLM output to the embedding)",
                    "different values",
                )

    def ignore(name):
        if hf_buffer(name) or name.endswith("embeddings.token_type_ids"):
            return "a buffer, not a weight"
        if name in tied:
            return f"tied to {tied[name]}, checked equal"
        return extra.get(name)

    return ignore


def _prefix_of(names, prefix: str) -> str:
    return prefix if any(n.startswith(prefix) for n in names) else ""


def load_hf(weights, config, config_where: str = "config.json", skip=None, trust_pickle=False):
    """Hugging Face weights (folder, file or shard index) of any family Cloze reads -> (Cloze
    model, report), by the config's type (hf_config_to_config / read_any_config):
      BERT     load_hf_bert.
      RoBERTa  (position_offset > 0) RobertaModel or RobertaForMaskedLM weights -> BertEncoder;
               an `lm_head` is listed as not converted (the encoder is what fine-tunes).
      ALBERT   AlbertModel -> AlbertEncoder, AlbertForPreTraining -> AlbertPretrainer. With
               E == H the always-present `embedding_hidden_mapping_in` must be the identity.
      ELECTRA  ElectraModel or ElectraForPreTraining (the discriminator) -> ElectraEncoder; the
               discriminator head is listed as not converted (Cloze keeps it with the generator,
               which Hugging Face stores as a separate model).
    """
    from modeling import albert, electra

    if isinstance(config, albert.AlbertConfig):
        return load_hf_albert(weights, config, config_where, skip, trust_pickle)
    if isinstance(config, electra.ElectraConfig):
        return load_hf_electra(weights, config, config_where, skip, trust_pickle)
    if config.position_offset:
        return load_hf_roberta(weights, config, config_where, skip, trust_pickle)
    return load_hf_bert(weights, config, config_where, skip, trust_pickle)


def load_hf_albert(weights, config, config_where="config.json", skip=None, trust_pickle=False):
    """Hugging Face ALBERT weights -> (AlbertEncoder or AlbertPretrainer, report); see load_hf."""
    source = _hf_source(weights, trust_pickle)
    prefix = _prefix_of(source.shapes, "albert.")
    heads = "predictions.bias" in source.shapes
    model = build_model(config, heads)
    tied = {
        "predictions.decoder.weight": f"{prefix}embeddings.word_embeddings.weight",
        "predictions.decoder.bias": "predictions.bias",
    }
    extra = {}
    mapping = f"{prefix}encoder.embedding_hidden_mapping_in"
    if config.embedding_size == config.hidden_size and f"{mapping}.weight" in source.shapes:
        # Cloze's AlbertEncoder has no projection when E == H (as the original): exact only
        # when Hugging Face's is the identity.
        weight = source.read(f"{mapping}.weight")
        bias = source.read(f"{mapping}.bias") if f"{mapping}.bias" in source.shapes else 0
        if weight.shape != (config.hidden_size,) * 2 or not (
            np.array_equal(weight, np.eye(config.hidden_size)) and not np.any(bias)
        ):
            raise input_error(
                f"{source.label}: {mapping}.weight",
                "the identity with a zero bias (embedding_size == hidden_size: Cloze's ALBERT "
                "has no projection then)",
                "a trained projection",
            )
        extra = {
            f"{mapping}.{k}": "identity projection (E == H), checked" for k in ("weight", "bias")
        }
    report = convert_into(
        model,
        hf_albert_entries(config, heads, prefix),
        source,
        describe(config, config_where),
        _hf_ignore(tied, source, extra),
        skip,
    )
    return model, report


def load_hf_electra(weights, config, config_where="config.json", skip=None, trust_pickle=False):
    """Hugging Face ELECTRA weights -> (ElectraEncoder, report); see load_hf. A generator's
    folder (ElectraForMaskedLM) gives the generator's encoder, its MLM head listed as not
    converted."""
    source = _hf_source(weights, trust_pickle)
    prefix = _prefix_of(source.shapes, "electra.")
    model = build_model(config, heads=False)
    why = {
        "discriminator_predictions.": "the discriminator head; Cloze keeps it in an "
        "ElectraPretrainer with the generator, which Hugging Face stores as a separate model",
        "generator_": "a generator's MLM head (this folder is an ElectraForMaskedLM: its "
        "encoder is read)",
    }
    extra = {n: r for n in source.shapes for k, r in why.items() if n.startswith(k)}
    report = convert_into(
        model,
        hf_electra_entries(config, False, prefix),
        source,
        describe(config, config_where),
        _hf_ignore({}, source, extra),
        skip,
    )
    return model, report


def load_hf_roberta(weights, config, config_where="config.json", skip=None, trust_pickle=False):
    """Hugging Face RoBERTa weights -> (BertEncoder with position_offset, report); see load_hf."""
    source = _hf_source(weights, trust_pickle)
    prefix = _prefix_of(source.shapes, "roberta.")
    model = build_model(config, heads=False)
    why = "RoBERTa's MLM head; Cloze loads the encoder"
    extra = {n: why for n in source.shapes if n.startswith("lm_head.")}
    entries = hf_roberta_entries(config, False, prefix)
    # The published RoBERTa checkpoints (RobertaForMaskedLM, converted from fairseq) hold no
    # pooler: it keeps its initialisation, as transformers' RobertaModel.from_pretrained leaves
    # it, and fine-tuning trains it.
    pooler = [e for e in entries if e.target.startswith("encoder/pooler/")]
    no_pooler = not any(n in source.shapes for e in pooler for n in e.sources)
    if no_pooler:
        entries = [e for e in entries if e not in pooler]
    report = convert_into(
        model,
        entries,
        source,
        describe(config, config_where) + f" with position_offset={config.position_offset}",
        _hf_ignore({}, source, extra),
        skip,
        fresh=[e.target for e in pooler] if no_pooler else (),
    )
    if no_pooler:
        report.notes.append(
            "WARNING: the checkpoint has no pooler (RoBERTa's MLM checkpoints hold none): "
            "encoder/pooler keeps its fresh initialisation, as in transformers; fine-tuning "
            "trains it"
        )
    return model, report


def load_cloze(checkpoint, config: bert.BertConfig, config_where: str = "the config", skip=None):
    """A Cloze checkpoint (prefix or folder: its latest) -> (Cloze model, report).

    Reads by attribute path, so the same strict checks as for foreign formats apply: a checkpoint
    with another number of layers or sizes than the config fails, naming the variables. A
    checkpoint whose `model` is a bare BertEncoder (`model/embeddings/...`) also loads.
    """
    source = ClozeCheckpointSource(resolve_checkpoint_prefix(checkpoint))
    names = list(source.shapes)
    if not any(n.startswith("model/encoder/") for n in names) and any(
        n.startswith("model/embeddings/") for n in names
    ):
        # A bare encoder: its paths lack the `encoder/` step.
        source.shapes = {"model/encoder/" + n[len("model/") :]: s for n, s in source.shapes.items()}
        source.dtypes = {"model/encoder/" + n[len("model/") :]: d for n, d in source.dtypes.items()}
        source.keys = {"model/encoder/" + n[len("model/") :]: k for n, k in source.keys.items()}
    head_paths = ("model/masked_lm/", "model/next_sentence/", "model/generator_predictions/")
    heads = any(n.startswith(head_paths) for n in source.shapes)
    model = build_model(config, heads)
    # The identity map over the model's own variables (any family: BERT, ALBERT, ELECTRA).
    entries = [_copy(n, f"model/{n}", tuple(v.shape)) for n, v in cloze_variables(model).items()]

    def ignore(name):
        # Dropout's random-number state is not a weight (and absent when dropout is 0).
        if "seed_generator" in name:
            return "dropout seed state"
        if name.startswith("model/span_boundary_head/"):
            return "SpanBERT's span boundary head (the BERT formats have no place for it)"
        return None

    report = convert_into(model, entries, source, describe(config, config_where), ignore, skip)
    if source.training_state:
        report.notes.append(
            f"not converted: {source.training_state} training-state variable(s) outside `model` "
            "(optimizer, counters, data iterator)"
        )
    return model, report


def read_keras_hub_config(path) -> bert.BertConfig:
    """The BertConfig of a keras-hub preset's `config.json` (a serialized BertBackbone).

    keras-hub's BertBackbone computes the tanh GELU (hidden_act "gelu") and has one dropout
    rate; it does not store initializer_range (0.02 here, which only matters for new weights).
    """
    from modeling import bert

    values = read_json(path)
    name = values.get("registered_name") if isinstance(values, dict) else None
    if name != "keras_hub>BertBackbone" or not isinstance(values.get("config"), dict):
        found = repr(name) if isinstance(values, dict) else type(values).__name__
        raise input_error(
            f"{path}: registered_name",
            "'keras_hub>BertBackbone' (a keras-hub BERT preset's backbone config)",
            found,
        )
    c = values["config"]
    keys = {
        "vocab_size": "vocabulary_size",
        "hidden_size": "hidden_dim",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_heads",
        "intermediate_size": "intermediate_dim",
        "max_position_embeddings": "max_sequence_length",
        "type_vocab_size": "num_segments",
    }
    missing = [k for k in (*keys.values(), "dropout") if k not in c]
    if missing:
        raise input_error(f"{path}: config", f"the keys {missing}", "them missing")
    fields = {ours: c[theirs] for ours, theirs in keys.items()}
    fields |= {"hidden_dropout_prob": c["dropout"], "attention_probs_dropout_prob": c["dropout"]}
    return bert.BertConfig.from_dict(
        {**fields, "hidden_act": "gelu", "initializer_range": 0.02}, source=str(path)
    )


def keras_hub_lowercase(preset_dir) -> bool | None:
    """Whether a keras-hub preset's tokenizer (tokenizer.json) lower-cases; None without one."""
    path = Path(preset_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    values = read_json(path)
    config = values.get("config") if isinstance(values, dict) else None
    lowercase = config.get("lowercase") if isinstance(config, dict) else None
    if not isinstance(lowercase, bool):
        raise input_error(f"{path}: config.lowercase", "true or false", repr(lowercase))
    return lowercase


def load_keras_hub(
    preset_dir, config: bert.BertConfig, config_where: str = "config.json", skip=None
):
    """A keras-hub BertBackbone preset folder (`save_to_preset`) -> (Cloze BertEncoder, report).

    The backbone is loaded by keras-hub itself (`BertBackbone.from_preset`, offline for a local
    folder) and its variables are mapped with keras_hub_entries; the result computes what the
    backbone computes (same activation, epsilon and masking).
    """
    import keras_hub

    path = Path(preset_dir)
    if not (path / "config.json").is_file():
        raise input_error(str(path), "a keras-hub preset folder (config.json)", "none")
    try:
        backbone = keras_hub.models.BertBackbone.from_preset(str(path))
    except (OSError, ValueError) as e:
        raise input_error(str(path), "a loadable keras-hub BertBackbone preset", str(e)) from None
    arrays = {v.path: np.asarray(v.numpy()) for v in backbone.weights}
    source = ArraySource(arrays, f"{path} (keras-hub BertBackbone)")
    model = build_model(config, heads=False)
    report = convert_into(
        model, keras_hub_entries(config), source, describe(config, config_where), skip=skip
    )
    return model, report


# ---------------------------------------------------------------------------------------------
# Writing each format
# ---------------------------------------------------------------------------------------------


def save_cloze(model, output_dir) -> str:
    """Writes a Cloze checkpoint (`ckpt-1` + `checkpoint`) that run scripts take as
    --init_checkpoint. An encoder alone is saved as `model.encoder`, the layout of every Cloze
    model (BertPretrainer and task models hold `encoder`), so it initialises their encoders."""
    import tensorflow as tf

    root = model if has_heads(model) else tf.train.Checkpoint(encoder=model)
    return tf.train.Checkpoint(model=root).save(os.path.join(str(output_dir), "ckpt"))


def load_whole(model, checkpoint) -> tuple:
    """Builds `model` (a BART, T5, XLNet, XLNet span QA or GPT model: their Cloze checkpoints
    hold the whole model under `model`, from a run script or a conversion) and restores it from
    `checkpoint` (a prefix or a folder: its latest). Returns (model, the prefix read); raises
    ValueError naming the path when it does not fit."""
    from training import trainer

    model.build()
    return model, trainer.restore_model_weights(model, str(checkpoint))


def save_whole(model, output_dir) -> str:
    """A Cloze checkpoint (`ckpt-1`, the whole model under `model`, as run_pretraining saves it)
    that load_whole and the run scripts' --init_checkpoint read."""
    import tensorflow as tf

    return tf.train.Checkpoint(model=model).save(os.path.join(str(output_dir), "ckpt"))


def save_tf1_bert(model, output_dir, name: str = "bert_model.ckpt") -> str:
    """Writes a google-research/bert checkpoint (`bert_model.ckpt.index` / `.data-*` and a
    `checkpoint` file) with the original names, readable by the original code's
    `init_from_checkpoint` and by load_tf1_bert."""
    arrays = export_arrays(model, tf1_bert_entries(model.config, has_heads(model)))
    return _save_tf1_arrays(arrays, output_dir, name)


def save_hf_bert(
    model, output_dir, do_lower_case: bool = True, vocab_kind: str = "wordpiece"
) -> list[Path]:
    """Writes `model.safetensors` and `config.json` (plus `tokenizer_config.json`, see save_hf)
    as transformers' save_pretrained would for BertModel (encoder) or BertForPreTraining (heads).

    The tied MLM decoder is not written; transformers ties it to the word embedding on load.
    """
    heads = has_heads(model)
    prefix = "bert." if heads else ""
    arrays = export_arrays(model, hf_bert_entries(model.config, heads, prefix))
    config = bert_config_to_hf_config(model.config, heads)
    return _write_hf_folder(arrays, config, Path(output_dir), do_lower_case, vocab_kind)


def save_tf1(model, output_dir, name: str = "model.ckpt") -> str:
    """Writes the original TF1 checkpoint of the model's family: google-research/bert's names
    (save_tf1_bert), ALBERT's (tf1_albert_entries) or ELECTRA's (tf1_electra_entries), which
    load_tf1_* read back variable for variable."""
    from modeling import albert, electra

    entries_fn = {
        albert.AlbertConfig: tf1_albert_entries,
        electra.ElectraConfig: tf1_electra_entries,
    }.get(type(model.config))
    if entries_fn is None:
        return save_tf1_bert(model, output_dir)
    return _save_tf1_arrays(
        export_arrays(model, entries_fn(model.config, has_heads(model))), output_dir, name
    )


def _save_tf1_arrays(arrays: dict, output_dir, name: str) -> str:
    import tensorflow as tf

    prefix = os.path.join(str(output_dir), name)
    names = sorted(arrays)
    # SaveV2 writes a name-based checkpoint with exactly these names, as TF1's Saver did.
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(arrays[n]) for n in names],
    )
    Path(output_dir, "checkpoint").write_text(
        f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n'
    )
    return prefix


# tokenizer_config.json's tokenizer_class by the vocabulary beside the weights: a WordPiece
# vocab.txt, RoBERTa's byte-level BPE (vocab.json + merges.txt, cased), ALBERT's spiece.model.
HF_TOKENIZER_CLASSES = {
    "wordpiece": "BertTokenizer",
    "bpe": "RobertaTokenizer",
    "sentencepiece": "AlbertTokenizer",
}


def write_hf_files(output_dir, arrays: dict, config: dict) -> list[Path]:
    """model.safetensors and config.json as transformers' save_pretrained writes them; returns
    their paths."""
    from safetensors.numpy import save_file

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # transformers refuses safetensors files whose metadata lacks a known "format".
    save_file(arrays, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [out / "model.safetensors", out / "config.json"]


def _write_hf_folder(
    arrays: dict, config: dict, out: Path, do_lower_case: bool, vocab_kind: str = "wordpiece"
) -> list[Path]:
    write_hf_files(out, arrays, config)
    tokenizer_config = {"tokenizer_class": HF_TOKENIZER_CLASSES[vocab_kind]}
    if vocab_kind != "bpe":
        tokenizer_config["do_lower_case"] = do_lower_case
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return [out / "model.safetensors", out / "config.json", out / "tokenizer_config.json"]


def save_hf(
    model, output_dir, do_lower_case: bool = True, vocab_kind: str = "wordpiece"
) -> tuple[list[Path], list[str]]:
    """Writes the model as transformers' save_pretrained would for its family; returns (files,
    notes). vocab_kind: the vocabulary the caller copies beside it, which tokenizer_config.json
    names (HF_TOKENIZER_CLASSES): "wordpiece", "bpe" (RoBERTa's) or "sentencepiece" (ALBERT's).
    BERT: save_hf_bert. RoBERTa (position_offset > 0): RobertaModel, or
    RobertaForMaskedLM with the pooler kept and the (unused) next-sentence head left out.
    ALBERT: AlbertModel or AlbertForPreTraining (with E == H an identity
    `embedding_hidden_mapping_in`, which Hugging Face always has). ELECTRA: ElectraModel, or
    ElectraForPreTraining plus the generator as an ElectraForMaskedLM in generator/. Tied MLM
    decoders are not written; transformers ties them on load."""
    from modeling import albert, electra

    config, heads, out = model.config, has_heads(model), Path(output_dir)
    notes = []
    if isinstance(config, albert.AlbertConfig):
        prefix = "albert." if heads else ""
        arrays = export_arrays(model, hf_albert_entries(config, heads, prefix))
        if config.embedding_size == config.hidden_size:
            mapping = f"{prefix}encoder.embedding_hidden_mapping_in"
            arrays[f"{mapping}.weight"] = np.eye(config.hidden_size, dtype=np.float32)
            arrays[f"{mapping}.bias"] = np.zeros(config.hidden_size, np.float32)
            notes.append("embedding_size == hidden_size: wrote an identity projection")
    elif isinstance(config, electra.ElectraConfig):
        prefix = "electra." if heads else ""
        arrays = export_arrays(model, hf_electra_entries(config, heads, prefix))
    elif config.position_offset:
        prefix = "roberta." if heads else ""
        arrays = export_arrays(
            model, hf_roberta_entries(config, heads, prefix), leave_out=("next_sentence/",)
        )
        if heads:
            notes.append("not written: the next-sentence head (RoBERTa has none)")
    else:
        return save_hf_bert(model, output_dir, do_lower_case, vocab_kind), notes
    generator = {
        k[len(HF_GENERATOR_DIR) + 1 :]: a
        for k, a in arrays.items()
        if k.startswith(HF_GENERATOR_DIR + "/")
    }
    arrays = {k: a for k, a in arrays.items() if not k.startswith(HF_GENERATOR_DIR + "/")}
    hf_config = config_to_hf_config(config, heads)
    files = _write_hf_folder(arrays, hf_config, out, do_lower_case, vocab_kind)
    if generator:
        # The generator shares the discriminator's embeddings (ELECTRA sec. 3.2): a copy in its
        # own folder, as the released generator checkpoints hold them.
        for k, a in arrays.items():
            if k.startswith("electra.embeddings."):
                generator[k] = a
        files += _write_hf_folder(
            generator, electra_generator_hf_config(config), out / HF_GENERATOR_DIR, do_lower_case
        )
        if config.hidden_act != "gelu_exact":
            notes.append(
                "WARNING: transformers' ElectraGeneratorPredictions always computes the exact "
                f"GELU; this generator's head computes hidden_act={config.hidden_act!r}"
            )
    return files, notes


# ---------------------------------------------------------------------------------------------
# Portable exports: SavedModel with raw-string signatures, and a .keras file
# ---------------------------------------------------------------------------------------------


class _RobertaInGraph:
    """RoBERTa's byte-level BPE in the serving graph: keras-hub's BytePairTokenizer (TensorFlow
    and tensorflow-text ops only, so the SavedModel loads without keras-hub), over the
    folder's vocab.json + merges.txt. tokenize_to_ids(text string (B,)) -> int64 ragged (B, None),
    bpe.RobertaTokenizer's ids (tested); vocab: token -> id."""

    def __init__(self, folder, do_lower_case: bool):
        import keras_hub

        from data_prep import bpe

        vocab_json, merges = bpe.folder_files(folder)
        self.vocab = bpe.RobertaTokenizer.from_folder(folder).vocab  # checks the special tokens
        self.do_lower_case = do_lower_case
        self.tf_tokenizer = keras_hub.tokenizers.BytePairTokenizer(
            vocabulary=str(vocab_json), merges=str(merges)
        )
        self.assets = (vocab_json, merges)

    def tokenize_to_ids(self, text):
        import tensorflow as tf

        if self.do_lower_case:
            text = tf.strings.lower(text, encoding="utf-8")
        return tf.cast(self.tf_tokenizer(text), tf.int64)


def serving_module(model, vocab_file, do_lower_case: bool, max_seq_length: int):
    """The tf.Module whose three functions export_saved_model saves as signatures (see there);
    callable in process, e.g. `serving_module(...).serve_text(tf.constant(["a text"]))`.
    vocab_file: a WordPiece vocab.txt (BERT's packing) or a RoBERTa byte-level BPE folder
    (glue's ROBERTA_PACKING)."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    from data_prep import bpe, glue, tokenization
    from modeling import bert

    encoder = model if isinstance(model, bert.BertEncoder) else model.encoder
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length={max_seq_length}: expected at least 3")
    if bpe.folder_files(vocab_file) is not None:
        tokenizer, packing = _RobertaInGraph(vocab_file, do_lower_case), glue.ROBERTA_PACKING
        assets = tokenizer.assets
    else:
        tokenizer = tokenization.InGraphTokenizer(vocab_file, do_lower_case=do_lower_case)
        packing, assets = glue.BERT_PACKING, (vocab_file,)
    start, end = tokenizer.vocab[packing.start], tokenizer.vocab[packing.end]
    middle = [tokenizer.vocab[t] for t in packing.middle]
    pad_id = 0 if packing.pad is None else tokenizer.vocab[packing.pad]
    # The positions after a RoBERTa's offset, and ids inside the embedding table.
    vocab_size = max(tokenizer.vocab.values()) + 1
    bert.check_run_fits(encoder.config, "the model config", max_seq_length, vocab_size)
    ids_spec = tf.TensorSpec([None, None], tf.int32)

    class BertServing(tf.Module):
        """Raw strings -> the in-graph tokenizer (FullTokenizer's or RobertaTokenizer's ids) ->
        `start a end` or `start a middle b end` as `packing` frames them."""

        def __init__(self):
            super().__init__(name="cloze_bert_serving")
            self.model = model
            self.tf_tokenizer = tokenizer.tf_tokenizer  # tracked: its vocab is saved with it
            self.vocab_files = [tf.saved_model.Asset(str(f)) for f in assets]

        def _run(self, segments):
            if packing == glue.BERT_PACKING:
                ids, segment_ids = tf_text.combine_segments(segments, start, end)
            else:
                rows = segments[0].nrows()

                def framing(token_ids):  # the same ids on every row, ragged (B, len)
                    row = tf.constant([token_ids], tf.int64)
                    return tf.RaggedTensor.from_tensor(tf.tile(row, [rows, 1]))

                parts = [framing([start])]
                for i, segment in enumerate(segments):
                    last = i == len(segments) - 1
                    parts += [tf.cast(segment, tf.int64), framing([end] if last else middle)]
                ids = tf.concat(parts, axis=1)
                segment_ids = tf.zeros_like(ids)  # RoBERTa: one segment type
            inputs = {
                # (B, S), S the longest in the batch, padded with the vocabulary's pad id
                "input_ids": tf.cast(ids.to_tensor(default_value=pad_id), tf.int32),
                "input_mask": tf.cast(tf.ones_like(ids).to_tensor(), tf.int32),
                "segment_ids": tf.cast(segment_ids.to_tensor(), tf.int32),
            }
            return self._outputs(inputs)

        def _outputs(self, inputs):
            out = encoder(inputs, training=False)
            result = {
                "pooled_output": out["pooled_output"],  # (B, H)
                "sequence_output": out["sequence_output"],  # (B, S, H)
                **inputs,
            }
            if isinstance(model, bert.BertPretrainer):
                result["nsp_logits"] = model.next_sentence(out["pooled_output"])  # (B, 2)
            elif not isinstance(model, bert.BertEncoder):
                task = model(inputs, training=False)
                task = task if isinstance(task, dict) else {"outputs": task}
                result |= {k: v for k, v in task.items() if k not in result}
            return result

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve_text(self, text):
            ids = tokenizer.tokenize_to_ids(text)[:, : max_seq_length - 2]  # room for start, end
            return self._run([ids])

        @tf.function(
            input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)]
        )
        def serve_text_pair(self, text_a, text_b):
            # Round robin keeps the shorter text whole and takes tokens from the longer one,
            # the same lengths as the original _truncate_seq_pair.
            trimmer = tf_text.RoundRobinTrimmer(max_seq_length - packing.pair_specials)
            a, b = trimmer.trim(
                [tokenizer.tokenize_to_ids(text_a), tokenizer.tokenize_to_ids(text_b)]
            )
            return self._run([a, b])

        @tf.function(input_signature=[ids_spec, ids_spec, ids_spec])
        def serve_ids(self, input_ids, input_mask, segment_ids):
            inputs = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}
            return self._outputs(inputs)

    return BertServing()


def export_saved_model(
    model, export_dir, vocab_file, do_lower_case: bool = True, max_seq_length: int = 128
) -> None:
    """Writes a SavedModel that needs only TensorFlow and tensorflow-text to load and serve.

    Signatures (outputs: pooled_output (B, H), sequence_output (B, S, H), the input_ids,
    input_mask and segment_ids it made, plus nsp_logits (B, 2) for a BertPretrainer or the task
    model's own outputs; S is the longest input in the batch, at most max_seq_length):
      serving_default(text: string (B,)): one text each, `[CLS] text [SEP]`.
      serve_text_pair(text_a, text_b: string (B,)): `[CLS] a [SEP] b [SEP]`, segment ids 0 / 1.
      serve_ids(input_ids, input_mask, segment_ids: int32 (B, S)): already tokenized input.
    `model`: a BertEncoder, a BertPretrainer, or a task model with an `encoder` attribute whose
    call takes the three input features. The vocab is also kept under assets/.
    vocab_file: a WordPiece vocab.txt, or a RoBERTa checkpoint's byte-level BPE folder
    (vocab.json + merges.txt): then `<s> text </s>` and `<s> a </s></s> b </s>`, one segment type,
    padded with <pad>, the text lower-cased only when do_lower_case.
    """
    import tensorflow as tf

    module = serving_module(model, vocab_file, do_lower_case, max_seq_length)
    signatures = {
        "serving_default": module.serve_text.get_concrete_function(),
        "serve_text_pair": module.serve_text_pair.get_concrete_function(),
        "serve_ids": module.serve_ids.get_concrete_function(),
    }
    # Saved: what the three signatures use (the weights, the tokenizer's tables, the vocabulary
    # assets), not the module itself. tf.saved_model.save traces every tf.function attribute of
    # the object it saves once more, inside its save context, even those traced just above: the
    # module's three served functions doubled the export's tracing (a RoBERTa BPE export:
    # 19.1 -> 12.0 s without them, its load 5.5 -> 3.2 s). The signatures are the interface.
    holder = tf.Module(name="cloze_bert_serving")
    holder.model, holder.tf_tokenizer = module.model, module.tf_tokenizer
    holder.vocab_files = module.vocab_files
    # Serving takes no gradients; not tracing gradient functions makes saving MiniLM ~40% faster.
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    tf.saved_model.save(holder, str(export_dir), signatures=signatures, options=options)


def export_keras(model, path) -> None:
    """Writes a `.keras` file; keras.saving.load_model(path, safe_mode=True) reads it back once
    Cloze's modeling package is imported (its layers are registered serializables)."""
    model.save(str(path))


def keras_hub_backbone(config: bert.BertConfig):
    """A fresh keras_hub.models.BertBackbone of the config's sizes (the export target here, the
    peer model in bench/)."""
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        dropout=config.hidden_dropout_prob,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size,
    )


def export_keras_hub(
    model,
    output_dir,
    vocab_file,
    do_lower_case: bool = True,
    allow_gelu_approximation: bool = False,
) -> list[str]:
    """Writes a keras-hub preset: `keras_hub.models.BertBackbone.from_preset(output_dir)` and
    `keras_hub.models.BertTokenizer.from_preset(output_dir)` load it offline.

    The encoder's weights go into a BertBackbone of the same sizes (keras_hub_entries), saved
    with keras-hub's own `save_to_preset`, next to a BertTokenizer of vocab_file (lower-casing
    and accent stripping both follow do_lower_case, as the original uncased tokenizer). A config
    the backbone cannot compute is refused (check_keras_hub_config). Pre-training heads are not
    part of a backbone and are left out. Returns notes for the summary.
    """
    import keras_hub

    from modeling import bert

    encoder = model if isinstance(model, bert.BertEncoder) else model.encoder
    c = encoder.config
    notes = check_keras_hub_config(c, "the model config", allow_gelu_approximation)
    if has_heads(model):
        notes.append("not exported: the MLM and NSP heads (a keras-hub BertBackbone has none)")
    backbone = keras_hub_backbone(c)
    arrays = export_arrays(encoder, keras_hub_entries(c))
    variables = {v.path: v for v in backbone.weights}
    if sorted(arrays) != sorted(variables):
        raise RuntimeError(
            "keras_hub_entries does not match this keras-hub version's BertBackbone: "
            f"unmapped {sorted(set(variables) - set(arrays))}, "
            f"unknown {sorted(set(arrays) - set(variables))}"
        )
    for name, value in arrays.items():
        if tuple(variables[name].shape) != value.shape:
            raise RuntimeError(
                f"{name}: map made {value.shape}, keras-hub has {variables[name].shape}"
            )
        variables[name].assign(value)
    backbone.save_to_preset(str(output_dir))
    tokenizer = keras_hub.models.BertTokenizer(
        vocabulary=str(vocab_file), lowercase=do_lower_case, strip_accents=do_lower_case
    )
    tokenizer.save_to_preset(str(output_dir))
    return notes


# ---------------------------------------------------------------------------------------------
# Output folders: all or nothing
# ---------------------------------------------------------------------------------------------


def check_output_dir(output_dir) -> None:
    """Refuses an output folder that exists and is not empty (it was not made by this run)."""
    path = Path(output_dir)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise input_error(
            str(path), "a new or empty folder to write to", "an existing non-empty path; refused"
        )


class AtomicOutputDir:
    """`with AtomicOutputDir(dest) as tmp:` write into tmp; on success tmp is renamed to dest.

    The temporary folder sits beside `dest` (same file system, so the rename is atomic); on any
    error it is removed and `dest` is left as it was (absent or empty).
    """

    def __init__(self, output_dir):
        self.dest = Path(output_dir).resolve()
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        import tempfile

        check_output_dir(self.dest)
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.dest.name}.tmp-", dir=self.dest.parent))
        # mkdtemp makes the folder private (0700); give it the permissions a plain mkdir would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o777 & ~umask)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        try:
            check_output_dir(self.dest)  # something may have appeared there meanwhile
            if self.dest.exists():
                self.dest.rmdir()
            os.rename(self.tmp, self.dest)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return False
