"""GPT / GPT-2: config, causality, the cached decode against the full forward pass, keras-hub's
GPT2Backbone as an independent implementation, sampling filters, seeded generation, and the
GPT-1 classifier."""

import json

import keras
import numpy as np
import pytest
from keras import ops

from data_prep.errors import InputError
from modeling import gpt
from tests import helpers

# Odd sizes (shared/STYLE.md): vocab 29, context 13, hidden 12, heads 3, inner 17, 2 layers.
TINY = dict(n_vocab=29, n_ctx=13, n_embd=12, n_head=3, n_layer=2, n_inner=17)


def tiny(**changes):
    config = gpt.GptConfig(
        **{**TINY, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0} | changes
    )
    keras.utils.set_random_seed(3)
    model = gpt.GptLM(config)
    model.build()
    # Non-zero LayerNorm offsets and biases, so a swapped or skipped one shows.
    rng = np.random.default_rng(0)
    for w in model.weights:
        w.assign(w.numpy() + rng.normal(0, 0.05, w.shape).astype("float32"))
    return model


def ids(batch=3, length=7, seed=1):
    return np.random.default_rng(seed).integers(0, TINY["n_vocab"], (batch, length)).astype("int32")


def test_config_reads_openai_hparams_and_refuses_unknown_keys(tmp_path):
    path = tmp_path / "hparams.json"
    path.write_text(
        json.dumps({"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12})
    )  # OpenAI's released file, verbatim
    config = gpt.GptConfig.from_json_file(path)
    assert config.inner_size == 3072 and config.layer_norm_position == "pre"
    assert gpt.GptConfig.from_dict(json.loads(config.to_json_string())) == config
    with pytest.raises(InputError, match="unknown key"):
        gpt.GptConfig.from_dict({**TINY, "n_positions": 5})
    with pytest.raises(InputError, match=r"missing key\(s\) \['n_ctx'\]"):
        gpt.GptConfig.from_dict({k: v for k, v in TINY.items() if k != "n_ctx"})
    with pytest.raises(InputError, match="layer_norm_position"):
        gpt.GptConfig.from_dict({**TINY, "layer_norm_position": "middle"})


@pytest.mark.parametrize("position", ["pre", "post"])
def test_no_position_sees_the_future(position):
    model = tiny(layer_norm_position=position)
    x = ids()
    base = model({"input_ids": x})["lm_logits"].numpy()
    for t in range(1, 7):
        changed = x.copy()
        changed[:, t] = (changed[:, t] + 1) % TINY["n_vocab"]
        out = model({"input_ids": changed})["lm_logits"].numpy()
        np.testing.assert_allclose(out[:, :t], base[:, :t], atol=1e-6)  # earlier: unchanged
        assert np.abs(out[:, t:] - base[:, t:]).max() > 1e-4  # from t on: changed


@pytest.mark.parametrize("position", ["pre", "post"])
def test_cached_incremental_decode_equals_the_full_forward(position):
    model = tiny(layer_norm_position=position)
    x = ids(length=9)
    full = model({"input_ids": x})["lm_logits"].numpy()
    cache = model.encoder.empty_cache(3, 11)
    out = model({"input_ids": x[:, :4]}, cache=cache, cache_index=0)
    np.testing.assert_allclose(out["lm_logits"].numpy(), full[:, :4], atol=1e-5)
    for t in range(4, 9):
        out = model({"input_ids": x[:, t : t + 1]}, cache=out["cache"], cache_index=t)
        np.testing.assert_allclose(out["lm_logits"].numpy()[:, 0], full[:, t], atol=1e-5)


def test_padding_mask_hides_padded_keys():
    model = tiny()
    x = ids()
    mask = np.ones_like(x)
    mask[:, 2] = 0  # a hole: position 2 must not influence any later position
    changed = x.copy()
    changed[:, 2] = (changed[:, 2] + 5) % TINY["n_vocab"]
    a = model({"input_ids": x, "input_mask": mask})["lm_logits"].numpy()
    b = model({"input_ids": changed, "input_mask": mask})["lm_logits"].numpy()
    np.testing.assert_allclose(a[:, 3:], b[:, 3:], atol=1e-6)


def test_equals_keras_hub_gpt2_backbone():
    """keras-hub's GPT2Backbone (pre-LN, tanh GELU, eps 1e-5) with our weights copied in gives
    the same final hidden states: an implementation no one here wrote."""

    model = tiny()
    enc = model.encoder
    ref = gpt.to_keras_hub(model)
    x = ids()
    mask = np.ones_like(x)
    mask[0, 5:] = 0  # right padding, as keras-hub pads
    theirs = ref({"token_ids": x, "padding_mask": mask}).numpy()
    ours = enc({"input_ids": x, "input_mask": mask})["sequence_output"].numpy()
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], theirs[real], atol=2e-5)


