"""Fine-tunes BERT for CoNLL-style token tagging (NER), or trains a tagger on frozen features.

Example:
  python run_ner.py --data_dir=conll2003 --vocab_file=default_run/vocab.txt \
    --bert_config_file=default_run/bert_config.json --init_checkpoint=default_run/pretrain \
    --do_train --do_eval --do_predict --max_seq_length=128 --train_batch_size=32 \
    --learning_rate=5e-5 --num_train_epochs=3 --output_dir=out/ner

--data_dir holds train.txt, dev.txt (or valid.txt) and test.txt, or CoNLL-2003's eng.train,
eng.testa and eng.testb: column files with the token first and the tag last (four-column CoNLL-2003
with -DOCSTART- lines, two-column `token TAG`; test may be one column). Tags in IOB1 are converted
to BIO, BIO and IOBES are kept (--tag_scheme, detected from the training file by default); a tag
that breaks strict BIO / IOBES is repaired and counted or rejected (--invalid_tags). The label list
comes from the training file unless --label_list gives it. The first WordPiece of each word
carries its label; sentences longer than --max_seq_length are split into overlapping windows and
reassembled, never cut.

--do_eval scores the dev file with conlleval's entity-level precision / recall / F1 (per type and
overall) and token accuracy after every checkpoint, keeps the best by F1 in output_dir/best/ and
writes eval_results.txt, dev_predictions.txt (`token gold predicted`, conlleval's input) and
dev_conlleval.txt. --do_predict writes test_predictions.txt from the best checkpoint, and for a
labelled test file test_results.txt and test_conlleval.txt.

An ELMo options.json as --bert_config_file (modeling/elmo.py, pretrained by run_pretraining.py on
WordPiece blocks of the same --vocab_file) gives ELMo's downstream tagger: its frozen biLM's token
layer and biLSTM layers take the place of the encoder's outputs (sum_all: ELMo's scalar mix with
gamma), the words are WordPieces with the first one labelled as for BERT, and [CLS] is read as
[SEP], the document boundary the biLM was pretrained with. Only frozen modes apply to it. A
published ELMo converted by `convert_checkpoint.py --from=bilm_hdf5` reads words instead (its
options.json has a character CNN and no n_tokens_vocab; no --vocab_file): each CoNLL word is one
token, spelled by the character CNN, and every window is `<S> words </S>` as AllenNLP's Elmo reads
a sentence (ELMo's NER recipe, Peters et al. 2018 sec. 5).

--feature_mode other than finetune freezes the encoder and trains only a tagger on its layers
(BERT paper table 7: embeddings, second_to_last, last, sum_last_four, concat_last_four, sum_all;
the sums are ELMo's learned scalar mix), optionally through a BiLSTM (--lstm_units). A rerun
resumes training. With --feature_cache the frozen encoder runs once per split and every
feature mode trains on its saved outputs (--init_checkpoint names the encoder then, also for
--do_predict alone). Without --do_train, labels and model settings are read from the
model_config.json that training left in --output_dir (or beside --init_checkpoint).
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging

from modeling import flops
from training.precision import FINETUNE_PRECISION_HELP, PRECISION_NAMES

flags.DEFINE_string("data_dir", None, "Folder with train.txt, dev.txt, test.txt (or eng.*).")
flags.DEFINE_string(
    "vocab_file",
    None,
    "WordPiece vocabulary the model was trained with, or a RoBERTa checkpoint's byte-level BPE "
    "folder (vocab.json + merges.txt; each word's tokens with a leading space, <s> ... </s>). "
    "None for an ELMo that reads words (a converted published ELMo).",
)
flags.DEFINE_string("bert_config_file", None, "JSON config of the BERT model (original fields).")
flags.DEFINE_string(
    "init_checkpoint",
    None,
    "Cloze checkpoint (prefix or folder) to start from; empty = scratch. Without --do_train, "
    "output_dir's best (or latest) checkpoint is used first.",
)
flags.DEFINE_bool(
    "do_lower_case",
    True,
    "Lower-case the input (uncased vocabularies); a RoBERTa BPE folder only when given explicitly.",
)
flags.DEFINE_bool("do_train", False, "Whether to train on the train file.")
flags.DEFINE_bool("do_eval", False, "Whether to score the dev file.")
flags.DEFINE_bool("do_predict", False, "Whether to tag the test file.")
flags.DEFINE_bool("skip_corrupt_records", False, "Train past damaged records, as run_pretraining.")
flags.DEFINE_integer(
    "max_seq_length", 128, "WordPieces per window, [CLS] and [SEP] included; longer sentences "
    "are split into overlapping windows."
)  # fmt: skip
flags.DEFINE_integer(
    "window_overlap", 32, "Pieces of left context a window repeats from the one before it."
)
flags.DEFINE_integer("train_batch_size", 32, "Global batch size for training (windows).")
flags.DEFINE_integer("eval_batch_size", 8, "Global batch size for evaluation.")
flags.DEFINE_integer("predict_batch_size", 8, "Global batch size for prediction.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate for AdamW.")
flags.DEFINE_float("num_train_epochs", 3.0, "Passes over the training windows.")
flags.DEFINE_float("warmup_proportion", 0.1, "Fraction of the steps with linear warmup.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint (and dev eval) every N steps.")
flags.DEFINE_integer("iterations_per_loop", 100, "Steps per compiled loop between host logs.")
flags.DEFINE_float(
    "peak_tflops",
    0.0,
    flops.PEAK_TFLOPS_HELP + " (A frozen encoder counts one forward pass, none when cached.)",
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
flags.DEFINE_integer("random_seed", 12345, "Seed for initialisation, dropout and shuffling.")
flags.DEFINE_list("label_list", [], "Tags in id order (default: O, then the training file's).")
flags.DEFINE_enum(
    "tag_scheme", "auto", ["auto", "iob1", "bio", "iobes"], "Tag scheme of the files."
)
flags.DEFINE_enum(
    "invalid_tags",
    "repair",
    ["repair", "reject"],
    "A tag that breaks strict BIO / IOBES (I- after O): read it as conlleval does and count it, "
    "or stop with its file and line.",
)
flags.DEFINE_bool(
    "skip_bad_lines", False, "Skip and count sentences with a malformed line instead of stopping."
)
flags.DEFINE_enum(
    "feature_mode",
    "finetune",
    ["finetune", "embeddings", "second_to_last", "last", "sum_last_four", "concat_last_four",
     "sum_all"],
    "finetune the encoder, or train on these frozen layers (modeling/tagging.py).",
)  # fmt: skip
flags.DEFINE_integer(
    "lstm_units", 0, "Units per direction of a BiLSTM before the tagger (0: none)."
)
flags.DEFINE_integer("lstm_layers", 2, "BiLSTM layers when --lstm_units > 0 (the paper: 2).")
flags.DEFINE_string(
    "feature_cache",
    None,
    "Frozen modes only: a folder for the frozen encoder's outputs (all layers) per split. Read "
    "when made from the same checkpoint, config and windows, else computed once from "
    "--init_checkpoint and written; the tagger then trains on them without running the encoder, "
    "so several feature modes share one pass of the encoder.",
)
flags.DEFINE_float(
    "layerwise_lr_decay", 1.0, "Learning-rate factor per layer below the head (1.0 = off)."
)
flags.DEFINE_integer(
    "encoder_branches",
    1,
    "Run the Transformer encoder's layers (BERT, ALBERT, ELECTRA; also when it computes "
    "--feature_cache) as this many independent row slices of each batch, as run_pretraining's "
    "flag: the same outputs and dropout masks up to float rounding (README). Not for ELMo.",
)
flags.DEFINE_bool(
    "xla_weight_gradients",
    False,
    "Take every dense layer's kernel gradient as an XLA-compiled dot, as run_pretraining's flag: "
    "for CPUs with TensorFlow's oneDNN kernels on (README). With --feature_cache, the tagger's "
    "own. --precision=fp32 only.",
)
flags.DEFINE_bool(
    "remove_padding",
    False,
    "Run the Transformer encoder's layers (BERT, ALBERT, ELECTRA; also when it computes "
    "--feature_cache) on each batch's real tokens alone, as run_pretraining's flag: the same "
    "outputs at real tokens up to float rounding. Not for ELMo or TPUs.",
)
flags.DEFINE_enum(
    "precision",
    "fp32",
    list(PRECISION_NAMES),
    FINETUNE_PRECISION_HELP + " It sets the trained tagger's; --feature_cache's "
    "features are computed in float32.",
)
flags.DEFINE_bool(
    "dynamic_padding",
    True,
    "Cut each batch to its longest window, rounded up to a multiple of 8, instead of padding to "
    "--max_seq_length: the same logits for less work on short sentences (as run_classifier's). "
    "Off for an ELMo biLM, --feature_cache and TPUs (static shapes).",
)
flags.DEFINE_bool(
    "group_by_length",
    False,
    "With --dynamic_padding: sort each 50 training batches' windows by length and batch them "
    "again, so each batch is cut shorter (as run_classifier's flag); every window still comes "
    "once per pass, but a batch is no longer a random sample. Off by default, as the original.",
)
FLAGS = flags.FLAGS

# The dev scores logged at every checkpoint (eval_results.txt also has them per entity type).
_OVERALL = ("f1", "precision", "recall", "token_accuracy", "loss", "predicted_entities",
            "correct_entities")  # fmt: skip
# Model settings that a predict-only run takes from the training run's model_config.json.
_MODEL_KEYS = ("labels", "tag_scheme", "feature_mode", "lstm_units", "lstm_layers")


def _saved_model_settings(output_dir: str, init_checkpoint: str) -> tuple[dict, str] | None:
    """The run config training wrote (output_dir, else the init checkpoint's folder), or None."""
    folders = [output_dir]
    if init_checkpoint:
        ckpt = init_checkpoint.rstrip("/")
        folders.append(ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt))
        folders.append(os.path.dirname(folders[-1]))  # .../best/ckpt-N -> the run folder
    for folder in folders:
        path = os.path.join(folder, "model_config.json")
        if os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            if saved.get("task") == "ner":
                return saved, path
    return None


