//! Open vSwitch's controller-connection timing (`lib/rconn.c`, OVS 3.x), as
//! pure state with the time passed in: no sockets, no clock. The storm bench's
//! simulated switches ([`super::sim`]) drive it; the unit tests below walk it
//! through OVS's sequences.
//!
//! * `reconnect()`: an attempt enters S_CONNECTING and sets
//!   `backoff_deadline = now + backoff`; it stays there until the
//!   controller's HELLO arrives (vconn's version negotiation), for at most
//!   `MAX(1, backoff)` seconds (`timeout()` of S_CONNECTING), else "connection
//!   timed out" and `backoff_deadline = LLONG_MAX`.
//! * `disconnect()`: the backoff becomes 1 s if `now >= backoff_deadline` (the
//!   last connection lived at least one backoff), else it doubles, at least
//!   1 s, up to `max_backoff` (8 s by default); the next attempt comes one
//!   backoff later (S_BACKOFF).
//! * S_ACTIVE / S_IDLE: after `probe_interval` (5 s by default) without a
//!   message from the controller an ECHO_REQUEST goes out (S_IDLE); another
//!   `probe_interval` without one and the connection is dropped ("no response
//!   to inactivity probe").

use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

/// The reconnect backoff of one rconn.
#[derive(Debug, Clone)]
pub struct Backoff {
    max_backoff: Duration,
    backoff: Duration,
    /// `None` stands for OVS's LLONG_MAX ("prevent resetting backoff").
    deadline: Option<Instant>,
}

impl Backoff {
    /// A new rconn: `backoff_deadline = LLONG_MIN`, so the first disconnect
    /// resets the backoff to 1 s.
    pub fn new(now: Instant, max_backoff: Duration) -> Backoff {
        Backoff {
            max_backoff,
            backoff: Duration::ZERO,
            deadline: Some(now),
        }
    }

    /// The current backoff.
    pub fn backoff(&self) -> Duration {
        self.backoff
    }

    /// `reconnect()` opened a connection (S_CONNECTING). Returns how long it
    /// may wait for the controller's HELLO.
    pub fn connecting(&mut self, now: Instant) -> Duration {
        self.deadline = Some(now + self.backoff);
        self.backoff.max(SECOND)
    }

    /// The attempt failed: the socket did not open, or no HELLO came in time.
    /// The next disconnect must not reset the backoff.
    pub fn attempt_failed(&mut self) {
        self.deadline = None;
    }

    /// `disconnect()`: returns the time to wait (S_BACKOFF) before the next
    /// attempt.
    pub fn disconnected(&mut self, now: Instant) -> Duration {
        if self.deadline.is_some_and(|d| now >= d) {
            self.backoff = SECOND;
        } else if self.backoff < self.max_backoff / 2 {
            self.backoff = (self.backoff * 2).max(SECOND);
        } else {
            self.backoff = self.max_backoff;
        }
        self.deadline = Some(now + self.backoff);
        self.backoff
    }
}

/// What the inactivity probe wants now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAction {
    /// Nothing until this time (unless a message arrives).
    WaitUntil(Instant),
    /// Send an ECHO_REQUEST (entering S_IDLE).
    SendEcho,
    /// Drop the connection: the probe went unanswered.
    Drop,
}

/// The inactivity probe of a connected rconn.
#[derive(Debug, Clone)]
pub struct Probe {
    interval: Duration,
    last_activity: Instant,
    /// When the probe was sent (S_IDLE), if it was.
    sent: Option<Instant>,
}

impl Probe {
    /// Connected (S_ACTIVE) at `now`.
    pub fn new(now: Instant, interval: Duration) -> Probe {
        Probe {
            interval,
            last_activity: now,
            sent: None,
        }
    }

    /// A message arrived from the controller: back to S_ACTIVE.
    pub fn activity(&mut self, now: Instant) {
        self.last_activity = now;
        self.sent = None;
    }

    /// What to do at `now`. After [`ProbeAction::SendEcho`] the probe counts
    /// as sent.
    pub fn poll(&mut self, now: Instant) -> ProbeAction {
        match self.sent {
            Some(t) if now >= t + self.interval => ProbeAction::Drop,
            Some(t) => ProbeAction::WaitUntil(t + self.interval),
            None if now >= self.last_activity + self.interval => {
                self.sent = Some(now);
                ProbeAction::SendEcho
            }
            None => ProbeAction::WaitUntil(self.last_activity + self.interval),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = SECOND;

    #[test]
    fn backoff_doubles_while_attempts_fail_and_resets_after_a_connection_that_lived() {
        let t0 = Instant::now();
        let mut b = Backoff::new(t0, 8 * S);
        // First attempt at once; it lives 10 s, then the controller goes away.
        assert_eq!(b.connecting(t0), S, "the HELLO wait is at least 1 s");
        let mut now = t0 + 10 * S;
        assert_eq!(b.disconnected(now), S);
        // Attempts that get no HELLO: 1 s wait each at first, then the
        // backoff doubles up to the maximum.
        let mut waits = Vec::new();
        for _ in 0..6 {
            now += b.backoff();
            let hello_wait = b.connecting(now);
            assert_eq!(hello_wait, b.backoff().max(S));
            now += hello_wait;
            b.attempt_failed();
            waits.push(b.disconnected(now));
        }
        assert_eq!(waits, [2 * S, 4 * S, 8 * S, 8 * S, 8 * S, 8 * S]);
        // A connection that lives one backoff resets it to 1 s.
        now += b.backoff();
        b.connecting(now);
        now += 8 * S;
        assert_eq!(b.disconnected(now), S);
    }

    #[test]
    fn a_connection_closed_before_one_backoff_doubles_it() {
        let t0 = Instant::now();
        let mut b = Backoff::new(t0, 8 * S);
        b.connecting(t0);
        assert_eq!(b.disconnected(t0 + 5 * S), S);
        // Connected (HELLO came), but closed after 0.5 s: not reset.
        let now = t0 + 6 * S;
        b.connecting(now);
        assert_eq!(b.disconnected(now + S / 2), 2 * S);
        // The socket does not open at all: LLONG_MAX, doubles again.
        let now = now + 3 * S;
        b.connecting(now);
        b.attempt_failed();
        assert_eq!(b.disconnected(now + 100 * S), 4 * S);
    }

    #[test]
    fn the_probe_echoes_after_an_idle_interval_and_drops_after_another() {
        let t0 = Instant::now();
        let mut p = Probe::new(t0, 5 * S);
        assert_eq!(p.poll(t0), ProbeAction::WaitUntil(t0 + 5 * S));
        p.activity(t0 + 2 * S);
        assert_eq!(p.poll(t0 + 6 * S), ProbeAction::WaitUntil(t0 + 7 * S));
        assert_eq!(p.poll(t0 + 7 * S), ProbeAction::SendEcho);
        assert_eq!(p.poll(t0 + 8 * S), ProbeAction::WaitUntil(t0 + 12 * S));
        // The reply (any message) makes it active again.
        p.activity(t0 + 8 * S);
        assert_eq!(p.poll(t0 + 9 * S), ProbeAction::WaitUntil(t0 + 13 * S));
        assert_eq!(p.poll(t0 + 13 * S), ProbeAction::SendEcho);
        assert_eq!(p.poll(t0 + 18 * S), ProbeAction::Drop);
    }
}
