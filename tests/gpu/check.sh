#!/usr/bin/env bash
# The one prepared device check: build the GPU targets, run every GPU test and the GPU
# benchmarks, print the RESULT lines. Everything runs under `timeout` against one deadline,
# so the script ends within CHECK_BUDGET seconds (default 450, under 8 minutes) with its
# summary. What runs: the CUDA kernels against the CPU kernels; the engine on CUDA against
# the CPU (20 trainer steps fp32, 20 steps tf32, 20 bf16 against the CPU emulation,
# checkpoints both ways); a tp 2 x pp 2 job of
# four ranks on one GPU (host-staged collectives) against its CPU run; diag on the GPU;
# NCCL; an end-to-end local cluster job on train.device = cuda to completion; the
# benchmarks (chorus-bench-engine --device cuda against cuBLAS and PyTorch eager/compile, at
# tf32 and at bf16 against autocast bf16).
#
#   tests/gpu/check.sh                 build in build-gpu/ and run (a machine with -dev packages)
#   tests/gpu/check.sh --pack DIR      build here (CHORUS_PACK_NOBUILD=1: take $CHORUS_GPU_BUILD
#                                      as built), gather the programs and every shared library
#                                      they need except the driver, the CUDA runtime, cuBLAS(Lt)
#                                      and NCCL (the device has its own, matching its driver),
#                                      check that nothing else is missing, and write
#                                      DIR/chorus-gpu-bundle.tar.xz
#   tests/gpu/check.sh --bundle DIR    unpack that and run its programs instead of building:
#                                      CUDA and NCCL are taken from the toolkit's folder or the
#                                      Python wheels' (site-packages/nvidia/*/lib)
#   tests/gpu/check.sh --verify TREE   the self-containment check alone, on an unpacked tree
#
# Exit status: 0 all passed; 1 a build, test or benchmark failed; 2 no GPU visible; 3 out of
# time. Output also goes to $OUT/gpu-check.log when OUT is set.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${CHORUS_GPU_BUILD:-$ROOT/build-gpu}
BUDGET=${CHECK_BUDGET:-450}
JOBS=${JOBS:-$(nproc)}
MODE=build
DIR=
case "${1:-}" in
--pack) MODE=pack DIR=${2:?--pack needs a directory} ;;
--bundle) MODE=bundle DIR=${2:?--bundle needs a directory} ;;
--verify) MODE=verify DIR=${2:?--verify needs a directory} ;;
"") ;;
*) echo "usage: $0 [--pack DIR | --bundle DIR | --verify TREE]" >&2; exit 1 ;;
esac
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    exec > >(tee "$OUT/gpu-check.log") 2>&1
fi

# the GPU tests: kernels, the engine on the CUDA backend, diag on a GPU, NCCL collectives
TESTS="test_kernels_cuda test_model_cuda test_staged_cuda test_diag_cuda test_coll"
# the end-to-end run: a local cluster whose node has a GPU trains on train.device = cuda
DAEMONS="chorusctl coordinatord workerd chorus-rank"
# what the bundle may leave to the machine: the C library's parts, the driver, the CUDA
# runtime, cuBLAS(Lt) and NCCL
ALLOWED='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]+)\.so(\.[0-9]+)*$'
BUNDLE_TAR=chorus-gpu-bundle.tar.xz
STATUS=0
RESULTS=$(mktemp)
UNPACKED=
trap 'rm -f "$RESULTS"; [ -z "$UNPACKED" ] || rm -rf "$UNPACKED"' EXIT

say() { echo "== check.sh [${SECONDS}s] $*"; }
# the RESULT lines so far, then the end: also when the deadline stops the check early
summary() {
    say "summary (status $1)"
    grep '^RESULT ' "$RESULTS" 2>/dev/null || true
    exit "$1"
}
die() { say "FAIL: $2"; summary "$1"; }

# run SECONDS_MAX CMD...: under timeout, capped by what is left of the budget (30 s kept for
# the summary); a timeout counts as a failure and is named.
run() {
    local cap=$1 left
    shift
    left=$((BUDGET - SECONDS - 30))
    [ "$left" -gt 10 ] || die 3 "out of time before: $*"
    [ "$cap" -lt "$left" ] || cap=$left
    timeout -k 10 "$cap" "$@"
    local rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        say "TIMEOUT after ${cap}s: $*"
    fi
    return $rc
}

