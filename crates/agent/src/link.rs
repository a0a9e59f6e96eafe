//! One QUIC connection between a switch agent and a controller agent, seen from
//! either end: the hello exchange, sessions the peer opens (the session stream
//! is read and checked, then the local peer is dialled), sessions this side
//! opens, and the routing of each session's further lanes.

use crate::services::{Service, ServiceTable};
use crate::session::{
    self, Early, EarlyStats, Handshake, IncomingLane, Outcome, SessionInfo, SessionStreams,
};
use bytes::{Bytes, BytesMut};
use quicsdn_lanes::rules::Direction;
use quicsdn_lanes::{CoalesceConfig, StreamMode};
use quicsdn_transport::liveness;
use quicsdn_transport::local::{LocalRead, LocalStream, LocalWrite};
use quicsdn_transport::quic::QuicOptions;
use quicsdn_wire::preamble::{Hello, Opener, SessionPreamble, StreamStart, code};
use quinn::{RecvStream, SendStream, VarInt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

/// How long a peer may take to send a stream's preamble; also how long a lane may
/// wait for its session stream to show up.
const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(10);

/// A session's key on this connection: who opened it (this side or the peer) and
/// the opener's id for it.
type SessionKey = (bool, u64);

/// Where the lanes of live sessions go, and lanes that arrived before their
/// session stream.
#[derive(Default)]
struct Routes {
    sessions: HashMap<SessionKey, mpsc::UnboundedSender<Box<IncomingLane>>>,
    early: HashMap<u64, Vec<IncomingLane>>,
}

/// How this side schedules what it sends.
#[derive(Debug, Clone, Copy)]
pub struct Scheduling {
    /// The stream mode of sessions this side opens.
    pub mode: StreamMode,
    /// `--relaxed-flow-mods` (controller agent).
    pub relaxed: bool,
    /// `--coalesce`: the window of class-aware coalescing; `None`: off.
    pub coalesce: Option<Duration>,
}

/// The instant coalescing ticks are counted from: one per process, so every
/// session of every connection releases on the same ticks and their messages
/// share packets.
fn coalesce_epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// A live QUIC connection to the peer agent.
pub struct Link {
    pub conn: quinn::Connection,
    /// Identity of the switch this connection serves (our own on the switch agent).
    pub switch: Arc<str>,
    services: Arc<ServiceTable>,
    mode: StreamMode,
    relaxed: bool,
    coalesce: Option<Duration>,
    local_connect_timeout: Duration,
    next_session: AtomicU64,
    routes: Mutex<Routes>,
    /// Where the TLS handshake stands. A connection resumed with 0-RTT is used
    /// before it completes, with the gates of [`quicsdn_lanes::early`].
    handshake: watch::Receiver<Handshake>,
    /// The connection began before its handshake completed (0-RTT).
    pub early_start: bool,
    pub early: Arc<EarlyStats>,
    metrics: Arc<crate::metrics::Metrics>,
    taps: Arc<crate::tap::Taps>,
}

/// Removes a session's route when the session ends.
struct Route<'a> {
    link: &'a Link,
    key: SessionKey,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.link.routes().sessions.remove(&self.key);
    }
}

