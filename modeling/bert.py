"""BERT (Devlin et al. 2019): config, embeddings, encoder backbone and the pre-training model.

Read top to bottom: `BertConfig` (the original `bert_config.json` fields), `BertEmbeddings`,
`BertEncoder` (the backbone every task model wraps), `BertPretrainer` (MLM + NSP or SOP heads,
optionally SpanBERT's span boundary head). RoBERTa is this family with another config
(configs/roberta_base.json: one segment type, positions offset by 2) and data recipe
(FULL-SENTENCES packing, dynamic masking, no NSP). Shapes: B batch, S length, H hidden,
P predictions per sequence, V vocab, L layers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import ClassVar, Self

import keras
from absl import logging
from keras import ops

from data_prep.errors import InputError
from modeling import heads, layers

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


# Sizes that must be at least 1: a 0 or negative one would divide by zero or build an empty
# weight long after the config was read (found by tests/test_fuzz_readers.py).
POSITIVE_FIELDS = frozenset(
    {
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
        "embedding_size",
    }
)


def check_field_types(config) -> None:
    """Raises ValueError naming the first field of a config dataclass with a wrong JSON type,
    a size below 1 or a non-finite number."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        where = f"{type(config).__name__}.{f.name}"
        if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{where}: expected an integer, found {value!r}")
        if f.type == "int" and f.name in POSITIVE_FIELDS and value < 1:
            raise ValueError(f"{where}: expected a positive integer, found {value!r}")
        if f.type == "float" and (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise ValueError(f"{where}: expected a finite number, found {value!r}")
        if f.type == "str" and not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, found {value!r}")


def check_encoder_fields(config) -> None:
    """The checks every Transformer-encoder config (BERT, ALBERT, ELECTRA) runs on construction:
    field types and sizes, a known activation, and heads that divide the hidden size."""
    check_field_types(config)
    layers.get_activation(config.hidden_act)
    if config.hidden_size % config.num_attention_heads:
        raise ValueError(
            f"{type(config).__name__}: hidden_size {config.hidden_size} is not a multiple of "
            f"num_attention_heads {config.num_attention_heads}"
        )


def config_from_dict(cls, values: dict, source: str, family: str):
    """Builds a config dataclass `cls` from a dict: every field not in `cls.OPTIONAL` is required,
    an unknown key is an error; `source` names where the dict came from in error messages."""
    if not isinstance(values, dict):
        raise InputError(f"{source}: expected a JSON object, found {type(values).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    required = [n for n in names if n not in cls.OPTIONAL]
    unknown = sorted(set(values) - set(names))
    missing = [n for n in required if n not in values]
    if unknown:
        raise InputError(
            f"{source}: unknown key(s) {unknown}; a {family} config has exactly {required}"
            + (f" and optionally {sorted(cls.OPTIONAL)}" if cls.OPTIONAL else "")
        )
    if missing:
        raise InputError(
            f"{source}: missing key(s) {missing}; a {family} config needs all of {required}"
        )
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:  # TypeError: a JSON list or object where a name belongs
        raise InputError(f"{source}: {e}") from None


def read_config_json(path, what: str = "a bert_config.json file") -> dict:
    """Reads a JSON config file; errors name the file (and the JSON line on syntax errors)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: expected {what}, found no such file") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: expected UTF-8 JSON, found byte at offset {e.start}") from None
    except OSError as e:  # a folder, no permission
        raise InputError(f"{path}: expected {what}, found {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}:{e.lineno}: expected JSON, found a syntax error ({e.msg})"
        ) from None
    except RecursionError:
        raise InputError(f"{path}: expected {what}, found JSON nested too deeply") from None


class JsonConfig:
    """The JSON round trip every family's config dataclass shares (BertConfig, AlbertConfig,
    ElectraConfig, GptConfig, T5Config, BartConfig, XLNetConfig, ElmoConfig): from_dict and
    from_json_file, whose errors name the source (config_from_dict, read_config_json), to_dict,
    to_json_string (sorted keys, a final newline) and replace. A family names itself in FAMILY
    and its file in FILE_KIND (both in error messages), lists its optional keys in OPTIONAL,
    and overrides to_dict or from_dict where its JSON is not its fields one for one."""

    FAMILY: ClassVar[str] = "BERT"
    FILE_KIND: ClassVar[str] = "a bert_config.json file"
    OPTIONAL: ClassVar[frozenset] = frozenset()

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> Self:
        """Builds a config from a dict; `source` names where it came from in error messages."""
        return config_from_dict(cls, values, source, cls.FAMILY)

    @classmethod
    def from_json_file(cls, path) -> Self:
        """Reads a config file; errors name the file (and the JSON line on syntax errors)."""
        return cls.from_dict(read_config_json(path, cls.FILE_KIND), source=str(path))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def replace(self, **changes) -> Self:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class BertConfig(JsonConfig):
    """The original google-research/bert `BertConfig`, field for field, plus two optional fields.

    The eleven original fields are required in a JSON file (a published `bert_config.json` has all
    eleven), and an unknown key is an error: a typo must not silently train a different model.
    `hidden_act="gelu"` means the tanh approximation, as the original TF1 code computed it;
    `"gelu_exact"` is the erf form that Hugging Face checkpoints use.

    `position_offset` (optional, default 0, written to JSON only when set): the first row of the
    position table that position 0 uses. fairseq / Hugging Face RoBERTa checkpoints number
    positions from padding_idx + 1 = 2 (their table has max_position_embeddings = 514 rows for
    512 tokens), so configs/roberta_base.json sets 2; with right padding, as here, that is the
    same as slicing the table from row 2.

    `layer_norm_eps` (optional, default 1e-12 as the original BERT, written only when set; Hugging
    Face's name): the epsilon of every LayerNorm. RoBERTa's checkpoints were trained with 1e-5.
    """

    OPTIONAL: ClassVar[frozenset] = frozenset({"position_offset", "layer_norm_eps"})

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 16
    initializer_range: float = 0.02
    position_offset: int = 0
    layer_norm_eps: float = layers.LAYER_NORM_EPSILON

    def __post_init__(self):
        check_encoder_fields(self)
        if not 0 <= self.position_offset < self.max_position_embeddings:
            raise ValueError(
                f"BertConfig: position_offset {self.position_offset} must be in "
                f"[0, max_position_embeddings={self.max_position_embeddings})"
            )
        if not 0 < self.layer_norm_eps < 1:
            raise ValueError(f"BertConfig: layer_norm_eps {self.layer_norm_eps} must be in (0, 1)")

    def to_dict(self) -> dict:
        """The JSON fields; optional fields only when they differ from their default, so a
        published config round-trips to the same keys."""
        values = dataclasses.asdict(self)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: v for k, v in values.items() if k not in self.OPTIONAL or v != defaults[k]}


# ---------------------------------------------------------------------------------------------
# Embeddings and the encoder backbone
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class BertEmbeddings(keras.layers.Layer):
    """Token + segment + learned absolute position embeddings, then LayerNorm and dropout.

    call(input_ids, segment_ids, training): int (B, S), int (B, S) -> float (B, S, H).
    Position j uses row `position_offset + j` of the position table (RoBERTa: 2, see BertConfig).

    The tables are read as stored (float32) and only the rows looked up are cast to the compute
    dtype, as keras.layers.Embedding does (autocast off), so under a mixed policy a lookup's
    gradient is a scatter-add of float32 rows into a float32 table. Autocast (until the
    thirty-sixth session) the table was cast to bfloat16 first, and under Keras' JAX backend the
    gradient was a bfloat16 scatter-add. Compiled for the H100 (bench/gpu_mfu.py
    --aot_target_config), that is one bfloat16 atomic add per element where a float32 table
    gets one four-wide float32 atomic per four, and each add rounds the running sum to
    bfloat16: at batch 256 x 128 each of the token-type table's 2 x H sums takes 16,384 of them.
    TensorFlow summed the rows in float32 either way (its Cast gradient casts the IndexedSlices'
    values) and the forward values are the same bits (gather-then-cast = cast-then-gather): a
    TensorFlow pretraining step's loss and gradients were bit-identical before and after, in
    fp32 and in mixed bf16.
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        max_position_embeddings,
        type_vocab_size,
        hidden_dropout_prob=0.1,
        initializer_range=0.02,
        position_offset=0,
        layer_norm_eps=layers.LAYER_NORM_EPSILON,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.hidden_dropout_prob = hidden_dropout_prob
        self.initializer_range = initializer_range
        self.position_offset = position_offset
        self.layer_norm_eps = layer_norm_eps
        self.layer_norm = layers.layer_norm("layer_norm", layer_norm_eps)
        self.dropout = layers.Dropout(hidden_dropout_prob)

    def build(self, input_shape):
        init = layers.truncated_normal(self.initializer_range)
        # Read as float32 under a mixed policy (docstring; layers.lookup_rows): autocast=False.
        self.word_embeddings = self.add_weight(
            name="word_embeddings",
            shape=(self.vocab_size, self.hidden_size),
            initializer=init,
            autocast=False,
        )
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings",
            shape=(self.type_vocab_size, self.hidden_size),
            initializer=init,
            autocast=False,
        )
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_position_embeddings, self.hidden_size),
            initializer=init,
            autocast=False,
        )
        self.layer_norm.build((*input_shape, self.hidden_size))

    def call(self, input_ids, segment_ids, training=False, word_table=None):
        # word_table: a view of word_embeddings to look the ids up in (heads.tied_table_views).
        seq_len = ops.shape(input_ids)[1]
        table = self.word_embeddings if word_table is None else word_table
        dtype = self.compute_dtype
        x = layers.lookup_rows(table, input_ids, dtype)  # (B, S, H)
        x = x + layers.lookup_rows(self.token_type_embeddings, segment_ids, dtype)
        start = self.position_offset
        # (1, S, H) over B
        x = x + ops.cast(self.position_embeddings[None, start : start + seq_len, :], dtype)
        x = layers.residual_layer_norm(self.layer_norm, x, training=training)
        return self.dropout(x, training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "initializer_range": self.initializer_range,
            "position_offset": self.position_offset,
            "layer_norm_eps": self.layer_norm_eps,
        }


