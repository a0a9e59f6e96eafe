//! Reconnects and outages with real parts: Open vSwitch 3.1 with two hosts, the
//! os-ken L2 learning app, the `quicsdn` agents and an emulated control link
//! whose directions can be cut separately. Needs root.
//!
//! * After a restart of the controller agent, the switch agent resumes in 0-RTT
//!   from the agent's session store; with the controller agent's answers held
//!   back, OVS's session starts on 0-RTT alone and only replay-safe messages
//!   cross before the handshake completes.
//! * The grace period: an outage shorter than it costs a stall and no
//!   reconnect; a longer one makes the switch agent close OVS's connection,
//!   before OVS's own inactivity probe would have, and OVS comes back when the
//!   path does.
//! * After a crash of the controller agent its successor resets the old
//!   connection at once, and OVS reconnects through a new one.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::osken_bed::{Bed, PATIENCE};
use common::*;
use quicsdn_lab::wait::poll_until;

/// The first connection in an agent's `status` answer.
fn connection(socket: &Path) -> serde_json::Value {
    control_status(socket)["connections"][0].clone()
}

#[test]
fn after_a_controller_agent_restart_ovs_resumes_in_0rtt_with_only_replay_safe_messages_early() {
    let _s = serial();
    require_root();
    // 20 ms each way; a grace period long enough to hold through the cut below.
    let mut bed = Bed::up("qsdnZ1", Duration::from_millis(20), &["--grace=10s"]);
    bed.ping_ok();
    let first = connection(&bed.switch_control());
    assert_eq!(first["zero_rtt"], false, "no ticket yet: {first}");
    let connections_before = bed.ovs_connections();

    // Restart the controller agent while the link is down, so the switch agent
    // learns of it only when its grace period ends, and its first attempt
    // afterwards reaches the new agent. (After a graceful close it would
    // reconnect at once and may race the new agent's start: 0-RTT data sent
    // before anyone listens is recovered only once the handshake completes,
    // which the cut below prevents.) The new agent's answers stay held back
    // on the way to the switch, so whatever the switch agent sends until the
    // cut ends travels in 0-RTT and no handshake can complete.
    bed.set_link(Some(false), Some(false));
    bed.controller_agent
        .take()
        .unwrap()
        .terminate(PATIENCE)
        .unwrap();
    bed.start_controller_agent(2);
    bed.set_link(None, Some(true));
    // OVS's controller connection was closed with the old connection (OpenFlow
    // state is per connection); OVS reconnects to the switch agent, whose
    // connection is still in 0-RTT: OVS's session starts there, and the new
    // controller agent hands OVS's HELLO to os-ken before any handshake.
    let log2 = bed.controller_log(2);
    // The grace period (10 s), OVS's reconnect (1 s), margin.
    poll_until("OVS's session in 0-RTT", Duration::from_secs(20), || {
        let c = connection(&bed.switch_control());
        let log = std::fs::read_to_string(&log2).unwrap_or_default();
        Ok((c["sessions"] == 1 && log.contains("session opened")).then_some(c))
    })
    .map(|c| {
        assert_eq!(
            (&c["zero_rtt"], &c["confirmed"]),
            (&true.into(), &false.into()),
            "{c}"
        )
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\ncontroller agent:\n{}\nswitch agent:\n{}",
            std::fs::read_to_string(&log2).unwrap_or_default(),
            std::fs::read_to_string(bed.dir.join("switch-agent.log")).unwrap_or_default()
        )
    });

    // The path comes back: the handshake completes and OVS's session goes on,
    // with os-ken programming the switch from scratch.
    bed.wipe_flows();
    bed.set_link(Some(true), None);
    poll_until("the handshake to complete", PATIENCE, || {
        Ok((connection(&bed.switch_control())["confirmed"] == true).then_some(()))
    })
    .unwrap();
    bed.ovs().wait_connected("br0", PATIENCE).unwrap();
    bed.ping_through_fresh_flows();
    let sw = connection(&bed.switch_control());
    let ctl = connection(&bed.controller_control());
    assert_eq!(
        (&sw["zero_rtt"], &sw["confirmed"]),
        (&true.into(), &true.into()),
        "{sw}"
    );
    assert_eq!(
        ctl["zero_rtt"], true,
        "resumed from the session store: {ctl}"
    );
    // OVS's HELLO (and any echo) crossed early; nothing else did: OVS sends
    // FEATURES_REPLY only after os-ken's FEATURES_REQUEST, which could not reach
    // it before the handshake completed.
    let early = sw["early_messages"].as_u64().unwrap();
    assert!((1..=3).contains(&early), "{sw}");
    assert_eq!(ctl["early_messages"], sw["early_messages"], "{ctl} / {sw}");
    // One new OVS connection: the restart's.
    assert_eq!(
        bed.ovs_connections(),
        connections_before + 1,
        "{}",
        bed.ovs_log()
    );
}

