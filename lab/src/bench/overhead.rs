//! `quicsdn-lab bench overhead`: the journal's Figs. 8–9. OpenFlow and OVSDB
//! messages both ways between a synthetic switch-side program and a synthetic
//! controller program, over each transport, for every combination of message rate,
//! loss and RTT; what crossed the emulated control link, per direction.
//!
//! Workload of one cell: in each direction `rate` messages/s in all (half
//! OpenFlow, 128 B each; half OVSDB, 384 B each), each service an independent
//! Poisson process, `messages` messages per direction. For `quic`, both services
//! share the one QUIC connection through the real agents; every other transport
//! has one connection (or tunnel) per service.
//!
//! Byte convention (the paper's Table 1): wire bytes = IP packet + 28 bytes per
//! frame (`H_EP`); payload = application message bytes; overhead = wire − payload.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::cell::{self, CellResult, CellSpec, Dir, key};
use crate::bench::model::{self, Headers};
use crate::bench::out::{self, Csv, md_table};
use crate::bench::pair::{BenchTransport, parse_transports};
use crate::bench::synth::{Schedule, Service};
use crate::emulator::{DirSettings, JitterDist, LossModel};

/// Message sizes of the grid.
pub const OPENFLOW_SIZE: usize = 128;
pub const OVSDB_SIZE: usize = 384;

pub const HEADER: &[&str] = &[
    "transport",
    "rtt",
    "loss_pct",
    "rate",
    "direction",
    "messages",
    "achieved_rate",
    "delivered",
    "payload_bytes",
    "frames",
    "wire_bytes",
    "overhead_bytes",
    "ack_only_frames",
    "lost_frames",
    "lower_bound_overhead",
    "model_overhead",
];

#[derive(clap::Args, Debug, Clone)]
pub struct OverheadArgs {
    /// Where the CSV, PNGs and markdown go.
    #[arg(long, default_value = "bench-results/overhead")]
    pub out: PathBuf,
    /// CI size: rates 10 and 1000, 1 % loss, short RTT, few messages.
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated: tcp,tls,quic,quic-rr16,quic-tuned,quic-old,kcptun,udp-seed,udp-robust (`quic-old`: the defaults before issue 13, for comparisons in one run).
    #[arg(
        long,
        default_value = "tcp,tls,quic,quic-rr16,quic-tuned,kcptun,udp-seed,udp-robust"
    )]
    pub transports: String,
    /// Comma-separated message rates per direction (messages/s, both services).
    #[arg(long)]
    pub rates: Option<String>,
    /// Comma-separated loss percentages.
    #[arg(long)]
    pub losses: Option<String>,
    /// Comma-separated: short (0.32 ± 0.05 ms), long (150 ± 50 ms).
    #[arg(long)]
    pub rtts: Option<String>,
    /// Highest default rate over the long RTT.
    #[arg(long)]
    pub long_rates: Option<f64>,
    /// Messages per direction in every cell (default: by rate; see docs/benchmarks.md).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Extra argument for both quicsdn agents (repeatable), e.g. --agent-arg=--keepalive=5s.
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// The emulator's loss seed. Every transport of a cell meets the same loss
    /// and jitter draws (each cell its own); without it, one is drawn per run
    /// and printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Name prefix of the bench's namespaces (at most 12 characters).
    #[arg(long, default_value = "qsdnbench")]
    pub prefix: String,
    /// Skip the PNG plots.
    #[arg(long)]
    pub no_plots: bool,
}

/// RTT settings: (name, mean RTT, standard deviation).
pub fn rtt_setting(name: &str) -> Result<(f64, f64)> {
    match name {
        "short" => Ok((0.32e-3, 0.05e-3)),
        "long" => Ok((150e-3, 50e-3)),
        _ => bail!("unknown RTT {name:?} (short or long)"),
    }
}

