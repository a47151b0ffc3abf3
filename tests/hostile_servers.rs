//! Hostile MCP servers against the real host: `hostile-mcp-server` over real stdio (it
//! hangs in `initialize`, writes garbage, huge and endless lines, huge and endless
//! `tools/list`s, wrong and repeated ids, floods of notifications and requests, and exits
//! mid-call), a hostile Streamable HTTP / legacy SSE responder, and an LLM backend that
//! answers too much.
//!
//! Each test asserts the exact error a guest sees, that it comes well before the timeout
//! that used to be the only way out (the records give calls 20 s; the answers must come
//! within a few), and that the next call works.

use std::time::{Duration, Instant};

use quiver::McpErrorCode;
use quiver::{Host, PreviewError};
use quiver_tests::chat_wat::{ChatGuest, scripted_host};
use quiver_tests::hostile_http::{HostileHttp, Misbehaviour};
use quiver_tests::llm::{Reply, ScriptedLlm};
use quiver_tests::{RegistryDir, host, hostile_server, mcp_task, server_status, unique_id, wat};
use serde_json::{Value, json};

/// The tool timeout of the records: what a call used to wait before `mcp_timeout`.
const LONG: &str = "tool_timeout_ms = 20000";

/// An answer "at once" arrives within this, far below [`LONG`] even on a loaded machine.
const AT_ONCE_MS: i32 = 5_000;

/// Registers the hostile server under a fresh id, in `mode` with `--bytes bytes`, with
/// `budgets` lines in its `[budgets]` table; returns the id.
fn hostile(registry: &RegistryDir, mode: &str, bytes: usize, budgets: &str) -> String {
    let id = unique_id("hostile");
    registry.write(
        &format!("{id}.toml"),
        &format!(
            "server_id = {id:?}\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n\n[stdio]\ncommand = {:?}\nargs = [\"--mode\", {mode:?}, \"--bytes\", \"{bytes}\"]\n\n[budgets]\n{budgets}\n",
            hostile_server().display().to_string()
        ),
    );
    id
}

/// What one `mcp_call_tool` gave the guest.
#[derive(Debug)]
struct Called {
    ret: i32,
    /// Milliseconds the call took, by the guest's clock.
    ms: i32,
    body: Value,
}

impl Called {
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("<none>")
    }

    fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_default()
    }

    fn text(&self) -> &str {
        self.body["content"][0]["text"].as_str().unwrap_or_default()
    }

    /// Asserts the call failed with `code`, at once.
    fn failed_at_once(&self, code: &str) -> &Self {
        assert_eq!(self.code(), code, "{self:?}");
        assert!(self.ms < AT_ONCE_MS, "took {} ms: {self:?}", self.ms);
        self
    }

    /// Asserts the call answered `ok <pid>`; returns the pid.
    fn ok(&self) -> &str {
        assert!(self.ret > 0, "{self:?}");
        let pid = self.text().strip_prefix("ok ");
        pid.unwrap_or_else(|| panic!("not an ok answer: {self:?}"))
    }
}

/// A step of [`call_all`] that makes no call: the guest waits `{"ms": N}` (busy, on its
/// clock) and records `{}`.
const PAUSE: &str = "(pause)";

