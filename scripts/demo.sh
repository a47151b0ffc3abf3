#!/usr/bin/env bash
# The main demo: builds the host, the fixture MCP server and the mcp-explorer guest, shows
# the fixture server's tools, then runs the guest, which lists and calls them from inside
# WebAssembly through the `spear` ABI.
#
#   scripts/demo.sh                      # calls echo
#   scripts/demo.sh fixture add '{"a":2,"b":3}'
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "==> building the host, the fixture server and the guest (first build takes a few minutes)" >&2
cargo build --quiet -p quiver --bin quiver -p quiver-tests --bin fixture-mcp-server
cargo build --quiet -p mcp-explorer --target wasm32-wasip1 --release --target-dir target/guests
export QUIVER_FIXTURE_SERVER="$PWD/target/debug/fixture-mcp-server"
echo "==> quiver mcp tools fixture   (the registry's view of the server)" >&2
target/debug/quiver mcp tools fixture --registry fixtures/registry
echo "==> quiver run mcp-explorer.wasm   (a wasm guest listing and calling the tools)" >&2
target/debug/quiver run target/guests/wasm32-wasip1/release/mcp-explorer.wasm \
  --task fixtures/tasks/explorer.json --registry fixtures/registry -- "$@"
