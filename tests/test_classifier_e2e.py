"""run_classifier.py end to end, in this process (helpers.run_main), on the paths the smoke runs
in test_run_classifier.py leave out: a user's own --task_name=tsv under
--distribution_strategy=mirrored (two replicas over conftest's two logical CPUs), and
--tfds_name reading through tensorflow-datasets (tfds.testing.mock_data, never the network)."""

import pytest

from data_prep import glue
from tests import helpers
from tests.test_glue import VOCAB, write_task
from tests.test_run_classifier import common, results
from training import distribute


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (d / "bert_config.json").write_text(helpers.tiny_config().to_json_string())
    return d


def test_user_tsv_task_trains_evaluates_and_predicts_under_mirrored(
    tmp_path, model_files, monkeypatch
):
    built = []

    def get_strategy(name, tpu_address):
        # One MirroredStrategy per process (helpers.mirrored_strategy says why): the flag's
        # strategy is the shared one, and setup() still checks the batches against its replicas.
        assert name == "mirrored"
        built.append(helpers.mirrored_strategy())
        return built[-1]

    monkeypatch.setattr(distribute, "get_strategy", get_strategy)
    task = glue.get_task("tsv", ["neg", "pos"])
    data, out = tmp_path / "mine", tmp_path / "out"
    expected = write_task(data, task, sizes=(12, 5, 7))
    args = [*common(model_files, data, out, "tsv"), "--label_list=neg,pos"]
    args = [a for a in args if "batch_size" not in a]
    args += ["--distribution_strategy=mirrored", "--eval_batch_size=4", "--predict_batch_size=4"]
    odd = helpers.run_main("run_classifier.py", [*args, "--train_batch_size=3", "--do_train"])
    assert odd.returncode == 1 and "--train_batch_size=3 is not divisible by 2" in odd.stderr
    run = helpers.run_main(
        "run_classifier.py",
        [*args, "--train_batch_size=4", "--do_train", "--do_eval", "--do_predict"],
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert built and built[-1].num_replicas_in_sync == 2
    r = results(out)
    assert r["global_step"] == 3 and 0.0 <= r["accuracy"] <= 1.0  # 12 examples / batch 4
    (submission,) = out.glob("*.tsv")
    rows = glue.read_submission(submission)
    assert [i for i, _ in rows] == [e["index"] for e in expected[-1]]  # every row, in order
    assert {p for _, p in rows} <= {"neg", "pos"}


def test_tfds_name_fine_tunes_from_tensorflow_datasets(tmp_path, model_files):
    import tensorflow_datasets as tfds

    out = tmp_path / "out"
    args = [*common(model_files, tmp_path / "tfds", out, "sst-2"), "--tfds_name=glue/sst2"]
    with tfds.testing.mock_data(num_examples=9):
        run = helpers.run_main("run_classifier.py", [*args, "--do_train", "--do_eval"])
    assert run.returncode == 0, run.stderr[-4000:]
    r = results(out)
    assert r["global_step"] == 3 and 0.0 <= r["accuracy"] <= 1.0  # 9 examples / batch 3
