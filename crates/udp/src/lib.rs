//! `quicsdn-udp`: OpenFlow and OVSDB over plain UDP with an application-level
//! reliability layer, as sans-IO state machines (no sockets, no clock: every
//! call takes `now`).
//!
//! Two profiles (see [`Profile`]):
//! * **seed** reproduces the paper "Modifying Southbound Communication Protocol
//!   in SDN: TCP to UDP for Ryu–OVS" exactly: one message per datagram,
//!   sequence numbers, a fixed 1.0 s retransmission timeout, at most 3
//!   retransmits and then the message is given up, a 1000-entry duplicate
//!   window, out-of-order arrivals counted but delivered as they come, no
//!   congestion control.
//! * **robust** is what one would ship: adaptive RTO (RFC 6298), in-order
//!   delivery per channel, a send window bounded by NewReno-style congestion
//!   control (RFC 5681) and the receiver's window, fragmentation of messages
//!   larger than the path MTU, messages queued behind a full window sharing
//!   packets, and no silent loss: giving up fails the association, which the
//!   agents close visibly.
//!
//! Neither authenticates nor encrypts anything.
//!
//! Layers: [`packet`] encodes and decodes datagrams; [`channel`] is one
//! reliable message channel (sender and receiver); [`assoc`] is one
//! association between a switch agent and a controller agent: hello
//! exchange, channels, keep-alive and liveness.

pub mod assoc;
pub mod channel;
pub mod packet;

#[cfg(test)]
mod tests;

pub use assoc::{Association, CloseReason, Event, Role};
pub use channel::{ChannelStats, Message, MessageKind};
pub use packet::PacketError;

use std::time::Duration;

/// The reliability mechanism of service channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// The paper's mechanism, weaknesses included.
    Seed,
    /// Adaptive, ordered, congestion-controlled, fragmenting.
    Robust,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Seed => "seed",
            Profile::Robust => "robust",
        }
    }

    pub fn parse(s: &str) -> Option<Profile> {
        match s {
            "seed" => Some(Profile::Seed),
            "robust" => Some(Profile::Robust),
            _ => None,
        }
    }

    fn to_wire(self) -> u8 {
        match self {
            Profile::Seed => 1,
            Profile::Robust => 2,
        }
    }

    fn from_wire(b: u8) -> Option<Profile> {
        match b {
            1 => Some(Profile::Seed),
            2 => Some(Profile::Robust),
            _ => None,
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The paper's fixed retransmission timeout (`RETRANSMIT_TIMEOUT = 1.0`).
pub const SEED_RTO: Duration = Duration::from_secs(1);
/// The paper's retransmission limit (`MAX_RETRANSMITS = 3`).
pub const SEED_MAX_RETRANSMITS: u32 = 3;
/// The paper's duplicate-detection window (`SEQ_WINDOW_SIZE = 1000`).
pub const SEED_DUP_WINDOW: usize = 1000;

/// Settings of an association.
#[derive(Debug, Clone)]
pub struct Config {
    /// Mechanism of the service channels. The control channel (channel 0: session
    /// opens and refusals) always uses [`Profile::Robust`], so a lost open cannot
    /// strand a session.
    pub profile: Profile,
    /// Largest datagram payload this side sends (robust fragments to it). 1472
    /// fills a 1500-byte Ethernet MTU with IPv4 and UDP headers.
    pub max_datagram: usize,
    /// Send a PING after this long without sending anything.
    pub keepalive: Duration,
    /// The association is dead after this long without hearing from the peer.
    pub idle_timeout: Duration,
    /// Packets a robust receiver buffers per channel (out of order or not yet
    /// taken by the application); also the largest window it advertises.
    pub recv_window: u32,
    /// Robust: retransmissions of one packet before the association fails.
    pub max_retransmits: u32,
    /// Robust: lower bound of the RTO.
    pub min_rto: Duration,
    /// Robust: upper bound of the RTO.
    pub max_rto: Duration,
    /// Robust: longest an acknowledgement is delayed.
    pub ack_delay: Duration,
    /// Hello retransmission interval while the association is being set up.
    pub hello_interval: Duration,
}

impl Config {
    pub fn new(profile: Profile) -> Config {
        Config {
            profile,
            max_datagram: 1472,
            keepalive: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(6),
            recv_window: 1024,
            max_retransmits: 10,
            // RFC 6298 (2.4) says the RTO SHOULD be rounded up to 1 s; like Linux
            // (200 ms) we go lower, since control links are LANs or short WANs and a
            // 1 s floor would make every loss cost a second.
            min_rto: Duration::from_millis(200),
            // RFC 6298 (2.5) allows a maximum of at least 60 s; the association's
            // idle timeout (the agents' grace period) detects a dead peer, so backing
            // off further than a few seconds only delays recovery.
            max_rto: Duration::from_secs(4),
            // RFC 5681 §4.2: an ACK "MUST be generated within 500 ms of the arrival
            // of the first unacknowledged packet"; we stay far below.
            ack_delay: Duration::from_millis(5),
            hello_interval: Duration::from_millis(500),
        }
    }
}
