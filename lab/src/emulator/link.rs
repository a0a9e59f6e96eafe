//! Creating, restarting and destroying an emulated link: TAP devices, addresses, static
//! neighbours, and the forwarder process.
//!
//! See the [module docs of `emulator`](super) for the contract the rest of the lab uses.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::classify::Classifier;
use super::control::LinkControl;
use super::model::{DirSettings, PipeConfig};
use super::sys;
use crate::netns::IfCounters;

/// Kernel queue length of each TAP (frames waiting for the forwarder to read them).
pub const TAP_TXQUEUELEN: &str = "4096";

/// Default directory for control sockets, spec/record files and forwarder logs.
pub const DEFAULT_RUN_DIR: &str = "/run/quicsdn-lab/emulator";

/// Everything needed to create one emulated link between two existing namespaces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Unique link name; names the control socket and the record. `[A-Za-z0-9_.-]`,
    /// at most 32 characters.
    pub name: String,
    pub ns_a: String,
    pub ns_b: String,
    /// TAP device names (at most 15 characters, unique within their namespace).
    pub tap_a: String,
    pub tap_b: String,
    pub addr_a: Ipv4Addr,
    pub addr_b: Ipv4Addr,
    pub prefix_len: u8,
    /// Locally administered MACs; derived from the name by [`LinkSpec::new`].
    pub mac_a: String,
    pub mac_b: String,
    pub mtu: u32,
    /// Settings of the direction from `ns_a` to `ns_b`, and back.
    pub a_to_b: DirSettings,
    pub b_to_a: DirSettings,
    /// Physical bytes per frame (preamble, FCS, gap) for rate serialization and the
    /// default report convention.
    pub phy_overhead: u32,
    /// UDP port classified as QUIC (the quicsdn agents' port).
    pub quic_port: u16,
    /// Most frames held per direction (memory bound; excess is queue-dropped).
    pub max_in_flight: u32,
    /// RNG seed; `None` picks a fresh one per forwarder start.
    pub seed: Option<u64>,
    /// Run the forwarder with SCHED_FIFO so release times hold under CPU load.
    pub realtime: bool,
    /// Control socket, spec, record and log live here.
    pub run_dir: PathBuf,
}

impl LinkSpec {
    /// A link with default settings (no impairment, /30 between the two addresses), TAPs
    /// named `<name>a`/`<name>b` unless the caller overrides `tap_a`/`tap_b`.
    pub fn new(name: &str, ns_a: &str, ns_b: &str, addr_a: Ipv4Addr, addr_b: Ipv4Addr) -> LinkSpec {
        let h = fnv1a(name.as_bytes());
        let mac = |side: u8| {
            format!(
                "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                (h >> 24) as u8,
                (h >> 16) as u8,
                (h >> 8) as u8,
                h as u8,
                side
            )
        };
        LinkSpec {
            name: name.to_string(),
            ns_a: ns_a.to_string(),
            ns_b: ns_b.to_string(),
            tap_a: format!("{name}a"),
            tap_b: format!("{name}b"),
            addr_a,
            addr_b,
            prefix_len: 30,
            mac_a: mac(0x0a),
            mac_b: mac(0x0b),
            mtu: 1500,
            a_to_b: DirSettings::default(),
            b_to_a: DirSettings::default(),
            phy_overhead: 24,
            quic_port: 6653,
            max_in_flight: 16384,
            seed: None,
            realtime: true,
            run_dir: PathBuf::from(DEFAULT_RUN_DIR),
        }
    }

    /// Same settings in both directions.
    pub fn with_settings(mut self, s: DirSettings) -> Self {
        self.a_to_b = s.clone();
        self.b_to_a = s;
        self
    }

    pub fn ctl_path(&self) -> PathBuf {
        ctl_path(&self.run_dir, &self.name)
    }

    pub fn record_path(&self) -> PathBuf {
        record_path(&self.run_dir, &self.name)
    }

    pub fn spec_path(&self) -> PathBuf {
        self.run_dir.join(format!("{}.spec.json", self.name))
    }

    pub fn log_path(&self) -> PathBuf {
        self.run_dir.join(format!("{}.log", self.name))
    }

    pub fn pipe_config(&self) -> PipeConfig {
        PipeConfig {
            classifier: Classifier {
                quic_port: self.quic_port,
                ..Classifier::default()
            },
            phy_overhead: self.phy_overhead,
            max_in_flight: self.max_in_flight,
        }
    }

    pub fn control(&self) -> LinkControl {
        LinkControl::new(&self.name, self.ctl_path())
    }

