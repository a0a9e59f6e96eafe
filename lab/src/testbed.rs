//! A one-switch testbed for tests and benchmarks that drive a real Open vSwitch
//! with their own controller program: a switch namespace with OVS (and
//! optionally hosts), a controller namespace, one emulated control link, and
//! either a direct TCP connection or the quicsdn agents in between.
//!
//! ```text
//!  P-h1 ─ P-sw1: OVS br0 ──[tcp | switch agent]══ emulated link P-c1 ══[ | controller agent]── P-ctl: program
//! ```
//!
//! The program listens on 6653 in `P-ctl` (on every address for `tcp`, on
//! loopback behind the controller agent) and takes the switch's connection with
//! [`Testbed::accept_controller`]. Everything is removed on drop, also when
//! setting up fails half-way.
//!
//! [`Testbed::build`] gives OVS several controller targets ([`Targets`]):
//! target `i` (from 0) is served on port `6653 + i` in `P-ctl`, either by the
//! testbed's listeners or by controllers the test starts there (e.g. os-ken)
//! before [`Testbed::point_ovs`]. Through the agents, each target has its own
//! switch agent and controller agent (its own QUIC connection; controller
//! agent `i` on UDP `6653 + i`), or all targets share one pair as services of
//! their own ([`AgentLayout`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::agents::{
    AgentTls, lab_binary, openflow_socket, start_controller_agent, start_switch_agent,
};
use crate::control_link::{ControlLink, ControlLinkSpec, Impairment};
use crate::emulator::nat::{NatSettings, Side};
use crate::emulator::sys::in_netns;
use crate::host::{HostSpec, attach_host};
use crate::netns::Netns;
use crate::openflow_peer::Controller;
use crate::ovs::{BridgeConfig, Ovs};
use crate::pki::Pki;
use crate::process::ProcRecord;

/// How the switch reaches the controller program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    Tcp,
    /// The agents, with extra options for each (e.g. `--streams=rr:16` for the
    /// switch agent, which opens the session, or `--relaxed-flow-mods`).
    Agents {
        switch_args: Vec<String>,
        controller_args: Vec<String>,
    },
}

/// With the agents, how OVS's controller targets map to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentLayout {
    /// One switch agent and one controller agent per target: every target
    /// has its own QUIC connection. OVS reaches target `i` at
    /// [`Testbed::openflow_socket`]`(i)`; controller agent `i` listens on UDP
    /// `6653 + i`.
    PerTarget,
    /// One switch agent and one controller agent: target `i` is a service of
    /// its own (`openflow`, then `openflow2`, `openflow3`, …, all OpenFlow
    /// framing), one session each on their one QUIC connection.
    Shared,
}

/// OVS's controller targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targets {
    /// How many; target `i` (from 0) is served on port `6653 + i` in `P-ctl`.
    pub count: u16,
    /// With the agents: per target or shared (ignored for `tcp`).
    pub agents: AgentLayout,
    /// Whether the testbed listens on the targets' ports for the test's own
    /// program ([`Testbed::accept_controller_at`]); if not, the test starts its
    /// controllers there itself.
    pub listen: bool,
}

