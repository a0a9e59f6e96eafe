//! A controller agent that goes silent is given up within twice the grace
//! period, even when the switch agent's RTT estimate has grown (a busy controller
//! agent, as after a reconnect storm) and QUIC's own idle timer, never less
//! than three probe timeouts (RFC 9000 §10.1), would wait several times
//! longer (`quicsdn_transport::liveness`; docs/scale.md, "A dead peer after a
//! storm"); one that answers after the grace period but within that limit is
//! kept, and the switch agent logs how late it answered. A connection attempt
//! to the only controller agent waits twice the grace period for its first
//! answer.

mod support;

use quicsdn_agent::{ControllerAgent, SwitchAgent};
use quicsdn_transport::quic::agent_keepalive_for;
use quicsdn_wire::openflow::build;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GRACE: Duration = Duration::from_secs(2);
/// How long the relay holds the controller agent's packets back each time:
/// below the grace period, so the connection lives, and long enough that each
/// time the switch agent's RTT estimate takes a sample of about this much.
const BUSY: Duration = Duration::from_millis(1500);
/// One busy period past the grace period, kept by the estimate the shorter
/// ones leave.
const LATE: Duration = Duration::from_secs(3);

/// What the switch agent's connection has received, from its status.
async fn received_bytes(control_sock: &std::path::Path) -> u64 {
    let status = control(control_sock, r#"{"cmd":"status"}"#).await;
    status["connections"][0]["udp_rx_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no connection: {status}"))
}

/// Returns once the switch agent's connection has received nothing for
/// `span`.
async fn quiet(control_sock: &std::path::Path, span: Duration) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut seen = received_bytes(control_sock).await;
    let mut since = tokio::time::Instant::now();
    while since.elapsed() < span {
        assert!(tokio::time::Instant::now() < deadline, "never quiet");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = received_bytes(control_sock).await;
        if now != seen {
            (seen, since) = (now, tokio::time::Instant::now());
        }
    }
}

#[tokio::test]
async fn a_silent_controller_agent_is_given_up_within_twice_the_grace_period_whatever_the_rtt_estimate()
 {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let mut ccfg = controller_config(&pki, &[format!("openflow={}", fake.target())]);
    ccfg.common.quic.idle_timeout = GRACE;
    ccfg.common.quic.keepalive = agent_keepalive_for(GRACE);
    let controller = ControllerAgent::start(ccfg).await.unwrap();
    let relay = Relay::start(controller.local_addr().unwrap()).await;
    let control_sock = pki.path().join("sw1.sock");
    let mut scfg = switch_config(
        pki.issue("sw1"),
        relay.addr,
        &["openflow=ptcp:0".to_string()],
    );
    scfg.common.quic.idle_timeout = GRACE;
    scfg.common.quic.keepalive = agent_keepalive_for(GRACE);
    scfg.common.control = Some(control_sock.clone());
    // Reconnecting into the relay that holds everything must not hide the loss.
    scfg.max_backoff = Duration::from_secs(30);
    let agent = SwitchAgent::start(scfg).await.unwrap();
    assert!(agent.wait_connected(PATIENCE).await);

    // An OpenFlow session through both agents.
    let mut ovs = ovs_connect(&agent, "openflow").await;
    let hello = build::hello(1);
    ovs.write_all(&hello).await.unwrap();
    let mut ctl = fake.accept().await;
    assert_eq!(read_exact_len(&mut ctl, hello.len()).await, hello);
    let answer = build::hello(2);
    ctl.write_all(&answer).await.unwrap();
    assert_eq!(read_exact_len(&mut ovs, answer.len()).await, answer);

    // A busy controller agent: its packets (the acknowledgements of what OVS
    // sends among them) come 1.5 s late, five times.
    for xid in 0..5 {
        relay.hold.send_replace(true);
        // A message the switch agent forwards (it answers OVS's echo requests
        // itself while the controller is slow).
        let reply = build::features_reply(100 + xid, 1);
        ovs.write_all(&reply).await.unwrap();
        // The delay being emulated, not a wait for readiness.
        tokio::time::sleep(BUSY).await;
        let before = received_bytes(&control_sock).await;
        relay.hold.send_replace(false);
        assert_eq!(read_exact_len(&mut ctl, reply.len()).await, reply);
        // The held packets reach the switch agent before the next hold (the
        // relay would otherwise see only the last of two quick changes).
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while received_bytes(&control_sock).await == before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the held packets never arrived"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(agent.is_connected(), "lost during busy period {xid}");
    }
    let status = control(&control_sock, r#"{"cmd":"status"}"#).await;
    let rtt_ms = status["connections"][0]["rtt_ms"].as_f64().unwrap();
    // On loopback: the busy periods are in it. quinn's idle timer now waits
    // three probe timeouts, each the smoothed RTT plus four times its
    // variation.
    assert!(rtt_ms > 500.0, "RTT estimate {rtt_ms} ms: {status}");

    // Busy for longer than the grace period, within the limit the estimate
    // now allows (nine times it, at most twice the grace period: 4 s): the
    // switch agent keeps the connection and says how late the answer came.
    // First the last busy period's packets settle, so that the switch agent
    // sees its ask in a check of its own, not in one with an arrival (where
    // it may have been what arrived answered, and does not start the wait).
    quiet(&control_sock, 2 * GRACE / 8).await;
    relay.hold.send_replace(true);
    let reply = build::features_reply(200, 1);
    ovs.write_all(&reply).await.unwrap();
    // The delay being emulated, not a wait for readiness.
    tokio::time::sleep(LATE).await;
    relay.hold.send_replace(false);
    assert_eq!(read_exact_len(&mut ctl, reply.len()).await, reply);
    logs.wait_for(&[
        "the controller agent answered",
        "past the grace period of 2.0s",
        "it is busy",
    ])
    .await;
    // Kept: the controller still reaches OVS through the same session.
    let barrier = build::barrier_request(300);
    ctl.write_all(&barrier).await.unwrap();
    assert_eq!(read_exact_len(&mut ovs, barrier.len()).await, barrier);
    assert!(
        logs.lines_with(&["nothing from the"]).is_empty(),
        "{}",
        logs.text()
    );

    // The controller agent falls silent for good. Giving the connection up
    // closes OVS's connection (a 0-RTT reconnect follows at once, so
    // `is_connected` would not show it).
    relay.hold.send_replace(true);
    let silent_from = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, ovs.read_to_end(&mut rest)).await;
    let took = silent_from.elapsed();
    assert!(
        closed.is_ok(),
        "OVS's connection stayed open: {}",
        logs.text()
    );
    // The limit after the switch agent's next keep-alive (it hears nothing
    // after the hold began): three probe timeouts of the inflated estimate,
    // capped at twice the grace period; an eighth of the grace period between
    // checks, and slack for a slow machine. Well short of quinn's idle timer
    // (without the agents' own check this test measured 11.6 s).
    assert!(
        took < agent_keepalive_for(GRACE) + 2 * GRACE + GRACE / 2,
        "given up after {took:?} (RTT estimate {rtt_ms} ms): {}",
        logs.text()
    );
    let said = logs.lines_with(&["nothing from the controller agent", "grace period of 2.0s"]);
    assert!(!said.is_empty(), "{}", logs.text());

    agent.shutdown().await;
    controller.shutdown().await;
}