/// Runs a guest that opens `server` and makes `calls` (tool, arguments) in order.
async fn call_all(host: &Host, server: &str, calls: &[(&str, Value)]) -> Vec<Called> {
    let mut data: Vec<(u32, Vec<u8>)> = vec![(1024, server.as_bytes().to_vec())];
    let mut body = format!(
        "(func $main (local $fd i32) (local $t i64)\n (local.set $fd (call $mcp_open (i32.const 1024) (i32.const {})))\n",
        server.len()
    );
    let mut at = 1100;
    data.push((1090, b"{}".to_vec()));
    for (tool, args) in calls {
        if *tool == PAUSE {
            let ms = args["ms"].as_u64().expect("a pause needs ms");
            body.push_str(&format!(
                " (local.set $t (call $time_now_ms))
                  (loop $wait (br_if $wait (i64.lt_u (i64.sub (call $time_now_ms) (local.get $t)) (i64.const {ms}))))
                  (call $out (i32.const 0))
                  (call $out (i32.wrap_i64 (i64.sub (call $time_now_ms) (local.get $t))))
                  (call $emit (i32.const 1090) (i32.const 2))\n"
            ));
            continue;
        }
        let args = args.to_string();
        let (name_at, args_at) = (at, at + tool.len() as u32);
        at = args_at + args.len() as u32;
        assert!(at < 4096, "the test data must fit below 4096");
        data.push((name_at, tool.as_bytes().to_vec()));
        data.push((args_at, args.as_bytes().to_vec()));
        body.push_str(&format!(
            " (local.set $t (call $time_now_ms))
              (call $cap (i32.const 8192) (i32.const 65536))
              (call $out (call $mcp_call_tool (local.get $fd) (i32.const {name_at}) (i32.const {}) (i32.const {args_at}) (i32.const {}) (i32.const 16384) (i32.const 8192)))
              (call $out (i32.wrap_i64 (i64.sub (call $time_now_ms) (local.get $t))))
              (call $emit (i32.const 16384) (call $len (i32.const 8192)))\n",
            tool.len(),
            args.len()
        ));
    }
    body.push(')');
    let data: Vec<(u32, &[u8])> = data.iter().map(|(a, b)| (*a, b.as_slice())).collect();
    let run = wat::run(
        host,
        &wat::guest(&data, &body),
        &mcp_task("hostile", &[server]),
    )
    .await;
    assert!(
        run.outcome.success(),
        "{:?}\n{}",
        run.outcome.failure,
        run.outcome.stderr_text()
    );
    run.results
        .chunks(2)
        .zip(&run.emitted)
        .map(|(pair, line)| Called {
            ret: pair[0],
            ms: pair[1],
            body: serde_json::from_str(line).unwrap_or(Value::Null),
        })
        .collect()
}

fn connections(host: &Host, server: &str) -> u64 {
    server_status(host, server).map_or(0, |s| s.connections)
}

#[tokio::test]
async fn a_server_that_never_answers_initialize_holds_a_call_only_for_its_connect_timeout() {
    let registry = RegistryDir::new();
    let server = hostile(
        &registry,
        "hang-initialize",
        0,
        &format!("{LONG}\nconnect_timeout_ms = 400"),
    );
    let host = host(&registry);
    let view = serde_json::to_value(host.registry().get(&server).unwrap().view()).unwrap();
    assert_eq!(view["budgets"]["connect_timeout_ms"], 400, "{view}");

    let called = call_all(&host, &server, &[("ok", json!({})), ("ok", json!({}))]).await;
    called[0].failed_at_once("mcp_unavailable");
    assert!(
        called[0]
            .message()
            .contains("within 400 ms (budgets.connect_timeout_ms)"),
        "{:?}",
        called[0]
    );
    assert!(
        called[0].ms >= 350,
        "waited for the handshake: {:?}",
        called[0]
    );
    // The next attempt fails as fast (backing off, or bounded by the same timeout).
    called[1].failed_at_once("mcp_unavailable");
    host.shutdown().await;
}

#[tokio::test]
async fn garbage_lines_and_stray_answers_are_dropped_and_the_call_is_still_answered() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[("garbage_then_ok", json!({})), ("ok", json!({}))],
    )
    .await;
    assert_eq!(called[0].ok(), called[1].ok(), "same process: {called:?}");
    assert_eq!(connections(&host, &server), 1);
    host.shutdown().await;
}

#[tokio::test]
async fn an_unparsable_answer_fails_its_call_at_once_and_the_server_stays_usable() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[("ok", json!({})), ("broken", json!({})), ("ok", json!({}))],
    )
    .await;
    called[1].failed_at_once("tool_exec_failed");
    assert_eq!(called[1].body["error"]["retryable"], false);
    assert!(
        called[1]
            .message()
            .contains(&format!("server `{server}` answered tools/call of `broken` with a message that is not valid JSON-RPC")),
        "{:?}",
        called[1]
    );
    assert_eq!(called[0].ok(), called[2].ok());
    assert_eq!(connections(&host, &server), 1);
    host.shutdown().await;
}

