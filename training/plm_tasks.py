"""The permutation language-model task (XLNet) for the Trainer, as sums.

See training/trainer.py for the contract (sums_fn, loss_terms, metrics).
"""

from __future__ import annotations

import tensorflow as tf

from modeling import flops, losses, xlnet
from training.trainer import Task, float_shape

PLM_INPUTS = ("input_ids", "perm_mask", "target_mapping")


class SegmentMemory:
    """XLNet's segment recurrence in training (sec. 2.5, Transformer-XL's memory): what every
    layer read for a batch row's last mem_len positions, read by the same row of the next batch
    (its stream continues the text: lm_data.stream_dataset). Create under the strategy's scope.

    reuse_len: with two-segment records (data_prep/xlnet_data.py), only each record's first
    reuse_len positions are kept: the next record continues the text from there.

    The state is the whole global batch's, float32 (L, rows, mem_len, H), plus how many of the
    last slots hold something (0 at the start: the first batch reads an empty memory, as the
    released code's first step). Each replica reads its rows (replica r: rows r x b .. r x b + b,
    the slice trainer.slice_for_replica gives it) and writes them back gathered from every
    replica, so each worker's checkpoint holds the whole state and a resume reads the memory an
    uninterrupted run would have, under any strategy. The released TPU code keeps it per core in
    variables the same way; the all-gather costs one memory's size a step in communication.
    """

    def __init__(self, config: xlnet.XLNetConfig, rows: int, mem_len: int, reuse_len: int = 0):
        if mem_len < 1 or rows < 1:
            raise ValueError(f"SegmentMemory: mem_len {mem_len} and rows {rows} must be >= 1")
        self.mem_len, self.reuse_len = mem_len, reuse_len
        shape = (config.n_layer, rows, mem_len, config.d_model)
        # ONLY_FIRST_REPLICA: every replica assigns the same gathered value, copied from the first.
        once = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.states = tf.Variable(
            tf.zeros(shape), trainable=False, aggregation=once, name="segment_memory"
        )
        self.filled = tf.Variable(
            0, dtype=tf.int32, trainable=False, aggregation=once, name="segment_memory_filled"
        )

    @property
    def variables(self) -> list:
        return [self.states, self.filled]

    def reset(self) -> None:
        """Empties the memory (the next read sees no slot)."""
        self.filled.assign(0)

    def read(self, rows) -> tuple[list, tf.Tensor]:
        """This replica's memory for its `rows` batch rows: L float32 (rows, M, H), and the
        mem_mask int32 (rows, M) of XLNetModel (1 at the filled slots, the last ones)."""
        start = tf.distribute.get_replica_context().replica_id_in_sync_group * rows
        mems = tf.unstack(self.states[:, start : start + rows])
        filled = tf.range(self.mem_len) >= self.mem_len - self.filled
        return mems, tf.broadcast_to(tf.cast(filled, tf.int32), (rows, self.mem_len))

    def write(self, mems: list, encoder_outputs: list, length) -> None:
        """Keeps the memory for the next batch: xlnet.cache_mems of this replica's `mems` (read)
        and the layers' inputs over its block of `length` positions (the first reuse_len of
        them with a reuse_len), gathered over replicas."""
        kept = xlnet.cache_mems(mems, encoder_outputs, self.mem_len, self.reuse_len)
        new = tf.cast(tf.stack(kept), tf.float32)
        ctx = tf.distribute.get_replica_context()
        if ctx.num_replicas_in_sync > 1:
            new = ctx.all_gather(new, axis=1)
        self.states.assign(new)
        added = self.reuse_len or tf.cast(length, tf.int32)
        self.filled.assign(tf.minimum(self.filled + added, self.mem_len))


def permutation_lm_task(
    model, memory: SegmentMemory | None = None, eval_memory: SegmentMemory | None = None
) -> Task:
    """XLNet's objective with partial prediction (Yang et al. 2019, sec. 2.3, eq. 5): the mean
    cross-entropy of the predicted tokens given the content of the positions before them in the
    sampled order. `model` an xlnet.XLNetPretrainer; batches from
    data_prep/permutation.permutation_lm_features (or two_segment_features: their segment_ids
    go to the model too, as the bidirectional data's `backward` flags). Perplexity is exp(plm_loss).

    memory: a SegmentMemory: every training step also reads the memory its rows' streams left
    and updates it (the task's state, in the training checkpoints). Each step must see its
    whole batch at once (no gradient accumulation or parallel micro-batches: their parts would
    each move the memory). eval_memory: the same for evaluation batches (Transformer-XL's
    evaluation over streams), emptied before every evaluation; without it evaluation reads
    none."""

    def sums_fn(batch, training):
        inputs = {k: batch[k] for k in (*PLM_INPUTS, "segment_ids", "backward") if k in batch}
        state = memory if training else eval_memory
        if state is not None:
            mems, mem_mask = state.read(tf.shape(batch["input_ids"])[0])
            inputs |= {"mems": mems, "mem_mask": mem_mask}
        out = model(inputs, training=training)
        if state is not None:
            state.write(mems, out["encoder_outputs"], tf.shape(batch["input_ids"])[1])
        return losses.masked_lm_sums(
            out["plm_logits"], batch["target_ids"], batch["target_weights"]
        )

    def flops_fn(batch):
        """3 forward passes (modeling/flops.py) of the batch: target_mapping (B, P, S), each
        row reading the memory's mem_len slots, with segment terms where it has segment_ids."""
        b, p, s = tf.unstack(float_shape(batch, "target_mapping"))
        m = 0 if memory is None else memory.mem_len
        segments = "segment_ids" in batch
        return 3.0 * flops.xlnet_pretraining_flops(model.config, s, p, b, m, segments)

    return Task(
        model=model,
        sums_fn=sums_fn,
        loss_terms=[("loss_sum", "weight")],
        metrics={"plm_loss": ("loss_sum", "weight"), "plm_accuracy": ("correct", "weight")},
        flops_fn=flops_fn,
        state=[] if memory is None else memory.variables,
        eval_start=None if eval_memory is None else eval_memory.reset,
    )
