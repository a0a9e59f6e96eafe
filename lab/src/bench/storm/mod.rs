//! `quicsdn-lab bench storm`: restart the controller agent while hundreds of
//! switches are connected, and measure how long until every switch is back.
//!
//! ```text
//!  N simulated OVS ──unix── N real switch agents ══QUIC══ `quicsdn controller` ──tcp── counting
//!  (sim.rs: rconn timing)   (SwitchAgent, own cert        (separate process,          controller
//!                            and UDP socket each)          restarted)                 (sim.rs)
//! ```
//!
//! The switch agents are the agent library's [`SwitchAgent`], hosted in this
//! process on one tokio runtime, each with its own certificate and UDP socket.
//! The controller agent is a real `quicsdn controller` process, so its CPU time
//! and memory come from `/proc`. Everything runs on loopback.
//!
//! One *restart*: SIGTERM to the controller agent (it closes every connection
//! with SHUTDOWN), then a new one on the same address. A switch is *back* when
//! the counting controller has received its FEATURES_REPLY on a new
//! connection: OVS's connection was closed, OVS reconnected after its own
//! backoff, and the new OpenFlow session crossed the new QUIC connection.
//! Measured per restart: the time from the signal until each switch is back,
//! the new controller agent's CPU seconds and RSS when all are, its admission
//! counters and 0-RTT connections (control socket), drops at its UDP socket,
//! and every handshake until the next restart (each switch must handshake once).
//! Per configuration: the controller agent's memory before any switch and with
//! all, and its idle CPU.
//!
//! A benchmark: it prints and writes numbers and asserts nothing about speed.

pub mod procs;
pub mod rconn;
pub mod shard;
pub mod sim;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use quicsdn_agent::admission::{DEFAULT_MAX_HANDSHAKES, DEFAULT_RECONNECT_JITTER};
use quicsdn_agent::controller::Worker;
use quicsdn_agent::{CommonConfig, ControllerTarget, ServiceConfig, SwitchAgent, SwitchConfig};

use crate::agents::quicsdn_binary;
use crate::bench::out::{self, Csv};
use crate::pki::Pki;
use crate::process::{ProcRecord, log_tail, spawn_service};
use crate::wait::poll_until;
use sim::{CountingController, Fleet, OvsTiming};

/// The configurations of a full run: without and with 0-RTT, without and with
/// admission control at its defaults, a cap that engages, and jitter.
pub const DEFAULT_CONFIGS: &str =
    "1rtt,1rtt-admission,0rtt,0rtt-admission,1rtt-cap128,1rtt-jitter500ms";
/// `--quick`: the defaults without 0-RTT, and 0-RTT with a cap that may refuse
/// some of 50 switches (refused 0-RTT sessions start again on the next
/// connection).
pub const QUICK_CONFIGS: &str = "1rtt-admission,0rtt-cap4";

#[derive(clap::Args, Debug, Clone)]
pub struct StormArgs {
    /// Where the CSVs, the PNG and the markdown summary go.
    #[arg(long, default_value = "bench-results/storm")]
    pub out: PathBuf,
    /// Switches (each a simulated OVS behind its own switch agent), at most
    /// 10,000. [default: 500; 50 with --quick]
    #[arg(long)]
    pub switches: Option<usize>,
    /// CI size: 50 switches, one restart, two configurations.
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated configurations, each `0rtt` or `1rtt` (0-RTT resumption
    /// with a --session-store, or --no-zero-rtt) followed by `-admission` (the
    /// agents' defaults: --max-handshakes=128, --reconnect-jitter=0s) or by
    /// `-capN` and/or `-jitterD` (e.g. `1rtt-cap64-jitter1s`); neither means no
    /// admission control (--max-handshakes=0, --reconnect-jitter=0s).
    /// `-nostandin` turns the switch agents' HELLO stand-in off
    /// (`--no-hello-stand-in`), `-noecho` only its answers to OVS's echo
    /// requests (`--no-echo-stand-in`), for a before/after comparison. `-noovsdb`
    /// leaves out both agents' OVSDB service (the controller agent holds a
    /// listening socket per switch for it: 10,000 switches need it left out
    /// where a process may open at most 20,000 files). `-threadsN` runs the
    /// controller agent on N runtime threads (`--threads N`), `-workersN` as N
    /// worker processes sharing its port (`--workers N`): the cores it may use.
    #[arg(long)]
    pub configs: Option<String>,
    /// Controller-agent restarts per configuration. [default: 2; 1 with --quick]
    #[arg(long)]
    pub restarts: Option<u32>,
    /// How the controller agent is stopped: `term` (SIGTERM: it closes every
    /// connection, so the switch agents know at once) or `kill` (SIGKILL, a
    /// crash: they find out from the new agent's stateless resets, or at the
    /// end of their grace period).
    #[arg(long, value_enum, default_value = "term")]
    pub stop: Stop,
    /// Give up waiting for the switches after this many seconds per restart.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Worker threads of the runtime hosting the switch agents.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// How long every switch stays connected and idle before the idle CPU
    /// (averaged over this window) and memory are read, e.g. `5s` or `180s`:
    /// some per-connection memory grows only with traffic over time
    /// (keepalives). [default: 5s; 2s with --quick]
    #[arg(long, value_parser = crate::control_link::parse_duration)]
    pub idle: Option<Duration>,
    /// Skip the PNG plot.
    #[arg(long)]
    pub no_plots: bool,
    /// Internal: run as a shard process hosting a range of switch agents
    /// (`PORT,FIRST,LAST,CONFIG,WORK_DIR`; see `storm::shard`).
    #[arg(long, hide = true)]
    pub shard: Option<String>,
}

/// How the controller agent is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stop {
    Term,
    Kill,
}

/// One configuration of the agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StormConfig {
    pub name: String,
    pub zero_rtt: bool,
    /// `--max-handshakes` (0: no limit).
    pub max_handshakes: usize,
    /// `--reconnect-jitter`.
    pub jitter: Duration,
    /// The switch agents answer OVS's HELLO from the controller's previous
    /// one while the controller agent is out of reach (the default; the part
    /// `-nostandin` sets `--no-hello-stand-in`).
    pub hello_stand_in: bool,
    /// ... and answer OVS's echo requests until the controller speaks (the
    /// default; `-noecho` sets `--no-echo-stand-in`).
    pub echo_stand_in: bool,
    /// Both agents carry the OVSDB service (the default; `-noovsdb` leaves it
    /// out).
    pub ovsdb: bool,
    /// The controller agent's runtime threads (`-threadsN`: `--threads N`;
    /// none: its default, one per CPU).
    pub threads: Option<usize>,
    /// Its worker processes on one `SO_REUSEPORT` port (`-workersN`:
    /// `--workers N`; 1: a single process, no supervisor).
    pub workers: usize,
}

