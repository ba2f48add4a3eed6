"""ELMo's biLM (modeling/elmo.py, training/bilm_tasks.py): options.json configs, character ids,
the char-CNN, the LSTMP cell against keras' LSTM, each direction's causality, padding, the
pretraining script and extract_features."""

import json

import keras
import numpy as np
import pytest

from data_prep.errors import InputError
from modeling import elmo, flops
from tests import helpers
from tests.conftest import ROOT
from training import bilm_tasks

V, B, S = 23, 3, 7  # odd sizes (shared/STYLE.md)
LSTM = {"dim": 17, "projection_dim": 5, "n_layers": 2, "cell_clip": 3, "proj_clip": 3}
CHAR_CNN = {
    "embedding": {"dim": 4},
    "filters": [[1, 3], [2, 5], [3, 7]],
    "n_highway": 2,
    "max_characters_per_token": 9,
    "n_characters": 262,
    "activation": "tanh",
}
# The keys and nesting of the published ELMo options.json (allennlp's 2x4096_512_2048cnn_2xhighway
# model): no n_tokens_vocab, since the released weights ship without the softmax.
PUBLISHED = {
    "lstm": {"use_skip_connections": True, "projection_dim": 512, "cell_clip": 3,
             "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "char_cnn": {"activation": "relu", "filters": [[1, 32], [2, 32], [3, 64], [4, 128],
                 [5, 256], [6, 512], [7, 1024]], "n_highway": 2, "embedding": {"dim": 16},
                 "n_characters": 262, "max_characters_per_token": 50},
}  # fmt: skip


def config(char_cnn=True, **changes) -> elmo.ElmoConfig:
    values = {"lstm": LSTM, "n_tokens_vocab": V, "dropout": 0.0, **changes}
    if char_cnn:
        values["char_cnn"] = CHAR_CNN
    return elmo.ElmoConfig.from_dict(values)


def tokens(n=V) -> list[str]:
    return ["[PAD]", "[SEP]", *[f"w{i}" + "##x" * (i % 3) for i in range(n - 2)]]


def lm(char_cnn=True, seed=0, **changes) -> elmo.ElmoLM:
    keras.utils.set_random_seed(seed)
    model = elmo.ElmoLM(config(char_cnn, **changes))
    model.build()
    model.encoder.set_char_table(tokens())
    return model


def ids(seed=1, shape=(B, S)):
    return np.random.default_rng(seed).integers(1, V, shape).astype("int32")


def test_published_options_json_loads_and_round_trips(tmp_path):
    c = elmo.ElmoConfig.from_dict(PUBLISHED, "options.json")
    assert c.char_cnn.num_filters == 2048 and c.output_dim == 1024 and c.n_tokens_vocab is None
    assert c.to_dict() == {**PUBLISHED, "dropout": 0.1, "bidirectional": True}
    again = elmo.ElmoConfig.from_dict(json.loads(c.to_json_string()))
    assert again == c and again.char_cnn.filters == ((1, 32), (2, 32), (3, 64), (4, 128),
                                                     (5, 256), (6, 512), (7, 1024))  # fmt: skip
    path = tmp_path / "options.json"
    path.write_text(config().to_json_string())
    assert elmo.ElmoConfig.from_json_file(path) == config()
    tiny = elmo.ElmoConfig.from_json_file(ROOT / "configs" / "elmo_tiny.json")
    assert tiny.n_tokens_vocab == 7873 and tiny.lstm.n_layers == 2  # the default run's vocab
    token_only = config(char_cnn=False)
    assert "char_cnn" not in token_only.to_dict()
    assert elmo.ElmoConfig.from_dict(token_only.to_dict()) == token_only