def last_layer_queries(output_positions):
    """The positions an encoder's last layer computes for `output_positions` (int (B, P) or
    None): [CLS] (position 0, for the pooler) first, then output_positions; None for all."""
    if output_positions is None:
        return None
    # zeros of (B, 1), not zeros_like(output_positions[:, :1]): P may be 0 (a classifier reads
    # [CLS] alone, finetuning.pooled_only_positions).
    cls = ops.zeros((ops.shape(output_positions)[0], 1), output_positions.dtype)
    return ops.concatenate([cls, output_positions], axis=1)  # (B, 1 + P)


def branch_sizes(batch, parts: int) -> list:
    """Row counts of `parts` contiguous slices of a batch of `batch` rows, as even as it allows
    (they differ by at most 1). A static (int) batch smaller than `parts` gives fewer slices, so
    none is empty; a dynamic one (a TensorFlow scalar) gives `parts` sizes, some 0 when it is
    smaller (every layer passes an empty batch through)."""
    if isinstance(batch, int):
        parts = max(1, min(parts, batch))
        return [batch // parts + (i < batch % parts) for i in range(parts)]
    return [(batch + parts - 1 - i) // parts for i in range(parts)]


def split_rows(x, sizes: list) -> list:
    """x (B, ...) cut along axis 0 into slices of the given row counts (branch_sizes)."""
    if len(sizes) == 1:
        return [x]
    if all(isinstance(n, int) for n in sizes):
        return ops.split(x, list(itertools.accumulate(sizes))[:-1], axis=0)
    import tensorflow as tf  # a dynamic batch exists only on TensorFlow

    return tf.split(x, tf.stack(sizes), num=len(sizes), axis=0)


def run_branch(stack, x, mask, queries, training, remove_padding):
    """run_layer_stack on one row slice: every layer's outputs in order."""
    unpadded = layers.Unpadded(mask) if remove_padding else None
    if unpadded is not None:
        x = unpadded.rows(x)  # (b, S, H) -> (1, R, H)
    outs = []
    for i, layer in enumerate(stack):
        last = i == len(stack) - 1
        outs.extend(layer(x, mask, training, queries if last else None, unpadded))
        x = outs[-1]
    if unpadded is not None:
        # Back to (b, S, H), but for the last layer's output at the query positions, which is
        # (b, Q, H) already.
        n = len(outs) - 1 if queries is not None and outs else len(outs)
        outs = [unpadded.positions(o) for o in outs[:n]] + outs[n:]
    return outs


def run_layer_stack(
    stack, x, mask, queries, training, branches: int = 1, remove_padding: bool = False
):
    """Runs an encoder's layers over x (B, S, H) and returns (x, outputs): the last layer's
    output and every layer's outputs in order. `stack`: one callable per layer, (x, mask,
    training, query_positions, unpadded) -> list of outputs whose last feeds the next layer (a
    BERT block gives one, an ALBERT group one per inner block); the last layer gets
    query_positions=queries.

    remove_padding runs the layers on the real tokens' rows alone (layers.Unpadded, made once
    per branch; TensorFlow outside XLA, since their count is known only when the batch is).
    The outputs are (B, S, H) again with zeros at padding, where the padded layout has values
    nobody reads; at real positions they are the same up to float rounding.

    branches K > 1 cuts the batch into K row slices (branch_sizes) and runs the whole stack on
    each, then joins each layer's outputs again. Every row's computation is the one it has in
    the whole batch, so the outputs are the same up to float rounding, dropout included: each
    slice draws its rows of the masks one pass draws (layers.RowSlice; on the real tokens'
    rows each slice draws masks of its own, as one pass there has no row order). Why: the K
    chains of ops are independent in the graph, and TensorFlow's executor interleaves them,
    filling the core time one chain leaves idle between its dependent ops. Measured on 2
    AVX-512 cores (README, fifteenth session): inference of L4/H256 at batch 32 1.06-1.16x,
    the L4/H256 fp32 pretraining step at batch 8 1.04-1.08x; nothing under bf16, under XLA
    (one XLA program has no independent ops to interleave) or at BERT-base (its large matmuls
    keep both cores busy). The gradient of the split is a concat."""
    if remove_padding:
        check_remove_padding(mask)
    n_rows = ops.shape(x)[0]
    sizes = branch_sizes(n_rows, branches)
    slices = [
        split_rows(t, sizes) if t is not None else [None] * len(sizes) for t in (x, mask, queries)
    ]
    per_branch = []
    seeds = {}  # the dropout seeds the slices share (layers.RowSlice)
    offsets = [0, *itertools.accumulate(sizes)]
    # Each slice draws its rows of the whole batch's dropout masks; on the real tokens' rows
    # (remove_padding) each draws masks of its own.
    in_slice = len(sizes) > 1 and not remove_padding
    for b, (xb, mb, qb) in enumerate(zip(*slices)):
        with layers.RowSlice(offsets[b], sizes[b], seeds) if in_slice else contextlib.nullcontext():
            outs = run_branch(stack, xb, mb, qb, training, remove_padding)
        per_branch.append(outs)
    if len(per_branch) == 1:
        outputs = per_branch[0]
    else:
        outputs = [ops.concatenate(list(o), axis=0) for o in zip(*per_branch)]
    return (outputs[-1] if outputs else x), outputs


def block_stack(blocks) -> list:
    """run_layer_stack's layer callables for a list of blocks, each called as block(x, mask,
    training=, query_positions=) and returning one output (layers.TransformerBlock) or a list of
    them (ALBERT's groups)."""

    def layer_of(block):
        def layer(x, mask, training, queries, unpadded):
            out = block(x, mask, training=training, query_positions=queries, unpadded=unpadded)
            return out if isinstance(out, list) else [out]

        return layer

    return [layer_of(block) for block in blocks]


def check_branches(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"encoder branches: expected an int >= 1, found {value!r}")
    return value


def set_encoder_branches(model, branches: int) -> list:
    """Sets `parallel_branches` (see run_layer_stack) on every encoder inside `model` (a bare
    encoder, a pretrainer, ELECTRA's generator and discriminator, a task model) and returns the
    names of the encoders set. An execution setting, like jit_compile: not part of the config or
    the checkpoint. Raises ValueError when `model` holds no encoder that supports it."""
    check_branches(branches)
    found = [m for m in model._flatten_layers() if hasattr(m, "parallel_branches")]
    if not found:
        raise ValueError(
            f"encoder branches: {type(model).__name__} holds no encoder that runs in branches "
            "(BertEncoder, AlbertEncoder, ElectraEncoder)"
        )
    for m in found:
        m.parallel_branches = branches
    return [m.name for m in found]


# auto_encoder_branches' smallest encoder width: below it 2 branches measured 1.00-1.03x (L2/H32
# and L2/H64 on an AMD Zen 5 AVX-512 host, 68th session), where the graph's op count, which two
# branches double, is what the step's time goes to (and the tests' tiny models trace it).
AUTO_BRANCHES_MIN_HIDDEN = 128


def auto_encoder_branches(
    model,
    devices,
    precision: str,
    use_xla: bool,
    remove_padding: bool,
    parallel_micro_batches: int,
    rows: int,
) -> tuple[int, str]:
    """The entrypoints' --encoder_branches where it is not given: (K, why), K = 2 for an fp32
    step on CPUs of an encoder at least AUTO_BRANCHES_MIN_HIDDEN wide whose micro-batch has
    `rows` >= 2 rows per replica, else 1. `devices`: the strategy's worker devices.

    Why 2 there: with each slice drawing its rows of one pass' dropout masks (run_layer_stack),
    the branches change no result beyond float rounding, and on every CPU measured they made
    the fp32 step faster: L4/H256 pretraining at batch 8 1.03-1.09x on AMD Zen 4 and Intel
    AVX-512 hosts and an AVX2 host with oneDNN off, 1.03-1.23x on an AMD Zen 5 host (1.07x
    there with oneDNN off), BERT-base 1.00-1.11x, the default run's L2/H128 at batch 32
    1.05-1.08x without XLA (README, bench/HISTORY.md). Why 1 elsewhere: nothing gained under
    bf16 (1.01x) or XLA (0.997x: one XLA program has no independent ops to interleave), slower
    together with --parallel_micro_batches (0.89x), unmeasured on accelerators, and on the real
    tokens' rows (remove_padding) each slice draws dropout masks of its own."""
    found = [m for m in model._flatten_layers() if hasattr(m, "parallel_branches")]
    if not found:
        return 1, "no encoder that runs in branches"
    if not devices or any("CPU" not in str(d).upper() for d in devices):
        return 1, "not measured on accelerators"
    reasons = [
        (precision != "fp32", f"--precision={precision}"),
        (use_xla, "--use_xla"),
        (remove_padding, "--remove_padding"),
        (parallel_micro_batches > 1, f"--parallel_micro_batches={parallel_micro_batches}"),
        (rows < 2, f"{rows} row(s) per replica and micro-batch"),
    ]
    for hit, why in reasons:
        if hit:
            return 1, why
    width = max(m.config.hidden_size for m in found)
    if width < AUTO_BRANCHES_MIN_HIDDEN:
        return 1, f"hidden_size {width} < {AUTO_BRANCHES_MIN_HIDDEN}"
    return 2, f"an fp32 step on CPUs, hidden_size {width}, {rows} rows per replica"


def check_remove_padding(mask) -> None:
    """Raises ValueError where an encoder cannot run on its real tokens' rows: without an
    input mask, on a backend other than TensorFlow, or inside XLA (jit_compile, TPU), whose
    programs have static shapes."""
    if mask is None:
        raise ValueError("remove padding: the encoder was called without an input_mask")
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "remove padding: needs Keras' TensorFlow backend (the rows' count is known only "
            f"when the batch is), found {keras.backend.backend()!r}"
        )
    if layers.in_xla_context():
        raise ValueError(
            "remove padding: XLA (--use_xla, TPUs) compiles static shapes, and the real "
            "tokens' count changes with each batch; run without one of the two"
        )


def set_remove_padding(model, remove_padding: bool, static_shapes: str = "") -> list:
    """Sets `remove_padding` (see run_layer_stack) on every encoder inside `model`, as
    set_encoder_branches sets branches, and returns the names of the encoders set (logged when
    set on). An execution setting: not part of the config or the checkpoint. static_shapes: why
    the run needs static shapes ("--use_xla compiles static shapes"), or ""; called under a
    TPUStrategy's scope, that is "a TPU needs static shapes". Raises ValueError when `model`
    holds no encoder that supports it, Keras' backend is not TensorFlow, or the run needs
    static shapes."""
    if not isinstance(remove_padding, bool):
        raise ValueError(f"remove padding: expected a bool, found {remove_padding!r}")
    if not static_shapes and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy):
            static_shapes = "a TPU needs static shapes"
    if remove_padding and static_shapes:
        raise ValueError(
            f"remove padding: {static_shapes}, and the real tokens' count changes with each batch"
        )
    found = [m for m in model._flatten_layers() if hasattr(m, "remove_padding")]
    if not found:
        raise ValueError(
            f"remove padding: {type(model).__name__} holds no encoder that runs on its real "
            "tokens alone (BertEncoder, AlbertEncoder, ElectraEncoder)"
        )
    if remove_padding and keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"remove padding: needs Keras' TensorFlow backend, found {keras.backend.backend()!r}"
        )
    for m in found:
        m.remove_padding = remove_padding
    names = [m.name for m in found]
    if remove_padding:
        logging.info(
            "--remove_padding: %s run on each batch's real tokens (the logged FLOP/s count the "
            "products they run, at each batch's real-token rows)",
            ", ".join(names),
        )
    return names


