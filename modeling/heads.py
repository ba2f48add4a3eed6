"""Output heads shared by the encoder families: masked LM and sequence classification.

Shapes: B batch, S length, H hidden, P predictions per sequence, V vocab, C classes.
"""

from __future__ import annotations

import keras
from keras import ops

from modeling import layers


def gather_positions(sequence, positions):
    """Gathers vectors at given positions of each sequence.

    Args:
      sequence: float (B, S, H).
      positions: int (B, P), indices into S.
    Returns float (B, P, H).
    """
    return ops.take_along_axis(sequence, ops.expand_dims(positions, -1), axis=1)


@keras.saving.register_keras_serializable(package="cloze")
class MaskedLMHead(keras.layers.Layer):
    """BERT's MLM head: dense + activation + LayerNorm, then the tied input embedding and a bias.

    call(sequence, positions, embedding_table):
      sequence float (B, S, H); positions int (B, P); embedding_table float (V, H), the encoder's
      word embeddings (weight tying, as the original `get_masked_lm_output`).
    Returns logits float (B, P, V), only at the P masked positions.
    """

    def __init__(self, hidden_size, hidden_act="gelu", initializer_range=0.02, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.transform = layers.Dense(hidden_size, hidden_act, initializer_range, name="transform")
        self.layer_norm = layers.layer_norm("layer_norm")

    def build(self, input_shape, vocab_size=None):
        self.transform.build(input_shape)
        self.layer_norm.build(input_shape)
        if vocab_size is not None:
            self.output_bias = self.add_weight(
                name="output_bias", shape=(vocab_size,), initializer="zeros"
            )

    def call(self, sequence, positions, embedding_table):
        x = gather_positions(sequence, positions)  # (B, P, H)
        x = self.layer_norm(self.transform(x))
        logits = ops.matmul(x, ops.transpose(embedding_table))  # (B, P, H) x (H, V) -> (B, P, V)
        return logits + self.output_bias

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
        }


@keras.saving.register_keras_serializable(package="cloze")
class ClassificationHead(keras.layers.Layer):
    """A linear classifier on a pooled vector (NSP, GLUE): float (B, H) -> logits float (B, C).

    Dropout, when wanted, is applied by the caller (fine-tuning adds it; NSP has none).
    """

    def __init__(self, num_classes, initializer_range=0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.initializer_range = initializer_range
        self.dense = layers.Dense(num_classes, initializer_range=initializer_range, name="dense")

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, pooled):
        return self.dense(pooled)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "initializer_range": self.initializer_range,
        }
