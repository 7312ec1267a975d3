#!/usr/bin/env bash
# NVIDIA's public cuda-samples (github.com/NVIDIA/cuda-samples, pinned
# below: tag v13.0, the release for CUDA 13.0), built with CMake and run
# natively and in guests on vGPUs; a table of both.
#
# usage: ci/cuda-samples.sh bundle GITDIR [OUT.tar.xz]
#        ci/cuda-samples.sh build SRC.tar.xz|SRCDIR BUILDDIR
#        ci/cuda-samples.sh run PROGDIR OUTDIR [PROGRAM...]
#        ci/cuda-samples.sh guest VM-BUNDLE.tar.xz PROGDIR OUTDIR
#        ci/cuda-samples.sh table [LABEL=]RESULTS.tsv...
#        ci/cuda-samples.sh software GITDIR|SRC.tar.xz [OUTDIR]
#
# bundle    (here) the pinned commit's Samples/ categories 0_Introduction,
#           1_Utilities, 2_Concepts_and_Techniques, 3_CUDA_Features,
#           4_CUDA_Libraries and 6_Performance with Common/, the CMake
#           files and test_args.json, without docs, Windows libraries and
#           the EGL and NvSci samples, from a clone GITDIR
#           (default OUT .devbin/cuda-samples.tar.xz)
# build     CMake and ninja, every sample for SAMPLES_ARCHS (90: sm_90
#           machine code and compute_90 PTX), all cores; a program that
#           does not build is listed in BUILDDIR/build-failed.txt, the
#           rest go on. Each program is staged with the data it reads in
#           BUILDDIR/progs/NAME/, beside test_args.json and this script
# run       each program (or the ones named) from a fresh copy of its
#           folder with the arguments of test_args.json (each of its
#           "runs"), SAMPLES_TIMEOUT seconds at most each, SAMPLES_JOBS at
#           a time; OUTDIR/results.tsv gets one line per run:
#           program, run, pass|waive|fail|timeout|skip|notrun, exit status,
#           seconds, its last line. Exit 0 passes, 2 (EXIT_WAIVED of the
#           samples' helper headers) or a "waiving" line is a waive; a
#           run that exits 0 but prints "Test failed" or "Result = FAIL"
#           fails; a run test_args.json marks "skip" is skipped, one that
#           needs more GPUs ("min_gpus") than SAMPLES_GPUS is waived
#           without running, as the repository's run_tests.py does
# guest     tests/vm/gpu-vm.sh's two library guests, at once, one vGPU each
#           (the cuda backend), run the programs of PROGDIR, half each,
#           through the guest's libcuda.so.1 in the GPU machine's own
#           userland (9p, chroot; /dev/shm mounted, each run in a copy of
#           its folder under the guest's /tmp); OUTDIR/results.tsv as run's,
#           OUTDIR/failed-runs.txt the last lines of each run that failed
# table     one line per program: its result in each file (labels native,
#           guest, software by default), the totals, and what passes in
#           the first but not in the second
# software  (here, no GPU) the subset that the software backend's PTX
#           executor runs (SOFTWARE_SUBSET), built with ci/fetch-cuda.sh's
#           toolkit (sm_90 and compute_90), run in two guests on the
#           software backend; OUTDIR (default /tmp/vgpud-cuda-samples-sw)
#
# On the GPU machine (CUDA 13 toolkit in CUDA_HOME, /usr/local/cuda; CMake,
# ninja; no network), two calls of at most 10 minutes, each carrying
# .devbin/cuda-samples.tar.xz and (the second) .devbin/gpu-vm.tar.xz
# (ci/gpu-vm-bundle.sh), 64 MiB together at most:
#   1: bash ci/cuda-samples.sh build .devbin/cuda-samples.tar.xz /var/tmp/cs &&
#      SAMPLES_BUDGET=420 bash ci/cuda-samples.sh run /var/tmp/cs/progs $OUT/native;
#      cp /var/tmp/cs/build-failed.txt $OUT/native/
#   2: bash ci/cuda-samples.sh build .devbin/cuda-samples.tar.xz /var/tmp/cs &&
#      bash ci/cuda-samples.sh guest .devbin/gpu-vm.tar.xz /var/tmp/cs/progs $OUT/guest
# then here: bash ci/cuda-samples.sh table native/results.tsv guest/results.tsv
# (the build takes about 70 s with 16 jobs, the native run a few minutes,
# the two guests at most 440 s: they start no program in their last
# minute). The bundles: cuda-samples.tar.xz 13 MB (5 MB with
# SAMPLES_LEAN=1), gpu-vm.tar.xz 44 MB.
#
# Environment:
#   CUDA_HOME=/usr/local/cuda   the toolkit of build and run
#   SAMPLES_ARCHS=90            CMAKE_CUDA_ARCHITECTURES of every sample
#   SAMPLES_RUNTIME=Shared      CMAKE_CUDA_RUNTIME_LIBRARY (Shared, Static)
#   SAMPLES_RDC=1               0: without the separable compilation every
#                               sample's CMakeLists.txt turns on
#   SAMPLES_ONLY=a,b            build only these samples (folder names)
#   SAMPLES_LIBCUDA=PATH        the libcuda.so the driver API samples link
#                               with where the toolkit has no stub
#   SAMPLES_LEAN=1              bundle: leave out the OpenGL and FreeImage
#                               samples too (CMake skips them where there
#                               is no display or FreeImage)
#   SAMPLES_JOBS=4              runs at a time (run; each guest: LIB_SMP)
#   SAMPLES_TIMEOUT=60          seconds a run may take (guest: 120)
#   SAMPLES_BUDGET=0            seconds for all runs (0: no limit; guest:
#                               VM_TIMEOUT less 60): no run goes past
#                               them, and one not started by then is
#                               "notrun"
#   SAMPLES_GPUS                GPUs for min_gpus (nvidia-smi's count; 1)
#   SAMPLES_SHARD=0/1           run: S/N runs every Nth program from the
#                               Sth on (0/2 and 1/2 share them)
#   GUEST_MEM=12GiB-in-bytes    each vGPU's memory quota (guest)
#   VM_TIMEOUT=440, LIB_MEM_MB=8192, LIB_SMP=6  each guest's time limit,
#                               RAM and vCPUs (guest)
set -euo pipefail

