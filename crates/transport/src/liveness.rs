//! The grace period, kept whatever the RTT estimate says.
//!
//! quinn gives a silent connection up after `max(idle timeout, 3 × PTO)`:
//! RFC 9000 §10.1, "To avoid excessively small idle timeout periods,
//! endpoints MUST increase the idle timeout period to be at least three times
//! the current Probe Timeout (PTO)". The PTO is the smoothed RTT plus four
//! times its variation (RFC 9002 §6.2.1), and time a packet spends queued at a
//! busy peer counts as RTT. After a reconnect storm an idle connection keeps
//! that RTT for a long while (it takes a sample only every few seconds): at
//! 10,000 switches on loopback the switch agents' smoothed RTT was 2.5 s
//! (median) 20 s after the storm, and a switch agent whose controller agent
//! then stopped waited 29 s for its idle timer instead of the 6 s grace
//! period, while OVS, whose fail mode starts after 15 s, waited with it
//! (docs/scale.md, "A dead peer after a storm").
//!
//! [`SilenceWatch`] is the agents' own idle timer beside quinn's, the same
//! rule with a lower ceiling on the floor: a connection is given up when
//! nothing has arrived for its limit since the later of the last datagram
//! received and the first ack-eliciting frame sent after it (§10.1: "An
//! endpoint also restarts its idle timer when sending an ack-eliciting packet
//! if no other ack-eliciting packets have been sent since last receiving and
//! processing a packet"). Counting from the send matters: a first version
//! counted from the last receipt only, and at 10,000 switches it gave up
//! ~15,000 live connections per run whose keep-alive a busy controller agent
//! answered a second or two late.
//!
//! The limit is the grace period, or three probe timeouts of the current
//! estimate when they are longer, but never more than twice the grace period
//! (or three probe timeouts of the smallest estimate seen, on a path slower
//! than that). The floor is what keeps a busy peer: queueing at a controller
//! agent that works through thousands of handshakes is RTT, and a second
//! version that ignored it (the grace period, or three probe timeouts of the
//! smallest estimate) gave up live connections in 5 of 10 runs of 10,000
//! switches on a slow machine (up to 229 in one), each a reconnect into the
//! same storm and some an OVS HELLO timeout. The ceiling is what bounds a
//! dead peer's wait when the estimate is stale: a dead controller agent is
//! then given up 12 s after the switch agent asked, not 29 s. How late a busy
//! peer's answers come is logged ([`LateAnswer`]); that measurement chose
//! the ceiling (`BUSY_GRACE_PERIODS`).
//!
//! Sans-IO: [`SilenceWatch`] is fed the connection's counters and RTT
//! estimate with the time; [`silence`] is its driver over a
//! [`quinn::Connection`].

use std::time::{Duration, Instant};

/// Shortest interval between two checks.
const MIN_TICK: Duration = Duration::from_millis(100);

/// A probe timeout in RTTs when the estimate has no variation to speak of:
/// srtt + 4 × rttvar with rttvar at its first sample's srtt / 2 (RFC 9002
/// §5.3, §6.2.1).
const PTO_IN_RTTS: u32 = 3;

/// How far queueing at a busy peer may stretch the limit: this many grace
/// periods. Why not less: in 15 runs of 10,000 switches on a slow machine the
/// busy controller agent answered 411 asks after the 6 s grace period, the
/// latest 9.2 s after ([`LateAnswer`]). One and a half grace periods (9 s)
/// would have kept that one only because it was seen at the first check
/// after 9 s; twice leaves about 3 s to spare (docs/scale.md, "How late a
/// busy peer answers").
const BUSY_GRACE_PERIODS: u32 = 2;

/// The longest a busy peer may keep us waiting for an answer: twice the grace
/// period ([`SilenceWatch::limit`]'s ceiling). A switch agent's connection
/// attempt to its only controller agent waits as long for the first answer
/// ([`SilenceWatch::first_answer_within`]; the agents cap it below OVS's
/// fail-mode timeout).
pub fn busy_limit(grace: Duration) -> Duration {
    grace.saturating_mul(BUSY_GRACE_PERIODS)
}

/// How a connection went silent, for the log line that gives it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// How long nothing had arrived.
    pub silent: Duration,
    /// The limit it passed: how long after we asked.
    pub limit: Duration,
    /// quinn's smoothed RTT estimate then.
    pub rtt: Duration,
}

