"""ELMo (Peters et al. 2018): a two-layer biLSTM language model and its layer representations.

Read top to bottom: `ElmoConfig` (the nested names of ELMo's published options.json),
character ids (bilm-tf's UnicodeCharsVocabulary scheme), `CharCnnEncoder` (character CNN,
highway layers, projection: Kim et al. 2016 as ELMo sec. 3.4), `LstmpCell` (an LSTM with a
projected recurrent state and clipping, Sak et al. 2014, as bilm-tf's LSTMCell(num_proj=...)),
`ElmoBiLM` (the backbone: token layer plus forward and backward LSTM stacks), `ElmoLM` (the
softmax both directions share, for pretraining), `elmo_layer_outputs` (the L + 1 representations
of sec. 3.2), `ElmoFeatures` (frozen biLM + ScalarMix, eq. 1, for extract_features.py) and
`ElmoClassifier` (the mix pooled over tokens under a softmax layer, for run_classifier.py).

The forward LM reads tokens 1..t and its top state at t scores token t + 1; the backward LM reads
tokens S..t and its top state at t scores token t - 1 (sec. 3.1). Both read the same token
representation and share the softmax; each has its own LSTMs.

Simplifications, each a plain choice for CPU-scale pretraining:
  * a full softmax over the vocabulary (bilm-tf used a sampled softmax for its 793k-word vocab);
  * every block starts from a zero LSTM state (bilm-tf carried states across batches);
  * the units are whatever ids the blocks hold (here WordPieces of a BERT vocab, not words), and
    the character CNN spells each vocabulary entry as its string, "##" of WordPieces included.
Shapes: B batch, S length, C characters per token, E character embedding, F CNN filters in
total, H LSTM cell (lstm.dim), P projection (lstm.projection_dim), V vocab, L LSTM layers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import ClassVar

import keras
import numpy as np
from keras import ops

from data_prep.errors import InputError
from modeling import bert, heads, layers
from modeling.tagging import ScalarMix

# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


def is_elmo_config(values: dict) -> bool:
    """Whether a config dict is an ELMo options.json (its "lstm" section) rather than a
    BERT-family or GPT one."""
    return isinstance(values, dict) and "lstm" in values


def _positive_ints(owner: str, **values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}.{name}: expected a positive integer, found {value!r}")


def _optional_positive(owner: str, **values) -> None:
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{owner}.{name}: expected a number or null, found {value!r}")
        if value is not None and value <= 0:
            raise ValueError(f"{owner}.{name}: expected > 0 or null (no clipping), found {value}")


@dataclasses.dataclass(frozen=True)
class LstmOptions:
    """options.json's "lstm": cell width `dim` (H), `projection_dim` (P, also the width of the
    token representation), `n_layers` per direction, cell and projection clipping (null: none;
    the published models clip both at 3) and the residual connection around every layer but the
    first (ELMo sec. 3.4)."""

    OPTIONAL: ClassVar[frozenset] = frozenset({"cell_clip", "proj_clip", "use_skip_connections"})

    dim: int
    projection_dim: int
    n_layers: int
    cell_clip: float | None = None
    proj_clip: float | None = None
    use_skip_connections: bool = True

    def __post_init__(self):
        _positive_ints("lstm", dim=self.dim, projection_dim=self.projection_dim)
        _positive_ints("lstm", n_layers=self.n_layers)
        _optional_positive("lstm", cell_clip=self.cell_clip, proj_clip=self.proj_clip)
        if not isinstance(self.use_skip_connections, bool):
            raise ValueError(
                f"lstm.use_skip_connections: expected true or false, "
                f"found {self.use_skip_connections!r}"
            )


@dataclasses.dataclass(frozen=True)
class CharEmbeddingOptions:
    """options.json's "char_cnn": {"embedding": {"dim": E}}."""

    OPTIONAL: ClassVar[frozenset] = frozenset()

    dim: int

    def __post_init__(self):
        _positive_ints("char_cnn.embedding", dim=self.dim)


@dataclasses.dataclass(frozen=True)
class CharCnnOptions:
    """options.json's "char_cnn": `filters` as [[width, count], ...], `n_highway` layers,
    `max_characters_per_token` (C, begin and end markers included), `n_characters` (the
    character-id table; 262 in the published models, see CHAR_* below) and the `activation`
    after max-pooling ("relu" or "tanh")."""

    OPTIONAL: ClassVar[frozenset] = frozenset(
        {"n_highway", "max_characters_per_token", "n_characters", "activation"}
    )

    embedding: CharEmbeddingOptions
    filters: tuple
    n_highway: int = 2
    max_characters_per_token: int = 50
    n_characters: int = 262
    activation: str = "relu"

    def __post_init__(self):
        if not isinstance(self.embedding, CharEmbeddingOptions):
            raise ValueError(f"char_cnn.embedding: expected {{'dim': E}}, found {self.embedding!r}")
        try:
            filters = tuple((int(w), int(n)) for w, n in self.filters)
            ok = filters and all(
                w > 0 and n > 0 and [w, n] == list(f) for (w, n), f in zip(filters, self.filters)
            )
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"char_cnn.filters: expected a non-empty list of [width, count] positive "
                f"integers, found {self.filters!r}"
            )
        object.__setattr__(self, "filters", filters)
        _positive_ints("char_cnn", max_characters_per_token=self.max_characters_per_token)
        if not isinstance(self.n_highway, int) or self.n_highway < 0:
            raise ValueError(f"char_cnn.n_highway: expected an integer >= 0, {self.n_highway!r}")
        if self.max_characters_per_token < 3:
            raise ValueError(
                "char_cnn.max_characters_per_token: expected at least 3 (begin-of-word, one "
                f"character, end-of-word), found {self.max_characters_per_token}"
            )
        widest = max(w for w, _ in filters)
        if widest > self.max_characters_per_token:
            raise ValueError(
                f"char_cnn.filters: a width of {widest} exceeds max_characters_per_token "
                f"{self.max_characters_per_token}"
            )
        if not isinstance(self.n_characters, int) or self.n_characters < CHAR_VOCAB_SIZE:
            raise ValueError(
                f"char_cnn.n_characters: expected at least {CHAR_VOCAB_SIZE} (256 bytes + "
                f"markers + padding), found {self.n_characters!r}"
            )
        if self.activation not in ("relu", "tanh"):
            raise ValueError(
                f"char_cnn.activation: expected 'relu' or 'tanh', found {self.activation!r}"
            )

    @property
    def num_filters(self) -> int:
        return sum(n for _, n in self.filters)


