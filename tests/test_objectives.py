"""bench/objectives.py: the analytic FLOPs of every arm against the matrix products TensorFlow
actually runs in the arm's forward graph, the equal-FLOPs step counts, the arms' configs, and
the corpus slice."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from bench import objectives
from modeling import albert, bert, electra
from tests import helpers

B, S, P = 3, 7, 2
BERT_VALUES = helpers.TINY  # odd sizes (shared/STYLE.md)


def spec(with_labels=False):
    out = {
        "input_ids": tf.TensorSpec([B, S], tf.int32),
        "input_mask": tf.TensorSpec([B, S], tf.int32),
        "segment_ids": tf.TensorSpec([B, S], tf.int32),
        "masked_lm_positions": tf.TensorSpec([B, P], tf.int32),
    }
    if with_labels:
        out |= {
            "masked_lm_ids": tf.TensorSpec([B, P], tf.int32),
            "masked_lm_weights": tf.TensorSpec([B, P], tf.float32),
        }
    return out


@pytest.mark.parametrize(
    "arm, inner", [("bert", 1), ("roberta", 1), ("albert", 1), ("albert", 2), ("electra", 1)]
)
def test_step_flops_equal_three_times_the_forward_graphs_matrix_products(arm, inner):
    configs = objectives.arm_configs(BERT_VALUES)
    if arm == "electra":  # E != H and E != H_g: both embedding projections run
        configs["electra"] = configs["electra"] | {"embedding_size": 5}
    if inner > 1:  # ALBERT's layers of 2 blocks each: 2 L blocks run
        configs["albert"] = configs["albert"] | {"inner_group_num": inner}
    values = configs[arm]
    if arm == "electra":
        model = electra.ElectraPretrainer(electra.ElectraConfig.from_dict(values))
        model.build()
        forward = helpers.graph_matmul_flops(
            lambda x: model(x, training=False, seed=tf.constant([7, 8])), spec(True)
        )
    else:
        config = albert.encoder_config_from_dict(values)
        pretrainer = albert.AlbertPretrainer if arm == "albert" else bert.BertPretrainer
        objective = {"bert": "nsp", "roberta": "none", "albert": "sop"}[arm]
        model = pretrainer(config, objective)
        model.build()
        forward = helpers.graph_matmul_flops(lambda x: model(x, training=False), spec())
        if arm == "roberta":
            # The 2-way head exists in every BertPretrainer but RoBERTa trains none: its
            # pooler + classifier products are not counted.
            h = values["hidden_size"]
            forward -= B * (2 * h * h + 4 * h)
    flops = objectives.pretraining_step_flops(arm, values, S, P, B)
    assert flops.total == 3 * forward


def test_equal_budget_steps_and_what_each_arm_costs():
    configs = objectives.arm_configs(BERT_VALUES | {"vocab_size": 7873, "hidden_size": 128})
    per_step = {
        a: objectives.pretraining_step_flops(a, configs[a], 128, 20, 32).total
        for a in objectives.ARMS
    }
    steps = objectives.budget_steps(per_step, 300 * per_step["bert"])
    assert steps["bert"] == 300
    for arm, n in steps.items():  # every arm spends at most the budget, and not a step less
        assert n * per_step[arm] <= 300 * per_step["bert"] < (n + 1) * per_step[arm]
    # ALBERT's narrower MLM head makes its steps cheaper; ELECTRA pays for its generator.
    assert steps["albert"] > steps["bert"] > steps["electra"]
    with pytest.raises(ValueError, match="positive"):
        objectives.budget_steps(per_step, 0)
    with pytest.raises(ValueError, match="arm"):
        objectives.pretraining_step_flops("xlnet", configs["bert"], 128, 20, 32)


def test_arm_configs_are_the_families_the_run_scripts_detect(tmp_path):
    configs = objectives.arm_configs(BERT_VALUES)
    kinds = {a: type(albert.encoder_config_from_dict(v)) for a, v in configs.items()}
    assert kinds == {
        "bert": bert.BertConfig,
        "roberta": bert.BertConfig,
        "albert": albert.AlbertConfig,
        "electra": electra.ElectraConfig,
    }
    e = electra.ElectraConfig.from_dict(configs["electra"])
    assert e.embedding_size == e.hidden_size == 12 and e.generator_sizes() == (3, 2)
    assert albert.AlbertConfig.from_dict(configs["albert"]).embedding_size == 6
    args = objectives.pretrain_args(
        "roberta",
        tmp_path / "c.json",
        {"train": "t", "heldout": "h"},
        tmp_path / "run",
        17,
        "vocab.txt",
        {
            "max_seq_length": 7,
            "max_predictions_per_seq": 2,
            "train_batch_size": 3,
            "learning_rate": 1e-3,
            "pretrain_seed": 5,
            "use_xla": False,
            "eval_steps": 9,
        },
    )
    wanted = {"--masking=dynamic", "--vocab_file=vocab.txt", "--num_train_steps=17"}
    assert wanted | {"--max_eval_steps=9"} <= set(args)
    assert "--sentence_objective=none" in args and "--use_xla" not in args


def test_corpus_slice_keeps_whole_documents_evenly_spaced(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = [f"doc {i} sentence one.\ndoc {i} sentence two." for i in range(10)]
    (corpus / "train.txt").write_text("\n\n".join(docs) + "\n")
    (corpus / "heldout.txt").write_text("held out.\n")
    paths = objectives.write_corpus_slice(corpus, tmp_path / "out", 4)
    kept = paths["train"].read_text().strip().split("\n\n")
    assert kept == [docs[i] for i in (0, 3, 6, 9)]
    assert paths["heldout"].read_text() == "held out.\n"
    everything = objectives.write_corpus_slice(corpus, tmp_path / "all", 0)
    assert everything["train"].read_text().strip().split("\n\n") == docs
    with pytest.raises(FileNotFoundError, match="heldout.txt"):
        (corpus / "heldout.txt").unlink()
        objectives.write_corpus_slice(corpus, tmp_path / "again", 0)
    assert json.loads(json.dumps(objectives.RECIPES))  # plain data, as written to command.json


def test_table_rows_with_and_without_fine_tuning():
    stats = {"mean": 0.7, "std": 0.01, "min": 0.69, "max": 0.71, "n": 2}
    rows = [
        {
            "arm": arm,
            "parameters": 1234,
            "step_flops": 15.2e9,
            "pretraining": {"steps": 150, "minutes": 3.5, "heldout": held},
            "finetune": tuned,
        }
        for arm, held, tuned in (
            (
                "bert",
                {"masked_lm_accuracy": 0.0512},
                {"dev_accuracy": stats, "test_accuracy": stats},
            ),
            (
                "electra",
                {"masked_lm_accuracy": 0.04, "disc_accuracy": 0.9, "disc_auc": 0.7512},
                None,
            ),
        )
    ]
    table = objectives.markdown_table(
        rows, 150 * 15.2e9, {"c": 0.3, "dev_accuracy": 0.75, "test_accuracy": 0.76}
    ).splitlines()
    assert table[0] == "Budget: 2.28 TFLOP of pretraining per arm (analytic, bench/objectives.py)."
    assert table[5] == (
        "| BERT (MLM + NSP, static masks) | 1,234 | 15.2 | 150 | 3.5 | 0.051 | - "
        "| 0.700 ± 0.010 [0.690, 0.710] | 0.700 ± 0.010 [0.690, 0.710] |"
    )
    assert table[6].endswith("| 0.040 (generator) | RTD AUC 0.751, RTD acc 0.900 | - | - |")


def test_run_fine_tunes_only_the_finetune_arms_and_writes_both_outputs(tmp_path, monkeypatch):
    """run() with the subprocess steps replaced: every arm pretrains at its equal-FLOPs steps,
    only --finetune_arms are fine-tuned, and objectives.json / .md hold every row."""
    from data_prep import rt_polarity

    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(BERT_VALUES))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "heldout"):
        (corpus / f"{split}.txt").write_text("a b.\nc d.\n\ne f.\n")
    bow = {"c": 0.1, "dev_accuracy": 0.7, "test_accuracy": 0.72}
    monkeypatch.setattr(rt_polarity, "prepare", lambda out, seed: {"bag_of_words": bow})
    monkeypatch.setattr(objectives, "make_records", lambda out, recipe, *a: {"recipe": recipe})
    pretrained = {}

    def fake_pretrain(arm, out, config_file, records, steps, vocab_file, settings):
        pretrained[arm] = (records["recipe"], steps)
        return {"steps": steps, "minutes": 1.0, "heldout": {}, "run_dir": f"pre/{arm}"}

    tuned = []
    stats = {"mean": 0.6, "std": 0.0, "min": 0.6, "max": 0.6, "n": 1}

    def fake_finetune(out, arm, run_dir, seeds, *a):
        tuned.append((arm, run_dir, list(seeds)))
        keys = ("dev_accuracy", "dev_accuracy_final", "test_accuracy")
        return {k: stats for k in keys} | {"runs": []}

    monkeypatch.setattr(objectives, "pretrain_arm", fake_pretrain)
    monkeypatch.setattr(rt_polarity, "finetune_arm", fake_finetune)
    settings = {
        "max_seq_length": 16,
        "max_predictions_per_seq": 3,
        "train_batch_size": 5,
        "budget_bert_steps": 7,
        "split_seed": 1,
        "corpus_documents": 0,
        "parallel_arms": 1,
    }
    data, table = objectives.run(
        tmp_path / "out",
        corpus,
        tmp_path / "vocab.txt",
        config_file,
        ["bert", "electra"],
        [1],
        settings,
        {},
        finetune_arms=["bert"],
    )
    assert tuned == [("bert", "pre/bert", [1])]
    assert pretrained["bert"] == ("static_nsp_token", 7)
    assert pretrained["electra"][0] == "dynamic_full_sentences"
    assert [r["finetune"] is None for r in data["arms"]] == [False, True]
    assert data["finetune_arms"] == ["bert"]
    lines = (tmp_path / "out" / "objectives.md").read_text().splitlines()
    assert lines == table.splitlines() and len(lines) == 7
    assert lines[-1].endswith("| - | - |") and not lines[-2].endswith("| - | - |")
    assert json.loads((tmp_path / "out" / "objectives.json").read_text()) == json.loads(
        json.dumps(data)
    )
