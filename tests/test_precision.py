"""Every family's pretraining model under run_pretraining's --precision=bf16 and fp16: the
float32 weights built under the mixed policy give finite float32 outputs near float32's (not
equal to them: the policy took) and finite float32 gradients. The fine-tuning heads are tested
beside their families (test_t5, test_xlnet, test_elmo, and each run_* script's test)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers, table_gradients, test_elmo


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
@pytest.mark.parametrize("name", ["bert", "gpt", "xlnet", "t5", "bart", "elmo"])
def test_pretraining_models_run_near_float32_under_mixed_policies(name, precision):
    make, inputs, keys = _family(name)
    keras.utils.set_random_seed(0)
    reference = make()
    model = helpers.at_precision(make, reference, precision)
    assert model.compute_dtype == {"bf16": "bfloat16", "fp16": "float16"}[precision]

    def run(m):
        with tf.GradientTape() as tape:
            out = m(inputs, training=False)
            loss = sum(table_gradients.loss_of(out, k) for k in keys)
        grads = tape.gradient(loss, m.trainable_variables)
        return out, [tf.convert_to_tensor(g) for g in grads if g is not None]

    want, _ = run(reference)
    got, grads = run(model)
    for key in keys:
        # BertPretrainer's mlm_logits are in the compute dtype (its losses are float32 and, in
        # training, taken without the logits: bert.py); every other family's are float32.
        wanted = model.compute_dtype if name == "bert" else "float32"
        assert got[key].dtype == wanted, key
        mine, theirs = np.asarray(got[key], "float32"), np.asarray(want[key])
        assert np.isfinite(mine).all(), key
        difference = np.abs(mine - theirs).max() / np.abs(theirs).max()
        assert 0 < difference < helpers.MIXED_LOGITS_TOLERANCE[precision], (key, difference)
    assert grads and all(g.dtype == "float32" for g in grads)
    assert all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in grads)
