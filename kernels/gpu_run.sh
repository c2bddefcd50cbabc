#!/usr/bin/env bash
# GPU runs of the kernels, one stage per call (each fits a 10-minute slot on one H200):
#   bash kernels/gpu_run.sh OUT_DIR bench   one benchmark table (two interleaved rounds): FA4 first (ratios and
#                                           max |diff| against it), the shipped kernel through a plan, the same
#                                           with the tl dK/dV kernel, plain calls, flex_attention and padded SDPA
#                                           (one round); all six shapes
#   bash kernels/gpu_run.sh OUT_DIR tests   the GPU kernel tests but the Gluon ones (pytest -k "gpu and not gluon")
#   bash kernels/gpu_run.sh OUT_DIR gtests  the Gluon GPU tests but the fused dQ ones (those run in gfused); all
#                                           GPU tests at once no longer fit one 10-minute call
#   bash kernels/gpu_run.sh OUT_DIR spec    the spec on triton-jfa as shipped (profile ci, on the GPU)
#   bash kernels/gpu_run.sh OUT_DIR tldqspec the same with the tl dQ kernel (JFA_BWD_Q_KERNEL=triton)
#   bash kernels/gpu_run.sh OUT_DIR tlkvspec the same with the tl dK/dV kernel (JFA_BWD_KV_KERNEL=triton)
#   bash kernels/gpu_run.sh OUT_DIR dsspec  the same with dQ read back from stored dS (JFA_BWD_DQ_MODE=ds)
#   bash kernels/gpu_run.sh OUT_DIR fusedspec the same with dQ fused into the Gluon dK/dV kernel (JFA_BWD_DQ_MODE=atomic,
#                                           JFA_BWD_KV_KERNEL=gluon; JFA_GLUON_FUSED_DQ_SPLIT picks the split)
#   bash kernels/gpu_run.sh OUT_DIR verify  spec and the non-Gluon tests side by side (8 workers each), one call
#   bash kernels/gpu_run.sh OUT_DIR gbwd    the Gluon dK/dV and dQ kernels: their GPU tests, then the shipped
#                                           backward (Gluon dQ) against the tl dQ and the Gluon dK/dV kernel
#                                           beside either dQ kernel (one round, six shapes)
#   bash kernels/gpu_run.sh OUT_DIR gfused  dQ fused into the Gluon dK/dV kernel: its GPU tests, then the shipped
#                                           backward against it, the groups splitting the keys or the head dim
#                                           (2 stages, one or two dQ^T staging buffers), one round, six shapes
#   bash kernels/gpu_run.sh OUT_DIR dqtma   the fused atomic dQ mode: its GPU tests, then the shipped backward
#                                           against it with TMA or element adds and other fused tiles
#                                           (one round, the five non-broadcast shapes, no FA4)
#   bash kernels/gpu_run.sh OUT_DIR retime  the backward variants whose earlier timings ran the defaults
#                                           (PERF.md v14 part 3): the Gluon dK/dV kernel's orders and stages,
#                                           both fused-dQ splits, the tl fused dQ by TMA or element adds;
#                                           one round, four shapes, each row naming the paths that ran
#   bash kernels/gpu_run.sh OUT_DIR gm64    the Gluon dK/dV kernel with 64-row query blocks: its GPU tests beside the
#                                           spec on the shipped kernel (8 and 6 workers), then the shipped backward
#                                           against the Gluon dK/dV kernel with 32- and 64-row blocks (one round,
#                                           six shapes)
#   bash kernels/gpu_run.sh OUT_DIR gsplit  the dK/dV split by sequence length (Gluon for long sequences, tl for
#                                           the rest): its GPU tests, then the shipped backward against it at
#                                           1,024 / 2,048 / 4,096 keys and the Gluon kernel alone (one round, six
#                                           shapes, each row naming the paths that ran)
#   bash kernels/gpu_run.sh OUT_DIR gstats  the Gluon dK/dV kernel with LSE / delta brought by TMA with each block: its GPU
#                                           tests, then the shipped backward against its orders and stages (one round)
#   bash kernels/gpu_run.sh OUT_DIR v17     FA4, the shipped kernel and the same with the tl dK/dV kernel: two rounds
#   bash kernels/gpu_run.sh OUT_DIR v17spec the spec as shipped, then the multi-block tests (the default paths)
#   bash kernels/gpu_run.sh OUT_DIR v17m64  the v17 default against the overlapped order and 64-row blocks (one round)
#   bash kernels/gpu_run.sh OUT_DIR v18prof each kernel's GPU time in the v17 default backward (S1, S4b), then the fused
#                                           dQ variants against it (one round, six shapes)
#   bash kernels/gpu_run.sh OUT_DIR v18ncu  Nsight Compute (full set, raw) on the default backward's kernels for S1, then
#                                           the plain and overlapped block orders (three rounds)
#   bash kernels/gpu_run.sh OUT_DIR v18tma  the Gluon backward GPU tests with gradient tiles stored by TMA, then FA4, the
#                                           shipped kernel and the same with masked stores (two rounds)
#   bash kernels/gpu_run.sh OUT_DIR v18fwd  the forward's O stored by TMA too: the forward, store and multi-block GPU
#                                           tests, then TMA stores everywhere against masked stores (two rounds)
#   bash kernels/gpu_run.sh OUT_DIR v19     what v18fwd's tests could not finish (the Gluon forward and TMA store tests)
#                                           and the register-operand tests, then the spec with both opt-ins on
#   bash kernels/gpu_run.sh OUT_DIR v19table FA4, the v18 default and the opt-ins (O by TMA stores, register operands,
#                                           both), two rounds
#   bash kernels/gpu_run.sh OUT_DIR v19def  the spec with O by TMA stores as the default; register operands against
#                                           it (four rounds); S3's backward kernel times
#   bash kernels/gpu_run.sh OUT_DIR v19stages the Gluon dK/dV kernel's Q/dO stages (2, 3, 4) with K in registers
#   bash kernels/gpu_run.sh OUT_DIR v19final FA4, the v19 default and it with K / Q from shared memory, three rounds
#   bash kernels/gpu_run.sh OUT_DIR v20     delta from the Gluon dQ kernel: its GPU tests, torch.compile on the GPU,
#                                           the spec as shipped; the delta pass against it (three rounds); S1's
#                                           kernel times
#   bash kernels/gpu_run.sh OUT_DIR v20final FA4, the v20 default, v19's default and (once) flex_attention and
#                                           padded SDPA: three rounds, the complete table
#   bash kernels/gpu_run.sh OUT_DIR jitter  twelve timed rounds of S3 and S1 with each kernel's GPU time per round
#   bash kernels/gpu_run.sh OUT_DIR hostprof the host's time per call on S3, S1, S4a and the backward's cProfile
#   bash kernels/gpu_run.sh OUT_DIR hostfix  hostprof's times again, the default Gluon paths' GPU tests, S3 / S1 / S2 timed
#   bash kernels/gpu_run.sh OUT_DIR gfusedt the fused-dQ Gluon GPU tests alone
#   bash kernels/gpu_run.sh OUT_DIR dsdq    dQ read back from stored dS (BWD_DQ_MODE "ds"): its GPU tests beside the
#                                           multi-block ones, then the shipped backward against it with other dQ and
#                                           dK/dV tiles (one round, six shapes; rows whose dQ did not run "ds" listed)
#   bash kernels/gpu_run.sh OUT_DIR dsprof  the "ds" mode's GPU tests alone, then each kernel's GPU time (torch.profiler,
#                                           three calls) of the shipped backward and the "ds" one on S1 and S4b
#   bash kernels/gpu_run.sh OUT_DIR rounds  seven interleaved rounds of FA4, the shipped kernel and its tl and
#                                           Gluon forwards (plain calls) on all six shapes: ratios and spread
#   bash kernels/gpu_run.sh OUT_DIR sdpa    padded SDPA (and the shipped kernel) on S1 and S3
#   bash kernels/gpu_run.sh OUT_DIR sweep   forward configs on S3's parts; backward configs on S1 and S3
#   bash kernels/gpu_run.sh OUT_DIR sweepkv the tl dK/dV kernel's configs (kernels/sweep.py KV) on S4b, S1 and S3
#   bash kernels/gpu_run.sh OUT_DIR sweepkv8 the shipped one beside v16's additions (8 warps on 64 keys, 4 stages)
#   bash kernels/gpu_run.sh OUT_DIR split   FA4 and the planned forwards: shipped (split at 512 keys), tl,
#                                           Gluon, split at 1024 / 2048 (three rounds): the split point
#   bash kernels/gpu_run.sh OUT_DIR ncu     Nsight Compute on the tl and Gluon forwards for S3L and S4b
#                                           (kernels/profile.py)
#   bash kernels/gpu_run.sh OUT_DIR ncubwd  Nsight Compute on the backward kernels (tl dK/dV and Gluon dQ as
#                                           shipped; the fused Gluon dK/dV/dQ kernel) for S1 and S4b
# FA4 (flash-attn-4 with its CuTe DSL) must be importable for "bench"; FA4_PATH may point at an unpacked
# install.  Every step has its own time limit, so a slow step leaves the others' output.
set -u
STAGE=${2:?usage: gpu_run.sh OUT_DIR bench|tests|gtests|spec|tldqspec|tlkvspec|fusedspec|verify|gbwd|gfused|dqtma|retime|gm64|gsplit|gstats|gfusedt|v17|v17spec|v17m64|v18prof|v18ncu|v18tma|v18fwd|v19|v19table|v19def|v19stages|v19final|v20|v20final|jitter|hostprof|hostfix|rounds|split|sdpa|sweep|sweepkv|ncu|ncubwd}
FA4_PATH=${FA4_PATH:-/opt/fa4}
export PYTHONPATH=$FA4_PATH:$FA4_PATH/nvidia_cutlass_dsl/dsl_packages:.:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
OUT_DIR=${1:?}; mkdir -p "$OUT_DIR"
L=$OUT_DIR/log_$STAGE.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$L"

