//! `quiver registry`: check a registry directory (`validate`), and list, read, write,
//! delete and compare the records of a registry from scripts.
//!
//! Every command but `validate` works on a target: a running node through its admin API
//! (`--node URL --token-env VAR`), or a store used directly (`--registry DIR` or
//! `etcd://HOST:PORT/PREFIX`) with the checks a node makes before it writes. [`Target`] is
//! the one seam between the two, so each command is written once. The whole command,
//! node or store, is bounded by `--timeout`; what a node answers is bounded in size too
//! and printed with control characters removed.
//!
//! Exit statuses: 0 done; 1 the target refused (an invalid record, no such name); 2 the
//! command could not run (flags, the file, the target unreachable, a timeout). `diff`:
//! 0 equal, 1 different, 2 any error.

mod node;
mod store;

use std::io::{IsTerminal, Read, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use serde::Serialize;

use quiver::registry::{
    Change, DirStore, DocChange, DocFormat, DocKind, Registry, RegistryStore, Severity, StoreError,
    StoredDoc, diff_docs, is_valid_server_id, parse_bundle,
};
use quiver::text::{printable, printable_lines};
use quiver_node::{EtcdAccess, NodeFileConfig, RegistrySource};

use crate::defaults;
use node::{NodeClient, NodeError};

#[derive(Subcommand)]
pub(super) enum RegistryCommand {
    /// Check every file of a registry directory; exits 1 if any file has an error.
    Validate { dir: PathBuf },
    /// List the servers and profiles of a node or store.
    List {
        /// Print JSON (`{"revision", "records": [...]}`) instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Print a server record (a profile with --profile) exactly as stored: `${ENV:..}`
    /// references as written, never their values.
    Get {
        name: String,
        /// NAME is a profile.
        #[arg(long)]
        profile: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Write the records of FILE (`.toml` or `.json`): one server record, or a bundle of
    /// `servers` and `profiles`. The set is validated as a whole first; servers are
    /// written before profiles; nothing is removed.
    Put {
        file: PathBuf,
        /// Print what would change and write nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Delete a server record (a profile with --profile).
    Delete {
        name: String,
        /// NAME is a profile.
        #[arg(long)]
        profile: bool,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Compare a registry directory with the target: `+` only in DIR, `~` different, `-`
    /// only in the target. Exits 0 when they are equal, 1 when not, 2 on an error.
    Diff {
        dir: PathBuf,
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Pin the definitions of a server's tools as it lists them now (a digest of each
    /// tool's name, description, schemas and annotations) into its record file in a
    /// registry directory; a tool whose definition later changes is refused until it is
    /// pinned again. Prints each tool's old and new digest.
    Pin(crate::pin::PinArgs),
}

/// Where a command reads and writes: a node or a store.
#[derive(clap::Args)]
pub(super) struct TargetArgs {
    /// Base URL of a running `quiver serve`; the command goes through its admin API.
    #[arg(
        long,
        conflicts_with = "registry",
        required_unless_present = "registry"
    )]
    node: Option<String>,
    /// Environment variable holding the node's admin token (its `[admin] token_env`).
    #[arg(long, requires = "node")]
    token_env: Option<String>,
    /// A registry directory or `etcd://HOST:PORT/PREFIX`, used directly.
    #[arg(long, value_parser = RegistrySource::parse)]
    registry: Option<RegistrySource>,
    /// quiver.toml whose `[etcd]` says how to reach an `etcd://` registry (TLS, user);
    /// without it only a loopback etcd is reached.
    #[arg(long, requires = "registry")]
    config: Option<PathBuf>,
    /// Seconds the whole command may take (reaching the node or store included).
    #[arg(long, default_value_t = defaults::CLI_NODE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("--node URL or --registry DIR|etcd://HOST:PORT/PREFIX is required")]
    NoTarget,
    #[error(
        "--node needs --token-env VAR, the name of the variable holding the node's admin token"
    )]
    NoTokenEnv,
    #[error("--token-env {0}: the environment variable {0} is not set or blank")]
    TokenEnv(String),
    #[error("{0:?} is not a valid name: use 1 to 64 letters, digits, `_` and `-`")]
    Name(String),
    #[error("{file}: {message}")]
    File {
        file: String,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error("{target}: no {} `{name}`", kind_name(*.kind))]
    NotFound {
        target: String,
        kind: DocKind,
        name: String,
    },
    #[error("{target}: no answer within {secs} s; raise --timeout if it is just slow")]
    Timeout { target: String, secs: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Node(#[from] NodeError),
}

impl CliError {
    /// 1 when the target refused a record or has no such name, 2 when the command could
    /// not run.
    fn status(&self) -> i32 {
        match self {
            Self::NotFound { .. }
            | Self::Store(StoreError::Invalid(_) | StoreError::Conflict { .. }) => 1,
            Self::Node(error) if error.is_refusal() => 1,
            _ => 2,
        }
    }
}

/// One record as `list` shows it. Only a node knows a server's state and tool count.
#[derive(Serialize)]
struct Record {
    kind: DocKind,
    name: String,
    format: DocFormat,
    revision: u64,
    updated_at: Option<u64>,
    state: Option<String>,
    tool_count: Option<u64>,
}

/// Every record, and the revision they were read at.
struct Listed {
    revision: u64,
    records: Vec<Record>,
}

/// What a `put` changed (with `--dry-run`: would change), and the revision after it.
struct Written {
    revision: u64,
    changes: Vec<DocChange>,
}

/// A file given to `put`, read and parsed.
struct Bundle {
    format: DocFormat,
    text: String,
    docs: Vec<StoredDoc>,
}

impl Bundle {
    fn read(path: &Path) -> Result<Self, CliError> {
        let file = path.display().to_string();
        let error = |message: String| CliError::File {
            file: file.clone(),
            message,
            source: None,
        };
        let failed = |what: &str, cause: Box<dyn std::error::Error + Send + Sync>| CliError::File {
            file: file.clone(),
            message: format!("{what}: {cause}"),
            source: Some(cause),
        };
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => DocFormat::Toml,
            Some("json") => DocFormat::Json,
            _ => {
                return Err(error(
                    "cannot tell the format from the name; name the file .toml or .json".into(),
                ));
            }
        };
        let max = defaults::CLI_REGISTRY_MAX_BYTES;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(max as u64 + 1).read_to_end(&mut bytes))
            .map_err(|e| failed("cannot read it", e.into()))?;
        if bytes.len() > max {
            return Err(error(format!("over {max} bytes; split it")));
        }
        let docs = parse_bundle(format, &bytes, &file)?;
        let text = String::from_utf8(bytes).map_err(|e| failed("not UTF-8", e.into()))?;
        Ok(Self { format, text, docs })
    }
}

/// The node or store a command works on.
enum Target {
    Node(NodeClient),
    Store(Arc<dyn RegistryStore>),
}

impl Target {
    async fn open(args: &TargetArgs, timeout: Duration) -> Result<Self, CliError> {
        if let Some(url) = &args.node {
            let var = args.token_env.as_deref().ok_or(CliError::NoTokenEnv)?;
            let token = std::env::var(var)
                .ok()
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| CliError::TokenEnv(var.to_owned()))?;
            return Ok(Self::Node(NodeClient::new(url, token, timeout)?));
        }
        let source = args.registry.as_ref().ok_or(CliError::NoTarget)?;
        let etcd = match (&args.config, source) {
            (Some(path), RegistrySource::Etcd { .. }) => NodeFileConfig::load(path)
                .and_then(|config| config.etcd.resolve(path))
                .map_err(|e| CliError::File {
                    file: path.display().to_string(),
                    message: format!("{}{}", e.field, e.message),
                    source: Some(e.into()),
                })?,
            _ => EtcdAccess::default(),
        };
        Ok(Self::Store(source.open(&etcd).await?))
    }

    fn describe(&self) -> String {
        match self {
            Self::Node(node) => format!("node {}", node.base()),
            Self::Store(store) => store.describe(),
        }
    }

    async fn list(&self) -> Result<Listed, CliError> {
        Ok(match self {
            Self::Node(node) => node.list().await?,
            Self::Store(store) => store::list(&**store).await?,
        })
    }

    async fn docs(&self) -> Result<Vec<StoredDoc>, CliError> {
        Ok(match self {
            Self::Node(node) => node.docs().await?,
            Self::Store(store) => store.list().await?.docs,
        })
    }

    async fn get(&self, kind: DocKind, name: &str) -> Result<Option<StoredDoc>, CliError> {
        Ok(match self {
            Self::Node(node) => node.get(kind, name).await?,
            Self::Store(store) => store.get(kind, name).await?,
        })
    }

    async fn put(&self, bundle: &Bundle, dry_run: bool) -> Result<Written, CliError> {
        Ok(match self {
            Self::Node(node) => node.put(bundle, dry_run).await?,
            Self::Store(store) => store::put(&**store, &bundle.docs, dry_run).await?,
        })
    }

    async fn delete(&self, kind: DocKind, name: &str) -> Result<Option<u64>, CliError> {
        Ok(match self {
            Self::Node(node) => node.delete(kind, name).await?,
            Self::Store(store) => store::delete(&**store, kind, name).await?,
        })
    }
}

/// What to do once the target is open.
enum Job {
    List { json: bool },
    Get { kind: DocKind, name: String },
    Put { file: PathBuf, dry_run: bool },
    Delete { kind: DocKind, name: String },
    Diff { dir: PathBuf },
}

pub(super) async fn run(command: RegistryCommand) -> i32 {
    let kind = |profile: bool| {
        if profile {
            DocKind::Profile
        } else {
            DocKind::Server
        }
    };
    let (args, job) = match command {
        RegistryCommand::Validate { dir } => return validate(dir),
        RegistryCommand::Pin(args) => return crate::pin::run(args).await,
        RegistryCommand::List { json, target } => (target, Job::List { json }),
        RegistryCommand::Get {
            name,
            profile,
            target,
        } => (
            target,
            Job::Get {
                kind: kind(profile),
                name,
            },
        ),
        RegistryCommand::Put {
            file,
            dry_run,
            target,
        } => (target, Job::Put { file, dry_run }),
        RegistryCommand::Delete {
            name,
            profile,
            target,
        } => (
            target,
            Job::Delete {
                kind: kind(profile),
                name,
            },
        ),
        RegistryCommand::Diff { dir, target } => (target, Job::Diff { dir }),
    };
    let is_diff = matches!(job, Job::Diff { .. });
    let timeout = Duration::from_secs(args.timeout);
    let work = async {
        let target = Target::open(&args, timeout).await?;
        let described = target.describe();
        match tokio::time::timeout(timeout, job.run(&target)).await {
            Ok(done) => done,
            Err(_) => Err(CliError::Timeout {
                target: described,
                secs: args.timeout,
            }),
        }
    };
    match work.await {
        Ok(status) => status,
        Err(error) => {
            eprintln!("quiver: {error}");
            if is_diff { 2 } else { error.status() }
        }
    }
}

impl Job {
    async fn run(self, target: &Target) -> Result<i32, CliError> {
        match self {
            Self::List { json } => list(target, json).await,
            Self::Get { kind, name } => get(target, kind, &name).await,
            Self::Put { file, dry_run } => put(target, &file, dry_run).await,
            Self::Delete { kind, name } => delete(target, kind, &name).await,
            Self::Diff { dir } => diff(target, &dir).await,
        }
    }
}

async fn list(target: &Target, json: bool) -> Result<i32, CliError> {
    let mut listed = target.list().await?;
    listed
        .records
        .sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    if json {
        let answer = serde_json::json!({"revision": listed.revision, "records": listed.records});
        println!("{answer}");
        return Ok(0);
    }
    let or_dash = |value: Option<String>| value.map_or_else(|| "-".to_owned(), |v| printable(&v));
    let rows: Vec<[String; 7]> = listed
        .records
        .into_iter()
        .map(|r| {
            [
                kind_name(r.kind).to_owned(),
                printable(&r.name),
                format_name(r.format).to_owned(),
                r.revision.to_string(),
                or_dash(r.updated_at.map(utc)),
                or_dash(r.state),
                or_dash(r.tool_count.map(|n| n.to_string())),
            ]
        })
        .collect();
    super::table::print(
        [
            "KIND", "NAME", "FORMAT", "REVISION", "UPDATED", "STATE", "TOOLS",
        ],
        &rows,
    );
    Ok(0)
}

fn checked_name(name: &str) -> Result<&str, CliError> {
    if is_valid_server_id(name) {
        Ok(name)
    } else {
        Err(CliError::Name(printable(name)))
    }
}

fn not_found(target: &Target, kind: DocKind, name: &str) -> CliError {
    CliError::NotFound {
        target: target.describe(),
        kind,
        name: name.to_owned(),
    }
}

/// Writes the document byte for byte, so `get fs > fs.toml` round-trips; on a terminal
/// its lines are made printable first (a stored document is untrusted text).
async fn get(target: &Target, kind: DocKind, name: &str) -> Result<i32, CliError> {
    let name = checked_name(name)?;
    let doc = target
        .get(kind, name)
        .await?
        .ok_or_else(|| not_found(target, kind, name))?;
    let mut out = std::io::stdout().lock();
    let written = if out.is_terminal() {
        out.write_all(printable_lines(&String::from_utf8_lossy(&doc.body)).as_bytes())
    } else {
        out.write_all(&doc.body)
    };
    // A closed pipe (`| head`) is the reader's choice, not a failure worth a message.
    let _ = written.and_then(|()| out.flush());
    Ok(0)
}

async fn put(target: &Target, file: &Path, dry_run: bool) -> Result<i32, CliError> {
    let bundle = Bundle::read(file)?;
    let written = target.put(&bundle, dry_run).await?;
    print_changes(&written.changes);
    let count = |change: Change| {
        written
            .changes
            .iter()
            .filter(|c| c.change == change)
            .count()
    };
    let (added, updated, same) = (
        count(Change::Add),
        count(Change::Update),
        count(Change::Unchanged),
    );
    if dry_run {
        println!("dry run: {added} to add, {updated} to update, {same} unchanged; nothing written");
    } else {
        println!(
            "revision {}: {added} added, {updated} updated, {same} unchanged",
            written.revision
        );
    }
    Ok(0)
}

async fn delete(target: &Target, kind: DocKind, name: &str) -> Result<i32, CliError> {
    let name = checked_name(name)?;
    let revision = target
        .delete(kind, name)
        .await?
        .ok_or_else(|| not_found(target, kind, name))?;
    println!("- {} {name}", kind_name(kind));
    println!("revision {revision}");
    Ok(0)
}

async fn diff(target: &Target, dir: &Path) -> Result<i32, CliError> {
    if !dir.is_dir() {
        return Err(CliError::File {
            file: dir.display().to_string(),
            message: "not a directory; pass a registry directory".into(),
            source: None,
        });
    }
    let wanted = DirStore::new(dir).list().await?.docs;
    let current = target.docs().await?;
    let changes = diff_docs(&current, &wanted);
    print_changes(&changes);
    Ok(i32::from(
        changes.iter().any(|c| c.change != Change::Unchanged),
    ))
}

/// One line per document that differs: `+ server fs`, `~ server gh`, `- profile dev`.
fn print_changes(changes: &[DocChange]) {
    for change in changes {
        let sign = match change.change {
            Change::Add => '+',
            Change::Update => '~',
            Change::Remove => '-',
            Change::Unchanged => continue,
        };
        println!(
            "{sign} {} {}",
            kind_name(change.kind),
            printable(&change.name)
        );
    }
}

fn kind_name(kind: DocKind) -> &'static str {
    match kind {
        DocKind::Server => "server",
        DocKind::Profile => "profile",
    }
}

fn format_name(format: DocFormat) -> &'static str {
    match format {
        DocFormat::Toml => "toml",
        DocFormat::Json => "json",
    }
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (the proleptic Gregorian calendar, in UTC).
fn utc(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, on days since 0000-03-01 (u64: no negatives).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn validate(dir: PathBuf) -> i32 {
    let registry = match Registry::load_dir(&dir) {
        Ok(registry) => registry,
        Err(e) => {
            eprintln!("quiver: {e}");
            return 1;
        }
    };
    for problem in registry.problems() {
        println!("{problem}");
    }
    let ids: Vec<_> = registry
        .servers()
        .map(|s| s.server_id().to_owned())
        .collect();
    let errors = registry
        .problems()
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .count();
    let warnings = registry.problems().len() - errors;
    println!(
        "{}: {} servers ({}), {errors} errors, {warnings} warnings, revision {}",
        dir.display(),
        ids.len(),
        ids.join(", "),
        registry.revision()
    );
    i32::from(errors > 0)
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn unix_seconds_print_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_795_000_000), "2026-11-18T11:06:40Z");
        assert_eq!(utc(4_102_444_799), "2099-12-31T23:59:59Z");
    }
}
