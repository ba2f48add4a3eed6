"""T5 from and to Hugging Face's files against transformers (tests/fixtures/t5_tiny: relu, tied,
with its SentencePiece model; tests/fixtures/t5_v1_1_tiny: gated-gelu, untied lm_head; written
by tests/make_t5_golden.py from transformers' T5ForConditionalGeneration with seeded weights,
with what transformers computed and generated), so CI checks Cloze against an implementation no
one here wrote without installing PyTorch. Then the converted folder fine-tunes through
run_text2text.py with T5's own SentencePiece tokenization."""

import json
import re

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from data_prep import seq2seq_data
from data_prep.errors import InputError
from modeling import checkpoints, t5
from tests import helpers
from tests.conftest import ROOT
from tests.make_t5_golden import EXTRA_IDS, NEW_TOKENS, VOCAB_STRIDE

T5 = ROOT / "tests" / "fixtures" / "t5_tiny"
V1_1 = ROOT / "tests" / "fixtures" / "t5_v1_1_tiny"
TOLERANCE = 1e-5  # max absolute difference in float32
# The logits are 320-wide sums over the decoder states and reach |6|; float32 rounding there grows
# with the value (CI measured 1.5e-5 near 1.9, a relative 8e-6), so they also get a relative term.
LOGITS_RTOL = 1e-5
FIXTURES = {"t5": T5, "v1_1": V1_1}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Both fixtures converted with convert_checkpoint.py --from=hf --to=cloze."""
    root = tmp_path_factory.mktemp("t5")
    for name, folder in FIXTURES.items():
        r = helpers.convert_checkpoint(
            "--from=hf", "--to=cloze", f"--input_dir={folder}", f"--output_dir={root / name}"
        )
        assert "converted T5 --from=hf to --to=cloze" in r.stdout
    gated = (
        "decoder.block.*.layer.2.DenseReluDense.wi_0.weight (32, 16) -> decoder_*/wi/kernel  (x3)"
    )
    assert gated in r.stdout
    return root


def golden(name):
    return dict(np.load(FIXTURES[name] / "golden.npz"))


def load(folder):
    config = t5.T5Config.from_json_file(folder / "bert_config.json")
    return checkpoints.load_whole(t5.T5Model(config), folder)[0]


@pytest.mark.parametrize("name", ["t5", "v1_1"])
def test_converted_t5_computes_and_generates_what_transformers_does(converted, name):
    """Encoder states at the real source tokens, decoder states and logits under teacher forcing
    at the real target positions, and greedy decoding token for token."""
    g = golden(name)
    model = load(converted / name)
    c = model.config
    want = ("relu", True) if name == "t5" else ("gated-gelu", False)
    assert (c.feed_forward_proj, c.tie_word_embeddings, c.vocab_size) == (*want, 320)
    inputs = {
        "input_ids": g["input_ids"].astype("int32"),
        "input_mask": g["input_mask"].astype("int32"),
        "decoder_input_ids": g["decoder_input_ids"].astype("int32"),
    }
    out = model(inputs)
    src, tgt = g["input_mask"].astype(bool), g["target_mask"].astype(bool)
    enc = np.asarray(out["encoder_output"])
    np.testing.assert_allclose(enc[src], g["encoder_states"][src], atol=TOLERANCE)
    dec = np.asarray(out["decoder_output"])
    np.testing.assert_allclose(dec[tgt], g["decoder_states"][tgt], atol=TOLERANCE)
    logits = np.asarray(out["lm_logits"])[..., ::VOCAB_STRIDE]
    np.testing.assert_allclose(logits[tgt], g["lm_logits"][tgt], atol=TOLERANCE, rtol=LOGITS_RTOL)
    greedy = t5.greedy_decode(model, inputs["input_ids"], inputs["input_mask"], NEW_TOKENS)
    want = g["greedy_ids"][:, 1:]  # transformers' rows start with the decoder start
    # Both pad a row after its </s>; Cloze stops early when every row has ended.
    assert greedy.shape[1] <= want.shape[1] and not want[:, greedy.shape[1] :].any()
    np.testing.assert_array_equal(greedy, want[:, : greedy.shape[1]])
    assert (want == c.eos_token_id).any() or name == "t5"  # an early </s> is among the checks


def test_t5_sentencepiece_vocabulary_is_t5_tokenizers(converted):
    """Seq2SeqVocab.from_spiece over the converted folder's spiece.model: T5Tokenizer's ids (the
    library's pieces of the raw text, </s> after), sentinels counted down from the end."""
    g = golden("t5")
    vocab = seq2seq_data.Seq2SeqVocab.from_spiece(converted / "t5" / "spiece.model", EXTRA_IDS)
    assert (vocab.pad_id, vocab.eos_id, vocab.size) == (0, 1, 310)
    assert vocab.sentinel_ids[:2] == (309, 308) and vocab.mask_id is None
    offsets = g["tokenizer_offsets"]
    for i, text in enumerate(g["tokenizer_texts"]):
        assert vocab.encode(str(text)) == g["tokenizer_ids"][offsets[i] : offsets[i + 1]].tolist()
    for text, ids, mask in zip(g["sources"], g["input_ids"], g["input_mask"]):
        assert vocab.wrap(vocab.encode(str(text))) == ids[mask.astype(bool)].tolist()
    assert vocab.decode(vocab.encode("The house is wonderful.") + [1, 5]) == (
        "The house is wonderful."
    )
    assert vocab.decode([309, 315]) == "<extra_id_0>"  # an id past the pieces decodes to nothing


@pytest.mark.parametrize("name", ["t5", "v1_1"])
def test_cloze_to_hf_round_trips_bit_for_bit(converted, tmp_path, name):
    fixture = FIXTURES[name]
    out = tmp_path / "hf"
    helpers.convert_checkpoint(
        "--from=cloze", "--to=hf", f"--input_dir={converted / name}", f"--output_dir={out}"
    )
    files = ["config.json", "model.safetensors", *(["spiece.model"] if name == "t5" else [])]
    assert sorted(p.name for p in out.iterdir()) == files
    mine, theirs = load_file(out / "model.safetensors"), load_file(fixture / "model.safetensors")
    tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    if name == "t5":
        tied.add("lm_head.weight")
    assert sorted(mine) == sorted(set(theirs) - tied)  # the tied copies left out, as transformers
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)
    written, published = (json.loads((f / "config.json").read_text()) for f in (out, fixture))
    assert {k: published[k] for k in written} == written  # the keys written have its values


