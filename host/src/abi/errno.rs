//! Errno values come from the ABI crate, where they are defined once for host and guests.

pub use quiver_abi::Errno;
