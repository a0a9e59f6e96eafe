//! One Open vSwitch 3.1 instance per network namespace (userspace datapath).
//!
//! [`Ovs::start`] creates a fresh database in its own directory and runs
//! `ovsdb-server` and `ovs-vswitchd` inside the namespace with every path
//! absolute and inside that directory (`db.sock`, `*.ctl`, `*.pid`, `*.log`,
//! and the bridges' `BRIDGE.mgmt` sockets, since `OVS_RUNDIR` points there).
//! It never touches the system's own OVS. Two instances cannot share a
//! namespace (each creates `ovs-netdev` and bridge TAP devices there).
//!
//! The returned [`Ovs`] is plain data (serialisable into the lab's state) and
//! is all that is needed to talk to the instance from any namespace:
//! [`Ovs::vsctl`], [`Ovs::ofctl`], [`Ovs::appctl`] run the stock OVS tools
//! against its sockets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::cmd::{run, run_args};
use crate::netns::Netns;
use crate::process::ProcRecord;
use crate::wait::poll_until;

/// How long `ovs-vsctl` may wait for `ovs-vswitchd` to apply a change.
const VSCTL_TIMEOUT_S: u32 = 20;

/// Every OpenFlow version, for `ovs-ofctl -O`: it then speaks the highest one
/// the bridge allows, whatever its `protocols` setting.
const ALL_OF_VERSIONS: &str = "OpenFlow10,OpenFlow11,OpenFlow12,OpenFlow13,OpenFlow14,OpenFlow15";

/// A running OVS instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ovs {
    /// The namespace it runs in.
    pub netns: String,
    /// Its run/db/log directory (absolute).
    pub dir: PathBuf,
    pub ovsdb_server: ProcRecord,
    pub vswitchd: ProcRecord,
}

/// What a switch does when it has no controller connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailMode {
    /// Keep only the flows the controller installed (the lab's choice: traffic
    /// that crosses a switch has provably been allowed by the controller).
    Secure,
    /// Fall back to a normal learning switch.
    Standalone,
}

/// A bridge to create with [`Ovs::add_bridge`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeConfig {
    pub name: String,
    /// `other-config:datapath-id`, or `None` to let OVS derive one from a MAC.
    pub datapath_id: Option<u64>,
    /// `protocols`, e.g. `["OpenFlow13"]`; empty for OVS's default.
    pub protocols: Vec<String>,
    pub fail_mode: FailMode,
}

impl BridgeConfig {
    /// `br0`-style defaults: OpenFlow 1.3 only, fail_mode secure.
    pub fn new(name: &str) -> BridgeConfig {
        BridgeConfig {
            name: name.to_string(),
            datapath_id: None,
            protocols: vec!["OpenFlow13".into()],
            fail_mode: FailMode::Secure,
        }
    }
}

/// Paths of one instance, derived from its directory.
fn path(dir: &Path, file: &str) -> String {
    dir.join(file).to_string_lossy().into_owned()
}

