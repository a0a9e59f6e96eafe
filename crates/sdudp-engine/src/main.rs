//! `quicsdn-sdudp`: SDUDP engines beside an Open vSwitch instance.
//!
//! `quicsdn-sdudp relay --interface IF …` runs the retransmission engine of
//! one switch on the port IF (a veth or TAP whose other end is a port of the
//! switch; OpenFlow rules steer the SDUDP flows to it).

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use quicsdn_sdudp::{Config, Engine};
use quicsdn_sdudp_engine::frame::{Mac, Ports};
use quicsdn_sdudp_engine::packet::PacketSocket;
use quicsdn_sdudp_engine::relay::{Neighbour, Relay};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "quicsdn-sdudp",
    version,
    about = "SDUDP engines beside Open vSwitch"
)]
struct Cli {
    /// Log level or tracing directives.
    #[arg(long, default_value = "info")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The retransmission engine of one switch on the path.
    Relay(RelayArgs),
    /// The TCP engine (with retransmission) of an edge switch.
    Edge(EdgeArgs),
}

fn parse_far_edge(s: &str) -> Result<(Ipv4Addr, u8, Ipv4Addr), String> {
    let (net, engine) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected CIDR=ENGINE_IP"))?;
    let (addr, len) = net
        .split_once('/')
        .ok_or_else(|| format!("{net:?}: expected ADDRESS/LENGTH"))?;
    let len: u8 = len.parse().map_err(|e| format!("{len:?}: {e}"))?;
    if len > 32 {
        return Err(format!("{net:?}: prefix length above 32"));
    }
    Ok((
        addr.parse().map_err(|e| format!("{addr:?}: {e}"))?,
        len,
        engine.parse().map_err(|e| format!("{engine:?}: {e}"))?,
    ))
}

/// Options every engine takes.
#[derive(clap::Args)]
struct EngineArgs {
    /// The interface attached to the switch.
    #[arg(long)]
    interface: String,
    /// This engine's address (flows and control messages address it).
    #[arg(long)]
    ip: Ipv4Addr,
    /// This engine's MAC (the source of everything it sends).
    #[arg(long)]
    mac: Mac,
    /// UDP ports of SDUDP flows.
    #[arg(long, value_parser = parse_range, default_value = "49152-50151")]
    data_ports: (u16, u16),
    /// UDP port of control messages between engines.
    #[arg(long, default_value_t = 49151)]
    control_port: u16,
    /// Datagrams one flow may hold here (and the window granted upstream).
    #[arg(long, default_value_t = Config::default().capacity)]
    capacity: u32,
    /// Retransmission timeout before any round-trip sample.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    initial_rto: Duration,
    /// A receiver releases what arrived after 16 datagrams or this long after
    /// the first unreleased one; senders ask sooner when they need it
    /// (docs/sdudp.md). 10ms answers a slow stream datagram by datagram.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    release_delay: Duration,
    /// No per-hop congestion window: send all the next engine's window allows
    /// at once (the paper's engines; bursts then overflow switch ports).
    #[arg(long, conflicts_with = "newreno_window")]
    no_congestion_window: bool,
    /// A per-hop window that halves on the first loss of a window (NewReno)
    /// instead of the default, which shrinks when queues build and tolerates
    /// sparse random loss (docs/sdudp.md; slower on lossy links).
    #[arg(long)]
    newreno_window: bool,
    /// Forward strictly in order, as the paper's engines: a loss then holds
    /// every later datagram for its repair and idles the links after it. By
    /// default a relay forwards each datagram as it arrives and only the
    /// receiving edge restores the order (docs/sdudp.md).
    #[arg(long)]
    in_order: bool,
    /// Write counters as JSON to this file, atomically, every --stats-interval.
    #[arg(long)]
    stats: Option<PathBuf>,
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    stats_interval: Duration,
}

impl EngineArgs {
    fn hop_config(&self) -> Result<Config> {
        let cfg = Config {
            capacity: self.capacity,
            initial_rto: self.initial_rto,
            release_delay: self.release_delay,
            congestion: if self.no_congestion_window {
                None
            } else if self.newreno_window {
                Some(quicsdn_sdudp::CongestionConfig::newreno())
            } else {
                Config::default().congestion
            },
            cut_through: !self.in_order,
            ..Config::default()
        };
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(cfg)
    }

    fn me(&self) -> Neighbour {
        Neighbour {
            ip: self.ip,
            mac: self.mac,
        }
    }

    fn ports(&self) -> Ports {
        Ports {
            data: self.data_ports.0..=self.data_ports.1,
            control: self.control_port,
        }
    }

    /// Runs `step` forever, writing `stats()` every `--stats-interval`.
    fn run(
        &self,
        mut step: impl FnMut() -> Result<()>,
        stats: impl Fn(&mut dyn FnMut(&serde_json::Value) -> Result<()>) -> Result<()>,
    ) -> Result<()> {
        tracing::info!(interface = %self.interface, ip = %self.ip, mac = %self.mac, "engine running");
        let mut next_stats = Instant::now();
        loop {
            step()?;
            if let Some(path) = &self.stats
                && Instant::now() >= next_stats
            {
                stats(&mut |v| write_stats(path, v))?;
                next_stats = Instant::now() + self.stats_interval;
            }
        }
    }
}

