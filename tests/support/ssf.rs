//! SSF v1 frames (SPEAR's user-stream framing) as a client writes them by hand.

/// A DATA frame on `stream_id` with sequence number `seq`, carrying `data`.
pub fn data_frame(stream_id: u32, seq: u64, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + data.len());
    out.extend_from_slice(b"SPST");
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&32u16.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&stream_id.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    out
}
