"""Small builders shared by tests: tiny odd-sized configs and synthetic pretraining TFRecords."""

from __future__ import annotations

import functools

import numpy as np

from data_prep import features
from modeling import bert

# Odd sizes so a swapped axis cannot pass (shared/STYLE.md).
TINY = dict(
    vocab_size=53,
    hidden_size=12,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=17,
    hidden_act="gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=16,
    type_vocab_size=2,
    initializer_range=0.02,
)


def tiny_config(**changes) -> bert.BertConfig:
    return bert.BertConfig(**{**TINY, **changes})


def write_synthetic_pretraining_file(
    path, num_examples, seq_length, max_predictions, vocab_size, seed=0
):
    """Writes random but well-formed pretraining examples; returns the raw arrays written."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    rows = []
    with tf.io.TFRecordWriter(str(path)) as w:
        for _ in range(num_examples):
            n = int(rng.integers(max_predictions + 3, seq_length + 1))
            ids = rng.integers(5, vocab_size, size=n).tolist()
            ids[0] = 2
            seg = [0] * (n // 2) + [1] * (n - n // 2)
            npred = int(rng.integers(1, max_predictions + 1))
            pos = sorted(rng.choice(np.arange(1, n), size=npred, replace=False).tolist())
            labels = [ids[i] for i in pos]
            for i in pos:
                ids[i] = 4
            label = int(rng.integers(0, 2))
            w.write(
                features.serialize_pretraining_example(
                    ids, seg, pos, labels, label, seq_length, max_predictions
                )
            )
            rows.append((ids, seg, pos, labels, label))
    return rows


@functools.cache
def mirrored_strategy():
    """One MirroredStrategy over conftest's two logical CPUs, shared by every test.

    Two strategies in one process number their collective ops from the same start, so a second
    one that runs collectives after the first fails ("Collective instance 100 expected type ...");
    a real run has one strategy per process, a test session has to share it.
    """
    import tensorflow as tf

    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert len(cpus) == 2, "conftest must configure two logical CPUs"
    return tf.distribute.MirroredStrategy(cpus)


def run_classifier_on_two_sentences(tmp_path, config_file, *flags):
    """run_classifier.py as a subprocess on a learnable SST-2 folder ("The cat sat." 1 and "The
    dog barked." 0, six times each in train.tsv, once each in dev.tsv; test.tsv indices 4 (dog)
    and 8 (cat)) with the BPE folder tmp_path/bpe: train, eval and predict at batch 4 and
    learning rate 1e-2, plus `flags`. Returns (the completed process, its output folder)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    data = tmp_path / "sst"
    data.mkdir(parents=True, exist_ok=True)
    rows = ["The cat sat.\t1", "The dog barked.\t0"] * 6
    (data / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (data / "dev.tsv").write_text("sentence\tlabel\nThe cat sat.\t1\nThe dog barked.\t0\n")
    (data / "test.tsv").write_text("index\tsentence\n4\tThe dog barked.\n8\tThe cat sat.\n")
    out = tmp_path / "out"
    args = [
        sys.executable, "run_classifier.py", "--task_name=sst-2", f"--data_dir={data}",
        f"--vocab_file={tmp_path / 'bpe'}", f"--bert_config_file={config_file}",
        f"--output_dir={out}", "--train_batch_size=4", "--learning_rate=1e-2",
        "--do_train", "--do_eval", "--do_predict", *flags,
    ]  # fmt: skip
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600), out


def train_to_copy(model, decoder_start_id: int, steps: int, warmup: int):
    """Teacher-forced training of an encoder-decoder (T5, BART) to copy 32 random 4-id sequences
    followed by eos (id 1), 16 a step; returns the sources and the last step's loss."""
    import tensorflow as tf

    from training import optimization

    rng = np.random.default_rng(0)
    src = rng.integers(3, 23, (32, 4)).astype("int32")
    targets = np.concatenate([src, np.ones((32, 1), np.int32)], axis=1)
    opt = optimization.create_optimizer(5e-3, steps, warmup)

    @tf.function
    def step(ids, tgt):
        start = tf.fill(tf.shape(tgt[:, :1]), decoder_start_id)
        with tf.GradientTape() as tape:
            out = model(
                {
                    "input_ids": ids,
                    "input_mask": tf.ones_like(ids),
                    "decoder_input_ids": tf.concat([start, tgt[:, :-1]], 1),
                },
                training=True,
            )
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(
                    tgt, out["lm_logits"], from_logits=True
                )
            )
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    for i in range(steps):
        j = (i * 16) % 32
        loss = float(step(src[j : j + 16], targets[j : j + 16]))
    return src, loss


def tiny_encoder_decoder(model_cls, config_cls, values: dict):
    """A built T5Model / BartModel of `values` with the same seeded initialisation each call."""
    import keras

    keras.utils.set_random_seed(5)
    model = model_cls(config_cls(**values))
    model.build()
    return model


def encoder_decoder_batch(b=3, s=7, t=5, seed=0, padded=((0, 5),), vocab_size=23):
    """Random int32 encoder ids (B, S) with `padded` rows cut at (row, length), and decoder
    inputs (B, T); ids from 2 up, so that 0 / 1 stay free for pad / eos."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab_size, (b, s)).astype("int32")
    mask = np.ones_like(ids)
    for row, length in padded:
        mask[row, length:] = 0
    return {
        "input_ids": ids,
        "input_mask": mask,
        "decoder_input_ids": rng.integers(2, vocab_size, (b, t)).astype("int32"),
    }
