"""Writes per-token features of chosen Transformer layers of a frozen BERT, as the original did.

Example:
  python extract_features.py --input_file=input.txt --output_file=features.jsonl \
    --npz_file=features.npz --vocab_file=default_run/vocab.txt \
    --bert_config_file=default_run/bert_config.json --init_checkpoint=default_run/pretrain \
    --layers=-1,-2,-3,-4 --max_seq_length=128 --batch_size=8

Input: one example a line, `text_a` or `text_a ||| text_b`. --output_file gets the original's JSON
lines (linex_index, then for every WordPiece, [CLS] and [SEP] included, its values in each layer
of --layers, rounded to 6 decimals); --npz_file (optional) the same unrounded in a compact numpy
file (data_prep/feature_files.py describes both). --layers counts as the original's: -1 is the
last Transformer layer, 0 the first. A line longer than max_seq_length is truncated as the
original does (longer text first) and counted in a warning naming its line.
An ELMo options.json (modeling/elmo.py) as --bert_config_file writes its biLM's representations
instead (--layers: 0 the token layer, k the k-th biLSTM layer, -1 the top; default all) followed
by the ELMo vector, their scalar mix, under index L + 1. A biLM that reads words (a published
ELMo converted by `convert_checkpoint.py --from=bilm_hdf5`: its options.json has a character CNN and
no n_tokens_vocab) needs no --vocab_file: each line is split into words (--elmo_word_split), put
between <S> and </S> as AllenNLP's Elmo does, and every word gets its representations (the markers
are not written). Example:
  python extract_features.py --input_file=input.txt --output_file=elmo.jsonl \
    --bert_config_file=converted/elmo/bert_config.json --init_checkpoint=converted/elmo
"""

from __future__ import annotations

from absl import app, flags, logging

flags.DEFINE_string("input_file", None, "Text file: one `text_a [||| text_b]` example a line.")
flags.DEFINE_string("output_file", None, "JSON lines output (the original's format).")
flags.DEFINE_string("npz_file", None, "Optional compact output: a numpy .npz of float32 values.")
flags.DEFINE_list("layers", ["-1", "-2", "-3", "-4"], "Transformer layers to write (-1 = last).")
flags.DEFINE_string(
    "vocab_file",
    None,
    "WordPiece vocabulary the model was trained with, or a RoBERTa checkpoint's byte-level BPE "
    "folder (vocab.json + merges.txt: <s> a </s></s> b </s>). None for an ELMo that reads words.",
)
flags.DEFINE_string("bert_config_file", None, "JSON config of the BERT model (original fields).")
flags.DEFINE_string("init_checkpoint", None, "Cloze checkpoint (prefix or folder) to read.")
flags.DEFINE_bool(
    "do_lower_case",
    True,
    "Lower-case the input (uncased vocabularies); a RoBERTa BPE folder only when given explicitly.",
)
flags.DEFINE_integer("max_seq_length", 128, "WordPieces per example, [CLS] and [SEP] included.")
flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
flags.DEFINE_enum(
    "distribution_strategy",
    "one_device",
    ["one_device", "mirrored", "multi_worker_mirrored", "tpu"],
    "tf.distribute strategy.",
)
flags.DEFINE_string("tpu", None, "TPU address for TPUClusterResolver (grpc://..., name or local).")
flags.DEFINE_enum(
    "elmo_word_split",
    "basic",
    ["basic", "whitespace"],
    "An ELMo that reads words (a published options.json: a character CNN, no n_tokens_vocab; no "
    "--vocab_file): how a line becomes words. basic: BERT's BasicTokenizer, cased unless "
    "--do_lower_case is given (whitespace, punctuation split off); whitespace: the line's "
    "whitespace-separated words as they are (text tokenized as the biLM's training text was).",
)
FLAGS = flags.FLAGS


def feature_model(config, layers):
    """The frozen model whose call gives float32 (B, S, K, H), the `layers` of the encoder that
    `config` describes (a BertConfig, AlbertConfig or ElectraConfig: modeling/finetuning's
    encoder_for picks the backbone). Raises ValueError for a layer the encoder lacks."""
    from modeling import tagging

    return tagging.BertLayerFeatures(config, layers)


