//! One flow at one hop: the sending half ([`HopSender`]) and the receiving
//! half ([`HopReceiver`]) of the link between two adjacent engines.
//!
//! The sender numbers (at the edge) or forwards (at a relay) datagrams, keeps
//! each until the next engine releases it, retransmits what that engine
//! requests, and probes when it hears nothing. The receiver detects gaps in
//! the IDs, requests the missing datagrams at once and again on a timer,
//! hands datagrams on strictly in order, and releases them upstream.

use crate::Config;
use crate::msg::{Control, FlowKey};
use crate::seq::{id_of, unwrap};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Round-trip estimate of one hop (RFC 6298 §2, with the configured bounds).
#[derive(Debug, Clone)]
pub(crate) struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
    initial: Duration,
    min: Duration,
    max: Duration,
}

impl Rtt {
    pub(crate) fn new(cfg: &Config) -> Rtt {
        Rtt {
            srtt: None,
            rttvar: Duration::ZERO,
            initial: cfg.initial_rto,
            min: cfg.min_rto,
            max: cfg.max_rto,
        }
    }

    pub(crate) fn rto(&self) -> Duration {
        match self.srtt {
            None => self.initial.clamp(self.min, self.max),
            // RFC 6298 (2.3): RTO = SRTT + max(G, K*RTTVAR), K = 4.
            Some(s) => (s + 4 * self.rttvar).clamp(self.min, self.max),
        }
    }

    /// `rto` doubled per earlier attempt (RFC 6298 (5.5)), capped at the maximum.
    pub(crate) fn backed_off(&self, attempts: u32) -> Duration {
        let mut t = self.rto();
        for _ in 0..attempts.min(16) {
            t = (t * 2).min(self.max);
        }
        t
    }

    pub(crate) fn sample(&mut self, r: Duration) {
        match self.srtt {
            // RFC 6298 (2.2): SRTT = R, RTTVAR = R/2.
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            // RFC 6298 (2.3): beta = 1/4, alpha = 1/8.
            Some(s) => {
                let diff = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }
}

/// Counters of a receiving half.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// New datagrams accepted.
    pub received: u64,
    /// Datagrams that had arrived before (answered with feedback).
    pub duplicates: u64,
    /// Datagrams beyond the granted window (dropped; the sender keeps them).
    pub beyond_window: u64,
    /// FEEDBACK messages sent.
    pub feedbacks: u64,
    /// FEEDBACK messages that requested datagrams (NACKs).
    pub nacks: u64,
    /// NACKs that repeated a request whose answer did not come in time.
    pub nack_repeats: u64,
    /// Datagram requests (each missing datagram each time it is requested).
    pub requested: u64,
}

#[derive(Debug, Clone, Copy)]
struct Request {
    at: Instant,
    times: u32,
}

/// The receiving half of a flow at one engine.
#[derive(Debug)]
pub struct HopReceiver {
    flow: FlowKey,
    capacity: u64,
    release_every: u32,
    release_delay: Duration,
    max_ranges: usize,
    dead_after: Duration,
    /// Every sequence number below `next` arrived.
    next: u64,
    /// The previous engine may send sequence numbers below this.
    limit: u64,
    /// The limit the previous engine last heard.
    advertised: u64,
    /// One past the highest sequence number known to exist.
    high: u64,
    /// Arrived out of order: all in `(next, limit)` (with `cut_through`, only
    /// the numbers: the payloads went to `arrived`).
    out_of_order: BTreeMap<u64, Bytes>,
    /// In order, not yet taken by the owner.
    ready: VecDeque<Bytes>,
    /// Hand every datagram to the owner as it arrives ([`Self::take_arrived`])
    /// instead of in order ([`Self::take_ready`]): a relay's forwarding.
    cut_through: bool,
    /// With `cut_through`: arrived, not yet taken.
    arrived: VecDeque<(u64, Bytes)>,
    /// Every missing sequence number in `[next, high)`, with its last request.
    missing: BTreeMap<u64, Option<Request>>,
    /// Missing datagrams never requested yet: request them now.
    nack_now: bool,
    /// When the earliest request is due again.
    repeat_at: Option<Instant>,
    /// Arrivals since the last feedback (in order, or behind a gap).
    unreleased: u32,
    feedback_now: bool,
    feedback_at: Option<Instant>,
    last_heard: Option<Instant>,
    finished: bool,
    failed: bool,
    rtt: Rtt,
    pub stats: ReceiverStats,
}

impl HopReceiver {
    /// A receiver expecting sequence number 0 (every flow starts there).
    pub fn new(flow: FlowKey, cfg: &Config) -> HopReceiver {
        let capacity = u64::from(cfg.capacity);
        HopReceiver {
            flow,
            capacity,
            release_every: cfg.release_every,
            release_delay: cfg.release_delay,
            max_ranges: cfg.max_nack_ranges,
            dead_after: cfg.dead_after,
            next: 0,
            limit: capacity,
            advertised: capacity,
            high: 0,
            out_of_order: BTreeMap::new(),
            ready: VecDeque::new(),
            cut_through: false,
            arrived: VecDeque::new(),
            missing: BTreeMap::new(),
            nack_now: false,
            repeat_at: None,
            unreleased: 0,
            feedback_now: false,
            feedback_at: None,
            last_heard: None,
            finished: false,
            failed: false,
            rtt: Rtt::new(cfg),
            stats: ReceiverStats::default(),
        }
    }

