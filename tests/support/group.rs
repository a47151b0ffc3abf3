//! Servers that leave children behind, and finding what is left of a process group.
//!
//! A real server's wrapper (`npx`, a shell script) often starts processes of its own. The
//! fixture server is started here through `sh`, which first starts a long `sleep` in the
//! background and writes its pid to a file, then execs the fixture server: the server is
//! the group leader and the `sleep` a member that outlives it unless the group is stopped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{RegistryDir, fixture_server, pid_alive};

/// A registered fixture server with a child of its own.
pub struct ServerWithChild {
    pub server_id: String,
    /// Where the `sh` wrapper writes the pid of its `sleep` child (rewritten per start).
    pub child_pid_file: PathBuf,
}

impl ServerWithChild {
    /// Registers the fixture server as `server_id` in `registry`, allowing every tool, with
    /// `fixture_args` after `--name ID` and `extra` TOML appended (a `[budgets]` table) and
    /// `stdio_extra` lines added to its `[stdio]` table (e.g. `idle_timeout_ms = 0`).
    pub fn register(
        registry: &RegistryDir,
        server_id: &str,
        fixture_args: &[&str],
        stdio_extra: &str,
        extra: &str,
    ) -> ServerWithChild {
        let child_pid_file = registry.path().join(format!("{server_id}.child-pid"));
        let script = r#"sleep 600 & echo $! > "$1.tmp" && mv "$1.tmp" "$1"; shift; exec "$@""#;
        let mut args = vec![
            "-c".to_owned(),
            script.to_owned(),
            "sh".to_owned(),
            child_pid_file.display().to_string(),
            fixture_server().display().to_string(),
            "--name".to_owned(),
            server_id.to_owned(),
        ];
        args.extend(fixture_args.iter().map(|a| a.to_string()));
        let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
        registry.write(
            &format!("{server_id}.toml"),
            &format!(
                "server_id = {server_id:?}\ntransport = \"stdio\"\nallowed_tools = [\"*\"]\n\n[stdio]\ncommand = \"/bin/sh\"\nargs = [{}]\n{stdio_extra}\n\n{extra}\n",
                args.join(", ")
            ),
        );
        ServerWithChild {
            server_id: server_id.to_owned(),
            child_pid_file,
        }
    }

    /// The pid of the child the latest start left, waiting up to 20 s for the file.
    pub fn child_pid(&self) -> u32 {
        read_pid_file(&self.child_pid_file, Duration::from_secs(20))
    }

    /// Forgets the recorded child, so the next [`Self::child_pid`] waits for a new start.
    pub fn forget_child(&self) {
        let _ = std::fs::remove_file(&self.child_pid_file);
    }
}

/// Reads a pid written to `path`, waiting up to `within` for the file to appear.
pub fn read_pid_file(path: &Path, within: Duration) -> u32 {
    let start = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            start.elapsed() < within,
            "no pid in {} after {within:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Live (non-zombie) processes whose process group is `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // After the command name: state, ppid, pgrp, ...
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map_or("", |(_, rest)| rest)
                .split_whitespace()
                .collect();
            fields.first().is_some_and(|state| *state != "Z")
                && fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid)
        })
        .collect()
}

/// What is left of group `pgid` and of `pids`: live processes, sorted.
pub fn left_of(pgid: u32, pids: &[u32]) -> Vec<u32> {
    let mut left = group_members(pgid);
    left.extend(pids.iter().copied().filter(|&pid| pid_alive(pid)));
    left.sort_unstable();
    left.dedup();
    left
}

/// Waits up to `within` until no live process is in group `pgid` and `pids` are gone;
/// returns what is left. Blocks the thread: for tests without a runtime.
pub fn wait_group_gone(pgid: u32, pids: &[u32], within: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let left = left_of(pgid, pids);
        if left.is_empty() || start.elapsed() >= within {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`wait_group_gone`] for async tests: the host's background work keeps running.
pub async fn group_gone(pgid: u32, pids: &[u32], within: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let left = left_of(pgid, pids);
        if left.is_empty() || start.elapsed() >= within {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
