//! Class-aware coalescing: what a local peer sends may wait a few milliseconds
//! so that the messages of all services leave in shared, full QUIC packets —
//! except messages someone is waiting for right now, which never wait.
//!
//! [`Coalescer`] sits between the local socket and [`crate::Outbound`]: it takes
//! the bytes the local peer sent and hands on a *prefix* of them, whole
//! messages only, when they may leave. It never reorders, splits or changes a
//! byte, so every ordering rule of [`crate::rules`] holds exactly as without it
//! (the Outbound places what it is given); only timing changes. Sans-IO: the
//! caller supplies the time ([`Coalescer::arrived`], [`Coalescer::take`]) and
//! wakes up at [`Coalescer::deadline`].
//!
//! The policy, for one direction of one session:
//! * **Urgent messages never wait** ([`openflow_is_urgent`], [`jsonrpc_is_urgent`]):
//!   echo (OpenFlow and OVSDB: everything the rules put on the priority lane),
//!   HELLO and the handshake, PACKET_IN, PACKET_OUT, a FLOW_MOD sent while a
//!   PACKET_IN was delivered less than [`ANSWER_WINDOW`] ago (the controller's
//!   answer), BARRIER, ROLE, ERROR, multipart (stats) requests, every reply (a
//!   multipart reply's last part: the parts before it may wait for it),
//!   unknown and experimenter messages.
//!   An urgent message takes everything held before it along, so nothing
//!   overtakes anything.
//! * **Isolated data never waits**: a read that comes more than one window after
//!   the previous one leaves at once, whatever it holds.
//! * Everything else (bulk FLOW_MOD/GROUP_MOD installs, non-final multipart
//!   reply parts, port status, flow removals, OVSDB transactions and
//!   updates) **waits for the next tick** of a clock of period
//!   [`CoalesceConfig::window`] shared by every session of the process, so all
//!   services release on the same instant and share packets; or until
//!   [`CoalesceConfig::max_held`] bytes are held (a burst fills packets by
//!   itself, and waiting longer buys nothing). A message waits at most one
//!   window.
//! * **A burst's tail does not wait for the tick**: when nothing more has
//!   arrived for [`QUIET_FACTOR`] times the session's typical gap between
//!   reads (their geometric mean, so the long pauses between bursts do not
//!   count), at least [`QUIET_MIN`], what is held leaves. A controller that
//!   writes ten FLOW_MODs back to back and then nothing gets the last of them
//!   out within about half a millisecond instead of up to a window later
//!   (`bench delay`: p99 9.05 ms against 2.15 ms without coalescing, at RTT 0
//!   and no loss). A steady stream is not cut short: for Poisson arrivals the
//!   threshold is about 4.5 mean gaps, which one gap in 90 exceeds.

use bytes::{Bytes, BytesMut};
use quicsdn_wire::openflow::{Header, Kind};
use quicsdn_wire::{Framer, Framing};
use std::time::{Duration, Instant};

use crate::rules::{self, JsonRpc};

/// The default window: `bench tuning` measured 2, 5, 10 and 20 ms; 10 ms gave
/// most of the overhead saving at 1k msg/s (docs/benchmarks.md).
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(10);

/// Held bytes that release at once: about three full QUIC packets, so a burst
/// leaves as it arrives and only its tail waits for the tick.
pub const DEFAULT_MAX_HELD: usize = 4096;

/// A FLOW_MOD sent less than this after a PACKET_IN was delivered to the
/// controller is taken as its answer and never waits. Controllers answer a
/// packet-in within milliseconds; a longer window only makes more bulk
/// FLOW_MODs urgent, which costs bytes, never delay.
pub const ANSWER_WINDOW: Duration = Duration::from_millis(100);

/// A session's held messages leave once nothing has arrived for this many of
/// its typical gaps between reads ([`Coalescer::quiet_after`]). For
/// exponential (Poisson) gaps of mean m the geometric mean is m·e^−γ ≈ 0.56 m,
/// so the threshold is ≈ 4.5 m, exceeded by e^−4.5 ≈ 1.1 % of gaps: a steady
/// stream keeps its batching.
pub const QUIET_FACTOR: f64 = 8.0;

/// The shortest quiet spell that releases held messages: below it the
/// process's timer granularity and the scheduler decide anyway.
pub const QUIET_MIN: Duration = Duration::from_micros(500);

/// Weight of a new gap in the running mean of log gaps.
const GAP_WEIGHT: f64 = 1.0 / 16.0;

