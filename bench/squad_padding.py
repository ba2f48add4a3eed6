"""run_squad's training step on whole windows against batches cut to their longest window.

run_squad.py trains on whole --max_seq_length windows by default, as the original; with
--train_dynamic_padding each training batch is cut to its longest window (rounded up to 8) and
the span loss leaves padding out of its softmaxes (the same gradients as the whole window's,
tests/test_run_squad.py). This times the two through run_squad's own pieces: the windows of a
SQuAD file made as run_squad makes them (squad.convert_examples_to_features, is_training), the
TFRecord read back by features.squad_dataset (whole, or cut), and the Trainer step of
squad_eval.span_qa_task on modeling/span_qa.BertSpanQA. Rounds alternate between the two sides
in one process; the best round of each is reported, with every round's ratio.

A third side adds run_squad's --group_by_length to the cut: each 50 batches' windows sorted by
length, batched again and the batches shuffled (features.squad_dataset's length_group_batches),
so a batch holds windows of similar lengths and is cut shorter.

The gain depends on the windows' lengths: the share of real tokens in them and, since a batch is
cut to its longest window, how long the longest of a batch is. Both are recorded, for the batches
timed and for the first --epoch_batches batches of each side's stream (epoch_mean_cut: many more
batches than are timed, to show whether the timed few are typical). --squad_file picks the
windows:

  sample     (default) the real SQuAD v1.1 sample the tests use (allennlp 0.9.0's fixture: 5
             questions on Wikipedia paragraphs, fetched from PyPI once), repeated to fill the
             batches: five window lengths, so grouping has nothing to sort.
  wikipedia  SQuAD-shaped questions on the real Wikipedia paragraphs of the default corpus's
             source (gensim 4.4.0's enwiki sample), chosen as SQuAD chose its paragraphs (at least
             500 characters; 2,275 of them, 125 words on average, about SQuAD's own); five
             questions per paragraph as SQuAD's 4.6, each a cloze of 12 words around its
             one-word answer (wikipedia_squad). The paragraphs' lengths, hence the windows', are
             real; the questions are not (SQuAD's average 10 words), and no model learns here.
  a path     a SQuAD JSON (the official train-v1.1.json).

  python -m bench.squad_padding --squad_file=wikipedia --output_file=/tmp/squad_padding.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import app, flags, logging

from bench import finetune, host, pretrain_throughput
from data_prep.glue import LENGTH_GROUP_BATCHES  # run_squad's --group_by_length


def sample_files() -> tuple[Path, Path]:
    """The real SQuAD v1.1 sample and bert-base-uncased's vocabulary (fetched from PyPI)."""
    from data_prep import fetch

    (sample,) = fetch.fetch_package_files(
        "allennlp==0.9.0", lambda n: n.endswith("tests/fixtures/data/squad.json"), binary=True
    )
    return sample, fetch.minilm_dir() / "vocab.txt"


# SQuAD took paragraphs of at least 500 characters from its articles (Rajpurkar et al. 2016, 2.).
SQUAD_MIN_PARAGRAPH_CHARS = 500


