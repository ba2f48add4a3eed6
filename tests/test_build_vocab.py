"""Tests of vocab learning (data_prep/tokenization.py) and the data_prep/build_vocab.py script."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from data_prep.tokenization import (
    RESERVED_TOKENS,
    BasicTokenizer,
    FullTokenizer,
    InGraphTokenizer,
    _learn_like_tf_text,
    count_words,
    learn_vocab_from_counts,
    learn_wordpiece_vocab,
    load_vocab,
    write_vocab,
)
from tests import helpers

ROOT = Path(__file__).resolve().parents[1]

_COMMON = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if so"
).split()
_ROOTS = (
    "play read walk talk work help jump turn learn paint build open cook clean dream climb "
    "sing start wander listen follow travel answer borrow gather whisper"
).split()
_SUFFIXES = ["", "s", "ed", "ing", "er", "ers", "able", "ment"]
_RARE = "Paris London Zürich café naïve résumé ÉCOLE smørbrød 中文 Ελλάδα".split()


def make_corpus(seed: int = 0, num_lines: int = 300) -> list[str]:
    """Zipf-ish sentences of common words and inflected roots, blank lines between documents,
    and a few rare characters."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(num_lines):
        sentence = []
        for _ in range(rng.randint(5, 14)):
            kind = rng.random()
            if kind < 0.5:
                word = _COMMON[min(int(rng.paretovariate(1.0)) - 1, len(_COMMON) - 1)]
            elif kind < 0.97:
                root = _ROOTS[min(int(rng.paretovariate(0.7)) - 1, len(_ROOTS) - 1)]
                word = rng.choice(["", "re", "un"]) + root + rng.choice(_SUFFIXES)
            else:
                word = rng.choice(_RARE)
            sentence.append(word if rng.random() > 0.1 else word + ",")
        lines.append(" ".join(sentence).capitalize() + rng.choice(".?!"))
        if i % 9 == 8:
            lines.append("")  # a document ends
    # "ŋ" appears once; "ǂ" only inside a 56-character word, which the tf-text learner drops
    # (max_token_length=50): both must still be in the vocab so neither word becomes [UNK].
    lines += ["A rare ŋ once.", "ǂ" + "x" * 55 + " is long."]
    return lines


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return make_corpus()


@pytest.fixture(scope="module")
def learned(corpus) -> list[str]:
    return learn_wordpiece_vocab(corpus, vocab_size=240, do_lower_case=True)


def test_reserved_first_size_close_and_every_character(corpus, learned):
    assert tuple(learned[: len(RESERVED_TOKENS)]) == RESERVED_TOKENS
    assert 0.9 * 240 <= len(learned) <= 240
    assert len(set(learned)) == len(learned)
    chars = {c for word in count_words(corpus, do_lower_case=True) for c in word}
    assert {"ŋ", "ǂ", "中", "ø"} <= chars and not {"é", "ü", "É"} & chars  # accents stripped
    for c in chars:
        assert c in learned and "##" + c in learned, c
    # Beyond characters, it learned real pieces: whole frequent words and suffixes.
    assert "the" in learned and any(t.startswith("##") and len(t) > 3 for t in learned)


def test_learned_vocab_tokenizes_its_corpus_without_unk(tmp_path, corpus, learned):
    write_vocab(learned, tmp_path / "vocab.txt")
    tokenizer = FullTokenizer(tmp_path / "vocab.txt", do_lower_case=True)
    pieces = [p for line in corpus for p in tokenizer.tokenize(line)]
    assert "[UNK]" not in pieces
    assert len(pieces) < sum(len(line) for line in corpus) / 2  # pieces, not characters
    # The fast path agrees on a vocab it has never seen before.
    fast = InGraphTokenizer(tmp_path / "vocab.txt", do_lower_case=True)
    assert fast.batch_tokenize_ids(corpus) == [tokenizer.tokenize_to_ids(x) for x in corpus]


def test_deterministic_and_independent_of_line_order(corpus, learned):
    assert learn_wordpiece_vocab(corpus, vocab_size=240, do_lower_case=True) == learned
    shuffled = list(corpus)
    random.Random(1).shuffle(shuffled)
    assert learn_wordpiece_vocab(shuffled, vocab_size=240, do_lower_case=True) == learned


