//! The agents over plain UDP (`--transport udp --udp-profile seed|robust`),
//! with [`quicsdn_udp`]'s reliability layer instead of QUIC. Unauthenticated
//! and unencrypted: the agents refuse it without `--allow-unauthenticated`.
//!
//! One association per switch. Towards OVS and the controller everything is
//! as over QUIC: the same services, targets and framing; one local connection
//! per session; EOF passed on; a malformed message closes only its session
//! after everything before it; losing the association closes OVS's
//! connections so OVS sees the controller go, and the switch agent reconnects
//! with backoff.
//!
//! On the wire (see [`quicsdn_udp::packet`]):
//! * HELLO / HELLO_ACK carry [`UdpHello`]: the switch's name (unauthenticated:
//!   it is whatever the switch agent says) and the agents' service offers.
//! * Channel 0 carries [`ControlMsg`] as JSON: a session opens with `open`;
//!   the other side answers a failure with `refuse`.
//! * Session `id` opened by the switch side uses channel `1 + 2·id`, by the
//!   controller side `2 + 2·id`. Each local message is one channel message
//!   (`Data`); the local EOF is a `Fin`; a session given up is an `Abort`
//!   carrying the reason.
//!
//! Every session's send side holds at most [`SEND_CREDIT`] unacknowledged
//! messages, and at most [`RECV_QUEUE`] received chunks wait for the local
//! socket: when either fills, the agent stops reading that local socket or
//! stops taking that channel's chunks (whose receive window then closes).

use crate::config::{ControllerConfig, SwitchConfig};
use crate::services::{Service, ServiceTable};
use crate::{AgentError, Shutdown};
use bytes::BytesMut;
use quicsdn_transport::backoff::Backoff;
use quicsdn_transport::local::{LocalListener, LocalRead, LocalStream, LocalWrite};
use quicsdn_udp::assoc::{CONTROL, code};
use quicsdn_udp::channel::Chunk;
use quicsdn_udp::{Association, CloseReason, Config, Event, MessageKind, Profile};
use quicsdn_wire::framing::Framer;
use quicsdn_wire::preamble::{Hello, Opener};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

/// Unacknowledged messages one session may have outstanding.
pub const SEND_CREDIT: usize = 1024;
/// Received chunks one session may have waiting for its local socket.
pub const RECV_QUEUE: usize = 64;

/// What HELLO and HELLO_ACK carry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UdpHello {
    /// The switch's name (the switch agent's; empty from the controller agent).
    pub switch: String,
    pub hello: Hello,
}

/// Messages on channel 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlMsg {
    Open { session: u64, service: String },
    Refuse { channel: u16, reason: String },
}

fn channel_of(session: u64, opener: Opener) -> Option<u16> {
    let base = 1 + 2 * session + u64::from(opener == Opener::Controller);
    u16::try_from(base).ok()
}

fn udp_config(profile: Profile, common: &crate::CommonConfig) -> Config {
    let mut c = Config::new(profile);
    // The UDP transport's liveness probes start after one keepalive interval
    // of silence and need the rest of the grace period to tell loss from death,
    // so the QUIC agents' default (just short of the grace period, see
    // `agent_keepalive_for`) becomes half of it here; an explicit other
    // --keepalive stands.
    let grace = common.quic.idle_timeout;
    c.keepalive = if common.quic.keepalive == quicsdn_transport::quic::agent_keepalive_for(grace) {
        quicsdn_transport::quic::keepalive_for(grace)
    } else {
        common.quic.keepalive
    };
    c.idle_timeout = grace;
    c
}

/// What drives one association: sessions send it commands.
enum Cmd {
    Datagram(Vec<u8>),
    Attach(u16, SessionPort),
    Send(u16, MessageKind, Vec<u8>),
    Control(ControlMsg),
    /// The session ended: its channel's counters go back to it.
    Detach(
        u16,
        tokio::sync::oneshot::Sender<Option<quicsdn_udp::ChannelStats>>,
    ),
    Close(u16, String),
}

/// The driver's end of one session.
struct SessionPort {
    to_local: mpsc::UnboundedSender<Chunk>,
    credit: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
    service: String,
}

/// What sessions and listeners hold of an association.
#[derive(Clone)]
struct Handle {
    cmds: mpsc::UnboundedSender<Cmd>,
    /// Sessions wake the driver after writing locally (room in their queue).
    wake: Arc<Notify>,
    switch: Arc<str>,
    side: Opener,
    next_session: Arc<AtomicU64>,
    closed: watch::Receiver<bool>,
}

