//! The lab's topology: `up`, `down`, `status`.
//!
//! For prefix `P` (default `qsdn`), `N` switches and `M` hosts per switch, [`up`] builds:
//!
//! * `P-ctl`: the controller namespace, running the controller (listening on
//!   `0.0.0.0:6653` there);
//! * `P-sw1` … `P-swN`: one namespace per switch, each with its own OVS
//!   instance (directory `RUN_DIR/P/swI`) and bridge `br0` (userspace
//!   datapath, OpenFlow 1.3, fail_mode secure, datapath id `I`);
//! * `P-hI-J`: hosts, `eth0` = `10.0.I.J/16`, MAC `02:51:00:00:II:JJ`, on
//!   port `hI-J` (OpenFlow port `J`) of switch `I`: one flat L2 segment;
//! * data links `swI` ↔ `swI+1` (a line, so no L2 loop): in switch `I` the
//!   port towards `I+1` is named `swI+1` with OpenFlow port 1002, the port
//!   towards `I-1` is `swI-1` with OpenFlow port 1001;
//! * one control link per switch to `P-ctl` (see [`crate::control_link`]),
//!   and the switch's controller target over it (see [`crate::transport`]).
//!
//! `up` records every step in the state file first (see [`crate::state`]),
//! and on failure removes what it built (unless `keep_on_error`). [`down`]
//! removes everything recorded, by name and PID, also after a crashed run, and
//! is idempotent. A repeated `up` with the same settings is a no-op when the
//! lab is healthy; a crashed or broken lab is replaced; a healthy lab with
//! different settings is an error (run `down` first).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;

use crate::agent_metrics::{
    ControllerAgentView, MetricsEndpoint, Scraped, SwitchAgentView, scrape_controller,
    scrape_switch,
};
use crate::agents::{
    AgentTls, QUIC_PORT, lab_binary, openflow_socket, start_controller_agent, start_switch_agent,
};
use crate::cmd::require_root;
use crate::control_link::{ControlLink, ControlLinkKind, ControlLinkSpec, Impairment};
use crate::controller::{
    ControllerKind, ControllerSpec, FaucetDp, TlsFiles, faucet_config, start_controller,
    start_controller_with,
};
use crate::emulator::{Accounting, LinkReport};
use crate::host::{HostSpec, attach_host};
use crate::netns::{Netns, VethEnd, create_veth};
use crate::ovs::{BridgeConfig, Ovs};
use crate::pki::Pki;
use crate::state::{
    DataLinkRecord, EngineRecord, HostRecord, LabSettings, LabState, NsRecord, STATE_VERSION,
    SdudpSettings, StateStore, SwitchRecord, Topology, check_prefix,
};
use crate::transport::Transport;

/// The default name prefix.
pub const DEFAULT_PREFIX: &str = "qsdn";
/// UDP port of the kcptun tunnel carrying OpenFlow (`kcptun` transport).
pub const KCP_OPENFLOW_PORT: u16 = 29900;
/// UDP port of the kcptun tunnels carrying OVSDB (`kcptun` transport, `ovsdb`).
pub const KCP_OVSDB_PORT: u16 = 29901;
/// OVSDB's port.
pub const OVSDB_PORT: u16 = 6640;

/// Where a program in the controller namespace reaches switch `i`'s OVSDB server
/// (labs brought up with `ovsdb`): over `tcp` and `tls` directly (OVS listens with
/// `ptcp:`/`pssl:` on its control-link address), over `quic` through the
/// controller agent's per-switch socket, over `kcptun` through a tunnel whose
/// client listens on the controller namespace's loopback, port 16640 + i.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvsdbAddress {
    Tcp(std::net::SocketAddr),
    /// The same, with TLS (mutual authentication with the lab's certificates).
    Tls(std::net::SocketAddr),
    Unix(PathBuf),
}

pub fn ovsdb_address(state: &LabState, i: u32) -> Result<OvsdbAddress> {
    if !state.settings.ovsdb {
        bail!("lab {} was brought up without --ovsdb", state.prefix);
    }
    let sw = Ipv4Addr::new(10, 254, i as u8, 2);
    Ok(match state.settings.transport {
        Transport::Tcp => OvsdbAddress::Tcp((sw, OVSDB_PORT).into()),
        Transport::Tls => OvsdbAddress::Tls((sw, OVSDB_PORT).into()),
        Transport::Quic | Transport::UdpSeed | Transport::UdpRobust => {
            OvsdbAddress::Unix(controller_ovsdb_socket(&state.dir, &format!("sw{i}")))
        }
        Transport::Kcptun => OvsdbAddress::Tcp((Ipv4Addr::LOCALHOST, 16640 + i as u16).into()),
    })
}

/// The controller agent's per-switch OVSDB socket (`quic` labs with `ovsdb`).
fn controller_ovsdb_socket(lab_dir: &Path, switch: &str) -> PathBuf {
    lab_dir.join("ctl").join(switch).join("ovsdb.sock")
}
/// The bridge in every switch.
pub const BRIDGE: &str = "br0";
/// OpenFlow port of the data link towards the previous switch.
pub const OFPORT_PREV: u16 = 1001;
/// OpenFlow port of the data link towards the next switch.
pub const OFPORT_NEXT: u16 = 1002;
/// Upper bound on switches and on hosts per switch (they become address octets).
pub const MAX_SWITCHES: u32 = 250;
pub const MAX_HOSTS_PER_SWITCH: u32 = 250;

/// `P-ctl`.
pub fn ctl_netns(prefix: &str) -> String {
    format!("{prefix}-ctl")
}
/// `P-swI`.
pub fn switch_netns(prefix: &str, i: u32) -> String {
    format!("{prefix}-sw{i}")
}
/// `P-hI-J`.
pub fn host_netns(prefix: &str, i: u32, j: u32) -> String {
    format!("{prefix}-h{i}-{j}")
}
/// `10.0.I.J`.
pub fn host_ip(i: u32, j: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, i as u8, j as u8)
}
/// `02:51:00:00:II:JJ` (locally administered, unicast).
pub fn host_mac(i: u32, j: u32) -> String {
    format!("02:51:00:00:{:02x}:{:02x}", i as u8, j as u8)
}

/// Everything `up` needs.
#[derive(Debug, Clone)]
pub struct LabConfig {
    pub prefix: String,
    /// State directory root (default `/run/quicsdn-lab`).
    pub run_dir: PathBuf,
    /// The quicsdn repository (controllers/ and scripts/).
    pub repo_dir: PathBuf,
    /// Controller venvs; `None` = `$QUICSDN_VENV_DIR` or `<repo>/.venv`.
    pub venv_dir: Option<PathBuf>,
    pub settings: LabSettings,
    /// Leave a failed `up`'s pieces in place for debugging (`down` removes them).
    pub keep_on_error: bool,
    /// How long the controller may take to listen.
    pub controller_timeout: Duration,
    /// How long the switches may take to report `is_connected`.
    pub connect_timeout: Duration,
}

