//! Handshake admission control (controller agent) and the reconnect policy that
//! answers it (switch agent). No I/O and no clock: the agents supply the
//! random draws and hold the permits.
//!
//! After a controller-agent restart every switch agent reconnects at once. A
//! QUIC server that starts every handshake it is offered shares its CPU among
//! all of them: each handshake takes as long as the whole storm, the clients'
//! loss timers fire (quinn's first probe after ~1 s), and retransmitted
//! Initials add work. The controller agent therefore runs at most
//! `--max-handshakes` handshakes at once and refuses the others at once with
//! CONNECTION_REFUSED (RFC 9000 §20.1: "The server refuses to accept a new
//! connection"), which costs it one small packet and no public-key
//! cryptography. The refused switch agent comes back after a short random wait
//! ([`Reconnect`]) instead of waiting out its ordinary backoff; the sessions it
//! had started in 0-RTT start again on the next connection, so Open vSwitch
//! notices nothing but the delay.
//!
//! Refusing is not free for the switch agent, though: each attempt spends one
//! of its few session tickets (rustls takes a ticket out of its cache when it
//! writes the ClientHello, whatever happens to it), so a switch refused four
//! times in a row pays a full handshake — ~3× the CPU of a resumed one at the
//! controller agent. In a 10,000-switch restart storm admission refused 5–7
//! attempts per switch and fewer than half resumed (docs/results/storm-10000).
//! So an attempt over the limit first **waits** ([`Waiting`]): its Initial is
//! neither answered nor refused (quinn keeps the Incoming and buffers the
//! client's retransmissions and 0-RTT packets for it), and it is admitted as
//! soon as a handshake finishes. Returning switches go first: an attempt whose
//! address a NEW_TOKEN token from an earlier connection validated (RFC 9000
//! §8.1.3) is served before one without. Only an attempt that waited longer
//! than the switch agent would (its handshake would be timing out), or one
//! that finds the queue full, is refused.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Default `--max-handshakes`. Chosen with `quicsdn-lab bench storm`
/// (docs/scale.md, "The handshake cap at 10,000 switches"): since attempts
/// over the cap wait instead of being refused, 128 brought 10,000 switches
/// back after a SIGTERM restart in 70–78 s with 3,700–8,800 OVS HELLO
/// timeouts and 3.0–3.4 ms of controller-agent CPU per switch, against
/// 80–137 s, 19,000–27,000 and 4.9–8.4 ms with 1,024 (three runs each), and
/// it left 64–67 KiB per idle connection instead of 76–83: fewer handshakes
/// competing for the CPU leave fewer connections with backlogs. At 1,000
/// switches (0-RTT and full handshakes, SIGTERM and SIGKILL) the times were
/// the same within the runs' spread, with no HELLO timeout either way.
pub const DEFAULT_MAX_HANDSHAKES: usize = 128;

/// Counts handshakes in progress and refuses those over the limit.
#[derive(Debug)]
pub struct Admission {
    /// 0: no limit.
    limit: usize,
    in_flight: AtomicUsize,
    admitted: AtomicU64,
    refused: AtomicU64,
    waited: AtomicU64,
    waiting: AtomicUsize,
    slow: AtomicU64,
    /// Woken when a permit is dropped, so a waiting attempt is admitted at once.
    freed: tokio::sync::Notify,
}

/// A handshake in progress; dropping it makes room for the next one.
#[derive(Debug)]
pub struct Permit(Arc<Admission>);

