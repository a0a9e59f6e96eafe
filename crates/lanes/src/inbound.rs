//! The receiving side of one direction of a session.

use crate::StreamMode;
use crate::marker;
use crate::rules::{self, Direction, JsonRpc};
use bytes::{Bytes, BytesMut};
use quicsdn_wire::openflow::{Header, Kind};
use quicsdn_wire::{FrameError, Framer, Framing};

/// A lane's data ended in the middle of a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lane {lane} ended in the middle of a message ({bytes} bytes of it received)")]
pub struct TruncatedLane {
    pub lane: usize,
    pub bytes: usize,
}

/// Why the peer's bytes cannot be delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboundError {
    #[error("lane {lane}: {error}")]
    Frame { lane: usize, error: FrameError },
    #[error("lane {0} is outside the session's lanes")]
    BadLane(usize),
    #[error("lane {0}: malformed stream marker")]
    BadMarker(usize),
}

/// Things the receiving side learns that the sending side of the same session
/// needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboundEvent {
    /// The switch's FEATURES_REPLY was delivered: the handshake is complete.
    HandshakeComplete,
    /// An OVSDB `echo` request with this id was delivered.
    EchoRequest(String),
    /// PACKET_INs were delivered (once per delivered run): the controller's
    /// answer should not wait ([`crate::coalesce`]).
    PacketIn,
}

#[derive(Debug)]
struct Lane {
    framer: Framer,
    buf: BytesMut,
    /// Bytes of this lane released or consumed, markers included.
    consumed: u64,
    /// The next message waits until every `(lane, offset)` here is consumed.
    wait: Vec<(usize, u64)>,
    finished: bool,
}

/// The QUIC-to-local direction of a session: reassembles each lane's messages and
/// releases them in an order the stream mode allows.
#[derive(Debug)]
pub struct Inbound {
    /// The lanes seen so far: lane `i` exists once data or its end arrived on
    /// it or on a later lane. One never seen is empty and unfinished, and
    /// costs nothing: most sessions use one or two of their lanes (issue 18).
    lanes: Vec<Lane>,
    /// Lanes the peer may use in this direction.
    lane_count: usize,
    framing: Framing,
    max_message: usize,
    /// `safe` mode with OpenFlow: lanes carry fence markers.
    markers: bool,
    /// Report the switch's FEATURES_REPLY (messages travel towards the controller).
    watch_handshake: bool,
    /// Report OVSDB echo requests (`safe` mode with JSON-RPC).
    watch_echo: bool,
    /// Report PACKET_INs (OpenFlow towards the controller, any mode).
    watch_packet_in: bool,
    events: Vec<InboundEvent>,
    /// The lane of each run the last [`Inbound::push`] returned.
    run_lanes: Vec<usize>,
}

impl Inbound {
    /// `direction` is the way the received messages travel.
    pub fn new(
        framing: Framing,
        max_message: usize,
        mode: StreamMode,
        direction: Direction,
    ) -> Inbound {
        let safe = matches!(mode, StreamMode::Safe { .. });
        Inbound {
            lanes: Vec::new(),
            lane_count: mode.lanes_for(framing),
            framing,
            max_message,
            markers: safe && framing == Framing::OpenFlow,
            watch_handshake: safe
                && framing == Framing::OpenFlow
                && direction == Direction::ToController,
            watch_echo: safe && framing == Framing::JsonRpc,
            watch_packet_in: framing == Framing::OpenFlow && direction == Direction::ToController,
            events: Vec::new(),
            run_lanes: Vec::new(),
        }
    }

    /// Lanes the peer may use in this direction.
    pub fn lanes(&self) -> usize {
        self.lane_count
    }

    /// Lane `i`, made on first use; `None` outside the session's lanes.
    fn lane_mut(&mut self, i: usize) -> Option<&mut Lane> {
        if i >= self.lane_count {
            return None;
        }
        while self.lanes.len() <= i {
            self.lanes.push(Lane {
                framer: Framer::new(self.framing, self.max_message),
                buf: BytesMut::new(),
                consumed: 0,
                wait: Vec::new(),
                finished: false,
            });
        }
        Some(&mut self.lanes[i])
    }

    /// True while `lane`'s next message waits for other lanes: reading more of it
    /// would only buffer, so its reader should pause (its stream's flow control
    /// then holds the sender back).
    pub fn is_blocked(&self, lane: usize) -> bool {
        self.lanes.get(lane).is_some_and(|l| !l.wait.is_empty())
    }

    /// The lane each run returned by the last [`Inbound::push`] rode, in
    /// order (for `quicsdn snoop`).
    pub fn run_lanes(&self) -> &[usize] {
        &self.run_lanes
    }

    /// What the sending side of this session should learn (drained).
    pub fn take_events(&mut self) -> Vec<InboundEvent> {
        std::mem::take(&mut self.events)
    }

