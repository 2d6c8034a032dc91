#!/usr/bin/env bash
# The GPU check kit: tessel's tests and a benchmark on a lent GPU machine that has only the
# NVIDIA driver, the CUDA runtime and a Python with PyTorch and nvidia-cudnn-cu13.
#
#   scripts/gpu-check.sh pack [BUILD_DIR]   (here)
#       From a tessel build made against the CUDA StarPU (default build-cuda), writes
#       gpu-kit/kit.tar.xz (gpu-kit/ is git-ignored; the device call carries it): the CUDA
#       StarPU's libraries, tessel's binaries (CLI, libtessel, test and bench programs,
#       examples), the test runner (scripts/gpu-kit-tests.sh) and the scripts and data the
#       tests need, and the Debian runtime libraries they link (Open MPI with mpirun/orted and
#       its plugins, PMIx, hwloc, oneDNN, OpenBLAS, ...), taken from the Debian packages
#       (apt-get download + dpkg -x), stripped, xz -9. The CUDA libraries themselves (cudart,
#       cuBLAS, cuSPARSE, ...) are not in it: the GPU machine has them. GPU_KIT_DIR overrides
#       gpu-kit/. PACK_FASHION: subset (default: the test split and the first 10000 training
#       samples of Fashion-MNIST), full (about 23 MiB more) or none (the tests that read it
#       fail).
#
#   scripts/gpu-check.sh selftest OUTDIR     (here, as root)
#       `run OUTDIR` with every system copy of what the kit carries hidden (see selftest()).
#
#   scripts/gpu-check.sh run OUTDIR          (on the GPU machine, from the repository root)
#       Unpacks gpu-kit/kit.tar.xz (or $GPU_KIT) to a temporary folder, finds the CUDA and
#       cuDNN libraries of the machine's python3, and runs, each under `timeout` and all
#       within GPU_CHECK_BUDGET seconds (default 480), most important first: nvidia-smi, the
#       CUDA/cuDNN versions, `tessel info` (must list CUDA workers and name their device); the
#       CUDA tests (each Cuda* suite in a process of its own at 1 rank, the heterogeneous model
#       test under dmdas, and at 2 ranks sharing the GPU; a skip for want of a CUDA worker
#       fails); where their whole limit still fits, the kit's tests at 1 rank (STARPU_NCUDA=1)
#       and at 2 ranks, the distributed suite also with TSL_TASK_WHERE=cuda; the GPU
#       benchmarks (bench_cuda_ops: codelets against direct cuDNN/cuBLAS; vs_pytorch.py
#       --device cuda: training steps against PyTorch on the GPU, one pair per row; a traced
#       U-Net step on the GPU, its time per codelet in gpu-trace.txt; the heterogeneous row:
#       U-Net steps under dmdas on the GPU alone and with 15 CPU workers beside it, and where
#       the tasks ran, in hetero.txt); then zoo training steps timed with STARPU_NCUDA=1 and 0.
#       then an Nsight Compute profile of every kernel of three U-Net steps (ncu-kernels.txt:
#       launches, total and median per kernel). GPU_CHECK_ONLY=ncu runs only that; in general a
#       comma-separated list of cuda, mpi, hetero, knobs (the small networks' steps under
#       StarPU's schedulers, CUDA pipeline depths and two workers per GPU, knobs.txt) and ncu
#       runs only those parts.
#       GPU_CHECK_NO_BENCH=1
#       leaves the GPU benchmarks out; VS_PYTORCH_PAIRS (default 1) and VS_PYTORCH_LIMIT
#       (seconds, default 170) size the PyTorch comparison. Every log goes to
#       OUTDIR, and OUTDIR/summary.txt says PASS/FAIL/SKIP and the time of each step, then the
#       benchmark tables. Without a GPU (no nvidia-smi) it says so and runs the CPU steps only.
#       Exits 0 when no step failed.
#
# The device call (docs/gpu.md): carry ["gpu-kit"], timeout_s 570, command
#   bash gpu-kit/gpu-check.sh run /tmp/gpu-check; rc=$?; tar -C /tmp -czf
#   $OUT/gpu-check.tar.gz gpu-check; cp /tmp/gpu-check/summary.txt $OUT/; exit $rc
# (gpu-kit/gpu-check.sh is the copy pack leaves beside the archive; ROOT is then gpu-kit/..)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MULTIARCH=x86_64-linux-gnu
die() { echo "gpu-check: error: $*" >&2; exit 1; }
say() { echo "gpu-check: $*"; }

usage() {
    sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 2
}

# ---------------------------------------------------------------------------------------
# pack
# ---------------------------------------------------------------------------------------

# Libraries glibc provides (every machine has them) and the CUDA libraries the GPU machine
# provides: never packed.
GLIBC_RE='^(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl)\.so'
CUDA_RE='^(libcuda|libcudart|libcublas|libcublasLt|libcusparse|libcufft|libcurand|libcusolver|libnvJitLink|libnvrtc|libcudnn|libnvidia-ml)\.so'

# The Debian package that owns a library path (merged /usr: try both spellings).
owner() {
    local p="$1" r
    r="$(realpath "$p")"
    for q in "$p" "$r" "${p#/usr}" "/usr$p" "${r#/usr}" "/usr$r"; do
        dpkg -S "$q" 2>/dev/null | head -n 1 | cut -d: -f1 && return 0
    done
    return 1
}

# Resolved dependencies (path per line) of ELF files, from ldd.
deps_of() {
    local f
    for f in "$@"; do
        LD_LIBRARY_PATH="$KIT_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$f" 2>/dev/null \
            | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
    done | sort -u
}

