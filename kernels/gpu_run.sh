#!/usr/bin/env bash
# One GPU run: correctness tests, config sweeps, full benchmark.
# FA4 (flash-attn-4 with its CuTe DSL) must be importable; FA4_PATH may point at an unpacked install.
set -u
FA4_PATH=${FA4_PATH:-/opt/fa4}
export PYTHONPATH=$FA4_PATH:$FA4_PATH/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
OUT_DIR=${1:-perf-out}; mkdir -p "$OUT_DIR"
L=$OUT_DIR/log.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader | tee -a $L
timeout 90 python3 -m pytest tests/test_kernels.py -q -n 8 -p no:cacheprovider -k gpu >> $L 2>&1
echo "pytest rc=$?"; grep -E "passed|failed" $L | tail -2
timeout 45 python3 -m kernels.sweep --out $OUT_DIR/a --shapes S1,S3,S4b --kinds fwd \
  --fwd "64,64,4,3;128,64,8,3;128,32,4,4;64,32,4,3" >> $L 2>&1
timeout 60 python3 -m kernels.sweep --out $OUT_DIR/b --shapes S1,S1c --kinds kvf >> $L 2>&1
python3 - <<'PY'
import json, os
o = os.environ["OUT"]; best = {}
for d in ("a", "b"):
    p = f"{o}/{d}/best.json"
    if os.path.exists(p):
        best.update(json.load(open(p))); os.remove(p)
json.dump(best, open(f"{o}/best.json", "w")); print("best", best)
PY
timeout 190 python3 -m kernels.bench --out $OUT_DIR --tag v2 --cfg $OUT_DIR/best.json \
  --impls triton,triton-atomic,fa4,sdpa >> $L 2>&1
timeout 60 python3 -m kernels.bench --out $OUT_DIR --tag flex --shapes S1,S1c,S2,S3 --impls flex >> $L 2>&1
grep -E "^\| S|TFLOP" $L | grep -v '"' | tail -40
cat $OUT_DIR/bench_v2.md 2>/dev/null | tail -30
