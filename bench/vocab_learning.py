"""Learning BPE merges: data_prep/build_vocab.py against the learners users would otherwise run.

Each pass runs one command end to end, as a user runs it (interpreter start-up included):
  cloze_bpe          build_vocab.py --vocab_type=bpe            Sennrich's character-level merges
  subword_nmt        subword-nmt's learn_bpe (the reference     the same codes file, which must be
                     implementation, pure Python; its counting  byte-identical (else ValueError)
                     on as many processes as Cloze's)
  cloze_byte_level   build_vocab.py --vocab_type=byte_level_bpe GPT-2's byte-level merges
  hf_tokenizers      Hugging Face `tokenizers`' BpeTrainer       the same kind of merges (Rust, its
                     with GPT-2's byte-level pre-tokenizer      own thread pool), ties broken its
                                                                own way: the merges in common are
                                                                reported, not required
on the same corpus (one sentence a line), the same number of merges and minimum pair count. The
passes are timed in alternating rounds (bench/timing.py: a first pass of each side, whose output
is checked, then `repeats` rounds) and each ratio is the peer's best pass over Cloze's.

Then WordPiece, learner against learner in this process, one process each, on the same ranked
word counts of the corpus (tokenization.count_words, lower-cased, counted once untimed):
  cloze_wordpiece    tokenization._learn_like_tf_text   build_vocab.py's learner
  tf_text_wordpiece  tensorflow-text's                  the algorithm it reimplements: the
                     wordpiece_tokenizer_learner_lib    vocabularies must be identical (else
                     .learn (pure Python)               ValueError)
at `wordpiece_vocab_size` with build_vocab.py's arguments, timed the same way with
`wordpiece_repeats` rounds (the library takes about 90 s a pass on the default corpus).

  python -m bench.vocab_learning --corpus=default_run/corpus/train.txt --work_dir=/tmp/vocab
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # run as a script or as the peer's child process
    sys.path.insert(0, str(REPO))

from bench import timing  # noqa: E402


def _run(cmd: list[str], what: str) -> None:
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")


def hf_byte_level_merges(corpus, out_dir, num_merges: int, min_frequency: int) -> None:
    """The peer's pass (in a child process): Hugging Face's BpeTrainer over `corpus` with GPT-2's
    byte-level pre-tokenizer and its 256 byte symbols as the alphabet, no special token, so the
    vocabulary is the bytes and `num_merges` merges; writes vocab.json and merges.txt."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=256 + num_merges,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tok.model.save(str(out_dir))