    pub fn flow(&self) -> FlowKey {
        self.flow
    }

    /// A receiver whose owner takes datagrams as they arrive, in any order
    /// ([`Self::take_arrived`]); releases and requests are as in order.
    pub fn cut_through(flow: FlowKey, cfg: &Config) -> HopReceiver {
        HopReceiver {
            cut_through: true,
            ..HopReceiver::new(flow, cfg)
        }
    }

    /// The next sequence number expected in order.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Datagrams held: out of order plus in order not yet taken.
    pub fn held(&self) -> usize {
        if self.cut_through {
            self.arrived.len()
        } else {
            self.out_of_order.len() + self.ready.len()
        }
    }

    /// Whether the previous engine has been silent for too long.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The flow's last message arrived in order: silence is no failure now.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// A numbered datagram from the previous engine.
    pub fn on_data(&mut self, now: Instant, id: u16, payload: Bytes) {
        self.last_heard = Some(now);
        let seq = unwrap(id, self.next);
        if seq < self.next || self.out_of_order.contains_key(&seq) {
            // A retransmission that crossed our release, or a duplicate: tell
            // the sender again what arrived, so it frees and stops.
            self.stats.duplicates += 1;
            self.feedback_now = true;
            return;
        }
        if seq >= self.limit {
            // The sender exceeded the window (or the ID is a stale one from a
            // previous lap): it still holds the datagram, so dropping loses
            // nothing; remind it of the window.
            self.stats.beyond_window += 1;
            self.feedback_now = true;
            return;
        }
        self.stats.received += 1;
        if let Some(Some(req)) = self.missing.remove(&seq)
            && req.times == 1
        {
            // Karn: only a datagram requested once gives an unambiguous sample.
            self.rtt.sample(now.saturating_duration_since(req.at));
        }
        if seq >= self.high {
            // Everything between the old high mark and this one is missing.
            for s in self.high..seq {
                self.missing.insert(s, None);
                self.nack_now = true;
            }
            self.high = seq + 1;
        }
        let payload = if self.cut_through {
            self.arrived.push_back((seq, payload));
            Bytes::new()
        } else {
            payload
        };
        if seq == self.next {
            if !self.cut_through {
                self.ready.push_back(payload);
            }
            self.next += 1;
            let mut advanced = 1;
            while let Some(p) = self.out_of_order.remove(&self.next) {
                if !self.cut_through {
                    self.ready.push_back(p);
                }
                self.next += 1;
                advanced += 1;
            }
            self.unreleased += advanced;
            if self.unreleased >= self.release_every {
                self.feedback_now = true;
            } else if self.feedback_at.is_none() {
                self.feedback_at = Some(now + self.release_delay);
            }
        } else {
            self.out_of_order.insert(seq, payload);
            // Arrivals behind a gap count towards the next feedback too, so
            // the sender learns they left the link (`beyond`) while the
            // repair is under way.
            self.unreleased += 1;
            if self.unreleased >= self.release_every {
                self.feedback_now = true;
            }
        }
    }

