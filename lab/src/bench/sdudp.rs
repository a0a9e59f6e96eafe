//! `quicsdn-lab bench sdudp`: the SDUDP paper's evaluation (§IV), SDUDP
//! against TCP over the same line of real Open vSwitch switches.
//!
//! Every configuration is a fresh `quicsdn-lab up --topology line` (with or
//! without `--sdudp`); host A (first switch) sends a file set over one real
//! TCP connection to a server on host B (last switch), which answers the byte
//! count and the sha256 of every file it read (folded, [`crate::fileset`]);
//! the sender checks both. Both hosts' sockets use `--tcp-congestion`
//! (CUBIC by default, the paper's Linux default; this kernel's is BBR). The
//! loads are the emulated links' own counters between the switches (both directions, every frame offered to a link), not
//! estimates:
//!
//! * `load` — Figs. 7–8: bytes and frames per switch (the mean over the
//!   inter-switch links), 5–13 switches, 20 ms, loss 0–1 %, file sets A–E;
//!   and Table 2: host-to-host loss, computed `1-(1-p)^(links)` and measured
//!   (the product of the links' measured delivery rates, host A to host B);
//! * `delay` — Fig. 9: 1 ms against 20 ms per link, 9 switches;
//! * `accumulation` — Fig. 10: SDUDP frames with and without accumulation,
//!   and TCP's, 5 switches;
//! * `engines` — §IV-E: retransmission engines on all, odd, or 1,5,9 of 9
//!   switches, file set D, 1 % loss;
//! * `time` — Fig. 11: the time to send file sets A and C at 10 Mbit/s per
//!   link, 9 switches, 1 and 20 ms, 1 % loss;
//! * `proxy` — not in the paper: the same 9-switch, 20 ms, 10 Mbit/s line
//!   carried by TCP, by SDUDP and by the QUIC proxy (`quicsdn proxy` client
//!   on host A, server on host B: QUIC end to end, one connection between
//!   the hosts; the sender and the server connect to it on loopback), loss 0
//!   and 1 %, file sets A and D;
//! * `throughput` — not in the default `--kinds`: one connection of
//!   1,000 KB files through 5 switches, at 10 Mbit/s per link and without a
//!   limit, the three carriers.
//!
//! Configurations shared by several experiments run once. Results: `runs.csv`
//! (one row per run), `cells.csv` (mean and 95 % confidence interval per
//! cell), `summary.md` (each experiment beside the paper and issue 15's
//! targets, met or missed).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::out::{self, Csv, md_table};
use crate::bench::relay::AgentProcess;
use crate::emulator::control::Accounting;
use crate::emulator::sys::in_netns;
use crate::fileset::{self, FileSetHasher};
use crate::state::{HostRecord, LabState, SdudpSettings, Topology};
use crate::topology::{self, LabConfig};
use std::os::fd::AsRawFd;

/// The paper's file sets: name, file size (bytes); each run carries
/// `--total-kb` (3,000 KB as the paper) in files of that size.
pub const SETS: [(&str, usize); 5] = [
    ("A", 500),
    ("B", 1_000),
    ("C", 10_000),
    ("D", 100_000),
    ("E", 1_000_000),
];

/// Experiments; `throughput` (the issue's target, not a paper figure) is not
/// in the default `--kinds`.
pub const KINDS: [&str; 7] = [
    "load",
    "delay",
    "accumulation",
    "engines",
    "time",
    "proxy",
    "throughput",
];

/// The server on host B listens here (inside host B's namespace); with the
/// QUIC proxy, the proxy client listens on the same port on host A's loopback.
const SERVER_PORT: u16 = 8080;

/// The QUIC proxy server's UDP port on host B.
const PROXY_UDP_PORT: u16 = 4433;

pub const RUNS_HEADER: &[&str] = &[
    "transport",
    "switches",
    "delay_ms",
    "loss_percent",
    "rate_mbit",
    "engines",
    "accumulate",
    "set",
    "rep",
    "files",
    "file_bytes",
    "delivered_exact",
    "seconds",
    "link_frames",
    "link_bytes",
    "frames_per_switch",
    "bytes_per_switch",
    "lost_frames",
    "h2h_loss_computed",
    "h2h_loss_measured",
    "engine_retransmitted",
];

pub const CELLS_HEADER: &[&str] = &[
    "transport",
    "switches",
    "delay_ms",
    "loss_percent",
    "rate_mbit",
    "engines",
    "accumulate",
    "set",
    "reps",
    "all_exact",
    "frames_per_switch",
    "frames_ci95",
    "bytes_per_switch",
    "bytes_ci95",
    "seconds",
    "seconds_ci95",
    "h2h_loss_computed",
    "h2h_loss_measured",
    "engine_retransmitted",
];

#[derive(clap::Args, Debug, Clone)]
pub struct SdudpBenchArgs {
    /// Output directory.
    #[arg(long, default_value = "bench-results/sdudp")]
    pub out: PathBuf,
    /// One small cell of each experiment (5 switches, 1 % loss, 300 KB per run).
    #[arg(long)]
    pub quick: bool,
    /// Experiments, comma-separated: load, delay, accumulation, engines, time
    /// (the paper's), proxy (TCP, SDUDP and the QUIC proxy on one line),
    /// throughput (one bulk connection through 5 switches at 10 Mbit/s and
    /// without a rate limit, against TCP and the QUIC proxy).
    #[arg(long, default_value = "load,delay,accumulation,engines,time,proxy")]
    pub kinds: String,
    /// Repetitions per cell (the paper: 10).
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// Only these line lengths (load), comma-separated.
    #[arg(long)]
    pub switches: Option<String>,
    /// Only these loss rates per link (%), comma-separated.
    #[arg(long)]
    pub loss: Option<String>,
    /// Only these file sets, comma-separated (A–E).
    #[arg(long)]
    pub sets: Option<String>,
    /// Only these link delays (ms), comma-separated.
    #[arg(long)]
    pub delays: Option<String>,
    /// Bytes per run (KB); the paper: 3,000.
    #[arg(long)]
    pub total_kb: Option<usize>,
    /// Only these carriers, comma-separated (default: every carrier an
    /// experiment uses), e.g. a long SDUDP transfer without waiting for TCP
    /// CUBIC at 1 % loss.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub carriers: Vec<Carrier>,
    /// Name prefix of the labs (at most 10 characters).
    #[arg(long, default_value = "sdudpb")]
    pub prefix: String,
    /// TCP congestion control of the hosts' sockets (the paper's: CUBIC).
    #[arg(long, default_value = "cubic")]
    pub tcp_congestion: String,
    /// Host A's pause between files, in µs, with TCP_NODELAY: each file leaves
    /// as its own segment, as the paper's sender sent a packet per file (0:
    /// files back to back, which the hosts' TCP already packs into full
    /// segments; see docs/sdudp.md, accumulation).
    #[arg(long, default_value_t = 0)]
    pub file_gap_us: u64,
    /// Measure nothing: rewrite cells.csv and summary.md from OUT/runs.csv
    /// (e.g. of a grid that was stopped part way).
    #[arg(long)]
    pub summarize: bool,
    /// Keep OUT/runs.csv and run only the repetitions each cell lacks: a
    /// stopped grid goes on where it stopped, and a finished one gets more
    /// repetitions (`--reps` is the total per cell). Needs the same
    /// `--total-kb`.
    #[arg(long, conflicts_with = "summarize")]
    pub resume: bool,
}

