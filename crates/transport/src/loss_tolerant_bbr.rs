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
//! of loss: in the cycle's 3/4 phase, which here lasts three rounds. The
//! first round acknowledges what the probe sent; the second sends with the
//! window at 3/4 of the *uncredited* BDP (delivery rate x RTprop), a flight
//! that cannot build a queue, let alone overflow one; its packets are
//! acknowledged or declared lost in the third, whose loss rate is the
//! sample (the lower of the last [`LOSS_SAMPLES`]). The first and third
//! rounds keep the cruise window, so the link idles only for the second's
//! shortfall. The sample's RTTs also confirm RTprop, which spares the
//! ProbeRTT a steady path would otherwise take every 10 s. So loss this
//! flow causes by probing is not credited, except what a very shallow buffer
//! (a few % of the BDP) drops late enough to be detected in the sample's
//! round (measured in docs/proxy.md). Nothing is credited either in a
//! round that shows a queue (its lowest RTT above [`QUEUE_RTT_FACTOR`] x
//! RTprop) or an ECN CE mark: that is congestion, not random loss.
//!
//! ACK aggregation: the window also holds the data acknowledged beyond what
//! the delivery rate explains (the BBR draft's `extra_acked`). Without it
//! a window of 1.25 x rate x *minimum* RTT cannot cover what waits between
//! bursts of ACKs (delayed ACKs, busy processes), the flow delivers less
//! than its estimate, and the estimate spirals down: the lab's 9.8 Mbit/s on
//! a 100 Mbit/s path, reproduced by the tests' quinn-like stack.
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
/// The random-loss sample's lowest RTT within this factor of RTprop
/// confirms RTprop (see `end_round`): a path's RTT that grew by less is not
/// re-measured, which leaves the window at least 1.25 / 1.1 of its BDP.
pub const RTPROP_CONFIRM_FACTOR: f64 = 1.1;
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
/// Rounds of the 3/4 phase: the probe's packets acknowledged, the sample
/// sent, the sample acknowledged.
const LOSS_SAMPLE_ROUNDS: u64 = 3;
/// A round with fewer packets than this gives no loss sample (too noisy).
const MIN_LOSS_SAMPLE_PACKETS: u64 = 20;
/// draft-cardwell-iccrg-bbr-congestion-control-02 §4.6.4.4: "BBRExtraAckedFilterLen = 10"
/// packet-timed round trips.
const EXTRA_ACKED_WINDOW_ROUNDS: u64 = 10;

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
    /// ProbeRTTs entered so far.
    probe_rtts: u64,
    full_bw: u64,
    full_bw_rounds: u32,
    filled_pipe: bool,
    round_count: u64,
    round: Round,
    last_sent: Option<Instant>,
    /// Bytes acknowledged by the ACK frame being processed.
    frame_acked: u64,
    /// The ACK aggregation epoch: its start and what it delivered.
    agg_start: Option<Instant>,
    agg_delivered: u64,
    /// (round, bytes) samples of data acknowledged beyond what the delivery
    /// rate explains; the estimate is their maximum.
    extra_acked: VecDeque<(u64, u64)>,
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
            probe_rtts: 0,
            full_bw: 0,
            full_bw_rounds: 0,
            filled_pipe: false,
            round_count: 0,
            round: Round::default(),
            last_sent: None,
            frame_acked: 0,
            agg_start: None,
            agg_delivered: 0,
            extra_acked: VecDeque::new(),
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

    /// How many times the window went down to ProbeRTT's.
    pub fn probe_rtts(&self) -> u64 {
        self.probe_rtts
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
        self.frame_acked += bytes;
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
            self.extra_acked.clear();
            self.agg_start = None;
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
        let newly = std::mem::take(&mut self.frame_acked);
        self.update_ack_aggregation(now, newly);
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
            if n == round + LOSS_SAMPLE_ROUNDS);
        // The sample round's flight was below the BDP, so its RTTs are
        // RTprop's: if they confirm the estimate, there is no need to
        // ProbeRTT (half the window for 200 ms or more every 10 s). A path
        // whose RTT grew beyond the tolerance still gets its ProbeRTT.
        if random_loss_round
            && let (Some(rm), Some(m)) = (r.min_rtt, self.min_rtt)
            && rm.as_secs_f64() <= m.as_secs_f64() * RTPROP_CONFIRM_FACTOR
        {
            self.min_rtt_at = Some(now);
        }
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

    /// The data acknowledged beyond what the delivery rate explains (ACKs
    /// that arrive in bursts: delayed ACKs, a receiver or sender that runs
    /// only now and then). Without it the window, a gain times rate times
    /// *minimum* RTT, cannot cover the data the ACK bursts hold back, the
    /// rate falls short of the estimate, the estimate follows it down, and
    /// so on: the lab's 9.8 Mbit/s on a 100 Mbit/s path. As the BBR draft's
    /// BBRUpdateACKAggregation (draft-cardwell-iccrg-bbr-congestion-control-02
    /// §4.6.4.4): "extra_acked = extra_acked_delivered - expected_delivered"
    /// over an epoch that restarts whenever the ACKs fall behind the rate,
    /// "extra = min(extra, cwnd)", max-filtered over 10 rounds. The rate is
    /// the *uncredited* delivery rate: credited loss is data that never arrives.
    fn update_ack_aggregation(&mut self, now: Instant, newly_acked: u64) {
        let bw = self.delivery_rate();
        if bw == 0 || newly_acked == 0 {
            return;
        }
        let start = *self.agg_start.get_or_insert(now);
        let mut expected = (bw as f64 * now.saturating_duration_since(start).as_secs_f64()) as u64;
        if self.agg_delivered <= expected {
            self.agg_delivered = 0;
            self.agg_start = Some(now);
            expected = 0;
        }
        self.agg_delivered += newly_acked;
        let extra = (self.agg_delivered - expected).min(self.cwnd);
        let n = self.round_count;
        while self
            .extra_acked
            .front()
            .is_some_and(|&(k, _)| k + EXTRA_ACKED_WINDOW_ROUNDS <= n)
        {
            self.extra_acked.pop_front();
        }
        // Keep the deque decreasing: older, smaller samples can never be the max.
        while self.extra_acked.back().is_some_and(|&(_, e)| e <= extra) {
            self.extra_acked.pop_back();
        }
        self.extra_acked.push_back((n, extra));
    }

    /// The ACK aggregation estimate, bytes.
    pub fn extra_acked(&self) -> u64 {
        self.extra_acked.front().map_or(0, |&(_, e)| e)
    }

    fn update_mode(&mut self, now: Instant, in_flight: u64) {
        let min_rtt = self.min_rtt.unwrap_or(Duration::from_millis(100));
        match self.mode {
            Mode::Startup if self.filled_pipe => {
                // Into the cycle's 3/4 phase: the window falls to cruise's
                // at once, and STARTUP's queue drains.
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
                    self.round_count >= round + LOSS_SAMPLE_ROUNDS
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
            self.probe_rtts += 1;
            self.mode = Mode::ProbeRtt { until: None };
        }
    }

    fn update_window(&mut self) {
        let Mode::ProbeBw { phase, round, .. } = self.mode else {
            return;
        };
        // The random-loss sample's round sends under 3/4 of the *uncredited*
        // BDP: a flight that cannot cause loss. Only that round: the one
        // before it is still acknowledging the probe, the one after only
        // acknowledges the sample, and at full window they keep the link
        // busy (the 3/4 window on all three rounds cost 4.7 % of a 100 Mbit/s,
        // 20 ms link against quinn's BBR; docs/proxy.md).
        let sample_round = phase == 1 && self.round_count == round + 1;
        let (bw, gain, extra) = if sample_round {
            (self.delivery_rate(), CWND_GAIN * GAIN_CYCLE[1], 0)
        } else {
            let cycle_gain = if phase == 1 { 1.0 } else { GAIN_CYCLE[phase] };
            // The draft's BBRUpdateMaxInflight: "inflight += BBR.extra_acked".
            (self.bandwidth(), CWND_GAIN * cycle_gain, self.extra_acked())
        };
        let Some(bdp) = self.bdp_at(bw) else { return };
        let target = ((bdp as f64 * gain) as u64 + extra).max(self.min_window());
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
        fn new(t0: Instant, mbit: f64, rtt_ms: u64, loss: f64, queue: usize) -> Link {
            Link {
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
            }
        }

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
        let mut link = Link::new(t0, mbit, rtt_ms, loss, queue);
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

    /// What the quinn stack does that [`run`]'s ideal sender and receiver
    /// leave out.
    #[derive(Clone, Copy)]
    struct Stack {
        /// The receiver handles datagrams only at multiples of this (a busy
        /// process woken by the scheduler; zero: at once).
        rx_wakeup: Duration,
        /// The sender handles ACK frames only at multiples of this.
        tx_wakeup: Duration,
    }

    /// The lab's path (100 Mbit/s, 20 ms RTT, the emulator's 1000-frame
    /// queue) with the default controller, for `secs` at random loss `loss`.
    fn lab_path(loss: f64, secs: u64, stack: Stack) -> Outcome {
        run_quinn_like(
            cfg(DEFAULT_MAX_CREDITED_LOSS),
            100.0,
            20,
            loss,
            1000,
            secs,
            stack,
        )
    }

    /// Like [`run`], for one flow, with quinn-proto 0.11's behaviour around
    /// the controller:
    /// - the receiver acknowledges every second ack-eliciting packet, on a
    ///   gap at once, else after `max_ack_delay` (25 ms) (RFC 9000 §13.2.2,
    ///   quinn's `ack_eliciting_threshold` 1), in ACK frames of several packets;
    /// - per ACK frame: `on_ack` for each packet, then `on_end_acks`, then
    ///   loss detection and `on_congestion_event` (quinn's `on_ack_received`);
    /// - the pacer's rate is 1.25 x window / smoothed RTT (RFC 9002 §5.3's
    ///   smoothing, ack delay subtracted), not the controller's minimum RTT.
    fn run_quinn_like(
        c: LossTolerantBbrConfig,
        mbit: f64,
        rtt_ms: u64,
        loss: f64,
        queue: usize,
        secs: u64,
        stack: Stack,
    ) -> Outcome {
        const MAX_ACK_DELAY: Duration = Duration::from_millis(25);
        let t0 = Instant::now();
        let mut link = Link::new(t0, mbit, rtt_ms, loss, queue);
        let wake = |t: Instant, every: Duration| {
            if every.is_zero() {
                return t;
            }
            let n = t.saturating_duration_since(t0).as_nanos() / every.as_nanos() + 1;
            t0 + every * n as u32
        };
        let mut cc = LossTolerantBbr::new(c, MTU);
        let mtu = u64::from(MTU);
        let mut next_pn = 0u64;
        let mut sent: BTreeMap<u64, Instant> = BTreeMap::new();
        // Datagrams reaching the receiver: (when it handles them, pn).
        let mut arrivals: VecDeque<(Instant, u64)> = VecDeque::new();
        // ACK frames on the way back: (when the sender handles it, pns, ack delay).
        let mut frames: VecDeque<(Instant, Vec<u64>, Duration)> = VecDeque::new();
        // The receiver's unacknowledged packets and when the first arrived.
        let mut pending: Vec<u64> = Vec::new();
        let mut pending_since: Option<Instant> = None;
        let mut largest_received: Option<u64> = None;
        let mut srtt: Option<Duration> = None;
        let mut next_send = t0;
        let mut delivered = 0u64;
        let end = t0 + Duration::from_secs(secs);
        let mut clock = t0;
        let ack_back = |t: Instant, pns: Vec<u64>, since: Instant, one_way: Duration| {
            (wake(t + one_way, stack.tx_wakeup), pns, t - since)
        };
        loop {
            enum Ev {
                Arrive,
                Frame,
                AckTimer,
                Send,
            }
            let mut next: Option<(Instant, Ev)> = None;
            let mut consider = |t: Instant, e: Ev| {
                if next.as_ref().is_none_or(|(n, _)| t < *n) {
                    next = Some((t, e));
                }
            };
            if let Some(&(t, _)) = arrivals.front() {
                consider(t, Ev::Arrive);
            }
            if let Some((t, _, _)) = frames.front() {
                consider(*t, Ev::Frame);
            }
            if let Some(t) = pending_since {
                consider(t + MAX_ACK_DELAY, Ev::AckTimer);
            }
            if (sent.len() as u64 + 1) * mtu <= cc.window() {
                consider(next_send.max(clock), Ev::Send);
            }
            let Some((now, ev)) = next else { break };
            if now >= end {
                break;
            }
            clock = now;
            match ev {
                Ev::Arrive => {
                    let (_, pn) = arrivals.pop_front().unwrap();
                    let gap = largest_received.is_some_and(|l| pn != l + 1);
                    largest_received = Some(pn);
                    pending.push(pn);
                    pending_since.get_or_insert(now);
                    if gap || pending.len() >= 2 {
                        let since = pending_since.take().unwrap();
                        frames.push_back(ack_back(
                            now,
                            std::mem::take(&mut pending),
                            since,
                            link.one_way,
                        ));
                    }
                }
                Ev::AckTimer => {
                    let since = pending_since.take().unwrap();
                    frames.push_back(ack_back(
                        now,
                        std::mem::take(&mut pending),
                        since,
                        link.one_way,
                    ));
                }
                Ev::Frame => {
                    let (_, pns, ack_delay) = frames.pop_front().unwrap();
                    let largest = *pns.iter().max().unwrap();
                    for pn in &pns {
                        if let Some(t) = sent.remove(pn) {
                            cc.on_ack(now, t, mtu, false);
                            delivered += mtu;
                        }
                    }
                    // RFC 9002 §5.3, from the largest packet acknowledged.
                    let sample = now.saturating_duration_since(
                        sent.get(&largest)
                            .copied()
                            .unwrap_or(now - link.one_way * 2),
                    );
                    let min = cc.min_rtt().unwrap_or(sample);
                    let adjusted = if sample >= min + ack_delay {
                        sample - ack_delay
                    } else {
                        sample
                    };
                    srtt = Some(srtt.map_or(adjusted, |s| (s * 7 + adjusted) / 8));
                    cc.on_end_acks(now, sent.len() as u64 * mtu);
                    // RFC 9002 §6.1.1: kPacketThreshold = 3.
                    let lost: Vec<u64> = sent
                        .range(..largest.saturating_sub(2))
                        .map(|(&p, _)| p)
                        .collect();
                    for p in &lost {
                        sent.remove(p);
                    }
                    if !lost.is_empty() {
                        cc.on_congestion_event(lost.len() as u64 * mtu, false);
                    }
                }
                Ev::Send => {
                    let pn = next_pn;
                    next_pn += 1;
                    cc.on_sent(now);
                    sent.insert(pn, now);
                    if let Some(back) = link.send(now) {
                        // `send` gives the ACK's time for an ideal receiver.
                        let at_receiver = back - link.one_way;
                        arrivals.push_back((wake(at_receiver, stack.rx_wakeup), pn));
                    }
                    let rtt = srtt.unwrap_or(Duration::from_millis(rtt_ms));
                    let gap = rtt.as_secs_f64() * mtu as f64 / (1.25 * cc.window() as f64);
                    next_send = now + Duration::from_secs_f64(gap);
                }
            }
        }
        Outcome {
            goodput: vec![delivered as f64 / secs as f64],
            link_rate: link.rate,
            queue_drops: link.queue_drops,
            mean_queue_delay: link.queue_delay_sum / link.forwarded.max(1) as u32,
            flows: vec![cc],
        }
    }

    /// A busy receiver and sender (the lab's loaded machine): datagrams
    /// handled every 10 ms, ACK frames every 10 ms; and a receiver woken
    /// every 20 ms with a sender every 5 ms.
    const BUSY_STACKS: [Stack; 2] = [
        Stack {
            rx_wakeup: Duration::from_millis(10),
            tx_wakeup: Duration::from_millis(10),
        },
        Stack {
            rx_wakeup: Duration::from_millis(20),
            tx_wakeup: Duration::from_millis(5),
        },
    ];

    #[test]
    fn fills_the_link_when_acks_arrive_in_bursts() {
        // The lab's stall: 100 Mbit/s, 20 ms RTT, the emulator's 1000-frame
        // queue, no loss. Before the ACK aggregation estimate the window
        // (1.25 x rate x minimum RTT) could not cover the data held back
        // between bursts, and the estimate spiralled down: 0.53 and 0.34 of
        // the link in these two stacks.
        for stack in BUSY_STACKS {
            let o = lab_path(0.0, 20, stack);
            let c = &o.flows[0];
            let share = o.goodput[0] / o.link_rate;
            assert!(
                share > 0.85,
                "rx every {:?}, tx every {:?}: {share:.2} of the link; window {} bw {} extra {} min_rtt {:?}",
                stack.rx_wakeup,
                stack.tx_wakeup,
                c.window(),
                c.bandwidth(),
                c.extra_acked(),
                c.min_rtt()
            );
            assert!(c.extra_acked() > 0);
            // The extra window covers the bursts; it does not park a queue
            // of more than an RTT at the bottleneck.
            assert!(
                o.mean_queue_delay < Duration::from_millis(40),
                "{:?}",
                o.mean_queue_delay
            );
        }
    }

    #[test]
    fn keeps_the_rate_through_random_loss_when_acks_arrive_in_bursts() {
        for loss in [0.05, 0.2] {
            for stack in BUSY_STACKS {
                let o = lab_path(loss, 20, stack);
                let share = o.goodput[0] / (o.link_rate * (1.0 - loss));
                assert!(
                    // Measured 0.83-0.92.
                    share > 0.75,
                    "loss {loss}, rx every {:?}, tx every {:?}: {share:.2} of the possible goodput",
                    stack.rx_wakeup,
                    stack.tx_wakeup
                );
            }
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
        // 1.51 against 1.41 MB/s (possible: 1.75). Before the ACK aggregation
        // estimate, 1.23: it helps plain BBRv1 too (at 30 % loss the ACKs of
        // a queued burst come faster than the delivery rate), which narrows
        // what the credit adds.
        assert!(
            with.goodput[0] > 1.05 * without.goodput[0],
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

    #[test]
    fn the_loss_sample_costs_little_of_a_lossless_link_and_replaces_probe_rtt() {
        // The lab's 100 Mbit/s, 20 ms path, ACKs handled every millisecond.
        // With the 3/4 window on all three rounds of the sample the flow got
        // 0.961 of the link here (and 89 of 93.6 Mbit/s in the lab); with it
        // on the sample's round only, 0.977.
        let stack = Stack {
            rx_wakeup: Duration::from_millis(1),
            tx_wakeup: Duration::from_millis(1),
        };
        let o = lab_path(0.0, 30, stack);
        let share = o.goodput[0] / o.link_rate;
        assert!(share > 0.97, "{share:.3} of the link");
        // 30 s would take two ProbeRTTs; the samples' RTTs confirmed RTprop.
        assert_eq!(o.flows[0].probe_rtts(), 0);
        // Without the samples (a flow that never leaves STARTUP's probing
        // would not have them) the 10 s expiry still applies.
        let mut cc = LossTolerantBbr::new(cfg(DEFAULT_MAX_CREDITED_LOSS), MTU);
        let t0 = Instant::now();
        cc.on_sent(t0);
        cc.on_ack(t0 + Duration::from_millis(20), t0, 1200, false);
        cc.on_end_acks(t0 + Duration::from_millis(20), 0);
        let later = t0 + MIN_RTT_WINDOW + Duration::from_secs(1);
        cc.on_sent(later);
        cc.on_ack(later + Duration::from_millis(30), later, 1200, false);
        cc.on_end_acks(later + Duration::from_millis(30), 0);
        assert_eq!(cc.probe_rtts(), 1);
        assert!(matches!(cc.mode(), Mode::ProbeRtt { .. }));
    }
}
