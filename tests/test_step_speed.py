"""The pretraining step's speed changes (issue #9) compute what the plain path computes.

Layers are checked against keras-hub's BERT (written by others): the same weights give the same
loss and the same gradients for every variable, through the Trainer's pretraining task. Odd tiny
sizes (batch 3, length 7, hidden 12, 3 heads, intermediate 17) so a swapped axis cannot pass.
"""

from __future__ import annotations

import collections
import json
import math
import os

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from bench import pretrain_throughput, step_profile
from modeling import bert, layers
from tests import helpers
from tests.test_bert import copy_into_keras_hub
from training import optimization, tasks

SIZE = "L2/H12/A3/I17"
VOCAB, BATCH, SEQ, PREDICTIONS = 53, 3, 7, 2


def tiny_config(**changes) -> bert.BertConfig:
    config = pretrain_throughput.parse_size(SIZE, vocab_size=VOCAB, max_seq_length=SEQ)
    # keras-hub's BERT computes the exact erf GELU; dropout off so both are deterministic.
    # Large initial weights make a wrong axis or a dropped term visible.
    return config.replace(
        hidden_act="gelu_exact",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
        **changes,
    )


def hub_from_cloze(model: bert.BertPretrainer):
    """keras-hub's pretrainer (bench/pretrain_throughput.py) holding `model`'s weights, and a map
    from each Cloze variable path to (keras-hub variable, reshape of its value into Cloze's
    layout)."""
    hub = pretrain_throughput.KerasHubPretrainer(model.config)
    # Found by type: Keras numbers the name (bert_backbone_1, ...) after the first in a process.
    backbone = next(x for x in hub.model.layers if isinstance(x, keras_hub.models.BertBackbone))
    copy_into_keras_hub(model.encoder, backbone)
    head = hub.model.get_layer("mlm_head")
    head._intermediate_dense.set_weights(model.masked_lm.transform.get_weights())
    head._intermediate_layer_norm.set_weights(model.masked_lm.layer_norm.get_weights())
    # keras-hub's MaskedLMHead defaults to LayerNorm epsilon 1e-5; BERT's (and Cloze's) is 1e-12.
    head._intermediate_layer_norm.epsilon = 1e-12
    head._bias.assign(model.masked_lm.output_bias)  # keras-hub's vocabulary bias
    hub.model.get_layer("next_sentence").set_weights(model.next_sentence.dense.get_weights())

    h = model.config.hidden_size
    by_path = {v.path: v for v in hub.trainable_variables}
    same = {
        "embeddings/word_embeddings": "token_embedding/embeddings",
        "embeddings/token_type_embeddings": "segment_embedding/embeddings",
        "embeddings/position_embeddings": "position_embedding/embeddings",
        "embeddings/layer_norm/gamma": "embeddings_layer_norm/gamma",
        "embeddings/layer_norm/beta": "embeddings_layer_norm/beta",
        "pooler/kernel": "pooled_dense/kernel",
        "pooler/bias": "pooled_dense/bias",
        "masked_lm/output_bias": "mlm_head/output_bias",
        "masked_lm/transform/kernel": "mlm_head/intermediate_dense/kernel",
        "masked_lm/transform/bias": "mlm_head/intermediate_dense/bias",
        "masked_lm/layer_norm/gamma": "mlm_head/intermediate_layer_norm/gamma",
        "masked_lm/layer_norm/beta": "mlm_head/intermediate_layer_norm/beta",
        "next_sentence/dense/kernel": "next_sentence/kernel",
        "next_sentence/dense/bias": "next_sentence/bias",
    }
    for i in range(model.config.num_hidden_layers):
        t, c = f"transformer_layer_{i}/", f"layer_{i}/"
        same |= {
            c + "attention/output/bias": t + "self_attention_layer/attention_output/bias",
            c + "attention_layer_norm/gamma": t + "self_attention_layer_norm/gamma",
            c + "attention_layer_norm/beta": t + "self_attention_layer_norm/beta",
            c + "intermediate/kernel": t + "feedforward_intermediate_dense/kernel",
            c + "intermediate/bias": t + "feedforward_intermediate_dense/bias",
            c + "output/kernel": t + "feedforward_output_dense/kernel",
            c + "output/bias": t + "feedforward_output_dense/bias",
            c + "output_layer_norm/gamma": t + "feedforward_layer_norm/gamma",
            c + "output_layer_norm/beta": t + "feedforward_layer_norm/beta",
        }
    mapping = {}
    for v in model.trainable_variables:
        # Without the model's own name, which Keras numbers (bert_pretrainer_11, ...) when other
        # tests in this process built pretrainers first.
        mine = v.path.split("/", 1)[1].removeprefix("encoder/")
        if mine in same:
            mapping[v.path] = ([by_path[same[mine]]], lambda a: a[0])
            continue
        layer = mine.split("/")[0]
        att = f"transformer_layer_{layer.split('_')[1]}/self_attention_layer/"
        if mine.endswith("attention/qkv/kernel"):  # (H, N, D) x 3 -> (H, 3H), order q, k, v
            parts = [by_path[att + p + "/kernel"] for p in ("query", "key", "value")]
            mapping[v.path] = (parts, lambda a: np.concatenate([x.reshape(h, h) for x in a], 1))
        elif mine.endswith("attention/qkv/bias"):  # (N, D) x 3 -> (3H,)
            parts = [by_path[att + p + "/bias"] for p in ("query", "key", "value")]
            mapping[v.path] = (parts, lambda a: np.concatenate([x.reshape(h) for x in a]))
        elif mine.endswith("attention/output/kernel"):  # (N, D, H) -> (H, H)
            parts = [by_path[att + "attention_output/kernel"]]
            mapping[v.path] = (parts, lambda a: a[0].reshape(h, h))
        else:
            raise AssertionError(f"no keras-hub counterpart mapped for {v.path}")
    return hub, mapping


def loss_and_grads(model, batch):
    """The pretraining task's loss (MLM mean + NSP mean) and its gradients."""
    task = tasks.bert_pretraining_task(model)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        sums = task.sums_fn(batch, training=True)
        loss = sums["mlm_loss_sum"] / sums["mlm_weight"] + sums["nsp_loss_sum"] / sums["nsp_count"]
    grads = tape.gradient(loss, variables)
    return float(loss), {v.path: tf.convert_to_tensor(g).numpy() for v, g in zip(variables, grads)}


def test_pretraining_loss_and_every_gradient_match_keras_hub():
    # Covers the attention's one-transpose Q/K/V layout and the einsum tied MLM projection
    # (modeling/layers.py, modeling/heads.py) against keras-hub's separate Q/K/V EinsumDense
    # layers and its ReversibleEmbedding: float32, same weights. Tolerances: loss 2e-5 relative,
    # each gradient 5e-4 of its largest entry (float32 rounding of two op orders and two exact-GELU
    # implementations, measured up to 2.6e-4 before and after the speed changes alike; a swapped
    # axis or a lost term is off by O(1) of it).
    config = tiny_config()
    keras.utils.set_random_seed(7)
    model = bert.BertPretrainer(config)
    model.build()
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=3)
    # Padding in one row, so the attention mask matters; its predictions at real positions, since
    # keras-hub also masks padded queries (their outputs differ by design and are never scored).
    batch["input_mask"][1, 5:] = 0
    batch["masked_lm_positions"][1] = [1, 3]
    batch = {k: tf.constant(v) for k, v in batch.items()}
    hub, mapping = hub_from_cloze(model)
    loss, grads = loss_and_grads(model, batch)
    hub_loss, hub_grads = loss_and_grads(hub, batch)
    assert loss > 1.0  # a real loss at these large random weights, not a degenerate 0
    assert loss == pytest.approx(hub_loss, rel=2e-5)
    assert set(mapping) == set(grads)
    for path, (parts, to_cloze) in mapping.items():
        theirs = to_cloze([hub_grads[p.path] for p in parts])
        scale = max(np.abs(theirs).max(), 1e-3)
        np.testing.assert_allclose(grads[path], theirs, atol=5e-4 * scale, err_msg=path)


def test_gelu_tanh_and_its_gradient_equal_the_formula():
    # gelu_tanh cubes by multiplication, not Pow: same values and derivative as the formula
    # in float64 numpy, within float32 rounding.
    x = np.linspace(-6.0, 6.0, 241).astype("float32")
    c = math.sqrt(2.0 / math.pi)
    x64 = x.astype("float64")
    inner = c * (x64 + 0.044715 * np.power(x64, 3))
    want = 0.5 * x64 * (1.0 + np.tanh(inner))
    d_inner = c * (1.0 + 3 * 0.044715 * x64**2)
    want_grad = 0.5 * (1.0 + np.tanh(inner)) + 0.5 * x64 * (1.0 - np.tanh(inner) ** 2) * d_inner
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = layers.gelu_tanh(xt)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-6)
    # atol 1e-5: float32 tanh saturates below x = -5, where the true derivative is under 1e-5.
    np.testing.assert_allclose(tape.gradient(y, xt).numpy(), want_grad, rtol=1e-5, atol=1e-5)


