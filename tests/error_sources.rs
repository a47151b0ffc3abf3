//! Public errors keep their typed cause: `Error::source()` walks from what the host says
//! to what failed underneath (an I/O error, wasmtime's, serde's, the sandbox's), so an
//! embedder can match on the cause instead of parsing text.

use std::error::Error;

use quiver::registry::{DirStore, DocFormat, DocKind, RegistryDirError, RegistryStore, StoreError};
use quiver::{Host, HostConfig, HostError, ModuleError, SandboxSetupError, TaskError, TaskSpec};

fn host() -> Host {
    Host::builder()
        .without_disk_cache()
        .build()
        .expect("a host with no registry")
}

#[test]
fn a_module_that_cannot_be_read_or_compiled_keeps_the_cause() {
    let host = host();
    let missing = host
        .load_module_file("/nonexistent/guest.wasm")
        .err()
        .expect("no such file");
    let HostError::Module { source, path } = &missing else {
        panic!("{missing:?}")
    };
    assert_eq!(path, "/nonexistent/guest.wasm");
    let ModuleError::Read(io) = source else {
        panic!("{source:?}")
    };
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    assert!(missing.source().is_some_and(|s| s.is::<ModuleError>()));

    let junk = host
        .load_module("junk.wasm", b"\0asm\x01\0\0\0\xff")
        .err()
        .expect("not a module");
    assert!(
        matches!(
            &junk,
            HostError::Module {
                source: ModuleError::Compile(_),
                ..
            }
        ),
        "{junk:?}"
    );
    let cause = junk.source().and_then(Error::source);
    assert!(cause.is_some(), "wasmtime's error under the module error");
}

#[test]
fn task_json_errors_keep_serdes_error_and_the_check_that_refused() {
    let error = TaskSpec::from_json(r#"{"task_id": 5}"#).expect_err("a number");
    let TaskError::Parse { field, source, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(field.as_deref(), Some("task_id"));
    assert!(source.is_data(), "{source}");
    assert!(error.to_string().contains("field `task_id`"), "{error}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("task.json");
    std::fs::write(&file, r#"{"task_id": "t", "limits": {"deadline_ms": 0}}"#).unwrap();
    let error = TaskSpec::from_file(&file).expect_err("a zero deadline");
    let TaskError::InFile { path, source } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(path, &file);
    assert!(
        matches!(
            source.downcast_ref::<TaskError>(),
            Some(TaskError::Field { .. } | TaskError::Config { .. })
        ),
        "the check's own error: {source:?}"
    );
    assert!(error.source().is_some_and(|s| s.is::<TaskError>()));
}

#[test]
fn an_audit_log_that_cannot_open_keeps_the_io_error() {
    let error = Host::builder()
        .without_disk_cache()
        .with_audit_log("/nonexistent/dir/audit.jsonl")
        .build()
        .err()
        .expect("no such directory");
    let HostError::AuditLog { source, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
    assert!(error.source().is_some_and(|s| s.is::<std::io::Error>()));
}

#[tokio::test]
async fn a_task_whose_module_has_no_entry_keeps_the_sandbox_error() {
    let host = host();
    let module = host
        .load_module("no-start.wat", b"(module (memory (export \"memory\") 1))")
        .expect("a valid module");
    let error = host
        .run_task(&module, &TaskSpec::new("no-entry"))
        .await
        .expect_err("no _start");
    let HostError::TaskSetup {
        source, task_id, ..
    } = &error
    else {
        panic!("{error:?}")
    };
    assert_eq!(task_id, "no-entry");
    assert!(
        matches!(source, SandboxSetupError::NoEntry { .. }),
        "{source:?}"
    );
    assert!(error.source().is_some_and(|s| s.is::<SandboxSetupError>()));
    host.shutdown().await;
}

#[test]
fn a_task_config_value_that_is_not_json_keeps_serdes_error() {
    let task = TaskSpec::new("t").with_config("mcp.allowed_server_ids", serde_json::json!("[fs"));
    let error = task.validate().expect_err("not a JSON array");
    assert!(matches!(error, TaskError::Config { .. }), "{error:?}");
    assert!(error.source().is_some_and(|s| s.is::<serde_json::Error>()));
}

#[test]
fn a_config_file_that_is_not_toml_keeps_the_toml_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("quiver.toml");
    std::fs::write(&file, "[tasks\n").unwrap();
    let error = HostConfig::load(&file).expect_err("not TOML");
    assert!(error.to_string().contains("invalid TOML"), "{error}");
    assert!(error.source().is_some_and(|s| s.is::<toml::de::Error>()));

    std::fs::write(&file, "[tasks]\nmax_concurrent = \"two\"\n").unwrap();
    let error = HostConfig::load(&file).expect_err("not a number");
    assert!(
        error.to_string().contains("tasks.max_concurrent"),
        "{error}"
    );
    assert!(error.source().is_some_and(|s| s.is::<toml::de::Error>()));
}

#[test]
fn a_registry_that_cannot_be_read_again_keeps_the_registry_error() {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::builder()
        .without_disk_cache()
        .with_registry_dir(dir.path())
        .build()
        .expect("an empty registry");
    drop(dir);
    let error = host.reload_registry().expect_err("the directory is gone");
    assert!(
        matches!(error, HostError::RegistryRejected { .. }),
        "{error:?}"
    );
    assert!(error.source().is_some_and(|s| s.is::<RegistryDirError>()));
}

/// A store error stays `Clone` and `Eq` and still hands back the I/O error itself.
#[tokio::test]
async fn a_store_write_that_fails_keeps_the_io_error() {
    let dir = tempfile::tempdir().unwrap();
    // `profiles` is a file, so no profile can be written under it.
    std::fs::write(dir.path().join("profiles"), "not a directory").unwrap();
    let store = DirStore::new(dir.path());
    let profile = b"name = \"p\"\nserver_ids = []\n".to_vec();
    let error = store
        .upsert(DocKind::Profile, "p", DocFormat::Toml, profile)
        .await
        .expect_err("profiles is not a directory");
    assert!(matches!(error, StoreError::Unreachable { .. }), "{error:?}");
    assert_eq!(error.clone(), error);
    assert!(error.source().is_some_and(|s| s.is::<std::io::Error>()));
}
