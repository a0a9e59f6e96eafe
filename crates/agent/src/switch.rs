//! The switch agent: beside an unmodified Open vSwitch, one QUIC connection to the
//! controller agent.
//!
//! Liveness is kept truthful. While the QUIC connection is up, OVS's local
//! connections are carried over it; when it is lost, every session's streams fail,
//! so the agent closes OVS's connections and OVS sees the controller as gone, as it
//! would with a direct TCP connection. A new local connection while the controller
//! is unreachable triggers an immediate connection attempt and waits for its
//! outcome only, so OVS's own reconnect backoff drives retries just as it would
//! against an unreachable controller. In the background the agent also
//! reconnects by itself with OVS-like exponential backoff and jitter (up to
//! `max_backoff`, 8 s by default).

use crate::admission::{Ended, Reconnect};
use crate::config::SwitchConfig;
use crate::link::{Link, Scheduling};
use crate::metrics::{Metrics, RefusalReason};
use crate::services::{Service, ServiceTable};
use crate::session::{EchoAnswer, Handshake, HelloMemory, HelloWatch, Outcome};
use crate::stand_in::{self, Ending, LinkView, Verdict};
use crate::{AgentError, Shutdown, control};
use bytes::Bytes;
use quicsdn_transport::local::{LocalListener, LocalRead, LocalStream, LocalWrite};
use quicsdn_transport::rotation::{self, Loaded, Policy, Refusal, Reloaded, RotationHandle};
use quicsdn_transport::target::Target;
use quicsdn_transport::tls::{Credentials, Role, TlsError};
use quicsdn_transport::{identity, quic};
use quicsdn_wire::Framing;
use quicsdn_wire::openflow::HEADER_LEN;
use quicsdn_wire::preamble::{Hello, Opener, code};
use quinn::{Endpoint, VarInt};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

/// The connection to the controller agent, as the rest of the agent sees it.
#[derive(Clone)]
enum LinkState {
    /// Not connected and not trying right now (waiting out a backoff).
    Down,
    /// A connection attempt is under way.
    Connecting,
    Up(Arc<Link>),
}

/// One controller agent of `--controller`, with its own client configuration,
/// so each keeps its own session tickets (rustls keys them by server name,
/// which several controller agents may share).
struct Controller {
    addr: String,
    server_name: String,
    /// Replaced when the certificate files are rotated; each attempt clones it.
    client: std::sync::Mutex<quinn::ClientConfig>,
}

