"""XLNet: config, the two-stream properties (the query stream never sees its own content; the
factorisation order is respected in every layer), keras-hub's XLNet layers as an independent
implementation, serialisation, and pretraining + fine-tuning smoke runs."""

import json

import keras
import numpy as np
import pytest

from data_prep import permutation
from data_prep.errors import InputError
from modeling import flops, xlnet
from tests import helpers

# Odd sizes (shared/STYLE.md): vocab 29, length 7, d_model 12, 3 heads of depth 5 (N * D = 15,
# not d_model, so a swapped axis fails), inner 17, 2 layers.
TINY = dict(
    d_head=5,
    d_inner=17,
    d_model=12,
    ff_activation="gelu",
    n_head=3,
    n_layer=2,
    n_token=29,
    untie_r=True,
)
PLM_INPUTS = ("input_ids", "perm_mask", "target_mapping")


def tiny_config(**changes):
    return xlnet.XLNetConfig(**{**TINY, "dropout": 0.0, "dropatt": 0.0} | changes)


def perturbed(model, seed=0):
    """Non-zero biases and LayerNorm offsets everywhere, so a skipped or swapped one shows."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(w.numpy() + rng.normal(0, 0.1, w.shape).astype("float32"))
    return model


def tiny_pretrainer(**changes):
    keras.utils.set_random_seed(3)
    model = xlnet.XLNetPretrainer(tiny_config(**changes))
    model.build()
    return perturbed(model)


def ids(batch=3, length=7, seed=1):
    return np.random.default_rng(seed).integers(0, TINY["n_token"], (batch, length)).astype("int32")


def ranks(perm_mask):
    """The step of each position in the order: how many positions it may see."""
    return (1 - np.asarray(perm_mask)).sum(axis=-1).astype(int)  # (B, S)


def test_config_reads_the_released_file_and_refuses_unknown_keys(tmp_path):
    path = tmp_path / "xlnet_config.json"
    released = {  # xlnet_cased_L-12_H-768_A-12/xlnet_config.json, verbatim
        "d_head": 64,
        "d_inner": 3072,
        "d_model": 768,
        "ff_activation": "gelu",
        "n_head": 12,
        "n_layer": 12,
        "n_token": 32000,
        "untie_r": True,
    }
    path.write_text(json.dumps(released))
    config = xlnet.XLNetConfig.from_json_file(path)
    assert config.d_model == 768 and config.untie_r and config.dropout == 0.1
    assert xlnet.is_xlnet_config(released)
    assert xlnet.XLNetConfig.from_dict(json.loads(config.to_json_string())) == config
    assert xlnet.XLNetConfig.from_json_file("configs/xlnet_tiny.json").n_token == 50257
    with pytest.raises(InputError, match=r"xlnet_config.json: unknown key\(s\) \['mem_len'\]"):
        xlnet.XLNetConfig.from_dict({**released, "mem_len": 5}, str(path))
    with pytest.raises(InputError, match=r"missing key\(s\) \['untie_r'\]"):
        xlnet.XLNetConfig.from_dict({k: v for k, v in released.items() if k != "untie_r"})
    with pytest.raises(InputError, match="ff_activation"):
        xlnet.XLNetConfig.from_dict({**released, "ff_activation": "swish"})
    with pytest.raises(InputError, match="untie_r"):
        xlnet.XLNetConfig.from_dict({**released, "untie_r": 1})


def test_stream_masks_follow_the_factorisation_order():
    f = permutation.permutation_lm_features(ids(), [4, 5], num_predict=3)
    content, query = (np.asarray(m) for m in xlnet.attention_masks(7, f["perm_mask"]))
    rank = ranks(f["perm_mask"])
    before = rank[:, None, :] < rank[:, :, None]  # [b, i, j]: j precedes i
    np.testing.assert_array_equal(query, before)
    np.testing.assert_array_equal(content, before | np.eye(7, dtype=bool)[None])
    # Padding hides a key from both streams (but a position still sees itself in h).
    mask = np.ones((3, 7), "int32")
    mask[1, 5:] = 0
    content, query = (np.asarray(m) for m in xlnet.attention_masks(7, f["perm_mask"], mask))
    assert not query[1, :, 5:].any() and not content[1, :4, 5:].any() and content[1, 6, 6]


@pytest.mark.parametrize("untie_r", [True, False])
def test_the_query_stream_never_sees_its_own_content(untie_r):
    """Every position predicted (K = 1): changing token t leaves the query stream at t
    unchanged in every layer, and changes it at the positions after t in the order."""
    model = tiny_pretrainer(untie_r=untie_r)
    x = ids()
    f = permutation.permutation_lm_features(x, [1, 2], num_predict=7)
    rank = ranks(f["perm_mask"])
    base = model({k: f[k] for k in PLM_INPUTS})
    for t in range(7):
        changed = x.copy()
        changed[:, t] = (changed[:, t] + 1) % TINY["n_token"]
        out = model({**{k: f[k] for k in PLM_INPUTS}, "input_ids": changed})
        for layer in range(1, TINY["n_layer"] + 1):  # target_mapping rows: positions 0..6
            a = np.asarray(out["query_outputs"][layer])
            b = np.asarray(base["query_outputs"][layer])
            np.testing.assert_allclose(a[:, t], b[:, t], atol=1e-6)
        later = rank > rank[:, t : t + 1]  # (B, S)
        diff = np.abs(np.asarray(out["query_output"]) - np.asarray(base["query_output"])).max(-1)
        assert (diff[later] > 1e-5).all()
        assert (np.abs(out["sequence_output"][:, t] - base["sequence_output"][:, t]) > 1e-5).any()


def test_a_token_later_in_the_order_changes_nothing_before_it():
    model = tiny_pretrainer()
    x = ids(seed=2)
    f = permutation.permutation_lm_features(x, [7, 8], num_predict=4)
    inputs = {k: f[k] for k in PLM_INPUTS}
    rank = ranks(f["perm_mask"])
    targets = np.argmax(np.asarray(f["target_mapping"]), axis=-1)  # (B, P) positions
    base = model(inputs)
    for t in range(7):
        changed = x.copy()
        changed[:, t] = (changed[:, t] + 3) % TINY["n_token"]
        out = model({**inputs, "input_ids": changed})
        earlier = rank < rank[:, t : t + 1]  # (B, S): positions before t in the order
        for layer in range(1, TINY["n_layer"] + 1):
            h = np.asarray(out["encoder_outputs"][layer]) - np.asarray(
                base["encoder_outputs"][layer]
            )
            assert np.abs(h[earlier]).max(initial=0) < 1e-6  # content stream, every layer
            g = np.asarray(out["query_outputs"][layer]) - np.asarray(base["query_outputs"][layer])
            g_earlier = np.take_along_axis(earlier, targets, axis=1)  # (B, P)
            assert np.abs(g[g_earlier | (targets == t)]).max(initial=0) < 1e-6
        logits = np.asarray(out["plm_logits"]) - np.asarray(base["plm_logits"])
        assert (
            np.abs(logits[np.take_along_axis(earlier, targets, 1) | (targets == t)]).max(initial=0)
            < 1e-5
        )


def test_equals_keras_hub_xlnet_two_streams_and_backbone():
    """keras-hub's XLNet (XLNetBackbone and its XLNetEncoder layers, which take both streams,
    target_mapping and masks) with our weights copied in: an implementation no one here wrote.
    Both streams with a permutation mask and two segments, and the backbone (content stream,
    padding, segments), agree to 2e-5."""
    import keras_hub

    # keras-hub ties d_head to hidden / heads and computes exact-erf GELU.
    config = tiny_config(d_head=4, ff_activation="gelu_exact")
    keras.utils.set_random_seed(5)
    ours = xlnet.XLNetPretrainer(config)
    ours.build()
    perturbed(ours, seed=1)
    enc = ours.encoder
    ref = keras_hub.models.XLNetBackbone(
        vocabulary_size=29, num_layers=2, num_heads=3, hidden_dim=12, intermediate_dim=17
    )
    ref.get_layer("content_query_embedding").word_embed.embeddings.assign(enc.word_embedding)
    for i, mine in enumerate(enc.layers_):
        layer = ref.get_layer(f"xlnet_encoder_{i}")
        att = layer.relative_attention
        for theirs, w in (
            (att._query_dense, mine.rel_attn.q),
            (att._key_dense, mine.rel_attn.k),
            (att._value_dense, mine.rel_attn.v),
            (att._output_dense, mine.rel_attn.o),
            (att._encoding_dense, mine.rel_attn.r),
        ):
            theirs.kernel.assign(w)
        r_w, r_r, r_s, seg = enc.layer_biases(i)
        layer.content_attention_bias.assign(r_w)
        layer.positional_attention_bias.assign(r_r)
        layer.segment_attention_bias.assign(r_s)
        layer.segment_encoding.assign(seg)
        for a, b in (
            (layer.layer_norm, mine.attn_layer_norm),
            (layer.layer_norm_ff, mine.ff_layer_norm),
        ):
            a.gamma.assign(b.gamma)
            a.beta.assign(b.beta)
        for a, b in (
            (layer.feedforward_intermediate_dense, mine.layer_1),
            (layer.feedforward_output_dense, mine.layer_2),
        ):
            a.kernel.assign(b.kernel)
            a.bias.assign(b.bias)

    x = ids()
    segments = np.array([[0] * 4 + [1] * 3] * 3, "int32")
    # Two streams, layer by layer, through keras-hub's XLNetEncoder.
    f = permutation.permutation_lm_features(x, [3, 9], num_predict=3)
    mine = enc({**{k: f[k] for k in PLM_INPUTS}, "segment_ids": segments})
    content, query = xlnet.attention_masks(7, f["perm_mask"])
    embedding = ref.get_layer("content_query_embedding")
    pos = embedding.relative_positional_encoding(7, 7, bsz=1)  # (2S, 1, H)
    pos = np.repeat(np.asarray(pos).transpose(1, 0, 2), 3, axis=0)  # (B, 2S, H)
    h = np.asarray(enc.word_embedding)[x]
    g = np.broadcast_to(np.asarray(enc.mask_emb), (3, 3, 12))
    seg_mat = segments[:, :, None] != segments[:, None, :]
    for i in range(2):
        h, g = ref.get_layer(f"xlnet_encoder_{i}")(
            output_content=h,
            attn_mask_content=np.asarray(content, "float32"),
            attn_mask_query=np.asarray(query, "float32"),
            pos_emb=pos,
            seg_mat=seg_mat,
            output_query=g,
            target_mapping=f["target_mapping"],
        )
        np.testing.assert_allclose(mine["encoder_outputs"][i + 1], h, atol=2e-5)
        np.testing.assert_allclose(mine["query_outputs"][i + 1], g, atol=2e-5)
    # The whole backbone: content stream only, right padding, two segments.
    mask = np.ones_like(x)
    mask[0, 5:] = 0
    mine = enc({"input_ids": x, "input_mask": mask, "segment_ids": segments})["sequence_output"]
    # One row per call: keras-hub's XLNetAttentionMaskLayer turns the (B, S) padding mask into
    # (S, B) with a reshape, not a transpose, which mixes rows' padding when B > 1.
    for b in range(3):
        row = slice(b, b + 1)
        theirs = ref({"token_ids": x[row], "padding_mask": mask[row], "segment_ids": segments[row]})
        real = mask[b].astype(bool)
        np.testing.assert_allclose(
            np.asarray(mine)[b, real], np.asarray(theirs)[0, real], atol=2e-5
        )


def test_serialisation_round_trips_and_shapes():
    config = tiny_config()
    model = xlnet.XLNetPretrainer.from_config(xlnet.XLNetPretrainer(config).get_config())
    assert model.config == config
    model.build()
    names = {w.path.split("/")[-1] for w in model.encoder.weights}
    assert {"r_w_bias", "r_r_bias", "r_s_bias", "seg_embed", "mask_emb", "q", "o", "r"} <= names
    assert tuple(model.encoder.r_w_bias.shape) == (2, 3, 5)
    tied = xlnet.XLNetModel(tiny_config(untie_r=False))
    tied.build()
    assert tuple(tied.r_r_bias.shape) == (3, 5)
    clf = xlnet.XLNetClassifier(config, num_classes=4)
    clone = xlnet.XLNetClassifier.from_config(clf.get_config())
    assert clone.get_config() == clf.get_config()
    layer = xlnet.XLNetLayer(config, name="l")
    assert xlnet.XLNetLayer.from_config(layer.get_config()).get_config() == layer.get_config()
    with pytest.raises(ValueError, match="perm_mask and target_mapping"):
        model({"input_ids": ids()})


def test_classifier_reads_the_last_real_token():
    keras.utils.set_random_seed(0)
    model = xlnet.XLNetClassifier(tiny_config(), num_classes=5)
    model.build()
    x = ids()
    mask = np.ones_like(x)
    mask[1, 4:] = 0  # right padding
    mask[2, :3] = 0  # XLNet's left padding
    np.testing.assert_array_equal(xlnet.last_token_index(mask), [6, 3, 6])
    out = model({"input_ids": x, "input_mask": mask})
    assert out.shape == (3, 5)
    changed = x.copy()
    changed[1, 5] = (changed[1, 5] + 1) % 29  # padding: no effect
    changed[2, 1] = (changed[2, 1] + 1) % 29
    again = model({"input_ids": changed, "input_mask": mask})
    np.testing.assert_allclose(again[1:], out[1:], atol=1e-6)


def test_multiple_choice_scores_each_choice_as_its_own_sequence():
    """(B, C, S) choices: each choice's score is the one-output classifier's logit of that
    sequence alone, placed at (b, c)."""
    keras.utils.set_random_seed(5)
    model = xlnet.XLNetClassifier(tiny_config(), num_classes=1)
    model.build()
    perturbed(model, seed=3)
    rng = np.random.default_rng(1)
    packed = [
        xlnet.pack_classifier_ids(rng.integers(3, 27, 2 + k % 4).tolist(), [5, 6], 9, 27, 28)[:3]
        for k in range(2 * 3)
    ]
    ids_, mask, seg = (np.array(col, np.int32).reshape(2, 3, 9) for col in zip(*packed))
    scores = np.asarray(model({"input_ids": ids_, "input_mask": mask, "segment_ids": seg}))
    assert scores.shape == (2, 3)
    for b in range(2):
        for c in range(3):
            one = {"input_ids": ids_[b, c][None], "input_mask": mask[b, c][None],
                   "segment_ids": seg[b, c][None]}  # fmt: skip
            np.testing.assert_allclose(scores[b, c], np.asarray(model(one))[0, 0], atol=1e-5)
    assert np.ptp(scores) > 1e-3  # the choices score differently (the check can fail)
    with pytest.raises(ValueError, match="need num_classes=1, not 3"):
        xlnet.XLNetClassifier(tiny_config(), num_classes=3)({"input_ids": ids_, "input_mask": mask})


def test_pretraining_through_run_pretraining_then_classification_from_its_checkpoint(tmp_path):
    """run_pretraining.py with an XLNet config on LM blocks: the held-out PLM loss falls on a
    repeated batch, perplexity is exp(loss). Then the classifier starts
    from that checkpoint's encoder (the library path run_classifier would take) and learns a
    repeated batch."""
    import tensorflow as tf

    from data_prep import lm_data
    from training import finetune_tasks, optimization, trainer

    rng = np.random.default_rng(0)
    data = tmp_path / "lm.tfrecord"
    # Three distinct tokens only, so 8 steps can move the loss well below ln(29).
    lm_data.write_lm_tfrecords([rng.integers(3, 6, 9) for _ in range(4)], [str(data)])
    config = tmp_path / "xlnet_config.json"
    config.write_text(json.dumps(TINY))  # the eight released keys only
    out_dir = tmp_path / "out"
    args = [
        f"--bert_config_file={config}",
        f"--input_file={data}",
        f"--output_dir={out_dir}",
        "--max_seq_length=9",
        "--max_predictions_per_seq=3",
        "--train_batch_size=4",  # the 4 blocks: one batch, repeated
        "--eval_batch_size=4",
        "--num_train_steps=8",
        "--num_warmup_steps=1",
        "--save_checkpoints_steps=8",
        "--iterations_per_loop=4",
        "--max_eval_steps=1",
        "--learning_rate=1e-2",
    ]

    r = helpers.run_main("run_pretraining.py", [*args, "--do_train", "--do_eval"])
    assert r.returncode == 0, r.stderr[-3000:]
    # The log's FLOP/s: 3 passes of modeling/flops.py's XLNet count (batches of 4 blocks of 9
    # with 3 targets) per example.
    per_example = 3 * flops.xlnet_pretraining_flops(xlnet.XLNetConfig(**TINY), 9, 3, 4) / 4
    helpers.check_logged_flops(r.stderr, per_example, per_example)
    results = dict(
        line.split(" = ") for line in (out_dir / "eval_results.txt").read_text().split("\n") if line
    )
    first = json.loads((out_dir / "eval_log.jsonl").read_text().splitlines()[0])
    assert int(results["global_step"]) == 8
    assert float(results["plm_loss"]) < first["plm_loss"] - 0.5  # from about ln(29) = 3.37
    assert float(results["perplexity"]) == pytest.approx(np.exp(float(results["plm_loss"])))

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    keras.utils.set_random_seed(2)
    with strategy.scope():
        model = xlnet.XLNetClassifier(tiny_config(), num_classes=3)  # TINY without dropout
        model.build()
        opt = optimization.create_optimizer(1e-2, 40, 2)
        opt.build(model.trainable_variables)
    _, part = trainer.init_from_checkpoint(model, str(out_dir))
    assert part == "encoder"
    reader = tf.train.load_checkpoint(str(out_dir))
    key = next(k for k in reader.get_variable_to_shape_map() if "encoder/word_embedding" in k)
    np.testing.assert_array_equal(model.encoder.word_embedding.numpy(), reader.get_tensor(key))
    x = ids(batch=6, length=9, seed=5)
    mask = np.ones_like(x)
    mask[2, 6:] = 0
    batch = {
        "input_ids": x,
        "input_mask": mask,
        "segment_ids": np.zeros_like(x),
        "label_ids": np.array([0, 1, 2, 2, 1, 0], np.int32),
    }
    fit = trainer.Trainer(strategy, finetune_tasks.classification_task(model), opt)
    rows = fit.train_steps(iter(tf.data.Dataset.from_tensors(batch).repeat()), 40)
    start, end = (fit.metrics_from_sums(rows[i]) for i in (0, -1))
    assert end["classifier_loss"] < 0.3 * start["classifier_loss"] and end["accuracy"] == 1.0


def test_mixed_precision_stays_finite_when_a_query_sees_nothing():
    """K = 1: the first position of each order has an empty query row; under float16 the
    hidden-key constant must stay finite so that row gives zeros, not NaN."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = xlnet.XLNetPretrainer(tiny_config())
        model.build()
        f = permutation.permutation_lm_features(ids(), [1, 2], num_predict=7)
        logits = model({k: f[k] for k in PLM_INPUTS})["plm_logits"]
    finally:
        keras.config.set_dtype_policy("float32")
    assert logits.dtype == "float32" and np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_classifier_under_mixed_precision_stays_near_float32(precision):
    """run_classifier's --precision with an XLNet config: left-padded pairs give float32 logits
    near the float32 model's and finite float32 gradients (helpers.check_classifier_at_precision);
    mask_emb (pretraining's query stream) has none in either."""
    x = ids()
    mask = np.ones_like(x)
    mask[2, :3] = 0  # XLNet's left padding
    segments = np.array([[0, 0, 0, 1, 1, 1, 2]] * 3, np.int32)

    def make():
        model = xlnet.XLNetClassifier(tiny_config(), num_classes=3)
        model.build()
        return model

    inputs = {"input_ids": x, "input_mask": mask, "segment_ids": segments}
    helpers.check_classifier_at_precision(make, inputs, np.array([0, 1, 2]), precision)


