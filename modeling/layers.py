"""Layers shared by the Transformer encoder families (BERT, RoBERTa, ALBERT, ELECTRA, ...).

Written by hand rather than taken from keras_hub.layers.TransformerEncoder for two measured or
structural reasons: (1) a fused Q/K/V projection (one (H, 3H) matmul instead of three) is a speed
lever that bench/ measures against keras-hub, and (2) the weights keep one plain kernel per
original BERT variable, so checkpoint conversion (TF1, Hugging Face) is a name map, not a reshape
puzzle. Shapes use B batch, S length, H hidden, N heads, D head depth, I intermediate.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import keras
from absl import logging
from keras import ops


def gelu_tanh(x):
    """GELU as the original TF1 BERT code computes it: the tanh approximation.

    Hendrycks & Gimpel (2016), eq. for the approximation; BERT's `modeling.gelu` uses this form, so
    original checkpoints reproduce their published outputs only with it.
    """
    # x * x * x, not power(x, 3): TensorFlow's Pow is a generic exponentiation whose gradient is
    # another Pow, several times the cost of two multiplies over the (B, S, I) activations.
    cube = x * x * x
    return 0.5 * x * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * cube)))


def gelu_exact(x):
    """GELU with the exact Gaussian CDF (erf): what Hugging Face and PyTorch checkpoints use."""
    return 0.5 * x * (1.0 + ops.erf(x / math.sqrt(2.0)))


def _gelu_derivative_tanh(x):
    t = ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * math.sqrt(2.0 / math.pi) * (
        1.0 + 3.0 * 0.044715 * x * x
    )


def _gelu_derivative_exact(x):
    # Phi(x) + x * phi(x)
    return 0.5 * (1.0 + ops.erf(x / math.sqrt(2.0))) + x * ops.exp(-0.5 * x * x) / math.sqrt(
        2.0 * math.pi
    )


def xla_kernels(*fns):
    """Each function as an XLA-compiled tf.function (jit_compile, no autograph): the element-wise
    kernels of fused_activation, residual_layer_norm and losses.biased_xent_and_hits_tf."""
    import tensorflow as tf

    return tuple(tf.function(f, jit_compile=True, autograph=False) for f in fns)


def compiled_for_decoding(model, name: str, fn):
    """fn compiled once per model under TensorFlow (XLA, one program per input shape), else fn;
    kept on the model under `name` (outside Keras' tracking). For incremental decoding steps
    (t5, bart, gpt): run eagerly, a step's few hundred small ops cost more in dispatch than in
    arithmetic, and XLA then halves the graph's time (a 4-layer width-256 T5 decoder at batch
    8, measured: eager 55 ms a step, graph 8 ms, XLA 4 ms)."""
    compiled = model.__dict__.setdefault("_cloze_decoding", {})
    if name not in compiled:
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            fn = tf.function(fn, jit_compile=True)
        compiled[name] = fn
    return compiled[name]


def heads_first(t):
    """(B, L, N, D) -> (B, N, L, D): the layout of the decoders' key / value caches."""
    return ops.transpose(t, (0, 2, 1, 3))


def write_cache(cache, index, keys, values) -> list:
    """A decoder's [keys, values] cache (each float (B, N, K, D)) with new keys and values float
    (B, T, N, D) written at positions index .. index + T - 1 (t5, bart and gpt decoding).
    Heads first and apart, the score and context products read the cache as stored, where one
    (B, 2, K, N, D) stack was sliced, transposed and stacked again, all of it, at every step
    (greedy 1.2-1.5x and beam search 1.8x faster: bench/HISTORY.md, 49th session)."""
    start = [0, 0, index, 0]
    return [
        ops.slice_update(cache[0], start, heads_first(keys)),
        ops.slice_update(cache[1], start, heads_first(values)),
    ]


def static_size(x):
    """The number of elements of `x` when its whole shape is known while tracing, else None."""
    return None if any(d is None for d in x.shape) else math.prod(x.shape)


def kernel_cast(x, dtype):
    """tf.cast for use inside XLA-compiled kernels: between bfloat16 and float32 it moves bits
    with integer ops instead, with the same results (exact widening; narrowing rounds to nearest,
    ties to even, NaN stays NaN).
    Why by hand: XLA's CPU code for these converts is slow. A GELU forward kernel at
    (1024, 3072), bfloat16 in and out, float32 inside: 2.75 ms with XLA's converts, 1.72 ms
    this way, 1.56 ms all in float32 (2 AVX-512 cores, thirteenth session)."""
    import tensorflow as tf

    dtype = tf.as_dtype(dtype)
    sixteen = tf.constant(16, tf.uint32)
    if x.dtype == tf.bfloat16 and dtype == tf.float32:
        bits = tf.cast(tf.bitcast(x, tf.uint16), tf.uint32)
        return tf.bitcast(tf.bitwise.left_shift(bits, sixteen), tf.float32)
    if x.dtype == tf.float32 and dtype == tf.bfloat16:
        bits = tf.bitcast(x, tf.uint32)
        odd = tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(bits, sixteen), tf.constant(1, tf.uint32)
        )
        rounded = tf.bitwise.right_shift(bits + tf.constant(0x7FFF, tf.uint32) + odd, sixteen)
        # A NaN's low bits could carry into the exponent or sign: a quiet NaN of its sign.
        nan = tf.bitwise.bitwise_or(
            tf.bitwise.right_shift(bits, sixteen), tf.constant(0x0040, tf.uint32)
        )
        rounded = tf.where(tf.math.is_nan(x), nan, rounded)
        return tf.bitcast(tf.cast(rounded, tf.uint16), tf.bfloat16)
    return tf.cast(x, dtype)


_FUSED_CACHE = {}

# The hidden_act names that mean GELU (see ACTIVATIONS): the tanh form, or the exact one.
GELU_NAMES = ("gelu", "gelu_new", "gelu_exact")


