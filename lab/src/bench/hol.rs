//! `quicsdn-lab bench hol`: head-of-line blocking on a lossy control link, with
//! real Open vSwitch, over `tcp`, the agents in `ordered` mode (one stream per
//! connection) and the agents in their default `safe` mode.
//!
//! * **echo**: the controller keeps two flow-statistics requests outstanding
//!   against a switch holding thousands of flows (a reply storm of hundreds of
//!   kilobytes each) and sends an ECHO_REQUEST every 20 ms; the echo round trip
//!   is measured (2 % loss, 10 ms one-way delay). OVS answers echo at once, so
//!   the round trip is the transport's: how long a small message waits behind
//!   bulk data.
//! * **packet-in**: a host sends 100 UDP packets per second, each a new flow,
//!   each carrying its send time; the switch has only a table-miss entry, so
//!   each becomes a PACKET_IN; the controller measures host-to-controller delay
//!   (100 ms round trip, 1 % and 5 % loss).
//!
//! Prints p50/p99/mean per transport and the reduction against `tcp`; writes
//! `hol.csv` (every sample), `hol.md` (the summary) and `hol.png` (boxplots) to
//! `--out`. A benchmark: it asserts nothing.

use std::net::UdpSocket;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use quicsdn_wire::openflow::build::{self, Action, CONTROLLER, FlowMod, Oxm, msg_type};
use quicsdn_wire::openflow::{HEADER_LEN, fields};

use crate::bench::out::{self, Csv};
use crate::bench::pair::OLD_DEFAULT_ARGS;
use crate::bench::stats;
use crate::control_link::Impairment;
use crate::emulator::sys::{in_netns, monotonic_ns};
use crate::openflow_peer::Controller;
use crate::testbed::{Testbed, TestbedSpec, Via};

#[derive(clap::Args, Debug, Clone)]
pub struct HolArgs {
    /// Where `hol.csv`, `hol.md` and `hol.png` go.
    #[arg(long, default_value = "lab-results/hol")]
    pub out: PathBuf,
    /// A short run (a few seconds per cell) instead of 15 s.
    #[arg(long)]
    pub quick: bool,
    /// Extra options for both agents (repeatable), e.g. `--agent-arg=--stream-window=256k`.
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Also measure `safe` with the agents' defaults before issue 13
    /// (`quic-old` of the other benches), in the same run, after the others
    /// in each cell.
    #[arg(long)]
    pub old_defaults: bool,
    /// The emulator's loss seed. Every transport of a cell gets the same seed,
    /// so they meet the same loss draws; without it, one is drawn per run and
    /// printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Name prefix of the bench's namespaces (at most 12 characters).
    #[arg(long, default_value = "qsdnhol")]
    pub prefix: String,
    /// Skip the PNG plots (no matplotlib venv needed).
    #[arg(long)]
    pub no_plots: bool,
}

/// The CSV's columns: one row per sample.
pub const COLUMNS: [&str; 4] = ["bench", "loss_percent", "transport", "sample_ms"];

const TIMEOUT: Duration = Duration::from_secs(60);
/// Marks the benchmark's UDP payloads.
const MAGIC: &[u8; 8] = b"qsdnHOL1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tcp,
    Ordered,
    Safe,
    /// `safe` with the defaults before issue 13 ([`OLD_DEFAULT_ARGS`]).
    SafeOld,
}

impl Transport {
    fn measured(old_defaults: bool) -> Vec<Transport> {
        let mut v = vec![Transport::Tcp, Transport::Ordered, Transport::Safe];
        if old_defaults {
            v.push(Transport::SafeOld);
        }
        v
    }

    fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Ordered => "quic ordered",
            Transport::Safe => "quic (default: safe)",
            Transport::SafeOld => "quic (old defaults)",
        }
    }

    fn via(self, extra: &[String]) -> Via {
        let agents = |m: &str, setting: &[&str]| {
            // The bench's --agent-arg come last, so they win.
            let both: Vec<String> = setting
                .iter()
                .map(|a| a.to_string())
                .chain(extra.iter().cloned())
                .collect();
            Via::Agents {
                switch_args: [vec![format!("--streams={m}")], both.clone()].concat(),
                controller_args: both
                    .into_iter()
                    .filter(|a| !crate::agents::is_switch_only(a))
                    .collect(),
            }
        };
        match self {
            Transport::Tcp => Via::Tcp,
            Transport::Ordered => agents("ordered", &[]),
            Transport::Safe => agents("safe", &[]),
            Transport::SafeOld => agents("safe", &OLD_DEFAULT_ARGS),
        }
    }
}

/// The samples of one cell, in milliseconds.
struct Cell {
    bench: &'static str,
    loss: f64,
    transport: Transport,
    samples: Vec<f64>,
    /// The delay no transport can avoid: the propagation delay the sample
    /// includes (one way for packet-ins, a round trip for echo).
    floor_ms: f64,
}

fn testbed(
    prefix: &str,
    transport: Transport,
    delay_ms: u64,
    loss: f64,
    hosts: u32,
    extra: &[String],
    seed: u64,
) -> Result<(Testbed, Controller)> {
    let bed = Testbed::up(&TestbedSpec {
        prefix: prefix.into(),
        impairment: Impairment {
            delay: Some(Duration::from_millis(delay_ms)),
            loss_percent: Some(loss),
            seed: Some(seed),
            ..Impairment::default()
        },
        via: transport.via(extra),
        hosts,
    })?;
    let controller = bed.accept_controller(TIMEOUT)?;
    Ok((bed, controller))
}

/// Answers the switch's own echo requests; true if `m` was one.
fn answer_echo(c: &mut Controller, m: &crate::openflow_peer::Received) -> Result<bool> {
    if m.header.msg_type == msg_type::ECHO_REQUEST {
        c.send(&build::echo_reply(m.header.xid, &m.bytes[HEADER_LEN..]))?;
        return Ok(true);
    }
    Ok(false)
}

fn echo_during_stats_storm(
    prefix: &str,
    transport: Transport,
    flows: u32,
    run: Duration,
    extra: &[String],
    seed: u64,
) -> Result<Vec<f64>> {
    let (_bed, mut c) = testbed(prefix, transport, 10, 2.0, 0, extra, seed)?;
    for i in 0..flows {
        let m = vec![Oxm::EthType(0x0800), Oxm::Ipv4Dst(0x0a01_0000 + i, None)];
        c.send(&build::flow_mod(
            i,
            &FlowMod::add(100, m, vec![Action::Output(1)]),
        ))?;
    }
    c.barrier(1, TIMEOUT)?;
    let mut next_xid = 1_000_000u32;
    let mut outstanding = Vec::new();
    let mut rtts = Vec::new();
    let start = Instant::now();
    let mut next_echo = start;
    let mut echo_seq = 0u32;
    let mut storm_bytes = 0u64;
    while start.elapsed() < run {
        while outstanding.len() < 2 {
            next_xid += 1;
            c.send(&build::flow_stats_request(next_xid))?;
            outstanding.push(next_xid);
        }
        if Instant::now() >= next_echo {
            echo_seq += 1;
            c.send(&build::echo_request(
                echo_seq,
                &monotonic_ns().to_be_bytes(),
            ))?;
            next_echo += Duration::from_millis(20);
        }
        let Some(m) = c.recv_by(next_echo)? else {
            continue;
        };
        if answer_echo(&mut c, &m)? {
            continue;
        }
        match m.header.msg_type {
            msg_type::ECHO_REPLY if m.bytes.len() >= HEADER_LEN + 8 => {
                let sent = u64::from_be_bytes(m.bytes[HEADER_LEN..HEADER_LEN + 8].try_into()?);
                rtts.push((monotonic_ns() - sent) as f64 / 1e6);
            }
            msg_type::MULTIPART_REPLY => {
                storm_bytes += m.bytes.len() as u64;
                let more = m.bytes.get(11).is_some_and(|f| f & 1 == 1);
                if !more {
                    outstanding.retain(|&x| x != m.header.xid);
                }
            }
            _ => {}
        }
    }
    if rtts.is_empty() {
        bail!("{}: no echo reply came back", transport.name());
    }
    println!(
        "  flow-stats replies received: {:.2} MB/s",
        storm_bytes as f64 / start.elapsed().as_secs_f64() / 1e6
    );
    Ok(rtts)
}

