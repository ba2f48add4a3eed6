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
by the ELMo vector, their scalar mix, under index L + 1.
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
    "folder (vocab.json + merges.txt: <s> a </s></s> b </s>).",
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
FLAGS = flags.FLAGS


def feature_model(config, layers):
    """The frozen model whose call gives float32 (B, S, K, H), the `layers` of the encoder that
    `config` describes (a BertConfig, AlbertConfig or ElectraConfig: modeling/finetuning's
    encoder_for picks the backbone). Raises ValueError for a layer the encoder lacks."""
    from modeling import tagging

    return tagging.BertLayerFeatures(config, layers)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from data_prep import feature_files, glue
    from data_prep.errors import InputError

    for name in ("input_file", "vocab_file", "bert_config_file", "init_checkpoint"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required")
    if not (FLAGS.output_file or FLAGS.npz_file):
        raise app.UsageError("--output_file (JSON lines) or --npz_file is required")
    try:
        layers = [int(x) for x in FLAGS.layers]
    except ValueError:
        raise app.UsageError(f"--layers: expected integers, found {FLAGS.layers}") from None
    s = FLAGS.max_seq_length
    try:  # WordPiece, or a RoBERTa checkpoint's byte-level BPE folder (glue.load_tokenizer)
        given = FLAGS["do_lower_case"].present
        tokenizer, packing = glue.load_tokenizer(FLAGS.vocab_file, FLAGS.do_lower_case, given)
        lines = feature_files.read_input_lines(FLAGS.input_file)
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

    import numpy as np
    from tqdm import tqdm

    from modeling import albert, bert, elmo
    from training import distribute, finetune_tasks, trainer

    strategy, workers, worker_index = distribute.setup(
        FLAGS.distribution_strategy, FLAGS.tpu or "", {"batch_size": FLAGS.batch_size}
    )
    try:
        values = bert.read_config_json(FLAGS.bert_config_file, "a model config JSON file")
    except InputError as e:
        raise SystemExit(f"extract_features: {e}") from None
    if elmo.is_elmo_config(values):  # the chosen biLM layers (default all) and their scalar mix
        if why := glue.elmo_packing_error(packing, FLAGS.vocab_file):
            raise app.UsageError(why)
        try:
            with strategy.scope():
                model, layers, width = elmo.build_features_model(
                    elmo.ElmoConfig.from_dict(values, FLAGS.bert_config_file),
                    layers if FLAGS["layers"].present else None,
                    len(tokenizer.vocab),
                )
        except (InputError, ValueError) as e:
            raise app.UsageError(f"{FLAGS.bert_config_file}: {e}") from None
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
    loaded, _ = trainer.init_from_checkpoint(model, FLAGS.init_checkpoint)
    logging.info("extracting layers %s of %s", layers, loaded)

    writer = feature_files.FeatureWriter(
        FLAGS.output_file, FLAGS.npz_file, int(lengths.sum()), len(lines), layers, width
    )
    predictor = finetune_tasks.Predictor(strategy, model)
    ids = encoded.features["input_ids"]
    n, b = len(lines), FLAGS.batch_size
    step = 64 * b  # lines per prediction call: bounds the memory the outputs take
    with tqdm(total=n, desc="extracting", unit=" lines", mininterval=2.0) as bar:
        for start in range(0, n, step):
            part = {k: v[start : start + step] for k, v in encoded.features.items()}
            batches = glue.eval_batches(part, b, workers, worker_index)
            values = predictor(batches)  # (rows, S, K, H), padding rows at the end
            for i in range(min(step, n - start)):
                row = start + i
                k = int(lengths[row])
                writer.write(
                    feature_files.LineFeatures(
                        lines[row].unique_id,
                        tokenizer.convert_ids_to_tokens(ids[row, :k]),
                        np.asarray(values[i, :k]),
                        tuple(layers),
                    )
                )
            bar.update(min(step, n - start))
    writer.close()
    for path in (FLAGS.output_file, FLAGS.npz_file):
        if path:
            logging.info("wrote %s", path)


if __name__ == "__main__":
    app.run(main)