impl Controller {
    fn client(&self) -> quinn::ClientConfig {
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

struct Inner {
    config: SwitchConfig,
    identity: Arc<str>,
    services: Arc<ServiceTable>,
    /// The QUIC endpoint of the current connection (or of the last one).
    /// With zero-length connection IDs a new connection may get a new one
    /// ([`Inner::endpoint_for_attempt`]).
    endpoint: std::sync::Mutex<Endpoint>,
    /// `--controller`, in order of preference.
    controllers: Vec<Controller>,
    state: watch::Sender<LinkState>,
    /// Asks the connection manager to try now instead of waiting out its backoff.
    kick: Notify,
    /// The controller agent rejected our last 0-RTT attempt: reconnect at once,
    /// with a full handshake.
    zero_rtt_rejected: AtomicBool,
    /// The controller agent refused our last attempt (admission control): it is
    /// up, so OVS's connections wait for the next attempt instead of closing.
    refused: AtomicBool,
    /// What the last connection or attempt to end said about the controller
    /// agent: whether OVS may get the HELLO stand-in before a new connection
    /// has heard from it ([`stand_in`]).
    last_ending: std::sync::Mutex<Verdict>,
    metrics: Arc<Metrics>,
    /// `quicsdn snoop` clients.
    taps: Arc<crate::tap::Taps>,
    /// `--qlog-dir`, and the QUIC options of the transport settings it wraps.
    qlog: Option<(quic::Qlog, quic::QuicOptions)>,
}

/// A running switch agent.
pub struct SwitchAgent {
    inner: Arc<Inner>,
    shutdown: Shutdown,
    tasks: JoinSet<()>,
    listeners: Vec<(String, Target)>,
    metrics_addr: Option<SocketAddr>,
    rotation: RotationHandle,
}

impl SwitchAgent {
    /// Loads credentials, binds the local listeners and starts connecting. Errors
    /// here are configuration errors: nothing is left running.
    pub async fn start(mut config: SwitchConfig) -> Result<SwitchAgent, AgentError> {
        config.validate()?;
        if config.common.quic.zero_length_cid && config.bind.is_some_and(|b| b.port() != 0) {
            // Zero-length IDs need a new UDP port for a connection made
            // while the previous one drains (`Inner::endpoint_for_attempt`);
            // a fixed port has no second socket.
            info!(
                "--bind with a fixed port: connection IDs of {} bytes instead of zero-length ones \
                 (those need a new UDP port per connection)",
                config.common.quic.cid_len
            );
            config.common.quic.zero_length_cid = false;
        }
        let metrics = Metrics::new("switch");
        let mut loaded = Loaded::load(&config.common.tls)?;
        loaded.creds.on_reject = Some(metrics.rejection_hook());
        let creds = &loaded.creds;
        metrics.set_credentials(creds);
        creds.warn_if_expiring();
        let identity: Arc<str> = creds.identity.clone().into();
        let services = Arc::new(ServiceTable::new(&config.common, Opener::Switch));
        let mut bound = Vec::new();
        for service in services.opened_here() {
            let target = service.target.for_switch(&identity);
            let listener = LocalListener::bind(&target)
                .await
                .map_err(|e| AgentError::Listen {
                    service: service.name.to_string(),
                    target: target.to_string(),
                    reason: e.to_string(),
                })?;
            bound.push((service.clone(), listener));
        }
        let bind = match config.bind {
            Some(b) => b,
            // Pick the unspecified address of the family the controller is likely in;
            // a literal IPv6 controller address needs an IPv6 socket.
            None if config.controllers.iter().any(|c| c.addr.starts_with('[')) => {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
            }
            None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        };
        let quic = client_options(&services, &config);
        let endpoint = quic::client_endpoint(bind, creds, &quic)?;
        let controllers = config
            .controllers
            .iter()
            .map(|c| {
                Ok(Controller {
                    addr: c.addr.clone(),
                    server_name: c.server_name.clone(),
                    client: std::sync::Mutex::new(quic::client_config(creds, &quic)?),
                })
            })
            .collect::<Result<Vec<_>, quicsdn_transport::tls::TlsError>>()?;
        // With qlog, each attempt gets its own transport settings (its qlog
        // stream) around its controller's TLS configuration, whose ticket
        // cache 0-RTT needs.
        let qlog = config.common.qlog.clone().map(|q| (q, quic));
        let (state, _) = watch::channel(LinkState::Down);
        let inner = Arc::new(Inner {
            config,
            identity,
            services,
            endpoint: std::sync::Mutex::new(endpoint),
            controllers,
            state,
            kick: Notify::new(),
            zero_rtt_rejected: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            last_ending: std::sync::Mutex::new(Verdict::Silent),
            metrics,
            taps: crate::tap::Taps::new(),
            qlog,
        });
        let shutdown = Shutdown::new();
        let mut tasks = JoinSet::new();
        let (rotation, rotating) = rotation::task(
            loaded,
            rotation::Rotation {
                // The identity names OVS's sockets and the metrics: a rotation keeps it.
                policy: Policy {
                    role: Role::Client,
                    same_identity: true,
                },
                poll: quic.cert_poll,
                who: format!("switch agent {}", inner.identity),
            },
            Arc::new(Rotate(inner.clone())),
            shutdown.clone(),
        );
        tasks.spawn(rotating);
        let mut listeners = Vec::new();
        for (service, listener) in bound {
            let actual = listener.local_target();
            info!(switch = %inner.identity, service = %service.name, listen = %actual, "waiting for OVS");
            listeners.push((service.name.to_string(), actual));
            tasks.spawn(accept_local(
                inner.clone(),
                service,
                listener,
                shutdown.clone(),
            ));
        }
        tasks.spawn(manage_connection(inner.clone(), shutdown.clone()));
        if let Some(path) = inner.config.common.control.clone() {
            let listener = control::bind(&path).await.map_err(|e| AgentError::Listen {
                service: "control".into(),
                target: path.display().to_string(),
                reason: e.to_string(),
            })?;
            let handler = Arc::new(Control(inner.clone()));
            tasks.spawn(control::serve(listener, path, handler, shutdown.clone()));
        }
        let mut metrics_addr = None;
        if let Some(addr) = inner.config.common.metrics {
            let health: crate::http::Health = {
                let inner = inner.clone();
                Arc::new(move || health(&inner))
            };
            let (local, server) =
                crate::http::start(addr, inner.metrics.clone(), health, shutdown.clone()).await?;
            info!(switch = %inner.identity, metrics = %local, "serving /metrics and /healthz");
            metrics_addr = Some(local);
            tasks.spawn(server);
        }
        Ok(SwitchAgent {
            inner,
            shutdown,
            tasks,
            listeners,
            metrics_addr,
            rotation,
        })
    }

    /// Reads the CA, certificate and key files again (SIGHUP) and, if they
    /// pass the checks of [`rotation::check_replacement`], uses them for the
    /// next connection; the current one stays up. `None` once shutting down.
    pub async fn reload_credentials(&self) -> Option<Result<Reloaded, Refusal>> {
        self.rotation.reload().await
    }

    /// This agent's identity, from its certificate.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// Where each locally listening service actually listens.
    pub fn listeners(&self) -> &[(String, Target)] {
        &self.listeners
    }

    /// The agent's metrics (served on `--metrics` if given).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Where `/metrics` and `/healthz` are served, with `--metrics`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The local UDP address of the QUIC endpoint.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint().local_addr()
    }

    /// Moves the QUIC endpoint to a new local UDP address (port 0 picks one), as
    /// after a NAT rebinding or an address change: the connection to the
    /// controller agent migrates (RFC 9000 §9) and every session carries on.
    /// Returns the new address.
    pub fn rebind(&self, to: SocketAddr) -> std::io::Result<SocketAddr> {
        self.inner.rebind(to)
    }

    /// True while connected to the controller agent.
    pub fn is_connected(&self) -> bool {
        link_is_up(&self.inner)
    }

    /// Waits until connected, or `timeout` passes; true if connected.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.state.subscribe();
        tokio::time::timeout(timeout, async {
            loop {
                if matches!(&*rx.borrow_and_update(), LinkState::Up(l) if l.is_alive()) {
                    return;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
        .await
        .is_ok()
    }

    /// Closes the QUIC connection (telling the controller agent why), stops
    /// listening and removes socket files.
    pub async fn shutdown(mut self) {
        self.shutdown.trigger();
        let endpoint = self.inner.endpoint();
        endpoint.close(
            VarInt::from_u32(code::SHUTDOWN),
            b"switch agent shutting down",
        );
        while self.tasks.join_next().await.is_some() {}
        let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
    }
}

impl Inner {
    fn endpoint(&self) -> Endpoint {
        self.endpoint
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The endpoint for a new connection. quinn finds the connection a packet
    /// with a zero-length connection ID belongs to by the sender's address
    /// alone, one connection per remote address and endpoint, and when a
    /// connection ends it forgets whatever that address maps to. So a new
    /// connection to a controller agent the switch agent's previous
    /// connection is still draining from (a restarted controller agent closed
    /// it, or a rejected 0-RTT attempt was closed here, RFC 9000 §10.2) would
    /// lose its packets once the old one is gone: the storm test saw 40 of 50
    /// switch agents need a second connection. With zero-length IDs, a new
    /// connection therefore gets an endpoint of its own (a new UDP port) while
    /// the current endpoint still holds a connection; the old endpoint drains
    /// and closes by itself (quinn's endpoint driver outlives the last handle
    /// while it has connections). The 0-RTT session tickets live in the
    /// controller agent's client configuration, not in the endpoint, so they
    /// carry over.
    fn endpoint_for_attempt(&self) -> Result<Endpoint, String> {
        let current = self.endpoint();
        if !self.config.common.quic.zero_length_cid || current.open_connections() == 0 {
            return Ok(current);
        }
        let local = current
            .local_addr()
            .map_err(|e| format!("the QUIC endpoint's address: {e}"))?;
        let opts = client_options(&self.services, &self.config);
        let fresh =
            quic::client_endpoint_for_connect_with(SocketAddr::new(local.ip(), 0), &opts)
                .map_err(|e| format!("cannot open a QUIC endpoint for a new connection: {e}"))?;
        debug!(
            switch = %self.identity,
            local = ?fresh.local_addr().ok(),
            "a new UDP port for the new connection while the previous one drains (zero-length connection IDs)"
        );
        Ok(fresh)
    }

    /// `endpoint` carries the connection now: rebinding, the status and
    /// shutdown act on it.
    fn adopt(&self, endpoint: &Endpoint) {
        *self.endpoint.lock().unwrap_or_else(|e| e.into_inner()) = endpoint.clone();
    }

    fn rebind(&self, to: SocketAddr) -> std::io::Result<SocketAddr> {
        let socket = quic::udp_socket(to)?;
        let endpoint = self.endpoint();
        // The same socket wrapping as the endpoint's own (ECN setting).
        endpoint.rebind_abstract(quic::endpoint_socket(socket, self.config.common.quic.ecn)?)?;
        let now = endpoint.local_addr()?;
        info!(switch = %self.identity, local = %now, "moved to a new local address; the connection migrates");
        self.metrics.rebound(&self.identity);
        Ok(now)
    }
}

/// Puts rotated credentials in use: a new client configuration per
/// controller agent, for the next connection attempt. It starts with an
/// empty ticket cache, so the next connection is a full handshake that
/// presents the new certificate (a resumed session would carry the old one).
struct Rotate(Arc<Inner>);

impl rotation::Install for Rotate {
    fn install(&self, creds: &Credentials) -> Result<(), TlsError> {
        let inner = &self.0;
        let quic = client_options(&inner.services, &inner.config);
        let configs = inner
            .controllers
            .iter()
            .map(|_| quic::client_config(creds, &quic))
            .collect::<Result<Vec<_>, _>>()?;
        for (c, cfg) in inner.controllers.iter().zip(configs) {
            *c.client.lock().unwrap_or_else(|e| e.into_inner()) = cfg;
        }
        Ok(())
    }

    fn outcome(&self, result: &Result<Reloaded, Refusal>, current: &Credentials) {
        self.0.metrics.reloaded(result.is_ok());
        if let Ok(Reloaded::Replaced { .. }) = result {
            self.0.metrics.set_credentials(current);
        }
    }
}

/// The switch agent's answers on its control socket.
struct Control(Arc<Inner>);

impl control::Handler for Control {
    fn status(&self) -> control::Answer<'_, control::Status> {
        let inner = &self.0;
        let status = control::Status {
            role: "switch".into(),
            local_addr: inner
                .endpoint()
                .local_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0))),
            connections: match &*inner.state.borrow() {
                LinkState::Up(link) if link.is_alive() => vec![control::ConnectionStatus::of(link)],
                _ => vec![],
            },
            admission: None,
            keylog: None,
        };
        Box::pin(async move { status })
    }

    fn snoop(
        &self,
        switch: Option<String>,
        service: Option<String>,
        follow: bool,
    ) -> control::Answer<'_, Result<control::Snoop, String>> {
        let inner = &self.0;
        let picked = control::pick("switch", switch.as_deref(), &[inner.identity.to_string()])
            .and_then(|switch| {
                control::Snoop::attach(
                    &inner.taps,
                    &inner.services,
                    switch,
                    service.as_deref(),
                    follow,
                )
            });
        Box::pin(async move { picked })
    }

