//! Text from outside (guests, servers, models, approvers, stored documents) cut to size and
//! made safe to show. Every place that bounds or shows such text uses these, so a guest's
//! log line, a server's error and a name in a table are cut and escaped the same way.

use std::fmt::Write as _;

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// The longest prefix of `text` that is at most `max_bytes` long and ends at a character
/// boundary.
pub fn cut(text: &str, max_bytes: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `value`'s text as [`cut`] cuts it, formatted no further: a huge text is never built
/// whole.
pub fn display_cut(value: &impl std::fmt::Display, max_bytes: usize) -> String {
    struct Capped {
        text: String,
        max_bytes: usize,
    }
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = self.max_bytes - self.text.len();
            self.text.push_str(cut(s, room));
            if s.len() > room {
                return Err(std::fmt::Error);
            }
            Ok(())
        }
    }
    let mut capped = Capped {
        text: String::new(),
        max_bytes,
    };
    // An error only says the text was cut.
    let _ = std::fmt::write(&mut capped, format_args!("{value}"));
    capped.text
}

/// `text` as one line that is safe on a terminal and in a log: every character that could
/// move the cursor, recolour, clear, break the line or make the text read differently from
/// what it holds is shown escaped instead (`\x1b`, `\x0a`, `\u{202e}`); everything else,
/// letters of any script included, is kept.
pub fn printable(text: &str) -> String {
    escaped(text, false)
}

/// [`printable`] for text shown as lines of its own, whose source could print line breaks
/// anyway (a guest's log, a stored document): line feeds and tabs are kept, every other
/// character [`printable`] escapes still is (a carriage return too: it would let one line
/// overwrite itself).
pub fn printable_lines(text: &str) -> String {
    escaped(text, true)
}

fn escaped(text: &str, keep_layout: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !is_unsafe(c) || (keep_layout && matches!(c, '\n' | '\t')) {
            out.push(c);
        } else if c.is_ascii() {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        } else {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
    out
}

/// Whether `c` shown as it is could drive a terminal or disguise text: a control character
/// (C0, DEL, C1), a line or paragraph separator, or a Unicode format character (category
/// Cf: bidi embeddings, overrides, isolates and marks, zero-width characters, the BOM, the
/// soft hyphen, tag characters, interlinear annotation characters...).
fn is_unsafe(c: char) -> bool {
    matches!(
        c.general_category(),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_the_longest_prefix_that_ends_at_a_character() {
        // 1, 2, 3 and 4 bytes per character.
        let text = "aé€😀";
        assert_eq!(cut(text, 0), "");
        assert_eq!(cut(text, 1), "a");
        assert_eq!(cut(text, 2), "a", "inside é");
        assert_eq!(cut(text, 3), "aé");
        assert_eq!(cut(text, 5), "aé", "inside €");
        assert_eq!(cut(text, 6), "aé€");
        assert_eq!(cut(text, 9), "aé€", "inside 😀");
        assert_eq!(cut(text, 10), text);
        assert_eq!(cut(text, usize::MAX), text);
        assert_eq!(cut("", 3), "");
    }

    #[test]
    fn terminal_escapes_and_line_breaks_are_escaped() {
        assert_eq!(
            printable("a\u{1b}[2J\u{1b}]0;t\u{7}b"),
            "a\\x1b[2J\\x1b]0;t\\x07b"
        );
        assert_eq!(printable("x\r\ny\tz"), "x\\x0d\\x0ay\\x09z");
        assert_eq!(
            printable("del\u{7f} nul\u{0} csi\u{9b}"),
            "del\\x7f nul\\x00 csi\\u{9b}"
        );
        assert_eq!(
            printable("one\u{2028}two\u{2029}"),
            "one\\u{2028}two\\u{2029}"
        );
    }

    #[test]
    fn format_characters_are_escaped() {
        // A bidi override and isolate, a mark, zero-width characters, the BOM, a soft
        // hyphen, a tag character and an interlinear annotation anchor.
        assert_eq!(
            printable("ok\u{202e}exe.txt\u{2066}\u{200f}\u{061c}"),
            "ok\\u{202e}exe.txt\\u{2066}\\u{200f}\\u{61c}"
        );
        assert_eq!(
            printable("a\u{200b}b\u{200d}c\u{2060}d\u{feff}"),
            "a\\u{200b}b\\u{200d}c\\u{2060}d\\u{feff}"
        );
        assert_eq!(
            printable("soft\u{ad}tag\u{e0041}\u{e007f}note\u{fff9}"),
            "soft\\u{ad}tag\\u{e0041}\\u{e007f}note\\u{fff9}"
        );
    }

    #[test]
    fn every_format_character_the_old_table_knew_is_escaped() {
        // The hand-kept Unicode 15 table this module replaced, range by range.
        let ranges = [
            ('\u{00AD}', '\u{00AD}'),
            ('\u{0600}', '\u{0605}'),
            ('\u{061C}', '\u{061C}'),
            ('\u{06DD}', '\u{06DD}'),
            ('\u{070F}', '\u{070F}'),
            ('\u{0890}', '\u{0891}'),
            ('\u{08E2}', '\u{08E2}'),
            ('\u{180E}', '\u{180E}'),
            ('\u{200B}', '\u{200F}'),
            ('\u{202A}', '\u{202E}'),
            ('\u{2060}', '\u{2064}'),
            ('\u{2066}', '\u{206F}'),
            ('\u{FEFF}', '\u{FEFF}'),
            ('\u{FFF9}', '\u{FFFB}'),
            ('\u{110BD}', '\u{110BD}'),
            ('\u{110CD}', '\u{110CD}'),
            ('\u{13430}', '\u{1343F}'),
            ('\u{1BCA0}', '\u{1BCA3}'),
            ('\u{1D173}', '\u{1D17A}'),
            ('\u{E0001}', '\u{E0001}'),
            ('\u{E0020}', '\u{E007F}'),
        ];
        for c in ranges.into_iter().flat_map(|(first, last)| first..=last) {
            assert!(is_unsafe(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn letters_marks_symbols_and_spaces_stay() {
        let text = "naïve ✓ 名前 שלום مرحبا e\u{301} 👍🏽 \u{a0}\\x1b";
        assert_eq!(printable(text), text);
        assert_eq!(printable_lines(text), text);
    }

    #[test]
    fn lines_keep_line_feeds_and_tabs_and_escape_the_rest_alike() {
        assert_eq!(printable_lines("a\n\nb\tc\n"), "a\n\nb\tc\n");
        let hostile = "x\r\u{1b}[31m\u{2028}\u{202e}\u{200d}\u{feff}\u{e0041}";
        assert_eq!(printable_lines(hostile), printable(hostile));
    }
}
