//! Chat sessions end to end through the real host: a C-level (WAT) guest, the scripted
//! OpenAI-wire HTTP server, and the fixture MCP server over stdio. Each test asserts what
//! the host sent upstream as well as what the guest got back.

use std::time::Duration;

use quiver::{Host, TaskFailure};
use quiver_tests::chat_wat::{
    ACCENTS, ChatGuest, ECHO_ARGS, NEEDS_ROOM, TRAP, WEATHER, scripted_host,
};
use quiver_tests::llm::{Reply, ScriptedLlm, Wire, roles, tool_names, tool_results};
use quiver_tests::wat::{self, WatRun};
use quiver_tests::{RegistryDir, call_tool_text, mcp_task};
use serde_json::{Value, json};

struct Setup {
    llm: ScriptedLlm,
    host: Host,
    _registry: RegistryDir,
}

async fn setup(script: Vec<Reply>) -> Setup {
    let llm = ScriptedLlm::start(script).await;
    let registry = RegistryDir::new();
    registry.fixture(
        "fixture",
        &["add", "echo", "count", "big", "slow", "image"],
        "",
    );
    let host = scripted_host(&registry, &llm);
    Setup {
        llm,
        host,
        _registry: registry,
    }
}

async fn run(setup: &Setup, guest: &ChatGuest) -> WatRun {
    wat::run_ok(&setup.host, &guest.build(), &mcp_task("chat", &["fixture"])).await
}

fn emitted_json(run: &WatRun, i: usize) -> Value {
    serde_json::from_str(&run.emitted[i]).unwrap_or_else(|e| panic!("{e}: {:?}", run.emitted))
}

