"""ALBERT (Lan et al. 2020): config, encoder with a factorised embedding and shared layers, and the
pre-training model (masked LM + sentence-order prediction).

Read top to bottom: `AlbertConfig` (the original `albert_config.json` fields), `AlbertLayerGroup`
(the blocks one group shares), `AlbertEncoder` (the backbone; it returns the same dict as
BertEncoder, so the fine-tuning models wrap either), `AlbertPretrainer`.

ALBERT's Transformer block computes exactly BERT's (post-LayerNorm attention + FFN), so the blocks
are layers.TransformerBlock; what differs is around them:
  - factorised embedding (sec. 3.1): word, position and segment tables of width E =
    embedding_size, LayerNorm over E, then one dense E -> H (`embedding_hidden_mapping_in`);
  - cross-layer sharing (sec. 3.1): `num_hidden_groups` groups of `inner_group_num` blocks each;
    layer l of `num_hidden_layers` runs group int(l / L * G), i.e. its inner blocks in turn;
  - the MLM head's transform outputs E and ties to the (V, E) word table.

Variable layout, chosen so the original TF1 names map by a plain table (see tests/test_albert.py):
  encoder/embeddings/{word,token_type,position}_embeddings, layer_norm   <- bert/embeddings/...
  encoder/embedding_hidden_mapping_in/{kernel,bias}  <- bert/encoder/embedding_hidden_mapping_in
  encoder/group_g/inner_group_k/attention/qkv        <- .../transformer/group_g/inner_group_k/
                                                        attention_1/self/{query,key,value} (fused)
      .../attention/output_dense                     <- .../attention_1/output/dense
      .../attention_layer_norm                       <- .../LayerNorm
      .../intermediate                               <- .../ffn_1/intermediate/dense
      .../output_dense                               <- .../ffn_1/intermediate/output/dense
      .../output_layer_norm                          <- .../LayerNorm_1
  encoder/pooler                                     <- bert/pooler/dense
  masked_lm/transform, layer_norm, output_bias       <- cls/predictions/transform/dense, ...
  next_sentence/dense                                <- cls/seq_relationship/output_weights (T)
Shapes: B batch, S length, E embedding width, H hidden, P predictions, V vocab, L layers,
G groups.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import keras

from modeling import bert, electra, heads, layers

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlbertConfig(bert.JsonConfig):
    """The original google-research/albert `AlbertConfig` / `albert_config.json`, field for field.

    The published albert_config.json files carry eighteen keys. Fourteen define the model and are
    required. `down_scale_factor`, `net_structure_type`, `gap_size` and `num_memory_blocks` are
    read by no code path of the public ALBERT release; they are optional here and must keep the
    values every released config has (1, 0, 0, 0), so a config that asks for something else
    fails instead of silently training a plain ALBERT. Unknown keys are an error.
    """

    OPTIONAL: ClassVar[frozenset] = frozenset(
        {"down_scale_factor", "net_structure_type", "gap_size", "num_memory_blocks"}
    )
    FAMILY: ClassVar[str] = "ALBERT"
    FILE_KIND: ClassVar[str] = "an albert_config.json file"

    vocab_size: int
    embedding_size: int = 128
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    down_scale_factor: int = 1
    net_structure_type: int = 0
    gap_size: int = 0
    num_memory_blocks: int = 0

    def __post_init__(self):
        bert.check_encoder_fields(self)
        if not 1 <= self.num_hidden_groups <= self.num_hidden_layers:
            raise ValueError(
                f"AlbertConfig: num_hidden_groups {self.num_hidden_groups} must be in "
                f"[1, num_hidden_layers={self.num_hidden_layers}]"
            )
        if self.inner_group_num < 1:
            raise ValueError(f"AlbertConfig: inner_group_num {self.inner_group_num} must be >= 1")
        unused = {
            "down_scale_factor": 1,
            "net_structure_type": 0,
            "gap_size": 0,
            "num_memory_blocks": 0,
        }
        for name, want in unused.items():
            if getattr(self, name) != want:
                raise ValueError(
                    f"AlbertConfig.{name}: expected {want} (the public ALBERT code implements no "
                    f"other value), found {getattr(self, name)!r}"
                )


def is_albert_config(values) -> bool:
    """An ALBERT config is told from a BERT one by its `embedding_size` key, and from an ELECTRA
    one (which has embedding_size too) by the absence of ELECTRA's generator keys."""
    return (
        isinstance(values, dict)
        and "embedding_size" in values
        and not electra.is_electra_config(values)
    )


