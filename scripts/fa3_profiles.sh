#!/usr/bin/env bash
# Adds warpattn's build profiles to the FlashAttention-3 bundle's build script (.fa3/build.sh,
# made by ../shared/fa3/prepare.sh outside this repository). Then, on the GPU host, in the call
# that benchmarks:  FA3_PROFILE=<profile> bash .fa3/build.sh
#   model:    the BF16 forward at d = 64/128/256 with sliding windows (LOCAL) and softcap, no
#             backward, FP16 or FP8, for issue 19's side-by-side (scripts/bench_model_options.py
#             imports it from .fa3/hopper when present);
#   backward: the BF16 forward and backward at d = $FA3_BWD_DIMS (default 128; any of 64 128
#             256), for issue 14's side-by-side (bench_backward.py --fa3 .fa3/hopper).
set -euo pipefail
f=.fa3/build.sh
[ -f "$f" ] || { echo "fa3_profiles.sh: no $f (run ../shared/fa3/prepare.sh first)" >&2; exit 1; }
grep -q 'warpattn profiles' "$f" && exit 0
python3 - "$f" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
anchor = 'export FLASH_ATTENTION_ENABLE_VCOLMAJOR=FALSE'
profiles = '''# (warpattn profiles: scripts/fa3_profiles.sh)
if [ "${FA3_PROFILE:-}" = "model" ]; then  # BF16 forward, d 64/128/256, with LOCAL and SOFTCAP
  for X in LOCAL SOFTCAP; do export "FLASH_ATTENTION_DISABLE_$X=FALSE"; done
  for X in BACKWARD FP16 FP8; do export "FLASH_ATTENTION_DISABLE_$X=TRUE"; done
  export FA3_SKIP_SMOKE=1
fi
if [ "${FA3_PROFILE:-}" = "backward" ]; then  # BF16 forward and backward at the head dims in FA3_BWD_DIMS
  for X in FP16 FP8 HDIM64 HDIM128 HDIM256; do export "FLASH_ATTENTION_DISABLE_$X=TRUE"; done
  for D in ${FA3_BWD_DIMS:-128}; do export "FLASH_ATTENTION_DISABLE_HDIM$D=FALSE"; done
  export FA3_SKIP_SMOKE=1
fi
'''
assert anchor in s, "fa3_profiles.sh: the bundle's build.sh has changed"
open(p, "w").write(s.replace(anchor, profiles + anchor, 1))
PY
echo "fa3_profiles.sh: FA3_PROFILE=model and =backward added to $f"
