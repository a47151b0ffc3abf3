#!/usr/bin/env bash
# The main demo: builds the host, the fixture MCP server and two guests, then
#  1. shows the fixture server's tools (`quiver mcp tools`);
#  2. runs mcp-explorer, a guest that lists and calls them from inside WebAssembly;
#  3. runs chat-tools, a guest whose chat calls one of its own Rust functions and an MCP
#     tool, with the host running the tool-call loop. Offline, the model is a scripted
#     transcript (fixtures/transcripts/chat-demo.json); with OPENAI_BASE_URL and
#     OPENAI_API_KEY set, the same guest talks to that endpoint;
#  4. starts a node (`quiver serve`) on a free loopback port with a token and an audit
#     log, uploads mcp-explorer, runs it as a task over HTTP, shows the task, the
#     quiver_mcp_tool_calls_total metrics and the audit lines, and stops the node with
#     SIGTERM. Its processes and files are cleaned up even when a step fails.
#
#   scripts/demo.sh                      # explorer calls echo
#   scripts/demo.sh fixture add '{"a":2,"b":3}'
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "==> building the host, the fixture server and the guest (first build takes a few minutes)" >&2
cargo build --quiet -p quiver-cli -p quiver-tests --bin fixture-mcp-server
cargo build --quiet -p mcp-explorer -p chat-tools --target wasm32-wasip1 --release --target-dir target/guests
export QUIVER_FIXTURE_SERVER="$PWD/target/debug/fixture-mcp-server"
guests=target/guests/wasm32-wasip1/release
echo "==> quiver mcp tools fixture   (the registry's view of the server)" >&2
target/debug/quiver mcp tools fixture --registry fixtures/registry
echo "==> quiver run mcp-explorer.wasm   (a wasm guest listing and calling the tools)" >&2
target/debug/quiver run "$guests/mcp-explorer.wasm" \
  --task fixtures/tasks/explorer.json --registry fixtures/registry -- "$@"
if [ -n "${OPENAI_BASE_URL:-}" ] && [ -n "${OPENAI_API_KEY:-}" ]; then
  echo "==> quiver run chat-tools.wasm   (live model at $OPENAI_BASE_URL)" >&2
  config=()
else
  echo "==> quiver run chat-tools.wasm   (offline: the model's side is a scripted transcript)" >&2
  config=(--config fixtures/quiver.toml)
fi
target/debug/quiver run "$guests/chat-tools.wasm" "${config[@]}" \
  --task fixtures/tasks/chat.json --registry fixtures/registry

echo "==> quiver serve   (a node: upload, submit over HTTP, metrics, audit log, SIGTERM)" >&2
node_dir=$(mktemp -d)
node_pid=
stop_node() {
  if [ -n "$node_pid" ] && kill -0 "$node_pid" 2>/dev/null; then
    kill -TERM "$node_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$node_pid" 2>/dev/null || true
  fi
  rm -rf "$node_dir"
}
trap stop_node EXIT
QUIVER_DEMO_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export QUIVER_DEMO_TOKEN
# A node runs no record's command and reads no variable for it unless [mcp.launch] says so.
printf '[serve]\ntoken_env = "QUIVER_DEMO_TOKEN"\n\n[mcp.launch]\ncommands = ["%s"]\nenv = ["QUIVER_FIXTURE_SERVER"]\n' \
  "$QUIVER_FIXTURE_SERVER" >"$node_dir/quiver.toml"
target/debug/quiver serve --listen 127.0.0.1:0 --registry fixtures/registry \
  --config "$node_dir/quiver.toml" --audit-log "$node_dir/audit.jsonl" \
  >"$node_dir/stdout" 2>"$node_dir/stderr" &
node_pid=$!
base=
for _ in $(seq 300); do
  base=$(sed -n 's/^listening on //p' "$node_dir/stdout")
  [ -n "$base" ] && break
  kill -0 "$node_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$base" ]; then
  echo "the node did not start:" >&2
  cat "$node_dir/stderr" >&2
  exit 1
fi
echo "node at $base" >&2
auth="Authorization: Bearer $QUIVER_DEMO_TOKEN"
module="$guests/mcp-explorer.wasm"
sha=$(sha256sum "$module" | cut -d' ' -f1)
curl -sSf -H "$auth" -H 'Content-Type: application/wasm' -X PUT --data-binary "@$module" "$base/v1/modules/$sha" >/dev/null
submitted=$(curl -sSf -H "$auth" -H 'Content-Type: application/json' \
  --data-binary "{\"module\":\"$sha\",\"task\":$(cat fixtures/tasks/explorer.json)}" \
  "$base/v1/tasks")
id=$(printf '%s' "$submitted" | sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p')
echo "--- GET /v1/tasks/$id?wait=30" >&2
curl -sSf -H "$auth" "$base/v1/tasks/$id?wait=30"
echo
echo "--- GET /metrics | grep quiver_mcp_tool_calls_total" >&2
curl -sSf -H "$auth" "$base/metrics" | grep '^quiver_mcp_tool_calls_total'
echo "--- the audit log" >&2
for _ in $(seq 50); do [ -s "$node_dir/audit.jsonl" ] && break; sleep 0.1; done
cat "$node_dir/audit.jsonl"
kill -TERM "$node_pid"
wait "$node_pid"
echo "node stopped" >&2