def test_classifier_packing_is_xlnets_layout():
    sep, cls = 27, 28
    ids, mask, seg, cut = xlnet.pack_classifier_ids([5, 6, 7], [8, 9], 9, sep, cls)
    assert ids == [0, 5, 6, 7, sep, 8, 9, sep, cls] and not cut
    assert mask == [0, 1, 1, 1, 1, 1, 1, 1, 1]
    assert seg == [4, 0, 0, 0, 0, 1, 1, 1, 2]  # A, its <sep>, B, its <sep>, <cls>; pad 4
    ids, mask, seg, cut = xlnet.pack_classifier_ids([5, 6, 7, 8, 9, 10], None, 5, sep, cls)
    assert (ids, mask, seg, cut) == ([5, 6, 7, sep, cls], [1] * 5, [0, 0, 0, 0, 2], True)
    # A pair too long: the longer text loses its last tokens first (glue.truncate_pair).
    ids, _, seg, cut = xlnet.pack_classifier_ids([1, 2, 3, 4, 5], [6, 7], 7, sep, cls)
    assert ids == [1, 2, sep, 6, 7, sep, cls] and seg == [0, 0, 0, 1, 1, 1, 2] and cut
    with pytest.raises(ValueError, match="no room"):
        xlnet.pack_classifier_ids([1], [2], 3, sep, cls)


