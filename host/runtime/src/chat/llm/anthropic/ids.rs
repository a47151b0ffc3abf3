//! Tool call ids the API accepts: `^[a-zA-Z0-9_-]+$`, unique in a request.
//!
//! A model's id is kept when it is valid, short (at most
//! [`defaults::ANTHROPIC_TOOL_ID_MAX_BYTES`]) and not taken yet; otherwise the call gets
//! `toolu_quiver_<n>`, never one of the valid ids around it.

use std::collections::HashSet;

use crate::defaults;

/// Whether the API takes `id` as a tool call id (and the host echoes it as is).
pub(super) fn is_valid(id: &str) -> bool {
    (1..=defaults::ANTHROPIC_TOOL_ID_MAX_BYTES).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Hands out unique ids.
pub(super) struct Ids {
    /// Every valid id of the request, reserved so no replacement takes one.
    reserved: HashSet<String>,
    claimed: HashSet<String>,
    next: u64,
}

impl Ids {
    /// Ids for a request whose calls carry `ids` (the valid ones are reserved).
    pub(super) fn new<'a>(ids: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            reserved: ids
                .into_iter()
                .filter(|id| is_valid(id))
                .map(str::to_owned)
                .collect(),
            claimed: HashSet::new(),
            next: 0,
        }
    }

    /// `id` when it is valid and not claimed yet, else a fresh one; claims it.
    pub(super) fn claim(&mut self, id: Option<&str>) -> String {
        if let Some(id) = id.filter(|id| is_valid(id))
            && self.claimed.insert(id.to_owned())
        {
            return id.to_owned();
        }
        loop {
            let fresh = format!("toolu_quiver_{}", self.next);
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
        let mut ids = Ids::new(given.iter().flatten().copied());
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
        assert!(is_valid("toolu_01A-b_9"));
        assert!(!is_valid("tool.use"));
        assert!(!is_valid("é"));
    }
}
