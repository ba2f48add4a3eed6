"""Writes tests/fixtures/xlnet_qa_tiny/: transformers' XLNetForQuestionAnswering (the released
XLNet's beam-searched SQuAD head) on the encoder of tests/fixtures/xlnet_tiny, its heads seeded,
saved as transformers saves it, and what transformers computes with it on a batch of SQuAD
windows packed as data_prep/squad.py packs XLNet's (`question <sep> window <sep> <cls>`,
segments 0 / 1 / 2, right padded with id 0 in segment 0).

Files: config.json and model.safetensors (save_pretrained) and golden.npz: the windows
(input_ids, input_mask, segment_ids), p_mask (1: no answer can start or end there) and
cls_index given to transformers; under teacher forcing (start_positions, end_positions,
is_impossible) the start, end and answer-class logits of its pooler layers and its loss; and its
beam (start_top_log_probs, start_top_index, end_top_log_probs, end_top_index as it returns
them: probabilities, not logs, the ends flattened from (end rank, start rank), and cls_logits).

Run once, after tests/make_xlnet_golden.py (CPU torch from local wheels):
  HF_HUB_OFFLINE=1 python tests/make_xlnet_qa_golden.py
"""

from __future__ import annotations

from pathlib import Path

from tests.make_xlnet_golden import FOLDER as XLNET_FOLDER
from tests.make_xlnet_golden import report

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "fixtures" / "xlnet_qa_tiny"
TOP_N = 3
# (question, window, answer within the window or None)
WINDOWS = (
    ("Where did the cat sit?", "The cat sat on the mat in Zurich.", "on the mat"),
    ("Who baked it?", "Creme brulee is served at noon.", None),
    ("When is it served?", "It is served at noon, 12 francs.", "at noon"),
)


def windows(tokenizer, np) -> dict:
    """golden.npz's windows and targets: ids, mask, segments, p_mask, cls_index, and the answer's
    first and last piece (the <cls> for no answer), is_impossible."""
    sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
    rows, spans = [], []
    for question, window, answer in WINDOWS:
        q = tokenizer.encode(question, add_special_tokens=False)
        w = tokenizer.encode(window, add_special_tokens=False)
        ids = [*q, sep, *w, sep, cls]
        segments = [0] * (len(q) + 1) + [1] * (len(w) + 1) + [2]
        if answer is None:
            span = (len(ids) - 1, len(ids) - 1)
        else:
            a = tokenizer.encode(answer, add_special_tokens=False)
            offset = next(i for i in range(len(w)) if w[i : i + len(a)] == a)
            first = len(q) + 1 + offset
            span = (first, first + len(a) - 1)
        rows.append((ids, segments))
        spans.append(span)
    s = max(len(ids) for ids, _ in rows)
    out = {
        k: np.zeros((len(rows), s), np.int64) for k in ("input_ids", "input_mask", "segment_ids")
    }
    p_mask = np.ones((len(rows), s), np.float32)
    for r, (ids, segments) in enumerate(rows):
        n = len(ids)
        out["input_ids"][r, :n], out["input_mask"][r, :n], out["segment_ids"][r, :n] = (
            ids,
            1,
            segments,
        )
        allowed = [
            seg == 1 and k + 1 < n and segments[k + 1] == 1 for k, seg in enumerate(segments)
        ]
        p_mask[r, :n] = [0.0 if ok else 1.0 for ok in allowed]
        p_mask[r, n - 1] = 0.0  # the <cls>
    starts, ends = (np.array(x, np.int64) for x in zip(*spans))
    return {
        **out,
        "p_mask": p_mask,
        "cls_index": out["input_mask"].sum(1) - 1,
        "start_positions": starts,
        "end_positions": ends,
        "is_impossible": np.array([a is None for _, _, a in WINDOWS], np.float32),
    }


def main() -> None:
    import numpy as np
    import torch
    import transformers

    FOLDER.mkdir(parents=True, exist_ok=True)
    tokenizer = transformers.XLNetTokenizer.from_pretrained(str(XLNET_FOLDER))
    config = transformers.XLNetConfig.from_pretrained(
        str(XLNET_FOLDER), start_n_top=TOP_N, end_n_top=TOP_N
    )
    torch.manual_seed(1)
    model = transformers.XLNetForQuestionAnswering(config).eval()
    lm = transformers.XLNetLMHeadModel.from_pretrained(str(XLNET_FOLDER)).eval()
    model.transformer.load_state_dict(lm.transformer.state_dict())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("transformer."):
                p.add_(0.5 * torch.randn_like(p))
    model.save_pretrained(str(FOLDER), safe_serialization=True)
    (FOLDER / "generation_config.json").unlink(missing_ok=True)

    batch = windows(tokenizer, np)
    t = {k: torch.tensor(v) for k, v in batch.items()}
    encoder = dict(
        input_ids=t["input_ids"], attention_mask=t["input_mask"], token_type_ids=t["segment_ids"]
    )
    with torch.no_grad():
        h = model.transformer(**encoder).last_hidden_state
        start_logits = model.start_logits(h, p_mask=t["p_mask"])
        end_logits = model.end_logits(h, start_positions=t["start_positions"], p_mask=t["p_mask"])
        cls_logits = model.answer_class(
            h, start_positions=t["start_positions"], cls_index=t["cls_index"]
        )
        loss = model(
            **encoder, p_mask=t["p_mask"], cls_index=t["cls_index"],
            start_positions=t["start_positions"], end_positions=t["end_positions"],
            is_impossible=t["is_impossible"],
        ).loss  # fmt: skip
        beam = model(**encoder, p_mask=t["p_mask"], cls_index=t["cls_index"])
    np.savez_compressed(
        FOLDER / "golden.npz",
        **batch,
        train_start_logits=start_logits.numpy(),
        train_end_logits=end_logits.numpy(),
        train_cls_logits=cls_logits.numpy(),
        loss=loss.numpy(),
        **{
            k: getattr(beam, k).numpy()
            for k in (
                "start_top_log_probs",
                "start_top_index",
                "end_top_log_probs",
                "end_top_index",
                "cls_logits",
            )
        },  # fmt: skip
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )
    report(FOLDER)


if __name__ == "__main__":
    main()
