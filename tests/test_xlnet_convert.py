"""XLNet from and to Hugging Face's files against transformers (tests/fixtures/xlnet_tiny,
written by tests/make_xlnet_golden.py: a tiny XLNetLMHeadModel with seeded weights, its
spiece.model, and what transformers computed with them), so CI checks Cloze against an
implementation no one here wrote without installing PyTorch. Then the converted folder
fine-tunes through run_classifier.py (its SentencePiece tokenization: tests/test_spiece.py)."""

import json
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from data_prep import spiece
from data_prep.errors import InputError
from modeling import checkpoints, xlnet
from tests import helpers
from tests.conftest import ROOT
from tests.make_xlnet_golden import VOCAB_STRIDE
from training import squad_eval

FIXTURE = ROOT / "tests" / "fixtures" / "xlnet_tiny"
TOLERANCE = 1e-5  # max absolute difference in float32


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(FIXTURE / "golden.npz"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The fixture converted with convert_checkpoint.py --from=hf --to=cloze."""
    out = tmp_path_factory.mktemp("xlnet") / "cloze"
    r = helpers.convert_checkpoint(
        "--from=hf", "--to=cloze", f"--input_dir={FIXTURE}", f"--output_dir={out}"
    )
    assert "converted XLNet --from=hf to --to=cloze" in r.stdout
    assert "transformer.layer.{0,1}.rel_attn.r_w_bias (2, 8) -> encoder/r_w_bias" in r.stdout
    return out


def batch(golden):
    return {
        "input_ids": golden["input_ids"].astype("int32"),
        "input_mask": golden["input_mask"].astype("int32"),
        "segment_ids": golden["segment_ids"].astype("int32"),
    }


def test_converted_xlnet_computes_what_transformers_computes(converted, golden):
    """Every layer's content stream at the real tokens of a left-padded batch of single texts
    and pairs, the LM logits on it, and the query stream's logits under a permutation."""
    assert sorted(p.name for p in converted.iterdir()) == [
        "bert_config.json", "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index",
        "spiece.model",
    ]  # fmt: skip
    config = xlnet.XLNetConfig.from_json_file(converted / "bert_config.json")
    # Hugging Face's "gelu" is the exact erf form; its biases are per layer.
    assert (config.ff_activation, config.untie_r, config.n_token) == ("gelu_exact", True, 300)
    model, _ = checkpoints.load_whole(xlnet.XLNetPretrainer(config), converted)
    out = model.encoder(batch(golden))
    real = golden["input_mask"].astype(bool)
    assert len(out["encoder_outputs"]) == len(golden["hidden_states"]) == 3
    for got, want in zip(out["encoder_outputs"], golden["hidden_states"]):
        np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=TOLERANCE)
    table = model.encoder.word_embedding.numpy()
    lm = np.asarray(out["sequence_output"]) @ table.T + model.softmax_bias.numpy()
    np.testing.assert_allclose(lm[..., ::VOCAB_STRIDE][real], golden["lm_logits"][real], atol=1e-5)
    plm = model({**batch(golden), **{k: golden[k] for k in ("perm_mask", "target_mapping")}})
    plm = np.asarray(plm["plm_logits"])[..., ::VOCAB_STRIDE]
    # A query that may see no token at all (the first of its factorisation order): transformers
    # spreads its attention evenly over every hidden key, Cloze attends to nothing
    # (TwoStreamRelativeAttention), so no content leaks. Every other query agrees.
    positions = golden["target_mapping"].argmax(-1)  # (B, 2)
    sees = np.take_along_axis((golden["perm_mask"] == 0).sum(-1), positions, axis=1)
    assert (sees == 0).sum() == 1
    np.testing.assert_allclose(plm[sees > 0], golden["plm_logits"][sees > 0], atol=TOLERANCE)
    assert np.abs(plm[sees == 0] - golden["plm_logits"][sees == 0]).max() > 1e-2


