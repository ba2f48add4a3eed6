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
  ELECTRA   an ELECTRA config (BERT's fields + embedding_size, generator_hidden_size,
            generator_layers) as --bert_config_file, any masked records (or --masking=dynamic):
            generator MLM + --disc_weight x replaced token detection; run scripts fine-tune the
            discriminator from its checkpoints.
  DistilBERT --teacher_checkpoint=<a BERT pretraining checkpoint>: the --bert_config_file
            student (fewer layers, same widths) starts from every other teacher layer and learns
            --alpha_ce x soft targets at --temperature + --alpha_mlm x MLM + --alpha_cos x cosine.
  GPT       a GPT config (OpenAI's hparams.json names, told by its n_vocab key) as
            --bert_config_file and language-model blocks from data_prep/create_lm_data.py
            (--max_seq_length = their block size); next-token prediction, held-out perplexity.
"""

from __future__ import annotations

from absl import app, flags, logging

from modeling import flops
from training.precision import CPU_SPEED_NOTE, PRECISION_NAMES

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
flags.DEFINE_float("peak_tflops", 0.0, flops.PEAK_TFLOPS_HELP, lower_bound=0.0)
flags.DEFINE_enum(
    "precision",
    "fp32",
    list(PRECISION_NAMES),
    "Compute precision: fp32, or mixed precision with float32 variables, softmax and losses: "
    "bf16 (mixed_bfloat16) or fp16 (mixed_float16 with dynamic loss scaling; an overflow step "
    "halves the scale and is not applied, and is not a non-finite step for --on_nonfinite). "
    "A resume with another precision is refused (fp16's checkpoints hold the loss scale)."
    + CPU_SPEED_NOTE,
)
flags.DEFINE_enum(
    "optimizer",
    "adamw",
    ["adamw", "lamb"],
    "adamw: BERT's Adam with decoupled weight decay. lamb: LAMB (You et al. 2019) for large "
    "batches. Both exclude LayerNorm and biases from weight decay (LAMB also from its trust "
    "ratio).",
)
flags.DEFINE_integer(
    "gradient_accumulation_steps",
    1,
    "Compute each --train_batch_size batch in this many micro-batches (of train_batch_size / "
    "(replicas * N) examples per replica), summing gradients, then apply once: the update of "
    "the whole batch in less memory. Checkpoints fall between whole steps.",
)
flags.DEFINE_integer(
    "parallel_micro_batches",
    1,
    "Split each (micro-)batch into this many parts whose forward and backward passes are "
    "independent within the step, summing their gradients: the same update (up to float "
    "rounding and dropout masks) in the same memory, the parts' ops interleaved on the cores. "
    "On 2 CPU cores 2 made small fp32 steps 1.03-1.08x faster and BERT-base's 1.01-1.02x "
    "(README); under bf16 or --use_xla it did not help, and on accelerators it is unmeasured.",
)
flags.DEFINE_integer(
    "encoder_branches",
    None,
    "Run the encoder's layers (BERT, RoBERTa, SpanBERT, ALBERT, ELECTRA) as this many independent "
    "row slices of each batch, joined after the last layer: the same outputs and dropout masks "
    "up to float rounding, the slices' ops interleaved on the cores, the embeddings and heads "
    "run once. On 2 CPU cores 2 made the L4/H256 fp32 step 1.03-1.23x faster, BERT-base's "
    "1.00-1.11x and the default run's model 1.05-1.08x (3 or 4: 0.92-0.95x of one pass at "
    "L4/H256); not bf16 or --use_xla steps (README); on "
    "accelerators it is unmeasured. Default: 2 for an fp32 step on CPUs of an encoder at least "
    "128 wide with 2+ rows per replica and micro-batch, without --use_xla, --remove_padding or "
    "--parallel_micro_batches, else 1 (logged; bert.auto_encoder_branches).",
)
flags.DEFINE_bool(
    "remove_padding",
    False,
    "Run the encoder's layers (BERT, RoBERTa, SpanBERT, ALBERT, ELECTRA) on each batch's real "
    "tokens alone: projections, feed-forward layers and LayerNorms skip the padding, attention "
    "runs on the padded layout; the same losses up to float rounding. On 2 CPU cores the "
    "default records' 10% padding made BERT-base's step 1.03-1.07x faster and L4/H256's not "
    "(bench/HISTORY.md); fine-tuning gains more. Not with --use_xla or TPUs (static shapes).",
)
flags.DEFINE_bool(
    "xla_weight_gradients",
    False,
    "Take every dense layer's kernel gradient (x^T dy over the batch's tokens) as an XLA-compiled "
    "dot; the rest of the step stays TensorFlow's. For CPUs where TensorFlow's oneDNN kernels "
    "are on (its default on AVX-512 VNNI / BF16 CPUs; TF_ENABLE_ONEDNN_OPTS=1 elsewhere), whose "
    "matmul runs these products slowly at small widths: on 2 AVX2 cores with oneDNN on the "
    "L4/H256 step was 1.13-1.22x faster, BERT-base's 0.97-1.08x; with oneDNN off it was slower "
    "(0.9x; bench/HISTORY.md); on an Intel AVX-512 host, whose oneDNN weight gradients run at "
    "full rate, 1.01x / 0.99x; on an AMD Zen 4 AVX-512 host 0.99x / 1.01x; unmeasured on "
    "accelerators. "
    "--precision=fp32 only; nothing changes under --use_xla.",
)
flags.DEFINE_integer("random_seed", 12345, "Seed for initialisation, dropout and shuffling.")
flags.DEFINE_enum(
    "on_nonfinite",
    "stop",
    ["stop", "skip"],
    "A step whose loss or gradient is NaN or Inf is never applied; stop: end the run (the last "
    "checkpoint is intact), skip: go on with the next batch, counting and logging skipped steps.",
)
flags.DEFINE_integer(
    "max_consecutive_nonfinite", 10, "--on_nonfinite=skip gives up after this many in a row."
)
flags.DEFINE_bool(
    "skip_corrupt_records",
    False,
    "Train past damaged records instead of stopping: first reads every file and logs per file "
    "what is skipped (records that do not parse; from a CRC error or truncation, the rest of "
    "that file).",
)
flags.DEFINE_bool(
    "validate_input",
    False,
    "Read every record of the train and eval files, check CRCs and that each parses, print a "
    "per-file report and exit (non-zero if any file is damaged), before any model is built.",
)
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
flags.DEFINE_bool(
    "xlnet_span_prediction",
    False,
    "XLNet: predict spans of 1-5 tokens starting at words, each in a context of --mask_alpha / "
    "--mask_beta times its length, and let the context tokens see each other (the release's "
    "partial prediction, sec. A.1; data_prep/permutation.py). Needs --vocab_file, the records' "
    "vocabulary, to tell word starts. With two-segment records (create_lm_data --reuse_len) "
    "each of the reused part and the rest gets its half of the spans. Default: the last "
    "--max_predictions_per_seq tokens of each order, every position following the order.",
)
flags.DEFINE_integer("mask_alpha", 6, "XLNet span prediction: context tokens per span token.")
flags.DEFINE_integer("mask_beta", 1, "XLNet span prediction: the divisor of --mask_alpha.")
flags.DEFINE_integer(
    "mem_len",
    0,
    "XLNet: the segment recurrence's memory (sec. 2.5, Transformer-XL), in positions: each "
    "layer also attends to what it read for the last --mem_len positions of its batch row's "
    "stream, so row j of every training batch is the block that follows row j of the batch "
    "before (the blocks of one create_lm_data.py output, --input_file its shards in order, cut "
    "into --train_batch_size streams; no shuffling). Evaluation runs over --eval_batch_size "
    "streams of the eval files the same way, from an empty memory each time. 0: none, shuffled "
    "blocks.",
)
flags.DEFINE_bool(
    "bi_data",
    False,
    "XLNet: the release's bidirectional data. Needs records made with create_lm_data.py "
    "--bi_data (forward ones, then the corpus read backward); half of every batch's rows read "
    "backward, with their relative distances negated (modeling/xlnet.py), and with --mem_len "
    "each backward row is a stream of its own. --train_batch_size and --eval_batch_size even.",
)
flags.DEFINE_string(
    "vocab_file",
    None,
    "The vocabulary of the records (a WordPiece vocab.txt, or an ALBERT's SentencePiece model): "
    "ids of [MASK], [CLS], [SEP] for dynamic masking; XLNet's word starts for "
    "--xlnet_span_prediction (also a byte-level BPE folder or an XLNet's spiece.model).",
)
flags.DEFINE_bool(
    "span_boundary_objective",
    False,
    "Add SpanBERT's span boundary objective (records from --masking_scheme=span).",
)
# ELECTRA and DistilBERT settings.
flags.DEFINE_float(
    "disc_weight",
    50.0,
    "ELECTRA: weight of the replaced token detection loss (the paper's lambda = 50, sec. 2).",
)
flags.DEFINE_string(
    "teacher_checkpoint",
    None,
    "DistilBERT: a BERT pretraining checkpoint (prefix or folder) to distil into the smaller "
    "--bert_config_file student, which starts from the teacher's embeddings, heads and one layer "
    "out of every L_teacher / L_student.",
)
flags.DEFINE_string(
    "teacher_config_file",
    None,
    "DistilBERT: the teacher's bert_config.json; default model_config.json or bert_config.json "
    "beside --teacher_checkpoint.",
)
flags.DEFINE_string(
    "teacher_vocab_file",
    None,
    "DistilBERT: the teacher's vocabulary; default vocab.txt beside --teacher_checkpoint. When "
    "it and --vocab_file are both known they must be the same token for token.",
)
flags.DEFINE_float("temperature", 2.0, "DistilBERT: softmax temperature of the soft targets.")
flags.DEFINE_float("alpha_ce", 5.0, "DistilBERT: weight of the soft-target loss.")
flags.DEFINE_float("alpha_mlm", 2.0, "DistilBERT: weight of the student's masked-LM loss.")
flags.DEFINE_float("alpha_cos", 1.0, "DistilBERT: weight of the hidden-state cosine loss.")
FLAGS = flags.FLAGS
# The losses plotted in training_curves.png (with every accuracy).
CURVE_LOSSES = ("masked_lm_loss", "disc_loss", "soft_target_loss", "cosine_loss")
DISTILLATION_FLAGS = (
    "teacher_config_file",
    "teacher_vocab_file",
    "temperature",
    "alpha_ce",
    "alpha_mlm",
    "alpha_cos",
)


def check_objective_flags(family: str, objective: str) -> None:
    """Refuses ELECTRA and DistilBERT flags that do not fit the config family or each other."""
    teacher = FLAGS.teacher_checkpoint
    if FLAGS["disc_weight"].present and family != "electra":
        raise app.UsageError("--disc_weight needs an ELECTRA config as --bert_config_file")
    unused = [f"--{n}" for n in DISTILLATION_FLAGS if FLAGS[n].present and not teacher]
    if unused:
        raise app.UsageError(f"{', '.join(unused)}: distillation flags need --teacher_checkpoint")
    if family == "electra" or teacher:
        what = "ELECTRA" if family == "electra" else "distillation (DistilBERT)"
        if objective != "none":
            raise app.UsageError(
                f"--sentence_objective={objective}: {what} trains no sentence-level objective; "
                "drop the flag"
            )
        if FLAGS.span_boundary_objective:
            raise app.UsageError(f"--span_boundary_objective: not with {what}; drop the flag")
    if teacher and family != "bert":
        raise app.UsageError(
            f"--teacher_checkpoint distils a BERT teacher into a BERT student; "
            f"--bert_config_file is an {family.upper()} config"
        )
    if teacher and FLAGS.init_checkpoint:
        raise app.UsageError(
            "--teacher_checkpoint initialises the student from the teacher; drop "
            "--init_checkpoint (or --teacher_checkpoint to start from it instead)"
        )


def read_teacher_config(student_config):
    """The teacher's BertConfig (--teacher_config_file, else model_config.json or
    bert_config.json beside --teacher_checkpoint), checked against the student's."""
    import os

    from data_prep.errors import InputError
    from modeling import bert

    path = FLAGS.teacher_checkpoint
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    config_file = FLAGS.teacher_config_file or next(
        (
            os.path.join(folder, name)
            for name in ("model_config.json", "bert_config.json")
            if os.path.isfile(os.path.join(folder, name))
        ),
        None,
    )
    if not config_file:
        raise app.UsageError(
            f"--teacher_config_file is required: no model_config.json or bert_config.json in "
            f"{folder or '.'}"
        )
    try:
        config = bert.BertConfig.from_json_file(config_file)
        bert.check_student_fits_teacher(student_config, config, FLAGS.bert_config_file)
    except InputError as e:
        raise SystemExit(f"run_pretraining: {e} (teacher config: {config_file})") from None
    teacher_vocab = FLAGS.teacher_vocab_file or os.path.join(folder, "vocab.txt")
    if FLAGS.vocab_file and (FLAGS.teacher_vocab_file or os.path.isfile(teacher_vocab)):
        # Same vocab_size is not enough: the soft targets are compared id by id.
        from data_prep import tokenization

        try:
            difference = tokenization.vocab_difference(FLAGS.vocab_file, teacher_vocab)
        except InputError as e:
            raise SystemExit(f"run_pretraining: {e}") from None
        if difference:
            raise SystemExit(
                f"run_pretraining: the student's --vocab_file and the teacher's vocabulary differ "
                f"({difference}); distil with records and --vocab_file made with the teacher's "
                "vocabulary"
            )
    return config