    /// A PROBE: the previous engine has sent every sequence number before `next`.
    pub fn on_probe(&mut self, now: Instant, next: u16) {
        self.last_heard = Some(now);
        let n = unwrap(next, self.next);
        if n > self.high && n <= self.limit {
            for s in self.high..n {
                self.missing.insert(s, None);
                self.nack_now = true;
            }
            self.high = n;
        }
        self.feedback_now = true;
    }

    /// The next in-order datagram, for the owner.
    pub fn take_ready(&mut self) -> Option<Bytes> {
        self.ready.pop_front()
    }

    /// With [`Self::cut_through`]: the next datagram that arrived, with its
    /// sequence number, in arrival order.
    pub fn take_arrived(&mut self) -> Option<(u64, Bytes)> {
        self.arrived.pop_front()
    }

    /// The owner holds everything from `base` on (taken from [`Self::take_ready`]
    /// and not yet passed on); the previous engine may send up to
    /// `base + capacity`, so this hop never holds more than `capacity`.
    pub fn set_base(&mut self, base: u64) {
        let limit = base + self.capacity;
        if limit > self.limit {
            self.limit = limit;
            // A sender stalled on the old limit learns of the new one at once
            // once a quarter of the window opened (receiver-side silly window
            // syndrome avoidance, RFC 9293 §3.8.6.2.2); smaller openings ride
            // on the next regular feedback.
            if self.limit - self.advertised >= (self.capacity / 4).max(1) {
                self.feedback_now = true;
            }
        }
    }

    /// When [`Self::handle_timeout`] or [`Self::poll_control`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let liveness = match (self.finished, self.last_heard) {
            (false, Some(t)) => Some(t + self.dead_after),
            _ => None,
        };
        [self.feedback_at, self.repeat_at, liveness]
            .into_iter()
            .flatten()
            .min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.finished
            && let Some(t) = self.last_heard
            && now >= t + self.dead_after
        {
            self.failed = true;
        }
    }

    /// The FEEDBACK to send now, if any: a release, a window update, a NACK.
    pub fn poll_control(&mut self, now: Instant) -> Option<Control> {
        if self.failed {
            return None;
        }
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut repeated = false;
        if self.nack_now || self.repeat_at.is_some_and(|t| t <= now) {
            self.nack_now = false;
            let mut full = false;
            for (&seq, req) in self.missing.iter_mut() {
                let due = match req {
                    None => true,
                    Some(r) => r.at + self.rtt.backed_off(r.times - 1) <= now,
                };
                if !due {
                    continue;
                }
                let extends = ranges
                    .last()
                    .is_some_and(|&(first, count)| first + count == seq);
                if extends {
                    ranges.last_mut().expect("checked").1 += 1;
                } else if ranges.len() == self.max_ranges {
                    // The rest goes in the next message.
                    full = true;
                    break;
                } else {
                    ranges.push((seq, 1));
                }
                let times = req.map_or(0, |r| r.times);
                repeated |= times > 0;
                *req = Some(Request {
                    at: now,
                    times: times + 1,
                });
                self.stats.requested += 1;
            }
            self.nack_now = full;
            self.repeat_at = self
                .missing
                .values()
                .flatten()
                .map(|r| r.at + self.rtt.backed_off(r.times - 1))
                .min();
        }
        let release = self.feedback_now || self.feedback_at.is_some_and(|t| t <= now);
        if ranges.is_empty() && !release {
            return None;
        }
        self.stats.feedbacks += 1;
        if !ranges.is_empty() {
            self.stats.nacks += 1;
            if repeated {
                self.stats.nack_repeats += 1;
            }
        }
        self.advertised = self.limit;
        self.unreleased = 0;
        self.feedback_now = false;
        self.feedback_at = None;
        Some(Control::Feedback {
            flow: self.flow,
            cum: id_of(self.next),
            limit: id_of(self.limit),
            // At most `capacity` (≤ MAX_CAPACITY) are held: fits.
            beyond: self.out_of_order.len() as u16,
            missing: ranges
                .into_iter()
                .map(|(first, count)| (id_of(first), count as u16))
                .collect(),
        })
    }
}

