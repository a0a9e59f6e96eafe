//! The `QLOGDIR` convention (as in quiche, ngtcp2 and curl): set in the
//! environment of the real binaries, each agent writes its connection's qlog
//! there, named by the switch, with no `--qlog-dir` on the command line.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::Agent;

const PATIENCE: Duration = Duration::from_secs(30);

fn agent(args: &[&str], pki: &Path, name: &str, qlogdir: &Path, log: &Path) -> Agent {
    support::agent(args, pki, name, &[("QLOGDIR", qlogdir)], log)
}

/// The one `.sqlog` file in `dir` once it is named by switch `sw1` and
/// `role` and holds a received packet (the controller agent names its file
/// by the peer's address until the handshake tells it the switch).
fn switch_named_qlog(dir: &Path, role: &str, logs: &[PathBuf]) -> PathBuf {
    let what = format!(
        "sw1-…-{role}.sqlog with a received packet in {}",
        dir.display()
    );
    support::poll_until(&what, Instant::now() + PATIENCE, logs, || {
        let files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(
            files.len() <= 1,
            "{role}: more than one qlog in {}: {files:?}",
            dir.display()
        );
        let [file] = &files[..] else {
            return None;
        };
        let name = file.file_name().unwrap().to_string_lossy();
        (name.starts_with("sw1-")
            && name.ends_with(&format!("-{role}.sqlog"))
            && std::fs::read_to_string(file).is_ok_and(|t| t.contains("transport:packet_received")))
        .then(|| file.clone())
    })
}

#[test]
fn qlogdir_in_the_environment_turns_qlog_on_for_both_agents() {
    let dir = tempfile::tempdir().unwrap();
    let pki = support::pki(dir.path(), &["ctl", "sw1"]);
    // A free port for the controller agent, which the switch agent is told.
    let listen = support::free_udp_address();
    let (ctl_dir, sw_dir) = (dir.path().join("ctl"), dir.path().join("sw"));
    let logs = [dir.path().join("ctl.log"), dir.path().join("sw.log")];
    let _controller = agent(
        &[
            "controller",
            "--listen",
            &listen,
            "--service",
            "openflow=tcp:127.0.0.1:6653",
        ],
        &pki,
        "ctl",
        &ctl_dir,
        &logs[0],
    );
    let _switch = agent(
        &[
            "switch",
            "--controller",
            &listen,
            "--server-name",
            "ctl",
            "--service",
            "openflow=ptcp:0:127.0.0.1",
        ],
        &pki,
        "sw1",
        &sw_dir,
        &logs[1],
    );
    for (dir, role) in [(&sw_dir, "switch"), (&ctl_dir, "controller")] {
        switch_named_qlog(dir, role, &logs);
    }
}