impl Targets {
    /// [`Testbed::up`]'s: one target, the testbed listens.
    pub fn one() -> Targets {
        Targets {
            count: 1,
            agents: AgentLayout::PerTarget,
            listen: true,
        }
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct TestbedSpec {
    /// Names everything: `P-ctl`, `P-sw1`, `P-hJ`, link `P-c1`.
    pub prefix: String,
    /// The control link, each direction.
    pub impairment: Impairment,
    pub via: Via,
    /// Hosts on the bridge: `P-hJ` with `10.0.0.J/24` on OpenFlow port J.
    pub hosts: u32,
}

/// One of the testbed's agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentRole {
    Switch,
    Controller,
}

/// How an agent was started, to start it again the same way.
#[derive(Debug, Clone)]
struct AgentStart {
    role: AgentRole,
    /// Index of its pair (see [`AgentLayout`]).
    pair: usize,
    netns: String,
    /// The controller agent's UDP address (where it listens, where the switch
    /// agent connects).
    udp: String,
    tls: AgentTls,
    services: Vec<String>,
    extra: Vec<String>,
    log: PathBuf,
    /// Its index in `procs`.
    proc: usize,
}

impl AgentStart {
    fn start(&self) -> Result<ProcRecord> {
        let ns = Netns::named(&self.netns);
        match self.role {
            AgentRole::Controller => start_controller_agent(
                &ns,
                &self.udp,
                &self.tls,
                &self.services,
                &self.extra,
                &self.log,
            ),
            AgentRole::Switch => start_switch_agent(
                &ns,
                &self.udp,
                "ctl",
                &self.tls,
                &self.services,
                &self.extra,
                &self.log,
            ),
        }
    }
}

/// A built testbed.
pub struct Testbed {
    pub prefix: String,
    pub dir: PathBuf,
    ovs: Option<Ovs>,
    link: Option<ControlLink>,
    procs: Vec<ProcRecord>,
    listeners: Vec<TcpListener>,
    /// OVS's controller targets, in order.
    ovs_targets: Vec<String>,
    pub hosts: Vec<Netns>,
    agents: Vec<AgentStart>,
    /// Restarts so far, for numbering the old agents' logs.
    restarts: u32,
}

/// `stem.ext` for 0, `stem2.ext` for 1, …
fn numbered(stem: &str, i: usize, ext: &str) -> String {
    match i {
        0 => format!("{stem}.{ext}"),
        _ => format!("{stem}{}.{ext}", i + 1),
    }
}

fn names(prefix: &str) -> (String, String) {
    (format!("{prefix}-ctl"), format!("{prefix}-sw1"))
}

/// Removes what a testbed with `prefix` may have left: namespaces (with every
/// process inside) and the control link.
pub fn remove(prefix: &str, hosts: u32) {
    let (ctl, sw) = names(prefix);
    let _ = crate::emulator::destroy_link_by_name(
        Path::new(crate::emulator::link::DEFAULT_RUN_DIR),
        &format!("{prefix}-c1"),
    );
    let host_names = (1..=hosts).map(|j| format!("{prefix}-h{j}"));
    for name in host_names.chain([sw, ctl]) {
        if Netns::exists(&name) {
            let ns = Netns::named(&name);
            let _ = ns.kill_all(Duration::from_secs(5));
            let _ = ns.delete();
        }
    }
}

impl Testbed {
    /// Builds a testbed with one controller target and points OVS at it.
    pub fn up(spec: &TestbedSpec) -> Result<Testbed> {
        let bed = Testbed::build(spec, &Targets::one())?;
        bed.point_ovs()?;
        Ok(bed)
    }

