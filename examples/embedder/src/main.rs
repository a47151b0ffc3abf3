//! A scheduler embedding Quiver as a library, using nothing but its public API.
//!
//! It keeps the registry in a store of its own (in memory), decides approvals itself, and
//! watches every tool call, then runs one guest task:
//!
//! ```text
//! quiver-embedder <guest.wasm> [guest args...]
//! ```
//!
//! The store holds one server, the fixture MCP server (`QUIVER_FIXTURE_SERVER` names its
//! binary), whose `add` and `echo` calls wait for approval: this approver allows `add` and
//! refuses the rest. The observer prints each call and denial as it happens.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::StreamExt;
use futures::stream::BoxStream;
use quiver::registry::{
    DocFormat, DocKind, Listing, RegistryStore, StoreError, StoreEvent, StoreFuture, StoredDoc,
    Write,
};
use quiver::{
    ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver, Host, LaunchConfig, LaunchRules,
    PolicyDenial, TaskSpec, ToolCall, ToolCallEnd, ToolObserver,
};

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(guest) = args.next() else {
        eprintln!("usage: quiver-embedder <guest.wasm> [guest args...]");
        return ExitCode::from(2);
    };
    match run(&guest, args.collect()).await {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("quiver-embedder: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(guest: &str, guest_args: Vec<String>) -> Result<i32, Box<dyn std::error::Error>> {
    let server = std::env::var("QUIVER_FIXTURE_SERVER")
        .unwrap_or_else(|_| "target/debug/fixture-mcp-server".into());
    let store = Arc::new(MemoryStore::default());
    store
        .upsert(
            DocKind::Server,
            "fixture",
            DocFormat::Toml,
            fixture_record(&server),
        )
        .await?;

    // A host following a store runs no command its rules do not list; this one lists the
    // one binary its store names.
    let rules = LaunchRules::from_config(&LaunchConfig {
        commands: vec![server.clone()],
        ..Default::default()
    })?;
    let host = Host::builder()
        .with_registry_store(store.clone())
        .with_launch_rules(rules)
        .with_approver(Arc::new(AddOnly))
        .with_tool_observer(Arc::new(Printer))
        .without_disk_cache()
        .build()?;
    let follower = host.follow_store(store)?;
    if !follower.first_sync(std::time::Duration::from_secs(5)).await {
        return Err("the registry store was not read within 5 s".into());
    }

    let module = host.load_module_file(guest)?;
    let mut task = TaskSpec::new("embedded-task");
    task.config.insert("mcp.enabled".into(), "true".into());
    task.config
        .insert("mcp.default_server_ids".into(), r#"["fixture"]"#.into());
    task.args = guest_args;
    // In a tokio task of its own, as `Host::run_task` advises: each MCP answer then wakes the
    // task on the worker that read it, instead of being handed to this `block_on` thread.
    let running = tokio::spawn({
        let host = host.clone();
        async move { host.run_task(&module, &task).await }
    });
    let outcome = running.await??;
    print!("{}", outcome.stdout_text());
    eprint!("{}", outcome.stderr_text());
    println!("embedder: guest exited with {}", outcome.exit_code);
    host.shutdown().await;
    Ok(outcome.exit_code)
}

/// The fixture server's record, as a document of the store; `add` and `echo` wait for
/// approval.
fn fixture_record(command: &str) -> Vec<u8> {
    format!(
        "version = 1\nserver_id = \"fixture\"\ntransport = \"stdio\"\n\
         allowed_tools = [\"echo\", \"add\"]\napproval_policy = \"always\"\n\
         [stdio]\ncommand = {command:?}\n"
    )
    .into_bytes()
}

/// Approves `add`, refuses every other tool.
struct AddOnly;

impl Approver for AddOnly {
    fn ask(&self, request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(async move {
            let approve = request.tool == "add";
            println!(
                "approver: {}/{} for task {}: {}",
                request.server_id,
                request.tool,
                request.task_id,
                if approve { "approved" } else { "denied" }
            );
            if approve {
                ApprovalDecision::approve()
            } else {
                ApprovalDecision::deny("this scheduler only allows add")
            }
        })
    }
}

/// Prints every tool call and policy denial.
struct Printer;

impl ToolObserver for Printer {
    fn before_tool_call(&self, call: &ToolCall) {
        println!("observer: calling {} ({:?})", call.tool, call.kind);
    }

    fn after_tool_call(&self, call: &ToolCall, end: &ToolCallEnd) {
        println!("observer: {} ended {}", call.tool, end.outcome.label());
    }

    fn policy_denied(&self, denial: &PolicyDenial) {
        println!("observer: denied {:?}: {}", denial.tool, denial.detail);
    }
}

/// The store's revision and its documents by kind and name.
type Docs = (u64, BTreeMap<(DocKind, String), StoredDoc>);

/// A registry store in memory: documents by kind and name, one revision counter, and a
/// channel that tells watchers of each change.
#[derive(Debug)]
struct MemoryStore {
    state: Mutex<Docs>,
    changes: tokio::sync::broadcast::Sender<StoreEvent>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            state: Mutex::new((0, BTreeMap::new())),
            changes: tokio::sync::broadcast::channel(64).0,
        }
    }
}

