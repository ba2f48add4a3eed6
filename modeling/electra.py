"""ELECTRA (Clark et al. 2020): config, encoder, and the pre-training pair of a small generator and
a discriminator trained jointly with replaced token detection.

Read top to bottom: `ElectraConfig` (BERT's fields plus the embedding width and the generator's
size as fractions, the original's hparams), `ElectraEncoder` (the backbone; it returns
BertEncoder's dict, so the fine-tuning models wrap it), the replaced-token functions
(`sample_tokens`, `replace_tokens`, pure and seeded), `ElectraPretrainer`.

The Transformer blocks compute exactly BERT's; what differs (sec. 3, 3.2 and Appendix A):
  - the embeddings have their own width E = embedding_size, projected to H by a dense
    `embeddings_project` when E != H (ELECTRA-Small: E 128, H 256);
  - no pooler: the [CLS] vector is the sentence representation (the original modeling.py's
    `pooled_output = sequence_output[:, 0]`), which the classifier reads through dropout;
  - the generator is a smaller encoder (hidden H * generator_hidden_size, layers
    L * generator_layers, 4 H_g intermediate, H_g / 64 heads) with BERT's MLM head; it shares
    the embedding layer (word, position and segment tables and their LayerNorm) with the
    discriminator (sec. 3.2, "weight sharing");
  - the discriminator sees the input with each masked position replaced by a token sampled from
    the generator's softmax, and a per-token binary head says which tokens were replaced. A
    sampled token equal to the original counts as original (sec. 2).

Variable layout, chosen so the original TF1 names map by a plain table (modeling/checkpoints.py
tf1_electra_entries):
  encoder/embeddings/...                 <- electra/embeddings/... (generator/embeddings is the
                                            same layer, so the same variables)
  encoder/embeddings_project             <- electra/embeddings_project        (E != H only)
  encoder/layer_n/...                    <- electra/encoder/layer_n/... (BERT's names)
  generator/embeddings_project           <- generator/embeddings_project      (E != H_g only)
  generator/layer_n/...                  <- generator/encoder/layer_n/...
  generator_predictions/transform, layer_norm, output_bias
                                         <- generator_predictions/dense, LayerNorm, output_bias
  discriminator_predictions/dense, dense_1 <- discriminator_predictions/dense, dense_1
The discriminator is `encoder`, the attribute every run script loads from --init_checkpoint, so a
pretraining checkpoint fine-tunes the discriminator (the model ELECTRA releases for tasks).
Shapes: B batch, S length, E embedding width, H hidden, P predictions, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import keras
import tensorflow as tf
from keras import ops

from modeling import bert, heads, layers

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ElectraConfig(bert.JsonConfig):
    """The discriminator's BertConfig fields (google-research/electra's modeling.BertConfig,
    field for field) plus three of the original's PretrainingConfig hparams that shape the
    weights: `embedding_size`, `generator_hidden_size` and `generator_layers` (fractions of the
    discriminator's hidden size and depth; 0.25 and 1.0 for ELECTRA-Small).

    ELECTRA published no config file; configs/electra_small.json and electra_base.json hold the
    paper's Table 6 sizes. Every key is required and an unknown key is an error; the generator
    keys are what tells an ELECTRA config from an ALBERT one (both have embedding_size).
    `hidden_act`: Cloze's names (layers.ACTIVATIONS); the original ELECTRA's "gelu" is the exact
    erf form, Cloze's "gelu_exact".
    """

    OPTIONAL: ClassVar[frozenset] = frozenset()
    FAMILY: ClassVar[str] = "ELECTRA"
    FILE_KIND: ClassVar[str] = "an ELECTRA config JSON file"

    vocab_size: int
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu_exact"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    embedding_size: int = 128
    generator_hidden_size: float = 0.25
    generator_layers: float = 1.0

    def __post_init__(self):
        bert.check_encoder_fields(self)
        if self.embedding_size < 1:
            raise ValueError(f"ElectraConfig: embedding_size {self.embedding_size} must be >= 1")
        h, n = self.generator_sizes()
        if h < 1 or n < 1:
            raise ValueError(
                f"ElectraConfig: generator_hidden_size {self.generator_hidden_size} and "
                f"generator_layers {self.generator_layers} give a generator of hidden size {h} "
                f"and {n} layers; both must be >= 1"
            )
        heads_g = generator_heads(h)
        if h % heads_g:
            raise ValueError(
                f"ElectraConfig: the generator's hidden size {h} (hidden_size * "
                f"generator_hidden_size) is not a multiple of its {heads_g} heads (one per 64 "
                "units); choose another generator_hidden_size"
            )

    def generator_sizes(self) -> tuple[int, int]:
        """(hidden size, layers) of the generator, rounded as the original's
        get_generator_config: int(round(H * generator_hidden_size)), likewise for L."""
        return (
            int(round(self.hidden_size * self.generator_hidden_size)),
            int(round(self.num_hidden_layers * self.generator_layers)),
        )

    def generator_config(self) -> ElectraConfig:
        """The generator's encoder config: the original's get_generator_config (intermediate
        4 H_g, one head per 64 units); embedding width, vocab and dropout as the
        discriminator's. Its own generator_* fields mean nothing."""
        h, n = self.generator_sizes()
        return self.replace(
            hidden_size=h,
            num_hidden_layers=n,
            intermediate_size=4 * h,
            num_attention_heads=generator_heads(h),
            generator_hidden_size=1.0,
            generator_layers=1.0,
        )


# How ELECTRA corrupts the generator's input when it masks on the fly (--masking=dynamic): of the
# predicted positions 85% become [MASK] and 15% keep their token, none gets a random one. Not in
# the paper; it is the original code's choice (google-research/electra pretrain_helpers.mask,
# `tf.less(tf.random.uniform([B, N]), 0.85)`), which BERT's 80/10/10 would otherwise replace.
# (mask_token_prob, random_token_prob) of masking.DynamicMasking.
DYNAMIC_MASKING = {"mask_token_prob": 0.85, "random_token_prob": 0.0}


def generator_heads(hidden_size: int) -> int:
    """The original get_generator_config's head count: max(1, H_g // 64)."""
    return max(1, hidden_size // 64)


def is_electra_config(values) -> bool:
    """An ELECTRA config is told by its generator keys (ALBERT's also has embedding_size)."""
    return isinstance(values, dict) and "generator_hidden_size" in values


# ---------------------------------------------------------------------------------------------
# The encoder backbone
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class ElectraEncoder(keras.Model):
    """The ELECTRA backbone: embeddings of width E, a dense E -> H when E != H, then
    `num_hidden_layers` Transformer blocks. No pooler.

    call(inputs, training, output_positions) with inputs a dict of int (B, S) tensors
    `input_ids`, `input_mask`, `segment_ids` returns BertEncoder's dict:
      sequence_output: float (B, S, H), the last layer;
      pooled_output: float (B, H), the [CLS] vector itself (the original's pooled output);
      encoder_outputs: list of L+1 float (B, S, H): the projected embeddings, then every layer.
    output_positions as BertEncoder's: the last layer computes only [CLS] and those positions.

    Args:
      config: an ElectraConfig (or its dict).
      embeddings: a bert.BertEmbeddings layer of width E to use instead of a new one: how the
        generator shares the discriminator's embeddings. Not part of get_config; the model that
        shares them (ElectraPretrainer) rebuilds the sharing.
    """

    def __init__(self, config: ElectraConfig | dict, embeddings=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = ElectraConfig.from_dict(config)
        self.config = config
        c = config
        self.embeddings = (
            embeddings
            if embeddings is not None
            else bert.BertEmbeddings(
                c.vocab_size,
                c.embedding_size,
                c.max_position_embeddings,
                c.type_vocab_size,
                c.hidden_dropout_prob,
                c.initializer_range,
                name="embeddings",
            )
        )
        # As the original BertModel: the projection exists only when the widths differ.
        self.embeddings_project = (
            layers.Dense(c.hidden_size, None, c.initializer_range, name="embeddings_project")
            if c.embedding_size != c.hidden_size
            else None
        )
        # One attribute per block (tf.train.Checkpoint does not follow Keras' TrackedList).
        for i in range(c.num_hidden_layers):
            block = layers.TransformerBlock(
                c.hidden_size,
                c.num_attention_heads,
                c.intermediate_size,
                c.hidden_act,
                c.hidden_dropout_prob,
                c.attention_probs_dropout_prob,
                c.initializer_range,
                name=f"layer_{i}",
            )
            setattr(self, f"layer_{i}", block)
        self.parallel_branches = 1  # bert.run_layer_stack's; bert.set_encoder_branches sets it
        self.remove_padding = False  # bert.run_layer_stack's; bert.set_remove_padding sets it

    @property
    def blocks(self) -> list:
        return [getattr(self, f"layer_{i}") for i in range(self.config.num_hidden_layers)]

    def build(self, input_shape=None):
        c = self.config
        if not self.embeddings.built:  # a shared layer is built once, by whichever comes first
            self.embeddings.build((None, None))
        if self.embeddings_project is not None:
            self.embeddings_project.build((None, None, c.embedding_size))
        for block in self.blocks:
            block.build((None, None, c.hidden_size))
        self.built = True

    def call(self, inputs, training=False, output_positions=None, word_table=None):
        mask = inputs["input_mask"]
        x = self.embeddings(
            inputs["input_ids"], inputs["segment_ids"], training=training, word_table=word_table
        )
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)  # (B, S, E) -> (B, S, H)
        queries = bert.last_layer_queries(output_positions)
        embedded = x
        x, outputs = bert.run_layer_stack(
            bert.block_stack(self.blocks),
            x,
            mask,
            queries,
            training,
            self.parallel_branches,
            self.remove_padding,
        )
        return bert.encoder_result(x, [embedded, *outputs], queries, lambda cls: cls)  # no pooler

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="cloze")
class DiscriminatorHead(keras.layers.Layer):
    """The replaced-token detector: dense H -> H with the config's activation, then dense H -> 1
    (the original `discriminator_predictions/dense` and `dense_1`).

    call(sequence): float (B, S, H) -> logits float (B, S), > 0 meaning "replaced".
    """

    def __init__(self, hidden_size, hidden_act="gelu", initializer_range=0.02, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.dense = layers.Dense(hidden_size, hidden_act, initializer_range, name="dense")
        self.dense_1 = layers.Dense(1, None, initializer_range, name="dense_1")

    def build(self, input_shape):
        self.dense.build(input_shape)
        self.dense_1.build((*input_shape[:-1], self.hidden_size))

    def call(self, sequence):
        return ops.squeeze(self.dense_1(self.dense(sequence)), -1)  # (B, S, 1) -> (B, S)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
        }


# ---------------------------------------------------------------------------------------------
# Replaced tokens: sampling from the generator and the discriminator's input and labels
# ---------------------------------------------------------------------------------------------


def sample_tokens(logits, seed, temperature: float = 1.0):
    """One token per row of `logits`, drawn from softmax(logits / temperature) with the
    Gumbel-max trick, from stateless noise: the same logits and seed give the same tokens.

    logits: float (B, P, V); seed: int (2,). Returns int32 (B, P). No gradient flows (the
    original samples under stop_gradient: the generator is trained by its MLM loss only, sec. 2).
    """
    logits = tf.stop_gradient(tf.cast(logits, tf.float32))
    # Uniform on (0, 1) without its ends, so both logs stay finite.
    u = tf.random.stateless_uniform(tf.shape(logits), seed, minval=1e-9, maxval=1.0)
    gumbel = -tf.math.log(-tf.math.log(u))
    return tf.argmax(logits / temperature + gumbel, axis=-1, output_type=tf.int32)


def replace_tokens(input_ids, positions, original_ids, weights, sampled_ids):
    """The discriminator's input and labels (sec. 2): every real prediction's position gets its
    sampled token, every other position its original token; a position is labelled replaced (1)
    when its token differs from the original, so a sample equal to the original is "original".

    Args:
      input_ids: int (B, S), the generator's (masked) input.
      positions, original_ids: int (B, P), masked_lm_positions and masked_lm_ids.
      weights: float (B, P), masked_lm_weights: 0 for padding predictions, which change nothing.
      sampled_ids: int (B, P), the generator's samples.
    Returns (ids int32 (B, S), labels int32 (B, S)).
    """
    input_ids = tf.cast(input_ids, tf.int32)
    s = tf.shape(input_ids)[1]
    hit = tf.one_hot(positions, s, dtype=tf.int32)  # (B, P, S)
    hit *= tf.cast(tf.cast(weights, tf.float32) > 0, tf.int32)[:, :, None]
    masked = tf.reduce_max(hit, axis=1) > 0  # (B, S); positions of real predictions are unique
    original = tf.reduce_sum(hit * tf.cast(original_ids, tf.int32)[:, :, None], axis=1)  # (B, S)
    sampled = tf.reduce_sum(hit * tf.cast(sampled_ids, tf.int32)[:, :, None], axis=1)  # (B, S)
    ids = tf.where(masked, sampled, input_ids)
    labels = tf.cast(masked & tf.not_equal(sampled, original), tf.int32)
    return ids, labels


# ---------------------------------------------------------------------------------------------
# Pre-training model: generator MLM + replaced token detection
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class ElectraPretrainer(keras.Model):
    """ELECTRA's generator and discriminator, trained jointly (Clark et al. 2020, sec. 2).

    call(inputs, training, seed) with inputs the pretraining features as int32 tensors
    (input_ids (the masked input), input_mask, segment_ids: (B, S); masked_lm_positions,
    masked_lm_ids: (B, P); masked_lm_weights: float (B, P)) and seed int (2,) for the sampling.
    Returns a dict:
      mlm_logits: float (B, P, V), the generator's, at the masked positions;
      sampled_ids: int32 (B, P), the tokens drawn from them;
      disc_logits: float (B, S), the discriminator's "replaced" logits on the corrupted input;
      disc_labels: int32 (B, S), 1 where the corrupted input differs from the original.

    Args:
      config: the discriminator's ElectraConfig (or its dict); the generator's follows from it.
      temperature: sampling temperature (the original's `temperature`, 1.0).
    """

    def __init__(self, config: ElectraConfig | dict, temperature: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = ElectraConfig.from_dict(config)
        self.config = config
        self.temperature = temperature
        c = config
        self.encoder = ElectraEncoder(config, name="encoder")
        self.generator = ElectraEncoder(
            config.generator_config(), embeddings=self.encoder.embeddings, name="generator"
        )
        # The generator's MLM head projects to E and ties to the shared (V, E) word table.
        self.generator_predictions = heads.MaskedLMHead(
            c.embedding_size, c.hidden_act, c.initializer_range, name="generator_predictions"
        )
        self.discriminator_predictions = DiscriminatorHead(
            c.hidden_size, c.hidden_act, c.initializer_range, name="discriminator_predictions"
        )

    def build(self, input_shape=None):
        c = self.config
        self.encoder.build()
        self.generator.build()
        self.generator_predictions.build(
            (None, None, self.generator.config.hidden_size), c.vocab_size
        )
        self.discriminator_predictions.build((None, None, c.hidden_size))
        self.built = True

    def call(self, inputs, training=False, seed=None):
        if seed is None:
            seed = tf.constant([0, 0], tf.int64)
        positions = inputs["masked_lm_positions"]
        # The generator's last layer only at the masked positions: its MLM head reads no other.
        # The shared word table: a view for each encoder's lookup and one for the generator's
        # head, whose three gradients are summed in one pass (heads.tied_table_views).
        (generator_table, discriminator_table), table = heads.tied_table_views(
            self.encoder.embeddings.word_embeddings, self.compute_dtype, lookups=2
        )  # (V, E)
        generated = self.generator(
            inputs, training=training, output_positions=positions, word_table=generator_table
        )
        mlm_logits = self.generator_predictions(generated["sequence_output"], None, table)
        sampled = sample_tokens(mlm_logits, seed, self.temperature)  # (B, P)
        ids, labels = replace_tokens(
            inputs["input_ids"],
            positions,
            inputs["masked_lm_ids"],
            inputs["masked_lm_weights"],
            sampled,
        )
        corrupted = {k: inputs[k] for k in ("input_mask", "segment_ids")} | {"input_ids": ids}
        disc = self.encoder(corrupted, training=training, word_table=discriminator_table)
        return {
            "mlm_logits": mlm_logits,
            "sampled_ids": sampled,
            "disc_logits": self.discriminator_predictions(disc["sequence_output"]),
            "disc_labels": labels,
        }

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config.to_dict(),
            "temperature": self.temperature,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def load_config(path, max_seq_length: int, vocab_size: int | None = None) -> ElectraConfig:
    """Reads an ELECTRA config JSON and checks it against the run (see bert.load_config)."""
    config = ElectraConfig.from_json_file(path)
    bert.check_run_fits(config, path, max_seq_length, vocab_size)
    return config