/// The repository the lab's controllers and scripts come from:
/// `$QUICSDN_REPO_DIR`, else the source tree this binary was built from.
pub fn default_repo_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("QUICSDN_REPO_DIR") {
        return PathBuf::from(d);
    }
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    d.canonicalize().unwrap_or(d)
}

impl LabConfig {
    /// The defaults of `quicsdn-lab up`: 1 switch, 2 hosts, no impairment,
    /// `quic`, os-ken.
    pub fn new(prefix: &str) -> LabConfig {
        LabConfig {
            prefix: prefix.to_string(),
            run_dir: PathBuf::from(crate::state::DEFAULT_RUN_DIR),
            repo_dir: default_repo_dir(),
            venv_dir: None,
            settings: LabSettings {
                switches: 1,
                hosts_per_switch: 2,
                impairment: Impairment::default(),
                transport: Transport::Quic,
                controller: ControllerKind::Osken,
                openflow_port: 6653,
                streams: None,
                agent_args: Vec::new(),
                ovsdb: false,
                topology: Topology::Flat,
                link: Impairment::default(),
                sdudp: None,
            },
            keep_on_error: false,
            controller_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(30),
        }
    }

    /// Checks the settings without touching the system.
    pub fn validate(&self) -> Result<()> {
        check_prefix(&self.prefix)?;
        let s = &self.settings;
        if !(1..=MAX_SWITCHES).contains(&s.switches) {
            bail!("--switches must be 1..={MAX_SWITCHES}, not {}", s.switches);
        }
        if s.hosts_per_switch > MAX_HOSTS_PER_SWITCH {
            bail!(
                "--hosts-per-switch must be 0..={MAX_HOSTS_PER_SWITCH}, not {}",
                s.hosts_per_switch
            );
        }
        if s.topology == Topology::Line && s.switches < 2 {
            bail!("--topology line needs at least 2 switches (the paper uses 5 to 13)");
        }
        if s.topology != Topology::Line && !s.link.is_none() {
            bail!("--link-delay, --link-loss and --link-rate are settings of --topology line");
        }
        if let Some(sd) = &s.sdudp {
            if s.topology != Topology::Line {
                bail!("--sdudp needs --topology line");
            }
            if !matches!(s.controller, ControllerKind::Osken | ControllerKind::Ryu) {
                bail!(
                    "--sdudp installs its path with an os-ken/Ryu app: use --controller osken or ryu, not {}",
                    s.controller
                );
            }
            if s.hosts_per_switch == 0 {
                bail!("--sdudp needs a host on each edge (--hosts-per-switch ≥ 1)");
            }
            if sd.engines.first() != Some(&1) || sd.engines.last() != Some(&s.switches) {
                bail!(
                    "the SDUDP engines must include the edges 1 and {}",
                    s.switches
                );
            }
        }
        if s.openflow_port == 0 {
            bail!("the OpenFlow port must not be 0");
        }
        if !s.transport.uses_agents() && (s.streams.is_some() || !s.agent_args.is_empty()) {
            bail!("--streams and --agent-arg are settings of the quicsdn agents' transports");
        }
        if s.transport == Transport::Quic {
            crate::agent_metrics::metrics_option(&s.agent_args, 0).context("--agent-arg")?;
        }
        if s.transport == Transport::Kcptun && s.openflow_port == KCP_OPENFLOW_PORT {
            bail!("the OpenFlow port must not be kcptun's UDP port {KCP_OPENFLOW_PORT}");
        }
        s.transport.check_available()?;
        if s.transport == Transport::Tls && !s.controller.supports_tls() {
            bail!(
                "controller {} has no TLS listener: use --transport tcp",
                s.controller
            );
        }
        if s.controller != ControllerKind::None {
            let script = self.repo_dir.join("scripts/controllers-venv");
            if !script.exists() {
                bail!(
                    "{} not found: point QUICSDN_REPO_DIR at the quicsdn repository",
                    script.display()
                );
            }
        }
        Ok(())
    }
}

/// What `up` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum UpAction {
    /// Built a new lab.
    Created,
    /// The same lab was already up and healthy: nothing changed.
    AlreadyUp,
    /// A crashed or broken lab with this prefix was removed and rebuilt.
    Replaced { reason: String },
}

#[derive(Debug, Clone)]
pub struct UpOutcome {
    pub action: UpAction,
    pub state: LabState,
}

/// Brings a lab up (see the module docs). Needs root.
pub fn up(cfg: &LabConfig) -> Result<UpOutcome> {
    cfg.validate()?;
    require_root()?;
    let store = StateStore::lock(&cfg.run_dir, &cfg.prefix)?;
    let mut action = UpAction::Created;
    if let Some(old) = store.load()? {
        let health = check_health(&old);
        match (old.complete, &health) {
            (true, Ok(())) if old.settings == cfg.settings => {
                return Ok(UpOutcome {
                    action: UpAction::AlreadyUp,
                    state: old,
                });
            }
            (true, Ok(())) => bail!(
                "lab {p} is already up with other settings; run `quicsdn-lab down --prefix {p}` first",
                p = cfg.prefix
            ),
            _ => {
                let reason = match health {
                    Err(e) if old.complete => format!("the lab was broken ({e:#})"),
                    _ => "a previous `up` did not finish".to_string(),
                };
                teardown(&old).with_context(|| {
                    format!("removing the previous lab {} ({reason})", cfg.prefix)
                })?;
                store.remove_dir()?;
                action = UpAction::Replaced { reason };
            }
        }
    }

    let s = &cfg.settings;
    let p = &cfg.prefix;
    // Never adopt or delete a namespace this lab did not record.
    let mut names = vec![ctl_netns(p)];
    for i in 1..=s.switches {
        names.push(switch_netns(p, i));
        if has_hosts(s, i) {
            for j in 1..=s.hosts_per_switch {
                names.push(host_netns(p, i, j));
            }
        }
        if has_engine(s, i) {
            names.push(engine_netns(p, i));
        }
    }
    if let Some(n) = names.iter().find(|n| Netns::exists(n)) {
        bail!(
            "network namespace {n} exists but is not part of a recorded lab {p}; \
             if it is a leftover, delete it yourself (`ip netns del {n}`)"
        );
    }

    let mut state = LabState {
        version: STATE_VERSION,
        prefix: p.clone(),
        settings: s.clone(),
        dir: store.lab_dir(),
        complete: false,
        ctl_netns: ctl_netns(p),
        namespaces: Vec::new(),
        switches: Vec::new(),
        hosts: Vec::new(),
        data_links: Vec::new(),
        control_links: Vec::new(),
        controller: None,
        agents: Vec::new(),
        metrics: Vec::new(),
        pki_dir: None,
        engines: Vec::new(),
    };
    store.save(&state)?;
    match build(cfg, &store, &mut state) {
        Ok(()) => {
            state.complete = true;
            store.save(&state)?;
            Ok(UpOutcome { action, state })
        }
        Err(e) if cfg.keep_on_error => Err(e.context(format!(
            "lab {p} failed to come up; its pieces are left in place (remove them with `quicsdn-lab down --prefix {p}`)"
        ))),
        Err(e) => {
            let cleanup = teardown(&state).and_then(|()| store.remove_all());
            match cleanup {
                Ok(()) => Err(e.context(format!("lab {p} failed to come up (removed what was built)"))),
                Err(c) => Err(e.context(format!(
                    "lab {p} failed to come up, and removing it failed too ({c:#}); run `quicsdn-lab down --prefix {p}`"
                ))),
            }
        }
    }
}