impl Link {
    /// `sched.relaxed` enables `--relaxed-flow-mods` for what this side sends (only the
    /// controller agent sends towards the switch). `handshake` is `None` for a
    /// connection whose handshake has completed, else where it stands. Its
    /// sessions count what they carry in `metrics`.
    #[allow(clippy::too_many_arguments)] // The agent's settings for its links, named at both callers.
    pub fn new(
        conn: quinn::Connection,
        switch: Arc<str>,
        services: Arc<ServiceTable>,
        sched: Scheduling,
        local_connect_timeout: Duration,
        handshake: Option<watch::Receiver<Handshake>>,
        (metrics, taps): (Arc<crate::metrics::Metrics>, Arc<crate::tap::Taps>),
    ) -> Arc<Link> {
        let early_start = handshake.is_some();
        let handshake = handshake.unwrap_or_else(|| watch::channel(Handshake::Complete).1);
        Arc::new(Link {
            handshake,
            early_start,
            early: Arc::default(),
            conn,
            switch,
            services,
            mode: sched.mode,
            relaxed: sched.relaxed,
            coalesce: sched.coalesce,
            local_connect_timeout,
            next_session: AtomicU64::new(0),
            routes: Mutex::new(Routes::default()),
            metrics,
            taps,
        })
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn on_switch(&self) -> bool {
        self.services.role == Opener::Switch
    }

    fn names(&self) -> (&'static str, &'static str) {
        if self.on_switch() {
            ("OVS", "controller agent")
        } else {
            ("controller", "switch agent")
        }
    }

    fn info(&self, service: &Arc<Service>, id: u64, mode: StreamMode, opener: bool) -> SessionInfo {
        let (local_name, remote_name) = self.names();
        SessionInfo {
            switch: self.switch.clone(),
            service: service.clone(),
            id,
            local_name,
            remote_name,
            mode,
            opener,
            direction: if self.on_switch() {
                Direction::ToController
            } else {
                Direction::ToSwitch
            },
            relaxed: self.relaxed,
            coalesce: self
                .coalesce
                .map(|w| CoalesceConfig::new(w, coalesce_epoch())),
            metrics: self.metrics.clone(),
            taps: self.taps.clone(),
            hello: None,
        }
    }

    /// Registers a session's route; the returned guard removes it.
    fn route(&self, key: SessionKey) -> (Route<'_>, mpsc::UnboundedReceiver<Box<IncomingLane>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut routes = self.routes();
        if !key.0 {
            for lane in routes.early.remove(&key.1).unwrap_or_default() {
                let _ = tx.send(Box::new(lane));
            }
        }
        routes.sessions.insert(key, tx);
        (Route { link: self, key }, rx)
    }

    /// Sessions this connection carries now.
    pub fn session_count(&self) -> usize {
        self.routes().sessions.len()
    }

    /// True once the handshake has completed.
    pub fn is_confirmed(&self) -> bool {
        *self.handshake.borrow() != Handshake::Pending
    }

    /// The 0-RTT gate for a session starting now, if the handshake is not
    /// complete: the switch agent gates what it sends, the controller agent what
    /// it delivers.
    fn early_gate(&self) -> Option<Early> {
        (!self.is_confirmed()).then(|| Early {
            handshake: self.handshake.clone(),
            outgoing: self.on_switch(),
            stats: self.early.clone(),
        })
    }

    /// True while the connection is usable.
    pub fn is_alive(&self) -> bool {
        self.conn.close_reason().is_none()
    }

    /// Serves streams the peer opens until the connection closes, and returns why
    /// it closed. A connection whose peer has not answered for the grace
    /// period (`quic.idle_timeout`, counted as QUIC counts idleness), or up
    /// to twice it while the RTT estimate shows a busy peer, is closed here,
    /// with [`code::SILENT`], even when quinn's idle timer would wait longer
    /// ([`liveness`]); that ending is returned as
    /// [`quinn::ConnectionError::TimedOut`].
    ///
    /// `first_answer`: how long the peer may take to answer at all, if longer
    /// (a switch agent's 0-RTT attempt, queued at a busy controller agent).
    pub async fn serve(
        self: Arc<Self>,
        quic: &QuicOptions,
        first_answer: Option<Duration>,
    ) -> quinn::ConnectionError {
        // The switch agent checks its one connection every eighth of the
        // grace period; the controller agent every half, as 10,000 idle
        // connections checked every eighth cost it 4 points of a core more
        // (docs/scale.md, "A dead peer after a storm").
        let checks = if self.on_switch() { 8 } else { 2 };
        let grace = quic.idle_timeout;
        let silence = liveness::silence(&self.conn, grace, checks, first_answer, |late| {
            let said = format!(
                "the {} answered only after {:.1}s, past the grace period of {:.1}s (counted as \
                 the limit is, from this agent's ask; kept: the limit was {:.1}s)",
                self.names().1,
                late.after.as_secs_f64(),
                grace.as_secs_f64(),
                late.limit.as_secs_f64(),
            );
            let rtt_ms = late.rtt.as_millis();
            // Only the switch agent's line says the peer is busy. The
            // controller agent checks every 3 s, and in a storm its own
            // backlog shows as late answers from thousands of switch agents
            // (7,886 in 15 runs of 10,000 switches, 96 % at exactly two
            // checks: docs/scale.md, "How late a busy peer answers").
            if self.on_switch() {
                info!(switch = %self.switch, rtt_ms, "{said}: it is busy");
            } else {
                debug!(switch = %self.switch, rtt_ms, "{said}");
            }
        });
        tokio::pin!(silence);
        loop {
            tokio::select! {
                s = &mut silence => {
                    warn!(
                        switch = %self.switch,
                        rtt_ms = s.rtt.as_millis(),
                        "nothing from the {} for {:.1}s, nor for {:.1}s since this agent last asked for \
                         an answer (the grace period of {:.1}s, or three probe timeouts of the RTT \
                         estimate, which a busy peer's queueing inflates, up to twice the grace period): \
                         giving the connection up",
                        self.names().1,
                        s.silent.as_secs_f64(),
                        s.limit.as_secs_f64(),
                        grace.as_secs_f64(),
                    );
                    self.conn.close(VarInt::from_u32(code::SILENT), b"silent past the grace period");
                    return quinn::ConnectionError::TimedOut;
                }
                bi = self.conn.accept_bi() => match bi {
                    Ok((send, recv)) => {
                        tokio::spawn(self.clone().incoming(send, recv));
                    }
                    Err(e) => return e,
                },
                uni = self.conn.accept_uni() => match uni {
                    Ok(recv) => {
                        tokio::spawn(self.clone().incoming_uni(recv));
                    }
                    Err(e) => return e,
                },
            }
        }
    }

    /// Opens a session for a local connection this agent accepted, with what
    /// was read from it already (`preread`, after a rejected 0-RTT). Returns
    /// [`Outcome::Retry`] if the controller agent rejected the 0-RTT data this
    /// session started in: the caller starts it again on the next connection.
    pub async fn open_session(
        self: Arc<Self>,
        service: Arc<Service>,
        local: (LocalRead, LocalWrite),
        preread: Bytes,
        hello: Option<session::HelloWatch>,
    ) -> Outcome {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        // A raw byte stream has no message boundaries to schedule by.
        let mode = if service.framing.has_boundaries() {
            self.mode
        } else {
            StreamMode::Ordered
        };
        let preamble = SessionPreamble {
            session: id,
            mode: mode.to_wire(),
            service: service.name.to_string(),
        };
        let (_route, lanes) = self.route((true, id));
        let early = self.early_gate();
        let opened = async {
            let (mut send, recv) = self.conn.open_bi().await?;
            send.write_all(&preamble.encode()).await?;
            Ok::<_, quinn::WriteError>((send, recv))
        }
        .await;
        let (send, recv) = match opened {
            Ok(streams) => streams,
            Err(quinn::WriteError::ZeroRttRejected) => {
                return Outcome::Retry {
                    local,
                    replay: preread,
                };
            }
            // Refused by admission control before the handshake: nothing arrived.
            Err(quinn::WriteError::ConnectionLost(e)) if crate::switch::is_refusal(&e) => {
                return Outcome::Retry {
                    local,
                    replay: preread,
                };
            }
            Err(e) => {
                info!(
                    switch = %self.switch, service = %service.name, session = id,
                    "{} connection closed: cannot open a session: {e}", self.names().0
                );
                return Outcome::Done;
            }
        };
        let streams = SessionStreams {
            send,
            recv,
            initial: Bytes::new(),
            lanes,
        };
        let info = SessionInfo {
            hello,
            ..self.info(&service, id, mode, true)
        };
        session::run(info, self.conn.clone(), local, streams, early, preread).await
    }

    /// The switch agent's side of the hello exchange: sends ours, waits for the
    /// controller agent's, and logs any service mismatch.
    ///
    /// The answer also proves the controller agent accepted our certificate: in TLS
    /// 1.3 the client finishes its handshake before the server has verified the
    /// client's certificate (RFC 8446 §4.4.2–§4.4.4), and a server that rejects it
    /// only closes the connection afterwards. A connection only counts as up once
    /// the peer has spoken on it.
    pub async fn hello_as_client(&self) -> Result<Hello, String> {
        let hello = self.services.hello(self.mode);
        let exchange = async {
            let (mut send, mut recv) = self.conn.open_bi().await.map_err(|e| e.to_string())?;
            send.write_all(&hello.encode())
                .await
                .map_err(|e| e.to_string())?;
            let _ = send.finish();
            let r = read_start(&mut recv).await;
            match r? {
                (StreamStart::Control(theirs), _) => Ok(theirs),
                _ => Err("the peer answered the hello with something else".to_string()),
            }
        };
        let result = exchange.await.map_err(|e| match self.conn.close_reason() {
            // The connection's own close reason says more than the stream error.
            Some(reason) => reason.to_string(),
            None => e,
        });
        if let Ok(theirs) = &result {
            self.check_hello(theirs);
        }
        result
    }

    fn check_hello(&self, theirs: &Hello) {
        let (_, remote) = self.names();
        info!(
            switch = %self.switch,
            peer_agent = %theirs.agent,
            peer_streams = %theirs.streams,
            "{remote} serves: {}",
            theirs.services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
        );
        for problem in self.services.compare(theirs) {
            warn!(switch = %self.switch, "{problem}");
        }
        // Our stream limits fit our own mode; sessions the peer opens follow
        // its mode, which may need more lanes. Until now they waited for
        // credit (RFC 9000 §4.6: MAX_STREAMS), which never fails a session.
        match theirs.streams.parse::<StreamMode>() {
            Ok(mode) => {
                let (ours, needed) = (
                    self.services.stream_limits(self.mode),
                    self.services.stream_limits(mode),
                );
                if needed.uni > ours.uni {
                    self.conn
                        .set_max_concurrent_uni_streams(VarInt::from_u32(needed.uni));
                }
            }
            Err(e) => {
                warn!(switch = %self.switch, "the peer's hello names an unknown stream mode: {e}")
            }
        }
    }

    async fn incoming(self: Arc<Self>, mut send: SendStream, mut recv: RecvStream) {
        let (start, initial) = match read_start(&mut recv).await {
            Ok(x) => x,
            Err(e) => {
                warn!(switch = %self.switch, "refused a stream from the {}: {e}", self.names().1);
                session::refuse(send, recv, code::BAD_PREAMBLE);
                return;
            }
        };
        match start {
            StreamStart::Control(theirs) => {
                if !self.on_switch() {
                    let _ = send
                        .write_all(&self.services.hello(self.mode).encode())
                        .await;
                    let _ = send.finish();
                }
                self.check_hello(&theirs);
            }
            StreamStart::Session(p) => self.incoming_session(p, send, recv, initial).await,
            StreamStart::Lane(_) => {
                warn!(switch = %self.switch, "refused a lane preamble on a bidirectional stream");
                session::refuse(send, recv, code::BAD_PREAMBLE);
            }
        }
    }

    async fn incoming_session(
        self: Arc<Self>,
        p: SessionPreamble,
        send: SendStream,
        recv: RecvStream,
        initial: Bytes,
    ) {
        let (_, remote) = self.names();
        let refuse = |send, recv, c: u32, why: String| {
            warn!(switch = %self.switch, service = %p.service, session = p.session, "refused a session from the {remote}: {why}");
            session::refuse(send, recv, c);
            // Lanes of the refused session that came first go with it.
            for l in self.routes().early.remove(&p.session).unwrap_or_default() {
                let mut recv = l.recv;
                let _ = recv.stop(VarInt::from_u32(c));
            }
        };
        let Some(service) = self.services.get(&p.service).cloned() else {
            let why = format!(
                "unknown service (this agent serves: {})",
                self.services.names()
            );
            return refuse(send, recv, code::UNKNOWN_SERVICE, why);
        };
        if service.opener == self.services.role {
            let why = "sessions of this service are opened by this side (its target here is a listening one)";
            return refuse(send, recv, code::WRONG_DIRECTION, why.into());
        }
        let Some(mode) = StreamMode::from_wire(p.mode.0, p.mode.1) else {
            return refuse(
                send,
                recv,
                code::BAD_PREAMBLE,
                format!("unknown stream mode {:?}", p.mode),
            );
        };
        if mode != StreamMode::Ordered && !service.framing.has_boundaries() {
            return refuse(
                send,
                recv,
                code::BAD_PREAMBLE,
                "a raw service cannot use several lanes".into(),
            );
        }
        // Route lanes from now on, so none is lost while the local peer is dialled.
        let (route, lanes) = self.route((false, p.session));
        let target = service.target.for_switch(&self.switch);
        let (local_name, _) = self.names();
        let failure = match tokio::time::timeout(
            self.local_connect_timeout,
            LocalStream::connect(&target),
        )
        .await
        {
            Ok(Ok(local)) => {
                debug!(switch = %self.switch, service = %service.name, session = p.session, %target, "connected locally");
                let streams = SessionStreams {
                    send,
                    recv,
                    initial,
                    lanes,
                };
                let info = self.info(&service, p.session, mode, false);
                let early = self.early_gate();
                // Only the opener (the switch agent) starts a session again after a
                // rejected 0-RTT; the controller agent never sees one.
                let _ = session::run(
                    info,
                    self.conn.clone(),
                    local.into_split(),
                    streams,
                    early,
                    Bytes::new(),
                )
                .await;
                drop(route);
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.local_connect_timeout),
        };
        warn!(
            switch = %self.switch, service = %service.name, session = p.session,
            "cannot reach the {local_name} at {target}: {failure}; refusing the session"
        );
        session::refuse(send, recv, code::LOCAL_CONNECT_FAILED);
    }

    /// A lane stream: hand it to its session, or hold it briefly if its session
    /// stream has not been read yet.
    async fn incoming_uni(self: Arc<Self>, mut recv: RecvStream) {
        let (start, initial) = match read_start(&mut recv).await {
            Ok(x) => x,
            Err(e) => {
                warn!(switch = %self.switch, "refused a stream from the {}: {e}", self.names().1);
                let _ = recv.stop(VarInt::from_u32(code::BAD_PREAMBLE));
                return;
            }
        };
        let StreamStart::Lane(p) = start else {
            warn!(switch = %self.switch, "refused a unidirectional stream that is not a lane");
            let _ = recv.stop(VarInt::from_u32(code::BAD_PREAMBLE));
            return;
        };
        let lane = Box::new(IncomingLane {
            lane: p.lane as usize,
            recv,
            initial,
        });
        // The peer's "opened by the sender" means opened by the peer, not by us.
        let key = (!p.opened_by_sender, p.session);
        let mut routes = self.routes();
        if let Some(tx) = routes.sessions.get(&key) {
            if let Err(mpsc::error::SendError(lane)) = tx.send(lane) {
                let mut recv = lane.recv;
                let _ = recv.stop(VarInt::from_u32(code::LOCAL_ABORT));
            }
            return;
        }
        if key.0 {
            // One of our sessions that has already ended.
            let mut recv = lane.recv;
            let _ = recv.stop(VarInt::from_u32(code::LOCAL_ABORT));
            return;
        }
        routes.early.entry(p.session).or_default().push(*lane);
        drop(routes);
        tokio::spawn(self.clone().expire_early(p.session));
    }

    async fn expire_early(self: Arc<Self>, session: u64) {
        tokio::time::sleep(PREAMBLE_TIMEOUT).await;
        let stale = self.routes().early.remove(&session);
        if let Some(lanes) = stale {
            warn!(
                switch = %self.switch, session,
                "refused {} lane(s) from the {}: their session never arrived within {PREAMBLE_TIMEOUT:?}",
                lanes.len(),
                self.names().1
            );
            for l in lanes {
                let mut recv = l.recv;
                let _ = recv.stop(VarInt::from_u32(code::BAD_PREAMBLE));
            }
        }
    }
}

/// Reads a stream's preamble, returning it and whatever bytes followed it.
async fn read_start(recv: &mut RecvStream) -> Result<(StreamStart, Bytes), String> {
    let mut buf = BytesMut::new();
    let read = async {
        loop {
            if let Some((start, n)) = StreamStart::decode(&buf).map_err(|e| e.to_string())? {
                let _ = buf.split_to(n);
                return Ok((start, buf.freeze()));
            }
            match recv.read_chunk(usize::MAX, true).await {
                Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
                Ok(None) => return Err("stream ended before its preamble".to_string()),
                Err(e) => return Err(format!("stream failed before its preamble: {e}")),
            }
        }
    };
    tokio::time::timeout(PREAMBLE_TIMEOUT, read)
        .await
        .map_err(|_| format!("no preamble within {PREAMBLE_TIMEOUT:?}"))?
}