impl Handle {
    /// A handle on a new association's driver, with the driver's ends: its
    /// command queue and the sender of its `closed` flag.
    fn new(
        switch: Arc<str>,
        side: Opener,
    ) -> (Handle, mpsc::UnboundedReceiver<Cmd>, watch::Sender<bool>) {
        let (cmds_tx, cmds) = mpsc::unbounded_channel();
        let (closed_tx, closed) = watch::channel(false);
        let handle = Handle {
            cmds: cmds_tx,
            wake: Arc::new(Notify::new()),
            switch,
            side,
            next_session: Arc::new(AtomicU64::new(0)),
            closed,
        };
        (handle, cmds, closed_tx)
    }
}

/// Everything an association's sessions need to know.
struct Ctx {
    services: Arc<ServiceTable>,
    local_connect_timeout: Duration,
}

fn names(side: Opener) -> (&'static str, &'static str) {
    match side {
        Opener::Switch => ("OVS", "controller agent"),
        Opener::Controller => ("controller", "switch agent"),
    }
}

/// Runs one association until it closes; returns why.
#[allow(clippy::too_many_arguments)] // One driver's parts, named at its two callers.
async fn drive(
    mut assoc: Association,
    socket: Arc<UdpSocket>,
    peer: SocketAddr,
    handle: Handle,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    ctx: Arc<Ctx>,
    connected: Option<tokio::sync::oneshot::Sender<UdpHello>>,
    closed: watch::Sender<bool>,
) -> CloseReason {
    let mut connected = connected;
    let mut ports: HashMap<u16, SessionPort> = HashMap::new();
    let mut draining: Vec<u16> = Vec::new();
    let mut bad_logged = 0u32;
    let (local, remote) = names(handle.side);
    let reason = loop {
        let now = Instant::now();
        while let Some(d) = assoc.poll_transmit(now) {
            if let Err(e) = socket.send_to(&d, peer).await {
                warn!(switch = %handle.switch, "UDP send to {peer} failed: {e}");
            }
        }
        let mut ended = None;
        while let Some(ev) = assoc.poll_event() {
            match ev {
                Event::Connected { hello } => {
                    if let Some(tx) = connected.take() {
                        match serde_json::from_slice::<UdpHello>(&hello) {
                            Ok(h) => {
                                let _ = tx.send(h);
                            }
                            Err(e) => {
                                assoc.close(code::REFUSED, &format!("invalid hello: {e}"));
                            }
                        }
                    }
                }
                Event::Closed(why) => ended = Some(why),
            }
        }
        if let Some(why) = ended {
            // Flush the CLOSE, if there is one.
            while let Some(d) = assoc.poll_transmit(Instant::now()) {
                let _ = socket.send_to(&d, peer).await;
            }
            break why;
        }
        // Control messages from the peer.
        while let Some(c) = assoc.recv(CONTROL) {
            match serde_json::from_slice::<ControlMsg>(&c.payload) {
                Ok(ControlMsg::Open { session, service }) => {
                    let peer_side = match handle.side {
                        Opener::Switch => Opener::Controller,
                        Opener::Controller => Opener::Switch,
                    };
                    match channel_of(session, peer_side) {
                        Some(ch) => {
                            tokio::spawn(incoming_session(
                                handle.clone(),
                                ctx.clone(),
                                ch,
                                session,
                                service,
                            ));
                        }
                        None => assoc.close(code::PROTOCOL_VIOLATION, "session id out of range"),
                    }
                }
                Ok(ControlMsg::Refuse { channel, reason }) => {
                    warn!(switch = %handle.switch, channel, "the {remote} refused a session: {reason}");
                    if let Some(p) = ports.remove(&channel) {
                        let _ = p.to_local.send(Chunk {
                            kind: MessageKind::Abort,
                            seq: 0,
                            payload: reason.into_bytes(),
                            end: true,
                        });
                    }
                    assoc.end_channel(channel);
                }
                Err(e) => {
                    assoc.close(
                        code::PROTOCOL_VIOLATION,
                        &format!("invalid control message: {e}"),
                    );
                }
            }
        }
        // Chunks to sessions with room, acknowledged messages back as credit.
        for ch in assoc.readable() {
            if let Some(p) = ports.get(&ch) {
                while p.queued.load(Ordering::Acquire) < RECV_QUEUE {
                    let Some(c) = assoc.recv(ch) else { break };
                    p.queued.fetch_add(1, Ordering::AcqRel);
                    let _ = p.to_local.send(c);
                }
            }
        }
        for (ch, p) in ports.iter() {
            let n = assoc.take_released(*ch);
            if n > 0 {
                p.credit.add_permits(n as usize);
            }
        }
        draining.retain(|ch| {
            if assoc.outstanding(*ch) == 0 {
                assoc.end_channel(*ch);
                false
            } else {
                true
            }
        });
        if assoc.wants_to_send() {
            continue;
        }
        let deadline = assoc.poll_timeout();
        let sleep = async {
            match deadline {
                Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                None => {
                    assoc.close(code::SHUTDOWN, "agent shutting down");
                }
                Some(Cmd::Datagram(d)) => {
                    if let Err(e) = assoc.handle_datagram(Instant::now(), &d) {
                        // Malformed datagrams change nothing; say so, without flooding.
                        if bad_logged < 10 {
                            bad_logged += 1;
                            warn!(switch = %handle.switch, "ignored a malformed datagram from {peer}: {e}");
                        }
                    }
                }
                Some(Cmd::Attach(ch, port)) => {
                    ports.insert(ch, port);
                }
                Some(Cmd::Send(ch, kind, payload)) => {
                    if let Err(e) = assoc.send(ch, kind, payload)
                        && let Some(p) = ports.get(&ch)
                    {
                        {
                            error!(switch = %handle.switch, service = %p.service, "cannot send: {e}; closing the session");
                            let _ = p.to_local.send(Chunk { kind: MessageKind::Abort, seq: 0, payload: e.to_string().into_bytes(), end: true });
                        }
                    }
                }
                Some(Cmd::Control(m)) => {
                    let _ = assoc.send(CONTROL, MessageKind::Data, serde_json::to_vec(&m).expect("serialises"));
                }
                Some(Cmd::Detach(ch, stats)) => {
                    ports.remove(&ch);
                    let _ = stats.send(assoc.stats(ch));
                    draining.push(ch);
                }
                Some(Cmd::Close(c, why)) => assoc.close(c, &why),
            },
            _ = handle.wake.notified() => {}
            _ = sleep => assoc.handle_timeout(Instant::now()),
        }
    };
    let _ = closed.send(true);
    match &reason {
        CloseReason::Local {
            code: code::SHUTDOWN,
            ..
        } => {}
        r => {
            warn!(switch = %handle.switch, "association with the {remote} ended: {r}; closing {local}'s connections")
        }
    }
    reason
}

