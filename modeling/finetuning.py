"""Fine-tuning models: a BERT encoder plus a small task head (Devlin et al. 2019, sec. 4).

`BertClassifier` is the original run_classifier's model: dropout on the pooled [CLS] vector, then
one linear layer; with num_classes=1 it is the STS-B regressor. `BertMultipleChoice` scores each
(context, ending) pair with one shared vector and normalises over the choices (sec. 4.4, SWAG).

Both keep the backbone in an attribute named `encoder`, the name the pre-training model uses, so a
pretraining checkpoint's `model/encoder` loads into them (training/trainer.init_from_checkpoint).
The backbone is a BertEncoder, an AlbertEncoder for an AlbertConfig or an ElectraEncoder (the
discriminator) for an ElectraConfig; all three return the same outputs.
Shapes: B batch, C choices, S length, H hidden.
"""

from __future__ import annotations

import keras
from keras import ops

from modeling import albert, electra, heads, layers
from modeling.bert import BertConfig, BertEncoder

# The original run_classifier applies dropout with keep_prob 0.9 to the pooled output whatever the
# config says (create_model: tf.nn.dropout(output_layer, keep_prob=0.9)).
CLASSIFIER_DROPOUT = 0.1
POOLINGS = ("cls", "mean")


def pool(encoder_outputs: dict, input_mask, pooling: str):
    """The sentence vector a head reads.

    "cls": the pooler's tanh(dense([CLS])), trained by next-sentence prediction (BERT sec. 3.1).
    "mean": the mean of the last layer over real tokens; a pretraining run without a
    sentence-level objective never trains the pooler (shared/NOTES.md), and this skips it.
    encoder_outputs: BertEncoder's dict; input_mask int (B, S). Returns float (B, H).
    """
    if pooling == "cls":
        return encoder_outputs["pooled_output"]
    if pooling == "mean":
        x = encoder_outputs["sequence_output"]  # (B, S, H)
        m = ops.cast(input_mask, x.dtype)[:, :, None]  # (B, S, 1)
        return ops.sum(x * m, axis=1) / ops.maximum(ops.sum(m, axis=1), 1.0)  # (B, H)
    raise ValueError(f"pooling: expected one of {POOLINGS}, found {pooling!r}")


def pooled_only_positions(input_ids, pooling: str):
    """The encoder's output_positions for a head that reads only the pooled vector: int (B, 0)
    for "cls" pooling, so the last layer computes [CLS] alone (bert.last_layer_queries; its
    keys and values stay at every position); None for "mean", which reads every position.

    Why: a classifier reads one vector of the last layer, and every step after its attention
    is per position, so its Q projection, attention output, FFN and LayerNorms at the other
    S - 1 positions are work no output depends on: about 80% of the last layer at sequence
    128. The pooled vector is the same (tests/test_finetuning.py).
    """
    if pooling != "cls":
        return None
    return ops.zeros((ops.shape(input_ids)[0], 0), "int32")


def _config(config):
    """A BertConfig, AlbertConfig or ElectraConfig, from itself or its dict (told apart by its
    keys, albert.encoder_config_from_dict)."""
    if isinstance(config, dict):
        return albert.encoder_config_from_dict(config)
    return config


# The backbone of each config family; all return BertEncoder's dict.
ENCODERS = {
    BertConfig: BertEncoder,
    albert.AlbertConfig: albert.AlbertEncoder,
    electra.ElectraConfig: electra.ElectraEncoder,
}


def encoder_for(config, name: str = "encoder"):
    """The backbone for a BertConfig, AlbertConfig or ElectraConfig (or its dict)."""
    config = _config(config)
    return ENCODERS[type(config)](config, name=name)


def _encoder(config: BertConfig, pooling: str) -> BertEncoder:
    encoder = encoder_for(config)
    # ELECTRA has no pooler: its [CLS] vector is the pooled output.
    if pooling == "mean" and getattr(encoder, "pooler", None) is not None:
        # The pooler gets no gradient then; frozen, its weights still load from and save to
        # checkpoints, and the train step sees no None gradient.
        encoder.pooler.trainable = False
    return encoder