def test_profile_breakdown_sums_op_types_and_phases(tmp_path):
    a = tf.constant(np.ones((37, 41), np.float32))
    w = tf.Variable(np.ones((41, 23), np.float32))
    # An XLA kernel inside the plain graph, as the fused GELU: counted as one XLA call, whole,
    # under its call op's name (its fusion, nested inside, not again).
    squash = tf.function(lambda x: x * x * 0.5 + x, jit_compile=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(squash(tf.matmul(a, w)))
        return tape.gradient(loss, w)

    step()
    tf.profiler.experimental.start(str(tmp_path))
    for _ in range(3):
        step()
    tf.profiler.experimental.stop()
    files = list(tmp_path.rglob("*.xplane.pb"))
    assert len(files) == 1
    events = list(step_profile.read_op_events(str(files[0])))
    types = {t for _, t, _ in events}
    assert "MatMul" in types and all(s >= 0 for _, _, s in events)
    result = step_profile.breakdown(events)
    assert result["total_op_s"] == pytest.approx(sum(s for _, _, s in events))
    assert sum(v["share"] for v in result["by_phase"].values()) == pytest.approx(1.0)
    # The gradient's matmul runs under the tape's name scope: the backward phase.
    assert any("gradient_tape" in n for n, t, _ in events if t == "MatMul")
    assert result["by_phase"]["backward"]["s"] > 0
    assert {t for n, t, _ in events if n.startswith("xla/")} == {"XlaCall"}, events
    assert not any("fusion" in n for n, _, _ in events), events
    assert "end" not in {n for n, _, _ in events}  # XLA's end-of-kernel markers are not ops
    assert result["by_phase"]["xla"]["s"] > 0
    with pytest.raises(ValueError, match="no TensorFlow op"):
        step_profile.breakdown([])


def test_step_profile_builds_both_sides_at_the_precision_asked():
    # `python -m bench.step_profile --precision=bf16` profiles the mixed-precision steps, not
    # float32 ones under another label.
    result = step_profile.run("L1/H32/A2/I64", 2, 16, 2, 1, False, "bf16")
    assert result["precision"] == "bf16"
    for side in ("cloze", "keras_hub"):
        assert result[side]["compute_dtype"] == "bfloat16"
        assert result[side]["by_phase"]["backward"]["s"] > 0


def test_step_profile_one_op_at_a_time_adds_op_time_up_to_the_wall_time(tmp_path):
    # `python -m bench.step_profile --one_op_at_a_time`: in a fresh process TensorFlow runs one
    # op at a time, so each side's op time fits inside its wall time and the rest is reported.
    out = tmp_path / "profile.json"
    printed = _python_under(
        "tensorflow", "-m", "bench.step_profile", "--size=L1/H32/A2/I64", "--batch=2",
        "--seq=16", "--predictions=2", "--steps=2", "--one_op_at_a_time", f"--output={out}",
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["inter_op_threads"] == 1
    for side in ("cloze", "keras_hub"):
        assert result[side]["outside_ops_s_per_step"] >= 0, result[side]
        assert f"{result[side]['outside_ops_s_per_step']:.3f} s outside ops" in printed, printed
    # Cloze's XLA kernels are counted by call, under the call op's name: the vocabulary-sized
    # table's one-pass AdamW update among them.
    assert result["cloze"]["by_phase"]["xla"]["s"] > 0
    assert any(
        op.startswith("xla/") and "adam_w" in op and op.endswith(":XlaCall")
        for op in result["cloze"]["top_ops"]
    ), result["cloze"]["top_ops"]
    # Once this process has run TensorFlow: a clear refusal, its threading left as it was.
    assert float(tf.constant(1.0) + 1.0) == 2.0  # the runtime has started
    before = tf.config.threading.get_inter_op_parallelism_threads()
    with pytest.raises(RuntimeError, match="fresh process"):
        step_profile.run("L1/H32/A2/I64", 2, 16, 2, 1, False, "fp32", one_op_at_a_time=True)
    assert tf.config.threading.get_inter_op_parallelism_threads() == before


def _xspace_file(tmp_path, events) -> str:
    """An XSpace file with one executor line (tf_Compute) of `events`: (name, start us,
    duration us, {stat: string value}) each; an intra-op thread's line repeats them, and only
    the executor line's count."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    executor, intra_op = (
        plane.lines.add(name="tf_Compute/1"),
        plane.lines.add(name="tf_numa_-1_Eigen/2"),
    )
    event_ids, stat_ids = {}, {}
    for name, start, duration, stats in events:
        if name not in event_ids:
            event_ids[name] = len(event_ids) + 1
            plane.event_metadata[event_ids[name]].name = name
        for line in (executor, intra_op):
            event = line.events.add(
                metadata_id=event_ids[name], offset_ps=start * 10**6, duration_ps=duration * 10**6
            )
            for key, value in stats.items():
                if key not in stat_ids:
                    stat_ids[key] = 1000 + len(stat_ids)
                    plane.stat_metadata[stat_ids[key]].name = key
                event.stats.add(metadata_id=stat_ids[key], str_value=value)
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return str(path)


def test_read_op_events_counts_xla_calls_whole_and_their_fusions_once(tmp_path):
    # An XLA call is an asynchronous op: its ProcessAsync::Start event lasts the whole call
    # (its fusions on this thread, its thunks elsewhere, the wait) and is named by stats. The
    # fusion inside it is not counted again; one outside any call is; another asynchronous op
    # keeps its kernel type; synchronous "name:Type" ops and bookkeeping as before. An
    # execution whose call's events the profiler lost (it did, in a trace's first step on a busy
    # machine) is a call of its own, its fusion not counted again.
    path = _xspace_file(
        tmp_path,
        [
            ("ExecutorState::Process", 0, 100, {}),
            ("enc/MatMul:_MklMatMul", 1, 10, {}),
            (
                "ExecutorState::ProcessAsync::Start",
                20,
                30,
                {"name": "enc/layer_0/PartitionedCall", "kernel_type": "PartitionedCall"},
            ),
            ("CpuExecutable::ExecuteAsyncOnStream", 21, 28, {}),
            ("add_multiply_fusion", 22, 5, {}),
            ("end: add_multiply_fusion", 27, 0, {}),
            (
                "ExecutorState::ProcessAsync::Start",
                60,
                4,
                {"name": "IteratorGetNext", "kernel_type": "IteratorGetNext"},
            ),
            ("select_fusion", 70, 3, {}),
            ("CpuExecutable::ExecuteAsyncOnStream", 80, 8, {}),
            ("add_add_fusion", 81, 2, {}),
            ("end: add_add_fusion", 83, 0, {}),
            ("enc/Softmax:Softmax", 90, 1, {}),
        ],
    )
    got = sorted(
        (name, kind, round(s * 1e6, 6)) for name, kind, s in step_profile.read_op_events(path)
    )
    assert got == [
        ("IteratorGetNext", "IteratorGetNext", 4.0),
        ("enc/MatMul", "MatMul", 10.0),
        ("enc/Softmax", "Softmax", 1.0),
        ("xla/?", "XlaCall", 8.0),
        ("xla/enc/layer_0/PartitionedCall", "XlaCall", 30.0),
        ("xla/select_fusion", "XlaFusion", 3.0),
    ]


def test_op_types_lose_the_onednn_prefix():
    # TensorFlow's oneDNN build traces MatMul as _MklMatMul (on by default on AVX-512 VNNI /
    # BF16 CPUs); the profile's tables name both builds' ops alike.
    assert step_profile.op_type_of("_MklMatMul") == "MatMul"
    assert step_profile.op_type_of("_MklBatchMatMulV2") == "BatchMatMulV2"
    assert step_profile.op_type_of("_MklNativeFusedMatMul") == "FusedMatMul"
    assert step_profile.op_type_of("MatMul") == "MatMul"
    assert step_profile.op_type_of("Mkl") == "Mkl"


def test_phase_of_names():
    assert step_profile.phase_of("while/gradient_tape/x/MatMul") == "backward"
    assert step_profile.phase_of("while/cond/adam_w/Mul_3") == "optimizer"
    assert step_profile.phase_of("while/bert_pretrainer_1/encoder/MatMul") == "forward"
    assert step_profile.phase_of("while/softmax_xent/Exp") == "forward"
    assert step_profile.phase_of("while/softmax_xent/softmax_xent_backward/Mul") == "backward"
    assert step_profile.phase_of("while/global_norm/L2Loss") == "other"
    assert step_profile.phase_of("xla/add_multiply_fusion") == "xla"


def _gelu_float64(name, x64):
    """GELU and its derivative in float64 at x64: the tanh form ("gelu") or the erf form."""
    if name == "gelu":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (x64 + 0.044715 * x64**3))
        value = 0.5 * x64 * (1.0 + t)
        return value, 0.5 * (1.0 + t) + 0.5 * x64 * (1.0 - t**2) * c * (1.0 + 3 * 0.044715 * x64**2)
    from scipy.special import erf

    cdf = 0.5 * (1.0 + erf(x64 / math.sqrt(2.0)))
    return x64 * cdf, cdf + x64 * np.exp(-0.5 * x64**2) / math.sqrt(2.0 * math.pi)


@pytest.mark.parametrize("name", ["gelu", "gelu_exact"])
def test_fused_gelu_values_and_gradients_equal_the_formulas(name):
    # The XLA-compiled forward and gradient kernels (layers.fused_activation) against the
    # float64 formulas. Tolerances as gelu_tanh's own test: float32 rounding (XLA has its own
    # tanh and erf); a wrong derivative term is off by O(0.1).
    x = np.linspace(-6.0, 6.0, 241).astype("float32")
    want, want_grad = _gelu_float64(name, x.astype("float64"))
    fused = layers.fused_activation(name)
    assert fused is not None
    xt = tf.constant(x)
    upstream = tf.constant(np.linspace(0.5, 2.0, 241).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = fused(xt)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-6)
    grad = tape.gradient(y, xt, output_gradients=upstream).numpy()
    np.testing.assert_allclose(grad, want_grad * upstream.numpy(), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["gelu", "gelu_exact"])
def test_fused_gelu_on_bfloat16_rounds_the_float32_result(name):
    # Under mixed_bfloat16 the kernels compute in float32 and round once, so values and
    # gradients are within 2 bfloat16 ulps (2 x 2^-8 relative) of the float64 formulas at the
    # bf16 inputs. Computed in bfloat16 (the kernels before) they were off by 14% and 61%.
    x = tf.cast(tf.constant(np.linspace(-6.0, 6.0, 241).astype("float32")), tf.bfloat16)
    upstream = tf.cast(tf.constant(np.linspace(0.5, 2.0, 241).astype("float32")), tf.bfloat16)
    want, want_grad = _gelu_float64(name, tf.cast(x, tf.float64).numpy())
    want_grad = want_grad * tf.cast(upstream, tf.float64).numpy()
    fused = layers.fused_activation(name)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fused(x)
    grad = tape.gradient(y, x, output_gradients=upstream)
    assert y.dtype == tf.bfloat16 and grad.dtype == tf.bfloat16
    got, got_grad = (tf.cast(v, tf.float64).numpy() for v in (y, grad))
    np.testing.assert_allclose(got, want, rtol=2 * 2.0**-8, atol=1e-4)
    np.testing.assert_allclose(got_grad, want_grad, rtol=2 * 2.0**-8, atol=1e-4)


@pytest.mark.parametrize("xla", [False, True], ids=["eager", "xla"])
def test_kernel_cast_moves_bfloat16_bits_as_tf_cast_rounds(xla):
    # layers.kernel_cast against TensorFlow's Cast: every one of the 65,536 bfloat16 patterns
    # widened, and 2^20 random float32 patterns plus the edge cases narrowed (ties to even both
    # ways, the largest finite values and the overflow to inf, subnormals, signed zeros and
    # infinities), bit for bit; NaNs stay NaN.
    cast = tf.function(layers.kernel_cast, jit_compile=xla, autograph=False)
    every = tf.bitcast(tf.constant(np.arange(1 << 16, dtype=np.uint16)), tf.bfloat16)
    wide, want = cast(every, tf.float32), tf.cast(every, tf.float32)
    nan = np.isnan(want.numpy())
    assert nan.sum() == 2 * 127 and np.isnan(wide.numpy()[nan]).all()
    np.testing.assert_array_equal(
        tf.bitcast(wide, tf.uint32).numpy()[~nan], tf.bitcast(want, tf.uint32).numpy()[~nan]
    )
    edges = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # zeros, infinities
        0x3F808000, 0x3F818000, 0xBF808000, 0x3F808001, 0x3F807FFF,  # ties to even, near ties
        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF,  # to inf, to inf (tie), down, to -inf
        0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x80008001,  # subnormals
        0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7FFFFFFF, 0xFF80FFFF,  # NaNs
    ]  # fmt: skip
    rng = np.random.default_rng(21)
    bits = np.concatenate([rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64), edges])
    x = tf.bitcast(tf.constant(bits.astype(np.uint32)), tf.float32)
    narrow, want = cast(x, tf.bfloat16), tf.cast(x, tf.bfloat16)
    assert narrow.dtype == tf.bfloat16
    nan = np.isnan(x.numpy())
    assert nan.sum() > 1000 and np.isnan(tf.cast(narrow, tf.float32).numpy()[nan]).all()
    np.testing.assert_array_equal(
        tf.bitcast(narrow, tf.uint16).numpy()[~nan], tf.bitcast(want, tf.uint16).numpy()[~nan]
    )
    # Other pairs are tf.cast.
    np.testing.assert_array_equal(cast(tf.constant([1.5, -2.0]), tf.float16).numpy(), [1.5, -2.0])


def test_dense_uses_the_fused_activation_only_in_training():
    # training=True goes through the XLA kernels, anything else through the plain ops (what a
    # SavedModel export traces); both give the same values.
    assert layers.fused_activation("relu") is None and layers.fused_activation("tanh") is None
    dense = layers.Dense(5, activation="gelu", initializer_range=0.5)
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32"))
    dense.build(x.shape)

    def op_types(training):
        graph = tf.function(lambda v: dense(v, training=training)).get_concrete_function(x).graph
        return {op.type for op in graph.get_operations()}

    assert "Tanh" not in op_types(True) and "Tanh" in op_types(False)
    np.testing.assert_allclose(
        dense(x, training=True).numpy(), dense(x, training=False).numpy(), rtol=1e-6, atol=1e-6
    )


def test_softmax_xent_and_hits_equal_tensorflow_and_argmax():
    # Cloze's fused cross-entropy (modeling/losses.py) against TensorFlow's own
    # SparseSoftmaxCrossEntropyWithLogits and ArgMax: values, gradients under a non-uniform
    # upstream gradient, and hits, on (2, 5, 37) logits with labels at and off the argmax.
    from modeling import losses

    rng = np.random.default_rng(1)
    logits = tf.constant(rng.normal(scale=3.0, size=(2, 5, 37)).astype("float32"))
    labels = rng.integers(0, 37, (2, 5)).astype("int32")
    labels[0, :3] = np.argmax(logits.numpy()[0, :3], axis=-1)  # some certain hits
    labels = tf.constant(labels)
    upstream = tf.constant(rng.uniform(0.1, 2.0, (2, 5)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ce, hits = losses.softmax_xent_and_hits(logits, labels)
        want = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    np.testing.assert_allclose(ce.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        tape.gradient(ce, logits, output_gradients=upstream).numpy(),
        tape.gradient(want, logits, output_gradients=upstream).numpy(),
        rtol=1e-6,
        atol=1e-7,
    )
    want_hits = (np.argmax(logits.numpy(), -1) == labels.numpy()).astype("float32")
    assert want_hits.sum() >= 3
    np.testing.assert_array_equal(hits.numpy(), want_hits)
    with pytest.raises(tf.errors.InvalidArgumentError):
        losses.softmax_xent_and_hits(logits, tf.fill((2, 5), 37))  # a label past the vocabulary


def test_tied_logits_equal_a_plain_matmul_and_its_gradients():
    # The vocabulary-first projection (modeling/heads.tied_logits) against x @ table^T in
    # float64 numpy, forward and both gradients.
    from modeling import heads

    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(2, 3, 4)).astype("float32"))
    table = tf.constant(rng.normal(size=(11, 4)).astype("float32"))
    upstream = rng.normal(size=(2, 3, 11)).astype("float32")
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, table])
        y = heads.tied_logits(x, table)
    x64, t64, u64 = x.numpy().astype("float64"), table.numpy().astype("float64"), upstream
    np.testing.assert_allclose(y.numpy(), x64 @ t64.T, rtol=1e-5, atol=1e-5)
    dx, dt = tape.gradient(y, [x, table], output_gradients=tf.constant(upstream))
    np.testing.assert_allclose(dx.numpy(), u64 @ t64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dt.numpy(), np.einsum("bpv,bpe->ve", u64, x64), rtol=1e-5, atol=1e-5)


def _plain_views(table, compute_dtype, lookups=1):
    """heads.tied_table_views without its gradient: TensorFlow's own aggregation."""
    return [table] * lookups, table


def _op_counts(fn) -> collections.Counter:
    """How many ops of each type the traced tf.function `fn` holds."""
    return collections.Counter(op.type for op in fn.get_concrete_function().graph.get_operations())


def _op_types(fn) -> set:
    return set(_op_counts(fn))


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_tied_table_views_add_every_lookup_row_into_the_head_gradient(jit_compile):
    # Two lookups with repeated ids (a row looked up 3 times and twice across both) and a head
    # projecting through the table: the one-pass sum (ScatterNdNonAliasingAdd; inside XLA
    # TensorScatterAdd) against TensorFlow's own aggregation (zero-filled UnsortedSegmentSum +
    # AddN), float32, 1e-6 of the largest entry.
    from modeling import heads

    rng = np.random.default_rng(4)
    table = tf.Variable(rng.normal(size=(11, 4)).astype("float32"))
    ids = [tf.constant([[1, 2, 2], [7, 1, 0]]), tf.constant([2, 10, 2])]
    weights = [tf.constant(rng.normal(size=(*i.shape, 4)).astype("float32")) for i in ids]
    x = tf.constant(rng.normal(size=(5, 4)).astype("float32"))

    def gradient(views_fn, head=True, dense_lookup=False):
        def step():
            with tf.GradientTape() as tape:
                lookup_views, head_view = views_fn(table, "float32", lookups=2)
                loss = sum(
                    tf.reduce_sum(tf.gather(tf.convert_to_tensor(t), i) * w)
                    for t, i, w in zip(lookup_views, ids, weights)
                )
                if dense_lookup:  # a use whose gradient is dense: summed with the head's
                    loss += tf.reduce_sum(tf.convert_to_tensor(lookup_views[1])[:3] ** 2)
                if head:
                    logits = tf.matmul(tf.convert_to_tensor(head_view), x, transpose_b=True)
                    loss += tf.reduce_sum(tf.nn.log_softmax(logits, axis=0) ** 2)
            return tf.convert_to_tensor(tape.gradient(loss, table))

        return tf.function(step, jit_compile=jit_compile)

    for head, dense_lookup in [(True, False), (False, False), (True, True)]:
        ours = gradient(heads.tied_table_views, head, dense_lookup)
        theirs = gradient(_plain_views, head, dense_lookup)
        want = theirs().numpy()
        assert np.abs(want).max() > 0.1
        np.testing.assert_allclose(ours().numpy(), want, atol=1e-6 * np.abs(want).max())
        if not dense_lookup:  # one pass, where TensorFlow's is two
            scatter, not_there = ("ScatterNdNonAliasingAdd", "TensorScatterAdd")[
                :: -1 if jit_compile else 1
            ]
            assert scatter in _op_types(ours) and not_there not in _op_types(ours)
            assert "UnsortedSegmentSum" not in _op_types(ours)
            assert "UnsortedSegmentSum" in _op_types(theirs)


def test_rows_add_into_a_buffer_only_when_nothing_else_reads_it():
    # layers.add_rows may add into its input's buffer (ScatterNdNonAliasingAdd): where the
    # input is read again afterwards, that reader must still see the input, not the sum.
    rng = np.random.default_rng(8)
    a, b = (tf.constant(rng.normal(size=s).astype("float32")) for s in [(6, 5), (5, 4)])
    indices = tf.constant([[2], [0], [2]], tf.int64)
    rows = tf.constant(rng.normal(size=(3, 4)).astype("float32"))

    @tf.function
    def both():
        dense = tf.matmul(a, b)
        total = layers.add_rows(dense, indices, rows)
        return total, dense * 1.0  # dense read after the add

    total, dense = (t.numpy() for t in both())
    want = (a.numpy() @ b.numpy()).astype("float32")
    np.testing.assert_allclose(dense, want, rtol=1e-6)
    want[2] += rows.numpy()[0] + rows.numpy()[2]
    want[0] += rows.numpy()[1]
    np.testing.assert_allclose(total, want, rtol=1e-6, atol=1e-6)
    assert "ScatterNdNonAliasingAdd" in _op_types(both)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_gather_with_whole_adds_the_gathered_rows_into_the_whole_gradient(jit_compile):
    # A sequence read whole (a matmul, as keys and values) and at positions with repeats (as
    # queries and the residual, read twice): values and gradient against two plain gathers
    # summed by TensorFlow, float32, 1e-6 of the largest entry; no zero-filled rows.
    rng = np.random.default_rng(6)
    x = tf.constant(rng.normal(size=(3, 7, 4)).astype("float32"))
    positions = tf.constant([[0, 3, 3], [0, 6, 1], [0, 2, 5]])
    w = tf.constant(rng.normal(size=(4, 4)).astype("float32"))
    c = tf.constant(rng.normal(size=(3, 3, 4)).astype("float32"))

    def run(views_fn):
        def step():
            with tf.GradientTape() as tape:
                tape.watch(x)
                whole, gathered = views_fn(x, positions)
                loss = tf.reduce_sum(tf.tanh(tf.matmul(whole, w)))
                loss += tf.reduce_sum(gathered * c) + tf.reduce_sum(gathered**2)
            return gathered, tape.gradient(loss, x)

        return tf.function(step, jit_compile=jit_compile)

    plain = lambda s, p: (s, layers.gather_positions(s, p))  # noqa: E731
    ours, theirs = run(layers.gather_with_whole), run(plain)
    (g_ours, d_ours), (g_theirs, d_theirs) = ours(), theirs()
    np.testing.assert_array_equal(g_ours.numpy(), g_theirs.numpy())
    want = d_theirs.numpy()
    np.testing.assert_allclose(d_ours.numpy(), want, atol=1e-6 * np.abs(want).max())
    if not jit_compile:
        assert "ScatterNdNonAliasingAdd" in _op_types(ours)
        assert "UnsortedSegmentSum" not in _op_types(ours)
        assert "UnsortedSegmentSum" in _op_types(theirs)


_UNDER_JAX = """
import jax, keras, numpy as np
from keras import ops
from bench import gpu_mfu
from modeling import bert, heads, layers
from tests.table_gradients import scatter_types

# layers.split_leading against ops.unstack
x = np.random.default_rng(0).normal(size=(3, 2, 5, 4)).astype("float32")
w = np.arange(3, dtype="float32") + 1.0

def loss(t, cut):
    return sum(w[i] * ops.sum(ops.tanh(p) ** 2) for i, p in enumerate(cut(t)))

ours = lambda t: layers.split_leading(t, 3)
theirs = lambda t: ops.unstack(t, 3, axis=0)
for a, b in zip(ours(x), theirs(x)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
grads = {}
for name, cut in [("ours", ours), ("theirs", theirs)]:
    fn = jax.jit(jax.grad(lambda t: loss(t, cut)))
    grads[name] = np.asarray(fn(x))
    print(name, "pads", fn.lower(x).as_text().count("stablehlo.pad"))
np.testing.assert_allclose(grads["ours"], grads["theirs"], rtol=1e-6)

# The scatter-adds of the pretraining step under mixed_bfloat16 (bench/gpu_mfu.py's step), by
# result type: as Cloze builds it, then with the tables autocast and passed to the encoder as
# before the thirty-sixth session (negative control).
keras.mixed_precision.set_global_policy("mixed_bfloat16")

def scatters():
    model = bert.BertPretrainer(gpu_mfu.size_config(2, 24, 3, 37, 16))
    batch = gpu_mfu.make_batch(3, 16, 5)
    model.build()  # not an eager call: under JAX that compiles every op on its own
    if before:
        e = model.encoder.embeddings
        for table in (e.word_embeddings, e.token_type_embeddings, e.position_embeddings):
            table._autocast = True  # no public setter: Keras reads it at each access
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def loss(trainable):  # the bench step's loss (gpu_mfu.jax_train_step without the update)
        outputs, _ = model.stateless_call(trainable, others, batch, training=True)
        return gpu_mfu.loss_of(outputs, batch)

    text = jax.jit(jax.grad(loss)).lower(trainable).as_text()
    return scatter_types(text)

before = False
print("scatters now", scatters())
before = True
heads.tied_table_views = lambda table, compute_dtype, lookups=1: ([table] * lookups, table)
print("scatters before", scatters())
"""


def _python_under(backend, *args) -> str:
    """The stdout of `python *args` from the repository root under Keras' `backend` backend."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, *args],
        env={**os.environ, "KERAS_BACKEND": backend},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def under_jax():
    """The stdout of _UNDER_JAX, run once under Keras' JAX backend (the GPU bench's)."""
    return _python_under("jax", "-c", _UNDER_JAX)


def test_split_leading_gradient_has_no_pads_under_keras_jax_backend(under_jax):
    # layers.split_leading is ops.unstack's parts, and under Keras' JAX backend (the GPU bench's)
    # its gradient is one concatenate where unstack's is a pad per part (negative control).
    assert "ours pads 0" in under_jax and "theirs pads 3" in under_jax, under_jax


def test_embedding_gradients_are_summed_in_float32_under_keras_jax_backend(under_jax):
    # Under mixed_bfloat16 the lookups' gradients are scatter-adds into the float32 word (V, H)
    # and token-type (2, H) tables; with the tables autocast to bfloat16 they were bfloat16
    # scatter-adds (negative control). The (B, S, H) one is the last layer's gathered rows
    # (layers.gather_with_whole), in the compute dtype either way.
    assert "scatters now ['2x24xf32', '30522x24xf32', '3x16x24xbf16']" in under_jax, under_jax
    assert "scatters before ['2x24xbf16', '30522x24xbf16', '3x16x24xbf16']" in under_jax, under_jax


def _table_gradients(backend):
    """tests/table_gradients.py's result under Keras' `backend` backend."""
    import json

    stdout = _python_under(backend, "-m", "tests.table_gradients")
    (line,) = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


# Each family's looked-up tables (added with autocast=False), as tests/table_gradients.py
# lists them, and the shapes of their gradients' scatter-adds (BART slices its position tables).
LOOKED_UP_TABLES = {
    "bert": (  # the position table is sliced, not gathered: its gradient is a pad
        [
            "encoder/embeddings/position_embeddings",
            "encoder/embeddings/token_type_embeddings",
            "encoder/embeddings/word_embeddings",
        ],
        ["29x12", "2x12"],
    ),
    "gpt": (["encoder/wpe", "encoder/wte"], ["13x12", "29x12"]),
    "xlnet": (["encoder/word_embedding"], ["29x12"]),
    "t5": (
        [
            "decoder_0/self_attention/relative_attention_bias",
            "encoder_0/self_attention/relative_attention_bias",
            "shared",
        ],
        ["23x12", "23x12", "32x3", "32x3"],
    ),
    "bart": (["decoder_embed_positions", "encoder_embed_positions", "shared"], ["23x12", "23x12"]),
    "sbo": (["span_boundary_head/position_embeddings"], ["5x12"]),
}


def test_looked_up_tables_sum_their_gradients_in_float32_under_keras_jax_backend():
    # BERT's embeddings, GPT, XLNet, T5, BART and the span boundary head, under mixed_bfloat16
    # and Keras' JAX backend: the lookups' gradients are scatter-adds into float32 tables; with
    # the same tables autocast (as until the thirty-sixth session for BERT, the thirty-seventh
    # for the others: the negative control) they were bfloat16 scatter-adds, one contended
    # atomic add per element on a GPU (45% of BERT-base's step on an H200). Other scatters
    # (XLNet's relative-shift gradient, the last layer's gathered rows: activations) are left
    # out.
    result = _table_gradients("jax")
    for name, (tables, shapes) in LOOKED_UP_TABLES.items():
        for label, dtype in (("now", "f32"), ("autocast", "bf16")):
            row = result[f"{name} {label}"]
            assert row["tables"] == [f"{t} float32" for t in tables], (name, row)
            on_tables = [s for s in row["scatters"] if s.rsplit("x", 1)[0] in shapes]
            assert on_tables == [f"{s}x{dtype}" for s in shapes], (name, label, row)


def test_looked_up_tables_read_as_float32_leave_tensorflow_gradients_bit_identical():
    # Under TensorFlow the same change alters no bit of the loss or of any gradient (its Cast
    # gradient already summed the rows in float32), for every family; and T5 runs under
    # mixed_bfloat16 at all (its RMS norm multiplied bfloat16 by float32, which TensorFlow
    # refused until the thirty-seventh session).
    # The two traced steps differ: each lookup gathers from the float32 table now and from a
    # bfloat16 copy autocast (one gather per scatter-add that JAX shows).
    result = _table_gradients("tensorflow")
    assert sorted(result) == sorted(LOOKED_UP_TABLES)
    for name, row in result.items():
        tables, shapes = LOOKED_UP_TABLES[name]
        assert row["bit_identical"] and np.isfinite(row["loss"]), (name, row)
        assert row["tables"] == [f"{t} float32" for t in tables], (name, row)
        assert row["float32_gathers"] == {"now": len(shapes), "autocast": 0}, (name, row)


def test_tied_table_views_leave_the_lookups_to_the_variable_under_mixed_precision():
    # Under a mixed policy the encoder would cast a lookup view of the whole table to bfloat16
    # on the way in, so the head reads the variable as before and the lookups get None (the
    # embeddings layer then reads its own variable as float32). The policy decides, not how
    # the table reads: a table added with autocast off reads as float32 under a mixed policy.
    from modeling import heads

    seen = {}

    class Probe(keras.layers.Layer):
        def __init__(self, autocast_table, **kwargs):
            super().__init__(**kwargs)
            self.autocast_table = autocast_table

        def build(self, input_shape):
            self.table = self.add_weight(
                shape=(7, 3), initializer="ones", autocast=self.autocast_table
            )

        def call(self, x):
            seen["read"] = keras.ops.convert_to_tensor(self.table).dtype
            seen["views"] = heads.tied_table_views(self.table, self.compute_dtype)
            (lookup_view,), head_view = seen["views"]
            views = [t for t in (lookup_view, head_view) if t is not None]
            return x + sum(keras.ops.sum(keras.ops.cast(t, x.dtype)) for t in views)

    for autocast_table, read in ((True, tf.bfloat16), (False, tf.float32)):
        probe = Probe(autocast_table, dtype="mixed_bfloat16")
        probe(tf.ones((2,)))
        (lookup_view,), head_view = seen["views"]
        assert seen["read"] == read
        assert lookup_view is None and head_view is probe.table, autocast_table
    for autocast_table in (True, False):
        Probe(autocast_table)(tf.ones((2,)))  # float32: tensors, not the variable
        (lookup_view,), head_view = seen["views"]
        assert tf.is_tensor(lookup_view) and not isinstance(lookup_view, keras.Variable)


def _pretrainer_and_task(family):
    from modeling import albert, electra

    keras.utils.set_random_seed(11)
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=5)
    if family == "bert":
        model = bert.BertPretrainer(tiny_config())
        make_task = tasks.bert_pretraining_task
    elif family == "albert":
        from tests.test_albert import tiny as tiny_albert

        model = albert.AlbertPretrainer(tiny_albert(vocab_size=VOCAB, max_position_embeddings=SEQ))
        make_task = tasks.bert_pretraining_task
    else:
        from tests.test_electra import tiny as tiny_electra

        model = electra.ElectraPretrainer(tiny_electra(vocab_size=VOCAB))
        step = tf.Variable(3, dtype=tf.int64)
        make_task = lambda m: tasks.electra_pretraining_task(m, seed=9, step=step)  # noqa: E731
    model.build()
    return model, make_task, {k: tf.constant(v) for k, v in batch.items()}


@pytest.mark.parametrize("family", ["bert", "albert", "electra"])
def test_pretrainers_sum_the_tied_table_gradient_in_one_pass(monkeypatch, family):
    # BERT's and ALBERT's pretrainers (one lookup, the MLM head) and ELECTRA's (the generator's
    # and the discriminator's lookups, the generator's head) through their pretraining tasks:
    # every gradient equals the one TensorFlow aggregates itself (the table's and the last
    # layer's gathered rows), 1e-5 of its largest entry.
    from modeling import heads

    model, make_task, batch = _pretrainer_and_task(family)
    table = model.encoder.embeddings.word_embeddings.path

    def gradients():
        task = make_task(model)

        def step():
            with tf.GradientTape() as tape:
                sums = task.sums_fn(batch, training=True)
                loss = tf.add_n([v for k, v in sums.items() if k.endswith("loss_sum")])
            grads = tape.gradient(loss, model.trainable_variables)
            return [tf.convert_to_tensor(g) for g in grads]

        fn = tf.function(step)
        return [g.numpy() for g in fn()], _op_counts(fn)["ScatterNdNonAliasingAdd"]

    ours, ours_scatters = gradients()
    monkeypatch.setattr(heads, "tied_table_views", _plain_views)
    monkeypatch.setattr(
        layers, "gather_with_whole", lambda s, p: (s, layers.gather_positions(s, p))
    )
    theirs, theirs_scatters = gradients()
    # The table's and the last layer's (ELECTRA's generator's; its discriminator reads every
    # position) rows added in place, against none.
    assert (ours_scatters, theirs_scatters) == (2, 0)
    for v, a, b in zip(model.trainable_variables, ours, theirs):
        scale = max(np.abs(b).max(), 1e-6)
        np.testing.assert_allclose(a, b, atol=1e-5 * scale, err_msg=v.path)
    paths = [v.path for v in model.trainable_variables]
    assert np.abs(theirs[paths.index(table)]).max() > 0


def force_fused_xent(monkeypatch, fused: bool) -> list:
    """Sets losses.FUSED_XENT_MIN_SIZE so that heads.tied_xent_and_hits takes the XLA kernels
    (fused) or the TensorFlow ops at every size; returns the list of logits dtypes the kernels
    are fetched for, to check which path ran."""
    from modeling import losses

    monkeypatch.setattr(losses, "FUSED_XENT_MIN_SIZE", 0 if fused else 1 << 62)
    calls = []
    kernels = losses._fused_xent_kernels
    monkeypatch.setattr(losses, "_fused_xent_kernels", lambda d: calls.append(d) or kernels(d))
    return calls


@pytest.mark.parametrize("biased", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("fused", [False, True], ids=["tf_ops", "xla_kernels"])
def test_tied_xent_and_hits_equal_the_float64_formulas_and_the_logits_path(
    monkeypatch, fused, biased
):
    # heads.tied_xent_and_hits (vocabulary-major logits, hand-written gradient; its XLA kernels
    # or TensorFlow ops) against float64 numpy: cross-entropy, argmax hits, and the gradients to
    # the rows, the table and the bias under a non-uniform upstream gradient; and against the
    # logits path it replaces. Without a bias (GPT's, T5's heads) the TF ops run at every size.
    from modeling import heads, losses

    calls = force_fused_xent(monkeypatch, fused)

    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(size=(2, 3, 4)).astype("float32"))
    table = tf.constant(rng.normal(size=(11, 4)).astype("float32"))
    bias = tf.constant(rng.normal(size=(11,)).astype("float32"))
    x64, t64, b64 = (a.numpy().astype("float64") for a in (x, table, bias))
    if not biased:
        bias, b64 = None, 0.0
    logits64 = x64 @ t64.T + b64  # (2, 3, 11)
    labels = rng.integers(0, 11, (2, 3)).astype("int32")
    labels[0, :2] = logits64[0, :2].argmax(-1)  # some certain hits
    labels = tf.constant(labels)
    upstream = rng.uniform(0.1, 2.0, (2, 3))
    sources = [x, table] + ([bias] if biased else [])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(sources)
        ce, hits = heads.tied_xent_and_hits(x, table, bias, labels)
        plain_logits = heads.tied_logits(x, table) + (bias if biased else 0.0)
        plain_ce, plain_hits = losses.softmax_xent_and_hits(plain_logits, labels)
    shifted = logits64 - logits64.max(-1, keepdims=True)
    softmax = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    one_hot = np.eye(11)[labels.numpy()]
    want_ce = -np.log((softmax * one_hot).sum(-1))
    np.testing.assert_allclose(ce.numpy(), want_ce, rtol=1e-5, atol=1e-6)
    want_hits = (logits64.argmax(-1) == labels.numpy()).astype("float32")
    assert want_hits.sum() >= 2
    np.testing.assert_array_equal(hits.numpy(), want_hits)
    np.testing.assert_array_equal(plain_hits.numpy(), want_hits)
    d_logits = (softmax - one_hot) * upstream[..., None]
    want = {
        "rows": d_logits @ t64,
        "table": np.einsum("bpv,bpe->ve", d_logits, x64),
        "bias": d_logits.sum((0, 1)),
    }
    if not biased:
        del want["bias"]
    up = tf.constant(upstream.astype("float32"))
    got = dict(zip(want, tape.gradient(ce, sources, output_gradients=up)))
    plain = dict(zip(want, tape.gradient(plain_ce, sources, output_gradients=up)))
    for name in want:
        np.testing.assert_allclose(got[name].numpy(), want[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[name].numpy(), plain[name].numpy(), rtol=1e-5, atol=1e-6)
    assert calls == (["float32"] if fused and biased else [])
    for bad in (11, -1):  # past the vocabulary, negative
        with pytest.raises(tf.errors.InvalidArgumentError):
            heads.tied_xent_and_hits(x, table, bias, tf.fill((2, 3), bad))


def test_biased_xent_kernels_equal_the_tf_ops_at_size_only(monkeypatch):
    # losses.biased_xent_and_hits_tf at the MLM head's real vocabulary (V 30522 x N 8, over
    # FUSED_XENT_MIN_SIZE): its XLA kernels against xent_and_hits_tf on logits + bias, float32
    # and bfloat16 logits, with a column whose label ties the maximum (a hit) and one whose
    # maximum is elsewhere. Below the size, or with N unknown when traced, the TF ops run.
    from modeling import losses

    calls = force_fused_xent(monkeypatch, True)
    monkeypatch.setattr(losses, "FUSED_XENT_MIN_SIZE", 30522 * 8)
    rng = np.random.default_rng(12)
    vocab, n = 30522, 8
    logits = rng.normal(0, 3, (vocab, n)).astype("float32")
    labels = rng.integers(0, vocab, n).astype("int32")
    bias = rng.normal(0, 0.5, vocab).astype("float32")
    logits[labels[0], 0] = 50.0 - bias[labels[0]]  # the label is the column's maximum
    logits[7, 1] = 60.0  # ... and here it is not
    upstream = tf.constant(rng.uniform(0.5, 2.0, n).astype("float32"))

    def run(fn, logits, bias):
        with tf.GradientTape() as tape:
            tape.watch([logits, bias])
            ce, hits = fn(logits, bias)
        d_logits, d_bias = tape.gradient(ce, [logits, bias], output_gradients=upstream)
        return ce.numpy(), hits.numpy(), d_logits, d_bias

    def plain(logits, bias):
        z = tf.cast(logits, tf.float32) + bias[:, None]
        return losses.xent_and_hits_tf(z, labels, class_axis=0)

    for dtype in ("float32", "bfloat16"):
        x = tf.constant(logits, dtype)
        b = tf.constant(bias)
        ce, hits, d_logits, d_bias = run(
            lambda a, c: losses.biased_xent_and_hits_tf(a, c, labels), x, b
        )
        want_ce, want_hits, want_d_logits, want_d_bias = run(plain, x, b)
        if dtype == "float32":
            float32_ce = want_ce
        assert calls[-1] == dtype
        assert d_logits.dtype == x.dtype and d_bias.dtype == tf.float32
        np.testing.assert_allclose(ce, want_ce, rtol=1e-5)
        np.testing.assert_array_equal(hits, want_hits)
        assert hits[0] == 1.0 and hits[1] == 0.0
        d, want = (tf.cast(a, tf.float32).numpy() for a in (d_logits, want_d_logits))
        if dtype == "float32":
            np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-7)
        else:  # bf16's 8-bit mantissa
            np.testing.assert_allclose(d, want, atol=2**-8 * np.abs(want).max())
        np.testing.assert_allclose(d_bias.numpy(), want_d_bias.numpy(), rtol=1e-4, atol=1e-6)
    assert calls == ["float32", "bfloat16"]
    losses.biased_xent_and_hits_tf(tf.constant(logits[:, :7]), tf.constant(bias), labels[:7])
    unknown_n = tf.function(
        lambda a: losses.biased_xent_and_hits_tf(a, tf.constant(bias), labels),
        input_signature=[tf.TensorSpec((vocab, None), tf.float32)],
    )
    np.testing.assert_allclose(unknown_n(tf.constant(logits))[0].numpy(), float32_ce, rtol=1e-5)
    assert calls == ["float32", "bfloat16"]  # neither the 7 columns nor the unknown N fused


def test_pretrainer_returns_the_fused_mlm_terms_in_training_only():
    # In training, with masked_lm_ids in the inputs, BertPretrainer also returns the MLM
    # cross-entropy and hits from heads.tied_xent_and_hits, equal to those of its own
    # mlm_logits; the pretraining task's sums are the same either way. Not in evaluation.
    from modeling import losses

    keras.utils.set_random_seed(5)
    model = bert.BertPretrainer(tiny_config())
    model.build()
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=8)
    batch["masked_lm_weights"][2, 1] = 0.0  # a padded prediction
    batch = {k: tf.constant(v) for k, v in batch.items()}
    out = model(batch, training=True)
    assert {"mlm_xent", "mlm_hits", "mlm_logits"} <= set(out)
    ce, hits = losses.softmax_xent_and_hits(out["mlm_logits"], batch["masked_lm_ids"])
    np.testing.assert_allclose(out["mlm_xent"].numpy(), ce.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["mlm_hits"].numpy(), hits.numpy())
    fused = losses.masked_lm_sums_of(out["mlm_xent"], out["mlm_hits"], batch["masked_lm_weights"])
    plain = losses.masked_lm_sums(
        out["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"]
    )
    assert float(plain["loss_sum"]) > 1.0 and float(fused["weight"]) == BATCH * PREDICTIONS - 1
    for key in plain:
        assert float(fused[key]) == pytest.approx(float(plain[key]), rel=1e-6)
    assert "mlm_xent" not in model(batch, training=False)


@pytest.mark.parametrize("fused", [False, True], ids=["tf_ops", "xla_kernels"])
def test_fused_mlm_terms_under_bfloat16_equal_the_logits_path(monkeypatch, fused):
    # Under mixed_bfloat16 the fused head casts the bf16 logits to float32 before the bias and
    # the softmax, where the logits path adds the bias in bf16: the same loss within 1e-4 and
    # every gradient within 1% of its largest entry (bf16 keeps ~3 significant digits; measured
    # 0.3%), and nothing non-finite. With the XLA kernels or TensorFlow's ops.
    from modeling import losses

    calls = force_fused_xent(monkeypatch, fused)
    with optimization.dtype_policy("bf16"):
        keras.utils.set_random_seed(9)
        model = bert.BertPretrainer(tiny_config())
        model.build()
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=10)
    batch = {k: tf.constant(v) for k, v in batch.items()}

    def loss_and_grads(fused):
        with tf.GradientTape() as tape:
            out = model(batch, training=True)
            if fused:
                assert out["mlm_xent"].dtype == tf.float32
                sums = losses.masked_lm_sums_of(
                    out["mlm_xent"], out["mlm_hits"], batch["masked_lm_weights"]
                )
            else:
                sums = losses.masked_lm_sums(
                    out["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"]
                )
            loss = sums["loss_sum"] / sums["weight"]
        grads = tape.gradient(loss, model.trainable_variables)
        return float(loss), [None if g is None else tf.convert_to_tensor(g).numpy() for g in grads]

    loss, grads = loss_and_grads(True)
    plain_loss, plain_grads = loss_and_grads(False)
    assert calls == (["bfloat16"] * 2 if fused else [])  # one forward per loss_and_grads
    assert loss == pytest.approx(plain_loss, rel=1e-4)
    for v, mine, theirs in zip(model.trainable_variables, grads, plain_grads):
        assert (mine is None) == (theirs is None), v.path  # the NSP side: no MLM gradient
        if theirs is not None:
            assert np.isfinite(mine).all(), v.path
            scale = max(np.abs(theirs).max(), 1e-6)
            np.testing.assert_allclose(mine, theirs, atol=1e-2 * scale, err_msg=v.path)


def full_and_sparse_encoders(dropout=0.0):
    """(name, encoder) of each encoder family with output_positions, at odd tiny sizes: ALBERT
    with two blocks in its one shared group (the query positions go to the group's last block
    of the last layer only), ELECTRA with an embedding width of its own. `dropout`: the hidden
    and attention dropout rates."""
    from modeling import albert, electra

    common = dict(
        vocab_size=VOCAB,
        hidden_size=12,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=17,
        hidden_act="gelu",
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=16,
        type_vocab_size=2,
        initializer_range=0.2,
    )
    keras.utils.set_random_seed(11)
    yield "bert", bert.BertEncoder(bert.BertConfig(**common))
    yield (
        "albert",
        albert.AlbertEncoder(albert.AlbertConfig(**common, embedding_size=5, inner_group_num=2)),
    )
    yield "electra", electra.ElectraEncoder(electra.ElectraConfig(**common, embedding_size=5))


def test_last_layer_at_output_positions_equals_the_full_encoder():
    # Positions with a repeat, [CLS] itself and a padded position; training=True runs the
    # training-only fused GELU too (dropout is off). Tolerance 1e-5 absolute on outputs of
    # order 1: float32 rounding of a (Q, H) and an (S, H) matmul order; a wrong row or a lost
    # mask is off by O(0.1).
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=5)
    batch["input_mask"][1, 4:] = 0
    positions = np.array([[3, 3, 1], [0, 5, 2], [6, 1, 4]], np.int32)  # (B, 3)
    for name, encoder in full_and_sparse_encoders():
        full = encoder(batch, training=True)
        sparse = encoder(batch, training=True, output_positions=positions)
        expected = np.take_along_axis(np.array(full["sequence_output"]), positions[..., None], 1)
        assert sparse["sequence_output"].shape == (BATCH, 3, 12), name
        np.testing.assert_allclose(sparse["sequence_output"], expected, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(sparse["pooled_output"], full["pooled_output"], atol=1e-5)
        np.testing.assert_array_equal(sparse["encoder_outputs"][-1], sparse["sequence_output"])
        assert len(sparse["encoder_outputs"]) == len(full["encoder_outputs"]), name
        for before, after in zip(full["encoder_outputs"][:-1], sparse["encoder_outputs"][:-1]):
            np.testing.assert_allclose(after, before, atol=1e-5, err_msg=name)


def test_span_boundary_pretrainer_loss_and_gradients_equal_the_full_last_layer():
    # BertPretrainer's last layer computes [CLS], the masked positions and the span boundaries
    # only; the same model through the full encoder and the heads' own gathers is the plain
    # path. A random weighting of every logit reaches every output in the gradient. Tolerances:
    # loss 1e-5 relative; each gradient 1e-4 of its largest entry (float32 op orders).
    config = tiny_config()
    keras.utils.set_random_seed(13)
    model = bert.BertPretrainer(config, "nsp", span_boundary=True)
    model.build()
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=6)
    batch["input_mask"][2, 5:] = 0
    positions = batch["masked_lm_positions"]
    batch["masked_lm_span_left"] = np.maximum(positions - 1, 0).astype(np.int32)
    batch["masked_lm_span_right"] = np.minimum(positions + 2, SEQ - 1).astype(np.int32)
    rng = np.random.default_rng(0)
    weights = {
        "mlm_logits": rng.normal(size=(BATCH, PREDICTIONS, VOCAB)),
        "sbo_logits": rng.normal(size=(BATCH, PREDICTIONS, VOCAB)),
        "nsp_logits": rng.normal(size=(BATCH, 2)),
    }

    def plain(inputs):
        out = model.encoder(inputs, training=True)
        seq, table = out["sequence_output"], model.encoder.embeddings.word_embeddings
        return {
            "mlm_logits": model.masked_lm(seq, inputs["masked_lm_positions"], table),
            "nsp_logits": model.next_sentence(out["pooled_output"]),
            "sbo_logits": model.span_boundary_head(
                seq,
                inputs["masked_lm_positions"],
                inputs["masked_lm_span_left"],
                inputs["masked_lm_span_right"],
                table,
            ),
        }

    def loss_and_gradients(forward):
        with tf.GradientTape() as tape:
            out = forward(batch)
            loss = sum(tf.reduce_sum(out[k] * w) for k, w in weights.items())
        grads = tape.gradient(loss, model.trainable_variables)
        return float(loss), [tf.convert_to_tensor(g).numpy() for g in grads]

    loss, grads = loss_and_gradients(lambda b: model(b, training=True))
    plain_loss, plain_grads = loss_and_gradients(plain)
    assert loss == pytest.approx(plain_loss, rel=1e-5)
    for v, mine, theirs in zip(model.trainable_variables, grads, plain_grads):
        scale = max(np.abs(theirs).max(), 1e-6)
        np.testing.assert_allclose(mine, theirs, atol=1e-4 * scale, err_msg=v.path)


def test_electra_generator_logits_equal_the_head_on_the_full_generator():
    from modeling import electra
    from tests.test_electra import TINY as ELECTRA_TINY

    keras.utils.set_random_seed(17)
    model = electra.ElectraPretrainer(electra.ElectraConfig(**ELECTRA_TINY))
    model.build()
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=8)
    batch["input_mask"][0, 6:] = 0
    out = model(batch, training=False)
    full = model.generator(batch, training=False)["sequence_output"]
    table = model.encoder.embeddings.word_embeddings
    expected = model.generator_predictions(full, batch["masked_lm_positions"], table)
    np.testing.assert_allclose(out["mlm_logits"], expected, atol=1e-5)


def test_dropout_masks_are_seeded_16_bit_draws_with_and_without_xla():
    # layers.Dropout's masks (layers.keep_mask): 16 Philox bits per element. The same seed
    # state gives the same mask eagerly and under jit_compile, the next call a new one; kept
    # values are scaled by 1 / (1 - rate); the traced graph lacks StatelessRandomGetKeyCounter,
    # the op whose XLA lowering made Keras' dropout ~30x slower under XLA on CPU.
    x = tf.reshape(tf.range(1, 4 * 301 + 1, dtype=tf.float32), (4, 301))  # an odd count
    mine = layers.Dropout(0.3, seed=5)
    first, second = mine(x, training=True), mine(x, training=True)
    assert not np.array_equal(first, second)
    kept = np.array(first) != 0
    assert 0.6 < kept.mean() < 0.8  # rate 0.3
    np.testing.assert_allclose(np.array(first)[kept], np.array(x)[kept] / 0.7, rtol=1e-6)
    np.testing.assert_array_equal(mine(x, training=False), x)

    compiled = tf.function(lambda v: mine(v, training=True), jit_compile=True)
    mine.seed_generator.state.assign([5, 0])
    eager = mine(x, training=True)
    mine.seed_generator.state.assign([5, 0])
    np.testing.assert_array_equal(compiled(x), eager)
    theirs = keras.layers.Dropout(0.3, seed=9)
    ops_of = {
        name: {op.type for op in f.get_concrete_function(x).graph.get_operations()}
        for name, f in (
            ("mine", compiled),
            ("theirs", tf.function(lambda v: theirs(v, training=True), jit_compile=True)),
        )
    }
    assert "StatelessRandomGetKeyCounter" in ops_of["theirs"]
    assert "StatelessRandomGetKeyCounter" not in ops_of["mine"]


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_mask_keeps_at_the_rate_with_independent_halves(rate):
    # 2^20 + 1 elements: the kept fraction is 1 - round(rate * 65536) / 65536 within 5 standard
    # deviations, and the two elements made from one Philox word (even and odd positions) are
    # uncorrelated, as are neighbouring words: |correlation| < 5 / sqrt(n).
    n = (1 << 20) + 1
    keep = np.asarray(layers.keep_mask([n], rate, tf.constant([7, 11], tf.int32)))
    p = 1 - round(rate * 65536) / 65536
    assert abs(keep.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    k = keep[: n - 1].astype("float64").reshape(-1, 2)
    for a, b in ((k[:, 0], k[:, 1]), (k[:-1, 1], k[1:, 0])):
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(len(a))
    # A rate that rounds to 0 of 65536 keeps everything; the shape comes back as asked.
    mask = layers.keep_mask([3, 5, 7], 1e-9, tf.constant([1, 2], tf.int32))
    assert mask.shape == (3, 5, 7) and bool(tf.reduce_all(mask))


def test_keep_mask_rows_are_the_rows_of_the_whole_batch_mask():
    # layers.keep_mask_rows: rows [offset, offset + rows) of keep_mask's mask for the whole
    # batch from the same seed, for every offset and row count (slices starting off Philox's
    # 8-element blocks, odd element counts, empty slices), eagerly, with the offset a tensor,
    # and under jit_compile. Its key and counter give the stream tf.random.stateless_uniform
    # draws (TensorFlow's own Philox seed derivation, which keep_mask uses).
    seed = tf.constant([5, -9], tf.int32)
    key_counter = layers.philox_key_counter(seed)
    stream = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[64], key=key_counter[0], counter=tf.stack([tf.constant(0, tf.uint64),
        key_counter[1]]), alg=tf.random.Algorithm.PHILOX.value, dtype=tf.uint32,
    )  # fmt: skip
    expected = tf.random.stateless_uniform(
        [64], seed, minval=None, maxval=None, dtype=tf.uint32, alg="philox"
    )
    np.testing.assert_array_equal(stream, expected)
    compiled = tf.function(layers.keep_mask_rows, jit_compile=True)
    for shape in [(7, 3, 5), (6, 4), (5, 2, 3, 3), (3, 1)]:
        whole = layers.keep_mask(shape, 0.3, seed).numpy()
        assert 0 < whole.mean() < 1
        for offset in range(shape[0]):
            for rows in range(shape[0] - offset + 1):
                what = f"{shape}, rows {offset} to {offset + rows}"
                part = (rows, *shape[1:])
                got = layers.keep_mask_rows(part, 0.3, key_counter, offset, rows)
                np.testing.assert_array_equal(got, whole[offset : offset + rows], err_msg=what)
                got = layers.keep_mask_rows(part, 0.3, key_counter, tf.constant(offset), rows)
                np.testing.assert_array_equal(got, whole[offset : offset + rows], err_msg=what)
        got = compiled((2, *shape[1:]), 0.3, key_counter, shape[0] - 2, 2)
        np.testing.assert_array_equal(got, whole[-2:], err_msg=f"{shape} under XLA")


def xla_calls(graph) -> list:
    """The ops of a traced graph that call an XLA-compiled tf.function (jit_compile)."""
    return [
        op
        for op in graph.get_operations()
        if "_XlaMustCompile" in op.node_def.attr and op.node_def.attr["_XlaMustCompile"].b
    ]


@pytest.mark.parametrize("xla_weight_gradient", [False, True])
@pytest.mark.parametrize("shape", [(5, 6), (2, 5, 6), (2, 3, 4, 6)])
def test_dense_as_matmul_and_bias_add_equals_the_float64_formula(shape, xla_weight_gradient):
    # layers.Dense runs on TensorFlow as one 2-D MatMul + BiasAdd (fusable into one oneDNN
    # kernel); values and gradients equal x @ W + b in float64, for any rank, with the batch
    # dimensions unknown when traced, and the traced graph holds the BiasAdd. With
    # xla_weight_gradient (layers.set_xla_weight_gradients) the kernel's gradient is an
    # XLA-compiled dot, the one XLA call in the graph (none without it), with the same values.
    rng = np.random.default_rng(11)
    dense = layers.Dense(7, initializer_range=0.5)
    dense.build(shape)
    dense.xla_weight_gradient = xla_weight_gradient
    dense.bias.assign(rng.normal(size=(7,)).astype("float32"))
    x = tf.constant(rng.normal(size=shape).astype("float32"))
    upstream = rng.normal(size=(*shape[:-1], 7))
    spec = tf.TensorSpec([None] * (len(shape) - 1) + [6], tf.float32)

    @tf.function(input_signature=[spec])
    def forward_and_grads(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = dense(v)
        grads = tape.gradient(y, [v, dense.kernel, dense.bias], tf.constant(upstream, tf.float32))
        return y, grads

    y, (dx, dw, db) = forward_and_grads(x)
    x64, w64 = x.numpy().astype("float64"), dense.kernel.numpy().astype("float64")
    b64 = dense.bias.numpy().astype("float64")
    np.testing.assert_allclose(y.numpy(), x64 @ w64 + b64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx.numpy(), upstream @ w64.T, rtol=1e-5, atol=1e-5)
    flat_x, flat_u = x64.reshape(-1, 6), upstream.reshape(-1, 7)
    np.testing.assert_allclose(dw.numpy(), flat_x.T @ flat_u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db.numpy(), flat_u.sum(0), rtol=1e-5, atol=1e-5)
    graph = forward_and_grads.get_concrete_function().graph
    assert {"BiasAdd", "BiasAddGrad"} <= {op.type for op in graph.get_operations()}
    assert len(xla_calls(graph)) == int(xla_weight_gradient)


def test_xla_weight_gradients_leave_the_pretraining_loss_and_gradients(monkeypatch):
    # The pretraining task's loss and every variable's gradient with every Dense's kernel
    # gradient as an XLA dot, against the plain path: loss 1e-6 relative, gradients 1e-5 of
    # their largest entry (float32 rounding of two matmul kernels; a transposed or dropped
    # product is off by O(1) of it). The product really ran for each Dense the step calls
    # (counted). Then off again: the plain path's values, bit for bit, and no such call.
    calls = helpers.count_xla_weight_gradient_calls(monkeypatch)
    config = tiny_config()
    keras.utils.set_random_seed(7)
    model = bert.BertPretrainer(config)
    model.build()
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=3)
    batch = {k: tf.constant(v) for k, v in batch.items()}
    loss, grads = loss_and_grads(model, batch)
    names = layers.set_xla_weight_gradients(model)
    # Per encoder layer Q/K/V, attention output, intermediate, output; the pooler, NSP head and
    # the MLM head's transform.
    assert len(names) == 4 * config.num_hidden_layers + 3
    assert not calls
    xla_loss, xla_grads = loss_and_grads(model, batch)
    # Every Dense but the last layer's Q/K/V, split to project queries at the masked positions.
    assert len(calls) == 4 * config.num_hidden_layers + 2
    assert xla_loss == pytest.approx(loss, rel=1e-6) and set(xla_grads) == set(grads)
    for path, want in grads.items():
        scale = max(np.abs(want).max(), 1e-3)
        np.testing.assert_allclose(xla_grads[path], want, atol=1e-5 * scale, err_msg=path)
    layers.set_xla_weight_gradients(model, False)
    called = len(calls)
    again, again_grads = loss_and_grads(model, batch)
    assert again == loss and all((again_grads[p] == g).all() for p, g in grads.items())
    assert len(calls) == called


def test_xla_weight_gradients_refuse_what_they_cannot_run():
    # float32 only (XLA's CPU dots in bfloat16 / float16 unmeasured), and a model with a Dense.
    with optimization.dtype_policy("bf16"):
        model = bert.BertPretrainer(tiny_config())
        model.build()
    with pytest.raises(ValueError, match="computes in bfloat16; expected float32"):
        layers.set_xla_weight_gradients(model)
    layers.set_xla_weight_gradients(model, False)  # turning it off is always allowed
    with pytest.raises(ValueError, match="Sequential holds no Dense layer"):
        layers.set_xla_weight_gradients(keras.Sequential([keras.layers.Dense(3)]))


def test_dense_under_mixed_bfloat16_computes_in_bfloat16():
    with optimization.dtype_policy("bf16"):
        dense = layers.Dense(4, "gelu")
        x = tf.ones((2, 3, 5))
        y = dense(x)
    assert y.dtype == tf.bfloat16 and dense.kernel.dtype == "float32"
    want = layers.gelu_tanh(x.numpy() @ dense.kernel.numpy() + dense.bias.numpy())
    np.testing.assert_allclose(y.numpy().astype("float32"), np.asarray(want), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("name", ["gelu", "gelu_new", "gelu_exact", "relu", "tanh"])
def test_dense_activation_outside_training_equals_the_formula(name):
    # Outside training Dense applies layers.dense_activation (tf.nn.gelu for the GELUs, which
    # oneDNN fuses with the MatMul + BiasAdd): the same values as the config's formula.
    rng = np.random.default_rng(12)
    dense = layers.Dense(9, name, initializer_range=1.0)
    x = tf.constant(rng.normal(size=(3, 4, 5)).astype("float32") * 2)
    forward = tf.function(lambda v: dense(v, training=False))
    y = forward(x)
    pre = x.numpy().reshape(-1, 5) @ dense.kernel.numpy() + dense.bias.numpy()
    want = np.asarray(layers.get_activation(name)(tf.constant(pre))).reshape(3, 4, 9)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    # tf.nn.gelu's own ops (its tanh form cubes with Pow, its erf form uses Erfc), which
    # layers.gelu_tanh / gelu_exact do not: the graph runs tf.nn.gelu, not the formula.
    traced = {op.type for op in forward.get_concrete_function(x).graph.get_operations()}
    marker = {"gelu": "Pow", "gelu_new": "Pow", "gelu_exact": "Erfc"}.get(name)
    assert marker is None or marker in traced


def _residual_norm_case(epsilon=1e-12, dtype=tf.float32, rate=0.3):
    rng = np.random.default_rng(21)
    norm = keras.layers.LayerNormalization(epsilon=epsilon)
    x = tf.cast(tf.constant(rng.normal(size=(3, 5, 16)).astype("float32")), dtype)
    y = tf.cast(tf.constant(rng.normal(size=(3, 5, 16)).astype("float32") * 3), dtype)
    norm.build(x.shape)
    norm.gamma.assign(rng.normal(size=16).astype("float32"))
    norm.beta.assign(rng.normal(size=16).astype("float32"))
    upstream = tf.constant(rng.normal(size=(3, 5, 16)).astype("float32"))
    return norm, layers.Dropout(rate, seed=4), x, y, upstream


def _norm_and_grads(fn, norm, dropout, x, y, upstream):
    dropout.seed_generator.state.assign([4, 0])  # the same seed state, so the same masks
    with tf.GradientTape() as tape:
        tape.watch([x, y])
        out = fn()
    grads = tape.gradient(
        out,
        [x, y, norm.gamma, norm.beta],
        output_gradients=tf.cast(upstream, out.dtype),
        unconnected_gradients="zero",
    )
    return [np.asarray(tf.cast(v, tf.float64)) for v in [out, *grads]], [
        v.dtype for v in [out, *grads]
    ]


@pytest.fixture
def fused_norm_at_any_size(monkeypatch):
    # The cases are below layers.FUSED_NORM_MIN_SIZE; the kernels are exercised all the same.
    monkeypatch.setattr(layers, "FUSED_NORM_MIN_SIZE", 0)


@pytest.mark.parametrize("epsilon", [1e-12, 0.5])
def test_residual_layer_norm_in_training_equals_the_layers(epsilon, fused_norm_at_any_size):
    # layers.residual_layer_norm's XLA kernels against the layers it replaces,
    # LayerNormalization(x + Dropout(y)), with the dropout's seed state reset between the two:
    # the same masks, values and gradients for x, y, gamma and beta (float32 rounding). A
    # large epsilon shows it is the layer's own.
    norm, dropout, x, y, upstream = _residual_norm_case(epsilon)
    want, _ = _norm_and_grads(
        lambda: norm(x + dropout(y, training=True)), norm, dropout, x, y, upstream
    )
    got, _ = _norm_and_grads(
        lambda: layers.residual_layer_norm(norm, x, y, dropout, training=True),
        norm,
        dropout,
        x,
        y,
        upstream,
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)
    # Dropout did drop: y's gradient is zero at about the rate, and the output differs from
    # the one without dropout.
    assert 0.15 < np.mean(got[2] == 0) < 0.45
    assert np.abs(got[0] - np.asarray(norm(x + y))).max() > 0.1
    # Without y it is the LayerNorm alone.
    alone, _ = _norm_and_grads(
        lambda: layers.residual_layer_norm(norm, x, training=True), norm, dropout, x, y, upstream
    )
    plain, _ = _norm_and_grads(lambda: norm(x), norm, dropout, x, y, upstream)
    for i in (0, 1, 3, 4):  # y has no gradient there
        np.testing.assert_allclose(alone[i], plain[i], rtol=1e-5, atol=2e-5)


def test_residual_layer_norm_runs_xla_kernels_only_in_training_at_size(monkeypatch):
    # In training the traced graph holds no LayerNorm op of its own (the work is inside the
    # compiled kernels); outside training it is the layers' graph (what a SavedModel holds),
    # and so it is below FUSED_NORM_MIN_SIZE elements or with a dimension unknown.
    norm, dropout, x, y, _ = _residual_norm_case()  # 240 elements

    def op_types(training, spec=None):
        fn = tf.function(lambda a, b: layers.residual_layer_norm(norm, a, b, dropout, training))
        graph = fn.get_concrete_function(spec or x, spec or y).graph
        return {op.type for op in graph.get_operations()}

    monkeypatch.setattr(layers, "FUSED_NORM_MIN_SIZE", 240)
    assert "Rsqrt" not in op_types(True) and "Rsqrt" in op_types(False)
    # Rows unknown (a fine-tuning batch cut to its longest example): decided by the row width.
    unknown_rows = tf.TensorSpec((None, None, 16), tf.float32)
    assert "Rsqrt" in op_types(True, unknown_rows)  # 16 < FUSED_NORM_MIN_WIDTH
    monkeypatch.setattr(layers, "FUSED_NORM_MIN_WIDTH", 16)
    assert "Rsqrt" not in op_types(True, unknown_rows) and "Rsqrt" in op_types(False, unknown_rows)
    monkeypatch.setattr(layers, "FUSED_NORM_MIN_WIDTH", 17)
    assert "Rsqrt" in op_types(True, unknown_rows)
    monkeypatch.setattr(layers, "FUSED_NORM_MIN_SIZE", 241)
    assert "Rsqrt" in op_types(True)
    np.testing.assert_allclose(
        layers.residual_layer_norm(norm, x, y, dropout, training=False), norm(x + y), atol=1e-6
    )


def test_residual_layer_norm_with_rows_unknown_when_traced_equals_the_layers(monkeypatch):
    # The kernels traced for any row count (input_signature (None, None, 16)), then run at the
    # case's rows and at fewer: the same values and gradients as the layers at each.
    monkeypatch.setattr(layers, "FUSED_NORM_MIN_WIDTH", 16)
    norm, dropout, x, y, upstream = _residual_norm_case()
    spec = tf.TensorSpec((None, None, 16), tf.float32)

    @tf.function(input_signature=[spec, spec, spec])
    def fused(a, b, up):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            out = layers.residual_layer_norm(norm, a, b, dropout, training=True)
        assert "Rsqrt" not in {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
        return [out, *tape.gradient(out, [a, b, norm.gamma, norm.beta], output_gradients=up)]

    for rows in (5, 3):
        a, b, up = x[:, :rows], y[:, :rows], upstream[:, :rows]
        dropout.seed_generator.state.assign([4, 0])
        got = fused(a, b, up)
        want, _ = _norm_and_grads(
            lambda a=a, b=b: norm(a + dropout(b, training=True)), norm, dropout, a, b, up
        )
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-5, atol=2e-5)


def test_residual_layer_norm_under_bfloat16_computes_in_float32(fused_norm_at_any_size):
    # bf16 activations in, bf16 out, float32 gradients for gamma and beta; the values are the
    # float32 computation on the same bf16 inputs within bf16 rounding (2^-8 relative).
    with optimization.dtype_policy("bf16"):
        norm, dropout, x, y, upstream = _residual_norm_case(dtype=tf.bfloat16)
        got, dtypes = _norm_and_grads(
            lambda: layers.residual_layer_norm(norm, x, y, dropout, training=True),
            norm,
            dropout,
            x,
            y,
            upstream,
        )
    # out, then the gradients of x, y, gamma and beta
    assert dtypes == [tf.bfloat16, tf.bfloat16, tf.bfloat16, tf.float32, tf.float32]
    norm32 = _residual_norm_case()[0]
    norm32.set_weights(norm.get_weights())
    dropout.seed_generator.state.assign([4, 0])
    dropped = tf.cast(dropout(y, training=True), tf.float32)  # the same masks as above
    want = norm32(tf.cast(x, tf.float32) + dropped)
    np.testing.assert_allclose(got[0], want, rtol=2.0**-7, atol=2.0**-7)
    assert np.abs(got[3]).max() > 0  # gamma's gradient


# ---------------------------------------------------------------------------------------------
# The encoder's layers in parallel branches (bert.run_layer_stack)


def outputs_and_gradients(encoder, batch, positions, branches):
    """Every output of `encoder` (each layer's too) in training with `branches`, and the
    gradients of a fixed random weighting of them for every trainable variable."""
    bert.set_encoder_branches(encoder, branches)
    with tf.GradientTape() as tape:
        out = encoder(batch, training=True, output_positions=positions)
        flat = tf.nest.flatten(out)
        rng = np.random.default_rng(0)
        loss = sum(tf.reduce_sum(x * rng.normal(size=x.shape).astype("float32")) for x in flat)
    grads = tape.gradient(loss, encoder.trainable_variables)
    return [np.array(x) for x in flat], [tf.convert_to_tensor(g).numpy() for g in grads]


@pytest.mark.parametrize("branches", [2, 3, 5])
def test_encoder_branches_equal_one_pass_with_their_gradients(branches):
    # Each encoder family in K row slices of the batch against one pass, with and without
    # output_positions. Batch 3: K = 2 gives slices of 2 and 1; K = 5 gives three slices, none
    # empty. Every output (each layer's too) and every variable's gradient of a random weighting
    # of them. Tolerance 1e-5 of the largest entry: float32 op orders change with a matmul's row
    # count; a row joined in the wrong order or a slice dropped is off by O(1) of it.
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=9)
    batch["input_mask"][1, 4:] = 0
    positions = np.array([[3, 3, 1], [0, 5, 2], [6, 1, 4]], np.int32)
    for name, encoder in full_and_sparse_encoders():
        for pos in (None, positions):
            what = f"{name}, output_positions {pos is not None}"
            ref_out, ref_grads = outputs_and_gradients(encoder, batch, pos, 1)
            out, grads = outputs_and_gradients(encoder, batch, pos, branches)
            assert len(out) == len(ref_out), what
            for mine, theirs in [*zip(out, ref_out), *zip(grads, ref_grads)]:
                assert mine.shape == theirs.shape, what
                scale = max(np.abs(theirs).max(), 1e-3)
                np.testing.assert_allclose(mine, theirs, atol=1e-5 * scale, err_msg=what)


def seed_states(model) -> list:
    """The state variables of `model`'s dropout seed generators."""
    return [v for v in model.non_trainable_variables if "seed_generator" in v.path]


@pytest.mark.parametrize("branches,fused", [(2, False), (3, False), (2, True)])
def test_encoder_branches_draw_the_one_pass_dropout(branches, fused, monkeypatch):
    # The same with dropout on (0.3, hidden and attention): each slice draws its rows of the
    # masks one pass draws (layers.RowSlice), so the outputs and gradients are one pass' again,
    # and every seed generator ends in the state one pass leaves (one draw per call, ALBERT's
    # shared blocks once per layer). A draw from other seeds gives other outputs: the test would
    # see slices drawing masks of their own. `fused`: the residual LayerNorms as their XLA
    # kernels (layers.residual_layer_norm, whose masks are drawn on (rows x S, H)) at this size.
    from modeling import layers

    if fused:
        monkeypatch.setattr(layers, "FUSED_NORM_MIN_SIZE", 0)
        calls = []
        kernels = layers._fused_norm_kernels
        monkeypatch.setattr(
            layers, "_fused_norm_kernels", lambda *a: calls.append(a) or kernels(*a)
        )
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=9)
    batch["input_mask"][1, 4:] = 0
    positions = np.array([[3, 3, 1], [0, 5, 2], [6, 1, 4]], np.int32)
    for name, encoder in full_and_sparse_encoders(dropout=0.3):
        for pos in (None, positions):
            what = f"{name}, output_positions {pos is not None}"
            states = seed_states(encoder)
            start = [v.numpy() for v in states]
            ref_out, ref_grads = outputs_and_gradients(encoder, batch, pos, 1)
            after = [v.numpy() for v in states]
            assert all((a != b).any() for a, b in zip(after, start)), what  # dropout drew
            other_out, _ = outputs_and_gradients(encoder, batch, pos, 1)  # the next seeds
            assert not np.allclose(other_out[-1], ref_out[-1], atol=1e-3), what
            for v, value in zip(states, start):
                v.assign(value)
            out, grads = outputs_and_gradients(encoder, batch, pos, branches)
            for v, value in zip(states, after):
                np.testing.assert_array_equal(v.numpy(), value, err_msg=what)
            for mine, theirs in [*zip(out, ref_out), *zip(grads, ref_grads)]:
                scale = max(np.abs(theirs).max(), 1e-3)
                np.testing.assert_allclose(mine, theirs, atol=1e-5 * scale, err_msg=what)
    if fused:
        assert any(rate == 0.3 for _, rate, *_ in calls)  # the blocks' residuals


def test_auto_encoder_branches_are_two_for_wide_fp32_cpu_steps_only():
    # --encoder_branches' default (bert.auto_encoder_branches): 2 for an fp32 step on CPUs of an
    # encoder 128 wide or more with 2+ rows per replica, else 1 with the reason: GPU or TPU
    # devices, bf16, XLA, the real tokens' rows, parallel micro-batches, one row, a narrow
    # encoder (ELECTRA: its widest, the discriminator's), a model without such an encoder.
    from modeling import electra, gpt

    cpu = ["/job:localhost/replica:0/task:0/device:CPU:0"]
    sizes = dict(vocab_size=VOCAB, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=16)  # fmt: skip
    wide = bert.BertPretrainer(bert.BertConfig(**sizes, hidden_size=128))
    plain = dict(precision="fp32", use_xla=False, remove_padding=False,
                 parallel_micro_batches=1, rows=4)  # fmt: skip
    k, why = bert.auto_encoder_branches(wide, cpu, **plain)
    assert (k, why) == (2, "an fp32 step on CPUs, hidden_size 128, 4 rows per replica")
    for devices, changes, reason in [
        (["/job:worker/replica:0/task:0/device:GPU:0"], {}, "not measured on accelerators"),
        (["/job:worker/replica:0/task:0/device:TPU:0"], {}, "not measured on accelerators"),
        (cpu, {"precision": "bf16"}, "--precision=bf16"),
        (cpu, {"use_xla": True}, "--use_xla"),
        (cpu, {"remove_padding": True}, "--remove_padding"),
        (cpu, {"parallel_micro_batches": 2}, "--parallel_micro_batches=2"),
        (cpu, {"rows": 1}, "1 row(s) per replica and micro-batch"),
    ]:
        assert bert.auto_encoder_branches(wide, devices, **{**plain, **changes}) == (1, reason)
    narrow = bert.BertPretrainer(bert.BertConfig(**sizes, hidden_size=64))
    assert bert.auto_encoder_branches(narrow, cpu, **plain) == (1, "hidden_size 64 < 128")
    # ELECTRA's generator a quarter as wide (32): its discriminator's 128 counts.
    pair = electra.ElectraPretrainer(
        electra.ElectraConfig(**sizes, hidden_size=128, embedding_size=16)
    )
    assert [m.config.hidden_size for m in (pair.encoder, pair.generator)] == [128, 32]
    assert bert.auto_encoder_branches(pair, cpu, **plain)[0] == 2
    lm = gpt.GptLM(gpt.GptConfig(n_vocab=VOCAB, n_ctx=16, n_embd=128, n_head=2, n_layer=1))
    assert bert.auto_encoder_branches(lm, cpu, **plain) == (1, "no encoder that runs in branches")


@pytest.mark.parametrize("jit_compile", [False, True])
def test_encoder_branches_take_any_batch_size_in_one_graph(jit_compile):
    # One tf.function whose batch size is unknown when traced (as an exported SavedModel's
    # signature), K = 3: batches of 1 and 2 leave slices empty, 4 and 7 are uneven. Outputs
    # equal one pass (1e-5 absolute on outputs of order 1).
    from bench import inference

    config = tiny_config()
    keras.utils.set_random_seed(21)
    encoder = bert.BertEncoder(config)
    encoder.build()
    spec = {k: tf.TensorSpec((None, SEQ), tf.int32) for k in bert.dummy_inputs()}

    @tf.function(input_signature=[spec], jit_compile=jit_compile)
    def branched(batch):
        return encoder(batch)["sequence_output"]

    for n in (1, 2, 4, 7):
        batch = inference.padded_batch(n, SEQ, VOCAB, seed=n)
        bert.set_encoder_branches(encoder, 1)
        expected = encoder(batch)["sequence_output"]
        bert.set_encoder_branches(encoder, 3)
        np.testing.assert_allclose(branched(batch), expected, atol=1e-5, err_msg=str(n))
    # The traced graph really cuts the batch: one SplitV each for x and the mask, sized at run
    # time (the batch is unknown when traced).
    ops_ = branched.get_concrete_function().graph.get_operations()
    assert sum(op.type == "SplitV" for op in ops_) >= 2


# ---------------------------------------------------------------------------------------------
# The encoder's layers on the real tokens alone (bert.run_layer_stack's remove_padding)


def test_unpadded_rows_round_trip_and_count_up_to_the_multiple():
    # 3 x 5 positions, 7 real (row 1 all padding); multiple 4 -> 8 rows, the last a filler
    # that reads position 0 and is written nowhere.
    from modeling import layers

    mask = np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]], np.int32)
    x = np.arange(15 * 2, dtype=np.float32).reshape(3, 5, 2) + 1
    u = layers.Unpadded(tf.constant(mask), multiple=4)
    assert int(u.count) == 8
    rows = u.rows(tf.constant(x)).numpy()
    assert rows.shape == (1, 8, 2)
    np.testing.assert_array_equal(rows[0, :7], x[mask == 1])
    np.testing.assert_array_equal(rows[0, 7], x[0, 0])  # the filler
    back = u.positions(tf.constant(rows) * 10).numpy()
    np.testing.assert_array_equal(back, x * 10 * mask[..., None])  # the filler is dropped
    got = u.at(tf.constant(rows), tf.constant([[2, 0], [0, 0], [3, 1]])).numpy()
    np.testing.assert_array_equal(got[0], x[0, [2, 0]])
    np.testing.assert_array_equal(got[2], x[2, [3, 1]])
    assert int(layers.Unpadded(tf.constant(mask), multiple=1).count) == 7
    # A batch of padding alone (an evaluation's filled-up last batch) still has rows to read:
    # [CLS] of an empty example reads row 0, a filler of position 0. An empty batch has none.
    empty = layers.Unpadded(tf.zeros((2, 5), tf.int32), multiple=4)
    assert int(empty.count) == 4
    got = empty.at(empty.rows(tf.constant(x[:2])), tf.zeros((2, 1), tf.int32)).numpy()
    np.testing.assert_array_equal(got[:, 0], x[[0, 0], 0])
    assert int(layers.Unpadded(tf.zeros((0, 5), tf.int32), multiple=4).count) == 0