pack() {
    local build="${1:-build-cuda}"
    case "$build" in /*) ;; *) build="$ROOT/$build" ;; esac
    [ -x "$build/tessel" ] || die "no $build/tessel: build tessel against the CUDA StarPU first"
    local kitdir="${GPU_KIT_DIR:-$ROOT/gpu-kit}"
    STAGE="$(mktemp -d /tmp/gpu-check-pack.XXXXXX)"
    trap 'rm -rf "$STAGE"' EXIT
    local stage="$STAGE"
    local kit="$stage/kit"
    mkdir -p "$kit/bin" "$kit/lib" "$kit/sys" "$kit/compat" "$kit/share/tests" "$stage/debs"
    : >"$kit/MANIFEST"
    KIT_LIB="$kit/lib"

    # The StarPU this build links: it must be a CUDA one.
    local starpu
    starpu="$(ldd "$build/libtessel.so.0" | awk '$1 ~ /^libstarpu-1\.3\.so/ {print $3}')"
    [ -n "$starpu" ] || die "$build/libtessel.so.0 does not link libstarpu-1.3"
    readelf -d "$starpu" | grep -q 'NEEDED.*libcudart' \
        || die "$starpu has no CUDA (build with PKG_CONFIG_PATH=<CUDA StarPU prefix>/lib/pkgconfig)"
    local starpu_lib starpu_prefix
    starpu_lib="$(dirname "$(realpath "$starpu")")"
    starpu_prefix="$(dirname "$starpu_lib")"
    say "build $build, CUDA StarPU $starpu_prefix"

    # tessel's binaries and the StarPU libraries (no headers, docs, .la or pkg-config).
    local b
    for b in tessel tests/tessel_mpi_tests tests/tessel_unit_tests tests/tessel_embed_test \
        tests/tessel_graph_tests bench/bench_tiles bench/bench_ops bench/bench_conv \
        bench/bench_conv_layout bench/bench_reduce bench/bench_cuda_ops \
        examples/example_tiled_tensor \
        examples/example_multi_domain; do
        if [ -x "$build/$b" ]; then
            cp "$build/$b" "$kit/bin/"
        else
            say "warning: the build has no $b (left out of the kit)"
        fi
    done
    cp -a "$build"/libtessel.so* "$kit/lib/"
    cp -a "$starpu_lib"/libstarpu*.so* "$kit/lib/"
    [ -x "$starpu_prefix/bin/starpu_machine_display" ] \
        && cp "$starpu_prefix/bin/starpu_machine_display" "$kit/bin/"

    # Test scripts and data (tests/CMakeLists.txt's commands use these).
    cp "$ROOT/tests/cli/train_check.py" "$ROOT/tests/unit/make_numpy_fixtures.py" \
        "$kit/share/tests/"
    # The PyTorch comparison with what it reads, under a root of its own (it finds python/ and
    # examples/models beside its bench/).
    mkdir -p "$kit/pyroot/bench" "$kit/pyroot/python" "$kit/pyroot/examples/models"
    cp "$ROOT/bench/vs_pytorch.py" "$kit/pyroot/bench/"
    cp "$ROOT/python/tessel_torch.py" "$ROOT/python/tessel_plot.py" "$kit/pyroot/python/"
    cp "$ROOT"/examples/models/*.json "$kit/pyroot/examples/models/"
    mkdir -p "$kit/pyroot/bench/models"
    cp "$ROOT"/bench/models/*.json "$kit/pyroot/bench/models/"
    cp "$ROOT/scripts/gpu-kit-tests.sh" "$kit/run-tests.sh"
    chmod +x "$kit/run-tests.sh"
    pack_fashion "$kit/data/fashion-mnist" "${PACK_FASHION:-subset}"

    # The Debian packages behind every library these link, and Open MPI's launcher.
    local elves=() f
    while IFS= read -r f; do elves+=("$f"); done < <(find "$kit/bin" "$kit/lib" -type f)
    local paths pkgs=() missing=()
    # (Open MPI opens PMIx through a plugin: libpmix counts too)
    paths="$(deps_of "${elves[@]}" /usr/bin/orterun /usr/bin/orted \
        /usr/lib/$MULTIARCH/pmix2/lib/libpmix.so.2)"
    local p name pkg
    for p in $paths; do
        case "$p" in "$kit"/*) continue ;; esac
        name="$(basename "$p")"
        [[ "$name" =~ $GLIBC_RE || "$name" =~ $CUDA_RE ]] && continue
        pkg="$(owner "$p")" || { missing+=("$p"); continue; }
        pkgs+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] || die "no Debian package owns ${missing[*]}"
    pkgs+=(openmpi-bin libopenmpi3 libpmix2)
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u | grep -vx 'libc6')
    say "Debian packages: ${pkgs[*]}"

    # apt-get download the installed versions (the archive may have dropped one: then copy
    # the installed package's files), and unpack with dpkg -x.
    local x="$stage/x" ver arch
    mkdir -p "$x"
    for pkg in "${pkgs[@]}"; do
        ver="$(dpkg-query -W -f='${Version}' "$pkg")"
        arch="$(dpkg-query -W -f='${Architecture}' "$pkg")"
        if (cd "$stage/debs" && apt-get download -q "$pkg:$arch=$ver" >/dev/null 2>&1); then
            dpkg -x "$stage/debs/${pkg}_"*.deb "$x"
            echo "deb $pkg $ver" >>"$kit/MANIFEST"
        else
            say "warning: apt-get download $pkg=$ver failed: copying the installed files"
            dpkg -L "$pkg" | while IFS= read -r f; do
                [ -f "$f" ] || [ -L "$f" ] || continue
                mkdir -p "$x$(dirname "$f")"
                cp -a "$f" "$x$f"
            done
            echo "installed $pkg $ver" >>"$kit/MANIFEST"
        fi
    done
    # Debian 12 merges /lib into /usr/lib: one tree.
    if [ -d "$x/lib" ]; then
        mkdir -p "$x/usr/lib"
        cp -a "$x/lib/." "$x/usr/lib/"
        rm -rf "${x:?}/lib"
    fi

    # Keep shared libraries, Open MPI's launcher, its help texts and its MCA parameters.
    local keep="$kit/sys"
    (cd "$x" && find . \( -name '*.so' -o -name '*.so.*' \) \( -type f -o -type l \) \
        ! -path './usr/share/*' ! -path './usr/lib/debug/*') | while IFS= read -r f; do
        mkdir -p "$keep/$(dirname "$f")"
        cp -a "$x/$f" "$keep/$f"
    done
    mkdir -p "$keep/usr/bin" "$keep/usr/share/openmpi" "$keep/etc/openmpi"
    cp -a "$x/usr/bin/orterun" "$x/usr/bin/orted" "$keep/usr/bin/"
    ln -s orterun "$keep/usr/bin/mpirun"
    ln -s orterun "$keep/usr/bin/mpiexec"
    cp -a "$x"/usr/share/openmpi/help-*.txt "$keep/usr/share/openmpi/" 2>/dev/null || true
    cp -a "$x/etc/openmpi/openmpi-mca-params.conf" "$keep/etc/openmpi/"
    # PMIx looks for its plugins (message compression, resource-manager detection) only in
    # the folder it was built for, whatever the environment says: leave them out; PMIx runs
    # without them (selftest hides the system's).
    rm -rf "$keep/usr/lib/$MULTIARCH/pmix2/lib/pmix"
    # libstdc++ and libgcc_s: the GPU machine has newer ones; used only where it has none.
    mv "$keep/usr/lib/$MULTIARCH"/libstdc++.so* "$keep/usr/lib/$MULTIARCH"/libgcc_s.so* \
        "$kit/compat/" 2>/dev/null || true

    # Drop the plugins that need libraries the kit does not carry (UCX, libfabric, verbs,
    # PSM, munge: transports the MCA parameters switch off anyway).
    local sonames
    sonames="$(find "$kit" \( -name '*.so' -o -name '*.so.*' \) -printf '%f\n' | sort -u)"
    local dropped=()
    while IFS= read -r f; do
        local need ok=1
        for need in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
            [[ "$need" =~ $GLIBC_RE || "$need" =~ $CUDA_RE ]] && continue
            grep -qxF "$need" <<<"$sonames" || { ok=0; break; }
        done
        [ $ok = 1 ] || { dropped+=("$(basename "$f")"); rm -f "$f"; }
    done < <(find "$keep" -path '*/openmpi3/*.so' -o -path '*/pmix/*.so' -o -path '*/hwloc/*.so')
    say "plugins left out (their libraries are not in the kit): ${dropped[*]:-none}"
    prune_unneeded "$kit"
    # Every library anything in the kit links is in the kit, in glibc or in CUDA.
    sonames="$(find "$kit" \( -name '*.so' -o -name '*.so.*' \) -printf '%f\n' | sort -u)"
    local unmet=""
    while IFS= read -r f; do
        for need in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
            [[ "$need" =~ $GLIBC_RE || "$need" =~ $CUDA_RE ]] && continue
            grep -qxF "$need" <<<"$sonames" || unmet="$unmet ${f#"$kit"/}:$need"
        done
    done < <(find "$kit" -type f \( -name '*.so*' -o -perm -u+x \) ! -name '*.sh' ! -name '*.py')
    [ -z "$unmet" ] || die "the kit lacks libraries:$unmet"

    # Strip, write the environment file, compress.
    find "$kit" -type f \( -name '*.so*' -o -perm -u+x \) ! -name '*.sh' ! -name '*.py' \
        -exec sh -c 'readelf -h "$1" >/dev/null 2>&1 && strip --strip-unneeded "$1"' _ {} \; 2>/dev/null
    write_env "$kit/env.sh"
    {
        echo "build $build"
        echo "starpu $starpu_prefix ($(cat "$starpu_prefix/.tessel-starpu-cuda.stamp" 2>/dev/null | head -n 1))"
        echo "tessel $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
        echo "packed $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
        echo "not packed (the GPU machine provides them): $(deps_of "${elves[@]}" | xargs -n1 basename | grep -E "$CUDA_RE" | tr '\n' ' ')"
    } >>"$kit/MANIFEST"

    mkdir -p "$kitdir"
    rm -f "$kitdir/kit.tar.xz"
    tar -C "$stage" -cf - kit | xz -9 -T2 >"$kitdir/kit.tar.xz" || die "tar | xz failed"
    cp "$kit/MANIFEST" "$kitdir/MANIFEST"
    # This script beside the archive: `bash gpu-kit/gpu-check.sh run OUTDIR` runs the version
    # that packed the kit, whatever the checkout's scripts/ holds.
    cp "${BASH_SOURCE[0]}" "$kitdir/gpu-check.sh"
    local raw packed
    raw="$(du -sb "$kit" | cut -f1)"
    packed="$(stat -c %s "$kitdir/kit.tar.xz")"
    say "wrote $kitdir/kit.tar.xz: $((packed / 1048576)) MiB ($packed bytes), unpacked" \
        "$((raw / 1048576)) MiB ($raw bytes)"
    [ "$packed" -lt $((48 * 1048576)) ] || say "warning: the kit is over 48 MiB (the device limit is 64 MiB with the tree)"
}

# Fashion-MNIST into DIR, uncompressed (xz packs it smaller than gzip did): MODE full (the
# whole set, about 23 MiB more in the kit), subset (the whole test split and the first
# 10000 training samples, about 8 MiB; the tests read a few samples or train a few dozen
# steps) or none.
pack_fashion() {
    local dir="$1" mode="$2" fm=/usr/share/datasets/fashion-mnist
    [ "$mode" = none ] && return 0
    [ -f "$fm/train-images-idx3-ubyte.gz" ] || die "no Fashion-MNIST in $fm (PACK_FASHION=none to pack without)"
    mkdir -p "$dir"
    local f
    for f in t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        zcat "$fm/$f.gz" >"$dir/$f"
    done
    case "$mode" in
    full)
        for f in train-images-idx3-ubyte train-labels-idx1-ubyte; do
            zcat "$fm/$f.gz" >"$dir/$f"
        done ;;
    subset)
        # IDX: big-endian magic, count (then rows, columns for images), then the bytes.
        python3 - "$fm" "$dir" 10000 <<'PY' || die "cannot cut the Fashion-MNIST subset"
import gzip, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, head, per in (("train-images-idx3-ubyte", 16, 784), ("train-labels-idx1-ubyte", 8, 1)):
    with gzip.open(f"{src}/{name}.gz") as f:
        data = f.read()
    hdr = bytearray(data[:head])
    assert struct.unpack(">I", hdr[4:8])[0] >= n
    hdr[4:8] = struct.pack(">I", n)
    with open(f"{dst}/{name}", "wb") as f:
        f.write(bytes(hdr) + data[head:head + n * per])
PY
        ;;
    *) die "PACK_FASHION=$mode: full, subset or none" ;;
    esac
    echo "fashion-mnist $mode" >>"$(dirname "$(dirname "$dir")")/MANIFEST"
}

# Remove the packages' shared libraries that nothing in the kit links (LAPACK, OpenSHMEM,
# Open MPI's Fortran and Java bindings, ...); plugins stay (Open MPI, PMIx and hwloc open them).
prune_unneeded() {
    local kit="$1" needed f so removed=()
    for _ in 1 2 3; do
        needed="$(find "$kit" -type f \( -name '*.so*' -o -perm -u+x \) -exec readelf -d {} + \
            2>/dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | sort -u)"
        while IFS= read -r f; do
            case "$f" in */openmpi3/* | */pmix/* | */hwloc/* | "$kit"/lib/*) continue ;; esac
            so="$(readelf -d "$f" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')"
            [ -n "$so" ] || continue
            grep -qxF "$so" <<<"$needed" && continue
            removed+=("$(basename "$f")")
            find "$(dirname "$f")" -maxdepth 1 -lname "*$(basename "$f")" -delete
            rm -f "$f"
        done < <(find "$kit/sys" "$kit/compat" -type f -name '*.so*')
    done
    find "$kit/sys" -xtype l -delete
    say "libraries nothing links (left out): ${removed[*]:-none}"
}

# The kit's environment: sourced with the kit's folder as its own; CUDA_LIBS, when set, are
# the GPU machine's CUDA library folders (appended).
write_env() {
    cat >"$1" <<EOF
# Sourced by the kit's scripts: the kit's programs, libraries and a relocated Open MPI.
KIT="\${KIT:-\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)}"
_sys="\$KIT/sys/usr"
_lib="\$_sys/lib/$MULTIARCH"
export PATH="\$_sys/bin:\$KIT/bin\${PATH:+:\$PATH}"
_ld="\$KIT/lib:\$_lib:\$_lib/openblas-pthread:\$_lib/openmpi/lib"
# libstdc++/libgcc_s from Debian 12 only where the machine has none.
ldconfig -p 2>/dev/null | grep -q 'libstdc++\.so\.6 ' || [ -f /lib/$MULTIARCH/libstdc++.so.6 ] \\
    || [ -f /usr/lib64/libstdc++.so.6 ] || _ld="\$_ld:\$KIT/compat"
export LD_LIBRARY_PATH="\$_ld\${CUDA_LIBS:+:\$CUDA_LIBS}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
# Open MPI finds its plugins, help texts and parameters under the kit.
export OPAL_PREFIX="\$_sys" OPAL_EXEC_PREFIX="\$_sys" OPAL_BINDIR="\$_sys/bin"
export OPAL_LIBDIR="\$_lib/openmpi/lib" OPAL_PKGLIBDIR="\$_lib/openmpi/lib/openmpi3"
export OPAL_DATAROOTDIR="\$_sys/share" OPAL_DATADIR="\$_sys/share"
export OPAL_PKGDATADIR="\$_sys/share/openmpi" OPAL_SYSCONFDIR="\$KIT/sys/etc/openmpi"
export HWLOC_PLUGINS_PATH="\$_lib/hwloc"
unset _sys _lib _ld
EOF
}

# ---------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------

run_mode() {
    [ $# -ge 1 ] || usage
    local out="$1"
    mkdir -p "$out" || die "cannot make $out"
    out="$(cd "$out" && pwd)"
    local archive="${GPU_KIT:-$ROOT/gpu-kit/kit.tar.xz}"
    local budget="${GPU_CHECK_BUDGET:-480}"
    local t0
    t0=$(date +%s)
    export KIT_DEADLINE=$((t0 + budget))
    SUMMARY="$out/summary.txt"
    FAILED=0
    {
        echo "tessel GPU check, $(date -u +%FT%TZ), host $(uname -n), budget ${budget}s"
        echo "kit $archive"
    } >"$SUMMARY"

    [ -f "$archive" ] || { note FAIL kit 0 "no $archive (carry gpu-kit)"; finish "$out"; }
    local tmp
    tmp="$(mktemp -d /tmp/gpu-check-run.XXXXXX)"
    trap 'rm -rf "$tmp"' EXIT
    local s
    s=$(date +%s)
    # (tar -J needs xz; python3's tarfile reads xz too)
    if ! { command -v xz >/dev/null && timeout 120 tar -C "$tmp" -xJf "$archive"; } 2>"$out/unpack.log" \
        && ! timeout 120 python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$archive" "$tmp" 2>>"$out/unpack.log"; then
        note FAIL unpack $(($(date +%s) - s))s "see unpack.log"
        finish "$out"
    fi
    note PASS unpack $(($(date +%s) - s))s "$(du -sh "$tmp/kit" | cut -f1) unpacked"
    export KIT="$tmp/kit"
    cp "$KIT/MANIFEST" "$out/kit-MANIFEST.txt"

    # The machine's CUDA and cuDNN libraries: its CUDA toolkit and the pip packages of its
    # python3 (asked before the kit's libraries are on LD_LIBRARY_PATH).
    local libs="" d
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/local/cuda/lib; do
        [ -d "$d" ] && libs="$libs:$d"
    done
    local pylibs=""
    if command -v python3 >/dev/null; then
        pylibs="$(timeout 60 python3 - 2>>"$out/versions.txt" <<'PY'
import glob, os
dirs = []
try:
    import nvidia.cudnn
    dirs.append(os.path.join(os.path.dirname(nvidia.cudnn.__file__), "lib"))
except Exception as e:
    print("# no nvidia.cudnn:", e, file=__import__("sys").stderr)
try:
    import nvidia
    for p in nvidia.__path__:
        dirs += sorted(glob.glob(os.path.join(p, "*", "lib")))
except Exception:
    pass
seen = []
for d in dirs:
    if os.path.isdir(d) and d not in seen:
        seen.append(d)
print(":".join(seen))
PY
)"
    fi
    [ -n "$pylibs" ] && libs="$libs:$pylibs"
    export CUDA_LIBS="${libs#:}"
    echo "CUDA_LIBS=$CUDA_LIBS" >>"$out/versions.txt"

    # The GPU and the versions.
    local gpu=0
    [ -d /usr/local/nvidia/bin ] && PATH="$PATH:/usr/local/nvidia/bin"
    if command -v nvidia-smi >/dev/null && timeout 60 nvidia-smi >"$out/nvidia-smi.txt" 2>&1; then
        gpu=1
        note PASS nvidia-smi - "$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
    else
        echo "no nvidia-smi or it failed: no GPU on this machine" >>"$out/nvidia-smi.txt"
        note SKIP nvidia-smi - "NO GPU on this machine: CUDA steps skipped, CPU steps run"
    fi
    if command -v python3 >/dev/null; then
        timeout 120 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.is_available())' \
            >>"$out/versions.txt" 2>&1 || echo "(torch not usable)" >>"$out/versions.txt"
    fi
    command -v nvcc >/dev/null && nvcc --version | tail -n 2 >>"$out/versions.txt"
    for d in ${CUDA_LIBS//:/ }; do
        for f in "$d"/libcudart.so.[0-9]* "$d"/libcudnn.so.[0-9]* "$d"/libcublas.so.[0-9]*; do
            [[ "$f" =~ \.so\.[0-9]+$ ]] && echo "$f"
        done
    done >>"$out/versions.txt"
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so\.1 ' >>"$out/versions.txt"

    # The machine's own environment, for its python3 and PyTorch (the benchmark): the kit's
    # libraries are only for the kit's programs.
    ORIG_PATH="$PATH" ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
    # shellcheck source=/dev/null
    . "$KIT/env.sh"
    {
        echo "PATH=$PATH"
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        for f in "$KIT"/bin/* "$KIT"/lib/libstarpu-1.3.so.*[0-9]; do
            [ -L "$f" ] && continue
            echo "== $f"
            ldd "$f"
        done
    } >"$out/ldd.txt" 2>&1
    if grep -q 'not found' "$out/ldd.txt"; then
        note FAIL libraries - "$(grep 'not found' "$out/ldd.txt" | sort -u | tr -s ' \t' ' ' | tr '\n' ';')"
    else
        note PASS libraries - "every library found (ldd.txt)"
    fi
    export STARPU_HOME="$tmp/starpu-home" STARPU_SILENT=1 OMPI_ALLOW_RUN_AS_ROOT=1
    export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    mkdir -p "$STARPU_HOME"
    # Which copies the dynamic loader takes: every library the kit carries must come from it.
    LD_DEBUG=libs timeout 60 mpirun --oversubscribe --bind-to none -n 1 "$KIT/bin/tessel" \
        info >"$out/ld-debug.txt" 2>&1
    sed -n 's/.*calling init: //p' "$out/ld-debug.txt" | sort -u >"$out/loaded-libs.txt"
    local stray=""
    while IFS= read -r f; do
        case "$f" in "$KIT"/*) continue ;; esac
        # (compat/ holds libstdc++ and libgcc_s for machines without them: not a stray)
        [ -n "$(find "$KIT" -path "$KIT/compat" -prune -o -name "$(basename "$f")" -print \
            -quit)" ] && stray="$stray $f"
    done <"$out/loaded-libs.txt"
    if [ ! -s "$out/loaded-libs.txt" ]; then
        note FAIL loader - "LD_DEBUG=libs showed no library (ld-debug.txt)"
    elif [ -n "$stray" ]; then
        note FAIL loader - "taken from outside the kit although it has them:$stray"
    else
        note PASS loader - "$(grep -c "^$KIT/" "$out/loaded-libs.txt") of" \
            "$(wc -l <"$out/loaded-libs.txt") libraries from the kit (loaded-libs.txt)"
    fi
    # Fashion-MNIST at tessel's default folder (the tests open it there), from the kit.
    local fm=/usr/share/datasets/fashion-mnist
    if [ ! -e "$fm" ] && [ -d "$KIT/data/fashion-mnist" ]; then
        mkdir -p "$(dirname "$fm")" && ln -s "$KIT/data/fashion-mnist" "$fm" \
            && echo "linked $fm to the kit's copy" >>"$out/versions.txt"
    fi

    local mpi=(mpirun --oversubscribe --bind-to none)

    # tessel info: with a GPU it must list CUDA workers and name their device.
    if [ $gpu = 1 ]; then
        step info 90 "workers on rank 0: [0-9]+ CPU, [1-9][0-9]* CUDA" \
            env STARPU_NCUDA=1 "${mpi[@]}" -n 1 "$KIT/bin/tessel" info \
            && { grep -q '^CUDA worker 0: ' "$OUT_DIR/info.log" \
                || note FAIL info-devices - "no 'CUDA worker 0: <device>' line in info.log"; }
    else
        step info 90 "workers on rank 0: [0-9]+ CPU" "${mpi[@]}" -n 1 "$KIT/bin/tessel" info
    fi

    # GPU_CHECK_ONLY=PART[,PART...]: only those parts, in this order, then the summary: cuda (the
    # Cuda* suites at 1 rank and the heterogeneous model test), mpi (the distributed suite at 1
    # and 2 ranks with the default placement), hetero (the heterogeneous row), ncu (the kernel
    # profile, with what is left of the budget), knobs (the small networks under StarPU's
    # settings), vs (the steps against PyTorch, VS_PYTORCH_ROWS), trace (the traced steps).
    # GPU_PROFILE_MODEL picks the trace's and the profile's model.
    if [ -n "${GPU_CHECK_ONLY:-}" ]; then
        local only=",${GPU_CHECK_ONLY},"
        [ $gpu = 1 ] || note SKIP gpu-parts - "no GPU"
        if [ $gpu = 1 ]; then
            [[ $only == *,cuda,* ]] && tests_step cuda-np1 200 1 cuda.np1 cuda.hetero
            [[ $only == *,mpi,* ]] && tests_step tests-np1 90 1 mpi.tensor.np1
            [[ $only == *,mpi,* ]] && tests_step tests-np2 90 1 mpi.tensor.np2
            [[ $only == *,hetero,* ]] && hetero_bench "$out" "${HETERO_LIMIT:-150}"
            [[ $only == *,knobs,* ]] && knobs_bench "$out" "${KNOBS_LIMIT:-200}"
            [[ $only == *,vs,* ]] && bench_vs_pytorch "$out" "$tmp" "${VS_PYTORCH_LIMIT:-150}"
            [[ $only == *,trace,* ]] && gpu_trace "$out" "${TRACE_LIMIT:-60}"
            [[ $only == *,ncu,* ]] && ncu_profile "$out" $((KIT_DEADLINE - $(date +%s) - 10))
        fi
        finish "$out"
    fi

    # In order of what matters most, each cut to what is left of the budget: the CUDA tests
    # (codelets and models at one rank, the heterogeneous model run under dmdas, two ranks
    # sharing the GPU), the GPU benchmarks, then the whole test binaries with a CUDA worker and
    # the zoo training times, each only where its whole limit still fits.
    local ncuda=0
    [ $gpu = 1 ] && ncuda=1
    if [ $gpu = 1 ]; then
        tests_step cuda-np1 200 1 cuda.np1 cuda.hetero
        tests_step cuda-np2 150 1 cuda.np2
    else
        note SKIP cuda-tests - "no GPU"
    fi
    local cuda_where=()
    [ $gpu = 1 ] && cuda_where=(mpi.tensor.np1.cuda)
    fits 120 tests-np1 && tests_step tests-np1 120 "$ncuda" unit.graph unit.numpy_fixtures \
        unit.gtest unit.numpy_reads_tessel mpi.tensor.np1 "${cuda_where[@]}" mpi.embed.np1 \
        cli.demo.np1
    [ $gpu = 1 ] && cuda_where=(mpi.tensor.np2.cuda)
    fits 90 tests-np2 && tests_step tests-np2 90 "$ncuda" mpi.tensor.np2 "${cuda_where[@]}" \
        mpi.embed.np2 cli.info.np2 cli.demo.np2
    if [ $gpu = 0 ]; then
        note SKIP benchmarks - "no GPU"
    elif [ -n "${GPU_CHECK_NO_BENCH:-}" ]; then
        note SKIP benchmarks - "GPU_CHECK_NO_BENCH set"
    else
        step bench-cuda-ops 100 "^gemm-4096" env STARPU_NCUDA=1 STARPU_NCPU=2 \
            "$KIT/bin/bench_cuda_ops"
        bench_vs_pytorch "$out" "$tmp" "${VS_PYTORCH_LIMIT:-170}"
    fi
    [ $gpu = 1 ] && [ -z "${GPU_CHECK_NO_BENCH:-}" ] && gpu_trace "$out" 60
    [ $gpu = 1 ] && [ -z "${GPU_CHECK_NO_BENCH:-}" ] && hetero_bench "$out" 150
    [ $gpu = 1 ] && [ -z "${GPU_CHECK_NO_BENCH:-}" ] && knobs_bench "$out" 200
    [ $gpu = 1 ] && [ -z "${GPU_CHECK_NO_BENCH:-}" ] && fits 60 ncu && ncu_profile "$out" 60
    [ $gpu = 1 ] && fits 45 diagnostics && tests_step diagnostics 45 1 diag.scatter_again.cuda

    # Zoo training steps, timed with the GPU and without.
    local bench="$out/bench.txt"
    printf '%-10s %-6s %-8s %s\n' model ncuda seconds "epoch line" >"$bench"
    local spec
    for spec in "cnn fashion-mnist 128 20" "unet2d synthetic:dims=2,size=128,samples=32 4 5" \
        "resnet synthetic:dims=2,size=32,samples=256,labels=sample 64 10"; do
        set -- $spec
        local n
        for n in $( [ $gpu = 1 ] && echo 1; echo 0); do
            fits 40 "train-$1-ncuda$n" || continue
            local s0
            s0=$(date +%s%N)
            if step "train-$1-ncuda$n" 90 "train loss" env STARPU_NCUDA=$n "${mpi[@]}" -n 1 \
                "$KIT/bin/tessel" train --model "$1" --data "$2" --batch "$3" --max-steps "$4" \
                --seed 7 --metrics-json "$out/train-$1-ncuda$n.json"; then
                local ms=$((($(date +%s%N) - s0) / 1000000))
                printf '%-10s %-6s %-8s %s\n' "$1" "$n" "$((ms / 1000)).$((ms % 1000 / 100))" \
                    "$(grep -o '[0-9.]* s, [0-9.]* samples/s' "$out/train-$1-ncuda$n.log" | tail -n 1)" \
                    >>"$bench"
            else
                printf '%-10s %-6s %s\n' "$1" "$n" failed >>"$bench"
            fi
        done
    done
    finish "$out"
}

note() { # status step seconds text
    printf '%-8s %-22s %-6s %s\n' "$1" "$2" "$3" "${*:4}" | tee -a "$SUMMARY"
    case "$1" in FAIL | TIMEOUT) FAILED=1 ;; esac
}

# fits SECONDS NAME: whether SECONDS are left in the budget; else NAME is noted as skipped.
fits() {
    local left=$((KIT_DEADLINE - $(date +%s)))
    [ "$left" -ge "$1" ] && return 0
    note SKIP "$2" - "${left}s left in the budget, it needs ${1}s"
    return 1
}

# bench_vs_pytorch OUTDIR TMP LIMIT: tessel against PyTorch on the GPU (bench/vs_pytorch.py
# --device cuda, the issue's rows, one pair each, the smallest first), PyTorch from the
# machine's python3 with the machine's environment, tessel through a wrapper that sets up the
# kit's. Its table goes to OUTDIR/vs-pytorch-gpu.md.
bench_vs_pytorch() {
    local out="$1" tmp="$2" lim="$3" py
    py="$(PATH="$ORIG_PATH" command -v python3)"
    if [ -z "$py" ] || ! PATH="$ORIG_PATH" LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" timeout 120 \
        "$py" -c 'import torch, numpy; assert torch.cuda.is_available()' >/dev/null 2>&1; then
        note SKIP vs-pytorch - "no python3 with torch (CUDA) and numpy"
        return
    fi
    printf '#!/bin/bash\n. "%s/env.sh"\nexec "$@"\n' "$KIT" >"$tmp/kit-env"
    chmod +x "$tmp/kit-env"
    step vs-pytorch "$lim" "^\| unet3d-128-b1" env PATH="$ORIG_PATH" \
        LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" PYTHONUNBUFFERED=1 "$py" \
        "$KIT/pyroot/bench/vs_pytorch.py" --device cuda --cli "$KIT/bin/tessel" \
        --launcher "$tmp/kit-env mpirun --oversubscribe --bind-to none -n 1" --python "$py" \
        --threads 4 --pairs "${VS_PYTORCH_PAIRS:-1}" --warmup 2 --steps 5 --timeout 40 \
        --rows "${VS_PYTORCH_ROWS:-cnn-fashion-b256,cnn3d-64-b4,unet2d-512-b8,unet2d-gn-512-b8,unet3d-128-b1}" \
        --out "$out/vs-pytorch-gpu.md"
}

# profile_model: the model the trace and the kernel profile train: GPU_PROFILE_MODEL (a zoo
# name, or a model file under the kit's copy of the repository, e.g.
# bench/models/unet2d_gn.json), default the zoo's unet2d.
profile_model() {
    local m="${GPU_PROFILE_MODEL:-unet2d}"
    if [ -f "$KIT/pyroot/$m" ]; then echo "$KIT/pyroot/$m"; else echo "$m"; fi
}

# gpu_trace OUTDIR LIMIT: where a GPU training step's time goes: a U-Net 2-D 512^2 batch-8 run of
# 4 steps with every task that can on the CUDA worker, traced (tessel train --trace), and the
# trace's table per codelet and worker (python/tessel_plot.py tasks) into OUTDIR/gpu-trace.txt.
gpu_trace() {
    local out="$1" lim="$2" py
    fits "$lim" gpu-trace || return
    step gpu-trace "$lim" "train loss" env STARPU_NCUDA=1 STARPU_NCPU=4 TSL_TASK_WHERE=cuda \
        mpirun --oversubscribe --bind-to none -n 1 "$KIT/bin/tessel" train --model "$(profile_model)" \
        --data synthetic:dims=2,size=512,samples=16 --batch 8 --max-steps 4 --progress off \
        --trace "$out/gpu-trace.json" || return
    py="$(PATH="$ORIG_PATH" command -v python3)"
    [ -n "$py" ] && PATH="$ORIG_PATH" LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" timeout 60 "$py" \
        "$KIT/pyroot/python/tessel_plot.py" tasks "$out/gpu-trace.json" 25 >"$out/gpu-trace.txt" 2>&1
}

# hetero_bench OUTDIR LIMIT: the issue's heterogeneous row: the same U-Net 2-D 512^2 batch-8
# steps under dmdas on the GPU alone (TSL_TASK_WHERE=cuda, 4 CPU workers for the reads) and on
# the GPU with 15 CPU workers beside it (TSL_TASK_WHERE=any: dmdas's calibrated models choose),
# each a tessel bench, with where the tasks ran; the tables into OUTDIR/hetero.txt. dmdas sends
# a task to a kind of worker whose history model lacks its size until it has 10 measurements
# there, so first a run of HETERO_CALIBRATE steps (default 30) with every worker fills the
# models of both kinds (saved in STARPU_HOME when it ends); the timed runs then read them.
# HETERO_PLANS (space-separated, default "default": the model's own plan, one sample tile per
# GPU) adds plans whose tiles CPU workers can share, e.g. "default tiles=4": each plan is
# calibrated and timed in turn, the LIMIT shared among them.
hetero_bench() {
    local out="$1" lim="$2" part plan tag
    fits "$lim" hetero-bench || return
    local plans
    read -r -a plans <<<"${HETERO_PLANS:-default}"
    part=$((lim / 4 / ${#plans[@]}))
    : >"$out/hetero.txt"
    for plan in "${plans[@]}"; do
        local args=(--model unet2d --data synthetic:dims=2,size=512,samples=96 --batch 8
            --sched dmdas)
        tag=""
        if [ "$plan" != default ]; then
            args+=(--plan "$plan")
            tag="-$plan"
            tag=${tag//[^a-zA-Z0-9-]/_}
        fi
        step "hetero-calibrate$tag" $((2 * part)) "^dmdas" env STARPU_NCUDA=1 STARPU_NCPU=15 \
            TSL_TASK_WHERE=any mpirun --oversubscribe --bind-to none -n 1 "$KIT/bin/tessel" \
            bench "${args[@]}" --warmup "${HETERO_CALIBRATE:-30}" --steps 1 --repeat 1
        step "hetero-gpu-only$tag" "$part" "^dmdas" env STARPU_NCUDA=1 STARPU_NCPU=4 \
            TSL_TASK_WHERE=cuda mpirun --oversubscribe --bind-to none -n 1 "$KIT/bin/tessel" \
            bench "${args[@]}" --warmup 5 --steps 5 --repeat 3
        step "hetero-gpu-cpu$tag" "$part" "^dmdas" env STARPU_NCUDA=1 STARPU_NCPU=15 \
            TSL_TASK_WHERE=any mpirun --oversubscribe --bind-to none -n 1 "$KIT/bin/tessel" \
            bench "${args[@]}" --warmup 5 --steps 5 --repeat 3
        {
            echo "== plan $plan"
            echo "Calibration run (${HETERO_CALIBRATE:-30} steps, GPU + 15 CPU workers, any):"
            grep -A1 "^scheduler\|^dmdas" "$out/hetero-calibrate$tag.log"
            echo "GPU only (TSL_TASK_WHERE=cuda, 4 CPU workers):"
            grep -A1 "^scheduler\|^dmdas" "$out/hetero-gpu-only$tag.log"
            echo "GPU + 15 CPU workers (TSL_TASK_WHERE=any):"
            grep -A1 "^scheduler\|^dmdas" "$out/hetero-gpu-cpu$tag.log"
        } >>"$out/hetero.txt" 2>&1
    done
}

# knobs_bench OUTDIR LIMIT: the small networks' steps (cnn on Fashion-MNIST at batch 256, CNN3D
# 64^3 at batch 4: many sub-millisecond tasks) under StarPU's settings that bear on a task's cost
# on a GPU: the schedulers lws, dmda and eager, STARPU_CUDA_PIPELINE (tasks queued ahead on the
# CUDA worker, StarPU's default 2) 0, 4 and 8, and two CUDA workers sharing the GPU
# (STARPU_NWORKER_PER_CUDA=2: the batch is cut for both); tessel bench tables into
# OUTDIR/knobs.txt.
knobs_bench() {
    local out="$1" lim="$2" spec variant name env_set
    fits "$lim" knobs || return
    : >"$out/knobs.txt"
    for spec in "cnn fashion-mnist 256" "cnn3d synthetic:dims=3,size=64,samples=32 4"; do
        set -- $spec
        for variant in "sched:" "pipeline0:STARPU_CUDA_PIPELINE=0" \
            "pipeline4:STARPU_CUDA_PIPELINE=4" "pipeline8:STARPU_CUDA_PIPELINE=8" \
            "two-workers:STARPU_NWORKER_PER_CUDA=2"; do
            name="knobs-$1-${variant%%:*}"
            env_set=${variant#*:}
            local scheds=lws
            [ -z "$env_set" ] && scheds=lws,dmda,eager
            step "$name" $((lim / 10)) "^lws" env STARPU_NCUDA=1 STARPU_NCPU=4 $env_set \
                mpirun --oversubscribe --bind-to none -n 1 "$KIT/bin/tessel" bench --model "$1" \
                --data "$2" --batch "$3" --sched "$scheds" --warmup 5 --steps 10 --repeat 3
            local shown="${env_set:-StarPU defaults}"
            { echo "== $1 $shown"; grep -A1 "^scheduler\|^lws\|^dmda\|^eager" \
                "$out/$name.log"; } >>"$out/knobs.txt" 2>&1
        done
    done
}

# ncu_profile OUTDIR LIMIT: every kernel of a U-Net 2-D 512^2 batch-8 run of 3 steps (every
# task that can on the CUDA worker) timed by Nsight Compute (gpu__time_duration, kernels
# serialised, clocks as found), the machine's ncu; per kernel name the launches, the total and
# the median into OUTDIR/ncu-kernels.txt (the median is the steady state: the first step's
# algorithm searches are few launches of each kernel). Raw CSV in OUTDIR/ncu.csv.
ncu_profile() {
    local out="$1" lim="$2" ncu="" py d
    for d in "$(PATH="$ORIG_PATH" command -v ncu)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
        [ -n "$d" ] && [ -x "$d" ] && { ncu="$d"; break; }
    done
    if [ -z "$ncu" ]; then
        note SKIP ncu - "no ncu on this machine"
        return
    fi
    step ncu "$lim" "train loss" env STARPU_NCUDA=1 STARPU_NCPU=4 TSL_TASK_WHERE=cuda \
        mpirun --oversubscribe --bind-to none -n 1 "$ncu" --target-processes all \
        --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
        "$KIT/bin/tessel" train --model "$(profile_model)" --data synthetic:dims=2,size=512,samples=24 \
        --batch 8 --max-steps 3 --progress off || return
    py="$(PATH="$ORIG_PATH" command -v python3)"
    [ -n "$py" ] && PATH="$ORIG_PATH" LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" timeout 60 "$py" - \
        "$out/ncu.csv" >"$out/ncu-kernels.txt" 2>&1 <<'PY'
import csv, statistics, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, rows = rows[0], rows[1:]
name, metric, unit, value = (head.index(k) for k in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
times = {}
for r in rows:
    if r[metric] == "gpu__time_duration.sum":
        times.setdefault(r[name][:60], []).append(float(r[value].replace(",", "")) * scale.get(r[unit], 1.0))
total = sum(sum(v) for v in times.values())
print(f"{sum(len(v) for v in times.values())} kernels, {total / 1e3:.1f} ms in all (3 steps, the first with searches)")
print(f"{'kernel':60s} {'launches':>8s} {'total ms':>9s} {'median us':>10s} {'share':>6s}")
for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1]))[:40]:
    print(f"{k:60s} {len(v):8d} {sum(v) / 1e3:9.2f} {statistics.median(v):10.1f} {100 * sum(v) / total:5.1f}%")
PY
}

# step NAME LIMIT MATCH CMD...: runs CMD under timeout (LIMIT, cut to the budget left) into
# OUTDIR/NAME.log; MATCH (egrep, may be empty) must be in its output.
step() {
    local name="$1" lim="$2" match="$3"
    shift 3
    local left=$((KIT_DEADLINE - $(date +%s)))
    [ "$left" -lt "$lim" ] && lim="$left"
    if [ "$lim" -le 5 ]; then
        note SKIP "$name" - "no time left in the budget"
        return 1
    fi
    local log="$OUT_DIR/$name.log" s rc
    s=$(date +%s)
    echo "+ timeout $lim $*" >"$log"
    timeout -k 10 "$lim" "$@" >>"$log" 2>&1
    rc=$?
    local secs="$(($(date +%s) - s))s"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        note TIMEOUT "$name" "$secs" "after ${lim}s ($name.log)"
    elif [ $rc -ne 0 ]; then
        note FAIL "$name" "$secs" "exit $rc ($name.log)"
    elif [ -n "$match" ] && ! grep -Eq "$match" "$log"; then
        note FAIL "$name" "$secs" "no '$match' in $name.log"
    else
        note PASS "$name" "$secs" "$(grep -Eo "$match" "$log" | head -n 1)"
        return 0
    fi
    return 1
}

# tests_step NAME LIMIT NCUDA TEST...: the kit's runner, its results into the summary.
tests_step() {
    local name="$1" lim="$2" ncuda="$3"
    shift 3
    local logs="$OUT_DIR/$name"
    STARPU_NCUDA="$ncuda" TEST_TIMEOUT="$lim" step "$name" "$lim" "" \
        "$KIT/run-tests.sh" "$logs" "$@"
    [ -f "$logs/results.txt" ] && sed 's/^/    /' "$logs/results.txt" | tee -a "$SUMMARY"
}

finish() {
    local secs=$(($(date +%s) - ${KIT_DEADLINE:-0} + ${GPU_CHECK_BUDGET:-480}))
    if [ "$FAILED" = 0 ]; then
        echo "RESULT PASS (${secs}s)" | tee -a "$SUMMARY"
    else
        echo "RESULT FAIL (${secs}s)" | tee -a "$SUMMARY"
    fi
    local f
    for f in bench-cuda-ops.log vs-pytorch-gpu.md gpu-trace.txt hetero.txt knobs.txt ncu-kernels.txt \
        bench.txt; do
        [ -f "$1/$f" ] || continue
        { echo; echo "== $f"; grep -v '^+ timeout' "$1/$f"; } | tee -a "$SUMMARY"
    done
    exit "$FAILED"
}

# selftest OUTDIR (here, as root): `run OUTDIR` in a private mount namespace where every
# system file the kit has a copy of (Open MPI, PMIx, hwloc, oneDNN, OpenBLAS, ...), PMIx's
# plugins, Debian's StarPU, the CUDA StarPU prefix and the tessel build are hidden (bind mounts of /dev/null and
# of an empty folder), with `env -i` and PATH=/usr/bin:/bin: the kit must work on its own.
selftest() {
    local out="$1" archive="${GPU_KIT:-$ROOT/gpu-kit/kit.tar.xz}"
    [ "$(id -u)" = 0 ] || die "selftest needs root (mount namespaces)"
    [ -f "$archive" ] || die "no $archive: pack first"
    local empty list
    empty="$(mktemp -d /tmp/gpu-check-empty.XXXXXX)"
    list="$empty.list"
    # (zlib stays: the system's python3, asked for the CUDA libraries before the kit's
    # folders are on LD_LIBRARY_PATH, needs it)
    tar -tJf "$archive" | sed -n 's|^kit/sys/|/|p' | grep -v '/$' | grep -v '/libz\.so' >"$list"
    ls /usr/lib/$MULTIARCH/libstarpu* >>"$list" 2>/dev/null
    local dirs=() d
    for d in $(tar -xJOf "$archive" kit/MANIFEST | sed -n 's/^\(build\|starpu\) \([^ ]*\).*/\2/p'); do
        [ -d "$d" ] && dirs+=("$d")
    done
    # (the PMIx plugins the kit leaves out: the GPU machine has none)
    [ -d "/usr/lib/$MULTIARCH/pmix2/lib/pmix" ] && dirs+=("/usr/lib/$MULTIARCH/pmix2/lib/pmix")
    say "hiding $(wc -l <"$list") system files and ${dirs[*]}"
    unshare -m --propagation private bash -c '
        empty="$1"; list="$2"; shift 2
        while [ "$1" != -- ]; do mount --bind "$empty" "$1" || exit 1; shift; done
        shift
        while IFS= read -r f; do
            [ -e "$f" ] && { mount --bind /dev/null "$f" || exit 1; }
        done <"$list"
        exec env -i HOME="$HOME" TMPDIR=/tmp PATH=/usr/bin:/bin "$@"' \
        _ "$empty" "$list" "${dirs[@]}" -- bash "$ROOT/scripts/gpu-check.sh" run "$out"
    local rc=$?
    rmdir "$empty"
    rm -f "$list"
    return $rc
}

case "${1:-}" in
selftest)
    shift
    selftest "${1:?usage: gpu-check.sh selftest OUTDIR}"
    ;;
pack)
    shift
    pack "$@"
    ;;
run)
    shift
    OUT_DIR="$(mkdir -p "${1:?usage: gpu-check.sh run OUTDIR}" && cd "$1" && pwd)"
    run_mode "$OUT_DIR"
    ;;
*) usage ;;
esac
