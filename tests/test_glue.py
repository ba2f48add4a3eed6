"""GLUE / SWAG / tsv readers on fixture files in each official layout, bad input, pair packing,
TFRecords, eval batching, submission files and the tensorflow-datasets path (mocked)."""

import csv

import numpy as np
import pytest
import tensorflow as tf

from data_prep import features, glue
from data_prep.errors import InputError
from data_prep.tokenization import RESERVED_TOKENS, FullTokenizer

WORDS = (
    "the a movie film plot good bad great awful is was not very fun dull man woman dog runs "
    "eats , . ?"
).split()
VOCAB = [*RESERVED_TOKENS, *WORDS]  # 29 tokens: fits the tiny test config's 53


def _sentence(rng) -> str:
    return " ".join(rng.choice(WORDS[:-3], size=int(rng.integers(2, 9)))) + " ."


def _write(path, lines, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "".join(x + "\n" for x in lines), "utf-8")


_MNLI_HEAD = (
    "index promptID pairID genre sentence1_binary_parse sentence2_binary_parse "
    "sentence1_parse sentence2_parse sentence1 sentence2"
).split()
_STSB_HEAD = "index genre filename year old_index source1 source2 sentence1 sentence2".split()
_SWAG_HEAD = [
    "", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
    "ending0", "ending1", "ending2", "ending3",
]  # fmt: skip


def _labelled_rows(task, split_name, n, rng, test):
    """(fields, expected Example fields) for one file of `task`; the fields sit where the
    official files have them."""
    rows = []
    for i in range(n):
        a, b = _sentence(rng), _sentence(rng)
        label = None if test else str(rng.choice(task.labels)) if task.labels else None
        exp = {"text_a": a, "text_b": b, "label": label, "index": str(i)}
        name = task.name
        if name == "cola":
            exp["text_b"] = None
            fields = [str(i), a] if test else ["gj04", label, "" if label == "1" else "*", a]
        elif name == "sst-2":
            exp["text_b"] = None
            fields = [str(i), a] if test else [a + " ", label]
        elif name == "mrpc":
            fields = [str(i) if test else label, str(1000 + i), str(2000 + i), a, b]
        elif name == "sts-b":
            score = f"{rng.integers(0, 26) / 5:.3f}"
            exp["label"] = None if test else score
            fields = [
                str(i),
                "main-captions",
                "MSRvid",
                "2012test",
                f"{i:04d}",
                "none",
                "none",
                a,
                b,
            ]
            fields += [] if test else [score]
        elif name == "qqp":
            exp["index"] = str(100 + i)
            fields = [str(100 + i), a, b] if test else [str(100 + i), "1", "2", a, b, label]
        elif name in ("mnli", "ax"):
            fields = [
                str(i),
                "31193",
                f"{i}n",
                "government",
                f"( {a} )",
                f"( {b} )",
                "(ROOT)",
                "(ROOT)",
            ]
            fields = [str(i), a, b] if name == "ax" else fields + [a, b]
            if not test:  # train: label1 + gold_label; dev: label1..label5 + gold_label
                fields += [label] * (2 if split_name == "train" else 6)
        elif name == "qnli":
            fields = [str(i), a, b] + ([] if test else [label])
        elif name in ("rte", "wnli"):
            fields = [str(i), a, b] + ([] if test else [label])
        elif name == "tsv":
            fields = ["" if test else label, a, b]
        elif name == "swag":
            endings = [_sentence(rng) for _ in range(4)]
            exp.update(endings=tuple(endings))
            fields = [str(i), "anetv_x", str(i), f"{a} {b}", a, b, "gold", *endings]
            fields += [] if test else [label]
        rows.append((fields, exp))
    return rows


