"""Fine-tuning the generative families: XLNet's classifier inputs (training/xlnet_finetuning.py)
and run_classifier.py taking the XLNet path, and the rt-polarity comparison driver
(data_prep/generative_arms.py: command lines the scripts accept, scoring, summary)."""

import json
import re

import numpy as np
import pytest

from data_prep import bpe, generative_arms, glue, rt_polarity
from data_prep.errors import InputError
from modeling import flops, xlnet
from tests import helpers
from tests.conftest import ROOT
from tests.helpers import run_classifier_on_two_sentences
from tests.test_gpt_finetuning import tiny_bpe
from training import xlnet_finetuning


def examples(rows):
    return [glue.Example(f"f:{i}", str(i), a, b, y) for i, (a, b, y) in enumerate(rows)]


def test_text_encoder_uses_the_pretraining_tokenizer_and_xlnets_layout(tmp_path):
    tok = tiny_bpe(tmp_path)
    enc = xlnet_finetuning.XLNetTextEncoder(str(tmp_path / "bpe"))
    eot = tok.encoder[bpe.GPT2_END_OF_TEXT]
    assert (enc.sep_id, enc.cls_id, enc.vocab_size) == (eot, eot, len(tok.encoder))
    task = glue.get_task("mrpc")
    rows = [("The cat sat.", "Fish swim.", "1"), ("A bird sang twice.", "The dog.", "0")]
    encoded = enc.encode_examples(examples(rows), task, 11)
    for i, (a, b, _) in enumerate(rows):
        packed = xlnet.pack_classifier_ids(tok.encode(a), tok.encode(b), 11, eot, eot)
        for key, values in zip(xlnet_finetuning.FEATURES, packed):
            np.testing.assert_array_equal(encoded.features[key][i], values)
    np.testing.assert_array_equal(encoded.features["label_ids"], [1, 0])
    lengths = [len(tok.encode(a)) + len(tok.encode(b)) + 3 for a, b, _ in rows]
    assert encoded.truncated == [f"f:{i}" for i, n in enumerate(lengths) if n > 11]
    # A vocabulary with XLNet's own names uses them; WordPiece its [SEP] / [CLS].
    own = tiny_bpe(tmp_path / "own", ("<sep>", "<cls>", bpe.GPT2_END_OF_TEXT))
    enc = xlnet_finetuning.XLNetTextEncoder(str(tmp_path / "own" / "bpe" / "encoder.json"))
    assert (enc.sep_id, enc.cls_id) == (own.encoder["<sep>"], own.encoder["<cls>"])
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\n.\n")
    enc = xlnet_finetuning.XLNetTextEncoder(str(vocab))
    assert (enc.sep_id, enc.cls_id, enc.encode("The cat.")) == (3, 2, [5, 6, 7])
    tiny_bpe(tmp_path / "bare", specials=())
    with pytest.raises(InputError, match="none of them"):
        xlnet_finetuning.XLNetTextEncoder(str(tmp_path / "bare" / "bpe"))
    # Multiple choice: one packed sequence per choice, (N, C, S), as glue.encode_examples
    # pairs them (the context, then sent2 and the ending).
    swag = [glue.Example("f:2", "0", "A cat.", "It", "2", endings=("sat.", "ran.", "sang.", "x."))]
    encoded = enc.encode_examples(swag, glue.get_task("swag"), 9)
    assert encoded.features["input_ids"].shape == (1, 4, 9) and encoded.truncated == []
    for j, ending in enumerate(swag[0].endings):
        a, b = enc.encode("A cat."), enc.encode(f"It {ending}")
        packed = xlnet.pack_classifier_ids(a, b, 9, enc.sep_id, enc.cls_id)
        for key, values in zip(xlnet_finetuning.FEATURES, packed):
            np.testing.assert_array_equal(encoded.features[key][0, j], values)
    np.testing.assert_array_equal(encoded.features["label_ids"], [2])
    three = [glue.Example("f:7", "0", "A cat.", "It", "0", endings=("sat.", "ran.", "sang."))]
    with pytest.raises(InputError, match="f:7: expected 4 endings, found 3"):
        enc.encode_examples(three, glue.get_task("swag"), 9)
    with pytest.raises(InputError, match="n_token of at least"):
        config = tmp_path / "xlnet.json"
        config.write_text(json.dumps(XLNET | {"n_token": 5}))
        xlnet_finetuning.load_config(config, 8)


XLNET = dict(
    d_head=5, d_inner=17, d_model=12, ff_activation="gelu", n_head=3, n_layer=1,
    n_token=0, untie_r=True, dropout=0.0, dropatt=0.0,
)  # fmt: skip


