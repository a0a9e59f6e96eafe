//! The proxy client: listens on each forward's `ptcp:` address and carries
//! every accepted TCP connection as one stream of its one QUIC connection to
//! the proxy server.
//!
//! The QUIC connection is kept up in the background and re-established with
//! Open vSwitch-style backoff (as the switch agent does). When it is lost,
//! every TCP connection it carried is reset. While it is down, a new TCP
//! connection triggers an immediate attempt and waits for that attempt only;
//! if it fails the TCP connection is reset at once, with a log line saying why.

use crate::config::{ClientConfig, Forward};
use crate::splice::{Ending, arm_reset, reset_tcp, splice};
use crate::{ProxyError, code, header};
use quicsdn_transport::backoff::Backoff;
use quicsdn_transport::local::{LocalListener, LocalStream};
use quicsdn_transport::rotation::{self, Loaded, Policy, Refusal, Reloaded, RotationHandle};
use quicsdn_transport::shutdown::Shutdown;
use quicsdn_transport::target::Target;
use quicsdn_transport::tls::{Credentials, Role, TlsError};
use quicsdn_transport::{identity, quic};
use quinn::{Connection, Endpoint, VarInt};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

/// A connection that ends sooner than this after its handshake counts as a
/// failed attempt for the backoff (e.g. the server rejected our certificate
/// after the handshake completed on our side, which TLS 1.3 allows).
const MIN_UPTIME: Duration = Duration::from_secs(2);

#[derive(Clone)]
enum LinkState {
    /// Not connected, waiting out a backoff.
    Down,
    Connecting,
    Up(Connection),
}

struct Inner {
    config: ClientConfig,
    endpoint: Endpoint,
    /// The client configuration of the next attempt; replaced when the
    /// certificate files are rotated.
    client: std::sync::Mutex<quinn::ClientConfig>,
    state: watch::Sender<LinkState>,
    /// Try now instead of waiting out the backoff.
    kick: Notify,
    /// Why the last attempt failed or the last connection ended, for the log
    /// line of a TCP connection that cannot be carried.
    last_failure: std::sync::Mutex<String>,
}

/// A running proxy client.
pub struct ProxyClient {
    inner: Arc<Inner>,
    shutdown: Shutdown,
    tasks: JoinSet<()>,
    listeners: Vec<(String, Target)>,
    rotation: RotationHandle,
}

impl ProxyClient {
    /// Loads credentials, binds every forward's listener and starts
    /// connecting. Errors here are configuration errors: nothing is left
    /// running.
    pub async fn start(config: ClientConfig) -> Result<ProxyClient, ProxyError> {
        config.validate()?;
        let loaded = Loaded::load(&config.tls)?;
        let creds = &loaded.creds;
        creds.warn_if_expiring();
        let mut bound = Vec::new();
        for f in &config.forwards {
            let listener =
                LocalListener::bind(&f.target)
                    .await
                    .map_err(|e| ProxyError::Listen {
                        forward: f.name.clone(),
                        target: f.target.to_string(),
                        reason: e.to_string(),
                    })?;
            bound.push((f.clone(), listener));
        }
        let bind = match config.bind {
            Some(b) => b,
            None if config.server.starts_with('[') => {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
            }
            None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        };
        let endpoint = quic::client_endpoint(bind, creds, &config.quic)?;
        let client = std::sync::Mutex::new(quic::client_config(creds, &config.quic)?);
        let inner = Arc::new(Inner {
            config,
            endpoint,
            client,
            state: watch::channel(LinkState::Down).0,
            kick: Notify::new(),
            last_failure: std::sync::Mutex::new("no attempt finished yet".into()),
        });
        let shutdown = Shutdown::new();
        let mut tasks = JoinSet::new();
        let (rotation, rotating) = rotation::task(
            loaded,
            rotation::Rotation {
                policy: Policy {
                    role: Role::Client,
                    same_identity: false,
                },
                poll: inner.config.quic.cert_poll,
                who: "proxy client".into(),
            },
            Arc::new(Rotate(inner.clone())),
            shutdown.clone(),
        );
        tasks.spawn(rotating);
        let mut listeners = Vec::new();
        for (forward, listener) in bound {
            let actual = listener.local_target();
            info!(forward = %forward.name, listen = %actual, "proxy client listening");
            listeners.push((forward.name.clone(), actual));
            tasks.spawn(accept_tcp(
                inner.clone(),
                Arc::new(forward),
                listener,
                shutdown.clone(),
            ));
        }
        tasks.spawn(manage_connection(inner.clone(), shutdown.clone()));
        Ok(ProxyClient {
            inner,
            shutdown,
            tasks,
            listeners,
            rotation,
        })
    }