def load_teacher(config, strategy):
    """The frozen teacher BertPretrainer with the weights of --teacher_checkpoint, computing at
    --precision as the student (its logits float32)."""
    from modeling import bert
    from training import optimization, trainer

    with strategy.scope(), optimization.dtype_policy(FLAGS.precision):
        teacher = bert.BertPretrainer(config)
        teacher.build()
    teacher.trainable = False
    bert.set_encoder_branches(teacher, FLAGS.encoder_branches)  # checked with the student's
    bert.set_remove_padding(teacher, FLAGS.remove_padding)  # likewise
    try:
        loaded = trainer.restore_model_weights(teacher, FLAGS.teacher_checkpoint)
    except ValueError as e:
        raise SystemExit(
            f"run_pretraining: --teacher_checkpoint: {e}; a teacher is a BERT pretraining "
            "checkpoint (with its MLM head) of --teacher_config_file"
        ) from None
    logging.info(
        "teacher %s (%d layers, computing in %s)",
        loaded,
        config.num_hidden_layers,
        teacher.compute_dtype,
    )
    return teacher


def main(argv):
    del argv

    from data_prep import features, masking, pretraining_data
    from modeling import albert, bert, electra
    from training import tasks, trainer

    # The model family of a config (albert_config.json has embedding_size, an ELECTRA config
    # generator sizes), with the sentence objective its paper trained.
    pretrainers = {
        "bert": (bert.BertPretrainer, "nsp"),
        "albert": (albert.AlbertPretrainer, "sop"),
        "electra": (electra.ElectraPretrainer, "none"),
    }

    if not (FLAGS.do_train or FLAGS.do_eval):
        raise app.UsageError("at least one of --do_train or --do_eval must be set")
    for name in ("bert_config_file", "input_file", "output_dir"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    from modeling import bart, elmo, gpt, t5, xlnet

    values = bert.read_config_json(FLAGS.bert_config_file, "a model config JSON file")
    xlnet_only = [f"--{n}" for n in ("xlnet_span_prediction", "mask_alpha", "mask_beta", "mem_len",
                                     "bi_data") if FLAGS[n].present]  # fmt: skip
    if xlnet_only and not xlnet.is_xlnet_config(values):
        raise app.UsageError(f"{', '.join(xlnet_only)}: XLNet's permutation LM only")
    if bart.is_bart_config(values):
        return pretrain_seq2seq(bart.BartConfig.from_dict(values, FLAGS.bert_config_file))
    if gpt.is_gpt_config(values):
        return pretrain_language_model(gpt.GptConfig.from_dict(values, FLAGS.bert_config_file))
    if elmo.is_elmo_config(values):
        return pretrain_bilm(elmo.ElmoConfig.from_dict(values, FLAGS.bert_config_file))
    if t5.is_t5_config(values):
        return pretrain_seq2seq(t5.T5Config.from_dict(values, FLAGS.bert_config_file))
    if xlnet.is_xlnet_config(values):
        return pretrain_permutation_lm(xlnet.XLNetConfig.from_dict(values, FLAGS.bert_config_file))
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
    # A WordPiece vocab.txt or an ALBERT's SentencePiece model (the ids of its pieces).
    vocab, ids = None, None
    if dynamic:
        _, vocab, ids = pretraining_data.vocab_tokenizer(FLAGS.vocab_file, do_lower_case=True)
    config = albert.load_encoder_config(FLAGS.bert_config_file, s, len(vocab) if vocab else None)
    family = {albert.AlbertConfig: "albert", electra.ElectraConfig: "electra"}.get(
        type(config), "bert"
    )
    pretrainer_class, default_objective = pretrainers[family]
    if FLAGS.teacher_checkpoint:
        default_objective = "none"  # DistilBERT drops NSP
    objective = FLAGS.sentence_objective or default_objective
    check_objective_flags(family, objective)
    teacher_config = read_teacher_config(config) if FLAGS.teacher_checkpoint else None
    train_files = features.expand_input_files(FLAGS.input_file)
    eval_files = features.expand_input_files(FLAGS.eval_input_file or FLAGS.input_file)
    spec = features.pretraining_record_spec(s, p, FLAGS.masking, FLAGS.span_boundary_objective)
    check_input_files(sorted(set(train_files + eval_files)), spec)
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
        dynamic_masking = masking.DynamicMasking(
            masked_lm_prob=FLAGS.masked_lm_prob,
            max_predictions_per_seq=p,
            mask_id=ids.mask_id,
            vocab_size=len(vocab),
            special_ids=tuple(sorted({ids.cls_id, ids.sep_id, vocab.get("[PAD]", 0)})),
            **(electra.DYNAMIC_MASKING if family == "electra" else {}),
        )
    logging.info(
        "%s, sentence objective %s, %s masking%s",
        family,
        objective,
        FLAGS.masking,
        ", span boundary objective" if FLAGS.span_boundary_objective else "",
    )

    strategy, workers, worker_index = setup_strategy()
    if family == "electra":
        model, optimizer = build_model(strategy, lambda: pretrainer_class(config))
    else:
        model, optimizer = build_model(
            strategy,
            lambda: pretrainer_class(config, objective, FLAGS.span_boundary_objective),
        )
    teacher = load_teacher(teacher_config, strategy) if teacher_config else None
    if family == "electra":
        task = tasks.electra_pretraining_task(
            model, FLAGS.random_seed, optimizer.iterations, FLAGS.disc_weight
        )
    elif teacher is not None:
        task = tasks.distillation_task(
            model, teacher, FLAGS.temperature, FLAGS.alpha_ce, FLAGS.alpha_mlm, FLAGS.alpha_cos
        )
    else:
        task = tasks.bert_pretraining_task(model)
    fit = trainer.Trainer(
        strategy,
        task,
        optimizer,
        use_xla=FLAGS.use_xla,
        gradient_accumulation_steps=FLAGS.gradient_accumulation_steps,
        parallel_micro_batches=FLAGS.parallel_micro_batches,
    )

    def dataset(files, batch_size, is_training):
        return features.pretraining_dataset(
            files,
            batch_size // workers,
            s,
            p,
            is_training=is_training,
            seed=FLAGS.random_seed,
            num_shards=workers,
            shard_index=worker_index,
            dynamic_masking=dynamic_masking,
            span_boundaries=FLAGS.span_boundary_objective,
            skip_corrupt_records=FLAGS.skip_corrupt_records,
        )

    def eval_fn():
        return fit.evaluate(dataset(eval_files, FLAGS.eval_batch_size, False), FLAGS.max_eval_steps)

    def init_fn():
        if teacher is not None:
            sources = bert.init_student_from_teacher(model, teacher)
            logging.info("initialised the student from teacher layers %s", sources)
            return
        loaded, part = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
        logging.info(
            "initialised the %s from %s",
            "whole model" if part == "model" else "encoder (heads start fresh)",
            loaded,
        )

    train_and_evaluate(
        fit,
        lambda: dataset(train_files, FLAGS.train_batch_size, True),
        eval_fn,
        init_fn,
        config.to_json_string(),
        [k for k in fit.task.metrics if k in CURVE_LOSSES or "acc" in k],
        (sorted(set(train_files + eval_files)), spec),
    )


def check_input_files(files, spec) -> None:
    """--validate_input: prints a per-file report and exits (1 if a file is damaged).
    --skip_corrupt_records: logs per file what training will skip."""
    from data_prep import features

    if FLAGS.validate_input:
        checks = [features.validate_tfrecord_file(f, spec) for f in files]
        print("\n".join(c.describe() for c in checks))
        error = features.damaged_files_error(checks)
        raise SystemExit(f"run_pretraining: {error}" if error else 0)
    if FLAGS.skip_corrupt_records:
        features.check_skipped_records(files, spec)


def setup_strategy():
    """The tf.distribute strategy of the flags; returns (strategy, workers, worker_index)."""
    from training import distribute

    strategy, workers, worker_index = distribute.setup(
        FLAGS.distribution_strategy,
        FLAGS.tpu or "",
        {k: FLAGS[k].value for k in ("train_batch_size", "eval_batch_size")},
    )
    n = FLAGS.gradient_accumulation_steps
    replicas = strategy.num_replicas_in_sync
    if n < 1 or FLAGS.train_batch_size % (replicas * n):
        raise app.UsageError(
            f"--train_batch_size={FLAGS.train_batch_size} does not split into "
            f"--gradient_accumulation_steps={n} micro-batches on each of {replicas} replica(s)"
        )
    k = FLAGS.parallel_micro_batches
    if k < 1 or FLAGS.train_batch_size % (replicas * n * k):
        raise app.UsageError(
            f"--train_batch_size={FLAGS.train_batch_size} does not split into "
            f"--parallel_micro_batches={k} parts of each of the {n} micro-batch(es) on each of "
            f"{replicas} replica(s)"
        )
    logging.info(
        "strategy %s with %d replica(s), %d worker(s)",
        FLAGS.distribution_strategy,
        strategy.num_replicas_in_sync,
        workers,
    )
    return strategy, workers, worker_index


def build_model(strategy, make_model):
    """The model (from make_model, at --precision) and its optimizer (--optimizer, with loss
    scaling under fp16), both built under the strategy's scope after seeding, so every objective
    initialises the same way. Returns (model, optimizer)."""
    import keras

    from training import optimization

    keras.utils.set_random_seed(FLAGS.random_seed)
    with strategy.scope():
        with optimization.dtype_policy(FLAGS.precision):
            model = make_model()
            model.build()
        from modeling import bert

        if FLAGS.encoder_branches is None:
            rows = FLAGS.train_batch_size // (
                strategy.num_replicas_in_sync
                * FLAGS.gradient_accumulation_steps
                * FLAGS.parallel_micro_batches
            )
            FLAGS.encoder_branches, why = bert.auto_encoder_branches(
                model,
                strategy.extended.worker_devices,
                FLAGS.precision,
                FLAGS.use_xla,
                FLAGS.remove_padding,
                FLAGS.parallel_micro_batches,
                rows,
            )
            logging.info("--encoder_branches=%d by default (%s)", FLAGS.encoder_branches, why)
        try:  # a TPUStrategy's scope refuses --remove_padding too
            bert.set_execution_options(
                model,
                FLAGS.encoder_branches,
                FLAGS.remove_padding,
                FLAGS.xla_weight_gradients,
                "--use_xla compiles static shapes" if FLAGS.use_xla else "",
            )
        except ValueError as e:
            raise app.UsageError(str(e)) from None
        optimizer = optimization.create_optimizer(
            FLAGS.learning_rate,
            FLAGS.num_train_steps,
            FLAGS.num_warmup_steps,
            optimizer=FLAGS.optimizer,
        )
        optimizer = optimization.with_loss_scaling(optimizer, FLAGS.precision)
        # Built under the scope before the first step, else Keras 3 under MirroredStrategy fails
        # with "You must feed a value for placeholder tensor" (shared/NOTES.md).
        optimizer.build(model.trainable_variables)
    return model, optimizer


