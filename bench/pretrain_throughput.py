"""Pretraining step throughput: Cloze's MLM + NSP train step against keras-hub's BERT, same work.

Both models run through the one train step run_pretraining.py uses (training/trainer.py's Trainer
with training/tasks.py's bert_pretraining_task: forward, loss, backward, global-norm clipping,
AdamW from training/optimization.py, all steps in one tf.function), so only the network differs:

  cloze      modeling/bert.BertPretrainer (encoder + MLM head at the masked positions + NSP head)
  keras_hub  keras_hub.models.BertBackbone + the MaskedLMHead of a keras_hub BertMaskedLM built on
             it (it, too, projects only the masked positions, through the tied table) + a Dense(2)
             NSP head on the backbone's pooled output, which BertMaskedLM lacks.
Optional peers (extra_peers), not through the Trainer but each trained as its users train it, in
a bench/peer_worker.py process of its own, from the same config and batch:
  hf_torch      Hugging Face transformers' BertForPreTraining under PyTorch, eager
                (bench/torch_peer.py); it projects every position to the vocabulary, so its
                `hfu` counts that head at all S positions. bench/requirements-torch.txt.
  model_garden  TF Model Garden's BertPretrainerV2 under tf_keras (bench/model_garden_peer.py;
                it holds one unused pooler more than the others).
                bench/requirements-model-garden.txt.

Same sizes, dropout 0.1, batch, sequence length, predictions, precision and input batch (a fixed
synthetic batch: throughput does not depend on the token values). Timed rounds alternate
between the sides (Cloze's and keras-hub's in one process, the optional peers' in their
workers); the best round of each is reported (the machine is shared).

MFU = bench/flops.bert_pretraining_flops per step / step time / the dense fp32 matmul peak
(bench/flops.matmul_peak_flops). On a shared machine the peak swings with the load as much as the
steps do (14-72 GFLOP/s in one loaded run, about 200 idle), so one peak measured at the start
does not describe the rounds. The peak is therefore measured again right before every round
(`round_peak`), and each side gets two figures: `mfu`, its best round's FLOP/s over the best
peak of the whole run (both best-of: what each reaches when the machine lets it), and
`mfu_rounds`, every round's FLOP/s over the peak measured just before it (same load, so the
per-round ratio is meaningful even when the absolute figures are not). `hfu` is `mfu` with the
FLOPs each side executes as numerator: Cloze's last layer skips the positions no loss reads
(bench/flops.bert_pretraining_flops' last_layer_queries), so its `mfu` credits it with work it
did not do and its `hfu` does not.

Under --precision=bf16 or fp16 the fp32 peak stays the issue's yardstick (an MFU above 100% then
means the low-precision products ran faster than fp32 ones can), and the peak of the products in
the compute dtype is measured once as well (`precision_peak`: the same square products in
bfloat16 or float16); each side's `mfu_precision` and `hfu_precision` divide by that one, which
says how close each side runs to what the hardware does in the precision it computes in. fp16
trains every side with its library's dynamic loss scaling (Keras' LossScaleOptimizer through the
Trainer, PyTorch's GradScaler, tf_keras' for Model Garden); the steps a scaler skipped on an
overflow (its scale halved) are counted per side as `overflow_steps`.

oneDNN: TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX-512 VNNI /
BF16 or AMX; on others (the 2-core AVX2 hosts of sessions 1-10 here) they are off unless the
environment says TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow loads (TF_ENABLE_ONEDNN_OPTS=0 turns
them off on the AVX-512 hosts; results.json's machine.cpu_flags says which host ran). They
change the matmul speeds a lot (the peak, and keras-hub's rows-first vocabulary projection and
per-head einsums most: see modeling/heads.tied_logits), so the result records `onednn` and
bench/HISTORY.md gives the figures both ways:

  python bench/run_all.py --benchmarks=pretrain --output_dir=/tmp/bench \
    --default_run_dir=default_run
  TF_ENABLE_ONEDNN_OPTS=1 python bench/run_all.py --benchmarks=pretrain ...
"""

from __future__ import annotations

import re
import time

import numpy as np

from training.precision import COMPUTE_DTYPES