def word_inputs(words, max_characters: int) -> dict:
    """An ELMo that reads words: ElmoFeatures' inputs for lines of words (each between <S> and
    </S>, elmo.sentence_char_ids) and the zero labels glue.eval_batches pads by."""
    import numpy as np

    from modeling import elmo

    chars, mask = elmo.sentence_char_ids(words, max_characters)
    return {
        "input_ids": np.zeros(mask.shape, np.int32),
        "input_mask": mask,
        "char_ids": chars,
        "label_ids": np.zeros(len(words), np.int32),
    }


def split_words(lines, max_words: int) -> list:
    """Each line's words for an ELMo that reads words (--elmo_word_split), at most max_words;
    refuses `text_a ||| text_b` lines (a biLM reads one text) and warns of cut lines."""
    from data_prep import tokenization

    pair = next((x for x in lines if x.text_b is not None), None)
    if pair is not None:
        raise app.UsageError(
            f"{FLAGS.input_file}:{pair.line}: expected one text a line for an ELMo biLM, "
            "found a `text_a ||| text_b` pair"
        )
    # Cased unless --do_lower_case is given: ELMo's characters keep the case.
    lower = FLAGS.do_lower_case and FLAGS["do_lower_case"].present
    splitter = tokenization.WordTokenizer((), FLAGS.elmo_word_split, lower)
    words = [splitter.tokenize(x.text_a) for x in lines]
    cut = [f"{FLAGS.input_file}:{x.line}" for x, w in zip(lines, words) if len(w) > max_words]
    if cut:
        logging.warning(
            "%s: %d of %d lines had more than %d words (max_seq_length=%d less <S> and </S>) "
            "and were cut, e.g. %s",
            FLAGS.input_file, len(cut), len(lines), max_words, FLAGS.max_seq_length,
            ", ".join(cut[:5]),
        )  # fmt: skip
    return [w[:max_words] for w in words]


