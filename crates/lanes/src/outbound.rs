//! The sending side of one direction of a session.

use crate::marker;
use crate::rules::{self, Direction, JsonRpc, Placement};
use crate::{FIRST_KEYED_LANE, MAIN_LANE, MIN_READ_CHUNK, PRIORITY_LANE, READ_CHUNK, StreamMode};
use bytes::{Bytes, BytesMut};
use quicsdn_wire::openflow::{Header, Kind};
use quicsdn_wire::{FrameError, Framer, Framing};
use std::collections::VecDeque;

/// A run of whole messages bound for one lane, with any marker in front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub lane: usize,
    pub bytes: Bytes,
    pub messages: usize,
}

/// How a classified message leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Emit {
    /// No ordering work: the lane's own order is enough.
    Plain,
    /// A keyed lane: may need an `AFTER` marker for the last fence.
    Keyed,
    /// A fence on the main lane.
    Fence,
}

/// A message framed and classified, not yet sent.
#[derive(Debug, Clone, Copy)]
struct Peeked {
    len: usize,
    lane: usize,
    emit: Emit,
}

/// Fence bookkeeping of `safe` mode (see [`crate::marker`]).
#[derive(Debug, Default)]
struct Fences {
    /// Bytes written to each lane, markers included.
    written: Vec<u64>,
    /// Keyed lanes written since the last fence.
    dirty: Vec<bool>,
    /// Fences sent so far, and the last fence each lane was marked after.
    epoch: u64,
    lane_epoch: Vec<u64>,
    /// Main-lane offset just past the last fence.
    fence_end: u64,
}

/// Ids of OVSDB `echo` requests the peer sent, whose replies take the priority
/// lane. Bounded: a peer that never gets answers cannot grow it.
const ECHO_IDS_MAX: usize = 64;

/// The local-to-QUIC direction of a session: frames what the local peer sends and
/// assigns whole messages to lanes.
#[derive(Debug)]
pub struct Outbound {
    framer: Framer,
    framing: Framing,
    mode: StreamMode,
    direction: Direction,
    relaxed: bool,
    buf: BytesMut,
    /// Free space the next read gets: between [`MIN_READ_CHUNK`] and
    /// [`READ_CHUNK`], following how much the reads bring ([`Outbound::read_done`]).
    chunk: usize,
    lanes: usize,
    next_rr: usize,
    handshake_done: bool,
    echo_ids: VecDeque<String>,
    fences: Fences,
    peeked: Option<Peeked>,
    /// A framing error found after whole messages that are still to be sent; it is
    /// reported once those have left.
    failed: Option<FrameError>,
}

impl Outbound {
    /// `direction` is the way this side's messages travel; `relaxed` enables
    /// `--relaxed-flow-mods` (only meaningful towards the switch).
    pub fn new(
        framing: Framing,
        max_message: usize,
        mode: StreamMode,
        direction: Direction,
        relaxed: bool,
    ) -> Outbound {
        let lanes = mode.lanes_for(framing);
        Outbound {
            framer: Framer::new(framing, max_message),
            framing,
            mode,
            direction,
            relaxed,
            // Most sessions are idle most of the time; a busy one reaches
            // READ_CHUNK after a few full reads.
            buf: BytesMut::new(),
            chunk: MIN_READ_CHUNK,
            lanes,
            next_rr: 0,
            handshake_done: false,
            echo_ids: VecDeque::new(),
            fences: Fences {
                written: vec![0; lanes],
                dirty: vec![false; lanes],
                lane_epoch: vec![0; lanes],
                ..Fences::default()
            },
            peeked: None,
            failed: None,
        }
    }

    /// Lanes this direction may use (0 is the session's bidirectional stream).
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Gives the read buffer back if it holds nothing: called before waiting
    /// for the local peer, so an idle session keeps no buffer (1 KiB or more
    /// each, per session and direction); [`Outbound::read_buf`] makes a new one.
    pub fn release_idle_buf(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
    }

    /// The buffer to read local bytes into, with at least the current read
    /// size free ([`MIN_READ_CHUNK`] to [`READ_CHUNK`]). Only appending to it
    /// is allowed; say how much a read brought with [`Outbound::read_done`].
    pub fn read_buf(&mut self) -> &mut BytesMut {
        if self.buf.is_empty() && self.buf.capacity() > 2 * self.chunk {
            // A burst is over: give its buffer back rather than keep it for
            // the life of the session (the messages cut from it keep their
            // part until sent).
            self.buf = BytesMut::new();
        }
        if self.buf.capacity() - self.buf.len() < self.chunk {
            self.buf.reserve(self.chunk);
        }
        &mut self.buf
    }