    fn rebind(&self, bind: Option<SocketAddr>) -> Result<SocketAddr, String> {
        // By default: the same address, a new port (what a NAT rebinding does).
        let to = match bind {
            Some(b) => b,
            None => {
                let now = self.0.endpoint().local_addr().map_err(|e| e.to_string())?;
                SocketAddr::new(now.ip(), 0)
            }
        };
        self.0
            .rebind(to)
            .map_err(|e| format!("cannot bind {to}: {e}"))
    }
}

/// Keeps one connection to a controller agent. With several (`--controller`
/// repeated), an attempt that fails or is refused moves on to the next at once;
/// only a whole round of failures waits out the backoff, so OVS's connection,
/// which waits for one attempt ([`link_for_session`]), sees the round. A lost
/// connection moves on too (the agent that closed or went silent is restarting
/// or gone), and while connected to any but the first the agent tries the first
/// every `--failback-interval` and moves back to it when it answers.
async fn manage_connection(inner: Arc<Inner>, shutdown: Shutdown) {
    let cfg = &inner.config;
    let count = inner.controllers.len();
    let mut reconnect = Reconnect::new(cfg.max_backoff, cfg.reconnect_jitter);
    // The controller agent tried next, and failed attempts since the last
    // connection (a round is `count` of them).
    let mut current = 0;
    let mut failures = 0;
    // A link to the first controller agent, made by the failback probe.
    let mut failback: Option<Arc<Link>> = None;
    loop {
        let attempt = match failback.take() {
            Some(link) => Ok(link),
            None => {
                inner.state.send_replace(LinkState::Connecting);
                tokio::select! {
                    r = connect_once(&inner, current, false) => r,
                    _ = shutdown.wait() => return,
                }
            }
        };
        let addr = &inner.controllers[current].addr;
        let ended = match attempt {
            Ok(link) => {
                failures = 0;
                // A 0-RTT connection learns the server's certificate with the handshake.
                let peer = identity::peer_certificate(&link.conn);
                let (controller, serial) = match &peer {
                    Some(c) => (c.identity.as_str(), c.serial.as_str()),
                    None => ("(resuming)", ""),
                };
                info!(
                    switch = %inner.identity, controller = %controller, serial = %serial,
                    remote = %link.conn.remote_address(), zero_rtt = link.early_start,
                    "connected to the controller agent"
                );
                inner.state.send_replace(LinkState::Up(link.clone()));
                if !link.early_start {
                    inner.metrics.link_up(&link);
                }
                let started = tokio::time::Instant::now();
                let at_first = current == 0;
                let probe = async {
                    if at_first {
                        std::future::pending().await
                    } else {
                        probe_first(&inner).await
                    }
                };
                let reason = tokio::select! {
                    r = link.clone().serve(&inner.config.common.quic, Some(attempt_limit(&inner.config))) => r,
                    first = probe => {
                        // New sessions go to the first at once; closing this
                        // connection closes OVS's connections through it, and
                        // OVS reconnects through the first (OpenFlow state is
                        // per connection, so a session cannot move).
                        info!(
                            switch = %inner.identity, from = %addr, to = %inner.controllers[0].addr,
                            "the first controller agent answers again; moving back to it (OVS reconnects through it)"
                        );
                        inner.state.send_replace(LinkState::Up(first.clone()));
                        link.conn.close(
                            VarInt::from_u32(code::FAILBACK),
                            b"moving back to the preferred controller agent",
                        );
                        current = 0;
                        failback = Some(first);
                        continue;
                    }
                    _ = shutdown.wait() => return,
                };
                inner.metrics.link_down(&link, &reason);
                // A 0-RTT connection is Up before the controller agent has seen
                // it, so a refusal shows up here.
                let refused = is_refusal(&reason);
                inner.ended(if refused {
                    Ending::Refused
                } else if inner.zero_rtt_rejected.load(Ordering::Relaxed) {
                    Ending::ZeroRttRejected
                } else {
                    Ending::Lost {
                        confirmed: link.is_confirmed(),
                        reason: reason.clone(),
                    }
                });
                inner.refused.store(refused, Ordering::Relaxed);
                inner.state.send_replace(LinkState::Down);
                if refused {
                    inner.metrics.refused(RefusalReason::admission);
                    info!(switch = %inner.identity, "the controller agent is busy (admission control refused the connection); retrying shortly");
                    Ended::Refused
                } else {
                    let stats = link.conn.stats();
                    warn!(
                        switch = %inner.identity, controller = %addr,
                        rtt_ms = stats.path.rtt.as_millis() as u64,
                        cwnd = stats.path.cwnd,
                        sent = stats.path.sent_packets,
                        lost = stats.path.lost_packets,
                        rx = stats.udp_rx.datagrams,
                        "connection to the controller agent lost ({reason}); closing OVS's connections"
                    );
                    if superseded(&reason) {
                        error!(
                            switch = %inner.identity,
                            "the controller agent took a newer connection with this switch's identity and \
                             closed this live one. If this repeats, another switch agent with the same \
                             certificate connects to the same controller agent and the two keep replacing \
                             each other: give each switch agent its own certificate, or carry both OVS \
                             controller targets as services of one switch agent"
                        );
                    }
                    // Reconnect soon after a connection that lived a while (within
                    // --reconnect-jitter), at once after a rejected 0-RTT; a
                    // connection dropped straight after its handshake waits like a
                    // failure. So does a 0-RTT attempt whose handshake never
                    // completed (the controller agent unreachable): retrying those
                    // at once would spend a session ticket every few seconds of an
                    // outage, and the first reconnect after it would find none left.
                    if inner.zero_rtt_rejected.load(Ordering::Relaxed) {
                        Ended::ZeroRttRejected
                    } else if started.elapsed() > Duration::from_secs(2) && link.is_confirmed() {
                        Ended::LostAfterUp
                    } else {
                        Ended::Failed
                    }
                }
            }
            Err(Attempt::Refused) => {
                inner.metrics.refused(RefusalReason::admission);
                inner.ended(Ending::Refused);
                inner.refused.store(true, Ordering::Relaxed);
                inner.state.send_replace(LinkState::Down);
                info!(switch = %inner.identity, controller = %addr, "the controller agent is busy (admission control refused the connection); retrying shortly");
                Ended::Refused
            }
            Err(Attempt::Failed(e, refusal)) => {
                if let Some(r) = refusal {
                    inner.metrics.refused(r);
                }
                inner.ended(Ending::AttemptFailed);
                inner.refused.store(false, Ordering::Relaxed);
                inner.state.send_replace(LinkState::Down);
                warn!(switch = %inner.identity, "cannot connect to the controller agent at {addr}: {e}");
                Ended::Failed
            }
        };
        // Which controller agent next, and whether to wait first: the same one
        // at once after a rejected 0-RTT; with several, the next one, at once
        // unless a whole round has failed.
        let delay = if count == 1 || ended == Ended::ZeroRttRejected {
            reconnect.next_delay(ended, rand::random::<f64>())
        } else {
            current = (current + 1) % count;
            if matches!(ended, Ended::Failed | Ended::Refused) {
                failures += 1;
            }
            if ended == Ended::LostAfterUp || failures % count == 0 {
                reconnect.next_delay(ended, rand::random::<f64>())
            } else {
                Duration::ZERO
            }
        };
        if delay.is_zero() {
            continue;
        }
        if ended == Ended::Failed {
            info!(switch = %inner.identity, "next connection attempt in {:.1}s", delay.as_secs_f64());
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = inner.kick.notified() => {}
            _ = shutdown.wait() => return,
        }
    }
}

