"""Writes tests/fixtures/albert_spiece/: a SentencePiece model made as ALBERT's README makes its
30k-clean.model, and what transformers' AlbertTokenizer makes of text with it.

No ALBERT vocabulary can be had offline (shared/DATA.md). The model is trained by the
`sentencepiece` library with ALBERT's settings (unigram on lower-cased text; <pad> 0, <unk> 1;
[CLS] [SEP] [MASK] control symbols), at 300 pieces and with the identity normalisation (the
released model's nmt_nfkc table alone would be 240 KB; the library applies either, so the code
under test is the same). The CI tests (tests/test_xlnet_convert.py, ALBERT's part) compare Cloze's
tokenization and packing against these ids without installing transformers.

golden.npz: every 25th README line (tests/make_xlnet_golden.training_text) as AlbertTokenizer's
ids without special tokens (a flat array and offsets), and PAIRS packed by it
(`[CLS] a [SEP] b [SEP]`, token type ids), right padded with <pad>.

Run once, and again whenever PAIRS or the settings change (CPU torch from local wheels):
  pip install torch==2.13.0 transformers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_albert_spiece_golden.py
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.make_xlnet_golden import training_text  # noqa: E402

FOLDER = ROOT / "tests" / "fixtures" / "albert_spiece"
PAIRS = (
    ("The Quick Brown Fox.", "It jumps over 1,000 lazy dogs!"),
    ("Crème brûlée in ZÜRICH", None),
    ("``Quoted'' text", "and more"),
)


def main() -> None:
    import numpy as np
    import sentencepiece as spm
    import transformers

    FOLDER.mkdir(parents=True, exist_ok=True)
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text().lower().splitlines()),
        model_writer=model_bytes,
        vocab_size=300,
        model_type="unigram",
        character_coverage=0.99995,
        normalization_rule_name="identity",
        control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        pad_id=0,
        unk_id=1,
        bos_id=-1,
        eos_id=-1,
    )
    (FOLDER / "spiece.model").write_bytes(model_bytes.getvalue())
    tokenizer = transformers.AlbertTokenizer.from_pretrained(str(FOLDER))
    lines = training_text().splitlines()[::25]
    pieces = [tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines]
    encoded = [tokenizer(a, b, return_token_type_ids=True) for a, b in PAIRS]
    length = max(len(e["input_ids"]) for e in encoded)

    def right_pad(key, value):
        return np.array([e[key] + [value] * (length - len(e[key])) for e in encoded], np.int64)

    np.savez_compressed(
        FOLDER / "golden.npz",
        first=np.array([a for a, _ in PAIRS]),
        second=np.array([b or "" for _, b in PAIRS]),
        has_second=np.array([b is not None for _, b in PAIRS]),
        input_ids=right_pad("input_ids", tokenizer.pad_token_id),
        segment_ids=right_pad("token_type_ids", 0),
        input_mask=right_pad("attention_mask", 0),
        tokenizer_texts=np.array(lines),
        tokenizer_ids=np.array([i for row in pieces for i in row], np.int32),
        tokenizer_offsets=np.cumsum([0] + [len(row) for row in pieces]),
        versions=np.array(f"transformers {transformers.__version__}"),
    )
    files = ", ".join(f"{p.name} {p.stat().st_size}" for p in sorted(FOLDER.iterdir()))
    print(f"wrote {FOLDER}: {files}")


if __name__ == "__main__":
    main()