def _header(task, split):
    name = task.name
    test = split.submission is not None
    if name == "cola":
        return ["index", "sentence"] if test else None
    if name == "sst-2":
        return ["index", "sentence"] if test else ["sentence", "label"]
    if name == "mrpc":
        return ["index" if test else "Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    if name == "sts-b":
        return _STSB_HEAD + ([] if test else ["score"])
    if name == "qqp":
        if test:
            return ["id", "question1", "question2"]
        return ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    if name == "mnli":
        if test:
            return _MNLI_HEAD
        if split.name == "train":
            return _MNLI_HEAD + ["label1", "gold_label"]
        return _MNLI_HEAD + ["label1", "label2", "label3", "label4", "label5", "gold_label"]
    if name == "ax":
        return ["index", "sentence1", "sentence2"]
    if name == "qnli":
        return ["index", "question", "sentence"] + ([] if test else ["label"])
    if name in ("rte", "wnli"):
        return ["index", "sentence1", "sentence2"] + ([] if test else ["label"])
    if name == "swag":
        return _SWAG_HEAD + ([] if test else ["label"])
    return None  # tsv


def splits_of(task) -> list:
    return ([task.train] if task.train else []) + list(task.dev) + list(task.test)


def write_task(root, task, sizes=(11, 5, 4), seed=0) -> list:
    """Writes every split of `task` under root in its official layout (MNLI also writes the AX
    diagnostic at ../diagnostic/diagnostic.tsv, as the GLUE download script does).
    Returns, per split in splits_of(task) order, the fields each read Example must have."""
    rng = np.random.default_rng(seed)
    expected = []
    splits = [(task.train, sizes[0])] if task.train else []
    splits += [(s, sizes[1]) for s in task.dev] + [(s, sizes[2]) for s in task.test]
    for split, n in splits:
        if task.name == "mnli" and split.name == "ax":
            split_task, path = glue.get_task("ax"), root.parent / "diagnostic" / "diagnostic.tsv"
        else:
            split_task, path = task, root / split.files[0]
        rows = _labelled_rows(split_task, split.name, n, rng, split.submission is not None)
        header = _header(split_task, split)
        if split.layout.delimiter == ",":
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(header)
                w.writerows(fields for fields, _ in rows)
        else:
            lines = (["\t".join(header)] if header else []) + ["\t".join(f) for f, _ in rows]
            _write(path, lines, bom=task.name == "mrpc" and split.name == "train")
        expected.append([e for _, e in rows])
    return expected


ALL_TASKS = [*glue.TASKS, "tsv"]


def _task(name):
    return glue.get_task(name, ["neg", "pos"] if name == "tsv" else ())


@pytest.mark.parametrize("name", ALL_TASKS)
def test_every_task_reads_its_official_layout(tmp_path, name):
    task = _task(name)
    root = tmp_path / "glue" / name.upper()
    expected = write_task(root, task)
    for split, want in zip(splits_of(task), expected, strict=True):
        data = glue.read_split(task, split, root)
        got = [
            {"text_a": e.text_a, "text_b": e.text_b, "label": e.label, "index": e.index}
            | ({"endings": e.endings} if task.num_choices else {})
            for e in data.examples
        ]
        assert got == want, (name, split.name)
        # The first data row is line 1 only in CoLA's headerless train and dev files.
        line = 1 if name in ("cola", "tsv") and split.submission is None else 2
        line = 1 if name == "tsv" else line
        assert data.examples[0].guid == f"{data.source}:{line}"


def test_mnli_without_the_diagnostic_still_reads(tmp_path):
    task = glue.get_task("MNLI")
    write_task(tmp_path / "MNLI", task)
    (tmp_path / "diagnostic" / "diagnostic.tsv").unlink()
    assert glue.read_split(task, task.test[2], tmp_path / "MNLI") is None  # optional AX
    with pytest.raises(InputError, match="dev_matched.tsv.*no such file"):
        glue.read_split(task, task.dev[0], tmp_path / "nowhere")


def test_task_names_and_label_lists():
    assert glue.get_task("SST-2") is glue.get_task("sst2") is glue.TASKS["sst-2"]
    assert glue.get_task("tsv", ["a", "b", "c"]).labels == ("a", "b", "c")
    with pytest.raises(ValueError, match="expected one of"):
        glue.get_task("squad")
    with pytest.raises(ValueError, match="label_list"):
        glue.get_task("tsv", ["only"])
    with pytest.raises(ValueError, match="only for --task_name=tsv"):
        glue.get_task("cola", ["0", "1"])


# ---------------------------------------------------------------------------------------------
# Bad input: every message names the file and line
# ---------------------------------------------------------------------------------------------


def _read(task_name, split_index, path, skip=False):
    task = glue.get_task(task_name, ["neg", "pos"] if task_name == "tsv" else ())
    split = ([task.train] + list(task.dev) + list(task.test))[split_index]
    return glue.read_file(
        path, split.layout, task.labels, task.kind == glue.REGRESSION, skip, task.name
    )


def test_bad_rows_are_errors_naming_file_and_line(tmp_path):
    p = tmp_path / "dev.tsv"
    _write(p, ["sentence\tlabel", "a good film\t1", "no label column here"])
    with pytest.raises(InputError, match=r"dev.tsv:3: expected 2 fields as the header, found 1"):
        _read("sst-2", 1, p)
    _write(p, ["sentence\tlabel", "a good film\t1", "a bad film\tnegative"])
    with pytest.raises(InputError, match=r"dev.tsv:3: expected a label in \['0', '1'\]"):
        _read("sst-2", 1, p)
    head = "\t".join(["index", "sentence1", "sentence2", "score"])
    _write(p, [head, "0\ta\tb\t4.2", "1\ta\tb\tfive"])
    with pytest.raises(InputError, match=r"dev.tsv:3: expected a number as the label"):
        _read("sts-b", 1, p)


def test_empty_files_and_wrong_headers_are_errors(tmp_path):
    p = tmp_path / "train.tsv"
    _write(p, [])
    with pytest.raises(InputError, match=r"train.tsv: expected rows .*, found an empty file"):
        _read("mrpc", 0, p)
    _write(p, ["hide new secretions\t0", "a good film\t1"])  # SST-2 without its header
    with pytest.raises(InputError, match=r"train.tsv:1: expected a header row naming the columns"):
        _read("sst-2", 0, p)
    # CoLA's train.tsv has no header: a header row is refused, not read as an example.
    _write(p, ["source\tlabel\tmark\tsentence", "gj04\t1\t\tThe dog runs."])
    with pytest.raises(InputError, match=r"train.tsv:1: .*no header row.*looks like a header"):
        _read("cola", 0, p)
    _write(p, ["sentence\tlabel"])
    with pytest.raises(InputError, match=r"at least one data row"):
        _read("sst-2", 0, p)


def test_skip_bad_rows_counts_and_names_them_but_never_in_test_files(tmp_path, caplog):
    task = glue.get_task("rte")
    head = "index\tsentence1\tsentence2\tlabel"
    _write(tmp_path / "train.tsv", [head, "0\ta\tb\tentailment", "1\ta\tb", "2\ta\tb\tyes"])
    data = glue.read_split(task, task.train, tmp_path, skip_bad_rows=True)
    assert [e.index for e in data.examples] == ["0"]
    assert len(data.skipped) == 2
    assert data.skipped[0].startswith(f"{tmp_path / 'train.tsv'}:3: expected 4 fields")
    assert "train.tsv: skipped 2 of 3 rows" in caplog.text
    _write(tmp_path / "test.tsv", ["index\tsentence1\tsentence2", "0\ta\tb", "1\ta"])
    with pytest.raises(InputError, match=r"test.tsv:3"):
        glue.read_split(task, task.test[0], tmp_path, skip_bad_rows=True)


def test_tsv_task_keeps_single_or_pair_consistent(tmp_path):
    p = tmp_path / "train.tsv"
    _write(p, ["pos\ta fine film", "neg\ta dull plot\textra"])
    with pytest.raises(InputError, match=r"train.tsv:2: expected 2 tab-separated fields, found 3"):
        _read("tsv", 0, p)
    _write(p, ["pos\ta fine film", "neg\ta dull plot"])
    examples, _ = _read("tsv", 0, p)
    assert [(e.label, e.text_b) for e in examples] == [("pos", None), ("neg", None)]


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------


def test_pack_single_and_pair_with_segment_ids():
    tokens, seg, cut = glue.pack(["a", "b"], None, 7)
    assert (tokens, seg, cut) == (["[CLS]", "a", "b", "[SEP]"], [0, 0, 0, 0], False)
    tokens, seg, cut = glue.pack(["a", "b"], ["c"], 7)
    assert tokens == ["[CLS]", "a", "b", "[SEP]", "c", "[SEP]"]
    assert seg == [0, 0, 0, 0, 1, 1] and not cut
    tokens, seg, cut = glue.pack(list("abcdefgh"), None, 5)
    assert tokens == ["[CLS]", "a", "b", "c", "[SEP]"] and cut


def test_roberta_packing_frames_pairs_with_two_separators_in_one_segment():
    """<s> a </s></s> b </s> (fairseq's and Hugging Face's RoBERTa), every segment id 0, the
    pair truncated to leave room for its four special tokens; padded with <pad>'s id."""
    r = glue.ROBERTA_PACKING
    tokens, seg, cut = glue.pack(["a", "b"], None, 7, r)
    assert (tokens, seg, cut) == (["<s>", "a", "b", "</s>"], [0] * 4, False)
    tokens, seg, cut = glue.pack(["a", "b"], ["c"], 7, r)
    assert (tokens, seg, cut) == (["<s>", "a", "b", "</s>", "</s>", "c", "</s>"], [0] * 7, False)
    tokens, seg, cut = glue.pack(list("abcd"), list("xy"), 7, r)
    assert tokens == ["<s>", "a", "b", "</s>", "</s>", "x", "</s>"] and cut

    class Tokens:  # a tokenizer over single characters, <pad> at id 1 as RoBERTa's
        vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "a", "b", "c"])}

        def tokenize(self, text):
            return list(text)

        def convert_tokens_to_ids(self, tokens):
            return [self.vocab[t] for t in tokens]

    task = glue.get_task("mrpc")
    ex = [glue.Example("dev.tsv:2", "1", "ab", "c")]
    enc = glue.encode_examples(ex, task, Tokens(), 9, r)
    assert enc.features["input_ids"].tolist() == [[0, 3, 4, 2, 2, 5, 2, 1, 1]]
    assert enc.features["input_mask"].tolist() == [[1] * 7 + [0] * 2]
    assert enc.features["segment_ids"].tolist() == [[0] * 9]
    with pytest.raises(ValueError, match="at least 4, found 3"):
        glue.encode_examples(ex, task, Tokens(), 3, r)
    # A RoBERTa vocabulary with a config whose positions start at 0 is warned about.
    from tests import helpers

    assert "c.json has no position_offset" in glue.packing_mismatch(
        r, helpers.tiny_config(), "c.json"
    )
    roberta = helpers.tiny_config(position_offset=2)
    assert glue.packing_mismatch(r, roberta, "c.json") is None
    assert glue.packing_mismatch(glue.BERT_PACKING, helpers.tiny_config(), "c.json") is None


