#!/usr/bin/env bash
# Installs what a fresh machine lacks for building, testing and benchmarking Quiver:
# - the wasm32-wasip1 Rust target (guests are built for it);
# - the npm packages of fixtures/npm (Node.js), pinned by its lock file: the public
#   reference MCP servers and the official MCP conformance suite
#   (@modelcontextprotocol/conformance 0.2.0-alpha.12, with glob: on Node 20 the suite
#   runs with fixtures/npm/node20/register.mjs preloaded, see docs/conformance.md);
# - clang, wasm-ld, wasi-libc and the wasm32 compiler-rt builtins, from the system's
#   package manager (Debian/Ubuntu apt), for building C guests against guest-sdk/c/spear.h;
# - protoc (the etcd-client crate compiles etcd's protos at build time) and the etcd server
#   (tests/etcd_store.rs starts a real one), from the system's package manager;
# - Chromium, which tests/admin_web.rs drives headless (through fixtures/npm's
#   puppeteer-core, which downloads no browser of its own), from the system's packages;
# - Arize Phoenix 20.26.1 from PyPI in a venv under fixtures/phoenix, the OTLP trace
#   backend tests/telemetry.rs exports to and reads spans back from.
# Safe to run again; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  echo "setup: adding the wasm32-wasip1 Rust target" >&2
  rustup target add wasm32-wasip1
fi
# True when clang can compile and link a WASI command that uses libc (Debian's wasi-libc
# puts its headers and libraries in /usr/include/wasm32-wasi and /usr/lib/wasm32-wasi).
c_guest_toolchain_present() {
  command -v clang >/dev/null 2>&1 && command -v wasm-ld >/dev/null 2>&1 || return 1
  local out
  out="$(mktemp)"
  if printf '#include <stdio.h>\nint main(void) { puts("ok"); return 0; }\n' \
      | clang --target=wasm32-wasi -x c - -o "$out" >/dev/null 2>&1; then
    rm -f "$out"
  else
    rm -f "$out"
    return 1
  fi
}
if ! c_guest_toolchain_present; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing clang, lld, wasi-libc and compiler-rt for wasm32 (C guests)" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update
    $sudo env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32
  else
    echo "setup: apt-get not found; install clang, wasm-ld, wasi-libc and compiler-rt" \
      "for wasm32 (or wasi-sdk, with WASI_SYSROOT set) to build C guests" >&2
  fi
fi
# protoc builds etcd-client's protos; `etcd` (Debian's etcd-server, v3.4) runs in tests.
missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]} (etcd registry store, admin page tests)" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: apt-get not found; install protoc and the etcd server (v3.4+)" \
      "for the etcd registry store, and chromium for the admin page test" >&2
  fi
fi
if command -v npm >/dev/null 2>&1; then
  if [ ! -x fixtures/npm/node_modules/.bin/mcp-server-filesystem ] \
     || [ ! -f fixtures/npm/node_modules/puppeteer-core/package.json ] \
     || [ ! -x fixtures/npm/node_modules/.bin/conformance ] \
     || [ ! -f fixtures/npm/node_modules/glob/package.json ] \
     || [ fixtures/npm/package-lock.json -nt fixtures/npm/node_modules/.package-lock.json ]; then
    echo "setup: installing the reference MCP servers, the conformance suite and puppeteer-core (fixtures/npm)" >&2
    (cd fixtures/npm && npm ci --no-audit --no-fund --loglevel=error)
  fi
else
  echo "setup: npm not found; tests that use the Node.js reference MCP servers or the" \
    "conformance suite will fail" >&2
fi
# Arize Phoenix (PyPI), the real trace backend tests/telemetry.rs exports to, in a venv of
# the project's own (fixtures/phoenix/venv) so the system's Python stays untouched.
if [ ! -x fixtures/phoenix/venv/bin/phoenix ]; then
  if command -v python3 >/dev/null 2>&1; then
    echo "setup: installing arize-phoenix into fixtures/phoenix/venv (trace export tests)" >&2
    python3 -m venv fixtures/phoenix/venv
    fixtures/phoenix/venv/bin/pip install --quiet arize-phoenix==20.26.1
  else
    echo "setup: python3 not found; tests/telemetry.rs needs Arize Phoenix" \
      "(python3 -m venv fixtures/phoenix/venv && fixtures/phoenix/venv/bin/pip install arize-phoenix)" >&2
  fi
fi
