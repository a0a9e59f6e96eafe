//! The proxy server: accepts proxy clients' QUIC connections and, for each
//! stream, opens one TCP connection to the target of the forward it names.

use crate::config::ServerConfig;
use crate::splice::{Ending, arm_reset, splice};
use crate::{ProxyError, code, header};
use quicsdn_transport::local::LocalStream;
use quicsdn_transport::resumption::{self, SessionStore};
use quicsdn_transport::rotation::{self, Loaded, Policy, Refusal, Reloaded, RotationHandle};
use quicsdn_transport::shutdown::Shutdown;
use quicsdn_transport::target::Target;
use quicsdn_transport::tls::{Credentials, Role, TlsError};
use quicsdn_transport::{identity, quic};
use quinn::{Endpoint, RecvStream, SendStream, VarInt};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn};

/// How long a new stream may take to deliver its header.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

struct Inner {
    forwards: HashMap<String, Target>,
    connect_timeout: Duration,
}

/// A running proxy server.
pub struct ProxyServer {
    endpoint: Endpoint,
    shutdown: Shutdown,
    accept_task: JoinHandle<()>,
    rotation: RotationHandle,
    rotation_task: JoinHandle<()>,
}

impl ProxyServer {
    /// Loads credentials and listens. Errors here are configuration errors:
    /// nothing is left running.
    pub async fn start(config: ServerConfig) -> Result<ProxyServer, ProxyError> {
        config.validate()?;
        let loaded = Loaded::load(&config.tls)?;
        let creds = &loaded.creds;
        creds.warn_if_expiring();
        let sessions = Arc::new(SessionStore::in_memory(resumption::DEFAULT_CAPACITY));
        let (endpoint, _) =
            quic::server_endpoint(config.listen, creds, &config.quic, sessions.clone())?;
        info!(
            listen = %endpoint.local_addr()?, identity = %creds.identity,
            forwards = %config.forwards.iter().map(|f| format!("{}={}", f.name, f.target)).collect::<Vec<_>>().join(" "),
            congestion = ?config.quic.congestion,
            "proxy server listening"
        );
        let inner = Arc::new(Inner {
            forwards: config
                .forwards
                .iter()
                .map(|f| (f.name.clone(), f.target.clone()))
                .collect(),
            connect_timeout: config.connect_timeout,
        });
        let shutdown = Shutdown::new();
        let (rotation, rotating) = rotation::task(
            loaded,
            rotation::Rotation {
                policy: Policy {
                    role: Role::Server,
                    same_identity: false,
                },
                poll: config.quic.cert_poll,
                who: "proxy server".into(),
            },
            Arc::new(Rotate {
                endpoint: endpoint.clone(),
                quic: config.quic,
                sessions,
            }),
            shutdown.clone(),
        );
        let rotation_task = tokio::spawn(rotating);
        let accept_task = tokio::spawn(accept_connections(
            inner,
            endpoint.clone(),
            shutdown.clone(),
        ));
        Ok(ProxyServer {
            endpoint,
            shutdown,
            accept_task,
            rotation,
            rotation_task,
        })
    }

    /// Reads the CA, certificate and key files again (SIGHUP) and, if they
    /// pass, uses them for new handshakes; established connections stay up.
    /// `None` once shutting down.
    pub async fn reload_credentials(&self) -> Option<Result<Reloaded, Refusal>> {
        self.rotation.reload().await
    }

    /// The UDP address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Closes every connection (the clients reset their TCP connections).
    pub async fn shutdown(self) {
        self.shutdown.trigger();
        self.endpoint.close(
            VarInt::from_u32(code::SHUTDOWN),
            b"proxy server shutting down",
        );
        let _ = self.accept_task.await;
        let _ = self.rotation_task.await;
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
    }
}

/// Puts rotated credentials in use for new handshakes (the endpoint's server
/// configuration, with the same session store).
struct Rotate {
    endpoint: Endpoint,
    quic: quic::QuicOptions,
    sessions: Arc<SessionStore>,
}

impl rotation::Install for Rotate {
    fn install(&self, creds: &Credentials) -> Result<(), TlsError> {
        let server = quic::server_config(creds, &self.quic, self.sessions.clone())?;
        self.endpoint.set_server_config(Some(server));
        Ok(())
    }
}

async fn accept_connections(inner: Arc<Inner>, endpoint: Endpoint, shutdown: Shutdown) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => {
                    conns.spawn(serve_connection(inner.clone(), incoming));
                }
                None => break,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.wait() => break,
        }
    }
    conns.shutdown().await;
}

