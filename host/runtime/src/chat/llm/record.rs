//! Writes a replay transcript from a live conversation (`quiver run --record FILE`).
//!
//! Each successful exchange becomes an entry whose matcher is the request's last message
//! role and the start of its text; the file is rewritten (atomically) after every exchange,
//! so an interrupted run still leaves a usable transcript.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use super::replay::{Exchange, Matcher, Transcript, last_message};
use crate::chat::wire::ChatCompletion;

pub struct Recorder {
    path: PathBuf,
    transcript: Mutex<Transcript>,
}

impl Recorder {
    pub fn new(path: impl AsRef<Path>) -> Self {
        Self {
            path: path.as_ref().to_owned(),
            transcript: Mutex::new(Transcript {
                version: 1,
                note: Some("Recorded by `quiver run --record` from a real backend.".into()),
                exchanges: Vec::new(),
            }),
        }
    }

    pub(super) fn record(&self, request: &Value, response: &ChatCompletion) {
        let (role, text) = last_message(request);
        let matcher = Matcher {
            last_role: role.map(str::to_owned),
            last_content_contains: (!text.is_empty()).then(|| text.chars().take(80).collect()),
            ..Matcher::default()
        };
        let mut transcript = self.transcript.lock().unwrap_or_else(|e| e.into_inner());
        transcript.exchanges.push(Exchange {
            matcher,
            response: response.clone(),
        });
        let written = serde_json::to_vec_pretty(&*transcript)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                let tmp = self.path.with_extension("tmp");
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, &self.path)
            });
        if let Err(error) = written {
            tracing::warn!(path = %self.path.display(), %error, "cannot write the recorded transcript");
        }
    }
}