def train_and_evaluate(fit, train_dataset_fn, eval_fn, init_fn, config_json, curve_keys, inputs):
    """The run every objective shares: train with checkpoints, logs and curves (--do_train),
    then write eval_results.txt (--do_eval). A DataLossError (TF names no file) is re-raised
    naming the damaged files and records, found by validating `inputs` = (files, spec)."""
    import tensorflow as tf

    from data_prep import features

    try:
        _train_and_evaluate(fit, train_dataset_fn, eval_fn, init_fn, config_json, curve_keys)
    except tf.errors.DataLossError as e:
        files, spec = inputs
        error = features.damaged_files_error(
            [features.validate_tfrecord_file(f, spec) for f in files]
        )
        raise SystemExit(
            f"run_pretraining: damaged input ({e.message.strip()[:200]}): {error}"
        ) from None


def _train_and_evaluate(fit, train_dataset_fn, eval_fn, init_fn, config_json, curve_keys):
    import json

    from training import trainer

    output_dir = FLAGS.output_dir
    if FLAGS.do_train:
        trainer.run_training(
            fit,
            train_dataset_fn,
            trainer.TrainSettings(
                output_dir=output_dir,
                num_train_steps=FLAGS.num_train_steps,
                save_checkpoints_steps=FLAGS.save_checkpoints_steps,
                iterations_per_loop=FLAGS.iterations_per_loop,
                max_checkpoints_to_keep=FLAGS.keep_checkpoint_max,
                config_json=config_json,
                on_nonfinite=FLAGS.on_nonfinite,
                max_consecutive_nonfinite=FLAGS.max_consecutive_nonfinite,
                peak_flops=FLAGS.peak_tflops * 1e12,
                curves=tuple(curve_keys),
                # Flags that change the input pipeline or the model's heads: a resume with
                # other values is refused naming them (their checkpoints do not restore).
                run_settings_json=json.dumps(
                    {
                        k: FLAGS[k].value
                        # --precision: fp16 adds the loss scale's state to the checkpoint
                        for k in (
                            "skip_corrupt_records",
                            "span_boundary_objective",
                            "precision",
                            "xlnet_span_prediction",
                            "mem_len",
                            "bi_data",
                        )  # fmt: skip
                    }
                ),
            ),
            global_batch_size=FLAGS.train_batch_size,
            eval_fn=eval_fn if FLAGS.do_eval else None,
            init_fn=init_fn if FLAGS.init_checkpoint or FLAGS.teacher_checkpoint else None,
        )
    if FLAGS.do_eval:
        if not FLAGS.do_train:
            trainer.restore_model_weights(fit.task.model, FLAGS.init_checkpoint or output_dir)
        results = eval_fn()
        results["global_step"] = int(fit.optimizer.iterations.numpy())
        trainer.write_eval_results(output_dir, results)