def _with_layer_features(
    encoded,
    split,
    cache_dir,
    ckpt,
    config,
    strategy,
    workers,
    worker_index,
    batch_size,
    branches,
    remove_padding,
    words=None,
):
    """`encoded` with float32 `layer_features` (W, S, L + 1, H) added: every output of the frozen
    encoder in --init_checkpoint, read from --feature_cache/<split>.npz when that was made from the
    same checkpoint, config, windows and (an ELMo that reads words) `words`, the words the ids
    index, else computed here (the encoder in `branches` row slices, see --encoder_branches, and
    on the real tokens alone with `remove_padding`) and written there."""
    if encoded is None:
        return None
    import dataclasses

    import numpy as np
    import tensorflow as tf

    from data_prep import feature_files, glue
    from modeling import bert, tagging
    from training import finetune_tasks, trainer

    path = os.path.join(cache_dir, f"{split}.npz")
    prefix = tf.train.latest_checkpoint(ckpt) if tf.io.gfile.isdir(ckpt) else ckpt
    described = config.to_json_string() + ("\n".join(words) if words else "")
    key = feature_files.cache_key(prefix or ckpt, described, encoded.features)
    values = feature_files.read_layer_cache(path, key)
    if values is not None:
        logging.info("%s: %s windows' encoder outputs read from %s", split, values.shape, path)
    else:
        with strategy.scope():
            extractor = tagging.all_layer_features(config)
            extractor.build()
            if words:
                extractor.encoder.read_words(words)
        # (an ELMo extractor and a TPU were refused before)
        bert.set_execution_options(extractor, branches, remove_padding)
        loaded, _ = trainer.init_from_checkpoint(extractor, ckpt)
        batches = glue.eval_batches(encoded.features, batch_size, workers, worker_index)
        predictor = finetune_tasks.Predictor(strategy, extractor)
        values = predictor(batches, desc=f"{split} encoder outputs")[: encoded.num_windows]
        values = np.asarray(values, np.float32)  # (W, S, L + 1, H)
        feature_files.write_layer_cache(path, key, values)
        logging.info("%s: encoder outputs %s of %s written to %s", split, values.shape, loaded,
                     path)  # fmt: skip
    return dataclasses.replace(encoded, features=dict(encoded.features, layer_features=values))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Data first, TensorFlow later: bad input is reported in a second, before output_dir exists.
    from data_prep import conll, glue
    from data_prep.errors import InputError

    if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
        raise app.UsageError("at least one of --do_train, --do_eval or --do_predict must be set")
    for name in ("data_dir", "bert_config_file", "output_dir"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    s = FLAGS.max_seq_length
    if s < 3:
        raise app.UsageError(f"--max_seq_length={s} leaves no room for [CLS] word [SEP]")
    if not 0 <= FLAGS.window_overlap < s - 2:
        raise app.UsageError(
            f"--window_overlap={FLAGS.window_overlap} must be in [0, max_seq_length - 2 = {s - 2})"
        )
    settings = {
        "labels": list(FLAGS.label_list),
        "tag_scheme": FLAGS.tag_scheme,
        "feature_mode": FLAGS.feature_mode,
        "lstm_units": FLAGS.lstm_units,
        "lstm_layers": FLAGS.lstm_layers,
    }
    if not FLAGS.do_train:
        saved = _saved_model_settings(FLAGS.output_dir, FLAGS.init_checkpoint or "")
        if saved:
            for key in _MODEL_KEYS:
                flag = "label_list" if key == "labels" else key
                if FLAGS[flag].present and settings[key] != saved[0][key]:
                    raise app.UsageError(
                        f"--{flag}={FLAGS[flag].value} differs from {saved[1]}, which the model "
                        f"was trained with ({saved[0][key]})"
                    )
                settings[key] = saved[0][key]
            logging.info("model settings from %s", saved[1])
        elif not FLAGS.label_list or FLAGS.tag_scheme == "auto":
            raise app.UsageError(
                "without --do_train, give --label_list and --tag_scheme, or an --output_dir "
                "(or --init_checkpoint folder) holding the training run's model_config.json"
            )
    try:
        from data_prep import tokenization
        from modeling import elmo
        from training import xlnet_finetuning

        # An ELMo that reads words takes the data's own words (tokenization.WordTokenizer, made
        # once the splits are read); other models their --vocab_file.
        word_elmo = elmo.config_reads_words(FLAGS.bert_config_file)
        if word_elmo:
            tokenizer, packing = None, glue.BERT_PACKING  # [CLS] / [SEP] spelled <S> / </S>
        elif not FLAGS.vocab_file:
            raise app.UsageError("--vocab_file is required (only an ELMo reading words has none)")
        else:  # XLNet packs `pieces <sep> <cls>` with its own vocabulary.
            tokenizer, packing, _ = xlnet_finetuning.load_tokenizer(
                FLAGS.bert_config_file, FLAGS.vocab_file, FLAGS.do_lower_case,
                FLAGS["do_lower_case"].present,
            )  # fmt: skip

        def read(split, labelled=True):
            data = conll.read_conll(conll.find_split(FLAGS.data_dir, split), FLAGS.skip_bad_lines)
            if labelled and data.columns < 2:
                raise InputError(
                    f"{data.path}: expected a tag column for the {split} file, found one column"
                )
            logging.info(
                "%s: %d sentences, %d tokens, %d columns, %d documents",
                data.path,
                len(data.sentences),
                sum(len(x.words) for x in data.sentences),
                data.columns,
                data.documents,
            )
            return data

        train = read("train") if FLAGS.do_train else None
        if train is not None and settings["tag_scheme"] == "auto":
            settings["tag_scheme"] = conll.detect_scheme(train.sentences)
            logging.info("%s: tag scheme %s (detected)", train.path, settings["tag_scheme"])
        scheme = settings["tag_scheme"]
        repair = FLAGS.invalid_tags == "repair"

        def normalize(data):
            if data.columns < 2:
                return data.sentences
            done = conll.normalize_tags(data.sentences, scheme, repair)
            if done.converted:
                logging.info("%s: %d IOB1 tags converted to BIO", data.path, done.converted)
            if done.violations:
                logging.warning(
                    "%s: %d tags broke strict %s and were repaired as conlleval reads them "
                    "(first %s)",
                    data.path,
                    len(done.violations),
                    scheme,
                    "; ".join(done.violations[: conll.SHOWN]),
                )
            return done.sentences

        train_sentences = normalize(train) if train else None
        if train_sentences is not None:
            if settings["labels"]:
                where: dict = {}  # each tag outside --label_list -> where it first occurs
                for x in train_sentences:
                    for i, t in enumerate(x.tags):
                        if t not in settings["labels"]:
                            where.setdefault(t, x.at(i))
                if where:
                    first = next(iter(where))
                    raise InputError(
                        f"{where[first]}: expected a tag in --label_list {settings['labels']}, "
                        f"found {first!r} ({len(where)} such tags: {list(where)[:10]})"
                    )
            else:
                settings["labels"] = conll.label_list(train_sentences, conll.model_scheme(scheme))
        labels = settings["labels"]
        if len(labels) < 2 or len(set(labels)) != len(labels):
            raise InputError(f"expected at least two distinct labels, found {labels}")
        dev = read("dev") if FLAGS.do_eval else None
        dev_sentences = normalize(dev) if dev else None
        test = read("test", labelled=False) if FLAGS.do_predict else None
        test_sentences = normalize(test) if test else None
        if word_elmo:  # every word of the splits, cased as written, one token each
            splits = (train_sentences, dev_sentences, test_sentences)
            tokenizer = tokenization.WordTokenizer(
                w for sentences in splits for x in sentences or () for w in x.words
            )
    except InputError as e:
        raise SystemExit(f"run_ner: {e}") from None
    except ValueError as e:  # a bad --label_list / --tag_scheme combination
        raise app.UsageError(str(e)) from None
    logging.info("%d labels (%s): %s", len(labels), conll.model_scheme(scheme), " ".join(labels))

    def encode(sentences, name):
        encoded = conll.encode_sentences(
            sentences, labels, tokenizer, s, FLAGS.window_overlap, packing
        )
        conll.log_encoding(name, encoded, s)
        return encoded

    train_enc = encode(train_sentences, train.path) if train else None
    dev_enc = encode(dev_sentences, dev.path) if dev else None
    test_enc = encode(test_sentences, test.path) if test else None

    import keras
    import numpy as np
    import tensorflow as tf

    from data_prep import feature_files, features
    from modeling import bert, tagging
    from training import distribute, finetune_tasks, ner_eval, optimization, trainer

    # BERT, ALBERT, ELECTRA, XLNet or an ELMo biLM, told apart by the config's keys.
    try:
        config = tagging.load_config(FLAGS.bert_config_file, s, len(tokenizer.vocab))
    except InputError as e:
        raise SystemExit(f"run_ner: {e}") from None
    elmo_encoder = tagging.is_elmo(config)
    if elmo_encoder and (why := glue.elmo_packing_error(packing, FLAGS.vocab_file)):
        raise app.UsageError(why)
    if mismatch := glue.packing_mismatch(packing, config, FLAGS.bert_config_file):
        logging.warning(mismatch)
    if elmo_encoder and settings["feature_mode"] == "finetune":
        raise app.UsageError(
            "an ELMo biLM stays frozen (ELMo's downstream recipe): give a --feature_mode; "
            "sum_all is ELMo's scalar mix of every layer"
        )
    branches = FLAGS.encoder_branches
    if branches < 1 or (branches > 1 and elmo_encoder):
        raise app.UsageError(
            f"--encoder_branches={branches}: expected 1, or more for a Transformer encoder "
            f"(found {'an ELMo biLM' if elmo_encoder else 'a value below 1'})"
        )
    if FLAGS.remove_padding and (elmo_encoder or FLAGS.distribution_strategy == "tpu"):
        raise app.UsageError(
            "--remove_padding: runs a Transformer encoder's layers on the real tokens alone "
            f"(found {'an ELMo biLM' if elmo_encoder else 'a TPU, which needs static shapes'})"
        )
    if elmo_encoder and not word_elmo:
        # The biLM was pretrained on WordPiece blocks where [SEP] ends each document
        # (data_prep/create_lm_data.py) and never saw [CLS]: with [SEP] at both ends a sentence
        # looks to it like a document of its own.
        cls_sep = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
        train_enc, dev_enc, test_enc = (
            x and conll.with_token_id_replaced(x, *cls_sep) for x in (train_enc, dev_enc, test_enc)
        )
    try:
        tagging.layer_indices(settings["feature_mode"], tagging.encoder_layers(config))
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    cached = bool(FLAGS.feature_cache)
    if cached and (settings["feature_mode"] == "finetune" or not FLAGS.init_checkpoint):
        raise app.UsageError(
            "--feature_cache holds a frozen encoder's outputs: it needs a --feature_mode other "
            "than finetune and the encoder's --init_checkpoint"
        )
    try:
        trim = glue.dynamic_padding_setting(
            FLAGS.dynamic_padding,
            FLAGS["dynamic_padding"].present,
            [
                (elmo_encoder, "an ELMo biLM's tagger is not covered"),
                (cached, "--feature_cache holds full-length windows"),
                (FLAGS.distribution_strategy == "tpu", "a TPU needs static shapes"),
            ],
        )
        groups = glue.length_group_batches(FLAGS.group_by_length, trim)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    for name, encoded in (("train", train_enc), ("dev", dev_enc), ("test", test_enc)):
        if encoded:
            glue.log_real_tokens(
                name, encoded.features["input_mask"], s, "window" if trim else None
            )
    strategy, workers, worker_index = distribute.setup(
        FLAGS.distribution_strategy,
        FLAGS.tpu or "",
        {k: FLAGS[k].value for k in ("train_batch_size", "eval_batch_size", "predict_batch_size")},
    )
    num_train_steps = num_warmup_steps = 0
    if train_enc:
        num_train_steps, num_warmup_steps = optimization.train_and_warmup_steps(
            train_enc.num_windows,
            FLAGS.train_batch_size,
            FLAGS.num_train_epochs,
            FLAGS.warmup_proportion,
        )
        logging.info(
            "%d training windows from %d sentences: %d steps, %d warmup",
            train_enc.num_windows,
            len(train_sentences),
            num_train_steps,
            num_warmup_steps,
        )

    if cached:
        train_enc, dev_enc, test_enc = (
            _with_layer_features(
                x,
                name,
                FLAGS.feature_cache,
                FLAGS.init_checkpoint,
                config,
                strategy,
                workers,
                worker_index,
                FLAGS.predict_batch_size,
                branches,
                FLAGS.remove_padding,
                tokenizer.spelled_tokens() if word_elmo else None,
            )  # fmt: skip
            for x, name in ((train_enc, "train"), (dev_enc, "dev"), (test_enc, "test"))
        )
    keras.utils.set_random_seed(FLAGS.random_seed)
    with strategy.scope(), optimization.dtype_policy(FLAGS.precision):
        model = tagging.tagger_class(config, cached)(
            config,
            len(labels),
            feature_mode=settings["feature_mode"],
            lstm_units=settings["lstm_units"],
            lstm_layers=settings["lstm_layers"],
        )
        model.build()
        if word_elmo and not cached:  # the ids index this run's words
            model.encoder.read_words(tokenizer.spelled_tokens())
        try:  # a cached run's tagger holds no encoder; TPUs and ELMo were refused before
            bert.set_execution_options(
                model,
                1 if cached else branches,
                FLAGS.remove_padding and not cached,
                FLAGS.xla_weight_gradients,
            )
        except ValueError as e:  # e.g. a tagger in bf16
            raise app.UsageError(str(e)) from None
        optimizer = finetune_tasks.create_finetuning_optimizer(
            FLAGS.learning_rate,
            max(num_train_steps, 1),
            num_warmup_steps,
            getattr(config, "num_hidden_layers", tagging.encoder_layers(config)),
            FLAGS.layerwise_lr_decay,
            getattr(config, "num_hidden_groups", None),  # ALBERT's shared groups
        )
        optimizer = optimization.with_loss_scaling(optimizer, FLAGS.precision)
        # Built under the scope before the first step (shared/NOTES.md).
        optimizer.build(model.trainable_variables)
    logging.info(
        "%s tagger: %d trainable weights of %d",
        settings["feature_mode"],
        sum(int(np.prod(v.shape)) for v in model.trainable_variables),
        sum(int(np.prod(v.shape)) for v in model.variables),
    )
    # Logits back at the full length: windows, labels and reassembly are all (W, S).
    predictor = finetune_tasks.Predictor(strategy, model, sequence_length=s if trim else None)
    output_dir = FLAGS.output_dir
    best = finetune_tasks.BestCheckpoint(os.path.join(output_dir, "best"), model)

    def predict(encoded, batch_size, desc):
        """(tags per sentence, logits (W, S, C)) of one encoded set; desc names its progress
        bar."""
        batches = glue.eval_batches(encoded.features, batch_size, workers, worker_index)
        if trim:
            batches = batches.map(features.trim_to_longest)
        logits = predictor(batches, desc=desc)[: encoded.num_windows]
        return conll.reassemble(encoded, np.argmax(logits, axis=-1), labels), logits

    def score(sentences, encoded, batch_size, desc):
        """(flat results, full scores, predicted tags) against the gold tags."""
        tags, logits = predict(encoded, batch_size, desc)
        scores = ner_eval.evaluate([x.tags for x in sentences], tags)
        f = encoded.features
        loss = ner_eval.tagging_loss(logits, f["label_ids"], f["label_weights"])
        return ner_eval.flat_results(scores) | {"loss": loss}, scores, tags

    last_eval: dict = {}

    def eval_fn() -> dict:
        step = int(optimizer.iterations.numpy())
        results, scores, tags = score(
            dev_sentences, dev_enc, FLAGS.eval_batch_size, "evaluating dev"
        )
        last_eval.update(step=step, results=results, scores=scores, tags=tags)
        # The untrained model at step 0 is no candidate: its random tags can score a sliver of
        # F1 above a trained model that has so far learnt only O, and would then be kept.
        if step > 0 and best.update(results["f1"], step, results):
            logging.info("new best dev F1 %.4f at step %d, kept in %s", results["f1"], step,
                         best.directory)  # fmt: skip
        # The log and eval_log.jsonl get the overall scores; per-type ones go to the files.
        return {k: v for k, v in results.items() if k in _OVERALL}

    def init_fn():
        loaded, part = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
        logging.info("initialised the %s from %s", part, loaded)

    if FLAGS.do_train:
        if tf.train.latest_checkpoint(output_dir) is None:
            best.clear()  # a fresh run: a kept best from another run must not survive
        if model.frozen and not FLAGS.init_checkpoint:
            logging.warning("--feature_mode=%s without --init_checkpoint: the frozen encoder is "
                            "random", settings["feature_mode"])  # fmt: skip
        train_file = os.path.join(output_dir, "train.tf_record")
        if not cached:
            conll.write_tfrecord(train_file, train_enc.features)

        def train_dataset():
            b = FLAGS.train_batch_size // workers
            if cached:
                return feature_files.in_memory_training_batches(
                    train_enc.features, b, FLAGS.random_seed, workers, worker_index
                )
            return features.tagging_dataset(
                [train_file],
                b,
                s,
                FLAGS.random_seed,
                num_shards=workers,
                shard_index=worker_index,
                skip_corrupt_records=FLAGS.skip_corrupt_records,
                dynamic_padding=trim,
                length_group_batches=groups,
            )

        run_config = {
            "bert_config": config.to_dict(),
            "task": "ner",
            "max_seq_length": s,
            **{k: settings[k] for k in _MODEL_KEYS},
        }
        # The dev split's loss is logged as "loss"; its entity F1 only held out.
        curves = [("tagging_loss", "loss"), "token_accuracy"] + (["f1"] if FLAGS.do_eval else [])
        trainer.run_training(
            trainer.Trainer(strategy, finetune_tasks.token_tagging_task(model), optimizer),
            lambda: train_dataset(),
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
                input_files=() if cached else (train_file,),
            ),
            global_batch_size=FLAGS.train_batch_size,
            eval_fn=eval_fn if FLAGS.do_eval else None,
            # Cached: the encoder's weights came in through its outputs.
            init_fn=init_fn if FLAGS.init_checkpoint and not cached else None,
        )
    else:
        # Evaluate or predict with the kept best, else the latest checkpoint, else the given one.
        source = best.prefix or tf.train.latest_checkpoint(output_dir)
        if not cached:  # cached: --init_checkpoint is the encoder's, not the tagger's
            source = source or FLAGS.init_checkpoint
        if not source:
            raise app.UsageError(
                f"nothing to evaluate: {output_dir} holds no checkpoint and --init_checkpoint "
                "is empty"
            )
        loaded, part = trainer.init_from_checkpoint(model, source)
        if part != "model":
            logging.warning("%s holds no tagger head: its outputs are untrained", loaded)
        logging.info("evaluating %s", loaded)

    def write_outputs(prefix, sentences, tags, scores):
        gold = [x.tags for x in sentences] if scores is not None else None
        path = ner_eval.write_predictions(
            os.path.join(output_dir, f"{prefix}_predictions.txt"),
            [x.words for x in sentences],
            gold,
            tags,
        )
        logging.info("wrote %d tagged sentences to %s", len(tags), path)
        if scores is not None:
            report = ner_eval.report(scores)
            # Atomically (temp file + rename), as every other output; the report ends with "\n".
            report_file = os.path.join(output_dir, f"{prefix}_conlleval.txt")
            conll.write_lines(report_file, report.splitlines())
            logging.info("%s (conlleval):\n%s", prefix, report)

    if FLAGS.do_eval:
        step = int(optimizer.iterations.numpy())
        if last_eval.get("step") != step:
            results, scores, tags = score(
                dev_sentences, dev_enc, FLAGS.eval_batch_size, "evaluating dev"
            )
            last_eval.update(step=step, results=results, scores=scores, tags=tags)
        results = dict(last_eval["results"], global_step=step)
        if best.info:
            results |= {"best_f1": best.info["score"], "best_step": best.info["step"]}
        trainer.write_eval_results(output_dir, results)
        write_outputs("dev", dev_sentences, last_eval["tags"], last_eval["scores"])

    if FLAGS.do_predict:
        if FLAGS.do_train and best.prefix:
            trainer.restore_model_weights(model, best.prefix)
            logging.info("predicting with the best dev checkpoint %s", best.prefix)
        labelled = test.columns > 1
        if labelled:
            results, scores, tags = score(
                test_sentences, test_enc, FLAGS.predict_batch_size, "predicting test"
            )
            path = os.path.join(output_dir, "test_results.txt")
            with open(path + ".tmp", "w") as f:
                f.writelines(f"{k} = {results[k]}\n" for k in sorted(results))
            os.replace(path + ".tmp", path)
            logging.info("test entity F1 %.4f (%s)", results["f1"], path)
        else:
            tags, scores = predict(test_enc, FLAGS.predict_batch_size, "predicting test")[0], None
        write_outputs("test", test_sentences, tags, scores)


if __name__ == "__main__":
    app.run(main)
