#!/usr/bin/env bash
# CI on a CUDA build, no GPU needed: the device check's bundle (check.sh --pack) carries every
# library its programs need but the driver, the CUDA runtime, cuBLAS(Lt) and NCCL, and runs
# on a machine that has none of this project's libraries.
#   1. check.sh --pack from this build (CHORUS_PACK_NOBUILD=1); --pack itself fails when an
#      ELF file of the bundle needs a library that is neither inside nor allowed; its size;
#   2. the same check again (--verify) on the unpacked tree, and a planted violation caught;
#   3. the rehearsal: in a private mount namespace every system copy of a library the bundle
#      carries (but the base ones below) is hidden (/dev/null bound over it) and UCX's module
#      folder emptied; then
#      check.sh --bundle must find all its libraries and stop at "no GPU visible" (exit 2),
#      as it would on a bare GPU machine whose GPU had vanished.
# Exit 77 (skipped) where mount namespaces are not allowed, for step 3 only.
# usage: test_bundle.sh BUILD_DIR
set -u -o pipefail
BUILD=${1:?usage: $0 BUILD_DIR}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CHECK=$ROOT/tests/gpu/check.sh
TMP=$(mktemp -d "${TMPDIR:-/tmp}/chorus-bundle-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

CHORUS_PACK_NOBUILD=1 CHORUS_GPU_BUILD=$BUILD "$CHECK" --pack "$TMP/out" || fail "pack"
TAR=$TMP/out/chorus-gpu-bundle.tar.xz
bytes=$(stat -c %s "$TAR")
echo "RESULT name=gpu_bundle_size value=$((bytes / 1024 / 1024)) unit=MiB bytes=$bytes"
[ "$bytes" -le $((64 * 1024 * 1024)) ] || fail "bundle of $bytes bytes cannot travel (64 MiB)"

mkdir -p "$TMP/tree"
tar -C "$TMP/tree" -xJf "$TAR" || fail "unpack"
"$CHECK" --verify "$TMP/tree" || fail "verify"
echo "  bundled libraries: $(ls "$TMP/tree/lib" | grep -v '^ucx$' | tr '\n' ' ')"
# a planted violation: a program needing a library the bundle lacks must be caught
victim=$(ls "$TMP/tree/lib"/libcriterion.so* | head -n 1)
[ -n "$victim" ] || fail "Criterion's library is not in the bundle (the tests need it)"
mv "$victim" "$TMP/hidden.so"
if "$CHECK" --verify "$TMP/tree" >/dev/null; then
    fail "--verify missed a missing $(basename "$victim")"
fi
mv "$TMP/hidden.so" "$victim"

if ! unshare -m true 2>/dev/null; then
    echo "SKIP: no mount namespace here: the hidden-libraries rehearsal did not run"
    exit 77
fi
LOG=$TMP/rehearsal.log
# Hidden: what the bundle carries except the base libraries every such image has and its own
# tools (tar, xz, python3) load; the bundle's copies of those are still the ones taken.
BASE='^(libz|libstdc\+\+|libgcc_s|libpcre2-8|libcrypto|libssl|libffi|libcom_err|libkeyutils|libkrb5|libkrb5support|libgssapi_krb5|libk5crypto|liblzma|libselinux)\.so'
LIBS=$(ls "$TMP/tree/lib" | grep -v '^ucx$' | grep -Ev "$BASE")
echo "  hidden in the rehearsal: $(echo $LIBS)"
# mount(8) itself loads some of the libraries hidden (libpcre2 through libselinux): it runs
# on copies of its own
mkdir -p "$TMP/mountlibs"
ldd "$(command -v mount)" | awk '/=> \//{print $3}' | xargs -I{} cp -L {} "$TMP/mountlibs/"
unshare -m bash -c '
    LD_LIBRARY_PATH=$4 mount --make-rprivate / || exit 90
    for name in $1; do
        for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/local/lib /lib64 /usr/lib64; do
            [ -f "$d/$name" ] && { LD_LIBRARY_PATH=$4 mount --bind /dev/null "$d/$name" || exit 90; }
        done
    done
    for d in /usr/lib/x86_64-linux-gnu/ucx /usr/lib64/ucx; do
        [ -d "$d" ] && { LD_LIBRARY_PATH=$4 mount -t tmpfs none "$d" || exit 90; }
    done
    # the proof that they are hidden: the system copy of UCX no longer loads
    [ ! -s /usr/lib/x86_64-linux-gnu/libucp.so.0 ] || exit 90
    exec env -u LD_LIBRARY_PATH PATH=/usr/bin:/bin CHECK_BUDGET=120 "$2" --bundle "$3"
' _ "$LIBS" "$CHECK" "$TMP/out" "$TMP/mountlibs" >"$LOG" 2>&1
rc=$?
cat "$LOG"
[ $rc -ne 90 ] || fail "mount namespace setup"
grep -q "every program of the bundle finds its libraries" "$LOG" ||
    fail "the bundle did not load with the system's libraries hidden"
[ $rc -eq 2 ] && grep -q "no GPU visible" "$LOG" ||
    fail "expected to stop at 'no GPU visible' (exit 2), got exit $rc"
echo "PASS: self-contained bundle; with the system's copies hidden it stops only at 'no GPU'"
