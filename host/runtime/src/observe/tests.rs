use std::sync::Mutex;

use super::*;
use crate::defaults::{MAX_SUMMARY_KEY_BYTES, MAX_SUMMARY_KEYS};

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl ToolObserver for Recorder {
    fn before_tool_call(&self, call: &ToolCall) {
        self.0.lock().unwrap().push(format!("before {}", call.tool));
    }
    fn after_tool_call(&self, call: &ToolCall, end: &ToolCallEnd) {
        let label = end.outcome.label();
        self.0
            .lock()
            .unwrap()
            .push(format!("after {} {label}", call.tool));
    }
}

fn call(tool: &str) -> ToolCall {
    ToolCall {
        task_id: "t".into(),
        principal: None,
        client: None,
        session_fd: Some(3),
        via: Via::McpCall,
        kind: ToolKind::Mcp {
            server_id: "s".into(),
        },
        tool: tool.into(),
        arguments: ArgumentsSummary::default(),
        argument_values: None,
        started_at: std::time::SystemTime::now(),
    }
}

#[test]
fn a_call_is_reported_once_and_a_dropped_one_as_cancelled() {
    let recorder = Arc::new(Recorder::default());
    let observers = Observers::new(vec![recorder.clone()]);
    observers.start(call("a")).finish(ToolOutcome::Ok, 3);
    drop(observers.start(call("b")));
    assert_eq!(
        *recorder.0.lock().unwrap(),
        ["before a", "after a ok", "before b", "after b cancelled"]
    );
}

#[test]
fn summaries_keep_keys_not_values_and_stay_bounded() {
    let s = ArgumentsSummary::of_json_text(r#"{"path": "/secret", "n": [1, {"x": 2}]}"#);
    assert_eq!(s.keys, ["path", "n"]);
    assert_eq!(s.bytes, 39);
    assert!(ArgumentsSummary::of_json_text("[1,2]").keys.is_empty());
    assert!(ArgumentsSummary::of_json_text("{\"a\": ").keys.is_empty());
    let many: String = (0..100).map(|i| format!("\"k{i}\":0,")).collect();
    let long_key = "é".repeat(100);
    let s = ArgumentsSummary::of_json_text(&format!("{{\"{long_key}\":1,{}\"z\":0}}", many));
    assert_eq!(s.keys.len(), MAX_SUMMARY_KEYS);
    assert_eq!(s.keys_omitted, 101 - MAX_SUMMARY_KEYS + 1);
    assert!(s.keys[0].len() <= MAX_SUMMARY_KEY_BYTES);
}
