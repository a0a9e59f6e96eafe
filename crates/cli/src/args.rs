//! Command-line arguments and configuration files.
//!
//! Every agent setting can be given as a flag or, under the same name, in a TOML
//! file passed with `--config` (`server-name = "ctl"`, `service = ["openflow=…"]`).
//! A flag given on the command line wins over the file; `--service` flags replace
//! the file's list.

use crate::units::{parse_duration, parse_size};
use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use quicsdn_agent::config::{
    AgentTransport, CommonConfig, ControllerConfig, ControllerTarget, ServiceConfig, SwitchConfig,
};
use quicsdn_lanes::StreamMode;
use quicsdn_transport::quic::{AckFrequency, QuicOptions};
use quicsdn_transport::tls::TlsFiles;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "quicsdn",
    version,
    about = "QUIC southbound for SDN: carries OpenFlow, OVSDB and other switch services between an \
             unmodified Open vSwitch and an unmodified controller over one mutually-authenticated QUIC \
             connection per switch.",
    after_help = "Run `quicsdn <COMMAND> --help` for each command's options. Targets use Open vSwitch's \
                  syntax: tcp:IP:PORT, unix:PATH (connect) and ptcp:PORT[:IP], punix:PATH (listen)."
)]
pub struct Cli {
    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives
    /// such as `info,quicsdn_agent=debug`. Also `log-level` in the config file.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Worker threads of an agent: 1 runs everything on one thread (the least
    /// cross-thread wake-ups, so the lowest latency on a small machine, and the
    /// least memory). Default: 1 for the switch agent (one connection), one
    /// per CPU for controller agents (many switches) and proxies.
    #[arg(long, global = true, value_name = "N")]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a CA and issue certificates for agents.
    #[command(subcommand)]
    Pki(PkiCommand),
    /// Run the switch agent, beside Open vSwitch.
    Switch(SwitchArgs),
    /// Run the controller agent, beside the controller.
    Controller(ControllerArgs),
    /// Talk to a running agent's control socket (its --control path).
    Control(ControlArgs),
    /// Show one switch's OpenFlow or OVSDB messages as they pass a running
    /// agent, decoded, one per line (as `ovs-ofctl snoop` does); optionally
    /// write them as a pcap that Wireshark and `ovs-ofctl ofp-parse-pcap` read.
    Snoop(SnoopArgs),
    /// The TCP↔QUIC proxy pair: unmodified TCP applications over one
    /// mutually-authenticated QUIC connection.
    #[command(subcommand)]
    Proxy(crate::proxy_args::ProxyCommand),
    /// Check an agent's configuration file without starting it: every
    /// setting, the services, and the certificate files (readable, matching,
    /// not expired). Exit status 0 if the agent would start.
    CheckConfig(CheckConfigArgs),
}

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// The TOML file (as given to --config).
    pub file: PathBuf,
    /// Which agent the file is for. [default: `switch` if it names a
    /// `controller`, else `controller`]
    #[arg(long, value_enum)]
    pub role: Option<Role>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Switch,
    Controller,
}

#[derive(Args, Debug)]
pub struct ControlArgs {
    /// The agent's control socket.
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    #[command(subcommand)]
    pub request: ControlRequest,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Each line: time (UTC), session, direction (to_switch or to_controller), \
    the lane and QUIC stream the message rode, then the message: type, OpenFlow version, xid, \
    length, and for FLOW_MOD, PACKET_IN and ERROR their main fields; for OVSDB the JSON-RPC \
    method, id and length. A malformed message is printed as such. The agent never waits for \
    snoop: when it cannot keep up, a line says how many messages were dropped."
)]
pub struct SnoopArgs {
    /// The agent's control socket (its --control path).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The switch to watch. [default: the only one connected; a switch
    /// agent's own]
    #[arg(long, value_name = "NAME")]
    pub switch: Option<String>,
    /// The service to watch, e.g. openflow or ovsdb. [default: the only one
    /// configured]
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// Keep watching the switch's next sessions (reconnects) instead of
    /// stopping when the session watched closes.
    #[arg(long)]
    pub follow: bool,
    /// Also write the messages to FILE as a pcap in which each session is an
    /// ordinary TCP connection to port 6653 (OVSDB: 6640), for tshark's
    /// dissectors and `ovs-ofctl ofp-parse-pcap`.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Stop after N messages.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Append to FILE the TLS secrets (NSS key log format, for Wireshark's
    /// QUIC dissector) of the agent's QUIC handshakes made while snoop runs.
    /// Secrets exist only at handshake time: a connection already up is not
    /// covered; make it reconnect while snoop runs. Whoever holds FILE can
    /// decrypt those connections. (`SSLKEYLOGFILE=FILE` in an agent's
    /// environment logs all its handshakes from its start.)
    #[arg(long, value_name = "FILE")]
    pub keylog: Option<PathBuf>,
}

#[derive(Subcommand, Debug, Clone)]
pub enum ControlRequest {
    /// Print what the agent is connected to (JSON).
    Status,
    /// Switch agent: move to a new local UDP port (or --bind address); the QUIC
    /// connection migrates and every session carries on.
    Rebind {
        #[arg(long, value_name = "IP:PORT")]
        bind: Option<SocketAddr>,
    },
}

#[derive(Subcommand, Debug)]
pub enum PkiCommand {
    /// Write DIR/ca.crt and DIR/ca.key (never overwrites).
    Init {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "quicsdn CA")]
        name: String,
        /// Validity in days.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Write DIR/NAME.crt and DIR/NAME.key signed by DIR's CA, with NAME as DNS
    /// subject-alternative name and common name (never overwrites).
    Issue {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The agent's identity, e.g. the switch's name or the controller's host name.
        #[arg(long)]
        name: String,
        /// Also certify this IP address (repeatable), for switches that connect by IP
        /// without --server-name.
        #[arg(long = "ip", value_name = "IP")]
        ips: Vec<std::net::IpAddr>,
        /// Validity in days.
        #[arg(long, default_value_t = 825)]
        days: u32,
    },
    /// Import a certificate made by Open vSwitch's `ovs-pki req+sign NAME
    /// switch|controller`: checks it (key matches, signed by the CA of its
    /// role, not expired) and writes OUT/ca.crt (the other end's CA, which
    /// this agent trusts), OUT/NAME.crt and OUT/NAME.key (never overwrites).
    Import {
        /// The ovs-pki directory (with controllerca/ and switchca/).
        #[arg(long, value_name = "DIR", default_value = "/var/lib/openvswitch/pki")]
        ovs_pki: PathBuf,
        /// Where NAME-cert.pem and NAME-privkey.pem are (where `ovs-pki
        /// req+sign` ran).
        #[arg(long, value_name = "DIR", default_value = ".")]
        from: PathBuf,
        /// The NAME given to `ovs-pki req+sign`.
        #[arg(long)]
        name: String,
        /// The agent that will use it: `switch` or `controller`.
        #[arg(long, value_name = "ROLE")]
        role: ImportRole,
        /// Where to write the three files.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// `quicsdn pki import --role`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ImportRole {
    Switch,
    Controller,
}