    /// Reads the CA, certificate and key files again (SIGHUP) and, if they
    /// pass, uses them from the next connection on; the current one stays
    /// up. `None` once shutting down.
    pub async fn reload_credentials(&self) -> Option<Result<Reloaded, Refusal>> {
        self.rotation.reload().await
    }

    /// Where each forward listens (port 0 resolved).
    pub fn listeners(&self) -> &[(String, Target)] {
        &self.listeners
    }

    /// The TCP address forward `name` listens on.
    pub fn listen_addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners.iter().find_map(|(n, t)| match t {
            Target::PTcp { port, ip } if n == name => Some(SocketAddr::new(*ip, *port)),
            _ => None,
        })
    }

    /// The local UDP address of the QUIC endpoint.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// Moves the QUIC endpoint to a new local UDP address; the connection
    /// migrates (RFC 9000 §9) and the TCP connections carry on.
    pub fn rebind(&self, to: SocketAddr) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.rebind(quic::udp_socket(to)?)?;
        self.inner.endpoint.local_addr()
    }

    /// True while connected to the proxy server.
    pub fn is_connected(&self) -> bool {
        matches!(&*self.inner.state.borrow(), LinkState::Up(c) if c.close_reason().is_none())
    }

    /// Waits until connected, or `timeout` passes; true if connected.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.state.subscribe();
        tokio::time::timeout(
            timeout,
            rx.wait_for(|s| matches!(s, LinkState::Up(c) if c.close_reason().is_none())),
        )
        .await
        .is_ok_and(|r| r.is_ok())
    }

    /// Closes the QUIC connection (the TCP connections it carried are reset)
    /// and stops listening.
    pub async fn shutdown(mut self) {
        self.shutdown.trigger();
        self.inner.endpoint.close(
            VarInt::from_u32(code::SHUTDOWN),
            b"proxy client shutting down",
        );
        while self.tasks.join_next().await.is_some() {}
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.endpoint.wait_idle()).await;
    }
}

async fn manage_connection(inner: Arc<Inner>, shutdown: Shutdown) {
    let cfg = &inner.config;
    let mut backoff = Backoff::new(Duration::from_millis(100), cfg.max_backoff);
    loop {
        inner.state.send_replace(LinkState::Connecting);
        let attempt = tokio::select! {
            r = connect_once(&inner) => r,
            _ = shutdown.wait() => return,
        };
        match attempt {
            Ok(conn) => {
                let server = identity::of_connection(&conn).unwrap_or_else(|| "(unknown)".into());
                info!(%server, remote = %conn.remote_address(), "connected to the proxy server");
                inner.state.send_replace(LinkState::Up(conn.clone()));
                let started = tokio::time::Instant::now();
                let reason = tokio::select! {
                    r = conn.closed() => r,
                    _ = shutdown.wait() => return,
                };
                *inner.last_failure.lock().unwrap() = format!("connection lost: {reason}");
                inner.state.send_replace(LinkState::Down);
                warn!(%server, "connection to the proxy server lost ({reason}); its TCP connections are reset");
                if started.elapsed() >= MIN_UPTIME {
                    backoff.reset();
                }
            }
            Err(e) => {
                warn!("cannot connect to the proxy server at {}: {e}", cfg.server);
                *inner.last_failure.lock().unwrap() = e;
                inner.state.send_replace(LinkState::Down);
            }
        }
        let delay = backoff.next_delay(rand::random::<f64>());
        debug!("next connection attempt in {:.1}s", delay.as_secs_f64());
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = inner.kick.notified() => {}
            _ = shutdown.wait() => return,
        }
    }
}

