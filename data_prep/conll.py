"""CoNLL-style token tagging data: column-file readers, tag schemes, WordPiece alignment, windows.

Files (one token a line, a blank line between sentences, `-DOCSTART-` lines between documents):
  CoNLL-2003   `token POS chunk NER` (space-separated; some copies use tabs)
  two columns  `token TAG` (tab- or space-separated, e.g. WNUT-16)
  one column   `token`, unlabelled (prediction only)
The token is the first column and the tag the last; every token line of a file must have as many
columns as its first one. A line holding a tab is split on tabs (tweets' tokens may hold other
whitespace), any other on runs of spaces.

Tag schemes (Ramshaw & Marcus 1995; Tjong Kim Sang & Veenstra 1999):
  iob1   I-X inside and at the start of an entity; B-X only to start an entity right after another
         X entity (the original CoNLL-2003 files).
  bio    (IOB2) B-X starts every entity, I-X continues it.
  iobes  B-X begins, I-X continues, E-X ends a multi-token entity; S-X is a one-token entity.
Every scheme is read into entities with conlleval's rules (`chunks`), and written back in the
scheme the model learns (`encode`): BIO for iob1 and bio input, IOBES for iobes input. For iob1
that is the usual IOB1 -> BIO conversion; for bio and iobes a tag that breaks the scheme (I-X after
O, an unfinished IOBES entity) is a violation, repaired (re-encoded as conlleval reads it, which
leaves every entity score unchanged) and counted, or rejected with the file and line.

Alignment (Devlin et al. 2019, sec. 5.3): each word is split into WordPieces; the first piece
carries the word's label and is where its tag is predicted, the other pieces get weight 0 in the
loss and are skipped in decoding. A sentence longer than max_seq_length - 2 pieces is split at
word boundaries into overlapping windows; each word is predicted by the window in which it has
the most context on both sides (as the original run_squad's `_check_is_max_context`), so
reassembly gives exactly one tag per word and nothing is cut.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data_prep import glue
from data_prep.errors import InputError, input_error
from data_prep.tokenization import read_utf8_lines

logger = logging.getLogger(__name__)

SCHEMES = ("iob1", "bio", "iobes")
DOCSTART = "-DOCSTART-"
OUTSIDE = "O"
# How many problem lines a counted warning lists by file and line.
SHOWN = 5
_PREFIXES = {"iob1": "BI", "bio": "BI", "iobes": "BIES"}
_SPACES = re.compile(r" +")

# ---------------------------------------------------------------------------------------------
# Reading column files
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence of a column file.

    words: the tokens (first column). tags: the tags (last column) as read, or None when the file
    has one column. source: the file; lines: the line number of each word, for messages.
    """

    words: tuple[str, ...]
    tags: tuple[str, ...] | None
    source: str
    lines: tuple[int, ...]

    @property
    def where(self) -> str:
        return f"{self.source}:{self.lines[0]}"

    def at(self, i: int) -> str:
        """`path:line` of word i."""
        return f"{self.source}:{self.lines[i]}"


@dataclasses.dataclass
class ConllFile:
    """What one file held: sentences, the column count, documents and the lines skipped."""

    path: str
    sentences: list[Sentence]
    columns: int
    documents: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)


def split_columns(text: str) -> list[str]:
    """The columns of one token line: on tabs if it holds one, else on runs of spaces."""
    if "\t" in text:
        return text.strip(" \t").split("\t")
    return _SPACES.split(text.strip(" "))