/// Coalescing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceConfig {
    /// The tick period: the longest a message may wait.
    pub window: Duration,
    /// Release at once when this many bytes are held.
    pub max_held: usize,
    /// The instant the ticks are counted from; every session of a process uses
    /// the same one, so they all release together.
    pub epoch: Instant,
}

impl CoalesceConfig {
    /// `window` with the default byte limit, ticks counted from `epoch`.
    pub fn new(window: Duration, epoch: Instant) -> CoalesceConfig {
        CoalesceConfig {
            window,
            max_held: DEFAULT_MAX_HELD,
            epoch,
        }
    }

    /// The first tick strictly after `t`.
    pub fn next_tick(&self, t: Instant) -> Instant {
        let w = self.window.as_nanos().max(1);
        let since = t.saturating_duration_since(self.epoch).as_nanos();
        let ticks = since / w + 1;
        self.epoch + Duration::from_nanos((ticks * w) as u64)
    }
}

/// True if an OpenFlow message must leave at once. `answering`: a PACKET_IN
/// was delivered to this (controller) side less than [`ANSWER_WINDOW`] ago.
///
/// OpenFlow 1.3.5 §6.2: BARRIER "must be fully processed" and answered before
/// anything after it — the sender waits for the reply; §7.5.2: echo verifies
/// liveness (delaying it measures a slower path than there is); §7.4.1: a
/// packet-in's packet waits in the switch (or is dropped) until the controller
/// answers.
pub fn openflow_is_urgent(msg: &[u8], answering: bool) -> bool {
    let Some(h) = Header::parse(msg) else {
        return true;
    };
    use Kind::*;
    match h.kind() {
        FlowMod => answering,
        // §7.3.5: all parts but the last carry OFPMPF_REPLY_MORE (flags at
        // offset 10 in every version); the requester waits for the last.
        MultipartReply => msg.len() < 12 || u16::from_be_bytes([msg[10], msg[11]]) & 1 == 0,
        // A multipart (stats) request is urgent too: its sender waits for the
        // reply, and a controller polling in a loop slowed down by each wait
        // (`bench hol`: flow-stats throughput halved when requests waited).
        SetConfig | FlowRemoved | PortStatus | GroupMod | PortMod | TableMod | SetAsync
        | MeterMod | TableStatus | BundleAddMessage => false,
        _ => true,
    }
}

/// True if a JSON-RPC (OVSDB) message must leave at once: `echo` requests and
/// every reply (RFC 7047 §4.1.11 echo; a reply is what its requester waits
/// for). Requests and notifications (`transact`, `update`, …) may wait.
pub fn jsonrpc_is_urgent(msg: &[u8]) -> bool {
    if msg.len() <= rules::JSONRPC_ECHO_MAX {
        return match rules::classify_jsonrpc(msg) {
            JsonRpc::EchoRequest(_) | JsonRpc::Reply(_) => true,
            JsonRpc::Other => rules::jsonrpc_method(msg) == Some(rules::JsonRpcMethod::Echo),
        };
    }
    // Too big to parse for a class: a reply is an object with a top-level
    // "result" or "error" member (RFC 7047 §4.1: JSON-RPC 1.0 responses).
    has_top_level_key(msg, &[b"result", b"error"])
}

/// True if the JSON object `msg` has one of `keys` as a top-level member name.
/// Scans once, without building anything.
fn has_top_level_key(msg: &[u8], keys: &[&[u8]]) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while i < msg.len() {
        match msg[i] {
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < msg.len() && msg[j] != b'"' {
                    j += if msg[j] == b'\\' { 2 } else { 1 };
                }
                let end = j.min(msg.len());
                i = end + 1;
                if depth == 1 {
                    let mut k = i;
                    while k < msg.len() && msg[k].is_ascii_whitespace() {
                        k += 1;
                    }
                    if k < msg.len() && msg[k] == b':' && keys.contains(&&msg[start..end]) {
                        return true;
                    }
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

/// What a [`Coalescer`] did, for the session's closing log line and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceStats {
    /// Messages that left at once because they were urgent.
    pub urgent: u64,
    /// Messages that waited (for a tick, the byte limit or an urgent message).
    pub held: u64,
}

/// Why held messages left ([`Flush`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushReason {
    /// An urgent message took them along.
    Urgent,
    /// [`CoalesceConfig::max_held`] bytes were held.
    Bytes,
    /// The tick came ([`Coalescer::deadline`]).
    Tick,
    /// Nothing more arrived for a while: the end of a burst
    /// ([`Coalescer::quiet_after`]).
    Quiet,
}

/// One release of held messages, reported as data for the caller to record
/// (the agents' hold-time histograms): why, how long the oldest of them
/// waited, and how many there were. Messages that never waited (urgent or
/// isolated ones leaving alone) make none; nor does [`Coalescer::flush`] at
/// the end of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flush {
    pub reason: FlushReason,
    pub held_for: Duration,
    pub messages: u32,
}

