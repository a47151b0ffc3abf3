//! `[telemetry]` in `quiver.toml` and the `OTEL_*` variables, resolved into the settings
//! of one exporter. Errors name the field or variable and the fix, never a header value
//! (headers carry collector credentials).

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use crate::defaults;

/// `[telemetry]`: where traces go. Every field is optional; the matching `OTEL_*`
/// variable fills what the file leaves out.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
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
    /// Which traces are recorded, by the OpenTelemetry names; else `OTEL_TRACES_SAMPLER`,
    /// else `parentbased_always_on` (a caller's sampled flag decides, new traces are all
    /// recorded). `always_on` records every task even when the caller does not sample.
    pub sampler: Option<SamplerKind>,
    /// The ratio (0 to 1) of new traces a `traceidratio` sampler records; else
    /// `OTEL_TRACES_SAMPLER_ARG`, else 1.
    pub sampler_arg: Option<f64>,
}

/// A sampler named as in `OTEL_TRACES_SAMPLER`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SamplerKind {
    AlwaysOn,
    AlwaysOff,
    Traceidratio,
    #[default]
    ParentbasedAlwaysOn,
    ParentbasedAlwaysOff,
    ParentbasedTraceidratio,
}

impl SamplerKind {
    const ALL: [(&str, Self); 6] = [
        ("always_on", Self::AlwaysOn),
        ("always_off", Self::AlwaysOff),
        ("traceidratio", Self::Traceidratio),
        ("parentbased_always_on", Self::ParentbasedAlwaysOn),
        ("parentbased_always_off", Self::ParentbasedAlwaysOff),
        ("parentbased_traceidratio", Self::ParentbasedTraceidratio),
    ];

    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        Self::ALL
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(text))
            .map(|(_, kind)| *kind)
    }

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, kind)| *kind == self)
            .map_or("", |(name, _)| name)
    }

    fn takes_ratio(self) -> bool {
        matches!(self, Self::Traceidratio | Self::ParentbasedTraceidratio)
    }
}

/// Which traces one exporter records.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub kind: SamplerKind,
    /// For the ratio samplers: the share of new traces recorded, 0 to 1.
    pub ratio: f64,
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
#[derive(Clone, PartialEq)]
pub struct TelemetrySettings {
    /// The URL spans are sent to (for HTTP, with `/v1/traces`).
    pub endpoint: String,
    pub protocol: Protocol,
    /// Secret: never shown (the `Debug` impl names the keys only).
    pub headers: HashMap<String, String>,
    pub service_name: String,
    pub max_queue_size: usize,
    pub export_timeout: Duration,
    pub sampling: Sampling,
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
            .field("sampling", &self.sampling)
            .finish()
    }
}

