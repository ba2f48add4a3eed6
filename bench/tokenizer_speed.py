"""Tokenization throughput: Cloze's tokenizers against Hugging Face `tokenizers` (Rust), ids equal.

WordPiece: data_prep/tokenization.InGraphTokenizer.batch_tokenize_ids (the path of
create_pretraining_data.py --compat_original, via pretraining_data.read_documents) and
FullTokenizer.batch_tokenize_ids (the path of its streaming workers), against
tokenizers.BertWordPieceTokenizer with the same vocabulary and the original BERT's normalization,
both tokenizing the same non-blank corpus lines in bulk. Byte-level BPE: data_prep/bpe.ByteLevelBPE
against a tokenizers BPE model with GPT-2's byte-level pre-tokenizer on GPT-2's own files.

Every line's ids must be identical; a difference raises ValueError naming the corpus line. The
sides' passes are timed in alternating rounds (bench/timing.py: a warm-up pass of each, then
`repeats` rounds of one pass per side), each side's best pass gives the ratio, and every round's
ratio and seconds are reported. Timed one side after the other as before, the default run's
GPT-2 BPE ratio read 0.82 in the forty-fifth session where the same code, alone, measured 1.49
(bench/HISTORY.md). A pass right after one of its own side often runs faster (up to 2x for
Cloze's WordPiece); the best pass is what a long tokenization run sees.
"""

from __future__ import annotations

from pathlib import Path

from bench import timing


def read_lines(path, max_lines: int | None = None) -> list[tuple[int, str]]:
    """(1-based line number, stripped text) of the non-blank lines of a UTF-8 corpus file."""
    from data_prep.tokenization import read_utf8_lines

    out = []
    for number, text in read_utf8_lines(path):
        text = text.strip()
        if text:
            out.append((number, text))
            if max_lines is not None and len(out) >= max_lines:
                break
    if not out:
        raise ValueError(f"{path}: no non-blank line to tokenize")
    return out


def _round_ratios(rounds: list, peer: str, side: str = "cloze") -> list:
    """Every round's peer seconds over `side`'s: the ratio of passes timed side by side."""
    return [r[peer] / r[side] for r in rounds]


def check_identical(path, numbered, ours, theirs, what: str) -> int:
    """Compares two id lists per line; raises naming the first differing corpus line. Returns the
    number of lines compared."""
    if len(ours) != len(theirs) or len(ours) != len(numbered):
        raise ValueError(f"{what}: {len(ours)} vs {len(theirs)} tokenized lines")
    for (number, text), a, b in zip(numbered, ours, theirs):
        if list(a) != list(b):
            raise ValueError(
                f"{path}:{number}: {what} ids differ for {text[:80]!r}: cloze {list(a)[:12]}..., "
                f"tokenizers {list(b)[:12]}..."
            )
    return len(ours)


def _report(path, lines, tokens, rounds, compared) -> dict:
    """The result of one tokenizer's run: `rounds` from timing.alternating_rounds, whose sides
    "cloze" and "hf_tokenizers" give the ratio (best against best, and every round's)."""
    best = timing.best_seconds(rounds)
    cloze_s, peer_s = best["cloze"], best["hf_tokenizers"]
    return {
        "corpus": str(path),
        "lines": lines,
        "tokens": tokens,
        "ids_identical": True,
        "lines_compared": compared,
        "cloze": {"seconds": cloze_s, "tokens_per_s": tokens / cloze_s},
        "hf_tokenizers": {"seconds": peer_s, "tokens_per_s": tokens / peer_s},
        "ratio": peer_s / cloze_s,
        "round_ratios": _round_ratios(rounds, "hf_tokenizers"),
        "round_seconds": rounds,
    }


def _hf_encode(tokenizer, lines, **kwargs):
    # encode_batch_fast (tokenizers >= 0.20) skips the character offsets neither side needs here,
    # so the peer is timed on its fastest bulk path.
    fast = getattr(tokenizer, "encode_batch_fast", None)
    if fast is None and hasattr(tokenizer, "_tokenizer"):  # the BertWordPieceTokenizer wrapper
        fast = getattr(tokenizer._tokenizer, "encode_batch_fast", None)
    return (fast or tokenizer.encode_batch)(lines, **kwargs)


