//! The Gemini translation: requests the API accepts, answers the loop reads.

use serde_json::{Value, json};

use super::{ImageModels, Options, from_gemini, model_segment, to_gemini};

const PIXEL: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";

fn image(media_type: &str, data: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
}

fn loop_body() -> Value {
    json!({
        "model": "gemini-3-pro",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "look"},
            {"role": "assistant", "content": "", "quiver_content": [
                {"type": "thought_signature", "tool_call_id": "a", "signature": "sig-a"}],
             "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "shot", "arguments": "{\"n\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "9lives", "arguments": "nope"}},
            ]},
            {"role": "tool", "tool_call_id": "a", "content": "one",
             "quiver_content": [image("image/png", PIXEL), image("image/gif", "R0lGODlhAQABAAAAACw=")]},
            {"role": "tool", "tool_call_id": "zzz", "content": "stray"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "shot", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}},
            {"type": "function", "function": {"name": "9lives", "parameters": {"type": "object"}}},
        ],
        "tool_choice": "required",
        "max_tokens": 50, "stop": ["a", "b", "c", "d", "e", "f"], "temperature": 1.5,
    })
}

#[test]
fn a_tool_loop_becomes_turns_with_images_inside_the_response() {
    let request = to_gemini(
        &loop_body(),
        &Options {
            images_in_results: true,
        },
    )
    .unwrap();
    assert_eq!(
        request["systemInstruction"],
        json!({"parts": [{"text": "be brief"}]})
    );
    assert_eq!(
        request["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY"}})
    );
    assert_eq!(request["generationConfig"]["maxOutputTokens"], 50);
    assert_eq!(request["generationConfig"]["temperature"], 1.5);
    assert_eq!(
        request["generationConfig"]["stopSequences"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    let declarations = &request["tools"][0]["functionDeclarations"];
    assert_eq!(
        declarations[0]["parameters"]["properties"]["n"]["type"],
        "INTEGER"
    );
    assert_eq!(
        declarations[1],
        json!({"name": "_9lives"}),
        "no parameters, a name Gemini takes"
    );
    let contents = request["contents"].as_array().unwrap();
    let roles: Vec<&Value> = contents.iter().map(|c| &c["role"]).collect();
    assert_eq!(roles, ["user", "model", "user"]);
    let calls = &contents[1]["parts"];
    assert_eq!(
        calls[0]["functionCall"],
        json!({"id": "a", "name": "shot", "args": {"n": 1}})
    );
    assert_eq!(calls[0]["thoughtSignature"], "sig-a");
    assert_eq!(calls[1]["functionCall"]["args"], json!({}));
    assert!(
        calls[1].get("thoughtSignature").is_none(),
        "only the first call carries one"
    );
    let answers = contents[2]["parts"].as_array().unwrap();
    assert_eq!(answers[0]["functionResponse"]["id"], "a");
    assert_eq!(
        answers[0]["functionResponse"]["response"],
        json!({"output": "one"})
    );
    assert_eq!(
        answers[0]["functionResponse"]["parts"],
        json!([{"inlineData": {"mimeType": "image/png", "data": PIXEL}}])
    );
    assert_eq!(
        answers[1]["functionResponse"]["id"], "b",
        "every call answered, in order"
    );
    assert_eq!(answers[1]["functionResponse"]["name"], "_9lives");
    assert!(answers[1]["functionResponse"]["response"]["error"].is_string());
    let texts: Vec<&str> = answers[2..]
        .iter()
        .filter_map(|p| p["text"].as_str())
        .collect();
    assert_eq!(
        texts,
        [
            "[result of tool call zzz, which no earlier tool call matches]",
            "stray",
            "[image not sent: Gemini does not take image/gif]"
        ]
    );

    let older = to_gemini(
        &loop_body(),
        &Options {
            images_in_results: false,
        },
    )
    .unwrap();
    assert!(
        older["contents"][2]["parts"][0]["functionResponse"]
            .get("parts")
            .is_none()
    );
    assert!(
        !older.to_string().contains(PIXEL),
        "no image for a model that refuses them"
    );
}

#[test]
fn calls_the_model_did_not_make_get_the_placeholder_signature() {
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
    ]});
    let request = to_gemini(
        &body,
        &Options {
            images_in_results: false,
        },
    )
    .unwrap();
    assert_eq!(
        request["contents"][1]["parts"][0]["thoughtSignature"],
        "skip_thought_signature_validator"
    );
    assert_eq!(
        request["contents"].as_array().unwrap().len(),
        3,
        "an answer is added"
    );
}

