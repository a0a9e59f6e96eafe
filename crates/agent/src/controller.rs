//! The controller agent: beside an unmodified controller, accepting one QUIC
//! connection per switch.
//!
//! For every session a switch opens, it dials the controller exactly as the switch
//! would have, so the controller sees one connection per switch per service. For
//! services the controller side opens (e.g. OVSDB with OVS listening), it keeps
//! one listener per connected switch, at a path with `{switch}` replaced by the
//! switch's certificate identity; a tool that connects there reaches that switch.
//!
//! One connection per switch identity: when a switch reconnects before its old
//! connection timed out (after a restart or a path change), the new connection
//! replaces the old one, which is closed with `SUPERSEDED`.

use crate::admission::{Admission, PERMIT_HOLD, Permit, WAITING_PER_PERMIT, Waiting};
use crate::config::{ConfigError, ControllerConfig, patient_attempt_limit};
use crate::link::{Link, Scheduling};
use crate::metrics::{Metrics, RefusalReason};
use crate::services::{Service, ServiceTable};
use crate::session::Handshake;
use crate::{AgentError, Shutdown, control};
use bytes::Bytes;
use quicsdn_transport::local::LocalListener;
use quicsdn_transport::quic_lb::ServerId;
use quicsdn_transport::resumption::{self, SessionStore};
use quicsdn_transport::roster;
use quicsdn_transport::rotation::{self, Loaded, Policy, Refusal, Reloaded, RotationHandle};
use quicsdn_transport::tls::{Credentials, Role, TlsError};
use quicsdn_transport::{identity, quic};
use quicsdn_wire::preamble::{Opener, code};
use quinn::{Endpoint, VarInt};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{info, warn};

/// How long a stopping controller agent keeps its closed connections around;
/// see [`ControllerAgent::shutdown`].
const CLOSING_WAIT: Duration = Duration::from_millis(200);

/// Writes the switch agents' roster (next to the session store) every
/// round in which it changed, for the agent that replaces this one after a
/// crash ([`roster`]). A failed write is tried again next round, and logged
/// once until one succeeds.
async fn keep_roster(roster: Arc<roster::Roster>, path: std::path::PathBuf, shutdown: Shutdown) {
    let mut tick = tokio::time::interval(roster::ROUND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait() => return,
        }
        let Some(peers) = roster.next_round() else {
            continue;
        };
        let file = path.clone();
        let error = match tokio::task::spawn_blocking(move || roster::save(&file, &peers)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        match error {
            None if failing => {
                failing = false;
                info!(roster = %path.display(), "the roster is written again");
            }
            None => {}
            Some(e) => {
                roster.mark_changed();
                if !std::mem::replace(&mut failing, true) {
                    warn!(
                        roster = %path.display(), error = %e,
                        "cannot write the roster; after a crash the next agent cannot reset these switches' connections at once (trying again every round)"
                    );
                }
            }
        }
    }
}

/// How often [`reset_predecessors`] looks at the handshake queue.
const RESET_TICK: Duration = Duration::from_millis(100);

/// Resets the connections of the switch agents the previous agent on this
/// address recorded ([`roster::Predecessors`]), skipping those heard from
/// already, at the pace handshakes are admitted: each tick, as many as there
/// are free handshake permits and nothing waits for them (all at once with
/// no `--max-handshakes`). After a crash most switch agents learn of it from
/// their own next packet within their keep-alive interval, and a queue full
/// of them gets no more; these resets reach the rest, in particular those
/// whose packet was lost before this agent listened and would retransmit
/// only after a probe timeout (docs/scale.md).
async fn reset_predecessors(
    mut predecessors: roster::Predecessors,
    admission: Arc<Admission>,
    roster: Arc<roster::Roster>,
    shutdown: Shutdown,
) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(RESET_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !predecessors.is_done() {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait() => return,
        }
        let budget = match admission.limit() {
            0 => usize::MAX,
            limit => {
                let now = admission.stats();
                limit.saturating_sub(now.in_flight + now.waiting)
            }
        };
        predecessors.send(budget, |address| roster.knows(address));
    }
    let (sent, skipped) = predecessors.counts();
    info!(
        recorded = predecessors.len(),
        resets = sent,
        already_back = skipped,
        ms = started.elapsed().as_millis() as u64,
        "reset the connections the previous agent on this address left behind"
    );
}

/// What the agent keeps per connected switch.
struct SwitchEntry {
    link: watch::Sender<Option<Arc<Link>>>,
    listeners: Vec<JoinHandle<()>>,
}