# The matmul peak measured before every round: one 2048-square product, best of 3 (17 GFLOP each:
# about 0.1 s on an idle core pair), short enough to sit beside every round.
ROUND_PEAK = {"sizes": (2048,), "repeats": 3}

# The two sizes: BERT-mini-like and BERT-base.
DEFAULT_SIZES = ("L4/H256/A4/I1024", "L12/H768/A12/I3072")
SIZE_RE = re.compile(r"^L(\d+)/H(\d+)/A(\d+)/I(\d+)$")


def parse_size(spec: str, vocab_size: int = 30522, max_seq_length: int = 512):
    """'L4/H256/A4/I1024' -> a modeling.bert.BertConfig (layers, hidden, heads, intermediate)."""
    from modeling import bert

    m = SIZE_RE.match(spec)
    if not m:
        raise ValueError(f"size {spec!r}: expected L<layers>/H<hidden>/A<heads>/I<intermediate>")
    n_layers, h, a, i = (int(x) for x in m.groups())
    return bert.BertConfig(
        vocab_size=vocab_size,
        hidden_size=h,
        num_hidden_layers=n_layers,
        num_attention_heads=a,
        intermediate_size=i,
        max_position_embeddings=max(max_seq_length, 512),
        type_vocab_size=2,
    )


def full_encoder_inputs(rng, batch: int, seq: int, vocab_size: int) -> dict:
    """input_ids (random, from `rng`), input_mask and segment_ids of a batch whose every position
    is real, segment B the second half: int32 (batch, seq)."""
    segment = np.zeros((batch, seq), np.int32)
    segment[:, seq // 2 :] = 1
    return {
        "input_ids": rng.integers(5, vocab_size, (batch, seq)).astype(np.int32),
        "input_mask": np.ones((batch, seq), np.int32),
        "segment_ids": segment,
    }


def synthetic_batch(batch: int, seq: int, predictions: int, vocab_size: int, seed: int = 0):
    """A pretraining batch with the TFRecord feature names: every position real, segment B the
    second half, `predictions` distinct masked positions per row (never [CLS] at 0)."""
    rng = np.random.default_rng(seed)
    if predictions > seq - 1:
        raise ValueError(f"{predictions} predictions do not fit a sequence of {seq}")
    positions = np.sort(
        np.stack([rng.choice(np.arange(1, seq), predictions, replace=False) for _ in range(batch)]),
        axis=1,
    )
    return {
        **full_encoder_inputs(rng, batch, seq, vocab_size),
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": rng.integers(5, vocab_size, (batch, predictions)).astype(np.int32),
        "masked_lm_weights": np.ones((batch, predictions), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (batch, 1)).astype(np.int32),
    }


class ModelHolder:
    """A plain holder, not a Keras layer, of a keras.Model `model` (set by the subclass, whose
    __call__ feeds it), with what the Trainer and a task read of a model."""

    @property
    def trainable_variables(self):
        return self.model.trainable_variables

    @property
    def non_trainable_variables(self):
        return self.model.non_trainable_variables

    def count_params(self) -> int:
        return self.model.count_params()


class KerasHubPretrainer(ModelHolder):
    """keras-hub's BERT with BertPretrainer's inputs and outputs (see the module docstring).

    `model` is a functional keras.Model over keras-hub layers, and calling this object feeds it
    the four inputs it takes out of a whole pretraining batch.
    """

    sentence_objective = "nsp"
    span_boundary = False

    def __init__(self, config):
        import keras
        import keras_hub

        from modeling import checkpoints

        backbone = checkpoints.keras_hub_backbone(config)
        masked_lm = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
        nsp = keras.layers.Dense(
            2,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=config.initializer_range),
            name="next_sentence",
        )
        self.input_names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
        inputs = {n: keras.Input((None,), dtype="int32", name=n) for n in self.input_names}
        out = backbone(
            {
                "token_ids": inputs["input_ids"],
                "segment_ids": inputs["segment_ids"],
                "padding_mask": inputs["input_mask"],
            }
        )
        outputs = {
            "mlm_logits": masked_lm.masked_lm_head(
                out["sequence_output"], inputs["masked_lm_positions"]
            ),
            "nsp_logits": nsp(out["pooled_output"]),
        }
        self.model = keras.Model(inputs, outputs, name="keras_hub_pretrainer")

    def __call__(self, batch, training=False):
        return self.model({k: batch[k] for k in self.input_names}, training=training)


