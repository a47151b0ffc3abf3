use base64::Engine as _;

use super::*;
use crate::chat::llm::ids::ANTHROPIC;

/// A PNG's signature and a little more, as base64.
fn png(len: usize) -> String {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.resize(len, 0);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn image(data: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}})
}

fn call(id: Value, name: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}})
}

fn request(messages: Value) -> Value {
    let out = to_messages(&json!({"model": "m", "messages": messages}), 99);
    if let Some(fault) = api_fault(&out) {
        panic!("the API would refuse this request: {fault}\n{out:#}");
    }
    out
}

/// What the Messages API refuses in a request (the rules the scripted server in the tests
/// crate enforces too), or `None`.
fn api_fault(request: &Value) -> Option<String> {
    let messages = request["messages"].as_array()?;
    let mut seen_ids = std::collections::HashSet::new();
    let mut asked: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let want = if i % 2 == 0 { "user" } else { "assistant" };
        if message["role"] != want {
            return Some(format!("messages.{i}: expected {want}"));
        }
        let Some(blocks) = message["content"].as_array().filter(|b| !b.is_empty()) else {
            return Some(format!("messages.{i}: empty content"));
        };
        let mut answered = Vec::new();
        let mut past_results = false;
        for block in blocks {
            let nested = block["content"].as_array().into_iter().flatten();
            for part in std::iter::once(block).chain(nested) {
                let text = part["text"].as_str().unwrap_or("");
                if part["type"] == "text" && text.trim().is_empty() {
                    return Some(format!("messages.{i}: empty text block"));
                }
                let source = &part["source"];
                if part["type"] == "image" && source["type"] == "base64" {
                    let data = source["data"].as_str().unwrap_or("");
                    let media_type = source["media_type"].as_str().unwrap_or("");
                    if let Err(why) = crate::chat::images::check(media_type, data) {
                        return Some(format!("messages.{i}: image {why}"));
                    }
                }
            }
            match block["type"].as_str() {
                Some("tool_use") => {
                    let id = block["id"].as_str().unwrap_or("");
                    if !ANTHROPIC.is_valid(id) || !seen_ids.insert(id.to_owned()) {
                        return Some(format!("messages.{i}: bad or repeated id {id}"));
                    }
                    if !ANTHROPIC.is_valid(block["name"].as_str().unwrap_or("")) {
                        return Some(format!("messages.{i}: bad tool name"));
                    }
                }
                Some("tool_result") => {
                    if past_results || message["role"] != "user" {
                        return Some(format!("messages.{i}: tool_result not first"));
                    }
                    answered.push(block["tool_use_id"].as_str().unwrap_or("").to_owned());
                }
                _ => past_results = true,
            }
        }
        if message["role"] == "user" {
            let mut want = std::mem::take(&mut asked);
            want.sort();
            answered.sort();
            if want != answered {
                return Some(format!(
                    "messages.{i}: results {answered:?} for calls {want:?}"
                ));
            }
        } else {
            asked = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .filter_map(|b| b["id"].as_str().map(str::to_owned))
                .collect();
        }
    }
    if !asked.is_empty() {
        return Some("the last tool_use has no result".into());
    }
    let images = request.to_string().matches(r#""type":"image""#).count();
    (images > defaults::ANTHROPIC_MAX_IMAGES_PER_REQUEST).then(|| format!("{images} images"))
}

#[test]
fn request_merges_tool_results_and_lifts_system() {
    let pixel = png(20);
    let body = json!({
        "model": "claude-x",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "t1", "arguments": "{\"x\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "t2", "arguments": "not json"}},
            ]},
            {"role": "tool", "tool_call_id": "a", "content": "one"},
            {"role": "tool", "tool_call_id": "b", "content": "two", "quiver_content": [image(&pixel)]},
        ],
        "tools": [{"type": "function", "function": {"name": "t1", "parameters": {"type": "object"}}}],
        "tool_choice": "required",
        "stop": "END",
    });
    let out = to_messages(&body, 99);
    assert_eq!(api_fault(&out), None);
    assert_eq!(out["system"], "be brief");
    assert_eq!(out["max_tokens"], 99);
    assert_eq!(out["tool_choice"], json!({"type": "any"}));
    assert_eq!(out["stop_sequences"], json!(["END"]));
    assert_eq!(out["tools"][0]["input_schema"], json!({"type": "object"}));
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1]["content"][0]["input"], json!({"x": 1}));
    assert_eq!(messages[1]["content"][1]["input"], json!({}));
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["tool_use_id"], "b");
    assert_eq!(results[1]["content"][1]["source"]["data"], pixel);
}

