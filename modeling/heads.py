"""Output heads shared by the encoder families: masked LM, span boundary and classification.

Shapes: B batch, S length, H hidden, E embedding width (H for BERT, ALBERT's embedding_size),
P predictions per sequence, V vocab, C classes, R relative positions.
"""

from __future__ import annotations

import keras
from keras import ops

from modeling import layers, losses

gather_positions = layers.gather_positions  # float (B, S, H), int (B, P) -> (B, P, H)


def tied_table_views(table, compute_dtype, lookups: int = 1):
    """Views of a tied word table for its input lookups and its output projection:
    (list of `lookups` tensors or Nones for the embedding lookups, one tensor for the head(s)).
    `compute_dtype`: the dtype the model that calls this computes in (its `compute_dtype`).

    Forward they are the table itself. On TensorFlow their gradient is put together here: the
    head's dense (V, E) gradient plus the lookups' rows, added into it with one scatter
    (layers.add_rows: into the head gradient's own buffer outside XLA). Left to the tape,
    TensorFlow's aggregation turns the lookups' IndexedSlices into a zero-filled (V, E) tensor
    (UnsortedSegmentSum) and sums the two with an AddN: two more passes over the table, 31 MB
    at the small pretraining size. Measured inside the L4/H256 fp32 pretraining step on 2
    AVX-512 cores (medians of 24-30 alternating rounds of 10 steps, sixteenth session): 1.009
    and 1.013x with --encoder_branches=2, 0.997 and 1.005x without; at BERT-base 0.997-0.999x
    (copying its 94 MB table costs what the passes saved). Adding in place instead of into a
    copy (seventeenth session): a further 1.017x with branches, 1.008x without.
    The rows are added in another order than TensorFlow's, so the gradient equals its own up
    to float rounding.

    Only for a float32 table in a float32 model. Under a mixed precision policy the encoder a
    lookup view goes through would cast the whole view to its compute dtype on the way in
    (Keras converts a layer's array arguments) and look the ids up in that bfloat16 copy. So
    there, for other dtypes and on other backends, the head's view is `table` itself and the
    lookups' are None: an embeddings layer given None looks the ids up in its own variable,
    read as float32 (layers.lookup_rows; tables added with autocast off), and TensorFlow sums
    the gradients as it would without this function (passing the variable itself, the encoder
    would cast it likewise, and under Keras' JAX backend the lookup's gradient would be a
    bfloat16 scatter-add). The policy is asked, not read off the table: a table added with
    autocast off reads as float32 under a mixed policy too.
    """
    if keras.backend.backend() != "tensorflow" or compute_dtype != "float32":
        return [None] * lookups, table
    import tensorflow as tf

    value = tf.convert_to_tensor(table)
    if value.dtype != tf.float32:
        return [None] * lookups, table

    @tf.custom_gradient
    def views(t):
        def grad(*upstream):
            # Every view's gradient arrives (the tape fills an unused view's with zeros). The
            # head's, dense from its projection, plus any lookup's TensorFlow made dense; then
            # every IndexedSlices row added into that sum in one scatter.
            *from_lookups, from_head = upstream
            total = tf.convert_to_tensor(from_head)
            dense = [g for g in from_lookups if not isinstance(g, tf.IndexedSlices)]
            slices = [g for g in from_lookups if isinstance(g, tf.IndexedSlices)]
            if dense:
                total = tf.add_n([total, *dense])
            if slices:
                indices = tf.concat([tf.cast(g.indices, tf.int64) for g in slices], 0)
                values = tf.concat([g.values for g in slices], 0)
                total = layers.add_rows(total, indices[:, None], values)
            return total

        return [tf.identity(t) for _ in range(lookups + 1)], grad

    *lookup_views, head_view = views(value)
    return lookup_views, head_view


def tied_logits(x, embedding_table):
    """Scores vectors against every row of the tied embedding table: float (B, P, E) and
    (V, E) -> (B, P, V).

    On TensorFlow one 2-D matmul with the vocabulary as its rows, table (V, E) x rows (B*P, E)
    transposed -> (V, B*P), then one transpose to (B*P, V). Measured on 2 CPU cores at B 8,
    P 20, E 256, V 30522 (`python -m bench.kernel_speed`): TensorFlow's CPU matmul runs this
    shape (M = V) at about 160 GFLOP/s but the rows-first `matmul(x, table, transpose_b=True)`
    (M = B*P = 160, N = V) at about 45: forward + backward 85 ms that way, 64 ms this way
    (bench/results/kernels_2026-11-23_s7.json); the (B*P, V) transpose costs a few ms, and
    Grappler folds its gradient into the two backward matmuls. `matmul(x, transpose(table))`
    is worse still: its gradient transposes the whole (E, V) table gradient back every step.
    An einsum "bpe,ve->bpv" lowers to a batched matmul that broadcasts the table over B and
    sums B copies of its gradient. Other backends keep matmul + transpose.
    """
    table = ops.cast(ops.convert_to_tensor(embedding_table), x.dtype)  # autocast under bf16
    flat = ops.reshape(x, (-1, ops.shape(x)[-1]))  # (B*P, E)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        logits = tf.transpose(tf.linalg.matmul(table, flat, transpose_b=True))  # (B*P, V)
    else:
        logits = ops.matmul(flat, ops.transpose(table))  # (B*P, E) x (E, V) -> (B*P, V)
    return ops.reshape(logits, (*ops.shape(x)[:-1], ops.shape(table)[0]))  # (B, P, V)


