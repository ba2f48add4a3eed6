"""Pre-trains BERT (masked LM + next sentence prediction) on TFRecords from create_pretraining_data.

Example:
  python run_pretraining.py --bert_config_file=configs/bert_tiny.json \
    --input_file=default_run/data/train-*.tfrecord --output_dir=default_run/pretrain \
    --do_train --do_eval --train_batch_size=32 --max_seq_length=128 \
    --max_predictions_per_seq=20 --num_train_steps=1000 --num_warmup_steps=100 \
    --learning_rate=1e-4 --distribution_strategy=one_device

Flags keep the original google-research/bert names and meanings. A rerun with the same
--output_dir resumes from its latest checkpoint at that step.
"""

from __future__ import annotations

from absl import app, flags, logging

flags.DEFINE_string("bert_config_file", None, "JSON config of the BERT model (original fields).")
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
FLAGS = flags.FLAGS


def main(argv):
    del argv
    import keras

    from data_prep import features
    from modeling import bert
    from training import distribute, optimization, tasks, trainer

    if not (FLAGS.do_train or FLAGS.do_eval):
        raise app.UsageError("at least one of --do_train or --do_eval must be set")
    for name in ("bert_config_file", "input_file", "output_dir"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    config = bert.load_config(FLAGS.bert_config_file, FLAGS.max_seq_length)
    s, p = FLAGS.max_seq_length, FLAGS.max_predictions_per_seq
    train_files = features.expand_input_files(FLAGS.input_file)
    eval_files = features.expand_input_files(FLAGS.eval_input_file or FLAGS.input_file)
    features.check_pretraining_files(sorted(set(train_files + eval_files)), s, p)

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
        model = bert.BertPretrainer(config)
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
            num_shards=workers,
            shard_index=worker_index,
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
            ),
            trainer.TrainSettings(
                output_dir=output_dir,
                num_train_steps=FLAGS.num_train_steps,
                save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                iterations_per_loop=FLAGS.iterations_per_loop,
                config_json=config.to_json_string(),
            ),
            global_batch_size=FLAGS.train_batch_size,
            eval_fn=eval_fn if FLAGS.do_eval else None,
            init_fn=init_fn if FLAGS.init_checkpoint else None,
        )
        curves = trainer.plot_training_curves(
            output_dir, "masked_lm_loss", "masked_lm_accuracy", "next_sentence_accuracy"
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
