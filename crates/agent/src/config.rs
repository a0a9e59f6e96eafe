//! What an agent is told to do: its services, its peer, its credentials.
//!
//! A service is written `NAME[:FRAMING]=TARGET`, e.g. `openflow=punix:/run/of.sock`
//! or `gauge:openflow=tcp:127.0.0.1:6654`. The names `openflow` and `ovsdb` imply
//! their framing; any other name is a raw byte stream unless a framing is given.
//! Whether a target is passive (`ptcp:`/`punix:`) or active (`tcp:`/`unix:`)
//! decides which side accepts the local connections, and so opens the sessions.

use quicsdn_lanes::StreamMode;
use quicsdn_transport::quic::QuicOptions;
use quicsdn_transport::target::{Target, TargetError};
use quicsdn_transport::tls::TlsFiles;
use quicsdn_wire::Framing;
use quicsdn_wire::openflow;
use quicsdn_wire::preamble::{Opener, validate_service_name};
use std::net::SocketAddr;
use std::time::Duration;

/// Open vSwitch's fail-mode timeout with its default 5 s inactivity probe
/// (ovs-vswitchd.conf.db(5): the switch falls back to its fail mode after 3
/// probe intervals without a controller).
pub const OVS_FAIL_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a switch agent's connection attempt to its only controller agent
/// waits for the first answer: twice the grace period (the most a busy peer
/// may keep an established connection waiting, `liveness::busy_limit`), but
/// below OVS's fail-mode timeout, which the HELLO stand-in may hold OVS
/// through meanwhile, and never less than the grace period. The controller
/// agent's admission control keeps a waiting attempt two thirds of this.
pub fn patient_attempt_limit(grace: Duration) -> Duration {
    quicsdn_transport::liveness::busy_limit(grace)
        .min(OVS_FAIL_TIMEOUT - Duration::from_secs(1))
        .max(grace)
}

/// Default size limit for JSON-RPC messages. OVSDB monitor replies for a large
/// database run to megabytes; anything near this is a runaway peer.
pub const DEFAULT_JSONRPC_MAX: usize = 64 << 20;

/// Sessions one connection carries at once by default: a switch has one
/// OpenFlow session per controller target and one OVSDB session per manager,
/// plus tools (`ovs-ofctl`, `ovsdb-client`) now and then.
pub const DEFAULT_MAX_SESSIONS: u32 = 8;

/// One service as configured on one agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    pub name: String,
    pub framing: Framing,
    pub target: Target,
}

/// A configuration mistake, said plainly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid service {spec:?}: {reason}")]
    Service { spec: String, reason: String },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("{0}")]
    Invalid(String),
}

impl ServiceConfig {
    /// Parses `NAME[:FRAMING]=TARGET`.
    pub fn parse(spec: &str) -> Result<ServiceConfig, ConfigError> {
        let err = |reason: String| ConfigError::Service {
            spec: spec.to_string(),
            reason,
        };
        let (left, target) = spec.split_once('=').ok_or_else(|| {
            err("expected NAME[:FRAMING]=TARGET, as in openflow=punix:/run/of.sock".into())
        })?;
        let (name, framing) = match left.split_once(':') {
            Some((name, f)) => (
                name,
                Framing::parse(f).ok_or_else(|| {
                    err(format!(
                        "unknown framing {f:?}; use openflow, jsonrpc or raw"
                    ))
                })?,
            ),
            None => (left, Self::implied_framing(left)),
        };
        validate_service_name(name).map_err(|e| err(e.to_string()))?;
        let default_port = match framing {
            Framing::OpenFlow => Some(6653),
            Framing::JsonRpc => Some(6640),
            Framing::Raw => None,
        };
        Ok(ServiceConfig {
            name: name.to_string(),
            framing,
            target: Target::parse(target, default_port)?,
        })
    }

    /// `openflow` and `ovsdb` imply their framing; other names are raw.
    pub fn implied_framing(name: &str) -> Framing {
        match name {
            "openflow" => Framing::OpenFlow,
            "ovsdb" => Framing::JsonRpc,
            _ => Framing::Raw,
        }
    }

