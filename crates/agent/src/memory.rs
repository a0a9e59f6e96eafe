//! The allocator's side of the controller agent's memory: how much of the heap
//! is live, and giving back what a burst of handshakes left free.
//!
//! A handshake needs far more memory while it runs (TLS state, the peer's
//! certificate chain being parsed and verified, CRYPTO frames, quinn's
//! `Incoming`) than the connection keeps afterwards. After a restart a
//! thousand of them run at once, and glibc's malloc keeps what they freed
//! inside its arenas: between the connections' long-lived allocations the
//! freed chunks cannot be trimmed from the top of a heap, so they stay
//! resident and count in the process's RSS (issue 18 measured it: see
//! docs/scale.md, "Memory per switch connection"). `malloc_trim(0)` gives
//! every whole free page in every arena back to the kernel
//! (`MADV_DONTNEED`); the live allocations do not move. The controller agent
//! calls it once a burst of handshakes is over ([`TrimPolicy`]).
//!
//! Only glibc has these calls; elsewhere [`heap`] is `None` and [`trim`] does
//! nothing.

use serde::{Deserialize, Serialize};

/// The allocator's counters (glibc's `mallinfo2`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HeapStats {
    /// Bytes in live allocations (`uordblks` + `hblkhd`: small ones in the
    /// arenas, large ones mapped on their own).
    pub in_use: u64,
    /// Bytes the arenas hold free (`fordblks`): resident unless trimmed.
    pub free: u64,
    /// Bytes the arenas took from the kernel (`arena`) plus the separately
    /// mapped large allocations (`hblkhd`).
    pub mapped: u64,
}

/// The allocator's counters now, if the allocator is glibc's.
pub fn heap() -> Option<HeapStats> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and only reads malloc's state
        // under its own locks.
        let m = unsafe { libc::mallinfo2() };
        Some(HeapStats {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
            mapped: (m.arena + m.hblkhd) as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Gives every whole free page of the heap back to the kernel; true if any
/// was. Walks every arena's free chunks under the arena's lock, so call it
/// from a blocking thread.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only rearranges malloc's own free memory.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// How often the controller agent asks [`TrimPolicy`] whether to trim.
pub const TRIM_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// When to trim: once handshakes have happened since the last trim, none is
/// under way, and none was admitted since the previous check (the burst is
/// over). No I/O and no clock: the caller samples the admission counters
/// every [`TRIM_CHECK`].
#[derive(Debug, Default)]
pub struct TrimPolicy {
    /// Handshakes admitted up to the last trim.
    trimmed_at: u64,
    /// Handshakes admitted up to the previous check.
    previous: u64,
}

impl TrimPolicy {
    /// `admitted`: handshakes admitted since the agent started; `in_flight`:
    /// under way now. True: trim now.
    pub fn check(&mut self, admitted: u64, in_flight: usize) -> bool {
        let quiet = admitted == self.previous && in_flight == 0;
        self.previous = admitted;
        if quiet && admitted != self.trimmed_at {
            self.trimmed_at = admitted;
            return true;
        }
        false
    }
}

/// The controller agent's trimming task: samples `admission` every
/// [`TRIM_CHECK`] and trims when [`TrimPolicy`] says so, on a blocking thread.
pub(crate) async fn trim_after_handshakes(
    admission: std::sync::Arc<crate::admission::Admission>,
    shutdown: crate::Shutdown,
) {
    let mut policy = TrimPolicy::default();
    let mut tick = tokio::time::interval(TRIM_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait() => return,
        }
        let s = admission.stats();
        if policy.check(s.admitted, s.in_flight) {
            let before = resident();
            let _ = tokio::task::spawn_blocking(trim).await;
            tracing::debug!(
                rss_before = before,
                rss_after = resident(),
                live = heap().map(|h| h.in_use),
                "gave the heap's free pages back after {} handshakes",
                s.admitted
            );
        }
    }
}

/// This process's resident set size in bytes (`/proc/self/statm`).
pub fn resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_after_a_burst_is_over() {
        let mut p = TrimPolicy::default();
        // Nothing happened: nothing to give back.
        assert!(!p.check(0, 0));
        // A burst: handshakes admitted, some under way.
        assert!(!p.check(500, 300));
        assert!(!p.check(1000, 12));
        // None admitted since the previous check and none under way: trim, once.
        assert!(p.check(1000, 0));
        assert!(!p.check(1000, 0));
        assert!(!p.check(1000, 0));
    }

    #[test]
    fn a_steady_trickle_trims_when_a_check_finds_it_quiet() {
        let mut p = TrimPolicy::default();
        // Admitted since the previous check: maybe a burst's beginning.
        assert!(!p.check(1, 0));
        assert!(p.check(1, 0));
        // One handshake still under way: not quiet.
        assert!(!p.check(2, 1));
        assert!(!p.check(2, 1));
        assert!(p.check(2, 0));
    }

    #[test]
    fn heap_counters_see_a_live_allocation() {
        let Some(before) = heap() else { return };
        let block = vec![1u8; 4 << 20];
        let during = heap().unwrap();
        assert!(during.in_use >= before.in_use + (4 << 20) - 4096);
        assert!(during.mapped >= during.in_use);
        drop(block);
        // Trimming never fails on glibc; whether anything was given back
        // depends on the heap.
        let _ = trim();
    }
}
