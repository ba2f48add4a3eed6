"""GPT-2 and GPT-1 from and to Hugging Face's files against transformers
(tests/fixtures/gpt2_tiny and openai_gpt_tiny, written by tests/make_gpt_golden.py: a tiny
GPT2LMHeadModel with its byte-level BPE and a tiny OpenAIGPTLMHeadModel, seeded weights, and what
transformers computed and generated with them), so CI checks Cloze against an implementation no
one here wrote without installing PyTorch. Then the converted GPT-2 folder fine-tunes through
run_classifier.py and continues pretraining through create_lm_data.py and run_pretraining.py."""

import json
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from data_prep import bpe
from data_prep.errors import InputError
from modeling import checkpoints, gpt
from tests import helpers
from tests.conftest import ROOT
from tests.make_gpt_golden import NEW_TOKENS, VOCAB_STRIDE

GPT2 = ROOT / "tests" / "fixtures" / "gpt2_tiny"
GPT1 = ROOT / "tests" / "fixtures" / "openai_gpt_tiny"
TOLERANCE = 1e-5  # max absolute difference in float32


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Both fixtures converted with convert_checkpoint.py --from=hf --to=cloze."""
    root = tmp_path_factory.mktemp("gpt")
    for name, folder in (("gpt2", GPT2), ("gpt1", GPT1)):
        r = helpers.convert_checkpoint(
            "--from=hf", "--to=cloze", f"--input_dir={folder}", f"--output_dir={root / name}"
        )
        assert "converted GPT --from=hf to --to=cloze" in r.stdout
        assert "pre-training heads: included" in r.stdout
    assert (
        "transformer.h.*.attn.c_attn.weight (16, 48) -> encoder/h_*/attn/c_attn/kernel  (x2)"
        in r.stdout
    )
    return root


def golden(folder):
    return dict(np.load(folder / "golden.npz"))


def inputs(g):
    return {
        "input_ids": g["input_ids"].astype("int32"),
        "input_mask": g["input_mask"].astype("int32"),
    }


@pytest.mark.parametrize("name", ["gpt2", "gpt1"])
def test_converted_gpt_computes_what_transformers_computes(converted, name):
    """Every hidden state at the real tokens of a right-padded batch, and the LM logits. GPT-2's
    last hidden state in transformers is after ln_f (Cloze's sequence_output); GPT-1 has none."""
    folder = converted / name
    g = golden(GPT2 if name == "gpt2" else GPT1)
    files = ["bert_config.json", "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    files = sorted([*files, "encoder.json", "vocab.bpe"])  # vocab.json, merges.txt renamed
    assert sorted(p.name for p in folder.iterdir()) == files
    config = gpt.GptConfig.from_json_file(folder / "bert_config.json")
    position = "pre" if name == "gpt2" else "post"
    assert (config.layer_norm_position, config.n_vocab, config.n_ctx) == (position, 400, 64)
    assert config.activation_function == "gelu"  # gelu_new / GPT-1's "gelu": the tanh form
    model, _ = checkpoints.load_whole(gpt.GptLM(config), folder)
    out = model.encoder(inputs(g))
    real = g["input_mask"].astype(bool)
    states = [*out["encoder_outputs"][:-1], out["sequence_output"]]
    assert len(states) == len(g["hidden_states"]) == 3
    for got, want in zip(states, g["hidden_states"]):
        np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=TOLERANCE)
    logits = np.asarray(model(inputs(g))["lm_logits"])[..., ::VOCAB_STRIDE]
    np.testing.assert_allclose(logits[real], g["lm_logits"][real], atol=TOLERANCE)


def test_converted_gpt2_tokenizes_and_generates_as_transformers(converted):
    """The folder's byte-level BPE (GPT-2's files under OpenAI's names) gives GPT2Tokenizer's ids;
    greedy decoding, with the cache and without, continues the prompt with the tokens
    transformers' generate picked."""
    g = golden(GPT2)
    folder = converted / "gpt2"
    tok = bpe.ByteLevelBPE.from_files(folder / "encoder.json", folder / "vocab.bpe")
    offsets = g["tokenizer_offsets"]
    for i, text in enumerate(g["tokenizer_texts"]):
        assert tok.encode(str(text)) == g["tokenizer_ids"][offsets[i] : offsets[i + 1]].tolist()
    for text, ids, mask in zip(g["texts"], g["input_ids"], g["input_mask"]):
        assert tok.encode(str(text)) == ids[mask.astype(bool)].tolist()
    prompt = tok.encode(str(g["prompt"]))
    assert prompt == g["greedy_ids"][: len(prompt)].tolist()
    config = gpt.GptConfig.from_json_file(folder / "bert_config.json")
    model, _ = checkpoints.load_whole(gpt.GptLM(config), folder)
    for use_cache in (True, False):
        ids = gpt.generate(model, [prompt], NEW_TOKENS, temperature=0, use_cache=use_cache)
        assert ids[0].tolist() == g["greedy_ids"].tolist()


@pytest.mark.parametrize("name", ["gpt2", "gpt1"])
def test_cloze_to_hf_round_trips_bit_for_bit(converted, tmp_path, name):
    fixture = GPT2 if name == "gpt2" else GPT1
    out = tmp_path / "hf"
    helpers.convert_checkpoint(
        "--from=cloze", "--to=hf", f"--input_dir={converted / name}", f"--output_dir={out}"
    )
    files = [
        "config.json",
        "merges.txt",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.json",
    ]
    for file in ("merges.txt", "vocab.json"):  # GPT-2's byte-level BPE, GPT-1's word-end one
        assert (out / file).read_bytes() == (fixture / file).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == files
    mine, theirs = load_file(out / "model.safetensors"), load_file(fixture / "model.safetensors")
    assert sorted(mine) == sorted(theirs)
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)
    written, published = (json.loads((f / "config.json").read_text()) for f in (out, fixture))
    assert {k: published[k] for k in written} == written  # the keys written have its values
    tokenizer = json.loads((out / "tokenizer_config.json").read_text())
    kind = "GPT2Tokenizer" if name == "gpt2" else "OpenAIGPTTokenizer"
    assert tokenizer == {"tokenizer_class": kind}