def test_cased_vocab_keeps_case_and_accents(corpus):
    vocab = learn_wordpiece_vocab(corpus, vocab_size=260, do_lower_case=False)
    assert {"É", "Z", "ü", "##ü", "中"} <= set(vocab)


@pytest.mark.parametrize("num_workers", [1, 3])
def test_same_vocab_as_tensorflow_text_learner(corpus, num_workers):
    # The fast rewrite against the library it replaces, argument for argument, its passes on
    # one process or dealt among three (spawned here, as this process has TensorFlow; forked
    # in test_build_vocab_smoke).
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as lib

    counts = sorted(count_words(corpus, True).items(), key=lambda kv: (-kv[1], kv[0]))
    for vocab_size, lower_thresh in ((240, 1), (400, 2)):
        expected = lib.learn(counts, vocab_size, list(RESERVED_TOKENS), lower_thresh=lower_thresh)
        got = _learn_like_tf_text(
            counts, vocab_size, RESERVED_TOKENS, lower_thresh=lower_thresh, num_workers=num_workers
        )
        assert got == expected, vocab_size


def test_learn_errors():
    with pytest.raises(ValueError, match="no words"):
        learn_vocab_from_counts({}, 100)
    with pytest.raises(ValueError, match="the word '##ab' starts with the joiner '##'"):
        learn_vocab_from_counts({"ab": 5, "##ab": 2}, 100)
    with pytest.raises(ValueError, match="cannot hold the 5 reserved tokens and the 3 distinct"):
        learn_vocab_from_counts({"abc": 3}, 10)


def test_write_then_load_round_trip(tmp_path, learned):
    write_vocab(learned, tmp_path / "v.txt")
    assert load_vocab(tmp_path / "v.txt") == {t: i for i, t in enumerate(learned)}


# --------------------------------------------------------------------------------------------
# The entrypoint, run as a user would.


def run_build_vocab(*args: str):
    """build_vocab.py with `args` in this process (helpers.run_script; the smoke test keeps a
    real command line)."""
    return helpers.run_script("data_prep/build_vocab.py", args)


def test_build_vocab_smoke(tmp_path, corpus):
    half = len(corpus) // 2
    (tmp_path / "part1.txt").write_text("\n".join(corpus[:half]) + "\n", encoding="utf-8")
    (tmp_path / "part2.txt").write_text("\n".join(corpus[half:]) + "\n", encoding="utf-8")
    vocab_file = tmp_path / "out" / "vocab.txt"
    # The real command line, in a fresh interpreter that never imports TensorFlow (its start-up
    # was a quarter of learning 8,000 GPT-2 merges on the default corpus)
    stdout, (tensorflow_imported, _), _ = helpers.run_data_script_alone(
        "data_prep/build_vocab.py",
        [
            f"--input_file={tmp_path}/part*.txt",
            f"--vocab_file={vocab_file}",
            "--vocab_size=240",
            "--do_lower_case=True",
            "--num_workers=2",  # counted and learned on two (forked) processes
        ],
    )
    assert not tensorflow_imported
    tokenizer = FullTokenizer(vocab_file)
    assert f"wrote {len(tokenizer.vocab)} tokens to {vocab_file}" in stdout
    assert list(tokenizer.vocab) == learn_wordpiece_vocab(corpus, 240, do_lower_case=True)
    assert "[UNK]" not in tokenizer.tokenize(corpus[0])


