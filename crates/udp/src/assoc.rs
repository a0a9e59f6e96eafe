//! One association between a switch agent (the client) and a controller agent
//! (the server) over UDP: the hello exchange, channels, keep-alive and
//! liveness. Sans-IO: the caller feeds datagrams and time, and sends what
//! [`Association::poll_transmit`] returns.
//!
//! * The client sends HELLO (its profile and opaque hello bytes, in which the
//!   agents put the switch's name and services) every
//!   [`crate::Config::hello_interval`] until a HELLO_ACK arrives. Nothing
//!   authenticates either: whoever can send datagrams to the server can claim
//!   any switch name.
//! * The server is created from a HELLO and answers every HELLO with a
//!   HELLO_ACK (the first may be lost). Different profiles on the two ends
//!   close the association with a CLOSE saying so.
//! * Channel 0 carries the agents' control messages and always uses the robust
//!   mechanism; the other channels use the configured profile.
//! * A PING goes out after [`crate::Config::keepalive`] without sending; after
//!   a keepalive interval without hearing anything, a PING asking for an
//!   answer goes out every quarter interval, so a lossy path is told apart from
//!   a dead one. The association dies after [`crate::Config::idle_timeout`]
//!   without hearing anything valid from the peer.

use crate::channel::{ChannelStats, Chunk, MessageKind, Receiver, Sender};
use crate::packet::{self, Packet, PacketError};
use crate::{Config, Profile};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

/// The control channel.
pub const CONTROL: u16 = 0;

/// CLOSE codes.
pub mod code {
    /// The agent is shutting down.
    pub const SHUTDOWN: u16 = 1;
    /// A robust channel gave a packet up: delivery can no longer be promised.
    pub const GAVE_UP: u16 = 2;
    pub const PROTOCOL_VIOLATION: u16 = 3;
    pub const PROFILE_MISMATCH: u16 = 4;
    /// A newer association from the same switch replaced this one.
    pub const SUPERSEDED: u16 = 5;
    /// The server has no association with this id (it restarted).
    pub const UNKNOWN_ASSOCIATION: u16 = 6;
    /// The agents' hello exchange failed.
    pub const REFUSED: u16 = 7;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// Why an association ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// Nothing heard from the peer for the idle timeout.
    IdleTimeout,
    /// The client heard no HELLO_ACK within the idle timeout.
    HandshakeTimeout,
    PeerClosed {
        code: u16,
        reason: String,
    },
    /// This side closed it ([`Association::close`] or a failure here).
    Local {
        code: u16,
        reason: String,
    },
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::IdleTimeout => {
                f.write_str("nothing heard from the peer within the idle timeout")
            }
            CloseReason::HandshakeTimeout => {
                f.write_str("no answer to the hello within the idle timeout")
            }
            CloseReason::PeerClosed { code, reason } => {
                write!(f, "closed by the peer (code {code}): {reason}")
            }
            CloseReason::Local { code, reason } => write!(f, "closed here (code {code}): {reason}"),
        }
    }
}

/// What the application learns from an association.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The hello exchange completed; the peer's hello bytes.
    Connected { hello: Vec<u8> },
    /// Nothing more will be sent or received.
    Closed(CloseReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Handshaking,
    Established,
    Closed,
}

struct Channel {
    tx: Sender,
    rx: Receiver,
}

/// Why [`Association::send`] refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("the association is closed")]
    Closed,
    #[error("channel {0} has ended")]
    ChannelEnded(u16),
    #[error("{0}")]
    TooLarge(String),
}

/// The most channels one association keeps at a time.
pub const MAX_CHANNELS: usize = 4096;

pub struct Association {
    role: Role,
    id: u32,
    config: Config,
    state: State,
    own_hello: Vec<u8>,
    channels: BTreeMap<u16, Channel>,
    /// Channels ended by the application: their late packets are ignored.
    ended: BTreeSet<u16>,
    /// Next channel to offer a DATA slot (round robin).
    next_channel: u16,
    hello_due: Option<Instant>,
    hello_ack_due: bool,
    /// The server told the application about the client's hello.
    announced: bool,
    /// The peer asked for a PING back.
    pong_due: bool,
    last_probe: Option<Instant>,
    started: Instant,
    last_heard: Instant,
    last_sent: Instant,
    events: VecDeque<Event>,
    close_datagram: Option<Vec<u8>>,
    /// Datagrams from the peer that could not be decoded or broke the protocol.
    pub malformed: u64,
}