@pytest.mark.parametrize(
    "values, message",
    [
        ({**PUBLISHED, "n_token_vocab": 5}, "options.json: unknown key(s) ['n_token_vocab']"),
        ({**PUBLISHED, "lstm": {**PUBLISHED["lstm"], "dims": 3}}, "options.json: lstm: unknown"),
        (
            {**PUBLISHED, "char_cnn": {**PUBLISHED["char_cnn"], "embedding": {"dim": 4, "x": 1}}},
            "options.json: char_cnn.embedding: unknown key(s) ['x']",
        ),
        ({"lstm": PUBLISHED["lstm"]}, "needs the vocabulary size"),
        ({**PUBLISHED, "lstm": {"dim": 4}}, "lstm: missing key(s) ['projection_dim', 'n_layers']"),
        ({**PUBLISHED, "char_cnn": {**CHAR_CNN, "filters": [[10, 2]]}}, "exceeds max_char"),
        ({**PUBLISHED, "char_cnn": {**CHAR_CNN, "filters": [[1.5, 2]]}}, "[width, count]"),
        ({**PUBLISHED, "char_cnn": {**CHAR_CNN, "n_characters": 100}}, "at least 262"),
        ({**PUBLISHED, "bidirectional": False}, "only true"),
        ({**PUBLISHED, "dropout": 1.0}, "dropout: expected a rate"),
    ],
)
def test_bad_options_are_refused_naming_the_section(values, message):
    with pytest.raises(InputError, match="options.json") as e:
        elmo.ElmoConfig.from_dict(values, "options.json")
    assert message in str(e.value)
    assert not elmo.is_elmo_config({"n_vocab": 5}) and elmo.is_elmo_config(PUBLISHED)


def test_character_ids_follow_bilm_tf_shifted_by_one():
    # bilm-tf: begin-of-word 258, bytes, end-of-word 259, padding 260; +1 as the published
    # weights (tests/test_elmo_convert.py checks them against AllenNLP's own mapper)
    assert elmo.token_char_ids("ab", 6) == [259, 98, 99, 260, 261, 261]
    assert elmo.token_char_ids("é", 5) == [259, 0xC3 + 1, 0xA9 + 1, 260, 261]  # UTF-8 bytes
    assert elmo.token_char_ids("##abcdef", 5) == [259, 36, 36, 98, 260]  # cut to C - 2 bytes
    # the sentence markers: bilm-tf's characters 256 and 257 between the word markers
    assert elmo.token_char_ids("<S>", 5) == [259, 257, 260, 261, 261]
    assert elmo.token_char_ids("</S>", 5) == [259, 258, 260, 261, 261]
    table = elmo.vocab_char_table(["a", "bc", "d"], 4)
    assert table.dtype == np.int32 and table.shape == (3, 4)
    assert table[1].tolist() == [259, 99, 100, 260]


def test_char_cnn_shapes_and_round_trip():
    c = config()
    layer = elmo.CharCnnEncoder(c.char_cnn, 11)
    layer.build()
    chars = np.random.default_rng(0).integers(0, 262, (B, S, 9)).astype("int32")
    out = layer(chars)
    assert tuple(out.shape) == (B, S, 11)
    # Each token's vector depends on its own characters only.
    other = chars.copy()
    other[1, 4] = (other[1, 4] + 7) % 262
    changed = np.abs(np.asarray(layer(other)) - np.asarray(out)).max(axis=-1)
    assert changed[1, 4] > 0 and np.delete(changed.reshape(-1), 1 * S + 4).max() == 0
    clone = elmo.CharCnnEncoder.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config() and clone.char_cnn == c.char_cnn
    # 1 + 2 + 3 filter widths over E=4: conv kernels (w, E, n), 2 highway layers of F=15
    assert sum(int(np.prod(w.shape)) for w in layer.trainable_weights) == (
        262 * 4 + (1 * 4 * 3 + 3) + (2 * 4 * 5 + 5) + (3 * 4 * 7 + 7)
        + 2 * 2 * (15 * 15 + 15) + (15 * 11 + 11)
    )  # fmt: skip


