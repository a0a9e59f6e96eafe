//! Bounded polling of real state.
//!
//! Readiness in the lab is always a check of the thing itself (a socket
//! listening, `is_connected` in OVSDB, a process gone), retried with a short,
//! growing interval until a deadline. The interval only paces the checks; it
//! never stands in for one.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};

/// Whether a socket read or write ended because its timeout (or a
/// non-blocking socket's lack of data) ran out, rather than failing: the
/// caller checks its own deadline or stop flag and tries again.
pub fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Calls `check` until it returns `Ok(Some(v))` (then returns `v`), an error
/// (returned at once), or `timeout` passes (an error naming `what`).
pub fn poll_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let mut interval = Duration::from_millis(5);
    loop {
        if let Some(v) = check()? {
            return Ok(v);
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Err(anyhow!(
                "timed out after {:.1} s waiting for {what}",
                elapsed.as_secs_f64()
            ));
        }
        std::thread::sleep(interval.min(timeout - elapsed));
        interval = (interval * 2).min(Duration::from_millis(100));
    }
}