def set_execution_options(
    model,
    encoder_branches: int = 1,
    remove_padding: bool = False,
    xla_weight_gradients: bool = False,
    static_shapes: str = "",
) -> None:
    """The entrypoints' --encoder_branches, --remove_padding and --xla_weight_gradients on a
    built `model` (set_encoder_branches, set_remove_padding with `static_shapes`,
    layers.set_xla_weight_gradients); each left alone at its default. Raises ValueError whose
    message starts with the flag, e.g. "--encoder_branches=0: ...", which the entrypoints
    report as a usage error."""
    checks = (
        (encoder_branches != 1, f"--encoder_branches={encoder_branches}",
         lambda: set_encoder_branches(model, encoder_branches)),
        (remove_padding, "--remove_padding",
         lambda: set_remove_padding(model, True, static_shapes)),
        # logs the layers' count, and warns where oneDNN is off
        (xla_weight_gradients, "--xla_weight_gradients",
         lambda: layers.set_xla_weight_gradients(model)),
    )  # fmt: skip
    for wanted, flag, apply in checks:
        if wanted:
            try:
                apply()
            except ValueError as e:
                raise ValueError(f"{flag}: {e}") from None


def unpadded_rows(model, mask):
    """The rows the encoders inside `model` run their layers' per-position work at on a batch
    of `mask` (int (..., S), every sequence's input_mask), as float32: each branch slice's
    layers.unpadded_rows, summed, as run_layer_stack cuts the batch (the encoders'
    parallel_branches). None where they run on the padded layout (remove_padding off), whose
    count is the batch's shape. What the tasks' FLOP counts read (training/tasks.py,
    training/finetune_tasks.py): the work run, not the padded layout's. Raises ValueError where
    the encoders of `model` do not share one setting (set_remove_padding and
    set_encoder_branches set them all alike)."""
    found = [m for m in model._flatten_layers() if hasattr(m, "remove_padding")]
    settings = {(m.remove_padding, m.parallel_branches) for m in found}
    if len(settings) > 1:
        raise ValueError(
            f"remove padding: the encoders of {type(model).__name__} differ in "
            f"(remove_padding, parallel_branches): {sorted(settings)}; FLOPs not counted"
        )
    if not found or not found[0].remove_padding:
        return None
    import tensorflow as tf  # remove_padding runs on TensorFlow alone (check_remove_padding)

    mask = tf.reshape(mask, [-1, tf.shape(mask)[-1]])  # multiple choice: (B, C, S) -> (B*C, S)
    sizes = branch_sizes(tf.shape(mask)[0], found[0].parallel_branches)
    return tf.cast(tf.add_n([layers.unpadded_rows(m) for m in split_rows(mask, sizes)]), tf.float32)