/// What carries host A's files across the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, clap::ValueEnum)]
pub enum Carrier {
    /// The hosts' own TCP, switch to switch.
    Tcp,
    /// SDUDP: TCP ends at the edge engines, UDP with hop-by-hop engines between.
    Sdudp,
    /// `quicsdn proxy` on both hosts with its defaults: the hosts' TCP ends on
    /// loopback, one QUIC connection (bbr-lt) crosses the line end to end.
    QuicProxy,
}

impl Carrier {
    pub fn as_str(self) -> &'static str {
        match self {
            Carrier::Tcp => "tcp",
            Carrier::Sdudp => "sdudp",
            Carrier::QuicProxy => "quic-proxy",
        }
    }
}

/// One lab configuration.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
pub struct Config {
    pub carrier: Carrier,
    pub switches: u32,
    pub delay_ms: u64,
    pub loss_percent: f64,
    pub rate_mbit: u64,
    /// `all`, `odd` or a list (`1;5;9` in the CSV).
    pub engines: String,
    pub accumulate: bool,
}

impl Config {
    fn tcp(switches: u32, delay_ms: u64, loss_percent: f64) -> Config {
        Config {
            carrier: Carrier::Tcp,
            switches,
            delay_ms,
            loss_percent,
            rate_mbit: 0,
            engines: "-".into(),
            accumulate: false,
        }
    }
    fn sdudp(switches: u32, delay_ms: u64, loss_percent: f64) -> Config {
        Config {
            carrier: Carrier::Sdudp,
            engines: "all".into(),
            accumulate: true,
            ..Config::tcp(switches, delay_ms, loss_percent)
        }
    }
    fn quic_proxy(switches: u32, delay_ms: u64, loss_percent: f64) -> Config {
        Config {
            carrier: Carrier::QuicProxy,
            ..Config::tcp(switches, delay_ms, loss_percent)
        }
    }
    fn key(&self) -> Vec<String> {
        vec![
            self.carrier.as_str().into(),
            self.switches.to_string(),
            self.delay_ms.to_string(),
            self.loss_percent.to_string(),
            self.rate_mbit.to_string(),
            self.engines.replace(',', ";"),
            self.accumulate.to_string(),
        ]
    }
    fn lab(&self, prefix: &str) -> Result<LabConfig> {
        let mut cfg = LabConfig::new(prefix);
        let s = &mut cfg.settings;
        s.switches = self.switches;
        s.hosts_per_switch = 1;
        s.topology = Topology::Line;
        s.link.delay = (self.delay_ms > 0).then(|| Duration::from_millis(self.delay_ms));
        s.link.loss_percent = (self.loss_percent > 0.0).then_some(self.loss_percent);
        s.link.rate_bps = (self.rate_mbit > 0).then_some(self.rate_mbit * 1_000_000);
        if self.carrier == Carrier::Sdudp {
            s.sdudp = Some(SdudpSettings {
                engines: SdudpSettings::parse_engines(&self.engines, self.switches)?,
                accumulate: self.accumulate,
            });
        }
        Ok(cfg)
    }
}

fn list<T: std::str::FromStr + Clone>(
    s: &Option<String>,
    default: &[T],
    what: &str,
) -> Result<Vec<T>> {
    match s {
        None => Ok(default.to_vec()),
        Some(s) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .trim_end_matches('%')
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--{what}: {x:?} is not a valid value"))
            })
            .collect(),
    }
}

