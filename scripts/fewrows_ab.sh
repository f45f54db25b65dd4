#!/usr/bin/env bash
# The few-row decode tile's A/B on the GPU host, in one bounded call (docs/pending/README.md):
# carry ["build-ab-pack5", "build-ab-pack6", "build-probe"] (built on the dev machine by
# scripts/ab_local.sh and nvcc; ignored paths) and run
#   BUDGET=450 bash scripts/fewrows_ab.sh
# In order, each step only while BUDGET seconds are not spent: the four probe builds
# (tools/probes/p_decode_few_rows.cu, 16-bit and E4M3, 32 and 16 rows); e4's test_gpu_kvcache_fp8
# and test_gpu_kvcache against its library; interleaved passes of base, e4 and fr2 through
# `python -m warpattn.bench --decode --quick --fp8 --clean-l2`; fr2's test_gpu_kvcache; single
# passes of the older knobs (pf3, lc3, q1nc, fr). Then scripts/ab_decode_summary.py's medians and
# the E4M3 accuracy lines of base and e4. Logs in $OUT.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BUDGET=${BUDGET:-450}
R=$PWD
for f in build-ab-pack5/*.tar.xz build-ab-pack6/*.tar.xz; do tar xJf "$f" || exit 1; done
for d in build-ab-pkgs/pkg-*/warpattn; do cp python/warpattn/*.py "$d/"; done
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
left() { echo $((BUDGET - SECONDS)); }
for p in p_few_rows p_few_rows16 p_few_rows_e4m3 p_few_rows_e4m316; do
  echo "== $p"; timeout 25 "build-probe/$p" 2>&1 | tail -7
done
# test VARIANT BINARY LIMIT
run_test() {
  [ "$(left)" -gt $(($3 + 60)) ] || { echo "$1 $2: skipped (budget)"; return; }
  LD_LIBRARY_PATH=$R/build-ab-pkgs/pkg-$1/warpattn:/usr/local/cuda/lib64 timeout "$3" \
    "$R/build-ab-pkgs/tests-$1/$2" > "$OUT/$1-$2.log" 2>&1
  echo "$1 $2 rc=$? $(grep -c FAIL "$OUT/$1-$2.log") FAIL lines; $(tail -1 "$OUT/$1-$2.log") (${SECONDS} s)"
}
# bench VARIANT PASS [flags]
run_bench() {
  (cd /tmp && PYTHONPATH=$R/build-ab-pkgs/pkg-$1 timeout 70 python3 -m warpattn.bench --decode --quick --passes 1 \
     --clean-l2 --host-calls 200 "${@:3}" > "$OUT/bench-$1-$2.log" 2>&1)
  echo "bench $1 pass $2 rc=$? (${SECONDS} s)"
}
run_test e4 test_gpu_kvcache_fp8 90
run_test e4 test_gpu_kvcache 150
for pass in 1 2 3; do
  [ "$(left)" -gt 120 ] || break
  for v in base e4 fr2; do run_bench "$v" "$pass" --fp8; done
  [ "$pass" = 1 ] && run_test fr2 test_gpu_kvcache 150
done
for v in pf3 lc3 q1nc fr; do
  [ "$(left)" -gt 60 ] || break
  run_bench "$v" 1
done
python3 scripts/ab_decode_summary.py "$OUT"
grep -h "fp8 accuracy S=4096" "$OUT/bench-base-1.log" "$OUT/bench-e4-1.log" 2>/dev/null | head -12
