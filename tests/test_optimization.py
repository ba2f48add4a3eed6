"""LAMB against a hand-computed NumPy step of the paper's Algorithm 2, with BERT's exclusions."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from training import optimization


def numpy_lamb(weights, grads_per_step, rates, wd, decayed, b1=0.9, b2=0.999, eps=1e-6):
    """You et al. 2019, Algorithm 2 in float64, one variable at a time; `rates[t]` the learning
    rate of step t; `decayed[i]` False for LayerNorm and biases: no decay and no trust ratio."""
    w = [x.astype(np.float64) for x in weights]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t, (grads, lr) in enumerate(zip(grads_per_step, rates), start=1):
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            r = (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + eps)
            ratio = 1.0
            if decayed[i]:
                r = r + wd * w[i]
                ratio = np.linalg.norm(w[i]) / np.linalg.norm(r)
            w[i] = w[i] - lr * ratio * r
    return w


def run_steps(opt, num_steps=3, seed=0):
    """Applies `num_steps` random gradients to three odd-shaped variables named as Cloze's layers
    name them (kernel: decayed; bias, gamma: excluded). Returns (start, grads, final)."""
    rng = np.random.default_rng(seed)
    shapes = {"kernel": (5, 3), "bias": (3,), "gamma": (7,)}
    variables = [
        keras.Variable(rng.normal(size=s).astype(np.float32), name=n) for n, s in shapes.items()
    ]
    start = [v.numpy().copy() for v in variables]
    grads = [[rng.normal(size=v.shape).astype(np.float32) for v in variables] for _ in range(3)]
    opt.build(variables)
    for step_grads in grads[:num_steps]:
        opt.apply([tf.constant(g) for g in step_grads], variables)
    return start, grads[:num_steps], [v.numpy() for v in variables]


def test_lamb_matches_numpy_algorithm_with_bert_exclusions():
    opt = optimization.create_optimizer(0.1, 1000, 0, weight_decay=0.3, optimizer="lamb")
    start, grads, got = run_steps(opt)
    # The schedule without warmup: 0.1 * (1 - t / 1000) at step t = 0, 1, 2.
    rates = [0.1 * (1 - t / 1000) for t in range(3)]
    want = numpy_lamb(start, grads, rates, 0.3, [True, False, False])
    for name, a, b in zip(["kernel", "bias", "gamma"], got, want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=name)
    # Negative control: the trust ratio and decay matter at these values.
    adam_like = numpy_lamb(start, grads, rates, 0.0, [False, False, False])
    assert not np.allclose(got[0], adam_like[0], rtol=1e-3)


def test_keras_lamb_differs_from_the_paper_with_bert_exclusions():
    """Why optimization.Lamb exists: keras.optimizers.Lamb trusts-ratios the excluded bias too
    (and decays outside the ratio). Should this fail, Keras' Lamb may now do what ours does."""
    ours = run_steps(optimization.create_optimizer(0.1, 1000, 0, 0.3, "lamb"), 1)[2]
    theirs = keras.optimizers.Lamb(learning_rate=0.1, weight_decay=0.3, epsilon=1e-6)
    theirs.exclude_from_weight_decay(var_names=list(optimization.NO_DECAY_PATTERNS))
    theirs = run_steps(theirs, 1)[2]
    assert not np.allclose(ours[1], theirs[1], rtol=1e-3)  # bias: ratio 1 here, not there


def test_unknown_optimizer_is_named():
    with pytest.raises(ValueError, match="expected one of.*'sgd'"):
        optimization.create_optimizer(0.1, 10, 0, optimizer="sgd")


def keras_adamw(learning_rate):
    """create_optimizer's AdamW settings on Keras' own AdamW (Keras' element-wise update)."""
    opt = keras.optimizers.AdamW(
        learning_rate=learning_rate, weight_decay=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6
    )
    opt.exclude_from_weight_decay(var_names=list(optimization.NO_DECAY_PATTERNS))
    return opt


