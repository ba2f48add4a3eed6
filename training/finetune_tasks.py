"""Fine-tuning for the Trainer: task definitions, prediction, layer-wise learning rates, and the
best dev checkpoint.

Tasks follow training/trainer.py's contract (sums over the replica's slice; the loss divides by
global counts). Eval and predict batches are padded to full batches, so every sum is weighted by
`is_real_example` (the original run_classifier's padding scheme). Dev metrics such as F1, Matthews
correlation and Spearman do not decompose into per-batch sums, so evaluation gathers the model's
outputs (`Predictor`) and computes metrics in numpy (training/metrics.py).
Shapes: B batch, C classes or choices, S length.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from keras import ops

from modeling import albert, electra, elmo, finetuning, flops, layers, span_qa, tagging, xlnet
from modeling.losses import classification_sums, masked_lm_sums, regression_sums
from training import metrics, optimization, trainer
from training.trainer import Task

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")


def _weights(batch, n):
    if "is_real_example" in batch:
        return ops.cast(ops.reshape(batch["is_real_example"], (-1,)), "float32")
    return ops.ones((n,), "float32")


def model_inputs(batch) -> dict:
    """The three encoder inputs of a batch (the rest are labels and weights), and precomputed
    `layer_features` when the batch has them (run_ner.py --feature_cache)."""
    extra = {"layer_features": batch["layer_features"]} if "layer_features" in batch else {}
    return {k: batch[k] for k in MODEL_INPUTS} | extra


def flops_fn(model):
    """The Task.flops_fn of a fine-tuning model, or None for one modeling/flops does not count
    (its run then logs no FLOP/s rather than a wrong one): BertClassifier, BertMultipleChoice,
    BertSpanQA and BertTagger (fine-tuned or on frozen features, with or without a BiLSTM) on a
    BERT, ALBERT or ELECTRA encoder; FeatureTagger (run_ner's cached features); ElmoTagger and
    ElmoClassifier on a frozen biLM; XLNetClassifier, XLNetSpanQA and XLNetBeamSpanQA (in
    training: the gold starts' end and answer-class logits).

    A trained part counts 3 forward passes (modeling/flops.py's docstring), a frozen encoder 1:
    its backward pass is skipped, as no trained weight lies below it (a Transformer up to the
    deepest layer read: later blocks feed nothing and a step prunes them; ELMo's whole biLM).
    tests/test_flops.py checks both against TensorFlow's gradient graph. The batch as it runs: int
    (B, S) inputs, or (B, C, S) for multiple choice (B x C sequences), S cut by dynamic
    padding; an encoder run with remove_padding counts its layers' per-position work at the
    batch's real-token rows (trainer.rows_per_sequence, `real` below)."""
    config = getattr(model, "config", None)
    pooler = not isinstance(config, electra.ElectraConfig)  # ELECTRA's encoder has no pooler
    # trained(rows, s, batch), frozen(rows, s, batch): the forward FLOPs of `rows` sequences of
    # s tokens through the trained part and through the frozen encoder.
    frozen = None

    def real(batch):  # encoder_flops' `rows`: None on the padded layout
        return trainer.rows_per_sequence(model, batch)

    if isinstance(model, finetuning.BertClassifier | finetuning.BertMultipleChoice):
        outputs, cls = getattr(model, "num_classes", 1), model.pooling == "cls"

        def trained(rows, s, batch):
            return rows * flops.sequence_classifier_flops(
                config, s, outputs, cls, pooler, rows=real(batch)
            )

    elif isinstance(model, span_qa.BertSpanQA):

        def trained(rows, s, batch):
            return rows * flops.token_classifier_flops(config, s, 2, rows=real(batch))

    elif isinstance(model, tagging.BertTagger | tagging.FeatureTagger):
        trained, frozen = _tagger_counts(model)
    elif isinstance(model, elmo.ElmoClassifier):
        width = config.output_dim  # the pooled scalar mix, [forward; backward]

        def trained(rows, s, batch):
            return rows * 2 * width * model.num_labels

        def frozen(rows, s, batch):
            return rows * flops.elmo_bilm_flops(config, s)  # the mix reads every layer

    elif isinstance(model, xlnet.XLNetClassifier):
        # Its relative positions are computed once a batch, so the count takes the rows.
        def trained(rows, s, batch):
            segments = "segment_ids" in batch
            return flops.xlnet_classifier_flops(config, s, rows, model.num_classes, segments)

    elif isinstance(model, xlnet.XLNetSpanQA | xlnet.XLNetBeamSpanQA):
        count_qa = (
            flops.xlnet_span_qa_flops
            if isinstance(model, xlnet.XLNetSpanQA)
            else flops.xlnet_beam_span_qa_flops
        )

        def trained(rows, s, batch):
            return count_qa(config, s, rows, "segment_ids" in batch)

    else:
        return None

    def count(batch):
        shape = trainer.float_shape(batch)
        rows, s = tf.reduce_prod(shape[:-1]), shape[-1]
        total = 3.0 * trained(rows, s, batch)
        return total if frozen is None else total + frozen(rows, s, batch)

    return count


def _tagger_counts(model):
    """flops_fn's (trained, frozen) forward counts of a BertTagger, FeatureTagger (its features
    come precomputed: no encoder runs) or ElmoTagger."""
    config = model.config
    width = tagging.feature_width(config) * (len(model.indices) if model.combine == "concat" else 1)

    def head(rows, s, batch):
        return rows * flops.tagger_head_flops(
            s, width, model.num_labels, model.lstm_units, model.lstm_layers
        )

    if isinstance(model, tagging.ElmoTagger):
        # Every LSTM layer, even below a mode that reads fewer: Keras' RNN loops are stateful
        # While ops, which a tf.function runs whether or not an output reads them.
        def encoder(rows, s, batch):
            return rows * flops.elmo_bilm_flops(config, s)

    elif isinstance(model, tagging.FeatureTagger):
        encoder = None
    elif tagging.is_xlnet(config):
        # The layers up to the deepest read (none: the embeddings alone, a lookup), the
        # relative positions once a batch: the count takes the rows.
        blocks = max(model.indices)

        def encoder(rows, s, batch):
            if not blocks:
                return 0.0
            below = config.replace(n_layer=blocks)
            return flops.xlnet_flops(below, s, rows, segments="segment_ids" in batch)

    else:
        blocks = max(model.indices)  # an index into the L + 1 outputs: that many blocks run

        def encoder(rows, s, batch):
            real = trainer.rows_per_sequence(model, batch)  # None on the padded layout
            return rows * flops.backbone_flops(config, s, blocks=blocks, rows=real)

    if model.frozen:
        return head, encoder
    return (lambda rows, s, batch: head(rows, s, batch) + encoder(rows, s, batch)), None


def classification_task(model) -> Task:
    """Softmax cross-entropy over classes (or over choices, for multiple choice): the mean over
    real examples, as the original run_classifier's loss."""

    def sums_fn(batch, training):
        logits = model(model_inputs(batch), training=training)
        w = _weights(batch, ops.shape(logits)[0])
        return classification_sums(logits, batch["label_ids"], w)

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "count")],
        metrics={"classifier_loss": ("loss_sum", "count"), "accuracy": ("correct", "count")},
        flops_fn=flops_fn(model),
    )


def regression_task(model) -> Task:
    """Mean squared error of a one-output model (STS-B, whose labels are scores in [0, 5])."""

    def sums_fn(batch, training):
        scores = model(model_inputs(batch), training=training)
        w = _weights(batch, ops.shape(scores)[0])
        return regression_sums(scores, batch["label_ids"], w)

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "count")],
        metrics={"regression_loss": ("loss_sum", "count")},
        flops_fn=flops_fn(model),
    )


