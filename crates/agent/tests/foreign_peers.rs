//! Foreign and hostile peers against the controller agent: a QUIC client that
//! is not quicsdn (aioquic, from PyPI: `scripts/peers-venv`) with no
//! certificate, a certificate from another CA, an expired one, the wrong ALPN,
//! and a valid certificate followed by streams no quicsdn agent sends; then
//! raw UDP garbage and replayed Initial packets. Each is refused or closed
//! with a log line that says why; another switch's session carries on, and the
//! agent's memory stays flat.

mod support;

use quicsdn_agent::{ControllerAgent, SwitchAgent};
use quicsdn_transport::pki::{self, Validity};
use quicsdn_wire::openflow;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// The agent's memory may grow this much while it refuses everything below
/// (allocator noise and quinn's connection tables; the hostile traffic itself
/// is many times larger).
const RSS_SLACK_KB: u64 = 24 * 1024;

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The aioquic venv's python (`scripts/peers-venv`, which `scripts/test` runs).
fn peer_python() -> PathBuf {
    let root = std::env::var_os("QUICSDN_VENV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv"));
    let python = root.join("peers/bin/python");
    assert!(
        python.exists(),
        "{} missing: run scripts/peers-venv (scripts/test does)",
        python.display()
    );
    python
}

/// Runs the foreign peer (`tests/peers/quic_peer.py`) and returns its report.
async fn foreign_peer(
    addr: SocketAddr,
    ca: &Path,
    cert: Option<(&Path, &Path)>,
    args: &[&str],
) -> Value {
    let mut cmd = tokio::process::Command::new(peer_python());
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/quic_peer.py"))
        .arg("--port")
        .arg(addr.port().to_string())
        .arg("--ca")
        .arg(ca);
    if let Some((c, k)) = cert {
        cmd.arg("--cert").arg(c).arg("--key").arg(k);
    }
    cmd.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("the foreign peer hung")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "foreign peer: {e}\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A legitimate switch `sw-good` with one OpenFlow session through the agents.
struct GoodSwitch {
    agent: SwitchAgent,
    ovs: TcpStream,
    ctl: TcpStream,
    xid: u32,
}

impl GoodSwitch {
    async fn start(pki: &Pki, controller: SocketAddr, fake: &FakeController) -> GoodSwitch {
        let agent = SwitchAgent::start(switch_config(
            pki.issue("sw-good"),
            controller,
            &["openflow=ptcp:0".to_string()],
        ))
        .await
        .unwrap();
        assert!(
            agent.wait_connected(PATIENCE).await,
            "sw-good never connected"
        );
        let ovs = ovs_connect(&agent, "openflow").await;
        let ctl = fake.accept().await;
        let mut s = GoodSwitch {
            agent,
            ovs,
            ctl,
            xid: 0,
        };
        s.echo().await;
        s
    }

    /// One ECHO_REQUEST from OVS to the controller and its reply back.
    async fn echo(&mut self) {
        self.xid += 1;
        let req = openflow::message(4, 2, self.xid, b"still here");
        self.ovs.write_all(&req).await.unwrap();
        assert_eq!(read_exact_len(&mut self.ctl, req.len()).await, req);
        let reply = openflow::message(4, 3, self.xid, b"still here");
        self.ctl.write_all(&reply).await.unwrap();
        assert_eq!(read_exact_len(&mut self.ovs, reply.len()).await, reply);
    }
}

/// sw-good connected once and never lost its connection.
fn never_disconnected(logs: &LogCapture) {
    assert_eq!(
        logs.lines_with(&["switch agent connected", "switch=sw-good"])
            .len(),
        1
    );
    assert!(
        logs.lines_with(&["switch agent disconnected", "switch=sw-good"])
            .is_empty(),
        "{}",
        logs.text()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn foreign_quic_clients_are_refused_and_other_switches_keep_working() {
    let python = peer_python(); // fail first, and clearly, without the venv
    assert!(python.exists());
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let controller = ControllerAgent::start(controller_config(
        &pki,
        &[format!("openflow={}", fake.target())],
    ))
    .await
    .unwrap();
    let addr = controller.local_addr().unwrap();
    let ca = pki.path().join("ca.crt");
    let mut good = GoodSwitch::start(&pki, addr, &fake).await;
    let rss_before = rss_kb();

    // 1. No client certificate: the agent's TLS stack refuses it (mutual TLS
    // is not optional), after the client thinks it has finished (TLS 1.3).
    let r = foreign_peer(addr, &ca, None, &["handshake"]).await;
    assert_eq!(
        r["terminated"]["reason"], "peer sent no certificates",
        "{r}"
    );
    logs.wait_for(&[
        "rejected a switch agent during the handshake",
        "no certificates",
    ])
    .await;
    good.echo().await;

    // 2. A certificate from another CA.
    let other = Pki::new();
    let intruder = other.issue("intruder");
    let r = foreign_peer(
        addr,
        &ca,
        Some((&intruder.cert, &intruder.key)),
        &["handshake"],
    )
    .await;
    assert!(
        r["terminated"]["reason"]
            .as_str()
            .unwrap()
            .contains("BadSignature"),
        "{r}"
    );
    logs.wait_for(&[
        "rejected the switch agent's certificate",
        "peer=intruder",
        "BadSignature",
    ])
    .await;

    // 3. An expired certificate from the right CA.
    let past = Validity {
        not_before: time::OffsetDateTime::now_utc() - time::Duration::days(10),
        not_after: time::OffsetDateTime::now_utc() - time::Duration::days(1),
    };
    pki::issue(pki.path(), "stale", &[], past).unwrap();
    let stale = pki.files("stale");
    let r = foreign_peer(addr, &ca, Some((&stale.cert, &stale.key)), &["handshake"]).await;
    assert!(
        r["terminated"]["reason"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{r}"
    );
    logs.wait_for(&[
        "rejected the switch agent's certificate",
        "peer=stale",
        "certificate expired",
    ])
    .await;

    // 4. A valid certificate, but not quicsdn's ALPN: refused in the handshake
    // with no_application_protocol (RFC 9001 §8.1: QUIC error 0x178).
    let rogue = pki.issue("rogue");
    let r = foreign_peer(
        addr,
        &ca,
        Some((&rogue.cert, &rogue.key)),
        &["--alpn", "h3", "handshake"],
    )
    .await;
    assert_eq!(r["handshake"], false, "{r}");
    assert_eq!(r["terminated"]["error_code"], 0x178, "{r}");
    logs.wait_for(&[
        "rejected a connection during the handshake",
        "does not offer ALPN quicsdn/1",
    ])
    .await;
    good.echo().await;

    // 5. A valid certificate and ALPN, then streams no quicsdn agent sends:
    // each is refused on its own (STOP_SENDING with quicsdn's code) and logged.
    let r = foreign_peer(
        addr,
        &ca,
        Some((&rogue.cert, &rogue.key)),
        &["--streams", "300", "garbage"],
    )
    .await;
    assert_eq!(r["handshake"], true, "{r}");
    let stopped = |k: &str| r["streams"][k]["stop_sending"].as_u64();
    use quicsdn_wire::preamble::code;
    assert_eq!(stopped("http"), Some(code::BAD_PREAMBLE.into()), "{r}");
    assert_eq!(
        stopped("unknown_service"),
        Some(code::UNKNOWN_SERVICE.into()),
        "{r}"
    );
    assert_eq!(stopped("bad_hello"), Some(code::BAD_PREAMBLE.into()), "{r}");
    // A malformed message from the peer agent (not from a local peer) breaks
    // the quicsdn protocol: that session closes with PROTOCOL_VIOLATION.
    assert_eq!(
        stopped("malformed_openflow"),
        Some(code::PROTOCOL_VIOLATION.into()),
        "{r}"
    );
    assert_eq!(
        r["junk_stop_sending"]["5"], 300,
        "every junk stream refused: {r}"
    );
    logs.wait_for(&[
        "refused a stream from the switch agent",
        "switch=rogue",
        "stream starts with 0x47, not a quicsdn stream type",
    ])
    .await;
    logs.wait_for(&[
        "refused a session from the switch agent",
        "switch=rogue",
        "service=telnet",
        "unknown service",
    ])
    .await;
    logs.wait_for(&[
        "refused a stream from the switch agent",
        "switch=rogue",
        "invalid hello",
    ])
    .await;
    logs.wait_for(&[
        "switch=rogue",
        "service=openflow",
        "less than the 8-byte header",
    ])
    .await;
    // The malformed session reached the controller, and was closed there only.
    let mut rogue_session = fake.accept().await;
    let mut rest = Vec::new();
    let n = tokio::time::timeout(PATIENCE, rogue_session.read_to_end(&mut rest))
        .await
        .expect("the rogue session was never closed");
    assert!(
        n.is_err() || rest.is_empty(),
        "the malformed message was delivered: {rest:?}"
    );

    good.echo().await;
    never_disconnected(&logs);
    let grown = rss_kb().saturating_sub(rss_before);
    assert!(grown < RSS_SLACK_KB, "the agent's RSS grew {grown} kB");
    good.agent.shutdown().await;
    controller.shutdown().await;
}

/// Forwards datagrams between a switch agent and the controller agent and
/// keeps the first one the switch agent sent: its Initial packet.
async fn relay(agent: SocketAddr) -> (SocketAddr, Arc<UdpSocket>, Arc<Mutex<Option<Vec<u8>>>>) {
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let addr = front.local_addr().unwrap();
    let first = Arc::new(Mutex::new(None));
    let (b, f) = (back.clone(), first.clone());
    tokio::spawn(async move {
        let mut client = None;
        let (mut up, mut down) = (vec![0u8; 65_536], vec![0u8; 65_536]);
        loop {
            tokio::select! {
                r = front.recv_from(&mut up) => {
                    let (n, from) = r.unwrap();
                    client = Some(from);
                    f.lock().unwrap().get_or_insert_with(|| up[..n].to_vec());
                    let _ = b.send_to(&up[..n], agent).await;
                }
                r = b.recv_from(&mut down) => {
                    let (n, _) = r.unwrap();
                    if let Some(c) = client {
                        let _ = front.send_to(&down[..n], c).await;
                    }
                }
            }
        }
    });
    (addr, back, first)
}

#[tokio::test(flavor = "current_thread")]
async fn raw_udp_garbage_and_replayed_initials_change_nothing() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let dir = tempfile::tempdir().unwrap();
    let control_path = dir.path().join("ctl.sock");
    let mut config = controller_config(&pki, &[format!("openflow={}", fake.target())]);
    config.common.control = Some(control_path.clone());
    let controller = ControllerAgent::start(config).await.unwrap();
    let addr = controller.local_addr().unwrap();
    let (relay_addr, relay_back, initial) = relay(addr).await;
    let mut good = GoodSwitch::start(&pki, relay_addr, &fake).await;
    let initial = initial
        .lock()
        .unwrap()
        .clone()
        .expect("the switch agent's Initial");
    assert!(
        initial[0] & 0xf0 == 0xc0,
        "a long-header Initial (RFC 9000 §17.2.2)"
    );
    let rss_before = rss_kb();

    // Garbage of every size, some of it shaped like long-header packets.
    let attacker = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut rng = Rng::new(17);
    for i in 0..5_000 {
        let len = 1 + rng.below(1500) as usize;
        let mut d: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if i % 3 == 0 {
            d[0] = 0xc0 | (d[0] & 0x0f); // long header, version 1
            if len > 5 {
                d[1..5].copy_from_slice(&[0, 0, 0, 1]);
            }
        }
        attacker.send_to(&d, addr).await.unwrap();
        if i % 500 == 0 {
            good.echo().await;
        }
    }
    // The switch agent's own Initial, replayed from its own address (the
    // connection is past its Initial keys) and from 20 other addresses (each
    // looks like a new client whose handshake can never complete: RFC 9001
    // §5.6 / RFC 9000 §8 — a replayed Initial gains nothing).
    for _ in 0..100 {
        relay_back.send_to(&initial, addr).await.unwrap();
    }
    let mut replayers = Vec::new();
    for _ in 0..20 {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for _ in 0..5 {
            s.send_to(&initial, addr).await.unwrap();
        }
        replayers.push(s);
    }
    good.echo().await;

    // No replay started a handshake: quinn routes an Initial by its
    // destination connection ID to the connection it opened, which is past its
    // Initial keys and drops it; garbage never parses. Admission control saw
    // one connection attempt, sw-good's.
    good.echo().await;
    let status = control(&control_path, r#"{"cmd":"status"}"#).await;
    assert_eq!(status["admission"]["admitted"], 1, "{status}");
    assert_eq!(status["admission"]["in_flight"], 0, "{status}");
    assert!(
        logs.lines_with(&["during the handshake"]).is_empty(),
        "{}",
        logs.text()
    );
    assert_eq!(controller.switches().await, ["sw-good"]);
    good.echo().await;
    never_disconnected(&logs);
    // The agent answered a replayed Initial, but opened nothing locally.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), fake.listener.accept())
            .await
            .is_err(),
        "a replayed Initial reached the controller"
    );
    let grown = rss_kb().saturating_sub(rss_before);
    assert!(grown < RSS_SLACK_KB, "the agent's RSS grew {grown} kB");
    drop(replayers);
    good.agent.shutdown().await;
    controller.shutdown().await;
}