def pretrain_blocks(
    config, make_model, make_task, make_dataset, files, perplexity_of, curve_keys, after_build=None
):
    """The shared tail of the block objectives (GPT, ELMo, T5, XLNet): model and optimizer under
    the strategy, the Trainer, per-worker datasets, held-out evaluation with perplexities, and
    train_and_evaluate.

    make_model(config) -> the Keras model; make_task(model) -> its trainer.Task (called under
    the strategy's scope);
    make_dataset(files, per_worker_batch, is_training, seed, workers, worker_index) -> a
    tf.data.Dataset; files = (train_files, eval_files, (all_files, feature_spec)); perplexity_of
    maps a result name to the mean per-token loss it exponentiates; after_build(model), if given,
    runs once the weights exist. Returns the built model.
    """
    import math

    from training import trainer

    train_files, eval_files, inputs = files
    strategy, workers, worker_index = setup_strategy()
    model, optimizer = build_model(strategy, lambda: make_model(config))
    if after_build is not None:
        after_build(model)
    with strategy.scope():  # a task's state (XLNet's memory) is mirrored as the model is
        task = make_task(model)
    try:
        fit = trainer.Trainer(
            strategy,
            task,
            optimizer,
            use_xla=FLAGS.use_xla,
            gradient_accumulation_steps=FLAGS.gradient_accumulation_steps,
            parallel_micro_batches=FLAGS.parallel_micro_batches,
        )
    except ValueError as e:
        raise app.UsageError(
            f"--gradient_accumulation_steps / --parallel_micro_batches: {e}"
        ) from None

    def dataset(files, batch_size, is_training):
        return make_dataset(
            files, batch_size // workers, is_training, FLAGS.random_seed, workers, worker_index
        )

    def eval_fn():
        results = fit.evaluate(
            dataset(eval_files, FLAGS.eval_batch_size, False), FLAGS.max_eval_steps
        )
        # exp of the mean per-token loss, capped so that a diverged run still prints.
        return results | {
            k: math.exp(min(results[loss], 50.0)) for k, loss in perplexity_of.items()
        }

    def init_fn():
        loaded, part = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
        logging.info("initialised the %s from %s", part, loaded)

    logging.info("%s, %d parameters", type(model).__name__, model.count_params())
    train_and_evaluate(
        fit,
        lambda: dataset(train_files, FLAGS.train_batch_size, True),
        eval_fn,
        init_fn,
        config.to_json_string(),
        curve_keys,
        inputs,
    )
    return model


