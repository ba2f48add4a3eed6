"""The Hugging Face PyTorch peer of the pretraining benchmark, run by bench/peer_worker.py.

transformers' BertForPreTraining (MLM + NSP heads, the MLM decoder tied to the word table), built
from the same BertConfig as Cloze's side (modeling/checkpoints.bert_config_to_hf_config: the
same computation, BERT's tanh GELU as "gelu_new", dropout 0.1), trained the way a PyTorch user
trains it: eager forward with `labels` (-100 where no loss is read) and `next_sentence_label`,
backward, global-norm clipping at 1.0, torch.optim.AdamW with BERT's settings (lr 1e-4, eps
1e-6, weight decay 0.01 except LayerNorm and bias) and a linear decay. Under --precision=bf16
the forward runs in torch.autocast("cpu", bfloat16), PyTorch's counterpart of Keras'
mixed_bfloat16 policy (float32 weights and optimizer); under fp16 in torch.autocast's float16
with torch.amp.GradScaler's dynamic loss scaling at its defaults, used as transformers' Trainer
uses it (scale the loss, unscale before clipping, a step it skips on an overflow).
BertForPreTraining projects every position to the vocabulary, not only the masked ones: that
is the model users run, so it is what is timed, and pretrain_throughput counts those FLOPs in
its `hfu`. torch.compile
(inductor) gave no gain at L4/H256 batch 8 on the thirty-ninth session's host (0.80-0.83 s a
step against 0.74-0.87 eager, after 49 s of compiling), so the eager model is timed.
Peer with head="classifier" is the fine-tuning benchmark's side (BertForSequenceClassification,
2 labels, lr 2e-5): on its one full batch, or on an epoch's batches of unpadded examples
(Peer.load) that transformers' DataCollatorWithPadding pads to each batch's longest example at
every step, as a Trainer with a tokenizer does. With device "cuda" (bench/gpu_mfu.py's side on
a GPU) the model, batch, autocast and GradScaler are CUDA's, float32 products may use TF32 as
JAX's default precision does there (torch.set_float32_matmul_precision("high"), the setting
transformers' --tf32 makes), and train() returns only when the GPU has finished its steps.
Encoder is the inference benchmark's side:
transformers' BertModel holding Cloze's encoder's weights. Installed by
bench/requirements-torch.txt.
"""

from __future__ import annotations

DEVICES = ("cpu", "cuda")  # where Peer trains (bench/peer_worker.py checks a build's device)


def encoder_inputs(batch: dict, torch) -> dict:
    """input_ids, input_mask and segment_ids (Cloze's feature names, numpy or nested lists) as
    transformers' BERT keyword arguments, int64 tensors."""
    import numpy as np

    def tensor(name):
        return torch.tensor(np.asarray(batch[name], np.int64))

    return {
        "input_ids": tensor("input_ids"),
        "attention_mask": tensor("input_mask"),
        "token_type_ids": tensor("segment_ids"),
    }


def torch_batch(batch: dict, torch):
    """The benchmark's pretraining batch (TFRecord feature names, numpy or nested lists) as
    BertForPreTraining's keyword arguments: `labels` is -100 but at the masked positions, which
    hold the masked ids (masked_lm_weights 0 leaves a position out, as in the original's loss)."""
    import numpy as np

    ids = np.asarray(batch["input_ids"], np.int64)
    positions = np.asarray(batch["masked_lm_positions"], np.int64)
    targets = np.asarray(batch["masked_lm_ids"], np.int64)
    weights = np.asarray(batch["masked_lm_weights"], np.float32)
    labels = np.full_like(ids, -100)
    rows = np.repeat(np.arange(ids.shape[0])[:, None], positions.shape[1], axis=1)
    keep = weights > 0
    labels[rows[keep], positions[keep]] = targets[keep]
    return {
        **encoder_inputs(batch, torch),
        "labels": torch.tensor(labels),
        "next_sentence_label": torch.tensor(
            np.asarray(batch["next_sentence_labels"], np.int64).reshape(-1)
        ),
    }


def classifier_batch(batch: dict, torch):
    """A fine-tuning batch (run_classifier's feature names) as BertForSequenceClassification's
    keyword arguments."""
    import numpy as np

    return {
        **encoder_inputs(batch, torch),
        "labels": torch.tensor(np.asarray(batch["label_ids"], np.int64).reshape(-1)),
    }


