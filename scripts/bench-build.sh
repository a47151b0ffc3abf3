#!/usr/bin/env bash
# Build and test times of two revisions, measured in one run on this machine, so that
# BENCHMARKS.md can give their ratio (absolute times on a shared machine drift too much).
#
#   scripts/bench-build.sh BASE [NEW]      # NEW defaults to HEAD
#
# For each revision, in a fresh clone with an empty target directory, it times:
#   lib     cargo build -p quiver --lib (the library alone, as an embedder builds it); then
#           the target directory is emptied again
#   cold    cargo build --tests (the workspace's default members, as `cargo test` builds)
#   test    cargo test --no-fail-fast (everything already built, so this is the run
#           itself); a failing test is reported and the time marked `!`, not fatal
#   incr    touch one file of the chat loop, then cargo build --tests again
# Each is given as wall seconds and CPU seconds (user + system of all processes), since
# other work on a shared machine stretches wall time far more than CPU time.
# Revisions alternate (BASE, NEW, BASE, NEW) so slow drift hits both alike.
# STEPS picks the steps (default "lib cold test incr"); ROUNDS the rounds (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(git rev-parse "${1:?usage: scripts/bench-build.sh BASE [NEW]}")
new=$(git rev-parse "${2:-HEAD}")
rounds=${ROUNDS:-2}
steps=" ${STEPS:-lib cold test incr} "
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
scripts/setup.sh >/dev/null

# "WALL/CPU" seconds of one command; its output goes to a log shown only if it fails.
# With TOLERATE=1 a failing command (a test flaky on a loaded machine) is timed all the
# same, marked `!` and its last lines shown, instead of ending the run.
seconds() {
  local log timing mark=""
  log=$(mktemp)
  timing=$(mktemp)
  if ! { TIMEFORMAT='%0R/%0U/%0S'; time "$@" >"$log" 2>&1; } 2>"$timing"; then
    echo "failed in $PWD: $*" >&2
    grep -E "^test .* FAILED|^    [a-z_:]+$" "$log" | tail -10 >&2 || tail -20 "$log" >&2
    [ "${TOLERATE:-0}" = 1 ] || exit 1
    mark="!"
  fi
  rm -f "$log"
  IFS=/ read -r wall user sys <"$timing"
  rm -f "$timing"
  echo "${wall}/$((user + sys))${mark}"
}

# The chat loop's file moved with the restructuring; touch whichever exists.
touch_chat_loop() {
  for f in host/runtime/src/chat/run.rs host/src/chat/run.rs; do
    [ -f "$f" ] && { touch "$f"; return; }
  done
}

measure() {
  local rev=$1 dir="$work/$1"
  rm -rf "$dir"
  git clone --quiet --no-checkout "$PWD" "$dir"
  git -C "$dir" checkout --quiet "$rev"
  ln -s "$PWD/fixtures/npm/node_modules" "$dir/fixtures/npm/node_modules"
  (
    cd "$dir"
    local lib=- cold=- test=- incr=-
    if [[ $steps == *" lib "* ]]; then
      lib=$(seconds cargo build -p quiver --lib)
      cargo clean >/dev/null 2>&1
    fi
    [[ $steps == *" cold "* ]] && cold=$(seconds cargo build --tests)
    [[ $steps == *" test "* ]] && test=$(TOLERATE=1 seconds cargo test --no-fail-fast)
    if [[ $steps == *" incr "* ]]; then
      touch_chat_loop
      incr=$(seconds cargo build --tests)
    fi
    echo "${rev:0:10} (wall/cpu s) lib=${lib} cold=${cold} test=${test} incr=${incr}"
  )
  rm -rf "$dir"
}

for _ in $(seq "$rounds"); do
  measure "$base"
  measure "$new"
done
