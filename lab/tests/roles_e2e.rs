//! Two controllers in master/slave roles (OpenFlow 1.3 §6.3.5), with real
//! parts: Open vSwitch 3.1 with two controller targets and two os-ken
//! instances running `controllers/roles.py`, the master also the L2 learning
//! app. The master asks for MASTER with an explicit generation id, the slave
//! asks the switch for its generation id and then for SLAVE. Hosts ping
//! through the master's flows; the master gets the PACKET_INs, the slave none
//! (OVS sends no packet-ins to a slave by default), yet the slave's connection
//! carries what a slave does get (PORT_STATUS). OVS's Controller rows show both
//! connected with their roles.
//!
//! Three ways for the two targets: each through its own switch agent and
//! controller agent (its own QUIC connection), both as services of one pair
//! of agents (one QUIC connection), and plain TCP (the same assertions hold
//! without quicsdn). Needs root.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use quicsdn_lab::control_link::Impairment;
use quicsdn_lab::controller::{
    ControllerKind, ControllerSpec, RunningController, start_controller_with,
};
use quicsdn_lab::host::ping;
use quicsdn_lab::netns::Netns;
use quicsdn_lab::testbed::{AgentLayout, Targets, Testbed, TestbedSpec, Via};
use quicsdn_lab::topology::default_repo_dir;
use quicsdn_lab::wait::poll_until;
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(60);
/// The master's generation id; the slave learns it from the switch.
const GENERATION: u64 = 7;
const MACS: [&str; 2] = ["02:51:00:00:00:01", "02:51:00:00:00:02"];

/// Stops the controllers when the test ends (before the testbed goes).
struct Controllers(Vec<RunningController>);

impl Drop for Controllers {
    fn drop(&mut self) {
        for c in &self.0 {
            let _ = c.stop();
        }
    }
}

/// The events a roles.py instance recorded so far.
fn events(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", file.display())))
        .collect()
}

fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == kind).collect()
}

/// The reply to the app's role request (not to its generation-id query).
fn role_reply(file: &Path) -> Option<Value> {
    events(file)
        .into_iter()
        .find(|e| e["event"] == "role_reply" && e["purpose"] == "request")
}

/// `(target, is_connected, role)` of every Controller row.
fn controller_rows(bed: &Testbed) -> Vec<(String, bool, String)> {
    let out = bed
        .ovs()
        .vsctl(&[
            "--format=json",
            "--columns=target,is_connected,role",
            "list",
            "controller",
        ])
        .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let role = match &row[2] {
                Value::String(s) => s.clone(),
                _ => String::new(), // ["set", []]: not reported yet
            };
            (row[0].as_str().unwrap().to_string(), row[1] == true, role)
        })
        .collect()
}