def read_conll(path: str | os.PathLike, skip_bad_lines: bool = False) -> ConllFile:
    """Reads a column file (see the module docstring) into sentences.

    Args:
      path: the file.
      skip_bad_lines: drop (and count) a sentence holding a line with the wrong number of
        columns or an empty column, instead of raising.
    Raises InputError naming the file and line: a wrong column count (`expected 4 columns as
    line 3, found 2`), an empty column, non-UTF-8 bytes; naming the file when it holds no
    sentence.
    """
    path = str(path)
    sentences: list[Sentence] = []
    skipped: list[str] = []
    columns = 0
    first_line = 0
    documents = 0
    words: list[str] = []
    tags: list[str] = []
    lines: list[int] = []
    bad: str | None = None

    def flush():
        nonlocal bad
        if bad is not None:
            skipped.append(bad)
        elif words:
            labelled = tuple(tags) if columns > 1 else None
            sentences.append(Sentence(tuple(words), labelled, path, tuple(lines)))
        words.clear()
        tags.clear()
        lines.clear()
        bad = None

    for number, text in read_utf8_lines(path):
        if not text.strip():
            flush()
            continue
        fields = split_columns(text)
        if fields[0] == DOCSTART:
            flush()
            documents += 1
            continue
        problem = None
        if not columns:
            columns, first_line = len(fields), number
        if len(fields) != columns:
            problem = (
                f"{columns} column{'s' if columns > 1 else ''} as line {first_line}",
                f"{len(fields)}: {_short(text)}",
            )
        elif any(not f for f in fields):
            problem = ("no empty column", f"an empty one: {_short(text)}")
        if problem is not None:
            where = f"{path}:{number}"
            if not skip_bad_lines:
                raise InputError(
                    f"{where}: expected {problem[0]}, found {problem[1]} "
                    "(or pass --skip_bad_lines to skip and count such sentences)"
                )
            if bad is None:
                bad = f"{where}: expected {problem[0]}, found {problem[1]}"
            continue
        words.append(fields[0])
        tags.append(fields[-1])
        lines.append(number)
    flush()
    if not sentences:
        raise input_error(
            path,
            "sentences of `token ... tag` lines separated by blank lines",
            f"none ({len(skipped)} skipped)" if skipped else "none",
        )
    if skipped:
        logger.warning(
            "%s: skipped %d of %d sentences with a bad line (first %s)",
            path,
            len(skipped),
            len(skipped) + len(sentences),
            "; ".join(skipped[:SHOWN]),
        )
    return ConllFile(path, sentences, columns, documents, skipped)


def _short(text: str, width: int = 60) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def write_conll(path: str | os.PathLike, sentences: Sequence[Sentence] | Sequence) -> None:
    """Writes `token<TAB>tag` lines, a blank line after each sentence, atomically.

    sentences: Sentence objects with tags, or (words, tags) pairs.
    """
    rows = [(s.words, s.tags) if isinstance(s, Sentence) else s for s in sentences]
    lines = []
    for words, tags in rows:
        lines += [f"{w}\t{t}" for w, t in zip(words, tags, strict=True)] + [""]
    write_lines(path, lines)


def write_lines(path: str | os.PathLike, lines: Sequence[str]) -> None:
    """Writes text lines (each ends with a newline), atomically: a temp file, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(line + "\n" for line in lines)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Tag schemes
# ---------------------------------------------------------------------------------------------


def split_tag(tag: str) -> tuple[str, str]:
    """Prefix and type: "B-geo-loc" -> ("B", "geo-loc") (split at the first hyphen, as
    conlleval does); "O" -> ("O", "")."""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def check_tag(tag: str, scheme: str) -> bool:
    """Whether `tag` is O or <prefix>-<type> with a prefix the scheme uses."""
    if tag == OUTSIDE:
        return True
    prefix, kind = split_tag(tag)
    return len(prefix) == 1 and prefix in _PREFIXES[scheme] and bool(kind)


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities in one sentence's tags as conlleval reads them: [(type, start, end)], end
    inclusive, in order.

    An entity starts at a non-O tag that is B- or S-, follows O or the sentence start, follows an
    E- or S- tag, or changes the type; it ends before the next start or O, or at an E- or S- tag.
    So I-X after O starts an entity (IOB1, and conlleval's lenient reading of broken BIO) and
    IOB1 and BIO tags of the same entities give the same chunks. conlleval.pl (2004) itself knows
    no S- tag; the E-/S- rules are those of its IOBES-aware ports (seqeval's default mode).
    Raises ValueError for a tag that is neither O nor <B|I|E|S>-<type>.
    """
    out: list[tuple[str, int, int]] = []
    prev_prefix, prev_kind = OUTSIDE, ""
    start = -1
    for i, tag in enumerate(tags):
        prefix, kind = (OUTSIDE, "") if tag == OUTSIDE else split_tag(tag)
        if prefix != OUTSIDE and (prefix not in "BIES" or len(prefix) != 1 or not kind):
            raise ValueError(f"tag {tag!r} at position {i}: expected O or B-/I-/E-/S-<type>")
        begins = prefix != OUTSIDE and (
            prefix in "BS" or prev_prefix in (OUTSIDE, "E", "S") or kind != prev_kind
        )
        if start >= 0 and (prefix == OUTSIDE or begins):
            out.append((prev_kind, start, i - 1))
            start = -1
        if begins:
            start = i
        if start >= 0 and prefix in "ES":
            out.append((kind, start, i))
            start = -1
            prefix = "E"  # the entity is closed: what follows starts a new one
        prev_prefix, prev_kind = prefix, kind
    if start >= 0:
        out.append((prev_kind, start, len(tags) - 1))
    return out