/// Each direction gets half the RTT as delay and σ/√2 normal jitter (the RTT is
/// then the sum of two independent delays with the paper's mean and standard
/// deviation), **without reordering**: a frame is never released before the one
/// offered before it, as on a real path whose delay varies by queueing. (With
/// independent per-frame jitter and reordering allowed, the packets of one burst
/// would arrive shuffled; QUIC's 3-packet loss threshold then declares most of
/// them lost, which no real 0.3 ms path does.) The cost: at high packet rates the
/// monotonic release skews the delay upward from the nominal mean.
pub fn link_settings(rtt_mean: f64, rtt_sd: f64, loss_pct: f64) -> DirSettings {
    DirSettings {
        delay_ns: (rtt_mean / 2.0 * 1e9) as u64,
        jitter_ns: (rtt_sd / std::f64::consts::SQRT_2 * 1e9) as u64,
        jitter_dist: JitterDist::Normal,
        reorder: false,
        loss: if loss_pct > 0.0 {
            LossModel::Bernoulli {
                p: loss_pct / 100.0,
            }
        } else {
            LossModel::None
        },
        ..DirSettings::default()
    }
}

/// Default messages per direction for a rate (short RTT).
pub fn default_messages(rate: f64, quick: bool) -> u64 {
    match (quick, rate) {
        (true, r) if r <= 10.0 => 20,
        (true, _) => 400,
        (false, r) if r <= 10.0 => 100,
        (false, r) if r <= 1000.0 => 5000,
        (false, r) if r <= 10_000.0 => 20_000,
        (false, _) => 50_000,
    }
}

/// Default messages per direction for a rate and RTT. Over the long RTT with loss
/// the path, not the rate, sets the pace (TCP's loss-limited throughput over
/// 150 ms and 5 % loss is some 50 kB/s), so the counts are capped there to keep a
/// full run within the hour; the achieved rate is reported.
pub fn default_messages_for(rate: f64, rtt: &str, quick: bool) -> u64 {
    let n = default_messages(rate, quick);
    match (quick, rtt) {
        (false, "long") if rate <= 1000.0 => n.min(2000),
        (false, "long") => n.min(5000),
        _ => n,
    }
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    s.split(',')
        .map(|x| x.trim().parse().map_err(|e| anyhow::anyhow!("{x:?}: {e}")))
        .collect()
}

/// The schedules of one cell.
pub fn schedules(rate: f64, messages: u64, seed: u64) -> BTreeMap<(Dir, u8), Schedule> {
    let mut m = BTreeMap::new();
    for (i, d) in Dir::BOTH.into_iter().enumerate() {
        for (j, (svc, size)) in [
            (Service::OpenFlow, OPENFLOW_SIZE),
            (Service::Ovsdb, OVSDB_SIZE),
        ]
        .into_iter()
        .enumerate()
        {
            let n = messages / 2 + if j == 0 { messages % 2 } else { 0 };
            m.insert(
                (d, key(svc)),
                Schedule::poisson(n, rate / 2.0, vec![size], seed * 4 + (i * 2 + j) as u64),
            );
        }
    }
    m
}

/// Model prediction for one direction: transmission overhead of `d`'s data plus
/// the ACKs for the other direction's data (the paper's ACK model), with buffering
/// delay `t_b`.
fn model_overhead(
    t: BenchTransport,
    sched: &BTreeMap<(Dir, u8), Schedule>,
    d: Dir,
    t_b: f64,
) -> Option<f64> {
    let h = Headers::TABLE1;
    let agents = |d: Dir| -> Vec<Vec<(f64, u64)>> {
        sched
            .iter()
            .filter(|((sd, _), _)| *sd == d)
            .map(|(_, s)| {
                s.at.iter()
                    .enumerate()
                    .map(|(i, a)| (a.as_secs_f64(), s.size(i) as u64))
                    .collect()
            })
            .collect()
    };
    let other = if d == Dir::SwToCtl {
        Dir::CtlToSw
    } else {
        Dir::SwToCtl
    };
    match t {
        BenchTransport::Tcp | BenchTransport::Tls => {
            let mine = model::predict_tcp(&h, &agents(d), 0.0);
            let theirs = model::predict_tcp(&h, &agents(other), 0.0);
            Some(mine.transmission as f64 + theirs.ack_bytes)
        }
        BenchTransport::Quic
        | BenchTransport::QuicRr16
        | BenchTransport::QuicTuned
        | BenchTransport::QuicOld => {
            let mine = model::predict_quic(&h, &agents(d), t_b);
            let theirs = model::predict_quic(&h, &agents(other), t_b);
            Some(mine.transmission as f64 + theirs.ack_bytes)
        }
        // The paper's model covers TCP and QUIC only.
        BenchTransport::Kcptun | BenchTransport::UdpSeed | BenchTransport::UdpRobust => None,
    }
}

