//! `[telemetry]` in `quiver.toml` and the `OTEL_*` variables, resolved into the settings
//! of one exporter. Errors name the field or variable and the fix, never a header value
//! (headers carry collector credentials).

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use crate::defaults;

/// `[telemetry]`: where traces go. Every field is optional; the matching `OTEL_*`
/// variable fills what the file leaves out.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `false` turns export off whatever the environment says (`OTEL_SDK_DISABLED=true`
    /// does too).
    pub enabled: Option<bool>,
    /// The collector's base URL (`http://collector:4318`); traces go to
    /// `{endpoint}/v1/traces` over HTTP, or to the endpoint itself over gRPC.
    /// Else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`; else `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub protocol: Option<Protocol>,
    /// Name of the environment variable holding the export headers (`key=value,...`,
    /// values URL-encoded), e.g. a collector's API key; never the headers themselves.
    /// Else `OTEL_EXPORTER_OTLP_TRACES_HEADERS` or `OTEL_EXPORTER_OTLP_HEADERS`.
    pub headers_env: Option<String>,
    /// The `service.name` of every span; else `OTEL_SERVICE_NAME`, else `quiver`.
    pub service_name: Option<String>,
    /// Spans waiting for export; past it spans are dropped and counted
    /// ([`defaults::TELEMETRY_MAX_QUEUE`]).
    pub max_queue_size: Option<usize>,
    /// Longest one export request may take ([`defaults::TELEMETRY_EXPORT_TIMEOUT`]).
    pub export_timeout_ms: Option<u64>,
}

/// The OTLP transport.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

impl Protocol {
    fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "http/protobuf" => Some(Self::HttpProtobuf),
            "grpc" => Some(Self::Grpc),
            _ => None,
        }
    }
}

/// What one exporter is built with.
#[derive(Clone, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// The URL spans are sent to (for HTTP, with `/v1/traces`).
    pub endpoint: String,
    pub protocol: Protocol,
    /// Secret: never shown (the `Debug` impl names the keys only).
    pub headers: HashMap<String, String>,
    pub service_name: String,
    pub max_queue_size: usize,
    pub export_timeout: Duration,
}

impl std::fmt::Debug for TelemetrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<&String> = self.headers.keys().collect();
        keys.sort();
        f.debug_struct("TelemetrySettings")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("header_keys", &keys)
            .field("service_name", &self.service_name)
            .field("max_queue_size", &self.max_queue_size)
            .field("export_timeout", &self.export_timeout)
            .finish()
    }
}

