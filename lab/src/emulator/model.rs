//! The impairment model of one link direction: a sans-IO state machine.
//!
//! Nothing here reads a clock, touches a socket or allocates per frame. Time is passed in
//! as `now` (nanoseconds on any monotonic clock, the forwarder uses `CLOCK_MONOTONIC`) and
//! randomness comes from an injected [`RandomSource`], so the whole model runs on a
//! virtual clock in unit tests, like quinn-proto.
//!
//! # Pipeline of one frame ([`Pipe::offer`])
//! 1. **Classify and count** as *offered* (frame bytes include the 14-byte Ethernet header).
//! 2. **Link down**: dropped, counted as `down_dropped`.
//! 3. **In-flight limit** ([`PipeConfig::max_in_flight`], a memory bound of the delay line):
//!    dropped, counted as `queue_dropped`.
//! 4. **Rate limiter** (if `rate_bps > 0`): a FIFO serializer. The queue holds every frame
//!    whose serialization has not finished (including the one on the wire). Drop-tail when
//!    it already holds `queue_frames` frames or adding the frame would exceed `queue_bytes`
//!    (if non-zero): counted as `queue_dropped`. Serialization time is
//!    `(frame bytes + phy_overhead) * 8 / rate`, so `100mbit` means 100 Mbit/s of Ethernet
//!    line rate including preamble, FCS and inter-frame gap (24 bytes by default).
//! 5. **Loss on the wire**: Bernoulli or Gilbert–Elliott, decided per frame that was
//!    admitted to the wire (so a lost frame still used link capacity, as on a real link).
//!    Counted as `lost`.
//! 6. **Propagation delay and jitter**: `release = departure + delay + J`, where `J` is
//!    uniform in `[-jitter, +jitter]` or normal with σ = jitter, and never makes the
//!    release earlier than the departure. Without `reorder`, release times are made
//!    monotonic per direction (`release = max(release, last release)`), so jitter never
//!    reorders; with `reorder`, frames leave in release-time order.
//!
//! [`Pipe::poll_release`] hands out frames whose release time has come, in release order
//! (ties: arrival order), counting them as `delivered`. Frames that were in flight when
//! the link went down are handed out with `deliver == false` and counted as `down_dropped`
//! even if the link is up again by their release time (the down period cut them).
//!
//! # Runtime changes ([`Pipe::set_settings`])
//! New settings apply to frames offered afterwards; frames already in flight keep their
//! release time. Setting `up = false` drops everything in flight and clears the rate queue.
//! Changing the loss model resets the Gilbert–Elliott state to *good*.
//!
//! # Gilbert–Elliott
//! Two states, *good* and *bad*, stepped once per frame on the wire before the loss draw:
//! from good to bad with probability `p`, from bad to good with probability `r`. A frame
//! is lost with probability `loss_good` in the good state (often 0; `1 - k` in the usual
//! notation) and `loss_bad` in the bad state (often 1; `1 - h`). The stationary loss rate
//! is `(r · loss_good + p · loss_bad) / (p + r)`; with `loss_bad = 1`, `loss_good = 0` the
//! mean burst length is `1 / r` frames. This is netem's `loss gemodel p r 1-h 1-k`.
//!
//! # Invariant
//! `offered == lost + queue_dropped + down_dropped + delivered + in_flight` per direction
//! (frames and bytes), checked by the tests; `tx_errors` is a subset of `delivered` that
//! the I/O layer could not write.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

use super::classify::{Class, Classifier, FrameKind};
use super::rng::RandomSource;

/// Nanoseconds on the caller's monotonic clock.
pub type Nanos = u64;

/// Which frames are lost on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "model", rename_all = "snake_case")]
pub enum LossModel {
    #[default]
    None,
    /// Each frame lost independently with probability `p`.
    Bernoulli { p: f64 },
    /// Bursty loss; see the module docs for the parameters.
    GilbertElliott {
        p: f64,
        r: f64,
        loss_good: f64,
        loss_bad: f64,
    },
}

impl LossModel {
    /// Each frame lost independently with probability `p` (0: no loss), as
    /// `--loss P%` gives it.
    pub fn random(p: f64) -> LossModel {
        if p == 0.0 {
            LossModel::None
        } else {
            LossModel::Bernoulli { p }
        }
    }

    /// Long-run fraction of frames lost.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Bernoulli { p } => p,
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                if p + r == 0.0 {
                    loss_good
                } else {
                    (r * loss_good + p * loss_bad) / (p + r)
                }
            }
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        let check = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("loss parameter {name} = {v} is not in [0, 1]"))
            }
        };
        match *self {
            LossModel::None => Ok(()),
            LossModel::Bernoulli { p } => check("p", p),
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                check("p", p)?;
                check("r", r)?;
                check("loss_good", loss_good)?;
                check("loss_bad", loss_bad)
            }
        }
    }
}

/// Shape of the jitter distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum JitterDist {
    /// Uniform in `[-jitter, +jitter]`.
    #[default]
    Uniform,
    /// Normal with standard deviation `jitter` (clipped so release >= departure).
    Normal,
}