/// Counters of a sending half.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Datagrams sent the first time.
    pub sent: u64,
    /// Datagrams sent again because the next engine requested them.
    pub retransmitted: u64,
    /// PROBE messages sent.
    pub probes: u64,
    /// FEEDBACK messages received.
    pub feedbacks: u64,
    /// FEEDBACK messages ignored (releasing what was never sent).
    pub bad_feedback: u64,
    /// Congestion-window reductions (requests for datagrams sent after the last one).
    pub window_reductions: u64,
}

/// The per-hop congestion window ([`crate::CongestionConfig`]).
#[derive(Debug, Clone)]
struct Cwnd {
    cfg: crate::CongestionConfig,
    cwnd: u64,
    ssthresh: u64,
    /// Datagrams released since the window last grew in congestion avoidance.
    acked: u64,
    /// A request for a sequence number at or above this is a new loss event.
    recover: u64,
    /// The current round ends when the next engine releases this.
    round_end: u64,
    /// Where the current round's sending began (`sent_end` then).
    round_start: u64,
    /// Datagrams requested in this round (each counted once).
    round_losses: u64,
    /// The highest sequence number counted as lost.
    counted_loss: Option<u64>,
    /// The round's least send→release time, and the least ever.
    round_rtt: Option<Duration>,
    base_rtt: Option<Duration>,
}

impl Cwnd {
    fn new(cfg: crate::CongestionConfig, ssthresh: u64) -> Cwnd {
        Cwnd {
            cfg,
            cwnd: u64::from(cfg.initial),
            ssthresh,
            acked: 0,
            recover: 0,
            round_end: 0,
            round_start: 0,
            round_losses: 0,
            counted_loss: None,
            round_rtt: None,
            base_rtt: None,
        }
    }

    fn min(&self) -> u64 {
        u64::from(self.cfg.min)
    }

    /// `n` datagrams released, up to `cum`; `rtt`: the send→release time of
    /// the last one, unless it was sent more than once (Karn).
    fn on_release(&mut self, n: u64, cum: u64, sent_end: u64, rtt: Option<Duration>, cap: u64) {
        if let Some(r) = rtt {
            self.round_rtt = Some(self.round_rtt.map_or(r, |m| m.min(r)));
            self.base_rtt = Some(self.base_rtt.map_or(r, |m| m.min(r)));
        }
        let queued = self.queued();
        let delay_rule = self.cfg.queue_high != 0;
        if self.cwnd < self.ssthresh {
            // RFC 5681 (2): slow start, one per datagram released…
            self.cwnd = (self.cwnd + n).min(self.ssthresh.max(self.cwnd));
        } else if !delay_rule {
            // RFC 5681 (3): about one per window.
            self.acked += n;
            if self.acked >= self.cwnd {
                self.acked -= self.cwnd;
                self.cwnd += 1;
            }
        }
        if cum >= self.round_end {
            // A round ended: the delay rule, once per round.
            if delay_rule && let Some(q) = queued {
                if self.cwnd < self.ssthresh {
                    // …until a queue builds.
                    if q > u64::from(self.cfg.queue_high) {
                        self.ssthresh = self.cwnd;
                    }
                } else if q < u64::from(self.cfg.queue_low) {
                    self.cwnd += 1;
                } else if q > u64::from(self.cfg.queue_high) {
                    self.cwnd = (self.cwnd - 1).max(self.min());
                }
            }
            self.round_end = sent_end.max(cum + 1);
            self.round_start = sent_end;
            self.round_losses = 0;
            self.round_rtt = None;
        }
        self.cwnd = self.cwnd.min(cap);
    }

