//! Processes the lab starts, recorded so that they can be stopped later by PID,
//! even by another `quicsdn-lab` invocation after a crash.
//!
//! A [`ProcRecord`] stores the PID together with the kernel's start time of
//! that process (`/proc/PID/stat`, field 22). A record only ever matches the
//! process it was taken from: if the PID has been reused, [`ProcRecord::is_alive`]
//! is false and [`ProcRecord::terminate`] sends nothing. The lab never kills by
//! name.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::cmd::describe;
use crate::wait::poll_until;

/// A process the lab started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecord {
    /// What it is, for messages (e.g. `ovs-vswitchd sw1`).
    pub name: String,
    pub pid: u32,
    /// Start time in clock ticks since boot, as in `/proc/PID/stat`.
    pub start_time: u64,
}

/// `(state, start_time)` of a live PID, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    stat_with_parent(pid).map(|(state, start, _)| (state, start))
}

/// `(state, start_time, parent PID)` of a live PID, from `/proc/PID/stat`.
fn stat_with_parent(pid: u32) -> Option<(char, u64, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), fields[1] field 4 (ppid); field 22
    // (starttime) is fields[19].
    let state = fields.first()?.chars().next()?;
    let parent = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start, parent))
}

impl ProcRecord {
    /// Records the running process `pid`.
    pub fn capture(name: impl Into<String>, pid: u32) -> Result<ProcRecord> {
        let name = name.into();
        let (_, start_time) = stat(pid).ok_or_else(|| anyhow!("{name}: no process {pid}"))?;
        Ok(ProcRecord {
            name,
            pid,
            start_time,
        })
    }

    /// Records the process whose PID an OVS-style pidfile holds.
    pub fn from_pidfile(name: impl Into<String>, pidfile: &Path) -> Result<ProcRecord> {
        let name = name.into();
        let text = std::fs::read_to_string(pidfile)
            .with_context(|| format!("{name}: cannot read pidfile {}", pidfile.display()))?;
        let pid = text
            .trim()
            .parse()
            .with_context(|| format!("{name}: bad pidfile {}", pidfile.display()))?;
        ProcRecord::capture(name, pid)
    }

    /// True while this very process runs (a zombie counts as gone).
    pub fn is_alive(&self) -> bool {
        matches!(stat(self.pid), Some((state, start)) if start == self.start_time && state != 'Z')
    }

    fn signal(&self, sig: libc::c_int) {
        if self.is_alive() {
            // SAFETY: kill has no memory-safety preconditions; the start-time check
            // above makes sure the PID is still the recorded process.
            unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        }
    }

    /// Sends SIGHUP (the agents read their certificate files again). Does
    /// nothing if the process is gone.
    pub fn hangup(&self) {
        self.signal(libc::SIGHUP);
    }

    /// Stops the process: SIGTERM, then SIGKILL if it has not exited within
    /// `grace`. Ok when it is gone (or was already gone).
    pub fn terminate(&self, grace: Duration) -> Result<()> {
        if !self.is_alive() {
            return Ok(());
        }
        self.signal(libc::SIGTERM);
        let gone = || -> Result<Option<()>> { Ok((!self.is_alive()).then_some(())) };
        if poll_until(&format!("{} to exit", self.name), grace, gone).is_ok() {
            return Ok(());
        }
        self.kill()
    }

    /// Stops the process with SIGKILL, as a crash would, and waits until it is
    /// gone. Ok when it is gone (or was already gone).
    pub fn kill(&self) -> Result<()> {
        self.signal(libc::SIGKILL);
        poll_until(
            &format!("{} (pid {}) to die after SIGKILL", self.name, self.pid),
            Duration::from_secs(5),
            || Ok((!self.is_alive()).then_some(())),
        )
    }

    /// The live children of this process (a supervisor's workers), recorded
    /// so that they can be stopped should the supervisor not stop them.
    pub fn children(&self) -> Vec<ProcRecord> {
        if !self.is_alive() {
            return Vec::new();
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Some((state, start_time, parent)) = stat_with_parent(pid)
                && parent == self.pid
                && state != 'Z'
            {
                found.push(ProcRecord {
                    name: format!("{} child {pid}", self.name),
                    pid,
                    start_time,
                });
            }
        }
        found.sort_by_key(|p| p.pid);
        found
    }
}

/// Starts `cmd` in the background as a long-running service: standard input
/// closed, standard output and error appended to `log`, in its own process
/// group (so a Ctrl-C aimed at `quicsdn-lab` does not reach it).
///
/// The child is reaped by a detached thread, so a service that exits while this
/// process lives does not linger as a zombie; when this process exits first,
/// the service is re-parented and keeps running. Stop it with
/// [`ProcRecord::terminate`].
pub fn spawn_service(name: &str, cmd: &mut Command, log: &Path) -> Result<ProcRecord> {
    use std::os::unix::process::CommandExt;
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open log {}", log.display()))?;
    let err = out.try_clone()?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {name}: `{}`", describe(cmd)))?;
    let pid = child.id();
    let record = ProcRecord::capture(name, pid);
    std::thread::spawn(move || child.wait());
    match record {
        Ok(r) => Ok(r),
        Err(_) => bail!(
            "{name} exited at once: `{}`; see {}",
            describe(cmd),
            log.display()
        ),
    }
}

/// The last `n` lines of a log file, for error messages.
pub fn log_tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_match_only_their_process() {
        let me = ProcRecord::capture("test", std::process::id()).unwrap();
        assert!(me.is_alive());
        let reused = ProcRecord {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!reused.is_alive(), "a different start time must not match");
    }

    #[test]
    fn terminate_stops_a_service() {
        let dir = std::env::temp_dir().join(format!("qsdn-proc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleep.log");
        let p = spawn_service("sleep", Command::new("sleep").arg("60"), &log).unwrap();
        assert!(p.is_alive());
        p.terminate(Duration::from_secs(5)).unwrap();
        assert!(!p.is_alive());
        p.terminate(Duration::from_secs(5)).unwrap(); // idempotent
        std::fs::remove_dir_all(dir).unwrap();
    }
}
