#!/usr/bin/env bash
# A/B of run-time variants (environment variables) of one build, in interleaved passes (the
# power-capped card's clock drifts over minutes, so each pass puts the variants side by side):
#   ENV_VARIANTS="off=WARPATTN_BWD_TAIL_SPLIT=0 on=" PASSES=3 bash scripts/ab_env.sh \
#     python3 python/warpattn/bench_backward.py --lib build/libwarpattn.so --d 128 --n 4096 --passes 1
# A variant is NAME=VAR=VALUE[,VAR=VALUE...], or NAME= for the environment as it is. Logs:
# $OUT/ab/<name>-pass<k>.log; the lines matching $AB_GREP (default: the benchmark's rows) are
# printed, each after its variant's name. AB_TIMEOUT (default 200) bounds one run.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/ab"
for pass in $(seq "${PASSES:-3}"); do
  for v in ${ENV_VARIANTS:?}; do
    name=${v%%=*} settings=${v#*=}
    (
      IFS=, && for s in $settings; do [ -n "$s" ] && export "$s"; done
      timeout -k 5 "${AB_TIMEOUT:-200}" "$@" > "$OUT/ab/$name-pass$pass.log" 2>&1
    )
    echo "== $name pass $pass rc=$?"
    grep -E "${AB_GREP:-warpattn/cuDNN}" "$OUT/ab/$name-pass$pass.log" | sed "s/^/$name: /"
  done
done
