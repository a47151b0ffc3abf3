//! Finding the JSON-RPC `id` of a server message that is too large or too broken to parse.
//!
//! Such a message must still fail the one request it answers, at once, instead of leaving
//! that request to time out. [`IdScan`] is fed the message in pieces as they are read and
//! keeps only what that needs: nesting depth, whether it is inside a string, the current
//! top-level key (a few bytes) and the value of a top-level `"id"` (a bounded copy). So
//! memory stays constant however long the message is, and the rest of it is never kept.
//! It does not validate JSON; it only has to find the id of a message that is JSON-like.

use rmcp::model::RequestId;

/// Longest `id` value kept; a longer one is not an id this host sent.
const MAX_ID_BYTES: usize = 128;

/// Longest top-level key remembered; only `id`, `result`, `error` and `method` matter.
const MAX_KEY_BYTES: usize = 8;

/// Where the scan is within the top-level object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Top {
    /// Before the opening `{`.
    #[default]
    Start,
    ExpectKey,
    InKey,
    ExpectColon,
    ExpectValue,
    /// Inside a value (nested values deepen `depth`).
    InValue,
    AfterValue,
    /// After the closing `}`, or the text is not an object: nothing more to learn.
    Done,
}

/// Which top-level key the current value belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Field {
    #[default]
    Other,
    Id,
    Result,
    Error,
    Method,
}

/// The top-level facts of a message read so far.
#[derive(Debug, Default)]
pub(in crate::mcp) struct IdScan {
    top: Top,
    depth: u32,
    in_string: bool,
    escaped: bool,
    key: [u8; MAX_KEY_BYTES],
    key_len: usize,
    field: Field,
    id_bytes: Vec<u8>,
    id: Option<RequestId>,
    has_result: bool,
    has_error: bool,
    has_method: bool,
}

