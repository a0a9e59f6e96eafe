//! The agents speak systemd's notify protocol (sd_notify(3)) as their units'
//! `Type=notify` and `WatchdogSec=` expect, checked on the real binary with a
//! datagram socket standing in for systemd's: `READY=1` once listening,
//! `WATCHDOG=1` twice per `WATCHDOG_USEC`, `RELOADING=1` (with the
//! `MONOTONIC_USEC=` that `Type=notify-reload` wants) then `READY=1` around a
//! SIGHUP, and `STOPPING=1` on SIGTERM before a clean exit.

mod support;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{Agent, BIN};

/// Long enough for a loaded CI machine; every wait ends as soon as its
/// message arrives.
const PATIENCE: Duration = Duration::from_secs(30);

/// The notify socket's next message that contains `wanted`; the messages
/// skipped on the way (watchdog keep-alives) are returned with it.
fn next_with(socket: &UnixDatagram, wanted: &str, log: &Path) -> (String, Vec<String>) {
    let deadline = Instant::now() + PATIENCE;
    let mut skipped = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {wanted:?} within {PATIENCE:?}; got {skipped:?}; agent's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        socket.set_read_timeout(Some(left)).unwrap();
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        if message.lines().any(|l| l == wanted) {
            return (message, skipped);
        }
        skipped.push(message);
    }
}

#[test]
fn the_controller_agent_notifies_readiness_watchdog_reload_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let pki = support::pki(dir.path(), &["ctl"]);
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let log = dir.path().join("agent.log");
    let agent = Agent(
        Command::new(BIN)
            .arg("controller")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--ca")
            .arg(pki.join("ca.crt"))
            .arg("--cert")
            .arg(pki.join("ctl.crt"))
            .arg("--key")
            .arg(pki.join("ctl.key"))
            .args(["--service", "openflow=tcp:127.0.0.1:6653"])
            .env("NOTIFY_SOCKET", &socket_path)
            // A keep-alive every 100 ms.
            .env("WATCHDOG_USEC", "200000")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );

    let (ready, _) = next_with(&socket, "READY=1", &log);
    assert!(
        ready.contains("STATUS=controller agent on 127.0.0.1:"),
        "{ready}"
    );
    // Two keep-alives: the watchdog runs on, not once.
    for _ in 0..2 {
        next_with(&socket, "WATCHDOG=1", &log);
    }

    agent.signal(libc::SIGHUP);
    let (reloading, _) = next_with(&socket, "RELOADING=1", &log);
    assert!(
        reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "{reloading}"
    );
    next_with(&socket, "READY=1", &log);

    agent.signal(libc::SIGTERM);
    next_with(&socket, "STOPPING=1", &log);
    let mut agent = agent;
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        // Polling a child's exit; the agent's own shutdown is what is waited for.
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
