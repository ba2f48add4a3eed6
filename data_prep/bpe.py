"""Byte-pair encoding: learning merges (Sennrich et al. 2016) and GPT-2's byte-level tokenizer.

Two flavours of one algorithm:
  character level   words are characters with an end-of-word marker glued to the last one
                    ("l o w</w>", subword-nmt's format 0.2); merges learned from whitespace words.
  byte level        GPT-2 (Radford et al. 2019, sec. 2.2): text is split by GPT-2's pattern into
                    pre-tokens (a leading space belongs to the word that follows), each pre-token
                    is UTF-8 bytes shown as printable characters (`bytes_to_unicode`), and merges
                    never cross a pre-token. Every string is encodable: no unknown token.

`learn_bpe` is the exact greedy algorithm: repeatedly merge the most frequent adjacent pair
(ties: the larger pair, as subword-nmt breaks them), counting pairs incrementally with a lazy
max-heap. `ByteLevelBPE` reads and writes GPT-2's `encoder.json` + `vocab.bpe` and encodes id for
id as GPT-2's encoder does; `WordEndBPE` is GPT-1's character-level one (its vocab.json and
merges.txt), as Hugging Face's OpenAIGPTTokenizer encodes without ftfy and spaCy.

Written by hand: keras-hub's BytePairTokenizer and Hugging Face `tokenizers` encode but neither
learns merges with subword-nmt's tie-breaking or keeps its file format, and the encoder here is a
plain-Python peer whose speed bench/ measures against `tokenizers` (Rust).
"""

from __future__ import annotations

import gc
import heapq
import itertools
import json
import operator
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import regex

from data_prep.errors import input_error
from data_prep.tokenization import BasicTokenizer

END_OF_WORD = "</w>"
# GPT-2's pre-tokenizer (encoder.py): contractions, letters, numbers and other symbols each with an
# optional leading space, then runs of whitespace (a final space stays with the next word).
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
# The same pattern for ASCII text, in the standard library's `re`: on ASCII, \p{L} is [A-Za-z],
# \p{N} is [0-9] and both modules' \s is [\t\n\v\f\r ] (tests/test_bpe.py checks the two agree
# on ASCII strings). `re` runs it in about half the time `regex` needs for GPT2_PATTERN, and
# pre-tokenizing was a third of encoding time on the default corpus.
GPT2_ASCII_PATTERN = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""", re.ASCII
)
GPT2_END_OF_TEXT = "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    Printable Latin-1 bytes map to themselves; the other 68 (controls, space, ...) to code points
    from 256 up, in byte order. So a space becomes "Ġ" (U+0120) and a newline "Ċ" (U+010A).
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
# BYTE_TO_CHAR as a str.translate table over a Latin-1 decoding of the UTF-8 bytes (code point ==
# byte value): one C call instead of a Python loop over the bytes.
_BYTE_TABLE = str.maketrans(BYTE_TO_CHAR)
_BYTE_CHARS = [BYTE_TO_CHAR[b] for b in range(256)]  # by byte value


def byte_chars(text: str) -> str:
    """The printable characters of a text's UTF-8 bytes ("Ġworld" for " world")."""
    return text.encode("utf-8").decode("latin-1").translate(_BYTE_TABLE)


def pretokenize(text: str) -> list[str]:
    """GPT-2's pre-tokens of a text, each as its bytes' printable characters ("Ġworld")."""
    return [byte_chars(t) for t in GPT2_PATTERN.findall(text)]


# ---------------------------------------------------------------------------------------------
# Learning merges
# ---------------------------------------------------------------------------------------------


_SHIFT = 32  # a pair of symbol ids (each below 2**32) packed into one int: first << 32 | second


def _reversed_order_key(symbol: str) -> tuple[int, ...]:
    """A key whose tuple order is the reverse of the strings' order: negated code points, then 1
    (above every negated one, so a prefix sorts after the longer string it starts)."""
    return (*(-ord(c) for c in symbol), 1)