def token_tagging_task(model) -> Task:
    """Token tagging (NER, run_ner.py): softmax cross-entropy at the positions whose
    `label_weights` is 1 (the first WordPiece of each word), averaged over those positions: the
    masked-LM sums with label ids over C tags in place of token ids over V."""

    def sums_fn(batch, training):
        logits = model(model_inputs(batch), training=training)  # (B, S, C)
        return masked_lm_sums(logits, batch["label_ids"], batch["label_weights"])

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "weight")],
        metrics={"tagging_loss": ("loss_sum", "weight"), "token_accuracy": ("correct", "weight")},
        flops_fn=flops_fn(model),
    )


class Predictor:
    """Runs a model over batches under a strategy and returns the outputs in input order.

    Each batch is split into equal per-replica slices as the Trainer splits training batches,
    and the replicas' outputs are gathered back in replica order, so row i of the result is row i
    of the input. `sequence_length`: per-position outputs (N, S, ...) of batches cut to their
    longest example (features.trim_to_longest) are zero-padded back to this length along axis 1
    in the step, before the gather, so replicas and workers whose batches were cut to other
    lengths still join. `input_keys`: the batch keys the model reads (default `model_inputs`);
    `output_key`: for a model that returns a dict, the output gathered.
    """

    def __init__(
        self,
        strategy,
        model,
        sequence_length: int | None = None,
        input_keys: tuple[str, ...] | None = None,
        output_key: str | None = None,
    ):
        self.strategy = strategy
        self.model = model
        self._inputs = (
            model_inputs if input_keys is None else (lambda b: {k: b[k] for k in input_keys})
        )

        def output(b):
            out = model(b, training=False)
            return out[output_key] if output_key else out

        def padded(out):
            if sequence_length is None:
                return out
            pad = [[0, 0]] * len(out.shape)
            pad[1] = [0, sequence_length - tf.shape(out)[1]]
            return tf.pad(out, pad)

        # reduce_retracing: batches cut to their longest example come in several lengths;
        # after the second, one trace takes any length. autograph=False: nothing here needs
        # AutoGraph's rewriting, which costs seconds at a process' first trace
        # (Trainer._train_step).
        @tf.function(reduce_retracing=True, autograph=False)
        def step(batch):
            dist = trainer.slice_for_replica(strategy, batch)
            out = strategy.run(lambda b: padded(output(b)), args=(dist,))
            return strategy.gather(out, axis=0)

        self._step = step

    def __call__(self, dataset, desc: str | None = None) -> np.ndarray:
        """dataset: batches of dicts with the model's inputs (other keys are ignored).
        Returns the concatenated float32 outputs, e.g. (N, C). `desc`: show a progress bar
        (batches, their rate and the time left) under that name on stderr."""
        from tqdm import tqdm

        # Negative where tf.data does not know it (tqdm then counts without a total).
        total = int(dataset.cardinality()) if desc is not None else -1
        bar = tqdm(
            dataset,
            desc=desc,
            total=total if total >= 0 else None,
            unit=" batches",
            mininterval=2.0,
            disable=desc is None,
        )
        # Once around the loop, not per batch: only a call that traces registers anything.
        with layers.custom_gradients_released():  # a trace's graph is not kept for good
            outputs = [self._step(self._inputs(batch)).numpy() for batch in bar]
        if not outputs:
            raise ValueError("prediction saw no batch")
        return np.concatenate(outputs, axis=0)


