"""Text-to-text fine-tuning: the readers and encoding of data_prep/text2text.py, and smoke runs of
run_text2text.py on label-word classification (greedy) and tsv_seq2seq (beam search)."""

import json

import numpy as np
import pytest

from data_prep import glue, seq2seq_data, text2text
from data_prep.errors import InputError
from modeling import flops, t5
from tests import helpers
from tests.test_seq2seq_data import tiny_bpe


def vocab_and_config(tmp_path):
    encoder, merges = tiny_bpe(tmp_path)
    vocab = seq2seq_data.Seq2SeqVocab.from_files(encoder, merges, num_sentinels=3)
    config = dict(
        vocab_size=vocab.size, d_model=16, d_kv=4, d_ff=19, num_layers=1, num_heads=3,
        dropout_rate=0.0, pad_token_id=vocab.pad_id, eos_token_id=vocab.eos_id,
        decoder_start_token_id=vocab.pad_id,
    )  # fmt: skip
    path = tmp_path / "t5.json"
    path.write_text(json.dumps(config))
    return vocab, path, encoder, merges


def test_label_words_and_sources_follow_t5():
    sst = glue.get_task("sst-2")
    assert text2text.label_words(sst) == ("negative", "positive")
    assert text2text.label_words(glue.get_task("mnli")) == (
        "contradiction",
        "entailment",
        "neutral",
    )
    assert text2text.label_words(sst, ["bad", "good"]) == ("bad", "good")
    with pytest.raises(ValueError, match="2 distinct"):
        text2text.label_words(sst, ["same", "same"])
    with pytest.raises(ValueError, match="regression"):
        text2text.label_words(glue.get_task("sts-b"))
    assert text2text.source_text("sst-2", "a b", None) == "sst2 sentence: a b"
    assert text2text.source_text("rte", "x", "y") == "rte sentence1: x sentence2: y"


