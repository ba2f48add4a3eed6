"""extract_features.py on a tiny pretrained-checkpoint: the original JSON lines format, the compact
.npz form, their round trip, the values against the encoder itself, an ELECTRA discriminator's
features, bad input; run_ner.py's per-window encoder-output cache and its in-memory batches."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from data_prep import feature_files
from data_prep.tokenization import RESERVED_TOKENS
from modeling import bert, electra
from tests import helpers

WORDS = ["john", "lives", "in", "new", "york", "un", "##aff", "##able", "."]
LINES = ["John lives in New York.", "john ||| lives in york .", "", "john " * 12, "unaffable"]
S = 9


def run(args, command_line=False):
    """extract_features.py with `args` (helpers.run_script: in this process, or as a real
    command line, which the first run below keeps)."""
    return helpers.run_script("extract_features.py", args, command_line)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    d = tmp_path_factory.mktemp("features")
    (d / "vocab.txt").write_text("\n".join([*RESERVED_TOKENS, *WORDS]) + "\n")
    config = helpers.tiny_config(num_hidden_layers=3)
    (d / "bert_config.json").write_text(config.to_json_string())
    model = bert.BertPretrainer(config)
    model.build()
    prefix = tf.train.Checkpoint(model=model).save(str(d / "pretrain" / "ckpt"))
    (d / "input.txt").write_text("\n".join(LINES) + "\n")
    args = [
        f"--input_file={d / 'input.txt'}",
        f"--vocab_file={d / 'vocab.txt'}",
        f"--bert_config_file={d / 'bert_config.json'}",
        f"--init_checkpoint={d / 'pretrain'}",
        f"--max_seq_length={S}",
        "--batch_size=3",
    ]
    result = run([*args, "--layers=-1,-3", f"--output_file={d / 'out.jsonl'}",
                  f"--npz_file={d / 'out.npz'}"], command_line=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return {"dir": d, "model": model, "prefix": prefix, "args": args, "stderr": result.stderr}


def test_json_lines_in_the_original_format(extracted):
    records = [json.loads(x) for x in (extracted["dir"] / "out.jsonl").read_text().splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1, 2, 3, 4]
    tokens = [[f["token"] for f in r["features"]] for r in records]
    assert tokens[0] == ["[CLS]", "john", "lives", "in", "new", "york", ".", "[SEP]"]
    assert tokens[1] == ["[CLS]", "john", "[SEP]", "lives", "in", "york", ".", "[SEP]"]
    assert tokens[2] == ["[CLS]", "[SEP]"]
    assert tokens[3] == ["[CLS]", *["john"] * (S - 2), "[SEP]"]  # truncated as the original
    assert tokens[4] == ["[CLS]", "un", "##aff", "##able", "[SEP]"]
    layers = records[0]["features"][0]["layers"]
    assert [x["index"] for x in layers] == [-1, -3] and len(layers[0]["values"]) == 12
    values = [v for r in records for f in r["features"] for x in f["layers"] for v in x["values"]]
    assert all(round(v, 6) == v for v in values)
    assert "1 of 5 examples were longer than max_seq_length=9" in extracted["stderr"]
    # Its progress bar over the lines, done: count, rate, time left.
    assert re.search(r"extracting: 100%.* 5/5 \[[0-9:]+<00:00, .* lines/s\]", extracted["stderr"])


def test_npz_round_trips_with_the_json_lines_and_equals_the_encoder(extracted):
    d = extracted["dir"]
    from_json = list(feature_files.read_jsonl(d / "out.jsonl"))
    from_npz = list(feature_files.read_npz(d / "out.npz"))
    assert len(from_json) == len(from_npz) == len(LINES)
    for a, b in zip(from_json, from_npz):
        assert (a.linex_index, a.tokens, a.layers) == (b.linex_index, b.tokens, b.layers)
        assert b.values.dtype == np.float32 and b.values.shape == (len(b.tokens), 2, 12)
        np.testing.assert_allclose(a.values, b.values, rtol=0, atol=5.1e-7)  # 6-decimal rounding
    # Line 0 against the encoder run here: Transformer layer -1 is output 3, -3 is output 1.
    ids = np.array([[2, 5, 6, 7, 8, 9, 13, 3]], "int32")
    out = extracted["model"].encoder(
        {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
    )["encoder_outputs"]
    np.testing.assert_allclose(from_npz[0].values[:, 0], out[3][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(from_npz[0].values[:, 1], out[1][0], rtol=1e-5, atol=1e-5)
    with np.load(d / "out.npz", allow_pickle=False) as data:  # nothing pickled
        assert data["offsets"].tolist() == [0, 8, 16, 18, 27, 32]
        assert data["values"].shape == (32, 2, 12) and data["layers"].tolist() == [-1, -3]


def test_feature_writer_round_trip_without_a_model(tmp_path):
    rng = np.random.default_rng(0)
    items = [
        feature_files.LineFeatures(i, [f"t{j}" for j in range(n)],
                                   rng.normal(size=(n, 2, 3)).astype("float32"), (-1, -2))
        for i, n in enumerate([3, 1, 4])
    ]  # fmt: skip
    writer = feature_files.FeatureWriter(
        tmp_path / "f.jsonl", tmp_path / "f.npz", 8, 3, (-1, -2), 3
    )
    for item in items:
        writer.write(item)
    assert not (tmp_path / "f.npz").exists()  # complete only after close
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.jsonl", "f.npz"]
    for got in (feature_files.read_npz(tmp_path / "f.npz"),
                list(feature_files.read_jsonl(tmp_path / "f.jsonl"))):  # fmt: skip
        for a, b in zip(items, got):
            assert (a.linex_index, a.tokens, a.layers) == (b.linex_index, b.tokens, b.layers)
            np.testing.assert_allclose(a.values, b.values, atol=5.1e-7)


def test_bad_input_is_named(extracted, tmp_path):
    # (A --layers index outside the encoder is refused by tagging.transformer_layer_indices,
    # tests/test_tagging.py; checking it here would cost a TensorFlow start.)
    d = extracted["dir"]
    args = [a for a in extracted["args"] if not a.startswith("--input_file")]
    missing = tmp_path / "nope.txt"
    result = run([*args, f"--input_file={missing}", f"--output_file={tmp_path / 'x.jsonl'}"])
    assert result.returncode != 0 and f"{missing}: expected a readable file" in result.stderr
    assert not (tmp_path / "x.jsonl").exists() and (d / "out.jsonl").exists()


def test_an_electra_checkpoint_gives_its_discriminators_layers(extracted, tmp_path):
    # An ELECTRA config (its generator keys tell it from BERT's) builds the discriminator.
    cfg = electra.ElectraConfig(
        vocab_size=len(RESERVED_TOKENS) + len(WORDS), embedding_size=5, hidden_size=12,
        num_hidden_layers=3, num_attention_heads=3, intermediate_size=17,
        hidden_act="gelu_exact", max_position_embeddings=16, type_vocab_size=2,
        initializer_range=0.02, generator_hidden_size=0.25, generator_layers=1.0,
    )  # fmt: skip
    (tmp_path / "electra_config.json").write_text(cfg.to_json_string())
    model = electra.ElectraPretrainer(cfg)
    model.build()
    tf.train.Checkpoint(model=model).save(str(tmp_path / "electra" / "ckpt"))
    d = extracted["dir"]
    args = [a for a in extracted["args"] if not a.startswith(("--bert_config", "--init_ch"))]
    result = run([*args, f"--bert_config_file={tmp_path / 'electra_config.json'}",
                  f"--init_checkpoint={tmp_path / 'electra'}", "--layers=-1,0",
                  f"--npz_file={tmp_path / 'e.npz'}"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = feature_files.read_npz(tmp_path / "e.npz")[0]
    ids = np.array([[2, 5, 6, 7, 8, 9, 13, 3]], "int32")
    out = model.encoder(
        {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
    )["encoder_outputs"]  # the discriminator's: embeddings projected to 12, then 3 layers
    np.testing.assert_allclose(got.values[:, 0], out[3][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.values[:, 1], out[1][0], rtol=1e-5, atol=1e-5)
    assert (d / "out.npz").exists()


def test_layer_cache_is_read_only_for_the_same_checkpoint_config_and_windows(tmp_path):
    rng = np.random.default_rng(1)
    windows = {k: rng.integers(0, 9, (5, 7)).astype("int32")
               for k in ("input_ids", "input_mask", "segment_ids")}  # fmt: skip
    prefix = tmp_path / "ckpt-1"
    (tmp_path / "ckpt-1.index").write_bytes(b"index one")
    key = feature_files.cache_key(str(prefix), '{"hidden_size": 12}', windows)
    values = rng.normal(size=(5, 7, 4, 3)).astype("float32")
    path = tmp_path / "cache" / "train.npz"
    assert feature_files.read_layer_cache(path, key) is None  # nothing yet: compute
    feature_files.write_layer_cache(path, key, values)
    np.testing.assert_array_equal(feature_files.read_layer_cache(path, key), values)
    changed_ids = dict(windows, input_ids=windows["input_ids"] + 1)
    others = [
        feature_files.cache_key(str(prefix), '{"hidden_size": 13}', windows),
        feature_files.cache_key(str(prefix), '{"hidden_size": 12}', changed_ids),
        feature_files.cache_key(str(tmp_path / "ckpt-2"), '{"hidden_size": 12}', windows),
    ]
    (tmp_path / "ckpt-1.index").write_bytes(b"index two")  # the same prefix saved again
    others.append(feature_files.cache_key(str(prefix), '{"hidden_size": 12}', windows))
    assert len({key, *others}) == 5
    assert all(feature_files.read_layer_cache(path, k) is None for k in others)


def test_in_memory_batches_shuffle_rows_whole_and_resume_from_a_checkpoint(tmp_path):
    n = 7
    rows = {"x": np.arange(n * 3, dtype="float32").reshape(n, 3), "y": np.arange(n)}
    ds = feature_files.in_memory_training_batches(rows, 3, seed=4)
    it = iter(ds)
    seen = [next(it) for _ in range(7)]  # 21 rows: three epochs
    for b in seen:
        np.testing.assert_array_equal(b["x"].numpy(), rows["x"][b["y"].numpy()])  # rows whole
    first = np.concatenate([b["y"].numpy() for b in seen])[:n]
    assert sorted(first) == list(range(n)) and first.tolist() != list(range(n))
    fresh = feature_files.in_memory_training_batches(rows, 3, seed=4)
    again = np.concatenate([b["y"].numpy() for b in fresh.take(7)])
    np.testing.assert_array_equal(again[:n], first)  # same seed, same order
    it = iter(ds)
    next(it)
    ckpt = tf.train.Checkpoint(iterator=it)
    path = ckpt.save(str(tmp_path / "it"))
    expected = [next(it)["y"].numpy() for _ in range(3)]
    ckpt.restore(path)
    np.testing.assert_array_equal([next(it)["y"].numpy() for _ in range(3)], expected)
    shard = feature_files.in_memory_training_batches(rows, 2, seed=4, num_shards=2, shard_index=1)
    assert set(np.concatenate([b["y"].numpy() for b in shard.take(6)])) == {1, 3, 5}