def unpadded_outputs_and_gradients(encoder, batch, positions, branches, remove_padding):
    """outputs_and_gradients' outputs of `encoder`, with every (B, S, H) output read at the
    real positions only (zeros at padding), and the gradients of a fixed random weighting of
    those: what the padded and unpadded layouts must agree on."""
    bert.set_encoder_branches(encoder, branches)
    bert.set_remove_padding(encoder, remove_padding)
    real = tf.constant(batch["input_mask"][..., None], tf.float32)  # (B, S, 1)
    with tf.GradientTape() as tape:
        out = encoder(batch, training=True, output_positions=positions)
        flat = [
            x * real if x.shape.rank == 3 and x.shape[1] == real.shape[1] else x
            for x in tf.nest.flatten(out)
        ]
        rng = np.random.default_rng(0)
        loss = sum(tf.reduce_sum(x * rng.normal(size=x.shape).astype("float32")) for x in flat)
    grads = tape.gradient(loss, encoder.trainable_variables)
    bert.set_remove_padding(encoder, False)
    return [np.array(x) for x in flat], [tf.convert_to_tensor(g).numpy() for g in grads]


@pytest.mark.parametrize("branches", [1, 2])
def test_remove_padding_equals_the_padded_layout_with_its_gradients(branches):
    # Each encoder family on its real tokens' rows against the padded layout, with and without
    # output_positions (all at real tokens, a repeat and [CLS] among them), in one pass and in 2
    # branches (a branch per Unpadded). Row 0 has 5 real tokens of 7, row 1 four, row 2 one;
    # the 10 rows count up to 64 with fillers. Every output at real positions (padding is
    # exactly 0 when unpadded) and every variable's gradient; tolerance 1e-5 of the largest
    # entry, as the branches' test: the rows' matmuls run in another row count.
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=9)
    batch["input_mask"][0, 5:] = 0
    batch["input_mask"][1, 4:] = 0
    batch["input_mask"][2, 1:] = 0
    positions = np.array([[3, 3, 1], [0, 2, 2], [0, 0, 0]], np.int32)
    for name, encoder in full_and_sparse_encoders():
        for pos in (None, positions):
            what = f"{name}, output_positions {pos is not None}"
            ref_out, ref_grads = unpadded_outputs_and_gradients(encoder, batch, pos, 1, False)
            out, grads = unpadded_outputs_and_gradients(encoder, batch, pos, branches, True)
            assert len(out) == len(ref_out), what
            for mine, theirs in [*zip(out, ref_out), *zip(grads, ref_grads)]:
                assert mine.shape == theirs.shape, what
                scale = max(np.abs(theirs).max(), 1e-3)
                np.testing.assert_allclose(mine, theirs, atol=1e-5 * scale, err_msg=what)
            # Negative control: the raw unpadded layer outputs are zero at padding, where the
            # padded layout's are not, so the comparison above really read them masked.
            bert.set_remove_padding(encoder, True)
            raw = encoder(batch, training=False, output_positions=pos)["encoder_outputs"][1]
            bert.set_remove_padding(encoder, False)
            padded = encoder(batch, training=False, output_positions=pos)["encoder_outputs"][1]
            assert np.abs(np.array(raw)[2, 1:]).max() == 0, what
            assert np.abs(np.array(padded)[2, 1:]).max() > 0, what


