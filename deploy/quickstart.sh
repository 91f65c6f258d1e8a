#!/usr/bin/env bash
# The two Quick start commands (README):
#   deploy/quickstart.sh demo   build, start a local cluster, train a small GPT on built-in data
#   deploy/quickstart.sh test   build and run the whole test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc 2>/dev/null || echo 2)

build() { # build DIR [cmake args...]
  local dir=$1; shift
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

case "${1:-}" in
demo)
  deploy/install-deps.sh build
  # Only what the demo runs (with the GPU module where CUDA is installed): not the tests
  # and benchmarks, most of a full build.
  cmake -S "$root" -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j "$jobs" --target coordinatord workerd chorus-rank chorusctl
  exec deploy/demo.sh build
  ;;
test)
  deploy/install-deps.sh test
  build build -DCHORUS_WERROR=ON
  (cd build && ctest --output-on-failure -j 1 --timeout 900)
  # Unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
  build build-asan -DCHORUS_WERROR=ON -DCHORUS_SANITIZE=address,undefined -DCHORUS_CUDA=OFF
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L unit -j 1 --timeout 900)
  # That build has no CUDA: its workerd must refuse --device cuda with the reason.
  (cd build-asan && ctest --output-on-failure -R '^integration.test_cluster$' --timeout 300)
  ;;
*)
  echo "usage: $0 demo|test" >&2
  exit 2
  ;;
esac
