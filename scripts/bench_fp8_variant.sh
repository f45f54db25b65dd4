#!/usr/bin/env bash
# FP8 tuning on the GPU host: builds the Python module again with extra compile definitions
# (the WARPATTN_TUNE_* knobs) in build-<name>, stages it as a package in /tmp/pkg-<name>, and
# runs the FP8 benchmark through it (same process layout as the main build's).
#   bash scripts/bench_fp8_variant.sh NAME "-DWARPATTN_TUNE_FP8_STAGES=3" --points d=256 N=16384
# Writes $OUT/NAME/bench-<date>-NAME.{json,md}; prints the table rows.
set -u -o pipefail
name=$1 flags=$2
shift 2
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/$name" && outdir=$(cd "$OUT/$name" && pwd)
cmake -S . -B "build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWARPATTN_BUILD_PYTHON=ON \
  -DWARPATTN_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS="$flags" > /dev/null &&
  cmake --build "build-$name" --target _warpattn -j"$(nproc)" > "/tmp/build-$name.log" 2>&1 ||
  { echo "$name: build failed"; grep -E "error" "/tmp/build-$name.log" | head; exit 1; }
pkg=/tmp/pkg-$name/warpattn
rm -rf "/tmp/pkg-$name" && mkdir -p "$pkg"
cp python/warpattn/*.py "$pkg/" && cp "build-$name"/_warpattn*.so "build-$name"/libwarpattn.so "$pkg/"
(cd /tmp && PYTHONPATH=/tmp/pkg-$name timeout -k 5 ${BENCH_TIMEOUT:-300} python3 -m warpattn.bench_fp8 \
  --out "$outdir" --tag "$name" "$@" > "/tmp/$name.log" 2>&1)
echo "$name ($flags) rc=$?"
grep -E "^\| [0-9]" "$outdir"/*.md || tail -5 "/tmp/$name.log"