/// While connected to another controller agent: tries the first every
/// `--failback-interval` (a full handshake and the hello, no 0-RTT: nothing
/// is sent on it before it has proved it serves us) and returns the
/// connection once it answers.
async fn probe_first(inner: &Arc<Inner>) -> Arc<Link> {
    let interval = inner.config.failback_interval;
    // A probe of an agent that is still down waits no longer than the
    // interval (at least a second, for long paths), so one that comes back is
    // noticed within about two intervals.
    let limit = interval
        .max(Duration::from_secs(1))
        .min(inner.config.common.quic.idle_timeout);
    loop {
        tokio::time::sleep(interval).await;
        let attempt = tokio::time::timeout(limit, connect_once(inner, 0, true))
            .await
            .unwrap_or_else(|_| Err(Attempt::Failed(format!("no answer within {limit:?}"), None)));
        match attempt {
            Ok(link) => return link,
            Err(Attempt::Refused) => {
                debug!(switch = %inner.identity, "the first controller agent is busy; staying")
            }
            Err(Attempt::Failed(e, _)) => {
                debug!(switch = %inner.identity, "the first controller agent does not answer yet: {e}")
            }
        }
    }
}

/// Whether the controller agent refused the connection attempt (QUIC
/// CONNECTION_REFUSED, RFC 9000 §20.1): it runs, but its handshake admission
/// control admits no more just now.
pub(crate) fn is_refusal(e: &quinn::ConnectionError) -> bool {
    matches!(e, quinn::ConnectionError::ConnectionClosed(c)
        if c.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED)
}

