"""helpers.run_main, which most entrypoint tests use instead of a subprocess: each call starts
from the flags' defaults, two entrypoints with the same flag names run one after the other, and
failures come back as exit code 1 with the message, as under app.run."""

import sys

import pytest
from absl import flags

from tests import helpers


def test_run_main_starts_from_the_defaults_and_reports_failures_as_app_run_does(tmp_path):
    import logging

    absl_level = logging.getLogger("absl").level
    r = helpers.run_main("run_pretraining.py", ["--do_train"])
    assert r.returncode == 1 and "--bert_config_file is required" in r.stderr
    # Logging is left as found: a later test's caplog still sees absl's INFO lines.
    assert logging.getLogger("absl").level == absl_level
    # --do_train is not carried over from the call before.
    r = helpers.run_main("run_pretraining.py", [f"--output_dir={tmp_path}"])
    assert r.returncode == 1 and "at least one of --do_train or --do_eval" in r.stderr
    # run_classifier.py defines the same flag names (--bert_config_file ...) in this process.
    args = ["--do_eval", "--task_name=sst-2", f"--bert_config_file={tmp_path}/c.json"]
    r = helpers.run_main("run_classifier.py", [*args, f"--output_dir={tmp_path}/c"])
    assert r.returncode == 1 and "--data_dir (or --tfds_name) is required" in r.stderr
    r = helpers.run_main("run_classifier.py", ["--no_such_flag=1"])
    assert r.returncode == 1 and "no_such_flag" in r.stderr
    # A failure inside main (not a usage error) keeps its traceback.
    config = tmp_path / "bert_config.json"
    config.write_text('{"hidden_size": 12, "no_such_field": 1}')
    args = [f"--bert_config_file={config}", f"--input_file={tmp_path}/x", "--do_train"]
    r = helpers.run_main("run_pretraining.py", [*args, f"--output_dir={tmp_path / 'o'}"])
    assert r.returncode == 1 and "no_such_field" in r.stderr and "Traceback" in r.stderr
    assert "bert_config_file" not in flags.FLAGS and "run_pretraining" not in sys.modules