def test_run_classifier_fine_tunes_an_xlnet_config(tmp_path):
    """One run: the XLNet path trains, keeps the best dev checkpoint, predicts."""
    tok = tiny_bpe(tmp_path)
    config = tmp_path / "xlnet.json"
    config.write_text(json.dumps(XLNET | {"n_token": len(tok.encoder)}))
    r, out = run_classifier_on_two_sentences(
        tmp_path,
        config,
        "--max_seq_length=13",
        "--num_train_epochs=20",
        "--iterations_per_loop=20",
        "--save_checkpoints_steps=30",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # The log's FLOP/s: 3 passes of modeling/flops.py's XLNet classifier count (batches of 4
    # sequences of 13, with segments, 2 classes) per example.
    xlnet_config = xlnet.XLNetConfig(**json.loads(config.read_text()))
    per_example = 3 * flops.xlnet_classifier_flops(xlnet_config, 13, 4, 2) / 4
    helpers.check_logged_flops(r.stderr, per_example, per_example)
    results = generative_arms.read_eval_results(out)
    assert int(results["global_step"]) == 60
    assert results["accuracy"] == 1.0  # two sentences, learnt in 60 steps
    assert json.loads((out / "best" / "best.json").read_text())["metrics"]["accuracy"] == 1.0
    assert glue.read_submission(out / "SST-2.tsv") == [("4", "0"), ("8", "1")]
    bad, _ = run_classifier_on_two_sentences(tmp_path / "pool", config, "--pooling=mean")
    assert bad.returncode != 0 and "XLNet summarises its last" in bad.stderr


def test_run_classifier_fine_tunes_an_xlnet_config_on_multiple_choice(tmp_path):
    """SWAG's layout: the XLNet path scores each (context, ending) sequence and learns two
    examples by heart, its FLOP/s counting every choice, with layer-wise learning rates (its
    per-layer bias stacks one rate per slice, finetune_tasks.layer_depth)."""
    tok = tiny_bpe(tmp_path)
    config = tmp_path / "xlnet.json"
    config.write_text(json.dumps(XLNET | {"n_token": len(tok.encoder)}))
    r, out = helpers.run_classifier_on_swag_by_heart(tmp_path, config, "--layerwise_lr_decay=0.8")
    assert r.returncode == 0, r.stderr[-3000:]
    bottom = 0.8 ** (XLNET["n_layer"] + 2)
    assert (
        f"layer-wise learning rates: x0.8 per layer below the head, the embeddings at x{bottom:.3g}"
        in r.stderr
    )
    # 3 passes of the XLNet classifier count (4 x 4 sequences of 11, one output) per example.
    xlnet_config = xlnet.XLNetConfig(**json.loads(config.read_text()))
    per_example = 3 * flops.xlnet_classifier_flops(xlnet_config, 11, 16, 1) / 4
    helpers.check_logged_flops(r.stderr, per_example, per_example)
    results = generative_arms.read_eval_results(out)
    assert int(results["global_step"]) == 60 and results["accuracy"] == 1.0
    assert glue.read_submission(out / "SWAG.tsv") == [("0", "1"), ("1", "0")]


def defined_flags(script: str) -> set[str]:
    text = (ROOT / script).read_text()
    return set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", text))


def test_driver_commands_use_flags_the_scripts_define(tmp_path):
    files = {
        "gpt_config": "g.json",
        "t5_config": "t.json",
        "xlnet_config": "x.json",
        "bpe_dir": str(tmp_path / "bpe"),
        "xlnet_vocab": "vocab.txt",
    }
    settings = {k: 1 for k in generative_arms.COMMON} | {"learning_rate": 3e-4}
    extra = {"gpt": {"lm_coef": 0.5}, "t5": {"max_target_length": 6, "num_beams": 1}}
    for family, script in (
        ("gpt", "run_classifier.py"),
        ("xlnet", "run_classifier.py"),
        ("t5", "run_text2text.py"),
    ):
        args = generative_arms.run_args(
            family, files, "sst2", "run", "ckpt", 7, settings | extra.get(family, {})
        )
        assert args[0] == script
        names = {a[2:].split("=")[0] for a in args[1:]}
        assert names <= defined_flags(script), names - defined_flags(script)
        assert "--random_seed=7" in args and "--init_checkpoint=ckpt" in args
        assert f"--bert_config_file={family[0]}.json" in args
    assert "--vocab_file=vocab.txt" in generative_arms.run_args("xlnet", files, "s", "r", "", 1, {})
    assert generative_arms.parse_arms(["a=gpt:", "b=t5:x/y"]) == [
        ("a", "gpt", ""),
        ("b", "t5", "x/y"),
    ]
    for bad in (["a=bert:x"], ["a=gpt"], ["a=gpt:", "a=t5:"], ["a b=gpt:"]):
        with pytest.raises(ValueError, match="--arms"):
            generative_arms.parse_arms(bad)


def test_label_words_become_a_scored_submission(tmp_path):
    labels = tmp_path / "test_labels.tsv"
    labels.write_text("index\tlabel\n0\t1\n1\t0\n2\t1\n3\t0\n")
    pred = tmp_path / "test_predictions.tsv"
    pred.write_text("index\tprediction\n0\tpositive\n1\tpositive\n2\tpos\n3\tnegative\n")
    sub = tmp_path / "SST-2.tsv"
    assert generative_arms.label_word_submission(pred, sub, ("negative", "positive")) == 0.25
    assert glue.read_submission(sub) == [("0", "1"), ("1", "1"), ("2", "invalid"), ("3", "0")]
    assert rt_polarity.score_submission(sub, labels) == 0.5


def test_sweep_summarises_finished_runs_without_rerunning_them(tmp_path):
    """Runs whose folders hold the same command and their predictions are not rerun (no
    subprocess starts here: one would fail on the fake configs); the summary and table are
    built from their files."""
    sst2 = tmp_path / "sst2"
    sst2.mkdir()
    (sst2 / "test_labels.tsv").write_text("index\tlabel\n0\t1\n1\t0\n")
    files = {k: "x" for k in ("gpt_config", "t5_config", "xlnet_config", "xlnet_vocab")}
    files["bpe_dir"] = str(tmp_path / "bpe")
    arms = [("gpt_scratch", "gpt", ""), ("t5_pre", "t5", "ck")]
    settings = {"gpt": {"learning_rate": 3e-4}, "t5": {"learning_rate": 1e-3}}
    out = tmp_path / "out"
    dev = {("gpt_scratch", 1): 0.5, ("gpt_scratch", 2): 0.75, ("t5_pre", 1): 1.0}
    for (name, seed), acc in dev.items():
        family = dict((a, f) for a, f, _ in arms)[name]
        run = out / name / f"seed_{seed}"
        run.mkdir(parents=True)
        checkpoint = "ck" if family == "t5" else ""
        args = generative_arms.run_args(
            family, files, sst2, run, checkpoint, seed, settings[family]
        )
        (run / "command.json").write_text(json.dumps(args))
        extra = "invalid = 0.0\n" if family == "t5" else ""
        (run / "eval_results.txt").write_text(f"accuracy = {acc}\n{extra}global_step = 300\n")
        if family == "t5":
            (run / "test_predictions.tsv").write_text("index\tprediction\n0\tpositive\n1\tx\n")
        else:
            glue.write_submission(run / "SST-2.tsv", ["0", "1"], ["1", str(seed - 1)])
    summaries = generative_arms.run_sweep(out, sst2, arms[:1], files, [1, 2], settings)
    gpt = summaries[0]
    assert [r["test_accuracy"] for r in gpt["runs"]] == [1.0, 0.5]
    assert gpt["dev_accuracy"]["mean"] == pytest.approx(0.625)
    t5 = generative_arms.run_sweep(out, sst2, arms[1:], files, [1], settings)[0]
    assert t5["runs"][0] | {"seed": 1} == {
        "seed": 1,
        "dev_accuracy": 1.0,
        "global_step": 300,
        "test_accuracy": 0.5,
        "dev_invalid": 0.0,
        "test_invalid": 0.5,
    }
    # collect_only: the two arms in one table, the seed never run (t5_pre 2) left out.
    both = generative_arms.run_sweep(out, sst2, arms, files, [1, 2], settings, collect_only=True)
    assert [(a["arm"], a["test_accuracy"]["n"]) for a in both] == [
        ("gpt_scratch", 2),
        ("t5_pre", 1),
    ]
    with pytest.raises(ValueError, match="other settings"):
        changed = settings | {"gpt": {"learning_rate": 1.0}}
        generative_arms.run_sweep(out, sst2, arms, files, [1], changed, collect_only=True)
    table = (out / "comparison.md").read_text()
    assert "| t5_pre | t5 | ck | 0.001 | - | 300 | 1 | 1.000 ± 0.000" in table
    assert json.loads((out / "comparison.json").read_text())[1]["arm"] == "t5_pre"
    assert (
        rt_polarity.score_submission(out / "gpt_scratch/seed_1/SST-2.tsv", sst2 / "test_labels.tsv")
        == 1.0
    )
