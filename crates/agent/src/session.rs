//! One session: a local connection joined to its lanes (the role of OVS's
//! `rconn` for one connection, without any protocol of its own).
//!
//! Two pumps run side by side:
//! * **out**: local socket → [`Outbound`] → lane streams. It reads the local socket
//!   only after the previous batch was accepted by QUIC, so when a stream has no
//!   flow-control credit the agent stops reading and the local peer's own socket
//!   buffer fills: backpressure without unbounded queues. Lanes beyond the
//!   session stream are unidirectional streams opened on first use; at the end
//!   any lane never used is opened and finished, so the peer knows the direction
//!   is complete.
//! * **in**: lane streams → [`Inbound`] → local socket. It reads QUIC only after the
//!   previous bytes were written locally, so a slow local peer stops the QUIC
//!   streams' flow-control windows, and so the sender. A lane whose next message
//!   waits for a fence is not read at all until it may proceed.
//!
//! A session that starts before the QUIC handshake completes (0-RTT) has an
//! [`Early`] gate on the direction that may be replayed: what the switch agent
//! sends, and what the controller agent delivers to the controller. Until the
//! handshake completes only replay-safe messages pass it
//! ([`quicsdn_lanes::early`]); the first other one stops that direction
//! (reading stops too) until then.
//!
//! What the in-pump learns that the out-pump needs (the OpenFlow handshake is
//! over; an OVSDB echo request arrived) goes over a small channel.
//!
//! End of stream is passed on (local EOF → QUIC FIN → local shutdown(SHUT_WR)), so a
//! close on one side is a close on the other. Any error aborts both directions
//! with a QUIC error code (RESET_STREAM and STOP_SENDING, RFC 9000 §3.1–§3.5) and
//! closes the local socket; other sessions are not affected. One log line
//! records how the session ended.

use bytes::{Bytes, BytesMut};
use quicsdn_lanes::rules::Direction;
use quicsdn_lanes::{
    CoalesceConfig, Coalescer, EarlyGate, EchoStandIn, HelloStandIn, Inbound, InboundEvent,
    Outbound, PRIORITY_LANE, StandInError, StreamMode,
};
use quicsdn_transport::local::{LocalRead, LocalWrite};
use quicsdn_wire::FrameError;
use quicsdn_wire::preamble::{LanePreamble, code};
use quinn::{ReadError, RecvStream, SendStream, VarInt, WriteError};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::metrics::{Meter, Origin, SessionMeter};
use crate::services::Service;
use crate::tap::SessionTap;

/// A further lane of a session that the peer opened, routed here by the link.
/// Sent boxed: every session has a channel for them, and tokio allocates its
/// channels 32 slots at a time (2.6 KiB of 80-byte lanes per idle session,
/// 256 bytes of boxes; issue 18).
pub struct IncomingLane {
    pub lane: usize,
    pub recv: RecvStream,
    /// Bytes already read past the lane's preamble.
    pub initial: Bytes,
}

/// The QUIC side of a session: its session stream (lane 0 of both directions) and
/// where the peer's further lanes arrive.
pub struct SessionStreams {
    pub send: SendStream,
    pub recv: RecvStream,
    /// Bytes already read past the session preamble.
    pub initial: Bytes,
    pub lanes: mpsc::UnboundedReceiver<Box<IncomingLane>>,
}

/// Who is on each end and how the session runs.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// Identity of the switch this session belongs to.
    pub switch: Arc<str>,
    pub service: Arc<Service>,
    pub id: u64,
    /// What is on the local side: "OVS" on the switch agent, "controller" on the
    /// controller agent.
    pub local_name: &'static str,
    /// The agent on the other end of the QUIC connection.
    pub remote_name: &'static str,
    pub mode: StreamMode,
    /// True on the side that opened the session.
    pub opener: bool,
    /// The way this side's messages travel.
    pub direction: Direction,
    /// `--relaxed-flow-mods` (controller agent).
    pub relaxed: bool,
    /// Class-aware coalescing of what the local peer sends (`--coalesce`);
    /// `None`: everything leaves as soon as it is read.
    pub coalesce: Option<CoalesceConfig>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// `quicsdn snoop` clients.
    pub taps: Arc<crate::tap::Taps>,
    /// Switch agent, OpenFlow: what to do with the controller's HELLO.
    pub hello: Option<HelloWatch>,
}

/// The controller's last HELLO on one OpenFlow service, shared by its sessions.
pub type HelloMemory = Arc<std::sync::Mutex<Option<Bytes>>>;

/// The switch agent's watch over the controller's HELLO on an OpenFlow
/// session ([`quicsdn_lanes::hello`]): every session remembers it for the
/// service; a session whose OVS connection already got a stand-in HELLO
/// swallows it, and fails if it would negotiate another version (and forgets
/// the remembered one).
#[derive(Debug, Clone)]
pub struct HelloWatch {
    /// The controller's last HELLO on this service, shared by its sessions.
    pub memory: HelloMemory,
    /// The HELLO sent to OVS on the controller's behalf, and OVS's HELLO.
    pub stand_in: Option<(Bytes, Bytes)>,
    /// With a stand-in HELLO: OVS's echo requests answered until the
    /// controller speaks.
    pub echo: Option<EchoAnswer>,
}

/// One OVS connection's [`EchoStandIn`], shared by the switch agent's wait
/// for a link and the sessions it then runs on (one after another), and
/// stopped when the controller's HELLO arrives.
#[derive(Clone)]
pub struct EchoAnswer {
    watch: Arc<std::sync::Mutex<EchoStandIn>>,
    /// True while the link to the controller agent is not known dead (the
    /// rule of the HELLO stand-in, [`crate::stand_in`]): only then does OVS get
    /// an answer in the controller's stead.
    link_alive: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Replies handed out.
    answered: Arc<AtomicU64>,
}

impl std::fmt::Debug for EchoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoAnswer")
            .field("watch", &self.watch)
            .finish_non_exhaustive()
    }
}