/// Settings of one direction. All changeable at runtime.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirSettings {
    /// One-way propagation delay.
    pub delay_ns: u64,
    /// Jitter amplitude (uniform half-width or normal σ).
    pub jitter_ns: u64,
    pub jitter_dist: JitterDist,
    /// Let jitter reorder frames (otherwise release times are monotonic).
    pub reorder: bool,
    pub loss: LossModel,
    /// Line rate in bits/s including the physical overhead; 0 = unlimited.
    pub rate_bps: u64,
    /// Rate-limiter queue limit in frames (including the frame being serialized).
    pub queue_frames: u32,
    /// Rate-limiter queue limit in frame bytes; 0 = no byte limit.
    pub queue_bytes: u64,
    /// Link up; when down every frame is dropped.
    pub up: bool,
}

impl Default for DirSettings {
    fn default() -> Self {
        Self {
            delay_ns: 0,
            jitter_ns: 0,
            jitter_dist: JitterDist::Uniform,
            reorder: false,
            loss: LossModel::None,
            rate_bps: 0,
            queue_frames: 1000,
            queue_bytes: 0,
            up: true,
        }
    }
}

impl DirSettings {
    pub fn validate(&self) -> Result<(), String> {
        self.loss.validate()?;
        if self.rate_bps > 0 && self.queue_frames == 0 {
            return Err("queue_frames must be at least 1 when a rate is set".into());
        }
        Ok(())
    }

    /// One line a person can read, e.g. `delay 25ms jitter 5ms loss 1% rate 100mbit`.
    pub fn summary(&self) -> String {
        use super::units::{fmt_duration_ns, fmt_percent, fmt_rate_bps};
        let mut s = vec![format!("{}", if self.up { "up" } else { "DOWN" })];
        s.push(format!("delay {}", fmt_duration_ns(self.delay_ns)));
        if self.jitter_ns > 0 {
            s.push(format!(
                "jitter {} ({}{})",
                fmt_duration_ns(self.jitter_ns),
                match self.jitter_dist {
                    JitterDist::Uniform => "uniform",
                    JitterDist::Normal => "normal",
                },
                if self.reorder {
                    ", reorder"
                } else {
                    ", no reorder"
                }
            ));
        }
        match self.loss {
            LossModel::None => s.push("loss 0".into()),
            LossModel::Bernoulli { p } => s.push(format!("loss {}", fmt_percent(p))),
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => s.push(format!(
                "loss ge p={} r={} good={} bad={} (mean {})",
                fmt_percent(p),
                fmt_percent(r),
                fmt_percent(loss_good),
                fmt_percent(loss_bad),
                fmt_percent(self.loss.mean_loss())
            )),
        }
        if self.rate_bps > 0 {
            s.push(format!(
                "rate {} queue {} frames{}",
                fmt_rate_bps(self.rate_bps),
                self.queue_frames,
                if self.queue_bytes > 0 {
                    format!("/{} bytes", self.queue_bytes)
                } else {
                    String::new()
                }
            ));
        }
        s.join(", ")
    }
}

/// Per-link configuration fixed for the life of a forwarder.
#[derive(Clone, Debug, PartialEq)]
pub struct PipeConfig {
    pub classifier: Classifier,
    /// Physical bytes per frame added for rate serialization (preamble, FCS, gap).
    pub phy_overhead: u32,
    /// Most frames held at once (delay line plus rate queue).
    pub max_in_flight: u32,
}

impl Default for PipeConfig {
    fn default() -> Self {
        Self {
            classifier: Classifier::default(),
            phy_overhead: 24,
            max_in_flight: 16384,
        }
    }
}

/// Frames, bytes and payload of a set of frames. `bytes` are Ethernet frame bytes with
/// the 14-byte header and without FCS, exactly what tcpdump and interface counters show;
/// `pad_bytes` is what Ethernet would add to bring short frames to 60 bytes (kept so a
/// report can choose whether to count it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub frames: u64,
    pub bytes: u64,
    pub payload_bytes: u64,
    pub pad_bytes: u64,
    /// Frames that carry no application data, only transport control: see
    /// [`Classifier::is_ack_only`](super::classify::Classifier::is_ack_only).
    #[serde(default)]
    pub ack_only_frames: u64,
    /// Their bytes (as `bytes`).
    #[serde(default)]
    pub ack_only_bytes: u64,
    /// Connection setup and teardown frames and their bytes: see
    /// [`FrameKind::Handshake`](super::classify::FrameKind::Handshake).
    #[serde(default)]
    pub handshake_frames: u64,
    #[serde(default)]
    pub handshake_bytes: u64,
}

impl Tally {
    #[inline]
    fn add(&mut self, len: u32, payload: u32, kind: FrameKind) {
        self.frames += 1;
        match kind {
            FrameKind::Data => {}
            FrameKind::AckOnly => {
                self.ack_only_frames += 1;
                self.ack_only_bytes += len as u64;
            }
            FrameKind::Handshake => {
                self.handshake_frames += 1;
                self.handshake_bytes += len as u64;
            }
        }
        self.bytes += len as u64;
        self.payload_bytes += payload as u64;
        self.pad_bytes += 60u32.saturating_sub(len) as u64;
    }

