"""training/squad_eval.py: the official SQuAD scores on hand-computed cases, the v2.0 threshold
search, get_final_text, n-best assembly, and the span loss.

Every expected number is worked out by hand from evaluate-v1.1.py / evaluate-v2.0.py's
definitions in the comment beside it."""

import math

import numpy as np
import pytest

from data_prep import squad
from training import squad_eval as se


def dataset(qas):
    return {"data": [{"paragraphs": [{"context": "unused", "qas": qas}]}]}


def q(qid, *golds):
    return {"id": qid, "question": "?", "answers": [{"text": g, "answer_start": 0} for g in golds]}


def test_normalize_answer():
    # lower -> drop punctuation -> drop articles -> single spaces
    assert se.normalize_answer("The  Cat's, a hat!") == "cats hat"
    assert se.normalize_answer("An apple\tthe END.") == "apple end"
    assert se.normalize_answer("theater") == "theater"  # articles only as whole words
    assert se.normalize_answer("Café–Noir") == "café–noir"  # en dash is not ASCII punctuation


def test_exact_and_f1_by_hand():
    assert se.exact_match("The Denver Broncos", "denver broncos!") == 1
    # gold "cat sat on mat" (4 tokens), pred "cat sat mat here" (4): 3 common, P = R = 3/4.
    assert se.f1_v2("the cat sat on the mat", "cat sat mat here") == pytest.approx(0.75)
    # gold [blue, whale], pred [whale]: P 1, R 1/2, F1 2/3.
    assert se.f1_v1("blue whale", "the whale") == pytest.approx(2 / 3)
    # Repeated tokens count by multiset: gold [a1, a1, b], pred [a1, b, b]: common {a1, b} = 2.
    assert se.f1_v1("x x y", "x y y") == pytest.approx(2 / 3)
    # Empty answers: v2.0 scores 1 only if both are empty; v1.1 has no special case.
    assert se.f1_v2("", "") == 1.0 and se.f1_v2("", "b") == 0.0 and se.f1_v1("", "") == 0.0
    assert se.f1_v2("the", "") == 1.0 and se.f1_v2("", "a") == 1.0  # articles normalise to ""