impl Ovs {
    /// Creates `dir` (must not hold a database yet), a fresh `conf.db`, and runs
    /// `ovsdb-server` then `ovs-vswitchd` inside `netns`. Returns once both
    /// daemons have detached, i.e. are serving their sockets.
    pub fn start(netns: &Netns, dir: &Path) -> Result<Ovs> {
        if !dir.is_absolute() {
            bail!(
                "OVS directory must be absolute (OVS resolves relative unix: paths elsewhere): {}",
                dir.display()
            );
        }
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create OVS directory {}", dir.display()))?;
        let db = dir.join("conf.db");
        if db.exists() {
            bail!(
                "{} already exists: another OVS instance uses this directory",
                db.display()
            );
        }
        run_args(
            "ovsdb-tool",
            &[
                "create",
                &db.to_string_lossy(),
                "/usr/share/openvswitch/vswitch.ovsschema",
            ],
        )?;

        let env = |c: &mut Command| {
            for var in ["OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR"] {
                c.env(var, dir);
            }
        };
        let p = |f: &str| path(dir, f);

        let mut c = netns.command("ovsdb-server");
        env(&mut c);
        c.arg(db.as_os_str()).args([
            format!("--remote=punix:{}", p("db.sock")),
            // set-manager (e.g. ptcp:6640 for OVSDB through the agents) works
            // only with the manager_options remote, and ssl: managers only with the keys.
            "--remote=db:Open_vSwitch,Open_vSwitch,manager_options".into(),
            "--private-key=db:Open_vSwitch,SSL,private_key".into(),
            "--certificate=db:Open_vSwitch,SSL,certificate".into(),
            "--ca-cert=db:Open_vSwitch,SSL,ca_cert".into(),
            format!("--unixctl={}", p("ovsdb-server.ctl")),
            format!("--pidfile={}", p("ovsdb-server.pid")),
            format!("--log-file={}", p("ovsdb-server.log")),
            "-vconsole:off".into(),
            "--no-chdir".into(),
            "--detach".into(),
        ]);
        run(&mut c)?;
        let ovsdb_server = ProcRecord::from_pidfile(
            format!("ovsdb-server in {}", netns.name),
            &dir.join("ovsdb-server.pid"),
        )?;

        let mut ovs = Ovs {
            netns: netns.name.clone(),
            dir: dir.to_path_buf(),
            ovsdb_server: ovsdb_server.clone(),
            // Filled in below; until then stopping only concerns ovsdb-server.
            vswitchd: ovsdb_server,
        };
        let started = (|| -> Result<()> {
            ovs.vsctl_no_wait(&["init"])?;
            ovs.start_vswitchd(&[])
        })();
        if let Err(e) = started {
            let _ = ovs.ovsdb_server.terminate(Duration::from_secs(5));
            return Err(e);
        }
        Ok(ovs)
    }

    /// Runs `ovs-vswitchd` against this instance's database, with `extra` options.
    fn start_vswitchd(&mut self, extra: &[&str]) -> Result<()> {
        let p = |f: &str| path(&self.dir, f);
        let mut c = Netns::named(&self.netns).command("ovs-vswitchd");
        for var in ["OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR"] {
            c.env(var, &self.dir);
        }
        c.arg(format!("unix:{}", p("db.sock"))).args([
            format!("--unixctl={}", p("ovs-vswitchd.ctl")),
            format!("--pidfile={}", p("ovs-vswitchd.pid")),
            format!("--log-file={}", p("ovs-vswitchd.log")),
            "-vconsole:off".into(),
            "--no-chdir".into(),
            "--detach".into(),
        ]);
        c.args(extra);
        run(&mut c)?;
        self.vswitchd = ProcRecord::from_pidfile(
            format!("ovs-vswitchd in {}", self.netns),
            &self.dir.join("ovs-vswitchd.pid"),
        )?;
        Ok(())
    }

    /// Stops `ovs-vswitchd` (SIGTERM, as `systemctl restart` does) and starts it
    /// again on the same database, with `extra` options: bridges, ports and
    /// controller targets stay, the flow tables are empty.
    pub fn restart_vswitchd(&mut self, extra: &[&str]) -> Result<()> {
        self.vswitchd.terminate(Duration::from_secs(5))?;
        self.start_vswitchd(extra)
    }

    /// The OVSDB target of this instance: `unix:DIR/db.sock`.
    pub fn db_target(&self) -> String {
        format!("unix:{}", path(&self.dir, "db.sock"))
    }

    /// The OpenFlow management target of `bridge` for `ovs-ofctl`: `unix:DIR/BRIDGE.mgmt`.
    pub fn bridge_target(&self, bridge: &str) -> String {
        format!("unix:{}", path(&self.dir, &format!("{bridge}.mgmt")))
    }

    /// `ovs-vsctl --db=… --timeout=20 args…`: waits until `ovs-vswitchd` has applied the change.
    pub fn vsctl(&self, args: &[&str]) -> Result<String> {
        let mut c = Command::new("ovs-vsctl");
        c.arg(format!("--db={}", self.db_target()))
            .arg(format!("--timeout={VSCTL_TIMEOUT_S}"))
            .args(args);
        run(&mut c)
    }

