//! After a crash of the controller agent (SIGKILL: nothing is closed), the
//! agent started in its place tells the switch agents at once that their
//! connections are gone, from the roster its predecessor kept beside the
//! session store, instead of waiting for each switch's next packet.
//! Real binaries on loopback.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};
use support::Agent;

const PATIENCE: Duration = Duration::from_secs(30);

fn agent(args: &[&str], pki: &Path, name: &str, log: &Path) -> Agent {
    support::agent(args, pki, name, &[], log)
}

/// The first line of the file at `path` that contains `wanted`, polled until
/// `deadline`.
fn line_with(path: &Path, wanted: &str, deadline: Instant, logs: &[&Path]) -> String {
    let what = format!("line with {wanted:?} in {}", path.display());
    support::poll_until(&what, deadline, logs, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .find(|l| l.contains(wanted))
            .map(str::to_string)
    })
}

/// Packets the switch agent's connection has sent, from its control socket.
fn sent_packets(control: &Path) -> Option<u64> {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(control).ok()?;
    writeln!(s, r#"{{"cmd":"status"}}"#).ok()?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).ok()?;
    let status: serde_json::Value = serde_json::from_str(&line).ok()?;
    status["connections"][0]["sent_packets"].as_u64()
}

/// Waits until the switch agent's connection has sent nothing for `quiet`
/// (the handshake's and the hello's last packets and acknowledgements are
/// out), so that its next packet is a keep-alive.
fn wait_quiet(control: &Path, quiet: Duration, logs: &[&Path]) {
    let mut last = (None, Instant::now());
    support::poll_until(
        "quiet switch agent connection",
        Instant::now() + PATIENCE,
        logs,
        || {
            let now = sent_packets(control);
            if now.is_none() || now != last.0 {
                last = (now, Instant::now());
                return None;
            }
            (last.1.elapsed() >= quiet).then_some(())
        },
    );
}

#[test]
fn after_a_crash_the_next_controller_agent_resets_the_recorded_switches_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let pki = support::pki(dir.path(), &["ctl", "sw1"]);
    // A free port for the controller agent, which the switch agent is told.
    let listen = support::free_udp_address();
    let store = dir.path().join("sessions");
    let roster = dir.path().join("sessions.peers");
    // Keep-alives far apart on both sides (the idle timeout is the smaller
    // grace period of the two): without the roster the switch agent would
    // send nothing, and so learn nothing, for about 13 s after it last sent.
    // No OVS is connected, so nothing else crosses.
    let quiet = ["--grace", "14s", "--keepalive", "13s"];
    let controller_args = [
        "controller",
        "--listen",
        &listen,
        "--session-store",
        store.to_str().unwrap(),
        quiet[0],
        quiet[1],
        quiet[2],
        quiet[3],
        "--service",
        "openflow=tcp:127.0.0.1:6653",
    ];
    let (ctl1_log, ctl2_log, sw_log) = (
        dir.path().join("ctl1.log"),
        dir.path().join("ctl2.log"),
        dir.path().join("sw.log"),
    );
    let logs = [ctl1_log.as_path(), ctl2_log.as_path(), sw_log.as_path()];
    let control = dir.path().join("sw.sock");
    let first = agent(&controller_args, &pki, "ctl", &ctl1_log);
    let _switch = agent(
        &[
            "switch",
            "--controller",
            &listen,
            "--server-name",
            "ctl",
            quiet[0],
            quiet[1],
            quiet[2],
            quiet[3],
            "--control",
            control.to_str().unwrap(),
            "--service",
            "openflow=ptcp:0:127.0.0.1",
        ],
        &pki,
        "sw1",
        &sw_log,
    );
    // The roster names the switch agent's address once it is written.
    let recorded = line_with(&roster, "127.0.0.1:", Instant::now() + PATIENCE, &logs);
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&roster).unwrap());
    assert_eq!(mode & 0o777, 0o600, "{recorded}");
    wait_quiet(&control, Duration::from_secs(1), &logs);

    // A crash, then a new agent on the same address.
    first.signal(libc::SIGKILL);
    drop(first);
    let restarted = Instant::now();
    let _second = agent(&controller_args, &pki, "ctl", &ctl2_log);
    // Well within the 11 s or more in which the quiet switch agent sends
    // nothing after the crash (its keep-alive is 13 s after its last packet):
    // only the new agent's unprompted reset can end its connection this early.
    let lost = line_with(
        &sw_log,
        "connection to the controller agent lost",
        restarted + Duration::from_secs(8),
        &logs,
    );
    assert!(lost.contains("(reset by peer)"), "{lost}");
    let told = line_with(
        &ctl2_log,
        "the previous agent on this address left behind",
        restarted + PATIENCE,
        &logs,
    );
    assert!(told.contains("recorded=1 resets=1"), "{told}");
    // And it is connected to the new agent.
    line_with(
        &ctl2_log,
        "switch agent connected",
        restarted + PATIENCE,
        &logs,
    );
}
