#!/usr/bin/env bash
# Adds a "model" profile to the FlashAttention-3 bundle's build script (.fa3/build.sh, made by
# ../shared/fa3/prepare.sh outside this repository): the BF16 forward at d = 64/128/256 with
# sliding windows (LOCAL) and softcap, no backward, FP16 or FP8, for issue 19's side-by-side
# (scripts/bench_model_options.py imports it from .fa3/hopper when present). Then, on the GPU
# host, in the call that benchmarks:  FA3_PROFILE=model bash .fa3/build.sh
set -euo pipefail
f=.fa3/build.sh
[ -f "$f" ] || { echo "fa3_model_profile.sh: no $f (run ../shared/fa3/prepare.sh first)" >&2; exit 1; }
grep -q 'FA3_PROFILE:-}" = "model"' "$f" && exit 0
python3 - "$f" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
anchor = 'export FLASH_ATTENTION_ENABLE_VCOLMAJOR=FALSE'
profile = '''if [ "${FA3_PROFILE:-}" = "model" ]; then  # BF16 forward, d 64/128/256, with LOCAL and SOFTCAP (warpattn's scripts/fa3_model_profile.sh)
  for X in LOCAL SOFTCAP; do export "FLASH_ATTENTION_DISABLE_$X=FALSE"; done
  for X in BACKWARD FP16 FP8; do export "FLASH_ATTENTION_DISABLE_$X=TRUE"; done
  export FA3_SKIP_SMOKE=1
fi
'''
assert anchor in s, "fa3_model_profile.sh: the bundle's build.sh has changed"
open(p, "w").write(s.replace(anchor, profile + anchor, 1))
PY
echo "fa3_model_profile.sh: FA3_PROFILE=model added to $f"