def learn_bpe(
    word_counts: dict[tuple[str, ...], int],
    num_merges: int,
    min_frequency: int = 2,
    progress=None,
) -> list[tuple[str, str]]:
    """Learns up to `num_merges` merges from words given as symbol tuples with their counts.

    Each step merges the most frequent adjacent pair over all words (weighted by count); ties go
    to the larger pair (max of (count, pair)), so the result is deterministic and equals
    subword-nmt's. Stops early when no pair occurs `min_frequency` times.
    progress: optional callable(done, total) called every 100 merges.
    Returns the merges in order.

    Speed (written by hand: no library learns subword-nmt's merges, and subword-nmt itself, pure
    Python, recounts every pair of a word the merge touches): symbols are int ids and a pair one
    packed int; a step visits only the words listed under the merged pair (listed lazily: a
    word stays under a pair it lost, and a visit that finds no occurrence changes nothing),
    recounts only the pairs beside each occurrence, and pushes only the pairs whose count rose,
    on a heap ordered by (-count, reversed string keys) in C, without a Python comparison for
    ties. A word with one occurrence (two thirds of the visits) is edited in place and filed
    under its neighbours, whose pairs' counts change once per neighbour symbol. On the 7 MB
    default corpus, 8,000 byte-level merges took 11.1 s of learning before the 48th session;
    on the 50th's host, 1.42 s with the 48th's code and 0.91 s now (CPU seconds, best of four),
    character-level ones 2.70 s and 1.73 s, the merges identical.
    """
    # The loop allocates millions of small lists and tuples and none of them in a cycle: the
    # cyclic collector's passes over them were a third of character-level learning's time.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _learn(word_counts, num_merges, min_frequency, progress)
    finally:
        if paused:
            gc.enable()


def _pair_index(words: list[list[int]], counts: list[int]):
    """(stats, where) of the words: every adjacent pair's count over all words (weighted by
    count), and the words holding it (ascending, each once). In numpy: the same loop in Python
    took 0.28 s of the default corpus' byte-level learning, this 0.08 s (and 0.05 s to import
    numpy, which build_vocab.py does not otherwise load)."""
    import numpy as np

    lengths = np.fromiter(map(len, words), np.int64, len(words))
    flat = np.fromiter(itertools.chain.from_iterable(words), np.int64, int(lengths.sum()))
    word_of = np.repeat(np.arange(len(words), dtype=np.int64), lengths)
    inside = word_of[:-1] == word_of[1:]  # pairs within a word, not across two
    pairs = ((flat[:-1] << _SHIFT) | flat[1:])[inside]  # ids below 2**31: fits int64
    holders = word_of[:-1][inside]
    if not len(pairs):
        return {}, defaultdict(list)
    order = np.argsort(pairs, kind="stable")  # by pair, then by word (stable)
    pairs, holders = pairs[order], holders[order]
    new_pair = np.concatenate(([True], pairs[1:] != pairs[:-1]))
    starts = np.flatnonzero(new_pair)
    names = pairs[starts].tolist()
    totals = np.add.reduceat(np.asarray(counts, np.int64)[holders], starts).tolist()
    stats = dict(zip(names, totals))
    listed = new_pair | np.concatenate(([True], holders[1:] != holders[:-1]))
    holders = holders[listed].tolist()
    bounds = [*np.flatnonzero(new_pair[listed]).tolist(), len(holders)]
    where = defaultdict(list)
    for k, pair in enumerate(names):
        where[pair] = holders[bounds[k] : bounds[k + 1]]
    return stats, where