async fn serve_connection(inner: Arc<Inner>, incoming: quinn::Incoming) {
    let remote = incoming.remote_address();
    let conn = match incoming.await {
        Ok(c) => c,
        Err(e) => {
            // A rejected certificate was logged, with the identity it claimed,
            // by the verifier.
            warn!(%remote, "handshake with a proxy client failed: {e}");
            return;
        }
    };
    let client: Arc<str> = identity::of_connection(&conn)
        .unwrap_or_else(|| "(unknown)".into())
        .into();
    info!(%client, %remote, "proxy client connected");
    let mut streams = JoinSet::new();
    let reason = loop {
        tokio::select! {
            s = conn.accept_bi() => match s {
                Ok((send, recv)) => {
                    streams.spawn(serve_stream(inner.clone(), conn.clone(), client.clone(), send, recv));
                }
                Err(e) => break e,
            },
            Some(_) = streams.join_next(), if !streams.is_empty() => {}
        }
    };
    // Every stream fails with the connection: their TCP connections are reset.
    while streams.join_next().await.is_some() {}
    info!(%client, %remote, "proxy client disconnected ({reason}); its TCP connections are reset");
}

/// Refuses a stream: both directions reset with `code`.
fn refuse(mut send: SendStream, mut recv: RecvStream, c: u32) {
    let _ = send.reset(c.into());
    let _ = recv.stop(c.into());
}

async fn read_header(recv: &mut RecvStream) -> Result<String, String> {
    let mut prefix = [0u8; 2];
    recv.read_exact(&mut prefix)
        .await
        .map_err(|e| e.to_string())?;
    let p = header::decode_prefix(prefix).map_err(|e| e.to_string())?;
    let mut name = vec![0u8; p.name_len];
    recv.read_exact(&mut name)
        .await
        .map_err(|e| e.to_string())?;
    header::decode_name(&name).map_err(|e| e.to_string())
}

async fn serve_stream(
    inner: Arc<Inner>,
    conn: quinn::Connection,
    client: Arc<str>,
    send: SendStream,
    mut recv: RecvStream,
) {
    let stream = recv.id();
    let name = match tokio::time::timeout(HEADER_TIMEOUT, read_header(&mut recv)).await {
        Ok(Ok(name)) => name,
        Ok(Err(e)) => {
            warn!(%client, %stream, "invalid stream header: {e}; resetting the stream");
            return refuse(send, recv, code::PROTOCOL);
        }
        Err(_) => {
            warn!(%client, %stream, "no stream header within {HEADER_TIMEOUT:?}; resetting the stream");
            return refuse(send, recv, code::PROTOCOL);
        }
    };
    let Some(target) = inner.forwards.get(&name) else {
        let mut known: Vec<&str> = inner.forwards.keys().map(String::as_str).collect();
        known.sort();
        warn!(
            %client, forward = %name,
            "the proxy client asked for a forward this server does not have (it has: {}); resetting its connection",
            known.join(", ")
        );
        return refuse(send, recv, code::UNKNOWN_FORWARD);
    };
    let connected = tokio::time::timeout(inner.connect_timeout, LocalStream::connect(target)).await;
    let tcp = match connected {
        Ok(Ok(LocalStream::Tcp(tcp))) => {
            arm_reset(&tcp);
            tcp
        }
        Ok(Ok(LocalStream::Unix(_))) => unreachable!("server forwards are tcp: targets"),
        Ok(Err(e)) => {
            let c = if e.kind() == io::ErrorKind::ConnectionRefused {
                code::TARGET_REFUSED
            } else {
                code::TARGET_UNREACHABLE
            };
            warn!(%client, forward = %name, %target, "cannot connect to the target: {e}; resetting the client's connection");
            return refuse(send, recv, c);
        }
        Err(_) => {
            warn!(
                %client, forward = %name, %target,
                "the target did not accept within {:?}; resetting the client's connection",
                inner.connect_timeout
            );
            return refuse(send, recv, code::TARGET_UNREACHABLE);
        }
    };
    debug!(%client, forward = %name, %target, %stream, "connected to the target");
    let report = splice(tcp, send, recv, &conn).await;
    match report.ending {
        Ending::Closed => {
            debug!(%client, forward = %name, sent = report.sent, received = report.received, "connection closed")
        }
        ref e => {
            info!(%client, forward = %name, sent = report.sent, received = report.received, "connection {}", e.describe())
        }
    }
}