struct Inner {
    config: ControllerConfig,
    services: Arc<ServiceTable>,
    endpoint: Endpoint,
    switches: Mutex<HashMap<Arc<str>, SwitchEntry>>,
    admission: Arc<Admission>,
    /// `quicsdn snoop` clients.
    taps: Arc<crate::tap::Taps>,
    metrics: Arc<Metrics>,
    /// The server configuration, for connections accepted with a qlog;
    /// replaced, with the endpoint's, when the certificate files are rotated.
    server_config: std::sync::Mutex<quinn::ServerConfig>,
    /// The TLS sessions 0-RTT resumes, kept across rotations.
    sessions: Arc<SessionStore>,
    /// Connection attempts left unanswered while stopping.
    unanswered: AtomicU64,
    /// Set when a stop begins, before any connection is closed: from then
    /// on the accept loop admits nothing (why: [`ControllerAgent::stop_serving`]).
    stopping: AtomicBool,
}

/// A running controller agent.
pub struct ControllerAgent {
    inner: Arc<Inner>,
    shutdown: Shutdown,
    accept_task: JoinHandle<()>,
    control_task: Option<JoinHandle<()>>,
    /// The metrics endpoint and the migration watcher.
    metrics_tasks: Vec<JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
    rotation: RotationHandle,
}

/// One worker of a controller agent whose workers share a UDP port
/// (`--workers`, [`quicsdn_transport::reuseport`]): its socket of the group,
/// opened by the supervisor, and its index, the server id its connection IDs
/// carry.
pub struct Worker {
    pub socket: std::net::UdpSocket,
    pub index: u8,
}

impl Worker {
    /// What a file option (`--session-store`, `--control`) becomes for
    /// worker `index`: each worker keeps its own, `PATH.0`, `PATH.1`, ….
    pub fn path(path: &std::path::Path, index: u8) -> std::path::PathBuf {
        quicsdn_transport::files::suffixed(path, &format!(".{index}"))
    }
}

impl ControllerAgent {
    pub async fn start(config: ControllerConfig) -> Result<ControllerAgent, AgentError> {
        Self::start_with(config, None).await
    }

    /// [`ControllerAgent::start`] as one worker of a reuseport group.
    pub async fn start_worker(
        config: ControllerConfig,
        worker: Worker,
    ) -> Result<ControllerAgent, AgentError> {
        Self::start_with(config, Some(worker)).await
    }