impl StormConfig {
    /// Parses `0rtt|1rtt[-admission|-capN|-jitterD]…`.
    pub fn parse(spec: &str) -> Result<StormConfig> {
        let bad = |why: String| {
            anyhow!(
                "configuration {spec:?}: {why}; expected 0rtt or 1rtt, then -admission, -capN, \
                 -jitterD, -nostandin, -noecho, -noovsdb, -threadsN or -workersN (e.g. \
                 0rtt-admission, 1rtt-cap64-jitter1s, 0rtt-admission-workers2-threads1)"
            )
        };
        let mut parts = spec.split('-');
        let zero_rtt = match parts.next() {
            Some("0rtt") => true,
            Some("1rtt") => false,
            other => return Err(bad(format!("starts with {other:?}"))),
        };
        let mut c = StormConfig {
            name: spec.to_string(),
            zero_rtt,
            max_handshakes: 0,
            jitter: Duration::ZERO,
            hello_stand_in: true,
            echo_stand_in: true,
            ovsdb: true,
            threads: None,
            workers: 1,
        };
        // A positive count after `prefix` (threads, workers).
        let count = |p: &str, prefix: &str| {
            p[prefix.len()..]
                .parse::<usize>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| {
                    bad(format!(
                        "{p:?} is not {prefix} followed by a count of 1 or more"
                    ))
                })
        };
        for p in parts {
            if p == "nostandin" {
                c.hello_stand_in = false;
            } else if p == "noecho" {
                c.echo_stand_in = false;
            } else if p == "noovsdb" {
                c.ovsdb = false;
            } else if p == "admission" {
                c.max_handshakes = DEFAULT_MAX_HANDSHAKES;
                c.jitter = DEFAULT_RECONNECT_JITTER;
            } else if p.starts_with("threads") {
                c.threads = Some(count(p, "threads")?);
            } else if p.starts_with("workers") {
                c.workers = count(p, "workers")?;
                if c.workers > usize::from(u8::MAX) {
                    return Err(bad(format!("{p:?}: at most 255 workers")));
                }
            } else if let Some(n) = p.strip_prefix("cap") {
                c.max_handshakes = n
                    .parse()
                    .map_err(|_| bad(format!("{p:?} is not cap followed by a number")))?;
            } else if let Some(d) = p.strip_prefix("jitter") {
                c.jitter = parse_duration(d)
                    .ok_or_else(|| bad(format!("{p:?}: write the jitter as 500ms or 1s")))?;
            } else {
                return Err(bad(format!("unknown part {p:?}")));
            }
        }
        Ok(c)
    }

    /// The controller agent's options for this configuration.
    fn controller_args(&self, store: &Path) -> Vec<String> {
        let mut a = vec![format!("--max-handshakes={}", self.max_handshakes)];
        if self.zero_rtt {
            // Without a store the restarted agent no longer knows the tickets.
            a.push(format!("--session-store={}", store.display()));
        } else {
            a.push("--no-zero-rtt".into());
        }
        if let Some(n) = self.threads {
            a.push(format!("--threads={n}"));
        }
        if self.workers > 1 {
            a.push(format!("--workers={}", self.workers));
        }
        a
    }

    /// The files the controller agent makes of a path option (its control
    /// socket, its session store): with `--workers` each worker appends its
    /// index.
    fn worker_paths(&self, path: &Path) -> Vec<PathBuf> {
        if self.workers <= 1 {
            return vec![path.to_path_buf()];
        }
        (0..self.workers)
            .map(|i| Worker::path(path, i as u8))
            .collect()
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    s.strip_suffix('s')?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(Duration::from_secs_f64)
}

/// One restart's measurements. Times are seconds after the stop signal.
#[derive(Debug, Clone)]
pub struct Restart {
    pub config: StormConfig,
    pub index: u32,
    pub switches: usize,
    /// The old agent gone; the new one listening.
    pub dead: f64,
    pub listening: f64,
    /// First handshake after the signal, per switch (datapath id 1..=N).
    pub back: HashMap<u64, f64>,
    /// Handshakes per switch from the signal until the next restart (or the end).
    pub handshakes: HashMap<u64, u32>,
    /// The new controller agent's CPU seconds and RSS (KiB) when every switch
    /// was back (or at the timeout).
    pub cpu: f64,
    pub rss: u64,
    /// This process's CPU seconds over the same time: the switch agents' side
    /// of the handshakes (and the simulated switches and controller), which on
    /// a real network would run on the switches.
    pub host_cpu: f64,
    /// CPU seconds of everything else on the machine meanwhile (the old
    /// controller agent's exit, and other users of a shared machine), and how
    /// long the restart took, for the cores they occupied.
    pub other_cpu: f64,
    pub duration: f64,
    /// Its admission counters and 0-RTT connections then: attempts refused,
    /// admitted, and those that waited for a handshake permit.
    pub refused: u64,
    pub admitted: u64,
    pub waited: u64,
    /// Handshakes that gave their permit back incomplete
    /// (`quicsdn_agent::admission::PERMIT_HOLD`).
    pub slow: u64,
    pub zero_rtt_conns: usize,
    /// Datagrams dropped at its UDP socket.
    pub udp_drops: u64,
    /// The simulated switches' connection attempts, and those that timed out
    /// waiting for the controller's HELLO.
    pub ovs_attempts: u64,
    pub ovs_hello_timeouts: u64,
    /// Connections the simulated switches dropped for an unanswered
    /// inactivity probe (OVS: "no response to inactivity probe").
    pub ovs_probe_timeouts: u64,
}

impl Restart {
    /// Seconds until every switch was back, if all came back.
    pub fn all_back(&self) -> Option<f64> {
        (self.back.len() == self.switches).then(|| self.back.values().copied().fold(0.0, f64::max))
    }

    /// Switches back per second between the first and the last: the
    /// handshake rate the new agent sustained in the storm. (Not from the
    /// moment it listened: the bench sees its control socket only after its
    /// QUIC endpoint is bound, and the first handshakes may finish before.)
    pub fn back_per_s(&self) -> Option<f64> {
        let last = self.all_back()?;
        let first = self.back.values().copied().fold(f64::INFINITY, f64::min);
        (self.switches >= 2).then(|| (self.switches - 1) as f64 / (last - first).max(1e-3))
    }

    fn percentile(&self, p: f64) -> f64 {
        let mut v: Vec<f64> = self.back.values().copied().collect();
        v.sort_by(f64::total_cmp);
        percentile(&v, p)
    }
}

/// Per configuration, with every switch connected and idle.
#[derive(Debug, Clone)]
pub struct Steady {
    pub config: StormConfig,
    pub switches: usize,
    /// Controller agent RSS before any switch connected, and with all, KiB.
    pub ctl_rss_empty: u64,
    pub ctl_rss_full: u64,
    /// Controller agent CPU (% of one core) while idle with every switch.
    pub ctl_idle_cpu_pct: f64,
    /// This process's RSS growth (switch agents, simulated switches, controller)
    /// per switch, KiB: meaningful for the first configuration only, as later
    /// ones reuse memory the allocator kept from the previous one.
    pub host_kib_per_switch: f64,
    /// RSS of the one switch agent that runs as its own `quicsdn switch`
    /// process (the last switch), KiB, idle and connected; and the part of
    /// it that is its own (anonymous) memory, not the binary's and libc's
    /// code pages, which every process running them shares.
    pub switch_rss: u64,
    pub switch_anon: u64,
    /// Its proportional set size (`smaps_rollup` Pss), KiB: shared pages
    /// divided among the processes mapping them (here the controller agent
    /// runs the same binary).
    pub switch_pss: u64,
    /// Seconds from the simulated switches' start until every switch was
    /// connected (its OpenFlow session up; the switch agents may have
    /// connected before), and the datagrams the controller agent's UDP socket
    /// had dropped by then, since it started: the switch agents' first
    /// connections, all full handshakes, fill it where restarts do not
    /// (docs/scale.md, "Where the late answers wait").
    pub connect_s: f64,
    pub connect_udp_drops: u64,
}

