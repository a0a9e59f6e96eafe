//! `quicsdn-lab bench reconnect`: the time from a switch's reconnect to the
//! first OpenFlow message delivered, in RTTs (issue 6, item 3), over `quic`
//! with 0-RTT, `quic` without it (`--no-zero-rtt`), `tcp` and `tls` (TLS 1.3,
//! mutual authentication: OVS's OpenSSL against the benchmark controller's
//! rustls).
//!
//! One switch (real Open vSwitch), an emulated control link with RTT/2 delay
//! each way, and a benchmark controller in the controller namespace that, on
//! every connection, sends HELLO and FEATURES_REQUEST, and after the
//! FEATURES_REPLY one FLOW_MOD and a BARRIER.
//!
//! Each repetition, the same for every transport:
//!
//! 1. OVS's controller is removed (`del-controller`): OVS closes its
//!    connection; the controller sees it close.
//! 2. The control link goes down. With the agents, the switch agent loses its
//!    QUIC connection (grace period 1.5 s), one attempt fails, and the bench
//!    waits until the agent logs that it waits out its backoff: it then holds
//!    session tickets but no connection, as after an outage.
//! 3. The link comes back, and OVS is given its controller again: OVS starts a
//!    new connection at once (a new target has no backoff) — to the
//!    controller over `tcp`/`tls`, to the switch agent's socket over `quic`,
//!    where it makes the agent connect at once.
//!
//! **t0** is OVS's `rconn` log line `TARGET: connecting...` (ovs-vswitchd.log,
//! millisecond timestamps): the moment OVS starts its new connection. From
//! it: the first OpenFlow message the controller receives (OVS's HELLO), the
//! FEATURES_REPLY at the controller, and the FLOW_MOD at OVS (vconn's debug
//! log, `received: OFPT_FLOW_MOD`). Times are CLOCK_REALTIME on both sides
//! (one machine).

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use quicsdn_wire::openflow::build::{self, msg_type};
use quicsdn_wire::openflow::{HEADER_LEN, Header};

use crate::bench::out::{self, Csv, md_table};
use crate::bench::synth::{self, TlsSide};
use crate::bench::table1::{flow_mod_add, tls_sides};
use crate::control_link::parse_duration;
use crate::controller::ControllerKind;
use crate::emulator::control::DirPatch;
use crate::emulator::sys::{in_netns, realtime_ns};
use crate::ovs::Ovs;
use crate::state::LabState;
use crate::topology::{self, BRIDGE, LabConfig};
use crate::transport::Transport;

#[derive(clap::Args, Debug, Clone)]
pub struct ReconnectArgs {
    /// Where reconnect.csv, summary.md and reconnect.png go.
    #[arg(long, default_value = "bench-results/reconnect")]
    pub out: PathBuf,
    /// Two repetitions per transport instead of `--reps`.
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated: quic (0-RTT), quic-no-0rtt, tcp, tls.
    #[arg(long, default_value = "quic,quic-no-0rtt,tcp,tls")]
    pub transports: String,
    /// Repetitions per transport.
    #[arg(long, default_value_t = 12)]
    pub reps: u32,
    /// Who reconnects: `ovs` (Open vSwitch itself), `synthetic` (a lab program
    /// that speaks OpenFlow like OVS but reacts at once), or `both`.
    #[arg(long, default_value = "both")]
    pub switch: String,
    /// Round-trip time of the control link (half each way).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub rtt: Duration,
    /// Name prefix of the lab.
    #[arg(long, default_value = "qsdnrec")]
    pub prefix: String,
    /// Skip the PNG.
    #[arg(long)]
    pub no_plots: bool,
}

pub const HEADER: &[&str] = &[
    "transport",
    "switch",
    "rep",
    "rtt_ms",
    "zero_rtt",
    "attempts",
    "connected_ms",
    "first_message_ms",
    "first_message",
    "features_reply_ms",
    "flow_mod_at_switch_ms",
    "first_message_rtts",
    "features_reply_rtts",
    "flow_mod_at_switch_rtts",
];

