//! What every config section shares: where it came from ([`ConfigOrigin`]), the one error
//! that names the file, the field and the fix ([`ConfigError`]), and reading a TOML table
//! into a typed section with the failing field's path ([`read_section`]).
//!
//! Each capability owns its own section type and its checks; the host composes them into
//! [`HostConfig`](crate::HostConfig), and a node adds its own sections beside them
//! ([`HostConfig::load_with_sections`](crate::HostConfig::load_with_sections)).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// Where a host config came from: errors name `file`, relative paths resolve against `dir`.
#[derive(Clone, Debug)]
pub struct ConfigOrigin {
    pub file: PathBuf,
    pub dir: PathBuf,
}

impl ConfigOrigin {
    /// A config read from `file`.
    pub fn file(file: &Path) -> Self {
        Self {
            file: file.to_owned(),
            dir: file
                .parent()
                .map(Path::to_owned)
                .unwrap_or_else(|| PathBuf::from(".")),
        }
    }

    /// A config built in code, its relative paths relative to `dir`.
    pub fn in_code(dir: impl Into<PathBuf>) -> Self {
        Self {
            file: PathBuf::from("<host config built in code>"),
            dir: dir.into(),
        }
    }
}

/// A config file that cannot be used, naming the file, the field and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{}: {field}{message}", path.display())]
pub struct ConfigError {
    pub path: PathBuf,
    pub field: String,
    pub message: String,
    /// The I/O, parse or check error `message` tells of, if there was one.
    #[source]
    pub(crate) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ConfigError {
    pub fn new(path: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        let field = if field.is_empty() {
            field
        } else {
            format!("{field}: ")
        };
        Self {
            path: path.to_owned(),
            field,
            message: message.into(),
            source: None,
        }
    }

    /// The same error with `source` as its cause; `message` should already tell of it.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
}

/// Reads `value` as the section `T`; an error names `path` and the field below `prefix`
/// (`serve.max_tasks`, not `max_tasks`).
pub fn read_section<T: DeserializeOwned>(
    path: &Path,
    prefix: &str,
    value: toml::Value,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let field = match (prefix.is_empty(), inner.as_str()) {
            (_, ".") => prefix.to_owned(),
            (true, _) => inner,
            (false, _) => format!("{prefix}.{inner}"),
        };
        let source = e.into_inner();
        ConfigError::new(path, field, source.to_string()).with_source(source)
    })
}
