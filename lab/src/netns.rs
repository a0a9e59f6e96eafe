//! Named network namespaces (`ip netns`) and veth pairs between them.
//!
//! Contract: the lab creates **every** interface directly inside one of its own
//! namespaces (`ip link add … netns A type veth peer … netns B`), never in the
//! root namespace. Interface names therefore only need to be unique per
//! namespace (they stay short: ≤15 characters, e.g. `eth0`, `h1-2`, `sw3`,
//! `ctl`), labs with different prefixes never collide, and deleting a lab's
//! namespaces deletes all of its interfaces.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::cmd::{run, run_args};
use crate::process::ProcRecord;

/// Linux's limit on interface names (IFNAMSIZ - 1).
pub const MAX_IFNAME: usize = 15;

/// A named network namespace (`/run/netns/NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Netns {
    pub name: String,
}

fn check_ifname(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > MAX_IFNAME
        || name.contains(['/', ' ', ':'])
        || name == "."
        || name == ".."
    {
        bail!("bad interface name {name:?} (1 to {MAX_IFNAME} characters, no '/', ':' or spaces)");
    }
    Ok(())
}

impl Netns {
    /// A handle on a namespace by name (it need not exist).
    pub fn named(name: impl Into<String>) -> Netns {
        Netns { name: name.into() }
    }

    /// True when `/run/netns/NAME` exists.
    pub fn exists(name: &str) -> bool {
        Path::new("/run/netns").join(name).exists()
    }

    /// The namespace's identity: the inode of its nsfs file. Lets a later
    /// `down` tell the namespace it created from a different one of the same name.
    pub fn inode(name: &str) -> Option<u64> {
        std::fs::metadata(Path::new("/run/netns").join(name))
            .ok()
            .map(|m| m.ino())
    }

