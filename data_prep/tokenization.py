"""BERT's WordPiece tokenization, a tensorflow-text fast path with the same ids, vocab learning.

`FullTokenizer` behaves as google-research/bert's tokenization.py (clean text, space out CJK
ideographs, whitespace split, lower case + NFD + drop accents, split punctuation, then greedy
longest-match-first WordPiece), so files made here and by the original scripts agree id for id.
`InGraphTokenizer` does the same work in TensorFlow ops for bulk data creation and serving;
`learn_wordpiece_vocab` learns a vocabulary whose words are split exactly as `FullTokenizer` splits.

TensorFlow is imported lazily: a data script that only needs `FullTokenizer` starts in a blink.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path

from data_prep.errors import input_error

RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
UNK_TOKEN = "[UNK]"
# The published BERT vocabularies mark word continuations with this prefix ("un", "##aff").
SUFFIX_INDICATOR = "##"

_log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Reading files.


def read_utf8_lines(path: str | os.PathLike, opener=None) -> Iterator[tuple[int, str]]:
    """Yields (line number from 1, text without its line ending) of a UTF-8 file, decoding strictly.

    A byte-order mark at the very start of the file is dropped: editors add it and it is never
    meant as text (left in, it would turn a vocab's first token "[PAD]" into "\\ufeff[PAD]").

    Raises:
      InputError: `corpus.txt:17: expected UTF-8 text, found byte 0xff at column 5` for bad bytes
        (column counts characters from 1), or when the file cannot be opened.

    `opener(path)` opens another filesystem's file for reading bytes (e.g. tf.io.gfile.GFile for
    gs://, data_prep/beam_pipeline.py); default: the built-in open.
    """
    try:
        handle = open(path, "rb") if opener is None else opener(path)
    except OSError as e:
        raise input_error(str(path), "a readable file", e.strerror or str(e)) from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                column = len(raw[: e.start].decode("utf-8")) + 1
                raise input_error(
                    f"{path}:{number}",
                    "UTF-8 text",
                    f"byte 0x{raw[e.start]:02x} at column {column}",
                ) from None
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            if text.endswith("\n"):
                text = text[:-1]
                if text.endswith("\r"):
                    text = text[:-1]
            yield number, text


def utf8_line_ranges(path, piece_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) byte offsets that cut the file at `path` into pieces of about `piece_bytes`,
    each ending just after a line end (the last at the file's end): read_utf8_range reads them.
    Only the cut points are read (one line each)."""
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes must be positive, found {piece_bytes}")
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        start = 0
        while start < size:
            end = start + piece_bytes
            if end < size:
                handle.seek(end - 1)  # a line ending at the cut stays whole in this piece
                handle.readline()
                end = handle.tell()
            yield start, min(end, size)
            start = end


def read_utf8_range(path, start: int, end: int) -> list[str]:
    """The lines of bytes [start, end) of the file at `path` (a utf8_line_ranges piece) as
    read_utf8_lines gives them: decoded strictly, line endings and a byte-order mark at the
    file's start dropped. The piece is decoded whole, in C, where read_utf8_lines decodes line by
    line; on bad bytes read_utf8_lines reads the file to raise its error (file, line, column)."""
    with open(path, "rb") as handle:
        handle.seek(start)
        data = handle.read(end - start)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        for _ in read_utf8_lines(path):
            pass
        raise  # only if the file changed meanwhile: read_utf8_lines meets the same bytes
    if start == 0 and text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    last = lines.pop()  # "" after a final line end, else the file's last line, which keeps a \r
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if last:
        lines.append(last)
    return lines


def vocab_difference(vocab_file, other_file) -> str | None:
    """None when the two vocabularies map every token to the same id, else where they first
    differ: "line N: 'a' in <vocab_file>, 'b' in <other_file>" (or which one is longer)."""
    a, b = list(load_vocab(vocab_file)), list(load_vocab(other_file))
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1}: {x!r} in {vocab_file}, {y!r} in {other_file}"
    if len(a) != len(b):
        return f"{vocab_file} has {len(a)} tokens, {other_file} has {len(b)}"
    return None


def load_vocab(vocab_file: str | os.PathLike) -> dict[str, int]:
    """Reads a WordPiece vocab, one token a line, into {token: id} in file order (id = line - 1).

    Unlike the original (which let a later duplicate silently take over the earlier id), every
    problem that would shift or lose ids is an error.

    Raises:
      InputError: naming the file and line for an empty line, a duplicate token (both lines) or
        non-UTF-8 bytes; naming the file for an empty file or missing RESERVED_TOKENS.
    """
    from data_prep import bpe

    if bpe.folder_files(vocab_file) is not None:
        raise input_error(
            str(vocab_file),
            "a WordPiece vocab.txt, one token a line",
            "a byte-level BPE folder (a RoBERTa or GPT vocabulary), which the run scripts and "
            "extract_features.py read; this script reads WordPiece only",
        )
    vocab: dict[str, int] = {}
    for number, line in read_utf8_lines(vocab_file):
        token = line.strip()
        if not token:
            raise input_error(f"{vocab_file}:{number}", "one token per line", "an empty line")
        if token in vocab:
            raise input_error(
                f"{vocab_file}:{number}",
                "each token once",
                f"duplicate token {token!r}, already on line {vocab[token] + 1}",
            )
        vocab[token] = number - 1
    if not vocab:
        raise input_error(str(vocab_file), "one token per line", "an empty file")
    missing = [t for t in RESERVED_TOKENS if t not in vocab]
    if missing:
        raise input_error(
            str(vocab_file),
            f"the reserved tokens {', '.join(RESERVED_TOKENS)}",
            f"no line for {', '.join(missing)}",
        )
    return vocab


