//! The ABI's errno values as hostcalls return them (negative), for matching guest results;
//! taken from `quiver::Errno` so a test can never disagree with the ABI crate.

use quiver::Errno;

pub const EPERM: i32 = Errno::EPERM.ret();
pub const ENOENT: i32 = Errno::ENOENT.ret();
pub const EIO: i32 = Errno::EIO.ret();
pub const EBADF: i32 = Errno::EBADF.ret();
pub const EAGAIN: i32 = Errno::EAGAIN.ret();
pub const ENOMEM: i32 = Errno::ENOMEM.ret();
pub const EACCES: i32 = Errno::EACCES.ret();
pub const EFAULT: i32 = Errno::EFAULT.ret();
pub const EINVAL: i32 = Errno::EINVAL.ret();
pub const EMFILE: i32 = Errno::EMFILE.ret();
pub const ENOSPC: i32 = Errno::ENOSPC.ret();
pub const ENOSYS: i32 = Errno::ENOSYS.ret();
pub const ENOTCONN: i32 = Errno::ENOTCONN.ret();
pub const ETIMEDOUT: i32 = Errno::ETIMEDOUT.ret();