def test_classifier_output_does_not_depend_on_padding():
    """The same packed examples, left padded to 9 and to 13 positions and batched with a longer
    one, give the same logits: padded keys are hidden and positions are relative. A changed real
    token does change them (the check can fail)."""
    keras.utils.set_random_seed(4)
    model = xlnet.XLNetClassifier(tiny_config(), num_classes=3)
    model.build()
    perturbed(model, seed=2)
    examples = [([3, 4, 5], [6, 7]), ([8, 9], None), ([10, 11, 12, 13, 14, 15, 16], [17])]

    def logits(length, rows):
        packed = [xlnet.pack_classifier_ids(a, b, length, 27, 28)[:3] for a, b in rows]
        ids_, mask, seg = (np.array(col, np.int32) for col in zip(*packed))
        return np.asarray(model({"input_ids": ids_, "input_mask": mask, "segment_ids": seg}))

    short = logits(9, examples[:2])
    assert short.shape == (2, 3)
    np.testing.assert_allclose(logits(13, examples)[:2], short, atol=1e-5)
    np.testing.assert_allclose(logits(13, examples[1:2]), short[1:], atol=1e-5)
    changed = logits(9, [([3, 4, 20], [6, 7])])
    assert np.max(np.abs(changed - short[:1])) > 1e-3