def test_evaluate_v1_by_hand():
    data = dataset(
        [
            q("q1", "Denver Broncos", "The Denver Broncos"),
            q("q2", "in 1998", "1998"),
            q("q3", "x"),
        ]
    )
    preds = {"q1": "denver broncos!", "q2": "1998 season"}  # q3 missing: scores 0, still counted
    r = se.evaluate_v1(data, preds)
    # q2 F1: vs "in 1998" P 1/2 R 1/2 -> 1/2; vs "1998" P 1/2 R 1 -> 2/3; max 2/3.
    assert r["exact_match"] == pytest.approx(100 / 3)
    assert r["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert (r["total"], r["missing"]) == (3, 1)


@pytest.fixture
def v2_fixture():
    data = dataset([q("q1", "Paris"), q("q2", "blue whale"), q("q3"), q("q4")])
    preds = {"q1": "Paris", "q2": "whale", "q3": "something", "q4": "x"}
    na = {"q1": 0.1, "q2": 0.5, "q3": 0.8, "q4": 0.6}
    return data, preds, na


def test_evaluate_v2_by_hand(v2_fixture):
    data, preds, na = v2_fixture
    # Raw: q1 EM 1 F1 1; q2 EM 0 F1 2/3; q3, q4 (no answer, non-empty prediction) 0 and 0.
    r = se.evaluate_v2(data, preds, na, na_prob_thresh=1.0)  # no na_prob above 1: raw scores
    assert r["exact"] == pytest.approx(25.0) and r["f1"] == pytest.approx(100 * (5 / 3) / 4)
    assert r["total"] == 4 and r["HasAns_total"] == 2 and r["NoAns_total"] == 2
    assert r["HasAns_exact"] == pytest.approx(50.0)
    assert r["HasAns_f1"] == pytest.approx(100 * (5 / 3) / 2)
    assert r["NoAns_exact"] == 0.0 and r["NoAns_f1"] == 0.0
    # Threshold search (EM), questions by increasing na_prob, start = 2 (the NoAns count):
    # q1 (0.1) +1 -> 3*, q2 (0.5) +0 -> 3, q4 (0.6) -1 -> 2, q3 (0.8) -1 -> 1. Best 3/4 at 0.1.
    assert r["best_exact"] == pytest.approx(75.0) and r["best_exact_thresh"] == 0.1
    # F1: 2 -> 3 (0.1) -> 3 2/3* (0.5) -> 2 2/3 -> 1 2/3. Best 3 2/3 / 4 at 0.5.
    assert r["best_f1"] == pytest.approx(100 * (11 / 3) / 4) and r["best_f1_thresh"] == 0.5
    # At threshold 0.4: q2 (0.5), q3, q4 answered "no answer": q2 0, q3 1, q4 1.
    r = se.evaluate_v2(data, preds, na, na_prob_thresh=0.4)
    assert r["exact"] == pytest.approx(75.0) and r["f1"] == pytest.approx(75.0)
    assert r["HasAns_exact"] == pytest.approx(50.0) and r["NoAns_exact"] == pytest.approx(100.0)
    # Without na_probs: no threshold search; an empty prediction is right for NoAns questions.
    r = se.evaluate_v2(data, {**preds, "q3": ""})
    assert "best_f1" not in r and r["NoAns_exact"] == pytest.approx(50.0)


def test_evaluate_v2_leaves_out_missing_predictions(v2_fixture):
    data, preds, na = v2_fixture
    del preds["q1"]
    r = se.evaluate_v2(data, preds, None)
    assert r["total"] == 3 and r["f1"] == pytest.approx(100 * (2 / 3) / 3)


def test_get_final_text():
    assert se.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert se.get_final_text("cafe", "(Café)", True) == "Café"
    assert se.get_final_text("1895", "(1895-1943).", True) == "1895"
    # Cased tokenizer: no lower-casing, the match is exact.
    assert se.get_final_text("Smith", "Steve Smith's", False) == "Smith"
    # Not found, or normalisation changed the length (a decomposed accent): the whole text.
    assert se.get_final_text("jones", "Steve Smith", True) == "Steve Smith"
    assert se.get_final_text("cafe", "Cafe\u0301!", True) == "Cafe\u0301!"


def one_window():
    """An example "The Eiffel Tower, Paris." and its one window, positions counted by hand."""
    example = squad.SquadExample("e1", "q", ["The", "Eiffel", "Tower,", "Paris."])
    tokens = ["[CLS]", "q", "[SEP]", "the", "eiffel", "tower", ",", "paris", ".", "[SEP]"]
    feature = squad.InputFeatures(
        unique_id=squad.FIRST_UNIQUE_ID,
        example_index=0,
        doc_span_index=0,
        tokens=tokens,
        token_to_orig_map={3: 0, 4: 1, 5: 2, 6: 2, 7: 3, 8: 3},
        token_is_max_context={i: True for i in range(3, 9)},
        input_ids=[0] * 10,
        input_mask=[1] * 10,
        segment_ids=[0] * 10,
    )
    logits = np.zeros((1, 10, 2), np.float32)
    logits[0, [7, 0, 4], 0] = [5.0, 4.0, 3.0]  # start: paris 5, [CLS] 4, eiffel 3
    logits[0, [7, 0, 6], 1] = [5.0, 4.0, 2.0]  # end: paris 5, [CLS] 4, "," 2
    return example, feature, logits


def test_make_predictions_v1_and_v2_by_hand():
    example, feature, logits = one_window()
    args = dict(n_best_size=3, max_answer_length=3, do_lower_case=True)
    # Candidates among the top-3 starts {7, 0, 4} and ends {7, 0, 6}: (7, 7) = 10; (4, 6) = 5;
    # (4, 7) is 4 tokens > max_answer_length; position 0 is not in the document.
    preds, nbest, odds, best = se.make_predictions(
        [example], [feature], logits, **args, version_2_with_negative=False,
        null_score_diff_threshold=0.0,
    )  # fmt: skip
    assert preds == {"e1": "Paris"} and odds == {} and best == {"e1": "Paris"}
    assert [n["text"] for n in nbest["e1"]] == ["Paris", "Eiffel Tower,"]
    p = 1 / (1 + math.exp(-5))  # softmax of (10, 5)
    assert nbest["e1"][0]["probability"] == pytest.approx(p)
    assert (nbest["e1"][1]["start_logit"], nbest["e1"][1]["end_logit"]) == (3.0, 2.0)

    # v2.0: null = 4 + 4 = 8; diff = 8 - 10 = -2: an answer at threshold 0, none at -3.
    for threshold, expected in ((0.0, "Paris"), (-3.0, "")):
        preds, nbest, odds, best = se.make_predictions(
            [example], [feature], logits, **args, version_2_with_negative=True,
            null_score_diff_threshold=threshold,
        )  # fmt: skip
        assert preds == {"e1": expected} and odds == {"e1": pytest.approx(-2.0)}
        assert best == {"e1": "Paris"}
        assert [n["text"] for n in nbest["e1"]] == ["Paris", "", "Eiffel Tower,"]


def test_make_predictions_respects_max_context_and_dedupes():
    example, feature, logits = one_window()
    feature.token_is_max_context[7] = False  # "paris" is better seen in another window
    preds, nbest, _, _ = se.make_predictions([example], [feature], logits, 3, 3, True, False, 0.0)
    assert preds == {"e1": "Eiffel Tower,"}
    # Two spans with the same final text keep only the higher-scoring one: "Paris or Paris".
    example = squad.SquadExample("e2", "q", ["Paris", "or", "Paris"])
    feature = squad.InputFeatures(
        squad.FIRST_UNIQUE_ID, 0, 0, ["[CLS]", "q", "[SEP]", "paris", "or", "paris", "[SEP]"],
        {3: 0, 4: 1, 5: 2}, {3: True, 4: True, 5: True}, [0] * 7, [1] * 7, [0] * 7,
    )  # fmt: skip
    logits = np.zeros((1, 7, 2), np.float32)
    logits[0, [3, 5], 0] = [5.0, 4.0]
    logits[0, [3, 5], 1] = [5.0, 4.0]
    # (3, 3) = 10 "Paris", (3, 5) = 9 "Paris or Paris", (5, 5) = 8 "Paris" again: dropped.
    preds, nbest, _, _ = se.make_predictions([example], [feature], logits, 3, 3, True, False, 0.0)
    assert [n["text"] for n in nbest["e2"]] == ["Paris", "Paris or Paris"]
    # Only a null candidate (no document position in the top starts): "empty" is kept first.
    example, feature, logits = one_window()
    preds, nbest, _, _ = se.make_predictions([example], [feature], logits, 1, 0, True, True, 0.0)
    assert [n["text"] for n in nbest["e1"]] == ["empty", ""]


def test_span_sums_by_hand():
    # Uniform logits over S = 4: each cross-entropy is log 4, the loss their mean.
    logits = np.zeros((3, 4, 2), np.float32)
    logits[0, 2, 0] = 10.0  # example 0 predicts start 2
    sums = se.span_sums(logits, np.array([2, 1, 0]), np.array([3, 3, 3]))
    ce0 = -math.log(math.exp(10) / (math.exp(10) + 3))
    expected = (ce0 + math.log(4)) / 2 + 2 * math.log(4)
    assert float(sums["loss_sum"]) == pytest.approx(expected, rel=1e-5)
    assert float(sums["count"]) == 3.0
    # argmax of a uniform row is position 0: starts right for examples 0 (2) and 2 (0).
    assert float(sums["start_correct"]) == 2.0 and float(sums["end_correct"]) == 0.0