def _learn(word_counts, num_merges, min_frequency, progress) -> list[tuple[str, str]]:
    names: list[str] = list(dict.fromkeys(itertools.chain.from_iterable(word_counts)))
    ids = {symbol: i for i, symbol in enumerate(names)}
    keys = [_reversed_order_key(symbol) for symbol in names]

    def symbol_id(symbol: str) -> int:
        i = ids.get(symbol)
        if i is None:
            i = ids[symbol] = len(names)
            names.append(symbol)
            keys.append(_reversed_order_key(symbol))
        return i

    words = [list(map(ids.__getitem__, w)) for w in word_counts]
    counts = list(word_counts.values())
    mask = (1 << _SHIFT) - 1
    # where[pair]: the words that hold it (and some that did: see below), a word listed again
    # each time it gains the pair; a list, as appending costs less than a set's hashing.
    stats, where = _pair_index(words, counts)

    def entry(p: int, n: int):
        return (-n, keys[p >> _SHIFT], keys[p & mask], p)

    # Every pair counted at least min_frequency times has an entry whose count is at least its
    # own: a pair's entry is pushed when its count rises to min_frequency or more, and one that
    # fell is pushed again only when its stale entry is popped. The first popped entry that
    # holds its pair's count is the largest pair (a pair below min_frequency is never merged).
    heap = [entry(p, n) for p, n in stats.items() if n >= min_frequency]
    heapq.heapify(heap)

    # The one-occurrence words' pairs change in stats here, the others' through `delta` below.
    def gain(p: int, listed: list[int]) -> int:
        c = sum(map(counts.__getitem__, listed))
        n = stats[p] = stats.get(p, 0) + c
        if n >= min_frequency:
            heapq.heappush(heap, entry(p, n))
        where[p] += listed
        return c

    def lost(p: int, c: int) -> None:
        n = stats[p] - c
        if n > 0:
            stats[p] = n
        else:
            del stats[p]
            where.pop(p, None)

    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges and heap:
        neg, _, _, pair = heapq.heappop(heap)
        now = stats.get(pair, 0)
        if now != -neg:  # a stale entry: the count changed since it was pushed
            if now >= min_frequency:
                heapq.heappush(heap, entry(pair, now))
            continue
        first, second = pair >> _SHIFT, pair & mask
        merges.append((names[first], names[second]))
        merged = symbol_id(names[first] + names[second])
        delta: defaultdict[int, int] = defaultdict(int)
        # The words with one occurrence (two thirds of the visits) are listed under the symbol
        # left and right of it; their pairs' counts and listings are changed once per symbol
        # after the loop, not once per word.
        lefts: defaultdict[int, list[int]] = defaultdict(list)
        rights: defaultdict[int, list[int]] = defaultdict(list)
        for i in where.pop(pair, ()):
            old = words[i]
            starts = old.count(first)
            if not starts:  # listed lazily: the word lost this pair to an earlier merge
                continue
            if starts == 1:
                k = old.index(first)
                n = len(old)
                if k + 1 == n or old[k + 1] != second:
                    continue
                if k:
                    lefts[old[k - 1]].append(i)
                if k + 2 < n:
                    rights[old[k + 2]].append(i)
                old[k : k + 2] = (merged,)  # edited in place
                continue
            c = counts[i]
            # Non-overlapping occurrences, left to right (subword-nmt's rule), found by
            # list.index (in C) from one `first` to the next. Only the pairs beside an occurrence
            # change: each takes away the old pair on its left (unless the previous occurrence's
            # right one was it) and on its right, and the new word gains a pair on each side of
            # every merged symbol.
            new, j, at, n, after_merge = [], 0, 0, len(old), False
            for _ in range(starts):
                k = old.index(first, at)
                at = k + 1
                if k < j:  # the second half of the previous occurrence (first == second)
                    continue
                if k + 1 == n or old[k + 1] != second:
                    continue
                if k > j:  # an unmerged stretch old[j:k] since the last occurrence
                    if after_merge:
                        p = merged << _SHIFT | old[j]
                        delta[p] += c
                        where[p].append(i)
                        after_merge = False
                    new += old[j:k]
                if new:
                    if not after_merge:
                        delta[old[k - 1] << _SHIFT | first] -= c
                    p = new[-1] << _SHIFT | merged
                    delta[p] += c
                    where[p].append(i)
                if k + 2 < n:
                    delta[second << _SHIFT | old[k + 2]] -= c
                new.append(merged)
                j = k + 2
                after_merge = True
            if j < n:
                if after_merge:
                    p = merged << _SHIFT | old[j]
                    delta[p] += c
                    where[p].append(i)
                new += old[j:]
            if len(new) < n:  # else it lost this pair to an earlier merge but kept `first`
                words[i] = new
        for x, listed in lefts.items():
            lost(x << _SHIFT | first, gain(x << _SHIFT | merged, listed))
        for x, listed in rights.items():
            lost(second << _SHIFT | x, gain(merged << _SHIFT | x, listed))
        for p, d in delta.items():
            if not d or p == pair:
                continue
            n = stats.get(p, 0) + d
            if n > 0:
                stats[p] = n
                if d > 0 and n >= min_frequency:
                    heapq.heappush(heap, entry(p, n))
            else:
                stats.pop(p, None)
                where.pop(p, None)
        stats.pop(pair, None)
        if progress and len(merges) % 100 == 0:
            progress(len(merges), num_merges)
    return merges


