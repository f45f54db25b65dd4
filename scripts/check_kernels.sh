#!/usr/bin/env bash
# Checks the compiled Hopper kernels. Run it after scripts/build.sh.
#
#   bash scripts/check_kernels.sh [--log build/compile.log] [--lib build/libwarpattn.so]
#
# From the compiler log (ptxas -v output, see HOPPER-PRIMER.md §1.3):
#   1. Each function compiled for sm_90a whose mangled name contains "attention_forward",
#      "attention_backward", "backward_row_terms", "convert_dq", "split_tail" or "hopper" must show 0 bytes stack frame, 0 bytes spill stores and 0 bytes
#      spill loads.
#      Its "cumulative stack size" (stack used by functions it calls) must be 0 too.
#      Other functions are not checked.
#   2. No line may contain a ptxas advisory code C75xx (for example C7511, C7515, C7519).
#      Every such line is printed.
# From the SASS of the library (cuobjdump -sass, see HOPPER-PRIMER.md §1.4):
#   3. There must be at least one attention kernel: an entry function whose name contains
#      "attention_forward" or "attention_backward" (the checks 4-5 call both "forward kernel"). With none, the check fails instead of passing vacuously.
#   4. Each forward kernel must contain wgmma instructions of its type: HGMMA (fp16/bf16),
#      QGMMA (FP8 kernels, whose names carry __nv_fp8_e4m3), and IGMMA as well in the FP8
#      kernels with INT8 Q and K (QKElement int8_t: their mangled names end in "aLi<n>EEEEEv").
#   5. Each forward kernel must have a ptxas report in the log. Without one, the log is stale
#      or incomplete, so checks 1 and 2 would have seen too little.
#   6. Each function named as in check 1 must have STACK:0 and LOCAL:0 in cuobjdump
#      -res-usage, which reads the binary itself.
#   7. In the forward kernels with head dim 128 or 256 (ForwardConfig::kSoftmaxRowsThenConvert),
#      the first row's exponentials (at least 8 MUFU.EX2) and both rows' maxima (at least 16
#      FMNMX) must sit between the main loop's S wait (WARPGROUP.DEPBAR.LE gsb0, 0x1) and its
#      P·V wait (gsb0, 0x0): ptxas moves that wait above the softmax unless the schedule fence
#      keeps it below (docs/perf/LOG.md, runs 27 and 68).
# At the end it prints a summary: how many forward kernels there are, and the HGMMA count and
# registers of each.
# If cuobjdump is missing, the script pip-installs it and nvdisasm (nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm 13.2.86; cuobjdump -sass runs nvdisasm).
# Exits 0 when every check passes, 1 otherwise. Every failure is printed with the kernel it
# concerns.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${WARPATTN_BUILD_DIR:-$ROOT/build}
LOG=$BUILD_DIR/compile.log
LIB=$BUILD_DIR/libwarpattn.so
while [ $# -gt 0 ]; do
  case "$1" in
    --log) LOG=$2; shift 2 ;;
    --lib) LIB=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "check_kernels: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

HOPPER_RE='attention_forward|attention_backward|backward_row_terms|convert_dq|split_tail|hopper'  # checks 1 and 6
FORWARD_RE='attention_forward|attention_backward'  # the attention kernels (forward and backward): checks 3-5
GMMA_RE='[[:space:]]HGMMA[.]'
QGMMA_RE='[[:space:]]QGMMA[.]'
IGMMA_RE='[[:space:]]IGMMA[.]'
TOOLS_VERSION=13.2.86

