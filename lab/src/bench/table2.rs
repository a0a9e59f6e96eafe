//! `quicsdn-lab bench table2`: the paper "Modifying Southbound Communication
//! Protocol in SDN: TCP to UDP for Ryu–OVS", Table 2, reproduced and extended.
//!
//! The paper measured on localhost, 50 samples each: the echo round trip, the
//! FLOW_MOD latency and the stats-request latency, TCP against its UDP
//! transport. Here each transport gets a fresh one-switch lab with a real Open
//! vSwitch, and a benchmark controller (in the controller namespace) measures,
//! one at a time:
//!
//! * **echo RTT**: ECHO_REQUEST until OVS's ECHO_REPLY;
//! * **FLOW_MOD latency**: a FLOW_MOD (add) and a BARRIER_REQUEST until the
//!   BARRIER_REPLY, i.e. until OVS confirms the flow is installed;
//! * **stats latency**: a flow-stats MULTIPART_REQUEST until the last reply part.
//!
//! on an unimpaired control link, then with 1 % and 5 % random loss and with
//! 50 ms delay each way (the paper's future work). A sample that gets no answer
//! within [`SAMPLE_TIMEOUT`] counts as lost (only `udp-seed` may lose
//! messages). For `udp-*` the agents' per-channel counters (datagrams given up,
//! out of order, duplicates, retransmissions) are read from their logs after
//! the OpenFlow connection is closed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::bench::out::{self, Csv, md_table};
use crate::bench::pair::{BenchTransport, parse_transports};
use crate::bench::stats;
use crate::bench::table1::{
    self, OFPT_BARRIER_REQUEST, OFPT_ECHO_REQUEST, OfConn, OfEvent, flow_mod_add,
    flow_stats_request, header,
};
use crate::control_link::Impairment;
use crate::state::LabState;
use crate::topology;

/// A sample without its answer after this long is lost (udp-seed gives up 4 s
/// after the first transmission; 50 ms paths add little).
pub const SAMPLE_TIMEOUT: Duration = Duration::from_secs(6);

pub const HEADER: &[&str] = &[
    "condition",
    "transport",
    "metric",
    "samples",
    "answered",
    "lost",
    "mean_ms",
    "sd_ms",
    "median_ms",
    "p95_ms",
    "max_ms",
];

pub const COUNTERS_HEADER: &[&str] = &[
    "condition",
    "transport",
    "agent",
    "service",
    "sent",
    "packets",
    "retransmits",
    "given_up",
    "received",
    "duplicates",
    "out_of_order",
];

/// The paper's Table 2 (localhost): metric, TCP mean, UDP mean, TCP sd, UDP sd (ms).
pub const PAPER: [(&str, f64, f64, f64, f64); 3] = [
    ("echo RTT", 7.53, 8.21, 3.82, 6.36),
    ("FLOW_MOD", 13.19, 13.34, 1.53, 1.20),
    ("stats", 4.47, 5.07, 1.68, 1.36),
];

pub const METRICS: [&str; 3] = ["echo RTT", "FLOW_MOD", "stats"];

#[derive(clap::Args, Debug, Clone)]
pub struct Table2Args {
    /// Output directory.
    #[arg(long, default_value = "bench-results/table2")]
    pub out: PathBuf,
    /// 10 samples per metric and only the unimpaired and 5 % conditions (for tests).
    #[arg(long)]
    pub quick: bool,
    /// Transports, comma-separated.
    #[arg(long, default_value = "tcp,quic,udp-seed,udp-robust")]
    pub transports: String,
    /// Samples per metric.
    #[arg(long)]
    pub samples: Option<usize>,
    /// Only these conditions, comma-separated: unimpaired, 1%, 5%, 50ms.
    #[arg(long)]
    pub conditions: Option<String>,
    /// Name prefix of the labs (at most 10 characters).
    #[arg(long, default_value = "qsdnbench")]
    pub prefix: String,
    /// Extra option for both quicsdn agents of the QUIC transports
    /// (repeatable), e.g. `--agent-arg=--coalesce=off`.
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
}

/// A control-link condition.
#[derive(Debug, Clone, Copy)]
pub struct Condition {
    pub name: &'static str,
    pub loss_percent: f64,
    pub delay_ms: u64,
}

