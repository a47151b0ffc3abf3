//! A server's questions on `quiver serve`: the real binary, real HTTP, a WAT guest and the
//! fixture MCP server with its ask tools. A question waits in the node's approval queue,
//! is listed with its form by `GET /v1/approvals` to a client holding `approve` (never the
//! submitter), and `POST /v1/approvals/{id}` answers it; an answer that does not fit the
//! form is refused (422) and the question keeps waiting.

use std::time::{Duration, Instant};

use quiver_tests::node::{Answer, Node};
use quiver_tests::{RegistryDir, fixture_toml_with_args, unique_id, wat};
use reqwest::Method;
use serde_json::{Value, json};

fn mcp_task(id: &str, servers: &[&str]) -> Value {
    json!({
        "task_id": id,
        "config": {"mcp.enabled": "true", "mcp.default_server_ids": json!(servers).to_string()},
        "limits": {"deadline_ms": 120000},
    })
}

fn results(task: &Answer) -> Vec<Value> {
    task.json["stderr"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

#[tokio::test]
async fn questions_are_listed_with_their_form_and_answered_over_http() {
    let registry = RegistryDir::new();
    let mut servers = Vec::new();
    for (args, tool) in [
        (&["--ask-tools"][..], "ask_name"),
        (
            &["--ask-tools", "--protocol-version", "2025-11-25"][..],
            "ask_name_2025",
        ),
    ] {
        let server = unique_id("asks");
        registry.write(
            &format!("{server}.toml"),
            &fixture_toml_with_args(&server, &["*"], args, ""),
        );
        servers.push((server, tool));
    }
    let token = "questions-node-token-0042";
    let ops_token = "questions-ops-token-0043";
    let node = Node::start_with_args(
        &registry,
        Some(
            "[serve]\ntoken_env = \"QUIVER_TEST_TOKEN\"\n\
             [clients.ops]\ntoken_env = \"QUIVER_TEST_OPS\"\nroles = [\"approve\"]\n",
        ),
        &[("QUIVER_TEST_TOKEN", token), ("QUIVER_TEST_OPS", ops_token)],
        &[],
    );
    let ops = |method: Method, path: &str| node.anonymous(method, path).bearer_auth(ops_token);
    for (server, tool) in &servers {
        let module = node
            .upload(wat::mcp_calls(&[(server, tool, "{}")], 1).as_bytes())
            .await;
        let task = node.submit_ok(&module, mcp_task("asked", &[server])).await;
        let start = Instant::now();
        let listed = loop {
            let listed = Node::send(ops(Method::GET, "/v1/approvals")).await;
            assert_eq!(listed.status, 200, "{listed:?}");
            if listed.json["questions"]
                .as_array()
                .is_some_and(|q| !q.is_empty())
            {
                break listed.json;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no question: {listed:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let question = &listed["questions"][0];
        assert_eq!(question["task_id"], "asked", "{listed}");
        assert_eq!(question["principal"], "serve", "the submitter is named");
        assert_eq!(question["server_id"], server.as_str());
        assert_eq!(question["name"], *tool);
        assert_eq!(question["message"], "Who are you?");
        assert_eq!(
            question["requested_schema"]["required"],
            json!(["name"]),
            "{question}"
        );
        let id = question["id"].as_str().expect("id").to_owned();
        let answer =
            |body: Value| Node::send(ops(Method::POST, &format!("/v1/approvals/{id}")).json(&body));
        // The submitter may not answer its own task's question.
        let own = Node::send(
            node.request(Method::POST, &format!("/v1/approvals/{id}"))
                .json(&json!({"action": "accept", "content": {"name": "Me"}})),
        )
        .await;
        assert_eq!((own.status, own.code()), (403, "forbidden"), "{own:?}");
        // An answer that does not fit the form, or a call's decision, is refused; the
        // question still waits.
        for unfit in [
            json!({"action": "accept", "content": {"name": 5}}),
            json!({"action": "accept", "content": {}}),
            json!({"action": "accept", "content": {"name": "x", "extra": 1}}),
        ] {
            let refused = answer(unfit.clone()).await;
            assert_eq!(
                (refused.status, refused.code(), refused.field()),
                (422, "invalid_answer", "body"),
                "{unfit}: {refused:?}"
            );
        }
        let malformed = answer(json!({"approve": true})).await;
        assert_eq!(malformed.status, 400, "{malformed:?}");
        assert_eq!(node.task(&task, 0).await.json["status"], "running");
        let answered = answer(json!({"action": "accept", "content": {"name": "Ada"}})).await;
        assert_eq!(answered.status, 200, "{answered:?}");
        assert_eq!(answered.json, json!({"id": id, "action": "accept"}));
        let done = node.task(&task, 60).await;
        assert_eq!(done.json["status"], "finished", "{done:?}");
        assert_eq!(
            results(&done)[0]["content"][0]["text"],
            r#"accept {"name":"Ada","greeting":"hello"}"#,
            "the form's default filled in: {done:?}"
        );
        let again = answer(json!({"action": "decline"})).await;
        assert_eq!(
            (again.status, again.code()),
            (409, "no_longer_waiting"),
            "{again:?}"
        );
    }
    let empty = Node::send(ops(Method::GET, "/v1/approvals")).await;
    assert_eq!(empty.json, json!({"approvals": [], "questions": []}));
}
