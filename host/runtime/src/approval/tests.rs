use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::gate::clean_reason;
use super::*;

fn request(id: &str) -> ApprovalRequest {
    request_of("t1", id)
}

fn request_of(task_id: &str, id: &str) -> ApprovalRequest {
    ApprovalRequest {
        id: id.into(),
        task_id: Arc::from(task_id),
        principal: None,
        client: None,
        session_fd: Some(3),
        via: Via::McpCall,
        server_id: "fs".into(),
        tool: "delete_file".into(),
        arguments: ArgumentsSummary::of_json_text(r#"{"path": "/secret/value"}"#),
        requested_at: SystemTime::now(),
        expires_at: SystemTime::now() + Duration::from_secs(60),
    }
}

#[tokio::test]
async fn a_queue_lists_hands_over_and_forgets_decisions() {
    let queue = ApprovalQueue::with_capacity(4);
    let waiting = queue.ask(request("a"));
    let listed = serde_json::to_value(queue.pending()).unwrap();
    assert_eq!(listed[0]["id"], "a");
    assert_eq!(listed[0]["arguments"]["keys"], serde_json::json!(["path"]));
    assert!(
        listed[0]["expires_at"].as_f64().unwrap() > listed[0]["requested_at"].as_f64().unwrap()
    );
    let mut fields: Vec<&str> = listed[0]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "arguments",
            "expires_at",
            "id",
            "requested_at",
            "server_id",
            "session_fd",
            "task_id",
            "tool",
            "via"
        ],
        "the fields GET /v1/approvals lists"
    );
    assert!(
        !listed.to_string().contains("secret"),
        "argument values never listed: {listed}"
    );
    let decision = ApprovalDecision::deny("no");
    queue.decide("a", decision.clone()).unwrap();
    assert_eq!(waiting.await, decision);
    assert!(queue.pending().is_empty());
    assert_eq!(
        queue.decide("a", ApprovalDecision::approve()),
        Err(ApprovalError::NoLongerWaiting { id: "a".into() }),
        "deciding twice"
    );
    assert_eq!(
        queue.decide("nope", ApprovalDecision::approve()),
        Err(ApprovalError::NotPending { id: "nope".into() })
    );
}

#[tokio::test]
async fn a_full_queue_denies_at_once_and_a_dropped_wait_leaves_it() {
    let queue = ApprovalQueue::with_capacity(1);
    let first = queue.ask(request("a"));
    let second = queue.ask(request("b")).await;
    assert!(!second.approve);
    assert!(second.reason.unwrap().contains("full (1"), "names the cap");
    assert_eq!(queue.pending().len(), 1);
    drop(first);
    assert!(
        queue.pending().is_empty(),
        "a dropped wait leaves the queue"
    );
    assert!(queue.decide("a", ApprovalDecision::approve()).is_err());
}

