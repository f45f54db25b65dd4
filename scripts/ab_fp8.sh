#!/usr/bin/env bash
# A/B of compile-time variants on the GPU host, in one call. Builds each variant (the library,
# the Python module, and the GPU tests where $TESTS names some) in build-<name>, all in
# parallel, then runs the FP8 benchmark (FP8, INT8 Q/K, BF16 warpattn and cuDNN at each point)
# through every variant in $PASSES alternating passes (the card's clock drifts over minutes,
# so each pass puts the variants side by side), then the tests of each variant.
#   VARIANTS="base= lift6=-DWARPATTN_TUNE_FP8_P_LIFT=6" PASSES=2 \
#     TESTS="test_gpu_fp8:fp8_accuracy_on_outlier_data" bash scripts/ab_fp8.sh --points d=256 N=16384 causal=0
# BUILD_ONLY=1 builds and stops (to build while something else runs); SKIP_TESTS=1 builds the
# $TESTS binaries but does not run them (a later call can: ./build-<name>/<test>). A variant is NAME=FLAGS (FLAGS: CMAKE_CUDA_FLAGS, the WARPATTN_TUNE_* knobs; empty for the
# code as it is; @DIR for a folder already built, e.g. base=@build: gpu_run.sh's build, not built
# again; several flags comma-separated). Writes $OUT/ab/<name>-pass<k>.md and <name>-<test>[-<filter>].log; prints the rows.
# AB_BENCH: a command to run instead of bench_fp8 (from /tmp, with the variant's package on
# PYTHONPATH; give paths absolute), e.g. AB_BENCH="python3 $PWD/scripts/bench_model_options.py";
# its last AB_LINES (20) lines are printed, the whole log kept as $OUT/ab/<name>-pass<k>.log.
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/ab" && out=$(cd "$OUT/ab" && pwd)
targets=_warpattn
for t in ${TESTS:-}; do targets="$targets ${t%%:*}"; done
name_of() { local n=${1%%=*}; echo "${n%@*}"; }  # NAME of NAME[@DIR]=FLAGS
dir_of() { case ${1#*=} in @*) local d=${1#*=}; echo "${d#@}" ;; *) echo "build-$(name_of "$1")" ;; esac; }
to_build=$(for v in ${VARIANTS:?}; do case ${v#*=} in @*) ;; *) echo "$v" ;; esac; done)
builds=$(echo $to_build | wc -w)
jobs=$(( $(nproc) / (builds > 0 ? builds : 1) + 1 ))  # the cores shared by the builds (none: every variant prebuilt)
for v in $to_build; do
  name=$(name_of "$v") flags=${v#*=} src=.
  flags=${flags//,/ }  # several flags: NAME=FLAG1,FLAG2
  case ${v%%=*} in *@*) src=${v%%=*}; src=${src#*@} ;; esac
  (cmake -S "$src" -B "build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWARPATTN_BUILD_PYTHON=ON \
     -DWARPATTN_BUILD_TESTS=$([ -n "${TESTS:-}" ] && echo ON || echo OFF) -DCMAKE_CUDA_FLAGS="$flags" &&
   cmake --build "build-$name" --target $targets -j$jobs) > "/tmp/build-$name.log" 2>&1 ||
    { echo "$name: build failed"; grep -E "error" "/tmp/build-$name.log" | head; } &
done
wait
[ -n "${BUILD_ONLY:-}" ] && exit 0  # a later call runs them (the builds are kept)
for v in $VARIANTS; do  # each variant as a package of its own
  name=$(name_of "$v")
  rm -rf "/tmp/pkg-$name" && mkdir -p "/tmp/pkg-$name/warpattn"
  dir=$(dir_of "$v")
  cp python/warpattn/*.py "$dir"/_warpattn*.so "$dir"/libwarpattn.so "/tmp/pkg-$name/warpattn/"
done
for pass in $(seq 1 ${PASSES:-2}); do
  for v in $VARIANTS; do
    name=$(name_of "$v")
    if [ -n "${AB_BENCH:-}" ]; then  # another benchmark: a command run with the variant's package
      (cd /tmp && PYTHONPATH=/tmp/pkg-$name timeout -k 5 ${BENCH_TIMEOUT:-300} bash -c "$AB_BENCH" \
        > "$out/$name-pass$pass.log" 2>&1)
      echo "$name pass $pass rc=$?"
      tail -${AB_LINES:-20} "$out/$name-pass$pass.log"
      continue
    fi
    (cd /tmp && PYTHONPATH=/tmp/pkg-$name timeout -k 5 ${BENCH_TIMEOUT:-300} python3 -m warpattn.bench_fp8 \
      --out "/tmp/ab-$name-$pass" --tag "$name" "$@" > "/tmp/ab-$name-$pass.log" 2>&1)
    echo "$name pass $pass rc=$?"
    cp /tmp/ab-$name-$pass/*.md "$out/$name-pass$pass.md" 2>/dev/null &&
      grep -E "^\| [0-9]" "$out/$name-pass$pass.md" || tail -5 "/tmp/ab-$name-$pass.log"
  done
done
[ -n "${SKIP_TESTS:-}" ] && exit 0  # (built with $TESTS, run by a later call)
for v in ${TEST_VARIANTS:-$VARIANTS}; do  # TEST_VARIANTS: only these run the tests
  name=$(name_of "$v")
  for t in ${TESTS:-}; do
    bin=${t%%:*} filter=${t#*:}
    [ "$filter" = "$t" ] && filter=
    log="$out/$name-$bin${filter:+-$filter}.log"  # one per test entry, also for one binary
    timeout -k 5 ${TEST_TIMEOUT:-300} "./$(dir_of "$v")/$bin" $filter > "$log" 2>&1
    echo "$name $bin $filter rc=$?: $(tail -1 "$log")"
    grep -E "FAIL|RMSE|ratio|per tensor /|64K" "$log" | head -${TEST_LINES:-30}
  done
done