/// A session the peer opened: dial the local target, then run it.
async fn incoming_session(h: Handle, ctx: Arc<Ctx>, ch: u16, session: u64, service: String) {
    let (_, remote) = names(h.side);
    let refuse = |reason: String| {
        warn!(switch = %h.switch, service = %service, session, "refused a session from the {remote}: {reason}");
        let _ = h.cmds.send(Cmd::Control(ControlMsg::Refuse {
            channel: ch,
            reason,
        }));
    };
    let Some(svc) = ctx.services.get(&service).cloned() else {
        return refuse(format!(
            "unknown service (this agent serves: {})",
            ctx.services.names()
        ));
    };
    if svc.opener == h.side {
        return refuse("sessions of this service are opened by this side".into());
    }
    let target = svc.target.for_switch(&h.switch);
    match tokio::time::timeout(ctx.local_connect_timeout, LocalStream::connect(&target)).await {
        Ok(Ok(local)) => run_session(h, svc, ch, session, local).await,
        Ok(Err(e)) => refuse(format!(
            "cannot reach the {} at {target}: {e}",
            names(h.side).0
        )),
        Err(_) => refuse(format!(
            "the {} at {target} did not answer within {:?}",
            names(h.side).0,
            ctx.local_connect_timeout
        )),
    }
}

/// A local connection this side accepted: open its session.
async fn open_session(h: Handle, svc: Arc<Service>, local: LocalStream) {
    let session = h.next_session.fetch_add(1, Ordering::Relaxed);
    let Some(ch) = channel_of(session, h.side) else {
        error!(switch = %h.switch, "session ids exhausted on this association; closing it");
        let _ = h.cmds.send(Cmd::Close(
            code::PROTOCOL_VIOLATION,
            "session ids exhausted".into(),
        ));
        return;
    };
    let _ = h.cmds.send(Cmd::Control(ControlMsg::Open {
        session,
        service: svc.name.to_string(),
    }));
    run_session(h, svc, ch, session, local).await;
}