spec() {  # spec(time limit s, name, workers, extra env...): triton-jfa, profile ci, on the GPU
  local t=$1 name=$2 n=$3; shift 3
  env "$@" timeout $((t + 30)) python3 -m conformance.cli run --backend triton-jfa --profile ci --device cuda \
    --no-bench -q -n "$n" --timeout "$t" --time-limit "$t" --max-worker-restart 100 \
    --report-dir "$OUT_DIR/spec" --name "$name" >> "$L" 2>&1
  echo "spec $name rc=$?" | tee -a "$L"
  tail -5 "$OUT_DIR/spec/$name/summary.md" 2>/dev/null | tee -a "$L"
}

gpu_tests() {  # gpu_tests(time limit s, workers, -k expression, name): -rA names every outcome; the output
  # names each test as it finishes (-v), so a run cut off by the limit still says which tests finished
  timeout "$1" python3 -m pytest tests/test_kernels.py -v -rA -n "$2" -p no:cacheprovider -k "$3" \
    > "$OUT_DIR/pytest_$4.txt" 2>&1
  echo "pytest $4 rc=$?" | tee -a "$L"; tail -3 "$OUT_DIR/pytest_$4.txt"
}

run_bench() {  # run_bench(time limit s, tag, kernels.bench arguments...): rows to OUT_DIR/bench_<tag>.json/.md
  local t=$1 tag=$2; shift 2
  timeout "$t" python3 -m kernels.bench --out "$OUT_DIR" --tag "$tag" "$@" >> "$L" 2>&1
  echo "bench $tag rc=$?" | tee -a "$L"
  cat "$OUT_DIR/bench_$tag.md" 2>/dev/null
}

