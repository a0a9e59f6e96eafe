//! A two-node lab for the synthetic benches: a switch namespace and a controller
//! namespace joined by one emulated control link, and one of the compared
//! transports between them.
//!
//! ```text
//!  P-s (switch side)                                   P-c (controller side)
//!  synthetic switch ──▶ [transport, switch end] ══ emulated link ══ [controller end] ──▶ synthetic controller
//!  10.254.1.2                                                                10.254.1.1
//! ```
//!
//! | transport | switch program connects to | in between | controller program listens on |
//! |---|---|---|---|
//! | `tcp` | `10.254.1.1:PORT` | one TCP connection per service | `0.0.0.0:PORT` |
//! | `tls` | `10.254.1.1:PORT` | one TLS 1.3 connection per service, mutual auth (rustls, the lab's CA) | `0.0.0.0:PORT` |
//! | `quic`, `quic-rr16`, `quic-tuned`, `quic-old` | `127.0.0.1:PORT` | the real `quicsdn switch` (`ptcp:` services) → one QUIC connection → `quicsdn controller` (`quic-tuned`: with [`TUNED_ARGS`]; `quic-old`: with [`OLD_DEFAULT_ARGS`]) | `127.0.0.1:PORT` |
//! | `udp-seed`, `udp-robust` | `127.0.0.1:PORT` | the same agents with `--transport udp --udp-profile seed\|robust --allow-unauthenticated`: plain UDP with an application-level reliability layer, unauthenticated | `127.0.0.1:PORT` |
//! | `kcptun` | `127.0.0.1:PORT` | `kcptun-client` → KCP over UDP → `kcptun-server`, one tunnel per service (a kcptun server forwards to one target) | `127.0.0.1:PORT` |
//!
//! PORT is 6653 for OpenFlow and 6640 for OVSDB. Everything is removed on drop, by
//! the child processes' PIDs and the recorded namespace and link names.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use crate::bench::synth::{Service, TlsSide};
use crate::emulator::traffic::NetnsGuard;
use crate::emulator::{self, Accounting, DirSettings, LinkRecord, LinkSpec, LinkState};
use crate::netns::Netns;
use crate::wait::poll_until;

/// A transport compared by the benches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum BenchTransport {
    Tcp,
    Tls,
    /// quicsdn in its default stream mode, `safe` (docs/streams.md): ordering-safe
    /// streams per service plus a priority stream for echo.
    Quic,
    /// quicsdn with `--streams rr:16` (the paper's quicSDN-16s).
    QuicRr16,
    /// quicsdn, default stream mode, with the overhead tuning of [`TUNED_ARGS`].
    QuicTuned,
    /// quicsdn, default stream mode, with the defaults before issue 13
    /// ([`OLD_DEFAULT_ARGS`]): what the new defaults are compared against in
    /// the same run. In no bench's default list.
    QuicOld,
    Kcptun,
    /// quicsdn agents over plain UDP, the paper's reliability mechanism.
    UdpSeed,
    /// quicsdn agents over plain UDP, the robust reliability mechanism.
    UdpRobust,
}

/// The agents' options of `quic-tuned`: coalescing on a 10 ms clock,
/// zero-length connection IDs on the switch side, and ACKs only every 17th
/// ack-eliciting packet (or after the peer's 25 ms). Since issue 13 all but
/// the zero-length connection IDs are the defaults. See docs/benchmarks.md for
/// what each costs.
pub const TUNED_ARGS: [&str; 3] = ["--coalesce=10ms", "--zero-length-cid", "--ack-threshold=16"];

/// The agents' defaults before issue 13: no coalescing, an ACK every second
/// packet, 8-byte connection IDs both ways, a keep-alive every 2 s.
pub const OLD_DEFAULT_ARGS: [&str; 5] = [
    "--coalesce=off",
    "--ack-threshold=off",
    "--zero-length-cid=false",
    "--cid-len=8",
    "--keepalive=2s",
];

impl BenchTransport {
    /// What the benches compare by default (their `--transports` lists):
    /// all but `quic-old`, which a comparison names when it wants it.
    pub const COMPARED: [BenchTransport; 8] = [
        BenchTransport::Tcp,
        BenchTransport::Tls,
        BenchTransport::Quic,
        BenchTransport::QuicRr16,
        BenchTransport::QuicTuned,
        BenchTransport::Kcptun,
        BenchTransport::UdpSeed,
        BenchTransport::UdpRobust,
    ];