def pretrain_language_model(config) -> None:
    """GPT: next-token prediction on the blocks of data_prep/create_lm_data.py (Radford et al.
    2018, sec. 3.1), with held-out loss, accuracy and perplexity."""
    from data_prep import features, lm_data
    from data_prep.errors import InputError
    from modeling import gpt
    from training import tasks

    s = FLAGS.max_seq_length
    if s > config.n_ctx:
        raise app.UsageError(f"--max_seq_length={s} exceeds the config's n_ctx={config.n_ctx}")
    bert_only = ["masking", "sentence_objective", "span_boundary_objective"]
    changed = [f"--{n}" for n in bert_only if FLAGS[n].present]
    if changed:
        raise app.UsageError(
            f"{', '.join(changed)}: masked-LM flags; a GPT config trains a causal LM"
        )
    train_files = features.expand_input_files(FLAGS.input_file)
    eval_files = features.expand_input_files(FLAGS.eval_input_file or FLAGS.input_file)
    if FLAGS.skip_corrupt_records:
        raise app.UsageError("--skip_corrupt_records: not for GPT blocks yet")
    files = sorted(set(train_files + eval_files))
    check_input_files(files, lm_data.lm_feature_spec(s))
    try:
        lm_data.check_lm_files(files, s)
    except InputError as e:
        raise SystemExit(
            f"run_pretraining: {e} (make blocks with data_prep/create_lm_data.py)"
        ) from None
    logging.info("GPT (%s-LN), blocks of %d", config.layer_norm_position, s)
    pretrain_blocks(
        config,
        gpt.GptLM,
        tasks.causal_lm_task,
        lambda f, b, train, *shard: lm_data.lm_dataset(f, b, s, train, *shard),
        (train_files, eval_files, (files, lm_data.lm_feature_spec(s))),
        {"perplexity": "lm_loss"},
        ["lm_loss", "lm_accuracy"],
    )