@dataclasses.dataclass(frozen=True)
class ElmoConfig(bert.JsonConfig):
    """ELMo's options.json, nested as published: "lstm" (required), "char_cnn" (absent or null:
    a token embedding table is the input instead), and bilm-tf's training options
    "n_tokens_vocab" (V: the softmax, and the embedding table without char_cnn; the published
    feature-only files omit it), "dropout" (on each LSTM layer's input and before the softmax)
    and "bidirectional" (only true: ELMo is the biLM). Unknown keys are an error at every level.
    bilm-tf's run settings (batch_size, n_epochs, unroll_steps, ...) are flags here.
    """

    OPTIONAL: ClassVar[frozenset] = frozenset(
        {"char_cnn", "n_tokens_vocab", "dropout", "bidirectional"}
    )
    FAMILY: ClassVar[str] = "ELMo"
    FILE_KIND: ClassVar[str] = "an ELMo options.json"

    lstm: LstmOptions
    char_cnn: CharCnnOptions | None = None
    n_tokens_vocab: int | None = None
    dropout: float = 0.1
    bidirectional: bool = True

    def __post_init__(self):
        if not isinstance(self.lstm, LstmOptions):
            raise ValueError(f"lstm: expected the lstm options, found {self.lstm!r}")
        if self.n_tokens_vocab is not None:
            _positive_ints("ElmoConfig", n_tokens_vocab=self.n_tokens_vocab)
        elif self.char_cnn is None:
            raise ValueError(
                "n_tokens_vocab: a config without char_cnn embeds tokens and needs the "
                "vocabulary size"
            )
        if isinstance(self.dropout, bool) or not (
            isinstance(self.dropout, int | float) and 0.0 <= self.dropout < 1.0
        ):
            raise ValueError(f"dropout: expected a rate in [0, 1), found {self.dropout!r}")
        if self.bidirectional is not True:
            raise ValueError(
                f"bidirectional: only true is supported (the biLM), found {self.bidirectional!r}"
            )

    @property
    def output_dim(self) -> int:
        """Width of every layer representation: [forward; backward] = 2 P."""
        return 2 * self.lstm.projection_dim

    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> ElmoConfig:
        """Builds a config from options.json's nested dict; errors (InputError) name `source`
        and the section."""
        if not isinstance(values, dict):
            raise InputError(f"{source}: expected a JSON object, found {type(values).__name__}")
        values = dict(values)
        if "lstm" in values:
            values["lstm"] = bert.config_from_dict(
                LstmOptions, values["lstm"], f"{source}: lstm", "ELMo lstm"
            )
        if values.get("char_cnn") is not None:
            char = dict(values["char_cnn"]) if isinstance(values["char_cnn"], dict) else None
            if char is None:
                raise InputError(f"{source}: char_cnn: expected a JSON object or null")
            if "embedding" in char:
                char["embedding"] = bert.config_from_dict(
                    CharEmbeddingOptions,
                    char["embedding"],
                    f"{source}: char_cnn.embedding",
                    "ELMo char_cnn.embedding",
                )
            values["char_cnn"] = bert.config_from_dict(
                CharCnnOptions, char, f"{source}: char_cnn", "ELMo char_cnn"
            )
        return bert.config_from_dict(cls, values, source, cls.FAMILY)

    def to_dict(self) -> dict:
        """The options.json dict (filters as lists; absent optional sections left out)."""
        out = json.loads(json.dumps(dataclasses.asdict(self)))  # tuples -> lists
        return {k: v for k, v in out.items() if not (k in self.OPTIONAL and v is None)}


# ---------------------------------------------------------------------------------------------
# Character ids
# ---------------------------------------------------------------------------------------------

# bilm-tf's UnicodeCharsVocabulary: a token is its UTF-8 bytes (0-255) between a begin-of-word
# (258) and an end-of-word (259) marker, padded with 260; 256 and 257 spell the sentence markers
# <S> and </S>, each as [begin-of-word, 256 or 257, end-of-word, padding...]. The published
# weights take these ids plus one (allennlp's ELMoCharacterMapper), so that id 0 is a padding
# *token* (all zeros, the zero row of the character table); hence n_characters = 262.
CHAR_SENTENCE_START, CHAR_SENTENCE_END, CHAR_BOW, CHAR_EOW, CHAR_PAD = 257, 258, 259, 260, 261
CHAR_VOCAB_SIZE = 262
SENTENCE_START, SENTENCE_END = "<S>", "</S>"