const PATIENCE: Duration = Duration::from_secs(30);
/// The agents' grace period here: shorter than the 2 s after which the switch
/// agent retries a lost connection at once, so a failed attempt during the
/// outage ends in a backoff the bench can wait for.
const AGENT_ARGS: [&str; 2] = ["--grace=1500ms", "--keepalive=500ms"];
const BACKOFF_LINE: &str = "next connection attempt in";
const CONNECTED_LINE: &str = "connected to the controller agent";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Quic,
    QuicNo0Rtt,
    Tcp,
    Tls,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Quic => "quic",
            Kind::QuicNo0Rtt => "quic-no-0rtt",
            Kind::Tcp => "tcp",
            Kind::Tls => "tls",
        }
    }

    fn is_quic(self) -> bool {
        matches!(self, Kind::Quic | Kind::QuicNo0Rtt)
    }
}

fn parse_kinds(s: &str) -> Result<Vec<Kind>> {
    s.split(',')
        .map(|t| match t.trim() {
            "quic" => Ok(Kind::Quic),
            "quic-no-0rtt" => Ok(Kind::QuicNo0Rtt),
            "tcp" => Ok(Kind::Tcp),
            "tls" => Ok(Kind::Tls),
            other => bail!(
                "unknown transport {other:?} for bench reconnect (quic, quic-no-0rtt, tcp, tls)"
            ),
        })
        .collect()
}

/// What the controller saw on one connection (CLOCK_REALTIME, ns).
#[derive(Debug, Clone)]
struct ConnReport {
    first: u64,
    first_type: u8,
    features: u64,
}

enum ConnEvent {
    /// Handshake done, FLOW_MOD and BARRIER answered.
    Ready(ConnReport),
    Closed,
    Failed(String),
}

/// One OpenFlow connection at the benchmark controller: HELLO and
/// FEATURES_REQUEST at once, a FLOW_MOD and a BARRIER after FEATURES_REPLY,
/// echo answered, until the switch closes it.
fn serve(stream: std::net::TcpStream, tls: Option<TlsSide>, flow: u32, tx: Sender<ConnEvent>) {
    let r = (|| -> Result<()> {
        let (mut rd, mut wr) = synth::split(stream, tls.as_ref())?;
        wr.send(&build::hello(1))?;
        wr.send(&build::features_request(2))?;
        let mut buf = Vec::new();
        let (mut first, mut features): (Option<(u64, u8)>, Option<u64>) = (None, None);
        loop {
            if rd.read_into(&mut buf)? == 0 {
                let _ = tx.send(ConnEvent::Closed);
                return Ok(());
            }
            let now = realtime_ns();
            while let Some(h) = Header::parse(&buf) {
                let len = usize::from(h.length);
                if len < HEADER_LEN {
                    bail!("the switch sent a message of length {len}");
                }
                if buf.len() < len {
                    break;
                }
                let m: Vec<u8> = buf.drain(..len).collect();
                first.get_or_insert((now, h.msg_type));
                match h.msg_type {
                    msg_type::ECHO_REQUEST => {
                        wr.send(&build::echo_reply(h.xid, &m[HEADER_LEN..]))?
                    }
                    msg_type::FEATURES_REPLY if features.is_none() => {
                        features = Some(now);
                        wr.send(&flow_mod_add(flow, 3))?;
                        wr.send(&build::barrier_request(4))?;
                    }
                    msg_type::BARRIER_REPLY if h.xid == 4 => {
                        let (f, t) = first.expect("set above");
                        let _ = tx.send(ConnEvent::Ready(ConnReport {
                            first: f,
                            first_type: t,
                            features: features.context("BARRIER_REPLY before FEATURES_REPLY")?,
                        }));
                    }
                    msg_type::ERROR => bail!("OpenFlow error from the switch"),
                    _ => {}
                }
            }
        }
    })();
    if let Err(e) = r {
        let _ = tx.send(ConnEvent::Failed(format!("{e:#}")));
    }
}

