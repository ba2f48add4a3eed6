"""BART: keras-hub's BartBackbone as an independent implementation (weights copied by the
converter), the decoder's causality, the encoder's padding mask, config and Keras round trips,
decoding, and BART through run_pretraining and run_text2text."""

import json
import math
import re

import keras
import numpy as np
import pytest

from bench import generation
from data_prep.errors import InputError
from modeling import bart, checkpoints, t5
from tests import helpers

TINY = dict(
    vocab_size=23,
    d_model=12,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=3,
    decoder_attention_heads=3,
    encoder_ffn_dim=17,
    decoder_ffn_dim=17,
    max_position_embeddings=11,
    dropout=0.0,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=1,
    decoder_start_token_id=1,
)


def tiny(**changes):
    return helpers.tiny_encoder_decoder(bart.BartModel, bart.BartConfig, {**TINY, **changes})


def batch(b=3, s=7, t=5, seed=0):
    return helpers.encoder_decoder_batch(b, s, t, seed, padded=((0, 5), (2, 6)))


def keras_hub_backbone():
    import keras_hub

    keras.utils.set_random_seed(11)
    ref = keras_hub.models.BartBackbone(
        vocabulary_size=23,
        num_layers=2,
        num_heads=3,
        hidden_dim=12,
        intermediate_dim=17,
        dropout=0.0,
        max_sequence_length=11,
    )
    # Random layer-norm and bias values, so that a weight copied to the wrong place shows.
    rng = np.random.default_rng(3)
    for w in ref.weights:
        if "gamma" in w.path or "beta" in w.path or "bias" in w.path:
            w.assign(rng.normal(0.0, 0.3, w.shape).astype("float32") + ("gamma" in w.path))
    return ref


def test_equals_keras_hub_bart_backbone_after_conversion():
    ref = keras_hub_backbone()
    model = bart.from_keras_hub(ref, pad_token_id=0, bos_token_id=None, eos_token_id=1,
                                decoder_start_token_id=1)  # fmt: skip
    assert model.config.encoder_layers == 2 and model.config.max_position_embeddings == 11
    x = batch(s=11, t=9)  # the whole position table
    ours = model(x)
    theirs = ref(
        {
            "encoder_token_ids": x["input_ids"],
            "encoder_padding_mask": x["input_mask"],
            "decoder_token_ids": x["decoder_input_ids"],
            "decoder_padding_mask": np.ones_like(x["decoder_input_ids"]),
        }
    )
    real = x["input_mask"].astype(bool)
    enc, ref_enc = np.asarray(ours["encoder_output"]), np.asarray(theirs["encoder_sequence_output"])
    np.testing.assert_allclose(enc[real], ref_enc[real], atol=2e-5)
    dec = np.asarray(ours["decoder_output"])
    np.testing.assert_allclose(dec, np.asarray(theirs["decoder_sequence_output"]), atol=2e-5)
    assert np.abs(dec).max() > 0.1  # not a trivially equal pair of zeros
    # The tied output layer: logits are decoder states times the token embedding (plus a zero
    # final_logits_bias), as keras-hub's BartSeq2SeqLM reverses its token embedding.
    want = np.asarray(ref.token_embedding(theirs["decoder_sequence_output"], reverse=True))
    np.testing.assert_allclose(np.asarray(ours["lm_logits"]), want, atol=5e-5)
    # A wrong size is refused with the weight's name.
    other = bart.BartModel(bart.BartConfig(**{**TINY, "decoder_ffn_dim": 19}))
    other.build()
    with pytest.raises(ValueError, match="expected shape"):
        bart.copy_from_keras_hub(ref, other)


def test_positions_start_at_row_two_and_embedding_is_scaled_by_config():
    model = tiny()
    x = batch()
    base = np.asarray(model(x)["lm_logits"])
    # Rows 0 and 1 of each table are never read (fairseq's offset); row 2 is position 0.
    for table in (model.encoder_embed_positions, model.decoder_embed_positions):
        table.assign(np.concatenate([np.full((2, 12), 9.0, "float32"), table.numpy()[2:]]))
    np.testing.assert_allclose(np.asarray(model(x)["lm_logits"]), base, atol=1e-5)
    rows = model.decoder_embed_positions.numpy()
    rows[2] += np.linspace(-1.0, 1.0, 12)  # not a constant: layernorm_embedding removes those
    model.decoder_embed_positions.assign(rows)
    assert np.abs(np.asarray(model(x)["lm_logits"]) - base).max() > 1e-3
    scaled = tiny(scale_embedding=True)
    assert scaled.embed_scale == pytest.approx(math.sqrt(12)) and tiny().embed_scale == 1.0
    with pytest.raises(ValueError, match="at most max_position_embeddings=11"):
        model.encode(np.ones((1, 12), "int32"), np.ones((1, 12), "int32"))