def fused_activation(name: str):
    """The activation `name` as two XLA-compiled element-wise kernels, one for the values and one
    for the gradient (TensorFlow), or None where there is none (other names, other backends).

    Why by hand: without XLA, TensorFlow runs GELU as ~9 separate element-wise ops forward and
    ~10 backward, each a full pass over the (B*S, I) activations. Measured on 2 CPU cores at
    (1024, 3072), forward + backward: 19.1 ms as `gelu_tanh` with autodiff, 18.2 ms as
    tf.nn.gelu, 5.7 ms as these two kernels (`python -m bench.kernel_speed`;
    bench/results/kernels_2026-11-23_s7.json).
    The gradient kernel recomputes tanh from x instead of keeping it, so nothing but x is saved.
    Values and gradients equal `gelu_tanh` / `gelu_exact` within float32 rounding (XLA's own
    tanh and erf; tests/test_step_speed.py). Dense uses it only under training=True: a
    SavedModel with XLA kernels needs XLA where it is served (TF Serving has it off by default).
    """
    if keras.backend.backend() != "tensorflow" or name not in GELU_NAMES:
        return None
    kind = "exact" if name == "gelu_exact" else "tanh"
    if kind not in _FUSED_CACHE:
        import tensorflow as tf

        value = gelu_exact if kind == "exact" else gelu_tanh
        derivative = _gelu_derivative_exact if kind == "exact" else _gelu_derivative_tanh

        # In float32 inside the kernel whatever the input: XLA's CPU code for bfloat16 tanh / erf
        # is slow. Under mixed_bfloat16, on (1024, 1024), forward + backward took 4.26 ms
        # computed in bfloat16 and 1.08 ms this way (0.93 in float32); in the small pretraining
        # step (L4/H256) these kernels were 15.6 of 115 ms op time before (twelfth session).
        def forward_fn(x):
            return kernel_cast(value(kernel_cast(x, tf.float32)), x.dtype)

        def backward_fn(x, dy):
            grad = kernel_cast(dy, tf.float32) * derivative(kernel_cast(x, tf.float32))
            return kernel_cast(grad, dy.dtype)

        forward, backward = xla_kernels(forward_fn, backward_fn)

        @tf.custom_gradient
        def fused(x):
            return forward(x), lambda dy: backward(x, dy)

        _FUSED_CACHE[kind] = fused
    return _FUSED_CACHE[kind]


def dense_activation(name: str):
    """The activation `name` as Dense applies it outside training: on TensorFlow, GELU is
    `tf.nn.gelu` (the same tanh or erf formula), else get_activation(name).

    Why: TensorFlow's graph optimizer recognises tf.nn.gelu after a MatMul + BiasAdd and, with
    oneDNN (on by default on AVX-512 VNNI / BF16 CPUs), runs the three as one fused kernel.
    Measured on 2 AVX-512 cores, the L4/H256 encoder's forward pass at batch 32 (eleventh
    session, 10 alternating rounds): 1.05x (every round 1.03-1.11x), outputs within 1e-6. Training
    uses fused_activation instead.
    """
    fn = get_activation(name)
    if keras.backend.backend() != "tensorflow" or name not in GELU_NAMES:
        return fn
    import tensorflow as tf

    approximate = name != "gelu_exact"
    return lambda x: tf.nn.gelu(x, approximate=approximate)


ACTIVATIONS = {
    "gelu": gelu_tanh,  # the original TF1 BERT meaning of "gelu"
    "gelu_new": gelu_tanh,  # Hugging Face's name for the same tanh approximation
    "gelu_exact": gelu_exact,
    "relu": ops.relu,
    "tanh": ops.tanh,
    "linear": lambda x: x,
}


def get_activation(name: str):
    """Maps a config's `hidden_act` string to a function; raises ValueError naming the choices."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act: expected one of {sorted(ACTIVATIONS)}, found {name!r}")
    return ACTIVATIONS[name]


def truncated_normal(stddev: float):
    """BERT's initializer: normal truncated at two standard deviations (TF1 truncated_normal)."""
    return keras.initializers.TruncatedNormal(stddev=stddev)


@keras.saving.register_keras_serializable(package="cloze")
class Dense(keras.layers.Layer):
    """`x @ kernel + bias` on the last axis, with BERT's weight names (`kernel`, `bias`).

    Args:
      units: output width.
      activation: a name from ACTIVATIONS or None.
      initializer_range: stddev of the truncated-normal kernel initializer.
    """

    def __init__(self, units, activation=None, initializer_range=0.02, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.activation = activation
        self.initializer_range = initializer_range
        self.use_bias = use_bias
        self._act = dense_activation(activation) if activation else None
        self._fused_act = fused_activation(activation) if activation else None
        # An execution setting, like jit_compile: not config, not checkpointed
        # (set_xla_weight_gradients sets it).
        self.xla_weight_gradient = False

    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel",
            shape=(input_shape[-1], self.units),
            initializer=truncated_normal(self.initializer_range),
        )
        self.bias = (
            self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
            if self.use_bias
            else None
        )

    def call(self, x, training=None):
        if keras.backend.backend() == "tensorflow":
            y = self._matmul_bias_tf(x)
        else:
            y = ops.matmul(x, self.kernel)
            if self.bias is not None:
                y = y + self.bias
        if training and self._fused_act is not None:
            return self._fused_act(y)  # see fused_activation: training only
        return self._act(y) if self._act else y

    def _matmul_bias_tf(self, x):
        """`x @ kernel + bias` as one 2-D MatMul and a BiasAdd (TensorFlow).

        Why by hand: Keras' matmul of a 3-D x is a Tensordot with the bias added by AddV2, whose
        gradient is a column Sum. As MatMul + BiasAdd, TensorFlow's graph optimizer fuses the
        two into one matmul kernel with the bias applied on output (oneDNN's fused MatMul,
        which TensorFlow runs by default on AVX-512 VNNI / BF16 CPUs), and the bias' gradient
        is BiasAddGrad. Measured in the pretraining step on 2 AVX-512 cores, alternating rounds
        of both forms in one process (median of the rounds, two runs each): 1.02 and 1.08x at
        L4/H256, 1.03 and 0.99x at BERT-base; with oneDNN off 1.03 and 1.01x (README, eleventh
        session). Same values up to float rounding (tested).
        """
        import tensorflow as tf

        kernel = ops.cast(self.kernel, x.dtype)  # autocast under a mixed policy
        flat = tf.reshape(x, (-1, kernel.shape[0]))
        if self.xla_weight_gradient and not in_xla_context():  # XLA compiles it all there
            y = matmul_xla_weight_gradient(flat, tf.convert_to_tensor(kernel))
        else:
            y = tf.linalg.matmul(flat, kernel)
        shape = tf.concat([tf.shape(x)[:-1], [self.units]], axis=0)
        if self.bias is None:
            return tf.reshape(y, shape)
        bias = ops.cast(self.bias, y.dtype)
        if y.dtype == tf.float16 and float16_on_onednn_cpu():
            # No fused kernel (see float16_on_onednn_cpu): the bias added to a rank-3 view, as
            # Grappler fuses MatMul + BiasAdd (or + Add) only on the MatMul's own output and
            # drops a reshape that keeps the shape.
            y = tf.reshape(y, tf.concat([[1], tf.shape(y)], axis=0)) + bias
            return tf.reshape(y, shape)
        return tf.reshape(tf.nn.bias_add(y, bias), shape)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "activation": self.activation,
            "initializer_range": self.initializer_range,
            "use_bias": self.use_bias,
        }


_XLA_WEIGHT_GRADIENT = {}


