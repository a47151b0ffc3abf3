//! Answerers (like guest tools) are registered by their index in the module's function table, which the
//! host can only reach if the module exports it; Rust binaries do not by default.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo::rustc-link-arg-bins=--export-table");
    }
}
