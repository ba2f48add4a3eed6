"""Matrix-multiply FLOPs of what the networks compute, counted from their shapes.

2 FLOPs per multiply-add of every matrix product; embedding lookups, softmaxes, LayerNorms,
activations and the optimizer update are left out (not matrix products; a few percent at these
sizes). A training step costs 3 forward passes (the backward pass computes gradients with
respect to activations and to weights, each as costly as the forward; Kaplan et al. 2020 sec.
2.1, ELECTRA's appendix D counts the same way). A frozen encoder under a trained head (run_ner's
feature modes, ELMo's downstream models) costs 1: no trained weight lies below it, so its
backward pass is skipped (training/finetune_tasks.flops_fn; tests/test_flops.py checks both
against TensorFlow's gradient graph).

Per sequence of S tokens, P predictions, an encoder of width H, L layers, FFN width I,
embedding width E and vocabulary V (forward):
  encoder        L x (8 S H^2 + 4 S^2 H + 4 S H I)   (Q, K, V and output projections; Q K^T and
                                                      the probabilities x V; the FFN), plus
                                                      2 S E H for the E -> H embedding
                                                      projection when E != H. A last layer
                                                      read only at Q positions (BertEncoder's
                                                      output_positions) costs
                                                      4 S H^2 + 4 Q H^2 + 4 Q S H + 4 Q H I
                                                      (K and V stay at all S positions).
  MLM head       2 P H E' + 2 P E' V                 (the transform to the output width E',
                                                      the tied decoder; E' = E for ALBERT and
                                                      ELECTRA's generator, else H)
  NSP / SOP      2 H^2 + 4 H                         (pooler and 2-way classifier on [CLS])
  span boundary  2 P (3 H) H + 2 P H E' + 2 P E' V   (SpanBERT's two-layer head over the
                                                      boundary pair and the relative position,
                                                      then the tied decoder)
  causal LM      the encoder (every layer at all S) + 2 S H V (the tied decoder everywhere);
                 GPT-1's classifier adds 2 H C at the extract token
  fine-tuning    the encoder, then: a sentence classifier's linear layer 2 H C on the pooled
                 vector (with [CLS] pooling the last layer runs at [CLS] only, plus the pooler's
                 2 H^2 where the encoder has one; mean pooling reads every position); a span
                 or tag head's linear layer 2 S H C at every position (C = 2 for SQuAD's start
                 and end, the tags for NER)
  XLNet          two-stream relative attention (xlnet_flops), its tied decoder at the targets
  tagger heads   on frozen or fine-tuned features of width W (H, K H concatenated, 2 P for
                 ELMo): an optional BiLSTM, 2 x 8 U (W + U) per layer and step (its later
                 layers read W = 2 U), then the linear layer 2 S W C (tagger_head_flops)
  ELMo           the character CNN, the LSTMP cells of both directions at every step, both
                 softmaxes at every position (elmo_lm_flops; the biLM alone: elmo_bilm_flops)
  encoder-decoder over S inputs and T targets (T5, BART): the encoder, then per decoder layer
                 self-attention over T, cross-attention from T to S (K and V of the S encoder
                 outputs), the FFN at T; the decoder to the vocabulary at T. T5's attention
                 width is heads x d_kv, its gated FFN (v1.1) has two input matrices.

The S, P and batch arguments may be Python numbers or TensorFlow scalars (a step counts the
batch it runs, whose length dynamic padding may cut); tests/test_flops.py checks every count
against the matrix products of the traced forward graph.

An encoder run with remove_padding (modeling/bert.run_layer_stack) computes each layer's
per-position work (the Q, K, V and output projections, the FFN) at its batch's R real-token rows
(layers.unpadded_rows: counted up to a multiple of 64 a branch) instead of its B x S positions;
only the scores and the weighted values stay on the (B, S) layout. The encoder counts take that
as `rows`, the per-sequence average R / B (the formulas are linear in it, so B times the count
is the batch's exact total): a full layer then costs 8 rows H^2 + 4 S^2 H + 4 rows H I, a last
layer at Q positions 4 rows H^2 (K and V) + 4 Q H^2 + 4 Q S H + 4 Q H I. The embedding
projection and the heads run on the padded layout as before. tests/test_flops.py checks these
against the products a run executes, read from the shapes at run time.
"""