#[derive(clap::Args)]
struct EdgeArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The next engine on the line (a relay or the far edge), IP,MAC.
    #[arg(long, value_parser = parse_neighbour)]
    neighbour: Neighbour,
    /// Hosts behind a far edge: CIDR=ENGINE_IP (repeatable).
    #[arg(long = "far-edge", value_parser = parse_far_edge, required = true)]
    far_edges: Vec<(Ipv4Addr, u8, Ipv4Addr)>,
    /// Send every read from a host at once instead of filling datagrams.
    #[arg(long)]
    no_accumulate: bool,
    /// Longest a partly filled datagram waits (a lone small write waits this
    /// long; shorter waits send more, emptier datagrams: docs/sdudp.md).
    #[arg(long, value_parser = parse_duration, default_value = "20ms")]
    accumulate_wait: Duration,
    /// Routing table numbers: TABLE (local delivery) and TABLE+1 (blackhole).
    #[arg(long, default_value_t = 100)]
    table: u32,
    /// Give up connecting to a host after this long (the near host is told
    /// the far host is unreachable).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    connect_timeout: Duration,
}

fn edge(a: EdgeArgs) -> Result<()> {
    use quicsdn_sdudp::conn::EdgeConfig;
    use quicsdn_sdudp_engine::edge::{EdgeEngine, EdgeSpec, setup_namespace};
    let spec = EdgeSpec {
        port: a.engine.interface.clone(),
        inject: "sdudp-inj".into(),
        inject_peer_mac: "02:5d:00:00:00:01".parse().map_err(anyhow::Error::msg)?,
        me: a.engine.me(),
        neighbour: a.neighbour,
        far_edges: a.far_edges,
        ports: a.engine.ports(),
        local_table: a.table,
        connect_timeout: a.connect_timeout,
        cfg: EdgeConfig {
            hop: a.engine.hop_config()?,
            accumulate: !a.no_accumulate,
            accumulate_wait: a.accumulate_wait,
            ..EdgeConfig::default()
        },
    };
    setup_namespace(&spec, "sdudp-inj-k")?;
    let engine = std::cell::RefCell::new(EdgeEngine::new(spec)?);
    a.engine.run(
        || engine.borrow_mut().step(Duration::from_millis(100)),
        |write| {
            let e = engine.borrow();
            let s = &e.edge().stats;
            write(&serde_json::json!({
                "edge": {
                    "opened": s.opened, "accepted": s.accepted, "closed": s.closed,
                    "failed": s.failed, "connections": e.edge().connections(),
                    "resets_sent": e.resets_sent,
                }
            }))
        },
    )
}

fn parse_neighbour(s: &str) -> Result<Neighbour, String> {
    let (ip, mac) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: expected IP,MAC"))?;
    Ok(Neighbour {
        ip: ip.parse().map_err(|e| format!("{ip:?}: {e}"))?,
        mac: mac.parse()?,
    })
}

fn parse_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected LOW-HIGH"))?;
    let a: u16 = a.parse().map_err(|e| format!("{a:?}: {e}"))?;
    let b: u16 = b.parse().map_err(|e| format!("{b:?}: {e}"))?;
    if a > b {
        return Err(format!("{s:?}: empty range"));
    }
    Ok((a, b))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .ok_or_else(|| format!("{s:?}: a unit is required (ms, s)"))?;
    let n: u64 = n.parse().map_err(|e| format!("{s:?}: {e}"))?;
    match unit {
        "us" => Ok(Duration::from_micros(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(format!("{s:?}: unit must be us, ms or s")),
    }
}

#[derive(clap::Args)]
struct RelayArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The previous engine on the line, IP,MAC.
    #[arg(long, value_parser = parse_neighbour)]
    left: Neighbour,
    /// The next engine on the line, IP,MAC.
    #[arg(long, value_parser = parse_neighbour)]
    right: Neighbour,
}

fn write_stats(path: &PathBuf, value: &serde_json::Value) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn relay(a: RelayArgs) -> Result<()> {
    let io = PacketSocket::open(&a.engine.interface)?;
    let relay = std::cell::RefCell::new(Relay::new(
        io,
        Engine::new(a.engine.hop_config()?),
        a.engine.me(),
        a.left,
        a.right,
        a.engine.ports(),
    ));
    let mut buf = vec![0u8; 65_536];
    a.engine.run(
        || {
            relay
                .borrow_mut()
                .step(&mut buf, Duration::from_millis(100))
                .with_context(|| format!("packet I/O on {}", a.engine.interface))
        },
        |write| write(&relay.borrow().stats_json()),
    )
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log_level))
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Relay(a) => relay(a),
        Command::Edge(a) => edge(a),
    }
}
