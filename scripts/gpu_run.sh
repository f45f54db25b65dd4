#!/usr/bin/env bash
# One call on the GPU host: build with every core, then the stages named in $STAGES (default
# all), each under its own time limit, logs copied to $OUT (or ./gpu-out).
#   STAGES="primitives forward cli bench" bash scripts/gpu_run.sh
# forward takes an optional filter in $FORWARD_FILTER (a test-name substring).
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"ctest cli bench"}  # also: primitives, forward, fp8, devices, sanitize, fa3, python, bench_backward, ncu, ncu_fp8, ncu_backward
# python: PY_PARTS (default gpu cpu training varlen kvcache kvcache_fp8 transformers jax_ffi; PY_PARALLEL=1 runs them side by side; PYTEST_ARGS, default --durations=25: the slowest tests listed), VARLEN_BENCH=1 for the varlen mixes,
#   DECODE_BENCH=1 for the KV-cache benchmark (python -m warpattn.bench --decode; DECODE_BENCH_ARGS, default --quick),
#   JAX_BENCH=1 for warpattn under jax.jit beside cuDNN (python -m warpattn.bench_jax; JAX_BENCH_ARGS),
#   MODEL_OPTIONS_BENCH=1 for scripts/bench_model_options.py (MODEL_OPTIONS_ARGS, e.g. "--n 16384 131072"), HOST_COST=1 for scripts/host_cost.py,
#   STRESS=1 for scripts/stress_kvcache.py (STRESS_ARGS), D512_BENCH=1 for scripts/bench_headdim512.py,
#   HEAD_DIMS_BENCH=1 for scripts/bench_head_dims.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
# The first half of the README's test command: scripts/build.sh (every core).
if ! bash scripts/build.sh > "$OUT/build.log" 2>&1; then
  grep -E "error|FAILED|ERROR" "$OUT/build.log" | head -30
  exit 1
fi
grep -E "C75[0-9][0-9]" "$OUT/build.log" | head -5
echo "build ok"
stage() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# The details page of /tmp/$1.ncu-rep as text, per-instruction stall samples of the first report
# of the run, and a summary on the console.
first=1
ncu_report() {
  ncu -i "/tmp/$1.ncu-rep" --page details --print-details all > "$OUT/$1.txt" 2>&1
  if [ $first = 1 ]; then
    ncu -i "/tmp/$1.ncu-rep" --page source --print-source sass --csv > "$OUT/$1-sass.csv" 2>&1
    first=0
  fi
  grep -E "Duration|Tensor|Issue Slots Busy|No Eligible|Compute \(SM\) Throughput" "$OUT/$1.txt" | head -12
}
if stage ctest; then
  # The second half of the README's test command: every CTest suite, CTEST_REPEAT times (fresh
  # random data each time). This is how a kernel change is verified. CTEST_ARGS: e.g. -j3 to run
  # suites side by side (correctness only: never for timings).
  for i in $(seq "${CTEST_REPEAT:-1}"); do
    timeout -k 5 "${CTEST_TIMEOUT:-900}" ctest --test-dir build --output-on-failure ${CTEST_ARGS:-} > "$OUT/ctest-$i.log" 2>&1
    echo "ctest pass $i rc=$?: $(grep -E "tests passed|tests failed" "$OUT/ctest-$i.log")"
    grep -E "^ +[0-9]+/[0-9]+ Test|FAIL|CHECK failed|SKIPPED \]" "$OUT/ctest-$i.log" | head -${CTEST_LINES:-24}
  done
fi
if stage devices; then
  timeout -k 5 300 ./build/test_gpu_devices > "$OUT/devices.log" 2>&1
  echo "devices rc=$?: $(tail -1 "$OUT/devices.log")"
  grep -E "FAIL|failed|SKIP" "$OUT/devices.log" | head -20
