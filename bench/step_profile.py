"""Where a pretraining step's time goes: a tf.profiler trace of the Trainer's step, by op type.

Profiles a few train steps of Cloze's BertPretrainer and of keras-hub's BERT (the same two
Trainers as bench/pretrain_throughput.py) and sums the TensorFlow ops' own execution time from
the trace, by op type (MatMul, Mul, Transpose, ...) and by phase (forward, backward = ops under
the gradient tape, optimizer = ops of the AdamW update, xla = calls of XLA-compiled kernels:
the fused GELU, LayerNorm and cross-entropy and AdamW's one-pass update of the large variables,
each call with its whole time (read_op_events), named after its call op in top_ops;
other = clipping, the finiteness check, metrics). Shares are of the summed op time on the
executor threads, which with two cores can exceed the wall time; they say what to make cheaper,
not how long a step takes (and an op's time includes waiting for busy cores: see
--one_op_at_a_time below).

  python -m bench.step_profile --size=L4/H256/A4/I1024 --steps=3 --output=/tmp/profile.json

--precision=bf16 (or fp16) profiles both sides built under that mixed policy, as the
pretraining benchmark's --precision does; each side's compute dtype is in the result.

--one_op_at_a_time sets TensorFlow's inter-op parallelism to 1 before anything runs, so ops
run one after another, each on all cores. Then op time adds up to the wall time, and
`outside_ops_s_per_step` (wall minus op time: the executor's own work) means something.
Why: with ops in parallel on 2 cores, an op's traced time includes waiting for busy cores. In
the fifty-fifth session the global norm's L2Loss ops read 7% of BERT-base's op time that way;
a step without them was no faster.

summarize_perfetto_trace reads the other profiler format used here: the Perfetto trace of
jax.profiler, for bench/gpu_mfu.py's step under Keras' JAX backend (on a lent GPU).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import tempfile
import time

from training.precision import PRECISION_NAMES


def phase_of(op_name: str) -> str:
    """The phase of a traced op from its name scope (see the module docstring)."""
    if op_name.startswith("xla/"):
        return "xla"
    if "gradient_tape/" in op_name or "_backward/" in op_name:  # _backward: custom gradients
        return "backward"
    if "adam_w" in op_name or "/lamb" in op_name:
        return "optimizer"
    if any(k in op_name for k in ("pretrainer", "softmax_xent", "SparseSoftmaxCrossEntropy")):
        return "forward"
    return "other"


def op_type_of(traced_type: str) -> str:
    """The op type without oneDNN's kernel prefix: TensorFlow's oneDNN build (on by default on
    CPUs with AVX-512 VNNI / BF16 or AMX) traces MatMul as `_MklMatMul`, Transpose as
    `_MklTranspose`, fused ones as `_MklNativeFusedMatMul`, so tables from either build compare
    by type (run() records which build ran)."""
    for prefix in ("_MklNative", "_Mkl"):
        if traced_type.startswith(prefix):
            return traced_type[len(prefix) :]
    return traced_type


def _string_stats(event, stat_names: dict) -> dict:
    """A trace event's stats whose values are strings (inline or by reference), by stat name."""
    out = {}
    for stat in event.stats:
        value = stat.str_value
        if not value and stat.ref_value:
            value = stat_names.get(stat.ref_value, "")
        out[stat_names.get(stat.metadata_id, "")] = value
    return out


