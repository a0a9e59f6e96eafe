//! Failover between controller agents (issue 18), end to end: Open vSwitch 3.1
//! (userspace datapath) with two hosts in their namespaces, os-ken's L2
//! learning app on the controller namespace's loopback, two controller agents
//! in front of it on two ports, and one switch agent given both
//! (`--controller A --controller B`). Stopping A (SIGTERM): OVS's OpenFlow
//! session comes back through B, before OVS's fail-mode timeout, the app
//! re-learns the hosts (it deletes every flow when a switch connects) and the
//! hosts ping. Starting A again: the switch agent moves back to A. Needs root.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use quicsdn_lab::agents::{
    AgentTls, openflow_socket, quicsdn_binary, start_controller_agent, start_switch_agent,
};
use quicsdn_lab::controller::{ControllerKind, ControllerSpec, start_controller};
use quicsdn_lab::host::{HostSpec, attach_host, ping};
use quicsdn_lab::netns::{Netns, VethEnd, create_veth};
use quicsdn_lab::ovs::{BridgeConfig, Ovs};
use quicsdn_lab::process::ProcRecord;
use quicsdn_lab::topology::default_repo_dir;
use quicsdn_lab::wait::poll_until;

const NS_CTL: &str = "q18f-ctl";
const NS_SW: &str = "q18f-sw1";
const NS_H1: &str = "q18f-h1";
const NS_H2: &str = "q18f-h2";
const CTL_IP: &str = "10.253.18.1";
const SW_IP: &str = "10.253.18.2";
/// Open vSwitch's fail-mode timeout with its default inactivity probe: the
/// session must be back before OVS would give up on its controller.
const OVS_FAIL_TIMEOUT: Duration = Duration::from_secs(15);