from __future__ import annotations

# The help of every training script's --peak_tflops (TrainSettings.peak_flops, in TFLOP/s). Here,
# in a module that imports nothing, so the scripts' flag definitions cost no TensorFlow import.
PEAK_TFLOPS_HELP = (
    "The hardware's peak TFLOP/s at the run's precision, all replicas together (e.g. 989 for one "
    "H100 SXM in bf16, dense): the log then gives the step's matrix-multiply FLOP/s as a share "
    "of it. 0: unknown (FLOP/s alone)."
)


def attention_flops(q, k, h: int, inner: int):
    """Forward FLOPs of one attention block of width h with heads x depth = inner: queries at q
    positions over keys at k positions. The Q and output projections run at q (4 q h inner),
    K and V at k (4 k h inner), the scores and the weighted values at q x k (4 q k inner)."""
    return 4 * q * h * inner + 4 * k * h * inner + 4 * q * k * inner


def encoder_flops(
    s, h: int, layers: int, intermediate: int, e: int | None = None, q=None, rows=None
):
    """Forward FLOPs of a Transformer encoder over one sequence of s tokens (module docstring),
    with the E -> H embedding projection when e differs from h, and the last layer computed at
    q positions only when q is given. `rows`: the positions each layer's per-position work runs
    at under remove_padding (module docstring; per sequence, on average), or None: all s."""
    # The work remove_padding skips at each of the s - rows positions it does not run: a full
    # layer's projections and FFN, a last layer's K and V (its queries are real positions).
    skipped = 0 if rows is None else s - rows
    per_layer = attention_flops(s, s, h, h) + 4 * s * h * intermediate
    per_layer -= skipped * (8 * h * h + 4 * h * intermediate)
    project = 2 * s * e * h if e is not None and e != h else 0
    if q is None or not layers:
        return layers * per_layer + project
    last = attention_flops(q, s, h, h) + 4 * q * h * intermediate - skipped * 4 * h * h
    return (layers - 1) * per_layer + last + project


def mlm_head_flops(p, h: int, out_width: int, vocab: int):
    """Forward FLOPs of the MLM head at p positions: dense h -> out_width, tied decoder to vocab."""
    return 2 * p * h * out_width + 2 * p * out_width * vocab


def sentence_head_flops(h: int):
    """Forward FLOPs of the NSP / SOP head on one [CLS] vector: pooler, 2-way classifier."""
    return 2 * h * h + 4 * h


def span_boundary_head_flops(p, h: int, out_width: int, vocab: int):
    """Forward FLOPs of SpanBERT's span boundary head at p targets: (3H -> H), (H -> E'), and
    the tied decoder to the vocabulary."""
    return 2 * p * 3 * h * h + mlm_head_flops(p, h, out_width, vocab)


def mlm_pretraining_flops(
    config,
    s,
    p,
    sentence_head: bool = True,
    span_boundary: bool = False,
    cut: bool = True,
    rows=None,
):
    """Forward FLOPs per sequence of a masked-LM pretrainer (BertPretrainer, AlbertPretrainer)
    as it runs: the encoder, the MLM head, optionally the sentence head and the span boundary
    head. With `cut` the encoder's last layer runs at [CLS] and the predictions (and the span
    boundaries) only, as bert.pretraining_outputs asks; without it at every position (a
    DistilBERT student or teacher, whose task reads every hidden state). `config`: a BertConfig
    or AlbertConfig (ALBERT's embedding_size E is the heads' width; ALBERT's shared layers save
    parameters, not compute: every block runs, transformer_blocks). `rows`: encoder_flops'."""
    h, e = config.hidden_size, getattr(config, "embedding_size", None)
    out = e or h
    # bert.last_layer_queries: [CLS] (for the pooler), then the P predictions and, with the
    # span boundary objective, their 2P boundaries.
    q = 1 + (3 * p if span_boundary else p) if cut else None
    total = backbone_flops(config, s, q=q, rows=rows)
    total += mlm_head_flops(p, h, out, config.vocab_size)
    if sentence_head:
        total += sentence_head_flops(h)
    if span_boundary:
        total += span_boundary_head_flops(p, h, out, config.vocab_size)
    return total


