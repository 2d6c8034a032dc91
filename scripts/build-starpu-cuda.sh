#!/usr/bin/env bash
# Builds StarPU 1.3.10 with CUDA and StarPU-MPI from Debian's own source package
# (Debian's libstarpu-dev is built without CUDA).
#
# Usage: bash scripts/build-starpu-cuda.sh [PREFIX]
#   PREFIX  install prefix: the first argument, else $STARPU_CUDA_PREFIX, else
#           $PWD/build-starpu-cuda/prefix
#   STARPU_CUDA_WORKDIR  where the source is unpacked and built
#           (default: $PWD/build-starpu-cuda/work; wiped and re-made by every build)
#   CUDA_DIR  the CUDA toolkit (default /usr/local/cuda)
#
# Steps: add a deb-src entry for the Debian mirror and suite this machine already uses,
# apt-get update, apt-get source starpu, install the packages configure needs, mend the
# three things CUDA 13 removed (see mend_source below), configure, make -j$(nproc),
# make install. apt steps need root (or sudo).
#
# Idempotent: a finished build writes $PREFIX/.tessel-starpu-cuda.stamp with the source
# version, the mend set and the configure flags; a later run that finds the same stamp
# does nothing and says so. Delete the stamp (or the prefix) to rebuild.
#
# Then build against it with
#   PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig pkg-config --cflags --libs starpu-1.3 starpumpi-1.3
# plus -L$CUDA_DIR/lib64 -lcudart -lstdc++ (and -DDISABLE_CUSPARSE_DEPRECATED to silence
# cusparse.h).
set -euo pipefail

STARPU_VERSION=1.3.10
# Bump MEND_SET whenever mend_source changes: the stamp then no longer matches and the
# next run rebuilds.
MEND_SET="cuda13-v1: computeMode-attribute cublas-undef-guard cufft-removed-errors"

die() { echo "build-starpu-cuda: error: $*" >&2; exit 1; }
say() { echo "build-starpu-cuda: $*"; }

PREFIX="${1:-${STARPU_CUDA_PREFIX:-$PWD/build-starpu-cuda/prefix}}"
case "$PREFIX" in /*) ;; *) PREFIX="$PWD/$PREFIX" ;; esac
WORKDIR="${STARPU_CUDA_WORKDIR:-$PWD/build-starpu-cuda/work}"
case "$WORKDIR" in /*) ;; *) WORKDIR="$PWD/$WORKDIR" ;; esac
CUDA_DIR="${CUDA_DIR:-/usr/local/cuda}"
STAMP="$PREFIX/.tessel-starpu-cuda.stamp"

[ -x "$CUDA_DIR/bin/nvcc" ] || die "no nvcc at $CUDA_DIR/bin/nvcc (set CUDA_DIR to the CUDA toolkit)"
[ -f "$CUDA_DIR/include/cuda_runtime.h" ] || die "no $CUDA_DIR/include/cuda_runtime.h"
NVCC_VERSION="$("$CUDA_DIR/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
[ -n "$NVCC_VERSION" ] || die "cannot read the CUDA version from $CUDA_DIR/bin/nvcc --version"

CONFIGURE_FLAGS=(
    --prefix="$PREFIX"
    --enable-cuda --with-cuda-dir="$CUDA_DIR"
    --enable-mpi --with-mpicc=/usr/bin/mpicc
    --enable-maxcpus=64
    --disable-opencl --disable-fortran
    --disable-build-examples --disable-build-tests --disable-build-doc
    --disable-static
    # cusparse.h (CUDA 13) marks many types deprecated: tens of thousands of warnings.
    CPPFLAGS=-DDISABLE_CUSPARSE_DEPRECATED
)

stamp_text() {
    printf 'starpu %s (Debian source %s)\nmends: %s\ncuda: %s\nconfigure: %s\n' \
        "$STARPU_VERSION" "$1" "$MEND_SET" "$NVCC_VERSION" "${CONFIGURE_FLAGS[*]}"
}

# --- Already built? ---------------------------------------------------------------------
if [ -f "$STAMP" ] && [ -f "$PREFIX/lib/pkgconfig/starpu-1.3.pc" ] \
    && [ -f "$PREFIX/lib/pkgconfig/starpumpi-1.3.pc" ]; then
    have_version="$(sed -n 's/^starpu .*(Debian source \(.*\))$/\1/p' "$STAMP")"
    if [ -n "$have_version" ] && [ "$(stamp_text "$have_version")" = "$(cat "$STAMP")" ]; then
        say "already built in $PREFIX (stamp $STAMP matches: StarPU $have_version," \
            "mends $MEND_SET, CUDA $NVCC_VERSION); nothing to do"
        exit 0
    fi
    say "stamp $STAMP differs from this script's build; rebuilding"
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "need root or sudo for apt-get"
    sudo_cmd=(sudo)
fi

# --- deb-src for the mirror and suite already in use ------------------------------------
# The first Debian (non-security) entry of the machine's sources: deb822 files
# (*.sources, Debian 12's debian.sources) or one-line sources.list files.
find_debian_source() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && uris ~ /\/debian\/?( |$)/ && suites != "")
                    { split(uris, u, " "); split(suites, s, " "); print u[1], s[1]; found = 1; exit }
                types = uris = suites = ""
            }
            /^[ \t]*$/ { flush(); next }
            /^Types:/  { sub(/^Types:[ \t]*/, "");  types = $0 }
            /^URIs:/   { sub(/^URIs:[ \t]*/, "");   uris = $0 }
            /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
            END { if (!found) flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1 == "deb" {
                 i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                 if ($i ~ /\/debian\/?$/) { print $i, $(i + 1); exit }
             }' "$f"
    done
}

