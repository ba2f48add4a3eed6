"""Pretraining data creation: instances/s and peak memory of data_prep/create_pretraining_data.py
against the original google-research/bert create_pretraining_data.py, same corpus and flags.

The original is run unchanged from PyPI's `bert-tensorflow` wheel (bench/requirements.txt), which
ships google-research/bert's scripts; it runs on TF 2.21 as is through `tensorflow.compat.v1`.
Every side runs as a separate process, at 1x and Nx a base corpus (the base text repeated N times),
so memory that grows with the corpus shows in the second row. Sides:
  cloze          the default, streaming mode (bounded chunks on worker processes)
  cloze_compat   --compat_original: the original's algorithm, whose records must equal the
                 original's record for record (run and checked at the first scale the original
                 runs at)
  original       the original script
Per side: `seconds` end to end (interpreter and TensorFlow start-up included, which at a small
corpus is most of it) and `work_seconds` from the side's "reading input" log line to its exit
(start-up and vocabulary loading excluded), instances/s of both; `cpu_seconds`, user + system
time of the side and its workers, and `work_cpu_seconds`, the part after the marker line
(instances per CPU second is the figure that a loaded, shared machine disturbs least: there wall
time measures the scheduler more than the program); `peak_rss_mb`, the kernel's ru_maxrss of the
side's main process, and `peak_tree_rss_mb`, the largest sum of the resident memory of the process
and all its descendants (worker processes) sampled every 0.1 s.

  python -m bench.create_data --corpus=default_run/corpus/train.txt \
    --vocab_file=default_run/vocab.txt --work_dir=/tmp/bench_create_data
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
# straight from a benchmark process that holds gigabytes would report the parent's size. ru_maxrss
# covers one process at a time, so a thread also samples the sum over the command's process tree.
_PEAK_RSS_WRAPPER = """
import os, subprocess, sys, threading, time
page = os.sysconf("SC_PAGE_SIZE")
def tree_rss(root):
    parent, rss = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
                rss[int(name)] = int(open(f"/proc/{name}/statm").read().split()[1]) * page
            except OSError:
                continue
            parent[int(name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += [child for child, p in parent.items() if p == pid]
    return total
marker = sys.argv[1]
proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
done, peak = threading.Event(), [0]
def sample():
    while not done.wait(0.1):
        peak[0] = max(peak[0], tree_rss(proc.pid))
threading.Thread(target=sample, daemon=True).start()
for line in proc.stdout:  # passed on, and the time the marker line arrived noted
    sys.stdout.write(line)
    if marker and marker in line:
        print(f"MARK_EPOCH={time.time()}", file=sys.stderr)
        stat = open(f"/proc/{proc.pid}/stat").read()
        ticks = sum(map(int, stat[stat.rindex(")") + 2 :].split()[11:15]))  # utime .. cstime
        print(f"MARK_CPU_S={ticks / os.sysconf('SC_CLK_TCK')}", file=sys.stderr)
        marker = ""
_, status, usage = os.wait4(proc.pid, 0)
done.set()
print(f"END_EPOCH={time.time()}", file=sys.stderr)
print(f"PEAK_RSS_KB={usage.ru_maxrss}", file=sys.stderr)
print(f"CPU_S={usage.ru_utime + usage.ru_stime}", file=sys.stderr)
print(f"PEAK_TREE_RSS_KB={max(peak[0] // 1024, usage.ru_maxrss)}", file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd, env=None, cwd=None, work_marker: str | None = None) -> dict:
    """Runs `cmd`, returns wall seconds and its peak resident memory in MB (ru_maxrss of the
    command, taken in a small wrapper process: see _PEAK_RSS_WRAPPER, and the peak sum over its
    process tree); raises with the tail of its output when it fails. With `work_marker`, also
    `work_seconds`: from the arrival of the first output line containing it to the command's
    exit."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_WRAPPER, work_marker or "", *map(str, cmd)],
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
    lines = result.stdout.splitlines()

    def value(key):
        return float([line for line in lines if line.startswith(key + "=")][-1].split("=")[1])

    measured = {
        "seconds": seconds,
        # user + system time of the command and of the children it waited for (its workers)
        "cpu_seconds": value("CPU_S"),
        "peak_rss_mb": value("PEAK_RSS_KB") / 1024.0,
        "peak_tree_rss_mb": value("PEAK_TREE_RSS_KB") / 1024.0,
    }
    if work_marker:
        if not any(line.startswith("MARK_EPOCH=") for line in lines):
            raise RuntimeError(f"no line with {work_marker!r} in the output of {cmd}")
        measured["work_seconds"] = value("END_EPOCH") - value("MARK_EPOCH")
        # CPU time of the process (and its reaped children) when the marker line arrived
        measured["work_cpu_seconds"] = measured["cpu_seconds"] - value("MARK_CPU_S")
    return measured


def count_records(path) -> int:
    import tensorflow as tf

    from data_prep import lm_data

    return lm_data.count_records(tf.data.TFRecordDataset(str(path)))


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


def estimate_original_rss_mb(rows: list[dict], corpus_bytes: int) -> float | None:
    """The original's peak RSS at `corpus_bytes`, extrapolated from the rows where it ran (it
    holds every document and instance in memory: linear in the corpus). Two or more rows: the
    line through the first and the largest; one row: proportional to the corpus (an upper bound,
    as it scales the start-up too). None before any row."""
    ran = [(r["corpus_bytes"], r["original"]["peak_rss_mb"]) for r in rows if "original" in r]
    if not ran:
        return None
    (x0, y0), (x1, y1) = ran[0], max(ran)
    if x1 == x0:
        return y0 * corpus_bytes / x0
    return y0 + (y1 - y0) * (corpus_bytes - x0) / (x1 - x0)


def headline(rows: list[dict]) -> list[dict]:
    """Per scale: wall-clock instances/s end to end (interpreter and imports included) of the
    streaming default and of the original, and their ratio: the issue's target figure. Where the
    original did not run at a scale, its rate at the largest scale it ran at is the reference
    (its instances/s do not rise with the corpus: one core, everything in memory)."""
    ran = [r for r in rows if "original" in r]
    out = []
    for row in rows:
        reference = row if "original" in row else (ran[-1] if ran else None)
        line = {
            "scale": row["scale"],
            "corpus_mb": row["corpus_bytes"] / 1e6,
            "cloze_instances_per_s": row["cloze"]["instances_per_s"],
            "cloze_peak_tree_rss_mb": row["cloze"]["peak_tree_rss_mb"],
        }
        if reference is not None:
            o = reference["original"]
            line |= {
                "original_scale": reference["scale"],
                "original_instances_per_s": o["instances_per_s"],
                "wall_ratio": row["cloze"]["instances_per_s"] / o["instances_per_s"],
                "work_wall_ratio": (
                    row["cloze"]["work_instances_per_s"] / o["work_instances_per_s"]
                ),
                "cpu_ratio": row["cloze"]["instances_per_cpu_s"] / o["instances_per_cpu_s"],
            }
        out.append(line)
    return out


SIDES = ("cloze", "cloze_compat", "original")
# The log line each side writes once start-up (imports, vocabulary, tokenizer) is over. The
# original's logger prints no time stamps, so the wrapper notes when the line arrives.
WORK_MARKERS = {
    "cloze": "] Reading ",
    "cloze_compat": "] Reading ",
    "original": "*** Reading from input files ***",
}


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
    original_scales=None,
    num_workers: int | None = None,
    original_max_rss_mb: float = 16_000,
) -> dict:
    """The benchmark. `original=False` runs streaming Cloze only (no peer; for quick smoke runs);
    `original_scales` limits the original and --compat_original to those scales (default: all),
    since the original's time and memory grow with the corpus; `num_workers` is passed to the
    streaming side (default: its own, the cores it may use). The original is skipped (and the
    estimate recorded) at a scale where estimate_original_rss_mb exceeds `original_max_rss_mb`.
    The headline is `headline`: wall-clock instances/s, streaming / original."""
    # The sides run in work_dir: paths relative to the caller's folder are resolved first.
    corpus, vocab_file = Path(corpus).resolve(), Path(vocab_file).resolve()
    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    base = work / "corpus_x1.txt"
    info = base_corpus(corpus, base, base_bytes)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    original_env = None
    if original:
        original_env = env | {"PYTHONPATH": str(original_script_dir())}
    script = [sys.executable, str(REPO / "data_prep/create_pretraining_data.py")]
    workers = [f"--num_workers={num_workers}"] if num_workers else []
    rows = []
    for scale in scales:
        text = work / f"corpus_x{scale}.txt"
        size = repeat_corpus(base, text, scale) if scale != 1 else base.stat().st_size
        row = {"scale": scale, "corpus_bytes": size}
        sides = [("cloze", script + workers, env)]
        estimate = estimate_original_rss_mb(rows, size)
        if estimate is not None:
            row["original_estimated_rss_mb"] = estimate
        wanted = original and (original_scales is None or scale in original_scales)
        if wanted and estimate is not None and estimate > original_max_rss_mb:
            row["original_skipped"] = (
                f"estimated peak RSS {estimate:.0f} MB > {original_max_rss_mb}"
            )
            wanted = False
        if wanted:
            if not any("original" in r for r in rows):  # records compared at one scale only
                sides.append(("cloze_compat", script + ["--compat_original"], env))
            sides.append(
                ("original", [sys.executable, "-m", "bert.create_pretraining_data"], original_env)
            )
        for name, cmd, side_env in sides:
            output = work / f"{name}_x{scale}.tfrecord"
            flags = flags_for(text, output, vocab_file, seq, predictions, dupe_factor, seed)
            measured = run_measured(
                cmd + flags, env=side_env, cwd=str(work), work_marker=WORK_MARKERS[name]
            )
            instances = count_records(output)
            row[name] = measured | {
                "instances": instances,
                "instances_per_s": instances / measured["seconds"],
                "work_instances_per_s": instances / measured["work_seconds"],
                "instances_per_cpu_s": instances / measured["cpu_seconds"],
                "work_instances_per_cpu_s": instances / measured["work_cpu_seconds"],
            }
        if "original" in row:
            o = row["original"]
            for name in ("cloze", "cloze_compat")[: len(sides) - 1]:
                row[f"ratio_{name}"] = row[name]["instances_per_s"] / o["instances_per_s"]
                row[f"work_ratio_{name}"] = (
                    row[name]["work_instances_per_s"] / o["work_instances_per_s"]
                )
                row[f"cpu_ratio_{name}"] = (
                    row[name]["instances_per_cpu_s"] / o["instances_per_cpu_s"]
                )
                row[f"work_cpu_ratio_{name}"] = (
                    row[name]["work_instances_per_cpu_s"] / o["work_instances_per_cpu_s"]
                )
            row["ratio"] = row["ratio_cloze"]
            if not any("same_records" in r for r in rows):
                row["same_records"] = records_equal(
                    work / f"cloze_compat_x{scale}.tfrecord",
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
        "load_average": os.getloadavg(),
        "cpus": len(os.sched_getaffinity(0)),
        "headline": headline(rows),
        "scales": rows,
    }


def main(argv):
    import json

    from absl import flags

    f = flags.FLAGS
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    result = run(
        f.corpus,
        f.vocab_file,
        f.work_dir,
        base_bytes=f.base_bytes,
        scales=[int(x) for x in f.scales],
        dupe_factor=f.dupe_factor,
        original_scales=[int(x) for x in f.original_scales] if f.original_scales else None,
        num_workers=f.num_workers,
        original_max_rss_mb=f.original_max_rss_mb,
    )
    text = json.dumps(result, indent=2, sort_keys=True)
    Path(f.work_dir, "results.json").write_text(text + "\n")
    print(text)
    for line in result["headline"]:  # the target figure, last so it is the first thing seen
        print(
            f"{line['corpus_mb']:.1f} MB, dupe_factor {result['dupe_factor']}: streaming "
            f"{line['cloze_instances_per_s']:,.0f} instances/s wall-clock end to end"
            + (
                f", {line['wall_ratio']:.1f}x the original's "
                f"{line['original_instances_per_s']:,.0f}"
                f" (at {line['original_scale']}x; after start-up {line['work_wall_ratio']:.1f}x,"
                f" per CPU second {line['cpu_ratio']:.1f}x)"
                if "wall_ratio" in line
                else ""
            )
            + f", peak RSS with workers {line['cloze_peak_tree_rss_mb']:.0f} MB"
        )


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("corpus", "default_run/corpus/train.txt", "Corpus to cut the base from.")
    flags.DEFINE_string("vocab_file", "default_run/vocab.txt", "WordPiece vocabulary.")
    flags.DEFINE_string("work_dir", None, "Folder for corpora, records and results.json.")
    flags.DEFINE_integer("base_bytes", 500_000, "The 1x corpus: about this much of --corpus.")
    flags.DEFINE_list("scales", ["1", "10"], "Corpus sizes, in copies of the 1x corpus.")
    flags.DEFINE_integer("dupe_factor", 10, "--dupe_factor of every side (the original's 10).")
    flags.DEFINE_list(
        "original_scales",
        [],
        "Scales the original runs at (default: all; a scale not in --scales, such as 0, runs it "
        "at none: the streaming side alone).",
    )
    flags.DEFINE_integer("num_workers", None, "Streaming workers (default: the cores).")
    flags.DEFINE_float(
        "original_max_rss_mb",
        16_000,
        "Skip the original at a scale where its extrapolated peak RSS exceeds this.",
    )
    flags.mark_flag_as_required("work_dir")
    app.run(main)