def wordpiece(corpus, vocab_file, do_lower_case: bool = True, repeats: int = 3, max_lines=None):
    """WordPiece tokens/s of Cloze's bulk path and of Hugging Face's BertWordPieceTokenizer."""
    import tokenizers

    from data_prep.tokenization import FullTokenizer, InGraphTokenizer

    numbered = read_lines(corpus, max_lines)
    lines = [t for _, t in numbered]
    cloze = InGraphTokenizer(str(vocab_file), do_lower_case=do_lower_case)
    # The original BasicTokenizer's steps: clean control characters, split CJK, lower-case and
    # strip accents together (tests/test_tokenization.py lists where the two still differ).
    hf = tokenizers.BertWordPieceTokenizer(
        str(vocab_file),
        lowercase=do_lower_case,
        strip_accents=do_lower_case,
        clean_text=True,
        handle_chinese_chars=True,
    )
    vocab = cloze.vocab
    first, rounds = timing.alternating_rounds(
        {
            "cloze": lambda: cloze.batch_tokenize_ids(lines),
            # FullTokenizer, the path create_pretraining_data.py's workers take: a fresh
            # tokenizer each pass, so its word cache starts empty as in a worker. In the middle,
            # so that the two compared sides each get passes right after one of their own.
            "full_tokenizer": lambda: FullTokenizer.from_vocab(
                vocab, do_lower_case
            ).batch_tokenize_ids(lines),
            "hf_tokenizers": lambda: _hf_encode(hf, lines, add_special_tokens=False),
        },
        repeats,
    )
    ours, theirs = first["cloze"][0], [e.ids for e in first["hf_tokenizers"][0]]
    compared = check_identical(corpus, numbered, ours, theirs, "WordPiece")
    full_ids = first["full_tokenizer"][0]
    check_identical(corpus, numbered, full_ids, theirs, "WordPiece (FullTokenizer)")
    tokens = sum(len(ids) for ids in ours)
    report = _report(corpus, len(lines), tokens, rounds, compared)
    full_s = timing.best_seconds(rounds)["full_tokenizer"]
    return report | {
        "vocab": str(vocab_file),
        "cloze_full_tokenizer": {"seconds": full_s, "tokens_per_s": tokens / full_s},
        "ratio_full_tokenizer": report["hf_tokenizers"]["seconds"] / full_s,
    }


def byte_level_bpe(corpus, bpe_dir, repeats: int = 3, max_lines=None):
    """GPT-2 byte-level BPE tokens/s of data_prep/bpe.ByteLevelBPE and of Hugging Face's BPE with
    the byte-level pre-tokenizer, on GPT-2's encoder.json / vocab.bpe in `bpe_dir`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from data_prep import bpe

    numbered = read_lines(corpus, max_lines)
    lines = [t for _, t in numbered]
    encoder, merges = Path(bpe_dir) / "encoder.json", Path(bpe_dir) / "vocab.bpe"
    vocab = bpe.ByteLevelBPE.from_files(encoder, merges)  # read once; parsed files are reused
    pairs = list(vocab.merges)

    # Each pass builds both tokenizers afresh from the parsed vocabulary and merges, so neither
    # runs on a word cache warmed by an earlier pass (both keep one).
    def cloze_pass():
        tok = bpe.ByteLevelBPE(vocab.encoder, pairs)
        return [tok.encode(t) for t in lines]

    def hf_pass():
        tok = Tokenizer(models.BPE(dict(vocab.encoder), pairs))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return _hf_encode(tok, lines)

    first, rounds = timing.alternating_rounds(
        {"cloze": cloze_pass, "hf_tokenizers": hf_pass}, repeats
    )
    ours, theirs = first["cloze"][0], [e.ids for e in first["hf_tokenizers"][0]]
    compared = check_identical(corpus, numbered, ours, theirs, "byte-level BPE")
    tokens = sum(len(ids) for ids in ours)
    return _report(corpus, len(lines), tokens, rounds, compared) | {"bpe_dir": str(bpe_dir)}