def test_bare_gpt2_model_with_buffers_and_a_task_head_converts(tmp_path):
    """A bare GPT2Model file as older transformers saved the published gpt2 (no `transformer.`
    prefix, each layer's causal-mask buffers) plus a sequence classifier's head and a tied
    lm_head: the same model, the buffers and head listed as not converted."""
    arrays = load_file(GPT2 / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in arrays.items()}
    for i in range(2):
        bare[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        bare[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    bare["score.weight"] = np.zeros((2, 16), np.float32)
    bare["lm_head.weight"] = arrays["transformer.wte.weight"]
    folder = tmp_path / "bare"
    folder.mkdir()
    save_file(bare, str(folder / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(GPT2 / "config.json", folder / "config.json")
    config = gpt.config_from_hf(json.loads((folder / "config.json").read_text()))
    model, report = gpt.load_hf(folder, config)
    summary = report.summary()
    buffers = "h.0.attn.bias, h.0.attn.masked_bias, h.1.attn.bias, h.1.attn.masked_bias"
    assert f"not converted (a buffer (the causal mask), not a weight): {buffers}" in summary
    assert "a fine-tuning head (Cloze's task heads start fresh)): score.weight" in summary
    assert "lm_head.weight" in summary and "checked equal" in summary
    g = golden(GPT2)
    real = g["input_mask"].astype(bool)
    out = model.encoder(inputs(g))["sequence_output"]
    np.testing.assert_allclose(np.asarray(out)[real], g["hidden_states"][-1][real], atol=TOLERANCE)
    # An lm_head that is not the word embedding is refused before anything is assigned.
    bare["lm_head.weight"] = bare["lm_head.weight"] + 1
    save_file(bare, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"lm_head.weight: expected a copy of wte.weight"):
        gpt.load_hf(folder, config)


def test_hf_configs_that_compute_something_else_are_refused():
    gpt2 = json.loads((GPT2 / "config.json").read_text())
    gpt1 = json.loads((GPT1 / "config.json").read_text())
    for base, change, where in (
        (gpt2, {"scale_attn_by_inverse_layer_idx": True},
         "config.json: scale_attn_by_inverse_layer_idx: expected False"),
        (gpt2, {"add_cross_attention": True}, "config.json: add_cross_attention: expected False"),
        (gpt2, {"activation_function": "silu"},
         "config.json: activation_function: expected one of"),
        (gpt2, {"n_ctx": 32}, "config.json: n_ctx: expected n_positions (64), found 32"),
        (gpt2, {"made_up": 1},
         "expected the keys of a Hugging Face gpt2 config, found ['made_up']"),
        (gpt1, {"n_special": 2}, "config.json: n_special: expected 0"),
        (gpt1, {"afn": "swish"}, "config.json: afn: expected one of ['gelu', 'relu']"),
        (gpt1, {"n_inner": 64}, "the keys of a Hugging Face openai-gpt config, found ['n_inner']"),
        ({**gpt2, "model_type": "gptj"}, {}, "config.json: model_type: expected one of"),
        ({k: v for k, v in gpt2.items() if k != "n_embd"}, {}, "config.json: n_embd: expected"),
    ):  # fmt: skip
        with pytest.raises(InputError, match=re.escape(where)):
            gpt.config_from_hf({**base, **change})
    # The activations by their Hugging Face names; older configs' n_ctx beside n_positions.
    assert gpt.config_from_hf({**gpt2, "activation_function": "gelu"}).activation_function == (
        "gelu_exact"
    )
    assert gpt.config_from_hf({**gpt2, "n_ctx": 64, "n_inner": 48}).inner_size == 48
    assert gpt.config_from_hf({**gpt1, "afn": "relu"}).activation_function == "relu"
    post = gpt.config_from_hf(gpt1)
    for change in ({"activation_function": "gelu_exact"}, {"n_inner": 48}):
        with pytest.raises(ValueError, match=r"GPT-1 \(openai-gpt\) computes"):
            gpt.hf_config(post.replace(**change))
    assert gpt.hf_config(gpt.config_from_hf(gpt2).replace(n_inner=48))["n_inner"] == 48


def test_converted_gpt2_fine_tunes_through_run_classifier(converted, tmp_path):
    """The converted folder is --vocab_file (its encoder.json + vocab.bpe), --bert_config_file
    and --init_checkpoint at once: run_classifier's GPT path initialises the LM from it (GPT-2's
    vocabulary has no delimiters: <|endoftext|> stands for them) and learns two sentences."""
    helpers.converted_folder_learns_two_sentences(tmp_path, converted / "gpt2")


def test_a_converted_gpt2_continues_pretraining_on_blocks_of_its_own_bpe(converted, tmp_path):
    """create_lm_data.py --vocab_file=the converted folder: blocks of its byte-level BPE with
    <|endoftext|> after each document, the same as --encoder_file / --merges_file give;
    run_pretraining.py continues the converted GPT-2 on them from its checkpoint."""
    folder = converted / "gpt2"
    corpus = tmp_path / "corpus.txt"
    documents = ["The Cat sat on the MAT in Zürich.\nIt slept there.", "Hello world, 12 times."]
    corpus.write_text("\n\n".join(documents * 3) + "\n", encoding="utf-8")
    written = {}
    for how in ("folder", "files"):
        written[how] = tmp_path / f"{how}.tfrecord"
        vocab = (
            [f"--vocab_file={folder}"]
            if how == "folder"
            else [
                f"--encoder_file={folder / 'encoder.json'}",
                f"--merges_file={folder / 'vocab.bpe'}",
            ]
        )
        r = helpers.run_main("data_prep/create_lm_data.py", [
            f"--input_file={corpus}", f"--output_file={written[how]}", *vocab,
            "--block_size=16", "--num_workers=1",
        ])  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
    assert written["folder"].read_bytes() == written["files"].read_bytes()
    out = tmp_path / "pretrain"
    r = helpers.run_main("run_pretraining.py", [
        f"--bert_config_file={folder / 'bert_config.json'}", f"--input_file={written['folder']}",
        f"--init_checkpoint={folder}", f"--output_dir={out}", "--do_train", "--do_eval",
        "--max_seq_length=16", "--train_batch_size=2", "--eval_batch_size=2",
        "--num_train_steps=4", "--num_warmup_steps=1", "--save_checkpoints_steps=4",
        "--iterations_per_loop=2", "--max_eval_steps=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"initialised the model from {folder / 'ckpt-1'}" in r.stderr
    results = (out / "eval_results.txt").read_text()
    assert "global_step = 4" in results and "perplexity = " in results


def test_gpt1_tokenizer_equals_transformers_openaigpttokenizer():
    """GPT-1's word-end BPE (bpe.WordEndBPE, from the fixture's vocab.json + merges.txt: a
    vocabulary with "</w>" units is GPT-1's) gives OpenAIGPTTokenizer's ids and decoded text on
    every 25th README line, accented text and characters the vocabulary lacks (<unk>)."""
    g = np.load(GPT1 / "tokenizer_golden.npz")
    tokenizer = bpe.load_gpt_bpe(GPT1 / "vocab.json", GPT1 / "merges.txt")
    assert isinstance(tokenizer, bpe.WordEndBPE)
    assert (g["tokenizer_ids"] == tokenizer.encoder["<unk>"]).sum() >= 4  # the unknown path ran
    offsets = g["tokenizer_offsets"]
    for i, text in enumerate(g["tokenizer_texts"]):
        ids = tokenizer.encode(str(text))
        assert ids == g["tokenizer_ids"][offsets[i] : offsets[i + 1]].tolist(), str(text)
        assert tokenizer.decode(ids) == str(g["tokenizer_decoded"][i])
    again = bpe.WordEndBPE(tokenizer.encoder, tokenizer.merges)
    assert again.encode("Crème brûlée!") == tokenizer.encode("Crème brûlée!")


def test_a_converted_gpt1_fine_tunes_with_its_own_vocabulary_and_new_delimiters(
    converted, tmp_path
):
    """The converted GPT-1 folder carries its word-end BPE (as encoder.json + vocab.bpe) and is
    run_classifier's --vocab_file: the vocabulary has no delimiters nor <|endoftext|>, so the
    three are new tokens 400-402 whose rows are added at random to the checkpoint's 400 (GPT-1
    sec. 3.3), and the two sentences are learnt by heart; init_with_new_tokens keeps every
    checkpoint weight and the new rows as the model drew them."""
    from training import gpt_finetuning

    folder = converted / "gpt1"
    tokenizer = gpt_finetuning.load_bpe(str(folder))
    assert isinstance(tokenizer, bpe.WordEndBPE)
    assert gpt_finetuning.delimiter_ids(tokenizer, 400) == (400, 401, 402)
    with pytest.raises(ValueError, match="for the delimiter tokens"):
        gpt_finetuning.delimiter_ids(tokenizer)
    helpers.converted_folder_learns_two_sentences(tmp_path, folder)
    config = gpt.GptConfig.from_json_file(folder / "bert_config.json")
    grown = gpt.GptClassifier(config.replace(n_vocab=403), 2)
    grown.build()
    fresh = grown.encoder.wte.numpy()
    gpt_finetuning.init_with_new_tokens(grown, str(folder), config, 2)
    lm, _ = checkpoints.load_whole(gpt.GptLM(config), folder)
    table = grown.encoder.wte.numpy()
    np.testing.assert_array_equal(table[:400], lm.encoder.wte.numpy())
    np.testing.assert_array_equal(table[400:], fresh[400:])
    for a, b in zip(grown.encoder.weights[1:], lm.encoder.weights[1:], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_gpt1_blocks_need_an_end_of_text_token_named(converted, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat.\n\nThe dog barked.\n")
    args = [f"--input_file={corpus}", f"--vocab_file={converted / 'gpt1'}", "--block_size=8",
            "--num_workers=1"]  # fmt: skip
    r = helpers.run_main(
        "data_prep/create_lm_data.py", [*args, f"--output_file={tmp_path / 'a.tfrecord'}"]
    )
    assert r.returncode != 0 and "a GPT-1 vocabulary has none" in r.stderr
    r = helpers.run_main(
        "data_prep/create_lm_data.py",
        [*args, "--end_of_text=<unk>", f"--output_file={tmp_path / 'b.tfrecord'}"],
    )
    assert r.returncode == 0, r.stderr[-3000:]


def openai_names(arrays: dict) -> dict:
    """Hugging Face's GPT-2 arrays under OpenAI's released names (github.com/openai/gpt-2
    src/model.py: scope `model`, blocks `h{i}`, conv1d weights (1, in, out) as `w`, norms' `g` and
    `b`), the layout download_model.py fetches."""
    out = {}
    for name, value in arrays.items():
        name = re.sub(r"^h\.(\d+)\.", r"h\1.", name.removeprefix("transformer."))
        if re.search(r"ln_\w+\.weight$", name):
            name = name.removesuffix("weight") + "g"
        elif name.endswith(".bias"):
            name = name.removesuffix("bias") + "b"
        elif name in ("wte.weight", "wpe.weight"):
            name = name.removesuffix(".weight")
        else:  # a Conv1D's (in, out) weight
            name, value = name.removesuffix("weight") + "w", value[None]
        out["model/" + name.replace(".", "/")] = value
    return out


def test_openai_gpt2_release_converts_both_ways(tmp_path):
    """A folder laid out as OpenAI's GPT-2 download (model.ckpt with src/model.py's names,
    hparams.json, encoder.json, vocab.bpe), made from the Hugging Face fixture: --from=tf1_gpt2
    computes what transformers computed, and --to=tf1_gpt2 writes the same arrays back."""
    release = tmp_path / "124M"
    release.mkdir()
    arrays = openai_names(load_file(GPT2 / "model.safetensors"))
    assert sorted(arrays)[:4] == ["model/h0/attn/c_attn/b", "model/h0/attn/c_attn/w",
                                  "model/h0/attn/c_proj/b", "model/h0/attn/c_proj/w"]  # fmt: skip
    assert arrays["model/h1/mlp/c_fc/w"].shape == (1, 16, 64) and "model/ln_f/g" in arrays
    checkpoints._save_tf1_arrays(arrays, release, "model.ckpt")
    hparams = {"n_vocab": 400, "n_ctx": 64, "n_embd": 16, "n_head": 2, "n_layer": 2}
    (release / "hparams.json").write_text(json.dumps(hparams))
    shutil.copy(GPT2 / "vocab.json", release / "encoder.json")
    shutil.copy(GPT2 / "merges.txt", release / "vocab.bpe")
    cloze = tmp_path / "cloze"
    r = helpers.convert_checkpoint(
        "--from=tf1_gpt2", "--to=cloze", f"--input_dir={release}", f"--output_dir={cloze}"
    )
    assert "model/h*/mlp/c_fc/w (1, 16, 64) -> encoder/h_*/c_fc/kernel  (x2)" in r.stdout
    assert (cloze / "vocab.bpe").read_bytes() == (GPT2 / "merges.txt").read_bytes()
    g = golden(GPT2)
    config = gpt.GptConfig.from_json_file(cloze / "bert_config.json")
    model, _ = checkpoints.load_whole(gpt.GptLM(config), cloze)
    logits = np.asarray(model(inputs(g))["lm_logits"])[..., ::VOCAB_STRIDE]
    real = g["input_mask"].astype(bool)
    np.testing.assert_allclose(logits[real], g["lm_logits"][real], atol=TOLERANCE)
    back = tmp_path / "back"
    helpers.convert_checkpoint(
        "--from=cloze", "--to=tf1_gpt2", f"--input_dir={cloze}", f"--output_dir={back}"
    )
    assert sorted(p.name for p in back.iterdir()) == [
        "checkpoint", "encoder.json", "hparams.json", "model.ckpt.data-00000-of-00001",
        "model.ckpt.index", "vocab.bpe",
    ]  # fmt: skip
    assert json.loads((back / "hparams.json").read_text()) == hparams
    written = checkpoints.TFCheckpointSource(str(back / "model.ckpt"))
    assert sorted(written.shapes) == sorted(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(written.read(name), value, err_msg=name)
    # A GPT-1 (post-LN) is not what the released GPT-2 code computes: refused, nothing written.
    r = helpers.run_main("convert_checkpoint.py", [
        "--from=hf", "--to=tf1_gpt2", f"--input_dir={GPT1}", f"--output_dir={tmp_path / 'no'}",
    ])  # fmt: skip
    assert r.returncode == 1
    assert "'layer_norm_position': 'post'}: OpenAI's GPT-2 code computes" in r.stderr
    assert not (tmp_path / "no").exists()


def test_a_gpt2_goes_to_a_keras_hub_preset(converted, tmp_path):
    """--to=keras_hub of a converted GPT-2: keras-hub's GPT2Backbone and GPT2Tokenizer load the
    preset offline and compute what transformers computed with the published files; a GPT-1
    (post-LN, which keras-hub's GPT-2 is not) is refused."""
    import keras_hub

    out = tmp_path / "preset"
    helpers.convert_checkpoint(
        "--from=cloze", "--to=keras_hub", f"--input_dir={converted / 'gpt2'}", f"--output_dir={out}"
    )
    g = golden(GPT2)
    backbone = keras_hub.models.GPT2Backbone.from_preset(str(out))
    states = backbone({"token_ids": g["input_ids"], "padding_mask": g["input_mask"]})
    real = g["input_mask"].astype(bool)
    want = g["hidden_states"][-1]  # after ln_f, as the backbone's output
    np.testing.assert_allclose(np.asarray(states)[real], want[real], atol=TOLERANCE)
    tokenizer = keras_hub.models.GPT2Tokenizer.from_preset(str(out))
    for text, ids, mask in zip(g["texts"], g["input_ids"], g["input_mask"]):
        assert np.asarray(tokenizer(str(text))).tolist() == ids[mask.astype(bool)].tolist()
    r = helpers.run_main("convert_checkpoint.py", [
        "--from=cloze", "--to=keras_hub", f"--input_dir={converted / 'gpt1'}",
        f"--output_dir={tmp_path / 'no'}",
    ])  # fmt: skip
    assert r.returncode == 1 and "keras-hub's GPT2Backbone is pre-LN" in r.stderr
