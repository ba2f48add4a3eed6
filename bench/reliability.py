"""Reliability figures: kills during training and during saves, damaged TFRecords, reader fuzzing.

  python bench/reliability.py --work_dir=/tmp/cloze_reliability      # the full run (minutes)
  python bench/reliability.py --quick                                # seconds-to-a-minute check

Prints one JSON object of counts:
  kill_resume: a tiny BERT (dropout on) trains --steps steps in a child process that is SIGKILLed
    at --kills random steps and restarted each time; its final weights and per-step loss log are
    compared bit for bit with an uninterrupted child run.
  save_kill: a child saves checkpoints of a model and its optimizer in a loop, every variable set
    to the checkpoint number, and is SIGKILLed at a random moment (--save_kills times); the
    latest checkpoint must restore whole with every value equal to its number, and the trainer's
    start-up clean-up must remove every half-written `ckpt-N_temp` folder.
  corruption: truncated, bit-flipped, empty and foreign TFRecords: how many the validation pass
    detects, what reading without skipping loses silently (must be 0: it stops with an error),
    and what --skip_corrupt_records skips (must equal the validation pass's count).
  fuzz: examples the reader fuzz tests (tests/test_fuzz_readers.py) tried, and failures.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLAGS = flags.FLAGS
flags.DEFINE_bool("quick", False, "Few steps, one kill of each kind, a short fuzz run.")
flags.DEFINE_string("work_dir", "", "Scratch folder (default: a new temp folder, removed after).")
flags.DEFINE_integer("steps", 300, "Training steps of the kill/resume run.")
flags.DEFINE_integer("kills", 6, "SIGKILLs during training.")
flags.DEFINE_integer("save_kills", 8, "SIGKILLs during checkpoint saving.")
flags.DEFINE_integer("fuzz_examples", 300, "hypothesis examples per reader fuzz test.")
flags.DEFINE_integer("seed", 0, "Seed of the kill moments.")
flags.DEFINE_string("child", "", "Internal: train or save, run as a child process.")
flags.DEFINE_string("child_dir", "", "Internal: the child's output folder.")

S, P, B, SAVE_EVERY = 11, 3, 6, 10


# ---------------------------------------------------------------------------------------------
# Children (separate processes, so that SIGKILL hits a real run)


def _tiny_trainer(steps):
    import keras
    import tensorflow as tf

    from modeling import bert
    from training import optimization, tasks, trainer

    config = bert.BertConfig(
        vocab_size=53, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
        intermediate_size=17, hidden_act="gelu", hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, max_position_embeddings=16, type_vocab_size=2,
        initializer_range=0.02,
    )  # fmt: skip
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = bert.BertPretrainer(config)
        model.build()
        opt = optimization.create_optimizer(1e-2, steps, 2)
        opt.build(model.trainable_variables)
    return trainer.Trainer(strategy, tasks.bert_pretraining_task(model), opt), config


def _child_train(out_dir: str, steps: int) -> None:
    from data_prep import features
    from training import trainer

    fit, config = _tiny_trainer(steps)
    data = str(Path(out_dir).parent / "train.tfrecord")
    settings = trainer.TrainSettings(
        out_dir, steps, save_checkpoints_steps=SAVE_EVERY, iterations_per_loop=1,
        config_json=config.to_json_string(),
    )  # fmt: skip
    trainer.run_training(
        fit,
        lambda: features.pretraining_dataset([data], B, S, P, is_training=True, seed=3),
        settings,
        global_batch_size=B,
    )


def _child_save(out_dir: str) -> None:
    """Saves checkpoints 1, 2, ... forever (until killed), every variable set to the number;
    large enough (a few MB) that a kill often lands inside a write."""
    import tensorflow as tf

    holder = [tf.Variable(tf.zeros([300_000])) for _ in range(4)]
    ckpt = tf.train.Checkpoint(values=holder, step=tf.Variable(0, dtype=tf.int64))
    manager = tf.train.CheckpointManager(ckpt, out_dir, max_to_keep=3, checkpoint_name="ckpt")
    number = int(manager.latest_checkpoint.rsplit("-", 1)[1]) if manager.latest_checkpoint else 0
    first = number + 1
    while True:
        number += 1
        for v in holder:
            v.assign(tf.fill(v.shape, float(number)))
        ckpt.step.assign(number)
        manager.save(checkpoint_number=number)
        if number == first:
            print("saved", number, flush=True)


def _spawn(mode: str, out_dir: Path, steps: int = 0) -> subprocess.Popen:
    args = [
        sys.executable,
        __file__,
        f"--child={mode}",
        f"--child_dir={out_dir}",
        f"--steps={steps}",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _log_steps(out_dir: Path) -> int:
    path = out_dir / "train_log.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


# ---------------------------------------------------------------------------------------------
# The loops


def kill_resume(work: Path, steps: int, kills: int, rng: random.Random) -> dict:
    import numpy as np
    import tensorflow as tf

    from tests.helpers import write_synthetic_pretraining_file
    from training import trainer

    write_synthetic_pretraining_file(work / "train.tfrecord", 37, S, P, 53)
    straight = _spawn("train", work / "straight", steps)
    killed_dir = work / "killed"
    targets = sorted(rng.sample(range(1, steps), kills))
    kills_done, restarts = [], 0
    for target in targets:
        if _log_steps(killed_dir) >= target:
            continue  # an earlier restart's replay already passed this step
        proc = _spawn("train", killed_dir, steps)
        restarts += 1
        while _log_steps(killed_dir) < target and proc.poll() is None:
            time.sleep(0.005)
        if proc.poll() is not None:
            raise RuntimeError(
                f"the training child ended before step {target}: {proc.stderr.read()}"
            )
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills_done.append(_log_steps(killed_dir))
    final = _spawn("train", killed_dir, steps)
    restarts += 1
    for proc in (final, straight):
        err = proc.communicate()[1]
        if proc.returncode != 0:
            raise RuntimeError(f"a training child failed:\n{err[-3000:]}")
    log_a = trainer.read_jsonl(str(work / "straight" / "train_log.jsonl"))
    log_b = trainer.read_jsonl(str(killed_dir / "train_log.jsonl"))
    a = tf.train.load_checkpoint(str(work / "straight"))
    b = tf.train.load_checkpoint(str(killed_dir))
    # Every tensor but the object graph and the iterator's state (a variant, not readable here;
    # its effect shows in the loss log, which depends on every batch read).
    dtypes = a.get_variable_to_dtype_map()
    names = [n for n, t in dtypes.items() if t != tf.variant and "OBJECT_GRAPH" not in n]
    differ = [n for n in names if not np.array_equal(a.get_tensor(n), b.get_tensor(n))]
    return {
        "steps": steps,
        "kills": len(kills_done),
        "killed_after_logged_steps": kills_done,
        "restarts": restarts,
        "loss_log_bitwise_equal": log_a == log_b and len(log_b) == steps,
        "checkpoint_tensors_compared": len(names),
        "checkpoint_tensors_differing": len(differ),
    }


def save_kill(work: Path, kills: int, rng: random.Random) -> dict:
    import numpy as np
    import tensorflow as tf

    from training import trainer

    out = work / "saves"
    mid_write = restored = temp_cleaned = 0
    for _ in range(kills):
        proc = _spawn("save", out)
        proc.stdout.readline()  # "saved N": TensorFlow is up and a first checkpoint exists
        time.sleep(rng.uniform(0.05, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        temps = list(out.glob("ckpt-*_temp*"))
        mid_write += bool(temps)  # a save was cut off: its temp folder is left
        removed = trainer.clean_temp_checkpoints(str(out))  # what every run does at start-up
        temp_cleaned += len(removed) == len(temps) and not list(out.glob("ckpt-*_temp*"))
        latest = tf.train.latest_checkpoint(str(out))
        number = int(latest.rsplit("-", 1)[1])
        holder = [tf.Variable(tf.zeros([300_000])) for _ in range(4)]
        ckpt = tf.train.Checkpoint(values=holder, step=tf.Variable(0, dtype=tf.int64))
        ckpt.restore(latest).assert_consumed()
        whole = int(ckpt.step.numpy()) == number
        restored += whole and all(np.all(v.numpy() == number) for v in holder)
    return {
        "kills": kills,
        "killed_mid_save": mid_write,
        "latest_restored_intact": restored,
        "temp_folders_cleaned": temp_cleaned,
    }


def corruption(work: Path) -> dict:
    import tensorflow as tf

    from data_prep import features
    from tests.helpers import write_synthetic_pretraining_file

    good = work / "good.tfrecord"
    total = 30
    write_synthetic_pretraining_file(good, total, S, P, 53)
    data = good.read_bytes()
    size = len(data) // total  # fixed-length records
    flipped = bytearray(data)
    flipped[17 * size + 20] ^= 0x04  # a payload byte of record 17
    foreign_records = work / "foreign_records.tfrecord"
    with tf.io.TFRecordWriter(str(foreign_records)) as w:  # readable records of another kind
        for i in range(total):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={"text": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                )
            )
            w.write(example.SerializeToString())
    cases = {
        "truncated": data[: 23 * size + size // 2],
        "bit_flipped": bytes(flipped),
        "empty": b"",
        "foreign_bytes": b"<html>not a TFRecord</html>\n" * 40,
    }
    paths = {name: work / f"{name}.tfrecord" for name in cases}
    for name, raw in cases.items():
        paths[name].write_bytes(raw)
    paths["foreign_records"] = foreign_records

    def read_all(path, skip):
        ds = features.pretraining_dataset([str(path)], 1, S, P, False, skip_corrupt_records=skip)
        n = 0
        try:
            for _ in ds:
                n += 1
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError):
            return n, True
        return n, False

    result = {}
    for name, path in paths.items():
        (check,) = features.validate_pretraining_files([str(path)], S, P)
        read, stopped = read_all(path, skip=False)
        skipped_read, _ = read_all(path, skip=True)
        # Without skipping, every record either reached training or the run stopped with an error.
        lost_silently = 0 if stopped else check.skipped
        result[name] = {
            "records_good": check.good,
            "detected_by_validation": bool(check.problems),
            "message_names_file": str(path) in check.describe(),
            "stopped_without_skipping": stopped,
            "records_lost_silently_without_skipping": lost_silently,
            "records_read_with_skipping": skipped_read,
            "records_skipped_with_skipping": check.skipped,
            "skip_count_matches": skipped_read == check.good,
        }
    return result


def fuzz(examples: int, workers: str = "auto") -> dict:
    """The reader fuzz tests at `examples` hypothesis examples each, under pytest-xdist with
    `workers` ("0": in the one pytest process, where a short run takes 10 s against 22 s with two
    workers, each of which imports TensorFlow first)."""
    env = dict(os.environ, HYPOTHESIS_PROFILE="fuzz-long", CLOZE_FUZZ_EXAMPLES=str(examples))
    cmd = [sys.executable, "-m", "pytest", "tests/test_fuzz_readers.py", "-q", "-n", workers]
    cmd += ["-p", "no:cacheprovider", "--hypothesis-show-statistics"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    # One line per test and phase: "N passing examples, M failing examples, K invalid examples".
    phases = re.findall(
        r"(\d+) passing examples, (\d+) failing examples, (\d+) invalid", result.stdout
    )
    tests = re.search(r"(\d+) passed", result.stdout)
    failed = re.search(r"(\d+) failed", result.stdout)
    return {
        "fuzz_tests_passed": int(tests.group(1)) if tests else 0,
        "fuzz_tests_failed": int(failed.group(1)) if failed else 0,
        "cases_tried": sum(int(p) + int(f) + int(i) for p, f, i in phases),
        "examples_per_test": examples,
        "workers": workers,
    }


def main(argv):
    del argv
    if FLAGS.child == "train":
        return _child_train(FLAGS.child_dir, FLAGS.steps)
    if FLAGS.child == "save":
        return _child_save(FLAGS.child_dir)
    quick = FLAGS.quick
    steps, kills = (24, 1) if quick else (FLAGS.steps, FLAGS.kills)
    save_kills = 1 if quick else FLAGS.save_kills
    fuzz_examples = 20 if quick else FLAGS.fuzz_examples
    rng = random.Random(FLAGS.seed)
    work = Path(FLAGS.work_dir or tempfile.mkdtemp(prefix="cloze_reliability_"))
    if work.exists() and any(work.iterdir()):
        raise app.UsageError(f"--work_dir {work} is not empty; give a new or empty folder")
    work.mkdir(parents=True, exist_ok=True)
    start = time.time()
    report = {
        "kill_resume": kill_resume(work, steps, kills, rng),
        "save_kill": save_kill(work, save_kills, rng),
        "corruption": corruption(work),
        "fuzz": fuzz(fuzz_examples, workers="0" if quick else "auto"),
    }
    report["wall_seconds"] = round(time.time() - start, 1)
    print(json.dumps(report, indent=2))
    if not FLAGS.work_dir:
        shutil.rmtree(work)  # the temp folder made above, and only that


if __name__ == "__main__":
    app.run(main)