/// A guest tool is found in the funcref table at each call (the host keeps the last one it
/// typed): a guest that points the tool's index at another function, or at none, between
/// sends gets that function called, or the call refused.
#[tokio::test]
async fn a_guest_tool_is_whatever_its_table_index_holds_at_the_call() {
    let setup = setup(vec![
        Reply::tool_call("t1", "get_weather", json!({})),
        Reply::text("one"),
        Reply::tool_call("t2", "get_weather", json!({"city": "Oslo"})),
        Reply::text("two"),
        Reply::tool_call("t3", "get_weather", json!({})),
        Reply::text("three"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "weather?")
        .tool(WEATHER, "get_weather")
        .arena()
        .send(2)
        .raw(&format!(
            "(table.set (i32.const {WEATHER}) (ref.func $echo_args))"
        ))
        .send(2)
        .raw(&format!(
            "(table.set (i32.const {WEATHER}) (ref.null func))"
        ))
        .send(2);
    let run = run(&setup, &guest).await;
    assert!(run.results.iter().all(|&r| r >= 0), "{:?}", run.results);
    let results = tool_results(&setup.llm.request(5));
    assert_eq!(results[0], ("t1".to_owned(), "Sunny, 21C".to_owned()));
    assert_eq!(
        results[1],
        ("t2".to_owned(), r#"{"city":"Oslo"}"#.to_owned()),
        "the function now at the index ran"
    );
    assert!(
        results[2].1.contains("no tool function at table index 1"),
        "{results:?}"
    );
}

#[tokio::test]
async fn a_guest_tool_and_an_mcp_tool_in_one_turn() {
    let setup = setup(vec![
        Reply::tool_calls([
            ("c1", "get_weather", json!({"city": "Paris"})),
            ("c2", "mcp__fixture__add", json!({"a": 2, "b": 3})),
        ]),
        Reply::text("Sunny, and 2+3 is 5."),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("system", "You are terse.")
        .msg("user", "Weather in Paris, and 2+3?")
        .tool(WEATHER, "get_weather")
        .arena()
        .param("model", json!("m-test"))
        .param("temperature", json!(0.25))
        .param("max_iterations", json!(4))
        .send(3)
        .recv()
        .metrics();
    let run = run(&setup, &guest).await;
    assert!(run.results.iter().all(|&r| r >= 0), "{:?}", run.results);

    let first = setup.llm.request(0);
    assert_eq!(first["model"], "m-test");
    assert_eq!(first["temperature"], 0.25, "other params are forwarded");
    for withheld in [
        "max_iterations",
        "tool_arena_ptr",
        "tool_arena_len",
        "backend",
    ] {
        assert!(
            first.get(withheld).is_none(),
            "{withheld} must not go upstream: {first}"
        );
    }
    let names = tool_names(&first);
    assert!(names.contains(&"get_weather".to_owned()), "{names:?}");
    let offered: Vec<&str> = names
        .iter()
        .filter(|n| n.starts_with("mcp__"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        offered,
        [
            "mcp__fixture__add",
            "mcp__fixture__big",
            "mcp__fixture__count",
            "mcp__fixture__echo",
            "mcp__fixture__image",
            "mcp__fixture__slow"
        ]
    );
    let add = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "mcp__fixture__add")
        .unwrap();
    assert_eq!(
        add["function"]["parameters"]["properties"]["a"]["type"], "number",
        "the MCP inputSchema is the parameters"
    );

    let second = setup.llm.request(1);
    assert_eq!(
        roles(&second),
        ["system", "user", "assistant", "tool", "tool"]
    );
    assert_eq!(second["messages"][2]["tool_calls"][0]["id"], "c1");
    assert_eq!(
        tool_results(&second),
        [
            ("c1".to_owned(), "Sunny, 21C".to_owned()),
            ("c2".to_owned(), "5".to_owned())
        ]
    );

    let response = emitted_json(&run, 0);
    assert_eq!(
        response["choices"][0]["message"]["content"],
        "Sunny, and 2+3 is 5."
    );
    let spear = &response["_spear"];
    assert_eq!(spear["backend"], "scripted");
    assert_eq!(spear["model"], "m-test");
    assert_eq!(spear["iterations"], 2);
    assert_eq!(spear["tool_call_count"], 2);
    assert_eq!(spear["tool_calls_ok"], 2);
    assert_eq!(
        spear["mcp"],
        json!({"servers": ["fixture"]}),
        "no decision log unasked"
    );
    // As written: `choices` first, then `_spear` opening with SPEAR's own keys, so a guest
    // printing the start of the body sees the answer and the backend.
    let raw = &run.emitted[0];
    let choices = raw.find(r#""choices""#).unwrap();
    let spear_at = raw.find(r#""_spear":{"backend":"scripted","model":"m-test","iterations":2,"#);
    assert!(spear_at.is_some_and(|at| choices < at), "{raw}");
    let kinds: Vec<&str> = spear["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["guest", "mcp"]);
    assert_eq!(spear["tool_calls"][1]["server_id"], "fixture");
    // Each call's summary, keys in this order.
    let mcp_call = r#"{"id":"c2","name":"mcp__fixture__add","kind":"mcp","server_id":"fixture","tool":"add","ms":"#;
    let at = raw.find(mcp_call).unwrap_or_else(|| panic!("{raw}"));
    assert!(
        raw[at..]
            .split_once('}')
            .unwrap()
            .0
            .ends_with(r#","ok":true"#),
        "{raw}"
    );
    assert_eq!(
        spear["usage"]["prompt_tokens"],
        20 + 50,
        "usage is summed over both requests"
    );
    let metrics = emitted_json(&run, 1);
    assert_eq!(metrics["iterations"], 2);
    assert_eq!(metrics["llm_requests"], 2);
    assert_eq!(metrics["tool_calls"]["guest"], 1);
    assert_eq!(metrics["tool_calls"]["mcp"], 1);
    assert_eq!(metrics["total_tokens"], 70 + 10);
}

#[tokio::test]
async fn unknown_and_policy_denied_tools_run_nothing() {
    let setup = setup(vec![
        Reply::tool_calls([
            ("u1", "no_such_tool", json!({})),
            (
                "d1",
                "mcp.fixture.delete_file",
                json!({"path": "/etc/passwd"}),
            ),
            ("d2", "mcp__fixture__crash", json!({})),
            ("a1", "mcp.fixture.add", json!({"a": 1, "b": 1})),
        ]),
        Reply::text("done"),
    ])
    .await;
    let run = run(&setup, &ChatGuest::new().msg("user", "go").send(2).recv()).await;
    let results = tool_results(&setup.llm.request(1));
    let code =
        |i: usize| serde_json::from_str::<Value>(&results[i].1).unwrap()["error"]["code"].clone();
    assert_eq!(code(0), "unknown_tool");
    assert_eq!(code(1), "mcp_policy_denied");
    assert_eq!(code(2), "mcp_policy_denied");
    assert_eq!(
        results[3],
        ("a1".to_owned(), "2".to_owned()),
        "the dotted form of an offered tool works"
    );
    let response = emitted_json(&run, 0);
    let kinds: Vec<&str> = response["_spear"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["unknown", "denied", "denied", "mcp"]);
    assert!(
        run.emitted[0].contains(r#"{"id":"u1","name":"no_such_tool","kind":"unknown","ok":false}"#),
        "a refused call's summary: {}",
        run.emitted[0]
    );
    // The server saw exactly one call (add) before this one.
    let count = call_tool_text(&setup.host, "fixture", "count", json!({}))
        .await
        .unwrap();
    assert_eq!(count, "2");
    setup.host.shutdown().await;
}

#[tokio::test]
async fn budgets_end_the_loop_with_tool_call_limit() {
    let weather = || Reply::tool_calls([("w", "get_weather", json!({"city": "Oslo"}))]);
    let setup = setup(vec![weather(), weather(), weather()]).await;
    let guest = ChatGuest::new()
        .msg("user", "loop")
        .tool(WEATHER, "get_weather")
        .arena()
        .param("max_iterations", json!(2))
        .send(2)
        .recv();
    let run = run(&setup, &guest).await;
    let response = emitted_json(&run, 0);
    assert_eq!(response["error"]["code"], "tool_call_limit");
    assert_eq!(response["error"]["limit"], "max_iterations");
    assert!(response["last_response"]["choices"].is_array());
    // The last answer's `choices` come before `_spear` on error bodies too.
    let raw = &run.emitted[0];
    let choices = raw.find(r#""choices""#).unwrap();
    let spear = raw.find(r#""_spear":{"backend":"scripted","model":"scripted-default","#);
    assert!(spear.is_some_and(|at| choices < at), "{raw}");
    assert_eq!(
        setup.llm.request_count(),
        2,
        "no request beyond max_iterations"
    );

    let setup = self::setup(vec![Reply::tool_calls([
        ("a", "get_weather", json!({})),
        ("b", "get_weather", json!({})),
    ])])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "two")
        .tool(WEATHER, "get_weather")
        .arena()
        .param("max_tool_calls", json!(1))
        .send(2)
        .recv()
        .metrics();
    let run = self::run(&setup, &guest).await;
    let response = emitted_json(&run, 0);
    assert_eq!(response["error"]["limit"], "max_total_tool_calls");
    assert_eq!(
        emitted_json(&run, 1)["tool_calls"]["guest"],
        0,
        "no call of the over-budget turn ran"
    );
}

#[tokio::test]
async fn upstream_failures_are_retried_or_reported_never_hung() {
    let setup = setup(vec![
        Reply::status(500, "overloaded"),
        Reply::rate_limited("0"),
        Reply::text("fine"),
    ])
    .await;
    let run = run(
        &setup,
        &ChatGuest::new().msg("user", "hi").send(0).recv().metrics(),
    )
    .await;
    assert_eq!(
        emitted_json(&run, 0)["choices"][0]["message"]["content"],
        "fine"
    );
    let metrics = emitted_json(&run, 1);
    assert_eq!(metrics["llm_retries"], 2);
    assert_eq!(metrics["llm_requests"], 3);

    let setup = self::setup(vec![Reply::Garbage("<html>not json</html>".into())]).await;
    let run = self::run(
        &setup,
        &ChatGuest::new().msg("user", "hi").send(0).recv().metrics(),
    )
    .await;
    let invalid_because = |response: Value, why: &str| {
        assert_eq!(
            response["error"]["code"], "llm_invalid_response",
            "{response}"
        );
        let message = response["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{response}");
    };
    invalid_because(emitted_json(&run, 0), "not json");
    assert_eq!(emitted_json(&run, 1)["llm_errors"], 1);

    // serde_json would read the string as the JSON it holds: structure no bound counted.
    let hidden = Reply::Json(json!({
        "id": "chatcmpl-hidden",
        "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "pad": {"$serde_json::private::RawValue": "[{}, {}, {}]"},
    }));
    let setup = self::setup(vec![hidden]).await;
    let run = self::run(&setup, &ChatGuest::new().msg("user", "hi").send(0).recv()).await;
    invalid_because(emitted_json(&run, 0), "reserved");

    let setup = self::setup(vec![Reply::error(400, "bad model"), Reply::text("unused")]).await;
    let run = self::run(&setup, &ChatGuest::new().msg("user", "hi").send(0).recv()).await;
    let response = emitted_json(&run, 0);
    assert_eq!(response["error"]["code"], "llm_http_error");
    assert_eq!(response["error"]["status"], 400);
    assert_eq!(setup.llm.request_count(), 1, "a 400 is not retried");
}

/// A session's `timeout_ms` bounds each request and its whole answer: a model that does
/// not answer in time, or whose body never ends, is `llm_timeout`, not a hung task, and it
/// is not retried.
#[tokio::test]
async fn a_model_slower_than_timeout_ms_is_llm_timeout() {
    let no_answer = Reply::delayed(Duration::from_secs(30), Reply::text("too late"));
    for (case, reply) in [("no answer", no_answer), ("endless body", Reply::Stalled)] {
        let setup = setup(vec![reply, Reply::text("not asked")]).await;
        let started = std::time::Instant::now();
        let guest = ChatGuest::new()
            .msg("user", "hi")
            .param("timeout_ms", json!(300))
            .send(0)
            .recv()
            .metrics();
        let run = run(&setup, &guest).await;
        let response = emitted_json(&run, 0);
        assert_eq!(
            response["error"]["code"], "llm_timeout",
            "{case}: {response}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{case}");
        assert_eq!(emitted_json(&run, 1)["llm_errors"], 1, "{case}");
        assert_eq!(
            setup.llm.request_count(),
            1,
            "{case}: a timeout is not retried"
        );
    }
}

#[tokio::test]
async fn long_tool_output_is_cut_at_a_utf8_boundary_with_a_marker() {
    let setup = setup(vec![
        Reply::tool_calls([("t", "accents", json!({}))]),
        Reply::text("ok"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "x")
        .tool(ACCENTS, "accents")
        .arena()
        .param("max_tool_output_bytes", json!(101))
        .send(2)
        .recv();
    run(&setup, &guest).await;
    let (_, content) = &tool_results(&setup.llm.request(1))[0];
    assert!(content.len() <= 101, "{} bytes", content.len());
    assert!(
        content.starts_with("éé") && content.contains("[truncated: output was 300 bytes"),
        "{content}"
    );
}

#[tokio::test]
async fn guest_tools_get_their_arguments_and_one_enospc_retry() {
    let setup = setup(vec![
        Reply::tool_calls([
            ("e", "echo_args", json!({"city": "Zürich"})),
            ("n", "needs_room", json!({})),
        ]),
        Reply::text("ok"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "x")
        .tool(ECHO_ARGS, "echo_args")
        .tool(NEEDS_ROOM, "needs_room")
        .arena()
        .param("max_tool_output_bytes", json!(90))
        .send(2)
        .recv();
    run(&setup, &guest).await;
    let results = tool_results(&setup.llm.request(1));
    assert_eq!(
        serde_json::from_str::<Value>(&results[0].1).unwrap(),
        json!({"city": "Zürich"})
    );
    // The first attempt offered 90 bytes; the tool asked for 100 with ENOSPC and got them on
    // the retry; the model then sees the cut version.
    let shown = &results[1].1;
    assert!(
        shown.starts_with("xxxx") && shown.contains("output was 100 bytes"),
        "{shown}"
    );
    assert!(shown.len() <= 90);
}

#[tokio::test]
async fn a_session_goes_on_for_a_second_turn() {
    let setup = setup(vec![
        Reply::text("first answer"),
        Reply::text("second answer"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "one")
        .send(2)
        .recv()
        .msg("user", "two")
        .send(2)
        .recv();
    let run = run(&setup, &guest).await;
    assert_eq!(
        emitted_json(&run, 1)["choices"][0]["message"]["content"],
        "second answer"
    );
    let second = setup.llm.request(1);
    assert_eq!(roles(&second), ["user", "assistant", "user"]);
    assert_eq!(second["messages"][1]["content"], "first answer");
}

/// Each send offers the server's tools from the pool's listing while it is fresh (no
/// `tools/list` per send), and lists again once the server says its tools changed.
#[tokio::test]
async fn sends_reuse_the_listing_until_the_server_says_its_tools_changed() {
    let llm = ScriptedLlm::start(vec![Reply::text("a"), Reply::text("b"), Reply::text("c")]).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["add", "list_count", "tools_changed"], "");
    let host = scripted_host(&registry, &llm);
    let guest = ChatGuest::new().msg("user", "one").send(2).recv().build();
    let task = mcp_task("chat", &["fixture"]);
    let fixture = |tool: &'static str| call_tool_text(&host, "fixture", tool, json!({}));
    wat::run_ok(&host, &guest, &task).await;
    wat::run_ok(&host, &guest, &task).await;
    assert_eq!(
        fixture("list_count").await.unwrap(),
        "1",
        "the second task's send used the cached listing"
    );
    assert_eq!(fixture("tools_changed").await.unwrap(), "ok");
    // The notification travels on its own; give the client a moment to handle it.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    wat::run_ok(&host, &guest, &task).await;
    assert_eq!(
        fixture("list_count").await.unwrap(),
        "2",
        "list_changed made the next send list again"
    );
    for i in 0..3 {
        assert!(
            tool_names(&llm.request(i)).contains(&"mcp__fixture__add".to_owned()),
            "send {i} offered the server's tools: {:?}",
            tool_names(&llm.request(i))
        );
    }
    host.shutdown().await;
}

#[tokio::test]
async fn the_manual_loop_shows_tool_calls_and_takes_the_guests_results() {
    let setup = setup(vec![
        Reply::tool_calls([("m1", "get_weather", json!({"city": "Rome"}))]),
        Reply::text("Rome is sunny"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "Rome?")
        .tool(WEATHER, "get_weather")
        .send(0)
        .recv()
        .add_message(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "m1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]}))
        .add_message(json!({"role": "tool", "tool_call_id": "m1", "content": "Sunny in Rome"}))
        .send(0)
        .recv();
    let run = run(&setup, &guest).await;
    let first = emitted_json(&run, 0);
    assert_eq!(
        first["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        first["_spear"]["tool_calls"],
        json!([]),
        "nothing ran on the host"
    );
    assert_eq!(
        tool_results(&setup.llm.request(1)),
        [("m1".to_owned(), "Sunny in Rome".to_owned())]
    );
    assert_eq!(
        emitted_json(&run, 1)["choices"][0]["message"]["content"],
        "Rome is sunny"
    );
}

#[tokio::test]
async fn hostile_chat_calls_get_errnos() {
    let setup = setup(vec![]).await;
    let guest = ChatGuest::new()
        .msg("wizard", "x")
        .param("stream", json!(true))
        .param("mcp.server_ids", json!(["elsewhere"]))
        .param("mcp.task_tool_allowlist", json!(["*"]))
        .param("max_iterations", json!("many"))
        .ctl_in(1, b"{not json")
        .ctl_in(9, b"{}")
        .tool(7, "empty_slot")
        .tool(0, "slot_zero")
        .tool(WEATHER, "mcp__fixture__sneaky")
        .add_message(json!({"content": "no role"}))
        .raw("(call $out (call $cchat_send (i32.const 999) (i32.const 2)))")
        .raw("(call $out (call $cchat_send (local.get $s) (i32.const 8)))")
        .raw("(call $out (call $cchat_recv (local.get $s) (i32.const 16384) (i32.const 8192)))")
        .raw("(call $out (call $cchat_close (local.get $s))) (call $out (call $cchat_close (local.get $s)))");
    let run = run(&setup, &guest).await;
    let r = &run.results[1..];
    assert_eq!(
        r,
        [
            -22, -22, -13, -13, -22, -5, -22, -22, -22, -22, -22, -9, -22, -9, 0, -9
        ]
    );
    assert_eq!(setup.llm.request_count(), 0);
}

#[tokio::test]
async fn a_trapping_guest_tool_ends_the_task_cleanly() {
    let setup = setup(vec![
        Reply::tool_calls([("t", "trap", json!({}))]),
        Reply::text("unused"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "x")
        .tool(TRAP, "trap")
        .arena()
        .send(2);
    let run = wat::run(&setup.host, &guest.build(), &mcp_task("trap", &["fixture"])).await;
    assert!(
        matches!(run.outcome.failure, Some(TaskFailure::Trap(_))),
        "{:?}",
        run.outcome.failure
    );
    assert_eq!(setup.llm.request_count(), 1);
}

#[tokio::test]
async fn a_guest_tool_without_an_arena_is_reported_to_the_model() {
    let setup = setup(vec![
        Reply::tool_calls([("w", "get_weather", json!({}))]),
        Reply::text("ok"),
    ])
    .await;
    run(
        &setup,
        &ChatGuest::new()
            .msg("user", "x")
            .tool(WEATHER, "get_weather")
            .send(2)
            .recv(),
    )
    .await;
    let (_, content) = &tool_results(&setup.llm.request(1))[0];
    let error: Value = serde_json::from_str(content).unwrap();
    assert_eq!(error["error"]["code"], "tool_exec_failed");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tool_arena_ptr")
    );
}

#[tokio::test]
async fn mcp_calls_of_one_turn_run_concurrently_and_images_become_notes() {
    let setup = setup(vec![
        Reply::tool_calls([
            ("s1", "mcp__fixture__slow", json!({"ms": 600})),
            ("s2", "mcp__fixture__slow", json!({"ms": 600})),
            ("i", "mcp__fixture__image", json!({})),
        ]),
        Reply::text("ok"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "x")
        .param(
            "tool_choice",
            json!({"type": "function", "function": {"name": "mcp__fixture__slow"}}),
        )
        .send(2)
        .recv()
        .metrics();
    let run = run(&setup, &guest).await;
    assert_eq!(
        setup.llm.request(0)["tool_choice"],
        json!({"type": "function", "function": {"name": "mcp__fixture__slow"}}),
        "tool_choice goes upstream unchanged"
    );
    let metrics = emitted_json(&run, 1);
    let tools_ms = metrics["latency_ms"]["tools"].as_u64().unwrap();
    assert!(
        (600..1100).contains(&tools_ms),
        "two 600 ms calls took {tools_ms} ms together"
    );
    let results = tool_results(&setup.llm.request(1));
    assert_eq!(results[0].1, "slept 600ms");
    assert_eq!(results[2].1, "a 1x1 red pixel\n[image: image/png, 69 B]");
}

/// A host whose registry holds the fixture server under `server_id` with `top` (top-level
/// TOML keys) before its tables.
fn registry_with(server_id: &str, allowed: &[&str], top: &str) -> RegistryDir {
    let registry = RegistryDir::new();
    registry.write(
        &format!("{server_id}.toml"),
        &format!(
            "{top}\n{}",
            quiver_tests::fixture_toml(server_id, allowed, "")
        ),
    );
    registry
}

#[tokio::test]
async fn tool_namespace_names_offered_tools_and_forced_choices_map_to_them() {
    let llm = ScriptedLlm::start(vec![
        Reply::tool_calls([
            ("n1", "acme__fx__add", json!({"a": 2, "b": 3})),
            ("n2", "acme.fx.add", json!({"a": 1, "b": 1})),
            ("n3", "mcp.fixture.add", json!({"a": 4, "b": 4})),
            ("n4", "mcp__fixture__add", json!({"a": 0, "b": 0})),
        ]),
        Reply::text("done"),
    ])
    .await;
    let registry = registry_with("fixture", &["add", "echo"], "tool_namespace = \"acme.fx\"");
    let host = scripted_host(&registry, &llm);
    let guest = ChatGuest::new()
        .param(
            "tool_choice",
            json!({"type": "function", "function": {"name": "mcp.fixture.add"}}),
        )
        .msg("user", "go")
        .send(2)
        .recv();
    let run = wat::run(&host, &guest.build(), &mcp_task("chat", &["fixture"])).await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    let first = llm.request(0);
    assert_eq!(tool_names(&first), ["acme__fx__add", "acme__fx__echo"]);
    assert_eq!(
        first["tool_choice"],
        json!({"type": "function", "function": {"name": "acme__fx__add"}}),
        "a forced choice naming the mcp.<server>.<tool> form goes upstream as the offered name"
    );
    let results = tool_results(&llm.request(1));
    let texts: Vec<&str> = results.iter().map(|(_, text)| text.as_str()).collect();
    assert_eq!(
        texts,
        ["5", "2", "8", "0"],
        "every way of naming the tool runs it"
    );
    host.shutdown().await;

    for top in [
        "tool_namespace = \"acme fx\"",
        // Another server's default namespace, or any other `mcp` name, would let this
        // server's tools answer to `mcp__fs__<tool>`.
        "tool_namespace = \"mcp.fs\"",
        "tool_namespace = \"mcp__fs\"",
    ] {
        let bad = registry_with("fixture", &["add"], top);
        let loaded = quiver::registry::Registry::load_dir(bad.path()).unwrap();
        let problem = loaded
            .problems()
            .first()
            .expect("a bad namespace is reported");
        assert_eq!(
            problem.field.as_deref(),
            Some("tool_namespace"),
            "{problem}"
        );
        assert!(loaded.get("fixture").is_none(), "{top}");
    }
    let shared = registry_with("aaa", &["add"], "tool_namespace = \"acme\"");
    shared.write(
        "bbb.toml",
        &format!(
            "tool_namespace = \"acme\"\n{}",
            quiver_tests::fixture_toml("bbb", &["add"], "")
        ),
    );
    let loaded = quiver::registry::Registry::load_dir(shared.path()).unwrap();
    assert!(loaded.get("aaa").is_some() && loaded.get("bbb").is_none());
    let problem = &loaded.problems()[0];
    assert!(
        problem.path.ends_with("bbb.toml") && problem.message.contains("`aaa`"),
        "{problem}"
    );
}

#[tokio::test]
async fn tools_that_need_approval_are_never_offered_and_never_run() {
    let llm = ScriptedLlm::start(vec![
        Reply::tool_calls([("p1", "mcp__fixture__count", json!({}))]),
        Reply::text("done"),
    ])
    .await;
    let registry = registry_with("fixture", &["add", "count"], "approval_policy = \"always\"");
    let host = scripted_host(&registry, &llm);
    let guest = ChatGuest::new()
        .param("mcp.decision_log", json!(true))
        .msg("user", "go")
        .send(2)
        .recv();
    let run = wat::run(&host, &guest.build(), &mcp_task("chat", &["fixture"])).await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    assert!(
        tool_names(&llm.request(0)).is_empty(),
        "tools needing approval were offered to the model"
    );
    let results = tool_results(&llm.request(1));
    let error: Value = serde_json::from_str(&results[0].1).unwrap();
    assert_eq!(error["error"]["code"], "mcp_policy_denied");
    let response = emitted_json(&run, 0);
    let gated: Vec<&str> = response["_spear"]["mcp"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["reason"] == "approval_required")
        .map(|d| d["tool"].as_str().unwrap())
        .collect();
    assert_eq!(gated, ["add", "count"]);
    let mcp = &response["_spear"]["mcp"];
    let keys: Vec<&String> = mcp.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["servers", "decisions", "decisions_omitted"]);
    assert_eq!(mcp["decisions_omitted"], 0);
    // Nothing reached the server: its call counter is still at zero. Library calls wait
    // for approval too, so the record drops it first (a change that keeps the connection).
    registry.write(
        "fixture.toml",
        &quiver_tests::fixture_toml("fixture", &["add", "count"], ""),
    );
    host.reload_registry().unwrap();
    let count = call_tool_text(&host, "fixture", "count", json!({}))
        .await
        .unwrap();
    assert_eq!(count, "1");
    host.shutdown().await;
}

#[tokio::test]
async fn unknown_upstream_fields_reach_the_guest_and_the_next_request_unchanged() {
    let assistant = json!({
        "role": "assistant",
        "content": null,
        "refusal": null,
        "vendor_reasoning": {"steps": ["look up", "add"], "budget": 0.5},
        "tool_calls": [{
            "id": "v1", "type": "function", "index": 0, "vendor_call_meta": true,
            "function": {"name": "mcp__fixture__add", "arguments": "{\"a\":1,\"b\":2}", "strict": false}
        }]
    });
    let upstream = |message: Value, finish: &str| {
        json!({
            "id": "chatcmpl-vendor",
            "object": "chat.completion",
            "created": 1_700_000_000u64,
            "model": "vendor-model",
            "system_fingerprint": "fp_abc123",
            "service_tier": null,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": {"content": [{"token": "x", "logprob": -0.125, "bytes": [120]}]},
                "finish_reason": finish,
            }],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                      "completion_tokens_details": {"reasoning_tokens": 2}},
        })
    };
    let last_message =
        json!({"role": "assistant", "content": "3", "annotations": [], "audio": null});
    let last = upstream(last_message.clone(), "stop");
    let setup = setup(vec![
        Reply::Json(upstream(assistant.clone(), "tool_calls")),
        Reply::Json(last.clone()),
        Reply::text("bye"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "1+2?")
        .send(2)
        .recv()
        .msg("user", "thanks")
        .send(2);
    let run = run(&setup, &guest).await;

    let second = setup.llm.request(1);
    assert_eq!(
        second["messages"][1], assistant,
        "the assistant message goes back upstream as it came"
    );
    assert_eq!(tool_results(&second), [("v1".to_owned(), "3".to_owned())]);

    let mut response = emitted_json(&run, 0);
    let spear = response
        .as_object_mut()
        .unwrap()
        .remove("_spear")
        .expect("_spear");
    assert_eq!(spear["iterations"], 2);
    assert_eq!(spear["usage"]["total_tokens"], 20);
    assert_eq!(
        response, last,
        "the guest sees the upstream JSON, plus _spear"
    );
    assert_eq!(
        setup.llm.request(2)["messages"][3],
        last_message,
        "the final message is kept in the session as it came"
    );
}

#[tokio::test]
async fn hostile_completions_are_invalid_responses_and_usage_saturates() {
    let tool_call = |call: Value| json!({"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]});
    for (body, needle) in [
        (json!({"id": "x"}), "choices"),
        (json!({"choices": "none"}), "choices"),
        (json!({"choices": []}), "no choices[0].message"),
        (
            json!({"choices": [{"message": null}]}),
            "choices[0].message",
        ),
        (
            tool_call(json!({"id": "n", "function": {"name": 42, "arguments": "{}"}})),
            "function.name",
        ),
        (tool_call(json!({"id": "n"})), "function"),
    ] {
        let setup = setup(vec![Reply::Json(body.clone())]).await;
        let run = run(&setup, &ChatGuest::new().msg("user", "x").send(2).recv()).await;
        let response = emitted_json(&run, 0);
        assert_eq!(response["error"]["code"], "llm_invalid_response", "{body}");
        let message = response["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }

    // A call without an id gets one; counts that cannot be counted are passed on uncounted;
    // huge counts saturate.
    let huge = json!({"prompt_tokens": u64::MAX, "completion_tokens": -3, "total_tokens": 1e300});
    let setup = setup(vec![
        Reply::Json(json!({
            "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                {"type": "function", "function": {"name": "mcp__fixture__add", "arguments": {"a": 2, "b": 2}}}
            ]}}],
            "usage": huge,
        })),
        Reply::Json(json!({"choices": [{"message": {"role": "assistant", "content": "4"}}], "usage": huge})),
    ])
    .await;
    let run = run(
        &setup,
        &ChatGuest::new().msg("user", "x").send(2).recv().metrics(),
    )
    .await;
    assert_eq!(
        tool_results(&setup.llm.request(1)),
        [("call_0".to_owned(), "4".to_owned())],
        "an object for arguments is accepted; a missing id becomes call_<index>"
    );
    let response = emitted_json(&run, 0);
    assert_eq!(response["usage"], huge, "the guest sees usage as it came");
    let metrics = emitted_json(&run, 1);
    assert_eq!(metrics["prompt_tokens"], u64::MAX);
    assert_eq!(metrics["completion_tokens"], 0);
    assert_eq!(metrics["total_tokens"], 0);
}

#[tokio::test]
async fn a_tool_result_marked_is_error_counts_as_a_failed_call() {
    let llm = ScriptedLlm::start(vec![
        Reply::tool_calls([(
            "e1",
            "mcp__fixture__read_text",
            json!({"path": "/nonexistent/file"}),
        )]),
        Reply::text("done"),
    ])
    .await;
    let registry = registry_with("fixture", &["read_text"], "");
    let host = scripted_host(&registry, &llm);
    let guest = ChatGuest::new().msg("user", "go").send(2).recv().metrics();
    let run = wat::run(&host, &guest.build(), &mcp_task("chat", &["fixture"])).await;
    assert!(run.outcome.failure.is_none(), "{:?}", run.outcome.failure);
    let results = tool_results(&llm.request(1));
    let error: Value = serde_json::from_str(&results[0].1).unwrap();
    assert_eq!(error["error"]["code"], "tool_exec_failed");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/file")
    );
    let summary = &emitted_json(&run, 0)["_spear"]["tool_calls"][0];
    assert_eq!(summary["ok"], false, "{summary}");
    assert_eq!(summary["error"], "tool_exec_failed", "{summary}");
    assert_eq!(emitted_json(&run, 1)["tool_calls"]["failed"], 1);
    host.shutdown().await;
}

/// The fixture server's `image` tool's picture.
const RED_PIXEL_PNG_BASE64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

async fn anthropic_setup(script: Vec<Reply>) -> Setup {
    let llm = ScriptedLlm::start_anthropic(script).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "image"], "");
    let host = scripted_host(&registry, &llm);
    Setup {
        llm,
        host,
        _registry: registry,
    }
}

#[tokio::test]
async fn an_anthropic_backend_round_trips_a_plain_chat() {
    let setup = anthropic_setup(vec![Reply::text("bonjour")]).await;
    let guest = ChatGuest::new()
        .msg("system", "be brief")
        .msg("user", "hi")
        .send(0)
        .recv();
    let run = run(&setup, &guest).await;
    let response = emitted_json(&run, 0);
    assert_eq!(response["choices"][0]["message"]["content"], "bonjour");
    assert_eq!(response["choices"][0]["finish_reason"], "stop");
    assert_eq!(response["usage"]["prompt_tokens"], 10, "{response}");
    assert_eq!(response["usage"]["total_tokens"], 15);
    assert_eq!(response["_spear"]["backend"], "scripted");

    let recorded = &setup.llm.recorded()[0];
    assert_eq!(recorded.path, "/v1/messages");
    assert_eq!(recorded.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(recorded.body["system"], "be brief");
    assert_eq!(recorded.body["max_tokens"], 4096);
    assert_eq!(recorded.body["model"], "scripted-default");
    assert_eq!(roles(&recorded.body), ["user"]);
}

#[tokio::test]
async fn an_mcp_image_reaches_an_anthropic_model_as_an_image_and_openai_as_a_note() {
    let script = || {
        vec![
            Reply::tool_calls([
                ("e", "mcp__fixture__echo", json!({"text": "hey"})),
                ("i", "mcp__fixture__image", json!({})),
            ]),
            Reply::text("a red pixel"),
        ]
    };
    let guest = ChatGuest::new().msg("user", "look").send(2).recv();

    let setup = anthropic_setup(script()).await;
    let run = run(&setup, &guest).await;
    let response = emitted_json(&run, 0);
    assert_eq!(
        response["choices"][0]["message"]["content"], "a red pixel",
        "{response}"
    );
    let second = setup.llm.request(1);
    assert_eq!(roles(&second), ["user", "assistant", "user"]);
    assert_eq!(second["messages"][1]["content"][1]["type"], "tool_use");
    assert_eq!(second["messages"][1]["content"][1]["input"], json!({}));
    let results = second["messages"][2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2, "both results in one user turn: {second}");
    assert_eq!(results[0]["tool_use_id"], "e");
    assert_eq!(results[0]["content"][0]["text"], "hey");
    assert_eq!(results[1]["type"], "tool_result");
    assert_eq!(results[1]["tool_use_id"], "i");
    let image = &results[1]["content"][1];
    assert_eq!(image["type"], "image");
    assert_eq!(image["source"]["type"], "base64");
    assert_eq!(image["source"]["media_type"], "image/png");
    assert_eq!(image["source"]["data"], RED_PIXEL_PNG_BASE64);

    let llm = ScriptedLlm::start(script()).await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "image"], "");
    let openai = Setup {
        host: scripted_host(&registry, &llm),
        llm,
        _registry: registry,
    };
    self::run(&openai, &guest).await;
    let second = openai.llm.request(1);
    assert_eq!(
        tool_results(&second)[1].1,
        "a 1x1 red pixel\n[image: image/png, 69 B]"
    );
    assert!(
        !second.to_string().contains(RED_PIXEL_PNG_BASE64),
        "no image data goes over the OpenAI wire: {second}"
    );
}

#[tokio::test]
async fn anthropic_errors_are_retried_or_reported() {
    let setup = anthropic_setup(vec![
        Reply::anthropic_error(529, "Overloaded"),
        Reply::text("fine"),
    ])
    .await;
    let run = run(
        &setup,
        &ChatGuest::new().msg("user", "hi").send(0).recv().metrics(),
    )
    .await;
    assert_eq!(
        emitted_json(&run, 0)["choices"][0]["message"]["content"],
        "fine"
    );
    assert_eq!(emitted_json(&run, 1)["llm_retries"], 1);

    let setup = anthropic_setup(vec![
        Reply::anthropic_error(400, "max_tokens: too large"),
        Reply::text("unused"),
    ])
    .await;
    let run = self::run(&setup, &ChatGuest::new().msg("user", "hi").send(0).recv()).await;
    let error = &emitted_json(&run, 0)["error"];
    assert_eq!(error["code"], "llm_http_error");
    assert_eq!(error["status"], 400);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("invalid_request_error") && message.contains("max_tokens: too large"),
        "{message}"
    );
    assert_eq!(setup.llm.request_count(), 1, "a 400 is not retried");

    for bad in [
        Reply::Garbage("<html>not json</html>".into()),
        Reply::Json(json!({"type": "message", "content": "not blocks"})),
    ] {
        let setup = anthropic_setup(vec![bad]).await;
        let run = self::run(&setup, &ChatGuest::new().msg("user", "hi").send(0).recv()).await;
        let response = emitted_json(&run, 0);
        assert_eq!(
            response["error"]["code"], "llm_invalid_response",
            "{response}"
        );
    }
}

/// The `(tool_use_id, text)` of the `tool_result` blocks of an Anthropic request's turn `i`.
fn anthropic_results(request: &Value, i: usize) -> Vec<(String, String)> {
    request["messages"][i]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .map(|b| {
            let text = b["content"][0]["text"].as_str().unwrap_or_default();
            (
                b["tool_use_id"].as_str().unwrap().to_owned(),
                text.to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn anthropic_sessions_survive_empty_answers_and_empty_results() {
    // The API may answer `content: []`, a tool may return "", a guest may write " ": none
    // may reach the API as an empty turn or text block, or every later request fails.
    let setup = anthropic_setup(vec![
        Reply::anthropic_message(json!([]), "end_turn"),
        Reply::tool_call("e", "mcp__fixture__echo", json!({"text": ""})),
        Reply::text("done"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "hi")
        .send(0)
        .recv()
        .msg("user", " ")
        .msg("user", "again")
        .send(2)
        .recv();
    let run = run(&setup, &guest).await;
    assert_eq!(
        emitted_json(&run, 0)["choices"][0]["message"]["content"],
        ""
    );
    let response = emitted_json(&run, 1);
    assert_eq!(
        response["choices"][0]["message"]["content"], "done",
        "{response}"
    );
    let second = setup.llm.request(1);
    assert_eq!(
        second["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}]}]),
        "the empty answer is left out and the user turns around it merged"
    );
    let third = setup.llm.request(2);
    assert_eq!(
        third["messages"][2]["content"],
        json!([{"type": "tool_result", "tool_use_id": "e"}]),
        "an empty result is sent without content"
    );
}

#[tokio::test]
async fn anthropic_tool_use_ids_are_made_unique_and_each_answered() {
    let echo = |id: Option<&str>, text: &str| {
        let mut block =
            json!({"type": "tool_use", "name": "mcp__fixture__echo", "input": {"text": text}});
        if let Some(id) = id {
            block["id"] = json!(id);
        }
        block
    };
    let setup = anthropic_setup(vec![
        Reply::anthropic_message(
            json!([echo(Some("x"), "a"), echo(Some("x"), "b"), echo(None, "c")]),
            "tool_use",
        ),
        Reply::text("ok"),
    ])
    .await;
    let run = run(&setup, &ChatGuest::new().msg("user", "go").send(2).recv()).await;
    let response = emitted_json(&run, 0);
    assert_eq!(
        response["choices"][0]["message"]["content"], "ok",
        "{response}"
    );
    let second = setup.llm.request(1);
    let uses: Vec<&Value> = second["messages"][1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["id"])
        .collect();
    assert_eq!(uses, ["x", "toolu_quiver_0", "toolu_quiver_1"]);
    assert_eq!(
        anthropic_results(&second, 2),
        [
            ("x".to_owned(), "a".to_owned()),
            ("toolu_quiver_0".to_owned(), "b".to_owned()),
            ("toolu_quiver_1".to_owned(), "c".to_owned())
        ]
    );
    let ids: Vec<&Value> = response["_spear"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    assert_eq!(ids, ["x", "toolu_quiver_0", "toolu_quiver_1"]);
}

#[tokio::test]
async fn images_count_toward_max_tool_output_bytes() {
    let note = "a 1x1 red pixel\n[image: image/png, 69 B]";
    let fits = note.len() + RED_PIXEL_PNG_BASE64.len();
    for (max, image) in [(fits, true), (fits - 1, false)] {
        let setup = anthropic_setup(vec![
            Reply::tool_call("i", "mcp__fixture__image", json!({})),
            Reply::text("seen"),
        ])
        .await;
        let guest = ChatGuest::new()
            .msg("user", "look")
            .param("max_tool_output_bytes", json!(max))
            .send(2)
            .recv();
        run(&setup, &guest).await;
        let result = &setup.llm.request(1)["messages"][2]["content"][0]["content"];
        assert_eq!(result[0]["text"], note);
        assert_eq!(
            result[1]["type"] == "image",
            image,
            "max_tool_output_bytes {max}: {result}"
        );
    }
}

#[tokio::test]
async fn tool_calls_cut_off_by_max_tokens_are_not_run() {
    let anthropic = Reply::anthropic_message(
        json!([{"type": "tool_use", "id": "w", "name": "get_weather", "input": {"city": "Os"}}]),
        "max_tokens",
    );
    let openai = Reply::Json(
        json!({"choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "w", "type": "function", "function": {"name": "get_weather", "arguments": "{\"ci"}}],
        }}]}),
    );
    let guest = ChatGuest::new()
        .msg("user", "weather?")
        .tool(WEATHER, "get_weather")
        .arena()
        .send(2)
        .recv()
        .metrics();
    for setup in [
        anthropic_setup(vec![anthropic]).await,
        setup(vec![openai]).await,
    ] {
        let run = run(&setup, &guest).await;
        let response = emitted_json(&run, 0);
        assert_eq!(
            response["error"]["code"], "tool_calls_truncated",
            "{response}"
        );
        assert_eq!(
            response["last_response"]["choices"][0]["finish_reason"],
            "length"
        );
        assert_eq!(emitted_json(&run, 1)["tool_calls"]["guest"], 0);
        assert_eq!(setup.llm.request_count(), 1);
    }
}

#[tokio::test]
async fn guest_images_are_checked_before_they_reach_an_anthropic_model() {
    let svg = "PHN2Zy8+"; // "<svg/>"
    let guest = ChatGuest::new()
        .add_message(json!({"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": format!("data:image/svg+xml;base64,{svg}")}},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{RED_PIXEL_PNG_BASE64}")}},
        ]}))
        .add_message(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "shot", "arguments": "{}"}},
        ]}))
        .add_message(json!({"role": "tool", "tool_call_id": "t", "content": "r", "quiver_content": [
            {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": RED_PIXEL_PNG_BASE64}},
        ]}))
        .send(0)
        .recv();
    let setup = anthropic_setup(vec![Reply::text("ok")]).await;
    let run = run(&setup, &guest).await;
    let response = emitted_json(&run, 0);
    assert_eq!(
        response["choices"][0]["message"]["content"], "ok",
        "{response}"
    );
    let request = setup.llm.request(0);
    let user = &request["messages"][0]["content"];
    assert_eq!(user[0]["text"], "see");
    assert_eq!(user[1]["type"], "text", "the SVG is a note: {user}");
    assert_eq!(user[2]["source"]["data"], RED_PIXEL_PNG_BASE64);
    let result = &request["messages"][2]["content"][0]["content"];
    let kinds: Vec<&Value> = result
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["type"])
        .collect();
    assert_eq!(kinds, ["text", "text", "text"], "{result}");
}

#[tokio::test]
async fn a_session_whose_send_failed_after_tool_results_goes_on() {
    // The failed send keeps its tool turn; the guest's next message makes two user turns
    // in a row, which go as one.
    let setup = anthropic_setup(vec![
        Reply::tool_call("e", "mcp__fixture__echo", json!({"text": "1"})),
        Reply::anthropic_error(400, "boom"),
        Reply::text("recovered"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "go")
        .send(2)
        .recv()
        .msg("user", "again")
        .send(2)
        .recv();
    let run = run(&setup, &guest).await;
    assert_eq!(emitted_json(&run, 0)["error"]["status"], 400);
    let response = emitted_json(&run, 1);
    assert_eq!(
        response["choices"][0]["message"]["content"], "recovered",
        "{response}"
    );
    let third = setup.llm.request(2);
    assert_eq!(roles(&third), ["user", "assistant", "user"]);
    assert_eq!(third["messages"][2]["content"][0]["tool_use_id"], "e");
    assert_eq!(third["messages"][2]["content"][1]["text"], "again");
}

#[tokio::test]
async fn anthropic_params_and_usage_are_translated() {
    let setup = anthropic_setup(vec![Reply::Json(json!({
        "type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 2,
                  "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000},
    }))])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "hi")
        .tool(WEATHER, "get_weather")
        .param("temperature", json!(1.5))
        .param("parallel_tool_calls", json!(false))
        .send(0)
        .recv()
        .metrics();
    let run = run(&setup, &guest).await;
    let request = setup.llm.request(0);
    assert_eq!(
        request["temperature"], 1.0,
        "OpenAI's 0-2 is clamped to 0-1"
    );
    assert_eq!(
        request["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
    assert!(request.get("parallel_tool_calls").is_none());
    let response = emitted_json(&run, 0);
    assert_eq!(response["usage"]["prompt_tokens"], 1103, "{response}");
    assert_eq!(
        response["usage"]["prompt_tokens_details"]["cached_tokens"],
        1000
    );
    let metrics = emitted_json(&run, 1);
    assert_eq!(metrics["prompt_tokens"], 1103);
    assert_eq!(metrics["total_tokens"], 1105);
}

async fn wire_setup(wire: Wire, script: Vec<Reply>) -> Setup {
    let llm = ScriptedLlm::start_wire(script, wire);
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo", "image"], "");
    let host = scripted_host(&registry, &llm);
    Setup {
        llm,
        host,
        _registry: registry,
    }
}

/// The same guest, its tool loop of three turns, against every wire format: the guest sees
/// the same answer and summary, and each request was one its API accepts (the scripted
/// servers refuse the rest).
#[tokio::test]
async fn one_guest_runs_its_tool_loop_against_every_backend_kind() {
    let guest = ChatGuest::new()
        .msg("system", "be brief")
        .msg("user", "echo twice")
        .param("model", json!("gemini-3-pro-preview"))
        .send(2)
        .recv()
        .metrics();
    for wire in [Wire::OpenAi, Wire::Responses, Wire::Anthropic, Wire::Gemini] {
        let setup = wire_setup(
            wire,
            vec![
                Reply::tool_call("e1", "mcp__fixture__echo", json!({"text": "one"})),
                Reply::tool_call("e2", "mcp__fixture__echo", json!({"text": "two"})),
                Reply::text("one, two"),
            ],
        )
        .await;
        let run = run(&setup, &guest).await;
        let response = emitted_json(&run, 0);
        assert_eq!(
            response["choices"][0]["message"]["content"], "one, two",
            "{wire:?}: {response}"
        );
        assert_eq!(response["choices"][0]["finish_reason"], "stop", "{wire:?}");
        let calls = response["_spear"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "{wire:?}: {response}");
        assert!(calls.iter().all(|c| c["ok"] == true), "{wire:?}: {calls:?}");
        let metrics = emitted_json(&run, 1);
        assert_eq!(metrics["iterations"], 3, "{wire:?}");
        assert_eq!(
            metrics["llm_requests"], 3,
            "{wire:?}: no request was refused"
        );
        let last = setup.llm.request(2).to_string();
        assert!(
            last.contains("one") && last.contains("two"),
            "{wire:?}: both results go back: {last}"
        );
    }
}

#[tokio::test]
async fn responses_carry_reasoning_and_mcp_images_as_input_images() {
    let setup = wire_setup(
        Wire::Responses,
        vec![
            Reply::tool_calls([
                ("e", "mcp__fixture__echo", json!({"text": "hey"})),
                ("i", "mcp__fixture__image", json!({})),
            ]),
            Reply::text("a red pixel"),
        ],
    )
    .await;
    // A reasoning model (the backend's `reasoning_models`): its reasoning comes encrypted.
    let guest = ChatGuest::new()
        .msg("system", "sys")
        .msg("user", "look")
        .param("model", json!("gpt-5-mini"))
        .send(2)
        .recv();
    let run = run(&setup, &guest).await;
    let response = emitted_json(&run, 0);
    assert_eq!(
        response["choices"][0]["message"]["content"], "a red pixel",
        "{response}"
    );
    assert_eq!(
        setup.llm.recorded()[0].body["include"],
        json!(["reasoning.encrypted_content"])
    );
    let recorded = &setup.llm.recorded()[1];
    assert_eq!(recorded.path, "/v1/responses");
    let second = &recorded.body;
    assert_eq!(second["store"], false);
    assert_eq!(second["instructions"], "sys");
    let input = second["input"].as_array().unwrap();
    assert_eq!(
        input[1],
        json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc-1"}),
        "the reasoning item goes back before the calls it led to: {second}"
    );
    assert_eq!(input[2]["call_id"], "e");
    assert_eq!(
        input[4],
        json!({"type": "function_call_output", "call_id": "e", "output": "hey"})
    );
    assert_eq!(
        input[5]["output"],
        json!([
            {"type": "input_text", "text": "a 1x1 red pixel\n[image: image/png, 69 B]"},
            {"type": "input_image", "image_url": format!("data:image/png;base64,{RED_PIXEL_PNG_BASE64}"), "detail": "auto"},
        ])
    );
}

#[tokio::test]
async fn gemini_takes_mcp_images_inside_the_response_on_models_that_accept_them() {
    let script = || {
        vec![
            Reply::tool_call("i", "mcp__fixture__image", json!({})),
            Reply::text("a red pixel"),
        ]
    };
    for (model, inline) in [("gemini-3-pro-preview", true), ("gemini-2.5-flash", false)] {
        let setup = wire_setup(Wire::Gemini, script()).await;
        let guest = ChatGuest::new()
            .msg("user", "look")
            .param("model", json!(model))
            .send(2)
            .recv();
        let run = run(&setup, &guest).await;
        let response = emitted_json(&run, 0);
        assert_eq!(
            response["choices"][0]["message"]["content"], "a red pixel",
            "{model}: {response}"
        );
        let recorded = &setup.llm.recorded()[1];
        assert_eq!(recorded.path, format!("/v1/models/{model}:generateContent"));
        let answer = &recorded.body["contents"][2]["parts"][0]["functionResponse"];
        assert_eq!(answer["name"], "mcp__fixture__image");
        assert_eq!(
            answer["response"]["output"],
            "a 1x1 red pixel\n[image: image/png, 69 B]"
        );
        if inline {
            assert_eq!(answer["id"], "i");
            assert_eq!(
                answer["parts"],
                json!([{"inlineData": {"mimeType": "image/png", "data": RED_PIXEL_PNG_BASE64}}])
            );
            assert_eq!(
                recorded.body["contents"][1]["parts"][0]["thoughtSignature"], "sig-1",
                "the call's signature goes back"
            );
        } else {
            assert!(answer.get("parts").is_none(), "{model}: {answer}");
            assert!(!recorded.body.to_string().contains(RED_PIXEL_PNG_BASE64));
        }
    }
}

#[tokio::test]
async fn refusals_and_safety_blocks_are_content_filter() {
    let responses = Reply::Json(json!({
        "id": "resp_r", "status": "completed", "output": [{"type": "message", "role": "assistant",
            "content": [{"type": "refusal", "refusal": "I can't help with that."}]}],
    }));
    let gemini = Reply::Json(json!({
        "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": []},
        "usageMetadata": {"promptTokenCount": 4, "totalTokenCount": 4},
    }));
    for (wire, reply, refusal) in [
        (Wire::Responses, responses, "I can't help with that."),
        (Wire::Gemini, gemini, "the prompt was blocked (SAFETY)"),
    ] {
        let setup = wire_setup(wire, vec![reply]).await;
        let run = run(&setup, &ChatGuest::new().msg("user", "bad").send(2).recv()).await;
        let response = emitted_json(&run, 0);
        let choice = &response["choices"][0];
        assert_eq!(
            choice["finish_reason"], "content_filter",
            "{wire:?}: {response}"
        );
        assert_eq!(choice["message"]["refusal"], refusal, "{wire:?}");
    }
}

#[tokio::test]
async fn truncated_tool_calls_are_not_run_on_the_new_backends() {
    let responses = Reply::Json(json!({
        "id": "resp_t", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
        "output": [{"type": "function_call", "call_id": "w", "name": "get_weather", "arguments": "{\"ci"}],
    }));
    let gemini = Reply::Json(
        json!({"candidates": [{"finishReason": "MAX_TOKENS", "content": {"role": "model",
        "parts": [{"functionCall": {"name": "get_weather", "args": {}}}]}}]}),
    );
    for (wire, reply) in [(Wire::Responses, responses), (Wire::Gemini, gemini)] {
        let setup = wire_setup(wire, vec![reply]).await;
        let guest = ChatGuest::new()
            .msg("user", "weather?")
            .tool(WEATHER, "get_weather")
            .arena()
            .send(2)
            .recv()
            .metrics();
        let run = run(&setup, &guest).await;
        let response = emitted_json(&run, 0);
        assert_eq!(
            response["error"]["code"], "tool_calls_truncated",
            "{wire:?}: {response}"
        );
        assert_eq!(emitted_json(&run, 1)["tool_calls"]["guest"], 0);
        assert_eq!(setup.llm.request_count(), 1);
    }
}

#[tokio::test]
async fn gemini_rate_limits_wait_the_retry_delay_it_asks_for() {
    let limited = Reply::status(
        429,
        json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota", "details": [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.2s"}]}})
        .to_string(),
    );
    let setup = wire_setup(Wire::Gemini, vec![limited, Reply::text("fine")]).await;
    let started = std::time::Instant::now();
    let run = run(
        &setup,
        &ChatGuest::new().msg("user", "hi").send(0).recv().metrics(),
    )
    .await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1100),
        "the backoff alone would be 200 ms: {:?}",
        started.elapsed()
    );
    assert_eq!(
        emitted_json(&run, 0)["choices"][0]["message"]["content"],
        "fine"
    );
    assert_eq!(emitted_json(&run, 1)["llm_retries"], 1);
}

#[tokio::test]
async fn a_tool_schema_gemini_cannot_express_is_llm_invalid_request() {
    let setup = wire_setup(Wire::Gemini, vec![Reply::text("unused")]).await;
    let mut guest = ChatGuest::new().msg("user", "hi");
    let definition = json!({"type": "function", "function": {"name": "free", "parameters": {
        "type": "object", "properties": {"anything": {}}}}});
    let (p, l) = guest.bytes(definition.to_string().as_bytes());
    let guest = guest
        .raw(&format!("(call $out (call $cchat_write_fn (local.get $s) (i32.const {WEATHER}) (i32.const {p}) (i32.const {l})))"))
        .send(0)
        .recv();
    let run = run(&setup, &guest).await;
    let error = &emitted_json(&run, 0)["error"];
    assert_eq!(error["code"], "llm_invalid_request", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("tool `free`") && message.contains(".anything: a schema without a `type`"),
        "{message}"
    );
    assert_eq!(setup.llm.request_count(), 0, "nothing was sent");
}

#[tokio::test]
async fn chained_responses_send_only_what_follows_the_stored_response() {
    let llm = ScriptedLlm::start_responses(vec![
        Reply::tool_call("e", "mcp__fixture__echo", json!({"text": "hey"})),
        Reply::text("done"),
    ])
    .await;
    let registry = RegistryDir::new();
    registry.fixture("fixture", &["echo"], "");
    let backend = quiver::llm::BackendConfig {
        kind: quiver::llm::BackendKind::OpenaiResponses,
        base_url: Some(llm.base_url()),
        default_model: Some("gpt-x".into()),
        chain_responses: Some(true),
        ..Default::default()
    };
    let config = quiver::HostConfig {
        backends: std::collections::BTreeMap::from([("chained".into(), backend)]),
        ..Default::default()
    };
    let host = quiver_tests::host_builder(&registry)
        .with_config(config, ".")
        .build()
        .unwrap();
    let setup = Setup {
        llm,
        host,
        _registry: registry,
    };
    let guest = ChatGuest::new()
        .msg("system", "sys")
        .msg("user", "go")
        .send(2)
        .recv();
    let run = run(&setup, &guest).await;
    let response = emitted_json(&run, 0);
    assert_eq!(
        response["choices"][0]["message"]["content"], "done",
        "{response}"
    );
    let first = setup.llm.request(0);
    assert_eq!(first["store"], true);
    assert!(first.get("include").is_none());
    let second = setup.llm.request(1);
    assert_eq!(second["previous_response_id"], "resp_scripted_1");
    assert_eq!(second["instructions"], "sys");
    assert_eq!(
        second["input"],
        json!([{"type": "function_call_output", "call_id": "e", "output": "hey"}])
    );
}

/// A backend that answers 307 to another host: neither the API key nor the conversation
/// follows it; the send fails with the 307 as an HTTP error.
#[tokio::test]
async fn a_redirect_from_the_model_api_is_never_followed() {
    use axum::Router;
    use axum::http::{HeaderMap, StatusCode, header};
    use std::sync::{Arc, Mutex};

    const KEY: &str = "redirect-test-key-s3cr3t";
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let elsewhere = {
        let seen = seen.clone();
        Router::new().fallback(move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(format!("{headers:?}"));
                StatusCode::OK
            }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}/stolen", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, elsewhere).await });
    let gateway = Router::new().fallback(move || {
        let target = target.clone();
        async move { (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, target)]) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, gateway).await });

    // SAFETY: a variable no other test reads, set before any host reads it.
    unsafe { std::env::set_var("QV_REDIRECT_TEST_KEY", KEY) };
    let registry = RegistryDir::new();
    for kind in [
        quiver::llm::BackendKind::Gemini,
        quiver::llm::BackendKind::Anthropic,
        quiver::llm::BackendKind::Openai,
    ] {
        let backend = quiver::llm::BackendConfig {
            kind,
            base_url: Some(base.clone()),
            default_model: Some("gemini-3-pro-preview".into()),
            api_key_env: Some("QV_REDIRECT_TEST_KEY".into()),
            ..Default::default()
        };
        let config = quiver::HostConfig {
            default_backend: Some("gw".into()),
            backends: std::collections::BTreeMap::from([("gw".into(), backend)]),
            ..Default::default()
        };
        let host = quiver_tests::host_builder(&registry)
            .with_config(config, ".")
            .build()
            .unwrap();
        let guest = ChatGuest::new().msg("user", "hello").send(0).recv();
        let run = wat::run(&host, &guest.build(), &mcp_task("redirect", &[])).await;
        host.shutdown().await;
        let answer = run.emitted.join("\n");
        assert!(
            answer.contains("llm_http_error") && answer.contains("307"),
            "{kind:?}: {:?} {answer}",
            run.results
        );
        let shown = format!("{}{:?}", run.outcome.stderr_text(), run.emitted);
        assert!(!shown.contains(KEY), "{shown}");
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "a redirect was followed: {:?}",
        seen.lock().unwrap()
    );
}

/// A task reuses the MCP half of its tool set from send to send only while what it was
/// built from holds: after the session denies a tool, the next send neither offers it nor
/// runs the model's call of it; after the registry drops the tool, a new task is not
/// offered it.
#[tokio::test]
async fn a_send_offers_only_what_the_policy_still_allows_after_it_changes() {
    let setup = setup(vec![
        Reply::text("first"),
        Reply::tool_calls([("d1", "mcp__fixture__add", json!({"a": 1, "b": 2}))]),
        Reply::text("done"),
        Reply::text("after the reload"),
    ])
    .await;
    let guest = ChatGuest::new()
        .msg("user", "go")
        .send(2)
        .param("mcp.tool_denylist", json!(["add"]))
        .send(2)
        .recv();
    let first = run(&setup, &guest).await;
    let offered = |i: usize| tool_names(&setup.llm.request(i));
    assert!(offered(0).contains(&"mcp__fixture__add".to_owned()));
    assert!(offered(0).contains(&"mcp__fixture__echo".to_owned()));
    assert!(
        !offered(1).contains(&"mcp__fixture__add".to_owned()),
        "a denied tool was offered from the last send's tool set: {:?}",
        offered(1)
    );
    assert!(offered(1).contains(&"mcp__fixture__echo".to_owned()));
    let results = tool_results(&setup.llm.request(2));
    let error: Value = serde_json::from_str(&results[0].1).unwrap();
    assert_eq!(error["error"]["code"], "mcp_policy_denied", "{results:?}");
    assert_eq!(
        emitted_json(&first, 0)["_spear"]["tool_calls"][0]["ok"],
        false
    );

    setup._registry.write(
        "fixture.toml",
        &quiver_tests::fixture_toml("fixture", &["echo"], ""),
    );
    setup.host.reload_registry().unwrap();
    run(&setup, &ChatGuest::new().msg("user", "again").send(2)).await;
    assert!(!offered(3).contains(&"mcp__fixture__add".to_owned()));
    assert!(offered(3).contains(&"mcp__fixture__echo".to_owned()));
}
