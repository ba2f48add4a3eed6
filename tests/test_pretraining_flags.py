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