    /// Every transport a bench takes.
    pub const ALL: [BenchTransport; 9] = [
        BenchTransport::Tcp,
        BenchTransport::Tls,
        BenchTransport::Quic,
        BenchTransport::QuicRr16,
        BenchTransport::QuicTuned,
        BenchTransport::QuicOld,
        BenchTransport::Kcptun,
        BenchTransport::UdpSeed,
        BenchTransport::UdpRobust,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BenchTransport::Tcp => "tcp",
            BenchTransport::Tls => "tls",
            BenchTransport::Quic => "quic",
            BenchTransport::QuicRr16 => "quic-rr16",
            BenchTransport::QuicTuned => "quic-tuned",
            BenchTransport::QuicOld => "quic-old",
            BenchTransport::Kcptun => "kcptun",
            BenchTransport::UdpSeed => "udp-seed",
            BenchTransport::UdpRobust => "udp-robust",
        }
    }

    pub fn is_quic(self) -> bool {
        matches!(
            self,
            BenchTransport::Quic
                | BenchTransport::QuicRr16
                | BenchTransport::QuicTuned
                | BenchTransport::QuicOld
        )
    }

    /// True for the quicsdn agents over UDP.
    pub fn is_udp(self) -> bool {
        matches!(self, BenchTransport::UdpSeed | BenchTransport::UdpRobust)
    }

    /// True for every transport carried by the quicsdn agents.
    pub fn uses_agents(self) -> bool {
        self.is_quic() || self.is_udp()
    }

    /// The lab transport (`quicsdn-lab up --transport`) that carries this one.
    pub fn lab_transport(self) -> crate::transport::Transport {
        use crate::transport::Transport;
        match self {
            BenchTransport::Tcp => Transport::Tcp,
            BenchTransport::Tls => Transport::Tls,
            BenchTransport::Kcptun => Transport::Kcptun,
            BenchTransport::UdpSeed => Transport::UdpSeed,
            BenchTransport::UdpRobust => Transport::UdpRobust,
            _ => Transport::Quic,
        }
    }

    /// Agent options this transport always uses.
    pub fn agent_args(self) -> Vec<String> {
        match self.setting_args() {
            [] => self.lab_transport().agent_transport_args(),
            a => a.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The agents' settings that set this QUIC variant apart from `quic`.
    pub fn setting_args(self) -> &'static [&'static str] {
        match self {
            BenchTransport::QuicTuned => &TUNED_ARGS,
            BenchTransport::QuicOld => &OLD_DEFAULT_ARGS,
            _ => &[],
        }
    }

    /// The agents' `--streams` value.
    pub fn streams(self) -> Option<&'static str> {
        match self {
            BenchTransport::Quic | BenchTransport::QuicTuned | BenchTransport::QuicOld => {
                Some("safe")
            }
            BenchTransport::QuicRr16 => Some("rr:16"),
            _ => None,
        }
    }
}

impl fmt::Display for BenchTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BenchTransport {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        BenchTransport::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = BenchTransport::ALL.iter().map(|t| t.as_str()).collect();
                anyhow!("unknown transport {s:?} ({})", known.join(", "))
            })
    }
}

/// Parses a comma-separated transport list.
pub fn parse_transports(s: &str) -> Result<Vec<BenchTransport>> {
    s.split(',').map(|t| t.trim().parse()).collect()
}

/// The controller side's address on the control link.
pub const CTL_ADDR: Ipv4Addr = Ipv4Addr::new(10, 254, 1, 1);
/// The switch side's address.
pub const SW_ADDR: Ipv4Addr = Ipv4Addr::new(10, 254, 1, 2);
/// UDP port of the controller agent.
const QUIC_PORT: u16 = 6653;

/// The kcptun tunnel's UDP port for a service.
fn kcp_port(svc: Service) -> u16 {
    match svc {
        Service::OpenFlow => 29900,
        Service::Ovsdb => 29901,
    }
}

