#!/usr/bin/env bash
# An A/B of compile-time variants whose builds cost no device time: the libraries are built on
# the dev machine (no GPU needed) and carried to the GPU host packed, where the call only times
# them (run 218: a 2-variant, 8-point, 3-pass backward A/B in 142 s of device wall time, against
# ~300 s for scripts/ab_fp8.sh, which builds there). Through the C ABI (benchmarks that take a
# library path: bench_backward.py --lib; the CLI of a build is not packed), or with PY (below)
# through the Python package.
#
# Here (2 cores: ~3 min a variant, CMake target `warpattn` only):
#   VARIANTS="base= ert=-DWARPATTN_TUNE_BWD_EARLY_ROW_TERMS=1" bash scripts/ab_local.sh build
# builds each NAME=FLAGS (FLAGS: CMAKE_CUDA_FLAGS, comma-separated for several; empty for the code
# as it is) in build-ab-NAME and packs the libraries into build-ab-pack/libs.tar.xz (against the
# device call's 64 MiB of carried paths, the tree included). On the GPU host (the
# device tool's `run`, carry ["build-ab-pack"]):
#   PASSES=3 AB_BENCH='python3 python/warpattn/bench_backward.py --lib $LIB --d 128 --passes 1' \
#     bash scripts/ab_local.sh run
# unpacks them and runs AB_BENCH once per variant per pass, variants alternating within each pass
# (the card's clock drifts over minutes), with $LIB the variant's libwarpattn.so; each run's log
# is $OUT/NAME-passK.log and its last AB_LINES (8) lines are printed.
# PY=<python3.12> with build: each variant is also built as the Python package for the GPU host's
# Python (3.12: the nanobind module is per minor version; `$PY -m pip install nanobind` first),
# staged as build-ab-pkgs/pkg-NAME/warpattn (packed into libs.tar.xz, unpacked there on the host),
# the module finding its library beside it ($ORIGIN);
# AB_BENCH then has $PKG, the folder to put on PYTHONPATH, e.g.
#   AB_BENCH='cd /tmp && PYTHONPATH=$PKG python3 $OLDPWD/scripts/decode_breakdown.py --points b8_4k'
# TEST_VARIANTS="NAME ..." (with PY): those variants are built with their GPU tests too (TESTS,
# default test_gpu_kvcache test_gpu_batch_invariant), staged as build-ab-pkgs/tests-NAME, to run
# on the host against the variant's library:
#   LD_LIBRARY_PATH=$PWD/build-ab-pkgs/pkg-NAME/warpattn:/usr/local/cuda/lib64 build-ab-pkgs/tests-NAME/test_gpu_kvcache
# The pack is xz-compressed (libs.tar.xz: ~4 MB a variant against gzip's ~11).
set -u -o pipefail
pack=${PACK:-build-ab-pack}
case "${1:-}" in
  build)
    mkdir -p "$pack" && : > "$pack/names"
    python_flags=(-DWARPATTN_BUILD_PYTHON=OFF) target=warpattn
    if [ -n "${PY:-}" ]; then
      python_flags=(-DWARPATTN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY" -DWARPATTN_JAX_FFI=OFF
                    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON)
      target=_warpattn
    fi
    for v in ${VARIANTS:?NAME=FLAGS ...}; do
      name=${v%%=*} flags=${v#*=}
      tests=OFF targets=$target
      case " ${TEST_VARIANTS:-} " in *" $name "*)
        tests=ON targets="$target ${TESTS:-test_gpu_kvcache test_gpu_batch_invariant}" ;; esac
      if ! { cmake -S . -B "build-ab-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release "${python_flags[@]}" \
               -DWARPATTN_BUILD_TESTS=$tests -DCMAKE_CUDA_FLAGS="${flags//,/ }" &&
             cmake --build "build-ab-$name" --target $targets -j"$(nproc)"; } > "/tmp/build-ab-$name.log" 2>&1; then
        echo "$name: build failed (/tmp/build-ab-$name.log)"; grep -E "error" "/tmp/build-ab-$name.log" | head; exit 1
      fi
      spills=$(grep -E "bytes spill" "/tmp/build-ab-$name.log" | grep -vc " 0 bytes spill stores, 0 bytes spill loads")
      echo "$name built: $spills kernels with spills, C75xx: $(grep -c "C75[0-9][0-9]" "/tmp/build-ab-$name.log")"
      echo "$name" >> "$pack/names"
      if [ -n "${PY:-}" ]; then
        rm -rf "build-ab-pkgs/pkg-$name" && mkdir -p "build-ab-pkgs/pkg-$name/warpattn"
        cp "build-ab-$name"/_warpattn*.so "build-ab-$name/libwarpattn.so" "build-ab-pkgs/pkg-$name/warpattn/"
        if [ $tests = ON ]; then
          rm -rf "build-ab-pkgs/tests-$name" && mkdir -p "build-ab-pkgs/tests-$name"
          for t in ${TESTS:-test_gpu_kvcache test_gpu_batch_invariant}; do cp "build-ab-$name/$t" "build-ab-pkgs/tests-$name/"; done
        fi
      fi
    done
    # (with PY the packages hold the libraries: not packed twice; their Python files come from
    # the tree on the host, `run` copies them in)
    if [ -n "${PY:-}" ]; then packed=$(sed "s|.*|build-ab-pkgs/pkg-&|" "$pack/names"); else
      packed=$(sed 's|.*|build-ab-&/libwarpattn.so|' "$pack/names"); fi
    for name in ${TEST_VARIANTS:-}; do packed="$packed build-ab-pkgs/tests-$name"; done
    XZ_OPT="-6 -T$(nproc)" tar cJf "$pack/libs.tar.xz" $packed "$pack/names"
    ls -la "$pack/libs.tar.xz" ;;
  run)
    OUT=${OUT:-gpu-out}
    mkdir -p "$OUT"
    tar xJf "$pack/libs.tar.xz" || exit 1
    # (the packages' Python from this tree: only their compiled parts come from the pack)
    for d in build-ab-pkgs/pkg-*/warpattn; do [ -d "$d" ] && cp python/warpattn/*.py "$d/"; done
    nvidia-smi --query-gpu=name,power.limit --format=csv,noheader 2>/dev/null || true
    for pass in $(seq 1 "${PASSES:-3}"); do
      for name in $(cat "$pack/names"); do
        lib=build-ab-$name/libwarpattn.so
        [ -d "build-ab-pkgs/pkg-$name" ] && lib=build-ab-pkgs/pkg-$name/warpattn/libwarpattn.so
        LIB=$lib PKG=$PWD/build-ab-pkgs/pkg-$name timeout -k 5 "${BENCH_TIMEOUT:-120}" \
          bash -c "${AB_BENCH:?a command using \$LIB or \$PKG}" \
          > "$OUT/$name-pass$pass.log" 2>&1
        echo "$name pass $pass rc=$?"
        tail -"${AB_LINES:-8}" "$OUT/$name-pass$pass.log"
      done
    done ;;
  *) echo "usage: VARIANTS=... $0 build | PASSES=.. AB_BENCH=.. $0 run"; exit 2 ;;
esac