/// Records, then creates, a namespace.
fn create_ns(store: &StateStore, state: &mut LabState, name: &str) -> Result<Netns> {
    state.namespaces.push(NsRecord {
        name: name.to_string(),
        inode: None,
    });
    store.save(state)?;
    let ns = Netns::create(name)?;
    state.namespaces.last_mut().expect("just pushed").inode = Netns::inode(name);
    store.save(state)?;
    Ok(ns)
}

fn build(cfg: &LabConfig, store: &StateStore, state: &mut LabState) -> Result<()> {
    let s = cfg.settings.clone();
    let p = cfg.prefix.as_str();
    let dir = store.lab_dir();
    std::fs::create_dir_all(dir.join("ctl"))?;

    let ctl = create_ns(store, state, &ctl_netns(p))?;

    let pki = if s.transport.needs_pki() {
        let pki = Pki::create(&dir.join("pki"))?;
        state.pki_dir = Some(pki.dir.clone());
        store.save(state)?;
        Some(pki)
    } else {
        None
    };

    // Switches: namespace, OVS, bridge.
    for i in 1..=s.switches {
        let name = format!("sw{i}");
        let ns = create_ns(store, state, &switch_netns(p, i))?;
        state.switches.push(SwitchRecord {
            name: name.clone(),
            netns: ns.name.clone(),
            bridge: BRIDGE.into(),
            datapath_id: u64::from(i),
            ovs: None,
            target: None,
        });
        store.save(state)?;
        let ovs = Ovs::start(&ns, &dir.join(&name))
            .with_context(|| format!("starting OVS for {name}"))?;
        state.switches.last_mut().expect("just pushed").ovs = Some(ovs.clone());
        store.save(state)?;
        let mut br = BridgeConfig::new(BRIDGE);
        br.datapath_id = Some(u64::from(i));
        ovs.add_bridge(&br)
            .with_context(|| format!("adding {BRIDGE} to {name}"))?;
    }

    // Control links.
    for i in 1..=s.switches {
        let spec = ControlLinkSpec::new(i, p, &ctl.name, &switch_netns(p, i), s.impairment);
        state.control_links.push(ControlLink::planned(spec.clone()));
        store.save(state)?;
        let link = ControlLink::create(spec, &lab_binary()?)
            .with_context(|| format!("creating the control link of sw{i}"))?;
        *state.control_links.last_mut().expect("just pushed") = link;
        store.save(state)?;
    }

    // Hosts.
    for i in (1..=s.switches).filter(|&i| has_hosts(&s, i)) {
        let ovs = switch_ovs(state, i)?;
        for j in 1..=s.hosts_per_switch {
            let ns = create_ns(store, state, &host_netns(p, i, j))?;
            let spec = HostSpec {
                netns: ns.name.clone(),
                ifname: "eth0".into(),
                mac: host_mac(i, j),
                cidr: format!("{}/16", host_ip(i, j)),
                port: format!("h{i}-{j}"),
                ofport: Some(j as u16),
            };
            attach_host(&spec, &ovs, BRIDGE)?;
            state.hosts.push(HostRecord {
                name: format!("h{i}-{j}"),
                netns: ns.name.clone(),
                switch: format!("sw{i}"),
                ip: spec.ip().to_string(),
                cidr: spec.cidr.clone(),
                mac: spec.mac.clone(),
                port: spec.port.clone(),
                ofport: j as u16,
            });
            store.save(state)?;
        }
    }

    // Data links: a line sw1 - sw2 - … - swN.
    for i in 1..s.switches {
        let (a, b) = (switch_ovs(state, i)?, switch_ovs(state, i + 1)?);
        let (a_ns, b_ns) = (Netns::named(&a.netns), Netns::named(&b.netns));
        let (a_port, b_port) = (format!("sw{}", i + 1), format!("sw{i}"));
        state.data_links.push(DataLinkRecord {
            a_switch: format!("sw{i}"),
            a_port: a_port.clone(),
            a_ofport: OFPORT_NEXT,
            b_switch: format!("sw{}", i + 1),
            b_port: b_port.clone(),
            b_ofport: OFPORT_PREV,
            emulated: None,
        });
        store.save(state)?;
        if s.topology == Topology::Line {
            // An emulated link, so that loss, delay and rate apply and the
            // frames and bytes on it are counted (the SDUDP paper's per-switch
            // load). Its TAPs are the switches' ports.
            let spec = data_link_spec(&cfg.prefix, &dir, i, &a_ns.name, &b_ns.name, &s.link);
            let rec = crate::emulator::link::create_link(&spec, &lab_binary()?)
                .with_context(|| format!("creating data link sw{i}-sw{}", i + 1))?;
            state.data_links.last_mut().expect("just pushed").emulated = Some(rec);
            store.save(state)?;
        } else {
            create_veth(&VethEnd::new(&a_ns, &a_port), &VethEnd::new(&b_ns, &b_port))?;
            a_ns.link_up(&a_port)?;
            b_ns.link_up(&b_port)?;
        }
        a.add_port(BRIDGE, &a_port, Some(OFPORT_NEXT))?;
        b.add_port(BRIDGE, &b_port, Some(OFPORT_PREV))?;
    }

    // SDUDP engines' namespaces and ports (the processes start once the path is installed).
    if let Some(sd) = &s.sdudp {
        std::fs::create_dir_all(dir.join("engines"))?;
        for &i in &sd.engines {
            create_engine_port(store, state, &s, i)?;
        }
    }

    // Controller. With `quic` it listens on its namespace's loopback only, so
    // the switches can reach it through the controller agent and nothing else.
    // The agents (quic, udp-*) use the lab's certificates themselves.
    let quic = s.transport.uses_agents();
    // Tunnels (the agents, kcptun) reach the controller on its namespace's loopback only.
    let tunnelled = quic || s.transport == Transport::Kcptun;
    if s.controller != ControllerKind::None {
        let tls = match pki.as_ref().filter(|_| !quic) {
            Some(pki) => {
                let pair = pki.issue("controller")?;
                Some(TlsFiles {
                    key: pair.key,
                    cert: pair.cert,
                    ca: pki.ca_cert(),
                })
            }
            None => None,
        };
        let spec = ControllerSpec {
            kind: s.controller,
            listen_host: if tunnelled { "127.0.0.1" } else { "0.0.0.0" }.into(),
            port: s.openflow_port,
            tls,
            work_dir: dir.join("ctl"),
            repo_dir: cfg.repo_dir.clone(),
            venv_dir: cfg.venv_dir.clone(),
            faucet_yaml: (s.controller == ControllerKind::Faucet)
                .then(|| faucet_config(&faucet_dps(state))),
            ready_timeout: cfg.controller_timeout,
        };
        let running = match &s.sdudp {
            Some(sd) => {
                let path = dir.join("ctl").join("sdudp-path.json");
                std::fs::write(&path, sdudp_path_json(state, sd).to_string())?;
                let app = cfg.repo_dir.join("controllers").join("sdudp_path.py");
                start_controller_with(
                    &ctl,
                    &spec,
                    &[
                        app.display().to_string(),
                        format!("--sdudp-path={}", path.display()),
                        format!("--sdudp-events={}", sdudp_events(&dir).display()),
                    ],
                )?
            }
            None => start_controller(&ctl, &spec)?,
        };
        state.controller = Some(running);
        store.save(state)?;
    } else if let Some(pki) = pki.as_ref().filter(|_| !quic) {
        // For a program the user attaches: the lab's CA issues its certificate too.
        pki.issue("controller")?;
    }

    if let Some(pki) = pki.as_ref().filter(|_| quic) {
        let pair = pki.issue("controller-agent")?;
        let tls = AgentTls {
            ca: pki.ca_cert(),
            cert: pair.cert,
            key: pair.key,
        };
        let mut services = vec![format!("openflow=tcp:127.0.0.1:{}", s.openflow_port)];
        if s.ovsdb {
            services.push(format!(
                "ovsdb=punix:{}",
                controller_ovsdb_socket(&dir, "{switch}").display()
            ));
        }
        let args = with_metrics(store, state, &s, false, "controller agent", &ctl.name)?;
        let proc = start_controller_agent(
            &ctl,
            &format!("0.0.0.0:{QUIC_PORT}"),
            &tls,
            &services,
            &args,
            &dir.join("ctl").join("quicsdn-controller.log"),
        )?;
        state.agents.push(proc);
        store.save(state)?;
    }

    if s.transport == Transport::Kcptun {
        let (_, server) = crate::bench::pair::kcptun_binaries()?;
        let mut c = ctl.command(&server);
        c.args(kcptun_args(&[
            format!("--listen=:{KCP_OPENFLOW_PORT}"),
            format!("--target=127.0.0.1:{}", s.openflow_port),
        ]));
        let proc = crate::process::spawn_service(
            "kcptun-server (openflow)",
            &mut c,
            &dir.join("ctl").join("kcptun-server-openflow.log"),
        )?;
        state.agents.push(proc);
        store.save(state)?;
    }

    // Point every switch at the controller (with `quic`: at its switch agent).
    for i in 1..=s.switches {
        let ovs = switch_ovs(state, i)?;
        let ctl_addr = state.control_links[(i - 1) as usize].spec.ctl_addr();
        match &pki {
            Some(pki) if quic => {
                let pair = pki.issue(&format!("sw{i}"))?;
                let tls = AgentTls {
                    ca: pki.ca_cert(),
                    cert: pair.cert,
                    key: pair.key,
                };
                let socket = openflow_socket(&ovs.dir);
                let mut services = vec![format!("openflow=punix:{}", socket.display())];
                if s.ovsdb {
                    services.push(format!("ovsdb=tcp:127.0.0.1:{OVSDB_PORT}"));
                }
                let args = with_metrics(store, state, &s, true, &format!("sw{i}"), &ovs.netns)?;
                let proc = start_switch_agent(
                    &Netns::named(&ovs.netns),
                    &format!("{ctl_addr}:{QUIC_PORT}"),
                    "controller-agent",
                    &tls,
                    &services,
                    &args,
                    &ovs.dir.join("quicsdn-switch.log"),
                )?;
                state.agents.push(proc);
                store.save(state)?;
            }
            Some(pki) => {
                let pair = pki.issue(&format!("sw{i}"))?;
                ovs.set_ssl(&pair.key, &pair.cert, &pki.ca_cert())?;
            }
            None => {}
        }
        if s.transport == Transport::Kcptun {
            start_kcptun_switch(store, state, &ovs, i, ctl_addr, s.ovsdb)?;
        }
        if s.ovsdb {
            let manager = match s.transport {
                Transport::Tcp => {
                    format!("ptcp:{OVSDB_PORT}:{}", Ipv4Addr::new(10, 254, i as u8, 2))
                }
                Transport::Tls => {
                    format!("pssl:{OVSDB_PORT}:{}", Ipv4Addr::new(10, 254, i as u8, 2))
                }
                Transport::Quic | Transport::Kcptun | Transport::UdpSeed | Transport::UdpRobust => {
                    format!("ptcp:{OVSDB_PORT}:127.0.0.1")
                }
            };
            ovs.vsctl(&["set-manager", &manager])?;
        }
        let target = s.transport.ovs_target(ctl_addr, s.openflow_port, &ovs.dir);
        ovs.set_controller(BRIDGE, std::slice::from_ref(&target))?;
        state.switches[(i - 1) as usize].target = Some(target);
        store.save(state)?;
    }

    // Ready when every switch is connected (with `none`, nothing listens yet).
    if s.controller != ControllerKind::None {
        for i in 1..=s.switches {
            let ovs = switch_ovs(state, i)?;
            ovs.wait_connected(BRIDGE, cfg.connect_timeout)
                .map_err(|e| {
                    let log = state.controller.as_ref().map(|c| c.log.clone());
                    anyhow!(
                        "{e}; see {} and {}",
                        ovs.dir.join("ovs-vswitchd.log").display(),
                        log.map(|l| l.display().to_string()).unwrap_or_default()
                    )
                })?;
        }
    }
    if let Some(sd) = &s.sdudp {
        wait_path_installed(&dir, s.switches, cfg.connect_timeout)?;
        for &i in &sd.engines {
            start_engine(store, state, &s, sd, i)?;
        }
        let engines = state.engines.clone();
        crate::wait::poll_until(
            "the SDUDP engines to start",
            Duration::from_secs(20),
            || {
                for e in &engines {
                    let p = e.proc.as_ref().expect("started");
                    if !p.is_alive() {
                        bail!(
                            "SDUDP engine of {} exited; last lines of its log:\n{}",
                            e.switch,
                            crate::process::log_tail(&e.stats.with_extension("log"), 15)
                        );
                    }
                }
                Ok(engines.iter().all(|e| e.stats.exists()).then_some(()))
            },
        )?;
    }
    Ok(())
}

