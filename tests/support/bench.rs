//! What every benchmark under `tests/benches` reads its settings and figures with.

/// The environment variable `name` as a number, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Which rows the comma-separated environment variable `name` picks (to profile some
/// alone): every row when it is unset.
pub fn env_picks(name: &str) -> impl Fn(&str) -> bool + use<> {
    let picked: Option<Vec<String>> = std::env::var(name)
        .ok()
        .map(|list| list.split(',').map(|row| row.trim().to_owned()).collect());
    move |row| {
        picked
            .as_ref()
            .is_none_or(|picked| picked.iter().any(|p| p == row))
    }
}

/// The median of `samples` (the upper one of an even count); `samples` must not be empty.
pub fn median<T: PartialOrd + Copy>(mut samples: Vec<T>) -> T {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    samples[samples.len() / 2]
}

/// `field` of each of process `pid`'s live threads (read from `/proc/PID/task/*/FILE`),
/// summed; 0 when the process is gone.
fn sum_over_threads(pid: u32, file: &str, field: impl Fn(&str) -> Option<u64>) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join(file)).ok())
        .filter_map(|text| field(&text))
        .sum()
}

/// Voluntary context switches of process `pid` so far, summed over its threads.
pub fn context_switches(pid: u32) -> u64 {
    sum_over_threads(pid, "status", |status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse().ok())
    })
}

/// CPU time process `pid`'s live threads have run so far (`/proc/PID/task/*/schedstat`,
/// in nanoseconds, where `/proc/PID/stat` counts whole clock ticks). A thread that exits
/// between two readings takes its time with it, so a difference can read low.
pub fn process_cpu_time(pid: u32) -> std::time::Duration {
    std::time::Duration::from_nanos(sum_over_threads(pid, "schedstat", |stat| {
        stat.split_whitespace().next()?.parse().ok()
    }))
}

/// CPU time (user and system) used so far by this process's threads, or by the calling
/// thread alone with `thread`.
pub fn cpu_time(thread: bool) -> std::time::Duration {
    let who = if thread {
        libc::RUSAGE_THREAD
    } else {
        libc::RUSAGE_SELF
    };
    // SAFETY: `getrusage` writes one `rusage` into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    let time =
        |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// A global allocator that counts the heap allocations (`alloc`, `alloc_zeroed`,
/// `realloc`) of every thread but the in-process test servers' own: a figure the machine's
/// noise does not blur. A bench installs it with
/// `#[global_allocator] static ALLOCATOR: CountingAllocator = CountingAllocator;`.
pub struct CountingAllocator;

static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Allocations counted so far by [`CountingAllocator`] (0 where it is not installed).
pub fn allocations() -> u64 {
    ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

fn count_allocation() {
    if !crate::serve::on_server_thread() {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; counting allocates
// nothing.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_allocation();
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_allocation();
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}
