//! The embedder's own command line. Beyond checking its errors, this test makes `cargo test`
//! at the workspace root build the `quiver-embedder` binary that `tests/embedder.rs` runs
//! against a real guest and server.

use std::process::Command;

fn embedder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_quiver-embedder"))
}

#[test]
fn without_a_guest_it_prints_its_usage_and_exits_2() {
    let out = embedder().output().expect("run quiver-embedder");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("usage: quiver-embedder <guest.wasm>"),
        "{stderr}"
    );
}

#[test]
fn a_missing_guest_file_is_named_in_the_error() {
    let missing = std::env::temp_dir().join("quiver-embedder-no-such-guest.wasm");
    let out = embedder()
        .arg(&missing)
        .env("QUIVER_FIXTURE_SERVER", "/nonexistent/fixture-mcp-server")
        .output()
        .expect("run quiver-embedder");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("quiver-embedder: "), "{stderr}");
    assert!(
        stderr.contains("quiver-embedder-no-such-guest.wasm"),
        "the error should name the file: {stderr}"
    );
}
