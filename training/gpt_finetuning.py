"""GPT-1 fine-tuning for GLUE-style classification and multiple choice (Radford et al. 2018, sec.
3.2-3.3), the path run_classifier.py takes when --bert_config_file is a GPT config.

Inputs are byte-level BPE ids `start text_a [delim text_b] extract`: the classifier reads the
last block's vector at the extract token (modeling/gpt.GptClassifier) and the language-model loss
on the same text is added with weight lm_coef (the paper's lambda = 0.5, sec. 3.2). The three
delimiters are the encoder's `<|start|>`, `<|delim|>` and `<|extract|>` when it holds them (GPT-1
added them as new embeddings); a vocabulary without them, such as one a GPT was pretrained on by
create_lm_data.py, uses its `<|endoftext|>` for each missing role, whose embedding pretraining
learned as a document boundary. A vocabulary with neither, such as the released GPT-1's word-end
BPE (data_prep/bpe.WordEndBPE), gets the three as new tokens after the config's n_vocab, their
embedding rows initialised at random as GPT-1 did, the checkpoint's rows kept
(init_with_new_tokens).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf
from absl import logging

from data_prep import bpe, glue
from data_prep.errors import input_error
from modeling import flops, gpt, losses
from training import trainer
from training.trainer import Task, float_shape

DELIMITERS = ("<|start|>", "<|delim|>", "<|extract|>")
# Radford et al. 2018, sec. 3.2: L3 = L2 + lambda * L1 with lambda 0.5.
LM_COEF = 0.5


@dataclasses.dataclass(frozen=True)
class GptFinetuneSettings:
    """Plain run settings, read from run_classifier.py's flags."""

    data_dir: str
    vocab_file: str  # a folder with encoder.json and vocab.bpe, or encoder.json (vocab.bpe beside)
    config_file: str
    output_dir: str
    init_checkpoint: str | None = None
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    max_seq_length: int = 128
    train_batch_size: int = 32
    eval_batch_size: int = 8
    predict_batch_size: int = 8
    learning_rate: float = 6.25e-5  # GPT-1 sec. 4.1
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.002  # GPT-1 sec. 4.1: warmup over 0.2% of training
    save_checkpoints_steps: int = 1000
    iterations_per_loop: int = 100
    random_seed: int = 12345
    lm_coef: float = LM_COEF
    skip_bad_rows: bool = False
    peak_tflops: float = 0.0  # the log's FLOPs utilisation (run_classifier's --peak_tflops)
    precision: str = "fp32"  # run_classifier's --precision (training/precision.PRECISION_NAMES)
    distribution_strategy: str = "one_device"  # run_classifier's (training/distribute.py)
    tpu: str | None = None


def load_bpe(vocab_file: str):
    """The BPE of `vocab_file`: a folder holding encoder.json and vocab.bpe (or Hugging Face's
    vocab.json and merges.txt), or the encoder.json itself with vocab.bpe beside it; GPT-2's
    byte-level BPE or GPT-1's word-end one, told by the vocabulary (bpe.load_gpt_bpe)."""
    path = Path(vocab_file)
    files = bpe.folder_files(path)
    if files is None and path.is_file():
        files = path, path.parent / "vocab.bpe"
    if files is None or not files[1].is_file():
        raise input_error(
            vocab_file,
            "a GPT BPE folder with encoder.json and vocab.bpe (or vocab.json and merges.txt)",
            "no such files",
        )
    return bpe.load_gpt_bpe(*files)


def delimiter_ids(tokenizer, n_vocab: int | None = None) -> tuple[int, int, int]:
    """(start, delim, extract) ids; see the module docstring for the fallback. A vocabulary with
    neither the delimiters nor `<|endoftext|>` gets them as n_vocab, n_vocab + 1 and n_vocab + 2
    (new tokens: the model must grow its table, init_with_new_tokens); without n_vocab that is
    a ValueError."""
    enc = tokenizer.encoder
    fallback = enc.get(bpe.GPT2_END_OF_TEXT)
    ids = tuple(enc.get(name, fallback) for name in DELIMITERS)
    if None in ids and n_vocab is not None and not any(name in enc for name in DELIMITERS):
        return n_vocab, n_vocab + 1, n_vocab + 2
    if None in ids:
        raise ValueError(
            f"the BPE vocabulary has neither {list(DELIMITERS)} nor {bpe.GPT2_END_OF_TEXT!r} "
            "for the delimiter tokens"
        )
    return ids


