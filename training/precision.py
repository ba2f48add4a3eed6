"""What --precision's values mean, in a module that imports nothing.

The training scripts' flag definitions (no TensorFlow import for --help) and the benchmarks'
processes without TensorFlow (bench/gpu_mfu.py under JAX, bench/peer_worker.py under PyTorch or
tf_keras) read them here; training/optimization.py builds the policies from them.
"""

from __future__ import annotations

# --precision value -> the Keras dtype policy a model is built under: variables stay float32,
# layers compute in bfloat16 / float16; losses are computed in float32 (modeling/losses.py casts
# the logits) and so are the attention softmax (modeling/layers.py) and LayerNorm (Keras).
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}

# --precision value -> the dtype its matrix products run in (its policy's compute dtype).
COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# The values, fp32 first: every --precision flag's choices.
PRECISION_NAMES = tuple(POLICIES)

# Appended to every --precision help: what the benchmarks found on CPUs (README, issue #9).
CPU_SPEED_NOTE = (
    " On a CPU bf16 pays only where bfloat16 products are fast: on AMD AVX-512 BF16 hosts the "
    "pretraining step ran 1.1-1.4x faster than fp32, on an Intel AVX-512 host without AMX "
    "(bfloat16 products at half the float32 rate) slower; fp16 (for GPUs without bfloat16) "
    "ran slower than fp32 on every CPU measured."
)

# The help of the fine-tuning scripts' --precision.
FINETUNE_PRECISION_HELP = (
    "Compute precision, as run_pretraining's flag: fp32, or mixed precision with float32 "
    "variables, softmax, losses and logits: bf16 (mixed_bfloat16) or fp16 (mixed_float16 with "
    "dynamic loss scaling; an overflow step halves the scale and is not applied). Checkpoints "
    "hold float32 weights at every precision; a resume with another precision is refused."
) + CPU_SPEED_NOTE