def write_features(
    model, lines, tokens, inputs_of, first: int, layers, width, strategy_info, input_keys=None
):
    """Loads --init_checkpoint into the frozen `model` (built under the strategy), runs it over
    the lines in chunks and writes each line's tokens and values.

    tokens: each line's tokens as written; inputs_of(start, stop) -> the model's input arrays of
    lines[start:stop]; first: where a line's first written token sits in the outputs (1 after
    ELMo's <S>, else 0); strategy_info: distribute.setup's (strategy, workers, worker_index);
    input_keys: the arrays the model reads (None: the encoder's three)."""
    import numpy as np
    from tqdm import tqdm

    from data_prep import feature_files, glue
    from training import finetune_tasks, trainer

    strategy, workers, worker_index = strategy_info
    loaded, _ = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
    logging.info("extracting layers %s of %s", layers, loaded)
    total = sum(len(t) for t in tokens)
    writer = feature_files.FeatureWriter(
        FLAGS.output_file, FLAGS.npz_file, total, len(lines), layers, width
    )
    predictor = finetune_tasks.Predictor(strategy, model, input_keys=input_keys)
    n, b = len(lines), FLAGS.batch_size
    step = 64 * b  # lines per prediction call: bounds the memory the outputs take
    with tqdm(total=n, desc="extracting", unit=" lines", mininterval=2.0) as bar:
        for start in range(0, n, step):
            stop = min(n, start + step)
            batches = glue.eval_batches(inputs_of(start, stop), b, workers, worker_index)
            values = predictor(batches)  # (rows, S, K, H), padding rows at the end
            for i, row in enumerate(range(start, stop)):
                k = len(tokens[row])
                writer.write(
                    feature_files.LineFeatures(
                        lines[row].unique_id,
                        tokens[row],
                        np.asarray(values[i, first : first + k]),
                        tuple(layers),
                    )
                )
            bar.update(stop - start)
    writer.close()
    for path in (FLAGS.output_file, FLAGS.npz_file):
        if path:
            logging.info("wrote %s", path)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from data_prep import feature_files, glue
    from data_prep.errors import InputError
    from modeling import albert, bert, elmo
    from training import distribute

    for name in ("input_file", "bert_config_file", "init_checkpoint"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    if not (FLAGS.output_file or FLAGS.npz_file):
        raise app.UsageError("--output_file (JSON lines) or --npz_file is required")
    try:
        layers = [int(x) for x in FLAGS.layers]
    except ValueError:
        raise app.UsageError(f"--layers: expected integers, found {FLAGS.layers}") from None
    s = FLAGS.max_seq_length
    try:
        values = bert.read_config_json(FLAGS.bert_config_file, "a model config JSON file")
        lines = feature_files.read_input_lines(FLAGS.input_file)
        elmo_config = None
        if elmo.is_elmo_config(values):
            elmo_config = elmo.ElmoConfig.from_dict(values, FLAGS.bert_config_file)
    except InputError as e:
        raise SystemExit(f"extract_features: {e}") from None

    def setup():  # (strategy, workers, worker_index)
        return distribute.setup(
            FLAGS.distribution_strategy, FLAGS.tpu or "", {"batch_size": FLAGS.batch_size}
        )

    def elmo_model(strategy, vocab_size=None):
        """The chosen biLM layers (default all L + 1) and their scalar mix."""
        try:
            with strategy.scope():
                return elmo.build_features_model(
                    elmo_config, layers if FLAGS["layers"].present else None, vocab_size
                )  # (model, written layer indices, width)
        except ValueError as e:
            raise app.UsageError(f"{FLAGS.bert_config_file}: {e}") from None

    if elmo_config is not None and elmo.reads_words(elmo_config):
        if s < 3:
            raise app.UsageError(f"--max_seq_length={s} leaves no room for <S> word </S>")
        words = split_words(lines, s - 2)
        logging.info("%s: %d lines, %d words", FLAGS.input_file, len(lines), sum(map(len, words)))
        strategy_info = setup()
        model, written, width = elmo_model(strategy_info[0])
        c = elmo_config.char_cnn.max_characters_per_token
        write_features(
            model, lines, words, lambda a, z: word_inputs(words[a:z], c), 1, list(written), width,
            strategy_info, ("input_ids", "input_mask", "char_ids"),
        )  # fmt: skip
        return
    if not FLAGS.vocab_file:
        raise app.UsageError("--vocab_file is required (only an ELMo that reads words has none)")
    try:  # WordPiece, or a RoBERTa checkpoint's byte-level BPE folder (glue.load_tokenizer)
        given = FLAGS["do_lower_case"].present
        tokenizer, packing = glue.load_tokenizer(FLAGS.vocab_file, FLAGS.do_lower_case, given)
    except InputError as e:
        raise SystemExit(f"extract_features: {e}") from None
    if s < packing.pair_specials:
        raise app.UsageError(f"--max_seq_length={s} leaves no room for {packing.pair_form}")
    task = glue.TaskSpec("features", glue.CLASSIFICATION, ("0",), ("accuracy",), None, (), ())
    examples = [
        glue.Example(f"{FLAGS.input_file}:{x.line}", str(x.unique_id), x.text_a, x.text_b)
        for x in lines
    ]
    encoded = glue.encode_examples(examples, task, tokenizer, s, packing)
    glue.log_truncation(FLAGS.input_file, encoded, s)
    lengths = encoded.features["input_mask"].sum(axis=1)  # (N,) tokens per line
    logging.info("%s: %d lines, %d tokens", FLAGS.input_file, len(lines), int(lengths.sum()))
    ids = encoded.features["input_ids"]
    tokens = [tokenizer.convert_ids_to_tokens(ids[i, : lengths[i]]) for i in range(len(lines))]
    strategy_info = setup()
    strategy = strategy_info[0]
    if elmo_config is not None:  # a biLM pretrained on this vocabulary's WordPieces
        if why := glue.elmo_packing_error(packing, FLAGS.vocab_file):
            raise app.UsageError(why)
        model, layers, width = elmo_model(strategy, len(tokenizer.vocab))
        layers = list(layers)
    else:
        # BERT, ALBERT or ELECTRA, told apart by the config's keys (as run_classifier does).
        try:
            config = albert.load_encoder_config(FLAGS.bert_config_file, s, len(tokenizer.vocab))
        except InputError as e:
            raise SystemExit(f"extract_features: {e}") from None
        if mismatch := glue.packing_mismatch(packing, config, FLAGS.bert_config_file):
            logging.warning(mismatch)
        with strategy.scope():
            try:
                model = feature_model(config, layers)
            except ValueError as e:
                raise app.UsageError(f"--layers: {e}") from None
            model.build()
        width = config.hidden_size

    def inputs_of(start, stop):
        return {k: v[start:stop] for k, v in encoded.features.items()}

    write_features(model, lines, tokens, inputs_of, 0, layers, width, strategy_info)


if __name__ == "__main__":
    app.run(main)