def test_tsv_pairs_name_the_bad_line(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("a long text\tshort\n\nsecond\tone\n", encoding="utf-8")
    pairs = text2text.read_tsv_pairs(path)
    assert [(p.index, p.source, p.target) for p in pairs] == [
        ("0", "a long text", "short"),
        ("1", "second", "one"),
    ]
    assert pairs[1].guid == f"{path}:3"
    path.write_text("ok\tfine\nno tab here\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"train.tsv:2: expected source<TAB>target"):
        text2text.read_tsv_pairs(path)
    path.write_text("ok\t\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"train.tsv:1: expected a non-empty source and target"):
        text2text.read_tsv_pairs(path)
    assert text2text.read_tsv_pairs(path, labelled=False)[0].target is None


def squad_file(path, questions):
    """A SQuAD v1.1 file of one paragraph per (context, [(id, question, [answers])])."""
    paragraphs = [
        {
            "context": context,
            "qas": [
                {
                    "id": qid,
                    "question": question,
                    "answers": [{"text": a, "answer_start": context.find(a)} for a in answers],
                }
                for qid, question, answers in qas
            ],
        }
        for context, qas in questions
    ]
    path.write_text(json.dumps({"version": "1.1", "data": [{"paragraphs": paragraphs}]}))
    return path


def test_squad_pairs_follow_t5_and_refuse_unanswerable_questions(tmp_path):
    path = squad_file(
        tmp_path / "dev-v1.1.json",
        [("The cat sat on the mat.", [("q1", "Where did the cat sit?", ["on the mat", "mat"])])],
    )
    (pair,) = text2text.read_squad_pairs(path)
    assert pair.source == "question: Where did the cat sit? context: The cat sat on the mat."
    assert (pair.index, pair.target, pair.answers) == ("q1", "on the mat", ("on the mat", "mat"))
    assert pair.guid == f"{path}: data[0].paragraphs[0].qas[0]"
    assert text2text.read_pairs("squad", "dev", str(tmp_path)) == ([pair], str(path))
    with pytest.raises(ValueError, match="squad has no test split here"):
        text2text.read_pairs("squad", "test", str(tmp_path))
    with pytest.raises(InputError, match="train-v1.1.json: expected a readable SQuAD JSON"):
        text2text.read_pairs("squad", "train", str(tmp_path))
    data = json.loads(path.read_text())
    data["data"][0]["paragraphs"][0]["qas"].append(
        {"id": "q2", "question": "Why?", "answers": [], "is_impossible": True}
    )
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"paragraphs\[0\]\.qas\[1\]: expected a SQuAD v1.1"):
        text2text.read_squad_pairs(path)


def test_encoding_cuts_each_side_and_keeps_eos_last(tmp_path):
    vocab, *_ = vocab_and_config(tmp_path)
    pairs = [
        text2text.Pair("g:1", "0", "The cat sat on the mat.", "The cat"),
        text2text.Pair("g:2", "1", "Short.", None),
    ]
    s = len(vocab.encode("Short.")) + 2  # room for the short source, not the long one
    assert len(vocab.encode("The cat sat on the mat.")) > s
    features, cut = text2text.encode_pairs(pairs, vocab, s, 9)
    assert cut == 1
    assert features["input_ids"].shape == (2, s) and features["target_ids"].shape == (2, 9)
    assert features["input_ids"][0, -1] == vocab.eos_id
    assert (
        features["input_ids"][0, :-1].tolist() == vocab.encode("The cat sat on the mat.")[: s - 1]
    )
    target = features["target_ids"][0][features["target_mask"][0] == 1]
    assert vocab.decode(target) == "The cat" and target[-1] == vocab.eos_id
    assert features["target_ids"][1].tolist() == [vocab.eos_id] + [vocab.pad_id] * 8
    n = len(vocab.encode("Short.")) + 1
    assert features["input_mask"][1].tolist() == [1] * n + [0] * (s - n)


def test_bart_encoding_is_wrapped_in_bos_and_eos_as_bart_was_pretrained(tmp_path):
    """With BART's <s>, each side is `<s> text </s>` (Hugging Face's BartTokenizer layout) and
    is still cut to its length."""
    encoder, merges = tiny_bpe(tmp_path)
    vocab = seq2seq_data.Seq2SeqVocab.from_files(encoder, merges, num_sentinels=0, bos=True)
    text = "The cat sat on the mat."
    ids = vocab.encode(text)
    pairs = [text2text.Pair("g:1", "0", text, "Hi."), text2text.Pair("g:2", "1", text, None)]
    features, cut = text2text.encode_pairs(pairs, vocab, len(ids) + 2, 5)
    assert cut == 0
    assert features["input_ids"][0].tolist() == [vocab.bos_id, *ids, vocab.eos_id]
    short = vocab.encode("Hi.")
    assert len(short) == 3
    target = features["target_ids"][0][features["target_mask"][0] == 1].tolist()
    assert target == [vocab.bos_id, *short, vocab.eos_id]
    assert vocab.decode(target) == "Hi."
    assert features["target_ids"][1, :2].tolist() == [vocab.bos_id, vocab.eos_id]
    features, cut = text2text.encode_pairs(pairs[:1], vocab, 5, 5)
    assert cut == 1
    assert features["input_ids"][0].tolist() == [vocab.bos_id, *ids[:3], vocab.eos_id]


def run(args, command_line=False):
    """run_text2text.py with `args` (helpers.run_script: in this process, or as a real command
    line, which the GLUE run below keeps)."""
    return helpers.run_script("run_text2text.py", args, command_line)


def read_tsv(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[0].split("\t"), [line.split("\t") for line in lines[1:]]


def test_run_text2text_classification_and_tsv_seq2seq(tmp_path):
    vocab, config, encoder, merges = vocab_and_config(tmp_path)
    sst = tmp_path / "sst"
    sst.mkdir()
    rows = ["The cat sat.\t1", "The dog barked.\t0"] * 6
    (sst / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (sst / "dev.tsv").write_text("sentence\tlabel\nThe cat sat.\t1\nThe dog barked.\t0\n")
    (sst / "test.tsv").write_text("index\tsentence\n7\tThe dog barked.\n9\tThe cat sat.\n")
    common = [
        f"--bert_config_file={config}", f"--encoder_file={encoder}", f"--merges_file={merges}",
        "--num_sentinels=3", "--max_seq_length=29", "--max_target_length=10",
        "--train_batch_size=4", "--eval_batch_size=3", "--learning_rate=1e-2",
        "--warmup_proportion=0.1", "--iterations_per_loop=10",
    ]  # fmt: skip
    out = tmp_path / "out_sst"
    r = run([*common, "--task_name=sst-2", f"--data_dir={sst}", f"--output_dir={out}",
             "--num_train_epochs=30", "--do_train", "--do_eval", "--do_predict",
             "--save_checkpoints_steps=30", "--peak_tflops=1e-4"], command_line=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    # The log's FLOP/s: 3 passes of modeling/flops.py's T5 count (29 inputs, 10 targets) per
    # example, and its share of --peak_tflops.
    per_example = 3 * flops.t5_flops(t5.T5Config(**json.loads(config.read_text())), 29, 10)
    helpers.check_logged_flops(r.stderr, per_example, per_example, peak_tflops=1e-4)
    helpers.check_training_curves(r.stderr, out, "target_loss, target_accuracy, accuracy")
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert int(results["global_step"]) == 90
    # Dev decoded at the start and after each save; the best trained model kept and decoding
    # the test split: the first step with the highest GLUE score (SST-2's: the accuracy; the
    # untrained step is no candidate).
    evals = [json.loads(x) for x in (out / "eval_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 30, 60, 90]
    assert all(e["score"] == e["accuracy"] for e in evals)
    top = max(e["score"] for e in evals[1:])
    kept = json.loads((out / "best" / "best.json").read_text())
    assert kept["score"] == top and kept["step"] == next(
        e["step"] for e in evals[1:] if e["score"] == top
    )
    assert float(results["best_score"]) == top and int(results["best_step"]) == kept["step"]
    assert f"test split with the best dev checkpoint {out / 'best' / 'ckpt-'}" in r.stderr
    # Two sentences, two label words, 90 steps: the decoded words must be the right ones.
    assert float(results["accuracy"]) == 1.0 and float(results["invalid"]) == 0.0
    header, dev_rows = read_tsv(out / "dev_predictions.tsv")
    assert header == ["index", "prediction", "target"]
    assert [row[1:] for row in dev_rows] == [["positive"] * 2, ["negative"] * 2]
    header, test_rows = read_tsv(out / "test_predictions.tsv")
    assert header == ["index", "prediction"] and test_rows == [["7", "negative"], ["9", "positive"]]
    # --precision: the float32 checkpoint decodes at bf16 and fp16 (the model built under the
    # mixed policy, its cache in that dtype) to the same words.
    for precision in ("bf16", "fp16"):
        mixed = tmp_path / f"sst_{precision}"
        r = run([*common, "--task_name=sst-2", f"--data_dir={sst}", f"--output_dir={mixed}",
                 f"--init_checkpoint={out}", "--do_eval", "--do_predict",
                 f"--precision={precision}"])  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        for name in ("dev_predictions.tsv", "test_predictions.tsv"):
            assert read_tsv(mixed / name) == read_tsv(out / name), (precision, name)

    summ = tmp_path / "summ"
    summ.mkdir()
    rows = ["The cat sat on the mat.\tcat sat", "The dog barked twice at noon.\tdog barked"]
    (summ / "train.tsv").write_text("\n".join(rows * 6) + "\n")
    (summ / "dev.tsv").write_text("\n".join(rows) + "\n")
    (summ / "test.tsv").write_text("Birds sing in the early morning.\n")
    out = tmp_path / "out_summ"
    r = run([*common, "--task_name=tsv_seq2seq", f"--data_dir={summ}", f"--output_dir={out}",
             "--num_train_epochs=2", "--num_beams=2", "--do_train", "--do_eval",
             "--do_predict"])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert 0.0 <= float(results["rouge_l"]) <= 1.0
    assert float(results["best_rouge_l"]) == float(results["rouge_l"])  # one save, at the end
    header, dev_rows = read_tsv(out / "dev_predictions.tsv")
    from training import rouge

    got = rouge.mean_rouge_l([row[1] for row in dev_rows], [row[2] for row in dev_rows])
    assert float(results["rouge_l"]) == pytest.approx(got)
    assert [row[2] for row in dev_rows] == ["cat sat", "dog barked"]
    header, test_rows = read_tsv(out / "test_predictions.tsv")
    assert len(test_rows) == 1 and test_rows[0][0] == "0"
    assert np.isfinite(float(results["exact_match"]))


def test_run_text2text_on_squad_scores_with_the_official_metric(tmp_path):
    """--task_name=squad: T5 learns two questions' answers by heart, and eval_results.txt holds
    evaluate-v1.1.py's exact match and F1 of dev_predictions.tsv against every gold answer
    (training/squad_eval.evaluate_v1 on the dev file), which pick the kept best."""
    vocab, config, encoder, merges = vocab_and_config(tmp_path)
    data = tmp_path / "squad"
    data.mkdir()
    cat, dog = "The cat sat on the mat.", "The dog ran to the park."
    train = [
        (cat, [(f"c{i}", "Where did the cat sit?", ["on the mat"]) for i in range(6)]),
        (dog, [(f"d{i}", "Where did the dog run?", ["to the park"]) for i in range(6)]),
    ]
    squad_file(data / "train-v1.1.json", train)
    dev = [
        (cat, [("c", "Where did the cat sit?", ["the mat", "on the mat"])]),
        (dog, [("d", "Where did the dog run?", ["the park"])]),
    ]
    dev_file = squad_file(data / "dev-v1.1.json", dev)
    out = tmp_path / "out"
    r = run([f"--bert_config_file={config}", f"--encoder_file={encoder}",
             f"--merges_file={merges}", "--num_sentinels=3", "--max_seq_length=48",
             "--max_target_length=10", "--train_batch_size=4", "--eval_batch_size=2",
             "--learning_rate=1e-2", "--iterations_per_loop=10", "--task_name=squad",
             f"--data_dir={data}", f"--output_dir={out}", "--num_train_epochs=20",
             "--save_checkpoints_steps=30", "--do_train", "--do_eval"])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    helpers.check_training_curves(r.stderr, out, "target_loss, target_accuracy, exact_match, f1")
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    header, rows = read_tsv(out / "dev_predictions.tsv")
    assert [row[0] for row in rows] == ["c", "d"] and [row[2] for row in rows] == [
        "the mat",
        "the park",
    ]
    from training import squad_eval

    official = squad_eval.evaluate_v1(
        json.loads(dev_file.read_text()), {row[0]: row[1] for row in rows}
    )
    assert float(results["exact_match"]) == pytest.approx(official["exact_match"])
    assert float(results["f1"]) == pytest.approx(official["f1"])
    # Learnt by heart: "on the mat" is one of the cat's gold answers; "to the park" against
    # the dog's "the park" is "to park" against "park" once articles go (precision 1/2, recall
    # 1, F1 2/3).
    assert [row[1] for row in rows] == ["on the mat", "to the park"]
    assert float(results["exact_match"]) == 50.0
    assert float(results["f1"]) == pytest.approx(100 * (1 + 2 / 3) / 2)
    kept = json.loads((out / "best" / "best.json").read_text())
    assert float(results["best_f1"]) == kept["score"] and int(results["best_step"]) == kept["step"]


def test_mixed_precision_fine_tunes_and_a_resume_keeps_its_precision(tmp_path):
    """--precision=bf16 / fp16 fine-tuning from the same seeds and data as fp32: each step's loss
    near fp32's but not equal to it (rounded products); fp16 logs Keras' dynamic loss scale at
    every step; the precision is a run setting, so a resume at another one is refused naming
    the flag, before any checkpoint is touched."""
    _, config, encoder, merges = vocab_and_config(tmp_path)
    data = tmp_path / "summ"
    data.mkdir()
    rows = ["The cat sat on the mat.\tcat sat", "The dog barked twice at noon.\tdog barked"]
    (data / "train.tsv").write_text("\n".join(rows * 6) + "\n")

    def args(out, *more):
        return [
            f"--bert_config_file={config}", f"--encoder_file={encoder}", f"--merges_file={merges}",
            "--num_sentinels=3", "--max_seq_length=29", "--max_target_length=10",
            "--train_batch_size=4", "--learning_rate=1e-2", "--iterations_per_loop=1",
            "--task_name=tsv_seq2seq", f"--data_dir={data}", f"--output_dir={out}", "--do_train",
            *more,
        ]  # fmt: skip

    losses = {}
    for precision in ("fp32", "bf16", "fp16"):
        out = tmp_path / precision
        r = run(args(out, "--num_train_epochs=1", f"--precision={precision}"))
        assert r.returncode == 0, r.stderr[-3000:]
        log = helpers.check_precision_run(out, precision)
        assert len(log) == 3
        losses[precision] = np.array([x["target_loss"] for x in log])
    for precision in ("bf16", "fp16"):
        difference = np.abs(losses[precision] - losses["fp32"])
        assert 0 < difference.max() < 0.05, losses
    checkpoints = sorted(p.name for p in (tmp_path / "fp16").glob("ckpt-*"))
    helpers.check_precision_resume_refused(run(args(tmp_path / "fp16", "--num_train_epochs=2")))
    assert sorted(p.name for p in (tmp_path / "fp16").glob("ckpt-*")) == checkpoints