/// `line` labs have hosts on the two edges only.
fn has_hosts(s: &LabSettings, i: u32) -> bool {
    s.topology == Topology::Flat || i == 1 || i == s.switches
}

fn has_engine(s: &LabSettings, i: u32) -> bool {
    s.sdudp.as_ref().is_some_and(|sd| sd.engines.contains(&i))
}

/// `P-eI`: the SDUDP engine beside switch I.
pub fn engine_netns(prefix: &str, i: u32) -> String {
    format!("{prefix}-e{i}")
}
/// `10.0.I.254`, on the hosts' /16.
pub fn engine_ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, i as u8, 254)
}
/// `02:51:00:00:II:fe`.
pub fn engine_mac(i: u32) -> String {
    format!("02:51:00:00:{:02x}:fe", i as u8)
}
/// OpenFlow port of the engine on its switch.
pub const OFPORT_ENGINE: u16 = 100;

/// The emulated data link between switches `i` and `i+1` (`P-dI`).
fn data_link_spec(
    prefix: &str,
    dir: &Path,
    i: u32,
    a_ns: &str,
    b_ns: &str,
    imp: &Impairment,
) -> crate::emulator::link::LinkSpec {
    let mut spec = crate::emulator::link::LinkSpec::new(
        &format!("{prefix}-d{i}"),
        a_ns,
        b_ns,
        Ipv4Addr::new(10, 253, i as u8, 1),
        Ipv4Addr::new(10, 253, i as u8, 2),
    );
    spec.tap_a = format!("sw{}", i + 1);
    spec.tap_b = format!("sw{i}");
    spec.run_dir = dir.join("links");
    spec.seed = None;
    let d = ControlLinkSpec::new(i, prefix, a_ns, b_ns, *imp).dir_settings();
    spec.with_settings(d)
}