def pretrain_bilm(config) -> None:
    """ELMo: the forward and backward LMs together on the blocks of data_prep/create_lm_data.py
    (Peters et al. 2018, sec. 3.1), with each direction's held-out loss and perplexity. A
    char-CNN config spells the ids of --vocab_file (whose size must be n_tokens_vocab)."""

    from data_prep import features, lm_data, tokenization
    from data_prep.errors import InputError
    from modeling import elmo
    from training import bilm_tasks

    s = FLAGS.max_seq_length
    bert_only = ["masking", "sentence_objective", "span_boundary_objective"]
    changed = [f"--{n}" for n in [*bert_only, "skip_corrupt_records"] if FLAGS[n].present]
    if changed:
        raise app.UsageError(f"{', '.join(changed)}: not for an ELMo biLM")
    if config.n_tokens_vocab is None:
        raise app.UsageError("an ELMo config needs n_tokens_vocab (its softmax) to pretrain")
    tokens = None
    if FLAGS.vocab_file:
        tokens = list(tokenization.load_vocab(FLAGS.vocab_file))
        if len(tokens) != config.n_tokens_vocab:
            raise app.UsageError(
                f"--vocab_file has {len(tokens)} entries, the config's n_tokens_vocab is "
                f"{config.n_tokens_vocab}"
            )
    elif config.char_cnn is not None:
        raise app.UsageError("a char_cnn config needs --vocab_file: the strings it spells")
    train_files = features.expand_input_files(FLAGS.input_file)
    eval_files = features.expand_input_files(FLAGS.eval_input_file or FLAGS.input_file)
    inputs = (sorted(set(train_files + eval_files)), lm_data.lm_feature_spec(s))
    check_input_files(*inputs)
    try:
        lm_data.check_lm_files(inputs[0], s)
    except InputError as e:
        raise SystemExit(
            f"run_pretraining: {e} (make blocks with data_prep/create_lm_data.py)"
        ) from None

    def set_char_table(model):  # the strings the char-CNN spells, once its table exists
        if tokens is not None:
            model.encoder.set_char_table(tokens)

    logging.info("ELMo biLM, blocks of %d", s)
    pretrain_blocks(
        config,
        elmo.ElmoLM,
        bilm_tasks.bilm_task,
        lambda f, b, train, *shard: lm_data.lm_dataset(f, b, s, train, *shard),
        (train_files, eval_files, inputs),
        {f"{d}_perplexity": f"{d}_lm_loss" for d in ("forward", "backward")},
        ["forward_lm_loss", "backward_lm_loss", "forward_lm_accuracy"],
        after_build=set_char_table,
    )


