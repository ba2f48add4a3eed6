"""Byte-pair encoding: learning against subword-nmt and a hand-worked example, GPT-2's byte-level
tokenizer id for id against two encoders no one here wrote (the npm package's own JavaScript under
node, and Hugging Face `tokenizers` in Rust) on the real GPT-2 vocabulary, and round trips."""

import io
import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep import bpe, fetch
from data_prep.errors import InputError
from tests import helpers

# Strings chosen to break a careless byte-level tokenizer: contractions, runs of spaces before
# words and at the end, tabs and newlines, digits next to letters, accents (composed and not),
# CJK, emoji (4-byte UTF-8 and a ZWJ sequence), RTL text, control characters, "<|endoftext|>"
# as text, non-breaking and ideographic spaces, and a word far longer than any merge.
HARD = [
    "Hello world",
    "I'm sure they'll've done it, isn't it? 'S 'T don't",
    "  leading spaces,   inner runs   and trailing   ",
    "tabs\tand\nnewlines\r\n\n\nend\n",
    "GPT2 has 1,558,000,000 parameters (v2.0.1) in 2019; x86_64 0xFF 3.14159",
    "café Café CAFÉ cafe\u0301 naïve Zürich crème brûlée",
    "東京は日本の首都です。中文字符 한국어 텍스트",
    "emoji 😀 👩‍👩‍👧‍👦 🇬🇧 ✓ ☃",
    "עברית ومرحبا بالعالم",
    "control \x00 \x07 \x1b[31m end",
    "<|endoftext|> is only text here",
    "non\u00a0breaking\u3000ideographic\u2003em space",
    "Supercalifragilisticexpialidocious" * 3,
    "",
    " ",
    "!!!???...---___***",
    "user@example.com https://example.org/a?b=c&d=e#f",
]


@pytest.fixture(scope="module")
def gpt2_files():
    folder = fetch.gpt2_bpe_dir()
    return folder / "encoder.json", folder / "vocab.bpe", folder / "Encoder.js"


@pytest.fixture(scope="module")
def gpt2(gpt2_files):
    return bpe.ByteLevelBPE.from_files(gpt2_files[0], gpt2_files[1])


