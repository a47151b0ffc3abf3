//! The store data of one task: the sandbox and each capability's task state, and the fd
//! kinds they share. This is the one place that knows every capability; each reaches its
//! part through its view trait.

use std::sync::Arc;

use wasmtime::Linker;

use crate::chat::{self, ChatResponse, ChatSession, ChatTask, ChatView};
use crate::mcp::{self, McpCall, McpSession, McpTask, McpView};
use quiver_abi::epoll_events::OUT;

use crate::sandbox::{EpollSet, FdKindOf, Pollable, Sandbox, SandboxView};
use crate::stream::{self, StreamView, UserStreamCtlFd, UserStreamFd};

/// What an fd refers to.
pub(crate) enum FdKind {
    McpSession(McpSession),
    McpCall(McpCall),
    ChatSession(ChatSession),
    ChatResponse(ChatResponse),
    Epoll(EpollSet),
    UserStream(UserStreamFd),
    UserStreamCtl(UserStreamCtlFd),
}

impl Pollable for FdKind {
    fn kind_name(&self) -> &'static str {
        match self {
            FdKind::McpSession(_) => "McpSession",
            FdKind::McpCall(_) => "McpCall",
            FdKind::ChatSession(_) => "ChatSession",
            FdKind::ChatResponse(_) => "ChatResponse",
            FdKind::Epoll(_) => "Epoll",
            FdKind::UserStream(_) => "UserStream",
            FdKind::UserStreamCtl(_) => "UserStreamCtl",
        }
    }

    fn readiness(&mut self) -> i32 {
        match self {
            // A session always takes another request.
            FdKind::McpSession(_) | FdKind::ChatSession(_) => OUT,
            FdKind::ChatResponse(response) => response.readiness(),
            FdKind::McpCall(call) => call.readiness(),
            FdKind::Epoll(_) => 0,
            FdKind::UserStream(stream) => stream.readiness(),
            FdKind::UserStreamCtl(ctl) => ctl.readiness(),
        }
    }

    fn metrics(&self) -> Option<Vec<u8>> {
        match self {
            FdKind::ChatResponse(response) => response.metrics(),
            _ => None,
        }
    }

    fn is_epoll(&self) -> bool {
        matches!(self, FdKind::Epoll(_))
    }
}

impl FdKindOf<McpCall> for FdKind {
    fn wrap(value: McpCall) -> Self {
        FdKind::McpCall(value)
    }
    fn peek(&mut self) -> Option<&mut McpCall> {
        match self {
            FdKind::McpCall(call) => Some(call),
            _ => None,
        }
    }
}

impl FdKindOf<UserStreamFd> for FdKind {
    fn wrap(value: UserStreamFd) -> Self {
        FdKind::UserStream(value)
    }
    fn peek(&mut self) -> Option<&mut UserStreamFd> {
        match self {
            FdKind::UserStream(stream) => Some(stream),
            _ => None,
        }
    }
}

impl FdKindOf<UserStreamCtlFd> for FdKind {
    fn wrap(value: UserStreamCtlFd) -> Self {
        FdKind::UserStreamCtl(value)
    }
    fn peek(&mut self) -> Option<&mut UserStreamCtlFd> {
        match self {
            FdKind::UserStreamCtl(ctl) => Some(ctl),
            _ => None,
        }
    }
}

impl FdKindOf<EpollSet> for FdKind {
    fn wrap(value: EpollSet) -> Self {
        FdKind::Epoll(value)
    }
    fn peek(&mut self) -> Option<&mut EpollSet> {
        match self {
            FdKind::Epoll(set) => Some(set),
            _ => None,
        }
    }
}

impl FdKindOf<McpSession> for FdKind {
    fn wrap(value: McpSession) -> Self {
        FdKind::McpSession(value)
    }
    fn peek(&mut self) -> Option<&mut McpSession> {
        match self {
            FdKind::McpSession(session) => Some(session),
            _ => None,
        }
    }
}

impl FdKindOf<ChatSession> for FdKind {
    fn wrap(value: ChatSession) -> Self {
        FdKind::ChatSession(value)
    }
    fn peek(&mut self) -> Option<&mut ChatSession> {
        match self {
            FdKind::ChatSession(session) => Some(session),
            _ => None,
        }
    }
}

impl FdKindOf<ChatResponse> for FdKind {
    fn wrap(value: ChatResponse) -> Self {
        FdKind::ChatResponse(value)
    }
    fn peek(&mut self) -> Option<&mut ChatResponse> {
        match self {
            FdKind::ChatResponse(response) => Some(response),
            _ => None,
        }
    }
}

/// The store data of one task.
pub(crate) struct TaskState {
    pub(crate) sandbox: Sandbox<FdKind>,
    pub(crate) mcp: Arc<McpTask>,
    pub(crate) chat: Arc<ChatTask>,
    /// The task's user streams, while it runs; dropping it (the store) ends their session.
    pub(crate) streams: Option<stream::Bound>,
}

impl SandboxView for TaskState {
    type Fd = FdKind;
    fn sandbox(&mut self) -> &mut Sandbox<FdKind> {
        &mut self.sandbox
    }
}

impl McpView for TaskState {
    fn mcp(&self) -> &Arc<McpTask> {
        &self.mcp
    }
}

impl StreamView for TaskState {
    fn user_streams(&self) -> Option<stream::GuestSide> {
        self.streams.as_ref().map(stream::Bound::guest)
    }
}

impl ChatView for TaskState {
    fn chat(&self) -> &Arc<ChatTask> {
        &self.chat
    }
}

/// Every capability's `spear` imports (the sandbox adds its own and WASI).
pub(crate) fn add_to_linker(linker: &mut Linker<TaskState>) -> wasmtime::Result<()> {
    crate::sandbox::add_fd_to_linker(linker)?;
    mcp::add_to_linker(linker)?;
    stream::add_to_linker(linker)?;
    chat::add_to_linker(linker)
}

#[cfg(test)]
mod tests {
    use quiver_abi::{IMPORTS, ValType};
    use wasmtime::{Engine, Linker, Module};

    use super::TaskState;
    use super::add_to_linker;
    use crate::sandbox;

    /// A module importing every `spear` function of the ABI crate with `result` as the
    /// type of `time_now_ms`.
    fn importer(time_result: &str) -> String {
        let imports: String = IMPORTS
            .iter()
            .map(|import| {
                let params = " i32".repeat(import.params.len());
                let result = match (import.name, import.result) {
                    ("time_now_ms", _) => format!(" (result {time_result})"),
                    (_, Some(ValType::I32)) => " (result i32)".to_owned(),
                    (_, Some(ValType::I64)) => " (result i64)".to_owned(),
                    (_, None) => String::new(),
                };
                format!(
                    "(import \"spear\" \"{}\" (func (param{params}){result}))\n",
                    import.name
                )
            })
            .collect();
        format!("(module {imports} (memory (export \"memory\") 1))")
    }

    #[test]
    fn the_host_defines_every_import_with_the_abi_signature() {
        let engine = Engine::default();
        let mut linker = Linker::<TaskState>::new(&engine);
        sandbox::add_to_linker(&mut linker).unwrap();
        add_to_linker(&mut linker).unwrap();
        let module = Module::new(&engine, importer("i64")).unwrap();
        linker
            .instantiate_pre(&module)
            .expect("every ABI import resolves with its signature");
        let wrong = Module::new(&engine, importer("i32")).unwrap();
        assert!(
            linker.instantiate_pre(&wrong).is_err(),
            "a signature mismatch must be caught"
        );
    }
}