    /// Checks names, addresses and settings; the error names the link and the field.
    pub fn validate(&self) -> Result<()> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > 32
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            bail!("link name {n:?}: use 1..32 characters of [A-Za-z0-9_.-]");
        }
        for (what, tap) in [("tap_a", &self.tap_a), ("tap_b", &self.tap_b)] {
            if tap.is_empty() || tap.len() > 15 || tap.contains('/') || tap.contains(' ') {
                bail!(
                    "link {n}: {what} {tap:?} is not a valid interface name (1..15 characters; \
                     with default TAP names the link name may have at most 14)"
                );
            }
        }
        if self.ns_a == self.ns_b && self.tap_a == self.tap_b {
            bail!(
                "link {n}: both TAPs are {:?} in namespace {:?}",
                self.tap_a,
                self.ns_a
            );
        }
        if self.addr_a == self.addr_b {
            bail!("link {n}: addr_a and addr_b are both {}", self.addr_a);
        }
        if self.prefix_len == 0 || self.prefix_len > 32 {
            bail!("link {n}: prefix_len {} not in 1..32", self.prefix_len);
        }
        for (what, mac) in [("mac_a", &self.mac_a), ("mac_b", &self.mac_b)] {
            if parse_mac(mac).is_none() {
                bail!("link {n}: {what} {mac:?} is not a MAC address");
            }
        }
        if !(68..=9000).contains(&self.mtu) {
            bail!("link {n}: mtu {} not in 68..9000", self.mtu);
        }
        if self.max_in_flight == 0 {
            bail!("link {n}: max_in_flight must be at least 1");
        }
        self.a_to_b
            .validate()
            .map_err(|e| anyhow::anyhow!("link {n}: a_to_b: {e}"))?;
        self.b_to_a
            .validate()
            .map_err(|e| anyhow::anyhow!("link {n}: b_to_a: {e}"))?;
        Ok(())
    }
}

pub fn ctl_path(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(format!("{name}.sock"))
}

pub fn record_path(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(format!("{name}.json"))
}

/// What is needed to tear a link down, even after the creating process crashed. Written
/// to `<run_dir>/<name>.json` by [`create_link`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkRecord {
    pub name: String,
    pub ns_a: String,
    pub ns_b: String,
    pub tap_a: String,
    pub tap_b: String,
    /// PID of the forwarder process (0 if none is running).
    pub pid: u32,
    pub ctl_path: PathBuf,
    pub run_dir: PathBuf,
}

impl LinkRecord {
    pub fn control(&self) -> LinkControl {
        LinkControl::new(&self.name, &self.ctl_path)
    }

    pub fn load(run_dir: &Path, name: &str) -> Result<LinkRecord> {
        let p = record_path(run_dir, name);
        let s = std::fs::read_to_string(&p).with_context(|| {
            format!(
                "link {name}: no record at {} (not created here?)",
                p.display()
            )
        })?;
        serde_json::from_str(&s)
            .with_context(|| format!("link {name}: corrupt record {}", p.display()))
    }

    fn save(&self) -> Result<()> {
        let p = record_path(&self.run_dir, &self.name);
        write_atomic(&p, &serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("link {}: writing record {}", self.name, p.display()))
    }
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

fn fnv1a(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ x as u32).wrapping_mul(0x0100_0193)
    })
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    for (d, p) in m.iter_mut().zip(parts) {
        if p.len() != 2 {
            return None;
        }
        *d = u8::from_str_radix(p, 16).ok()?;
    }
    // Must be unicast.
    if m[0] & 1 != 0 { None } else { Some(m) }
}