/// Settings of the QUIC connection, taken by every command that makes one
/// (the agents and the proxy).
#[derive(Args, Debug, Default)]
pub struct QuicArgs {
    /// TOML file with any of these settings, under the same names.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// CA certificate (PEM) that the peer's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// This side's certificate (PEM).
    #[arg(long, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// This side's private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Send a QUIC PING after hearing nothing from the other side for this long,
    /// so an idle connection stays up and a NAT keeps its mapping. Dead-peer
    /// detection is --grace's, not this. [default: agents: --grace minus an
    /// eighth of it, at least 750ms (5.25s), longer than Open vSwitch's 5 s
    /// echo cycle so its echoes keep an idle channel alive without PINGs;
    /// proxy: a sixth of --grace (5s)]
    #[arg(long, value_name = "DURATION")]
    pub keepalive: Option<String>,
    /// The grace period: how long the connection survives while the other
    /// side is silent (an outage, a migration) before it is declared dead and
    /// the local connections it carried are closed. Agents: keep it below OVS's
    /// fail-mode timeout (3 × inactivity_probe, 15 s by default). A switch
    /// agent with one controller agent waits twice it (at most 14 s) for the
    /// first answer to a connection attempt. [default: 6s for the agents, 30s
    /// for the proxy]
    #[arg(long = "grace", alias = "idle-timeout", value_name = "DURATION")]
    pub idle_timeout: Option<String>,
    /// Flow-control window of each stream we receive, e.g. 256k. Smaller bounds how
    /// much the peer queues on one stream (latency behind bulk data), larger
    /// allows more throughput per stream on long paths. [default: 1250000 for
    /// the agents; for the proxy 8M with bbr-lt, 4M with the other controllers]
    #[arg(long, value_name = "BYTES")]
    pub stream_window: Option<String>,
    /// Congestion controller: bbr (quinn's), cubic, newreno, or bbr-lt (ours,
    /// loss-tolerant). [default: bbr for the agents, bbr-lt for the proxy]
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// How often to check --ca, --cert and --key for a new version (their
    /// resolved file's inode, size and times, so a symlink swap counts); a
    /// new version that works is used for new handshakes, established
    /// connections keep going. `off` (or 0): only on SIGHUP. [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub cert_poll_interval: Option<String>,
}

/// The [`QuicArgs`] settings as read from a configuration file.
#[derive(Debug, Default)]
pub struct QuicFile {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub keepalive: Option<String>,
    pub grace: Option<String>,
    pub stream_window: Option<String>,
    pub congestion: Option<String>,
    pub cert_poll_interval: Option<String>,
}

impl QuicArgs {
    /// The transport settings: flags over the file over `defaults`.
    /// `keepalive_for` derives the keepalive from the grace period when
    /// `--keepalive` is not given.
    pub fn quic_options(
        &mut self,
        file: &mut QuicFile,
        defaults: QuicOptions,
        keepalive_for: fn(Duration) -> Duration,
    ) -> Result<QuicOptions> {
        let idle_timeout = duration(
            self.idle_timeout.take(),
            file.grace.take(),
            "grace",
            defaults.idle_timeout,
        )?;
        Ok(QuicOptions {
            keepalive: duration(
                self.keepalive.take(),
                file.keepalive.take(),
                "keepalive",
                keepalive_for(idle_timeout),
            )?,
            idle_timeout,
            stream_window: match self.stream_window.take().or(file.stream_window.take()) {
                Some(s) => {
                    u32::try_from(parse_size(&s).map_err(|e| anyhow!("--stream-window: {e}"))?)
                        .map_err(|_| anyhow!("--stream-window: at most 4G"))?
                }
                None => defaults.stream_window,
            },
            congestion: match self.congestion.take().or(file.congestion.take()) {
                Some(s) => s
                    .parse()
                    .map_err(|e: String| anyhow!("--congestion: {e}"))?,
                None => defaults.congestion,
            },
            cert_poll: match self
                .cert_poll_interval
                .take()
                .or(file.cert_poll_interval.take())
                .as_deref()
            {
                None => defaults.cert_poll,
                Some("off") => None,
                Some(s) => {
                    let d = parse_duration(s).map_err(|e| anyhow!("--cert-poll-interval: {e}"))?;
                    (!d.is_zero()).then_some(d)
                }
            },
            ..defaults
        })
    }

    /// The three PEM files, each required.
    pub fn tls_files(&mut self, file: &mut QuicFile) -> Result<TlsFiles> {
        Ok(TlsFiles {
            ca: required(self.ca.take(), file.ca.take(), "ca")?,
            cert: required(self.cert.take(), file.cert.take(), "cert")?,
            key: required(self.key.take(), file.key.take(), "key")?,
        })
    }
}

