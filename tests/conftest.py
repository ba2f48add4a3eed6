"""Test set-up: quiet TensorFlow, two logical CPUs for MirroredStrategy tests, repo on path."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tensorflow as tf  # noqa: E402

# Two logical CPUs let tests run MirroredStrategy on a machine without GPUs (shared/NOTES.md).
# This must happen before TensorFlow initialises its devices, hence at conftest import time.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
