//! A one-switch lab with real parts for the end-to-end tests: Open vSwitch
//! 3.1 with two hosts, the os-ken L2 learning app, the `quicsdn` agents and an
//! emulated control link whose directions can be cut separately. Every name
//! starts with the test's prefix; all is removed by recorded PID and by name
//! on drop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
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

pub const PATIENCE: Duration = Duration::from_secs(60);

/// Everything a test started, removed by recorded PID and by name on drop.
pub struct Bed {
    /// Names everything: `P-ctl`, `P-sw1`, `P-h1`, `P-h2`, link `P-c1`.
    pub prefix: String,
    pub dir: PathBuf,
    pub link: Option<ControlLink>,
    pub ovs: Option<Ovs>,
    pub procs: Vec<ProcRecord>,
    pub controller_agent: Option<ProcRecord>,
    pub ctl_tls: Option<AgentTls>,
    pub agent_args: Vec<String>,
}

fn names(prefix: &str) -> [String; 4] {
    ["ctl", "sw1", "h1", "h2"].map(|n| format!("{prefix}-{n}"))
}

fn remove_all(prefix: &str) {
    let _ = quicsdn_lab::emulator::destroy_link_by_name(
        Path::new(quicsdn_lab::emulator::link::DEFAULT_RUN_DIR),
        &format!("{prefix}-c1"),
    );
    for name in names(prefix) {
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
        remove_all(&self.prefix);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bed {
    /// OVS with hosts h1 and h2, os-ken, and the agents with `agent_args` (for
    /// both), joined by an emulated control link with `delay` each way.
    pub fn up(prefix: &str, delay: Duration, agent_args: &[&str]) -> Bed {
        remove_all(prefix);
        let dir = PathBuf::from(format!("/run/quicsdn-lab/{prefix}-bed"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut bed = Bed {
            prefix: prefix.to_string(),
            dir: dir.clone(),
            link: None,
            ovs: None,
            procs: Vec::new(),
            controller_agent: None,
            ctl_tls: None,
            agent_args: agent_args.iter().map(|s| s.to_string()).collect(),
        };
        let [ctl_name, sw_name, h1, h2] = names(prefix);
        let ctl = Netns::create(&ctl_name).unwrap();
        let sw = Netns::create(&sw_name).unwrap();
        let spec = ControlLinkSpec::new(
            1,
            prefix,
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
    pub fn start_controller_agent(&mut self, run: u32) {
        let link = self.link.as_ref().unwrap();
        let mut args = self.agent_args.clone();
        args.push(format!("--control={}", self.controller_control().display()));
        args.push(format!(
            "--session-store={}",
            self.dir.join("sessions").display()
        ));
        let proc = start_controller_agent(
            &Netns::named(&names(&self.prefix)[0]),
            &format!("{}:6653", link.spec.ctl_addr()),
            self.ctl_tls.as_ref().unwrap(),
            &["openflow=tcp:127.0.0.1:6653".into()],
            &args,
            &self.controller_log(run),
        )
        .unwrap();
        self.controller_agent = Some(proc);
    }

    pub fn controller_log(&self, run: u32) -> PathBuf {
        self.dir.join(format!("controller-agent-{run}.log"))
    }

    pub fn switch_control(&self) -> PathBuf {
        self.dir.join("switch-agent.ctl")
    }

    pub fn controller_control(&self) -> PathBuf {
        self.dir.join("controller-agent.ctl")
    }

    pub fn ovs(&self) -> &Ovs {
        self.ovs.as_ref().unwrap()
    }

    /// Cuts (`up = false`) or restores one or both directions of the control link.
    pub fn set_link(&self, ctl_to_sw: Option<bool>, sw_to_ctl: Option<bool>) {
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
    pub fn ovs_connections(&self) -> usize {
        self.ovs_log()
            .lines()
            .filter(|l| l.contains("rconn") && l.ends_with(": connected"))
            .count()
    }

    pub fn ovs_log(&self) -> String {
        std::fs::read_to_string(self.ovs().dir.join("ovs-vswitchd.log")).unwrap()
    }

    pub fn ping_ok(&self) {
        let h1 = &names(&self.prefix)[2];
        ping_until_reply(h1, "10.0.0.2", PATIENCE);
        let st = ping(&Netns::named(h1), "10.0.0.2", 3, 0.2).unwrap();
        assert!(st.all_replied(), "h1 -> h2: {st:?}");
    }

    /// Pings once os-ken has programmed the switch afresh: every flow is removed
    /// first, so the hosts reach each other only through a working OpenFlow
    /// session (table-miss entry, packet-ins, learned flows).
    pub fn wipe_flows(&self) {
        self.ovs().del_flows("br0").unwrap();
    }

    /// Removes the flows the L2 app learned (not its table-miss entry), so the
    /// next pings go to the controller again as packet-ins.
    pub fn forget_learned_flows(&self) {
        let target = self.ovs().bridge_target("br0");
        for mac in ["02:51:00:00:00:01", "02:51:00:00:00:02"] {
            self.ovs()
                .ofctl(&[
                    "-O",
                    "OpenFlow13",
                    "del-flows",
                    &target,
                    &format!("dl_dst={mac}"),
                ])
                .unwrap();
        }
    }

    pub fn ping_through_fresh_flows(&self) {
        self.ping_ok();
        let flows = self.ovs().dump_flows("br0").unwrap();
        assert!(
            flows.contains("dl_dst=02:51:00:00:00:02") && flows.contains("actions=output:"),
            "no learned flow after the reconnect:\n{flows}"
        );
    }
}