def token_char_ids(token: str, max_characters: int) -> list[int]:
    """The max_characters character ids of one token (bytes past max_characters - 2 are cut;
    <S> and </S> are the sentence markers)."""
    marker = {SENTENCE_START: CHAR_SENTENCE_START, SENTENCE_END: CHAR_SENTENCE_END}.get(token)
    if marker is not None:
        ids = [CHAR_BOW, marker, CHAR_EOW]
    else:
        data = token.encode("utf-8")[: max_characters - 2]
        ids = [CHAR_BOW, *(b + 1 for b in data), CHAR_EOW]
    return ids + [CHAR_PAD] * (max_characters - len(ids))


def vocab_char_table(tokens: Sequence[str], max_characters: int) -> np.ndarray:
    """int32 (V, C): row i spells tokens[i]; the lookup ElmoBiLM uses for token ids."""
    return np.asarray([token_char_ids(t, max_characters) for t in tokens], np.int32)


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="cloze")
class CharCnnEncoder(keras.layers.Layer):
    """Character CNN token representation (ELMo sec. 3.4, after Kim et al. 2016).

    Characters are embedded (E), each filter width w convolves over the C positions ('valid'),
    each filter's maximum over positions goes through the activation, the F maxima are
    concatenated, pass `n_highway` highway layers (Srivastava et al. 2015) and a linear
    projection to P. call(char_ids int (B, S, C)) -> float (B, S, P).
    """

    def __init__(self, char_cnn: CharCnnOptions | dict, projection_dim: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(char_cnn, dict):
            char_cnn = ElmoConfig.from_dict(
                {"lstm": {"dim": 1, "projection_dim": 1, "n_layers": 1}, "char_cnn": char_cnn}
            ).char_cnn
        self.char_cnn, self.projection_dim = char_cnn, projection_dim
        c = char_cnn
        # Under float16 where it would run on oneDNN's reference kernels (a convolution's weight
        # gradient, 7.4 s against float32's 11 ms, and the highway layers' fused 2-D MatMul +
        # bias: layers.float16_on_onednn_cpu), the convolutions, highway layers and projection
        # compute in float32; the embedding and the LSTMs keep the policy.
        inner = {}
        if self.compute_dtype == "float16" and layers.float16_on_onednn_cpu():
            inner = {"dtype": "float32"}
        self.char_embedding = keras.layers.Embedding(
            c.n_characters,
            c.embedding.dim,
            embeddings_initializer=keras.initializers.RandomUniform(-1.0, 1.0),
            name="char_embedding",
        )
        for i, (width, count) in enumerate(c.filters):
            conv = keras.layers.Conv1D(count, width, name=f"conv_{i}", **inner)
            setattr(self, f"conv_{i}", conv)
        f = c.num_filters
        for i in range(c.n_highway):
            transform = keras.layers.Dense(f, name=f"transform_{i}", **inner)
            setattr(self, f"highway_transform_{i}", transform)
            # A negative gate bias starts each highway layer close to carrying its input
            # (Srivastava et al. 2015, sec. 2.2; bilm-tf initialises it to -2).
            gate = keras.layers.Dense(
                f, bias_initializer=keras.initializers.Constant(-2.0), name=f"gate_{i}", **inner
            )
            setattr(self, f"highway_gate_{i}", gate)
        self.projection = keras.layers.Dense(projection_dim, name="projection", **inner)

    def build(self, input_shape=None):
        c = self.char_cnn
        self.char_embedding.build((None, c.max_characters_per_token))
        for i in range(len(c.filters)):
            getattr(self, f"conv_{i}").build((None, c.max_characters_per_token, c.embedding.dim))
        for i in range(c.n_highway):
            getattr(self, f"highway_transform_{i}").build((None, c.num_filters))
            getattr(self, f"highway_gate_{i}").build((None, c.num_filters))
        self.projection.build((None, c.num_filters))
        self.built = True

    def call(self, char_ids):
        c = self.char_cnn
        b, s = ops.shape(char_ids)[0], ops.shape(char_ids)[1]
        chars = ops.reshape(char_ids, (-1, c.max_characters_per_token))  # (B*S, C)
        x = self.char_embedding(chars)  # (B*S, C, E)
        act = ops.relu if c.activation == "relu" else ops.tanh
        pooled = [
            act(ops.max(getattr(self, f"conv_{i}")(x), axis=1))  # (B*S, n_i)
            for i in range(len(c.filters))
        ]
        h = ops.concatenate(pooled, axis=-1)  # (B*S, F)
        for i in range(c.n_highway):
            transform = ops.relu(getattr(self, f"highway_transform_{i}")(h))
            gate = ops.sigmoid(getattr(self, f"highway_gate_{i}")(h))
            h = gate * transform + (1.0 - gate) * h
        out = ops.reshape(self.projection(h), (b, s, self.projection_dim))  # (B, S, P)
        return ops.cast(out, self.compute_dtype)  # float32 inside under float16 (__init__)

    def get_config(self):
        return {
            **super().get_config(),
            "char_cnn": json.loads(json.dumps(dataclasses.asdict(self.char_cnn))),
            "projection_dim": self.projection_dim,
        }


@keras.saving.register_keras_serializable(package="cloze")
class LstmpCell(keras.layers.Layer):
    """One step of an LSTM with a projected state (LSTMP, Sak et al. 2014), as TF1's
    LSTMCell(num_proj=P, cell_clip, proj_clip, forget_bias=1.0) that bilm-tf trained.

    keras.layers.LSTM has neither the projection inside the recurrence nor the clipping, hence
    this cell for keras.layers.RNN. Gates in TF1's order i, j, f, o:
      c_t = sigmoid(f + 1) c_{t-1} + sigmoid(i) tanh(j), clipped to [-cell_clip, cell_clip]
      h_t = clip(P (sigmoid(o) tanh(c_t)), proj_clip)      (P: a bias-free projection)
    call(x float (B, I), states [h (B, P), c (B, H)]) -> (h_t, [h_t, c_t]).
    """

    def __init__(self, units, projection_dim, cell_clip=None, proj_clip=None, **kwargs):
        super().__init__(**kwargs)
        self.units, self.projection_dim = units, projection_dim
        self.cell_clip, self.proj_clip = cell_clip, proj_clip
        self.state_size = [projection_dim, units]
        self.output_size = projection_dim

    def build(self, input_shape):
        h = self.units
        self.kernel = self.add_weight(
            name="kernel", shape=(input_shape[-1], 4 * h), initializer="glorot_uniform"
        )
        self.recurrent_kernel = self.add_weight(
            name="recurrent_kernel", shape=(self.projection_dim, 4 * h), initializer="orthogonal"
        )
        self.bias = self.add_weight(name="bias", shape=(4 * h,), initializer="zeros")
        self.projection = self.add_weight(
            name="projection", shape=(h, self.projection_dim), initializer="glorot_uniform"
        )
        self.built = True

    def call(self, inputs, states, training=False):
        h_prev, c_prev = states[0], states[1]
        z = ops.matmul(inputs, self.kernel) + ops.matmul(h_prev, self.recurrent_kernel)
        i, j, f, o = ops.split(z + self.bias, 4, axis=-1)  # each (B, H)
        c = ops.sigmoid(f + 1.0) * c_prev + ops.sigmoid(i) * ops.tanh(j)
        if self.cell_clip:
            c = ops.clip(c, -self.cell_clip, self.cell_clip)
        h = ops.matmul(ops.sigmoid(o) * ops.tanh(c), self.projection)  # (B, P)
        if self.proj_clip:
            h = ops.clip(h, -self.proj_clip, self.proj_clip)
        return h, [h, c]

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "projection_dim": self.projection_dim,
            "cell_clip": self.cell_clip,
            "proj_clip": self.proj_clip,
        }


