#!/usr/bin/env bash
# One GPU call: warpattn's backward beside FlashAttention-3's (built in the same call), cuDNN's
# and FA2's on the same tensors, with each library's kernels (--breakdown), then Nsight Compute
# on both main kernels at one shape. Needs .fa3 (../shared/fa3/prepare.sh), carried in every call
# that uses it (a call without it in carry removes the host's copy; carried again, it is rebuilt).
#   FA3_BWD_DIMS="128" BWD_ARGS="--d 128 --n 1024 4096 16384" NCU_SHAPE="128:4096:0" \
#     bash scripts/fa3_backward_compare.sh
# SUSTAINED=S: each library's backward also back to back for S seconds with the card's clock and
# power (TFLOP/s per GHz: the power cap's share of a gap); NCU_SHAPE=none skips Nsight Compute.
# Logs under $OUT (or ./gpu-out).
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
start=$(date +%s)
left() { echo $(( ${BUDGET:-580} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
# warpattn's library alone (the tests are not needed here), and FA3, side by side on the cores.
(cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
  cmake --build build --target warpattn -j8 >> "$OUT/build.log" 2>&1; echo $? > "$OUT/build.rc") &
bash scripts/fa3_profiles.sh && FA3_PROFILE=backward MAX_JOBS=8 timeout -k 5 400 bash .fa3/build.sh > "$OUT/fa3-build.log" 2>&1
echo "fa3 build rc=$?: $(tail -1 "$OUT/fa3-build.log") ($(( $(date +%s) - start )) s)"
wait
echo "warpattn build rc=$(cat "$OUT/build.rc") ($(( $(date +%s) - start )) s)"
grep -E "error" "$OUT/build.log" | head -5
PYTHONUNBUFFERED=1 timeout -k 5 $(( $(left) - 150 )) python3 python/warpattn/bench_backward.py --lib build/libwarpattn.so \
  --fa3 .fa3/hopper --out "$OUT" --json "$OUT/bench-backward-fa3.json" --backward-only --breakdown \
  ${BWD_ARGS:---d 128 --n 1024 4096 16384} --passes ${PASSES:-3} ${SUSTAINED:+--sustained $SUSTAINED} \
  > "$OUT/bench-backward-fa3.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - start )) s)"; grep -vE "^\s*$" "$OUT/bench-backward-fa3.log" | tail -40
# Nsight Compute, both main kernels at one shape (the second untimed call's launch).
IFS=: read -r d n c <<< "${NCU_SHAPE:-128:4096:0}"
for lib in warpattn fa3; do
  [ "${NCU_SHAPE:-}" = none ] && break
  [ "$(left)" -gt 40 ] || { echo "ncu $lib skipped: $(left) s left"; continue; }
  # (FA3's kernels are cutlass::device_kernel<...>: matched on the demangled name)
  regex=$([ $lib = fa3 ] && echo "regex:FlashAttnBwdSm90" || echo "regex:attention_backward_kernel")
  timeout -k 5 $(( $(left) - 10 )) ncu --clock-control none --kernel-name-base demangled --kernel-name "$regex" \
    --launch-skip 1 --launch-count 1 \
    --set full --import-source yes -f -o "/tmp/ncu-$lib" python3 python/warpattn/bench_backward.py --lib build/libwarpattn.so \
    --fa3 .fa3/hopper --d "$d" --n "$n" --causal "$c" --untimed $lib > "$OUT/ncu-$lib.run.log" 2>&1
  echo "ncu $lib rc=$?"
  # the metrics as one CSV row, and per SASS instruction the stall samples (compressed: the
  # tool returns a limited number of files, keep $OUT small)
  ncu -i "/tmp/ncu-$lib.ncu-rep" --page raw --csv 2>&1 | gzip > "$OUT/ncu-$lib-raw.csv.gz"
  ncu -i "/tmp/ncu-$lib.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip > "$OUT/ncu-$lib-sass.csv.gz"
  ncu -i "/tmp/ncu-$lib.ncu-rep" --page details --print-details all > "/tmp/ncu-$lib.txt" 2>&1
  grep -E "Duration|Tensor Cycles Active|Issue Slots Busy|No Eligible|Executed Instructions  " "/tmp/ncu-$lib.txt" | head -8
done
# the two launches' SM balance side by side (the tail's share against the steps')
[ -s "$OUT/ncu-warpattn-raw.csv.gz" ] && [ -s "$OUT/ncu-fa3-raw.csv.gz" ] &&
  python3 scripts/ncu_balance.py "$OUT/ncu-warpattn-raw.csv.gz" "$OUT/ncu-fa3-raw.csv.gz"