    /// Datagrams this hop keeps in queues, by the round's delay (Vegas).
    fn queued(&self) -> Option<u64> {
        let (rtt, base) = (self.round_rtt?, self.base_rtt?);
        if rtt.is_zero() {
            return Some(0);
        }
        let extra = rtt.saturating_sub(base).as_secs_f64() / rtt.as_secs_f64();
        Some((self.cwnd as f64 * extra) as u64)
    }

    /// A request for `seq`; `sent_end` is one past the highest sent. True if
    /// the window was reduced.
    fn on_request(&mut self, seq: u64, sent_end: u64) -> bool {
        if seq < self.recover || self.counted_loss.is_some_and(|c| seq <= c) {
            return false;
        }
        self.counted_loss = Some(seq);
        self.round_losses += 1;
        // Counted against what the round sent (at least the window), which
        // exceeds the window when datagrams held behind a gap downstream free
        // it (`beyond`): measured against the window alone, random loss on a
        // 20 ms hop halved it (Fig. 11's line on the virtual clock, 3 % of
        // the window: 6–9 halvings; docs/sdudp.md).
        let sent = self.cwnd.max(sent_end.saturating_sub(self.round_start));
        let tolerated = if self.cfg.tolerated_loss_permille == 0 {
            0
        } else {
            1 + sent * u64::from(self.cfg.tolerated_loss_permille) / 1000
        };
        if self.round_losses <= tolerated {
            return false;
        }
        // RFC 5681 (4) with RFC 6582's recovery point: once per window.
        self.ssthresh = (self.cwnd / 2).max(self.min());
        self.cwnd = self.ssthresh;
        self.acked = 0;
        self.recover = sent_end;
        self.round_end = sent_end;
        self.round_start = sent_end;
        self.round_losses = 0;
        true
    }
}

/// The sending half of a flow at one engine.
#[derive(Debug)]
pub struct HopSender {
    flow: FlowKey,
    capacity: usize,
    keepalive: Duration,
    dead_after: Duration,
    tail_probe_delay: Duration,
    /// The next engine releases on its own after this many in-order datagrams.
    release_every: u64,
    /// A PROBE went out because the window closed with fewer than
    /// `release_every` datagrams unreleased; cleared by the next feedback.
    release_requested: bool,
    /// Every sequence number below `base` was released by the next engine.
    base: u64,
    /// Sequence numbers `base..base + buf.len()`; `None`: a hole, a datagram
    /// a relay forwarding out of order ([`Self::insert`]) has not received
    /// yet. An edge's sender ([`Self::push`]) has none.
    buf: VecDeque<Option<Bytes>>,
    /// Holes in `buf`.
    holes: BTreeSet<u64>,
    /// Datagrams in `buf` to send, in order: never sent (`false`), or sent
    /// beyond a receiver's window that proved smaller than assumed (`true`).
    unsent: BTreeMap<u64, bool>,
    /// One past the highest sequence number ever sent.
    sent_end: u64,
    /// Whether `limit` came from the receiver (or is our assumption).
    limit_heard: bool,
    /// Datagrams after `base` the next engine holds out of order, by its last
    /// feedback: they left the link, so the congestion window does not count
    /// them (the pipe of RFC 6675 §4, from a count instead of SACK blocks).
    /// Without it a single loss closed the window for the round trip of its
    /// repair, and on a line of equal-rate links that idle time is never
    /// made up.
    beyond: u64,
    /// The next engine accepts sequence numbers below this.
    limit: u64,
    /// Requested again by the next engine.
    retx: BTreeSet<u64>,
    last_heard: Instant,
    probe_at: Option<Instant>,
    /// Probes since the next engine last answered.
    probes: u32,
    first_probe_at: Option<Instant>,
    finished: bool,
    failed: bool,
    rtt: Rtt,
    cwnd: Option<Cwnd>,
    /// When `base + i` was first sent, `None` before that and once sent
    /// again (Karn): the window's delay samples.
    sent_at: VecDeque<Option<Instant>>,
    pub stats: SenderStats,
}