/// Joins a local connection to its channel until both directions end.
async fn run_session(h: Handle, svc: Arc<Service>, ch: u16, session: u64, local: LocalStream) {
    let (local_name, remote) = names(h.side);
    info!(switch = %h.switch, service = %svc.name, session, "session opened");
    let (to_local, from_assoc) = mpsc::unbounded_channel();
    let credit = Arc::new(Semaphore::new(SEND_CREDIT));
    let queued = Arc::new(AtomicUsize::new(0));
    let port = SessionPort {
        to_local,
        credit: credit.clone(),
        queued: queued.clone(),
        service: svc.name.to_string(),
    };
    if h.cmds.send(Cmd::Attach(ch, port)).is_err() {
        return;
    }
    let (rd, wr) = local.into_split();
    let out = pump_out(&h, &svc, ch, rd, credit);
    let inn = pump_in(&h, wr, from_assoc, queued);
    tokio::pin!(out, inn);
    let (mut out_end, mut in_end) = (None, None);
    while out_end.is_none() || in_end.is_none() {
        tokio::select! {
            e = &mut out, if out_end.is_none() => out_end = Some(e),
            e = &mut inn, if in_end.is_none() => {
                let stop = !matches!(e, In::Finished);
                in_end = Some(e);
                // The far side gave the session up or the association ended: the
                // local connection closes now, whatever it still sends.
                if stop && out_end.is_none() {
                    out_end = Some(Out::Stopped);
                }
            }
        }
    }
    let (out_end, in_end) = (out_end.expect("set"), in_end.expect("set"));
    // Our direction did not end with a FIN or an abort already (the local
    // connection failed, or the session was given up here): tell the other agent,
    // so it closes its local connection too. Harmless if it has ended already.
    if matches!(out_end, Out::Io(_) | Out::Stopped) {
        let why = match (&out_end, &in_end) {
            (Out::Io(e), _) | (_, In::Io(e)) => format!("the {local_name} connection failed: {e}"),
            (_, In::Aborted(why)) => why.clone(),
            _ => format!("the {remote} ended the session"),
        };
        let _ = h
            .cmds
            .send(Cmd::Send(ch, MessageKind::Abort, why.into_bytes()));
    }
    let (stats_tx, stats_rx) = tokio::sync::oneshot::channel();
    let _ = h.cmds.send(Cmd::Detach(ch, stats_tx));
    let (svc_name, sw) = (&svc.name, &h.switch);
    // One line per session with its channel's counters (zero if it carried
    // nothing, or the association is gone); the lab's table2 bench reads them.
    let s = stats_rx.await.ok().flatten().unwrap_or_default();
    info!(
        switch = %sw, service = %svc_name, session, channel = ch,
        sent = s.messages_sent, packets = s.packets_sent, retransmits = s.retransmits,
        given_up = s.given_up, received = s.packets_received, duplicates = s.duplicates,
        out_of_order = s.out_of_order, srtt_ms = s.srtt.map(|d| d.as_secs_f64() * 1e3),
        "udp channel counters"
    );
    match (out_end, in_end) {
        (Out::Finished(n), In::Finished) => {
            info!(switch = %sw, service = %svc_name, session, messages_out = n, "session closed")
        }
        (Out::Malformed(e), _) => {
            warn!(switch = %sw, service = %svc_name, session, "session closed: the {local_name} sent a malformed message: {e}")
        }
        (_, In::Aborted(why)) => {
            warn!(switch = %sw, service = %svc_name, session, "session closed by the {remote}: {why}")
        }
        (_, In::Lost) => {
            warn!(switch = %sw, service = %svc_name, session, "session closed: the association with the {remote} ended")
        }
        (Out::Io(e), _) | (_, In::Io(e)) => {
            info!(switch = %sw, service = %svc_name, session, "session closed: the {local_name} connection failed: {e}")
        }
        (Out::Stopped, _) => {
            info!(switch = %sw, service = %svc_name, session, "session closed")
        }
    }
}

enum Out {
    Finished(u64),
    Malformed(String),
    Io(std::io::Error),
    Stopped,
}

enum In {
    Finished,
    Aborted(String),
    Lost,
    Io(std::io::Error),
}

