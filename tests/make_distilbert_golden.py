"""Writes tests/fixtures/distilbert_tiny/: a tiny DistilBertForMaskedLM as Hugging Face
transformers saves it, its WordPiece vocab.txt, and what transformers computes with it.

The published distilbert-base-uncased cannot be had offline (shared/DATA.md), so this is a
published-format stand-in whose computation no one here wrote: transformers' DistilBertModel
inside DistilBertForMaskedLM with seeded random weights (perturbed so every bias and LayerNorm
matters), run on a right-padded batch that DistilBertTokenizer tokenized. The CI tests
(tests/test_distilbert_convert.py) convert the folder with convert_checkpoint.py and compare
Cloze against these numbers without installing PyTorch.

Files: config.json and model.safetensors (save_pretrained), vocab.txt, and golden.npz: the
texts, the tokenizer's input_ids and attention_mask, and every hidden state (embeddings, then
each layer) as DistilBertModel returns them.

Run once, and again whenever TEXTS or the sizes change (CPU torch from local wheels):
  pip install torch==2.13.0 transformers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_distilbert_golden.py
"""

from __future__ import annotations

from pathlib import Path

from tests.make_xlnet_golden import report, seeded_model

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "fixtures" / "distilbert_tiny"

TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "A distilled model keeps most of the teacher.",
    "Hello world",
)
RESERVED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SIZES = dict(dim=16, n_layers=2, n_heads=2, hidden_dim=24, max_position_embeddings=32)


def vocabulary() -> list[str]:
    """The reserved tokens, then every lower-cased word and punctuation mark of TEXTS, two
    continuation pieces so some word splits, and the words of the two sentences the fine-tuning
    test learns (tests/helpers.two_sentences_args)."""
    words = sorted({w.strip(".").lower() for t in TEXTS for w in t.split()} | {".", "##s"})
    return RESERVED + [w for w in words if w] + ["dist", "##illed", "cat", "sat", "barked"]


def main() -> None:
    import numpy as np
    import torch
    import transformers

    FOLDER.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    (FOLDER / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = transformers.DistilBertConfig(
        vocab_size=len(vocab), dropout=0.0, attention_dropout=0.0, activation="gelu", **SIZES
    )
    model = seeded_model(transformers.DistilBertForMaskedLM, config, torch, FOLDER)
    tokenizer = transformers.DistilBertTokenizer(str(FOLDER / "vocab.txt"))
    batch = tokenizer(list(TEXTS), padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.distilbert(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
            output_hidden_states=True,
        )  # fmt: skip
    np.savez_compressed(
        FOLDER / "golden.npz",
        texts=np.array(TEXTS),
        input_ids=batch["input_ids"].numpy().astype(np.int32),
        input_mask=batch["attention_mask"].numpy().astype(np.int32),
        hidden_states=np.stack([h.numpy() for h in out.hidden_states]).astype(np.float32),
    )
    report(FOLDER)


if __name__ == "__main__":
    main()