def update_graph_ops(opt, var) -> list[str]:
    """The op types of one opt.apply to `var`, traced as a graph, its function calls' bodies
    included (the XLA kernel is a called function)."""
    graph = (
        tf.function(lambda g: opt.apply([g], [var]))
        .get_concrete_function(tf.TensorSpec(var.shape, tf.float32))
        .graph
    )
    types = [op.type for op in graph.get_operations()]
    for f in graph.as_graph_def().library.function:
        types += [node.op for node in f.node_def] + [f"attr:{k}" for k in f.attr]
    return types


@pytest.mark.parametrize("fused_min_size", [0, 8])
def test_fused_adamw_equals_keras_adamw_over_steps(fused_min_size):
    # The fused updates against Keras' AdamW: same weights after 3 steps (decayed kernel,
    # excluded bias and gamma), float32 rounding apart. fused_min_size 0: every variable goes
    # through the one-pass XLA kernel; 8: the (5, 3) kernel does, the bias (3,) and gamma (7,)
    # take the decay multiply + ApplyAdam path.
    schedule = optimization.WarmupLinearDecay(1e-2, 10, 2)
    fused = optimization.create_optimizer(1e-2, 10, 2)
    assert type(fused) is optimization.AdamW
    fused.fused_min_size = fused_min_size
    start, grads, mine = run_steps(fused, num_steps=3)
    _, _, theirs = run_steps(keras_adamw(schedule), num_steps=3)
    for a, b, s in zip(mine, theirs, start):
        assert not np.allclose(a, s)  # the steps moved every variable
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # ... and the fused kernels are what ran, once per variable: the XLA one from
    # fused_min_size elements, ApplyAdam below, and no separate decay assignment either way.
    for shape, xla in [((3, 5), fused_min_size <= 15), ((5,), fused_min_size <= 5)]:
        var = keras.Variable(np.ones(shape, np.float32), name="kernel")
        opt = optimization.create_optimizer(1e-2, 10, 2)
        opt.fused_min_size = fused_min_size
        opt.build([var])
        types = update_graph_ops(opt, var)
        assert types.count("ResourceApplyAdam") == (0 if xla else 1), shape
        assert types.count("AssignSubVariableOp") == (0 if xla else 1), shape  # the decay
        assert ("attr:_XlaMustCompile" in types) == xla, shape


def test_adamw_computes_the_shared_scalars_once_per_apply():
    # The bias corrections' powers beta_1^t and beta_2^t (and the other per-step scalars) once
    # per apply over 3 variables, both update paths (the XLA kernel for the (5, 3) kernel,
    # ApplyAdam below), where Keras' AdamW computes them per variable (the negative control);
    # the values are tested against Keras' above.
    def pow_ops(opt, variables):
        opt.build(variables)
        specs = [tf.TensorSpec(v.shape, tf.float32) for v in variables]
        graph = tf.function(lambda *g: opt.apply(list(g), variables)).get_concrete_function(*specs)
        return [op.type for op in graph.graph.get_operations()].count("Pow")

    def variables():
        return [keras.Variable(np.ones(s, np.float32), name=n) for n, s in
                [("kernel", (5, 3)), ("bias", (3,)), ("gamma", (7,))]]  # fmt: skip

    opt = optimization.create_optimizer(1e-2, 10, 2)
    opt.fused_min_size = 8
    assert pow_ops(opt, variables()) == 2
    assert opt._step_scalars is None  # nothing carried into the next apply
    assert pow_ops(keras_adamw(optimization.WarmupLinearDecay(1e-2, 10, 2)), variables()) == 6


def scale_gradient(g, scale):
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * scale, g.indices, g.dense_shape)
    return g * scale


