"""Text corpus -> left-to-right language-model TFRecords (GPT): byte-level BPE ids in full blocks.

Documents (the BERT corpus format: one sentence a line, blank lines between documents) are
tokenized with GPT-2's byte-level BPE files, joined with an end-of-text token after each, and cut
into blocks of --block_size ids (data_prep/lm_data.py), written round-robin over the outputs.

Example (the real GPT-2 vocabulary: data_prep/fetch.py's gpt2_bpe_dir(), or your own from
data_prep/build_vocab.py --vocab_type=byte_level_bpe):
  python data_prep/create_lm_data.py --input_file=default_run/corpus/train.txt \\
    --output_file=lm/train.tfrecord --encoder_file=bpe/encoder.json --merges_file=bpe/vocab.bpe \\
    --block_size=128
With --vocab_file=default_run/vocab.txt instead of the two BPE files, the units are WordPieces of
a BERT vocabulary and [SEP] ends each document (ELMo's biLM in run_pretraining.py reads these).
With --vocab_file=a SentencePiece model (spiece.model, or a folder holding it: an XLNet's), the
units are its pieces as XLNet's released code makes them (data_prep/spiece.py; cased unless
--do_lower_case is given) and <eod> ends each document, as XLNet's data_utils.py puts it.
With --vocab_file=a folder holding the byte-level BPE files (encoder.json + vocab.bpe, or Hugging
Face's vocab.json + merges.txt: a GPT-2 that convert_checkpoint.py converted), they are read from
it, as with --encoder_file and --merges_file.

With --reuse_len (a SentencePiece model or a WordPiece vocab.txt), the records are XLNet's
released ones instead of blocks (data_prep/xlnet_data.py): each sentence is tokenized alone, and
record t of --block_size ids is the corpus from t x --reuse_len on, then segments A and B (B the
text after A, or half of the time sentences from elsewhere, drawn with --random_seed) with
<sep> <sep> <cls> ([SEP] [SEP] [CLS] for WordPiece). As the release's data_utils.py, the
corpus's ids are held in memory (about 5 bytes a token), not streamed.

With --bi_data (XLNet's bidirectional data), the records of the corpus read backward follow the
forward ones (lm_data.bidirectional), each flagged `backward`; run_pretraining --bi_data
reads them. The corpus's ids are then held in memory in either case.

Documents are tokenized on --num_workers processes (data_prep/parallel.map_texts: batches of about
a quarter of a million characters, at most two per worker in flight, results in corpus order), and
the records are written without TensorFlow, so the workers are forked; the output does not depend
on the number of workers.
"""

import functools
import sys
import time
from pathlib import Path

from absl import app, flags, logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