def test_gpt2_known_ids_and_the_vocab_layout_rebuilt_from_merges(gpt2, gpt2_files):
    assert gpt2.encode("Hello world") == [15496, 995]  # shared/DATA.md
    assert gpt2.tokens(" world!") == ["Ġworld", "!"]
    real = json.loads(gpt2_files[0].read_text(encoding="utf-8"))
    assert bpe.byte_level_vocab(gpt2.merges) == real  # 256 bytes, 50,000 merges, <|endoftext|>
    assert len(real) == 50257 and real[bpe.GPT2_END_OF_TEXT] == 50256


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_gpt2_ids_equal_the_packages_own_javascript_encoder(gpt2, gpt2_files):
    script = (
        f"const {{encode}} = require({json.dumps(str(gpt2_files[2]))});"
        "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>{"
        "console.log(JSON.stringify(JSON.parse(s).map(t=>encode(t))))})"
    )
    result = subprocess.run(
        ["node", "-e", script], input=json.dumps(HARD), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    expected = json.loads(result.stdout)
    for text, ids in zip(HARD, expected):
        assert gpt2.encode(text) == ids, text


def test_gpt2_ids_equal_hugging_face_tokenizers(gpt2, gpt2_files):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    model = models.BPE.from_file(str(gpt2_files[0]), str(gpt2_files[1]))
    ref = Tokenizer(model)
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.decoder = decoders.ByteLevel()
    for text in HARD:
        assert gpt2.encode(text) == ref.encode(text).ids, text


# RoBERTa: GPT-2's merges over RoBERTa's own ids (a Hugging Face vocab.json + merges.txt).


@pytest.fixture(scope="module")
def roberta_folder(tmp_path_factory):
    return helpers.roberta_bpe_folder(tmp_path_factory.mktemp("roberta"))


ROBERTA_PAIRS = [
    ("The company said it expects revenue to rise.", "Revenue is expected to rise, it said."),
    ("A man is playing a guitar.", None),
    *((text, HARD[i + 1]) for i, text in enumerate(HARD[:-1])),
]


def test_roberta_ids_equal_hugging_face_tokenizers_roberta_processing(roberta_folder):
    """Ids of single texts and pairs, <s> a </s></s> b </s>, equal Hugging Face tokenizers'
    byte-level BPE with RobertaProcessing (what RobertaTokenizerFast runs) on the same files."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from data_prep import glue

    ref = Tokenizer(
        models.BPE.from_file(str(roberta_folder / "vocab.json"), str(roberta_folder / "merges.txt"))
    )
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    ours = bpe.RobertaTokenizer.from_folder(roberta_folder)
    assert ours.vocab["<mask>"] == len(ours.vocab) - 1 == 50260
    task = glue.get_task("mrpc")
    examples = [glue.Example(f"t:{i}", str(i), a, b) for i, (a, b) in enumerate(ROBERTA_PAIRS)]
    enc = glue.encode_examples(examples, task, ours, 256, glue.ROBERTA_PACKING)
    assert not enc.truncated
    for row, (a, b) in enumerate(ROBERTA_PAIRS):
        want = ref.encode(a, b).ids if b is not None else ref.encode(a).ids
        got = enc.features["input_ids"][row]
        n = int(enc.features["input_mask"][row].sum())
        assert got[:n].tolist() == want, (a, b)
        assert set(got[n:].tolist()) <= {1}  # <pad>


def test_roberta_features_equal_keras_hubs_roberta_preprocessor(roberta_folder):
    """The padded ids and mask equal keras-hub's RobertaTextClassifierPreprocessor (its own
    tokenizer and packer) on the same vocabulary and merges."""
    import keras_hub
    import tensorflow as tf

    from data_prep import glue

    vocab = json.loads((roberta_folder / "vocab.json").read_text())
    merges = (roberta_folder / "merges.txt").read_text().splitlines()[1:]  # after "#version"
    hub_tokenizer = keras_hub.models.RobertaTokenizer(vocabulary=vocab, merges=merges)
    pre = keras_hub.models.RobertaTextClassifierPreprocessor(hub_tokenizer, sequence_length=96)
    pairs = [(a, b) for a, b in ROBERTA_PAIRS[:6] if b is not None]
    # As x=: a positional tuple reaches keras-hub's packer as one segment here (Keras 3.15).
    first, second = (tf.constant([pair[i] for pair in pairs]) for i in (0, 1))
    theirs = pre(x=(first, second))
    ours = bpe.RobertaTokenizer.from_folder(roberta_folder)
    examples = [glue.Example(f"t:{i}", str(i), a, b) for i, (a, b) in enumerate(pairs)]
    enc = glue.encode_examples(examples, glue.get_task("mrpc"), ours, 96, glue.ROBERTA_PACKING)
    assert not enc.truncated
    assert enc.features["input_ids"].tolist() == np.asarray(theirs["token_ids"]).tolist()
    mask = np.asarray(theirs["padding_mask"]).astype("int32")
    assert enc.features["input_mask"].tolist() == mask.tolist()


def test_roberta_tokenizer_refuses_a_vocabulary_without_its_special_tokens(gpt2_files, tmp_path):
    with pytest.raises(InputError, match=r"no such files"):
        bpe.RobertaTokenizer.from_folder(tmp_path)
    shutil.copy(gpt2_files[0], tmp_path / "encoder.json")
    shutil.copy(gpt2_files[1], tmp_path / "vocab.bpe")
    with pytest.raises(InputError, match=r"encoder.json: expected RoBERTa's special tokens"):
        bpe.RobertaTokenizer.from_folder(tmp_path)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_byte_level_round_trips_every_string(gpt2, text):
    assert gpt2.decode(gpt2.encode(text)) == text


# The encoder's fast paths, each against the plain form it replaces.


def _gpt2_merge_loop(symbols, ranks):
    """GPT-2's bpe() loop written out plainly: rank every adjacent pair, merge every
    non-overlapping occurrence of the best one left to right, and start again."""
    word = list(symbols)
    while len(word) > 1:
        best = min(zip(word, word[1:]), key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        merged, i = [], 0
        while i < len(word):
            if word[i : i + 2] == list(best):
                merged.append(best[0] + best[1])
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
    return word


_SYMBOLS = ["a", "b", "c", "ab", "bc", "ca", "abc", "aa"]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(_SYMBOLS), max_size=14),
    st.lists(st.tuples(st.sampled_from(_SYMBOLS), st.sampled_from(_SYMBOLS)), max_size=30),
)
def test_merge_table_equals_gpt2s_loop_for_any_merge_list(word, merges):
    # Any merge list, not only learned ones: repeated pairs, pairs whose parts no merge makes,
    # and merges ranked before the merges that make their parts; symbols no merge names ("z")
    # stay where they are.
    ranks = {p: i for i, p in enumerate(merges)}
    want = _gpt2_merge_loop(word, ranks)
    assert bpe.MergeTable(merges).apply_symbols(word) == want
    # With a vocabulary's ids kept (gaps included), as ByteLevelBPE builds it.
    vocab = {s: 3 * k + 1 for k, s in enumerate(_SYMBOLS[::2])}
    table = bpe.MergeTable(merges, vocab)
    assert table.apply_symbols(word) == want
    assert (
        all(table.ids[s] == i for s, i in vocab.items())
        and table.num_kept == max(vocab.values()) + 1
    )
    assert all(i >= table.num_kept for s, i in table.ids.items() if s not in vocab)


def test_merge_table_merges_every_occurrence_before_reranking():
    # (abc, a) is ranked before (a, bc): merging only the first (a, bc) and re-ranking would
    # merge abc+a next; GPT-2 merges both occurrences first and ends at [abc, abc].
    merges = [("abc", "a"), ("a", "bc")]
    ranks = {p: i for i, p in enumerate(merges)}
    assert bpe.MergeTable(merges).apply_symbols(["a", "bc", "a", "bc"]) == ["abc", "abc"]
    assert _gpt2_merge_loop(["a", "bc", "a", "bc"], ranks) == ["abc", "abc"]


def test_merge_table_on_the_real_merges_and_overlapping_runs(gpt2):
    ranks = {p: i for i, p in enumerate(gpt2.merges)}
    words = ["aaaa", "aaaaa", "Ġ" * 7, "ĠSupercalifragilistic", "1234567890", "ĠĠĠĠ"]
    for word in words + ["Ġz\u4e00Ġq"]:  # "\u4e00" is no byte symbol: unknown, never merged
        want = _gpt2_merge_loop(word, ranks)
        assert gpt2.table.apply_symbols(word) == want, word
    for word in words:  # the ids path encode() takes
        want = [gpt2.encoder[u] for u in _gpt2_merge_loop(word, ranks)]
        assert gpt2.table.apply([gpt2.encoder[c] for c in word]) == want, word
    assert gpt2.table.apply_symbols("") == [] and gpt2.table.apply_symbols("x") == ["x"]


def test_merges_that_make_a_token_the_vocabulary_lacks_are_refused_when_met(gpt2):
    vocab = {t: i for t, i in gpt2.encoder.items() if t != "Ġthe"}
    tok = bpe.ByteLevelBPE(vocab, gpt2.merges)
    assert tok.encode(" cat") == gpt2.encode(" cat")
    with pytest.raises(ValueError, match="the merges make 'Ġthe', which the vocabulary lacks"):
        tok.encode("on the mat")


@given(st.text())
def test_byte_chars_maps_every_utf8_byte(text):
    assert bpe.byte_chars(text) == "".join(bpe.BYTE_TO_CHAR[b] for b in text.encode("utf-8"))


_ASCII_SAMPLE = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x00", "\x1c", "\x7f", "a", "Z", "s"]
_ASCII_SAMPLE += ["t", "l", "0", "9", "'", "!", "_", "-"]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_ascii_pretokenizer_equals_gpt2s_pattern_on_ascii(text):
    assert bpe.GPT2_ASCII_PATTERN.findall(text) == bpe.GPT2_PATTERN.findall(text)


def test_ascii_pretokenizer_on_every_short_string_of_a_sample_and_every_character():
    texts = [a + b + c for a in _ASCII_SAMPLE for b in _ASCII_SAMPLE for c in _ASCII_SAMPLE]
    texts += [chr(c) * 3 + " x" + chr(c) for c in range(128)] + [SHAKESPEARE_SONNET]
    texts += [t for t in HARD if t.isascii()]
    for text in texts:
        assert bpe.GPT2_ASCII_PATTERN.findall(text) == bpe.GPT2_PATTERN.findall(text), repr(text)


def test_sennrich_example_learns_hand_computed_merges():
    # Sennrich et al. 2016, fig. 1: {low: 5, lower: 2, newest: 6, widest: 3}. Worked by hand:
    # e s and s t</w> tie at 9 and the larger pair wins; then e st</w> 9, l o 7; at 6 the
    # larger of (n e), (e w), (w est</w>) is w est</w>, which leaves e w at 0; and so on.
    words = ["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3
    merges = bpe.learn_bpe(bpe.character_words(words), 10)
    assert merges == [
        ("s", "t</w>"),
        ("e", "st</w>"),
        ("l", "o"),
        ("w", "est</w>"),
        ("n", "e"),
        ("ne", "west</w>"),
        ("lo", "w</w>"),
        ("w", "i"),
        ("wi", "d"),
        ("wid", "est</w>"),
    ]
    seg = bpe.CharacterBPE(merges)
    assert seg.segment("lowest newer") == ["lo", "west</w>", "ne", "w", "e", "r</w>"]
    assert len(seg._cache) == 2
    assert bpe.learn_bpe(bpe.character_words(words), 10, min_frequency=4) == merges[:7]


def test_the_per_word_caches_are_bounded_and_change_no_output(gpt2, monkeypatch):
    # A corpus with more distinct words than the bound: past it, words are segmented anew.
    words = SHAKESPEARE_SONNET.split()
    merges = bpe.learn_bpe(bpe.character_words(words), 40, min_frequency=2)
    want_units = bpe.CharacterBPE(merges).segment(SHAKESPEARE_SONNET)
    want_ids = gpt2.encode(SHAKESPEARE_SONNET)
    monkeypatch.setattr(bpe, "CACHE_ENTRIES", 5)
    character = bpe.CharacterBPE(merges)
    byte_level = bpe.ByteLevelBPE(gpt2.encoder, gpt2.merges)
    assert character.segment(SHAKESPEARE_SONNET) == want_units
    assert byte_level.encode(SHAKESPEARE_SONNET) == want_ids
    assert len(set(words)) > 5 and len(character._cache) == len(byte_level._cache) == 5


def test_learning_equals_subword_nmt_on_real_text():
    from subword_nmt.learn_bpe import learn_bpe as reference

    text = SHAKESPEARE_SONNET * 3 + " ".join(HARD[:6])
    out = io.StringIO()
    reference(io.StringIO(text), out, 150, min_frequency=2)
    expected = [tuple(line.split(" ")) for line in out.getvalue().splitlines()[1:]]
    words = [w for line in text.splitlines() for w in line.strip("\r\n ").split(" ") if w]
    assert bpe.learn_bpe(bpe.character_words(words), 150) == expected
    assert len(expected) > 100


def _naive_learn(word_counts, num_merges, min_frequency):
    """The algorithm as stated, recounting every pair of every word at every step: merge the
    largest (count, pair), stop below min_frequency, replace occurrences left to right."""
    words = {tuple(w): n for w, n in word_counts.items()}
    merges = []
    while len(merges) < num_merges:
        stats = {}
        for w, n in words.items():
            for pair in zip(w, w[1:]):
                stats[pair] = stats.get(pair, 0) + n
        if not stats:
            break
        count, pair = max((n, p) for p, n in stats.items())
        if count < min_frequency:
            break
        merges.append(pair)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if w[i : i + 2] == pair:
                    out.append(pair[0] + pair[1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return merges


@pytest.mark.parametrize("seed", range(6))
def test_learning_equals_the_naive_algorithm_on_overlaps_ties_and_shared_strings(seed):
    # The incremental learner (a pair index kept lazily, only the pairs beside an occurrence
    # recounted) against the plain statement of the algorithm, on words that stress it: a
    # two-letter alphabet (runs like "aaaa" and "abab": overlapping and repeated pairs), small
    # counts (ties everywhere), and multi-character symbols given in the input, so that a merge
    # can make a string that is already a symbol ("a" + "ab" = "aab", given as one symbol).
    rng = np.random.default_rng(seed)
    alphabet = ["a", "b", "ab", "aab", "c"] if seed % 2 else ["a", "b"]
    word_counts = {}
    for _ in range(60):
        word = tuple(rng.choice(alphabet, size=int(rng.integers(1, 9))))
        word_counts[word] = word_counts.get(word, 0) + int(rng.integers(1, 4))
    for min_frequency in (1, 2, 5):
        want = _naive_learn(word_counts, 80, min_frequency)
        assert bpe.learn_bpe(word_counts, 80, min_frequency) == want
    assert len(_naive_learn(word_counts, 80, 1)) > 10


def test_learning_equals_the_naive_algorithm_over_many_merges():
    # Hundreds of merges over hundreds of words: counts that fall and rise again, so the heap's
    # entries go stale in both directions (a pair's fallen count is pushed again only when its
    # stale entry comes up), words edited in place and rebuilt, pairs listed under words that
    # lost them.
    rng = np.random.default_rng(7)
    alphabet = ["a", "b", "c", "d", "ab", "ba", "cd"]
    word_counts = {}
    for _ in range(400):
        word = tuple(rng.choice(alphabet, size=int(rng.integers(1, 14))))
        word_counts[word] = word_counts.get(word, 0) + int(rng.integers(1, 30))
    want = _naive_learn(word_counts, 300, 1)
    assert len(want) > 250
    assert bpe.learn_bpe(word_counts, 300, 1) == want


def test_counting_paths_agree():
    # The pre-token counts (ASCII texts by the `re` pattern) give the byte words counting each
    # text anew gives; a Counter of whitespace words gives the character words of the words.
    texts = [*HARD, SHAKESPEARE_SONNET, SHAKESPEARE_SONNET]
    direct = {}
    for text in texts:
        for token in bpe.pretokenize(text):
            direct[tuple(token)] = direct.get(tuple(token), 0) + 1
    assert bpe.byte_words(texts) == direct
    assert bpe.pretoken_words(bpe.count_pretokens(texts)) == direct
    words = [w for t in texts for w in t.split()]
    assert bpe.character_words(bpe.count_whitespace_words(texts)) == bpe.character_words(words)


def test_learning_degenerate_cases():
    assert bpe.learn_bpe(bpe.character_words(["a"]), 5) == []  # no pair at all
    assert bpe.learn_bpe(bpe.character_words(["ab"]), 5) == []  # one pair, seen once
    assert bpe.learn_bpe(bpe.character_words(["ab", "ab"]), 5) == [("a", "b</w>")]
    assert bpe.learn_bpe(bpe.character_words(["ab", "ab"]), 0) == []
    assert bpe.learn_bpe({}, 5) == []  # no word at all
    # Overlapping pairs: "aaaa" merges left to right into aa aa, counted once per occurrence.
    merges = bpe.learn_bpe(bpe.character_words(["aaaaa"] * 3), 3)
    assert merges[0] == ("a", "a")


def test_byte_level_learning_gives_a_working_tokenizer(tmp_path):
    texts = [SHAKESPEARE_SONNET, "Ünïcödé and emoji 😀 stay encodable."]
    merges = bpe.learn_bpe(bpe.byte_words(texts), 200)
    tok = bpe.ByteLevelBPE(bpe.byte_level_vocab(merges), merges)
    enc_file, merges_file = tok.save(tmp_path)
    again = bpe.ByteLevelBPE.from_files(enc_file, merges_file)
    for text in [*texts, "never seen: ☃ 東京"]:
        assert again.decode(again.encode(text)) == text
        assert again.encode(text) == tok.encode(text)
    sonnet = tok.encode(SHAKESPEARE_SONNET)
    assert len(sonnet) < 0.5 * len(SHAKESPEARE_SONNET.encode())  # merges compress the text
    assert all(" " not in a + b for a, b in merges)  # byte symbols: spaces are "Ġ"


def test_bad_merges_and_vocab_files_name_file_and_line(tmp_path):
    bad = tmp_path / "vocab.bpe"
    bad.write_text("#version: 0.2\na b\nc d e\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"vocab.bpe:3: expected two symbols"):
        bpe.read_merges(bad)
    enc = tmp_path / "encoder.json"
    enc.write_text('{"a": 0}', encoding="utf-8")
    bad.write_text("#version: 0.2\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"encoder.json: expected every byte symbol"):
        bpe.ByteLevelBPE.from_files(enc, bad)
    # GPT-1's vocabulary (OpenAIGPTTokenizer's vocab.json: word-end '</w>' tokens) is named.
    enc.write_text('{"a": 0, "the</w>": 1}', encoding="utf-8")
    with pytest.raises(InputError, match=r"lacks 255 of .* GPT-1's OpenAIGPTTokenizer's"):
        bpe.ByteLevelBPE.from_files(enc, bad)
    enc.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(InputError, match=r"encoder.json: expected a JSON object"):
        bpe.ByteLevelBPE.from_files(enc, bad)


SHAKESPEARE_SONNET = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.
"""