impl MemoryStore {
    fn put(&self, kind: DocKind, name: &str, format: DocFormat, body: Vec<u8>) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 += 1;
        let doc = StoredDoc {
            kind,
            name: name.to_owned(),
            format,
            body,
            revision: state.0,
            updated_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs()),
        };
        state.1.insert((kind, name.to_owned()), doc.clone());
        let _ = self.changes.send(StoreEvent::Put(doc));
        state.0
    }

    fn remove(&self, kind: DocKind, name: &str) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1.remove(&(kind, name.to_owned()))?;
        state.0 += 1;
        let revision = state.0;
        let name = name.to_owned();
        let _ = self.changes.send(StoreEvent::Deleted {
            kind,
            name,
            revision,
        });
        Some(revision)
    }
}

impl RegistryStore for MemoryStore {
    fn describe(&self) -> String {
        "memory".into()
    }

    fn list(&self) -> StoreFuture<'_, Listing> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let listing = Listing {
            revision: state.0,
            docs: state.1.values().cloned().collect(),
        };
        Box::pin(async move { Ok(listing) })
    }

    fn get(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<StoredDoc>> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let doc = state.1.get(&(kind, name.to_owned())).cloned();
        Box::pin(async move { Ok(doc) })
    }

    fn upsert(
        &self,
        kind: DocKind,
        name: &str,
        format: DocFormat,
        body: Vec<u8>,
    ) -> StoreFuture<'_, u64> {
        let revision = self.put(kind, name, format, body);
        Box::pin(async move { Ok(revision) })
    }

    fn apply(&self, writes: Vec<Write>, listed_at: u64) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let now = self.list().await?.revision;
            if now != listed_at {
                return Err(StoreError::Changed {
                    store: self.describe(),
                });
            }
            for write in writes {
                match write {
                    Write::Put(doc) => {
                        self.put(doc.kind, &doc.name, doc.format, doc.body);
                    }
                    Write::Delete { kind, name } => {
                        self.remove(kind, &name);
                    }
                }
            }
            Ok(self.list().await?.revision)
        })
    }

    fn delete(&self, kind: DocKind, name: &str) -> StoreFuture<'_, Option<u64>> {
        let revision = self.remove(kind, name);
        Box::pin(async move { Ok(revision) })
    }

    fn watch(
        &self,
        since: u64,
    ) -> StoreFuture<'_, BoxStream<'static, Result<StoreEvent, StoreError>>> {
        let changes = self.changes.subscribe();
        Box::pin(async move {
            // No history is kept: a watch from an older revision starts with a full put.
            let listing = self.list().await?;
            let replay: Vec<_> = if listing.revision > since {
                listing
                    .docs
                    .into_iter()
                    .map(|d| Ok(StoreEvent::Put(d)))
                    .collect()
            } else {
                Vec::new()
            };
            let live = futures::stream::unfold(changes, |mut changes| async move {
                loop {
                    match changes.recv().await {
                        Ok(event) => return Some((Ok(event), changes)),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            });
            Ok(futures::stream::iter(replay).chain(live).boxed())
        })
    }
}