def encoder_config_from_dict(values, source: str = "config"):
    """A BertConfig, AlbertConfig or ElectraConfig from its dict, told apart by its keys."""
    if electra.is_electra_config(values):
        return electra.ElectraConfig.from_dict(values, source=source)
    if is_albert_config(values):
        return AlbertConfig.from_dict(values, source=source)
    return bert.BertConfig.from_dict(values, source=source)


def load_encoder_config(path, max_seq_length: int, vocab_size: int | None = None):
    """Reads a bert_config.json, albert_config.json or ELECTRA config (told apart by their keys,
    see encoder_config_from_dict) and checks it against the run as bert.load_config does."""
    values = bert.read_config_json(path, "a bert_config.json, albert_config.json or ELECTRA config")
    config = encoder_config_from_dict(values, source=str(path))
    bert.check_run_fits(config, path, max_seq_length, vocab_size)
    return config


def load_config(path, max_seq_length: int, vocab_size: int | None = None) -> AlbertConfig:
    """Reads an albert_config.json and checks it against the run (see bert.load_config)."""
    config = AlbertConfig.from_json_file(path)
    bert.check_run_fits(config, path, max_seq_length, vocab_size)
    return config


# ---------------------------------------------------------------------------------------------
# Shared layer groups and the encoder backbone
# ---------------------------------------------------------------------------------------------


def group_of_layer(layer_index: int, num_hidden_layers: int, num_hidden_groups: int) -> int:
    """The group layer `layer_index` runs: the original's int(l / L * G)."""
    return int(layer_index / num_hidden_layers * num_hidden_groups)


