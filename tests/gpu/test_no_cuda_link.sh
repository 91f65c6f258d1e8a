#!/usr/bin/env bash
# CI on a CUDA build, no GPU needed: the GPU libraries are loaded one way, on demand.
#   1. chorus-rank, workerd, coordinatord and chorusctl load none of libcudart, libnccl,
#      libcublas(Lt) at start: ldd's whole output (what the loader would map, transitively)
#      and their own NEEDED entries name none of them. The same check on
#      libchorus_engine_cuda.so must find them (the check can see what it looks for).
#   2. No binary keeps this build's folder where a search could use it: not in its
#      RPATH/RUNPATH, not in its read-only data (.rodata: the strings a search is built
#      from; debugging sections may name the build and are not searched).
#   3. The engine's CUDA module is found by a program in the build tree (bin/), in an
#      installed prefix (bin/ + lib/), through $CHORUS_CUDA_MODULE, and not when it is absent
#      (the negative control): chorus-bench-engine --device cuda logs "no CUDA backend" when
#      it did not load the module, else stops at "no GPU visible" (none is: the run hides them).
# usage: test_no_cuda_link.sh BUILD_DIR
set -u
BUILD=${1:?usage: $0 BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd -P)
BIN=$BUILD/bin
TMP=$(mktemp -d "${TMPDIR:-/tmp}/chorus-nolink.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
GPU_LIBS='lib(cudart|nccl|cublas|cublasLt)\.so'
STATUS=0
fail() {
    echo "FAIL: $*"
    STATUS=1
}

# the GPU libraries FILE would load at start; ldd's and readelf's whole outputs are kept
# in files first, so no early exit of a reader (grep -q) can turn a hit into a miss
gpu_libs_of() {
    ldd "$1" >"$TMP/ldd.out" 2>&1 || {
        echo "ldd failed on $1:" >&2
        cat "$TMP/ldd.out" >&2
        return 2
    }
    readelf -d "$1" >"$TMP/dyn.out" 2>&1 || return 2
    grep -Eo "$GPU_LIBS[.0-9]*" "$TMP/ldd.out" "$TMP/dyn.out" | sed 's/^[^:]*://' | sort -u
}

for p in chorus-rank workerd coordinatord chorusctl; do
    [ -x "$BIN/$p" ] || { fail "$BIN/$p not built"; continue; }
    found=$(gpu_libs_of "$BIN/$p") || { fail "cannot read $p"; continue; }
    if [ -n "$found" ]; then
        fail "$p loads $(echo "$found" | tr '\n' ' ')at start"
    else
        echo "ok: $p loads no GPU library at start"
    fi
done
found=$(gpu_libs_of "$BIN/libchorus_engine_cuda.so") || fail "cannot read the CUDA module"
echo "$found" | grep -q libcudart || fail "the check sees no libcudart in the CUDA module"

for p in chorus-rank chorus-bench-engine libchorus_engine_cuda.so; do
    f=$BIN/$p
    readelf -d "$f" >"$TMP/dyn.out" 2>&1 || { fail "readelf $p"; continue; }
    if grep -E 'RPATH|RUNPATH' "$TMP/dyn.out" | grep -F "$BUILD" >"$TMP/hit.out"; then
        fail "$p: the build folder in its search path: $(cat "$TMP/hit.out")"
    fi
    objcopy -O binary --only-section=.rodata "$f" "$TMP/rodata.bin" 2>/dev/null ||
        { fail "objcopy $p"; continue; }
    # A source file's name (__FILE__ of a generated source such as proto/chorus.pb-c.c, in
    # an assertion's message) names the build but is never searched: only other strings
    # count.
    if strings -n 8 "$TMP/rodata.bin" | grep -F "$BUILD" |
        grep -Ev '\.(c|h|cc|cpp|cu|cuh)$' >"$TMP/hit.out"; then
        fail "$p: the build folder in its strings: $(head -n 3 "$TMP/hit.out")"
    else
        echo "ok: $p keeps no path of $BUILD for a search"
    fi
done

# probe PROGRAM [ENV...]: "found", "absent" or "other: ..." from one run without a GPU
probe() {
    local prog=$1
    shift
    env CUDA_VISIBLE_DEVICES= "$@" "$prog" --device cuda >"$TMP/probe.out" 2>&1
    if grep -q 'no CUDA backend' "$TMP/probe.out"; then
        echo absent
    elif grep -Eq 'no GPU visible|the CUDA runtime failed' "$TMP/probe.out"; then
        echo found
    else
        echo "other: $(tail -n 3 "$TMP/probe.out" | tr '\n' ' ')"
    fi
}
expect() {
    local want=$1 what=$2 got
    shift 2
    got=$(probe "$@")
    if [ "$got" = "$want" ]; then
        echo "ok: $what: module $want"
    else
        fail "$what: module $got, want $want"
    fi
}
mkdir -p "$TMP/prefix/bin" "$TMP/prefix/lib" "$TMP/alone"
cp "$BIN/chorus-bench-engine" "$TMP/prefix/bin/"
cp "$BIN/libchorus_engine_cuda.so" "$TMP/prefix/lib/"
cp "$BIN/chorus-bench-engine" "$TMP/alone/"
expect found "build tree" "$BIN/chorus-bench-engine"
expect found "installed prefix (bin/, lib/)" "$TMP/prefix/bin/chorus-bench-engine"
expect absent "a program without the module (control)" "$TMP/alone/chorus-bench-engine"
expect found "\$CHORUS_CUDA_MODULE" "$TMP/alone/chorus-bench-engine" \
    CHORUS_CUDA_MODULE="$TMP/prefix/lib/libchorus_engine_cuda.so"
exit $STATUS
