"""Fine-tunes BERT on SQuAD v1.1 / v2.0 span question answering, predicts and scores.

Example:
  python run_squad.py --vocab_file=default_run/vocab.txt \
    --bert_config_file=default_run/bert_config.json --init_checkpoint=default_run/pretrain \
    --do_train --train_file=train-v1.1.json --do_predict --predict_file=dev-v1.1.json \
    --do_eval --max_seq_length=384 --doc_stride=128 --max_query_length=64 \
    --train_batch_size=12 --learning_rate=3e-5 --num_train_epochs=2.0 --output_dir=out/squad

Flags keep the original google-research/bert names and meanings. --do_predict writes
predictions.json and nbest_predictions.json (and null_odds.json with --version_2_with_negative)
to --output_dir; --do_eval scores them against --predict_file's answers with the official
SQuAD definitions and writes eval_results.txt (for v2.0 also best_exact / best_f1 and the
thresholds to pass back as --null_score_diff_threshold); --do_eval alone scores the files
already in --output_dir. Without --do_train, prediction uses output_dir's latest checkpoint, else
--init_checkpoint. A rerun resumes training.

--bert_config_file may be a BERT, RoBERTa, ALBERT or ELECTRA config, or an XLNet one (its
released names): XLNet packs `question <sep> window <sep> <cls>` with its own vocabulary (its
spiece.model, or the BPE / WordPiece vocabulary it was pretrained with), reads "no answer" at
the <cls> and trains modeling/xlnet.XLNetBeamSpanQA (--xlnet_span_head=beam, the released
code's head: the 5 best starts, each with its 5 best ends, and an answer-class logit whose
lowest value over a question's windows is its null_odds.json score, compared with
--null_score_diff_threshold) or XLNetSpanQA (simple).

Memory does not grow with the number of windows: training windows stream to a TFRecord, and
prediction makes, scores and post-processes windows in chunks (training/squad_eval.py), writing
the output files question by question. Progress bars show questions done, rate and ETA.
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging

from modeling import flops
from training.precision import FINETUNE_PRECISION_HELP, PRECISION_NAMES

flags.DEFINE_string(
    "vocab_file",
    None,
    "WordPiece vocabulary the model was trained with, or a RoBERTa checkpoint's byte-level BPE "
    "folder (vocab.json + merges.txt: <s> question </s></s> window </s>, words with a leading "
    "space).",
)
flags.DEFINE_string(
    "bert_config_file",
    None,
    "JSON config of the model (original fields): a bert_config.json, albert_config.json or an "
    "ELECTRA config.",
)
flags.DEFINE_string(
    "init_checkpoint", None, "Cloze checkpoint (prefix or folder) to start from; empty = scratch."
)
flags.DEFINE_bool(
    "do_lower_case",
    True,
    "Lower-case the input (uncased vocabularies); a RoBERTa BPE folder only when given explicitly.",
)
flags.DEFINE_string("train_file", None, "SQuAD JSON for training, e.g. train-v1.1.json.")
flags.DEFINE_string("predict_file", None, "SQuAD JSON for predictions, e.g. dev-v1.1.json.")
flags.DEFINE_bool("do_train", False, "Whether to fine-tune on --train_file.")
flags.DEFINE_bool("do_predict", False, "Whether to predict on --predict_file.")
flags.DEFINE_bool("skip_corrupt_records", False, "Train past damaged records, as run_pretraining.")
flags.DEFINE_bool("do_eval", False, "Whether to score the predictions against --predict_file.")
flags.DEFINE_integer("max_seq_length", 384, "Tokens per window after WordPiece.")
flags.DEFINE_integer("doc_stride", 128, "Tokens between the starts of consecutive windows.")
flags.DEFINE_integer("max_query_length", 64, "Question tokens kept (longer are truncated).")
flags.DEFINE_integer("train_batch_size", 32, "Global batch size for training.")
flags.DEFINE_integer("predict_batch_size", 8, "Global batch size for prediction.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate for AdamW.")
flags.DEFINE_float("num_train_epochs", 3.0, "Passes over the training examples.")
flags.DEFINE_float("warmup_proportion", 0.1, "Fraction of the steps with linear warmup.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "How often to save a checkpoint.")
flags.DEFINE_integer("iterations_per_loop", 1000, "Steps per compiled loop between host logs.")
flags.DEFINE_float("peak_tflops", 0.0, flops.PEAK_TFLOPS_HELP, lower_bound=0.0)
flags.DEFINE_integer("n_best_size", 20, "Candidates kept per question in nbest_predictions.json.")
flags.DEFINE_integer("max_answer_length", 30, "Longest answer in WordPieces.")
flags.DEFINE_bool("version_2_with_negative", False, "SQuAD v2.0: questions may have no answer.")
flags.DEFINE_float(
    "null_score_diff_threshold", 0.0, "v2.0: predict no answer when null - best span > this."
)
flags.DEFINE_string("output_dir", None, "Where checkpoints, predictions and results go.")
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
    "for CPUs with TensorFlow's oneDNN kernels on (README). --precision=fp32 only.",
)
flags.DEFINE_bool(
    "remove_padding",
    False,
    "Run the encoder's layers (BERT, RoBERTa, ALBERT, ELECTRA) on each batch's real tokens "
    "alone, as run_pretraining's flag: the same logits at real tokens up to float rounding. "
    "Training needs --train_dynamic_padding (padding masked out of the span loss): the "
    "original's loss reads the padding positions' logits, which this changes. Not with TPUs.",
)
flags.DEFINE_enum(
    "precision",
    "fp32",
    list(PRECISION_NAMES),
    FINETUNE_PRECISION_HELP,
)
flags.DEFINE_enum(
    "xlnet_span_head",
    "beam",
    ["beam", "simple"],
    "An XLNet config's span head: beam, the released code's (an end conditioned on each of the "
    "5 best starts, an answer class for v2.0; transformers' XLNetForQuestionAnswering), or "
    "simple (a start and an end logit per position; XLNetForQuestionAnsweringSimple).",
)
flags.DEFINE_enum(
    "distribution_strategy",
    "one_device",
    ["one_device", "mirrored", "multi_worker_mirrored", "tpu"],
    "tf.distribute strategy. multi_worker_mirrored reads TF_CONFIG.",
)
flags.DEFINE_string("tpu", None, "TPU address for TPUClusterResolver (grpc://..., name or local).")
flags.DEFINE_bool(
    "dynamic_padding",
    True,
    "Cut each prediction batch to its longest window, rounded up to a multiple of 8 (the same "
    "logits at every real position). Training keeps whole windows unless "
    "--train_dynamic_padding. Off for TPUs (static shapes).",
)
flags.DEFINE_bool(
    "train_dynamic_padding",
    False,
    "Cut each training batch to its longest window too, rounded up to a multiple of 8. The span "
    "loss then leaves padding positions out of its softmaxes, so a cut batch trains as the whole "
    "one; the original's loss counts them (a slightly different loss, hence off by default). "
    "Recorded with the checkpoints. Not for TPUs (static shapes).",
)
flags.DEFINE_bool(
    "group_by_length",
    False,
    "With --train_dynamic_padding: sort each 50 training batches' windows by length and batch "
    "them again, so each batch is cut shorter (as run_classifier's flag); every window still "
    "comes once per pass, but a batch is no longer a random sample. Off by default, as the "
    "original. Recorded with the checkpoints.",
)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Data first, TensorFlow later: bad input is reported in a second, before output_dir exists.
    from tqdm import tqdm

    from data_prep import glue, squad
    from data_prep.errors import InputError

    if not (FLAGS.do_train or FLAGS.do_predict or FLAGS.do_eval):
        raise app.UsageError("at least one of --do_train, --do_predict or --do_eval must be set")
    needs_model = FLAGS.do_train or FLAGS.do_predict  # --do_eval alone only reads files
    required = ["vocab_file", "bert_config_file"] if needs_model else []
    for name in [*required, "output_dir"]:
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    if FLAGS.do_train and not FLAGS.train_file:
        raise app.UsageError("--do_train needs --train_file")
    if (FLAGS.do_predict or FLAGS.do_eval) and not FLAGS.predict_file:
        raise app.UsageError("--do_predict and --do_eval need --predict_file")
    s = FLAGS.max_seq_length
    v2 = FLAGS.version_2_with_negative
    try:
        from training import xlnet_finetuning

        packing, is_xlnet = glue.BERT_PACKING, False
        if needs_model:  # XLNet packs `question <sep> window <sep> <cls>` with its own vocabulary
            tokenizer, packing, is_xlnet = xlnet_finetuning.load_tokenizer(
                FLAGS.bert_config_file, FLAGS.vocab_file, FLAGS.do_lower_case,
                FLAGS["do_lower_case"].present,
            )  # fmt: skip
        if needs_model and not is_xlnet and FLAGS["xlnet_span_head"].present:
            raise app.UsageError("--xlnet_span_head: the span head of an XLNet config only")
        squad.check_lengths(s, FLAGS.max_query_length, FLAGS.doc_stride, packing)
        train_examples = predict_examples = predict_data = None
        if FLAGS.do_train:
            train_examples, stats = squad.read_squad_examples(FLAGS.train_file, True, v2)
            logging.info("%s: %s", FLAGS.train_file, stats.summary())
            if not train_examples:
                raise InputError(f"{FLAGS.train_file}: expected training questions, found none")
            train_examples = squad.shuffle_examples(train_examples, FLAGS.random_seed)
        if FLAGS.do_predict or FLAGS.do_eval:
            predict_data = squad.load_squad_json(FLAGS.predict_file)
            predict_examples, stats = squad.read_squad_examples(
                FLAGS.predict_file, False, v2, data=predict_data
            )
            logging.info("%s: %s", FLAGS.predict_file, stats.summary())
    except InputError as e:
        raise SystemExit(f"run_squad: {e}") from None
    if not needs_model:  # score the files a predicting run left
        _evaluate(FLAGS.output_dir, predict_data, None, v2, FLAGS.null_score_diff_threshold)
        return

    import keras
    import tensorflow as tf

    from data_prep import features
    from modeling import albert, bert, span_qa, xlnet
    from training import distribute, finetune_tasks, optimization, squad_eval, trainer

    try:
        if is_xlnet:
            config = xlnet_finetuning.load_config(FLAGS.bert_config_file, len(tokenizer.vocab))
        else:
            config = albert.load_encoder_config(FLAGS.bert_config_file, s, len(tokenizer.vocab))
    except InputError as e:
        raise SystemExit(f"run_squad: {e}") from None
    if mismatch := glue.packing_mismatch(packing, config, FLAGS.bert_config_file):
        logging.warning(mismatch)
    try:
        trim = glue.dynamic_padding_setting(
            FLAGS.dynamic_padding,
            FLAGS["dynamic_padding"].present,
            [(FLAGS.distribution_strategy == "tpu", "a TPU needs static shapes")],
        )
        train_trim = glue.dynamic_padding_setting(
            FLAGS.train_dynamic_padding,
            FLAGS["train_dynamic_padding"].present,
            [(FLAGS.distribution_strategy == "tpu", "a TPU needs static shapes")],
            flag="train_dynamic_padding",
        )
        groups = glue.length_group_batches(
            FLAGS.group_by_length, train_trim, padding_flag="train_dynamic_padding"
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    if FLAGS.remove_padding and FLAGS.do_train and not train_trim:
        raise app.UsageError(
            "--remove_padding: training on whole windows keeps the original's span loss, which "
            "reads the padding positions' logits; add --train_dynamic_padding (padding masked "
            "out of the loss)"
        )
    strategy, workers, worker_index = distribute.setup(
        FLAGS.distribution_strategy,
        FLAGS.tpu or "",
        {k: FLAGS[k].value for k in ("train_batch_size", "predict_batch_size")},
    )
    num_train_steps = num_warmup_steps = 0
    if FLAGS.do_train:
        # Counted in examples, not windows, as the original.
        num_train_steps, num_warmup_steps = optimization.train_and_warmup_steps(
            len(train_examples),
            FLAGS.train_batch_size,
            FLAGS.num_train_epochs,
            FLAGS.warmup_proportion,
        )
        logging.info("%d training steps, %d warmup", num_train_steps, num_warmup_steps)

    keras.utils.set_random_seed(FLAGS.random_seed)
    with strategy.scope(), optimization.dtype_policy(FLAGS.precision):
        beam = is_xlnet and FLAGS.xlnet_span_head == "beam"
        if is_xlnet:
            model = xlnet.XLNetBeamSpanQA(config) if beam else xlnet.XLNetSpanQA(config)
        else:
            model = span_qa.BertSpanQA(config)
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
            config.n_layer if is_xlnet else config.num_hidden_layers,
            FLAGS.layerwise_lr_decay,
            getattr(config, "num_hidden_groups", None),  # ALBERT's shared groups
        )
        optimizer = optimization.with_loss_scaling(optimizer, FLAGS.precision)
        # Built under the scope before the first step (shared/NOTES.md).
        optimizer.build(model.trainable_variables)
    output_dir = FLAGS.output_dir
    os.makedirs(output_dir, exist_ok=True)

    if FLAGS.do_train:
        train_file = os.path.join(output_dir, "train.tf_record")
        real = []  # each window's real tokens
        with tqdm(total=len(train_examples), desc="train features", unit=" questions") as bar:
            windows = squad.convert_examples_to_features(
                _counting(train_examples, bar),
                tokenizer,
                s,
                FLAGS.doc_stride,
                FLAGS.max_query_length,
                is_training=True,
                packing=packing,
            )
            n = squad.write_train_tfrecord(train_file, _noting_real_tokens(windows, real))
        logging.info(
            "%d training windows from %d questions; %.1f%% of their %d positions are real tokens%s",
            n,
            len(train_examples),
            100 * sum(real) / max(n * s, 1),
            s,
            "; each batch is cut to its longest window (--train_dynamic_padding)"
            if train_trim
            else "",
        )
        run_config = {"bert_config": config.to_dict(), "task": "squad", "max_seq_length": s}

        def init_fn():
            loaded, part = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
            logging.info("initialised the %s from %s", part, loaded)

        if beam:  # its logits outside the window are -1e30: padding never counts
            task = squad_eval.beam_span_qa_task(model)
        else:
            task = squad_eval.span_qa_task(model, mask_padding=train_trim)
        fit = trainer.Trainer(strategy, task, optimizer)
        trainer.run_training(
            fit,
            lambda: features.squad_dataset(
                [train_file],
                FLAGS.train_batch_size // workers,
                s,
                seed=FLAGS.random_seed,
                num_shards=workers,
                shard_index=worker_index,
                skip_corrupt_records=FLAGS.skip_corrupt_records,
                dynamic_padding=train_trim,
                length_group_batches=groups,
            ),
            trainer.TrainSettings(
                output_dir=output_dir,
                num_train_steps=num_train_steps,
                save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                iterations_per_loop=FLAGS.iterations_per_loop,
                peak_flops=FLAGS.peak_tflops * 1e12,
                curves=tuple(task.metrics),
                config_json=json.dumps(run_config, indent=2, sort_keys=True) + "\n",
                run_settings_json=json.dumps(
                    {
                        "skip_corrupt_records": FLAGS.skip_corrupt_records,
                        "train_dynamic_padding": train_trim,  # another loss, another pipeline
                        "group_by_length": FLAGS.group_by_length,  # another input pipeline
                        "precision": FLAGS.precision,  # fp16 adds the loss scale's state
                    }
                ),
                input_files=(train_file,),
            ),
            global_batch_size=FLAGS.train_batch_size,
            init_fn=init_fn if FLAGS.init_checkpoint else None,
        )
    elif FLAGS.do_predict:
        source = tf.train.latest_checkpoint(output_dir) or FLAGS.init_checkpoint
        if not source:
            raise app.UsageError(
                f"nothing to predict with: {output_dir} holds no checkpoint and "
                "--init_checkpoint is empty"
            )
        loaded, part = trainer.init_from_checkpoint(model, source)
        if part != "model":
            logging.warning("%s holds no span head: predictions are untrained", loaded)
        logging.info("predicting with %s", loaded)

    predicted = None  # (predictions, best non-null answers) of this run
    if FLAGS.do_predict:
        batch_size = FLAGS.predict_batch_size
        # The beam head gives one row per window (XLNetBeamSpanQA's `beam`), whatever its length.
        predictor = (
            finetune_tasks.Predictor(strategy, model, output_key="beam")
            if beam
            else finetune_tasks.Predictor(strategy, model, sequence_length=s if trim else None)
        )
        predict_fn = squad_eval.WindowPredictor(
            predictor,
            batch_size,
            workers,
            worker_index,
            dynamic_padding=trim,
        )
        # Windows are made, scored and turned into answers chunk by chunk (whole global
        # batches), so memory does not grow with the file.
        results = squad_eval.stream_predictions(
            predict_examples,
            squad.convert_examples_to_features(
                predict_examples,
                tokenizer,
                s,
                FLAGS.doc_stride,
                FLAGS.max_query_length,
                is_training=False,
                packing=packing,
            ),
            predict_fn,
            -(-squad_eval.PREDICT_CHUNK_WINDOWS // batch_size) * batch_size,
            FLAGS.n_best_size,
            FLAGS.max_answer_length,
            tokenizer.do_lower_case,
            v2,
            FLAGS.null_score_diff_threshold,
            tokenizer.detokenize,
            **(
                {"example_fn": squad_eval.beam_example_predictions, "unpack": model.unpack_beam}
                if beam
                else {}
            ),
        )
        progress = tqdm(results, total=len(predict_examples), desc="predicting", unit=" questions")
        predicted = squad_eval.write_predictions(
            progress, output_dir if worker_index == 0 else None
        )
        logging.info(
            "predicted %d questions (%d windows)%s",
            len(predicted[0]),
            predict_fn.windows,
            f"; wrote them to {output_dir}" if worker_index == 0 else " (worker 0 writes them)",
        )

    if FLAGS.do_eval:
        _evaluate(output_dir, predict_data, predicted, v2, FLAGS.null_score_diff_threshold)


def _counting(items, bar):
    for item in items:
        yield item
        bar.update(1)


def _noting_real_tokens(windows, real: list):
    """`windows` as they come, each one's count of real tokens appended to `real`."""
    for window in windows:
        real.append(sum(window.input_mask))
        yield window


