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

#[derive(clap::Args)]
struct EdgeArgs {
    /// The interface attached to the switch (hosts' TCP and SDUDP both).
    #[arg(long)]
    interface: String,
    /// This engine's address (SDUDP flows start and end here).
    #[arg(long)]
    ip: Ipv4Addr,
    /// This engine's MAC.
    #[arg(long)]
    mac: Mac,
    /// The next engine on the line (a relay or the far edge), IP,MAC.
    #[arg(long, value_parser = parse_neighbour)]
    neighbour: Neighbour,
    /// Hosts behind a far edge: CIDR=ENGINE_IP (repeatable).
    #[arg(long = "far-edge", value_parser = parse_far_edge, required = true)]
    far_edges: Vec<(Ipv4Addr, u8, Ipv4Addr)>,
    #[arg(long, value_parser = parse_range, default_value = "49152-50151")]
    data_ports: (u16, u16),
    #[arg(long, default_value_t = 49151)]
    control_port: u16,
    #[arg(long, default_value_t = Config::default().capacity)]
    capacity: u32,
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    initial_rto: Duration,
    /// Send every read from a host at once instead of filling datagrams.
    #[arg(long)]
    no_accumulate: bool,
    /// Longest a partly filled datagram waits.
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    accumulate_wait: Duration,
    /// Routing table numbers: TABLE (local delivery) and TABLE+1 (blackhole).
    #[arg(long, default_value_t = 100)]
    table: u32,
    /// Give up connecting to a host after this long (the near host is told
    /// the far host is unreachable).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    connect_timeout: Duration,
    #[arg(long)]
    stats: Option<PathBuf>,
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    stats_interval: Duration,
}

fn edge(a: EdgeArgs) -> Result<()> {
    use quicsdn_sdudp::conn::EdgeConfig;
    use quicsdn_sdudp_engine::edge::{EdgeEngine, EdgeSpec, setup_namespace};
    let hop = Config {
        capacity: a.capacity,
        initial_rto: a.initial_rto,
        ..Config::default()
    };
    hop.validate().map_err(anyhow::Error::msg)?;
    let spec = EdgeSpec {
        port: a.interface.clone(),
        inject: "sdudp-inj".into(),
        inject_peer_mac: "02:5d:00:00:00:01".parse().map_err(anyhow::Error::msg)?,
        me: Neighbour {
            ip: a.ip,
            mac: a.mac,
        },
        neighbour: a.neighbour,
        far_edges: a.far_edges,
        ports: Ports {
            data: a.data_ports.0..=a.data_ports.1,
            control: a.control_port,
        },
        local_table: a.table,
        connect_timeout: a.connect_timeout,
        cfg: EdgeConfig {
            hop,
            accumulate: !a.no_accumulate,
            accumulate_wait: a.accumulate_wait,
            ..EdgeConfig::default()
        },
    };
    setup_namespace(&spec, "sdudp-inj-k")?;
    let mut engine = EdgeEngine::new(spec)?;
    tracing::info!(interface = %a.interface, ip = %a.ip, "edge engine running");
    let mut next_stats = Instant::now();
    loop {
        engine.step(Duration::from_millis(100))?;
        if let Some(path) = &a.stats
            && Instant::now() >= next_stats
        {
            let s = &engine.edge().stats;
            let v = serde_json::json!({
                "edge": {
                    "opened": s.opened, "accepted": s.accepted, "closed": s.closed,
                    "failed": s.failed, "connections": engine.edge().connections(),
                    "resets_sent": engine.resets_sent,
                }
            });
            write_stats(path, &v)?;
            next_stats = Instant::now() + a.stats_interval;
        }
    }
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
    /// The interface attached to the switch.
    #[arg(long)]
    interface: String,
    /// This engine's address (control messages are sent to it).
    #[arg(long)]
    ip: Ipv4Addr,
    /// This engine's MAC (the source of everything it sends).
    #[arg(long)]
    mac: Mac,
    /// The previous engine on the line, IP,MAC.
    #[arg(long, value_parser = parse_neighbour)]
    left: Neighbour,
    /// The next engine on the line, IP,MAC.
    #[arg(long, value_parser = parse_neighbour)]
    right: Neighbour,
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
    /// Write counters as JSON to this file, atomically, every --stats-interval.
    #[arg(long)]
    stats: Option<PathBuf>,
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    stats_interval: Duration,
}

fn write_stats(path: &PathBuf, value: &serde_json::Value) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn relay(a: RelayArgs) -> Result<()> {
    let cfg = Config {
        capacity: a.capacity,
        initial_rto: a.initial_rto,
        ..Config::default()
    };
    cfg.validate().map_err(anyhow::Error::msg)?;
    let io = PacketSocket::open(&a.interface)?;
    let mut relay = Relay::new(
        io,
        Engine::new(cfg),
        Neighbour {
            ip: a.ip,
            mac: a.mac,
        },
        a.left,
        a.right,
        Ports {
            data: a.data_ports.0..=a.data_ports.1,
            control: a.control_port,
        },
    );
    tracing::info!(interface = %a.interface, ip = %a.ip, mac = %a.mac, "relay engine running");
    let mut buf = vec![0u8; 65_536];
    let mut next_stats = Instant::now();
    loop {
        relay
            .step(&mut buf, Duration::from_millis(100))
            .with_context(|| format!("packet I/O on {}", a.interface))?;
        if let Some(path) = &a.stats
            && Instant::now() >= next_stats
        {
            write_stats(path, &relay.stats_json())?;
            next_stats = Instant::now() + a.stats_interval;
        }
    }
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
