//! Switch agents in more than one process. One process may hold at most its
//! hard limit of open files (20,000 on the project's VM, and raising it needs
//! CAP_SYS_RESOURCE), and each switch costs the process hosting its agent four
//! (the agent's UDP socket, its unix listener for OVS, the accepted OVS
//! connection, the simulated OVS's end). Above what one process holds, the
//! bench starts shard processes, `quicsdn-lab bench storm --shard SPEC`, each
//! hosting a contiguous range of switch agents and their simulated OVS.
//!
//! A shard starts its agents (in batches, each connected before the next) and
//! prints `ready`; on a line `go` on its standard input it starts its
//! simulated switches (so every shard's agents are connected before any OVS
//! connects, as in one process), then prints every 50 ms a line
//! `stats ATTEMPTS HELLO_TIMEOUTS` with its fleet's counters. It stops when its
//! standard input closes (the bench ends it, or the bench died).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use super::sim::{Fleet, OvsTiming};
use super::{StormConfig, start_agents, stop_agents, switch_config};
use crate::pki::Pki;

/// Open files per switch in a process hosting its switch agent and simulated
/// OVS.
pub const FDS_PER_HOSTED_SWITCH: u64 = 4;

/// Tracing directives for the switch agents a shard hosts and its simulated
/// OVS (`info`, …; `quicsdn_lab::bench::storm::sim=debug` logs each simulated
/// OVS's reconnection and why); unset, they log nothing. The controller
/// agents get them as `--log-level`. With `QUICSDN_STORM_KEEP=1` the logs stay.
pub const LOG_ENV: &str = "QUICSDN_STORM_LOG";

/// What a shard is told: `PORT,FIRST,LAST,CONFIG,WORK_DIR`.
pub fn spec(port: u16, first: usize, last: usize, cfg: &StormConfig, work: &Path) -> String {
    format!("{port},{first},{last},{},{}", cfg.name, work.display())
}

/// The shard process's side: host switches FIRST..=LAST until stdin closes.
pub fn run_shard(spec: &str) -> Result<()> {
    let bad = || anyhow!("--shard {spec:?}: expected PORT,FIRST,LAST,CONFIG,WORK_DIR");
    let mut parts = spec.splitn(5, ',');
    let port: u16 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let first: usize = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let last: usize = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let cfg = StormConfig::parse(parts.next().ok_or_else(bad)?)?;
    let work = PathBuf::from(parts.next().ok_or_else(bad)?);
    let pki = Pki::open(&work.join("pki"));
    // The hosted switch agents' logs go to the shard's log file (its stderr)
    // when asked for: tracing directives, e.g. `info`.
    if let Ok(filter) = std::env::var(LOG_ENV) {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
    super::procs::raise_fd_limit((last + 1 - first) as u64 * FDS_PER_HOSTED_SWITCH + 256);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("storm-shard")
        .enable_all()
        .build()
        .context("starting the shard's runtime")?;
    let range: Vec<usize> = (first..=last).collect();
    let agents = start_agents(&rt, &range, |i| switch_config(&work, &pki, port, i, &cfg))?;
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut stdin = BufReader::new(std::io::stdin());
    let mut line = String::new();
    if stdin.read_line(&mut line)? == 0 || line.trim() != "go" {
        // The bench gave up on the run.
        stop_agents(&rt, agents);
        return Ok(());
    }
    let fleet = Fleet::start(
        range
            .iter()
            .map(|&i| (work.join(format!("sw{i}.sock")), i as u64))
            .collect(),
        OvsTiming::default(),
    )?;
    // Stdin closing is the stop signal; meanwhile report the counters.
    let (closed_tx, closed_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = stdin.read_to_end(&mut sink);
        let _ = closed_tx.send(());
    });
    loop {
        let s = &fleet.stats;
        writeln!(
            out,
            "stats {} {} {}",
            s.attempts.load(Ordering::Relaxed),
            s.hello_timeouts.load(Ordering::Relaxed),
            s.probe_timeouts.load(Ordering::Relaxed)
        )?;
        out.flush()?;
        match closed_rx.recv_timeout(Duration::from_millis(50)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    drop(fleet);
    stop_agents(&rt, agents);
    Ok(())
}

/// The bench's handle on one shard process.
pub struct Shard {
    child: Child,
    /// Closing it stops the shard.
    stdin: Option<ChildStdin>,
    pub pid: u32,
    attempts: Arc<AtomicU64>,
    hello_timeouts: Arc<AtomicU64>,
    probe_timeouts: Arc<AtomicU64>,
}

impl Shard {
    /// Starts a shard hosting switches `first..=last` and waits (at most
    /// `limit`) until all its agents are connected; [`Shard::go`] starts its
    /// simulated switches.
    pub fn start(lab: &Path, spec: String, log: &Path, limit: Duration) -> Result<Shard> {
        let err = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = Command::new(lab)
            .args(["bench", "storm", "--shard", &spec])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} bench storm --shard", lab.display()))?;
        let pid = child.id();
        if let Ok(rec) = crate::process::ProcRecord::capture("bench storm shard", pid) {
            super::procs::track(&rec);
        }
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let attempts = Arc::new(AtomicU64::new(0));
        let hello_timeouts = Arc::new(AtomicU64::new(0));
        let probe_timeouts = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        {
            let (a, t, p) = (
                attempts.clone(),
                hello_timeouts.clone(),
                probe_timeouts.clone(),
            );
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let f: Vec<&str> = line.split_whitespace().collect();
                    match f.as_slice() {
                        ["ready"] => {
                            let _ = ready_tx.send(());
                        }
                        ["stats", x, y, z] => {
                            a.store(x.parse().unwrap_or(0), Ordering::Relaxed);
                            t.store(y.parse().unwrap_or(0), Ordering::Relaxed);
                            p.store(z.parse().unwrap_or(0), Ordering::Relaxed);
                        }
                        _ => {}
                    }
                }
            });
        }
        let mut shard = Shard {
            child,
            stdin,
            pid,
            attempts,
            hello_timeouts,
            probe_timeouts,
        };
        if ready_rx.recv_timeout(limit).is_err() {
            let tail = crate::process::log_tail(log, 5);
            shard.stop();
            bail!("shard {spec} was not ready within {limit:?}: {tail}");
        }
        Ok(shard)
    }

    /// Starts its simulated switches.
    pub fn go(&mut self) -> Result<()> {
        let stdin = self.stdin.as_mut().context("the shard was stopped")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    pub fn hello_timeouts(&self) -> u64 {
        self.hello_timeouts.load(Ordering::Relaxed)
    }

    pub fn probe_timeouts(&self) -> u64 {
        self.probe_timeouts.load(Ordering::Relaxed)
    }

    /// Closes its stdin and waits for it to stop its agents (killed after
    /// 30 s).
    pub fn stop(&mut self) {
        self.stdin.take();
        for _ in 0..300 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        self.stop();
    }
}