#[tokio::test]
async fn huge_answers_fail_at_once_with_mcp_output_too_large_and_the_server_stays_usable() {
    let registry = RegistryDir::new();
    let server = hostile(
        &registry,
        "normal",
        0,
        &format!("{LONG}\nmax_tool_output_bytes = 100000"),
    );
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[
            ("ok", json!({})),
            // Over the cap plus the envelope: stopped while it is read, the id first...
            ("huge", json!({"bytes": 5_000_000})),
            // ...or last, found by scanning what is thrown away.
            ("huge", json!({"bytes": 5_000_000, "id_last": true})),
            // Within the envelope: read, then refused once encoded.
            ("huge", json!({"bytes": 120_000})),
            ("ok", json!({})),
        ],
    )
    .await;
    for huge in &called[1..4] {
        huge.failed_at_once("mcp_output_too_large");
        let message = huge.message();
        assert!(
            message.starts_with(&format!("tool `huge` on server `{server}` returned"))
                && message.contains("the limit (budgets.max_tool_output_bytes) is 100000"),
            "{huge:?}"
        );
        assert_eq!(huge.body["error"]["retryable"], false);
    }
    assert!(called[1].message().contains("at least"), "{:?}", called[1]);
    assert!(
        called[3].message().contains("once encoded"),
        "{:?}",
        called[3]
    );
    assert_eq!(called[0].ok(), called[4].ok(), "the same server went on");
    assert_eq!(connections(&host, &server), 1);
    host.shutdown().await;
}

#[tokio::test]
async fn an_endless_answer_fails_at_once_and_the_stuck_connection_is_replaced() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[("endless", json!({})), ("ok", json!({})), ("ok", json!({}))],
    )
    .await;
    called[0].failed_at_once("mcp_output_too_large");
    // The call made while the line still runs is failed when the host gives up on it (or,
    // sent in the instant the connection ends, finds it gone), unless it was only sent
    // after that; either way the next one works.
    match called[1].code() {
        "mcp_unavailable" => assert!(
            called[1].message().contains("past every cap")
                || called[1].message().contains("went away during ok"),
            "{:?}",
            called[1]
        ),
        _ => {
            called[1].ok();
        }
    }
    called[2].ok();
    assert_eq!(connections(&host, &server), 2);
    host.shutdown().await;
}

#[tokio::test]
async fn an_answer_under_a_wrong_id_times_out_and_the_next_call_works() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, "tool_timeout_ms = 1000");
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[("wrong_id", json!({})), ("ok", json!({}))],
    )
    .await;
    assert_eq!(called[0].code(), "mcp_timeout", "{:?}", called[0]);
    assert!(called[0].ms >= 900, "{:?}", called[0]);
    called[1].ok();
    assert_eq!(connections(&host, &server), 1);
    host.shutdown().await;
}

#[tokio::test]
async fn repeated_and_string_ids_are_matched_once() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[
            ("duplicate_id", json!({})),
            ("string_id", json!({})),
            ("ok", json!({})),
        ],
    )
    .await;
    let pid = called[0].ok();
    assert_eq!(called[1].ok(), pid);
    assert_eq!(
        called[2].ok(),
        pid,
        "the repeated answer answered nothing else"
    );
    host.shutdown().await;
}

#[tokio::test]
async fn notification_and_request_floods_close_the_connection_and_the_next_call_restarts_it() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[
            ("notify", json!({"count": 200})),
            ("notify", json!({"count": 50_000})),
            ("ok", json!({})),
            ("ping", json!({"count": 50_000})),
            ("ok", json!({})),
        ],
    )
    .await;
    let first = called[0].ok();
    for flood in [&called[1], &called[3]] {
        flood.failed_at_once("mcp_unavailable");
        assert!(
            flood
                .message()
                .contains("more messages the host had to drop than it allows"),
            "{flood:?}"
        );
    }
    let second = called[2].ok();
    assert_ne!(first, second, "a new process after the flood");
    assert_ne!(called[4].ok(), second);
    assert_eq!(connections(&host, &server), 3);
    host.shutdown().await;
}

