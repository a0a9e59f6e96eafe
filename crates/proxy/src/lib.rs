//! `quicsdn-proxy`: a TCP↔QUIC proxy pair, so unmodified TCP applications (an
//! HTTP client and server, say) talk over one mutually-authenticated QUIC
//! connection between the two proxies (paper `quic-sdn-multihomed-bicast`).
//!
//! ```text
//! app ──tcp──▶ proxy client ══ QUIC (TLS 1.3, mutual auth) ══▶ proxy server ──tcp──▶ target
//!              (ptcp: forwards)   one stream per TCP connection  (tcp: forwards)
//! ```
//!
//! Built on the agents' machinery in `quicsdn-transport`: credentials and
//! mutual TLS, quinn endpoints with the same transport settings (congestion
//! controller, keepalive, grace period, flow-control windows), targets in Open
//! vSwitch's syntax, and OVS-style reconnect backoff.
//!
//! Layers: [`config`] says what to do; [`header`] is the few bytes that open a
//! stream (sans-IO); [`splice`] joins one TCP connection to one stream with
//! TCP's semantics (half-close, reset); [`server`] and [`client`] own the
//! endpoint, the listeners and reconnection.

pub mod client;
pub mod config;
pub mod header;
pub mod server;
pub mod splice;

pub use client::ProxyClient;
pub use config::{ClientConfig, ConfigError, Forward, ServerConfig, Side};
pub use server::ProxyServer;

use quicsdn_transport::tls::TlsError;

/// Application error codes on the proxy's streams and connection (RFC 9000
/// §20.2: "Application Protocol Error Codes").
pub mod code {
    use quinn::VarInt;

    /// The TCP peer on the other side reset its connection (or its socket failed).
    pub const TCP_RESET: u32 = 1;
    /// The proxy server's target refused the connection (ECONNREFUSED).
    pub const TARGET_REFUSED: u32 = 2;
    /// The proxy server could not reach the target (timeout, no route, no such host).
    pub const TARGET_UNREACHABLE: u32 = 3;
    /// The proxy server has no forward of the name the client asked for.
    pub const UNKNOWN_FORWARD: u32 = 4;
    /// A stream did not start with a valid [`crate::header`].
    pub const PROTOCOL: u32 = 5;
    /// The proxy is shutting down (connection close).
    pub const SHUTDOWN: u32 = 6;

    /// What a code means, for log lines.
    pub fn describe(c: VarInt) -> String {
        let words = match c.into_inner() {
            0 => "stopped without error",
            1 => "the TCP peer there reset the connection",
            2 => "the target refused the connection",
            3 => "the target could not be reached",
            4 => "the proxy server has no such forward",
            5 => "protocol error",
            6 => "the proxy is shutting down",
            _ => "unknown code",
        };
        format!("{words} (code {c})")
    }
}

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Endpoint(#[from] quicsdn_transport::quic::EndpointError),
    #[error("forward {forward:?}: cannot listen at {target}: {reason}")]
    Listen {
        forward: String,
        target: String,
        reason: String,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