def write_vocab(tokens: Iterable[str], path: str | os.PathLike) -> None:
    """Writes one token a line, atomically: a temp file beside `path`, then os.replace.

    A crash or a bad token leaves either the old file or none, never half a vocabulary.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Beside the target (os.replace is atomic only within a file system); opened with "x" rather
    # than made by mkstemp so that the file gets the usual umask permissions, not 0600.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    f = open(tmp, "x", encoding="utf-8", newline="\n")
    try:
        with f:
            for token in tokens:
                if token.split() != [token]:
                    raise ValueError(f"cannot write vocab token {token!r}: empty or has whitespace")
                f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Character classes, exactly as the original defines them.


def _is_whitespace(char: str) -> bool:
    # \t, \n and \r are control characters (Cc) that the original counts as whitespace.
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    # Only Cc and Cf: the original keeps private-use (Co) and unassigned (Cn) code points, which
    # then become [UNK]; Hugging Face drops them (see tests/test_tokenization.py).
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    # All non-alphanumeric printable ASCII counts, though "$", "^", "`" and friends are symbols
    # (S*) in Unicode; beyond ASCII only the P* categories do.
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    # The CJK Unified Ideographs blocks and extensions the original lists (not kana or Hangul,
    # which are written with spaces between words).
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class _CleanTable(dict):
    """str.translate table doing the original's _clean_text and _tokenize_chinese_chars at once.

    Both are per-character maps, so one C-level translate replaces two Python loops; entries are
    computed on first sight of a code point and kept.
    """

    def __missing__(self, cp: int):
        char = chr(cp)
        if cp == 0 or cp == 0xFFFD or _is_control(char):
            value = None  # dropped, not replaced: "ab\x07cd" is one word "abcd"
        elif _is_whitespace(char):
            value = " "
        elif _is_chinese_char(cp):
            value = f" {char} "
        else:
            value = cp
        self[cp] = value
        return value


class _PunctuationTable(dict):
    def __missing__(self, char: str) -> bool:
        value = _is_punctuation(char)
        self[char] = value
        return value


_CLEAN = _CleanTable()
_PUNCT = _PunctuationTable()
# ASCII punctuation as the original defines it (code points 33-47, 58-64, 91-96, 123-126).
_ASCII_PIECES = re.compile(r"[!-/:-@\[-`{-~]|[^!-/:-@\[-`{-~]+")


def _strip_accents(text: str) -> str:
    """NFD, then drop nonspacing marks (Mn): "café" -> "cafe"."""
    text = unicodedata.normalize("NFD", text)
    return "".join(c for c in text if unicodedata.category(c) != "Mn")


def _split_on_punctuation(token: str) -> list[str]:
    """Every punctuation character becomes its own piece: "?!a.b" -> ["?", "!", "a", ".", "b"]."""
    if token.isascii():
        return _ASCII_PIECES.findall(token)
    pieces: list[str] = []
    word: list[str] = []
    for char in token:
        if _PUNCT[char]:
            if word:
                pieces.append("".join(word))
                word = []
            pieces.append(char)
        else:
            word.append(char)
    if word:
        pieces.append("".join(word))
    return pieces


# ---------------------------------------------------------------------------------------------
# The reference tokenizer.


class BasicTokenizer:
    """Splits text into words and punctuation as BERT does, before WordPiece."""

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> list[str]:
        """Cleans, spaces out CJK ideographs, lower-cases + strips accents, splits punctuation."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "ignore")  # as the original's convert_to_unicode
        text = text.translate(_CLEAN)
        pieces: list[str] = []
        for token in text.split():
            if self.do_lower_case:
                # Per token, as the original: str.lower is context-sensitive (a word-final capital
                # sigma becomes "ς", elsewhere "σ").
                token = token.lower()
                if not token.isascii():
                    token = _strip_accents(token)
            pieces.extend(_split_on_punctuation(token))
        # The original re-splits on whitespace here; it also drops pieces emptied by accent removal.
        return " ".join(pieces).split()


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece over a fixed vocabulary."""

    # Words seen are memoised: text is Zipfian, so a small cache answers most lookups.
    _CACHE_SIZE = 1 << 18

    def __init__(
        self, vocab: dict[str, int], unk_token: str = UNK_TOKEN, max_input_chars_per_word: int = 100
    ):
        # 100 as Hugging Face's BertTokenizer / tokenizers and tensorflow-text's default; the
        # google-research/bert code passes 200, which differs only on 101-200 character words.
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word
        self._cache: dict[str, tuple[str, ...]] = {}

    def tokenize(self, text: str) -> list[str]:
        """Splits each whitespace-separated word into pieces: "unaffable" -> un ##aff ##able.

        A word longer than max_input_chars_per_word characters, or one with a part that no vocab
        entry matches, becomes a single unk_token.
        """
        output: list[str] = []
        for word in text.split():
            pieces = self._cache.get(word)
            if pieces is None:
                pieces = self._word_pieces(word)
                if len(self._cache) >= self._CACHE_SIZE:
                    self._cache.clear()
                self._cache[word] = pieces
            output.extend(pieces)
        return output

    def _word_pieces(self, word: str) -> tuple[str, ...]:
        if len(word) > self.max_input_chars_per_word:
            return (self.unk_token,)
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else SUFFIX_INDICATOR + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return (self.unk_token,)
            pieces.append(piece)
            start = end
        return tuple(pieces)


class WordTokenizer:
    """Whole words as tokens, for an ELMo biLM that reads words through its character CNN (a
    published ELMo: modeling/elmo.reads_words). Its vocabulary is the reserved tokens and then
    every word of `words` (a run's data, so no word is unknown), in order of first appearance;
    the biLM spells each id's word (ElmoBiLM.read_words), [CLS] and [SEP] as the sentence
    markers <S> and </S> (spelled_tokens).

    split: "basic" (BasicTokenizer: punctuation split off, cased unless do_lower_case) or
    "whitespace" (the text's whitespace-separated words as they are). The interface is
    FullTokenizer's that glue.encode_examples and conll.encode_sentences use."""

    SPELLED = {"[CLS]": "<S>", "[SEP]": "</S>"}

    def __init__(self, words: Iterable[str], split: str = "basic", do_lower_case: bool = False):
        if split not in ("basic", "whitespace"):
            raise ValueError(f"split: expected basic or whitespace, found {split!r}")
        self.split, self.do_lower_case = split, do_lower_case
        self._basic = BasicTokenizer(do_lower_case=do_lower_case)
        self.vocab = {t: i for i, t in enumerate(RESERVED_TOKENS)}
        for word in words:
            self.vocab.setdefault(word, len(self.vocab))
        self.inv_vocab = {i: t for t, i in self.vocab.items()}

    @classmethod
    def from_texts(cls, texts: Iterable[str], split: str = "basic", do_lower_case: bool = False):
        """The tokenizer whose vocabulary holds every word of `texts`, split as it splits."""
        splitter = cls((), split, do_lower_case)
        return cls((w for text in texts for w in splitter.tokenize(text)), split, do_lower_case)

    def tokenize(self, text: str) -> list[str]:
        return text.split() if self.split == "whitespace" else self._basic.tokenize(text)

    def tokenize_word(self, word: str) -> list[str]:
        """One word of pre-split text (conll.encode_sentences) is one token, as it is."""
        return [word]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """A word outside `texts` is [UNK]'s id."""
        unk = self.vocab["[UNK]"]
        return [self.vocab.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.inv_vocab[int(i)] for i in ids]

    def spelled_tokens(self) -> list[str]:
        """What the biLM spells for each id: the word, <S> for [CLS] and </S> for [SEP]."""
        return [self.SPELLED.get(t, t) for t in self.vocab]


def wordpiece_text(pieces: Sequence[str]) -> str:
    """The text of WordPieces, as the original run_squad.py shows a span: "un ##aff ##able" ->
    "unaffable", one space between words."""
    text = " ".join(pieces).replace(" ##", "").replace("##", "")
    return " ".join(text.strip().split())


class FullTokenizer:
    """BasicTokenizer then WordpieceTokenizer, with the vocabulary read from `vocab_file`."""

    detokenize = staticmethod(wordpiece_text)

    def __init__(self, vocab_file: str | os.PathLike, do_lower_case: bool = True):
        self._setup(load_vocab(vocab_file), do_lower_case)

    @classmethod
    def from_vocab(cls, vocab: dict[str, int], do_lower_case: bool = True) -> FullTokenizer:
        """A tokenizer over an already loaded {token: id} vocab (see load_vocab)."""
        tokenizer = cls.__new__(cls)
        tokenizer._setup(vocab, do_lower_case)
        return tokenizer

    def _setup(self, vocab: dict[str, int], do_lower_case: bool) -> None:
        self.vocab = vocab
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)
        self._word_ids = _WordIds(self)

    def tokenize(self, text: str) -> list[str]:
        pieces: list[str] = []
        for word in self.basic_tokenizer.tokenize(text):
            pieces.extend(self.wordpiece_tokenizer.tokenize(word))
        return pieces

    def tokenize_word(self, word: str) -> list[str]:
        """The pieces of one word of pre-split text (conll.encode_sentences): WordPiece needs no
        context, so tokenize's."""
        return self.tokenize(word)

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Raises KeyError for a token not in the vocab, as the original."""
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.inv_vocab[int(i)] for i in ids]

    def tokenize_to_ids(self, text: str) -> list[int]:
        """convert_tokens_to_ids(tokenize(text)), with a shortcut for ASCII text (same ids, tested).

        For ASCII, BasicTokenizer's steps reduce to: drop control characters and turn tabs and
        line ends into spaces (only when the text has any: isprintable), lower-case (per word or
        per line is the same in ASCII), split on spaces, split punctuation off each word. So the
        ids of a whitespace-separated word depend on the word alone and are memoised per word:
        text is Zipfian, and a line becomes one C-level pass of dict lookups (2 to 4 times
        quicker than the token-string path on the default corpus).
        """
        if not (isinstance(text, str) and text.isascii()):  # bytes are decoded by tokenize
            return self.convert_tokens_to_ids(self.tokenize(text))
        if not text.isprintable():
            text = text.translate(_CLEAN)
        if self.do_lower_case:
            text = text.lower()
        words = self._word_ids
        if len(words) >= WordpieceTokenizer._CACHE_SIZE:
            words.clear()
        return list(chain.from_iterable(map(words.__getitem__, text.split())))

    def batch_tokenize_ids(self, lines: Sequence[str]) -> list[list[int]]:
        """tokenize_to_ids of each line (the bulk entry read_documents looks for)."""
        return list(map(self.tokenize_to_ids, lines))


class _WordIds(dict):
    """ASCII word (lower-cased if the tokenizer lower-cases, no spaces) -> its ids, computed on
    first sight: the word split at punctuation, each piece through WordPiece (pieces memoised
    too: a corpus has a tenth as many pieces as words-with-punctuation)."""

    def __init__(self, tokenizer: FullTokenizer):
        super().__init__()
        self._wordpiece = tokenizer.wordpiece_tokenizer
        self._vocab = tokenizer.vocab
        self._piece_ids: dict[str, tuple[int, ...]] = {}

    def __missing__(self, word: str) -> tuple[int, ...]:
        cache = self._piece_ids
        if len(cache) >= WordpieceTokenizer._CACHE_SIZE:
            cache.clear()
        ids: list[int] = []
        for piece in (word,) if word.isalnum() else _ASCII_PIECES.findall(word):
            found = cache.get(piece)
            if found is None:
                vocab = self._vocab
                found = cache[piece] = tuple(vocab[t] for t in self._wordpiece._word_pieces(piece))
            ids.extend(found)
        self[word] = result = tuple(ids)
        return result


# ---------------------------------------------------------------------------------------------
# The fast path: the same ids from tensorflow-text ops.
#
# tensorflow-text's tokenizers differ from BERT in ways that change ids; measured by tokenizing
# every code point (in "a?b ? A?") and the hard strings in tests/test_tokenization.py:
#   1. Lower-casing is NFKC_Casefold (`case_fold_utf8`), not str.lower: "ﬁ" -> "fi", "ｆｕｌｌ" ->
#      "full", "ß" -> "ss", "Ⅻ" -> "xii", "①" -> "1", final "ς" -> "σ". BERT keeps all of these.
#      So the tokenizer runs with lower-casing off and the graph lower-cases first with
#      tf.strings.lower (ICU full case mapping, incl. the final-sigma rule, as str.lower), then
#      NFD and drops Mn, as BERT does.
#   2. Control characters (Cc, Cf) become spaces; BERT deletes them ("a\x07b" is one word "ab").
#      So they are deleted first.
#   3. The word-length limit counts UTF-8 bytes (max_bytes_per_word), BERT counts characters:
#      a 34-letter Devanagari word (102 bytes) or a 12-syllable Hangul word (NFD: 36 jamo, 108
#      bytes) is [UNK] in tensorflow-text only. So the byte limit is raised to 4 bytes x 100
#      characters, and the graph replaces every word of more than 100 characters (as BERT's word
#      boundaries define them) with a word that is over the byte limit, hence one [UNK].
#   4. BertTokenizer (the fallback when FastBertTokenizer is missing) splits only on ASCII
#      whitespace, so "line\u2028sep" stays one word; all Unicode separators (Z*) become " ".
#   5. Left over: the Unicode tables. Python 3.11 has Unicode 14.0; ICU inside tensorflow-text is
#      newer, so code points unassigned (Cn) in 14.0 may be letters, marks or punctuation to it.
#      The character classes of steps 1-4 are built from Python's tables, which leaves 43 such
#      code points split differently by FastBertTokenizer itself (78 with RE2's own \p{..}
#      classes). `batch_tokenize_ids` sends lines holding such a code point (or a lone surrogate)
#      to FullTokenizer; in a graph they remain a known difference.
# With 1-5, every code point in context and 40k random strings give identical ids.
#
# Speed on 2 MB of text (1 MB Wikipedia paragraphs + 1 MB Shakespeare lines, 22.7k lines, 476k
# tokens, bert-base-uncased vocab; 2 cores shared with other jobs, best of 3): FullTokenizer
# 0.35 M tokens/s, batch_tokenize_ids 1.3-1.4 M tokens/s (after a one-off 1-3 s build), Hugging
# Face tokenizers' encode_batch 0.2 M tokens/s on the same machine. FullTokenizer is this quick
# thanks to str.translate, a regex for ASCII words and a word cache; about half of the fast
# path's time is the tokenizer op itself, the rest normalization (notes 1-4) and converting to
# Python lists.

_MAX_UTF8_BYTES = 4  # the most bytes one code point takes in UTF-8
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


class _GapTable(dict):
    """char -> whether Python's tables leave it unassigned (Cn) or it is a surrogate (Cs)."""

    def __missing__(self, char: str) -> bool:
        value = unicodedata.category(char) in ("Cn", "Cs")
        self[char] = value
        return value


_GAP = _GapTable()
_re2_classes: dict[str, str] | None = None


def _re2_character_classes() -> dict[str, str]:
    """RE2 character classes built from Python's Unicode tables, so the graph and FullTokenizer
    agree on what is a control, a separator, a mark or punctuation (note 5). Built once."""
    global _re2_classes
    if _re2_classes is None:
        category = unicodedata.category
        drop, space, mark, split = [], [], [], []
        for cp in range(0x110000):
            cat = category(chr(cp))
            if cat[0] == "C":
                if cat in ("Cc", "Cf") and cp not in (9, 10, 13):  # as _is_control
                    drop.append(cp)
            elif cat[0] == "Z":
                if cp != 0x20:  # " " itself needs no rewriting
                    space.append(cp)
            elif cat == "Mn":
                mark.append(cp)
            elif cat[0] == "P":
                split.append(cp)
        drop.append(0xFFFD)
        # ASCII symbols count as punctuation too (_is_punctuation), and all of the CJK ranges
        # (_is_chinese_char), their unassigned code points included.
        split_set = set(split) | {cp for cp in range(128) if _is_punctuation(chr(cp))}
        for lo, hi in _CJK_RANGES:
            split_set.update(range(lo, hi + 1))
        split = sorted(split_set)
        _re2_classes = {
            "drop": _re2_class(sorted(drop)),
            "space": _re2_class(space),
            "mark": _re2_class(mark),
            "split": _re2_class(split),
        }
    return _re2_classes


def _re2_class(code_points: list[int]) -> str:
    parts, i = [], 0
    while i < len(code_points):
        j = i
        while j + 1 < len(code_points) and code_points[j + 1] == code_points[j] + 1:
            j += 1
        lo, hi = code_points[i], code_points[j]
        parts.append(f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}")
        i = j + 1
    return "[" + "".join(parts) + "]"


class InGraphTokenizer:
    """BERT WordPiece in TensorFlow ops (tensorflow-text), with ids identical to FullTokenizer.

    `tokenize_to_ids` is pure TF and can sit inside a tf.function, a tf.data map or a serving
    signature (to export, keep `.tf_tokenizer` as an attribute of your tf.Module so it is
    tracked). `batch_tokenize_ids` is the bulk entry for Python callers.
    """

    def __init__(
        self,
        vocab: str | os.PathLike | dict[str, int],
        do_lower_case: bool = True,
        max_input_chars_per_word: int = 100,
    ):
        import tensorflow as tf
        import tensorflow_text as tf_text

        self.vocab = vocab if isinstance(vocab, dict) else load_vocab(vocab)
        self.do_lower_case = do_lower_case
        self.max_input_chars_per_word = max_input_chars_per_word
        tokens = sorted(self.vocab, key=self.vocab.__getitem__)
        if [self.vocab[t] for t in tokens] != list(range(len(tokens))):
            raise ValueError("vocab ids must be 0..len(vocab)-1, as load_vocab gives")
        self._classes = _re2_character_classes()
        max_bytes = _MAX_UTF8_BYTES * max_input_chars_per_word
        # Any word past the byte limit is one [UNK]: the stand-in for words BERT finds too long.
        self._too_long_word = "x" * (max_bytes + 1)
        # Only a text with this many non-spaces in a row can hold a too-long word.
        self._long_run_re = rf"(?s).*[^ \t\n\r]{{{max_input_chars_per_word + 1}}}.*"
        if hasattr(tf_text, "FastBertTokenizer"):
            self.tf_tokenizer = tf_text.FastBertTokenizer(
                vocab=tokens,
                suffix_indicator=SUFFIX_INDICATOR,
                max_bytes_per_word=max_bytes,
                token_out_type=tf.int64,
                unknown_token=UNK_TOKEN,
                lower_case_nfd_strip_accents=False,  # done in _normalize, see note 1
            )
            self._merge_words = False
        else:
            table = tf.lookup.StaticVocabularyTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(tokens), tf.range(len(tokens), dtype=tf.int64)
                ),
                num_oov_buckets=1,
            )
            self.tf_tokenizer = tf_text.BertTokenizer(
                table,
                suffix_indicator=SUFFIX_INDICATOR,
                max_bytes_per_word=max_bytes,
                token_out_type=tf.int64,
                unknown_token=UNK_TOKEN,
                lower_case=False,
            )
            self._merge_words = True
        spec = [tf.TensorSpec([None], tf.string)]
        self._compiled = tf.function(self.tokenize_to_ids, input_signature=spec)
        self._compiled_ascii = tf.function(
            lambda x: self.tokenize_to_ids(x, ascii_only=True), input_signature=spec
        )
        self._full: FullTokenizer | None = None

    def _normalize(self, x, ascii_only: bool = False):
        """Makes tensorflow-text see what BERT's BasicTokenizer sees before it splits; notes 1-4.

        Args:
          x: tf.string Tensor of shape [B].
          ascii_only: the caller promises every text is ASCII, which skips the Unicode steps.
        """
        import tensorflow as tf
        import tensorflow_text as tf_text

        if ascii_only:
            x = tf.strings.regex_replace(x, r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F]", "")
            if self.do_lower_case:
                x = tf.strings.lower(x)
        else:
            x = tf.strings.regex_replace(x, self._classes["drop"], "")
            x = tf.strings.regex_replace(x, self._classes["space"], " ")
            if self.do_lower_case:
                x = tf.strings.lower(x, encoding="utf-8")
                x = tf_text.normalize_utf8(x, "NFD")
                x = tf.strings.regex_replace(x, self._classes["mark"], "")
        # Note 3. Only the few texts with a long run of non-spaces are split into BERT's words
        # (spaces around punctuation and CJK change no tokens) and joined back; one regex of
        # "a word character, 101 times" would be simpler but overflows RE2's DFA memory.
        long_run = tf.cast(tf.strings.regex_full_match(x, self._long_run_re), tf.int32)  # [B]
        parts = tf.dynamic_partition(x, long_run, 2)
        indices = tf.dynamic_partition(tf.range(tf.size(x)), long_run, 2)
        words = tf.strings.split(
            tf.strings.regex_replace(parts[1], self._classes["split"], r" \0 ")
        )
        chars = tf.strings.length(words.flat_values, unit="UTF8_CHAR")
        words = words.with_flat_values(
            tf.where(chars > self.max_input_chars_per_word, self._too_long_word, words.flat_values)
        )
        fixed = tf.strings.reduce_join(words, axis=-1, separator=" ")
        return tf.dynamic_stitch(indices, [parts[0], fixed])

    def tokenize_to_ids(self, strings, ascii_only: bool = False):
        """Tokenizes a batch of texts to word-piece ids.

        Args:
          strings: a list of str or a tf.string Tensor of shape [B] (UTF-8).
          ascii_only: skip the Unicode normalization; only correct if every text is ASCII.

        Returns:
          tf.RaggedTensor of int64, shape [B, (T)]: the ids of each text's word pieces, in order.
        """
        import tensorflow as tf

        x = self._normalize(tf.convert_to_tensor(strings, dtype=tf.string), ascii_only)
        ids = self.tf_tokenizer.tokenize(x)
        if self._merge_words:  # BertTokenizer gives [B, (words), (pieces)]
            ids = ids.merge_dims(-2, -1)
        return ids

    def batch_tokenize_ids(self, lines: Sequence[str], batch_size: int = 4096) -> list[list[int]]:
        """Tokenizes many lines to id lists, exactly as FullTokenizer.tokenize_to_ids would.

        ASCII lines take a shorter graph, lines whose ids could differ (note 5) FullTokenizer, the
        rest the full graph, in batches of `batch_size`.
        """
        out: list[list[int] | None] = [None] * len(lines)
        ascii_lines: list[int] = []
        unicode_lines: list[int] = []
        for i, line in enumerate(lines):
            if line.isascii():
                ascii_lines.append(i)
            elif not any(_GAP[c] for c in set(line)):
                unicode_lines.append(i)
            else:
                if self._full is None:
                    self._full = FullTokenizer.from_vocab(self.vocab, self.do_lower_case)
                out[i] = self._full.tokenize_to_ids(line)
        for fn, indices in ((self._compiled_ascii, ascii_lines), (self._compiled, unicode_lines)):
            for b in range(0, len(indices), batch_size):
                chunk = indices[b : b + batch_size]
                ragged = fn([lines[i] for i in chunk])
                values = ragged.flat_values.numpy().tolist()
                splits = ragged.row_splits.numpy().tolist()
                for k, i in enumerate(chunk):
                    out[i] = values[splits[k] : splits[k + 1]]
        return out  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Learning a vocabulary.