have_deb_src() {
    # Any deb-src line or deb822 stanza for the same mirror and suite counts.
    local uri="$1" suite="$2"
    grep -rqsE "^deb-src[[:space:]].*${uri//./\\.}/?[[:space:]]+${suite}([[:space:]]|$)" \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list && return 0
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v uri="$uri" -v suite="$suite" '
            function flush() {
                if (types ~ /deb-src/ && (" " uris " ") ~ (" " uri "/? ") && (" " suites " ") ~ (" " suite " "))
                    found = 1
                types = uris = suites = ""
            }
            /^[ \t]*$/ { flush(); next }
            /^Types:/  { sub(/^Types:[ \t]*/, "");  types = $0 }
            /^URIs:/   { sub(/^URIs:[ \t]*/, "");   uris = $0 }
            /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
            END { flush(); exit !found }
        ' "$f" && return 0
    done
    return 1
}

read -r MIRROR SUITE < <(find_debian_source | head -n 1) || true
[ -n "${MIRROR:-}" ] && [ -n "${SUITE:-}" ] \
    || die "no Debian mirror found in /etc/apt/sources.list or /etc/apt/sources.list.d/"
say "Debian mirror $MIRROR, suite $SUITE"

if have_deb_src "$MIRROR" "$SUITE"; then
    say "a deb-src entry for $MIRROR $SUITE exists"
else
    src_list=/etc/apt/sources.list.d/tessel-deb-src.sources
    say "adding $src_list (deb-src $MIRROR $SUITE main)"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    {
        echo "# Added by tessel's scripts/build-starpu-cuda.sh: Debian's source packages."
        echo "Types: deb-src"
        echo "URIs: $MIRROR"
        echo "Suites: $SUITE"
        echo "Components: main"
        [ -f "$keyring" ] && echo "Signed-By: $keyring"
    } | "${sudo_cmd[@]}" tee "$src_list" >/dev/null
fi

# --- Packages configure needs ------------------------------------------------------------
# build-essential brings dpkg-dev (apt-get source unpacks with dpkg-source); hwloc for the
# topology; Open MPI for StarPU-MPI (mpicc); libnuma for NUMA memory nodes. The rest of
# Debian's build-dep list (GL, FFTW, HDF5, GLPK, LevelDB, Fortran, OpenCL, doxygen) is for
# parts this build disables or does without.
packages=(build-essential pkg-config libhwloc-dev libopenmpi-dev openmpi-bin libnuma-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
done

say "apt-get update"
"${sudo_cmd[@]}" apt-get update -q >/dev/null || die "apt-get update failed"
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" \
        || die "apt-get install ${missing[*]} failed"
fi
[ -x /usr/bin/mpicc ] || die "no /usr/bin/mpicc after installing libopenmpi-dev (StarPU-MPI needs it)"

# --- Source ------------------------------------------------------------------------------
rm -rf "$WORKDIR"
mkdir -p "$WORKDIR"
cd "$WORKDIR"
say "apt-get source starpu (in $WORKDIR)"
apt-get source -q starpu >apt-source.log 2>&1 \
    || { cat apt-source.log >&2; die "apt-get source starpu failed (is the deb-src entry right?)"; }
dsc="$(ls starpu_*.dsc 2>/dev/null | head -n 1)"
[ -n "$dsc" ] || die "apt-get source left no starpu_*.dsc in $WORKDIR"
DEB_VERSION="$(sed -n 's/^Version: //p' "$dsc")"
case "$DEB_VERSION" in
    "$STARPU_VERSION"+*|"$STARPU_VERSION"-*) ;;
    *) die "Debian's source is StarPU $DEB_VERSION; this script mends $STARPU_VERSION" ;;
esac
SRC="$(find "$WORKDIR" -mindepth 1 -maxdepth 1 -type d -name 'starpu-*' | head -n 1)"
[ -n "$SRC" ] && [ -x "$SRC/configure" ] || die "no unpacked source with a configure script in $WORKDIR"
say "StarPU $DEB_VERSION unpacked in $SRC"

# --- Mends for CUDA 13 -------------------------------------------------------------------
# Each mend checks that it applied: a source that does not match fails here, loudly,
# rather than later in the compile.
mend() { # file, sed script, grep pattern that must be present afterwards, what it is
    local file="$SRC/$1"
    [ -f "$file" ] || die "mend '$4': no $1"
    sed -i "$2" "$file"
    grep -q "$3" "$file" || die "mend '$4' did not apply to $1 (source changed?)"
    say "mended $1: $4"
}