pub const CONDITIONS: [Condition; 4] = [
    Condition {
        name: "unimpaired",
        loss_percent: 0.0,
        delay_ms: 0,
    },
    Condition {
        name: "1% loss",
        loss_percent: 1.0,
        delay_ms: 0,
    },
    Condition {
        name: "5% loss",
        loss_percent: 5.0,
        delay_ms: 0,
    },
    Condition {
        name: "50 ms delay",
        loss_percent: 0.0,
        delay_ms: 50,
    },
];

fn conditions(quick: bool, only: Option<&str>) -> Result<Vec<Condition>> {
    if let Some(only) = only {
        return only
            .split(',')
            .map(|c| {
                let c = c.trim();
                CONDITIONS
                    .iter()
                    .find(|k| k.name.replace(' ', "").starts_with(c))
                    .copied()
                    .ok_or_else(|| {
                        anyhow::anyhow!("unknown condition {c:?} (unimpaired, 1%, 5%, 50ms)")
                    })
            })
            .collect();
    }
    Ok(if quick {
        vec![CONDITIONS[0], CONDITIONS[2]]
    } else {
        CONDITIONS.to_vec()
    })
}

/// Latencies of one metric (ms), and how many samples went unanswered.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    pub ms: Vec<f64>,
    pub lost: usize,
}

fn stats(v: &[f64]) -> (f64, f64, f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let s = stats::sorted(v);
    (
        mean,
        sd,
        stats::quantile(&s, 0.5),
        stats::quantile(&s, 0.95),
        s[s.len() - 1],
    )
}

/// Waits for an event matching `want` until `deadline`; `Ok(false)` if none came.
fn wait_for(
    of: &OfConn,
    deadline: Instant,
    mut want: impl FnMut(&OfEvent) -> bool,
) -> Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        match of.events.recv_timeout(left) {
            Ok(OfEvent::Closed(e)) => bail!("the OpenFlow connection closed: {e}"),
            Ok(OfEvent::Error(e)) => bail!("OpenFlow error from the switch: {e}"),
            Ok(ev) if want(&ev) => return Ok(true),
            Ok(_) => {}
            Err(_) => return Ok(false),
        }
    }
}

/// Measures one sample of `metric`; `None` when unanswered.
fn sample(of: &mut OfConn, metric: &str, i: usize) -> Result<Option<f64>> {
    let x = of.next_xid();
    let t0 = Instant::now();
    let deadline = t0 + SAMPLE_TIMEOUT;
    let ok = match metric {
        "echo RTT" => {
            of.send(&header(OFPT_ECHO_REQUEST, 8, x))?;
            wait_for(of, deadline, |e| matches!(e, OfEvent::Echo(r) if *r == x))?
        }
        "FLOW_MOD" => {
            let y = of.next_xid();
            let mut m = flow_mod_add(i as u32, x);
            m.extend_from_slice(&header(OFPT_BARRIER_REQUEST, 8, y));
            of.send(&m)?;
            wait_for(
                of,
                deadline,
                |e| matches!(e, OfEvent::Barrier(r) if *r == y),
            )?
        }
        "stats" => {
            of.send(&flow_stats_request(x))?;
            wait_for(
                of,
                deadline,
                |e| matches!(e, OfEvent::FlowStats(r, _, more) if *r == x && !more),
            )?
        }
        m => bail!("unknown metric {m}"),
    };
    Ok(ok.then(|| t0.elapsed().as_secs_f64() * 1e3))
}

/// Runs `n` samples of each metric, one at a time.
pub(crate) fn measure(of: &mut OfConn, n: usize) -> Result<Vec<(&'static str, Samples)>> {
    let mut out = Vec::new();
    for metric in METRICS {
        let mut s = Samples::default();
        for i in 0..n {
            match sample(of, metric, i)? {
                Some(ms) => s.ms.push(ms),
                None => s.lost += 1,
            }
            // Replies to a lost sample's request that arrive late are skipped by
            // xid; a short pause keeps samples independent of each other.
            std::thread::sleep(Duration::from_millis(20));
        }
        out.push((metric, s));
    }
    Ok(out)
}