def wikipedia_squad(path, per_paragraph: int = 5, seed: int = 0) -> dict:
    """Writes to `path` a SQuAD v1.1 JSON of cloze questions on the real Wikipedia sample's
    paragraphs (data_prep/corpus's reader of gensim's enwiki dump) of at least
    SQUAD_MIN_PARAGRAPH_CHARS characters, one article per page: per paragraph `per_paragraph`
    distinct words (seeded), each one an answer (its character offset in the paragraph, as
    SQuAD's answer_start) and its question the 6 words either side with "what" in its place.
    Returns {articles, paragraphs, questions, mean_paragraph_words}."""
    from data_prep import corpus

    rng = np.random.default_rng(seed)
    articles, paragraphs, questions, words_seen = [], 0, 0, 0
    for dump in corpus.fetch_source_files("wikipedia"):
        for title, namespace, redirect, text in corpus.iter_wiki_pages(dump):
            if namespace != 0 or redirect:
                continue
            kept = []
            for context in corpus.strip_wiki_markup(text):
                if len(context) < SQUAD_MIN_PARAGRAPH_CHARS:
                    continue
                words = context.split(" ")  # strip_wiki_markup leaves single spaces
                starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
                answerable = [i for i, w in enumerate(words) if w.isalnum()]
                picks = rng.choice(answerable, min(per_paragraph, len(answerable)), replace=False)
                qas = []
                for i in sorted(int(i) for i in picks):
                    question = " ".join([*words[max(0, i - 6) : i], "what", *words[i + 1 : i + 7]])
                    answer = {"text": words[i], "answer_start": int(starts[i])}
                    qas.append({"id": f"wiki-{questions + len(qas)}", "question": question + "?",
                                "answers": [answer]})  # fmt: skip
                kept.append({"context": context, "qas": qas})
                questions += len(qas)
                words_seen += len(words)
            if kept:
                articles.append({"title": title, "paragraphs": kept})
                paragraphs += len(kept)
    Path(path).write_text(json.dumps({"version": "1.1", "data": articles}))
    return {
        "articles": len(articles),
        "paragraphs": paragraphs,
        "questions": questions,
        "mean_paragraph_words": words_seen / max(paragraphs, 1),
    }


def run(
    squad_file,
    vocab_file,
    work_dir,
    size: str = "L4/H256/A4/I1024",
    seq: int = 384,
    doc_stride: int = 128,
    batch: int = 32,
    steps: int = 3,
    rounds: int = 3,
    epoch_batches: int = 200,
    log=logging.info,
) -> dict:
    import keras
    import tensorflow as tf

    from data_prep import features, glue, squad
    from modeling import span_qa
    from training import optimization, squad_eval, trainer

    tokenizer, packing = glue.load_tokenizer(str(vocab_file), True)
    examples, _ = squad.read_squad_examples(str(squad_file), True, False)
    windows = list(
        squad.convert_examples_to_features(examples, tokenizer, seq, doc_stride, 64, True, packing)
    )
    real = np.array([sum(w.input_mask) for w in windows])
    path = str(Path(work_dir) / "train.tf_record")
    squad.write_train_tfrecord(path, windows)

    def batches(cut, groups=0):
        return features.squad_dataset(
            [path], batch, seq, seed=1, dynamic_padding=cut, length_group_batches=groups
        )

    streams = {"whole": (False, 0), "cut": (True, 0), "grouped": (True, LENGTH_GROUP_BATCHES)}

    def lengths(side, n):
        return [int(b["input_ids"].shape[1]) for b in batches(*streams[side]).take(n)]

    # Every round reads a fresh iterator, so the timed batches are the first `steps` each time;
    # epoch_mean_cut averages the first `epoch_batches`.
    config = pretrain_throughput.parse_size(
        size, vocab_size=len(tokenizer.vocab), max_seq_length=max(512, seq)
    )
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainers = {}
    for cut in (False, True):
        keras.utils.set_random_seed(12345)
        with strategy.scope():
            model = span_qa.BertSpanQA(config)
            model.build()
            opt = optimization.create_optimizer(3e-5, 10_000, 0)  # run_squad's AdamW
            opt.build(model.trainable_variables)
        task = squad_eval.span_qa_task(model, mask_padding=cut)
        trainers[cut] = trainer.Trainer(strategy, task, opt)
    sides = {
        name: (trainers[stream[0]], lambda stream=stream: iter(batches(*stream)), steps)
        for name, stream in streams.items()
    }
    times, overflows = finetune._time_rounds(sides, rounds, f"squad {size} b{batch} s{seq}", log)
    # One pass over each stream: the timed batches are its first `steps`.
    cuts = {side: lengths(side, max(steps, epoch_batches)) for side in ("cut", "grouped")}
    return {
        "size": size,
        "max_seq_length": seq,
        "doc_stride": doc_stride,
        "batch_size": batch,
        "windows": len(windows),
        "real_token_share": float(real.mean() / seq),
        "window_real_tokens": {
            "min": int(real.min()),
            "mean": float(real.mean()),
            "max": int(real.max()),
        },  # fmt: skip
        "cut_lengths": cuts["cut"][:steps],
        "cut_lengths_grouped": cuts["grouped"][:steps],
        "epoch_batches": epoch_batches,
        "epoch_mean_cut": {side: float(np.mean(c[:epoch_batches])) for side, c in cuts.items()},
        **{side: finetune._side(t, steps * batch, overflows[side]) for side, t in times.items()},
        "ratio": min(times["whole"]) / min(times["cut"]),
        "ratio_rounds": [w / c for w, c in zip(times["whole"], times["cut"])],
        "ratio_grouped": min(times["whole"]) / min(times["grouped"]),
        "ratio_grouped_rounds": [w / g for w, g in zip(times["whole"], times["grouped"])],
        "group_by_length_gain": min(times["cut"]) / min(times["grouped"]),
    }