mend_source() {
    # 1. CUDA 13 removed cudaDeviceProp.computeMode: read the compute mode with
    #    cudaDeviceGetAttribute(cudaDevAttrComputeMode) instead (same values).
    mend src/drivers/cuda/driver_cuda.c \
        's|^\tif (props\[devid\]\.computeMode == cudaComputeModeExclusive)$|\t/* CUDA 13: no cudaDeviceProp.computeMode */\n\tint compute_mode = -1;\n\tcudaDeviceGetAttribute(\&compute_mode, cudaDevAttrComputeMode, devid);\n\tif (compute_mode == cudaComputeModeExclusive)|' \
        'cudaDevAttrComputeMode, devid' "computeMode via cudaDeviceGetAttribute"
    # 2. StarPU's cuBLAS helper uses the legacy API (cublas.h: cublasInit,
    #    cublasSetKernelStream) and handles (cublas_v2.h: cublasCreate, cublasSetStream).
    #    CUDA 13's cublas_v2.h stops with #error when cublas.h's guard CUBLAS_H_ is
    #    defined; both sit on cublas_api.h and compile together once the guard is
    #    dropped between them.
    mend src/drivers/cuda/starpu_cublas.c \
        's|^#include <cublas.h>$|#include <cublas.h>\n#undef CUBLAS_H_ /* CUDA 13: cublas_v2.h shares the guard */|' \
        '^#undef CUBLAS_H_' "#undef CUBLAS_H_ between cublas.h and cublas_v2.h"
    # 3. cuFFT 12 (CUDA 13) removed CUFFT_INCOMPLETE_PARAMETER_LIST and CUFFT_PARSE_ERROR:
    #    keep those two cases for older cuFFT only.
    mend starpufft/src/starpufftx.c \
        '/case CUFFT_INCOMPLETE_PARAMETER_LIST:/,/break;/{s/^\(\tcase CUFFT_INCOMPLETE_PARAMETER_LIST:\)$/#if CUFFT_VERSION < 12000 \/* removed in cuFFT 12 *\/\n\1/;s/^\(\t\tbreak;\)$/\1\n#endif/}; /case CUFFT_PARSE_ERROR:/,/break;/{s/^\(\tcase CUFFT_PARSE_ERROR:\)$/#if CUFFT_VERSION < 12000 \/* removed in cuFFT 12 *\/\n\1/;s/^\(\t\tbreak;\)$/\1\n#endif/}' \
        '^#if CUFFT_VERSION < 12000' "cuFFT error codes removed in cuFFT 12 guarded"
    [ "$(grep -c '^#if CUFFT_VERSION < 12000' "$SRC/starpufft/src/starpufftx.c")" -eq 2 ] \
        || die "mend 'cuFFT error codes' guarded the wrong number of cases"
}
mend_source

# --- Configure, build, install -----------------------------------------------------------
cd "$SRC"
say "configure ${CONFIGURE_FLAGS[*]}"
./configure "${CONFIGURE_FLAGS[@]}" >"$WORKDIR/configure.log" 2>&1 \
    || { tail -n 40 "$WORKDIR/configure.log" >&2; die "configure failed (full log: $WORKDIR/configure.log)"; }
# configure's summary must show CUDA and MPI on.
grep -q '^#define STARPU_USE_CUDA 1' include/starpu_config.h \
    || { sed -n '/CPUs   enabled/,$p' "$WORKDIR/configure.log" >&2; die "configure did not enable CUDA"; }
grep -q '^#define STARPU_USE_MPI 1' include/starpu_config.h \
    || { sed -n '/CPUs   enabled/,$p' "$WORKDIR/configure.log" >&2; die "configure did not enable StarPU-MPI"; }
sed -n '/CPUs   enabled/,/MPI test suite/p' "$WORKDIR/configure.log"

jobs="$(nproc)"
say "make -j$jobs (log: $WORKDIR/make.log)"
start=$(date +%s)
make -j"$jobs" >"$WORKDIR/make.log" 2>&1 \
    || { grep -n -B2 -A6 'error' "$WORKDIR/make.log" | tail -n 60 >&2; die "make failed (full log: $WORKDIR/make.log)"; }
say "make took $(( $(date +%s) - start )) s"
make install >"$WORKDIR/install.log" 2>&1 \
    || { tail -n 40 "$WORKDIR/install.log" >&2; die "make install failed (full log: $WORKDIR/install.log)"; }

for pc in starpu-1.3 starpumpi-1.3; do
    [ -f "$PREFIX/lib/pkgconfig/$pc.pc" ] || die "make install left no $PREFIX/lib/pkgconfig/$pc.pc"
done
stamp_text "$DEB_VERSION" >"$STAMP"
say "installed StarPU $DEB_VERSION with CUDA $NVCC_VERSION and MPI in $PREFIX"
