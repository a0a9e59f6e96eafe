//! The record of everything a lab created: `RUN_DIR/PREFIX/state.json`
//! (default `RUN_DIR` = `/run/quicsdn-lab`).
//!
//! Contract: `up` writes each resource's name into the state **before**
//! creating it, and each process's PID (with its start time) as soon as it
//! runs, saving the file atomically after every step. So whatever point a run
//! crashes at, `down` finds everything it has to remove by recorded name and
//! PID. Nothing is ever found by pattern or killed by name.
//!
//! Every `up`/`down`/`status` of one prefix holds an exclusive lock
//! (`RUN_DIR/PREFIX.lock`, flock) for its whole run, so concurrent commands
//! for the same lab serialise; labs with different prefixes are independent.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::agent_metrics::MetricsEndpoint;
use crate::control_link::{ControlLink, Impairment};
use crate::controller::{ControllerKind, RunningController};
use crate::emulator::link::LinkRecord;
use crate::ovs::Ovs;
use crate::process::ProcRecord;
use crate::transport::Transport;

/// Default directory for lab state.
pub const DEFAULT_RUN_DIR: &str = "/run/quicsdn-lab";

/// Bumped when the state format changes incompatibly.
pub const STATE_VERSION: u32 = 1;

/// The settings a lab was brought up with (compared by a repeated `up`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabSettings {
    pub switches: u32,
    pub hosts_per_switch: u32,
    pub impairment: Impairment,
    pub transport: Transport,
    pub controller: ControllerKind,
    pub openflow_port: u16,
    /// `quic`: the agents' `--streams` (`ordered`, `rr:N`); `None` = their default.
    #[serde(default)]
    pub streams: Option<String>,
    /// `quic`: extra `quicsdn` options for both agents (`--zero-length-cid` goes
    /// to the switch agents only).
    #[serde(default)]
    pub agent_args: Vec<String>,
    /// Make each switch's OVSDB server reachable from the controller namespace
    /// over the transport (see `topology::ovsdb_address`).
    #[serde(default)]
    pub ovsdb: bool,
    /// `flat` (a host on every switch) or `line` (the SDUDP paper's: host A on
    /// the first switch, host B on the last, emulated data links).
    #[serde(default)]
    pub topology: Topology,
    /// `line`: the impairment of every data link, per direction.
    #[serde(default)]
    pub link: Impairment,
    /// `line`: SDUDP engines beside the switches and the path installed by
    /// the controller app `controllers/sdudp_path.py`.
    #[serde(default)]
    pub sdudp: Option<SdudpSettings>,
}

/// The lab's layout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Hosts on every switch, veth data links (the default).
    #[default]
    Flat,
    /// Host A on switch 1, host B on switch N, emulated data links.
    Line,
}

impl std::str::FromStr for Topology {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "flat" => Ok(Topology::Flat),
            "line" => Ok(Topology::Line),
            _ => bail!("unknown topology {s:?} (flat or line)"),
        }
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Topology::Flat => "flat",
            Topology::Line => "line",
        })
    }
}

/// SDUDP on a `line` lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SdudpSettings {
    /// Switches with an engine, ascending; always the two edges (TCP engines),
    /// the others run retransmission engines.
    pub engines: Vec<u32>,
    /// Packet accumulation at the edges.
    pub accumulate: bool,
}

impl SdudpSettings {
    /// Parses `all`, `odd` or a list `1,5,9` for a line of `n` switches.
    pub fn parse_engines(spec: &str, n: u32) -> Result<Vec<u32>> {
        let v: Vec<u32> = match spec {
            "all" => (1..=n).collect(),
            "odd" => (1..=n).filter(|i| i % 2 == 1 || *i == n).collect(),
            list => {
                let mut v = Vec::new();
                for x in list.split(',') {
                    let i: u32 = x.trim().parse().map_err(|_| {
                        anyhow::anyhow!("--engines: {x:?} is not a switch number (all, odd or a list like 1,5,9)")
                    })?;
                    if !(1..=n).contains(&i) {
                        bail!("--engines: switch {i} is not in 1..={n}");
                    }
                    v.push(i);
                }
                v.sort_unstable();
                v.dedup();
                v
            }
        };
        if v.first() != Some(&1) || v.last() != Some(&n) {
            bail!("--engines must include the edges 1 and {n} (they run the TCP engines)");
        }
        Ok(v)
    }
}

