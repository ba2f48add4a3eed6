"""Writes tests/fixtures/xlnet_tiny/: a tiny XLNet as Hugging Face transformers saves it, and what
transformers computes with it.

No XLNet weights can be had offline (shared/DATA.md), so this makes a published-format stand-in
that no one here wrote the computation of: a SentencePiece model trained by the `sentencepiece`
library the way XLNet's README trains its spiece.model (unigram; <cls> <sep> <pad> <mask> <eod>
control symbols, <eop> user-defined), transformers' XLNetLMHeadModel with seeded random weights
(perturbed so that every bias and LayerNorm matters), and its outputs on a left-padded batch of
single texts and pairs packed by transformers' XLNetTokenizer. The CI tests
(tests/test_xlnet_convert.py) convert the folder with convert_checkpoint.py and compare Cloze
against these numbers without installing PyTorch.

Files: spiece.model, config.json and model.safetensors (XLNetLMHeadModel.save_pretrained), and
golden.npz: the batch's ids, segment ids, masks and outputs, and transformers' XLNetTokenizer's
ids of every 25th README line (without special tokens), as a flat array and offsets.

Run once, and again whenever TEXTS or the sizes change (CPU torch from local wheels):
  pip install torch==2.13.0 transformers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_xlnet_golden.py
"""

from __future__ import annotations

import io
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "fixtures" / "xlnet_tiny"

# Pairs (text_b None for a single text): case, accents (stripped by XLNet's preprocessing),
# `` '' quotes, numbers, punctuation, a word the vocabulary cannot hold whole.
TEXTS = (
    ("The quick brown fox jumps over the lazy dog.", None),
    ("Crème brûlée in Zürich costs 12 francs.", "``Quoted'' text, and more!"),
    ("Hello", "world"),
    ("Permutation language modelling predicts tokens in a random factorisation order.", None),
)
SIZES = dict(d_model=16, n_layer=2, n_head=2, d_inner=24)
VOCAB_STRIDE = 7


def training_text() -> str:
    """Sentences for the SentencePiece model: the README's prose and TEXTS. The README changes
    from session to session, so a rerun of a maker learns another vocabulary: rerun one only to
    change its fixture, and commit the files it writes together."""
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith(("|", "```", "#"))]
    return "\n".join(lines + [t for pair in TEXTS for t in pair if t])


def tokenizer_record(tokenizer) -> dict:
    """golden.npz's tokenizer_texts (every 25th training_text line), tokenizer_ids (their ids
    by `tokenizer`, without special tokens, one flat array) and tokenizer_offsets."""
    import numpy as np

    lines = training_text().splitlines()[::25]
    pieces = [tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines]
    return {
        "tokenizer_texts": np.array(lines),
        "tokenizer_ids": np.array([i for row in pieces for i in row], np.int32),
        "tokenizer_offsets": np.cumsum([0] + [len(row) for row in pieces]),
    }


def packed_pairs(tokenizer, pairs, pad_segment: int, left: bool) -> dict:
    """golden.npz's first, second, has_second and the pairs as `tokenizer` packs them (a single
    text alone), padded on the left or right to the longest: input_ids (with its pad id),
    segment_ids (with pad_segment) and input_mask."""
    import numpy as np

    encoded = [tokenizer(a, b, return_token_type_ids=True) for a, b in pairs]
    length = max(len(e["input_ids"]) for e in encoded)

    def pad(key, value):
        fills = [[value] * (length - len(e[key])) for e in encoded]
        rows = [f + e[key] if left else e[key] + f for f, e in zip(fills, encoded)]
        return np.array(rows, np.int64)

    return {
        "first": np.array([a for a, _ in pairs]),
        "second": np.array([b or "" for _, b in pairs]),
        "has_second": np.array([b is not None for _, b in pairs]),
        "input_ids": pad("input_ids", tokenizer.pad_token_id),
        "segment_ids": pad("token_type_ids", pad_segment),
        "input_mask": pad("attention_mask", 0),
    }


def seeded_model(model_class, config, torch, folder: Path | None = None):
    """model_class(config) made under torch.manual_seed(0), every parameter then moved by 0.1 x
    seeded noise (so that every bias and norm matters), in eval mode; saved into `folder` as
    save_pretrained writes it (without generation_config.json) when one is given."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if folder is not None:
        model.save_pretrained(str(folder), safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
    return model


def report(folder: Path) -> None:
    files = ", ".join(f"{p.name} {p.stat().st_size}" for p in sorted(folder.iterdir()))
    print(f"wrote {folder}: {files}")


def main() -> None:
    import numpy as np
    import sentencepiece as spm
    import torch
    import transformers

    FOLDER.mkdir(parents=True, exist_ok=True)
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text().splitlines()),
        model_writer=model_bytes,
        vocab_size=300,
        model_type="unigram",
        character_coverage=0.99995,
        control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>"],
        user_defined_symbols=["<eop>"],
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
    )
    (FOLDER / "spiece.model").write_bytes(model_bytes.getvalue())
    tokenizer = transformers.XLNetTokenizer.from_pretrained(str(FOLDER))

    config = transformers.XLNetConfig(
        vocab_size=tokenizer.vocab_size, ff_activation="gelu", untie_r=True, dropout=0.0,
        **SIZES,
    )  # fmt: skip
    model = seeded_model(transformers.XLNetLMHeadModel, config, torch, FOLDER)

    # Single texts are packed alone (`a <sep> <cls>`), padded on the left as XLNet's; padding
    # in XLNet's SEG_ID_PAD 4.
    batch = packed_pairs(tokenizer, TEXTS, 4, left=True)
    ids, segments, mask = batch["input_ids"], batch["segment_ids"], batch["input_mask"]
    # Two-stream inputs: a seeded factorisation order per row over its real positions, the
    # last two real positions of each row predicted.
    rng = np.random.default_rng(0)
    b, s = ids.shape
    perm_mask = np.ones((b, s, s), np.float32)
    targets = np.zeros((b, 2, s), np.float32)
    for row in range(b):
        real = np.flatnonzero(mask[row])
        order = rng.permutation(real)
        rank = {int(p): k for k, p in enumerate(order)}
        for i in real:
            for j in real:
                perm_mask[row, i, j] = 0.0 if rank[int(j)] < rank[int(i)] else 1.0
        for k, position in enumerate(real[-2:]):
            targets[row, k, position] = 1.0
    with torch.no_grad():
        kwargs = dict(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(segments),
            attention_mask=torch.tensor(mask),
        )
        content = model(**kwargs, output_hidden_states=True)
        query = model(
            **kwargs,
            perm_mask=torch.tensor(perm_mask),
            target_mapping=torch.tensor(targets),
        )
    np.savez_compressed(
        FOLDER / "golden.npz",
        **batch,
        perm_mask=perm_mask,
        target_mapping=targets,
        # (L + 1, B, S, H): the embeddings, then every layer's content stream
        hidden_states=np.stack([h.numpy() for h in content.hidden_states]).astype(np.float32),
        # every VOCAB_STRIDE-th vocabulary column, to keep the file small
        lm_logits=content.logits.numpy()[..., ::VOCAB_STRIDE].astype(np.float32),  # (B, S, .)
        plm_logits=query.logits.numpy()[..., ::VOCAB_STRIDE].astype(np.float32),  # (B, 2, .)
        **tokenizer_record(tokenizer),
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )
    report(FOLDER)


if __name__ == "__main__":
    main()