def test_decoder_never_sees_later_targets_and_encoder_ignores_padding():
    model = tiny()
    x = batch()
    base = np.asarray(model(x)["lm_logits"])
    for t in range(1, 5):
        changed = dict(x, decoder_input_ids=x["decoder_input_ids"].copy())
        changed["decoder_input_ids"][:, t] = (changed["decoder_input_ids"][:, t] + 1) % 23
        out = np.asarray(model(changed)["lm_logits"])
        np.testing.assert_allclose(out[:, :t], base[:, :t], atol=1e-5)
        assert np.abs(out[:, t:] - base[:, t:]).max() > 1e-5
    padded = dict(x, input_ids=x["input_ids"].copy())
    padded["input_ids"][0, 5:] = 3  # behind the mask of row 0
    out = model(padded)
    np.testing.assert_allclose(np.asarray(out["lm_logits"]), base, atol=1e-5)
    enc = np.asarray(model(x)["encoder_output"])
    np.testing.assert_allclose(np.asarray(out["encoder_output"])[0, :5], enc[0, :5], atol=1e-5)
    # A real source token does change the output.
    real = dict(x, input_ids=x["input_ids"].copy())
    real["input_ids"][0, 4] = (real["input_ids"][0, 4] + 1) % 23
    assert np.abs(np.asarray(model(real)["lm_logits"])[0] - base[0]).max() > 1e-5


@pytest.mark.parametrize(("act", "plain_op"), [("gelu", "Erfc"), ("gelu_new", "Tanh")])
def test_feed_forward_gelu_runs_as_xla_kernels_in_training_with_equal_values_and_gradients(
    act, plain_op
):
    # Training goes through layers.fused_activation's kernels (no Erfc / Tanh op of TensorFlow's
    # left in the graph), decoding and export through keras' gelu; the two agree in values and
    # in the gradients of the input and of both dense layers. relu has no fused form.
    import tensorflow as tf

    assert (
        bart._FeedForward(bart.BartConfig(**TINY, activation_function="relu"), 17)._fused_act
        is None
    )
    keras.utils.set_random_seed(3)
    ffn = bart._FeedForward(bart.BartConfig(**TINY, activation_function=act), 17, name="ffn")
    x = tf.constant(np.random.default_rng(0).normal(scale=2.0, size=(2, 3, 12)).astype("float32"))
    ffn.build(x.shape)

    def op_types(training):
        graph = tf.function(lambda v: ffn(v, training=training)).get_concrete_function(x).graph
        return {op.type for op in graph.get_operations()}

    assert plain_op not in op_types(True) and plain_op in op_types(False)
    upstream = tf.constant(np.random.default_rng(1).normal(size=(2, 3, 12)).astype("float32"))
    results = []
    for training in (True, False):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = ffn(x, training=training)
            loss = tf.reduce_sum(y * upstream)
        grads = tape.gradient(loss, [x, ffn.fc1.kernel, ffn.fc1.bias, ffn.fc2.kernel])
        results.append([y, *grads])
    for fused, plain in zip(*results):
        np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=1e-5, atol=1e-5)


