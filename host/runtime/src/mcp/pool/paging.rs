//! Reading every page of a listing, within a byte cap and a page cap.

use rmcp::ServiceError;
use rmcp::model::{PaginatedRequestParams, Tool};

use super::Connection;
use super::failure::{CallPhase, service_failed};
use crate::defaults;
use crate::mcp::capped::encoded_len;
use crate::mcp::{McpError, McpErrorCode};

/// Every page of the server's `tools/list`, the tools' JSON at most `cap` bytes in all
/// (each page was capped by the transport as it was read).
pub(super) async fn list_all_pages(
    conn: &Connection,
    server_id: &str,
    cap: u64,
    phase: &CallPhase,
) -> Result<Vec<Tool>, McpError> {
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
        tools.extend(page.tools);
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
    tracing::warn!(
        pages = defaults::MAX_TOOL_LIST_PAGES,
        "tools/list kept paging; using what was read"
    );
    Ok(tools)
}

/// Reads every page of a `what` listing, at most `cap` bytes of items (encoded) and
/// [`defaults::MAX_TOOL_LIST_PAGES`] pages; a server paging past that gets what was read.
pub(super) async fn list_pages<T, F, Fut>(
    server_id: &str,
    what: &str,
    cap: u64,
    phase: &CallPhase,
    mut page: F,
) -> Result<Vec<T>, McpError>
where
    T: serde::Serialize,
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), ServiceError>>,
{
    let mut items = Vec::new();
    let mut cursor = None;
    let mut total: u64 = 0;
    for _ in 0..defaults::MAX_TOOL_LIST_PAGES {
        let (listed, next) = page(cursor)
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
        items.extend(listed);
        cursor = next;
        if cursor.is_none() {
            return Ok(items);
        }
    }
    tracing::warn!(
        pages = defaults::MAX_TOOL_LIST_PAGES,
        what,
        "kept paging; using what was read"
    );
    Ok(items)
}
