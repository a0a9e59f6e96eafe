//! The quicsdn agents inside the lab: the real `quicsdn` binary, one controller
//! agent in the controller namespace and one switch agent per switch namespace,
//! each a recorded process with its own log.
//!
//! OVS reaches its switch agent by a unix socket inside its own run directory
//! (OVS accepts `unix:` controller targets only there); the controller agent
//! reaches the controller on the controller namespace's loopback.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::netns::Netns;
use crate::process::{ProcRecord, log_tail, spawn_service};
use crate::wait::poll_until;

/// UDP port the controller agent listens on.
pub const QUIC_PORT: u16 = 6653;

/// Finds one of the project's binaries: `$ENV` if set, else next to the
/// running executable or one directory up (test binaries live in
/// `target/*/deps`, the binaries in `target/*`).
fn project_binary(name: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe()?;
    for dir in me.ancestors().skip(1).take(2) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "the {name} binary was not found next to {}: build it (cargo build -p {name}) or set {env}",
        me.display()
    )
}

/// The SDUDP engine binary `quicsdn-sdudp` (`$QUICSDN_SDUDP_BIN` overrides).
pub fn sdudp_binary() -> Result<PathBuf> {
    project_binary("quicsdn-sdudp", "QUICSDN_SDUDP_BIN")
}

/// The `quicsdn` binary (`$QUICSDN_BIN` overrides).
pub fn quicsdn_binary() -> Result<PathBuf> {
    project_binary("quicsdn", "QUICSDN_BIN")
}

/// The `quicsdn-lab` binary, whose `emulate run` subcommand is the link
/// emulator's forwarder (`$QUICSDN_LAB_BIN` overrides).
pub fn lab_binary() -> Result<PathBuf> {
    project_binary("quicsdn-lab", "QUICSDN_LAB_BIN")
}

/// TLS files of one agent.
#[derive(Debug, Clone)]
pub struct AgentTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl AgentTls {
    fn args(&self) -> [String; 3] {
        [
            format!("--ca={}", self.ca.display()),
            format!("--cert={}", self.cert.display()),
            format!("--key={}", self.key.display()),
        ]
    }
}

/// Runs `quicsdn ARGS` in `netns` as a recorded service logging to `log`, and
/// waits until it logs `ready` (each agent logs a fixed line once it listens).
fn spawn_agent(
    netns: &Netns,
    what: &str,
    args: Vec<String>,
    ready: &str,
    log: &Path,
) -> Result<ProcRecord> {
    let mut c = netns.command(quicsdn_binary()?);
    c.args(&args);
    let name = format!("quicsdn {what} in {}", netns.name);
    let proc = spawn_service(&name, &mut c, log)?;
    poll_until(
        &format!("{name} to listen"),
        Duration::from_secs(10),
        || {
            if !proc.is_alive() {
                bail!("{name} exited: {}", log_tail(log, 10));
            }
            Ok(std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains(ready)
                .then_some(()))
        },
    )
    .with_context(|| format!("see {}", log.display()))?;
    Ok(proc)
}

/// True for the `quicsdn` options only a switch agent takes
/// (`--zero-length-cid[=BOOL]`); the lab gives the agents one list of extra
/// options and leaves these out for controller agents.
pub fn is_switch_only(arg: &str) -> bool {
    arg.starts_with("--zero-length-cid")
}

/// Starts a controller agent in `netns`, listening on UDP `listen`, with
/// `services` (`NAME=TARGET` as `quicsdn controller --service` takes them).
pub fn start_controller_agent(
    netns: &Netns,
    listen: &str,
    tls: &AgentTls,
    services: &[String],
    extra: &[String],
    log: &Path,
) -> Result<ProcRecord> {
    let mut args = vec!["controller".to_string(), format!("--listen={listen}")];
    args.extend(tls.args());
    args.extend(services.iter().map(|s| format!("--service={s}")));
    args.extend(extra.iter().filter(|a| !is_switch_only(a)).cloned());
    spawn_agent(
        netns,
        "controller agent",
        args,
        "controller agent listening",
        log,
    )
}

/// Starts a switch agent in `netns` for the controller agent at `controller`
/// (`IP:PORT`), and waits until its listening services are up.
pub fn start_switch_agent(
    netns: &Netns,
    controller: &str,
    server_name: &str,
    tls: &AgentTls,
    services: &[String],
    extra: &[String],
    log: &Path,
) -> Result<ProcRecord> {
    let mut args = vec![
        "switch".to_string(),
        format!("--controller={controller}"),
        format!("--server-name={server_name}"),
    ];
    args.extend(tls.args());
    args.extend(services.iter().map(|s| format!("--service={s}")));
    args.extend_from_slice(extra);
    spawn_agent(netns, "switch agent", args, "waiting for OVS", log)
}

/// The unix socket OVS connects to for OpenFlow, inside OVS's run directory.
pub fn openflow_socket(ovs_dir: &Path) -> PathBuf {
    ovs_dir.join("quicsdn-openflow.sock")
}