impl Association {
    /// A switch agent's association; `hello` goes in its HELLO.
    pub fn client(id: u32, config: Config, hello: Vec<u8>, now: Instant) -> Association {
        let mut a = Association::new(Role::Client, id, config, hello, now);
        a.hello_due = Some(now);
        a
    }

    /// A controller agent's association for a HELLO datagram that carried `id`;
    /// feed that datagram to [`Association::handle_datagram`] next. `hello` goes
    /// in the HELLO_ACK.
    pub fn server(id: u32, config: Config, hello: Vec<u8>, now: Instant) -> Association {
        let mut a = Association::new(Role::Server, id, config, hello, now);
        a.state = State::Established;
        a
    }

    fn new(role: Role, id: u32, config: Config, own_hello: Vec<u8>, now: Instant) -> Association {
        Association {
            role,
            id,
            config,
            state: State::Handshaking,
            own_hello,
            channels: BTreeMap::new(),
            ended: BTreeSet::new(),
            next_channel: 0,
            hello_due: None,
            hello_ack_due: false,
            announced: false,
            pong_due: false,
            last_probe: None,
            started: now,
            last_heard: now,
            last_sent: now,
            events: VecDeque::new(),
            close_datagram: None,
            malformed: 0,
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn profile(&self) -> Profile {
        self.config.profile
    }

    pub fn is_established(&self) -> bool {
        self.state == State::Established
    }

    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    fn channel(&mut self, ch: u16) -> Option<&mut Channel> {
        if self.ended.contains(&ch) {
            return None;
        }
        if !self.channels.contains_key(&ch) {
            if self.channels.len() >= MAX_CHANNELS {
                return None;
            }
            let profile = if ch == CONTROL {
                Profile::Robust
            } else {
                self.config.profile
            };
            self.channels.insert(
                ch,
                Channel {
                    // The control channel's receiver parses each chunk as one
                    // JSON message: its messages never share a packet.
                    tx: Sender::new(profile, &self.config, ch != CONTROL),
                    rx: Receiver::new(profile, &self.config),
                },
            );
        }
        self.channels.get_mut(&ch)
    }

    /// Queues a message on a channel.
    pub fn send(&mut self, ch: u16, kind: MessageKind, payload: Vec<u8>) -> Result<(), SendError> {
        if self.state == State::Closed {
            return Err(SendError::Closed);
        }
        let c = self.channel(ch).ok_or(SendError::ChannelEnded(ch))?;
        c.tx.push(kind, payload).map_err(SendError::TooLarge)
    }

    /// Messages sent on `ch` and not yet acknowledged (or given up).
    pub fn outstanding(&self, ch: u16) -> usize {
        self.channels
            .get(&ch)
            .map_or(0, |c| c.tx.outstanding_messages())
    }

    /// Messages of `ch` acknowledged (or given up, seed) since the last call.
    pub fn take_released(&mut self, ch: u16) -> u64 {
        self.channels
            .get_mut(&ch)
            .map_or(0, |c| c.tx.take_released())
    }

    /// The next chunk the peer sent on `ch`.
    pub fn recv(&mut self, ch: u16) -> Option<Chunk> {
        self.channels.get_mut(&ch).and_then(|c| c.rx.take())
    }

    /// Channels with chunks waiting.
    pub fn readable(&self) -> Vec<u16> {
        self.channels
            .iter()
            .filter(|(_, c)| c.rx.has_ready())
            .map(|(ch, _)| *ch)
            .collect()
    }

    /// Forgets a channel whose session ended; its late packets are ignored.
    pub fn end_channel(&mut self, ch: u16) {
        if ch != CONTROL {
            self.channels.remove(&ch);
            self.ended.insert(ch);
        }
    }

    pub fn stats(&self, ch: u16) -> Option<ChannelStats> {
        self.channels.get(&ch).map(|c| {
            let mut s = c.tx.stats();
            let r = &c.rx.stats;
            s.packets_received = r.packets_received;
            s.duplicates = r.duplicates;
            s.out_of_order = r.out_of_order;
            s.dropped_full = r.dropped_full;
            s
        })
    }

    /// Closes the association: one CLOSE datagram goes to the peer.
    pub fn close(&mut self, code: u16, reason: &str) {
        if self.state == State::Closed {
            return;
        }
        self.close_datagram = Some(packet::encode(
            self.id,
            &Packet::Close {
                code,
                reason: reason.to_string(),
            },
        ));
        self.finish(CloseReason::Local {
            code,
            reason: reason.to_string(),
        });
    }

    fn finish(&mut self, why: CloseReason) {
        self.state = State::Closed;
        self.events.push_back(Event::Closed(why));
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Takes a datagram from the peer. A malformed one is counted and reported,
    /// and changes nothing else.
    pub fn handle_datagram(&mut self, now: Instant, buf: &[u8]) -> Result<(), PacketError> {
        if self.state == State::Closed {
            return Ok(());
        }
        let (id, p) = packet::decode(buf).inspect_err(|_| self.malformed += 1)?;
        if id != self.id {
            // Not ours (a previous association's late datagram).
            return Ok(());
        }
        self.last_heard = now;
        match p {
            Packet::Hello { profile, .. } => {
                if self.role == Role::Server {
                    if profile != self.config.profile {
                        self.close(
                            code::PROFILE_MISMATCH,
                            &format!(
                                "the switch agent uses --udp-profile {profile}, this controller agent {}",
                                self.config.profile
                            ),
                        );
                        return Ok(());
                    }
                    if !self.announced {
                        // The first HELLO: tell the application who it is.
                        self.announced = true;
                        if let (_, Packet::Hello { hello, .. }) = packet::decode(buf)? {
                            self.events.push_back(Event::Connected {
                                hello: hello.to_vec(),
                            });
                        }
                    }
                    self.hello_ack_due = true;
                }
            }
            Packet::HelloAck { profile, hello } => {
                if self.role == Role::Client && self.state == State::Handshaking {
                    if profile != self.config.profile {
                        self.close(
                            code::PROFILE_MISMATCH,
                            &format!(
                                "the controller agent uses --udp-profile {profile}, this switch agent {}",
                                self.config.profile
                            ),
                        );
                        return Ok(());
                    }
                    self.state = State::Established;
                    self.hello_due = None;
                    self.events.push_back(Event::Connected {
                        hello: hello.to_vec(),
                    });
                }
            }
            Packet::Data {
                channel,
                seq,
                first,
                last,
                kind,
                payload,
            } => {
                // Senders number packets from 1 and stop below u32::MAX
                // (Sender::push), so that an ACK range [seq, seq + 1) always
                // fits in u32: neither number is ever sent. A datagram carrying
                // one is ignored (it made the seed receiver's ACK overflow;
                // found by fuzzing, fuzz/regressions/udp_association).
                if self.state != State::Established || seq == 0 || seq == u32::MAX {
                    return Ok(());
                }
                if let Some(c) = self.channel(channel) {
                    c.rx.on_data(now, seq, first, last, kind, payload);
                    if let Some(v) = c.rx.violation.clone() {
                        self.malformed += 1;
                        self.close(code::PROTOCOL_VIOLATION, &format!("channel {channel}: {v}"));
                    }
                }
            }
            Packet::Ack {
                channel,
                cumulative,
                window,
                ranges,
            } => {
                if let Some(c) = self.channels.get_mut(&channel) {
                    c.tx.on_ack(now, cumulative, window, &ranges);
                }
            }
            Packet::Ping { reply } => self.pong_due |= reply,
            Packet::Close { code, reason } => {
                self.finish(CloseReason::PeerClosed { code, reason });
            }
        }
        Ok(())
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        let d = self.next_datagram(now);
        if d.is_some() {
            self.last_sent = now;
        }
        d
    }

    fn next_datagram(&mut self, now: Instant) -> Option<Vec<u8>> {
        if let Some(d) = self.close_datagram.take() {
            return Some(d);
        }
        if self.state == State::Closed {
            return None;
        }
        if self.hello_due.is_some_and(|t| t <= now) {
            self.hello_due = Some(now + self.config.hello_interval);
            return Some(packet::encode(
                self.id,
                &Packet::Hello {
                    profile: self.config.profile,
                    hello: &self.own_hello,
                },
            ));
        }
        if self.hello_ack_due {
            self.hello_ack_due = false;
            return Some(packet::encode(
                self.id,
                &Packet::HelloAck {
                    profile: self.config.profile,
                    hello: &self.own_hello,
                },
            ));
        }
        if self.state != State::Established {
            return None;
        }
        for (&ch, c) in self.channels.iter_mut() {
            if let Some(d) = c.rx.poll_ack(self.id, ch) {
                return Some(d);
            }
        }
        // Control first, then the other channels in turn.
        if let Some(c) = self.channels.get_mut(&CONTROL)
            && let Some(d) = c.tx.poll_transmit(now, self.id, CONTROL)
        {
            return Some(d);
        }
        let start = self.next_channel;
        let order = self
            .channels
            .range(start..)
            .chain(self.channels.range(..start))
            .map(|(ch, _)| *ch)
            .filter(|ch| *ch != CONTROL)
            .collect::<Vec<_>>();
        for ch in order {
            let c = self.channels.get_mut(&ch).expect("listed");
            if let Some(d) = c.tx.poll_transmit(now, self.id, ch) {
                self.next_channel = ch.wrapping_add(1);
                return Some(d);
            }
        }
        if std::mem::take(&mut self.pong_due) {
            return Some(packet::encode(self.id, &Packet::Ping { reply: false }));
        }
        if let Some(t) = self.probe_due()
            && t <= now
        {
            self.last_probe = Some(now);
            return Some(packet::encode(self.id, &Packet::Ping { reply: true }));
        }
        if now >= self.last_sent + self.config.keepalive {
            return Some(packet::encode(self.id, &Packet::Ping { reply: false }));
        }
        None
    }

    /// When the next answer-requesting PING is due: the peer has been silent for
    /// a keepalive interval.
    fn probe_due(&self) -> Option<Instant> {
        let silent = self.last_heard + self.config.keepalive;
        let again = self
            .last_probe
            .filter(|t| *t >= self.last_heard)
            .map(|t| t + self.config.keepalive / 4);
        Some(silent.max(again.unwrap_or(silent)))
    }

    /// True if [`Association::poll_transmit`] would return a datagram now.
    pub fn wants_to_send(&self) -> bool {
        self.close_datagram.is_some()
            || self.hello_ack_due
            || self.pong_due
            || (self.state == State::Established
                && self.channels.values().any(|c| c.tx.wants_to_send()))
    }

    /// When [`Association::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        let mut t = vec![self.last_heard + self.config.idle_timeout];
        if self.state == State::Handshaking {
            t.extend(self.hello_due);
            t.push(self.started + self.config.idle_timeout);
        } else {
            t.push(self.last_sent + self.config.keepalive);
            t.extend(self.probe_due());
            for c in self.channels.values() {
                t.extend(c.tx.poll_timeout());
                t.extend(c.rx.poll_timeout());
            }
        }
        t.into_iter().min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if self.state == State::Handshaking && now >= self.started + self.config.idle_timeout {
            self.finish(CloseReason::HandshakeTimeout);
            return;
        }
        if now >= self.last_heard + self.config.idle_timeout {
            self.finish(CloseReason::IdleTimeout);
            return;
        }
        let mut failure = None;
        for (&ch, c) in self.channels.iter_mut() {
            c.tx.handle_timeout(now);
            c.rx.handle_timeout(now);
            if failure.is_none()
                && let Some(why) = &c.tx.failed
            {
                failure = Some(format!("channel {ch}: gave up delivery: {why}"));
            }
        }
        if let Some(why) = failure {
            // Never a silent loss: a robust channel that cannot deliver ends the
            // whole association, visibly, on both sides if the CLOSE gets through.
            self.close(code::GAVE_UP, &why);
        }
    }
}