host_times() {  # the host's time per call of the shipped kernel on S3, S1 and S4a (kernels.profile --host)
  for shape in S3 S1 S4a; do
    timeout 100 python3 -m kernels.profile --shape $shape --impl triton-plan --host > "$OUT_DIR/host_$shape.txt" 2>&1
    echo "host $shape rc=$?" | tee -a "$L"; grep -E "per call" "$OUT_DIR/host_$shape.txt"
  done
}

kernel_times() {  # kernel_times(shape, impl): each kernel's GPU time over three profiled fwd+bwd calls
  local f="$OUT_DIR/kernel_times_${1}_$2.txt"
  timeout 60 python3 -m kernels.profile --shape "$1" --impl "$2" --iters 3 --backward --kernel-times > "$f" 2>&1
  echo "kernel times $1 $2 rc=$?" | tee -a "$L"
  grep -E "kernel|Self CUDA|Self CPU time total|profiled" "$f" | cut -c1-150 | head -12
}

ALL_SHAPES=S4b,S1,S1c,S2,S4a,S3
case $STAGE in
  bench)
    run_bench 500 table --rounds 2 --once flex,sdpa,triton --impls fa4,triton,triton-plan,triton-plan-tl-kv,flex,sdpa \
      --shapes $ALL_SHAPES ;;
  tests)
    gpu_tests 560 14 "gpu and not gluon" gpu ;;
  gtests)
    gpu_tests 560 14 "gpu and gluon and not gluon_fused" gpu_gluon ;;
  spec)
    spec 520 ci-default 14 ;;
  tldqspec)
    spec 520 ci-tl-dq 14 JFA_BWD_Q_KERNEL=triton ;;
  tlkvspec)
    spec 520 ci-tl-kv 14 JFA_BWD_KV_KERNEL=triton ;;
  dsspec)
    spec 520 ci-ds 14 JFA_BWD_DQ_MODE=ds ;;
  fusedspec)
    spec 520 "ci-fused-${JFA_GLUON_FUSED_DQ_SPLIT:-keys}" 14 JFA_BWD_DQ_MODE=atomic JFA_BWD_KV_KERNEL=gluon ;;
  verify)
    spec 530 ci-default 8 &
    gpu_tests 560 8 "gpu and not gluon" gpu
    wait ;;
  gbwd)
    gpu_tests 220 14 "gluon_backward or gluon_dq" gluon_bwd
    run_bench 300 gluon_bwd --shapes $ALL_SHAPES \
      --impls triton-plan,triton-plan-tl-dq,triton-plan-gluon-bwd,triton-plan-gluon-bwd-ovl-s2,triton-plan-gluon-bwd-tl-dq ;;
  gfused)
    gpu_tests 180 14 "gluon_fused" gluon_fused
    run_bench 370 gluon_fused --shapes $ALL_SHAPES \
      --impls triton-plan,triton-plan-gluon-fused-keys,triton-plan-gluon-fused-keys-b2,triton-plan-gluon-fused-dim,\
