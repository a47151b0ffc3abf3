#!/usr/bin/env bash
# Installs what a fresh machine lacks for building and testing Quiver: the wasm32-wasip1
# Rust target (guests are built for it). Safe to run again.
set -euo pipefail
if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "setup: adding the wasm32-wasip1 Rust target" >&2
  rustup target add wasm32-wasip1
fi
