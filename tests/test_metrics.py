"""GLUE metrics: hand-computed cases, then parity with scikit-learn and scipy (what GLUE used)."""

import math

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from training import metrics


def test_hand_computed_cases():
    y = [1, 1, 1, 1, 0, 0, 0]
    p = [1, 1, 1, 0, 1, 0, 0]  # TP 3, FN 1, FP 1, TN 2
    assert metrics.accuracy(y, p) == pytest.approx(5 / 7)
    assert metrics.f1(y, p) == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    # (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (6 - 1) / sqrt(4 * 4 * 3 * 3)
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(5 / 12)
    assert metrics.pearson([1, 2, 3], [2, 4, 6.5]) == pytest.approx(
        np.corrcoef([1, 2, 3], [2, 4, 6.5])[0, 1]
    )
    # Ranks of [10, 20, 20, 30] are [1, 2.5, 2.5, 4]; a monotone map keeps Spearman at 1.
    np.testing.assert_array_equal(metrics.average_ranks([10, 20, 20, 30]), [1, 2.5, 2.5, 4])
    assert metrics.spearman([10, 20, 20, 30], [0.1, 0.5, 0.5, 9.0]) == pytest.approx(1.0)


def test_degenerate_cases_follow_the_references():
    assert metrics.f1([0, 0, 0], [0, 0, 0]) == 0.0  # sklearn zero_division=0
    assert metrics.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0  # one predicted class
    assert math.isnan(metrics.pearson([1, 2, 3], [5, 5, 5]))
    with pytest.raises(ValueError, match="length"):
        metrics.accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="zero examples"):
        metrics.f1([], [])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_parity_with_scikit_learn_and_scipy(seed):
    rng = np.random.default_rng(seed)
    n = 97
    y2, p2 = rng.integers(0, 2, n), rng.integers(0, 2, n)
    y3, p3 = rng.integers(0, 3, n), rng.integers(0, 3, n)
    assert metrics.accuracy(y3, p3) == pytest.approx(skm.accuracy_score(y3, p3), abs=1e-12)
    assert metrics.f1(y2, p2) == pytest.approx(skm.f1_score(y2, p2), abs=1e-12)
    assert metrics.matthews_corrcoef(y2, p2) == pytest.approx(
        skm.matthews_corrcoef(y2, p2), abs=1e-12
    )
    assert metrics.matthews_corrcoef(y3, p3) == pytest.approx(
        skm.matthews_corrcoef(y3, p3), abs=1e-12
    )
    # STS-B-like scores with many ties (labels are multiples of 0.2 in [0, 5]).
    gold = np.round(rng.uniform(0, 5, n) * 5) / 5
    pred = gold + rng.normal(0, 1.0, n)
    pred[:10] = np.round(pred[:10])
    assert metrics.pearson(gold, pred) == pytest.approx(stats.pearsonr(gold, pred)[0], abs=1e-12)
    assert metrics.spearman(gold, pred) == pytest.approx(stats.spearmanr(gold, pred)[0], abs=1e-12)
    np.testing.assert_allclose(metrics.average_ranks(gold), stats.rankdata(gold))


def test_compute_gives_glue_task_score_and_seed_summary():
    y, p = [1, 0, 1, 1], [1, 0, 0, 1]
    out = metrics.compute(("f1", "accuracy"), y, p)
    assert out["accuracy"] == 0.75 and out["f1"] == pytest.approx(0.8)
    assert out["score"] == pytest.approx((0.75 + 0.8) / 2)  # GLUE: unweighted mean
    with pytest.raises(ValueError, match="metric names"):
        metrics.compute(("bleu",), y, p)
    s = metrics.mean_and_spread([0.7, 0.8, 0.75])
    assert s["mean"] == pytest.approx(0.75) and s["n"] == 3
    assert s["std"] == pytest.approx(np.std([0.7, 0.8, 0.75], ddof=1))
    assert (s["min"], s["max"]) == (0.7, 0.8)
    assert metrics.mean_and_spread([0.5])["std"] == 0.0


def test_label_word_metrics_count_a_word_outside_the_labels_as_wrong():
    """Decoded label words scored as GLUE scores the task, against scikit-learn on the ids; a
    decoded text that is no label word is a class of its own (-1)."""
    words = ("unacceptable", "acceptable")
    targets = ["acceptable", "acceptable", "unacceptable", "acceptable", "unacceptable"]
    predictions = ["acceptable", "ok", "unacceptable", "unacceptable", "acceptable"]
    labels, ids = [1, 1, 0, 1, 0], [1, -1, 0, 0, 1]
    cola = metrics.label_word_metrics(("mcc",), targets, predictions, words)
    assert cola["mcc"] == pytest.approx(skm.matthews_corrcoef(labels, ids))
    assert cola["score"] == cola["mcc"] and cola["accuracy"] == 2 / 5 and cola["invalid"] == 1 / 5
    mrpc = metrics.label_word_metrics(("f1", "accuracy"), targets, predictions, words)
    assert mrpc["f1"] == pytest.approx(skm.f1_score(labels, ids, labels=[1], average="micro"))
    assert mrpc["score"] == pytest.approx((mrpc["f1"] + 2 / 5) / 2)
    # The invalid prediction is not an "unacceptable" one: MCC differs from mapping it to 0.
    assert cola["mcc"] != pytest.approx(skm.matthews_corrcoef(labels, [1, 0, 0, 0, 1]))
