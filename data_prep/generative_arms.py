"""Does pretraining pay off for the generative families? GPT-1 fine-tuning, T5 text-to-text and
XLNet classification on rt-polarity (SST-2 layout), each pretrained checkpoint against the same
architecture from scratch, with the same budget and seeds.

Example (the GPT and T5 checkpoints of the README's held-out table; sst2/ as data_prep/
rt_polarity.py writes it):
  python data_prep/generative_arms.py --output_dir=work_dir/generative \
    --sst2_dir=default_run/rt_polarity/sst2 --bpe_dir=work_dir/bpe \
    --arms=gpt_pretrained=gpt:work_dir/gpt_run,gpt_scratch=gpt: \
    --arms=t5_pretrained=t5:work_dir/t5_run,t5_scratch=t5: --seeds=1,2,3

Each arm is `name=family:checkpoint` (an empty checkpoint trains from scratch); the families and
the script each runs as a subprocess:
  gpt    run_classifier.py with --gpt_config_file: `start a extract` ids, classifier on the last
         token plus the auxiliary LM loss (--lm_coef), --vocab_file the BPE folder
  t5     run_text2text.py with --t5_config_file: "sst2 sentence: a" -> "negative" / "positive",
         greedy decoding, scored by exact match of the word (any other output counts as wrong;
         the words are written back as a SST-2.tsv submission beside test_predictions.tsv)
  xlnet  run_classifier.py with --xlnet_config_file: `a <sep> <cls>` left padded, the last
         token's content stream; --xlnet_vocab_file the tokenizer its pretraining used
Every run is scored on its final weights (no checkpoint is picked on dev: a checkpoint is saved
only at the end), so dev and test accuracy are both honest estimates. A run is done once per
folder (data_prep/rt_polarity.run_recorded): a rerun skips finished runs and continues the rest.
Seeds are the outer loop, so an interrupted sweep has every arm at the same number of seeds.

Outputs under --output_dir: <arm>/seed_<n>/ (one run's output_dir), <arm>/summary.json,
comparison.json and comparison.md (mean ± sample std [min, max] over seeds).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository root is not on sys.path by itself
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep import glue, rt_polarity, text2text  # noqa: E402
from data_prep.errors import input_error  # noqa: E402

FAMILIES = ("gpt", "t5", "xlnet")
INVALID = "invalid"  # a T5 output that is no label word
# Settings every family's script takes under these names (run_classifier / run_text2text flags);
# the learning rate is set per family.
COMMON = (
    "max_seq_length",
    "train_batch_size",
    "eval_batch_size",
    "num_train_epochs",
    "warmup_proportion",
    "save_checkpoints_steps",
    "iterations_per_loop",
)


def parse_arms(spec: Sequence[str]) -> list[tuple[str, str, str]]:
    """["gpt_scratch=gpt:", "t5_pre=t5:out/t5"] -> [(name, family, checkpoint)]. Names are
    folder names and unique; families are FAMILIES."""
    arms = []
    for item in spec:
        name, sep, rest = item.partition("=")
        family, colon, checkpoint = rest.partition(":")
        if not (sep and colon) or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"--arms: expected name=family:checkpoint, found {item!r}")
        if family not in FAMILIES:
            raise ValueError(f"--arms: {item!r}: family must be one of {list(FAMILIES)}")
        arms.append((name, family, checkpoint))
    if len({a[0] for a in arms}) != len(arms):
        raise ValueError(f"--arms: names must be unique, found {list(spec)}")
    return arms


def run_args(family: str, files: dict, sst2_dir, run_dir, checkpoint: str, seed: int, settings):
    """The command line of one (arm, seed) run: train, eval and predict on the SST-2 layout.

    files: {"gpt_config", "t5_config", "xlnet_config", "bpe_dir", "xlnet_vocab"} paths.
    settings: flag values of COMMON plus the family's own (lm_coef; max_target_length, num_beams).
    """
    if family in ("gpt", "xlnet"):
        vocab = files["bpe_dir"] if family == "gpt" else files["xlnet_vocab"]
        return rt_polarity.classifier_args(
            sst2_dir, run_dir, vocab, files[f"{family}_config"], checkpoint, seed, settings
        )
    bpe = Path(files["bpe_dir"])
    args = [
        "run_text2text.py",
        "--task_name=sst-2",
        f"--data_dir={sst2_dir}",
        f"--bert_config_file={files['t5_config']}",
        f"--encoder_file={bpe / 'encoder.json'}",
        f"--merges_file={bpe / 'vocab.bpe'}",
        f"--init_checkpoint={checkpoint}",
        f"--output_dir={run_dir}",
        f"--random_seed={seed}",
        "--do_train",
        "--do_eval",
        "--do_predict",
    ]
    return args + [f"--{k}={v}" for k, v in sorted(settings.items())]


def predictions_file(family: str) -> str:
    """The file a finished run leaves last (its test predictions)."""
    return "test_predictions.tsv" if family == "t5" else "SST-2.tsv"


def read_eval_results(run_dir) -> dict:
    """eval_results.txt (`key = value` lines, trainer.write_eval_results) as floats."""
    path = Path(run_dir) / "eval_results.txt"
    out = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        key, sep, value = line.partition(" = ")
        if not sep:
            raise input_error(f"{path}:{number}", "`key = value`", repr(line))
        out[key] = float(value)
    return out


def label_word_submission(predictions_path, submission_path, words: Sequence[str]) -> float:
    """Turns run_text2text's test_predictions.tsv (decoded words) into a SST-2.tsv submission:
    word i is label i, any other text becomes INVALID (which no label equals, so it scores as
    wrong). Returns the fraction of invalid predictions."""
    rows = glue.read_submission(predictions_path)
    as_label = {w: str(i) for i, w in enumerate(words)}
    labels = [as_label.get(p, INVALID) for _, p in rows]
    glue.write_submission(submission_path, [i for i, _ in rows], labels)
    return labels.count(INVALID) / max(len(rows), 1)


def run_result(family: str, run_dir, labels_file) -> dict:
    """Dev accuracy (eval_results.txt) and test accuracy of one finished run, final weights."""
    run_dir = Path(run_dir)
    dev = read_eval_results(run_dir)
    result = {"dev_accuracy": dev["accuracy"], "global_step": int(dev["global_step"])}
    submission = run_dir / "SST-2.tsv"
    if family == "t5":
        words = text2text.LABEL_WORDS["sst-2"]
        invalid = label_word_submission(run_dir / predictions_file(family), submission, words)
        result |= {"dev_invalid": dev["invalid"], "test_invalid": invalid}
    return result | {"test_accuracy": rt_polarity.score_submission(submission, labels_file)}


def summarize_arm(arm: str, family: str, checkpoint: str, settings: dict, runs: list) -> dict:
    from training.metrics import mean_and_spread

    return {
        "arm": arm,
        "family": family,
        "init_checkpoint": checkpoint,
        "settings": settings,
        "runs": runs,
        "dev_accuracy": mean_and_spread([r["dev_accuracy"] for r in runs]),
        "test_accuracy": mean_and_spread([r["test_accuracy"] for r in runs]),
    }


def markdown_table(summaries: Sequence[dict]) -> str:
    """One row per arm: mean ± sample std [min, max] over seeds, final weights."""

    def cell(s):
        return f"{s['mean']:.3f} ± {s['std']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"

    lines = [
        "| arm | family | starts from | lr | epochs | steps | seeds | dev accuracy "
        "| test accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a in summaries:
        st = a["settings"]
        lines.append(
            f"| {a['arm']} | {a['family']} | {a['init_checkpoint'] or 'scratch'} | "
            f"{st.get('learning_rate', '-')} | {st.get('num_train_epochs', '-')} | "
            f"{a['runs'][0]['global_step']} | {a['dev_accuracy']['n']} | "
            f"{cell(a['dev_accuracy'])} | {cell(a['test_accuracy'])} |"
        )
    return "\n".join(lines)


def run_sweep(
    output_dir, sst2_dir, arms, files: dict, seeds, settings_by_family: dict, collect_only=False
):
    """Runs every (seed, arm) not yet finished, seeds outer; after each run rewrites the arm's
    summary.json and comparison.json / comparison.md. With collect_only nothing is run: the
    finished runs made by the same commands are summarised (several sweeps may share an
    output_dir, e.g. one per family run side by side). Returns the summaries of the arms that
    have a finished run."""
    out = Path(output_dir)
    labels_file = Path(sst2_dir) / "test_labels.tsv"
    if not labels_file.is_file():
        raise input_error(str(labels_file), "the test labels rt_polarity.py writes", "no file")
    runs: dict[str, list] = {name: [] for name, _, _ in arms}
    summaries: dict[str, dict] = {}
    total, done, t0 = len(seeds) * len(arms), 0, time.time()
    for seed in seeds:
        for name, family, checkpoint in arms:
            settings = settings_by_family[family]
            run_dir = out / name / f"seed_{seed}"
            args = run_args(family, files, sst2_dir, run_dir, checkpoint, seed, settings)
            done_file = run_dir / predictions_file(family)
            if collect_only:
                record = run_dir / "command.json"
                if not (done_file.exists() and record.exists()):
                    continue
                if json.loads(record.read_text()) != args:
                    raise ValueError(f"{run_dir} holds a run made with other settings ({record})")
            else:
                rt_polarity.run_recorded(args, run_dir, done_file, f"{name}, seed {seed}")
            runs[name].append({"seed": seed, **run_result(family, run_dir, labels_file)})
            summaries[name] = summarize_arm(name, family, checkpoint, settings, runs[name])
            rt_polarity._write_lines(
                out / name / "summary.json", [json.dumps(summaries[name], indent=2)]
            )
            done += 1
            elapsed = time.time() - t0
            print(
                f"=== {done}/{total} runs, {elapsed / 60:.1f} min, "
                f"ETA {elapsed / done * (total - done) / 60:.1f} min",
                flush=True,
            )
            ordered = [summaries[n] for n, _, _ in arms if n in summaries]
            rt_polarity._write_lines(out / "comparison.json", [json.dumps(ordered, indent=2)])
            rt_polarity._write_lines(out / "comparison.md", [markdown_table(ordered)])
    return [summaries[n] for n, _, _ in arms if n in summaries]


def main(argv):
    from absl import flags

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        raise SystemExit(f"unexpected arguments: {argv[1:]}")
    try:
        arms = parse_arms([a for value in FLAGS.arms for a in value.split(",") if a])
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if not arms:
        raise SystemExit("--arms is empty")
    files = {
        "gpt_config": FLAGS.gpt_config_file,
        "t5_config": FLAGS.t5_config_file,
        "xlnet_config": FLAGS.xlnet_config_file,
        "bpe_dir": FLAGS.bpe_dir,
        "xlnet_vocab": FLAGS.xlnet_vocab_file or FLAGS.bpe_dir,
    }
    common = {k: FLAGS[k].value for k in COMMON}
    settings_by_family = {
        "gpt": common | {"learning_rate": FLAGS.gpt_learning_rate, "lm_coef": FLAGS.lm_coef},
        "t5": common
        | {
            "learning_rate": FLAGS.t5_learning_rate,
            "max_target_length": FLAGS.max_target_length,
            "num_beams": 1,
        },
        "xlnet": common | {"learning_rate": FLAGS.xlnet_learning_rate},
    }
    summaries = run_sweep(
        FLAGS.output_dir,
        FLAGS.sst2_dir,
        arms,
        files,
        [int(s) for s in FLAGS.seeds],
        settings_by_family,
        FLAGS.collect_only,
    )
    print("\n" + markdown_table(summaries))


def _define_flags():
    from absl import flags

    flags.DEFINE_string("output_dir", None, "Folder for the runs and the comparison.")
    flags.DEFINE_string(
        "sst2_dir", "default_run/rt_polarity/sst2", "rt-polarity in SST-2 layout (rt_polarity.py)."
    )
    flags.DEFINE_multi_string(
        "arms", [], "name=family:init_checkpoint,... (gpt, t5, xlnet; empty = scratch); repeatable."
    )
    flags.DEFINE_list("seeds", ["1", "2", "3"], "Fine-tuning seeds, the same for every arm.")
    flags.DEFINE_string("bpe_dir", None, "encoder.json + vocab.bpe the GPT and T5 were trained on.")
    flags.DEFINE_string("gpt_config_file", "configs/gpt_tiny_bpe8k.json", "GPT config.")
    flags.DEFINE_string("t5_config_file", "configs/t5_tiny.json", "T5 config.")
    flags.DEFINE_string("xlnet_config_file", "configs/xlnet_tiny.json", "XLNet config.")
    flags.DEFINE_string(
        "xlnet_vocab_file", None, "XLNet's tokenizer (BPE folder or vocab.txt); default --bpe_dir."
    )
    flags.DEFINE_integer("max_seq_length", 64, "rt-polarity sentences: 21 words on average.")
    flags.DEFINE_integer("max_target_length", 6, "T5 target ids: the label word and </s>.")
    flags.DEFINE_integer("train_batch_size", 32, "Training batch size.")
    flags.DEFINE_integer("eval_batch_size", 64, "Eval and predict batch size.")
    flags.DEFINE_float("num_train_epochs", 3.0, "Epochs over the 3,200 training sentences.")
    flags.DEFINE_float("warmup_proportion", 0.1, "Warmup fraction.")
    flags.DEFINE_integer(
        "save_checkpoints_steps", 100000, "Checkpoint period: default only at the end."
    )
    flags.DEFINE_integer("iterations_per_loop", 50, "Steps per compiled loop between logs.")
    flags.DEFINE_float("gpt_learning_rate", 3e-4, "GPT peak learning rate.")
    flags.DEFINE_float("t5_learning_rate", 1e-3, "T5 peak learning rate.")
    flags.DEFINE_float("xlnet_learning_rate", 3e-4, "XLNet peak learning rate.")
    flags.DEFINE_float("lm_coef", 0.5, "GPT's auxiliary LM weight (Radford et al. 2018 sec. 3.2).")
    flags.DEFINE_bool(
        "collect_only", False, "Run nothing: summarise the finished runs of these arms and seeds."
    )
    flags.mark_flag_as_required("output_dir")
    flags.mark_flag_as_required("bpe_dir")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