/// Settings both agents take.
#[derive(Args, Debug, Default)]
pub struct CommonArgs {
    #[command(flatten)]
    pub quic: QuicArgs,
    /// How the agents talk: `quic` (mutually-authenticated QUIC, the default) or
    /// `udp` (plain UDP with an application-level reliability layer; NOT
    /// authenticated or encrypted, needs --allow-unauthenticated). [default: quic]
    #[arg(long, value_name = "NAME")]
    pub transport: Option<String>,
    /// With --transport udp: `seed` (the paper's mechanism: fixed 1 s RTO, 3
    /// retransmits then the message is dropped, unordered) or `robust` (adaptive
    /// RTO, in order, congestion control, fragmentation, never a silent loss).
    /// Both agents must agree. [default: robust]
    #[arg(long, value_name = "PROFILE")]
    pub udp_profile: Option<String>,
    /// Accept that --transport udp neither authenticates nor encrypts: anyone who
    /// can send datagrams to the agents can inject messages or claim a switch.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// A service, NAME[:FRAMING]=TARGET (repeatable). `openflow` and `ovsdb` imply
    /// their framing; other names are raw unless FRAMING (openflow, jsonrpc, raw) is
    /// given. A listening target (ptcp:, punix:) makes this side accept the local
    /// connections; the other agent must then connect (tcp:, unix:).
    #[arg(long = "service", value_name = "SPEC")]
    pub services: Vec<String>,
    /// Stream mode for sessions this agent opens (the other side follows): `safe`
    /// (OpenFlow-aware: keeps every order OVS and controllers rely on, lets only
    /// independent messages overtake; `safe:K` for K keyed streams, default 8),
    /// `ordered` (one stream per connection, byte for byte) or `rr:N` (round robin
    /// over N streams; NOT order-preserving, for reproducing the quicSDN paper
    /// only). [default: safe]
    #[arg(long, value_name = "MODE")]
    pub streams: Option<String>,
    /// Sessions one QUIC connection carries at once (both agents' together);
    /// one more waits until one ends. Sizes the QUIC stream limits, which are
    /// much of an idle connection's memory. [default: 8]
    #[arg(long, value_name = "N")]
    pub max_sessions: Option<u32>,
    /// Largest message accepted from a local peer, e.g. 16M; larger ones close that
    /// connection. OpenFlow is capped at 65535 by its format. [default: 64M for
    /// JSON-RPC]
    #[arg(long, value_name = "BYTES")]
    pub max_message_size: Option<String>,
    /// How long to wait for the local switch or controller to accept a connection.
    /// [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub local_connect_timeout: Option<String>,
    /// A unix socket for `quicsdn control` (status, rebind), mode 0600.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Serve Prometheus metrics on http://IP:PORT/metrics and readiness on
    /// /healthz (plain HTTP, no certificate needed: bind it to a management
    /// address). [default: off]
    #[arg(long, value_name = "IP:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Write one qlog file per QUIC connection into DIR (JSON-SEQ `.sqlog`, as
    /// qvis reads it), named by the switch's identity. Also the QLOGDIR
    /// environment variable. For diagnosis: every packet is logged.
    #[arg(long, value_name = "DIR", env = "QLOGDIR")]
    pub qlog_dir: Option<PathBuf>,
    /// Turn 0-RTT resumption off. With it on (the default) a switch agent that
    /// holds a session ticket sends its hello and OVS's replay-safe first
    /// messages (HELLO, ECHO, FEATURES) with its first packets; everything else
    /// waits for the handshake (docs/agents.md, "0-RTT").
    #[arg(long)]
    pub no_zero_rtt: bool,
    /// Class-aware coalescing: while a local peer sends densely, messages nobody
    /// waits for right now (bulk FLOW_MODs, multipart replies but the last part,
    /// port status, OVSDB transactions and updates) wait for the next tick of
    /// this period (or until 4 KiB are held), so the messages of all services
    /// leave in shared, full QUIC packets. Urgent messages (echo, PACKET_IN,
    /// PACKET_OUT and the FLOW_MODs answering a PACKET_IN, BARRIER, ROLE, ERROR,
    /// replies) never wait and take what waits before them along; isolated
    /// messages never wait. `off` (or `0`) turns it off. [default: 10ms]
    #[arg(long, value_name = "DURATION")]
    pub coalesce: Option<String>,
    /// Ask the peer to acknowledge only every N+1 ack-eliciting packets, or after
    /// its max ACK delay (QUIC ACK frequency extension; quinn on both ends); a
    /// gap in packet numbers is still acknowledged at once. `off`: RFC 9000's
    /// every second packet. [default: 16]
    #[arg(long, value_name = "N|off")]
    pub ack_threshold: Option<String>,
    /// With the ACK frequency extension: the longest the peer may delay an ACK.
    /// quinn lowers a request to max(RTT, 25ms). `auto`: ask for the RTT (25 ms
    /// on a LAN, up to 200 ms), so an ACK can ride on the next message back;
    /// a lost packet that nothing follows is retransmitted up to that much later.
    /// `peer`: the peer's own, 25 ms. [default: auto]
    #[arg(long, value_name = "auto|peer|DURATION")]
    pub ack_delay: Option<String>,
    /// Length in bytes (4 to 8) of the QUIC connection IDs this agent issues,
    /// which every packet the peer sends to it carries. [default: 4]
    #[arg(long, value_name = "BYTES")]
    pub cid_len: Option<usize>,
    /// Mark packets ECN-capable and report ECN counts in every ACK (3–6 bytes
    /// more per ACK frame). [default: off, as Linux TCP without a peer's request]
    #[arg(long)]
    pub ecn: bool,
}

