#!/usr/bin/env bash
# One prepared GPU session on a lent device machine (ember's device tool): installs the few Python
# packages its image lacks (carried as wheels in .whl/), builds the native core for its Python,
# then runs the steps named in $STEPS (default: all) with their output under $OUT.
#   STEPS="gpu tests cache dlrm pipeline nccl" bash bench/gpu/session.sh
# index (bench_device_index: ember.tiers.device_index on the GPU against the host KeyIndex + upload).
# engines (bench_pipeline with --engine inline and with --data-workers 1: why Parquet on threads trails in line on a GPU).
# Two more steps measure the machine's host CPU (issue 29 items 4-5; the H100/H200 hosts lent so
# far were Intel Xeons with AMX-BF16), not run unless named: tiers (bench_tiers --zipf) and
# mlperf (bench_mlperf, short; torch threads = the host's cores); autocast (bench_autocast_size: where
# train.precision auto's bf16 starts to pay on an AMX host, BF16_MIN_MACS being measured on AVX512-BF16)
# interaction (not run unless named: bench_interaction, the DLRM interaction's own backward vs autograd's, on the GPU then the host CPU).
# compile (not run unless named: profile_step with --compile reduce-overhead: ember's device-index step and the dense-only
# step with the dense model under torch.compile's CUDA graphs, paired with eager; the step is bound by issuing ~300 launches;
# COMPILE_ARGS="--trainer 30" adds the pipelined trainer under train.compile).
# wide (not run unless named: profile_step at dim 128, batch 16,384: how much of the device-index step the rows' gathers
# and scatters over PCIe take once rows are 8x wider; the case for hot rows in device memory under the device index).
# cores (not run unless named, host CPU: bench_kernel_parts at the host's thread count, one part against its parts for
# every kernel, and bench_own_work at 1 / 4 / all threads: does ember's own work per step shrink with cores since every
# kernel splits on OpenMP's threads? its serial part is what more cores cannot shorten).
# profile (not run unless named: bench/gpu/profile_step.py, storage.index: device's full step against a dense-only step, torch.profiler's top operations, and the trainer's stage busy fractions).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ember-gpu-out}; mkdir -p "$OUT"
STEPS=${STEPS:-"gpu tests cache dlrm pipeline nccl"}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi -L; nproc
python3 setup.py -q build_ext --inplace 2>&1 | tail -2
python3 -c "import torch, ember._native as n; print('torch', torch.__version__, torch.cuda.get_device_name(), 'native', n.is_available())"
t0=$(date +%s)
el() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
for s in $STEPS; do
  case $s in
    gpu) el "gpu tests (-m gpu)"
      timeout ${GPU_S:-330} python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu --timeout 200 \
        --junitxml="$OUT/gpu_tests.xml" tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -30 ;;
    tests) el tests
      timeout ${TESTS_S:-170} python3 -m pytest -q -rf --tb=short -n 12 -p no:cacheprovider -m "${TESTS_M:-not dist}" --timeout 120 \
        --junitxml="$OUT/tests.xml" ${TEST_PATHS:-tests} 2>&1 | tee "$OUT/tests.log" | grep -E "FAILED|passed|failed|error" | tail -30 ;;
    cache) el "bench_gpu_cache (the group cache, host rows, storage.index: device, plain PyTorch)"
      (cd bench && timeout ${CACHE_S:-200} python3 bench_gpu_cache.py ${CACHE_ARGS:-}) 2>&1 | tee "$OUT/gpu_cache.log" | tail -25 ;;
    index) el "bench_device_index (the index on the GPU vs the host's)"
      timeout ${INDEX_S:-120} python3 bench/bench_device_index.py ${INDEX_ARGS:-} 2>&1 | tee "$OUT/device_index.log" | tail -8 ;;
    dlrm) el bench_dlrm
      timeout 120 python3 bench/bench_dlrm.py --steps 20 2>&1 | tee "$OUT/dlrm.log" | tail -8 ;;
    pipeline) el bench_pipeline
      timeout 150 python3 bench/bench_pipeline.py --rows 300000 --steps 20 --rounds 1 --only files 2>&1 | tee "$OUT/pipeline.log" | tail -12 ;;
    engines) el "bench_pipeline: the embedding stages in line, then reading in a worker process"
      # GPU sessions 1 and 5: from Parquet the threaded stages (auto's choice on a GPU) ran at 0.63-0.68x of
      # everything in line, and in-memory batches on threads no faster than Parquet in line
      timeout 150 python3 bench/bench_pipeline.py --rows 300000 --steps 20 --rounds 1 --only files --engine inline 2>&1 \
        | tee "$OUT/pipeline_inline.log" | tail -8
      timeout 150 python3 bench/bench_pipeline.py --rows 300000 --steps 20 --rounds 1 --only files --data-workers 1 2>&1 \
        | tee "$OUT/pipeline_worker.log" | tail -8
      # GPU session 7: Parquet on threads 0.49x of in line (CSV 1.34x): pyarrow's pool of one thread per core beside
      # the kernel pool's and torch's? A pool of 4 decoding threads:
      timeout 150 python3 bench/bench_pipeline.py --rows 300000 --steps 20 --rounds 1 --only files --arrow-threads 4 2>&1 \
        | tee "$OUT/pipeline_arrow4.log" | tail -8 ;;
    tiers) el "bench_tiers --zipf (host CPU)"
      lscpu | grep -E "Model name|Thread|Core|Socket|Flags" | cut -c1-200 | tee "$OUT/lscpu.txt"
      timeout ${TIERS_S:-200} python3 bench/bench_tiers.py --zipf --rows 1000000 --batch 32768 --steps 60 --warmup 40 \
        2>&1 | tee "$OUT/tiers.log" | tail -12 ;;
    mlperf) el "bench_mlperf (host CPU)"
      timeout ${MLPERF_S:-300} python3 bench/bench_mlperf.py ${MLPERF_ARGS:---steps 5 --warmup 2} 2>&1 | tee "$OUT/mlperf.log" | tail -14 ;;
    autocast) el "bench_autocast_size (host CPU)"
      timeout ${AUTOCAST_S:-120} python3 bench/bench_autocast_size.py ${AUTOCAST_ARGS:-} 2>&1 | tee "$OUT/autocast.log" | tail -16 ;;
    interaction) el "bench_interaction (GPU, then host CPU)"
      timeout ${INTERACTION_S:-200} python3 bench/bench_interaction.py --device cuda --steps 40 --mlperf-steps 20 --mlperf-batch 32768 2>&1 | tee "$OUT/interaction_gpu.log" | tail -3
      timeout ${INTERACTION_S:-200} python3 bench/bench_interaction.py 2>&1 | tee "$OUT/interaction.log" | tail -3 ;;
    profile) el "profile_step (storage.index: device vs dense-only; torch.profiler)"
      timeout ${PROFILE_S:-150} python3 bench/gpu/profile_step.py --trainer 40 2>&1 | tee "$OUT/profile.log" | tail -3 ;;
    compile) el "profile_step --compile reduce-overhead (the dense model's forward and backward as CUDA graphs, train.compile)"
      timeout ${COMPILE_S:-240} python3 bench/gpu/profile_step.py --compile ${COMPILE_MODE:-reduce-overhead} --profile 2 ${COMPILE_ARGS:-} 2>&1 \
        | tee "$OUT/compile.log" | tail -3 ;;
    wide) el "profile_step --dim 128 --batch 16384 (the rows' PCIe share at MLPerf's dim: is a device tier of hot rows worth it?)"
      timeout ${WIDE_S:-200} python3 bench/gpu/profile_step.py --dim 128 --batch 16384 --steps 15 --warmup 30 --profile 3 2>&1 \
        | tee "$OUT/wide.log" | tail -3 ;;
    cores) el "bench_kernel_parts and bench_own_work (host CPU, $(nproc) threads)"
      timeout ${CORES_S:-150} python3 bench/bench_kernel_parts.py --threads $(nproc) --calls 100 2>&1 | tee "$OUT/kernel_parts.log" | tail -12
      timeout ${CORES_S:-150} python3 bench/bench_own_work.py --threads 1 4 $(nproc) --steps 30 --predict $(nproc) 2>&1 \
        | tee "$OUT/own_work.log" | tail -6 ;;
    nccl) el torchrun nccl
      timeout 90 torchrun --standalone --nproc_per_node 1 -m ember train --config configs/demo.yaml --overwrite 2>&1 | tee "$OUT/nccl.log" | tail -12 ;;
  esac
done
el done
