//! `quiver run --user-stream-stdio`: user stream 0 of the task on the terminal. Each read
//! of stdin (at most [`CHUNK`] bytes) is one SSF DATA frame to the guest; the data of each
//! frame the guest writes goes to stdout. At the end of stdin the session closes once the
//! guest has read every frame (and had a moment to answer the last), so an echoing guest
//! answers the last line before it hears the session close.

use std::sync::Arc;
use std::time::Duration;

use quiver::StreamClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    let input = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; CHUNK];
        let mut seq = 0u64;
        loop {
            let n = match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            seq += 1;
            if let Err(e) = sender.send(quiver::ssf_data_frame(0, seq, &buf[..n])).await {
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

impl Stdio {
    /// After the task: stops reading stdin and lets the guest's last frames out.
    pub(crate) async fn finish(self) {
        self.input.abort();
        let _ = tokio::time::timeout(DRAIN, self.output).await;
    }
}
