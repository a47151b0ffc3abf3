//! Server-sent events read with a cap, for the legacy HTTP+SSE transport.
//!
//! A generic SSE parser keeps an event until its blank line, so a server that never ends
//! one grows the host without bound. [`SseReader`] parses as bytes arrive and holds at most
//! `cap` bytes of an event's data (plus a field name and a short event type). Past the cap
//! the data is not kept: an [`IdScan`] reads it for the JSON-RPC id instead, so the request
//! it answers can fail at once (as on stdio). Lines end with LF or CRLF.

use super::scan::IdScan;
use crate::defaults;

/// Longest field name looked at (`data`, `event`; others are skipped).
const MAX_FIELD_BYTES: usize = 16;

/// Longest event type kept.
const MAX_EVENT_TYPE_BYTES: usize = 64;

/// One event, or what is known of one over the cap.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::mcp) enum SseEvent {
    Complete {
        /// The `event:` field; `None` means a `message`.
        kind: Option<String>,
        data: String,
    },
    /// Its data went over the cap; `id` is the JSON-RPC id found in it.
    TooLarge {
        id: Option<rmcp::model::RequestId>,
        answer: bool,
        seen: u64,
    },
    /// Its data went on past [`defaults::MCP_MAX_DISCARD_BYTES`] over the cap.
    Endless { seen: u64 },
}

/// Where the reader is within the current line.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// Reading the field name, up to `:`.
    Field,
    /// In the value of a `data` field.
    Data,
    /// In the value of an `event` field.
    EventType,
    /// In a comment or a field that is not used.
    Skip,
}

/// Data over the cap: scanned, not kept.
#[derive(Debug)]
struct Oversize {
    scan: IdScan,
    seen: u64,
    reported: bool,
    ended: bool,
}

#[derive(Debug)]
pub(in crate::mcp) struct SseReader {
    cap: usize,
    line: Line,
    field: Vec<u8>,
    /// Whether the value's leading space (`data: x`) is still to be skipped.
    at_value_start: bool,
    data: Vec<u8>,
    has_data: bool,
    kind: Vec<u8>,
    oversize: Option<Oversize>,
    after_cr: bool,
}

impl SseReader {
    pub(in crate::mcp) fn new(cap: usize) -> Self {
        Self {
            cap,
            line: Line::Field,
            field: Vec::new(),
            at_value_start: false,
            data: Vec::new(),
            has_data: false,
            kind: Vec::new(),
            oversize: None,
            after_cr: false,
        }
    }

    /// Changes the cap for what is read from now on (an event already over the old cap
    /// stays discarded).
    pub(in crate::mcp) fn set_cap(&mut self, cap: usize) {
        self.cap = cap;
    }