    pub fn plus(&self, o: &Tally) -> Tally {
        Tally {
            frames: self.frames + o.frames,
            bytes: self.bytes + o.bytes,
            payload_bytes: self.payload_bytes + o.payload_bytes,
            pad_bytes: self.pad_bytes + o.pad_bytes,
            ack_only_frames: self.ack_only_frames + o.ack_only_frames,
            ack_only_bytes: self.ack_only_bytes + o.ack_only_bytes,
            handshake_frames: self.handshake_frames + o.handshake_frames,
            handshake_bytes: self.handshake_bytes + o.handshake_bytes,
        }
    }
}

/// The counters of one class in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassCounters {
    pub offered: Tally,
    pub lost: Tally,
    pub queue_dropped: Tally,
    pub down_dropped: Tally,
    pub delivered: Tally,
    /// Delivered by the model but not written by the I/O layer (subset of `delivered`).
    pub tx_errors: Tally,
}

impl ClassCounters {
    pub fn plus(&self, o: &ClassCounters) -> ClassCounters {
        ClassCounters {
            offered: self.offered.plus(&o.offered),
            lost: self.lost.plus(&o.lost),
            queue_dropped: self.queue_dropped.plus(&o.queue_dropped),
            down_dropped: self.down_dropped.plus(&o.down_dropped),
            delivered: self.delivered.plus(&o.delivered),
            tx_errors: self.tx_errors.plus(&o.tx_errors),
        }
    }
}

/// All counters of one direction, by class (index = `Class as usize`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirCounters {
    pub by_class: [ClassCounters; Class::COUNT],
}

impl DirCounters {
    pub fn total(&self) -> ClassCounters {
        self.by_class
            .iter()
            .fold(ClassCounters::default(), |acc, c| acc.plus(c))
    }

    pub fn class(&self, c: Class) -> &ClassCounters {
        &self.by_class[c as usize]
    }
}

/// What happened to an offered frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Held; [`Pipe::poll_release`] returns its token at `release`.
    Scheduled {
        release: Nanos,
    },
    Lost,
    QueueDropped,
    Down,
}

/// A frame handed out by [`Pipe::poll_release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    pub token: u32,
    /// `false`: the link went down while the frame was in flight; free it, don't write it.
    pub deliver: bool,
    pub release: Nanos,
    class: Class,
    len: u32,
    payload: u32,
    kind: FrameKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    // Field order is the heap order: release time, then arrival order.
    release: Nanos,
    seq: u64,
    token: u32,
    epoch: u32,
    len: u32,
    payload: u32,
    class: u8,
    kind: FrameKind,
}

/// One direction of an emulated link.
pub struct Pipe<R> {
    settings: DirSettings,
    cfg: PipeConfig,
    rng: R,
    ge_bad: bool,
    /// Serializer busy until this time; frames in `backlog` finish at their stored time.
    busy_until: Nanos,
    /// Fractional nanoseconds of serialization carried between frames (units of 1/rate).
    ser_rem: u128,
    backlog: VecDeque<(Nanos, u32)>,
    backlog_bytes: u64,
    last_release: Nanos,
    heap: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    epoch: u32,
    counters: DirCounters,
}

impl<R: RandomSource> Pipe<R> {
    pub fn new(settings: DirSettings, cfg: PipeConfig, rng: R) -> Self {
        let cap = cfg.max_in_flight as usize;
        let mut p = Self {
            settings: DirSettings::default(),
            cfg,
            rng,
            ge_bad: false,
            busy_until: 0,
            ser_rem: 0,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            last_release: 0,
            heap: BinaryHeap::with_capacity(cap),
            seq: 0,
            epoch: 0,
            counters: DirCounters::default(),
        };
        p.set_settings(settings);
        p
    }

    pub fn settings(&self) -> &DirSettings {
        &self.settings
    }

    pub fn config(&self) -> &PipeConfig {
        &self.cfg
    }

    pub fn counters(&self) -> &DirCounters {
        &self.counters
    }

    pub fn reset_counters(&mut self) {
        // In-flight frames will be counted as delivered/dropped later; re-count them as
        // offered so the invariant holds for the new epoch of counting.
        self.counters = DirCounters::default();
        for Reverse(f) in self.heap.iter() {
            self.counters.by_class[f.class as usize]
                .offered
                .add(f.len, f.payload, f.kind);
        }
    }

    /// Frames currently held (delay line and rate queue).
    pub fn in_flight(&self) -> usize {
        self.heap.len()
    }

    /// Earliest release time of a held frame: arm the timer for it.
    pub fn next_release(&self) -> Option<Nanos> {
        self.heap.peek().map(|Reverse(f)| f.release)
    }

    /// Applies new settings; see the module docs for what happens to frames in flight.
    pub fn set_settings(&mut self, s: DirSettings) {
        if self.settings.up && !s.up {
            self.epoch = self.epoch.wrapping_add(1);
            self.backlog.clear();
            self.backlog_bytes = 0;
            self.busy_until = 0;
            self.ser_rem = 0;
        }
        if std::mem::discriminant(&self.settings.loss) != std::mem::discriminant(&s.loss) {
            self.ge_bad = false;
        }
        let want = (s.queue_frames as usize).min(self.cfg.max_in_flight as usize);
        if self.backlog.capacity() < want {
            // Allocation happens here, on a settings change, never per frame.
            self.backlog.reserve(want - self.backlog.len());
        }
        self.settings = s;
    }