impl EchoAnswer {
    pub fn new(max_message: usize, link_alive: Arc<dyn Fn() -> bool + Send + Sync>) -> EchoAnswer {
        EchoAnswer {
            watch: Arc::new(std::sync::Mutex::new(EchoStandIn::new(max_message))),
            link_alive,
            answered: Arc::default(),
        }
    }

    fn watch(&self) -> std::sync::MutexGuard<'_, EchoStandIn> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes bytes read from OVS, in order; returns the ECHO_REPLYs to write
    /// to OVS now (none once stopped, or while the link is known dead).
    pub fn observe(&self, bytes: &[u8]) -> Vec<Bytes> {
        let replies = self.watch().observe(bytes);
        if replies.is_empty() || !(self.link_alive)() {
            return Vec::new();
        }
        self.answered
            .fetch_add(replies.len() as u64, Ordering::Relaxed);
        replies
    }

    pub fn is_active(&self) -> bool {
        !self.watch().is_stopped()
    }

    fn stop(&self) {
        self.watch().stop();
    }

    /// OVS's echo requests answered so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

/// The in-pump's part of a [`HelloWatch`].
enum HelloState {
    /// Nothing to do (no watch, or the first message has passed).
    Off,
    Remember(HelloMemory),
    Swallow(HelloStandIn, HelloMemory, Option<EchoAnswer>),
}

impl HelloState {
    fn new(watch: Option<HelloWatch>) -> HelloState {
        let Some(w) = watch else {
            return HelloState::Off;
        };
        match w.stand_in {
            None => HelloState::Remember(w.memory),
            // The switch agent built the pair it checked: cannot fail here.
            Some((sent, ovs)) => match HelloStandIn::new(&sent, &ovs) {
                Ok(s) => HelloState::Swallow(s, w.memory, w.echo),
                Err(_) => HelloState::Remember(w.memory),
            },
        }
    }

    /// Passes the controller's runs of whole messages on, minus a swallowed
    /// HELLO; remembers its first HELLO.
    fn filter(&mut self, runs: Vec<Bytes>) -> Result<Vec<Bytes>, StandInError> {
        let remember = |memory: &std::sync::Mutex<Option<Bytes>>, hello: &[u8]| {
            *memory.lock().unwrap_or_else(|e| e.into_inner()) = Some(Bytes::copy_from_slice(hello));
        };
        match self {
            HelloState::Off => Ok(runs),
            HelloState::Remember(memory) => {
                if let Some(first) = runs.iter().find(|r| !r.is_empty()) {
                    if let Some(h) = quicsdn_lanes::hello::leading_hello(first) {
                        remember(memory, h);
                    }
                    *self = HelloState::Off;
                }
                Ok(runs)
            }
            HelloState::Swallow(stand_in, memory, echo) => {
                let mut out = Vec::with_capacity(runs.len());
                for r in runs {
                    match stand_in.push(r) {
                        Ok(r) => out.push(r),
                        Err(e) => {
                            // The controller now offers other versions: forget
                            // its old HELLO, so OVS's next connection waits for
                            // the controller's own (one reconnect, then the
                            // new HELLO is remembered).
                            *memory.lock().unwrap_or_else(|e| e.into_inner()) = None;
                            return Err(e);
                        }
                    }
                }
                if let Some(h) = stand_in.swallowed() {
                    remember(memory, h);
                    // The controller is here: it answers OVS's echo now.
                    if let Some(e) = echo {
                        e.stop();
                    }
                    *self = HelloState::Off;
                }
                Ok(out)
            }
        }
    }
}

/// Where a connection's TLS handshake stands, for sessions started in 0-RTT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    Pending,
    Complete,
    /// Complete, but the server did not accept the 0-RTT data (client only).
    ZeroRttRejected,
}

/// A session started before its connection's handshake completed.
#[derive(Debug, Clone)]
pub struct Early {
    /// Leaves `Pending` when the handshake completes; dropped if it never does.
    pub handshake: watch::Receiver<Handshake>,
    /// True to gate what this side sends (the client), false to gate what it
    /// delivers locally (the server).
    pub outgoing: bool,
    pub stats: Arc<EarlyStats>,
}

/// What the 0-RTT gates of one connection did.
#[derive(Debug, Default)]
pub struct EarlyStats {
    /// Messages that passed before the handshake completed.
    pub messages: AtomicU64,
    /// Sessions that held a message until the handshake completed.
    pub held_sessions: AtomicU64,
}

/// One direction's [`EarlyGate`] with what it waits for.
struct Gate {
    gate: EarlyGate,
    handshake: watch::Receiver<Handshake>,
    stats: Arc<EarlyStats>,
    held: bool,
}

/// Why a gate let nothing more through.
enum Shut {
    /// The server rejected 0-RTT: nothing sent early arrived.
    Rejected,
    /// The connection ended before its handshake completed.
    Lost,
}