/// One agent's per-channel counters, from its log's "udp channel counters" lines.
pub fn read_counters(log: &Path) -> Vec<(String, Vec<u64>)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // The counter columns: COUNTERS_HEADER after condition, transport, agent, service.
    let keys = &COUNTERS_HEADER[4..];
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.contains("udp channel counters")) {
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|t| t.strip_prefix(&format!("{k}=")))
                .map(|v| v.trim_matches('"').to_string())
        };
        let service = field("service").unwrap_or_default();
        let v = keys
            .iter()
            .map(|k| field(k).and_then(|x| x.parse().ok()).unwrap_or(0))
            .collect();
        rows.push((service, v));
    }
    rows
}

fn agent_logs(state: &LabState) -> Vec<(&'static str, PathBuf)> {
    let mut v = vec![(
        "controller agent",
        state.dir.join("ctl").join("quicsdn-controller.log"),
    )];
    if let Some(ovs) = &state.switches[0].ovs {
        v.push(("switch agent", ovs.dir.join("quicsdn-switch.log")));
    }
    v
}

/// Keeps a failed attempt's agent and OVS logs in `OUT/failed/`.
fn keep_logs(state: &LabState, out: &Path, cond: Condition, t: BenchTransport, attempt: u32) {
    let dir = out.join("failed").join(format!(
        "{}-{t}-{attempt}",
        cond.name.replace([' ', '%'], "")
    ));
    let _ = std::fs::create_dir_all(&dir);
    let mut logs = agent_logs(state);
    if let Some(ovs) = &state.switches[0].ovs {
        logs.push(("ovs-vswitchd", ovs.dir.join("ovs-vswitchd.log")));
    }
    for (_, l) in logs {
        if let Some(name) = l.file_name() {
            let _ = std::fs::copy(&l, dir.join(name));
        }
    }
}

pub fn run(args: Table2Args) -> Result<()> {
    let transports = parse_transports(&args.transports)?;
    let n = args.samples.unwrap_or(if args.quick { 10 } else { 50 });
    std::fs::create_dir_all(&args.out)?;
    let mut csv = Csv::new(HEADER);
    let mut counters = Csv::new(COUNTERS_HEADER);
    let started = Instant::now();
    let mut notes = Vec::new();
    for cond in conditions(args.quick, args.conditions.as_deref())? {
        for &t in &transports {
            let mut cfg = table1::lab_config(&args.prefix, t, &args.agent_args);
            cfg.settings.impairment = Impairment {
                delay: (cond.delay_ms > 0).then(|| Duration::from_millis(cond.delay_ms)),
                loss_percent: (cond.loss_percent > 0.0).then_some(cond.loss_percent),
                ..Impairment::default()
            };
            // Under loss the benchmark controller's connection to OVS can fail to
            // come up in time (OVS's own backoff); one more attempt on a fresh lab,
            // recorded in the summary.
            for attempt in 1..=2 {
                let _ = topology::down(&cfg.run_dir, &cfg.prefix);
                println!("== {}, {t}: bringing up a one-switch lab", cond.name);
                let state = topology::up(&cfg)?.state;
                let (mut c1, mut c2) = (Csv::new(HEADER), Csv::new(COUNTERS_HEADER));
                let r = run_one(&state, t, cond, n, &mut c1, &mut c2);
                if r.is_err() {
                    keep_logs(&state, &args.out, cond, t, attempt);
                }
                topology::down(&cfg.run_dir, &cfg.prefix)?;
                match r {
                    Ok(()) => {
                        csv.rows.extend(c1.rows);
                        counters.rows.extend(c2.rows);
                        break;
                    }
                    Err(e) if attempt == 1 => {
                        println!("   attempt failed ({e:#}); once more");
                        notes.push(format!("{}, {t}: the first attempt failed ({e:#}) and was repeated on a fresh lab", cond.name));
                    }
                    Err(e) => return Err(e.context(format!("{}, {t}", cond.name))),
                }
            }
        }
    }
    csv.write(&args.out.join("table2.csv"))?;
    counters.write(&args.out.join("table2-udp-counters.csv"))?;
    std::fs::write(
        args.out.join("table2.md"),
        summary(
            &csv,
            &counters,
            n,
            started.elapsed(),
            &notes,
            &args.agent_args,
        ),
    )?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn run_one(
    state: &LabState,
    t: BenchTransport,
    cond: Condition,
    n: usize,
    csv: &mut Csv,
    counters: &mut Csv,
) -> Result<()> {
    let (mut of, db) = table1::connect(state)?;
    let results = measure(&mut of, n)?;
    for (metric, s) in &results {
        let (mean, sd, med, p95, max) = stats(&s.ms);
        println!(
            "{:<12} {t:<10} {metric:<9} mean {mean:7.2} ms  sd {sd:7.2}  median {med:7.2}  p95 {p95:7.2}  lost {}",
            cond.name, s.lost
        );
        csv.push(vec![
            cond.name.into(),
            t.as_str().into(),
            (*metric).into(),
            n.to_string(),
            s.ms.len().to_string(),
            s.lost.to_string(),
            format!("{mean:.3}"),
            format!("{sd:.3}"),
            format!("{med:.3}"),
            format!("{p95:.3}"),
            format!("{max:.3}"),
        ]);
    }
    if t.is_udp() {
        // Closing the benchmark controller's connections ends the sessions; each
        // agent then logs its channels' counters.
        let logs = agent_logs(state);
        let count = |l: &Path, what: &str| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .lines()
                .filter(|x| x.contains(what))
                .count()
        };
        // The sessions open now. OVS reconnects at once and opens more, which
        // stay open: waiting for those too only ran into the timeout.
        let opened: Vec<usize> = logs
            .iter()
            .map(|(_, l)| count(l, "session opened"))
            .collect();
        of.wr.lock().expect("writer").shutdown();
        drop(db);
        drop(of);
        let logged = crate::wait::poll_until(
            "the agents to log their UDP counters",
            Duration::from_secs(15),
            || {
                Ok(logs
                    .iter()
                    .zip(&opened)
                    .all(|((_, l), &n)| {
                        let c = count(l, "udp channel counters");
                        c >= n && c > 0
                    })
                    .then_some(()))
            },
        );
        if let Err(e) = logged {
            // The counters then cover only the sessions that ended.
            println!("  warning: {e:#}");
        }
        for (agent, log) in logs {
            // Summed over the agent's sessions of each service (OVS's earlier,
            // refused connections included).
            let mut sums: Vec<(String, Vec<u64>)> = Vec::new();
            for (service, v) in read_counters(&log) {
                match sums.iter_mut().find(|(s, _)| *s == service) {
                    Some((_, acc)) => acc.iter_mut().zip(&v).for_each(|(a, b)| *a += b),
                    None => sums.push((service, v)),
                }
            }
            for (service, v) in sums {
                let mut row = vec![
                    cond.name.to_string(),
                    t.as_str().to_string(),
                    agent.to_string(),
                    service,
                ];
                row.extend(v.iter().map(u64::to_string));
                counters.push(row);
            }
        }
    }
    Ok(())
}