/// Why a connection attempt produced no link.
enum Attempt {
    Refused,
    /// What went wrong, and the handshake refusal it was, if one.
    Failed(String, Option<RefusalReason>),
}

/// Whether the controller agent closed the connection because a newer one with
/// the same switch identity replaced it.
fn superseded(reason: &quinn::ConnectionError) -> bool {
    matches!(reason, quinn::ConnectionError::ApplicationClosed(close)
        if close.error_code == VarInt::from_u32(code::SUPERSEDED))
}

/// How long a connection attempt waits for the controller agent's first
/// answer. With one controller agent: twice the grace period, the most a busy
/// peer may keep an established connection waiting too (below OVS's fail-mode
/// timeout: `config::patient_attempt_limit`). After a restart of
/// the controller agent every switch agent tries at once and the new agent
/// queues the attempts it has no handshake permit for (up to two thirds of
/// this: `controller::accept_connections`); an attempt given up sooner would
/// start again at the queue's tail, a further handshake on both sides, and
/// there is no other agent to try meanwhile. With several, the grace period,
/// so an agent that is down does not hold up the move to the next.
pub(crate) fn attempt_limit(config: &SwitchConfig) -> Duration {
    let grace = config.common.quic.idle_timeout;
    if config.controllers.len() == 1 {
        crate::config::patient_attempt_limit(grace)
    } else {
        grace
    }
}

/// The QUIC settings of the switch agent's connections: the services' own,
/// with quinn's idle timeout at [`attempt_limit`]. Until the controller
/// agent's transport parameters arrive that is the handshake's timeout; then
/// RFC 9000 §10.1 applies, "the effective value at an endpoint is computed as
/// the minimum of the two advertised values" (the controller agent's grace
/// period when it is the shorter), and this side's grace period is kept by
/// the link's own silence check (`Link::serve`).
fn client_options(services: &ServiceTable, config: &SwitchConfig) -> quic::QuicOptions {
    let mut opts = services.quic_options(&config.common);
    opts.idle_timeout = attempt_limit(config);
    opts
}