def table_rows(path: str) -> int | None:
    """The rows of the GPT token table (`.../wte`) in the Cloze checkpoint `path` (a prefix or a
    folder: its latest), read from the checkpoint's index alone; None when it has none."""
    prefix = tf.train.latest_checkpoint(path) if tf.io.gfile.isdir(path) else path
    if not prefix or not tf.io.gfile.exists(prefix + ".index"):
        return None  # trainer.init_from_checkpoint names the path
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    rows = [s[0] for k, s in shapes.items() if k.endswith("/wte/.ATTRIBUTES/VARIABLE_VALUE")]
    return rows[0] if rows else None


def init_with_new_tokens(model, path: str, base_config: gpt.GptConfig, num_outputs: int):
    """trainer.init_from_checkpoint for a GptClassifier whose token table has rows the
    checkpoint (of a model with base_config's n_vocab) lacks: the checkpoint is read into a
    model of the base config, whose weights are copied over, the table's first n_vocab rows
    from it and its new rows as `model` initialised them. Returns (prefix, part loaded)."""
    base = gpt.GptClassifier(base_config, num_outputs)
    base.build()
    loaded, part = trainer.init_from_checkpoint(base, path)
    for new, old in zip(model.weights, base.weights, strict=True):
        value = old.numpy()
        if tuple(new.shape) != tuple(old.shape):  # the token table: (n_vocab + 3, n_embd)
            if not new.path.endswith("wte") and not new.path.endswith("tokens_embed"):
                raise RuntimeError(f"{new.path}: {new.shape} against {old.shape}")
            value = np.concatenate([value, new.numpy()[len(value) :]])
        new.assign(value)
    return loaded, part


def encode_example(tokenizer, ids3, text_a: str, text_b: str | None, max_seq_length: int):
    """(`start a [delim b] extract` ids, whether tokens were dropped); when too long, the longer
    text loses its last token first (glue.truncate_pair, as the BERT packing)."""
    b = tokenizer.encode(text_b) if text_b is not None else None
    return pack_ids(ids3, tokenizer.encode(text_a), b, max_seq_length)


def pack_ids(ids3, a: list[int], b: list[int] | None, max_seq_length: int):
    """encode_example's packing of already encoded texts."""
    start, delim, extract = ids3
    specials = 3 if b is not None else 2
    a2, b2 = glue.truncate_pair(a, list(b or []), max_seq_length - specials)
    cut = len(a2) + len(b2) < len(a) + len(b or [])
    if b is None:
        return [start, *a2, extract], cut
    return [start, *a2, delim, *b2, extract], cut


def encode_split(tokenizer, ids3, task, examples, max_seq_length: int) -> glue.Encoded:
    """Features input_ids, input_mask int32 (N, S) (right padded with 0) and label_ids int32
    (N,), and the truncated examples' guids. A multiple-choice task's are (N, K, S), answer k
    being `start text_a delim text_b + " " + ending_k extract` (sec. 3.3; glue.encode_examples
    pairs them the same way)."""
    n, k = len(examples), task.num_choices
    ids_, mask = (np.zeros((n, k or 1, max_seq_length), np.int32) for _ in range(2))
    truncated = []
    for row, ex in enumerate(examples):
        a, cut = tokenizer.encode(ex.text_a), False  # the context once, for all its answers
        for j, text_b in enumerate(glue.second_texts(ex, k)):
            b = tokenizer.encode(text_b) if text_b is not None else None
            ids, was_cut = pack_ids(ids3, a, b, max_seq_length)
            cut |= was_cut
            ids_[row, j, : len(ids)] = ids
            mask[row, j, : len(ids)] = 1
        if cut:
            truncated.append(ex.guid)
    if not k:
        ids_, mask = ids_[:, 0], mask[:, 0]  # (N, 1, S) -> (N, S)
    labels = np.array([glue.label_id(task, ex.label) for ex in examples], np.int32)
    return glue.Encoded({"input_ids": ids_, "input_mask": mask, "label_ids": labels}, truncated)