# Tag v13.0 of github.com/NVIDIA/cuda-samples.
SAMPLES_COMMIT=3f1c50965017932fc81e6d94a3fc9e04c105b312
SAMPLES_CATEGORIES=(0_Introduction 1_Utilities 2_Concepts_and_Techniques
    3_CUDA_Features 4_CUDA_Libraries 6_Performance)
# The bundle leaves out the samples whose CMakeLists.txt looks for one of
# these, which the GPU machine lacks (CMake there would skip them); with
# SAMPLES_LEAN=1 also those that want a display or FreeImage (8 MB less).
SAMPLES_DROPPED_DEPS=(EGL NVSCI)
[[ ${SAMPLES_LEAN:-0} == 1 ]] && SAMPLES_DROPPED_DEPS+=(OpenGL GLUT FreeImage Vulkan)
# What the software backend runs: samples that use no SASS-only library
# (cuBLAS, cuFFT, cuRAND's host API, NPP, nvJPEG ship machine code only)
# and no IPC, and that finish in a few minutes at most on the PTX
# executor: kernels, streams and events, callbacks, zero-copy and pinned
# memory, printf and assert, warp votes, shuffles and atomics, half2,
# inline PTX, cooperative groups (blocks, tiles, binary partitions),
# stream-ordered allocation, priorities, large kernel parameters, PTX
# loaded through the driver API, Thrust, textures and surfaces over
# arrays (layered, cubemap) and pitched memory, graphs (captured, with
# memory nodes), and image and geometry samples built of these.
# docs/guest-cuda.md, "NVIDIA's cuda-samples", says which fail and why.
SOFTWARE_SUBSET=(vectorAdd template simpleTemplates simpleVoteIntrinsics
    simpleAtomicIntrinsics simplePrintf simpleAssert simpleCallback
    simpleOccupancy simpleZeroCopy simpleHyperQ simpleMultiCopy simpleMultiGPU
    cudaOpenMP clock inlinePTX fp16ScalarProduct scalarProd shfl_scan
    threadFenceReduction transpose simpleCooperativeGroups binaryPartitionCG
    warpAggregatedAtomicsCG systemWideAtomics streamOrderedAllocation
    StreamPriorities LargeKernelParameter ptxjit deviceQuery deviceQueryDrv
    topologyQuery radixSortThrust simpleTexture simplePitchLinearTexture
    simpleLayeredTexture simpleCubemapTexture simpleSurfaceWrite
    simpleCudaGraphs graphMemoryNodes graphMemoryFootprint jacobiCudaGraphs
    dct8x8 convolutionTexture lineOfSight segmentationTreeThrust reduction)

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")

