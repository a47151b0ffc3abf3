//! The Responses translation: requests the API accepts, answers the loop reads.

use serde_json::{Value, json};

use super::{State, from_responses, to_responses};

const PIXEL: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

fn image(data: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}})
}

fn read(response: Value, state: State) -> Value {
    let completion = from_responses(response.to_string().as_bytes(), state).unwrap();
    serde_json::to_value(completion).unwrap()
}

#[test]
fn a_tool_loop_becomes_items_with_images_in_the_output() {
    let body = json!({
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "look"},
            {"role": "assistant", "content": null, "quiver_content": [
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}],
                 "encrypted_content": "enc", "extra": 1},
                {"type": "reasoning", "id": "rs_2", "summary": []},
            ], "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "shot", "arguments": "{}"}},
                {"id": "call_a", "type": "function", "function": {"name": "bad name!", "arguments": {"x": 1}}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "one", "quiver_content": [image(PIXEL)]},
            {"role": "tool", "tool_call_id": "nobody", "content": "stray"},
        ],
        "tools": [{"type": "function", "function": {"name": "shot", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "shot"}},
        "max_tokens": 5, "temperature": 1.5, "stop": ["x"], "seed": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
    });
    let request = to_responses(&body, State::Stateless, true);
    assert_eq!(request["instructions"], "be brief");
    assert_eq!(request["store"], false);
    assert_eq!(request["include"], json!(["reasoning.encrypted_content"]));
    let plain = to_responses(&body, State::Stateless, false);
    assert!(
        plain.get("include").is_none(),
        "a model without reasoning refuses the include: {plain}"
    );
    assert_eq!(
        request["max_output_tokens"], 16,
        "raised to the API's least"
    );
    assert_eq!(request["temperature"], 1.5);
    assert!(request.get("stop").is_none() && request.get("seed").is_none());
    assert_eq!(
        request["tool_choice"],
        json!({"type": "function", "name": "shot"})
    );
    assert_eq!(request["tools"][0]["strict"], false);
    assert_eq!(request["text"]["format"]["type"], "json_schema");
    assert_eq!(request["text"]["format"]["name"], "n");
    let input = request["input"].as_array().unwrap();
    let kinds: Vec<&str> = input
        .iter()
        .map(|i| i["type"].as_str().or(i["role"].as_str()).unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "reasoning",
            "function_call",
            "function_call",
            "function_call_output",
            "user",
            "function_call_output"
        ],
        "{request}"
    );
    assert_eq!(
        input[1],
        json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}], "encrypted_content": "enc"}),
        "only the fields the API takes; an item without encrypted content is left out"
    );
    assert_eq!(input[2]["call_id"], "call_a");
    assert!(input[2].get("id").is_none());
    assert_eq!(
        input[3]["call_id"], "call_quiver_0",
        "a repeated id is replaced"
    );
    assert_eq!(input[3]["name"], "bad_name_");
    assert_eq!(input[3]["arguments"], "{\"x\":1}");
    assert_eq!(
        input[4]["output"],
        json!([{"type": "input_text", "text": "one"},
               {"type": "input_image", "image_url": format!("data:image/png;base64,{PIXEL}"), "detail": "auto"}])
    );
    assert_eq!(
        input[5]["content"][0]["text"],
        "[result of tool call nobody, which no earlier tool call matches]"
    );
    assert_eq!(input[6]["call_id"], "call_quiver_0");
    assert_eq!(
        input[6]["output"],
        "[no result was recorded for this tool call]"
    );
}

#[test]
fn bad_and_surplus_images_become_notes() {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,PHN2Zy8+"}},
        {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "high"}},
    ]})];
    let one = to_responses(
        &json!({"model": "m", "messages": messages.clone()}),
        State::Stateless,
        true,
    );
    assert_eq!(
        one["input"][0]["content"][2]["detail"], "high",
        "an https image is passed on"
    );
    for i in 0..25 {
        messages.push(json!({"role": "assistant", "tool_calls": [
            {"id": format!("c{i}"), "type": "function", "function": {"name": "t", "arguments": "{}"}}]}));
        messages.push(
            json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "",
                             "quiver_content": [image(PIXEL)]}),
        );
    }
    let request = to_responses(
        &json!({"model": "m", "messages": messages}),
        State::Stateless,
        true,
    );
    let input = request["input"].as_array().unwrap();
    let user = &input[0]["content"];
    assert_eq!(
        user[0]["text"],
        "[image not sent: its bytes are not of the declared type]"
    );
    assert_eq!(user[1]["type"], "input_text");
    assert!(
        user[2]["text"]
            .as_str()
            .unwrap()
            .starts_with("[image not sent: a request carries only the newest 20"),
        "the newest images take the room: {user}"
    );
    let images: Vec<&Value> = input
        .iter()
        .filter_map(|i| i["output"].as_array())
        .flatten()
        .filter(|p| p["type"] == "input_image")
        .collect();
    assert_eq!(images.len(), 20);
    assert!(
        input[2]["output"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("[image not sent: a request carries only the newest 20")
    );
}

