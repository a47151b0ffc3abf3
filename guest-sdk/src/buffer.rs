//! Argument passing and the output buffer protocol shared by every hostcall wrapper.

use crate::{Errno, Error, Result};

/// Initial capacity of an output buffer.
pub(crate) const INITIAL_CAPACITY: usize = 4 * 1024;

/// How many times a call is made before `-ENOSPC` is given up on.
pub(crate) const MAX_ATTEMPTS: usize = 8;

/// A pointer as the `i32` memory offset the host expects.
///
/// On `wasm32` this is exact. On native targets the value is meaningless, but only the
/// `-ENOSYS` fallbacks in [`crate::sys`] ever see it.
pub(crate) fn addr<T: ?Sized>(ptr: *const T) -> i32 {
    ptr.cast::<u8>() as usize as i32
}

/// The `(ptr, len)` pair of a byte string argument.
pub(crate) fn arg(op: &str, bytes: &[u8]) -> Result<(i32, i32)> {
    let len = i32::try_from(bytes.len()).map_err(|_| Error::from_errno(op, Errno::EINVAL))?;
    Ok((addr(bytes.as_ptr()), len))
}

/// Turns a hostcall return value into `Ok(value)` or the `-errno` error.
pub(crate) fn check(op: impl FnOnce() -> String, ret: i32) -> Result<i32> {
    match Errno::from_ret(ret) {
        None => Ok(ret),
        Some(errno) => Err(Error::from_errno(op(), errno)),
    }
}

/// Runs a hostcall that returns bytes through the output buffer protocol.
///
/// `call(out, out_len)` must make the hostcall with `out` as `out_ptr` and `out_len` as
/// `out_len_ptr` (see [`addr`]); `*out_len` holds the buffer's capacity on entry. On
/// `-ENOSPC` the host has written the needed length into `*out_len`, and the identical call
/// is repeated with a buffer of that size (the host keeps side-effecting results such as a
/// tool call's on the fd, so the work does not run twice). After [`MAX_ATTEMPTS`] calls the
/// `-ENOSPC` is returned to the caller.
pub(crate) fn call_with_buffer(
    op: &str,
    initial_cap: usize,
    mut call: impl FnMut(*mut u8, *mut u32) -> i32,
) -> Result<Vec<u8>> {
    let fail = |errno| Error::from_errno(op, errno);
    let mut cap = initial_cap;
    for _ in 0..MAX_ATTEMPTS {
        let cap32 = u32::try_from(cap).map_err(|_| fail(Errno::ENOMEM))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(cap)
            .map_err(|_| fail(Errno::ENOMEM))?;
        buf.resize(cap, 0u8);
        // wasm32 is little-endian, so a native `u32` is the protocol's LE `u32`.
        let mut len = cap32;
        let ret = call(buf.as_mut_ptr(), &mut len);
        match Errno::from_ret(ret) {
            None => {
                let len = len as usize;
                if len > cap {
                    // The host claims to have written past the end of the buffer.
                    return Err(fail(Errno::EIO));
                }
                buf.truncate(len);
                return Ok(buf);
            }
            Some(Errno::ENOSPC) => {
                let needed = len as usize;
                // A well-behaved host always asks for more; never retry with the same size.
                cap = if needed > cap {
                    needed
                } else {
                    cap.saturating_mul(2).max(1)
                };
            }
            Some(errno) => return Err(fail(errno)),
        }
    }
    Err(fail(Errno::ENOSPC))
}

/// [`call_with_buffer`] followed by JSON decoding of the bytes.
pub(crate) fn call_json(
    op: &str,
    call: impl FnMut(*mut u8, *mut u32) -> i32,
) -> Result<serde_json::Value> {
    let bytes = call_with_buffer(op, INITIAL_CAPACITY, call)?;
    serde_json::from_slice(&bytes).map_err(|e| Error::from_json(op, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A fake host call that holds `payload` and follows the protocol.
    fn host(payload: &[u8], calls: &Cell<usize>) -> impl FnMut(*mut u8, *mut u32) -> i32 {
        move |out, out_len| {
            calls.set(calls.get() + 1);
            // SAFETY: `call_with_buffer` passes a buffer of `*out_len` bytes.
            unsafe {
                let cap = *out_len as usize;
                *out_len = payload.len() as u32;
                if payload.len() > cap {
                    return -Errno::ENOSPC.raw();
                }
                std::ptr::copy_nonoverlapping(payload.as_ptr(), out, payload.len());
            }
            payload.len() as i32
        }
    }

    #[test]
    fn fits_first_time() {
        let calls = Cell::new(0);
        let out = call_with_buffer("op", 16, host(b"hello", &calls)).unwrap();
        assert_eq!(out, b"hello");
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn grows_to_needed_length_once() {
        let payload = vec![7u8; 10_000];
        let calls = Cell::new(0);
        let out = call_with_buffer("op", INITIAL_CAPACITY, host(&payload, &calls)).unwrap();
        assert_eq!(out, payload);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn empty_payload() {
        let calls = Cell::new(0);
        assert_eq!(call_with_buffer("op", 0, host(b"", &calls)).unwrap(), b"");
    }

    #[test]
    fn gives_up_after_max_attempts() {
        let mut calls = 0;
        let err = call_with_buffer("op", 4, |_, out_len| {
            calls += 1;
            // SAFETY: `out_len` points at the length word.
            unsafe { *out_len += 1 };
            -Errno::ENOSPC.raw()
        })
        .unwrap_err();
        assert_eq!(calls, MAX_ATTEMPTS);
        assert_eq!(err.errno(), Some(Errno::ENOSPC));
        assert_eq!(err.op(), "op");
    }

    #[test]
    fn enospc_without_a_bigger_length_still_grows() {
        let mut caps = Vec::new();
        let _ = call_with_buffer("op", 4, |_, out_len| {
            // SAFETY: `out_len` points at the length word.
            unsafe {
                caps.push(*out_len);
                *out_len = 0;
            }
            -Errno::ENOSPC.raw()
        });
        assert_eq!(caps, [4, 8, 16, 32, 64, 128, 256, 512]);
    }

    #[test]
    fn passes_other_errors_through() {
        let err =
            call_with_buffer("mcp_list_tools(\"fs\")", 4, |_, _| -Errno::EBADF.raw()).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EBADF));
        assert_eq!(
            err.to_string(),
            "mcp_list_tools(\"fs\") failed: EBADF (9): not an open fd, or an fd of another kind"
        );
    }

    #[test]
    fn rejects_length_past_the_buffer() {
        let err = call_with_buffer("op", 4, |_, out_len| {
            // SAFETY: `out_len` points at the length word.
            unsafe { *out_len = 5 };
            5
        })
        .unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EIO));
    }

    #[test]
    fn call_json_reports_decode_errors() {
        let calls = Cell::new(0);
        let err = call_json("op", host(b"not json", &calls)).unwrap_err();
        assert!(matches!(err, Error::Json { .. }));
        let calls = Cell::new(0);
        let value = call_json("op", host(br#"{"a":1}"#, &calls)).unwrap();
        assert_eq!(value["a"], 1);
    }
}