# ---------------------------------------------------------------------------------------------
# Backbone, language model, features
# ---------------------------------------------------------------------------------------------


def _config(config) -> ElmoConfig:
    return ElmoConfig.from_dict(config) if isinstance(config, dict) else config


@keras.saving.register_keras_serializable(package="cloze")
class ElmoBiLM(keras.Model):
    """The biLM backbone: the token representation and L LSTMP layers per direction.

    call(inputs, training=False): inputs a dict with int (B, S) `input_ids`, optionally
    `input_mask` (1 real, 0 padding; right padding) and, for a char-CNN config, optionally
    int (B, S, C) `char_ids` (else looked up from `input_ids` in `char_table`, filled by
    set_char_table from the vocabulary, or for a biLM that reads words in the table of the
    run's words that read_words sets). Returns a dict: `token` float (B, S, P) and
    `forward`, `backward`: lists of L float (B, S, P), each layer's states (0 at padding).
    """

    def __init__(self, config: ElmoConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = self.config = _config(config)
        p = c.lstm.projection_dim
        self.word_chars = None  # read_words' table (a biLM that reads words)
        if c.char_cnn is not None:
            self.token_encoder = CharCnnEncoder(c.char_cnn, p, name="char_cnn")
        else:
            self.token_encoder = keras.layers.Embedding(
                c.n_tokens_vocab,
                p,
                embeddings_initializer=keras.initializers.RandomNormal(stddev=p**-0.5),
                name="token_embedding",
            )
        self.dropout = layers.Dropout(c.dropout)
        # One attribute per layer: tf.train.Checkpoint does not follow Keras' TrackedList.
        for direction in ("forward", "backward"):
            for i in range(c.lstm.n_layers):
                cell = LstmpCell(c.lstm.dim, p, c.lstm.cell_clip, c.lstm.proj_clip)
                rnn = keras.layers.RNN(cell, return_sequences=True, name=f"{direction}_{i}")
                setattr(self, f"{direction}_{i}", rnn)

    def lstms(self, direction: str) -> list:
        return [getattr(self, f"{direction}_{i}") for i in range(self.config.lstm.n_layers)]

    def build(self, input_shape=None):
        c = self.config
        if c.char_cnn is not None:
            self.token_encoder.build()
            if c.n_tokens_vocab is not None:
                self.char_table = self.add_weight(
                    name="char_table",
                    shape=(c.n_tokens_vocab, c.char_cnn.max_characters_per_token),
                    dtype="int32",
                    initializer=keras.initializers.Constant(CHAR_PAD),
                    trainable=False,
                )
        else:
            self.token_encoder.build((None, None))
        for direction in ("forward", "backward"):
            for rnn in self.lstms(direction):
                rnn.build((None, None, c.lstm.projection_dim))
        self.built = True

    def set_char_table(self, tokens: Sequence[str]) -> None:
        """Spells the vocabulary into `char_table` (char-CNN configs); len(tokens) must be V."""
        c = self.config
        if c.char_cnn is None:
            return
        if len(tokens) != c.n_tokens_vocab:
            raise ValueError(
                f"the vocabulary has {len(tokens)} entries, the config's n_tokens_vocab is "
                f"{c.n_tokens_vocab}"
            )
        self.char_table.assign(vocab_char_table(tokens, c.char_cnn.max_characters_per_token))

    def read_words(self, tokens: Sequence[str]) -> None:
        """For a biLM that reads words (reads_words): the words `input_ids` index from now on
        (a run's tokenization.WordTokenizer.spelled_tokens), spelled into a constant table.
        It is data of the run, not a weight: checkpoints do not hold it."""
        c = self.config
        if not reads_words(c):
            raise ValueError("read_words: this biLM reads a vocabulary's ids (n_tokens_vocab)")
        self.word_chars = vocab_char_table(tokens, c.char_cnn.max_characters_per_token)

    def token_representation(self, inputs):
        """float (B, S, P): the context-independent token layer x_k."""
        if self.config.char_cnn is None:
            return self.token_encoder(inputs["input_ids"])
        chars = inputs.get("char_ids")
        if chars is None:
            table = self.char_table if self.config.n_tokens_vocab else self.word_chars
            if table is None:
                raise ValueError(
                    "a char-CNN config without n_tokens_vocab needs `char_ids` or read_words"
                )
            chars = ops.take(table, inputs["input_ids"], axis=0)  # (B, S, C)
        return self.token_encoder(chars)

    def _run(self, direction, x, mask, training):
        """One direction's L layers over x (B, S, P), already in that direction's time order."""
        skip = self.config.lstm.use_skip_connections
        outputs = []
        for i, rnn in enumerate(self.lstms(direction)):
            h = rnn(self.dropout(x, training=training), mask=mask, training=training)
            # Residual connection around every layer but the first (ELMo sec. 3.4).
            x = h + x if skip and i > 0 else h  # (B, S, P)
            outputs.append(x)
        return outputs

    def call(self, inputs, training=False):
        x = self.token_representation(inputs)  # (B, S, P)
        mask = inputs.get("input_mask")
        mask = None if mask is None else ops.cast(mask, "bool")  # (B, S)
        forward = self._run("forward", x, mask, training)
        # The backward LM reads the sequence right to left: flip the time axis there and back.
        # With right padding the flipped padding comes first and, masked, leaves the zero state.
        flipped_mask = None if mask is None else ops.flip(mask, axis=1)
        backward = [ops.flip(h, axis=1) for h in self._run("backward", ops.flip(x, axis=1),
                                                           flipped_mask, training)]  # fmt: skip
        if mask is not None:
            keep = ops.cast(mask, x.dtype)[:, :, None]  # (B, S, 1)
            x, forward, backward = (
                x * keep,
                [h * keep for h in forward],
                [h * keep for h in backward],
            )
        return {"token": x, "forward": forward, "backward": backward}

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="cloze")
class ElmoLM(keras.Model):
    """The pretraining model: the biLM and the softmax both directions share (sec. 3.1).

    call(inputs, training, lm_terms=False) -> dict of float32 (B, S, V): forward_logits
    (position t scores token t + 1) and backward_logits (position t scores token t - 1). With
    lm_terms (training), forward_xent, forward_hits, backward_xent and backward_hits float32
    (B, S - 1) instead: each prediction's cross-entropy and argmax hit (the forward LM's at
    positions 0 .. S - 2, the backward LM's at 1 .. S - 1), without the (B, S, V) logits
    (heads.tied_xent_and_hits: vocabulary-major).
    """

    def __init__(self, config: ElmoConfig | dict, **kwargs):
        super().__init__(**kwargs)
        c = self.config = _config(config)
        if c.n_tokens_vocab is None:
            raise ValueError("ElmoLM: the softmax needs n_tokens_vocab in the config")
        self.encoder = ElmoBiLM(c, name="encoder")
        self.output_dropout = layers.Dropout(c.dropout)

    def build(self, input_shape=None):
        c = self.config
        self.encoder.build()
        p = c.lstm.projection_dim
        self.softmax_weights = self.add_weight(
            name="softmax_weights",
            shape=(c.n_tokens_vocab, p),
            initializer=keras.initializers.RandomNormal(stddev=p**-0.5),
        )
        self.softmax_bias = self.add_weight(
            name="softmax_bias", shape=(c.n_tokens_vocab,), initializer="zeros"
        )
        self.built = True

    def logits(self, h, training=False):
        h = self.output_dropout(h, training=training)
        out = ops.einsum("bsp,vp->bsv", h, self.softmax_weights) + self.softmax_bias
        return ops.cast(out, "float32")  # (B, S, V)

    def call(self, inputs, training=False, lm_terms=False):
        out = self.encoder(inputs, training=training)
        if lm_terms:
            ids, result = inputs["input_ids"], {}
            # Dropout on the whole sequences, forward first, as logits() draws its masks.
            forward = self.output_dropout(out["forward"][-1], training=training)[:, :-1]
            backward = self.output_dropout(out["backward"][-1], training=training)[:, 1:]
            for name, h, labels in (
                ("forward", forward, ids[:, 1:]),
                ("backward", backward, ids[:, :-1]),
            ):
                result[f"{name}_xent"], result[f"{name}_hits"] = heads.tied_xent_and_hits(
                    h, self.softmax_weights, self.softmax_bias, labels
                )
            return result
        return {
            "forward_logits": self.logits(out["forward"][-1], training),
            "backward_logits": self.logits(out["backward"][-1], training),
        }

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def elmo_layer_outputs(model, token_ids, input_mask=None, char_ids=None, training=False) -> list:
    """The L + 1 layer representations of sec. 3.2, each float (B, S, 2 P): the token layer
    with both directions' inputs concatenated [x; x], then each LSTM layer's [forward; backward].

    model: an ElmoBiLM, or a model holding one as `encoder` (ElmoLM, ElmoFeatures).
    token_ids int (B, S); input_mask (B, S) or None; char_ids int (B, S, C) or None.
    """
    bilm = model if isinstance(model, ElmoBiLM) else model.encoder
    inputs = {"input_ids": token_ids}
    if input_mask is not None:
        inputs["input_mask"] = input_mask
    if char_ids is not None:
        inputs["char_ids"] = char_ids
    out = bilm(inputs, training=training)
    layers = [ops.concatenate([out["token"], out["token"]], axis=-1)]  # (B, S, 2P)
    layers += [ops.concatenate([f, b], axis=-1) for f, b in zip(out["forward"], out["backward"])]
    return layers


