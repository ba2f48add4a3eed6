"""Entity-level scores against hand-computed cases, against conlleval.pl itself (the CoNLL scorer,
shipped in seqeval 1.2.2's sdist and fetched at test time; run with perl) and against seqeval
(default mode: conlleval's reading; strict mode: only well-formed entities)."""

import shutil
import subprocess

import numpy as np
import pytest
from seqeval import metrics as sq
from seqeval.scheme import IOB2, IOBES

from data_prep import conll, fetch
from training import ner_eval

TYPES = ("PER", "LOC", "geo-loc")


@pytest.fixture(scope="module")
def conlleval_pl():
    if shutil.which("perl") is None:
        pytest.skip("perl is not installed")
    paths = fetch.fetch_package_files("seqeval==1.2.2", lambda n: "/tests/" in n, binary=False)
    return next(p for p in paths if p.name == "conlleval.pl")


def run_conlleval(script, path) -> str:
    with open(path) as f:
        return subprocess.run(
            ["perl", str(script)], stdin=f, capture_output=True, text=True, check=True
        ).stdout


def random_tags(rng, lengths, prefixes="BIO"):
    """Random, often ill-formed tag sequences over TYPES, one per length."""
    out = []
    for n in lengths:
        tags = []
        for _ in range(n):
            p = prefixes[rng.integers(len(prefixes))]
            tags.append("O" if p == "O" else f"{p}-{TYPES[rng.integers(len(TYPES))]}")
        out.append(tags)
    return out


def valid_tags(rng, lengths, scheme):
    out = []
    for n in lengths:
        spans, i = [], 0
        while i < n:
            length = int(rng.integers(1, 4))
            if rng.random() < 0.4 and i + length <= n:
                spans.append((TYPES[rng.integers(len(TYPES))], i, i + length - 1))
                i += length
            else:
                i += 1
        out.append(conll.encode(spans, n, scheme))
    return out


# ---------------------------------------------------------------------------------------------
# Hand-computed cases
# ---------------------------------------------------------------------------------------------


def test_hand_computed_scores():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "I-LOC", "I-LOC"]]
    pred = [["B-PER", "I-PER", "O", "B-PER"], ["B-LOC", "I-LOC", "O"]]
    s = ner_eval.evaluate(gold, pred)
    # Correct: PER(0-1) only. LOC(0-2) vs LOC(0-1): one boundary differs, so no credit.
    assert (s["correct"], s["predicted"], s["gold"]) == (1, 3, 3)
    assert s["precision"] == pytest.approx(1 / 3) and s["recall"] == pytest.approx(1 / 3)
    assert s["f1"] == pytest.approx(1 / 3)
    assert s["per_type"]["PER"] == {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3),
                                    "correct": 1, "predicted": 2, "gold": 1}  # fmt: skip
    assert s["per_type"]["LOC"]["precision"] == 0.0 and s["per_type"]["LOC"]["gold"] == 2
    assert s["accuracy"] == pytest.approx(5 / 7) and s["tokens"] == 7