/// One row per direction.
pub fn rows(
    t: BenchTransport,
    rtt: &str,
    loss: f64,
    rate: f64,
    sched: &BTreeMap<(Dir, u8), Schedule>,
    r: &CellResult,
    t_b: f64,
) -> Vec<Vec<String>> {
    Dir::BOTH
        .into_iter()
        .map(|d| {
            let w = r.wire(d);
            let payload = r.payload(d);
            let (lb, _) = model::lower_bound(&Headers::TABLE1, payload);
            vec![
                t.as_str().into(),
                rtt.into(),
                format!("{loss}"),
                format!("{rate}"),
                d.name().into(),
                r.messages(d).to_string(),
                format!("{:.1}", r.achieved_rate(d)),
                r.delivered(d).to_string(),
                payload.to_string(),
                w.frames.to_string(),
                w.wire_bytes.to_string(),
                (w.wire_bytes as i64 - payload as i64).to_string(),
                w.ack_only.to_string(),
                w.lost.to_string(),
                lb.to_string(),
                model_overhead(t, sched, d, t_b)
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_default(),
            ]
        })
        .collect()
}

/// The coalescing window (s) the agents use, for the model: `--coalesce`
/// (the agents' default unless given; `off` is 0).
pub fn coalesce_window(agent_args: &[String]) -> f64 {
    use quicsdn_lanes::coalesce::DEFAULT_WINDOW;
    let window = match agent_args
        .iter()
        .rev()
        .find_map(|a| a.strip_prefix("--coalesce="))
    {
        None => DEFAULT_WINDOW,
        Some("off") => Duration::ZERO,
        Some(v) => crate::control_link::parse_duration(v).unwrap_or(Duration::ZERO),
    };
    window.as_secs_f64()
}

pub fn run(args: OverheadArgs) -> Result<()> {
    let transports = parse_transports(&args.transports)?;
    let rates: Vec<f64> = list(args.rates.as_deref().unwrap_or(if args.quick {
        "10,1000"
    } else {
        "10,1000,10000,100000"
    }))?;
    let losses: Vec<f64> =
        list(
            args.losses
                .as_deref()
                .unwrap_or(if args.quick { "1" } else { "1,5" }),
        )?;
    let rtts: Vec<String> =
        list(
            args.rtts
                .as_deref()
                .unwrap_or(if args.quick { "short" } else { "short,long" }),
        )?;
    std::fs::create_dir_all(&args.out)?;
    let mut csv = Csv::new(HEADER);
    let started = Instant::now();
    let loss_seed = args
        .seed
        .unwrap_or_else(crate::emulator::rng::Xoshiro256pp::entropy_seed);
    println!("loss seed {loss_seed} (--seed {loss_seed} repeats this run's loss draws)");
    let mut seed = 1u64;
    for rtt in &rtts {
        let (mean, sd) = rtt_setting(rtt)?;
        for &loss in &losses {
            for &rate in &rates {
                if rtt == "long"
                    && args.rates.is_none()
                    && !args.quick
                    && rate > args.long_rates.unwrap_or(10_000.0)
                {
                    continue;
                }
                let n = args
                    .messages
                    .unwrap_or(default_messages_for(rate, rtt, args.quick));
                let sched = schedules(rate, n, seed);
                // The same draws for every transport of the cell: their loss
                // counts then differ by how many packets each sent, not by luck.
                let link_seed = loss_seed ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                seed += 1;
                for &t in &transports {
                    let span = sched
                        .values()
                        .map(|s| s.at.last().copied().unwrap_or_default())
                        .max()
                        .unwrap_or_default();
                    let spec = CellSpec {
                        prefix: args.prefix.clone(),
                        transport: t,
                        link_seed: Some(link_seed),
                        link: link_settings(mean, sd, loss),
                        schedules: sched.clone(),
                        settle: Duration::from_secs_f64(0.3 + 3.0 * mean),
                        timeout: span * 3 + Duration::from_secs_f64(120.0 + 400.0 * mean),
                        agent_args: if t.is_quic() {
                            args.agent_args.clone()
                        } else {
                            Vec::new()
                        },
                        dir: std::env::temp_dir().join(format!("{}-{}", args.prefix, t)),
                    };
                    let t0 = Instant::now();
                    let r = cell::run(&spec)
                        .with_context(|| format!("{rtt} RTT, {loss}% loss, {rate} msg/s, {t}"))?;
                    let rows = rows(
                        t,
                        rtt,
                        loss,
                        rate,
                        &sched,
                        &r,
                        if t.is_quic() {
                            coalesce_window(
                                &t.agent_args()
                                    .into_iter()
                                    .chain(args.agent_args.iter().cloned())
                                    .collect::<Vec<_>>(),
                            )
                        } else {
                            0.0
                        },
                    );
                    let ovh: i64 = rows.iter().map(|r| r[11].parse::<i64>().unwrap_or(0)).sum();
                    println!(
                        "{rtt:>5} RTT, {loss}% loss, {rate:>6} msg/s, {t:<9}: {n} msgs/dir, achieved {:.0}/{:.0} msg/s, overhead {} ({:.1} s)",
                        r.achieved_rate(Dir::SwToCtl),
                        r.achieved_rate(Dir::CtlToSw),
                        out::bytes(ovh as f64),
                        t0.elapsed().as_secs_f64()
                    );
                    for row in rows {
                        csv.push(row);
                    }
                }
            }
        }
    }
    let path = args.out.join("overhead.csv");
    csv.write(&path)?;
    let plots = if args.no_plots {
        Vec::new()
    } else {
        out::plot("overhead", &args.out)?
    };
    let md = summary(&csv, &args, loss_seed, started.elapsed(), &plots)?;
    std::fs::write(args.out.join("overhead.md"), md)?;
    println!("wrote {}", args.out.display());
    Ok(())
}

