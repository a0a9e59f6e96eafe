//! `quicsdn-sdudp`: the sans-IO core of SDUDP (paper `sdudp`: "SDUDP: A Reliable
//! UDP-Based Transmission Protocol Over SDN"), no sockets and no clock: every
//! call takes `now`.
//!
//! A TCP connection between two hosts is terminated at its two edge switches by
//! TCP engines; between them its bytes travel as plain UDP datagrams, numbered
//! by the IPv4 Identification field from 0, +1 per datagram, over a path the
//! controller fixes with OpenFlow rules. A retransmission engine in every
//! switch of the path (or a chosen subset) holds what it forwarded until the
//! next engine releases it, detects a gap in the IDs at once and asks the
//! previous engine for the missing datagrams (repeating the request on a timer
//! if it is lost), and forwards strictly in order.
//!
//! Layers, bottom up:
//! * [`seq`]: 16-bit IDs ⇄ 64-bit sequence numbers (wrap-around).
//! * [`msg`]: what a numbered datagram carries ([`msg::Message`]: open,
//!   accept, refuse, data, FIN, reset) and the hop-by-hop control messages
//!   between adjacent engines ([`msg::Control`]: feedback = release + NACK +
//!   window, probe, fail).
//! * [`ipv4`]: IPv4/UDP headers of the numbered datagrams (where the ID is
//!   written, RFC 6864).
//! * [`hop`]: one flow's sending half ([`hop::HopSender`]: numbering, the
//!   retransmission buffer, probes) and receiving half ([`hop::HopReceiver`]:
//!   gap detection, NACKs, in-order release, liveness).
//! * [`engine`]: the retransmission engine of a switch: many flows, each a
//!   receiver feeding a sender through one bounded buffer.
//! * [`accumulate`]: packet accumulation with a bounded wait.
//! * [`conn`]: the TCP engine's per-connection state machine at an edge:
//!   setup semantics (the host's SYN-ACK only once the far host accepted),
//!   stream bytes ⇄ numbered datagrams, FIN and RST end to end, failure.
//!
//! Reliability contract: every datagram a sender numbered reaches the far edge
//! exactly once and in order, or the flow fails visibly ([`engine::EngineEvent::FlowFailed`],
//! [`conn::ConnEvent::ResetHost`]) on every engine that can still be reached.
//! Buffers are bounded by [`Config::capacity`] datagrams per flow and engine;
//! a full downstream stops the upstream engines and finally the edge's
//! sender, whose host then sees TCP's own flow control, never a drop.

pub mod accumulate;
pub mod conn;
pub mod engine;
pub mod hop;
pub mod ipv4;
pub mod msg;
pub mod seq;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use accumulate::Accumulator;
pub use conn::{ConnEvent, Connection, Role};
pub use engine::{Engine, EngineEvent, EngineStats};
pub use hop::{HopReceiver, HopSender};
pub use msg::{Control, Direction, FailReason, FlowKey, Message, MsgError, TcpOptions};

use std::time::Duration;

/// Largest [`Config::capacity`]: a flow's datagrams in flight at one hop must
/// span less than half the 16-bit ID space, so every ID an engine can see
/// names exactly one sequence number ([`seq::unwrap`]).
pub const MAX_CAPACITY: u32 = 16_384;

/// Settings shared by every engine of a path (the controller gives all of them
/// the same values; [`Config::capacity`] in particular is each receiver's
/// initial window as its sender assumes it).
#[derive(Debug, Clone)]
pub struct Config {
    /// Datagrams one flow may hold at one engine: forwarded but not yet
    /// released by the next engine, waiting to be forwarded, or out of order.
    /// Also the window each engine grants the previous one. At most
    /// [`MAX_CAPACITY`].
    pub capacity: u32,
    /// Retransmission timeout of a hop before any round-trip sample.
    pub initial_rto: Duration,
    /// Lower bound of a hop's retransmission timeout.
    pub min_rto: Duration,
    /// Upper bound of a hop's retransmission timeout (after backoff).
    pub max_rto: Duration,
    /// A receiver releases (sends feedback) after this many in-order datagrams…
    pub release_every: u32,
    /// …or this long after the first unreleased one, whichever comes first.
    /// Long, so that a slow stream (the paper's 100 KB/s: a datagram every
    /// ~15 ms) is not answered datagram by datagram: a sender that needs a
    /// release sooner asks for it (below), and gaps are requested at once
    /// whatever this is.
    pub release_delay: Duration,
    /// A sender with unreleased datagrams and nothing more to send asks for a
    /// release (a PROBE) this long after its RTO: a lost last datagram is
    /// found as fast as when every receiver released within this delay.
    pub tail_probe_delay: Duration,
    /// An idle sender probes the next engine this often, so both know the
    /// other is alive.
    pub keepalive: Duration,
    /// A flow fails when the neighbouring engine has been silent this long.
    pub dead_after: Duration,
    /// How long an engine remembers a finished or failed flow (late duplicates
    /// of it are then ignored instead of starting a new flow).
    pub linger: Duration,
    /// Most ranges of missing datagrams one NACK names.
    pub max_nack_ranges: usize,
    /// Most flows one engine holds; datagrams of further flows are dropped
    /// (their senders then fail them visibly).
    pub max_flows: usize,
    /// A per-hop congestion window (below), so that a sender never puts a
    /// whole window on the next hop's port at once. `None`: send everything
    /// the next engine's window allows at once (the paper's engines).
    pub congestion: Option<CongestionConfig>,
    /// Relay engines forward each datagram as it arrives, gaps or not, and
    /// only the receiving edge restores the order. `false`: relays forward
    /// strictly in order (the paper's engines), so a loss on one link holds
    /// every later datagram for its repair and each link after it idles that
    /// long; on a line of equal-rate links that time is never made up.
    pub cut_through: bool,
}

