//! Images a model may be sent: the checks every image passes before it goes to a backend
//! that takes images (the Anthropic Messages API, the OpenAI Responses API, Gemini),
//! whoever supplied it (an MCP tool result, or the guest through a message), and the
//! per-request [`Budget`] the translations keep them to.
//!
//! The API refuses a whole request for one bad image (a type it does not take, bytes that
//! are not of the declared type, a base64 string over 5 MB), and a session sends its
//! history again on every turn, so one such image would fail every later request. An image
//! that fails these checks reaches the model as a text note instead.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::defaults;

/// The media types the API takes, as it spells them.
const MEDIA_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// An image that passed the checks: base64 data of a known type that its bytes match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Image {
    pub(crate) media_type: &'static str,
    pub(crate) data: String,
}

/// Why an image is not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("not JPEG, PNG, GIF or WebP")]
    MediaType,
    #[error(
        "over the {} bytes of base64 a model takes",
        defaults::LLM_IMAGE_MAX_BASE64_BYTES
    )]
    TooLarge,
    #[error("not valid base64")]
    NotBase64,
    #[error("its bytes are not of the declared type")]
    Mismatch,
}

impl Image {
    /// Base64 `data` declared as `media_type`, if it passes [`check`].
    pub(crate) fn checked(media_type: &str, data: &str) -> Result<Self, Refusal> {
        Ok(Self {
            media_type: check(media_type, data)?,
            data: data.to_owned(),
        })
    }

    /// The Anthropic `image` content block (moving the data, which may be megabytes).
    pub(crate) fn into_block(self) -> Value {
        let mut block = json!({
            "type": "image",
            "source": {"type": "base64", "media_type": self.media_type},
        });
        block["source"]["data"] = Value::String(self.data);
        block
    }
}

/// How many images, of how many base64 bytes, a request still has room for: the
/// translations admit a conversation's images newest first and send the rest as notes.
pub(crate) struct Budget {
    count: usize,
    bytes: usize,
    max_count: usize,
    max_bytes: usize,
}

impl Budget {
    pub(crate) fn new(max_count: usize, max_bytes: usize) -> Self {
        Self {
            count: 0,
            bytes: 0,
            max_count,
            max_bytes,
        }
    }

    /// Takes an image of `len` base64 bytes if the request has room for it.
    pub(crate) fn admit(&mut self, len: usize) -> bool {
        let bytes = self.bytes.saturating_add(len);
        if self.count >= self.max_count || bytes > self.max_bytes {
            return false;
        }
        self.count += 1;
        self.bytes = bytes;
        true
    }

    /// The note an image the request has no room for becomes.
    pub(crate) fn full_note(&self) -> String {
        format!(
            "[image not sent: a request carries only the newest {} images, of at most {} bytes of base64]",
            self.max_count, self.max_bytes
        )
    }
}

/// Checks base64 `data` declared as `media_type` (matched without regard to case), and
/// returns the type as the API spells it.
pub(crate) fn check(media_type: &str, data: &str) -> Result<&'static str, Refusal> {
    let media_type = MEDIA_TYPES
        .into_iter()
        .find(|known| known.eq_ignore_ascii_case(media_type))
        .ok_or(Refusal::MediaType)?;
    if data.len() > defaults::LLM_IMAGE_MAX_BASE64_BYTES {
        return Err(Refusal::TooLarge);
    }
    if !is_base64(data) {
        return Err(Refusal::NotBase64);
    }
    // 16 characters are 12 bytes, enough for every signature below.
    let mut head = [0u8; 12];
    let head_len = STANDARD
        .decode_slice(&data[..data.len().min(16)], &mut head)
        .map_err(|_| Refusal::NotBase64)?;
    if !has_signature(media_type, &head[..head_len]) {
        return Err(Refusal::Mismatch);
    }
    Ok(media_type)
}