fn sdudp_events(dir: &Path) -> PathBuf {
    dir.join("ctl").join("sdudp-events.jsonl")
}

/// The path `controllers/sdudp_path.py` installs.
fn sdudp_path_json(state: &LabState, sd: &SdudpSettings) -> serde_json::Value {
    let n = state.settings.switches;
    let mut hosts = serde_json::Map::new();
    for i in [1, n] {
        let v: Vec<serde_json::Value> = state
            .hosts
            .iter()
            .filter(|h| h.switch == format!("sw{i}"))
            .map(|h| serde_json::json!([h.ofport, h.mac]))
            .collect();
        hosts.insert(i.to_string(), v.into());
    }
    let macs: serde_json::Map<String, serde_json::Value> = sd
        .engines
        .iter()
        .map(|&i| (i.to_string(), engine_mac(i).into()))
        .collect();
    serde_json::json!({
        "switches": n,
        "engines": sd.engines,
        "engine_port": OFPORT_ENGINE,
        "prev_port": OFPORT_PREV,
        "next_port": OFPORT_NEXT,
        "engine_macs": macs,
        "hosts": hosts,
    })
}

/// Waits until the controller app has had every switch confirm its path rules (a barrier).
fn wait_path_installed(dir: &Path, n: u32, timeout: Duration) -> Result<()> {
    let events = sdudp_events(dir);
    crate::wait::poll_until("the SDUDP path rules on every switch", timeout, || {
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        let done: std::collections::BTreeSet<u64> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "path_installed")
            .filter_map(|e| e["dpid"].as_u64())
            .collect();
        Ok((1..=u64::from(n)).all(|i| done.contains(&i)).then_some(()))
    })
}

/// The engine's namespace, its veth to the switch (OpenFlow port 100), its address.
fn create_engine_port(
    store: &StateStore,
    state: &mut LabState,
    s: &LabSettings,
    i: u32,
) -> Result<()> {
    let p = state.prefix.clone();
    let ns = create_ns(store, state, &engine_netns(&p, i))?;
    let sw = Netns::named(switch_netns(&p, i));
    create_veth(
        &VethEnd::new(&ns, "sw").with_mac(&engine_mac(i)),
        &VethEnd::new(&sw, "eng"),
    )?;
    ns.add_addr("sw", &format!("{}/16", engine_ip(i)))?;
    ns.link_up("sw")?;
    ns.link_up("lo")?;
    sw.link_up("eng")?;
    switch_ovs(state, i)?.add_port(BRIDGE, "eng", Some(OFPORT_ENGINE))?;
    // An edge engine's kernel answers its hosts' TCP: it knows their MACs.
    if i == 1 || i == s.switches {
        for h in state.hosts.iter().filter(|h| h.switch == format!("sw{i}")) {
            ns.ip(&[
                "neigh",
                "replace",
                &h.ip,
                "lladdr",
                &h.mac,
                "dev",
                "sw",
                "nud",
                "permanent",
            ])?;
        }
    }
    state.engines.push(EngineRecord {
        switch: format!("sw{i}"),
        netns: ns.name.clone(),
        role: if i == 1 || i == s.switches {
            "edge"
        } else {
            "relay"
        }
        .into(),
        ip: engine_ip(i).to_string(),
        mac: engine_mac(i),
        stats: state.dir.join("engines").join(format!("e{i}.json")),
        proc: None,
    });
    store.save(state)
}

/// Starts switch `i`'s engine: an edge (TCP engine) on 1 and N, a relay between.
fn start_engine(
    store: &StateStore,
    state: &mut LabState,
    s: &LabSettings,
    sd: &SdudpSettings,
    i: u32,
) -> Result<()> {
    let n = s.switches;
    let k = sd.engines.iter().position(|&e| e == i).expect("an engine");
    let nb = |j: u32| format!("{},{}", engine_ip(j), engine_mac(j));
    let idx = state
        .engines
        .iter()
        .position(|e| e.switch == format!("sw{i}"))
        .context("engine not recorded")?;
    let stats = state.engines[idx].stats.clone();
    let ns = Netns::named(&state.engines[idx].netns);
    let mut c = ns.command(crate::agents::sdudp_binary()?);
    let me = [
        "--ip".to_string(),
        engine_ip(i).to_string(),
        "--mac".into(),
        engine_mac(i),
    ];
    if i == 1 || i == n {
        let (next, far) = if i == 1 {
            (sd.engines[1], n)
        } else {
            (sd.engines[k - 1], 1)
        };
        c.args(["edge", "--interface", "sw"]).args(&me);
        c.arg(format!("--neighbour={}", nb(next)));
        c.arg(format!("--far-edge=10.0.{far}.0/24={}", engine_ip(far)));
        if !sd.accumulate {
            c.arg("--no-accumulate");
        }
    } else {
        c.args(["relay", "--interface", "sw"]).args(&me);
        c.arg(format!("--left={}", nb(sd.engines[k - 1])));
        c.arg(format!("--right={}", nb(sd.engines[k + 1])));
    }
    c.arg("--stats")
        .arg(&stats)
        .args(["--stats-interval", "100ms"]);
    let proc = crate::process::spawn_service(
        &format!("SDUDP engine sw{i}"),
        &mut c,
        &stats.with_extension("log"),
    )?;
    state.engines[idx].proc = Some(proc);
    store.save(state)
}