/// An answer that came after the grace period: the peer was busy, and the
/// grace period alone would have given the connection up. What the ceiling of
/// the limit is chosen by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LateAnswer {
    /// How long the check had waited when a datagram arrived, counted as the
    /// limit counts it (from the first check that saw us ask since the last
    /// arrival, or from that arrival if none did): how close the connection
    /// came to being given up. The true wait is within a tick either way.
    pub after: Duration,
    /// The limit then.
    pub limit: Duration,
    /// quinn's smoothed RTT estimate then.
    pub rtt: Duration,
}

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing to report: the peer answered in time, or the limit is not
    /// reached yet.
    Quiet,
    /// A datagram arrived after the check had waited the grace period or
    /// longer; the connection is kept.
    Late(LateAnswer),
    /// Nothing arrived for the limit: give the connection up.
    Silent(Silence),
}

/// What the watch reads off a connection at each check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams received.
    pub received: u64,
    /// Ack-eliciting frames sent (every frame but ACK, PADDING and
    /// CONNECTION_CLOSE: RFC 9002 §2).
    pub eliciting_sent: u64,
    /// quinn's smoothed RTT estimate.
    pub rtt: Duration,
}

impl Counters {
    pub fn of(stats: &quinn::ConnectionStats) -> Counters {
        let f = &stats.frame_tx;
        let eliciting_sent = f.ack_frequency
            + f.crypto
            + f.data_blocked
            + f.datagram
            + u64::from(f.handshake_done)
            + f.immediate_ack
            + f.max_data
            + f.max_stream_data
            + f.max_streams_bidi
            + f.max_streams_uni
            + f.new_connection_id
            + f.new_token
            + f.path_challenge
            + f.path_response
            + f.ping
            + f.reset_stream
            + f.retire_connection_id
            + f.stream_data_blocked
            + f.streams_blocked_bidi
            + f.streams_blocked_uni
            + f.stop_sending
            + f.stream;
        Counters {
            received: stats.udp_rx.datagrams,
            eliciting_sent,
            rtt: stats.path.rtt,
        }
    }
}

/// The liveness check of one connection.
#[derive(Debug, Clone)]
pub struct SilenceWatch {
    grace: Duration,
    /// Checks per grace period.
    checks: u32,
    /// The smallest smoothed RTT seen on the connection.
    path_rtt: Duration,
    /// The smoothed RTT at the last check.
    rtt: Duration,
    /// The counters at the last check that saw a datagram arrive.
    last: Counters,
    /// That check: the datagram arrived at or before it, so silence measured
    /// from here is never overstated.
    heard: Instant,
    /// The first check after `heard` that saw an ack-eliciting frame sent.
    asked: Option<Instant>,
    /// How long the peer may take to answer at all, if longer than the limit.
    first_answer: Option<Duration>,
}

impl SilenceWatch {
    /// A watch starting at `now` with the connection's counters then, that
    /// checks `checks` times per grace period.
    pub fn new(now: Instant, grace: Duration, checks: u32, counters: Counters) -> Self {
        SilenceWatch {
            grace,
            checks: checks.max(1),
            path_rtt: counters.rtt,
            rtt: counters.rtt,
            last: counters,
            heard: now,
            asked: None,
            first_answer: None,
        }
    }

    /// Waits up to `limit` (if longer than [`Self::limit`] would) while
    /// nothing at all has arrived on the connection: a 0-RTT connection
    /// attempt, which a controller agent busy with a reconnect storm keeps
    /// queued before it answers (its admission control, `max_wait`).
    pub fn first_answer_within(mut self, limit: Duration) -> Self {
        self.first_answer = Some(limit);
        self
    }

    /// How often to check: a dead peer is given up at most this long after
    /// the limit.
    pub fn tick(&self) -> Duration {
        (self.grace / self.checks).max(MIN_TICK)
    }

    /// How long nothing may arrive after we asked: three probe timeouts of
    /// the current estimate (RFC 9000 §10.1's floor), at least the grace
    /// period and at most twice it, or on a path too slow for that, three of
    /// the path's own probe timeouts.
    pub fn limit(&self) -> Duration {
        let three_ptos = |rtt: Duration| rtt.saturating_mul(PTO_IN_RTTS * 3);
        let ceiling = busy_limit(self.grace).max(three_ptos(self.path_rtt));
        let limit = self.grace.max(three_ptos(self.rtt).min(ceiling));
        match self.first_answer {
            Some(first) if self.last.received == 0 => limit.max(first),
            _ => limit,
        }
    }