build() {
    say "configure ($BUILD, CUDA on, warnings as errors)"
    mkdir -p "$BUILD"
    run 180 cmake -S "$ROOT" -B "$BUILD" -DCHORUS_WERROR=ON -DCHORUS_CUDA=ON \
        >"$BUILD/check-configure.log" 2>&1 || {
        tail -n 30 "$BUILD/check-configure.log"
        die 1 "configure failed (missing -dev packages? see --pack/--bundle)"
    }
    grep -q "GPU backend (CUDA + NCCL): ON" "$BUILD/check-configure.log" ||
        die 1 "CUDA toolkit, NCCL or nvcc not found: the GPU targets are not built"
    say "build $TESTS, the daemons, chorus-bench-kernels-cuda chorus-bench-engine (-j$JOBS)"
    # shellcheck disable=SC2086
    run 300 cmake --build "$BUILD" -j "$JOBS" --target $TESTS chorus_engine_cuda \
        chorus-bench-kernels-cuda chorus-bench-engine $DAEMONS >"$BUILD/check-build.log" 2>&1 || {
        grep -E "error|Error" "$BUILD/check-build.log" | head -n 30
        die 1 "build failed"
    }
    BIN_TESTS=$BUILD/tests
    BIN_BENCH=$BUILD/bin
    # the tests are not next to the engine's CUDA module in a build tree
    export CHORUS_CUDA_MODULE=$BUILD/bin/libchorus_engine_cuda.so
}