    /// A read into [`Outbound::read_buf`] brought `n` bytes: a full read
    /// doubles the next one's space, a read of a quarter or less halves it.
    pub fn read_done(&mut self, n: usize) {
        if n >= self.chunk {
            self.chunk = (self.chunk * 2).min(READ_CHUNK);
        } else if n <= self.chunk / 4 {
            self.chunk = (self.chunk / 2).max(MIN_READ_CHUNK);
        }
    }

    /// The OpenFlow handshake completed (the switch's FEATURES_REPLY went the other
    /// way): from now on this direction may use more than the main lane. Acts as a
    /// fence, so nothing sent later overtakes what was sent before.
    pub fn handshake_complete(&mut self) {
        if !self.handshake_done {
            self.handshake_done = true;
            self.mark_fence();
        }
    }

    /// The peer sent an OVSDB `echo` request with this id: its reply, when the
    /// local peer sends it, takes the priority lane.
    pub fn echo_request_received(&mut self, id: String) {
        if self.echo_ids.len() == ECHO_IDS_MAX {
            self.echo_ids.pop_front();
        }
        self.echo_ids.push_back(id);
    }

    /// The next batch to send, `None` when no whole message is buffered.
    ///
    /// A malformed message is reported only after every whole message before it
    /// has been returned, so the peer receives exactly what a TCP connection would
    /// have delivered up to the fault.
    pub fn next_batch(&mut self) -> Result<Option<Batch>, FrameError> {
        let first = match self.peeked.take() {
            Some(p) => p,
            None => match self.peek(0)? {
                Some(p) => p,
                None => return self.failed.clone().map_or(Ok(None), Err),
            },
        };
        let prefix = self.emission_prefix(first);
        let mut len = first.len;
        let mut messages = 1;
        let extendable = |p: &Peeked| p.lane == first.lane && p.emit != Emit::Fence;
        if first.emit != Emit::Fence && !matches!(self.mode, StreamMode::RoundRobin { .. }) {
            while let Some(p) = self.peek(len)? {
                if !extendable(&p) || self.needs_after_marker(p) {
                    self.peeked = Some(p);
                    break;
                }
                self.note_written_keyed(p);
                len += p.len;
                messages += 1;
            }
        }
        let body = self.buf.split_to(len);
        let bytes = match prefix {
            Some(m) => {
                let mut b = BytesMut::with_capacity(m.len() + body.len());
                b.extend_from_slice(&m);
                b.extend_from_slice(&body);
                b.freeze()
            }
            None => body.freeze(),
        };
        let f = &mut self.fences;
        f.written[first.lane] += bytes.len() as u64;
        if first.emit == Emit::Fence {
            self.mark_fence();
        }
        Ok(Some(Batch {
            lane: first.lane,
            bytes,
            messages,
        }))
    }

    /// Bytes buffered that do not yet form a whole message. At end of stream, a
    /// non-zero value means the local peer closed mid-message.
    pub fn partial_len(&self) -> usize {
        if self.failed.is_some() || self.peeked.is_some() {
            return self.buf.len();
        }
        if self.framer.is_partial(&self.buf) {
            self.buf.len()
        } else {
            0
        }
    }

    /// Frames and classifies the message at `offset` of the buffer. Errors are
    /// kept for later if whole messages precede them.
    fn peek(&mut self, offset: usize) -> Result<Option<Peeked>, FrameError> {
        if self.failed.is_some() {
            return Ok(None);
        }
        let len = match self.framer.next_message(&self.buf[offset..]) {
            Ok(Some(len)) => len,
            Ok(None) => return Ok(None),
            Err(e) if offset == 0 => return Err(e),
            Err(e) => {
                self.failed = Some(e);
                return Ok(None);
            }
        };
        // classify() needs `&mut self`: lend it the buffer (a move, not a copy).
        let buf = std::mem::take(&mut self.buf);
        let classified = self.classify(&buf[offset..offset + len]);
        self.buf = buf;
        match classified {
            Ok(p) => Ok(Some(Peeked { len, ..p })),
            Err(e) if offset == 0 => Err(e),
            Err(e) => {
                self.failed = Some(e);
                Ok(None)
            }
        }
    }