#[tokio::test]
async fn a_flood_of_blank_lines_closes_the_connection_and_the_next_call_restarts_it() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[
            ("ok", json!({})),
            ("blank_flood", json!({})),
            ("ok", json!({})),
        ],
    )
    .await;
    let first = called[0].ok();
    called[1].failed_at_once("mcp_unavailable");
    assert!(
        called[1]
            .message()
            .contains("more messages the host had to drop than it allows"),
        "{:?}",
        called[1]
    );
    assert_ne!(called[2].ok(), first, "a new process after the flood");
    assert_eq!(connections(&host, &server), 2);
    host.shutdown().await;
}

#[tokio::test]
async fn a_call_that_times_out_is_cancelled_so_the_connection_forgets_it() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, "tool_timeout_ms = 300");
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[("hang", json!({})), ("cancelled", json!({}))],
    )
    .await;
    assert_eq!(called[0].code(), "mcp_timeout", "{:?}", called[0]);
    // The cancellation goes out when the timed-out call is dropped; the guard drops its
    // pending entry on the same message.
    let cancelled: Vec<Value> = serde_json::from_str(called[1].text()).unwrap();
    assert_eq!(cancelled.len(), 1, "{:?}", called[1]);
    host.shutdown().await;
}

#[tokio::test]
async fn a_connection_closed_between_calls_is_never_handed_another_call() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    // The flood comes after the answer, with no call pending; the server then blocks on
    // its full stdout, so its connection takes the shutdown grace to close.
    let called = call_all(
        &host,
        &server,
        &[
            ("notify_after", json!({"count": 50_000})),
            (PAUSE, json!({"ms": 500})),
            ("ok", json!({})),
        ],
    )
    .await;
    let first = called[0].ok();
    assert!(called[2].ms < AT_ONCE_MS, "{:?}", called[2]);
    assert_ne!(called[2].ok(), first, "a new process");
    assert_eq!(connections(&host, &server), 2);
    host.shutdown().await;
}

#[tokio::test]
async fn a_server_that_exits_mid_call_fails_it_at_once_and_is_restarted() {
    let registry = RegistryDir::new();
    let server = hostile(&registry, "normal", 0, LONG);
    let host = host(&registry);
    let called = call_all(
        &host,
        &server,
        &[("ok", json!({})), ("exit", json!({})), ("ok", json!({}))],
    )
    .await;
    called[1].failed_at_once("mcp_unavailable");
    assert_eq!(called[1].body["error"]["retryable"], true);
    assert_ne!(called[0].ok(), called[2].ok());
    assert_eq!(connections(&host, &server), 2);
    host.shutdown().await;
}

/// Lists `server`'s tools through the pool, timing it.
async fn list(host: &Host, server: &str) -> (Result<usize, quiver::McpError>, Duration) {
    let started = Instant::now();
    let listed = match host.server_tools(server).await {
        Ok(tools) => Ok(tools.len()),
        Err(PreviewError::Unavailable(error)) => Err(error),
        Err(unknown) => panic!("{unknown}"),
    };
    (listed, started.elapsed())
}

