"""Learns a BERT WordPiece vocabulary (vocab.txt) from plain-text corpus files.

Input: one sentence a line, blank lines between documents (the create_pretraining_data.py
format). Words are split exactly as FullTokenizer splits them, so the vocab fits it.

  python data_prep/build_vocab.py --input_file=a.txt,b*.txt --vocab_file=vocab.txt \
      --vocab_size=8000 --do_lower_case=True
"""

import sys
from pathlib import Path

# Run as `python data_prep/build_vocab.py`: the repository root is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402

from data_prep import features, tokenization  # noqa: E402
from data_prep.errors import input_error  # noqa: E402

flags.DEFINE_string(
    "input_file",
    None,
    "Comma list of text files or globs: one sentence a line, blank lines between documents.",
)
flags.DEFINE_string("vocab_file", None, "Where to write the vocabulary, one token a line.")
flags.DEFINE_integer("vocab_size", 8000, "Most tokens in the vocabulary, reserved ones included.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
flags.mark_flags_as_required(["input_file", "vocab_file"])
FLAGS = flags.FLAGS


def _corpus_lines(files):
    for path in files:
        for _, text in tokenization.read_utf8_lines(path):
            yield text


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    files = features.expand_input_files(FLAGS.input_file)
    counts = tokenization.count_words(_corpus_lines(files), FLAGS.do_lower_case, progress=True)
    if not counts:
        raise input_error(", ".join(files), "text to learn a vocabulary from", "no words at all")
    vocab = tokenization.learn_vocab_from_counts(counts, FLAGS.vocab_size, progress=True)
    tokenization.write_vocab(vocab, FLAGS.vocab_file)
    print(f"wrote {len(vocab)} tokens to {FLAGS.vocab_file}")


if __name__ == "__main__":
    app.run(main)