def feature_layer_indices(layers, n_layers: int) -> list[int]:
    """extract_features' --layers for ELMo: indices into the L + 1 representations (0 the token
    layer, k the k-th biLSTM layer, negatives from the top: -1 the top layer)."""
    out = []
    for i in layers:
        if not -(n_layers + 1) <= i <= n_layers:
            raise ValueError(
                f"layer index {i} is outside an ELMo biLM's {n_layers + 1} representations "
                f"([-{n_layers + 1}, {n_layers}]; 0 is the token layer)"
            )
        out.append(i % (n_layers + 1))
    return out


@keras.saving.register_keras_serializable(package="cloze")
class ElmoFeatures(keras.Model):
    """A frozen biLM that returns chosen layer representations and the ELMo vector
    (extract_features.py).

    call(inputs) with int (B, S) `input_ids` and `input_mask` (and, for a biLM that reads words,
    int (B, S, C) `char_ids`: reads_words) returns float32 (B, S, K + 1, 2 P):
    the representations `layers[k]` (feature_layer_indices) at [:, :, k], and at [:, :, K] the
    ELMo vector gamma * sum_j softmax(s)_j h_j over those K layers (eq. 1, tagging.ScalarMix; as
    initialised, an equal mix with gamma 1, until a task trains s and gamma). mix=False leaves
    the ELMo vector out: (B, S, K, 2 P) (run_ner.py's feature cache, whose tagger trains the mix).
    """

    def __init__(self, config: ElmoConfig | dict, layers=None, mix: bool = True, **kwargs):
        super().__init__(**kwargs)
        c = self.config = _config(config)
        n = c.lstm.n_layers
        self.layers_ = tuple(range(n + 1)) if layers is None else tuple(int(i) for i in layers)
        self.indices = feature_layer_indices(self.layers_, n)
        self.mix = mix
        self.encoder = ElmoBiLM(c, name="encoder")
        self.encoder.trainable = False
        self.scalar_mix = ScalarMix(len(self.indices), name="scalar_mix") if mix else None

    def build(self, input_shape=None):
        self.encoder.build()
        if self.scalar_mix is not None:
            self.scalar_mix.build()
        self.built = True

    def call(self, inputs, training=False):
        outputs = elmo_layer_outputs(
            self.encoder, inputs["input_ids"], inputs.get("input_mask"), inputs.get("char_ids")
        )
        chosen = [outputs[i] for i in self.indices]  # K x (B, S, 2P)
        if self.scalar_mix is not None:
            chosen.append(self.scalar_mix(chosen))  # (B, S, 2P)
        return ops.cast(ops.stack(chosen, axis=2), "float32")  # (B, S, K(+1), 2P)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(), "layers": self.layers_,
                "mix": self.mix}  # fmt: skip

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def build_features_model(config: ElmoConfig, layers, vocab_size: int) -> tuple:
    """extract_features' ELMo model: (ElmoFeatures, the written layer indices, their width).

    `layers`: --layers for ELMo (feature_layer_indices; None: all L + 1). The written indices
    are the chosen representations' (0 the token layer) followed by L + 1 for the ELMo vector.
    Raises ValueError on a bad index or a vocabulary of another size than n_tokens_vocab.
    """
    if config.n_tokens_vocab is not None and config.n_tokens_vocab != vocab_size:
        raise ValueError(
            f"the vocabulary has {vocab_size} entries, the ELMo config's n_tokens_vocab is "
            f"{config.n_tokens_vocab}"
        )
    model = ElmoFeatures(config, layers)
    model.build()
    written = (*model.indices, config.lstm.n_layers + 1)
    return model, written, config.output_dim