/// Runs `ip` (or another tool) and turns a failure into an error that names the link,
/// the namespace and the command with its stderr.
fn run(link: &str, ns: &str, what: &str, prog: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("link {link}: namespace {ns}: {what}: cannot run {prog}"))?;
    if !out.status.success() {
        bail!(
            "link {link}: namespace {ns}: {what} failed: `{prog} {}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

struct Side<'a> {
    ns: &'a str,
    tap: &'a str,
    mac: &'a str,
    addr: Ipv4Addr,
    peer_addr: Ipv4Addr,
    peer_mac: &'a str,
}

fn setup_side(spec: &LinkSpec, s: &Side) -> Result<()> {
    let l = &spec.name;
    let ns = s.ns;
    if !sys::netns_exists(ns) {
        bail!(
            "link {l}: namespace {ns} does not exist ({} missing; create it with `ip netns add {ns}`)",
            sys::netns_path(ns).display()
        );
    }
    let mtu = spec.mtu.to_string();
    let addr = format!("{}/{}", s.addr, spec.prefix_len);
    let peer = s.peer_addr.to_string();
    run(
        l,
        ns,
        &format!("creating TAP {}", s.tap),
        "ip",
        &["-n", ns, "tuntap", "add", "dev", s.tap, "mode", "tap"],
    )?;
    // IPv6 would add router/neighbour solicitations and MLD reports to the link.
    run(
        l,
        ns,
        &format!("disabling IPv6 on {}", s.tap),
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{}.disable_ipv6=1", s.tap),
        ],
    )?;
    run(
        l,
        ns,
        &format!("configuring {}", s.tap),
        "ip",
        // A longer TAP queue (default 1000) absorbs scheduling hiccups of the forwarder
        // instead of dropping frames in the kernel before the emulator sees them.
        &[
            "-n",
            ns,
            "link",
            "set",
            "dev",
            s.tap,
            "address",
            s.mac,
            "mtu",
            &mtu,
            "txqueuelen",
            TAP_TXQUEUELEN,
        ],
    )?;
    // No qdisc between the stack and the emulator: pfifo_fast would reorder frames by TOS
    // band (OVS marks control traffic DSCP 48) and drop on its own; the TAP's ring
    // (txqueuelen frames) stays the only queue before the emulator.
    run(
        l,
        ns,
        &format!("setting qdisc noqueue on {}", s.tap),
        "tc",
        &[
            "-n", ns, "qdisc", "replace", "dev", s.tap, "root", "noqueue",
        ],
    )?;
    run(
        l,
        ns,
        &format!("adding {addr} to {}", s.tap),
        "ip",
        &["-n", ns, "addr", "add", &addr, "dev", s.tap],
    )?;
    run(
        l,
        ns,
        &format!("setting {} up", s.tap),
        "ip",
        &["-n", ns, "link", "set", "dev", s.tap, "up"],
    )?;
    // Static neighbour: no ARP ever crosses the lossy link.
    run(
        l,
        ns,
        &format!("static neighbour {peer} on {}", s.tap),
        "ip",
        &[
            "-n",
            ns,
            "neigh",
            "replace",
            &peer,
            "lladdr",
            s.peer_mac,
            "dev",
            s.tap,
            "nud",
            "permanent",
        ],
    )?;
    Ok(())
}

/// Creates both TAP devices (persistent, so forwarders can come and go without the
/// connections noticing more than a pause), their addresses and static neighbours.
/// Fails if a TAP of the same name already exists.
pub fn setup_taps(spec: &LinkSpec) -> Result<()> {
    spec.validate()?;
    let a = Side {
        ns: &spec.ns_a,
        tap: &spec.tap_a,
        mac: &spec.mac_a,
        addr: spec.addr_a,
        peer_addr: spec.addr_b,
        peer_mac: &spec.mac_b,
    };
    let b = Side {
        ns: &spec.ns_b,
        tap: &spec.tap_b,
        mac: &spec.mac_b,
        addr: spec.addr_b,
        peer_addr: spec.addr_a,
        peer_mac: &spec.mac_a,
    };
    setup_side(spec, &a)?;
    if let Err(e) = setup_side(spec, &b) {
        let _ = delete_tap(&spec.name, &spec.ns_a, &spec.tap_a);
        let _ = delete_tap(&spec.name, &spec.ns_b, &spec.tap_b);
        return Err(e);
    }
    Ok(())
}

/// Deletes a TAP; `Ok` if it (or its namespace) is already gone.
pub fn delete_tap(link: &str, ns: &str, tap: &str) -> Result<()> {
    if !sys::netns_exists(ns) {
        return Ok(());
    }
    let out = Command::new("ip")
        .args(["-n", ns, "link", "del", "dev", tap])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("link {link}: namespace {ns}: cannot run ip"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || err.contains("Cannot find device") || err.contains("does not exist")
    {
        Ok(())
    } else {
        bail!(
            "link {link}: namespace {ns}: deleting TAP {tap} failed: {}",
            err.trim()
        )
    }
}

/// Path of the running executable that contains the `emulate run` subcommand: the
/// `quicsdn-lab` binary. Tests pass `env!("CARGO_BIN_EXE_quicsdn-lab")` instead.
pub fn default_exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot locate the quicsdn-lab executable")
}

