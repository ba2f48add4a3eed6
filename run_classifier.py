"""Fine-tunes BERT on GLUE-style classification, regression and multiple-choice tasks.

Example:
  python run_classifier.py --task_name=MRPC --data_dir=glue_data/MRPC \
    --vocab_file=default_run/vocab.txt --bert_config_file=default_run/bert_config.json \
    --init_checkpoint=default_run/pretrain --do_train --do_eval --do_predict \
    --max_seq_length=128 --train_batch_size=32 --learning_rate=2e-5 --num_train_epochs=3 \
    --warmup_proportion=0.1 --output_dir=out/mrpc

Tasks: CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI, AX, SWAG and `tsv` (a user's own
single or pair task with --label_list); data_prep/glue.py lists the files each reads. Flags keep
the original google-research/bert names. With --do_eval the dev set is scored after every
checkpoint and the best one by the task's GLUE score is kept in output_dir/best/; --do_predict
writes GLUE submission files (CoLA.tsv, MNLI-m.tsv, AX.tsv, ...) from the best checkpoint when
there is one. An empty --init_checkpoint trains from scratch. A rerun resumes training.
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import app, flags, logging

from modeling import flops
from training.precision import FINETUNE_PRECISION_HELP, PRECISION_NAMES

flags.DEFINE_string("task_name", None, "The task: cola, sst-2, mrpc, sts-b, qqp, mnli, ... tsv.")
flags.DEFINE_string("data_dir", None, "Folder with the task's files (train.tsv, dev.tsv, ...).")
flags.DEFINE_string(
    "vocab_file",
    None,
    "WordPiece vocabulary the model was trained with; for a RoBERTa checkpoint, the folder with "
    "its byte-level BPE (Hugging Face's vocab.json + merges.txt); for GPT, its BPE folder.",
)
flags.DEFINE_string(
    "bert_config_file",
    None,
    "JSON config of the model (original fields): a bert_config.json, albert_config.json, an "
    "ELECTRA, GPT or XLNet config, or an ELMo options.json (a frozen biLM's scalar mix, "
    "elmo.ElmoClassifier), told apart by their keys (albert.load_encoder_config, "
    "gpt.is_gpt_config, xlnet.is_xlnet_config, elmo.is_elmo_config).",
)
flags.DEFINE_string(
    "init_checkpoint",
    None,
    "Cloze checkpoint (prefix or folder) to start from; empty = scratch. Without --do_train, "
    "output_dir's best (or latest) checkpoint is used first.",
)
flags.DEFINE_bool(
    "do_lower_case",
    True,
    "Lower-case the input (uncased vocabularies). A RoBERTa BPE folder is cased: its text is "
    "lower-cased only when this flag is given explicitly.",
)
flags.DEFINE_bool("do_train", False, "Whether to fine-tune on the train split.")
flags.DEFINE_bool("do_eval", False, "Whether to score the dev split(s).")
flags.DEFINE_bool("do_predict", False, "Whether to write submission files for the test split(s).")
flags.DEFINE_bool("skip_corrupt_records", False, "Train past damaged records, as run_pretraining.")
flags.DEFINE_integer(
    "max_seq_length",
    128,
    "Tokens per sequence after WordPiece; longer ones "
    "are truncated (longer text first) and counted.",
)
flags.DEFINE_integer("train_batch_size", 32, "Global batch size for training.")
flags.DEFINE_integer("eval_batch_size", 8, "Global batch size for evaluation.")
flags.DEFINE_integer("predict_batch_size", 8, "Global batch size for prediction.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate for AdamW.")
flags.DEFINE_float("num_train_epochs", 3.0, "Passes over the training set.")
flags.DEFINE_float("warmup_proportion", 0.1, "Fraction of the steps with linear warmup.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint (and dev eval) every N steps.")
flags.DEFINE_integer("iterations_per_loop", 100, "Steps per compiled loop between host logs.")
flags.DEFINE_float(
    "peak_tflops",
    0.0,
    flops.PEAK_TFLOPS_HELP + " (ELMo's frozen biLM counts one forward pass.)",
    lower_bound=0.0,
)
flags.DEFINE_string("output_dir", None, "Where checkpoints, results and predictions go.")
flags.DEFINE_enum(
    "distribution_strategy",
    "one_device",
    ["one_device", "mirrored", "multi_worker_mirrored", "tpu"],
    "tf.distribute strategy. multi_worker_mirrored reads TF_CONFIG.",
)
flags.DEFINE_string("tpu", None, "TPU address for TPUClusterResolver (grpc://..., name or local).")
flags.DEFINE_string(
    "tfds_name",
    None,
    "Read the task through tensorflow-datasets (e.g. glue/sst2); --data_dir is then TFDS's "
    "data_dir (optional).",
)
flags.DEFINE_float(
    "layerwise_lr_decay", 1.0, "Learning-rate factor per layer below the head (1.0 = off)."
)
flags.DEFINE_integer("random_seed", 12345, "Seed for initialisation, dropout and shuffling.")
flags.DEFINE_integer(
    "encoder_branches",
    1,
    "Run the encoder's layers (BERT, RoBERTa, ALBERT, ELECTRA) as this many independent row "
    "slices of each batch, as run_pretraining's flag: the same outputs and dropout masks up to "
    "float rounding. On 2 CPU cores 2 made an L4/H256 classifier's fine-tuning step at batch 32 "
    "1.05x faster and the encoder's inference 1.06-1.16x; BERT-base's not (README).",
)
flags.DEFINE_bool(
    "xla_weight_gradients",
    False,
    "Take every dense layer's kernel gradient as an XLA-compiled dot, as run_pretraining's flag: "
    "for CPUs with TensorFlow's oneDNN kernels on; there (2 AVX2 cores, TF_ENABLE_ONEDNN_OPTS=1, "
    "batch 32) an L4/H256 classifier trained 1.03-1.22x faster, BERT-base's 0.91-1.06x (README). "
    "--precision=fp32 only.",
)
flags.DEFINE_bool(
    "remove_padding",
    False,
    "Run the encoder's layers (BERT, RoBERTa, ALBERT, ELECTRA) on each batch's real tokens "
    "alone, as run_pretraining's flag: the same logits up to float rounding. With "
    "--dynamic_padding on 2 CPU cores, epochs of single sentences and of sentence pairs trained "
    "1.5-2.2x faster at L4/H256 and BERT-base (README). Not with TPUs (static shapes).",
)
flags.DEFINE_enum(
    "precision",
    "fp32",
    list(PRECISION_NAMES),
    FINETUNE_PRECISION_HELP,
)
flags.DEFINE_bool(
    "dynamic_padding",
    True,
    "Cut each batch to its longest example, rounded up to a multiple of 8, instead of padding to "
    "--max_seq_length: the same logits for less work on short texts. BERT, RoBERTa, ALBERT and "
    "ELECTRA; off for XLNet (it pads on the left), ELMo and TPUs (static shapes).",
)
flags.DEFINE_bool(
    "group_by_length",
    False,
    "With --dynamic_padding: sort each 50 training batches' examples (as they leave the shuffle) "
    "by length and batch them again, so batches of similar lengths are cut shorter; the batches "
    "are then shuffled. Every example still comes once per pass, but a batch is no longer a "
    "random sample (Hugging Face's group_by_length). Off by default, as the original.",
)
flags.DEFINE_list("label_list", [], "Labels of --task_name=tsv, in id order (e.g. neg,pos).")
flags.DEFINE_bool(
    "skip_bad_rows", False, "Skip and count bad train/dev rows instead of stopping on the first."
)
flags.DEFINE_enum(
    "pooling", "cls", ["cls", "mean"], "Sentence vector: the [CLS] pooler or a mean over tokens."
)
flags.DEFINE_float(
    "lm_coef", 0.5, "GPT configs: weight of the auxiliary LM loss (Radford et al. 2018, sec. 3.2)."
)
FLAGS = flags.FLAGS


def config_family(path) -> str:
    """The family of a model config file: "gpt", "xlnet", "elmo" or "bert" (BERT, ALBERT,
    ELECTRA)."""
    from data_prep.errors import InputError
    from modeling import bert, elmo, gpt, xlnet

    try:
        values = bert.read_config_json(path, "a model config JSON file")
    except InputError as e:
        raise SystemExit(f"run_classifier: {e}") from None
    if elmo.is_elmo_config(values):
        return "elmo"
    return (
        "gpt" if gpt.is_gpt_config(values) else "xlnet" if xlnet.is_xlnet_config(values) else "bert"
    )


def run_gpt(task):
    """GPT-1 fine-tuning (training/gpt_finetuning.py): --vocab_file is the BPE folder."""
    from data_prep.errors import InputError
    from training import gpt_finetuning

    if FLAGS.encoder_branches != 1:
        raise app.UsageError(
            f"--encoder_branches={FLAGS.encoder_branches}: a GPT config has no encoder that runs "
            "in branches (BERT, ALBERT, ELECTRA)"
        )
    if FLAGS.remove_padding:
        raise app.UsageError(
            "--remove_padding: a GPT config has no encoder that runs on its real tokens alone "
            "(BERT, ALBERT, ELECTRA)"
        )
    # The BERT path's flags this path has nothing to do with: refused rather than ignored.
    unread = {
        "tfds_name": FLAGS.tfds_name,  # read_split's files only
        "pooling": FLAGS["pooling"].present,  # GPT-1 classifies its extract token
        "dynamic_padding": FLAGS["dynamic_padding"].present and FLAGS.dynamic_padding,
        "group_by_length": FLAGS.group_by_length,
        "layerwise_lr_decay": FLAGS.layerwise_lr_decay != 1.0,
        "xla_weight_gradients": FLAGS.xla_weight_gradients,
        "skip_corrupt_records": FLAGS.skip_corrupt_records,  # no TFRecords: --skip_bad_rows
    }
    if given := [f"--{name}" for name, used in unread.items() if used]:
        raise app.UsageError(
            f"{', '.join(given)}: not for a GPT config (GPT-1 fine-tuning reads --data_dir's "
            "files, pads whole sequences and trains every layer at one learning rate)"
        )
    names = [f.name for f in dataclasses.fields(gpt_finetuning.GptFinetuneSettings)]
    values = {n: FLAGS[n].value for n in names if n in FLAGS and n != "config_file"}
    settings = gpt_finetuning.GptFinetuneSettings(config_file=FLAGS.bert_config_file, **values)
    try:
        gpt_finetuning.run_gpt_classifier(task, settings)
    except (InputError, ValueError) as e:
        raise SystemExit(f"run_classifier: {e}") from None


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Data first, TensorFlow later: bad input is reported in a second, before output_dir exists.
    from data_prep import glue
    from data_prep.errors import InputError

    if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
        raise app.UsageError("at least one of --do_train, --do_eval or --do_predict must be set")
    for name in ("task_name", "bert_config_file", "output_dir"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    if not (FLAGS.data_dir or FLAGS.tfds_name):
        raise app.UsageError("--data_dir (or --tfds_name) is required")
    try:
        task = glue.get_task(FLAGS.task_name, FLAGS.label_list)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    if task.train is None and (FLAGS.do_train or FLAGS.do_eval):
        raise app.UsageError(
            f"{task.name} has test data only: use --do_predict with a model "
            "fine-tuned on MNLI as --init_checkpoint"
        )
    family = config_family(FLAGS.bert_config_file)
    # A published ELMo reads the data's own words (tokenization.WordTokenizer, made once the
    # splits are read); every other model its --vocab_file.
    try:
        from modeling import elmo

        word_elmo = family == "elmo" and elmo.config_reads_words(FLAGS.bert_config_file)
    except InputError as e:
        raise SystemExit(f"run_classifier: {e}") from None
    if not (word_elmo or FLAGS.vocab_file):
        raise app.UsageError("--vocab_file is required (only an ELMo reading words has none)")
    if family == "gpt":
        return run_gpt(task)
    # XLNet (training/xlnet_finetuning.py): its tokenizer and packing, then this BERT path.
    is_xlnet = family == "xlnet"
    if is_xlnet and FLAGS.pooling != "cls":
        raise app.UsageError("--pooling: XLNet summarises its last (<cls>) token; drop the flag")
    # ELMo (an options.json): its frozen biLM's scalar mix, mean-pooled (elmo.ElmoClassifier).
    is_elmo = family == "elmo"
    if is_elmo and (task.kind == glue.MULTIPLE_CHOICE or FLAGS.layerwise_lr_decay != 1.0):
        raise app.UsageError("an ELMo config classifies single texts or pairs with a frozen "
                             "biLM: no multiple choice, no --layerwise_lr_decay")  # fmt: skip
    if is_elmo and FLAGS["pooling"].present:
        raise app.UsageError("--pooling: ELMo's classifier averages its scalar mix over tokens")
    # Dynamic padding needs right padding and shapes that may change from batch to batch.
    try:
        trim = glue.dynamic_padding_setting(
            FLAGS.dynamic_padding,
            FLAGS["dynamic_padding"].present,
            [
                (is_xlnet, "XLNet pads on the left"),
                (is_elmo, "ELMo's classifier is not covered"),
                (FLAGS.distribution_strategy == "tpu", "a TPU needs static shapes"),
            ],
        )
        groups = glue.length_group_batches(FLAGS.group_by_length, trim)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    s = FLAGS.max_seq_length
    try:
        if word_elmo:  # [CLS] a [SEP] b [SEP], [CLS] and [SEP] spelled <S> and </S>
            tokenizer, packing = None, glue.BERT_PACKING
        elif is_xlnet:  # its own vocabulary: its BPE folder or SentencePiece model
            from training import xlnet_finetuning

            tokenizer = xlnet_finetuning.XLNetTextEncoder(
                FLAGS.vocab_file, FLAGS.do_lower_case if FLAGS["do_lower_case"].present else None
            )
            packing = glue.BERT_PACKING  # its length check; XLNet packs its own way
        else:  # WordPiece ([CLS] a [SEP] b [SEP]), or a RoBERTa BPE folder (<s> a </s></s> b </s>)
            given = FLAGS["do_lower_case"].present
            tokenizer, packing = glue.load_tokenizer(FLAGS.vocab_file, FLAGS.do_lower_case, given)
    except InputError as e:
        raise SystemExit(f"run_classifier: {e}") from None
    if is_elmo and (why := glue.elmo_packing_error(packing, FLAGS.vocab_file)):
        raise app.UsageError(why)
    if s < packing.pair_specials:
        raise app.UsageError(f"--max_seq_length={s} leaves no room for {packing.pair_form}")

    def read(split):
        try:
            return glue.read_split(
                task,
                split,
                FLAGS.data_dir,
                FLAGS.tfds_name,
                FLAGS.data_dir if FLAGS.tfds_name else None,
                FLAGS.skip_bad_rows,
            )
        except (InputError, ValueError) as e:
            raise SystemExit(f"run_classifier: {e}") from None

    def load(data):
        if data is None:
            return None
        if is_xlnet:
            encoded = tokenizer.encode_examples(data.examples, task, s)
        else:
            encoded = glue.encode_examples(data.examples, task, tokenizer, s, packing)
        if is_elmo and not word_elmo:
            # The biLM was pretrained on WordPiece blocks that [SEP] separates and never saw
            # [CLS] (as run_ner's ELMo tagger): [CLS] is read as [SEP].
            cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
            ids = encoded.features["input_ids"]
            ids[ids == cls_id] = sep_id
        glue.log_truncation(data.source, encoded, s)
        if not is_xlnet:  # (XLNet's input_mask marks padding)
            mask = encoded.features["input_mask"]
            glue.log_real_tokens(data.source, mask, s, "example" if trim else None)
        logging.info("%s: %d examples", data.source, len(data.examples))
        return data, encoded

    train = read(task.train) if FLAGS.do_train else None
    devs = [read(split) for split in task.dev] if FLAGS.do_eval else []
    tests = [t for t in (read(split) for split in task.test) if t] if FLAGS.do_predict else []
    if word_elmo:  # every word of every split read, cased (BasicTokenizer's split)
        from data_prep import tokenization

        texts = (
            text
            for data in (train, *devs, *tests)
            for x in (data.examples if data else ())
            for text in (x.text_a, x.text_b)
            if text is not None
        )
        tokenizer = tokenization.WordTokenizer.from_texts(texts)
        distinct = len(tokenizer.vocab) - len(tokenization.RESERVED_TOKENS)
        logging.info("an ELMo that reads words: %d distinct words in the data", distinct)
    train, devs, tests = load(train), [load(x) for x in devs], [load(x) for x in tests]

    import keras
    import tensorflow as tf

    from data_prep import features
    from modeling import albert, bert, elmo, finetuning, tagging, xlnet
    from training import distribute, finetune_tasks, optimization, trainer

    if is_xlnet:
        try:
            config = xlnet_finetuning.load_config(FLAGS.bert_config_file, tokenizer.vocab_size)
        except InputError as e:
            raise SystemExit(f"run_classifier: {e}") from None
    elif is_elmo:
        try:
            config = tagging.load_config(FLAGS.bert_config_file, s, len(tokenizer.vocab))
        except InputError as e:
            raise SystemExit(f"run_classifier: {e}") from None
    else:
        config = albert.load_encoder_config(FLAGS.bert_config_file, s, len(tokenizer.vocab))
        if mismatch := glue.packing_mismatch(packing, config, FLAGS.bert_config_file):
            logging.warning(mismatch)
    # The layer count --layerwise_lr_decay reads (ELMo's is refused above).
    num_layers = (
        config.n_layer
        if is_xlnet
        else (tagging.encoder_layers(config) if is_elmo else config.num_hidden_layers)
    )
    strategy, workers, worker_index = distribute.setup(
        FLAGS.distribution_strategy,
        FLAGS.tpu or "",
        {k: FLAGS[k].value for k in ("train_batch_size", "eval_batch_size", "predict_batch_size")},
    )
    num_train_steps = num_warmup_steps = 0
    if train:
        num_train_steps, num_warmup_steps = optimization.train_and_warmup_steps(
            len(train[0].examples),
            FLAGS.train_batch_size,
            FLAGS.num_train_epochs,
            FLAGS.warmup_proportion,
        )
        logging.info("%d training steps, %d warmup", num_train_steps, num_warmup_steps)

    keras.utils.set_random_seed(FLAGS.random_seed)
    with strategy.scope(), optimization.dtype_policy(FLAGS.precision):
        if is_xlnet:  # the summary is the last token's content stream; no --pooling
            model = xlnet.XLNetClassifier(config, task.num_outputs)
        elif is_elmo:
            model = elmo.ElmoClassifier(config, task.num_outputs)
            if word_elmo:  # the ids index this run's words
                model.encoder.read_words(tokenizer.spelled_tokens())
        elif task.kind == glue.MULTIPLE_CHOICE:
            model = finetuning.BertMultipleChoice(config, pooling=FLAGS.pooling)
        else:
            model = finetuning.BertClassifier(config, task.num_outputs, pooling=FLAGS.pooling)
        model.build()
        try:  # a TPUStrategy's scope refuses --remove_padding
            bert.set_execution_options(
                model, FLAGS.encoder_branches, FLAGS.remove_padding, FLAGS.xla_weight_gradients
            )
        except ValueError as e:
            raise app.UsageError(str(e)) from None
        optimizer = finetune_tasks.create_finetuning_optimizer(
            FLAGS.learning_rate,
            max(num_train_steps, 1),
            num_warmup_steps,
            num_layers,
            FLAGS.layerwise_lr_decay,
            getattr(config, "num_hidden_groups", None),  # ALBERT's shared groups
        )
        optimizer = optimization.with_loss_scaling(optimizer, FLAGS.precision)
        # Built under the scope before the first step (shared/NOTES.md).
        optimizer.build(model.trainable_variables)
    if task.kind == glue.REGRESSION:
        fit_task = finetune_tasks.regression_task(model)
    else:
        fit_task = finetune_tasks.classification_task(model)
    fit = trainer.Trainer(strategy, fit_task, optimizer)
    predictor = finetune_tasks.Predictor(strategy, model)
    output_dir = FLAGS.output_dir
    best = finetune_tasks.BestCheckpoint(os.path.join(output_dir, "best"), model)

    def outputs(encoded, batch_size, desc):
        n = len(encoded.features["label_ids"])
        batches = glue.eval_batches(encoded.features, batch_size, workers, worker_index)
        if trim:
            batches = batches.map(features.trim_to_longest)
        return predictor(batches, desc=desc)[:n]

    def dev_metrics(data, encoded) -> dict:
        return finetune_tasks.output_metrics(
            outputs(encoded, FLAGS.eval_batch_size, f"evaluating {data.split.name}"),
            glue.label_values(task, data.examples),
            task.metrics,
            regression=task.kind == glue.REGRESSION,
        )

    # The dev splits' metric names: the first split's plain, the others' with the split's name
    # (mnli: accuracy is matched, mismatched_accuracy).
    prefixes = ["" if i == 0 else f"{data.split.name}_" for i, (data, _) in enumerate(devs)]

    def evaluate() -> dict:
        """GLUE metrics of every dev split, named by `prefixes`."""
        results = {}
        for prefix, (data, encoded) in zip(prefixes, devs):
            results |= {prefix + k: v for k, v in dev_metrics(data, encoded).items()}
        return results

    # run_training's eval_fn: GLUE's task score picks the kept best, from step 0 on.
    selection = finetune_tasks.DevSelection(
        best, evaluate, "score", lambda: int(optimizer.iterations.numpy()), first_candidate=0
    )

    def init_from(path):
        try:
            loaded, part = trainer.init_from_checkpoint(model, path)
        except ValueError as e:  # TF's shape messages name the variable, not the checkpoint
            raise SystemExit(
                f"run_classifier: cannot initialise the model from {path}: {e}"
            ) from None
        logging.info("initialised the %s from %s", part, loaded)
        return loaded, part

    if FLAGS.do_train:
        if tf.train.latest_checkpoint(output_dir) is None:
            # A fresh run loads --init_checkpoint before it writes anything, so that a bad
            # checkpoint leaves output_dir as it was (no train.tf_record, no model_config.json
            # that would then refuse a corrected config).
            if FLAGS.init_checkpoint:
                init_from(FLAGS.init_checkpoint)
            best.clear()  # a fresh run: a kept best from another run must not survive
        train_file = os.path.join(output_dir, "train.tf_record")
        glue.write_tfrecord(train_file, train[1].features, task.kind == glue.REGRESSION)
        run_config = {
            "bert_config": config.to_dict(),
            "task": task.name,
            "labels": list(task.labels),
            "max_seq_length": s,
            "pooling": FLAGS.pooling,
        }
        # The curves: the loss and accuracy, trained and held out, then the dev splits' other
        # GLUE metrics.
        curves = ["loss"] if task.kind == glue.REGRESSION else ["loss", "accuracy"]
        curves += [p + m for p in prefixes for m in task.metrics if p + m not in curves]
        trainer.run_training(
            fit,
            lambda: features.classifier_dataset(
                [train_file],
                FLAGS.train_batch_size // workers,
                s,
                task.num_choices,
                task.kind == glue.REGRESSION,
                seed=FLAGS.random_seed,
                num_shards=workers,
                shard_index=worker_index,
                skip_corrupt_records=FLAGS.skip_corrupt_records,
                dynamic_padding=trim,
                length_group_batches=groups,
            ),
            trainer.TrainSettings(
                output_dir=output_dir,
                num_train_steps=num_train_steps,
                save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                iterations_per_loop=FLAGS.iterations_per_loop,
                peak_flops=FLAGS.peak_tflops * 1e12,
                curves=tuple(curves),
                config_json=json.dumps(run_config, indent=2, sort_keys=True) + "\n",
                run_settings_json=json.dumps(
                    {
                        "skip_corrupt_records": FLAGS.skip_corrupt_records,
                        "group_by_length": FLAGS.group_by_length,  # another input pipeline
                        "precision": FLAGS.precision,  # fp16 adds the loss scale's state
                    }
                ),
                input_files=(train_file,),
            ),
            global_batch_size=FLAGS.train_batch_size,
            eval_fn=selection if FLAGS.do_eval else None,
        )
    else:
        # Evaluate or predict with the kept best, else the latest checkpoint, else the given one.
        source = best.prefix or tf.train.latest_checkpoint(output_dir) or FLAGS.init_checkpoint
        if not source:
            raise app.UsageError(
                f"nothing to evaluate: {output_dir} holds no checkpoint and --init_checkpoint "
                "is empty"
            )
        loaded, part = init_from(source)
        if part != "model":
            logging.warning("%s holds no %s head: its outputs are untrained", loaded, task.name)
        logging.info("evaluating %s", loaded)

    if FLAGS.do_eval:
        step = int(optimizer.iterations.numpy())
        results = selection.results_at(step)
        results["global_step"] = step
        trainer.write_eval_results(output_dir, results)
        if best.info:
            logging.info(
                "best dev score %.4f at step %d (%s)",
                best.info["score"],
                best.info["step"],
                best.directory,
            )

    if FLAGS.do_predict:
        if FLAGS.do_train and best.prefix:
            trainer.restore_model_weights(model, best.prefix)
            logging.info("predicting with the best dev checkpoint %s", best.prefix)
        for data, encoded in tests:
            scores = outputs(encoded, FLAGS.predict_batch_size, f"predicting {data.split.name}")
            texts = glue.prediction_texts(task, scores)
            path = os.path.join(output_dir, data.split.submission)
            glue.write_submission(path, [ex.index for ex in data.examples], texts)
            logging.info("wrote %d predictions to %s", len(texts), path)


if __name__ == "__main__":
    app.run(main)