def pretrain_seq2seq(config) -> None:
    """T5 / BART denoising: an encoder-decoder trained on the records of
    data_prep/create_seq2seq_data.py (span corruption or text infilling), with held-out target
    loss, token accuracy and perplexity. --max_seq_length is the records' encoder length; their
    target length is read from the files."""

    from data_prep import features, seq2seq_data
    from data_prep.errors import InputError
    from modeling import bart, t5
    from training import seq2seq_tasks

    is_bart = isinstance(config, bart.BartConfig)
    family, make_model = ("BART", bart.BartModel) if is_bart else ("T5", t5.T5Model)

    changed = [
        f"--{n}"
        for n in (
            "masking",
            "sentence_objective",
            "span_boundary_objective",
            "skip_corrupt_records",
        )
        if FLAGS[n].present
    ]
    if changed:
        raise app.UsageError(f"{', '.join(changed)}: not for a {family} config (denoising records)")
    train_files = features.expand_input_files(FLAGS.input_file)
    eval_files = features.expand_input_files(FLAGS.eval_input_file or FLAGS.input_file)
    files = sorted(set(train_files + eval_files))
    try:
        s, t, largest = seq2seq_data.seq2seq_file_lengths(files)
        if s != FLAGS.max_seq_length:
            raise InputError(
                f"{files[0]}: expected inputs of --max_seq_length={FLAGS.max_seq_length} ids, "
                f"found {s}"
            )
        longest = getattr(config, "max_position_embeddings", None)  # BART's learned positions
        if longest is not None and max(s, t) > longest:
            raise InputError(
                f"{files[0]}: expected inputs and targets of at most the config's "
                f"max_position_embeddings={longest} ids, found {s} and {t}"
            )
        if largest >= config.vocab_size:
            raise InputError(
                f"{files[0]}: expected ids below the config's vocab_size {config.vocab_size}, "
                f"found {largest}"
            )
    except InputError as e:
        raise SystemExit(
            f"run_pretraining: {e} (make records with data_prep/create_seq2seq_data.py)"
        ) from None
    spec = seq2seq_data.seq2seq_feature_spec(s, t)
    check_input_files(files, spec)
    logging.info("%s, inputs %d, targets %d", family, s, t)
    pretrain_blocks(
        config,
        make_model,
        seq2seq_tasks.seq2seq_task,
        lambda f, b, train, *shard: seq2seq_data.seq2seq_dataset(f, b, s, t, train, *shard),
        (train_files, eval_files, (files, spec)),
        {"perplexity": "target_loss"},
        ["target_loss", "target_accuracy"],
    )