async fn connect_once(inner: &Inner) -> Result<Connection, String> {
    let cfg = &inner.config;
    let addr = tokio::net::lookup_host(cfg.server.as_str())
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", cfg.server))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", cfg.server))?;
    let client = inner
        .client
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let connecting = inner
        .endpoint
        .connect_with(client, addr, &cfg.server_name)
        .map_err(|e| format!("cannot start a connection to {addr}: {e}"))?;
    // quinn gives up on a handshake after the idle timeout.
    connecting
        .await
        .map_err(|e| format!("handshake with {addr} failed: {e}"))
}

/// The live connection, waiting at most for one attempt (started now if the
/// manager is waiting out a backoff).
async fn connection(inner: &Inner) -> Option<Connection> {
    let mut rx = inner.state.subscribe();
    let mut saw_attempt = false;
    let wait = async {
        loop {
            match &*rx.borrow_and_update() {
                LinkState::Up(c) if c.close_reason().is_none() => return Some(c.clone()),
                LinkState::Up(_) => {}
                LinkState::Connecting => saw_attempt = true,
                LinkState::Down if saw_attempt => return None,
                LinkState::Down => inner.kick.notify_one(),
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    };
    let limit = inner.config.quic.idle_timeout + Duration::from_secs(1);
    tokio::time::timeout(limit, wait).await.ok().flatten()
}

async fn accept_tcp(
    inner: Arc<Inner>,
    forward: Arc<Forward>,
    listener: LocalListener,
    shutdown: Shutdown,
) {
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        match accepted {
            Ok(LocalStream::Tcp(tcp)) => {
                arm_reset(&tcp);
                conns.spawn(serve_tcp(inner.clone(), forward.clone(), tcp));
            }
            Ok(LocalStream::Unix(_)) => unreachable!("client forwards are ptcp: targets"),
            Err(e) => {
                // Typically EMFILE: wait a little rather than spin.
                warn!(forward = %forward.name, "accepting a TCP connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    // Dropping the tasks resets their TCP connections (arm_reset); the QUIC
    // connection's close (in shutdown) resets the streams.
    conns.shutdown().await;
}

async fn serve_tcp(inner: Arc<Inner>, forward: Arc<Forward>, tcp: TcpStream) {
    let peer = tcp
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let Some(conn) = connection(&inner).await else {
        let why = inner.last_failure.lock().unwrap().clone();
        info!(forward = %forward.name, %peer, "no connection to the proxy server ({why}); resetting the TCP connection");
        return reset_tcp(tcp);
    };
    let (mut send, recv) = match conn.open_bi().await {
        Ok(s) => s,
        Err(e) => {
            info!(forward = %forward.name, %peer, "cannot open a stream ({e}); resetting the TCP connection");
            return reset_tcp(tcp);
        }
    };
    if let Err(e) = send.write_all(&header::encode(&forward.name)).await {
        info!(forward = %forward.name, %peer, "cannot open a stream ({e}); resetting the TCP connection");
        return reset_tcp(tcp);
    }
    debug!(forward = %forward.name, %peer, stream = %send.id(), "carrying a TCP connection");
    let report = splice(tcp, send, recv, &conn).await;
    match &report.ending {
        Ending::Closed => {
            debug!(forward = %forward.name, %peer, sent = report.sent, received = report.received, "connection closed")
        }
        Ending::PeerReset(c)
            if matches!(
                c.into_inner() as u32,
                code::TARGET_REFUSED | code::TARGET_UNREACHABLE | code::UNKNOWN_FORWARD
            ) =>
        {
            warn!(
                forward = %forward.name, %peer,
                "the proxy server could not connect this forward: {}; reset the TCP connection",
                code::describe(*c)
            )
        }
        e => {
            info!(forward = %forward.name, %peer, sent = report.sent, received = report.received, "connection {}", e.describe())
        }
    }
}

/// Puts rotated credentials in use for the next connection attempt (a new
/// client configuration: a full handshake, presenting the new certificate).
struct Rotate(Arc<Inner>);

impl rotation::Install for Rotate {
    fn install(&self, creds: &Credentials) -> Result<(), TlsError> {
        let cfg = quic::client_config(creds, &self.0.config.quic)?;
        *self.0.client.lock().unwrap_or_else(|e| e.into_inner()) = cfg;
        Ok(())
    }
}
