#!/usr/bin/env bash
# The next GPU lease's measurements as one prepared command (README, "For the next GPU lease").
#
# The lent machines reach no package registry and lack Keras and keras-hub (they have JAX with
# CUDA, PyTorch and transformers), so the wheels are fetched here first, into .whl/ (ignored by
# git), and carried there:
#   bash bench/gpu_lease.sh fetch
# Then, through the device tool, with carry [".whl"] and timeout_s 600:
#   bash bench/gpu_lease.sh run
# which installs the wheels (into /tmp/gpu_lease_site, put on PYTHONPATH) and runs
# bench/gpu_mfu.py in priority order, each under a time limit (their sum stays inside the tool's
# 10 minutes a command), writing the results, the log and nvidia-smi's report under $OUT. A
# benchmark that runs out of time loses its row alone.
# GPU_LEASE_DRY_RUN=1 prints the commands instead of running them (tests/test_bench.py checks
# each one against bench/gpu_mfu.py's own flags and the time limits against the tool's);
# GPU_LEASE_WHEELS names another folder of wheels than .whl.
set -euo pipefail
cd "$(dirname "$0")/.."

# The benchmarks, most wanted first: seconds allowed, output file, gpu_mfu flags. The fifty-first
# session measured BERT-base batch 64 in bf16, fp16 and fp32 and L24-H1024 batch 128 in bf16
# (README); fp16 was the narrowest (Cloze's step 9% slower than in bf16, keras-hub's 2%), so the
# next lease profiles that row in both precisions (each side's traced busy time and top kernels
# come back in the JSON; the traces stay on the machine, too deep for the tool to return) and
# takes L24's row a second time. The limits: compiling and timing a side took 35-43 s at
# BERT-base batch 64 and 60-66 s at L24 batch 128 (where 120 s cut keras-hub's side); a profile
# compiles the step once more and traces three steps.
BENCHMARKS=(
  "185|gpu_mfu_fp16_l12b64_profile.json|--precision=fp16 --sizes L12-H768 --batch 64 --profile_dir=/tmp/gpu_lease_profile/fp16"
  "185|gpu_mfu_bf16_l12b64_profile.json|--precision=bf16 --sizes L12-H768 --batch 64 --profile_dir=/tmp/gpu_lease_profile/bf16"
  "160|gpu_mfu_bf16_l24b128.json|--precision=bf16 --sizes L24-H1024 --batch 128"
)
WHEELS=(keras==3.15.1 keras-hub==0.32.0 namex optree)
WHEEL_DIR="${GPU_LEASE_WHEELS:-.whl}"

run() {
  if [[ -n "${GPU_LEASE_DRY_RUN:-}" ]]; then
    echo "$*"
  else
    "$@"
  fi
}

case "${1:-}" in
  fetch)
    # The lent machine's python3 is CPython 3.12 on x86-64 (the device tool's KINDS.md).
    run python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --dest "$WHEEL_DIR" "${WHEELS[@]}"
    ;;
  run)
    : "${OUT:?OUT must name the folder for the results (the device tool sets it)}"
    mkdir -p "$OUT"
    wheels=("$WHEEL_DIR"/*.whl)
    if [[ ! -e "${wheels[0]}" ]]; then
      echo "gpu_lease: no wheels in $WHEEL_DIR: run 'bash bench/gpu_lease.sh fetch' here first" >&2
      exit 1
    fi
    # Into a folder of their own on the path, as the device tool's notes advise: the image's own
    # environment is left as it is.
    site="${GPU_LEASE_SITE:-/tmp/gpu_lease_site}"
    run python3 -m pip install --no-deps --no-index --no-compile --target "$site" "${wheels[@]}"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    if [[ -z "${GPU_LEASE_DRY_RUN:-}" ]]; then
      nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1 || true
    fi
    for entry in "${BENCHMARKS[@]}"; do
      IFS='|' read -r seconds output flags <<< "$entry"
      # shellcheck disable=SC2086  # the flags are words
      run timeout "$seconds" env KERAS_BACKEND=jax PYTHONUNBUFFERED=1 python3 -m bench.gpu_mfu \
        $flags --steps 10 --repeats 2 --output_file="$OUT/$output" \
        || echo "gpu_lease: $output stopped (status $?)" >&2
    done 2>&1 | tee -a "${OUT}/gpu_lease.log"
    ;;
  *)
    echo "usage: bash bench/gpu_lease.sh fetch|run (see its header)" >&2
    exit 2
    ;;
esac