def count_whitespace_words(texts: Iterable[str]) -> Counter:
    """The whitespace-separated words of texts with their counts (character-level BPE's input)."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(text.split())
    return counts


def character_words(words: Iterable[str] | Counter) -> dict[tuple[str, ...], int]:
    """Counts whitespace words (or takes a Counter of them) as character tuples with END_OF_WORD
    glued to the last character (subword-nmt format 0.2: "low" -> ("l", "o", "w</w>"))."""
    counts = Counter(words)  # a Counter given is copied with its counts
    return {(*w[:-1], w[-1] + END_OF_WORD): n for w, n in counts.items() if w}


def count_pretokens(texts: Iterable[str]) -> Counter:
    """GPT-2's pre-tokens of texts (as text, not yet byte characters) with their counts; ASCII
    texts split by GPT2_ASCII_PATTERN, the same pre-tokens in about half the time. The texts go
    through the patterns and into the Counter in C (map, chain), no Python loop over them: 1.1x
    a loop's speed on the default corpus."""
    texts = list(texts)
    ascii_texts = list(map(str.isascii, texts))
    counts: Counter = Counter()
    for pattern, which in (
        (GPT2_ASCII_PATTERN, ascii_texts),
        (GPT2_PATTERN, map(operator.not_, ascii_texts)),
    ):
        selected = itertools.compress(texts, which)
        counts.update(itertools.chain.from_iterable(map(pattern.findall, selected)))
    return counts


def pretoken_words(counts: Counter) -> dict[tuple[str, ...], int]:
    """count_pretokens' counts as tuples of byte characters (each distinct pre-token converted
    once, not each occurrence; the bytes mapped in C, 1.5x byte_chars then tuple)."""
    char = _BYTE_CHARS.__getitem__
    return {tuple(map(char, token.encode("utf-8"))): n for token, n in counts.items()}


def byte_words(texts: Iterable[str]) -> dict[tuple[str, ...], int]:
    """Counts GPT-2 pre-tokens of texts as tuples of byte characters."""
    return pretoken_words(count_pretokens(texts))


# ---------------------------------------------------------------------------------------------
# Applying merges
# ---------------------------------------------------------------------------------------------


_NO_RANK = 1 << 62  # a score above every merge's: min() over plain ints stays in C