/// Accepts at once (poll(2) on the listener) and serves each connection on
/// its own thread.
fn acceptor(
    listener: TcpListener,
    tls: Option<TlsSide>,
    stop: Arc<AtomicBool>,
    tx: Sender<ConnEvent>,
) {
    let mut flow = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        match listener.accept() {
            Ok((s, _)) => {
                flow += 1;
                let (tls, tx) = (tls.clone(), tx.clone());
                let _ = s.set_nonblocking(false);
                std::thread::spawn(move || serve(s, tls, flow, tx));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                let _ = tx.send(ConnEvent::Failed(format!("accepting: {e}")));
                return;
            }
        }
    }
}

/// Removes the lab when dropped.
struct LabGuard(PathBuf, String);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Err(e) = topology::down(&self.0, &self.1) {
            eprintln!("removing lab {}: {e:#}", self.1);
        }
    }
}

fn lab_config(prefix: &str, k: Kind, rtt: Duration) -> LabConfig {
    let mut cfg = LabConfig::new(prefix);
    let s = &mut cfg.settings;
    s.switches = 1;
    s.hosts_per_switch = 0;
    s.controller = ControllerKind::None;
    s.impairment.delay = Some(rtt / 2);
    s.transport = match k {
        Kind::Tcp => Transport::Tcp,
        Kind::Tls => Transport::Tls,
        Kind::Quic | Kind::QuicNo0Rtt => Transport::Quic,
    };
    if k.is_quic() {
        s.agent_args = AGENT_ARGS.iter().map(|a| a.to_string()).collect();
        if k == Kind::QuicNo0Rtt {
            s.agent_args.push("--no-zero-rtt".into());
        }
    }
    cfg
}

fn set_link(state: &LabState, up: bool) -> Result<()> {
    let rec = state.control_links[0]
        .emulator
        .as_ref()
        .context("the control link has no emulator")?;
    rec.control().set_both(DirPatch {
        up: Some(up),
        ..DirPatch::default()
    })?;
    Ok(())
}

