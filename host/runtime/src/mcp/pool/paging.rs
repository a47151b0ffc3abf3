//! Reading every page of a listing, within a byte cap and a page cap.

use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{CacheScope, PaginatedRequestParams, Tool};

use super::Connection;
use super::failure::{CallPhase, service_failed};
use crate::defaults;
use crate::mcp::capped::encoded_len;
use crate::mcp::{McpError, McpErrorCode};

/// What a listing's pages said about caching it (SEP-2549): the shortest `ttlMs` of any
/// page, and whether any page was `cacheScope: private`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CacheHint {
    pub(super) ttl: Option<Duration>,
    pub(super) private: bool,
}

impl CacheHint {
    fn add(&mut self, ttl_ms: Option<u64>, scope: Option<CacheScope>) {
        if let Some(ms) = ttl_ms {
            let ttl = Duration::from_millis(ms);
            self.ttl = Some(self.ttl.map_or(ttl, |t| t.min(ttl)));
        }
        self.private |= scope == Some(CacheScope::Private);
    }

    /// How long the listing may be served: the server's TTL, at most `host_max`.
    pub(super) fn ttl(&self, host_max: Duration) -> Duration {
        self.ttl.map_or(host_max, |ttl| ttl.min(host_max))
    }

    /// How long a listing kept only on the server's word may be served: its TTL, at most
    /// `host_max`; none without one.
    pub(super) fn given_ttl(&self, host_max: Duration) -> Duration {
        self.ttl.map_or(Duration::ZERO, |ttl| ttl.min(host_max))
    }
}

/// One page of a listing other than tools: its items, the next page's cursor and the
/// page's cache hints.
pub(super) struct Page<T> {
    pub(super) items: Vec<T>,
    pub(super) next: Option<String>,
    pub(super) ttl_ms: Option<u64>,
    pub(super) scope: Option<CacheScope>,
}

/// Every page of the server's `tools/list`, the tools' JSON at most `cap` bytes in all
/// (each page was capped by the transport as it was read), in the server's order, and
/// what the pages said about caching them.
pub(super) async fn list_all_pages(
    conn: &Connection,
    server_id: &str,
    cap: u64,
    phase: &CallPhase,
) -> Result<(Vec<Tool>, CacheHint), McpError> {
    let mut hint = CacheHint::default();
    let mut tools = Vec::new();
    let mut cursor = None;
    let mut total: u64 = 0;
    for _ in 0..defaults::MAX_TOOL_LIST_PAGES {
        let page = conn
            .service
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await
            .map_err(|e| service_failed(server_id, "tools/list", e, phase))?;
        let left = cap.saturating_sub(total);
        total = match encoded_len(&page.tools, left) {
            Some(len) => total.saturating_add(len),
            None => {
                return Err(McpError::new(
                    McpErrorCode::OutputTooLarge,
                    format!(
                        "server `{server_id}` listed more than {cap} bytes of tools (after {} tools); the limit (budgets.max_tool_list_bytes) is {cap}",
                        tools.len()
                    ),
                ));
            }
        };
        hint.add(page.ttl_ms, page.cache_scope);
        tools.extend(page.tools);
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok((tools, hint));
        }
    }
    tracing::warn!(
        pages = defaults::MAX_TOOL_LIST_PAGES,
        "tools/list kept paging; using what was read"
    );
    Ok((tools, hint))
}

/// Reads every page of a `what` listing, at most `cap` bytes of items (encoded) and
/// [`defaults::MAX_TOOL_LIST_PAGES`] pages (a server paging past that gets what was read),
/// in the server's order, and what the pages said about caching them.
pub(super) async fn list_pages<T, F, Fut>(
    server_id: &str,
    what: &str,
    cap: u64,
    phase: &CallPhase,
    mut page: F,
) -> Result<(Vec<T>, CacheHint), McpError>
where
    T: serde::Serialize,
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<Page<T>, ServiceError>>,
{
    let mut hint = CacheHint::default();
    let mut items = Vec::new();
    let mut cursor = None;
    let mut total: u64 = 0;
    for _ in 0..defaults::MAX_TOOL_LIST_PAGES {
        let Page {
            items: listed,
            next,
            ttl_ms,
            scope,
        } = page(cursor)
            .await
            .map_err(|e| service_failed(server_id, what, e, phase))?;
        total = match encoded_len(&listed, cap.saturating_sub(total)) {
            Some(len) => total.saturating_add(len),
            None => {
                return Err(McpError::new(
                    McpErrorCode::OutputTooLarge,
                    format!(
                        "server `{server_id}` answered {what} with more than {cap} bytes (after {} items); the limit (budgets.max_tool_list_bytes) is {cap}",
                        items.len()
                    ),
                ));
            }
        };
        hint.add(ttl_ms, scope);
        items.extend(listed);
        cursor = next;
        if cursor.is_none() {
            return Ok((items, hint));
        }
    }
    tracing::warn!(
        pages = defaults::MAX_TOOL_LIST_PAGES,
        what,
        "kept paging; using what was read"
    );
    Ok((items, hint))
}
