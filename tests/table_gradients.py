"""The gradients of looked-up embedding tables under mixed_bfloat16, for the tests in
test_step_speed.py: `KERAS_BACKEND=<jax|tensorflow> python -m tests.table_gradients` prints one
line, "RESULT <json>".

Every family adds its looked-up tables with `autocast=False` and reads them through
layers.lookup_rows: BERT's word, token-type and position tables (the encoder of RoBERTa, ALBERT,
ELECTRA and SpanBERT too), GPT's wte and wpe, XLNet's word_embedding, T5's shared table and
relative attention biases, BART's shared and position tables, and the span boundary head's
position table. Each family's tiny model is built twice: as it is, and with those tables
autocast again (their state until the thirty-sixth session for BERT, the thirty-seventh for the
others: the negative control). Under JAX the script reports the scatter-adds of the loss's
gradient by result type (float32 now, bfloat16 autocast); under TensorFlow, whether the loss and
every gradient are the same bits both ways, and how many of the traced step's gathers read
float32 each way (so the two programs are known to differ).
"""

from __future__ import annotations

import json
import re

import keras
import numpy as np
from keras import ops

from data_prep import permutation
from modeling import bart, bert, gpt, heads, t5, xlnet

TABLES = {
    "word_embeddings",
    "token_type_embeddings",
    "wte",
    "wpe",
    "word_embedding",
    "shared",
    "relative_attention_bias",
    "encoder_embed_positions",
    "decoder_embed_positions",
    "position_embeddings",
}
FAMILIES = ("bert", "gpt", "xlnet", "t5", "bart", "sbo")


class SpanBoundary(keras.Model):
    """The span boundary head over a given sequence and its own (V, H) output table."""

    def __init__(self):
        super().__init__()
        self.head = heads.SpanBoundaryHead(12, 12, max_span_length=5, name="span_boundary_head")

    def build(self, input_shape=None):
        self.table = self.add_weight(shape=(29, 12), name="table")
        self.head.build((3, 7, 12), vocab_size=29)

    def call(self, inputs, training=False):
        x, table = inputs["sequence"], self.table
        return {"logits": self.head(x, inputs["positions"], inputs["left"], inputs["right"], table)}


class Outer(keras.Model):
    """Calls the model through __call__, as a task or bench/gpu_mfu.py's pretrainer does:
    stateless_call runs the outermost model's call() outside its autocast scope."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def build(self, input_shape=None):
        self.built = True

    def call(self, inputs, training=False):
        return self.inner(inputs, training=training)


def family(name):
    """(model, inputs, the output to take the loss of): a tiny model of each family."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(0)
    if name == "bert":
        config = bert.BertConfig(
            vocab_size=29, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
            intermediate_size=17, max_position_embeddings=11, type_vocab_size=2,
        )  # fmt: skip
        inputs = {
            "input_ids": rng.integers(0, 29, (3, 7)).astype("int32"),
            "input_mask": np.ones((3, 7), "int32"),
            "segment_ids": (np.arange(7) >= 4).astype("int32")[None].repeat(3, 0),
            "masked_lm_positions": np.array([[1, 2], [3, 5], [2, 6]], "int32"),
        }
        return bert.BertPretrainer(config), inputs, "mlm_logits"
    if name == "gpt":
        config = gpt.GptConfig(n_vocab=29, n_ctx=13, n_embd=12, n_head=3, n_layer=2, n_inner=17)
        return gpt.GptLM(config), {"input_ids": rng.integers(0, 29, (3, 7))}, "lm_logits"
    if name == "xlnet":
        config = xlnet.XLNetConfig(
            d_head=5, d_inner=17, d_model=12, n_head=3, n_layer=2, n_token=29,
            ff_activation="gelu", untie_r=True,
        )  # fmt: skip
        ids = rng.integers(0, 29, (3, 7)).astype("int32")
        f = permutation.permutation_lm_features(ids, [4, 5], num_predict=3)
        inputs = {k: f[k] for k in ("input_ids", "perm_mask", "target_mapping")}
        return xlnet.XLNetPretrainer(config), inputs, "plm_logits"
    if name in ("t5", "bart"):
        sizes = dict(vocab_size=23, d_model=12)
        if name == "t5":
            model = t5.T5Model(t5.T5Config(**sizes, d_kv=4, d_ff=17, num_layers=2, num_heads=3))
        else:
            config = bart.BartConfig(
                **sizes, encoder_layers=2, decoder_layers=2, encoder_attention_heads=3,
                decoder_attention_heads=3, encoder_ffn_dim=17, decoder_ffn_dim=17,
                max_position_embeddings=11, pad_token_id=0, bos_token_id=None, eos_token_id=1,
                decoder_start_token_id=1,
            )  # fmt: skip
            model = bart.BartModel(config)
        inputs = {
            "input_ids": rng.integers(2, 23, (3, 7)).astype("int32"),
            "input_mask": np.ones((3, 7), "int32"),
            "decoder_input_ids": rng.integers(2, 23, (3, 5)).astype("int32"),
        }
        return model, inputs, "lm_logits"
    inputs = {
        "sequence": rng.normal(size=(3, 7, 12)).astype("float32"),
        "positions": np.array([[2, 3], [3, 4], [4, 5]], "int32"),
        "left": np.array([[1, 1], [2, 2], [1, 1]], "int32"),
        "right": np.array([[4, 4], [5, 5], [6, 6]], "int32"),
    }
    return SpanBoundary(), inputs, "logits"


