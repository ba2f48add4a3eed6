"""XLNet's and ALBERT's SentencePiece tokenization (data_prep/spiece.py) against transformers'
XLNetTokenizer and AlbertTokenizer (their ids recorded by tests/make_xlnet_golden.py and
tests/make_albert_spiece_golden.py, so CI needs no transformers), the released code's
preprocessing, each family's packing, and ALBERT's spiece.model through run_classifier and
run_squad (answers mapped back onto the original text)."""

import json
import re

import numpy as np
import pytest

from data_prep import glue, spiece
from data_prep.errors import InputError
from modeling import xlnet
from tests import helpers
from tests.conftest import ROOT

XLNET = ROOT / "tests" / "fixtures" / "xlnet_tiny"
ALBERT = ROOT / "tests" / "fixtures" / "albert_spiece"


def golden(folder):
    return dict(np.load(folder / "golden.npz"))


def check_ids(tok, g, specials=()) -> tuple[int, int]:
    """Each recorded text's ids equal transformers', with two known exceptions, counted and
    returned: where the released code's rule splits a piece ending in digit + comma
    (transformers' tokenizers leave "6.053," whole: the pieces spell the same text and none of
    ours ends that way), and where the text holds a special token's name (`specials`, e.g.
    "[CLS]"), which transformers reads as that token and SentencePiece, as the released code,
    as characters."""
    offsets, ids = g["tokenizer_offsets"], g["tokenizer_ids"]
    commas = named = 0
    for k, text in enumerate(g["tokenizer_texts"]):
        text, theirs = str(text), ids[offsets[k] : offsets[k + 1]].tolist()
        if tok.encode(text) == theirs:
            continue
        their_pieces = [tok.model.IdToPiece(i) for i in theirs]
        mine = tok.pieces(text)
        if any(t in text for t in specials):
            named += 1
            assert any(tok.vocab[t] in theirs for t in specials if t in text), text
            assert not any(tok.vocab[t] in tok.encode(text) for t in specials), text
            continue
        commas += 1
        assert any(re.search(r"\d,$", p) for p in their_pieces), text
        assert "".join(mine) == "".join(their_pieces)
        assert not any(re.search(r"\d,$", p) for p in mine)
    return commas, named


def test_xlnet_ids_equal_transformers_but_for_the_originals_comma_rule():
    tok = spiece.SentencePieceTokenizer(XLNET / "spiece.model")
    assert check_ids(tok, golden(XLNET)) == (1, 0)  # "0.123, 6.053, NSP 0.679": "▁6.053,"
    assert tok.pieces("1,000")[-1] != "000" and "," in tok.pieces("1,000")


def test_albert_ids_equal_transformers_lower_cased():
    tok = spiece.SentencePieceTokenizer(ALBERT / "spiece.model", do_lower_case=True)
    # Two README lines name [CLS] or [SEP]; one has a piece ending in digit + comma.
    assert check_ids(tok, golden(ALBERT), ("[CLS]", "[SEP]", "[MASK]")) == (1, 2)


def test_xlnet_packing_of_sentencepiece_ids_equals_transformers():
    """Single texts and pairs as transformers' XLNetTokenizer packs them: `a <sep> (b <sep>)
    <cls>`, segment ids 0 / 1 / 2, left padded (pack_classifier_ids pads with id 0 where
    transformers puts <pad>: input_mask hides them both)."""
    from training import xlnet_finetuning

    g = golden(XLNET)
    encoder = xlnet_finetuning.XLNetTextEncoder(str(XLNET))  # the folder's spiece.model
    assert (encoder.sep_id, encoder.cls_id, encoder.vocab_size) == (4, 3, 300)
    length = g["input_ids"].shape[1]
    for i, (a, b, has) in enumerate(zip(g["first"], g["second"], g["has_second"])):
        ids, mask, segments, cut = xlnet.pack_classifier_ids(
            encoder.encode(str(a)), encoder.encode(str(b)) if has else None, length, 4, 3
        )
        real = g["input_mask"][i].astype(bool)
        assert not cut and mask == g["input_mask"][i].tolist()
        assert segments == g["segment_ids"][i].tolist()
        np.testing.assert_array_equal(np.array(ids)[real], g["input_ids"][i][real])