impl HopSender {
    /// A sender whose first datagram will be sequence number 0.
    pub fn new(flow: FlowKey, cfg: &Config, now: Instant) -> HopSender {
        HopSender {
            flow,
            capacity: cfg.capacity as usize,
            keepalive: cfg.keepalive,
            dead_after: cfg.dead_after,
            tail_probe_delay: cfg.tail_probe_delay,
            release_every: u64::from(cfg.release_every),
            release_requested: false,
            base: 0,
            buf: VecDeque::new(),
            holes: BTreeSet::new(),
            unsent: BTreeMap::new(),
            sent_end: 0,
            limit_heard: false,
            beyond: 0,
            limit: u64::from(cfg.capacity),
            retx: BTreeSet::new(),
            last_heard: now,
            probe_at: None,
            probes: 0,
            first_probe_at: None,
            finished: false,
            failed: false,
            rtt: Rtt::new(cfg),
            cwnd: cfg
                .congestion
                .map(|c| Cwnd::new(c, u64::from(cfg.capacity))),
            sent_at: VecDeque::new(),
            stats: SenderStats::default(),
        }
    }

    pub fn flow(&self) -> FlowKey {
        self.flow
    }

    /// The congestion window, if there is one.
    pub fn cwnd(&self) -> Option<u64> {
        self.cwnd.as_ref().map(|c| c.cwnd)
    }

    /// The first sequence number not yet released by the next engine.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// One past the last sequence number pushed.
    pub fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// Datagrams held (sent and unreleased, or waiting to be sent).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Datagrams that may still be pushed.
    pub fn room(&self) -> usize {
        self.capacity.saturating_sub(self.buf.len())
    }

    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The flow's last message was pushed.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// The last message was pushed and the next engine released everything.
    pub fn is_done(&self) -> bool {
        self.finished && self.buf.is_empty()
    }

    /// Appends a datagram; returns its sequence number (its IPv4 ID is the low
    /// 16 bits, [`crate::ipv4`]). The caller checks [`Self::room`] first: a
    /// full sender is the backpressure that reaches the sending host.
    pub fn push(&mut self, payload: Bytes) -> u64 {
        assert!(self.room() > 0, "HopSender::push without room");
        let seq = self.end();
        self.insert(seq, payload);
        seq
    }

    /// Puts datagram `seq` in place, leaving holes for any before it not yet
    /// here: a relay forwards what arrives at once, in whatever order. The
    /// caller keeps `seq` below `base + capacity` (the window its receiver
    /// grants); a sequence number already released or already here is a
    /// duplicate and ignored.
    pub fn insert(&mut self, seq: u64, payload: Bytes) {
        if seq < self.base {
            return;
        }
        let i = (seq - self.base) as usize;
        assert!(i < self.capacity, "HopSender::insert beyond the window");
        while self.buf.len() <= i {
            self.holes.insert(self.end());
            self.buf.push_back(None);
            self.sent_at.push_back(None);
        }
        if self.holes.remove(&seq) {
            self.buf[i] = Some(payload);
            self.unsent.insert(seq, false);
        }
    }

    /// One past the sequence numbers all sent: the first hole or unsent one.
    fn sent_below(&self) -> u64 {
        let hole = self.holes.first().copied().unwrap_or(u64::MAX);
        let unsent = self.unsent.keys().next().copied().unwrap_or(u64::MAX);
        hole.min(unsent).min(self.end())
    }

    /// Whether `seq` went out and is here to be sent again.
    fn was_sent(&self, seq: u64) -> bool {
        seq >= self.base
            && seq < self.sent_end
            && !self.holes.contains(&seq)
            && !self.unsent.contains_key(&seq)
    }