    async fn start_with(
        config: ControllerConfig,
        worker: Option<Worker>,
    ) -> Result<ControllerAgent, AgentError> {
        config.validate()?;
        let metrics = Metrics::new("controller");
        let mut loaded = Loaded::load(&config.common.tls)?;
        loaded.creds.on_reject = Some(metrics.rejection_hook());
        let creds = &loaded.creds;
        metrics.set_credentials(creds);
        creds.warn_if_expiring();
        let services = Arc::new(ServiceTable::new(&config.common, Opener::Controller));
        let sessions = Arc::new(match &config.session_store {
            Some(path) => SessionStore::open(path, resumption::DEFAULT_CAPACITY).map_err(|e| {
                AgentError::Config(ConfigError::Invalid(format!("--session-store: {e}")))
            })?,
            None => SessionStore::in_memory(resumption::DEFAULT_CAPACITY),
        });
        let quic = server_options(&services, &config);
        let roster_path = config.session_store.as_deref().map(roster::path_for);
        // A worker's octet follows the host's server id; a single agent with
        // a server id is worker 0, so every host of one balancer issues IDs
        // of one length.
        let (socket, routing) = match worker {
            None => (
                quic::udp_socket(config.listen)?,
                config
                    .server_id
                    .as_ref()
                    .map(|id| ServerId::prefix(Some(id), 0)),
            ),
            Some(w) => (
                w.socket,
                Some(ServerId::prefix(config.server_id.as_ref(), w.index)),
            ),
        };
        let served = quic::server_endpoint_on(
            socket,
            routing.as_deref(),
            creds,
            &quic,
            sessions.clone(),
            roster_path.as_deref(),
        )?;
        let endpoint = served.endpoint;
        let server_config = served.config;
        info!(
            listen = %endpoint.local_addr()?, identity = %creds.identity, services = %services.names(),
            max_handshakes = config.max_handshakes,
            server_id = config.server_id.as_ref().map(tracing::field::display),
            "controller agent listening"
        );
        let admission = Admission::new(config.max_handshakes);
        let inner = Arc::new(Inner {
            config,
            services,
            endpoint,
            switches: Mutex::new(HashMap::new()),
            admission,
            taps: crate::tap::Taps::new(),
            metrics,
            server_config: std::sync::Mutex::new(server_config),
            sessions,
            unanswered: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let shutdown = Shutdown::new();
        let (rotation, rotating) = rotation::task(
            loaded,
            rotation::Rotation {
                policy: Policy {
                    role: Role::Server,
                    same_identity: false,
                },
                poll: quic.cert_poll,
                who: "controller agent".into(),
            },
            Arc::new(Rotate(inner.clone())),
            shutdown.clone(),
        );
        let mut control_task = None;
        if let Some(path) = inner.config.common.control.clone() {
            let listener = control::bind(&path).await.map_err(|e| AgentError::Listen {
                service: "control".into(),
                target: path.display().to_string(),
                reason: e.to_string(),
            })?;
            let handler = Arc::new(Control(inner.clone()));
            control_task = Some(tokio::spawn(control::serve(
                listener,
                path,
                handler,
                shutdown.clone(),
            )));
        }
        let mut metrics_tasks = vec![
            tokio::spawn(
                inner
                    .metrics
                    .clone()
                    .watch_migrations(Duration::from_secs(1), shutdown.clone()),
            ),
            tokio::spawn(rotating),
        ];
        if let (Some(roster), Some(path)) = (served.roster, roster_path) {
            if let Some(predecessors) = served.predecessors {
                metrics_tasks.push(tokio::spawn(reset_predecessors(
                    predecessors,
                    inner.admission.clone(),
                    roster.clone(),
                    shutdown.clone(),
                )));
            }
            metrics_tasks.push(tokio::spawn(keep_roster(roster, path, shutdown.clone())));
        }
        let mut metrics_addr = None;
        if let Some(addr) = inner.config.common.metrics {
            let health: crate::http::Health = {
                let inner = inner.clone();
                Arc::new(move || health(&inner))
            };
            let (local, server) =
                crate::http::start(addr, inner.metrics.clone(), health, shutdown.clone()).await?;
            info!(metrics = %local, "serving /metrics and /healthz");
            metrics_addr = Some(local);
            metrics_tasks.push(tokio::spawn(server));
        }
        let accept_task = tokio::spawn(accept_connections(inner.clone(), shutdown.clone()));
        Ok(ControllerAgent {
            inner,
            shutdown,
            accept_task,
            control_task,
            metrics_tasks,
            metrics_addr,
            rotation,
        })
    }

    /// Reads the CA, certificate and key files again (SIGHUP) and, if they
    /// pass the checks of [`rotation::check_replacement`], uses them for new
    /// handshakes; established connections stay up. `None` once shutting down.
    pub async fn reload_credentials(&self) -> Option<Result<Reloaded, Refusal>> {
        self.rotation.reload().await
    }

    /// The agent's metrics (served on `--metrics` if given).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Where `/metrics` and `/healthz` are served, with `--metrics`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The UDP address the agent listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// Identities of the switches connected now, sorted.
    pub async fn switches(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .inner
            .switches
            .lock()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        v.sort();
        v
    }

    /// Closes every connection (telling switch agents why) and removes the
    /// per-switch sockets. Logs how long each part took. While it runs, new
    /// connection attempts get no answer ([`stop_serving`](Self::stop_serving)).
    pub async fn shutdown(self) {
        let (started, connections) = self.stop_serving().await;
        let _ = self.accept_task.await;
        if let Some(t) = self.control_task {
            let _ = t.await;
        }
        for t in self.metrics_tasks {
            let _ = t.await;
        }
        let closed = started.elapsed();
        let sockets = stop_switch_listeners(&self.inner).await;
        let stopped = started.elapsed();
        close_endpoint(&self.inner).await;
        info!(
            connections,
            local_sockets = sockets,
            unanswered = self.inner.unanswered.load(Ordering::Relaxed),
            tasks_ms = closed.as_millis() as u64,
            sockets_ms = (stopped - closed).as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "closed every switch connection"
        );
    }

    /// [`shutdown`](Self::shutdown) for a process that exits right after:
    /// every switch agent is told and the per-switch sockets are removed, but
    /// the connections' tasks and state are not taken down one by one, which
    /// at 10,000 switches took seconds (mostly freeing memory) while this
    /// process held the port the next agent needs. The exit does the same
    /// at once: the kernel closes the sockets, TCP connections to the
    /// controller included, as dropping them would. At 10,000 switches most
    /// close packets have not left by then (the accept loop is taking the
    /// connections' tasks down meanwhile); those switch agents learn of the
    /// stop from the next agent's stateless resets to their next packet
    /// (docs/scale.md, "A stop that refuses nothing").
    pub async fn shutdown_for_exit(self) {
        let (started, connections) = self.stop_serving().await;
        let sockets = stop_switch_listeners(&self.inner).await;
        close_endpoint(&self.inner).await;
        info!(
            connections,
            local_sockets = sockets,
            unanswered = self.inner.unanswered.load(Ordering::Relaxed),
            total_ms = started.elapsed().as_millis() as u64,
            "closed every switch connection; exiting without taking each connection down"
        );
    }

    /// The part of a shutdown that switch agents see: every connection closed
    /// with SHUTDOWN, and from now on new attempts get **no answer** rather
    /// than a refusal (the accept loop ignores them, [`accept_connections`]).
    /// A refused switch agent retries within 100–800 ms and spends a 0-RTT
    /// session ticket on each attempt; during a stop of 10,000 connections
    /// that was tens of thousands of attempts, with their CPU on both sides,
    /// and the switches then met the new agent without tickets. Unanswered,
    /// a switch agent's Initial is sent again after its probe timeout (RFC
    /// 9002 §6.2.4: about 1 s, then 2 s) and reaches the agent that replaces
    /// this one, with the same ticket. Waits [`CLOSING_WAIT`] for the close
    /// packets to leave. Returns when it started and how many connections
    /// there were.
    async fn stop_serving(&self) -> (Instant, usize) {
        let started = Instant::now();
        // Admit nothing from here on, *before* the first close goes out: a
        // switch agent reconnects the moment it reads our close, and an
        // attempt admitted now would be closed mid-handshake by the endpoint's
        // close below. Closed before its handshake completed, an attempt
        // looks like a refusal of the switch: RFC 9000 §10.2.3, "A
        // CONNECTION_CLOSE of type 0x1d MUST be replaced by a
        // CONNECTION_CLOSE of type 0x1c when sending the frame in Initial or
        // Handshake packets", with the code APPLICATION_ERROR and no reason.
        // Its switch agent then stops answering OVS's HELLO in the
        // controller's stead (crate::stand_in) and OVS's 1 s HELLO wait
        // expires (44 switches in one 10,000-switch restart, 2026-12-01).
        // Unanswered, the attempt's Initial is sent again to our successor.
        self.inner.stopping.store(true, Ordering::Relaxed);
        let connections = self.inner.endpoint.open_connections();
        let links: Vec<Arc<Link>> = self
            .inner
            .switches
            .lock()
            .await
            .values()
            .filter_map(|e| e.link.borrow().clone())
            .collect();
        for link in &links {
            link.conn
                .close(VarInt::from_u32(code::SHUTDOWN), SHUTDOWN_REASON);
        }
        drop(links);
        // The accept loop ends; attempts stay unanswered.
        self.shutdown.trigger();
        // RFC 9000 §10.2.1: a closing endpoint answers late packets with
        // another CONNECTION_CLOSE, for a close that was lost. Not the full
        // 3 × PTO: a restart is measured by how soon the new agent listens,
        // and Open vSwitch reconnects one second after losing its controller
        // (docs/benchmarks.md, "bench storm"). A switch agent whose close was
        // lost learns of it from the next agent's stateless reset, or at its
        // grace period if none comes.
        tokio::time::sleep(CLOSING_WAIT).await;
        (started, connections)
    }
}

/// The reason a stopping controller agent gives with its CONNECTION_CLOSE.
const SHUTDOWN_REASON: &[u8] = b"controller agent shutting down";

/// The end of a stop: what is left (handshakes under way) is told, and the
/// closed connections are kept [`CLOSING_WAIT`] at most (RFC 9000 §10.2.1).
/// From here on quinn refuses new attempts, for the moment until the process
/// exits.
async fn close_endpoint(inner: &Inner) {
    inner
        .endpoint
        .close(VarInt::from_u32(code::SHUTDOWN), SHUTDOWN_REASON);
    let _ = tokio::time::timeout(CLOSING_WAIT, inner.endpoint.wait_idle()).await;
}

/// A connection attempt while stopping: no answer (why:
/// [`ControllerAgent::stop_serving`]); counted for the closing log line.
fn leave_unanswered(inner: &Inner, incoming: quinn::Incoming) {
    inner.unanswered.fetch_add(1, Ordering::Relaxed);
    incoming.ignore();
}

/// Stops every switch's local listeners (their socket files go with them);
/// returns how many there were.
async fn stop_switch_listeners(inner: &Inner) -> usize {
    let listeners: Vec<JoinHandle<()>> = inner
        .switches
        .lock()
        .await
        .drain()
        .flat_map(|(_, e)| e.listeners)
        .collect();
    let n = listeners.len();
    stop_listeners(listeners).await;
    n
}

/// Puts rotated credentials in use: the endpoint's server configuration
/// (quinn uses it for connections accepted from now on) with the same
/// session store, so switch agents' tickets stay valid.
struct Rotate(Arc<Inner>);

impl rotation::Install for Rotate {
    fn install(&self, creds: &Credentials) -> Result<(), TlsError> {
        let inner = &self.0;
        let quic = server_options(&inner.services, &inner.config);
        let server = quic::server_config(creds, &quic, inner.sessions.clone())?;
        inner.endpoint.set_server_config(Some(server.clone()));
        *inner
            .server_config
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = server;
        Ok(())
    }

    fn outcome(&self, result: &Result<Reloaded, Refusal>, current: &Credentials) {
        self.0.metrics.reloaded(result.is_ok());
        if let Ok(Reloaded::Replaced { .. }) = result {
            self.0.metrics.set_credentials(current);
        }
    }
}

/// The controller agent's answers on its control socket.
struct Control(Arc<Inner>);

impl control::Handler for Control {
    fn status(&self) -> control::Answer<'_, control::Status> {
        Box::pin(async move {
            let inner = &self.0;
            let mut connections: Vec<control::ConnectionStatus> = inner
                .switches
                .lock()
                .await
                .values()
                .filter_map(|e| e.link.borrow().clone())
                .filter(|l| l.is_alive())
                .map(|l| control::ConnectionStatus::of(&l))
                .collect();
            connections.sort_by(|a, b| a.switch.cmp(&b.switch));
            control::Status {
                role: "controller".into(),
                local_addr: inner.endpoint.local_addr().unwrap_or(inner.config.listen),
                connections,
                admission: Some(inner.admission.stats()),
                keylog: None,
            }
        })
    }

    fn snoop(
        &self,
        switch: Option<String>,
        service: Option<String>,
        follow: bool,
    ) -> control::Answer<'_, Result<control::Snoop, String>> {
        Box::pin(async move {
            let inner = &self.0;
            // The switches connected now.
            let mut switches: Vec<String> = inner
                .switches
                .lock()
                .await
                .iter()
                .filter(|(_, e)| e.link.borrow().as_ref().is_some_and(|l| l.is_alive()))
                .map(|(name, _)| name.to_string())
                .collect();
            switches.sort();
            let switch = control::pick("switch", switch.as_deref(), &switches)?;
            control::Snoop::attach(
                &inner.taps,
                &inner.services,
                switch,
                service.as_deref(),
                follow,
            )
        })
    }