/// The grid: every configuration with the file sets it runs.
pub fn grid(a: &SdudpBenchArgs) -> Result<Vec<(Config, Vec<&'static str>)>> {
    let kinds: Vec<&str> = a.kinds.split(',').map(str::trim).collect();
    if let Some(k) = kinds.iter().find(|k| !KINDS.contains(k)) {
        bail!(
            "--kinds: unknown experiment {k:?} (one of {})",
            KINDS.join(", ")
        );
    }
    let all_sets: Vec<&'static str> = SETS.iter().map(|s| s.0).collect();
    let sets: Vec<&'static str> = match &a.sets {
        None => all_sets.clone(),
        Some(s) => s
            .split(',')
            .map(|x| {
                all_sets
                    .iter()
                    .copied()
                    .find(|n| n.eq_ignore_ascii_case(x.trim()))
                    .ok_or_else(|| anyhow::anyhow!("--sets: unknown file set {x:?} (A–E)"))
            })
            .collect::<Result<_>>()?,
    };
    let pick = |want: &[&'static str]| -> Vec<&'static str> {
        want.iter().copied().filter(|s| sets.contains(s)).collect()
    };
    let (switches, losses, delays): (Vec<u32>, Vec<f64>, Vec<u64>) = if a.quick {
        (vec![5], vec![1.0], vec![1, 20])
    } else {
        (
            list(&a.switches, &[5, 7, 9, 11, 13], "switches")?,
            list(&a.loss, &[0.0, 0.25, 0.5, 0.75, 1.0], "loss")?,
            list(&a.delays, &[1, 20], "delays")?,
        )
    };
    if let Some(n) = switches.iter().find(|n| !(5..=13).contains(*n)) {
        bail!("--switches: {n} is outside 5–13");
    }
    let mut g: Vec<(Config, Vec<&'static str>)> = Vec::new();
    let quick = a.quick;
    let mut add = |mut c: Config, s: Vec<&'static str>| {
        if s.is_empty() {
            return;
        }
        // Quick: every line at 10 Mbit/s, so that the time cell shares the
        // load cell's lines (five labs in all).
        if quick {
            c.rate_mbit = 10;
        }
        match g.iter_mut().find(|(x, _)| *x == c) {
            Some((_, have)) => {
                for x in s {
                    if !have.contains(&x) {
                        have.push(x);
                    }
                }
                have.sort();
            }
            None => g.push((c, s)),
        }
    };
    // Quick: the 5-switch, 1 ms, 1 % line stands in for every experiment's
    // line; each experiment adds its own variable.
    let (n9, n5) = if a.quick { (5, 5) } else { (9, 5) };
    for k in &kinds {
        match *k {
            "load" => {
                let d = if a.quick { 1 } else { 20 };
                for &n in &switches {
                    for &p in &losses {
                        let s = if a.quick { pick(&["A"]) } else { sets.clone() };
                        add(Config::tcp(n, d, p), s.clone());
                        add(Config::sdudp(n, d, p), s);
                    }
                }
            }
            "delay" => {
                for &d in &delays {
                    for &p in &losses {
                        let s = if a.quick { pick(&["A"]) } else { sets.clone() };
                        add(Config::sdudp(n9, d, p), s.clone());
                        if !a.quick {
                            add(Config::tcp(n9, d, p), s);
                        }
                    }
                }
            }
            "accumulation" => {
                for &p in &losses {
                    let s = if a.quick { pick(&["A"]) } else { sets.clone() };
                    add(Config::sdudp(n5, 1, p), s.clone());
                    add(
                        Config {
                            accumulate: false,
                            ..Config::sdudp(n5, 1, p)
                        },
                        s.clone(),
                    );
                    // Fig. 10's third bar: TCP on the same line.
                    add(Config::tcp(n5, 1, p), s);
                }
            }
            "engines" => {
                let specs: &[&str] = if a.quick {
                    &["all", "odd"]
                } else {
                    &["all", "odd", "1,5,9"]
                };
                for e in specs {
                    add(
                        Config {
                            engines: (*e).into(),
                            ..Config::sdudp(n9, 1, 1.0)
                        },
                        pick(&["D"]),
                    );
                }
            }
            "time" => {
                let ds: &[u64] = if a.quick { &[1] } else { &delays };
                for &d in ds {
                    let s = pick(if a.quick { &["A"] } else { &["A", "C"] });
                    for mut c in [Config::tcp(n9, d, 1.0), Config::sdudp(n9, d, 1.0)] {
                        c.rate_mbit = 10;
                        add(c, s.clone());
                    }
                }
            }
            "proxy" => {
                // Fig. 11's line, loss 0 and 1 % unless --loss says otherwise.
                let ps = match (&a.loss, a.quick) {
                    (_, true) | (Some(_), false) => losses.clone(),
                    (None, false) => vec![0.0, 1.0],
                };
                let d = if a.quick { 1 } else { 20 };
                for &p in &ps {
                    let s = pick(if a.quick { &["A"] } else { &["A", "D"] });
                    for mut c in [
                        Config::tcp(n9, d, p),
                        Config::sdudp(n9, d, p),
                        Config::quic_proxy(n9, d, p),
                    ] {
                        c.rate_mbit = 10;
                        add(c, s.clone());
                    }
                }
            }
            "throughput" => {
                // One connection of 1000 KB files through 5 switches with
                // engines, at 10 Mbit/s per link and without a limit; TCP
                // and the QUIC proxy on the same lines.
                for &d in &delays {
                    for &p in &losses {
                        for rate in [10, 0] {
                            for mut c in [
                                Config::tcp(n5, d, p),
                                Config::sdudp(n5, d, p),
                                Config::quic_proxy(n5, d, p),
                            ] {
                                c.rate_mbit = rate;
                                add(c, pick(&["E"]));
                            }
                        }
                    }
                }
            }
            _ => unreachable!(),
        }
    }
    if !a.carriers.is_empty() {
        g.retain(|(c, _)| a.carriers.contains(&c.carrier));
        if g.is_empty() {
            let want: Vec<&str> = a.carriers.iter().map(|c| c.as_str()).collect();
            bail!(
                "--carriers: none of the experiments in --kinds {} uses {}",
                a.kinds,
                want.join(",")
            );
        }
    }
    Ok(g)
}

/// Host B's server for one connection: reads to EOF, answers the length and
/// hash. Returns once listening; the thread ends after the connection or
/// `deadline`.
fn serve_one(
    netns: &str,
    deadline: Duration,
    file_size: usize,
    cc: &str,
) -> Result<std::thread::JoinHandle<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let ns = netns.to_string();
    let cc = cc.to_string();
    let h = std::thread::spawn(move || {
        let r = (|| -> std::io::Result<TcpListener> {
            crate::emulator::sys::enter_netns(&ns)?;
            let l = TcpListener::bind(("0.0.0.0", SERVER_PORT))?;
            l.set_nonblocking(true)?;
            crate::bench::proxy::set_tcp_congestion(l.as_raw_fd(), &cc)
                .map_err(std::io::Error::other)?;
            Ok(l)
        })();
        let l = match r {
            Ok(l) => {
                let _ = tx.send(Ok(()));
                l
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            match l.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(deadline));
                    let mut h = FileSetHasher::new(file_size);
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) => {
                                let _ = s.write_all(&h.finish());
                                return;
                            }
                            Ok(n) => h.update(&buf[..n]),
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => return,
                        }
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    rx.recv()
        .context("server thread")?
        .with_context(|| format!("server in {netns}"))?;
    Ok(h)
}

/// Host A's sender: `count` files of `size` bytes written one by one on one
/// connection; true if host B's answer matches what was sent.
fn send_set(
    dst: &str,
    count: usize,
    size: usize,
    seed: u8,
    timeout: Duration,
    cc: &str,
    gap: Duration,
) -> Result<bool> {
    let addr = format!("{dst}:{SERVER_PORT}").parse()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).context("connect")?;
    // Before any data: the whole transfer runs under it.
    crate::bench::proxy::set_tcp_congestion(s.as_raw_fd(), cc)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    if !gap.is_zero() {
        s.set_nodelay(true)?;
    }
    let mut h = FileSetHasher::new(size);
    for f in 0..count {
        let file = fileset::file(seed, f, size);
        h.update(&file);
        s.write_all(&file).context("write")?;
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
    }
    s.shutdown(Shutdown::Write)?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).context("reading the answer")?;
    Ok(reply == h.finish())
}

/// Files of `size` bytes in a run of `total` bytes (at least one).
fn files_per_run(total: usize, size: usize) -> usize {
    (total / size).max(1)
}

/// Host A (on the first switch) and host B (on the last) of a line lab.
fn line_hosts(lab: &LabState) -> Result<(&HostRecord, &HostRecord)> {
    Ok((
        lab.hosts.first().context("no host")?,
        lab.hosts.last().context("no host")?,
    ))
}