class MergeTable:
    """A merge list for applying it: every symbol an int id, every merge one dict entry.

    `apply` merges a word as GPT-2's `bpe()` does: repeatedly the adjacent pair with the lowest
    merge rank (all its non-overlapping occurrences, left to right) until none is known. GPT-2's
    loop re-ranks every pair of the word after each merge; this keeps the pairs' scores in a list
    and re-scores only the two pairs beside each merged symbol (same result, tested against a
    transcription of GPT-2's loop). Distinct pairs have distinct ranks (a repeated pair keeps its
    last rank, as GPT-2's dict does), so a score found again is the same pair, and the pairs
    beside a merged symbol (which is longer than either part) are never the pair just merged.

    On ids rather than strings because a word's first sight in byte-level encoding is mostly
    this loop, and it ran 1.4-1.7x faster on ints on the default corpus' 61,539 distinct GPT-2
    pre-tokens (tuples of strings are built and hashed per lookup): the pair (a, b) is the key
    a * width + b, and its entry rank * width + id(a + b) is both what min() ranks by and what the
    merge makes. width exceeds every id + 1, so a pair with an unknown symbol (id -1, never
    merged) matches no entry.

    Args:
      merges: (left, right) pairs, best first.
      symbol_ids: ids to keep for symbols (a vocabulary: token -> id); the merges' other
        symbols get ids above them.
    """

    def __init__(self, merges: Sequence[tuple[str, str]], symbol_ids: dict[str, int] | None = None):
        ids = dict(symbol_ids or {})
        self.num_kept = next_id = max(ids.values(), default=-1) + 1  # below: from symbol_ids
        for a, b in merges:
            for symbol in (a, b, a + b):
                if symbol not in ids:
                    ids[symbol] = next_id
                    next_id += 1
        self.ids = ids
        self.symbols = {i: s for s, i in ids.items()}
        self.width = width = 1 << (max(ids.values(), default=0) + 1).bit_length()
        self.table = {
            ids[a] * width + ids[b]: r * width + ids[a + b] for r, (a, b) in enumerate(merges)
        }

    def apply(self, word: list[int]) -> list[int]:
        """Merges the symbol ids of one word (in place; returns it)."""
        get, width = self.table.get, self.width
        scores = [get(a * width + b, _NO_RANK) for a, b in zip(word, word[1:])]
        while scores:
            best = min(scores)
            if best == _NO_RANK:
                break
            merged = best % width
            i = scores.index(best)  # the leftmost occurrence; none is left of it after each merge
            while True:
                word[i : i + 2] = [merged]
                del scores[i]
                if i:
                    scores[i - 1] = get(word[i - 1] * width + merged, _NO_RANK)
                if i < len(scores):
                    # Overwrites the pair that overlapped the merged one (occurrences never do).
                    scores[i] = get(merged * width + word[i + 1], _NO_RANK)
                if best not in scores:
                    break
                i = scores.index(best)
        return word

    def apply_symbols(self, symbols: Sequence[str]) -> list[str]:
        """`apply` on strings: symbols no merge names stay as they are."""
        ids = self.ids
        word = self.apply([ids.get(s, -1) for s in symbols])
        unknown = iter([s for s in symbols if s not in ids])  # never merged: still in order
        return [self.symbols[i] if i >= 0 else next(unknown) for i in word]


# Most entries each per-word cache below keeps: text is Zipfian, so the first words seen answer
# most lookups, and words past the bound are segmented anew each time (the same units).
CACHE_ENTRIES = 1_000_000


class CharacterBPE:
    """Sennrich's character-level BPE: splits whitespace words into subword units."""

    def __init__(self, merges: Sequence[tuple[str, str]]):
        self.merges = list(merges)
        self.table = MergeTable(self.merges)
        self._cache: dict[str, list[str]] = {}

    def segment_word(self, word: str) -> list[str]:
        """One word -> units; the last carries END_OF_WORD ("lowest" -> ["low", "est</w>"])."""
        units = self._cache.get(word)
        if units is None:
            units = self.table.apply_symbols((*word[:-1], word[-1] + END_OF_WORD))
            if len(self._cache) < CACHE_ENTRIES:  # bounded: a large corpus cannot eat memory
                self._cache[word] = units
        return units

    def segment(self, text: str) -> list[str]:
        return [u for w in text.split() for u in self.segment_word(w)]