    /// Which side opens this service's sessions, given the side this config is on.
    pub fn opener(&self, on_switch: bool) -> Opener {
        match (self.target.is_passive(), on_switch) {
            (true, true) | (false, false) => Opener::Switch,
            (true, false) | (false, true) => Opener::Controller,
        }
    }

    /// The largest message accepted, given the agent-wide limit if one was set.
    pub fn max_message(&self, limit: Option<usize>) -> usize {
        match self.framing {
            Framing::OpenFlow => limit
                .unwrap_or(openflow::MAX_MESSAGE_LEN)
                .min(openflow::MAX_MESSAGE_LEN),
            Framing::JsonRpc => limit.unwrap_or(DEFAULT_JSONRPC_MAX),
            Framing::Raw => usize::MAX,
        }
    }
}

/// How the two agents talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentTransport {
    /// One mutually-authenticated QUIC connection (the default).
    #[default]
    Quic,
    /// Plain UDP with an application-level reliability layer
    /// ([`quicsdn_udp`]): unauthenticated and unencrypted.
    Udp(quicsdn_udp::Profile),
}

/// Settings both agents share.
#[derive(Debug, Clone)]
pub struct CommonConfig {
    /// Certificates: required over QUIC; over UDP only a source of the switch's
    /// name, if given.
    pub tls: TlsFiles,
    pub transport: AgentTransport,
    /// `--allow-unauthenticated`: the operator accepts that `--transport udp`
    /// neither authenticates nor encrypts.
    pub allow_unauthenticated: bool,
    pub services: Vec<ServiceConfig>,
    /// Stream mode for sessions this agent opens; the other side follows it.
    pub streams: StreamMode,
    /// `--coalesce`: what the local peer sends may wait up to this long, unless
    /// it is urgent (`quicsdn_lanes::coalesce`); `None`: nothing waits.
    pub coalesce: Option<Duration>,
    /// `--max-sessions`: sessions one connection carries at once (both
    /// agents' together); a session beyond waits until one ends. Sizes the
    /// QUIC stream limits, hence the memory each connection takes.
    pub max_sessions: u32,
    /// The QUIC settings; its stream limits are replaced by what
    /// `streams` and `max_sessions` need when an endpoint is made.
    pub quic: QuicOptions,
    /// Agent-wide message size limit (OpenFlow is also capped at 65,535 by its format).
    pub max_message: Option<usize>,
    /// How long to wait for a local connection to the switch or controller.
    pub local_connect_timeout: Duration,
    /// The control socket (see [`crate::control`]), if any.
    pub control: Option<std::path::PathBuf>,
    /// `--metrics`: where to serve `/metrics` and `/healthz` ([`crate::http`]).
    pub metrics: Option<SocketAddr>,
    /// `--qlog-dir` (or `QLOGDIR`): a qlog file per QUIC connection.
    pub qlog: Option<quicsdn_transport::quic::Qlog>,
}

impl CommonConfig {
    /// The given credentials and services, with every other setting at its default.
    pub fn new(tls: TlsFiles, services: Vec<ServiceConfig>) -> CommonConfig {
        CommonConfig {
            tls,
            transport: AgentTransport::Quic,
            allow_unauthenticated: false,
            services,
            streams: StreamMode::default(),
            coalesce: Some(quicsdn_lanes::coalesce::DEFAULT_WINDOW),
            max_sessions: DEFAULT_MAX_SESSIONS,
            quic: QuicOptions::default(),
            max_message: None,
            local_connect_timeout: Duration::from_secs(5),
            control: None,
            metrics: None,
            qlog: None,
        }
    }