impl IdScan {
    /// Feeds the next bytes of the message.
    pub(in crate::mcp) fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if self.top == Top::Done {
                return;
            }
            self.step(byte);
        }
    }

    /// The top-level `id`, once its whole value has been read.
    pub(in crate::mcp) fn id(&self) -> Option<&RequestId> {
        self.id.as_ref()
    }

    /// Whether the message looks like an answer (`result` or `error`, no `method`), so its
    /// id names a request of ours rather than one of the server's.
    pub(in crate::mcp) fn is_answer(&self) -> bool {
        (self.has_result || self.has_error) && !self.has_method
    }

    fn step(&mut self, byte: u8) {
        if self.in_string {
            self.string_byte(byte);
            return;
        }
        match byte {
            b' ' | b'\t' | b'\r' | b'\n' if self.depth == 1 && self.top == Top::InValue => {
                self.end_value();
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            b'"' => {
                self.in_string = true;
                if self.depth == 1 {
                    match self.top {
                        Top::ExpectKey => {
                            self.top = Top::InKey;
                            self.key_len = 0;
                        }
                        Top::ExpectValue => {
                            self.top = Top::InValue;
                            self.capture(byte);
                        }
                        _ => {}
                    }
                }
            }
            b'{' | b'[' => {
                match (self.depth, self.top) {
                    (0, Top::Start) if byte == b'{' => self.top = Top::ExpectKey,
                    (0, _) => self.top = Top::Done,
                    (1, Top::ExpectValue) => self.top = Top::InValue,
                    _ => {}
                }
                self.depth = self.depth.saturating_add(1);
            }
            b'}' | b']' => {
                if self.depth == 1 && self.top == Top::InValue {
                    // A number or literal ends where the object does.
                    self.end_value();
                }
                self.depth = self.depth.saturating_sub(1);
                match self.depth {
                    0 => self.top = Top::Done,
                    1 if self.top == Top::InValue => self.end_value(),
                    _ => {}
                }
            }
            b':' if self.depth == 1 && self.top == Top::ExpectColon => {
                self.top = Top::ExpectValue;
                self.field = self.classify_key();
            }
            b',' if self.depth == 1 => {
                if self.top == Top::InValue {
                    self.end_value();
                }
                self.top = Top::ExpectKey;
            }
            _ if self.depth == 0 => self.top = Top::Done,
            _ if self.depth == 1 => match self.top {
                Top::ExpectValue => {
                    self.top = Top::InValue;
                    self.capture(byte);
                }
                Top::InValue => self.capture(byte),
                _ => {}
            },
            _ => {}
        }
    }

    fn string_byte(&mut self, byte: u8) {
        let closing = !self.escaped && byte == b'"';
        self.escaped = !self.escaped && byte == b'\\';
        if self.depth == 1 {
            match self.top {
                Top::InKey if closing => self.top = Top::ExpectColon,
                Top::InKey => {
                    if let Some(slot) = self.key.get_mut(self.key_len) {
                        *slot = byte;
                    }
                    self.key_len = self.key_len.saturating_add(1);
                }
                Top::InValue => {
                    self.capture(byte);
                    if closing {
                        self.end_value();
                    }
                }
                _ => {}
            }
        }
        if closing {
            self.in_string = false;
        }
    }

    fn classify_key(&mut self) -> Field {
        let field = match self.key.get(..self.key_len) {
            Some(b"id") => Field::Id,
            Some(b"result") => Field::Result,
            Some(b"error") => Field::Error,
            Some(b"method") => Field::Method,
            _ => Field::Other,
        };
        match field {
            Field::Result => self.has_result = true,
            Field::Error => self.has_error = true,
            Field::Method => self.has_method = true,
            Field::Id | Field::Other => {}
        }
        field
    }

    /// Keeps a byte of the `id` value (the first `id` only, and only while short).
    fn capture(&mut self, byte: u8) {
        if self.field == Field::Id && self.id.is_none() && self.id_bytes.len() <= MAX_ID_BYTES {
            self.id_bytes.push(byte);
        }
    }

    fn end_value(&mut self) {
        if self.field == Field::Id && self.id.is_none() && self.id_bytes.len() <= MAX_ID_BYTES {
            self.id = serde_json::from_slice(&self.id_bytes).ok();
        }
        self.id_bytes = Vec::new();
        self.field = Field::Other;
        self.top = Top::AfterValue;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_in_pieces(text: &str, piece: usize) -> IdScan {
        let mut scan = IdScan::default();
        for chunk in text.as_bytes().chunks(piece) {
            scan.feed(chunk);
        }
        scan
    }

    #[test]
    fn finds_the_top_level_id_wherever_it_is_and_however_the_text_is_cut() {
        let cases = [
            (
                r#"{"jsonrpc":"2.0","id":7,"result":{"x":1}}"#,
                Some(RequestId::Number(7)),
                true,
            ),
            (
                r#"{"result":{"id":99,"a":[1,{"id":3}]},"id":"abc"}"#,
                Some(RequestId::String("abc".into())),
                true,
            ),
            (
                r#"{ "error" : {"code":-1}, "id" : -12 }"#,
                Some(RequestId::Number(-12)),
                true,
            ),
            (
                r#"{"id":"a\"b}","result":1}"#,
                Some(RequestId::String("a\"b}".into())),
                true,
            ),
            (
                r#"{"method":"ping","id":4}"#,
                Some(RequestId::Number(4)),
                false,
            ),
            (
                r#"{"method":"notifications/message","params":{"id":5}}"#,
                None,
                false,
            ),
            (r#"{"id":{"nested":1},"result":1}"#, None, true),
            (r#"["id", 5]"#, None, false),
            (r#"garbage "id": 5"#, None, false),
        ];
        for (text, id, answer) in cases {
            for piece in [1, 2, 3, 7, text.len()] {
                let scan = scan_in_pieces(text, piece);
                assert_eq!(scan.id(), id.as_ref(), "{text} in pieces of {piece}");
                assert_eq!(scan.is_answer(), answer, "{text}");
            }
        }
    }

    #[test]
    fn the_id_is_known_before_a_huge_result_ends_and_memory_stays_flat() {
        let mut scan = IdScan::default();
        scan.feed(br#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":""#);
        assert_eq!(scan.id(), Some(&RequestId::Number(42)));
        assert!(scan.is_answer());
        let filler = vec![b'x'; 1 << 20];
        for _ in 0..8 {
            scan.feed(&filler);
        }
        assert!(scan.id_bytes.capacity() <= MAX_ID_BYTES + 1);
        assert_eq!(scan.id(), Some(&RequestId::Number(42)));
    }

    #[test]
    fn an_id_too_long_to_be_ours_is_not_kept() {
        let long = format!(r#"{{"id":"{}","result":1}}"#, "a".repeat(10_000));
        let scan = scan_in_pieces(&long, 100);
        assert_eq!(scan.id(), None);
        assert!(scan.id_bytes.capacity() <= 4 * MAX_ID_BYTES);
    }
}
