"""convert_checkpoint.py end to end: the real all-MiniLM-L6-v2 against independent references,
a SavedModel served from raw strings in a process without Cloze, the TF1 -> HF chain, and failed
runs that leave nothing behind.

The reference for the real weights, and why two: CI must not install PyTorch (a CPU wheel is
~200 MB and minutes on 2 cores), so every CI run compares Cloze (1) against the float64 numpy
forward pass of tests/test_checkpoints.py on all features of every hidden state, computed from the
safetensors file directly with Hugging Face's names, and (2) against golden numbers that
transformers.BertModel computed once from the same weights (tests/make_minilm_golden.py writes
tests/fixtures/minilm_golden.npz). (2) keeps (1) honest: a shared misreading of BERT by Cloze and
the numpy reference would still differ from PyTorch. The ONNX paraphrase-MiniLM-L3-v2 was not
used: its matmul weights are anonymous graph constants and its package is a 63 MB download.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import tokenization
from modeling import bert, checkpoints, finetuning
from tests import helpers
from tests.make_minilm_golden import GOLDEN, minilm_dir
from tests.test_checkpoints import (
    original_tf1_shapes,
    params_from_hf,
    random_arrays,
    random_inputs,
    reference_forward,
    write_tf1_checkpoint,
)

TOLERANCE = 1e-5  # max absolute difference, the bar for the real weights


def run(args, check=True, command_line=False):
    """convert_checkpoint.py with `args` (helpers.run_script: in this process, or as a real
    command line, which the SavedModel test below keeps)."""
    result = helpers.run_script("convert_checkpoint.py", args, command_line)
    if check and result.returncode != 0:
        raise AssertionError(result.stderr[-4000:])
    return result


def encode(tokenizer, first, second=None):
    """[CLS] a [SEP] (b [SEP]) ids and segment ids, as the original's convert_single_example."""
    tokens = ["[CLS]", *tokenizer.tokenize(first), "[SEP]"]
    segments = [0] * len(tokens)
    if second is not None:
        more = [*tokenizer.tokenize(second), "[SEP]"]
        tokens += more
        segments += [1] * len(more)
    return tokenizer.convert_tokens_to_ids(tokens), segments


def pad(rows, length):
    return np.array([r + [0] * (length - len(r)) for r in rows], np.int32)


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(GOLDEN))


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The real MiniLM from PyPI, converted into a Cloze checkpoint and loaded back the way run
    scripts load --init_checkpoint into a task model's encoder."""
    from training import trainer

    source = minilm_dir()
    config = checkpoints.read_any_config(source / "config.json")
    converted, report = checkpoints.load_hf_bert(source, config)
    assert report.num_source_variables == 103 and len(report.entries) == 79
    assert list(report.ignored) == ["embeddings.position_ids"]  # a buffer, not a weight
    out = tmp_path_factory.mktemp("minilm")
    checkpoints.save_cloze(converted, out)
    model = bert.BertPretrainer(config)
    model.build()
    trainer.restore_model_weights(tf.train.Checkpoint(encoder=model.encoder), str(out))
    return source, model.encoder


