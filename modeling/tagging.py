"""Token tagging on a BERT encoder, fine-tuned or feature-based, and frozen layer features.

`BertTagger` is the NER model of Devlin et al. 2019: a linear layer over each position's vector
(sec. 5.3: the first WordPiece of a word carries its label; data_prep/conll.py aligns them).
With `feature_mode="finetune"` the whole encoder trains and the classifier reads the last layer.
The other modes reproduce the feature-based variants of the paper's table 7: the encoder is
frozen (not trainable, and run without dropout) and the classifier reads

  embeddings        the embedding output (layer 0)
  second_to_last    layer L - 1
  last              layer L
  sum_last_four     a learned weighted sum of layers L-3..L (ScalarMix)
  concat_last_four  layers L-3..L concatenated (4 H wide)
  sum_all           a learned weighted sum of all L + 1 outputs, embeddings included (ELMo's
                    scalar mix mixes every layer, Peters et al. 2018 eq. 1; the BERT paper's
                    "weighted sum all 12 layers" leaves the embeddings out)

The paper put a two-layer 768-wide BiLSTM between the features and the classifier; here that is
optional (`lstm_units` > 0, `lstm_layers` layers, one per direction of `lstm_units`), off by
default so that the modes compare the features themselves with one linear layer. The encoder
sits in the attribute `encoder`, so a pretraining checkpoint's `model/encoder` loads into it
(training/trainer.init_from_checkpoint).
Shapes: B batch, S length, H hidden, L layers, K chosen layers, C tags.
"""

from __future__ import annotations

import keras
from keras import ops

from modeling import heads
from modeling.bert import BertConfig, BertEncoder

# mode -> (indices into the encoder's L + 1 outputs, how they combine); None: all of them.
FEATURE_MODES = {
    "finetune": ((-1,), "single"),
    "embeddings": ((0,), "single"),
    "second_to_last": ((-2,), "single"),
    "last": ((-1,), "single"),
    "sum_last_four": ((-4, -3, -2, -1), "mix"),
    "concat_last_four": ((-4, -3, -2, -1), "concat"),
    "sum_all": (None, "mix"),
}
# Dropout before the tag classifier, as the classifier's (run_classifier's keep_prob 0.9).
TAGGER_DROPOUT = 0.1


@keras.saving.register_keras_serializable(package="cloze")
class ScalarMix(keras.layers.Layer):
    """ELMo's task-specific layer combination (Peters et al. 2018, eq. 1):

        mix = gamma * sum_j softmax(w)_j h_j

    with one learned scalar w_j per layer (initialised to 0: an equal mix) and a learned scale
    gamma (initialised to 1). call(layers): a list of K float (B, S, H) tensors -> (B, S, H).
    Under Cloze's AdamW the weights w get the 0.01 weight decay, which pulls the mix towards
    equal weights as ELMo's L2 term on w does; gamma is exempt (its name is on the no-decay
    list, training/optimization.NO_DECAY_PATTERNS).
    """

    def __init__(self, num_layers: int, **kwargs):
        super().__init__(**kwargs)
        if num_layers < 1:
            raise ValueError(f"ScalarMix needs at least one layer, found {num_layers}")
        self.num_layers = num_layers

    def build(self, input_shape=None):
        self.scalar_weights = self.add_weight(
            name="scalar_weights", shape=(self.num_layers,), initializer="zeros"
        )
        self.gamma = self.add_weight(name="gamma", shape=(), initializer="ones")

    def call(self, layers):
        if len(layers) != self.num_layers:
            raise ValueError(f"ScalarMix({self.num_layers}) got {len(layers)} layers")
        weights = ops.softmax(self.scalar_weights)  # (K,)
        dtype = layers[0].dtype
        mixed = sum(ops.cast(weights[j], dtype) * h for j, h in enumerate(layers))  # (B, S, H)
        return ops.cast(self.gamma, dtype) * mixed

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers}


def layer_indices(mode: str, num_hidden_layers: int) -> list[int]:
    """Indices into the encoder's L + 1 outputs (0 = embeddings) that `mode` reads."""
    if mode not in FEATURE_MODES:
        raise ValueError(f"feature_mode: expected one of {list(FEATURE_MODES)}, found {mode!r}")
    chosen, _ = FEATURE_MODES[mode]
    total = num_hidden_layers + 1
    if chosen is None:
        return list(range(total))
    needed = max(-i if i < 0 else i + 1 for i in chosen)
    if needed > total:
        raise ValueError(
            f"feature_mode={mode} needs {needed} layer outputs; a {num_hidden_layers}-layer "
            f"encoder has {total} (embeddings + layers)"
        )
    return [i % total for i in chosen]


