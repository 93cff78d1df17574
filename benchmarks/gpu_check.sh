#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, CuPy and PyTorch, and no network:
#   1. installs mpich, mpi4py (from the wheels in .wheels/, which `make gpu-wheels` fetches on a
#      machine with network) and ringreduce itself into the Python that holds CuPy;
#   2. runs the GPU tests (tests/jobs/gpu/test_gpu.py at 1 and 2 ranks sharing the GPU, and the GPU
#      path's unit tests);
#   3. runs the synthetic training example on the GPU at 1 and 2 ranks;
#   4. runs the GPU allreduce benchmark (4 KiB to 1 GiB, with and without FP16; torch float32,
#      float16 and bfloat16 tensors) under each transport, what one GPU can show first: NCCL at 1
#      rank, staging at 1 and 2 ranks (two ranks sharing one GPU), CUDA-aware MPI where the library
#      has it, NCCL at 2 ranks where there are 2 GPUs;
#   5. with the time left, the cost model's held-out check on one host at 4 and 8 ranks, each on a
#      core of its own (this 2-core project VM can only run them crowded): cost_model.jsonl.
# Results: benchmarks/results/gpu-DATE.json and gpu-DATE.log, copied to $OUT (when set) after every
# step, so a run cut short keeps what it measured.
# Every step has a time limit, cut to what is left of 5 minutes, so the check ends within 5.5.
#   --dry-run: on a machine without a GPU, walk every step with the emulated CuPy
#   (tests/support/emulated_cupy), the smallest sizes and no install, into a temporary folder:
#   a check of the script itself, in under a minute. Its numbers mean nothing.
set -uo pipefail
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
END=$((SECONDS + 300))
limit() {  # the smaller of $1 seconds and what is left (at least 5)
  local left=$((END - SECONDS))
  if ((left < $1)); then echo $((left > 5 ? left : 5)); else echo "$1"; fi
}
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DAY=$(date -u +%Y-%m-%d)
RESULTS=benchmarks/results
MAX_MIB=${GPU_CHECK_MAX_MIB:-1024}
SECONDS_PER_POINT=0.3
if ((DRY_RUN)); then
  RESULTS=$(mktemp -d)
  MAX_MIB=1
  SECONDS_PER_POINT=0.01
  # One GPU, as on the machine the check is for.
  export PYTHONPATH="$PWD/tests/support/emulated_cupy${PYTHONPATH:+:$PYTHONPATH}" RINGREDUCE_CUDA_AWARE_MPI=1 \
    EMULATED_CUPY_SHARED_GPU=1 RINGREDUCE_TEST_STREAMS_SIDE=64
fi
JSON=$RESULTS/gpu-$DAY.json
LOG=$RESULTS/gpu-$DAY.log
mkdir -p "$RESULTS"
rm -f "$JSON"
exec > >(tee "$LOG" ${OUT:+"$OUT/gpu-$DAY.log"}) 2>&1
export PYTHONUNBUFFERED=1
save() {  # what has been measured so far, into $OUT
  if [ -n "${OUT:-}" ]; then
    for file in "$JSON" "$RESULTS/cost_model.jsonl"; do [ -f "$file" ] && cp "$file" "$OUT"/; done
  fi
  return 0
}

if ((DRY_RUN)); then
  echo "== dry run: the emulated CuPy, results in $RESULTS"
else
  echo "== install (offline)"
  ls .wheels/*.whl >/dev/null || { echo "no wheels in .wheels/: run 'make gpu-wheels' where there is network"; exit 1; }
  timeout "$(limit 120)" "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --force-reinstall .wheels/*.whl || exit 1
  timeout "$(limit 120)" "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
fi
PATH="$("$PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
export PATH
nvidia-smi -L || true
timeout "$(limit 60)" rrun --check-build
"$PYTHON" -c 'import sys; from ringreduce.machine import gpu; why = gpu.unavailable_reason(); why and sys.exit(why)' \
  || { echo "no usable GPU: this check would prove nothing here"; exit 3; }

echo "== GPU tests"
# The dry run takes one case of each GPU job (tests/jobs/gpu/test_gpu_emulated.py runs them all there).
SELECTED=()
((DRY_RUN)) && SELECTED=(-k "2-auto or numpy_on_one_rank or two_ranks_on_one_gpu or test_gpu_logic")
timeout "$(limit 150)" "$PYTHON" -m pytest -q -p no:cacheprovider -rs "${SELECTED[@]}" tests/jobs/gpu/test_gpu.py \
  tests/unit/test_gpu_logic.py
tests=$?
save

echo "== the synthetic training example on the GPU (gradients allreduced on the GPU)"
for ranks in 1 2; do
  timeout "$(limit 60)" rrun -np "$ranks" "$PYTHON" examples/pytorch_synthetic_benchmark.py --num-iters $((DRY_RUN ? 1 : 3)) \
    || echo "(the example failed at $ranks rank(s))"
done

echo "== GPU allreduce benchmark"
for run in 1:nccl 1:staged 2:staged 1:mpi 2:mpi 2:nccl; do
  ranks=${run%%:*} transport=${run#*:}
  if ((END - SECONDS < 20)); then echo "-- $ranks rank(s), $transport: not run (time is up)"; continue; fi
  echo "-- $ranks rank(s), $transport"
  timeout "$(limit 60)" rrun -np "$ranks" -x RINGREDUCE_GPU_TRANSPORT="$transport" "$PYTHON" benchmarks/gpu.py "$JSON" \
    --max-mib "$MAX_MIB" --seconds-per-point "$SECONDS_PER_POINT" || echo "(not run: $transport at $ranks rank(s), see above)"
  save
done

echo "== the cost model on this machine's cores (two-rank probe; 4 and 8 ranks held out)"
CORES=$(nproc)
LABEL="GPU machine's host, $CORES cores, a core per rank, $DAY"
for ranks in 4 8; do
  if ((DRY_RUN || ranks > CORES || END - SECONDS < 45)); then echo "-- $ranks ranks: not run ($CORES cores, $((END - SECONDS)) s left)"; continue; fi
  timeout "$(limit 75)" rrun -np "$ranks" "$PYTHON" benchmarks/cost_model.py --rounds 2 --max-bytes $((64 << 20)) \
    --label "$LABEL" || echo "(the cost model at $ranks ranks did not finish)"
done
((DRY_RUN)) || timeout "$(limit 30)" "$PYTHON" benchmarks/cost_model_summary.py --label "$LABEL"

save
echo "== tests exit status: $tests"
exit "$tests"
