"""Text corpus -> pre-training TFRecords (masked LM + next sentence prediction, or another recipe).

The original google-research/bert script's flags and defaults. Input: one sentence per line, a
blank line between documents. Three ways to make the records:
  default            streaming (data_prep/pretraining_shards.py): each input file is cut into
                     chunks of about --chunk_bytes of whole documents, each chunk made into
                     instances on its own (random next segments from the chunk's other documents,
                     shuffled within the chunk) on --num_workers processes; memory stays bounded
                     whatever the corpus size, and the bytes written depend on the seed, the flags
                     and --chunk_bytes, never on --num_workers.
  --beam             the same streaming creation as an Apache Beam pipeline
                     (data_prep/beam_pipeline.py; the DirectRunner here, Dataflow, Flink or Spark
                     through --beam_options): the same files, byte for byte.
  --compat_original  the original's algorithm on the whole corpus in memory, one core: given the
                     same text, vocabulary and seed it writes the original script's records.
Other recipes by flag: --sentence_objective=sop (ALBERT) or none (RoBERTa, with --full_sentences
packing across documents); --masking_scheme=ngram (ALBERT) or span (SpanBERT, with span boundary
features); --masking=dynamic writes unmasked records that run_pretraining --masking=dynamic masks
each time it reads them (RoBERTa). --vocab_file may be an ALBERT SentencePiece model (its
spiece.model, or a folder holding it) instead of a WordPiece vocab.txt: its pieces (ALBERT's
preprocessing, lower-cased by --do_lower_case), whole-word and n-gram masking over ALBERT's word
starts (a piece with the word boundary, or punctuation: pretraining_data.spiece_word_start);
streaming and --beam only (--compat_original is the original's WordPiece tokenization).

Example:
  python data_prep/create_pretraining_data.py \\
    --input_file='corpus/*.txt' --output_file=work_dir/data/a.tfrecord,work_dir/data/b.tfrecord \\
    --vocab_file=vocab.txt --do_lower_case=True --max_seq_length=128 \\
    --max_predictions_per_seq=20 --masked_lm_prob=0.15 --random_seed=12345 --dupe_factor=10
"""

import random
import shlex
import sys
import time
from pathlib import Path

from absl import app, flags, logging

# Run as a script, so the repository root is not on the path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

flags.DEFINE_string("input_file", None, "Input text file(s): a comma list of files or globs.")
flags.DEFINE_string("output_file", None, "Output TFRecord file(s): a comma list, one per shard.")
flags.DEFINE_string(
    "vocab_file",
    None,
    "The WordPiece vocab.txt the model is trained with, or an ALBERT SentencePiece model "
    "(spiece.model, or a folder holding it).",
)
flags.DEFINE_bool("do_lower_case", True, "Lower-case the text (True for uncased vocabularies).")
flags.DEFINE_bool("do_whole_word_mask", False, "Mask all word pieces of a word or none of them.")
flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length, [CLS] and [SEP]s included.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum masked LM predictions per sequence.")
flags.DEFINE_integer("random_seed", 12345, "Random seed: the same seed gives the same files.")
flags.DEFINE_integer("dupe_factor", 10, "Passes over the corpus, each with different masks.")
flags.DEFINE_float("masked_lm_prob", 0.15, "Fraction of tokens to predict.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter than maximum target length.")
flags.DEFINE_enum(
    "sentence_objective",
    "nsp",
    ["nsp", "sop", "none"],
    "nsp: B is the next segment or a random one (BERT). sop: A and B are consecutive segments, "
    "swapped half the time (ALBERT). none: one segment per sequence, no label (RoBERTa).",
)
flags.DEFINE_bool(
    "full_sentences",
    False,
    "With --sentence_objective=none: pack sentences across document boundaries with an extra "
    "[SEP] between documents (RoBERTa's FULL-SENTENCES); else sequences stay in one document.",
)
flags.DEFINE_enum(
    "masking_scheme",
    "token",
    ["token", "whole_word", "ngram", "span"],
    "token: BERT. whole_word: the same as --do_whole_word_mask. ngram: ALBERT's n-grams of up to "
    "3 words. span: SpanBERT's geometric spans of whole words, with span boundary features.",
)
flags.DEFINE_enum(
    "masking",
    "static",
    ["static", "dynamic"],
    "static: masks are chosen here and written. dynamic: records are written unmasked, for "
    "run_pretraining --masking=dynamic.",
)

flags.DEFINE_bool(
    "compat_original",
    False,
    "Make the original script's records (whole corpus in memory, random next segments from any "
    "document, one global shuffle, one core) instead of streaming bounded chunks.",
)
flags.DEFINE_integer(
    "num_workers",
    None,
    "Worker processes for streaming (default: the cores this process may use). The records do "
    "not depend on it.",
)
flags.DEFINE_integer(
    "chunk_bytes",
    1 << 20,
    "Streaming: text per chunk, cut at document ends. Bounds memory (about 2 x num_workers chunks "
    "in flight) and is the pool random next segments are drawn from; changes the records.",
)