pub const RESTARTS_CSV: &[&str] = &[
    "config",
    "zero_rtt",
    "max_handshakes",
    "jitter_ms",
    "restart",
    "switches",
    "back",
    "all_back_s",
    "p50_s",
    "p90_s",
    "p99_s",
    "dead_s",
    "listening_s",
    "ctl_cpu_s",
    "ctl_cpu_ms_per_switch",
    "ctl_rss_kib",
    "host_cpu_s",
    "other_cpu_s",
    "other_cores",
    "refused",
    "admitted",
    "zero_rtt_conns",
    "udp_drops",
    "ovs_attempts",
    "ovs_hello_timeouts",
    "waited",
    // Appended later, so older files still read.
    "ovs_probe_timeouts",
    "back_per_s",
    "ctl_threads",
    "ctl_workers",
    "slow_handshakes",
];
pub const SWITCHES_CSV: &[&str] = &["config", "restart", "switch", "back_s", "handshakes"];
pub const STEADY_CSV: &[&str] = &[
    "config",
    "switches",
    "ctl_rss_empty_kib",
    "ctl_rss_full_kib",
    "ctl_kib_per_conn",
    "ctl_idle_cpu_pct",
    "host_kib_per_switch",
    "switch_agent_rss_kib",
    "switch_agent_anon_kib",
    "switch_agent_pss_kib",
    // Appended later, so older files still read.
    "connect_s",
    "connect_udp_drops",
];

/// Connections must be older than this before a restart: the switch agent
/// treats a connection lost within 2 s as a failed attempt, and OVS resets its
/// backoff to 1 s only for a connection that lived one backoff (1 s). An
/// experimental condition (every restart starts from the same steady state),
/// not a readiness check.
const AGE: Duration = Duration::from_secs(3);

/// The most switches one run accepts. Their switch agents live in this process
/// or, beyond its open-file limit, in shard processes; their simulated Open
/// vSwitches are tasks. 10,000 started on the 2-core VM but did not settle
/// while it was loaded (docs/results/storm-10000): not yet measured.
pub const MAX_SWITCHES: usize = 10_000;

/// The switch agents' OVSDB service: towards an OVS listening on a port where
/// nothing listens (no OVSDB session is opened in the bench).
const OVSDB_TO_SWITCH: &str = "ovsdb=tcp:127.0.0.1:1";

pub fn run(args: StormArgs) -> Result<()> {
    if let Some(spec) = &args.shard {
        return shard::run_shard(spec);
    }
    let switches = args.switches.unwrap_or(if args.quick { 50 } else { 500 });
    let restarts = args.restarts.unwrap_or(if args.quick { 1 } else { 2 });
    if switches == 0 || switches > MAX_SWITCHES {
        bail!(
            "--switches must be between 1 and {MAX_SWITCHES} (got {switches}): the most the \
             bench is built for (shard processes beyond one process's open files; \
             docs/scale.md, 10,000 switches)"
        );
    }
    if restarts == 0 {
        bail!("--restarts must be at least 1");
    }
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let spec = args.configs.clone().unwrap_or_else(|| {
        if args.quick {
            QUICK_CONFIGS
        } else {
            DEFAULT_CONFIGS
        }
        .to_string()
    });
    let configs: Vec<StormConfig> = spec
        .split(',')
        .map(|s| StormConfig::parse(s.trim()))
        .collect::<Result<_>>()?;
    if configs.is_empty() {
        bail!("--configs names no configuration");
    }
    // Open files per switch: in the process hosting its switch agent and
    // simulated OVS, 4 (shard.rs); at the counting controller (this process),
    // 1; at the controller agent, its TCP connection to the controller and its
    // OVSDB listener, 2. Each process has its own limit, at most the hard one.
    let n = switches as u64;
    let limit = procs::raise_fd_limit(n * (shard::FDS_PER_HOSTED_SWITCH + 1) + 256);
    let ovsdb = configs.iter().any(|c| c.ovsdb);
    let ctl_need = n * if ovsdb { 2 } else { 1 } + 256;
    if limit < ctl_need {
        bail!(
            "{switches} switches need about {ctl_need} open files at the controller agent but \
             the limit is {limit} (raise the hard limit, `ulimit -Hn {ctl_need}`, as a user \
             with CAP_SYS_RESOURCE{})",
            if ovsdb {
                ", or leave the OVSDB service out: configurations ending in -noovsdb"
            } else {
                ""
            }
        );
    }
    // Everything in this process if it fits, else shard processes.
    let shards = if n * (shard::FDS_PER_HOSTED_SWITCH + 1) + 256 <= limit {
        0
    } else {
        let per_shard = limit.saturating_sub(256) / shard::FDS_PER_HOSTED_SWITCH;
        if per_shard == 0 || limit < n + 256 {
            bail!("{switches} switches need more open files than the limit of {limit}");
        }
        // The last switch runs as its own `quicsdn switch` process.
        (n - 1).div_ceil(per_shard) as usize
    };
    // Stops what the bench started if the bench itself is interrupted.
    procs::teardown_on_signal().context("installing the SIGINT/SIGTERM handler")?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let work = tempfile::Builder::new()
        .prefix("qsdnX-storm-")
        .tempdir()
        .context("creating the work directory")?;
    // QUICSDN_STORM_KEEP=1 keeps the work directory (the agents' logs).
    let (work_path, _work) = if std::env::var_os("QUICSDN_STORM_KEEP").is_some() {
        let p = work.keep();
        println!("keeping {}", p.display());
        (p, None)
    } else {
        procs::remove_on_signal(work.path());
        (work.path().to_path_buf(), Some(work))
    };
    std::fs::create_dir_all(work_path.join("ovsdb"))?;
    let started = Instant::now();
    let pki = Pki::create(&work_path.join("pki"))?;
    for name in std::iter::once("ctl".to_string()).chain((1..=switches).map(|i| format!("sw{i}"))) {
        pki.issue(&name)?;
    }
    println!(
        "storm: {switches} switches, {} configurations × {restarts} restarts; certificates in {:.1} s",
        configs.len(),
        started.elapsed().as_secs_f64()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .thread_name("storm-agents")
        .enable_all()
        .build()
        .context("starting the switch agents' runtime")?;
    if shards > 0 {
        println!(
            "storm: the switch agents in {shards} shard processes (the open-file limit is {limit})"
        );
    }
    let bench = Bench {
        lab: if shards > 0 {
            Some(crate::agents::lab_binary()?)
        } else {
            None
        },
        shards,
        binary: quicsdn_binary()?,
        work: work_path.clone(),
        pki,
        controller: CountingController::start()?,
        port: free_udp_port()?,
        switches,
        restarts,
        timeout: Duration::from_secs(args.timeout),
        idle: args.idle.unwrap_or(if args.quick {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(5)
        }),
        stop: args.stop,
    };
    let mut all_restarts = Vec::new();
    let mut steadies = Vec::new();
    for cfg in &configs {
        let (steady, rs) = bench.run_config(&rt, cfg)?;
        steadies.push(steady);
        all_restarts.extend(rs);
    }
    write_results(
        &args.out,
        &steadies,
        &all_restarts,
        args.stop,
        shards,
        !args.no_plots,
    )?;
    if !args.no_plots {
        for p in out::plot("storm", &args.out)? {
            println!("wrote {}", p.display());
        }
    }
    println!("\n{}", summary_table(&steadies, &all_restarts));
    println!("wrote {}", args.out.display());
    Ok(())
}

/// The agents' `--log-level`: warnings, or what `QUICSDN_STORM_LOG` asks
/// for (the hosted switch agents in shards log at that level too).
fn agent_log_level() -> String {
    let level = std::env::var(shard::LOG_ENV).unwrap_or_else(|_| "warn".into());
    format!("--log-level={level}")
}

/// The switch agents' services: OpenFlow from the simulated OVS, and (unless
/// `-noovsdb`) OVSDB to an OVS listening on 127.0.0.1:1 (nothing does: no
/// session is ever opened, as nothing connects at the controller agent's side).
fn switch_services(work: &Path, i: usize, cfg: &StormConfig) -> Vec<String> {
    let sock = work.join(format!("sw{i}.sock"));
    let mut v = vec![format!("openflow=punix:{}", sock.display())];
    if cfg.ovsdb {
        v.push(OVSDB_TO_SWITCH.to_string());
    }
    v
}

/// Switch `i`'s agent, towards the controller agent on `port`.
fn switch_config(
    work: &Path,
    pki: &Pki,
    port: u16,
    i: usize,
    cfg: &StormConfig,
) -> Result<SwitchConfig> {
    let services = switch_services(work, i, cfg)
        .iter()
        .map(|s| ServiceConfig::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut common = CommonConfig::new(pki.agent_files(&format!("sw{i}")), services);
    common.quic.zero_rtt = cfg.zero_rtt;
    Ok(SwitchConfig {
        bind: Some("127.0.0.1:0".parse().expect("address")),
        max_backoff: Duration::from_secs(8),
        reconnect_jitter: cfg.jitter,
        hello_stand_in: cfg.hello_stand_in,
        echo_stand_in: cfg.echo_stand_in,
        ..SwitchConfig::new(
            ControllerTarget::new(format!("127.0.0.1:{port}"), "ctl"),
            common,
        )
    })
}

/// Starts the switch agents `ids` in batches of 50, each batch connected
/// before the next, so the first connections are not themselves a storm.
fn start_agents(
    rt: &tokio::runtime::Runtime,
    ids: &[usize],
    config: impl Fn(usize) -> Result<SwitchConfig>,
) -> Result<Vec<SwitchAgent>> {
    let mut agents = Vec::with_capacity(ids.len());
    for batch in ids.chunks(50) {
        let started: Vec<SwitchAgent> = rt.block_on(async {
            let mut v = Vec::new();
            for &i in batch {
                v.push(SwitchAgent::start(config(i)?).await?);
            }
            Ok::<_, anyhow::Error>(v)
        })?;
        for a in &started {
            // Patient: on a loaded machine a handshake may time out and be retried.
            if !rt.block_on(a.wait_connected(Duration::from_secs(180))) {
                bail!("switch agent {} did not connect", a.identity());
            }
        }
        agents.extend(started);
    }
    Ok(agents)
}

fn stop_agents(rt: &tokio::runtime::Runtime, agents: Vec<SwitchAgent>) {
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for a in agents {
            set.spawn(a.shutdown());
        }
        while set.join_next().await.is_some() {}
    });
}