def _evaluate(output_dir, dataset, predicted, v2, threshold) -> None:
    """Official scores of output_dir's predictions, logged and written to eval_results.txt.

    predicted: (predictions, best non-null answers) of this run, or None to read the files.
    For v2.0 the official script is given the best non-null answers and null_odds.json as its
    no-answer scores with na_prob_thresh = --null_score_diff_threshold: its exact / f1 are then
    those of predictions.json, and its threshold search sees every answer, not the ones the
    threshold already replaced by "". Without a prediction in this run, the best non-null
    answers are read back from nbest_predictions.json.
    """
    from training import squad_eval, trainer

    def load(name):
        path = os.path.join(output_dir, name)
        if not os.path.exists(path):
            raise SystemExit(f"run_squad: --do_eval needs {path}: run with --do_predict")
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    if not v2:
        answers = predicted[0] if predicted else load("predictions.json")
        results = squad_eval.evaluate_v1(dataset, answers)
    else:
        null_odds = load("null_odds.json")
        if predicted:
            answers = predicted[1]
        else:
            answers = squad_eval.best_non_null_answers(load("nbest_predictions.json"))
        results = squad_eval.evaluate_v2(dataset, answers, null_odds, threshold)
    trainer.write_eval_results(output_dir, results)


if __name__ == "__main__":
    app.run(main)