fi
if stage primitives; then
  timeout -k 5 120 ./build/test_gpu_primitives > "$OUT/primitives.log" 2>&1
  echo "primitives rc=$?: $(tail -1 "$OUT/primitives.log")"
  grep -E "FAILED|failed" "$OUT/primitives.log" | head -20
fi
if stage forward; then
  timeout -k 5 ${FORWARD_TIMEOUT:-400} ./build/test_gpu_forward ${FORWARD_FILTER:-} > "$OUT/forward.log" 2>&1
  echo "forward rc=$?: $(tail -1 "$OUT/forward.log")"
  grep -E "FAIL|failed|64K" "$OUT/forward.log" | head -${FORWARD_LINES:-40}
fi
if stage fp8; then
  timeout -k 5 ${FP8_TIMEOUT:-300} ./build/test_gpu_fp8 ${FP8_FILTER:-} > "$OUT/fp8.log" 2>&1
  echo "fp8 rc=$?: $(tail -1 "$OUT/fp8.log")"
  grep -E "FAIL|failed|RMSE|ratio|per tensor /|64K|descales NaN|rel L2 [0-9.e-]+[^0]" "$OUT/fp8.log" | head -${FP8_LINES:-40}
fi
if stage sanitize; then
  # forward_is_deterministic runs every BF16 main-loop shape (tall tiles at d = 64, the
  # rows-then-convert softmax at d = 128 and 256); fp8_forward_shapes the FP8 ones at d = 64
  # (tall from 2048 rows) and 128.
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    timeout -k 5 ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 9 \
      ./build/test_gpu_forward ${SANITIZE_FILTER:-forward_is_deterministic} > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$?: $(grep -E "ERROR SUMMARY|passed" "$OUT/$tool.log" | tr '\n' ' ')"
    timeout -k 5 ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 9 \
      ./build/test_gpu_fp8 ${SANITIZE_FP8_FILTER:-fp8_forward_shapes} > "$OUT/$tool-fp8.log" 2>&1
    echo "$tool fp8 rc=$?: $(grep -E "ERROR SUMMARY|passed" "$OUT/$tool-fp8.log" | tr '\n' ' ')"
    # The backward (d = 128 causal, small): its ring, dS buffers, dQ pieces and writer warps.
    timeout -k 5 ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 9 \
      ./build/test_gpu_backward ${SANITIZE_BWD_FILTER:-backward_custom_scale} > "$OUT/$tool-backward.log" 2>&1
    echo "$tool backward rc=$?: $(grep -E "ERROR SUMMARY|passed" "$OUT/$tool-backward.log" | tr '\n' ' ')"
  done
fi
if stage cli; then
  timeout -k 5 180 ./build/warpattn --json "$OUT/cli.json" > "$OUT/cli.log" 2>&1
  echo "cli rc=$?"; tail -12 "$OUT/cli.log"
fi
if stage bench; then
  PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 python/warpattn/bench.py --lib build/libwarpattn.so \
    --out "$OUT" ${BENCH_ARGS:---quick} > "$OUT/bench.log" 2> "$OUT/bench.err"
  echo "bench rc=$?"; tail -5 "$OUT/bench.err"; tail -40 "$OUT/bench.log"
fi
if stage bench_backward; then
  # The backward and forward + backward beside cuDNN and FA2, the GEMM ceiling, table and plot
  # (interleaved passes; the anchors' sweep by default, BWD_BENCH_ARGS e.g. "--d 128 --n 16384").
  PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 python/warpattn/bench_backward.py \
    --lib build/libwarpattn.so --out "$OUT" --json "$OUT/bench-backward.json" ${BWD_BENCH_ARGS:---deterministic --passes 3} \
    > "$OUT/bench-backward.log" 2>&1
  echo "bench_backward rc=$?"; tail -20 "$OUT/bench-backward.log"