triton-plan-gluon-fused-dim-b2 ;;
  dqtma)
    gpu_tests 150 12 "atomic" atomic
    kvf=triton-plan-atomic-kvf32x64w4s3,triton-plan-atomic-kvf32x64w4s2,triton-plan-atomic-kvf64x64w4s2
    kvf=$kvf,triton-plan-atomic-kvf64x128w8s2,triton-plan-atomic-kvf32x128w8s2
    run_bench 420 dq_tma --shapes S4b,S1,S1c,S4a,S3 --impls triton-plan,triton-plan-atomic,triton-plan-atomic-element,$kvf ;;
  retime)
    gb=triton-plan-gluon-bwd
    run_bench 560 retime --shapes S4b,S1,S1c,S3 --impls triton-plan,$gb,$gb-s3,$gb-ovl-s2,$gb-ovl-s3,\
triton-plan-gluon-fused-keys,triton-plan-gluon-fused-keys-b2,triton-plan-gluon-fused-dim,\
triton-plan-gluon-fused-dim-s3,\
triton-plan-atomic,triton-plan-atomic-element
    python3 -c "import json, sys
for r in json.load(open(sys.argv[1])): print(r['shape'], r['impl'], '|', r.get('bwd_path', r.get('error', '')))" \
      "$OUT_DIR/bench_retime.json" ;;
  gm64)
    spec 250 ci-default 6 &
    gpu_tests 240 8 "gluon_backward or gluon_fused_dq_refuses" gluon_bwd_m64
    wait
    gb=triton-plan-gluon-bwd
    run_bench 260 gluon_m64 --shapes $ALL_SHAPES --impls triton-plan,$gb,$gb-ovl-s3,$gb-m64,$gb-m64-s3,$gb-m64-ovl-s2 ;;
  gsplit)
    gpu_tests 200 14 "gluon_split or runs_the_switches" gluon_split
    run_bench 330 bwd_split --shapes $ALL_SHAPES --impls triton-plan,triton-plan-gluon-bwd-ovl-s3,\
triton-plan-bwd-split1024,triton-plan-bwd-split2048,triton-plan-bwd-split4096
    python3 -c "import json, sys
