#!/usr/bin/env bash
# Run 62 (throwaway): final checks of dceefe1: suites, sanitizers, A/B with 7ae65c7, Python.
set -u -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p $OUT
(VARIANTS="base@base-tree= new=" BUILD_ONLY=1 bash scripts/ab_fp8.sh > /tmp/abb.txt 2>&1) &
OUT=/tmp/g62 FORWARD_TIMEOUT=240 FP8_TIMEOUT=200 SANITIZE_TOOLS="memcheck racecheck" SANITIZE_FP8_FILTER=split \
  SANITIZE_TIMEOUT=120 STAGES="forward fp8 sanitize" bash scripts/gpu_run.sh
cp /tmp/g62/gpu-logs.tgz $OUT/tests.tgz
wait; cat /tmp/abb.txt
VARIANTS="base@base-tree= new=" PASSES=2 bash scripts/ab_fp8.sh --points d=128,256 N=16384 causal=0,1
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $OUT/ab
OUT=/tmp/g62p SKIP_PY_BENCH=1 FP8_BENCH=1 PYTEST_TIMEOUT=200 STAGES="python" bash scripts/gpu_run.sh
cp /tmp/g62p/gpu-logs.tgz $OUT/py.tgz
