"""Writes tests/fixtures/minilm_golden.npz: the real all-MiniLM-L6-v2 run by Hugging Face PyTorch.

The golden numbers are what an implementation no one here wrote (transformers.BertModel and its
tokenizer) computes from the real published weights (shared/DATA.md), so the CI test
(tests/test_convert_checkpoint.py) checks Cloze against them without installing PyTorch.

Run once, and again whenever SENTENCES or the model changes (CPU torch from local wheels):
  pip install torch==2.13.0 transformers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_minilm_golden.py

To keep the committed file small it holds, for every real (non-padding) token, every hidden state
at 32 of the 384 features (every 12th), plus the full pooled output; the CI test compares all
features against its own numpy reference and these 32 against PyTorch.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from data_prep.fetch import minilm_dir  # noqa: E402 (tests import it from here)

GOLDEN = ROOT / "tests" / "fixtures" / "minilm_golden.npz"
FEATURE_STRIDE = 12

# Chosen to exercise the tokenizer (case, accents, punctuation, word pieces, CJK, digits, an
# unknown symbol), padding (different lengths) and segment ids (one sentence pair).
SENTENCES = (
    ("The quick brown fox jumps over the lazy dog.", None),
    ("Unaffable CAFÉ owners in Zürich don't serve crème brûlée!", None),
    ("How old are you?", "I'm 6 years old, and my sister is 12."),
    ("東京 is the capital of Japan; ~14 million people (2023) live there ☃.", None),
    ("hello", None),
)


def main() -> None:
    import numpy as np
    import torch
    import transformers

    folder = minilm_dir()
    tokenizer = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    firsts = [a for a, _ in SENTENCES]
    seconds = [b for _, b in SENTENCES]
    # The tokenizer takes pairs only all at once, so encode one by one and pad here.
    encoded = [tokenizer(a, b) if b is not None else tokenizer(a) for a, b in SENTENCES]
    length = max(len(e["input_ids"]) for e in encoded)

    def pad(key):
        return np.array([e[key] + [0] * (length - len(e[key])) for e in encoded], np.int64)

    ids, segments, mask = pad("input_ids"), pad("token_type_ids"), pad("attention_mask")
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids),
            token_type_ids=torch.tensor(segments),
            attention_mask=torch.tensor(mask),
            output_hidden_states=True,
        )
    hidden = np.stack([h.numpy() for h in out.hidden_states])  # (L+1, B, S, H)
    real = mask.astype(bool)
    features = np.arange(0, hidden.shape[-1], FEATURE_STRIDE)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        GOLDEN,
        first=np.array(firsts),
        second=np.array(["" if s is None else s for s in seconds]),
        has_second=np.array([s is not None for s in seconds]),
        input_ids=ids,
        segment_ids=segments,
        input_mask=mask,
        features=features,
        hidden_states=hidden[:, real][:, :, features].astype(np.float32),  # (L+1, T, 32)
        pooled_output=out.pooler_output.numpy().astype(np.float32),  # (B, H)
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes) with {int(real.sum())} tokens")


if __name__ == "__main__":
    main()