#[test]
fn the_grace_period_holds_ovs_through_a_short_outage_and_lets_go_after_it() {
    let _s = serial();
    require_root();
    let bed = Bed::up("qsdnZ2", Duration::from_millis(5), &["--grace=4s"]);
    bed.ping_ok();
    let connections = bed.ovs_connections();

    // 1. A 2 s outage, within the grace period: a stall, no reconnect.
    bed.set_link(Some(false), Some(false));
    std::thread::sleep(Duration::from_secs(2)); // the outage itself
    bed.set_link(Some(true), Some(true));
    bed.ping_ok();
    assert_eq!(bed.ovs_connections(), connections, "{}", bed.ovs_log());
    let sw_log = std::fs::read_to_string(bed.dir.join("switch-agent.log")).unwrap();
    assert!(
        !sw_log.contains("connection to the controller agent lost"),
        "{sw_log}"
    );

    // 2. An outage beyond the grace period: the switch agent declares the
    //    connection dead and closes OVS's, so OVS sees its controller go away.
    let cut = Instant::now();
    bed.set_link(Some(false), Some(false));
    poll_until("OVS to see its controller gone", PATIENCE, || {
        let c = bed
            .ovs()
            .vsctl(&["get", "controller", "br0", "is_connected"])?;
        Ok((c.trim() == "false").then_some(()))
    })
    .unwrap();
    let noticed = cut.elapsed();
    let sw_log = std::fs::read_to_string(bed.dir.join("switch-agent.log")).unwrap();
    assert!(
        sw_log.contains("connection to the controller agent lost (timed out)"),
        "{sw_log}"
    );
    // The agent closed the connection; OVS's own probe (5 s idle, then 5 s for
    // the echo reply) did not have to.
    let ovs_log = bed.ovs_log();
    assert!(!ovs_log.contains("inactivity probe"), "{ovs_log}");
    eprintln!("OVS saw its controller gone {noticed:?} after the cut (grace 4 s)");

    // The path comes back: OVS reconnects and os-ken programs it afresh.
    bed.wipe_flows();
    bed.set_link(Some(true), Some(true));
    bed.ovs().wait_connected("br0", PATIENCE).unwrap();
    bed.ping_through_fresh_flows();
    assert!(bed.ovs_connections() > connections, "{}", bed.ovs_log());
}

#[test]
fn after_a_controller_agent_crash_its_successor_resets_the_old_connection() {
    let _s = serial();
    require_root();
    // A grace period near its maximum: the switch agent must hear of the crash
    // from the new agent, not from silence.
    let mut bed = Bed::up("qsdnZ3", Duration::from_millis(5), &["--grace=14s"]);
    bed.ping_ok();
    let connections = bed.ovs_connections();

    // A crash: no CONNECTION_CLOSE. The new agent on the same address and with
    // the same key has no state for the old connection, so the switch agent's
    // next packet (a keep-alive at the latest) earns a stateless reset, which
    // the switch agent accepts (RFC 9000 §10.3): the reset key is derived from
    // the agent's private key and address, not drawn at random.
    bed.controller_agent.take().unwrap().kill().unwrap();
    bed.start_controller_agent(2);
    let sw_log = bed.dir.join("switch-agent.log");
    let lost = poll_until(
        "the switch agent to drop the old connection",
        PATIENCE,
        || {
            let log = std::fs::read_to_string(&sw_log)?;
            Ok(log
                .lines()
                .find(|l| l.contains("connection to the controller agent lost"))
                .map(str::to_string))
        },
    )
    .unwrap();
    assert!(lost.contains("(reset by peer)"), "{lost}");

    // OVS's session restarts on the new connection and os-ken programs the
    // switch afresh.
    bed.wipe_flows();
    bed.ovs().wait_connected("br0", PATIENCE).unwrap();
    bed.ping_through_fresh_flows();
    assert_eq!(bed.ovs_connections(), connections + 1, "{}", bed.ovs_log());
}