def golden_inputs(golden, tokenizer):
    rows = [
        encode(tokenizer, a, b if has_b else None)
        for a, b, has_b in zip(golden["first"], golden["second"], golden["has_second"])
    ]
    length = golden["input_ids"].shape[1]
    ids = pad([r[0] for r in rows], length)
    segments = pad([r[1] for r in rows], length)
    mask = pad([[1] * len(r[0]) for r in rows], length)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def test_real_minilm_matches_pytorch_and_numpy_references(minilm, golden):
    source, encoder = minilm
    tokenizer = tokenization.FullTokenizer(source / "vocab.txt", do_lower_case=True)
    inputs = golden_inputs(golden, tokenizer)
    # Raw text in: Cloze's own tokenizer gives the ids Hugging Face's tokenizer gave.
    for key in ("input_ids", "segment_ids", "input_mask"):
        np.testing.assert_array_equal(inputs[key], golden[key], err_msg=key)

    ours = encoder(inputs)
    hidden = np.stack([np.array(h) for h in ours["encoder_outputs"]])  # (L+1, B, S, H)
    pooled = np.array(ours["pooled_output"])
    from safetensors.numpy import load_file

    weights = load_file(str(source / "model.safetensors"))
    config = encoder.config
    ref = reference_forward(
        params_from_hf(weights, config.num_hidden_layers),
        inputs["input_ids"],
        inputs["segment_ids"],
        inputs["input_mask"],
        config.num_attention_heads,
        config.hidden_act,
    )
    real = inputs["input_mask"].astype(bool)
    features = golden["features"]
    diffs = {
        "numpy, all hidden states": max(
            np.abs(hidden[i][real] - r[real]).max() for i, r in enumerate(ref["hidden_states"])
        ),
        "numpy, pooled": np.abs(pooled - ref["pooled"]).max(),
        "pytorch, all hidden states": np.abs(
            hidden[:, real][:, :, features] - golden["hidden_states"]
        ).max(),
        "pytorch, pooled": np.abs(pooled - golden["pooled_output"]).max(),
        "numpy vs pytorch (reference check)": np.abs(
            np.stack(ref["hidden_states"])[:, real][:, :, features] - golden["hidden_states"]
        ).max(),
    }
    print(f"\nMiniLM-L6 max abs differences ({golden['versions']}):")
    for name, value in diffs.items():
        print(f"  {name}: {value:.2e}")
    for name, value in diffs.items():
        assert value < TOLERANCE, f"{name}: {value}"


LOADER = """
import importlib.util, json, sys
import numpy as np, tensorflow as tf, tensorflow_text  # tensorflow_text registers the tokenizer ops
assert importlib.util.find_spec("modeling") is None, "Cloze must not be importable here"
model = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
single = model.signatures["serving_default"](text=tf.constant(texts["single"]))
pair = model.signatures["serve_text_pair"](
    text_a=tf.constant(texts["first"]), text_b=tf.constant(texts["second"]))
ids = model.signatures["serve_ids"](input_ids=single["input_ids"],
    input_mask=single["input_mask"], segment_ids=single["segment_ids"])
out = {f"single_{k}": v.numpy() for k, v in single.items()}
out |= {f"pair_{k}": v.numpy() for k, v in pair.items()}
out |= {f"ids_{k}": v.numpy() for k, v in ids.items()}
np.savez(sys.argv[3], **out)
"""