# log MESSAGE...: a progress line on stderr (ci/lib.sh's, for the
# subcommands that run where the checkout is not: in a guest).
log() {
    printf '[%s] cuda-samples: %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

die() {
    log "ERROR: $*"
    exit 1
}

usage() {
    sed -n '6,11s/^# \{0,1\}//p' "$self" >&2
    exit 2
}

# --- bundle ----------------------------------------------------------------------

cmd_bundle() {
    [[ $# -ge 1 && -d $1 ]] || usage
    local git=$1 out=${2:-.devbin/cuda-samples.tar.xz} stage
    git -C "$git" cat-file -e "$SAMPLES_COMMIT^{commit}" 2>/dev/null ||
        die "$git has no commit $SAMPLES_COMMIT (tag v13.0 of NVIDIA/cuda-samples)"
    stage=$(mktemp -d /tmp/vgpud-cuda-samples.XXXXXX)
    # shellcheck disable=SC2064  # the folder is known now
    trap "rm -rf '$stage'" EXIT
    python3 - "$git" "$SAMPLES_COMMIT" "$stage/cuda-samples" "${SAMPLES_CATEGORIES[*]}" \
        "${SAMPLES_DROPPED_DEPS[*]}" <<'PY'
import re, subprocess, sys
from pathlib import Path

git, commit, dest, cats, deps = sys.argv[1:6]
cats, deps = cats.split(), deps.split()
dest = Path(dest)
paths = ["Common", "cmake", "CMakeLists.txt", "LICENSE", "test_args.json",
         "Samples/CMakeLists.txt"] + [f"Samples/{c}" for c in cats]
ls = subprocess.run(["git", "-C", git, "ls-tree", "-r", "-z", commit, "--"] + paths,
                    check=True, capture_output=True).stdout
def show(path):
    return subprocess.run(["git", "-C", git, "show", f"{commit}:{path}"],
                          check=True, capture_output=True).stdout.decode()
recs = [r for r in ls.split(b"\0") if r]
dropped = set()
for rec in recs:
    path = rec.split(b"\t", 1)[1].decode()
    parts = path.split("/")
    if parts[0] == "Samples" and len(parts) == 4 and parts[3] == "CMakeLists.txt":
        found = re.findall(r"find_package\((\w+)", show(path))
        if any(d in found for d in deps):
            dropped.add(parts[2])
entries = []
for rec in recs:
    meta, path = rec.split(b"\t", 1)
    mode, kind, obj = meta.split()
    path = path.decode()
    parts = path.split("/")
    if kind != b"blob" or "doc" in parts[:-1] or path.startswith("Common/lib/"):
        continue
    if parts[0] == "Samples" and len(parts) > 3 and parts[2] in dropped:
        continue
    # Visual Studio and Windows-only files.
    if re.search(r"\.(sln|vcxproj(\.filters)?|lib|dll|exe)$", path):
        continue
    entries.append((mode, obj.decode(), path))
cat = subprocess.Popen(["git", "-C", git, "cat-file", "--batch"],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
missing = []
for mode, obj, path in entries:
    cat.stdin.write(obj.encode() + b"\n")
    cat.stdin.flush()
    head = cat.stdout.readline().split()
    if head[-1] == b"missing":
        missing.append(path)
        continue
    data = cat.stdout.read(int(head[2]))
    cat.stdout.read(1)
    f = dest / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    if mode == b"100755" or mode == "100755":
        f.chmod(0o755)
cat.stdin.close()
cat.wait()
# Only the carried categories, and only the samples the bundle holds.
top = dest / "Samples/CMakeLists.txt"
out, keep = [], True
for line in top.read_text().splitlines():
    m = re.match(r'\s*set\(CMAKE_FOLDER "([^"/]+)', line)
    if m:
        keep = m.group(1) in cats
    if line.strip().startswith(("if(", "endif(")):
        keep = False
    if keep:
        out.append(line)
top.write_text("\n".join(out) + "\n")
for c in cats:
    f = dest / "Samples" / c / "CMakeLists.txt"
    lines = []
    for line in f.read_text().splitlines():
        m = re.match(r"\s*add_subdirectory\((\w+)\)", line)
        if m and not (f.parent / m.group(1) / "CMakeLists.txt").exists():
            continue
        lines.append(line)
    f.write_text("\n".join(lines) + "\n")
(dest / "COMMIT").write_text(commit + "\n")
print("cuda-samples: samples left out: " + " ".join(sorted(dropped)),
      file=sys.stderr)
for p in missing:
    print(f"cuda-samples: not in {git} (left out): {p}", file=sys.stderr)
PY
    mkdir -p "$(dirname "$out")"
    XZ_OPT=-9 tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner \
        --mtime=@0 -cJf "$out" cuda-samples
    log "wrote $out ($(du -h "$out" | cut -f1), $(find "$stage/cuda-samples/Samples" -mindepth 2 -maxdepth 2 -type d | wc -l) samples)"
}

# --- build -----------------------------------------------------------------------

# filter_samples SRCDIR a,b,...: only these samples (and their categories)
# stay in the CMake tree.
filter_samples() {
    python3 - "$1" "$2" <<'PY'
import re, sys
from pathlib import Path
src, only = Path(sys.argv[1]), set(sys.argv[2].split(","))
found, cats = set(), set()
for f in sorted((src / "Samples").glob("*/CMakeLists.txt")):
    lines = []
    for line in f.read_text().splitlines():
        m = re.match(r"\s*add_subdirectory\((\w+)\)", line)
        if m and m.group(1) not in only:
            continue
        if m:
            found.add(m.group(1))
            cats.add(f.parent.name)
        lines.append(line)
    f.write_text("\n".join(lines) + "\n")
top = src / "Samples/CMakeLists.txt"
out, keep = [], True
for line in top.read_text().splitlines():
    m = re.match(r'\s*set\(CMAKE_FOLDER "([^"/]+)', line)
    if m:
        keep = m.group(1) in cats
    if keep:
        out.append(line)
top.write_text("\n".join(out) + "\n")
for name in sorted(only - found):
    print(f"cuda-samples: no sample {name}", file=sys.stderr)
sys.exit(1 if only - found else 0)
PY
}

# is_elf FILE
is_elf() {
    [[ $(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ') == '177ELF' ]]
}

cmd_build() {
    [[ $# -eq 2 ]] || usage
    local src=$1 build=$2 cuda_home=${CUDA_HOME:-/usr/local/cuda} t0=$SECONDS
    local archs=${SAMPLES_ARCHS:-90} jobs
    jobs=$(nproc)
    [[ -x $cuda_home/bin/nvcc ]] || die "no nvcc in $cuda_home (set CUDA_HOME)"
    command -v cmake >/dev/null || die "no cmake"
    command -v ninja >/dev/null || die "no ninja"
    mkdir -p "$build"
    build=$(cd "$build" && pwd)
    rm -rf "$build/src" "$build/cmake" "$build/progs"
    if [[ -f $src ]]; then
        mkdir -p "$build/src"
        tar -C "$build/src" --strip-components=1 -xJf "$src"
    else
        cp -r "$src" "$build/src"
    fi
    # Every sample names its own architectures: one list for all of them.
    find "$build/src" -name CMakeLists.txt -exec sed -i -E \
        "s/^([[:space:]]*set\(CMAKE_CUDA_ARCHITECTURES)[[:space:]][^)]*\)/\1 $archs)/" {} +
    if [[ ${SAMPLES_RDC:-1} == 0 ]]; then
        find "$build/src" -name CMakeLists.txt -exec sed -i -E \
            's/(CUDA_SEPARABLE_COMPILATION[[:space:]]+)ON/\1OFF/' {} +
    fi
    if [[ -n ${SAMPLES_ONLY:-} ]]; then
        filter_samples "$build/src" "$SAMPLES_ONLY" || die "SAMPLES_ONLY names samples the source lacks"
    fi
    # NVIDIA's wheels (ci/fetch-cuda.sh) keep the libraries in lib/, where
    # their nvcc does not look.
    # They have no libcudart.so either, which FindCUDAToolkit looks for.
    local flags=""
    local -a more=()
    [[ -d $cuda_home/lib64 ]] || flags="-L$cuda_home/lib"
    [[ -e $cuda_home/lib64/libcudart.so || ! -e $cuda_home/lib/libcudart.so.13 ]] ||
        more+=(-DCUDA_CUDART="$cuda_home/lib/libcudart.so.13" -DCUDA_cudart_LIBRARY="$cuda_home/lib/libcudart.so.13")
    # Nor the driver's stub: the driver API samples link with
    # SAMPLES_LIBCUDA (the guest's libcuda.so.1) then.
    [[ -z ${SAMPLES_LIBCUDA:-} ]] || more+=(-DCUDA_cuda_driver_LIBRARY="$SAMPLES_LIBCUDA")
    log "configuring ($(cat "$build/src/COMMIT" 2>/dev/null || echo "unknown commit"), CUDA architectures $archs)"
    cmake -S "$build/src" -B "$build/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_FLAGS="$flags" ${more[@]+"${more[@]}"} \
        -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" -DCUDAToolkit_ROOT="$cuda_home" \
        -DCMAKE_CUDA_RUNTIME_LIBRARY="${SAMPLES_RUNTIME:-Shared}" \
        >"$build/configure.log" 2>&1 || {
        tail -n 40 "$build/configure.log" >&2
        die "CMake could not configure the samples ($build/configure.log)"
    }
    log "building with $jobs jobs"
    # -k 0: every target that can be built is.
    ninja -C "$build/cmake" -k 0 -j "$jobs" >"$build/build.log" 2>&1 || true
    # The samples (category/folder) whose outputs failed.
    { sed -n 's/^FAILED: //p' "$build/build.log" || true; } | tr ' ' '\n' |
        sed -nE 's#^(.*/cmake/)?Samples/([^/]+/[^/]+)/.*#\2#p' | sort -u >"$build/build-failed.txt"
    # Stage each program with what its folder holds (data the build
    # copied there), without CMake's own files.
    mkdir -p "$build/progs"
    local exe dir name n=0
    while IFS= read -r exe; do
        is_elf "$exe" || continue
        dir=$(dirname "$exe")
        name=$(basename "$exe")
        mkdir -p "$build/progs/$name"
        (cd "$dir" && find . -mindepth 1 -maxdepth 1 ! -name CMakeFiles ! -name cmake_install.cmake \
            ! -name '*.ninja' -exec cp -r {} "$build/progs/$name/" \;)
        n=$((n + 1))
    done < <(find "$build/cmake/Samples" -path '*/CMakeFiles' -prune -o -type f -perm -u+x ! -name '*.so*' -print | sort)
    cp "$build/src/test_args.json" "$build/progs/"
    cp "$self" "$build/progs/cuda-samples.sh"
    cp "$build/src/COMMIT" "$build/progs/" 2>/dev/null || true
    log "built $n programs in $((SECONDS - t0)) s; $(wc -l <"$build/build-failed.txt") target(s) failed"
    sed 's/^/  failed: /' "$build/build-failed.txt" >&2
}

# --- run -------------------------------------------------------------------------

# tasks PROGDIR GPUS SHARD SHARDS [PROGRAM...]: one line per run of every
# SHARDS-th program from the SHARD-th on (by name), fields separated by
# the ASCII unit separator: program, run number, what to do without
# running ("" to run, skip, or waive:reason), the arguments.
tasks() {
    python3 - "$@" <<'PY'
import json, os, sys
progs, gpus, shard, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
only = sys.argv[5:]
try:
    with open(os.path.join(progs, "test_args.json")) as f:
        config = json.load(f)
except (OSError, ValueError):
    config = {}
names = sorted(n for n in os.listdir(progs)
               if os.path.isfile(os.path.join(progs, n, n)))
if only:
    names = [n for n in names if n in only]
names = names[shard::shards]
for name in names:
    c = config.get(name, {})
    if not isinstance(c, dict):
        c = {}
    pre = ""
    if c.get("skip"):
        pre = "skip"
    elif int(c.get("min_gpus", 1)) > gpus:
        pre = f"waive:needs {c['min_gpus']} GPUs"
    runs = [{"args": c["args"]}] if isinstance(c.get("args"), list) else \
        [r for r in c.get("runs", []) if isinstance(r, dict) and isinstance(r.get("args", []), list)]
    runs = runs or [{"args": []}]
    for i, r in enumerate(runs, 1):
        what = "skip" if r.get("skip") else pre
        print("\x1f".join([name, str(i), what] + [str(a) for a in r.get("args", [])]))
PY
}

# classify EXIT LOG: pass, waive, fail or timeout, by the exit status and
# the samples' own words.
classify() {
    local rc=$1 log=$2
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo timeout
    elif [[ $rc -eq 2 ]]; then
        echo waive
    elif [[ $rc -ne 0 ]]; then
        echo fail
    elif grep -qiE 'waiv(e|ed|ing)\b' "$log"; then
        echo waive
    elif grep -qE '^[[:space:]]*(Test failed|Test FAILED|Result = FAIL)' "$log"; then
        echo fail
    else
        echo pass
    fi
}

# last_line LOG: the last non-empty line, fit for a table cell.
last_line() {
    { grep -v '^[[:space:]]*$' "$1" 2>/dev/null || true; } | tail -n 1 | tr -d '\r' | tr '\t|' '  ' | cut -c 1-160
}

# one PROGDIR OUTDIR SCRATCH CONSOLE TASK: one run; its result line goes
# to OUTDIR/results.tsv (and to CONSOLE, "-" for none).
cmd__one() {
    local progs=$1 out=$2 scratch=$3 console=$4 name run what
    local -a args
    IFS=$'\x1f' read -r -a args <<<"$5"
    name=${args[0]} run=${args[1]} what=${args[2]:-}
    args=("${args[@]:3}")
    local log=$out/logs/$name.$run.txt status rc=0 t0 secs line
    if [[ $what == skip ]]; then
        status=skip rc=- secs=0 line="test_args.json: skip"
    elif [[ $what == waive:* ]]; then
        status=waive rc=- secs=0 line=${what#waive:}
    elif [[ -n ${SAMPLES_DEADLINE:-} && $(($(date +%s) + 5)) -ge $SAMPLES_DEADLINE ]]; then
        status=notrun rc=- secs=0 line="not started: out of time"
    else
        # No run goes past the deadline.
        local limit=${SAMPLES_TIMEOUT:-60}
        if [[ -n ${SAMPLES_DEADLINE:-} && $((SAMPLES_DEADLINE - $(date +%s))) -lt $limit ]]; then
            limit=$((SAMPLES_DEADLINE - $(date +%s)))
        fi
        local work=$scratch/$name.$run
        rm -rf "$work"
        cp -r "$progs/$name" "$work"
        t0=$(date +%s%N)
        (cd "$work" && exec timeout -k 5 "$limit" "./$name" ${args[@]+"${args[@]}"}) \
            </dev/null >"$log" 2>&1 || rc=$?
        secs=$((($(date +%s%N) - t0) / 1000000))
        secs=$((secs / 1000)).$(printf '%03d' $((secs % 1000)))
        rm -rf "$work"
        status=$(classify "$rc" "$log")
        line=$(last_line "$log")
    fi
    line=$(printf '%s\t%s\t%s\t%s\t%s\t%s' "$name" "$run" "$status" "$rc" "$secs" "$line")
    printf '%s\n' "$line" >>"$out/results.tsv"
    [[ $console == - ]] && return 0
    {
        # What a run that failed said last: the guest's files are gone
        # when it powers off.
        if [[ $status == fail || $status == timeout ]]; then
            tail -n "${SAMPLES_LOG_LINES:-12}" "$log" | tr -d '\r' | sed "s/^/CUDA-SAMPLE-LOG $name.$run: /"
        fi
        printf 'CUDA-SAMPLE\t%s\n' "$line"
    } >"$console" 2>/dev/null || true
}

# run_tasks PROGDIR OUTDIR CONSOLE: the tasks on stdin, SAMPLES_JOBS at a time.
run_tasks() {
    local progs=$1 out=$2 console=$3 scratch
    mkdir -p "$out/logs"
    : >"$out/results.tsv"
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/cuda-samples-run.XXXXXX")
    if [[ ${SAMPLES_BUDGET:-0} -gt 0 ]]; then
        SAMPLES_DEADLINE=$(($(date +%s) + SAMPLES_BUDGET))
        export SAMPLES_DEADLINE
    fi
    tr '\n' '\0' | xargs -0 -r -P "${SAMPLES_JOBS:-4}" -n 1 \
        bash "$self" _one "$progs" "$out" "$scratch" "$console" || true
    rm -rf "$scratch"
}

# summary TSV: "N pass, N waive, ..." over programs (a program's worst run).
summary() {
    python3 - "$1" <<'PY'
import sys
rank = {"pass": 0, "skip": 1, "waive": 2, "notrun": 3, "timeout": 4, "fail": 5}
worst = {}
for line in open(sys.argv[1], errors="replace"):
    f = line.rstrip("\n").split("\t")
    if len(f) >= 3 and f[2] in rank:
        if rank[f[2]] >= rank.get(worst.get(f[0]), -1):
            worst[f[0]] = f[2]
counts = {k: 0 for k in rank}
for s in worst.values():
    counts[s] += 1
print(f"{len(worst)} programs: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
PY
}

cmd_run() {
    [[ $# -ge 2 && -d $1 ]] || usage
    local progs out gpus cuda_home=${CUDA_HOME:-/usr/local/cuda} t0=$SECONDS
    progs=$(cd "$1" && pwd)
    out=$2
    shift 2
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    gpus=${SAMPLES_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
    [[ ${gpus:-0} -ge 1 ]] || gpus=1
    log "running the programs of $progs natively ($gpus GPU(s), ${SAMPLES_JOBS:-4} at a time)"
    export LD_LIBRARY_PATH=$cuda_home/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    local shard=${SAMPLES_SHARD:-0/1}
    tasks "$progs" "$gpus" "${shard%/*}" "${shard#*/}" "$@" | run_tasks "$progs" "$out" -
    log "native: $(summary "$out/results.tsv") in $((SECONDS - t0)) s"
}

# _guest SHARD SHARDS: in a guest (host-cuda mode of
# tests/vm/guest-suite-init.sh: the host's userland, this folder at /mnt)
# run every SHARDS-th program from the SHARD-th on.
cmd__guest() {
    local shard=$1 shards=$2 progs out gpus=0 node
    progs=$(dirname "$self")
    out=/tmp/cuda-samples-out
    # POSIX shared memory (the IPC samples, OpenMP runtimes) wants it.
    mkdir -p /dev/shm
    mountpoint -q /dev/shm || mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    for node in /dev/vgpu[0-9]*; do
        [[ -c $node ]] && gpus=$((gpus + 1))
    done
    [[ $gpus -ge 1 ]] || gpus=1
    echo "cuda-samples: shard $shard of $shards, $gpus vGPU(s), ${SAMPLES_JOBS:-4} at a time" >/dev/console
    tasks "$progs" "$gpus" "$shard" "$shards" | TMPDIR=/tmp run_tasks "$progs" "$out" /dev/console
    # One check for the guest suite: the runs ended (the table judges them).
    local sum
    sum=$(summary "$out/results.tsv")
    if [[ -s $out/results.tsv ]]; then
        echo "PASS cuda-samples-$shard $sum"
    else
        echo "FAIL cuda-samples-$shard: no program ran"
    fi
}

cmd_guest() {
    [[ $# -eq 3 && -f $1 && -d $2 ]] || usage
    local bundle progs out logs timeout=${VM_TIMEOUT:-440}
    bundle=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
    progs=$(cd "$2" && pwd)
    mkdir -p "$3"
    out=$(cd "$3" && pwd)
    [[ -x $progs/cuda-samples.sh ]] || die "$progs is not a folder that build staged"
    # The runs end a minute before the guests are stopped (boot, 9p).
    local budget=${SAMPLES_BUDGET:-$((timeout - 60))}
    local env="SAMPLES_JOBS=${SAMPLES_JOBS:-${LIB_SMP:-6}},SAMPLES_TIMEOUT=${SAMPLES_TIMEOUT:-120},SAMPLES_BUDGET=$budget"
    local mem=${GUEST_MEM:-$((12 << 30))} rc=0
    log "two guests run the programs of $progs"
    # shellcheck disable=SC2097,SC2098  # the values are gpu-vm.sh's
    ONLY_LIBS=1 LIB_DIR=$progs LIB_RUN=cuda-samples.sh:_guest:0:2 LIB_RUN_B=cuda-samples.sh:_guest:1:2 \
        LIB_MEM_MB=${LIB_MEM_MB:-8192} LIB_SMP=${LIB_SMP:-6} MEM_A=$mem MEM_B=$mem VM_TIMEOUT=$timeout VM_KEEP=1 \
        GUEST_APPEND="vgpu.host_env=$env ${GUEST_APPEND:-}" \
        bash "$(dirname "$self")/../tests/vm/gpu-vm.sh" "$bundle" 2>&1 | tee "$out/gpu-vm.log" >&2 || rc=$?
    logs=$(sed -n 's/.*logs kept in //p' "$out/gpu-vm.log" | tail -n 1)
    [[ -n $logs && -d $logs ]] || die "gpu-vm.sh left no logs (exit $rc)"
    : >"$out/results.tsv"
    : >"$out/failed-runs.txt"
    local g
    for g in a b; do
        [[ -f $logs/guest-libs-$g.log ]] || continue
        cp "$logs/guest-libs-$g.log" "$out/"
        tr -d '\r' <"$logs/guest-libs-$g.log" | sed -n 's/^.*CUDA-SAMPLE\t//p' >>"$out/results.tsv"
        tr -d '\r' <"$logs/guest-libs-$g.log" | sed -n 's/^.*CUDA-SAMPLE-LOG //p' >>"$out/failed-runs.txt"
    done
    cp "$logs/vgpud.log" "$out/" 2>/dev/null || true
    # What gpu-vm.sh kept is in OUTDIR now (the rest is its bundle).
    rm -rf "$logs"
    log "guests: $(summary "$out/results.tsv") (gpu-vm.sh exit $rc)"
}

# --- table -----------------------------------------------------------------------

cmd_table() {
    [[ $# -ge 1 ]] || usage
    python3 - "$@" <<'PY'
import sys
rank = {"pass": 0, "skip": 1, "waive": 2, "notrun": 3, "timeout": 4, "fail": 5}
cols, paths = [], []
for i, arg in enumerate(sys.argv[1:]):
    label, eq, path = arg.partition("=")
    if not eq or "/" in label:
        label, path = ["native", "guest", "software", "other"][min(i, 3)], arg
    cols.append(label)
    paths.append(path)
res = []
for path in paths:
    worst, why = {}, {}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        f = line.split("\t")
        if len(f) < 3 or f[2] not in rank:
            continue
        if rank[f[2]] >= rank.get(worst.get(f[0]), -1):
            worst[f[0]] = f[2]
            why[f[0]] = f[5] if len(f) > 5 else ""
    res.append((worst, why))
names = sorted(set().union(*(w for w, _ in res)), key=str.lower)
width = max([len(n) for n in names] + [7])
last = f"{cols[1]}'s last line" if len(cols) > 1 else "last line"
print("| program".ljust(width + 2) + " | " + " | ".join(c.ljust(7) for c in cols) + f" | {last} |")
print("|" + "-" * (width + 2) + "|" + "|".join("-" * 9 for _ in cols) + "|---|")
for n in names:
    cells = [w.get(n, "-") for w, _ in res]
    note = ""
    if len(res) > 1 and cells[0] == "pass" and cells[1] != "pass":
        note = res[1][1].get(n, "")
    elif len(res) == 1 and cells[0] != "pass":
        note = res[0][1].get(n, "")
    print(f"| {n.ljust(width)} | " + " | ".join(c.ljust(7) for c in cells) + f" | {note} |")
print()
for c, (w, _) in zip(cols, res):
    counts = {k: 0 for k in rank}
    for s in w.values():
        counts[s] += 1
    print(f"{c}: {len(w)} programs: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
if len(res) > 1:
    native, guest = res[0][0], res[1][0]
    both = [n for n in names if native.get(n) == "pass"]
    ok = [n for n in both if guest.get(n) == "pass"]
    print(f"{cols[1]} passes {len(ok)} of the {len(both)} programs that pass in {cols[0]}")
    worse = [n for n in both if guest.get(n) != "pass"]
    if worse:
        print(f"not in {cols[1]}: " + " ".join(worse))
PY
}

# --- software: the subset on the software backend, here ----------------------------

cmd_software() {
    [[ $# -ge 1 ]] || usage
    # shellcheck source=ci/lib.sh
    . "$(dirname "$self")/lib.sh"
    local src=$1 out=${2:-/tmp/vgpud-cuda-samples-sw} tarball toolkit
    cd "$VGPUD_ROOT"
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    if [[ -d $src ]]; then
        tarball=$out/cuda-samples.tar.xz
        cmd_bundle "$src" "$tarball"
    else
        tarball=$src
    fi
    command -v cmake >/dev/null || apt-get install -y cmake >&2
    toolkit=$(bash ci/fetch-cuda.sh)
    # As on the GPU (the executor takes the compute_90 PTX), on the static
    # runtime.
    local only
    only=$(
        IFS=,
        echo "${SOFTWARE_SUBSET[*]}"
    )
    local libcuda=${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/guest-cuda/x86_64-unknown-linux-gnu/release/libcuda.so
    [[ -f $libcuda ]] || bash ci/gpu-vm-bundle.sh .devbin/gpu-vm.tar.xz
    # Without separable compilation: built with it, a program's kernels
    # are linked into machine code at build time and the PTX executor
    # finds no image it runs (cudaErrorNoKernelImageForDevice).
    SAMPLES_RDC=0 CUDA_HOME=$toolkit SAMPLES_ARCHS=90 SAMPLES_RUNTIME=Static SAMPLES_ONLY=$only \
        SAMPLES_LIBCUDA=$libcuda \
        cmd_build "$tarball" "$out/build"
    [[ -f .devbin/gpu-vm.tar.xz ]] || bash ci/gpu-vm-bundle.sh .devbin/gpu-vm.tar.xz
    GPU_BACKEND=software GUEST_MEM=$((2 << 30)) LIB_MEM_MB=${LIB_MEM_MB:-2048} LIB_SMP=${LIB_SMP:-2} \
        SAMPLES_JOBS=${SAMPLES_JOBS:-1} SAMPLES_TIMEOUT=${SAMPLES_TIMEOUT:-300} \
        VM_TIMEOUT=${VM_TIMEOUT:-1800} cmd_guest .devbin/gpu-vm.tar.xz "$out/build/progs" "$out/guest"
    cmd_table software="$out/guest/results.tsv"
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
case $sub in
bundle | build | run | guest | table | software | _one | _guest) "cmd_$sub" "$@" ;;
*) usage ;;
esac