def built(name, autocast_tables):
    """(Outer model, inputs, output key, the tables as "path float32|autocast")."""
    model, inputs, key = family(name)
    model.build()
    tables = [v for v in model.weights if v.path.split("/")[-1] in TABLES]
    names = sorted(
        f"{v.path.split('/', 1)[1]} {'autocast' if v._autocast else 'float32'}" for v in tables
    )
    if autocast_tables:
        for v in tables:
            v._autocast = True  # no public setter: Keras reads this attribute at each access
    outer = Outer(model)
    outer.build()
    return outer, inputs, key, names


def loss_of(outputs, key):
    logits = ops.cast(outputs[key], "float32")
    weights = ops.cast(ops.arange(logits.shape[-1]) % 5 - 2, "float32")
    return ops.mean(ops.square(logits) * weights)


def scatter_types(text: str) -> list[str]:
    """The result types of a lowered program's scatters (a gradient's scatter-adds), sorted:
    e.g. ["29x12xf32", "3x7x12xbf16"]."""
    found = re.findall(r"stablehlo.scatter.*?-> tensor<([0-9x]+x(?:bf16|f32))>", text, re.S)
    return sorted(found)


def under_jax() -> dict:
    import jax

    result = {}
    for name in FAMILIES:
        for autocast_tables in (False, True):
            model, inputs, key, tables = built(name, autocast_tables)
            trainable = [v.value for v in model.trainable_variables]
            others = [v.value for v in model.non_trainable_variables]

            def loss(trainable, model=model, inputs=inputs, key=key, others=others):
                outputs, _ = model.stateless_call(trainable, others, inputs)
                return loss_of(outputs, key)

            text = jax.jit(jax.grad(loss)).lower(trainable).as_text()
            label = f"{name} {'autocast' if autocast_tables else 'now'}"
            result[label] = {"tables": tables, "scatters": scatter_types(text)}
    return result


def under_tensorflow() -> dict:
    import tensorflow as tf

    result = {}
    for name in FAMILIES:
        values, gathers = {}, {}
        for autocast_tables in (False, True):
            model, inputs, key, tables = built(name, autocast_tables)

            @tf.function
            def step(model=model, inputs=inputs, key=key):
                with tf.GradientTape() as tape:
                    loss = loss_of(model(inputs), key)
                return loss, tape.gradient(loss, model.trainable_variables)

            loss, grads = step()
            values[autocast_tables] = [np.asarray(loss)] + [
                None if g is None else np.asarray(tf.convert_to_tensor(g)) for g in grads
            ]
            # The lookups as traced: the dtype each gather reads (the tables' float32 now,
            # bfloat16 autocast), so the comparison is known to compare different programs.
            graph = step.get_concrete_function().graph
            found = [
                op.outputs[0].dtype.name
                for op in graph.get_operations()
                if op.type in ("GatherV2", "ResourceGather")
            ]
            gathers[autocast_tables] = found.count("float32")
        now, before = values[False], values[True]
        same = len(now) == len(before) and all(
            (a is None and b is None) or np.array_equal(a, b) for a, b in zip(now, before)
        )
        result[name] = {
            "tables": tables,
            "bit_identical": same,
            "loss": float(now[0]),
            "float32_gathers": {"now": gathers[False], "autocast": gathers[True]},
        }
    return result


def main():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    result = under_jax() if keras.backend.backend() == "jax" else under_tensorflow()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