def test_hf_configs_that_compute_something_else_are_refused():
    published = json.loads((T5 / "config.json").read_text())
    for change, where in (
        ({"model_type": "umt5"}, "config.json: model_type: expected 't5'"),
        ({"feed_forward_proj": "gated-silu"}, "config.json: feed_forward_proj: expected one of"),
        ({"dense_act_fn": "gelu_new"}, "config.json: dense_act_fn: expected 'relu'"),
        ({"made_up": 1}, "expected the keys of a Hugging Face T5 config, found ['made_up']"),
    ):
        with pytest.raises(InputError, match=re.escape(where)):
            t5.config_from_hf({**published, **change})
    v1_1 = json.loads((V1_1 / "config.json").read_text())
    assert t5.config_from_hf(v1_1).feed_forward_proj == "gated-gelu"


def test_a_v1_1_folder_saved_by_transformers_5_converts(tmp_path):
    """transformers 5 saves a T5 v1.1 with tie_word_embeddings true, scale_decoder_outputs false
    and no lm_head.weight when the head equals `shared`: Cloze reads it as untied and unscaled,
    its lm_head a copy of `shared`."""
    arrays = load_file(V1_1 / "model.safetensors")
    arrays["lm_head.weight"] = arrays["shared.weight"].copy()
    values = json.loads((V1_1 / "config.json").read_text())
    values |= {"tie_word_embeddings": True, "scale_decoder_outputs": False}
    config = t5.config_from_hf(values)
    assert not config.tie_word_embeddings
    folder = tmp_path / "v5"
    folder.mkdir()
    del arrays["lm_head.weight"]
    save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model, _ = t5.load_hf(folder, config)
    np.testing.assert_array_equal(model.lm_head.numpy(), arrays["shared.weight"])
    assert t5.config_from_hf({**values, "scale_decoder_outputs": True}).tie_word_embeddings