def test_filters_keep_the_right_tokens():
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]], np.float32))
    kept = lambda out: np.isfinite(np.asarray(out))[0].tolist()  # noqa: E731
    assert kept(gpt.filter_logits(logits, top_k=2)) == [True, True, False, False, False]
    assert kept(gpt.filter_logits(logits, top_p=0.5)) == [True, False, False, False, False]
    assert kept(gpt.filter_logits(logits, top_p=0.6)) == [True, True, False, False, False]
    assert kept(gpt.filter_logits(logits, top_p=0.86)) == [True, True, True, True, False]
    assert kept(gpt.filter_logits(logits[:, ::-1], top_k=1)) == [False] * 4 + [True]


def test_generation_is_seeded_and_the_cache_changes_nothing():
    model = tiny()
    prompt = ids(batch=2, length=3)
    a = gpt.generate(model, prompt, 6, temperature=1.5, seed=7)
    assert a.shape == (2, 9) and (a[:, :3] == prompt).all()
    np.testing.assert_array_equal(a, gpt.generate(model, prompt, 6, temperature=1.5, seed=7))
    np.testing.assert_array_equal(
        a, gpt.generate(model, prompt, 6, temperature=1.5, seed=7, use_cache=False)
    )
    assert not np.array_equal(a, gpt.generate(model, prompt, 6, temperature=1.5, seed=8))
    greedy = gpt.generate(model, prompt, 6, temperature=0)
    np.testing.assert_array_equal(greedy, gpt.generate(model, prompt, 6, top_k=1, seed=3))
    np.testing.assert_array_equal(greedy, gpt.generate(model, prompt, 6, top_p=1e-6, seed=4))
    with pytest.raises(ValueError, match="n_ctx"):
        gpt.generate(model, prompt, 11)


def test_greedy_generation_equals_keras_hub_gpt2_causal_lm():
    """keras-hub's GPT2CausalLM (its own cache, greedy sampler) over the same weights continues
    the prompts with the same ids as generate's compiled cached steps; GPT-1's post-LN has no
    keras-hub counterpart and is refused by to_keras_hub."""
    import keras_hub

    model = tiny()
    helpers.scramble_weights(model, 4.0)
    lm = keras_hub.models.GPT2CausalLM(backbone=gpt.to_keras_hub(model), preprocessor=None)
    lm.compile(sampler="greedy")
    prompt = ids(batch=3, length=4)
    inputs = {
        "token_ids": np.concatenate([prompt, np.zeros((3, 8), np.int32)], axis=1),
        "padding_mask": np.arange(12)[None].repeat(3, 0) < 4,
    }
    theirs = lm.generate(inputs, stop_token_ids=None)["token_ids"]
    ours = gpt.generate(model, prompt, 8, temperature=0)
    assert len(np.unique(ours[:, 4:])) >= 3, ours
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(ValueError, match="pre-LN"):
        gpt.to_keras_hub(tiny(layer_norm_position="post"))


def test_classifier_reads_the_extract_token_and_round_trips_its_config():
    config = gpt.GptConfig(**TINY)
    keras.utils.set_random_seed(0)
    model = gpt.GptClassifier(config, num_classes=5)
    model.build()
    x = ids()
    mask = np.ones_like(x)
    mask[1, 4:] = 0
    out = model({"input_ids": x, "input_mask": mask})
    assert out["logits"].shape == (3, 5) and out["lm_logits"].shape == (3, 7, 29)
    changed = x.copy()
    changed[1, 5] = (changed[1, 5] + 1) % 29  # padding after the extract token: no effect
    again = model({"input_ids": changed, "input_mask": mask})
    np.testing.assert_allclose(again["logits"][1], out["logits"][1], atol=1e-6)
    clone = gpt.GptClassifier.from_config(model.get_config())
    assert clone.get_config() == model.get_config()