/// One run's measurements.
struct Run {
    files: usize,
    file_bytes: usize,
    exact: bool,
    seconds: f64,
    frames: u64,
    bytes: u64,
    lost: u64,
    h2h_measured: f64,
    retransmitted: u64,
    /// Frames B → A on the links (acknowledgements: SDUDP's FEEDBACK, TCP's ACKs).
    reverse_frames: u64,
    /// The engines' FEEDBACK and PROBE messages (their counters).
    feedbacks: u64,
    probes: u64,
}

fn run_once(
    lab: &LabState,
    carrier: Carrier,
    set: &str,
    total: usize,
    rep: usize,
    a: &SdudpBenchArgs,
) -> Result<Run> {
    let size = SETS.iter().find(|s| s.0 == set).expect("set").1;
    let files = files_per_run(total, size);
    let (host_a, b) = line_hosts(lab)?;
    let links: Vec<_> = lab
        .data_links
        .iter()
        .map(|l| l.emulated.clone().context("a data link is not emulated"))
        .collect::<Result<_>>()?;
    let before: u64 = engine_retransmitted(lab);
    let (feedbacks_before, probes_before) = (
        engine_counter(lab, "feedbacks"),
        engine_counter(lab, "probes"),
    );
    for l in &links {
        l.control().reset_counters()?;
    }
    let timeout = Duration::from_secs(600);
    let server = serve_one(&b.netns, timeout, size, &a.tcp_congestion)?;
    let dst = match carrier {
        Carrier::QuicProxy => "127.0.0.1".to_string(),
        Carrier::Tcp | Carrier::Sdudp => b.ip.clone(),
    };
    let t = Instant::now();
    let cc = a.tcp_congestion.clone();
    let gap = Duration::from_micros(a.file_gap_us);
    let exact = in_netns(&host_a.netns, move || {
        send_set(&dst, files, size, 7 + rep as u8, timeout, &cc, gap)
    })??;
    let seconds = t.elapsed().as_secs_f64();
    let _ = server.join();
    // The last releases and acknowledgements settle before the counters are read.
    std::thread::sleep(Duration::from_millis(300));
    let (mut frames, mut bytes, mut lost, mut delivered) = (0, 0, 0, 1.0);
    let mut reverse_frames = 0;
    for l in &links {
        let r = l.control().show()?.report(&Accounting::default());
        reverse_frames += r.b_to_a.total.offered.frames;
        for d in [&r.a_to_b, &r.b_to_a] {
            frames += d.total.offered.frames;
            bytes += d.total.offered.bytes;
            lost += d.total.lost.frames;
        }
        let t = &r.a_to_b.total;
        if t.offered.frames > 0 {
            delivered *= 1.0 - t.lost.frames as f64 / t.offered.frames as f64;
        }
    }
    Ok(Run {
        files,
        file_bytes: size,
        exact,
        seconds,
        frames,
        bytes,
        lost,
        h2h_measured: 1.0 - delivered,
        retransmitted: engine_retransmitted(lab).saturating_sub(before),
        reverse_frames,
        feedbacks: engine_counter(lab, "feedbacks").saturating_sub(feedbacks_before),
        probes: engine_counter(lab, "probes").saturating_sub(probes_before),
    })
}

/// Before the first timed run of a lab: host A and host B resolve each
/// other's MAC (ARP crosses the lossy line, and a lost request or reply costs
/// Linux a 1 s retry), so no carrier's first run times ARP.
fn hosts_know_each_other(lab: &LabState) -> Result<()> {
    let (a, b) = line_hosts(lab)?;
    for (from, to) in [(a, b), (b, a)] {
        let ns = crate::netns::Netns::named(from.netns.clone());
        // Each attempt waits at most 1 s. At 1 % per link a round trip over
        // 13 switches is lost with 21 %, ten in a row with about 2e-7.
        let answered =
            (0..10).any(|_| crate::host::ping(&ns, &to.ip, 1, 0.2).is_ok_and(|s| s.all_replied()));
        if !answered {
            bail!(
                "{} does not answer {}'s ping across the line",
                to.name,
                from.name
            );
        }
    }
    Ok(())
}

