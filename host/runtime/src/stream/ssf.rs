//! SSF v1 (Spear Stream Frame), the envelope of every user-stream message: SPEAR's
//! `ssf.rs` checks, with a reason a client or a log can be told.

use quiver_abi::user_stream::ssf::{HEADER_BYTES, MAGIC, VERSION};

/// Why bytes are not an SSF v1 frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("an SSF frame has a 32-byte header; this one has {0} bytes in all")]
    Short(usize),
    #[error("an SSF frame starts with the magic \"SPST\"")]
    Magic,
    #[error("SSF version {0} is not supported; send version 1")]
    Version(u16),
    #[error("header_len {0} is below 32 or past the frame's end")]
    HeaderLen(u16),
    #[error("meta_len + data_len is {declared}, but {actual} bytes follow the header")]
    Lengths { declared: u64, actual: usize },
}

/// What the host reads of a frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) stream_id: u32,
    pub(crate) header_len: usize,
    pub(crate) meta_len: usize,
}

fn u16_at(frame: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([frame[at], frame[at + 1]])
}

fn u32_at(frame: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]])
}

/// Checks `frame` as SPEAR does: magic, version, `header_len` and that the lengths
/// account for every byte.
pub(crate) fn parse(frame: &[u8]) -> Result<Header, FrameError> {
    if frame.len() < HEADER_BYTES {
        return Err(FrameError::Short(frame.len()));
    }
    if frame[0..4] != MAGIC {
        return Err(FrameError::Magic);
    }
    let version = u16_at(frame, 4);
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let header_len = u16_at(frame, 6);
    if usize::from(header_len) < HEADER_BYTES || usize::from(header_len) > frame.len() {
        return Err(FrameError::HeaderLen(header_len));
    }
    let meta_len = u64::from(u32_at(frame, 24));
    let data_len = u64::from(u32_at(frame, 28));
    let actual = frame.len() - usize::from(header_len);
    if meta_len + data_len != actual as u64 {
        return Err(FrameError::Lengths {
            declared: meta_len + data_len,
            actual,
        });
    }
    Ok(Header {
        stream_id: u32_at(frame, 12),
        header_len: usize::from(header_len),
        meta_len: meta_len as usize,
    })
}

/// The data section of a checked frame.
pub fn frame_data(frame: &[u8]) -> Result<&[u8], FrameError> {
    let header = parse(frame)?;
    Ok(&frame[header.header_len + header.meta_len..])
}

/// A 32-byte-header SSF v1 frame carrying `data` (no metadata) on `stream_id`.
pub fn data_frame(stream_id: u32, seq: u64, data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADER_BYTES + data.len());
    frame.extend_from_slice(&MAGIC);
    frame.extend_from_slice(&VERSION.to_le_bytes());
    frame.extend_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
    frame.extend_from_slice(&quiver_abi::user_stream::ssf::MSG_DATA.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&stream_id.to_le_bytes());
    frame.extend_from_slice(&seq.to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(&(data.len() as u32).to_le_bytes());
    frame.extend_from_slice(data);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_frame_parses_and_hostile_headers_are_named() {
        let frame = data_frame(7, 1, b"hello");
        let header = parse(&frame).unwrap();
        assert_eq!(header.stream_id, 7);
        assert_eq!(frame_data(&frame), Ok(&b"hello"[..]));
        assert_eq!(parse(&frame[..31]), Err(FrameError::Short(31)));
        let mut bad = frame.clone();
        bad[0] = b'X';
        assert_eq!(parse(&bad), Err(FrameError::Magic));
        let mut bad = frame.clone();
        bad[4] = 2;
        assert_eq!(parse(&bad), Err(FrameError::Version(2)));
        let mut bad = frame.clone();
        bad[6..8].copy_from_slice(&16u16.to_le_bytes());
        assert_eq!(parse(&bad), Err(FrameError::HeaderLen(16)));
        let mut bad = frame.clone();
        bad[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(parse(&bad), Err(FrameError::HeaderLen(u16::MAX)));
        // Lengths that would overflow 32 bits in sum are still just wrong.
        let mut bad = frame.clone();
        bad[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        bad[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&bad), Err(FrameError::Lengths { .. })));
        // Extension bytes past 32 are skipped, as SPEAR says receivers must.
        let mut long = frame[..32].to_vec();
        long[6..8].copy_from_slice(&36u16.to_le_bytes());
        long.extend_from_slice(&[0xff; 4]);
        long.extend_from_slice(b"hello");
        assert_eq!(frame_data(&long), Ok(&b"hello"[..]));
    }
}