def test_lstmp_cell_without_projection_or_clipping_equals_keras_lstm():
    """With P = H, the projection the identity and no clipping, LSTMP is a plain LSTM: keras'
    LSTM (gates i, f, c, o) with the same weights, TF1's forget bias of 1 moved into the bias."""
    h, d = 6, 5
    cell = elmo.LstmpCell(h, h)
    rnn = keras.layers.RNN(cell, return_sequences=True)
    rnn.build((None, None, d))
    rng = np.random.default_rng(0)
    kernel, recurrent = rng.normal(size=(d, 4 * h)), rng.normal(size=(h, 4 * h)) * 0.5
    bias = rng.normal(size=(4 * h,))
    cell.kernel.assign(kernel)
    cell.recurrent_kernel.assign(recurrent)
    cell.bias.assign(bias)
    cell.projection.assign(np.eye(h))
    reference = keras.layers.LSTM(h, return_sequences=True)
    reference.build((None, None, d))

    def reorder(w):  # TF1's i, j, f, o -> keras' i, f, c(=j), o
        i, j, f, o = np.split(w, 4, axis=-1)
        return np.concatenate([i, f, j, o], axis=-1)

    keras_bias = reorder(bias)
    keras_bias[h : 2 * h] += 1.0  # TF1's forget_bias
    reference.set_weights([reorder(kernel), reorder(recurrent), keras_bias])
    x = rng.normal(size=(B, S, d)).astype("float32")
    np.testing.assert_allclose(rnn(x), reference(x), atol=1e-5)
    clone = elmo.LstmpCell.from_config(elmo.LstmpCell(7, 3, 2.0, 1.5).get_config())
    assert (clone.units, clone.projection_dim, clone.cell_clip, clone.proj_clip) == (7, 3, 2, 1.5)


def test_clipping_bounds_the_states():
    cell = elmo.LstmpCell(4, 3, cell_clip=0.5, proj_clip=0.25)
    cell.build((None, 2))
    cell.kernel.assign(np.full((2, 16), 5.0))
    h, (h2, c) = cell(np.ones((B, 2), "float32"), [np.zeros((B, 3)), np.full((B, 4), 9.0)])
    assert np.abs(np.asarray(c)).max() == pytest.approx(0.5)
    assert np.abs(np.asarray(h)).max() <= 0.25 + 1e-7


@pytest.mark.parametrize("char_cnn", [True, False])
def test_each_direction_sees_only_its_side(char_cnn):
    """Perturb token k: forward states before k and backward states after k are unchanged, in
    every layer; the others change (the token layer only at k)."""
    model = lm(char_cnn)
    x = ids()
    base = model.encoder({"input_ids": x})
    for k in (0, 3, S - 1):
        y = x.copy()
        y[:, k] = x[:, k] % (V - 1) + 1  # another id in 1..V-1
        assert (y[:, k] != x[:, k]).all()
        out = model.encoder({"input_ids": y})
        for name in ("forward", "backward"):
            for before, after in zip(base[name], out[name]):
                diff = np.abs(np.asarray(before) - np.asarray(after)).max(axis=(0, 2))  # (S,)
                same = range(k) if name == "forward" else range(k + 1, S)
                seen = range(k, S) if name == "forward" else range(k + 1)
                assert all(diff[t] == 0 for t in same), (name, k, diff)
                assert all(diff[t] > 0 for t in seen), (name, k, diff)
        token_diff = np.abs(np.asarray(base["token"]) - np.asarray(out["token"])).max(axis=(0, 2))
        assert token_diff[k] > 0 and np.delete(token_diff, k).max() == 0
    logits = model({"input_ids": x})
    assert (
        tuple(logits["forward_logits"].shape) == (B, S, V) == tuple(logits["backward_logits"].shape)
    )


def test_right_padding_changes_no_real_position():
    model = lm(seed=2)
    x = ids(3)
    n = 4
    short = elmo.elmo_layer_outputs(model, x[:, :n])
    padded = x.copy()
    padded[:, n:] = 0
    mask = (np.arange(S)[None] < n).astype("int32").repeat(B, 0)
    full = elmo.elmo_layer_outputs(model, padded, mask)
    assert len(full) == 3 and tuple(full[0].shape) == (B, S, 10)  # L + 1 layers of 2 P
    for a, b in zip(short, full):
        np.testing.assert_allclose(np.asarray(b)[:, :n], a, atol=1e-6)
        assert np.abs(np.asarray(b)[:, n:]).max() == 0
    out = model.encoder({"input_ids": x})
    layers = elmo.elmo_layer_outputs(model, x)
    np.testing.assert_array_equal(layers[0], np.concatenate([out["token"]] * 2, -1))
    np.testing.assert_array_equal(layers[2][..., 5:], out["backward"][1])


