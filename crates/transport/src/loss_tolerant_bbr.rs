//! A loss-tolerant, model-based congestion controller for quinn (`bbr-lt`):
//! BBR's model (draft-cardwell-iccrg-bbr-congestion-control-00) without the
//! loss reactions quinn's BBR adds, and with random loss credited to the
//! bandwidth estimate up to a threshold.
//!
//! Why: quinn's `Bbr` (a port of an old quiche) (1) leaves STARTUP on the
//! first round with a loss, however random, so on a lossy 100 ms path it
//! starts cruising at a fraction of the link and then climbs 25 % per
//! 8-round gain cycle; (2) enters a packet-conservation "recovery" window on
//! every loss and only leaves it after a loss-free round, which at a few %
//! random loss never comes; (3) samples bandwidth from consecutive ACK
//! frames, one packet over the gap between them. On the multihomed lab that
//! made a 100 MB download 1.5x slower at 5 % loss (docs/results/bicast).
//!
//! The model, as the BBR draft's: "BtlBw" is a windowed maximum of delivery
//! rate samples over [`BW_WINDOW_ROUNDS`] round trips, "RTprop" a windowed
//! minimum of RTT over [`MIN_RTT_WINDOW`], and the window is a gain times
//! their product. The draft's abstract: BBR "offers substantially higher
//! throughput for bottlenecks with shallow buffers or random losses"; its
//! core (Linux `tcp_bbr.c`: "does not react directly to packet losses")
//! only sees loss through the delivery rate, which random loss `p` lowers to
//! `(1 - p)` of the sending rate. BBRv1's 5/4 probing phase recovers from
//! that only while `5/4 (1 - p) > 1`, i.e. below 20 % loss.
//!
//! What this controller adds: each round's delivery rate is divided by
//! `1 - p_random`, capped at [`LossTolerantBbrConfig::max_credited_loss`].
//! `p_random` is the loss rate measured while the flow *cannot* be the cause
//! of loss: in the cycle's 3/4 phase, which here lasts three rounds with the
//! window at 3/4 of the *uncredited* BDP (delivery rate x RTprop), a flight
//! that cannot build a queue, let alone overflow one. The first round
//! drains what the probe queued; the packets sent in the second are
//! acknowledged or declared lost in the third, whose loss rate is the
//! sample (the lower of the last [`LOSS_SAMPLES`]). So loss this flow causes by probing, at however
//! shallow a buffer, is never credited. Nothing is credited either in a
//! round that shows a queue (its lowest RTT above [`QUEUE_RTT_FACTOR`] x
//! RTprop) or an ECN CE mark: that is congestion, not random loss.
//!
//! Fairness: a flow crediting loss does not back off for loss a competing
//! flow causes at a shallow buffer (no RTT rise) up to the cap; beyond the
//! cap it behaves as BBRv1. See docs/proxy.md for the measured trade-off.
//!
//! Sans-IO: every input carries its time; nothing reads a clock. The
//! [`quinn::congestion::Controller`] impl only forwards to the inherent
//! methods, which the unit tests drive on a virtual clock.

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The BBR draft's BtlBwFilterLen: "10 packet-timed round trips".
pub const BW_WINDOW_ROUNDS: u64 = 10;
/// Random-loss samples (one per gain cycle) whose minimum is credited.
pub const LOSS_SAMPLES: usize = 2;
/// The BBR draft's RTpropFilterLen: 10 seconds.
pub const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);
/// The BBR draft's ProbeRTTDuration: 200 ms.
pub const PROBE_RTT_DURATION: Duration = Duration::from_millis(200);
/// A round whose lowest RTT exceeds RTprop by this factor had a standing
/// queue the whole round: its loss is congestion, not credited. Above the
/// standing queue [`CWND_GAIN`] allows (1.25).
pub const QUEUE_RTT_FACTOR: f64 = 1.5;
/// The window over the estimated BDP in cruise: headroom for delayed and
/// aggregated ACKs (quinn paces at 1.25 x window / RTT).
pub const CWND_GAIN: f64 = 1.25;
/// The BBR draft's STARTUP gain, 2/ln(2).
const HIGH_GAIN: f64 = 2.885;
/// The BBR draft's ProbeBW pacing_gain cycle, applied to the window
/// (quinn derives its pacing rate from the window).
const GAIN_CYCLE: [f64; 8] = [1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
/// The BBR draft: the pipe is full after 3 rounds without 25 % growth.
const FULL_BW_GROWTH: f64 = 1.25;
const FULL_BW_ROUNDS: u32 = 3;
/// Rounds of the 3/4 phase: drain, send, sample.
const DRAIN_ROUNDS: u64 = 3;
/// A round with fewer packets than this gives no loss sample (too noisy).
const MIN_LOSS_SAMPLE_PACKETS: u64 = 20;

/// Configuration, and the factory quinn builds one controller per connection with.
#[derive(Debug, Clone)]
pub struct LossTolerantBbrConfig {
    /// The random loss rate up to which loss is credited to the bandwidth
    /// estimate (0: plain BBRv1 behaviour).
    pub max_credited_loss: f64,
    /// Initial window in datagrams (RFC 9002 §7.2: "Endpoints SHOULD use an
    /// initial congestion window of ten times the maximum datagram size").
    pub initial_window_packets: u64,
}

/// The default cap on credited loss: 25 %. With BBR's 5/4 probe on top, the
/// estimate holds up to about 40 % random loss (`5/4 (1 - p) / (1 - 0.25) >= 1`).
pub const DEFAULT_MAX_CREDITED_LOSS: f64 = 0.25;

impl Default for LossTolerantBbrConfig {
    fn default() -> Self {
        LossTolerantBbrConfig {
            max_credited_loss: DEFAULT_MAX_CREDITED_LOSS,
            initial_window_packets: 10,
        }
    }
}

impl ControllerFactory for LossTolerantBbrConfig {
    fn build(self: Arc<Self>, _now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(LossTolerantBbr::new((*self).clone(), current_mtu))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    Startup,
    /// Cruising; `phase` indexes [`GAIN_CYCLE`], entered at `since` in round `round`.
    ProbeBw {
        phase: usize,
        since: Instant,
        round: u64,
    },
    /// Window down to half a BDP to see RTprop again; `until` is set once
    /// the flight is down to it.
    ProbeRtt {
        until: Option<Instant>,
    },
}

/// The controller's state.
#[derive(Debug, Clone)]
pub struct LossTolerantBbr {
    cfg: LossTolerantBbrConfig,
    mtu: u64,
    mode: Mode,
    cwnd: u64,
    /// (round, credited, delivered) bytes/s samples, newest last; the
    /// estimates are their maxima.
    bw: VecDeque<(u64, u64, u64)>,
    /// Random-loss samples, newest last.
    loss: VecDeque<f64>,
    min_rtt: Option<Duration>,
    min_rtt_at: Option<Instant>,
    /// The lowest RTT seen during the current ProbeRTT.
    probe_rtt_min: Option<Duration>,
    full_bw: u64,
    full_bw_rounds: u32,
    filled_pipe: bool,
    round_count: u64,
    round: Round,
    last_sent: Option<Instant>,
}

/// The current packet-timed round trip: it ends when a packet sent after it
/// began is acknowledged.
#[derive(Debug, Clone, Default)]
struct Round {
    start: Option<Instant>,
    acked: u64,
    lost: u64,
    packets: u64,
    min_rtt: Option<Duration>,
    app_limited: bool,
    ce: bool,
    ended: bool,
}

impl LossTolerantBbr {
    pub fn new(cfg: LossTolerantBbrConfig, mtu: u16) -> Self {
        let mtu = u64::from(mtu);
        let cwnd = Self::initial_window_for(&cfg, mtu);
        LossTolerantBbr {
            cfg,
            mtu,
            mode: Mode::Startup,
            cwnd,
            bw: VecDeque::new(),
            loss: VecDeque::new(),
            min_rtt: None,
            min_rtt_at: None,
            probe_rtt_min: None,
            full_bw: 0,
            full_bw_rounds: 0,
            filled_pipe: false,
            round_count: 0,
            round: Round::default(),
            last_sent: None,
        }
    }

    fn initial_window_for(cfg: &LossTolerantBbrConfig, mtu: u64) -> u64 {
        // RFC 9002 §7.2: "... while limiting the window to the larger of
        // 14,720 bytes or twice the maximum datagram size."
        (cfg.initial_window_packets * mtu).min(14_720.max(2 * mtu))
    }

    /// RFC 9002 §7.2: "The RECOMMENDED value [of the minimum congestion
    /// window] is 2 * max_datagram_size"; BBR's floor is 4 packets
    /// (BBRMinPipeCwnd), the larger is kept.
    fn min_window(&self) -> u64 {
        4 * self.mtu
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The bottleneck bandwidth estimate, bytes per second (0: none yet).
    pub fn bandwidth(&self) -> u64 {
        self.bw.iter().map(|&(_, b, _)| b).max().unwrap_or(0)
    }

    /// The delivery rate estimate without credit, bytes per second.
    pub fn delivery_rate(&self) -> u64 {
        self.bw.iter().map(|&(_, _, d)| d).max().unwrap_or(0)
    }

    /// The random-loss floor credited to the estimate now.
    pub fn credited_loss(&self) -> f64 {
        self.loss
            .iter()
            .copied()
            .fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.min(l))))
            .unwrap_or(0.0)
            .min(self.cfg.max_credited_loss)
    }

    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    fn bdp(&self) -> Option<u64> {
        self.bdp_at(self.bandwidth())
    }

    fn bdp_at(&self, bw: u64) -> Option<u64> {
        let rtt = self.min_rtt?;
        (bw > 0).then_some((bw as f64 * rtt.as_secs_f64()) as u64)
    }

    /// The window quinn may have in flight.
    pub fn window(&self) -> u64 {
        match self.mode {
            Mode::ProbeRtt { .. } => self.probe_rtt_window(),
            _ => self.cwnd,
        }
    }

    fn probe_rtt_window(&self) -> u64 {
        // draft-cardwell-iccrg-bbr-congestion-control-02 (BBRv2):
        // BBRProbeRTTCwndGain = 0.5, half a BDP instead of v1's 4 packets.
        self.bdp()
            .map_or(self.min_window(), |b| b / 2)
            .max(self.min_window())
    }

    pub fn on_sent(&mut self, now: Instant) {
        self.last_sent = Some(now);
        if self.round.start.is_none() {
            self.round.start = Some(now);
        }
    }

    /// One packet acknowledged: `sent` is when it was sent.
    pub fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool) {
        let rtt = now.saturating_duration_since(sent);
        self.round.acked += bytes;
        self.round.packets += 1;
        self.round.min_rtt = Some(self.round.min_rtt.map_or(rtt, |m| m.min(rtt)));
        self.round.app_limited |= app_limited;
        if matches!(self.mode, Mode::ProbeRtt { .. }) {
            self.probe_rtt_min = Some(self.probe_rtt_min.map_or(rtt, |m| m.min(rtt)));
        }
        if self.min_rtt.is_none_or(|m| rtt <= m) {
            self.min_rtt = Some(rtt);
            self.min_rtt_at = Some(now);
        }
        if self.round.start.is_some_and(|start| sent >= start) {
            self.round.ended = true;
        }
        if self.mode == Mode::Startup {
            // Like slow start, the window grows by what was delivered, up to
            // the draft's STARTUP cwnd_gain (2/ln 2) x BDP.
            let cap = self
                .bdp()
                .map_or(u64::MAX, |b| (b as f64 * HIGH_GAIN) as u64);
            self.cwnd = (self.cwnd + bytes).min(cap.max(self.cwnd));
        }
    }

    /// Lost bytes (or, with `lost_bytes` 0, an ECN CE mark).
    pub fn on_congestion_event(&mut self, lost_bytes: u64, persistent: bool) {
        if lost_bytes == 0 {
            self.round.ce = true;
        }
        self.round.lost += lost_bytes;
        self.round.packets += lost_bytes.div_ceil(self.mtu);
        if persistent {
            // RFC 9002 §7.6.2: "When persistent congestion is declared, the
            // sender's congestion window MUST be reduced to the minimum
            // congestion window (kMinimumWindow)". The model is stale too:
            // start over.
            self.cwnd = self.min_window();
            self.bw.clear();
            self.loss.clear();
            self.full_bw = 0;
            self.full_bw_rounds = 0;
            self.filled_pipe = false;
            self.mode = Mode::Startup;
        }
    }

    /// The end of one ACK frame's processing: update the model and the window.
    pub fn on_end_acks(&mut self, now: Instant, in_flight: u64) {
        if self.round.ended {
            self.end_round(now);
        }
        self.update_mode(now, in_flight);
        self.update_window();
    }

    fn end_round(&mut self, now: Instant) {
        let r = std::mem::take(&mut self.round);
        self.round.start = Some(now);
        self.round_count += 1;
        let n = self.round_count;
        let Some(start) = r.start else { return };
        let elapsed = now.saturating_duration_since(start);
        if elapsed.is_zero() || r.acked == 0 {
            return;
        }
        let congested = r.ce
            || matches!((r.min_rtt, self.min_rtt), (Some(rm), Some(m))
                if rm.as_secs_f64() > m.as_secs_f64() * QUEUE_RTT_FACTOR);
        // The third round of the 3/4 phase: its packets were all sent under
        // the uncredited 3/4 window into a drained queue (see the module's
        // documentation).
        let random_loss_round = matches!(self.mode, Mode::ProbeBw { phase: 1, round, .. }
            if n == round + DRAIN_ROUNDS);
        if random_loss_round && r.packets >= MIN_LOSS_SAMPLE_PACKETS && !congested {
            self.loss
                .push_back(r.lost as f64 / (r.acked + r.lost) as f64);
            if self.loss.len() > LOSS_SAMPLES {
                self.loss.pop_front();
            }
        }
        let credit = if congested { 0.0 } else { self.credited_loss() };
        let delivered = r.acked as f64 / elapsed.as_secs_f64();
        let sample = (delivered / (1.0 - credit)) as u64;
        // An app-limited round says only that the path carries at least this.
        if !r.app_limited || sample > self.bandwidth() {
            self.bw.push_back((n, sample, delivered as u64));
        }
        while self
            .bw
            .front()
            .is_some_and(|&(k, _, _)| k + BW_WINDOW_ROUNDS <= n)
        {
            self.bw.pop_front();
        }
        if !self.filled_pipe && !r.app_limited {
            let bw = self.bandwidth();
            if bw as f64 >= self.full_bw as f64 * FULL_BW_GROWTH {
                self.full_bw = bw;
                self.full_bw_rounds = 0;
            } else {
                self.full_bw_rounds += 1;
                self.filled_pipe = self.full_bw_rounds >= FULL_BW_ROUNDS;
            }
        }
    }

    fn update_mode(&mut self, now: Instant, in_flight: u64) {
        let min_rtt = self.min_rtt.unwrap_or(Duration::from_millis(100));
        match self.mode {
            Mode::Startup if self.filled_pipe => {
                // Drain first: the cycle's 3/4 phase.
                self.mode = Mode::ProbeBw {
                    phase: 1,
                    since: now,
                    round: self.round_count,
                };
            }
            Mode::ProbeBw {
                phase,
                since,
                round,
            } => {
                // The draft advances the cycle once per RTprop; the 3/4
                // phase lasts three rounds here (the random-loss sample).
                let done = if phase == 1 {
                    self.round_count >= round + DRAIN_ROUNDS
                } else {
                    now.saturating_duration_since(since) > min_rtt
                };
                if done {
                    self.mode = Mode::ProbeBw {
                        phase: (phase + 1) % GAIN_CYCLE.len(),
                        since: now,
                        round: self.round_count,
                    };
                }
            }
            Mode::ProbeRtt { until: None } if in_flight <= self.probe_rtt_window() => {
                self.mode = Mode::ProbeRtt {
                    until: Some(now + PROBE_RTT_DURATION.max(min_rtt)),
                };
            }
            Mode::ProbeRtt { until: Some(t) } if now >= t => {
                if let Some(m) = self.probe_rtt_min.take() {
                    self.min_rtt = Some(m);
                }
                self.min_rtt_at = Some(now);
                self.mode = if self.filled_pipe {
                    Mode::ProbeBw {
                        phase: 2,
                        since: now,
                        round: self.round_count,
                    }
                } else {
                    Mode::Startup
                };
            }
            _ => {}
        }
        let expired = self
            .min_rtt_at
            .is_some_and(|t| now.saturating_duration_since(t) > MIN_RTT_WINDOW);
        if expired && !matches!(self.mode, Mode::ProbeRtt { .. }) {
            self.probe_rtt_min = None;
            self.mode = Mode::ProbeRtt { until: None };
        }
    }

    fn update_window(&mut self) {
        let Mode::ProbeBw { phase, .. } = self.mode else {
            return;
        };
        // The 3/4 phase sizes from the uncredited delivery rate: a flight
        // that cannot cause loss (the random-loss sample).
        let bw = if phase == 1 {
            self.delivery_rate()
        } else {
            self.bandwidth()
        };
        let Some(bdp) = self.bdp_at(bw) else { return };
        let target = ((bdp as f64 * CWND_GAIN * GAIN_CYCLE[phase]) as u64).max(self.min_window());
        // Down at once, up by what is delivered (the draft's cwnd update).
        self.cwnd = if target < self.cwnd {
            target
        } else {
            target.min(self.cwnd + self.round.acked.max(self.mtu))
        };
    }

    /// In STARTUP the pacing gain; else the cycle's (for metrics).
    fn gain(&self) -> f64 {
        match self.mode {
            Mode::Startup => HIGH_GAIN,
            Mode::ProbeBw { phase, .. } => GAIN_CYCLE[phase],
            Mode::ProbeRtt { .. } => 1.0,
        }
    }
}