/// The agents' extra options: `--streams`, then the lab's agent arguments
/// (`--zero-length-cid[=BOOL]` only for switch agents).
fn agent_args(s: &LabSettings, switch: bool) -> Vec<String> {
    let mut v = s.transport.agent_transport_args();
    v.extend(s.streams.iter().map(|m| format!("--streams={m}")));
    v.extend(
        s.agent_args
            .iter()
            .filter(|a| switch || !crate::agents::is_switch_only(a))
            .cloned(),
    );
    v
}

/// [`agent_args`] plus `--metrics` for the QUIC agents (the `udp` ones have
/// no metrics), whose endpoint is recorded for `status`.
fn with_metrics(
    store: &StateStore,
    state: &mut LabState,
    s: &LabSettings,
    switch: bool,
    agent: &str,
    netns: &str,
) -> Result<Vec<String>> {
    let mut args = agent_args(s, switch);
    if s.transport == Transport::Quic {
        let port = if switch {
            crate::agent_metrics::SWITCH_METRICS_PORT
        } else {
            crate::agent_metrics::CONTROLLER_METRICS_PORT
        };
        let (option, addr) = crate::agent_metrics::metrics_option(&args, port)?;
        args.extend(option);
        state.metrics.push(MetricsEndpoint {
            agent: agent.to_string(),
            netns: netns.to_string(),
            addr,
        });
        store.save(state)?;
    }
    Ok(args)
}

/// kcptun's options: the lab's fixed key, no compression, quiet; its other defaults.
fn kcptun_args(extra: &[String]) -> Vec<String> {
    let mut v = vec![
        "--key=quicsdn-lab".to_string(),
        "--nocomp".into(),
        "--quiet".into(),
    ];
    v.extend_from_slice(extra);
    v
}

/// Starts switch `i`'s kcptun processes: the OpenFlow tunnel's client in the
/// switch namespace (where OVS connects, `127.0.0.1:PORT`) and, with `ovsdb`, an
/// OVSDB tunnel (server in the switch namespace, client on the controller
/// namespace's loopback, port 16640 + i). Waits until they listen.
fn start_kcptun_switch(
    store: &StateStore,
    state: &mut LabState,
    ovs: &Ovs,
    i: u32,
    ctl_addr: Ipv4Addr,
    ovsdb: bool,
) -> Result<()> {
    let (client, server) = crate::bench::pair::kcptun_binaries()?;
    let sw = Netns::named(&ovs.netns);
    let ctl = Netns::named(&state.ctl_netns);
    let port = state.settings.openflow_port;
    let mut c = sw.command(&client);
    c.args(kcptun_args(&[
        format!("--localaddr=127.0.0.1:{port}"),
        format!("--remoteaddr={ctl_addr}:{KCP_OPENFLOW_PORT}"),
    ]));
    let p = crate::process::spawn_service(
        &format!("kcptun-client (openflow) in {}", sw.name),
        &mut c,
        &ovs.dir.join("kcptun-client-openflow.log"),
    )?;
    state.agents.push(p);
    store.save(state)?;
    if ovsdb {
        let mut c = sw.command(&server);
        c.args(kcptun_args(&[
            format!("--listen=:{KCP_OVSDB_PORT}"),
            format!("--target=127.0.0.1:{OVSDB_PORT}"),
        ]));
        let p = crate::process::spawn_service(
            &format!("kcptun-server (ovsdb) in {}", sw.name),
            &mut c,
            &ovs.dir.join("kcptun-server-ovsdb.log"),
        )?;
        state.agents.push(p);
        store.save(state)?;
        let mut c = ctl.command(&client);
        c.args(kcptun_args(&[
            format!("--localaddr=127.0.0.1:{}", 16640 + i),
            format!(
                "--remoteaddr={}:{KCP_OVSDB_PORT}",
                Ipv4Addr::new(10, 254, i as u8, 2)
            ),
        ]));
        let p = crate::process::spawn_service(
            &format!("kcptun-client (ovsdb) for sw{i}"),
            &mut c,
            &state
                .dir
                .join("ctl")
                .join(format!("kcptun-client-ovsdb-sw{i}.log")),
        )?;
        state.agents.push(p);
        store.save(state)?;
    }
    crate::wait::poll_until(
        &format!("kcptun of sw{i} to listen"),
        Duration::from_secs(10),
        || {
            if let Some(a) = state.agents.iter().find(|a| !a.is_alive()) {
                bail!("{} exited", a.name);
            }
            let of = sw.tcp_listening(port)?;
            let db = !ovsdb || ctl.tcp_listening(16640 + i as u16)?;
            Ok((of && db).then_some(()))
        },
    )
}

fn switch_ovs(state: &LabState, i: u32) -> Result<Ovs> {
    state
        .switches
        .get((i - 1) as usize)
        .and_then(|s| s.ovs.clone())
        .ok_or_else(|| anyhow!("switch sw{i} has no OVS"))
}

fn faucet_dps(state: &LabState) -> Vec<FaucetDp> {
    state
        .switches
        .iter()
        .map(|sw| {
            let mut ports: Vec<(u16, String)> = state
                .hosts
                .iter()
                .filter(|h| h.switch == sw.name)
                .map(|h| (h.ofport, h.port.clone()))
                .collect();
            for l in &state.data_links {
                if l.a_switch == sw.name {
                    ports.push((l.a_ofport, l.a_port.clone()));
                }
                if l.b_switch == sw.name {
                    ports.push((l.b_ofport, l.b_port.clone()));
                }
            }
            FaucetDp {
                name: sw.name.clone(),
                dp_id: sw.datapath_id,
                ports,
            }
        })
        .collect()
}

/// Ok when every recorded piece of a lab is there and running.
pub fn check_health(state: &LabState) -> Result<()> {
    for ns in &state.namespaces {
        if ns.inode.is_none() || Netns::inode(&ns.name) != ns.inode {
            bail!("namespace {} is missing", ns.name);
        }
    }
    for sw in &state.switches {
        match &sw.ovs {
            Some(ovs) if ovs.is_alive() => {}
            _ => bail!("OVS of {} is not running", sw.name),
        }
    }
    if let Some(c) = state.controller.as_ref().filter(|c| !c.is_alive()) {
        bail!("controller {} (pid {}) is not running", c.kind, c.proc.pid);
    }
    if let Some(a) = state.agents.iter().find(|a| !a.is_alive()) {
        bail!("{} (pid {}) is not running", a.name, a.pid);
    }
    if let Some(a) = state
        .engines
        .iter()
        .filter_map(|e| e.proc.as_ref())
        .find(|a| !a.is_alive())
    {
        bail!("{} (pid {}) is not running", a.name, a.pid);
    }
    for l in &state.control_links {
        if let Some(p) = l.procs.iter().find(|p| !p.is_alive()) {
            bail!("{} (pid {}) is not running", p.name, p.pid);
        }
    }
    Ok(())
}