/// Where the simulated switches run: this process's fleet, and the shard
/// processes' (their counters as last reported).
struct Hosts {
    fleet: Fleet,
    shards: Vec<shard::Shard>,
}

impl Hosts {
    fn attempts(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.fleet.stats.attempts.load(Relaxed)
            + self.shards.iter().map(|s| s.attempts()).sum::<u64>()
    }

    fn hello_timeouts(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.fleet.stats.hello_timeouts.load(Relaxed)
            + self.shards.iter().map(|s| s.hello_timeouts()).sum::<u64>()
    }

    fn probe_timeouts(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.fleet.stats.probe_timeouts.load(Relaxed)
            + self.shards.iter().map(|s| s.probe_timeouts()).sum::<u64>()
    }

    /// This process and the shards.
    fn pids(&self) -> Vec<u32> {
        std::iter::once(std::process::id())
            .chain(self.shards.iter().map(|s| s.pid))
            .collect()
    }

    fn cpu_seconds(&self) -> f64 {
        self.pids().into_iter().filter_map(procs::cpu_seconds).sum()
    }

    fn rss_kib(&self) -> u64 {
        self.pids()
            .into_iter()
            .filter_map(|p| procs::status_kib(p, "VmRSS"))
            .sum()
    }
}

fn free_udp_port() -> Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Everything one bench run shares.
struct Bench {
    /// The `quicsdn-lab` binary for shard processes, if there are any.
    lab: Option<PathBuf>,
    /// Shard processes hosting the switch agents (0: this process hosts them).
    shards: usize,
    binary: PathBuf,
    work: PathBuf,
    pki: Pki,
    controller: CountingController,
    port: u16,
    switches: usize,
    restarts: u32,
    timeout: Duration,
    /// Connected and idle this long before the idle reading.
    idle: Duration,
    stop: Stop,
}

/// A running controller agent: one process, or a `--workers` supervisor and
/// its worker processes.
struct CtlAgent {
    proc: ProcRecord,
    /// The workers (none without `--workers`).
    workers: Vec<ProcRecord>,
    /// Its control sockets, one per worker.
    sockets: Vec<PathBuf>,
    log: PathBuf,
}

impl CtlAgent {
    fn processes(&self) -> impl Iterator<Item = &ProcRecord> {
        std::iter::once(&self.proc).chain(&self.workers)
    }

    /// CPU seconds of the agent's processes so far.
    fn cpu_seconds(&self) -> f64 {
        self.processes()
            .filter_map(|p| procs::cpu_seconds(p.pid))
            .sum()
    }

    /// RSS of the agent's processes, KiB.
    fn rss_kib(&self) -> u64 {
        self.processes()
            .filter_map(|p| procs::status_kib(p.pid, "VmRSS"))
            .sum()
    }

    /// True while the agent (every worker too) runs.
    fn is_alive(&self) -> bool {
        self.processes().all(ProcRecord::is_alive)
    }

    /// SIGKILL, as a crash of the whole host's agents: the supervisor first
    /// (else it would start new workers), then its workers.
    fn kill(&self) -> Result<()> {
        self.proc.kill()?;
        for w in &self.workers {
            w.kill()?;
        }
        Ok(())
    }

    /// SIGTERM (a supervisor stops its workers first), SIGKILL after `grace`;
    /// then any worker left.
    fn terminate(&self, grace: Duration) -> Result<()> {
        self.proc.terminate(grace)?;
        for w in &self.workers {
            w.terminate(grace)?;
        }
        Ok(())
    }
}

impl Bench {
    fn control_socket(&self) -> PathBuf {
        self.work.join("ctl.sock")
    }