    /// Creates the namespace and brings its loopback up. Fails if it already exists.
    pub fn create(name: &str) -> Result<Netns> {
        if name.is_empty() || name.contains(['/', ' ']) {
            bail!("bad namespace name {name:?}");
        }
        if Netns::exists(name) {
            bail!("network namespace {name} already exists");
        }
        run_args("ip", &["netns", "add", name])?;
        let ns = Netns::named(name);
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip netns exec NAME program`: a command that runs inside the namespace
    /// (add arguments, environment, then run or spawn it).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Runs `args[0] args[1..]` inside the namespace; returns standard output.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let (program, rest) = args.split_first().context("empty command")?;
        run(self.command(program).args(rest))
    }

    /// `ip -n NAME args…`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut c = Command::new("ip");
        c.args(["-n", &self.name]).args(args);
        run(&mut c)
    }

    /// Sets a sysctl inside the namespace (`net.*` keys are per namespace).
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")])?;
        Ok(())
    }

    /// Turns IPv6 off for every interface created afterwards, so hosts send no
    /// router solicitations, MLD or DAD frames that would only add noise to the
    /// switches' flow tables and the control channel.
    pub fn disable_ipv6(&self) -> Result<()> {
        self.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        self.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
    }

    /// Adds `cidr` (e.g. `10.0.1.1/16`) to `ifname`.
    pub fn add_addr(&self, ifname: &str, cidr: &str) -> Result<()> {
        self.ip(&["addr", "add", cidr, "dev", ifname])?;
        Ok(())
    }

    /// Brings `ifname` up.
    pub fn link_up(&self, ifname: &str) -> Result<()> {
        self.ip(&["link", "set", "dev", ifname, "up"])?;
        Ok(())
    }

    /// Turns transmit checksum offload off on `ifname`. Needed on the host side
    /// of a veth whose peer is an OVS userspace-datapath port: otherwise the
    /// host sends TCP/UDP with partial checksums that nobody completes.
    pub fn tx_checksum_off(&self, ifname: &str) -> Result<()> {
        self.exec(&["ethtool", "-K", ifname, "tx", "off"])?;
        Ok(())
    }

    /// Kernel counters of `ifname`.
    pub fn counters(&self, ifname: &str) -> Result<IfCounters> {
        let out = self.ip(&["-s", "-j", "link", "show", "dev", ifname])?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .with_context(|| format!("cannot parse `ip -s -j link` output for {ifname}"))?;
        let s = &v[0]["stats64"];
        let n = |dir: &str, what: &str| s[dir][what].as_u64().unwrap_or(0);
        Ok(IfCounters {
            rx_bytes: n("rx", "bytes"),
            rx_packets: n("rx", "packets"),
            rx_dropped: n("rx", "dropped"),
            tx_bytes: n("tx", "bytes"),
            tx_packets: n("tx", "packets"),
            tx_dropped: n("tx", "dropped"),
        })
    }

    /// True when something inside the namespace listens on TCP `port`.
    pub fn tcp_listening(&self, port: u16) -> Result<bool> {
        let out = self.exec(&["ss", "-Hltn", &format!("sport = :{port}")])?;
        Ok(!out.trim().is_empty())
    }

    /// PIDs of every process inside the namespace (`ip netns pids`).
    pub fn pids(&self) -> Result<Vec<u32>> {
        let out = run_args("ip", &["netns", "pids", &self.name])?;
        Ok(out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// Stops every process left in the namespace (SIGTERM, then SIGKILL after
    /// `grace`). Only for namespaces the lab created: whatever runs there is the lab's.
    pub fn kill_all(&self, grace: Duration) -> Result<()> {
        let procs: Vec<ProcRecord> = self
            .pids()?
            .into_iter()
            .filter_map(|pid| ProcRecord::capture(format!("pid {pid} in {}", self.name), pid).ok())
            .collect();
        // Signal all first, then wait, so the grace periods run in parallel.
        for p in &procs {
            // SAFETY: plain kill(2) of a PID just read from this namespace.
            unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGTERM) };
        }
        for p in &procs {
            p.terminate(grace)?;
        }
        Ok(())
    }

    /// Deletes the namespace (and with it every interface inside). Idempotent.
    pub fn delete(&self) -> Result<()> {
        if Netns::exists(&self.name) {
            run_args("ip", &["netns", "del", &self.name])?;
        }
        Ok(())
    }
}

/// Interface counters as the kernel keeps them: Ethernet frames with their
/// 14-byte header, without FCS, preamble or inter-frame gap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfCounters {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    /// For a TAP: frames the stack sent that the kernel dropped before the
    /// reading process (e.g. the link emulator) took them.
    pub tx_dropped: u64,
}

/// One end of a veth pair: an interface name inside a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VethEnd {
    pub netns: String,
    pub ifname: String,
    /// A fixed MAC address, or `None` for a random one.
    pub mac: Option<String>,
}

impl VethEnd {
    pub fn new(netns: &Netns, ifname: &str) -> VethEnd {
        VethEnd {
            netns: netns.name.clone(),
            ifname: ifname.to_string(),
            mac: None,
        }
    }

    pub fn with_mac(mut self, mac: &str) -> VethEnd {
        self.mac = Some(mac.to_string());
        self
    }
}

/// Creates a veth pair with `a` and `b` born directly inside their namespaces
/// (never in the root namespace), both left down.
pub fn create_veth(a: &VethEnd, b: &VethEnd) -> Result<()> {
    check_ifname(&a.ifname)?;
    check_ifname(&b.ifname)?;
    let mut c = Command::new("ip");
    c.args(["link", "add", &a.ifname, "netns", &a.netns]);
    if let Some(mac) = &a.mac {
        c.args(["address", mac]);
    }
    c.args(["type", "veth", "peer", "name", &b.ifname, "netns", &b.netns]);
    if let Some(mac) = &b.mac {
        c.args(["address", mac]);
    }
    run(&mut c)?;
    Ok(())
}
