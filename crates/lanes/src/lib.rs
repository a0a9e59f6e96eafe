//! `quicsdn-lanes`: which QUIC stream ("lane") each message of a session travels
//! on, and how lanes merge back into one byte stream. No I/O, no clock.
//!
//! A *session* is one local connection (OVS ↔ switch agent, or controller agent ↔
//! controller) carried across the QUIC connection. Each direction of a session
//! has its own lanes: lane 0 is the session's bidirectional stream; lanes 1.. are
//! unidirectional streams the sender opens when it first needs them. This crate
//! sits between [`quicsdn_wire`] (message boundaries) and the agent's I/O:
//!
//! ```text
//!  local socket ──bytes──▶ Outbound ──(lane, whole messages [+ marker])──▶ QUIC streams
//!  QUIC streams ──(lane, chunks)──▶ Inbound ──whole messages, in release order──▶ local socket
//! ```
//!
//! Stream modes ([`StreamMode`]):
//! * `safe` (the default): OpenFlow-aware scheduling that keeps every order
//!   Open vSwitch and controllers rely on and lets only independent messages
//!   overtake each other; the rules are the table in [`rules`], also in
//!   `docs/streams.md`. Lane 0 is the main stream (everything towards the
//!   switch, and fences), lane 1 the priority stream (echo), lanes 2.. keyed
//!   streams. Fences carry a small marker ([`marker`]); nothing else is added.
//! * `ordered`: one lane; the peer receives exactly the bytes the local peer
//!   sent (the quicSDN paper's "2s").
//! * `rr:N`: consecutive messages go round robin over N lanes and are released
//!   in the order they complete (the paper's "16s"). Each lane keeps its order,
//!   but messages on different lanes may overtake each other, barriers
//!   included: OpenFlow 1.3.5 §6.2 says "messages must not be reordered across a
//!   barrier message". For reproducing the paper only.
//!
//! Contracts: messages are never split across lanes, altered, dropped or
//! duplicated; a service without message boundaries ([`Framing::Raw`]) always
//! uses one lane.

pub mod coalesce;
pub mod early;
pub mod hello;
pub mod marker;
pub mod rules;

mod inbound;
mod outbound;

pub use coalesce::{CoalesceConfig, Coalescer, Flush, FlushReason};
pub use early::EarlyGate;
pub use hello::{EchoStandIn, HelloStandIn, StandInError};
pub use inbound::{Inbound, InboundEvent, TruncatedLane};
pub use outbound::{Batch, Outbound};
pub use rules::Direction;

use quicsdn_wire::Framing;
use std::fmt;
use std::str::FromStr;

/// The most free buffer space a read from the local socket gets: a busy local
/// peer's reads fill it, so whole bursts go out in few batches.
pub const READ_CHUNK: usize = 64 * 1024;
/// The least: what an idle session's read buffer shrinks to, so a controller
/// agent with thousands of idle switches does not hold 64 KiB for each (issue
/// 18). Reads that fill it double it again, up to [`READ_CHUNK`].
pub const MIN_READ_CHUNK: usize = 1024;

/// Keyed lanes of `safe` mode unless `safe:K` says otherwise.
pub const DEFAULT_KEYED_LANES: u16 = 8;
/// The main lane (the session's bidirectional stream).
pub const MAIN_LANE: usize = 0;
/// The priority lane of `safe` mode.
pub const PRIORITY_LANE: usize = 1;
/// The first keyed lane of `safe` mode.
pub const FIRST_KEYED_LANE: usize = 2;

/// How a session's messages are spread over streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    /// One stream per session, both directions, in order.
    Ordered,
    /// Consecutive messages go round robin over `lanes` streams; released in arrival
    /// order. Not order-preserving.
    RoundRobin { lanes: u16 },
    /// Ordering-safe scheduling over a main, a priority and `keyed` keyed streams.
    Safe { keyed: u16 },
}

impl Default for StreamMode {
    fn default() -> Self {
        StreamMode::Safe {
            keyed: DEFAULT_KEYED_LANES,
        }
    }
}

impl StreamMode {
    /// Lanes one direction of a session of this framing may use.
    pub fn lanes_for(self, framing: Framing) -> usize {
        match (self, framing) {
            (_, Framing::Raw) | (StreamMode::Ordered, _) => 1,
            (StreamMode::RoundRobin { lanes }, _) => usize::from(lanes),
            // OVSDB needs no keyed lanes: one ordered stream plus echo.
            (StreamMode::Safe { .. }, Framing::JsonRpc) => 2,
            (StreamMode::Safe { keyed }, Framing::OpenFlow) => {
                FIRST_KEYED_LANE + usize::from(keyed)
            }
        }
    }

    /// The code and parameter carried in a session's preamble.
    pub fn to_wire(self) -> (u64, u64) {
        match self {
            StreamMode::Ordered => (0, 0),
            StreamMode::RoundRobin { lanes } => (1, u64::from(lanes)),
            StreamMode::Safe { keyed } => (2, u64::from(keyed)),
        }
    }

    /// The mode a preamble names, if valid.
    pub fn from_wire(code: u64, param: u64) -> Option<StreamMode> {
        let n = u16::try_from(param).ok().filter(|n| (1..=256).contains(n));
        match code {
            0 => Some(StreamMode::Ordered),
            1 => n.map(|lanes| StreamMode::RoundRobin { lanes }),
            2 => n.map(|keyed| StreamMode::Safe { keyed }),
            _ => None,
        }
    }
}

impl fmt::Display for StreamMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamMode::Ordered => f.write_str("ordered"),
            StreamMode::RoundRobin { lanes } => write!(f, "rr:{lanes}"),
            StreamMode::Safe { keyed } if *keyed == DEFAULT_KEYED_LANES => f.write_str("safe"),
            StreamMode::Safe { keyed } => write!(f, "safe:{keyed}"),
        }
    }
}

/// Why a stream mode string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid stream mode {0:?}: expected \"safe\", \"safe:K\", \"ordered\" or \"rr:N\" with K and N from 1 to 256"
)]
pub struct BadStreamMode(String);

impl FromStr for StreamMode {
    type Err = BadStreamMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number = |n: &str| {
            n.parse::<u16>()
                .ok()
                .filter(|n| (1..=256).contains(n))
                .ok_or_else(|| BadStreamMode(s.to_string()))
        };
        match s {
            "ordered" => Ok(StreamMode::Ordered),
            "safe" => Ok(StreamMode::default()),
            _ => {
                if let Some(n) = s.strip_prefix("rr:") {
                    Ok(StreamMode::RoundRobin { lanes: number(n)? })
                } else if let Some(n) = s.strip_prefix("safe:") {
                    Ok(StreamMode::Safe { keyed: number(n)? })
                } else {
                    Err(BadStreamMode(s.to_string()))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
