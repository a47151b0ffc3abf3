//! `quiver registry pin SERVER [TOOL...]`: pins the definitions a server lists now into its
//! record file (a registry directory), keeping the rest of the file as written, and
//! reports the old and new digests to the audit log (`--audit-log`).
//!
//! The listing goes through the host's pool like `quiver mcp tools`: the record's launch
//! and egress rules, its credential (and the principal's grant) apply.

use std::path::{Path, PathBuf};

use quiver::registry::{DocFormat, Registry, with_pins};

use super::{Identity, ServerSource, fail, server_host_with};

#[derive(clap::Args)]
pub(crate) struct PinArgs {
    /// The server whose tools to pin.
    server_id: String,
    /// The tools to pin (default: every tool the server lists that allowed_tools lets
    /// through). Pins of other tools are kept.
    tools: Vec<String>,
    /// Append the change (each tool's old and new digest) to this audit log.
    #[arg(long, value_name = "PATH")]
    audit_log: Option<PathBuf>,
    #[command(flatten)]
    identity: Identity,
    #[command(flatten)]
    source: ServerSource,
}

pub(crate) async fn run(args: PinArgs) -> i32 {
    let PinArgs {
        server_id,
        tools,
        audit_log,
        identity,
        source,
    } = args;
    let ask = identity.open_with.clone().map(Some);
    let (host, entry) = match server_host_with(
        &server_id,
        &source,
        Default::default(),
        ask,
        audit_log.as_deref(),
    )
    .await
    {
        Ok(found) => found,
        Err(status) => return status,
    };
    let principal = identity.principal();
    let pinned = host
        .pins_from_server(&server_id, &tools, Some(principal.as_str()))
        .await;
    let new = match pinned {
        Ok(pins) => pins,
        Err(e) => {
            host.shutdown().await;
            eprintln!("quiver: {e}");
            return 1;
        }
    };
    let old = &entry.record.pins;
    if let Err(e) = write_pins(&entry.source, &source.registry, &server_id, &new) {
        host.shutdown().await;
        return fail(e);
    }
    let changes = host.report_pins_changed(&server_id, &format!("cli:{principal}"), old, &new);
    host.shutdown().await;
    for change in &changes {
        match &change.old {
            Some(old) => println!("re-pinned {}: {old} -> {}", change.tool, change.new),
            None => println!("pinned {}: {}", change.tool, change.new),
        }
    }
    println!(
        "{server_id}: {} pins in {} ({} changed)",
        new.len(),
        entry.source.display(),
        changes.len()
    );
    0
}

/// Replaces the `pins` table of the record at `path` and writes it back atomically, then
/// loads the registry `dir` again: a record that no longer loads is put back as it was.
fn write_pins(
    path: &Path,
    dir: &Path,
    server_id: &str,
    pins: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => DocFormat::Toml,
        Some("json") => DocFormat::Json,
        _ => return Err(format!("{shown}: not a .toml or .json record")),
    };
    let updated = with_pins(format, &text, pins).map_err(|e| format!("{shown}: {e}"))?;
    replace(path, &updated)?;
    let loaded = Registry::load_dir(dir).map_err(|e| e.to_string());
    let ok = loaded.as_ref().is_ok_and(|registry| {
        registry
            .get(server_id)
            .is_some_and(|entry| entry.record.pins == *pins)
    });
    if !ok {
        replace(path, &text)?;
        let why = match loaded {
            Ok(registry) => registry
                .problems()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            Err(e) => e,
        };
        return Err(format!(
            "{shown}: the record with its new pins does not load ({why}); it was left as it was"
        ));
    }
    Ok(())
}

/// Writes `text` to a hidden file beside `path` (the loader skips it), with `path`'s
/// permissions, and renames it over `path`, so a reader never sees half a record.
fn replace(path: &Path, text: &str) -> Result<(), String> {
    let shown = path.display();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.pin-tmp"));
    let written = std::fs::write(&temp, text).and_then(|()| {
        let permissions = std::fs::metadata(path)?.permissions();
        std::fs::set_permissions(&temp, permissions)?;
        std::fs::rename(&temp, path)
    });
    written.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        format!("{shown}: cannot write: {e}")
    })
}