/// Local socket → messages → channel.
async fn pump_out(
    h: &Handle,
    svc: &Service,
    ch: u16,
    mut rd: LocalRead,
    credit: Arc<Semaphore>,
) -> Out {
    let mut framer = Framer::new(svc.framing, svc.max_message);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut messages = 0u64;
    let send = |kind, payload: Vec<u8>| h.cmds.send(Cmd::Send(ch, kind, payload)).is_ok();
    loop {
        let n = match rd.read_buf(&mut buf).await {
            Ok(n) => n,
            Err(e) => return Out::Io(e),
        };
        loop {
            let len = match framer.next_message(&buf) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(e) => {
                    // Everything before it went; then the far side is told why.
                    send(
                        MessageKind::Abort,
                        format!("the {} sent a malformed message: {e}", names(h.side).0)
                            .into_bytes(),
                    );
                    return Out::Malformed(e.to_string());
                }
            };
            let msg = buf.split_to(len);
            match credit.acquire().await {
                Ok(p) => p.forget(),
                Err(_) => return Out::Stopped,
            }
            if !send(MessageKind::Data, msg.to_vec()) {
                return Out::Stopped;
            }
            messages += 1;
        }
        if n == 0 {
            send(MessageKind::Fin, Vec::new());
            return Out::Finished(messages);
        }
    }
}

/// Channel → local socket.
async fn pump_in(
    h: &Handle,
    mut wr: LocalWrite,
    mut rx: mpsc::UnboundedReceiver<Chunk>,
    queued: Arc<AtomicUsize>,
) -> In {
    loop {
        let Some(c) = rx.recv().await else {
            return In::Lost;
        };
        queued.fetch_sub(1, Ordering::AcqRel);
        h.wake.notify_one();
        match c.kind {
            MessageKind::Data => {
                if let Err(e) = wr.write_all(&c.payload).await {
                    return In::Io(e);
                }
            }
            MessageKind::Fin => {
                let _ = wr.shutdown().await;
                return In::Finished;
            }
            MessageKind::Abort => {
                return In::Aborted(String::from_utf8_lossy(&c.payload).into_owned());
            }
        }
    }
}

/// A UDP socket with large buffers (seed has no window: bursts must not
/// overflow the kernel's default buffer).
fn bind_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = quicsdn_transport::quic::udp_socket(addr)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

fn own_hello(services: &ServiceTable, switch: &str) -> Vec<u8> {
    serde_json::to_vec(&UdpHello {
        switch: switch.to_string(),
        hello: services.hello(quicsdn_lanes::StreamMode::Ordered),
    })
    .expect("serialises")
}

/// A running switch agent over UDP.
pub struct UdpSwitchAgent {
    pub identity: Arc<str>,
    /// Where each locally listening service actually listens.
    pub listeners: Vec<(String, quicsdn_transport::Target)>,
    shutdown: Shutdown,
    tasks: JoinSet<()>,
    state: watch::Receiver<Option<Handle>>,
}