def test_skip_connection_adds_the_layer_input():
    model = lm(seed=4)
    x = ids(5)
    bilm = model.encoder
    out = bilm({"input_ids": x})
    second = bilm.forward_1(out["forward"][0])
    np.testing.assert_allclose(out["forward"][1], second + out["forward"][0], atol=1e-6)
    plain = lm(seed=4, lstm={**LSTM, "use_skip_connections": False}).encoder
    plain_out = plain({"input_ids": x})
    np.testing.assert_allclose(plain_out["forward"][1], second, atol=1e-6)


def test_bilm_sums_score_the_next_and_the_previous_token():
    rng = np.random.default_rng(0)
    fwd = rng.normal(size=(B, S, V)).astype("float32")
    bwd = rng.normal(size=(B, S, V)).astype("float32")
    x = ids(7)
    sums = {k: float(v) for k, v in bilm_tasks.bilm_sums(fwd, bwd, x).items()}

    def nll(logits, target):
        logits = logits.astype(np.float64)
        return np.log(np.exp(logits).sum()) - logits[target]

    f = sum(nll(fwd[b, t], x[b, t + 1]) for b in range(B) for t in range(S - 1))
    g = sum(nll(bwd[b, t], x[b, t - 1]) for b in range(B) for t in range(1, S))
    assert sums["forward_loss_sum"] == pytest.approx(f, rel=1e-5)
    assert sums["backward_loss_sum"] == pytest.approx(g, rel=1e-5)
    assert sums["forward_weight"] == sums["backward_weight"] == B * (S - 1)
    assert sums["loss_sum"] == pytest.approx(f + g, rel=1e-5)
    assert sums["weight"] == 2 * B * (S - 1)


@pytest.mark.parametrize("char_cnn", [True, False], ids=["char_cnn", "token_embedding"])
def test_lm_terms_equal_the_logits_path_in_loss_and_every_gradient(char_cnn):
    # ElmoLM's lm_terms (heads.tied_xent_and_hits on the shared softmax, without the (B, S, V)
    # logits of either direction) against bilm_sums of both directions' logits, the path they
    # replace in training: the same sums and gradients to every weight.
    model = lm(char_cnn)
    x = ids(7)

    def fast():
        out = model({"input_ids": x}, lm_terms=True)
        assert "forward_logits" not in out and out["backward_xent"].shape == (B, S - 1)
        terms = (out[f"{d}_{k}"] for d in ("forward", "backward") for k in ("xent", "hits"))
        sums = bilm_tasks.bilm_sums_of(*terms)
        return sums, sums["loss_sum"]

    def plain():
        out = model({"input_ids": x})
        sums = bilm_tasks.bilm_sums(out["forward_logits"], out["backward_logits"], x)
        return sums, sums["loss_sum"]

    helpers.check_loss_paths_agree(model, fast, plain)


def test_models_round_trip_their_configs():
    model = lm()
    clone = elmo.ElmoLM.from_config(model.get_config())
    assert clone.get_config() == model.get_config() and clone.config == model.config
    features = elmo.ElmoFeatures(config(), layers=(-1, 0))
    assert features.indices == [2, 0]
    again = elmo.ElmoFeatures.from_config(features.get_config())
    assert again.get_config() == features.get_config()
    bilm = elmo.ElmoBiLM.from_config(model.encoder.get_config())
    assert bilm.config == model.config
    with pytest.raises(ValueError, match="outside an ELMo biLM's 3 representations"):
        elmo.feature_layer_indices([3], 2)
    with pytest.raises(ValueError, match="n_tokens_vocab is 23"):
        model.encoder.set_char_table(tokens(V + 1))


def test_features_are_the_chosen_layers_and_their_scalar_mix():
    model = lm(seed=6)
    features = elmo.ElmoFeatures(model.config, layers=(0, -1))
    features.build()
    for a, b in zip(features.encoder.weights, model.encoder.weights):
        a.assign(b)
    x = ids(8)
    out = np.asarray(features({"input_ids": x, "input_mask": np.ones_like(x)}))
    layers = elmo.elmo_layer_outputs(model, x)
    assert out.shape == (B, S, 3, 10)
    np.testing.assert_allclose(out[:, :, 0], layers[0], atol=1e-6)
    np.testing.assert_allclose(out[:, :, 1], layers[2], atol=1e-6)
    # As initialised, ScalarMix is the equal mix with gamma 1 (Peters et al. eq. 1).
    np.testing.assert_allclose(out[:, :, 2], (np.asarray(layers[0]) + layers[2]) / 2, atol=1e-6)
    features.scalar_mix.gamma.assign(3.0)
    features.scalar_mix.scalar_weights.assign([0.0, np.log(3.0)])
    out = np.asarray(features({"input_ids": x}))
    np.testing.assert_allclose(out[:, :, 2], 3 * (0.25 * np.asarray(layers[0]) + 0.75 * layers[2]),
                               atol=1e-5)  # fmt: skip