def test_conlleval_reading_of_iob1_and_broken_bio():
    # I- after O starts an entity: IOB1 and BIO of the same entities score the same.
    s = ner_eval.evaluate([["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]])
    assert s["f1"] == 1.0 and s["accuracy"] == pytest.approx(2 / 3)  # tags differ, entity not
    # A type change inside a run splits it; so does B-.
    s = ner_eval.evaluate([["B-PER", "I-PER"]], [["B-PER", "I-LOC"]])
    assert (s["correct"], s["predicted"]) == (0, 2)
    s = ner_eval.evaluate([["B-PER", "B-PER"]], [["B-PER", "I-PER"]])
    assert (s["correct"], s["predicted"], s["gold"]) == (0, 1, 2)
    # Nothing predicted, nothing gold: zeros, not a division error.
    s = ner_eval.evaluate([["O"]], [["O"]])
    assert (s["precision"], s["recall"], s["f1"], s["accuracy"]) == (0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        ner_eval.evaluate([["O", "O"]], [["O"]])


def test_flat_results_and_loss():
    s = ner_eval.evaluate([["B-PER", "O", "B-geo-loc"]], [["B-PER", "B-geo-loc", "O"]])
    flat = ner_eval.flat_results(s)
    assert flat["f1"] == 0.5 and flat["f1_PER"] == 1.0 and flat["recall_geo-loc"] == 0.0
    assert flat["token_accuracy"] == pytest.approx(1 / 3) and flat["gold_entities"] == 2
    logits = np.array([[[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]]])  # (1, 2, 3)
    labels, weights = np.array([[0, 2]]), np.array([[1.0, 0.0]])
    expected = -np.log(np.exp(2) / (np.exp(2) + 1 + np.exp(-1)))
    assert ner_eval.tagging_loss(logits, labels, weights) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------
# conlleval.pl
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_conlleval_pl_on_random_ill_formed_tags(conlleval_pl, tmp_path, seed):
    """conlleval.pl (2004) knows B-, I- and O only; on those, including every ill-formed
    sequence a model can emit, the report is byte for byte the script's."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 12, 150)
    gold, pred = random_tags(rng, lengths), random_tags(rng, lengths)
    pred[:40] = [list(g) for g in gold[:40]]  # some exact matches, so correct > 0 by type
    words = [[f"w{i}" for i in range(len(g))] for g in gold]
    path = ner_eval.write_predictions(tmp_path / "p.txt", words, gold, pred)
    scores = ner_eval.evaluate(gold, pred)
    assert scores["correct"] > 40
    assert ner_eval.report(scores) == run_conlleval(conlleval_pl, path)


def test_equals_conlleval_pl_on_real_conll2000_chunking(conlleval_pl):
    path = next(
        p
        for p in fetch.fetch_package_files("seqeval==1.2.2", lambda n: "/tests/" in n, False)
        if p.name == "ground_truth.txt"
    )
    data = conll.read_conll(path)
    rows = [[line.split(" ") for line in block.splitlines()]
            for block in path.read_text().strip().split("\n\n")]  # fmt: skip
    gold = [[r[2] for r in block] for block in rows]
    pred = [list(s.tags) for s in data.sentences]  # the reader takes the last column
    scores = ner_eval.evaluate(gold, pred)
    assert ner_eval.report(scores) == run_conlleval(conlleval_pl, path)
    assert 0.5 < scores["f1"] < 1.0  # real disagreement, so the check has teeth


# ---------------------------------------------------------------------------------------------
# seqeval
# ---------------------------------------------------------------------------------------------


def _check_against_seqeval(gold, pred, **mode):
    ours = ner_eval.evaluate(gold, pred)
    for name, fn in (("precision", sq.precision_score), ("recall", sq.recall_score),
                     ("f1", sq.f1_score)):  # fmt: skip
        assert ours[name] == pytest.approx(fn(gold, pred, zero_division=0, **mode), abs=1e-12)
    report = sq.classification_report(gold, pred, output_dict=True, zero_division=0, **mode)
    for kind, s in ours["per_type"].items():
        if s["gold"]:  # seqeval lists only types with gold support
            assert report[kind]["f1-score"] == pytest.approx(s["f1"], abs=1e-12)
            assert report[kind]["support"] == s["gold"]
    assert ours["accuracy"] == pytest.approx(sq.accuracy_score(gold, pred))


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_seqeval_default_mode_on_random_iobes_like_tags(seed):
    # seqeval's default mode is conlleval's reading extended with E- and S- tags.
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 12, 300)
    gold, pred = random_tags(rng, lengths, "BIESO"), random_tags(rng, lengths, "BIESO")
    pred[:60] = [list(g) for g in gold[:60]]
    _check_against_seqeval(gold, pred)


@pytest.mark.parametrize("scheme, seqeval_scheme", [("bio", IOB2), ("iobes", IOBES)])
def test_equals_seqeval_strict_mode_on_well_formed_tags(scheme, seqeval_scheme):
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 12, 300)
    gold, pred = valid_tags(rng, lengths, scheme), valid_tags(rng, lengths, scheme)
    pred[:60] = [list(g) for g in gold[:60]]
    _check_against_seqeval(gold, pred, mode="strict", scheme=seqeval_scheme)


def test_strict_mode_differs_only_on_ill_formed_predictions():
    gold, pred = [["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]
    assert ner_eval.evaluate(gold, pred)["f1"] == 1.0  # conlleval: I- after O starts an entity
    assert sq.f1_score(gold, pred, mode="strict", scheme=IOB2) == 0.0
    assert sq.f1_score(gold, pred) == 1.0


def test_prediction_file_without_gold(tmp_path):
    path = ner_eval.write_predictions(
        tmp_path / "t.txt", [["New York", "is"]], None, [["B-LOC", "O"]]
    )
    assert (tmp_path / "t.txt").read_text() == "New_York B-LOC\nis O\n\n" and path.endswith("t.txt")
