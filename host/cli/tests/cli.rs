//! The `quiver` binary's own checks: commands parse, and errors name the file and the fix.
//! (Scenario tests that run guests through the CLI live in the `tests` crate, which finds
//! this package's binary next to its own.)

use std::process::Command;

fn quiver(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(args)
        .env_remove("QUIVER_REGISTRY")
        .output()
        .expect("run the quiver binary")
}

#[test]
fn help_lists_every_command() {
    let out = quiver(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for command in ["run", "mcp", "registry"] {
        assert!(text.contains(command), "{text}");
    }
}

#[test]
fn a_missing_module_is_an_error_naming_it() {
    let out = quiver(&["run", "/nonexistent/guest.wasm"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("/nonexistent/guest.wasm"), "{text}");
}

#[test]
fn an_unknown_registry_directory_is_an_error_naming_it() {
    let out = quiver(&["registry", "validate", "/nonexistent/registry"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("/nonexistent/registry"), "{text}");
}
