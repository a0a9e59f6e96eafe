//! Shared pieces of the tests that run the real `quicsdn` binary.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_quicsdn");

/// A CA and a certificate for each of `names`, made by `quicsdn pki` in
/// `dir/pki`: `ca.crt`, `NAME.crt`, `NAME.key`.
pub fn pki(dir: &Path, names: &[&str]) -> PathBuf {
    let pki = dir.join("pki");
    let init = ["pki", "init", "--dir"].map(String::from).to_vec();
    let issues = names.iter().map(|n| {
        ["pki", "issue", "--name", n, "--dir"]
            .map(String::from)
            .to_vec()
    });
    for args in std::iter::once(init).chain(issues) {
        let out = Command::new(BIN).args(&args).arg(&pki).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    pki
}

/// A running agent, killed (by its PID) when the test ends either way.
pub struct Agent(pub Child);

impl Agent {
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.0.id()).unwrap();
        // SAFETY: kill(2) on our own child's PID.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `quicsdn ARGS` as `name` of the PKI at `pki` (its `--ca`, `--cert` and
/// `--key`), with `env` set and its log (stderr) written to `log`.
pub fn agent(args: &[&str], pki: &Path, name: &str, env: &[(&str, &Path)], log: &Path) -> Agent {
    Agent(
        Command::new(BIN)
            .args(args)
            .arg("--ca")
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join(format!("{name}.crt")))
            .arg("--key")
            .arg(pki.join(format!("{name}.key")))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// The agents' logs, one after the other, for a failing assertion's message.
pub fn logs<P: AsRef<Path>>(logs: &[P]) -> String {
    logs.iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect()
}

/// `127.0.0.1:PORT` with a UDP port free a moment ago, for a controller
/// agent whose address the switch agent (or its successor) must know.
pub fn free_udp_address() -> String {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().to_string()
}

/// Calls `check` every 20 ms until it returns `Some` (returned) or `deadline`
/// passes: then the test fails, naming `what`, with the agents' `logs`. The
/// interval only paces the checks of real state; it never stands in for one.
pub fn poll_until<T, P: AsRef<Path>>(
    what: &str,
    deadline: Instant,
    agent_logs: &[P],
    mut check: impl FnMut() -> Option<T>,
) -> T {
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} in time; logs:\n{}",
            logs(agent_logs)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