#[test]
fn empty_and_blank_text_is_left_out() {
    // An answer of `content: []` (end_turn) is stored as "", a tool may return "", and
    // whitespace is no text either: the API refuses each as a block or a turn.
    let out = request(json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": " \n", "tool_calls": [call(json!("a"), "t")]},
        {"role": "tool", "tool_call_id": "a", "content": ""},
        {"role": "assistant", "content": [{"type": "text", "text": "  "}]},
        {"role": "user", "content": [{"type": "text"}, {"type": "text", "text": "ok"}]},
    ]));
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{out:#}");
    assert_eq!(
        messages[0]["content"],
        json!([{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}]),
        "the empty answer is dropped and the user turns around it merged"
    );
    assert_eq!(
        messages[1]["content"],
        json!([{"type": "tool_use", "id": "a", "name": "t", "input": {}}])
    );
    assert_eq!(
        messages[2]["content"],
        json!([{"type": "tool_result", "tool_use_id": "a"}, {"type": "text", "text": "ok"}]),
        "an empty result has no content; the user's text follows the results"
    );
}

#[test]
fn a_user_turn_with_no_content_takes_no_tool_results() {
    // Before, an empty user turn counted as a turn of tool results and took them in.
    let out = request(json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [call(json!("a"), "t")]},
        {"role": "user", "content": []},
        {"role": "tool", "tool_call_id": "a", "content": "done"},
    ]));
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "a");
}

#[test]
fn consecutive_user_turns_are_merged_results_first() {
    // A send that ended after its tool results (an LLM error), then the guest's next user
    // message: the API would combine the two user turns.
    let out = request(json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [call(json!("a"), "t"), call(json!("b"), "t")]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "user", "content": "and?"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
    ]));
    let last = &out["messages"][2]["content"];
    assert_eq!(last[0]["tool_use_id"], "a");
    assert_eq!(last[1]["tool_use_id"], "b");
    assert_eq!(last[2]["text"], "and?");
}

