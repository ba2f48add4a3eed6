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

MFU is model FLOPs per second over the bf16 dense matmul peak measured in the same run (the
best of several large square products), so it is a fraction of what this GPU really reaches,
not of a datasheet number. `--tiny` runs tiny sizes for a smoke test on any backend's CPU.

With `--profile_dir=DIR` each side then runs `--profile_steps` more steps under jax.profiler
(Perfetto trace in DIR/<size>_b<batch>_<side>/) and writes its compiled step's HLO there as
compiled_step.hlo.txt; each row gets a "profile" per side: busy ms per step and the top events
of every traced line (bench/step_profile.summarize_perfetto_trace). This is for the large-batch
gap to keras-hub on the H100 (README): which kernels take Cloze's extra time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# The model code must not pull in TensorFlow on this path; choose the backend before keras loads.
os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.flops import bert_pretraining_flops  # noqa: E402
from bench.step_profile import summarize_perfetto_trace  # noqa: E402
from modeling import bert, losses  # noqa: E402

# (name, layers, hidden, heads, intermediate, batch, seq, predictions)
SIZES = [
    ("L4-H256", 4, 256, 4, 1024, 8, 128, 20),
    ("L4-H256", 4, 256, 4, 1024, 256, 128, 20),
    ("L12-H768", 12, 768, 12, 3072, 8, 128, 20),
    ("L12-H768", 12, 768, 12, 3072, 64, 128, 20),
    ("L24-H1024", 24, 1024, 16, 4096, 32, 128, 20),
]
TINY_SIZES = [("L2-H24", 2, 24, 3, 37, 3, 16, 5)]
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
    """One jitted step over explicit state (Keras' stateless API), the usual JAX training form."""
    import jax

    def compute_loss(trainable, non_trainable, batch):
        outputs, non_trainable = model.stateless_call(
            trainable, non_trainable, batch, training=True
        )
        return loss_of(outputs, batch), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    @jax.jit
    def step(state, batch):
        trainable, non_trainable, opt_vars = state
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, batch)
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


def time_model(model, batch, steps, repeats, profile_dir, profile_steps):
    """Builds the state, compiles, then returns the best seconds per step over `repeats` windows
    of `steps` steps, the last loss (a finite loss shows the step really trained), and with
    `profile_dir` the summary of `profile_steps` more steps traced there (else None)."""
    import jax

    model(batch)  # builds the weights
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )
    batch = {k: jax.device_put(v) for k, v in batch.items()}
    step = jax_train_step(model, optimizer)
    for _ in range(3):  # compile + warm up
        state, loss = step(state, batch)
    loss.block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            state, loss = step(state, batch)
        loss.block_until_ready()
        best = min(best, (time.perf_counter() - t) / steps)
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
    return best, float(loss), profile


def run(
    sizes, precision, steps, repeats, peak_n, output_file=None, profile_dir=None, profile_steps=3
):
    import jax

    keras.mixed_precision.set_global_policy(
        {"bf16": "mixed_bfloat16", "fp32": "float32"}[precision]
    )
    peak = matmul_peak("bfloat16" if precision == "bf16" else "float32", n=peak_n)
    result = {
        "device": str(jax.devices()[0]),
        "backend": keras.backend.backend(),
        "precision": precision,
        "matmul_peak_flops": peak,
        "date": time.strftime("%Y-%m-%d"),
        "rows": [],
    }
    print(f"matmul peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    for name, layers, hidden, heads, inter, batch, seq, preds in sizes:
        models = build_models(layers, hidden, heads, inter, seq)
        data = make_batch(batch, seq, preds)
        config = size_config(layers, hidden, heads, inter, seq)
        flops = bert_pretraining_flops(config, batch, seq, preds)
        row = {"size": name, "batch": batch, "seq": seq, "predictions": preds}
        for side, model in models.items():
            t0 = time.perf_counter()
            where = Path(profile_dir) / f"{name}_b{batch}_{side}" if profile_dir else None
            seconds, loss, profile = time_model(model, data, steps, repeats, where, profile_steps)
            print(
                f"{name} b{batch} s{seq} {side}: {seconds * 1e3:.2f} ms/step "
                f"({time.perf_counter() - t0:.0f} s with compile)",
                flush=True,
            )
            row[side] = {
                "step_seconds": seconds,
                "tokens_per_second": batch * seq / seconds,
                "mfu": flops / seconds / peak,
                "final_loss": loss,
            }
            if profile is not None:
                row[side]["profile"] = profile
        row["ratio_cloze_over_keras_hub"] = (
            row["cloze"]["tokens_per_second"] / row["keras_hub"]["tokens_per_second"]
        )
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        if output_file:  # after every size, so a run cut short keeps what it measured
            Path(output_file).write_text(json.dumps(result, indent=1) + "\n")
        keras.backend.clear_session()
    return result


def main():
    import argparse

    # argparse, not absl: this file must run where only JAX and Keras are installed.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_file", default=None)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="", help="comma list of size names (default all)")
    parser.add_argument("--batch", type=int, default=0, help="override every size's batch")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--profile_dir", default=None, help="trace each side here (docstring)")
    parser.add_argument("--profile_steps", type=int, default=3)
    args = parser.parse_args()
    sizes = TINY_SIZES if args.tiny else SIZES
    sizes = [s for s in sizes if not args.sizes or s[0] in args.sizes.split(",")]
    if args.batch:  # one row per size at this batch
        sizes = list(dict.fromkeys((*s[:5], args.batch, *s[6:]) for s in sizes))
    peak_n = 256 if args.tiny else 8192
    if args.profile_steps < 1:
        parser.error(f"--profile_steps: expected an int >= 1, found {args.profile_steps}")
    result = run(
        sizes, args.precision, args.steps, args.repeats, peak_n, args.output_file,
        args.profile_dir, args.profile_steps,
    )  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