/// An SDUDP engine beside a switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRecord {
    /// `sw1`, …
    pub switch: String,
    pub netns: String,
    /// `edge` or `relay`.
    pub role: String,
    pub ip: String,
    pub mac: String,
    /// Its counters, rewritten every 100 ms (JSON).
    pub stats: PathBuf,
    /// `None` until it runs.
    pub proc: Option<ProcRecord>,
}

/// A namespace the lab created (or was about to create).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NsRecord {
    pub name: String,
    /// nsfs inode once created; `None` if the run stopped before that.
    pub inode: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchRecord {
    /// `sw1`, …
    pub name: String,
    pub netns: String,
    pub bridge: String,
    pub datapath_id: u64,
    /// `None` until OVS runs.
    pub ovs: Option<Ovs>,
    /// The OVS controller target, once set.
    pub target: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// `h1-1`, …
    pub name: String,
    pub netns: String,
    pub switch: String,
    pub ip: String,
    pub cidr: String,
    pub mac: String,
    /// Port name on the switch (also its interface name there).
    pub port: String,
    pub ofport: u16,
}

/// A data link between two switches' bridges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataLinkRecord {
    pub a_switch: String,
    pub a_port: String,
    pub a_ofport: u16,
    pub b_switch: String,
    pub b_port: String,
    pub b_ofport: u16,
    /// `line` labs: the emulated link (its forwarder and TAPs) instead of a veth pair.
    #[serde(default)]
    pub emulated: Option<LinkRecord>,
}

/// Everything one lab created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabState {
    pub version: u32,
    pub prefix: String,
    pub settings: LabSettings,
    /// The lab's directory (OVS instances, logs, certificates, this file).
    pub dir: PathBuf,
    /// True once `up` finished.
    pub complete: bool,
    pub ctl_netns: String,
    pub namespaces: Vec<NsRecord>,
    pub switches: Vec<SwitchRecord>,
    pub hosts: Vec<HostRecord>,
    pub data_links: Vec<DataLinkRecord>,
    pub control_links: Vec<ControlLink>,
    pub controller: Option<RunningController>,
    /// The quicsdn agents (`quic` transport): the controller agent first, then
    /// one switch agent per switch.
    #[serde(default)]
    pub agents: Vec<ProcRecord>,
    /// Where the `quic` agents serve their metrics (`agent_metrics`).
    #[serde(default)]
    pub metrics: Vec<MetricsEndpoint>,
    /// The lab's CA directory, for `tls` and `quic`.
    pub pki_dir: Option<PathBuf>,
    /// SDUDP engines (`--sdudp`), by switch.
    #[serde(default)]
    pub engines: Vec<EngineRecord>,
}

/// Checks a lab prefix: a letter, then letters or digits, at most 12 in all
/// (it names namespaces and directories, never interfaces).
pub fn check_prefix(prefix: &str) -> Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 12
        && prefix.starts_with(|c: char| c.is_ascii_alphabetic())
        && prefix.chars().all(|c| c.is_ascii_alphanumeric());
    if !ok {
        bail!("bad prefix {prefix:?}: a letter, then letters or digits, 12 characters at most");
    }
    Ok(())
}

/// The locked state of one prefix. Dropping it releases the lock.
pub struct StateStore {
    pub run_dir: PathBuf,
    pub prefix: String,
    lock: File,
}