def test_config_json_round_trip_unknown_keys_and_keras_config(tmp_path):
    config = bart.BartConfig(**TINY)
    path = tmp_path / "bart.json"
    path.write_text(config.to_json_string())
    assert bart.BartConfig.from_json_file(path) == config
    assert bart.BartConfig.from_dict({"vocab_size": 50265}).decoder_start_token_id == 2
    with pytest.raises(InputError, match=r"bart.json: unknown key\(s\) \['num_layers'\]"):
        path.write_text(json.dumps({**TINY, "num_layers": 2}))
        bart.BartConfig.from_json_file(path)
    for bad, match in (
        ({"activation_function": "swish"}, "activation_function"),
        ({"encoder_attention_heads": 5}, "divisor of d_model"),
        ({"encoder_layerdrop": 0.1}, "LayerDrop"),
        ({"eos_token_id": 23}, "below vocab_size"),
    ):
        with pytest.raises(InputError, match=match):
            bart.BartConfig.from_dict({**TINY, **bad}, "c.json")
    repo_config = json.loads((t5_root() / "configs" / "bart_tiny.json").read_text())
    assert bart.is_bart_config(repo_config) and not t5.is_t5_config(repo_config)
    assert bart.BartConfig.from_dict(repo_config).vocab_size == repo_config["vocab_size"]
    for name in ("t5_tiny", "xlnet_tiny", "gpt_tiny", "bert_tiny", "elmo_tiny"):
        assert not bart.is_bart_config(
            json.loads((t5_root() / "configs" / f"{name}.json").read_text())
        )
    model = tiny()
    clone = bart.BartModel.from_config(model.get_config())
    clone.build()
    assert clone.config == model.config
    assert [w.shape for w in clone.weights] == [w.shape for w in model.weights]
    clone.set_weights(model.get_weights())
    x = batch()
    np.testing.assert_allclose(
        np.asarray(clone(x)["lm_logits"]), np.asarray(model(x)["lm_logits"]), atol=1e-6
    )


def test_a_published_style_hugging_face_config_loads_and_mbart_is_refused():
    """The keys of Hugging Face's bart-base config.json (bookkeeping and generation ones too)."""
    published = {
        "_name_or_path": "bart-base", "activation_dropout": 0.1, "activation_function": "gelu",
        "add_bias_logits": False, "add_final_layer_norm": False, "architectures": ["BartModel"],
        "attention_dropout": 0.1, "bos_token_id": 0, "classif_dropout": 0.1,
        "classifier_dropout": 0.0, "d_model": 768, "decoder_attention_heads": 12,
        "decoder_ffn_dim": 3072, "decoder_layerdrop": 0.0, "decoder_layers": 6,
        "decoder_start_token_id": 2, "dropout": 0.1, "early_stopping": True,
        "encoder_attention_heads": 12, "encoder_ffn_dim": 3072, "encoder_layerdrop": 0.0,
        "encoder_layers": 6, "eos_token_id": 2, "forced_bos_token_id": 0,
        "forced_eos_token_id": 2, "gradient_checkpointing": False,
        "id2label": {"0": "LABEL_0"}, "init_std": 0.02, "is_encoder_decoder": True,
        "label2id": {"LABEL_0": 0}, "max_position_embeddings": 1024, "model_type": "bart",
        "no_repeat_ngram_size": 3, "normalize_before": False, "normalize_embedding": True,
        "num_beams": 4, "num_hidden_layers": 6, "pad_token_id": 1, "scale_embedding": False,
        "task_specific_params": {}, "torch_dtype": "float32", "transformers_version": "4.12.0",
        "use_cache": True, "vocab_size": 50265,
    }  # fmt: skip
    c = bart.BartConfig.from_hf_config(published, "bart-base/config.json")
    assert (c.d_model, c.encoder_layers, c.decoder_ffn_dim, c.pad_token_id) == (768, 6, 3072, 1)
    assert c.activation_dropout == 0.1 and c.decoder_start_token_id == 2
    with pytest.raises(InputError, match="config.json: normalize_before: expected False"):
        bart.BartConfig.from_hf_config({**published, "normalize_before": True})
    with pytest.raises(InputError, match=r"unknown key\(s\) \['layernorm_variant'\]"):
        bart.BartConfig.from_hf_config({**published, "layernorm_variant": "x"})
    with pytest.raises(InputError, match="num_hidden_layers"):
        bart.BartConfig.from_hf_config({**published, "num_hidden_layers": 12})


def t5_root():
    from tests.conftest import ROOT

    return ROOT