#[test]
fn schemas_gemini_cannot_express_are_an_error_naming_the_tool() {
    let mut body = loop_body();
    body["tools"][0]["function"]["parameters"]["properties"]["meta"] = json!({"type": "object"});
    let error = to_gemini(
        &body,
        &Options {
            images_in_results: true,
        },
    )
    .unwrap_err();
    assert!(
        error.starts_with("the parameters of tool `shot`: .meta: an object without properties"),
        "{error}"
    );
}

#[test]
fn image_models_and_model_names() {
    let models = ImageModels::new(None);
    assert!(models.options("gemini-3-pro-preview").images_in_results);
    assert!(models.options("models/gemini-3-flash").images_in_results);
    assert!(!models.options("gemini-2.5-flash").images_in_results);
    let custom = ImageModels::new(Some(&["my-*".to_owned()][..]));
    assert!(custom.options("my-model").images_in_results);
    assert!(!custom.options("gemini-3-pro").images_in_results);
    assert_eq!(
        model_segment("models/gemini-2.5-flash"),
        Ok("gemini-2.5-flash")
    );
    for bad in ["../x", "a/b", "a?b", "", ".hidden", "a:b"] {
        assert!(model_segment(bad).is_err(), "{bad}");
    }
}

fn read(response: Value) -> Value {
    let completion = from_gemini(response.to_string().as_bytes(), &["9lives", "shot"]).unwrap();
    serde_json::to_value(completion).unwrap()
}

#[test]
fn answers_become_chat_completions() {
    let out = read(json!({
        "candidates": [{"content": {"role": "model", "parts": [
            {"text": "thinking...", "thought": true},
            {"text": "let me"},
            {"functionCall": {"name": "_9lives", "args": {"a": 1}}, "thoughtSignature": "sig"},
            {"functionCall": {"id": "g1", "name": "shot"}},
        ]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "thoughtsTokenCount": 7,
                          "cachedContentTokenCount": 4, "totalTokenCount": 22},
        "modelVersion": "gemini-3-pro", "responseId": "r1",
    }));
    let message = &out["choices"][0]["message"];
    assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(message["content"], "let me");
    assert_eq!(message["tool_calls"][0]["id"], "call_quiver_0");
    assert_eq!(
        message["tool_calls"][0]["function"]["name"], "9lives",
        "mapped back"
    );
    assert_eq!(
        message["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    assert_eq!(message["tool_calls"][1]["id"], "g1");
    assert_eq!(message["tool_calls"][1]["function"]["arguments"], "{}");
    assert_eq!(
        message["quiver_content"],
        json!([{"type": "thought_signature", "tool_call_id": "call_quiver_0", "signature": "sig"}])
    );
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22,
               "prompt_tokens_details": {"cached_tokens": 4},
               "completion_tokens_details": {"reasoning_tokens": 7}})
    );
    assert_eq!(out["model"], "gemini-3-pro");
}

#[test]
fn blocks_truncations_and_bad_bodies() {
    let out = read(json!({"promptFeedback": {"blockReason": "SAFETY"}}));
    assert_eq!(out["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(out["choices"][0]["message"]["content"], "");
    assert_eq!(
        out["choices"][0]["message"]["refusal"],
        "the prompt was blocked (SAFETY)"
    );
    for (reason, expected) in [
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("MALFORMED_FUNCTION_CALL", "malformed_function_call"),
    ] {
        let out = read(
            json!({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason}]}),
        );
        assert_eq!(out["choices"][0]["finish_reason"], expected, "{reason}");
    }
    let empty = read(json!({"candidates": [{"finishReason": "SAFETY"}]}));
    assert_eq!(empty["choices"][0]["message"]["content"], "");
    assert!(from_gemini(b"{}", &[]).is_err());
    assert!(from_gemini(b"<html>", &[]).is_err());
    assert!(
        from_gemini(
            br#"{"candidates": [{"content": {"parts": [{"functionCall": {}}]}}]}"#,
            &[]
        )
        .is_err()
    );
}
