#!/usr/bin/env bash
# Set up and build warpattn on a fresh machine. Safe to run again at any time.
#
#   bash scripts/build.sh
#
# 1. Finds nvcc. It looks at $CUDACXX, then PATH, then $CUDA_HOME, $CUDA_PATH and
#    /usr/local/cuda. If none has it, the script stops with an error.
# 2. Makes sure cmake >= 3.25.2 and ninja exist. If they are missing or cmake is too old, it
#    installs them with pip (cmake 3.x). 3.25.2 is the first CMake that supports C++20 for nvcc.
# 3. Configures: cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
# 4. Builds on every core: cmake --build build -j$(nproc) --verbose
#
# Compiler output:
#   build/compile.last.log  what this run printed, as printed.
#   build/compile.log       for every object in the build: its compile command and everything
#                           the compiler printed for it, including the ptxas -v resource lines
#                           and C75xx advisories. scripts/check_kernels.sh reads this file.
#   build/compile-logs/     the same output kept per object. When ninja rebuilds an object,
#                           that object's entry is replaced. When an object has no entry, or
#                           was rebuilt outside this script (it is newer than its entry), the
#                           object is deleted first so that ninja compiles it again and its
#                           output is captured.
#   So build/compile.log always covers the whole build, even after a build with nothing to do.
#
# Exits non-zero if set-up or the build fails.
# Environment: WARPATTN_BUILD_DIR (default: build) picks the build folder.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${WARPATTN_BUILD_DIR:-build}
# 3.25.2 is the first CMake that knows nvcc's -std=c++20 (CMAKE_CUDA_STANDARD 20); Debian 12's
# 3.25.1 stops at generate time with 'requires the language dialect "CUDA20"'.
MIN_CMAKE=3.25.2

say() { echo "build.sh: $*"; }
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }
# version_ge A B: true if version A >= version B
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

# ---------------------------------------------------------------- 1. nvcc
find_nvcc() {
  local c
  for c in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null || true)" \
           "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "${CUDA_PATH:+$CUDA_PATH/bin/nvcc}" \
           /usr/local/cuda/bin/nvcc; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}
NVCC=$(find_nvcc) || die "nvcc not found. warpattn needs the CUDA 13 toolkit: install it, then
  put its bin folder on PATH, or set CUDA_HOME (e.g. CUDA_HOME=/usr/local/cuda)."
NVCC_DIR=$(cd "$(dirname "$NVCC")" && pwd)
export PATH="$NVCC_DIR:$PATH"
CUDACXX="$NVCC_DIR/$(basename "$NVCC")"
export CUDACXX
NVCC_VERSION=$("$CUDACXX" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
[ -n "$NVCC_VERSION" ] || die "could not run '$CUDACXX --version'"
say "nvcc $NVCC_VERSION at $CUDACXX"
if ! version_ge "$NVCC_VERSION" 13.0; then
  say "WARNING: warpattn is written for CUDA 13 (nvcc 13.0+); found $NVCC_VERSION. The build may fail."
fi

# ---------------------------------------------------------------- 2. cmake and ninja
pip_install() {
  command -v python3 >/dev/null 2>&1 ||
    die "python3 not found, so cannot pip install $*. Install it yourself (e.g. apt-get install $*)."
  local opts=(-m pip install --quiet --disable-pip-version-check "$@")
  # In order: a venv or writable interpreter, a user install, a user install on a system
  # Python that refuses changes from pip (PEP 668).
  python3 "${opts[@]}" 2>/dev/null ||
    python3 "${opts[@]}" --user 2>/dev/null ||
    python3 "${opts[@]}" --user --break-system-packages ||
    die "pip install $* failed"
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash 2>/dev/null || true; fi
  hash -r
}
# Folders where pip may have put the tool's binary: the package's own bin folder, the
# interpreter's scripts folder and the user scripts folder.
pip_bin_dirs() {  # $1: python module (cmake or ninja)
  python3 - "$1" <<'EOF' 2>/dev/null || true
import importlib, os, site, sys, sysconfig
name = sys.argv[1]
dirs = []
try:
    m = importlib.import_module(name)
    for attr in ("CMAKE_BIN_DIR", "BIN_DIR"):
        if getattr(m, attr, None):
            dirs.append(getattr(m, attr))
    dirs.append(os.path.join(os.path.dirname(m.__file__), "data", "bin"))
except Exception:
    pass
dirs.append(sysconfig.get_path("scripts"))
dirs.append(os.path.join(site.getuserbase(), "bin"))
print("\n".join(d for d in dirs if os.path.isdir(d)))
EOF
}
cmake_version() { "$1" --version 2>/dev/null | sed -n '1s/^cmake version \([0-9][0-9.]*\).*/\1/p'; }
cmake_ok() { local v; v=$(cmake_version "$1"); [ -n "$v" ] && version_ge "$v" "$MIN_CMAKE"; }

CMAKE=$(command -v cmake 2>/dev/null || true)
if [ -z "$CMAKE" ] || ! cmake_ok "$CMAKE"; then
  say "cmake >= $MIN_CMAKE not found (found: ${CMAKE:-none} $( [ -n "$CMAKE" ] && cmake_version "$CMAKE")); installing it with pip"
  pip_install "cmake>=$MIN_CMAKE,<4"
  CMAKE=""
  while read -r d; do
    if [ -x "$d/cmake" ] && cmake_ok "$d/cmake"; then CMAKE="$d/cmake"; break; fi
  done < <(pip_bin_dirs cmake)
  [ -n "$CMAKE" ] || die "pip installed cmake, but no cmake >= $MIN_CMAKE can be found"
  PATH="$(dirname "$CMAKE"):$PATH"; export PATH
  say "NOTE: this cmake (and its ctest) is in $(dirname "$CMAKE"); put that folder first on PATH to use it from your shell"
fi
say "cmake $(cmake_version "$CMAKE") at $CMAKE"

NINJA=$(command -v ninja 2>/dev/null || command -v ninja-build 2>/dev/null || true)
if [ -z "$NINJA" ] || ! "$NINJA" --version >/dev/null 2>&1; then
  say "ninja not found; installing it with pip"
  pip_install ninja
  NINJA=""
  while read -r d; do
    if [ -x "$d/ninja" ] && "$d/ninja" --version >/dev/null 2>&1; then NINJA="$d/ninja"; break; fi
  done < <(pip_bin_dirs ninja)
  [ -n "$NINJA" ] || die "pip installed ninja, but no ninja binary can be found"
  PATH="$(dirname "$NINJA"):$PATH"; export PATH
fi
say "ninja $("$NINJA" --version) at $NINJA"

# ---------------------------------------------------------------- 3. configure
cfg=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_MAKE_PROGRAM="$NINJA")
CACHE="$BUILD_DIR/CMakeCache.txt"
if [ -f "$CACHE" ]; then
  gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$CACHE")
  if [ "$gen" != "Ninja" ]; then
    say "$BUILD_DIR was configured with '$gen'; configuring it again from scratch for Ninja"
    cfg=(--fresh "${cfg[@]}" -DCMAKE_CUDA_COMPILER="$CUDACXX")
  fi