#[tokio::test]
async fn a_tools_list_over_its_cap_is_refused_whole_and_at_once() {
    let registry = RegistryDir::new();
    // One page over the default 4 MiB cap: stopped while it is read.
    let huge_page = hostile(&registry, "huge-list-page", 6 << 20, LONG);
    // Pages of 64 KiB without end: refused once they add up to the cap.
    let endless = hostile(
        &registry,
        "endless-list",
        64 << 10,
        &format!("{LONG}\nmax_tool_list_bytes = 1000000"),
    );
    let host = host(&registry);
    for (server, budget) in [(&huge_page, "4194304"), (&endless, "1000000")] {
        let (listed, took) = list(&host, server).await;
        let error = listed.expect_err("over the cap");
        assert_eq!(error.code, McpErrorCode::OutputTooLarge, "{error}");
        assert!(
            error.message.contains(&format!("server `{server}`"))
                && error.message.contains(&format!(
                    "the limit (budgets.max_tool_list_bytes) is {budget}"
                )),
            "{error}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    // The guest sees -EIO from mcp_list_tools; tool calls still work.
    let body = "(func $main (local $fd i32)
        (local.set $fd (call $mcp_open (i32.const 1024) (i32.const ID_LEN)))
        (call $cap (i32.const 8192) (i32.const 65536))
        (call $out (call $mcp_list_tools (local.get $fd) (i32.const 16384) (i32.const 8192))))"
        .replace("ID_LEN", &huge_page.len().to_string());
    let run = wat::run(
        &host,
        &wat::guest(&[(1024, huge_page.as_bytes())], &body),
        &mcp_task("list", &[&huge_page]),
    )
    .await;
    assert_eq!(run.results, [quiver::Errno::EIO.ret()]);
    call_all(&host, &huge_page, &[("ok", json!({}))]).await[0].ok();
    assert_eq!(connections(&host, &huge_page), 1);
    host.shutdown().await;
}

/// A remote record for `url`.
fn remote(registry: &RegistryDir, transport: &str, url: &str, budgets: &str) -> String {
    let id = unique_id("hostile-http");
    registry.write(
        &format!("{id}.toml"),
        &format!(
            "server_id = {id:?}\ntransport = {transport:?}\nallowed_tools = [\"*\"]\n[http]\nurl = {url:?}\n[budgets]\n{budgets}\n"
        ),
    );
    id
}

fn remote_host(registry: &RegistryDir) -> Host {
    quiver_tests::init_logging();
    let config = quiver::HostConfig {
        egress: quiver::EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    quiver_tests::host_builder(registry)
        .with_config(config, ".")
        .build()
        .unwrap()
}

#[tokio::test]
async fn remote_answers_over_their_caps_fail_at_once_and_the_server_stays_usable() {
    let http = HostileHttp::start().await;
    let registry = RegistryDir::new();
    let budgets = format!("{LONG}\nmax_tool_output_bytes = 100000");
    let streamable = remote(&registry, "streamable_http", &http.mcp_url(), &budgets);
    let legacy = remote(&registry, "http_sse_legacy", &http.sse_url(), &budgets);
    let host = remote_host(&registry);
    let streamable_calls = [
        Misbehaviour::HugeEvent,
        // One request's event stream: only that stream is given up.
        Misbehaviour::EndlessEvent,
        // A JSON body is read only up to the call's cap (rmcp's own client reads 16 MiB).
        Misbehaviour::HugeJsonBody,
        Misbehaviour::StalledJsonBody,
    ];
    for (server, misbehaviours) in [
        (&streamable, &streamable_calls[..]),
        (&legacy, &[Misbehaviour::HugeEvent][..]),
    ] {
        let mut calls = vec![("ok", json!({}))];
        calls.extend(misbehaviours.iter().map(|m| (m.tool(), json!({}))));
        calls.push(("ok", json!({})));
        let called = call_all(&host, server, &calls).await;
        called[0].ok();
        for huge in &called[1..calls.len() - 1] {
            huge.failed_at_once("mcp_output_too_large");
            assert!(
                huge.message()
                    .contains(&format!("on server `{server}` returned at least"))
                    && huge.message().contains("budgets.max_tool_output_bytes"),
                "{server}: {huge:?}"
            );
        }
        called[calls.len() - 1].ok();
    }
    // An HTTP error's JSON body over rmcp's 64 KiB (below the output cap) is the server's
    // failure, not an oversized result.
    let called = call_all(
        &host,
        &streamable,
        &[
            (Misbehaviour::HugeJsonError.tool(), json!({})),
            ("ok", json!({})),
        ],
    )
    .await;
    called[0].failed_at_once("tool_exec_failed");
    assert!(
        called[0]
            .message()
            .contains("with an HTTP error whose body is over"),
        "{:?}",
        called[0]
    );
    called[1].ok();
    host.shutdown().await;
}

/// serde_json (with `raw_value`, as the host is built) would read the string under its
/// reserved key as the JSON it holds; an answer using it fails its call, on both transports,
/// in an event, a plain JSON body or a resumed stream.
#[tokio::test]
async fn a_remote_answer_hiding_values_in_a_string_fails_its_call() {
    let http = HostileHttp::start().await;
    let registry = RegistryDir::new();
    let streamable = remote(&registry, "streamable_http", &http.mcp_url(), LONG);
    let legacy = remote(&registry, "http_sse_legacy", &http.sse_url(), LONG);
    let host = remote_host(&registry);
    for (server, misbehaviours) in [
        (
            &streamable,
            &[
                Misbehaviour::HiddenValues,
                Misbehaviour::HiddenValuesJson,
                Misbehaviour::HiddenValuesResumed,
            ][..],
        ),
        (&legacy, &[Misbehaviour::HiddenValues][..]),
    ] {
        let mut calls: Vec<_> = misbehaviours
            .iter()
            .map(|m| (m.tool(), json!({})))
            .collect();
        calls.push(("ok", json!({})));
        let called = call_all(&host, server, &calls).await;
        for hidden in &called[..misbehaviours.len()] {
            hidden.failed_at_once("tool_exec_failed");
            assert!(
                hidden.message().contains("RawValue` is reserved"),
                "{server}: {hidden:?}"
            );
        }
        called[misbehaviours.len()].ok();
    }
    host.shutdown().await;
}

#[tokio::test]
async fn an_llm_answer_over_the_cap_is_llm_response_too_large_never_cut_json() {
    let body_over_cap = quiver::defaults::LLM_MAX_RESPONSE_BYTES + 1024;
    let llm = ScriptedLlm::start(vec![
        // Declared too long by Content-Length, then streamed without one.
        Reply::Huge {
            bytes: body_over_cap,
            chunked: false,
        },
        Reply::Huge {
            bytes: body_over_cap,
            chunked: true,
        },
        Reply::text("fine again"),
    ])
    .await;
    let registry = RegistryDir::new();
    let host = scripted_host(&registry, &llm);
    let guest = ChatGuest::new()
        .msg("user", "hi")
        .send(0)
        .recv()
        .send(0)
        .recv()
        .send(0)
        .recv();
    let run = wat::run(&host, &guest.build(), &mcp_task("llm", &[])).await;
    assert!(run.outcome.success(), "{:?}", run.outcome.failure);
    for i in 0..2 {
        let response: Value = serde_json::from_str(&run.emitted[i]).unwrap();
        assert_eq!(
            response["error"]["code"], "llm_response_too_large",
            "{response}"
        );
        assert!(
            response["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!(
                    "larger than {} bytes",
                    quiver::defaults::LLM_MAX_RESPONSE_BYTES
                )),
            "{response}"
        );
    }
    let last: Value = serde_json::from_str(&run.emitted[2]).unwrap();
    assert_eq!(
        last["choices"][0]["message"]["content"], "fine again",
        "{last}"
    );
    assert_eq!(llm.request_count(), 3, "an oversized answer is not retried");
}

/// A server answering `resources/read` with 8 MiB: the guest gets a small
/// `mcp_output_too_large` error object, not a cut document, and the fd keeps working.
#[tokio::test]
async fn a_giant_resource_is_a_bounded_error_and_the_session_goes_on() {
    let registry = RegistryDir::new();
    registry.write(
        "fixture.toml",
        &format!(
            "allowed_resources = [\"fixture://*\"]\n{}",
            quiver_tests::fixture_toml("fixture", &["echo"], "")
        ),
    );
    let host = host(&registry);
    let body = r#"(func $main (local $fd i32)
      (local.set $fd (call $mcp_open (i32.const 1024) (i32.const 7)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_read_resource (local.get $fd) (i32.const 1100) (i32.const 15) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192)))
      (call $cap (i32.const 8192) (i32.const 200000))
      (call $out (call $mcp_list_resources (local.get $fd) (i32.const 16384) (i32.const 8192)))
      (call $emit (i32.const 16384) (call $len (i32.const 8192))))"#;
    let guest = wat::guest(&[(1024, b"fixture"), (1100, b"fixture://giant")], body);
    let run = wat::run(&host, &guest, &mcp_task("giant", &["fixture"])).await;
    assert!(run.results[0] > 0, "{:?} {:?}", run.results, run.emitted);
    assert!(run.emitted[0].len() < 2000, "{}", run.emitted[0].len());
    let error: Value = serde_json::from_str(&run.emitted[0]).unwrap();
    assert_eq!(error["error"]["code"], "mcp_output_too_large", "{error}");
    let listed: Value = serde_json::from_str(&run.emitted[1]).unwrap();
    assert_eq!(listed["resources"][0]["uri"], "fixture://giant", "{listed}");
    host.shutdown().await;
}
