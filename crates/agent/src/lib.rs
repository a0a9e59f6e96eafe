//! `quicsdn-agent`: the switch agent and the controller agent.
//!
//! Layering: [`config`] says what to do; [`services`] resolves it; [`link`] runs
//! one QUIC connection (hello, lanes, session assembly); [`session`] joins one
//! local connection to its lanes; [`switch`] and [`controller`] own the QUIC
//! endpoint, local listeners and reconnection; [`admission`] caps the
//! controller agent's concurrent handshakes and says how a switch agent waits
//! before reconnecting; [`control`] is the operators' control socket, and
//! [`tap`] copies one switch's messages to `quicsdn snoop` clients on it.

pub mod admission;
pub mod config;
pub mod control;
pub mod controller;
pub mod http;
pub mod link;
pub mod metrics;
pub mod services;
pub mod session;
pub mod stand_in;
pub mod switch;
pub mod tap;
pub mod udp;

pub use config::{
    AgentTransport, CommonConfig, ControllerConfig, ControllerTarget, ServiceConfig, SwitchConfig,
};
pub use controller::ControllerAgent;
pub use switch::SwitchAgent;

use quicsdn_transport::tls::TlsError;

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

pub(crate) use quicsdn_transport::shutdown::Shutdown;
