//! `quicsdn-lab bench tuning`: what each of the agents' overhead settings buys
//! and costs. For each setting of `quicsdn` (both agents), in the same run:
//!
//! * overhead: the overhead bench's workload at 1k and 10k msg/s each way,
//!   short RTT, 1 % loss, against `tcp` in the same cells;
//! * delay: the delay bench's ⟨400, 600⟩ bursts at RTT 0 and at RTT 100 ms, 1 % loss.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::bench::cell::{self, CellSpec, Dir, key};
use crate::bench::delay::quantile;
use crate::bench::out::{self, Csv, md_table};
use crate::bench::overhead::{link_settings, rtt_setting, schedules};
use crate::bench::pair::{BenchTransport, OLD_DEFAULT_ARGS};
use crate::bench::synth::{Schedule, Service};
use crate::emulator::{DirSettings, LossModel};

pub const HEADER: &[&str] = &[
    "setting",
    "overhead_1k",
    "tcp_overhead_1k",
    "overhead_10k",
    "tcp_overhead_10k",
    "delay_rtt0_median_ms",
    "delay_rtt0_p90_ms",
    "delay_rtt0_max_ms",
    "delay_rtt100_median_ms",
    "delay_rtt100_p90_ms",
    "delay_rtt100_max_ms",
    // Appended after the first reference runs, so their files still read.
    "delay_rtt0_p99_ms",
    "delay_rtt100_p99_ms",
];

/// (name, agent arguments). The first two are the defaults and the defaults
/// before issue 13 ([`OLD_DEFAULT_ARGS`]), so the trade stays visible; the
/// others change one default at a time.
pub fn settings(quick: bool) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut v = vec![
        ("defaults", vec![]),
        ("old defaults (before issue 13)", OLD_DEFAULT_ARGS.to_vec()),
        // The ACK delay before `--ack-delay auto` (only the RTT 100 ms delay
        // cell differs: on a short RTT both ask for 25 ms).
        ("defaults, ACK delay 25 ms (peer)", vec!["--ack-delay=peer"]),
        ("defaults, coalescing off", vec!["--coalesce=off"]),
        ("defaults, coalesce 2ms", vec!["--coalesce=2ms"]),
        ("defaults, coalesce 5ms", vec!["--coalesce=5ms"]),
        ("defaults, coalesce 20ms", vec!["--coalesce=20ms"]),
        ("defaults, ACK frequency off", vec!["--ack-threshold=off"]),
        (
            "defaults + zero-length CIDs (switch)",
            vec!["--zero-length-cid"],
        ),
        ("defaults, 8-byte CIDs", vec!["--cid-len=8"]),
    ];
    if quick {
        v.truncate(2);
    }
    v
}

#[derive(clap::Args, Debug, Clone)]
pub struct TuningArgs {
    /// Where the CSV and markdown go.
    #[arg(long, default_value = "bench-results/tuning")]
    pub out: PathBuf,
    /// CI size: two settings, few messages.
    #[arg(long)]
    pub quick: bool,
    /// Name prefix of the bench's namespaces (at most 12 characters).
    #[arg(long, default_value = "qsdnbench")]
    pub prefix: String,
}

fn overhead_cell(
    args: &TuningArgs,
    t: BenchTransport,
    a: &[String],
    rate: f64,
    n: u64,
) -> Result<u64> {
    let (mean, sd) = rtt_setting("short")?;
    let r = cell::run(&CellSpec {
        prefix: args.prefix.clone(),
        transport: t,
        link_seed: None,
        link: link_settings(mean, sd, 1.0),
        schedules: schedules(rate, n, 7),
        settle: Duration::from_millis(300),
        timeout: Duration::from_secs(120),
        agent_args: a.to_vec(),
        dir: std::env::temp_dir().join(format!("{}-{t}", args.prefix)),
    })?;
    Ok(Dir::BOTH
        .iter()
        .map(|&d| r.wire(d).wire_bytes - r.payload(d))
        .sum())
}

fn delay_cell(args: &TuningArgs, a: &[String], rtt_ms: u64, reps: u64) -> Result<Vec<f64>> {
    let gap = Duration::from_millis(100 + 2 * rtt_ms);
    let mut schedules = BTreeMap::new();
    schedules.insert(
        (Dir::CtlToSw, key(Service::OpenFlow)),
        Schedule::bursts(reps, 10, gap, vec![400, 600]),
    );
    let r = cell::run(&CellSpec {
        prefix: args.prefix.clone(),
        transport: BenchTransport::Quic,
        link_seed: None,
        link: DirSettings {
            delay_ns: rtt_ms * 500_000,
            loss: LossModel::Bernoulli { p: 0.01 },
            ..DirSettings::default()
        },
        schedules,
        settle: Duration::from_millis(100),
        timeout: gap * reps as u32 + Duration::from_secs(60),
        agent_args: a.to_vec(),
        dir: std::env::temp_dir().join(format!("{}-quic", args.prefix)),
    })?;
    let mut d: Vec<f64> = r.flows[&(Dir::CtlToSw, key(Service::OpenFlow))]
        .received
        .iter()
        .map(|m| (m.recv_ns as f64 - m.sent_ns as f64) / 1e6)
        .collect();
    d.sort_by(f64::total_cmp);
    Ok(d)
}