/// Sums both directions of one cell: (overhead, wire, payload, frames, ack-only, lower bound).
pub fn cell_totals(csv: &Csv) -> BTreeMap<(String, String, String, String), [f64; 7]> {
    let c = |n| csv.col(n);
    let mut m: BTreeMap<(String, String, String, String), [f64; 7]> = BTreeMap::new();
    for r in &csv.rows {
        let k = (
            r[c("rtt")].clone(),
            r[c("loss_pct")].clone(),
            r[c("rate")].clone(),
            r[c("transport")].clone(),
        );
        let e = m.entry(k).or_default();
        let v = |n| r[c(n)].parse::<f64>().unwrap_or(0.0);
        e[0] += v("overhead_bytes");
        e[1] += v("wire_bytes");
        e[2] += v("payload_bytes");
        e[3] += v("frames");
        e[4] += v("ack_only_frames");
        e[5] += v("lower_bound_overhead");
        e[6] += v("model_overhead");
    }
    m
}

/// The paper's headline numbers (journal §5.1): the largest reductions.
pub const PAPER_MAX_REDUCTION: [(&str, f64); 2] = [("short", 82.0), ("long", 80.0)];

fn summary(
    csv: &Csv,
    args: &OverheadArgs,
    loss_seed: u64,
    took: Duration,
    plots: &[PathBuf],
) -> Result<String> {
    let totals = cell_totals(csv);
    let mut s = String::from("# Control-traffic overhead (journal Figs. 8–9)\n\n");
    s += &out::provenance();
    s += &format!("- run time: {:.0} s\n", took.as_secs_f64());
    s += &format!(
        "- loss seed: {loss_seed} (`--seed {loss_seed}` repeats the loss draws; every transport of a cell meets the same draws)\n"
    );
    s += &format!(
        "- workload per cell: in each direction, half OpenFlow ({OPENFLOW_SIZE} B messages) and half OVSDB ({OVSDB_SIZE} B), independent Poisson processes; messages per direction: {}\n",
        describe_counts(csv)
    );
    s += "- bytes: wire = IP packet + 28 B/frame (the paper's Table 1 `H_EP`), both directions summed; overhead = wire − application payload; ACK-only = TCP segments without data (exact) or UDP datagrams ≤ 64 B (heuristic for encrypted QUIC/KCP; see docs/benchmarks.md)\n";
    s += "- lower bound: the payload in MTU-full packets with Table 1's smallest headers (UDP + 2 B QUIC short header + 1 B frame header), no ACK-only packets\n";
    if !args.agent_args.is_empty() {
        s += &format!(
            "- quicsdn agent arguments: `{}`\n",
            args.agent_args.join(" ")
        );
    }
    s += "\nThe paper gives its per-cell values only as bar charts; its text states the largest reductions: 82 % (short RTT) and 80 % (long RTT) less overhead than TCP (quicSDN-2s). `vs tcp` is the change in overhead bytes against `tcp` in the same cell.\n\n";
    let transports: Vec<String> = {
        let mut v: Vec<String> = Vec::new();
        for r in &csv.rows {
            let t = r[csv.col("transport")].clone();
            if !v.contains(&t) {
                v.push(t);
            }
        }
        v
    };
    let mut cells: Vec<(String, String, String)> = totals
        .keys()
        .map(|(a, b, c, _)| (a.clone(), b.clone(), c.clone()))
        .collect();
    cells.dedup();
    cells.sort_by(|a, b| {
        (
            a.0.clone(),
            a.1.parse::<f64>().unwrap_or(0.0),
            a.2.parse::<f64>().unwrap_or(0.0),
        )
            .partial_cmp(&(
                b.0.clone(),
                b.1.parse::<f64>().unwrap_or(0.0),
                b.2.parse::<f64>().unwrap_or(0.0),
            ))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut header = vec!["RTT", "loss", "rate"];
    let names: Vec<String> = transports
        .iter()
        .map(|t| format!("{t} overhead (vs tcp)"))
        .collect();
    header.extend(names.iter().map(String::as_str));
    header.push("quic / lower bound");
    header.push("paper's best");
    let mut rows = Vec::new();
    for (rtt, loss, rate) in &cells {
        let get = |t: &str| totals.get(&(rtt.clone(), loss.clone(), rate.clone(), t.to_string()));
        let tcp = get("tcp").map(|v| v[0]);
        let mut row = vec![rtt.clone(), format!("{loss} %"), rate.clone()];
        for t in &transports {
            row.push(match (get(t), tcp) {
                (Some(v), Some(base)) if t != "tcp" => {
                    format!("{} ({})", out::bytes(v[0]), out::pct_change(v[0], base))
                }
                (Some(v), _) => out::bytes(v[0]),
                _ => "-".into(),
            });
        }
        row.push(
            get("quic")
                .filter(|v| v[5] > 0.0)
                .map(|v| format!("{:.2}× (wire {:.2}×)", v[0] / v[5], v[1] / (v[2] + v[5])))
                .unwrap_or_else(|| "-".into()),
        );
        row.push(
            PAPER_MAX_REDUCTION
                .iter()
                .find(|(r, _)| r == rtt)
                .map(|(_, p)| format!("up to −{p:.0}%"))
                .unwrap_or_default(),
        );
        rows.push(row);
    }
    s += &md_table(&header, &rows);
    s += "\nPackets and ACK-only packets (both directions):\n\n";
    let mut header = vec!["RTT", "loss", "rate"];
    let names: Vec<String> = transports
        .iter()
        .map(|t| format!("{t} packets / ACK-only"))
        .collect();
    header.extend(names.iter().map(String::as_str));
    let mut rows = Vec::new();
    for (rtt, loss, rate) in &cells {
        let mut row = vec![rtt.clone(), format!("{loss} %"), rate.clone()];
        for t in &transports {
            row.push(
                totals
                    .get(&(rtt.clone(), loss.clone(), rate.clone(), t.clone()))
                    .map(|v| format!("{:.0} / {:.0}", v[3], v[4]))
                    .unwrap_or_else(|| "-".into()),
            );
        }
        rows.push(row);
    }
    s += &md_table(&header, &rows);
    s += "\nPer-direction numbers (wire, payload, overhead, packets, ACK-only, achieved rate, model prediction) are in `overhead.csv`.\n";
    s += &out::image_links(plots);
    Ok(s)
}

fn describe_counts(csv: &Csv) -> String {
    let mut seen: Vec<(String, String)> = Vec::new();
    for r in &csv.rows {
        let p = (r[csv.col("rate")].clone(), r[csv.col("messages")].clone());
        if !seen.contains(&p) {
            seen.push(p);
        }
    }
    seen.iter()
        .map(|(r, n)| format!("{n} at {r} msg/s"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads an overhead CSV (schema-checked).
pub fn read(dir: &Path) -> Result<Csv> {
    Csv::read(&dir.join("overhead.csv"), HEADER)
}
