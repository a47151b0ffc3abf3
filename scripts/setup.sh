#!/usr/bin/env bash
# Installs what a fresh machine lacks for building, testing and benchmarking Quiver:
# - the wasm32-wasip1 Rust target (guests are built for it);
# - the public reference MCP servers of fixtures/npm (Node.js), pinned by its lock file.
# Safe to run again; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "setup: adding the wasm32-wasip1 Rust target" >&2
  rustup target add wasm32-wasip1
fi
if command -v npm >/dev/null 2>&1; then
  if [ ! -x fixtures/npm/node_modules/.bin/mcp-server-filesystem ] \
     || [ fixtures/npm/package-lock.json -nt fixtures/npm/node_modules/.package-lock.json ]; then
    echo "setup: installing the reference MCP servers (fixtures/npm)" >&2
    (cd fixtures/npm && npm ci --no-audit --no-fund --loglevel=error)
  fi
else
  echo "setup: npm not found; tests that use the Node.js reference MCP servers will fail" >&2
fi
