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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use quicsdn_lab::agents::{AgentTls, openflow_socket, start_controller_agent, start_switch_agent};
use quicsdn_lab::control_link::{ControlLink, ControlLinkSpec, Impairment};
use quicsdn_lab::controller::{ControllerKind, ControllerSpec, start_controller};
use quicsdn_lab::emulator::control::DirPatch;
use quicsdn_lab::host::{HostSpec, attach_host, ping};
use quicsdn_lab::netns::Netns;
use quicsdn_lab::ovs::{BridgeConfig, Ovs};
use quicsdn_lab::pki::Pki;
use quicsdn_lab::process::ProcRecord;
use quicsdn_lab::topology::default_repo_dir;
use quicsdn_lab::wait::poll_until;

const PREFIX: &str = "qsdnZ";
const PATIENCE: Duration = Duration::from_secs(60);

/// Everything a test started, removed by recorded PID and by name on drop.
struct Bed {
    dir: PathBuf,
    link: Option<ControlLink>,
    ovs: Option<Ovs>,
    procs: Vec<ProcRecord>,
    controller_agent: Option<ProcRecord>,
    ctl_tls: Option<AgentTls>,
    agent_args: Vec<String>,
}

fn names() -> [String; 4] {
    ["ctl", "sw1", "h1", "h2"].map(|n| format!("{PREFIX}-{n}"))
}