def test_albert_packing_equals_transformers():
    """--vocab_file=an ALBERT spiece.model (or its folder): `[CLS] a [SEP] b [SEP]`, lower-cased,
    accents stripped, right padded with <pad>, as transformers' AlbertTokenizer."""
    g = golden(ALBERT)
    tokenizer, packing = glue.load_tokenizer(str(ALBERT), True)
    assert packing == glue.ALBERT_PACKING and tokenizer.do_lower_case
    task = glue.get_task("tsv", ["0", "1"])
    examples = [
        glue.Example(f"pair{i}", str(i), str(a), str(b) if has else None, "0")
        for i, (a, b, has) in enumerate(zip(g["first"], g["second"], g["has_second"]))
    ]
    encoded = glue.encode_examples(examples, task, tokenizer, g["input_ids"].shape[1], packing)
    for key, theirs in (("input_ids", "input_ids"), ("input_mask", "input_mask"),
                        ("segment_ids", "segment_ids")):  # fmt: skip
        np.testing.assert_array_equal(encoded.features[key], g[theirs], err_msg=key)
    assert glue.load_tokenizer(str(ALBERT / "spiece.model"), True)[1] == glue.ALBERT_PACKING
    with pytest.raises(InputError, match=r"expected ALBERT's pieces .* without \['\[CLS\]'"):
        glue.load_tokenizer(str(XLNET), True)  # XLNet's model has <cls> / <sep>


def test_pieces_of_words_and_their_text():
    """A word of pre-split text (run_ner, run_squad) has the pieces it has inside the text, and
    pieces detokenize to the preprocessed text (run_squad's answers, before get_final_text maps
    them onto the original)."""
    tok = spiece.SentencePieceTokenizer(ALBERT / "spiece.model", do_lower_case=True)
    text = "The Quick brown fox, jumps!"
    assert [p for w in text.split() for p in tok.tokenize_word(w)] == tok.tokenize(text)
    assert tok.detokenize(tok.tokenize(text)) == text.lower()
    ids = tok.convert_tokens_to_ids(tok.tokenize(text))
    assert tok.convert_ids_to_tokens(ids) == tok.tokenize(text) and ids == tok.encode(text)


def test_preprocessing_follows_the_released_code(tmp_path):
    assert spiece.preprocess_text("  Crème  ``brûlée''\n") == 'Creme "brulee"'
    assert spiece.preprocess_text("Crème", keep_accents=True) == "Crème"
    assert spiece.preprocess_text("ABC", lower=True) == "abc"
    tok = spiece.SentencePieceTokenizer(XLNET / "spiece.model")
    lower = spiece.SentencePieceTokenizer(XLNET / "spiece.model", do_lower_case=True)
    assert lower.encode("HELLO World") == tok.encode("hello world") != tok.encode("HELLO World")
    with pytest.raises(InputError, match=r"missing.model: expected a SentencePiece model file"):
        spiece.SentencePieceTokenizer(tmp_path / "missing.model")
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(InputError, match=r"bad.model: expected a SentencePiece model file"):
        spiece.SentencePieceTokenizer(tmp_path / "bad.model")


def albert_config(path):
    config = dict(
        vocab_size=300, embedding_size=8, hidden_size=12, num_hidden_layers=2,
        num_hidden_groups=1, inner_group_num=1, num_attention_heads=3, intermediate_size=17,
        hidden_act="gelu_exact",
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64,
        type_vocab_size=2, initializer_range=0.02,
    )  # fmt: skip
    path.write_text(json.dumps(config))
    return path