@pytest.mark.parametrize("prefix", ["", "bi_"])
def test_segment_recurrence_computes_what_transformers_computes(converted, prefix):
    """Three segments run one after another, each reading the memory the ones before left
    (tests/make_xlnet_mems_golden.py: mem_len 6, the first 5 positions of a segment cached, so
    the third reads a memory cut to its last 6 slots), the last with segment ids, a padded
    position and a two-stream pass: every layer, the memory and both streams' logits within
    1e-5 of transformers. With memory no query sees nothing, so every query is compared.
    bi_: with bi_data, the batch's second row backward (`backward` input [0, 1]); its states
    differ from the forward run's, the first row's do not (within the tolerance)."""
    g = dict(np.load(FIXTURE / "mems_golden.npz"))
    if prefix:
        g |= {k[len(prefix) :]: v for k, v in g.items() if k.startswith(prefix)}
    config = xlnet.XLNetConfig.from_json_file(converted / "bert_config.json")
    model, _ = checkpoints.load_whole(xlnet.XLNetPretrainer(config), converted)
    table = model.encoder.word_embedding.numpy()
    mem_len, reuse_len = int(g["mem_len"]), int(g["reuse_len"])
    mems = None
    for n in range(len(g["input_ids"])):
        inputs = {"input_ids": g["input_ids"][n].astype("int32")}
        if prefix:
            inputs["backward"] = np.array([0, 1], "int32")
        if n == len(g["input_ids"]) - 1:
            inputs |= {k: g[k].astype("int32") for k in ("segment_ids", "input_mask")}
        out = model.encoder(inputs | ({} if mems is None else {"mems": mems}))
        real = inputs.get("input_mask", np.ones_like(inputs["input_ids"])).astype(bool)
        for got, want in zip(out["encoder_outputs"], g[f"hidden_states_{n}"]):
            np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=TOLERANCE)
        lm = np.asarray(out["sequence_output"]) @ table.T + model.softmax_bias.numpy()
        np.testing.assert_allclose(
            lm[..., ::VOCAB_STRIDE][real], g[f"lm_logits_{n}"][real], atol=TOLERANCE
        )
        if n == len(g["input_ids"]) - 1:  # the two-stream pass reads the same memory
            plm = model(inputs | {"mems": mems, "perm_mask": g["perm_mask"],
                                  "target_mapping": g["target_mapping"]})  # fmt: skip
            got = np.asarray(plm["plm_logits"])[..., ::VOCAB_STRIDE]
            np.testing.assert_allclose(got, g["plm_logits"], atol=TOLERANCE)
        mems = xlnet.cache_mems(mems, out["encoder_outputs"], mem_len, reuse_len)
        assert [m.shape[1] for m in mems] == [min(mem_len, reuse_len * (n + 1))] * 2
        np.testing.assert_allclose(np.stack(mems), g[f"mems_{n}"], atol=TOLERANCE)
    # Without its memory the last segment computes something else: the memory is read.
    alone = model.encoder(inputs)["sequence_output"]
    assert np.abs(np.asarray(alone) - g["hidden_states_2"][-1])[real].max() > 1e-2
    if prefix:  # the backward row is not the forward run's, the forward row is
        forward = np.load(FIXTURE / "mems_golden.npz")["hidden_states_2"]
        differ = np.abs(forward - g["hidden_states_2"]).max(axis=(0, 2, 3))
        assert differ[0] < TOLERANCE and differ[1] > 1e-3, differ