/// Removes everything `state` records: processes by PID, then namespaces
/// (with any process left inside them, and all their interfaces). A namespace
/// whose identity differs from the recorded one is left alone. Tries every
/// step and reports all failures.
pub fn teardown(state: &LabState) -> Result<()> {
    let grace = Duration::from_secs(5);
    let mut errors: Vec<String> = Vec::new();
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            errors.push(format!("{e:#}"));
        }
    };
    for a in state.engines.iter().filter_map(|e| e.proc.as_ref()) {
        note(a.terminate(grace));
    }
    for a in state.agents.iter().rev() {
        note(a.terminate(grace));
    }
    if let Some(c) = &state.controller {
        note(c.stop());
    }
    for l in &state.control_links {
        note(l.destroy());
    }
    for l in state.data_links.iter().filter_map(|l| l.emulated.as_ref()) {
        note(crate::emulator::link::destroy_link(l));
    }
    for sw in &state.switches {
        if let Some(ovs) = &sw.ovs {
            note(ovs.stop());
        }
    }
    for ns in state.namespaces.iter().rev() {
        let current = Netns::inode(&ns.name);
        if current.is_none() {
            continue;
        }
        // inode None: recorded just before creation, and the run stopped there.
        if ns.inode.is_some() && current != ns.inode {
            note(Err(anyhow!(
                "namespace {} is not the one this lab created (replaced since?); left alone",
                ns.name
            )));
            continue;
        }
        let n = Netns::named(&ns.name);
        note(n.kill_all(grace));
        note(n.delete());
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(anyhow!("{}", errors.join("; ")))
    }
}

/// What `down` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum DownOutcome {
    Removed,
    /// No lab with this prefix was recorded.
    NothingToDo,
}

/// Removes the lab recorded under `run_dir`/`prefix`. Idempotent. On failure
/// the state is kept so that `down` can be retried.
pub fn down(run_dir: &Path, prefix: &str) -> Result<DownOutcome> {
    check_prefix(prefix)?;
    require_root()?;
    let store = StateStore::lock(run_dir, prefix)?;
    match store.load()? {
        None => {
            store.remove_all()?;
            Ok(DownOutcome::NothingToDo)
        }
        Some(state) => {
            teardown(&state).with_context(|| format!("removing lab {prefix}"))?;
            store.remove_all()?;
            Ok(DownOutcome::Removed)
        }
    }
}

/// The recorded state of a lab, if any (no lock taken: the file is replaced atomically).
pub fn load(run_dir: &Path, prefix: &str) -> Result<Option<LabState>> {
    check_prefix(prefix)?;
    let path = run_dir.join(prefix).join("state.json");
    match std::fs::read_to_string(&path) {
        Ok(t) => {
            Ok(Some(serde_json::from_str(&t).with_context(|| {
                format!("cannot parse {}", path.display())
            })?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// A live view of one switch.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchStatus {
    pub name: String,
    pub netns: String,
    pub ovs_running: bool,
    pub target: Option<String>,
    pub connected: Option<bool>,
    pub flows: Option<usize>,
    /// `quic`: its switch agent's metrics (or why they could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<Scraped<SwitchAgentView>>,
}

/// A live view of one control link.
#[derive(Debug, Clone, Serialize)]
pub struct ControlLinkStatus {
    pub switch: String,
    /// The emulated link's name, for `quicsdn-lab link set|show`.
    pub link: String,
    pub kind: ControlLinkKind,
    pub ctl_addr: Ipv4Addr,
    pub sw_addr: Ipv4Addr,
    pub impairment: Impairment,
    /// The emulator's settings and counters per direction and protocol class
    /// (`a` is the controller side), with the default wire convention.
    pub report: Option<LinkReport>,
}

/// A host, for tools that run their own traffic (`status --json`).
#[derive(Debug, Clone, Serialize)]
pub struct HostStatus {
    pub name: String,
    pub netns: String,
    pub ipv4: String,
    pub switch: String,
}

/// An SDUDP engine, live.
#[derive(Debug, Clone, Serialize)]
pub struct EngineStatus {
    pub switch: String,
    pub netns: String,
    pub role: String,
    pub ipv4: String,
    pub running: bool,
    /// Its last counters (what `quicsdn-sdudp --stats` writes).
    pub stats: Option<serde_json::Value>,
}

/// An emulated data link (`line` labs), live.
#[derive(Debug, Clone, Serialize)]
pub struct DataLinkStatus {
    pub a_switch: String,
    pub b_switch: String,
    /// For `quicsdn-lab link set|show`.
    pub link: String,
    pub report: Option<LinkReport>,
}

/// What `status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct LabStatus {
    pub prefix: String,
    pub complete: bool,
    pub health: Result<(), String>,
    pub settings: LabSettings,
    pub dir: PathBuf,
    pub controller_running: Option<bool>,
    pub controller_listening: Option<bool>,
    /// `quic`: the controller agent's metrics (or why they could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_agent: Option<Scraped<ControllerAgentView>>,
    pub switches: Vec<SwitchStatus>,
    pub control_links: Vec<ControlLinkStatus>,
    /// Every host's namespace and IPv4 address.
    pub hosts: Vec<HostStatus>,
    pub engines: Vec<EngineStatus>,
    pub data_links: Vec<DataLinkStatus>,
    pub state: LabState,
}

/// The live status of a lab, or `None` if none is recorded.
pub fn status(run_dir: &Path, prefix: &str) -> Result<Option<LabStatus>> {
    let Some(state) = load(run_dir, prefix)? else {
        return Ok(None);
    };
    let ctl = Netns::named(&state.ctl_netns);
    let controller_running = state.controller.as_ref().map(|c| c.is_alive());
    let controller_listening = state
        .controller
        .as_ref()
        .map(|c| Netns::exists(&ctl.name) && ctl.tcp_listening(c.port).unwrap_or(false));
    // Every agent's scrape at once: each is a short thread of its own.
    let endpoint = |agent: &str| state.metrics.iter().find(|m| m.agent == agent);
    let (controller_agent, mut agents) = std::thread::scope(|scope| {
        let ctl = endpoint("controller agent").map(|ep| scope.spawn(move || scrape_controller(ep)));
        let sws: Vec<_> = state
            .switches
            .iter()
            .map(|sw| endpoint(&sw.name).map(|ep| scope.spawn(move || scrape_switch(ep, &sw.name))))
            .collect();
        // A scrape reports its failures as data; it does not panic.
        fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
            h.join().expect("a scrape panicked")
        }
        (
            ctl.map(join),
            sws.into_iter().map(|h| h.map(join)).collect::<Vec<_>>(),
        )
    });
    let switches = state
        .switches
        .iter()
        .zip(agents.iter_mut())
        .map(|(sw, agent)| {
            let ovs = sw.ovs.as_ref().filter(|o| o.is_alive());
            SwitchStatus {
                agent: agent.take(),
                name: sw.name.clone(),
                netns: sw.netns.clone(),
                ovs_running: ovs.is_some(),
                target: sw.target.clone(),
                connected: ovs.and_then(|o| o.is_connected(&sw.bridge).ok()),
                flows: ovs
                    .and_then(|o| o.dump_flows(&sw.bridge).ok())
                    .map(|f| f.lines().filter(|l| l.contains("actions=")).count()),
            }
        })
        .collect();
    let control_links = state
        .control_links
        .iter()
        .map(|l| ControlLinkStatus {
            switch: format!("sw{}", l.spec.index),
            link: l.spec.link_name(),
            kind: l.kind,
            ctl_addr: l.spec.ctl_addr(),
            sw_addr: l.spec.sw_addr(),
            impairment: l.spec.impairment,
            report: l.state().ok().map(|st| st.report(&Accounting::default())),
        })
        .collect();
    Ok(Some(LabStatus {
        prefix: state.prefix.clone(),
        complete: state.complete,
        health: check_health(&state).map_err(|e| format!("{e:#}")),
        settings: state.settings.clone(),
        dir: state.dir.clone(),
        controller_running,
        controller_listening,
        controller_agent,
        switches,
        control_links,
        hosts: state
            .hosts
            .iter()
            .map(|h| HostStatus {
                name: h.name.clone(),
                netns: h.netns.clone(),
                ipv4: h.ip.clone(),
                switch: h.switch.clone(),
            })
            .collect(),
        engines: state
            .engines
            .iter()
            .map(|e| EngineStatus {
                switch: e.switch.clone(),
                netns: e.netns.clone(),
                role: e.role.clone(),
                ipv4: e.ip.clone(),
                running: e.proc.as_ref().is_some_and(|p| p.is_alive()),
                stats: std::fs::read(&e.stats)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok()),
            })
            .collect(),
        data_links: state
            .data_links
            .iter()
            .filter_map(|l| {
                let rec = l.emulated.as_ref()?;
                Some(DataLinkStatus {
                    a_switch: l.a_switch.clone(),
                    b_switch: l.b_switch.clone(),
                    link: rec.name.clone(),
                    report: rec
                        .control()
                        .show()
                        .ok()
                        .map(|st| st.report(&Accounting::default())),
                })
            })
            .collect(),
        state,
    }))
}

fn yes_no(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    }
}

