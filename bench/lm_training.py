"""Training steps of the generative families, tokens/s: Cloze's GPT-2 next-token prediction, BART
denoising and T5 span-corruption steps against keras-hub's GPT2CausalLM, BartSeq2SeqLM and
T5Seq2SeqLM, at the published shapes (bench/generation.SIZES: gpt2, bart-base, t5-small).

Every side runs through the one train step run_pretraining.py uses (training/trainer.py's
Trainer with training/tasks.causal_lm_task or training/seq2seq_tasks.seq2seq_task: forward,
loss, backward, global-norm clipping, AdamW), so only the network and its output head differ:

  cloze         Cloze's model returning the loss terms without the (B, T, V) logits (its
                lm_terms: the vocabulary-major head, heads.tied_xent_and_hits)
  cloze_logits  the same model scored from its (B, T, V) logits, as every family was until the
                fifty-fourth session (the head's own gain, in the same rounds)
  keras_hub     keras-hub's task model (its logits: ReversibleEmbedding's reverse projection)
                scored by the same task from its logits

Each side is built from the shape alone with dropout 0.1 where each library puts it (GPT-2:
embeddings, attention probabilities, residuals; BART: residuals and attention probabilities,
Cloze's attention_dropout set to 0.1 as keras-hub's layers have it; T5: dropout_rate 0.1), with
fresh seeded weights: the step's time does not depend on the weights' values. Every side
computes in run_all's --precision (under fp16 with the Trainer's dynamic loss scaling).

One fixed random batch: GPT blocks of `seq` ids; encoder-decoders `seq` source ids and their
targets, all real: BART's the whole chunk (`seq` targets, as create_seq2seq_data.py's infilling
records), T5's seq // 4 (span corruption of 15% in spans of 3: about 0.2 x seq targets with the
sentinels and </s>). Rounds alternate between the sides (bench/pretrain_throughput's
time_trainers, after an untimed compiling round); tokens/s is the best round's (batch x seq for
GPT, batch x (seq + targets) for the encoder-decoders); `ratio` is Cloze's best against
keras-hub's best and `ratio_rounds` each round pair's, `head_gain` the median of the rounds'
cloze_logits / cloze time ratios.

  python bench/run_all.py --benchmarks=lm_training --output_dir=/tmp/bench
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bench.pretrain_throughput import ModelHolder

DROPOUT = 0.1

# keras-hub's task model of each family, as the table names it.
PEERS = {"gpt": "GPT2CausalLM", "bart": "BartSeq2SeqLM", "t5": "T5Seq2SeqLM"}


@dataclasses.dataclass(frozen=True)
class StartOnly:
    """What seq2seq_task reads of a peer's config: the decoder's start id."""

    decoder_start_token_id: int


class KerasHubLM(ModelHolder):
    """keras-hub's task model with the outputs the tasks read (lm_logits), fed from a batch."""

    def __init__(self, lm, family: str, start_id: int | None):
        self.model, self.family = lm, family
        if start_id is not None:
            self.config = StartOnly(start_id)

    def __call__(self, inputs, training=False):
        import tensorflow as tf

        if self.family == "gpt":
            ids = inputs["input_ids"]
            feed = {"token_ids": ids, "padding_mask": tf.ones_like(ids)}
        else:
            dec = inputs["decoder_input_ids"]
            feed = {
                "encoder_token_ids": inputs["input_ids"],
                "encoder_padding_mask": inputs["input_mask"],
                "decoder_token_ids": dec,
                "decoder_padding_mask": tf.ones_like(dec),
            }
        return {"lm_logits": self.model(feed, training=training)}


class LogitsOnly(ModelHolder):
    """A Cloze model called without lm_terms: the tasks then score its lm_logits."""

    def __init__(self, model):
        self.model = model
        self.config = model.config

    def __call__(self, inputs, training=False):
        return self.model(inputs, training=training)


def build_models(spec: dict, seq: int, target_length: int, seed: int = 0) -> dict:
    """{"cloze": Cloze's model, "keras_hub": KerasHubLM} of one bench/generation size spec, each
    seeded, with dropout DROPOUT (module docstring)."""
    import keras
    import keras_hub

    from bench import generation
    from modeling import bart, gpt, t5

    family, width = spec["family"], max(1024, seq, target_length)
    hub_shape = dict(
        vocabulary_size=spec["vocab"],
        num_layers=spec["layers"],
        num_heads=spec["heads"],
        hidden_dim=spec["hidden"],
        intermediate_dim=spec["ffn"],
        dropout=DROPOUT,
    )
    keras.utils.set_random_seed(seed)
    config = generation.cloze_config(spec, DROPOUT, width)
    cloze = {"gpt": gpt.GptLM, "bart": bart.BartModel, "t5": t5.T5Model}[family](config)
    keras.utils.set_random_seed(seed)
    if family == "gpt":
        backbone = keras_hub.models.GPT2Backbone(**hub_shape, max_sequence_length=width)
        hub = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    elif family == "bart":
        backbone = keras_hub.models.BartBackbone(**hub_shape, max_sequence_length=width)
        hub = keras_hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.T5Backbone(
            **hub_shape,
            key_value_dim=spec["d_kv"],
            activation="relu",
            use_gated_activation=False,  # T5's relu feed-forward, T5Config's default
        )
        hub = keras_hub.models.T5Seq2SeqLM(backbone=backbone, preprocessor=None)
    start = None if family == "gpt" else config.decoder_start_token_id
    cloze.build()
    return {"cloze": cloze, "keras_hub": KerasHubLM(hub, family, start)}


