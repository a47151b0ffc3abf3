#!/usr/bin/env bash
# Instructions per chat-loop send, the host's and the baseline's, counted by Valgrind's
# callgrind: a figure this shared machine's noise does not change (two runs of one binary
# agree to about 1%). Each side runs twice, with 2 and with 8 rounds; the difference,
# divided by the sends in between, leaves out start-up, compiling and warm-up.
#
#   scripts/bench-instructions.sh            # builds the chat_loop bench, then counts
#   KEEP=dir scripts/bench-instructions.sh   # also keeps the callgrind profiles in dir
#
# Needs `valgrind` (`apt-get install valgrind`). The bench's task pool is shrunk to 4 slots
# (QUIVER_BENCH_TASK_SLOTS): Valgrind cannot reserve the default pool's address space.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || {
    echo "bench-instructions: valgrind not found; install it with: apt-get install valgrind" >&2
    exit 1
}
echo "bench-instructions: building the chat_loop bench" >&2
bench=$(cargo bench -p quiver-tests --no-run --bench chat_loop --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*chat_loop[^"]*\)".*/\1/p' | tail -1)
[ -x "$bench" ] || { echo "bench-instructions: no chat_loop executable was built" >&2; exit 1; }
out=${KEEP:-$(mktemp -d)}
mkdir -p "$out"
sends=20
count() { # side rounds -> instructions
    echo "bench-instructions: $1, $2 rounds" >&2
    (cd tests && QUIVER_BENCH_TASK_SLOTS=4 QUIVER_BENCH_PROFILE=$1 QUIVER_BENCH_ROUNDS=$2 \
        QUIVER_BENCH_SENDS=$sends valgrind --tool=callgrind --smc-check=all-non-file \
        --callgrind-out-file="$out/callgrind.$1.$2.%p" "$bench" --bench 2>"$out/valgrind.$1.$2.log" >/dev/null) || {
        echo "bench-instructions: the $1 run failed; see $out/valgrind.$1.$2.log" >&2
        exit 1
    }
    # The bench's own process: a child forked to start a server reports its count too.
    local log="$out/valgrind.$1.$2.log" pid
    pid=$(sed -n 's/^==\([0-9]*\)== Command: .*/\1/p' "$log" | head -1)
    sed -n "s/^==$pid== Collected : \([0-9]*\).*/\1/p" "$log"
}
per_send() { # side -> instructions per send
    local few many
    few=$(count "$1" 2)
    many=$(count "$1" 8)
    echo $(((many - few) / (6 * sends)))
}
host=$(per_send host)
baseline=$(per_send baseline)
echo "instructions per send: host $host, baseline $baseline, host extra $((host - baseline))"
[ -n "${KEEP:-}" ] || rm -rf "$out"