    fn validate(&self, on_switch: bool) -> Result<(), ConfigError> {
        if let AgentTransport::Udp(_) = self.transport
            && !self.allow_unauthenticated
        {
            return Err(ConfigError::Invalid(
                "--transport udp neither authenticates nor encrypts: anyone who can send datagrams to the agents can inject OpenFlow messages or claim a switch's name. Add --allow-unauthenticated to accept that (e.g. on an isolated management network), or use --transport quic".into(),
            ));
        }
        // What only the QUIC agents have. Over UDP it would do nothing, so
        // asking for it is an error rather than a silent no-op.
        if let AgentTransport::Udp(_) = self.transport {
            let quic_only = [
                (
                    self.control.is_some(),
                    "--control (status, rebind and `quicsdn snoop` work on QUIC connections)",
                ),
                (
                    self.metrics.is_some(),
                    "--metrics (the metrics are the QUIC agents')",
                ),
                (
                    self.qlog.is_some(),
                    "--qlog-dir or QLOGDIR (qlog records QUIC connections)",
                ),
            ];
            if let Some((_, what)) = quic_only.iter().find(|(given, _)| *given) {
                return Err(ConfigError::Invalid(format!(
                    "{what} is not available with --transport udp"
                )));
            }
        }
        if self.services.is_empty() {
            return Err(ConfigError::Invalid(
                "no services configured: give at least one --service NAME=TARGET".into(),
            ));
        }
        for (i, s) in self.services.iter().enumerate() {
            if self.services[..i].iter().any(|o| o.name == s.name) {
                return Err(ConfigError::Invalid(format!(
                    "service {:?} is configured twice",
                    s.name
                )));
            }
            if !on_switch && s.target.is_passive() && !s.target.is_per_switch() {
                return Err(ConfigError::Invalid(format!(
                    "service {:?}: on the controller agent a listening target serves one switch at a time, \
                     so it must be a punix: path containing {{switch}}, e.g. punix:/run/quicsdn/{{switch}}/{}.sock",
                    s.name, s.name
                )));
            }
        }
        if !(1..=1024).contains(&self.max_sessions) {
            return Err(ConfigError::Invalid(format!(
                "--max-sessions must be between 1 and 1024 (got {})",
                self.max_sessions
            )));
        }
        if self.max_message == Some(0) {
            return Err(ConfigError::Invalid(
                "--max-message-size must be positive".into(),
            ));
        }
        if self.quic.keepalive >= self.quic.idle_timeout {
            return Err(ConfigError::Invalid(format!(
                "keepalive ({:?}) must be shorter than the grace period ({:?})",
                self.quic.keepalive, self.quic.idle_timeout
            )));
        }
        if self.quic.idle_timeout >= OVS_FAIL_TIMEOUT {
            return Err(ConfigError::Invalid(format!(
                "the grace period ({:?}) must stay below Open vSwitch's fail-mode timeout \
                 (3 × inactivity_probe = {OVS_FAIL_TIMEOUT:?} by default), or OVS would act on a \
                 controller it believes connected",
                self.quic.idle_timeout
            )));
        }
        Ok(())
    }
}

/// One controller agent a switch agent may connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerTarget {
    /// `HOST:PORT`.
    pub addr: String,
    /// The name its certificate must carry.
    pub server_name: String,
}

impl ControllerTarget {
    pub fn new(addr: impl Into<String>, server_name: impl Into<String>) -> ControllerTarget {
        ControllerTarget {
            addr: addr.into(),
            server_name: server_name.into(),
        }
    }
}

/// Default `--failback-interval`: Open vSwitch's longest reconnect backoff.
pub const DEFAULT_FAILBACK_INTERVAL: Duration = Duration::from_secs(8);

/// The switch agent's configuration.
#[derive(Debug, Clone)]
pub struct SwitchConfig {
    /// The controller agents in order of preference (`--controller`, repeated):
    /// the agent connects to the first that answers, fails over to the next
    /// when one is unreachable or refuses, and returns to the first when it
    /// answers again.
    pub controllers: Vec<ControllerTarget>,
    /// `--switch-name`: the switch's name over UDP, where no certificate says it.
    pub switch_name: Option<String>,
    /// Local UDP address to bind (port 0 picks one).
    pub bind: Option<SocketAddr>,
    /// Longest wait between reconnection attempts.
    pub max_backoff: Duration,
    /// `--reconnect-jitter`: after losing a connection that had been up, wait
    /// a random time up to this long before reconnecting, so that the switches
    /// of a restarted controller agent do not all return in the same instant.
    pub reconnect_jitter: Duration,
    /// `--failback-interval`: while connected to any but the first controller
    /// agent, try the first this often.
    pub failback_interval: Duration,
    /// Answer OVS's OpenFlow HELLO at once, from the controller's HELLO of the
    /// previous session, unless the link to the controller agent is known dead
    /// (on by default; `--no-hello-stand-in` turns it off): see
    /// [`crate::stand_in`] for when, [`quicsdn_lanes::hello`] for how.
    pub hello_stand_in: bool,
    /// After a stand-in HELLO, answer OVS's ECHO_REQUESTs until the
    /// controller speaks, so OVS's inactivity probe does not drop a connection
    /// that waits for its turn at a restarted controller agent (on by
    /// default; `--no-echo-stand-in` turns it off): [`quicsdn_lanes::EchoStandIn`].
    pub echo_stand_in: bool,
    pub common: CommonConfig,
}