    /// Reads `bytes`, appending every event they finish (and an over-cap event as soon as
    /// its id is known) to `out`.
    pub(in crate::mcp) fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        for &byte in bytes {
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(out);
                }
                b'\n' => self.end_line(out),
                _ => self.line_byte(byte, out),
            }
        }
    }

    fn line_byte(&mut self, byte: u8, out: &mut Vec<SseEvent>) {
        match self.line {
            Line::Field if byte == b':' => {
                self.line = match self.field.as_slice() {
                    b"data" => {
                        self.data_separator(out);
                        Line::Data
                    }
                    b"event" => {
                        self.kind.clear();
                        Line::EventType
                    }
                    _ => Line::Skip,
                };
                self.at_value_start = true;
            }
            Line::Field => {
                if self.field.len() < MAX_FIELD_BYTES {
                    self.field.push(byte);
                } else {
                    self.line = Line::Skip;
                }
            }
            _ if self.at_value_start && byte == b' ' => self.at_value_start = false,
            Line::Data => {
                self.at_value_start = false;
                self.data_bytes(&[byte], out);
            }
            Line::EventType => {
                self.at_value_start = false;
                if self.kind.len() < MAX_EVENT_TYPE_BYTES {
                    self.kind.push(byte);
                }
            }
            Line::Skip => {}
        }
    }

    /// A second `data` line joins the first with a newline.
    fn data_separator(&mut self, out: &mut Vec<SseEvent>) {
        if self.has_data {
            self.data_bytes(b"\n", out);
        }
        self.has_data = true;
    }

    fn data_bytes(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        if self.oversize.is_none() && self.data.len().saturating_add(bytes.len()) > self.cap {
            let mut scan = IdScan::default();
            scan.feed(&self.data);
            let seen = self.data.len() as u64;
            self.data = Vec::new();
            self.oversize = Some(Oversize {
                scan,
                seen,
                reported: false,
                ended: false,
            });
        }
        match &mut self.oversize {
            Some(oversize) => {
                if !oversize.reported {
                    oversize.scan.feed(bytes);
                }
                oversize.seen = oversize.seen.saturating_add(bytes.len() as u64);
                let over = oversize.seen.saturating_sub(self.cap as u64);
                if over > defaults::MCP_MAX_DISCARD_BYTES && !oversize.ended {
                    oversize.ended = true;
                    out.push(SseEvent::Endless {
                        seen: oversize.seen,
                    });
                }
                if !oversize.reported
                    && oversize.scan.is_answer()
                    && let Some(id) = oversize.scan.id()
                {
                    oversize.reported = true;
                    out.push(SseEvent::TooLarge {
                        id: Some(id.clone()),
                        answer: true,
                        seen: oversize.seen,
                    });
                }
            }
            None => self.data.extend_from_slice(bytes),
        }
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let blank = self.line == Line::Field && self.field.is_empty();
        if self.line == Line::Field && !self.field.is_empty() {
            // A field with no colon has an empty value.
            if self.field == b"data" {
                self.data_separator(out);
            }
        }
        self.line = Line::Field;
        self.field.clear();
        if blank {
            self.dispatch(out);
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let kind = std::mem::take(&mut self.kind);
        let data = std::mem::take(&mut self.data);
        let has_data = std::mem::replace(&mut self.has_data, false);
        match self.oversize.take() {
            Some(oversize) if !oversize.reported => out.push(SseEvent::TooLarge {
                id: oversize.scan.id().cloned(),
                answer: oversize.scan.is_answer(),
                seen: oversize.seen,
            }),
            Some(_) => {}
            None if has_data => out.push(SseEvent::Complete {
                kind: (!kind.is_empty()).then(|| String::from_utf8_lossy(&kind).into_owned()),
                data: String::from_utf8_lossy(&data).into_owned(),
            }),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::RequestId;

    use super::*;

    fn read(cap: usize, text: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut reader = SseReader::new(cap);
        let mut out = Vec::new();
        for chunk in text.chunks(piece) {
            reader.push(chunk, &mut out);
        }
        out
    }

    fn complete(kind: Option<&str>, data: &str) -> SseEvent {
        SseEvent::Complete {
            kind: kind.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn a_new_cap_applies_to_what_is_read_next() {
        let mut reader = SseReader::new(1024);
        let mut out = Vec::new();
        let event = format!("data: {{\"id\":1,\"result\":\"{}\"}}\n\n", "x".repeat(100));
        reader.push(event.as_bytes(), &mut out);
        reader.set_cap(50);
        reader.push(event.as_bytes(), &mut out);
        assert!(matches!(out[0], SseEvent::Complete { .. }), "{:?}", out[0]);
        assert!(
            matches!(
                &out[1],
                SseEvent::TooLarge {
                    id: Some(RequestId::Number(1)),
                    ..
                }
            ),
            "{:?}",
            out[1]
        );
    }

    #[test]
    fn parses_events_however_the_bytes_are_cut() {
        let text = b": comment\r\nevent: endpoint\r\ndata: /messages?s=1\r\n\r\ndata:{\"a\":1}\ndata: {\"b\":2}\nid: 7\nretry: 10\n\n\n";
        for piece in [1, 2, 5, text.len()] {
            assert_eq!(
                read(1024, text, piece),
                vec![
                    complete(Some("endpoint"), "/messages?s=1"),
                    complete(None, "{\"a\":1}\n{\"b\":2}")
                ],
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn an_event_over_the_cap_is_reported_by_id_at_once_and_not_kept() {
        let mut reader = SseReader::new(100);
        let mut out = Vec::new();
        reader.push(
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"t\":\"",
            &mut out,
        );
        assert!(out.is_empty());
        for _ in 0..1000 {
            reader.push(&[b'x'; 1000], &mut out);
        }
        assert_eq!(out.len(), 1, "reported before the event ends");
        let SseEvent::TooLarge { id, answer, seen } = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!((id, *answer), (&Some(RequestId::Number(9)), true));
        assert!(*seen > 100);
        assert!(reader.data.capacity() <= 256, "{}", reader.data.capacity());
        reader.push(b"\"}}\n\ndata: {\"small\":1}\n\n", &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[1], complete(None, "{\"small\":1}"));

        // No id in it: reported when it ends, with none.
        let out = read(
            10,
            b"data: {\"method\":\"x\",\"params\":\"long long long\"}\n\n",
            3,
        );
        assert!(
            matches!(
                &out[..],
                [SseEvent::TooLarge {
                    id: None,
                    answer: false,
                    ..
                }]
            ),
            "{out:?}"
        );
    }
}
