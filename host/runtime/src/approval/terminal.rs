//! [`TerminalApprover`]: asks a person on the controlling terminal (`quiver run --approve
//! prompt`), about calls and about servers' questions (accepting a form's defaults).
//!
//! It opens `/dev/tty`, never the guest's stdin or stdout, so a guest cannot answer its own
//! request through them. Every name shown (task, server, tool, argument keys) may come from
//! a guest or a server: it is shown with control and Unicode format characters (escapes,
//! bidi overrides) removed, and the question starts by resetting the terminal's colours and
//! attributes on a new line. That is all it can do: a guest whose stdout shares the terminal
//! can still print text that looks like a question, or scroll the real one away between
//! its lines, so prompt mode is for guests the person watching trusts to that extent.
//! Reading is non-blocking (tokio's `AsyncFd`), so a request that times out or whose task
//! ends stops waiting at once and leaves no thread blocked on the terminal.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;

use tokio::io::unix::AsyncFd;
use tokio::sync::Mutex;

use super::{
    ApprovalDecision, ApprovalFuture, ApprovalRequest, Approver, ElicitationAnswer,
    ElicitationFuture, ElicitationRequest, accept_defaults,
};
use crate::defaults::MAX_TERMINAL_ANSWER_BYTES;
use crate::text::{cut, printable};

/// Ends whatever a guest's output left set: attributes and colours (SGR 0), a scroll
/// region (DECSTBM), a hidden cursor, and a charset switch (SI: back to G0).
const RESET: &str = "\x1b[0m\x1b[r\x1b[?25h\x0f";

/// Asks on `/dev/tty`, one request at a time; `y` or `yes` approves, anything else
/// denies. Without a terminal every request is denied, saying why.
#[derive(Debug, Default)]
pub struct TerminalApprover {
    /// One question on the terminal at a time.
    turn: Mutex<()>,
}

impl TerminalApprover {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Approver for TerminalApprover {
    fn ask(&self, request: ApprovalRequest) -> ApprovalFuture<'_> {
        Box::pin(async move {
            let _turn = self.turn.lock().await;
            match prompt(&question(&request)).await {
                Ok(answer) if is_yes(&answer) => ApprovalDecision::approve(),
                Ok(_) => ApprovalDecision::deny("denied at the terminal"),
                Err(e) => ApprovalDecision::deny(format!(
                    "no terminal to ask on (/dev/tty: {e}); use --approve allow or deny"
                )),
            }
        })
    }

    /// Offers the form's defaults for acceptance; a form with a required field that has
    /// none, or no terminal, is left to the host (declined). No field is typed in: the
    /// terminal may be shared with the guest's output.
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture<'_> {
        Box::pin(async move {
            let defaults = accept_defaults(&request.requested_schema)?;
            let _turn = self.turn.lock().await;
            match prompt(&elicitation_question(&request, &defaults)).await {
                Ok(answer) if is_yes(&answer) => Some(defaults),
                Ok(_) => Some(ElicitationAnswer::Decline),
                Err(_) => None,
            }
        })
    }
}

fn elicitation_question(request: &ElicitationRequest, defaults: &ElicitationAnswer) -> String {
    let seconds = request
        .expires_at
        .duration_since(request.requested_at)
        .map_or(0, |d| d.as_secs());
    let fields: Vec<String> = match defaults {
        ElicitationAnswer::Accept { content } => content
            .iter()
            .map(|(name, value)| {
                format!(
                    "{} = {}",
                    printable(cut(name, 64)),
                    printable(cut(&value.to_string(), 64))
                )
            })
            .collect(),
        _ => Vec::new(),
    };
    format!(
        "{RESET}\nquiver: MCP server `{}` asks task `{}` (during {} `{}`):\n  {}\n  answer: {{{}}}\nAccept? [y/N] (declined in {seconds} s) ",
        printable(&request.server_id),
        printable(&request.task_id),
        request.method,
        printable(&request.name),
        request.message,
        fields.join(", "),
    )
}

fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

