"""Writes tests/fixtures/t5_tiny/ and tests/fixtures/t5_v1_1_tiny/: a tiny T5 (relu, tied
output: t5-small's layout) and a tiny T5 v1.1 (gated-gelu, untied lm_head: FLAN-T5's) as Hugging
Face transformers saves them, and what transformers computes with them.

No T5 weights can be had offline (shared/DATA.md), so these are published-format stand-ins whose
computation no one here wrote: transformers' T5ForConditionalGeneration with seeded random
weights (perturbed so every norm matters), a SentencePiece model trained by the `sentencepiece`
library as T5's (unigram; pad 0, </s> 1, <unk> 2; identity normalisation to stay small) with
transformers' T5Tokenizer adding 10 sentinels, and their outputs on a padded batch: encoder
states, decoder states and logits under teacher forcing, and greedy `generate`. The CI tests
(tests/test_t5_convert.py) convert both folders with convert_checkpoint.py and compare Cloze
against these numbers without installing PyTorch.

Files: spiece.model and tokenizer_config.json (t5_tiny only), config.json and model.safetensors
(save_pretrained, then laid out as the published folders: see make), and
golden.npz: the batch (T5Tokenizer's ids, </s> appended), encoder_states (B, S, H),
decoder_states (B, T, H) after the final norm, every VOCAB_STRIDE-th logit column, greedy_ids
(B, up to 1 + NEW_TOKENS from the decoder start; a row that ended is padded), and
T5Tokenizer's ids of every 25th README line.

Run once, and again whenever TEXTS or the sizes change (CPU torch from local wheels):
  pip install torch==2.13.0 transformers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_t5_golden.py
"""

from __future__ import annotations

import io
from pathlib import Path

from tests.make_xlnet_golden import report, seeded_model, tokenizer_record, training_text

ROOT = Path(__file__).resolve().parents[1]
T5_FOLDER = ROOT / "tests" / "fixtures" / "t5_tiny"
V1_1_FOLDER = ROOT / "tests" / "fixtures" / "t5_v1_1_tiny"

# (source, target) pairs: T5's task prefixes, case, numbers, accents, punctuation.
PAIRS = (
    ("translate English to German: The house is wonderful.", "Das Haus ist wunderbar."),
    ("summarize: Crème brûlée in Zürich costs 12 francs!", "Dessert, 12 francs."),
    ("cola sentence: Hello world", "acceptable"),
)
SIZES = dict(d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=3, num_heads=2)
VOCAB_SIZE = 320  # beyond the tokenizer's 310, as t5-small's 32,128 beyond its 32,100
EXTRA_IDS = 10
NEW_TOKENS = 8
VOCAB_STRIDE = 5


def make_spiece(folder: Path) -> None:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text().splitlines()),
        model_writer=model,
        vocab_size=300,
        model_type="unigram",
        character_coverage=1.0,
        normalization_rule_name="identity",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
    )
    (folder / "spiece.model").write_bytes(model.getvalue())


def golden(model, tokenizer, torch, np) -> dict:
    batch = tokenizer([s for s, _ in PAIRS], padding=True, return_tensors="pt")
    labels = tokenizer([t for _, t in PAIRS], padding=True, return_tensors="pt")
    decoder_input_ids = model._shift_right(labels["input_ids"])
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_input_ids, output_hidden_states=True,
        )  # fmt: skip
        greedy = model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
            do_sample=False, max_new_tokens=NEW_TOKENS,
            use_cache=False,  # transformers 5.24's cache assumes num_decoder_layers = num_layers
        )  # fmt: skip
    return {
        "sources": np.array([s for s, _ in PAIRS]),
        "targets": np.array([t for _, t in PAIRS]),
        "input_ids": batch["input_ids"].numpy(),
        "input_mask": batch["attention_mask"].numpy(),
        "target_ids": labels["input_ids"].numpy(),
        "target_mask": labels["attention_mask"].numpy(),
        "decoder_input_ids": decoder_input_ids.numpy(),
        "encoder_states": out.encoder_last_hidden_state.numpy().astype(np.float32),
        "decoder_states": out.decoder_hidden_states[-1].numpy().astype(np.float32),
        "lm_logits": out.logits.numpy()[..., ::VOCAB_STRIDE].astype(np.float32),
        "greedy_ids": greedy.numpy(),
    }


def make(folder: Path, tokenizer, torch, transformers, np, feed_forward_proj: str) -> None:
    """A T5 (relu: the output tied to `shared` and scaled by d_model^-0.5) or a T5 v1.1
    (gated-gelu: its own lm_head, no scaling) saved as the published folders are, then read back
    by transformers, whose outputs are the golden ones."""
    import json

    from safetensors.numpy import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    v1_1 = feed_forward_proj != "relu"
    config = transformers.T5Config(
        vocab_size=VOCAB_SIZE, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1, feed_forward_proj=feed_forward_proj, **SIZES,
    )  # fmt: skip
    seeded_model(transformers.T5ForConditionalGeneration, config, torch, folder)
    # transformers 5.24 writes tie_word_embeddings true and scale_decoder_outputs; the published
    # folders (t5-small, google/t5-v1_1-*, FLAN-T5) hold neither, and a v1.1's own lm_head with
    # tie_word_embeddings false, which transformers reads as no scaling and an untied head.
    values = json.loads((folder / "config.json").read_text())
    values.pop("scale_decoder_outputs", None)
    values["tie_word_embeddings"] = not v1_1
    (folder / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
    if v1_1:
        arrays = load_file(folder / "model.safetensors")
        rng = np.random.default_rng(1)
        arrays["lm_head.weight"] = rng.normal(0, 1, arrays["shared.weight"].shape).astype("f4")
        save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = transformers.T5ForConditionalGeneration.from_pretrained(str(folder)).eval()
    assert model.config.scale_decoder_outputs == (not v1_1)
    np.savez_compressed(
        folder / "golden.npz",
        **golden(model, tokenizer, torch, np),
        **(tokenizer_record(tokenizer) if folder == T5_FOLDER else {}),
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )
    report(folder)


def main() -> None:
    import json

    import numpy as np
    import torch
    import transformers

    T5_FOLDER.mkdir(parents=True, exist_ok=True)
    make_spiece(T5_FOLDER)
    tokenizer_config = {"tokenizer_class": "T5Tokenizer", "extra_ids": EXTRA_IDS}
    (T5_FOLDER / "tokenizer_config.json").write_text(json.dumps(tokenizer_config) + "\n")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(T5_FOLDER))
    assert len(tokenizer) == 300 + EXTRA_IDS
    make(T5_FOLDER, tokenizer, torch, transformers, np, "relu")
    make(V1_1_FOLDER, tokenizer, torch, transformers, np, "gated-gelu")


if __name__ == "__main__":
    main()