/// One connection attempt. With a session ticket (and 0-RTT on), the connection
/// is usable at once: the hello and OVS's first messages go in 0-RTT, and the
/// handshake is confirmed in the background ([`confirm_early`]). Otherwise:
/// handshake, then the hello exchange that confirms the controller agent
/// accepted us.
async fn connect_once(inner: &Arc<Inner>, index: usize, probe: bool) -> Result<Arc<Link>, Attempt> {
    let cfg = &inner.config;
    let target = &inner.controllers[index];
    let addr = tokio::net::lookup_host(target.addr.as_str())
        .await
        .map_err(|e| Attempt::Failed(format!("cannot resolve {}: {e}", target.addr), None))?
        .next()
        .ok_or_else(|| Attempt::Failed(format!("{} resolves to no address", target.addr), None))?;
    let endpoint = inner
        .endpoint_for_attempt()
        .map_err(|e| Attempt::Failed(e, None))?;
    let connecting = match &inner.qlog {
        None => endpoint.connect_with(target.client(), addr, &target.server_name),
        Some((qlog, opts)) => {
            let name = format!(
                "{}-{}-switch",
                quic::file_stem(&inner.identity),
                unix_millis()
            );
            let title = format!("quicsdn switch agent {} to {addr}", inner.identity);
            let (transport, path) = qlog
                .transport(opts, &name, &title)
                .map_err(|e| Attempt::Failed(format!("--qlog-dir: {e}"), None))?;
            debug!(switch = %inner.identity, qlog = %path.display(), "qlog of this connection");
            let mut client = target.client();
            client.transport_config(transport);
            endpoint.connect_with(client, addr, &target.server_name)
        }
    };
    let mut connecting = connecting
        .map_err(|e| Attempt::Failed(format!("cannot start a connection to {addr}: {e}"), None))?;
    let new_link = |conn, confirmed| {
        Link::new(
            conn,
            inner.identity.clone(),
            inner.services.clone(),
            Scheduling {
                mode: cfg.common.streams,
                relaxed: false,
                coalesce: cfg.common.coalesce,
            },
            cfg.common.local_connect_timeout,
            confirmed,
            (inner.metrics.clone(), inner.taps.clone()),
        )
    };
    // After a rejection, one full handshake (the next attempt gets fresh tickets).
    if !probe && cfg.common.quic.zero_rtt && !inner.zero_rtt_rejected.swap(false, Ordering::Relaxed)
    {
        // Err: no ticket for this controller agent yet.
        match connecting.into_0rtt() {
            Ok((conn, accepted)) => {
                let (handshake, rx) = watch::channel(Handshake::Pending);
                let link = new_link(conn, Some(rx));
                // Sent now, so it leads the first flight.
                let hello = tokio::spawn({
                    let link = link.clone();
                    async move { link.hello_as_client().await }
                });
                tokio::spawn(confirm_early(
                    inner.clone(),
                    link.clone(),
                    accepted,
                    handshake,
                    hello,
                ));
                inner.adopt(&endpoint);
                return Ok(link);
            }
            Err(c) => connecting = c,
        }
    }
    let attempt = async {
        let conn = connecting.await.map_err(|e| {
            if is_refusal(&e) {
                Attempt::Refused
            } else {
                Attempt::Failed(
                    format!("handshake with {addr} failed: {e}"),
                    RefusalReason::of_failed_handshake(&e),
                )
            }
        })?;
        let link = new_link(conn, None);
        match link.hello_as_client().await {
            Ok(_) => {
                inner.adopt(&endpoint);
                Ok(link)
            }
            // TLS 1.3: the controller agent checks our certificate after our
            // side of the handshake completed, so its refusal lands here.
            Err(e) => Err(Attempt::Failed(
                format!("{addr} closed the connection during setup: {e}"),
                link.conn
                    .close_reason()
                    .and_then(|r| RefusalReason::of_failed_handshake(&r)),
            )),
        }
    };
    let limit = attempt_limit(cfg);
    tokio::time::timeout(limit, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(Attempt::Failed(
                format!("no answer from {addr} within {limit:?}"),
                Some(RefusalReason::timed_out),
            ))
        })
}

/// The rest of a 0-RTT connection's setup: when the handshake completes, lets
/// the sessions' held messages go, then checks the hello answer.
///
/// If the controller agent rejected 0-RTT (it no longer holds our session),
/// nothing sent early arrived, and RFC 9001 §4.6.2 says the client "MUST reset
/// the state of all streams, including application state bound to those
/// streams". The connection is closed and replaced at once by one with a full
/// handshake; the sessions opened early start again on it with what OVS had
/// sent (`new_session`), so OVS notices nothing. (A new connection, not new
/// streams on this one: quinn numbers the streams opened after a rejection
/// from zero again, and handles of the rejected ones would alias them.)
async fn confirm_early(
    inner: Arc<Inner>,
    link: Arc<Link>,
    accepted: quinn::ZeroRttAccepted,
    handshake: watch::Sender<Handshake>,
    hello: tokio::task::JoinHandle<Result<Hello, String>>,
) {
    let accepted = accepted.await;
    if link.conn.close_reason().is_some() {
        // The handshake failed; the connection manager reports why.
        return;
    }
    inner.metrics.zero_rtt(&link.switch, accepted);
    if !accepted {
        info!(
            switch = %link.switch,
            "the controller agent rejected 0-RTT (it no longer holds our session); reconnecting with a full handshake"
        );
        inner.zero_rtt_rejected.store(true, Ordering::Relaxed);
        handshake.send_replace(Handshake::ZeroRttRejected);
        link.conn.close(
            VarInt::from_u32(code::ZERO_RTT_REJECTED),
            b"0-RTT rejected, reconnecting",
        );
        return;
    }
    handshake.send_replace(Handshake::Complete);
    inner.metrics.link_up(&link);
    debug!(switch = %link.switch, "0-RTT accepted");
    if let Err(e) = hello.await.unwrap_or_else(|e| Err(e.to_string())) {
        warn!(switch = %link.switch, "the controller agent closed the connection during setup: {e}");
        link.conn.close(
            VarInt::from_u32(code::PROTOCOL_VIOLATION),
            b"no hello answer",
        );
    }
}