impl SwitchConfig {
    /// A configuration for one controller agent, with the defaults.
    pub fn new(controller: ControllerTarget, common: CommonConfig) -> SwitchConfig {
        SwitchConfig {
            controllers: vec![controller],
            switch_name: None,
            bind: None,
            max_backoff: Duration::from_secs(8),
            reconnect_jitter: crate::admission::DEFAULT_RECONNECT_JITTER,
            failback_interval: DEFAULT_FAILBACK_INTERVAL,
            hello_stand_in: true,
            echo_stand_in: true,
            common,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.common.validate(true)?;
        if self.controllers.is_empty() {
            return Err(ConfigError::Invalid(
                "no controller agent: give --controller HOST:PORT".into(),
            ));
        }
        if self.controllers.len() > 1 && matches!(self.common.transport, AgentTransport::Udp(_)) {
            return Err(ConfigError::Invalid(
                "--transport udp takes one --controller (failover between controller agents needs QUIC)"
                    .into(),
            ));
        }
        if self.failback_interval < Duration::from_millis(100) {
            return Err(ConfigError::Invalid(
                "--failback-interval must be at least 100ms".into(),
            ));
        }
        if self.max_backoff < Duration::from_millis(100) {
            return Err(ConfigError::Invalid(
                "--max-backoff must be at least 100ms".into(),
            ));
        }
        if self.reconnect_jitter > self.max_backoff {
            return Err(ConfigError::Invalid(format!(
                "--reconnect-jitter ({:?}) must not exceed --max-backoff ({:?})",
                self.reconnect_jitter, self.max_backoff
            )));
        }
        Ok(())
    }
}

/// The controller agent's configuration.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub listen: SocketAddr,
    /// `--relaxed-flow-mods`: in `safe` mode, FLOW_MODs for different entries may
    /// overtake each other (see docs/streams.md for when that is safe).
    pub relaxed_flow_mods: bool,
    /// `--session-store`: a file keeping TLS sessions (0-RTT tickets) across
    /// restarts; in memory only without it.
    pub session_store: Option<std::path::PathBuf>,
    /// `--max-handshakes`: QUIC handshakes under way at once; connection
    /// attempts beyond are refused (see [`crate::admission`]). 0: no limit.
    pub max_handshakes: usize,
    /// `--server-id`: this host's server id in every connection ID it issues,
    /// for a QUIC-LB balancer in front of several hosts
    /// ([`quicsdn_transport::quic_lb`]). None: IDs carry none (but a worker's
    /// octet with `--workers`).
    pub server_id: Option<quicsdn_transport::quic_lb::ServerId>,
    pub common: CommonConfig,
}

