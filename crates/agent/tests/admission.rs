//! Handshake admission control on loopback. A controller agent that refuses
//! connection attempts (CONNECTION_REFUSED, RFC 9000 §20.1) is up and busy:
//! the switch agent keeps OVS's connection open and retries, and once it is
//! admitted OVS's first message goes through on that same connection. The
//! controller agent reports its admission counters on the control socket.

mod support;

use quicsdn_agent::ControllerAgent;
use quicsdn_agent::SwitchAgent;
use quicsdn_transport::quic::{self, QuicOptions};
use quicsdn_transport::resumption::SessionStore;
use quicsdn_transport::tls::Credentials;
use quicsdn_wire::openflow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Waits until `check` holds (bounded by PATIENCE; reaching it fails the test).
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_refused_switch_agent_keeps_ovs_waiting_and_gets_through_once_admitted() {
    let pki = Pki::new();
    let fake = FakeController::new().await;
    // A busy controller agent: a QUIC endpoint that refuses every attempt.
    let creds = Credentials::load(&pki.files("ctl")).unwrap();
    let busy = quic::server_endpoint(
        "127.0.0.1:0".parse().unwrap(),
        &creds,
        &QuicOptions::default(),
        Arc::new(SessionStore::in_memory(16)),
    )
    .unwrap()
    .0;
    let addr = busy.local_addr().unwrap();
    let refused = Arc::new(AtomicU64::new(0));
    let refuser = tokio::spawn({
        let (busy, refused) = (busy.clone(), refused.clone());
        async move {
            while let Some(incoming) = busy.accept().await {
                incoming.refuse();
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    });

    let mut scfg = switch_config(pki.issue("sw1"), addr, &["openflow=ptcp:0".to_string()]);
    // Ordinary failures would wait 1 s and more; OVS's connection must outlive
    // the refusals below however slowly this machine runs (grace + 1 s).
    scfg.max_backoff = Duration::from_secs(8);
    scfg.common.quic.idle_timeout = Duration::from_secs(14);
    let agent = SwitchAgent::start(scfg).await.unwrap();
    until("the busy controller agent refused the switch agent", || {
        refused.load(Ordering::Relaxed) >= 1
    })
    .await;

    // OVS connects while the controller agent is busy and says HELLO.
    let mut ovs = ovs_connect(&agent, "openflow").await;
    let hello = openflow::build::hello(7);
    ovs.write_all(&hello).await.unwrap();
    // The switch agent keeps asking (a refusal means "busy", not "down").
    let seen = refused.load(Ordering::Relaxed);
    until("another refused attempt", || {
        refused.load(Ordering::Relaxed) >= seen + 2
    })
    .await;
    assert!(!agent.is_connected());

    // The controller agent has room now: the real one, on the same address.
    busy.close(0u32.into(), b"");
    busy.wait_idle().await;
    refuser.await.unwrap();
    drop(busy);
    let control_sock = pki.path().join("ctl.sock");
    let mut ccfg = controller_config(&pki, &[format!("openflow={}", fake.target())]);
    ccfg.listen = addr;
    ccfg.max_handshakes = 1;
    ccfg.common.control = Some(control_sock.clone());
    // quinn's endpoint driver lets go of the port soon after the last handle.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let controller = loop {
        match ControllerAgent::start(ccfg.clone()).await {
            Ok(c) => break c,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("in use"), "{e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };

    // OVS's HELLO, sent on the connection it opened while refused, arrives.
    let mut ctl = fake.accept().await;
    let mut got = vec![0u8; hello.len()];
    tokio::time::timeout(PATIENCE, ctl.read_exact(&mut got))
        .await
        .expect("OVS's HELLO never reached the controller")
        .unwrap();
    assert_eq!(got, hello);
    // And the controller's answer reaches that same OVS connection.
    let answer = openflow::build::hello(8);
    ctl.write_all(&answer).await.unwrap();
    let mut back = vec![0u8; answer.len()];
    tokio::time::timeout(PATIENCE, ovs.read_exact(&mut back))
        .await
        .expect("the controller's HELLO never reached OVS")
        .unwrap();
    assert_eq!(back, answer);

    // The control socket reports admission control.
    let status = control(&control_sock, r#"{"cmd":"status"}"#).await;
    let adm = &status["admission"];
    assert_eq!(adm["max_handshakes"], 1, "{status}");
    assert_eq!(adm["in_flight"], 0, "{status}");
    assert!(adm["admitted"].as_u64().unwrap() >= 1, "{status}");
    assert_eq!(
        status["connections"].as_array().unwrap().len(),
        1,
        "{status}"
    );

    agent.shutdown().await;
    controller.shutdown().await;
}

/// A handshake whose switch agent has gone silent must not keep its permit:
/// in a 10,000-switch restart, attempts that had already aged at the stopping
/// agent were admitted just as their switch agents gave up on them, and 128
/// such handshakes held every permit for the whole idle timeout (6 s in which
/// no switch came back; docs/scale.md). Here one permit and a silent
/// handshake holding it: the next switch agent gets in before the silent
/// handshake's idle timeout only if the silent one lets its permit go.
#[tokio::test]
async fn a_silent_handshake_lets_its_permit_go() {
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let control_sock = pki.path().join("ctl.sock");
    let mut ccfg = controller_config(&pki, &[format!("openflow={}", fake.target())]);
    ccfg.max_handshakes = 1;
    // As long as the agents allow (below OVS's 15 s fail-mode timeout).
    let idle = Duration::from_secs(14);
    ccfg.common.quic.idle_timeout = idle;
    ccfg.common.control = Some(control_sock.clone());
    let controller = ControllerAgent::start(ccfg).await.unwrap();
    let server = controller.local_addr().unwrap();

    // The silent attempt: a real switch agent's, through a relay that holds
    // back every answer of the controller agent, so the handshake never
    // completes.
    let relay = Relay::start(server).await;
    relay.hold.send_replace(true);
    let creds = Credentials::load(&pki.issue("silent")).unwrap();
    // Its transport parameters (in the Initial) offer the same idle timeout:
    // the handshake lives that long at the controller agent unless closed.
    let opts = QuicOptions {
        idle_timeout: idle,
        ..QuicOptions::default()
    };
    let silent = quic::client_endpoint("127.0.0.1:0".parse().unwrap(), &creds, &opts).unwrap();
    let attempt = silent.connect(relay.addr, "controller-agent").unwrap();
    let waiting_attempt = tokio::spawn(attempt);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let status = control(&control_sock, r#"{"cmd":"status"}"#).await;
        if status["admission"]["admitted"] == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first attempt was never admitted: {status}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A live switch agent, admitted once the permit is free.
    let scfg = switch_config(pki.issue("sw1"), server, &["openflow=ptcp:0".to_string()]);
    let agent = SwitchAgent::start(scfg).await.unwrap();
    assert!(
        agent.wait_connected(idle - Duration::from_secs(2)).await,
        "the switch agent got no permit while the silent handshake lived"
    );
    let status = control(&control_sock, r#"{"cmd":"status"}"#).await;
    assert_eq!(status["admission"]["admitted"], 2, "{status}");
    assert!(
        status["admission"]["slow"].as_u64() >= Some(1),
        "the silent handshake is counted as one that gave its permit back: {status}"
    );
    assert_eq!(
        status["connections"].as_array().unwrap().len(),
        1,
        "the silent attempt is no connection: {status}"
    );

    waiting_attempt.abort();
    silent.close(0u32.into(), b"");
    agent.shutdown().await;
    controller.shutdown().await;
}
