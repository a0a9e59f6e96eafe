//! Shared helpers of the lab's integration tests (they need root).
//!
//! Every test uses its own prefix `qsdnT…` (never the default `qsdn`, nor
//! other engineers' `qsdnE`/`qsdnA`), removes any leftover lab of that prefix
//! before starting, and holds [`serial`] so that at most [`LAB_SLOTS`] labs
//! run at once on the machine, and never the same test twice.
#![allow(dead_code)]

pub mod osken_bed;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use quicsdn_lab::bench::out::Csv;
use quicsdn_lab::bench::overhead::OverheadArgs;
use quicsdn_lab::netns::Netns;
use quicsdn_lab::process::ProcRecord;
use quicsdn_lab::state::{DEFAULT_RUN_DIR, LabState};
use quicsdn_lab::topology::{self, LabConfig};

/// How many of the tests' labs may run at once on this machine, whichever
/// test binary or checkout they come from. The labs mostly wait (delayed
/// links, OVS's and the controllers' timers): on the 2-core machine the lab
/// tests took 789 s one lab at a time and 559 s two at once, and with two the
/// cores were still 17 % busy (/proc/stat: 187 of 1,103 core-seconds), so one
/// lab does not slow the other past its deadlines.
pub const LAB_SLOTS: usize = 2;

/// Held while a test runs its lab: one of the [`LAB_SLOTS`], and this test's
/// own lock.
pub struct Serial {
    _slot: std::fs::File,
    _test: std::fs::File,
}

/// A lock file in the run directory, opened for `flock`.
fn lock_file(name: &str) -> std::fs::File {
    std::fs::create_dir_all(run_dir()).unwrap();
    std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(run_dir().join(name))
        .unwrap()
}

/// Waits for a lab slot. First this test's own lock (its prefixes are fixed,
/// so the same test from a second checkout must wait, not share them), then
/// one of the [`LAB_SLOTS`] machine-wide (flocks: released when the test ends,
/// even by a panic, and when its process dies).
pub fn serial() -> Serial {
    use std::os::unix::io::AsRawFd;
    // libtest names each test's thread after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .replace("::", "-");
    let test = lock_file(&format!("tests-qsdnT-{test}.lock"));
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(test.as_raw_fd(), libc::LOCK_EX) }, 0);
    loop {
        for i in 0..LAB_SLOTS {
            let slot = lock_file(&format!("tests-qsdnT-slot{i}.lock"));
            // SAFETY: as above; LOCK_NB returns at once when the slot is taken.
            if unsafe { libc::flock(slot.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Serial {
                    _slot: slot,
                    _test: test,
                };
            }
        }
        // Every slot is taken: a lab ends in seconds, so look again soon.
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn require_root() {
    // SAFETY: geteuid cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the quicsdn-lab integration tests need root (namespaces, veth, OVS)"
    );
}

/// Runs `quicsdn-lab ARGS` and returns what it printed; fails the test with
/// both of its outputs if it fails.
pub fn lab_ok(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quicsdn-lab"))
        .args(args)
        .output()
        .expect("running quicsdn-lab");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "quicsdn-lab {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub fn run_dir() -> PathBuf {
    PathBuf::from(DEFAULT_RUN_DIR)
}

/// A lab config for tests: fixed prefix, default run dir, shorter timeouts.
pub fn config(prefix: &str) -> LabConfig {
    let mut cfg = LabConfig::new(prefix);
    cfg.run_dir = run_dir();
    cfg
}

/// Removes the lab when dropped (also when the test panics).
pub struct LabGuard {
    pub prefix: String,
}

impl LabGuard {
    /// Removes leftovers of an earlier (crashed) run of this test, then guards.
    pub fn new(prefix: &str) -> LabGuard {
        require_root();
        topology::down(&run_dir(), prefix).expect("removing a leftover lab");
        LabGuard {
            prefix: prefix.to_string(),
        }
    }
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Err(e) = topology::down(&run_dir(), &self.prefix) {
            eprintln!("cleanup of lab {} failed: {e:#}", self.prefix);
        }
    }
}

/// Every process a state records.
pub fn recorded_procs(state: &LabState) -> Vec<ProcRecord> {
    let mut v = Vec::new();
    for sw in &state.switches {
        if let Some(o) = &sw.ovs {
            v.push(o.ovsdb_server.clone());
            v.push(o.vswitchd.clone());
        }
    }
    if let Some(c) = &state.controller {
        v.push(c.proc.clone());
    }
    for l in &state.control_links {
        v.extend(l.procs.iter().cloned());
    }
    v.extend(state.agents.iter().cloned());
    v
}

