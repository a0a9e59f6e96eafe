//! `quicsdn-lanes`: which QUIC stream ("lane") each message of a session travels
//! on, and how lanes merge back into one byte stream. No I/O, no clock.
//!
//! A *session* is one local connection (OVS ↔ switch agent, or controller agent ↔
//! controller) carried across the QUIC connection. It owns one or more lanes, each a
//! bidirectional QUIC stream. This crate sits between [`quicsdn_wire`] (message
//! boundaries) and the agent's I/O:
//!
//! ```text
//!  local socket ──bytes──▶ Outbound ──(lane, whole messages)──▶ QUIC streams
//!  QUIC streams ──(lane, chunks)──▶ Inbound ──whole messages, in release order──▶ local socket
//! ```
//!
//! Contracts:
//! * Messages are never split across lanes, altered, dropped or duplicated.
//! * [`StreamMode::Ordered`] uses one lane per session: the peer receives exactly the
//!   bytes the local peer sent, in order (the quicSDN paper's "2s" configuration:
//!   one stream per service and connection).
//! * [`StreamMode::RoundRobin`] gives consecutive messages to lanes in turn and the
//!   receiver releases whole messages in the order they complete (the paper's
//!   "16s"). Each lane keeps its own order, but messages on different lanes may be
//!   released in a different order than they were sent. OpenFlow 1.3.5 §6.2 lets a
//!   *switch* reorder only "in the absence of barrier messages", and says "messages
//!   must not be reordered across a barrier message"; a transport that reorders
//!   moves barriers too, and Open vSwitch and controllers rely on the in-order
//!   delivery TCP gives them. So this mode exists to reproduce the paper, not for
//!   production.
//! * A service without message boundaries ([`Framing::Raw`]) always uses one lane.

use bytes::{Bytes, BytesMut};
use quicsdn_wire::{FrameError, Framer, Framing};
use std::fmt;
use std::str::FromStr;

/// How much free buffer space a read from the local socket gets.
pub const READ_CHUNK: usize = 64 * 1024;

/// How a session's messages are spread over streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamMode {
    /// One stream per session, both directions, in order.
    #[default]
    Ordered,
    /// Consecutive messages go round robin over `lanes` streams; released in arrival
    /// order. Not order-preserving.
    RoundRobin { lanes: u16 },
}

impl StreamMode {
    /// Lanes a session of this framing uses under this mode.
    pub fn lanes_for(self, framing: Framing) -> usize {
        match self {
            StreamMode::RoundRobin { lanes } if framing.has_boundaries() => usize::from(lanes),
            _ => 1,
        }
    }
}

impl fmt::Display for StreamMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamMode::Ordered => f.write_str("ordered"),
            StreamMode::RoundRobin { lanes } => write!(f, "rr:{lanes}"),
        }
    }
}

/// Why a stream mode string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid stream mode {0:?}: expected \"ordered\" or \"rr:N\" with N from 1 to 256")]
pub struct BadStreamMode(String);

impl FromStr for StreamMode {
    type Err = BadStreamMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "ordered" {
            return Ok(StreamMode::Ordered);
        }
        let lanes = s
            .strip_prefix("rr:")
            .and_then(|n| n.parse::<u16>().ok())
            .filter(|n| (1..=256).contains(n))
            .ok_or_else(|| BadStreamMode(s.to_string()))?;
        Ok(StreamMode::RoundRobin { lanes })
    }
}

/// A run of whole messages bound for one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub lane: usize,
    pub bytes: Bytes,
    pub messages: usize,
}

/// The local-to-QUIC direction of a session: frames what the local peer sends and
/// assigns whole messages to lanes.
#[derive(Debug)]
pub struct Outbound {
    framer: Framer,
    buf: BytesMut,
    lanes: usize,
    next_lane: usize,
    /// A framing error found after whole messages that are still to be sent; it is
    /// reported once those have left.
    failed: Option<FrameError>,
}

impl Outbound {
    /// `lanes` must be at least 1; raw framing forces it to 1.
    pub fn new(framing: Framing, max_message: usize, lanes: usize) -> Outbound {
        assert!(lanes >= 1, "a session needs a lane");
        let lanes = if framing.has_boundaries() { lanes } else { 1 };
        Outbound {
            framer: Framer::new(framing, max_message),
            buf: BytesMut::with_capacity(READ_CHUNK),
            lanes,
            next_lane: 0,
            failed: None,
        }
    }

