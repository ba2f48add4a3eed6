"""Pre-training objectives at an equal compute budget: BERT (MLM + NSP, static masks),
RoBERTa-style (dynamic masks, no NSP, FULL-SENTENCES), ALBERT (SOP, n-gram masks, factorised
embedding, shared layers) and ELECTRA (a small generator + a discriminator, replaced token
detection) pretrain on the same corpus for the same number of training FLOPs, then each
fine-tunes on rt-polarity with data_prep/rt_polarity.py's machinery (run_recorded, the settings
and seeds of its other arms).

Example (the README's table):
  nice -n 10 python bench/objectives.py --output_dir=default_run/objectives \
    --corpus_dir=default_run/corpus --vocab_file=default_run/vocab.txt \
    --bert_config_file=default_run/bert_config.json --budget_bert_steps=400 \
    --train_batch_size=16 --parallel_arms=2 --seeds=1,2
Cost on 2 cores: a BERT step of 32 x 128 took about 0.25 s on quiet cores (the default run);
steps of 16 x 128 took 3.5-8 s niced at load average 30, and a fine-tuning run (4 epochs of
rt-polarity) 1.5 min quiet, 10-15 min at load 25-30. A budget that leaves the unigram plateau
(held-out masked-LM accuracy about 0.065; the default run passed 0.085 after about 450 steps of
32 x 128 at peak rate 5e-4) needs about --budget_bert_steps=1000 at --train_batch_size=32: some
20 minutes of pretraining for the four arms on quiet cores, plus 4 x seeds fine-tuning runs.

The budget. Every arm gets floor(B / F_arm) steps of --train_batch_size sequences, where
B = --budget_bert_steps x F_bert and F_x is the analytic training FLOPs of one step of arm x
(pretraining_step_flops): 3 x the forward pass's matrix-multiply FLOPs at 2 FLOPs per
multiply-add, counted from the shapes as modeling/flops.py does (its docstring has the
formulas; the backward pass costs two forward passes, Kaplan et al. 2020 sec. 2.1; ELECTRA's
appendix D counts the same way): the encoder, its last layer at [CLS] and the predictions
only, the MLM head, NSP / SOP (not counted for RoBERTa, whose untrained head BertPretrainer
still evaluates), and ELECTRA's generator plus discriminator. Raise the budget with
--budget_bert_steps.

What is held equal: corpus (--corpus_dir/train.txt, or --corpus_documents evenly spaced
documents of it), vocabulary, sequence length, batch size, peak learning rate and schedule
shape, one pretraining seed (--pretrain_seed); the fine-tuning settings and seeds. What differs
is the recipe: each arm's records (and held-out records) come from create_pretraining_data.py
with its flags, so each held-out masked-LM accuracy is measured on that arm's own masks
(ALBERT's n-grams are harder to guess than single tokens; ELECTRA's is its generator's).

Outputs under --output_dir: data/<recipe>/, configs/, pretrain/<arm>/, rt_polarity/ (the SST-2
layout, finetune/<arm>/seed_<n>/), objectives.json and objectives.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository root is not on sys.path by itself
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep import rt_polarity  # noqa: E402
from modeling.flops import encoder_flops, mlm_head_flops, sentence_head_flops  # noqa: E402

ARMS = ("bert", "roberta", "albert", "electra")

# How each arm's records are made (create_pretraining_data.py flags) and read (run_pretraining.py
# flags). ELECTRA masks on the fly like RoBERTa (the original's build_pretraining_dataset writes
# unmasked sequences and masks in the input pipeline), so the two share records.
RECIPES = {
    "static_nsp_token": ["--sentence_objective=nsp", "--masking_scheme=token"],
    "dynamic_full_sentences": [
        "--sentence_objective=none",
        "--full_sentences",
        "--masking=dynamic",
    ],
    "static_sop_ngram": ["--sentence_objective=sop", "--masking_scheme=ngram"],
}
ARM_RECIPE = {
    "bert": "static_nsp_token",
    "roberta": "dynamic_full_sentences",
    "albert": "static_sop_ngram",
    "electra": "dynamic_full_sentences",
}
ARM_FLAGS = {
    "bert": ["--sentence_objective=nsp"],
    "roberta": ["--sentence_objective=none", "--masking=dynamic"],
    "albert": ["--sentence_objective=sop"],
    "electra": ["--masking=dynamic"],
}
ARM_TITLES = {
    "bert": "BERT (MLM + NSP, static masks)",
    "roberta": "RoBERTa-style (dynamic masks, no NSP, FULL-SENTENCES)",
    "albert": "ALBERT (SOP, n-gram masks, E = H/2, all layers shared)",
    "electra": "ELECTRA (generator H/4 + discriminator, RTD weight 50)",
}


# ---------------------------------------------------------------------------------------------
# Configs of the arms and their FLOPs
# ---------------------------------------------------------------------------------------------


def arm_configs(bert_values: dict) -> dict[str, dict]:
    """The model config (original field names) of every arm, derived from one bert_config.json.

    RoBERTa is BERT's config (a data recipe, not an architecture). ALBERT: embedding_size H/2
    and one shared group of one layer (ALBERT sec. 3.1, its tiny and base configs' shape).
    ELECTRA: the discriminator is exactly BERT's encoder (E = H, as ELECTRA-Base) and the
    generator a quarter of its width at full depth (ELECTRA sec. 3.2: 1/4 to 1/2 works best).
    """
    bert_values = dict(bert_values)
    h = bert_values["hidden_size"]
    albert = bert_values | {
        "embedding_size": h // 2,
        "num_hidden_groups": 1,
        "inner_group_num": 1,
        "net_structure_type": 0,
        "gap_size": 0,
        "num_memory_blocks": 0,
        "down_scale_factor": 1,
    }
    electra = bert_values | {
        "embedding_size": h,
        "generator_hidden_size": 0.25,
        "generator_layers": 1.0,
    }
    return {"bert": bert_values, "roberta": bert_values, "albert": albert, "electra": electra}


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """Training FLOPs of one pretraining step, by part (forward FLOPs x 3, the whole batch)."""

    parts: dict

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def pretraining_step_flops(arm: str, config: dict, s: int, p: int, batch: int) -> StepFlops:
    """Analytic training FLOPs of one step of `arm` (module docstring) for a config dict with
    the original field names, sequences of s tokens, p predictions each, `batch` sequences."""
    h, n_layers, inter, v = (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["intermediate_size"],
        config["vocab_size"],
    )
    fwd: dict[str, int] = {}
    q = 1 + p  # a masked-LM encoder's last layer runs at [CLS] and the predictions only
    if arm in ("bert", "roberta"):
        fwd["encoder"] = encoder_flops(s, h, n_layers, inter, q=q)
        fwd["mlm_head"] = mlm_head_flops(p, h, h, v)
    elif arm == "albert":
        e = config["embedding_size"]
        # Shared layers save parameters, not compute: every one of the L layers still runs,
        # each its group's inner_group_num blocks.
        blocks = n_layers * config.get("inner_group_num", 1)
        fwd["encoder"] = encoder_flops(s, h, blocks, inter, e, q=q)
        fwd["mlm_head"] = mlm_head_flops(p, h, e, v)
    elif arm == "electra":
        e = config["embedding_size"]
        h_g = int(round(h * config["generator_hidden_size"]))
        l_g = int(round(n_layers * config["generator_layers"]))
        fwd["generator"] = encoder_flops(s, h_g, l_g, 4 * h_g, e, q=q)
        fwd["generator_head"] = mlm_head_flops(p, h_g, e, v)
        fwd["encoder"] = encoder_flops(s, h, n_layers, inter, e)
        fwd["discriminator_head"] = 2 * s * h * h + 2 * s * h
    else:
        raise ValueError(f"arm: expected one of {ARMS}, found {arm!r}")
    if arm in ("bert", "albert"):  # NSP / SOP: pooler and classifier on [CLS]
        fwd["sentence_head"] = sentence_head_flops(h)
    return StepFlops({k: 3 * batch * f for k, f in fwd.items()})


def budget_steps(flops: dict[str, int], budget: float) -> dict[str, int]:
    """Steps each arm runs within `budget` FLOPs: floor(budget / its FLOPs per step), at least 1."""
    if budget <= 0:
        raise ValueError(f"budget: expected positive FLOPs, found {budget}")
    return {arm: max(1, math.floor(budget / f)) for arm, f in flops.items()}


# ---------------------------------------------------------------------------------------------
# The runs
# ---------------------------------------------------------------------------------------------


def write_corpus_slice(corpus_dir, out_dir, documents: int) -> dict[str, Path]:
    """`documents` evenly spaced documents of corpus_dir/train.txt (blank-line separated; all of
    them when 0) and all of heldout.txt, copied under out_dir, so data creation costs what the
    budget needs while every part of a mixed corpus stays in."""
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in ("train", "heldout"):
        source = corpus_dir / f"{split}.txt"
        if not source.is_file():
            raise FileNotFoundError(f"{source}: no such file (--corpus_dir holds the corpus)")
        text = source.read_text(encoding="utf-8")
        if split == "train" and documents > 0:
            docs = [d.strip("\n") for d in text.split("\n\n") if d.strip()]
            stride = max(1, math.ceil(len(docs) / documents))
            text = "\n\n".join(docs[::stride]) + "\n"
        target = out_dir / f"{split}.txt"
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        paths[split] = target
    return paths


def make_records(out_dir, recipe: str, corpus: dict, vocab_file, settings: dict) -> dict:
    """The recipe's train and held-out TFRecords (create_pretraining_data.py, once)."""
    data = Path(out_dir) / "data" / recipe
    records = {}
    for split, dupe in (("train", settings["dupe_factor"]), ("heldout", 4)):
        record = data / f"{split}.tfrecord"
        args = [
            "data_prep/create_pretraining_data.py",
            f"--input_file={corpus[split]}",
            f"--output_file={record}",
            f"--vocab_file={vocab_file}",
            "--do_lower_case=True",
            f"--max_seq_length={settings['max_seq_length']}",
            f"--max_predictions_per_seq={settings['max_predictions_per_seq']}",
            f"--dupe_factor={dupe}",
            f"--random_seed={settings['pretrain_seed']}",
            *RECIPES[recipe],
        ]
        rt_polarity.run_recorded(args, data / split, record, f"{recipe} {split} records")
        records[split] = record
    return records


def pretrain_args(arm, config_file, records, run_dir, steps, vocab_file, settings) -> list[str]:
    """The run_pretraining.py command line of one arm."""
    args = [
        "run_pretraining.py",
        f"--bert_config_file={config_file}",
        f"--input_file={records['train']}",
        f"--eval_input_file={records['heldout']}",
        f"--output_dir={run_dir}",
        "--do_train",
        "--do_eval",
        f"--max_seq_length={settings['max_seq_length']}",
        f"--max_predictions_per_seq={settings['max_predictions_per_seq']}",
        f"--train_batch_size={settings['train_batch_size']}",
        "--eval_batch_size=32",
        f"--learning_rate={settings['learning_rate']}",
        f"--num_train_steps={steps}",
        f"--num_warmup_steps={max(steps // 10, 1)}",
        f"--save_checkpoints_steps={steps}",
        f"--iterations_per_loop={min(50, steps)}",
        f"--max_eval_steps={settings['eval_steps']}",
        f"--random_seed={settings['pretrain_seed']}",
        *ARM_FLAGS[arm],
    ]
    if "--masking=dynamic" in ARM_FLAGS[arm]:
        args.append(f"--vocab_file={vocab_file}")
    if settings["use_xla"]:
        args.append("--use_xla")
    return args


def read_eval_results(path) -> dict[str, float]:
    """run_pretraining's eval_results.txt (`key = value` lines) as numbers."""
    out = {}
    for line in Path(path).read_text().splitlines():
        key, sep, value = line.partition(" = ")
        if sep:
            out[key.strip()] = float(value)
    return out


def pretrain_arm(arm, out_dir, config_file, records, steps, vocab_file, settings) -> dict:
    """Pretrains one arm (once; a finished run is reused) and returns its held-out results and
    measured wall time."""
    run_dir = Path(out_dir) / "pretrain" / arm
    args = pretrain_args(arm, config_file, records, run_dir, steps, vocab_file, settings)
    timing = run_dir / "timing.json"
    seconds = rt_polarity.run_recorded(args, run_dir, timing, f"pretrain {arm} ({steps} steps)")
    if seconds is not None:
        timing.write_text(json.dumps({"seconds": seconds, "steps": steps}) + "\n")
    return {
        "steps": steps,
        "minutes": json.loads(timing.read_text())["seconds"] / 60,
        "heldout": read_eval_results(run_dir / "eval_results.txt"),
        "run_dir": str(run_dir),
    }


def markdown_table(rows: Sequence[dict], budget: float, bow: dict) -> str:
    """The comparison as Markdown: one row per arm (see run())."""

    def cell(stats):
        if stats is None:  # not fine-tuned (--seeds empty)
            return "-"
        return f"{stats['mean']:.3f} ± {stats['std']:.3f} [{stats['min']:.3f}, {stats['max']:.3f}]"

    lines = [
        f"Budget: {budget / 1e12:.2f} TFLOP of pretraining per arm (analytic, "
        "bench/objectives.py).",
        "",
        "| objective | params | GFLOP/step | steps | pretrain min | held-out MLM acc "
        "| held-out other | rt-polarity dev (best ckpt) | rt-polarity test |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| bag-of-words LR (C={bow['c']}) | - | - | - | - | - | - | {bow['dev_accuracy']:.3f} "
        f"| {bow['test_accuracy']:.3f} |",
    ]
    for r in rows:
        held = r["pretraining"]["heldout"]
        mlm = held.get("masked_lm_accuracy")
        note = " (generator)" if r["arm"] == "electra" else ""
        tuned = r["finetune"] or {}
        lines.append(
            f"| {ARM_TITLES[r['arm']]} | {r['parameters']:,} | {r['step_flops'] / 1e9:.1f} "
            f"| {r['pretraining']['steps']:,} | {r['pretraining']['minutes']:.1f} "
            f"| {'-' if mlm is None else f'{mlm:.3f}'}{note} | {other_heldout(held)} "
            f"| {cell(tuned.get('dev_accuracy'))} | {cell(tuned.get('test_accuracy'))} |"
        )
    return "\n".join(lines)


# Held-out figures besides masked-LM accuracy, as run_pretraining's eval_results.txt names them.
OTHER_HELDOUT = (
    ("next_sentence_accuracy", "NSP acc"),
    ("sentence_order_accuracy", "SOP acc"),
    ("disc_auc", "RTD AUC"),
    ("disc_accuracy", "RTD acc"),
    ("disc_recall", "recall"),
    ("disc_replaced_fraction", "replaced"),
)


def other_heldout(held: dict) -> str:
    """The sentence objective's or the discriminator's held-out figures of one arm, or "-"."""
    cells = [f"{label} {held[key]:.3f}" for key, label in OTHER_HELDOUT if key in held]
    return ", ".join(cells) or "-"


def count_parameters(arm: str, config: dict) -> int:
    """Trainable parameters of the arm's pretraining model (generator included for ELECTRA)."""
    from modeling import albert, bert, electra

    if arm == "electra":
        model = electra.ElectraPretrainer(electra.ElectraConfig.from_dict(config))
    elif arm == "albert":
        model = albert.AlbertPretrainer(albert.AlbertConfig.from_dict(config), "sop")
    else:
        objective = "nsp" if arm == "bert" else "none"
        model = bert.BertPretrainer(bert.BertConfig.from_dict(config), objective)
    model.build()
    return int(sum(math.prod(w.shape) for w in model.trainable_weights))


def run(
    output_dir,
    corpus_dir,
    vocab_file,
    bert_config_file,
    arms: Sequence[str],
    seeds: Sequence[int],
    settings: dict,
    finetune_settings: dict,
    finetune_arms: Sequence[str] | None = None,
) -> tuple[dict, str]:
    """The whole comparison; returns (objectives.json's data, objectives.md's table).
    finetune_arms: the arms to fine-tune (None = all of `arms`); the others pretrain only."""
    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    vocab_file = Path(vocab_file).resolve()
    with open(bert_config_file, encoding="utf-8") as f:
        configs = arm_configs(json.load(f))
    s, p = settings["max_seq_length"], settings["max_predictions_per_seq"]
    b = settings["train_batch_size"]
    flops = {arm: pretraining_step_flops(arm, configs[arm], s, p, b) for arm in ARMS}
    budget = settings["budget_bert_steps"] * flops["bert"].total
    steps = budget_steps({arm: flops[arm].total for arm in arms}, budget)
    print(json.dumps({"budget_flops": budget, "steps": steps}, indent=2), flush=True)

    info = rt_polarity.prepare(out / "rt_polarity", settings["split_seed"])
    corpus = write_corpus_slice(corpus_dir, out / "corpus", settings["corpus_documents"])
    records = {
        recipe: make_records(out, recipe, corpus, vocab_file, settings)
        for recipe in sorted({ARM_RECIPE[a] for a in arms})
    }

    def one_arm(arm: str) -> dict:
        config_file = out / "configs" / f"{arm}_config.json"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        config_file.write_text(json.dumps(configs[arm], indent=2, sort_keys=True) + "\n")
        pre = pretrain_arm(
            arm, out, config_file, records[ARM_RECIPE[arm]], steps[arm], vocab_file, settings
        )
        pre["flops"] = steps[arm] * flops[arm].total
        pre["tokens"] = steps[arm] * b * s
        row = {
            "arm": arm,
            "title": ARM_TITLES[arm],
            "config": configs[arm],
            "parameters": count_parameters(arm, configs[arm]),
            "step_flops": flops[arm].total,
            "step_flops_parts": flops[arm].parts,
            "pretraining": pre,
            "finetune": None,
        }
        if not seeds or (finetune_arms is not None and arm not in finetune_arms):
            return row
        summary = rt_polarity.finetune_arm(
            out / "rt_polarity",
            arm,
            pre["run_dir"],
            seeds,
            vocab_file,
            config_file,
            finetune_settings,
            pre,
        )
        return row | {
            "finetune": {
                k: summary[k] for k in ("dev_accuracy", "dev_accuracy_final", "test_accuracy")
            }
            | {"runs": summary["runs"]},
        }

    # Arms are independent runs (each its own subprocesses); --parallel_arms > 1 overlaps them,
    # which shortens the driver on a machine with idle cores but makes each arm's wall time
    # (reported for information; the budget is FLOPs) depend on the others.
    with ThreadPoolExecutor(max(1, settings["parallel_arms"])) as pool:
        rows = list(pool.map(one_arm, arms))
    table = markdown_table(rows, budget, info["bag_of_words"])
    data = {
        "budget_flops": budget,
        "settings": settings,
        "finetune_settings": finetune_settings,
        "seeds": list(seeds),
        "finetune_arms": list(arms if finetune_arms is None else finetune_arms),
        "bag_of_words": info["bag_of_words"],
        "arms": rows,
    }
    (out / "objectives.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "objectives.md").write_text(table + "\n")
    return data, table


def main(argv):
    from absl import flags

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        raise SystemExit(f"unexpected arguments: {argv[1:]}")
    arms = list(FLAGS.arms)
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise SystemExit(f"--arms: expected some of {list(ARMS)}, found {arms}")
    if FLAGS.finetune_arms is not None and not set(FLAGS.finetune_arms) <= set(arms):
        raise SystemExit(
            f"--finetune_arms: expected some of --arms {arms}, found {FLAGS.finetune_arms}"
        )
    if FLAGS.budget_bert_steps < 1:
        raise SystemExit(f"--budget_bert_steps: expected >= 1, found {FLAGS.budget_bert_steps}")
    settings = {
        "budget_bert_steps": FLAGS.budget_bert_steps,
        "max_seq_length": FLAGS.max_seq_length,
        "max_predictions_per_seq": FLAGS.max_predictions_per_seq,
        "train_batch_size": FLAGS.train_batch_size,
        "learning_rate": FLAGS.pretrain_learning_rate,
        "pretrain_seed": FLAGS.pretrain_seed,
        "corpus_documents": FLAGS.corpus_documents,
        "dupe_factor": FLAGS.dupe_factor,
        "split_seed": FLAGS.split_seed,
        "use_xla": FLAGS.use_xla,
        "eval_steps": FLAGS.pretrain_eval_steps,
        "parallel_arms": FLAGS.parallel_arms,
    }
    # rt_polarity.py's defaults for its arms (its _define_flags), so these rows compare with its
    # table: 4 epochs at 3e-4, [CLS] pooling, dev evaluation every 100 steps.
    finetune_settings = {
        "max_seq_length": 64,
        "train_batch_size": 32,
        "eval_batch_size": 32,
        "predict_batch_size": 32,
        "learning_rate": FLAGS.finetune_learning_rate,
        "num_train_epochs": 4.0,
        "warmup_proportion": 0.1,
        "save_checkpoints_steps": 100,
        "iterations_per_loop": 100,
        "pooling": FLAGS.pooling,
        "layerwise_lr_decay": 1.0,
        "do_lower_case": True,
    }
    _, table = run(
        FLAGS.output_dir,
        FLAGS.corpus_dir,
        FLAGS.vocab_file,
        FLAGS.bert_config_file,
        arms,
        [int(x) for x in FLAGS.seeds],
        settings,
        finetune_settings,
        FLAGS.finetune_arms,
    )
    print("\n" + table)


def _define_flags():
    from absl import flags

    flags.DEFINE_string("output_dir", None, "Folder for the records, runs and the comparison.")
    flags.DEFINE_string("corpus_dir", "default_run/corpus", "Folder with train.txt, heldout.txt.")
    flags.DEFINE_string("vocab_file", "default_run/vocab.txt", "WordPiece vocabulary.")
    flags.DEFINE_string(
        "bert_config_file",
        "default_run/bert_config.json",
        "BERT config every arm derives from (arm_configs).",
    )
    flags.DEFINE_list("arms", list(ARMS), f"Arms to run, some of {list(ARMS)}.")
    flags.DEFINE_integer(
        "budget_bert_steps",
        300,
        "The FLOPs budget, as the steps BERT runs with it; the other arms get the steps that "
        "cost the same FLOPs. Raise it for a bigger comparison.",
    )
    flags.DEFINE_integer("train_batch_size", 32, "Pretraining batch size of every arm.")
    flags.DEFINE_integer("max_seq_length", 128, "Pretraining sequence length.")
    flags.DEFINE_integer("max_predictions_per_seq", 20, "Masked positions per sequence.")
    flags.DEFINE_float("pretrain_learning_rate", 5e-4, "Peak pretraining learning rate.")
    flags.DEFINE_integer("pretrain_seed", 12345, "Seed of records and pretraining runs.")
    flags.DEFINE_integer(
        "corpus_documents",
        0,
        "About this many evenly spaced documents of corpus train.txt to make records from "
        "(0 = all: 861 documents, about 12k sequences of 128 per pass in the default run).",
    )
    flags.DEFINE_integer("dupe_factor", 1, "Passes over the corpus slice, each with new masks.")
    flags.DEFINE_bool("use_xla", True, "Compile the pretraining step with XLA.")
    flags.DEFINE_integer(
        "pretrain_eval_steps", 100, "Held-out batches of 32 (at most) for masked-LM accuracy."
    )
    flags.DEFINE_integer(
        "parallel_arms", 1, "Arms run at once (pretraining then fine-tuning each); 1 = in turn."
    )
    flags.DEFINE_list(
        "seeds", ["1", "2"], "Fine-tuning seeds, the same for every arm; empty = pretrain only."
    )
    flags.DEFINE_list(
        "finetune_arms",
        None,
        "Arms to fine-tune (default: all of --arms); the others only pretrain, their row "
        "without fine-tuning columns.",
    )
    flags.DEFINE_integer("split_seed", 12345, "Seed of rt-polarity's 80/10/10 split.")
    flags.DEFINE_float("finetune_learning_rate", 3e-4, "Fine-tuning peak learning rate.")
    flags.DEFINE_string("pooling", "cls", "Fine-tuning sentence vector: cls or mean.")
    flags.mark_flag_as_required("output_dir")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
