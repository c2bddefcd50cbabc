#!/usr/bin/env bash
# The suite's GPU runs behind the example reports (reports/examples/<gpu>/<date>/README.md), one stage per call:
#   bash tools/gpu_runs.sh OUT_DIR ci        `jfa-conformance run` (ci profile) twice: from the compile caches as
#                                            they are (a fresh machine: empty), then again with the caches the
#                                            first left; GPU memory sampled every second: OUT_DIR/reports/{cold,warm}/,
#                                            OUT_DIR/{cold,warm}-gpu-mem.csv
#   bash tools/gpu_runs.sh OUT_DIR ci-core   the same two runs without FlashInfer (the backend set of the ci targets),
#                                            in a cache directory of their own (OUT_DIR/cache-core), so that a later
#                                            ci stage still starts cold: OUT_DIR/reports/{core-cold,core-warm}/
#   bash tools/gpu_runs.sh OUT_DIR default   `jfa-conformance run` as a user types it (no options but where the report
#                                            goes: the ci profile, the timings, the default cache directory) twice,
#                                            cold then warm: OUT_DIR/reports/{default-cold,default-warm}/
#   bash tools/gpu_runs.sh OUT_DIR bench     a warm run with --bench: OUT_DIR/reports/bench/
#   bash tools/gpu_runs.sh OUT_DIR layouts   tests/test_adapter_layouts.py (every adapter under caller layouts):
#                                            OUT_DIR/layouts.txt
#   bash tools/gpu_runs.sh OUT_DIR fa4-old   the spec on older FA4 releases, each alone: OLD_FA4 names folders
#                                            holding one release each (pip install --no-deps --target DIR
#                                            flash-attn-4==4.0.0bNN): OUT_DIR/reports/fa4-<folder name>/
#   bash tools/gpu_runs.sh OUT_DIR dev       a run of the dev profile (the caches as they are): OUT_DIR/reports/dev/
#   bash tools/gpu_runs.sh OUT_DIR start     the stages named in STAGES (default "dev"), one after another, detached
#                                            (its own session, in RUN_DIR, default /tmp/jfa-run, from a copy of the
#                                            tree) so that they outlive a command's time limit on a machine kept warm
#   bash tools/gpu_runs.sh OUT_DIR wait      waits for them (at most WAIT seconds, default 560), prints each stage's
#                                            log so far and copies the logs, memory samples, kernel benchmark JSON
#                                            and OUT_DIR/reports.tgz (the stages finished so far); call again while it runs
#   bash tools/gpu_runs.sh OUT_DIR kernels   tools/bench.py against FA4 (every bench shape, S3 on three seeds,
#                                            host costs): OUT_DIR/bench/; VARIANTS="NAME=CONFIG ..." adds a
#                                            kernels.Config variant per word (bench.py --variant)
#   bash tools/gpu_runs.sh OUT_DIR flashinfer  the four flashinfer backends: OUT_DIR/reports/flashinfer/
#   bash tools/gpu_runs.sh OUT_DIR flashinfer-bench  the flashinfer backends with --bench beside fa4 and
#                                            triton-jfa (baseline fa4): OUT_DIR/reports/flashinfer-bench/
#   bash tools/gpu_runs.sh OUT_DIR host      tools/host_costs.py: a plain call's host time piece by piece:
#                                            OUT_DIR/host_costs.json
#   bash tools/gpu_runs.sh OUT_DIR subset    the checks a -k expression selects (K), on every backend, no timings, the
#                                            caches as they are: OUT_DIR/reports/subset/
#   bash tools/gpu_runs.sh OUT_DIR tox       `tox -e gpu` as a runner without network would run it: tox from the wheels in
#                                            TOX_WHEELS (tox, its dependencies and setuptools), the machine's packages
#                                            serving the env (FA4_PATH added to them by a .pth file for the stage):
#                                            OUT_DIR/reports/tox-gpu/, OUT_DIR/tox-gpu.log
#   bash tools/gpu_runs.sh OUT_DIR ncu       tools/gpu_check.sh's ncu stage (Nsight Compute on the backward of FA4
#                                            and triton-jfa), so that it can follow other stages: OUT_DIR/ncu/
# FA4_PATH and FLASHINFER_PATH, if set, are put on PYTHONPATH (with the CuTe DSL packages under FA4_PATH).
# LIMIT sets each run's --time-limit (default 300 s; the dev stage's is LIMIT_DEV). At the end the reports are packed into OUT_DIR/reports.tgz.
set -u
USAGE="usage: gpu_runs.sh OUT_DIR ci|ci-core|default|bench|dev|start|wait|kernels|layouts|fa4-old|flashinfer|flashinfer-bench|host|subset|tox|ncu"
OUT_DIR=${1:?$USAGE}
STAGE=${2:?$USAGE}
RUN_DIR=${RUN_DIR:-/tmp/jfa-run}
case $STAGE in
  start)  # a copy of the tree, so that later uploads cannot change the sources under the running suite
    rm -rf "$RUN_DIR" && mkdir -p "$RUN_DIR/tree" "$RUN_DIR/out"
    git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$RUN_DIR/tree"  # untracked too: a machine's .git may lag its files
    cp -r .git "$RUN_DIR/tree/"
    # what a report will call "uncommitted changes" on this machine, if anything (the first 40 paths)
    (cd "$RUN_DIR/tree" && git status --porcelain --untracked-files=no | head -40) > "$RUN_DIR/out/log_tree.txt"
    (cd "$RUN_DIR/tree" && python3 -m pip install -q --no-deps --no-build-isolation -e . > "$RUN_DIR/pip.log" 2>&1)
    setsid nohup bash -c "cd '$RUN_DIR/tree' && for s in ${STAGES:-dev}; do bash tools/gpu_runs.sh '$RUN_DIR/out' \$s; \
      tar czf '$RUN_DIR/out/reports.tgz' -C '$RUN_DIR/out' reports; done; touch '$RUN_DIR/done'" \
      > "$RUN_DIR/driver.log" 2>&1 < /dev/null &
    echo "stages ${STAGES:-dev} started in $RUN_DIR (pid $!)"; exit 0 ;;
  wait)
    end=$(( $(date +%s) + ${WAIT:-560} ))
    while [ ! -f "$RUN_DIR/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    cat "$RUN_DIR"/out/log_*.txt 2>/dev/null
    mkdir -p "$OUT_DIR"
    cp "$RUN_DIR"/out/log_*.txt "$RUN_DIR"/out/*-gpu-mem.csv "$OUT_DIR/" 2>/dev/null
    # the reports of the stages finished so far (packed after each), and the benchmark's results so far
    cp "$RUN_DIR/out/reports.tgz" "$OUT_DIR/" 2>/dev/null
    [ -d "$RUN_DIR/out/bench" ] && tar czf "$OUT_DIR/bench.tgz" -C "$RUN_DIR/out" bench
    [ -d "$RUN_DIR/out/ncu" ] && tar czf "$OUT_DIR/ncu.tgz" -C "$RUN_DIR/out" ncu  # the profiles so far
    if [ -f "$RUN_DIR/done" ]; then
      echo "all stages done"
    else
      for f in "$RUN_DIR"/out/*.log; do echo "== $f"; tail -2 "$f"; done 2>/dev/null
      echo "still running"
    fi
    exit 0 ;;
esac
LIMIT=${LIMIT:-300}
if [ -n "${FA4_PATH:-}" ]; then
  export PYTHONPATH=$FA4_PATH:$FA4_PATH/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
fi
if [ -n "${FLASHINFER_PATH:-}" ] && [ "$STAGE" != ci-core ]; then
  export PYTHONPATH=$FLASHINFER_PATH:${PYTHONPATH:-} PATH=$FLASHINFER_PATH/bin:$PATH
fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT_DIR/reports"
LOG=$OUT_DIR/log_$STAGE.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
git log -1 --format="commit %H%n%s" | tee -a "$LOG"
run() {  # NAME [jfa-conformance run arguments...]: one run, timed, with the GPU's memory sampled
  local name=$1; shift
  local options=(-q --profile ci --time-limit "$LIMIT")
  if [ "${1:-}" = --as-typed ]; then options=(); shift; fi
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 1000 > "$OUT_DIR/$name-gpu-mem.csv" &
  local sampler=$!
  local t0=$(date +%s)
  timeout $((LIMIT + 120)) python3 -m conformance.cli run "${options[@]}" --name "$name" \
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
  ci-core)
    run core-cold --no-bench --cache-dir "$OUT_DIR/cache-core"
    run core-warm --no-bench --cache-dir "$OUT_DIR/cache-core" ;;
  default)  # (the command's own time limit stays LIMIT + 120 s)
    run default-cold --as-typed
    run default-warm --as-typed ;;
  bench)
    run bench --bench ;;
  layouts)
    timeout 560 python3 -m pytest tests/test_adapter_layouts.py -rA -q -p no:cacheprovider > "$OUT_DIR/layouts.txt" 2>&1
    echo "layouts rc=$?" | tee -a "$LOG"; tail -15 "$OUT_DIR/layouts.txt" ;;
  fa4-old)
    for dir in ${OLD_FA4:?OLD_FA4: folders of older FA4 releases}; do
      PYTHONPATH=$dir:$PYTHONPATH run "fa4-$(basename "$dir")" --backend fa4 --no-bench
    done ;;
  dev)  # LIMIT_DEV (default 1200 s: the dev profile's target) is its --time-limit
    LIMIT=${LIMIT_DEV:-1200} run dev --no-bench --profile dev ;;
  subset)
    run subset --no-bench -k "${K:?K: a -k expression}" ;;
  tox)
    python3 -m pip install -q --no-index --find-links "${TOX_WHEELS:?TOX_WHEELS: a folder of wheels}" --target /tmp/tox-pkgs tox
    # tox's env sees the base interpreter's packages; where the runner's torch lives in a virtualenv (this
    # image: python3 is a virtualenv's), a .pth file in the base interpreter's site-packages names that
    # virtualenv's packages and FA4_PATH, as a runner with a system-wide torch and FA4 would have them
    # (the directory is the one the base interpreter itself reads: Debian's and Ubuntu's read dist-packages)
    site_dir=$("$(python3 -c 'import sys; print(sys._base_executable)')" -c 'import site; print(site.getsitepackages()[0])')
    mkdir -p "$site_dir" && pth=$site_dir/jfa-runner.pth
    python3 -c 'import sys, site; print("\n".join(p for p in site.getsitepackages() if sys.prefix != sys.base_prefix))' > "$pth"
    [ -n "${FA4_PATH:-}" ] && printf '%s\n%s\n' "$FA4_PATH" "$FA4_PATH/nvidia_cutlass_dsl/dsl_packages" >> "$pth"
    echo "runner packages for tox ($pth): $(tr '\n' ' ' < "$pth")" | tee -a "$LOG"
    t0=$(date +%s)
    PYTHONPATH=/tmp/tox-pkgs PIP_NO_INDEX=1 PIP_FIND_LINKS=$TOX_WHEELS timeout $((LIMIT + 300)) python3 -m tox -e gpu -- --name tox-gpu \
      --report-dir "$OUT_DIR/reports" > "$OUT_DIR/tox-gpu.log" 2>&1
    echo "tox -e gpu: rc=$?, $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
    rm -f "$pth"; tail -25 "$OUT_DIR/tox-gpu.log" | tee -a "$LOG" ;;
  ncu)
    bash tools/gpu_check.sh "$OUT_DIR/ncu" ncu 2>&1 | tee -a "$LOG"
    [ -d "$OUT_DIR/ncu" ] && tar czf "$OUT_DIR/ncu.tgz" -C "$OUT_DIR" ncu ;;
  host)
    timeout 300 python3 tools/host_costs.py --out "$OUT_DIR/host_costs.json" 2>&1 | tee -a "$LOG" ;;
  kernels)
    variants=()
    for v in ${VARIANTS:-}; do variants+=(--variant "$v"); done
    timeout 900 python3 tools/bench.py --out "$OUT_DIR/bench" --rounds "${ROUNDS:-3}" \
      --impls "${IMPLS:-fa4,triton-plan,triton,triton-fresh,triton-fresh-2}" "${variants[@]}" \
      --shapes "${SHAPES:-S4b,S1,S1c,S2,S4a,S3,S5}" --s3-seeds "${S3_SEEDS:-1,2}" --host > "$OUT_DIR/kernels.log" 2>&1
    echo "kernels rc=$?" | tee -a "$LOG"; tail -40 "$OUT_DIR/kernels.log" | tee -a "$LOG" ;;
  flashinfer-bench)
    run flashinfer-bench --bench --baseline-backend fa4 --backend fa4 --backend triton-jfa --backend flashinfer \
      --backend flashinfer-fa2 --backend flashinfer-fa3 --backend flashinfer-cudnn ;;
  flashinfer)
    run flashinfer --no-bench --timeout 1200 --backend flashinfer --backend flashinfer-fa2 --backend flashinfer-fa3 \
      --backend flashinfer-cudnn ;;
  *)
    echo "unknown stage $STAGE (ci, ci-core, default, bench, dev, start, wait, kernels, layouts, fa4-old, flashinfer, flashinfer-bench, host, subset, tox or ncu)" >&2; exit 2 ;;
esac
tar czf "$OUT_DIR/reports.tgz" -C "$OUT_DIR" reports
