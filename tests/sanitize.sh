#!/bin/sh
# make sanitize: the C extensions built with AddressSanitizer and
# UndefinedBehaviorSanitizer, then the tests of the C paths (the C half of those
# that run both) and the seeded fuzzers (tests/fuzz.py) run against that build.
# Fails on any test failure and on any sanitizer report (reports go to files, so
# one in a child process counts too).  The normal build is put back on every exit.
#   FUZZ_SECONDS (default 60) and FUZZ_SEED (default 1) set the fuzzers' run.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=build/sanitize
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_SEED=${FUZZ_SEED:-1}

build() {   # build(what, CFLAGS, LDFLAGS): both extensions in place, from scratch
    mkdir -p build
    # No flags: none in the environment at all (an empty CFLAGS replaces Python's
    # own, -O3 among them, and leaves an unoptimised build behind).
    if [ -n "$2" ]; then
        set -- "$1" env CFLAGS="$2" LDFLAGS="$3"
    else
        set -- "$1" env -u CFLAGS -u LDFLAGS
    fi
    what=$1
    shift
    if ! "$@" "$PY" setup.py build_ext --inplace --force \
            -b "build/$what" -t "build/$what-tmp" >"build/$what.log" 2>&1; then
        cat "build/$what.log"
        return 1
    fi
    for ext in _speedups _encoder _pool; do   # optional extensions: a failed one is skipped quietly
        ls gtarantool/$ext.*.so >/dev/null 2>&1 || { echo "gtarantool/$ext did not build" \
            "(build/$what.log):"; cat "build/$what.log"; return 1; }
    done
}

rebuild_normal() {
    build normal "" "" || { echo "make sanitize: the normal build failed"; exit 1; }
}
trap rebuild_normal EXIT
trap 'exit 1' INT TERM

rm -rf "$OUT" && mkdir -p "$OUT/reports"
# (found before the sanitized build: importing gtarantool loads its extensions,
# which then need the sanitizer runtime preloaded)
REAL=$("$PY" -c "from gtarantool.testing.server import find_binary; print(find_binary())") || exit 1
# asan-stack=0: greenlet copies C stacks with memcpy, which ASan's stack
# redzones report as stack-buffer-underflow; heap checks stay on.
build sanitize-build "-fsanitize=address,undefined -fno-sanitize-recover=undefined \
-fno-omit-frame-pointer -O1 -g -UNDEBUG --param=asan-stack=0" "-fsanitize=address,undefined" \
    || exit 1
nm -D gtarantool/_speedups.*.so | grep -q __asan_init || { echo "not a sanitized build"; exit 1; }

# The server must not run with the sanitizer runtime preloaded: a wrapper drops it.
cat >"$OUT/tarantool" <<EOF
#!/bin/sh
unset LD_PRELOAD
exec "$REAL" "\$@"
EOF
chmod +x "$OUT/tarantool"

REPORTS=$(pwd)/$OUT/reports
status=0
(
    export TARANTOOL="$(pwd)/$OUT/tarantool"
    # libstdc++ too: greenlet's C++ exceptions break an ASan runtime loaded after it
    export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
    export PYTHONMALLOC=malloc
    export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$REPORTS/asan"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$REPORTS/ubsan"
    # (the sanitizers slow the C paths several-fold: the wall-clock bounds of
    # the tests marked timing get five times their slack, tests/timing.py)
    export GTARANTOOL_TIMING_SLACK="${GTARANTOOL_TIMING_SLACK:-5}"
    "$PY" -m pytest -q --reader c tests/test_speedups.py tests/test_encoder.py \
        tests/test_protocol.py tests/test_transport.py tests/test_pipeline.py \
        tests/test_connection.py tests/test_golden.py &&
    "$PY" -m pytest -q tests/test_pool.py -k "not python and (every_form or mode_says or read_retry)" &&
    "$PY" -m tests.fuzz --seconds "$FUZZ_SECONDS" --seed "$FUZZ_SEED"
) || status=1
if ls "$REPORTS"/* >/dev/null 2>&1; then
    echo "make sanitize: sanitizer reports:"
    cat "$REPORTS"/*
    status=1
fi
[ $status = 0 ] && echo "make sanitize: no sanitizer report, every test and fuzz case passed"
exit $status