def serve_without_cloze(export, texts: dict, work_dir) -> dict:
    """LOADER's arrays: the SavedModel at `export` served `texts` in a Python that cannot import
    Cloze (run from work_dir, not the repository)."""
    served = Path(work_dir) / "served.npz"
    loaded = subprocess.run(
        [sys.executable, "-c", LOADER, str(export), json.dumps(texts), str(served)],
        cwd=work_dir,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        | {"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    return dict(np.load(served))


def test_saved_model_serves_raw_strings_without_cloze(minilm, golden, tmp_path):
    source, encoder = minilm
    export = tmp_path / "saved_model"
    result = run(
        ["--from=hf", "--to=saved_model", f"--input_dir={source}", f"--output_dir={export}"],
        command_line=True,
    )
    assert "mapped 103 source variables onto 79 Cloze variables" in result.stdout
    assert (export / "saved_model.pb").exists() and (export / "assets" / "vocab.txt").exists()
    has_b = golden["has_second"]
    texts = {
        "single": [str(a) for a, b in zip(golden["first"], has_b) if not b],
        "first": [str(a) for a, b in zip(golden["first"], has_b) if b],
        "second": [str(s) for s, b in zip(golden["second"], has_b) if b],
    }
    got = serve_without_cloze(export, texts, tmp_path)

    tokenizer = tokenization.FullTokenizer(source / "vocab.txt", do_lower_case=True)
    offsets = np.concatenate([[0], np.cumsum(golden["input_mask"].sum(1))])
    rows = {"single": np.flatnonzero(~has_b), "pair": np.flatnonzero(has_b)}
    diffs = {}
    for kind, golden_rows in rows.items():
        # The in-graph tokenizer gives FullTokenizer's ids (so the golden ones).
        firsts = texts["single"] if kind == "single" else texts["first"]
        seconds = [None] * len(firsts) if kind == "single" else texts["second"]
        encoded = [encode(tokenizer, a, b) for a, b in zip(firsts, seconds)]
        length = got[f"{kind}_input_ids"].shape[1]
        np.testing.assert_array_equal(
            got[f"{kind}_input_ids"], pad([e[0] for e in encoded], length)
        )
        np.testing.assert_array_equal(
            got[f"{kind}_segment_ids"], pad([e[1] for e in encoded], length)
        )
        # Cloze in this process on the same ids: the SavedModel computes the same numbers.
        inputs = {k: got[f"{kind}_{k}"] for k in ("input_ids", "input_mask", "segment_ids")}
        ours = encoder(inputs)
        real = inputs["input_mask"].astype(bool)
        for key in ("sequence_output", "pooled_output"):
            a, b = got[f"{kind}_{key}"], np.array(ours[key])
            diff = (
                np.abs(a[real] - b[real]).max() if key == "sequence_output" else np.abs(a - b).max()
            )
            diffs[f"{kind} {key} vs Cloze"] = diff
        # And PyTorch's numbers on the golden sentences.
        for j, g in enumerate(golden_rows):
            n = int(golden["input_mask"][g].sum())
            last = golden["hidden_states"][-1, offsets[g] : offsets[g] + n]  # (n, 32)
            seq = got[f"{kind}_sequence_output"][j, :n][:, golden["features"]]
            diffs[f"{kind} row {j} last layer vs pytorch"] = np.abs(seq - last).max()
            diffs[f"{kind} row {j} pooled vs pytorch"] = np.abs(
                got[f"{kind}_pooled_output"][j] - golden["pooled_output"][g]
            ).max()
    for key in ("pooled_output", "sequence_output"):
        np.testing.assert_array_equal(got[f"ids_{key}"], got[f"single_{key}"])
    print("\nSavedModel max abs differences:")
    for name, value in diffs.items():
        print(f"  {name}: {value:.2e}")
    for name, value in diffs.items():
        # Against Cloze too only within TOLERANCE: the saved graph is optimised (fused ops)
        # differently from eager execution, which moves the last bits.
        assert value < TOLERANCE, f"{name}: {value}"


def test_roberta_saved_model_tokenizes_its_byte_level_bpe_in_the_graph(tmp_path):
    """--to=saved_model from a folder with a RoBERTa's vocab.json + merges.txt (no vocab.txt):
    the graph tokenizes with the BPE (keras-hub's BytePairTokenizer, saved as TensorFlow and
    tensorflow-text ops: loaded here without Cloze), frames `<s> a </s>` and
    `<s> a </s></s> b </s>` in one segment, pads with <pad>, and its ids are Hugging Face
    `tokenizers`' RobertaProcessing encoding (cased); the encoder's outputs equal Cloze's on
    the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    conv, export = tmp_path / "conv", tmp_path / "saved_model"
    helpers.roberta_bpe_folder(conv)
    config = helpers.tiny_config(
        vocab_size=50261, position_offset=2, type_vocab_size=1, max_position_embeddings=40,
        layer_norm_eps=1e-5,
    )  # fmt: skip
    keras.utils.set_random_seed(3)
    encoder = bert.BertEncoder(config)
    encoder.build()
    checkpoints.save_cloze(encoder, conv)
    (conv / "bert_config.json").write_text(config.to_json_string())
    args = ["--from=cloze", "--to=saved_model", f"--input_dir={conv}", f"--output_dir={export}"]
    result = helpers.run_main("convert_checkpoint.py", [*args, "--max_seq_length=16"])
    assert result.returncode == 0, result.stderr[-4000:]
    assert {p.name for p in (export / "assets").iterdir()} == {"vocab.json", "merges.txt"}
    texts = {
        "single": ["Hello world!", "Naïve café, 東京 and a much longer sentence than sixteen ids"],
        "first": ["It's fine.", "A first text that is long enough to be trimmed by the pair"],
        "second": ["SO is the second.", "short"],
    }
    got = serve_without_cloze(export, texts, tmp_path)  # nor keras-hub's code

    # The reference: Hugging Face tokenizers' byte-level BPE and RobertaProcessing, truncated
    # to 16 with the longest text losing tokens first, as the original _truncate_seq_pair.
    vocab = json.loads((conv / "vocab.json").read_text())
    hf = Tokenizer(models.BPE.from_file(str(conv / "vocab.json"), str(conv / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    hf.enable_truncation(16, strategy="longest_first")
    for kind, pairs in (
        ("single", [(a, None) for a in texts["single"]]),
        ("pair", list(zip(texts["first"], texts["second"]))),
    ):
        want = [hf.encode(a, b).ids for a, b in pairs]
        width = max(len(w) for w in want)
        assert got[f"{kind}_input_ids"].shape[1] == width
        for row, ids in enumerate(want):
            assert got[f"{kind}_input_ids"][row].tolist() == ids + [vocab["<pad>"]] * (
                width - len(ids)
            ), (kind, row)
            assert got[f"{kind}_input_mask"][row].tolist() == [1] * len(ids) + [0] * (
                width - len(ids)
            )
        assert not got[f"{kind}_segment_ids"].any()
        inputs = {k: got[f"{kind}_{k}"] for k in ("input_ids", "input_mask", "segment_ids")}
        ours = encoder(inputs)
        real = inputs["input_mask"].astype(bool)
        seq = np.asarray(ours["sequence_output"])
        assert np.abs(got[f"{kind}_sequence_output"][real] - seq[real]).max() < TOLERANCE
    assert max(len(r) for r in got["single_input_ids"]) == 16  # the long text was cut
    # Lower-casing only when asked: the same folder with --do_lower_case gives other ids.
    lower = tmp_path / "lower"
    result = helpers.run_main(
        "convert_checkpoint.py",
        [*args[:-1], f"--output_dir={lower}", "--max_seq_length=16", "--do_lower_case"],
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lowered = tf.saved_model.load(str(lower)).signatures["serving_default"]
    ids = lowered(text=tf.constant(["SO is"]))["input_ids"].numpy()[0].tolist()
    assert ids == hf.encode("so is").ids
    # Refused before anything is written: more positions than the config has, and a BPE
    # vocabulary with ids beyond the embedding table.
    nowhere = tmp_path / "refused"
    too_long = [*args[:-1], f"--output_dir={nowhere}", "--max_seq_length=39"]  # 38 after 2
    refused = helpers.run_main("convert_checkpoint.py", too_long)
    assert refused.returncode == 1 and "max_position_embeddings=40" in refused.stderr
    assert "--max_seq_length=39 plus position_offset=2" in refused.stderr
    assert not nowhere.exists()
    small = tmp_path / "small"
    shutil.copytree(conv, small)
    (small / "bert_config.json").write_text(config.replace(vocab_size=50000).to_json_string())
    args = [*args[:2], f"--input_dir={small}", f"--output_dir={nowhere}", "--max_seq_length=16"]
    refused = helpers.run_main("convert_checkpoint.py", args)
    assert refused.returncode == 1 and "vocab_size=50000 is smaller" in refused.stderr
    assert "50261 tokens" in refused.stderr and not nowhere.exists()


def test_saved_model_pair_truncation_is_the_originals(tmp_path):
    """serve_text_pair trims as the original _truncate_seq_pair: drop from the longer text
    (the second on ties) until both fit."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(48)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    model = checkpoints.build_model(helpers.tiny_config(), heads=True)
    s = 11
    module = checkpoints.serving_module(model, tmp_path / "vocab.txt", True, s)
    tokenizer = tokenization.FullTokenizer(tmp_path / "vocab.txt")
    for la, lb in [(2, 12), (12, 2), (7, 7), (3, 4), (6, 5), (0, 9)]:
        a = " ".join(f"w{i}" for i in range(la))
        b = " ".join(f"w{i + 20}" for i in range(lb))
        out = module.serve_text_pair(tf.constant([a]), tf.constant([b]))
        ta, tb = tokenizer.tokenize(a), tokenizer.tokenize(b)
        while len(ta) + len(tb) > s - 3:  # the original's loop
            (ta if len(ta) > len(tb) else tb).pop()
        want = tokenizer.convert_tokens_to_ids(["[CLS]", *ta, "[SEP]", *tb, "[SEP]"])
        assert out["input_ids"].numpy()[0].tolist() == want, (la, lb)
        assert set(out) >= {"nsp_logits", "pooled_output", "sequence_output"}
        single = module.serve_text(tf.constant([" ".join([a, b])]))
        assert single["input_ids"].shape[1] == min(la + lb + 2, s)  # [CLS] text [SEP], cut at S


class TinyClassifier(keras.Model):
    """A stand-in task model: the contract export_saved_model asks of one (an `encoder`, a call
    on the three input features)."""

    def __init__(self, config):
        super().__init__()
        self.encoder = bert.BertEncoder(config)
        self.head = keras.layers.Dense(3)

    def call(self, inputs, training=False):
        return {"logits": self.head(self.encoder(inputs, training=training)["pooled_output"])}


def test_saved_model_returns_the_task_outputs(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(48)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = helpers.tiny_config()
    model = TinyClassifier(config)
    inputs = random_inputs(config)
    del inputs["masked_lm_positions"]
    want = np.array(model(inputs)["logits"])
    module = checkpoints.serving_module(model, tmp_path / "vocab.txt", True, 16)
    got = module.serve_ids(
        *(tf.constant(inputs[k]) for k in ("input_ids", "input_mask", "segment_ids"))
    )
    np.testing.assert_allclose(got["logits"].numpy(), want, atol=1e-6)
    assert got["pooled_output"].shape == (3, 12)


@pytest.fixture
def tf1_folder(tmp_path):
    """An original-layout release folder of the tiny config: bert_model.ckpt with heads and
    optimizer slots, bert_config.json, vocab.txt."""
    folder = tmp_path / "release"
    folder.mkdir()
    config = helpers.tiny_config()
    weights = random_arrays(original_tf1_shapes(config))
    slots = {f"{n}/adam_m": np.zeros_like(v) for n, v in weights.items()}
    write_tf1_checkpoint(folder / "bert_model.ckpt", weights | slots)
    (folder / "bert_config.json").write_text(config.to_json_string())
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(48)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder, config


def test_tf1_release_to_hf_and_back(tf1_folder, tmp_path):
    folder, config = tf1_folder
    out = tmp_path / "hf"
    result = run(["--from=tf1_bert", "--to=hf", f"--input_dir={folder}", f"--output_dir={out}"])
    assert "not converted (optimizer state and step counter)" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    from_tf1, _ = checkpoints.load_tf1_bert(folder, config)
    from_hf, report = checkpoints.load_hf_bert(
        out, checkpoints.read_any_config(out / "config.json")
    )
    assert report.heads and from_hf.config == config
    inputs = random_inputs(config)
    for a, b in zip(from_tf1(inputs).values(), from_hf(inputs).values()):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_failed_runs_write_nothing(tf1_folder, tmp_path):
    folder, config = tf1_folder
    deeper = tmp_path / "deeper.json"
    deeper.write_text(config.replace(num_hidden_layers=3).to_json_string())
    out = tmp_path / "out"
    result = run(
        [
            "--from=tf1_bert",
            "--to=cloze",
            f"--input_dir={folder}",
            f"--bert_config_file={deeper}",
            f"--output_dir={out}",
        ],
        check=False,
    )
    assert result.returncode == 1
    assert "bert/encoder/layer_2/attention/self/query/kernel: missing" in result.stderr
    assert "Traceback" not in result.stderr and "nothing was written" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deeper.json", "release"]

    out.mkdir()
    (out / "mine.txt").write_text("keep")
    result = run(
        ["--from=tf1_bert", "--to=cloze", f"--input_dir={folder}", f"--output_dir={out}"],
        check=False,
    )
    assert result.returncode == 1 and "non-empty" in result.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_real_minilm_to_keras_hub(minilm, golden, tmp_path):
    """MiniLM's exact GELU is refused for keras-hub unless approximated; approximated, the
    preset loads in keras-hub and computes Cloze's numbers for the same weights with the tanh
    GELU (within TOLERANCE), and its tokenizer gives the golden ids."""
    keras_hub = pytest.importorskip("keras_hub")
    source, encoder = minilm
    from data_prep.errors import InputError

    # Without the flag the command stops at the config (before loading), with this message.
    refusal = (
        r"config.json: hidden_act: expected one of \['gelu', 'gelu_new'\].*"
        r"found 'gelu_exact'; pass --allow_gelu_approximation"
    )
    with pytest.raises(InputError, match=refusal):
        checkpoints.check_keras_hub_config(encoder.config, str(source / "config.json"))
    preset = tmp_path / "preset"
    args = ["--from=hf", "--to=keras_hub", f"--input_dir={source}", f"--output_dir={preset}"]
    result = run([*args, "--allow_gelu_approximation"])
    assert "computes the tanh approximation of GELU" in result.stdout
    assert sorted(str(p.relative_to(preset)) for p in preset.rglob("*") if p.is_file()) == [
        "assets/tokenizer/vocabulary.txt",
        "config.json",
        "metadata.json",
        "model.weights.h5",
        "tokenizer.json",
    ]
    backbone = keras_hub.models.BertBackbone.from_preset(str(preset))
    tokenizer = keras_hub.models.BertTokenizer.from_preset(str(preset))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    for g in np.flatnonzero(~golden["has_second"]):
        n = int(golden["input_mask"][g].sum())
        ids = np.array(tokenizer(str(golden["first"][g]))).tolist()
        assert [cls, *ids, sep] == golden["input_ids"][g, :n].tolist()  # Hugging Face's ids
    inputs = golden_inputs(golden, tokenization.FullTokenizer(source / "vocab.txt"))
    theirs = {
        k: np.array(v)
        for k, v in backbone(
            {
                "token_ids": inputs["input_ids"],
                "segment_ids": inputs["segment_ids"],
                "padding_mask": inputs["input_mask"],
            }
        ).items()
    }
    tanh_twin = bert.BertEncoder(encoder.config.replace(hidden_act="gelu"))
    tanh_twin.build()
    tanh_twin.set_weights(encoder.get_weights())
    real = inputs["input_mask"].astype(bool)
    diffs = {}
    for name, model in (("tanh GELU", tanh_twin), ("exact GELU", encoder)):
        ours = model(inputs)
        diffs[name] = (
            np.abs(theirs["sequence_output"][real] - np.array(ours["sequence_output"])[real]).max(),
            np.abs(theirs["pooled_output"] - np.array(ours["pooled_output"])).max(),
        )
    print("\nkeras-hub MiniLM preset, max abs difference (sequence, pooled) vs Cloze with:")
    for name, (seq, pooled) in diffs.items():
        print(f"  {name}: {seq:.2e}, {pooled:.2e}")
    assert max(diffs["tanh GELU"]) < TOLERANCE, diffs
    # What --allow_gelu_approximation costs against the real model: visible, but small.
    assert TOLERANCE < diffs["exact GELU"][0] < 2e-2, diffs


def test_tf1_release_to_keras_hub_and_back(tf1_folder, tmp_path):
    """A keras-hub preset (written here from an original-layout release) read back by the
    command line into a Cloze checkpoint: the same weights, the preset's vocab."""
    folder, config = tf1_folder
    original, _ = checkpoints.load_tf1_bert(folder, config)
    preset = tmp_path / "preset"
    preset.mkdir()
    checkpoints.export_keras_hub(original, preset, folder / "vocab.txt")
    assert checkpoints.keras_hub_lowercase(preset) is True
    out = tmp_path / "cloze"
    result = run(["--from=keras_hub", "--to=cloze", f"--input_dir={preset}", f"--output_dir={out}"])
    assert "mapped 39 source variables onto 31 Cloze variables" in result.stdout
    assert (out / "vocab.txt").read_text() == (folder / "vocab.txt").read_text()
    back, _ = checkpoints.load_cloze(out, bert.BertConfig.from_json_file(out / "bert_config.json"))
    want = checkpoints.cloze_variables(original.encoder)
    for name, variable in checkpoints.cloze_variables(back).items():
        np.testing.assert_array_equal(variable.numpy(), want[name].numpy(), err_msg=name)


def test_original_albert_and_electra_releases_to_cloze(tmp_path):
    """--from=tf1_albert and --from=tf1_electra on checkpoints with the original names; the
    Cloze folders they write initialise run scripts' encoders and convert back (--from=cloze
    --to=tf1_albert / tf1_electra) to the same variables by name and value. BERT-only outputs
    are refused."""
    from modeling import albert, electra
    from tests.test_albert import TINY as ALBERT_TINY
    from tests.test_albert import original_tf1_names
    from tests.test_electra import TINY as ELECTRA_TINY
    from tests.test_electra import original_electra_names
    from training import trainer

    releases = {
        "albert": (albert.AlbertConfig(**ALBERT_TINY), original_tf1_names, "model.ckpt-best"),
        "electra": (electra.ElectraConfig(**ELECTRA_TINY), original_electra_names, "electra"),
    }
    written = {}
    for name, (config, names, prefix) in releases.items():
        folder = tmp_path / name
        written[name] = random_arrays(names(config))
        write_tf1_checkpoint(folder / prefix, written[name])
        (folder / "checkpoint").write_text(f'model_checkpoint_path: "{prefix}"\n')
        (folder / f"{name}_config.json").write_text(config.to_json_string())
    refused = run(
        ["--from=tf1_electra", "--to=tf1_bert", f"--input_dir={tmp_path / 'electra'}",
         f"--output_dir={tmp_path / 'bert'}"],
        check=False,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert "a format for this ELECTRA model" in refused.stderr
    assert "--to=tf1_bert, which holds BERT models only" in refused.stderr
    assert not (tmp_path / "bert").exists()
    # One run at a time: run_main parses the global absl flags.
    results = {
        name: run(
            [
                f"--from=tf1_{name}",
                "--to=cloze",
                f"--input_dir={tmp_path / name}",
                f"--output_dir={tmp_path / f'{name}_cloze'}",
            ]
        )
        for name in releases
    }
    for name, (config, names, _) in releases.items():
        out = tmp_path / f"{name}_cloze"
        assert f"mapped {len(names(config))} source variables" in results[name].stdout
        classifier = finetuning.BertClassifier(
            json.loads((out / "bert_config.json").read_text()), 2
        )
        classifier.build()
        assert trainer.init_from_checkpoint(classifier, str(out))[1] == "encoder"

    # And back: --from=cloze tells ALBERT and ELECTRA by their config's keys, and --to=tf1_albert /
    # tf1_electra writes the original names with the original values, every one of them.
    for name in releases:
        run(
            ["--from=cloze", f"--to=tf1_{name}", f"--input_dir={tmp_path / f'{name}_cloze'}",
             f"--output_dir={tmp_path / f'{name}_tf1'}"]
        )  # fmt: skip
    for name, (config, _, _) in releases.items():
        out = tmp_path / f"{name}_tf1"
        reader = tf.train.load_checkpoint(str(out))  # through the `checkpoint` file
        shapes = reader.get_variable_to_shape_map()
        assert set(shapes) == set(written[name]), name
        for variable, value in written[name].items():
            np.testing.assert_array_equal(reader.get_tensor(variable), value, err_msg=variable)
        assert json.loads((out / f"{name}_config.json").read_text()) == config.to_dict()


def test_saved_model_with_encoder_branches_serves_any_batch_as_one_pass(tf1_folder, tmp_path):
    # --encoder_branches=3: the exported encoder runs its layers in 3 row slices of whatever
    # batch it is served (1 and 2 leave slices empty, 5 is uneven); its outputs equal the
    # model's own in one pass (1e-5 absolute: float32 op orders of other row counts). Only
    # --to=saved_model takes it.
    folder, config = tf1_folder
    out = tmp_path / "served"
    run(
        [
            "--from=tf1_bert",
            "--to=saved_model",
            f"--input_dir={folder}",
            f"--output_dir={out}",
            "--max_seq_length=16",
            "--encoder_branches=3",
        ]
    )
    import tensorflow_text  # noqa: F401  (registers the exported tokenizer's ops)

    model, _ = checkpoints.load_tf1_bert(folder, config)
    served = tf.saved_model.load(str(out)).signatures["serve_ids"]
    graph = served.graph.as_graph_def()
    splits = [n for f in graph.library.function for n in f.node_def if n.op == "SplitV"]
    assert len(splits) >= 2, "the exported graph cuts no batch into branches"
    from bench import inference

    for n in (1, 2, 5):
        ids = {k: tf.constant(v) for k, v in inference.padded_batch(n, 8, 53, seed=n).items()}
        got = served(**ids)
        want = model.encoder(ids) if hasattr(model, "encoder") else model(ids)
        for key in ("sequence_output", "pooled_output"):
            np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=f"{key}, {n}")
    # With --remove_padding as well, each branch on its real tokens alone: the same outputs at
    # real positions, zeros at padding (where the model's own are not).
    unpadded = tmp_path / "unpadded"
    run(
        [
            "--from=tf1_bert",
            "--to=saved_model",
            f"--input_dir={folder}",
            f"--output_dir={unpadded}",
            "--max_seq_length=16",
            "--encoder_branches=3",
            "--remove_padding",
        ]
    )
    served = tf.saved_model.load(str(unpadded)).signatures["serve_ids"]
    padded_values = []  # the model's own outputs at padding positions
    for n in (1, 2, 5):
        batch = inference.padded_batch(n, 8, 53, seed=n)
        ids = {k: tf.constant(v) for k, v in batch.items()}
        got = served(**ids)
        want = model.encoder(ids) if hasattr(model, "encoder") else model(ids)
        real = batch["input_mask"].astype(bool)
        seq_got, seq_want = got["sequence_output"].numpy(), want["sequence_output"].numpy()
        np.testing.assert_allclose(seq_got[real], seq_want[real], atol=1e-5, err_msg=str(n))
        np.testing.assert_array_equal(seq_got[~real], 0)
        padded_values.extend(np.abs(seq_want[~real]).ravel())
        np.testing.assert_allclose(got["pooled_output"], want["pooled_output"], atol=1e-5)
    assert padded_values and max(padded_values) > 0  # there was padding, and it was skipped
    refused = run(
        [
            "--from=tf1_bert",
            "--to=cloze",
            f"--input_dir={folder}",
            f"--output_dir={tmp_path / 'no'}",
            "--remove_padding",
        ],
        check=False,
    )
    assert refused.returncode != 0
    assert "--remove_padding: an execution setting of --to=saved_model" in refused.stderr
    bad = run(
        [
            "--from=tf1_bert",
            "--to=cloze",
            f"--input_dir={folder}",
            f"--output_dir={tmp_path / 'no'}",
            "--encoder_branches=2",
        ],
        check=False,
    )
    assert bad.returncode != 0 and "--encoder_branches=2: expected 1, or more with" in bad.stderr
    assert not (tmp_path / "no").exists()