# The optional peers, each run by bench/peer_worker.py in a process of its own: the environment
# its worker needs, how the table names it, and the file in bench/ that pins its libraries.
WORKER_PEERS = {
    "hf_torch": {"env": {}, "name": "Hugging Face PyTorch BertForPreTraining (eager; MLM head "
                 "at every position)", "short": "PyTorch",
                 "requirements": "requirements-torch.txt"},
    "model_garden": {"env": {"TF_USE_LEGACY_KERAS": "1"}, "name": "TF Model Garden "
                     "BertPretrainerV2 (tf_keras)", "short": "Model Garden",
                     "requirements": "requirements-model-garden.txt"},
}  # fmt: skip


def checked_peers(extra_peers) -> tuple:
    """`extra_peers` as a tuple; raises ValueError naming those not in WORKER_PEERS, so that a
    benchmark refuses them before it runs anything."""
    unknown = sorted(set(extra_peers) - set(WORKER_PEERS))
    if unknown:
        raise ValueError(f"unknown extra peers {unknown}; expected some of {sorted(WORKER_PEERS)}")
    return tuple(extra_peers)


class Worker:
    """A bench/peer_worker.py process running side `kind` of WORKER_PEERS (its docstring says
    why a process of its own and what it answers), built by the request `build`. `python`: the
    interpreter that has the side's libraries (bench/requirements-torch.txt,
    bench/requirements-model-garden.txt), this one by default. close() ends the worker."""

    def __init__(self, kind: str, build: dict, python=None):
        import os
        import subprocess
        import sys
        from pathlib import Path

        self.kind = self.checked(kind)
        self.python = python or sys.executable
        self._proc = subprocess.Popen(
            [self.python, "-m", "bench.peer_worker", kind],
            cwd=Path(__file__).resolve().parents[1],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **WORKER_PEERS[kind]["env"]},
        )
        reply = self.ask(build)
        self.params, self.versions, self.threads = (
            reply["params"],
            reply["versions"],
            reply["threads"],
        )

    @staticmethod
    def checked(kind: str) -> str:
        if kind not in WORKER_PEERS:
            raise ValueError(f"peer {kind!r}: expected one of {sorted(WORKER_PEERS)}")
        return kind

    def ask(self, request: dict) -> dict:
        """Sends `request` and returns the worker's reply; raises naming the worker when it
        replies an error (with the requirements file when a module is missing) or exits."""
        import json

        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            code = self._proc.wait()
            raise RuntimeError(
                f"the {self.kind} peer's worker ({self.python} -m bench.peer_worker {self.kind}) "
                f"exited with code {code} before answering {request['op']!r}; its stderr is above"
            )
        reply = json.loads(line)
        if "error" in reply:
            self._proc.wait()
            hint = (
                f" (see bench/{WORKER_PEERS[self.kind]['requirements']}, or name an interpreter "
                "that has them with --peer_python)"
                if "ModuleNotFoundError" in reply["error"]
                else ""
            )
            raise RuntimeError(f"the {self.kind} peer ({self.python}): {reply['error']}{hint}")
        return reply

    def count_params(self) -> int:
        return int(self.params)

    def peak_rss(self) -> int | None:
        """The worker process' peak resident memory so far, in bytes (bench/host.py)."""
        from bench import host

        return host.peak_rss_bytes(self._proc.pid)

    def close(self):
        import subprocess

        if self._proc.poll() is None:
            try:
                self._proc.stdin.write('{"op": "exit"}\n')
                self._proc.stdin.close()
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):  # a broken pipe, or no exit in time
                self._proc.kill()
                self._proc.wait()


