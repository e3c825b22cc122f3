//! Gives the heap's free pages back to the operating system on a timer,
//! for the processes that run nodes (`serve`, `dev`).
//!
//! The node allocates with the system's malloc. glibc keeps what the node
//! frees inside its arenas: while a large backlog fills, sled's cache loads
//! and evicts tree pages, and the freed pages between live allocations stay
//! resident until `malloc_trim` hands them back. Trimming every second
//! bounds that slack by how much is freed in between, not by the largest
//! backlog the node ever held.
//!
//! glibc also gives each new thread that allocates an arena of its own
//! (up to eight per core). A node's applies of more than a few hundred
//! messages hand their runtime worker over to a fresh thread
//! (`block_in_place`), so threads come and go, and with an arena each a
//! node holding 10,000,000 messages grew 85-87 MiB instead of 66.
//! [`limit_arenas`] keeps the node to [`MALLOC_ARENAS`].
//!
//! It does not shrink what the node holds (the caches' sizes and the
//! backlogged producers decide that), and it does nothing on systems without
//! glibc, where the system allocator returns memory by its own rules.

use std::time::{Duration, Instant};

/// How often the heap is trimmed. A trim of a node holding 10,000,000
/// messages takes 1-2 ms of one thread (0.1-0.2% of a core at this
/// interval), and holds each arena only while it walks that arena.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// The most malloc arenas a node's threads share. Two cores' worth of
/// threads allocate at a time; the 10,000,000-message backlog grew the
/// same with 2 as before any worker was handed over (+67 MiB against +66),
/// and throughput did not move (side by side, one message per call and
/// batched).
pub const MALLOC_ARENAS: i32 = 2;

/// Caps the malloc arenas at [`MALLOC_ARENAS`]; call it before the
/// process starts its threads. Whether glibc took the setting.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn limit_arenas() -> bool {
    // SAFETY: mallopt takes no pointers and only sets a malloc parameter;
    // glibc reads M_ARENA_MAX when a thread first needs an arena.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) == 1 }
}

/// Without glibc there are no arenas to cap.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn limit_arenas() -> bool {
    false
}

/// Starts the thread that trims the heap every `interval` for the rest of
/// the process's life. It runs on its own thread so that a slow trim never
/// holds up the runtime's workers.
pub fn spawn(interval: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                let started = Instant::now();
                let released = give_back_free_pages();
                tracing::trace!(
                    released,
                    micros = started.elapsed().as_micros() as u64,
                    "heap trimmed"
                );
            }
        })
        .map(|_| ())
}

/// Returns the free pages of every malloc arena to the kernel; whether any
/// were returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn give_back_free_pages() -> bool {
    // SAFETY: malloc_trim takes no pointers, locks each arena while it
    // walks it and is safe to call from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Without glibc there is no trim to ask for.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn give_back_free_pages() -> bool {
    false
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::give_back_free_pages;
    use floret_server::telemetry::resident_bytes;

    #[test]
    fn freed_heap_pages_stay_resident_until_trimmed() {
        const BLOCK: usize = 1024;
        const FREED_BYTES: u64 = 64 << 20;
        // Small blocks come from the thread's arena, not from mmap; the last
        // one stays allocated, so free cannot shrink the heap from its top.
        let mut blocks: Vec<Vec<u8>> = (0..FREED_BYTES as usize / BLOCK)
            .map(|i| vec![i as u8; BLOCK])
            .collect();
        let pinned = blocks.pop();
        drop(blocks);
        let before_trim = resident_bytes().expect("VmRSS in /proc/self/status");
        assert!(give_back_free_pages(), "the trim returned nothing");
        let after_trim = resident_bytes().expect("VmRSS in /proc/self/status");
        assert!(
            before_trim.saturating_sub(after_trim) > FREED_BYTES / 2,
            "trimming gave back {} of {FREED_BYTES} bytes freed ({before_trim} -> {after_trim})",
            before_trim.saturating_sub(after_trim)
        );
        drop(pinned);
    }
}