def count_words(
    lines: Iterable[str], do_lower_case: bool, progress: bool | None = None
) -> collections.Counter:
    """Counts the words BasicTokenizer makes of `lines` (so learned pieces fit FullTokenizer)."""
    basic = BasicTokenizer(do_lower_case=do_lower_case)
    counts: collections.Counter = collections.Counter()
    if progress:
        from tqdm import tqdm

        lines = tqdm(lines, unit=" lines", desc="counting words", mininterval=2.0)
    for line in lines:
        counts.update(basic.tokenize(line))
    return counts


def _piece_counts(words, heads, tails, max_head: int, max_tail: int, thresh: int):
    """One refining pass of the learner over `words` [(word, count)], distinct words: each
    word's greedy longest-match pieces (the first from `heads`, the rest from `tails`, which hold
    pieces without the joiner; no piece longer than max_head / max_tail), and for each piece its
    word's count added to the word's text from that piece on. Returns the words whose pieces
    were all found, with their counts, where at least `thresh` (a head's count is its word's
    alone, so the passes over a share of the words can drop the others), and the tail counts
    by suffix (summed over every share before they are compared with `thresh`)."""
    head_counts: dict[str, int] = {}
    tail_counts: dict[str, int] = collections.defaultdict(int)
    for word, count in words:
        if word in heads:
            if count >= thresh:
                head_counts[word] = count
            continue
        n = len(word)
        end = n - 1 if n <= max_head else max_head  # not min(): a call per word
        while end and word[:end] not in heads:
            end -= 1
        if not end:
            continue
        keys: list[str] | None = []
        start = end
        while start < n:
            rest = word[start:]
            if rest in tails:
                keys.append(rest)
                break
            end = start + max_tail
            if end >= n:
                end = n - 1
            while end > start and word[start:end] not in tails:
                end -= 1
            if end == start:
                keys = None
                break
            keys.append(rest)
            start = end
        if keys is None:
            continue
        if count >= thresh:
            head_counts[word] = count
        for rest in keys:
            tail_counts[rest] += count
    return head_counts, tail_counts


