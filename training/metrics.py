"""Evaluation metrics as GLUE defines them (Wang et al. 2019, sec. 3 and table 1), in numpy.

GLUE scores each task with the metrics below, and a task with two metrics by their unweighted
average (Wang et al. 2019, sec. 4: "For tasks with multiple metrics, we use an unweighted average
of the metrics as the score for the task"). The reference implementation behind the GLUE
leaderboard is scikit-learn (`f1_score`, `matthews_corrcoef`) and scipy (`pearsonr`,
`spearmanr`); tests/test_metrics.py checks these functions against both.

All functions take 1-D array-likes of equal length and return a Python float.
"""

from __future__ import annotations

import math

import numpy as np

# What GLUE reports per task; the task score is their mean.
METRIC_NAMES = ("accuracy", "f1", "mcc", "pearson", "spearman")


def _pair(labels, predictions, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=dtype).reshape(-1)
    p = np.asarray(predictions, dtype=dtype).reshape(-1)
    if y.shape != p.shape:
        raise ValueError(f"labels and predictions differ in length: {y.shape[0]} vs {p.shape[0]}")
    if y.size == 0:
        raise ValueError("a metric over zero examples is undefined")
    return y, p


def accuracy(labels, predictions) -> float:
    """Fraction of predictions equal to the label. labels, predictions: int (N,)."""
    y, p = _pair(labels, predictions)
    return float(np.mean(y == p))


def f1(labels, predictions, positive=1) -> float:
    """F1 of the positive class (MRPC, QQP: the paraphrase / duplicate class, label 1).

    2 TP / (2 TP + FP + FN); 0.0 when there is no positive label and no positive prediction, as
    scikit-learn's f1_score (zero_division=0). labels, predictions: int (N,).
    """
    y, p = _pair(labels, predictions)
    tp = float(np.sum((p == positive) & (y == positive)))
    fp = float(np.sum((p == positive) & (y != positive)))
    fn = float(np.sum((p != positive) & (y == positive)))
    denominator = 2 * tp + fp + fn
    return 2 * tp / denominator if denominator else 0.0


def matthews_corrcoef(labels, predictions) -> float:
    """Matthews correlation coefficient (CoLA; the AX diagnostic's R3), any number of classes.

    The multi-class form from the confusion matrix C (Gorodkin 2004), which is the binary
    (TP TN - FP FN) / sqrt(...) for two classes:
      (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2))
    with c correct predictions, s examples, p_k predicted and t_k true counts of class k.
    0.0 when the denominator is 0 (one class only), as scikit-learn.
    """
    y, p = _pair(labels, predictions)
    classes, inverse = np.unique(np.concatenate([y, p]), return_inverse=True)
    yi, pi = inverse[: y.size], inverse[y.size :]
    k = classes.size
    t_k = np.bincount(yi, minlength=k).astype(np.float64)
    p_k = np.bincount(pi, minlength=k).astype(np.float64)
    c = float(np.sum(yi == pi))
    s = float(y.size)
    cov_yp = c * s - float(np.dot(p_k, t_k))
    cov_pp = s * s - float(np.dot(p_k, p_k))
    cov_yy = s * s - float(np.dot(t_k, t_k))
    if cov_pp == 0.0 or cov_yy == 0.0:
        return 0.0
    return cov_yp / math.sqrt(cov_pp * cov_yy)


def pearson(labels, predictions) -> float:
    """Pearson correlation (STS-B). labels, predictions: float (N,).

    NaN when either side is constant (the correlation is undefined), as scipy.stats.pearsonr.
    """
    y, p = _pair(labels, predictions, np.float64)
    y, p = y - y.mean(), p - p.mean()
    denominator = math.sqrt(float(np.dot(y, y)) * float(np.dot(p, p)))
    if denominator == 0.0:
        return math.nan
    return float(np.clip(np.dot(y, p) / denominator, -1.0, 1.0))


def average_ranks(values) -> np.ndarray:
    """Ranks from 1, ties sharing the average of their ranks (scipy.stats.rankdata 'average').

    values: (N,) -> float64 (N,).
    """
    x = np.asarray(values).reshape(-1)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Start of each run of equal values in sorted order.
    starts = np.flatnonzero(np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]]))
    ends = np.concatenate([starts[1:], [x.size]])
    run_rank = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(labels, predictions) -> float:
    """Spearman rank correlation (STS-B): Pearson of the average ranks, ties averaged."""
    y, p = _pair(labels, predictions, np.float64)
    return pearson(average_ranks(y), average_ranks(p))


_FUNCTIONS = {
    "accuracy": accuracy,
    "f1": f1,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute(names, labels, predictions) -> dict:
    """The named metrics plus GLUE's task `score` (their unweighted mean, sec. 4).

    Args:
      names: metric names from METRIC_NAMES, e.g. ("f1", "accuracy") for MRPC.
      labels, predictions: (N,) class ids (int) or scores (float, for pearson / spearman).
    Returns {name: float, ..., "score": float}; the score is NaN if any metric is.
    """
    unknown = [n for n in names if n not in _FUNCTIONS]
    if unknown or not names:
        raise ValueError(f"metric names must be some of {METRIC_NAMES}, found {list(names)}")
    out = {name: _FUNCTIONS[name](labels, predictions) for name in names}
    out["score"] = float(np.mean([out[n] for n in names]))
    return out


def label_word_metrics(names, targets, predictions, words) -> dict:
    """GLUE metrics of decoded label words (text-to-text classification): compute(names) over
    the words' ids (their order in `words`, the labels' order), with `accuracy` (exact match)
    always, and `invalid`, the fraction of predictions that are no label word. Such a
    prediction is a class of its own, wrong under every metric (for F1, not the positive
    class; for MCC, one more class)."""
    ids = {w: i for i, w in enumerate(words)}
    labels = [ids[t] for t in targets]
    ids_predicted = [ids.get(p, -1) for p in predictions]
    out = compute(names, labels, ids_predicted)
    out.setdefault("accuracy", accuracy(labels, ids_predicted))
    return out | {"invalid": sum(p < 0 for p in ids_predicted) / len(ids_predicted)}


def mean_and_spread(values) -> dict:
    """Summary of one quantity over seeds: mean, sample standard deviation, min, max, n.

    The standard deviation uses n - 1 (ddof=1); it is 0.0 for a single value.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise ValueError("no values to summarise")
    std = float(np.std(v, ddof=1)) if v.size > 1 else 0.0
    return {
        "mean": float(v.mean()),
        "std": std,
        "min": float(v.min()),
        "max": float(v.max()),
        "n": int(v.size),
    }
