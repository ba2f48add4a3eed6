"""Issue #5 gaps closed by the audit (tests/claims/issue5_ner.md): tags unknown at evaluation time
are a counted warning naming file and line and are still scored as gold (conlleval counts them
as missed), checked against seqeval; the strict-scheme repair count reaches the log line; an
empty extract_features input names the file."""

import logging

import pytest
from seqeval.metrics import classification_report, f1_score, recall_score

from data_prep import conll, feature_files
from data_prep.errors import InputError
from data_prep.tokenization import RESERVED_TOKENS, FullTokenizer
from training import ner_eval

VOCAB = [*RESERVED_TOKENS, "john", "lives", "in", "new", "york", "at", "acme", "."]
LABELS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]  # what training saw: no ORG


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return FullTokenizer(path)


def test_unknown_labels_at_eval_time_are_counted_named_and_scored_as_gold(
    tmp_path, tokenizer, caplog
):
    dev = tmp_path / "dev.txt"
    dev.write_text(
        "John B-PER\nlives O\nin O\nNew B-LOC\nYork I-LOC\n\n"
        "John B-PER\nat O\nAcme B-ORG\n.\tO\n\n"
        "Acme B-ORG\nin O\nYork B-LOC\n"
    )
    data = conll.read_conll(dev)
    sentences = conll.normalize_tags(data.sentences, "bio").sentences
    encoded = conll.encode_sentences(sentences, LABELS, tokenizer, 9, 2)
    assert encoded.unknown == [f"{dev}:9: 'B-ORG'", f"{dev}:12: 'B-ORG'"]
    # No loss where the gold tag is unknown; every other word has weight 1.
    assert encoded.features["label_weights"].sum() == 12 - 2
    with caplog.at_level(logging.WARNING, logger="data_prep.conll"):
        conll.log_encoding(str(dev), encoded, 9)
    assert f"{dev}: 2 tags are not in the label list" in caplog.text
    assert f"{dev}:9: 'B-ORG'; {dev}:12: 'B-ORG'" in caplog.text
    # A perfect model on the known labels: the ORG entities can never be predicted.
    predicted = conll.reassemble(encoded, encoded.features["label_ids"], LABELS)
    gold = [list(s.tags) for s in sentences]
    assert predicted[1] == ["B-PER", "O", "O", "O"]
    scores = ner_eval.evaluate(gold, predicted)
    assert scores["per_type"]["ORG"] == {
        "precision": 0.0, "recall": 0.0, "f1": 0.0, "correct": 0, "predicted": 0, "gold": 2,
    }  # fmt: skip
    assert (scores["correct"], scores["predicted"], scores["gold"]) == (4, 4, 6)
    # The same figures from seqeval (an implementation no one here wrote).
    assert scores["recall"] == pytest.approx(recall_score(gold, predicted), abs=1e-12)
    assert scores["f1"] == pytest.approx(f1_score(gold, predicted), abs=1e-12)
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    assert report["ORG"]["support"] == 2 and report["ORG"]["recall"] == 0.0


def test_strict_bio_violations_are_counted_each_with_file_and_line(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("a O\nb I-PER\nc I-PER\nd O\ne I-LOC\n\nf I-MISC\ng B-MISC\n")
    data = conll.read_conll(path)
    done = conll.normalize_tags(data.sentences, "bio")
    assert done.violations == [
        f"{path}:2: 'I-PER' after 'O', read as 'B-PER'",
        f"{path}:5: 'I-LOC' after 'O', read as 'B-LOC'",
        f"{path}:7: 'I-MISC' after the sentence start, read as 'B-MISC'",
    ]
    # Repair keeps conlleval's reading, so the entities (and every score) are unchanged.
    for before, after in zip(data.sentences, done.sentences, strict=True):
        assert conll.chunks(before.tags) == conll.chunks(after.tags)
    with pytest.raises(InputError, match=rf"{path}:2: expected tags valid in strict bio"):
        conll.normalize_tags(data.sentences, "bio", repair=False)


def test_empty_feature_input_names_the_file(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("")
    with pytest.raises(InputError, match=rf"{path}: expected one `text_a.*, found an empty file"):
        feature_files.read_input_lines(path)
    path.write_text("John lives in York .\n\nNew York ||| Acme\n")
    lines = feature_files.read_input_lines(path)
    assert [(x.line, x.text_a, x.text_b) for x in lines] == [
        (1, "John lives in York .", None), (2, "", None), (3, "New York", "Acme"),
    ]  # fmt: skip


def test_conlleval_report_is_written_atomically_byte_for_byte(tmp_path):
    """run_ner writes dev_conlleval.txt / test_conlleval.txt with conll.write_lines (temp file +
    rename) from the report's lines: the file equals the report exactly and no temp file stays."""
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-ORG"]]
    report = ner_eval.report(ner_eval.evaluate(gold, pred))
    path = tmp_path / "dev_conlleval.txt"
    conll.write_lines(path, report.splitlines())
    assert path.read_text() == report and report.endswith("\n")
    assert [p.name for p in tmp_path.iterdir()] == ["dev_conlleval.txt"]