def test_truncation_takes_from_the_longer_side_first():
    a, b = glue.truncate_pair(list("abcde"), list("xy"), 5)
    assert (a, b) == (list("abc"), list("xy"))
    a, b = glue.truncate_pair(list("abc"), list("xyz"), 4)  # a tie drops from b first
    assert (a, b) == (list("ab"), list("xy"))
    for la in range(8):  # brute force: fits, keeps prefixes, balanced once both were cut
        for lb in range(8):
            for budget in range(10):
                a, b = glue.truncate_pair(list(range(la)), list(range(lb)), budget)
                assert len(a) + len(b) == min(la + lb, budget)
                assert a == list(range(len(a))) and b == list(range(len(b)))
                if len(a) < la and len(b) < lb:
                    assert abs(len(a) - len(b)) <= 1


@pytest.fixture()
def tokenizer(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return FullTokenizer(tmp_path / "vocab.txt", do_lower_case=True)


def test_encode_pairs_counts_truncation_and_multiple_choice(tokenizer):
    task = glue.get_task("rte")
    ex = [
        glue.Example("f:2", "0", "the dog runs .", "a man eats", "entailment"),
        glue.Example("f:3", "1", "the movie was very very very fun .", "good", "not_entailment"),
    ]
    enc = glue.encode_examples(ex, task, tokenizer, 9)
    ids = enc.features["input_ids"]
    assert ids.shape == (2, 9) and ids.dtype == np.int32
    assert tokenizer.convert_ids_to_tokens(ids[0]) == [
        "[CLS]",
        "the",
        "dog",
        "runs",
        "[SEP]",
        "a",
        "man",
        "eats",
        "[SEP]",
    ]  # fmt: skip  (4 + 3 tokens in a budget of 6: the longer side, a, loses its ".")
    np.testing.assert_array_equal(enc.features["segment_ids"][0], [0] * 5 + [1] * 4)
    np.testing.assert_array_equal(enc.features["input_mask"][0], [1] * 9)
    assert enc.features["label_ids"].tolist() == [0, 1]
    assert enc.truncated == ["f:2", "f:3"]
    swag = glue.get_task("swag")
    mc = glue.Example("s:2", "0", "the man", "the dog", "2", ("runs", "eats", "is good", "was"))
    enc = glue.encode_examples([mc], swag, tokenizer, 8)
    assert enc.features["input_ids"].shape == (1, 4, 8) and enc.features["label_ids"][0] == 2
    assert tokenizer.convert_ids_to_tokens(enc.features["input_ids"][0, 2]) == [
        "[CLS]", "the", "man", "[SEP]", "the", "dog", "is", "[SEP]",
    ]  # fmt: skip
    stsb = glue.get_task("sts-b")
    enc = glue.encode_examples([glue.Example("s:2", "0", "a", "b", "3.800")], stsb, tokenizer, 5)
    assert enc.features["label_ids"].dtype == np.float32
    assert enc.features["label_ids"][0] == pytest.approx(3.8)


def test_tfrecords_round_trip(tmp_path, tokenizer):
    for name in ("mrpc", "sts-b", "swag"):
        task = glue.get_task(name)
        write_task(tmp_path / name, task, sizes=(5, 1, 1))
        enc = glue.encode_examples(
            glue.read_split(task, task.train, tmp_path / name).examples, task, tokenizer, 11
        )
        path = tmp_path / f"{name}.tf_record"
        assert glue.write_tfrecord(path, enc.features, task.kind == glue.REGRESSION) == 5
        records = next(iter(tf.data.TFRecordDataset(str(path)).batch(10)))
        parsed = features.parse_classifier_examples(
            records, 11, task.num_choices, task.kind == glue.REGRESSION
        )
        for key, value in enc.features.items():
            np.testing.assert_array_equal(parsed[key].numpy(), value)
        assert parsed["is_real_example"].numpy().tolist() == [1] * 5
        assert not list(tmp_path.glob(".*.tmp"))


def test_eval_batches_pad_and_shard_in_order():
    feats = {
        "input_ids": np.arange(7 * 3, dtype=np.int32).reshape(7, 3),
        "input_mask": np.ones((7, 3), np.int32),
        "segment_ids": np.zeros((7, 3), np.int32),
        "label_ids": np.arange(7, dtype=np.int32),
    }
    padded = glue.pad_for_batches(feats, 4)
    assert padded["is_real_example"].tolist() == [1] * 7 + [0]
    one = [b["label_ids"].numpy().tolist() for b in glue.eval_batches(feats, 4)]
    assert one == [[0, 1, 2, 3], [4, 5, 6, 0]]
    # Two workers: a step gathers worker 0's batch then worker 1's, i.e. consecutive rows.
    w0 = [b["label_ids"].numpy().tolist() for b in glue.eval_batches(feats, 4, 2, 0)]
    w1 = [b["label_ids"].numpy().tolist() for b in glue.eval_batches(feats, 4, 2, 1)]
    assert [x for pair in zip(w0, w1) for b in pair for x in b] == [0, 1, 2, 3, 4, 5, 6, 0]


# ---------------------------------------------------------------------------------------------
# Submission files and tensorflow-datasets
# ---------------------------------------------------------------------------------------------


def test_prediction_texts_and_submission_files(tmp_path):
    mnli = glue.get_task("mnli")
    logits = np.array([[0.1, 2.0, 0.3], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert glue.prediction_texts(mnli, logits) == ["entailment", "contradiction", "neutral"]
    assert glue.prediction_texts(glue.get_task("sts-b"), np.array([[4.12345], [0.5]])) == [
        "4.123",
        "0.500",
    ]
    assert glue.prediction_texts(glue.get_task("swag"), np.eye(4)[[3, 1]]) == ["3", "1"]
    path = tmp_path / "MNLI-m.tsv"
    glue.write_submission(path, ["9", "4", "7"], ["entailment", "neutral", "contradiction"])
    assert path.read_text() == "index\tprediction\n9\tentailment\n4\tneutral\n7\tcontradiction\n"
    assert glue.read_submission(path)[1] == ("4", "neutral")
    assert [p.name for p in tmp_path.iterdir()] == ["MNLI-m.tsv"]  # no temp file left
    path.write_text("id\tlabel\n1\t0\n")
    with pytest.raises(InputError, match="MNLI-m.tsv:1: expected the header"):
        glue.read_submission(path)


def test_tensorflow_datasets_path_with_mock_data():
    import tensorflow_datasets as tfds

    mnli, stsb = glue.get_task("mnli"), glue.get_task("sts-b")
    with tfds.testing.mock_data(num_examples=6):
        train = glue.read_split(mnli, mnli.train, tfds_name="glue/mnli")
        test = glue.read_split(mnli, mnli.test[1], tfds_name="glue/mnli")
        ax = glue.read_split(mnli, mnli.test[2], tfds_name="glue/mnli")
        scores = glue.read_split(stsb, stsb.dev[0], tfds_name="glue/stsb")
    assert len(train.examples) == 6 and train.source == "glue/mnli:train"
    assert {e.label for e in train.examples} <= set(mnli.labels)
    assert all(e.text_b for e in train.examples)
    assert test.source == "glue/mnli:test_mismatched" and {e.label for e in test.examples} == {None}
    assert ax.source == "glue/ax:test"
    assert all(0.0 <= float(e.label) <= 5.0 for e in scores.examples)
    with pytest.raises(ValueError, match="expected glue/mnli"):
        glue.read_split(mnli, mnli.train, tfds_name="glue/sst2")
