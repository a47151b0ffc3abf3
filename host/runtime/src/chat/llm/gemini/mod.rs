//! Gemini's `generateContent` (`POST {base_url}/models/{model}:generateContent`), as a
//! translation, like [`super::anthropic`]: [`to_gemini`] makes the request (or says why
//! none can be made), [`from_gemini`] reads the answer; HTTP, retries (including the
//! `RetryInfo` delay of a 429) and caps are [`super::openai`]'s.

mod request;
mod response;
mod schema;

pub(super) use request::to_gemini;
pub(super) use response::from_gemini;

use super::ModelPatterns;

/// What a request's translation depends on besides its body.
pub(super) struct Options {
    /// The model takes images inside a function response (Gemini 3).
    pub(super) images_in_results: bool,
}

/// Which models take images inside function responses: `image_result_models` patterns.
pub(super) struct ImageModels(ModelPatterns);

impl ImageModels {
    pub(super) fn new(patterns: Option<&[String]>) -> Self {
        Self(ModelPatterns::new(
            patterns,
            crate::defaults::GEMINI_IMAGE_RESULT_MODELS,
        ))
    }

    pub(super) fn options(&self, model: &str) -> Options {
        let model = model.strip_prefix("models/").unwrap_or(model);
        Options {
            images_in_results: self.0.matches(model),
        }
    }
}

/// `model` as the path segment of the request URL, or why it cannot be one.
pub(super) fn model_segment(model: &str) -> Result<&str, String> {
    let model = model.strip_prefix("models/").unwrap_or(model);
    let valid = (1..=128).contains(&model.len())
        && model.starts_with(|c: char| c.is_ascii_alphanumeric())
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if valid {
        Ok(model)
    } else {
        let shown: String = model.chars().take(64).collect();
        Err(format!(
            "model {shown:?} is not a Gemini model name (letters, digits, `.`, `_`, `-`)"
        ))
    }
}

#[cfg(test)]
mod tests;