for r in json.load(open(sys.argv[1])): print(r['shape'], r['impl'], '|', r.get('bwd_path', r.get('error', '')))" \
      "$OUT_DIR/bench_bwd_split.json" ;;
  gstats)
    gpu_tests 240 14 "gpu and (gluon_backward or gluon_split or runs_the_switches or gluon_fused_dq_keeps)" gluon_stats
    gb=triton-plan-gluon-bwd
    run_bench 300 gluon_stats --shapes $ALL_SHAPES --impls triton-plan,$gb,$gb-s3,$gb-ovl-s2,$gb-ovl-s3 ;;
  v17)
    run_bench 330 v17_table --rounds 2 --impls fa4,triton-plan,triton-plan-tl-kv --shapes $ALL_SHAPES ;;
  v17spec)
    spec 250 ci-default 14
    gpu_tests 230 14 "gpu_multiblock or broadcast_multiblock or block_shapes or gpu_ds_dq or gpu_atomic" default_paths ;;
  v17m64)
    gb=triton-plan-gluon-bwd
    run_bench 280 v17_m64 --shapes $ALL_SHAPES --impls triton-plan,$gb-ovl-s3,$gb-m64,$gb-m64-ovl-s2 ;;
  v18prof)
    # where the v17 default backward's time goes, and dQ fused into the Gluon dK/dV kernel re-timed now that
    # its statistics come by TMA (v15's timings predate that)
    kernel_times S1 triton-plan
    kernel_times S4b triton-plan
    run_bench 330 fused_v18 --shapes $ALL_SHAPES --impls triton-plan,triton-plan-gluon-fused-dim,\