def first_unequal(xs, ys) -> int | None:
    """The first index where the two sequences hold different items, None where one is a
    prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(xs, ys)) if x != y), None)


def first_difference(path_a: Path, path_b: Path) -> str | None:
    """None if the two files are byte-identical, else where they first differ (line, texts)."""
    a, b = path_a.read_bytes(), path_b.read_bytes()
    if a == b:
        return None
    lines_a, lines_b = a.decode("utf-8").splitlines(), b.decode("utf-8").splitlines()
    at = first_unequal(lines_a, lines_b)
    if at is None:
        return f"{len(lines_a)} lines against {len(lines_b)}"
    return f"line {at + 1}: {lines_a[at]!r} against {lines_b[at]!r}"


def wordpiece_learners(corpus, vocab_size: int, repeats: int) -> dict:
    """The WordPiece sides (see the module's docstring); raises ValueError when the two
    vocabularies differ, naming the first place."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as lib

    from data_prep import tokenization

    lines = (text for _, text in tokenization.read_utf8_lines(corpus))
    counts = tokenization.count_words(lines, do_lower_case=True)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    reserved = list(tokenization.RESERVED_TOKENS)
    fns = {
        "cloze_wordpiece": lambda: tokenization._learn_like_tf_text(ranked, vocab_size, reserved),
        "tf_text_wordpiece": lambda: lib.learn(ranked, vocab_size, reserved, lower_thresh=1),
    }
    first, rounds = timing.alternating_rounds(fns, repeats)
    ours, theirs = first["cloze_wordpiece"][0], first["tf_text_wordpiece"][0]
    if ours != theirs:
        at = first_unequal(ours, theirs)
        where = (
            f"its length, {len(ours)} against {len(theirs)}"
            if at is None
            else f"token {at}: {ours[at]!r} against {theirs[at]!r}"
        )
        raise ValueError(
            f"{corpus}: Cloze's WordPiece vocabulary differs from tensorflow-text's at {where}"
        )
    best = timing.best_seconds(rounds)
    return {
        "vocab_size": vocab_size,
        "words": len(ranked),
        "tokens": len(ours),
        "cloze_seconds": best["cloze_wordpiece"],
        "tf_text_seconds": best["tf_text_wordpiece"],
        "ratio": best["tf_text_wordpiece"] / best["cloze_wordpiece"],
        "round_ratios": [r["tf_text_wordpiece"] / r["cloze_wordpiece"] for r in rounds],
        "round_seconds": rounds,
    }


def run(
    corpus,
    work_dir,
    num_merges: int = 8000,
    min_frequency: int = 2,
    repeats: int = 2,
    num_workers: int | None = None,
    wordpiece_vocab_size: int = 8000,
    wordpiece_repeats: int = 1,
) -> dict:
    """Times the four commands and the two WordPiece learners (see the module's docstring);
    raises ValueError when Cloze's codes file differs from subword-nmt's or its WordPiece
    vocabulary from tensorflow-text's. Returns the report (seconds of every side's best pass,
    ratios, every round's seconds, the byte-level merges Cloze and the peer have in common)."""
    from data_prep import bpe, parallel

    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    out = {side: work / side for side in ("cloze_bpe", "subword_nmt", "cloze_byte_level", "hf")}
    build_vocab = [sys.executable, "data_prep/build_vocab.py", f"--input_file={corpus}"]
    workers = parallel.worker_count(num_workers)  # every side's counting processes
    common = [
        f"--num_merges={num_merges}",
        f"--min_frequency={min_frequency}",
        f"--num_workers={workers}",
    ]
    hf_args = json.dumps(
        {
            "corpus": str(corpus),
            "out_dir": str(out["hf"]),
            "num_merges": num_merges,
            "min_frequency": min_frequency,
        }
    )
    commands = {
        "cloze_bpe": [
            *build_vocab,
            "--vocab_type=bpe",
            f"--vocab_file={out['cloze_bpe']}/codes.bpe",
            *common,
        ],
        # subword-nmt's own command line (its package's __main__-style module).
        "subword_nmt": [
            sys.executable,
            "-m",
            "subword_nmt.learn_bpe",
            "-i",
            str(corpus),
            "-o",
            f"{out['subword_nmt']}/codes.bpe",
            "-s",
            str(num_merges),
            "--min-frequency",
            str(min_frequency),
            "--num-workers",
            str(workers),
        ],
        "cloze_byte_level": [
            *build_vocab,
            "--vocab_type=byte_level_bpe",
            f"--vocab_file={out['cloze_byte_level']}/encoder.json",
            *common,
        ],
        "hf_tokenizers": [sys.executable, "-m", "bench.vocab_learning", hf_args],
    }
    out["subword_nmt"].mkdir(parents=True, exist_ok=True)
    fns = {side: (lambda c=cmd, s=side: _run(c, s)) for side, cmd in commands.items()}
    _, rounds = timing.alternating_rounds(fns, repeats)
    best = timing.best_seconds(rounds)

    codes = out["cloze_bpe"] / "codes.bpe"
    differ = first_difference(codes, out["subword_nmt"] / "codes.bpe")
    if differ is not None:
        raise ValueError(f"{codes}: Cloze's merges differ from subword-nmt's at {differ}")
    ours = bpe.read_merges(out["cloze_byte_level"] / "vocab.bpe")
    theirs = bpe.read_merges(out["hf"] / "merges.txt")
    same_prefix = first_unequal(ours, theirs)
    if same_prefix is None:
        same_prefix = min(len(ours), len(theirs))
    return {
        "corpus": str(corpus),
        "corpus_bytes": Path(corpus).stat().st_size,
        "num_merges": num_merges,
        "min_frequency": min_frequency,
        "num_workers": workers,
        "character_level": {
            "cloze_seconds": best["cloze_bpe"],
            "subword_nmt_seconds": best["subword_nmt"],
            "ratio": best["subword_nmt"] / best["cloze_bpe"],
            "codes_identical": True,
            "merges": len(bpe.read_merges(codes)),
            "round_ratios": [r["subword_nmt"] / r["cloze_bpe"] for r in rounds],
        },
        "byte_level": {
            "cloze_seconds": best["cloze_byte_level"],
            "hf_tokenizers_seconds": best["hf_tokenizers"],
            "ratio": best["hf_tokenizers"] / best["cloze_byte_level"],
            "cloze_merges": len(ours),
            "hf_merges": len(theirs),
            "merges_in_common": len(set(ours) & set(theirs)),
            "same_first_merges": same_prefix,
            "round_ratios": [r["hf_tokenizers"] / r["cloze_byte_level"] for r in rounds],
        },
        "round_seconds": rounds,
        "wordpiece": wordpiece_learners(corpus, wordpiece_vocab_size, wordpiece_repeats),
    }


def table_rows(result: dict) -> list[str]:
    """The README-style rows of run()'s report."""
    c, b, w = result["character_level"], result["byte_level"], result["wordpiece"]
    return [
        f"| BPE merges learned ({c['merges']:,}, codes identical): build_vocab.py | "
        f"{c['cloze_seconds']:.2f} s | subword-nmt {c['subword_nmt_seconds']:.2f} s | "
        f"{c['ratio']:.2f} |",
        f"| byte-level BPE merges learned ({b['cloze_merges']:,}; {b['merges_in_common']:,} in "
        f"common with the peer's): build_vocab.py | {b['cloze_seconds']:.2f} s | HF tokenizers "
        f"{b['hf_tokenizers_seconds']:.2f} s | {b['ratio']:.2f} |",
        f"| WordPiece vocabulary learned ({w['tokens']:,} tokens, identical; one process each): "
        f"tokenization's learner | {w['cloze_seconds']:.2f} s | tensorflow-text "
        f"{w['tf_text_seconds']:.2f} s | {w['ratio']:.2f} |",
    ]


def main(argv):
    from absl import flags

    f = flags.FLAGS
    result = run(
        f.corpus,
        f.work_dir,
        num_merges=f.num_merges,
        min_frequency=f.min_frequency,
        repeats=f.repeats,
        num_workers=f.num_workers,
        wordpiece_vocab_size=f.wordpiece_vocab_size,
        wordpiece_repeats=f.wordpiece_repeats,
    )
    if f.output_file:
        Path(f.output_file).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("\n".join(["| what | Cloze | peer | ratio |", "|---|---|---|---|", *table_rows(result)]))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        # The peer's child process: one JSON object of hf_byte_level_merges' arguments.
        hf_byte_level_merges(**json.loads(sys.argv[1]))
    else:
        from absl import app, flags

        flags.DEFINE_string("corpus", None, "Corpus: one sentence a line.")
        flags.DEFINE_string("work_dir", None, "Folder for every side's output files.")
        flags.DEFINE_integer("num_merges", 8000, "Merges each side learns.")
        flags.DEFINE_integer("min_frequency", 2, "Smallest pair count merged.")
        flags.DEFINE_integer("repeats", 2, "Timed rounds after the first pass of each side.")
        flags.DEFINE_integer(
            "num_workers", None, "Counting processes of build_vocab.py and subword-nmt (cores)."
        )
        flags.DEFINE_integer("wordpiece_vocab_size", 8000, "The WordPiece learners' target.")
        flags.DEFINE_integer(
            "wordpiece_repeats", 1, "Timed rounds of the WordPiece learners after their first."
        )
        flags.DEFINE_string("output_file", None, "Where to write the JSON report.")
        flags.mark_flags_as_required(["corpus", "work_dir"])
        app.run(main)