class ByteLevelBPE:
    """GPT-2's byte-level BPE tokenizer over an `encoder.json` vocabulary and merges.

    encode(text) -> ids and decode(ids) -> text; decode(encode(t)) == t for every string.
    Special tokens (e.g. "<|endoftext|>") are vocabulary entries that encode() never produces
    from text, as in GPT-2.
    """

    def __init__(self, encoder: dict[str, int], merges: Sequence[tuple[str, str]]):
        self.encoder = dict(encoder)
        self.decoder = {i: t for t, i in self.encoder.items()}
        self.merges = list(merges)
        self._cache: dict[str, list[int]] = {}
        missing = [c for c in BYTE_TO_CHAR.values() if c not in self.encoder]
        if missing:
            raise ValueError(f"the vocabulary lacks {len(missing)} of the 256 byte symbols")
        self.table = MergeTable(self.merges, self.encoder)
        self._byte_ids = [self.encoder[BYTE_TO_CHAR[b]] for b in range(256)]

    def __reduce__(self):
        # Pickled (to spawned workers: data_prep/parallel.py) as its vocabulary and merges alone;
        # the merge table, the decoder and the word cache are rebuilt, not sent.
        return ByteLevelBPE, (self.encoder, self.merges)

    @classmethod
    def from_files(cls, encoder_file, merges_file) -> ByteLevelBPE:
        """Reads GPT-2's `encoder.json` and `vocab.bpe`; errors name the file and line."""
        encoder = read_encoder(encoder_file)
        merges = read_merges(merges_file)
        try:
            return cls(encoder, merges)
        except ValueError as e:
            where, expected = str(encoder_file), "every byte symbol in the vocabulary"
            found = str(e)
            if any(token.endswith("</w>") for token in encoder):
                found += ": a word-end BPE ('</w>' tokens, GPT-1's OpenAIGPTTokenizer's), not bytes"
            raise input_error(where, expected, found) from None

    def _encode_pretoken(self, piece: str) -> list[int]:
        # Cached by the raw pre-token: a repeated word skips the byte mapping and the merges.
        ids = self._cache.get(piece)
        if ids is None:
            ids = self.table.apply(list(map(self._byte_ids.__getitem__, piece.encode("utf-8"))))
            if ids and max(ids) >= self.table.num_kept:  # a token the vocabulary lacks
                token = self.table.symbols[max(ids)]
                raise ValueError(f"the merges make {token!r}, which the vocabulary lacks")
            if len(self._cache) < CACHE_ENTRIES:  # bounded: a pathological input cannot eat memory
                self._cache[piece] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        cache, out = self._cache, []
        pattern = GPT2_ASCII_PATTERN if text.isascii() else GPT2_PATTERN
        for piece in pattern.findall(text):
            ids = cache.get(piece)
            out.extend(ids if ids is not None else self._encode_pretoken(piece))
        return out

    def tokens(self, text: str) -> list[str]:
        return [self.decoder[i] for i in self.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(CHAR_TO_BYTE[c] for i in ids for c in self.decoder[i])
        return data.decode("utf-8", errors="replace")

    def save(self, directory) -> tuple[str, str]:
        """Writes encoder.json and vocab.bpe (GPT-2's files) into `directory`; returns paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        enc, mer = directory / "encoder.json", directory / "vocab.bpe"
        _write_text(enc, json.dumps(self.encoder, ensure_ascii=False))
        write_merges(self.merges, mer)
        return str(enc), str(mer)


class WordEndBPE:
    """GPT-1's tokenizer as Hugging Face's OpenAIGPTTokenizer encodes (transformers 5's; 4's
    without ftfy and spaCy): BERT's BasicTokenizer (lower-cased, accents stripped, punctuation
    split off), then Sennrich's BPE with "</w>" ending each word (CharacterBPE), over its
    vocab.json and merges.txt. A unit the vocabulary lacks is `<unk>`'s id. The released GPT-1
    split words with spaCy after ftfy's text repair (transformers 4 did when both were
    installed), which differs on text spaCy splits otherwise (contractions, some punctuation).

    The interface is ByteLevelBPE's that create_lm_data, GPT fine-tuning and run_generation use:
    encode, decode, tokens, encoder."""

    UNK = "<unk>"

    def __init__(self, encoder: dict[str, int], merges: Sequence[tuple[str, str]]):
        self.encoder = dict(encoder)
        self.decoder = {i: t for t, i in self.encoder.items()}
        self.merges = list(merges)
        self.bpe = CharacterBPE(self.merges)
        self.words = BasicTokenizer(do_lower_case=True)
        self.unk_id = self.encoder.get(self.UNK)

    def __reduce__(self):  # to worker processes as its vocabulary and merges
        return WordEndBPE, (self.encoder, self.merges)

    def _id(self, unit: str) -> int:
        i = self.encoder.get(unit, self.unk_id)
        if i is None:
            raise ValueError(f"the vocabulary has neither {unit!r} nor {self.UNK!r}")
        return i

    def tokens(self, text: str) -> list[str]:
        return [u for w in self.words.tokenize(text) for u in self.bpe.segment_word(w)]

    def encode(self, text: str) -> list[int]:
        return [self._id(u) for u in self.tokens(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """As OpenAIGPTTokenizer: the units joined, each "</w>" a space."""
        return "".join(self.decoder[int(i)] for i in ids).replace(END_OF_WORD, " ").strip()


def read_encoder(path) -> dict[str, int]:
    """A BPE vocabulary file (JSON token -> id); errors name the file."""
    try:
        encoder = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise input_error(str(path), "a JSON object token -> id", str(e)) from None
    if not isinstance(encoder, dict) or not all(isinstance(v, int) for v in encoder.values()):
        raise input_error(str(path), "a JSON object token -> id", "another JSON value")
    return encoder


def load_gpt_bpe(encoder_file, merges_file):
    """A GPT's BPE from its two files: GPT-1's word-end BPE (WordEndBPE) when the vocabulary's
    units end words with "</w>", else GPT-2's byte-level BPE (ByteLevelBPE.from_files)."""
    encoder = read_encoder(encoder_file)
    if any(token.endswith(END_OF_WORD) for token in encoder):
        return WordEndBPE(encoder, read_merges(merges_file))
    return ByteLevelBPE.from_files(encoder_file, merges_file)