def test_two_replicas_train_as_one_device():
    """bilm_task under MirroredStrategy (two logical CPUs, the char table a mirrored int32
    variable) takes the steps one device takes."""
    import tensorflow as tf

    from training import optimization, trainer

    def train(strategy):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = elmo.ElmoLM(config())
            model.build()
            optimizer = optimization.create_optimizer(1e-2, 10, 1)
            optimizer.build(model.trainable_variables)
        model.encoder.set_char_table(tokens())
        fit = trainer.Trainer(strategy, bilm_tasks.bilm_task(model), optimizer)
        batch = tf.data.Dataset.from_tensors({"input_ids": ids(9, (4, S))}).repeat()
        fit.train_steps(iter(batch), 2)
        return [v.numpy() for v in model.trainable_variables]

    one = train(tf.distribute.OneDeviceStrategy("/cpu:0"))
    two = train(helpers.mirrored_strategy())
    assert max(np.abs(a - b).max() for a, b in zip(one, two)) < 1e-5
    assert max(np.abs(a - b).max() for a, b in zip(one, lm().trainable_variables)) > 1e-3


def run(script, *args):
    """`script` with `args` in this process (helpers.run_main): a new interpreter importing
    TensorFlow costs 7-9 s of CPU on 2 cores, and each script keeps its own command-line run
    in its own test file."""
    return helpers.run_main(script, args)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """WordPiece blocks from create_lm_data.py --vocab_file, then a char-CNN biLM pretrained by
    run_pretraining.py on them."""
    from data_prep.tokenization import RESERVED_TOKENS

    d = tmp_path_factory.mktemp("elmo")
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "##s", "."]
    vocab = [*RESERVED_TOKENS, *words]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    text = ["the cat sat on the mat .", "a dog ran .", "the cats sat .", "dogs ran on a mat ."]
    (d / "corpus.txt").write_text("\n\n".join(text * 3) + "\n")
    r = run(
        "data_prep/create_lm_data.py",
        f"--input_file={d / 'corpus.txt'}",
        f"--output_file={d / 'lm.tfrecord'}",
        f"--vocab_file={d / 'vocab.txt'}",
        "--block_size=9",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(12 documents" in r.stdout
    options = config(n_tokens_vocab=len(vocab))
    (d / "options.json").write_text(options.to_json_string())
    common = [
        f"--bert_config_file={d / 'options.json'}",
        f"--input_file={d / 'lm.tfrecord'}",
        f"--output_dir={d / 'out'}",
        "--max_seq_length=9",
        "--train_batch_size=3",
        "--eval_batch_size=3",
        "--num_warmup_steps=1",
        "--save_checkpoints_steps=20",
        "--iterations_per_loop=10",
        "--max_eval_steps=2",
        "--learning_rate=2e-2",
    ]
    r = run("run_pretraining.py", *common, "--num_train_steps=20", "--do_train", "--do_eval",
            f"--vocab_file={d / 'vocab.txt'}", "--peak_tflops=1e-4")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return {"dir": d, "vocab": vocab, "common": common, "config": options, "log": r.stderr}


def test_blocks_hold_the_wordpieces_with_sep_between_documents(pretrained):
    import tensorflow as tf

    from data_prep import lm_data

    blocks = [
        b["input_ids"].numpy().tolist()
        for b in lm_data.lm_dataset([str(pretrained["dir"] / "lm.tfrecord")], 1, 9, False)
    ]
    vocab = pretrained["vocab"]
    first = " ".join(vocab[i] for i in blocks[0][0])
    assert first == "the cat sat on the mat . [SEP] a"
    assert len(blocks) > 3 and {len(b[0]) for b in blocks} == {9}
    assert tf.reduce_all(tf.constant(blocks) < len(vocab))


def test_pretraining_lowers_both_directions_loss(pretrained):
    d = pretrained["dir"]
    results = dict(
        line.split(" = ") for line in (d / "out" / "eval_results.txt").read_text().splitlines()
    )
    first = json.loads((d / "out" / "eval_log.jsonl").read_text().splitlines()[0])
    assert int(results["global_step"]) == 20
    # The log's FLOP/s: 3 passes of modeling/flops.py's ELMo count (blocks of 9) per example,
    # and its share of --peak_tflops.
    per_example = 3 * flops.elmo_lm_flops(pretrained["config"], 9)
    helpers.check_logged_flops(pretrained["log"], per_example, per_example, peak_tflops=1e-4)
    for direction in ("forward", "backward"):
        loss = float(results[f"{direction}_lm_loss"])
        assert loss < first[f"{direction}_lm_loss"] - 0.3, (direction, loss, first)
        assert float(results[f"{direction}_perplexity"]) == pytest.approx(np.exp(loss), rel=1e-5)
    # A char-CNN config needs the strings it spells (refused before a model is built).
    common = [a for a in pretrained["common"] if not a.startswith("--output_dir")]
    r = run("run_pretraining.py", *common, f"--output_dir={d / 'x'}", "--do_train")
    assert r.returncode != 0 and "a char_cnn config needs --vocab_file" in r.stderr


def test_extract_features_writes_the_layers_and_the_elmo_vector(pretrained):
    import tensorflow as tf

    from data_prep import feature_files

    d = pretrained["dir"]
    (d / "input.txt").write_text("the cat sat .\ndogs ran\n")
    r = run(
        "extract_features.py",
        f"--input_file={d / 'input.txt'}",
        f"--vocab_file={d / 'vocab.txt'}",
        f"--bert_config_file={d / 'options.json'}",
        f"--init_checkpoint={d / 'out'}",
        "--max_seq_length=8",
        "--batch_size=3",
        f"--npz_file={d / 'f.npz'}",
        f"--output_file={d / 'f.jsonl'}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = list(feature_files.read_npz(d / "f.npz"))
    assert lines[0].tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert lines[1].tokens == ["[CLS]", "dog", "##s", "ran", "[SEP]"]
    assert lines[0].layers == (0, 1, 2, 3) and lines[0].values.shape == (6, 4, 10)
    # Against the pretrained biLM run here: the three representations, then their equal mix.
    model = elmo.ElmoLM(pretrained["config"])
    model.build()
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(str(d / "out")))
    vocab = {t: i for i, t in enumerate(pretrained["vocab"])}
    for line in lines:  # unpadded here; padded to --max_seq_length in the script
        x = np.array([[vocab[t] for t in line.tokens]], "int32")
        layers = [np.asarray(h)[0] for h in elmo.elmo_layer_outputs(model, x)]
        for k in range(3):
            np.testing.assert_allclose(line.values[:, k], layers[k], atol=1e-5)
        np.testing.assert_allclose(line.values[:, 3], sum(layers) / 3, atol=1e-5)
    from_json = list(feature_files.read_jsonl(d / "f.jsonl"))
    np.testing.assert_allclose(from_json[1].values, lines[1].values, atol=5.1e-7)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_classifier_under_mixed_precision_stays_near_float32(precision):
    """run_classifier's --precision with an ELMo config (char CNN, highway, LSTMs, scalar mix):
    float32 logits near the float32 model's and finite float32 gradients of the mix and head
    (helpers.check_classifier_at_precision); the frozen biLM has none in either."""
    x = np.random.default_rng(0).integers(5, V, (B, S)).astype("int32")
    mask = np.ones_like(x)
    mask[0, 5:] = 0

    def make():
        model = elmo.ElmoClassifier(config(), 2, dropout_rate=0.0)
        model.build()
        model.encoder.set_char_table(tokens())
        return model

    inputs = {"input_ids": x, "input_mask": mask}
    helpers.check_classifier_at_precision(make, inputs, np.array([0, 1, 1]), precision)


def test_classifier_learns_a_separable_task_on_the_frozen_bilm():
    """ElmoClassifier: only the scalar mix (w, gamma) and the softmax layer train; the biLM stays
    exactly as it was; a task told apart by one token is learned; the logits are the head on
    the mean over real tokens of the mix (padding changes nothing)."""
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    # A frozen random biLM: with 2 P = 10 features and the class token at two of the 7
    # positions, seed 3 separated the classes by luck, and after the 63rd session's character-id
    # change none of seeds 0-3 did in 60 steps; with 2 P = 32 and four positions all four do.
    lstm = {**LSTM, "projection_dim": 16}
    model = elmo.ElmoClassifier(config(lstm=lstm), 2, dropout_rate=0.0)
    model.build()
    model.encoder.set_char_table(tokens())
    trainable = sorted(v.path.split("/", 1)[1] for v in model.trainable_variables)
    assert trainable == [
        "classifier/dense/bias", "classifier/dense/kernel", "scalar_mix/gamma",
        "scalar_mix/scalar_weights",
    ]  # fmt: skip
    frozen = [v.numpy().copy() for v in model.encoder.weights]
    rng = np.random.default_rng(0)
    n = 27
    x = rng.integers(5, V, (n, S)).astype("int32")
    labels = np.arange(n) % 2
    x[:, 1:5] = np.where(labels == 1, 3, 4)[:, None]  # the one token that tells them apart
    mask = np.ones_like(x)
    mask[::3, 5:] = 0
    inputs = {"input_ids": x, "input_mask": mask}
    optimizer = keras.optimizers.Adam(0.05)
    for _ in range(60):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.reduce_mean(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    logits = np.asarray(model(inputs))
    assert (logits.argmax(-1) == labels).all(), float(loss)
    assert float(model.scalar_mix.gamma.numpy()) != 1.0
    for before, after in zip(frozen, model.encoder.weights):
        np.testing.assert_array_equal(before, after.numpy())
    # The same logits by hand: eq. 1 over the L + 1 layers, the mean over real tokens, the head.
    layers = [np.asarray(h) for h in elmo.elmo_layer_outputs(model.encoder, x, mask)]
    w = np.exp(model.scalar_mix.scalar_weights.numpy())
    w /= w.sum()
    mix = model.scalar_mix.gamma.numpy() * sum(wj * h for wj, h in zip(w, layers))
    m = mask[:, :, None].astype("float32")
    pooled = (mix * m).sum(1) / m.sum(1)
    expected = pooled @ model.classifier.weights[0].numpy() + model.classifier.weights[1].numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
    changed = dict(inputs, input_ids=np.where(mask == 1, x, 7).astype("int32"))
    np.testing.assert_allclose(model(changed), logits, atol=1e-5)
    clone = elmo.ElmoClassifier.from_config(model.get_config())
    assert clone.num_labels == 2 and clone.config == model.config


def test_run_classifier_trains_elmo_features_from_a_pretrained_bilm(pretrained, tmp_path):
    """run_classifier.py with the options.json as --bert_config_file: the pretraining
    checkpoint's biLM is loaded into the classifier, which learns the two-sentence task."""
    d = pretrained["dir"]
    r, out = helpers.run_classifier_on_two_sentences(
        tmp_path, d / "options.json", f"--vocab_file={d / 'vocab.txt'}",
        f"--init_checkpoint={d / 'out'}", "--max_seq_length=9", "--num_train_epochs=10",
        "--learning_rate=5e-2", "--iterations_per_loop=10", "--save_checkpoints_steps=30",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "initialised the encoder from" in r.stderr
    # The log's FLOP/s: the frozen biLM once, the classifier on the pooled mix (2 P wide, 2
    # classes) three times, at all 9 positions (ELMo's batches are not cut).
    config = elmo.ElmoConfig.from_dict(json.loads((d / "options.json").read_text()))
    per_example = flops.elmo_bilm_flops(config, 9) + 3 * 2 * config.output_dim * 2
    helpers.check_logged_flops(r.stderr, per_example, per_example)
    results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().split("\n")
                   if line)  # fmt: skip
    assert float(results["accuracy"]) == 1.0, results
    from data_prep import glue

    assert glue.read_submission(out / "SST-2.tsv") == [("4", "0"), ("8", "1")]