flags.DEFINE_bool(
    "beam",
    False,
    "Run the streaming creation as an Apache Beam pipeline (same records, byte for byte); "
    "--beam_options picks the runner.",
)
flags.DEFINE_string(
    "beam_options",
    "",
    "With --beam: Beam's own pipeline options as one string, e.g. \"--runner=DataflowRunner "
    '--project=P --region=R --temp_location=gs://b/tmp" (data_prep/beam_pipeline.py lists '
    "Dataflow, Flink and Spark settings). Empty: the DirectRunner in this process.",
)

FLAGS = flags.FLAGS


def _split(spec: str) -> list[str]:
    return [part.strip() for part in spec.split(",") if part.strip()]


for _name in ("input_file", "output_file", "vocab_file"):
    flags.mark_flag_as_required(_name)
for _name in ("masked_lm_prob", "short_seq_prob"):
    flags.register_validator(_name, lambda p: 0.0 <= p <= 1.0, "must be a probability in [0, 1]")
flags.register_validator(
    "max_seq_length", lambda s: s >= 5, "must be at least 5 to hold [CLS] A [SEP] B [SEP]"
)
flags.register_validator("dupe_factor", lambda d: d >= 1, "must be at least 1")
flags.register_validator("chunk_bytes", lambda b: b >= 1, "must be at least 1")
flags.register_validator("num_workers", lambda n: n is None or n >= 1, "must be at least 1")
flags.register_validator("max_predictions_per_seq", lambda p: p >= 1, "must be at least 1")
flags.register_multi_flags_validator(
    ["max_predictions_per_seq", "max_seq_length"],
    lambda f: f["max_predictions_per_seq"] <= f["max_seq_length"],
    "--max_predictions_per_seq cannot exceed --max_seq_length (were they swapped?)",
)
flags.register_multi_flags_validator(
    ["full_sentences", "sentence_objective"],
    lambda f: not f["full_sentences"] or f["sentence_objective"] == "none",
    "--full_sentences packs one segment per sequence, with no sentence pairs: add "
    "--sentence_objective=none",
)
flags.register_multi_flags_validator(
    ["masking", "masking_scheme", "do_whole_word_mask"],
    lambda f: (
        f["masking"] == "static" or (f["masking_scheme"] == "token" and not f["do_whole_word_mask"])
    ),
    "--masking=dynamic leaves the choice of masks to run_pretraining, which masks single tokens: "
    "drop --masking_scheme / --do_whole_word_mask, or use --masking=static",
)
flags.register_multi_flags_validator(
    ["beam", "compat_original"],
    lambda f: not (f["beam"] and f["compat_original"]),
    "--beam runs the streaming creation; --compat_original is the whole-corpus one: pick one",
)
flags.register_multi_flags_validator(
    ["beam", "beam_options"],
    lambda f: f["beam"] or not f["beam_options"],
    "--beam_options without --beam would be ignored: add --beam",
)
flags.register_validator(
    "output_file",
    lambda spec: spec is None or (_split(spec) and len(set(_split(spec))) == len(_split(spec))),
    "must name one or more distinct files, comma-separated",
)