impl TelemetryConfig {
    /// The settings from this section and the process environment; `Ok(None)` when export
    /// is off (nothing names an endpoint, `enabled = false`, `OTEL_SDK_DISABLED=true`).
    /// The error names the field or variable at fault.
    pub fn resolve(&self) -> Result<Option<TelemetrySettings>, String> {
        // A value that is not UTF-8 is kept (lossily), to be refused by name rather than
        // taken as unset.
        self.resolve_with(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
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
        let sampling = self.sampling(&set)?;
        Ok(Some(TelemetrySettings {
            endpoint,
            protocol,
            headers,
            service_name,
            max_queue_size,
            export_timeout,
            sampling,
        }))
    }

    /// `sampler` and `sampler_arg`, else their `OTEL_TRACES_SAMPLER*` variables. As the
    /// specification says, the variable's argument is ignored by a sampler that takes
    /// none; the file's is refused there (it says something that would not happen).
    fn sampling(&self, set: &impl Fn(&str) -> Option<String>) -> Result<Sampling, String> {
        let kind = match self.sampler {
            Some(kind) => kind,
            None => match set("OTEL_TRACES_SAMPLER") {
                Some(name) => SamplerKind::parse(&name).ok_or_else(|| {
                    format!(
                        "OTEL_TRACES_SAMPLER: {:?} is not a supported sampler; use one of {}",
                        quiver::text::cut(&name, 64),
                        SamplerKind::ALL.map(|(name, _)| name).join(", ")
                    )
                })?,
                None => SamplerKind::default(),
            },
        };
        let ratio = match (self.sampler_arg, kind.takes_ratio()) {
            (Some(_), false) => {
                return Err(format!(
                    "telemetry.sampler_arg: only a traceidratio sampler takes a ratio; set telemetry.sampler = \"parentbased_traceidratio\" or remove sampler_arg ({} has none)",
                    kind.name()
                ));
            }
            (Some(ratio), true) => ("telemetry.sampler_arg", Some(ratio)),
            (None, true) => match set("OTEL_TRACES_SAMPLER_ARG") {
                Some(text) => (
                    "OTEL_TRACES_SAMPLER_ARG",
                    Some(text.trim().parse::<f64>().unwrap_or(f64::NAN)),
                ),
                None => ("", None),
            },
            (None, false) => ("", None),
        };
        let ratio = match ratio {
            (field, Some(ratio)) if !(0.0..=1.0).contains(&ratio) => {
                return Err(format!(
                    "{field}: the ratio of traces to record must be a number from 0 to 1"
                ));
            }
            (_, Some(ratio)) => ratio,
            (_, None) => 1.0,
        };
        Ok(Sampling { kind, ratio })
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

    #[test]
    fn the_sampler_comes_from_the_file_or_otel_traces_sampler() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let sampling = |config: &TelemetryConfig, vars: &[(&str, &str)]| {
            config.resolve_with(env(vars)).map(|s| s.unwrap().sampling)
        };
        let default = TelemetryConfig::default();
        assert_eq!(
            sampling(&default, &[endpoint]).unwrap(),
            Sampling {
                kind: SamplerKind::ParentbasedAlwaysOn,
                ratio: 1.0
            }
        );
        let vars = [
            endpoint,
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ];
        assert_eq!(
            sampling(&default, &vars).unwrap(),
            Sampling {
                kind: SamplerKind::ParentbasedTraceidratio,
                ratio: 0.25
            }
        );
        let vars_no_arg = [endpoint, ("OTEL_TRACES_SAMPLER", "TraceIdRatio")];
        assert_eq!(sampling(&default, &vars_no_arg).unwrap().ratio, 1.0);
        // The file wins, and the variable's argument means nothing to always_on.
        let file: TelemetryConfig = toml::from_str("sampler = \"always_on\"").unwrap();
        assert_eq!(sampling(&file, &vars).unwrap().kind, SamplerKind::AlwaysOn);
        let file: TelemetryConfig =
            toml::from_str("sampler = \"traceidratio\"\nsampler_arg = 0.5").unwrap();
        assert_eq!(
            sampling(&file, &vars).unwrap(),
            Sampling {
                kind: SamplerKind::Traceidratio,
                ratio: 0.5
            }
        );
    }

    #[test]
    fn a_bad_sampler_is_named_with_the_fix() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let default = TelemetryConfig::default();
        let vars = [endpoint, ("OTEL_TRACES_SAMPLER", "jaeger_remote")];
        let error = default.resolve_with(env(&vars)).unwrap_err();
        assert!(
            error.starts_with("OTEL_TRACES_SAMPLER: \"jaeger_remote\" is not a supported sampler; use one of always_on"),
            "{error}"
        );
        for arg in ["1.5", "-0.1", "NaN", "half", "inf"] {
            let vars = [
                endpoint,
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", arg),
            ];
            let error = default.resolve_with(env(&vars)).unwrap_err();
            assert!(error.starts_with("OTEL_TRACES_SAMPLER_ARG: "), "{error}");
        }
        let file: TelemetryConfig =
            toml::from_str("sampler = \"always_on\"\nsampler_arg = 0.5").unwrap();
        let error = file.resolve_with(env(&[endpoint])).unwrap_err();
        assert!(
            error.starts_with("telemetry.sampler_arg: only a traceidratio"),
            "{error}"
        );
        let error = toml::from_str::<TelemetryConfig>("sampler = \"sometimes\"")
            .unwrap_err()
            .to_string();
        assert!(error.contains("parentbased_always_on"), "{error}");
    }
}