def test_remove_padding_refuses_xla_models_without_an_encoder_and_non_bools():
    from tests.test_gpt import tiny as gpt_tiny

    encoder = bert.BertEncoder(tiny_config())
    encoder.build()
    assert bert.set_remove_padding(encoder, True) == [encoder.name]
    batch = pretrain_throughput.synthetic_batch(BATCH, SEQ, PREDICTIONS, VOCAB, seed=9)
    inputs = {k: batch[k] for k in bert.dummy_inputs()}

    @tf.function(jit_compile=True)
    def compiled(b):
        return encoder(b)["sequence_output"]

    with pytest.raises(ValueError, match="remove padding: XLA"):
        compiled(inputs)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="remove padding: expected a bool"):
            bert.set_remove_padding(encoder, bad)
    # Set under a TPUStrategy's scope (a stand-in: no TPU here), the run needs static shapes.
    from unittest import mock

    tpu = mock.MagicMock(spec=tf.distribute.TPUStrategy)
    with mock.patch.object(tf.distribute, "get_strategy", return_value=tpu):
        with pytest.raises(ValueError, match="remove padding: a TPU needs static shapes"):
            bert.set_remove_padding(encoder, True)
    # SelfAttention told of the rows and the query positions, without the gathered queries,
    # reads them from the rows itself (as TransformerBlock hands them over).
    from modeling import layers

    attention = encoder.blocks[0].attention
    positions = tf.constant([[0, 2]] * BATCH)
    batch["input_mask"][0, 3:] = 0  # rows of sequence 1 start at 3, not at 7
    mask = tf.constant(batch["input_mask"])
    unpadded = layers.Unpadded(mask)
    x = tf.random.stateless_normal((BATCH, SEQ, attention.hidden_size), [1, 2])
    rows = unpadded.rows(x)
    given = attention(rows, mask, query_positions=positions, queries=unpadded.at(rows, positions),
                      unpadded=unpadded)  # fmt: skip
    read = attention(rows, mask, query_positions=positions, unpadded=unpadded)
    np.testing.assert_array_equal(read, given)
    padded = attention(x, mask, query_positions=positions)
    np.testing.assert_allclose(read, padded, atol=1e-5)
    with pytest.raises(ValueError, match="holds no encoder that runs on its real tokens"):
        bert.set_remove_padding(gpt_tiny(), True)