def transformer_blocks(config) -> int:
    """The Transformer blocks an encoder config runs: L, or L x inner_group_num for an
    AlbertConfig (each of its L layers applies its group's inner blocks in turn)."""
    return config.num_hidden_layers * getattr(config, "inner_group_num", 1)


def backbone_flops(config, s, q=None, blocks=None, rows=None):
    """Forward FLOPs of a fine-tuning model's encoder (finetuning.encoder_for: a BertConfig,
    AlbertConfig or ElectraConfig, whose E -> H projection runs where E != H) over s tokens,
    its last block at q positions when q is given. `blocks`: only the first that many
    Transformer blocks (a frozen encoder read below its top: later blocks feed no output, so a
    step prunes them); None: all (transformer_blocks). `rows`: encoder_flops'."""
    return encoder_flops(
        s,
        config.hidden_size,
        transformer_blocks(config) if blocks is None else blocks,
        config.intermediate_size,
        getattr(config, "embedding_size", None),
        q=q,
        rows=rows,
    )


def sequence_classifier_flops(config, s, outputs: int, cls_pooling: bool, pooler: bool, rows=None):
    """Forward FLOPs per sequence of a BertClassifier (or one choice of a BertMultipleChoice,
    outputs 1): with [CLS] pooling the encoder's last layer at [CLS] only and the pooler (2 H^2,
    where the encoder has one: ELECTRA's has none), with mean pooling every position; then the
    linear layer to `outputs`. `rows`: encoder_flops'."""
    h = config.hidden_size
    if cls_pooling:
        encoder = backbone_flops(config, s, q=1, rows=rows) + (2 * h * h if pooler else 0)
    else:
        encoder = backbone_flops(config, s, rows=rows)
    return encoder + 2 * h * outputs


def token_classifier_flops(config, s, outputs: int, rows=None):
    """Forward FLOPs per sequence of an encoder at every position and a linear layer to
    `outputs` at each (BertSpanQA: 2, start and end; a fine-tuned BertTagger: its tags).
    `rows`: encoder_flops'."""
    return backbone_flops(config, s, rows=rows) + 2 * s * config.hidden_size * outputs


def bilstm_flops(s, width: int, units: int, layers: int):
    """Forward FLOPs over s steps of `layers` bidirectional LSTM layers (keras.layers.LSTM,
    `units` per direction), the first reading width-wide inputs and each later one the 2 units
    of the layer below: per direction and step the four gates' input and recurrent products,
    2 x 4 U (W + U)."""
    total = 0
    for _ in range(layers):
        total += 2 * s * 8 * units * (width + units)
        width = 2 * units
    return total


def tagger_head_flops(s, width: int, outputs: int, lstm_units: int = 0, lstm_layers: int = 0):
    """Forward FLOPs per sequence of s tokens of a tagger's head (modeling/tagging.py) over
    width-wide features: the optional BiLSTM, then the linear layer to `outputs` at every
    position (the scalar mix is elementwise: no products)."""
    total = 0
    if lstm_units:
        total = bilstm_flops(s, width, lstm_units, lstm_layers)
        width = 2 * lstm_units
    return total + 2 * s * width * outputs


def electra_pretraining_flops(config, s, p, rows=None):
    """Forward FLOPs per sequence of an ElectraPretrainer: the generator (width H_g, L_g
    layers, FFN 4 H_g, its last layer at [CLS] and the predictions) and its MLM head, then the
    discriminator's encoder at every position and its head (H -> H -> 1 at every token).
    `config`: an ElectraConfig. `rows`: encoder_flops', for both encoders."""
    h, e, v = config.hidden_size, config.embedding_size, config.vocab_size
    h_g, l_g = config.generator_sizes()
    generator = encoder_flops(s, h_g, l_g, 4 * h_g, e, q=1 + p, rows=rows)
    generator += mlm_head_flops(p, h_g, e, v)
    discriminator = encoder_flops(
        s, h, config.num_hidden_layers, config.intermediate_size, e, rows=rows
    )
    return generator + discriminator + 2 * s * h * h + 2 * s * h