struct Setup {
    dir: PathBuf,
    procs: Vec<ProcRecord>,
    ovs: Option<Ovs>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for p in self.procs.iter().rev() {
            let _ = p.terminate(Duration::from_secs(5));
        }
        if let Some(o) = &self.ovs {
            let _ = o.stop();
        }
        remove_namespaces();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn remove_namespaces() {
    for name in [NS_H1, NS_H2, NS_SW, NS_CTL] {
        if Netns::exists(name) {
            let ns = Netns::named(name);
            let _ = ns.kill_all(Duration::from_secs(5));
            let _ = ns.delete();
        }
    }
}

fn quicsdn(args: &[&str]) {
    let out = Command::new(quicsdn_binary().unwrap())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "quicsdn {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tls(dir: &Path, name: &str) -> AgentTls {
    AgentTls {
        ca: dir.join("ca.crt"),
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    }
}

/// Switches connected to the controller agent behind `socket`, and the
/// sessions each carries (none while the agent is not answering yet).
fn switches_at(socket: &Path) -> Vec<(String, u64)> {
    use std::io::{BufRead, BufReader, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return Vec::new();
    };
    let mut line = String::new();
    if writeln!(s, r#"{{"cmd":"status"}}"#).is_err()
        || BufReader::new(&s).read_line(&mut line).is_err()
    {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
    v["connections"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| Some((c["switch"].as_str()?.to_string(), c["sessions"].as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// True when `sw1` is connected at `socket` and carries an OpenFlow session.
fn session_at(socket: &Path) -> bool {
    switches_at(socket)
        .iter()
        .any(|(sw, sessions)| sw == "sw1" && *sessions >= 1)
}

fn start_ctl_agent(ctl: &Netns, dir: &Path, pki: &Path, port: u16) -> ProcRecord {
    let control = dir.join(format!("ctl-{port}.sock"));
    start_controller_agent(
        ctl,
        &format!("{CTL_IP}:{port}"),
        &tls(pki, "ctl"),
        &["openflow=tcp:127.0.0.1:6653".into()],
        &[format!("--control={}", control.display())],
        &dir.join(format!("ctl-{port}.log")),
    )
    .unwrap()
}

/// Pings h1 -> h2 until OVS's flow table holds a learned flow towards each
/// host (the app learns from the packet-ins the pings cause) installed after
/// `since`, if given, and returns the oldest of those flows' ages.
fn learn(ovs: &Ovs, macs: &[&str], since: Option<Instant>) -> Duration {
    poll_until("learned flows", Duration::from_secs(30), || {
        let _ = ping(&Netns::named(NS_H1), "10.0.0.2", 1, 0.2);
        let flows = ovs.dump_flows("br0")?;
        let ages: Option<Vec<f64>> = macs
            .iter()
            .map(|mac| {
                flows
                    .lines()
                    .find(|l| l.contains(&format!("dl_dst={mac}")) && l.contains("actions=output:"))
                    .and_then(|l| l.split("duration=").nth(1)?.split('s').next()?.parse().ok())
            })
            .collect();
        let oldest = ages.map(|a| Duration::from_secs_f64(a.into_iter().fold(0.0, f64::max)));
        Ok(oldest.filter(|age| since.is_none_or(|t| *age < t.elapsed())))
    })
    .unwrap()
}

#[test]
fn the_openflow_session_fails_over_to_the_second_controller_agent_and_back() {
    let _s = serial();
    require_root();
    remove_namespaces();
    let dir = PathBuf::from("/run/quicsdn-lab/q18f-e2e");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut setup = Setup {
        dir: dir.clone(),
        procs: Vec::new(),
        ovs: None,
    };

    let ctl = Netns::create(NS_CTL).unwrap();
    let sw = Netns::create(NS_SW).unwrap();
    create_veth(&VethEnd::new(&ctl, "sw1"), &VethEnd::new(&sw, "ctl")).unwrap();
    ctl.add_addr("sw1", &format!("{CTL_IP}/30")).unwrap();
    sw.add_addr("ctl", &format!("{SW_IP}/30")).unwrap();
    ctl.link_up("sw1").unwrap();
    sw.link_up("ctl").unwrap();

    let pki = dir.join("pki");
    let pki_s = pki.to_str().unwrap();
    quicsdn(&["pki", "init", "--dir", pki_s]);
    // Both controller agents carry the same name, as agents of one cluster may.
    quicsdn(&["pki", "issue", "--dir", pki_s, "--name", "ctl"]);
    quicsdn(&["pki", "issue", "--dir", pki_s, "--name", "sw1"]);

    let ovs = Ovs::start(&sw, &dir.join("sw1")).unwrap();
    setup.ovs = Some(ovs.clone());
    ovs.add_bridge(&BridgeConfig::new("br0")).unwrap();
    let hosts = [
        (NS_H1, "10.0.0.1", "02:51:00:00:18:01", "h1"),
        (NS_H2, "10.0.0.2", "02:51:00:00:18:02", "h2"),
    ];
    for (i, (ns, ip, mac, port)) in hosts.iter().enumerate() {
        Netns::create(ns).unwrap();
        let spec = HostSpec {
            netns: ns.to_string(),
            ifname: "eth0".into(),
            mac: mac.to_string(),
            cidr: format!("{ip}/24"),
            port: port.to_string(),
            ofport: Some(i as u16 + 1),
        };
        attach_host(&spec, &ovs, "br0").unwrap();
    }
    let macs: Vec<&str> = hosts.iter().map(|h| h.2).collect();

    let controller = start_controller(
        &ctl,
        &ControllerSpec {
            kind: ControllerKind::Osken,
            listen_host: "127.0.0.1".into(),
            port: 6653,
            tls: None,
            work_dir: dir.join("osken"),
            repo_dir: default_repo_dir(),
            venv_dir: None,
            faucet_yaml: None,
            ready_timeout: Duration::from_secs(60),
        },
    )
    .unwrap();
    setup.procs.push(controller.proc.clone());

    // Controller agents A (first choice) and B, both in front of os-ken.
    let (port_a, port_b) = (6653, 6654);
    let control_a = dir.join(format!("ctl-{port_a}.sock"));
    let control_b = dir.join(format!("ctl-{port_b}.sock"));
    let agent_a = start_ctl_agent(&ctl, &dir, &pki, port_a);
    setup.procs.push(agent_a.clone());
    let agent_b = start_ctl_agent(&ctl, &dir, &pki, port_b);
    setup.procs.push(agent_b.clone());

    let of_socket = openflow_socket(&ovs.dir);
    setup.procs.push(
        start_switch_agent(
            &sw,
            &format!("{CTL_IP}:{port_a}"),
            "ctl",
            &tls(&pki, "sw1"),
            &[format!("openflow=punix:{}", of_socket.display())],
            &[
                format!("--controller={CTL_IP}:{port_b}"),
                "--failback-interval=1s".into(),
            ],
            &ovs.dir.join("quicsdn-switch.log"),
        )
        .unwrap(),
    );
    ovs.set_controller("br0", &[format!("unix:{}", of_socket.display())])
        .unwrap();

    // 1. Through A.
    ovs.wait_connected("br0", Duration::from_secs(30)).unwrap();
    ping_until_reply(NS_H1, "10.0.0.2", Duration::from_secs(20));
    learn(&ovs, &macs, None);
    assert!(session_at(&control_a));
    assert!(switches_at(&control_b).is_empty());

    // 2. A stops: the session comes back through B.
    let stopped = Instant::now();
    agent_a.terminate(Duration::from_secs(10)).unwrap();
    poll_until("the switch at controller agent B", OVS_FAIL_TIMEOUT, || {
        Ok((!switches_at(&control_b).is_empty()).then_some(()))
    })
    .unwrap();
    let agent_b_time = stopped.elapsed();
    // OVS reconnected (its own backoff) and its new OpenFlow session crosses
    // B; os-ken saw the switch again and deleted every flow, so the learned
    // flows below are learned anew, through packet-ins and flow-mods that
    // crossed B.
    poll_until(
        "OVS's OpenFlow session through controller agent B",
        OVS_FAIL_TIMEOUT.saturating_sub(stopped.elapsed()),
        || Ok(session_at(&control_b).then_some(())),
    )
    .unwrap();
    let session_time = stopped.elapsed();
    ovs.wait_connected("br0", Duration::from_secs(10)).unwrap();
    // Learned after the failover: os-ken deleted the older ones when the
    // switch reached it through B.
    learn(&ovs, &macs, Some(stopped));
    let st = ping(&Netns::named(NS_H1), "10.0.0.2", 5, 0.2).unwrap();
    assert!(st.all_replied(), "h1 -> h2 through B: {st:?}");
    let log = std::fs::read_to_string(dir.join(format!("ctl-{port_b}.log"))).unwrap();
    assert!(
        log.contains("switch agent connected") && log.contains("switch=sw1"),
        "{log}"
    );
    println!(
        "failover: switch agent at B {:.2} s after A's SIGTERM, OVS's OpenFlow session up through B after {:.2} s",
        agent_b_time.as_secs_f64(),
        session_time.as_secs_f64()
    );

    // 3. A comes back: the switch agent moves back to it.
    let agent_a = start_ctl_agent(&ctl, &dir, &pki, port_a);
    setup.procs.push(agent_a.clone());
    let back = Instant::now();
    poll_until(
        "the switch back at controller agent A",
        Duration::from_secs(20),
        || Ok((session_at(&control_a) && switches_at(&control_b).is_empty()).then_some(())),
    )
    .unwrap();
    ovs.wait_connected("br0", Duration::from_secs(20)).unwrap();
    learn(&ovs, &macs, Some(back));
    println!(
        "failback: the switch agent back at A {:.2} s after A restarted",
        back.elapsed().as_secs_f64()
    );
    let log = std::fs::read_to_string(ovs.dir.join("quicsdn-switch.log")).unwrap();
    assert!(log.contains("moving back to it"), "{log}");
    drop(setup);
    assert!(!Netns::exists(NS_SW) && !Netns::exists(NS_CTL));
}