fn summary(
    csv: &Csv,
    counters: &Csv,
    n: usize,
    took: Duration,
    notes: &[String],
    agent_args: &[String],
) -> String {
    let c = |k: &str| csv.col(k);
    let mut s = String::from(
        "# TCP vs UDP latency (paper `openflow-over-udp-ryu-ovs`, Table 2), extended\n\n",
    );
    s += &out::provenance();
    s += &format!(
        "- run time: {:.0} s; {n} samples per metric, one at a time\n",
        took.as_secs_f64()
    );
    s += "- one real Open vSwitch 3.1 (userspace datapath) per transport and condition, a benchmark controller speaking OpenFlow 1.3; echo RTT = ECHO_REQUEST → ECHO_REPLY, FLOW_MOD = FLOW_MOD + BARRIER_REQUEST → BARRIER_REPLY, stats = flow-stats request → last reply part\n";
    s += &format!(
        "- loss and delay apply to both directions of the control link; a sample unanswered after {} s counts as lost\n",
        SAMPLE_TIMEOUT.as_secs()
    );
    if !agent_args.is_empty() {
        s += &format!(
            "- extra options of both agents of the QUIC transports: `{}`\n",
            agent_args.join(" ")
        );
    }
    s += "- `udp-seed` is the paper's mechanism (fixed 1 s RTO, 3 retransmits then the message is dropped, unordered); `udp-robust` adds RFC 6298 RTO, ordering, congestion control and fragmentation; neither authenticates or encrypts\n\n";
    s += "## The paper (localhost, Ryu ↔ OVS)\n\n";
    let rows: Vec<Vec<String>> = PAPER
        .iter()
        .map(|(m, tm, um, ts, us)| {
            vec![
                m.to_string(),
                format!("{tm:.2} ± {ts:.2}"),
                format!("{um:.2} ± {us:.2}"),
            ]
        })
        .collect();
    s += &md_table(
        &["metric", "TCP ms (mean ± sd)", "UDP ms (mean ± sd)"],
        &rows,
    );
    let mut conds: Vec<String> = Vec::new();
    let mut transports: Vec<String> = Vec::new();
    for r in &csv.rows {
        if !conds.contains(&r[c("condition")]) {
            conds.push(r[c("condition")].clone());
        }
        if !transports.contains(&r[c("transport")]) {
            transports.push(r[c("transport")].clone());
        }
    }
    for cond in &conds {
        s += &format!("\n## {cond}\n\n");
        let mut header = vec!["metric".to_string()];
        header.extend(
            transports
                .iter()
                .map(|t| format!("{t} ms (mean ± sd; median; lost)")),
        );
        let mut rows = Vec::new();
        for m in METRICS {
            let mut row = vec![m.to_string()];
            for t in &transports {
                row.push(
                    match csv.rows.iter().find(|r| {
                        &r[c("condition")] == cond && &r[c("transport")] == t && r[c("metric")] == m
                    }) {
                        Some(r) => format!(
                            "{} ± {}; {}; {}",
                            r[c("mean_ms")],
                            r[c("sd_ms")],
                            r[c("median_ms")],
                            r[c("lost")]
                        ),
                        None => "-".into(),
                    },
                );
            }
            rows.push(row);
        }
        let h: Vec<&str> = header.iter().map(String::as_str).collect();
        s += &md_table(&h, &rows);
    }
    if !counters.rows.is_empty() {
        s += "\n## UDP reliability counters (OpenFlow channel, per agent)\n\n";
        s += "Summed over each agent's sessions of the service. Seed's residual loss is a message whose 4 transmissions are all lost, p⁴ per message: at 5 % loss 6 × 10⁻⁶, so none is expected among a few hundred messages; its cost shows in the latency instead (a lost message waits the fixed 1 s).\n\n";
        s += "`given_up`: messages the sender stopped retransmitting (seed: after 3 retransmits; a given-up message may still have arrived if only its acknowledgements were lost). `out_of_order`: datagrams that arrived after one sent later (seed delivers them as they come; robust holds them back until the gap is filled). `duplicates`: datagrams that arrived again and were dropped.\n\n";
        let k = |x: &str| counters.col(x);
        let rows: Vec<Vec<String>> = counters
            .rows
            .iter()
            .filter(|r| r[k("service")] == "openflow")
            .map(|r| {
                [
                    "condition",
                    "transport",
                    "agent",
                    "sent",
                    "retransmits",
                    "given_up",
                    "received",
                    "duplicates",
                    "out_of_order",
                ]
                .iter()
                .map(|x| r[k(x)].clone())
                .collect()
            })
            .collect();
        s += &md_table(
            &[
                "condition",
                "transport",
                "agent",
                "messages sent",
                "retransmits",
                "given up",
                "datagrams received",
                "duplicates",
                "out of order",
            ],
            &rows,
        );
    }
    for n in notes {
        s += &format!("\n- note: {n}\n");
    }
    s += "\nAll samples' statistics are in `table2.csv`, the agents' counters (all services) in `table2-udp-counters.csv`.\n";
    s
}

/// Reads a Table 2 CSV (schema-checked).
pub fn read(dir: &Path) -> Result<(Csv, Csv)> {
    Ok((
        Csv::read(&dir.join("table2.csv"), HEADER)?,
        Csv::read(&dir.join("table2-udp-counters.csv"), COUNTERS_HEADER)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_of_samples() {
        let (mean, sd, med, p95, max) = stats(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!((mean, med, max), (3.0, 3.0, 5.0));
        assert!((sd - 1.5811).abs() < 1e-3);
        assert_eq!(p95, 5.0);
        assert!(stats(&[]).0.is_nan());
    }

    #[test]
    fn counters_are_read_from_agent_log_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        std::fs::write(&log, "2026 INFO udp channel counters switch=sw1 service=openflow channel=1 sent=150 packets=160 retransmits=9 given_up=1 received=151 duplicates=2 out_of_order=3 srtt_ms=1.2\nother line\n").unwrap();
        let r = read_counters(&log);
        assert_eq!(
            r,
            vec![("openflow".to_string(), vec![150, 160, 9, 1, 151, 2, 3])]
        );
    }
}