/// The per-hop congestion window, in datagrams: it starts at `initial`, grows
/// by one per datagram the next engine releases below `ssthresh` (RFC 5681
/// §3.1 slow start) and never falls below `min`. New datagrams go out only
/// while fewer than the window are in flight (sent, neither released nor
/// reported held behind a gap by the next engine); retransmissions always go.
///
/// What shrinks it is *queueing*, not random loss: a hop's losses are
/// repaired by its own engines, so a window that halved per random loss (as
/// TCP's does) only slowed the line: on Fig. 11's line (8 links of 20 ms,
/// 1 % loss, 10 Mbit/s) 3 MB took 9.8 s instead of ~2.6 s
/// (`tests::fig11_line`). A full port queue costs twice: everything sent
/// waits behind it, repairs included (the lab's emulated links queue 1,000
/// frames, 1.2 s at 10 Mbit/s). So, as TCP Vegas (Brakmo & Peterson, 1995):
/// once per window round the hop estimates the datagrams it keeps queued,
/// `cwnd × (rtt − base_rtt) / rtt` (rtt: the round's least sample from send
/// to release; base_rtt: the least ever), and grows the window by one below
/// `queue_low`, shrinks it by one above `queue_high`, and leaves slow start
/// there. A drop-tail queue shallower than that still overflows in slow
/// start: more than `1 + cwnd × tolerated_loss_permille / 1000` datagrams
/// requested in one round halve the window (RFC 5681 (4), once per window as
/// RFC 6582), a sparse random loss does not. `queue_high` 0 and
/// `tolerated_loss_permille` 0 give NewReno (the window before this rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CongestionConfig {
    pub initial: u32,
    pub min: u32,
    /// Queued datagrams below which the window grows (Vegas' α).
    pub queue_low: u32,
    /// Queued datagrams above which it shrinks (Vegas' β); 0: no delay rule.
    pub queue_high: u32,
    /// Losses per round, in ‰ of the window (plus one), taken as random.
    pub tolerated_loss_permille: u32,
}

impl CongestionConfig {
    /// The window before the delay and loss-tolerance rules: NewReno,
    /// halving once per window at the first loss.
    pub fn newreno() -> CongestionConfig {
        CongestionConfig {
            queue_low: 0,
            queue_high: 0,
            tolerated_loss_permille: 0,
            ..CongestionConfig::default()
        }
    }
}

impl Default for CongestionConfig {
    fn default() -> CongestionConfig {
        CongestionConfig {
            initial: 32,
            min: 8,
            queue_low: 4,
            queue_high: 12,
            // 10 % of what a round sent (was 3 %): a queue overflowing in
            // slow start loses about half of what the window overshot, far
            // more; at 3 % a lossy 20 ms hop halved its window more often
            // than it grew it back (virtual clock, 9 switches, 1 %: 4.3–7.5 s
            // for 3 MB against 3.1–3.2 s; docs/sdudp.md).
            tolerated_loss_permille: 100,
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            capacity: 1024,
            // The first request for a gap goes out at once; the RTO only paces
            // repeated requests and probes. 100 ms covers a 20 ms link (40 ms
            // round trip) with room; samples then take over.
            initial_rto: Duration::from_millis(100),
            min_rto: Duration::from_millis(5),
            max_rto: Duration::from_secs(1),
            release_every: 16,
            release_delay: Duration::from_millis(100),
            tail_probe_delay: Duration::from_millis(10),
            keepalive: Duration::from_secs(1),
            dead_after: Duration::from_secs(5),
            linger: Duration::from_secs(10),
            max_nack_ranges: 64,
            max_flows: 65_536,
            congestion: Some(CongestionConfig::default()),
            cut_through: true,
        }
    }
}

impl Config {
    /// Checks the settings' invariants; the engines assume them.
    pub fn validate(&self) -> Result<(), String> {
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(format!(
                "capacity {} out of range 1..={MAX_CAPACITY} (datagrams in flight at one hop must span less than half the 16-bit ID space)",
                self.capacity
            ));
        }
        if self.release_every == 0 {
            return Err("release_every must be at least 1".into());
        }
        if self.min_rto.is_zero() || self.min_rto > self.max_rto {
            return Err("need 0 < min_rto <= max_rto".into());
        }
        if self.dead_after <= self.keepalive {
            return Err("dead_after must exceed keepalive".into());
        }
        if self.max_nack_ranges == 0 {
            return Err("max_nack_ranges must be at least 1".into());
        }
        if let Some(c) = self.congestion
            && (c.min == 0 || c.min > c.initial)
        {
            return Err("need 0 < congestion min <= initial".into());
        }
        if let Some(c) = self.congestion
            && c.queue_high != 0
            && c.queue_low > c.queue_high
        {
            return Err("need congestion queue_low <= queue_high".into());
        }
        Ok(())
    }
}
