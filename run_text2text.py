"""Fine-tunes a T5 or BART checkpoint where the target is text: classification as label words, or a
summarisation-style `source<TAB>target` task scored with ROUGE-L; greedy or beam decoding.

Example (a T5 pretrained by run_pretraining.py on create_seq2seq_data.py records):
  python run_text2text.py --task_name=sst-2 --data_dir=default_run/rt_polarity/sst2 \
    --bert_config_file=configs/t5_tiny.json --encoder_file=bpe/encoder.json \
    --merges_file=bpe/vocab.bpe --init_checkpoint=t5_pretrain --do_train --do_eval \
    --do_predict --max_seq_length=64 --max_target_length=8 --train_batch_size=16 \
    --learning_rate=1e-3 --num_train_epochs=3 --num_beams=1 --output_dir=out/sst2_t5
A BART config (configs/bart_tiny.json; records made with --num_sentinels=0) selects BART.

Tasks: a GLUE-style classification task of data_prep/glue.py (sst-2, cola, mrpc, qqp, mnli, qnli,
rte, wnli; its files from --data_dir), scored by the task's GLUE metrics over the decoded label
words (CoLA's MCC, MRPC's F1 and accuracy, their mean `score`; a text that is no label word is
wrong under each; data_prep/text2text.py lists the words, --label_words overrides), or
`tsv_seq2seq` (train.tsv, dev.tsv, test.tsv of source<TAB>target lines) scored by ROUGE-L F and
exact match, or `squad` (train-v1.1.json, dev-v1.1.json: "question: q context: c" -> the answer,
as T5) scored by the official SQuAD v1.1 exact match and F1 against every gold answer.
--do_eval writes eval_results.txt and dev_predictions.tsv (index, prediction, target); with
--do_train it also decodes the dev split after every checkpoint save and keeps the best model by
`score`, ROUGE-L or SQuAD's F1 in output_dir/best/ (its score and step go into
eval_results.txt too).
--do_predict writes test_predictions.tsv (index, prediction), after training with the kept best.
The BPE files and --num_sentinels must be those the checkpoint was pretrained with (the
config's special ids are checked). A released T5 (convert_checkpoint.py --from=hf of t5-small, a
T5 v1.1, FLAN-T5) brings its SentencePiece model instead: --vocab_file=its spiece.model or the
converted folder (the library's pieces as Hugging Face's T5Tokenizer makes them, </s> after
each text, --num_sentinels <extra_id_i> after the pieces: T5Tokenizer's extra_ids, 100).
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging

from modeling import flops
from training.precision import FINETUNE_PRECISION_HELP, PRECISION_NAMES

flags.DEFINE_string("task_name", None, "sst-2, cola, mrpc, qqp, mnli, ..., tsv_seq2seq or squad.")
flags.DEFINE_string("data_dir", None, "Folder with the task's train / dev / test files.")
flags.DEFINE_string(
    "bert_config_file", None, "T5 or BART config JSON (its published names pick the family)."
)
flags.DEFINE_string("encoder_file", None, "GPT-2 style encoder.json of the pretraining data.")
flags.DEFINE_string("merges_file", None, "GPT-2 style vocab.bpe of the pretraining data.")
flags.DEFINE_string(
    "vocab_file",
    None,
    "Instead of the BPE files, a released T5's SentencePiece model (spiece.model, or a folder "
    "holding it, e.g. convert_checkpoint.py's output).",
)
flags.DEFINE_integer("num_sentinels", 100, "Sentinels the pretraining data appended.")
flags.DEFINE_string("init_checkpoint", None, "Checkpoint (prefix or folder); empty = scratch.")
flags.DEFINE_string("output_dir", None, "Where checkpoints, predictions and results go.")
flags.DEFINE_list("label_words", [], "Classification: one word per label, in label order.")
flags.DEFINE_bool("do_train", False, "Whether to fine-tune on the train split.")
flags.DEFINE_bool("do_eval", False, "Whether to decode and score the dev split.")
flags.DEFINE_bool("do_predict", False, "Whether to decode the test split.")
flags.DEFINE_integer("max_seq_length", 128, "Source ids, </s> included (longer is cut).")
flags.DEFINE_integer("max_target_length", 16, "Target ids, </s> included; the decoding limit.")
flags.DEFINE_integer("train_batch_size", 32, "Batch size for training.")
flags.DEFINE_integer("eval_batch_size", 8, "Batch size for decoding.")
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate for AdamW.")
flags.DEFINE_float("num_train_epochs", 3.0, "Epochs over the train split.")
flags.DEFINE_float("warmup_proportion", 0.1, "Fraction of steps with a linear warmup.")
flags.DEFINE_integer("num_beams", 1, "1: greedy decoding; more: beam search of that width.")
flags.DEFINE_float("length_penalty", 0.6, "Beam search: GNMT length penalty alpha.")
flags.DEFINE_integer(
    "save_checkpoints_steps", 1000, "How often to save a checkpoint (and decode dev, --do_eval)."
)
flags.DEFINE_integer("iterations_per_loop", 100, "Steps per compiled loop between host logs.")
flags.DEFINE_float("peak_tflops", 0.0, flops.PEAK_TFLOPS_HELP, lower_bound=0.0)
flags.DEFINE_enum("precision", "fp32", list(PRECISION_NAMES), FINETUNE_PRECISION_HELP)
flags.DEFINE_integer("random_seed", 12345, "Seed for initialisation, dropout and shuffling.")
FLAGS = flags.FLAGS


def decode_texts(model, vocab, features: dict, batch_size: int, settings: dict) -> list[str]:
    """The decoded text of every row of `features` (greedy or beam search, with the decoder's
    key / value cache), with a progress bar."""
    from tqdm import tqdm

    from modeling import t5

    texts = []
    n = len(features["input_ids"])
    bar = tqdm(total=n, desc="decoding", unit=" examples", mininterval=2.0)
    for start in range(0, n, batch_size):
        ids = features["input_ids"][start : start + batch_size]
        mask = features["input_mask"][start : start + batch_size]
        if settings["num_beams"] > 1:
            out = t5.beam_search(
                model, ids, mask, settings["max_length"], settings["num_beams"], settings["alpha"]
            )
        else:
            out = t5.greedy_decode(model, ids, mask, settings["max_length"])
        texts.extend(vocab.decode(row).strip() for row in out)
        bar.update(len(out))
    bar.close()
    return texts


def write_predictions(path: str, pairs, predictions, with_targets: bool) -> None:
    """index<TAB>prediction[<TAB>target] lines under a header; tabs and newlines in texts become
    spaces so each example stays one line."""

    def clean(text):
        return " ".join((text or "").split())

    header = "index\tprediction" + ("\ttarget" if with_targets else "")
    rows = [
        "\t".join([p.index, clean(pred)] + ([clean(p.target)] if with_targets else []))
        for p, pred in zip(pairs, predictions)
    ]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join([header, *rows]) + "\n")
    os.replace(path + ".tmp", path)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from data_prep import glue, seq2seq_data, spiece, text2text
    from data_prep.errors import InputError, input_error

    if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
        raise app.UsageError("at least one of --do_train, --do_eval or --do_predict must be set")
    required = ("task_name", "data_dir", "bert_config_file", "output_dir")
    if not FLAGS.vocab_file:
        required += ("encoder_file", "merges_file")
    elif FLAGS.encoder_file or FLAGS.merges_file:
        raise app.UsageError("--vocab_file or --encoder_file and --merges_file, not both")
    for name in required:
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    if FLAGS.num_beams < 1 or FLAGS.max_seq_length < 2 or FLAGS.max_target_length < 2:
        raise app.UsageError("--num_beams >= 1, --max_seq_length and --max_target_length >= 2")
    is_seq2seq = FLAGS.task_name.lower().replace("-", "_") == text2text.TSV_SEQ2SEQ
    is_squad = FLAGS.task_name.lower() == text2text.SQUAD
    if (is_seq2seq or is_squad) and FLAGS.label_words:
        raise app.UsageError(f"--label_words is for classification tasks, not {FLAGS.task_name}")
    from modeling import bart, bert, t5

    try:
        values = bert.read_config_json(FLAGS.bert_config_file, "a T5 or BART config file")
        # The family by its config's names. BART's texts are <s> ... </s> (its pretraining
        # layout) and decoding starts from </s> (the released models' decoder_start_token_id);
        # T5's are ... </s>, started from <pad>.
        is_bart = bart.is_bart_config(values)
        if FLAGS.vocab_file:
            model_file = spiece.model_file(FLAGS.vocab_file)
            if model_file is None or is_bart:
                expected = "a T5's SentencePiece model (spiece.model or a folder holding it)"
                found = "a BART config: give its BPE files" if is_bart else "another file"
                raise input_error(FLAGS.vocab_file, expected, found)
            vocab = seq2seq_data.Seq2SeqVocab.from_spiece(model_file, FLAGS.num_sentinels)
        else:
            vocab = seq2seq_data.Seq2SeqVocab.from_files(
                FLAGS.encoder_file, FLAGS.merges_file, FLAGS.num_sentinels, bos=is_bart
            )
        if is_bart:
            family, make_model, start = "bart", bart.BartModel, vocab.eos_id
            config = bart.BartConfig.from_dict(values, FLAGS.bert_config_file)
        else:
            family, make_model, start = "t5", t5.T5Model, vocab.pad_id
            config = t5.T5Config.from_dict(values, FLAGS.bert_config_file)
        vocab.check_config(config, FLAGS.bert_config_file, start)
    except InputError as e:
        raise SystemExit(f"run_text2text: {e}") from None
    longest = getattr(config, "max_position_embeddings", None)  # BART's learned positions
    if longest is not None and max(FLAGS.max_seq_length, FLAGS.max_target_length) > longest:
        raise app.UsageError(
            f"--max_seq_length and --max_target_length: at most the config's "
            f"max_position_embeddings={longest}"
        )

    def load(split):
        try:
            pairs, source = text2text.read_pairs(
                FLAGS.task_name, split, FLAGS.data_dir, FLAGS.label_words
            )
        except InputError as e:
            raise SystemExit(f"run_text2text: {e}") from None
        except ValueError as e:
            raise app.UsageError(str(e)) from None
        features, cut = text2text.encode_pairs(
            pairs, vocab, FLAGS.max_seq_length, FLAGS.max_target_length
        )
        logging.info("%s: %d examples, %d truncated", source, len(pairs), cut)
        return pairs, features

    train = load("train") if FLAGS.do_train else None
    dev = load("dev") if FLAGS.do_eval else None
    test = load("test") if FLAGS.do_predict else None

    import keras
    import tensorflow as tf

    from training import (
        distribute,
        finetune_tasks,
        metrics,
        optimization,
        rouge,
        seq2seq_tasks,
        squad_eval,
        trainer,
    )

    # The decoded dev metrics: ROUGE-L, SQuAD's exact match and F1, or the label words' accuracy
    # and the task's GLUE metrics.
    heldout = ["rouge_l"] if is_seq2seq else ["exact_match", "f1"]
    if not (is_seq2seq or is_squad):  # a task load() has read, so one text-to-text covers
        task = glue.get_task(FLAGS.task_name)
        words = text2text.label_words(task, FLAGS.label_words)
        heldout = ["accuracy", *[m for m in task.metrics if m != "accuracy"]]

    strategy, _, _ = distribute.setup("one_device", "", {})
    steps = warmup = 0
    if train:
        steps, warmup = optimization.train_and_warmup_steps(
            len(train[0]), FLAGS.train_batch_size, FLAGS.num_train_epochs, FLAGS.warmup_proportion
        )
        logging.info("%d training steps, %d warmup", steps, warmup)
    keras.utils.set_random_seed(FLAGS.random_seed)
    with strategy.scope(), optimization.dtype_policy(FLAGS.precision):
        model = make_model(config)  # decoding too runs at --precision; logits stay float32
        model.build()
        optimizer = optimization.create_optimizer(FLAGS.learning_rate, max(steps, 1), warmup)
        optimizer = optimization.with_loss_scaling(optimizer, FLAGS.precision)
        optimizer.build(model.trainable_variables)  # before the first step (shared/NOTES.md)
    fit = trainer.Trainer(strategy, seq2seq_tasks.seq2seq_task(model), optimizer)
    output_dir = FLAGS.output_dir
    os.makedirs(output_dir, exist_ok=True)
    decoding = {
        "num_beams": FLAGS.num_beams,
        "max_length": FLAGS.max_target_length,
        "alpha": FLAGS.length_penalty,
    }

    def evaluate() -> dict:
        pairs, features = dev
        predictions = decode_texts(model, vocab, features, FLAGS.eval_batch_size, decoding)
        write_predictions(os.path.join(output_dir, "dev_predictions.tsv"), pairs, predictions, True)
        targets = [p.target for p in pairs]
        if is_squad:  # evaluate-v1.1.py's percentages
            scores = squad_eval.score_v1(
                [(p.index, p.answers) for p in pairs],
                {p.index: text for p, text in zip(pairs, predictions)},
            )
            return {k: scores[k] for k in heldout}
        if not is_seq2seq:
            return metrics.label_word_metrics(task.metrics, targets, predictions, words)
        exact = sum(p == t for p, t in zip(predictions, targets)) / len(pairs)
        return {"rouge_l": rouge.mean_rouge_l(predictions, targets), "exact_match": exact}

    # The dev score that picks the kept best: ROUGE-L F, SQuAD's F1, or GLUE's task score (the
    # mean of the task's metrics: CoLA's MCC, MRPC's F1 and accuracy) of the decoded label words.
    score_key = "rouge_l" if is_seq2seq else ("f1" if is_squad else "score")
    best = finetune_tasks.BestCheckpoint(os.path.join(output_dir, "best"), model)
    # run_training's eval_fn; the untrained model at step 0 is no candidate.
    selection = finetune_tasks.DevSelection(
        best, evaluate, score_key, lambda: int(optimizer.iterations.numpy())
    )

    def init_fn():
        logging.info(
            "initialised from %s", trainer.restore_model_weights(model, FLAGS.init_checkpoint)
        )

    if FLAGS.do_train:
        if tf.train.latest_checkpoint(output_dir) is None:
            best.clear()  # a fresh run: a kept best from another run must not survive
        features = train[1]

        def dataset():
            data = tf.data.Dataset.from_tensor_slices(features).repeat()
            data = data.shuffle(len(train[0]), seed=FLAGS.random_seed)
            return data.batch(FLAGS.train_batch_size, drop_remainder=True)

        run_config = {f"{family}_config": config.to_dict(), "task": FLAGS.task_name}
        # Token-level loss and accuracy in training; the decoded dev metrics held out.
        curves = list(fit.task.metrics) + (heldout if FLAGS.do_eval else [])
        trainer.run_training(
            fit,
            dataset,
            trainer.TrainSettings(
                output_dir=output_dir,
                num_train_steps=steps,
                save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                iterations_per_loop=FLAGS.iterations_per_loop,
                peak_flops=FLAGS.peak_tflops * 1e12,
                curves=tuple(curves),
                config_json=json.dumps(run_config, indent=2, sort_keys=True) + "\n",
                # fp16 adds the loss scale's state: a resume at another precision is refused
                run_settings_json=json.dumps({"precision": FLAGS.precision}),
            ),
            global_batch_size=FLAGS.train_batch_size,
            eval_fn=selection if FLAGS.do_eval else None,
            init_fn=init_fn if FLAGS.init_checkpoint else None,
        )
    else:
        # Decode with the kept best, else the latest checkpoint, else the given one.
        source = best.prefix or tf.train.latest_checkpoint(output_dir) or FLAGS.init_checkpoint
        if not source:
            raise app.UsageError(
                f"nothing to decode with: {output_dir} holds no checkpoint and --init_checkpoint "
                "is empty"
            )
        try:
            logging.info("decoding with %s", trainer.restore_model_weights(model, source))
        except ValueError as e:
            raise SystemExit(f"run_text2text: {e}") from None
    if FLAGS.do_eval:
        step = int(optimizer.iterations.numpy())
        results = selection.results_at(step)
        results["global_step"] = step
        if best.info:
            results |= {f"best_{score_key}": best.info["score"], "best_step": best.info["step"]}
        trainer.write_eval_results(output_dir, results)
    if FLAGS.do_predict:
        if FLAGS.do_train and best.prefix:
            trainer.restore_model_weights(model, best.prefix)
            logging.info("decoding the test split with the best dev checkpoint %s", best.prefix)
        pairs, features = test
        predictions = decode_texts(model, vocab, features, FLAGS.eval_batch_size, decoding)
        path = os.path.join(output_dir, "test_predictions.tsv")
        write_predictions(path, pairs, predictions, False)
        logging.info("wrote %d predictions to %s", len(predictions), path)


if __name__ == "__main__":
    app.run(main)
