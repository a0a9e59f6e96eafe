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

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::agents::{
    AgentTls, lab_binary, openflow_socket, start_controller_agent, start_switch_agent,
};
use crate::control_link::{ControlLink, ControlLinkSpec, Impairment};
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

/// A built testbed.
pub struct Testbed {
    pub prefix: String,
    pub dir: PathBuf,
    ovs: Option<Ovs>,
    link: Option<ControlLink>,
    procs: Vec<ProcRecord>,
    listener: Option<TcpListener>,
    pub hosts: Vec<Netns>,
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
    pub fn up(spec: &TestbedSpec) -> Result<Testbed> {
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
            listener: None,
            hosts: Vec::new(),
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
        let listen = if spec.via == Via::Tcp {
            "0.0.0.0:6653"
        } else {
            "127.0.0.1:6653"
        };
        let listener = in_netns(&ctl_name, move || TcpListener::bind(listen))?
            .with_context(|| format!("listening on {listen} in {ctl_name}"))?;
        listener.set_nonblocking(true)?;
        bed.listener = Some(listener);
        let target = match &spec.via {
            Via::Tcp => format!("tcp:{ctl_ip}:6653"),
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
                bed.procs.push(start_controller_agent(
                    &ctl,
                    &format!("{ctl_ip}:6653"),
                    &tls("ctl")?,
                    &["openflow=tcp:127.0.0.1:6653".into()],
                    controller_args,
                    &dir.join("controller-agent.log"),
                )?);
                let socket = openflow_socket(&ovs.dir);
                bed.procs.push(start_switch_agent(
                    &sw,
                    &format!("{ctl_ip}:6653"),
                    "ctl",
                    &tls("sw1")?,
                    &[format!("openflow=punix:{}", socket.display())],
                    switch_args,
                    &dir.join("switch-agent.log"),
                )?);
                format!("unix:{}", socket.display())
            }
        };
        ovs.set_controller("br0", &[target])?;
        Ok(bed)
    }

    pub fn ovs(&self) -> &Ovs {
        self.ovs.as_ref().expect("set up")
    }

    pub fn link(&self) -> &ControlLink {
        self.link.as_ref().expect("set up")
    }

    /// Takes the switch's connection and completes the handshake. OVS may drop
    /// its first connection while it applies the rest of its controller settings
    /// and connect again, so a connection that closes during the handshake is
    /// replaced by the next one.
    pub fn accept_controller(&self, timeout: Duration) -> Result<Controller> {
        let listener = self.listener.as_ref().expect("set up");
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