def test_converted_t5_fine_tunes_through_run_text2text_with_its_sentencepiece(converted, tmp_path):
    """run_text2text.py with the converted folder as --vocab_file (its spiece.model), config and
    --init_checkpoint: the released layout's ids (pad 0 starts decoding, </s> 1) are checked
    against the config, it learns two label words by heart and writes them back as text."""
    folder = converted / "t5"
    data = tmp_path / "sst"
    data.mkdir()
    rows = ["The house is wonderful.\t1", "The dessert costs francs.\t0"] * 8
    (data / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (data / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:2]) + "\n")
    out = tmp_path / "out"
    r = helpers.run_main("run_text2text.py", [
        "--task_name=sst-2", f"--data_dir={data}", f"--vocab_file={folder}",
        f"--bert_config_file={folder / 'bert_config.json'}", f"--init_checkpoint={folder}",
        f"--output_dir={out}", f"--num_sentinels={EXTRA_IDS}", "--do_train", "--do_eval",
        "--max_seq_length=48", "--max_target_length=12", "--train_batch_size=4",
        "--learning_rate=1e-2", "--num_train_epochs=12",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "train.tsv: 16 examples, 0 truncated" in r.stderr
    lines = (out / "eval_results.txt").read_text().splitlines()
    results = dict(line.split(" = ") for line in lines)
    assert float(results["accuracy"]) == 1.0
    predictions = (out / "dev_predictions.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[1] for row in predictions] == ["positive", "negative"]
    r = helpers.run_main("run_text2text.py", [
        "--task_name=sst-2", f"--data_dir={data}", f"--vocab_file={folder}",
        f"--bert_config_file={folder / 'bert_config.json'}", f"--output_dir={tmp_path / 'x'}",
        "--do_eval", "--encoder_file=encoder.json",
    ])  # fmt: skip
    assert r.returncode != 0 and "--vocab_file or --encoder_file and --merges_file" in r.stderr
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    r = helpers.run_main("run_text2text.py", [
        "--task_name=sst-2", f"--data_dir={data}", f"--vocab_file={tmp_path / 'vocab.txt'}",
        f"--bert_config_file={folder / 'bert_config.json'}", f"--output_dir={tmp_path / 'x'}",
        "--do_eval",
    ])  # fmt: skip
    assert r.returncode != 0
    assert "vocab.txt: expected a T5's SentencePiece model (spiece.model or a folder" in r.stderr


def test_a_converted_t5_continues_pretraining_on_span_corruption_of_its_own_pieces(
    converted, tmp_path
):
    """create_seq2seq_data.py --vocab_file=the converted folder: T5 span corruption of its
    spiece.model's pieces (the records put back together are the corpus's pieces, sentence after
    sentence), which run_pretraining.py trains the converted T5 on from its checkpoint."""
    from data_prep import noising

    folder = converted / "t5"
    sentences = ["The house is wonderful.", "Crème brûlée costs 12 francs!", "Hello world."]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences * 2) + "\n\n" + "\n".join(sentences) + "\n")
    out = tmp_path / "t5.tfrecord"
    r = helpers.run_main("data_prep/create_seq2seq_data.py", [
        f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={folder}",
        f"--num_sentinels={EXTRA_IDS}", "--noising=t5_span", "--max_seq_length=48",
        "--max_target_length=16", "--num_workers=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "T5 config: vocab_size >= 310, pad_token_id=0, eos_token_id=1" in r.stdout
    r = helpers.run_main("data_prep/create_seq2seq_data.py", [
        f"--input_file={corpus}", f"--output_file={tmp_path / 'no.tfrecord'}",
        f"--vocab_file={folder}", "--noising=bart_infill",
    ])  # fmt: skip
    assert r.returncode != 0 and "BART's records need its BPE files" in r.stderr
    assert not (tmp_path / "no.tfrecord").exists()
    vocab = seq2seq_data.Seq2SeqVocab.from_spiece(folder / "spiece.model", EXTRA_IDS)
    pieces = []
    for inputs, targets in seq2seq_data.read_seq2seq_records(str(out)):
        assert inputs[-1] == targets[-1] == vocab.eos_id
        assert any(t in vocab.sentinel_ids for t in inputs)
        whole = noising.t5_reconstruct(inputs, targets, vocab.sentinel_ids)
        pieces += [i for i in whole if i != vocab.eos_id]  # the targets' </s> and the inputs'
    want = [i for s in sentences * 3 for i in vocab.encode(s)]
    assert pieces == want
    run = tmp_path / "run"
    r = helpers.run_main("run_pretraining.py", [
        f"--bert_config_file={folder / 'bert_config.json'}", f"--input_file={out}",
        f"--init_checkpoint={folder}", f"--output_dir={run}", "--do_train", "--do_eval",
        "--max_seq_length=48", "--train_batch_size=2",
        "--eval_batch_size=2", "--num_train_steps=2", "--num_warmup_steps=1",
        "--save_checkpoints_steps=2", "--iterations_per_loop=2", "--max_eval_steps=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"initialised the model from {folder / 'ckpt-1'}" in r.stderr
    assert "global_step = 2" in (run / "eval_results.txt").read_text()


def test_a_t5_goes_to_a_keras_hub_preset(converted, tmp_path):
    """--to=keras_hub of a Cloze T5 that keras-hub's T5Backbone computes (relu, tied, as many
    decoder as encoder layers; t5_tiny's encoder and decoder weights with its third decoder
    block left out): keras-hub loads the preset offline, its backbone gives Cloze's states and
    its T5Tokenizer the spiece.model's ids. The fixture itself (3 decoder layers) and a T5 v1.1
    (gated-gelu) are refused, naming what keras-hub's T5 lacks."""
    import keras_hub

    g = golden("t5")
    model = load(converted / "t5")
    config = model.config.replace(num_decoder_layers=None)  # 2 + 2
    two = t5.T5Model(config)
    two.build()
    ours = checkpoints.cloze_variables(two)
    theirs = checkpoints.cloze_variables(model)
    for name, variable in ours.items():
        variable.assign(theirs[name])
    folder = tmp_path / "cloze"
    folder.mkdir()
    checkpoints.save_whole(two, folder)
    (folder / "bert_config.json").write_text(config.to_json_string())
    (folder / "spiece.model").write_bytes((T5 / "spiece.model").read_bytes())
    out = tmp_path / "preset"
    helpers.convert_checkpoint(
        "--from=cloze", "--to=keras_hub", f"--input_dir={folder}", f"--output_dir={out}"
    )
    backbone = keras_hub.models.T5Backbone.from_preset(str(out))
    x = {k: g[k].astype("int32") for k in ("input_ids", "input_mask", "decoder_input_ids")}
    mine = two(x)
    preset = backbone({
        "encoder_token_ids": x["input_ids"], "encoder_padding_mask": x["input_mask"],
        "decoder_token_ids": x["decoder_input_ids"],
        "decoder_padding_mask": np.ones_like(x["decoder_input_ids"]),
    })  # fmt: skip
    src = g["input_mask"].astype(bool)
    np.testing.assert_allclose(
        np.asarray(preset["encoder_sequence_output"])[src], np.asarray(mine["encoder_output"])[src],
        atol=2e-5,
    )  # fmt: skip
    np.testing.assert_allclose(preset["decoder_sequence_output"], mine["decoder_output"], atol=2e-5)
    tokenizer = keras_hub.models.T5Tokenizer.from_preset(str(out))
    vocab = seq2seq_data.Seq2SeqVocab.from_spiece(T5 / "spiece.model", EXTRA_IDS)
    for text in g["sources"]:
        assert np.asarray(tokenizer(str(text))).tolist() == vocab.encode(str(text))
    for name in ("t5", "v1_1"):
        r = helpers.run_main("convert_checkpoint.py", [
            "--from=cloze", "--to=keras_hub", f"--input_dir={converted / name}",
            f"--output_dir={tmp_path / name}",
        ])  # fmt: skip
        assert r.returncode == 1 and "keras-hub's T5Backbone has relu or gated-relu" in r.stderr