/// Whether `data` is canonical padded base64, decoded a piece at a time so a large image
/// is never copied to check it.
fn is_base64(data: &str) -> bool {
    const PIECE: usize = 4 * 1024;
    let bytes = data.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return false;
    }
    // Padding may only end the last quantum; pieces decoded alone would not see it elsewhere.
    if bytes[..bytes.len() - 4].contains(&b'=') {
        return false;
    }
    let mut out = [0u8; PIECE / 4 * 3];
    bytes
        .chunks(PIECE)
        .all(|piece| STANDARD.decode_slice(piece, &mut out).is_ok())
}

/// Whether `head`, an image's first bytes, starts with `media_type`'s signature.
fn has_signature(media_type: &str, head: &[u8]) -> bool {
    match media_type {
        "image/png" => head.starts_with(b"\x89PNG\r\n\x1a\n"),
        "image/jpeg" => head.starts_with(&[0xff, 0xd8, 0xff]),
        "image/gif" => head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a"),
        "image/webp" => head.len() >= 12 && head.starts_with(b"RIFF") && &head[8..12] == b"WEBP",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    #[test]
    fn signatures_must_match_the_declared_type() {
        let png = b64(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
        let jpeg = b64(&[0xff, 0xd8, 0xff, 0xe0, 0, 0x10]);
        let gif = b64(b"GIF89a\x01\0\x01\0");
        let webp = b64(b"RIFF\x24\0\0\0WEBPVP8 ");
        for (media_type, data) in [
            ("image/png", &png),
            ("image/jpeg", &jpeg),
            ("image/gif", &gif),
            ("image/webp", &webp),
        ] {
            let image = Image::checked(media_type, data).expect(media_type);
            assert_eq!(image.media_type, media_type);
        }
        assert_eq!(
            Image::checked("IMAGE/PNG", &png).unwrap().media_type,
            "image/png",
            "the type is matched without case and sent as the API spells it"
        );
        assert_eq!(Image::checked("image/png", &jpeg), Err(Refusal::Mismatch));
        assert_eq!(
            Image::checked("image/webp", &b64(b"RIFF")),
            Err(Refusal::Mismatch)
        );
        assert_eq!(
            Image::checked("image/svg+xml", &b64(b"<svg/>")),
            Err(Refusal::MediaType)
        );
        assert_eq!(Image::checked("image/tiff", &png), Err(Refusal::MediaType));
    }

    #[test]
    fn base64_is_checked_whole_and_its_length_capped() {
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.resize(10_000, 7);
        let data = b64(&png);
        assert!(Image::checked("image/png", &data).is_ok());
        // Padding inside, a bad character deep in, a missing pad: all refused.
        let mut inner_pad = data.clone();
        inner_pad.replace_range(5000..5004, "AA==");
        assert_eq!(
            Image::checked("image/png", &inner_pad),
            Err(Refusal::NotBase64)
        );
        let mut bad = data.clone();
        bad.replace_range(9000..9001, "*");
        assert_eq!(Image::checked("image/png", &bad), Err(Refusal::NotBase64));
        assert_eq!(
            Image::checked("image/png", data.trim_end_matches('=')),
            Err(Refusal::NotBase64)
        );
        assert_eq!(Image::checked("image/png", ""), Err(Refusal::NotBase64));

        // The API's limit is on the base64 string: 5 MB of it, not 5 MB decoded.
        let limit = defaults::LLM_IMAGE_MAX_BASE64_BYTES;
        let mut big = b"\x89PNG\r\n\x1a\n".to_vec();
        big.resize(limit / 4 * 3, 0);
        let at_limit = b64(&big);
        assert_eq!(at_limit.len(), limit);
        assert!(Image::checked("image/png", &at_limit).is_ok());
        big.resize(4_500_000, 0);
        let over = b64(&big);
        assert_eq!(over.len(), 6_000_000);
        assert_eq!(Image::checked("image/png", &over), Err(Refusal::TooLarge));
    }
}
