"""Pretraining data creation: instances/s and peak memory of data_prep/create_pretraining_data.py
against the original google-research/bert create_pretraining_data.py, same corpus and flags.

The original is run unchanged from PyPI's `bert-tensorflow` wheel (bench/requirements.txt), which
ships google-research/bert's scripts; it runs on TF 2.21 as is through `tensorflow.compat.v1`.
Both run as separate processes; the peak resident memory of each is the kernel's ru_maxrss of
that child (os.wait4). Each runs at 1x and Nx a base corpus (the base text repeated N times), so
memory that grows with the corpus shows in the second row. instances/s is over each whole run
(reading, tokenizing, creating, writing; both import TensorFlow at start-up), which at a small
corpus is mostly that start-up. At the first scale the two outputs are also compared record by
record: the same text, vocabulary, flags and seed must give the same records.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORIGINAL_REQUIREMENT = "bert-tensorflow==1.0.4"


def original_script_dir() -> Path:
    """Fetches (once, into the Cloze cache) the bert-tensorflow wheel and returns the folder that
    holds its `bert` package (create_pretraining_data.py, tokenization.py)."""
    from data_prep import fetch

    files = fetch.fetch_package_files(
        ORIGINAL_REQUIREMENT, lambda n: n.startswith("bert/") and n.endswith(".py"), binary=True
    )
    script = next((p for p in files if p.name == "create_pretraining_data.py"), None)
    if script is None:
        raise RuntimeError(f"{ORIGINAL_REQUIREMENT}: no bert/create_pretraining_data.py in it")
    return script.parent.parent


def base_corpus(source, out_path, max_bytes: int) -> dict:
    """Writes the first documents of `source` (blank-line separated) up to about `max_bytes`
    to `out_path`, cut at a document boundary. Returns {"bytes", "documents"}."""
    written = documents = 0
    with open(source, encoding="utf-8") as src, open(out_path, "w", encoding="utf-8") as out:
        for line in src:
            out.write(line)
            written += len(line.encode("utf-8"))
            if not line.strip():
                documents += 1
                if written >= max_bytes:
                    break
    if documents < 2:
        raise ValueError(f"{source}: fewer than two blank-line separated documents to benchmark on")
    return {"bytes": written, "documents": documents}


def repeat_corpus(base, out_path, times: int) -> int:
    """`times` copies of `base` one after the other (each copy ends with a blank line, so no
    document spans two copies). Returns the bytes written."""
    text = Path(base).read_text(encoding="utf-8")
    if not text.endswith("\n\n"):
        text = text.rstrip("\n") + "\n\n"
    Path(out_path).write_text(text * times, encoding="utf-8")
    return len(text.encode("utf-8")) * times


# Started by run_measured, this small process runs the command and prints the command's own
# peak RSS. Linux carries a process's RSS high-water mark over fork and exec, so a child forked
# straight from a benchmark process that holds gigabytes would report the parent's size.
_PEAK_RSS_WRAPPER = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
print(f"PEAK_RSS_KB={usage.ru_maxrss}", file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd, env=None, cwd=None) -> dict:
    """Runs `cmd`, returns wall seconds and its peak resident memory in MB (ru_maxrss of the
    command, taken in a small wrapper process: see _PEAK_RSS_WRAPPER); raises with the tail of
    its output when it fails."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_WRAPPER, *map(str, cmd)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        text=True,
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout[-3000:]}"
        )
    peak = [line for line in result.stdout.splitlines() if line.startswith("PEAK_RSS_KB=")]
    return {"seconds": seconds, "peak_rss_mb": int(peak[-1].split("=")[1]) / 1024.0}


def count_records(path) -> int:
    import tensorflow as tf

    return int(tf.data.TFRecordDataset(str(path)).reduce(0, lambda n, _: n + 1).numpy())


def records_equal(a, b, seq: int, predictions: int) -> dict:
    """Compares two pretraining TFRecord files feature by feature, record by record."""
    import numpy as np
    import tensorflow as tf

    from data_prep import features

    spec = features.pretraining_feature_spec(seq, predictions)

    def parsed(path):
        return tf.data.TFRecordDataset(str(path)).map(lambda s: tf.io.parse_single_example(s, spec))

    compared = differing = 0
    for x, y in zip(parsed(a), parsed(b)):
        compared += 1
        if any(not np.array_equal(x[k].numpy(), y[k].numpy()) for k in spec):
            differing += 1
    return {"records_compared": compared, "records_differing": differing}


def flags_for(corpus, output, vocab_file, seq, predictions, dupe_factor, seed) -> list[str]:
    # The original's flag names, which create_pretraining_data.py keeps.
    return [
        f"--input_file={corpus}",
        f"--output_file={output}",
        f"--vocab_file={vocab_file}",
        "--do_lower_case=True",
        f"--max_seq_length={seq}",
        f"--max_predictions_per_seq={predictions}",
        "--masked_lm_prob=0.15",
        "--short_seq_prob=0.1",
        f"--random_seed={seed}",
        f"--dupe_factor={dupe_factor}",
    ]


def run(
    corpus,
    vocab_file,
    work_dir,
    base_bytes: int = 1_000_000,
    scales=(1, 10),
    dupe_factor: int = 1,
    seq: int = 128,
    predictions: int = 20,
    seed: int = 12345,
    original: bool = True,
) -> dict:
    """The benchmark. `original=False` runs Cloze only (no peer; for quick smoke runs)."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    base = work / "corpus_x1.txt"
    info = base_corpus(corpus, base, base_bytes)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    original_env = None
    if original:
        original_env = env | {"PYTHONPATH": str(original_script_dir())}
    rows = []
    for scale in scales:
        text = work / f"corpus_x{scale}.txt"
        size = repeat_corpus(base, text, scale) if scale != 1 else base.stat().st_size
        row = {"scale": scale, "corpus_bytes": size}
        sides = [
            ("cloze", [sys.executable, str(REPO / "data_prep/create_pretraining_data.py")], env)
        ]
        if original:
            sides.append(
                ("original", [sys.executable, "-m", "bert.create_pretraining_data"], original_env)
            )
        for name, cmd, side_env in sides:
            output = work / f"{name}_x{scale}.tfrecord"
            flags = flags_for(text, output, vocab_file, seq, predictions, dupe_factor, seed)
            measured = run_measured(cmd + flags, env=side_env, cwd=str(work))
            instances = count_records(output)
            row[name] = measured | {
                "instances": instances,
                "instances_per_s": instances / measured["seconds"],
            }
        if original:
            row["ratio"] = row["cloze"]["instances_per_s"] / row["original"]["instances_per_s"]
            if scale == scales[0]:
                row["same_records"] = records_equal(
                    work / f"cloze_x{scale}.tfrecord",
                    work / f"original_x{scale}.tfrecord",
                    seq,
                    predictions,
                )
        rows.append(row)
    return {
        "corpus": str(corpus),
        "base": info,
        "vocab": str(vocab_file),
        "dupe_factor": dupe_factor,
        "max_seq_length": seq,
        "max_predictions_per_seq": predictions,
        "scales": rows,
    }