    /// Offers a frame read at `now`. `token` is the caller's handle for the frame buffer,
    /// returned by [`poll_release`](Self::poll_release) if the frame is scheduled.
    pub fn offer(&mut self, now: Nanos, frame: &[u8], token: u32) -> Verdict {
        let fc = self.cfg.classifier.classify(frame);
        let kind = self.cfg.classifier.frame_kind(frame);
        let len = frame.len() as u32;
        let c = &mut self.counters.by_class[fc.class as usize];
        c.offered.add(len, fc.payload, kind);
        if !self.settings.up {
            c.down_dropped.add(len, fc.payload, kind);
            return Verdict::Down;
        }
        if self.heap.len() >= self.cfg.max_in_flight as usize {
            c.queue_dropped.add(len, fc.payload, kind);
            return Verdict::QueueDropped;
        }
        let mut depart = now;
        if self.settings.rate_bps > 0 {
            while let Some(&(end, bytes)) = self.backlog.front() {
                if end > now {
                    break;
                }
                self.backlog.pop_front();
                self.backlog_bytes -= bytes as u64;
            }
            let qb = self.settings.queue_bytes;
            if self.backlog.len() >= self.settings.queue_frames as usize
                || (qb > 0 && self.backlog_bytes + len as u64 > qb)
            {
                c.queue_dropped.add(len, fc.payload, kind);
                return Verdict::QueueDropped;
            }
            let start = if self.busy_until <= now {
                // Idle link: no fractional carry from an earlier busy period.
                self.ser_rem = 0;
                now
            } else {
                self.busy_until
            };
            let rate = self.settings.rate_bps as u128;
            let num = (len + self.cfg.phy_overhead) as u128 * 8 * 1_000_000_000 + self.ser_rem;
            let tx = (num / rate) as u64;
            self.ser_rem = num % rate;
            self.busy_until = start + tx;
            self.backlog.push_back((self.busy_until, len));
            self.backlog_bytes += len as u64;
            depart = self.busy_until;
        }
        if self.lose() {
            self.counters.by_class[fc.class as usize]
                .lost
                .add(len, fc.payload, kind);
            return Verdict::Lost;
        }
        let mut release = depart + self.settings.delay_ns;
        let j = self.settings.jitter_ns;
        if j > 0 {
            let offset: i64 = match self.settings.jitter_dist {
                JitterDist::Uniform => self.rng.below(2 * j + 1) as i64 - j as i64,
                JitterDist::Normal => (self.std_normal() * j as f64) as i64,
            };
            release = (release as i64 + offset).max(depart as i64) as u64;
        }
        if !self.settings.reorder {
            release = release.max(self.last_release);
        }
        self.last_release = self.last_release.max(release);
        self.seq += 1;
        self.heap.push(Reverse(InFlight {
            release,
            seq: self.seq,
            token,
            epoch: self.epoch,
            len,
            payload: fc.payload,
            class: fc.class as u8,
            kind,
        }));
        Verdict::Scheduled { release }
    }

    /// The next frame due at `now`, if any. Call until `None`.
    pub fn poll_release(&mut self, now: Nanos) -> Option<Released> {
        let Reverse(top) = *self.heap.peek()?;
        if top.release > now {
            return None;
        }
        self.heap.pop();
        let deliver = top.epoch == self.epoch;
        let c = &mut self.counters.by_class[top.class as usize];
        if deliver {
            c.delivered.add(top.len, top.payload, top.kind);
        } else {
            c.down_dropped.add(top.len, top.payload, top.kind);
        }
        Some(Released {
            token: top.token,
            deliver,
            release: top.release,
            class: Class::from_index(top.class as usize),
            len: top.len,
            payload: top.payload,
            kind: top.kind,
        })
    }

    /// The I/O layer could not write a released frame: count it as a transmit error.
    pub fn note_tx_error(&mut self, r: &Released) {
        self.counters.by_class[r.class as usize]
            .tx_errors
            .add(r.len, r.payload, r.kind);
    }