def test_branch_sizes_are_even_and_never_empty_when_static():
    assert bert.branch_sizes(7, 3) == [3, 2, 2]
    assert bert.branch_sizes(6, 2) == [3, 3]
    assert bert.branch_sizes(2, 3) == [1, 1]  # fewer slices than asked, none empty
    assert bert.branch_sizes(0, 3) == [0]
    dynamic = [int(n) for n in bert.branch_sizes(tf.constant(2), 3)]
    assert dynamic == [1, 1, 0]  # a dynamic batch keeps K slices; the empty ones pass through
    assert [int(n) for n in bert.branch_sizes(tf.constant(7), 3)] == [3, 2, 2]


def test_set_encoder_branches_finds_every_encoder_and_refuses_models_without_one():
    from modeling import electra
    from tests.test_electra import TINY as ELECTRA_TINY
    from tests.test_gpt import tiny as gpt_tiny

    model = electra.ElectraPretrainer(electra.ElectraConfig(**ELECTRA_TINY))
    model.build()
    names = bert.set_encoder_branches(model, 2)
    assert len(names) == 2  # the generator's encoder and the discriminator's
    assert model.encoder.parallel_branches == 2
    assert model.generator.parallel_branches == 2
    pretrainer = bert.BertPretrainer(tiny_config())
    assert bert.set_encoder_branches(pretrainer, 3) == [pretrainer.encoder.name]
    assert pretrainer.encoder.parallel_branches == 3
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="expected an int >= 1"):
            bert.set_encoder_branches(pretrainer, bad)
    with pytest.raises(ValueError, match="holds no encoder that runs in branches"):
        bert.set_encoder_branches(gpt_tiny(), 2)