def encode(spans: Sequence[tuple[str, int, int]], length: int, scheme: str) -> list[str]:
    """Tags of `length` tokens holding the given entities, in `scheme` ("bio" or "iobes";
    "iob1" writes B- only where an entity follows one of the same type)."""
    tags = [OUTSIDE] * length
    last_end, last_kind = -2, ""
    for kind, start, end in spans:
        if scheme == "iobes":
            if start == end:
                tags[start] = f"S-{kind}"
            else:
                tags[start] = f"B-{kind}"
                tags[start + 1 : end] = [f"I-{kind}"] * (end - start - 1)
                tags[end] = f"E-{kind}"
        else:
            adjacent = start == last_end + 1 and kind == last_kind
            first = "B" if scheme == "bio" or adjacent else "I"
            tags[start] = f"{first}-{kind}"
            tags[start + 1 : end + 1] = [f"I-{kind}"] * (end - start)
        last_end, last_kind = end, kind
    return tags


def model_scheme(scheme: str) -> str:
    """The scheme the model learns and predicts for input in `scheme`: iobes stays, else bio."""
    return "iobes" if scheme == "iobes" else "bio"


def detect_scheme(sentences: Sequence[Sentence]) -> str:
    """Guesses the scheme of labelled sentences.

    iobes when any tag has an E- or S- prefix; iob1 when some entity starts with I- and every
    B- tag directly follows a tag of its own type (the only place IOB1 puts one); else bio.
    """
    starts_with_i = False
    b_elsewhere = False
    for s in sentences:
        prev = OUTSIDE
        for tag in s.tags or ():
            prefix, kind = split_tag(tag)
            if prefix in ("E", "S"):
                return "iobes"
            prev_kind = split_tag(prev)[1] if prev != OUTSIDE else ""
            if prefix == "I" and (prev == OUTSIDE or prev_kind != kind):
                starts_with_i = True
            if prefix == "B" and (prev == OUTSIDE or prev_kind != kind):
                b_elsewhere = True
            prev = tag
    return "iob1" if starts_with_i and not b_elsewhere else "bio"


@dataclasses.dataclass
class Normalized:
    """Sentences with tags in the model's scheme, and what had to change.

    violations: `path:line: tag` of every tag that broke a strict bio / iobes scheme (each was
    repaired). converted: how many iob1 tags the IOB1 -> BIO conversion changed (not violations).
    """

    sentences: list[Sentence]
    violations: list[str]
    converted: int = 0