class WorkerPeer(Worker):
    """A training side in a worker (Worker), with the two things time_trainers and run() use of
    a Trainer: train_steps and count_params. The worker holds the data, so train_steps takes a
    name of it (None: the batch it was built with) where a Trainer takes an iterator. `device`:
    "cuda" trains hf_torch's side on the GPU (bench/gpu_mfu.py), None on the CPU."""

    # train_steps' columns; the last two are the Trainer's last two (trainer.EXTRA_COLUMNS).
    COLUMNS = ("loss", "overflow", "applied")

    def __init__(
        self,
        kind: str,
        config,
        batch: dict,
        precision: str,
        seed: int = 12345,
        python=None,
        head: str | None = None,
        device: str | None = None,
    ):
        import os

        from modeling import checkpoints

        self.checked(kind)  # before anything is sent
        build = {
            "op": "build",
            # The same model as Cloze's: its config as the config.json its converter writes.
            "config": checkpoints.bert_config_to_hf_config(config, heads=True),
            "batch": {k: np.asarray(v).tolist() for k, v in batch.items()},
            "precision": precision,
            "seed": seed,
            "threads": len(os.sched_getaffinity(0)),  # TensorFlow's pools use every core
            **({"head": head} if head else {}),  # "classifier": the fine-tuning side
            **({"device": device} if device else {}),
        }
        super().__init__(kind, build, python)

    def train_steps(self, iterator, steps: int):
        """`steps` train steps in the worker; rows of (loss, overflow, applied), the last two as
        the Trainer's last two columns: 1.0 where fp16's loss scale overflowed, and 1.0 where
        the update was applied (the loss finite, no overflow). `iterator`: None for the batch the
        worker was built with, or the name of batches load() sent (the worker holds the data)."""
        request = {"op": "train", "steps": int(steps)}
        if iterator is not None:
            request["data"] = str(iterator)
        reply = self.ask(request)
        losses = np.asarray(reply["losses"], float)
        overflow = np.asarray(reply["overflow"], bool)
        applied = np.isfinite(losses) & ~overflow
        return np.stack([losses, overflow, applied], axis=1).astype(float)

    def load(self, name: str, batches: list, vocab, pad_to_multiple_of: int) -> list:
        """Sends an epoch's batches (lists of unpadded examples: input_ids, token_type_ids,
        labels) for train_steps(name, ...); `vocab`: the tokenizer's vocabulary file, whose
        padding the worker's collator applies, to each batch's longest example rounded up to
        `pad_to_multiple_of`. Returns the lengths the worker pads them to."""
        request = {
            "op": "load",
            "name": name,
            "batches": batches,
            "vocab": str(vocab),
            "pad_to_multiple_of": int(pad_to_multiple_of),
        }
        return self.ask(request)["lengths"]


def params_of(side) -> int:
    """A side's parameter count: a Trainer's model's, or a WorkerPeer's."""
    model = getattr(getattr(side, "task", None), "model", side)
    return int(model.count_params())


def _trainer(strategy, model, precision: str, use_xla: bool, parallel_micro_batches: int = 1):
    from training import optimization, tasks, trainer

    # run_pretraining.build_model's optimizer (AdamW, BERT's settings; under fp16 in Keras'
    # LossScaleOptimizer, the Trainer's dynamic loss scaling), built before the first step.
    optimizer = optimization.create_optimizer(1e-4, 10_000, 0)
    optimizer = optimization.with_loss_scaling(optimizer, precision)
    optimizer.build(model.trainable_variables)
    task = tasks.bert_pretraining_task(model)
    return trainer.Trainer(
        strategy, task, optimizer, use_xla=use_xla, parallel_micro_batches=parallel_micro_batches
    )


