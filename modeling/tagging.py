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

`ElmoTagger` is the same head on ELMo's frozen biLM (Peters et al. 2018, sec. 3.3): its L + 1
representations (the token layer, then each biLSTM layer, modeling/elmo.elmo_layer_outputs) take
the place of the encoder's outputs, so the same modes apply (sum_all is ELMo's own scalar mix with
gamma; embeddings is the token layer). modeling/elmo.py imports ScalarMix from here, so this file
imports elmo inside functions.
Shapes: B batch, S length, H hidden (2 P for ELMo), L layers, K chosen layers, C tags.
"""

from __future__ import annotations

import keras
from keras import ops

from modeling import albert, finetuning, flops, heads, layers
from modeling.bert import BertConfig

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


def is_elmo(config) -> bool:
    from modeling import elmo

    return isinstance(config, elmo.ElmoConfig)


def is_xlnet(config) -> bool:
    from modeling import xlnet

    return isinstance(config, xlnet.XLNetConfig)


def encoder_for(config):
    """The tagger's Transformer: finetuning.encoder_for's (BERT, ALBERT, ELECTRA), or an
    XLNetModel, whose content streams are its encoder_outputs (no permutation in fine-tuning)."""
    from modeling import xlnet

    if is_xlnet(config):
        return xlnet.XLNetModel(config, name="encoder")
    return finetuning.encoder_for(config)


def encoder_layers(config) -> int:
    """How many Transformer blocks the encoder applies, i.e. its outputs less the embeddings: L,
    or L * inner_group_num for ALBERT, whose every inner block's output is one of its
    encoder_outputs (the original's all_encoder_layers); for ELMo its biLSTM layers."""
    if is_elmo(config):
        return config.lstm.n_layers
    if is_xlnet(config):
        return config.n_layer
    return flops.transformer_blocks(config)


def feature_width(config) -> int:
    """Width of each of the encoder's L + 1 outputs: H (XLNet's d_model), or 2 P for ELMo
    ([forward; backward])."""
    if is_elmo(config):
        return config.output_dim
    return config.d_model if is_xlnet(config) else config.hidden_size


def load_config(path, max_seq_length: int, vocab_size: int):
    """A tagger's encoder config from its JSON file: an ELMo options.json (modeling/elmo.py), an
    XLNet config (its released names), else a BERT, ALBERT or ELECTRA config
    (albert.load_encoder_config), checked against the run. Raises InputError naming the file."""
    from data_prep.errors import InputError
    from modeling import bert, elmo, xlnet

    values = bert.read_config_json(path, "a model config JSON file")
    if xlnet.is_xlnet_config(values):
        config = xlnet.XLNetConfig.from_dict(values, str(path))
        if vocab_size > config.n_token:
            raise InputError(
                f"{path}: n_token is {config.n_token}, expected at least the vocabulary's "
                f"{vocab_size} entries"
            )
        return config
    if not elmo.is_elmo_config(values):
        return albert.load_encoder_config(path, max_seq_length, vocab_size)
    config = elmo.ElmoConfig.from_dict(values, str(path))
    # The tagger feeds WordPiece ids: the token table, or the char table spelling them, is V long
    # (a biLM that reads words takes the run's words instead: tokenization.WordTokenizer).
    if not elmo.reads_words(config) and config.n_tokens_vocab != vocab_size:
        raise InputError(
            f"{path}: n_tokens_vocab is {config.n_tokens_vocab}, expected the vocabulary's "
            f"{vocab_size} entries (the biLM reads the ids of --vocab_file)"
        )
    return config


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


def _encoder_config(config):
    """A BertConfig, AlbertConfig, ElectraConfig, XLNetConfig or ElmoConfig from itself or its
    dict (told apart by its keys, as run_classifier's models do)."""
    from modeling import elmo, xlnet

    if not isinstance(config, dict):
        return config
    if elmo.is_elmo_config(config):
        return elmo.ElmoConfig.from_dict(config)
    if xlnet.is_xlnet_config(config):
        return xlnet.XLNetConfig.from_dict(config)
    return albert.encoder_config_from_dict(config)


def _init_head(model, config, num_labels, feature_mode, lstm_units, lstm_layers, dropout_rate):
    """Sets the settings and makes the head layers that BertTagger and FeatureTagger share, under
    the same attribute names, so both write the head's weights under the same checkpoint keys."""
    config = _encoder_config(config)
    if lstm_units < 0 or (lstm_units and lstm_layers < 1):
        raise ValueError(f"lstm_units={lstm_units}, lstm_layers={lstm_layers}: need >= 1")
    model.config = config
    model.num_labels = num_labels
    model.feature_mode = feature_mode
    model.lstm_units = lstm_units
    model.lstm_layers = lstm_layers
    model.dropout_rate = dropout_rate
    model.indices = layer_indices(feature_mode, encoder_layers(config))
    model.combine = FEATURE_MODES[feature_mode][1]
    model.scalar_mix = (
        ScalarMix(len(model.indices), name="scalar_mix") if model.combine == "mix" else None
    )
    # One attribute per layer, not a list (tf.train.Checkpoint, see BertEncoder).
    for i in range(lstm_layers if lstm_units else 0):
        lstm = keras.layers.LSTM(lstm_units, return_sequences=True)
        setattr(model, f"lstm_{i}", keras.layers.Bidirectional(lstm, name=f"lstm_{i}"))
    model.dropout = layers.Dropout(dropout_rate)
    # An ELMo options.json has no initializer_range, XLNet's is init_std: BERT's 0.02 then.
    model.classifier = heads.ClassificationHead(
        num_labels, getattr(config, "initializer_range", 0.02), name="classifier"
    )


def _lstms(model) -> list:
    return [
        getattr(model, f"lstm_{i}") for i in range(model.lstm_layers if model.lstm_units else 0)
    ]


def _build_head(model) -> None:
    if model.scalar_mix is not None:
        model.scalar_mix.build()
    h = feature_width(model.config)
    width = h * len(model.indices) if model.combine == "concat" else h
    for lstm in _lstms(model):
        lstm.build((None, None, width))
        width = 2 * model.lstm_units
    model.classifier.build((None, None, width))


def _combine(model, chosen):
    """K float (B, S, H) layers -> (B, S, H) (one, or the scalar mix) or (B, S, K H) (concat)."""
    if model.combine == "mix":
        return model.scalar_mix(chosen)
    if model.combine == "concat":
        return ops.concatenate(chosen, axis=-1)  # (B, S, K*H)
    return chosen[0]


def _head(model, x, input_mask, training):
    """Combined features float (B, S, W) -> logits float32 (B, S, C)."""
    if model.lstm_units:
        mask = ops.cast(input_mask, "bool")  # (B, S): padding is skipped
        for lstm in _lstms(model):
            x = lstm(x, mask=mask, training=training)  # (B, S, 2 * units)
        # Zero at padding; a new tensor also drops the Keras mask the LSTM attached, which
        # the dense head does not take.
        x = ops.where(mask[:, :, None], x, ops.zeros_like(x))
    logits = model.classifier(model.dropout(x, training=training))  # (B, S, C)
    return ops.cast(logits, "float32")


def _head_config(model) -> dict:
    return {
        "config": model.config.to_dict(),
        "num_labels": model.num_labels,
        "feature_mode": model.feature_mode,
        "lstm_units": model.lstm_units,
        "lstm_layers": model.lstm_layers,
        "dropout_rate": model.dropout_rate,
    }


@keras.saving.register_keras_serializable(package="cloze")
class BertTagger(keras.Model):
    """BERT for token tagging (sec. 5.3), fine-tuned or on frozen features (see the docstring).

    call(inputs, training) with inputs a dict of int (B, S) `input_ids`, `input_mask`,
    `segment_ids` returns logits float32 (B, S, C) at every position.

    Args:
      config: the encoder's BertConfig, AlbertConfig, ElectraConfig or XLNetConfig (or its
        dict; encoder_for).
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
        _init_head(self, config, num_labels, feature_mode, lstm_units, lstm_layers, dropout_rate)
        self.encoder = encoder_for(self.config)
        # The pooler gets no gradient in tagging; frozen, it still loads and saves (ELECTRA's
        # encoder has none).
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler.trainable = False
        if feature_mode != "finetune":
            self.encoder.trainable = False

    @property
    def frozen(self) -> bool:
        return self.feature_mode != "finetune"

    def build(self, input_shape=None):
        self.encoder.build()
        _build_head(self)
        self.built = True

    def features(self, inputs, training=False):
        """The chosen layers combined: float (B, S, H), or (B, S, K H) for concat."""
        # A frozen encoder is a fixed feature extractor: no dropout inside it.
        out = self.encoder(inputs, training=training and not self.frozen)
        return _combine(self, [out["encoder_outputs"][i] for i in self.indices])

    def call(self, inputs, training=False):
        return _head(self, self.features(inputs, training), inputs["input_mask"], training)

    def get_config(self):
        return {**super().get_config(), **_head_config(self)}

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
    transformer_layer_indices); layers="all" gives all L + 1 outputs, the embeddings first.
    """

    def __init__(self, config: BertConfig | dict, layers=(-1, -2, -3, -4), **kwargs):
        super().__init__(**kwargs)
        self.config = _encoder_config(config)
        if layers == "all":  # every output, the embeddings first (run_ner.py --feature_cache)
            self.layers_ = "all"
            self.indices = list(range(encoder_layers(self.config) + 1))
        else:
            self.layers_ = tuple(int(i) for i in layers)
            self.indices = transformer_layer_indices(self.layers_, encoder_layers(self.config))
        self.encoder = encoder_for(self.config)
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


@keras.saving.register_keras_serializable(package="cloze")
class FeatureTagger(keras.Model):
    """BertTagger's head alone, on precomputed frozen features (run_ner.py --feature_cache).

    call(inputs, training) with inputs a dict holding float `layer_features` (B, S, L + 1, H)
    (every output of the frozen encoder: the embeddings, then each layer) and int (B, S)
    `input_mask` returns the logits float32 (B, S, C) that a BertTagger with the same settings,
    weights and encoder returns: the head layers have BertTagger's names, so its head's
    weights are checkpointed under the same keys. Only frozen modes (the encoder is not here).
    """

    def __init__(
        self,
        config: BertConfig | dict,
        num_labels: int,
        feature_mode: str = "sum_all",
        lstm_units: int = 0,
        lstm_layers: int = 2,
        dropout_rate: float = TAGGER_DROPOUT,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if feature_mode == "finetune":
            raise ValueError("FeatureTagger trains on frozen features: finetune needs BertTagger")
        _init_head(self, config, num_labels, feature_mode, lstm_units, lstm_layers, dropout_rate)

    frozen = True

    def build(self, input_shape=None):
        _build_head(self)
        self.built = True

    def call(self, inputs, training=False):
        x = inputs["layer_features"]  # (B, S, L + 1, H)
        chosen = [x[:, :, i, :] for i in self.indices]  # K x (B, S, H)
        return _head(self, _combine(self, chosen), inputs["input_mask"], training)

    def get_config(self):
        return {**super().get_config(), **_head_config(self)}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="cloze")
class ElmoTagger(FeatureTagger):
    """ELMo's downstream tagger (Peters et al. 2018, sec. 3.3): a frozen biLM (modeling/elmo.py)
    whose L + 1 representations replace BERT's layer outputs under BertTagger's head, e.g. the
    scalar mix gamma * sum_j softmax(s)_j h_j of them all (feature_mode="sum_all", eq. 1).

    A FeatureTagger that computes its features itself (hence the subclass: same settings, head
    and config). call(inputs, training) with inputs a dict of int (B, S) `input_ids` (WordPiece
    ids, the units the biLM was pretrained on) and `input_mask` returns logits float32 (B, S, C).
    The biLM sits in `encoder`, as in ElmoLM, so a pretraining checkpoint's `model/encoder` loads
    into it. Only frozen modes: ELMo's recipe does not tune the biLM.
    """

    def __init__(self, config, num_labels: int, feature_mode: str = "sum_all", **kwargs):
        from modeling import elmo

        if feature_mode == "finetune":
            raise ValueError("ElmoTagger keeps the biLM frozen: pick a feature mode (sum_all is "
                             "ELMo's scalar mix)")  # fmt: skip
        super().__init__(config, num_labels, feature_mode, **kwargs)
        if not is_elmo(self.config):
            raise ValueError(f"ElmoTagger needs an ElmoConfig, found {type(self.config).__name__}")
        self.encoder = elmo.ElmoBiLM(self.config, name="encoder")
        self.encoder.trainable = False

    def build(self, input_shape=None):
        self.encoder.build()
        super().build()

    def features(self, inputs, training=False):
        """The chosen representations combined: float (B, S, 2 P), or (B, S, K 2 P) for concat."""
        from modeling import elmo

        # A frozen biLM is a fixed feature extractor: no dropout inside it.
        layers = elmo.elmo_layer_outputs(self.encoder, inputs["input_ids"], inputs["input_mask"])
        return _combine(self, [layers[i] for i in self.indices])

    def call(self, inputs, training=False):
        return _head(self, self.features(inputs), inputs["input_mask"], training)


def tagger_class(config, cached: bool):
    """The tagger for an encoder config: FeatureTagger on cached outputs, ElmoTagger on an ELMo
    biLM, else BertTagger."""
    if cached:
        return FeatureTagger
    return ElmoTagger if is_elmo(config) else BertTagger


def all_layer_features(config) -> keras.Model:
    """A frozen model returning all L + 1 outputs of the encoder `config` describes, float32
    (B, S, L + 1, W): BertLayerFeatures(config, "all"), or for ELMo its representations
    (elmo.ElmoFeatures without the mix). run_ner.py --feature_cache stores these."""
    from modeling import elmo

    if is_elmo(config):
        return elmo.ElmoFeatures(config, mix=False)
    return BertLayerFeatures(config, "all")