    fn classify(&mut self, msg: &[u8]) -> Result<Peeked, FrameError> {
        let plain = |lane| Peeked {
            len: 0,
            lane,
            emit: Emit::Plain,
        };
        let keyed = self.lanes.saturating_sub(FIRST_KEYED_LANE) as u64;
        match (self.mode, self.framing) {
            (StreamMode::Ordered, _) | (_, Framing::Raw) => Ok(plain(MAIN_LANE)),
            (StreamMode::RoundRobin { .. }, _) => {
                let lane = self.next_rr;
                self.next_rr = (lane + 1) % self.lanes;
                Ok(plain(lane))
            }
            (StreamMode::Safe { .. }, Framing::JsonRpc) => {
                Ok(plain(match rules::classify_jsonrpc(msg) {
                    JsonRpc::EchoRequest(_) => PRIORITY_LANE,
                    JsonRpc::Reply(id) => match self.echo_ids.iter().position(|e| *e == id) {
                        Some(i) => {
                            self.echo_ids.remove(i);
                            PRIORITY_LANE
                        }
                        None => MAIN_LANE,
                    },
                    JsonRpc::Other => MAIN_LANE,
                }))
            }
            (StreamMode::Safe { .. }, Framing::OpenFlow) => {
                let header = Header::parse(msg).expect("framed OpenFlow message");
                if header.version == marker::MARKER_VERSION {
                    return Err(FrameError::OpenFlowVersionZero {
                        msg_type: header.msg_type,
                        xid: header.xid,
                    });
                }
                if !self.handshake_done {
                    // One stream until the switch's FEATURES_REPLY, which is itself a
                    // fence: nothing after it may overtake it.
                    if self.direction == Direction::ToController
                        && header.kind() == Kind::FeaturesReply
                    {
                        self.handshake_done = true;
                        return Ok(Peeked {
                            len: 0,
                            lane: MAIN_LANE,
                            emit: Emit::Fence,
                        });
                    }
                    return Ok(plain(MAIN_LANE));
                }
                Ok(
                    match rules::place_openflow(self.direction, msg, self.relaxed) {
                        Placement::Main => plain(MAIN_LANE),
                        Placement::Priority => plain(PRIORITY_LANE),
                        Placement::Fence => Peeked {
                            len: 0,
                            lane: MAIN_LANE,
                            emit: Emit::Fence,
                        },
                        Placement::Keyed(k) => Peeked {
                            len: 0,
                            lane: FIRST_KEYED_LANE + (k % keyed) as usize,
                            emit: Emit::Keyed,
                        },
                    },
                )
            }
        }
    }

    fn needs_after_marker(&self, p: Peeked) -> bool {
        p.emit == Emit::Keyed && self.fences.lane_epoch[p.lane] < self.fences.epoch
    }

    /// The marker that must precede `p`, updating the bookkeeping of its lane.
    fn emission_prefix(&mut self, p: Peeked) -> Option<Vec<u8>> {
        let f = &mut self.fences;
        match p.emit {
            Emit::Plain => None,
            Emit::Keyed => {
                let marker = (f.lane_epoch[p.lane] < f.epoch)
                    .then(|| marker::encode(&[(MAIN_LANE, f.fence_end)]));
                self.note_written_keyed(p);
                marker
            }
            Emit::Fence => {
                let waits: Vec<(usize, u64)> = (FIRST_KEYED_LANE..self.lanes)
                    .filter(|&l| f.dirty[l])
                    .map(|l| (l, f.written[l]))
                    .collect();
                (!waits.is_empty()).then(|| marker::encode(&waits))
            }
        }
    }

    fn note_written_keyed(&mut self, p: Peeked) {
        if p.emit == Emit::Keyed {
            let f = &mut self.fences;
            f.lane_epoch[p.lane] = f.epoch;
            f.dirty[p.lane] = true;
        }
    }

    /// Everything written so far on the keyed lanes is ordered before anything sent
    /// next on them.
    fn mark_fence(&mut self) {
        let f = &mut self.fences;
        f.epoch += 1;
        f.fence_end = f.written[MAIN_LANE];
        f.dirty.iter_mut().for_each(|d| *d = false);
    }
}