/// The send time a benchmark packet carries, from a PACKET_IN.
fn packet_send_time(msg: &[u8]) -> Option<u64> {
    let frame = fields::packet_in_data(msg)?;
    // Ethernet (14) + IPv4 (20, no options from this sender) + UDP (8).
    let payload = frame.get(42..)?;
    if payload.get(..8)? != MAGIC {
        return None;
    }
    Some(u64::from_be_bytes(payload.get(8..16)?.try_into().ok()?))
}

fn packet_in_delay(
    prefix: &str,
    transport: Transport,
    loss: f64,
    run: Duration,
    extra: &[String],
    seed: u64,
) -> Result<Vec<f64>> {
    let (bed, mut c) = testbed(prefix, transport, 50, loss, 1, extra, seed)?;
    // Only a table-miss entry: every packet goes to the controller.
    c.send(&build::flow_mod(
        1,
        &FlowMod::add(0, vec![], vec![Action::Output(CONTROLLER)]),
    ))?;
    c.barrier(2, TIMEOUT)?;
    let host = bed.hosts[0].clone();
    host.ip(&[
        "neigh",
        "replace",
        "10.0.0.250",
        "lladdr",
        "02:00:00:00:00:fa",
        "dev",
        "eth0",
    ])?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_sender = stop.clone();
    // 100 packets per second, each from its own source port: each a new flow.
    let sender = std::thread::spawn(move || -> Result<u64> {
        in_netns(&host.name, move || -> Result<u64> {
            let sockets: Vec<UdpSocket> = (0..200u16)
                .map(|i| UdpSocket::bind(("10.0.0.1", 20_000 + i)))
                .collect::<std::io::Result<_>>()?;
            let start = Instant::now();
            let mut sent = 0u64;
            while !stop_sender.load(Ordering::Relaxed) {
                let due = start + Duration::from_millis(10) * sent as u32;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let mut payload = MAGIC.to_vec();
                payload.extend_from_slice(&monotonic_ns().to_be_bytes());
                sockets[(sent % 200) as usize].send_to(&payload, ("10.0.0.250", 9))?;
                sent += 1;
            }
            Ok(sent)
        })?
    });
    let mut delays = Vec::new();
    let end = Instant::now() + run;
    while Instant::now() < end {
        let Some(m) = c.recv_by(end)? else { break };
        if answer_echo(&mut c, &m)? {
            continue;
        }
        if m.header.msg_type == msg_type::PACKET_IN
            && let Some(sent) = packet_send_time(&m.bytes)
        {
            delays.push((monotonic_ns() - sent) as f64 / 1e6);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let sent = sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    if delays.len() < (sent / 2) as usize {
        bail!(
            "{}: only {} of {sent} packets came back as PACKET_INs",
            transport.name(),
            delays.len()
        );
    }
    Ok(delays)
}

/// Reads `DIR/hol.csv`, checking its schema.
pub fn read(dir: &std::path::Path) -> Result<Csv> {
    Csv::read(&dir.join("hol.csv"), &COLUMNS)
}

fn p50_p99_mean(samples: &[f64]) -> (f64, f64, f64) {
    let s = stats::sorted(samples);
    (
        stats::quantile(&s, 0.5),
        stats::quantile(&s, 0.99),
        s.iter().sum::<f64>() / s.len() as f64,
    )
}

/// Issue 13's delay targets for urgent messages, default against old defaults
/// in the same run: the median at most this much later (ms)...
const P50_TARGET_MS: f64 = 0.2;
/// ...and the p99 at most this much later (ms).
const P99_TARGET_MS: f64 = 1.0;

/// The summary's comparison of the defaults (`safe`) with the old defaults,
/// cell by cell: each quantile's difference, its 95 % bootstrap interval, and
/// whether the interval decides the target.
fn old_defaults_table(cells: &[Cell]) -> Vec<Vec<String>> {
    let verdict = |(lo, hi): (f64, f64), target: f64| {
        if hi <= target {
            "met"
        } else if lo > target {
            "missed"
        } else {
            "not decided"
        }
    };
    let mut rows = Vec::new();
    for new in cells.iter().filter(|c| c.transport == Transport::Safe) {
        let Some(old) = cells.iter().find(|c| {
            c.bench == new.bench && c.loss == new.loss && c.transport == Transport::SafeOld
        }) else {
            continue;
        };
        let (a, b) = (stats::sorted(&new.samples), stats::sorted(&old.samples));
        let mut row = vec![new.bench.to_string(), format!("{}%", new.loss)];
        for (q, target) in [(0.5, P50_TARGET_MS), (0.99, P99_TARGET_MS)] {
            let ci = stats::quantile_diff_ci(&a, &b, q, 1000, 13);
            row.push(format!(
                "{:+.2}",
                stats::quantile(&a, q) - stats::quantile(&b, q)
            ));
            row.push(format!("[{:+.1}, {:+.1}]", ci.0, ci.1));
            row.push(format!("{} (≤ +{target} ms)", verdict(ci, target)));
        }
        rows.push(row);
    }
    rows
}

pub fn run(args: HolArgs) -> Result<()> {
    let run = if args.quick {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(15)
    };
    let flows = if args.quick { 1000 } else { 5000 };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let seed = args
        .seed
        .unwrap_or_else(crate::emulator::rng::Xoshiro256pp::entropy_seed);
    println!("loss seed {seed} (--seed {seed} repeats this run's loss draws)");
    let mut cells = Vec::new();
    for t in Transport::measured(args.old_defaults) {
        println!(
            "echo during a flow-stats storm ({flows} flows), 2% loss: {}",
            t.name()
        );
        cells.push(Cell {
            bench: "echo",
            loss: 2.0,
            transport: t,
            samples: echo_during_stats_storm(&args.prefix, t, flows, run, &args.agent_args, seed)?,
            floor_ms: 20.0,
        });
    }
    for loss in [1.0, 5.0] {
        for t in Transport::measured(args.old_defaults) {
            println!("packet-in delay, 100 ms RTT, {loss}% loss: {}", t.name());
            cells.push(Cell {
                bench: "packet-in",
                loss,
                transport: t,
                samples: packet_in_delay(
                    &args.prefix,
                    t,
                    loss,
                    run,
                    &args.agent_args,
                    seed ^ loss.to_bits(),
                )?,
                floor_ms: 50.0,
            });
        }
    }
    let mut csv = Csv::new(&COLUMNS);
    for c in &cells {
        for s in &c.samples {
            csv.push(vec![
                c.bench.into(),
                c.loss.to_string(),
                c.transport.name().into(),
                format!("{s:.3}"),
            ]);
        }
    }
    csv.write(&args.out.join("hol.csv"))?;
    let mut md = String::from(
        "# Head-of-line blocking with real Open vSwitch\n\n\
         Generated by `quicsdn-lab bench hol`. echo: round trip of ECHO_REQUEST during a \
         flow-stats storm, 10 ms one-way delay, 2 % loss. packet-in: host-to-controller \
         delay of PACKET_INs, 50 ms one-way delay (100 ms RTT). All in ms. *Excess* is \
         the part above the propagation delay no transport can avoid (20 ms round trip for \
         echo, 50 ms one way for packet-ins): the waiting a transport adds. *Floor vs tcp* \
         is the best any transport could do against tcp's mean: the propagation delay \
         alone.\n\n",
    );
    md += &out::provenance();
    md += &format!("- loss seed: {seed} (`--seed {seed}` repeats the loss draws)\n");
    if args.old_defaults {
        md += &format!(
            "- *quic (old defaults)*: the agents, stream mode `safe`, with the defaults before issue 13 (`{}`), measured in the same run\n",
            OLD_DEFAULT_ARGS.join(" ")
        );
    }
    if !args.agent_args.is_empty() {
        md += &format!(
            "- extra options of both agents: `{}`\n",
            args.agent_args.join(" ")
        );
    }
    md.push('\n');
    let mut rows = Vec::new();
    println!();
    for c in &cells {
        let (p50, p99, mean) = p50_p99_mean(&c.samples);
        let tcp = cells
            .iter()
            .find(|b| b.bench == c.bench && b.loss == c.loss && b.transport == Transport::Tcp)
            .map(|b| p50_p99_mean(&b.samples))
            .expect("tcp measured");
        let vs = |x: f64, base: f64| format!("{:+.0}%", (x / base - 1.0) * 100.0);
        let excess =
            |x: f64, base: f64| vs((x - c.floor_ms).max(0.0), (base - c.floor_ms).max(1e-3));
        let row = vec![
            c.bench.to_string(),
            format!("{}%", c.loss),
            c.transport.name().to_string(),
            c.samples.len().to_string(),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{mean:.1}"),
            vs(mean, tcp.2),
            vs(p99, tcp.1),
            excess(mean, tcp.2),
            excess(p99, tcp.1),
            vs(c.floor_ms, tcp.2),
        ];
        println!("{}", row.join("  "));
        rows.push(row);
    }
    md += &out::md_table(
        &[
            "bench",
            "loss",
            "transport",
            "samples",
            "p50",
            "p99",
            "mean",
            "mean vs tcp",
            "p99 vs tcp",
            "excess mean vs tcp",
            "excess p99 vs tcp",
            "floor vs tcp",
        ],
        &rows,
    );
    if args.old_defaults {
        let table = old_defaults_table(&cells);
        println!("\ndefault minus old defaults (ms): p50, its 95 % interval, verdict; p99, ...");
        for row in &table {
            println!("{}", row.join("  "));
        }
        md += "\n## The defaults against the old defaults\n\n\
               `quic (default: safe)` minus `quic (old defaults)`, in ms, with the 95 % \
               bootstrap interval of each difference (1,000 resamples). A target is *met* \
               when the whole interval is within it, *missed* when the whole interval is \
               beyond it, and *not decided* when the interval spans it: at these sample \
               counts a p99 under loss sits on the edge of the loss tail, and one loss \
               more or less moves it by a retransmission time.\n\n";
        md += &out::md_table(
            &[
                "bench",
                "loss",
                "p50 Δ",
                "p50 Δ 95 % interval",
                "p50 target",
                "p99 Δ",
                "p99 Δ 95 % interval",
                "p99 target",
            ],
            &table,
        );
    }
    if !args.no_plots {
        md += "\n![delay per transport (boxes: quartiles, whiskers: 1st and 99th percentile; dashed: propagation delay)](hol.png)\n";
        out::plot("hol", &args.out)?;
    }
    std::fs::write(args.out.join("hol.md"), md)?;
    println!("\nwrote {}/hol.csv and hol.md", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_name_fits_a_csv_cell() {
        for t in Transport::measured(true) {
            assert!(!t.name().contains([',', '"', '\n']), "{}", t.name());
        }
        assert_eq!(Transport::measured(false).len(), 3);
    }
}