impl Controller for LossTolerantBbr {
    fn on_sent(&mut self, now: Instant, _bytes: u64, _last_packet_number: u64) {
        LossTolerantBbr::on_sent(self, now);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        _rtt: &quinn_proto::RttEstimator,
    ) {
        LossTolerantBbr::on_ack(self, now, sent, bytes, app_limited);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        _app_limited: bool,
        _largest_packet_num_acked: Option<u64>,
    ) {
        LossTolerantBbr::on_end_acks(self, now, in_flight);
    }

    fn on_congestion_event(
        &mut self,
        _now: Instant,
        _sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        LossTolerantBbr::on_congestion_event(self, lost_bytes, is_persistent_congestion);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = u64::from(new_mtu);
        self.cwnd = self.cwnd.max(self.min_window());
    }

    fn window(&self) -> u64 {
        LossTolerantBbr::window(self)
    }

    fn metrics(&self) -> ControllerMetrics {
        // Non-exhaustive in quinn: built from its default.
        let mut m = ControllerMetrics::default();
        m.congestion_window = self.window();
        m.pacing_rate = Some((self.bandwidth() as f64 * self.gain() * 8.0) as u64);
        m
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        Self::initial_window_for(&self.cfg, self.mtu)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    //! A virtual-clock link: senders driven by the controller through one
    //! drop-tail bottleneck with random loss after serialization (as the
    //! lab's emulator), acknowledgements one per packet, losses detected
    //! by RFC 9002's packet threshold (3). No sockets, no OS clock.
    use super::*;
    use std::collections::BTreeMap;

    const MTU: u16 = 1200;

    struct Flow {
        cc: LossTolerantBbr,
        next_pn: u64,
        /// pn -> sent time, for packets in flight.
        sent: BTreeMap<u64, Instant>,
        /// (arrival time of the ACK, pn), in order.
        acks: VecDeque<(Instant, u64)>,
        next_send: Instant,
        delivered: u64,
    }

    struct Link {
        rate: f64,
        one_way: Duration,
        queue: usize,
        loss: f64,
        free_at: Instant,
        rng: u64,
        queue_drops: u64,
        random_drops: u64,
        queue_delay_sum: Duration,
        forwarded: u64,
    }

    impl Link {
        fn coin(&mut self) -> f64 {
            // xorshift64*: a seeded, reproducible loss pattern.
            self.rng ^= self.rng >> 12;
            self.rng ^= self.rng << 25;
            self.rng ^= self.rng >> 27;
            (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
        }

        /// A packet entering the bottleneck at `t`: when its ACK is back, if ever.
        fn send(&mut self, t: Instant) -> Option<Instant> {
            let tx = Duration::from_secs_f64(f64::from(MTU) / self.rate);
            let backlog = self.free_at.saturating_duration_since(t);
            if backlog.as_secs_f64() / tx.as_secs_f64() >= self.queue as f64 {
                self.queue_drops += 1;
                return None;
            }
            self.free_at = self.free_at.max(t) + tx;
            self.queue_delay_sum += backlog;
            self.forwarded += 1;
            if self.coin() < self.loss {
                self.random_drops += 1;
                return None;
            }
            Some(self.free_at + 2 * self.one_way)
        }
    }

    struct Outcome {
        /// Delivered bytes per second, per flow.
        goodput: Vec<f64>,
        link_rate: f64,
        queue_drops: u64,
        mean_queue_delay: Duration,
        flows: Vec<LossTolerantBbr>,
    }

    fn cfg(max_credited_loss: f64) -> LossTolerantBbrConfig {
        LossTolerantBbrConfig {
            max_credited_loss,
            ..LossTolerantBbrConfig::default()
        }
    }

    /// Runs `flows` controllers over one link for `secs` seconds of virtual time.
    fn run(
        flows: Vec<LossTolerantBbrConfig>,
        mbit: f64,
        rtt_ms: u64,
        loss: f64,
        queue: usize,
        secs: u64,
    ) -> Outcome {
        let t0 = Instant::now();
        let mut link = Link {
            rate: mbit * 1e6 / 8.0,
            one_way: Duration::from_millis(rtt_ms) / 2,
            queue,
            loss,
            free_at: t0,
            rng: 0x9E37_79B9_7F4A_7C15,
            queue_drops: 0,
            random_drops: 0,
            queue_delay_sum: Duration::ZERO,
            forwarded: 0,
        };
        let mut fs: Vec<Flow> = flows
            .into_iter()
            .map(|c| Flow {
                cc: LossTolerantBbr::new(c, MTU),
                next_pn: 0,
                sent: BTreeMap::new(),
                acks: VecDeque::new(),
                next_send: t0,
                delivered: 0,
            })
            .collect();
        let end = t0 + Duration::from_secs(secs);
        let mtu = u64::from(MTU);
        let mut clock = t0;
        loop {
            // The earliest event: an ACK arriving, or a flow allowed to send.
            let mut next: Option<(Instant, usize, bool)> = None;
            for (i, f) in fs.iter().enumerate() {
                if let Some(&(t, _)) = f.acks.front()
                    && next.is_none_or(|(n, _, _)| t < n)
                {
                    next = Some((t, i, true));
                }
                let in_flight = f.sent.len() as u64 * mtu;
                // A flow the window held back sends as soon as it opens.
                let at = f.next_send.max(clock);
                if in_flight + mtu <= f.cc.window() && next.is_none_or(|(n, _, _)| at < n) {
                    next = Some((at, i, false));
                }
            }
            let Some((now, i, is_ack)) = next else { break };
            if now >= end {
                break;
            }
            clock = now;
            let f = &mut fs[i];
            if is_ack {
                let (_, pn) = f.acks.pop_front().unwrap();
                let sent = f.sent.remove(&pn).unwrap();
                f.cc.on_ack(now, sent, mtu, false);
                f.delivered += mtu;
                // RFC 9002 §6.1.1: kPacketThreshold = 3.
                let lost: Vec<u64> = f
                    .sent
                    .range(..pn.saturating_sub(2))
                    .map(|(&p, _)| p)
                    .collect();
                for p in &lost {
                    f.sent.remove(p);
                }
                if !lost.is_empty() {
                    f.cc.on_congestion_event(lost.len() as u64 * mtu, false);
                }
                let in_flight = f.sent.len() as u64 * mtu;
                f.cc.on_end_acks(now, in_flight);
            } else {
                let pn = f.next_pn;
                f.next_pn += 1;
                f.cc.on_sent(now);
                f.sent.insert(pn, now);
                if let Some(back) = link.send(now) {
                    f.acks.push_back((back, pn));
                }
                // quinn's pacer: 1.25 x window per smoothed RTT.
                let rtt = f.cc.min_rtt().unwrap_or(Duration::from_millis(rtt_ms));
                let gap = rtt.as_secs_f64() * mtu as f64 / (1.25 * f.cc.window() as f64);
                f.next_send = now + Duration::from_secs_f64(gap);
            }
        }
        let secs = secs as f64;
        Outcome {
            goodput: fs.iter().map(|f| f.delivered as f64 / secs).collect(),
            link_rate: link.rate,
            queue_drops: link.queue_drops,
            mean_queue_delay: link.queue_delay_sum / link.forwarded.max(1) as u32,
            flows: fs.into_iter().map(|f| f.cc).collect(),
        }
    }

    #[test]
    fn fills_a_lossless_link_without_a_standing_queue() {
        let o = run(
            vec![cfg(DEFAULT_MAX_CREDITED_LOSS)],
            20.0,
            100,
            0.0,
            1000,
            20,
        );
        assert!(
            o.goodput[0] > 0.9 * o.link_rate,
            "{}",
            o.goodput[0] / o.link_rate
        );
        assert_eq!(o.queue_drops, 0);
        assert!(
            o.mean_queue_delay < Duration::from_millis(40),
            "{:?}",
            o.mean_queue_delay
        );
        assert!(matches!(
            o.flows[0].mode(),
            Mode::ProbeBw { .. } | Mode::ProbeRtt { .. }
        ));
    }

    #[test]
    fn keeps_sending_at_the_link_rate_through_random_loss() {
        for loss in [0.05, 0.2, 0.3] {
            let o = run(
                vec![cfg(DEFAULT_MAX_CREDITED_LOSS)],
                20.0,
                100,
                loss,
                1000,
                20,
            );
            // The lost frames used the link too: at best (1 - loss) of it arrives.
            let share = o.goodput[0] / (o.link_rate * (1.0 - loss));
            assert!(
                share > 0.8,
                "loss {loss}: {share:.2} of the possible goodput"
            );
            assert!(o.flows[0].credited_loss() > 0.0, "loss {loss}");
        }
    }

    #[test]
    fn without_credit_it_is_bbr_v1_and_falls_behind_above_20_percent() {
        let with = run(
            vec![cfg(DEFAULT_MAX_CREDITED_LOSS)],
            20.0,
            100,
            0.3,
            1000,
            20,
        );
        let without = run(vec![cfg(0.0)], 20.0, 100, 0.3, 1000, 20);
        assert!(
            with.goodput[0] > 1.15 * without.goodput[0],
            "credited {:.0} B/s, not {:.0} B/s",
            with.goodput[0],
            without.goodput[0]
        );
        assert_eq!(without.flows[0].credited_loss(), 0.0);
    }

    #[test]
    fn loss_above_the_cap_is_not_credited_beyond_it() {
        let o = run(vec![cfg(0.1)], 20.0, 100, 0.3, 1000, 10);
        assert!((o.flows[0].credited_loss() - 0.1).abs() < 1e-9);
    }

    #[test]
    fn queue_overflow_is_not_mistaken_for_random_loss() {
        // A shallow drop-tail queue and no random loss: the only loss is
        // ours. The estimate must not run away (which would fill the queue
        // and drop ever more).
        let o = run(vec![cfg(DEFAULT_MAX_CREDITED_LOSS)], 20.0, 40, 0.0, 20, 20);
        let sent = o.goodput[0] * 20.0 / f64::from(MTU) + o.queue_drops as f64;
        let drop_rate = o.queue_drops as f64 / sent;
        let c = &o.flows[0];
        assert_eq!(c.credited_loss(), 0.0);
        assert!(c.bandwidth() as f64 <= 1.05 * o.link_rate);
        // What remains is BBR's own: the cruise window (1.25 BDP) is just
        // above this queue (0.24 BDP), and the 5/4 probe overflows it.
        assert!(
            drop_rate < 0.1,
            "{drop_rate:.3} of packets dropped at the queue; credit {} bw {} delivered {} link {} mode {:?} window {} min_rtt {:?}",
            c.credited_loss(),
            c.bandwidth(),
            c.delivery_rate(),
            o.link_rate,
            c.mode(),
            c.window(),
            c.min_rtt()
        );
        assert!(
            o.goodput[0] > 0.85 * o.link_rate,
            "{}",
            o.goodput[0] / o.link_rate
        );
    }

    #[test]
    fn two_flows_share_a_lossy_link() {
        let o = run(
            vec![
                cfg(DEFAULT_MAX_CREDITED_LOSS),
                cfg(DEFAULT_MAX_CREDITED_LOSS),
            ],
            20.0,
            60,
            0.1,
            1000,
            30,
        );
        let total: f64 = o.goodput.iter().sum();
        assert!(total > 0.75 * o.link_rate * 0.9, "{}", total / o.link_rate);
        for g in &o.goodput {
            assert!(*g > 0.25 * total, "{:?}", o.goodput);
        }
        // Two flows' probes do not pile up a queue of seconds.
        assert!(
            o.mean_queue_delay < Duration::from_millis(150),
            "{:?}",
            o.mean_queue_delay
        );
    }

    #[test]
    fn persistent_congestion_collapses_the_window_and_restarts() {
        let t0 = Instant::now();
        let mut cc = LossTolerantBbr::new(LossTolerantBbrConfig::default(), MTU);
        let mut t = t0;
        for i in 0..200u64 {
            cc.on_sent(t);
            t += Duration::from_millis(1);
            cc.on_ack(t + Duration::from_millis(50), t, 1200, false);
            if i % 10 == 9 {
                cc.on_end_acks(t + Duration::from_millis(50), 12_000);
            }
        }
        assert!(cc.window() > 4 * 1200);
        cc.on_congestion_event(24_000, true);
        assert_eq!(cc.window(), 4 * 1200);
        assert_eq!(cc.mode(), Mode::Startup);
        assert_eq!(cc.bandwidth(), 0);
    }

    #[test]
    fn initial_window_follows_rfc_9002() {
        let cc = LossTolerantBbr::new(LossTolerantBbrConfig::default(), MTU);
        assert_eq!(cc.window(), 12_000);
        let big = LossTolerantBbr::new(LossTolerantBbrConfig::default(), 9000);
        assert_eq!(big.window(), 18_000);
    }
}
