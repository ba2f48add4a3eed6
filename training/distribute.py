"""Choosing a tf.distribute strategy from the `--distribution_strategy` flag's plain value."""

from __future__ import annotations

import tensorflow as tf

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
    workers = max(1, replicas // len(strategy.extended.worker_devices))
    worker_index = getattr(getattr(strategy, "cluster_resolver", None), "task_id", 0) or 0
    for flag, size in batch_sizes.items():
        if size % replicas:
            raise ValueError(f"--{flag}={size} is not divisible by {replicas} replicas")
    return strategy, workers, worker_index
