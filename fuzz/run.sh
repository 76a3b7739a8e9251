#!/usr/bin/env bash
# Build the sanitized fuzz targets of the native codec and run each for a while.
#
#   fuzz/run.sh fuzz    FUZZ_SECONDS per target; new inputs kept in fuzz/build/work/<target>
#   fuzz/run.sh smoke   CI: a short run per target; never fails for a missing tool, only for a finding
#   fuzz/run.sh cov     llvm-cov line coverage of the native units over the seeds and the kept inputs
#
# Toolchains, first that builds wins: clang + libFuzzer + ASan/UBSan; gcc (or cc) + ASan/UBSan with
# fuzz/driver.c (corpus replay plus random mutations); cc without sanitizers (a warning). When clang
# is missing and we are root with apt-get, it is installed first (FUZZ_INSTALL=0 to skip).
# The targets link only the codec's Python-free units (ray_tfrecord/_src/core/native/*.c but module.c): no Python
# is needed to build or run them (only `cov` uses it, to merge the per-target reports).
# Variables: FUZZ_SECONDS (60; smoke: 5), FUZZ_TARGETS (all), FUZZ_PYTHON (.venv/bin/python, python3.11, python3),
# FUZZ_OUT (fuzz/build), FUZZ_INSTALL (1).
set -uo pipefail

MODE=${1:-fuzz}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${FUZZ_OUT:-$ROOT/fuzz/build}
SECONDS_PER=${FUZZ_SECONDS:-$([ "$MODE" = smoke ] && echo 5 || echo 60)}
TARGETS=${FUZZ_TARGETS:-scan decode_example decode_sequence inspect encode pool tensor jpeg}
SRC="$ROOT/fuzz/fuzz_native.c"
UNITS=()
for f in "$ROOT"/ray_tfrecord/_src/core/native/*.c; do [ "$(basename "$f")" = module.c ] || UNITS+=("$f"); done

say() { echo "fuzz: $*" >&2; }
# A missing tool ends a smoke run successfully (CI must not fail for it), anything else with an error.
give_up() {
    if [ "$MODE" = smoke ]; then say "WARNING: $* -- skipping the fuzz smoke run"; exit 0; fi
    say "ERROR: $*"; exit 2
}

PY=${FUZZ_PYTHON:-}
for cand in "$ROOT/.venv/bin/python" python3.11 python3; do
    [ -n "$PY" ] && break
    command -v "$cand" >/dev/null 2>&1 && PY=$cand
done
WARN=(-std=c11 -Wall -Wextra -Wno-unused-parameter -Wno-unused-function) # one target used per binary

# The jpeg target links the system's libjpeg-turbo (>= 1.5: the crop API), uninstrumented; without
# it the target is left out, as setup.py then builds the extension without the window decode.
JPEG=()
jpeg_probe=$(mktemp -d)
printf '#include <stdio.h>\n#include <jpeglib.h>\nint main(void) { struct jpeg_decompress_struct c; JDIMENSION x = 0, w = 1;\n jpeg_crop_scanline(&c, &x, &w); return 0; }\n' > "$jpeg_probe/p.c"
if cc "$jpeg_probe/p.c" -o "$jpeg_probe/p" -ljpeg >/dev/null 2>&1; then
    JPEG=(-DRT_HAVE_JPEG -ljpeg)
elif [[ " $TARGETS " == *" jpeg "* ]]; then
    say "WARNING: no libjpeg-turbo with the crop API (e.g. apt-get install libjpeg62-turbo-dev): the jpeg target is left out"
    TARGETS=$(echo " $TARGETS " | sed 's/ jpeg / /; s/^ *//; s/ *$//')
fi
rm -rf "$jpeg_probe"

links() { # compiler flags...: can it build a trivial program with these?
    local dir; dir=$(mktemp -d)
    printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n%s\n' \
        "$([[ " $* " == *fuzzer* ]] || echo 'int main(void) { return LLVMFuzzerTestOneInput(0, 0); }')" > "$dir/t.c"
    "$@" "$dir/t.c" -o "$dir/t" >/dev/null 2>&1 && "$dir/t" -runs=1 >/dev/null 2>&1
    local rc=$?; rm -rf "$dir"; return $rc
}

install_clang() {
    [ "${FUZZ_INSTALL:-1}" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    say "installing clang with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends clang >/dev/null 2>&1 || return 0
    local v; v=$(clang -dumpversion 2>/dev/null | cut -d. -f1)
    apt-get install -y -qq --no-install-recommends "libclang-rt-$v-dev" >/dev/null 2>&1 || true
}

build() { # kind: libfuzzer | driver-san | driver-plain; compiler in $CC_FUZZ
    local kind=$1 t flags=(-g -O1 -fno-omit-frame-pointer) extra=()
    case $kind in
        libfuzzer) flags+=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all) ;;
        driver-san) flags+=(-fsanitize=address,undefined -fno-sanitize-recover=all); extra=("$ROOT/fuzz/driver.c") ;;
        driver-plain) flags=(-g -O1); extra=("$ROOT/fuzz/driver.c") ;;
        coverage) flags=(-g -O0 -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping) ;;
    esac
    mkdir -p "$OUT/bin-$kind"
    for t in $TARGETS; do
        "$CC_FUZZ" "${flags[@]}" "${WARN[@]}" -pthread -DFUZZ_TARGET="fuzz_$t" "$SRC" "${UNITS[@]}" "${extra[@]}" \
            "${JPEG[@]}" -o "$OUT/bin-$kind/$t" >"$OUT/build-$kind.log" 2>&1 || return 1
    done
}