fn count_lines(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// Waits for the next event of the controller, skipping `Closed` unless asked for.
fn next_event(rx: &Receiver<ConnEvent>, want_closed: bool) -> Result<Option<ConnReport>> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(ConnEvent::Ready(r)) if !want_closed => return Ok(Some(r)),
            Ok(ConnEvent::Closed) if want_closed => return Ok(None),
            Ok(ConnEvent::Failed(e)) => bail!("the benchmark controller: {e}"),
            Ok(_) => {}
            Err(_) => bail!(
                "the benchmark controller saw no {} within {PATIENCE:?}",
                if want_closed {
                    "close of OVS's connection"
                } else {
                    "complete handshake"
                }
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SwitchKind {
    Ovs,
    Synthetic,
}

impl SwitchKind {
    fn name(self) -> &'static str {
        match self {
            SwitchKind::Ovs => "ovs",
            SwitchKind::Synthetic => "synthetic",
        }
    }
}

fn parse_switches(s: &str) -> Result<Vec<SwitchKind>> {
    Ok(match s {
        "ovs" => vec![SwitchKind::Ovs],
        "synthetic" => vec![SwitchKind::Synthetic],
        "both" => vec![SwitchKind::Ovs, SwitchKind::Synthetic],
        other => bail!("--switch {other:?}: ovs, synthetic or both"),
    })
}

/// Times the switch side saw (CLOCK_REALTIME, ns).
#[derive(Debug, Clone, Copy)]
struct SwitchTimes {
    t0: u64,
    /// Connection attempts until one succeeded (OVS may time one out and retry).
    attempts: usize,
    connected: Option<u64>,
    flow_mod: Option<u64>,
}

/// A lab program in the switch namespace that plays OVS's part: connects
/// where OVS would (the controller over `tcp`/`tls` with the switch's
/// certificate, the switch agent's socket over `quic`), sends HELLO at once,
/// answers FEATURES_REQUEST, ECHO and BARRIER, and notes when the FLOW_MOD
/// arrived. It reacts to each event at once, unlike OVS 3.1, which notices a
/// completed TCP connect or an incoming message during connection set-up
/// only at its next periodic wake-up (every ~500 ms here).
struct SynthSwitch {
    stop: Arc<AtomicBool>,
    times: Receiver<Result<SwitchTimes>>,
    thread: std::thread::JoinHandle<()>,
}

enum SwitchTarget {
    Tcp(std::net::SocketAddr, Option<TlsSide>),
    Unix(PathBuf),
}

fn features_reply(xid: u32) -> Vec<u8> {
    let mut m = Header {
        version: quicsdn_wire::openflow::OFP13_VERSION,
        msg_type: msg_type::FEATURES_REPLY,
        length: 32,
        xid,
    }
    .encode()
    .to_vec();
    m.extend_from_slice(&0x51u64.to_be_bytes()); // datapath id
    m.extend_from_slice(&0u32.to_be_bytes()); // n_buffers
    m.extend_from_slice(&[254, 0, 0, 0]); // n_tables, auxiliary id, pad
    m.extend_from_slice(&0u32.to_be_bytes()); // capabilities
    m.extend_from_slice(&0u32.to_be_bytes()); // reserved
    m
}

impl SynthSwitch {
    fn start(netns: &str, target: SwitchTarget) -> SynthSwitch {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = channel();
        let (ns, stop2) = (netns.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let r = (|| -> Result<()> {
                crate::emulator::sys::enter_netns(&ns)?;
                let t0 = realtime_ns();
                let (mut rd, mut wr, sock) = match &target {
                    SwitchTarget::Tcp(addr, tls) => {
                        let s = std::net::TcpStream::connect_timeout(addr, PATIENCE)
                            .with_context(|| format!("connecting to {addr}"))?;
                        let sock = s.try_clone()?;
                        let (rd, wr) = synth::split(s, tls.as_ref())?;
                        (rd, wr, Some(sock))
                    }
                    SwitchTarget::Unix(p) => {
                        let s = std::os::unix::net::UnixStream::connect(p)
                            .with_context(|| format!("connecting to {}", p.display()))?;
                        s.set_read_timeout(Some(Duration::from_millis(50)))?;
                        (
                            synth::Reader::Unix(s.try_clone()?),
                            synth::Writer::Unix(s),
                            None,
                        )
                    }
                };
                let connected = realtime_ns();
                wr.send(&build::hello(1))?;
                if let Some(s) = &sock {
                    s.set_read_timeout(Some(Duration::from_millis(50)))?;
                }
                let mut times = SwitchTimes {
                    t0,
                    attempts: 1,
                    connected: Some(connected),
                    flow_mod: None,
                };
                let mut buf = Vec::new();
                while !stop2.load(Ordering::Relaxed) {
                    match rd.read_into(&mut buf) {
                        Ok(0) => bail!("the controller side closed the connection"),
                        Ok(_) => {}
                        Err(e) if crate::wait::timed_out(&e) => {
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                    let now = realtime_ns();
                    while let Some(h) = Header::parse(&buf) {
                        let len = usize::from(h.length);
                        if len < HEADER_LEN {
                            bail!("a message of length {len}");
                        }
                        if buf.len() < len {
                            break;
                        }
                        let m: Vec<u8> = buf.drain(..len).collect();
                        match h.msg_type {
                            msg_type::FEATURES_REQUEST => wr.send(&features_reply(h.xid))?,
                            msg_type::ECHO_REQUEST => {
                                wr.send(&build::echo_reply(h.xid, &m[HEADER_LEN..]))?
                            }
                            msg_type::FLOW_MOD => {
                                times.flow_mod.get_or_insert(now);
                            }
                            msg_type::BARRIER_REQUEST => {
                                let mut r = m.clone();
                                r[1] = msg_type::BARRIER_REPLY;
                                wr.send(&r)?;
                                let _ = tx.send(Ok(times));
                            }
                            _ => {}
                        }
                    }
                }
                wr.shutdown();
                Ok(())
            })();
            if let Err(e) = r {
                let _ = tx.send(Err(e));
            }
        });
        SynthSwitch {
            stop,
            times: rx,
            thread,
        }
    }

    fn times(&self) -> Result<SwitchTimes> {
        self.times
            .recv_timeout(PATIENCE)
            .map_err(|_| anyhow!("the synthetic switch got no BARRIER within {PATIENCE:?}"))?
    }

    fn close(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow!("the synthetic switch panicked"))
    }
}

/// Everything a repetition needs.
struct Ctx<'a> {
    k: Kind,
    sw: SwitchKind,
    rtt: Duration,
    state: &'a LabState,
    ovs: &'a Ovs,
    target: &'a str,
    switch_log: &'a Path,
    rx: &'a Receiver<ConnEvent>,
    /// The synthetic switch's client TLS configuration (`tls`).
    client_tls: Option<TlsSide>,
}