@keras.saving.register_keras_serializable(package="cloze")
class ElmoClassifier(keras.Model):
    """ELMo for sentence classification (Peters et al. 2018, sec. 3.3 and 5: the frozen biLM's
    representations as features of a task model): the scalar mix gamma * sum_j softmax(s)_j h_j
    of all L + 1 layers (eq. 1, tagging.ScalarMix, as run_ner's ElmoTagger uses it), averaged
    over the real tokens, dropout, then a softmax layer (heads.ClassificationHead).

    call(inputs, training) with int (B, S) `input_ids` (the WordPiece ids the biLM was
    pretrained on) and `input_mask` returns logits float32 (B, num_labels); num_labels 1 is a
    regression output. The biLM sits in `encoder` (frozen), as in ElmoLM and ElmoTagger, so a
    pretraining checkpoint's `model/encoder` loads into it; only the mix and the head train.
    """

    def __init__(self, config: ElmoConfig | dict, num_labels: int, dropout_rate=0.1, **kwargs):
        from modeling import heads

        super().__init__(**kwargs)
        self.config = _config(config)
        self.num_labels, self.dropout_rate = num_labels, dropout_rate
        self.encoder = ElmoBiLM(self.config, name="encoder")
        self.encoder.trainable = False
        self.scalar_mix = ScalarMix(self.config.lstm.n_layers + 1, name="scalar_mix")
        self.dropout = layers.Dropout(dropout_rate)
        # An options.json has no initializer_range: BERT's 0.02.
        self.classifier = heads.ClassificationHead(num_labels, 0.02, name="classifier")

    def build(self, input_shape=None):
        self.encoder.build()
        self.scalar_mix.build()
        self.classifier.build((None, self.config.output_dim))
        self.built = True

    def call(self, inputs, training=False):
        from modeling import finetuning

        mask = inputs["input_mask"]
        # A frozen biLM is a fixed feature extractor: no dropout inside it.
        layers = elmo_layer_outputs(self.encoder, inputs["input_ids"], mask)  # L+1 x (B, S, 2P)
        mixed = self.scalar_mix(layers)  # (B, S, 2P)
        pooled = finetuning.pool({"sequence_output": mixed}, mask, "mean")  # (B, 2P)
        logits = self.classifier(self.dropout(pooled, training=training))  # (B, C)
        return ops.cast(logits, "float32")

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "num_labels": self.num_labels, "dropout_rate": self.dropout_rate}  # fmt: skip

    @classmethod
    def from_config(cls, config):
        return cls(**config)