flags.DEFINE_string("input_file", None, "Input text file(s): a comma list of files or globs.")
flags.DEFINE_string("output_file", None, "Output TFRecord file(s): a comma list, one per shard.")
flags.DEFINE_string("encoder_file", None, "GPT-2 style encoder.json (token -> id).")
flags.DEFINE_string("merges_file", None, "GPT-2 style vocab.bpe (the merges).")
flags.DEFINE_integer("block_size", 128, "Ids per block: the model's context (n_ctx) or less.")
flags.DEFINE_string(
    "vocab_file",
    None,
    "A WordPiece vocab.txt instead of the BPE files (ELMo on BERT's units; [SEP] ends documents), "
    "a SentencePiece model (XLNet's spiece.model or its folder; <eod> ends documents), or a "
    "folder holding the BPE files (encoder.json + vocab.bpe, or vocab.json + merges.txt).",
)
flags.DEFINE_bool(
    "do_lower_case",
    True,
    "With --vocab_file: lower-case (uncased vocabularies; a SentencePiece model only when given).",
)
flags.DEFINE_string("end_of_text", "<|endoftext|>", "The separator token after each document.")
flags.DEFINE_integer(
    "reuse_len",
    0,
    "XLNet's two-segment records: the ids at the start of each record that continue the record "
    "before's start (what a model with --mem_len caches), then A <sep> B <sep> <cls>; the release "
    "used 256 of 512. 0: plain blocks.",
)
flags.DEFINE_integer("random_seed", 12345, "--reuse_len: the seed of the segments' draws.")
flags.DEFINE_bool(
    "bi_data",
    False,
    "XLNet's bidirectional data (the release's bi_data, for run_pretraining --bi_data): the "
    "records (blocks, or with --reuse_len two-segment records) of the corpus, then those of the "
    "corpus read backward (documents last to first, each one's ids reversed), every record "
    "flagged `backward` 0 or 1. Holds the corpus's ids in memory.",
)
flags.DEFINE_integer(
    "num_workers",
    None,
    "Tokenizing processes (default: the cores this process may use). The blocks do not depend "
    "on it.",
)
flags.mark_flags_as_required(["input_file", "output_file"])
flags.register_multi_flags_validator(
    ["encoder_file", "merges_file", "vocab_file"],
    lambda f: bool(f["vocab_file"]) != bool(f["encoder_file"] and f["merges_file"]),
    "give --encoder_file and --merges_file (byte-level BPE) or --vocab_file (WordPiece, a "
    "SentencePiece model or a byte-level BPE folder)",
)
flags.register_validator("block_size", lambda b: b >= 2, "must be at least 2")
flags.register_validator("reuse_len", lambda r: r >= 0, "must be >= 0")
flags.register_validator("num_workers", lambda n: n is None or n >= 1, "must be at least 1")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from data_prep import bpe, files, lm_data, parallel, spiece, tokenization, xlnet_data
    from data_prep.errors import InputError, input_error
    from data_prep.pretraining_shards import write_round_robin

    tokenizer = None  # a BPE's
    try:
        inputs = files.expand_input_files(FLAGS.input_file)
        model = spiece.model_file(FLAGS.vocab_file) if FLAGS.vocab_file else None
        bpe_files = bpe.folder_files(FLAGS.vocab_file) if FLAGS.vocab_file else None
        if bpe_files:  # a GPT folder (GPT-2's byte-level BPE or GPT-1's word-end one)
            tokenizer = bpe.load_gpt_bpe(*bpe_files)
            encode, vocab, vocab_path = tokenizer.encode, tokenizer.encoder, str(bpe_files[0])
        elif model:
            lower = FLAGS.do_lower_case and FLAGS["do_lower_case"].present
            pieces = spiece.SentencePieceTokenizer(model, lower)
            encode, vocab, vocab_path = pieces.encode, pieces.vocab, str(model)
        elif FLAGS.vocab_file:
            wordpiece = tokenization.FullTokenizer(FLAGS.vocab_file, FLAGS.do_lower_case)
            encode, vocab, vocab_path = wordpiece.tokenize_to_ids, wordpiece.vocab, FLAGS.vocab_file
        else:
            tokenizer = bpe.load_gpt_bpe(FLAGS.encoder_file, FLAGS.merges_file)
            encode, vocab, vocab_path = tokenizer.encode, tokenizer.encoder, FLAGS.encoder_file
        end = FLAGS.end_of_text
        if FLAGS.vocab_file and not bpe_files and not FLAGS["end_of_text"].present:
            end = "<eod>" if model else "[SEP]"
        if end not in vocab:
            hint = ""
            if isinstance(tokenizer, bpe.WordEndBPE):  # GPT-1's vocabulary has no such token
                hint = "; a GPT-1 vocabulary has none: name one of its tokens with --end_of_text"
            raise input_error(vocab_path, f"the token {end!r}", "none" + hint)
        if FLAGS.reuse_len:
            if bpe_files or not FLAGS.vocab_file:
                raise app.UsageError(
                    "--reuse_len: XLNet's records need <sep> and <cls>; give --vocab_file a "
                    "SentencePiece model or a WordPiece vocab.txt"
                )
            if not FLAGS.reuse_len < FLAGS.block_size - xlnet_data.SPECIAL_POSITIONS:
                raise app.UsageError(
                    f"--reuse_len={FLAGS.reuse_len}: expected below --block_size - 3 = "
                    f"{FLAGS.block_size - 3} (room for <sep> A <sep> B <cls>)"
                )
            specials = ("<sep>", "<cls>") if model else ("[SEP]", "[CLS]")
            for token in specials:
                if token not in vocab:
                    raise input_error(vocab_path, f"the token {token!r}", "none")
            sep_id, cls_id = (vocab[t] for t in specials)
    except InputError as e:
        raise SystemExit(f"create_lm_data: {e}") from None
    outputs = [f.strip() for f in FLAGS.output_file.split(",") if f.strip()]
    files.make_parent_folders(outputs)
    eot = vocab[end]
    num_workers = parallel.worker_count(FLAGS.num_workers)
    stats = {"documents": 0, "tokens": 0}
    t0 = time.time()
    bar = files.bytes_bar(inputs, "encoding")  # advanced as the workers are fed

    def documents():
        texts = lm_data.read_lm_documents(inputs, progress=bar.update)
        per_text = (
            functools.partial(xlnet_data.encode_sentences, encode) if FLAGS.reuse_len else encode
        )
        for ids in parallel.map_texts(per_text, texts, num_workers):
            stats["documents"] += 1
            stats["tokens"] += sum(map(len, ids)) if FLAGS.reuse_len else len(ids)
            if stats["documents"] % 500 == 0:
                rate = stats["tokens"] / max(time.time() - t0, 1e-9)
                logging.info("%d documents, %d tokens, %.0f tokens/s", *stats.values(), rate)
            yield ids

    def records(docs):
        if not FLAGS.reuse_len:
            for block in lm_data.pack_blocks(docs, FLAGS.block_size, eot):
                yield {"input_ids": block}
            return
        ids, sentence_ids = xlnet_data.sentence_stream(docs, eot)
        yield from xlnet_data.two_segment_records(
            ids, sentence_ids, FLAGS.block_size, FLAGS.reuse_len, sep_id, cls_id,
            FLAGS.random_seed,
        )  # fmt: skip

    def write(tmp):
        if not FLAGS.bi_data:
            if not FLAGS.reuse_len:  # streamed: one block in memory
                return lm_data.write_lm_tfrecords(
                    lm_data.pack_blocks(documents(), FLAGS.block_size, eot), tmp
                )
            out = records(documents())
        else:
            docs = list(documents())
            out = lm_data.bidirectional(records(docs), records(lm_data.backward_documents(docs)))
        return write_round_robin(out, lm_data.serialize_records, tmp, lm_data.WRITE_BATCH)

    # Written under temporary names and renamed at the end: a failed run leaves no partial file.
    try:
        blocks = files.write_atomically(outputs, write)
    except InputError as e:
        raise SystemExit(f"create_lm_data: {e}") from None
    finally:
        bar.close()
    if blocks == 0:
        raise SystemExit(
            f"create_lm_data: {FLAGS.input_file}: expected at least {FLAGS.block_size} tokens "
            f"for one block, found {stats['tokens']}"
        )
    kind = f"two-segment records (reuse_len {FLAGS.reuse_len})" if FLAGS.reuse_len else "blocks"
    if FLAGS.bi_data:
        kind += ", forward then backward (bi_data),"
    print(
        f"wrote {blocks} {kind} of {FLAGS.block_size} ids ({stats['documents']} documents, "
        f"{stats['tokens']} tokens, {time.time() - t0:.1f}s, {num_workers} worker(s)) to "
        f"{', '.join(outputs)}"
    )


if __name__ == "__main__":
    app.run(main)