pub fn run(args: TuningArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let started = Instant::now();
    let (n1, n10, reps) = if args.quick {
        (200, 400, 3)
    } else {
        (4000, 20000, 30)
    };
    let mut csv = Csv::new(HEADER);
    for (name, a) in settings(args.quick) {
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        let q1 = overhead_cell(&args, BenchTransport::Quic, &a, 1000.0, n1)?;
        let t1 = overhead_cell(&args, BenchTransport::Tcp, &[], 1000.0, n1)?;
        let q10 = overhead_cell(&args, BenchTransport::Quic, &a, 10000.0, n10)?;
        let t10 = overhead_cell(&args, BenchTransport::Tcp, &[], 10000.0, n10)?;
        let d0 = delay_cell(&args, &a, 0, reps)?;
        let d100 = delay_cell(&args, &a, 100, reps)?;
        println!(
            "{name:<42} overhead vs tcp {} (1k), {} (10k); delay p50/p90/p99 {:.2}/{:.2}/{:.2} ms (RTT 0), {:.1}/{:.1}/{:.1} ms (RTT 100)",
            out::pct_change(q1 as f64, t1 as f64),
            out::pct_change(q10 as f64, t10 as f64),
            quantile(&d0, 0.5),
            quantile(&d0, 0.9),
            quantile(&d0, 0.99),
            quantile(&d100, 0.5),
            quantile(&d100, 0.9),
            quantile(&d100, 0.99)
        );
        let f = |x: f64| format!("{x:.3}");
        csv.push(vec![
            name.replace(',', ";"),
            q1.to_string(),
            t1.to_string(),
            q10.to_string(),
            t10.to_string(),
            f(quantile(&d0, 0.5)),
            f(quantile(&d0, 0.9)),
            f(*d0.last().unwrap_or(&f64::NAN)),
            f(quantile(&d100, 0.5)),
            f(quantile(&d100, 0.9)),
            f(*d100.last().unwrap_or(&f64::NAN)),
            f(quantile(&d0, 0.99)),
            f(quantile(&d100, 0.99)),
        ]);
    }
    csv.write(&args.out.join("tuning.csv"))?;
    let mut s = String::from("# Tuning the agents: overhead against delay\n\n");
    s += &out::provenance();
    s += &format!("- run time: {:.0} s\n", started.elapsed().as_secs_f64());
    s += &format!(
        "- overhead: the overhead bench's workload (128 B OpenFlow + 384 B OVSDB, Poisson) each way, short RTT, 1 % loss; {n1} messages per direction at 1k msg/s, {n10} at 10k; `quic` with the setting against `tcp` in the same run (both directions)\n- delay: controller → switch OpenFlow bursts of 10 messages ⟨400, 600⟩, {reps} repetitions, 1 % loss\n- settings are `quicsdn` options of both agents (`--zero-length-cid` on the switch agent only); `defaults` are the agents' defaults, `old defaults` those before issue 13 (`{}`)\n\n",
        OLD_DEFAULT_ARGS.join(" ")
    );
    let rows: Vec<Vec<String>> = csv
        .rows
        .iter()
        .map(|r| {
            let v = |i: usize| r[i].parse::<f64>().unwrap_or(f64::NAN);
            vec![
                r[0].clone(),
                format!("{} ({})", out::bytes(v(1)), out::pct_change(v(1), v(2))),
                format!("{} ({})", out::bytes(v(3)), out::pct_change(v(3), v(4))),
                format!("{:.2} / {:.2} / {:.2} / {:.2}", v(5), v(6), v(11), v(7)),
                format!("{:.1} / {:.1} / {:.1} / {:.1}", v(8), v(9), v(12), v(10)),
            ]
        })
        .collect();
    s += &md_table(
        &[
            "setting",
            "overhead 1k msg/s (vs tcp)",
            "overhead 10k msg/s (vs tcp)",
            "delay RTT 0: p50 / p90 / p99 / max ms",
            "delay RTT 100 ms: p50 / p90 / p99 / max ms",
        ],
        &rows,
    );
    std::fs::write(args.out.join("tuning.md"), s)?;
    println!("wrote {}", args.out.display());
    Ok(())
}