    fn lose(&mut self) -> bool {
        match self.settings.loss {
            LossModel::None => false,
            LossModel::Bernoulli { p } => self.rng.chance(p),
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                self.ge_bad = if self.ge_bad {
                    !self.rng.chance(r)
                } else {
                    self.rng.chance(p)
                };
                self.rng
                    .chance(if self.ge_bad { loss_bad } else { loss_good })
            }
        }
    }

    /// Standard normal deviate (Box–Muller; one of the pair is discarded, which is cheap
    /// enough for the jitter path and keeps the state machine simple).
    fn std_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.rng.next_f64(); // (0, 1]
        let u2 = self.rng.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::super::classify::testframes::udp_frame;
    use super::super::rng::Xoshiro256pp;
    use super::*;

    const MS: u64 = 1_000_000;

    /// A scripted random source: returns the given words, then repeats the last.
    struct Script(Vec<u64>, usize);
    impl RandomSource for Script {
        fn next_u64(&mut self) -> u64 {
            let v = self.0[self.1.min(self.0.len() - 1)];
            self.1 += 1;
            v
        }
    }

    fn pipe(s: DirSettings) -> Pipe<Xoshiro256pp> {
        Pipe::new(s, PipeConfig::default(), Xoshiro256pp::seed_from_u64(1))
    }

    /// A pipe that can hold a million frames, for tests that offer without draining.
    fn big_pipe(s: DirSettings) -> Pipe<Xoshiro256pp> {
        let cfg = PipeConfig {
            max_in_flight: 1 << 20,
            ..Default::default()
        };
        Pipe::new(s, cfg, Xoshiro256pp::seed_from_u64(1))
    }

    fn frame(payload: usize) -> Vec<u8> {
        udp_frame(40000, 9000, payload)
    }

    fn drain(p: &mut Pipe<impl RandomSource>, now: Nanos) -> Vec<Released> {
        std::iter::from_fn(|| p.poll_release(now)).collect()
    }

    fn assert_invariant(p: &Pipe<impl RandomSource>) {
        let t = p.counters().total();
        let accounted = t.lost.frames
            + t.queue_dropped.frames
            + t.down_dropped.frames
            + t.delivered.frames
            + p.in_flight() as u64;
        assert_eq!(t.offered.frames, accounted, "frame invariant: {t:?}");
    }

    #[test]
    fn pass_through_without_impairment() {
        let mut p = pipe(DirSettings::default());
        let f = frame(100);
        assert_eq!(p.offer(5, &f, 1), Verdict::Scheduled { release: 5 });
        let r = drain(&mut p, 5);
        assert_eq!(r.len(), 1);
        assert!(r[0].deliver);
        assert_eq!(r[0].token, 1);
        let t = p.counters().total();
        assert_eq!(t.offered.frames, 1);
        assert_eq!(t.offered.bytes, f.len() as u64);
        assert_eq!(t.delivered.payload_bytes, 100);
        assert_eq!(p.counters().class(Class::UdpOther).delivered.frames, 1);
    }

    #[test]
    fn fixed_delay_is_exact_and_fifo() {
        let mut p = pipe(DirSettings {
            delay_ns: 50 * MS,
            ..Default::default()
        });
        for i in 0..100u32 {
            let v = p.offer(i as u64 * 1000, &frame(10), i);
            assert_eq!(
                v,
                Verdict::Scheduled {
                    release: i as u64 * 1000 + 50 * MS
                }
            );
        }
        assert_eq!(p.next_release(), Some(50 * MS));
        assert!(drain(&mut p, 50 * MS - 1).is_empty());
        let r = drain(&mut p, 50 * MS + 99_000);
        let tokens: Vec<u32> = r.iter().map(|r| r.token).collect();
        assert_eq!(tokens, (0..100).collect::<Vec<_>>());
        assert_invariant(&p);
    }

    #[test]
    fn bernoulli_loss_rate_matches() {
        let mut p = pipe(DirSettings {
            loss: LossModel::Bernoulli { p: 0.01 },
            ..Default::default()
        });
        let f = frame(10);
        let n = 2_000_000u64;
        let mut lost = 0u64;
        for i in 0..n {
            if p.offer(i, &f, 0) == Verdict::Lost {
                lost += 1;
            }
            drain(&mut p, i);
        }
        // Expected 20000, sigma ~141.
        assert!((lost as i64 - 20_000).abs() < 800, "lost {lost}");
        assert_eq!(p.counters().total().lost.frames, lost);
        assert_invariant(&p);
    }

    #[test]
    fn gilbert_elliott_mean_and_burst_length() {
        let model = LossModel::GilbertElliott {
            p: 0.01,
            r: 0.25,
            loss_good: 0.0,
            loss_bad: 1.0,
        };
        let expected = model.mean_loss();
        assert!((expected - 0.01 / 0.26).abs() < 1e-12);
        let mut p = pipe(DirSettings {
            loss: model,
            ..Default::default()
        });
        let f = frame(10);
        let n = 4_000_000u64;
        let (mut lost, mut bursts, mut prev_lost) = (0u64, 0u64, false);
        for i in 0..n {
            let is_lost = p.offer(i, &f, 0) == Verdict::Lost;
            if is_lost {
                lost += 1;
                if !prev_lost {
                    bursts += 1;
                }
            }
            prev_lost = is_lost;
            drain(&mut p, i);
        }
        let rate = lost as f64 / n as f64;
        let mean_burst = lost as f64 / bursts as f64;
        assert!(
            (rate / expected - 1.0).abs() < 0.05,
            "rate {rate} vs {expected}"
        );
        assert!((mean_burst - 4.0).abs() < 0.2, "mean burst {mean_burst}");
        // Bursty: far more consecutive losses than Bernoulli at the same rate would give.
        assert!(mean_burst > 2.0 / (1.0 - expected));
    }

    #[test]
    fn gilbert_elliott_with_lossy_good_state() {
        let model = LossModel::GilbertElliott {
            p: 0.05,
            r: 0.5,
            loss_good: 0.01,
            loss_bad: 0.5,
        };
        let mut p = big_pipe(DirSettings {
            loss: model,
            ..Default::default()
        });
        let f = frame(1);
        let n = 2_000_000u64;
        let mut lost = 0;
        for i in 0..n {
            lost += (p.offer(i, &f, 0) == Verdict::Lost) as u64;
            drain(&mut p, i);
        }
        assert_invariant(&p);
        let rate = lost as f64 / n as f64;
        assert!((rate / model.mean_loss() - 1.0).abs() < 0.05, "rate {rate}");
    }

    #[test]
    fn scripted_rng_forces_loss_decisions() {
        // chance(p) is next_f64() < p; u64::MAX maps to ~1.0 (kept), 0 maps to 0.0 (lost).
        let mut p = Pipe::new(
            DirSettings {
                loss: LossModel::Bernoulli { p: 0.5 },
                ..Default::default()
            },
            PipeConfig::default(),
            Script(vec![0, u64::MAX, 0, u64::MAX], 0),
        );
        let f = frame(1);
        let v: Vec<Verdict> = (0..4).map(|i| p.offer(i, &f, i as u32)).collect();
        assert_eq!(v[0], Verdict::Lost);
        assert!(matches!(v[1], Verdict::Scheduled { .. }));
        assert_eq!(v[2], Verdict::Lost);
        assert!(matches!(v[3], Verdict::Scheduled { .. }));
    }

    #[test]
    fn uniform_jitter_without_reorder_is_monotonic_and_bounded() {
        let mut p = pipe(DirSettings {
            delay_ns: 20 * MS,
            jitter_ns: 5 * MS,
            ..Default::default()
        });
        let f = frame(1);
        let mut last = 0;
        let mut releases = Vec::new();
        for i in 0..20_000u64 {
            let now = i * 100_000; // 0.1 ms apart, much less than the jitter
            let Verdict::Scheduled { release } = p.offer(now, &f, i as u32) else {
                panic!()
            };
            assert!(release >= last, "reordered");
            assert!(release >= now + 15 * MS);
            last = release;
            releases.push(release - now);
            for r in drain(&mut p, now) {
                assert!(r.release <= now);
            }
        }
        // Monotonic release pushes the distribution up but never beyond delay + jitter
        // plus the inter-frame spacing.
        let max = *releases.iter().max().unwrap();
        assert!(max <= 25 * MS + 100_000, "max {max}");
        assert_invariant(&p);
    }

    #[test]
    fn uniform_jitter_with_reorder_has_the_right_distribution() {
        let mut p = big_pipe(DirSettings {
            delay_ns: 20 * MS,
            jitter_ns: 5 * MS,
            reorder: true,
            ..Default::default()
        });
        let f = frame(1);
        let n = 200_000u64;
        let mut d = Vec::with_capacity(n as usize);
        for i in 0..n {
            let now = i * 1000;
            let Verdict::Scheduled { release } = p.offer(now, &f, i as u32) else {
                panic!()
            };
            d.push(release as i64 - now as i64 - 20 * MS as i64);
        }
        d.sort_unstable();
        let q = |x: f64| d[((n as f64 - 1.0) * x) as usize] as f64 / MS as f64;
        assert!(q(0.0) >= -5.0 && q(1.0) <= 5.0);
        assert!((q(0.5)).abs() < 0.05, "median {}", q(0.5));
        assert!((q(0.1) + 4.0).abs() < 0.05, "p10 {}", q(0.1));
        assert!((q(0.9) - 4.0).abs() < 0.05, "p90 {}", q(0.9));
        // Released in release order, so many frames overtake others.
        let order: Vec<u32> = drain(&mut p, u64::MAX).iter().map(|r| r.token).collect();
        let inversions = order.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(inversions > 10_000, "inversions {inversions}");
        assert_invariant(&p);
    }

    #[test]
    fn normal_jitter_has_sigma_and_never_precedes_departure() {
        let mut p = big_pipe(DirSettings {
            delay_ns: 10 * MS,
            jitter_ns: 2 * MS,
            jitter_dist: JitterDist::Normal,
            reorder: true,
            ..Default::default()
        });
        let f = frame(1);
        let n = 200_000u64;
        let mut sum = 0.0;
        let mut sq = 0.0;
        for i in 0..n {
            let Verdict::Scheduled { release } = p.offer(i, &f, 0) else {
                panic!()
            };
            assert!(release >= i);
            let x = (release - i) as f64 / MS as f64 - 10.0;
            sum += x;
            sq += x * x;
        }
        let mean = sum / n as f64;
        let sd = (sq / n as f64 - mean * mean).sqrt();
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((sd - 2.0).abs() < 0.03, "sd {sd}");
    }

    #[test]
    fn rate_limit_serializes_at_line_rate_with_overhead() {
        // 1000-byte frames + 24 bytes overhead at 8.192 Mbit/s: exactly 1 ms per frame.
        let mut p = pipe(DirSettings {
            rate_bps: 8_192_000,
            queue_frames: 10,
            ..Default::default()
        });
        let f = vec![0u8; 1000];
        let mut releases = vec![];
        for i in 0..10u32 {
            let Verdict::Scheduled { release } = p.offer(0, &f, i) else {
                panic!()
            };
            releases.push(release);
        }
        assert_eq!(releases, (1..=10).map(|k| k * MS).collect::<Vec<_>>());
        // Queue holds 10 frames now: the 11th is dropped at the tail.
        assert_eq!(p.offer(0, &f, 99), Verdict::QueueDropped);
        // After 1 ms one frame has left the serializer: room for exactly one more.
        assert_eq!(p.offer(MS, &f, 11), Verdict::Scheduled { release: 11 * MS });
        assert_eq!(p.offer(MS, &f, 12), Verdict::QueueDropped);
        assert_eq!(p.counters().total().queue_dropped.frames, 2);
        assert_invariant(&p);
    }

    #[test]
    fn rate_limit_has_no_cumulative_rounding_error() {
        // 7-byte frames (+24) at 3 Mbit/s: 82666.67 ns each, not an integer.
        let mut p = big_pipe(DirSettings {
            rate_bps: 3_000_000,
            queue_frames: 100_000,
            ..Default::default()
        });
        let f = vec![0u8; 7];
        let n = 30_000u64;
        let mut last = 0;
        for i in 0..n {
            if let Verdict::Scheduled { release } = p.offer(0, &f, i as u32) {
                last = release;
            }
        }
        let exact = (n as u128 * 31 * 8 * 1_000_000_000 / 3_000_000) as u64;
        assert!(last.abs_diff(exact) <= 1, "{last} vs {exact}");
    }

    #[test]
    fn rate_limit_queue_bytes_and_long_run_throughput() {
        let rate = 10_000_000u64;
        let mut p = pipe(DirSettings {
            rate_bps: rate,
            queue_frames: 1000,
            queue_bytes: 15_000,
            delay_ns: 5 * MS,
            ..Default::default()
        });
        let f = vec![0u8; 1500];
        // Offer at twice the line rate for one simulated second.
        let per = (1524 * 8 * 1_000_000_000 / rate) / 2;
        let mut t = 0;
        let mut delivered_bytes = 0u64;
        let mut first = None;
        let mut last = 0;
        while t < 1_000_000_000 {
            p.offer(t, &f, 0);
            for r in drain(&mut p, t) {
                delivered_bytes += 1524;
                first.get_or_insert(r.release);
                last = r.release;
            }
            t += per;
        }
        let measured =
            (delivered_bytes - 1524) as f64 * 8.0 / ((last - first.unwrap()) as f64 / 1e9);
        assert!((measured / rate as f64 - 1.0).abs() < 0.001, "{measured}");
        let c = p.counters().total();
        assert!(c.queue_dropped.frames > 0);
        // Byte limit 15000 allows at most 10 frames of 1500 in the queue.
        assert!(p.backlog.len() <= 10);
        assert_invariant(&p);
    }

    #[test]
    fn link_down_drops_new_and_in_flight_frames_then_recovers() {
        let mut s = DirSettings {
            delay_ns: 10 * MS,
            ..Default::default()
        };
        let mut p = pipe(s.clone());
        let f = frame(20);
        for i in 0..5 {
            p.offer(0, &f, i);
        }
        s.up = false;
        p.set_settings(s.clone());
        assert_eq!(p.offer(MS, &f, 9), Verdict::Down);
        s.up = true;
        p.set_settings(s.clone());
        // Back up before the release time: the 5 frames were still cut by the outage.
        let r = drain(&mut p, 20 * MS);
        assert_eq!(r.len(), 5);
        assert!(r.iter().all(|r| !r.deliver));
        assert!(matches!(
            p.offer(20 * MS, &f, 10),
            Verdict::Scheduled { .. }
        ));
        let r = drain(&mut p, 30 * MS);
        assert!(r.len() == 1 && r[0].deliver);
        let t = p.counters().total();
        assert_eq!(t.down_dropped.frames, 6);
        assert_eq!(t.delivered.frames, 1);
        assert_invariant(&p);
    }

    #[test]
    fn settings_change_applies_to_new_frames_only() {
        let mut p = pipe(DirSettings {
            delay_ns: 50 * MS,
            ..Default::default()
        });
        let f = frame(1);
        p.offer(0, &f, 1);
        p.set_settings(DirSettings {
            delay_ns: 10 * MS,
            reorder: true,
            ..Default::default()
        });
        // With reorder allowed the new, shorter delay overtakes the old frame.
        assert_eq!(p.offer(MS, &f, 2), Verdict::Scheduled { release: 11 * MS });
        let order: Vec<u32> = drain(&mut p, 60 * MS).iter().map(|r| r.token).collect();
        assert_eq!(order, vec![2, 1]);
        // Without reorder the shorter delay waits for the earlier frame.
        p.set_settings(DirSettings {
            delay_ns: 50 * MS,
            ..Default::default()
        });
        p.offer(100 * MS, &f, 3);
        p.set_settings(DirSettings {
            delay_ns: 10 * MS,
            ..Default::default()
        });
        assert_eq!(
            p.offer(101 * MS, &f, 4),
            Verdict::Scheduled { release: 150 * MS }
        );
    }

    #[test]
    fn in_flight_limit_bounds_memory() {
        let cfg = PipeConfig {
            max_in_flight: 3,
            ..Default::default()
        };
        let mut p = Pipe::new(
            DirSettings {
                delay_ns: MS,
                ..Default::default()
            },
            cfg,
            Xoshiro256pp::seed_from_u64(3),
        );
        let f = frame(1);
        let v: Vec<Verdict> = (0..5).map(|i| p.offer(0, &f, i)).collect();
        assert_eq!(v[3], Verdict::QueueDropped);
        assert_eq!(v[4], Verdict::QueueDropped);
        assert_eq!(p.in_flight(), 3);
        assert_invariant(&p);
    }

    #[test]
    fn per_class_counters_and_payload() {
        use super::super::classify::testframes::*;
        let mut p = pipe(DirSettings::default());
        let of = eth(0x0800, &ipv4(6, &tcp(40000, 6653, 200)));
        let quic = udp_frame(50000, 6653, 1200);
        p.offer(0, &of, 0);
        p.offer(0, &of, 1);
        p.offer(0, &quic, 2);
        drain(&mut p, 0);
        let c = p.counters();
        assert_eq!(c.class(Class::OpenFlow).delivered.frames, 2);
        assert_eq!(c.class(Class::OpenFlow).delivered.payload_bytes, 400);
        assert_eq!(
            c.class(Class::OpenFlow).delivered.bytes,
            2 * of.len() as u64
        );
        assert_eq!(c.class(Class::Quic).offered.payload_bytes, 1200);
        assert_eq!(c.total().delivered.frames, 3);
        // Short frames record the Ethernet padding they would need.
        let short = eth(0x0806, &[0; 28]); // 42 bytes
        p.offer(0, &short, 3);
        assert_eq!(p.counters().class(Class::Arp).offered.pad_bytes, 18);
    }

    #[test]
    fn reset_counters_keeps_the_invariant_for_frames_in_flight() {
        let mut p = pipe(DirSettings {
            delay_ns: MS,
            ..Default::default()
        });
        let f = frame(1);
        for i in 0..4 {
            p.offer(0, &f, i);
        }
        p.reset_counters();
        assert_eq!(p.counters().total().offered.frames, 4);
        drain(&mut p, MS);
        assert_invariant(&p);
        assert_eq!(p.counters().total().delivered.frames, 4);
    }

    #[test]
    fn validation_rejects_bad_settings() {
        assert!(
            DirSettings {
                loss: LossModel::Bernoulli { p: 1.5 },
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert!(
            DirSettings {
                rate_bps: 1,
                queue_frames: 0,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert!(DirSettings::default().validate().is_ok());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Offer { dt: u64, size: usize },
            Poll { dt: u64 },
            Set(DirSettings),
        }

        fn settings() -> impl Strategy<Value = DirSettings> {
            (
                0u64..5 * MS,
                0u64..3 * MS,
                any::<bool>(),
                any::<bool>(),
                0.0f64..0.5,
                prop_oneof![Just(0u64), 1_000_000u64..100_000_000],
                1u32..20,
                any::<bool>(),
            )
                .prop_map(|(delay, jitter, normal, reorder, p, rate, q, up)| {
                    DirSettings {
                        delay_ns: delay,
                        jitter_ns: jitter,
                        jitter_dist: if normal {
                            JitterDist::Normal
                        } else {
                            JitterDist::Uniform
                        },
                        reorder,
                        loss: LossModel::Bernoulli { p },
                        rate_bps: rate,
                        queue_frames: q,
                        queue_bytes: 0,
                        up,
                    }
                })
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (0u64..200_000, 14usize..1500).prop_map(|(dt, size)| Op::Offer { dt, size }),
                3 => (0u64..2 * MS).prop_map(|dt| Op::Poll { dt }),
                1 => settings().prop_map(Op::Set),
            ]
        }

        proptest! {
            /// Whatever the settings and their changes: counters balance, nothing is
            /// released early or twice, release order is by time, and without `reorder`
            /// frames leave in arrival order.
            #[test]
            fn invariants_hold(init in settings(), ops in proptest::collection::vec(op(), 1..300), seed: u64) {
                let cfg = PipeConfig { max_in_flight: 64, ..Default::default() };
                let mut p = Pipe::new(init, cfg, Xoshiro256pp::seed_from_u64(seed));
                let mut now = 0u64;
                let mut token = 0u32;
                let mut outstanding = std::collections::HashMap::new();
                let mut last_release = 0u64;
                let mut last_token_in_order: Option<u32> = None;
                for op in ops {
                    match op {
                        Op::Offer { dt, size } => {
                            now += dt;
                            let f = vec![0u8; size];
                            if let Verdict::Scheduled { release } = p.offer(now, &f, token) {
                                prop_assert!(release >= now);
                                outstanding.insert(token, (release, p.settings().reorder));
                            }
                            token += 1;
                        }
                        Op::Poll { dt } => now += dt,
                        Op::Set(s) => {
                            if !s.reorder {
                                last_token_in_order = None;
                            }
                            p.set_settings(s);
                        }
                    }
                    while let Some(r) = p.poll_release(now) {
                        let (release, reorder) = outstanding.remove(&r.token).expect("released once");
                        prop_assert_eq!(r.release, release);
                        prop_assert!(release <= now);
                        prop_assert!(release >= last_release, "released out of time order");
                        last_release = release;
                        if !reorder && !p.settings().reorder {
                            if let Some(t) = last_token_in_order {
                                prop_assert!(r.token > t, "reordered without reorder");
                            }
                            last_token_in_order = Some(r.token);
                        }
                    }
                    prop_assert_eq!(p.in_flight(), outstanding.len());
                    let t = p.counters().total();
                    prop_assert_eq!(
                        t.offered.frames,
                        t.lost.frames + t.queue_dropped.frames + t.down_dropped.frames
                            + t.delivered.frames + p.in_flight() as u64
                    );
                    prop_assert!(p.in_flight() <= 64);
                }
            }
        }
    }
}
