//! Ryu and Faucet in the lab: two switches, hosts on different switches ping
//! each other through the controller, which installed flows for their MACs.
//! Ryu runs over `tls` (two switches prove its TLS listener takes more than
//! one connection, see controllers/ryu/run.py); Faucet over `tcp` and `tls`.
//! Needs root; the first run installs the controllers' venvs.

mod common;

use std::time::Duration;

use common::*;
use quicsdn_lab::controller::ControllerKind;
use quicsdn_lab::host::ping;
use quicsdn_lab::netns::Netns;
use quicsdn_lab::topology::{self, host_mac};
use quicsdn_lab::transport::Transport;

fn two_switch_ping(prefix: &str, controller: ControllerKind, transport: Transport) {
    let _g = LabGuard::new(prefix);
    let mut cfg = config(prefix);
    cfg.settings.switches = 2;
    cfg.settings.hosts_per_switch = 1;
    cfg.settings.transport = transport;
    cfg.settings.controller = controller;
    let state = topology::up(&cfg).expect("lab up").state;
    for sw in &state.switches {
        assert!(sw.ovs.as_ref().unwrap().is_connected("br0").unwrap());
    }
    let (h1, h2) = (&state.hosts[0], &state.hosts[1]);
    assert_eq!((h1.switch.as_str(), h2.switch.as_str()), ("sw1", "sw2"));
    ping_until_reply(&h1.netns, &h2.ip, Duration::from_secs(20));
    let st = ping(&Netns::named(&h1.netns), &h2.ip, 5, 0.2).unwrap();
    assert!(st.all_replied(), "{controller}: {st:?}");

    for sw in &state.switches {
        let flows = sw.ovs.as_ref().unwrap().dump_flows("br0").unwrap();
        for mac in [host_mac(1, 1), host_mac(2, 1)] {
            assert!(
                flows
                    .lines()
                    .any(|l| l.contains(&format!("dl_dst={mac}")) && l.contains("output:")),
                "{controller} on {}: no flow forwarding to {mac}:\n{flows}",
                sw.name
            );
        }
    }
    let procs = recorded_procs(&state);
    topology::down(&run_dir(), prefix).unwrap();
    let left = leftovers(prefix, &procs);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn ryu_over_tls() {
    let _s = serial();
    two_switch_ping("qsdnT6", ControllerKind::Ryu, Transport::Tls);
}

#[test]
fn faucet_over_tcp() {
    let _s = serial();
    two_switch_ping("qsdnT7", ControllerKind::Faucet, Transport::Tcp);
}

#[test]
fn faucet_over_tls() {
    let _s = serial();
    two_switch_ping("qsdnT8", ControllerKind::Faucet, Transport::Tls);
}
