//! The `QLOGDIR` convention (as in quiche, ngtcp2 and curl): set in the
//! environment of the real binaries, each agent writes its connection's qlog
//! there, named by the switch, with no `--qlog-dir` on the command line.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{Agent, BIN};

const PATIENCE: Duration = Duration::from_secs(30);

fn agent(args: &[&str], pki: &Path, name: &str, qlogdir: &Path, log: &Path) -> Agent {
    Agent(
        Command::new(BIN)
            .args(args)
            .arg("--ca")
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join(format!("{name}.crt")))
            .arg("--key")
            .arg(pki.join(format!("{name}.key")))
            .env("QLOGDIR", qlogdir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// The one `.sqlog` file in `dir` once it is named by switch `sw1` and
/// `role` and holds a received packet (the controller agent names its file
/// by the peer's address until the handshake tells it the switch).
fn switch_named_qlog(dir: &Path, role: &str, logs: &[PathBuf]) -> PathBuf {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        if let [file] = &files[..] {
            let name = file.file_name().unwrap().to_string_lossy();
            if name.starts_with("sw1-")
                && name.ends_with(&format!("-{role}.sqlog"))
                && std::fs::read_to_string(file)
                    .is_ok_and(|t| t.contains("transport:packet_received"))
            {
                return file.clone();
            }
        }
        assert!(
            files.len() <= 1 && Instant::now() < deadline,
            "{role}: no sw1-…-{role}.sqlog alone in {} with a received packet: {files:?}\n{}",
            dir.display(),
            logs.iter()
                .map(|l| std::fs::read_to_string(l).unwrap_or_default())
                .collect::<String>()
        );
        // Polls the file the agent writes as packets pass.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn qlogdir_in_the_environment_turns_qlog_on_for_both_agents() {
    let dir = tempfile::tempdir().unwrap();
    let pki = support::pki(dir.path(), &["ctl", "sw1"]);
    // A free port for the controller agent, which the switch agent is told.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
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
