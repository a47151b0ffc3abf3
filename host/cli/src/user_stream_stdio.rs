//! `quiver run --user-stream-stdio`: user stream 0 of the task on the terminal. Each read
//! of stdin (at most [`CHUNK`] bytes) is one SSF DATA frame to the guest; the data of each
//! frame the guest writes goes to stdout. At the end of stdin the session closes once the
//! guest has read every frame (and had a moment to answer the last), so an echoing guest
//! answers the last line before it hears the session close.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use quiver::StreamClient;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The most of stdin one frame carries.
const CHUNK: usize = 64 * 1024;

/// How long the frames the guest wrote before it ended may take to reach stdout.
const DRAIN: Duration = Duration::from_secs(2);

/// After the guest has read the end of stdin, the moment it gets to answer before it
/// hears the session close (an echo writes right after its read).
const ANSWER_GRACE: Duration = Duration::from_millis(200);

pub(crate) struct Stdio {
    input: JoinHandle<()>,
    output: JoinHandle<()>,
}

pub(crate) fn start(client: StreamClient) -> Stdio {
    let client = Arc::new(client);
    let sender = client.clone();
    let chunks = read_stdin();
    let input = tokio::spawn(async move {
        let mut chunks = chunks;
        let mut seq = 0u64;
        while let Some(chunk) = chunks.recv().await {
            seq += 1;
            if let Err(e) = sender.send(quiver::ssf_data_frame(0, seq, &chunk)).await {
                eprintln!("quiver: user stream: {e}");
                return;
            }
        }
        sender.drained().await;
        tokio::time::sleep(ANSWER_GRACE).await;
        sender.close();
    });
    let output = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(frame) = client.recv().await {
            let Ok(data) = quiver::ssf_frame_data(&frame) else {
                continue;
            };
            if stdout.write_all(data).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    Stdio { input, output }
}

/// Stdin's chunks, read on a detached thread: a blocking read cannot be stopped, and
/// tokio's stdin would hold the runtime's shutdown (and the exit) until the next line.
fn read_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(1);
    let spawned = std::thread::Builder::new()
        .name("user-stream-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if tx.blocking_send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("quiver: user stream: cannot read stdin: {e}");
    }
    rx
}

impl Stdio {
    /// After the task: stops reading stdin and lets the guest's last frames out.
    pub(crate) async fn finish(self) {
        self.input.abort();
        let _ = tokio::time::timeout(DRAIN, self.output).await;
    }
}