/// One direction of one session's coalescing (see the module documentation).
#[derive(Debug)]
pub struct Coalescer {
    framer: Framer,
    framing: Framing,
    cfg: CoalesceConfig,
    buf: BytesMut,
    /// Free space the next read gets (see [`Coalescer::read_done`]).
    chunk: usize,
    /// Bytes of `buf` framed and classified (whole messages).
    scanned: usize,
    /// Bytes of `buf` that may leave now (a prefix of `scanned`).
    release: usize,
    /// When the oldest message past `release` arrived.
    held_since: Option<Instant>,
    last_arrival: Option<Instant>,
    /// Running mean of ln(seconds) between reads less than a window apart.
    log_gap: Option<f64>,
    last_packet_in: Option<Instant>,
    /// After a framing error everything passes as it comes; the Outbound
    /// reports the error after the messages before it.
    passthrough: bool,
    stats: CoalesceStats,
    /// Whole messages waiting (past `release`).
    held_messages: u32,
    /// Releases not yet collected by [`Coalescer::take_flushes`].
    flushes: Vec<Flush>,
}

impl Coalescer {
    pub fn new(framing: Framing, max_message: usize, cfg: CoalesceConfig) -> Coalescer {
        Coalescer {
            framer: Framer::new(framing, max_message),
            framing,
            cfg,
            buf: BytesMut::new(),
            chunk: crate::MIN_READ_CHUNK,
            scanned: 0,
            release: 0,
            held_since: None,
            last_arrival: None,
            log_gap: None,
            last_packet_in: None,
            // Raw services have no messages to classify: never held.
            passthrough: framing == Framing::Raw,
            stats: CoalesceStats::default(),
            held_messages: 0,
            flushes: Vec::new(),
        }
    }

    /// Gives the read buffer back if it holds nothing (as
    /// [`crate::Outbound::release_idle_buf`]): an idle session keeps none.
    pub fn release_idle_buf(&mut self) {
        if self.buf.is_empty() && self.scanned == 0 && self.release == 0 {
            self.buf = BytesMut::new();
        }
    }

    /// The buffer to read local bytes into, with at least the current read
    /// size free ([`crate::MIN_READ_CHUNK`] to [`crate::READ_CHUNK`], as for
    /// [`crate::Outbound::read_buf`]: an idle session keeps 1 KiB, not 64);
    /// only appending is allowed. Call [`Coalescer::read_done`] and
    /// [`Coalescer::arrived`] after.
    pub fn read_buf(&mut self) -> &mut BytesMut {
        if self.buf.is_empty()
            && self.scanned == 0
            && self.release == 0
            && self.buf.capacity() > 2 * self.chunk
        {
            self.buf = BytesMut::new();
        }
        if self.buf.capacity() - self.buf.len() < self.chunk {
            self.buf.reserve(self.chunk);
        }
        &mut self.buf
    }

    /// A read into [`Coalescer::read_buf`] brought `n` bytes: a full read
    /// doubles the next one's space, a read of a quarter or less halves it.
    pub fn read_done(&mut self, n: usize) {
        if n >= self.chunk {
            self.chunk = (self.chunk * 2).min(crate::READ_CHUNK);
        } else if n <= self.chunk / 4 {
            self.chunk = (self.chunk / 2).max(crate::MIN_READ_CHUNK);
        }
    }

