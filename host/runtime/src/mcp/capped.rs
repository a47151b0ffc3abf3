//! JSON encoding that stops at a byte cap, so checking a server's answer against its budget
//! never buffers (or, when only the size matters, allocates) more than the budget.

/// What an encoding starts with.
const INITIAL_BYTES: usize = 256;

/// Why [`encode_capped`] gave up.
enum Encode {
    TooLarge,
    Failed(serde_json::Error),
}

/// A server's answer (`what`: "tool `x`", "resource `u`", "prompt `p`", formatted only
/// for an error) as the JSON a guest gets, at most `cap` bytes
/// (`budgets.max_tool_output_bytes`).
pub(super) fn encode_answer(
    value: &impl serde::Serialize,
    cap: u64,
    what: std::fmt::Arguments<'_>,
    server_id: &str,
) -> Result<Vec<u8>, super::McpError> {
    use super::{McpError, McpErrorCode};
    encode_capped(value, cap).map_err(|error| match error {
        Encode::TooLarge => McpError::new(
            McpErrorCode::OutputTooLarge,
            format!(
                "{what} on server `{server_id}` returned more than {cap} bytes once encoded; the limit (budgets.max_tool_output_bytes) is {cap}"
            ),
        ),
        Encode::Failed(e) => McpError::new(
            McpErrorCode::ToolExecFailed,
            format!("cannot encode the answer of {what}: {e}"),
        ),
    })
}

/// `value` as JSON, unless that takes more than `cap` bytes (then it stops writing there).
fn encode_capped(value: &impl serde::Serialize, cap: u64) -> Result<Vec<u8>, Encode> {
    let mut out = Capped {
        // Most answers are small: room for one at once, not a series of regrowths.
        bytes: Vec::with_capacity(
            usize::try_from(cap)
                .unwrap_or(usize::MAX)
                .min(INITIAL_BYTES),
        ),
        left: cap,
    };
    match serde_json::to_writer(&mut out, value) {
        Ok(()) => Ok(out.bytes),
        Err(error) if error.is_io() => Err(Encode::TooLarge),
        Err(error) => Err(Encode::Failed(error)),
    }
}

/// The length of `value` as JSON if at most `cap` bytes, counted without keeping them.
pub(super) fn encoded_len(value: &impl serde::Serialize, cap: u64) -> Option<u64> {
    let mut counter = Counter { len: 0, cap };
    serde_json::to_writer(&mut counter, value).ok()?;
    Some(counter.len)
}

/// A writer that keeps at most `left` more bytes and fails past them.
struct Capped {
    bytes: Vec<u8>,
    left: u64,
}

/// The error both writers fail with past their cap.
#[cold]
fn over_the_cap() -> std::io::Error {
    std::io::Error::other("over the cap")
}

// Both writers implement `write_all`, which serde_json calls for every piece: the default
// loops over `write`, and costs more than the copy.
impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.left = self
            .left
            .checked_sub(buf.len() as u64)
            .ok_or_else(over_the_cap)?;
        self.bytes.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that only counts, failing past `cap`.
struct Counter {
    len: u64,
    cap: u64,
}

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.len = self.len.saturating_add(buf.len() as u64);
        if self.len > self.cap {
            return Err(over_the_cap());
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn encoding_stops_at_the_cap() {
        let value = json!({"text": "x".repeat(100)});
        let exact = serde_json::to_vec(&value).unwrap();
        let len = exact.len() as u64;
        assert_eq!(encoded_len(&value, len), Some(len));
        assert_eq!(encoded_len(&value, len - 1), None);
        assert!(matches!(encode_capped(&value, len), Ok(bytes) if bytes == exact));
        assert!(matches!(
            encode_capped(&value, len - 1),
            Err(Encode::TooLarge)
        ));
    }
}