def test_build_vocab_empty_corpus_names_the_files(tmp_path):
    (tmp_path / "a.txt").write_text("\n\n   \n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("", encoding="utf-8")
    vocab_file = tmp_path / "vocab.txt"
    result = run_build_vocab(
        f"--input_file={tmp_path / 'a.txt'},{tmp_path / 'b.txt'}", f"--vocab_file={vocab_file}"
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("data_prep.errors.InputError") or "InputError" in last, last
    assert str(tmp_path / "a.txt") in last and str(tmp_path / "b.txt") in last
    assert not vocab_file.exists()


def test_script_learns_byte_level_and_character_bpe(tmp_path, monkeypatch):
    from data_prep import bpe, parallel

    monkeypatch.setattr(parallel, "COUNT_BATCH_BYTES", 3000)  # the corpus in 7 pieces

    lines = make_corpus()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for vocab_type, out in (("byte_level_bpe", "bl/encoder.json"), ("bpe", "codes.bpe")):
        result = run_build_vocab(
            f"--input_file={corpus}",
            f"--vocab_type={vocab_type}",
            f"--vocab_file={tmp_path / out}",
            "--num_merges=60",
            "--num_workers=2",  # words counted on two processes
        )
        assert result.returncode == 0, result.stderr[-2000:]
    tok = bpe.ByteLevelBPE.from_files(
        tmp_path / "bl" / "encoder.json", tmp_path / "bl" / "vocab.bpe"
    )
    assert len(tok.merges) == 60 and len(tok.encoder) == 256 + 60 + 1
    assert tok.merges == bpe.learn_bpe(bpe.byte_words(lines), 60)  # the counts of one process
    text = "the walker wandered to Zürich café"
    assert tok.decode(tok.encode(text)) == text and len(tok.encode(text)) < len(text.encode())
    merges = bpe.read_merges(tmp_path / "codes.bpe")
    assert len(merges) == 60 and (tmp_path / "codes.bpe").read_text().startswith("#version: 0.2")
    words = [w for line in lines for w in line.split()]
    assert merges == bpe.learn_bpe(bpe.character_words(words), 60)
    assert bpe.CharacterBPE(merges).segment("the the") == ["the</w>", "the</w>"]  # most common


def test_script_learns_gpt1s_word_end_bpe_which_rusts_bpe_reads_alike(tmp_path):
    """--vocab_type=word_end_bpe: GPT-1's vocab.json + merges.txt from the lower-cased words
    BasicTokenizer splits; bpe.load_gpt_bpe reads the folder as GPT-1's tokenizer, and Hugging
    Face `tokenizers`' BPE (Rust) over the same files, behind BERT's normalizer and
    pre-tokenizer (transformers' OpenAIGPTTokenizer), gives the same ids, <unk> included."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from data_prep import bpe

    lines = make_corpus()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "gpt1" / "vocab.json"
    result = run_build_vocab(
        f"--input_file={corpus}", "--vocab_type=word_end_bpe", f"--vocab_file={out}",
        "--num_merges=80", "--num_workers=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    tok = bpe.load_gpt_bpe(out, out.parent / "merges.txt")
    assert isinstance(tok, bpe.WordEndBPE) and len(tok.merges) == 80
    words = count_words(lines, do_lower_case=True)
    assert tok.merges == bpe.learn_bpe(bpe.character_words(words), 80)
    files = str(out), str(out.parent / "merges.txt")
    rust = Tokenizer(models.BPE.from_file(*files, unk_token="<unk>", end_of_word_suffix="</w>"))
    rust.normalizer = normalizers.BertNormalizer(lowercase=True)
    rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    texts = [*lines[:40:7], "The Walker, wandering to Zürich's café!", "qqq \u2603 x"]
    for text in texts:
        assert tok.encode(text) == rust.encode(text).ids, text
    assert tok.unk_id in tok.encode("qqq \u2603 x")  # a character no word had
    assert tok.decode(tok.encode("The walker walked.")) == "the walker walked ."
    assert list(tok.encoder)[-2:] == ["<unk>", "<|endoftext|>"]  # create_lm_data's separator
    # The folder makes GPT blocks: create_lm_data's ids put back together are the corpus'
    # lower-cased words, documents apart at <|endoftext|>.
    from data_prep import lm_data

    blocks = tmp_path / "blocks.tfrecord"
    result = helpers.run_main("data_prep/create_lm_data.py", [
        f"--input_file={corpus}", f"--output_file={blocks}", f"--vocab_file={out.parent}",
        "--block_size=16", "--num_workers=1",
    ])  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    ids = [i for batch in lm_data.lm_dataset([str(blocks)], 1, 16, False)
           for i in batch["input_ids"].numpy()[0].tolist()]  # fmt: skip
    decoded = tok.decode(ids).replace(bpe.GPT2_END_OF_TEXT, " ").split()
    basic = BasicTokenizer(do_lower_case=True)
    words = [w for line in lines for w in basic.tokenize(line)]
    # The last block may end inside a word (the rest went with the partial block dropped).
    assert len(decoded) > 100 and decoded[:-1] == words[: len(decoded) - 1]
    assert words[len(decoded) - 1].startswith(decoded[-1])
