//! Several controller targets of one switch (OVS with a master and a slave, or
//! Faucet and Gauge), on loopback with synthetic OVS and controllers: one
//! switch agent per target, each with its own QUIC connection to its own
//! controller agent; or one switch agent carrying every target as a service of
//! its own; and what happens when two switch agents with the same certificate
//! share one controller agent.

mod support;

use quicsdn_agent::{ControllerAgent, SwitchAgent};
use quicsdn_wire::{Framing, openflow};
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Sends `n` distinct messages each way on a session and checks each side got
/// exactly the other's (as a set: the default `safe` mode lets independent
/// messages overtake each other).
async fn roundtrip(ovs: &mut TcpStream, ctl: &mut TcpStream, seed: u64, n: usize) {
    let up = openflow_messages(seed, n);
    let down = openflow_messages(seed + 1, n);
    send_all(ovs, &up).await;
    send_all(ctl, &down).await;
    for (sent, r) in [(up, &mut *ctl), (down, &mut *ovs)] {
        let len = sent.iter().map(Vec::len).sum();
        let mut got = split(Framing::OpenFlow, &read_exact_len(r, len).await);
        let mut sent = sent;
        got.sort();
        sent.sort();
        assert!(
            got == sent,
            "a session delivered other messages than were sent"
        );
    }
}

#[tokio::test]
async fn each_target_has_its_own_connection_to_its_own_controller_agent() {
    let pki = Pki::new();
    let sw1 = pki.issue("sw1");
    let mut targets = Vec::new();
    for _ in 0..2 {
        let fake = FakeController::new().await;
        let controller = ControllerAgent::start(controller_config(
            &pki,
            &[format!("openflow={}", fake.target())],
        ))
        .await
        .unwrap();
        // The same switch, the same certificate: a switch agent per target.
        let agent = SwitchAgent::start(switch_config(
            sw1.clone(),
            controller.local_addr().unwrap(),
            &s(&["openflow=ptcp:0"]),
        ))
        .await
        .unwrap();
        assert!(agent.wait_connected(PATIENCE).await);
        targets.push((fake, controller, agent));
    }
    // Each controller agent sees the switch once; the connections are distinct.
    for (_, controller, _) in &targets {
        assert_eq!(controller.switches().await, ["sw1"]);
    }
    let local: Vec<_> = targets
        .iter()
        .map(|(_, _, a)| a.local_addr().unwrap())
        .collect();
    assert_ne!(local[0], local[1]);

    // OVS connects to both; each session reaches its own controller only.
    let mut sessions = Vec::new();
    for (i, (fake, _, agent)) in targets.iter().enumerate() {
        let mut ovs = ovs_connect(agent, "openflow").await;
        let mut ctl = fake.accept().await;
        roundtrip(&mut ovs, &mut ctl, 10 * i as u64, 50).await;
        sessions.push((ovs, ctl));
    }

    // Losing one controller agent closes only that target's OVS connection.
    let (fake_b, controller_b, agent_b) = targets.pop().unwrap();
    let (_, controller_a, agent_a) = targets.pop().unwrap();
    let (mut ovs_b, mut ctl_b) = sessions.pop().unwrap();
    let (mut ovs_a, _ctl_a) = sessions.pop().unwrap();
    controller_a.shutdown().await;
    let _ = read_to_close(&mut ovs_a).await;
    assert!(!agent_a.is_connected());
    assert!(agent_b.is_connected());
    roundtrip(&mut ovs_b, &mut ctl_b, 99, 50).await;
    assert_eq!(controller_b.switches().await, ["sw1"]);
    drop((fake_b, ovs_b, ctl_b));
    agent_a.shutdown().await;
    agent_b.shutdown().await;
    controller_b.shutdown().await;
}

#[tokio::test]
async fn one_switch_agent_carries_two_targets_as_two_services_of_one_connection() {
    let pki = Pki::new();
    let master = FakeController::new().await;
    let gauge = FakeController::new().await;
    let (controller, agent) = pair(
        &pki,
        "sw1",
        &[
            format!("openflow={}", master.target()),
            format!("gauge:openflow={}", gauge.target()),
        ],
        &s(&["openflow=ptcp:0", "gauge:openflow=ptcp:0"]),
        |_, _| {},
    )
    .await;
    let mut a = ovs_connect(&agent, "openflow").await;
    let mut a_ctl = master.accept().await;
    let mut b = ovs_connect(&agent, "gauge").await;
    let mut b_ctl = gauge.accept().await;
    roundtrip(&mut a, &mut a_ctl, 1, 50).await;
    roundtrip(&mut b, &mut b_ctl, 3, 50).await;
    // One connection: the controller agent knows the switch once.
    assert_eq!(controller.switches().await, ["sw1"]);
    // Closing one target's connection leaves the other's.
    drop(a);
    let _ = read_to_close(&mut a_ctl).await;
    roundtrip(&mut b, &mut b_ctl, 5, 50).await;
    agent.shutdown().await;
    controller.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn two_switch_agents_with_one_certificate_at_one_controller_agent_say_why_they_flap() {
    let (logs, _guard) = LogCapture::install();
    let pki = Pki::new();
    let fake = FakeController::new().await;
    let services = [format!("openflow={}", fake.target())];
    let (controller, first) =
        pair(&pki, "sw1", &services, &s(&["openflow=ptcp:0"]), |_, _| {}).await;
    let mut ovs = ovs_connect(&first, "openflow").await;
    ovs.write_all(&openflow::message(4, 0, 1, &[]))
        .await
        .unwrap();
    let _ctl = fake.accept().await;

    // A second agent with the same certificate replaces the first's connection
    // (one connection per switch identity), which closes OVS's session.
    let second = SwitchAgent::start(switch_config(
        pki.files("sw1"),
        controller.local_addr().unwrap(),
        &s(&["openflow=ptcp:0"]),
    ))
    .await
    .unwrap();
    logs.wait_for(&["replacing the switch's older connection", "switch=sw1"])
        .await;
    let _ = read_to_close(&mut ovs).await;
    // The replaced agent says what is wrong and how to fix it.
    let line = logs
        .wait_for(&["ERROR", "another switch agent with the same certificate"])
        .await;
    assert!(line.contains("its own certificate") && line.contains("services of one switch agent"));
    first.shutdown().await;
    second.shutdown().await;
    controller.shutdown().await;
}