#[test]
fn decisions_read_the_serve_body_and_nothing_else() {
    let d: ApprovalDecision =
        serde_json::from_str(r#"{"approve": false, "reason": "risky"}"#).unwrap();
    assert_eq!(d, ApprovalDecision::deny("risky"));
    let d: ApprovalDecision = serde_json::from_str(r#"{"approve": true}"#).unwrap();
    assert_eq!(d, ApprovalDecision::approve());
    assert!(serde_json::from_str::<ApprovalDecision>(r#"{"approve": true, "x": 1}"#).is_err());
    let forged = r#"{"approve": true, "decided_by": "root"}"#;
    assert!(
        serde_json::from_str::<ApprovalDecision>(forged).is_err(),
        "who decided is the node's to say"
    );
}

#[tokio::test]
async fn a_late_decision_is_told_the_call_stopped_waiting() {
    let queue = ApprovalQueue::with_capacity(4);
    drop(queue.ask(request("gone")));
    assert_eq!(
        queue.decide("gone", ApprovalDecision::approve()),
        Err(ApprovalError::NoLongerWaiting { id: "gone".into() })
    );
}

#[test]
fn reasons_are_cut_and_cleaned() {
    let long = "é".repeat(crate::defaults::MAX_APPROVAL_REASON_BYTES);
    let cut = clean_reason(&long);
    assert!(cut.len() <= crate::defaults::MAX_APPROVAL_REASON_BYTES && cut.starts_with('é'));
    assert_eq!(
        clean_reason(" no\u{1b}[2J\nway\u{202e} \n"),
        "no\\x1b[2J\\x0away\\u{202e}"
    );
}

#[tokio::test]
async fn a_duplicate_id_is_denied_and_the_first_request_keeps_waiting() {
    let queue = ApprovalQueue::with_capacity(8);
    let first = queue.ask(request("a"));
    let second = queue.ask(request("a")).await;
    assert!(!second.approve);
    assert!(second.reason.unwrap().contains("already waiting"));
    queue.decide("a", ApprovalDecision::approve()).unwrap();
    assert!(first.await.approve, "the first request got its decision");
}

#[tokio::test]
async fn one_task_holds_at_most_its_share_of_the_queue() {
    let queue = ApprovalQueue::with_capacity(8);
    let share = 8 / crate::defaults::APPROVAL_QUEUE_TASK_SHARE_DIVISOR;
    let held: Vec<_> = (0..share)
        .map(|i| queue.ask(request_of("greedy", &format!("g{i}"))))
        .collect();
    let over = queue.ask(request_of("greedy", "g-over")).await;
    assert!(!over.approve);
    let reason = over.reason.unwrap();
    assert!(
        reason.contains("task `greedy`") && reason.contains("share"),
        "{reason}"
    );
    let other = queue.ask(request_of("modest", "m"));
    assert_eq!(
        queue.pending().len(),
        share + 1,
        "another task still gets in"
    );
    drop((held, other));
    assert!(queue.pending().is_empty());
}

fn question(id: &str) -> ElicitationRequest {
    ElicitationRequest {
        id: id.into(),
        task_id: Arc::from("t1"),
        principal: None,
        client: None,
        via: Via::McpCall,
        server_id: "asks".into(),
        method: "tools/call",
        name: "ask_name".into(),
        message: "Who are you?".into(),
        requested_schema: serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string"}, "greeting": {"type": "string", "default": "hello"}},
            "required": ["name"]}),
        requested_at: SystemTime::now(),
        expires_at: SystemTime::now() + Duration::from_secs(60),
    }
}

#[tokio::test]
async fn a_queue_holds_questions_and_checks_answers_against_the_form() {
    let queue = ApprovalQueue::with_capacity(2);
    // Another task's call: a task's share of a queue of 2 is 1.
    let call = queue.ask(request_of("t2", "a"));
    // A question is queued when its future first runs.
    let mut asked = Box::pin(queue.elicit(question("q")));
    assert!(futures::poll!(asked.as_mut()).is_pending());
    assert_eq!(
        queue.pending().len(),
        1,
        "calls and questions are listed apart"
    );
    assert_eq!(queue.pending_questions()[0].id, "q");
    assert!(queue.is_question("q") && !queue.is_question("a"));
    // Full: calls and questions count together.
    assert_eq!(queue.elicit(question("r")).await, None);
    // The wrong kind of answer, and an answer that does not fit, leave it waiting.
    assert!(matches!(
        queue.decide("q", ApprovalDecision::approve()),
        Err(ApprovalError::Unfit { .. })
    ));
    let unfit = serde_json::json!({"name": 5}).as_object().unwrap().clone();
    let error = queue
        .answer("q", ElicitationAnswer::Accept { content: unfit })
        .unwrap_err();
    assert!(error.to_string().contains("field `name`"), "{error}");
    assert!(matches!(
        queue.answer("a", ElicitationAnswer::Decline),
        Err(ApprovalError::Unfit { .. })
    ));
    let content = serde_json::json!({"name": "Ada"})
        .as_object()
        .unwrap()
        .clone();
    queue
        .answer("q", ElicitationAnswer::Accept { content })
        .unwrap();
    assert_eq!(
        asked.await,
        Some(ElicitationAnswer::Accept {
            content: serde_json::json!({"name": "Ada", "greeting": "hello"})
                .as_object()
                .unwrap()
                .clone()
        }),
        "the form's defaults filled in"
    );
    assert!(queue.pending_questions().is_empty());
    assert!(matches!(
        queue.answer("q", ElicitationAnswer::Decline),
        Err(ApprovalError::NoLongerWaiting { .. })
    ));
    drop(call);
}