def pretrain_permutation_lm(config) -> None:
    """XLNet: permutation language modelling (Yang et al. 2019, sec. 2.3) on the blocks of
    data_prep/create_lm_data.py, with held-out loss, accuracy and perplexity of the predicted
    tokens. Each batch draws a factorisation order per block in tf.data (seeded by
    --random_seed and the batch number); --max_predictions_per_seq is how many tokens of a block
    are predicted (the last of the order: the paper's partial prediction, |z| / K tokens)."""

    from data_prep import features, lm_data, permutation
    from data_prep.errors import InputError
    from modeling import xlnet
    from training import plm_tasks

    s, p = FLAGS.max_seq_length, FLAGS.max_predictions_per_seq
    if not 1 <= p <= s:
        raise app.UsageError(
            f"--max_predictions_per_seq={p}: XLNet predicts 1 .. --max_seq_length={s} tokens "
            "per block"
        )
    bert_only = ["masking", "sentence_objective", "span_boundary_objective", "teacher_checkpoint"]
    changed = [f"--{n}" for n in bert_only if FLAGS[n].present]
    if changed:
        raise app.UsageError(f"{', '.join(changed)}: not for XLNet's permutation LM")
    if FLAGS.skip_corrupt_records:
        raise app.UsageError("--skip_corrupt_records: not for XLNet blocks yet")
    train_files = features.expand_input_files(FLAGS.input_file)
    eval_files = features.expand_input_files(FLAGS.eval_input_file or FLAGS.input_file)
    features_files = sorted(set(train_files + eval_files))
    check_input_files(features_files, lm_data.lm_feature_spec(s))
    try:
        kind = lm_data.check_lm_files(features_files, s, xlnet=True)
    except InputError as e:
        raise SystemExit(
            f"run_pretraining: {e} (make blocks with data_prep/create_lm_data.py)"
        ) from None
    reuse_len = kind.reuse_len
    if kind.bi_data != FLAGS.bi_data:
        raise app.UsageError(
            f"--bi_data={FLAGS.bi_data}: the records are {kind} ({features_files[0]}); "
            + ("give --bi_data" if kind.bi_data else "make them with create_lm_data.py --bi_data")
        )
    odd = [f"--{n}={FLAGS[n].value}" for n in ("train_batch_size", "eval_batch_size")
           if FLAGS[n].value % 2]  # fmt: skip
    if FLAGS.bi_data and odd:
        raise app.UsageError(f"--bi_data: {', '.join(odd)}: expected even (half of it backward)")
    if reuse_len:
        if p - p // 2 > reuse_len or p // 2 > s - reuse_len - 3:
            raise app.UsageError(
                f"--max_predictions_per_seq={p}: two-segment records predict {p - p // 2} of "
                f"the reused part's {reuse_len} positions and {p // 2} of the other "
                f"{s - reuse_len - 3} (<sep>, <sep> and <cls> aside); give fewer"
            )
    spans = {}
    if FLAGS.xlnet_span_prediction:
        if not FLAGS.vocab_file:
            raise app.UsageError("--xlnet_span_prediction: give --vocab_file to tell word starts")
        if FLAGS.mask_alpha < 1 or FLAGS.mask_beta < 1:
            raise app.UsageError(
                f"--mask_alpha={FLAGS.mask_alpha} / --mask_beta={FLAGS.mask_beta}: expected >= 1"
            )
        try:
            starts = permutation.word_start_table(FLAGS.vocab_file)
        except InputError as e:
            raise SystemExit(f"run_pretraining: {e}") from None
        if len(starts) < config.n_token:  # ids past the table would be read as continuations
            raise app.UsageError(
                f"--vocab_file={FLAGS.vocab_file}: {len(starts)} tokens, fewer than the config's "
                f"n_token {config.n_token}"
            )
        spans = {"word_starts": starts, "mask_alpha": FLAGS.mask_alpha,
                 "mask_beta": FLAGS.mask_beta}  # fmt: skip
    elif FLAGS["mask_alpha"].present or FLAGS["mask_beta"].present:
        raise app.UsageError("--mask_alpha / --mask_beta: only with --xlnet_span_prediction")
    if FLAGS.mem_len < 0:
        raise app.UsageError(f"--mem_len={FLAGS.mem_len}: expected >= 0")
    memory = FLAGS.mem_len > 0
    logging.info("XLNet, %s of %d, %d predicted each%s%s%s",
                 f"two-segment records (reuse_len {reuse_len})" if reuse_len else "blocks", s, p,
                 " (spans)" if spans else "", ", half backward (bi_data)" if FLAGS.bi_data else "",
                 f", a memory of {FLAGS.mem_len} (streams)" if memory else "")  # fmt: skip

    def make_task(model):
        if not memory:
            return plm_tasks.permutation_lm_task(model)
        state, eval_state = (
            plm_tasks.SegmentMemory(config, rows, FLAGS.mem_len, reuse_len)
            for rows in (FLAGS.train_batch_size, FLAGS.eval_batch_size)
        )
        return plm_tasks.permutation_lm_task(model, state, eval_state)

    def make_dataset(files, batch_size, is_training, *shard):
        if FLAGS.bi_data and batch_size % 2:
            raise SystemExit(
                f"run_pretraining: --bi_data: {batch_size} rows a worker, expected even (give "
                "batch sizes that are even multiples of the worker count)"
            )
        try:
            return permutation.permutation_lm_dataset(
                files, batch_size, s, p, is_training, *shard, **spans, streams=memory,
                reuse_len=reuse_len, bi_data=FLAGS.bi_data,
            )  # fmt: skip
        except InputError as e:  # too few blocks for the streams
            raise SystemExit(f"run_pretraining: {e}") from None

    pretrain_blocks(
        config,
        xlnet.XLNetPretrainer,
        make_task,
        make_dataset,
        (train_files, eval_files, (features_files, lm_data.lm_feature_spec(s))),
        {"perplexity": "plm_loss"},
        ["plm_loss", "plm_accuracy"],
    )


if __name__ == "__main__":
    app.run(main)