def test_xdist_hands_out_the_slowest_files_first(tmp_path):
    """conftest's scheduler, on stand-in files in a one-worker session (no TensorFlow): the
    listed slow files first, longest first, then xdist's own order (most tests first)."""
    import subprocess

    from tests.conftest import FILE_SECONDS, ROOT

    # Two listed stand-ins, longest first by the table. Their longest-first order must not be
    # their name order (xdist's among files of one test each), or a scheduler that sorted by
    # name would pass too; a refresh of the table that makes it so needs other stand-ins here.
    seconds = {name: FILE_SECONDS[f"test_{name}.py"] for name in ("trainer", "bench")}
    slow = sorted(seconds, key=seconds.get, reverse=True)
    assert slow != sorted(slow) and len(set(seconds.values())) == 2, seconds
    text = (ROOT / "tests" / "conftest.py").read_text()
    hook = text[text.index("FILE_SECONDS = {") :]
    (tmp_path / "conftest.py").write_text("from pathlib import Path\n\n" + hook)
    order = tmp_path / "order.txt"
    for name, tests in (("many", 5), ("trainer", 1), ("bench", 1), ("rouge", 2)):
        body = f"def test_{{}}():\n    open({str(order)!r}, 'a').write('{name}\\n')\n"
        (tmp_path / f"test_{name}.py").write_text("".join(body.format(i) for i in range(tests)))
    args = ["-n", "1", "--dist", "loadfile", "-p", "no:cacheprovider", "-p", "no:benchmark", "-q"]
    for conftest, want in (
        ([], [*slow, "many", "rouge"]),
        (["--noconftest"], ["many", "rouge", "bench", "trainer"]),  # xdist's order
    ):
        order.unlink(missing_ok=True)
        result = subprocess.run(
            [sys.executable, "-m", "pytest", *args, *conftest, "-c", "/dev/null", str(tmp_path)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:]
        assert list(dict.fromkeys(order.read_text().split())) == want


def test_test_processes_tune_the_collector_and_turn_away_optional_imports(tmp_path):
    """tests/conftest.py and tests/subprocess_site: here, the imported libraries are frozen and
    collections wait for 20,000 new objects; a Python process a test starts runs the site file
    first (IPython and, outside Keras' JAX backend, jax turned away; the same thresholds), and a
    JAX-backend process can still import jax; scikit-learn, matplotlib and rouge-score turned
    away only from Keras' and keras-hub's optional imports, and importable afterwards."""
    import gc
    import os
    import subprocess

    from tests.conftest import ROOT

    assert gc.get_threshold() == (20_000, 20, 20) and gc.get_freeze_count() > 100_000
    code = (
        "import gc, sys\n"
        "for name in ('IPython', 'jax'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "        print(name, 'imported')\n"
        "    except ImportError:\n"
        "        print(name, 'turned away', name in sys.modules)\n"
        "print(gc.get_threshold())\n"
    )
    seen = {}
    for backend in ("tensorflow", "jax"):
        env = dict(os.environ, KERAS_BACKEND=backend)
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-2000:]
        seen[backend] = result.stdout.splitlines()
    # Turned away as if not installed: absent from sys.modules too (scipy looks there).
    want = ["IPython turned away False", "jax turned away False", "(20000, 20, 20)"]
    assert seen["tensorflow"] == want
    assert seen["jax"] == ["IPython turned away False", "jax imported", "(20000, 20, 20)"]
    # Without the site folder on PYTHONPATH the same interpreter imports what is installed
    # (jax always, by tests/requirements.txt): the turning away is the site file's doing.
    from importlib import metadata

    try:
        metadata.distribution("ipython")
        ipython = "imported"
    except metadata.PackageNotFoundError:
        ipython = "turned away False"  # not on this machine: it fails with or without the site
    env = dict(os.environ, PYTHONPATH="")
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.splitlines()[:2] == [f"IPython {ipython}", "jax imported"], result.stderr
    # scikit-learn, matplotlib and rouge-score: not loaded by `import keras_hub` (which imports
    # keras, whose wrappers ask for scikit-learn and whose image plots for matplotlib, and its
    # ROUGE metrics, which ask for rouge-score and so nltk), and the libraries went on without
    # them; a later import of each works, as does the trainer's plot.
    code = (
        "import sys\n"
        "import keras_hub\n"
        "from keras.src.visualization import plot_image_gallery as gallery\n"
        "from keras.src.wrappers import fixes\n"
        "from keras_hub.src.metrics import rouge_base\n"
        "names = ('sklearn', 'matplotlib', 'rouge_score', 'nltk', 'scipy.stats')\n"
        "print([n in sys.modules for n in names], fixes.sklearn is None, gallery.plt is None,\n"
        "      rouge_base.rouge_scorer is None)\n"
        "import rouge_score.rouge_scorer, sklearn.metrics\n"
        "from training import trainer\n"
        "print(sklearn.metrics.f1_score([0, 1, 1], [0, 1, 0]))\n"
        "print(rouge_score.rouge_scorer.RougeScorer(['rougeL']).score('a b', 'a c')['rougeL'][2])\n"
        "log = open(sys.argv[1] + '/train_log.jsonl', 'w')\n"
        'log.write(\'{"step": 1, "loss": 2.0}\\n{"step": 2, "loss": 1.0}\\n\')\n'
        "log.close()\n"
        "print(open(trainer.plot_training_curves(sys.argv[1], 'loss'), 'rb').read(8))\n"
    )
    lines = {}
    for label, env in (("site", dict(os.environ)), ("plain", dict(os.environ, PYTHONPATH=""))):
        (tmp_path / label).mkdir()
        result = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / label)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        lines[label] = result.stdout.splitlines()
    assert lines["site"] == [
        "[False, False, False, False, False] True True True",
        "0.6666666666666666",
        "0.5",
        repr(b"\x89PNG\r\n\x1a\n"),
    ]
    assert lines["plain"][0] == "[True, True, True, True, True] False False False"
    assert lines["plain"][1:] == lines["site"][1:]
    # And here, in the test process, scipy's array checks (which look for jax in sys.modules)
    # work with jax turned away: the failure a None entry in sys.modules caused.
    import numpy as np
    from scipy import stats

    assert "jax" not in sys.modules
    assert stats.pearsonr(np.array([1.0, 2.0, 4.0]), np.array([1.0, 3.0, 2.0]))[0] > 0


def test_test_processes_run_without_grappler():
    """The site file turns Grappler off in every test process as tensorflow is imported: here
    and in a subprocess alike (so a run resumed in one compares bit for bit with the other)."""
    import os
    import subprocess

    import tensorflow as tf

    if os.environ.get("CLOZE_TEST_GRAPPLER"):
        pytest.skip("CLOZE_TEST_GRAPPLER=1 keeps Grappler on")
    assert tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"] is True
    code = (
        "import tensorflow as tf\n"
        "print(tf.config.optimizer.get_experimental_options().get('disable_meta_optimizer'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True"]