@keras.saving.register_keras_serializable(package="cloze")
class BertClassifier(keras.Model):
    """BERT for single-sentence and sentence-pair classification or regression (sec. 4.1).

    call(inputs, training) with inputs a dict of int (B, S) `input_ids`, `input_mask`,
    `segment_ids` returns logits float32 (B, num_classes); for regression num_classes is 1 and the
    single column is the predicted score.

    Args:
      config: the encoder's BertConfig (or its dict).
      num_classes: output width.
      dropout_rate: dropout on the pooled vector (the original's 0.1).
      pooling: "cls" (the original) or "mean", see `pool`.
    """

    def __init__(
        self,
        config: BertConfig | dict,
        num_classes: int,
        dropout_rate: float = CLASSIFIER_DROPOUT,
        pooling: str = "cls",
        **kwargs,
    ):
        super().__init__(**kwargs)
        config = _config(config)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {POOLINGS}, found {pooling!r}")
        self.config = config
        self.num_classes = num_classes
        self.dropout_rate = dropout_rate
        self.pooling = pooling
        self.encoder = _encoder(config, pooling)
        self.dropout = layers.Dropout(dropout_rate)
        self.classifier = heads.ClassificationHead(
            num_classes, config.initializer_range, name="classifier"
        )

    def build(self, input_shape=None):
        self.encoder.build()
        self.classifier.build((None, self.config.hidden_size))
        self.built = True

    def call(self, inputs, training=False):
        out = self.encoder(
            inputs,
            training=training,
            output_positions=pooled_only_positions(inputs["input_ids"], self.pooling),
        )
        pooled = pool(out, inputs["input_mask"], self.pooling)  # (B, H)
        logits = self.classifier(self.dropout(pooled, training=training))  # (B, num_classes)
        return ops.cast(logits, "float32")

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config.to_dict(),
            "num_classes": self.num_classes,
            "dropout_rate": self.dropout_rate,
            "pooling": self.pooling,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="cloze")
class BertMultipleChoice(keras.Model):
    """BERT for multiple choice (SWAG, sec. 4.4): one score per (context, ending) sequence.

    call(inputs, training) with inputs a dict of int (B, C, S) `input_ids`, `input_mask`,
    `segment_ids` returns logits float32 (B, C), to be normalised with a softmax over C. The
    only task parameters are one vector (and bias) dotted with each pooled vector.
    """

    def __init__(
        self,
        config: BertConfig | dict,
        dropout_rate: float = CLASSIFIER_DROPOUT,
        pooling: str = "cls",
        **kwargs,
    ):
        super().__init__(**kwargs)
        config = _config(config)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling: expected one of {POOLINGS}, found {pooling!r}")
        self.config = config
        self.dropout_rate = dropout_rate
        self.pooling = pooling
        self.encoder = _encoder(config, pooling)
        self.dropout = layers.Dropout(dropout_rate)
        self.classifier = heads.ClassificationHead(1, config.initializer_range, name="classifier")

    def build(self, input_shape=None):
        self.encoder.build()
        self.classifier.build((None, self.config.hidden_size))
        self.built = True

    def call(self, inputs, training=False):
        flat, choices = layers.flatten_choices(inputs, ("input_ids", "input_mask", "segment_ids"))
        out = self.encoder(
            flat,
            training=training,
            output_positions=pooled_only_positions(flat["input_ids"], self.pooling),
        )
        pooled = pool(out, flat["input_mask"], self.pooling)  # (B*C, H)
        scores = self.classifier(self.dropout(pooled, training=training))  # (B*C, 1)
        return ops.cast(ops.reshape(scores, choices), "float32")  # (B, C)

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config.to_dict(),
            "dropout_rate": self.dropout_rate,
            "pooling": self.pooling,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