    /// Starts a controller agent and waits until it listens (its control
    /// socket exists once its QUIC endpoint is bound).
    fn spawn_controller(&self, cfg: &StormConfig, generation: u32) -> Result<CtlAgent> {
        let log = self.work.join(format!("ctl-{}-{generation}.log", cfg.name));
        let sock = self.control_socket();
        let sockets = cfg.worker_paths(&sock);
        // A killed agent may have left them; the agent replaces a stale one anyway.
        for s in &sockets {
            let _ = std::fs::remove_file(s);
        }
        let tls = self.pki.agent_files("ctl");
        let mut c = Command::new(&self.binary);
        c.arg(agent_log_level())
            .arg("controller")
            .arg(format!("--listen=127.0.0.1:{}", self.port))
            .arg(format!("--ca={}", tls.ca.display()))
            .arg(format!("--cert={}", tls.cert.display()))
            .arg(format!("--key={}", tls.key.display()))
            .arg(format!("--service=openflow=tcp:{}", self.controller.addr()))
            .arg(format!("--control={}", sock.display()))
            .args(cfg.controller_args(&self.work.join(format!("sessions-{}", cfg.name))));
        if cfg.ovsdb {
            // The default services: OpenFlow, and OVSDB towards a listening
            // OVS (a per-switch socket here; nothing connects to it).
            c.arg(format!(
                "--service=ovsdb=punix:{}/ovsdb/{{switch}}.sock",
                self.work.display()
            ));
        }
        let proc = spawn_service("quicsdn controller (storm)", &mut c, &log)?;
        procs::track(&proc);
        poll_until(
            "the controller agent to listen",
            Duration::from_secs(10),
            || {
                if !proc.is_alive() {
                    bail!("the controller agent exited: {}", log_tail(&log, 5));
                }
                Ok(sockets.iter().all(|s| s.exists()).then_some(()))
            },
        )?;
        // Every worker has bound its control socket, so all are running.
        let workers = if cfg.workers > 1 {
            let pids = procs::children(proc.pid);
            if pids.len() != cfg.workers {
                bail!(
                    "the controller agent runs {} worker processes, not {}",
                    pids.len(),
                    cfg.workers
                );
            }
            pids.into_iter()
                .map(|pid| ProcRecord::capture("quicsdn controller worker (storm)", pid))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        Ok(CtlAgent {
            proc,
            workers,
            sockets,
            log,
        })
    }

    /// Asks every control socket of the controller agent for its status.
    fn statuses(&self, ctl: &CtlAgent) -> Result<Vec<serde_json::Value>> {
        ctl.sockets.iter().map(|s| status_of(s)).collect()
    }
}

/// Asks a controller agent's control socket for its status.
fn status_of(sock: &Path) -> Result<serde_json::Value> {
    let mut s = std::os::unix::net::UnixStream::connect(sock).with_context(|| {
        format!(
            "connecting to the controller agent's control socket {}",
            sock.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"{\"cmd\":\"status\"}\n")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(&line).context("control socket answer")?;
    if v["ok"] != true {
        bail!("control socket: {v}");
    }
    Ok(v)
}

impl Bench {
    /// Starts the last switch's agent as a `quicsdn switch` process, so its
    /// memory can be read, and waits until it listens for OVS.
    fn spawn_switch(&self, i: usize, cfg: &StormConfig) -> Result<ProcRecord> {
        let log = self.work.join(format!("sw{i}-{}.log", cfg.name));
        let tls = self.pki.agent_files(&format!("sw{i}"));
        let sock = self.work.join(format!("sw{i}.sock"));
        let _ = std::fs::remove_file(&sock);
        let mut c = Command::new(&self.binary);
        c.arg(agent_log_level())
            .arg("switch")
            .arg(format!("--controller=127.0.0.1:{}", self.port))
            .arg("--server-name=ctl")
            .arg("--bind=127.0.0.1:0")
            .arg(format!("--ca={}", tls.ca.display()))
            .arg(format!("--cert={}", tls.cert.display()))
            .arg(format!("--key={}", tls.key.display()))
            .arg(format!("--reconnect-jitter={}ms", cfg.jitter.as_millis()))
            .args(
                switch_services(&self.work, i, cfg)
                    .iter()
                    .map(|s| format!("--service={s}")),
            );
        if !cfg.zero_rtt {
            c.arg("--no-zero-rtt");
        }
        if !cfg.hello_stand_in {
            c.arg("--no-hello-stand-in");
        }
        if !cfg.echo_stand_in {
            c.arg("--no-echo-stand-in");
        }
        let proc = spawn_service("quicsdn switch (storm)", &mut c, &log)?;
        procs::track(&proc);
        poll_until(
            "the switch agent to listen",
            Duration::from_secs(10),
            || {
                if !proc.is_alive() {
                    bail!("the switch agent exited: {}", log_tail(&log, 5));
                }
                Ok(sock.exists().then_some(()))
            },
        )?;
        Ok(proc)
    }

    fn run_config(
        &self,
        rt: &tokio::runtime::Runtime,
        cfg: &StormConfig,
    ) -> Result<(Steady, Vec<Restart>)> {
        let n = self.switches;
        println!(
            "== {}: 0-RTT {}, --max-handshakes={}, --reconnect-jitter={:?}",
            cfg.name,
            if cfg.zero_rtt { "on" } else { "off" },
            cfg.max_handshakes,
            cfg.jitter
        );
        for store in cfg.worker_paths(&self.work.join(format!("sessions-{}", cfg.name))) {
            let _ = std::fs::remove_file(store);
        }
        let mut ctl = self.spawn_controller(cfg, 0)?;
        let ctl_rss_empty = ctl.rss_kib();
        let host_rss0 = procs::status_kib(std::process::id(), "VmRSS").unwrap_or(0);
        let result = (|| -> Result<(Steady, Vec<Restart>)> {
            let switch_proc = self.spawn_switch(n, cfg)?;
            // Stopped on every way out, a shard or the fleet that failed to start
            // included (it was left running then).
            let outcome =
                self.with_switch(rt, cfg, &mut ctl, ctl_rss_empty, host_rss0, &switch_proc);
            let _ = switch_proc.terminate(Duration::from_secs(10));
            outcome
        })();
        let _ = ctl.terminate(Duration::from_secs(10));
        result
    }

    /// Starts switches 1..n-1 and the fleet beside the switch agent of switch n,
    /// and measures.
    fn with_switch(
        &self,
        rt: &tokio::runtime::Runtime,
        cfg: &StormConfig,
        ctl: &mut CtlAgent,
        ctl_rss_empty: u64,
        host_rss0: u64,
        switch_proc: &ProcRecord,
    ) -> Result<(Steady, Vec<Restart>)> {
        let n = self.switches;
        // Switches 1..n-1: here, or in shard processes of contiguous ranges.
        let mut agents = Vec::new();
        let mut shards = Vec::new();
        let ids: Vec<usize> = (1..n).collect();
        if self.shards == 0 {
            agents = start_agents(rt, &ids, |i| {
                switch_config(&self.work, &self.pki, self.port, i, cfg)
            })?;
        } else {
            let lab = self.lab.as_deref().expect("shards need the lab binary");
            for (k, range) in ids
                .chunks(ids.len().div_ceil(self.shards).max(1))
                .enumerate()
            {
                let (first, last) = (range[0], range[range.len() - 1]);
                let log = self.work.join(format!("shard{k}-{}.log", cfg.name));
                let limit = Duration::from_secs(60 + range.len() as u64 / 10);
                shards.push(shard::Shard::start(
                    lab,
                    shard::spec(self.port, first, last, cfg, &self.work),
                    &log,
                    limit,
                )?);
                println!("shard {k}: switches {first}..={last} connected");
            }
            for s in &mut shards {
                s.go()?;
            }
        }
        let here: Vec<usize> = if self.shards == 0 {
            (1..=n).collect()
        } else {
            vec![n]
        };
        let hosts = Hosts {
            fleet: Fleet::start(
                here.iter()
                    .map(|&i| (self.work.join(format!("sw{i}.sock")), i as u64))
                    .collect(),
                OvsTiming::default(),
            )?,
            shards,
        };
        let outcome = self.measure(cfg, ctl, &hosts, ctl_rss_empty, host_rss0, switch_proc);
        drop(hosts);
        stop_agents(rt, agents);
        outcome
    }

    fn wait_all_live(&self, limit: Duration) -> Result<()> {
        self.controller
            .wait_live(self.switches, "every switch to be connected", limit)
    }

    fn measure(
        &self,
        cfg: &StormConfig,
        ctl: &mut CtlAgent,
        hosts: &Hosts,
        ctl_rss_empty: u64,
        host_rss0: u64,
        switch_proc: &ProcRecord,
    ) -> Result<(Steady, Vec<Restart>)> {
        let n = self.switches;
        let t = Instant::now();
        // Every OVS connects at once: give 10,000 more than the 120 s of a few hundred.
        self.wait_all_live(Duration::from_secs((n as u64 / 50).max(120)))?;
        let connect_s = t.elapsed().as_secs_f64();
        let connect_udp_drops = procs::udp_drops(self.port);
        println!(
            "all {n} switches connected {connect_s:.1} s after their OVS started; the controller \
             agent's UDP socket dropped {connect_udp_drops} datagrams since it started"
        );
        // Idle with every switch: CPU over a window, then memory.
        let window = self.idle;
        let c0 = ctl.cpu_seconds();
        std::thread::sleep(window);
        let c1 = ctl.cpu_seconds();
        let ctl_rss_full = ctl.rss_kib();
        // This process's growth, and every shard's whole RSS.
        let host_rss = hosts.rss_kib();
        let steady = Steady {
            config: cfg.clone(),
            switches: n,
            ctl_rss_empty,
            ctl_rss_full,
            ctl_idle_cpu_pct: 100.0 * (c1 - c0) / window.as_secs_f64(),
            host_kib_per_switch: host_rss.saturating_sub(host_rss0) as f64 / n as f64,
            switch_rss: procs::status_kib(switch_proc.pid, "VmRSS").unwrap_or(0),
            switch_anon: procs::status_kib(switch_proc.pid, "RssAnon").unwrap_or(0),
            switch_pss: procs::smaps_rollup_kib(switch_proc.pid, "Pss").unwrap_or(0),
            connect_s,
            connect_udp_drops,
        };
        println!(
            "idle: controller agent {:.1} MiB with {n} connections ({:.1} MiB empty, {:.1} KiB per connection), {:.1} % CPU; \
             a switch agent process {:.2} MiB ({:.2} MiB its own, PSS {:.2} MiB)",
            ctl_rss_full as f64 / 1024.0,
            ctl_rss_empty as f64 / 1024.0,
            (ctl_rss_full.saturating_sub(ctl_rss_empty)) as f64 / n as f64,
            steady.ctl_idle_cpu_pct,
            steady.switch_rss as f64 / 1024.0,
            steady.switch_anon as f64 / 1024.0,
            steady.switch_pss as f64 / 1024.0,
        );
        let mut restarts = Vec::new();
        let mut starts = Vec::new();
        for index in 1..=self.restarts {
            let (r, t0) = self.restart(cfg, ctl, hosts, index)?;
            print_restart(&r);
            restarts.push(r);
            starts.push(t0);
            self.wait_all_live(self.timeout)?;
            std::thread::sleep(AGE);
        }
        // Handshakes per switch from each restart's signal to the next one's.
        starts.push(self.controller.now());
        let hs = self.controller.handshakes();
        for (i, r) in restarts.iter_mut().enumerate() {
            let (from, to) = (starts[i], starts[i + 1]);
            for h in hs.iter().filter(|h| h.at >= from && h.at < to) {
                *r.handshakes.entry(h.dpid).or_default() += 1;
            }
        }
        Ok((steady, restarts))
    }

    /// Restarts the controller agent and waits for every switch to be back.
    /// Returns the measurements and the signal's time on the controller's clock.
    fn restart(
        &self,
        cfg: &StormConfig,
        ctl: &mut CtlAgent,
        hosts: &Hosts,
        index: u32,
    ) -> Result<(Restart, Duration)> {
        let n = self.switches;
        let attempts0 = hosts.attempts();
        let timeouts0 = hosts.hello_timeouts();
        let probes0 = hosts.probe_timeouts();
        let since = |t0: Duration| (self.controller.now() - t0).as_secs_f64();
        let host0 = hosts.cpu_seconds();
        let machine0 = procs::machine_busy_seconds();
        let t0 = self.controller.now();
        match self.stop {
            // The agent closes every connection with SHUTDOWN and exits.
            Stop::Term => ctl.terminate(Duration::from_secs(10))?,
            Stop::Kill => ctl.kill()?,
        }
        // The last of a killed process's threads may hold the socket a little
        // longer than its main thread lives.
        poll_until(
            "the controller agent's UDP port to be free",
            Duration::from_secs(10),
            || {
                Ok(std::net::UdpSocket::bind(("127.0.0.1", self.port))
                    .is_ok()
                    .then_some(()))
            },
        )?;
        let dead = since(t0);
        *ctl = self.spawn_controller(cfg, index)?;
        let listening = since(t0);
        let drops0 = procs::udp_drops(self.port);
        let deadline = Instant::now() + self.timeout;
        let mut back: HashMap<u64, f64> = HashMap::new();
        let mut seen = 0;
        loop {
            // Only the handshakes not looked at yet (10,000 switches).
            let since = self.controller.handshakes_since(t0);
            for h in &since[seen.min(since.len())..] {
                back.entry(h.dpid).or_insert((h.at - t0).as_secs_f64());
            }
            seen = since.len();
            if back.len() >= n || Instant::now() >= deadline {
                break;
            }
            if !ctl.is_alive() {
                bail!("the controller agent exited: {}", log_tail(&ctl.log, 5));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let cpu = ctl.cpu_seconds();
        let rss = ctl.rss_kib();
        let host_cpu = hosts.cpu_seconds() - host0;
        let duration = since(t0);
        let other_cpu = (procs::machine_busy_seconds() - machine0 - host_cpu - cpu).max(0.0);
        // Summed over the workers' control sockets.
        let statuses = self.statuses(ctl)?;
        let admission = |key: &str| -> u64 {
            statuses
                .iter()
                .filter_map(|s| s["admission"][key].as_u64())
                .sum()
        };
        let zero_rtt_conns = statuses
            .iter()
            .filter_map(|s| s["connections"].as_array())
            .flatten()
            .filter(|c| c["zero_rtt"] == true)
            .count();
        Ok((
            Restart {
                config: cfg.clone(),
                index,
                switches: n,
                dead,
                listening,
                back,
                handshakes: HashMap::new(),
                cpu,
                rss,
                host_cpu,
                other_cpu,
                duration,
                refused: admission("refused"),
                admitted: admission("admitted"),
                waited: admission("waited"),
                slow: admission("slow"),
                zero_rtt_conns,
                udp_drops: procs::udp_drops(self.port).saturating_sub(drops0),
                ovs_attempts: hosts.attempts() - attempts0,
                ovs_hello_timeouts: hosts.hello_timeouts() - timeouts0,
                ovs_probe_timeouts: hosts.probe_timeouts() - probes0,
            },
            t0,
        ))
    }
}

/// The `p`-th percentile (0–100) of `sorted`; NaN when it is empty.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    crate::bench::stats::quantile(sorted, p / 100.0)
}

fn opt(v: Option<f64>) -> String {
    v.map_or("not all".into(), |v| format!("{v:.2}"))
}

fn print_restart(r: &Restart) {
    println!(
        "{} restart {}: every switch back {} s ({}/{} back; p50 {:.2} s, p90 {:.2} s; {} per second from the first to the last); new agent listening after {:.2} s; \
         its CPU {:.2} s ({:.2} ms per switch), {:.1} MiB; switch side CPU {:.2} s; other processes {:.1} cores; waited {}, refused {}, admitted {}, slow handshakes {}, \
         0-RTT connections {}, UDP drops {}; OVS attempts {} (HELLO timeouts {}, inactivity-probe timeouts {})",
        r.config.name,
        r.index,
        opt(r.all_back()),
        r.back.len(),
        r.switches,
        r.percentile(50.0),
        r.percentile(90.0),
        r.back_per_s()
            .map_or("not all".into(), |v| format!("{v:.0}")),
        r.listening,
        r.cpu,
        1000.0 * r.cpu / r.switches as f64,
        r.rss as f64 / 1024.0,
        r.host_cpu,
        r.other_cpu / r.duration.max(1e-3),
        r.waited,
        r.refused,
        r.admitted,
        r.slow,
        r.zero_rtt_conns,
        r.udp_drops,
        r.ovs_attempts,
        r.ovs_hello_timeouts,
        r.ovs_probe_timeouts,
    );
}

/// One markdown row per restart (nothing is a median over restarts, so a slow
/// restart is never hidden); the configuration's idle memory on each of its rows.
fn summary_table(steadies: &[Steady], restarts: &[Restart]) -> String {
    let mut rows = Vec::new();
    for s in steadies {
        let kib = format!(
            "{:.1}",
            s.ctl_rss_full.saturating_sub(s.ctl_rss_empty) as f64 / s.switches as f64
        );
        for r in restarts.iter().filter(|r| r.config.name == s.config.name) {
            rows.push(vec![
                s.config.name.clone(),
                r.index.to_string(),
                if s.config.zero_rtt { "on" } else { "off" }.into(),
                s.config.max_handshakes.to_string(),
                format!("{}", s.config.jitter.as_millis()),
                opt(r.all_back()),
                r.back_per_s()
                    .map_or("not all".into(), |v| format!("{v:.0}")),
                format!("{:.2}", r.percentile(50.0)),
                format!("{:.2}", r.percentile(90.0)),
                format!("{:.2}", 1000.0 * r.cpu / r.switches as f64),
                r.waited.to_string(),
                r.refused.to_string(),
                r.zero_rtt_conns.to_string(),
                r.udp_drops.to_string(),
                r.ovs_hello_timeouts.to_string(),
                r.ovs_probe_timeouts.to_string(),
                kib.clone(),
            ]);
        }
    }
    out::md_table(
        &[
            "config",
            "restart",
            "0-RTT",
            "max handshakes",
            "jitter (ms)",
            "all back (s)",
            "back per s",
            "p50 (s)",
            "p90 (s)",
            "ctl CPU (ms/switch)",
            "waited",
            "refused",
            "0-RTT conns",
            "UDP drops",
            "OVS HELLO timeouts",
            "OVS probe timeouts",
            "ctl KiB/conn (config, idle)",
        ],
        &rows,
    )
}

fn write_results(
    dir: &Path,
    steadies: &[Steady],
    restarts: &[Restart],
    stop: Stop,
    shards: usize,
    plotted: bool,
) -> Result<()> {
    let f3 = |v: f64| format!("{v:.3}");
    let mut rc = Csv::new(RESTARTS_CSV);
    let mut sc = Csv::new(SWITCHES_CSV);
    for r in restarts {
        rc.push(vec![
            r.config.name.clone(),
            r.config.zero_rtt.to_string(),
            r.config.max_handshakes.to_string(),
            r.config.jitter.as_millis().to_string(),
            r.index.to_string(),
            r.switches.to_string(),
            r.back.len().to_string(),
            r.all_back().map(f3).unwrap_or_default(),
            f3(r.percentile(50.0)),
            f3(r.percentile(90.0)),
            f3(r.percentile(99.0)),
            f3(r.dead),
            f3(r.listening),
            f3(r.cpu),
            f3(1000.0 * r.cpu / r.switches as f64),
            r.rss.to_string(),
            f3(r.host_cpu),
            f3(r.other_cpu),
            format!("{:.2}", r.other_cpu / r.duration.max(1e-3)),
            r.refused.to_string(),
            r.admitted.to_string(),
            r.zero_rtt_conns.to_string(),
            r.udp_drops.to_string(),
            r.ovs_attempts.to_string(),
            r.ovs_hello_timeouts.to_string(),
            r.waited.to_string(),
            r.ovs_probe_timeouts.to_string(),
            r.back_per_s()
                .map(|v| format!("{v:.1}"))
                .unwrap_or_default(),
            r.config.threads.map(|n| n.to_string()).unwrap_or_default(),
            r.config.workers.to_string(),
            r.slow.to_string(),
        ]);
        for d in 1..=r.switches as u64 {
            sc.push(vec![
                r.config.name.clone(),
                r.index.to_string(),
                d.to_string(),
                r.back.get(&d).map(|&v| f3(v)).unwrap_or_default(),
                r.handshakes.get(&d).copied().unwrap_or(0).to_string(),
            ]);
        }
    }
    let mut st = Csv::new(STEADY_CSV);
    for s in steadies {
        st.push(vec![
            s.config.name.clone(),
            s.switches.to_string(),
            s.ctl_rss_empty.to_string(),
            s.ctl_rss_full.to_string(),
            format!(
                "{:.1}",
                s.ctl_rss_full.saturating_sub(s.ctl_rss_empty) as f64 / s.switches as f64
            ),
            format!("{:.2}", s.ctl_idle_cpu_pct),
            format!("{:.1}", s.host_kib_per_switch),
            s.switch_rss.to_string(),
            s.switch_anon.to_string(),
            s.switch_pss.to_string(),
            format!("{:.1}", s.connect_s),
            s.connect_udp_drops.to_string(),
        ]);
    }
    rc.write(&dir.join("restarts.csv"))?;
    sc.write(&dir.join("switches.csv"))?;
    st.write(&dir.join("steady.csv"))?;
    let mut md = String::from("# Reconnect storm: restarting the controller agent\n\n");
    let switches = steadies.first().map_or(0, |s| s.switches);
    let hosted = if shards == 0 {
        "hosted in the bench process".to_string()
    } else {
        format!(
            "hosted in {shards} shard processes (`bench storm --shard`; one process here may \
             not open enough files for all)"
        )
    };
    let with_ovsdb: Vec<&str> = steadies
        .iter()
        .filter(|s| s.config.ovsdb)
        .map(|s| s.config.name.as_str())
        .collect();
    let services = if with_ovsdb.len() == steadies.len() {
        "Both agents carry the default services: OpenFlow, and OVSDB (a per-switch socket at \
         the controller agent)."
            .to_string()
    } else if with_ovsdb.is_empty() {
        "Both agents carry OpenFlow only (`-noovsdb`: the OVSDB service, a per-switch socket at \
         the controller agent, left out)."
            .to_string()
    } else {
        format!(
            "OpenFlow and OVSDB in {}; OpenFlow only in the `-noovsdb` configurations.",
            with_ovsdb.join(", ")
        )
    };
    let _ = writeln!(
        md,
        "{switches} switches (simulated Open vSwitch with OVS's reconnect timing, each behind its own \
         switch agent with its own certificate and UDP socket, {hosted}, but the last, \
         which runs as a `quicsdn switch` process) connected to one \
         `quicsdn controller` process, on loopback. {services} Each restart: {} to the controller agent \
         and a new one on the same address. A switch is back when the controller received its \
         FEATURES_REPLY on a new connection. `1rtt`: `--no-zero-rtt`; `0rtt`: 0-RTT with \
         `--session-store`. `admission`: the defaults, `--max-handshakes={DEFAULT_MAX_HANDSHAKES}` \
         and `--reconnect-jitter={}ms`; `capN`/`jitterD`: those settings; neither: \
         `--max-handshakes=0 --reconnect-jitter=0s`. Target (issue 18): every switch back within \
         15 s, with 0 OVS HELLO timeouts. Times are from the signal; one row per restart.\n",
        match stop {
            Stop::Term => "SIGTERM (the agent closes every connection)",
            Stop::Kill =>
                "SIGKILL (a crash: the switch agents learn of it when their next packet, a keep-alive at the latest, earns a stateless reset from the new agent)",
        },
        DEFAULT_RECONNECT_JITTER.as_millis()
    );
    md += &summary_table(steadies, restarts);
    md += "\n*back per s*: switches back per second from the first to the last (the new \
           agent's handshake rate in the storm). *ctl CPU*: the new \
           controller agent's CPU time from its start until every switch was back, per switch \
           (with `-workersN`, the supervisor's and every worker's). *waited*: connection attempts over `--max-handshakes` that \
           waited for a handshake to finish. *refused*: attempts its admission control refused \
           (waited too long, or the queue was full). *UDP drops*: datagrams its socket dropped. \
           *0-RTT conns*: connections that began in 0-RTT. *OVS HELLO timeouts*: OVS \
           connections given up after 1 s without the controller's HELLO (each doubles that \
           switch's backoff). *ctl KiB/conn*: the controller agent's RSS with every switch \
           connected, less its RSS before any, per connection.\n\n";
    md += "Idle, every switch connected:\n\n";
    let rows: Vec<Vec<String>> = steadies
        .iter()
        .map(|s| {
            vec![
                s.config.name.clone(),
                format!("{:.1}", s.ctl_rss_empty as f64 / 1024.0),
                format!("{:.1}", s.ctl_rss_full as f64 / 1024.0),
                format!(
                    "{:.1}",
                    s.ctl_rss_full.saturating_sub(s.ctl_rss_empty) as f64 / s.switches as f64
                ),
                format!("{:.2}", s.ctl_idle_cpu_pct),
                format!("{:.1}", s.host_kib_per_switch),
                format!("{:.2}", s.switch_rss as f64 / 1024.0),
                format!("{:.2}", s.switch_anon as f64 / 1024.0),
                format!("{:.2}", s.switch_pss as f64 / 1024.0),
                format!("{:.1}", s.connect_s),
                s.connect_udp_drops.to_string(),
            ]
        })
        .collect();
    md += &out::md_table(
        &[
            "config",
            "ctl RSS empty (MiB)",
            "ctl RSS all connected (MiB)",
            "ctl KiB per connection",
            "ctl idle CPU (%)",
            "bench process KiB per switch (first config only)",
            "switch agent process RSS (MiB)",
            "of which its own (MiB)",
            "switch agent PSS (MiB)",
            "all connected after (s)",
            "ctl UDP drops until then",
        ],
        &rows,
    );
    // Only where the plot will be (`--no-plots` draws none).
    md += if plotted {
        "\n![time until each switch is back](storm.png)\n\n"
    } else {
        "\n"
    };
    md += &out::provenance();
    std::fs::write(dir.join("storm.md"), md)?;
    Ok(())
}

/// Reads `restarts.csv` and `switches.csv` from `dir`, checking their headers.
pub fn read(dir: &Path) -> Result<(Csv, Csv, Csv)> {
    Ok((
        Csv::read(&dir.join("restarts.csv"), RESTARTS_CSV)?,
        Csv::read(&dir.join("switches.csv"), SWITCHES_CSV)?,
        Csv::read(&dir.join("steady.csv"), STEADY_CSV)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_parse_and_bad_ones_are_explained() {
        let c = StormConfig::parse("0rtt-admission").unwrap();
        assert!(c.zero_rtt);
        assert_eq!(c.max_handshakes, DEFAULT_MAX_HANDSHAKES);
        assert_eq!(c.jitter, DEFAULT_RECONNECT_JITTER);
        let c = StormConfig::parse("1rtt").unwrap();
        assert_eq!(
            (c.zero_rtt, c.max_handshakes, c.jitter),
            (false, 0, Duration::ZERO)
        );
        let c = StormConfig::parse("1rtt-cap64-jitter1s").unwrap();
        assert_eq!((c.max_handshakes, c.jitter), (64, Duration::from_secs(1)));
        assert!(c.hello_stand_in);
        assert!(!StormConfig::parse("1rtt-nostandin").unwrap().hello_stand_in);
        assert!(c.echo_stand_in);
        assert!(
            !StormConfig::parse("0rtt-admission-noecho")
                .unwrap()
                .echo_stand_in
        );
        assert!(c.ovsdb);
        assert!(!StormConfig::parse("0rtt-admission-noovsdb").unwrap().ovsdb);
        assert_eq!(
            StormConfig::parse("0rtt-jitter250ms").unwrap().jitter,
            Duration::from_millis(250)
        );
        for (bad, words) in [
            ("2rtt", "starts with"),
            ("0rtt-capx", "cap followed by a number"),
            ("0rtt-jitter5", "500ms or 1s"),
            ("0rtt-fast", "unknown part"),
            ("0rtt-workers0", "workers followed by a count of 1 or more"),
            ("0rtt-threadsx", "threads followed by a count of 1 or more"),
            ("0rtt-workers300", "at most 255 workers"),
        ] {
            let e = StormConfig::parse(bad).unwrap_err().to_string();
            assert!(e.contains(words), "{bad}: {e}");
        }
        let a = StormConfig::parse("1rtt-cap8")
            .unwrap()
            .controller_args(Path::new("/s"));
        assert_eq!(a, ["--max-handshakes=8", "--no-zero-rtt"]);
        let a = StormConfig::parse("0rtt")
            .unwrap()
            .controller_args(Path::new("/s"));
        assert_eq!(a, ["--max-handshakes=0", "--session-store=/s"]);
        let c = StormConfig::parse("0rtt-admission-workers2-threads1").unwrap();
        assert_eq!((c.workers, c.threads), (2, Some(1)));
        assert_eq!(
            c.controller_args(Path::new("/s")),
            [
                "--max-handshakes=128",
                "--session-store=/s",
                "--threads=1",
                "--workers=2"
            ]
        );
        // Each worker appends its index to a file option (cli `per_worker`).
        assert_eq!(
            c.worker_paths(Path::new("/w/ctl.sock")),
            [Path::new("/w/ctl.sock.0"), Path::new("/w/ctl.sock.1")]
        );
        let one = StormConfig::parse("0rtt").unwrap();
        assert_eq!((one.workers, one.threads), (1, None));
        assert_eq!(
            one.worker_paths(Path::new("/w/ctl.sock")),
            [Path::new("/w/ctl.sock")]
        );
    }

    #[test]
    fn all_back_needs_every_switch() {
        let mut r = Restart {
            config: StormConfig::parse("1rtt").unwrap(),
            index: 1,
            switches: 3,
            dead: 0.0,
            listening: 0.0,
            back: HashMap::from([(1, 1.5), (2, 0.5)]),
            handshakes: HashMap::new(),
            cpu: 0.0,
            rss: 0,
            host_cpu: 0.0,
            other_cpu: 0.0,
            duration: 0.0,
            refused: 0,
            admitted: 0,
            waited: 0,
            slow: 0,
            zero_rtt_conns: 0,
            udp_drops: 0,
            ovs_attempts: 0,
            ovs_hello_timeouts: 0,
            ovs_probe_timeouts: 0,
        };
        assert_eq!(r.all_back(), None);
        assert_eq!(r.back_per_s(), None);
        r.back.insert(3, 2.5);
        assert_eq!(r.all_back(), Some(2.5));
        assert_eq!(r.percentile(50.0), 1.5);
        // The 2 switches after the first came back in 2 s.
        assert_eq!(r.back_per_s(), Some(1.0));
    }
}