impl StateStore {
    /// Takes the prefix's lock (waiting for another command on the same lab).
    pub fn lock(run_dir: &Path, prefix: &str) -> Result<StateStore> {
        check_prefix(prefix)?;
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        let path = run_dir.join(format!("{prefix}.lock"));
        loop {
            let f = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            // SAFETY: flock on a file descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                bail!(
                    "cannot lock {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                );
            }
            // `down` deletes the lock file while holding it: if the file we locked
            // is no longer the one at `path`, lock again.
            let same = std::fs::metadata(&path)
                .map(|m| m.ino() == f.metadata().map(|n| n.ino()).unwrap_or(0))
                .unwrap_or(false);
            if same {
                return Ok(StateStore {
                    run_dir: run_dir.to_path_buf(),
                    prefix: prefix.to_string(),
                    lock: f,
                });
            }
        }
    }

    /// The lab's directory: `RUN_DIR/PREFIX`.
    pub fn lab_dir(&self) -> PathBuf {
        self.run_dir.join(&self.prefix)
    }

    pub fn state_path(&self) -> PathBuf {
        self.lab_dir().join("state.json")
    }

    /// The recorded state, if any.
    pub fn load(&self) -> Result<Option<LabState>> {
        let path = self.state_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let state: LabState = serde_json::from_str(&text).with_context(|| {
            format!(
                "cannot parse {} (written by another version of quicsdn-lab?)",
                path.display()
            )
        })?;
        if state.version != STATE_VERSION {
            bail!(
                "{} has state version {}, this quicsdn-lab reads {STATE_VERSION}",
                path.display(),
                state.version
            );
        }
        Ok(Some(state))
    }

    /// Writes the state atomically (temporary file, fsync, rename).
    pub fn save(&self, state: &LabState) -> Result<()> {
        let dir = self.lab_dir();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let tmp = dir.join("state.json.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(serde_json::to_string_pretty(state)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.state_path())
            .with_context(|| format!("cannot write {}", self.state_path().display()))?;
        Ok(())
    }

    /// Removes the lab's directory (state, logs, OVS files), keeping the lock.
    pub fn remove_dir(&self) -> Result<()> {
        let dir = self.lab_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove {}", dir.display()))?;
        }
        Ok(())
    }

    /// Removes the lab's directory and lock file (the lab is gone). Consumes
    /// the store: the lock is released.
    pub fn remove_all(self) -> Result<()> {
        self.remove_dir()?;
        let _ = std::fs::remove_file(self.run_dir.join(format!("{}.lock", self.prefix)));
        drop(self.lock);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        for ok in ["qsdn", "qsdnT1", "a", "abcdefghijkl"] {
            check_prefix(ok).unwrap();
        }
        for bad in ["", "1abc", "q-s", "q/s", "abcdefghijklm", "qs dn"] {
            assert!(check_prefix(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sdudp_engine_sets() {
        let p = SdudpSettings::parse_engines;
        assert_eq!(p("all", 5).unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(p("odd", 9).unwrap(), [1, 3, 5, 7, 9]);
        // An even line: the far edge runs a TCP engine all the same.
        assert_eq!(p("odd", 6).unwrap(), [1, 3, 5, 6]);
        assert_eq!(p("9,5,1,5", 9).unwrap(), [1, 5, 9]);
        for (bad, why) in [
            ("2,9", "edges"),
            ("1,5", "edges"),
            ("1,10", "not in"),
            ("1,x,9", "not a switch"),
        ] {
            let e = p(bad, 9).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn settings_without_the_line_fields_still_load() {
        // A state file written before `--topology line` existed.
        let old = r#"{"switches":1,"hosts_per_switch":2,"impairment":{"delay":null,"jitter":null,"loss_percent":null,"rate_bps":null},"transport":"quic","controller":"osken","openflow_port":6653}"#;
        let s: LabSettings = serde_json::from_str(old).unwrap();
        assert_eq!(s.topology, Topology::Flat);
        assert!(s.sdudp.is_none() && s.link.is_none());
    }
}
