//! What every benchmark under `tests/benches` reads its settings and figures with.

/// The environment variable `name` as a number, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of `samples` (the upper one of an even count); `samples` must not be empty.
pub fn median<T: PartialOrd + Copy>(mut samples: Vec<T>) -> T {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    samples[samples.len() / 2]
}
