//! The multihomed lab of the bicast paper (`quic-sdn-multihomed-bicast`,
//! Figs. 6–7): a server, an Open vSwitch on the server side that duplicates
//! the server's packets onto two emulated paths with an OpenFlow group of type
//! ALL, an Open vSwitch on the client side that merges both paths onto the
//! client's one address, and a client.
//!
//! ```text
//!  P-srv                P-s1 (OVS, dpid 1)                          P-s2 (OVS, dpid 2)              P-cli
//!  server 10.0.0.1 ── 1 srv  group 1 (ALL) ─ 2 ══ path A (emulated) ══ 2 ─┐                      
//!                           └──────────────── 3 ══ path B (emulated) ══ 3 ─┴─ 1 cli ── client 10.0.0.2
//!                         │ switch agent                                  │ switch agent
//!                         └──────────── QUIC ─── P-ctl: controller agent, os-ken + controllers/bicast.py
//! ```
//!
//! * Both switches run real OVS 3.1 (userspace datapath), each in its own
//!   namespace with its own instance, bridge `br0`, OpenFlow 1.3, fail mode
//!   secure (no flow, no forwarding until the controller speaks).
//! * The paths are the lab's userspace link emulator: each is one
//!   [`crate::emulator`] link whose two TAP devices are OVS ports (OpenFlow
//!   ports 2 and 3 on both switches), with its own delay, loss and rate per
//!   direction. The TAPs' own addresses (10.253.1.0/30, 10.253.2.0/30) are
//!   unused: OVS takes the frames.
//! * The rules (the paper's Tables III–V) come from os-ken running
//!   `controllers/bicast.py` through the quicsdn agents: each OVS talks
//!   OpenFlow to its switch agent's unix socket, the agents carry it over one
//!   QUIC connection per switch to the controller agent beside os-ken. The
//!   control network is two veth pairs (P-ctl ↔ P-s1, P-ctl ↔ P-s2), apart
//!   from the data paths.
//! * `unicast` installs the same topology with path A only (Table V);
//!   `bicast-both` duplicates the client's direction too (control-channel
//!   bicast: the client namespace then runs a switch's OVS and agent, the
//!   server namespace its controller, `lab/tests/control_bicast_e2e.rs`).
//!
//! Everything is removed on drop (processes by PID, OVS by its recorded
//! PIDs, links by record, namespaces by name); [`Multihomed::up`] first
//! removes what a crashed run with the same prefix left.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::agents::{AgentTls, openflow_socket, start_controller_agent, start_switch_agent};
use crate::controller::{ControllerSpec, start_controller_with};
use crate::emulator::{self, Accounting, DirSettings, LinkRecord, LinkSpec};
use crate::host::{HostSpec, attach_host};
use crate::netns::{Netns, VethEnd, create_veth};
use crate::ovs::{BridgeConfig, Ovs};
use crate::process::ProcRecord;
use crate::wait::poll_until;

/// The server's address (on the server-side switch's port 1).
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The client's address (on the client-side switch's port 1).
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const BRIDGE: &str = "br0";
/// OpenFlow ports, the same on both switches (`controllers/bicast.py`).
const HOST_OFPORT: u16 = 1;
const PATH_OFPORTS: [u16; 2] = [2, 3];

/// Unicast (path A) or bicast (every server packet on both paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Unicast,
    Bicast,
    /// Both directions on both paths: control-channel bicast, where the
    /// client is a switch agent and the server its controller agent.
    BicastBoth,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Unicast => "unicast",
            Mode::Bicast => "bicast",
            Mode::BicastBoth => "bicast-both",
        }
    }
}

/// What [`Multihomed::up`] builds.
#[derive(Debug, Clone)]
pub struct MultihomedSpec {
    /// Names: namespaces `P-srv`, `P-s1`, `P-s2`, `P-cli`, `P-ctl`, links
    /// `P-pa`, `P-pb`; at most 8 characters.
    pub prefix: String,
    pub mode: Mode,
    /// Each path's settings, server→client and client→server.
    pub paths: [(DirSettings, DirSettings); 2],
    /// OVS directories, certificates, logs.
    pub dir: PathBuf,
    /// The repository (controllers/) and the controllers' venvs.
    pub repo_dir: PathBuf,
    pub venv_dir: Option<PathBuf>,
}

