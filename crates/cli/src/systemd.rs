//! systemd integration of the agents' units (`Type=notify`, `WatchdogSec=`):
//! readiness once the agent listens, watchdog keep-alives from the agent's
//! own runtime (a stuck runtime stops them, and systemd restarts the agent),
//! and a stopping notice. Outside systemd (no `NOTIFY_SOCKET`) all of this
//! does nothing.

use sd_notify::NotifyState;
use tracing::warn;

/// Tells systemd the agent is up, and starts the watchdog keep-alives if the
/// unit asks for them.
pub fn ready(status: &str) {
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(status)]) {
        warn!("cannot notify systemd of readiness: {e}");
    }
    if let Some(timeout) = sd_notify::watchdog_enabled() {
        // Twice per timeout, as sd_watchdog_enabled(3) recommends.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(timeout / 2);
            loop {
                tick.tick().await;
                let _ = sd_notify::notify(&[NotifyState::Watchdog]);
            }
        });
    }
}

/// Tells systemd the agent is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
}

/// Tells systemd a reload (SIGHUP) has begun (`RELOADING=1`, with the
/// monotonic time systemd 253's `Type=notify-reload` asks for).
pub fn reloading() {
    let mut states = vec![NotifyState::Reloading];
    states.extend(NotifyState::monotonic_usec_now());
    let _ = sd_notify::notify(&states);
}

/// Tells systemd the reload is over.
pub fn reloaded() {
    let _ = sd_notify::notify(&[NotifyState::Ready]);
}