#[test]
fn tool_ids_are_repaired_and_every_call_answered() {
    let out = request(json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "twice", "tool_calls": [call(json!("x"), "t"), call(json!("x"), "mcp.s.t")]},
        {"role": "tool", "tool_call_id": "x", "content": "first"},
        {"role": "tool", "tool_call_id": "x", "content": "second"},
        {"role": "assistant", "content": null, "tool_calls": [call(json!("x"), "t"), call(Value::Null, "t"), call(json!("a b"), "t")]},
        {"role": "tool", "tool_call_id": "x", "content": "third"},
        {"role": "tool", "tool_call_id": "call_1", "content": "fourth"},
        {"role": "tool", "tool_call_id": "stray", "content": "fifth"},
        {"role": "assistant", "content": null, "tool_calls": [call(json!("left"), "t")]},
    ]));
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 7, "{out:#}");
    let ids = |i: usize, key: &str| -> Vec<String> {
        messages[i]["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b[key].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(ids(1, "id"), ["x", "toolu_quiver_0"]);
    assert_eq!(messages[1]["content"][2]["name"], "mcp_s_t");
    assert_eq!(ids(2, "tool_use_id"), ["x", "toolu_quiver_0"]);
    assert_eq!(messages[2]["content"][1]["content"][0]["text"], "second");
    assert_eq!(
        ids(3, "id"),
        ["toolu_quiver_1", "call_1", "toolu_quiver_2"],
        "a call without an id is `call_<index>`, as the chat loop names it"
    );
    assert_eq!(
        ids(4, "tool_use_id"),
        ["toolu_quiver_2", "toolu_quiver_1", "call_1"],
        "the unanswered call first, then the answers in order"
    );
    let answers = &messages[4]["content"];
    assert_eq!(answers[0]["is_error"], true);
    assert_eq!(answers[1]["content"][0]["text"], "third");
    assert_eq!(answers[2]["content"][0]["text"], "fourth");
    assert!(
        answers[3]["text"].as_str().unwrap().contains("stray"),
        "a result for no call becomes text: {answers}"
    );
    assert_eq!(answers[4]["text"], "fifth");
    assert_eq!(ids(5, "id"), ["left"]);
    assert_eq!(ids(6, "tool_use_id"), ["left"], "a last call unanswered");
    assert_eq!(messages[6]["content"][0]["is_error"], true);
}

#[test]
fn only_the_newest_valid_images_are_sent() {
    let max = defaults::ANTHROPIC_MAX_IMAGES_PER_REQUEST;
    let mut messages = vec![json!({"role": "user", "content": "look"})];
    for i in 0..max + 5 {
        let id = format!("c{i}");
        messages.push(
            json!({"role": "assistant", "content": null, "tool_calls": [call(json!(id), "shot")]}),
        );
        messages.push(
            json!({"role": "tool", "tool_call_id": id, "content": format!("shot {i}"),
                             "quiver_content": [image(&png(30 + i))]}),
        );
    }
    let out = request(Value::Array(messages));
    let results: Vec<&Value> = out["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["content"][0]["type"] == "tool_result")
        .map(|m| &m["content"][0]["content"][1])
        .collect();
    assert_eq!(results.len(), max + 5);
    for (i, part) in results.iter().enumerate() {
        if i < 5 {
            assert_eq!(part["type"], "text", "image {i} is old: {part}");
            assert!(part["text"].as_str().unwrap().contains("newest"));
        } else {
            assert_eq!(part["source"]["data"], png(30 + i), "image {i} is new");
        }
    }

    // The bytes of all images are capped too: three of the largest fit, not four.
    let big = png(defaults::LLM_IMAGE_MAX_BASE64_BYTES / 4 * 3);
    assert!(big.len() * 4 > defaults::ANTHROPIC_MAX_IMAGE_BYTES_PER_REQUEST);
    let url =
        json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{big}")}});
    let out = request(json!([{"role": "user", "content": [url, url, url, url]}]));
    let kinds: Vec<&Value> = out["messages"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["type"])
        .collect();
    assert_eq!(kinds, ["text", "image", "image", "image"]);
}

#[test]
fn guest_images_and_blocks_are_checked_like_tool_images() {
    let pixel = png(20);
    let svg = base64::engine::general_purpose::STANDARD.encode("<svg/>");
    let out = request(json!([
        {"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{pixel}")}},
            {"type": "image_url", "image_url": {"url": format!("data:image/svg+xml;base64,{svg}")}},
            {"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{pixel}")}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        ]},
        {"role": "assistant", "content": null, "tool_calls": [call(json!("a"), "t")]},
        {"role": "tool", "tool_call_id": "a", "content": "r", "quiver_content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": pixel}},
            {"type": "document", "source": {"type": "url", "url": "https://example.com/x.pdf"}},
            {"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}},
            image(&pixel),
        ]},
    ]));
    let user = out["messages"][0]["content"].as_array().unwrap();
    assert_eq!(user[1]["source"]["data"], pixel);
    assert!(
        user[2]["text"]
            .as_str()
            .unwrap()
            .contains("JPEG, PNG, GIF or WebP")
    );
    assert!(user[3]["text"].as_str().unwrap().contains("declared type"));
    assert_eq!(
        user[4]["source"],
        json!({"type": "url", "url": "https://example.com/a.png"})
    );
    assert!(user[5]["text"].as_str().unwrap().contains("https"));
    assert!(user[6]["text"].as_str().unwrap().contains("input_audio"));
    let result = out["messages"][2]["content"][0]["content"]
        .as_array()
        .unwrap();
    let kinds: Vec<&Value> = result.iter().map(|b| &b["type"]).collect();
    assert_eq!(
        kinds,
        ["text", "text", "text", "text", "image"],
        "{result:#?}"
    );
    assert!(!out.to_string().contains("passwd"));
}

#[test]
fn parameters_are_mapped_into_the_api_range() {
    let out = to_messages(
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "t"}}],
                "parallel_tool_calls": false, "temperature": 1.7, "stop": ["a", 3]}),
        10,
    );
    assert_eq!(
        out["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
    assert_eq!(out["temperature"], 1.0, "OpenAI's 0-2 is clamped to 0-1");
    assert_eq!(out["stop_sequences"], json!(["a"]));
    let out = to_messages(
        &json!({"model": "m", "messages": [], "temperature": 0.3,
                "tools": [{"type": "function", "function": {"name": "t"}}],
                "tool_choice": {"type": "function", "function": {"name": "t"}},
                "parallel_tool_calls": false}),
        10,
    );
    assert_eq!(
        out["tool_choice"],
        json!({"type": "tool", "name": "t", "disable_parallel_tool_use": true})
    );
    assert_eq!(out["temperature"], 0.3);
    let out = to_messages(
        &json!({"model": "m", "messages": [], "tool_choice": "none", "parallel_tool_calls": false,
                "tools": [{"type": "function", "function": {"name": "t"}}]}),
        10,
    );
    assert_eq!(out["tool_choice"], json!({"type": "none"}));
}