/// The QUIC proxy pair on a line lab: the server on host B (forwarding to
/// host B's file server on loopback), the client on host A (listening on
/// host A's loopback), both with the proxy's defaults. Returns once a byte
/// has crossed the line through them, so the first run does not time the
/// QUIC handshake; the processes stop when dropped.
fn start_proxies(lab: &LabState, pki: &std::path::Path) -> Result<[AgentProcess; 2]> {
    let (host_a, b) = line_hosts(lab)?;
    let bin = crate::agents::quicsdn_binary()?;
    let tls = |name: &str| {
        [
            format!("--ca={}", pki.join("ca.crt").display()),
            format!("--cert={}", pki.join(format!("{name}.crt")).display()),
            format!("--key={}", pki.join(format!("{name}.key")).display()),
        ]
    };
    let mut server_args = vec![
        "proxy".to_string(),
        "server".into(),
        format!("--listen={}:{PROXY_UDP_PORT}", b.ip),
        format!("--forward=files=tcp:127.0.0.1:{SERVER_PORT}"),
    ];
    server_args.extend(tls("server"));
    let mut client_args = vec![
        "proxy".to_string(),
        "client".into(),
        format!("--server={}:{PROXY_UDP_PORT}", b.ip),
        "--server-name=server".into(),
        format!("--forward=files=ptcp:{SERVER_PORT}"),
    ];
    client_args.extend(tls("client"));
    let mut server =
        AgentProcess::spawn_in(Some(&b.netns), &bin, "proxy server", &server_args, None)?;
    let mut client = AgentProcess::spawn_in(
        Some(&host_a.netns),
        &bin,
        "proxy client",
        &client_args,
        None,
    )?;
    // Host B's end of the probe, bound where the file server will listen.
    let target = in_netns(&b.netns, || {
        let l = TcpListener::bind(("127.0.0.1", SERVER_PORT))?;
        l.set_nonblocking(true)?;
        std::io::Result::Ok(l)
    })??;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        server.check_alive()?;
        client.check_alive()?;
        // The proxy client resets a connection it cannot carry yet; try again.
        let sent = in_netns(&host_a.netns, || -> std::io::Result<()> {
            let mut s = TcpStream::connect(("127.0.0.1", SERVER_PORT))?;
            s.write_all(b"x")?;
            s.shutdown(Shutdown::Write)
        })?;
        if sent.is_ok() {
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                match target.accept() {
                    Ok((mut far, _)) => {
                        far.set_nonblocking(false)?;
                        far.set_read_timeout(Some(Duration::from_secs(10)))?;
                        let mut got = Vec::new();
                        if far.read_to_end(&mut got).is_ok() && got == b"x" {
                            return Ok([server, client]);
                        }
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if Instant::now() > deadline {
            bail!(
                "no byte crossed the line through the QUIC proxies in 30 s (host {} to host {})",
                host_a.ip,
                b.ip
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One of the engines' counters (their stats files), summed; the stats are
/// rewritten every second, so the last second's may be missing.
fn engine_counter(lab: &LabState, name: &str) -> u64 {
    lab.engines
        .iter()
        .filter_map(|e| std::fs::read(&e.stats).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter_map(|v| v["engine"][name].as_u64())
        .sum()
}

/// The engines' retransmissions so far (their stats files), summed.
fn engine_retransmitted(lab: &LabState) -> u64 {
    engine_counter(lab, "retransmitted")
}

/// Mean and 95 % confidence half-width (Student's t).
pub fn mean_ci(x: &[f64]) -> (f64, f64) {
    let n = x.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let m = x.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (m, 0.0);
    }
    let var = x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1) as f64;
    const T: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    let t = T.get(n - 2).copied().unwrap_or(1.96);
    (m, t * (var / n as f64).sqrt())
}

pub fn run(a: SdudpBenchArgs) -> Result<()> {
    if a.summarize {
        let runs = Csv::read(&a.out.join("runs.csv"), RUNS_HEADER)?;
        let total = runs.rows.first().map_or(0, |r| {
            r[9].parse::<usize>().unwrap_or(0) * r[10].parse::<usize>().unwrap_or(0)
        });
        let cells = aggregate(&runs);
        cells.write(&a.out.join("cells.csv"))?;
        write_summary(&a, summary(&cells, total, Duration::ZERO, &a))?;
        println!("wrote {}", a.out.display());
        return Ok(());
    }
    let g = grid(&a)?;
    let reps = if a.quick { 1 } else { a.reps.max(1) };
    let total = a.total_kb.unwrap_or(if a.quick { 300 } else { 3_000 }) * 1000;
    std::fs::create_dir_all(&a.out)?;
    // Certificates for the QUIC proxies, if a configuration uses them.
    let pki = tempfile::tempdir()?;
    if g.iter().any(|(c, _)| c.carrier == Carrier::QuicProxy) {
        use quicsdn_transport::pki::{self, Validity};
        pki::init_ca(pki.path(), "sdudp bench CA", Validity::days(30))?;
        for name in ["server", "client"] {
            pki::issue(pki.path(), name, &[], Validity::days(30))?;
        }
    }
    let runs_path = a.out.join("runs.csv");
    let mut runs = if a.resume && runs_path.exists() {
        let runs = Csv::read(&runs_path, RUNS_HEADER)?;
        let (files, bytes) = (runs.col("files"), runs.col("file_bytes"));
        if let Some(r) = runs.rows.iter().find(|r| {
            let size: usize = r[bytes].parse().unwrap_or(0);
            r[files].parse::<usize>().ok() != Some(files_per_run(total, size.max(1)))
        }) {
            bail!(
                "--resume: {} holds runs of another size ({} files of {} B); use the same --total-kb",
                runs_path.display(),
                r[files],
                r[bytes]
            );
        }
        println!(
            "resuming: {} runs in {}",
            runs.rows.len(),
            runs_path.display()
        );
        runs
    } else {
        Csv::new(RUNS_HEADER)
    };
    let started = Instant::now();
    let cells: usize = g.iter().map(|(_, s)| s.len()).sum();
    println!(
        "{} lab configurations, {cells} cells, {reps} repetitions, {} KB per run",
        g.len(),
        total / 1000
    );
    for (c, sets) in &g {
        let todo = remaining(&runs, c, sets, reps);
        if todo.is_empty() {
            println!("== {} (already measured)", c.key().join(" "));
            continue;
        }
        let cfg = c.lab(&a.prefix)?;
        let _ = topology::down(&cfg.run_dir, &cfg.prefix);
        println!("== {}", c.key().join(" "));
        let lab = topology::up(&cfg)
            .with_context(|| format!("lab up: {}", c.key().join(" ")))?
            .state;
        let r = (|| -> Result<()> {
            let computed = 1.0 - (1.0 - c.loss_percent / 100.0).powi(lab.data_links.len() as i32);
            hosts_know_each_other(&lab)?;
            let _proxies = match c.carrier {
                Carrier::QuicProxy => Some(start_proxies(&lab, pki.path())?),
                Carrier::Tcp | Carrier::Sdudp => None,
            };
            for &(set, done) in &todo {
                for rep in done..reps {
                    let r = run_once(&lab, c.carrier, set, total, rep, &a)
                        .with_context(|| format!("{} set {set} rep {rep}", c.key().join(" ")))?;
                    let links = lab.data_links.len().max(1) as f64;
                    println!(
                        "   set {set} rep {rep}: {} × {} B exact={} {:.2} s, {:.0} frames and {} per switch, {} lost, {} retransmitted; {:.0} frames B→A per switch, engines' feedbacks {} probes {}",
                        r.files,
                        r.file_bytes,
                        r.exact,
                        r.seconds,
                        r.frames as f64 / links,
                        out::bytes(r.bytes as f64 / links),
                        r.lost,
                        r.retransmitted,
                        r.reverse_frames as f64 / links,
                        r.feedbacks,
                        r.probes
                    );
                    let mut row = c.key();
                    row.extend([
                        set.to_string(),
                        rep.to_string(),
                        r.files.to_string(),
                        r.file_bytes.to_string(),
                        r.exact.to_string(),
                        format!("{:.3}", r.seconds),
                        r.frames.to_string(),
                        r.bytes.to_string(),
                        format!("{:.1}", r.frames as f64 / links),
                        format!("{:.1}", r.bytes as f64 / links),
                        r.lost.to_string(),
                        format!("{computed:.5}"),
                        format!("{:.5}", r.h2h_measured),
                        r.retransmitted.to_string(),
                    ]);
                    runs.push(row);
                }
            }
            Ok(())
        })();
        topology::down(&cfg.run_dir, &cfg.prefix)?;
        r?;
        // Written after every configuration: a long grid keeps what it measured.
        runs.write(&a.out.join("runs.csv"))?;
    }
    let cells = aggregate(&runs);
    cells.write(&a.out.join("cells.csv"))?;
    write_summary(&a, summary(&cells, total, started.elapsed(), &a))?;
    println!("wrote {}", a.out.display());
    if runs
        .rows
        .iter()
        .any(|r| r[runs.col("delivered_exact")] != "true")
    {
        bail!("a file set did not arrive byte-exact (runs.csv)");
    }
    Ok(())
}

/// The file sets of configuration `c` that `runs` holds fewer than `reps`
/// runs of, each with the number it holds (the first repetition to run).
fn remaining<'a>(runs: &Csv, c: &Config, sets: &[&'a str], reps: usize) -> Vec<(&'a str, usize)> {
    let key = c.key();
    let done = |set: &str| {
        runs.rows
            .iter()
            .filter(|r| r[..key.len()] == key[..] && r[key.len()] == set)
            .count()
    };
    sets.iter()
        .map(|s| (*s, done(s)))
        .filter(|&(_, d)| d < reps)
        .collect()
}

/// Writes `summary.md` with the figures' plots (`plots.py sdudp`, from
/// cells.csv) linked; a plot that fails is reported, the summary still written.
fn write_summary(a: &SdudpBenchArgs, mut summary: String) -> Result<()> {
    let plots = out::plot("sdudp", &a.out).unwrap_or_else(|e| {
        eprintln!("no plot: {e:#}");
        Vec::new()
    });
    summary += &out::image_links(&plots);
    std::fs::write(a.out.join("summary.md"), summary)?;
    Ok(())
}

/// Per cell (configuration × file set): means and 95 % intervals over the reps.
pub fn aggregate(runs: &Csv) -> Csv {
    let mut by: BTreeMap<Vec<String>, Vec<&Vec<String>>> = BTreeMap::new();
    for r in &runs.rows {
        by.entry(r[..8].to_vec()).or_default().push(r);
    }
    let mut cells = Csv::new(CELLS_HEADER);
    for (k, rs) in by {
        let col = |name: &str| -> Vec<f64> {
            let i = runs.col(name);
            rs.iter().filter_map(|r| r[i].parse().ok()).collect()
        };
        let (f, fci) = mean_ci(&col("frames_per_switch"));
        let (b, bci) = mean_ci(&col("bytes_per_switch"));
        let (s, sci) = mean_ci(&col("seconds"));
        let (hm, _) = mean_ci(&col("h2h_loss_measured"));
        let (rt, _) = mean_ci(&col("engine_retransmitted"));
        let exact = rs.iter().all(|r| r[runs.col("delivered_exact")] == "true");
        let mut row = k.clone();
        row.extend([
            rs.len().to_string(),
            exact.to_string(),
            format!("{f:.1}"),
            format!("{fci:.1}"),
            format!("{b:.1}"),
            format!("{bci:.1}"),
            format!("{s:.3}"),
            format!("{sci:.3}"),
            rs[0][runs.col("h2h_loss_computed")].clone(),
            format!("{hm:.5}"),
            format!("{rt:.1}"),
        ]);
        cells.push(row);
    }
    // Numbers in numeric order (5 switches before 11), as the figures read.
    let num = |r: &Vec<String>, i: usize| r[i].parse::<f64>().unwrap_or(f64::NAN);
    cells.rows.sort_by(|x, y| {
        (1..5)
            .fold(x[0].cmp(&y[0]), |o, i| {
                o.then(num(x, i).total_cmp(&num(y, i)))
            })
            .then(x[5..8].cmp(&y[5..8]))
    });
    cells
}

fn met(ok: bool) -> String {
    if ok {
        "met".into()
    } else {
        "**missed**".into()
    }
}

/// The summary: each experiment's table, SDUDP beside TCP and the targets.
pub fn summary(cells: &Csv, total: usize, took: Duration, a: &SdudpBenchArgs) -> String {
    let cc = &a.tcp_congestion;
    let gap = if a.file_gap_us == 0 {
        "back to back".to_string()
    } else {
        format!("with a {} µs pause after each, TCP_NODELAY", a.file_gap_us)
    };
    let c = |name: &str| cells.col(name);
    // From the cells: a resumed or merged grid's cells can hold different
    // numbers of runs.
    let held: Vec<usize> = cells
        .rows
        .iter()
        .filter_map(|r| r[c("reps")].parse().ok())
        .collect();
    let reps = match (held.iter().min(), held.iter().max()) {
        (Some(lo), Some(hi)) if lo != hi => {
            format!("{lo}–{hi} repetitions per cell (`reps` in cells.csv)")
        }
        (Some(n), _) => format!("{n} repetition(s) per cell"),
        _ => "no cells".to_string(),
    };
    let get = |r: &Vec<String>, name: &str| -> f64 { r[c(name)].parse().unwrap_or(f64::NAN) };
    let find = |pred: &dyn Fn(&Vec<String>) -> bool| cells.rows.iter().find(|r| pred(r));
    let same_line =
        |r: &Vec<String>, t: &str, x: &Vec<String>| x[0] == t && x[1..5] == r[1..5] && x[7] == r[7];
    let rate = |r: &Vec<String>| {
        if r[4] == "0" {
            "-".to_string()
        } else {
            format!("{} Mbit/s", r[4])
        }
    };
    // The first columns of a table of lines: which line and file set.
    const LINE: [&str; 5] = ["switches", "delay", "loss", "rate", "set"];
    let line = |r: &Vec<String>| -> Vec<String> {
        vec![
            r[1].clone(),
            format!("{} ms", r[2]),
            format!("{} %", r[3]),
            rate(r),
            r[7].clone(),
        ]
    };
    let mut s = format!(
        "# SDUDP against TCP over a line of real Open vSwitch switches (paper `sdudp`, §IV)\n\n\
         {reps}, {} KB per run; ± is the 95 % confidence half-width. \
         Loads are the emulated inter-switch links' counters (both directions, frames offered \
         to the link), averaged over the links (≈ per switch). The hosts' TCP: {cc} \
         (`--tcp-congestion`); host A writes its files {gap} (`--file-gap-us`). \
         Delivery: the receiver's sha256 of every file, checked by the sender. Took {:.0} s.\n\n{}\n",
        total / 1000,
        took.as_secs_f64(),
        out::provenance()
    );
    // Figs. 7–8 (and Fig. 9's lines): SDUDP (accumulating, all engines, no
    // rate limit) against TCP on the same line.
    s += "## Load per switch, SDUDP against TCP (Figs. 7–9)\n\nTarget: SDUDP below TCP in bytes and packets per switch in every cell.\n\n";
    let mut rows = Vec::new();
    for r in &cells.rows {
        if r[0] != "sdudp" || r[5] != "all" || r[6] != "true" {
            continue;
        }
        let Some(t) = find(&|x| same_line(r, "tcp", x)) else {
            continue;
        };
        let (fs, ft) = (get(r, "frames_per_switch"), get(t, "frames_per_switch"));
        let (bs, bt) = (get(r, "bytes_per_switch"), get(t, "bytes_per_switch"));
        let mut row = line(r);
        row.extend([
            format!("{fs:.0} ± {:.0}", get(r, "frames_ci95")),
            format!("{ft:.0} ± {:.0}", get(t, "frames_ci95")),
            out::pct_change(fs, ft),
            met(fs < ft),
            format!("{} ± {}", out::bytes(bs), out::bytes(get(r, "bytes_ci95"))),
            format!("{} ± {}", out::bytes(bt), out::bytes(get(t, "bytes_ci95"))),
            out::pct_change(bs, bt),
            met(bs < bt),
            format!("{}/{}", r[c("all_exact")], t[c("all_exact")]),
        ]);
        rows.push(row);
    }
    s += &md_table(
        &[
            &LINE[..],
            &[
                "SDUDP frames",
                "TCP frames",
                "Δ",
                "frames",
                "SDUDP bytes",
                "TCP bytes",
                "Δ",
                "bytes",
                "exact",
            ],
        ]
        .concat(),
        &rows,
    );
    // Table 2.
    s += "\n## Host-to-host loss (Table 2)\n\nComputed `1-(1-p)^links`; measured: the product of the links' measured delivery rates, host A → host B (SDUDP lines).\n\n";
    let mut rows = Vec::new();
    for r in cells
        .rows
        .iter()
        .filter(|r| r[0] == "sdudp" && r[5] == "all" && r[6] == "true" && r[7] == "A")
    {
        rows.push(vec![
            r[1].clone(),
            format!("{} ms", r[2]),
            format!("{} %", r[3]),
            format!("{:.2} %", get(r, "h2h_loss_computed") * 100.0),
            format!("{:.2} %", get(r, "h2h_loss_measured") * 100.0),
        ]);
    }
    s += &md_table(
        &["switches", "delay", "loss per link", "computed", "measured"],
        &rows,
    );
    // Fig. 10.
    s += "\n## Accumulation (Fig. 10)\n\nTarget: accumulation saves ≥ 20 % of packets for file set A (the paper: > 20 % for 0.5 KB, 11–14 % for larger).\n\n";
    let mut rows = Vec::new();
    for r in cells
        .rows
        .iter()
        .filter(|r| r[0] == "sdudp" && r[6] == "false")
    {
        let Some(on) =
            find(&|x| x[0] == "sdudp" && x[1..6] == r[1..6] && x[6] == "true" && x[7] == r[7])
        else {
            continue;
        };
        let (off, on) = (get(r, "frames_per_switch"), get(on, "frames_per_switch"));
        let saved = 1.0 - on / off;
        // The paper: SDUDP below TCP even without accumulation.
        let tcp = find(&|x| same_line(r, "tcp", x)).map(|t| get(t, "frames_per_switch"));
        rows.push(vec![
            r[1].clone(),
            format!("{} %", r[3]),
            r[7].clone(),
            format!("{off:.0} ± {:.0}", get(r, "frames_ci95")),
            format!("{on:.0}"),
            format!("{:.1} %", saved * 100.0),
            if r[7] == "A" {
                met(saved >= 0.20)
            } else {
                met(saved >= 0.11)
            },
            tcp.map_or("-".into(), |t| format!("{t:.0}")),
            tcp.map_or("-".into(), |t| met(off < t)),
        ]);
    }
    s += &md_table(
        &[
            "switches",
            "loss",
            "set",
            "frames without",
            "frames with",
            "saved",
            "target (A ≥ 20 %, others ≥ 11 %)",
            "TCP frames",
            "without < TCP",
        ],
        &rows,
    );
    // §IV-E.
    s += "\n## Engine subsets (§IV-E)\n\nThe paper: +1.1–1.3 % load with fewer engines.\n\n";
    let mut rows = Vec::new();
    for r in cells
        .rows
        .iter()
        .filter(|r| r[0] == "sdudp" && r[5] != "all")
    {
        let Some(all) =
            find(&|x| x[0] == "sdudp" && x[1..5] == r[1..5] && x[5] == "all" && x[6..8] == r[6..8])
        else {
            continue;
        };
        rows.push(vec![
            r[1].clone(),
            r[5].replace(';', ","),
            r[7].clone(),
            format!("{:.0}", get(all, "frames_per_switch")),
            format!("{:.0}", get(r, "frames_per_switch")),
            out::pct_change(get(r, "frames_per_switch"), get(all, "frames_per_switch")),
            out::pct_change(get(r, "bytes_per_switch"), get(all, "bytes_per_switch")),
            format!("{:.0}", get(r, "engine_retransmitted")),
        ]);
    }
    s += &md_table(
        &[
            "switches",
            "engines",
            "set",
            "frames (all)",
            "frames",
            "Δ frames",
            "Δ bytes",
            "retransmitted",
        ],
        &rows,
    );
    // Fig. 11.
    s += "\n## Time to send at 10 Mbit/s (Fig. 11)\n\nTarget: SDUDP ≤ 0.5× TCP at 20 ms and 1 % loss.\n\n";
    let mut rows = Vec::new();
    for r in cells.rows.iter().filter(|r| r[0] == "sdudp" && r[4] != "0") {
        let Some(t) = find(&|x| same_line(r, "tcp", x)) else {
            continue;
        };
        let (ts, tt) = (get(r, "seconds"), get(t, "seconds"));
        let target = if r[2] == "20" && r[3] == "1" {
            met(ts <= 0.5 * tt)
        } else {
            "-".into()
        };
        rows.push(vec![
            r[1].clone(),
            format!("{} ms", r[2]),
            format!("{} %", r[3]),
            r[7].clone(),
            format!("{ts:.2} ± {:.2} s", get(r, "seconds_ci95")),
            format!("{tt:.2} ± {:.2} s", get(t, "seconds_ci95")),
            format!("{:.2}", ts / tt),
            target,
        ]);
    }
    s += &md_table(
        &[
            "switches", "delay", "loss", "set", "SDUDP", "TCP", "ratio", "target",
        ],
        &rows,
    );
    // `--kinds proxy`: the three carriers on one line.
    s += "\n## SDUDP against TCP and the QUIC proxy (not in the paper)\n\nThe same line carried by the hosts' TCP, by SDUDP (all engines, accumulating) and by `quicsdn proxy` on the hosts with its defaults (one QUIC connection end to end, bbr-lt; made before the runs, so its handshake is not in the loads; its keepalives are). Loads per switch as above.\n\n";
    let mut rows = Vec::new();
    for q in cells.rows.iter().filter(|r| r[0] == "quic-proxy") {
        let t = find(&|x| same_line(q, "tcp", x));
        let u = find(&|x| same_line(q, "sdudp", x) && x[5] == "all" && x[6] == "true");
        // TCP / SDUDP / QUIC, "-" for a carrier not measured on this line.
        let three = |show: &dyn Fn(&Vec<String>) -> String| -> String {
            [t, u, Some(q)]
                .iter()
                .map(|x| x.map_or("-".into(), show))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let mut row = line(q);
        row.extend([
            three(&|x| format!("{:.1}", get(x, "seconds"))),
            three(&|x| format!("{:.0}", get(x, "frames_per_switch"))),
            three(&|x| out::bytes(get(x, "bytes_per_switch"))),
            three(&|x| x[c("all_exact")].clone()),
        ]);
        rows.push(row);
    }
    s += &md_table(
        &[
            &LINE[..],
            &[
                "time (s): TCP / SDUDP / QUIC",
                "frames per switch",
                "bytes per switch",
                "exact",
            ],
        ]
        .concat(),
        &rows,
    );
    // Throughput (`--kinds throughput`).
    s += "\n## Throughput of one connection (set E)\n\nTarget: SDUDP through 5 switches with engines ≥ 90 % of a 10 Mbit/s link; without a rate limit, the highest rate reached (CPU-bound on this machine: direction only).\n\n";
    let mut rows = Vec::new();
    for r in cells.rows.iter().filter(|r| {
        r[0] == "sdudp" && r[1] == "5" && r[5] == "all" && r[6] == "true" && r[7] == "E"
    }) {
        let mbit = |x: &Vec<String>| total as f64 * 8.0 / get(x, "seconds") / 1e6;
        let t = find(&|x| same_line(r, "tcp", x));
        let q = find(&|x| same_line(r, "quic-proxy", x));
        rows.push(vec![
            format!("{} ms", r[2]),
            format!("{} %", r[3]),
            rate(r),
            format!("{:.2} Mbit/s", mbit(r)),
            t.map_or("-".into(), |t| format!("{:.2} Mbit/s", mbit(t))),
            q.map_or("-".into(), |q| format!("{:.2} Mbit/s", mbit(q))),
            if r[4] == "10" {
                met(mbit(r) >= 9.0)
            } else {
                "-".into()
            },
        ]);
    }
    s += &md_table(
        &[
            "delay",
            "loss",
            "rate",
            "SDUDP",
            "TCP",
            "QUIC proxy",
            "≥ 90 % of 10 Mbit/s",
        ],
        &rows,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        a: SdudpBenchArgs,
    }

    #[test]
    fn the_quick_grid_has_one_cell_of_each_kind_and_shares_lines() {
        let a = Cli::parse_from(["x", "--quick"]).a;
        let g = grid(&a).unwrap();
        let keys: Vec<String> = g
            .iter()
            .map(|(c, s)| format!("{} {}", c.key().join(" "), s.join("")))
            .collect();
        assert_eq!(
            keys,
            [
                "tcp 5 1 1 10 - false A",
                "sdudp 5 1 1 10 all true AD",
                "sdudp 5 20 1 10 all true A",
                "sdudp 5 1 1 10 all false A",
                "sdudp 5 1 1 10 odd true D",
                "quic-proxy 5 1 1 10 - false A",
            ]
        );
        let full = grid(&Cli::parse_from(["x"]).a).unwrap();
        // load: 5 lengths × 5 losses × 2 (50); delay: 9 switches at 1 ms × 5
        // losses × 2 (10, 20 ms shared with load); accumulation: 5 switches at
        // 1 ms, on, off and TCP × 5 (15); engines: all, odd, 1,5,9 (2; all at 1 %
        // shared with delay); time: 2 delays × 2 (4); proxy: loss 0 and 1 %
        // × 3 carriers at 20 ms (TCP and SDUDP at 1 % shared with time: 4).
        assert_eq!(full.len(), 50 + 10 + 15 + 2 + 4 + 4);
        let proxy = grid(&Cli::parse_from(["x", "--kinds", "proxy", "--loss", "0.5"]).a).unwrap();
        let keys: Vec<String> = proxy.iter().map(|(c, _)| c.key().join(" ")).collect();
        assert_eq!(
            keys,
            [
                "tcp 9 20 0.5 10 - false",
                "sdudp 9 20 0.5 10 all true",
                "quic-proxy 9 20 0.5 10 - false",
            ]
        );
        assert!(full.iter().all(|(_, s)| !s.is_empty()));
        assert!(grid(&Cli::parse_from(["x", "--kinds", "nope"]).a).is_err());
        assert!(grid(&Cli::parse_from(["x", "--switches", "3"]).a).is_err());
        assert!(grid(&Cli::parse_from(["x", "--sets", "F"]).a).is_err());
        let only =
            grid(&Cli::parse_from(["x", "--kinds", "proxy", "--carriers", "sdudp"]).a).unwrap();
        assert!(!only.is_empty() && only.iter().all(|(c, _)| c.carrier == Carrier::Sdudp));
        assert!(Cli::try_parse_from(["x", "--carriers", "udp"]).is_err());
        let none = ["x", "--kinds", "accumulation", "--carriers", "quic-proxy"];
        assert!(grid(&Cli::parse_from(none).a).is_err());
    }

    #[test]
    fn resuming_runs_only_the_repetitions_a_cell_lacks() {
        let c = Config::sdudp(9, 20, 1.0);
        let mut runs = Csv::new(RUNS_HEADER);
        let row = |c: &Config, set: &str, rep: usize| {
            let mut r = c.key();
            r.extend([set.to_string(), rep.to_string()]);
            r.resize(RUNS_HEADER.len(), "0".into());
            r
        };
        assert_eq!(remaining(&runs, &c, &["A", "D"], 3), [("A", 0), ("D", 0)]);
        for rep in 0..3 {
            runs.push(row(&c, "A", rep));
        }
        runs.push(row(&c, "D", 0));
        // Another configuration's runs and another set's do not count.
        runs.push(row(&Config::tcp(9, 20, 1.0), "D", 1));
        runs.push(row(&c, "C", 1));
        assert_eq!(remaining(&runs, &c, &["A", "D"], 3), [("D", 1)]);
        assert_eq!(remaining(&runs, &c, &["A", "D"], 5), [("A", 3), ("D", 1)]);
        assert!(remaining(&runs, &c, &["A"], 3).is_empty());
    }

    #[test]
    fn confidence_intervals() {
        let (m, ci) = mean_ci(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((ci - 4.303 * (1.0f64 / 3.0).sqrt()).abs() < 1e-9);
        assert_eq!(mean_ci(&[5.0]), (5.0, 0.0));
    }
}