def gpt_classification_task(model, lm_coef: float = LM_COEF) -> Task:
    """Classification cross-entropy plus lm_coef x the causal LM loss on the input text (GPT-1
    sec. 3.2). Metrics: loss (the classification part), accuracy, lm_loss."""

    def sums_fn(batch, training):
        inputs = {"input_ids": batch["input_ids"], "input_mask": batch["input_mask"]}
        # The LM terms without the (B, T, V) logits (gpt.next_token_terms).
        out = model(inputs, training=training, lm_terms=True)
        cls = losses.classification_sums(out["logits"], batch["label_ids"])
        # The LM terms are per sequence: (B*K, T - 1) under multiple choice.
        mask = tf.reshape(batch["input_mask"], [-1, tf.shape(batch["input_mask"])[-1]])
        lm = losses.causal_lm_sums_of(out["lm_xent"], out["lm_hits"], mask)
        return {f"cls_{k}": v for k, v in cls.items()} | {f"lm_{k}": v for k, v in lm.items()}

    def flops_fn(batch):
        """3 forward passes (modeling/flops.py) of the batch's (B, T) or (B, K, T) sequences."""
        shape = float_shape(batch)
        rows, t = tf.reduce_prod(shape[:-1]), shape[-1]
        return 3.0 * rows * flops.gpt_classifier_flops(model.config, t, model.num_classes)

    terms = [("cls_loss_sum", "cls_count")]
    if lm_coef:
        terms.append(("lm_loss_sum", "lm_weight", lm_coef))
    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=terms,
        metrics={
            "loss": ("cls_loss_sum", "cls_count"),
            "accuracy": ("cls_correct", "cls_count"),
            "lm_loss": ("lm_loss_sum", "lm_weight"),
        },
        flops_fn=flops_fn,
    )