impl Permit {
    /// Gives the permit back before its handshake has completed (after
    /// [`PERMIT_HOLD`]), and counts that.
    pub fn release_slow(self) {
        self.0.slow.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

/// Counters, for logs and the control socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AdmissionStats {
    /// `--max-handshakes` (0: no limit).
    pub max_handshakes: usize,
    /// Handshakes under way now and holding a permit (one incomplete after
    /// [`PERMIT_HOLD`] gives its permit back).
    pub in_flight: usize,
    /// Connection attempts admitted since the agent started.
    pub admitted: u64,
    /// Connection attempts refused (CONNECTION_REFUSED) since the agent started.
    pub refused: u64,
    /// Connection attempts that waited for a permit since the agent started.
    #[serde(default)]
    pub waited: u64,
    /// Connection attempts waiting now.
    #[serde(default)]
    pub waiting: usize,
    /// Handshakes still incomplete after [`PERMIT_HOLD`], which then gave
    /// their permit back (their switch agent silent, or slow).
    #[serde(default)]
    pub slow: u64,
}

impl Admission {
    /// `limit` handshakes at once; 0 admits every one.
    pub fn new(limit: usize) -> Arc<Admission> {
        Arc::new(Admission {
            limit,
            in_flight: AtomicUsize::new(0),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            slow: AtomicU64::new(0),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// The limit (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Resolves when a permit has been dropped since the last call (or now).
    pub async fn freed(&self) {
        self.freed.notified().await
    }

    /// Counts one attempt refused (CONNECTION_REFUSED).
    pub fn count_refusal(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one attempt put in the queue, and the queue's length now.
    pub fn count_waiting(&self, queued: bool, waiting: usize) {
        if queued {
            self.waited.fetch_add(1, Ordering::Relaxed);
        }
        self.waiting.store(waiting, Ordering::Relaxed);
    }

    /// A permit for one more handshake, or `None` if `limit` are under way
    /// (the caller queues or refuses the attempt, and counts that).
    pub fn try_admit(self: &Arc<Self>) -> Option<Permit> {
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (self.limit == 0 || n < self.limit).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            self.admitted.fetch_add(1, Ordering::Relaxed);
            Some(Permit(self.clone()))
        } else {
            None
        }
    }

    pub fn stats(&self) -> AdmissionStats {
        AdmissionStats {
            max_handshakes: self.limit,
            in_flight: self.in_flight.load(Ordering::Acquire),
            admitted: self.admitted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            slow: self.slow.load(Ordering::Relaxed),
        }
    }
}

/// How long an admitted handshake keeps its permit while it is not complete.
/// Permits bound the CPU that handshakes in progress share, and a handshake
/// costs the controller agent CPU when it answers the ClientHello and when
/// the switch agent's flight arrives, not while it waits for that flight. One
/// still waiting after this long has lost its switch agent (which gave up on
/// the attempt: after a restart, attempts reach the new agent already aged
/// at the stopping one, and are admitted as their switch agents give up on
/// them) or is far slower than the ~0.1 s a handshake takes in a
/// 10,000-switch storm on 2 cores; it goes on without its permit, and the
/// next attempt starts. Holding permits until the handshake's idle timeout
/// stalled restarts: 128 such handshakes held every permit for 6 s, in which
/// no switch came back (docs/scale.md, "A silent handshake holds no permit").
/// One second is also quinn's first probe timeout before an RTT sample
/// (RFC 9002 §6.2.2: 3 × the 333 ms initial RTT).
pub const PERMIT_HOLD: Duration = Duration::from_secs(1);

/// Attempts per handshake permit that may wait ([`Waiting::new`]): with the
/// default 128 permits, 16,384 attempts, more than a 10,000-switch restart
/// sends at once. Each holds its first datagrams (a few KiB) meanwhile.
/// Beyond them attempts are refused, and each refusal costs the switch a
/// ticket. At 10,000 switches (docs/scale.md) 16 per permit refused
/// 140,000–175,000 attempts in a SIGTERM restart and 128 per permit
/// 48,000–57,000: all back in 56–61 s instead of 70–78, 75–4,914 OVS HELLO
/// timeouts instead of 3,702–8,835, but 64.7–78.2 KiB per idle connection
/// instead of 64.0–67.1 (three runs each).
pub const WAITING_PER_PERMIT: usize = 128;

/// Connection attempts waiting for a handshake permit, returning switches
/// (address validated by a token) before others, each class first come first
/// served. No I/O and no clock: the caller passes the time.
#[derive(Debug)]
pub struct Waiting<T> {
    returning: VecDeque<(Instant, T)>,
    new: VecDeque<(Instant, T)>,
    capacity: usize,
    max_wait: Duration,
}

impl<T> Waiting<T> {
    /// At most `capacity` waiting; an attempt older than `max_wait` is no
    /// longer worth a handshake (its switch agent is about to give up on it).
    pub fn new(capacity: usize, max_wait: Duration) -> Waiting<T> {
        Waiting {
            returning: VecDeque::new(),
            new: VecDeque::new(),
            capacity,
            max_wait,
        }
    }

    pub fn len(&self) -> usize {
        self.returning.len() + self.new.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `item` (arrived at `now`); gives it back if the queue is full.
    pub fn push(&mut self, item: T, returning: bool, now: Instant) -> Result<(), T> {
        if self.len() >= self.capacity {
            return Err(item);
        }
        let queue = if returning {
            &mut self.returning
        } else {
            &mut self.new
        };
        queue.push_back((now, item));
        Ok(())
    }

    /// The next attempt to admit: the oldest returning one, else the oldest
    /// other. Attempts that waited too long are handed to `expired` first.
    pub fn pop(&mut self, now: Instant, expired: impl FnMut(T)) -> Option<T> {
        self.expire(now, expired);
        self.returning
            .pop_front()
            .or_else(|| self.new.pop_front())
            .map(|(_, item)| item)
    }

    /// Every attempt still waiting, returning ones first (the agent stops).
    pub fn into_items(self) -> impl Iterator<Item = T> {
        self.returning
            .into_iter()
            .chain(self.new)
            .map(|(_, item)| item)
    }

    /// Hands every attempt older than `max_wait` to `expired`.
    pub fn expire(&mut self, now: Instant, mut expired: impl FnMut(T)) {
        for queue in [&mut self.returning, &mut self.new] {
            while queue
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) > self.max_wait)
            {
                if let Some((_, item)) = queue.pop_front() {
                    expired(item);
                }
            }
        }
    }
}

/// How a switch agent's connection attempt, or connection, ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// A connection that had lived a while was lost (the controller agent
    /// restarted, or the path failed for longer than the grace period).
    LostAfterUp,
    /// The controller agent refused the attempt (CONNECTION_REFUSED): it runs
    /// but admits no more handshakes just now.
    Refused,
    /// The attempt failed otherwise, or the connection died straight after its
    /// handshake.
    Failed,
    /// The controller agent rejected 0-RTT: connect again at once with a full
    /// handshake.
    ZeroRttRejected,
}

/// Waits after a refusal: drawn from [`REFUSED_MIN`]/2..[`REFUSED_MIN`] at
/// first, doubling to at most [`REFUSED_MAX`] (or `--max-backoff`). Short,
/// because a refusal proves the controller agent is up and only busy; random,
/// so the refused switches do not return in lockstep.
pub const REFUSED_MIN: Duration = Duration::from_millis(200);
pub const REFUSED_MAX: Duration = Duration::from_millis(800);

/// Default `--reconnect-jitter`: none. After a controller-agent restart the
/// fastest recovery measured was every switch agent reconnecting at once:
/// a closing agent refuses them, they retry within 100–200 ms and are first
/// in line when the new agent listens. Spreading them over 500 ms made
/// 1,000 switches miss Open vSwitch's one-second HELLO wait more often (all
/// back after 4.2 s instead of 2.1 s in most restarts; docs/benchmarks.md).
pub const DEFAULT_RECONNECT_JITTER: Duration = Duration::ZERO;

/// The switch agent's reconnect policy: OVS-like exponential backoff after
/// failures, a short jittered one after refusals, a jittered immediate
/// reconnect after losing a live connection.
#[derive(Debug, Clone)]
pub struct Reconnect {
    failed: quicsdn_transport::backoff::Backoff,
    refused: quicsdn_transport::backoff::Backoff,
    jitter: Duration,
}

impl Reconnect {
    /// `max_backoff` caps every wait; `jitter` is `--reconnect-jitter`.
    pub fn new(max_backoff: Duration, jitter: Duration) -> Reconnect {
        use quicsdn_transport::backoff::Backoff;
        let cap = |d: Duration| d.min(max_backoff);
        Reconnect {
            failed: Backoff::new(cap(Duration::from_secs(1)), max_backoff),
            refused: Backoff::new(cap(REFUSED_MIN), cap(REFUSED_MAX)),
            jitter,
        }
    }

