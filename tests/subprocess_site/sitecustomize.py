"""Start-up of every Python process the tests start: tests/conftest.py puts this folder first
on PYTHONPATH, so the interpreters of the entrypoints' command-line runs (MultiWorkerMirrored
workers, the SIGTERM run, the benchmarks' sides) and the xdist workers import it before
anything else. Test processes only; what a user runs is unchanged.

- Two optional imports that TensorFlow and Keras try at import time are turned away:
  `IPython` (keras.src.saving.file_editor, for notebook display; 0.9 s) and, unless the process
  runs Keras' JAX backend, `jax` (tensorflow.lite.python.util, for its JAX converter; 1.3 s).
  Both are installed here (IPython with the machine, jax[cpu] by tests/requirements.txt for
  bench/gpu_mfu.py), and both libraries catch the ImportError and go on without them.
- Three more, only where a library's own optional import asks for them (34th session,
  tests/SUITE_TIMES.md): scikit-learn, for Keras' scikit-learn wrappers
  (`keras.src.wrappers`, imported with `keras` and thus by `import tensorflow`; it brings
  scipy.stats), matplotlib, for Keras' image-gallery plots (`keras.src.visualization`, the
  same), and rouge-score, for keras-hub's ROUGE metrics (`keras_hub.src.metrics`, imported
  with `keras_hub`; it brings nltk, which brings scipy.stats and scikit-learn). Measured
  here: `import tensorflow` 0.8 s faster without scikit-learn and 0.6 s more without
  matplotlib, `import keras_hub` 1.3 s more without rouge-score; the suite starts about 80
  processes. The libraries catch the ImportError and go on without them (no test uses those
  wrappers, plots or metrics: Cloze's ROUGE is training/rouge.py); a test or library that
  imports the package itself still gets it (test_metrics' and test_rouge's parity checks,
  the trainer's training-curve plots, which import matplotlib when they draw).
- Python's cyclic garbage collector runs after 20,000 net new objects instead of 700 (the test
  processes too, which also freeze the imported libraries: tests/conftest.py): full
  collections of a heap holding TensorFlow took 0.3 s each, several times a run.
- Grappler, TensorFlow's graph optimizer, is off once `tensorflow` is imported, for the reason
  tests/conftest.py turns XLA's LLVM passes off: it rewrites each traced function the first
  time it runs (constant folding, op fusion, inlining), which costs seconds per train step
  traced, and the tests run a few steps of each. The computation is the same up to float
  rounding, and the tests compare paths at their tolerances. Every test process alike: a
  test that resumes a subprocess's run and compares it bit for bit with an in-process one
  (test_run_pretraining's SIGTERM test) needs the same graphs on both sides. Measured (32nd
  session, tests/SUITE_TIMES.md): ten test_trainer tests 138 s -> 116 s.
  `CLOZE_TEST_GRAPPLER=1 python -m pytest` keeps it on (TensorFlow's default, what real runs
  and the benchmarks use).
"""

import gc
import importlib.abc
import importlib.util
import os
import sys

_TURNED_AWAY = {"IPython"} | (set() if os.environ.get("KERAS_BACKEND") == "jax" else {"jax"})
# Turned away only where the import statement runs in a module under this prefix.
_TURNED_AWAY_FROM = {
    "sklearn": "keras.src.wrappers",
    "rouge_score": "keras_hub.src.metrics",
    "matplotlib": "keras.src.visualization",
}


def _importing_module() -> str:
    """The name of the module whose code runs the import being looked up: the first frame above
    this one outside the import system's own (frozen) frames."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__", "")


class _TurnAway(importlib.abc.MetaPathFinder):
    """Imports of the turned-away packages fail as if they were not installed (the main
    requirements do not install IPython or jax), and they never enter sys.modules. (A None
    entry in sys.modules, the import system's other way to refuse, broke scipy, which looks
    modules up there: test_metrics failed with it in the 28th session.)"""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _TURNED_AWAY or (
            top in _TURNED_AWAY_FROM and _importing_module().startswith(_TURNED_AWAY_FROM[top])
        ):
            raise ModuleNotFoundError(f"No module named {name!r} (turned away)", name=name)
        return None


sys.meta_path.insert(0, _TurnAway())
gc.set_threshold(20_000, 20, 20)


class _AfterTensorFlow(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` with the other finders and turns Grappler off as soon as its module
    has run (before any function is traced; the context's devices are not initialised by it, so
    conftest still sets its two logical CPUs). Once: it leaves sys.meta_path on first use."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

        spec.loader.exec_module = exec_module
        return spec


if "tensorflow" not in sys.modules and not os.environ.get("CLOZE_TEST_GRAPPLER"):
    sys.meta_path.insert(0, _AfterTensorFlow())