triton-plan-gluon-fused-dim-s2,triton-plan-gluon-fused-keys,triton-plan-atomic ;;
  v18ncu)
    # the v17 default backward's two kernels on S1 under Nsight Compute (full set, every metric printed raw),
    # then the plain and overlapped block orders of the Gluon dK/dV kernel side by side (three rounds)
    NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
    f=$OUT_DIR/ncu_full_S1_triton-plan.txt
    timeout 200 "$NCU" --profile-from-start off --kernel-name regex:"dq_kernel|dkdv_kernel" --launch-count 2 \
      --set full --page raw python3 -m kernels.profile --shape S1 --impl triton-plan --iters 1 --backward > "$f" 2>&1
    echo "ncu full S1 rc=$?" | tee -a "$L"
    grep -E "^  [_a-z]+kernel|gpu__time_duration.sum|sm__throughput.avg.pct|pipe_tensor.*pct_of_peak_sustained_active |mem_shared.*pct" "$f" | head -20
    gb=triton-plan-gluon-bwd
    run_bench 330 order_v18 --rounds 3 --shapes $ALL_SHAPES --impls $gb-ovl-s3,triton-plan ;;
  v18tma)
    # output tiles by TMA stores (the v18 default): the Gluon GPU tests, then FA4, the default and the same with
    # masked stores (v17), two rounds
    gpu_tests 240 14 "gpu and (gluon_backward or gluon_dq or tma_stores or gluon_split or runs_the_switches \
or gluon_fused_dq_keeps)" gluon_tma_stores
    run_bench 300 v18_table --rounds 2 --impls fa4,triton-plan,triton-plan-masked-stores --shapes $ALL_SHAPES ;;
  v18fwd)
    # O by TMA stores too (the tree that ran it had them on by default; they are opt-in now, the timed row is
    # triton-plan-tma-fwd): the Gluon forward and store tests and the multi-block tests (too many for the limit:
    # the fp32 ones held most workers), then TMA stores everywhere against masked stores (two rounds, no FA4)
    gpu_tests 230 14 "gpu and (gluon_forward or tma_stores or multiblock or rows_past or keeps_sequences_apart or block_shapes)" \
      fwd_tma_stores
    run_bench 200 v18_fwd --rounds 2 --impls triton-plan-tma-fwd,triton-plan-masked-stores --shapes $ALL_SHAPES ;;
  v19)
    # the opt-ins written after v18's device time: the Gluon forward, TMA store and register-operand GPU tests,
    # then the spec with both on (the forward's O by TMA stores, K / Q as register operands)
    gpu_tests 200 14 "gpu and (gluon_forward or tma_stores or register_operands or gluon_rows_past \
or gluon_backward_runs)" v19_opt_ins
    spec 250 ci-v19-opt-ins 14 JFA_GLUON_TMA_STORE_KERNELS=forward,backward JFA_GLUON_BWD_REG_OPERAND=1 ;;
  v19table)
    # FA4 beside the v18 default and the opt-ins, two rounds (FA4 installed first)
    # (its rows were named triton-plan, triton-plan-tma-fwd, triton-plan-reg-operand (TMA stores in the backward
    # only) and triton-plan-tma-fwd-reg-operand when it ran; the last is today's default)
    run_bench 420 v19_table --rounds 2 --impls fa4,triton-plan-v18,triton-plan-tma-fwd,triton-plan-reg-operand \
      --shapes $ALL_SHAPES ;;
  v19def)
    # O by TMA stores made the default: the spec as shipped; then the register operands against it, bwd only in
    # effect (four rounds, no FA4); then where S3's backward time goes (it trails FA4 most among S1-S3)
    spec 250 ci-v19-default 14
    run_bench 220 v19_reg_operand --rounds 4 --impls triton-plan-tma-fwd,triton-plan-reg-operand --shapes $ALL_SHAPES
    kernel_times S3 triton-plan ;;
  v19stages)
    # Q/dO stages of the Gluon dK/dV kernel now that K is a register operand (three rounds, no FA4)
    gb=triton-plan-gluon-bwd
    run_bench 240 v19_stages --rounds 3 --impls triton-plan,$gb-s2,$gb-s4 --shapes $ALL_SHAPES ;;
  v19final)
    # FA4 beside the v19 default and the same with K / Q from shared memory, three rounds (FA4 installed first)
    run_bench 400 v19_final --rounds 3 --impls fa4,triton-plan,triton-plan-tma-fwd --shapes $ALL_SHAPES ;;
  v20)
    # delta from the Gluon dQ kernel (jfa.GLUON_DQ_DELTA, default on in this tree): its GPU tests, the default
    # Gluon paths' and torch.compile's on the GPU, beside the spec as shipped (7 workers each); then the
    # delta pass against the dQ kernel's delta (three rounds, no FA4) and S1's kernel times
    gpu_tests 260 7 "(gpu and (dq_kernel_computes_delta or gluon_dq or register_operands or tma_stores \
or gluon_backward_runs or gluon_split or keeps_sequences_apart)) or torch_compile or opcheck" v20_dq_delta &
    spec 230 ci-v20 7
    wait
    run_bench 220 v20_dq_delta --rounds 3 --impls triton-plan-reg-operand,triton-plan-dq-delta --shapes $ALL_SHAPES
    kernel_times S1 triton-plan ;;
  v20final)
    # FA4 beside the v20 default and v19's (delta by its own pass), three rounds, and flex_attention and padded
    # SDPA once: every implementation the table names, in one run (FA4 installed first)
    run_bench 540 v20_final --rounds 3 --once flex,sdpa --impls fa4,triton-plan,triton-plan-reg-operand,flex,sdpa \
      --shapes $ALL_SHAPES ;;
  jitter)
    # why the shipped kernel's S3 times jump by up to 40% between bench rounds (FA4's stay within 1%): twelve
    # rounds of fresh set-up, do_bench and per-kernel GPU times; S1 beside it
    for shape in S3 S1; do
      timeout 150 python3 -m kernels.profile --shape $shape --impl triton-plan --backward --rounds 12 --iters 3 \
        > "$OUT_DIR/jitter_$shape.txt" 2>&1
      echo "jitter $shape rc=$?" | tee -a "$L"; grep -v Warning "$OUT_DIR/jitter_$shape.txt" | cut -c1-200 | tail -16
    done ;;
  hostprof)
    # the host's time per forward and backward call, and where the backward's goes (cProfile)
    host_times
    grep -v Warning "$OUT_DIR/host_S3.txt" | cut -c1-160 | head -45 ;;
  hostfix)
    # the Gluon layouts cached and the unused fused-dQ descriptor made once: the host's time again, the GPU
    # tests of the default Gluon paths, and S3 / S1 timed in three rounds (no FA4)
    host_times
    gpu_tests 120 14 "gpu and (gluon_backward_runs or register_operands or tma_stores or gluon_forward)" host_fix
    run_bench 100 host_fix --rounds 3 --impls triton-plan --shapes S3,S1,S2 ;;
  gfusedt)
    gpu_tests 200 14 "gpu and gluon_fused" gluon_fused ;;
  dsdq)
    gpu_tests 200 14 "ds_dq or (gpu and (multiblock or block_shapes)) or runs_the_switches" ds_dq
    ds=triton-plan-ds
    run_bench 360 ds_dq --shapes $ALL_SHAPES --impls triton-plan,$ds,$ds-q64x64w4s3,$ds-q128x64w4s3,$ds-q128x128w8s2,\