_learner_words: list = []  # a learner worker's words (set by _set_learner_words)


def _set_learner_words(words) -> None:
    global _learner_words
    _learner_words = words


def _learner_share(share: int, shares: int, *args):
    return _piece_counts(_learner_words[share::shares], *args)


def _learn_like_tf_text(
    word_counts: Sequence[tuple[str, int]],
    vocab_size: int,
    reserved_tokens: Sequence[str],
    upper_thresh: int = 10**7,
    lower_thresh: int = 1,
    num_iterations: int = 4,
    max_input_tokens: int = 5 * 10**6,
    max_token_length: int = 50,
    max_unique_chars: int = 1000,
    slack_ratio: float = 0.05,
    joiner: str = SUFFIX_INDICATOR,
    log: Callable[[str], None] | None = None,
    num_workers: int = 1,
) -> list[str]:
    """tensorflow-text's BERT vocab learner (wordpiece_tokenizer_learner_lib.learn), fast.

    word_counts: (word, count) of distinct words, as the library takes them.
    Same arguments and the same output, token for token (checked on the 9.5 MB Shakespeare +
    Wikipedia corpus at vocab_size 8000, and in tests/test_build_vocab.py), found by the same
    binary search on a count threshold. Why a rewrite: on that corpus (60k distinct words, 2
    cores) the library took 453 s (273 s of CPU), as each of its 14 search steps counts every
    substring of every word 4 times and then walks every prefix of each. Its count-then-subtract
    pass leaves each piece with the count of the words that END with that piece after a piece
    boundary (a piece's count minus its one-character extensions'), so here each (word, piece
    start) adds its count to word[start:] alone, and the first iteration, which does not depend
    on the threshold, is done once: 40 s on the same corpus.
    Since the 50th session the pieces that start a word and those after a boundary are kept
    apart (no joiner is glued on to look a piece up), no piece longer than the longest kept
    is tried, and each refining pass runs on `num_workers` processes, the words dealt among
    them: on the 7 MB default corpus (vocab_size 8000, 17 search steps) 14.0 s of CPU became
    7.4 s on one process and 6.3 s on two (the library: 91 s; tests/test_build_vocab.py checks
    both against it).
    Defaults as the library's, except lower_thresh=1 (not 10) so small corpora reach vocab_size.

    Raises:
      ValueError: for a word that starts with the joiner, which the library counts as one token
        with the same piece after a boundary (a WordPiece vocabulary cannot tell them apart;
        BasicTokenizer never makes one: it splits "#" off as punctuation).
    """
    if lower_thresh < 1:
        raise ValueError("lower_thresh must be at least 1")
    counts = [c for _, c in word_counts]
    upper = min(max(counts), upper_thresh) if upper_thresh is not None else max(counts)
    lower = max(min(counts), lower_thresh)
    reserved = set(reserved_tokens)
    words = [(w, c) for w, c in word_counts if len(w) <= max_token_length and w not in reserved]
    char_counts: dict[str, int] = collections.defaultdict(int)
    for word, count in words:
        for char in word:
            char_counts[char] += count
    ranked_chars = sorted(char_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    allowed = {ch for ch, _ in ranked_chars[:max_unique_chars]}
    words = sorted(words, key=lambda wc: wc[1], reverse=True)  # stable, as the library
    filtered = []
    for word, count in words:
        if max_input_tokens not in (None, -1) and len(filtered) >= max_input_tokens:
            break
        if all(ch in allowed for ch in word):
            if word.startswith(joiner):
                raise ValueError(
                    f"the word {word!r} starts with the joiner {joiner!r}: a WordPiece "
                    "vocabulary cannot hold it apart from the same piece after a boundary"
                )
            filtered.append((word, count))
    chars = sorted({ch for word, _ in filtered for ch in word})
    # Iteration 0: pieces may start anywhere; a word's own count as a head, each later start's
    # as a tail (joiner-free).
    first_heads: dict[str, int] = collections.defaultdict(int)
    first_tails: dict[str, int] = collections.defaultdict(int)
    for word, count in filtered:
        first_heads[word] += count
        for start in range(1, len(word)):
            first_tails[word[start:]] += count

    def kept(counted: dict[str, int], thresh: int) -> dict[str, int]:
        tokens = {t: c for t, c in counted.items() if c >= thresh}
        for ch in chars:
            tokens.setdefault(ch, 1)
        return tokens

    def refine(heads: dict[str, int], tails: dict[str, int], thresh: int):
        """_piece_counts over every word: this process's share (`own`) here, the other shares
        on `pool`'s processes (both set below, before the search)."""
        args = (heads, tails, max(map(len, heads)), max(map(len, tails)), thresh)
        futures = [pool.submit(_learner_share, share, shares, *args) for share in range(1, shares)]
        head_counts, tail_counts = _piece_counts(own, *args)
        for future in futures:
            more_heads, more_tails = future.result()
            head_counts.update(more_heads)  # each word in one share
            for token, count in more_tails.items():
                tail_counts[token] += count
        return head_counts, tail_counts

    def learn_with_thresh(thresh: int) -> list[str]:
        heads, tails = kept(first_heads, thresh), kept(first_tails, thresh)
        for _ in range(1, num_iterations):
            head_counts, tail_counts = refine(heads, tails, thresh)
            heads, tails = kept(head_counts, thresh), kept(tail_counts, thresh)
        tokens = {**heads, **{joiner + t: c for t, c in tails.items()}}
        vocab = list(reserved_tokens) + chars
        vocab += [t for t, _ in sorted(tokens.items(), key=lambda kv: (-kv[1], kv[0]))]
        return list(dict.fromkeys(vocab))  # de-duplicated, first place kept

    slack = max(slack_ratio * vocab_size, 0)
    with contextlib.ExitStack() as stack:
        pool = None
        if num_workers > 1:
            from data_prep import parallel

            pool = stack.enter_context(
                parallel.worker_pool(num_workers - 1, _set_learner_words, (filtered,))
            )
        shares = num_workers if pool is not None else 1
        own = filtered[::shares]  # this process's share of every pass
        while True:
            thresh = (upper + lower) // 2
            t0 = time.perf_counter()
            vocab = learn_with_thresh(thresh)
            if log:
                log(
                    f"threshold {thresh}: {len(vocab)} tokens (target {vocab_size}) in "
                    f"{time.perf_counter() - t0:.1f}s"
                )
            size = len(vocab)
            if (size <= vocab_size and vocab_size - size <= slack) or lower >= upper or thresh <= 1:
                return vocab
            if size > vocab_size:
                lower = thresh + 1
            else:
                upper = thresh - 1


def learn_vocab_from_counts(
    word_counts: dict[str, int],
    vocab_size: int,
    reserved_tokens: Sequence[str] = RESERVED_TOKENS,
    progress: bool | None = None,
    num_workers: int = 1,
) -> list[str]:
    """Learns a WordPiece vocab of at most `vocab_size` tokens from {word: count}.

    Returns the reserved tokens (in the given order), then every character of every word and its
    "##" form (so no word of the corpus becomes [UNK]), then learned pieces, most frequent first.
    Deterministic: ties are broken by the token's text; the same for any `num_workers` (the
    processes the learner's passes run on).
    """
    if not word_counts:
        raise ValueError("no words to learn a vocabulary from")
    reserved = list(dict.fromkeys(reserved_tokens))
    chars = sorted({ch for word in word_counts for ch in word} - set(reserved))
    base = reserved + chars + [SUFFIX_INDICATOR + ch for ch in chars]
    base = list(dict.fromkeys(base))
    if len(base) > vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} cannot hold the {len(reserved)} reserved tokens and the "
            f"{len(chars)} distinct characters of the corpus with their ## forms ({len(base)})"
        )
    # Sorted by count then text, so the result does not depend on the corpus' line order.
    ranked = sorted(word_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    t0 = time.perf_counter()
    log = _log.info if progress else None
    learned = _learn_like_tf_text(ranked, vocab_size, reserved, log=log, num_workers=num_workers)
    if progress:
        _log.info(f"learned {len(learned)} tokens in {time.perf_counter() - t0:.1f}s")
    in_base = set(base)
    extra = [t for t in learned if t not in in_base]
    return base + extra[: vocab_size - len(base)]


def learn_wordpiece_vocab(
    lines: Iterable[str],
    vocab_size: int,
    do_lower_case: bool,
    reserved_tokens: Sequence[str] = RESERVED_TOKENS,
    progress: bool | None = None,
) -> list[str]:
    """Learns a BERT WordPiece vocab from text lines; see learn_vocab_from_counts for the layout.

    Words are split as BasicTokenizer(do_lower_case) splits them, then tensorflow-text's BERT
    vocab learner (as _learn_like_tf_text) picks the pieces. `progress`: show a bar with lines/s
    while counting and log each search step.
    """
    counts = count_words(lines, do_lower_case, progress=progress)
    return learn_vocab_from_counts(counts, vocab_size, reserved_tokens, progress=progress)