def main(argv):
    del argv
    f = flags.FLAGS
    sample, vocab_file = sample_files()
    vocab_file = Path(f.vocab_file) if f.vocab_file else vocab_file
    with tempfile.TemporaryDirectory() as work:
        made = None
        if f.squad_file == "sample":
            squad_file = sample
        elif f.squad_file == "wikipedia":
            squad_file = Path(work) / "wikipedia_squad.json"
            made = wikipedia_squad(squad_file)
            logging.info("wikipedia: %s", made)
        else:
            squad_file = Path(f.squad_file)
        result = run(squad_file, vocab_file, work, f.size, f.max_seq_length, f.doc_stride,
                     f.batch_size, f.steps, f.rounds, f.epoch_batches)  # fmt: skip
    if made:
        result["wikipedia_squad"] = made
    result |= {
        "squad_file": f.squad_file if made else str(squad_file),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host.cpu_features(),
    }
    print(
        f"run_squad training step, {result['size']} b{result['batch_size']} "
        f"s{result['max_seq_length']}: {100 * result['real_token_share']:.0f}% of the positions "
        f"real; windows/s whole {result['whole']['per_s']:.1f}, cut {result['cut']['per_s']:.1f} "
        f"(batches timed cut to {np.mean(result['cut_lengths']):.0f} on average, the first "
        f"{result['epoch_batches']} to {result['epoch_mean_cut']['cut']:.0f}): "
        f"{result['ratio']:.2f}x (rounds "
        f"{', '.join(f'{r:.2f}' for r in result['ratio_rounds'])}); with --group_by_length "
        f"{result['grouped']['per_s']:.1f} (cut to {np.mean(result['cut_lengths_grouped']):.0f}, "
        f"the first {result['epoch_batches']} to {result['epoch_mean_cut']['grouped']:.0f}): "
        f"{result['ratio_grouped']:.2f}x"
        f" ({result['group_by_length_gain']:.2f}x the cut alone; rounds "
        f"{', '.join(f'{r:.2f}' for r in result['ratio_grouped_rounds'])})"
    )
    if f.output_file:
        Path(f.output_file).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    # Defined here, not at import: tests import run() beside the entrypoints' own flags.
    flags.DEFINE_string("squad_file", "sample",
                        "sample (the real 5-question sample), wikipedia (cloze questions on the "
                        "real Wikipedia sample's paragraphs) or a SQuAD JSON's path.")  # fmt: skip
    flags.DEFINE_integer("epoch_batches", 200, "Batches of each stream whose mean cut length is "
                         "recorded beside the timed ones' (no model runs on them).")  # fmt: skip
    flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: bert-base-uncased's).")
    flags.DEFINE_string("size", "L4/H256/A4/I1024", "Model size, as pretrain_throughput's sizes.")
    flags.DEFINE_integer("max_seq_length", 384, "run_squad's --max_seq_length.")
    flags.DEFINE_integer("doc_stride", 128, "run_squad's --doc_stride.")
    flags.DEFINE_integer("batch_size", 32, "run_squad's --train_batch_size.")
    flags.DEFINE_integer("steps", 3, "Timed steps per round.")
    flags.DEFINE_integer("rounds", 3, "Timed rounds per side (alternating).")
    flags.DEFINE_string("output_file", None, "Where the results JSON goes.")
    sys.exit(app.run(main))
