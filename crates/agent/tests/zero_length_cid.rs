//! Zero-length connection IDs on the switch side (the default), on loopback:
//! a switch agent that reconnects to a restarted controller agent while its
//! previous connection still drains keeps the new connection after the old
//! one is gone. quinn routes packets with a zero-length connection ID by the
//! sender's address, and forgets that address when a connection ends, so on
//! one endpoint the old connection's end cut the new one off (the storm bench
//! saw 40 of 50 switch agents need a second connection); the switch agent
//! gives the new connection a UDP port of its own. The case made here: a
//! rejected 0-RTT attempt, closed and replaced at once.

mod support;

use quicsdn_wire::openflow::message;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "current_thread")]
async fn a_reconnect_while_the_old_connection_drains_keeps_the_new_connection() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let services = [format!("openflow={}", fake.target())];
    let (controller, agent) = pair(
        &pki,
        "sw1",
        &services,
        &["openflow=ptcp:0:127.0.0.1".to_string()],
        |_, s| s.common.quic.zero_length_cid = true,
    )
    .await;
    let addr = controller.local_addr().unwrap();
    let echo = |xid| message(4, 2, xid, &[]);
    let reply = |xid| message(4, 3, xid, &[]);

    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&echo(1)).await.unwrap();
    let mut ctl = fake.accept().await;
    assert_eq!(read_exact_len(&mut ctl, 8).await, echo(1));
    // The switch agent reconnects at once only after a connection that lived
    // more than 2 s (a shorter one waits out a backoff, and the old
    // connection has drained by then): this is that precondition, not a
    // readiness wait.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    ctl.write_all(&reply(1)).await.unwrap();
    assert_eq!(read_exact_len(&mut ovs, 8).await, reply(1));

    // The controller agent closes the connection and comes back on the same
    // address at once, without the session the switch agent's ticket names
    // (no --session-store): it rejects the switch agent's 0-RTT attempt, which
    // the switch agent closes (RFC 9000 §10.2.1: it lingers for three probe
    // timeouts) and replaces at once by a full handshake to the same address.
    controller.shutdown().await;
    let mut eof = [0u8; 1];
    let n = tokio::time::timeout(PATIENCE, ovs.read(&mut eof)).await;
    assert!(matches!(n, Ok(Ok(0) | Err(_))), "OVS's connection closed");
    let controller = controller_agent_at(&pki, &services, addr).await;
    assert!(agent.wait_connected(PATIENCE).await, "{}", logs.text());
    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&echo(2)).await.unwrap();
    let mut ctl = fake.accept().await;
    assert_eq!(read_exact_len(&mut ctl, 8).await, echo(2));
    ctl.write_all(&reply(2)).await.unwrap();
    assert_eq!(read_exact_len(&mut ovs, 8).await, reply(2));
    let lost = |logs: &LogCapture| {
        logs.text()
            .matches("connection to the controller agent lost")
            .count()
    };
    let lost_before = lost(&logs);

    // The rejected connection's closing period ends within three probe
    // timeouts (well under 1 s on loopback). Without an endpoint of its own
    // the new connection then received nothing more from the controller
    // agent, and this round trip failed until the grace period ran out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ovs.write_all(&echo(3)).await.unwrap();
    assert_eq!(read_exact_len(&mut ctl, 8).await, echo(3));
    ctl.write_all(&reply(3)).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(3), read_exact_len(&mut ovs, 8)).await;
    assert_eq!(answer.ok(), Some(reply(3)), "{}", logs.text());
    assert_eq!(lost(&logs), lost_before, "{}", logs.text());

    agent.shutdown().await;
    controller.shutdown().await;
}
