"""Issue #3 gaps closed by the audit (tests/claims/issue3_classifier.md): GLUE submission file
names and label names against jiant's benchmark formatter (code no one here wrote), one
submission row per test row for every task, the truncation warning's count and lines, the
tensorflow-datasets label mapping, and a bad --init_checkpoint leaving output_dir untouched."""

import ast
import logging

import numpy as np
import pytest
import tensorflow as tf

from data_prep import fetch, glue
from modeling import bert
from tests import helpers
from tests.test_glue import VOCAB, write_task

# jiant 2.2.0 (MIT, PyPI) formats GLUE leaderboard submissions: its GlueBenchmark names the files
# and each task class lists the label texts. Read as source with `ast` (importing it needs torch).
JIANT = "jiant==2.2.0"
# jiant's task name -> Cloze's (task, test split name).
JIANT_TO_CLOZE = {
    "cola": ("cola", "test"),
    "sst": ("sst-2", "test"),
    "mrpc": ("mrpc", "test"),
    "stsb": ("sts-b", "test"),
    "mnli": ("mnli", "matched"),
    "mnli_mismatched": ("mnli", "mismatched"),
    "qnli": ("qnli", "test"),
    "qqp": ("qqp", "test"),
    "rte": ("rte", "test"),
    "wnli": ("wnli", "test"),
    "glue_diagnostics": ("ax", "ax"),
}


def _assigned(tree, name, in_class=None):
    """The literal value assigned to `name` (inside class `in_class` if given) in a module."""
    for node in ast.walk(tree):
        if in_class and not (isinstance(node, ast.ClassDef) and node.name == in_class):
            continue
        body = node.body if in_class else [node]
        for item in body:
            if isinstance(item, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in item.targets
            ):
                return ast.literal_eval(item.value)
    return None


@pytest.fixture(scope="module")
def jiant_glue():
    """(submission file names, label lists) of jiant's GLUE benchmark, from its source."""
    paths = fetch.fetch_package_files(
        JIANT,
        lambda n: n.endswith("scripts/benchmarks/benchmarks.py") or "/tasks/lib/" in n,
        binary=True,
    )
    by_name = {p.name: p for p in paths if p.suffix == ".py"}
    tree = ast.parse(by_name["benchmarks.py"].read_text())
    files = _assigned(tree, "BENCHMARK_SUBMISSION_FILENAMES", in_class="GlueBenchmark")
    labels = {}
    for task in ("cola", "sst", "mrpc", "qnli", "qqp", "rte", "wnli", "mnli"):
        labels[task] = _assigned(ast.parse(by_name[f"{task}.py"].read_text()), "LABELS")
    # The mismatched set and the diagnostic subclass jiant's MNLI task (same labels).
    for sub in ("mnli_mismatched", "glue_diagnostics"):
        assert "mnli.MnliTask" in by_name[f"{sub}.py"].read_text()
        labels[sub] = labels["mnli"]
    return files, labels


def test_submission_names_and_labels_are_the_ones_glue_expects(jiant_glue, tmp_path):
    """For every GLUE task (AX and both MNLI test sets included): Cloze writes the file name the
    leaderboard expects, `index<TAB>prediction` with one row per test row in the test file's
    index order, and every prediction is one of the task's label texts (STS-B: a number)."""
    files, labels = jiant_glue
    assert set(files) == set(JIANT_TO_CLOZE)
    written = set()
    rng = np.random.default_rng(3)
    for jiant_name, (name, split_name) in JIANT_TO_CLOZE.items():
        task = glue.get_task(name)
        root = tmp_path / name / "data"
        if not (root / "test.tsv").exists():
            write_task(root, task, sizes=(5, 3, 7))
        (split,) = [s for s in task.test if s.name == split_name]
        data = glue.read_split(task, split, root)
        assert split.submission == files[jiant_name], jiant_name
        if task.kind == glue.REGRESSION:
            outputs = rng.normal(2.5, 1.0, (len(data.examples), 1))
        else:
            assert sorted(task.labels) == sorted(labels[jiant_name]), jiant_name
            outputs = rng.normal(size=(len(data.examples), len(task.labels)))
            outputs[0, 0] += 9.0  # every label id reachable: the first row picks label 0
        texts = glue.prediction_texts(task, outputs)
        path = tmp_path / name / split.submission
        glue.write_submission(path, [e.index for e in data.examples], texts)
        rows = glue.read_submission(path)
        index_column = [line.split("\t")[0] for line in data_lines(data.source)]
        assert [i for i, _ in rows] == index_column, jiant_name
        if task.kind == glue.REGRESSION:
            assert all(0 <= len(p.split(".")[1]) <= 3 for _, p in rows)
            np.testing.assert_allclose([float(p) for _, p in rows], outputs[:, 0], atol=5e-4)
        else:
            assert {p for _, p in rows} <= set(labels[jiant_name])
            assert rows[0][1] == task.labels[0]
        written.add(path.name)
    assert written == set(files.values())  # 11 files: the whole GLUE submission


def data_lines(path):
    """The data rows of a headed TSV file (every GLUE test file has a header)."""
    return path_text(path).splitlines()[1:]