impl UdpSwitchAgent {
    pub async fn start(
        config: SwitchConfig,
        profile: Profile,
    ) -> Result<UdpSwitchAgent, AgentError> {
        config.validate()?;
        let identity: Arc<str> = match &config.switch_name {
            Some(n) => n.as_str().into(),
            None => match quicsdn_transport::tls::Credentials::load(&config.common.tls) {
                Ok(c) => c.identity.into(),
                Err(e) => {
                    return Err(AgentError::Config(crate::config::ConfigError::Invalid(
                        format!(
                            "--transport udp needs the switch's name: give --switch-name (or a --cert to take it from): {e}"
                        ),
                    )));
                }
            },
        };
        warn!(switch = %identity, "--transport udp --udp-profile {profile}: the channel to the controller agent is neither authenticated nor encrypted");
        let services = Arc::new(ServiceTable::new(&config.common, Opener::Switch));
        let mut listeners = Vec::new();
        for svc in services.opened_here() {
            let target = svc.target.for_switch(&identity);
            let l = LocalListener::bind(&target)
                .await
                .map_err(|e| AgentError::Listen {
                    service: svc.name.to_string(),
                    target: target.to_string(),
                    reason: e.to_string(),
                })?;
            listeners.push((svc.clone(), l));
        }
        let (state_tx, state) = watch::channel(None::<Handle>);
        let state_tx = Arc::new(state_tx);
        let kick = Arc::new(Notify::new());
        let shutdown = Shutdown::new();
        let mut tasks = JoinSet::new();
        let mut bound = Vec::new();
        for (svc, l) in listeners {
            bound.push((svc.name.to_string(), l.local_target()));
            info!(switch = %identity, service = %svc.name, listen = %l.local_target(), "waiting for OVS");
            let (state, kick, shutdown) = (state.clone(), kick.clone(), shutdown.clone());
            tasks.spawn(async move {
                loop {
                    let local = tokio::select! {
                        _ = shutdown.wait() => return,
                        a = l.accept() => match a {
                            Ok(s) => s,
                            Err(e) => { warn!(service = %svc.name, "accept failed: {e}"); continue; }
                        },
                    };
                    let mut st = state.clone();
                    if st.borrow().is_none() {
                        kick.notify_one();
                    }
                    // One attempt's worth of waiting, then OVS's own backoff applies.
                    let h = tokio::time::timeout(Duration::from_secs(3), st.wait_for(|s| s.is_some())).await;
                    match h {
                        Ok(Ok(h)) => {
                            let h = h.clone().expect("some");
                            tokio::spawn(open_session(h, svc.clone(), local));
                        }
                        _ => info!(service = %svc.name, "OVS connection closed: the controller agent is unreachable"),
                    }
                }
            });
        }
        let ctx = Arc::new(Ctx {
            services: services.clone(),
            local_connect_timeout: config.common.local_connect_timeout,
        });
        tasks.spawn(manage(
            config,
            profile,
            identity.clone(),
            services,
            ctx,
            state_tx,
            kick,
            shutdown.clone(),
        ));
        Ok(UdpSwitchAgent {
            identity,
            listeners: bound,
            shutdown,
            tasks,
            state,
        })
    }

    pub fn is_connected(&self) -> bool {
        self.state.borrow().is_some()
    }

    pub async fn shutdown(mut self) {
        if let Some(h) = self.state.borrow().clone() {
            let _ = h.cmds.send(Cmd::Close(
                code::SHUTDOWN,
                "switch agent shutting down".into(),
            ));
        }
        self.shutdown.trigger();
        while self.tasks.join_next().await.is_some() {}
    }
}

