//! C guests: compiled with clang for wasm32-wasi against `guest-sdk/c/spear.h`.
//!
//! The toolchain (clang, wasm-ld, wasi-libc, compiler-rt for wasm32) comes from
//! `scripts/setup.sh`. A missing toolchain fails the test with that advice; it is never a
//! silent skip.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace;

/// The flags every C guest is built with: warnings are errors, and the funcref table is
/// exported so the host can call guest tools. `WASI_SYSROOT`, when set, is passed as
/// `--sysroot` (wasi-sdk); Debian's wasi-libc needs none.
pub fn clang_args() -> Vec<String> {
    let mut args: Vec<String> = [
        "--target=wasm32-wasi",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wl,--export-table",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(format!(
        "-I{}",
        workspace().join("guest-sdk").join("c").display()
    ));
    if let Some(sysroot) = std::env::var_os("WASI_SYSROOT") {
        args.push(format!("--sysroot={}", Path::new(&sysroot).display()));
    }
    args
}

/// Compiles `source` (relative to the workspace) with [`clang_args`] plus `extra` into
/// `target/c-guests/<name>.wasm` and returns that path.
pub fn c_guest(source: &str, name: &str, extra: &[&str]) -> PathBuf {
    let out_dir = workspace().join("target").join("c-guests");
    std::fs::create_dir_all(&out_dir).expect("create target/c-guests");
    let out = out_dir.join(format!("{name}.wasm"));
    let output = match Command::new("clang")
        .args(clang_args())
        .args(extra)
        .arg(workspace().join(source))
        .arg("-o")
        .arg(&out)
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!(
            "cannot run clang ({e}): C guests need clang, wasm-ld and wasi-libc; run scripts/setup.sh"
        ),
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let toolchain = [
            "file not found",
            "unable to find library",
            "cannot open",
            "wasm-ld",
            "unknown target",
        ]
        .iter()
        .any(|s| stderr.contains(s));
        if toolchain {
            panic!(
                "clang could not build {source} for wasm32-wasi: the wasi-libc sysroot or wasm-ld is missing; run scripts/setup.sh (or set WASI_SYSROOT)\n{stderr}"
            );
        }
        panic!("clang failed on {source}:\n{stderr}");
    }
    assert!(
        stderr.trim().is_empty(),
        "clang warned on {source}:\n{stderr}"
    );
    out
}