    /// The buffer to read local bytes into, with at least [`READ_CHUNK`] bytes free.
    /// Only appending to it is allowed.
    pub fn read_buf(&mut self) -> &mut BytesMut {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK {
            self.buf.reserve(READ_CHUNK);
        }
        &mut self.buf
    }

    /// The next batch to send, `None` when no whole message is buffered. With one
    /// lane, all buffered whole messages leave as one batch (one stream write).
    ///
    /// A malformed message is reported only after every whole message before it
    /// has been returned, so the peer receives exactly what a TCP connection would
    /// have delivered up to the fault.
    pub fn next_batch(&mut self) -> Result<Option<Batch>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let mut len = 0;
        let mut messages = 0;
        loop {
            match self.framer.next_message(&self.buf[len..]) {
                Ok(Some(n)) => {
                    len += n;
                    messages += 1;
                    if self.lanes > 1 {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) if messages == 0 => return Err(e),
                Err(e) => {
                    self.failed = Some(e);
                    break;
                }
            }
        }
        if messages == 0 {
            return Ok(None);
        }
        let lane = self.next_lane;
        self.next_lane = (self.next_lane + 1) % self.lanes;
        Ok(Some(Batch {
            lane,
            bytes: self.buf.split_to(len).freeze(),
            messages,
        }))
    }

    /// Bytes buffered that do not yet form a whole message. At end of stream, a
    /// non-zero value means the local peer closed mid-message.
    pub fn partial_len(&self) -> usize {
        if self.failed.is_some() {
            return self.buf.len();
        }
        if self.framer.is_partial(&self.buf) {
            self.buf.len()
        } else {
            0
        }
    }
}

/// A lane's data ended in the middle of a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lane {lane} ended in the middle of a message ({bytes} bytes of it received)")]
pub struct TruncatedLane {
    pub lane: usize,
    pub bytes: usize,
}

#[derive(Debug)]
struct InboundLane {
    framer: Framer,
    buf: BytesMut,
    finished: bool,
}

/// The QUIC-to-local direction of a session: reassembles each lane's messages and
/// releases whole messages in the order they complete.
#[derive(Debug)]
pub struct Inbound {
    lanes: Vec<InboundLane>,
}

impl Inbound {
    pub fn new(framing: Framing, max_message: usize, lanes: usize) -> Inbound {
        assert!(lanes >= 1, "a session needs a lane");
        Inbound {
            lanes: (0..lanes)
                .map(|_| InboundLane {
                    framer: Framer::new(framing, max_message),
                    buf: BytesMut::new(),
                    finished: false,
                })
                .collect(),
        }
    }

    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Takes a chunk that arrived on `lane` and returns the whole messages it
    /// completed, contiguous, ready for the local peer. A chunk holding only whole
    /// messages is passed on without copying.
    pub fn push(&mut self, lane: usize, chunk: Bytes) -> Result<Option<Bytes>, FrameError> {
        let l = &mut self.lanes[lane];
        if l.buf.is_empty() {
            let mut len = 0;
            while let Some(n) = l.framer.next_message(&chunk[len..])? {
                len += n;
            }
            l.buf.extend_from_slice(&chunk[len..]);
            return Ok((len > 0).then(|| chunk.slice(..len)));
        }
        l.buf.extend_from_slice(&chunk);
        let mut len = 0;
        while let Some(n) = l.framer.next_message(&l.buf[len..])? {
            len += n;
        }
        Ok((len > 0).then(|| l.buf.split_to(len).freeze()))
    }

    /// Marks `lane` as ended by its sender; true once every lane has ended.
    pub fn finish(&mut self, lane: usize) -> Result<bool, TruncatedLane> {
        let l = &mut self.lanes[lane];
        if l.framer.is_partial(&l.buf) {
            return Err(TruncatedLane {
                lane,
                bytes: l.buf.len(),
            });
        }
        l.finished = true;
        Ok(self.lanes.iter().all(|l| l.finished))
    }
}

#[cfg(test)]
mod tests;