    fn rebind(&self, _bind: Option<SocketAddr>) -> Result<SocketAddr, String> {
        Err("only a switch agent moves to a new address; the controller agent keeps its --listen address".into())
    }
}

/// The QUIC settings of the controller agent's connections: the services'
/// own, with quinn's idle timeout at [`patient_attempt_limit`], so that a
/// switch agent's 0-RTT attempt, which applies the idle timeout remembered
/// from the previous connection at once (RFC 9000 §7.4.1), waits as long for
/// the first answer as its full handshakes do. An established connection
/// is still given up after the grace period, by each side's own silence
/// check (`Link::serve`); quinn's timer is the backstop behind it.
fn server_options(services: &ServiceTable, config: &ControllerConfig) -> quic::QuicOptions {
    let mut opts = services.quic_options(&config.common);
    opts.idle_timeout = patient_attempt_limit(config.common.quic.idle_timeout);
    opts
}

async fn accept_connections(inner: Arc<Inner>, shutdown: Shutdown) {
    let mut handlers = JoinSet::new();
    let mut report = tokio::time::interval(Duration::from_secs(1));
    let mut reported = inner.admission.stats();
    let limit = inner.admission.limit();
    // Attempts over --max-handshakes wait (crate::admission::Waiting) rather
    // than being refused at once; one that waited longer than two thirds of
    // what a switch agent with one controller agent gives its attempt (twice
    // the grace period: config::patient_attempt_limit) is refused so the
    // switch tries again. The third left covers the time an attempt spent at a
    // stopping agent before it reached this one. Refusing at two thirds of
    // the grace period instead (before 2026-12-02) refused thousands of
    // attempts per restart of 10,000 switches, each a further handshake on
    // both sides (docs/scale.md, "Patience for the first answer").
    let max_wait = patient_attempt_limit(inner.config.common.quic.idle_timeout) * 2 / 3;
    let mut waiting = Waiting::new(limit.saturating_mul(WAITING_PER_PERMIT), max_wait);
    let refuse = |incoming: quinn::Incoming| {
        inner.admission.count_refusal();
        inner.metrics.refused(RefusalReason::admission);
        incoming.refuse();
    };
    loop {
        tokio::select! {
            incoming = inner.endpoint.accept() => match incoming {
                // Stopping (also when both branches are ready at once): not
                // admitted.
                Some(incoming) if inner.stopping.load(Ordering::Relaxed) => {
                    leave_unanswered(&inner, incoming);
                    if shutdown.is_triggered() {
                        break;
                    }
                }
                // Handshake admission control (crate::admission): over the
                // limit, wait for a permit, returning switches first; refuse
                // (RFC 9000 §20.1 CONNECTION_REFUSED) only when the queue is
                // full, rather than let every handshake slow all the others down.
                Some(incoming) => match inner.admission.try_admit() {
                    Some(permit) if waiting.is_empty() => {
                        handlers.spawn(handle_connection(inner.clone(), Box::new(incoming), permit));
                    }
                    permit => {
                        drop(permit);
                        let returning = incoming.remote_address_validated();
                        let queued = match waiting.push(incoming, returning, Instant::now()) {
                            Ok(()) => true,
                            Err(incoming) => {
                                refuse(incoming);
                                false
                            }
                        };
                        inner.admission.count_waiting(queued, waiting.len());
                    }
                },
                None => break,
            },
            _ = inner.admission.freed(), if !waiting.is_empty() => {
                while !waiting.is_empty() && !inner.stopping.load(Ordering::Relaxed) {
                    let Some(permit) = inner.admission.try_admit() else { break };
                    match waiting.pop(Instant::now(), refuse) {
                        Some(incoming) => {
                            handlers.spawn(handle_connection(inner.clone(), Box::new(incoming), permit));
                        }
                        None => break,
                    }
                }
                inner.admission.count_waiting(false, waiting.len());
            }
            Some(_) = handlers.join_next(), if !handlers.is_empty() => {}
            _ = report.tick() => {
                waiting.expire(Instant::now(), refuse);
                inner.admission.count_waiting(false, waiting.len());
                // One line per second at most, not one per attempt.
                let now = inner.admission.stats();
                if now.refused > reported.refused || now.waited > reported.waited || now.slow > reported.slow {
                    info!(
                        refused = now.refused - reported.refused,
                        waited = now.waited - reported.waited,
                        slow = now.slow - reported.slow,
                        waiting = now.waiting,
                        admitted = now.admitted - reported.admitted,
                        in_flight = now.in_flight,
                        max_handshakes = now.max_handshakes,
                        "admission control: connection attempts over --max-handshakes wait (returning switches first); those refused retry shortly"
                    );
                }
                reported = now;
            }
            _ = shutdown.wait() => break,
        }
    }
    // Stopping: attempts get no answer from now on, not a refusal (why:
    // ControllerAgent::stop_serving), until the endpoint closes or the
    // process exits. Those waiting for a permit too (a dropped Incoming
    // would be refused).
    for incoming in waiting.into_items() {
        leave_unanswered(&inner, incoming);
    }
    let stopping = inner.clone();
    tokio::spawn(async move {
        while let Some(incoming) = stopping.endpoint.accept().await {
            leave_unanswered(&stopping, incoming);
        }
    });
    handlers.shutdown().await;
}