impl MultihomedSpec {
    /// Both paths and both directions alike, the repository's controllers:
    /// what the benches and `multihomed up` build.
    pub fn alike(
        prefix: &str,
        mode: Mode,
        path: DirSettings,
        dir: PathBuf,
        venv_dir: Option<PathBuf>,
    ) -> MultihomedSpec {
        MultihomedSpec {
            prefix: prefix.to_string(),
            mode,
            paths: [(path.clone(), path.clone()), (path.clone(), path)],
            dir,
            repo_dir: crate::topology::default_repo_dir(),
            venv_dir,
        }
    }
}

/// A running multihomed lab. Fields drop in this order: processes, OVS,
/// links, namespaces.
pub struct Multihomed {
    procs: Vec<ProcRecord>,
    ovs: Vec<Ovs>,
    links: Vec<LinkRecord>,
    namespaces: Vec<String>,
    pub prefix: String,
    pub mode: Mode,
    pub dir: PathBuf,
    pki: PathBuf,
}

/// The lab's namespaces: server, server-side switch, client-side switch,
/// client, controller.
pub fn namespace_names(prefix: &str) -> [String; 5] {
    ["srv", "s1", "s2", "cli", "ctl"].map(|n| format!("{prefix}-{n}"))
}

/// The MAC of host `i` (0: the server, 1: the client).
fn host_mac(i: usize) -> String {
    format!("02:14:00:00:00:{:02x}", i + 1)
}

/// Path `path`'s (0: A, 1: B) emulated link.
pub fn link_name(prefix: &str, path: usize) -> String {
    format!("{prefix}-p{}", ["a", "b"][path])
}

/// Removes what a run with `prefix` left: links, processes in its namespaces,
/// the namespaces.
pub fn remove_leftovers(prefix: &str) -> Result<()> {
    for path in 0..2 {
        let _ = emulator::destroy_link_by_name(
            Path::new(emulator::link::DEFAULT_RUN_DIR),
            &link_name(prefix, path),
        );
    }
    for ns in namespace_names(prefix) {
        if Netns::exists(&ns) {
            let n = Netns::named(&ns);
            n.kill_all(Duration::from_secs(2))?;
            n.delete()?;
        }
    }
    Ok(())
}

impl Drop for Multihomed {
    fn drop(&mut self) {
        for p in self.procs.drain(..).rev() {
            let _ = p.terminate(Duration::from_secs(3));
        }
        for o in self.ovs.drain(..) {
            let _ = o.stop();
        }
        for l in self.links.drain(..) {
            if let Err(e) = emulator::destroy_link(&l) {
                eprintln!("cleanup: {e:#}");
            }
        }
        for ns in self.namespaces.drain(..) {
            let n = Netns::named(&ns);
            let _ = n.kill_all(Duration::from_secs(2));
            let _ = n.delete();
        }
    }
}

impl Multihomed {
    pub fn server_ns(&self) -> Netns {
        Netns::named(format!("{}-srv", self.prefix))
    }

    pub fn client_ns(&self) -> Netns {
        Netns::named(format!("{}-cli", self.prefix))
    }

    /// Certificates for the proxies (and anything else that needs one), issued
    /// by the lab's CA: `(ca, cert, key)`.
    pub fn issue(&self, name: &str) -> Result<AgentTls> {
        let pki = crate::pki::Pki::open(&self.pki);
        let p = pki.issue(name)?;
        Ok(AgentTls {
            ca: pki.ca_cert(),
            cert: p.cert,
            key: p.key,
        })
    }