    /// Datagrams sent and not known to have left the link: neither released
    /// nor held out of order by the next engine (`beyond`), holes excluded.
    fn in_flight(&self) -> u64 {
        let span = self.sent_end.saturating_sub(self.base);
        let holes = self.holes.range(..self.sent_end).count() as u64;
        let unsent = self.unsent.range(..self.sent_end).count() as u64;
        span.saturating_sub(holes + unsent + self.beyond)
    }

    fn forget_send_time(&mut self, seq: u64) {
        if let Some(t) = self.sent_at.get_mut((seq - self.base) as usize) {
            *t = None;
        }
    }

    /// Whether a request for `seq` arriving `now` was sent by the next engine
    /// before `seq`'s first transmission could have reached it: sent less
    /// than the hop's least round trip ago. A relay forwards past its own
    /// holes, so the next engine requests a hole at once, and that request
    /// can meet the repair here after it went on: not a loss, and sending it
    /// again would be a duplicate. If it is lost after all, the next engine's
    /// repeat timer asks again.
    fn requested_before_it_could_arrive(&self, seq: u64, now: Instant) -> bool {
        let base_rtt = self.cwnd.as_ref().and_then(|c| c.base_rtt);
        let first_sent = self
            .sent_at
            .get((seq - self.base) as usize)
            .copied()
            .flatten();
        match (first_sent, base_rtt) {
            (Some(t), Some(rtt)) => now.saturating_duration_since(t) < rtt,
            _ => false,
        }
    }

    fn payload(&self, seq: u64) -> Bytes {
        self.buf[(seq - self.base) as usize]
            .clone()
            .expect("sending a datagram that is here")
    }

    fn on_send(&mut self, now: Instant) {
        if self.probes == 0 {
            self.probe_at = Some(now + self.probe_interval());
        }
    }

    fn probe_interval(&self) -> Duration {
        if self.base < self.sent_end || !self.unsent.is_empty() {
            // Outstanding, and nothing new went out for an RTO: ask for the
            // release rather than wait for the receiver's (long) release
            // delay, so a lost last datagram is found within an RTO. A
            // steady stream pushes this back with every send (`on_send`), so
            // it costs nothing while datagrams keep coming.
            self.rtt.backed_off(self.probes) + self.tail_probe_delay
        } else {
            self.keepalive
        }
    }

