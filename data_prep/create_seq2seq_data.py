"""Text corpus -> encoder-decoder denoising TFRecords (T5 span corruption or BART text infilling).

Documents (the BERT corpus format: one sentence a line, blank lines between documents) are
tokenized with byte-level BPE files (GPT-2's format), cut into chunks of consecutive sentences and
noised (data_prep/noising.py through data_prep/seq2seq_data.py) with one seeded rng; records hold
input_ids, input_mask (encoder) and target_ids, target_mask (decoder), written round-robin.
The special ids (<pad>, </s>, <mask>, <extra_id_i>, and <s> for BART) follow the BPE vocabulary;
the printed summary gives the config values they need (vocab_size, pad/bos/eos/decoder start).

Example (the 8k-merge BPE of data_prep/build_vocab.py --vocab_type=byte_level_bpe):
  python data_prep/create_seq2seq_data.py --input_file=default_run/corpus/train.txt \\
    --output_file=t5/train.tfrecord --encoder_file=bpe/encoder.json --merges_file=bpe/vocab.bpe \\
    --noising=t5_span --max_seq_length=128 --max_target_length=32 --random_seed=12345

Documents are tokenized on --num_workers processes (data_prep/parallel.map_texts, results in
corpus order) while this process noises them with the one seeded rng and writes the records
without TensorFlow, so the workers are forked; the output does not depend on the number of
workers.
--vocab_file=a released T5's spiece.model (or the folder convert_checkpoint.py wrote) instead of
the BPE files gives records of its own pieces (T5's span corruption; each sentence its pieces,
no line break between them, as SentencePiece has none), for continuing that T5's pretraining.
"""

import sys
import time
from pathlib import Path

from absl import app, flags, logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