/// What is left of lab `prefix` on the machine: namespaces named `prefix-…`,
/// processes whose command line mentions the lab's directory, the processes
/// recorded in `before` (if still alive), the lab's state directory and lock
/// file. Empty when the lab is completely gone.
pub fn leftovers(prefix: &str, before: &[ProcRecord]) -> Vec<String> {
    let mut left = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{prefix}-")) {
                left.push(format!("namespace {name}"));
            }
        }
    }
    let lab_dir = run_dir().join(prefix);
    let needle = format!("{}/", lab_dir.display());
    // Control-link forwarders run from the emulator's directory, named PREFIX-cI.
    let emulator_dir = run_dir().join("emulator");
    let link_needle = format!("{}/{prefix}-c", emulator_dir.display());
    if let Ok(entries) = std::fs::read_dir(&emulator_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{prefix}-c")) {
                left.push(format!("emulator file {name}"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&needle) || cmdline.contains(&link_needle) {
                left.push(format!("process {pid}: {cmdline}"));
            }
        }
    }
    for p in before {
        if p.is_alive() {
            left.push(format!("recorded process {} (pid {})", p.name, p.pid));
        }
    }
    if lab_dir.exists() {
        left.push(format!("directory {}", lab_dir.display()));
    }
    let lock = run_dir().join(format!("{prefix}.lock"));
    if lock.exists() {
        left.push(format!("lock file {}", lock.display()));
    }
    left
}

/// Interfaces in the root namespace (the lab must never add any).
pub fn root_interfaces() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Root-namespace interfaces named like the lab's (`ctl`, `swN`, `hN-M`), which
/// the lab must never create there.
pub fn lab_like_root_interfaces() -> Vec<String> {
    root_interfaces()
        .into_iter()
        .filter(|n| {
            n == "ctl"
                || (n.starts_with("sw")
                    && n[2..].chars().all(|c| c.is_ascii_digit())
                    && n.len() > 2)
                || (n.starts_with('h')
                    && n[1..].contains('-')
                    && n[1..].chars().all(|c| c.is_ascii_digit() || c == '-'))
        })
        .collect()
}

/// Pings until one echo comes back (first packets may wait for the
/// controller to answer packet-ins), within `timeout`.
pub fn ping_until_reply(host_ns: &str, dst: &str, timeout: Duration) {
    let ns = Netns::named(host_ns);
    let start = Instant::now();
    loop {
        let st = quicsdn_lab::host::ping(&ns, dst, 1, 0.2).expect("running ping");
        if st.received == 1 {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "no ping reply from {dst} in {host_ns} within {timeout:?}"
        );
    }
}

pub fn lab_dir(prefix: &str) -> PathBuf {
    run_dir().join(prefix)
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// An agent's answer to `status` on its control socket (`--control PATH`).
pub fn control_status(socket: &Path) -> serde_json::Value {
    try_control_status(socket).unwrap_or_else(|e| panic!("{e:#}"))
}

/// [`control_status`], or why not (the agent is not listening yet, …).
pub fn try_control_status(socket: &Path) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    writeln!(s, r#"{{"cmd":"status"}}"#)?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    serde_json::from_str(&line).with_context(|| format!("control socket status: {line:?}"))
}

/// A throw-away PKI in `dir` with certificates for a controller agent `ctl`
/// and switch agents `sw1`..=`swN`.
pub fn agents_pki(dir: &Path, switches: usize) -> quicsdn_lab::pki::Pki {
    let pki = quicsdn_lab::pki::Pki::create(dir).unwrap();
    for name in std::iter::once("ctl".to_string()).chain((1..=switches).map(|i| format!("sw{i}"))) {
        pki.issue(&name).unwrap();
    }
    pki
}

/// Starts one simulated Open vSwitch per `(socket, datapath id)` and waits
/// (60 s at most) until the counting controller has an OpenFlow session from
/// each. Dropping the fleet stops them.
pub fn fleet_all_live(
    controller: &quicsdn_lab::bench::storm::sim::CountingController,
    switches: Vec<(PathBuf, u64)>,
) -> quicsdn_lab::bench::storm::sim::Fleet {
    use quicsdn_lab::bench::storm::sim::{Fleet, OvsTiming};
    let n = switches.len();
    let fleet = Fleet::start(switches, OvsTiming::default()).unwrap();
    controller
        .wait_live(
            n,
            "every switch's OpenFlow session",
            Duration::from_secs(60),
        )
        .unwrap();
    fleet
}

/// The switches connected to the controller agent with control socket
/// `socket`, each with the address its packets come from there.
pub fn connected_switches(
    socket: &Path,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let v = try_control_status(socket)?;
    anyhow::ensure!(v["ok"] == true, "control socket: {v}");
    Ok(v["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["switch"].as_str()?.to_string(),
                c["remote"].as_str().unwrap_or_default().to_string(),
            ))
        })
        .collect())
}

/// Column `name` of a bench CSV row, as a number.
pub fn num(csv: &Csv, row: &[String], name: &str) -> u64 {
    row[csv.col(name)]
        .parse()
        .unwrap_or_else(|_| panic!("{name}: {row:?}"))
}

/// The quick overhead bench over `transports`, writing into `out`.
pub fn quick_overhead_args(out: &Path, prefix: &str, transports: &str) -> OverheadArgs {
    OverheadArgs {
        out: out.to_path_buf(),
        quick: true,
        transports: transports.into(),
        rates: None,
        losses: None,
        rtts: None,
        long_rates: None,
        messages: None,
        agent_args: Vec::new(),
        seed: None,
        prefix: prefix.into(),
        no_plots: false,
    }
}
