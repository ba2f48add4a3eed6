"""A Hugging Face DistilBERT (model_type distilbert: distilbert-base-uncased's layout) into Cloze's
BERT encoder, against transformers (tests/fixtures/distilbert_tiny, written by
tests/make_distilbert_golden.py: a tiny DistilBertForMaskedLM with seeded weights and what
transformers computed with it), so CI checks Cloze against an implementation no one here wrote
without installing PyTorch. Then the converted folder fine-tunes through run_classifier."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from data_prep import tokenization
from data_prep.errors import InputError
from modeling import bert, checkpoints
from tests import helpers
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "distilbert_tiny"
TOLERANCE = 1e-5  # max absolute difference in float32


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("distilbert") / "cloze"
    r = helpers.convert_checkpoint(
        "--from=hf", "--to=cloze", f"--input_dir={FIXTURE}", f"--output_dir={out}"
    )
    assert "distilbert.transformer.layer.*.attention.{q,k,v}_lin.weight (16, 16)" in r.stdout
    assert "vocab_transform.bias" in r.stdout and "not converted" in r.stdout
    return out


def test_converted_distilbert_computes_what_transformers_computed(converted):
    """Every hidden state (embeddings, then each layer) at the real tokens of a right-padded
    batch that DistilBertTokenizer made; Cloze's WordPiece gives the same ids; segment ids
    change nothing (zero token-type rows, as DistilBERT has no token types)."""
    g = dict(np.load(FIXTURE / "golden.npz"))
    tokenizer = tokenization.FullTokenizer(converted / "vocab.txt", do_lower_case=True)
    for text, ids, mask in zip(g["texts"], g["input_ids"], g["input_mask"]):
        pieces = ["[CLS]", *tokenizer.tokenize(str(text)), "[SEP]"]
        assert tokenizer.convert_tokens_to_ids(pieces) == ids[mask == 1].tolist()
    config = bert.BertConfig.from_json_file(converted / "bert_config.json")
    assert (config.hidden_act, config.num_hidden_layers, config.hidden_size) == (
        "gelu_exact",
        2,
        16,
    )
    model, _ = checkpoints.load_cloze(converted, config, "bert_config.json")
    real = g["input_mask"].astype(bool)
    for segments in (np.zeros_like(g["input_ids"]), np.ones_like(g["input_ids"])):
        out = model({"input_ids": g["input_ids"], "input_mask": g["input_mask"],
                     "segment_ids": segments})  # fmt: skip
        states = out["encoder_outputs"]
        assert len(states) == len(g["hidden_states"]) == 3
        for k, (got, want) in enumerate(zip(states, g["hidden_states"])):
            np.testing.assert_allclose(
                np.asarray(got)[real], want[real], rtol=0, atol=TOLERANCE, err_msg=f"state {k}"
            )


def test_converted_distilbert_fine_tunes_through_run_classifier(converted, tmp_path):
    """The converted folder's config, checkpoint and vocab.txt: run_classifier initialises the
    encoder from it and learns the two sentences by heart."""
    args, out = helpers.two_sentences_args(
        tmp_path, converted / "bert_config.json", f"--init_checkpoint={converted}",
        "--max_seq_length=12", "--num_train_epochs=10",
    )  # fmt: skip
    args = [a for a in args if not a.startswith("--vocab_file")]
    r = helpers.run_main("run_classifier.py", [*args, f"--vocab_file={converted / 'vocab.txt'}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"initialised the encoder from {converted / 'ckpt-1'}" in r.stderr
    results = dict(x.split(" = ") for x in (out / "eval_results.txt").read_text().splitlines())
    assert float(results["accuracy"]) == 1.0


def test_bad_distilbert_files_are_refused_naming_the_key_or_tensor(tmp_path):
    values = json.loads((FIXTURE / "config.json").read_text())
    with pytest.raises(InputError, match=r"activation: expected 'gelu' or 'relu'"):
        checkpoints.hf_config_to_config(values | {"activation": "silu"})
    with pytest.raises(InputError, match=r"unknown key\(s\) \['n_experts'\]"):
        checkpoints.hf_config_to_config(values | {"n_experts": 4})
    assert (
        checkpoints.hf_config_to_config(values | {"sinusoidal_pos_embds": True}).hidden_size == 16
    )
    folder = tmp_path / "cut"
    shutil.copytree(FIXTURE, folder)
    arrays = load_file(folder / "model.safetensors")
    del arrays["distilbert.transformer.layer.1.ffn.lin2.bias"]
    save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    r = helpers.run_main(
        "convert_checkpoint.py",
        ["--from=hf", "--to=cloze", f"--input_dir={folder}", f"--output_dir={tmp_path / 'o'}"],
    )
    assert r.returncode == 1 and "distilbert.transformer.layer.1.ffn.lin2.bias: missing" in r.stderr
    assert not (tmp_path / "o").exists()
