"""Smoke runs of run_classifier.py, one per task type: pair classification with two dev sets and
three submission files (MNLI + AX), regression (STS-B, then predicting from the kept best), and
multiple choice (SWAG); plus bad input stopping before output_dir exists. Also, in this process,
a user's own --task_name=tsv under --distribution_strategy=mirrored (two replicas over conftest's
two logical CPUs) and --tfds_name reading through tensorflow-datasets (tfds.testing.mock_data,
never the network)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from data_prep import glue, rt_polarity
from tests import helpers
from tests.test_glue import VOCAB, write_task
from training import distribute

S = 13  # tiny config: max_position_embeddings 16


def run(args, check=True):
    """run_classifier.py in this process (helpers.run_main); the rt-polarity arm below runs it as
    the real command line (rt_polarity.finetune_arm starts it as a subprocess)."""
    result = helpers.run_main("run_classifier.py", args)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-4000:])
    return result


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (d / "bert_config.json").write_text(helpers.tiny_config().to_json_string())
    return d


def common(model_files, data_dir, out, task):
    return [
        f"--task_name={task}",
        f"--data_dir={data_dir}",
        f"--vocab_file={model_files / 'vocab.txt'}",
        f"--bert_config_file={model_files / 'bert_config.json'}",
        f"--output_dir={out}",
        f"--max_seq_length={S}",
        "--train_batch_size=3",
        "--eval_batch_size=4",
        "--predict_batch_size=4",  # as eval: one traced predict step serves both
        "--learning_rate=1e-3",
        "--num_train_epochs=1",
        "--save_checkpoints_steps=2",
        "--iterations_per_loop=2",
    ]


def results(out):
    return {
        k: float(v)
        for k, v in (
            line.split(" = ") for line in (out / "eval_results.txt").read_text().split("\n") if line
        )
    }


def check_submission(path, test_file_rows, allowed):
    rows = glue.read_submission(path)
    assert [i for i, _ in rows] == [r["index"] for r in test_file_rows]
    assert all(p in allowed for _, p in rows), rows


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, model_files):
    """Runs the three smoke jobs in this process, one after the other, while the rt-polarity arm
    (a subprocess) runs beside them. Returns {job: (output_dir, expected rows per split,
    [helpers.Completed])}."""
    root = tmp_path_factory.mktemp("smoke")
    jobs = {}
    data = root / "glue" / "MNLI"
    expected = write_task(data, glue.get_task("mnli"), sizes=(11, 5, 5))
    args = [*common(model_files, data, root / "mnli", "MNLI"), "--do_train", "--do_eval"]
    jobs["mnli"] = (root / "mnli", expected, [[*args, "--do_predict"]])
    data = root / "STS-B"
    expected = write_task(data, glue.get_task("sts-b"), sizes=(9, 5, 5))
    args = [*common(model_files, data, root / "stsb", "sts-b"), "--pooling=mean"]
    # Train and evaluate, then a second run predicts from the kept best checkpoint.
    jobs["stsb"] = (
        root / "stsb",
        expected,
        [[*args, "--do_train", "--do_eval"], [*args, "--do_predict"]],
    )
    data = root / "swag"
    expected = write_task(data, glue.get_task("swag"), sizes=(6, 4, 5))
    args = [*common(model_files, data, root / "swag", "swag"), "--do_train", "--do_eval"]
    jobs["swag"] = (root / "swag", expected, [[*args, "--do_predict", "--layerwise_lr_decay=0.8"]])

    # The rt-polarity comparison's path: one arm, one seed, on a small SST-2-layout split.
    rows = [(str(y), f"{'a good fun' if y == 1 else 'a dull bad'} film {i} .") for i, y in
            enumerate([1, -1] * 8)]  # fmt: skip
    rt_polarity.write_sst2_layout(root / "rt" / "sst2", rows[:10], rows[10:13], rows[13:])
    settings = {
        "max_seq_length": S, "train_batch_size": 3, "eval_batch_size": 3,
        "predict_batch_size": 3, "learning_rate": 1e-3, "num_train_epochs": 1,
        "save_checkpoints_steps": 2, "iterations_per_loop": 2,
    }  # fmt: skip
    arm = (model_files / "vocab.txt", model_files / "bert_config.json", settings)

    def run_all(commands):
        done = []
        for command in commands:
            done.append(run(command, check=False))
            if done[-1].returncode:
                break
        return done

    with ThreadPoolExecutor(1) as pool:
        rt_job = pool.submit(rt_polarity.finetune_arm, root / "rt", "scratch", "", [5], *arm)
        out = {name: (*job[:2], run_all(job[2])) for name, job in jobs.items()}
    return out | {"rt": (root / "rt", rt_job)}


def finished(job):
    out, expected, done = job
    for result in done:
        assert result.returncode == 0, result.stderr[-4000:]
    return out, expected, done


def test_pair_classification_mnli_with_ax(smoke):
    out, expected, (result,) = finished(smoke["mnli"])
    assert "examples/s" in result.stderr and "were truncated" in result.stderr
    r = results(out)
    assert set(r) == {
        "accuracy", "score", "loss", "mismatched_accuracy", "mismatched_score",
        "mismatched_loss", "global_step",
    }  # fmt: skip
    assert r["global_step"] == 3 and 0 <= r["accuracy"] <= 1 and r["loss"] > 0
    evals = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 3]
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["score"] == max(e["score"] for e in evals)
    assert best["step"] == next(e["step"] for e in evals if e["score"] == best["score"])
    labels = set(glue.get_task("mnli").labels)
    for name, rows in zip(("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"), expected[-3:], strict=True):
        check_submission(out / name, rows, labels)
    assert (out / "training_curves.png").exists() and (out / "train.tf_record").exists()


def test_regression_stsb_then_predict_from_best(smoke):
    out, expected, (trained, predicted) = finished(smoke["stsb"])
    r = results(out)
    assert {"pearson", "spearman", "score", "loss"} <= set(r)
    assert r["score"] == pytest.approx((r["pearson"] + r["spearman"]) / 2)
    assert "STS-B.tsv" not in trained.stderr and "best/ckpt" in predicted.stderr
    rows = glue.read_submission(out / "STS-B.tsv")
    assert [i for i, _ in rows] == [e["index"] for e in expected[-1]]
    assert all(len(p.split(".")[1]) == 3 and float(p) == float(p) for _, p in rows)


def test_multiple_choice_swag(smoke):
    out, expected, _ = finished(smoke["swag"])
    assert set(results(out)) == {"accuracy", "score", "loss", "global_step"}
    check_submission(out / "SWAG.tsv", expected[-1], set(glue.get_task("swag").labels))


def test_bad_input_stops_before_output_dir_exists(model_files, tmp_path):
    data = tmp_path / "SST-2"
    write_task(data, glue.get_task("sst-2"), sizes=(6, 4, 3))
    with open(data / "dev.tsv", "a") as f:
        f.write("a film\tmaybe\n")
    out = tmp_path / "out"
    result = run([*common(model_files, data, out, "sst-2"), "--do_train", "--do_eval"], False)
    assert result.returncode != 0
    assert f"{data / 'dev.tsv'}:6: expected a label in ['0', '1'], found 'maybe'" in result.stderr
    assert not out.exists()


def test_rt_polarity_arm_runs_and_summarises_seeds(smoke):
    out, job = smoke["rt"]
    summary = job.result()  # re-raises a failed run_classifier.py, with its exit code
    run_dir = out / "finetune" / "scratch" / "seed_5"
    assert (run_dir / "SST-2.tsv").exists() and (run_dir / "best" / "best.json").exists()
    assert [r["seed"] for r in summary["runs"]] == [5]
    assert summary["test_accuracy"]["n"] == 1 and 0 <= summary["test_accuracy"]["mean"] <= 1
    saved = json.loads((out / "finetune" / "scratch" / "summary.json").read_text())
    assert saved["runs"] == summary["runs"] and saved["settings"]["max_seq_length"] == S


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
    bad = helpers.run_main("run_classifier.py", [*args, "--do_eval", "--encoder_branches=0"])
    assert bad.returncode == 1 and "--encoder_branches=0: encoder branches: expected" in bad.stderr
    # The encoder's layers in 2 row slices of each replica's batch of 2 (run_layer_stack).
    run = helpers.run_main(
        "run_classifier.py",
        [*args, "--train_batch_size=4", "--do_train", "--do_eval", "--do_predict"]
        + ["--encoder_branches=2"],
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