def tied_xent_and_hits(x, embedding_table, bias, labels):
    """Cross-entropy and argmax hits of the tied projection plus a bias against labels: float
    (B, P, E), (V, E), (V,) or None (no bias) and int (B, P) -> float32 (B, P) and float32
    (B, P) of 1.0 / 0.0. The same as `losses.softmax_xent_and_hits(tied_logits(x, table) +
    bias, labels)`, which is what other backends run.

    On TensorFlow the logits stay vocabulary-major, (V, B*P) from tied_logits' fast matmul, and
    losses.biased_xent_and_hits_tf adds the bias and runs the softmax cross-entropy down each
    column (as two XLA kernels at the pretraining sizes), so tied_logits' (B*P, V) transpose is
    never made.
    Measured on 2 CPU cores at B*P = 160, V = 30522, forward + backward to x, the table and the
    bias (`python -m bench.kernel_speed`, "mlm_loss_ms"; bench/results/kernels_2026-11-23_s9_*):
    71.5 -> 65.0 ms at E 256; at E 768 190.6 against 191.6 ms (other runs: 197.0 / 178.7,
    222.5 / 227.7), equal within this host's noise (there the (V, E) table gradient dominates:
    a matmul writing 94 MB, ~85 ms in either layout). In the small pretraining step (L4/H256)
    that was 0.4-3% faster steps, alternating single steps of both forms in one process. Hits as
    softmax_xent_and_hits: a label whose logit equals its column's maximum.

    Without a bias (bias None: GPT's and T5's heads, which predict at every position)
    the softmax runs as losses.xent_and_hits_tf down the float32 columns. At every position
    this replaced an einsum "bth,vh->btv" to (B, T, V) logits and the row-wise loss: GPT's
    training step at L4/H256, GPT-2's 50,257 tokens, batch 8 x 128, on 2 AVX2 cores went
    2.55 -> 1.09 s (fifty-fourth session, bench/HISTORY.md); rows-first (N, V) logits, the
    bias-free fused XLA kernels and this form were within 5% of each other.
    """
    table = ops.cast(ops.convert_to_tensor(embedding_table), x.dtype)  # autocast under bf16
    if keras.backend.backend() != "tensorflow":
        logits = tied_logits(x, table)
        if bias is not None:
            logits = logits + ops.cast(bias, x.dtype)
        return losses.softmax_xent_and_hits(logits, labels)
    import tensorflow as tf

    shape = ops.shape(labels)
    flat = tf.reshape(x, (-1, tf.shape(x)[-1]))  # (N, E), N = B*P
    labels = tf.reshape(labels, (-1,))
    with tf.name_scope("tied_xent"):
        logits = tf.linalg.matmul(table, flat, transpose_b=True)  # (V, N), as tied_logits
        # The bias and the softmax down each column (in float32); the matmul's gradient is
        # TensorFlow's own.
        if bias is None:
            ce, hits = losses.xent_and_hits_tf(tf.cast(logits, tf.float32), labels, class_axis=0)
        else:
            ce, hits = losses.biased_xent_and_hits_tf(logits, bias, labels)
    return tf.reshape(ce, shape), tf.reshape(hits, shape)


@keras.saving.register_keras_serializable(package="cloze")
class MaskedLMHead(keras.layers.Layer):
    """BERT's MLM head: dense + activation + LayerNorm, then the tied input embedding and a bias.

    call(sequence, positions, embedding_table, label_ids=None):
      sequence float (B, S, H); positions int (B, P); embedding_table float (V, E), the encoder's
      word embeddings (weight tying, as the original `get_masked_lm_output`). With positions
      None, sequence is already the (B, P, H) vectors at the masked positions.
    Returns logits float (B, P, V), only at the P masked positions. With label_ids int (B, P),
    returns (logits, xent, hits), xent and hits float32 (B, P): the logits' cross-entropy and
    argmax hits against label_ids, computed from the same transformed vectors without the
    (B, P, V) logits (tied_xent_and_hits); inside a tf.function whichever a loss does not read
    is pruned.
    `hidden_size` is the transform's output width E: H for BERT, `embedding_size` for ALBERT,
    whose head projects back to the factorised embedding width (Lan et al. 2020, sec. 3.1).
    """

    def __init__(
        self,
        hidden_size,
        hidden_act="gelu",
        initializer_range=0.02,
        layer_norm_eps=layers.LAYER_NORM_EPSILON,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.transform = layers.Dense(hidden_size, hidden_act, initializer_range, name="transform")
        self.layer_norm = layers.layer_norm("layer_norm", layer_norm_eps)

    def build(self, input_shape, vocab_size=None):
        self.transform.build(input_shape)
        self.layer_norm.build((*input_shape[:-1], self.hidden_size))  # (..., E), not (..., H)
        if vocab_size is not None:
            self.output_bias = self.add_weight(
                name="output_bias", shape=(vocab_size,), initializer="zeros"
            )

    def call(self, sequence, positions, embedding_table, label_ids=None):
        x = sequence if positions is None else gather_positions(sequence, positions)  # (B, P, H)
        x = self.layer_norm(self.transform(x))  # (B, P, E)
        logits = tied_logits(x, embedding_table) + self.output_bias
        if label_ids is None:
            return logits
        return logits, *tied_xent_and_hits(x, embedding_table, self.output_bias, label_ids)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
            "layer_norm_eps": self.layer_norm_eps,
        }


