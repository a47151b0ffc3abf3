//! Where `--registry` points: a directory, or an etcd v3 store a fleet shares.

use std::path::PathBuf;
use std::sync::Arc;

use quiver::registry::{DirStore, RegistryStore, StoreError};

use crate::{EtcdAccess, EtcdStore};

/// Where `--registry` points: a directory, or an etcd v3 store shared by a fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrySource {
    Dir(PathBuf),
    /// `etcd://HOST:PORT/PREFIX`: the endpoint (`HOST:PORT`) and the key prefix the
    /// registry lives under (starting with `/`).
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
    },
}

impl RegistrySource {
    /// Reads a `--registry` value: `etcd://HOST:PORT/PREFIX`, or else a directory path.
    pub fn parse(value: &str) -> Result<Self, String> {
        let Some(rest) = value.strip_prefix("etcd://") else {
            return Ok(Self::Dir(PathBuf::from(value)));
        };
        let fix = "write it as etcd://HOST:PORT/PREFIX, e.g. etcd://127.0.0.1:2379/quiver";
        let (endpoint, prefix) = rest
            .split_once('/')
            .ok_or_else(|| format!("{value:?} has no key prefix; {fix}"))?;
        let port_ok = endpoint
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(format!("{value:?}: {endpoint:?} is not HOST:PORT; {fix}"));
        }
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() || endpoint.contains('@') {
            return Err(format!(
                "{value:?}: a non-empty prefix and no credentials; {fix}"
            ));
        }
        Ok(Self::Etcd {
            endpoints: vec![endpoint.to_owned()],
            prefix: format!("/{prefix}"),
        })
    }

    /// The store this source names, etcd reached as `etcd` says (`[etcd]` of
    /// `quiver.toml`; the default refuses endpoints off loopback). A directory must
    /// exist; etcd is not contacted yet (a node may start while it is down).
    pub async fn open(&self, etcd: &EtcdAccess) -> Result<Arc<dyn RegistryStore>, StoreError> {
        match self {
            Self::Dir(dir) => {
                if !dir.is_dir() {
                    return Err(StoreError::Unreachable {
                        store: format!("dir:{}", dir.display()),
                        message: "not a directory (pass an existing directory with --registry)"
                            .into(),
                        source: None,
                    });
                }
                Ok(Arc::new(DirStore::new(dir)))
            }
            Self::Etcd { endpoints, prefix } => Ok(Arc::new(
                EtcdStore::connect_with_access(endpoints.clone(), prefix.clone(), etcd).await?,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_sources_parse_or_name_the_fix() {
        assert_eq!(
            RegistrySource::parse("reg/dir").unwrap(),
            RegistrySource::Dir("reg/dir".into())
        );
        assert_eq!(
            RegistrySource::parse("etcd://127.0.0.1:2379/quiver/").unwrap(),
            RegistrySource::Etcd {
                endpoints: vec!["127.0.0.1:2379".into()],
                prefix: "/quiver".into()
            }
        );
        for bad in [
            "etcd://127.0.0.1:2379",
            "etcd://127.0.0.1/quiver",
            "etcd://:2379/q",
            "etcd://h:2379/",
            "etcd://u:p@h:2379/q",
        ] {
            let err = RegistrySource::parse(bad).unwrap_err();
            assert!(err.contains("etcd://HOST:PORT/PREFIX"), "{bad}: {err}");
        }
    }
}