# Directories holding CUDA's and NCCL's shared libraries on this machine (toolkit, distro,
# or the Python wheels' nvidia/*/lib), for the loader.
cuda_lib_path() {
    local d p=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 \
        $(python3 -c 'import glob, site
print("\n".join(d for s in site.getsitepackages() for d in sorted(glob.glob(s + "/nvidia/*/lib"))))' \
            2>/dev/null); do
        [ -d "$d" ] && p="$p:$d"
    done
    echo "${p#:}"
}

# verify TREE: every ELF file under TREE needs only libraries in TREE/lib or allowed ones.
verify() {
    local tree=$1 f lib bad=0
    while IFS= read -r f; do
        head -c 4 "$f" | grep -q 'ELF' || continue
        for lib in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            if [ ! -e "$tree/lib/$lib" ] && ! echo "$lib" | grep -Eq "$ALLOWED"; then
                echo "  ${f#"$tree"/} needs $lib: not in the bundle and not allowed"
                bad=1
            fi
        done
    done < <(find "$tree" -type f)
    return $bad
}

# the UCX transport modules UCX loads at run time (shared memory: cma); ib and rdmacm need
# libraries a GPU test machine may not have and the same-host collectives do not use
ucx_modules() {
    local d
    d=$(dirname "$(ldd "$1" | awk '/libuct\.so/{print $3}')")/ucx
    ls "$d"/libuct_cma.so.0 2>/dev/null
}

pack() {
    if [ "${CHORUS_PACK_NOBUILD:-0}" = 1 ]; then
        BIN_TESTS=$BUILD/tests
        BIN_BENCH=$BUILD/bin
    else
        build
    fi
    local tree
    tree=$(mktemp -d "${TMPDIR:-/tmp}/chorus-pack.XXXXXX")
    say "pack into $DIR (staging $tree)"
    mkdir -p "$tree/bin" "$tree/lib/ucx" "$DIR"
    for t in $TESTS; do cp "$BIN_TESTS/$t" "$tree/bin/" || die 1 "missing $BIN_TESTS/$t"; done
    # the engine's CUDA backend module: found next to the programs
    cp "$BIN_BENCH/chorus-bench-kernels-cuda" "$BIN_BENCH/chorus-bench-engine" \
        "$BUILD/bin/libchorus_engine_cuda.so" "$ROOT/tests/bench/torch_gpu.py" \
        "$ROOT/tests/bench/torch_engine.py" "$tree/bin/" || die 1 "missing a benchmark"
    for d in $DAEMONS; do cp "$BUILD/bin/$d" "$tree/bin/" || die 1 "missing $d"; done
    # every shared library they load except the allowed ones, and UCX's modules
    ucx_modules "$tree/bin/chorus-rank" | while read -r lib; do cp -L "$lib" "$tree/lib/ucx/"; done
    ldd "$tree"/bin/* "$tree"/lib/ucx/* 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
        while read -r lib; do
            echo "$(basename "$lib")" | grep -Eq "$ALLOWED" || cp -L "$lib" "$tree/lib/"
        done
    # the copies lose their debugging sections (a third of the size)
    find "$tree" -type f -name '*.so*' -o -type f -perm -u+x | while read -r f; do
        head -c 4 "$f" | grep -q 'ELF' && strip --strip-debug "$f"
    done
    verify "$tree" || die 1 "the bundle is not self-contained (above)"
    du -sh "$tree"
    # xz on every core (blocks compressed in parallel; any xz or Python's lzma unpacks them)
    XZ_OPT=${XZ_OPT:--T0} tar -C "$tree" -cJf "$DIR/$BUNDLE_TAR" . || die 1 "tar failed"
    rm -rf "$tree"
    say "packed: $(du -h "$DIR/$BUNDLE_TAR" | cut -f1) in $DIR/$BUNDLE_TAR; on the device:" \
        "tests/gpu/check.sh --bundle $DIR"
    exit 0
}

# unpack DIR's bundle under TMPDIR; BIN_TESTS, BIN_BENCH, the loader's and UCX's paths
unpack() {
    [ -f "$DIR/$BUNDLE_TAR" ] || die 1 "no bundle at $DIR (make one with --pack)"
    UNPACKED=$(mktemp -d "${TMPDIR:-/tmp}/chorus-bundle.XXXXXX")
    # xz through tar, or through Python where tar has no xz
    tar -C "$UNPACKED" -xJf "$DIR/$BUNDLE_TAR" 2>/dev/null ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$DIR/$BUNDLE_TAR" "$UNPACKED" || die 1 "cannot unpack $DIR/$BUNDLE_TAR"
    BIN_TESTS=$UNPACKED/bin
    BIN_BENCH=$UNPACKED/bin
    export LD_LIBRARY_PATH="$UNPACKED/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export UCX_MODULE_DIR=$UNPACKED/lib/ucx
}

# every program of the bundle finds every library (CUDA and NCCL from the machine)
preflight() {
    local f missing
    for f in "$BIN_TESTS"/*; do
        head -c 4 "$f" | grep -q 'ELF' || continue
        missing=$(ldd "$f" 2>&1 | grep -E 'not found|too short|wrong ELF' || true)
        if [ -n "$missing" ]; then
            echo "  $(basename "$f"): $missing"
            STATUS=1
        fi
    done
    [ $STATUS -eq 0 ] || die 1 "libraries missing on this machine (above)"
    say "every program of the bundle finds its libraries"
}

gpu_visible() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        say "nvidia-smi not found"
        return 1
    fi
    local list
    list=$(run 30 nvidia-smi -L 2>&1) || { echo "$list"; return 1; }
    echo "$list"
    echo "$list" | grep -q '^GPU '
}

# ----------------------------------------------------------------------------

say "start: budget ${BUDGET}s, mode $MODE"
case $MODE in
pack) pack ;;
verify)
    verify "$DIR" || die 1 "not self-contained"
    say "self-contained: $DIR"
    exit 0
    ;;
build) build ;;
bundle) unpack ;;
esac
CUDA_PATHS=$(cuda_lib_path)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDA_PATHS"
say "CUDA and NCCL from: ${CUDA_PATHS:-nowhere found}"
[ "$MODE" != bundle ] || preflight

say "GPU"
gpu_visible || die 2 "no GPU visible on this machine: nothing to check (the build above is all that ran)"

# A Criterion program that must pass with nothing skipped: a skip here means the GPU went
# unseen by the test, which is a failure of the check.
criterion_run() {
    local name=$1 cap=$2 log
    shift 2
    log=$(mktemp)
    say "test $name"
    run "$cap" "$@" --jobs 1 --verbose >"$log" 2>&1
    local rc=$?
    grep -E "^\[(----|FAIL|SKIP|====)\]|Skipp|Synthesis" "$log" | tail -n 40
    grep '^RESULT ' "$log" >>"$RESULTS"
    if [ $rc -ne 0 ]; then
        tail -n 20 "$log"
        say "FAILED: $name (exit $rc)"
        STATUS=1
    elif grep -q "^\[SKIP\]" "$log"; then
        say "FAILED: $name skipped tests on a GPU machine"
        STATUS=1
    fi
    rm -f "$log"
}

criterion_run "CUDA kernels vs CPU" 150 "$BIN_TESTS/test_kernels_cuda"
# test_model_cuda: the backend's table entries, the model, 20 steps through the model API
# and through the trainer, checkpoints GPU -> CPU and CPU -> GPU
criterion_run "the engine on CUDA vs CPU (table, model, 20 steps, trainer, checkpoints)" 150 \
    "$BIN_TESTS/test_model_cuda"
# 20 steps at tf32 against the CPU, 20 at bf16 against the CPU's emulation of bf16, and
# tp 2 x pp 2 as four ranks on this one GPU
criterion_run "tf32 and bf16 steps; tp2 x pp2 on one GPU (host-staged collectives) vs CPU" 150 \
    "$BIN_TESTS/test_staged_cuda"
criterion_run "diag on a GPU (cuBLAS GEMM, NCCL)" 60 "$BIN_TESTS/test_diag_cuda" \
    --filter 'diag_gpu/*'
criterion_run "NCCL collectives, one rank per GPU" 120 "$BIN_TESTS/test_coll" \
    --filter 'coll/nccl_one_rank_per_gpu'

say "benchmark chorus-bench-kernels-cuda"
run 150 "$BIN_BENCH/chorus-bench-kernels-cuda" | tee -a "$RESULTS"
rc=$?
if [ $rc -ne 0 ]; then
    say "FAILED: benchmark (exit $rc)"
    STATUS=1
fi

# The engine benchmark on the GPU (issue 13: GPT-2 124M, tokens/s and MFU), once
# chorus-bench-engine takes --device cuda.
if grep -q -- '"--device"' "$ROOT/tests/bench/bench_engine.c" && [ -x "$BIN_BENCH/chorus-bench-engine" ]; then
    say "benchmark chorus-bench-engine --device cuda"
    # tf32 (the goals' precision): Chorus against cuBLAS's GEMM and PyTorch eager/compile
    run 200 "$BIN_BENCH/chorus-bench-engine" --device cuda --precision tf32 | tee -a "$RESULTS" || {
        say "FAILED: chorus-bench-engine --device cuda"
        STATUS=1
    }
    # bf16 (issue 23): Chorus's mixed precision against cuBLASLt's bf16 GEMM and PyTorch
    # autocast bf16, eager and compile
    if grep -q -- '"bf16"' "$ROOT/tests/bench/bench_engine.c"; then
        run 200 "$BIN_BENCH/chorus-bench-engine" --device cuda --precision bf16 | tee -a "$RESULTS" || {
            say "FAILED: chorus-bench-engine --device cuda --precision bf16"
            STATUS=1
        }
    fi
else
    say "chorus-bench-engine --device cuda not run: the benchmark has no --device flag yet"
fi

# End to end: `chorusctl local up --device cuda` (one node, one GPU slot), the demo model
# submitted on train.device = cuda (one rank: tp and pp 1), run to completion with
# checkpoints (the GPU rank's accuracy is evaluated from them); the rank's log must say it
# computed on the GPU.
e2e() {
    local dir ctl=$BIN_BENCH/chorusctl id rc
    dir=$(mktemp -d "${TMPDIR:-/tmp}/chorus-gpu-e2e.XXXXXX")
    say "end to end: local cluster on the GPU, demo job on train.device = cuda"
    run 30 "$ctl" local up --dir "$dir" --nodes 1 --slots 1 --device cuda || {
        say "FAILED: local up --device cuda"
        tail -n 20 "$dir"/*.log 2>/dev/null
        STATUS=1
        return
    }
    export CHORUS_SOCKET=$dir/ctl.sock
    id=$(run 10 "$ctl" submit "$ROOT/deploy/jobs/demo.ini" --set train.device=cuda \
        --set parallel.tp=1 --set parallel.pp=1 --set train.steps=1500 \
        --set checkpoint.every=500 --set "checkpoint.dir=$dir/checkpoints")
    rc=$?
    if [ $rc -eq 0 ]; then
        run 120 "$ctl" watch "$id" | tail -n 3
        rc=${PIPESTATUS[0]}
    fi
    "$ctl" status "$id" 2>&1 | head -n 20
    "$ctl" logs "$id" --rank 0 2>/dev/null | grep -E "computing on GPU|accuracy=" | tail -n 4
    if [ $rc -ne 0 ] || ! "$ctl" logs "$id" --rank 0 2>/dev/null | grep -q "computing on GPU"; then
        say "FAILED: the cuda job (exit $rc); rank 0's last lines:"
        "$ctl" logs "$id" --rank 0 2>/dev/null | tail -n 20
        STATUS=1
    else
        echo "RESULT name=e2e_cuda_demo value=1 unit=completed"
        echo "RESULT name=e2e_cuda_demo value=1 unit=completed" >>"$RESULTS"
    fi
    "$ctl" local down --dir "$dir" >/dev/null 2>&1
    unset CHORUS_SOCKET
    rm -rf "$dir"
}
if [ -x "$BIN_BENCH/chorusctl" ]; then
    e2e
else
    say "end to end not run: no chorusctl in $BIN_BENCH"
fi

# Last, as the least needed: the materialised attention (CHORUS_CUDA_ATTENTION=materialised,
# the opt-out of the fused default) on the same 20 trainer steps against the CPU, and its
# speed at tf32 beside the fused one's above.
if [ $((BUDGET - SECONDS)) -gt 180 ]; then
    CHORUS_CUDA_ATTENTION=materialised criterion_run \
        "materialised attention: 20 trainer steps vs CPU" \
        90 "$BIN_TESTS/test_model_cuda" --filter 'model_cuda/twenty_trainer_steps*'
    say "benchmark chorus-bench-engine --device cuda, materialised attention"
    CHORUS_CUDA_ATTENTION=materialised run 120 "$BIN_BENCH/chorus-bench-engine" --device cuda \
        --precision tf32 --no-torch | tee -a "$RESULTS" || {
        say "FAILED: chorus-bench-engine with the materialised attention"
        STATUS=1
    }
else
    say "materialised attention not checked: $((BUDGET - SECONDS)) s left"
fi

summary $STATUS