fn question(request: &ApprovalRequest) -> String {
    let seconds = request
        .expires_at
        .duration_since(request.requested_at)
        .map_or(0, |d| d.as_secs());
    let keys: Vec<String> = request
        .arguments
        .keys
        .iter()
        .map(|k| printable(k))
        .collect();
    let more = match request.arguments.keys_omitted {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "{RESET}\nquiver: task `{}` wants to call tool `{}` of MCP server `{}`\n  arguments: keys [{}]{more}, {} bytes\nApprove? [y/N] (denied in {seconds} s) ",
        printable(&request.task_id),
        printable(&request.tool),
        printable(&request.server_id),
        keys.join(", "),
        request.arguments.bytes,
    )
}

/// Writes `question` to the terminal and reads one answer line.
async fn prompt(question: &str) -> io::Result<String> {
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/dev/tty")?;
    // An answer typed for an earlier question (one that timed out) must not answer this one.
    // SAFETY: tcflush on an fd the File owns; an error (not a terminal) changes nothing.
    unsafe { libc::tcflush(tty.as_raw_fd(), libc::TCIFLUSH) };
    tty.write_all(question.as_bytes())?;
    // SAFETY: the File owns its fd, open until the AsyncFd (which owns the File) drops.
    let tty = unsafe { AsyncFd::register(tty) }.map_err(io::Error::from)?;
    let mut line = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        let mut ready = tty.readable().await?;
        let read = ready.try_io(|fd| {
            let mut file: &File = fd.get_ref();
            file.read(&mut buf)
        });
        match read {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => {
                line.extend_from_slice(&buf[..n]);
                if line.contains(&b'\n') || line.len() >= MAX_TERMINAL_ANSWER_BYTES {
                    break;
                }
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    Ok(String::from_utf8_lossy(&line[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::observe::{ArgumentsSummary, Via};

    #[test]
    fn the_question_shows_names_without_escapes_and_keys_without_values() {
        let now = SystemTime::now();
        let request = ApprovalRequest {
            id: "1".into(),
            task_id: Arc::from("t"),
            principal: None,
            client: None,
            session_fd: Some(3),
            via: Via::Chat,
            server_id: "fs".into(),
            tool: "del\u{1b}[31mete\u{202e}txt.exe".into(),
            arguments: ArgumentsSummary::of_json_text(r#"{"path": "/top/secret"}"#),
            requested_at: now,
            expires_at: now + Duration::from_secs(30),
        };
        let q = question(&request);
        assert!(q.starts_with("\x1b[0m"), "resets the terminal first: {q:?}");
        let shown = q.strip_prefix(RESET).unwrap();
        assert!(shown.starts_with('\n'), "{q:?}");
        assert!(
            shown.contains(r"tool `del\x1b[31mete\u{202e}txt.exe` of MCP server `fs`"),
            "{q}"
        );
        assert!(
            q.contains("keys [path], 23 bytes") && q.contains("denied in 30 s"),
            "{q}"
        );
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\u{202e}') && !q.contains("secret"),
            "{q}"
        );
        assert!(is_yes(" Yes\n") && is_yes("y") && !is_yes("") && !is_yes("no"));
    }

    #[test]
    fn a_servers_question_shows_its_defaults_without_escapes() {
        let now = SystemTime::now();
        let schema = serde_json::json!({"type": "object", "properties": {
            "na\u{1b}me": {"type": "string", "default": "x\u{202e}y"}}});
        let request = ElicitationRequest {
            id: "1".into(),
            task_id: Arc::from("t"),
            principal: None,
            client: None,
            via: Via::McpCall,
            server_id: "fs".into(),
            method: "tools/call",
            name: "ask".into(),
            message: "Who?".into(),
            requested_schema: schema.clone(),
            requested_at: now,
            expires_at: now + Duration::from_secs(30),
        };
        let defaults = accept_defaults(&schema).unwrap();
        let q = elicitation_question(&request, &defaults);
        assert!(q.starts_with(RESET), "{q:?}");
        assert!(q.contains("Who?") && q.contains("declined in 30 s"), "{q}");
        let shown = q.strip_prefix(RESET).unwrap();
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\u{202e}'),
            "{q}"
        );
    }
}