def matmul_xla_weight_gradient(flat, kernel):
    """`flat @ kernel`, float (R, I) x (I, O) -> (R, O), whose kernel gradient `flat^T @ dy` is
    an XLA-compiled dot (TensorFlow); the product and the rows' gradient `dy @ kernel^T` stay
    TensorFlow's MatMul. The same values up to float rounding (tested).

    Why by hand: TensorFlow's oneDNN MatMul (on by default on AVX-512 VNNI / BF16 CPUs) runs
    the weight gradients, contractions over the R = B*S rows, slowly at the small model's shapes,
    and Grappler folds an explicit transpose back into that same kernel (tenth session); XLA's
    CPU dot is another kernel. Measured on 2 AVX2 cores with TF_ENABLE_ONEDNN_OPTS=1 (52nd
    session, bench/HISTORY.md): R = 1024, (I, O) = (1024, 256) 68 -> 95 GFLOP/s, (256, 1024)
    74 -> 113, (256, 768) 111 -> 121; without oneDNN, TensorFlow's own kernel is as fast as
    XLA's (91 / 86, 126 / 119), and in the L4/H256 step this form was slower (0.9x).
    set_xla_weight_gradients turns it on.
    """
    import tensorflow as tf

    if "fn" not in _XLA_WEIGHT_GRADIENT:
        (weight_gradient,) = xla_kernels(lambda a, dy: tf.linalg.matmul(a, dy, transpose_a=True))

        @tf.custom_gradient
        def product(rows, weights):
            def grad(dy):
                return tf.linalg.matmul(dy, weights, transpose_b=True), weight_gradient(rows, dy)

            return tf.linalg.matmul(rows, weights), grad

        _XLA_WEIGHT_GRADIENT["fn"] = product
    return _XLA_WEIGHT_GRADIENT["fn"](flat, kernel)