fn master_and_slave(prefix: &str, via: Via, layout: AgentLayout) {
    let _s = serial();
    require_root();
    let agents = via != Via::Tcp;
    let bed = Testbed::build(
        &TestbedSpec {
            prefix: prefix.into(),
            impairment: Impairment {
                delay: Some(Duration::from_millis(2)),
                ..Impairment::default()
            },
            via,
            hosts: 2,
        },
        &Targets {
            count: 2,
            agents: layout,
            listen: false,
        },
    )
    .unwrap();
    let ctl = bed.ctl();
    let repo = default_repo_dir();
    let app = |name: &str| repo.join("controllers").join(name).display().to_string();
    let master_events = bed.dir.join("master.jsonl");
    let slave_events = bed.dir.join("slave.jsonl");
    let start = |role: &str, port: u16, args: Vec<String>| {
        start_controller_with(
            &ctl,
            &ControllerSpec {
                kind: ControllerKind::Osken,
                // Behind the agents the controllers listen on loopback only.
                listen_host: if agents { "127.0.0.1" } else { "0.0.0.0" }.into(),
                port,
                tls: None,
                work_dir: bed.dir.join(role),
                repo_dir: repo.clone(),
                venv_dir: None,
                faucet_yaml: None,
                ready_timeout: TIMEOUT,
            },
            &args,
        )
        .unwrap()
    };
    let mut controllers = Controllers(Vec::new());
    controllers.0.push(start(
        "master",
        6653,
        vec![
            app("roles.py"),
            app("l2_learning.py"),
            "--role=master".into(),
            format!("--generation-id={GENERATION}"),
            format!("--events={}", master_events.display()),
        ],
    ));
    controllers.0.push(start(
        "slave",
        6654,
        vec![
            app("roles.py"),
            "--role=slave".into(),
            format!("--events={}", slave_events.display()),
        ],
    ));
    bed.point_ovs().unwrap();
    let targets = bed.ovs_targets().to_vec();
    assert_eq!(targets.len(), 2);

    // 1. Each controller's role request is answered with the role it asked for.
    let (master, slave) = poll_until("both role replies", TIMEOUT, || {
        Ok(role_reply(&master_events).zip(role_reply(&slave_events)))
    })
    .unwrap();
    assert_eq!(master["role"], "master", "{master}");
    assert_eq!(master["generation_id"], GENERATION, "{master}");
    assert_eq!(slave["role"], "slave", "{slave}");
    // The slave took the generation id the switch reported, so it was not stale.
    let sent = of_kind(&events(&slave_events), "role_request")
        .into_iter()
        .rfind(|e| e["purpose"] == "request")
        .cloned()
        .unwrap();
    assert_eq!(sent["role"], "slave");
    assert_eq!(slave["generation_id"], sent["generation_id"], "{slave}");
    // The master's id came from its election (the command line): never stale.
    // The slave may have raced it (asked for the id before the master's request
    // raised it): then its request was refused as stale and it asked again.
    let master_ev = events(&master_events);
    assert!(
        of_kind(&master_ev, "role_error").is_empty(),
        "{master_ev:?}"
    );
    let slave_ev = events(&slave_events);
    for e in of_kind(&slave_ev, "role_error") {
        assert_eq!(e["code"], "stale", "{slave_ev:?}");
    }

    // 2. OVS's Controller rows: both targets connected, with their roles.
    poll_until("OVS to report both controllers' roles", TIMEOUT, || {
        let rows = controller_rows(&bed);
        let want = [
            (targets[0].clone(), true, "master".to_string()),
            (targets[1].clone(), true, "slave".to_string()),
        ];
        Ok(want.iter().all(|w| rows.contains(w)).then_some(()))
    })
    .unwrap();

    // 3. The hosts ping each other through the master's L2 learning flows.
    ping_until_reply(&format!("{prefix}-h1"), "10.0.0.2", TIMEOUT);
    let st = ping(&Netns::named(format!("{prefix}-h1")), "10.0.0.2", 5, 0.2).unwrap();
    assert!(st.all_replied(), "h1 -> h2: {st:?}");
    let flows = bed.ovs().dump_flows("br0").unwrap();
    for mac in MACS {
        assert!(
            flows
                .lines()
                .any(|l| l.contains(&format!("dl_dst={mac}")) && l.contains("actions=output:")),
            "no learned flow to {mac}:\n{flows}"
        );
    }

    // 4. A new port: PORT_STATUS goes to master and slave alike, so the
    //    slave's connection carries the asynchronous messages a slave gets.
    let sw = Netns::named(format!("{prefix}-sw1"));
    sw.ip(&[
        "link",
        "add",
        "probe",
        "type",
        "veth",
        "peer",
        "name",
        "probe-peer",
    ])
    .unwrap();
    bed.ovs().add_port("br0", "probe", None).unwrap();
    let added = |file: &Path| {
        of_kind(&events(file), "port_status")
            .iter()
            .any(|e| e["reason"] == "add" && e["name"] == "probe")
    };
    poll_until("PORT_STATUS of the new port at both", TIMEOUT, || {
        Ok((added(&master_events) && added(&slave_events)).then_some(()))
    })
    .unwrap();

    // 5. The master got the packet-ins, from both hosts; the slave none.
    let master_ev = events(&master_events);
    let packet_ins = of_kind(&master_ev, "packet_in");
    for mac in MACS {
        assert!(
            packet_ins.iter().any(|e| e["eth_src"] == mac),
            "no packet-in from {mac} at the master: {packet_ins:?}"
        );
    }
    let slave_ev = events(&slave_events);
    assert!(
        of_kind(&slave_ev, "packet_in").is_empty(),
        "the slave received packet-ins: {slave_ev:?}"
    );
    eprintln!(
        "{prefix}: master gen {}, slave gen {} after {} stale refusal(s); packet-ins: master {}, slave 0",
        master["generation_id"],
        slave["generation_id"],
        of_kind(&slave_ev, "role_error").len(),
        packet_ins.len()
    );
    // Each controller saw the switch connect once and never lose it.
    for ev in [&master_ev, &slave_ev] {
        assert_eq!(of_kind(ev, "connected").len(), 1, "{ev:?}");
        assert!(of_kind(ev, "disconnected").is_empty(), "{ev:?}");
    }

    // 6. The agents: each target's connection where the layout puts it.
    if agents {
        let log = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        let sessions = |log: &str, service: &str| {
            log.lines()
                .filter(|l| {
                    l.contains("session opened")
                        && l.contains("switch=sw1")
                        && l.contains(&format!("service={service} "))
                })
                .count()
        };
        match layout {
            AgentLayout::PerTarget => {
                for i in 0..2 {
                    let ctl_log = log(bed.controller_agent_log(i));
                    assert_eq!(
                        ctl_log.matches("switch agent connected").count(),
                        1,
                        "controller agent {i}:\n{ctl_log}"
                    );
                    assert!(sessions(&ctl_log, "openflow") >= 1, "{ctl_log}");
                }
            }
            AgentLayout::Shared => {
                let ctl_log = log(bed.controller_agent_log(0));
                assert_eq!(
                    ctl_log.matches("switch agent connected").count(),
                    1,
                    "{ctl_log}"
                );
                assert!(sessions(&ctl_log, "openflow") >= 1, "{ctl_log}");
                assert!(sessions(&ctl_log, "openflow2") >= 1, "{ctl_log}");
                assert!(!bed.controller_agent_log(1).exists());
            }
        }
    }
    drop(controllers);
    drop(bed);
    assert!(!Netns::exists(&format!("{prefix}-sw1")));
}

fn agents() -> Via {
    Via::Agents {
        switch_args: vec![],
        controller_args: vec![],
    }
}

#[test]
fn master_and_slave_each_over_its_own_quic_connection() {
    master_and_slave("qsdnR1", agents(), AgentLayout::PerTarget);
}

#[test]
fn master_and_slave_as_two_services_of_one_quic_connection() {
    master_and_slave("qsdnR2", agents(), AgentLayout::Shared);
}

#[test]
fn master_and_slave_over_plain_tcp() {
    master_and_slave("qsdnR3", Via::Tcp, AgentLayout::PerTarget);
}
