//! Several things in flight at once: a small single-threaded executor over the host's
//! epoll (`spear_epoll_*`).
//!
//! [`Mcp::call_tool_async`](crate::Mcp::call_tool_async) and
//! [`Chat::send_async`](crate::Chat::send_async) start their work in the host and return a
//! future at once; [`join_all`] (or [`join`]) combines them, and [`block_on`] runs the
//! whole until it is done, sleeping in `spear_epoll_wait` whenever nothing can go on. The
//! host does the waiting, so three tool calls of 300 ms each take about 300 ms together.
//!
//! ```no_run
//! use quiver_guest::{Mcp, rt};
//!
//! # fn main() -> quiver_guest::Result<()> {
//! let mcp = Mcp::open("files")?;
//! let calls = ["a.txt", "b.txt", "c.txt"]
//!     .map(|path| mcp.call_tool_async("read_file", serde_json::json!({"path": path})));
//! let calls: Vec<_> = calls.into_iter().collect::<quiver_guest::Result<_>>()?;
//! for result in rt::block_on(rt::join_all(calls))? {
//!     println!("{}", result?.text());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The executor is deliberately small: one future at a time per [`block_on`], polled again
//! whenever a fd it waits for is ready; futures of this module say which fd they wait for
//! when they are pending. Other futures (from other crates) that are pending without such
//! an fd make `block_on` fail with [`Errno::EINVAL`] rather than wait forever.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use quiver_abi::epoll_events::IN;
use quiver_abi::epoll_op;

use crate::buffer::{INITIAL_CAPACITY, addr, call_with_buffer, check};
use crate::{Errno, Error, Result, sys};

thread_local! {
    /// Fds that pending futures of this module wait to become readable.
    static WAITING: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
}

/// Called by a pending future: wake the executor when `fd` is readable.
fn wait_for(fd: i32) {
    WAITING.with(|w| {
        let mut w = w.borrow_mut();
        if !w.contains(&fd) {
            w.push(fd);
        }
    });
}

/// An epoll set of the host, closed when dropped.
struct Epoll(i32);

impl Epoll {
    fn new() -> Result<Epoll> {
        // SAFETY: no pointer arguments.
        let ret = unsafe { sys::spear_epoll_create() };
        check(|| "spear_epoll_create".to_owned(), ret).map(Epoll)
    }

    /// Waits until one of `fds` is readable (or its work failed, or it was closed).
    fn wait_any(&self, fds: &[i32]) -> Result<()> {
        let op = || "spear_epoll_wait".to_owned();
        for &fd in fds {
            // SAFETY: no pointer arguments.
            check(op, unsafe {
                sys::spear_epoll_ctl(self.0, epoll_op::ADD, fd, IN)
            })?;
        }
        let mut records = [0i32; 16];
        let mut len = (records.len() * 4) as u32;
        // SAFETY: `records` is writable for `len` bytes; `len` is a readable u32.
        let ret = unsafe {
            sys::spear_epoll_wait(self.0, addr(records.as_mut_ptr()), addr(&raw mut len), -1)
        };
        let waited = check(op, ret).map(drop);
        for &fd in fds {
            // SAFETY: no pointer arguments. A closed fd is deleted as well.
            unsafe { sys::spear_epoll_ctl(self.0, epoll_op::DEL, fd, 0) };
        }
        waited
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: no pointer arguments.
        unsafe { sys::spear_epoll_close(self.0) };
    }
}

/// Runs `future` to its end, waiting in the host (`spear_epoll_wait`) whenever it is
/// pending. `Err` only if the host refuses the wait, or a pending future did not say what
/// it waits for ([`Errno::EINVAL`]).
pub fn block_on<F: Future>(future: F) -> Result<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    let mut epoll = None;
    loop {
        WAITING.with(|w| w.borrow_mut().clear());
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return Ok(output);
        }
        let fds = WAITING.with(|w| std::mem::take(&mut *w.borrow_mut()));
        if fds.is_empty() {
            return Err(Error::from_errno(
                "block_on: a future waits for nothing the host knows",
                Errno::EINVAL,
            ));
        }
        let epoll = match &mut epoll {
            Some(epoll) => epoll,
            None => epoll.insert(Epoll::new()?),
        };
        epoll.wait_any(&fds)?;
    }
}

/// A future of every future's output, in their order.
pub struct JoinAll<F: Future> {
    futures: Vec<Pin<Box<F>>>,
    outputs: Vec<Option<F::Output>>,
}

/// Runs `futures` together; the output is theirs, in order.
pub fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> JoinAll<F> {
    let futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let outputs = futures.iter().map(|_| None).collect();
    JoinAll { futures, outputs }
}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The futures are pinned in their boxes, so `Self` is `Unpin`.
        let this = self.get_mut();
        let mut done = true;
        for (future, output) in this.futures.iter_mut().zip(this.outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => done = false,
                }
            }
        }
        if !done {
            return Poll::Pending;
        }
        Poll::Ready(this.outputs.iter_mut().filter_map(Option::take).collect())
    }
}

impl<F: Future> Unpin for JoinAll<F> {}

/// Runs two futures together.
pub async fn join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(v) = a.as_mut().poll(cx)
        {
            ra = Some(v);
        }
        if rb.is_none()
            && let Poll::Ready(v) = b.as_mut().poll(cx)
        {
            rb = Some(v);
        }
        match (ra.is_some(), rb.is_some()) {
            (true, true) => Poll::Ready(()),
            _ => Poll::Pending,
        }
    })
    .await;
    (ra.expect("ready"), rb.expect("ready"))
}

/// The answer of work in flight behind `fd`, read with `read` (a hostcall with the output
/// buffer protocol that answers `-EAGAIN` until the work is done).
pub(crate) struct InFlight<R> {
    pub(crate) fd: i32,
    pub(crate) op: String,
    pub(crate) read: R,
}

impl<R: Fn(i32, i32, i32) -> i32 + Unpin> Future for InFlight<R> {
    type Output = Result<Vec<u8>>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let read = call_with_buffer(&this.op, INITIAL_CAPACITY, |out, out_len| {
            (this.read)(this.fd, addr(out), addr(out_len))
        });
        match read {
            Err(error) if error.errno() == Some(Errno::EAGAIN) => {
                wait_for(this.fd);
                Poll::Pending
            }
            other => Poll::Ready(other),
        }
    }
}