@keras.saving.register_keras_serializable(package="cloze")
class BertTagger(keras.Model):
    """BERT for token tagging (sec. 5.3), fine-tuned or on frozen features (see the docstring).

    call(inputs, training) with inputs a dict of int (B, S) `input_ids`, `input_mask`,
    `segment_ids` returns logits float32 (B, S, C) at every position.

    Args:
      config: the encoder's BertConfig (or its dict).
      num_labels: C, the number of tags.
      feature_mode: a key of FEATURE_MODES.
      lstm_units: width of each direction of an optional BiLSTM over the features (0 = none).
      lstm_layers: how many BiLSTM layers, when lstm_units > 0.
      dropout_rate: dropout before the classifier.
    """

    def __init__(
        self,
        config: BertConfig | dict,
        num_labels: int,
        feature_mode: str = "finetune",
        lstm_units: int = 0,
        lstm_layers: int = 2,
        dropout_rate: float = TAGGER_DROPOUT,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = BertConfig.from_dict(config)
        if lstm_units < 0 or (lstm_units and lstm_layers < 1):
            raise ValueError(f"lstm_units={lstm_units}, lstm_layers={lstm_layers}: need >= 1")
        self.config = config
        self.num_labels = num_labels
        self.feature_mode = feature_mode
        self.lstm_units = lstm_units
        self.lstm_layers = lstm_layers
        self.dropout_rate = dropout_rate
        self.indices = layer_indices(feature_mode, config.num_hidden_layers)
        self.combine = FEATURE_MODES[feature_mode][1]
        self.encoder = BertEncoder(config, name="encoder")
        # The pooler gets no gradient in tagging; frozen, it still loads and saves.
        self.encoder.pooler.trainable = False
        if feature_mode != "finetune":
            self.encoder.trainable = False
        self.scalar_mix = (
            ScalarMix(len(self.indices), name="scalar_mix") if self.combine == "mix" else None
        )
        # One attribute per layer, not a list (tf.train.Checkpoint, see BertEncoder).
        for i in range(lstm_layers if lstm_units else 0):
            lstm = keras.layers.LSTM(lstm_units, return_sequences=True)
            setattr(self, f"lstm_{i}", keras.layers.Bidirectional(lstm, name=f"lstm_{i}"))
        self.dropout = keras.layers.Dropout(dropout_rate)
        self.classifier = heads.ClassificationHead(
            num_labels, config.initializer_range, name="classifier"
        )

    @property
    def frozen(self) -> bool:
        return self.feature_mode != "finetune"

    @property
    def lstms(self) -> list:
        return [
            getattr(self, f"lstm_{i}") for i in range(self.lstm_layers if self.lstm_units else 0)
        ]

    @property
    def feature_width(self) -> int:
        h = self.config.hidden_size
        return h * len(self.indices) if self.combine == "concat" else h

    def build(self, input_shape=None):
        self.encoder.build()
        if self.scalar_mix is not None:
            self.scalar_mix.build()
        width = self.feature_width
        for lstm in self.lstms:
            lstm.build((None, None, width))
            width = 2 * self.lstm_units
        self.classifier.build((None, None, width))
        self.built = True

    def features(self, inputs, training=False):
        """The chosen layers combined: float (B, S, H), or (B, S, K H) for concat."""
        # A frozen encoder is a fixed feature extractor: no dropout inside it.
        out = self.encoder(inputs, training=training and not self.frozen)
        chosen = [out["encoder_outputs"][i] for i in self.indices]  # K x (B, S, H)
        if self.combine == "mix":
            return self.scalar_mix(chosen)
        if self.combine == "concat":
            return ops.concatenate(chosen, axis=-1)  # (B, S, K*H)
        return chosen[0]

    def call(self, inputs, training=False):
        x = self.features(inputs, training=training)
        if self.lstm_units:
            mask = ops.cast(inputs["input_mask"], "bool")  # (B, S): padding is skipped
            for lstm in self.lstms:
                x = lstm(x, mask=mask, training=training)  # (B, S, 2 * units)
            # Zero at padding; a new tensor also drops the Keras mask the LSTM attached, which
            # the dense head does not take.
            x = ops.where(mask[:, :, None], x, ops.zeros_like(x))
        logits = self.classifier(self.dropout(x, training=training))  # (B, S, C)
        return ops.cast(logits, "float32")

    def get_config(self):
        return {
            **super().get_config(),
            "config": self.config.to_dict(),
            "num_labels": self.num_labels,
            "feature_mode": self.feature_mode,
            "lstm_units": self.lstm_units,
            "lstm_layers": self.lstm_layers,
            "dropout_rate": self.dropout_rate,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def transformer_layer_indices(layers, num_hidden_layers: int) -> list[int]:
    """extract_features' `--layers` (the original's meaning: indices into the L Transformer
    layers, -1 the last, 0 the first) as indices into the encoder's L + 1 outputs."""
    out = []
    for i in layers:
        if not -num_hidden_layers <= i < num_hidden_layers:
            raise ValueError(
                f"layer index {i} is outside a {num_hidden_layers}-layer encoder "
                f"([-{num_hidden_layers}, {num_hidden_layers - 1}])"
            )
        out.append(i % num_hidden_layers + 1)
    return out


@keras.saving.register_keras_serializable(package="cloze")
class BertLayerFeatures(keras.Model):
    """A frozen encoder that returns chosen Transformer layers' outputs (extract_features.py).

    call(inputs) with the three int (B, S) inputs returns float32 (B, S, K, H): layer
    `layers[k]` at [:, :, k], with `layers` as the original's --layers (see
    transformer_layer_indices).
    """

    def __init__(self, config: BertConfig | dict, layers=(-1, -2, -3, -4), **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = BertConfig.from_dict(config)
        self.config = config
        self.layers_ = tuple(int(i) for i in layers)
        self.indices = transformer_layer_indices(self.layers_, config.num_hidden_layers)
        self.encoder = BertEncoder(config, name="encoder")
        self.encoder.trainable = False

    def build(self, input_shape=None):
        self.encoder.build()
        self.built = True

    def call(self, inputs, training=False):
        out = self.encoder(inputs, training=False)["encoder_outputs"]
        chosen = [out[i] for i in self.indices]  # K x (B, S, H)
        return ops.cast(ops.stack(chosen, axis=2), "float32")  # (B, S, K, H)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(), "layers": self.layers_}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
