"""Pretraining-step throughput and MFU on a GPU: Cloze's BERT vs keras-hub's, Keras JAX backend.

    KERAS_BACKEND=jax python -m bench.gpu_mfu --output_file=gpu_mfu.json

Why JAX: the GPU machines lent to this project carry JAX and PyTorch but no TensorFlow (its
wheel is far larger than what can be carried there), and Cloze's networks (modeling/bert.py,
heads.py, layers.py, losses.py) are written in `keras.ops` alone, so the same model code runs
under any Keras backend. What this measures is therefore the model's step (forward, backward,
AdamW update) compiled by XLA through JAX, not run_pretraining.py's tf.data + tf.function loop;
on CPU, bench/pretrain_throughput.py measures that loop itself.

Both sides get identical work per step: the encoder, the masked-LM head at the P masked positions
through the tied word table, and a 2-way NSP head on the pooled [CLS] vector (keras-hub's
BertMaskedLM has no NSP head, so one Dense layer on its backbone's pooled output is added), the
same loss (mean MLM cross-entropy + mean NSP cross-entropy), the same optimizer class
(keras.optimizers.AdamW), the same precision policy, batch and random token ids. Each step is
one jitted function of (trainable, non-trainable, optimizer) state; runs alternate between the two
models and the best of `--repeats` timed windows is kept for each.

MFU is model FLOPs per second over the dense matmul peak measured in the same run in the
precision's compute dtype (bfloat16, float16 or float32; the best of several large square
products), so it is a fraction of what this GPU really reaches, not of a datasheet number.
--precision=fp16 (for GPUs without bfloat16, V100 and T4) trains both sides under
mixed_float16 with Keras' dynamic loss scaling (jax_train_step). `--tiny` runs tiny sizes
for a smoke test on any backend's CPU.

With `--profile_dir=DIR` each side then runs `--profile_steps` more steps under jax.profiler
(Perfetto trace in DIR/<size>_b<batch>_<side>/) and writes its compiled step's HLO there as
compiled_step.hlo.txt; each row gets a "profile" per side: busy ms per step and the top events
of every traced line (bench/step_profile.summarize_perfetto_trace): which kernels take each
side's time (on an H200 it showed both steps near their rooflines once the bf16 embedding
gradients were gone; README, "On a GPU"). Each side also
gets its compiled step's kernel inventory, "hlo" (bench/hlo_inventory.py: kernels, matmul FLOPs,
bytes and a roofline estimate against the run's matmul peak and a measured copy bandwidth, with
the timed step over that estimate).

With `--aot_target_config=FILE` nothing runs: each side's step is compiled for the GPU that FILE
describes (an XLA GpuTargetConfig in text form, e.g. bench/gpu_specs/h100_sxm.txtpb) on a machine
without that GPU, XLA's deviceless compilation (`pip install -r bench/requirements-gpu-aot.txt`),
and each row gets both inventories, the compiled step's temporary memory, the analytic FLOPs of
bench/flops.py and, from `--compare_with` (an earlier run's results on that GPU), the measured
step time over the roofline estimate. Without the device XLA cannot autotune, so its kernel
choices (tile sizes, cuBLAS or Triton, split-K) are its heuristics', not the ones a real run
makes; the work (FLOPs, bytes, fusions) is the same program's.

With `--extra_peers=hf_torch` a third side runs each size: Hugging Face transformers'
BertForPreTraining under PyTorch on the same GPU (bench/torch_peer.py with device "cuda": the
same config and batch, torch.autocast in the precision's dtype, GradScaler under fp16, eager as
its users train it), in a bench/peer_worker.py process under `--peer_python` (the machine's
PyTorch; JAX is then held to XLA_PYTHON_CLIENT_MEM_FRACTION 0.45 of the GPU's memory, unless set,
so both fit). Its MFU counts the same model FLOPs as the other sides (it computes more: the
vocabulary projection at every position). Without a GPU it trains on the CPU (the tests).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# The model code must not pull in TensorFlow on this path; choose the backend before keras loads.
# Only when run: imported (a test's process, keras loaded already) it must leave the environment
# alone, or every subprocess started after would get Keras' JAX backend.
if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.flops import bert_pretraining_flops  # noqa: E402
from bench.hlo_inventory import kernel_inventory  # noqa: E402
from bench.pretrain_throughput import WorkerPeer, overflow_steps  # noqa: E402
from bench.step_profile import summarize_perfetto_trace  # noqa: E402
from modeling import bert, losses  # noqa: E402
from training.precision import COMPUTE_DTYPES, POLICIES  # noqa: E402

# (name, layers, hidden, heads, intermediate, batch, seq, predictions)
SIZES = [
    ("L4-H256", 4, 256, 4, 1024, 8, 128, 20),
    ("L4-H256", 4, 256, 4, 1024, 256, 128, 20),
    ("L12-H768", 12, 768, 12, 3072, 8, 128, 20),
    ("L12-H768", 12, 768, 12, 3072, 64, 128, 20),
    ("L24-H1024", 24, 1024, 16, 4096, 32, 128, 20),
]
# Two rows, so a test sees what carries over from one size to the next (set_precision).
TINY_SIZES = [("L2-H24", 2, 24, 3, 37, 3, 16, 5), ("L2-H24", 2, 24, 3, 37, 4, 16, 5)]
VOCAB = 30522


class HubPretrainer(keras.Model):
    """keras-hub's BERT backbone and masked-LM head (the parts of BertMaskedLM) plus a 2-way NSP
    Dense on the pooled output, so it does the same work as Cloze's BertPretrainer."""

    def __init__(self, backbone, vocab, **kwargs):
        import keras_hub

        super().__init__(**kwargs)
        self.backbone = backbone
        self.mlm_head = keras_hub.layers.MaskedLMHead(
            vocabulary_size=vocab,
            token_embedding=backbone.token_embedding,
            intermediate_activation="gelu",
            dtype=backbone.dtype_policy,
        )
        self.nsp = keras.layers.Dense(2, dtype=backbone.dtype_policy)

    def call(self, inputs, training=False):
        out = self.backbone(
            {
                "token_ids": inputs["input_ids"],
                "segment_ids": inputs["segment_ids"],
                "padding_mask": inputs["input_mask"],
            },
            training=training,
        )
        return {
            "mlm_logits": self.mlm_head(out["sequence_output"], inputs["masked_lm_positions"]),
            "nsp_logits": self.nsp(out["pooled_output"]),
        }