    /// Takes a chunk that arrived on `lane` and returns the runs of whole messages
    /// now deliverable, in order. Without markers, a chunk holding only whole
    /// messages is passed on without copying.
    pub fn push(&mut self, lane: usize, chunk: Bytes) -> Result<Vec<Bytes>, InboundError> {
        self.run_lanes.clear();
        let markers = self.markers;
        let l = self.lane_mut(lane).ok_or(InboundError::BadLane(lane))?;
        let mut out = Vec::new();
        if !markers && l.buf.is_empty() {
            let mut len = 0;
            while let Some(m) = l
                .framer
                .next_message(&chunk[len..])
                .map_err(|error| InboundError::Frame { lane, error })?
            {
                len += m;
            }
            l.buf.extend_from_slice(&chunk[len..]);
            l.consumed += len as u64;
            if len > 0 {
                let run = chunk.slice(..len);
                self.note(&run);
                out.push(run);
                self.run_lanes.push(lane);
            }
            return Ok(out);
        }
        l.buf.extend_from_slice(&chunk);
        // Releasing one lane can unblock others: repeat until nothing moves.
        loop {
            let mut progress = false;
            for i in 0..self.lanes.len() {
                progress |= self.drain_lane(i, &mut out)?;
            }
            if !progress {
                return Ok(out);
            }
        }
    }

    /// Releases what lane `i` can release now; true if anything happened.
    fn drain_lane(&mut self, i: usize, out: &mut Vec<Bytes>) -> Result<bool, InboundError> {
        let mut progress = false;
        loop {
            if !self.lanes[i].wait.is_empty() {
                let lanes = &self.lanes;
                // A lane not seen yet has consumed nothing.
                if !lanes[i]
                    .wait
                    .iter()
                    .all(|&(j, off)| lanes.get(j).map_or(0, |l| l.consumed) >= off)
                {
                    return Ok(progress);
                }
                self.lanes[i].wait.clear();
                progress = true;
            }
            let markers = self.markers;
            let n = self.lane_count;
            let l = &mut self.lanes[i];
            let frame = |l: &mut Lane, at: usize| {
                l.framer
                    .next_message(&l.buf[at..])
                    .map_err(|error| InboundError::Frame { lane: i, error })
            };
            let Some(first) = frame(l, 0)? else {
                return Ok(progress);
            };
            if markers && marker::is_marker(&l.buf[..first]) {
                let m = marker::decode(&l.buf[..first]).ok_or(InboundError::BadMarker(i))?;
                if m.waits.iter().any(|&(j, _)| j >= n) {
                    return Err(InboundError::BadMarker(i));
                }
                let _ = l.buf.split_to(first);
                l.consumed += first as u64;
                l.wait = m.waits;
                progress = true;
                continue;
            }
            // A run of messages up to the next marker.
            let mut len = first;
            while let Some(m) = frame(l, len)? {
                if markers && marker::is_marker(&l.buf[len..len + m]) {
                    break;
                }
                len += m;
            }
            let run = l.buf.split_to(len).freeze();
            l.consumed += len as u64;
            self.note(&run);
            out.push(run);
            self.run_lanes.push(i);
            progress = true;
        }
    }

    /// Looks at released messages for the events the sending side needs.
    fn note(&mut self, run: &Bytes) {
        if !self.watch_handshake && !self.watch_echo && !self.watch_packet_in {
            return;
        }
        let mut framer = Framer::new(self.framing, usize::MAX);
        let mut at = 0;
        let mut packet_in = false;
        while let Ok(Some(n)) = framer.next_message(&run[at..]) {
            let msg = &run[at..at + n];
            let kind = (self.framing == Framing::OpenFlow)
                .then(|| Header::parse(msg).map(|h| h.kind()))
                .flatten();
            if self.watch_handshake && kind == Some(Kind::FeaturesReply) {
                self.watch_handshake = false;
                self.events.push(InboundEvent::HandshakeComplete);
            }
            packet_in |= self.watch_packet_in && kind == Some(Kind::PacketIn);
            if self.watch_echo
                && let JsonRpc::EchoRequest(id) = rules::classify_jsonrpc(msg)
            {
                self.events.push(InboundEvent::EchoRequest(id));
            }
            at += n;
        }
        if packet_in {
            self.events.push(InboundEvent::PacketIn);
        }
    }

    /// Marks `lane` as ended by its sender; true once every lane has ended and
    /// everything received has been released.
    pub fn finish(&mut self, lane: usize) -> Result<bool, TruncatedLane> {
        let framing = self.framing;
        if let Some(l) = self.lane_mut(lane) {
            let partial = partial_tail(&l.buf, framing);
            if partial > 0 {
                return Err(TruncatedLane {
                    lane,
                    bytes: partial,
                });
            }
            l.finished = true;
        }
        Ok(self.is_done())
    }

    /// True when every lane has ended and nothing is left to release.
    pub fn is_done(&self) -> bool {
        self.lanes.len() == self.lane_count
            && self.lanes.iter().all(|l| l.finished && l.buf.is_empty())
    }
}

/// Bytes at the end of `buf` that do not form a whole message.
fn partial_tail(buf: &[u8], framing: Framing) -> usize {
    let mut framer = Framer::new(framing, usize::MAX);
    let mut at = 0;
    while let Ok(Some(n)) = framer.next_message(&buf[at..]) {
        at += n;
    }
    if framer.is_partial(&buf[at..]) {
        buf.len() - at
    } else {
        0
    }
}