    /// Builds the lab and waits until both switches hold the controller's
    /// rules and the client reaches the server.
    pub fn up(spec: &MultihomedSpec) -> Result<Multihomed> {
        crate::cmd::require_root()?;
        if spec.prefix.len() > 8 {
            bail!("prefix {:?}: at most 8 characters", spec.prefix);
        }
        remove_leftovers(&spec.prefix)?;
        let _ = std::fs::remove_dir_all(&spec.dir);
        std::fs::create_dir_all(&spec.dir)?;
        let p = &spec.prefix;
        let mut lab = Multihomed {
            procs: Vec::new(),
            ovs: Vec::new(),
            links: Vec::new(),
            namespaces: Vec::new(),
            prefix: p.clone(),
            mode: spec.mode,
            dir: spec.dir.clone(),
            pki: spec.dir.join("pki"),
        };
        let [srv, s1, s2, cli, ctl] = namespace_names(p).map(|n| Netns::named(&n));
        for ns in [&srv, &s1, &s2, &cli, &ctl] {
            Netns::create(&ns.name)?;
            lab.namespaces.push(ns.name.clone());
            ns.disable_ipv6()?;
        }

        // The switches, with the hosts on port 1.
        for (i, (sw, host, ip, port)) in
            [(&s1, &srv, SERVER_IP, "srv"), (&s2, &cli, CLIENT_IP, "cli")]
                .into_iter()
                .enumerate()
        {
            let ovs = Ovs::start(sw, &spec.dir.join(format!("s{}", i + 1)))?;
            lab.ovs.push(ovs.clone());
            let mut bridge = BridgeConfig::new(BRIDGE);
            bridge.datapath_id = Some(i as u64 + 1);
            ovs.add_bridge(&bridge)?;
            attach_host(
                &HostSpec {
                    netns: host.name.clone(),
                    ifname: "eth0".into(),
                    mac: host_mac(i),
                    cidr: format!("{ip}/24"),
                    port: port.into(),
                    ofport: Some(HOST_OFPORT),
                },
                &ovs,
                BRIDGE,
            )?;
        }

        // Each host knows the other's MAC, so ARP never crosses the lossy
        // paths. The paths are one L2 segment here, where a deployment would
        // have a router on a clean LAN next to each end. Across a 30 %-loss
        // path the kernel's neighbour entry would go PROBE and FAILED and
        // then drop every datagram until ARP got through, for seconds: the
        // lossy path's loss plus outages no transport can repair, which TCP
        // (which confirms its neighbour with every ACK) meets less often
        // than UDP. Measured with 1 s ARP timers in `bench control-bicast`:
        // 2 and 3 control sessions lost in two runs of 100 rounds at 30 % on
        // one path, none with the entries pinned (docs/proxy.md).
        for (ns, peer_ip, peer) in [(&srv, CLIENT_IP, 1), (&cli, SERVER_IP, 0)] {
            ns.ip(&[
                "neigh",
                "replace",
                &peer_ip.to_string(),
                "lladdr",
                &host_mac(peer),
                "dev",
                "eth0",
                "nud",
                "permanent",
            ])?;
        }

        // The two paths: emulated links whose TAPs are OVS ports.
        let exe = crate::agents::lab_binary()?;
        for path in 0..2 {
            let name = link_name(p, path);
            let mut ls = LinkSpec::new(
                &name,
                &s1.name,
                &s2.name,
                Ipv4Addr::new(10, 253, path as u8 + 1, 1),
                Ipv4Addr::new(10, 253, path as u8 + 1, 2),
            );
            ls.a_to_b = spec.paths[path].0.clone();
            ls.b_to_a = spec.paths[path].1.clone();
            ls.tap_a = format!("{name}-s");
            ls.tap_b = format!("{name}-c");
            let rec = emulator::create_link(&ls, &exe)
                .with_context(|| format!("creating path {}", ["A", "B"][path]))?;
            let (tap_a, tap_b) = (rec.tap_a.clone(), rec.tap_b.clone());
            lab.links.push(rec);
            lab.ovs[0].add_port(BRIDGE, &tap_a, Some(PATH_OFPORTS[path]))?;
            lab.ovs[1].add_port(BRIDGE, &tap_b, Some(PATH_OFPORTS[path]))?;
        }

        // The control network and the controller, through the agents.
        let pki = crate::pki::Pki::create(&lab.pki)?;
        let tls = |name: &str| -> Result<AgentTls> {
            let p = pki.issue(name)?;
            Ok(AgentTls {
                ca: pki.ca_cert(),
                cert: p.cert,
                key: p.key,
            })
        };
        for (i, sw) in [&s1, &s2].into_iter().enumerate() {
            let n = i as u8 + 1;
            create_veth(
                &VethEnd::new(&ctl, &format!("s{n}")),
                &VethEnd::new(sw, "ctl"),
            )?;
            ctl.add_addr(&format!("s{n}"), &format!("10.254.{n}.1/30"))?;
            sw.add_addr("ctl", &format!("10.254.{n}.2/30"))?;
            ctl.link_up(&format!("s{n}"))?;
            sw.link_up("ctl")?;
        }
        let controller = start_controller_with(
            &ctl,
            &ControllerSpec {
                venv_dir: spec.venv_dir.clone(),
                ..ControllerSpec::osken_on_loopback(spec.dir.join("ctl"), spec.repo_dir.clone())
            },
            &[
                spec.repo_dir
                    .join("controllers/bicast.py")
                    .display()
                    .to_string(),
                format!("--bicast-mode={}", spec.mode.as_str()),
            ],
        )?;
        let controller_log = controller.log.clone();
        lab.procs.push(controller.proc);
        lab.procs.push(start_controller_agent(
            &ctl,
            "0.0.0.0:6653",
            &tls("ctl")?,
            &["openflow=tcp:127.0.0.1:6653".into()],
            &[],
            &spec.dir.join("ctl/quicsdn-controller.log"),
        )?);
        for i in 0..2 {
            let ovs = lab.ovs[i].clone();
            let sock = openflow_socket(&ovs.dir);
            lab.procs.push(start_switch_agent(
                &Netns::named(&ovs.netns),
                &format!("10.254.{}.1:6653", i + 1),
                "ctl",
                &tls(&format!("s{}", i + 1))?,
                &[format!("openflow=punix:{}", sock.display())],
                &[],
                &ovs.dir.join("quicsdn-switch.log"),
            )?);
            ovs.set_controller(BRIDGE, &[format!("unix:{}", sock.display())])?;
        }
        for ovs in &lab.ovs {
            ovs.wait_connected(BRIDGE, Duration::from_secs(30))?;
        }
        // The app logs one line per switch after the BARRIER reply.
        poll_until(
            "the controller's rules on both switches",
            Duration::from_secs(30),
            || {
                let log = std::fs::read_to_string(&controller_log).unwrap_or_default();
                Ok((1..=2)
                    .all(|d| log.contains(&format!("rules on datapath {d}\n")))
                    .then_some(()))
            },
        )
        .with_context(|| format!("see {}", controller_log.display()))?;
        if log_has_error(&controller_log) {
            bail!(
                "a switch refused the controller's rules: {}",
                crate::process::log_tail(&controller_log, 10)
            );
        }
        // The data path works end to end.
        let st = crate::host::ping(&cli, &SERVER_IP.to_string(), 3, 0.2)?;
        if st.received == 0 {
            bail!("the client does not reach the server through the switches: {st:?}");
        }
        Ok(lab)
    }