# A byte-level BPE folder's two files under GPT-2's release names and under Hugging Face's
# (RoBERTa, BART and GPT-2 on the hub): the same formats (token -> id JSON, merges text).
BPE_FILE_NAMES = (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt"))


def folder_files(path) -> tuple[Path, Path] | None:
    """(vocabulary, merges) of a byte-level BPE folder under either naming (BPE_FILE_NAMES), or
    None when `path` is not a folder holding one of the two pairs."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    for vocab, merges in BPE_FILE_NAMES:
        if (folder / vocab).is_file() and (folder / merges).is_file():
            return folder / vocab, folder / merges
    return None


# RoBERTa's special tokens as its Hugging Face vocab.json holds them (fairseq's dictionary:
# <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> last).
ROBERTA_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


class RobertaTokenizer:
    """RoBERTa's tokenizer (Liu et al. 2019, sec. 4.4): GPT-2's byte-level BPE over RoBERTa's own
    ids, read from a Hugging Face `vocab.json` + `merges.txt` folder (or encoder.json + vocab.bpe
    holding the same special tokens), for glue.encode_examples with glue.ROBERTA_PACKING.

    tokenize(text) -> byte-level tokens (a leading space is part of the word after it, and the
    first word of each text has none, as Hugging Face's RobertaTokenizer without
    add_prefix_space); convert_tokens_to_ids; vocab (token -> id). Cased, as RoBERTa:
    do_lower_case lower-cases the text first, for a vocabulary learned on lower-cased text.
    """

    def __init__(self, tokenizer: ByteLevelBPE, do_lower_case: bool = False):
        self.bpe = tokenizer
        self.vocab = tokenizer.encoder
        self.do_lower_case = do_lower_case

    @classmethod
    def from_folder(cls, folder, do_lower_case: bool = False) -> RobertaTokenizer:
        """Errors name the folder or file and the special tokens a RoBERTa vocabulary lacks."""
        files = folder_files(folder)
        if files is None:
            names = " or ".join(" + ".join(pair) for pair in BPE_FILE_NAMES)
            raise input_error(str(folder), f"a byte-level BPE folder with {names}", "no such files")
        tokenizer = ByteLevelBPE.from_files(*files)
        missing = [t for t in ROBERTA_SPECIAL_TOKENS if t not in tokenizer.encoder]
        if missing:
            raise input_error(
                str(files[0]),
                f"RoBERTa's special tokens {list(ROBERTA_SPECIAL_TOKENS)}",
                f"a vocabulary without {missing} (GPT-2's own has none: a RoBERTa checkpoint's "
                "vocab.json holds them)",
            )
        return cls(tokenizer, do_lower_case)

    def tokenize(self, text: str) -> list[str]:
        return self.bpe.tokens(text.lower() if self.do_lower_case else text)

    def tokenize_word(self, word: str) -> list[str]:
        """The tokens of one word of pre-split text (conll.encode_sentences), with a leading
        space as a word inside text has: Hugging Face's RobertaTokenizer with add_prefix_space,
        which words given as is_split_into_words need (every word, the first too)."""
        return self.tokenize(" " + word)

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.bpe.decoder[int(i)] for i in ids]

    def detokenize(self, tokens: Sequence[str]) -> str:
        """The text of byte-level tokens (a span's, run_squad's answers), one space between
        words: ["ĠNew", "ĠYork"] -> "New York"."""
        text = bytes(CHAR_TO_BYTE[c] for t in tokens for c in t).decode("utf-8", "replace")
        return " ".join(text.split())


def byte_level_vocab(
    merges: Sequence[tuple[str, str]], special_tokens: Sequence[str] = (GPT2_END_OF_TEXT,)
) -> dict[str, int]:
    """GPT-2's id layout: the 256 byte symbols (GPT-2's order: printable bytes first, as
    bytes_to_unicode lists them by value), then one id per merge, then special tokens."""
    order = sorted(BYTE_TO_CHAR.values(), key=lambda c: (ord(c) >= 256, ord(c)))
    vocab = {c: i for i, c in enumerate(order)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for t in special_tokens:
        vocab.setdefault(t, len(vocab))
    return vocab


def word_end_vocab(
    words: dict[tuple[str, ...], int],
    merges: Sequence[tuple[str, str]],
    special_tokens: Sequence[str] = (GPT2_END_OF_TEXT,),
) -> dict[str, int]:
    """GPT-1's layout for a word-end BPE learned from `words` (character_words'): every symbol
    the words start from (characters, and characters with "</w>"), sorted, then one id per
    merge, then WordEndBPE.UNK and the special tokens (text never encodes to them; the
    end-of-text one separates documents in create_lm_data's blocks, as GPT-2's)."""
    vocab = {c: i for i, c in enumerate(sorted({c for word in words for c in word}))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for t in (WordEndBPE.UNK, *special_tokens):
        vocab.setdefault(t, len(vocab))
    return vocab


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_merges(merges: Sequence[tuple[str, str]], path) -> None:
    """The merges file both subword-nmt and GPT-2 use: "#version: 0.2" then "a b" per line."""
    _write_text(Path(path), "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def read_merges(path) -> list[tuple[str, str]]:
    """Reads a merges file; a line that is not two space-separated symbols is an error naming
    the file and line."""
    merges = []
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise input_error(str(path), "a UTF-8 merges file", str(e)) from None
    for n, line in enumerate(lines, 1):
        if not line or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise input_error(f"{path}:{n}", "two symbols separated by one space", repr(line))
        merges.append((parts[0], parts[1]))
    return merges
