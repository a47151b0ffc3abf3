//! Tool call ids a translated API accepts: `^[a-zA-Z0-9_-]+$`, short, unique in a request.
//!
//! A model's id is kept when it is valid, at most the wire's [`IdRule::max_bytes`] long
//! and not taken yet; otherwise the call gets `<prefix><n>`, never one of the valid ids
//! around it.

use std::collections::HashSet;

use crate::defaults;

/// What ids one wire format takes, and how its replacements are named.
#[derive(Clone, Copy, Debug)]
pub(super) struct IdRule {
    pub(super) max_bytes: usize,
    pub(super) prefix: &'static str,
}

/// Anthropic `tool_use` ids.
pub(super) const ANTHROPIC: IdRule = IdRule {
    max_bytes: defaults::ANTHROPIC_TOOL_ID_MAX_BYTES,
    prefix: "toolu_quiver_",
};

/// OpenAI Responses `call_id`s and Gemini function call ids.
pub(super) const CALL: IdRule = IdRule {
    max_bytes: defaults::LLM_TOOL_ID_MAX_BYTES,
    prefix: "call_quiver_",
};

impl IdRule {
    /// Whether the API takes `id` as a tool call id (and the host echoes it as is).
    pub(super) fn is_valid(self, id: &str) -> bool {
        (1..=self.max_bytes).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    /// A tool call id given as raw JSON, when it is a string this rule takes; anything
    /// much longer is not even parsed.
    pub(super) fn parse_raw(self, raw: &str) -> Option<String> {
        // Quotes, and room for a few escapes.
        if raw.len() > self.max_bytes * 2 + 2 {
            return None;
        }
        serde_json::from_str::<String>(raw)
            .ok()
            .filter(|id| self.is_valid(id))
    }
}

/// Hands out unique ids.
pub(super) struct Ids {
    rule: IdRule,
    /// Every valid id of the request, reserved so no replacement takes one.
    reserved: HashSet<String>,
    claimed: HashSet<String>,
    next: u64,
}

impl Ids {
    /// Ids for a request whose calls carry `ids` (the valid ones are reserved).
    pub(super) fn new<'a>(rule: IdRule, ids: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            rule,
            reserved: ids
                .into_iter()
                .filter(|id| rule.is_valid(id))
                .map(str::to_owned)
                .collect(),
            claimed: HashSet::new(),
            next: 0,
        }
    }

    /// `id` when it is valid and not claimed yet, else a fresh one; claims it.
    pub(super) fn claim(&mut self, id: Option<&str>) -> String {
        if let Some(id) = id.filter(|id| self.rule.is_valid(id))
            && self.claimed.insert(id.to_owned())
        {
            return id.to_owned();
        }
        loop {
            let fresh = format!("{}{}", self.rule.prefix, self.next);
            self.next = self.next.saturating_add(1);
            if !self.reserved.contains(&fresh) && self.claimed.insert(fresh.clone()) {
                return fresh;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_long_and_repeated_ids_are_replaced_by_fresh_ones() {
        let long = "a".repeat(defaults::ANTHROPIC_TOOL_ID_MAX_BYTES + 1);
        let given = [
            Some("x"),
            Some("x"),
            None,
            Some(""),
            Some("a b"),
            Some(long.as_str()),
            Some("toolu_quiver_0"),
        ];
        let mut ids = Ids::new(ANTHROPIC, given.iter().flatten().copied());
        let out: Vec<String> = given.iter().map(|id| ids.claim(*id)).collect();
        assert_eq!(
            out,
            [
                "x",
                "toolu_quiver_1",
                "toolu_quiver_2",
                "toolu_quiver_3",
                "toolu_quiver_4",
                "toolu_quiver_5",
                "toolu_quiver_0",
            ],
            "a replacement never takes a valid id of the request"
        );
        assert!(ANTHROPIC.is_valid("toolu_01A-b_9"));
        assert!(!ANTHROPIC.is_valid("tool.use"));
        assert!(!ANTHROPIC.is_valid("é"));
        assert!(ANTHROPIC.is_valid(&"a".repeat(100)));
        assert!(
            !CALL.is_valid(&"a".repeat(100)),
            "Responses call ids are shorter"
        );
        let mut ids = Ids::new(CALL, []);
        assert_eq!(ids.claim(None), "call_quiver_0");
    }
}
