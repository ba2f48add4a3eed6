"""Tokenization throughput: Cloze's tokenizers against Hugging Face `tokenizers` (Rust), ids equal.

WordPiece: data_prep/tokenization.InGraphTokenizer.batch_tokenize_ids (the path of
create_pretraining_data.py --compat_original, via pretraining_data.read_documents) and
FullTokenizer.batch_tokenize_ids (the path of its streaming workers), against
tokenizers.BertWordPieceTokenizer with the same vocabulary and the original BERT's normalization,
both tokenizing the same non-blank corpus lines in bulk. Byte-level BPE: data_prep/bpe.ByteLevelBPE
on the worker processes of data_prep/parallel.map_texts (the path of create_lm_data.py, one worker
per core, pool start-up counted in every pass) against a tokenizers BPE model with GPT-2's
byte-level pre-tokenizer on GPT-2's own files (Rust, its batch spread over the cores by its own
thread pool); the one-process pass is reported beside them. These sides run in a child process
that has not imported TensorFlow, as create_lm_data.py's has not, so the workers are forked there
too (data_prep/parallel.start_method).

Every line's ids must be identical; a difference raises ValueError naming the corpus line. The
sides' passes are timed in alternating rounds (bench/timing.py: a warm-up pass of each, then
`repeats` rounds of one pass per side), each side's best pass gives the ratio, and every round's
ratio and seconds are reported. Timed one side after the other as before, the default run's
GPT-2 BPE ratio read 0.82 in the forty-fifth session where the same code, alone, measured 1.49
(bench/HISTORY.md). A pass right after one of its own side often runs faster (up to 2x for
Cloze's WordPiece); the best pass is what a long tokenization run sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # run as the child process of byte_level_bpe
    sys.path.insert(0, str(REPO))

from bench import timing  # noqa: E402


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


def byte_level_bpe(corpus, bpe_dir, repeats: int = 3, max_lines=None, num_workers=None):
    """GPT-2 byte-level BPE tokens/s of data_prep/bpe.ByteLevelBPE on `num_workers` processes
    (default: the cores this process may use) and of Hugging Face's BPE with the byte-level
    pre-tokenizer, on GPT-2's encoder.json / vocab.bpe in `bpe_dir`, measured by
    byte_level_bpe_here in a child process (python -m bench.tokenizer_speed); its ValueError
    (ids differ) or any other failure is raised here as RuntimeError with the child's message."""
    from data_prep import parallel

    args = {
        "corpus": str(corpus),
        "bpe_dir": str(bpe_dir),
        "repeats": repeats,
        "max_lines": max_lines,
        "num_workers": parallel.worker_count(num_workers),
    }
    cmd = [sys.executable, "-m", "bench.tokenizer_speed", json.dumps(args)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"byte-level BPE benchmark failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def byte_level_bpe_here(corpus, bpe_dir, repeats: int, max_lines, num_workers: int):
    """byte_level_bpe's measurement, in this process; its workers are forked only if this
    process has not imported TensorFlow (data_prep/parallel.start_method)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from data_prep import bpe, parallel

    numbered = read_lines(corpus, max_lines)
    lines = [t for _, t in numbered]
    encoder, merges = Path(bpe_dir) / "encoder.json", Path(bpe_dir) / "vocab.bpe"
    vocab = bpe.ByteLevelBPE.from_files(encoder, merges)  # read once; parsed files are reused
    pairs = list(vocab.merges)

    # Each pass builds the tokenizers afresh from the parsed vocabulary and merges, so none runs
    # on a word cache warmed by an earlier pass (all keep one); Cloze's workers start with it.
    def cloze_pass():
        tok = bpe.ByteLevelBPE(vocab.encoder, pairs)
        return list(parallel.map_texts(tok.encode, lines, num_workers))

    def one_process_pass():
        tok = bpe.ByteLevelBPE(vocab.encoder, pairs)
        return [tok.encode(t) for t in lines]

    def hf_pass():
        tok = Tokenizer(models.BPE(dict(vocab.encoder), pairs))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return _hf_encode(tok, lines)

    # The one-process pass in the middle, as the WordPiece benchmark's FullTokenizer.
    first, rounds = timing.alternating_rounds(
        {"cloze": cloze_pass, "cloze_one_process": one_process_pass, "hf_tokenizers": hf_pass},
        repeats,
    )
    ours, theirs = first["cloze"][0], [e.ids for e in first["hf_tokenizers"][0]]
    compared = check_identical(corpus, numbered, ours, theirs, "byte-level BPE")
    one = first["cloze_one_process"][0]
    check_identical(corpus, numbered, one, theirs, "byte-level BPE (one process)")
    tokens = sum(len(ids) for ids in ours)
    report = _report(corpus, len(lines), tokens, rounds, compared)
    one_s = timing.best_seconds(rounds)["cloze_one_process"]
    return report | {
        "bpe_dir": str(bpe_dir),
        "cloze_workers": num_workers,
        "worker_start_method": parallel.start_method(),
        "cloze_one_process": {"seconds": one_s, "tokens_per_s": tokens / one_s},
        "ratio_one_process": report["hf_tokenizers"]["seconds"] / one_s,
    }


if __name__ == "__main__":
    # One JSON object of byte_level_bpe_here's arguments in, its report as one JSON line out.
    print(json.dumps(byte_level_bpe_here(**json.loads(sys.argv[1]))))
