//! What a proxy is told to do: its forwards, its peer, its credentials.
//!
//! A forward is written `NAME=TARGET` in Open vSwitch's target syntax. The
//! proxy client listens (`NAME=ptcp:PORT[:IP]`, loopback unless an IP is
//! given), the proxy server connects (`NAME=tcp:HOST:PORT`); the NAME joins
//! them, so one QUIC connection carries any number of forwards.

use quicsdn_transport::quic::{Congestion, QuicOptions};
use quicsdn_transport::target::Target;
use quicsdn_transport::tls::{Application, TlsFiles};
use quicsdn_wire::preamble::validate_service_name;
use std::net::SocketAddr;
use std::time::Duration;

/// The proxy's application protocol name and log roles. Not the agents': a
/// proxy client cannot reach a controller agent by mistake, nor the reverse.
pub const APPLICATION: Application = Application {
    alpn: b"quicsdn-proxy/1",
    client: "proxy client",
    server: "proxy server",
};

/// One forward as configured on one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub name: String,
    pub target: Target,
}

/// Which side a configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `quicsdn proxy server`: connects to `tcp:` targets.
    Server,
    /// `quicsdn proxy client`: listens on `ptcp:` targets.
    Client,
}

/// A configuration mistake, said plainly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid forward {spec:?}: {reason}")]
    Forward { spec: String, reason: String },
    #[error("{0}")]
    Invalid(String),
}

impl Forward {
    /// Parses `NAME=TARGET` for `side`.
    pub fn parse(spec: &str, side: Side) -> Result<Forward, ConfigError> {
        let err = |reason: String| ConfigError::Forward {
            spec: spec.to_string(),
            reason,
        };
        let example = match side {
            Side::Server => "NAME=tcp:HOST:PORT, as in web=tcp:127.0.0.1:80",
            Side::Client => "NAME=ptcp:PORT[:IP], as in web=ptcp:8080",
        };
        let (name, target) = spec
            .split_once('=')
            .ok_or_else(|| err(format!("expected {example}")))?;
        validate_service_name(name).map_err(|e| err(e.to_string()))?;
        let target = Target::parse(target, None).map_err(|e| err(e.to_string()))?;
        match (side, &target) {
            (Side::Server, Target::Tcp { .. }) => {}
            (Side::Client, Target::PTcp { port: 0, .. }) => {
                // Port 0 is only useful to tests, which ask the running client
                // where it listens.
            }
            (Side::Client, Target::PTcp { .. }) => {}
            (Side::Server, Target::PTcp { .. }) => {
                return Err(err(
                    "the proxy server connects to each forward's target: use tcp:HOST:PORT here \
                     (ptcp: belongs on the proxy client)"
                        .into(),
                ));
            }
            (Side::Client, Target::Tcp { .. }) => {
                return Err(err(
                    "the proxy client listens for each forward: use ptcp:PORT[:IP] here \
                     (tcp: belongs on the proxy server)"
                        .into(),
                ));
            }
            (_, Target::Unix { .. } | Target::PUnix { .. }) => {
                return Err(err(format!(
                    "the proxy carries TCP connections only (their half-close and reset); expected {example}"
                )));
            }
        }
        Ok(Forward {
            name: name.to_string(),
            target,
        })
    }
}

fn validate_forwards(forwards: &[Forward]) -> Result<(), ConfigError> {
    if forwards.is_empty() {
        return Err(ConfigError::Invalid(
            "no forwards configured: give at least one --forward NAME=TARGET".into(),
        ));
    }
    for (i, f) in forwards.iter().enumerate() {
        if forwards[..i].iter().any(|o| o.name == f.name) {
            return Err(ConfigError::Invalid(format!(
                "forward {:?} is configured twice",
                f.name
            )));
        }
        if let Target::PTcp { port, ip } = f.target
            && port != 0
            && let Some(o) = forwards[..i].iter().find(|o| o.target == f.target)
        {
            return Err(ConfigError::Invalid(format!(
                "forwards {:?} and {:?} both listen on {ip}:{port}",
                o.name, f.name
            )));
        }
    }
    Ok(())
}

fn validate_quic(quic: &QuicOptions) -> Result<(), ConfigError> {
    if quic.keepalive >= quic.idle_timeout {
        return Err(ConfigError::Invalid(format!(
            "keepalive ({:?}) must be shorter than the grace period ({:?})",
            quic.keepalive, quic.idle_timeout
        )));
    }
    Ok(())
}

