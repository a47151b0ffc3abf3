//! The web admin page at `/admin/`: three static files embedded in the binary (no build
//! step, no framework, nothing fetched from elsewhere), served without a token because
//! they hold no data. The page asks for a client's token, reads its roles from
//! `/v1/whoami`, and calls the admin API ([`admin`](super::admin)) with `registry` and
//! `/v1/approvals` with `approve` (polling the pending calls while that view is shown) from
//! the browser, so the APIs stay the one place that checks the roles and the records.
//!
//! Everything the API returns is hostile to the page (ids, documents, errors, tool
//! descriptions): the script renders it through DOM text only. The headers back that up:
//! a Content-Security-Policy allowing only this origin's script and style (no inline code,
//! no framing), `nosniff`, `DENY` framing and `no-store`.

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::error::ApiError;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Only this origin's files; `connect-src 'self'` is the admin API.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// `GET /admin`: the page lives at `/admin/`, so that its relative asset paths resolve.
pub(super) async fn redirect() -> Redirect {
    Redirect::permanent("/admin/")
}

/// `GET /admin/`: the page.
pub(super) async fn index() -> Response {
    page_file(INDEX_HTML, "text/html; charset=utf-8")
}

/// `GET /admin/assets/{file}`: the script and the style sheet; anything else is 404.
pub(super) async fn asset(file: Result<Path<String>, PathRejection>) -> Response {
    let file = file.map(|Path(file)| file).unwrap_or_default();
    match file.as_str() {
        "app.js" => page_file(APP_JS, "text/javascript; charset=utf-8"),
        "app.css" => page_file(APP_CSS, "text/css; charset=utf-8"),
        _ => ApiError::not_found("asset", "file").into_response(),
    }
}

fn page_file(body: &'static str, content_type: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        // A new binary may ship another page; never run an old script against it.
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy forbids inline code, so the page must carry none: it would not run.
    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let lower = INDEX_HTML.to_ascii_lowercase();
        for tag in lower.split("<script").skip(1) {
            let open = tag.split('>').next().unwrap_or_default();
            assert!(open.contains("src="), "inline <script{open}>");
            assert!(
                tag.trim_start_matches(|c| c != '>')
                    .starts_with("></script>")
            );
        }
        assert!(!lower.contains("<style"), "inline <style>");
        assert!(!lower.contains(" style="), "a style attribute");
        assert!(!lower.contains("javascript:"), "a javascript: URL");
        for attribute in lower.split_whitespace() {
            assert!(
                !(attribute.starts_with("on") && attribute.contains('=')),
                "an inline handler: {attribute}"
            );
        }
        assert!(INDEX_HTML.contains("assets/app.js") && INDEX_HTML.contains("assets/app.css"));
    }

    /// Data reaches the page only as text: the script never parses strings as HTML.
    #[test]
    fn the_script_never_parses_html() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "setTimeout(\"",
        ] {
            assert!(!APP_JS.contains(sink), "app.js uses {sink}");
        }
    }

    #[tokio::test]
    async fn assets_have_their_types_and_the_security_headers() {
        for (file, kind) in [("app.js", "text/javascript"), ("app.css", "text/css")] {
            let response = asset(Ok(Path(file.to_owned()))).await;
            assert_eq!(response.status(), StatusCode::OK);
            let headers = response.headers();
            assert!(
                headers[header::CONTENT_TYPE]
                    .to_str()
                    .is_ok_and(|v| v.starts_with(kind))
            );
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
            assert_eq!(headers[header::CONTENT_SECURITY_POLICY], CSP);
        }
        for other in ["index.html", "../mod.rs", "app.js.map", ""] {
            let response = asset(Ok(Path(other.to_owned()))).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{other}");
        }
        let index = index().await;
        assert_eq!(index.headers()[header::CACHE_CONTROL], "no-store");
        assert!(
            !CSP.contains("unsafe"),
            "the policy must not allow inline or eval'd code"
        );
    }
}
