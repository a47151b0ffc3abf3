#!/usr/bin/env bash
# The main demo: builds the host, the fixture MCP server and two guests, then
#  1. shows the fixture server's tools (`quiver mcp tools`);
#  2. runs mcp-explorer, a guest that lists and calls them from inside WebAssembly;
#  3. runs chat-tools, a guest whose chat calls one of its own Rust functions and an MCP
#     tool, with the host running the tool-call loop. Offline, the model is a scripted
#     transcript (fixtures/transcripts/chat-demo.json); with OPENAI_BASE_URL and
#     OPENAI_API_KEY set, the same guest talks to that endpoint.
#
#   scripts/demo.sh                      # explorer calls echo
#   scripts/demo.sh fixture add '{"a":2,"b":3}'
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "==> building the host, the fixture server and the guest (first build takes a few minutes)" >&2
cargo build --quiet -p quiver --bin quiver -p quiver-tests --bin fixture-mcp-server
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
