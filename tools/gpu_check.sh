#!/usr/bin/env bash
# The kernels' GPU check, one stage per call (each fits a 10-minute slot on one H200):
#   bash tools/gpu_check.sh OUT_DIR tests   tests/test_kernels*.py and tests/test_schedule.py (the GPU tests
#                                                   and the rest, on the GPU) and tests/test_gluon_compile.py:
#                                                   OUT_DIR/pytest.txt
#   bash tools/gpu_check.sh OUT_DIR spec    the spec on triton-jfa (profile ci, on the GPU):
#                                                   OUT_DIR/spec/ci/ (summary.md, report.json, ...)
#   bash tools/gpu_check.sh OUT_DIR bench   the timing table against FA4 and padded SDPA, three
#                                                   interleaved rounds, S3 on three Pareto draws:
#                                                   OUT_DIR/bench.md, OUT_DIR/bench.json
#   bash tools/gpu_check.sh OUT_DIR ncu     Nsight Compute on one backward of FA4 and of triton-jfa (a plan) on
#                                                   S1, S4b and S5 (NCU_SHAPES) (tools/profile_kernels.py): each kernel's GPU
#                                                   time, tensor-pipe share and SM / DRAM throughput:
#                                                   OUT_DIR/ncu_<shape>_<impl>.csv; with KERNEL_TIMES=1 also
#                                                   torch.profiler's kernel times of the same calls:
#                                                   OUT_DIR/kernel_times.txt
# FA4 (flash-attn-4 with its CuTe DSL) must be importable for the bench's FA4 rows; FA4_PATH, if set, is put
# on PYTHONPATH with the CuTe DSL packages under it.  WORKERS sets the test and spec workers (default 8).
set -u
OUT_DIR=${1:?usage: gpu_check.sh OUT_DIR tests|spec|bench|ncu}
STAGE=${2:?usage: gpu_check.sh OUT_DIR tests|spec|bench|ncu}
WORKERS=${WORKERS:-8}
if [ -n "${FA4_PATH:-}" ]; then
  export PYTHONPATH=$FA4_PATH:$FA4_PATH/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/log_$STAGE.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$LOG"
git log -1 --format="commit %H%n%s" | tee -a "$LOG"
case $STAGE in
  tests)
    # -rA names every outcome, so a run cut off by the limit still says which tests finished
    timeout 560 python3 -m pytest tests/test_kernels.py tests/test_kernels_gpu.py tests/test_schedule.py tests/test_gluon_compile.py -rA -q -n "$WORKERS" \
      -p no:cacheprovider > "$OUT_DIR/pytest.txt" 2>&1
    echo "pytest rc=$?" | tee -a "$LOG"; tail -3 "$OUT_DIR/pytest.txt" ;;
  spec)
    # the adapters register through the package's entry points: install the tree (offline, no deps)
    python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT_DIR/pip.log" 2>&1
    timeout 540 python3 -m conformance.cli run --backend triton-jfa --profile ci --device cuda --no-bench -q \
      -n "$WORKERS" --timeout 520 --time-limit 520 --max-worker-restart 100 --report-dir "$OUT_DIR/spec" \
      --name ci >> "$LOG" 2>&1
    echo "spec rc=$?" | tee -a "$LOG"; tail -5 "$OUT_DIR/spec/ci/summary.md" 2>/dev/null ;;
  bench)
    timeout 560 python3 tools/bench.py --out "$OUT_DIR" --rounds 3 --once sdpa,triton-tl-plan \
      --impls fa4,triton-plan,triton,triton-tl-plan,sdpa --shapes S4b,S1,S1c,S2,S4a,S3,S3s1,S3s2,S5 \
      --s3-seeds 1,2 --host >> "$LOG" 2>&1
    echo "bench rc=$?" | tee -a "$LOG"; cat "$OUT_DIR/bench.md" 2>/dev/null ;;
  ncu)
    metrics=gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
    metrics=$metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
    metrics=$metrics,launch__registers_per_thread,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct
    for shape in ${NCU_SHAPES:-S1 S4b S5}; do
      for impl in fa4 triton-plan; do
        timeout 240 ncu --profile-from-start off --csv --metrics "$metrics" \
          python3 tools/profile_kernels.py --shape $shape --impl $impl --direction bwd > "$OUT_DIR/ncu_${shape}_${impl}.csv" 2>&1
        echo "ncu $shape $impl rc=$?" | tee -a "$LOG"
        if [ -n "${KERNEL_TIMES:-}" ]; then
          timeout 120 python3 tools/profile_kernels.py --shape $shape --impl $impl --direction bwd --kernel-times \
            >> "$OUT_DIR/kernel_times.txt" 2>&1
        fi
      done
    done
    for f in "$OUT_DIR"/ncu_*.csv; do echo "== $f"; grep -v '^==PROF==' "$f" | tail -30; done
    [ -f "$OUT_DIR/kernel_times.txt" ] && tail -40 "$OUT_DIR/kernel_times.txt" ;;
  *)
    echo "unknown stage $STAGE (tests, spec, bench or ncu)" >&2; exit 2 ;;
esac