#[derive(Args, Debug)]
pub struct SwitchArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The controller agent, HOST:PORT (UDP). Repeat it for several, in order
    /// of preference: the agent fails over to the next when one is unreachable
    /// or refuses, and returns to the first when it answers again.
    #[arg(long, value_name = "HOST:PORT")]
    pub controller: Vec<String>,
    /// Name the controller agents' certificates must carry. [default: the host
    /// of each --controller]
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// With several --controller: while connected to any but the first, try
    /// the first this often, and move back to it when it answers (OVS's
    /// connections then reconnect through it). [default: 8s]
    #[arg(long, value_name = "DURATION")]
    pub failback_interval: Option<String>,
    /// Local UDP address to send from. [default: any address, any port]
    #[arg(long, value_name = "IP:PORT")]
    pub bind: Option<SocketAddr>,
    /// Longest wait between reconnection attempts (Open vSwitch's default is 8s).
    /// [default: 8s]
    #[arg(long, value_name = "DURATION")]
    pub max_backoff: Option<String>,
    /// After losing a connection that had been up, wait a random time up to this
    /// long before reconnecting, so that the switches of a restarted controller
    /// agent do not all return in the same instant. At most --max-backoff.
    /// [default: 0s, reconnect at once; see docs/benchmarks.md, bench storm]
    #[arg(long, value_name = "DURATION")]
    pub reconnect_jitter: Option<String>,
    /// The switch's name over --transport udp (the controller agent believes it;
    /// nothing authenticates it). [default: the identity of --cert]
    #[arg(long, value_name = "NAME")]
    pub switch_name: Option<String>,
    /// Use zero-length QUIC connection IDs on this side: the controller agent's
    /// packets to this switch then carry no connection ID (4 bytes less each
    /// than with --cid-len 4). A connection made while the previous one still
    /// drains gets a new UDP port; with a fixed --bind port they are off.
    /// Not the default: each new endpoint costs about 0.6 MiB of memory per
    /// reconnection (docs/benchmarks.md). [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub zero_length_cid: Option<bool>,
    /// Do not answer OVS's OpenFlow HELLO on the controller's behalf. By
    /// default, when OVS connects and the link to the controller agent is not
    /// known dead (it is up, or it has not heard from a controller agent that
    /// just closed, reset or refused the previous one), the agent sends OVS the
    /// HELLO the controller sent in the previous session, so OVS's 1 s HELLO
    /// wait does not expire during a controller-agent restart, and swallows the
    /// controller's own HELLO when it comes (closing the session, and
    /// forgetting the old HELLO, if it would negotiate another version). After
    /// the grace period ran out or an attempt got no answer, OVS waits for the
    /// real HELLO, so its fail mode sees the controller's loss.
    #[arg(long)]
    pub no_hello_stand_in: bool,
    /// Do not answer OVS's echo requests after a stand-in HELLO. By default,
    /// once OVS got the controller's previous HELLO, the agent answers OVS's
    /// inactivity probes (ECHO_REQUEST) itself until the controller's own
    /// HELLO arrives, and only while the link to the controller agent is not
    /// known dead (the stand-in's rule), so OVS does not drop a connection
    /// that waits for its turn at a busy, restarted controller agent. The
    /// requests still reach the controller.
    #[arg(long)]
    pub no_echo_stand_in: bool,
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// In `safe` stream mode, let FLOW_MODs for different flow entries overtake
    /// each other (non-strict ones, group/meter mods and barriers stay fences).
    /// Only for controllers that separate dependent messages with barriers, as
    /// OpenFlow 1.3.5 §6.2 asks: see docs/streams.md.
    #[arg(long)]
    pub relaxed_flow_mods: bool,
    /// UDP address to accept switch agents on. [default: 0.0.0.0:6653]
    #[arg(long, value_name = "IP:PORT")]
    pub listen: Option<SocketAddr>,
    /// Keep TLS sessions (the switch agents' 0-RTT tickets) in this file, so they
    /// survive a restart of this agent; each is usable once. It holds
    /// resumption secrets: created mode 0600, protect it like the key. Beside
    /// it, FILE.peers lists the connected switch agents (address, connection
    /// ID), so that after a crash the next agent resets their connections at
    /// once instead of at their next packet. [default: in memory]
    #[arg(long, value_name = "FILE")]
    pub session_store: Option<PathBuf>,
    /// Handshake admission control: QUIC handshakes under way at once. Attempts
    /// beyond wait for a free slot (returning switches first) and are refused
    /// (CONNECTION_REFUSED) only after waiting 4/3 of --grace (two thirds of a
    /// switch agent's attempt limit) or when 128 per slot already wait; a
    /// refused switch agent comes back within a second.
    /// A handshake still incomplete after 1 s (its switch agent gone) gives its
    /// slot back. So a reconnect storm after a restart is served at the pace the
    /// CPU allows instead of collapsing. 0: no limit. [default: 128]
    #[arg(long, value_name = "N")]
    pub max_handshakes: Option<usize>,
    /// Worker processes sharing the UDP port (SO_REUSEPORT), one per core to
    /// use: a supervisor opens the port and keeps one agent process per
    /// worker, steering every connection's packets to its worker by the
    /// worker octet in its connection IDs, also after the switch's address
    /// changes. Each worker keeps its own sessions; `--session-store`,
    /// `--control` and a `--metrics` port get the worker index appended
    /// (`FILE.0`, port + index). See docs/scale.md. [default: 1, no supervisor]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: Option<u16>,
    /// This host's server id, for a QUIC-LB load balancer in front of several
    /// controller-agent hosts on one address: 1 to 10 octets in hexadecimal
    /// (e.g. `0a`), unique per host, the same length on every host. Every
    /// connection ID this agent issues starts with it (the draft's
    /// unencrypted form), so the balancer routes a switch's packets to the
    /// host that owns its connection also after the switch's address changes.
    /// See docs/scale.md. [default: none]
    #[arg(long, value_name = "HEX")]
    pub server_id: Option<quicsdn_transport::quic_lb::ServerId>,
}

/// A configuration file: the flags' long names as keys.
/// A setting given once or as a list (`controller = "a:6653"` or
/// `controller = ["a:6653", "b:6653"]`).
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileConfig {
    pub log_level: Option<String>,
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub transport: Option<String>,
    pub udp_profile: Option<String>,
    pub allow_unauthenticated: Option<bool>,
    pub switch_name: Option<String>,
    pub service: Option<Vec<String>>,
    pub streams: Option<String>,
    pub max_sessions: Option<u32>,
    pub keepalive: Option<String>,
    pub idle_timeout: Option<String>,
    pub grace: Option<String>,
    pub stream_window: Option<String>,
    pub congestion: Option<String>,
    pub max_message_size: Option<String>,
    pub local_connect_timeout: Option<String>,
    pub control: Option<PathBuf>,
    pub metrics: Option<SocketAddr>,
    pub qlog_dir: Option<PathBuf>,
    pub cert_poll_interval: Option<String>,
    pub zero_rtt: Option<bool>,
    pub coalesce: Option<String>,
    pub ack_threshold: Option<u32>,
    pub ack_delay: Option<String>,
    pub cid_len: Option<usize>,
    // Switch agent only.
    pub controller: Option<OneOrMany>,
    pub server_name: Option<String>,
    pub failback_interval: Option<String>,
    pub bind: Option<SocketAddr>,
    pub max_backoff: Option<String>,
    pub reconnect_jitter: Option<String>,
    pub zero_length_cid: Option<bool>,
    // Controller agent only.
    pub listen: Option<SocketAddr>,
    pub relaxed_flow_mods: Option<bool>,
    pub session_store: Option<PathBuf>,
    pub max_handshakes: Option<usize>,
    pub workers: Option<u16>,
    pub server_id: Option<String>,
}

impl FileConfig {
    pub fn load(path: Option<&Path>) -> Result<FileConfig> {
        load_toml(path)
    }
}

/// Reads a TOML configuration file (none: every setting unset).
pub(crate) fn load_toml<T: serde::de::DeserializeOwned + Default>(
    path: Option<&Path>,
) -> Result<T> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

pub(crate) fn required<T>(cli: Option<T>, file: Option<T>, flag: &str) -> Result<T> {
    cli.or(file)
        .ok_or_else(|| anyhow!("--{flag} is required (or `{flag}` in the --config file)"))
}

