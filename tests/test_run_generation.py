"""run_generation.py: a converted GPT-2 (tests/fixtures/gpt2_tiny, which transformers made and
ran: tests/make_gpt_golden.py) continues prompts as transformers' greedy generate did, samples
reproducibly, and refuses what it cannot do, naming the line."""

import json

import numpy as np
import pytest

from data_prep import bpe
from modeling import checkpoints, gpt
from tests import helpers
from tests.conftest import ROOT
from tests.make_gpt_golden import NEW_TOKENS

GPT2 = ROOT / "tests" / "fixtures" / "gpt2_tiny"
END = 399  # the fixture's <|endoftext|>


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "gpt2"
    r = helpers.run_main(
        "convert_checkpoint.py",
        ["--from=hf", "--to=cloze", f"--input_dir={GPT2}", f"--output_dir={out}"],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def generate(folder, tmp_path, prompts, *flags, name="samples.jsonl", config=None):
    """run_generation.py on `prompts` (text, or bytes written as they are) with the converted
    folder as config (unless `config`), checkpoint and BPE. Returns (Completed, the output)."""
    path = tmp_path / "prompts.txt"
    path.write_bytes(prompts if isinstance(prompts, bytes) else prompts.encode("utf-8"))
    out = tmp_path / name
    r = helpers.run_main("run_generation.py", [
        f"--bert_config_file={config or folder / 'bert_config.json'}",
        f"--init_checkpoint={folder}", f"--vocab_file={folder}", f"--input_file={path}",
        f"--output_file={out}", *flags,
    ])  # fmt: skip
    return r, out


def read(out):
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_greedy_continuations_are_transformers_own(converted, tmp_path):
    """Line 1 is the fixture's prompt: its greedy continuation is the tokens transformers'
    generate picked. An empty line is an unconditional sample from <|endoftext|>; a prompt of
    another length goes in another batch and gets the same tokens as alone."""
    g = np.load(GPT2 / "golden.npz")
    prompt = str(g["prompt"])
    r, out = generate(converted, tmp_path, f"{prompt}\n\nZürich, 12 francs\n",
                      "--temperature=0", f"--max_new_tokens={NEW_TOKENS}")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "3 samples, 36 tokens decoded in" in r.stderr
    rows = read(out)
    assert [(x["line"], x["sample"], x["prompt"]) for x in rows] == [
        (1, 0, prompt), (2, 0, ""), (3, 0, "Zürich, 12 francs"),
    ]  # fmt: skip
    tok = bpe.ByteLevelBPE.from_files(converted / "encoder.json", converted / "vocab.bpe")
    n = len(tok.encode(prompt))
    assert rows[0]["ids"] == g["greedy_ids"][n:].tolist()  # no <|endoftext|> among them
    config = gpt.GptConfig.from_json_file(converted / "bert_config.json")
    model, _ = checkpoints.load_whole(gpt.GptLM(config), converted)
    for row, ids in ((rows[1], [END]), (rows[2], tok.encode(rows[2]["prompt"]))):
        alone = gpt.generate(model, [ids], NEW_TOKENS, temperature=0)[0, len(ids) :].tolist()
        want = alone[: alone.index(END)] if END in alone else alone
        assert row["ids"] == want
    for row in rows:
        assert row["text"] == tok.decode(row["ids"])


def test_sampling_is_reproducible_and_each_sample_its_own(converted, tmp_path):
    flags = ["--top_k=20", "--num_samples=3", "--max_new_tokens=8", "--seed=7"]
    runs = []
    for name in ("a.jsonl", "b.jsonl"):
        r, out = generate(converted, tmp_path, "The quick brown fox\nHello\n", *flags, name=name)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(read(out))
    assert runs[0] == runs[1]
    first = [tuple(x["ids"]) for x in runs[0] if x["line"] == 1]
    assert len(first) == 3 and len(set(first)) > 1
    r, out = generate(converted, tmp_path, "The quick brown fox\nHello\n", *flags[:-1], "--seed=8",
                      name="c.jsonl")  # fmt: skip
    assert read(out) != runs[0]


def test_continue_prompts_groups_by_length_and_stops_at_the_end_token(converted):
    config = gpt.GptConfig.from_json_file(converted / "bert_config.json")
    model, _ = checkpoints.load_whole(gpt.GptLM(config), converted)
    prompts = [[5, 6, 7], [8], [9, 10, 11], [12, 13]]
    alone = [gpt.generate(model, [p], 6, temperature=0)[0, len(p) :].tolist() for p in prompts]
    seen = []
    for batch_size in (1, 2, 8):
        got = gpt.continue_prompts(model, prompts, 6, batch_size, temperature=0,
                                   progress=seen.append)  # fmt: skip
        assert got == alone
    assert sum(seen) == 3 * len(prompts) and len(seen) == 4 + 3 + 3  # batches per size
    stop = alone[0][2]
    cut = gpt.continue_prompts(model, prompts[:1], 6, stop_id=stop, temperature=0)
    assert cut == [alone[0][: alone[0].index(stop)]]
    with pytest.raises(ValueError, match="prompt 1: no ids"):
        gpt.continue_prompts(model, [[1], []], 2)


def test_bad_input_is_refused_naming_the_line_and_nothing_is_written(converted, tmp_path):
    long = " ".join(["word"] * 40)
    r, out = generate(converted, tmp_path, f"short\n{long}\n", "--max_new_tokens=40")
    assert r.returncode != 0
    assert "prompts.txt:2: expected a prompt of at most 24 tokens (n_ctx 64 less" in r.stderr
    assert not out.exists()
    (tmp_path / "t5.json").write_text(json.dumps({"d_model": 8, "num_layers": 1}))
    r, out = generate(converted, tmp_path, "short\n", config=tmp_path / "t5.json")
    assert r.returncode != 0 and "generate through run_text2text.py" in r.stderr
    small = tmp_path / "small.json"  # a config whose embedding table the vocabulary outgrows
    small.write_text(json.dumps({**json.loads((converted / "bert_config.json").read_text()),
                                 "n_vocab": 300}))  # fmt: skip
    r, out = generate(converted, tmp_path, "short\n", config=small)
    assert r.returncode != 0
    assert "expected ids below the config's n_vocab 300, found ids up to 399" in r.stderr
    r, out = generate(converted, tmp_path, b"fine\nbad \xff byte\n")
    assert r.returncode != 0
    assert "prompts.txt:2: expected UTF-8 text, found byte 0xff at column 5" in r.stderr
    assert not out.exists()


def test_a_converted_gpt1_continues_prompts_of_its_word_end_bpe(tmp_path):
    """A converted GPT-1 (tests/fixtures/openai_gpt_tiny with its word-end BPE): the prompt is
    encoded as OpenAIGPTTokenizer encodes (tests/test_gpt_convert.py), the continuation runs the
    full length (no <|endoftext|> to stop at) as gpt.generate's, its text the BPE's decoding;
    an empty line, an unconditional sample, is refused naming the line."""
    folder = tmp_path / "gpt1"
    helpers.convert_checkpoint(
        "--from=hf", "--to=cloze", f"--input_dir={GPT2.parent / 'openai_gpt_tiny'}",
        f"--output_dir={folder}",
    )  # fmt: skip
    r, out = generate(folder, tmp_path, "Crème brûlée in Zürich\n", "--temperature=0",
                      "--max_new_tokens=6")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = read(out)
    tok = bpe.load_gpt_bpe(folder / "encoder.json", folder / "vocab.bpe")
    ids = tok.encode(row["prompt"])
    config = gpt.GptConfig.from_json_file(folder / "bert_config.json")
    model, _ = checkpoints.load_whole(gpt.GptLM(config), folder)
    assert row["ids"] == gpt.generate(model, [ids], 6, temperature=0)[0, len(ids) :].tolist()
    assert row["text"] == tok.decode(row["ids"]) and len(row["ids"]) == 6
    r, out = generate(folder, tmp_path, "a prompt\n\n", name="refused.jsonl")
    assert r.returncode != 0 and f"{tmp_path / 'prompts.txt'}:2" in r.stderr
    assert "which this vocabulary lacks" in r.stderr and not out.exists()