/// Serves one switch agent's connection. `permit` counts its handshake
/// against `--max-handshakes` until the handshake has completed or failed,
/// or for [`PERMIT_HOLD`] at most.
/// The future lives as long as the connection, so what only its start and
/// end need is boxed (`incoming`, and the waits for the switches' map)
/// rather than kept in every idle connection's task (issue 18).
async fn handle_connection(inner: Arc<Inner>, incoming: Box<quinn::Incoming>, permit: Permit) {
    let mut permit = Some(permit);
    let remote = incoming.remote_address();
    // With --qlog-dir the file is named by the address until the switch is known.
    let mut qlog_file = None;
    let accepted = match &inner.config.common.qlog {
        None => incoming.accept(),
        Some(qlog) => {
            let name = format!(
                "{}-{}-controller",
                quic::file_stem(&remote.to_string()),
                crate::switch::unix_millis()
            );
            match qlog.transport(
                &server_options(&inner.services, &inner.config),
                &name,
                &format!("quicsdn controller agent, switch at {remote}"),
            ) {
                Ok((transport, path)) => {
                    qlog_file = Some(path);
                    let mut cfg = inner
                        .server_config
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    cfg.transport_config(transport);
                    incoming.accept_with(Arc::new(cfg))
                }
                Err(e) => {
                    warn!(%remote, "--qlog-dir: {e}; accepting without a qlog");
                    incoming.accept()
                }
            }
        }
    };
    let connecting = match accepted {
        Ok(c) => c,
        Err(e) => return handshake_failed(&inner, remote, &e),
    };
    // On a server into_0rtt always succeeds; `done` resolves when the handshake
    // has completed or failed.
    let (conn, done) = match connecting.into_0rtt() {
        Ok((conn, done)) => (conn, Some(done)),
        Err(connecting) => match holding(&mut permit, connecting).await {
            Ok(conn) => (conn, None),
            Err(e) => return handshake_failed(&inner, remote, &e),
        },
    };
    // A resumed session (a ticket from this agent's session store) names its
    // switch already, from the certificate verified when the ticket was issued:
    // its 0-RTT data can be served now, through the 0-RTT gates. A full
    // handshake names the switch only once its certificate is verified.
    let early = match done {
        Some(done) if identity::of_connection(&conn).is_some() => {
            Some((watch::channel(Handshake::Pending), done))
        }
        Some(done) => {
            holding(&mut permit, done).await;
            drop(permit.take());
            if let Some(e) = conn.close_reason() {
                return handshake_failed(&inner, remote, &e);
            }
            None
        }
        None => None,
    };
    let Some(switch) = identity::of_connection(&conn) else {
        warn!(%remote, "rejected a connection without a usable certificate identity");
        inner.metrics.refused(RefusalReason::bad_certificate);
        conn.close(
            VarInt::from_u32(code::PROTOCOL_VIOLATION),
            b"no certificate identity",
        );
        return;
    };
    let switch: Arc<str> = switch.into();
    if let Some(path) = qlog_file {
        // Named by the switch from now on (the file stays open across a rename).
        let named = path.with_file_name(format!(
            "{}-{}",
            quic::file_stem(&switch),
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
        if let Err(e) = std::fs::rename(&path, &named) {
            warn!(switch = %switch, "cannot rename {}: {e}", path.display());
        }
    }
    // A full handshake has completed here; a resumed one holds its permit
    // until it completes, below.
    if early.is_none() {
        drop(permit.take());
    }
    let link = Link::new(
        conn.clone(),
        switch.clone(),
        inner.services.clone(),
        Scheduling {
            mode: inner.config.common.streams,
            relaxed: inner.config.relaxed_flow_mods,
            coalesce: inner.config.common.coalesce,
        },
        inner.config.common.local_connect_timeout,
        early.as_ref().map(|((_, rx), _)| rx.clone()),
        (inner.metrics.clone(), inner.taps.clone()),
    );
    let serving = link.clone().serve(&inner.config.common.quic, None);
    tokio::pin!(serving);
    if let Some(((confirmed, _), done)) = early {
        // Registering supersedes the switch's older connection, so it waits for
        // the handshake: replayed 0-RTT packets never complete one (RFC 9001
        // §5.6), and must not take a live switch's place.
        tokio::select! {
            reason = &mut serving => {
                info!(switch = %switch, %remote, "a 0-RTT connection ended before its handshake completed: {reason}");
                return;
            }
            _ = holding(&mut permit, done) => {}
        }
        drop(permit.take());
        if let Some(e) = conn.close_reason() {
            info!(switch = %switch, %remote, "a 0-RTT connection failed its handshake: {e}");
            return;
        }
        confirmed.send_replace(Handshake::Complete);
        inner.metrics.zero_rtt(&switch, true);
    }
    Box::pin(register(&inner, &switch, &link)).await;
    inner.metrics.link_up(&link);
    let serial = identity::peer_certificate(&conn).map(|c| c.serial);
    info!(
        switch = %switch, %remote, zero_rtt = link.early_start, serial = %serial.as_deref().unwrap_or(""),
        "switch agent connected"
    );
    let reason = serving.await;
    inner.metrics.link_down(&link, &reason);
    info!(switch = %switch, %remote, "switch agent disconnected: {reason}");
    Box::pin(unregister(&inner, &switch, &link)).await;
}

/// Awaits a handshake's completion holding `permit` for at most
/// [`PERMIT_HOLD`], then without it (why: [`PERMIT_HOLD`]).
async fn holding<F: std::future::Future>(permit: &mut Option<Permit>, handshake: F) -> F::Output {
    tokio::pin!(handshake);
    tokio::select! {
        done = &mut handshake => return done,
        _ = tokio::time::sleep(PERMIT_HOLD), if permit.is_some() => {
            if let Some(p) = permit.take() {
                p.release_slow();
            }
        }
    }
    handshake.await
}

fn handshake_failed(inner: &Inner, remote: SocketAddr, e: &quinn::ConnectionError) {
    // rustls' reason says what was wrong with the certificate (expired,
    // unknown issuer, none presented); no local connection is ever opened.
    // RFC 9001 §8.1: a server that supports none of the client's ALPN
    // protocols "MUST close the connection" with no_application_protocol (TLS
    // alert 120): a QUIC client, but not a quicsdn switch agent.
    let no_alpn = matches!(e, quinn::ConnectionError::TransportError(t)
        if t.code == quinn::TransportErrorCode::crypto(120));
    if no_alpn {
        warn!(%remote, "rejected a connection during the handshake: the client does not offer ALPN {} (not a quicsdn switch agent): {e}",
            String::from_utf8_lossy(quicsdn_wire::preamble::ALPN));
    } else {
        warn!(%remote, "rejected a switch agent during the handshake: {e}");
    }
    if let Some(reason) = RefusalReason::of_failed_handshake(e) {
        inner.metrics.refused(reason);
    }
}

/// Makes `link` the switch's current connection, superseding an older one, and
/// starts the switch's listeners if it had none.
async fn register(inner: &Arc<Inner>, switch: &Arc<str>, link: &Arc<Link>) {
    let mut switches = inner.switches.lock().await;
    if let Some(entry) = switches.get(switch) {
        let old = entry.link.send_replace(Some(link.clone()));
        if let Some(old) = old.filter(|o| o.is_alive()) {
            info!(switch = %switch, old_remote = %old.conn.remote_address(), "replacing the switch's older connection");
            old.conn.close(
                VarInt::from_u32(code::SUPERSEDED),
                b"superseded by a newer connection",
            );
        }
        return;
    }
    let (tx, _) = watch::channel(Some(link.clone()));
    let mut listeners = Vec::new();
    for service in inner.services.opened_here() {
        let target = service.target.for_switch(switch);
        match LocalListener::bind(&target).await {
            Ok(listener) => {
                info!(switch = %switch, service = %service.name, listen = %target, "listening for the switch");
                listeners.push(tokio::spawn(accept_for_switch(
                    switch.clone(),
                    service.clone(),
                    listener,
                    tx.subscribe(),
                )));
            }
            Err(e) => {
                warn!(switch = %switch, service = %service.name, "cannot listen at {target}: {e}")
            }
        }
    }
    switches.insert(
        switch.clone(),
        SwitchEntry {
            link: tx,
            listeners,
        },
    );
}

/// Forgets the switch if `link` is still its current connection, and removes its
/// listeners. The map stays locked until the listeners are gone, so a reconnect
/// cannot race with their socket files.
async fn unregister(inner: &Arc<Inner>, switch: &Arc<str>, link: &Arc<Link>) {
    let mut switches = inner.switches.lock().await;
    let current = switches
        .get(switch)
        .and_then(|e| e.link.borrow().clone())
        .is_some_and(|l| Arc::ptr_eq(&l, link));
    if current && let Some(entry) = switches.remove(switch) {
        stop_listeners(entry.listeners).await;
    }
}

async fn stop_listeners(listeners: Vec<JoinHandle<()>>) {
    // All aborted before any is awaited: awaiting each in turn would cost a
    // scheduler round per socket (at shutdown, one per switch).
    for l in &listeners {
        l.abort();
    }
    for l in listeners {
        let _ = l.await;
    }
}

async fn accept_for_switch(
    switch: Arc<str>,
    service: Arc<Service>,
    listener: LocalListener,
    link: watch::Receiver<Option<Arc<Link>>>,
) {
    let mut sessions = JoinSet::new();
    loop {
        let local = tokio::select! {
            r = listener.accept() => r,
            Some(_) = sessions.join_next(), if !sessions.is_empty() => continue,
        };
        match local {
            Ok(local) => {
                let current = link.borrow().clone().filter(|l| l.is_alive());
                match current {
                    Some(l) => {
                        // Registered links have completed their handshake: no 0-RTT retry.
                        let open =
                            l.open_session(service.clone(), local.into_split(), Bytes::new(), None);
                        sessions.spawn(async move {
                            open.await;
                        });
                    }
                    None => info!(
                        switch = %switch, service = %service.name,
                        "a local client connected but the switch is not connected; closing it"
                    ),
                }
            }
            Err(e) => {
                warn!(switch = %switch, service = %service.name, "accepting a local connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// `/healthz` of the controller agent: ready when at least one switch is
/// connected and every connected switch has a session open on each service
/// the switch side opens (OpenFlow: its session reached the controller).
fn health(inner: &Inner) -> (bool, serde_json::Value) {
    let expected: Vec<String> = inner
        .services
        .iter()
        .filter(|s| s.opener == Opener::Switch)
        .map(|s| s.name.to_string())
        .collect();
    let switches = inner.metrics.connected();
    let mut incomplete = Vec::new();
    let mut listed = serde_json::Map::new();
    for (switch, sessions) in &switches {
        if expected
            .iter()
            .any(|svc| sessions.get(svc).copied().unwrap_or(0) < 1)
        {
            incomplete.push(switch.clone());
        }
        listed.insert(switch.clone(), serde_json::json!(sessions));
    }
    let ready = !switches.is_empty() && incomplete.is_empty();
    let why = if switches.is_empty() {
        "no switch agent connected".to_string()
    } else if !incomplete.is_empty() {
        format!(
            "switches without a session to the controller: {}",
            incomplete.join(", ")
        )
    } else {
        format!(
            "{} switch(es) connected, each with its sessions",
            switches.len()
        )
    };
    let details = serde_json::json!({
        "ready": ready,
        "role": "controller",
        "switches": listed,
        "reason": why,
    });
    (ready, details)
}