#[allow(clippy::too_many_arguments)] // The manager's parts, named at its one caller.
async fn manage(
    config: SwitchConfig,
    profile: Profile,
    identity: Arc<str>,
    services: Arc<ServiceTable>,
    ctx: Arc<Ctx>,
    state: Arc<watch::Sender<Option<Handle>>>,
    kick: Arc<Notify>,
    shutdown: Shutdown,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), config.max_backoff);
    loop {
        let attempt = async {
            let controller = &config.controllers[0].addr;
            let peer = tokio::net::lookup_host(controller)
                .await
                .map_err(|e| format!("cannot resolve {controller}: {e}"))?
                .next()
                .ok_or_else(|| format!("{controller} resolves to nothing"))?;
            let bind = config.bind.unwrap_or_else(|| {
                if peer.is_ipv6() {
                    "[::]:0".parse().expect("valid")
                } else {
                    "0.0.0.0:0".parse().expect("valid")
                }
            });
            let socket = Arc::new(bind_udp(bind).map_err(|e| format!("cannot bind {bind}: {e}"))?);
            socket
                .connect(peer)
                .await
                .map_err(|e| format!("cannot reach {peer}: {e}"))?;
            Ok::<_, String>((socket, peer))
        };
        let (socket, peer) = match attempt.await {
            Ok(x) => x,
            Err(e) => {
                warn!(switch = %identity, "{e}");
                let delay = backoff.next_delay(rand::random::<f64>());
                tokio::select! { _ = shutdown.wait() => return, _ = tokio::time::sleep(delay) => {}, _ = kick.notified() => {} }
                continue;
            }
        };
        let assoc = Association::client(
            rand::random::<u32>(),
            udp_config(profile, &config.common),
            own_hello(&services, &identity),
            Instant::now(),
        );
        let (handle, cmds, closed_tx) = Handle::new(identity.clone(), Opener::Switch);
        // Datagrams from the socket into the driver.
        let reader = {
            let (socket, tx) = (socket.clone(), handle.cmds.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                while let Ok(n) = socket.recv(&mut buf).await {
                    if tx.send(Cmd::Datagram(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            })
        };
        let (up_tx, up) = tokio::sync::oneshot::channel();
        let driver = tokio::spawn(drive(
            assoc,
            socket,
            peer,
            handle.clone(),
            cmds,
            ctx.clone(),
            Some(up_tx),
            closed_tx,
        ));
        let up = tokio::select! {
            _ = shutdown.wait() => { let _ = handle.cmds.send(Cmd::Close(code::SHUTDOWN, "switch agent shutting down".into())); let _ = driver.await; reader.abort(); return; }
            up = up => up,
        };
        if let Ok(theirs) = up {
            info!(switch = %identity, controller = %peer, profile = %profile, "connected to the controller agent");
            for problem in services.compare(&theirs.hello) {
                warn!(switch = %identity, "{problem}");
            }
            backoff.reset();
            state.send_replace(Some(handle.clone()));
        }
        let mut driver = driver;
        let why = tokio::select! {
            _ = shutdown.wait() => {
                let _ = handle.cmds.send(Cmd::Close(code::SHUTDOWN, "switch agent shutting down".into()));
                let _ = (&mut driver).await;
                reader.abort();
                state.send_replace(None);
                return;
            }
            why = &mut driver => why,
        };
        reader.abort();
        state.send_replace(None);
        drop(handle);
        match why {
            Ok(CloseReason::PeerClosed {
                code: code::SUPERSEDED,
                reason,
            }) => {
                error!(switch = %identity, "the controller agent replaced this association: {reason} (another switch agent with the same --switch-name?)")
            }
            Ok(r) => warn!(switch = %identity, "not connected to the controller agent: {r}"),
            Err(e) => error!(switch = %identity, "association task failed: {e}"),
        }
        let delay = backoff.next_delay(rand::random::<f64>());
        tokio::select! { _ = shutdown.wait() => return, _ = tokio::time::sleep(delay) => {}, _ = kick.notified() => {} }
    }
}

/// A running controller agent over UDP.
pub struct UdpControllerAgent {
    pub local_addr: SocketAddr,
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<()>,
}

/// One switch's association at the controller agent.
struct Peer {
    cmds: mpsc::UnboundedSender<Cmd>,
    id: u32,
}

impl UdpControllerAgent {
    pub async fn start(
        config: ControllerConfig,
        profile: Profile,
    ) -> Result<UdpControllerAgent, AgentError> {
        config.validate()?;
        let services = Arc::new(ServiceTable::new(&config.common, Opener::Controller));
        let socket = Arc::new(bind_udp(config.listen)?);
        let local_addr = socket.local_addr()?;
        warn!(
            "--transport udp --udp-profile {profile}: switch agents are neither authenticated nor encrypted; any switch name is believed"
        );
        info!(listen = %local_addr, transport = "udp", profile = %profile, services = %services.names(), "controller agent listening");
        let shutdown = Shutdown::new();
        let task = tokio::spawn(serve(socket, config, profile, services, shutdown.clone()));
        Ok(UdpControllerAgent {
            local_addr,
            shutdown,
            task,
        })
    }

    pub async fn shutdown(self) {
        self.shutdown.trigger();
        let _ = self.task.await;
    }
}

async fn serve(
    socket: Arc<UdpSocket>,
    config: ControllerConfig,
    profile: Profile,
    services: Arc<ServiceTable>,
    shutdown: Shutdown,
) {
    let ctx = Arc::new(Ctx {
        services: services.clone(),
        local_connect_timeout: config.common.local_connect_timeout,
    });
    let peers: Arc<Mutex<HashMap<SocketAddr, Peer>>> = Arc::default();
    // Switch name → its association's address: one association per switch.
    let by_name: Arc<Mutex<HashMap<Arc<str>, SocketAddr>>> = Arc::default();
    let mut buf = vec![0u8; 65_536];
    let mut bad_logged = 0u32;
    loop {
        let (n, from) = tokio::select! {
            _ = shutdown.wait() => {
                for p in peers.lock().unwrap_or_else(|e| e.into_inner()).values() {
                    let _ = p.cmds.send(Cmd::Close(code::SHUTDOWN, "controller agent shutting down".into()));
                }
                // Give the drivers a moment to send their CLOSE.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
            r = socket.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => { debug!("UDP receive failed: {e}"); continue; }
            },
        };
        let d = &buf[..n];
        let (id, is_hello) = match quicsdn_udp::packet::peek(d) {
            Ok(x) => x,
            Err(e) => {
                if bad_logged < 10 {
                    bad_logged += 1;
                    warn!("ignored a malformed datagram from {from}: {e}");
                }
                continue;
            }
        };
        let mut map = peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(&from).filter(|p| p.id == id && !p.cmds.is_closed()) {
            let _ = p.cmds.send(Cmd::Datagram(d.to_vec()));
            continue;
        }
        if !is_hello {
            // An association we do not know (this agent restarted): say so, so the
            // switch agent reconnects at once instead of waiting for its timeout.
            let close = quicsdn_udp::packet::encode(
                id,
                &quicsdn_udp::packet::Packet::Close {
                    code: code::UNKNOWN_ASSOCIATION,
                    reason: "unknown association (the controller agent restarted?)".into(),
                },
            );
            let _ = socket.try_send_to(&close, from);
            continue;
        }
        // A new association: its hello names the switch (unauthenticated).
        let theirs = match quicsdn_udp::packet::decode(d) {
            Ok((_, quicsdn_udp::packet::Packet::Hello { hello, .. })) => {
                serde_json::from_slice::<UdpHello>(hello).map_err(|e| e.to_string())
            }
            Ok(_) => Err("not a hello".into()),
            Err(e) => Err(e.to_string()),
        };
        let theirs = match theirs {
            Ok(h) if !h.switch.is_empty() => h,
            Ok(_) | Err(_) => {
                warn!("refused a hello from {from}: it does not carry a valid switch name");
                let close = quicsdn_udp::packet::encode(
                    id,
                    &quicsdn_udp::packet::Packet::Close {
                        code: code::REFUSED,
                        reason: "invalid hello".into(),
                    },
                );
                let _ = socket.try_send_to(&close, from);
                continue;
            }
        };
        let name: Arc<str> = theirs.switch.as_str().into();
        if let Some(old) = map.remove(&from) {
            let _ = old.cmds.send(Cmd::Close(
                code::SUPERSEDED,
                "a new association from the same address".into(),
            ));
        }
        {
            let mut names = by_name.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(old_addr) = names.insert(name.clone(), from)
                && old_addr != from
                && let Some(old) = map.remove(&old_addr)
            {
                let _ = old.cmds.send(Cmd::Close(
                    code::SUPERSEDED,
                    format!(
                        "a newer association from switch {name:?} (at {from}) replaced this one"
                    ),
                ));
            }
        }
        info!(switch = %name, peer = %from, "switch agent connected (unauthenticated: the name is the switch agent's claim)");
        for problem in services.compare(&theirs.hello) {
            warn!(switch = %name, "{problem}");
        }
        let assoc = Association::server(
            id,
            udp_config(profile, &config.common),
            own_hello(&services, ""),
            Instant::now(),
        );
        let (handle, cmds, closed_tx) = Handle::new(name.clone(), Opener::Controller);
        let _ = handle.cmds.send(Cmd::Datagram(d.to_vec()));
        map.insert(
            from,
            Peer {
                cmds: handle.cmds.clone(),
                id,
            },
        );
        drop(map);
        // Services this side opens: one listener per switch while it is connected.
        for svc in services.opened_here() {
            let target = svc.target.for_switch(&name);
            let (h, svc) = (handle.clone(), svc.clone());
            tokio::spawn(async move {
                let l = match LocalListener::bind(&target).await {
                    Ok(l) => l,
                    Err(e) => {
                        warn!(switch = %h.switch, service = %svc.name, "cannot listen at {target}: {e}");
                        return;
                    }
                };
                info!(switch = %h.switch, service = %svc.name, listen = %target, "listening for the switch");
                let mut closed = h.closed.clone();
                loop {
                    tokio::select! {
                        _ = closed.wait_for(|c| *c) => return,
                        a = l.accept() => if let Ok(local) = a {
                            tokio::spawn(open_session(h.clone(), svc.clone(), local));
                        },
                    }
                }
            });
        }
        let (socket, ctx, peers, by_name) =
            (socket.clone(), ctx.clone(), peers.clone(), by_name.clone());
        tokio::spawn(async move {
            let why = drive(assoc, socket, from, handle, cmds, ctx, None, closed_tx).await;
            debug!(switch = %name, "association ended: {why}");
            let mut map = peers.lock().unwrap_or_else(|e| e.into_inner());
            if map.get(&from).is_some_and(|p| p.id == id) {
                map.remove(&from);
            }
            let mut names = by_name.lock().unwrap_or_else(|e| e.into_inner());
            if names.get(&name) == Some(&from) {
                names.remove(&name);
            }
        });
    }
}