    /// One check at `now`: [`Check::Silent`] once nothing has arrived for
    /// [`Self::limit`] since the later of the last arrival and the first
    /// ack-eliciting frame sent after it; [`Check::Late`] when an arrival
    /// came after the check had waited the grace period or longer.
    pub fn check(&mut self, now: Instant, counters: Counters) -> Check {
        self.path_rtt = self.path_rtt.min(counters.rtt);
        self.rtt = counters.rtt;
        if counters.received != self.last.received {
            let after = self.waited(now);
            let limit = self.limit();
            self.last = counters;
            self.heard = now;
            self.asked = None;
            return if after >= self.grace {
                Check::Late(LateAnswer {
                    after,
                    limit,
                    rtt: counters.rtt,
                })
            } else {
                Check::Quiet
            };
        }
        if self.asked.is_none() && counters.eliciting_sent != self.last.eliciting_sent {
            self.asked = Some(now);
        }
        let waited = self.waited(now);
        let limit = self.limit();
        if waited >= limit {
            Check::Silent(Silence {
                silent: now.saturating_duration_since(self.heard),
                limit,
                rtt: counters.rtt,
            })
        } else {
            Check::Quiet
        }
    }

    /// How long the check has waited at `now`: since the first check that saw
    /// us ask after the last arrival, or since that arrival if none did. The
    /// limit and [`LateAnswer`] both count it so.
    fn waited(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.asked.unwrap_or(self.heard))
    }
}