/// The proxy's default flow-control window per stream: 8 MiB. Bulk transfers
/// over long lossy paths need several bandwidth-delay products in flight,
/// because the window is counted from the oldest byte not yet repaired, and
/// at 20 % loss a packet is often lost again when it is retransmitted. Across
/// 100 Mbit/s and 100 ms RTT (a 1.25 MB BDP) with `bbr-lt`, a 100 MiB download
/// at 20 % loss took 18.3 s with 4 MiB, 17.9 s with 6 MiB and 13.4 s (median
/// of 3) with 8 MiB, against 9.9 s lossless (docs/proxy.md). It is also what
/// a stalled reader can make the receiving proxy hold per connection.
///
/// Not more: quinn-proto 0.11 closes a connection whose stream has more than
/// 1,024 separate pieces waiting to be put in order ("too many gaps in stream
/// buffer"), and a larger window lets more holes be open at once. With 16 MiB
/// that closed the connection at 20 % loss; with 8 MiB quinn's BBR, which
/// overfills the path's queue, hit it in 1 of 3 downloads at 20 % and in
/// every one from 30 %, `bbr-lt` in none of 132 from 0 to 39 %. So the other
/// controllers keep 4 MiB ([`default_stream_window`]).
pub const DEFAULT_STREAM_WINDOW: u32 = 8 << 20;

/// The default stream window with the other congestion controllers: quinn's
/// BBR at 39 % loss carried 100 MiB with it (36.8 s), and hit the gap limit
/// with 8 MiB.
pub const STREAM_WINDOW_OTHER_CONTROLLERS: u32 = 4 << 20;

/// The stream window the proxy uses with `congestion` unless told one.
pub fn default_stream_window(congestion: Congestion) -> u32 {
    match congestion {
        Congestion::BbrLt => DEFAULT_STREAM_WINDOW,
        _ => STREAM_WINDOW_OTHER_CONTROLLERS,
    }
}

/// The proxy's default grace period: 30 s, not the agents' 6 s. A proxied
/// TCP connection has no OVS fail mode to meet, and TCP itself rides out
/// outages of minutes; the proxy resets its TCP connections only when the
/// QUIC connection is dead. With 35 % loss both ways, a 6 s grace ended one
/// 100 MiB download in 33 near its end: the server heard nothing from the
/// client for 6 s while both sides' retransmissions backed off (the client
/// only acknowledges, and sends one PING when it has heard nothing for the
/// keepalive interval; its retransmissions then double their wait). In 30 s
/// about seven of the client's transmissions fit, all lost with
/// probability 0.35^7 < 0.1 %, against four (1.5 %) in 6 s.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The proxy's keepalive for a grace period: a sixth of it (5 s with the
/// default), so that a PING and its retransmissions have the rest of the
/// grace period to get through a lossy path (a NAT keeps its mapping too).
/// There is no OVS echo here to keep an idle connection busy, as for the
/// agents ([`quicsdn_transport::quic::agent_keepalive_for`]).
pub fn keepalive_for(grace: Duration) -> Duration {
    grace / 6
}

/// The QUIC settings the proxy starts from: the agents' defaults, with the
/// proxy's application name, stream window, congestion controller, grace
/// period and keepalive (each explained at its item), without 0-RTT, because a TCP
/// application's first bytes are not known to be safe to replay (RFC 9001
/// §9.2), and with RFC 9000's acknowledgements (every second packet) instead
/// of the agents' ACK-frequency setting, which was chosen for small control
/// messages; the proxy's bulk-transfer numbers were measured this way.
pub fn default_quic() -> QuicOptions {
    QuicOptions {
        application: APPLICATION,
        zero_rtt: false,
        stream_window: DEFAULT_STREAM_WINDOW,
        // Bulk data over lossy paths: across 100 Mbit/s, 100 ms RTT it stayed
        // within 1.5x of its lossless time up to 25 % loss; quinn's BBR
        // overfills the path's queue (50 % more bytes sent, lossless) and
        // with 8 MiB hit the gap limit above from 20 % (docs/proxy.md).
        congestion: Congestion::BbrLt,
        ack_frequency: None,
        // As measured for the proxy's bulk transfers (the agents' default is
        // off, for small messages: quicsdn_transport::no_ecn).
        ecn: true,
        idle_timeout: DEFAULT_GRACE,
        keepalive: keepalive_for(DEFAULT_GRACE),
        // The proxy client reconnects on one endpoint, which zero-length
        // connection IDs do not allow (see the field).
        zero_length_cid: false,
        ..QuicOptions::default()
    }
}

/// `quicsdn proxy server`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub tls: TlsFiles,
    pub quic: QuicOptions,
    /// `NAME=tcp:HOST:PORT`.
    pub forwards: Vec<Forward>,
    /// How long to wait for a target to accept a connection.
    pub connect_timeout: Duration,
}

