"""Learns a subword vocabulary from plain-text corpus files: BERT WordPiece, or byte-pair merges.

Input: one sentence a line, blank lines between documents (the create_pretraining_data.py
format). WordPiece words are split exactly as FullTokenizer splits them, so the vocab fits it.

  python data_prep/build_vocab.py --input_file=a.txt,b*.txt --vocab_file=vocab.txt \
      --vocab_size=8000 --do_lower_case=True

--vocab_type=bpe learns Sennrich's character-level merges from whitespace words (subword-nmt's
codes file, written to --vocab_file); --vocab_type=byte_level_bpe learns GPT-2-style byte-level
merges and writes GPT-2's two files, --vocab_file (encoder.json) and vocab.bpe beside it:
  python data_prep/build_vocab.py --input_file=a.txt --vocab_type=byte_level_bpe \
      --vocab_file=bpe/encoder.json --num_merges=8000
--vocab_type=word_end_bpe learns GPT-1's: character-level merges ("</w>" ending each word) from
the lower-cased words BERT's BasicTokenizer splits, written as GPT-1's vocab.json (--vocab_file;
<unk> and <|endoftext|> last) and merges.txt beside it, the folder data_prep/bpe.WordEndBPE,
create_lm_data.py and the GPT scripts read.

Words (WordPiece, character-level BPE) or GPT-2 pre-tokens are counted on --num_workers
processes (default: the cores), each reading its own pieces of the files; the WordPiece
learner's passes run on as many; the output never depends on the number of workers. The
character-level codes file is subword-nmt's (tested on sample text; byte for byte on the default
corpus at 8,000 merges, learned about 7.5x faster, in bench/vocab_learning.py, which checks it).
"""

import functools
import json
import sys
from collections import Counter
from pathlib import Path

# Run as `python data_prep/build_vocab.py`: the repository root is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402

from data_prep import bpe, files, parallel, tokenization  # noqa: E402
from data_prep.errors import input_error  # noqa: E402

flags.DEFINE_string(
    "input_file",
    None,
    "Comma list of text files or globs: one sentence a line, blank lines between documents.",
)
flags.DEFINE_string("vocab_file", None, "Where to write the vocabulary, one token a line.")
flags.DEFINE_integer("vocab_size", 8000, "Most tokens in the vocabulary, reserved ones included.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (WordPiece only).")
flags.DEFINE_enum(
    "vocab_type",
    "wordpiece",
    ["wordpiece", "bpe", "byte_level_bpe", "word_end_bpe"],
    "What to learn.",
)
flags.DEFINE_integer("num_merges", 8000, "BPE: the most merges to learn.")
flags.DEFINE_integer("min_frequency", 2, "BPE: stop when no pair occurs this often.")
flags.DEFINE_integer(
    "num_workers",
    None,
    "Processes counting words and learning WordPiece (default: the cores); the output never "
    "depends on it.",
)
flags.register_validator("num_workers", lambda n: n is None or n >= 1, "must be at least 1")
flags.mark_flags_as_required(["input_file", "vocab_file"])
FLAGS = flags.FLAGS


def count_corpus(paths, count, num_workers: int) -> Counter:
    """count(list of lines) -> Counter summed over the corpus on `num_workers` processes
    (parallel.count_files), with a progress bar over the files' bytes."""
    with files.bytes_bar(paths, "counting") as bar:
        return parallel.count_files(count, paths, num_workers, progress=bar.update)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    inputs = files.expand_input_files(FLAGS.input_file)
    workers = parallel.worker_count(FLAGS.num_workers)
    if FLAGS.vocab_type != "wordpiece":
        return learn_merges(inputs, workers)
    count = functools.partial(tokenization.count_words, do_lower_case=FLAGS.do_lower_case)
    counts = count_corpus(inputs, count, workers)
    if not counts:
        raise input_error(", ".join(inputs), "text to learn a vocabulary from", "no words at all")
    vocab = tokenization.learn_vocab_from_counts(
        counts, FLAGS.vocab_size, progress=True, num_workers=workers
    )
    tokenization.write_vocab(vocab, FLAGS.vocab_file)
    print(f"wrote {len(vocab)} tokens to {FLAGS.vocab_file}")


def learn_merges(paths, workers: int) -> None:
    from tqdm import tqdm

    if FLAGS.vocab_type == "bpe":
        words = bpe.character_words(count_corpus(paths, bpe.count_whitespace_words, workers))
    elif FLAGS.vocab_type == "word_end_bpe":  # GPT-1's words: lower-cased, punctuation apart
        count = functools.partial(tokenization.count_words, do_lower_case=True)
        words = bpe.character_words(count_corpus(paths, count, workers))
    else:
        words = bpe.pretoken_words(count_corpus(paths, bpe.count_pretokens, workers))
    if not words:
        raise input_error(", ".join(paths), "text to learn merges from", "no words at all")
    bar = tqdm(total=FLAGS.num_merges, desc="merges", unit="merge", mininterval=2)

    def progress(done, total):
        bar.update(done - bar.n)

    merges = bpe.learn_bpe(words, FLAGS.num_merges, FLAGS.min_frequency, progress)
    bar.close()
    out = Path(FLAGS.vocab_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    if FLAGS.vocab_type == "bpe":
        bpe.write_merges(merges, out)
        print(f"wrote {len(merges)} merges to {out}")
        return
    if FLAGS.vocab_type == "word_end_bpe":
        vocab = bpe.word_end_vocab(words, merges)
        out.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        bpe.write_merges(merges, out.parent / "merges.txt")
        print(f"wrote {len(vocab)} tokens to {out} and {len(merges)} merges beside it")
        return
    tok = bpe.ByteLevelBPE(bpe.byte_level_vocab(merges), merges)
    encoder, merges_file = tok.save(out.parent)
    if Path(encoder) != out:
        Path(encoder).replace(out)
    print(f"wrote {len(tok.encoder)} tokens to {out} and {len(merges)} merges to {merges_file}")


if __name__ == "__main__":
    app.run(main)