/// Resolves when `conn` has been silent past the limit (see
/// [`SilenceWatch`]), checking `checks` times per grace period; never, while
/// the peer answers. Answers that come after the grace period go to
/// `late_answer` as they are seen. The caller closes the connection.
pub async fn silence(
    conn: &quinn::Connection,
    grace: Duration,
    checks: u32,
    first_answer: Option<Duration>,
    mut late_answer: impl FnMut(LateAnswer),
) -> Silence {
    let now = || tokio::time::Instant::now().into_std();
    let mut watch = SilenceWatch::new(now(), grace, checks, Counters::of(&conn.stats()));
    if let Some(limit) = first_answer {
        watch = watch.first_answer_within(limit);
    }
    loop {
        tokio::time::sleep(watch.tick()).await;
        match watch.check(now(), Counters::of(&conn.stats())) {
            Check::Silent(s) => return s,
            Check::Late(late) => late_answer(late),
            Check::Quiet => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(6);
    const LAN: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn at(received: u64, eliciting_sent: u64, rtt: Duration) -> Counters {
        Counters {
            received,
            eliciting_sent,
            rtt,
        }
    }

    /// Checks every tick from `start` for `span`, with the counters at each
    /// instant given by `counters(t)`; the first silence seen, and when.
    fn run(
        watch: &mut SilenceWatch,
        start: Instant,
        span: Duration,
        counters: impl Fn(Duration) -> Counters,
    ) -> Option<(Duration, Silence)> {
        let mut t = Duration::ZERO;
        while t <= span {
            t += watch.tick();
            match watch.check(start + t, counters(t)) {
                Check::Silent(s) => return Some((t, s)),
                Check::Late(_) | Check::Quiet => {}
            }
        }
        None
    }

    /// How many multiples of `every` fit in `t`.
    fn count(t: Duration, every: Duration) -> u64 {
        (t.as_millis() / every.as_millis()) as u64
    }

    /// We ask `asks_at` into every `cycle`, and the peer's answer arrives
    /// at the start of the next: the counters at `t`.
    fn answering(t: Duration, cycle: Duration, asks_at: Duration, rtt: Duration) -> Counters {
        let within = t.as_millis() % cycle.as_millis();
        at(
            count(t, cycle),
            count(t, cycle) + u64::from(within >= asks_at.as_millis()),
            rtt,
        )
    }

    /// A peer heard every 500 ms until `last`, asked at `asked`, then silent
    /// for good: the counters at `t`.
    fn dying(t: Duration, last: Duration, asked: Duration, rtt: Duration) -> Counters {
        at(7 + count(t.min(last), ms(500)), u64::from(t >= asked), rtt)
    }

    #[test]
    fn a_peer_that_answers_is_never_given_up() {
        let start = Instant::now();
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, LAN));
        // Something arrives every 5.9 s and nothing is sent, for ten minutes.
        let r = run(&mut w, start, Duration::from_secs(600), |t| {
            at(count(t, ms(5900)), 0, LAN)
        });
        assert_eq!(r, None);
    }

    #[test]
    fn a_late_answer_to_what_we_sent_is_waited_for() {
        // The keep-alive goes 5.25 s after the last arrival; a busy peer
        // answers 5 s later. quinn's idle timer restarts at the send (RFC 9000
        // §10.1), and so does this one: 10.25 s without a datagram is not
        // silence here.
        let start = Instant::now();
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, LAN));
        let r = run(&mut w, start, Duration::from_secs(120), |t| {
            answering(t, ms(10_250), ms(5250), LAN)
        });
        assert_eq!(r, None);
    }

    #[test]
    fn a_silent_peer_is_given_up_a_grace_period_after_we_asked() {
        let start = Instant::now();
        let mut w = SilenceWatch::new(start, GRACE, 8, at(7, 0, LAN));
        // Datagrams until 10 s, a keep-alive sent at 11 s, then nothing.
        let (last, asked) = (ms(10_000), ms(11_000));
        let (when, s) = run(&mut w, start, Duration::from_secs(60), |t| {
            dying(t, last, asked, LAN)
        })
        .expect("given up");
        let waited = when - asked;
        assert!(waited >= GRACE, "{waited:?}");
        assert!(waited <= GRACE + 2 * w.tick(), "{waited:?}");
        assert!(s.silent >= waited && s.silent <= when - last, "{s:?}");
    }

    #[test]
    fn a_stale_estimate_holds_a_dead_peer_at_most_twice_the_grace_period() {
        let start = Instant::now();
        let mut w = SilenceWatch::new(start, GRACE, 8, at(7, 0, LAN));
        // The RTT estimate inflated to 2.5 s by a storm after a LAN
        // handshake puts quinn's floor near 30 s; the peer then dies.
        let (last, asked) = (ms(10_000), ms(11_000));
        let (when, s) = run(&mut w, start, Duration::from_secs(60), |t| {
            let rtt = if t < ms(2000) { LAN } else { ms(2500) };
            dying(t, last, asked, rtt)
        })
        .expect("given up");
        let waited = when - asked;
        assert!(waited >= 2 * GRACE, "{waited:?}");
        assert!(waited <= 2 * GRACE + 2 * w.tick(), "{waited:?}");
        assert_eq!(s.rtt, ms(2500));
    }

    #[test]
    fn a_busy_peer_that_answers_late_is_kept() {
        // A controller agent working through a storm: its answers take 10 s
        // and the estimate is 2 s. The grace period alone would give it up.
        let start = Instant::now();
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, LAN));
        let r = run(&mut w, start, Duration::from_secs(120), |t| {
            let rtt = if t < ms(1000) { LAN } else { ms(2000) };
            answering(t, ms(15_000), ms(5000), rtt)
        });
        assert_eq!(r, None);
    }

    #[test]
    fn an_answer_past_the_grace_period_is_reported_once() {
        let start = Instant::now();
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, LAN));
        let late = |after| {
            Check::Late(LateAnswer {
                after,
                limit: 2 * GRACE,
                rtt: ms(2000),
            })
        };
        // (ms from the start, datagrams received, ack-eliciting frames sent,
        // what the check says)
        let steps = [
            // Asked at 1 s; an answer within the grace period is not late.
            (1000, 0, 1, Check::Quiet),
            (6000, 1, 1, Check::Quiet),
            // Asked at 7 s, answered at 16 s: late, and kept (the limit is
            // 12 s); once: the next check, with nothing new, is quiet.
            (7000, 1, 2, Check::Quiet),
            (16_000, 2, 2, late(ms(9000))),
            (16_750, 2, 2, Check::Quiet),
            // A send in the same tick as the arrival (it may have been what
            // the arrival answered) does not start the wait; the next send
            // does, as for the limit.
            (17_000, 3, 3, Check::Quiet),
            (19_000, 3, 4, Check::Quiet),
            (24_000, 4, 4, Check::Quiet),
            // With nothing sent, silence counts from the last arrival, as
            // for the limit.
            (31_000, 5, 4, late(ms(7000))),
        ];
        for (t, received, sent, expected) in steps {
            let got = w.check(start + ms(t), at(received, sent, ms(2000)));
            assert_eq!(got, expected, "at {t} ms");
        }
    }

    #[test]
    fn with_nothing_sent_silence_counts_from_the_last_arrival() {
        let start = Instant::now();
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, LAN));
        assert_eq!(w.check(start + ms(750), at(1, 0, LAN)), Check::Quiet);
        assert_eq!(
            w.check(start + ms(750) + GRACE - ms(1), at(1, 0, LAN)),
            Check::Quiet
        );
        assert!(matches!(
            w.check(start + ms(750) + GRACE, at(1, 0, LAN)),
            Check::Silent(_)
        ));
    }

    #[test]
    fn on_a_slow_path_the_limit_is_three_of_its_probe_timeouts() {
        let start = Instant::now();
        // A 1 s path: a probe timeout of about 3 s.
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, ms(1000)));
        assert_eq!(w.limit(), ms(9000));
        assert_eq!(w.check(start + ms(750), at(1, 1, ms(1000))), Check::Quiet);
        // A storm then inflates the estimate: the limit follows it up to
        // twice the grace period.
        assert_eq!(w.check(start + ms(1500), at(2, 1, ms(4000))), Check::Quiet);
        assert_eq!(w.limit(), 2 * GRACE);
        // A 3 s path is slower than that: three of its own probe timeouts.
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, ms(3000)));
        assert_eq!(w.limit(), ms(27_000));
        assert_eq!(w.check(start + ms(1500), at(2, 1, ms(6000))), Check::Quiet);
        assert_eq!(w.limit(), ms(27_000));
        assert_eq!(
            w.check(start + ms(1500) + ms(26_999), at(2, 1, ms(6000))),
            Check::Quiet
        );
        assert!(matches!(
            w.check(start + ms(1500) + ms(27_000), at(2, 1, ms(6000))),
            Check::Silent(_)
        ));
    }

    #[test]
    fn a_first_answer_may_take_as_long_as_allowed_then_the_grace_period_holds() {
        let start = Instant::now();
        let first = busy_limit(GRACE);
        // A 0-RTT attempt: sent at once, queued at a busy controller agent.
        let mut w =
            SilenceWatch::new(start, GRACE, 8, at(0, 0, ms(333))).first_answer_within(first);
        assert_eq!(w.check(start + ms(750), at(0, 3, ms(333))), Check::Quiet);
        assert_eq!(w.limit(), first);
        // Past the grace period, short of the first-answer limit: waited for.
        assert_eq!(
            w.check(start + ms(750) + GRACE, at(0, 4, ms(333))),
            Check::Quiet
        );
        // The answer: late, and kept.
        assert_eq!(
            w.check(start + ms(10_000), at(2, 4, LAN)),
            Check::Late(LateAnswer {
                after: ms(9250),
                limit: first,
                rtt: LAN,
            })
        );
        // From now on the grace period: asked at 10.75 s, given up at 16.75.
        assert_eq!(w.limit(), GRACE);
        assert_eq!(w.check(start + ms(10_750), at(2, 5, LAN)), Check::Quiet);
        assert_eq!(w.check(start + ms(16_749), at(2, 5, LAN)), Check::Quiet);
        assert!(matches!(
            w.check(start + ms(16_750), at(2, 5, LAN)),
            Check::Silent(_)
        ));

        // A peer that never answers is given up at the first-answer limit.
        let mut w =
            SilenceWatch::new(start, GRACE, 8, at(0, 0, ms(333))).first_answer_within(first);
        let (when, s) = run(&mut w, start, Duration::from_secs(60), |t| {
            at(0, u64::from(t > Duration::ZERO), ms(333))
        })
        .expect("given up");
        assert!(when >= first && when <= first + 2 * w.tick(), "{when:?}");
        assert_eq!(s.limit, first);

        // Without it, such an attempt is given up after the grace period.
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, ms(333)));
        let (when, _) = run(&mut w, start, Duration::from_secs(60), |t| {
            at(0, u64::from(t > Duration::ZERO), ms(333))
        })
        .expect("given up");
        assert!(when >= GRACE && when <= GRACE + 2 * w.tick(), "{when:?}");
    }

    #[test]
    fn on_a_lan_the_limit_is_the_grace_period() {
        let start = Instant::now();
        // Before any RTT sample quinn reports its initial 333 ms.
        let mut w = SilenceWatch::new(start, GRACE, 8, at(0, 0, ms(333)));
        assert_eq!(w.limit(), GRACE);
        assert_eq!(w.tick(), ms(750));
        assert_eq!(w.check(start + ms(750), at(0, 0, LAN)), Check::Quiet);
        assert_eq!(w.limit(), GRACE);
    }
}