fi
if stage fa3; then
  # FlashAttention-3 for issue 19's side-by-side (carry .fa3, made by ../shared/fa3/prepare.sh):
  # the BF16 forward with windows and softcap (scripts/fa3_profiles.sh); the python stage's
  # MODEL_OPTIONS_BENCH then times it beside warpattn.
  if bash scripts/fa3_profiles.sh && FA3_PROFILE=model timeout -k 5 ${FA3_TIMEOUT:-400} bash .fa3/build.sh \
      > "$OUT/fa3-build.log" 2>&1; then
    echo "fa3 build ok: $(tail -1 "$OUT/fa3-build.log")"
  else
    echo "fa3 build failed:"; tail -5 "$OUT/fa3-build.log"
  fi
fi
if stage python; then
  # The package as a user installs it (no network there: no build isolation), its tests, and
  # the benchmark through the package (quick unless PY_BENCH_ARGS says otherwise).
  if timeout -k 5 300 python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/pip.log" 2>&1; then
    # Wheels carried in .wheels/ (no network there): the cuDNN frontend for bench_model_options.
    if ls .wheels/*.whl > /dev/null 2>&1; then
      python3 -m pip install -q --no-deps --no-index .wheels/*.whl >> "$OUT/pip.log" 2>&1 || echo "wheels: install failed"
    fi
    # The XLA FFI handlers are built only where the build found jax (warpattn.jax_ffi).
    (cd /tmp && python3 -c "import warpattn, jax; from warpattn import jax_ffi; print('JAX FFI handlers built:', jax_ffi.available(), 'jax', jax.__version__)")
    # PY_PARALLEL=1: the parts side by side on the one GPU (correctness only, as ctest -j3; JAX
    # then takes a quarter of the memory first instead of 75%: with its preallocation off, run 175,
    # its pool grew through cudaMalloc during the calls, which synchronises, and the jitted
    # no-host-sync test failed), reported in order.
    if [ -n "${PY_PARALLEL:-}" ]; then
      for part in ${PY_PARTS:-gpu cpu training varlen kvcache kvcache_fp8 transformers jax_ffi}; do
        (cd /tmp && XLA_PYTHON_CLIENT_MEM_FRACTION=0.25 PYTHONUNBUFFERED=1 timeout -k 5 ${PYTEST_TIMEOUT:-400} \
          python3 -X faulthandler -m pytest -q -rs ${PYTEST_ARGS---durations=25} "$OLDPWD/tests/python/test_$part.py" > "$OUT/pytest-$part.log" 2>&1;
         echo $? > "$OUT/pytest-$part.rc") &
      done
      wait
    fi
    for part in ${PY_PARTS:-gpu cpu training varlen kvcache kvcache_fp8 transformers jax_ffi}; do  # separately: a crash in one part still leaves the others' results
      if [ -n "${PY_PARALLEL:-}" ]; then
        rc=$(cat "$OUT/pytest-$part.rc"); rm -f "$OUT/pytest-$part.rc"
      else
        (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${PYTEST_TIMEOUT:-400} python3 -X faulthandler -m pytest -q -rs ${PYTEST_ARGS---durations=25} \
          "$OLDPWD/tests/python/test_$part.py" > "$OUT/pytest-$part.log" 2>&1)
        rc=$?
      fi
      echo "pytest $part rc=$rc: $(tail -1 "$OUT/pytest-$part.log")"
      if [ $rc -ge 128 ] && [ ! -f "$OUT/crash.log" ]; then  # a crash: where, by cuda-gdb (no gdb there)
        (cd /tmp && timeout -k 5 120 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" \
          --args python3 "$OLDPWD/scripts/py_error_repro.py" > "$OUT/crash.log" 2>&1)
        grep -E "^#|signal|no crash" "$OUT/crash.log" | head -20
      fi
      grep -E "FAILED|Error|SKIPPED|Fatal|line [0-9]+ in" "$OUT/pytest-$part.log" | head -12
    done
    if [ -n "${STRESS:-}" ]; then  # every KV-cache variant repeated, bitwise against its first call
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${STRESS_TIMEOUT:-300} python3 "$OLDPWD/scripts/stress_kvcache.py" \
        ${STRESS_ARGS:-} 2>&1 | tee "$OUT/stress.log")
    fi
    if [ -z "${SKIP_PY_BENCH:-}" ]; then
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 -m warpattn.bench --out "$OUT" \
        ${PY_BENCH_ARGS:---quick} > "$OUT/pybench.log" 2> "$OUT/pybench.err")
      echo "python bench rc=$?"; tail -4 "$OUT/pybench.err"
    fi
    if [ -n "${VARLEN_BENCH:-}" ]; then  # issue 15's mixes beside FA2 (nested jagged) and cuDNN (padded)
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 -m warpattn.bench --varlen --out "$OUT/bench-varlen.json" \
        ${VARLEN_BENCH_ARGS:-} > "$OUT/varlen-bench.log" 2> "$OUT/varlen-bench.err")
      echo "varlen bench rc=$?"; tail -4 "$OUT/varlen-bench.err"; tail -40 "$OUT/varlen-bench.log"
    fi
    if [ -n "${DECODE_BENCH:-}" ]; then  # issue 16's decode points beside cuDNN and FA2 through SDPA
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 -m warpattn.bench --decode \
        --out "$OUT/bench-decode.json" ${DECODE_BENCH_ARGS:---quick} > "$OUT/decode-bench.log" 2>&1)
      echo "decode bench rc=$?"; tail -12 "$OUT/decode-bench.log"
    fi
    if [ -n "${MODEL_OPTIONS_BENCH:-}" ]; then  # issue 19's window / softcap / sinks beside warpattn's causal forward
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 "$OLDPWD/scripts/bench_model_options.py" \
        ${MODEL_OPTIONS_ARGS:-} --json "$OUT/model-options.json" > "$OUT/model-options.log" 2>&1)
      echo "model options bench rc=$?"; cat "$OUT/model-options.log"
    fi
    if [ -n "${D512_BENCH:-}" ]; then  # issue 19's head dim 512 beside warpattn's d = 256 at the same FLOPs
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 "$OLDPWD/scripts/bench_headdim512.py" \
        --json "$OUT/bench-d512.json" 2>&1 | tee "$OUT/bench-d512.log")
    fi
    if [ -n "${HEAD_DIMS_BENCH:-}" ]; then  # issue 19's d = 96 and MLA 192/128 beside cuDNN and FA2
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 "$OLDPWD/scripts/bench_head_dims.py" \
        --json "$OUT/bench-head-dims.json" 2>&1 | tee "$OUT/bench-head-dims.log")
    fi
    if [ -n "${HOST_COST:-}" ]; then
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 120 python3 "$OLDPWD/scripts/host_cost.py" 2>&1 | tee "$OUT/host_cost.log")
    fi
    if [ -n "${FP8_BENCH:-}" ]; then
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${BENCH_TIMEOUT:-300} python3 -m warpattn.bench_fp8 --out "$OUT" \
        ${FP8_BENCH_ARGS:-} > "$OUT/fp8bench.log" 2> "$OUT/fp8bench.err")
      echo "fp8 bench rc=$?"; tail -3 "$OUT/fp8bench.err"; cat "$OUT/fp8bench.log"
    fi
    if [ -n "${JAX_BENCH:-}" ]; then  # warpattn.jax_ffi in jax.jit beside jax.nn.dot_product_attention's cuDNN
      (cd /tmp && PYTHONUNBUFFERED=1 timeout -k 5 ${JAX_BENCH_TIMEOUT:-600} python3 -m warpattn.bench_jax \
        --out "$OUT/bench-jax.json" ${JAX_BENCH_ARGS:-} > "$OUT/jax-bench.log" 2> "$OUT/jax-bench.err")
      echo "jax bench rc=$?"; tail -3 "$OUT/jax-bench.err"; cat "$OUT/jax-bench.log"
    fi
  else
    echo "pip install failed"; tail -20 "$OUT/pip.log"
  fi
fi
if stage ncu; then
  # Nsight Compute on one launch per shape in $NCU_SHAPES ("d:N:causal" ...; 16k tokens, H*d = 2048
  # as in the sweep), reported by ncu_report. NCU_CLI_ARGS: more flags of the CLI (--softcap 30, --window-left 255).
  for shape in ${NCU_SHAPES:-128:512:0 64:1024:0}; do
    IFS=: read -r d n c <<< "$shape"
    name="ncu-d$d-n$n-c$c"
    timeout -k 5 ${NCU_TIMEOUT:-200} ncu --clock-control none --kernel-name regex:attention_forward \
      --launch-skip 2 --launch-count 1 --set full --import-source no -f -o "/tmp/$name" \
      ./build/warpattn --batch $((16384 / n)) --heads $((2048 / d)) --seqlen-q "$n" --head-dim "$d" \
      --dtype bf16 --causal "$c" --iters 1 --warmup 2 --check-rows 1 ${NCU_CLI_ARGS:-} > "/tmp/$name.run.log" 2>&1
    echo "ncu $shape rc=$?"
    ncu_report "$name"
  done
fi
if stage ncu_backward; then
  # Nsight Compute on the backward's main kernel, one launch per shape in $NCU_BWD_SHAPES
  # ("d:N:causal"; 16k tokens, H*d = 2048, as bench_backward), the second of its three untimed
  # calls (bench_backward --warpattn-only), the full section set (tensor pipe, shared memory and
  # L2 throughput with the dQ reductions, warp stalls), reported by ncu_report.
  for shape in ${NCU_BWD_SHAPES:-128:16384:0}; do
    IFS=: read -r d n c <<< "$shape"
    name="ncu-bwd-d$d-n$n-c$c"
    timeout -k 5 ${NCU_TIMEOUT:-300} ncu --clock-control none --kernel-name regex:attention_backward_kernel \
      --launch-skip 1 --launch-count 1 --set full --import-source yes -f -o "/tmp/$name" \
      python3 python/warpattn/bench_backward.py --lib build/libwarpattn.so --d "$d" --n "$n" --causal "$c" \
      --warpattn-only > "/tmp/$name.run.log" 2>&1
    echo "$name rc=$?"; tail -3 "/tmp/$name.run.log"
    ncu_report "$name"
  done
fi
if stage ncu_fp8; then
  if ! (cd /tmp && python3 -c "import warpattn._warpattn") 2>/dev/null; then
    timeout -k 5 300 python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
  fi
  # Nsight Compute on the FP8 forward through the installed package (the python stage installs
  # it): one launch per shape in $NCU_FP8_SHAPES ("d:N:causal"), the bench's first kernels
  # named attention_forward are the FP8 ones (the BF16 comparison runs after them).
  for shape in ${NCU_FP8_SHAPES:-256:16384:0}; do
    IFS=: read -r d n c <<< "$shape"
    name="ncu-fp8-d$d-n$n-c$c"
    (cd /tmp && timeout -k 5 ${NCU_TIMEOUT:-200} ncu --clock-control none --kernel-name regex:attention_forward \
      --launch-skip 3 --launch-count 1 --set full --import-source no -f -o "/tmp/$name" \
      python3 -m warpattn.bench_fp8 --out /tmp/ncu-bench --points d=$d N=$n causal=$c \
      --warmup-ms 1 --rep-ms 1 > "/tmp/$name.run.log" 2>&1)
    echo "ncu fp8 $shape rc=$?"
    ncu_report "$name"
  done
fi
# Only 8 files come back from $OUT: everything but the console log goes into one archive.
tar czf /tmp/gpu-logs.tgz --exclude=run.log -C "$OUT" . && find "$OUT" -mindepth 1 ! -name run.log -delete &&
  mv /tmp/gpu-logs.tgz "$OUT/"