impl Ctx<'_> {
    fn synth_target(&self) -> Result<SwitchTarget> {
        Ok(match self.k {
            Kind::Quic | Kind::QuicNo0Rtt => SwitchTarget::Unix(PathBuf::from(
                self.target
                    .strip_prefix("unix:")
                    .context("a quic target is a unix socket")?,
            )),
            Kind::Tcp | Kind::Tls => {
                let addr = self
                    .target
                    .split_once(':')
                    .map(|x| x.1)
                    .context("a tcp/ssl target")?;
                SwitchTarget::Tcp(addr.parse()?, self.client_tls.clone())
            }
        })
    }
}

/// The OVS log's view of the latest connection to `target` from `mark` on.
fn ovs_times(ovs: &Ovs, target: &str, mark: u64) -> Result<SwitchTimes> {
    let lines = ovs.log_lines()?;
    let after = |l: &&crate::ovs::LogLine| l.realtime_ns + 1_000_000 > mark;
    let find = |module: &str, needle: &str| {
        lines
            .iter()
            .filter(after)
            .find(|l| l.module == module && l.text.contains(needle))
            .map(|l| l.realtime_ns)
    };
    let connected = find("rconn", ": connected");
    let attempts = lines
        .iter()
        .filter(after)
        .filter(|l| connected.is_none_or(|c| l.realtime_ns <= c))
        .filter(|l| l.module == "rconn" && l.text.ends_with(": connecting..."))
        .count();
    Ok(SwitchTimes {
        t0: find("rconn", ": connecting...").context("OVS logged no \"connecting...\"")?,
        attempts,
        connected,
        // vconn names the connection by its target (the management socket's
        // FLOW_MODs, e.g. from ovs-ofctl, carry another name).
        flow_mod: find("vconn", &format!("{target}: received: OFPT_FLOW_MOD")),
    })
}