def targets_per_example(family: str, seq: int) -> int:
    """The targets per example of a family's batch (module docstring); GPT has none."""
    return {"gpt": 0, "bart": seq, "t5": seq // 4}[family]


def batch_of(spec: dict, batch: int, seq: int, target_length: int, seed: int = 0) -> dict:
    """The fixed random batch (module docstring), with the TFRecord feature names the tasks read."""
    rng = np.random.default_rng(seed)
    vocab = spec["vocab"]
    ids = rng.integers(3, vocab, (batch, seq)).astype(np.int32)
    if spec["family"] == "gpt":
        return {"input_ids": ids}
    return {
        "input_ids": ids,
        "input_mask": np.ones((batch, seq), np.int32),
        "target_ids": rng.integers(3, vocab, (batch, target_length)).astype(np.int32),
        "target_mask": np.ones((batch, target_length), np.int32),
    }


def build_trainers(
    spec: dict, seq: int, target_length: int, precision: str = "fp32", seed: int = 0
) -> dict:
    """{"cloze", "cloze_logits", "keras_hub": Trainer} of one size spec (build_models, under
    run_pretraining's default one_device strategy): the same Trainer, task and optimizer
    settings (run_pretraining's AdamW) for every side; cloze_logits trains Cloze's own model
    object through its logits (with optimizer slots of its own). Under `precision` (Keras'
    mixed policies; fp16 with the Trainer's dynamic loss scaling) on every side."""
    from training import distribute, optimization, seq2seq_tasks, tasks, trainer

    make_task = tasks.causal_lm_task if spec["family"] == "gpt" else seq2seq_tasks.seq2seq_task
    strategy = distribute.get_strategy("one_device")
    out = {}
    with optimization.dtype_policy(precision), strategy.scope():
        models = build_models(spec, seq, target_length, seed)
        sides = {**models, "cloze_logits": LogitsOnly(models["cloze"])}
        for name in ("cloze", "cloze_logits", "keras_hub"):
            optimizer = optimization.create_optimizer(1e-4, 10_000, 0)
            optimizer = optimization.with_loss_scaling(optimizer, precision)
            optimizer.build(sides[name].trainable_variables)
            out[name] = trainer.Trainer(strategy, make_task(sides[name]), optimizer)
    return out


def run(
    sizes=("gpt2", "bart-base", "t5-small"),
    batch: int = 8,
    seq: int = 128,
    steps: int = 2,
    rounds: int = 3,
    precision: str = "fp32",
    specs: dict | None = None,
    log=None,
) -> dict:
    """{"sizes": [per size: each side's best step and tokens/s, the ratio to keras-hub, the
    head's own gain]} (module docstring). `specs`: name -> bench/generation-style spec (its
    SIZES and QUICK_SIZES when None)."""
    from bench import generation, pretrain_throughput
    from modeling import layers

    specs = specs or {**generation.SIZES, **generation.QUICK_SIZES}
    out = {
        "batch": batch,
        "seq": seq,
        "steps_per_round": steps,
        "rounds": rounds,
        "precision": precision,
        "dropout": DROPOUT,
        "onednn": layers.onednn_enabled(),  # as the pretrain benchmark's: it moves the ratios
        "sizes": [],
    }
    for name in sizes:
        spec = specs[name]
        family = spec["family"]
        targets = targets_per_example(family, seq)
        trainers = build_trainers(spec, seq, targets, precision)
        data = batch_of(spec, batch, seq, targets)
        times, _, overflows = pretrain_throughput.time_trainers(
            trainers, data, steps, rounds, log=log
        )
        tokens = batch * (seq + targets)
        row = {"size": name, "family": family, "targets": targets, "tokens_per_step": tokens}
        for side, t in times.items():
            row[side] = {
                "step_s": min(t),
                "step_s_rounds": t,
                "tokens_per_s": tokens / min(t),
                "params": pretrain_throughput.params_of(trainers[side]),
                "overflow_steps": overflows[side],
            }
        row["ratio"] = row["keras_hub"]["step_s"] / row["cloze"]["step_s"]
        row["ratio_rounds"] = [k / c for c, k in zip(times["cloze"], times["keras_hub"])]
        row["head_gain_rounds"] = [p / c for c, p in zip(times["cloze"], times["cloze_logits"])]
        row["head_gain"] = float(np.median(row["head_gain_rounds"]))
        out["sizes"].append(row)
        del trainers
    return out