def run_gpt_classifier(task: glue.TaskSpec, s: GptFinetuneSettings) -> dict:
    """Fine-tunes, evaluates and predicts as run_classifier.py does for BERT (with do_eval, the
    dev split scored after every save and the best checkpoint kept in output_dir/best, which
    predicts); returns the dev results (empty without do_eval). Writes eval_results.txt and the
    task's submission files."""
    import keras

    from training import distribute, finetune_tasks, optimization

    if task.kind == glue.REGRESSION:
        raise ValueError(
            f"GPT fine-tuning covers classification and multiple choice; {task.name} is {task.kind}"
        )
    config = gpt.GptConfig.from_json_file(s.config_file)
    if s.max_seq_length > config.n_ctx:
        raise ValueError(f"max_seq_length {s.max_seq_length} exceeds the config's n_ctx")
    tokenizer = load_bpe(s.vocab_file)
    if len(tokenizer.encoder) > config.n_vocab:
        raise input_error(
            s.vocab_file, f"at most n_vocab={config.n_vocab} tokens", f"{len(tokenizer.encoder)}"
        )
    base_config = config
    ids3 = delimiter_ids(tokenizer, config.n_vocab)
    if ids3[0] >= config.n_vocab:  # new tokens: the table grows by three rows
        config = config.replace(n_vocab=config.n_vocab + len(DELIMITERS))
        logging.info("%s has no delimiter tokens: %s added as ids %s", s.vocab_file,
                     ", ".join(DELIMITERS), ", ".join(map(str, ids3)))  # fmt: skip

    def load_initial(path):
        """--init_checkpoint (or a given checkpoint to predict with) into the model: a checkpoint
        without the new tokens' rows (told by its token table's rows) through
        init_with_new_tokens; this run's own checkpoints hold the grown table."""
        if config is not base_config and table_rows(path) == base_config.n_vocab:
            return init_with_new_tokens(model, path, base_config, task.num_outputs)
        return trainer.init_from_checkpoint(model, path)

    def load(split):
        data = glue.read_split(task, split, s.data_dir, skip_bad_rows=s.skip_bad_rows)
        if data is None:
            return None
        logging.info("%s: %d examples", data.source, len(data.examples))
        encoded = encode_split(tokenizer, ids3, task, data.examples, s.max_seq_length)
        glue.log_truncation(data.source, encoded, s.max_seq_length)
        return data, encoded.features

    train = load(task.train) if s.do_train else None
    dev = load(task.dev[0]) if s.do_eval else None
    tests = [t for t in (load(x) for x in task.test) if t] if s.do_predict else []
    strategy, workers, worker_index = distribute.setup(
        s.distribution_strategy,
        s.tpu or "",
        {k: getattr(s, k) for k in ("train_batch_size", "eval_batch_size", "predict_batch_size")},
    )
    steps = warmup = 0
    if train:
        steps, warmup = optimization.train_and_warmup_steps(
            len(train[0].examples), s.train_batch_size, s.num_train_epochs, s.warmup_proportion
        )
    keras.utils.set_random_seed(s.random_seed)
    with strategy.scope(), optimization.dtype_policy(s.precision):
        model = gpt.GptClassifier(config, task.num_outputs)
        model.build()
        optimizer = optimization.create_optimizer(s.learning_rate, max(steps, 1), warmup)
        optimizer = optimization.with_loss_scaling(optimizer, s.precision)
        optimizer.build(model.trainable_variables)  # before the first step (shared/NOTES.md)
    fit = trainer.Trainer(strategy, gpt_classification_task(model, s.lm_coef), optimizer)
    predictor = finetune_tasks.Predictor(
        strategy, model, input_keys=("input_ids", "input_mask"), output_key="logits"
    )

    def logits(features, batch_size, desc):
        """In input order, each worker running its share of every global batch."""
        n = len(features["label_ids"])
        batches = glue.eval_batches(features, batch_size, workers, worker_index)
        return predictor(batches, desc=desc)[:n]

    def evaluate() -> dict:
        features = dev[1]
        out = logits(features, s.eval_batch_size, f"evaluating {dev[0].split.name}")
        return finetune_tasks.output_metrics(out, features["label_ids"], task.metrics)

    best = finetune_tasks.BestCheckpoint(os.path.join(s.output_dir, "best"), model)
    # As run_classifier's BERT path: GLUE's task score picks the kept best, from step 0 on.
    selection = finetune_tasks.DevSelection(
        best, evaluate, "score", lambda: int(optimizer.iterations.numpy()), first_candidate=0
    )
    if s.do_train:
        if tf.train.latest_checkpoint(s.output_dir) is None:
            best.clear()  # a fresh run: a kept best from another run must not survive
        features = train[1]

        def dataset():  # this worker's shard, in per-worker batches
            data = tf.data.Dataset.from_tensor_slices(features)
            if workers > 1:
                data = data.shard(workers, worker_index)
            data = data.repeat().shuffle(len(train[0].examples), seed=s.random_seed)
            return data.batch(s.train_batch_size // workers, drop_remainder=True)

        def init_fn():
            loaded, part = load_initial(s.init_checkpoint)
            logging.info("initialised the %s from %s", part, loaded)

        run_config = {"gpt_config": config.to_dict(), "task": task.name, "lm_coef": s.lm_coef}
        # The curves: its loss, accuracy and LM loss, then the dev split's other GLUE metrics.
        curves = list(fit.task.metrics)
        curves += [m for m in task.metrics if m not in curves] if s.do_eval else []
        trainer.run_training(
            fit,
            dataset,
            trainer.TrainSettings(
                output_dir=s.output_dir,
                num_train_steps=steps,
                save_checkpoints_steps=s.save_checkpoints_steps,
                iterations_per_loop=s.iterations_per_loop,
                peak_flops=s.peak_tflops * 1e12,
                curves=tuple(curves),
                config_json=json.dumps(run_config, indent=2, sort_keys=True) + "\n",
                # fp16 adds the loss scale's state: a resume at another precision is refused
                run_settings_json=json.dumps({"precision": s.precision}),
            ),
            global_batch_size=s.train_batch_size,
            eval_fn=selection if s.do_eval else None,
            init_fn=init_fn if s.init_checkpoint else None,
        )
    else:
        # The kept best, else the latest checkpoint, else the given one.
        source = best.prefix or tf.train.latest_checkpoint(s.output_dir) or s.init_checkpoint
        if not source:
            raise ValueError(f"{s.output_dir} holds no checkpoint and init_checkpoint is empty")
        load_initial(source)
    results = {}
    if s.do_eval:
        step = int(optimizer.iterations.numpy())
        results = selection.results_at(step)
        trainer.write_eval_results(s.output_dir, results | {"global_step": step})
    if tests and s.do_train and best.prefix:
        trainer.restore_model_weights(model, best.prefix)
        logging.info("predicting with the best dev checkpoint %s", best.prefix)
    for data, features in tests:
        path = os.path.join(s.output_dir, data.split.submission)
        out = logits(features, s.predict_batch_size, f"predicting {data.split.name}")
        texts = glue.prediction_texts(task, out)
        glue.write_submission(path, [ex.index for ex in data.examples], texts)
        logging.info("wrote %d predictions to %s", len(texts), path)
    return results
