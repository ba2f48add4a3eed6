"""Every family's pretraining model under run_pretraining's --precision=bf16 and fp16: the
float32 weights built under the mixed policy give finite float32 outputs near float32's (not
equal to them: the policy took) and finite float32 gradients. The fine-tuning heads are tested
beside their families (test_t5, test_xlnet, test_elmo, and each run_* script's test)."""

import pytest

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

    def forward(model):
        out = model(inputs, training=False)
        return out, sum(table_gradients.loss_of(out, k) for k in keys)

    # BertPretrainer's mlm_logits are in the compute dtype (its losses are float32 and, in
    # training, taken without the logits: bert.py); every other family's are float32.
    dtype = "compute" if name == "bert" else "float32"
    helpers.check_at_precision(make, forward, precision, dict.fromkeys(keys, dtype))