pick_toolchain() {
    command -v clang >/dev/null 2>&1 && links clang -fsanitize=fuzzer,address,undefined || install_clang
    if command -v clang >/dev/null 2>&1 && links clang -fsanitize=fuzzer,address,undefined; then
        CC_FUZZ=clang; build libfuzzer && { KIND=libfuzzer; return; }
        say "WARNING: clang/libFuzzer build failed (see $OUT/build-libfuzzer.log)"
    fi
    for cc in gcc cc clang; do
        command -v $cc >/dev/null 2>&1 && links $cc -fsanitize=address,undefined || continue
        CC_FUZZ=$cc; build driver-san && { KIND=driver-san; say "libFuzzer unavailable: $cc ASan/UBSan build, corpus replay plus random mutations"; return; }
    done
    for cc in gcc cc clang; do
        command -v $cc >/dev/null 2>&1 || continue
        CC_FUZZ=$cc; build driver-plain && { KIND=driver-plain; say "WARNING: no sanitizer runtime: $cc build without sanitizers"; return; }
    done
    give_up "no compiler could build the fuzz targets (see $OUT/build-*.log)"
}

run_target() { # target: runs it, prints a summary line, returns non-zero on a finding
    local t=$1 log="$OUT/logs/$t.log" bin="$OUT/bin-$KIND/$t" rc
    mkdir -p "$OUT/logs" "$OUT/artifacts" "$WORK/$t"
    if [ "$KIND" = libfuzzer ]; then
        "$bin" -max_total_time="$SECONDS_PER" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$OUT/artifacts/$t-" "$WORK/$t" "$ROOT/fuzz/corpus/$t" >"$log" 2>&1
    else
        "$bin" -seconds="$SECONDS_PER" -artifact_prefix="$OUT/artifacts/$t-" "$ROOT/fuzz/corpus/$t" >"$log" 2>&1
    fi
    rc=$?
    if [ $rc -ne 0 ] && grep -q "LeakSanitizer has encountered a fatal error\|LeakSanitizer does not work under ptrace" "$log"; then
        say "WARNING: LeakSanitizer cannot run here (ptrace restricted); $t again without leak checks"
        ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" run_target "$t"; return $?
    fi
    summarize "$t" "$log"
    if [ $rc -ne 0 ]; then
        say "FINDING in $t (exit $rc): see $log; reproducer under $OUT/artifacts/ (replay: $bin FILE)"
        grep -m5 -E "ERROR:|runtime error|fuzz check failed|SUMMARY" "$log" >&2
    fi
    return $rc
}

summarize() { # target log
    if [ "$KIND" = libfuzzer ]; then
        local execs cov ft
        execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$2" | grep -o '[0-9]*$')
        cov=$(grep -oE '(INITED|DONE|NEW|REDUCE|pulse) +cov: [0-9]+ ft: [0-9]+' "$2" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+')
        echo "fuzz: $1: ${execs:-?} executions in ${SECONDS_PER}s, ${cov:-no coverage line}"
    else
        grep -h "^driver:" "$2" | tail -1 | sed "s/^driver:/fuzz: $1:/"
    fi
}

coverage() {
    command -v llvm-profdata >/dev/null && command -v llvm-cov >/dev/null || give_up "llvm-profdata/llvm-cov not found"
    [ -n "$PY" ] || give_up "no python found (it merges the per-target reports)"
    CC_FUZZ=clang; build coverage || give_up "coverage build failed (see $OUT/build-coverage.log)"
    local t
    rm -rf "$OUT/profraw" && mkdir -p "$OUT/profraw"
    # One profile per target: the binaries share function names, so a merged profile would clash.
    for t in $TARGETS; do
        mkdir -p "$WORK/$t"
        LLVM_PROFILE_FILE="$OUT/profraw/$t.profraw" "$OUT/bin-coverage/$t" -runs=0 "$WORK/$t" "$ROOT/fuzz/corpus/$t" \
            >"$OUT/logs/cov-$t.log" 2>&1
        llvm-profdata merge -sparse "$OUT/profraw/$t.profraw" -o "$OUT/profraw/$t.profdata"
        llvm-cov export -format=lcov "$OUT/bin-coverage/$t" -instr-profile="$OUT/profraw/$t.profdata" \
            "${UNITS[@]}" "$ROOT"/ray_tfrecord/_src/core/native/*.h >"$OUT/profraw/$t.lcov"
    done
    "$PY" "$ROOT/fuzz/lcov_union.py" "$OUT"/profraw/*.lcov
}

mkdir -p "$OUT/logs"
WORK="$OUT/work"
[ "$MODE" = smoke ] && WORK=$(mktemp -d) # CI: nothing written into the source tree but fuzz/build
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
case $MODE in
    cov) coverage; exit $? ;;
    fuzz|smoke) ;;
    *) echo "usage: $0 fuzz|smoke|cov" >&2; exit 2 ;;
esac
pick_toolchain
say "toolchain: $KIND ($CC_FUZZ); $SECONDS_PER s per target: $TARGETS"
status=0
for t in $TARGETS; do run_target "$t" || status=1; done
[ "$MODE" = smoke ] && rm -rf "$WORK"
exit $status
