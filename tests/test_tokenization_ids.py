"""FullTokenizer.tokenize_to_ids' ASCII shortcut (data_prep/tokenization.py): the same ids as the
token-string path it skips, and as Hugging Face `tokenizers`, on every kind of ASCII text."""

from __future__ import annotations

import pickle
import random

import pytest

from data_prep.tokenization import FullTokenizer, WordpieceTokenizer
from tests.test_tokenization import bert_vocab_file, hf, hf_ids  # noqa: F401 (fixtures)

# Every ASCII character, controls included, with letters and spaces weighted up so words form.
_ALPHABET = [chr(c) for c in range(128)] + list("etaoinsrhl  EAST") * 8


def ascii_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    texts = ["".join(rng.choices(_ALPHABET, k=rng.randint(0, 60))) for _ in range(n)]
    # words past max_input_chars_per_word (100), alone and glued to punctuation
    texts += ["a" * 101, "b" * 100, "x" * 150 + ".y", "Don't stop\tnow!\r\n", "\x00\x07\x7f\x1f"]
    return texts


def slow_ids(tokenizer: FullTokenizer, text: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_ascii_shortcut_equals_the_token_path(bert_vocab_file, do_lower_case):  # noqa: F811
    tokenizer = FullTokenizer(bert_vocab_file, do_lower_case=do_lower_case)
    texts = ascii_texts(3, 1501)
    want = [slow_ids(tokenizer, t) for t in texts]
    assert sum(map(len, want)) > 10_000
    assert [tokenizer.tokenize_to_ids(t) for t in texts] == want
    assert tokenizer.batch_tokenize_ids(texts) == want  # again, from the word cache
    # A pickled copy (as the streaming workers receive it) gives the same ids.
    assert pickle.loads(pickle.dumps(tokenizer)).batch_tokenize_ids(texts) == want
    # Non-ASCII text and bytes still take the token path.
    assert tokenizer.tokenize_to_ids("Café naïve") == slow_ids(tokenizer, "Café naïve")
    assert tokenizer.tokenize_to_ids(b"Hello, world") == slow_ids(tokenizer, "Hello, world")


def test_ascii_shortcut_matches_hugging_face(bert_vocab_file, hf):  # noqa: F811
    # Hugging Face's Rust WordPiece is the reference no one here wrote; control characters are
    # left out (it differs from BERT on a few, see tests/test_tokenization.py).
    tokenizer = FullTokenizer(bert_vocab_file, do_lower_case=True)
    rng = random.Random(5)
    printable = [chr(c) for c in range(32, 127)] + list("etaoinsrhl  EAST\t") * 6
    texts = ["".join(rng.choices(printable, k=rng.randint(1, 50))) for _ in range(701)]
    assert [tokenizer.tokenize_to_ids(t) for t in texts] == [hf_ids(hf, t) for t in texts]


def test_the_word_cache_is_bounded(bert_vocab_file, monkeypatch):  # noqa: F811
    monkeypatch.setattr(WordpieceTokenizer, "_CACHE_SIZE", 7)
    tokenizer = FullTokenizer(bert_vocab_file)
    texts = ascii_texts(4, 301)
    want = [slow_ids(tokenizer, t) for t in texts]
    got = []
    for text in texts:
        got.append(tokenizer.tokenize_to_ids(text))
        assert len(tokenizer._word_ids) <= 7 + len(text.split())
    assert got == want
