"""Pre-trains BERT or ALBERT (masked LM + NSP, SOP or none) on create_pretraining_data records.

Example:
  python run_pretraining.py --bert_config_file=configs/bert_tiny.json \
    --input_file=default_run/data/train-*.tfrecord --output_dir=default_run/pretrain \
    --do_train --do_eval --train_batch_size=32 --max_seq_length=128 \
    --max_predictions_per_seq=20 --num_train_steps=1000 --num_warmup_steps=100 \
    --learning_rate=1e-4 --distribution_strategy=one_device

Flags keep the original google-research/bert names and meanings. A rerun with the same
--output_dir resumes from its latest checkpoint at that step.

The objectives, matched to how the records were made (a mismatch is refused, naming the file):
  BERT      the default: static masks, --sentence_objective=nsp.
  RoBERTa   records from create_pretraining_data --sentence_objective=none --full_sentences
            --masking=dynamic, then here --masking=dynamic --vocab_file=... (masked anew in
            tf.data each time a batch is drawn) and --sentence_objective=none; larger batches.
  ALBERT    an albert_config.json as --bert_config_file (told by its embedding_size key);
            records with --sentence_objective=sop --masking_scheme=ngram; SOP is the default here.
  SpanBERT  records with --masking_scheme=span, then --span_boundary_objective (and SpanBERT's
            --sentence_objective=none with single-segment records).
"""

from __future__ import annotations

from absl import app, flags, logging