@keras.saving.register_keras_serializable(package="cloze")
class AlbertLayerGroup(keras.layers.Layer):
    """`inner_group_num` Transformer blocks applied in turn; a group's weights are shared by every
    layer that runs it.

    call(x, attention_mask, training): float (B, S, H), (B, S) -> list of inner_group_num
    float (B, S, H), the output of each block (the last is the group's output).
    """

    def __init__(
        self,
        inner_group_num,
        hidden_size,
        num_attention_heads,
        intermediate_size,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.inner_group_num = inner_group_num
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        # Attributes, not a list: tf.train.Checkpoint does not follow Keras' TrackedList.
        for k in range(inner_group_num):
            block = layers.TransformerBlock(
                hidden_size,
                num_attention_heads,
                intermediate_size,
                hidden_act,
                hidden_dropout_prob,
                attention_probs_dropout_prob,
                initializer_range,
                name=f"inner_group_{k}",
            )
            setattr(self, f"inner_group_{k}", block)

    @property
    def blocks(self) -> list:
        return [getattr(self, f"inner_group_{k}") for k in range(self.inner_group_num)]

    def build(self, input_shape):
        for block in self.blocks:
            block.build(input_shape)

    def call(self, x, attention_mask=None, training=False, query_positions=None, unpadded=None):
        """Every block's output; query_positions (B, Q), if given, goes to the last block
        (layers.TransformerBlock), whose output is then (B, Q, H). With unpadded (a
        layers.Unpadded), x and the outputs are the real tokens' rows (1, R, H)."""
        outputs = []
        blocks = self.blocks
        for i, block in enumerate(blocks):
            last = i == len(blocks) - 1
            queries = query_positions if last else None
            x = block(
                x, attention_mask, training=training, query_positions=queries, unpadded=unpadded
            )
            outputs.append(x)
        return outputs

    def get_config(self):
        return {
            **super().get_config(),
            "inner_group_num": self.inner_group_num,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "initializer_range": self.initializer_range,
        }


@keras.saving.register_keras_serializable(package="cloze")
class AlbertEncoder(keras.Model):
    """The ALBERT backbone: factorised embeddings, shared layer groups and the pooler.

    call(inputs, training, output_positions) with inputs a dict of int (B, S) tensors
    `input_ids`, `input_mask`, `segment_ids` returns BertEncoder's dict:
      sequence_output: float (B, S, H), the last block's output;
      pooled_output: float (B, H), tanh(dense([CLS] vector));
      encoder_outputs: list of L * inner_group_num + 1 float (B, S, H): the projected embedding
        output, then every block applied (the original's `all_encoder_layers`).
    output_positions as BertEncoder's: the last block computes only [CLS] and those positions.
    """

    def __init__(self, config: AlbertConfig | dict, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = AlbertConfig.from_dict(config)
        self.config = config
        c = config
        self.embeddings = bert.BertEmbeddings(
            c.vocab_size,
            c.embedding_size,
            c.max_position_embeddings,
            c.type_vocab_size,
            c.hidden_dropout_prob,
            c.initializer_range,
            name="embeddings",
        )
        # As the original transformer_model: the E -> H projection exists only when E != H, so
        # a checkpoint of either kind has exactly the variables the original would.
        self.embedding_hidden_mapping_in = (
            layers.Dense(
                c.hidden_size, None, c.initializer_range, name="embedding_hidden_mapping_in"
            )
            if c.embedding_size != c.hidden_size
            else None
        )
        for g in range(c.num_hidden_groups):
            group = AlbertLayerGroup(
                c.inner_group_num,
                c.hidden_size,
                c.num_attention_heads,
                c.intermediate_size,
                c.hidden_act,
                c.hidden_dropout_prob,
                c.attention_probs_dropout_prob,
                c.initializer_range,
                name=f"group_{g}",
            )
            setattr(self, f"group_{g}", group)
        self.pooler = layers.Dense(c.hidden_size, "tanh", c.initializer_range, name="pooler")
        self.parallel_branches = 1  # bert.run_layer_stack's; bert.set_encoder_branches sets it
        self.remove_padding = False  # bert.run_layer_stack's; bert.set_remove_padding sets it

    @property
    def groups(self) -> list:
        return [getattr(self, f"group_{g}") for g in range(self.config.num_hidden_groups)]

    def group_of_layer(self, layer_index: int) -> int:
        """The group layer `layer_index` runs (module-level `group_of_layer`)."""
        c = self.config
        return group_of_layer(layer_index, c.num_hidden_layers, c.num_hidden_groups)

    def build(self, input_shape=None):
        c = self.config
        self.embeddings.build((None, None))
        if self.embedding_hidden_mapping_in is not None:
            self.embedding_hidden_mapping_in.build((None, None, c.embedding_size))
        for group in self.groups:
            group.build((None, None, c.hidden_size))
        self.pooler.build((None, c.hidden_size))
        self.built = True

    def call(self, inputs, training=False, output_positions=None, word_table=None):
        mask = inputs["input_mask"]
        x = self.embeddings(
            inputs["input_ids"], inputs["segment_ids"], training=training, word_table=word_table
        )
        if self.embedding_hidden_mapping_in is not None:
            x = self.embedding_hidden_mapping_in(x)  # (B, S, E) -> (B, S, H)
        queries = bert.last_layer_queries(output_positions)
        groups = self.groups
        stack = bert.block_stack(
            [groups[self.group_of_layer(i)] for i in range(self.config.num_hidden_layers)]
        )
        embedded = x
        x, outputs = bert.run_layer_stack(
            stack, x, mask, queries, training, self.parallel_branches, self.remove_padding
        )
        return bert.encoder_result(x, [embedded, *outputs], queries, self.pooler)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


# ---------------------------------------------------------------------------------------------
# Pre-training model: masked LM + sentence-order prediction
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class AlbertPretrainer(keras.Model):
    """ALBERT with its pre-training heads: MLM through the factorised embedding and a 2-way
    sentence head, sentence-order prediction by default (Lan et al. 2020, sec. 4.2).

    Same inputs, outputs and options as bert.BertPretrainer (sentence_objective "sop", "nsp" or
    "none"; span_boundary), with E = embedding_size as the MLM (and span boundary) output width.
    """

    def __init__(
        self,
        config: AlbertConfig | dict,
        sentence_objective: str = "sop",
        span_boundary: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = AlbertConfig.from_dict(config)
        bert.check_pretrainer_options(sentence_objective)
        self.config = config
        self.sentence_objective = sentence_objective
        self.span_boundary = span_boundary
        c = config
        self.encoder = AlbertEncoder(config, name="encoder")
        self.masked_lm = heads.MaskedLMHead(
            c.embedding_size, c.hidden_act, c.initializer_range, name="masked_lm"
        )
        self.next_sentence = heads.ClassificationHead(2, c.initializer_range, name="next_sentence")
        if sentence_objective == "none":
            self.next_sentence.trainable = False
            self.encoder.pooler.trainable = False
        if span_boundary:
            self.span_boundary_head = heads.SpanBoundaryHead(
                c.hidden_size,
                c.embedding_size,
                c.hidden_act,
                c.initializer_range,
                name="span_boundary",
            )

    def build(self, input_shape=None):
        bert.build_pretraining_heads(self)

    def call(self, inputs, training=False):
        return bert.pretraining_outputs(self, inputs, training)

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