    /// `ovs-vsctl --no-wait …`: database only, does not wait for `ovs-vswitchd`.
    pub fn vsctl_no_wait(&self, args: &[&str]) -> Result<String> {
        let mut c = Command::new("ovs-vsctl");
        c.arg(format!("--db={}", self.db_target()))
            .arg(format!("--timeout={VSCTL_TIMEOUT_S}"))
            .arg("--no-wait")
            .args(args);
        run(&mut c)
    }

    /// `ovs-ofctl args…` (name the switch with [`Ovs::bridge_target`]).
    pub fn ofctl(&self, args: &[&str]) -> Result<String> {
        run_args("ovs-ofctl", args)
    }

    /// `ovs-appctl -t DIR/ovs-vswitchd.ctl args…`.
    pub fn appctl(&self, args: &[&str]) -> Result<String> {
        let mut c = Command::new("ovs-appctl");
        c.arg("-t")
            .arg(self.dir.join("ovs-vswitchd.ctl"))
            .args(args);
        run(&mut c)
    }

    /// `ovs-ofctl dump-flows` of `bridge`, in the highest OpenFlow version it allows.
    pub fn dump_flows(&self, bridge: &str) -> Result<String> {
        self.ofctl(&[
            "-O",
            ALL_OF_VERSIONS,
            "dump-flows",
            &self.bridge_target(bridge),
        ])
    }

    /// Removes every flow of `bridge`.
    pub fn del_flows(&self, bridge: &str) -> Result<()> {
        self.ofctl(&[
            "-O",
            ALL_OF_VERSIONS,
            "del-flows",
            &self.bridge_target(bridge),
        ])?;
        Ok(())
    }

