//! The quicsdn agents with real parts (issue: agents, end to end): Open vSwitch
//! 3.1 (userspace datapath) in one namespace, an os-ken L2 learning app
//! listening only on the controller namespace's loopback, the two namespaces
//! joined by a veth, and the real `quicsdn` binary in between. Checks what an
//! operator would: OVS reports `is_connected`, hosts ping, learned flows appear,
//! and OVSDB works through the agents in both directions with Open vSwitch's
//! own tools. Needs root.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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

const NS_CTL: &str = "qsdnA-ctl";
const NS_SW: &str = "qsdnA-sw1";
const NS_H1: &str = "qsdnA-h1";
const NS_H2: &str = "qsdnA-h2";
const CTL_IP: &str = "10.253.1.1";
const SW_IP: &str = "10.253.1.2";

/// Everything the test started, removed by recorded PID and name when dropped
/// (also after a failed assertion).
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

#[test]
fn ovs_and_os_ken_through_the_agents_with_ovsdb_both_ways() {
    let _s = serial();
    require_root();
    remove_namespaces(); // leftovers of a crashed run
    let dir = PathBuf::from("/run/quicsdn-lab/qsdnA-e2e");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut setup = Setup {
        dir: dir.clone(),
        procs: Vec::new(),
        ovs: None,
    };

    // Namespaces and the control link.
    let ctl = Netns::create(NS_CTL).unwrap();
    let sw = Netns::create(NS_SW).unwrap();
    create_veth(&VethEnd::new(&ctl, "sw1"), &VethEnd::new(&sw, "ctl")).unwrap();
    ctl.add_addr("sw1", &format!("{CTL_IP}/30")).unwrap();
    sw.add_addr("ctl", &format!("{SW_IP}/30")).unwrap();
    ctl.link_up("sw1").unwrap();
    sw.link_up("ctl").unwrap();

    // Certificates with the agents' own CLI.
    let pki = dir.join("pki");
    let pki_s = pki.to_str().unwrap();
    quicsdn(&["pki", "init", "--dir", pki_s]);
    quicsdn(&["pki", "issue", "--dir", pki_s, "--name", "ctl"]);
    quicsdn(&["pki", "issue", "--dir", pki_s, "--name", "sw1"]);

    // Open vSwitch with two hosts.
    let ovs = Ovs::start(&sw, &dir.join("sw1")).unwrap();
    setup.ovs = Some(ovs.clone());
    ovs.add_bridge(&BridgeConfig::new("br0")).unwrap();
    let hosts = [
        (NS_H1, "10.0.0.1", "02:51:00:00:00:01", "h1"),
        (NS_H2, "10.0.0.2", "02:51:00:00:00:02", "h2"),
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

    // os-ken's L2 learning app, on the controller namespace's loopback only.
    let controller = start_controller(
        &ctl,
        &ControllerSpec {
            kind: ControllerKind::Osken,
            listen_host: "127.0.0.1".into(),
            port: 6653,
            tls: None,
            work_dir: dir.join("ctl"),
            repo_dir: default_repo_dir(),
            venv_dir: None,
            faucet_yaml: None,
            ready_timeout: Duration::from_secs(60),
        },
    )
    .unwrap();
    setup.procs.push(controller.proc.clone());

    // The agents. Services: OpenFlow (OVS connects to the switch agent's unix
    // socket); OVSDB with OVS as the active side (set-manager tcp:127.0.0.1:6640
    // towards a manager on the controller host); and OVSDB with OVS listening
    // (set-manager ptcp:6641), reached from the controller host through a
    // per-switch socket of the controller agent.
    let per_switch = dir.join("agents").join("{switch}").join("ovsdb.sock");
    setup.procs.push(
        start_controller_agent(
            &ctl,
            &format!("{CTL_IP}:6653"),
            &tls(&pki, "ctl"),
            &[
                "openflow=tcp:127.0.0.1:6653".into(),
                "ovsdb=tcp:127.0.0.1:6640".into(),
                format!("ovsdb-in:ovsdb=punix:{}", per_switch.display()),
            ],
            &[],
            &dir.join("ctl/quicsdn-controller.log"),
        )
        .unwrap(),
    );
    let of_socket = openflow_socket(&ovs.dir);
    setup.procs.push(
        start_switch_agent(
            &sw,
            &format!("{CTL_IP}:6653"),
            "ctl",
            &tls(&pki, "sw1"),
            &[
                format!("openflow=punix:{}", of_socket.display()),
                "ovsdb=ptcp:6640:127.0.0.1".into(),
                "ovsdb-in:ovsdb=tcp:127.0.0.1:6641".into(),
            ],
            &[],
            &ovs.dir.join("quicsdn-switch.log"),
        )
        .unwrap(),
    );
    ovs.set_controller("br0", &[format!("unix:{}", of_socket.display())])
        .unwrap();
    ovs.vsctl(&["set-manager", "ptcp:6641:127.0.0.1"]).unwrap();

    // 1. OVS reports the controller connected.
    ovs.wait_connected("br0", Duration::from_secs(30)).unwrap();
    assert_eq!(
        ovs.vsctl(&["get", "controller", "br0", "is_connected"])
            .unwrap()
            .trim(),
        "true"
    );
    // The controller is reachable through the agents only.
    let direct = sw
        .command("bash")
        .arg("-c")
        .arg(format!("exec 3<>/dev/tcp/{CTL_IP}/6653"))
        .output()
        .unwrap();
    assert!(
        !direct.status.success(),
        "os-ken is reachable without the agents"
    );

    // 2. The hosts ping each other through the L2 app's flows.
    ping_until_reply(NS_H1, "10.0.0.2", Duration::from_secs(20));
    let st = ping(&Netns::named(NS_H1), "10.0.0.2", 5, 0.2).unwrap();
    assert!(st.all_replied(), "h1 -> h2: {st:?}");

    // 3. The learned flows are in OVS.
    let flows = ovs.dump_flows("br0").unwrap();
    for (_, _, mac, _) in &hosts {
        assert!(
            flows
                .lines()
                .any(|l| l.contains(&format!("dl_dst={mac}")) && l.contains("actions=output:")),
            "no learned flow to {mac}:\n{flows}"
        );
    }

    // 4. OVSDB towards the listening OVS, from the controller host, with
    //    ovs-vsctl through the controller agent's per-switch socket.
    let socket = dir.join("agents/sw1/ovsdb.sock");
    poll_until(
        "the per-switch OVSDB socket",
        Duration::from_secs(30),
        || Ok(socket.exists().then_some(())),
    )
    .unwrap();
    let db = format!("--db=unix:{}", socket.display());
    let show = ctl.exec(&["ovs-vsctl", &db, "show"]).unwrap();
    assert!(
        show.contains("Bridge br0") && show.contains("Port h1") && show.contains("Port h2"),
        "{show}"
    );
    let ports = ctl.exec(&["ovs-vsctl", &db, "list-ports", "br0"]).unwrap();
    assert_eq!(ports.split_whitespace().collect::<Vec<_>>(), ["h1", "h2"]);
    // A write through the agents lands in the switch's own database.
    ctl.exec(&[
        "ovs-vsctl",
        &db,
        "set",
        "bridge",
        "br0",
        "external-ids:via=quicsdn",
    ])
    .unwrap();
    assert_eq!(
        ovs.vsctl(&["get", "bridge", "br0", "external-ids:via"])
            .unwrap()
            .trim(),
        "quicsdn"
    );

    // 5. OVSDB with OVS as the active side: ovsdb-client listens on the
    //    controller host's loopback; OVS's manager connects to the switch agent.
    let mut dump = ctl
        .command("ovsdb-client")
        .args([
            "--timeout=60",
            "dump",
            "ptcp:6640:127.0.0.1",
            "Open_vSwitch",
            "Bridge",
            "name",
            "external_ids",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    poll_until("ovsdb-client to listen", Duration::from_secs(10), || {
        Ok(ctl.tcp_listening(6640)?.then_some(()))
    })
    .unwrap();
    ovs.vsctl(&["set-manager", "ptcp:6641:127.0.0.1", "tcp:127.0.0.1:6640"])
        .unwrap();
    let out = poll_until("ovsdb-client dump", Duration::from_secs(60), || {
        Ok(dump.try_wait()?.map(|_| ()))
    })
    .map(|()| dump.wait_with_output().unwrap())
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ovsdb-client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("br0") && text.contains("via=quicsdn"),
        "{text}"
    );

    // The agents logged the switch by its certificate identity.
    let log = std::fs::read_to_string(dir.join("ctl/quicsdn-controller.log")).unwrap();
    for service in ["openflow", "ovsdb", "ovsdb-in"] {
        assert!(
            log.lines().any(|l| l.contains("session opened")
                && l.contains("switch=sw1")
                && l.contains(&format!("service={service} "))),
            "no {service} session for sw1 in the controller agent's log:\n{log}"
        );
    }
    drop(setup);
    assert!(!Netns::exists(NS_SW) && !Netns::exists(NS_CTL));
}