else
  cfg+=(-DCMAKE_CUDA_COMPILER="$CUDACXX")
fi
"$CMAKE" "${cfg[@]}" || die "cmake configure failed"

# ---------------------------------------------------------------- 4. build
LOGDIR="$BUILD_DIR/compile-logs"
mkdir -p "$LOGDIR"
# Build output path (relative to the build folder) -> file that holds its captured output.
section_file() { printf '%s/%s.log' "$LOGDIR" "$(printf '%s' "$1" | sed 's|/|%|g')"; }

# Every CUDA object must have captured output at least as new as the object itself.
forced=0
while read -r obj; do
  [ -e "$BUILD_DIR/$obj" ] || continue
  sec=$(section_file "$obj")
  if [ ! -f "$sec" ] || [ "$BUILD_DIR/$obj" -nt "$sec" ]; then
    rm -f "$BUILD_DIR/$obj"
    forced=$((forced + 1))
  fi
done < <("$NINJA" -C "$BUILD_DIR" -t targets all | sed -n 's/^\(.*\.cu\.o\): .*/\1/p')
[ "$forced" -eq 0 ] || say "recompiling $forced CUDA object(s) whose compiler output was not captured"

JOBS=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
say "building with $JOBS jobs"
# With its output in a pipe, ninja prints each edge's status line (with -v, the whole command)
# when the edge finishes, directly followed by that command's output.
set +e
NINJA_STATUS='[%f/%t] ' "$CMAKE" --build "$BUILD_DIR" -j"$JOBS" --verbose 2>&1 |
  tee "$BUILD_DIR/compile.last.log"
rc=${PIPESTATUS[0]}
set -e

# Split this run's output into one section per output file ("-o PATH" in the command).
rm -f "$LOGDIR"/*.log.new
awk -v dir="$LOGDIR" '
  /^\[[0-9]+\/[0-9]+\] / {
    if (out != "") close(out)
    out = ""
    if (match($0, / -o [^ ]+/)) {
      key = substr($0, RSTART + 4, RLENGTH - 4)
      gsub("/", "%", key)
      out = dir "/" key ".log.new"
    }
  }
  out != "" { print > out }
' "$BUILD_DIR/compile.last.log"
for f in "$LOGDIR"/*.log.new; do
  [ -e "$f" ] && mv -f "$f" "${f%.new}"
done

# Assemble compile.log from the sections of the outputs the build has now.
{
  echo "# warpattn compile log, assembled by scripts/build.sh on $(date -u '+%Y-%m-%d %H:%M:%S UTC')."
  echo "# The latest compile command and compiler output of every object (this run's raw"
  echo "# output is in compile.last.log)."
  n=0
  while read -r out; do
    sec=$(section_file "$out")
    if [ -f "$sec" ]; then cat "$sec"; n=$((n + 1)); fi
  done < <("$NINJA" -C "$BUILD_DIR" -t targets all | sed -n 's/^\(.*\): [^:]*$/\1/p' | sort -u)
  echo "# $n sections"
} > "$BUILD_DIR/compile.log.tmp"
mv -f "$BUILD_DIR/compile.log.tmp" "$BUILD_DIR/compile.log"

if [ "$rc" -ne 0 ]; then
  echo "build.sh: ERROR: build failed (exit $rc); compiler output is in $BUILD_DIR/compile.log" >&2
  exit "$rc"
fi
say "build OK; compiler output (ptxas resource lines included) is in $BUILD_DIR/compile.log"
