"""BERT (Devlin et al. 2019): config, embeddings, encoder backbone and the pre-training model.

Read top to bottom: `BertConfig` (the original `bert_config.json` fields), `BertEmbeddings`,
`BertEncoder` (the backbone every task model wraps), `BertPretrainer` (MLM + NSP heads).
RoBERTa is this family with another config and data recipe. Shapes: B batch, S length, H hidden,
P predictions per sequence, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import keras
from keras import ops

from data_prep.errors import InputError
from modeling import heads, layers

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The original google-research/bert `BertConfig`, field for field.

    Every field is required in a JSON file (a published `bert_config.json` has all eleven), and an
    unknown key is an error: a typo must not silently train a different model.
    `hidden_act="gelu"` means the tanh approximation, as the original TF1 code computed it;
    `"gelu_exact"` is the erf form that Hugging Face checkpoints use.
    """

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

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"BertConfig.{f.name}: expected an integer, found {value!r}")
            if f.type == "float" and not isinstance(value, int | float):
                raise ValueError(f"BertConfig.{f.name}: expected a number, found {value!r}")
        layers.get_activation(self.hidden_act)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> BertConfig:
        """Builds a config from a dict; `source` names where it came from in error messages."""
        if not isinstance(values, dict):
            raise InputError(f"{source}: expected a JSON object, found {type(values).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        missing = [n for n in names if n not in values]
        if unknown:
            raise InputError(
                f"{source}: unknown key(s) {unknown}; a BERT config has exactly {names}"
            )
        if missing:
            raise InputError(
                f"{source}: missing key(s) {missing}; a BERT config needs all of {names}"
            )
        try:
            return cls(**values)
        except ValueError as e:
            raise InputError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path) -> BertConfig:
        """Reads a `bert_config.json`; errors name the file (and the JSON line on syntax errors)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(
                f"{path}: expected a bert_config.json file, found no such file"
            ) from None
        except UnicodeDecodeError as e:
            raise InputError(
                f"{path}: expected UTF-8 JSON, found byte at offset {e.start}"
            ) from None
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(
                f"{path}:{e.lineno}: expected JSON, found a syntax error ({e.msg})"
            ) from None
        return cls.from_dict(values, source=str(path))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def replace(self, **changes) -> BertConfig:
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------
# Embeddings and the encoder backbone
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class BertEmbeddings(keras.layers.Layer):
    """Token + segment + learned absolute position embeddings, then LayerNorm and dropout.

    call(input_ids, segment_ids, training): int (B, S), int (B, S) -> float (B, S, H).
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        max_position_embeddings,
        type_vocab_size,
        hidden_dropout_prob=0.1,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.hidden_dropout_prob = hidden_dropout_prob
        self.initializer_range = initializer_range
        self.layer_norm = layers.layer_norm("layer_norm")
        self.dropout = keras.layers.Dropout(hidden_dropout_prob)

    def build(self, input_shape):
        init = layers.truncated_normal(self.initializer_range)
        self.word_embeddings = self.add_weight(
            name="word_embeddings", shape=(self.vocab_size, self.hidden_size), initializer=init
        )
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings",
            shape=(self.type_vocab_size, self.hidden_size),
            initializer=init,
        )
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_position_embeddings, self.hidden_size),
            initializer=init,
        )
        self.layer_norm.build((*input_shape, self.hidden_size))

    def call(self, input_ids, segment_ids, training=False):
        seq_len = ops.shape(input_ids)[1]
        x = ops.take(self.word_embeddings, input_ids, axis=0)  # (B, S, H)
        x = x + ops.take(self.token_type_embeddings, segment_ids, axis=0)
        x = x + self.position_embeddings[None, :seq_len, :]  # (1, S, H) broadcast over B
        return self.dropout(self.layer_norm(x), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "initializer_range": self.initializer_range,
        }


@keras.saving.register_keras_serializable(package="cloze")
class BertEncoder(keras.Model):
    """The BERT backbone: embeddings, `num_hidden_layers` Transformer blocks and the pooler.

    call(inputs, training) with inputs a dict of int (B, S) tensors `input_ids`, `input_mask`,
    `segment_ids` returns a dict:
      sequence_output: float (B, S, H), the last layer;
      pooled_output: float (B, H), tanh(dense([CLS] vector)) as the original pooler;
      encoder_outputs: list of L+1 float (B, S, H): the embedding output, then every layer.
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
                name=f"layer_{i}",
            )
            setattr(self, f"layer_{i}", block)
        self.pooler = layers.Dense(c.hidden_size, "tanh", c.initializer_range, name="pooler")

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

    def call(self, inputs, training=False):
        mask = inputs["input_mask"]
        x = self.embeddings(inputs["input_ids"], inputs["segment_ids"], training=training)
        outputs = [x]
        for block in self.blocks:
            x = block(x, mask, training=training)
            outputs.append(x)
        pooled = self.pooler(x[:, 0, :])  # (B, H) from the [CLS] position
        return {"sequence_output": x, "pooled_output": pooled, "encoder_outputs": outputs}

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
# Pre-training model: masked LM + next sentence prediction
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class BertPretrainer(keras.Model):
    """BERT with its two pre-training heads (Devlin et al. 2019, sec. 3.1).

    call(inputs, training) with inputs the pretraining TFRecord features as int32 tensors:
      input_ids, input_mask, segment_ids: (B, S); masked_lm_positions: (B, P).
    Returns a dict: mlm_logits float (B, P, V), computed only at the masked positions (the
    vocabulary projection is the costliest matmul, so skip the other S - P positions), and
    nsp_logits float (B, 2).
    """

    def __init__(self, config: BertConfig | dict, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = BertConfig.from_dict(config)
        self.config = config
        self.encoder = BertEncoder(config, name="encoder")
        self.masked_lm = heads.MaskedLMHead(
            config.hidden_size, config.hidden_act, config.initializer_range, name="masked_lm"
        )
        self.next_sentence = heads.ClassificationHead(
            2, config.initializer_range, name="next_sentence"
        )

    def build(self, input_shape=None):
        self.encoder.build()
        self.masked_lm.build((None, None, self.config.hidden_size), self.config.vocab_size)
        self.next_sentence.build((None, self.config.hidden_size))
        self.built = True

    def call(self, inputs, training=False):
        out = self.encoder(inputs, training=training)
        mlm_logits = self.masked_lm(
            out["sequence_output"],
            inputs["masked_lm_positions"],
            self.encoder.embeddings.word_embeddings,
        )
        nsp_logits = self.next_sentence(out["pooled_output"])
        return {"mlm_logits": mlm_logits, "nsp_logits": nsp_logits}

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def load_config(path, max_seq_length: int, vocab_size: int | None = None) -> BertConfig:
    """Reads a bert_config.json and checks it against the run: the sequence length fits the
    position table, and a vocabulary of `vocab_size` tokens fits the embedding table."""
    config = BertConfig.from_json_file(path)
    if max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"{path}: max_position_embeddings={config.max_position_embeddings} is shorter than "
            f"--max_seq_length={max_seq_length}"
        )
    if vocab_size is not None and vocab_size > config.vocab_size:
        raise InputError(
            f"{path}: vocab_size={config.vocab_size} is smaller than the vocabulary's "
            f"{vocab_size} tokens"
        )
    return config
