//! Which slot a call lands in across registry changes (no server is started: entering a
//! slot and applying a registry never connect), and which failures count against a
//! server's health.

use std::collections::BTreeMap;

use rmcp::ServiceError;
use rmcp::model::{ErrorCode, ErrorData};

use super::failure::{CallPhase, service_failed};
use super::*;
use crate::mcp::McpErrorCode;
use crate::registry::{Launch, ServerEntry, ServerRecord};

fn entry(command: &str) -> ServerEntry {
    ServerEntry {
        record: ServerRecord::for_tests("s"),
        source: "s.toml".into(),
        launch: Ok(Launch::Stdio {
            command: command.into(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: None,
            vars: Default::default(),
            secrets: Default::default(),
        }),
    }
}

/// A snapshot holding `s`, launched with `command`, and its entry.
fn snapshot(command: &str) -> (Arc<Registry>, Arc<ServerEntry>) {
    let registry = Arc::new(Registry::from_entries(vec![entry(command)], vec![]));
    let entry = registry.get("s").unwrap().clone();
    (registry, entry)
}

fn current(pool: &McpPool) -> Option<Arc<ServerSlot>> {
    pool.shared.slots().get("s").cloned()
}

/// The registry goes from `a` to `b` and back to `a` while a task on the first snapshot
/// holds its (now retired) slot: a task on the current snapshot gets a current slot of
/// its own, not the retired one the reaper will stop.
#[test]
fn a_current_entry_never_lands_in_a_retired_slot() {
    let pool = McpPool::default();
    let (first, old_entry) = snapshot("a");
    pool.apply_registry(&first);
    let old_call = pool.enter(&old_entry, None);
    pool.apply_registry(&snapshot("b").0);
    assert_eq!(pool.shared.retired().len(), 1);
    let (again, entry) = snapshot("a");
    pool.apply_registry(&again);

    let call = pool.enter(&entry, None);
    assert!(!Arc::ptr_eq(&call.slot, &old_call.slot), "a retired slot");
    assert!(!call.slot.retired.load(Ordering::SeqCst));
    assert!(current(&pool).is_some_and(|slot| Arc::ptr_eq(&slot, &call.slot)));
    // The first snapshot's entry launches as the current one does: it is current again.
    assert!(Arc::ptr_eq(&pool.enter(&old_entry, None).slot, &call.slot));
}

/// A slot whose server changes while a call is in it, before that call connected: the
/// slot is retired (its process, once started, is stopped when the call ends), not
/// forgotten with a process nobody tracks.
#[test]
fn a_changed_slot_with_a_call_in_flight_is_retired_even_before_it_connects() {
    let pool = McpPool::default();
    let (first, entry) = snapshot("a");
    pool.apply_registry(&first);
    let call = pool.enter(&entry, None);
    assert_eq!(
        pool.apply_registry(&Arc::new(Registry::empty())),
        ["s".to_owned()]
    );
    assert!(current(&pool).is_none());
    let retired = pool.shared.retired().clone();
    assert_eq!(retired.len(), 1);
    assert!(Arc::ptr_eq(&retired[0], &call.slot));
    assert!(call.slot.retired.load(Ordering::SeqCst));

    // Unused and unconnected: nothing to stop, nothing kept.
    let (second, entry) = snapshot("b");
    pool.apply_registry(&second);
    drop(pool.enter(&entry, None));
    pool.apply_registry(&Arc::new(Registry::empty()));
    assert_eq!(pool.shared.retired().len(), 1, "only the slot with a call");
}

#[test]
fn only_errors_on_the_wire_count_against_a_servers_health() {
    let answered = |code| {
        let phase = CallPhase::new(CallPhase::ON_WIRE);
        let error = service_failed(
            "fs",
            "nope",
            ServiceError::McpError(ErrorData::new(code, "no such tool", None)),
            &phase,
        );
        (error.code, phase.on_wire())
    };
    assert_eq!(
        answered(ErrorCode::METHOD_NOT_FOUND),
        (McpErrorCode::ToolExecFailed, false),
        "an unknown tool says nothing of the server's health"
    );
    assert_eq!(
        answered(ErrorCode::INTERNAL_ERROR),
        (McpErrorCode::ToolExecFailed, true)
    );
    assert!(!CallPhase::new(CallPhase::WAITING_FOR_SERVER).on_wire());
}
