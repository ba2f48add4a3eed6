"""Writes tests/fixtures/xlnet_tiny/mems_golden.npz: what transformers' XLNetLMHeadModel computes
with its segment recurrence (Transformer-XL's memory, XLNet sec. 2.5) on the tiny XLNet that
tests/make_xlnet_golden.py made.

Three consecutive segments of seeded ids run one after another, each reading the memory the ones
before it left (mem_len MEM_LEN, the first REUSE_LEN positions of a segment cached, as
transformers' cache_mem and the released code's _cache_mem). The third carries segment ids (the
memory counts as segment 0 in both codes), a padded position, and a factorisation order for the
two-stream pass. The same three run again with the release's bidirectional data (bi_data: the
second row of the batch reads its text backward, its relative distances negated): bi_*.
tests/test_xlnet_convert.py compares Cloze's memory against these numbers
without installing PyTorch. The fixture's weights and config are read, not rewritten.

Run once, and again whenever the segments or sizes change (CPU torch from local wheels):
  pip install torch==2.13.0 transformers  # in one command, ideally in a separate venv
  HF_HUB_OFFLINE=1 python tests/make_xlnet_mems_golden.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "fixtures" / "xlnet_tiny"
MEM_LEN, REUSE_LEN = 6, 5
BATCH, LENGTH, SEGMENTS, PREDICTED = 2, 8, 3, 2
VOCAB_STRIDE = 7


def main() -> None:
    import numpy as np
    import torch
    import transformers

    model = transformers.XLNetLMHeadModel.from_pretrained(
        str(FOLDER), mem_len=MEM_LEN, reuse_len=REUSE_LEN
    ).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(7, model.config.vocab_size, (SEGMENTS, BATCH, LENGTH))
    segment_ids = np.zeros((BATCH, LENGTH), np.int64)
    segment_ids[:, LENGTH // 2 :] = 1
    input_mask = np.ones((BATCH, LENGTH), np.int64)
    input_mask[1, 0] = 0
    perm_mask = np.ones((BATCH, LENGTH, LENGTH), np.float32)
    target_mapping = np.zeros((BATCH, PREDICTED, LENGTH), np.float32)
    for row in range(BATCH):
        rank = np.argsort(rng.permutation(LENGTH))  # rank[i]: the step of position i
        perm_mask[row] = (rank[None, :] >= rank[:, None]).astype(np.float32)
        for k, position in enumerate(sorted(np.argsort(rank)[-PREDICTED:])):
            target_mapping[row, k, position] = 1.0
    record = {}
    for prefix, bi_data in (("", False), ("bi_", True)):
        model.transformer.bi_data = bi_data  # read at each call, as the config's bi_data
        run_segments(model, prefix, ids, segment_ids, input_mask, perm_mask, target_mapping,
                     record)  # fmt: skip
    np.savez_compressed(
        FOLDER / "mems_golden.npz",
        input_ids=ids,
        segment_ids=segment_ids,
        input_mask=input_mask,
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        mem_len=MEM_LEN,
        reuse_len=REUSE_LEN,
        **{k: v.astype(np.float32) for k, v in record.items()},
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )
    print(f"wrote {FOLDER / 'mems_golden.npz'}")


def run_segments(model, prefix, ids, segment_ids, input_mask, perm_mask, target_mapping, record):
    """The SEGMENTS segments one after another, each reading the memory the ones before left;
    their hidden states, logits and memories go into record under `prefix`."""
    import numpy as np
    import torch

    mems = None
    with torch.no_grad():
        for n in range(SEGMENTS):
            last = n == SEGMENTS - 1
            kwargs = dict(input_ids=torch.tensor(ids[n]), mems=mems, use_mems=True)
            if last:
                kwargs["token_type_ids"] = torch.tensor(segment_ids)
                kwargs["attention_mask"] = torch.tensor(input_mask)
            out = model(**kwargs, output_hidden_states=True)
            # transformers keeps memory time-major, (M, B, H) per layer.
            record[f"{prefix}hidden_states_{n}"] = np.stack([h.numpy() for h in out.hidden_states])
            record[f"{prefix}lm_logits_{n}"] = out.logits.numpy()[..., ::VOCAB_STRIDE]
            if last:
                query = model(
                    **kwargs,
                    perm_mask=torch.tensor(perm_mask),
                    target_mapping=torch.tensor(target_mapping),
                )
                record[f"{prefix}plm_logits"] = query.logits.numpy()[..., ::VOCAB_STRIDE]
            mems = out.mems
            record[f"{prefix}mems_{n}"] = np.stack([m.numpy().transpose(1, 0, 2) for m in mems])


if __name__ == "__main__":
    main()