impl ControllerConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.common.validate(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_waits_twice_the_grace_period_below_ovs_fail_mode() {
        let s = Duration::from_secs;
        // (grace, how long an attempt to the only controller agent waits)
        for (grace, limit) in [(2, 4), (6, 12), (7, 14), (10, 14), (14, 14)] {
            assert_eq!(patient_attempt_limit(s(grace)), s(limit), "grace {grace} s");
        }
    }

    #[test]
    fn service_specs() {
        let s = ServiceConfig::parse("openflow=punix:/run/of.sock").unwrap();
        assert_eq!(
            (s.name.as_str(), s.framing),
            ("openflow", Framing::OpenFlow)
        );
        assert!(s.target.is_passive());
        assert_eq!(s.opener(true), Opener::Switch);
        let s = ServiceConfig::parse("ovsdb=tcp:127.0.0.1").unwrap();
        assert_eq!(s.framing, Framing::JsonRpc);
        assert_eq!(s.target.to_string(), "tcp:127.0.0.1:6640");
        assert_eq!(s.opener(false), Opener::Switch);
        assert_eq!(s.opener(true), Opener::Controller);
        let s = ServiceConfig::parse("gauge:openflow=tcp:127.0.0.1:6654").unwrap();
        assert_eq!((s.name.as_str(), s.framing), ("gauge", Framing::OpenFlow));
        let s = ServiceConfig::parse("snmp=tcp:127.0.0.1:161").unwrap();
        assert_eq!(s.framing, Framing::Raw);
    }

    #[test]
    fn bad_service_specs_are_explained() {
        for (spec, words) in [
            ("openflow", "NAME[:FRAMING]=TARGET"),
            ("x:json=tcp:1.2.3.4:1", "unknown framing"),
            ("a/b=tcp:1.2.3.4:1", "letters, digits"),
            ("snmp=tcp:1.2.3.4", "port is required"),
        ] {
            let e = ServiceConfig::parse(spec).unwrap_err().to_string();
            assert!(e.contains(words), "{spec}: {e}");
        }
    }

    #[test]
    fn size_limits() {
        let of = ServiceConfig::parse("openflow=ptcp:").unwrap();
        assert_eq!(of.max_message(None), 65_535);
        assert_eq!(of.max_message(Some(1 << 30)), 65_535);
        assert_eq!(of.max_message(Some(100)), 100);
        let db = ServiceConfig::parse("ovsdb=ptcp:").unwrap();
        assert_eq!(db.max_message(None), DEFAULT_JSONRPC_MAX);
    }

    fn common(services: &[&str]) -> CommonConfig {
        let tls = TlsFiles {
            ca: "/ca".into(),
            cert: "/c".into(),
            key: "/k".into(),
        };
        let services = services.iter().map(|s| ServiceConfig::parse(s).unwrap());
        CommonConfig::new(tls, services.collect())
    }

    #[test]
    fn controller_listeners_must_be_per_switch() {
        let ok = ControllerConfig {
            listen: "0.0.0.0:6653".parse().unwrap(),
            relaxed_flow_mods: false,
            session_store: None,
            max_handshakes: crate::admission::DEFAULT_MAX_HANDSHAKES,
            server_id: None,
            common: common(&[
                "openflow=tcp:127.0.0.1:6653",
                "ovsdb=punix:/run/q/{switch}.sock",
            ]),
        };
        ok.validate().unwrap();
        let bad = ControllerConfig {
            common: common(&["ovsdb=ptcp:6640"]),
            ..ok.clone()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("{switch}"));
        let mut long = ok.clone();
        long.common.quic.idle_timeout = Duration::from_secs(15);
        let e = long.validate().unwrap_err().to_string();
        assert!(e.contains("fail-mode timeout"), "{e}");
        let dup = ControllerConfig {
            common: common(&["openflow=tcp:127.0.0.1:1", "openflow=tcp:127.0.0.1:2"]),
            ..ok
        };
        assert!(dup.validate().unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn reconnect_jitter_stays_within_the_backoff() {
        let mut sw = SwitchConfig::new(
            ControllerTarget::new("ctl:6653", "ctl"),
            common(&["openflow=punix:/run/of.sock"]),
        );
        sw.validate().unwrap();
        sw.reconnect_jitter = Duration::from_secs(9);
        let e = sw.validate().unwrap_err().to_string();
        assert!(
            e.contains("--reconnect-jitter") && e.contains("--max-backoff"),
            "{e}"
        );
    }

    #[test]
    fn a_switch_agent_needs_a_controller_and_udp_takes_one() {
        let mut sw = SwitchConfig::new(
            ControllerTarget::new("a:6653", "a"),
            common(&["openflow=punix:/run/of.sock"]),
        );
        sw.controllers.push(ControllerTarget::new("b:6653", "b"));
        sw.validate().unwrap();
        sw.common.transport = AgentTransport::Udp(quicsdn_udp::Profile::Robust);
        sw.common.allow_unauthenticated = true;
        let e = sw.validate().unwrap_err().to_string();
        assert!(e.contains("one --controller"), "{e}");
        sw.controllers.clear();
        let e = sw.validate().unwrap_err().to_string();
        assert!(e.contains("--controller"), "{e}");
    }
}