/// With one controller agent, a switch agent waits twice the grace period for
/// the first answer to a connection attempt (docs/scale.md, "Patience for the
/// first answer"): a controller agent busy with a restart storm queues the
/// attempts it has no handshake permit for, and one given up at the grace
/// period would start again at the queue's tail. Here the controller agent's
/// first answers are held back past the grace period: the attempt still comes
/// up, and it is the only one made. Held back past twice the grace period,
/// another switch agent's attempt is given up then, not before.
#[tokio::test]
async fn an_attempt_waits_twice_the_grace_period_for_its_first_answer() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let ctl_sock = pki.path().join("ctl.sock");
    let mut ccfg = controller_config(&pki, &[format!("openflow={}", fake.target())]);
    ccfg.common.quic.idle_timeout = GRACE;
    ccfg.common.quic.keepalive = agent_keepalive_for(GRACE);
    ccfg.common.control = Some(ctl_sock.clone());
    let controller = ControllerAgent::start(ccfg).await.unwrap();
    let relay = Relay::start(controller.local_addr().unwrap()).await;
    let switch = |name: &str| {
        let mut s = switch_config(
            pki.issue(name),
            relay.addr,
            &["openflow=ptcp:0".to_string()],
        );
        s.common.quic.idle_timeout = GRACE;
        s.common.quic.keepalive = agent_keepalive_for(GRACE);
        s
    };

    relay.hold.send_replace(true);
    let agent = SwitchAgent::start(switch("sw1")).await.unwrap();
    // The controller agent's queue being emulated, not a wait for readiness:
    // past the grace period, leaving 1.5 s of the 4 s for the handshake and
    // the hello on a busy machine.
    tokio::time::sleep(GRACE + GRACE / 4).await;
    assert!(!agent.is_connected());
    relay.hold.send_replace(false);
    assert!(agent.wait_connected(PATIENCE).await, "{}", logs.text());
    let status = control(&ctl_sock, r#"{"cmd":"status"}"#).await;
    assert_eq!(
        status["admission"]["admitted"], 1,
        "one attempt, one handshake: {status}"
    );
    assert!(
        logs.lines_with(&["cannot connect to the controller agent"])
            .is_empty(),
        "{}",
        logs.text()
    );
    agent.shutdown().await;

    // A controller agent that never answers: given up at twice the grace
    // period (4 s).
    relay.hold.send_replace(true);
    let started = tokio::time::Instant::now();
    let agent = SwitchAgent::start(switch("sw2")).await.unwrap();
    logs.wait_for(&["cannot connect to the controller agent", "within 4s"])
        .await;
    let took = started.elapsed();
    assert!(
        took >= 2 * GRACE,
        "given up after {took:?}: {}",
        logs.text()
    );
    agent.shutdown().await;
    controller.shutdown().await;
}