FAILED=0
fail() { echo "check_kernels: FAIL: $*" >&2; FAILED=1; }
say() { echo "check_kernels: $*"; }
demangle() { if command -v c++filt >/dev/null 2>&1; then c++filt "$1"; else echo "$1"; fi; }
# Without the parameter list, for the summary table.
demangle_short() { if command -v c++filt >/dev/null 2>&1; then c++filt -p "$1"; else echo "$1"; fi; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# ------------------------------------------------------------------ compile log
if [ ! -s "$LOG" ]; then
  echo "check_kernels: FAIL: compiler log $LOG is missing or empty; run 'bash scripts/build.sh' first" >&2
  exit 1
fi

# One record per "Function properties for NAME" block:
#   F <arch> <name> <stack> <spill stores> <spill loads> <registers> <cumulative stack>
# The arch comes from ptxas's "Compiling entry function 'NAME' for 'sm_XX'" line. A device
# function without such a line takes the arch last seen in the same ninja section, or sm_90a if
# the section's compile command targets sm_90a. If nothing is known the arch is "?"; such
# functions are checked too, to be safe.
awk '
  function emit() {
    if (cur != "") printf "F\t%s\t%s\t%d\t%d\t%d\t%s\t%d\n", (farch == "" ? "?" : farch), cur, st, ss, sl, (regs == "" ? "?" : regs), cum
    cur = ""; regs = ""; cum = 0
  }
  function num(re,   s) {
    if (!match($0, re)) return 0
    s = substr($0, RSTART, RLENGTH); sub(/ .*/, "", s); return s + 0
  }
  /^\[[0-9]+\/[0-9]+\] / { emit(); arch = ($0 ~ /sm_90a/) ? "sm_90a" : ""; next }
  /Compiling entry function / {
    emit()
    s = $0; sub(/.*Compiling entry function .*for \047/, "", s); sub(/\047.*/, "", s)
    if (s != "") arch = s
    next
  }
  /Function properties for / {
    emit()
    cur = $0; sub(/.*Function properties for /, "", cur); sub(/[ \t\r]+$/, "", cur)
    farch = arch; st = 0; ss = 0; sl = 0
    next
  }
  cur != "" && /bytes stack frame/ {
    st = num("[0-9]+ bytes stack frame"); ss = num("[0-9]+ bytes spill stores"); sl = num("[0-9]+ bytes spill loads")
    next
  }
  cur != "" && /Used [0-9]+ registers/ {
    regs = num("[0-9]+ registers"); cum = num("[0-9]+ bytes cumulative stack size"); emit(); next
  }
  END { emit() }
' "$LOG" > "$TMP/log_funcs.tsv"

# Check 1: stack frame and spills of the Hopper functions built for sm_90a.
n_checked=0
while IFS=$'\t' read -r _ arch name st ss sl _regs cum; do
  [[ "$arch" == "sm_90a" || "$arch" == "?" ]] || continue
  [[ "$name" =~ $HOPPER_RE ]] || continue
  n_checked=$((n_checked + 1))
  if [ "$st" -ne 0 ] || [ "$ss" -ne 0 ] || [ "$sl" -ne 0 ]; then
    fail "kernel $(demangle "$name") [$name] ($arch): $st bytes stack frame, $ss bytes spill stores, $sl bytes spill loads (all must be 0)"
  elif [ "$cum" -ne 0 ]; then
    fail "kernel $(demangle "$name") [$name] ($arch): $cum bytes cumulative stack size (a function it calls uses the stack; must be 0)"
  fi
done < "$TMP/log_funcs.tsv"
say "compile log $LOG: $n_checked sm_90a Hopper function report(s) checked for stack frame and spills"

# Check 2: ptxas advisories C75xx anywhere in the log.
if grep -nE '(^|[^[:alnum:]_])C75[0-9][0-9]([^0-9]|$)' "$LOG" > "$TMP/c75.txt"; then
  while IFS= read -r line; do
    fail "ptxas advisory in $LOG line ${line%%:*}: ${line#*:}"
  done < "$TMP/c75.txt"
fi

# ------------------------------------------------------------------ SASS
# Finds a CUDA binary tool: on PATH, in the CUDA toolkit, or in an installed pip package.
pip_pkg_bin() {  # $1: distribution, $2: tool name
  python3 - "$1" "$2" <<'EOF' 2>/dev/null || true
import importlib.metadata as md, os, sys
try:
    dist = md.distribution(sys.argv[1])
except md.PackageNotFoundError:
    sys.exit(0)
for f in dist.files or []:
    if str(f).replace("\\", "/").endswith("bin/" + sys.argv[2]):
        p = str(dist.locate_file(f))
        if os.path.isfile(p):
            os.chmod(p, os.stat(p).st_mode | 0o111) if not os.access(p, os.X_OK) else None
            print(p)
            break
EOF
}
find_tool() {  # $1: tool name, $2: pip distribution
  local c
  for c in "$(command -v "$1" 2>/dev/null || true)" "${CUDA_HOME:+$CUDA_HOME/bin/$1}" \
           "/usr/local/cuda/bin/$1" "$(command -v python3 >/dev/null 2>&1 && pip_pkg_bin "$2" "$1")"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}
pip_install() {
  command -v python3 >/dev/null 2>&1 || { echo "check_kernels: python3 not found; cannot pip install $*" >&2; return 1; }
  local opts=(-m pip install --quiet --disable-pip-version-check "$@")
  python3 "${opts[@]}" 2>/dev/null || python3 "${opts[@]}" --user 2>/dev/null ||
    python3 "${opts[@]}" --user --break-system-packages
}
CUOBJDUMP=$(find_tool cuobjdump nvidia-cuda-cuobjdump) || CUOBJDUMP=""
NVDISASM=$(find_tool nvdisasm nvidia-cuda-nvdisasm) || NVDISASM=""
if [ -z "$CUOBJDUMP" ] || [ -z "$NVDISASM" ]; then
  say "installing cuobjdump/nvdisasm from PyPI (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm $TOOLS_VERSION)"
  pkgs=()
  [ -n "$CUOBJDUMP" ] || pkgs+=("nvidia-cuda-cuobjdump==$TOOLS_VERSION")
  [ -n "$NVDISASM" ] || pkgs+=("nvidia-cuda-nvdisasm==$TOOLS_VERSION")
  pip_install "${pkgs[@]}" || true
  CUOBJDUMP=$(find_tool cuobjdump nvidia-cuda-cuobjdump) || CUOBJDUMP=""
  NVDISASM=$(find_tool nvdisasm nvidia-cuda-nvdisasm) || NVDISASM=""
fi
if [ -z "$CUOBJDUMP" ] || [ -z "$NVDISASM" ]; then
  echo "check_kernels: FAIL: cuobjdump and nvdisasm are needed to read the SASS (pip install nvidia-cuda-cuobjdump==$TOOLS_VERSION nvidia-cuda-nvdisasm==$TOOLS_VERSION)" >&2
  exit 1
fi
PATH="$(dirname "$NVDISASM"):$PATH"   # cuobjdump -sass runs nvdisasm from PATH
export PATH

if [ ! -f "$LIB" ]; then
  echo "check_kernels: FAIL: library $LIB not found; run 'bash scripts/build.sh' first" >&2
  exit 1
fi
for mode in sass symbols res-usage; do
  if ! "$CUOBJDUMP" -"$mode" "$LIB" > "$TMP/$mode.txt" 2> "$TMP/$mode.err"; then
    cat "$TMP/$mode.err" >&2
    echo "check_kernels: FAIL: '$CUOBJDUMP -$mode $LIB' failed" >&2
    exit 1
  fi
done

# Tagged records for one awk pass:
#   E <name>                        entry function (kernel), from -symbols
#   U <name> <reg> <stack> <local>  from -res-usage
#   S <arch> <name> <gmma count>    one per function block of -sass
#   F ...                           ptxas reports from the log (above)
awk '$1 == "STT_FUNC" && / STO_ENTRY / { print "E\t" $NF }' "$TMP/symbols.txt" > "$TMP/records.tsv"
awk '
  /^[ \t]*Function [^ ]+:[ \t]*$/ { name = $2; sub(/:$/, "", name); next }
  name != "" && /REG:/ {
    reg = $0; sub(/.*REG:/, "", reg); sub(/ .*/, "", reg)
    stk = $0; sub(/.*STACK:/, "", stk); sub(/ .*/, "", stk)
    loc = $0; sub(/.*LOCAL:/, "", loc); sub(/ .*/, "", loc)
    print "U\t" name "\t" reg + 0 "\t" stk + 0 "\t" loc + 0; name = ""
  }
' "$TMP/res-usage.txt" >> "$TMP/records.tsv"
awk -v gmma="$GMMA_RE" -v qgmma="$QGMMA_RE" -v igmma="$IGMMA_RE" '
  function emit() { if (name != "") print "S\t" arch "\t" name "\t" n "\t" q "\t" i8; name = "" }
  /^Fatbin / { emit(); arch = "?" }
  /code for sm_/ { emit(); arch = $NF }
  /^[ \t]*Function : / { emit(); name = $NF; n = 0; q = 0; i8 = 0; next }
  name != "" && $0 ~ gmma { n++ }
  name != "" && $0 ~ qgmma { q++ }
  name != "" && $0 ~ igmma { i8++ }
  END { emit() }
' "$TMP/sass.txt" >> "$TMP/records.tsv"
# O <name> <n> <m>: MUFU.EX2 (n) and FMNMX (m) between the first S wait (gsb0, 0x1) and the
# P·V wait after it.
awk '
  function emit() { if (name != "") print "O\t" name "\t" (seen ? ex : -1) "\t" (seen ? mx : -1); name = "" }
  /^[ \t]*Function : / { emit(); name = $NF; state = 0; ex = 0; mx = 0; seen = 0; next }
  name == "" { next }
  state == 0 && /WARPGROUP\.DEPBAR\.LE gsb0, 0x1/ { state = 1; seen = 1; next }
  state == 1 && /MUFU\.EX2/ { ex++ }
  state == 1 && /FMNMX/ { mx++ }
  state == 1 && /WARPGROUP\.DEPBAR\.LE gsb0, 0x0/ { state = 2 }
  END { emit() }
' "$TMP/sass.txt" >> "$TMP/records.tsv"
cat "$TMP/log_funcs.tsv" >> "$TMP/records.tsv"

# Decide. Output lines: FAIL\t<message with a mangled name in [..]>, or K\t<arch>\t<name>\t<gmma>\t<reg>
awk -F '\t' -v fwd="$FORWARD_RE" -v hop="$HOPPER_RE" '
  $1 == "E" { entry[$2] = 1; n_entry++ }
  $1 == "U" { if (!($2 in reg) || $3 > reg[$2]) reg[$2] = $3
              if ($4 + $5 > 0 && $2 ~ hop) printf "FAIL\tkernel [%s]: cuobjdump -res-usage shows STACK:%d LOCAL:%d (must be 0)\n", $2, $4, $5 }
  $1 == "S" { k = $2 SUBSEP $3; if (!(k in g) || $4 < g[k]) g[k] = $4; if (!(k in gq) || $5 < gq[k]) gq[k] = $5
              if (!(k in gi) || $6 < gi[k]) gi[k] = $6
              order[++ns] = k }
  $1 == "F" { if (($2 == "sm_90a" || $2 == "?")) logged[$3] = 1 }
  $1 == "O" { overlap[$2] = $3; early_max[$2] = $4 }
  END {
    for (i = 1; i <= ns; i++) {
      k = order[i]; if (k in done) continue; done[k] = 1
      split(k, p, SUBSEP); arch = p[1]; name = p[2]
      if (name !~ fwd) continue
      if (n_entry > 0 && !(name in entry)) continue   # a device function, not a kernel
      nk++
      fp8 = name ~ /fp8_e4m3/
      int8qk = fp8 && name ~ /aLi[0-9]EEEEEv/
      printf "K\t%s\t%s\t%s\t%s\n", arch, name, fp8 ? gq[k] " QGMMA" (int8qk ? " " gi[k] " IGMMA" : "") : g[k] " HGMMA", (name in reg) ? reg[name] : "?"
      if (!fp8 && g[k] == 0) printf "FAIL\tforward kernel [%s] (%s) has no HGMMA in its SASS: the WGMMA path was not compiled\n", name, arch
      if (fp8 && gq[k] == 0) printf "FAIL\tFP8 forward kernel [%s] (%s) has no QGMMA in its SASS: the FP8 WGMMA path was not compiled\n", name, arch
      if (int8qk && gi[k] == 0) printf "FAIL\tINT8-Q/K forward kernel [%s] (%s) has no IGMMA in its SASS: its S GEMM is not s8\n", name, arch
      if (arch != "sm_90a") printf "FAIL\tforward kernel [%s] is compiled for %s, expected sm_90a\n", name, arch
      if (name ~ /ForwardConfigI(13__nv_fp8_e4m3|13__nv_bfloat16|6__half)Li(128|256)E/ &&
          (!(name in overlap) || overlap[name] < 8 || early_max[name] < 16))
        printf "FAIL\tforward kernel [%s]: fewer than 8 MUFU.EX2 or 16 FMNMX between the S wait and the P.V wait of its main loop: the softmax no longer runs under P.V (ForwardConfig::kSoftmaxRowsThenConvert; schedule fence lost?)\n", name
      if (!(name in logged)) printf "FAIL\tforward kernel [%s] has no ptxas report in the compile log (stale or incomplete log: run bash scripts/build.sh)\n", name
    }
    if (nk == 0) printf "FAIL\tno forward kernel (entry function whose name contains \"%s\") in the SASS of the library\n", fwd
    if (n_entry == 0) printf "NOTE\tcuobjdump -symbols listed no entry functions; every SASS function block counted as a kernel\n"
  }
' "$TMP/records.tsv" > "$TMP/verdict.tsv"

while IFS=$'\t' read -r tag msg; do
  case "$tag" in
    FAIL)
      if [[ "$msg" =~ \[([^]]+)\] ]]; then
        mangled=${BASH_REMATCH[1]}
        msg="${msg/\[$mangled\]/$(demangle "$mangled") [$mangled]}"
      fi
      fail "$msg" ;;
    NOTE) say "note: $msg" ;;
  esac
done < "$TMP/verdict.tsv"

# Summary
nk=$(grep -c '^K' "$TMP/verdict.tsv" || true)
say "attention kernels (forward and backward) in $LIB: $nk"
if [ "$nk" -gt 0 ]; then
  printf '  %-7s %12s %5s  %s\n' arch wgmma REG kernel
  while IFS=$'\t' read -r _ arch name n r; do
    printf '  %-7s %12s %5s  %s\n' "$arch" "$n" "$r" "$(demangle_short "$name")"
  done < <(grep '^K' "$TMP/verdict.tsv")
fi

if [ "$FAILED" -ne 0 ]; then
  echo "check_kernels: FAILED (see the FAIL lines above)" >&2
  exit 1
fi
say "all kernel checks passed"