def read_op_events(xplane_path: str):
    """Yields (op name, op type, seconds) of every TensorFlow op execution in a profiler
    XSpace file (`*.xplane.pb`), from the executor threads' lines (tf_Compute).

    Synchronous ops are the trace events named "name:Type"; the executor's own bookkeeping
    events (ExecutorState::Process, ...) have no colon and are left out. Asynchronous ops have
    no such event: an "ExecutorState::ProcessAsync::Start" event carries their name and kernel
    type as stats and lasts until the op is done. A call of an XLA-compiled function (the fused
    GELU, LayerNorm, cross-entropy and AdamW kernels) is one: the executor thread runs the
    compiled program, part of its thunks on the intra-op threads, and waits for them. Each is
    yielded as ("xla/<op name>", "XlaCall", seconds), with all of that time; other asynchronous
    ops (the input pipeline's IteratorGetNext) under their kernel type. XLA's fusions run inside
    a call trace as events named after their HLO ("add_multiply_fusion"); those inside a call
    are part of its time, and any outside one (under --use_xla) is yielded as
    ("xla/<name>", "XlaFusion", seconds). An XLA execution whose call's events the profiler
    lost is yielded as a call named "xla/?". Types lose oneDNN's `_Mkl` prefix (op_type_of).

    Why the calls and not only the fusions: until the fifty-sixth session only the fusions on
    the executor threads were counted, so an XLA call's thunks on the intra-op threads and its
    wait for them read as time outside ops (at L4/H256, 23 of the 27 ms that
    --one_op_at_a_time put there).
    """
    import bisect
    import itertools

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            events = sorted(line.events, key=lambda e: e.offset_ps)
            names = [plane.event_metadata[e.metadata_id].name for e in events]
            executions = [
                (e.offset_ps, e.offset_ps + e.duration_ps)
                for e, name in zip(events, names)
                if name == "CpuExecutable::ExecuteAsyncOnStream"
            ]
            execution_starts = [start for start, _ in executions]
            calls = []  # (start, end) of the XLA calls
            for event, name in zip(events, names):
                if name != "ExecutorState::ProcessAsync::Start":
                    continue
                start, end = event.offset_ps, event.offset_ps + event.duration_ps
                stats = _string_stats(event, stat_names)
                i = bisect.bisect_left(execution_starts, start)
                if i < len(executions) and execution_starts[i] <= end:
                    calls.append((start, end))
                    yield f"xla/{stats.get('name', '?')}", "XlaCall", event.duration_ps / 1e12
                else:
                    op_type = op_type_of(stats.get("kernel_type") or "AsyncOp")
                    yield stats.get("name", "?"), op_type, event.duration_ps / 1e12
            # An execution outside every call: the profiler lost its call's events (seen on a
            # busy machine in a trace's first step: the execution and its fusions recorded, the
            # executor's Process and ProcessAsync::Start around them not). It is a call of its
            # own, its op name unknown.
            # Calls come in start order: an execution starting at s is inside one when the
            # furthest end of the calls started by s reaches it (one bisect, not a scan).
            reach = list(itertools.accumulate((b for _, b in calls), max))
            starts = [a for a, _ in calls]
            last = [bisect.bisect_right(starts, s) - 1 for s, _ in executions]
            orphans = [(s, e) for (s, e), i in zip(executions, last) if i < 0 or reach[i] < s]
            for start, end in orphans:
                yield "xla/?", "XlaCall", (end - start) / 1e12
            calls = sorted(calls + orphans)
            call_starts = [start for start, _ in calls]
            for event, name in zip(events, names):
                if ":" not in name and "fusion" in name:
                    i = bisect.bisect_right(call_starts, event.offset_ps) - 1
                    if i < 0 or calls[i][1] < event.offset_ps:  # not inside a call
                        yield f"xla/{name}", "XlaFusion", event.duration_ps / 1e12
                if ":" not in name or "::" in name or name.startswith("end: "):
                    continue
                op_name, op_type = name.rsplit(":", 1)
                yield op_name, op_type_of(op_type), event.duration_ps / 1e12


def breakdown(events, top: int = 12) -> dict:
    """Summed op seconds by type and by phase, with shares of the total, from read_op_events."""
    by_type: collections.Counter = collections.Counter()
    by_phase: collections.Counter = collections.Counter()
    by_op: collections.Counter = collections.Counter()
    for op_name, op_type, seconds in events:
        by_type[op_type] += seconds
        by_phase[phase_of(op_name)] += seconds
        by_op[f"{op_name}:{op_type}"] += seconds
    total = sum(by_type.values())
    if total <= 0:
        raise ValueError("the trace holds no TensorFlow op (was the profiler running?)")

    def shares(counter, n=None):
        return {k: {"s": v, "share": v / total} for k, v in counter.most_common(n)}

    return {
        "total_op_s": total,
        "by_type": shares(by_type, top),
        "by_phase": shares(by_phase),
        "top_ops": shares(by_op, top),
    }


# Events of JAX's Perfetto traces that are the profiler's or the runtime's bookkeeping, not work.
_PERFETTO_BOOKKEEPING = ("ThreadpoolListener::", "ThunkExecutor::", "end: ")


