//! `quicsdn-agent`: the switch agent and the controller agent.
//!
//! Layering: [`config`] says what to do; [`services`] resolves it; [`link`] runs
//! one QUIC connection (hello, lanes, session assembly); [`session`] joins one
//! local connection to its lanes; [`switch`] and [`controller`] own the QUIC
//! endpoint, local listeners and reconnection; [`admission`] caps the
//! controller agent's concurrent handshakes and says how a switch agent waits
//! before reconnecting; [`control`] is the operators' control socket.

pub mod admission;
pub mod config;
pub mod control;
pub mod controller;
pub mod http;
pub mod link;
pub mod metrics;
pub mod services;
pub mod session;
pub mod switch;
pub mod udp;

pub use config::{AgentTransport, CommonConfig, ControllerConfig, ServiceConfig, SwitchConfig};
pub use controller::ControllerAgent;
pub use switch::SwitchAgent;

use quicsdn_transport::tls::{Credentials, TlsError};
use tokio::sync::watch;
use tracing::warn;

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Endpoint(#[from] quicsdn_transport::quic::EndpointError),
    #[error("service {service:?}: cannot listen at {target}: {reason}")]
    Listen {
        service: String,
        target: String,
        reason: String,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A one-shot, cloneable stop signal.
#[derive(Clone)]
pub(crate) struct Shutdown(watch::Sender<bool>);

impl Shutdown {
    pub(crate) fn new() -> Shutdown {
        Shutdown(watch::channel(false).0)
    }

    pub(crate) fn trigger(&self) {
        self.0.send_replace(true);
    }

    pub(crate) async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Warns at start-up when the agent's own certificate has expired or soon will:
/// peers would reject it, and the log should say so before they do.
pub(crate) fn warn_if_expiring(creds: &Credentials) {
    let left = creds.not_after - time::OffsetDateTime::now_utc();
    if left.is_negative() {
        warn!(identity = %creds.identity, "this agent's certificate expired at {}; peers will reject it", creds.not_after);
    } else if left < time::Duration::days(14) {
        warn!(identity = %creds.identity, "this agent's certificate expires at {}", creds.not_after);
    }
}
