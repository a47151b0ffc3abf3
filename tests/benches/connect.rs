//! What opening an MCP session costs per lifecycle mode (`initialize`, `discover`, `auto`),
//! against the fixture server over Streamable HTTP on loopback: the time from a cold pool
//! to the first `tools/list` answer. Run: `cargo bench -p quiver-tests --bench connect`.

use quiver_tests::bench::median;
use std::time::Instant;

use quiver::EgressConfig;
use quiver::HostConfig;
use quiver_tests::{FixtureHttp, RegistryDir, host_builder};

#[tokio::main]
async fn main() {
    let runs: usize = std::env::var("QUIVER_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(21);
    let server = FixtureHttp::spawn("http", &[]);
    let registry = RegistryDir::new();
    for mode in ["initialize", "discover", "auto"] {
        registry.write(
            &format!("{mode}.toml"),
            &format!(
                "server_id = {mode:?}\ntransport = \"streamable_http\"\nlifecycle = {mode:?}\nallowed_tools = [\"*\"]\n[http]\nurl = {:?}\n",
                server.url()
            ),
        );
    }
    let config = HostConfig {
        egress: EgressConfig {
            allow_private: vec!["127.0.0.0/8".into()],
            ..EgressConfig::default()
        },
        ..HostConfig::default()
    };
    let mut medians = Vec::new();
    for mode in ["initialize", "discover", "auto"] {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let host = host_builder(&registry)
                .with_config(config.clone(), ".")
                .build()
                .unwrap();
            let started = Instant::now();
            host.server_tools(mode).await.unwrap();
            samples.push(started.elapsed());
            host.shutdown().await;
        }
        medians.push((mode, median(samples)));
    }
    let base = medians[0].1;
    println!("connect + first tools/list over Streamable HTTP (loopback), median of {runs}");
    for (mode, median) in medians {
        println!(
            "  {mode:<10} {:>8.2} ms  ({:.2}x initialize)",
            median.as_secs_f64() * 1e3,
            median.as_secs_f64() / base.as_secs_f64()
        );
    }
}