impl ServerConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_forwards(&self.forwards)?;
        if let Some(f) = self.forwards.iter().find(|f| f.target.is_passive()) {
            return Err(ConfigError::Invalid(format!(
                "forward {:?} of the proxy server must be tcp:HOST:PORT",
                f.name
            )));
        }
        validate_quic(&self.quic)
    }
}

/// `quicsdn proxy client`.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The proxy server, `HOST:PORT` (UDP).
    pub server: String,
    /// The name the server's certificate must carry.
    pub server_name: String,
    /// Local UDP address (port 0 picks one).
    pub bind: Option<SocketAddr>,
    pub tls: TlsFiles,
    pub quic: QuicOptions,
    /// `NAME=ptcp:PORT[:IP]`.
    pub forwards: Vec<Forward>,
    /// Longest wait between reconnection attempts.
    pub max_backoff: Duration,
}

impl ClientConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_forwards(&self.forwards)?;
        if let Some(f) = self.forwards.iter().find(|f| !f.target.is_passive()) {
            return Err(ConfigError::Invalid(format!(
                "forward {:?} of the proxy client must be ptcp:PORT[:IP]",
                f.name
            )));
        }
        if self.max_backoff < Duration::from_millis(100) {
            return Err(ConfigError::Invalid(
                "--max-backoff must be at least 100ms".into(),
            ));
        }
        validate_quic(&self.quic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_parse_per_side() {
        let f = Forward::parse("web=tcp:127.0.0.1:80", Side::Server).unwrap();
        assert_eq!(f.name, "web");
        assert_eq!(f.target.to_string(), "tcp:127.0.0.1:80");
        let f = Forward::parse("web=ptcp:8080", Side::Client).unwrap();
        assert_eq!(f.target.to_string(), "ptcp:8080:127.0.0.1");
        let f = Forward::parse("web=ptcp:8080:0.0.0.0", Side::Client).unwrap();
        assert_eq!(f.target.to_string(), "ptcp:8080:0.0.0.0");
    }

    #[test]
    fn bad_forwards_are_explained() {
        let cases = [
            ("web", Side::Server, "expected NAME=tcp:HOST:PORT"),
            ("web", Side::Client, "expected NAME=ptcp:PORT[:IP]"),
            (
                "web=ptcp:80",
                Side::Server,
                "ptcp: belongs on the proxy client",
            ),
            (
                "web=tcp:1.2.3.4:80",
                Side::Client,
                "tcp: belongs on the proxy server",
            ),
            ("web=unix:/x.sock", Side::Server, "TCP connections only"),
            ("web=tcp:1.2.3.4", Side::Server, "port is required"),
            ("web=ptcp:http", Side::Client, "0 to 65535"),
            ("a b=tcp:1.2.3.4:1", Side::Server, "letters, digits"),
            ("=tcp:1.2.3.4:1", Side::Server, "letters, digits"),
        ];
        for (spec, side, words) in cases {
            let e = Forward::parse(spec, side).unwrap_err().to_string();
            assert!(e.contains(words), "{spec}: {e}");
            assert!(e.contains(spec), "{spec}: {e}");
        }
    }

    fn client(forwards: &[&str]) -> ClientConfig {
        ClientConfig {
            server: "s:1".into(),
            server_name: "s".into(),
            bind: None,
            tls: TlsFiles {
                ca: "/ca".into(),
                cert: "/c".into(),
                key: "/k".into(),
            },
            quic: default_quic(),
            forwards: forwards
                .iter()
                .map(|f| Forward::parse(f, Side::Client).unwrap())
                .collect(),
            max_backoff: Duration::from_secs(8),
        }
    }

    #[test]
    fn forward_sets_are_checked() {
        client(&["a=ptcp:1", "b=ptcp:2"]).validate().unwrap();
        let e = client(&[]).validate().unwrap_err().to_string();
        assert!(e.contains("no forwards"), "{e}");
        let e = client(&["a=ptcp:1", "a=ptcp:2"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("twice"), "{e}");
        let e = client(&["a=ptcp:1", "b=ptcp:1"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("both listen on 127.0.0.1:1"), "{e}");
        client(&["a=ptcp:0", "b=ptcp:0"]).validate().unwrap();
    }

    #[test]
    fn no_zero_rtt_and_its_own_protocol_name() {
        let q = default_quic();
        assert!(!q.zero_rtt);
        assert_eq!(q.stream_window, 8 << 20);
        assert_eq!(
            (q.idle_timeout, q.keepalive),
            (DEFAULT_GRACE, DEFAULT_GRACE / 6)
        );
        assert_eq!(q.congestion, Congestion::BbrLt);
        assert_eq!(default_stream_window(q.congestion), q.stream_window);
        assert_eq!(default_stream_window(Congestion::Bbr), 4 << 20);
        assert_ne!(q.application.alpn, QuicOptions::default().application.alpn);
    }
}