    /// The group and flow tables of switch `i` (1: server side, 2: client
    /// side), as OVS's own tools print them (read only).
    pub fn tables(&self, i: usize) -> Result<String> {
        let ovs = &self.ovs[i - 1];
        let target = ovs.bridge_target(BRIDGE);
        let dump = |what: &str| {
            ovs.ofctl(&[
                "-O",
                "OpenFlow13",
                "--no-names",
                "--no-stats",
                what,
                &target,
            ])
        };
        let (groups, flows) = (dump("dump-groups")?, dump("dump-flows")?);
        Ok(format!("{groups}{flows}"))
    }

    /// Changes both directions' loss of both paths (the client-side paths
    /// of the paper's Fig. 8), keeping the other settings.
    pub fn set_loss(&self, loss: emulator::model::LossModel) -> Result<()> {
        for path in 0..self.links.len() {
            self.set_path_loss(path, loss)?;
        }
        Ok(())
    }

    /// Changes both directions' loss of path `path` (0: A, 1: B).
    pub fn set_path_loss(&self, path: usize, loss: emulator::model::LossModel) -> Result<()> {
        self.path_control(path)
            .set_both(emulator::control::DirPatch {
                loss: Some(loss),
                ..Default::default()
            })?;
        Ok(())
    }

    /// Cuts or restores path `path` (0: A, 1: B), both directions.
    pub fn set_path_up(&self, path: usize, up: bool) -> Result<()> {
        self.path_control(path)
            .set_both(emulator::control::DirPatch {
                up: Some(up),
                ..Default::default()
            })?;
        Ok(())
    }

    /// The control handle of path `path`'s emulator, for use from another
    /// thread (a path restored at its time while a probe waits).
    pub fn path_control(&self, path: usize) -> emulator::LinkControl {
        self.links[path].control()
    }

    pub fn reset_counters(&self) -> Result<()> {
        for l in &self.links {
            l.control().reset_counters()?;
        }
        Ok(())
    }

    /// What each path carried since the last reset: per path, server→client
    /// then client→server.
    pub fn path_counters(&self) -> Result<[[PathCount; 2]; 2]> {
        let acc = Accounting::default();
        let mut out = [[PathCount::default(); 2]; 2];
        for (i, l) in self.links.iter().enumerate() {
            let r = l.control().show()?.report(&acc);
            for (j, d) in [&r.a_to_b, &r.b_to_a].into_iter().enumerate() {
                out[i][j] = PathCount {
                    frames: d.total.offered.frames,
                    bytes: d.total.offered.bytes,
                    lost: d.total.lost.frames,
                };
            }
        }
        Ok(out)
    }