    /// Bytes were appended to [`Coalescer::read_buf`] at `now`: classifies the
    /// messages they completed.
    pub fn arrived(&mut self, now: Instant) {
        let gap = self.last_arrival.map(|t| now.saturating_duration_since(t));
        let isolated = gap.is_none_or(|g| g >= self.cfg.window) && self.release == self.scanned;
        if let Some(g) = gap.filter(|&g| g < self.cfg.window) {
            // The pauses between bursts (a window or more) do not count.
            let x = g.max(Duration::from_micros(1)).as_secs_f64().ln();
            self.log_gap = Some(self.log_gap.map_or(x, |m| m + (x - m) * GAP_WEIGHT));
        }
        self.last_arrival = Some(now);
        if self.passthrough {
            return;
        }
        let answering = self
            .last_packet_in
            .is_some_and(|t| now.saturating_duration_since(t) < ANSWER_WINDOW);
        loop {
            let n = match self.framer.next_message(&self.buf[self.scanned..]) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(_) => {
                    self.passthrough = true;
                    break;
                }
            };
            let msg = &self.buf[self.scanned..self.scanned + n];
            let urgent = match self.framing {
                Framing::OpenFlow => openflow_is_urgent(msg, answering),
                Framing::JsonRpc => jsonrpc_is_urgent(msg),
                Framing::Raw => true,
            };
            self.scanned += n;
            if urgent {
                self.stats.urgent += 1;
            } else if !isolated {
                self.stats.held += 1;
            }
            if urgent || isolated {
                // Everything held before it goes along, in order.
                self.release_held(now, FlushReason::Urgent);
                self.release = self.scanned;
            } else {
                self.held_messages += 1;
                if self.held_since.is_none() {
                    self.held_since = Some(now);
                }
            }
        }
        if self.scanned - self.release >= self.cfg.max_held {
            self.release_held(now, FlushReason::Bytes);
            self.release = self.scanned;
        }
    }

    /// The held messages leave at `now`: reports the release, if any waited.
    fn release_held(&mut self, now: Instant, reason: FlushReason) {
        if let Some(since) = self.held_since.take() {
            self.flushes.push(Flush {
                reason,
                held_for: now.saturating_duration_since(since),
                messages: self.held_messages,
            });
        }
        self.held_messages = 0;
    }

    /// The releases since the last call, oldest first.
    pub fn take_flushes(&mut self) -> std::vec::Drain<'_, Flush> {
        self.flushes.drain(..)
    }

    /// A PACKET_IN was delivered to the local controller at `now`: FLOW_MODs in
    /// the next [`ANSWER_WINDOW`] answer it.
    pub fn packet_in_delivered(&mut self, now: Instant) {
        self.last_packet_in = Some(now);
    }

    /// How long without a read ends a burst: [`QUIET_FACTOR`] times the
    /// geometric mean of the gaps between reads, from [`QUIET_MIN`] to the
    /// window. `None` before the second read.
    pub fn quiet_after(&self) -> Option<Duration> {
        let m = self.log_gap?;
        let d = Duration::try_from_secs_f64(QUIET_FACTOR * m.exp()).unwrap_or(self.cfg.window);
        Some(d.clamp(QUIET_MIN, self.cfg.window.max(QUIET_MIN)))
    }

    /// When held messages must leave, if any are held: the next tick, or
    /// earlier if the reads have gone quiet ([`Coalescer::quiet_after`]).
    pub fn deadline(&self) -> Option<Instant> {
        if self.passthrough {
            return None;
        }
        let tick = self.cfg.next_tick(self.held_since?);
        match (self.quiet_after(), self.last_arrival) {
            (Some(q), Some(last)) => Some(tick.min(last + q)),
            _ => Some(tick),
        }
    }

    /// The bytes that may leave at `now` (empty if none): whole messages, in the
    /// order they arrived. After a framing error, everything.
    pub fn take(&mut self, now: Instant) -> Bytes {
        if self.passthrough {
            self.scanned = 0;
            self.release = 0;
            self.held_since = None;
            self.held_messages = 0;
            return self.buf.split().freeze();
        }
        if self.deadline().is_some_and(|d| now >= d) {
            let tick = self.held_since.map(|t| self.cfg.next_tick(t));
            let reason = if tick.is_some_and(|t| now >= t) {
                FlushReason::Tick
            } else {
                FlushReason::Quiet
            };
            self.release_held(now, reason);
            self.release = self.scanned;
        }
        let out = self.buf.split_to(self.release);
        self.scanned -= self.release;
        self.release = 0;
        out.freeze()
    }

    /// Everything held, partial messages included (the local peer finished).
    pub fn flush(&mut self) -> Bytes {
        self.scanned = 0;
        self.release = 0;
        self.held_since = None;
        self.held_messages = 0;
        self.buf.split().freeze()
    }

    /// True while whole messages wait.
    pub fn is_holding(&self) -> bool {
        self.held_since.is_some()
    }

    pub fn stats(&self) -> CoalesceStats {
        self.stats
    }
}