async fn accept_local(
    inner: Arc<Inner>,
    service: Arc<Service>,
    listener: LocalListener,
    shutdown: Shutdown,
) {
    let mut sessions = JoinSet::new();
    // The controller's last HELLO on this service, for the stand-in.
    let hello_memory = (service.framing == Framing::OpenFlow).then(Default::default);
    loop {
        let local = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait() => break,
            // Reap finished sessions so the set does not grow.
            Some(_) = sessions.join_next(), if !sessions.is_empty() => continue,
        };
        match local {
            Ok(local) => {
                sessions.spawn(new_session(
                    inner.clone(),
                    service.clone(),
                    local,
                    hello_memory.clone(),
                ));
            }
            Err(e) => {
                // Typically EMFILE: wait a little rather than spin.
                warn!(switch = %inner.identity, service = %service.name, "accepting a local connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    sessions.shutdown().await;
}

async fn new_session(
    inner: Arc<Inner>,
    service: Arc<Service>,
    local: LocalStream,
    hello_memory: Option<HelloMemory>,
) {
    let (mut local, mut preread) = (local.into_split(), Bytes::new());
    let mut hello = hello_memory.map(|memory| HelloWatch {
        memory,
        stand_in: None,
        echo: None,
    });
    if let Some(w) = hello.as_mut()
        && inner.stand_in_engages(&w.memory)
    {
        match stand_in_hello(&inner, &service, &w.memory, &mut local).await {
            Ok(None) => {}
            Ok(Some((pair, read))) => {
                // OVS now believes its controller is there: answer its
                // inactivity probes until the controller speaks.
                if inner.config.echo_stand_in {
                    let alive = {
                        let (inner, memory) = (Arc::downgrade(&inner), w.memory.clone());
                        Arc::new(move || {
                            inner
                                .upgrade()
                                .is_some_and(|inner| inner.stand_in_engages(&memory))
                        })
                    };
                    let echo = EchoAnswer::new(service.max_message, alive);
                    // What OVS sent right behind its HELLO, if anything.
                    let after_hello = &read[pair.1.len()..];
                    if let Err(e) = write_replies(&mut local.1, echo.observe(after_hello)).await {
                        info!(switch = %inner.identity, service = %service.name, "closing OVS's connection: {e}");
                        return;
                    }
                    w.echo = Some(echo);
                }
                w.stand_in = Some(pair);
                preread = read;
            }
            Err(why) => {
                info!(switch = %inner.identity, service = %service.name, "closing OVS's connection: {why}");
                return;
            }
        }
    }
    loop {
        let echo = hello.as_ref().and_then(|h| h.echo.as_ref());
        let waited = match echo.filter(|e| e.is_active()) {
            None => Ok(link_for_session(&inner).await),
            Some(echo) => {
                link_answering_echo(&inner, &service, &mut local, &mut preread, echo).await
            }
        };
        let link = match waited {
            Ok(link) => link,
            Err(e) => {
                info!(switch = %inner.identity, service = %service.name, "closing OVS's connection: {e}");
                return;
            }
        };
        let Some(link) = link else {
            info!(
                switch = %inner.identity, service = %service.name,
                "OVS connected but the controller agent is unreachable; closing OVS's connection"
            );
            return;
        };
        match link
            .open_session(service.clone(), local, preread, hello.clone())
            .await
        {
            Outcome::Done => {
                if let Some(n) = echo_answered(&hello).filter(|&n| n > 0) {
                    info!(
                        switch = %inner.identity, service = %service.name,
                        "answered {n} of OVS's echo requests in the controller's stead while the session waited for it"
                    );
                }
                return;
            }
            // The 0-RTT data was rejected: the same OVS connection, on the next link.
            Outcome::Retry { local: l, replay } => (local, preread) = (l, replay),
        }
    }
}

/// How many of OVS's echo requests the echo stand-in answered on this OVS
/// connection, if it had one.
fn echo_answered(hello: &Option<HelloWatch>) -> Option<u64> {
    hello.as_ref()?.echo.as_ref().map(EchoAnswer::answered)
}

fn link_is_up(inner: &Inner) -> bool {
    matches!(&*inner.state.borrow(), LinkState::Up(l) if l.is_alive())
}

impl Inner {
    /// Records how a connection or attempt ended, for the HELLO stand-in.
    fn ended(&self, ending: Ending) {
        *self.last_ending.lock().unwrap_or_else(|e| e.into_inner()) = Verdict::after(&ending);
    }

    /// Whether OVS's new OpenFlow connection gets the controller's
    /// remembered HELLO at once ([`stand_in::engages`]).
    fn stand_in_engages(&self, memory: &HelloMemory) -> bool {
        let mut last = *self.last_ending.lock().unwrap_or_else(|e| e.into_inner());
        let link = match &*self.state.borrow() {
            LinkState::Up(l) => match l.conn.close_reason() {
                None if l.is_confirmed() => LinkView::Up,
                None => LinkView::Unconfirmed,
                // Closed, and the manager has not recorded how yet.
                Some(reason) => {
                    last = Verdict::after(&Ending::Lost {
                        reason,
                        confirmed: l.is_confirmed(),
                    });
                    LinkView::Down
                }
            },
            LinkState::Connecting => LinkView::Connecting,
            LinkState::Down => LinkView::Down,
        };
        let remembered = memory.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        stand_in::engages(self.config.hello_stand_in, remembered, link, last)
    }
}

/// How long OVS's HELLO may take once its connection is open: it sends it at
/// once (OpenFlow 1.3.5 §6.3.1: "each side of the connection must immediately
/// send an OFPT_HELLO message").
const OVS_HELLO_WAIT: Duration = Duration::from_secs(5);

/// OVS has just connected and the link is not known dead
/// ([`stand_in::engages`]): answers OVS's HELLO with the controller's HELLO
/// of the previous session, so OVS's HELLO wait (1 s) does not expire while
/// the agent reconnects or a restarted controller agent catches up
/// ([`quicsdn_lanes::hello`]), then reads OVS's HELLO, which still goes to
/// the controller. Returns (the HELLO sent, OVS's HELLO) and every byte read
/// from OVS; `None` if no HELLO is remembered yet (the first session waits as
/// before).
async fn stand_in_hello(
    inner: &Inner,
    service: &Service,
    memory: &HelloMemory,
    (rd, wr): &mut (LocalRead, LocalWrite),
) -> Result<Option<((Bytes, Bytes), Bytes)>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(sent) = memory.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
        return Ok(None);
    };
    wr.write_all(&sent)
        .await
        .map_err(|e| format!("cannot send it the controller's HELLO: {e}"))?;
    debug!(
        switch = %inner.identity, service = %service.name,
        "answered OVS's HELLO with the controller's previous one (the controller's own is not here yet)"
    );
    let mut read = bytes::BytesMut::with_capacity(quicsdn_lanes::MIN_READ_CHUNK);
    let whole = |b: &[u8]| {
        quicsdn_wire::openflow::Header::parse(b)
            .is_some_and(|h| b.len() >= usize::from(h.length) || usize::from(h.length) < HEADER_LEN)
    };
    let reading = async {
        while !whole(&read) {
            if read.len() > service.max_message {
                break;
            }
            if rd.read_buf(&mut read).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(OVS_HELLO_WAIT, reading).await {
        Err(_) => return Err(format!("OVS sent no HELLO within {OVS_HELLO_WAIT:?}")),
        Ok(Err(e)) => return Err(format!("OVS's connection failed before its HELLO: {e}")),
        Ok(Ok(())) => {}
    }
    let ovs = quicsdn_lanes::hello::leading_hello(&read)
        .ok_or_else(|| {
            "OVS's first message is not a HELLO (OpenFlow 1.3.5 §6.3.1 says it must be)".to_string()
        })?
        .to_vec();
    Ok(Some(((sent, Bytes::from(ovs)), read.freeze())))
}

/// Writes the echo stand-in's ECHO_REPLYs to OVS.
async fn write_replies(wr: &mut LocalWrite, replies: Vec<Bytes>) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    for r in replies {
        wr.write_all(&r).await?;
    }
    Ok(())
}

/// [`link_for_session`] for an OVS connection that got a stand-in HELLO:
/// meanwhile reads what OVS sends (into `preread`, for the session, up to one
/// largest message; then OVS's socket buffer holds the rest) and answers its
/// echo requests ([`EchoAnswer`]). Without this OVS drops the connection
/// after 10 s of unanswered inactivity probing while the switch agent waits
/// for its turn at a restarted controller agent (issue 18).
async fn link_answering_echo(
    inner: &Inner,
    service: &Service,
    (rd, wr): &mut (LocalRead, LocalWrite),
    preread: &mut Bytes,
    echo: &EchoAnswer,
) -> std::io::Result<Option<Arc<Link>>> {
    use tokio::io::AsyncReadExt;
    let waiting = link_for_session(inner);
    tokio::pin!(waiting);
    let mut read = bytes::BytesMut::from(&preread[..]);
    let mut eof = false;
    let link = loop {
        let room = !eof && read.len() < service.max_message;
        tokio::select! {
            link = &mut waiting => break link,
            n = rd.read_buf(&mut read), if room => {
                let n = n?;
                // OVS closed: the session passes that on, as without a wait.
                eof = n == 0;
                let new = &read[read.len() - n..];
                write_replies(wr, echo.observe(new)).await?;
            }
        }
    };
    *preread = read.freeze();
    Ok(link)
}

/// The live link, waiting at most for one connection attempt (started now if the
/// manager is waiting out a backoff). Attempts the controller agent refused do
/// not count: it is up and admitting others first, so OVS's connection waits
/// for the next attempt (OVS's own connection timeout still applies), and no
/// extra attempt is started, so the switch keeps to its short refusal backoff.
async fn link_for_session(inner: &Inner) -> Option<Arc<Link>> {
    let mut rx = inner.state.subscribe();
    let mut saw_attempt = false;
    let wait = async {
        loop {
            let refused = inner.refused.load(Ordering::Relaxed);
            match &*rx.borrow_and_update() {
                LinkState::Up(link) if link.is_alive() => return Some(link.clone()),
                LinkState::Up(_) => {}
                LinkState::Connecting => saw_attempt = true,
                LinkState::Down if refused => {}
                LinkState::Down if saw_attempt => return None,
                LinkState::Down => inner.kick.notify_one(),
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    };
    let limit = attempt_limit(&inner.config) + Duration::from_secs(1);
    tokio::time::timeout(limit, wait).await.ok().flatten()
}

/// `/healthz` of the switch agent: ready when the connection to the controller
/// agent is up (handshake complete) and OVS has a session open on every
/// service this agent listens for (so the local side is connected too).
fn health(inner: &Inner) -> (bool, serde_json::Value) {
    let link = match &*inner.state.borrow() {
        LinkState::Up(l) if l.is_alive() => Some(l.clone()),
        _ => None,
    };
    let confirmed = link.as_ref().is_some_and(|l| l.is_confirmed());
    let sessions = inner
        .metrics
        .connected()
        .into_iter()
        .find(|(s, _)| **s == *inner.identity)
        .map(|(_, by_service)| by_service)
        .unwrap_or_default();
    let mut missing = Vec::new();
    for s in inner.services.opened_here() {
        if sessions.get(&*s.name).copied().unwrap_or(0) < 1 {
            missing.push(s.name.clone());
        }
    }
    let ready = confirmed && missing.is_empty();
    let why = if !confirmed {
        "not connected to the controller agent".to_string()
    } else if !missing.is_empty() {
        format!("OVS has no session open on: {}", missing.join(", "))
    } else {
        "connected to the controller agent, and OVS to this agent".to_string()
    };
    let details = serde_json::json!({
        "ready": ready,
        "role": "switch",
        "switch": &*inner.identity,
        "controller_agent": link.map(|l| l.conn.remote_address().to_string()),
        "sessions": sessions,
        "reason": why,
    });
    (ready, details)
}

/// Milliseconds since the Unix epoch, for file names.
pub(crate) fn unix_millis() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