fn remove_all() {
    let _ = quicsdn_lab::emulator::destroy_link_by_name(
        Path::new(quicsdn_lab::emulator::link::DEFAULT_RUN_DIR),
        &format!("{PREFIX}-c1"),
    );
    for name in names() {
        if Netns::exists(&name) {
            let ns = Netns::named(&name);
            let _ = ns.kill_all(Duration::from_secs(5));
            let _ = ns.delete();
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some(p) = &self.controller_agent {
            let _ = p.terminate(Duration::from_secs(5));
        }
        for p in self.procs.iter().rev() {
            let _ = p.terminate(Duration::from_secs(5));
        }
        if let Some(o) = &self.ovs {
            let _ = o.stop();
        }
        if let Some(l) = &self.link {
            let _ = l.destroy();
        }
        remove_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bed {
    /// OVS with hosts h1 and h2, os-ken, and the agents with `agent_args` (for
    /// both), joined by an emulated control link with `delay` each way.
    fn up(delay: Duration, agent_args: &[&str]) -> Bed {
        remove_all();
        let dir = PathBuf::from(format!("/run/quicsdn-lab/{PREFIX}-bed"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut bed = Bed {
            dir: dir.clone(),
            link: None,
            ovs: None,
            procs: Vec::new(),
            controller_agent: None,
            ctl_tls: None,
            agent_args: agent_args.iter().map(|s| s.to_string()).collect(),
        };
        let [ctl_name, sw_name, h1, h2] = names();
        let ctl = Netns::create(&ctl_name).unwrap();
        let sw = Netns::create(&sw_name).unwrap();
        let spec = ControlLinkSpec::new(
            1,
            PREFIX,
            &ctl_name,
            &sw_name,
            Impairment {
                delay: Some(delay),
                ..Impairment::default()
            },
        );
        let ctl_ip = spec.ctl_addr();
        bed.link =
            Some(ControlLink::create(spec, &quicsdn_lab::agents::lab_binary().unwrap()).unwrap());
        let ovs = Ovs::start(&sw, &dir.join("sw1")).unwrap();
        bed.ovs = Some(ovs.clone());
        ovs.add_bridge(&BridgeConfig::new("br0")).unwrap();
        for (j, ns) in [h1, h2].iter().enumerate() {
            let j = j + 1;
            Netns::create(ns).unwrap();
            attach_host(
                &HostSpec {
                    netns: ns.clone(),
                    ifname: "eth0".into(),
                    mac: format!("02:51:00:00:00:{j:02x}"),
                    cidr: format!("10.0.0.{j}/24"),
                    port: format!("h{j}"),
                    ofport: Some(j as u16),
                },
                &ovs,
                "br0",
            )
            .unwrap();
        }
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
                ready_timeout: PATIENCE,
            },
        )
        .unwrap();
        bed.procs.push(controller.proc.clone());
        let pki = Pki::create(&dir.join("pki")).unwrap();
        let tls = |name: &str| {
            let pair = pki.issue(name).unwrap();
            AgentTls {
                ca: pki.ca_cert(),
                cert: pair.cert,
                key: pair.key,
            }
        };
        bed.ctl_tls = Some(tls("ctl"));
        bed.start_controller_agent(1);
        let socket = openflow_socket(&ovs.dir);
        let mut args = bed.agent_args.clone();
        args.push(format!("--control={}", bed.switch_control().display()));
        bed.procs.push(
            start_switch_agent(
                &sw,
                &format!("{ctl_ip}:6653"),
                "ctl",
                &tls("sw1"),
                &[format!("openflow=punix:{}", socket.display())],
                &args,
                &dir.join("switch-agent.log"),
            )
            .unwrap(),
        );
        ovs.set_controller("br0", &[format!("unix:{}", socket.display())])
            .unwrap();
        ovs.wait_connected("br0", PATIENCE).unwrap();
        bed
    }

    /// Starts the controller agent (`run` numbers its log), keeping its TLS
    /// sessions in a file so they outlive it.
    fn start_controller_agent(&mut self, run: u32) {
        let link = self.link.as_ref().unwrap();
        let mut args = self.agent_args.clone();
        args.push(format!("--control={}", self.controller_control().display()));
        args.push(format!(
            "--session-store={}",
            self.dir.join("sessions").display()
        ));
        let proc = start_controller_agent(
            &Netns::named(&names()[0]),
            &format!("{}:6653", link.spec.ctl_addr()),
            self.ctl_tls.as_ref().unwrap(),
            &["openflow=tcp:127.0.0.1:6653".into()],
            &args,
            &self.controller_log(run),
        )
        .unwrap();
        self.controller_agent = Some(proc);
    }

    fn controller_log(&self, run: u32) -> PathBuf {
        self.dir.join(format!("controller-agent-{run}.log"))
    }

    fn switch_control(&self) -> PathBuf {
        self.dir.join("switch-agent.ctl")
    }

    fn controller_control(&self) -> PathBuf {
        self.dir.join("controller-agent.ctl")
    }

    fn ovs(&self) -> &Ovs {
        self.ovs.as_ref().unwrap()
    }

    /// Cuts (`up = false`) or restores one or both directions of the control link.
    fn set_link(&self, ctl_to_sw: Option<bool>, sw_to_ctl: Option<bool>) {
        let patch = |up: Option<bool>| {
            up.map(|up| DirPatch {
                up: Some(up),
                ..DirPatch::default()
            })
        };
        let rec = self.link.as_ref().unwrap().emulator.as_ref().unwrap();
        rec.control()
            .set(patch(ctl_to_sw), patch(sw_to_ctl))
            .unwrap();
    }

    /// Times OVS's rconn logged a new connection to the switch agent.
    fn ovs_connections(&self) -> usize {
        self.ovs_log()
            .lines()
            .filter(|l| l.contains("rconn") && l.ends_with(": connected"))
            .count()
    }

    fn ovs_log(&self) -> String {
        std::fs::read_to_string(self.ovs().dir.join("ovs-vswitchd.log")).unwrap()
    }

    fn ping_ok(&self) {
        let h1 = &names()[2];
        ping_until_reply(h1, "10.0.0.2", PATIENCE);
        let st = ping(&Netns::named(h1), "10.0.0.2", 3, 0.2).unwrap();
        assert!(st.all_replied(), "h1 -> h2: {st:?}");
    }

    /// Pings once os-ken has programmed the switch afresh: every flow is removed
    /// first, so the hosts reach each other only through a working OpenFlow
    /// session (table-miss entry, packet-ins, learned flows).
    fn wipe_flows(&self) {
        self.ovs().del_flows("br0").unwrap();
    }

    fn ping_through_fresh_flows(&self) {
        self.ping_ok();
        let flows = self.ovs().dump_flows("br0").unwrap();
        assert!(
            flows.contains("dl_dst=02:51:00:00:00:02") && flows.contains("actions=output:"),
            "no learned flow after the reconnect:\n{flows}"
        );
    }
}

/// The first connection in an agent's `status` answer.
fn connection(socket: &Path) -> serde_json::Value {
    control_status(socket)["connections"][0].clone()
}

#[test]
fn after_a_controller_agent_restart_ovs_resumes_in_0rtt_with_only_replay_safe_messages_early() {
    let _s = serial();
    require_root();
    // 20 ms each way; a grace period long enough to hold through the cut below.
    let mut bed = Bed::up(Duration::from_millis(20), &["--grace=10s"]);
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
    let bed = Bed::up(Duration::from_millis(5), &["--grace=4s"]);
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
    let mut bed = Bed::up(Duration::from_millis(5), &["--grace=14s"]);
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