    /// Fails if a process of the lab has died.
    pub fn check_alive(&self) -> Result<()> {
        for p in &self.procs {
            if !p.is_alive() {
                bail!("{} (pid {}) exited", p.name, p.pid);
            }
        }
        for o in &self.ovs {
            if !o.is_alive() {
                bail!("Open vSwitch in {} exited", o.netns);
            }
        }
        Ok(())
    }

    /// Leaves everything running (processes are in their own process
    /// groups): for `quicsdn-lab multihomed up`, whose `down` removes the lab
    /// by its names ([`remove_leftovers`]).
    pub fn detach(mut self) {
        self.procs.clear();
        self.ovs.clear();
        self.links.clear();
        self.namespaces.clear();
    }

    /// Adopts a process started in the lab, so that it is stopped with it.
    pub fn adopt(&mut self, p: ProcRecord) {
        self.procs.push(p);
    }

    /// Stops an adopted process (by PID) and forgets it.
    pub fn stop(&mut self, p: &ProcRecord) -> Result<()> {
        self.procs.retain(|q| q.pid != p.pid);
        p.terminate(Duration::from_secs(3))
    }
}

/// One direction of a path from the benches' `--rtt` (half of it each way)
/// and `--rate` options.
pub fn path_settings(rtt: &str, rate: &str) -> Result<DirSettings> {
    Ok(DirSettings {
        delay_ns: emulator::units::parse_duration_ns(rtt)
            .map_err(|e| anyhow::anyhow!("--rtt: {e}"))?
            / 2,
        rate_bps: emulator::units::parse_rate_bps(rate)
            .map_err(|e| anyhow::anyhow!("--rate: {e}"))?,
        ..Default::default()
    })
}

/// A second, real switch whose control channel crosses the lab
/// (control-channel bicast): Open vSwitch with bridge `br0` (no ports) in the
/// client namespace, its `quicsdn switch` there, and a `quicsdn controller`
/// in the server namespace that hands OpenFlow to `openflow_target` there.
/// The lab adopts all of it: it stops with the lab.
pub struct ControlledSwitch {
    pub ovs: Ovs,
}

impl ControlledSwitch {
    pub const BRIDGE: &'static str = "br0";
    /// The controller agent's UDP port on the server's address.
    pub const AGENT_PORT: u16 = 6653;

    /// Starts it and points OVS at its switch agent; `controller_extra` are
    /// extra options of the controller agent. Does not wait for OVS to
    /// connect: the controller behind `openflow_target` must be listening.
    pub fn start(
        lab: &mut Multihomed,
        dir: &Path,
        dpid: u64,
        openflow_target: &str,
        controller_extra: &[String],
    ) -> Result<ControlledSwitch> {
        let (server, client) = (lab.server_ns(), lab.client_ns());
        let ovs = Ovs::start(&client, dir)?;
        lab.ovs.push(ovs.clone());
        let mut bridge = BridgeConfig::new(Self::BRIDGE);
        bridge.datapath_id = Some(dpid);
        ovs.add_bridge(&bridge)?;
        let agent = format!("{SERVER_IP}:{}", Self::AGENT_PORT);
        let ctl = start_controller_agent(
            &server,
            &agent,
            &lab.issue("controlled-ctl")?,
            &[format!("openflow={openflow_target}")],
            controller_extra,
            &dir.join("quicsdn-controller.log"),
        )?;
        lab.adopt(ctl);
        let sock = openflow_socket(&ovs.dir);
        let sw = start_switch_agent(
            &client,
            &agent,
            "controlled-ctl",
            &lab.issue("controlled-sw")?,
            &[format!("openflow=punix:{}", sock.display())],
            &[],
            &ovs.dir.join("quicsdn-switch.log"),
        )?;
        lab.adopt(sw);
        ovs.set_controller(Self::BRIDGE, &[format!("unix:{}", sock.display())])?;
        Ok(ControlledSwitch { ovs })
    }
}

fn log_has_error(log: &Path) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("refused a message")
}

/// What one direction of a path carried (offered to it: lost frames count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PathCount {
    pub frames: u64,
    pub bytes: u64,
    pub lost: u64,
}