def build_trainers(
    config,
    precision: str,
    use_xla: bool,
    seed: int = 12345,
    parallel_micro_batches: int = 1,
    encoder_branches: int | None = 1,
    xla_weight_gradients: bool = False,
    rows: int = 8,
) -> dict:
    """{"cloze": Trainer, "keras_hub": Trainer} of `config`, built seeded under `precision`,
    both with the same Trainer settings (use_xla, parallel_micro_batches). Cloze's options,
    which keras-hub's backbone has no counterpart of: `encoder_branches`, its encoder's layers
    in that many row slices (bert.run_layer_stack; None: run_pretraining's default for this
    step, bert.auto_encoder_branches with `rows` rows a batch), and `xla_weight_gradients`,
    its dense layers' kernel gradients as XLA dots (layers.set_xla_weight_gradients). With
    either, a third trainer, "cloze_plain", is Cloze without them (same weights), so one run
    measures the options' own gain with the host's load alike for all three."""
    import keras

    from modeling import bert, layers
    from training import distribute, optimization

    # run_pretraining's default --distribution_strategy=one_device (first GPU, else the CPU).
    strategy = distribute.get_strategy("one_device")
    with optimization.dtype_policy(precision), strategy.scope():
        keras.utils.set_random_seed(seed)
        cloze = bert.BertPretrainer(config, "nsp")
        cloze.build()
        if encoder_branches is None:
            encoder_branches, _ = bert.auto_encoder_branches(
                cloze,
                strategy.extended.worker_devices,
                precision,
                use_xla,
                False,
                parallel_micro_batches,
                rows // parallel_micro_batches,
            )
        bert.set_encoder_branches(cloze, encoder_branches)
        if xla_weight_gradients:
            layers.set_xla_weight_gradients(cloze)
        keras.utils.set_random_seed(seed)
        hub = KerasHubPretrainer(config)
        trainers = {
            "cloze": _trainer(strategy, cloze, precision, use_xla, parallel_micro_batches),
            "keras_hub": _trainer(strategy, hub, precision, use_xla, parallel_micro_batches),
        }
        if encoder_branches > 1 or xla_weight_gradients:
            keras.utils.set_random_seed(seed)
            plain = bert.BertPretrainer(config, "nsp")
            plain.build()
            trainers["cloze_plain"] = _trainer(
                strategy, plain, precision, use_xla, parallel_micro_batches
            )
        return trainers


def overflow_steps(name: str, rows, columns=None) -> int:
    """How many of a timed call's steps fp16's loss scaling skipped on an overflow (the scale
    halved: every side's scaler does this, a few times until its scale fits the gradients).
    `rows`: a Trainer's train_steps rows, or a WorkerPeer's in the same last two columns
    (overflow, applied); `columns`: the names of the rows' last columns (default the Trainer's
    EXTRA_COLUMNS; WorkerPeer.COLUMNS where TensorFlow is not installed, bench/gpu_mfu.py).
    Raises when a step was skipped for any other reason (a non-finite loss or gradient): the
    benchmark would time steps that did not train."""
    if columns is None:
        from training import trainer

        columns = trainer.EXTRA_COLUMNS
    extra = list(columns)
    overflow = rows[:, extra.index("overflow") - len(extra)] > 0.5
    applied = rows[:, extra.index("applied") - len(extra)] > 0.5
    if not np.all(applied | overflow):
        raise RuntimeError(f"{name}: a non-finite step during the benchmark")
    return int(overflow.sum())


def time_trainers(
    trainers: dict, batch: dict, steps: int, rounds: int, peak_fn=None, log=None
) -> tuple[dict, dict, dict]:
    """Alternates timed rounds of `steps` train steps between the trainers (after one untimed
    warm-up round each, which traces and compiles). With `peak_fn` (a no-argument callable
    returning FLOP/s) the matmul peak is measured right before every side's round.

    Returns ({name: [seconds per step, ...]}, {name: [FLOP/s before each of its rounds]},
    {name: timed steps fp16's loss scaling skipped (overflow_steps)}); the second is empty
    lists without peak_fn.
    """
    import tensorflow as tf

    log = print if log is None else log  # progress lines with an ETA: rounds take minutes
    # A worker peer holds the batch it was built with (None asks for it); a name there would
    # ask for data load() never sent.
    iterators = {
        name: None
        if isinstance(fit, WorkerPeer)
        else iter(tf.data.Dataset.from_tensors(batch).repeat())
        for name, fit in trainers.items()
    }
    for name, fit in trainers.items():
        fit.train_steps(iterators[name], 1)
    times = {name: [] for name in trainers}
    peaks = {name: [] for name in trainers}
    overflows = dict.fromkeys(trainers, 0)
    started = time.perf_counter()
    for r in range(rounds):
        # Swap the order every round so neither side always runs right after the other.
        order = list(trainers) if r % 2 == 0 else list(reversed(trainers))
        for name in order:
            if peak_fn is not None:
                peaks[name].append(float(peak_fn()))
            start = time.perf_counter()
            rows = trainers[name].train_steps(iterators[name], steps)
            times[name].append((time.perf_counter() - start) / steps)
            overflows[name] += overflow_steps(name, rows)
        done = time.perf_counter() - started
        log(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{n} {times[n][-1]:.3f} s/step" for n in trainers)
            + (
                ", peak " + ", ".join(f"{peaks[n][-1] / 1e9:.0f}" for n in trainers) + " GFLOP/s"
                if peak_fn is not None
                else ""
            )
            + f" | {done:.0f} s, ETA {done / (r + 1) * (rounds - r - 1):.0f} s"
        )
    return times, peaks, overflows