def test_cloze_to_hf_round_trips_bit_for_bit(converted, tmp_path):
    out = tmp_path / "hf"
    helpers.convert_checkpoint(
        "--from=cloze", "--to=hf", f"--input_dir={converted}", f"--output_dir={out}"
    )
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "spiece.model"]  # fmt: skip
    mine, theirs = load_file(out / "model.safetensors"), load_file(FIXTURE / "model.safetensors")
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
    written, published = (json.loads((f / "config.json").read_text()) for f in (out, FIXTURE))
    assert {k: published[k] for k in written} == written  # the keys written have its values
    # A tied Cloze model (untie_r false) writes its one set of biases into every layer.
    tied = xlnet.XLNetPretrainer(xlnet.XLNetConfig.from_dict(
        {**xlnet.XLNetConfig.from_json_file(converted / "bert_config.json").to_dict(),
         "untie_r": False}))  # fmt: skip
    tied.build()
    xlnet.save_hf(tied, tmp_path / "tied")
    arrays = load_file(tmp_path / "tied" / "model.safetensors")
    np.testing.assert_array_equal(
        arrays["transformer.layer.0.rel_attn.r_w_bias"],
        arrays["transformer.layer.1.rel_attn.r_w_bias"],
    )
    np.testing.assert_array_equal(tied.encoder.r_w_bias.numpy(),
                                  arrays["transformer.layer.1.rel_attn.r_w_bias"])  # fmt: skip


