"""Start-up of every Python process the tests start: tests/conftest.py puts this folder first
on PYTHONPATH, so the interpreters of the entrypoints' command-line runs (MultiWorkerMirrored
workers, the SIGTERM run, the benchmarks' sides) and the xdist workers import it before
anything else. Test processes only; what a user runs is unchanged.

- Two optional imports that TensorFlow and Keras try at import time are turned away:
  `IPython` (keras.src.saving.file_editor, for notebook display; 0.9 s) and, unless the process
  runs Keras' JAX backend, `jax` (tensorflow.lite.python.util, for its JAX converter; 1.3 s).
  Both are installed here (IPython with the machine, jax[cpu] by tests/requirements.txt for
  bench/gpu_mfu.py), and both libraries catch the ImportError and go on without them.
- Python's cyclic garbage collector runs after 20,000 net new objects instead of 700, as in
  the test processes (tests/conftest.py): full collections of a heap holding TensorFlow took
  0.3 s each, several times a run.
"""

import gc
import os
import sys

_TURNED_AWAY = ["IPython"] + ([] if os.environ.get("KERAS_BACKEND") == "jax" else ["jax"])
for _name in _TURNED_AWAY:
    # A None entry makes `import name` raise ImportError (the import system's own convention).
    sys.modules.setdefault(_name, None)
gc.set_threshold(20_000, 20, 20)
