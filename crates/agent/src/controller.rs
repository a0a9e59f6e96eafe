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

use crate::config::ControllerConfig;
use crate::link::Link;
use crate::services::{Service, ServiceTable};
use crate::{AgentError, Shutdown, control};
use quicsdn_transport::local::LocalListener;
use quicsdn_transport::tls::Credentials;
use quicsdn_transport::{identity, quic};
use quicsdn_wire::preamble::{Opener, code};
use quinn::{Endpoint, VarInt};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{info, warn};

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
}

/// A running controller agent.
pub struct ControllerAgent {
    inner: Arc<Inner>,
    shutdown: Shutdown,
    accept_task: JoinHandle<()>,
    control_task: Option<JoinHandle<()>>,
}

impl ControllerAgent {
    pub async fn start(config: ControllerConfig) -> Result<ControllerAgent, AgentError> {
        config.validate()?;
        let creds = Credentials::load(&config.common.tls)?;
        crate::warn_if_expiring(&creds);
        let services = Arc::new(ServiceTable::new(&config.common, Opener::Controller));
        let endpoint = quic::server_endpoint(config.listen, &creds, &config.common.quic)?;
        info!(
            listen = %endpoint.local_addr()?, identity = %creds.identity, services = %services.names(),
            "controller agent listening"
        );
        let inner = Arc::new(Inner {
            config,
            services,
            endpoint,
            switches: Mutex::new(HashMap::new()),
        });
        let shutdown = Shutdown::new();
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
        let accept_task = tokio::spawn(accept_connections(inner.clone(), shutdown.clone()));
        Ok(ControllerAgent {
            inner,
            shutdown,
            accept_task,
            control_task,
        })
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
    /// per-switch sockets.
    pub async fn shutdown(self) {
        self.shutdown.trigger();
        self.inner.endpoint.close(
            VarInt::from_u32(code::SHUTDOWN),
            b"controller agent shutting down",
        );
        let _ = self.accept_task.await;
        if let Some(t) = self.control_task {
            let _ = t.await;
        }
        let entries: Vec<SwitchEntry> = self
            .inner
            .switches
            .lock()
            .await
            .drain()
            .map(|(_, e)| e)
            .collect();
        for e in entries {
            stop_listeners(e.listeners).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.endpoint.wait_idle()).await;
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
            }
        })
    }

    fn rebind(&self, _bind: Option<SocketAddr>) -> Result<SocketAddr, String> {
        Err("only a switch agent moves to a new address; the controller agent keeps its --listen address".into())
    }
}

async fn accept_connections(inner: Arc<Inner>, shutdown: Shutdown) {
    let mut handlers = JoinSet::new();
    loop {
        tokio::select! {
            incoming = inner.endpoint.accept() => match incoming {
                Some(incoming) => {
                    handlers.spawn(handle_connection(inner.clone(), incoming));
                }
                None => break,
            },
            Some(_) = handlers.join_next(), if !handlers.is_empty() => {}
            _ = shutdown.wait() => break,
        }
    }
    handlers.shutdown().await;
}

async fn handle_connection(inner: Arc<Inner>, incoming: quinn::Incoming) {
    let remote = incoming.remote_address();
    let conn = match incoming.await {
        Ok(c) => c,
        Err(e) => {
            // rustls' reason says what was wrong with the certificate (expired,
            // unknown issuer, none presented); no local connection is ever opened.
            warn!(%remote, "rejected a switch agent during the handshake: {e}");
            return;
        }
    };
    let Some(switch) = identity::of_connection(&conn) else {
        warn!(%remote, "rejected a connection without a usable certificate identity");
        conn.close(
            VarInt::from_u32(code::PROTOCOL_VIOLATION),
            b"no certificate identity",
        );
        return;
    };
    let switch: Arc<str> = switch.into();
    let link = Link::new(
        conn.clone(),
        switch.clone(),
        inner.services.clone(),
        inner.config.common.streams,
        inner.config.relaxed_flow_mods,
        inner.config.common.local_connect_timeout,
    );
    register(&inner, &switch, &link).await;
    info!(switch = %switch, %remote, "switch agent connected");
    let reason = link.clone().serve().await;
    info!(switch = %switch, %remote, "switch agent disconnected: {reason}");
    unregister(&inner, &switch, &link).await;
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
    for l in listeners {
        l.abort();
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
                        sessions.spawn(l.open_session(service.clone(), local));
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
