//! User streams: a client talks to a running task over SPEAR's `user_stream_*` hostcalls
//! and SSF v1 frames (SPEAR's `wasm-user-stream-bridge`). The embedder holds a
//! [`UserStreams`] for the task and attaches one [`StreamClient`]; the node carries it over
//! a WebSocket, `quiver run --user-stream-stdio` over the terminal.

mod hostcalls;
mod hub;
mod ssf;

pub(crate) use hostcalls::add_to_linker;
pub(crate) use hostcalls::{StreamView, UserStreamCtlFd, UserStreamFd};
pub use hub::{AttachError, SendError, StreamClient, UserStreams};
pub(crate) use hub::{Bound, GuestSide};
pub use ssf::{FrameError, data_frame, frame_data};