def path_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_truncation_is_counted_and_names_file_and_line(tmp_path, caplog):
    """A sequence longer than max_seq_length is truncated as BERT does (longer text first) and a
    warning gives how many of how many, naming the first ones by file and line."""
    from data_prep.tokenization import FullTokenizer

    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tokenizer = FullTokenizer(tmp_path / "vocab.txt")
    task = glue.get_task("rte")
    head = "index\tsentence1\tsentence2\tlabel"
    rows = [
        "0\tthe dog runs\ta man eats\tentailment",  # 3 + 3 tokens: fits in 9 - 3
        "1\tthe movie was very very very fun .\tgood\tnot_entailment",  # 8 + 1: cut
        "2\tthe dog\tthe film was very dull and bad\tentailment",  # 2 + 7 (an unknown word): cut
    ]
    (tmp_path / "dev.tsv").write_text("\n".join([head, *rows]) + "\n")
    data = glue.read_split(task, task.dev[0], tmp_path)
    encoded = glue.encode_examples(data.examples, task, tokenizer, 9)
    assert encoded.truncated == [f"{data.source}:3", f"{data.source}:4"]
    tokens = tokenizer.convert_ids_to_tokens(encoded.features["input_ids"][2])
    # b is the longer side: it lost its last tokens, a kept both of its own.
    assert tokens == ["[CLS]", "the", "dog", "[SEP]", "the", "film", "was", "very", "[SEP]"]
    with caplog.at_level(logging.WARNING, logger="data_prep.glue"):
        glue.log_truncation(data.source, encoded, 9)
    assert (
        f"{data.source}: 2 of 3 examples were longer than max_seq_length=9 and were truncated"
        in caplog.text
    )
    assert f"{data.source}:3, {data.source}:4" in caplog.text
    caplog.clear()
    glue.log_truncation(data.source, glue.encode_examples(data.examples, task, tokenizer, 13), 13)
    assert "truncated" not in caplog.text  # nothing cut, nothing said


@pytest.mark.parametrize("builder, task_name", [("glue/mnli", "mnli"), ("glue/sst2", "sst-2")])
def test_tensorflow_datasets_labels_map_to_the_task_labels(builder, task_name):
    """TFDS ClassLabel ids become the right label texts: MNLI's TFDS order (entailment, neutral,
    contradiction) differs from the GLUE files' label list, so a mapping by position would
    swap classes; SST-2's ids are the file labels themselves."""
    import tensorflow_datasets as tfds

    task = glue.get_task(task_name)
    with tfds.testing.mock_data(num_examples=9):
        data = glue.read_split(task, task.train, tfds_name=builder)
        ds, info = tfds.load(builder, split="train", with_info=True, shuffle_files=False)
        raw = [int(x["label"]) for x in tfds.as_numpy(ds)]
    names = info.features["label"].names
    if task_name == "mnli":
        assert names != list(task.labels)  # so the test would catch a mapping by position
        want = [names[i] for i in raw]
    else:  # TFDS names SST-2's classes negative / positive, the GLUE files write 0 / 1
        assert names == ["negative", "positive"]
        want = [("0", "1")[i] for i in raw]
    assert [e.label for e in data.examples] == want and len(set(want)) > 1
    ids = glue.label_values(task, data.examples)
    assert [task.labels[i] for i in ids] == want


def test_a_bad_init_checkpoint_leaves_output_dir_untouched(tmp_path):
    """--init_checkpoint that does not fit the config stops the run before anything is written:
    no output_dir (earlier, train.tf_record and model_config.json were left behind, and the
    stale config then refused the corrected rerun)."""
    model_files = tmp_path / "model"
    model_files.mkdir()
    (model_files / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (model_files / "bert_config.json").write_text(helpers.tiny_config().to_json_string())
    other = bert.BertPretrainer(helpers.tiny_config(hidden_size=15, intermediate_size=19))
    other.build()
    prefix = tf.train.Checkpoint(model=other).save(str(tmp_path / "other" / "ckpt"))
    data = tmp_path / "SST-2"
    write_task(data, glue.get_task("sst-2"), sizes=(6, 4, 3))
    out = tmp_path / "out"
    args = [
        "--task_name=sst-2", f"--data_dir={data}", f"--vocab_file={model_files / 'vocab.txt'}",
        f"--bert_config_file={model_files / 'bert_config.json'}", f"--output_dir={out}",
        "--max_seq_length=13", "--train_batch_size=3", "--num_train_epochs=1",
        f"--init_checkpoint={prefix}",
    ]  # fmt: skip
    result = helpers.run_main("run_classifier.py", [*args, "--do_train", "--do_eval"])
    assert result.returncode != 0
    message = f"run_classifier: cannot initialise the model from {prefix}: "
    assert message + "Received incompatible tensor with shape (15,)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_a_config_left_without_a_checkpoint_does_not_refuse_a_corrected_rerun(tmp_path):
    """A run that fails before its first checkpoint (a non-finite first step, a kill) leaves
    model_config.json but no checkpoint; the rerun with a corrected config goes ahead and records
    its own config. With a checkpoint present, another config is still refused."""
    from training import trainer

    a = helpers.tiny_config().to_json_string()
    b = helpers.tiny_config(intermediate_size=19).to_json_string()
    trainer.check_output_dir_config(str(tmp_path), a)
    trainer.check_output_dir_config(str(tmp_path), b)  # no checkpoint: a describes nothing
    assert (tmp_path / "model_config.json").read_text() == b
    step = tf.Variable(3)
    tf.train.CheckpointManager(tf.train.Checkpoint(step=step), str(tmp_path), 1, "ckpt").save()
    trainer.check_output_dir_config(str(tmp_path), b)  # the same config resumes
    with pytest.raises(ValueError, match="different model config"):
        trainer.check_output_dir_config(str(tmp_path), a)
    assert (tmp_path / "model_config.json").read_text() == b
