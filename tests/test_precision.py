"""Every family's pretraining model under run_pretraining's --precision=bf16 and fp16: the
float32 weights built under the mixed policy give finite float32 outputs near float32's (not
equal to them: the policy took) and finite float32 gradients. The fine-tuning heads are tested
beside their families (test_t5, test_xlnet, test_elmo, and each run_* script's test)."""

import keras
import pytest

from tests import helpers, table_gradients, test_elmo

# Every family with a pretraining model, as _family builds them.
FAMILIES = ("bert", "gpt", "xlnet", "t5", "bart", "elmo")


def _family(name):
    """(a function building the tiny model of `name`, its inputs, the outputs to compare)."""
    if name == "elmo":
        inputs = {"input_ids": test_elmo.ids()}
        return (lambda: test_elmo.lm()), inputs, ("forward_logits", "backward_logits")

    def make():
        model = table_gradients.family(name)[0]
        model.build()
        return model

    _, inputs, key = table_gradients.family(name)
    return make, inputs, (key,)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", FAMILIES)
def test_pretraining_models_run_near_float32_under_mixed_policies(name, precision):
    make, inputs, keys = _family(name)

    def forward(model):
        out = model(inputs, training=False)
        return out, sum(table_gradients.loss_of(out, k) for k in keys)

    # BertPretrainer's mlm_logits are in the compute dtype (its losses are float32 and, in
    # training, taken without the logits: bert.py); every other family's are float32.
    dtype = "compute" if name == "bert" else "float32"
    helpers.check_at_precision(make, forward, precision, dict.fromkeys(keys, dtype))


# Each family's tiny model, trained one step and run for inference in tf.functions, at each
# precision named in argv, in a fresh process with Grappler on (the test processes turn it off:
# conftest.py) and oneDNN's log of every primitive it runs. A line per family and precision
# after its runs.
_ONEDNN_SCAN = """
import sys, keras, tensorflow as tf
from tests import helpers, table_gradients, test_precision
for name in test_precision.FAMILIES:
    for precision in sys.argv[1:]:
        make, inputs, keys = test_precision._family(name)
        keras.utils.set_random_seed(0)
        model = make()
        if precision != "fp32":
            model = helpers.at_precision(make, model, precision)

        @tf.function
        def train():
            with tf.GradientTape() as tape:
                out = model(inputs, training=True)
                loss = sum(table_gradients.loss_of(out, k) for k in keys)
            return tape.gradient(loss, model.trainable_variables)

        train()
        tf.function(lambda: model(inputs, training=False))()
        print("SCANNED", name, precision, flush=True)
"""


