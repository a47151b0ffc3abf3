//! Answers the questions an MCP server asks during a tool call, in the guest: the SDK's
//! [`Mcp::answer_questions`] with a plain function. For the host's tests it can also
//! answer badly through the raw `mcp_elicit_fn` callback.
//!
//! Arguments: the server id, the tool, and how to answer: `accept` (name `Ada`, the form's
//! defaults for the rest), `decline`, `wrong-type` (a number for the name), or the raw
//! callbacks `garbage` (not JSON), `huge` (more than the host takes), `wrong-id` (names
//! another question), `slow` (answers after 2 s), `trap` (traps). Prints the tool's
//! result text.

use quiver_guest::mcp::{Answer, Question};
use quiver_guest::{Mcp, Result, sys};
use serde_json::{Map, Value, json};

fn accept(_question: &Question) -> Answer {
    let mut content = Map::new();
    content.insert("name".into(), "Ada".into());
    Answer::Accept(content)
}

fn decline(_question: &Question) -> Answer {
    Answer::Decline
}

fn wrong_type(_question: &Question) -> Answer {
    let mut content = Map::new();
    content.insert("name".into(), 5.into());
    Answer::Accept(content)
}

/// How the raw callbacks misbehave.
static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A raw callback: writes what `MODE` says into the host's buffer.
extern "C" fn raw(q_ptr: i32, q_len: i32, out_ptr: i32, out_len_ptr: i32) -> i32 {
    let question = unsafe {
        std::slice::from_raw_parts(
            std::ptr::with_exposed_provenance::<u8>(q_ptr as usize),
            q_len as usize,
        )
    };
    let question: Value = serde_json::from_slice(question).unwrap_or_default();
    let id = question["id"].as_str().unwrap_or_default().to_owned();
    let len_ptr = std::ptr::with_exposed_provenance_mut::<u32>(out_len_ptr as usize);
    let cap = unsafe { len_ptr.read_unaligned() };
    let answer = match MODE.get().map(String::as_str) {
        Some("garbage") => b"\xffnot json at all".to_vec(),
        Some("huge") => {
            // Claims more than the buffer holds, as a careless guest might.
            unsafe { len_ptr.write_unaligned(cap + 1) };
            return (cap + 1) as i32;
        }
        Some("wrong-id") => json!({"id": format!("{id}-other"), "action": "accept",
                                    "content": {"name": "Mallory"}})
        .to_string()
        .into_bytes(),
        Some("slow") => {
            std::thread::sleep(std::time::Duration::from_secs(2));
            json!({"id": id, "action": "accept", "content": {"name": "Late"}})
                .to_string()
                .into_bytes()
        }
        Some("trap") => std::process::abort(),
        _ => return -22,
    };
    let len = answer.len().min(cap as usize);
    unsafe {
        std::ptr::copy_nonoverlapping(
            answer.as_ptr(),
            std::ptr::with_exposed_provenance_mut::<u8>(out_ptr as usize),
            len,
        );
        len_ptr.write_unaligned(len as u32);
    }
    len as i32
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let server = args.first().map_or("asks", String::as_str);
    let tool = args.get(1).map_or("ask_name", String::as_str);
    let mode = args.get(2).map_or("accept", String::as_str);
    let mcp = Mcp::open(server)?;
    match mode {
        "accept" => mcp.answer_questions(accept)?,
        "decline" => mcp.answer_questions(decline)?,
        "wrong-type" => mcp.answer_questions(wrong_type)?,
        other => {
            MODE.set(other.to_owned()).ok();
            let arena: &'static mut [u8] = Vec::leak(vec![0u8; 128 * 1024]);
            let entry: extern "C" fn(i32, i32, i32, i32) -> i32 = raw;
            let ret = unsafe {
                sys::mcp_elicit_fn(
                    mcp.fd(),
                    entry as usize as i32,
                    arena.as_mut_ptr().expose_provenance() as i32,
                    arena.len() as i32,
                )
            };
            assert_eq!(ret, 0, "mcp_elicit_fn");
        }
    }
    let result = mcp.call_tool(tool, json!({}))?;
    match result.text() {
        // An error answer has no text: show it whole.
        text if text.is_empty() => println!("{}", result.json()),
        text => println!("{text}"),
    }
    Ok(())
}