# ---------------------------------------------------------------------------------------------
# Published weights: bilm-tf's weights.hdf5, as allennlp.modules.elmo reads it
# ---------------------------------------------------------------------------------------------

HDF5_WEIGHTS, HDF5_OPTIONS = "weights.hdf5", "options.json"
# What bilm-tf's train.py writes into options.json besides the model: run settings, which are
# flags in Cloze (the published feature files' options.json holds none of them).
BILM_TF_RUN_KEYS = (
    "all_clip_norm_val", "batch_size", "n_epochs", "n_negative_samples_batch", "n_train_tokens",
    "unroll_steps",
)  # fmt: skip


def options_from_bilm_tf(values: dict) -> tuple[dict, list]:
    """(the options without bilm-tf's run settings, the keys left out)."""
    dropped = [k for k in BILM_TF_RUN_KEYS if k in values]
    return {k: v for k, v in values.items() if k not in dropped}, dropped


# bilm-tf's LSTMCell multiplies [x_t, h_{t-1}] by one W_0; Cloze's cell keeps the input rows and
# the recurrent rows as two variables, so the map reads W_0 as these two halves.
_INPUT_ROWS, _RECURRENT_ROWS = "/input_rows", "/recurrent_rows"


def bilm_variables(bilm: ElmoBiLM) -> dict:
    """The biLM's weights by stable names (`char_cnn/conv_0/kernel`, `forward_0/cell/kernel`):
    Keras' own paths number the LSTM cells in creation order across models. The vocabulary's
    character table is data, not a weight: left out."""
    out = {}
    encoder = bilm.token_encoder
    if bilm.config.char_cnn is None:
        out["token_embedding/embeddings"] = encoder.embeddings
    else:
        root = encoder.name + "/"
        out |= {"char_cnn/" + v.path.split(root, 1)[1]: v for v in encoder.weights}
    for direction in ("forward", "backward"):
        for i, rnn in enumerate(bilm.lstms(direction)):
            cell = rnn.cell
            for name in ("kernel", "recurrent_kernel", "bias", "projection"):
                out[f"{direction}_{i}/cell/{name}"] = getattr(cell, name)
    found = {id(v) for v in out.values()}
    missed = [v.path for v in bilm.trainable_weights if id(v) not in found]
    if missed:
        raise RuntimeError(f"bilm_variables missed {missed}")
    return out


def hdf5_entries(config: ElmoConfig) -> list:
    """bilm-tf's weights.hdf5 names (dump_weights: `char_embed`, `CNN/W_cnn_i`, `CNN_high_k`,
    `CNN_proj`, `RNN_d/RNN/MultiRNNCell/Cell{k}/LSTMCell/{W_0, B, W_P_0}` with RNN_0 the forward
    LM) onto bilm_variables' names. The file's character table has no row for the padding id 0
    (AllenNLP prepends a zero row); its convolutions are (1, width, E, n) 2-D kernels; its
    highway carry gate is Cloze's `gate`; B is TF1's i, j, f, o biases without the forget bias
    of 1 the cell adds, as LstmpCell's."""
    from modeling.checkpoints import Entry, _copy, _reshaped

    c = config.char_cnn
    if c is None:
        raise ValueError(
            "the published weights.hdf5 layout holds a character CNN; this options.json has no "
            "char_cnn (a token-embedding biLM)"
        )
    e, f, p, h = c.embedding.dim, c.num_filters, config.lstm.projection_dim, config.lstm.dim
    rows = c.n_characters - 1
    out = [
        Entry(
            "char_cnn/char_embedding/embeddings", ("char_embed",), ((rows, e),),
            lambda a: np.concatenate([np.zeros((1, e), a[0].dtype), a[0]]),
            lambda x: [x[1:]],
        )
    ]  # fmt: skip
    for i, (width, count) in enumerate(c.filters):
        out += [
            _reshaped(f"char_cnn/conv_{i}/kernel", f"CNN/W_cnn_{i}", (1, width, e, count),
                      (width, e, count)),
            _copy(f"char_cnn/conv_{i}/bias", f"CNN/b_cnn_{i}", (count,)),
        ]  # fmt: skip
    for k in range(c.n_highway):
        for cloze, name in (("transform", "transform"), ("gate", "carry")):
            out += [
                _copy(f"char_cnn/{cloze}_{k}/kernel", f"CNN_high_{k}/W_{name}", (f, f)),
                _copy(f"char_cnn/{cloze}_{k}/bias", f"CNN_high_{k}/b_{name}", (f,)),
            ]
    out += [
        _copy("char_cnn/projection/kernel", "CNN_proj/W_proj", (f, p)),
        _copy("char_cnn/projection/bias", "CNN_proj/b_proj", (p,)),
    ]
    for d, direction in enumerate(("forward", "backward")):
        for k in range(config.lstm.n_layers):
            src, dst = f"RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell", f"{direction}_{k}/cell"
            out += [
                _copy(f"{dst}/kernel", f"{src}/W_0{_INPUT_ROWS}", (p, 4 * h)),
                _copy(f"{dst}/recurrent_kernel", f"{src}/W_0{_RECURRENT_ROWS}", (p, 4 * h)),
                _copy(f"{dst}/bias", f"{src}/B", (4 * h,)),
                _copy(f"{dst}/projection", f"{src}/W_P_0", (h, p)),
            ]
    return out