/// Starts the forwarder for an existing pair of TAPs and waits until it is attached to
/// both and serves its control socket. Returns its PID and writes the record. The
/// forwarder runs in its own session: it outlives the caller until destroyed.
pub fn spawn_forwarder(spec: &LinkSpec, exe: &Path) -> Result<LinkRecord> {
    spec.validate()?;
    let l = &spec.name;
    std::fs::create_dir_all(&spec.run_dir)
        .with_context(|| format!("link {l}: creating run dir {}", spec.run_dir.display()))?;
    write_atomic(&spec.spec_path(), &serde_json::to_vec_pretty(spec)?)
        .with_context(|| format!("link {l}: writing {}", spec.spec_path().display()))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(spec.log_path())
        .with_context(|| format!("link {l}: opening log {}", spec.log_path().display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("emulate")
        .arg("run")
        .arg("--spec")
        .arg(spec.spec_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; detaches from the caller's session and
    // process group so the caller's terminal signals don't reach the forwarder.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("link {l}: starting forwarder {}", exe.display()))?;
    let pid = child.id();
    // The forwarder prints one line, "ready", once both TAPs are attached and the control
    // socket listens; anything else (EOF) means it failed, and its log says why.
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        let log = std::fs::read_to_string(spec.log_path()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        bail!(
            "link {l}: forwarder (pid {pid}) did not start; log {}:\n{}",
            spec.log_path().display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    // Attaching gives the TAPs carrier, but the kernel activates their qdisc a moment
    // later (linkwatch); until then frames sent into a TAP are silently dropped. Wait for
    // that, so "created" means "forwarding".
    for (ns, tap) in [(&spec.ns_a, &spec.tap_a), (&spec.ns_b, &spec.tap_b)] {
        if let Err(e) = wait_tap_active(l, ns, tap) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    }
    // Reap the child whenever it exits so it never lingers as a zombie in a long-lived
    // caller (tests, the lab); the PID stays valid for teardown until then.
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    let rec = LinkRecord {
        name: spec.name.clone(),
        ns_a: spec.ns_a.clone(),
        ns_b: spec.ns_b.clone(),
        tap_a: spec.tap_a.clone(),
        tap_b: spec.tap_b.clone(),
        pid,
        ctl_path: spec.ctl_path(),
        run_dir: spec.run_dir.clone(),
    };
    rec.save()?;
    Ok(rec)
}

/// Waits until `ip link` shows the TAP operationally up with its qdisc active (not
/// `noop`). `ip` reads under the same lock the kernel holds while activating, so once it
/// shows both, frames are accepted.
fn wait_tap_active(link: &str, ns: &str, tap: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = String::new();
    while Instant::now() < deadline {
        let out = Command::new("ip")
            .args(["-n", ns, "-o", "link", "show", "dev", tap])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("link {link}: namespace {ns}: cannot run ip"))?;
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        if last.contains("state UP") && !last.contains("qdisc noop") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    bail!(
        "link {link}: namespace {ns}: TAP {tap} did not come up after the forwarder attached: {}",
        last.trim()
    )
}

/// Kernel counters of a TAP (see [`IfCounters`]): `tx_*` are frames the namespace's stack
/// sent into the TAP (`tx_dropped`: dropped before the emulator could read them, e.g. while
/// no forwarder was attached); `rx_*` are frames the emulator wrote.
pub fn tap_kernel_stats(link: &str, ns: &str, tap: &str) -> Result<IfCounters> {
    crate::netns::Netns::named(ns)
        .counters(tap)
        .with_context(|| format!("link {link}: namespace {ns}: reading statistics of {tap}"))
}

/// Creates TAPs and starts the forwarder: the one call to bring a link up.
pub fn create_link(spec: &LinkSpec, exe: &Path) -> Result<LinkRecord> {
    spec.validate()?;
    std::fs::create_dir_all(&spec.run_dir).with_context(|| {
        format!(
            "link {}: creating run dir {}",
            spec.name,
            spec.run_dir.display()
        )
    })?;
    // Record first, so a crash between the steps still leaves something to tear down.
    LinkRecord {
        name: spec.name.clone(),
        ns_a: spec.ns_a.clone(),
        ns_b: spec.ns_b.clone(),
        tap_a: spec.tap_a.clone(),
        tap_b: spec.tap_b.clone(),
        pid: 0,
        ctl_path: spec.ctl_path(),
        run_dir: spec.run_dir.clone(),
    }
    .save()?;
    setup_taps(spec)?;
    match spawn_forwarder(spec, exe) {
        Ok(rec) => Ok(rec),
        Err(e) => {
            let _ = delete_tap(&spec.name, &spec.ns_a, &spec.tap_a);
            let _ = delete_tap(&spec.name, &spec.ns_b, &spec.tap_b);
            let _ = std::fs::remove_file(spec.record_path());
            Err(e)
        }
    }
}

/// True if `pid` is a live forwarder for link `name` (guards against PID reuse).
pub fn is_our_forwarder(pid: u32, name: &str, run_dir: &Path) -> bool {
    if pid == 0 || matches!(sys::process_state(pid), None | Some('Z')) {
        return false;
    }
    let Some(cmd) = sys::process_cmdline(pid) else {
        return false;
    };
    let spec = run_dir.join(format!("{name}.spec.json"));
    cmd.iter().any(|a| a == "emulate")
        && cmd.iter().any(|a| a == "run")
        && cmd.iter().any(|a| Path::new(a) == spec)
}

/// Stops a forwarder by recorded PID: SIGTERM, wait up to 3 s, then SIGKILL. Does nothing
/// if the PID is not (or no longer) this link's forwarder.
pub fn stop_forwarder(rec: &LinkRecord) -> Result<()> {
    if !is_our_forwarder(rec.pid, &rec.name, &rec.run_dir) {
        return Ok(());
    }
    // SAFETY: kill(2) on a PID we verified belongs to this link's forwarder.
    unsafe { libc::kill(rec.pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if !is_our_forwarder(rec.pid, &rec.name, &rec.run_dir) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above.
    unsafe { libc::kill(rec.pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if !is_our_forwarder(rec.pid, &rec.name, &rec.run_dir) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    bail!("link {}: forwarder pid {} does not exit", rec.name, rec.pid)
}

/// Stops the forwarder (PID checked), deletes both TAPs and the link's files (control
/// socket, record, spec and log). Idempotent.
pub fn destroy_link(rec: &LinkRecord) -> Result<()> {
    stop_forwarder(rec)?;
    let ra = delete_tap(&rec.name, &rec.ns_a, &rec.tap_a);
    let rb = delete_tap(&rec.name, &rec.ns_b, &rec.tap_b);
    ra?;
    rb?;
    for ext in ["sock", "json", "spec.json", "log"] {
        let _ = std::fs::remove_file(rec.run_dir.join(format!("{}.{ext}", rec.name)));
    }
    Ok(())
}

/// [`destroy_link`] from the record file; `Ok` if there is no record.
pub fn destroy_link_by_name(run_dir: &Path, name: &str) -> Result<()> {
    if !record_path(run_dir, name).exists() {
        return Ok(());
    }
    destroy_link(&LinkRecord::load(run_dir, name)?)
}

/// Replaces a link's forwarder with one running `spec` (same name and TAPs). The TAPs,
/// addresses and neighbours stay, so TCP/QUIC connections across the link survive; frames
/// in flight in the old forwarder and its counters are lost. Prefer
/// [`LinkControl::set`] for settings changes: it loses nothing.
pub fn restart_forwarder(rec: &LinkRecord, spec: &LinkSpec, exe: &Path) -> Result<LinkRecord> {
    if spec.name != rec.name || spec.tap_a != rec.tap_a || spec.tap_b != rec.tap_b {
        bail!(
            "link {}: restart must keep the name and TAP devices",
            rec.name
        );
    }
    stop_forwarder(rec)?;
    spawn_forwarder(spec, exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_defaults_and_validation() {
        let s = LinkSpec::new(
            "qsdnEx1",
            "nsa",
            "nsb",
            Ipv4Addr::new(10, 1, 0, 1),
            Ipv4Addr::new(10, 1, 0, 2),
        );
        assert_eq!(s.tap_a, "qsdnEx1a");
        assert!(parse_mac(&s.mac_a).is_some());
        assert_ne!(s.mac_a, s.mac_b);
        s.validate().unwrap();
        let long = LinkSpec::new("qsdnE-way-too-long", "a", "b", s.addr_a, s.addr_b);
        let e = long.validate().unwrap_err().to_string();
        assert!(e.contains("qsdnE-way-too-long") && e.contains("15"), "{e}");
        let mut bad = s.clone();
        bad.addr_b = bad.addr_a;
        assert!(bad.validate().is_err());
        let mut bad = s.clone();
        bad.mac_a = "03:00:00:00:00:01".into(); // multicast
        assert!(bad.validate().is_err());
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<LinkSpec>(&json).unwrap(), s);
    }

    #[test]
    fn missing_namespace_is_a_clear_error() {
        let s = LinkSpec::new(
            "qsdnEmiss",
            "qsdnE-no-such-ns-1",
            "qsdnE-no-such-ns-2",
            Ipv4Addr::new(10, 1, 0, 1),
            Ipv4Addr::new(10, 1, 0, 2),
        );
        let e = setup_taps(&s).unwrap_err().to_string();
        assert!(
            e.contains("qsdnEmiss")
                && e.contains("qsdnE-no-such-ns-1")
                && e.contains("does not exist"),
            "{e}"
        );
    }
}
