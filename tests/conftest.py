"""Test set-up: quiet TensorFlow, two logical CPUs for MirroredStrategy tests, repo on path."""

import gc
import os
import runpy
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's CPU backend without LLVM's optimisation passes: the compiled programs compute the same
# thing (the tests compare them with the plain path at the same tolerances), they compile
# faster, and the tests run a few steps each, so compiling is most of their XLA time
# (test_trainer.py's XLA tests: 84 s -> 67 s; the whole suite 19 min 44 s -> 17 min 56 s, one
# noisy run each; 25th session, tests/SUITE_TIMES.md). Set here, before TensorFlow (or JAX) is
# imported, so every subprocess a test starts inherits it; a level the caller chose is kept.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# tests/subprocess_site/sitecustomize.py (why there) runs at the start of every Python process
# the tests start, through PYTHONPATH; this process started before, so it runs it here, before
# TensorFlow is imported.
# An xdist worker inherits the folder on PYTHONPATH (and ran the file at start): not added
# twice. Another sitecustomize loaded first (a system one) does not stand in for this one.
SUBPROCESS_SITE = ROOT / "tests" / "subprocess_site"
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(SUBPROCESS_SITE) not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SUBPROCESS_SITE), *_paths])
_site_file = getattr(sys.modules.get("sitecustomize"), "__file__", None)
if _site_file is None or Path(_site_file).resolve() != SUBPROCESS_SITE / "sitecustomize.py":
    runpy.run_path(str(SUBPROCESS_SITE / "sitecustomize.py"))

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Grappler is off in every test process once tensorflow is imported (the site file: why there;
# CLOZE_TEST_GRAPPLER=1 keeps it on).
if not os.environ.get("CLOZE_TEST_GRAPPLER"):
    assert tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer")

# Two logical CPUs let tests run MirroredStrategy on a machine without GPUs (shared/NOTES.md).
# This must happen before TensorFlow initialises its devices, hence at conftest import time.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

# Python's cyclic garbage collector, tuned for a process that traces many small models: the
# imported libraries (TensorFlow, Keras, keras-hub: about a million objects) go to the permanent
# generation, where no collection scans them again, and (the site file above) collections run
# after 20,000 net new objects instead of 700. With the defaults a full collection scanned the
# whole heap every few seconds of tracing: 7.0-7.6 s of gc in a 45-60 s run of three trainer
# tests, 1.4-1.7 s with this, at the same peak memory (28th session, tests/SUITE_TIMES.md).
# Test processes only: a real run traces once and then spends its time in TensorFlow's kernels.
import keras_hub  # noqa: E402, F401  (imported by most test files anyway; frozen with the rest)

gc.collect()
gc.freeze()


@pytest.fixture(autouse=True)
def _same_global_seeds():
    """Every test starts from the same global random state (TensorFlow's global seed and op-seed
    counter, Keras' global seed generator, NumPy's and Python's), whatever ran before it in this
    worker: a seeded tf.data shuffle still draws from TensorFlow's global seed, so without this a
    test that looks at which examples a batch holds saw another draw depending on the tests xdist
    ran before it in the same process (the 23rd session found two, test_masking's pipeline test
    and test_run_squad's cut-windows test, and pinned their seeds by hand; they rely on this
    now). Tests that seed for themselves still do."""
    keras.utils.set_random_seed(1234)


@pytest.fixture(autouse=True)
def _custom_gradients_released():
    """What the library does around its own train, eval and predict calls (modeling/layers'
    custom_gradients_released: why), around each test, for the tf.functions tests trace
    themselves: a test's traced graphs do not stay in the worker for the rest of the run. Only
    registrations made during the test go; module-scoped fixtures set up before it keep theirs."""
    from modeling import layers

    with layers.custom_gradients_released():
        yield


@pytest.fixture(autouse=True)
def _no_entrypoint_flags_left():
    """A test that imports an entrypoint (a script defining absl flags: run_pretraining.py,
    bench/run_all.py, ...) must remove its flags again (helpers.run_main and
    helpers.entrypoint_module do): left defined, they make the next entrypoint a later test runs
    in this worker fail with DuplicateFlagError, and whether that happens depends on which files
    xdist gave the worker after it (the 39th session found a bench test that passed CI so)."""
    yield
    from absl import flags

    left = sorted(
        module
        for module, defined in flags.FLAGS.flags_by_module_dict().items()
        if defined and (module.split(".")[0] in ENTRYPOINT_PACKAGES or module in ENTRYPOINT_SCRIPTS)
    )
    assert not left, f"absl flags of {left} are still defined after this test"


# The repository's entrypoints: its root scripts and the bench/ scripts (by module name).
ENTRYPOINT_SCRIPTS = frozenset(p.stem for p in ROOT.glob("*.py"))
ENTRYPOINT_PACKAGES = frozenset({"bench"})


# Seconds of each slow test file: the sum of all its tests' setup and call times in the last
# measured whole-suite run (`--durations=0`, 34th session, tests/SUITE_TIMES.md), files of 15 s
# and more. xdist's loadfile hands files out in order of their test count, so a file of a few
# long smoke runs would start last and leave one worker running alone at the end; these start
# first, longest first (the longest-processing-time rule) and the many short files fill the
# gaps. A file not listed counts as short. Only the order changes: every test runs.
FILE_SECONDS = {
    "test_trainer.py": 595,
    "test_reliability.py": 314,
    "test_bench.py": 269,
    "test_run_pretraining.py": 231,
    "test_run_classifier.py": 173,
    "test_convert_checkpoint.py": 158,
    "test_run_squad.py": 133,
    "test_run_ner.py": 125,
    "test_elmo.py": 103,
    "test_t5.py": 101,
    "test_step_speed.py": 95,
    "test_bart.py": 77,
    "test_flops.py": 67,
    "test_helpers.py": 44,
    "test_finetuning.py": 44,
    "test_gpt.py": 32,
    "test_tagging.py": 29,
    "test_xlnet.py": 28,
    "test_rt_polarity.py": 25,
    "test_run_text2text.py": 22,
    "test_electra.py": 22,
    "test_seq2seq_pretraining.py": 20,
    "test_create_pretraining_data.py": 20,
    "test_checkpoints.py": 18,
    "test_albert.py": 17,
}


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            # Python's sort is stable: unlisted files keep xdist's order among themselves.
            queue = sorted(
                self.workqueue.items(), key=lambda kv: -FILE_SECONDS.get(Path(kv[0]).name, 0)
            )
            self.workqueue.clear()
            self.workqueue.update(queue)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
