#!/usr/bin/env bash
# Tuning on the GPU host: builds the library again with extra compile definitions (the
# WARPATTN_TUNE_* knobs) in build-<name>, and benchmarks it like the main build.
#   bash scripts/bench_variant.sh NAME "-DWARPATTN_TUNE_X=1" --points N=512 --dtypes bf16
# Writes $OUT/NAME/bench-<date>-NAME.{json,md}; prints the table rows.
set -u -o pipefail
name=$1 flags=$2
shift 2
OUT=${OUT:-gpu-out}
cmake -S . -B "build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="$flags" > /dev/null &&
  cmake --build "build-$name" --target warpattn -j"$(nproc)" > /dev/null || { echo "$name: build failed"; exit 1; }
timeout -k 5 ${BENCH_TIMEOUT:-300} python3 python/warpattn/bench.py --lib "build-$name/libwarpattn.so" --out "$OUT/$name" \
  --tag "$name" "$@" > "$OUT/$name.log" 2>&1
echo "$name ($flags) rc=$?"
grep -E "^\| [0-9]" "$OUT/$name"/*.md
rm -f "$OUT/$name"/*.png "$OUT/$name.log"