def output_metrics(outputs, labels, metric_names, regression: bool = False) -> dict:
    """Dev metrics from gathered model outputs: the named GLUE metrics, their mean `score`
    (training/metrics.compute) and the mean `loss` (cross-entropy, or squared error).

    outputs: float (N, C) logits (classes or choices), or (N, 1) / (N,) scores for regression.
    labels: int (N,) ids, or float (N,) scores.
    """
    outputs = np.asarray(outputs, np.float64)
    labels = np.asarray(labels)
    if regression:
        predictions = outputs.reshape(-1)
        loss = float(np.mean((predictions - labels) ** 2))
    else:
        predictions = np.argmax(outputs, axis=-1)
        z = outputs - outputs.max(axis=-1, keepdims=True)
        log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (N, C)
        loss = float(-np.mean(log_probs[np.arange(len(labels)), labels]))
    return metrics.compute(metric_names, labels, predictions) | {"loss": loss}


# ---------------------------------------------------------------------------------------------
# Layer-wise learning-rate decay
# ---------------------------------------------------------------------------------------------

# Encoder variables that feed the first layer (depth 0): BERT's embeddings and ELECTRA's
# embeddings_project (as ELECTRA's `_get_layer_lrs`), ALBERT's embedding_hidden_mapping_in, and
# XLNet's word_embedding and mask_emb (the query stream's start).
_INPUT_PARTS = ("embeddings", "embeddings_project", "embedding_hidden_mapping_in")
_INPUT_PARTS += ("word_embedding", "mask_emb")
# XLNet's relative-attention biases and segment embeddings: one slice per layer along the first
# axis ([L, N, D] and [L, 2, N, D]), or with untie_r=False the biases [N, D] shared by all layers.
_XLNET_LAYER_STACKS = {"r_w_bias": 3, "r_r_bias": 3, "r_s_bias": 3, "seg_embed": 4}


