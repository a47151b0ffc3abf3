//! Raw hostcall imports from the `spear` import module.
//!
//! These are the functions exactly as the host exports them, declared from the ABI crate's
//! one list of imports ([`quiver_abi::spear_imports!`]): every parameter is an `i32`, a
//! pointer is an offset into this module's linear memory, and every "length pointer"
//! points at a little-endian `u32`. A return value `>= 0` is success, a negative value is
//! `-errno`. Prefer the safe wrappers in the rest of the crate; this module exists for
//! callers that need a hostcall the wrappers do not cover yet. See `docs/abi.md` for what
//! each one does.
//!
//! On targets other than `wasm32` the functions are replaced by fallbacks with identical
//! signatures that return `-ENOSYS` (and `0` for [`time_now_ms`]), so the crate, its docs
//! and its unit tests build natively.
//!
//! # Safety
//!
//! Every pointer argument must be the address of memory of the stated length that the
//! host may read (inputs) or write (outputs) for the duration of the call. Out-of-range
//! pointers are reported by the host as `-EFAULT`, but a valid-looking pointer to memory
//! the guest still uses elsewhere will be overwritten.

pub use quiver_abi::ctl::{
    ADD_MESSAGE as CTL_ADD_MESSAGE, GET_MESSAGES as CTL_GET_MESSAGES,
    GET_METRICS as CTL_GET_METRICS, SET_PARAM as CTL_SET_PARAM,
};
pub use quiver_abi::send_flags::{AUTO_TOOL_CALL as SEND_AUTO_TOOL_CALL, METRICS as SEND_METRICS};

#[cfg(target_arch = "wasm32")]
macro_rules! declare_imports {
    ($( fn $name:ident($($param:ident),*) -> $ret:tt; )*) => {
        #[link(wasm_import_module = "spear")]
        unsafe extern "C" {
            $(
                #[doc = concat!("The `", stringify!($name), "` hostcall (see `docs/abi.md`).")]
                #[allow(clippy::unused_unit)]
                pub fn $name($($param: i32),*) -> $ret;
            )*
        }
    };
}

#[cfg(not(target_arch = "wasm32"))]
macro_rules! declare_imports {
    ($( fn $name:ident($($param:ident),*) -> $ret:tt; )*) => {
        $(
            #[doc = concat!("Native stand-in for the `", stringify!($name), "` hostcall: there is no host, so it fails with `-ENOSYS` (the clocks and `random_i64` return 0, `sleep_ms` returns at once).")]
            #[allow(clippy::missing_safety_doc, clippy::too_many_arguments, clippy::unused_unit, unused_variables)]
            pub unsafe fn $name($($param: i32),*) -> $ret {
                fallback_result()
            }
        )*
    };
}

/// What a native stand-in returns: `-ENOSYS` for the `i32` hostcalls, 0 for the clock.
#[cfg(not(target_arch = "wasm32"))]
fn fallback_result<T: Fallback>() -> T {
    T::FALLBACK
}

#[cfg(not(target_arch = "wasm32"))]
trait Fallback {
    const FALLBACK: Self;
}

#[cfg(not(target_arch = "wasm32"))]
impl Fallback for i32 {
    const FALLBACK: i32 = quiver_abi::Errno::ENOSYS.ret();
}

#[cfg(not(target_arch = "wasm32"))]
impl Fallback for i64 {
    const FALLBACK: i64 = 0;
}

#[cfg(not(target_arch = "wasm32"))]
impl Fallback for () {
    const FALLBACK: () = ();
}

quiver_abi::spear_imports!(declare_imports);