    /// The wait before the next attempt, given how the last one ended and
    /// `unit` drawn uniformly from [0, 1).
    pub fn next_delay(&mut self, ended: Ended, unit: f64) -> Duration {
        match ended {
            Ended::LostAfterUp => {
                self.reset();
                self.jitter.mul_f64(unit.clamp(0.0, 1.0))
            }
            Ended::ZeroRttRejected => Duration::ZERO,
            Ended::Refused => self.refused.next_delay(unit),
            Ended::Failed => {
                self.refused.reset();
                self.failed.next_delay(unit)
            }
        }
    }

    /// After a connection came up.
    pub fn reset(&mut self) {
        self.failed.reset();
        self.refused.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_limit_and_frees_on_drop() {
        let a = Admission::new(2);
        let p1 = a.try_admit().unwrap();
        let p2 = a.try_admit().unwrap();
        assert!(a.try_admit().is_none());
        assert!(a.try_admit().is_none());
        a.count_refusal();
        drop(p1);
        let p3 = a.try_admit().unwrap();
        assert!(a.try_admit().is_none());
        a.count_waiting(true, 1);
        // p2's handshake outlived PERMIT_HOLD.
        p2.release_slow();
        drop(p3);
        assert_eq!(
            a.stats(),
            AdmissionStats {
                max_handshakes: 2,
                in_flight: 0,
                admitted: 3,
                refused: 1,
                waited: 1,
                waiting: 1,
                slow: 1,
            }
        );
    }

    #[tokio::test]
    async fn a_dropped_permit_wakes_the_waiting() {
        let a = Admission::new(1);
        let p = a.try_admit().unwrap();
        let waiter = tokio::spawn({
            let a = a.clone();
            async move {
                a.freed().await;
                a.try_admit().is_some()
            }
        });
        tokio::task::yield_now().await;
        drop(p);
        assert!(waiter.await.unwrap());
    }

    #[test]
    fn returning_switches_wait_less_and_each_class_is_fifo() {
        let t0 = Instant::now();
        let mut w = Waiting::new(10, Duration::from_secs(4));
        for (i, returning) in [(1, false), (2, true), (3, false), (4, true)] {
            w.push(i, returning, t0).unwrap();
        }
        let mut order = Vec::new();
        while let Some(i) = w.pop(t0, |_| panic!("none expired")) {
            order.push(i);
        }
        assert_eq!(order, [2, 4, 1, 3]);
    }

    #[test]
    fn a_full_queue_gives_the_attempt_back() {
        let t0 = Instant::now();
        let mut w = Waiting::new(2, Duration::from_secs(4));
        w.push(1, false, t0).unwrap();
        w.push(2, true, t0).unwrap();
        assert_eq!(w.push(3, true, t0), Err(3));
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn attempts_that_waited_too_long_are_expired_not_admitted() {
        let t0 = Instant::now();
        let mut w = Waiting::new(10, Duration::from_secs(4));
        w.push(1, true, t0).unwrap();
        w.push(2, false, t0).unwrap();
        w.push(3, false, t0 + Duration::from_secs(3)).unwrap();
        let mut expired = Vec::new();
        let later = t0 + Duration::from_secs(5);
        assert_eq!(w.pop(later, |i| expired.push(i)), Some(3));
        assert_eq!(expired, [1, 2]);
        assert!(w.is_empty());
        // Exactly max_wait old is still served.
        w.push(4, false, t0).unwrap();
        assert_eq!(w.pop(t0 + Duration::from_secs(4), |_| panic!()), Some(4));
    }

    #[test]
    fn zero_is_unlimited() {
        let a = Admission::new(0);
        let permits: Vec<Permit> = (0..10_000).map(|_| a.try_admit().unwrap()).collect();
        assert_eq!(a.stats().in_flight, 10_000);
        assert_eq!(a.stats().refused, 0);
        drop(permits);
        assert_eq!(a.stats().in_flight, 0);
    }

    #[test]
    fn concurrent_admission_never_exceeds_the_limit() {
        let a = Admission::new(8);
        let peak = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (a, peak) = (a.clone(), peak.clone());
                s.spawn(move || {
                    for _ in 0..10_000 {
                        if let Some(p) = a.try_admit() {
                            peak.fetch_max(a.stats().in_flight, Ordering::Relaxed);
                            drop(p);
                        } else {
                            a.count_refusal();
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 8);
        assert_eq!(a.stats().in_flight, 0);
        assert_eq!(a.stats().admitted + a.stats().refused, 80_000);
    }

    fn ms(d: Duration) -> u64 {
        d.as_millis() as u64
    }

    #[test]
    fn refusals_wait_briefly_failures_back_off_like_ovs() {
        let mut r = Reconnect::new(Duration::from_secs(8), Duration::from_millis(500));
        // Refused: 200 ms doubling to 800 ms, each wait in [d/2, d].
        let lows: Vec<u64> = (0..5)
            .map(|_| ms(r.next_delay(Ended::Refused, 0.0)))
            .collect();
        assert_eq!(lows, [100, 200, 400, 400, 400]);
        assert_eq!(ms(r.next_delay(Ended::Refused, 1.0)), 800);
        // A failure starts the ordinary backoff at 1 s and resets the refusals'.
        assert_eq!(ms(r.next_delay(Ended::Failed, 1.0)), 1000);
        assert_eq!(ms(r.next_delay(Ended::Failed, 1.0)), 2000);
        assert_eq!(ms(r.next_delay(Ended::Refused, 1.0)), 200);
        // A lost live connection: a random part of the jitter, and everything resets.
        assert_eq!(ms(r.next_delay(Ended::LostAfterUp, 0.5)), 250);
        assert_eq!(ms(r.next_delay(Ended::LostAfterUp, 0.0)), 0);
        assert_eq!(ms(r.next_delay(Ended::Failed, 1.0)), 1000);
        assert_eq!(r.next_delay(Ended::ZeroRttRejected, 0.9), Duration::ZERO);
    }

    #[test]
    fn max_backoff_caps_every_wait() {
        let mut r = Reconnect::new(Duration::from_millis(300), Duration::ZERO);
        for _ in 0..5 {
            assert!(r.next_delay(Ended::Refused, 1.0) <= Duration::from_millis(300));
            assert!(r.next_delay(Ended::Failed, 1.0) <= Duration::from_millis(300));
        }
        assert_eq!(r.next_delay(Ended::LostAfterUp, 0.7), Duration::ZERO);
    }
}