def test_span_prediction_pretrains_saves_and_resumes(tmp_path):
    """--xlnet_span_prediction with a WordPiece vocabulary: spans start at words (not at
    "##" pieces), the run trains, saves its checkpoint with the input position and resumes
    from it; the settings file refuses a resume without the flag; a run without --vocab_file
    and --mask_alpha without the flag are refused."""
    from data_prep import lm_data

    vocab = tmp_path / "vocab.txt"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "##s", "cat", "sat", "##x"]
    vocab.write_text("\n".join(tokens + [f"w{i}" for i in range(19)]) + "\n")  # 29 = n_token
    rng = np.random.default_rng(0)
    data = tmp_path / "lm.tfrecord"
    lm_data.write_lm_tfrecords([rng.integers(5, 29, 12) for _ in range(8)], [str(data)])
    config = tmp_path / "xlnet_config.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "out"
    args = [
        f"--bert_config_file={config}", f"--input_file={data}", f"--output_dir={out}",
        f"--vocab_file={vocab}", "--max_seq_length=12", "--max_predictions_per_seq=3",
        "--train_batch_size=4", "--eval_batch_size=4", "--num_warmup_steps=1",
        "--save_checkpoints_steps=2", "--iterations_per_loop=2", "--max_eval_steps=1",
        "--do_train", "--do_eval",
    ]  # fmt: skip
    r = helpers.run_main("run_pretraining.py", [*args, "--xlnet_span_prediction",
                                                "--num_train_steps=2"])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "3 predicted each (spans)" in r.stderr
    r = helpers.run_main("run_pretraining.py", [*args, "--xlnet_span_prediction",
                                                "--num_train_steps=4"])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {out / 'ckpt-2'} at step 2" in r.stderr
    results = (out / "eval_results.txt").read_text()
    assert "global_step = 4" in results
    r = helpers.run_main("run_pretraining.py", [*args, "--num_train_steps=6"])
    assert r.returncode == 1 and "--xlnet_span_prediction was True and is now False" in r.stderr
    no_vocab = [a for a in args if not a.startswith("--vocab_file")]
    r = helpers.run_main("run_pretraining.py", [*no_vocab, "--xlnet_span_prediction"])
    assert r.returncode == 1 and "give --vocab_file to tell word starts" in r.stderr
    r = helpers.run_main("run_pretraining.py", [*args, "--mask_alpha=4"])
    assert r.returncode == 1 and "only with --xlnet_span_prediction" in r.stderr
    bert_config = tmp_path / "bert_config.json"
    bert_config.write_text(helpers.tiny_config().to_json_string())
    r = helpers.run_main(
        "run_pretraining.py",
        [*args, "--xlnet_span_prediction", f"--bert_config_file={bert_config}"],
    )
    assert r.returncode == 1 and "--xlnet_span_prediction: XLNet's permutation LM only" in r.stderr
