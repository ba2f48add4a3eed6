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

from tests.make_xlnet_golden import (  # noqa: E402
    packed_pairs,
    report,
    tokenizer_record,
    training_text,
)

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
    np.savez_compressed(
        FOLDER / "golden.npz",
        **packed_pairs(tokenizer, PAIRS, 0, left=False),
        **tokenizer_record(tokenizer),
        versions=np.array(f"transformers {transformers.__version__}"),
    )
    report(FOLDER)


if __name__ == "__main__":
    main()