def test_bare_xlnet_model_and_task_model_files_convert(tmp_path, golden):
    """A bare XLNetModel (no `transformer.` prefix, no LM head) gives the same encoder and a
    zero softmax bias; a task model's head is listed as not converted."""
    arrays = load_file(FIXTURE / "model.safetensors")
    bare = {k.removeprefix("transformer."): v for k, v in arrays.items() if k != "lm_loss.bias"}
    bare["sequence_summary.summary.weight"] = np.zeros((16, 16), np.float32)
    folder = tmp_path / "bare"
    folder.mkdir()
    save_file(bare, str(folder / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(FIXTURE / "config.json", folder / "config.json")
    config = xlnet.config_from_hf(json.loads((folder / "config.json").read_text()))
    model, report = xlnet.load_hf(folder, config)
    assert not model.softmax_bias.numpy().any()
    summary = report.summary()
    assert "no lm_loss.bias: the softmax bias starts at zeros" in summary
    assert "a fine-tuning head (Cloze's task heads start fresh)): sequence_summary" in summary
    out = model.encoder(batch(golden))["sequence_output"]
    real = golden["input_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(out)[real], golden["hidden_states"][-1][real], atol=1e-5)


def test_hf_configs_that_compute_something_else_are_refused():
    published = json.loads((FIXTURE / "config.json").read_text())
    for change, where in (
        ({"attn_type": "uni"}, "config.json: attn_type: expected 'bi'"),
        ({"bi_data": True}, "config.json: bi_data: expected False"),
        ({"layer_norm_eps": 1e-5}, "config.json: layer_norm_eps: expected 1e-12"),
        ({"ff_activation": "swish"}, "config.json: ff_activation: expected one of"),
        ({"d_head": 7}, "config.json: d_head: expected d_model / n_head = 16 / 2"),
        ({"made_up": 1}, "expected the keys of a Hugging Face XLNet config, found ['made_up']"),
    ):
        with pytest.raises(InputError, match=re.escape(where)):
            xlnet.config_from_hf({**published, **change})
    # The activations by their Hugging Face names; untie_r false still has per-layer weights.
    assert xlnet.config_from_hf({**published, "ff_activation": "gelu_new"}).ff_activation == "gelu"
    assert xlnet.config_from_hf({**published, "untie_r": False}).untie_r is True
    config = xlnet.config_from_hf(published)
    with pytest.raises(ValueError, match="one dropout for both"):
        xlnet.hf_config(config.replace(dropatt=0.2))


def test_converted_xlnet_fine_tunes_through_run_classifier(converted, tmp_path):
    """The converted folder is --vocab_file (its spiece.model), --bert_config_file and
    --init_checkpoint at once: run_classifier initialises the encoder from it, tokenizes with
    XLNet's SentencePiece (cased) and learns two sentences by heart."""
    helpers.converted_folder_learns_two_sentences(tmp_path, converted, "--layerwise_lr_decay=0.9")


def squad_data(impossible: bool = False) -> dict:
    contexts = ["The Cat sat on the MAT in Zürich.", "Crème brûlée is served at Noon, 12:00."]
    questions = [("Where did the Cat sit?", "on the MAT"), ("When is it served?", "Noon")]
    paragraphs = [
        {"context": c, "qas": [{"id": f"q{i}", "question": q, "is_impossible": False,
                                "answers": [{"text": a, "answer_start": c.index(a)}]}]}
        for i, (c, (q, a)) in enumerate(zip(contexts, questions))
    ]  # fmt: skip
    if impossible:
        paragraphs[0]["qas"].append(
            {"id": "none", "question": "Who baked it?", "answers": [], "is_impossible": True}
        )
    return {"version": "2.0" if impossible else "1.1", "data": [{"paragraphs": paragraphs}]}


def test_xlnet_squad_windows_put_the_question_first_and_cls_last(tmp_path):
    """glue.xlnet_packing in squad.convert_examples_to_features: `question <sep> window <sep>
    <cls>`, segment ids 0, 1 and 2, the answer's pieces as its span, and a window without the
    answer (or an impossible question) pointing at the <cls>, where v2.0 reads "no answer"."""
    from data_prep import squad
    from training import xlnet_finetuning

    encoder = xlnet_finetuning.XLNetTextEncoder(str(FIXTURE))
    tok, packing = encoder.tokenizer, encoder.packing
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(squad_data(impossible=True)))
    examples, _ = squad.read_squad_examples(path, True, True)
    windows = list(squad.convert_examples_to_features(examples, tok, 40, 8, 12, True, packing))
    for w in windows:
        n = len(w.tokens)
        query = tok.tokenize(examples[w.example_index].question_text)[:12]
        assert w.tokens[: len(query) + 1] == [*query, "<sep>"] and w.tokens[-2:] == [
            "<sep>",
            "<cls>",
        ]
        assert w.segment_ids[:n] == [0] * (len(query) + 1) + [1] * (n - len(query) - 2) + [2]
        assert w.null_index == n - 1 and w.input_ids[n - 1] == encoder.cls_id
        answer = examples[w.example_index].orig_answer_text
        if w.start_position == w.null_index:
            assert w.end_position == w.null_index
            continue
        span = tok.detokenize(w.tokens[w.start_position : w.end_position + 1])
        assert span == answer, (span, answer)
    assert any(w.start_position == w.null_index for w in windows)  # the impossible question
    assert {
        examples[w.example_index].qas_id for w in windows if w.start_position != w.null_index
    } == {"q0", "q1"}


@pytest.mark.parametrize("v2, head", [(False, "simple"), (False, "beam"), (True, "beam")])
def test_converted_xlnet_fine_tunes_through_run_squad(converted, tmp_path, v2, head):
    """run_squad.py with the converted folder as --vocab_file, config and --init_checkpoint: the
    span model (XLNetSpanQA, or the released code's beam head, the default) initialised from the
    converted encoder learns the questions by heart and answers them with spans of the original
    (cased, accented) text; with v2.0 the beam head's answer class (null_odds.json) tells the
    unanswerable question apart at the default threshold 0. FLOP/s are counted."""
    data = tmp_path / "squad.json"
    data.write_text(json.dumps(squad_data(impossible=v2)))
    out = tmp_path / "out"
    args = [
        f"--vocab_file={converted}", f"--bert_config_file={converted / 'bert_config.json'}",
        f"--init_checkpoint={converted}", f"--train_file={data}", f"--predict_file={data}",
        f"--output_dir={out}", "--do_train", "--do_predict", "--do_eval", "--max_seq_length=48",
        "--doc_stride=16", "--max_query_length=16", "--train_batch_size=2",
        "--predict_batch_size=2", "--num_train_epochs=80", "--learning_rate=3e-3",
        "--peak_tflops=1e-4", "--layerwise_lr_decay=0.9", f"--xlnet_span_head={head}",
    ]  # fmt: skip
    if v2:
        args.append("--version_2_with_negative")
    r = helpers.run_main("run_squad.py", args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"initialised the encoder from {converted / 'ckpt-1'}" in r.stderr
    # the span model's count (flops.xlnet_span_qa_flops / xlnet_beam_span_qa_flops, checked in
    # tests/test_flops.py) logged
    assert re.search(r"step \d+/\d+ .* [0-9.]+ [KMG]?FLOP/s \(\d+% of the peak\)", r.stderr)
    predictions = json.loads((out / "predictions.json").read_text())
    answers = {"q0": "on the MAT", "q1": "Noon"}
    assert predictions == answers | ({"none": ""} if v2 else {})
    if v2:
        odds = json.loads((out / "null_odds.json").read_text())
        assert odds["none"] > 0 > max(odds["q0"], odds["q1"])
        assert "NoAns_exact = 100.0" in (out / "eval_results.txt").read_text()


def test_xlnet_ner_windows_end_in_sep_and_cls():
    """conll.encode_sentences with XLNet's packing: `pieces <sep> <cls>` (no piece before the
    words), <cls> in segment 2, each word predicted at its first piece."""
    from data_prep import conll
    from tests.test_conll import _sentence
    from training import xlnet_finetuning

    encoder = xlnet_finetuning.XLNetTextEncoder(str(FIXTURE))
    tok = encoder.tokenizer
    words = ["EU", "rejects", "German", "call", "Zürich", "."]
    s = _sentence(words, ["B-ORG", "O", "B-MISC", "O", "B-LOC", "O"])
    labels = ["O", "B-ORG", "B-MISC", "B-LOC"]
    pieces = [tok.tokenize_word(w) for w in words]
    width = sum(map(len, pieces)) + 4
    enc = conll.encode_sentences([s], labels, tok, width, 2, encoder.packing)
    n = int(enc.features["input_mask"][0].sum())
    ids = [*tok.convert_tokens_to_ids([p for ps in pieces for p in ps]), encoder.sep_id]
    assert enc.features["input_ids"][0, :n].tolist() == [*ids, encoder.cls_id]
    assert enc.features["segment_ids"][0, :n].tolist() == [0] * (n - 1) + [2]
    firsts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    assert [i for i, w in enumerate(enc.word_index[0]) if w >= 0] == firsts.tolist()
    assert enc.features["label_ids"][0, firsts].tolist() == [labels.index(t) for t in s.tags]


def test_converted_xlnet_fine_tunes_through_run_ner(converted, tmp_path):
    """run_ner.py with the converted folder as --vocab_file, config and --init_checkpoint: the
    XLNet tagger fine-tuned (its FLOP/s counted) and, frozen, through the scalar mix of all its
    content streams."""
    from tests.test_run_ner import sentences, write_conll2003

    rng = np.random.default_rng(0)
    for name, n in (("eng.train", 12), ("eng.testa", 4), ("eng.testb", 4)):
        write_conll2003(tmp_path / "conll" / name, sentences(rng, n))
    for mode in ("finetune", "sum_all"):
        out = tmp_path / mode
        r = helpers.run_main("run_ner.py", [
            f"--data_dir={tmp_path / 'conll'}", f"--vocab_file={converted}",
            f"--bert_config_file={converted / 'bert_config.json'}",
            f"--init_checkpoint={converted}", f"--output_dir={out}", "--max_seq_length=40",
            "--do_train", "--do_eval", "--do_predict", "--train_batch_size=4",
            "--eval_batch_size=4", "--predict_batch_size=4", "--num_train_epochs=1",
            "--learning_rate=1e-3", f"--feature_mode={mode}", "--peak_tflops=1e-4",
        ])  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"initialised the encoder from {converted / 'ckpt-1'}" in r.stderr
        assert re.search(r"step \d+/\d+ .* [0-9.]+ [KMG]?FLOP/s \(\d+% of the peak\)", r.stderr)
        results = (out / "eval_results.txt").read_text()
        assert "f1 = " in results and (out / "test_predictions.txt").exists()


def test_a_converted_xlnet_continues_pretraining_on_blocks_of_its_own_pieces(converted, tmp_path):
    """create_lm_data.py --vocab_file=the converted folder: blocks of its spiece.model's pieces,
    each document ended by <eod> (XLNet's data_utils.py); run_pretraining.py continues the
    converted XLNet's permutation LM on them from its checkpoint (its softmax bias included)."""
    from data_prep import lm_data

    documents = [
        "The Cat sat on the MAT in Zürich.\nIt slept there.",
        "Crème brûlée is served at Noon.\nEveryone waits for it, 1,000 people.",
    ] * 3
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    blocks = tmp_path / "blocks.tfrecord"
    r = helpers.run_main("data_prep/create_lm_data.py", [
        f"--input_file={corpus}", f"--output_file={blocks}", f"--vocab_file={converted}",
        "--block_size=16", "--num_workers=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    tok = spiece.SentencePieceTokenizer(converted / "spiece.model")  # cased: no --do_lower_case
    ids = [tok.encode(d.replace("\n", " ")) for d in documents]
    want = list(lm_data.pack_blocks(ids, 16, tok.vocab["<eod>"]))
    theirs = tmp_path / "theirs.tfrecord"
    lm_data.write_lm_tfrecords(iter(want), [str(theirs)])
    assert blocks.read_bytes() == theirs.read_bytes()
    out = tmp_path / "pretrain"
    r = helpers.run_main("run_pretraining.py", [
        f"--bert_config_file={converted / 'bert_config.json'}", f"--input_file={blocks}",
        f"--init_checkpoint={converted}", f"--output_dir={out}", "--do_train", "--do_eval",
        "--max_seq_length=16", "--max_predictions_per_seq=3", "--train_batch_size=2",
        "--eval_batch_size=2", "--num_train_steps=4", "--num_warmup_steps=1",
        "--save_checkpoints_steps=4", "--iterations_per_loop=2", "--max_eval_steps=1",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"initialised the model from {converted / 'ckpt-1'}" in r.stderr
    results = (out / "eval_results.txt").read_text()
    assert "global_step = 4" in results and "plm_loss = " in results


QA_FIXTURE = ROOT / "tests" / "fixtures" / "xlnet_qa_tiny"


def test_beam_span_qa_computes_what_transformers_computes():
    """XLNetBeamSpanQA with the weights of a tiny XLNetForQuestionAnswering that transformers
    made and ran (tests/make_xlnet_qa_golden.py) on SQuAD windows: the answer positions are its
    p_mask, the teacher-forced start / end / answer-class logits and the loss (the released
    code's) equal its own, and the beam (top starts, each one's top ends, the answer class from
    the expected start state) picks the same positions with the same probabilities."""
    g = dict(np.load(QA_FIXTURE / "golden.npz"))
    config = xlnet.config_from_hf(json.loads((QA_FIXTURE / "config.json").read_text()))
    model, report = xlnet.load_hf_qa(QA_FIXTURE, config)
    assert "answer_class.dense_1.weight (1, 16) -> cls_dense_1/kernel" in report.summary()
    model.top_n = k = 3  # the fixture's start_n_top = end_n_top
    inputs = {key: g[key].astype("int32") for key in ("input_ids", "input_mask", "segment_ids")}
    allowed, cls_index = xlnet.answer_positions(inputs["segment_ids"], inputs["input_mask"])
    np.testing.assert_array_equal(np.asarray(allowed), g["p_mask"] == 0)
    np.testing.assert_array_equal(np.asarray(cls_index), g["cls_index"])
    starts = g["start_positions"].astype("int32")
    out = model({**inputs, "start_positions": starts})
    ok = g["p_mask"] == 0
    for name in ("start_logits", "end_logits"):
        np.testing.assert_allclose(
            np.asarray(out[name])[ok], g[f"train_{name}"][ok], atol=TOLERANCE
        )
    np.testing.assert_allclose(out["cls_logits"], g["train_cls_logits"], atol=TOLERANCE)
    task = squad_eval.beam_span_qa_task(model)
    batch = {**inputs, "start_positions": starts, "end_positions": g["end_positions"]}
    sums = task.sums_fn(batch, False)
    assert float(sums["loss_sum"] / sums["count"]) == pytest.approx(float(g["loss"]), abs=1e-5)
    beam = model(inputs)
    np.testing.assert_array_equal(beam["start_top_index"], g["start_top_index"])
    np.testing.assert_allclose(
        np.exp(beam["start_top_log_probs"]), g["start_top_log_probs"], atol=TOLERANCE
    )

    # transformers flattens its ends from (end rank, start rank); Cloze keeps (start, end).
    def per_start(a):
        return a.reshape(-1, k, k).transpose(0, 2, 1)

    np.testing.assert_array_equal(beam["end_top_index"], per_start(g["end_top_index"]))
    np.testing.assert_allclose(
        np.exp(beam["end_top_log_probs"]), per_start(g["end_top_log_probs"]), atol=TOLERANCE
    )
    np.testing.assert_allclose(beam["cls_logits"], g["cls_logits"], atol=TOLERANCE)
    row = model.unpack_beam(np.asarray(beam["beam"])[1])
    np.testing.assert_array_equal(row[1], g["start_top_index"][1])
    np.testing.assert_array_equal(row[3], per_start(g["end_top_index"])[1])
    assert row[4] == pytest.approx(float(g["cls_logits"][1]), abs=TOLERANCE)


def test_a_fine_tuned_hf_squad_xlnet_converts_with_its_heads_and_predicts(tmp_path):
    """convert_checkpoint.py --from=hf of an XLNetForQuestionAnswering keeps its span heads (an
    XLNetBeamSpanQA checkpoint, the same weights), run_squad.py predicts with the whole model
    from it, no head left untrained, and --to=hf writes it back."""
    out = tmp_path / "qa"
    r = helpers.convert_checkpoint(
        "--from=hf", "--to=cloze", f"--input_dir={QA_FIXTURE}", f"--output_dir={out}"
    )
    assert "start_logits.dense.weight (1, 16) -> start_dense/kernel" in r.stdout
    config = xlnet.XLNetConfig.from_json_file(out / "bert_config.json")
    converted, _ = checkpoints.load_whole(xlnet.XLNetBeamSpanQA(config), out)
    direct, _ = xlnet.load_hf_qa(QA_FIXTURE, config)
    for mine, theirs in zip(converted.weights, direct.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)
    data = tmp_path / "squad.json"
    data.write_text(json.dumps(squad_data(impossible=True)))
    r = helpers.run_main("run_squad.py", [
        f"--vocab_file={FIXTURE}", f"--bert_config_file={out / 'bert_config.json'}",
        f"--init_checkpoint={out}", f"--predict_file={data}", f"--output_dir={tmp_path / 'p'}",
        "--do_predict", "--version_2_with_negative", "--max_seq_length=48", "--doc_stride=16",
        "--max_query_length=16", "--predict_batch_size=2",
    ])  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"predicting with {out / 'ckpt-1'}" in r.stderr and "holds no span head" not in r.stderr
    odds = json.loads((tmp_path / "p" / "null_odds.json").read_text())
    assert set(odds) == {"q0", "q1", "none"}
    # And back: an XLNetForQuestionAnswering again, bit for bit (start_n_top / end_n_top are
    # run_squad's beam width, 5).
    back = tmp_path / "back"
    helpers.convert_checkpoint(
        "--from=cloze", "--to=hf", f"--input_dir={out}", f"--output_dir={back}"
    )
    mine, theirs = (
        load_file(back / "model.safetensors"),
        load_file(QA_FIXTURE / "model.safetensors"),
    )
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
    written = json.loads((back / "config.json").read_text())
    assert written["architectures"] == ["XLNetForQuestionAnswering"]
    assert (written["start_n_top"], written["end_n_top"]) == (5, 5)