def size_config(layers, hidden, heads, intermediate, seq):
    return bert.BertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=max(512, seq),
        type_vocab_size=2,
    )


def build_models(layers, hidden, heads, intermediate, seq):
    import keras_hub

    cloze = bert.BertPretrainer(size_config(layers, hidden, heads, intermediate, seq))
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCAB,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=intermediate,
        max_sequence_length=max(512, seq),
        num_segments=2,
    )
    return {"cloze": cloze, "keras_hub": HubPretrainer(backbone, VOCAB)}


def make_batch(batch, seq, predictions, seed=0):
    rng = np.random.default_rng(seed)
    positions = np.sort(
        np.stack([rng.choice(seq, predictions, replace=False) for _ in range(batch)]), axis=1
    )
    return {
        "input_ids": rng.integers(5, VOCAB, (batch, seq)).astype("int32"),
        "input_mask": np.ones((batch, seq), "int32"),
        "segment_ids": (np.arange(seq)[None, :] >= seq // 2).astype("int32").repeat(batch, 0),
        "masked_lm_positions": positions.astype("int32"),
        "masked_lm_ids": rng.integers(5, VOCAB, (batch, predictions)).astype("int32"),
        "masked_lm_weights": np.ones((batch, predictions), "float32"),
        "next_sentence_labels": rng.integers(0, 2, (batch,)).astype("int32"),
    }


def loss_of(outputs, batch):
    mlm = losses.masked_lm_sums(
        outputs["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"]
    )
    nsp = losses.classification_sums(outputs["nsp_logits"], batch["next_sentence_labels"])
    return mlm["loss_sum"] / mlm["weight"] + nsp["loss_sum"] / nsp["count"]


def jax_train_step(model, optimizer):
    """One jitted step over explicit state (Keras' stateless API), the usual JAX training form.
    With a LossScaleOptimizer (fp16) the gradient is taken of the loss times its dynamic scale,
    read from the optimizer's state as Keras' own JAX trainer reads it; the optimizer's
    stateless_apply unscales, skips a non-finite step and halves or doubles the scale."""
    import jax

    index = None  # of the dynamic scale in the optimizer's state, where it has one
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        index = state_index(optimizer, optimizer.dynamic_scale)

    def compute_loss(trainable, non_trainable, batch, scale):
        outputs, non_trainable = model.stateless_call(
            trainable, non_trainable, batch, training=True
        )
        loss = loss_of(outputs, batch)
        return (loss if scale is None else loss * scale), (loss, non_trainable)

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    @jax.jit
    def step(state, batch):
        trainable, non_trainable, opt_vars = state
        scale = None if index is None else opt_vars[index]
        (_, (loss, non_trainable)), grads = grad_fn(trainable, non_trainable, batch, scale)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return (trainable, non_trainable, opt_vars), loss

    return step


def matmul_peak(dtype, n=8192, repeats=10):
    """Best dense matmul FLOP/s of an n x n x n product in `dtype` on the default device."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    mm = jax.jit(jnp.matmul)
    mm(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        mm(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def set_precision(precision):
    """The global dtype policy for `precision`, set before each size's models are built.

    Why each size: keras.backend.clear_session(), called between sizes to free the last
    models, also resets the global policy to float32. Set once before the loop (as until the
    thirty-sixth session), every size after the first ran in float32 whatever --precision said:
    rows 2-5 of the 2026-11-22 H100 table (README) were float32 steps.
    """
    keras.mixed_precision.set_global_policy(POLICIES[precision])
    return POLICIES[precision]


def memory_bandwidth(n_bytes=1 << 30, repeats=10):
    """Best bytes/s of `x + 1` over a float32 array of n_bytes on the default device (it reads
    and writes n_bytes each): the copy bandwidth the roofline estimates divide bytes by."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((n_bytes // 4,), "float32")
    add = jax.jit(lambda v: v + 1)
    add(x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        add(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * (n_bytes // 4) * 4 / best


def executed_flops(side, config, batch, seq, predictions):
    """bench/flops.py's count of what each side's step executes: Cloze's last layer computes
    only [CLS] and the P masked positions (bert.BertEncoder's output_positions), keras-hub's all
    S. Equal to the FLOPs of the dots in the compiled step (tested)."""
    queries = 1 + predictions if side == "cloze" else None
    return bert_pretraining_flops(config, batch, seq, predictions, last_layer_queries=queries)


def inventory_row(hlo_text, side, config, batch, seq, predictions, peak, bandwidth, seconds=None):
    """kernel_inventory of a compiled step (its ten largest dot shapes) with the analytic FLOPs
    beside it and, where the step was timed (`seconds`), the time over the roofline estimate."""
    row = {
        "analytic_flops": executed_flops(side, config, batch, seq, predictions),
        **kernel_inventory(hlo_text, peak, bandwidth, top_dots=10),
    }
    if seconds:
        row["step_seconds"] = seconds
        row["step_over_roofline"] = seconds / row["roofline_s"]
    return row


def build_weights(model, batch):
    """Creates a model's weights: Cloze's pretrainer from its config (its build()), keras-hub's
    by one call on `batch`.

    Why not a call for Cloze's too: under JAX an eager call dispatches, and compiles, every op
    on its own. Building the tiny test model that way took 15-16 s on this CPU, a call of
    keras-hub's tiny model 4-6 s.
    """
    if isinstance(model, bert.BertPretrainer):
        model.build()
    else:
        model(batch)


def train_state(model, batch):
    """(AdamW, its step's state: trainable, non-trainable and optimizer values) for a model whose
    weights build_weights creates from `batch`. A model built under mixed_float16 gets AdamW in
    Keras' LossScaleOptimizer (dynamic loss scaling at Keras' defaults), as model.compile gives
    it: float16 gradients underflow without one."""
    build_weights(model, batch)
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01)
    if model.dtype_policy.name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )
    return optimizer, state


def state_index(optimizer, variable) -> int:
    """Where `variable` (one of the optimizer's) sits in its stateless state, the values of
    optimizer.variables in order."""
    return [id(v) for v in optimizer.variables].index(id(variable))


def applied_updates(optimizer, opt_vars):
    """How many updates the optimizer state `opt_vars` has applied: the inner optimizer's
    iteration count, which a LossScaleOptimizer leaves as it was on a step it skips (a
    non-finite gradient), while its own step counter moves on."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return int(opt_vars[state_index(optimizer, inner.iterations)])


def time_model(model, batch, steps, repeats, profile_dir, profile_steps):
    """Builds the state, compiles, then returns the best seconds per step over `repeats` windows
    of `steps` steps, the last loss (a finite loss shows the step really trained), the timed
    steps fp16's loss scaling skipped (None without loss scaling), and with `profile_dir` the
    summary of `profile_steps` more steps traced there (else None)."""
    import jax

    optimizer, state = train_state(model, batch)
    batch = {k: jax.device_put(v) for k, v in batch.items()}
    step = jax_train_step(model, optimizer)
    for _ in range(3):  # compile + warm up
        state, loss = step(state, batch)
    loss.block_until_ready()
    scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    applied = applied_updates(optimizer, state[2]) if scaling else None
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            state, loss = step(state, batch)
        loss.block_until_ready()
        best = min(best, (time.perf_counter() - t) / steps)
    skipped = None
    if scaling:
        skipped = repeats * steps - (applied_updates(optimizer, state[2]) - applied)
    profile = None
    if profile_dir:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        hlo = step.lower(state, batch).compile().as_text()
        (Path(profile_dir) / "compiled_step.hlo.txt").write_text(hlo)
        with jax.profiler.trace(str(profile_dir), create_perfetto_trace=True):
            for _ in range(profile_steps):
                state, loss = step(state, batch)
            loss.block_until_ready()
        profile = summarize_perfetto_trace(str(profile_dir), profile_steps)
    return best, float(loss), skipped, profile


def time_worker(peer, steps, repeats):
    """As time_model for a WorkerPeer side (the batch it was built with): 3 warm-up steps, then
    the best seconds per step over `repeats` calls of `steps` steps (each call returns once its
    steps are done, the GPU's included), the last loss, and the timed steps fp16's scaler
    skipped (any other skipped step is refused)."""
    peer.train_steps(None, 3)
    best, skipped = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        rows = peer.train_steps(None, steps)
        best = min(best, (time.perf_counter() - t) / steps)
        skipped += overflow_steps(peer.kind, rows, WorkerPeer.COLUMNS)
    return best, float(rows[-1, 0]), skipped


def run(
    sizes, precision, steps, repeats, peak_n, output_file=None, profile_dir=None, profile_steps=3,
    extra_peers=(), peer_python=None,
):  # fmt: skip
    import jax
    import keras_hub

    unknown = sorted(set(extra_peers) - {"hf_torch"})
    if unknown:  # Model Garden needs TensorFlow, which the GPU machines lack
        raise ValueError(f"extra peers {unknown}: only 'hf_torch' runs here")

    peak = matmul_peak(COMPUTE_DTYPES[precision], n=peak_n)
    device = jax.devices()[0]
    result = {
        # The kind names the card ("NVIDIA H200"); str(device) alone said "cuda:0".
        "device": f"{device.device_kind} ({device})",
        "versions": {
            "jax": jax.__version__,
            "keras": keras.__version__,
            "keras_hub": keras_hub.__version__,
        },
        "backend": keras.backend.backend(),
        "precision": precision,
        "matmul_peak_flops": peak,
        "matmul_peak_dtype": COMPUTE_DTYPES[precision],
        "date": time.strftime("%Y-%m-%d"),
        "rows": [],
    }
    print(f"matmul peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    if profile_dir:
        result["memory_bytes_per_s"] = memory_bandwidth(1 << (20 if peak_n < 1024 else 30))
        print(f"copy bandwidth {result['memory_bytes_per_s'] / 1e9:.0f} GB/s", flush=True)
    for name, layers, hidden, heads, inter, batch, seq, preds in sizes:
        policy = set_precision(precision)
        models = build_models(layers, hidden, heads, inter, seq)
        data = make_batch(batch, seq, preds)
        config = size_config(layers, hidden, heads, inter, seq)
        flops = bert_pretraining_flops(config, batch, seq, preds)
        row = {"size": name, "batch": batch, "seq": seq, "predictions": preds, "policy": policy}
        for side, model in models.items():
            t0 = time.perf_counter()
            where = Path(profile_dir) / f"{name}_b{batch}_{side}" if profile_dir else None
            seconds, loss, skipped, profile = time_model(
                model, data, steps, repeats, where, profile_steps
            )
            skips = "" if skipped is None else f", {skipped} timed steps skipped"
            print(
                f"{name} b{batch} s{seq} {side}: {seconds * 1e3:.2f} ms/step "
                f"({time.perf_counter() - t0:.0f} s with compile{skips})",
                flush=True,
            )
            row[side] = {
                "dtype_policy": model.dtype_policy.name,
                "step_seconds": seconds,
                "tokens_per_second": batch * seq / seconds,
                "mfu": flops / seconds / peak,
                "final_loss": loss,
            }
            if skipped is not None:  # named as the PyTorch side's
                row[side]["overflow_steps"] = skipped
            if profile is not None:
                row[side]["profile"] = profile
                hlo = (where / "compiled_step.hlo.txt").read_text()
                row[side]["hlo"] = inventory_row(
                    hlo, side, config, batch, seq, preds, peak,
                    result["memory_bytes_per_s"], seconds,
                )  # fmt: skip
            save(output_file, result, row)
        row["ratio_cloze_over_keras_hub"] = (
            row["cloze"]["tokens_per_second"] / row["keras_hub"]["tokens_per_second"]
        )
        for kind in extra_peers:
            t0 = time.perf_counter()
            # Where JAX runs on the GPU the worker's PyTorch does too; else on the CPU.
            on = "cuda" if jax.default_backend() == "gpu" else None
            peer = WorkerPeer(kind, config, data, precision, python=peer_python, device=on)
            try:
                seconds, loss, skipped = time_worker(peer, steps, repeats)
            finally:
                peer.close()
            print(
                f"{name} b{batch} s{seq} {kind}: {seconds * 1e3:.2f} ms/step "
                f"({time.perf_counter() - t0:.0f} s with start-up)",
                flush=True,
            )
            row[kind] = {
                "device": on or "cpu",
                "step_seconds": seconds,
                "tokens_per_second": batch * seq / seconds,
                "mfu": flops / seconds / peak,
                "final_loss": loss,
                "overflow_steps": skipped,
                "params": peer.params,
            }
            result["versions"][kind] = peer.versions
            row[f"ratio_cloze_over_{kind}"] = (
                row["cloze"]["tokens_per_second"] / row[kind]["tokens_per_second"]
            )
            save(output_file, result, row)
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        save(output_file, result)
        keras.backend.clear_session()
    return result


def save(output_file, result, row=None):
    """Writes `result` to `output_file` (if one is named), with `row`, the size being measured,
    as its last row so far: run() saves after every side and every size, so a command cut by
    its time limit keeps every side it timed (the fifty-first session's lease lost a row whose
    keras-hub side outran the limit, with Cloze's side timed)."""
    if output_file:
        rows = result["rows"] + ([row] if row is not None else [])
        Path(output_file).write_text(json.dumps({**result, "rows": rows}, indent=1) + "\n")


def measured_rows(path) -> dict:
    """The rows of a results file of timed runs, by (size, batch, policy): a row's own "policy",
    else the file's --precision. So a compiled step is compared only with a timed step of the
    same precision (rows 2-5 of the 2026-11-22 file ran in float32, set_precision)."""
    earlier = json.loads(Path(path).read_text())
    default = POLICIES.get(earlier.get("precision"))
    return {(r["size"], r["batch"], r.get("policy", default)): r for r in earlier["rows"]}


def aot_line(label, r, compile_seconds) -> str:
    """The line aot_run prints for one side's compiled step (an inventory_row with temp_bytes)."""
    line = (
        f"{label}: {r['kernels']} kernels, {r['flops'] / 1e12:.2f} TFLOP (analytic "
        f"{r['analytic_flops'] / 1e12:.2f}), {r['bytes'] / 1e9:.1f} GB, roofline "
        f"{r['roofline_s'] * 1e3:.1f} ms, temp {r['temp_bytes'] / 1e9:.2f} GB"
    )
    if "step_seconds" in r:
        line += f", measured {r['step_seconds'] * 1e3:.1f} ms = {r['step_over_roofline']:.2f}x"
    return line + f" ({compile_seconds:.0f} s to compile)"


def compile_for(model, batch, sharding):
    """Cloze's or keras-hub's train step compiled for the device of `sharding` from shapes
    alone: the arguments are jax.ShapeDtypeStructs placed there, so the device need not exist
    (XLA's deviceless compilation). The weights are built on the default device (build_weights,
    keras-hub's from two rows)."""
    import jax

    optimizer, state = train_state(model, {k: v[:2] for k, v in batch.items()})

    def placed(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    step = jax_train_step(model, optimizer)
    return step.lower(jax.tree.map(placed, state), jax.tree.map(placed, batch)).compile()


def aot_run(sizes, precision, target_config, peak, output_file=None, hlo_dir=None, compare=None):
    """Both sides compiled for the GPU `target_config` describes, without it (module docstring):
    per size and side the kernel inventory, the analytic FLOPs, the temporary memory and, for
    sizes and batches in the results file `compare`, the measured step time over the roofline."""
    import re

    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    text = Path(target_config).read_text()
    found = re.search(r"memory_bandwidth:\s*([0-9.eE+]+)", text)
    if not found:
        raise ValueError(f"{target_config}: expected a memory_bandwidth field, found none")
    bandwidth = float(found.group(1))
    description = re.search(r'device_description_str:\s*"([^"]*)"', text)
    topology = topologies.get_topology_desc(platform="cuda", target_config=text, topology="1x1x1")
    sharding = NamedSharding(topologies.make_mesh(topology, (1,), ("device",)), PartitionSpec())
    measured = measured_rows(compare) if compare else {}
    result = {
        "target_config": str(target_config),
        "device": description.group(1) if description else None,
        "compiled": "deviceless (no autotuning)",
        "backend": keras.backend.backend(),
        "precision": precision,
        "peak_flops": peak,
        "memory_bytes_per_s": bandwidth,
        "compare_with": str(compare) if compare else None,
        "date": time.strftime("%Y-%m-%d"),
        "rows": [],
    }
    for name, layers, hidden, heads, inter, batch, seq, preds in sizes:
        policy = set_precision(precision)
        models = build_models(layers, hidden, heads, inter, seq)
        data = make_batch(batch, seq, preds)
        config = size_config(layers, hidden, heads, inter, seq)
        row = {"size": name, "batch": batch, "seq": seq, "predictions": preds, "policy": policy}
        for side, model in models.items():
            t0 = time.perf_counter()
            compiled = compile_for(model, data, sharding)
            hlo = compiled.as_text()
            if hlo_dir:
                Path(hlo_dir).mkdir(parents=True, exist_ok=True)
                (Path(hlo_dir) / f"{name}_b{batch}_{side}.hlo.txt").write_text(hlo)
            seconds = measured.get((name, batch, policy), {}).get(side, {}).get("step_seconds")
            r = inventory_row(hlo, side, config, batch, seq, preds, peak, bandwidth, seconds)
            r["temp_bytes"] = compiled.memory_analysis().temp_size_in_bytes
            r["dtype_policy"] = model.dtype_policy.name
            row[side] = r
            print(aot_line(f"{name} b{batch} {side}", r, time.perf_counter() - t0), flush=True)
        result["rows"].append(row)
        if output_file:
            Path(output_file).write_text(json.dumps(result, indent=1) + "\n")
        keras.backend.clear_session()
    return result


def build_parser():
    """The command line's flags (bench/gpu_lease.sh's commands are checked against them)."""
    import argparse

    # argparse, not absl: this file must run where only JAX and Keras are installed.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_file", default=None)
    parser.add_argument("--precision", choices=sorted(POLICIES), default="bf16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="", help="comma list of size names (default all)")
    parser.add_argument("--batch", type=int, default=0, help="override every size's batch")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--profile_dir", default=None, help="trace each side here (docstring)")
    parser.add_argument("--profile_steps", type=int, default=3)
    parser.add_argument(
        "--extra_peers", default="", help="hf_torch: PyTorch's BertForPreTraining too (docstring)"
    )
    parser.add_argument(
        "--peer_python", default=None, help="the interpreter with the peer's libraries"
    )
    parser.add_argument(
        "--aot_target_config", default=None,
        help="compile for this GPU without it and report the kernels (docstring); times nothing",
    )  # fmt: skip
    parser.add_argument(
        "--aot_peak_tflops", type=float, default=660.0,
        help="the roofline's matmul peak with --aot_target_config (default: the H100's bf16 "
        "peak measured on 2026-11-22, bench/results/gpu_mfu_h100_2026-11-22.json)",
    )  # fmt: skip
    parser.add_argument("--hlo_dir", default=None, help="with --aot_target_config: keep the HLO")
    parser.add_argument(
        "--compare_with", default=None,
        help="with --aot_target_config: a results file measured on that GPU (step times)",
    )  # fmt: skip
    return parser


def selected_sizes(args) -> list:
    """The rows the parsed flags ask for: --tiny's or the default sizes, those --sizes names,
    one row per size at --batch where it is given."""
    sizes = TINY_SIZES if args.tiny else SIZES
    known = list(dict.fromkeys(s[0] for s in sizes))
    names = [n for n in (args.sizes or "").split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:  # else a misspelt name times nothing
        raise ValueError(f"--sizes: unknown {unknown}; expected names from {known}")
    sizes = [s for s in sizes if not names or s[0] in names]
    if args.batch:  # one row per size at this batch
        sizes = list(dict.fromkeys((*s[:5], args.batch, *s[6:]) for s in sizes))
    return sizes


def main():
    parser = build_parser()
    args = parser.parse_args()
    sizes = selected_sizes(args)
    peak_n = 256 if args.tiny else 8192
    if args.profile_steps < 1:
        parser.error(f"--profile_steps: expected an int >= 1, found {args.profile_steps}")
    if args.aot_target_config:
        # Without CUDA's runtime libraries the plugin refuses to start unless told to skip its
        # version check; deviceless compilation uses none of them.
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
        result = aot_run(
            sizes, args.precision, args.aot_target_config, args.aot_peak_tflops * 1e12,
            args.output_file, args.hlo_dir, args.compare_with,
        )  # fmt: skip
        print(json.dumps(result, indent=1))
        return
    extra_peers = [p for p in args.extra_peers.split(",") if p]
    if extra_peers:  # leave the worker's PyTorch room on the GPU (docstring)
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    result = run(
        sizes, args.precision, args.steps, args.repeats, peak_n, args.output_file,
        args.profile_dir, args.profile_steps, extra_peers, args.peer_python,
    )  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