def test_no_family_runs_onednn_reference_kernels():
    """On TensorFlow's oneDNN CPU kernels, no family's training or inference step, at any
    precision TensorFlow sends to oneDNN on this CPU (layers.onednn_takes: float32 always,
    bfloat16 on AVX-512 CPUs, float16 on AVX512-FP16 ones), runs a primitive only oneDNN's
    reference code implements (ONEDNN_VERBOSE names it `ref:...`): those took 330-600x their
    fast kernels' time on an AVX512-FP16 host (layers.float16_on_onednn_cpu; GPT's causal
    bias, gpt.py). Grappler makes most of these fusions, so the steps run with it on, as in
    real runs. The process turns oneDNN on (TensorFlow's default only on AVX-512 CPUs; users
    of AVX2 ones turn it on with TF_ENABLE_ONEDNN_OPTS=1) and hides any GPU. Without the three
    mends this fails on the AVX512-FP16 host (57th session: Dense's fused bias and ELMo's
    convolutions under fp16, GPT's (1, 1, T, T) bias at inference). 43 s there; with oneDNN
    capped to AVX2's or AMD AVX-512's kernels (ONEDNN_MAX_CPU_ISA, their precisions alone)
    the same scan found nothing either (58th)."""
    import os
    import platform
    import subprocess
    import sys

    from modeling import layers
    from tests.conftest import ROOT
    from training.precision import COMPUTE_DTYPES

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"oneDNN's x86 kernels are scanned; this machine is {platform.machine()}")
    env = {
        **os.environ,
        "CLOZE_TEST_GRAPPLER": "1",
        "ONEDNN_VERBOSE": "1",
        "TF_ENABLE_ONEDNN_OPTS": "1",
        "CUDA_VISIBLE_DEVICES": "-1",
    }
    precisions = [p for p, dtype in COMPUTE_DTYPES.items() if layers.onednn_takes(dtype)]
    assert precisions[0] == "fp32", precisions
    result = subprocess.run(
        [sys.executable, "-c", _ONEDNN_SCAN, *precisions],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found, pending, ran, scanned = {}, [], 0, []
    for line in result.stdout.splitlines():
        fields = line.split(",")
        if line.startswith("SCANNED"):  # the oneDNN lines above it are this family's
            scanned.append(tuple(line.split()[1:]))
            found.update({(*scanned[-1], primitive): text for primitive, text in pending})
            pending = []
        elif line.startswith("onednn_verbose") and len(fields) > 6 and fields[3] == "exec":
            ran += 1
            if fields[6].startswith("ref"):  # the implementation's name
                pending.append((fields[5], line[:300]))
    # Every family at every precision scanned, and the steps ran on oneDNN.
    assert len(scanned) == len(FAMILIES) * len(precisions) and ran > 100, (scanned, ran)
    assert not found and not pending, (found, pending)


def test_onednn_takes_follows_the_cpu_flags(monkeypatch):
    """layers.onednn_takes is TensorFlow's own answer, which this checks against Linux's CPU
    flags by the rule TensorFlow's util.cc states; where the check is missing it answers True
    (the cautious answer for the float16 mends)."""
    import platform

    from modeling import layers

    if platform.system() != "Linux" or platform.machine().lower() != "x86_64":
        pytest.skip("reads /proc/cpuinfo's x86 flags")
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    assert layers.onednn_takes("float32")
    assert layers.onednn_takes("bfloat16") == bool({"avx512f", "avx_ne_convert"} & flags)
    fp16 = "avx512bw" in flags and bool({"avx512_fp16", "amx_fp16"} & flags)
    assert layers.onednn_takes("float16") == (fp16 or "avx_ne_convert" in flags)

    from tensorflow.python.util import _pywrap_utils

    monkeypatch.delattr(_pywrap_utils, "IsDataTypeSupportedByOneDNNOnThisCPU")
    assert layers.onednn_takes("float16") and layers.onednn_takes("bfloat16")


def _grappler_op_types(fn, spec) -> set:
    """Op types of fn's graph, traced on the CPU, after Grappler's default passes (run here
    explicitly: the test processes turn it off for their own functions)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    def placed(x):
        with tf.device("/device:CPU:0"):
            return fn(x)

    concrete = tf.function(placed).get_concrete_function(spec)
    graph = concrete.graph
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph.as_graph_def(), graph=graph)
    fetch = meta_graph_pb2.CollectionDef()
    fetch.node_list.value.extend(t.op.name for t in concrete.outputs)
    meta.collection_def["train_op"].CopyFrom(fetch)
    optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    return {n.op for n in optimized.node} | {
        n.op for f in optimized.library.function for n in f.node_def
    }


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("shape", [(None, 16), (None, 5, 16)])
def test_float16_dense_keeps_its_bias_out_of_the_fused_matmul(shape, training, monkeypatch):
    """layers.Dense under float16 where that runs on oneDNN (layers.float16_on_onednn_cpu): no
    _FusedMatMul after Grappler, whose oneDNN kernel has no float16 code there; float32 keeps
    the fusion (the test sees one when it is there); the values and the input's and kernel's
    gradients are the plain MatMul + BiasAdd's bit for bit, the bias' within float16 rounding."""
    import numpy as np
    import tensorflow as tf

    from modeling import layers

    def dense(dtype):
        layer = layers.Dense(8, "gelu", dtype=dtype)
        layer.build(shape)
        return layer

    here = layers.float16_on_onednn_cpu()
    spec32, spec16 = tf.TensorSpec(shape, "float32"), tf.TensorSpec(shape, "float16")
    d32 = dense("float32")
    assert "_FusedMatMul" in _grappler_op_types(lambda x: d32(x, training=training), spec32)
    monkeypatch.setattr(layers, "float16_on_onednn_cpu", lambda: True)
    d16 = dense("float16")
    assert "_FusedMatMul" not in _grappler_op_types(lambda x: d16(x, training=training), spec16)

    # Unmended, the float16 graph fuses wherever Grappler fuses a float16 MatMul + BiasAdd at
    # all (oneDNN on a CPU with AVX512-FP16; elsewhere nothing fuses): this test's control.
    def plain(x):
        flat = tf.reshape(x, (-1, 16))
        return tf.nn.bias_add(tf.linalg.matmul(flat, d16.kernel), d16.bias)  # the variables

    monkeypatch.setattr(layers, "float16_on_onednn_cpu", lambda: False)
    unmended = _grappler_op_types(lambda x: d16(x, training=training), spec16)
    assert ("_FusedMatMul" in unmended) == ("_FusedMatMul" in _grappler_op_types(plain, spec16))
    if here:  # where the mend applies by itself, the unmended graph has the hazard
        assert "_FusedMatMul" in unmended
    monkeypatch.setattr(layers, "float16_on_onednn_cpu", lambda: True)

    x = tf.cast(tf.random.stateless_normal((4, *shape[1:]), [1, 2]), "float16")
    with tf.GradientTape() as tape:
        tape.watch(x)
        got = d16(x)  # eager: no Grappler, the mended form itself
    grads = tape.gradient(got, [x, d16.kernel, d16.bias])
    with tf.GradientTape() as tape:
        tape.watch(x)
        flat = tf.reshape(x, (-1, 16))
        want = tf.nn.bias_add(
            tf.linalg.matmul(flat, tf.cast(d16.kernel, "float16")), tf.cast(d16.bias, "float16")
        )
        want = tf.reshape(layers.dense_activation("gelu")(want), got.shape)
    want_grads = tape.gradient(want, [x, d16.kernel, d16.bias])
    np.testing.assert_array_equal(got, want)
    # The bias' gradient is a column Sum, not BiasAddGrad: another order of the float16 sums
    # (found 1 ulp apart); the others are the same products.
    np.testing.assert_array_equal(grads[0], want_grads[0])
    np.testing.assert_array_equal(grads[1], want_grads[1])
    np.testing.assert_allclose(grads[2], want_grads[2], rtol=2e-3)


@pytest.mark.parametrize("onednn_float16", [False, True])
def test_elmo_char_cnn_computes_in_float32_where_float16_hits_onednn_reference_code(
    onednn_float16, monkeypatch
):
    """ELMo's character CNN under fp16: where float16 would run on oneDNN's reference kernels
    (a convolution's weight gradient: 7.4 s against 11 ms; layers.float16_on_onednn_cpu), its
    convolutions, highway layers and projection compute in float32 and it still returns the
    policy's float16; elsewhere they keep the policy. Its embedding always keeps it."""
    import numpy as np

    from modeling import elmo, layers
    from training import optimization

    monkeypatch.setattr(layers, "float16_on_onednn_cpu", lambda: onednn_float16)
    with optimization.dtype_policy("fp16"):
        model = test_elmo.lm()
    cnn = [m for m in model._flatten_layers() if isinstance(m, elmo.CharCnnEncoder)]
    assert len(cnn) == 1
    inner = list(cnn[0]._flatten_layers(include_self=False))
    want = "float32" if onednn_float16 else "float16"
    assert {m.compute_dtype for m in inner if m.name != "char_embedding"} == {want}
    assert [m.compute_dtype for m in inner if m.name == "char_embedding"] == ["float16"]
    out = model({"input_ids": test_elmo.ids()}, training=False)
    dtype_of = keras.backend.standardize_dtype
    assert {dtype_of(out[k].dtype) for k in ("forward_logits", "backward_logits")} == {"float32"}
    chars = np.random.default_rng(0).integers(0, 262, (2, 3, 9)).astype("int32")  # (B, S, C)
    assert dtype_of(cnn[0](chars).dtype) == "float16"