    /// Adds a bridge with the userspace datapath (`datapath_type=netdev`) and
    /// in-band control disabled: the lab's control traffic never crosses the
    /// bridge, and OVS then installs no hidden in-band flows.
    pub fn add_bridge(&self, cfg: &BridgeConfig) -> Result<()> {
        let br = cfg.name.as_str();
        let mut args: Vec<String> = vec![
            "add-br".into(),
            br.into(),
            "--".into(),
            "set".into(),
            "bridge".into(),
            br.into(),
            "datapath_type=netdev".into(),
            "other-config:disable-in-band=true".into(),
        ];
        args.push(match cfg.fail_mode {
            FailMode::Secure => "fail_mode=secure".into(),
            FailMode::Standalone => "fail_mode=standalone".into(),
        });
        if let Some(dpid) = cfg.datapath_id {
            args.push(format!("other-config:datapath-id={dpid:016x}"));
        }
        if !cfg.protocols.is_empty() {
            args.push(format!("protocols={}", cfg.protocols.join(",")));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.vsctl(&args)?;
        Ok(())
    }

    /// Adds the (existing, in this namespace) interface `port` to `bridge`,
    /// asking for OpenFlow port number `ofport` if given.
    pub fn add_port(&self, bridge: &str, port: &str, ofport: Option<u16>) -> Result<()> {
        let mut args = vec!["add-port", bridge, port];
        let req;
        if let Some(n) = ofport {
            req = format!("ofport_request={n}");
            args.extend(["--", "set", "interface", port, &req]);
        }
        self.vsctl(&args)?;
        Ok(())
    }

    /// Installs the switch's key, certificate and CA certificate for `ssl:` targets.
    pub fn set_ssl(&self, key: &Path, cert: &Path, ca_cert: &Path) -> Result<()> {
        self.vsctl(&[
            "set-ssl",
            &key.to_string_lossy(),
            &cert.to_string_lossy(),
            &ca_cert.to_string_lossy(),
        ])?;
        Ok(())
    }

    /// Points `bridge` at `targets` (e.g. `tcp:10.254.1.1:6653`) with
    /// out-of-band control. Clears the bridge's flows first: with fail_mode
    /// secure, old flows would otherwise stay until the new controller replaces them.
    pub fn set_controller(&self, bridge: &str, targets: &[String]) -> Result<()> {
        if targets.is_empty() {
            bail!("set_controller: no target");
        }
        self.del_flows(bridge)?;
        // One transaction: a Controller row per target, then the bridge's set of
        // them (`set controller BRIDGE …` would name only a bridge's single row).
        let mut args: Vec<String> = Vec::new();
        for (i, target) in targets.iter().enumerate() {
            args.extend([
                "--".into(),
                format!("--id=@c{i}"),
                "create".into(),
                "controller".into(),
                format!("target=\"{target}\""),
                "connection-mode=out-of-band".into(),
            ]);
        }
        let ids: Vec<String> = (0..targets.len()).map(|i| format!("@c{i}")).collect();
        args.extend([
            "--".into(),
            "set".into(),
            "bridge".into(),
            bridge.into(),
            format!("controller=[{}]", ids.join(",")),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.vsctl(&args)?;
        Ok(())
    }

    /// Whether `bridge`'s controller connection is up, as OVS reports it in
    /// OVSDB (`is_connected` of every controller of the bridge; true if any is).
    pub fn is_connected(&self, bridge: &str) -> Result<bool> {
        let uuids = self.vsctl(&["get", "bridge", bridge, "controller"])?;
        let uuids = uuids.trim().trim_start_matches('[').trim_end_matches(']');
        for uuid in uuids.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            if self
                .vsctl(&["get", "controller", uuid, "is_connected"])?
                .trim()
                == "true"
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits until [`Ovs::is_connected`] is true, up to `timeout`.
    pub fn wait_connected(&self, bridge: &str, timeout: Duration) -> Result<()> {
        poll_until(
            &format!("{bridge} in {} to connect to its controller", self.netns),
            timeout,
            || Ok(self.is_connected(bridge)?.then_some(())),
        )
    }

    /// True while both daemons run.
    pub fn is_alive(&self) -> bool {
        self.ovsdb_server.is_alive() && self.vswitchd.is_alive()
    }

    /// Stops both daemons by recorded PID (`ovs-vswitchd` first). Idempotent.
    /// Leaves the directory (logs) in place.
    pub fn stop(&self) -> Result<()> {
        let grace = Duration::from_secs(5);
        let a = self.vswitchd.terminate(grace);
        let b = self.ovsdb_server.terminate(grace);
        a.and(b)
    }
}

/// One line of `ovs-vswitchd.log`: `2026-11-22T06:41:13.123Z|00042|rconn|INFO|text`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// CLOCK_REALTIME of the line, in ns (OVS writes milliseconds, UTC).
    pub realtime_ns: u64,
    pub module: String,
    pub level: String,
    pub text: String,
}

/// Parses one log line; `None` for continuation lines of multi-line messages.
pub fn parse_log_line(line: &str) -> Option<LogLine> {
    let mut parts = line.splitn(5, '|');
    let (ts, _seq, module, level, text) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    Some(LogLine {
        realtime_ns: parse_log_time(ts)?,
        module: module.to_string(),
        level: level.to_string(),
        text: text.to_string(),
    })
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC) as ns since the Unix epoch.
fn parse_log_time(ts: &str) -> Option<u64> {
    let b = ts.as_bytes();
    if b.len() != 24 || b[4] != b'-' || b[10] != b'T' || b[19] != b'.' || b[23] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    u64::try_from(secs * 1_000_000_000 + ms * 1_000_000).ok()
}

impl Ovs {
    /// Every parsed line of `ovs-vswitchd.log` so far.
    pub fn log_lines(&self) -> Result<Vec<LogLine>> {
        let p = self.dir.join("ovs-vswitchd.log");
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(text.lines().filter_map(parse_log_line).collect())
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    #[test]
    fn log_lines_parse_with_their_time() {
        let l = parse_log_line(
            "2026-11-22T06:41:13.123Z|00042|rconn|INFO|unix:/run/x.sock: connecting...",
        )
        .unwrap();
        // date -u -d 2026-11-22T06:41:13Z +%s = 1795329673
        assert_eq!(l.realtime_ns, 1_795_329_673_123_000_000);
        assert_eq!((l.module.as_str(), l.level.as_str()), ("rconn", "INFO"));
        assert_eq!(l.text, "unix:/run/x.sock: connecting...");
        assert_eq!(
            parse_log_line("1970-01-01T00:00:00.001Z|1|a|DBG|x")
                .unwrap()
                .realtime_ns,
            1_000_000
        );
        assert!(parse_log_line(" actions=output:2").is_none());
        assert!(parse_log_line("2026-11-22 06:41:13|1|a|b|c").is_none());
    }
}