$ds-q64x128w4s3,$ds-q128x32w4s4,$ds-kv32x64w4s2,$ds-kv64x128w8s2,$ds-kv32x128w8s3
    python3 -c "import json, sys
for r in json.load(open(sys.argv[1])): print(r['shape'], r['impl'], '|', r.get('bwd_path', r.get('error', '')))" \
      "$OUT_DIR/bench_ds_dq.json" | grep -v "dQ ds$" ;;
  dsprof)
    gpu_tests 150 14 "ds_dq or (gpu_multiblock and ds) or (broadcast_multiblock and ds) or (block_shapes and ds)" ds_dq2
    for shape in S1 S4b; do
      for impl in triton-plan triton-plan-ds-q128x64w4s3; do kernel_times $shape $impl; done
    done ;;
  rounds)
    run_bench 280 v9_rounds --rounds 7 --impls fa4,triton,triton-tl,triton-gluon --fwd-only triton-tl,triton-gluon \
      --shapes $ALL_SHAPES ;;
  sdpa)
    run_bench 90 v8_sdpa --impls triton,sdpa --shapes S1,S3 ;;
  sweep)
    timeout 120 python3 -m kernels.sweep --out "$OUT_DIR/sweep_fwd" --shapes S3L,S3R --kinds fwd \
      --fwd "128,32,4,4;128,64,8,3;128,64,4,3" >> "$L" 2>&1
    echo "sweep fwd rc=$?" | tee -a "$L"
    timeout 280 python3 -m kernels.sweep --out "$OUT_DIR/sweep_bwd" --shapes S1,S3 --kinds kv,q >> "$L" 2>&1
    echo "sweep bwd rc=$?" | tee -a "$L"
    grep -E "^\|" "$L" | tail -40 ;;
  sweepkv)
    timeout 500 python3 -m kernels.sweep --out "$OUT_DIR/sweep_kv" --shapes S4b,S1,S3 --kinds kv >> "$L" 2>&1
    echo "sweep kv rc=$?" | tee -a "$L"
    grep -E "^\|" "$L" | tail -40 ;;
  sweepkv8)
    timeout 200 python3 -m kernels.sweep --out "$OUT_DIR/sweep_kv8" --shapes S4b,S1,S3 --kinds kv \
      --kv "32,64,4,3;32,64,8,3;64,64,8,3;32,64,8,2;32,64,4,4" >> "$L" 2>&1
    echo "sweep kv rc=$?" | tee -a "$L"
    grep -E "^\|" "$L" | tail -40 ;;
  split)
    run_bench 330 v9_split --rounds 3 \
      --impls fa4,triton-plan,triton-tl-plan,triton-gluon-plan,triton-split1024-plan,triton-split2048-plan \
      --fwd-only triton-plan,triton-tl-plan,triton-gluon-plan,triton-split1024-plan,triton-split2048-plan \
      --shapes $ALL_SHAPES ;;
  ncu)
    NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
    for shape in S4b S3L; do
      for impl in triton triton-gluon; do
        f=$OUT_DIR/ncu_${shape}_$impl.txt
        timeout 70 "$NCU" --profile-from-start off --kernel-name regex:fwd --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          --section ComputeWorkloadAnalysis --section SchedulerStats \
          python3 -m kernels.profile --shape "$shape" --impl $impl --iters 1 > "$f" 2>&1
        echo "ncu $shape $impl rc=$?" | tee -a "$L"
        grep -E "Duration|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Block Limit (Reg|Shared)|Issue Slots Busy|Eligible Warps|No Eligible|Executed Ipc A" \
          "$f" | head -14
      done
    done ;;
  ncubwd)
    NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
    for shape in S4b S1; do
      for impl in triton-plan triton-plan-gluon-fused-keys; do
        f=$OUT_DIR/ncu_bwd_${shape}_$impl.txt
        timeout 140 "$NCU" --profile-from-start off --kernel-name regex:"_bwd_kv_kernel|dq_kernel|dkdv_kernel" \
          --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          --section ComputeWorkloadAnalysis --section SchedulerStats --section MemoryWorkloadAnalysis \
          python3 -m kernels.profile --shape "$shape" --impl $impl --iters 1 --backward > "$f" 2>&1
        echo "ncu backward $shape $impl rc=$?" | tee -a "$L"
        grep -E "^  [_a-z]+kernel|profiled|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall" \
          "$f" | head -24
      done
    done ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