/// One measured repetition's row. `synth` holds the synthetic switch's
/// connection between repetitions.
fn repetition(c: &Ctx, rep: u32, synth: &mut Option<SynthSwitch>) -> Result<Vec<String>> {
    // Events of connections OVS gave up on (it times out slow attempts).
    while c.rx.try_recv().is_ok() {}
    // 1. The switch closes its connection; the controller sees it close.
    match c.sw {
        SwitchKind::Ovs => {
            c.ovs.vsctl(&["del-controller", BRIDGE])?;
        }
        SwitchKind::Synthetic => synth.take().context("no synthetic switch")?.close()?,
    }
    next_event(c.rx, true)?;
    // 2. An outage; with the agents, until the switch agent waits out a backoff.
    let backoffs = count_lines(c.switch_log, BACKOFF_LINE);
    set_link(c.state, false)?;
    if c.k.is_quic() {
        crate::wait::poll_until("the switch agent to wait out a backoff", PATIENCE, || {
            Ok((count_lines(c.switch_log, BACKOFF_LINE) > backoffs).then_some(()))
        })?;
    }
    let connected_before = count_lines(c.switch_log, CONNECTED_LINE);
    set_link(c.state, true)?;
    // 3. The switch connects again.
    let mark = realtime_ns();
    let (times, report) = match c.sw {
        SwitchKind::Ovs => {
            c.ovs.set_controller(BRIDGE, &[c.target.to_string()])?;
            let report = next_event(c.rx, false)?.context("no report")?;
            (ovs_times(c.ovs, c.target, mark)?, report)
        }
        SwitchKind::Synthetic => {
            let s = SynthSwitch::start(&c.state.switches[0].netns, c.synth_target()?);
            let t = s.times();
            *synth = Some(s);
            (t?, next_event(c.rx, false)?.context("no report")?)
        }
    };
    let zero_rtt = if c.k.is_quic() {
        let text = std::fs::read_to_string(c.switch_log)?;
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(CONNECTED_LINE))
            .collect();
        if lines.len() <= connected_before {
            bail!("the switch agent logged no new connection");
        }
        if lines.last().expect("checked").contains("zero_rtt=true") {
            "true"
        } else {
            "false"
        }
    } else {
        "-"
    };
    let t0 = times.t0;
    let ms = |t: Option<u64>| t.map(|t| (t as f64 - t0 as f64) / 1e6);
    let rtt_ms = c.rtt.as_secs_f64() * 1e3;
    let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
    let r = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.3}", x / rtt_ms));
    let (first, features, fm) = (
        ms(Some(report.first)),
        ms(Some(report.features)),
        ms(times.flow_mod),
    );
    Ok(vec![
        c.k.name().into(),
        c.sw.name().into(),
        rep.to_string(),
        format!("{rtt_ms:.0}"),
        zero_rtt.into(),
        times.attempts.to_string(),
        f(ms(times.connected)),
        f(first),
        msg_name(report.first_type).into(),
        f(features),
        f(fm),
        r(first),
        r(features),
        r(fm),
    ])
}

fn msg_name(t: u8) -> &'static str {
    match t {
        msg_type::HELLO => "HELLO",
        msg_type::ECHO_REQUEST => "ECHO_REQUEST",
        msg_type::FEATURES_REPLY => "FEATURES_REPLY",
        _ => "other",
    }
}

