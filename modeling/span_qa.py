"""Extractive question answering: a BERT encoder plus a span start / end head (Devlin et al.
2019, sec. 4.2).

The head is the original run_squad's: one linear layer from every token's last hidden state to
two numbers, the start and end logits (its `cls/squad/output_weights`, here `qa_outputs`). The
backbone lives in the attribute `encoder`, the pre-training model's name, so a pretraining
checkpoint's `model/encoder` loads into it (training/trainer.init_from_checkpoint).
Shapes: B batch, S length, H hidden.
"""

from __future__ import annotations

import keras
from keras import ops

from modeling import finetuning, layers
from modeling.bert import BertConfig


@keras.saving.register_keras_serializable(package="cloze")
class BertSpanQA(keras.Model):
    """BERT for span prediction (SQuAD v1.1 / v2.0).

    call(inputs, training) with inputs a dict of int (B, S) `input_ids`, `input_mask`,
    `segment_ids` returns float32 (B, S, 2): start logits in [..., 0], end logits in [..., 1].
    One tensor rather than a dict, so a generic predictor can gather it. Padding positions are
    not masked, as in the original: post-processing only ever reads document positions.

    Args:
      config: the encoder's BertConfig, AlbertConfig or ElectraConfig (or its dict).
    """

    def __init__(self, config: BertConfig | dict, **kwargs):
        super().__init__(**kwargs)
        self.encoder = finetuning.encoder_for(config)  # BERT, ALBERT or ELECTRA's
        self.config = config = self.encoder.config
        # The pooler gets no gradient from a span head; frozen, it still loads and saves, and
        # the train step sees no None gradient. (ELECTRA's encoder has none.)
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler.trainable = False
        self.qa_outputs = layers.Dense(2, initializer_range=config.initializer_range, name="qa")

    def build(self, input_shape=None):
        self.encoder.build()
        self.qa_outputs.build((None, None, self.config.hidden_size))
        self.built = True

    def call(self, inputs, training=False):
        x = self.encoder(inputs, training=training)["sequence_output"]  # (B, S, H)
        return ops.cast(self.qa_outputs(x), "float32")  # (B, S, 2)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