def padding_fraction(path: str, max_seq_length: int, max_records: int = 100_000) -> dict:
    """Share of the positions of pretraining records that are padding (input_mask 0), over the
    first `max_records` records of a TFRecord file."""
    import tensorflow as tf

    spec = {"input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64)}
    ds = tf.data.TFRecordDataset(path).take(max_records).batch(1024)
    real = total = records = 0
    for serialized in ds:
        mask = tf.io.parse_example(serialized, spec)["input_mask"].numpy()
        real += int(mask.sum())
        total += mask.size
        records += mask.shape[0]
    if records == 0:
        raise ValueError(f"{path}: no records")
    return {
        "file": str(path),
        "records": records,
        "max_seq_length": max_seq_length,
        "padding_fraction": 1.0 - real / total,
        "mean_real_tokens": real / records,
    }


def run(
    sizes=DEFAULT_SIZES,
    batch: int = 8,
    seq: int = 128,
    predictions: int = 20,
    steps=(10, 2),
    rounds: int = 3,
    precision: str = "fp32",
    use_xla: bool = False,
    peak: dict | None = None,
    vocab_size: int = 30522,
    round_peak: dict | None = None,
    parallel_micro_batches: int = 1,
    encoder_branches: int | None = 1,
    precision_peak: dict | None = None,
    xla_weight_gradients: bool = False,
    extra_peers=(),
    peer_python: str | None = None,
) -> dict:
    """The benchmark: per size, tokens/s, step time and MFU of both, and their ratio.

    `steps`: timed steps per round for each size (one int for all sizes). `peak`: a result of
    bench/flops.matmul_peak_flops, measured here when None. `precision_peak`: the same in the
    precision's compute dtype when that is not float32 (bf16, fp16), measured here when None
    (module docstring); unused in fp32. `round_peak`: keyword arguments of the
    matmul_peak_flops measured before every round (ROUND_PEAK when None; see the module
    docstring). `parallel_micro_batches`: the Trainer option, on both sides alike.
    `encoder_branches`, `xla_weight_gradients`: Cloze's options (build_trainers), on Cloze's
    side only; encoder_branches None is run_pretraining's default, resolved per size (each
    row says the count it ran, `encoder_branches`, and `encoder_branches_default`: true).
    `extra_peers`: names of WORKER_PEERS (hf_torch, model_garden) also timed in the same
    alternating rounds (WorkerPeer; under `peer_python` when given).
    """
    from bench import flops
    from modeling import layers

    steps = [steps] * len(sizes) if isinstance(steps, int) else list(steps)
    if len(steps) != len(sizes):
        raise ValueError(f"{len(steps)} step counts for {len(sizes)} sizes")
    peak = peak or flops.matmul_peak_flops()
    compute_dtype = COMPUTE_DTYPES[precision]
    if compute_dtype == "float32":
        precision_peak = None
    elif precision_peak is None:
        precision_peak = flops.matmul_peak_flops(dtype=compute_dtype)
    elif precision_peak.get("dtype") != compute_dtype:
        raise ValueError(
            f"precision_peak was measured in {precision_peak.get('dtype')}, the {precision} "
            f"step computes in {compute_dtype}"
        )
    round_peak = ROUND_PEAK if round_peak is None else round_peak
    extra_peers = checked_peers(extra_peers)
    results, peer_info = [], {}
    for spec, n in zip(sizes, steps):
        config = parse_size(spec, vocab_size, seq)
        trainers = build_trainers(
            config,
            precision,
            use_xla,
            parallel_micro_batches=parallel_micro_batches,
            encoder_branches=encoder_branches,
            xla_weight_gradients=xla_weight_gradients,
            rows=batch,
        )
        encoder = trainers["cloze"].task.model.encoder
        data = synthetic_batch(batch, seq, predictions, vocab_size)
        try:
            for kind in extra_peers:
                peer = trainers[kind] = WorkerPeer(
                    kind, config, data, precision, python=peer_python
                )
                peer_info[kind] = {
                    "python": peer.python,
                    "versions": peer.versions,
                    "threads": peer.threads,
                }
            times, peaks, overflows = time_trainers(
                trainers,
                data,
                n,
                rounds,
                peak_fn=lambda: flops.matmul_peak_flops(**round_peak)["flops_per_s"],
            )
        finally:
            for side in trainers.values():
                if isinstance(side, WorkerPeer):
                    side.close()
        best_peak = max(peak["flops_per_s"], *(p for ps in peaks.values() for p in ps))
        bert_flops = flops.bert_pretraining_flops(config, batch, seq, predictions)
        # What each side's matmuls really do: Cloze's last layer runs only at [CLS] and the
        # predictions (BertEncoder's output_positions), keras-hub's at every position.
        sparse_last = flops.bert_pretraining_flops(
            config, batch, seq, predictions, last_layer_queries=1 + predictions
        )
        executed = {
            "cloze": sparse_last,
            "cloze_plain": sparse_last,
            "keras_hub": bert_flops,
            # BertForPreTraining's MLM head runs at every position, not at the P predictions.
            "hf_torch": flops.bert_pretraining_flops(config, batch, seq, seq),
            "model_garden": bert_flops,
        }
        row = {
            "size": spec,
            "flops_per_step": bert_flops,
            "steps_per_round": n,
            "encoder_branches": encoder.parallel_branches,
        }
        if encoder_branches is None:
            row["encoder_branches_default"] = True
        for name, t in times.items():
            best = min(t)
            row[name] = {
                "step_s": best,
                "step_s_rounds": t,
                "tokens_per_s": batch * seq / best,
                "model_flops_per_s": bert_flops / best,
                "mfu": bert_flops / best / best_peak,
                "peak_rounds": peaks[name],
                "mfu_rounds": [bert_flops / s / p for s, p in zip(t, peaks[name])],
                "executed_flops_per_step": executed[name],
                "hfu": executed[name] / best / best_peak,
                "params": params_of(trainers[name]),
                "overflow_steps": overflows[name],
            }
            if precision_peak is not None:
                top = precision_peak["flops_per_s"]
                row[name]["mfu_precision"] = bert_flops / best / top
                row[name]["hfu_precision"] = executed[name] / best / top
        row["best_peak_flops_per_s"] = best_peak
        row["ratio"] = row["cloze"]["tokens_per_s"] / row["keras_hub"]["tokens_per_s"]
        # Per round pair (the two sides' r-th rounds ran back to back): a load-robust ratio.
        row["ratio_rounds"] = [
            k / c for c, k in zip(row["cloze"]["step_s_rounds"], row["keras_hub"]["step_s_rounds"])
        ]
        for kind in extra_peers:  # against each worker peer: the same, per round pair too
            row[f"ratio_{kind}"] = row["cloze"]["tokens_per_s"] / row[kind]["tokens_per_s"]
            row[f"ratio_{kind}_rounds"] = [
                h / c for c, h in zip(row["cloze"]["step_s_rounds"], row[kind]["step_s_rounds"])
            ]
        if "cloze_plain" in row:  # Cloze's options' own gain, round by round
            row["options_gain_rounds"] = [
                p / c
                for c, p in zip(row["cloze"]["step_s_rounds"], row["cloze_plain"]["step_s_rounds"])
            ]
            row["options_gain"] = float(np.median(row["options_gain_rounds"]))
        results.append(row)
        del trainers
    return {
        "batch": batch,
        "seq": seq,
        "predictions": predictions,
        "precision": precision,
        "use_xla": use_xla,
        "parallel_micro_batches": parallel_micro_batches,
        "encoder_branches": encoder_branches,
        "xla_weight_gradients": xla_weight_gradients,
        "rounds": rounds,
        "peak": peak,
        "precision_peak": precision_peak,
        "round_peak": round_peak,
        "onednn": layers.onednn_enabled(),
        "sizes": results,
        "extra_peers": peer_info,
    }