fn run_kind(k: Kind, args: &ArgsResolved, csv: &mut Csv) -> Result<()> {
    let cfg = lab_config(&args.prefix, k, args.rtt);
    topology::down(&cfg.run_dir, &cfg.prefix)?;
    let up = topology::up(&cfg)?;
    let _guard = LabGuard(cfg.run_dir.clone(), cfg.prefix.clone());
    let state = up.state;
    let ovs = state.switches[0].ovs.clone().context("no OVS")?;
    let target = state.switches[0].target.clone().context("no target")?;
    let switch_log = ovs.dir.join("quicsdn-switch.log");
    ovs.appctl(&["vlog/set", "vconn:file:dbg"])?;
    // Listen only once OVS has no controller, so every connection is a new one.
    ovs.vsctl(&["del-controller", BRIDGE])?;
    let (tls, client_tls) = match k {
        Kind::Tls => {
            let pki = state.pki_dir.clone().context("no PKI")?;
            let creds =
                quicsdn_transport::tls::Credentials::load(&quicsdn_transport::tls::TlsFiles {
                    ca: pki.join("ca.crt"),
                    cert: pki.join("sw1.crt"),
                    key: pki.join("sw1.key"),
                })?;
            (
                Some(tls_sides(&state)?.0),
                Some(TlsSide {
                    server: None,
                    client: Some((Arc::new(creds.client_config()?), "controller".into())),
                }),
            )
        }
        _ => (None, None),
    };
    let host = if k.is_quic() { "127.0.0.1" } else { "0.0.0.0" };
    let port = state.settings.openflow_port;
    let listener = in_netns(&state.ctl_netns, move || TcpListener::bind((host, port)))?
        .with_context(|| format!("listening on {host}:{port}"))?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = channel();
    let acc = {
        let stop = stop.clone();
        std::thread::spawn(move || acceptor(listener, tls, stop, tx))
    };
    let r = (|| -> Result<()> {
        for sw in &args.switches {
            let c = Ctx {
                k,
                sw: *sw,
                rtt: args.rtt,
                state: &state,
                ovs: &ovs,
                target: &target,
                switch_log: &switch_log,
                rx: &rx,
                client_tls: client_tls.clone(),
            };
            // A first, unmeasured connection (it gets the agents their session
            // tickets), then the repetitions.
            let mut synth = None;
            match sw {
                SwitchKind::Ovs => {
                    ovs.set_controller(BRIDGE, std::slice::from_ref(&target))?;
                }
                SwitchKind::Synthetic => {
                    let s = SynthSwitch::start(&state.switches[0].netns, c.synth_target()?);
                    s.times()?;
                    synth = Some(s);
                }
            }
            next_event(&rx, false)?;
            for rep in 1..=args.reps {
                let row = repetition(&c, rep, &mut synth)
                    .with_context(|| format!("{} ({}) repetition {rep}", k.name(), sw.name()))?;
                println!("  {}", row.join(" "));
                csv.push(row);
            }
            match synth {
                Some(s) => s.close()?,
                None => {
                    ovs.vsctl(&["del-controller", BRIDGE])?;
                }
            }
            next_event(&rx, true)?;
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    acc.join().map_err(|_| anyhow!("the acceptor panicked"))?;
    if k.is_quic() {
        // The agent's own account of each reconnect (0-RTT or not), beside the results.
        let _ = std::fs::copy(
            &switch_log,
            args.out.join(format!("{}-switch-agent.log", k.name())),
        );
    }
    r
}

struct ArgsResolved {
    prefix: String,
    reps: u32,
    rtt: Duration,
    switches: Vec<SwitchKind>,
    out: PathBuf,
}

pub fn run(args: ReconnectArgs) -> Result<()> {
    crate::cmd::require_root()?;
    let kinds = parse_kinds(&args.transports)?;
    if args.rtt.is_zero() {
        bail!("--rtt must be positive (results are in RTTs)");
    }
    let resolved = ArgsResolved {
        prefix: args.prefix.clone(),
        reps: if args.quick { 2 } else { args.reps.max(1) },
        rtt: args.rtt,
        switches: parse_switches(&args.switch)?,
        out: args.out.clone(),
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let started = Instant::now();
    let mut csv = Csv::new(HEADER);
    for k in kinds {
        println!(
            "reconnect over {}: {} repetitions, RTT {:?}",
            k.name(),
            resolved.reps,
            args.rtt
        );
        run_kind(k, &resolved, &mut csv)?;
    }
    csv.write(&args.out.join("reconnect.csv"))?;
    let plots = if args.no_plots {
        Vec::new()
    } else {
        out::plot("reconnect", &args.out)?
    };
    let md = markdown(&csv, &args, started.elapsed(), &plots);
    std::fs::write(args.out.join("summary.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// Median, minimum and maximum.
fn spread(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((med, v[0], v[n - 1]))
}

fn markdown(csv: &Csv, args: &ReconnectArgs, took: Duration, plots: &[PathBuf]) -> String {
    let mut s = String::from("# Reconnect: time to the first OpenFlow message, in RTTs\n\n");
    s += &format!(
        "Generated by `quicsdn-lab bench reconnect` in {:.0} s. Control link RTT {:?} (half each way, emulated), real Open vSwitch 3.1, a benchmark controller. After an outage that left no connection in place (with the agents: the switch agent between attempts, holding session tickets), the switch connects again. *ovs*: Open vSwitch itself (given its controller again); t0 = its `connecting...` log line. *synthetic*: a lab program in the switch namespace that connects where OVS would and answers like OVS, but at once; t0 = its `connect()` call. Method: [docs/benchmarks.md](../../benchmarks.md#bench-reconnect).\n\n",
        took.as_secs_f64(),
        args.rtt
    );
    s += &out::provenance();
    s.push('\n');
    let mut groups: Vec<(String, String)> = Vec::new();
    for r in &csv.rows {
        let g = (r[0].clone(), r[1].clone());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let mut rows = Vec::new();
    for (k, sw) in &groups {
        let sub: Vec<&Vec<String>> = csv
            .rows
            .iter()
            .filter(|r| &r[0] == k && &r[1] == sw)
            .collect();
        let col = |name: &str| -> Vec<f64> {
            sub.iter()
                .filter_map(|r| r[csv.col(name)].parse().ok())
                .collect()
        };
        let fmt = |v: Vec<f64>| {
            spread(v).map_or("-".to_string(), |(m, lo, hi)| {
                format!("**{m:.2}** ({lo:.2}–{hi:.2})")
            })
        };
        let zero = sub
            .iter()
            .filter(|r| r[csv.col("zero_rtt")] == "true")
            .count();
        let retried = sub.iter().filter(|r| r[csv.col("attempts")] != "1").count();
        rows.push(vec![
            k.clone(),
            sw.clone(),
            sub.len().to_string(),
            retried.to_string(),
            if k.starts_with("quic") {
                format!("{zero}/{}", sub.len())
            } else {
                "-".into()
            },
            fmt(col("first_message_rtts")),
            spread(col("first_message_ms")).map_or("-".into(), |m| format!("{:.1}", m.0)),
            fmt(col("features_reply_rtts")),
            fmt(col("flow_mod_at_switch_rtts")),
        ]);
    }
    s += &md_table(
        &[
            "transport",
            "switch",
            "repetitions",
            "needed more than one attempt",
            "resumed in 0-RTT",
            "first message at the controller (RTTs)",
            "(ms, median)",
            "FEATURES_REPLY at the controller (RTTs)",
            "FLOW_MOD at the switch (RTTs)",
        ],
        &rows,
    );
    s += "\nMedian in bold, (minimum–maximum) beside it. The first message is OVS's HELLO in every repetition of every transport (column `first_message` of reconnect.csv). OVS's log has millisecond timestamps, so its t0 is up to 1 ms early. Open vSwitch 3.1 notices a completed TCP connect, and messages during connection set-up, only at its next periodic wake-up (every ~500 ms here: `poll_loop` debug logging shows no wake-up on the socket), which the *ovs* rows include; over `quic` OVS's connection is a local unix socket, which connects at once, so its HELLO leaves immediately. OVS also gives a connection attempt only max(1 s, its backoff) to complete, then logs `connection timed out` and retries after its backoff (1 s, 2 s, …): a TLS handshake that needs several of its wake-ups at this RTT exceeds it, which the `attempts` column of reconnect.csv counts (attempts from t0 until the connection that succeeded).\n\n";
    for p in plots {
        if let Some(n) = p.file_name() {
            s += &format!("![{0}]({0})\n", n.to_string_lossy());
        }
    }
    s
}

/// Reads `reconnect.csv`, checking its schema.
pub fn read(dir: &Path) -> Result<Csv> {
    Csv::read(&dir.join("reconnect.csv"), HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_spread() {
        assert_eq!(
            parse_kinds("quic,quic-no-0rtt,tcp,tls").unwrap(),
            vec![Kind::Quic, Kind::QuicNo0Rtt, Kind::Tcp, Kind::Tls]
        );
        assert!(parse_kinds("kcptun").is_err());
        assert_eq!(spread(vec![3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(spread(vec![4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(spread(vec![]), None);
        let c = lab_config("x", Kind::QuicNo0Rtt, Duration::from_millis(100));
        assert_eq!(c.settings.impairment.delay, Some(Duration::from_millis(50)));
        assert!(c.settings.agent_args.contains(&"--no-zero-rtt".to_string()));
        assert!(
            lab_config("x", Kind::Tcp, Duration::from_millis(100))
                .settings
                .agent_args
                .is_empty()
        );
    }
}