/// A child process, killed by its PID on drop.
pub struct ChildGuard {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl ChildGuard {
    pub(crate) fn spawn(
        ns: &Netns,
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Self> {
        let out = std::fs::File::create(log)?;
        let child = ns
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(ChildGuard {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    pub(crate) fn check(&mut self) -> Result<()> {
        if let Some(st) = self.child.try_wait()? {
            bail!(
                "{} exited ({st}): {}",
                self.name,
                crate::process::log_tail(&self.log, 10)
            );
        }
        Ok(())
    }

    fn log_contains(&self, s: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains(s)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a pair is built with.
#[derive(Debug, Clone)]
pub struct PairSpec {
    /// Names: namespaces `PREFIX-s`, `PREFIX-c`, link `PREFIX-l` (TAPs `PREFIX-la`,
    /// `PREFIX-lb`); at most 12 characters.
    pub prefix: String,
    pub transport: BenchTransport,
    /// Both directions of the control link.
    pub link: DirSettings,
    /// The link's loss seed (`None`: a fresh one). Benches that compare
    /// transports give each the same, so their links draw the same losses.
    pub link_seed: Option<u64>,
    /// Extra `quicsdn` arguments for both agents (tuning experiments).
    pub agent_args: Vec<String>,
    /// Scratch directory for certificates and logs.
    pub dir: PathBuf,
}

/// A running pair. Fields drop in order: processes, link, namespaces; then
/// its scratch directory goes (it holds private keys; a failure has already
/// quoted the logs it needed in its error).
pub struct Pair {
    procs: Vec<ChildGuard>,
    dir: PathBuf,
    link: Option<LinkRecord>,
    pub ctl: NetnsGuard,
    pub sw: NetnsGuard,
    pub transport: BenchTransport,
    tls_server: Option<TlsSide>,
    tls_client: Option<TlsSide>,
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.procs.clear();
        if let Some(rec) = self.link.take()
            && let Err(e) = emulator::destroy_link(&rec)
        {
            eprintln!("cleanup: {e:#}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn remove_leftovers(prefix: &str) -> Result<()> {
    let _ = emulator::destroy_link_by_name(
        Path::new(emulator::link::DEFAULT_RUN_DIR),
        &format!("{prefix}-l"),
    );
    for ns in [format!("{prefix}-s"), format!("{prefix}-c")] {
        if Netns::exists(&ns) {
            let n = Netns::named(&ns);
            n.kill_all(Duration::from_secs(2))?;
            n.delete()?;
        }
    }
    Ok(())
}

impl Pair {
    /// Builds the namespaces, the link and the transport's processes, and waits
    /// until they are ready (for `quic`: the QUIC connection is up).
    pub fn up(spec: &PairSpec) -> Result<Pair> {
        crate::cmd::require_root()?;
        remove_leftovers(&spec.prefix)?;
        // The pair's own scratch directory (certificates, logs): fresh every time.
        let _ = std::fs::remove_dir_all(&spec.dir);
        std::fs::create_dir_all(&spec.dir)?;
        let sw = NetnsGuard::create(&format!("{}-s", spec.prefix))?;
        let ctl = NetnsGuard::create(&format!("{}-c", spec.prefix))?;
        let mut pair = Pair {
            procs: Vec::new(),
            dir: spec.dir.clone(),
            link: None,
            ctl,
            sw,
            transport: spec.transport,
            tls_server: None,
            tls_client: None,
        };
        let mut ls = LinkSpec::new(
            &format!("{}-l", spec.prefix),
            &pair.ctl.name,
            &pair.sw.name,
            CTL_ADDR,
            SW_ADDR,
        )
        .with_settings(spec.link.clone());
        ls.tap_a = format!("{}-la", spec.prefix);
        ls.tap_b = format!("{}-lb", spec.prefix);
        ls.seed = spec.link_seed;
        pair.link = Some(emulator::create_link(&ls, &crate::agents::lab_binary()?)?);
        let mut spec = spec.clone();
        spec.agent_args.splice(0..0, spec.transport.agent_args());
        pair.start_transport(&spec)?;
        Ok(pair)
    }

    fn start_transport(&mut self, spec: &PairSpec) -> Result<()> {
        let (swns, ctlns) = (Netns::named(&self.sw.name), Netns::named(&self.ctl.name));
        let dir = &spec.dir;
        match spec.transport {
            BenchTransport::Tcp => {}
            BenchTransport::Tls => {
                let pki = crate::pki::Pki::create(&dir.join("pki"))?;
                let creds = |name: &str| -> Result<quicsdn_transport::tls::Credentials> {
                    let p = pki.issue(name)?;
                    Ok(quicsdn_transport::tls::Credentials::load(
                        &quicsdn_transport::tls::TlsFiles {
                            ca: pki.ca_cert(),
                            cert: p.cert,
                            key: p.key,
                        },
                    )?)
                };
                let server = creds("bench-ctl")?.server_config()?;
                let client = creds("bench-sw")?.client_config()?;
                self.tls_server = Some(TlsSide {
                    server: Some(Arc::new(server)),
                    client: None,
                });
                self.tls_client = Some(TlsSide {
                    server: None,
                    client: Some((Arc::new(client), "bench-ctl".into())),
                });
            }
            t if t.uses_agents() => {
                let pki = crate::pki::Pki::create(&dir.join("pki"))?;
                let bin = crate::agents::quicsdn_binary()?;
                let tls_args = |name: &str| -> Result<Vec<String>> {
                    let p = pki.issue(name)?;
                    Ok(vec![
                        format!("--ca={}", pki.ca_cert().display()),
                        format!("--cert={}", p.cert.display()),
                        format!("--key={}", p.key.display()),
                    ])
                };
                let mut c_args = vec![
                    "--threads=1".to_string(),
                    "controller".into(),
                    format!("--listen=0.0.0.0:{QUIC_PORT}"),
                ];
                c_args.extend(tls_args("controller-agent")?);
                for svc in Service::BOTH {
                    c_args.push(format!(
                        "--service={}=tcp:127.0.0.1:{}",
                        svc.name(),
                        svc.port()
                    ));
                }
                c_args.extend(
                    spec.agent_args
                        .iter()
                        .filter(|a| !crate::agents::is_switch_only(a))
                        .cloned(),
                );
                let mut s_args = vec![
                    "--threads=1".to_string(),
                    "switch".into(),
                    format!("--controller={CTL_ADDR}:{QUIC_PORT}"),
                    "--server-name=controller-agent".into(),
                ];
                s_args.extend(t.streams().map(|m| format!("--streams={m}")));
                s_args.extend(tls_args("bench-sw")?);
                for svc in Service::BOTH {
                    s_args.push(format!(
                        "--service={}=ptcp:{}:127.0.0.1",
                        svc.name(),
                        svc.port()
                    ));
                }
                s_args.extend(spec.agent_args.iter().cloned());
                let c = ChildGuard::spawn(
                    &ctlns,
                    "quicsdn controller agent",
                    &bin,
                    &c_args,
                    &dir.join("quicsdn-controller.log"),
                )?;
                self.procs.push(c);
                self.wait_log(0, "controller agent listening")?;
                let s = ChildGuard::spawn(
                    &swns,
                    "quicsdn switch agent",
                    &bin,
                    &s_args,
                    &dir.join("quicsdn-switch.log"),
                )?;
                self.procs.push(s);
                self.wait_log(1, "connected to the controller agent")?;
            }
            BenchTransport::Kcptun => {
                let (client, server) = kcptun_binaries()?;
                for svc in Service::BOTH {
                    // No compression: the synthetic messages' padding would compress
                    // away, which real OpenFlow/OVSDB traffic does not.
                    let common = ["--key=quicsdn-bench".to_string(), "--nocomp".into()];
                    let mut s_args = vec![
                        format!("--listen=:{}", kcp_port(svc)),
                        format!("--target=127.0.0.1:{}", svc.port()),
                    ];
                    s_args.extend(common.iter().cloned());
                    let s = ChildGuard::spawn(
                        &ctlns,
                        &format!("kcptun-server ({})", svc.name()),
                        &server,
                        &s_args,
                        &dir.join(format!("kcptun-server-{}.log", svc.name())),
                    )?;
                    self.procs.push(s);
                    let mut c_args = vec![
                        format!("--localaddr=127.0.0.1:{}", svc.port()),
                        format!("--remoteaddr={CTL_ADDR}:{}", kcp_port(svc)),
                    ];
                    c_args.extend(common.iter().cloned());
                    let c = ChildGuard::spawn(
                        &swns,
                        &format!("kcptun-client ({})", svc.name()),
                        &client,
                        &c_args,
                        &dir.join(format!("kcptun-client-{}.log", svc.name())),
                    )?;
                    self.procs.push(c);
                    let port = svc.port();
                    let udp = kcp_port(svc);
                    poll_until(
                        "kcptun to listen",
                        Duration::from_secs(10),
                        || -> Result<Option<()>> {
                            for p in &mut self.procs {
                                p.check()?;
                            }
                            let tcp = swns.tcp_listening(port)?;
                            let u = ctlns.exec(&["ss", "-ulnH"])?;
                            Ok((tcp && u.contains(&format!(":{udp}"))).then_some(()))
                        },
                    )?;
                }
            }
            _ => unreachable!(),
        }
        Ok(())
    }

    fn wait_log(&mut self, i: usize, line: &str) -> Result<()> {
        poll_until(
            &format!("{} to log {line:?}", self.procs[i].name),
            Duration::from_secs(15),
            || {
                self.procs[i].check()?;
                Ok(self.procs[i].log_contains(line).then_some(()))
            },
        )
    }

    /// Fails if a transport process has died.
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.procs {
            p.check()?;
        }
        Ok(())
    }

    /// The last `lines` of every process's log, each under its name: what a
    /// failed cell quotes, since the scratch directory goes with the pair.
    pub fn log_tails(&self, lines: usize) -> String {
        self.procs
            .iter()
            .map(|p| {
                format!(
                    "--- {}:\n{}",
                    p.name,
                    crate::process::log_tail(&p.log, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Where the controller program listens for `svc`.
    pub fn ctl_listen(&self, svc: Service) -> SocketAddr {
        let ip = match self.transport {
            BenchTransport::Tcp | BenchTransport::Tls => Ipv4Addr::UNSPECIFIED,
            _ => Ipv4Addr::LOCALHOST,
        };
        SocketAddr::V4(SocketAddrV4::new(ip, svc.port()))
    }

    /// Where the switch program connects for `svc`.
    pub fn sw_connect(&self, svc: Service) -> SocketAddr {
        let ip = match self.transport {
            BenchTransport::Tcp | BenchTransport::Tls => CTL_ADDR,
            _ => Ipv4Addr::LOCALHOST,
        };
        SocketAddr::V4(SocketAddrV4::new(ip, svc.port()))
    }

    /// TLS settings of the controller (server) and switch (client) programs.
    pub fn tls(&self) -> (Option<TlsSide>, Option<TlsSide>) {
        (self.tls_server.clone(), self.tls_client.clone())
    }

    pub fn link_state(&self) -> Result<LinkState> {
        self.link.as_ref().context("no link")?.control().show()
    }

    pub fn reset_counters(&self) -> Result<()> {
        self.link
            .as_ref()
            .context("no link")?
            .control()
            .reset_counters()?;
        Ok(())
    }

    /// Per-direction wire counters: `(ctl→sw, sw→ctl)`.
    pub fn counters(&self, acc: &Accounting) -> Result<(DirCount, DirCount)> {
        let r = self.link_state()?.report(acc);
        let d = |x: &emulator::control::DirReport| DirCount {
            frames: x.total.offered.frames,
            bytes: x.total.offered.bytes,
            wire_bytes: x.total.offered.wire_bytes,
            transport_payload: x.total.offered.payload_bytes,
            ack_only: x.total.offered.ack_only_frames,
            lost: x.total.lost.frames,
        };
        Ok((d(&r.a_to_b), d(&r.b_to_a)))
    }
}

/// What crossed one direction of the link (offered to it: lost frames count, since
/// the sender paid for them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DirCount {
    pub frames: u64,
    pub bytes: u64,
    pub wire_bytes: u64,
    /// TCP/UDP payload (transport bytes, including TLS/QUIC/KCP framing).
    pub transport_payload: u64,
    pub ack_only: u64,
    pub lost: u64,
}

/// `kcptun-client`, `kcptun-server` (Debian package `kcptun`).
pub fn kcptun_binaries() -> Result<(PathBuf, PathBuf)> {
    let find = |n: &str| -> Result<PathBuf> {
        let p = PathBuf::from("/usr/bin").join(n);
        if p.is_file() {
            Ok(p)
        } else {
            bail!("{n} not found: install the Debian package kcptun (scripts/install-deps)")
        }
    };
    Ok((find("kcptun-client")?, find("kcptun-server")?))
}