impl LabStatus {
    /// The human-readable report of `quicsdn-lab status`.
    pub fn render(&self) -> String {
        let s = &self.settings;
        let mut o = String::new();
        let health = match &self.health {
            _ if !self.complete => {
                "incomplete (an `up` is running or crashed; `down` removes it)".to_string()
            }
            Ok(()) => "up".to_string(),
            Err(e) => format!("BROKEN: {e} (`down` removes it)"),
        };
        o += &format!("lab {}: {health}\n", self.prefix);
        if s.topology == Topology::Line {
            o += &format!(
                "  line: hosts on sw1 and sw{}{}\n",
                s.switches,
                match &s.sdudp {
                    Some(sd) => format!(
                        ", SDUDP engines on {:?}, accumulation {}",
                        sd.engines,
                        if sd.accumulate { "on" } else { "off" }
                    ),
                    None => ", plain TCP".into(),
                }
            );
        }
        o += &format!(
            "  {} switch(es) x {} host(s), transport {}, controller {}, OpenFlow port {}\n",
            s.switches, s.hosts_per_switch, s.transport, s.controller, s.openflow_port
        );
        o += &format!("  state and logs: {}\n", self.dir.display());
        match &self.state.controller {
            Some(c) => {
                o += &format!(
                    "controller {} in {}: pid {}, running {}, listening on :{} {}{}\n  log {}\n",
                    c.kind,
                    c.netns,
                    c.proc.pid,
                    yes_no(self.controller_running),
                    c.port,
                    yes_no(self.controller_listening),
                    if c.tls { " (TLS)" } else { "" },
                    c.log.display()
                );
            }
            None => {
                o += &format!(
                    "controller: none started (attach yours in {})\n",
                    self.state.ctl_netns
                )
            }
        }
        for a in &self.state.agents {
            o += &format!(
                "{}: pid {}, running {}\n",
                a.name,
                a.pid,
                if a.is_alive() { "yes" } else { "NO" }
            );
        }
        if let Some(c) = &self.controller_agent {
            o += &c.render();
        }
        o += "switches:\n";
        for sw in &self.switches {
            o += &format!(
                "  {:<6} ns {:<14} ovs {:<3} target {:<24} connected {:<3} flows {}\n",
                sw.name,
                sw.netns,
                if sw.ovs_running { "up" } else { "DOWN" },
                sw.target.as_deref().unwrap_or("-"),
                yes_no(sw.connected),
                sw.flows
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "-".into())
            );
            if let Some(a) = &sw.agent {
                o += &a.render();
            }
        }
        o += "hosts:\n";
        for h in &self.state.hosts {
            o += &format!(
                "  {:<8} ns {:<16} {:<15} {}  on {} port {} (ofport {})\n",
                h.name, h.netns, h.cidr, h.mac, h.switch, h.port, h.ofport
            );
        }
        if !self.engines.is_empty() {
            o += "SDUDP engines:\n";
        }
        for e in &self.engines {
            o += &format!(
                "  {:<5} beside {}: ns {} {} running {}\n",
                e.role,
                e.switch,
                e.netns,
                e.ipv4,
                if e.running { "yes" } else { "NO" }
            );
        }
        if !s.link.is_none() {
            o += &format!("  data links: {}\n", s.link);
        }
        if !self.state.data_links.is_empty() {
            o += "data links:\n";
            for l in &self.state.data_links {
                o += &format!(
                    "  {}:{} (ofport {}) <-> {}:{} (ofport {})\n",
                    l.a_switch, l.a_port, l.a_ofport, l.b_switch, l.b_port, l.b_ofport
                );
            }
        }
        o += "control links (change with `quicsdn-lab link set LINK ...`; details: `quicsdn-lab link show LINK`):\n";
        for l in &self.control_links {
            o += &format!(
                "  {:<6} link {:<10} {} <-> {}\n",
                l.switch, l.link, l.ctl_addr, l.sw_addr
            );
            let Some(r) = &l.report else {
                o += "         counters unavailable (forwarder not running)\n";
                continue;
            };
            for (name, d) in [("ctl->sw", &r.a_to_b), ("sw->ctl", &r.b_to_a)] {
                let t = &d.total;
                o += &format!(
                    "         {name} {}: offered {} frames {} B, delivered {} frames {} B ({} B on the wire), lost {}, queue-dropped {}\n",
                    d.summary,
                    t.offered.frames,
                    t.offered.bytes,
                    t.delivered.frames,
                    t.delivered.bytes,
                    t.delivered.wire_bytes,
                    t.lost.frames,
                    t.queue_dropped.frames
                );
            }
        }
        if let Some(r) = self.control_links.iter().find_map(|l| l.report.as_ref()) {
            o += &format!("  bytes: {}\n", r.accounting.convention);
        }
        o
    }
}