def causal_lm_flops(config, s):
    """Forward FLOPs per sequence of s tokens of a GPT language model (GptConfig): every layer
    at every position, and the tied decoder at every position."""
    h = config.n_embd
    return encoder_flops(s, h, config.n_layer, config.inner_size) + 2 * s * h * config.n_vocab


def gpt_classifier_flops(config, s, outputs: int):
    """Forward FLOPs per sequence of a GptClassifier (GPT-1 fine-tuning): the language model
    (its LM logits feed the auxiliary loss) and the linear layer to `outputs` at the extract
    token."""
    return causal_lm_flops(config, s) + 2 * config.n_embd * outputs


def xlnet_flops(config, s, rows, p=None, segments: bool = False, m=0):
    """Forward FLOPs of an XLNetModel over `rows` sequences of s tokens (all of them, not per
    sequence: the relative position terms are computed once a batch), each reading a memory of
    m slots (segment recurrence: K = m + s keys). `config`: an XLNetConfig, H = d_model,
    A = n_head x d_head, F = d_inner, R = K + s - 1 distances.
      per layer, a batch   2 R H A                  the relative positions' key projection
      per layer, per sequence, the content stream:
                           8 s H A + 4 m H A        Q, K, V and output projections, and the
                                                    memory's K and V
                           4 s K A + 2 s R A        content scores, probabilities x V, and the
                                                    scores by distance (of all R, then gathered)
                           4 s A                    scores by segment (with `segments`)
                           4 s H F                  the FFN
      the query stream at p targets (p given, pretraining): its Q and output projections and FFN
                           at p, 4 p s A to map the p queries to their positions and back, and
                           the same attention at all s positions as the content stream's
    and once a batch R H for the sinusoid encoding (an outer product of distances and
    frequencies)."""
    h, a, f = config.d_model, config.n_head * config.d_head, config.d_inner
    r = m + 2 * s - 1
    attend = 4 * s * (m + s) * a + 2 * s * r * a + (4 * s * a if segments else 0)
    content = 8 * s * h * a + 4 * m * h * a + attend + 4 * s * h * f
    # `is None`, not a truth test: p may be a tensor (a traced step would make a tf.cond).
    query = 0 if p is None else 4 * p * h * a + 4 * p * s * a + attend + 4 * p * h * f
    per_layer = rows * (content + query) + 2 * r * h * a
    return config.n_layer * per_layer + r * h


def xlnet_pretraining_flops(config, s, p, rows, m=0, segments: bool = False):
    """Forward FLOPs of an XLNetPretrainer over `rows` sequences of s tokens with p targets and
    a memory of m slots: both streams (with `segments`: two-segment records' segment terms),
    and the tied decoder to the vocabulary at the p targets."""
    decoder = rows * 2 * p * config.d_model * config.n_token
    return xlnet_flops(config, s, rows, p, segments, m) + decoder


def xlnet_classifier_flops(config, s, rows, outputs: int, segments: bool = True):
    """Forward FLOPs of an XLNetClassifier over `rows` sequences of s tokens: the content
    stream, then at the last token the tanh summary (2 H^2) and the linear layer to
    `outputs`."""
    h = config.d_model
    return xlnet_flops(config, s, rows, segments=segments) + rows * (2 * h * h + 2 * h * outputs)


def xlnet_beam_span_qa_flops(config, s, rows, segments: bool = True):
    """Forward FLOPs of an XLNetBeamSpanQA in training (gold starts given) over `rows` sequences
    of s tokens: the content stream; at every position the start logit (2 H) and the end logit
    (the position's half of the first end layer, 2 H x H, then 2 H); per row the start's half
    of it (2 H x H) and the answer class (2 x 2H x H, then 2 H)."""
    h = config.d_model
    per_position = 2 * h + 2 * h * h + 2 * h
    return xlnet_flops(config, s, rows, segments=segments) + rows * (
        s * per_position + 2 * h * h + 4 * h * h + 2 * h
    )


