"""run_pretraining.py refuses flag combinations that cannot work before it reads any record or
builds a model, with a message that says what to change (in this process, helpers.run_main)."""

import pytest

from tests import helpers


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--masking=dynamic"], "--masking=dynamic needs --vocab_file"),
        (
            ["--masking=dynamic", "--vocab_file=v.txt", "--span_boundary_objective"],
            "--span_boundary_objective needs span boundaries written with the masks: use "
            "--masking=static",
        ),
    ],
)
def test_dynamic_masking_refuses_what_it_cannot_do(tmp_path, extra, message):
    config = tmp_path / "bert_config.json"
    config.write_text(helpers.tiny_config().to_json_string())
    args = [
        f"--bert_config_file={config}",
        f"--input_file={tmp_path / 'missing.tfrecord'}",
        f"--output_dir={tmp_path / 'out'}",
        "--do_train",
        *extra,
    ]
    run = helpers.run_main("run_pretraining.py", args)
    assert run.returncode == 1 and message in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_teacher_with_another_vocabulary_of_the_same_size_is_refused(tmp_path):
    """vocab_size alone would pass (test_distillation checks that one): the soft targets compare
    the teacher's and the student's logits id by id, so the tokens must be the same."""
    from tests.test_glue import VOCAB

    teacher = tmp_path / "teacher"
    teacher.mkdir()
    config = helpers.tiny_config(vocab_size=len(VOCAB))
    (teacher / "bert_config.json").write_text(config.to_json_string())
    (teacher / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    swapped = [*VOCAB[:-2], VOCAB[-1], VOCAB[-2]]
    (tmp_path / "student_vocab.txt").write_text("\n".join(swapped) + "\n")
    student = helpers.tiny_config(vocab_size=len(VOCAB), num_hidden_layers=1)
    (tmp_path / "student.json").write_text(student.to_json_string())
    args = [
        f"--bert_config_file={tmp_path / 'student.json'}",
        f"--input_file={tmp_path / 'missing.tfrecord'}",
        f"--output_dir={tmp_path / 'out'}",
        f"--teacher_checkpoint={teacher}",
        f"--vocab_file={tmp_path / 'student_vocab.txt'}",
        "--max_seq_length=16",
        "--max_predictions_per_seq=3",
        "--do_train",
    ]
    run = helpers.run_main("run_pretraining.py", args)
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"line {len(VOCAB) - 1}: {VOCAB[-1]!r} in {tmp_path / 'student_vocab.txt'}" in run.stderr
    assert "made with the teacher's vocabulary" in run.stderr
    assert not (tmp_path / "out").exists()