class Peer:
    """BertForPreTraining, its optimizer and one fixed batch (module docstring). With head
    "classifier": BertForSequenceClassification with 2 labels on a fine-tuning batch
    (run_classifier's feature names: label_ids), at run_classifier's learning rate, 2e-5."""

    def __init__(
        self,
        config: dict,
        batch: dict,
        precision: str,
        seed: int,
        threads: int,
        head: str = "pretraining",
        device: str = "cpu",
    ):
        import torch
        import transformers

        if device == "cuda":  # another than DEVICES is refused by bench/peer_worker.py
            if not torch.cuda.is_available():
                raise RuntimeError(f"device 'cuda': PyTorch {torch.__version__} sees no CUDA GPU")
            torch.set_float32_matmul_precision("high")  # TF32 in fp32, as JAX's default
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.torch, self.device = torch, device
        hf_config = transformers.BertConfig(**config, num_labels=2)
        if head == "pretraining":
            self.model = transformers.BertForPreTraining(hf_config)
            self.batch = torch_batch(batch, torch)
        else:
            self.model = transformers.BertForSequenceClassification(hf_config)
            self.batch = classifier_batch(batch, torch)
        self.model.to(device).train()
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        no_decay = [p for n, p in self.model.named_parameters() if _no_decay(n)]
        decay = [p for n, p in self.model.named_parameters() if not _no_decay(n)]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
            lr=1e-4 if head == "pretraining" else 2e-5,
            betas=(0.9, 0.999),
            eps=1e-6,
        )
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: max(0.0, 1.0 - step / 10_000)
        )
        self.precision = precision
        # fp16's dynamic loss scaling (disabled, a pass-through, in fp32 and bf16).
        self.scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
        self.data = {}  # load()'s epochs: {name: (batches, collator)}
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        if device == "cuda":
            self.versions["cuda_device"] = torch.cuda.get_device_name()

    def get_num_threads(self) -> int:
        return self.torch.get_num_threads()

    def count_params(self) -> int:
        # Tied weights (the MLM decoder is the word table) are one parameter, counted once.
        return sum(p.numel() for p in self.model.parameters())

    def load(self, name: str, batches: list, vocab: str, pad_to_multiple_of: int) -> list:
        """Keeps `batches` (lists of examples {"input_ids", "token_type_ids", "labels"}, unpadded)
        as data `name` for train(); `vocab`: the WordPiece vocabulary file of the tokenizer whose
        padding DataCollatorWithPadding applies, to the batch's longest example rounded up to
        `pad_to_multiple_of` (transformers' run_glue.py passes 8 under fp16). Returns the
        lengths the batches pad to."""
        import transformers

        tokenizer = transformers.BertTokenizerFast(vocab_file=vocab, do_lower_case=True)
        collator = transformers.DataCollatorWithPadding(
            tokenizer, pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt"
        )
        self.data[name] = (batches, collator)
        return [int(collator(b)["input_ids"].shape[1]) for b in batches]

    def step(self, batch: dict) -> tuple:
        """One train step: its loss (a tensor: a GPU is not waited for until train() ends), and
        whether fp16's scaler found an overflow (the update skipped, the scale halved; reading
        the scale waits for the GPU, as transformers' Trainer does under fp16)."""
        torch = self.torch
        autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        enabled = autocast is not None
        with torch.autocast(self.device, dtype=autocast or torch.float32, enabled=enabled):
            loss = self.model(**batch).loss
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), self.scaler.get_scale() < scale

    def train(self, steps: int, data: str | None = None) -> dict:
        """`steps` steps on the fixed batch, or with `data` on the batches load() kept under that
        name (in order, from the first, padded by the collator in the step's time). Returns
        {"losses": [...], "overflow": [...]}, a flag per step (peer_worker's train reply)."""
        if data is None:
            out = [self.step(self.batch) for _ in range(steps)]
        else:
            batches, collator = self.data[data]
            out = [
                self.step(
                    {k: v.to(self.device) for k, v in collator(batches[i % len(batches)]).items()}
                )
                for i in range(steps)
            ]
        losses = self.torch.stack([loss for loss, _ in out]).float().cpu()  # waits for the GPU
        return {"losses": losses.tolist(), "overflow": [bool(o) for _, o in out]}


def _no_decay(name: str) -> bool:
    """BERT's AdamW leaves LayerNorm and bias out of the weight decay (training/optimization)."""
    return "LayerNorm" in name or name.endswith("bias")


class Encoder:
    """The inference side: transformers' BertModel loaded from a folder Cloze's converter wrote
    (checkpoints.save_hf_bert: the same weights as Cloze's encoder), in eval mode under
    torch.inference_mode, fed one fixed batch (input_ids, input_mask, segment_ids)."""

    def __init__(self, model_dir: str, batch: dict, threads: int):
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = transformers.BertModel.from_pretrained(model_dir).eval()
        self.inputs = encoder_inputs(batch, torch)
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}

    def get_num_threads(self) -> int:
        return self.torch.get_num_threads()

    def count_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def infer(self, steps: int, save: str | None = None) -> None:
        """`steps` forward passes; the last one's outputs to the .npz file `save` if given."""
        import numpy as np

        with self.torch.inference_mode():
            for _ in range(steps):
                out = self.model(**self.inputs)
        if save:
            np.savez(
                save,
                sequence_output=out.last_hidden_state.numpy(),
                pooled_output=out.pooler_output.numpy(),
            )