impl TelemetryConfig {
    /// The settings from this section and the process environment; `Ok(None)` when export
    /// is off (nothing names an endpoint, `enabled = false`, `OTEL_SDK_DISABLED=true`).
    /// The error names the field or variable at fault.
    pub fn resolve(&self) -> Result<Option<TelemetrySettings>, String> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// [`Self::resolve`] with `env` for the environment.
    pub fn resolve_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<TelemetrySettings>, String> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if self.enabled == Some(false) {
            return Ok(None);
        }
        if self.enabled.is_none()
            && set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        {
            return Ok(None);
        }
        let protocol = match (
            self.protocol,
            set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v))
                .or_else(|| {
                    set("OTEL_EXPORTER_OTLP_PROTOCOL").map(|v| ("OTEL_EXPORTER_OTLP_PROTOCOL", v))
                }),
        ) {
            (Some(protocol), _) => protocol,
            (None, Some((var, value))) => Protocol::parse(&value).ok_or_else(|| {
                format!("{var}: {value:?} is not a supported protocol; use http/protobuf or grpc")
            })?,
            (None, None) => Protocol::default(),
        };
        let (field, endpoint, as_is) = match (
            &self.endpoint,
            set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            set("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(url), _, _) => ("telemetry.endpoint", url.clone(), false),
            (None, Some(url), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url, true),
            (None, None, Some(url)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", url, false),
            (None, None, None) if self.enabled == Some(true) => {
                return Err("telemetry.enabled: export is on but no endpoint is set; set telemetry.endpoint or OTEL_EXPORTER_OTLP_ENDPOINT".into());
            }
            (None, None, None) => return Ok(None),
        };
        let endpoint = check_endpoint(field, endpoint.trim())?;
        let endpoint = match protocol {
            Protocol::HttpProtobuf if !as_is => {
                format!("{}/v1/traces", endpoint.trim_end_matches('/'))
            }
            _ => endpoint,
        };
        let headers = match &self.headers_env {
            Some(var) => {
                let text = env(var).ok_or_else(|| {
                    format!("telemetry.headers_env: the environment variable `{var}` is not set; set it or remove headers_env")
                })?;
                parse_headers(var, &text)?
            }
            None => match set("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", v))
                .or_else(|| {
                    set("OTEL_EXPORTER_OTLP_HEADERS").map(|v| ("OTEL_EXPORTER_OTLP_HEADERS", v))
                }) {
                Some((var, text)) => parse_headers(var, &text)?,
                None => HashMap::new(),
            },
        };
        let service_name = self
            .service_name
            .clone()
            .or_else(|| set("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| "quiver".into());
        if service_name.len() > defaults::TELEMETRY_MAX_SERVICE_NAME_BYTES
            || service_name.chars().any(char::is_control)
        {
            return Err(format!(
                "telemetry.service_name (or OTEL_SERVICE_NAME): at most {} bytes without control characters",
                defaults::TELEMETRY_MAX_SERVICE_NAME_BYTES
            ));
        }
        let max_queue_size = self.max_queue_size.unwrap_or(defaults::TELEMETRY_MAX_QUEUE);
        if !(1..=defaults::TELEMETRY_MAX_QUEUE_LIMIT).contains(&max_queue_size) {
            return Err(format!(
                "telemetry.max_queue_size: {max_queue_size} is out of range; use 1 to {}",
                defaults::TELEMETRY_MAX_QUEUE_LIMIT
            ));
        }
        let export_timeout = self
            .export_timeout_ms
            .map_or(defaults::TELEMETRY_EXPORT_TIMEOUT, Duration::from_millis);
        if export_timeout.is_zero() || export_timeout > defaults::TELEMETRY_EXPORT_TIMEOUT_MAX {
            return Err(format!(
                "telemetry.export_timeout_ms: use 1 to {}",
                defaults::TELEMETRY_EXPORT_TIMEOUT_MAX.as_millis()
            ));
        }
        Ok(Some(TelemetrySettings {
            endpoint,
            protocol,
            headers,
            service_name,
            max_queue_size,
            export_timeout,
        }))
    }
}

/// An `http(s)` URL with a host and no credentials in it; the error shows only the
/// scheme and host (a URL may carry a token in its query).
fn check_endpoint(field: &str, text: &str) -> Result<String, String> {
    let url = url::Url::parse(text)
        .map_err(|e| format!("{field}: not a URL ({e}); use e.g. http://collector:4318"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "{field}: the scheme must be http or https with a host, e.g. http://collector:4318"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err(format!(
            "{field}: credentials or a query in the URL are refused (they would be logged with it); pass them as headers (headers_env)"
        ));
    }
    Ok(text.to_owned())
}

/// `key=value,...` with URL-encoded values (the OTLP exporter convention). Errors name the
/// variable and the entry's position, never its content.
fn parse_headers(var: &str, text: &str) -> Result<HashMap<String, String>, String> {
    let mut headers = HashMap::new();
    for (i, entry) in text
        .split(',')
        .enumerate()
        .filter(|(_, e)| !e.trim().is_empty())
    {
        let position = i + 1;
        let (key, value) = entry
            .split_once('=')
            .ok_or_else(|| format!("{var}: entry {position} is not key=value"))?;
        let key = key.trim();
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| {
                format!("{var}: the value of entry {position} is not UTF-8 once decoded")
            })?;
        if http::HeaderName::from_bytes(key.as_bytes()).is_err()
            || http::HeaderValue::from_str(&value).is_err()
        {
            return Err(format!(
                "{var}: entry {position} is not a valid HTTP header name and value"
            ));
        }
        headers.insert(key.to_ascii_lowercase(), value.into_owned());
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn off_without_an_endpoint_and_when_disabled() {
        let config = TelemetryConfig::default();
        assert_eq!(config.resolve_with(env(&[])).unwrap(), None);
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        assert_eq!(config.resolve_with(env(&vars)).unwrap(), None);
        let off = TelemetryConfig {
            enabled: Some(false),
            ..Default::default()
        };
        assert_eq!(off.resolve_with(env(&vars[..1])).unwrap(), None);
    }

    #[test]
    fn env_and_file_make_the_endpoint_the_file_wins() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/"),
            ("OTEL_SERVICE_NAME", "svc"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api_key=s%3Dcret,x-team=a"),
        ];
        let settings = TelemetryConfig::default()
            .resolve_with(env(&vars))
            .unwrap()
            .unwrap();
        assert_eq!(settings.endpoint, "http://c:4318/v1/traces");
        assert_eq!(settings.service_name, "svc");
        assert_eq!(settings.headers["api_key"], "s=cret");
        assert!(!format!("{settings:?}").contains("s=cret"));
        let file = TelemetryConfig {
            endpoint: Some("http://file:4317".into()),
            protocol: Some(Protocol::Grpc),
            ..Default::default()
        };
        let settings = file.resolve_with(env(&vars)).unwrap().unwrap();
        assert_eq!(settings.endpoint, "http://file:4317");
        assert_eq!(settings.protocol, Protocol::Grpc);
        let traces = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/custom")];
        let settings = TelemetryConfig::default()
            .resolve_with(env(&traces))
            .unwrap()
            .unwrap();
        assert_eq!(settings.endpoint, "http://t:1/custom");
    }

    #[test]
    fn bad_values_are_named_and_secrets_never_shown() {
        let cases: [(&[(&str, &str)], &str); 5] = [
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    (
                        "OTEL_EXPORTER_OTLP_HEADERS",
                        "authorization=Bearer sekrit7,broken-sekrit7",
                    ),
                ],
                "OTEL_EXPORTER_OTLP_HEADERS: entry 2",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:sekrit7@c:4318")],
                "credentials or a query in the URL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c/v1?token=sekrit7")],
                "credentials or a query in the URL",
            ),
        ];
        for (vars, named) in cases {
            let error = TelemetryConfig::default()
                .resolve_with(env(vars))
                .unwrap_err();
            assert!(error.contains(named), "{error}");
            assert!(!error.contains("sekrit7"), "{error}");
        }
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let error = toml::from_str::<TelemetryConfig>("endpont = \"http://c\"")
            .unwrap_err()
            .to_string();
        assert!(error.contains("endpont"), "{error}");
    }
}