@pytest.mark.parametrize("fused_min_size", [0, 8, 1 << 62])
def test_apply_scaled_equals_apply_of_the_scaled_gradients(fused_min_size):
    # AdamW.apply_scaled(grads, vars, s) (the Trainer's clipping factor multiplied in inside
    # the update) against apply([g * s ...]) over 3 steps, through the XLA kernel (0), the
    # ApplyAdam path (bias and gamma at 8, everything at 2^62) and IndexedSlices gradients
    # (Keras' update); and the factor is not left behind for a later plain apply.
    scales = [0.37, 1.0, 0.05]

    def run(scaled, sparse=False):
        rng = np.random.default_rng(3)
        shapes = {"kernel": (5, 3), "bias": (3,), "gamma": (7,)}
        variables = [
            keras.Variable(rng.normal(size=s).astype(np.float32), name=n) for n, s in shapes.items()
        ]
        opt = optimization.create_optimizer(1e-2, 10, 2)
        opt.fused_min_size = fused_min_size
        opt.build(variables)
        for scale in scales:
            grads = [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in variables]
            if sparse:
                grads[0] = tf.IndexedSlices(grads[0], tf.range(5), tf.constant([5, 3]))
            if scaled:
                opt.apply_scaled(grads, variables, tf.constant(scale))
                assert opt._gradient_scale is None
            else:
                opt.apply([scale_gradient(g, scale) for g in grads], variables)
        return [v.numpy() for v in variables]

    for sparse in (False, True):
        for name, a, b in zip(["kernel", "bias", "gamma"], run(True, sparse), run(False, sparse)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"{name} {sparse}")
    # Negative control: the factor changes the result (Adam is not scale-invariant with eps and
    # over steps of different factors).
    plain = run(False)
    scales[:] = [1.0, 1.0, 1.0]
    assert not np.allclose(run(True)[0], plain[0], rtol=1e-4)


@pytest.mark.parametrize("fused_min_size", [0, 1 << 16])
def test_fused_adamw_under_mirrored_strategy_updates_each_replica_alike(fused_min_size):
    # Inside MirroredStrategy's update() the fused kernels (XLA at 0, ApplyAdam at the default)
    # must write each device's copy of the variable and of its moments: both replicas end equal
    # to the one-device Keras AdamW.
    strategy = helpers.mirrored_strategy()
    rng = np.random.default_rng(4)
    init = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(2)]
    with strategy.scope():
        var = keras.Variable(init, name="kernel")
        opt = optimization.create_optimizer(1e-2, 10, 0)
        opt.fused_min_size = fused_min_size
        opt.build([var])

    @tf.function
    def step(g):
        strategy.run(lambda: opt.apply([g], [var]))

    for g in grads:
        step(tf.constant(g))
    ref_var = keras.Variable(init, name="kernel")
    ref = keras_adamw(optimization.WarmupLinearDecay(1e-2, 10, 0))
    ref.build([ref_var])
    for g in grads:
        ref.apply([tf.constant(g)], [ref_var])
    copies = strategy.experimental_local_results(var.value)
    assert len(copies) == 2
    for copy in copies:
        np.testing.assert_allclose(copy.numpy(), ref_var.numpy(), rtol=1e-6, atol=1e-7)


def test_precision_table_matches_the_keras_policies_and_imports_nothing():
    # training/precision.py is read where TensorFlow is absent (bench/gpu_mfu.py under JAX,
    # bench/peer_worker.py under PyTorch): its compute dtypes must be what the policies that
    # training/optimization.py builds compute in, and importing it must load no library.
    from training import precision

    assert optimization.PRECISIONS is precision.POLICIES
    assert precision.PRECISION_NAMES[0] == "fp32"
    for name in precision.PRECISION_NAMES:
        policy = keras.DTypePolicy(precision.POLICIES[name])
        assert (policy.variable_dtype, policy.compute_dtype) == (
            "float32",
            precision.COMPUTE_DTYPES[name],
        )
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import training.precision\n"
        "added = set(sys.modules) - before - {'__future__', 'training', 'training.precision'}\n"
        "assert not added, sorted(added)\n"
    )
    helpers.run_python(code)