def test_execution_options_set_each_flag_and_name_it_in_their_errors():
    """bert.set_execution_options, the entrypoints' three speed flags in one call: defaults
    leave the model alone, each option sets what its own setter sets, and an error starts with
    the flag as the command line spells it."""
    from modeling import layers
    from tests.test_gpt import tiny as gpt_tiny

    def dense(model):
        return [
            m.xla_weight_gradient for m in model._flatten_layers() if isinstance(m, layers.Dense)
        ]

    model = bert.BertPretrainer(tiny_config())
    model.build()
    bert.set_execution_options(model)
    assert (model.encoder.parallel_branches, model.encoder.remove_padding) == (1, False)
    assert not any(dense(model))
    bert.set_execution_options(model, 2, True, True)
    assert (model.encoder.parallel_branches, model.encoder.remove_padding) == (2, True)
    assert len(dense(model)) == 11 and all(dense(model))  # 4 a layer at 2 layers, the heads' 3
    layers.set_xla_weight_gradients(model, False)
    bert.set_remove_padding(model, False)
    with pytest.raises(ValueError, match=r"^--encoder_branches=0: encoder branches: expected"):
        bert.set_execution_options(model, 0)
    with pytest.raises(ValueError, match=r"^--remove_padding: remove padding: --use_xla compiles"):
        bert.set_execution_options(model, remove_padding=True,
                                   static_shapes="--use_xla compiles static shapes")  # fmt: skip
    assert not model.encoder.remove_padding  # refused before anything was set
    plain = keras.Sequential([keras.layers.Dense(2)])  # Keras' Dense, not Cloze's
    bert.set_execution_options(plain)  # nothing asked: nothing refused
    with pytest.raises(ValueError, match=r"^--xla_weight_gradients: XLA weight gradients: Seq"):
        bert.set_execution_options(plain, xla_weight_gradients=True)
    with pytest.raises(ValueError, match=r"^--encoder_branches=2: encoder branches: GptLM"):
        bert.set_execution_options(gpt_tiny(), 2)
