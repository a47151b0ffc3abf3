//! The one place that touches guest memory.
//!
//! Every pointer and length a guest passes is checked here: out of bounds is `-EFAULT`,
//! invalid UTF-8 where text is required is `-EINVAL`, an input above
//! [`defaults::MAX_GUEST_INPUT_BYTES`] is `-ENOMEM`. Output follows the buffer protocol of
//! `docs/abi.md`: the capacity is read from `*out_len_ptr`, a payload that does not fit
//! writes the needed length and is `-ENOSPC`. Nothing here can panic or trap.

use quiver_abi::Errno;
use wasmtime::Caller;

use super::SandboxView;
use crate::defaults;

/// A guest's linear memory, borrowed for the duration of one synchronous step.
pub struct GuestMemory<'a> {
    bytes: &'a mut [u8],
}

/// A validated `(out_ptr, out_len_ptr)` pair.
#[derive(Clone, Copy, Debug)]
pub struct OutBuf {
    ptr: u32,
    cap: u32,
    len_ptr: u32,
}

/// Borrows the guest's memory and the task state at once.
pub fn guest<'a, T: SandboxView>(
    caller: &'a mut Caller<'_, T>,
) -> Result<(GuestMemory<'a>, &'a mut T), Errno> {
    let memory = match caller.data_mut().sandbox().memory {
        Some(memory) => memory,
        // Only before `memory` was cached (a hostcall from a start function).
        None => caller
            .get_export("memory")
            .and_then(|e| e.into_memory())
            .ok_or(Errno::EFAULT)?,
    };
    let (bytes, state) = memory.data_and_store_mut(caller);
    Ok((GuestMemory { bytes }, state))
}

impl<'a> GuestMemory<'a> {
    #[cfg(test)]
    pub(crate) fn from_slice(bytes: &'a mut [u8]) -> Self {
        Self { bytes }
    }

    fn range(&self, ptr: i32, len: u32) -> Result<std::ops::Range<usize>, Errno> {
        let start = ptr as u32 as usize;
        let end = start.checked_add(len as usize).ok_or(Errno::EFAULT)?;
        if end > self.bytes.len() {
            return Err(Errno::EFAULT);
        }
        Ok(start..end)
    }

    /// `len` bytes at `ptr`, as guest input (bounded by the input cap).
    pub fn bytes(&self, ptr: i32, len: i32) -> Result<&[u8], Errno> {
        let range = self.range(ptr, len as u32)?;
        if len as u32 > defaults::MAX_GUEST_INPUT_BYTES {
            return Err(Errno::ENOMEM);
        }
        Ok(&self.bytes[range])
    }

    /// UTF-8 text at `ptr`.
    pub fn str(&self, ptr: i32, len: i32) -> Result<&str, Errno> {
        std::str::from_utf8(self.bytes(ptr, len)?).map_err(|_| Errno::EINVAL)
    }

    pub fn read_u32(&self, ptr: u32) -> Result<u32, Errno> {
        let range = self.range(ptr as i32, 4)?;
        let mut le = [0u8; 4];
        le.copy_from_slice(&self.bytes[range]);
        Ok(u32::from_le_bytes(le))
    }

    pub fn write_u32(&mut self, ptr: u32, value: u32) -> Result<(), Errno> {
        let range = self.range(ptr as i32, 4)?;
        self.bytes[range].copy_from_slice(&value.to_le_bytes());
        Ok(())
    }

    /// Copies `bytes` into guest memory at `ptr`.
    pub fn write(&mut self, ptr: u32, bytes: &[u8]) -> Result<(), Errno> {
        let len = u32::try_from(bytes.len()).map_err(|_| Errno::EFAULT)?;
        let range = self.range(ptr as i32, len)?;
        self.bytes[range].copy_from_slice(bytes);
        Ok(())
    }

    /// An input whose length is stored at `len_ptr` (the `cchat_ctl` convention).
    pub fn bytes_at_len_ptr(&self, ptr: i32, len_ptr: i32) -> Result<&[u8], Errno> {
        let len = self.read_u32(len_ptr as u32)?;
        self.bytes(ptr, len as i32)
    }

    /// Checks an output buffer before any work is done, so a bad pointer never costs a
    /// tool call.
    pub fn out_buf(&self, out_ptr: i32, out_len_ptr: i32) -> Result<OutBuf, Errno> {
        let len_ptr = out_len_ptr as u32;
        let cap = self.read_u32(len_ptr)?;
        self.range(out_ptr, cap)?;
        Ok(OutBuf {
            ptr: out_ptr as u32,
            cap,
            len_ptr,
        })
    }

    /// Copies `payload` out, or reports the needed length with `-ENOSPC`.
    pub fn deliver(&mut self, out: OutBuf, payload: &[u8]) -> Result<i32, Errno> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&l| l <= i32::MAX as u32)
            .ok_or(Errno::ENOMEM)?;
        if len > out.cap {
            self.write_u32(out.len_ptr, len)?;
            return Err(Errno::ENOSPC);
        }
        let range = self.range(out.ptr as i32, len)?;
        self.bytes[range].copy_from_slice(payload);
        self.write_u32(out.len_ptr, len)?;
        Ok(len as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_utf8() {
        let mut data = vec![0u8; 64];
        data[..5].copy_from_slice(b"hello");
        data[8..10].copy_from_slice(&[0xff, 0xfe]);
        let mem = GuestMemory::from_slice(&mut data);
        assert_eq!(mem.str(0, 5), Ok("hello"));
        assert_eq!(mem.str(8, 2), Err(Errno::EINVAL));
        assert_eq!(mem.bytes(60, 5).err(), Some(Errno::EFAULT));
        assert_eq!(mem.bytes(-1, 1).err(), Some(Errno::EFAULT));
        assert_eq!(mem.bytes(1, -1).err(), Some(Errno::EFAULT));
        assert_eq!(mem.bytes(64, 0).map(<[u8]>::len), Ok(0));
        assert_eq!(mem.bytes(65, 0).err(), Some(Errno::EFAULT));
    }

    #[test]
    fn buffer_protocol() {
        let mut data = vec![0u8; 64];
        data[40..44].copy_from_slice(&3u32.to_le_bytes());
        let mut mem = GuestMemory::from_slice(&mut data);
        let out = mem.out_buf(0, 40).unwrap();
        assert_eq!(mem.deliver(out, b"toolong"), Err(Errno::ENOSPC));
        assert_eq!(mem.read_u32(40), Ok(7));
        assert_eq!(
            mem.bytes(0, 7).unwrap(),
            &[0u8; 7],
            "nothing else changes on ENOSPC"
        );
        let out = mem.out_buf(0, 40).unwrap();
        assert_eq!(mem.deliver(out, b"toolong"), Ok(7));
        assert_eq!(mem.bytes(0, 7).unwrap(), b"toolong");
        // A capacity reaching past the end, or a length pointer outside, is EFAULT.
        mem.write_u32(40, 1000).unwrap();
        assert_eq!(mem.out_buf(0, 40).err(), Some(Errno::EFAULT));
        assert_eq!(mem.out_buf(0, 62).err(), Some(Errno::EFAULT));
    }
}