def _log_records(records: list[bytes], inv_vocab: dict[int, str]) -> None:
    """Logs records as the original logged its first instances: tokens and features."""
    from data_prep.pretraining_shards import decode_example

    for record in records:
        feature = decode_example(record)
        ids = feature["input_ids"][: sum(feature["input_mask"])]
        logging.info("*** Example ***")
        logging.info("tokens: %s", " ".join(inv_vocab.get(i, f"<id {i}>") for i in ids))
        for name in ("segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"):
            if name in feature:
                logging.info("%s: %s", name, " ".join(map(str, feature[name])))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Imported here, not at the top, so that --help and flag errors answer at once. TensorFlow
    # is imported only by --beam, --compat_original and paths with a scheme (gs://): its import
    # takes longer than streaming the default corpus at --dupe_factor=1.
    from tqdm import tqdm

    from data_prep import files, parallel, pretraining_shards, spiece
    from data_prep.errors import InputError
    from data_prep.pretraining_data import vocab_tokenizer

    logging.set_verbosity(logging.INFO)
    # A full-length sequence wants round(S * masked_lm_prob) predictions; fewer slots silently
    # lower its mask rate (the original README: set P to about S * masked_lm_prob).
    wanted = int(round(FLAGS.max_seq_length * FLAGS.masked_lm_prob))
    if FLAGS.max_predictions_per_seq < wanted:
        logging.warning(
            "--max_predictions_per_seq=%d < round(--max_seq_length * --masked_lm_prob) = %d: "
            "full-length sequences get a mask rate of %.3f instead of %.3f.",
            FLAGS.max_predictions_per_seq,
            wanted,
            FLAGS.max_predictions_per_seq / FLAGS.max_seq_length,
            FLAGS.masked_lm_prob,
        )
    logging.info(
        "Pass --max_seq_length=%d --max_predictions_per_seq=%d --sentence_objective=%s "
        "--masking=%s%s to run_pretraining.py as well.",
        FLAGS.max_seq_length,
        FLAGS.max_predictions_per_seq,
        FLAGS.sentence_objective,
        FLAGS.masking,
        " --span_boundary_objective" if FLAGS.masking_scheme == "span" else "",
    )

    output_files = _split(FLAGS.output_file)
    files.make_parent_folders(output_files)
    try:
        input_files = files.expand_input_files(FLAGS.input_file)
        make_tokenizer, vocab, masking_vocab = vocab_tokenizer(
            FLAGS.vocab_file, FLAGS.do_lower_case
        )
        sentencepiece = spiece.model_file(FLAGS.vocab_file) is not None
        if sentencepiece and FLAGS.compat_original:
            raise app.UsageError(
                "--compat_original runs the original script's WordPiece tokenization; "
                f"--vocab_file={FLAGS.vocab_file} is a SentencePiece model"
            )
        logging.info("Reading %d file(s): %s", len(input_files), ", ".join(input_files))
        settings = pretraining_shards.ChunkSettings(
            vocab=masking_vocab,
            max_seq_length=FLAGS.max_seq_length,
            max_predictions_per_seq=FLAGS.max_predictions_per_seq,
            dupe_factor=FLAGS.dupe_factor,
            short_seq_prob=FLAGS.short_seq_prob,
            masked_lm_prob=FLAGS.masked_lm_prob,
            random_seed=FLAGS.random_seed,
            sentence_objective=FLAGS.sentence_objective,
            masking_scheme="whole_word"
            if FLAGS.do_whole_word_mask and FLAGS.masking_scheme == "token"
            else FLAGS.masking_scheme,
            static_masking=FLAGS.masking == "static",
            full_sentences=FLAGS.full_sentences,
        )
        if FLAGS.beam:
            from data_prep import beam_pipeline

            options = shlex.split(FLAGS.beam_options)
            logging.info("Apache Beam pipeline, options %s", options or "(DirectRunner)")
            beam_pipeline.run(
                input_files,
                output_files,
                make_tokenizer,
                settings,
                chunk_bytes=FLAGS.chunk_bytes,
                beam_options=options,
            )
            return
        if not FLAGS.compat_original:
            # The workers tokenize with FullTokenizer: the same ids as InGraphTokenizer (tested)
            # and, for ASCII text, faster than it without TensorFlow's start-up.
            tokenizer = make_tokenizer()
            num_workers = parallel.worker_count(FLAGS.num_workers)
            inv_vocab = {i: t for t, i in vocab.items()}
            with files.bytes_bar(input_files, "streaming", smoothing=0.1) as bar:
                made = 0

                def progress(num_bytes, num_records):
                    nonlocal made
                    made += num_records
                    bar.update(num_bytes)
                    bar.set_postfix(instances=made)

                counts = pretraining_shards.create_shards(
                    input_files,
                    output_files,
                    tokenizer,
                    settings,
                    num_workers=num_workers,
                    chunk_bytes=FLAGS.chunk_bytes,
                    progress=progress,
                    log_records=lambda records: _log_records(records, inv_vocab),
                )
            for path, count in zip(output_files, counts, strict=True):
                logging.info("  %s: %d instances", path, count)
            return
        from data_prep.pretraining_data import read_documents, write_instances
        from data_prep.tokenization import InGraphTokenizer

        tokenizer = InGraphTokenizer(vocab, do_lower_case=FLAGS.do_lower_case)
        start = time.perf_counter()
        documents = read_documents(input_files, tokenizer, FLAGS.sentence_objective)
    except InputError as e:
        sys.exit(f"create_pretraining_data: {e}")
    logging.info(
        "%d documents, %d sentences, %d tokens in %.1f s",
        len(documents),
        sum(len(d) for d in documents),
        sum(len(s) for d in documents for s in d),
        time.perf_counter() - start,
    )

    rng = random.Random(FLAGS.random_seed)
    with tqdm(desc="creating", unit=" instances", unit_scale=True, smoothing=0.1) as bar:
        instances = settings.create_instances(documents, rng, progress=bar.update)
    del documents  # only the instances are needed from here on
    label = {"nsp": "a random next segment", "sop": "A and B swapped", "none": "label 1"}
    logging.info(
        "%d instances, %.1f%% with %s",
        len(instances),
        100.0 * sum(i.is_random_next for i in instances) / max(1, len(instances)),
        label[FLAGS.sentence_objective],
    )

    logging.info("Writing %d file(s): %s", len(output_files), ", ".join(output_files))
    counts = write_instances(
        tqdm(instances, desc="writing", unit=" instances", unit_scale=True, smoothing=0.1),
        output_files,
        FLAGS.max_seq_length,
        FLAGS.max_predictions_per_seq,
        vocab,
    )
    for path, count in zip(output_files, counts, strict=True):
        logging.info("  %s: %d instances", path, count)


if __name__ == "__main__":
    app.run(main)