#[test]
fn a_stored_response_the_host_did_not_hand_out_is_never_continued() {
    for forged in [
        json!([{"type": "response", "id": "resp_of_another_task"}]),
        json!([{"type": "response", "id": "resp_of_another_task", "tag": super::response_tag("resp_x")}]),
        json!([{"type": "response", "id": "resp_of_another_task", "tag": 7}]),
    ] {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "quiver_content": forged},
            {"role": "user", "content": "what did we say?"},
        ]});
        let request = to_responses(&body, State::Chained, true);
        assert!(request.get("previous_response_id").is_none(), "{request}");
        assert_eq!(
            request["input"].as_array().unwrap().len(),
            3,
            "the whole conversation goes"
        );
    }
}

#[test]
fn chained_requests_send_what_follows_the_stored_response() {
    let stored = |id: &str| json!([{"type": "response", "id": id, "tag": super::response_tag(id)}]);
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "quiver_content": stored("resp_1")},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "quiver_content": stored("resp_2"),
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ]});
    let request = to_responses(&body, State::Chained, true);
    assert_eq!(request["store"], true);
    assert!(request.get("include").is_none());
    assert_eq!(request["previous_response_id"], "resp_2");
    assert_eq!(
        request["instructions"], "sys",
        "instructions are not carried over"
    );
    assert_eq!(
        request["input"],
        json!([{"type": "function_call_output", "call_id": "c", "output": "done"}])
    );
    // Nothing new after the stored response: the whole conversation goes.
    let mut body = body;
    body["messages"].as_array_mut().unwrap().truncate(3);
    let request = to_responses(&body, State::Chained, true);
    assert!(request.get("previous_response_id").is_none());
    assert_eq!(request["input"].as_array().unwrap().len(), 2);
}

#[test]
fn answers_become_chat_completions() {
    let out = read(
        json!({
            "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-x",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
                 "encrypted_content": "enc"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me"}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shot", "arguments": "{\"a\":1}"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_1", "name": "shot", "arguments": "{}"},
            ],
            "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 80},
                      "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 12},
                      "total_tokens": 120},
        }),
        State::Stateless,
    );
    let choice = &out["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "let me");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["id"], "call_1");
    assert_eq!(calls[1]["id"], "call_quiver_0");
    assert_eq!(calls[0]["function"]["arguments"], "{\"a\":1}");
    assert_eq!(
        choice["message"]["quiver_content"],
        json!([{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}], "encrypted_content": "enc"}])
    );
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
               "prompt_tokens_details": {"cached_tokens": 80},
               "completion_tokens_details": {"reasoning_tokens": 12}})
    );
    assert_eq!(out["id"], "resp_1");

    let chained = read(
        json!({"id": "resp_9", "status": "completed", "output": [
            {"type": "reasoning", "id": "rs", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]}),
        State::Chained,
    );
    assert_eq!(
        chained["choices"][0]["message"]["quiver_content"],
        json!([{"type": "response", "id": "resp_9", "tag": super::response_tag("resp_9")}])
    );
}

#[test]
fn truncations_refusals_and_failures() {
    let out = read(
        json!({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
               "output": [{"type": "message", "content": [{"type": "output_text", "text": "cut"}]}]}),
        State::Stateless,
    );
    assert_eq!(out["choices"][0]["finish_reason"], "length");
    let out = read(
        json!({"status": "completed", "output": [{"type": "message", "content": [
            {"type": "refusal", "refusal": "I can't help with that."}]}]}),
        State::Stateless,
    );
    assert_eq!(out["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(
        out["choices"][0]["message"]["refusal"],
        "I can't help with that."
    );
    assert_eq!(out["choices"][0]["message"]["content"], Value::Null);
    for bad in [
        json!({"status": "failed", "error": {"code": "server_error", "message": "boom"}}),
        json!({"status": "queued", "output": []}),
        json!({"status": "completed"}),
        json!({"status": "completed", "output": [{"type": "function_call", "call_id": "c"}]}),
    ] {
        let error = from_responses(bad.to_string().as_bytes(), State::Stateless).unwrap_err();
        assert!(!error.to_string().is_empty());
    }
    let failed = from_responses(
        json!({"status": "failed", "error": {"code": "server_error", "message": "boom"}})
            .to_string()
            .as_bytes(),
        State::Stateless,
    )
    .unwrap_err();
    assert_eq!(
        failed.to_string(),
        "the response failed (server_error): boom"
    );
}
