"""Choosing a tf.distribute strategy from the `--distribution_strategy` flag's plain value."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl import logging

STRATEGIES = ("one_device", "mirrored", "multi_worker_mirrored", "tpu")


def get_strategy(name: str, tpu_address: str = "") -> tf.distribute.Strategy:
    """Builds the strategy named by `name`.

    Args:
      name: one of STRATEGIES. `one_device` uses the first GPU if there is one, else the CPU;
        `mirrored` all local GPUs (or all logical CPUs when there are no GPUs);
        `multi_worker_mirrored` reads the cluster from the TF_CONFIG environment variable;
        `tpu` connects to `tpu_address` (a grpc:// address, a TPU name, or "local" on a TPU VM).
      tpu_address: only for `tpu`.
    """
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        if not tpu_address:
            raise ValueError(
                "--distribution_strategy=tpu needs --tpu (an address, a name or 'local')"
            )
        resolver = tpu_cluster_resolver(tpu_address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"--distribution_strategy: expected one of {STRATEGIES}, found {name!r}")


def tpu_cluster_resolver(tpu_address: str):
    """The TPUClusterResolver for `--tpu`: a grpc:// address, a Cloud TPU name, or "local" on a
    TPU VM. Building it does not connect; get_strategy connects and initialises the TPU system."""
    if not tpu_address:
        raise ValueError("--distribution_strategy=tpu needs --tpu (an address, a name or 'local')")
    return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_address)


def setup(name: str, tpu_address: str, batch_sizes: dict[str, int]):
    """Builds the strategy and checks that every global batch size splits evenly over replicas.

    Args:
      name, tpu_address: as get_strategy.
      batch_sizes: flag name -> global batch size, e.g. {"train_batch_size": 32}.
    Returns (strategy, number of workers, this worker's index). Raises ValueError naming the
    flag whose batch does not divide.
    """
    strategy = get_strategy(name, tpu_address)
    replicas = strategy.num_replicas_in_sync
    workers = num_workers(strategy)
    index = worker_index(strategy)
    for flag, size in batch_sizes.items():
        if size % replicas:
            raise ValueError(f"--{flag}={size} is not divisible by {replicas} replicas")
    logging.info(
        "%s: %d replicas in sync on %d workers, this is worker %d", name, replicas, workers, index
    )
    return strategy, workers, index


def num_workers(strategy) -> int:
    """Worker processes of `strategy` (1 for one_device, mirrored and a single TPU host)."""
    return max(1, strategy.num_replicas_in_sync // len(strategy.extended.worker_devices))


def worker_index(strategy) -> int:
    """This process's worker index (0 without a cluster)."""
    return getattr(getattr(strategy, "cluster_resolver", None), "task_id", 0) or 0


def gather_from_workers(strategy, values, width: int = 32) -> dict[int, list[int]]:
    """Every worker's list of small non-negative ints (its last `width` kept), by worker index.

    A collective: every worker must call it at the same point. With one worker, no collective
    runs and the answer is {0: values}.
    """
    values = [int(v) for v in values][-width:]
    index = worker_index(strategy)
    if num_workers(strategy) == 1:
        return {index: values}
    row = np.full([1, width + 1], -1, np.int64)  # (1, 1 + width): the worker index, its values
    row[0, 0] = index
    row[0, 1 : 1 + len(values)] = values
    dist = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(row))
    table = strategy.gather(dist, axis=0).numpy()  # (replicas, 1 + width), local replicas alike
    return {int(r[0]): [int(v) for v in r[1:] if v >= 0] for r in table}


def workers_flagged(strategy, flag: bool) -> list[int]:
    """The indexes of the workers whose `flag` is set: the same list on every worker.

    A collective (gather_from_workers): every worker must call it at the same point. With one
    worker no collective runs.
    """
    flags = gather_from_workers(strategy, [1] if flag else [], width=1)
    return sorted(w for w, values in flags.items() if values)