    /// Builds everything for `targets` (OVS, hosts, the link, listeners or the
    /// agents) but leaves OVS without a controller until [`Testbed::point_ovs`].
    pub fn build(spec: &TestbedSpec, targets: &Targets) -> Result<Testbed> {
        if !(1..=100).contains(&targets.count) {
            bail!(
                "a testbed has 1 to 100 controller targets, not {}",
                targets.count
            );
        }
        let p = spec.prefix.as_str();
        remove(p, spec.hosts);
        let dir = PathBuf::from(format!("/run/quicsdn-lab/{p}-bed"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut bed = Testbed {
            prefix: p.to_string(),
            dir: dir.clone(),
            ovs: None,
            link: None,
            procs: Vec::new(),
            listeners: Vec::new(),
            ovs_targets: Vec::new(),
            hosts: Vec::new(),
            agents: Vec::new(),
            restarts: 0,
        };
        let (ctl_name, sw_name) = names(p);
        let ctl = Netns::create(&ctl_name)?;
        let sw = Netns::create(&sw_name)?;
        let link_spec = ControlLinkSpec::new(1, p, &ctl_name, &sw_name, spec.impairment);
        let ctl_ip = link_spec.ctl_addr();
        bed.link = Some(ControlLink::create(link_spec, &lab_binary()?)?);
        let ovs = Ovs::start(&sw, &dir.join("sw1"))?;
        bed.ovs = Some(ovs.clone());
        ovs.add_bridge(&BridgeConfig::new("br0"))?;
        for j in 1..=spec.hosts {
            let ns = Netns::create(&format!("{p}-h{j}"))?;
            bed.hosts.push(Netns::named(&ns.name));
            attach_host(
                &HostSpec {
                    netns: ns.name.clone(),
                    ifname: "eth0".into(),
                    mac: format!("02:51:00:00:00:{j:02x}"),
                    cidr: format!("10.0.0.{j}/24"),
                    port: format!("h{j}"),
                    ofport: Some(j as u16),
                },
                &ovs,
                "br0",
            )?;
        }
        let host = if spec.via == Via::Tcp {
            "0.0.0.0"
        } else {
            "127.0.0.1"
        };
        let ports = (0..targets.count).map(|i| 6653 + i);
        if targets.listen {
            for port in ports.clone() {
                let listen = format!("{host}:{port}");
                let listener = in_netns(&ctl_name, {
                    let listen = listen.clone();
                    move || TcpListener::bind(listen)
                })?
                .with_context(|| format!("listening on {listen} in {ctl_name}"))?;
                listener.set_nonblocking(true)?;
                bed.listeners.push(listener);
            }
        }
        bed.ovs_targets = match &spec.via {
            Via::Tcp => ports.map(|port| format!("tcp:{ctl_ip}:{port}")).collect(),
            Via::Agents {
                switch_args,
                controller_args,
            } => {
                let pki = Pki::create(&dir.join("pki"))?;
                let tls = |name: &str| -> Result<AgentTls> {
                    let pair = pki.issue(name)?;
                    Ok(AgentTls {
                        ca: pki.ca_cert(),
                        cert: pair.cert,
                        key: pair.key,
                    })
                };
                let (ctl_tls, sw_tls) = (tls("ctl")?, tls("sw1")?);
                let mut ovs_targets = Vec::new();
                // (controller agent's services, switch agent's services) of each pair.
                let mut pairs: Vec<(Vec<String>, Vec<String>)> = Vec::new();
                for (i, port) in ports.enumerate() {
                    let socket = bed.openflow_socket(i);
                    let (ctl_service, sw_service) = match targets.agents {
                        AgentLayout::PerTarget => (
                            format!("openflow=tcp:127.0.0.1:{port}"),
                            format!("openflow=punix:{}", socket.display()),
                        ),
                        AgentLayout::Shared => {
                            let name = match i {
                                0 => "openflow".to_string(),
                                _ => format!("openflow{}:openflow", i + 1),
                            };
                            (
                                format!("{name}=tcp:127.0.0.1:{port}"),
                                format!("{name}=punix:{}", socket.display()),
                            )
                        }
                    };
                    if i == 0 || targets.agents == AgentLayout::PerTarget {
                        pairs.push((vec![], vec![]));
                    }
                    let pair = pairs.last_mut().expect("pushed above");
                    pair.0.push(ctl_service);
                    pair.1.push(sw_service);
                    ovs_targets.push(format!("unix:{}", socket.display()));
                }
                for (i, (ctl_services, sw_services)) in pairs.iter().enumerate() {
                    let udp = format!("{ctl_ip}:{}", 6653 + i);
                    let agents = [
                        (
                            AgentRole::Controller,
                            &ctl,
                            &ctl_tls,
                            ctl_services,
                            controller_args,
                            bed.controller_agent_log(i),
                        ),
                        (
                            AgentRole::Switch,
                            &sw,
                            &sw_tls,
                            sw_services,
                            switch_args,
                            bed.switch_agent_log(i),
                        ),
                    ];
                    for (role, ns, tls, services, extra, log) in agents {
                        let start = AgentStart {
                            role,
                            pair: i,
                            netns: ns.name.clone(),
                            udp: udp.clone(),
                            tls: tls.clone(),
                            services: services.clone(),
                            extra: extra.clone(),
                            log,
                            proc: bed.procs.len(),
                        };
                        bed.procs.push(start.start()?);
                        bed.agents.push(start);
                    }
                }
                ovs_targets
            }
        };
        Ok(bed)
    }

    /// Points `br0` at every controller target (see [`Ovs::set_controller`]).
    pub fn point_ovs(&self) -> Result<()> {
        self.ovs().set_controller("br0", &self.ovs_targets)
    }

    /// OVS's controller targets, in order.
    pub fn ovs_targets(&self) -> &[String] {
        &self.ovs_targets
    }

    /// The controller namespace, `P-ctl`.
    pub fn ctl(&self) -> Netns {
        Netns::named(names(&self.prefix).0)
    }

    /// The unix socket OVS connects to for target `i` through the agents:
    /// `quicsdn-openflow.sock`, then `quicsdn-openflow2.sock`, … in OVS's
    /// run directory.
    pub fn openflow_socket(&self, i: usize) -> PathBuf {
        let first = openflow_socket(&self.dir.join("sw1"));
        match i {
            0 => first,
            _ => first.with_file_name(format!("quicsdn-openflow{}.sock", i + 1)),
        }
    }

    /// Log of controller agent `i`: `controller-agent.log`, then
    /// `controller-agent2.log`, …
    pub fn controller_agent_log(&self, i: usize) -> PathBuf {
        self.dir.join(numbered("controller-agent", i, "log"))
    }

    /// Log of switch agent `i`: `switch-agent.log`, then `switch-agent2.log`, …
    pub fn switch_agent_log(&self, i: usize) -> PathBuf {
        self.dir.join(numbered("switch-agent", i, "log"))
    }

    pub fn ovs(&self) -> &Ovs {
        self.ovs.as_ref().expect("set up")
    }

    /// Restarts `ovs-vswitchd` (its database, bridges and controller targets
    /// stay; its flow tables do not), with `extra` options such as
    /// `--verbose=vconn:file:dbg`.
    pub fn restart_vswitchd(&mut self, extra: &[&str]) -> Result<()> {
        self.ovs.as_mut().expect("set up").restart_vswitchd(extra)
    }

    fn agent(&self, role: AgentRole, pair: usize) -> Result<&AgentStart> {
        self.agents
            .iter()
            .find(|a| a.role == role && a.pair == pair)
            .with_context(|| format!("the testbed has no {role:?} agent {pair}"))
    }

    /// The running process of an agent (of pair `pair`).
    pub fn agent_proc(&self, role: AgentRole, pair: usize) -> Result<&ProcRecord> {
        Ok(&self.procs[self.agent(role, pair)?.proc])
    }

    /// Starts an agent again the way it was started first (after it died or was
    /// killed, as a supervisor would). Its previous log is kept beside the new
    /// one as `LOG.N`.
    pub fn restart_agent(&mut self, role: AgentRole, pair: usize) -> Result<()> {
        let start = self.agent(role, pair)?.clone();
        self.procs[start.proc].kill()?;
        self.restarts += 1;
        let old = start.log.with_extension(format!("log.{}", self.restarts));
        let _ = std::fs::rename(&start.log, old);
        self.procs[start.proc] = start.start()?;
        Ok(())
    }

    pub fn link(&self) -> &ControlLink {
        self.link.as_ref().expect("set up")
    }

    /// Re-addresses the switch side of the control link, as when a switch's
    /// interface gets a new address: adds `new` (a /32), removes the link's
    /// original switch address, and routes the controller side from `new`;
    /// the controller namespace gets a host route back. Sockets bound to the
    /// old address keep it and can no longer send.
    pub fn readdress_switch(&self, new: std::net::Ipv4Addr) -> Result<()> {
        let spec = &self.link().spec;
        let (ctl, sw) = names(&self.prefix);
        let (ctl, sw) = (Netns::named(ctl), Netns::named(sw));
        let (new, old, peer) = (
            new.to_string(),
            spec.sw_addr().to_string(),
            spec.ctl_addr().to_string(),
        );
        let (ctl_if, sw_if) = (spec.ctl_ifname(), spec.sw_ifname());
        ctl.ip(&["route", "add", &format!("{new}/32"), "dev", &ctl_if])?;
        sw.ip(&["addr", "add", &format!("{new}/32"), "dev", &sw_if])?;
        sw.ip(&["addr", "del", &format!("{old}/30"), "dev", &sw_if])?;
        sw.ip(&[
            "route",
            "add",
            &format!("{peer}/32"),
            "dev",
            &sw_if,
            "src",
            &new,
        ])?;
        Ok(())
    }

    /// Puts a NAT in front of the switch, or rebinds the one there, as a home
    /// or carrier NAT does when its mapping expires: from now on UDP and TCP
    /// from the switch leave from `port` of the switch's address (and up). The NAT is the
    /// control link's own ([`crate::emulator::nat`]), at the switch's end: the
    /// switch agent's socket does not change, only the far side sees a new
    /// source port. Like a real NAT, it drops what arrives from the controller
    /// side without a mapping, so the switch's next packet, not a late one from
    /// the far side, decides where the connection goes. Call again with another
    /// port to rebind again.
    pub fn nat_rebind_switch(&self, port: u16) -> Result<()> {
        self.link()
            .set_nat(Some(NatSettings {
                inside: Side::B,
                first_port: port,
            }))
            .map(drop)
    }

    /// Takes the switch's connection and completes the handshake. OVS may drop
    /// its first connection while it applies the rest of its controller settings
    /// and connect again, so a connection that closes during the handshake is
    /// replaced by the next one.
    pub fn accept_controller(&self, timeout: Duration) -> Result<Controller> {
        self.accept_controller_at(0, timeout)
    }

    /// [`Testbed::accept_controller`] for target `i`.
    pub fn accept_controller_at(&self, i: usize, timeout: Duration) -> Result<Controller> {
        let listener = self
            .listeners
            .get(i)
            .with_context(|| format!("the testbed does not listen for target {i}"))?;
        crate::wait::poll_until(
            "the switch to connect and complete the handshake",
            timeout,
            || match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false)?;
                    Ok(Controller::handshake(stream, timeout).ok())
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e.into()),
            },
        )
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for p in self.procs.iter().rev() {
            let _ = p.terminate(Duration::from_secs(5));
        }
        if let Some(l) = &self.link {
            let _ = l.destroy();
        }
        if let Some(o) = &self.ovs {
            let _ = o.stop();
        }
        remove(&self.prefix, self.hosts.len() as u32);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