def encoder_result(x, outputs, queries, pooler) -> dict:
    """An encoder's output dict (see BertEncoder) from its last layer x: (B, S, H), or
    (B, 1 + P, H) at last_layer_queries' positions when `queries` is not None."""
    if queries is not None:
        if not outputs[1:]:  # no Transformer layer: gather from the embedding output
            x = layers.gather_positions(x, queries)
        outputs[-1] = x[:, 1:, :]
    pooled = pooler(x[:, 0, :])  # (B, H) from the [CLS] position
    return {"sequence_output": outputs[-1], "pooled_output": pooled, "encoder_outputs": outputs}


@keras.saving.register_keras_serializable(package="cloze")
class BertEncoder(keras.Model):
    """The BERT backbone: embeddings, `num_hidden_layers` Transformer blocks and the pooler.

    call(inputs, training, output_positions) with inputs a dict of int (B, S) tensors
    `input_ids`, `input_mask`, `segment_ids` returns a dict:
      sequence_output: float (B, S, H), the last layer;
      pooled_output: float (B, H), tanh(dense([CLS] vector)) as the original pooler;
      encoder_outputs: list of L+1 float (B, S, H): the embedding output, then every layer.
    With output_positions int (B, P), the last layer computes only the [CLS] vector and those
    positions (layers.TransformerBlock's query_positions): sequence_output is then (B, P, H),
    the last layer's outputs at output_positions, and so is the last of encoder_outputs.
    The attribute parallel_branches (default 1; set_encoder_branches sets it) runs the layers on
    that many row slices of the batch, joined after the last (run_layer_stack); remove_padding
    (default False; set_remove_padding) runs them on the real tokens alone, and the outputs are
    then zeros at padding.
    word_table: a view of the word embeddings to look input_ids up in instead of the variable
    (a pretrainer's, heads.tied_table_views, so the tied head's gradient and the lookup's meet
    in one sum); ALBERT's and ELECTRA's encoders take it too.
    """

    def __init__(self, config: BertConfig | dict, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = BertConfig.from_dict(config)
        self.config = config
        c = config
        self.embeddings = BertEmbeddings(
            c.vocab_size,
            c.hidden_size,
            c.max_position_embeddings,
            c.type_vocab_size,
            c.hidden_dropout_prob,
            c.initializer_range,
            c.position_offset,
            c.layer_norm_eps,
            name="embeddings",
        )
        # One attribute per block, not a list: tf.train.Checkpoint does not follow Keras'
        # TrackedList, so blocks kept in a list would silently be left out of checkpoints.
        for i in range(c.num_hidden_layers):
            block = layers.TransformerBlock(
                c.hidden_size,
                c.num_attention_heads,
                c.intermediate_size,
                c.hidden_act,
                c.hidden_dropout_prob,
                c.attention_probs_dropout_prob,
                c.initializer_range,
                c.layer_norm_eps,
                name=f"layer_{i}",
            )
            setattr(self, f"layer_{i}", block)
        self.pooler = layers.Dense(c.hidden_size, "tanh", c.initializer_range, name="pooler")
        self.parallel_branches = 1  # run_layer_stack's branches; set_encoder_branches sets it
        self.remove_padding = False  # run_layer_stack's; set_remove_padding sets it

    @property
    def blocks(self) -> list:
        return [getattr(self, f"layer_{i}") for i in range(self.config.num_hidden_layers)]

    def build(self, input_shape=None):
        shape = (None, None)
        self.embeddings.build(shape)
        for block in self.blocks:
            block.build((None, None, self.config.hidden_size))
        self.pooler.build((None, self.config.hidden_size))
        self.built = True

    def call(self, inputs, training=False, output_positions=None, word_table=None):
        mask = inputs["input_mask"]
        embedded = self.embeddings(
            inputs["input_ids"], inputs["segment_ids"], training=training, word_table=word_table
        )
        queries = last_layer_queries(output_positions)
        x, outputs = run_layer_stack(
            block_stack(self.blocks),
            embedded,
            mask,
            queries,
            training,
            self.parallel_branches,
            self.remove_padding,
        )
        return encoder_result(x, [embedded, *outputs], queries, self.pooler)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def dummy_inputs(batch_size: int = 1, seq_length: int = 8) -> dict:
    """All-ones inputs that build a model's weights with one forward pass."""
    ones = ops.ones((batch_size, seq_length), dtype="int32")
    return {"input_ids": ones, "input_mask": ones, "segment_ids": ops.zeros_like(ones)}


# ---------------------------------------------------------------------------------------------
# Pre-training model: masked LM + a sentence-level objective (+ SpanBERT's span boundaries)
# ---------------------------------------------------------------------------------------------

# "nsp": is B the actual next segment (BERT sec. 3.1); "sop": are A and B in their original order
# (ALBERT, Lan et al. 2020, sec. 4.2); "none": no sentence-level loss (RoBERTa, Liu et al. 2019,
# sec. 4.2). NSP and SOP share one 2-way head on the pooled [CLS] vector.
SENTENCE_OBJECTIVES = ("nsp", "sop", "none")


def check_pretrainer_options(sentence_objective: str) -> None:
    if sentence_objective not in SENTENCE_OBJECTIVES:
        raise ValueError(
            f"sentence_objective: expected one of {SENTENCE_OBJECTIVES}, found "
            f"{sentence_objective!r}"
        )


def build_pretraining_heads(model) -> None:
    """Builds a pretrainer's encoder and heads (BertPretrainer, albert.AlbertPretrainer): the
    heads read hidden-size vectors and project to the vocabulary through the tied table."""
    h, v = model.config.hidden_size, model.config.vocab_size
    model.encoder.build()
    model.masked_lm.build((None, None, h), v)
    model.next_sentence.build((None, h))
    if model.span_boundary:
        model.span_boundary_head.build((None, None, h), v)
    model.built = True


def pretraining_outputs(model, inputs, training: bool) -> dict:
    """The forward pass every masked-LM pretrainer shares (see BertPretrainer's docstring): the
    MLM head at the masked positions through the tied word table ((V, H) for BERT, (V, E) for
    ALBERT), the 2-way sentence head on the pooled vector, and optionally the span boundary
    head. The encoder's last layer computes only the positions these heads read (its
    output_positions): [CLS], the masked positions and, with span_boundary, the span boundaries.
    In training, when the inputs hold masked_lm_ids, also mlm_xent and mlm_hits (B, P): the MLM
    head's cross-entropy and hits, computed vocabulary-major (heads.tied_xent_and_hits), which
    the pretraining task reads instead of mlm_logits; inside a tf.function TensorFlow prunes
    whichever of the two a loss does not read.
    """
    positions = inputs["masked_lm_positions"]  # (B, P)
    wanted = positions
    if model.span_boundary:
        left, right = inputs["masked_lm_span_left"], inputs["masked_lm_span_right"]
        wanted = ops.concatenate([positions, left, right], axis=1)  # (B, 3P)
    # One view of the tied table for the lookup, one for the heads: their gradients are summed
    # in one pass (heads.tied_table_views).
    (lookup_table,), table = heads.tied_table_views(
        model.encoder.embeddings.word_embeddings, model.compute_dtype
    )
    out = model.encoder(inputs, training=training, output_positions=wanted, word_table=lookup_table)
    vectors = out["sequence_output"]  # (B, P, H), or (B, 3P, H): at positions, left, right
    p = ops.shape(positions)[1]
    result = {"nsp_logits": model.next_sentence(out["pooled_output"])}
    if training and "masked_lm_ids" in inputs:
        # One head call: the logits and the fused terms share the head's transform.
        result["mlm_logits"], result["mlm_xent"], result["mlm_hits"] = model.masked_lm(
            vectors[:, :p, :], None, table, label_ids=inputs["masked_lm_ids"]
        )
    else:
        result["mlm_logits"] = model.masked_lm(vectors[:, :p, :], None, table)
    if model.span_boundary:
        result["sbo_logits"] = model.span_boundary_head.from_boundaries(
            vectors[:, p : 2 * p, :], vectors[:, 2 * p :, :], positions, left, table
        )
    return result


@keras.saving.register_keras_serializable(package="cloze")
class BertPretrainer(keras.Model):
    """BERT with its pre-training heads (Devlin et al. 2019, sec. 3.1).

    call(inputs, training) with inputs the pretraining TFRecord features as int32 tensors:
      input_ids, input_mask, segment_ids: (B, S); masked_lm_positions: (B, P); with
      span_boundary also masked_lm_span_left, masked_lm_span_right: (B, P).
    Returns a dict: mlm_logits float (B, P, V), computed only at the masked positions (the
    vocabulary projection is the costliest matmul, so skip the other S - P positions; and the
    encoder's last layer, too, runs only where a head reads it: pretraining_outputs),
    nsp_logits float (B, 2) (the SOP logits under sentence_objective "sop"), and with
    span_boundary sbo_logits float (B, P, V). In training, when inputs hold masked_lm_ids
    (B, P), also mlm_xent and mlm_hits float32 (B, P), the MLM loss terms computed without the
    (B, P, V) logits (pretraining_outputs).

    Args:
      config: the encoder's BertConfig (or its dict).
      sentence_objective: one of SENTENCE_OBJECTIVES. The 2-way head exists under every choice,
        so every pretraining checkpoint has one layout and loads into every pretrainer; under
        "none" it and the pooler (which only that head trains) are frozen, not trained.
      span_boundary: add SpanBERT's span boundary head (heads.SpanBoundaryHead).
    """

    def __init__(
        self,
        config: BertConfig | dict,
        sentence_objective: str = "nsp",
        span_boundary: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = BertConfig.from_dict(config)
        check_pretrainer_options(sentence_objective)
        self.config = config
        self.sentence_objective = sentence_objective
        self.span_boundary = span_boundary
        c = config
        self.encoder = BertEncoder(config, name="encoder")
        self.masked_lm = heads.MaskedLMHead(
            c.hidden_size, c.hidden_act, c.initializer_range, c.layer_norm_eps, name="masked_lm"
        )
        self.next_sentence = heads.ClassificationHead(2, c.initializer_range, name="next_sentence")
        if sentence_objective == "none":
            self.next_sentence.trainable = False
            self.encoder.pooler.trainable = False
        if span_boundary:
            self.span_boundary_head = heads.SpanBoundaryHead(
                c.hidden_size,
                c.hidden_size,
                c.hidden_act,
                c.initializer_range,
                layer_norm_eps=c.layer_norm_eps,
                name="span_boundary",
            )

    def build(self, input_shape=None):
        build_pretraining_heads(self)

    def call(self, inputs, training=False):
        return pretraining_outputs(self, inputs, training)

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config.to_dict(),
            "sentence_objective": self.sentence_objective,
            "span_boundary": self.span_boundary,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def load_config(path, max_seq_length: int, vocab_size: int | None = None) -> BertConfig:
    """Reads a bert_config.json and checks it against the run: the sequence length fits the
    position table, and a vocabulary of `vocab_size` tokens fits the embedding table."""
    config = BertConfig.from_json_file(path)
    check_run_fits(config, path, max_seq_length, vocab_size)
    return config


def check_run_fits(config, path, max_seq_length: int, vocab_size: int | None = None) -> None:
    """Raises InputError naming the config file when the run's sequence length does not fit the
    position table (after the position offset) or the vocabulary does not fit the embeddings."""
    offset = getattr(config, "position_offset", 0)
    if max_seq_length + offset > config.max_position_embeddings:
        raise InputError(
            f"{path}: max_position_embeddings={config.max_position_embeddings} is shorter than "
            f"--max_seq_length={max_seq_length}"
            + (f" plus position_offset={offset}" if offset else "")
        )
    if vocab_size is not None and vocab_size > config.vocab_size:
        raise InputError(
            f"{path}: vocab_size={config.vocab_size} is smaller than the vocabulary's "
            f"{vocab_size} tokens"
        )


# ---------------------------------------------------------------------------------------------
# Distillation (DistilBERT): a smaller student initialised from its teacher
# ---------------------------------------------------------------------------------------------

# What a student must share with its teacher: the soft targets need one vocabulary, the cosine
# loss and the copied layers one hidden size, the copied blocks their other shapes, and the
# copied weights the computation they were trained in (a RoBERTa teacher's position offset and
# LayerNorm epsilon).
STUDENT_MUST_MATCH = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "type_vocab_size",
    "max_position_embeddings",
    "position_offset",
    "layer_norm_eps",
)


def check_student_fits_teacher(student: BertConfig, teacher: BertConfig, where: str) -> None:
    """Raises InputError naming the student's config file (`where`) and what to change when the
    student cannot learn from (or start from) the teacher: a differing STUDENT_MUST_MATCH field,
    or more layers than the teacher has."""
    for name in STUDENT_MUST_MATCH:
        mine, theirs = getattr(student, name), getattr(teacher, name)
        if mine != theirs:
            raise InputError(
                f"{where}: {name}={mine} differs from the teacher's {name}={theirs}; a student "
                f"keeps the teacher's {name} (set it to {theirs}) and has fewer layers"
            )
    if student.num_hidden_layers > teacher.num_hidden_layers:
        raise InputError(
            f"{where}: num_hidden_layers={student.num_hidden_layers} is more than the teacher's "
            f"{teacher.num_hidden_layers}; a student has at most the teacher's layers"
        )


def student_layer_sources(student_layers: int, teacher_layers: int) -> list[int]:
    """The teacher layer each student layer starts from: one out of every k = L_t // L_s,
    i.e. 0, 2, 4, ... for half the depth (DistilBERT sec. 3, "taking one layer out of two")."""
    stride = teacher_layers // student_layers
    return [i * stride for i in range(student_layers)]


def init_student_from_teacher(student: BertPretrainer, teacher: BertPretrainer) -> list[int]:
    """Copies the teacher's embeddings, pooler, heads and every `stride`-th layer into the
    student (student_layer_sources). Both built; check_student_fits_teacher first. Returns the
    teacher layer of each student layer."""
    sources = student_layer_sources(
        student.config.num_hidden_layers, teacher.config.num_hidden_layers
    )
    pairs = [(student.encoder.embeddings, teacher.encoder.embeddings)]
    pairs += [(student.encoder.blocks[i], teacher.encoder.blocks[j]) for i, j in enumerate(sources)]
    pairs += [
        (student.encoder.pooler, teacher.encoder.pooler),
        (student.masked_lm, teacher.masked_lm),
        (student.next_sentence, teacher.next_sentence),
    ]
    for mine, theirs in pairs:
        for a, b in zip(mine.weights, theirs.weights, strict=True):
            if "seed_generator" not in a.path:
                a.assign(b)
    return sources