flags.DEFINE_string("input_file", None, "Input text file(s): a comma list of files or globs.")
flags.DEFINE_string("output_file", None, "Output TFRecord file(s): a comma list, one per shard.")
flags.DEFINE_string("encoder_file", None, "GPT-2 style encoder.json (token -> id).")
flags.DEFINE_string("merges_file", None, "GPT-2 style vocab.bpe (the merges).")
flags.DEFINE_enum(
    "noising", "t5_span", ["t5_span", "bart_infill"], "T5 span corruption or BART text infilling."
)
flags.DEFINE_bool("permute_sentences", False, "BART: shuffle each chunk's sentences first.")
flags.DEFINE_integer("max_seq_length", 128, "Encoder input ids per record (padded).")
flags.DEFINE_integer("max_target_length", 32, "Decoder target ids per record (padded).")
flags.DEFINE_float("noise_density", 0.15, "T5: fraction of tokens corrupted (sec. 3.3.4).")
flags.DEFINE_float("mean_noise_span_length", 3.0, "T5: mean corrupted span length.")
flags.DEFINE_float("mask_ratio", 0.3, "BART: fraction of tokens masked by infilling.")
flags.DEFINE_float("poisson_lambda", 3.0, "BART: Poisson mean of the infilled span lengths.")
flags.DEFINE_integer("num_sentinels", 100, "T5: sentinel tokens after the BPE vocabulary.")
flags.DEFINE_integer("random_seed", 12345, "Seed of the noising: same seed, same records.")
flags.DEFINE_integer(
    "num_workers",
    None,
    "Tokenizing processes (default: the cores this process may use). The records do not depend "
    "on it.",
)
flags.DEFINE_string(
    "vocab_file",
    None,
    "T5 only, instead of the BPE files: a released T5's SentencePiece model (spiece.model, or a "
    "folder holding it, e.g. convert_checkpoint.py's output); --num_sentinels after its pieces.",
)
flags.mark_flags_as_required(["input_file", "output_file"])
flags.register_multi_flags_validator(
    ["encoder_file", "merges_file", "vocab_file"],
    lambda f: bool(f["vocab_file"]) != bool(f["encoder_file"] and f["merges_file"]),
    "give --encoder_file and --merges_file (byte-level BPE) or --vocab_file (a T5 SentencePiece "
    "model)",
)
flags.register_validator("max_seq_length", lambda n: n >= 3, "must be at least 3")
flags.register_validator("max_target_length", lambda n: n >= 3, "must be at least 3")
flags.register_validator("num_workers", lambda n: n is None or n >= 1, "must be at least 1")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import functools

    import numpy as np

    from data_prep import files, lm_data, parallel, seq2seq_data, spiece
    from data_prep.errors import InputError

    try:
        settings = seq2seq_data.NoisingSettings(
            noising=FLAGS.noising,
            max_seq_length=FLAGS.max_seq_length,
            max_target_length=FLAGS.max_target_length,
            noise_density=FLAGS.noise_density,
            mean_noise_span_length=FLAGS.mean_noise_span_length,
            mask_ratio=FLAGS.mask_ratio,
            poisson_lambda=FLAGS.poisson_lambda,
            permute_sentences=FLAGS.permute_sentences,
        )
        settings.chunk_length()
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    try:
        inputs = files.expand_input_files(FLAGS.input_file)
        if FLAGS.vocab_file:
            model = spiece.model_file(FLAGS.vocab_file)
            if model is None or FLAGS.noising != "t5_span":
                raise app.UsageError(
                    f"--vocab_file={FLAGS.vocab_file}: a T5 SentencePiece model (spiece.model or "
                    "its folder) for --noising=t5_span; BART's records need its BPE files"
                )
            vocab = seq2seq_data.Seq2SeqVocab.from_spiece(model, FLAGS.num_sentinels)
        else:
            # BART's records start with <s> (the released models' layout); T5's have none.
            vocab = seq2seq_data.Seq2SeqVocab.from_files(
                FLAGS.encoder_file, FLAGS.merges_file, FLAGS.num_sentinels,
                bos=FLAGS.noising == "bart_infill",
            )  # fmt: skip
    except InputError as e:
        raise SystemExit(f"create_seq2seq_data: {e}") from None
    outputs = [f.strip() for f in FLAGS.output_file.split(",") if f.strip()]
    files.make_parent_folders(outputs)
    num_workers = parallel.worker_count(FLAGS.num_workers)
    stats = {"documents": 0}
    t0 = time.time()
    bar = files.bytes_bar(inputs, "encoding")  # advanced as the workers are fed

    def documents():
        # read_sentence_documents' texts, unsplit
        texts = lm_data.read_lm_documents(inputs, progress=bar.update)
        encode = functools.partial(seq2seq_data.encode_document, vocab)
        for sentences in parallel.map_texts(encode, texts, num_workers):
            stats["documents"] += 1
            if stats["documents"] % 500 == 0:
                logging.info("%d documents, %d instances", stats["documents"], stats["instances"])
            yield sentences

    rng = np.random.default_rng(FLAGS.random_seed)
    # Written under temporary names and renamed at the end: a failed run leaves no partial file.
    try:
        n = files.write_atomically(
            outputs,
            lambda tmp: seq2seq_data.write_seq2seq_tfrecords(
                seq2seq_data.create_instances(documents(), vocab, settings, rng, stats),
                tmp,
                FLAGS.max_seq_length,
                FLAGS.max_target_length,
                vocab.pad_id,
            ),
        )
    except InputError as e:
        raise SystemExit(f"create_seq2seq_data: {e}") from None
    finally:
        bar.close()
    if n == 0:
        raise SystemExit(
            f"create_seq2seq_data: {FLAGS.input_file}: expected text for at least one instance "
            f"of 2 or more tokens, found {stats['documents']} documents"
        )
    if FLAGS.noising == "t5_span":
        needs = (
            f"T5 config: vocab_size >= {vocab.size}, pad_token_id={vocab.pad_id}, "
            f"eos_token_id={vocab.eos_id}, decoder_start_token_id={vocab.pad_id}"
        )
    else:
        # BART starts decoding from </s> (its released configs' decoder_start_token_id = eos);
        # inputs and targets are <s> ... </s>.
        needs = (
            f"BART config: vocab_size >= {vocab.size}, pad_token_id={vocab.pad_id}, "
            f"bos_token_id={vocab.bos_id}, eos_token_id={vocab.eos_id}, "
            f"decoder_start_token_id={vocab.eos_id} (<mask> is {vocab.mask_id})"
        )
    print(
        f"wrote {n} {FLAGS.noising} instances ({stats['documents']} documents, "
        f"{stats['too_long']} too long dropped, {time.time() - t0:.1f}s, {num_workers} "
        f"worker(s)) to {', '.join(outputs)}\n" + needs
    )


if __name__ == "__main__":
    app.run(main)
