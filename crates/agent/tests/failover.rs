//! A switch agent with two controller agents (`--controller A --controller B`,
//! issue 18), on loopback: it uses A; when A shuts down it moves to B and
//! OVS's next connection crosses B; when A is back it moves back to A.

mod support;

use quicsdn_agent::ControllerAgent;
use quicsdn_agent::config::ControllerTarget;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Waits until `check` holds; reaching PATIENCE is a failure.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// OVS connects to the switch agent and says HELLO; the controller behind
/// whichever controller agent carries the session receives it.
async fn hello_crosses(agent: &quicsdn_agent::SwitchAgent, fake: &FakeController) {
    let mut ovs = ovs_connect(agent, "openflow").await;
    let hello = [4u8, 0, 0, 8, 0, 0, 0, 1];
    ovs.write_all(&hello).await.unwrap();
    let mut ctl = fake.accept().await;
    let mut got = [0u8; 8];
    tokio::time::timeout(PATIENCE, ctl.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, hello);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_agent_fails_over_to_the_second_controller_agent_and_back() {
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let services = [format!("openflow={}", fake.target())];
    let a = ControllerAgent::start(controller_config(&pki, &services))
        .await
        .unwrap();
    let b = ControllerAgent::start(controller_config(&pki, &services))
        .await
        .unwrap();
    let a_addr = a.local_addr().unwrap();
    let mut scfg = switch_config(
        pki.issue("sw1"),
        a_addr,
        &["openflow=ptcp:0:127.0.0.1".to_string()],
    );
    scfg.controllers.push(ControllerTarget::new(
        b.local_addr().unwrap().to_string(),
        "ctl",
    ));
    scfg.failback_interval = Duration::from_millis(200);
    let agent = quicsdn_agent::SwitchAgent::start(scfg).await.unwrap();
    assert!(agent.wait_connected(PATIENCE).await);
    assert_eq!(a.switches().await, ["sw1"]);
    assert!(b.switches().await.is_empty());
    hello_crosses(&agent, &fake).await;

    // A goes away: the switch agent moves to B, and OVS's next connection
    // crosses B.
    a.shutdown().await;
    until("the switch at B", async || b.switches().await == ["sw1"]).await;
    hello_crosses(&agent, &fake).await;

    // A is back on its address: the switch agent returns to it.
    // (Its socket is free once the old agent's endpoint task has ended.)
    let mut ccfg = controller_config(&pki, &services);
    ccfg.listen = a_addr;
    let mut a = None;
    until("A's address to be free", async || {
        a = ControllerAgent::start(ccfg.clone()).await.ok();
        a.is_some()
    })
    .await;
    let a = a.unwrap();
    until("the switch back at A", async || {
        a.switches().await == ["sw1"] && b.switches().await.is_empty()
    })
    .await;
    hello_crosses(&agent, &fake).await;
    agent.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