impl Gate {
    fn new(early: &Early, service: &Service) -> Gate {
        Gate {
            gate: EarlyGate::new(service.framing, service.max_message),
            handshake: early.handshake.clone(),
            stats: early.stats.clone(),
            held: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) -> Bytes {
        let pass = self.gate.push(bytes);
        self.held |= self.gate.is_holding();
        pass
    }

    /// True once the handshake has completed (accepted or not).
    fn is_confirmed(&self) -> bool {
        *self.handshake.borrow() != Handshake::Pending
    }

    /// True when the direction must wait for the handshake before going on.
    fn must_wait(&self) -> bool {
        self.gate.is_holding()
    }

    /// Waits for the handshake, then returns everything held.
    async fn released(&mut self) -> Result<Bytes, Shut> {
        let state = self
            .handshake
            .wait_for(|h| *h != Handshake::Pending)
            .await
            .map_err(|_| Shut::Lost)?;
        if *state == Handshake::ZeroRttRejected {
            return Err(Shut::Rejected);
        }
        drop(state);
        Ok(self.gate.confirm())
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stats
            .messages
            .fetch_add(self.gate.passed_early(), Ordering::Relaxed);
        if self.held {
            self.stats.held_sessions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Why one direction of a session stopped.
#[derive(Debug)]
enum End {
    /// The sender finished its side cleanly.
    Finished,
    /// Aborted because the other direction failed.
    Aborted,
    LocalMalformed(FrameError),
    LocalTruncated(usize),
    LocalIo(std::io::Error),
    RemoteMalformed(String),
    RemoteStopped(VarInt),
    RemoteReset(VarInt),
    ConnectionLost(quinn::ConnectionError),
    /// The controller's HELLO does not fit the one OVS got in its stead.
    HelloMismatch(StandInError),
    /// The peer rejected 0-RTT: what this session sent early never arrived, and
    /// RFC 9001 §4.6.2 says the client "MUST reset the state of all streams,
    /// including application state bound to those streams".
    ZeroRttRejected,
}

impl End {
    /// The error code to abort the other direction with, if this end should stop
    /// the whole session.
    ///
    /// A peer's STOP_SENDING only says it wants no more data from us; the data it
    /// sent us is still delivered, so it does not abort our receiving direction
    /// (RFC 9000 §3.5: STOP_SENDING concerns the sending part only). A local peer
    /// that closed mid-message has closed; what it sent before is delivered.
    fn abort_code(&self) -> Option<u32> {
        match self {
            End::Finished | End::Aborted | End::LocalTruncated(_) | End::RemoteStopped(_) => None,
            End::LocalMalformed(_) => Some(code::MALFORMED_MESSAGE),
            End::RemoteMalformed(_) | End::HelloMismatch(_) => Some(code::PROTOCOL_VIOLATION),
            End::LocalIo(_) | End::ConnectionLost(_) | End::ZeroRttRejected => {
                Some(code::LOCAL_ABORT)
            }
            End::RemoteReset(c) => Some(c.into_inner() as u32),
        }
    }

    /// True when the session's closing log line should explain this end.
    fn is_notable(&self) -> bool {
        !matches!(self, End::Finished | End::Aborted)
    }
}

fn write_end(e: WriteError) -> End {
    match e {
        WriteError::Stopped(c) => End::RemoteStopped(c),
        WriteError::ConnectionLost(e) => End::ConnectionLost(e),
        WriteError::ZeroRttRejected => End::ZeroRttRejected,
        other => End::RemoteMalformed(other.to_string()),
    }
}

fn read_end(e: ReadError) -> End {
    match e {
        ReadError::Reset(c) => End::RemoteReset(c),
        ReadError::ConnectionLost(e) => End::ConnectionLost(e),
        ReadError::ZeroRttRejected => End::ZeroRttRejected,
        other => End::RemoteMalformed(other.to_string()),
    }
}

/// Byte and message counts, for the closing log line.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    messages_out: u64,
    bytes_out: u64,
    bytes_in: u64,
}

/// Waits until an abort code is published.
async fn aborted(rx: &mut watch::Receiver<Option<u32>>) -> u32 {
    loop {
        if let Some(c) = *rx.borrow_and_update() {
            return c;
        }
        if rx.changed().await.is_err() {
            // The session dropped its sender: treat as an abort.
            return code::LOCAL_ABORT;
        }
    }
}

/// `fut`'s output, or None if `due` comes first.
async fn until<F: Future>(due: Option<tokio::time::Instant>, fut: F) -> Option<F::Output> {
    match due {
        None => Some(fut.await),
        Some(due) => tokio::select! {
            r = fut => Some(r),
            () = tokio::time::sleep_until(due) => None,
        },
    }
}

/// Runs `fut` unless an abort arrives first.
async fn or_abort<T>(
    rx: &mut watch::Receiver<Option<u32>>,
    fut: impl Future<Output = T>,
) -> Result<T, u32> {
    tokio::select! {
        biased;
        c = aborted(rx) => Err(c),
        v = fut => Ok(v),
    }
}

/// How a session ended.
pub enum Outcome {
    Done,
    /// The server rejected 0-RTT before anything reached the local peer: its
    /// connection and every byte read from it, to start again on the next
    /// connection. The local peer notices nothing.
    Retry {
        local: (LocalRead, LocalWrite),
        replay: Bytes,
    },
}

/// Runs a session to its end. Never panics on peer input; logs one line at the
/// end. `preread` is what was read from the local peer before (a retry).
pub async fn run(
    info: SessionInfo,
    conn: quinn::Connection,
    local: (LocalRead, LocalWrite),
    streams: SessionStreams,
    early: Option<Early>,
    preread: Bytes,
) -> Outcome {
    let service = info.service.clone();
    info!(
        switch = %info.switch,
        service = %service.name,
        session = info.id,
        streams = %info.mode,
        "session opened"
    );
    let (rd, wr) = local;
    let (meter, sent_meter, delivered_meter) =
        info.metrics
            .session(&info.switch, &service.name, service.framing, info.direction);
    let tap = SessionTap::new(
        info.taps.clone(),
        info.switch.clone(),
        &service.name,
        info.id,
        service.framing,
    );
    tap.opened();
    let (abort_tx, abort_rx) = watch::channel(None::<u32>);
    let events = EventQueue::default();
    // ECHO_REPLYs the out-pump's echo stand-in writes through the in-pump,
    // which owns the local socket's writing half.
    let echo = info
        .hello
        .as_ref()
        .and_then(|h| h.echo.clone())
        .filter(EchoAnswer::is_active);
    // Only then: a tokio channel allocates 32 slots at once, and every idle
    // session would keep them (issue 18).
    let (echo, replies_rx) = match echo {
        Some(e) => {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some((e, tx)), Some(rx))
        }
        None => (None, None),
    };
    let outbound = Outbound::new(
        service.framing,
        service.max_message,
        info.mode,
        info.direction,
        info.relaxed,
    );

    let received = match info.direction {
        Direction::ToSwitch => Direction::ToController,
        Direction::ToController => Direction::ToSwitch,
    };
    let inbound = Inbound::new(service.framing, service.max_message, info.mode, received);
    let refused = {
        let conn = conn.clone();
        move || {
            conn.close_reason()
                .is_some_and(|e| crate::switch::is_refusal(&e))
        }
    };
    let lane_opener = LaneOpener {
        conn,
        session: info.id,
        opened_by_sender: info.opener,
        priority_lane: matches!(info.mode, StreamMode::Safe { .. }),
    };
    let mut counts = Counts::default();
    let gate = |outgoing: bool| {
        early
            .as_ref()
            .filter(|e| e.outgoing == outgoing)
            .map(|e| Gate::new(e, &service))
    };
    let coalescer = info
        .coalesce
        .map(|c| Coalescer::new(service.framing, service.max_message, c));
    let out = pump_out(
        rd,
        preread,
        (coalescer, outbound),
        streams.send,
        lane_opener,
        (events.clone(), echo),
        abort_rx.clone(),
        gate(true),
        (sent_meter, tap.clone(), info.direction),
    );
    let inn = pump_in(
        wr,
        (inbound, HelloState::new(info.hello.clone())),
        (streams.recv, streams.initial),
        (streams.lanes, replies_rx),
        events,
        abort_rx,
        gate(false),
        (delivered_meter, tap.clone(), received),
    );
    tokio::pin!(out, inn);
    let (mut out_done, mut in_done) = (false, false);
    let mut first_failure: Option<(&'static str, End)> = None;
    let (mut rd, mut wr, mut replay) = (None, None, None);
    while !out_done || !in_done {
        let (direction, end) = tokio::select! {
            out = &mut out, if !out_done => {
                out_done = true;
                counts.messages_out = out.messages;
                counts.bytes_out = out.bytes;
                rd = Some(out.rd);
                replay = out.replay;
                ("out", out.end)
            }
            (e, bytes, w) = &mut inn, if !in_done => {
                in_done = true;
                counts.bytes_in = bytes;
                wr = Some(w);
                ("in", e)
            }
        };
        if let Some(c) = end.abort_code() {
            let _ = abort_tx.send(Some(c));
        }
        if end.is_notable() {
            first_failure.get_or_insert((direction, end));
        } else {
            debug!(switch = %info.switch, service = %service.name, session = info.id, direction, "direction ended");
        }
    }
    // A refused connection (admission control) never reached the controller
    // agent's application: like a rejected 0-RTT, nothing sent early arrived.
    tap.closed();
    let rejected = matches!(first_failure, Some((_, End::ZeroRttRejected))) || refused();
    if rejected
        && counts.bytes_in == 0
        && let (Some(rd), Some(wr), Some(replay)) = (rd, wr, replay)
    {
        info!(
            switch = %info.switch, service = %service.name, session = info.id,
            "the {} {}; the session starts again on the next connection",
            info.remote_name,
            if refused() { "refused the connection" } else { "rejected 0-RTT" }
        );
        return Outcome::Retry {
            local: (rd, wr),
            replay: replay.freeze(),
        };
    }
    log_end(&info, &meter, first_failure, counts);
    Outcome::Done
}

/// What the in-pump tells the out-pump, which reads it between its reads. A
/// shared list rather than a channel: nothing waits on it, and a tokio channel
/// allocates 32 slots up front for every session, idle ones too (issue 18).
#[derive(Clone, Default)]
struct EventQueue(Arc<std::sync::Mutex<Vec<InboundEvent>>>);

impl EventQueue {
    fn push(&self, events: Vec<InboundEvent>) {
        if !events.is_empty() {
            self.list().extend(events);
        }
    }

    fn take(&self) -> Vec<InboundEvent> {
        std::mem::take(&mut *self.list())
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<InboundEvent>> {
        // Pushing and taking cannot leave the list half-changed.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Opens this side's further lanes of a session.
struct LaneOpener {
    conn: quinn::Connection,
    session: u64,
    opened_by_sender: bool,
    /// Lane 1 is the priority lane (`safe` mode): it goes out first.
    priority_lane: bool,
}

impl LaneOpener {
    async fn open(&self, lane: usize) -> Result<SendStream, WriteError> {
        let mut send = self.conn.open_uni().await?;
        if self.priority_lane && lane == PRIORITY_LANE {
            let _ = send.set_priority(1);
        }
        let preamble = LanePreamble {
            session: self.session,
            opened_by_sender: self.opened_by_sender,
            lane: lane as u64,
        };
        send.write_all(&preamble.encode()).await?;
        Ok(send)
    }
}

fn log_end(
    info: &SessionInfo,
    meter: &SessionMeter,
    failure: Option<(&'static str, End)>,
    c: Counts,
) {
    let (switch, service, session) = (&info.switch, &info.service.name, info.id);
    match &failure {
        Some((_, End::LocalMalformed(_))) => meter.malformed(Origin::local),
        Some((_, End::RemoteStopped(c) | End::RemoteReset(c)))
            if c.into_inner() == u64::from(code::MALFORMED_MESSAGE) =>
        {
            meter.malformed(Origin::remote)
        }
        _ => {}
    }
    let Some((_, end)) = failure else {
        info!(
            %switch, %service, session,
            messages_out = c.messages_out, bytes_out = c.bytes_out, bytes_in = c.bytes_in,
            "session closed"
        );
        return;
    };
    let (local, remote) = (info.local_name, info.remote_name);
    let counts = (c.messages_out, c.bytes_out, c.bytes_in);
    match end {
        End::LocalMalformed(e) => warn!(
            %switch, %service, session,
            "session closed: malformed message from {local}: {e}"
        ),
        End::LocalTruncated(n) => warn!(
            %switch, %service, session,
            "session closed: {local} closed the connection in the middle of a message ({n} bytes discarded)"
        ),
        End::LocalIo(e) => {
            info!(%switch, %service, session, "session closed: {local} connection failed: {e}")
        }
        End::RemoteMalformed(e) => warn!(
            %switch, %service, session,
            "session closed: invalid data from the {remote}: {e}"
        ),
        End::HelloMismatch(e) => warn!(
            %switch, %service, session,
            "session closed: {e}; OVS reconnects and negotiates with the controller's new HELLO"
        ),
        End::RemoteStopped(code) | End::RemoteReset(code) => {
            let reason = code::describe(code.into_inner());
            if matches!(code.into_inner() as u32, code::LOCAL_ABORT | code::SHUTDOWN) {
                info!(%switch, %service, session, "session closed by the {remote}: {reason}");
            } else {
                warn!(%switch, %service, session, "session closed by the {remote}: {reason}");
            }
        }
        End::ConnectionLost(e) => {
            info!(%switch, %service, session, "session closed: QUIC connection lost: {e}")
        }
        End::ZeroRttRejected => info!(
            %switch, %service, session,
            "session closed: the {remote} rejected 0-RTT, so what this session sent early was not delivered; {local} reconnects"
        ),
        End::Finished | End::Aborted => unreachable!("not failures"),
    }
    debug!(%switch, %service, session, ?counts, "session counters");
}

/// Returns how it ended, and the messages and bytes it sent.
/// What the out-pump returns.
struct OutEnd {
    end: End,
    messages: u64,
    bytes: u64,
    rd: LocalRead,
    /// Every byte read from the local peer, if the session began in 0-RTT and the
    /// handshake never completed with the 0-RTT data accepted.
    replay: Option<BytesMut>,
}

/// Not an `async fn`: an async fn keeps its arguments in its future beside
/// the pump they were moved into. Built here, the future holds only the pump
/// and the reader, for the life of every idle session (issue 18).
#[allow(clippy::too_many_arguments)] // One pump's parts, named at its one caller.
fn pump_out(
    mut rd: LocalRead,
    preread: Bytes,
    (coalescer, outbound): (Option<Coalescer>, Outbound),
    main: SendStream,
    opener: LaneOpener,
    (events, echo): (
        EventQueue,
        Option<(EchoAnswer, mpsc::UnboundedSender<Bytes>)>,
    ),
    abort: watch::Receiver<Option<u32>>,
    gate: Option<Gate>,
    (meter, tap, direction): (Meter, SessionTap, Direction),
) -> impl Future<Output = OutEnd> {
    let lanes = outbound.lanes();
    let mut out = OutPump {
        coalescer,
        outbound,
        sends: std::iter::once(Some(main))
            .chain((1..lanes).map(|_| None))
            .collect(),
        opener,
        events,
        echo,
        abort,
        replay: gate.as_ref().map(|_| BytesMut::new()),
        gate,
        messages: 0,
        bytes: 0,
        meter,
        tap,
        direction,
    };
    out.ingest(&preread);
    out.advance(!preread.is_empty(), false);
    async move {
        let end = out.run(&mut rd).await;
        // Streams already finished stay finished (the peer delivers what they carry);
        // only a direction cut short is reset.
        let reset = match &end {
            End::Aborted => Some((*out.abort.borrow()).unwrap_or(code::LOCAL_ABORT)),
            End::LocalIo(_) | End::RemoteStopped(_) | End::RemoteMalformed(_) => {
                Some(code::LOCAL_ABORT)
            }
            _ => None,
        };
        if let Some(c) = reset {
            out.reset_all(c);
        }
        OutEnd {
            end,
            messages: out.messages,
            bytes: out.bytes,
            rd,
            replay: out.replay.take(),
        }
    }
}

struct OutPump {
    /// Holds what may wait, in front of the outbound (see `quicsdn_lanes::coalesce`).
    coalescer: Option<Coalescer>,
    outbound: Outbound,
    sends: Vec<Option<SendStream>>,
    opener: LaneOpener,
    events: EventQueue,
    /// Until the controller speaks, after a stand-in HELLO (switch agent):
    /// answers OVS's echo requests, and where the answers go.
    echo: Option<(EchoAnswer, mpsc::UnboundedSender<Bytes>)>,
    abort: watch::Receiver<Option<u32>>,
    /// Until the handshake completes (0-RTT, client side).
    gate: Option<Gate>,
    /// Everything read from the local peer while the gate is up, to start again
    /// if the server rejects 0-RTT.
    replay: Option<BytesMut>,
    messages: u64,
    bytes: u64,
    meter: Meter,
    tap: SessionTap,
    /// The way this side's messages travel.
    direction: Direction,
}

impl OutPump {
    fn reset_all(&mut self, c: u32) {
        for s in self.sends.iter_mut().flatten() {
            let _ = s.reset(VarInt::from_u32(c));
        }
    }

    /// Opens `lane`'s stream on first use.
    async fn ensure_open(&mut self, lane: usize) -> Result<(), End> {
        if self.sends[lane].is_none() {
            let opened = or_abort(&mut self.abort, self.opener.open(lane)).await;
            self.sends[lane] = Some(match opened {
                Err(_) => return Err(End::Aborted),
                Ok(Err(e)) => return Err(write_end(e)),
                Ok(Ok(s)) => s,
            });
        }
        Ok(())
    }

    /// Ends every lane cleanly, opening those never used so the peer knows.
    async fn finish(&mut self) -> Result<(), End> {
        for lane in 0..self.sends.len() {
            self.ensure_open(lane).await?;
            if let Some(s) = self.sends[lane].as_mut() {
                let _ = s.finish();
            }
        }
        Ok(())
    }

    /// Shows bytes just read from the local peer to the echo stand-in, once
    /// (not what a retried session replays: the watch saw it when it was read).
    fn answer_echo(&mut self, bytes: &[u8]) {
        if let Some((echo, replies)) = &self.echo {
            for r in echo.observe(bytes) {
                // The in-pump is gone only when the session ends.
                let _ = replies.send(r);
            }
            if !echo.is_active() {
                self.echo = None;
            }
        }
    }

    /// Takes bytes from the local peer: through the 0-RTT gate while there is one.
    fn ingest(&mut self, bytes: &[u8]) {
        if let Some(replay) = &mut self.replay {
            replay.extend_from_slice(bytes);
        }
        match &mut self.gate {
            None => self.staging().extend_from_slice(bytes),
            Some(gate) => {
                let pass = gate.push(bytes);
                self.staging().extend_from_slice(&pass);
            }
        }
    }

    /// Where bytes from the local peer go first: the coalescer if there is one.
    fn staging(&mut self) -> &mut BytesMut {
        match &mut self.coalescer {
            Some(c) => c.read_buf(),
            None => self.outbound.read_buf(),
        }
    }

    /// Moves what may leave now from the coalescer to the outbound; `arrived`:
    /// new bytes were staged; `at_end`: the local peer finished, nothing waits.
    fn advance(&mut self, arrived: bool, at_end: bool) {
        let Some(c) = &mut self.coalescer else {
            return;
        };
        let now = std::time::Instant::now();
        if arrived {
            c.arrived(now);
        }
        let ready = if at_end { c.flush() } else { c.take(now) };
        for f in c.take_flushes() {
            self.meter.flushed(&f);
        }
        if !ready.is_empty() {
            self.outbound.read_buf().extend_from_slice(&ready);
        }
    }

    /// Reads from the local peer into the staging buffer (directly when no gate
    /// is up). `Ok(None)`: nothing read, but held messages are due.
    async fn read(&mut self, rd: &mut LocalRead) -> Result<Option<usize>, End> {
        let due = self
            .coalescer
            .as_ref()
            .and_then(|c| c.deadline())
            .map(tokio::time::Instant::from_std);
        // Reading is cancel-safe (tokio's `read_buf`, `readable`): a tick that
        // wins loses no byte.
        let n = if self.gate.is_none() && self.echo.is_none() {
            {
                let mut ready = std::pin::pin!(rd.readable());
                let now = std::future::poll_fn(|cx| Poll::Ready(ready.as_mut().poll(cx))).await;
                match now {
                    Poll::Ready(r) => r.map_err(End::LocalIo)?,
                    // Wait for the local peer holding no buffer: most sessions
                    // are idle most of the time, and each would keep its read
                    // buffer otherwise. Only when it has nothing to read now,
                    // so a busy session does not free and remake it per read.
                    Poll::Pending => {
                        // Both: what the coalescer let go sits in the
                        // outbound's buffer until sent.
                        if let Some(c) = &mut self.coalescer {
                            c.release_idle_buf();
                        }
                        self.outbound.release_idle_buf();
                        match or_abort(&mut self.abort, until(due, ready.as_mut())).await {
                            Err(_) => return Err(End::Aborted),
                            Ok(None) => return Ok(None),
                            Ok(Some(Err(e))) => return Err(End::LocalIo(e)),
                            Ok(Some(Ok(()))) => {}
                        }
                    }
                }
            }
            let staging = match &mut self.coalescer {
                Some(c) => c.read_buf(),
                None => self.outbound.read_buf(),
            };
            or_abort(&mut self.abort, until(due, rd.read_buf(staging))).await
        } else {
            let mut buf = BytesMut::with_capacity(quicsdn_lanes::MIN_READ_CHUNK);
            let r = or_abort(&mut self.abort, until(due, rd.read_buf(&mut buf))).await;
            self.answer_echo(&buf);
            self.ingest(&buf);
            r
        };
        match n {
            Err(_) => Err(End::Aborted),
            Ok(None) => Ok(None),
            Ok(Some(Err(e))) => Err(End::LocalIo(e)),
            Ok(Some(Ok(n))) => {
                match &mut self.coalescer {
                    Some(c) => c.read_done(n),
                    None => self.outbound.read_done(n),
                }
                Ok(Some(n))
            }
        }
    }

    /// Drops the gate once the handshake has completed, waiting for it first if
    /// a message is held (or the local peer has finished); true if it released
    /// bytes into the outbound buffer. RFC 9001 §5.6: "A client MAY wish to
    /// apply additional restrictions on what data it sends prior to the
    /// completion of the TLS handshake."
    async fn pass_gate(&mut self, at_end: bool) -> Result<bool, End> {
        let Some(gate) = &mut self.gate else {
            return Ok(false);
        };
        if !gate.is_confirmed() && !gate.must_wait() && !at_end {
            return Ok(false);
        }
        let released = match or_abort(&mut self.abort, gate.released()).await {
            Err(_) | Ok(Err(Shut::Lost)) => return Err(End::Aborted),
            Ok(Err(Shut::Rejected)) => return Err(End::ZeroRttRejected),
            Ok(Ok(b)) => b,
        };
        self.staging().extend_from_slice(&released);
        self.advance(!released.is_empty(), at_end);
        self.gate = None;
        // Accepted: nothing will need sending again.
        self.replay = None;
        Ok(!released.is_empty())
    }

    async fn run(&mut self, rd: &mut LocalRead) -> End {
        // What a retried session had read already goes first.
        if let Err(e) = self.send_batches().await {
            return e;
        }
        loop {
            let read = match self.read(rd).await {
                Err(e) => return e,
                Ok(n) => n,
            };
            for event in self.events.take() {
                match event {
                    InboundEvent::HandshakeComplete => self.outbound.handshake_complete(),
                    InboundEvent::EchoRequest(id) => self.outbound.echo_request_received(id),
                    InboundEvent::PacketIn => {
                        if let Some(c) = &mut self.coalescer {
                            c.packet_in_delivered(std::time::Instant::now());
                        }
                    }
                }
            }
            let n = match read {
                None => {
                    // A tick: what waited leaves.
                    self.advance(false, false);
                    if let Err(e) = self.send_batches().await {
                        return e;
                    }
                    continue;
                }
                Some(n) => n,
            };
            self.advance(n > 0, n == 0);
            if let Err(e) = self.send_batches().await {
                return e;
            }
            match self.pass_gate(n == 0).await {
                Err(e) => return e,
                Ok(true) => {
                    if let Err(e) = self.send_batches().await {
                        return e;
                    }
                }
                Ok(false) => {}
            }
            if n == 0 {
                // Whole messages already left; a trailing partial one is dropped, as
                // the local peer abandoned it.
                if let Err(e) = self.finish().await {
                    return e;
                }
                let partial = self.outbound.partial_len();
                return if partial > 0 {
                    End::LocalTruncated(partial)
                } else {
                    End::Finished
                };
            }
        }
    }

    /// Sends every whole message buffered.
    async fn send_batches(&mut self) -> Result<(), End> {
        loop {
            let batch = match self.outbound.next_batch() {
                Ok(Some(b)) => b,
                Ok(None) => return Ok(()),
                Err(e) => {
                    // Everything before the bad message has been sent: end the
                    // lanes cleanly so the peer delivers it, then close.
                    self.finish().await?;
                    return Err(End::LocalMalformed(e));
                }
            };
            self.messages += batch.messages as u64;
            self.bytes += batch.bytes.len() as u64;
            self.meter.count(&batch.bytes);
            self.ensure_open(batch.lane).await?;
            let send = self.sends[batch.lane].as_mut().expect("opened above");
            self.tap.run(
                self.direction,
                batch.lane,
                Some(send.id().into()),
                &batch.bytes,
            );
            match or_abort(&mut self.abort, send.write_chunk(batch.bytes)).await {
                Err(_) => return Err(End::Aborted),
                Ok(Err(e)) => return Err(write_end(e)),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// A chunk read from a lane: `Ok(None)` when the lane finished.
type LaneRead = Result<Option<Bytes>, ReadError>;

/// A lane's read under way. It owns the lane's stream until its chunk comes
/// (and hands it back), so an idle lane costs one small boxed future, not a
/// task and a channel (issue 18: those were about 5 KiB per session). A lane
/// that may not proceed is simply not polled, and its stream's flow control
/// holds the sender back.
type LaneFuture = std::pin::Pin<Box<dyn Future<Output = (Option<RecvStream>, LaneRead)> + Send>>;

/// One lane of the in-pump.
struct LaneFeed {
    /// Bytes that arrived with the lane's preamble: delivered first.
    initial: Option<Bytes>,
    read: Option<LaneFuture>,
    stop: watch::Receiver<Option<u32>>,
    done: bool,
}

impl LaneFeed {
    fn new(recv: RecvStream, initial: Bytes, stop: watch::Receiver<Option<u32>>) -> LaneFeed {
        LaneFeed {
            initial: (!initial.is_empty()).then_some(initial),
            read: Some(read_lane(recv, stop.clone())),
            stop,
            done: false,
        }
    }

    /// The lane's next chunk; once it has ended (finished, failed or
    /// stopped), never ready again.
    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> Poll<LaneRead> {
        if let Some(b) = self.initial.take() {
            return Poll::Ready(Ok(Some(b)));
        }
        let Some(read) = self.read.as_mut() else {
            return Poll::Pending;
        };
        let Poll::Ready((recv, r)) = read.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        self.read = match (recv, &r) {
            (Some(recv), Ok(Some(_))) => Some(read_lane(recv, self.stop.clone())),
            _ => None,
        };
        Poll::Ready(r)
    }

    /// Lets a read under way act on the stop signal: STOP_SENDING with its
    /// code, so the peer learns why.
    async fn stop(&mut self) {
        if let Some(read) = self.read.take() {
            let _ = read.await;
        }
    }
}

/// Reads the lane's next chunk, unless the session stops it first (then
/// STOP_SENDING with the stop's code).
fn read_lane(mut recv: RecvStream, mut stop: watch::Receiver<Option<u32>>) -> LaneFuture {
    Box::pin(async move {
        match or_abort(&mut stop, recv.read_chunk(usize::MAX, true)).await {
            Err(c) => {
                let _ = recv.stop(VarInt::from_u32(c));
                (None, Ok(None))
            }
            Ok(r) => (Some(recv), r.map(|c| c.map(|c| c.bytes))),
        }
    })
}

/// What the in-pump waits for.
enum InEvent {
    Chunk(usize, LaneRead),
    NewLane(Box<IncomingLane>),
    /// The link stopped routing lanes (the connection is going away).
    NoMoreLanes,
    /// An ECHO_REPLY the echo stand-in wrote for OVS ([`EchoAnswer`]).
    EchoReply(Bytes),
}

/// Delivers `runs` locally, through the 0-RTT gate while there is one; waits for
/// the handshake if the gate holds a message (or `at_end`) and then delivers
/// what it held. Returns the end and the abort code on failure.
async fn deliver(
    wr: &mut LocalWrite,
    runs: Vec<Bytes>,
    gate: &mut Option<Gate>,
    abort: &mut watch::Receiver<Option<u32>>,
    at_end: bool,
    bytes: &mut u64,
    meter: &mut Meter,
) -> Result<(), (End, Option<u32>)> {
    let mut out = Vec::with_capacity(runs.len() + 1);
    match gate {
        None => out = runs,
        Some(g) => {
            out.extend(runs.iter().map(|r| g.push(r)));
            if g.is_confirmed() || g.must_wait() || at_end {
                match or_abort(abort, g.released()).await {
                    Err(c) => return Err((End::Aborted, Some(c))),
                    Ok(Err(Shut::Lost)) => return Err((End::Aborted, Some(code::LOCAL_ABORT))),
                    Ok(Err(Shut::Rejected)) => {
                        return Err((End::ZeroRttRejected, Some(code::LOCAL_ABORT)));
                    }
                    Ok(Ok(b)) => out.push(b),
                }
                *gate = None;
            }
        }
    }
    for run in out.into_iter().filter(|r| !r.is_empty()) {
        *bytes += run.len() as u64;
        meter.count(&run);
        match or_abort(abort, wr.write_all(&run)).await {
            Err(c) => return Err((End::Aborted, Some(c))),
            Ok(Err(e)) => return Err((End::LocalIo(e), Some(code::LOCAL_ABORT))),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}

/// Returns how it ended, the bytes it delivered locally, and the local writer.
/// Not an `async fn`, for the reason [`pump_out`] gives.
#[allow(clippy::too_many_arguments)] // One pump's parts, named at its one caller.
fn pump_in(
    mut wr: LocalWrite,
    (mut inbound, mut hello): (Inbound, HelloState),
    main: (RecvStream, Bytes),
    (mut lanes, mut echo_replies): (
        mpsc::UnboundedReceiver<Box<IncomingLane>>,
        Option<mpsc::UnboundedReceiver<Bytes>>,
    ),
    events: EventQueue,
    mut abort: watch::Receiver<Option<u32>>,
    mut gate: Option<Gate>,
    (mut meter, tap, received): (Meter, SessionTap, Direction),
) -> impl Future<Output = (End, u64, LocalWrite)> {
    let (stop_tx, stop_rx) = watch::channel(None::<u32>);
    let mut feeds: Vec<Option<LaneFeed>> = (0..inbound.lanes()).map(|_| None).collect();
    // Each lane's QUIC stream, for `quicsdn snoop`.
    let mut streams: Vec<Option<u64>> = vec![None; feeds.len()];
    streams[0] = Some(main.0.id().into());
    feeds[0] = Some(LaneFeed::new(main.0, main.1, stop_rx.clone()));
    let mut lanes_open = true;
    let mut start = 0;
    let mut bytes = 0;
    async move {
        let (end, stop) = loop {
            let next = std::future::poll_fn(|cx| {
                if lanes_open && let Poll::Ready(l) = lanes.poll_recv(cx) {
                    return Poll::Ready(l.map_or(InEvent::NoMoreLanes, InEvent::NewLane));
                }
                // Between runs: the local peer gets whole messages only.
                if let Some(r) = echo_replies.as_mut()
                    && let Poll::Ready(reply) = r.poll_recv(cx)
                {
                    match reply {
                        Some(reply) => return Poll::Ready(InEvent::EchoReply(reply)),
                        // The echo stand-in has stopped.
                        None => echo_replies = None,
                    }
                }
                let n = feeds.len();
                for k in 0..n {
                    let i = (start + k) % n;
                    if inbound.is_blocked(i) {
                        continue;
                    }
                    if let Some(feed) = feeds[i].as_mut().filter(|f| !f.done)
                        && let Poll::Ready(r) = feed.poll_next(cx)
                    {
                        return Poll::Ready(InEvent::Chunk(i, r));
                    }
                }
                Poll::Pending
            });
            let event = match or_abort(&mut abort, next).await {
                Err(c) => break (End::Aborted, Some(c)),
                Ok(e) => e,
            };
            match event {
                InEvent::NoMoreLanes => lanes_open = false,
                InEvent::EchoReply(reply) => {
                    debug!(
                        "answered OVS's echo request in the controller's stead (the controller has not spoken yet)"
                    );
                    match or_abort(&mut abort, wr.write_all(&reply)).await {
                        Err(c) => break (End::Aborted, Some(c)),
                        Ok(Err(e)) => break (End::LocalIo(e), Some(code::LOCAL_ABORT)),
                        Ok(Ok(())) => {}
                    }
                }
                InEvent::NewLane(l) => {
                    if l.lane >= feeds.len() || feeds[l.lane].is_some() {
                        let mut recv = l.recv;
                        let _ = recv.stop(VarInt::from_u32(code::PROTOCOL_VIOLATION));
                        break (
                            End::RemoteMalformed(format!(
                                "lane {} opened twice or out of range",
                                l.lane
                            )),
                            Some(code::PROTOCOL_VIOLATION),
                        );
                    }
                    streams[l.lane] = Some(l.recv.id().into());
                    feeds[l.lane] = Some(LaneFeed::new(l.recv, l.initial, stop_rx.clone()));
                }
                InEvent::Chunk(lane, Ok(Some(chunk))) => {
                    start = (lane + 1) % feeds.len();
                    let runs = match inbound.push(lane, chunk) {
                        Ok(runs) => runs,
                        Err(e) => {
                            break (
                                End::RemoteMalformed(e.to_string()),
                                Some(code::PROTOCOL_VIOLATION),
                            );
                        }
                    };
                    events.push(inbound.take_events());
                    for (run, &lane) in runs.iter().zip(inbound.run_lanes()) {
                        tap.run(received, lane, streams[lane], run);
                    }
                    let runs = match hello.filter(runs) {
                        Ok(runs) => runs,
                        Err(e) => break (End::HelloMismatch(e), Some(code::PROTOCOL_VIOLATION)),
                    };
                    if let Err(f) = deliver(
                        &mut wr, runs, &mut gate, &mut abort, false, &mut bytes, &mut meter,
                    )
                    .await
                    {
                        break f;
                    }
                }
                InEvent::Chunk(lane, Ok(None)) => {
                    if let Some(f) = feeds[lane].as_mut() {
                        f.done = true;
                    }
                    match inbound.finish(lane) {
                        Ok(true) => {
                            if let Err(f) = deliver(
                                &mut wr,
                                Vec::new(),
                                &mut gate,
                                &mut abort,
                                true,
                                &mut bytes,
                                &mut meter,
                            )
                            .await
                            {
                                break f;
                            }
                            let _ = wr.shutdown().await;
                            break (End::Finished, None);
                        }
                        Ok(false) => {}
                        Err(e) => {
                            break (
                                End::RemoteMalformed(e.to_string()),
                                Some(code::PROTOCOL_VIOLATION),
                            );
                        }
                    }
                }
                InEvent::Chunk(_, Err(e)) => break (read_end(e), Some(code::LOCAL_ABORT)),
            }
        };
        // Let reads under way act on the stop signal (STOP_SENDING with the code)
        // before the session drops the streams; lanes still arriving are refused.
        let _ = stop_tx.send(stop);
        if stop.is_some() {
            for feed in feeds.iter_mut().flatten() {
                feed.stop().await;
            }
        }
        drop(feeds);
        lanes.close();
        while let Ok(l) = lanes.try_recv() {
            let mut recv = l.recv;
            let _ = recv.stop(VarInt::from_u32(stop.unwrap_or(code::LOCAL_ABORT)));
        }
        (end, bytes, wr)
    }
}

/// Refuses a session: reset our sending side and ask the peer to stop, both with
/// `code`, so the opener learns why.
pub fn refuse(mut send: SendStream, mut recv: RecvStream, c: u32) {
    let _ = send.reset(VarInt::from_u32(c));
    let _ = recv.stop(VarInt::from_u32(c));
}