def xlnet_span_qa_flops(config, s, rows, segments: bool = True):
    """Forward FLOPs of an XLNetSpanQA over `rows` sequences of s tokens: the content stream,
    then the start and end logits at every position (2 H x 2 each)."""
    return xlnet_flops(config, s, rows, segments=segments) + rows * s * 4 * config.d_model


def char_cnn_flops(char_cnn, projection_dim: int):
    """Forward FLOPs per token of ELMo's character CNN (elmo.CharCnnOptions): each filter of
    width w and count n over the C - w + 1 windows of C characters embedded in E dimensions
    (2 (C - w + 1) w E n), two F x F products (transform and gate) per highway layer over the F
    filters, and the projection to P."""
    c, e = char_cnn.max_characters_per_token, char_cnn.embedding.dim
    convolutions = sum(2 * (c - w + 1) * w * e * n for w, n in char_cnn.filters)
    f = char_cnn.num_filters
    return convolutions + char_cnn.n_highway * 4 * f * f + 2 * f * projection_dim


def elmo_bilm_flops(config, s):
    """Forward FLOPs per sequence of s tokens of an ElmoBiLM (an ElmoConfig): the token layer
    (the character CNN at every token, or an embedding lookup: none), then per direction and
    layer at every step an LSTMP cell of D units over its P-wide input and state (2 x 2 P 4D
    for the four gates, 2 D P for the projection)."""
    c = config
    p, d = c.lstm.projection_dim, c.lstm.dim
    token = s * char_cnn_flops(c.char_cnn, p) if c.char_cnn is not None else 0
    return token + 2 * c.lstm.n_layers * s * (16 * p * d + 2 * d * p)


def elmo_lm_flops(config, s):
    """Forward FLOPs per sequence of s tokens of an ElmoLM: the biLM (elmo_bilm_flops) and both
    directions' softmax over V at every position."""
    return elmo_bilm_flops(config, s) + 2 * 2 * s * config.lstm.projection_dim * (
        config.n_tokens_vocab
    )


def encoder_decoder_flops(
    s, t, h: int, inner: int, layers: tuple, ffn: tuple, vocab: int, ffn_matrices: int = 2
):
    """Forward FLOPs of an encoder-decoder Transformer over s input and t target positions:
    layers = (encoder, decoder) layers, ffn = their FFN widths, ffn_matrices 2 (W_in, W_out)
    or 3 (gated: two input matrices). Each decoder layer attends to itself and to the encoder's
    s outputs (their K and V projected in every decoder layer); the tied or separate decoder
    to the vocabulary runs at every target position."""
    encoder = layers[0] * (attention_flops(s, s, h, inner) + 2 * ffn_matrices * s * h * ffn[0])
    self_and_cross = attention_flops(t, t, h, inner) + attention_flops(t, s, h, inner)
    decoder = layers[1] * (self_and_cross + 2 * ffn_matrices * t * h * ffn[1])
    return encoder + decoder + 2 * t * h * vocab


def t5_flops(config, s, t):
    """Forward FLOPs of a T5Model over s input and t target positions: attention width
    num_heads x d_kv, gated FFNs (T5 v1.1's "gated-gelu") with two input matrices."""
    dec_layers = config.num_decoder_layers or config.num_layers
    gated = config.feed_forward_proj.startswith("gated")
    return encoder_decoder_flops(
        s,
        t,
        config.d_model,
        config.num_heads * config.d_kv,
        (config.num_layers, dec_layers),
        (config.d_ff, config.d_ff),
        config.vocab_size,
        3 if gated else 2,
    )


def bart_flops(config, s, t):
    """Forward FLOPs of a BartModel over s input and t target positions (attention width
    d_model)."""
    return encoder_decoder_flops(
        s,
        t,
        config.d_model,
        config.d_model,
        (config.encoder_layers, config.decoder_layers),
        (config.encoder_ffn_dim, config.decoder_ffn_dim),
        config.vocab_size,
    )
