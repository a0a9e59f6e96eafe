//! Connection migration with real Open vSwitch: while the controller exchanges
//! messages with OVS through the agents, the switch namespace's control
//! interface is re-addressed, or a NAT in front of the switch rebinds to a new
//! port. The QUIC connection moves to the new address (RFC 9000 §9); OVS never
//! reconnects, the controller sees no disconnect, and no message is lost or
//! duplicated. Needs root.

mod common;

use std::time::{Duration, Instant};

use common::*;
use quicsdn_lab::control_link::Impairment;
use quicsdn_lab::testbed::{Testbed, TestbedSpec, Via};
use quicsdn_wire::openflow::HEADER_LEN;
use quicsdn_wire::openflow::build::{self, msg_type};

const TIMEOUT: Duration = Duration::from_secs(60);

fn control_socket(prefix: &str) -> String {
    format!("/run/quicsdn-lab/{prefix}-controller-agent.sock")
}

/// The controller agent's view of the switch's address, from its control socket.
fn switch_address(prefix: &str) -> String {
    let status = control_status(std::path::Path::new(&control_socket(prefix)));
    status["connections"][0]["remote"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn readdressing_the_switch_migrates_without_reconnecting_or_losing_anything() {
    migrate_with_traffic(
        "qsdnM",
        |bed| bed.readdress_switch("10.254.1.6".parse().unwrap()).unwrap(),
        "10.254.1.2:",
        "10.254.1.6:",
    );
}

/// The NAT is the control link's own, at the switch's end (see
/// `quicsdn_lab::emulator::nat` for why not the kernel's).
#[test]
fn a_nat_rebinding_in_front_of_the_switch_migrates_without_reconnecting_or_losing_anything() {
    migrate_with_traffic(
        "qsdnN",
        |bed| bed.nat_rebind_switch(40_001).unwrap(),
        "10.254.1.2:",
        "10.254.1.2:40001",
    );
}

/// Echo requests every 5 ms through the agents to OVS, 400 in all; `event`
/// moves the switch's address as the controller agent sees it after 150.
/// `before` and `after` are prefixes of that address.
fn migrate_with_traffic(prefix: &str, mut event: impl FnMut(&Testbed), before: &str, after: &str) {
    let _s = serial();
    require_root();
    let bed = Testbed::up(&TestbedSpec {
        prefix: prefix.into(),
        impairment: Impairment {
            delay: Some(Duration::from_millis(5)),
            ..Impairment::default()
        },
        via: Via::Agents {
            switch_args: vec![],
            controller_args: vec![format!("--control={}", control_socket(prefix))],
        },
        hosts: 0,
    })
    .unwrap();
    let mut c = bed.accept_controller(TIMEOUT).unwrap();
    let log = bed.dir.join("controller-agent.log");
    let first = switch_address(prefix);
    assert!(first.starts_with(before), "{first}");

    // Echo requests every 5 ms; OVS answers each: 400 before, during and after.
    let start = Instant::now();
    let mut replies: Vec<(u32, Duration)> = Vec::new();
    let mut moved = None;
    for seq in 0..400u32 {
        if seq == 150 {
            event(&bed);
            moved = Some(start.elapsed());
        }
        c.send(&build::echo_request(seq, &seq.to_be_bytes()))
            .unwrap();
        let deadline = Instant::now() + Duration::from_millis(5);
        while let Some(m) = c.recv_by(deadline).unwrap() {
            if m.header.msg_type == msg_type::ECHO_REPLY {
                replies.push((m.header.xid, start.elapsed()));
            }
        }
    }
    // Drain the rest.
    let deadline = Instant::now() + TIMEOUT;
    while replies.len() < 400 {
        let Some(m) = c.recv_by(deadline).unwrap() else {
            let read = |f: &str| std::fs::read_to_string(bed.dir.join(f)).unwrap_or_default();
            panic!(
                "echo replies stopped coming after {} of 400\ncontroller agent status: {}\nswitch agent:\n{}\ncontroller agent:\n{}",
                replies.len(),
                control_status(std::path::Path::new(&control_socket(prefix))),
                read("switch-agent.log"),
                read("controller-agent.log")
            );
        };
        if m.header.msg_type == msg_type::ECHO_REPLY {
            assert_eq!(m.bytes[HEADER_LEN..], m.header.xid.to_be_bytes());
            replies.push((m.header.xid, start.elapsed()));
        }
    }
    // Every reply exactly once, in order (echo rides one priority stream).
    let xids: Vec<u32> = replies.iter().map(|r| r.0).collect();
    assert_eq!(xids, (0..400).collect::<Vec<_>>());
    // The stall: the longest gap between replies after the move.
    let moved = moved.unwrap();
    let stall = replies
        .windows(2)
        .filter(|w| w[1].1 >= moved)
        .map(|w| w[1].1 - w[0].1)
        .max()
        .unwrap();
    eprintln!("migration stall: {stall:?}");
    // Nothing reconnected: one connection on each side, the controller agent now
    // sees the switch at its new address, OVS's controller connection is the first.
    let now = switch_address(prefix);
    assert!(now.starts_with(after) && now != first, "{first} -> {now}");
    let switch_log = std::fs::read_to_string(bed.dir.join("switch-agent.log")).unwrap();
    assert_eq!(
        switch_log
            .matches("connected to the controller agent")
            .count(),
        1,
        "{switch_log}"
    );
    let ctl_log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        ctl_log.matches("switch agent connected").count(),
        1,
        "{ctl_log}"
    );
    assert!(!ctl_log.contains("session closed"), "{ctl_log}");
    // OVS's rconn logs "<target>: connected" on every (re)connection to the
    // controller; exactly one means OVS never noticed the move.
    let ovs_log = std::fs::read_to_string(bed.ovs().dir.join("ovs-vswitchd.log")).unwrap();
    let ovs_connects = ovs_log
        .lines()
        .filter(|l| l.contains("rconn") && l.ends_with(": connected"))
        .count();
    assert_eq!(ovs_connects, 1, "{ovs_log}");
}