def normalize_tags(sentences: Sequence[Sentence], scheme: str, repair: bool = True) -> Normalized:
    """Checks the tags' format against `scheme` and rewrites them in model_scheme(scheme).

    Args:
      sentences: labelled sentences.
      scheme: "iob1", "bio" or "iobes" (what the file holds).
      repair: re-encode a tag that breaks the scheme (counted in `violations`); False: raise.
    Raises InputError naming the file and line of a tag that is not O or a prefix of the scheme
    plus a type (always), or of the first violation (repair False).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"tag scheme: expected one of {SCHEMES}, found {scheme!r}")
    target = model_scheme(scheme)
    out, violations, converted = [], [], 0
    prefixes = "/".join(f"{p}-" for p in _PREFIXES[scheme])
    for s in sentences:
        if s.tags is None:
            raise input_error(s.where, "a tag column (labelled data)", "one column only")
        for i, tag in enumerate(s.tags):
            if not check_tag(tag, scheme):
                raise input_error(
                    s.at(i), f"a tag O or {prefixes}<type> (tag scheme {scheme})", repr(tag)
                )
        new = encode(chunks(s.tags), len(s.tags), target)
        for i, (old, fixed) in enumerate(zip(s.tags, new)):
            if old == fixed:
                continue
            if scheme == "iob1":
                converted += 1
                continue
            before = repr(s.tags[i - 1]) if i else "the sentence start"
            if not repair:
                raise InputError(
                    f"{s.at(i)}: expected tags valid in strict {scheme}, found {old!r} after "
                    f"{before} (conlleval reads it as {fixed!r}; pass --invalid_tags=repair to "
                    "do the same and count such tags)"
                )
            violations.append(f"{s.at(i)}: {old!r} after {before}, read as {fixed!r}")
        out.append(dataclasses.replace(s, tags=tuple(new)))
    return Normalized(out, violations, converted)


def label_list(sentences: Sequence[Sentence], scheme: str) -> list[str]:
    """The labels for sentences tagged in model scheme `scheme` ("bio" or "iobes"): O, then for
    every entity type found (sorted) each prefix of the scheme, B-X I-X (E-X S-X), whether or not
    the data used it: with only one-word ORG entities in training, a multi-word ORG must still
    be predictable."""
    kinds = sorted({split_tag(t)[1] for s in sentences for t in s.tags or ()} - {""})
    prefixes = "BIES" if scheme == "iobes" else "BI"
    return [OUTSIDE, *(f"{p}-{k}" for k in kinds for p in prefixes)]


# ---------------------------------------------------------------------------------------------
# WordPiece alignment and windows
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Encoded:
    """Windows of sentences as padded model inputs (W windows, S positions).

    features: input_ids, input_mask, segment_ids, label_ids int32 (W, S); label_weights float32
      (W, S): 1.0 at the first piece of every word this window predicts and whose label is known.
    word_index: int32 (W, S), the word (within its sentence) predicted at each position, -1
      elsewhere; sentence_index: int32 (W,), the sentence of each window.
    lengths: words per sentence. split: where of the sentences cut into several windows.
    cut_words: `path:line` of words whose pieces alone exceeded a window (their trailing pieces,
      never the labelled first one, were dropped). unknown: `path:line: tag` of labels outside
      the label list (weight 0, still scored as gold). empty_words: words with no WordPiece
      (control or zero-width characters), given [UNK] so that they still get a tag.
    """

    features: dict
    word_index: np.ndarray
    sentence_index: np.ndarray
    lengths: list[int]
    split: list[str]
    cut_words: list[str]
    unknown: list[str]
    empty_words: list[str]

    @property
    def num_windows(self) -> int:
        return len(self.sentence_index)


def with_token_id_replaced(encoded: Encoded, old_id: int, new_id: int) -> Encoded:
    """`encoded` with every `old_id` in its input_ids (W, S) replaced by `new_id`; the rest (and
    `encoded` itself) unchanged. run_ner.py gives an ELMo biLM [SEP] for [CLS]."""
    ids = encoded.features["input_ids"]
    ids = np.where(ids == old_id, new_id, ids).astype(ids.dtype)  # (W, S)
    return dataclasses.replace(encoded, features=dict(encoded.features, input_ids=ids))


def plan_windows(piece_counts: Sequence[int], max_pieces: int, overlap: int) -> list[range]:
    """Splits a sentence's words into windows of at most `max_pieces` pieces, at word boundaries.

    piece_counts: pieces per word (each at most max_pieces). Each next window starts at the
    earliest word that leaves it at most `overlap` pieces of the previous window as left context
    (and at least one word later than the previous start). Returns ranges of word indices that
    cover every word, in order.
    """
    n = len(piece_counts)
    starts = np.concatenate([[0], np.cumsum(piece_counts)]).astype(np.int64)  # (n + 1,)
    windows: list[range] = []
    a = 0
    while True:
        # The furthest end b with pieces(a..b-1) <= max_pieces.
        b = int(np.searchsorted(starts, starts[a] + max_pieces, side="right")) - 1
        b = max(b, a + 1)
        windows.append(range(a, b))
        if b >= n:
            return windows
        nxt = int(np.searchsorted(starts, starts[b] - overlap, side="left"))
        nxt = min(max(nxt, a + 1), b)
        # Without room for word b after the overlap, move the start right until there is.
        while starts[b + 1] - starts[nxt] > max_pieces:
            nxt += 1
        a = nxt


def owner_windows(windows: Sequence[range], piece_counts: Sequence[int]) -> list[int]:
    """For each word, the window that predicts it: the one where the word's first piece has the
    most context, min(pieces before it, pieces after it) within the window; the earlier window
    on a tie. Returns window indices, one per word."""
    starts = np.concatenate([[0], np.cumsum(piece_counts)])
    best: list[tuple[int, int]] = [(-1, -1)] * len(piece_counts)  # (score, window)
    for w, r in enumerate(windows):
        lo, hi = starts[r.start], starts[r.stop] - 1
        for i in r:
            score = int(min(starts[i] - lo, hi - starts[i]))
            if score > best[i][0]:
                best[i] = (score, w)
    return [w for _, w in best]


def encode_sentences(
    sentences: Sequence[Sentence],
    labels: Sequence[str] | None,
    tokenizer,
    max_seq_length: int,
    overlap: int,
    packing: glue.Packing = glue.BERT_PACKING,
) -> Encoded:
    """Aligns words to WordPieces and packs `[CLS] pieces [SEP]` windows (see the docstring).

    Args:
      sentences: sentences with tags in the model's scheme, or unlabelled (tags None).
      labels: the label list (id = index); None for unlabelled data.
      tokenizer: a FullTokenizer, or a bpe.RobertaTokenizer (each word's pieces from
        tokenize_word: with a leading space, as RoBERTa's tokenizer for pre-split words) with
        glue.ROBERTA_PACKING (`<s> pieces </s>`, padded with <pad>), or spiece's tokenizer
        (ALBERT_PACKING; an XLNet's with glue.xlnet_packing, `pieces <sep> <cls>`, <cls> in
        segment 2).
      max_seq_length: S, positions per window including [CLS] and [SEP].
      overlap: pieces of left context a window may repeat from the one before it (< S - 2).
    """
    # [CLS] pieces [SEP] (RoBERTa: <s> pieces </s>; XLNet: pieces <sep> <cls>)
    head = tokenizer.convert_tokens_to_ids(packing.head)
    tail = tokenizer.convert_tokens_to_ids([packing.end, *packing.tail])
    tail_segments = [0] + [packing.tail_segment] * len(packing.tail)
    room = max_seq_length - len(head) - len(tail)
    if room < 1:
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for pieces between the special "
            f"tokens ({packing.pair_form})"
        )
    if not 0 <= overlap < room:
        raise ValueError(f"window overlap must be in [0, {room}), found {overlap}")
    label_id = {t: i for i, t in enumerate(labels or ())}
    rows: list[tuple] = []  # (sentence, ids, word at position, label ids, weights)
    split, cut, unknown, empty, lengths = [], [], [], [], []
    for k, s in enumerate(sentences):
        lengths.append(len(s.words))
        pieces = [tokenizer.tokenize_word(w) for w in s.words]
        for i, p in enumerate(pieces):
            if not p:
                empty.append(s.at(i))
                pieces[i] = [packing.unk]  # the word keeps a position and gets a tag
            elif len(p) > room:
                cut.append(s.at(i))
                pieces[i] = p[:room]
        counts = [len(p) for p in pieces]
        windows = plan_windows(counts, room, overlap)
        owner = owner_windows(windows, counts)
        if len(windows) > 1:
            split.append(s.where)
        for w, r in enumerate(windows):
            ids, words_at = list(head), [-1] * len(head)
            label_ids, weights = [0] * len(head), [0.0] * len(head)
            for i in r:
                first = len(ids)
                ids += tokenizer.convert_tokens_to_ids(pieces[i])
                words_at += [-1] * len(pieces[i])
                label_ids += [0] * len(pieces[i])
                weights += [0.0] * len(pieces[i])
                if owner[i] != w:
                    continue
                words_at[first] = i
                if s.tags is not None and labels is not None:
                    if s.tags[i] in label_id:
                        label_ids[first] = label_id[s.tags[i]]
                        weights[first] = 1.0
                    else:
                        unknown.append(f"{s.at(i)}: {s.tags[i]!r}")
            ids += tail
            words_at += [-1] * len(tail)
            label_ids += [0] * len(tail)
            weights += [0.0] * len(tail)
            rows.append((k, ids, words_at, label_ids, weights))
    n, width = len(rows), max_seq_length
    features = {
        "input_ids": np.full((n, width), packing.pad_id(tokenizer), np.int32),
        "input_mask": np.zeros((n, width), np.int32),
        "segment_ids": np.zeros((n, width), np.int32),
        "label_ids": np.zeros((n, width), np.int32),
        "label_weights": np.zeros((n, width), np.float32),
    }
    word_index = np.full((n, width), -1, np.int32)
    sentence_index = np.zeros((n,), np.int32)
    for j, (k, ids, words_at, label_ids, weights) in enumerate(rows):
        m = len(ids)
        features["input_ids"][j, :m] = ids
        features["input_mask"][j, :m] = 1
        features["segment_ids"][j, m - len(tail) : m] = tail_segments  # XLNet's <cls>: 2
        features["label_ids"][j, :m] = label_ids
        features["label_weights"][j, :m] = weights
        word_index[j, :m] = words_at
        sentence_index[j] = k
    return Encoded(features, word_index, sentence_index, lengths, split, cut, unknown, empty)


def log_encoding(name: str, encoded: Encoded, max_seq_length: int) -> None:
    """Counted notes and warnings about one set's encoding, naming the first lines."""
    if encoded.split:
        logger.info(
            "%s: %d sentences longer than max_seq_length=%d were split into overlapping windows "
            "(every word is still predicted once), e.g. %s",
            name,
            len(encoded.split),
            max_seq_length,
            ", ".join(encoded.split[:SHOWN]),
        )
    for items, what in (
        (encoded.cut_words, "words had more WordPieces than a window holds; their trailing pieces "
                            "were dropped (the labelled first piece is kept)"),
        (encoded.empty_words, "words have no WordPiece (control or zero-width characters) and "
                              "were given [UNK]"),
        (encoded.unknown, "tags are not in the label list: they get no loss, are still scored as "
                          "gold and can never be predicted"),
    ):  # fmt: skip
        if items:
            logger.warning("%s: %d %s, e.g. %s", name, len(items), what, "; ".join(items[:SHOWN]))


def reassemble(encoded: Encoded, predicted_ids: np.ndarray, labels: Sequence[str]) -> list[list]:
    """Tags per word from per-position predictions of every window.

    predicted_ids: int (W, S) label ids (argmax of the logits), rows in encoded's window order.
    Returns one list of tags per sentence, each as long as the sentence. Raises ValueError if a
    word got no prediction or two (which encode_sentences never produces).
    """
    out: list[list] = [[None] * n for n in encoded.lengths]
    rows, positions = np.nonzero(encoded.word_index >= 0)
    for r, p in zip(rows, positions):
        sentence = out[encoded.sentence_index[r]]
        i = encoded.word_index[r, p]
        if sentence[i] is not None:
            raise ValueError(f"word {i} of sentence {encoded.sentence_index[r]} predicted twice")
        sentence[i] = labels[int(predicted_ids[r, p])]
    for k, tags in enumerate(out):
        if any(t is None for t in tags):
            raise ValueError(f"sentence {k}: some words got no prediction")
    return out


def write_tfrecord(path: str | os.PathLike, features: dict) -> int:
    """Writes encoded windows as tagging TFRecords (data_prep/features.py), atomically.

    Returns the number of records. Same features, same bytes.
    """
    import tensorflow as tf

    from data_prep import features as specs

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = len(features["input_ids"])
    try:
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            for i in range(n):
                writer.write(
                    specs.serialize_tagging_example(
                        features["input_ids"][i],
                        features["input_mask"][i],
                        features["segment_ids"][i],
                        features["label_ids"][i],
                        features["label_weights"][i],
                    )
                )
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


# ---------------------------------------------------------------------------------------------
# Data folders
# ---------------------------------------------------------------------------------------------

# Candidate names per split: the Cloze / Hugging Face names, then the original CoNLL-2003 ones.
SPLIT_FILES = {
    "train": ("train.txt", "eng.train", "train.conll"),
    "dev": ("dev.txt", "valid.txt", "eng.testa", "dev.conll"),
    "test": ("test.txt", "eng.testb", "test.conll"),
}


def find_split(data_dir: str | os.PathLike, split: str) -> Path:
    """The first of the split's candidate files that exists in data_dir; InputError if none."""
    for name in SPLIT_FILES[split]:
        path = Path(data_dir) / name
        if path.is_file():
            return path
    raise input_error(
        str(Path(data_dir) / SPLIT_FILES[split][0]),
        f"the {split} file",
        f"no such file (also tried {list(SPLIT_FILES[split][1:])})",
    )