@keras.saving.register_keras_serializable(package="cloze")
class ClassificationHead(keras.layers.Layer):
    """A linear classifier on a pooled vector (NSP, GLUE): float (B, H) -> logits float (B, C).

    Dropout, when wanted, is applied by the caller (fine-tuning adds it; NSP has none).
    """

    def __init__(self, num_classes, initializer_range=0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.initializer_range = initializer_range
        self.dense = layers.Dense(num_classes, initializer_range=initializer_range, name="dense")

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, pooled):
        return self.dense(pooled)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "initializer_range": self.initializer_range,
        }


@keras.saving.register_keras_serializable(package="cloze")
class SpanBoundaryHead(keras.layers.Layer):
    """SpanBERT's span boundary objective (Joshi et al. 2020, sec. 3.2).

    Each masked token x_i of a span (s, e) is predicted from the encoder outputs at the two
    boundary tokens just outside the span and a relative position embedding p_{i-s+1}:
      h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]
      h1 = LayerNorm(GeLU(W1 h0)),  y_i = LayerNorm(GeLU(W2 h1))
    then y_i goes through the tied input embedding and a bias of its own, as the MLM head.

    call(sequence, positions, left, right, embedding_table, boundaries):
      sequence float (B, S, H); positions, left, right int (B, P): each prediction's position and
      its span's boundary positions s - 1 and e + 1; embedding_table float (V, E); boundaries
      None, or the vectors at left and at right already gathered ((B, P, H) each), when
      sequence and right are not read (from_boundaries).
    Returns logits float (B, P, V).

    Args:
      hidden_size: H, the width of h1 and of the position embeddings (SpanBERT uses the model's).
      output_size: E, the width of y_i: the embedding table's width.
      max_span_length: R, rows of the relative position table; offsets past R - 1 share the last
        row. Spans are clipped at 10 words (sec. 3.1), which stays under 32 word pieces in practice.
    """

    def __init__(
        self,
        hidden_size,
        output_size,
        hidden_act="gelu",
        initializer_range=0.02,
        max_span_length=32,
        layer_norm_eps=layers.LAYER_NORM_EPSILON,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.max_span_length = max_span_length
        self.layer_norm_eps = layer_norm_eps
        self.dense_1 = layers.Dense(hidden_size, hidden_act, initializer_range, name="dense_1")
        self.layer_norm_1 = layers.layer_norm("layer_norm_1", layer_norm_eps)
        self.dense_2 = layers.Dense(output_size, hidden_act, initializer_range, name="dense_2")
        self.layer_norm_2 = layers.layer_norm("layer_norm_2", layer_norm_eps)

    def build(self, input_shape, vocab_size=None):
        lead = tuple(input_shape[:-1])
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_span_length, self.hidden_size),
            initializer=layers.truncated_normal(self.initializer_range),
            autocast=False,  # float32 under a mixed policy (layers.lookup_rows)
        )
        self.dense_1.build((*lead, input_shape[-1] * 2 + self.hidden_size))
        self.layer_norm_1.build((*lead, self.hidden_size))
        self.dense_2.build((*lead, self.hidden_size))
        self.layer_norm_2.build((*lead, self.output_size))
        if vocab_size is not None:
            self.output_bias = self.add_weight(
                name="output_bias", shape=(vocab_size,), initializer="zeros"
            )

    def call(self, sequence, positions, left, right, embedding_table, boundaries=None):
        if boundaries is None:
            boundaries = (gather_positions(sequence, left), gather_positions(sequence, right))
        offset = ops.clip(positions - left - 1, 0, self.max_span_length - 1)  # (B, P), 0-based
        h0 = ops.concatenate(
            [
                *boundaries,  # (B, P, H) each: the vectors at left and at right
                layers.lookup_rows(self.position_embeddings, offset, self.compute_dtype),
            ],
            axis=-1,
        )  # (B, P, 3H)
        h1 = self.layer_norm_1(self.dense_1(h0))  # (B, P, H)
        y = self.layer_norm_2(self.dense_2(h1))  # (B, P, E)
        return tied_logits(y, embedding_table) + self.output_bias

    def from_boundaries(self, left_vectors, right_vectors, positions, left, embedding_table):
        """call() with the vectors at the span boundaries already gathered, (B, P, H) each."""
        return self(None, positions, left, None, embedding_table, (left_vectors, right_vectors))

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "output_size": self.output_size,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
            "max_span_length": self.max_span_length,
            "layer_norm_eps": self.layer_norm_eps,
        }