def onednn_enabled() -> bool:
    """Whether this TensorFlow process runs its oneDNN CPU kernels: TensorFlow's default on CPUs
    with AVX-512 VNNI / BF16 or AMX, elsewhere only with TF_ENABLE_ONEDNN_OPTS=1 set before it
    loads (TF_ENABLE_ONEDNN_OPTS=0 turns them off)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def onednn_takes(dtype: str) -> bool:
    """Whether TensorFlow's oneDNN build sends `dtype` work ("float32", "bfloat16", "float16")
    to oneDNN on this CPU when oneDNN is on (its own check, by CPU feature: float32 always,
    bfloat16 with AVX-512F or AVX-NE-CONVERT, float16 with AVX512-BW and AVX512-FP16 or
    AMX-FP16, or AVX-NE-CONVERT); elsewhere that dtype runs on TensorFlow's Eigen kernels.
    True where this TensorFlow does not expose the check (a private module), the cautious answer
    for the mends that read it."""
    import tensorflow as tf

    try:
        from tensorflow.python.util import _pywrap_utils

        return bool(_pywrap_utils.IsDataTypeSupportedByOneDNNOnThisCPU(tf.as_dtype(dtype)))
    except (ImportError, AttributeError, TypeError):
        return True


@functools.cache  # fixed for the process: the oneDNN switch, the CPU and the devices seen
def float16_on_onednn_cpu() -> bool:
    """Whether float16 work here runs on TensorFlow's oneDNN CPU kernels (onednn_enabled,
    onednn_takes("float16"), no GPU visible), where some of it has only oneDNN's reference
    code: Cloze keeps float16 away from those kernels there (Dense's bias, ELMo's character
    convolutions); elsewhere it runs the plain forms.

    Why: on CPUs with AVX512-FP16 (Intel Sapphire Rapids' flags) TensorFlow runs float16 on
    oneDNN, and without AMX oneDNN has no float16 kernel for two things Cloze's models did
    (ONEDNN_VERBOSE names them `ref:any`; 57th session, 2 cores): the fused inner product that
    Grappler makes of MatMul + BiasAdd, 2.5 s for a (1024, 256) x (256, 1024) product with its
    bias, 600x the plain MatMul and an Add; and a convolution's weight gradient, 7.4 s against
    11 ms in float32 (bfloat16 21 ms) for a 256-filter width-5 Conv1D over (1024, 50, 16). The
    L4/H256 pretraining step under --precision=fp16 took 28 s there, keras-hub's 0.24 s (its
    Dense adds the bias to the 3-D product, which Grappler does not fuse).
    """
    import tensorflow as tf

    return (
        onednn_enabled() and onednn_takes("float16") and not tf.config.list_logical_devices("GPU")
    )


def set_xla_weight_gradients(model, on: bool = True) -> list:
    """Sets every Dense inside `model` to take its kernel gradient as an XLA-compiled dot
    (matmul_xla_weight_gradient; off: TensorFlow's MatMul) and returns the names of the layers
    set, logging their count when set on (and a warning where oneDNN is off, where the option
    made the small step slower). An execution setting: not part of the config or the
    checkpoint. Under XLA (--use_xla, TPUs) the whole step is compiled and this changes
    nothing. Products taken from a Dense's
    kernel outside its call keep TensorFlow's gradient: the last encoder layer's query and
    key / value projections at the output positions (SelfAttention splits the fused Q/K/V
    kernel there), about 1% of the small step's FLOPs. Raises ValueError on another
    backend, where `model` holds no Dense, or where one computes in other than float32 (XLA's
    CPU dots in bfloat16 / float16 are unmeasured here)."""
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "XLA weight gradients: needs Keras' TensorFlow backend, found "
            f"{keras.backend.backend()!r}"
        )
    found = [m for m in model._flatten_layers() if isinstance(m, Dense)]
    if not found:
        raise ValueError(f"XLA weight gradients: {type(model).__name__} holds no Dense layer")
    if on:
        other = sorted({m.compute_dtype for m in found} - {"float32"})
        if other:
            raise ValueError(
                f"XLA weight gradients: {type(model).__name__} computes in {', '.join(other)}; "
                "expected float32 (--precision=fp32)"
            )
    for m in found:
        m.xla_weight_gradient = on
    if on:
        logging.info("--xla_weight_gradients: %d dense layers' kernel gradients", len(found))
        if not onednn_enabled():
            logging.warning(
                "--xla_weight_gradients with TensorFlow's oneDNN kernels off: it is for oneDNN's "
                "MatMul (TF_ENABLE_ONEDNN_OPTS=1); without it the small pretraining step was "
                "0.9x as fast on 2 AVX2 cores (bench/HISTORY.md)"
            )
    return [m.name for m in found]


def _dropout_rng_alg():
    """The random-number algorithm of Dropout: "philox", or None (TensorFlow's auto_select)
    under a TPUStrategy, whose XLA picks the generator that is fast there."""
    import tensorflow as tf

    return None if isinstance(tf.distribute.get_strategy(), tf.distribute.TPUStrategy) else "philox"


def dropout_seed(dropout):
    """The next int32 seed pair of a Keras dropout layer's seed generator (as Keras draws it)."""
    import tensorflow as tf

    seed = dropout.seed_generator.next()
    if seed.dtype != tf.int32:  # as Keras: stateless ops under XLA want int32 seeds
        seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
    return seed


def keep_mask(shape, rate: float, seed, rng_alg: str = "philox"):
    """Dropout's keep mask: bool `shape`, each element kept with probability 1 - rate.

    From 16 random bits per element, two elements per Philox uint32: an element is dropped
    where its 16 bits, read as an integer, are below round(rate * 65536), so the rate used is
    that over 65536 (0.1 -> 0.1000061).
    Why by hand: TensorFlow's dropout draws one float uniform per element, a full Philox output
    each, in the activations' dtype. Measured on 2 AVX-512 cores (twelfth session): 1.80 ms as
    bfloat16 uniforms, 1.34 ms as float32 ones, 0.83 ms this way for a (1024, 768) mask; 3.53,
    2.49 and 1.38 ms for BERT-base's (8, 12, 128, 128) attention mask. The masks differ from
    keras.layers.Dropout's for the same seed; they are as deterministic (tests/test_step_speed).
    """
    import tensorflow as tf

    shape = tf.convert_to_tensor(shape, tf.int32)
    count = tf.reduce_prod(shape)
    words = tf.random.stateless_uniform(
        [(count + 1) // 2], seed, minval=None, maxval=None, dtype=tf.uint32, alg=rng_alg
    )
    bits = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:count]  # (count,); no copy if even
    return _keep_from_bits(bits, shape, rate)


def _keep_from_bits(bits, shape, rate: float):
    """keep_mask's mask from its 16-bit draws `bits` (count,): kept where at or above
    round(rate * 65536)."""
    import tensorflow as tf

    threshold = min(max(round(rate * 65536), 0), 65535)
    return tf.reshape(bits, shape) >= tf.constant(threshold, tf.uint16)


def philox_key_counter(seed):
    """The Philox key (1,) and the counter's high word (a uint64 scalar) that
    tf.random.stateless_uniform(..., alg="philox") derives from an int32 seed pair: the same
    scramble (4 Philox words under a fixed key; the counter's low word starts at 0). With them,
    keep_mask_rows draws any stretch of the stream that seed draws from its start. Raw ops
    because TensorFlow keeps its own derivation private (tests/test_step_speed checks that the
    stream equals stateless_uniform's)."""
    import tensorflow as tf

    mix = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[4],
        key=tf.constant([0x02461E293EC8F720], tf.uint64),
        counter=tf.cast(seed, tf.uint64),
        alg=tf.random.Algorithm.PHILOX.value,
        dtype=tf.uint32,
    )
    m = tf.cast(mix, tf.uint64)
    high = tf.constant(32, tf.uint64)
    key = tf.reshape(tf.bitwise.bitwise_or(m[0], tf.bitwise.left_shift(m[1], high)), [1])
    return key, tf.bitwise.bitwise_or(m[2], tf.bitwise.left_shift(m[3], high))


def keep_mask_rows(shape, rate: float, key_counter, offset, rows):
    """Rows [offset, offset + rows) of the keep mask keep_mask draws for the whole batch from
    the seed of `key_counter` (philox_key_counter): `shape` is the slice's, whose leading
    `rows` rows (or its flattening in row order) are the batch's rows from `offset` on. The
    whole batch's mask takes 16 bits per element from the seed's stream in order, and Philox
    gives 4 words (8 elements) per counter step, so the slice is drawn from the counter step
    its first element falls in and cut from there."""
    import tensorflow as tf

    key, counter_high = key_counter
    shape = tf.convert_to_tensor(shape, tf.int32)
    count = tf.cast(tf.reduce_prod(shape), tf.int64)
    per_row = count // tf.maximum(tf.cast(rows, tf.int64), 1)
    start = tf.cast(offset, tf.int64) * per_row  # the slice's first element in the batch's mask
    skip = start % 8
    words = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=tf.reshape((count + 8) // 2, [1]),  # a fixed count: skip is 0 to 7
        key=key,
        counter=tf.stack([tf.cast(start // 8, tf.uint64), counter_high]),
        alg=tf.random.Algorithm.PHILOX.value,
        dtype=tf.uint32,
    )
    bits = tf.slice(tf.reshape(tf.bitcast(words, tf.uint16), [-1]), [skip], [count])
    return _keep_from_bits(bits, shape, rate)


_ROW_SLICES = threading.local()  # per thread: MirroredStrategy traces each replica in its own


class RowSlice:
    """Rows [offset, offset + rows) of a batch whose layers run one row slice at a time
    (bert.run_layer_stack's branches). Inside `with RowSlice(...)`, layers.Dropout and
    residual_layer_norm (through dropout_keep) draw the slice's rows of the masks the whole
    batch would draw in one pass, from seeds the slices of one batch share: `seeds`, one dict
    for all of them, where the first slice to make a dropout layer's k-th call draws that call's
    seed from the layer's generator. So dropout in slices is the one pass' dropout: the same
    masks, and every seed generator advanced once per call of the layer as in one pass."""

    def __init__(self, offset, rows, seeds: dict):
        self.offset, self.rows, self.seeds = offset, rows, seeds
        self.calls = {}

    def key_counter(self, dropout):
        k = self.calls.get(id(dropout), 0)
        self.calls[id(dropout)] = k + 1
        drawn = self.seeds.setdefault(id(dropout), [])
        if k == len(drawn):
            drawn.append(philox_key_counter(dropout_seed(dropout)))
        return drawn[k]

    def __enter__(self):
        if not hasattr(_ROW_SLICES, "stack"):
            _ROW_SLICES.stack = []
        _ROW_SLICES.stack.append(self)
        return self

    def __exit__(self, *exc_info):
        _ROW_SLICES.stack.pop()


def dropout_keep(dropout, shape):
    """The keep mask of `shape` for one call of the Dropout layer `dropout`: keep_mask from its
    generator's next seed, or inside a RowSlice, that slice's rows of the whole batch's mask."""
    stack = getattr(_ROW_SLICES, "stack", None)
    if not stack:
        return keep_mask(shape, dropout.rate, dropout_seed(dropout))
    s = stack[-1]
    return keep_mask_rows(shape, dropout.rate, s.key_counter(dropout), s.offset, s.rows)


def apply_keep_mask(y, keep, rate: float):
    """Dropout's output from its keep mask: y * (1 / (1 - rate)) in y's dtype where `keep` is
    set, else 0 (as TensorFlow's dropout scales and selects); y itself at rate 0."""
    import tensorflow as tf

    if rate == 0:
        return y
    scale = tf.constant(1.0 / (1.0 - rate), y.dtype)
    return tf.where(keep, y * scale, tf.zeros_like(y))


@keras.saving.register_keras_serializable(package="cloze")
class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout whose masks come from layers.keep_mask on TensorFlow: 16 Philox
    bits per element, Philox named.

    Why by hand: (1) keep_mask draws half the random numbers TensorFlow's dropout does (its
    docstring has the figures). (2) Keras' dropout leaves TensorFlow to pick the algorithm at
    run time (a StatelessRandomGetKeyCounter op), and XLA's CPU lowering of that choice is
    slow: 1.57 M uniforms (one base-size attention dropout) took 498 ms that way and 15 ms
    with Philox named. It was the worst cost of every --use_xla step: the default run's model
    (bert_tiny, batch 32, 2 quiet CPU cores) trained at 57 examples/s under XLA with Keras'
    dropout and 172 with Philox named. Same seed generator and state as keras.layers.Dropout,
    so checkpoints load either way; under a TPUStrategy (XLA's own generator choice), with a
    noise_shape or on other backends it is Keras' dropout.
    """

    def call(self, inputs, training=False):
        if (
            not training
            or self.rate <= 0
            or self.noise_shape is not None
            or keras.backend.backend() != "tensorflow"
        ):
            return super().call(inputs, training=training)
        if _dropout_rng_alg() is None:
            return super().call(inputs, training=training)
        import tensorflow as tf

        keep = dropout_keep(self, tf.shape(inputs))
        return apply_keep_mask(inputs, keep, self.rate)


_FUSED_NORM_CACHE = {}

# residual_layer_norm's kernels only for static shapes of at least this many elements: at
# (160, 256) they were 1.04x the layers, at (1024, 256) 1.78x (forward + backward, 2 AVX-512
# cores), and every new shape costs an XLA compile (~0.1-0.3 s), which tiny models (the tests)
# and unknown shapes would pay without gain.
FUSED_NORM_MIN_SIZE = 1 << 16
# The same where the row count is unknown when traced (a fine-tuning batch cut to its longest
# example, features.trim_to_longest): the kernels when a row is at least this wide, so every
# real model from BERT-mini up; XLA compiles one per row count it meets (once each). Without
# them, the L4/H256 classifier's step on a cut batch was 1.07x slower than on a static one.
FUSED_NORM_MIN_WIDTH = 256


def _normalize_rows(s, epsilon):
    # (rows, H) float32 -> (s - mean) / sqrt(var + epsilon) and 1 / sqrt(var + epsilon); two
    # passes over the row for the variance (Keras' moments take E[x^2] - E[x]^2).
    import tensorflow as tf

    centered = s - tf.reduce_mean(s, axis=-1, keepdims=True)
    inv = tf.math.rsqrt(tf.reduce_mean(centered * centered, axis=-1, keepdims=True) + epsilon)
    return centered * inv, inv


def _fused_norm_kernels(epsilon: float, rate: float, x_dtype: str, y_dtype: str, out_dtype: str):
    """(forward, backward) XLA kernels of LayerNorm(x + dropout(y)) over 2-D (rows, H) inputs,
    built once per settings; see residual_layer_norm. rate 0: no dropout (y may be a scalar 0).
    Dropout's scale is applied in float32, so under bfloat16 the kept values are y / (1 - rate)
    rounded once, where keras' Dropout rounds the scale and the product to bfloat16.
    """
    key = (float(epsilon), float(rate), x_dtype, y_dtype, out_dtype)
    if key not in _FUSED_NORM_CACHE:
        import tensorflow as tf

        def forward(x, y, keep, gamma, beta):
            y = apply_keep_mask(kernel_cast(y, tf.float32), keep, rate)
            s = kernel_cast(x, tf.float32) + y
            xhat, _ = _normalize_rows(s, epsilon)
            return kernel_cast(xhat * gamma + beta, out_dtype), s

        def backward(s, keep, gamma, dout):
            xhat, inv = _normalize_rows(s, epsilon)
            dout = kernel_cast(dout, tf.float32)
            dxhat = dout * gamma
            ds = inv * (
                dxhat
                - tf.reduce_mean(dxhat, axis=-1, keepdims=True)
                - xhat * tf.reduce_mean(dxhat * xhat, axis=-1, keepdims=True)
            )
            dgamma = tf.reduce_sum(dout * xhat, axis=0)
            dbeta = tf.reduce_sum(dout, axis=0)
            dy = kernel_cast(apply_keep_mask(ds, keep, rate), y_dtype)
            return kernel_cast(ds, x_dtype), dy, dgamma, dbeta

        _FUSED_NORM_CACHE[key] = xla_kernels(forward, backward)
    return _FUSED_NORM_CACHE[key]


def residual_layer_norm(norm, x, y=None, dropout=None, training=False):
    """`norm(x + dropout(y))` (or `norm(x)` without y) for a keras.layers.LayerNormalization
    `norm` over the last axis: the post-LN residual of BERT's blocks.

    On TensorFlow in training, dropout's multiply, the residual sum, LayerNorm and their
    gradients run as two XLA-compiled kernels, each one pass over the rows, computing in float32
    whatever the activations' dtype (bfloat16 under mixed precision) and keeping only the sum
    and the keep mask for the gradient. The mask is layers.Dropout's (keep_mask from the
    dropout layer's own seed generator), so the masks are the same ones.
    Why by hand: TensorFlow runs this as ~10 ops forward and ~20 backward (LayerNorm's moments,
    its Tile / Mul / Sum gradients, the casts under bfloat16), each a pass over (B*S, H).
    Measured in the pretraining step on 2 AVX-512 cores, alternating rounds of both forms in
    one process (medians of the rounds; twelfth session, README): L4/H256 1.02x in fp32 and
    1.05x in bf16, BERT-base 1.04x in bf16. Elsewhere (inference, a
    SavedModel, other backends, rms_scaling or a non-last axis, TPU's XLA RNG choice, under
    FUSED_NORM_MIN_SIZE elements, or rows unknown when traced and narrower than
    FUSED_NORM_MIN_WIDTH) it is the layers themselves.
    """
    has_dropout = y is not None and dropout is not None and dropout.rate > 0
    size = static_size(x)
    if size is None:  # rows unknown: decide by the row width (FUSED_NORM_MIN_WIDTH)
        large = x.shape[-1] is not None and x.shape[-1] >= FUSED_NORM_MIN_WIDTH
    else:
        large = size >= FUSED_NORM_MIN_SIZE
    if (
        not training
        or not large
        or keras.backend.backend() != "tensorflow"
        or norm.rms_scaling
        or not (norm.center and norm.scale)
        or list(norm.axis) not in ([-1], [len(x.shape) - 1])
        or (has_dropout and (dropout.noise_shape is not None or _dropout_rng_alg() is None))
    ):
        if y is None:
            return norm(x)
        return norm(x + (dropout(y, training=training) if dropout is not None else y))
    import tensorflow as tf

    if not norm.built:
        norm.build(x.shape)
    width = x.shape[-1]
    shape = tf.shape(x)
    x2 = tf.reshape(x, (-1, width))
    y2 = tf.zeros([], x.dtype) if y is None else tf.reshape(y, (-1, width))
    forward, backward = _fused_norm_kernels(
        norm.epsilon,
        dropout.rate if has_dropout else 0.0,
        x2.dtype.name,
        y2.dtype.name,
        norm.compute_dtype,
    )
    if has_dropout:
        keep = dropout_keep(dropout, tf.shape(y2))
    else:
        keep = tf.zeros([], tf.bool)

    @tf.custom_gradient
    def fused(x2, y2, gamma, beta):
        out, s = forward(x2, y2, keep, gamma, beta)

        def grad(dout):
            ds, dy, dgamma, dbeta = backward(s, keep, gamma, dout)
            return ds, dy if y is not None else tf.zeros_like(y2), dgamma, dbeta

        return out, grad

    gamma, beta = ops.cast(norm.gamma, "float32"), ops.cast(norm.beta, "float32")
    return tf.reshape(fused(x2, y2, gamma, beta), shape)


def add_rows(total, indices, values):
    """total (R, C) with values (N, C) added at rows indices (N, 1), repeats summed
    (TensorFlow): how a dense gradient and the rows of a gather's gradient are summed here
    (heads.tied_table_views, gather_with_whole).

    Why not tensor_scatter_nd_add alone: its CPU kernel deep-copies its input when it cannot
    take it over, and measured after a matmul (the tied head's (V, E) gradient) it always
    copies: 2.1 ms for 1,024 rows of the (30522, 256) table on 2 AVX-512 cores, against 0.5 ms
    for ScatterNdNonAliasingAdd, which adds into the input's buffer when nothing else reads it
    and copies otherwise (seventeenth session). That op has no XLA kernel, so inside an XLA
    cluster (jit_compile, TPU) this is tensor_scatter_nd_add, which XLA compiles.
    """
    import tensorflow as tf

    if in_xla_context():
        return tf.tensor_scatter_nd_add(total, indices, values)
    return tf.raw_ops.ScatterNdNonAliasingAdd(input=total, indices=indices, updates=values)


def in_xla_context() -> bool:
    """Whether ops built now go to XLA: inside a jit_compile tf.function or a TPU computation.
    TensorFlow keeps this test private (control_flow_util); where it is missing, True, the
    choice that compiles everywhere."""
    import tensorflow as tf

    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TensorFlow without the private module
        return True
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


@contextlib.contextmanager
def custom_gradients_released():
    """Around a call of a tf.function that takes its own gradients, or none (its tracing runs
    inside the call): on exit, drops the gradient functions that `tf.custom_gradient`
    registered meanwhile (TensorFlow). A call that does not trace registers nothing.

    Why: traced in a graph, each `tf.custom_gradient` call registers its gradient closure in
    TensorFlow's global gradient registry under a new name ("CustomGradient-N") and never
    removes it (tensorflow issue 97697; also 27492). The closure holds the forward tensors, and
    through them the whole traced graph: every trace of a train, eval or predict step that runs
    Cloze's fused kernels (fused_activation, fused_residual_norm, gather_with_whole, the tied
    head, the losses) stayed in memory for the life of the process. Measured (33rd session,
    tests/SUITE_TIMES.md): tests/test_trainer.py alone grew 1.1 -> 6.8 GB resident in one
    process, the whole suite's busiest worker to 12.4 GB. Once the call has returned, its
    gradients are built: the registered names are looked up only by a tape's gradient call
    while tracing. So this is for functions whose outputs no outer tape differentiates (the
    trainer's train and eval functions, the predictor's step); a function differentiated from
    outside must keep its registrations. Removes only names registered during the block; costs
    a set of the registry's ~600 names per call (about 16 microseconds here).
    """
    try:
        from tensorflow.python.framework import ops as tf_ops

        names = tf_ops.gradient_registry._registry  # private: TensorFlow offers no removal
    except (ImportError, AttributeError):  # pragma: no cover - another TensorFlow layout
        yield
        return
    before = set(names)
    try:
        yield
    finally:
        for name in [n for n in names if n not in before and n.startswith("CustomGradient-")]:
            names.pop(name, None)


def lookup_rows(table, ids, dtype):
    """Rows `ids` (int, any shape) of an embedding table (V, E) read as stored, then cast to
    `dtype` (the layer's compute dtype): float (*ids.shape, E).

    For a table added with `autocast=False` (or a layer with `autocast = False`): under a mixed
    policy the table is then read as float32 and only the looked-up rows are cast, as
    keras.layers.Embedding does, so the lookup's gradient is a scatter-add of float32 rows into
    the float32 table. Autocast, the table would be cast to bfloat16 first, and under Keras' JAX
    backend the gradient was a bfloat16 scatter-add: one contended atomic add per element,
    rounding every running sum to bfloat16. On an H200 that was 47 of the 103 ms of a BERT-base
    step at batch 256 (bench/HISTORY.md, thirty-seventh session). The forward values are the
    same bits either way (gather-then-cast = cast-then-gather), and TensorFlow summed the rows
    in float32 already (its Cast gradient casts the IndexedSlices' values)."""
    return ops.cast(ops.take(table, ids, axis=0), dtype)


def flatten_choices(inputs: dict, keys) -> tuple[dict, tuple]:
    """Multiple choice, one sequence per choice: the int (B, C, S) arrays of `keys` in `inputs`
    as (B*C, S), and (B, C), the shape the B*C choice scores are reshaped back to."""
    b, c, s = (ops.shape(inputs["input_ids"])[i] for i in range(3))
    return {k: ops.reshape(inputs[k], (b * c, s)) for k in keys if k in inputs}, (b, c)


def gather_positions(sequence, positions):
    """Gathers vectors at given positions of each sequence.

    Args:
      sequence: float (B, S, H).
      positions: int (B, P), indices into S.
    Returns float (B, P, H).
    """
    return ops.take_along_axis(sequence, ops.expand_dims(positions, -1), axis=1)


def gather_with_whole(sequence, positions):
    """(whole, gathered) for a layer that reads a sequence both whole and at some positions (the
    last layer: keys and values at every position, queries and the residual at the positions
    a head reads): `sequence` itself and gather_positions(sequence, positions), (B, P, H).

    On TensorFlow the two gradients are summed here: the gathered rows' gradient is added into
    the whole's dense (B, S, H) gradient with one add_rows. Left to the tape, the rows became a
    zero-filled (B, S, H) tensor (UnsortedSegmentSum) per gather, summed with an AddN.
    """
    if keras.backend.backend() != "tensorflow":
        return sequence, gather_positions(sequence, positions)
    import tensorflow as tf

    positions = tf.cast(positions, tf.int32)

    @tf.custom_gradient
    def views(x):
        gathered = gather_positions(x, positions)  # (B, P, H)

        def grad(d_whole, d_gathered):
            shape = tf.shape(x)
            width = shape[2]
            # Row b * S + p of the (B * S, H) gradient for position p of sequence b.
            rows = positions + tf.range(shape[0])[:, None] * shape[1]
            total = add_rows(
                tf.reshape(d_whole, [-1, width]),
                tf.reshape(rows, [-1, 1]),
                tf.reshape(d_gathered, [-1, width]),
            )
            return tf.reshape(total, shape)

        return (tf.identity(x), gathered), grad

    return views(sequence)


# The rows of an unpadded batch are counted up to a multiple of this (Unpadded): each distinct
# count is a shape of its own for what compiles or caches per shape (residual_layer_norm's XLA
# kernels, oneDNN's primitives), so a batch of B * S positions meets at most B * S / 64 of them,
# as dynamic padding's cut lengths are at most S / 8. The filler rows cost at most 63 rows of
# work, 6% of a BERT-base pretraining batch of 8 x 128.
UNPAD_ROW_MULTIPLE = 64


def unpadded_rows(mask, multiple: int = UNPAD_ROW_MULTIPLE):
    """int32 scalar: the rows R an Unpadded of `mask` (int or bool (B, S)) runs, its real
    tokens counted up to a multiple of `multiple`, at least one multiple where the batch has
    positions: a batch of padding alone (an evaluation's last batch filled up with empty
    examples) still has rows for Unpadded.at to read. Also what modeling/flops counts a layer's
    per-position work at under remove_padding (bert.unpadded_rows)."""
    import tensorflow as tf

    count = tf.math.count_nonzero(mask, dtype=tf.int32)
    return _rows_for(count, tf.size(mask, out_type=tf.int32), multiple)


def _rows_for(count, positions, multiple: int):
    """unpadded_rows from the real tokens' count and the batch's positions (int32 scalars)."""
    import tensorflow as tf

    wanted = tf.maximum(count, tf.minimum(positions, 1))
    return (wanted + multiple - 1) // multiple * multiple


class Unpadded:
    """A batch's real tokens as rows, for a layer stack that runs its per-position work (the
    projections, the feed-forward layers, LayerNorms and dropout) on them alone and only its
    attention on the (B, S) layout (TensorFlow; the rows' count is known only when the batch is).

    Unpadded(mask): mask int or bool (B, S), nonzero for real tokens. Its R rows are the real
    positions in order, then filler rows up to a multiple of UNPAD_ROW_MULTIPLE (at least one
    multiple when the batch has positions), which read position 0 (so they stay finite) and
    are never written back.
      rows(x): float (B, S, C) -> (1, R, C), the real positions' vectors;
      positions(y): float (1, R, C) -> (B, S, C), zeros at padding;
      at(y, positions): float (1, R, C), int (B, Q) positions -> (B, Q, C); a padding position
        reads row 0 (a value nothing weighs: heads read real positions, and padded prediction
        slots point at [CLS]).
    The leading 1 keeps rows rank 3, so layers built for (B, S, H) (LayerNormalization's axis)
    take them unchanged.

    Why: a Transformer's per-position work at padding positions is never read by a real one
    (attention masks padded keys out), yet it costs what real positions cost. Pretraining
    records carry 10% padding on the default corpus, a fine-tuning batch cut to its longest
    example far more on short sentences (bench/HISTORY.md, forty-first session, has the
    figures). The values at real positions are those of the padded layout up to float
    rounding (tested); padded keys are zero instead of their bias, which the -10000 mask
    makes no difference to.
    """

    def __init__(self, mask, multiple: int = UNPAD_ROW_MULTIPLE):
        import tensorflow as tf

        shape = tf.shape(mask)
        self.batch, self.seq = shape[0], shape[1]
        self.total = self.batch * self.seq
        real = tf.cast(tf.where(tf.reshape(tf.not_equal(mask, 0), [-1]))[:, 0], tf.int32)  # (N,)
        count = tf.size(real)
        self.count = _rows_for(count, self.total, multiple)  # R, from the count just taken
        fill = self.count - count
        self._read = tf.concat([real, tf.zeros([fill], tf.int32)], 0)  # (R,)
        # A negative segment id is dropped by unsorted_segment_sum (and gathers a zero in its
        # gradient): the filler rows write nowhere.
        self._write = tf.concat([real, tf.fill([fill], -1)], 0)  # (R,)

    def rows(self, x):
        import tensorflow as tf

        width = x.shape[-1]
        return tf.gather(tf.reshape(x, [-1, width]), self._read)[None]  # (B*S, C) -> (1, R, C)

    def positions(self, y):
        import tensorflow as tf

        width = y.shape[-1]
        flat = tf.math.unsorted_segment_sum(y[0], self._write, self.total)  # (B*S, C)
        return tf.reshape(flat, [self.batch, self.seq, width])

    def at(self, y, positions):
        import tensorflow as tf

        # The row of each real position (0 at padding: unused).
        slot = tf.math.unsorted_segment_sum(tf.range(self.count), self._write, self.total)
        flat = tf.cast(positions, tf.int32) + tf.range(self.batch)[:, None] * self.seq  # (B, Q)
        return tf.gather(y[0], tf.gather(slot, flat))  # (B, Q, C)


def split_leading(x, num: int) -> list:
    """x (num, ...) cut along its leading axis into `num` tensors (...): ops.unstack's result.

    Why not ops.unstack: under Keras' JAX backend it takes each part by indexing, and the
    gradient of every index is a `pad` of that part to the whole shape, summed: 38 pads in the
    BERT-base step's HLO, 3 (from elsewhere) with this. A split's gradient is one concatenate.
    Measured under JAX on 2 CPU cores (bench/gpu_mfu.py's step, fp32, alternating rounds,
    seventeenth session): 1.034x at L4/H256 batch 32, 1.017x at L12/H768 batch 8. On TensorFlow
    both are one op and a concat or stack in the gradient.
    """
    return [ops.squeeze(part, axis=0) for part in ops.split(x, num, axis=0)]


# The original BERT's LayerNorm epsilon (tf.contrib.layers.layer_norm's default in modeling.py);
# BERT, ALBERT and ELECTRA checkpoints were trained with it. RoBERTa's use 1e-5
# (BertConfig.layer_norm_eps).
LAYER_NORM_EPSILON = 1e-12


def layer_norm(name: str, epsilon: float = LAYER_NORM_EPSILON) -> keras.layers.LayerNormalization:
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name)


@keras.saving.register_keras_serializable(package="cloze")
class SelfAttention(keras.layers.Layer):
    """Multi-head self-attention with a fused Q/K/V projection and an output projection.

    call(x, attention_mask, training, query_positions):
      x: float (B, S, H).
      attention_mask: int or bool (B, S), 1 for real tokens, 0 for padding; or None.
      query_positions: int (B, Q) or None: attend from these positions only (keys and values
        stay at all S), for a last layer whose other outputs nobody reads.
      queries: float (B, Q, H) or None: x at query_positions where the caller has gathered it
        (gather_with_whole).
      unpadded: an Unpadded of the batch, or None: x is then its real tokens' rows (1, R, H),
        and so is the output (or (B, Q, H) at query_positions).
    Returns float (B, S, H), or (B, Q, H) at query_positions.
    """

    def __init__(
        self,
        hidden_size,
        num_attention_heads,
        attention_probs_dropout_prob=0.1,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads "
                f"({num_attention_heads})"
            )
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.head_size = hidden_size // num_attention_heads
        self.qkv = Dense(3 * hidden_size, initializer_range=initializer_range, name="qkv")
        self.output_dense = Dense(hidden_size, initializer_range=initializer_range, name="output")
        self.dropout = Dropout(attention_probs_dropout_prob)

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.output_dense.build((*input_shape[:-1], self.hidden_size))

    def call(
        self,
        x,
        attention_mask=None,
        training=False,
        query_positions=None,
        queries=None,
        unpadded=None,
    ):
        n, d = self.num_attention_heads, self.head_size
        if unpadded is None:
            batch, seq = ops.shape(x)[0], ops.shape(x)[1]
        else:  # x: the real tokens' rows (1, R, H); attention runs on the (B, S) layout
            batch, seq = unpadded.batch, unpadded.seq
        if query_positions is None:
            qkv = self.qkv(x)
            if unpadded is not None:
                qkv = unpadded.positions(qkv)  # (1, R, 3H) -> (B, S, 3H), zeros at padding
            qkv = ops.reshape(qkv, (batch, seq, 3, n, d))  # (B, S, 3H) -> (B, S, 3, N, D)
            # One transpose puts every head's rows together for the batched matmuls below, and
            # splitting the leading axis takes contiguous blocks. Indexing qkv[:, :, i] instead
            # cost three strided slices whose gradients (StridedSliceGrad: a zero-filled
            # (B, S, 3H) tensor each, then summed) were 7% of the small pretraining step's op
            # time (bench/step_profile.py); einsums over (B, S, N, D) operands transpose each
            # one anyway.
            q, k, v = split_leading(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3)  # (B, N, S, D)
        else:
            # Queries only at the Q given positions; keys and values at all S. The fused kernel
            # is split by columns (its gradient is one concat, not two zero-filled slices).
            w_q, w_kv = ops.split(self.qkv.kernel, [self.hidden_size], axis=1)  # (H, H), (H, 2H)
            b_q, b_kv = ops.split(self.qkv.bias, [self.hidden_size], axis=0)
            if queries is not None:
                x_q = queries
            elif unpadded is not None:
                x_q = unpadded.at(x, query_positions)  # (1, R, H) -> (B, Q, H)
            else:
                x_q = gather_positions(x, query_positions)
            q = ops.reshape(ops.matmul(x_q, w_q) + b_q, (batch, -1, n, d))  # (B, Q, N, D)
            q = ops.transpose(q, (0, 2, 1, 3))  # (B, N, Q, D)
            kv = ops.matmul(x, w_kv) + b_kv
            if unpadded is not None:
                kv = unpadded.positions(kv)  # (1, R, 2H) -> (B, S, 2H)
            kv = ops.reshape(kv, (batch, seq, 2, n, d))
            k, v = split_leading(ops.transpose(kv, (2, 0, 3, 1, 4)), 2)  # (B, N, S, D)
        # The 1/sqrt(D) scale on q (B*S*H values) rather than on the (B, N, S, S) scores.
        q = q * (1.0 / math.sqrt(d))
        scores = ops.einsum("bnqd,bnkd->bnqk", q, k)  # (B, N, S or Q, S)
        if attention_mask is not None:
            # Additive mask of -10000 as the original BERT (modeling.py): exp() underflows to 0
            # in fp32 while staying finite in fp16 / bf16.
            keep = ops.cast(attention_mask, scores.dtype)[:, None, None, :]  # (B, 1, 1, S)
            scores = scores + (1.0 - keep) * -10000.0
        # Softmax in float32 under mixed precision (a no-op cast in fp32): half-precision
        # exp / sum loses the small probabilities.
        probs = ops.cast(ops.softmax(ops.cast(scores, "float32"), axis=-1), scores.dtype)
        probs = self.dropout(probs, training=training)
        context = ops.einsum("bnqk,bnkd->bnqd", probs, v)  # (B, N, S or Q, D)
        context = ops.transpose(context, (0, 2, 1, 3))  # (B, S or Q, N, D)
        context = ops.reshape(context, (batch, -1, self.hidden_size))  # (B, S or Q, H)
        if query_positions is None and unpadded is not None:
            context = unpadded.rows(context)  # (B, S, H) -> (1, R, H)
        return self.output_dense(context)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "initializer_range": self.initializer_range,
        }


@keras.saving.register_keras_serializable(package="cloze")
class TransformerBlock(keras.layers.Layer):
    """One post-LayerNorm Transformer encoder block, as BERT (Vaswani et al. 2017, sec. 3.1).

    x -> attention -> dropout -> LN(x + .) -> FFN(act) -> dropout -> LN(. + .)

    call(x, attention_mask, training, query_positions, unpadded): x float (B, S, H),
    attention_mask (B, S) -> (B, S, H); with query_positions int (B, Q), only the outputs at
    those positions, (B, Q, H). With unpadded (an Unpadded of the batch), x and the output are
    the real tokens' rows (1, R, H) (still (B, Q, H) at query_positions).
    A pretrainer's last block needs no more: its loss reads the [CLS] vector and the P masked
    positions, and every step after attention is per position. At sequence 128 with 20
    predictions this skips the Q projection, attention output, FFN and LayerNorms at 107 of 128
    positions, about 70% of the last layer's FLOPs; the outputs it does compute are the same.
    """

    def __init__(
        self,
        hidden_size,
        num_attention_heads,
        intermediate_size,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        initializer_range=0.02,
        layer_norm_eps=LAYER_NORM_EPSILON,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.layer_norm_eps = layer_norm_eps
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.attention = SelfAttention(
            hidden_size,
            num_attention_heads,
            attention_probs_dropout_prob,
            initializer_range,
            name="attention",
        )
        self.attention_dropout = Dropout(hidden_dropout_prob)
        self.attention_layer_norm = layer_norm("attention_layer_norm", layer_norm_eps)
        self.intermediate = Dense(
            intermediate_size, hidden_act, initializer_range, name="intermediate"
        )
        self.output_dense = Dense(hidden_size, initializer_range=initializer_range, name="output")
        self.output_dropout = Dropout(hidden_dropout_prob)
        self.output_layer_norm = layer_norm("output_layer_norm", layer_norm_eps)

    def build(self, input_shape):
        self.attention.build(input_shape)
        self.attention_layer_norm.build(input_shape)
        self.intermediate.build(input_shape)
        self.output_dense.build((*input_shape[:-1], self.intermediate_size))
        self.output_layer_norm.build(input_shape)

    def call(self, x, attention_mask=None, training=False, query_positions=None, unpadded=None):
        if query_positions is None:
            a = self.attention(x, attention_mask, training=training, unpadded=unpadded)
        else:  # keys and values read x whole; queries and the residual at the positions
            if unpadded is None:
                x, x_q = gather_with_whole(x, query_positions)  # (B, S, H), (B, Q, H)
            else:
                x_q = unpadded.at(x, query_positions)  # (1, R, H) -> (B, Q, H)
            a = self.attention(
                x,
                attention_mask,
                training=training,
                query_positions=query_positions,
                queries=x_q,
                unpadded=unpadded,
            )
            x = x_q
        x = residual_layer_norm(
            self.attention_layer_norm, x, a, self.attention_dropout, training=training
        )
        h = self.output_dense(self.intermediate(x))  # (B, S, I) -> (B, S, H)
        return residual_layer_norm(
            self.output_layer_norm, x, h, self.output_dropout, training=training
        )

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "initializer_range": self.initializer_range,
            "layer_norm_eps": self.layer_norm_eps,
        }