pub(crate) fn duration(
    cli: Option<String>,
    file: Option<String>,
    flag: &str,
    default: Duration,
) -> Result<Duration> {
    match cli.or(file) {
        Some(s) => parse_duration(&s).map_err(|e| anyhow!("--{flag}: {e}")),
        None => Ok(default),
    }
}

fn common(args: CommonArgs, file: &mut FileConfig) -> Result<CommonConfig> {
    let services = if args.services.is_empty() {
        file.service.take().unwrap_or_default()
    } else {
        args.services
    };
    let services = services
        .iter()
        .map(|s| ServiceConfig::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let streams: StreamMode = match args.streams.or(file.streams.take()) {
        Some(s) => s.parse()?,
        None => StreamMode::default(),
    };
    let mut quic_file = QuicFile {
        ca: file.ca.take(),
        cert: file.cert.take(),
        key: file.key.take(),
        keepalive: file.keepalive.take(),
        grace: file.grace.take().or(file.idle_timeout.take()),
        stream_window: file.stream_window.take(),
        congestion: file.congestion.take(),
        cert_poll_interval: file.cert_poll_interval.take(),
    };
    let mut quic_args = args.quic;
    let defaults = quic_args.quic_options(
        &mut quic_file,
        QuicOptions::default(),
        quicsdn_transport::quic::agent_keepalive_for,
    )?;
    let quic = QuicOptions {
        zero_rtt: !args.no_zero_rtt && file.zero_rtt.take().unwrap_or(defaults.zero_rtt),
        ack_frequency: match args
            .ack_threshold
            .or(file.ack_threshold.take().map(|n| n.to_string()))
            .as_deref()
        {
            Some("off") => {
                if args.ack_delay.is_some() || file.ack_delay.is_some() {
                    bail!("--ack-delay needs the ACK frequency extension, not --ack-threshold off");
                }
                None
            }
            threshold => Some(AckFrequency {
                threshold: match threshold {
                    None => quicsdn_transport::quic::DEFAULT_ACK_FREQUENCY.threshold,
                    Some(n) => n
                        .parse()
                        .map_err(|_| anyhow!("--ack-threshold {n:?}: a number or off"))?,
                },
                max_delay: match args.ack_delay.or(file.ack_delay.take()).as_deref() {
                    None | Some("auto") => quicsdn_transport::quic::DEFAULT_ACK_FREQUENCY.max_delay,
                    Some("peer") => None,
                    Some(d) => Some(
                        parse_duration(d)
                            .map_err(|e| anyhow!("--ack-delay: {e} (or auto, peer)"))?,
                    ),
                },
            }),
        },
        ecn: args.ecn || defaults.ecn,
        cid_len: match args.cid_len.or(file.cid_len.take()) {
            None => defaults.cid_len,
            Some(n) if quicsdn_transport::quic::CID_LENS.contains(&n) => n,
            Some(n) => bail!(
                "--cid-len {n}: connection IDs of {} to {} bytes (--zero-length-cid on the switch agent for none)",
                quicsdn_transport::quic::CID_LENS.start(),
                quicsdn_transport::quic::CID_LENS.end()
            ),
        },
        ..defaults
    };
    let transport = match args.transport.or(file.transport.take()).as_deref() {
        None | Some("quic") => {
            if args.udp_profile.is_some() || file.udp_profile.is_some() {
                bail!("--udp-profile needs --transport udp");
            }
            AgentTransport::Quic
        }
        Some("udp") => {
            let p = args
                .udp_profile
                .or(file.udp_profile.take())
                .unwrap_or_else(|| "robust".into());
            AgentTransport::Udp(
                quicsdn_udp::Profile::parse(&p)
                    .ok_or_else(|| anyhow!("--udp-profile {p:?}: use seed or robust"))?,
            )
        }
        Some(t) => bail!("--transport {t:?}: use quic or udp"),
    };
    let allow_unauthenticated =
        args.allow_unauthenticated || file.allow_unauthenticated.take().unwrap_or(false);
    let coalesce = match args.coalesce.or(file.coalesce.take()).as_deref() {
        None => Some(quicsdn_lanes::coalesce::DEFAULT_WINDOW),
        Some("off") => None,
        Some(s) => Some(parse_duration(s).map_err(|e| anyhow!("--coalesce: {e} (or off)"))?)
            .filter(|w| !w.is_zero()),
    };
    let max_message = match args.max_message_size.or(file.max_message_size.take()) {
        Some(s) => Some(parse_size(&s).map_err(|e| anyhow!("--max-message-size: {e}"))?),
        None => None,
    };
    let tls = if transport == AgentTransport::Quic {
        quic_args.tls_files(&mut quic_file)?
    } else {
        // Over UDP certificates only name the switch, if given.
        TlsFiles {
            ca: quic_args.ca.or(quic_file.ca).unwrap_or_default(),
            cert: quic_args.cert.or(quic_file.cert).unwrap_or_default(),
            key: quic_args.key.or(quic_file.key).unwrap_or_default(),
        }
    };
    Ok(CommonConfig {
        tls,
        transport,
        allow_unauthenticated,
        services,
        streams,
        coalesce,
        max_sessions: args
            .max_sessions
            .or(file.max_sessions.take())
            .unwrap_or(quicsdn_agent::config::DEFAULT_MAX_SESSIONS),
        quic,
        max_message,
        local_connect_timeout: duration(
            args.local_connect_timeout,
            file.local_connect_timeout.take(),
            "local-connect-timeout",
            Duration::from_secs(5),
        )?,
        control: args.control.or(file.control.take()),
        metrics: args.metrics.or(file.metrics.take()),
        qlog: args
            .qlog_dir
            .or(file.qlog_dir.take())
            .map(|dir| quicsdn_transport::quic::Qlog { dir }),
    })
}

/// The host part of `HOST:PORT` / `[V6]:PORT`.
pub(crate) fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

impl SwitchArgs {
    pub fn resolve(self, mut file: FileConfig) -> Result<SwitchConfig> {
        if file.listen.is_some()
            || file.relaxed_flow_mods.is_some()
            || file.session_store.is_some()
            || file.max_handshakes.is_some()
            || file.workers.is_some()
            || file.server_id.is_some()
        {
            bail!(
                "`listen`, `relaxed-flow-mods`, `session-store`, `max-handshakes`, `workers` and \
                 `server-id` are controller agent settings"
            );
        }
        let addrs = if self.controller.is_empty() {
            match file.controller.take() {
                Some(OneOrMany::One(c)) => vec![c],
                Some(OneOrMany::Many(v)) => v,
                None => vec![],
            }
        } else {
            self.controller
        };
        if addrs.is_empty() {
            bail!("--controller is required (or `controller` in the --config file)");
        }
        let server_name = self.server_name.or(file.server_name.take());
        let mut controllers = Vec::new();
        for c in addrs {
            if !c.contains(':') {
                bail!("--controller {c:?}: expected HOST:PORT, e.g. 192.0.2.1:6653");
            }
            if controllers.iter().any(|t: &ControllerTarget| t.addr == c) {
                bail!("--controller {c:?} is given twice");
            }
            let name = server_name
                .clone()
                .unwrap_or_else(|| host_of(&c).to_string());
            controllers.push(ControllerTarget::new(c, name));
        }
        let failback_interval = duration(
            self.failback_interval,
            file.failback_interval.take(),
            "failback-interval",
            quicsdn_agent::config::DEFAULT_FAILBACK_INTERVAL,
        )?;
        let max_backoff = duration(
            self.max_backoff,
            file.max_backoff.take(),
            "max-backoff",
            Duration::from_secs(8),
        )?;
        let reconnect_jitter = duration(
            self.reconnect_jitter,
            file.reconnect_jitter.take(),
            "reconnect-jitter",
            quicsdn_agent::admission::DEFAULT_RECONNECT_JITTER,
        )?;
        let bind = self.bind.or(file.bind.take());
        let switch_name = self.switch_name.or(file.switch_name.take());
        let zero_length_cid = self
            .zero_length_cid
            .or(file.zero_length_cid.take())
            .unwrap_or(QuicOptions::default().zero_length_cid);
        let mut common = common(self.common, &mut file)?;
        common.quic.zero_length_cid = zero_length_cid;
        Ok(SwitchConfig {
            controllers,
            switch_name,
            bind,
            max_backoff,
            reconnect_jitter,
            failback_interval,
            hello_stand_in: !self.no_hello_stand_in,
            echo_stand_in: !self.no_echo_stand_in,
            common,
        })
    }
}

impl ControllerArgs {
    /// `--workers`, or `workers` in the file (the flag wins); None for one
    /// process.
    pub fn workers(&self, file: &FileConfig) -> Result<Option<u16>> {
        match (self.workers, file.workers) {
            (Some(n), _) => Ok(Some(n)),
            (None, Some(n)) if !(1..=256).contains(&n) => {
                bail!("workers: 1 to 256 worker processes, not {n}")
            }
            (None, n) => Ok(n),
        }
    }

    pub fn resolve(self, mut file: FileConfig) -> Result<ControllerConfig> {
        if file.controller.is_some()
            || file.switch_name.is_some()
            || file.server_name.is_some()
            || file.bind.is_some()
            || file.max_backoff.is_some()
            || file.reconnect_jitter.is_some()
            || file.failback_interval.is_some()
            || file.zero_length_cid.is_some()
        {
            bail!(
                "`controller`, `server-name`, `bind`, `max-backoff`, `reconnect-jitter`, \
                 `failback-interval` and `zero-length-cid` are switch agent settings"
            );
        }
        let listen = self
            .listen
            .or(file.listen.take())
            .unwrap_or_else(|| "0.0.0.0:6653".parse().expect("valid default"));
        Ok(ControllerConfig {
            listen,
            relaxed_flow_mods: self.relaxed_flow_mods
                || file.relaxed_flow_mods.take().unwrap_or(false),
            session_store: self.session_store.or(file.session_store.take()),
            max_handshakes: self
                .max_handshakes
                .or(file.max_handshakes.take())
                .unwrap_or(quicsdn_agent::admission::DEFAULT_MAX_HANDSHAKES),
            server_id: match (self.server_id, file.server_id.take()) {
                (Some(id), _) => Some(id),
                (None, Some(text)) => Some(text.parse().map_err(|e| anyhow!("server-id: {e}"))?),
                (None, None) => None,
            },
            common: common(self.common, &mut file)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("quicsdn").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn overhead_tuning_options_resolve() {
        let base = [
            "--controller",
            "192.0.2.1:6653",
            "--ca",
            "/c",
            "--cert",
            "/c",
            "--key",
            "/k",
            "--service",
            "openflow=ptcp:6653",
        ];
        let switch = |extra: &[&str]| {
            let mut v = vec!["switch"];
            v.extend(base);
            v.extend(extra);
            let Command::Switch(args) = parse(&v).command else {
                panic!()
            };
            args.resolve(FileConfig::default())
        };
        let d = switch(&[]).unwrap();
        assert_eq!(
            d.common.quic.ack_frequency,
            Some(quicsdn_transport::quic::DEFAULT_ACK_FREQUENCY)
        );
        assert!(!d.common.quic.zero_length_cid);
        assert_eq!(d.common.quic.keepalive, Duration::from_millis(5250));
        assert_eq!(
            d.common.coalesce,
            Some(quicsdn_lanes::coalesce::DEFAULT_WINDOW)
        );
        let knobs = switch(&[
            "--ack-threshold",
            "off",
            "--zero-length-cid=true",
            "--coalesce",
            "off",
            "--grace",
            "10s",
        ])
        .unwrap();
        assert_eq!(knobs.common.quic.ack_frequency, None);
        assert!(knobs.common.quic.zero_length_cid);
        assert_eq!(knobs.common.coalesce, None);
        assert_eq!(knobs.common.quic.keepalive, Duration::from_millis(8750));
        assert!(switch(&["--ack-threshold", "many"]).is_err());
        assert!(switch(&["--ack-threshold", "off", "--ack-delay", "5ms"]).is_err());
        let t = switch(&[
            "--ack-threshold",
            "16",
            "--ack-delay",
            "5ms",
            "--zero-length-cid",
        ])
        .unwrap();
        assert_eq!(
            t.common.quic.ack_frequency,
            Some(AckFrequency {
                threshold: 16,
                max_delay: Some(Duration::from_millis(5))
            })
        );
        assert!(t.common.quic.zero_length_cid);
        let ack_delay = |v: &str| {
            switch(&["--ack-delay", v])
                .unwrap()
                .common
                .quic
                .ack_frequency
                .unwrap()
                .max_delay
        };
        assert_eq!(
            ack_delay("auto"),
            Some(quicsdn_transport::quic::AUTO_ACK_DELAY_CAP)
        );
        assert_eq!(ack_delay("peer"), None);
        assert_eq!(ack_delay("40ms"), Some(Duration::from_millis(40)));
        assert!(switch(&["--ack-delay", "soon"]).is_err());
        assert!(switch(&["--coalesce", "soon"]).is_err());
        assert_eq!(d.common.quic.cid_len, 4);
        assert_eq!(switch(&["--cid-len", "8"]).unwrap().common.quic.cid_len, 8);
        assert!(switch(&["--cid-len", "3"]).is_err());
        assert!(switch(&["--cid-len", "9"]).is_err());
    }

    #[test]
    fn the_documented_switch_command_line_resolves() {
        let cli = parse(&[
            "switch",
            "--controller",
            "192.0.2.1:6653",
            "--server-name",
            "ctl",
            "--ca",
            "/p/ca.crt",
            "--cert",
            "/p/sw1.crt",
            "--key",
            "/p/sw1.key",
            "--service",
            "openflow=punix:/var/run/openvswitch/quicsdn-openflow.sock",
            "--service",
            "ovsdb=ptcp:6640:127.0.0.1",
        ]);
        let Command::Switch(args) = cli.command else {
            panic!()
        };
        let cfg = args.resolve(FileConfig::default()).unwrap();
        assert_eq!(
            cfg.controllers,
            [ControllerTarget::new("192.0.2.1:6653", "ctl")]
        );
        assert_eq!(cfg.failback_interval, Duration::from_secs(8));
        assert_eq!(cfg.common.max_sessions, 8);
        assert_eq!(cfg.common.services.len(), 2);
        assert_eq!(cfg.common.streams, StreamMode::default());
        assert_eq!(cfg.max_backoff, Duration::from_secs(8));
        assert_eq!(
            cfg.reconnect_jitter,
            quicsdn_agent::admission::DEFAULT_RECONNECT_JITTER
        );
    }

    #[test]
    fn admission_control_and_reconnect_jitter() {
        let tls = ["--ca=/a", "--cert=/b", "--key=/c"];
        let ctl = |extra: &[&str]| {
            let mut a = vec!["controller", "--service=openflow=tcp:127.0.0.1:6653"];
            a.extend(tls);
            a.extend(extra);
            let Command::Controller(args) = parse(&a).command else {
                panic!()
            };
            args.resolve(FileConfig::default())
        };
        assert_eq!(
            ctl(&[]).unwrap().max_handshakes,
            quicsdn_agent::admission::DEFAULT_MAX_HANDSHAKES
        );
        assert_eq!(ctl(&["--max-handshakes=0"]).unwrap().max_handshakes, 0);
        assert_eq!(
            ctl(&["--max-handshakes", "200"]).unwrap().max_handshakes,
            200
        );
        let e = Cli::try_parse_from(["quicsdn", "controller", "--max-handshakes=many"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--max-handshakes"), "{e}");
        // A host's server id for a QUIC-LB balancer: hexadecimal, from a flag
        // or the file (the flag wins), refused with the rule when malformed.
        assert_eq!(ctl(&[]).unwrap().server_id, None);
        let id = ctl(&["--server-id=0a01"]).unwrap().server_id.unwrap();
        assert_eq!(id.as_bytes(), &[0x0a, 0x01]);
        let e = Cli::try_parse_from(["quicsdn", "controller", "--server-id=xyz"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--server-id") && e.contains("hexadecimal"),
            "{e}"
        );
        let in_file = |text: &str| {
            let file: FileConfig = toml::from_str(text).unwrap();
            let mut a = vec!["controller", "--service=openflow=tcp:127.0.0.1:6653"];
            a.extend(tls);
            let Command::Controller(args) = parse(&a).command else {
                panic!()
            };
            args.resolve(file)
        };
        // `workers` from the file too (the flag wins), range checked.
        let workers = |flags: &[&str], text: &str| {
            let mut a = vec!["controller"];
            a.extend(flags);
            let Command::Controller(args) = parse(&a).command else {
                panic!()
            };
            args.workers(&toml::from_str(text).unwrap())
        };
        assert_eq!(workers(&[], "").unwrap(), None);
        assert_eq!(workers(&[], "workers = 2").unwrap(), Some(2));
        assert_eq!(workers(&["--workers=3"], "workers = 2").unwrap(), Some(3));
        let e = workers(&[], "workers = 0").unwrap_err().to_string();
        assert!(e.contains("1 to 256"), "{e}");
        let from_file = in_file("server-id = \"0b\"").unwrap().server_id.unwrap();
        assert_eq!(from_file.as_bytes(), &[0x0b]);
        let e = in_file("server-id = \"0\"").unwrap_err().to_string();
        assert!(e.contains("server-id") && e.contains("hexadecimal"), "{e}");
        let file: FileConfig = toml::from_str("server-id = \"0b\"").unwrap();
        let Command::Switch(args) = parse(&["switch", "--controller=c:1"]).command else {
            panic!()
        };
        let e = args.resolve(file).unwrap_err().to_string();
        assert!(e.contains("server-id"), "{e}");
        let Command::Switch(args) = parse(&[
            "switch",
            "--controller=c:1",
            "--ca=/a",
            "--cert=/b",
            "--key=/c",
            "--service=openflow=punix:/x.sock",
            "--reconnect-jitter=2s",
        ])
        .command
        else {
            panic!()
        };
        let cfg = args.resolve(FileConfig::default()).unwrap();
        assert_eq!(cfg.reconnect_jitter, Duration::from_secs(2));
        let Command::Switch(args) =
            parse(&["switch", "--controller=c:1", "--reconnect-jitter=soon"]).command
        else {
            panic!()
        };
        let e = args.resolve(FileConfig::default()).unwrap_err().to_string();
        assert!(e.contains("--reconnect-jitter"), "{e}");
        // Each agent's settings are refused in the other's file.
        let file: FileConfig = toml::from_str("max-handshakes = 8").unwrap();
        let Command::Switch(args) = parse(&["switch", "--controller=c:1"]).command else {
            panic!()
        };
        let e = args.resolve(file).unwrap_err().to_string();
        assert!(e.contains("max-handshakes"), "{e}");
        let file: FileConfig = toml::from_str("reconnect-jitter = \"1s\"").unwrap();
        let Command::Controller(args) = parse(&["controller"]).command else {
            panic!()
        };
        let e = args.resolve(file).unwrap_err().to_string();
        assert!(e.contains("reconnect-jitter"), "{e}");
    }

    #[test]
    fn config_file_fills_in_and_flags_win() {
        let file: FileConfig = toml::from_str(
            r#"
            controller = "[2001:db8::1]:6653"
            ca = "/f/ca.crt"
            cert = "/f/c.crt"
            key = "/f/c.key"
            service = ["openflow=ptcp:6653"]
            streams = "rr:16"
            idle-timeout = "9s"
            "#,
        )
        .unwrap();
        let cli = parse(&["switch", "--streams", "ordered", "--cert", "/cli/c.crt"]);
        let Command::Switch(args) = cli.command else {
            panic!()
        };
        let cfg = args.resolve(file).unwrap();
        assert_eq!(cfg.controllers[0].server_name, "2001:db8::1");
        assert_eq!(cfg.common.streams, StreamMode::Ordered);
        assert_eq!(cfg.common.tls.cert, PathBuf::from("/cli/c.crt"));
        assert_eq!(cfg.common.tls.ca, PathBuf::from("/f/ca.crt"));
        assert_eq!(cfg.common.quic.idle_timeout, Duration::from_secs(9));
        assert!(cfg.common.quic.zero_rtt, "on by default");
    }

    #[test]
    fn several_controller_agents_in_order() {
        let cli = parse(&[
            "switch",
            "--controller=a.example:6653",
            "--controller=[2001:db8::2]:6653",
            "--failback-interval=3s",
            "--max-sessions=4",
            "--ca=/a",
            "--cert=/b",
            "--key=/c",
        ]);
        let Command::Switch(args) = cli.command else {
            panic!()
        };
        let cfg = args.resolve(FileConfig::default()).unwrap();
        assert_eq!(
            cfg.controllers,
            [
                ControllerTarget::new("a.example:6653", "a.example"),
                ControllerTarget::new("[2001:db8::2]:6653", "2001:db8::2"),
            ]
        );
        assert_eq!(cfg.failback_interval, Duration::from_secs(3));
        assert_eq!(cfg.common.max_sessions, 4);
        // One name for all with --server-name; a list in the file.
        let file: FileConfig = toml::from_str(
            r#"
            controller = ["a:1", "b:2"]
            server-name = "ctl"
            ca = "/a"
            cert = "/b"
            key = "/c"
            "#,
        )
        .unwrap();
        let Command::Switch(args) = parse(&["switch"]).command else {
            panic!()
        };
        let cfg = args.resolve(file).unwrap();
        assert_eq!(
            cfg.controllers,
            [
                ControllerTarget::new("a:1", "ctl"),
                ControllerTarget::new("b:2", "ctl")
            ]
        );
        let Command::Switch(args) = parse(&[
            "switch",
            "--controller=a:1",
            "--controller=a:1",
            "--ca=/a",
            "--cert=/b",
            "--key=/c",
        ])
        .command
        else {
            panic!()
        };
        let e = args.resolve(FileConfig::default()).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn zero_rtt_and_the_session_store() {
        let cli = parse(&[
            "controller",
            "--ca=/a",
            "--cert=/b",
            "--key=/c",
            "--service=openflow=tcp:127.0.0.1:6653",
            "--no-zero-rtt",
            "--session-store=/var/lib/quicsdn/sessions",
        ]);
        let Command::Controller(args) = cli.command else {
            panic!()
        };
        let cfg = args.resolve(FileConfig::default()).unwrap();
        assert!(!cfg.common.quic.zero_rtt);
        assert_eq!(
            cfg.session_store.as_deref(),
            Some(Path::new("/var/lib/quicsdn/sessions"))
        );
        let file: FileConfig = toml::from_str("zero-rtt = false\nsession-store = \"/s\"").unwrap();
        let cli = parse(&[
            "switch",
            "--controller=c:1",
            "--ca=/a",
            "--cert=/b",
            "--key=/c",
        ]);
        let Command::Switch(args) = cli.command else {
            panic!()
        };
        let e = args.resolve(file).unwrap_err().to_string();
        assert!(e.contains("controller agent settings"), "{e}");
    }

    #[test]
    fn mistakes_are_named() {
        let e = toml::from_str::<FileConfig>("colour = 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("colour"), "{e}");
        let cli = parse(&["controller", "--ca", "/a", "--cert", "/b"]);
        let Command::Controller(args) = cli.command else {
            panic!()
        };
        let e = args.resolve(FileConfig::default()).unwrap_err().to_string();
        assert!(e.contains("--key is required"), "{e}");
        let cli = parse(&["switch", "--controller", "ctl"]);
        let Command::Switch(args) = cli.command else {
            panic!()
        };
        assert!(
            args.resolve(FileConfig::default())
                .unwrap_err()
                .to_string()
                .contains("HOST:PORT")
        );
    }

    #[test]
    fn udp_transport_needs_no_certificates_and_names_its_profile() {
        let cli = parse(&[
            "switch",
            "--controller",
            "192.0.2.1:6653",
            "--transport",
            "udp",
            "--udp-profile",
            "seed",
            "--allow-unauthenticated",
            "--switch-name",
            "sw9",
            "--service",
            "openflow=punix:/tmp/x.sock",
        ]);
        let Command::Switch(args) = cli.command else {
            panic!()
        };
        let c = args.resolve(FileConfig::default()).unwrap();
        assert_eq!(
            c.common.transport,
            AgentTransport::Udp(quicsdn_udp::Profile::Seed)
        );
        assert!(c.common.allow_unauthenticated);
        assert_eq!(c.switch_name.as_deref(), Some("sw9"));
        // The default profile is robust; a profile without udp is a mistake.
        let cli = parse(&[
            "controller",
            "--transport",
            "udp",
            "--service",
            "openflow=tcp:127.0.0.1:1",
        ]);
        let Command::Controller(args) = cli.command else {
            panic!()
        };
        let c = args.resolve(FileConfig::default()).unwrap();
        assert_eq!(
            c.common.transport,
            AgentTransport::Udp(quicsdn_udp::Profile::Robust)
        );
        // Without --allow-unauthenticated the agent refuses to start (validate()).
        assert!(!c.common.allow_unauthenticated);
        let cli = parse(&[
            "controller",
            "--udp-profile",
            "seed",
            "--ca",
            "/a",
            "--cert",
            "/b",
            "--key",
            "/c",
        ]);
        let Command::Controller(args) = cli.command else {
            panic!()
        };
        let e = args.resolve(FileConfig::default()).unwrap_err().to_string();
        assert!(e.contains("--udp-profile needs --transport udp"), "{e}");
        let cli = parse(&["controller", "--transport", "tcp"]);
        let Command::Controller(args) = cli.command else {
            panic!()
        };
        let e = args.resolve(FileConfig::default()).unwrap_err().to_string();
        assert!(e.contains("use quic or udp"), "{e}");
    }
}