def layer_depth(path: str, shape, num_layers: int, num_groups: int | None = None):
    """The depth of one variable in the network, for layer-wise learning rates.

    ELECTRA's scheme (Clark et al. 2020, appendix A; `_get_layer_lrs` in its code): depth 0 for
    the inputs of the first layer (`_INPUT_PARTS`), i + 1 for Transformer layer i and L + 2 for the
    task head, every variable outside `encoder/`. The pooler, which ELECTRA does not have, sits at
    L + 1. A variable several layers use learns at the rate of the highest of them: an ALBERT
    group (num_groups of them shared by the num_layers layers, albert.group_of_layer) and XLNet's
    tied biases (depth L). XLNet's per-layer stacks get an array of depths, one per slice, shaped
    to broadcast over the variable. An encoder variable of no known part is an error, so a new
    model family cannot silently train its encoder at the head's rate.
    path: the Keras variable path, e.g. "bert_classifier/encoder/layer_3/attention/qkv/kernel".
    """
    match = re.search(r"(?:^|/)encoder/([^/]+)", path)
    if match is None:
        return num_layers + 2
    part = match.group(1)
    if part in _INPUT_PARTS:
        return 0
    if part == "pooler":
        return num_layers + 1
    if layer := re.fullmatch(r"layer_(\d+)", part):
        return int(layer.group(1)) + 1
    if (group := re.fullmatch(r"group_(\d+)", part)) and num_groups:
        g = int(group.group(1))
        return 1 + max(
            i for i in range(num_layers) if albert.group_of_layer(i, num_layers, num_groups) == g
        )
    if part in _XLNET_LAYER_STACKS:
        if len(shape) < _XLNET_LAYER_STACKS[part]:  # untie_r=False: one bias for every layer
            return num_layers
        return np.arange(1, num_layers + 1).reshape((num_layers,) + (1,) * (len(shape) - 1))
    raise ValueError(
        f"layer-wise learning rates: no depth known for the encoder variable {path}; "
        "use --layerwise_lr_decay=1.0"
    )


def layerwise_lr_multiplier(
    path: str, num_layers: int, decay: float, shape=(), num_groups: int | None = None
):
    """The learning-rate factor of one variable: decay ** (L + 2 - depth), `layer_depth`'s depth
    (a float, or a float32 array for XLNet's per-layer stacks)."""
    depth = layer_depth(path, shape, num_layers, num_groups)
    if isinstance(depth, np.ndarray):
        return (float(decay) ** (num_layers + 2 - depth)).astype(np.float32)
    return float(decay) ** (num_layers + 2 - depth)


@keras.saving.register_keras_serializable(package="cloze")
class LayerwiseAdamW(keras.optimizers.Adam):
    """AdamW whose learning rate, and with it the decoupled weight decay, is scaled per variable
    by `layerwise_lr_multiplier`, as ELECTRA's AdamWeightDecayOptimizer with layer-wise rates.

    Weight decay is applied inside `update_step` with the variable's own rate (Keras' AdamW
    would decay every variable with the unscaled rate), to the variables whose names match none
    of optimization.NO_DECAY_PATTERNS. With layer_decay 1.0 this is optimization.create_optimizer's
    AdamW.
    """

    def __init__(
        self,
        learning_rate,
        num_layers: int,
        layer_decay: float,
        weight_decay_rate: float = 0.01,
        num_groups: int | None = None,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        **kwargs,
    ):
        super().__init__(
            learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, **kwargs
        )
        self.num_layers = num_layers
        self.layer_decay = layer_decay
        self.weight_decay_rate = weight_decay_rate
        self.num_groups = num_groups

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        no_decay = re.compile("|".join(optimization.NO_DECAY_PATTERNS))
        # Indexed as the optimizer's own slots (_get_variable_index), fixed at build time.
        self.lr_multipliers = [
            layerwise_lr_multiplier(
                v.path, self.num_layers, self.layer_decay, v.shape, self.num_groups
            )
            for v in var_list
        ]
        self._decays = [no_decay.search(v.name) is None for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        i = self._get_variable_index(variable)
        lr = ops.cast(learning_rate, variable.dtype) * self.lr_multipliers[i]
        if self._decays[i] and self.weight_decay_rate:
            self.assign_sub(variable, variable * (self.weight_decay_rate * lr))
        super().update_step(gradient, variable, lr)

    def get_config(self):
        return {
            **super().get_config(),
            "num_layers": self.num_layers,
            "layer_decay": self.layer_decay,
            "weight_decay_rate": self.weight_decay_rate,
            "num_groups": self.num_groups,
        }


def create_finetuning_optimizer(
    learning_rate: float,
    num_train_steps: int,
    num_warmup_steps: int,
    num_layers: int,
    layer_decay: float = 1.0,
    num_groups: int | None = None,
):
    """optimization.create_optimizer's AdamW, or with layer_decay < 1 the LayerwiseAdamW with the
    same schedule and hyper-parameters. num_groups: an ALBERT encoder's num_hidden_groups."""
    if not 0.0 < layer_decay <= 1.0:
        raise ValueError(f"layerwise_lr_decay must be in (0, 1], found {layer_decay}")
    if layer_decay == 1.0:
        return optimization.create_optimizer(learning_rate, num_train_steps, num_warmup_steps)
    logging.info(
        "layer-wise learning rates: x%g per layer below the head, the embeddings at x%.3g",
        layer_decay,
        layer_decay ** (num_layers + 2),
    )
    optimizer = LayerwiseAdamW(
        optimization.WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps),
        num_layers,
        layer_decay,
        num_groups=num_groups,
    )
    if not hasattr(optimizer, "_all_reduce_sum_gradients"):
        raise RuntimeError("this Keras version has no optimizer._all_reduce_sum_gradients")
    # The train step sums gradients over replicas before clipping (training/optimization.py).
    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars
    return optimizer