@pytest.mark.parametrize("which", ["lm_pre_ln", "lm_post_ln", "classifier"])
def test_lm_terms_equal_the_logits_path_in_loss_and_every_gradient(which):
    # lm_terms (gpt.next_token_terms: the vocabulary-major head without the (B, T, V) logits,
    # wte's lookup and head gradients met in one pass) against causal_lm_sums of lm_logits,
    # the path they replace in training: the same sums and gradients to every weight, with a
    # padded row (its padded targets weigh 0).
    from modeling import losses

    if which == "classifier":
        keras.utils.set_random_seed(0)
        model = gpt.GptClassifier(gpt.GptConfig(**TINY), num_classes=5)
        model.build()
    else:
        model = tiny(layer_norm_position=which[3:-3])
    x = ids()
    mask = np.ones_like(x)
    mask[1, 4:] = 0
    inputs = {"input_ids": x, "input_mask": mask}

    def with_logits(out, sums):  # the classifier's own loss rides along
        return sums, sums["loss_sum"] + (ops.sum(out["logits"][:, 1]) if "logits" in out else 0)

    def fast():
        out = model(inputs, lm_terms=True)
        assert "lm_logits" not in out and out["lm_xent"].shape == (3, 6)
        return with_logits(out, losses.causal_lm_sums_of(out["lm_xent"], out["lm_hits"], mask))

    def plain():
        out = model(inputs)
        sums = losses.causal_lm_sums(out["lm_logits"], x, mask)
        assert float(sums["weight"]) == 3 * 6 - 3
        return with_logits(out, sums)

    helpers.check_loss_paths_agree(model, fast, plain)
    assert any(v.path.endswith("wte") for v in model.trainable_variables)
    if which != "classifier":  # (the classifier takes no cache)
        with pytest.raises(ValueError, match="without a cache"):
            model(inputs, cache=model.encoder.empty_cache(3, 7), lm_terms=True)


def test_lm_data_script_and_gpt_pretraining_end_to_end(tmp_path):
    """create_lm_data.py with a learned byte-level BPE, then run_pretraining.py on a GPT config:
    loss and perplexity written, a rerun resumes, BERT records and BERT flags are refused."""
    import math

    from data_prep import bpe
    from tests import helpers

    text = [
        f"document {d}: " + " ".join(f"word{(d * 7 + i) % 13}" for i in range(40))
        for d in range(30)
    ]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(text) + "\n", encoding="utf-8")
    merges = bpe.learn_bpe(bpe.byte_words(text), 40)
    tok = bpe.ByteLevelBPE(bpe.byte_level_vocab(merges), merges)
    enc, mer = tok.save(tmp_path / "bpe")
    config = tmp_path / "gpt.json"
    config.write_text(json.dumps({**TINY, "n_vocab": len(tok.encoder), "n_ctx": 16}))

    def run(script, *args):
        # create_lm_data.py as a real command line (its one in the suite); run_pretraining.py
        # in this process.
        return helpers.run_script(script, args, command_line=script != "run_pretraining.py")

    r = run(
        "data_prep/create_lm_data.py",
        f"--input_file={corpus}",
        f"--output_file={tmp_path / 'lm.tfrecord'}",
        f"--encoder_file={enc}",
        f"--merges_file={mer}",
        "--block_size=16",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "blocks of 16 ids (30 documents" in r.stdout
    common = [
        f"--bert_config_file={config}",
        f"--input_file={tmp_path / 'lm.tfrecord'}",
        f"--output_dir={tmp_path / 'out'}",
        "--max_seq_length=16",
        "--train_batch_size=4",
        "--eval_batch_size=4",
        "--num_warmup_steps=1",
        "--save_checkpoints_steps=2",
        "--iterations_per_loop=2",
        "--max_eval_steps=2",
        "--learning_rate=1e-2",
    ]
    r = run("run_pretraining.py", *common, "--num_train_steps=4", "--do_train", "--do_eval")
    assert r.returncode == 0, r.stderr[-3000:]
    results = dict(
        line.split(" = ")
        for line in (tmp_path / "out" / "eval_results.txt").read_text().splitlines()
    )
    assert int(results["global_step"]) == 4
    assert float(results["perplexity"]) == pytest.approx(math.exp(float(results["lm_loss"])))
    first = json.loads((tmp_path / "out" / "eval_log.jsonl").read_text().splitlines()[0])
    assert float(results["lm_loss"]) < first["lm_loss"]  # it learned something in 4 steps
    assert (tmp_path / "out" / "training_curves.png").exists()
    r = run("run_pretraining.py", *common, "--num_train_steps=6", "--do_train")
    assert r.returncode == 0 and "resumed from" in r.stderr
    bert = tmp_path / "bert.tfrecord"
    helpers.write_synthetic_pretraining_file(bert, 8, 16, 3, 30)
    r = run(
        "run_pretraining.py",
        *[a for a in common if not a.startswith("--input_file")],
        f"--input_file={bert}",
        "--num_train_steps=2",
        "--do_train",
    )
    assert r.returncode != 0 and "bert.tfrecord: expected language-model blocks" in r.stderr
    r = run("run_pretraining.py", *common, "--num_train_steps=2", "--do_train", "--masking=dynamic")
    assert r.returncode != 0 and "a GPT config trains a causal LM" in r.stderr