flags.DEFINE_string(
    "bert_config_file",
    None,
    "JSON config of the model, original fields: a bert_config.json or an albert_config.json.",
)
flags.DEFINE_string("input_file", None, "Input TFRecord files: comma list and/or globs.")
flags.DEFINE_string(
    "eval_input_file", None, "TFRecords for --do_eval; defaults to --input_file as the original."
)
flags.DEFINE_string("output_dir", None, "Where checkpoints, logs and eval results are written.")
flags.DEFINE_string("init_checkpoint", None, "Initial checkpoint (a Cloze checkpoint or folder).")
flags.DEFINE_integer("max_seq_length", 128, "Sequence length the TFRecords were made with.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Masked positions per sequence in the data.")
flags.DEFINE_bool("do_train", False, "Whether to train.")
flags.DEFINE_bool("do_eval", False, "Whether to evaluate (at start, each checkpoint and end).")
flags.DEFINE_integer("train_batch_size", 32, "Global batch size for training.")
flags.DEFINE_integer("eval_batch_size", 8, "Global batch size for evaluation.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate for AdamW.")
flags.DEFINE_integer("num_train_steps", 100000, "Number of training steps.")
flags.DEFINE_integer("num_warmup_steps", 10000, "Linear warmup steps.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "How often to save a checkpoint.")
flags.DEFINE_integer(
    "keep_checkpoint_max",
    5,
    "How many recent checkpoints to keep (the original RunConfig's default is 5); raise it to "
    "keep every saved step, e.g. to fine-tune from several pretraining budgets of one run.",
)
flags.DEFINE_integer("iterations_per_loop", 100, "Steps per compiled loop between host logs.")
flags.DEFINE_integer("max_eval_steps", 100, "Maximum number of eval batches.")
flags.DEFINE_bool("use_xla", False, "Compile the train step with XLA (one_device only).")
flags.DEFINE_integer("random_seed", 12345, "Seed for initialisation, dropout and shuffling.")
flags.DEFINE_enum(
    "distribution_strategy",
    "one_device",
    ["one_device", "mirrored", "multi_worker_mirrored", "tpu"],
    "tf.distribute strategy. multi_worker_mirrored reads TF_CONFIG.",
)
flags.DEFINE_string("tpu", None, "TPU address for TPUClusterResolver (grpc://..., name or local).")
flags.DEFINE_enum(
    "sentence_objective",
    None,
    ["nsp", "sop", "none"],
    "Sentence-level loss: next sentence prediction (BERT), sentence-order prediction (ALBERT) or "
    "none (RoBERTa). Default: nsp for BERT configs, sop for ALBERT configs. Must match "
    "create_pretraining_data's --sentence_objective (nsp and sop records look alike).",
)
flags.DEFINE_enum(
    "masking",
    "static",
    ["static", "dynamic"],
    "static: the masks written in the TFRecords. dynamic: unmasked records (from "
    "create_pretraining_data --masking=dynamic) are masked in tf.data each time a batch is drawn "
    "(RoBERTa sec. 4.1).",
)
flags.DEFINE_float("masked_lm_prob", 0.15, "Fraction of tokens to predict (--masking=dynamic).")
flags.DEFINE_string(
    "vocab_file",
    None,
    "The vocabulary of the records: ids of [MASK], [CLS], [SEP] for dynamic masking.",
)
flags.DEFINE_bool(
    "span_boundary_objective",
    False,
    "Add SpanBERT's span boundary objective (records from --masking_scheme=span).",
)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import keras

    from data_prep import features, masking, pretraining_data, tokenization
    from modeling import albert, bert
    from training import distribute, optimization, tasks, trainer

    # The model family of a config (albert_config.json has embedding_size), with the sentence
    # objective its paper trained.
    pretrainers = {"bert": (bert.BertPretrainer, "nsp"), "albert": (albert.AlbertPretrainer, "sop")}

    if not (FLAGS.do_train or FLAGS.do_eval):
        raise app.UsageError("at least one of --do_train or --do_eval must be set")
    for name in ("bert_config_file", "input_file", "output_dir"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    s, p = FLAGS.max_seq_length, FLAGS.max_predictions_per_seq
    dynamic = FLAGS.masking == "dynamic"
    if dynamic and not FLAGS.vocab_file:
        raise app.UsageError(
            "--masking=dynamic needs --vocab_file (the ids of [MASK], [CLS] and [SEP])"
        )
    if dynamic and FLAGS.span_boundary_objective:
        raise app.UsageError(
            "--span_boundary_objective needs span boundaries written with the masks: use "
            "--masking=static with records from create_pretraining_data --masking_scheme=span"
        )
    if dynamic and not (0.0 <= FLAGS.masked_lm_prob <= 1.0 and 1 <= p <= s):
        raise app.UsageError(
            "--masking=dynamic needs 0 <= --masked_lm_prob <= 1 and "
            "1 <= --max_predictions_per_seq <= --max_seq_length"
        )
    vocab = tokenization.load_vocab(FLAGS.vocab_file) if dynamic else None
    config = albert.load_encoder_config(FLAGS.bert_config_file, s, len(vocab) if vocab else None)
    family = "albert" if isinstance(config, albert.AlbertConfig) else "bert"
    pretrainer_class, default_objective = pretrainers[family]
    objective = FLAGS.sentence_objective or default_objective
    train_files = features.expand_input_files(FLAGS.input_file)
    eval_files = features.expand_input_files(FLAGS.eval_input_file or FLAGS.input_file)
    features.check_pretraining_files(
        sorted(set(train_files + eval_files)),
        s,
        p,
        masking=FLAGS.masking,
        span_boundaries=FLAGS.span_boundary_objective,
        sentence_pairs=objective != "none",
    )
    dynamic_masking = None
    if dynamic:
        ids = pretraining_data.MaskingVocab.from_vocab(vocab, where=FLAGS.vocab_file)
        dynamic_masking = masking.DynamicMasking(
            masked_lm_prob=FLAGS.masked_lm_prob,
            max_predictions_per_seq=p,
            mask_id=ids.mask_id,
            vocab_size=len(vocab),
            special_ids=tuple(sorted({ids.cls_id, ids.sep_id, vocab.get("[PAD]", 0)})),
        )
    logging.info(
        "%s, sentence objective %s, %s masking%s",
        family,
        objective,
        FLAGS.masking,
        ", span boundary objective" if FLAGS.span_boundary_objective else "",
    )

    strategy, workers, worker_index = distribute.setup(
        FLAGS.distribution_strategy,
        FLAGS.tpu or "",
        {k: FLAGS[k].value for k in ("train_batch_size", "eval_batch_size")},
    )
    replicas = strategy.num_replicas_in_sync
    logging.info(
        "strategy %s with %d replica(s), %d worker(s)",
        FLAGS.distribution_strategy,
        replicas,
        workers,
    )

    keras.utils.set_random_seed(FLAGS.random_seed)
    with strategy.scope():
        model = pretrainer_class(config, objective, FLAGS.span_boundary_objective)
        model.build()
        optimizer = optimization.create_optimizer(
            FLAGS.learning_rate, FLAGS.num_train_steps, FLAGS.num_warmup_steps
        )
        # Built under the scope before the first step, else Keras 3 under MirroredStrategy fails
        # with "You must feed a value for placeholder tensor" (shared/NOTES.md).
        optimizer.build(model.trainable_variables)
    fit = trainer.Trainer(
        strategy, tasks.bert_pretraining_task(model), optimizer, use_xla=FLAGS.use_xla
    )

    def eval_dataset():
        return features.pretraining_dataset(
            eval_files,
            FLAGS.eval_batch_size // workers,
            s,
            p,
            is_training=False,
            seed=FLAGS.random_seed,
            num_shards=workers,
            shard_index=worker_index,
            dynamic_masking=dynamic_masking,
            span_boundaries=FLAGS.span_boundary_objective,
        )

    def eval_fn():
        return fit.evaluate(eval_dataset(), FLAGS.max_eval_steps)

    def init_fn():
        loaded, part = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
        logging.info(
            "initialised the %s from %s",
            "whole model" if part == "model" else "encoder (heads start fresh)",
            loaded,
        )

    output_dir = FLAGS.output_dir
    if FLAGS.do_train:
        trainer.run_training(
            fit,
            lambda: features.pretraining_dataset(
                train_files,
                FLAGS.train_batch_size // workers,
                s,
                p,
                is_training=True,
                seed=FLAGS.random_seed,
                num_shards=workers,
                shard_index=worker_index,
                dynamic_masking=dynamic_masking,
                span_boundaries=FLAGS.span_boundary_objective,
            ),
            trainer.TrainSettings(
                output_dir=output_dir,
                num_train_steps=FLAGS.num_train_steps,
                save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                iterations_per_loop=FLAGS.iterations_per_loop,
                max_checkpoints_to_keep=FLAGS.keep_checkpoint_max,
                config_json=config.to_json_string(),
            ),
            global_batch_size=FLAGS.train_batch_size,
            eval_fn=eval_fn if FLAGS.do_eval else None,
            init_fn=init_fn if FLAGS.init_checkpoint else None,
        )
        curves = trainer.plot_training_curves(
            output_dir, *[k for k in fit.task.metrics if k == "masked_lm_loss" or "acc" in k]
        )
        logging.info("training curves: %s", curves)
    if FLAGS.do_eval:
        if not FLAGS.do_train:
            source = FLAGS.init_checkpoint or output_dir
            trainer.restore_model_weights(model, source)
        results = eval_fn()
        results["global_step"] = int(optimizer.iterations.numpy())
        trainer.write_eval_results(output_dir, results)


if __name__ == "__main__":
    app.run(main)