    /// The next datagram to send: requested retransmissions first, then new
    /// ones within the next engine's window.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(u16, Bytes)> {
        while let Some(seq) = self.retx.pop_first() {
            // A request for a hole is not ours to answer: the datagram goes
            // out once it arrives here, as a new one.
            if self.was_sent(seq) {
                self.stats.retransmitted += 1;
                self.forget_send_time(seq);
                self.on_send(now);
                return Some((id_of(seq), self.payload(seq)));
            }
        }
        let in_flight = self.in_flight();
        let window_open = self.cwnd.as_ref().is_none_or(|c| in_flight < c.cwnd);
        let next = self
            .unsent
            .first_key_value()
            .map(|(&s, &again)| (s, again))
            .filter(|&(s, _)| s < self.limit);
        if let Some((seq, again)) = next
            && window_open
        {
            self.unsent.remove(&seq);
            if again {
                self.stats.retransmitted += 1;
                self.forget_send_time(seq);
            } else {
                self.sent_end = self.sent_end.max(seq + 1);
                self.stats.sent += 1;
                self.sent_at[(seq - self.base) as usize] = Some(now);
            }
            self.on_send(now);
            return Some((id_of(seq), self.payload(seq)));
        }
        if !window_open
            && next.is_some()
            && in_flight < self.release_every
            && !self.release_requested
            && self.probes == 0
        {
            // The congestion window closed on fewer datagrams than the next
            // engine releases by count: it would answer only after its
            // release delay, and the window would stall for it. Ask now.
            self.release_requested = true;
            self.probe_at = Some(now);
        }
        None
    }

    /// A FEEDBACK from the next engine.
    pub fn on_feedback(
        &mut self,
        now: Instant,
        cum: u16,
        limit: u16,
        beyond: u16,
        missing: &[(u16, u16)],
    ) {
        let cum = unwrap(cum, self.base);
        if cum > self.sent_end {
            // Releases what was never sent: not from our next engine's state.
            self.stats.bad_feedback += 1;
            return;
        }
        self.stats.feedbacks += 1;
        self.last_heard = now;
        if self.probes == 1
            && let Some(t) = self.first_probe_at
        {
            self.rtt.sample(now.saturating_duration_since(t));
        }
        self.probes = 0;
        self.first_probe_at = None;
        let fresh = cum >= self.base;
        if fresh {
            // Counted from `cum`, and never more than was sent after it.
            self.beyond = u64::from(beyond).min(self.sent_end - cum);
        }
        // A release sent on the arrival of its last datagram (by count, or
        // answering our request when the window closed) times the hop; one
        // sent by the receiver's release timer adds up to `release_delay`,
        // which the delay rule would read as a queue.
        let prompt = cum >= self.base + self.release_every || self.release_requested;
        self.release_requested = false;
        if let Some(c) = &mut self.cwnd
            && cum > self.base
        {
            let sample = self
                .sent_at
                .get((cum - 1 - self.base) as usize)
                .copied()
                .flatten()
                .filter(|_| prompt)
                .map(|t| now.saturating_duration_since(t));
            c.on_release(
                cum - self.base,
                cum,
                self.sent_end,
                sample,
                self.capacity as u64,
            );
        }
        // A reordered older feedback releases nothing new.
        while self.base < cum {
            self.buf.pop_front();
            self.sent_at.pop_front();
            // Released what we meant to send again after a rewind (below).
            self.unsent.remove(&self.base);
            self.holes.remove(&self.base);
            self.base += 1;
        }
        let limit = unwrap(limit, self.base);
        if fresh && !self.limit_heard {
            // The first window the receiver states. Smaller than we assumed
            // (its capacity is smaller than ours), it dropped what we sent
            // beyond it: send that again when the window opens.
            self.limit_heard = true;
            let from = limit.max(self.base);
            for seq in from..self.sent_end {
                if self.was_sent(seq) {
                    self.unsent.insert(seq, true);
                }
            }
            self.retx.retain(|&s| s < from);
            self.limit = limit;
        } else {
            // A receiver's window never shrinks: a smaller one is from an older,
            // reordered feedback.
            self.limit = self.limit.max(limit);
        }
        for &(first, count) in missing {
            let first = unwrap(first, self.base);
            for seq in first..first + u64::from(count) {
                if self.was_sent(seq) && !self.requested_before_it_could_arrive(seq, now) {
                    self.retx.insert(seq);
                    if let Some(c) = &mut self.cwnd
                        && c.on_request(seq, self.sent_end)
                    {
                        self.stats.window_reductions += 1;
                    }
                }
            }
        }
        self.probe_at = if self.is_done() {
            None
        } else {
            Some(now + self.probe_interval())
        };
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_done() || self.failed {
            return None;
        }
        [self.probe_at, Some(self.last_heard + self.dead_after)]
            .into_iter()
            .flatten()
            .min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.is_done() && now >= self.last_heard + self.dead_after {
            self.failed = true;
        }
    }

    /// The PROBE to send now, if any.
    pub fn poll_control(&mut self, now: Instant) -> Option<Control> {
        if self.failed || self.is_done() || self.probe_at.is_none_or(|t| t > now) {
            return None;
        }
        self.probes += 1;
        self.stats.probes += 1;
        if self.probes == 1 {
            self.first_probe_at = Some(now);
        }
        self.probe_at = Some(now + self.probe_interval());
        Some(Control::Probe {
            flow: self.flow,
            next: id_of(self.sent_below()),
        })
    }
}
