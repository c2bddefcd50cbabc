#!/usr/bin/env bash
# The suite's GPU runs behind the example reports (reports/examples/<gpu>/<date>/README.md), one stage per call:
#   bash tools/gpu_runs.sh OUT_DIR ci        `jfa-conformance run` (ci profile) twice: from the compile caches as
#                                            they are (a fresh machine: empty), then again with the caches the
#                                            first left; GPU memory sampled every second: OUT_DIR/reports/{cold,warm}/,
#                                            OUT_DIR/{cold,warm}-gpu-mem.csv
#   bash tools/gpu_runs.sh OUT_DIR bench     a warm run with --bench: OUT_DIR/reports/bench/
#   bash tools/gpu_runs.sh OUT_DIR layouts   tests/test_adapter_layouts.py (every adapter under caller layouts):
#                                            OUT_DIR/layouts.txt
#   bash tools/gpu_runs.sh OUT_DIR fa4-old   the spec on older FA4 releases, each alone: OLD_FA4 names folders
#                                            holding one release each (pip install --no-deps --target DIR
#                                            flash-attn-4==4.0.0bNN): OUT_DIR/reports/fa4-<folder name>/
#   bash tools/gpu_runs.sh OUT_DIR dev       a run of the dev profile (the caches as they are): OUT_DIR/reports/dev/
#   bash tools/gpu_runs.sh OUT_DIR dev-start the same, detached (its own session, in RUN_DIR, default /tmp/jfa-dev-run),
#                                            so that it outlives a command's time limit on a machine kept warm; returns
#   bash tools/gpu_runs.sh OUT_DIR dev-wait  waits for it (at most WAIT seconds, default 560) and, once it is done,
#                                            copies its log and OUT_DIR/reports.tgz; call again while it runs
#   bash tools/gpu_runs.sh OUT_DIR flashinfer  the four flashinfer backends: OUT_DIR/reports/flashinfer/
#   bash tools/gpu_runs.sh OUT_DIR flashinfer-bench  the flashinfer backends with --bench beside fa4 and
#                                            triton-jfa (baseline fa4): OUT_DIR/reports/flashinfer-bench/
#   bash tools/gpu_runs.sh OUT_DIR host      tools/host_costs.py: a plain call's host time piece by piece:
#                                            OUT_DIR/host_costs.json
# FA4_PATH and FLASHINFER_PATH, if set, are put on PYTHONPATH (with the CuTe DSL packages under FA4_PATH).
# LIMIT sets each run's --time-limit (default 300 s). At the end the reports are packed into OUT_DIR/reports.tgz.
set -u
USAGE="usage: gpu_runs.sh OUT_DIR ci|bench|dev|dev-start|dev-wait|layouts|fa4-old|flashinfer|flashinfer-bench|host"
OUT_DIR=${1:?$USAGE}
STAGE=${2:?$USAGE}
RUN_DIR=${RUN_DIR:-/tmp/jfa-dev-run}
case $STAGE in
  dev-start)  # a copy of the tree, so that later uploads cannot change the sources under the running suite
    rm -rf "$RUN_DIR" && mkdir -p "$RUN_DIR/tree" "$RUN_DIR/out"
    git ls-files -z | xargs -0 cp --parents -t "$RUN_DIR/tree"
    cp -r .git "$RUN_DIR/tree/"
    (cd "$RUN_DIR/tree" && python3 -m pip install -q --no-deps --no-build-isolation -e . > "$RUN_DIR/pip.log" 2>&1)
    setsid nohup bash -c "cd '$RUN_DIR/tree' && bash tools/gpu_runs.sh '$RUN_DIR/out' dev; touch '$RUN_DIR/done'" \
      > "$RUN_DIR/driver.log" 2>&1 < /dev/null &
    echo "dev run started in $RUN_DIR (pid $!)"; exit 0 ;;
  dev-wait)
    end=$(( $(date +%s) + ${WAIT:-560} ))
    while [ ! -f "$RUN_DIR/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    tail -3 "$RUN_DIR/out/dev.log" 2>/dev/null
    if [ -f "$RUN_DIR/done" ]; then
      mkdir -p "$OUT_DIR" && cp "$RUN_DIR/out/log_dev.txt" "$RUN_DIR/out/reports.tgz" "$RUN_DIR/out/dev-gpu-mem.csv" "$OUT_DIR/"
      cat "$RUN_DIR/out/log_dev.txt"; echo "dev run done"
    else
      echo "dev run still running"
    fi
    exit 0 ;;
esac
LIMIT=${LIMIT:-300}
if [ -n "${FA4_PATH:-}" ]; then
  export PYTHONPATH=$FA4_PATH:$FA4_PATH/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
fi
if [ -n "${FLASHINFER_PATH:-}" ]; then
  export PYTHONPATH=$FLASHINFER_PATH:${PYTHONPATH:-} PATH=$FLASHINFER_PATH/bin:$PATH
fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR/reports"
LOG=$OUT_DIR/log_$STAGE.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
git log -1 --format="commit %H%n%s" | tee -a "$LOG"
run() {  # NAME [jfa-conformance run arguments...]: one run, timed, with the GPU's memory sampled
  local name=$1; shift
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 1000 > "$OUT_DIR/$name-gpu-mem.csv" &
  local sampler=$!
  local t0=$(date +%s)
  timeout $((LIMIT + 120)) python3 -m conformance.cli run -q --profile ci --time-limit "$LIMIT" --name "$name" \
    --report-dir "$OUT_DIR/reports" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  kill $sampler 2>/dev/null
  local peak=$(awk -F', ' 'BEGIN{m=0}{if($2+0>m)m=$2+0}END{print m}' "$OUT_DIR/$name-gpu-mem.csv")
  echo "$name: rc=$rc, $(( $(date +%s) - t0 )) s, GPU memory peak $peak MiB" | tee -a "$LOG"
  sed -n 1,20p "$OUT_DIR/reports/$name/summary.md" 2>/dev/null | tee -a "$LOG"
}
case $STAGE in
  ci)
    run cold --no-bench
    run warm --no-bench ;;
  bench)
    run bench --bench ;;
  layouts)
    timeout 560 python3 -m pytest tests/test_adapter_layouts.py -rA -q -p no:cacheprovider > "$OUT_DIR/layouts.txt" 2>&1
    echo "layouts rc=$?" | tee -a "$LOG"; tail -15 "$OUT_DIR/layouts.txt" ;;
  fa4-old)
    for dir in ${OLD_FA4:?OLD_FA4: folders of older FA4 releases}; do
      PYTHONPATH=$dir:$PYTHONPATH run "fa4-$(basename "$dir")" --backend fa4 --no-bench
    done ;;
  dev)
    run dev --no-bench --profile dev ;;
  host)
    timeout 300 python3 tools/host_costs.py --out "$OUT_DIR/host_costs.json" 2>&1 | tee -a "$LOG" ;;
  flashinfer-bench)
    run flashinfer-bench --bench --baseline-backend fa4 --backend fa4 --backend triton-jfa --backend flashinfer \
      --backend flashinfer-fa2 --backend flashinfer-fa3 --backend flashinfer-cudnn ;;
  flashinfer)
    run flashinfer --no-bench --timeout 1200 --backend flashinfer --backend flashinfer-fa2 --backend flashinfer-fa3 \
      --backend flashinfer-cudnn ;;
  *)
    echo "unknown stage $STAGE (ci, bench, dev, dev-start, dev-wait, layouts, fa4-old, flashinfer, flashinfer-bench or host)" >&2; exit 2 ;;
esac
tar czf "$OUT_DIR/reports.tgz" -C "$OUT_DIR" reports