# ---------------------------------------------------------------------------------------------
# Initial weights and the best dev checkpoint
# ---------------------------------------------------------------------------------------------


class BestCheckpoint:
    """Keeps `directory` (output_dir/best) holding the weights with the highest dev score so far.

    A candidate is written to a sibling temp folder, then swapped in with renames, so a kill at
    any moment leaves either the old best or the new one (a leftover is repaired on start). A
    score that is not strictly higher, or not finite, never replaces the kept one; the score
    survives restarts in best/best.json.
    """

    def __init__(self, directory, model):
        self.directory = Path(directory)
        self._tmp = self.directory.with_name(self.directory.name + ".tmp")
        self._old = self.directory.with_name(self.directory.name + ".old")
        self._checkpoint = tf.train.Checkpoint(model=model)
        self._repair()

    def _repair(self) -> None:
        if not self.directory.exists() and (self._old / "best.json").exists():
            self._old.rename(self.directory)  # killed between the two renames
        for leftover in (self._tmp, self._old):
            shutil.rmtree(leftover, ignore_errors=True)

    @property
    def info(self) -> dict | None:
        """{"score", "step", "metrics"} of the kept checkpoint, or None."""
        path = self.directory / "best.json"
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def prefix(self) -> str | None:
        return tf.train.latest_checkpoint(str(self.directory)) if self.info else None

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def update(self, score: float, step: int, metrics: dict) -> bool:
        """Saves the model as the new best if `score` beats the kept one. Returns whether it did."""
        current = self.info
        if not math.isfinite(score) or (current is not None and not score > current["score"]):
            return False
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp.mkdir(parents=True)
        self._checkpoint.save(str(self._tmp / "ckpt"))
        record = {"score": score, "step": step, "metrics": metrics}
        (self._tmp / "best.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        if self.directory.exists():
            self.directory.rename(self._old)
        self._tmp.rename(self.directory)
        shutil.rmtree(self._old, ignore_errors=True)
        return True


class DevSelection:
    """The dev evaluation of a fine-tuning run and the best checkpoint it keeps.

    As run_training's eval_fn (called at step 0 and after every checkpoint save) it runs
    `evaluate()` -> metrics and offers metrics[score_key] to `best` (a BestCheckpoint); steps
    before `first_candidate` are not offered (run_text2text: an untrained model can outscore
    one that has so far learnt only the commonest answer). results_at(step): the metrics at
    `step`, the last evaluation's when it was at that step (no second pass).
    """

    def __init__(self, best: BestCheckpoint, evaluate, score_key: str, step_fn, first_candidate=1):
        self.best, self.score_key = best, score_key
        self._evaluate, self._step, self._first = evaluate, step_fn, first_candidate
        self._last: dict = {}

    def __call__(self) -> dict:
        step = self._step()
        results = self._evaluate()
        self._last = {"step": step, "results": results}
        score = results[self.score_key]
        if step >= self._first and self.best.update(score, step, results):
            logging.info("new best dev %s %.4f at step %d, kept in %s", self.score_key, score,
                         step, self.best.directory)  # fmt: skip
        return results

    def results_at(self, step: int) -> dict:
        if self._last.get("step") == step:
            return dict(self._last["results"])
        return self._evaluate()