def summarize_perfetto_trace(directory: str, steps: int, top: int = 25) -> dict:
    """Where the time of `steps` profiled steps went, from the Perfetto trace that
    jax.profiler.trace(directory, create_perfetto_trace=True) wrote (bench/gpu_mfu.py).

    Returns {"<process> <thread>": {"busy_ms_per_step", "top": [[event name, ms per step],
    ...]}} for every traced thread but the Python one: on a GPU the device's streams (kernel
    names) and its XLA op / module lines (HLO names), on a CPU the XLA runtime's thread pools
    (one event per HLO thunk; a pool's threads make one line). Lines of one device overlap (a
    kernel and the XLA op it belongs to), so compare a line with the same line of another run,
    never sum across lines. Events of the profiler's and the runtime's bookkeeping
    (_PERFETTO_BOOKKEEPING) are left out.
    """
    import gzip

    files = sorted(glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.trace.json.gz (was jax.profiler tracing?)")
    with gzip.open(files[-1], "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    lines: dict = collections.defaultdict(collections.Counter)
    for e in events:
        if e.get("ph") != "X" or e["name"].startswith(_PERFETTO_BOOKKEEPING):
            continue
        # A pool's threads carry a per-run id ("tf_XLAEigen/-5588..."): one line per pool, so
        # runs and sides compare line by line.
        thread = re.sub(r"/-?\d+$", "", threads.get((e["pid"], e["tid"]), str(e["tid"])))
        if thread == "python":
            continue
        line = f"{processes.get(e['pid'], e['pid'])} {thread}"
        lines[line][e["name"]] += e.get("dur", 0.0) / 1e3 / steps  # microseconds -> ms per step
    return {
        line: {
            "busy_ms_per_step": sum(counter.values()),
            "top": [[name, ms] for name, ms in counter.most_common(top)],
        }
        for line, counter in sorted(lines.items())
    }


def profile_steps(fit, iterator, steps: int, logdir: str) -> dict:
    """Traces `steps` train steps of a Trainer (already traced and compiled) into `logdir` and
    returns their breakdown plus the wall time per step while profiled."""
    import tensorflow as tf

    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    fit.train_steps(iterator, steps)
    wall = (time.perf_counter() - start) / steps
    tf.profiler.experimental.stop()
    files = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    if not files:
        raise RuntimeError(f"{logdir}: the profiler wrote no .xplane.pb file")
    result = breakdown(read_op_events(files[-1]))
    result["profiled_wall_s_per_step"] = wall
    result["op_s_per_step"] = result["total_op_s"] / steps
    # Meaningful with ops one at a time (run's one_op_at_a_time); negative when they overlap.
    result["outside_ops_s_per_step"] = wall - result["op_s_per_step"]
    return result


def run(
    size: str,
    batch: int,
    seq: int,
    predictions: int,
    steps: int,
    use_xla: bool,
    precision: str = "fp32",
    one_op_at_a_time: bool = False,
) -> dict:
    import tensorflow as tf

    if one_op_at_a_time:
        try:
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError as e:  # TensorFlow's runtime already started in this process
            raise RuntimeError(
                "step_profile --one_op_at_a_time: TensorFlow has already run something in this "
                "process, so its inter-op parallelism cannot change; run it in a fresh process "
                f"({e})"
            ) from e
    from bench import pretrain_throughput
    from modeling import layers

    config = pretrain_throughput.parse_size(size, max_seq_length=seq)
    trainers = pretrain_throughput.build_trainers(config, precision, use_xla)
    data = pretrain_throughput.synthetic_batch(batch, seq, predictions, config.vocab_size)
    out = {"size": size, "batch": batch, "seq": seq, "predictions": predictions, "steps": steps}
    out["precision"] = precision
    out["onednn"] = layers.onednn_enabled()
    # 0: TensorFlow's default (as many as it picks); 1 under one_op_at_a_time.
    out["inter_op_threads"] = tf.config.threading.get_inter_op_parallelism_threads()
    for name, fit in trainers.items():
        iterator = iter(tf.data.Dataset.from_tensors(data).repeat())
        fit.train_steps(iterator, 1)  # trace and compile outside the profile
        with tempfile.TemporaryDirectory() as logdir:
            out[name] = profile_steps(fit, iterator, steps, logdir)
        model = fit.task.model  # keras-hub's side holds its Keras model as .model
        out[name]["compute_dtype"] = getattr(model, "model", model).dtype_policy.compute_dtype
    return out


def format_table(result: dict) -> str:
    lines = []
    for name in ("cloze", "keras_hub"):
        r = result[name]
        lines.append(
            f"{name}: {r['op_s_per_step']:.3f} op-s per step, "
            f"{r['profiled_wall_s_per_step']:.3f} s wall per step (profiled)"
            + (
                f", {r['outside_ops_s_per_step']:.3f} s outside ops"
                if result.get("inter_op_threads") == 1
                else ""
            )
        )
        for group in ("by_phase", "by_type"):
            cells = ", ".join(f"{k} {v['share']:.1%}" for k, v in r[group].items())
            lines.append(f"  {group}: {cells}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="L4/H256/A4/I1024")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--use_xla", action="store_true")
    p.add_argument("--precision", choices=PRECISION_NAMES, default="fp32")
    p.add_argument(
        "--one_op_at_a_time",
        action="store_true",
        help="inter-op parallelism 1: op times add up to the wall time (module docstring)",
    )
    p.add_argument("--output", default="")
    args = p.parse_args()
    result = run(
        args.size,
        args.batch,
        args.seq,
        args.predictions,
        args.steps,
        args.use_xla,
        args.precision,
        args.one_op_at_a_time,
    )
    print(format_table(result))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