def test_learns_to_copy_then_greedy_and_beam_decoding_agree_and_repeat():
    """Teacher-forced training on copying 32 sequences; both decoders (t5's, shared) then
    reproduce them, starting from BART's decoder start (</s>), and give the same ids twice."""
    # init_std 0.2 (not BART's 0.02): tiny tied logits would need several times the steps.
    model = tiny(d_model=24, encoder_ffn_dim=48, decoder_ffn_dim=48, init_std=0.2)
    src, loss = helpers.train_to_copy(model, decoder_start_id=1, steps=150, warmup=15)
    assert loss < 0.05, loss
    test, mask = src[:3], np.ones((3, 4), "int32")
    expected = np.concatenate([test, np.ones((3, 1), np.int32)], axis=1)
    greedy = t5.greedy_decode(model, test, mask, 8)
    np.testing.assert_array_equal(greedy, expected)
    np.testing.assert_array_equal(t5.greedy_decode(model, test, mask, 8), greedy)
    beams = t5.beam_search(model, test, mask, 8, num_beams=3)
    np.testing.assert_array_equal(beams, expected)
    np.testing.assert_array_equal(t5.beam_search(model, test, mask, 8, num_beams=3), beams)
    # The same without the key / value cache (each step runs the whole prefix).
    np.testing.assert_array_equal(t5.greedy_decode(model, test, mask, 8, use_cache=False), greedy)
    beams = t5.beam_search(model, test, mask, 8, num_beams=3, use_cache=False)
    np.testing.assert_array_equal(beams, expected)
    # The float32 weights run at run_text2text's --precision=bf16 / fp16: the same ids.
    for precision in ("bf16", "fp16"):
        mixed = helpers.at_precision(
            lambda: tiny(d_model=24, encoder_ffn_dim=48, decoder_ffn_dim=48, init_std=0.2),
            model,
            precision,
        )
        np.testing.assert_array_equal(t5.greedy_decode(mixed, test, mask, 8), expected)
        np.testing.assert_array_equal(t5.beam_search(mixed, test, mask, 8, 3), expected)


def test_greedy_decoding_equals_keras_hub_bart_seq2seq_lm_generate():
    """keras-hub's BartSeq2SeqLM (its own cached generation, greedy sampler) over the same
    weights produces the same ids as greedy_decode, through every position of the table."""
    import keras_hub

    ref = keras_hub_backbone()
    helpers.scramble_weights(ref, 4.0, seed=2)  # at its initial scale every row repeats a token
    model = bart.from_keras_hub(ref, pad_token_id=0, bos_token_id=None, eos_token_id=1,
                                decoder_start_token_id=1)  # fmt: skip
    lm = keras_hub.models.BartSeq2SeqLM(backbone=ref, preprocessor=None)
    lm.compile(sampler="greedy")
    x = batch(s=11)
    inputs = generation.keras_hub_inputs(x["input_ids"], x["input_mask"], 1, 10)
    theirs = lm.generate(inputs, stop_token_ids=None)["decoder_token_ids"][:, 1:]
    ours = t5.greedy_decode(model, x["input_ids"], x["input_mask"], 10)
    assert len(np.unique(ours)) >= 3 and len({tuple(r) for r in ours}) >= 2, ours
    np.testing.assert_array_equal(ours, theirs)


def bart_records_and_config(tmp_path):
    """BART-noised records (infilling + sentence permutation) of a tiny BPE, and a BART config
    whose special ids are the vocabulary's (decoder start = </s>, as the released models)."""
    from data_prep import seq2seq_data
    from tests.test_seq2seq_data import tiny_bpe

    encoder, merges = tiny_bpe(tmp_path)
    vocab = seq2seq_data.Seq2SeqVocab.from_files(encoder, merges, num_sentinels=0, bos=True)
    text = ["The cat sat on the mat.", "The dog barked.", "A bird sang at noon.", "It rained."]
    documents = [seq2seq_data.encode_sentences(vocab, text[i:] + text[:i]) for i in range(4)]
    settings = seq2seq_data.NoisingSettings("bart_infill", 29, 29, permute_sentences=True)
    instances = list(
        seq2seq_data.create_instances(documents, vocab, settings, np.random.default_rng(0))
    )
    assert any(vocab.mask_id in inputs for inputs, _ in instances)
    records = tmp_path / "bart.tfrecord"
    seq2seq_data.write_seq2seq_tfrecords(instances * 3, [str(records)], 29, 29, vocab.pad_id)
    # init_std 0.3: BART's 0.02 makes the tied logits tiny, and a 16-wide model then needs
    # hundreds of steps to move (measured); the smoke runs here take 6 and 30.
    values = dict(TINY, vocab_size=vocab.size, max_position_embeddings=31, d_model=16, init_std=0.3,
                  encoder_attention_heads=4, decoder_attention_heads=4,
                  pad_token_id=vocab.pad_id, eos_token_id=vocab.eos_id,
                  bos_token_id=vocab.bos_id, decoder_start_token_id=vocab.eos_id)  # fmt: skip
    config = tmp_path / "bart.json"
    config.write_text(json.dumps(values))
    # BART's convention is checked: decoding starts from </s>; T5's <pad> start is refused.
    vocab.check_config(bart.BartConfig(**values), "bart.json", vocab.eos_id)
    with pytest.raises(InputError, match="decoder_start_token_id"):
        vocab.check_config(bart.BartConfig(**values), "bart.json")
    with pytest.raises(InputError, match="bos_token_id"):
        vocab.check_config(bart.BartConfig(**dict(values, bos_token_id=None)), "b", vocab.eos_id)
    return records, config, encoder, merges