def read_hdf5(path, input_rows: int):
    """A weights.hdf5 as a checkpoints.ArraySource: every dataset by its path, each LSTMCell's
    W_0 as its first `input_rows` rows and the rest (hdf5_entries' names). InputError naming the
    file when it is no readable HDF5 file."""
    import h5py

    from data_prep.errors import input_error
    from modeling.checkpoints import ArraySource

    arrays = {}

    def keep(name, item):
        if isinstance(item, h5py.Dataset):
            arrays[name] = item[...]

    try:
        with h5py.File(path, "r") as f:
            f.visititems(keep)
    except OSError as e:
        raise input_error(str(path), "a readable HDF5 file (ELMo's weights.hdf5)", str(e)) from None
    for name in [n for n in arrays if n.endswith("/LSTMCell/W_0")]:
        w = arrays.pop(name)
        arrays[name + _INPUT_ROWS], arrays[name + _RECURRENT_ROWS] = w[:input_rows], w[input_rows:]
    return ArraySource(arrays, str(path))


def load_hdf5(path, config: ElmoConfig, config_where: str = HDF5_OPTIONS, skip=None):
    """A published ELMo's weights.hdf5 (bilm-tf's layout) -> (ElmoBiLM, ConversionReport). The
    file holds no softmax: the biLM alone, as AllenNLP's Elmo reads it."""
    from modeling import checkpoints

    entries = hdf5_entries(config)  # ValueError for a biLM without a character CNN
    source = read_hdf5(path, config.lstm.projection_dim)
    bilm = ElmoBiLM(config, name="encoder")
    bilm.build()
    where = (
        f"{config_where} (ELMo: {config.lstm.n_layers} layers of {config.lstm.dim} cells "
        f"projected to {config.lstm.projection_dim}, {config.char_cnn.num_filters} filters)"
    )
    report = checkpoints.convert_into(bilm, entries, source, where, skip=skip, heads=False)
    return bilm, report


def save_hdf5(bilm: ElmoBiLM, output_dir) -> list:
    """Writes weights.hdf5 (bilm-tf's layout, hdf5_entries) and options.json; returns their
    paths. The character table's row 0 (the padding id, zeros in AllenNLP) is not written."""
    from pathlib import Path

    import h5py

    from modeling import checkpoints

    arrays = checkpoints.export_arrays(bilm, hdf5_entries(bilm.config))
    for name in [n for n in arrays if n.endswith(_INPUT_ROWS)]:
        cell = name[: -len(_INPUT_ROWS)]
        rows = (arrays.pop(name), arrays.pop(cell + _RECURRENT_ROWS))
        arrays[cell] = np.concatenate(rows)
    out = Path(output_dir)
    with h5py.File(out / HDF5_WEIGHTS, "w") as f:
        for name in sorted(arrays):
            f[name] = arrays[name]
    (out / HDF5_OPTIONS).write_text(bilm.config.to_json_string())
    return [out / HDF5_WEIGHTS, out / HDF5_OPTIONS]


def reads_words(config: ElmoConfig) -> bool:
    """Whether the biLM reads words through its character CNN alone (the published options.json:
    a char_cnn and no n_tokens_vocab), rather than a vocabulary's ids spelled into its table."""
    return config.char_cnn is not None and config.n_tokens_vocab is None


def config_reads_words(path) -> bool:
    """Whether a model config file is an ELMo options.json whose biLM reads words (reads_words);
    InputError naming the file when it is no JSON object or a bad options.json."""
    values = bert.read_config_json(path, "a model config JSON file")
    return is_elmo_config(values) and reads_words(ElmoConfig.from_dict(values, str(path)))


def sentence_char_ids(sentences: Sequence[Sequence[str]], max_characters: int) -> tuple:
    """Words -> (char_ids int32 (B, S + 2, C), mask int32 (B, S + 2)): each sentence between <S>
    and </S>, as AllenNLP's Elmo adds them, right-padded with all-zero rows (the padding token)."""
    longest = max((len(s) for s in sentences), default=0) + 2
    chars = np.zeros((len(sentences), longest, max_characters), np.int32)
    mask = np.zeros((len(sentences), longest), np.int32)
    for b, words in enumerate(sentences):
        spelled = [SENTENCE_START, *words, SENTENCE_END]
        chars[b, : len(spelled)] = [token_char_ids(w, max_characters) for w in spelled]
        mask[b, : len(spelled)] = 1
    return chars, mask


def sentence_layer_outputs(bilm: ElmoBiLM, sentences: Sequence[Sequence[str]]) -> tuple:
    """The L + 1 representations of words, as a published ELMo computes them: each sentence
    between <S> and </S> (sentence_char_ids), the markers' positions taken out again.
    Returns (list of L + 1 float32 (B, S, 2 P), mask int32 (B, S))."""
    c = bilm.config.char_cnn
    if c is None:
        raise ValueError("ELMo on words needs a character CNN (options.json's char_cnn)")
    chars, mask = sentence_char_ids(sentences, c.max_characters_per_token)
    words = mask[:, 2:]  # (B, S): position t + 1 holds word t, real up to the sentence's length
    keep = words[:, :, None].astype("float32")
    outputs = elmo_layer_outputs(bilm, np.zeros(mask.shape, np.int32), mask, chars)
    return [ops.convert_to_numpy(h)[:, 1:-1] * keep for h in outputs], words
