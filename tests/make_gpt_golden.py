"""Writes tests/fixtures/gpt2_tiny/ and tests/fixtures/openai_gpt_tiny/: a tiny GPT-2 and a tiny
GPT-1 as Hugging Face transformers saves them, and what transformers computes with them.

The published GPT-2 and GPT-1 weights cannot be had offline (shared/DATA.md), so these are
published-format stand-ins whose computation no one here wrote: transformers' GPT2LMHeadModel and
OpenAIGPTLMHeadModel with seeded random weights (perturbed so every bias and LayerNorm matters),
and their outputs on a right-padded batch. The GPT-2 folder also holds a byte-level BPE (vocab.json
+ merges.txt) that Hugging Face `tokenizers` learned from the README, as GPT-2's own folder holds
its; its batch is that tokenizer's ids of TEXTS, and transformers' greedy `generate` continues a
prompt. The CI tests (tests/test_gpt_convert.py) convert both folders with convert_checkpoint.py
and compare Cloze against these numbers without installing PyTorch.

Files: config.json and model.safetensors (save_pretrained), GPT-2's vocab.json and merges.txt,
and golden.npz: the batch, every hidden state and every VOCAB_STRIDE-th logit column; GPT-2's also
the greedy continuation and GPT2Tokenizer's ids of every 25th README line (tokenizer_record).

Run once, and again whenever TEXTS or the sizes change (CPU torch from local wheels):
  pip install torch==2.13.0 transformers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_gpt_golden.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.make_xlnet_golden import report, seeded_model, tokenizer_record, training_text

ROOT = Path(__file__).resolve().parents[1]
GPT2_FOLDER = ROOT / "tests" / "fixtures" / "gpt2_tiny"
GPT1_FOLDER = ROOT / "tests" / "fixtures" / "openai_gpt_tiny"

# Case, numbers, punctuation, accents (bytes of a multi-byte character), leading spaces.
TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Crème brûlée in Zürich costs 12 francs!",
    "Hello world",
    "Generative pre-training of a language model on a diverse corpus of unlabeled text.",
)
PROMPT = "The language model"
NEW_TOKENS = 12
SIZES = dict(n_embd=16, n_layer=2, n_head=2, n_positions=64)
VOCAB_SIZE = 400
VOCAB_STRIDE = 5


def outputs(model, ids, mask, torch) -> dict:
    """golden.npz's hidden_states (L + 1, B, S, H) as transformers returns them (GPT-2's last
    one after ln_f) and lm_logits (B, S, V / VOCAB_STRIDE)."""
    import numpy as np

    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
            output_hidden_states=True,
        )  # fmt: skip
    return {
        "hidden_states": np.stack([h.numpy() for h in out.hidden_states]).astype(np.float32),
        "lm_logits": out.logits.numpy()[..., ::VOCAB_STRIDE].astype(np.float32),
    }


def make_gpt2(torch, transformers, np) -> None:
    from tokenizers import ByteLevelBPETokenizer

    GPT2_FOLDER.mkdir(parents=True, exist_ok=True)
    learner = ByteLevelBPETokenizer()
    learner.train_from_iterator(
        training_text().splitlines(), vocab_size=VOCAB_SIZE - 1, show_progress=False
    )
    learner.save_model(str(GPT2_FOLDER))
    vocab_file = GPT2_FOLDER / "vocab.json"
    vocab = json.loads(vocab_file.read_text())
    vocab["<|endoftext|>"] = len(vocab)  # last, as in GPT-2's vocabulary
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = transformers.GPT2Tokenizer.from_pretrained(str(GPT2_FOLDER))
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), activation_function="gelu_new", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=eos, eos_token_id=eos, **SIZES,
    )  # fmt: skip
    model = seeded_model(transformers.GPT2LMHeadModel, config, torch, GPT2_FOLDER)

    rows = [tokenizer(text)["input_ids"] for text in TEXTS]
    length = max(len(r) for r in rows)
    ids = np.array([r + [eos] * (length - len(r)) for r in rows], np.int64)
    mask = np.array([[1] * len(r) + [0] * (length - len(r)) for r in rows], np.int64)
    prompt = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        greedy = model.generate(
            prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
            pad_token_id=eos,
        )  # fmt: skip
    np.savez_compressed(
        GPT2_FOLDER / "golden.npz",
        texts=np.array(TEXTS),
        input_ids=ids,
        input_mask=mask,
        **outputs(model, ids, mask, torch),
        prompt=np.array(PROMPT),
        greedy_ids=greedy.numpy()[0],  # the prompt's ids, then NEW_TOKENS greedy ones
        **tokenizer_record(tokenizer),
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )
    report(GPT2_FOLDER)


def make_gpt1(torch, transformers, np) -> None:
    """GPT-1's weights only: its published tokenizer (a lower-cased word-end BPE after ftfy and
    spaCy) is not one Cloze reads, so the batch is seeded ids."""
    GPT1_FOLDER.mkdir(parents=True, exist_ok=True)
    config = transformers.OpenAIGPTConfig(
        vocab_size=VOCAB_SIZE, afn="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        **SIZES,
    )  # fmt: skip
    model = seeded_model(transformers.OpenAIGPTLMHeadModel, config, torch, GPT1_FOLDER)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB_SIZE, (3, 11)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    np.savez_compressed(
        GPT1_FOLDER / "golden.npz",
        input_ids=ids,
        input_mask=mask,
        **outputs(model, ids, mask, torch),
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )
    report(GPT1_FOLDER)


def main() -> None:
    import numpy as np
    import torch
    import transformers

    make_gpt2(torch, transformers, np)
    make_gpt1(torch, transformers, np)


if __name__ == "__main__":
    main()