def test_run_pretraining_then_run_text2text_with_a_bart_config(tmp_path):
    """One BART config through both entrypoints: denoising pre-training lowers the held-out
    loss, and run_text2text fine-tunes that checkpoint into label words (greedy) and decodes
    the test split with beam search."""
    records, config, encoder, merges = bart_records_and_config(tmp_path)
    pre = tmp_path / "pre"
    args = [
        f"--bert_config_file={config}",
        f"--input_file={records}", f"--output_dir={pre}", "--max_seq_length=29",
        "--train_batch_size=4", "--eval_batch_size=4", "--num_train_steps=6",
        "--num_warmup_steps=1", "--save_checkpoints_steps=6", "--iterations_per_loop=6",
        "--max_eval_steps=3", "--learning_rate=1e-2", "--do_train", "--do_eval",
    ]  # fmt: skip
    r = helpers.run_main("run_pretraining.py", args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BART, inputs 29, targets 29" in r.stderr and "BartModel" in r.stderr
    results = dict(
        line.split(" = ") for line in (pre / "eval_results.txt").read_text().splitlines()
    )
    assert int(results["global_step"]) == 6
    assert float(results["perplexity"]) == pytest.approx(math.exp(float(results["target_loss"])))
    first = json.loads((pre / "eval_log.jsonl").read_text().splitlines()[0])
    assert float(results["target_loss"]) < first["target_loss"] - 0.5

    sst = tmp_path / "sst"
    sst.mkdir()
    rows = ["The cat sat.\t1", "The dog barked.\t0"] * 6
    (sst / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (sst / "dev.tsv").write_text("sentence\tlabel\nThe cat sat.\t1\nThe dog barked.\t0\n")
    (sst / "test.tsv").write_text("index\tsentence\n7\tThe dog barked.\n9\tThe cat sat.\n")
    out = tmp_path / "sst_out"
    args = [
        "--task_name=sst-2", f"--data_dir={sst}",
        f"--bert_config_file={config}", f"--encoder_file={encoder}", f"--merges_file={merges}",
        "--num_sentinels=0", f"--init_checkpoint={pre}", f"--output_dir={out}",
        "--max_seq_length=29", "--max_target_length=10", "--train_batch_size=4",
        "--eval_batch_size=3", "--learning_rate=1e-2", "--num_train_epochs=10",
        "--iterations_per_loop=30", "--num_beams=2", "--do_train", "--do_eval", "--do_predict",
    ]  # fmt: skip
    r = helpers.run_main("run_text2text.py", args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"initialised from {pre}/ckpt-6" in r.stderr
    results = dict(
        line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines()
    )
    assert int(results["global_step"]) == 30
    assert 0.0 <= float(results["accuracy"]) <= 1.0
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["target_loss"] < 0.5 * log[0]["target_loss"], (log[0], log[-1])
    header, *rows = (out / "dev_predictions.tsv").read_text().splitlines()
    assert header == "index\tprediction\ttarget" and len(rows) == 2
    lines = (out / "test_predictions.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["index", "7", "9"]


def random_weights(model, seed=0):
    """Every weight random (layer-norm gains near 1), final_logits_bias included, so that a
    weight converted to the wrong place or not at all shows in the outputs."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(0.0, 0.3, w.shape).astype("float32") + ("gamma" in w.path))
    return model


def test_hugging_face_files_load_in_keras_hub_and_round_trip_exactly(tmp_path):
    """bart.save_hf writes BartForConditionalGeneration's names; keras-hub's own transformers
    converter (keras_hub/src/utils/transformers/convert_bart.py) loads the folder offline and
    computes the same states; bart.load_hf reads it back bit for bit."""
    import keras_hub
    from safetensors.numpy import load_file, save_file

    model = random_weights(tiny(bos_token_id=2))
    files = bart.save_hf(model, tmp_path / "hf")
    arrays = load_file(str(files[0]))
    assert arrays["final_logits_bias"].shape == (1, 23)
    assert "model.encoder.layers.1.self_attn.q_proj.weight" in arrays
    assert not any("embed_tokens" in k or k.startswith("lm_head") for k in arrays)
    config = json.loads(files[1].read_text())
    assert config["model_type"] == "bart" and config["num_hidden_layers"] == 2

    ref = keras_hub.models.BartBackbone.from_preset(str(tmp_path / "hf"))
    b = batch()
    theirs = ref({
        "encoder_token_ids": b["input_ids"], "encoder_padding_mask": b["input_mask"],
        "decoder_token_ids": b["decoder_input_ids"],
        "decoder_padding_mask": np.ones_like(b["decoder_input_ids"]),
    })  # fmt: skip
    ours = model(b)
    real = b["input_mask"].astype(bool)
    np.testing.assert_allclose(
        np.asarray(ours["encoder_output"])[real],
        np.asarray(theirs["encoder_sequence_output"])[real], atol=2e-5,
    )  # fmt: skip
    np.testing.assert_allclose(ours["decoder_output"], theirs["decoder_sequence_output"], atol=2e-5)

    back, report = bart.load_hf(tmp_path / "hf", model.config)
    assert report.num_source_variables == len(model.weights)
    # Its LM head (final_logits_bias, the tied table) is BART's pre-training head.
    assert "pre-training heads: included" in report.summary()
    for mine, read in zip(model.weights, back.weights):
        np.testing.assert_array_equal(mine.numpy(), read.numpy(), err_msg=mine.path)
    # transformers' older files carry tied copies of `shared`: checked equal, not converted.
    arrays["lm_head.weight"] = arrays["model.shared.weight"]
    save_file(arrays, str(tmp_path / "tied.safetensors"))
    _, report = bart.load_hf(tmp_path / "tied.safetensors", model.config)
    assert "lm_head.weight" in report.ignored
    arrays["lm_head.weight"] = arrays["model.shared.weight"] + 1.0
    save_file(arrays, str(tmp_path / "tied.safetensors"))
    with pytest.raises(InputError, match="lm_head.weight: expected a copy of model.shared"):
        bart.load_hf(tmp_path / "tied.safetensors", model.config)
    with pytest.raises(InputError, match=r"fc1.weight: expected shape \(18, 12\)"):
        bart.load_hf(tmp_path / "hf", bart.BartConfig(**dict(TINY, encoder_ffn_dim=18)))


def test_convert_checkpoint_moves_bart_between_cloze_and_hugging_face(tmp_path):
    """convert_checkpoint.py with a BART config: a Cloze checkpoint -> Hugging Face files ->
    a Cloze checkpoint again, weights equal bit for bit, BPE files renamed each way."""
    model = random_weights(tiny(bos_token_id=2), seed=4)
    cloze = tmp_path / "cloze"
    cloze.mkdir()
    checkpoints.save_whole(model, cloze)
    (cloze / "bert_config.json").write_text(model.config.to_json_string())
    (cloze / "encoder.json").write_text('{"a": 0}')

    helpers.convert_checkpoint(
        "--from=cloze", "--to=hf", f"--input_dir={cloze}", f"--output_dir={tmp_path / 'hf'}"
    )
    assert (tmp_path / "hf/vocab.json").read_text() == '{"a": 0}'
    out = helpers.convert_checkpoint(
        "--from=hf", "--to=cloze", f"--input_dir={tmp_path / 'hf'}",
        f"--output_dir={tmp_path / 'back'}",
    ).stdout  # fmt: skip
    # One summary line for the decoder layers' cross-attention outputs.
    line = (r"model\.decoder\.layers\.\*\.encoder_attn\.out_proj\.weight \(\d+, \d+\) "
            r"-> decoder_\*/encoder_attn/attention_output/kernel  \(x\d\)")  # fmt: skip
    assert re.search(line, out)
    assert (tmp_path / "back/encoder.json").read_text() == '{"a": 0}'
    config = bart.BartConfig.from_json_file(tmp_path / "back/bert_config.json")
    assert config == model.config
    back, _ = checkpoints.load_whole(bart.BartModel(config), tmp_path / "back")
    for mine, read in zip(model.weights, back.weights):
        np.testing.assert_array_equal(mine.numpy(), read.numpy(), err_msg=mine.path)