def test_hf_albert_with_its_spiece_model_converts_and_fine_tunes(tmp_path):
    """A Hugging Face ALBERT folder (weights, config.json, spiece.model, no vocab.txt):
    convert_checkpoint.py --to=cloze copies spiece.model along, so the output folder is
    run_classifier's --vocab_file, config and --init_checkpoint at once, and it learns two
    sentences by heart; --to=hf writes it back with tokenizer_config.json naming
    AlbertTokenizer."""
    from modeling import albert
    from tests.test_albert import hf_albert_shapes, write_hf_albert
    from tests.test_checkpoints import random_arrays

    config = albert.AlbertConfig.from_json_file(albert_config(tmp_path / "albert_config.json"))
    write_hf_albert(tmp_path / "hf", config, random_arrays(hf_albert_shapes(config), seed=3))
    (tmp_path / "hf" / "spiece.model").write_bytes((ALBERT / "spiece.model").read_bytes())
    cloze, back = tmp_path / "cloze", tmp_path / "back"
    for source, target, out in (("hf", "cloze", cloze), ("cloze", "hf", back)):
        folder = tmp_path / source
        r = helpers.run_main("convert_checkpoint.py", [
            f"--from={source}", f"--to={target}", f"--input_dir={folder}", f"--output_dir={out}",
        ])  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        assert (out / "spiece.model").read_bytes() == (ALBERT / "spiece.model").read_bytes()
    tokenizer_config = json.loads((back / "tokenizer_config.json").read_text())
    assert tokenizer_config == {"tokenizer_class": "AlbertTokenizer", "do_lower_case": True}
    helpers.converted_folder_learns_two_sentences(tmp_path, cloze)


def test_albert_sentencepiece_through_run_squad(tmp_path):
    """An ALBERT config with --vocab_file=its spiece.model folder: run_squad trains and
    predicts, every answer a span of its context's original text (cased, accented), mapped back
    from the lower-cased pieces."""
    config = albert_config(tmp_path / "albert_config.json")
    contexts = ["The Cat sat on the MAT in Zürich.", "Crème brûlée is served at Noon, 12:00."]
    questions = [("Where did the Cat sit?", "on the MAT"), ("When is it served?", "Noon")]
    data = {"version": "1.1", "data": [{"paragraphs": [
        {"context": c, "qas": [{"id": f"q{i}", "question": q,
                                "answers": [{"text": a, "answer_start": c.index(a)}]}]}
        for i, (c, (q, a)) in enumerate(zip(contexts, questions))
    ]}]}  # fmt: skip
    squad_file = tmp_path / "squad.json"
    squad_file.write_text(json.dumps(data))
    out = tmp_path / "squad"
    r = helpers.run_main("run_squad.py", [
        f"--vocab_file={ALBERT}", f"--bert_config_file={config}", f"--train_file={squad_file}",
        f"--predict_file={squad_file}", f"--output_dir={out}", "--do_train", "--do_predict",
        "--do_eval", "--max_seq_length=48", "--doc_stride=16", "--max_query_length=16",
        "--train_batch_size=2", "--predict_batch_size=2", "--num_train_epochs=1",
        "--learning_rate=1e-3",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    predictions = json.loads((out / "predictions.json").read_text())
    assert sorted(predictions) == ["q0", "q1"]
    for i, context in enumerate(contexts):
        assert predictions[f"q{i}"] and predictions[f"q{i}"] in context, predictions


def test_albert_sentencepiece_aligns_words_for_ner():
    """run_ner's windows with an ALBERT spiece.model: `[CLS] pieces [SEP]` padded with <pad>,
    the pieces those of the whole sentence, each word predicted at its first piece."""
    from data_prep import conll
    from tests.test_conll import _sentence

    tokenizer, packing = glue.load_tokenizer(str(ALBERT), True)
    words = ["EU", "rejects", "German", "call", "Zürich", "1,000", "don't", "."]
    s = _sentence(words, ["B-ORG", "O", "B-MISC", "O", "B-LOC", "O", "O", "O"])
    labels = ["O", "B-ORG", "B-MISC", "B-LOC"]
    pieces = [tokenizer.tokenize_word(w) for w in words]
    width = sum(map(len, pieces)) + 5
    enc = conll.encode_sentences([s], labels, tokenizer, width, 2, packing)
    assert enc.num_windows == 1
    row, n = enc.features["input_ids"][0], int(enc.features["input_mask"][0].sum())
    ids = tokenizer.convert_tokens_to_ids(["[CLS]", *tokenizer.tokenize(" ".join(words)), "[SEP]"])
    assert row[:n].tolist() == ids and row[n:].tolist() == [0, 0, 0]  # <pad>
    firsts = np.cumsum([1] + [len(p) for p in pieces[:-1]])
    assert [i for i, w in enumerate(enc.word_index[0]) if w >= 0] == firsts.tolist()
    assert enc.features["label_ids"][0, firsts].tolist() == [labels.index(t) for t in s.tags]
