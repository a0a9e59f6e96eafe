//! `quicsdn-lab bench soak`: a fault soak with a message audit (issue 17).
//!
//! One switch (real Open vSwitch, userspace datapath, `fail_mode=secure`)
//! and a real controller (os-ken with `controllers/soak.py`), through the
//! quicsdn agents over an emulated control link with a NAT at the switch's
//! end. Both directions carry sequence-stamped OpenFlow traffic:
//!
//! * controller → switch: FLOW_MODs (the sequence number is the xid and the
//!   cookie), ECHO_REQUESTs and DESC stats requests (xid);
//! * switch → controller: PACKET_INs of UDP packets a host sends into a table
//!   miss (the sequence number is in the ports), and the replies (xid).
//!
//! Faults, on a schedule (the injection log is in the output): loss bursts
//! (10 to 30 %) and a 10 s outage of the control link, `kill -9` of the switch
//! agent and of the controller agent (started again at once, as a supervisor
//! would), a restart of the controller and of `ovs-vswitchd`, a NAT
//! rebinding, and a certificate reload (the switch agent's certificate and key
//! replaced, then SIGHUP: the session must carry on).
//!
//! **The audit** compares both ends of the path the agents are responsible for:
//! what Open vSwitch sent and received on its controller connection (its own
//! `vconn` debug log) against what the controller sent and received (the
//! app's event log). For each stream, every message must arrive exactly once
//! and in order; a message may be missing only if a session ended between its
//! sending and the next message that did arrive (OVS logged a new connection,
//! or the controller saw one). Anything else (a loss inside one session, a
//! duplicate, a reorder, a message nobody sent) is a violation. At the end the
//! switch's flow table (`ovs-ofctl dump-flows`) must equal what the controller
//! believes it installed.
//!
//! **Recovery** of a fault is timed from the fault's end (link restored,
//! process started again, NAT rebound) to the first ECHO_REPLY at the
//! controller for an ECHO_REQUEST it sent after that end: the whole path
//! works again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::net::UdpSocket;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::out::{self, Csv, md_table};
use crate::control_link::Impairment;
use crate::controller::{ControllerKind, ControllerSpec, RunningController, start_controller_with};
use crate::emulator::control::DirPatch;
use crate::emulator::model::LossModel;
use crate::emulator::sys::{in_netns, realtime_ns};
use crate::ovs::parse_log_line;
use crate::testbed::{AgentLayout, AgentRole, Targets, Testbed, TestbedSpec, Via};
use crate::topology::default_repo_dir;

#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long to inject faults (the schedule repeats until then).
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// Each fault kind once, with short calm periods (about two minutes);
    /// ignores `--minutes`.
    #[arg(long)]
    pub quick: bool,
    /// Where injections.csv, audit.csv, faults.csv and summary.md go.
    #[arg(long, default_value = "bench-results/soak")]
    pub out: PathBuf,
    /// Name prefix of the namespaces and the link.
    #[arg(long, default_value = "qsdnsoak")]
    pub prefix: String,
    /// The first port the NAT in front of the switch hands out (each rebinding
    /// moves it up by 20, wrapping after 5).
    #[arg(long, default_value_t = 40100)]
    pub nat_port: u16,
    /// Keep the run's logs (OVS, agents, controller, its event log) in OUT/logs
    /// also when the soak succeeds (they are always kept when it fails).
    #[arg(long)]
    pub keep_logs: bool,
}

/// The kinds of fault, in the order of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    LossBurst,
    LinkDown,
    KillSwitchAgent,
    KillControllerAgent,
    ControllerRestart,
    OvsRestart,
    NatRebind,
    CertReload,
}

pub const FAULT_KINDS: [FaultKind; 8] = [
    FaultKind::LossBurst,
    FaultKind::LinkDown,
    FaultKind::KillSwitchAgent,
    FaultKind::KillControllerAgent,
    FaultKind::ControllerRestart,
    FaultKind::OvsRestart,
    FaultKind::NatRebind,
    FaultKind::CertReload,
];

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::LossBurst => "loss burst",
            FaultKind::LinkDown => "control link down 10 s",
            FaultKind::KillSwitchAgent => "kill -9 switch agent",
            FaultKind::KillControllerAgent => "kill -9 controller agent",
            FaultKind::ControllerRestart => "controller restart",
            FaultKind::OvsRestart => "OVS restart",
            FaultKind::NatRebind => "NAT rebinding",
            FaultKind::CertReload => "certificate reload",
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct Injection {
    pub kind: FaultKind,
    pub detail: String,
    /// CLOCK_REALTIME, ns.
    pub start_ns: u64,
    pub end_ns: u64,
    /// When the path worked again (see the module docs), if it did.
    pub recovered_ns: Option<u64>,
}

impl Injection {
    pub fn recovery_s(&self) -> Option<f64> {
        self.recovered_ns
            .map(|r| r.saturating_sub(self.end_ns) as f64 / 1e9)
    }
}

/// The audit of one stream of messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamAudit {
    pub stream: &'static str,
    pub direction: &'static str,
    pub sent: u64,
    pub delivered: u64,
    /// Missing, with a session reset between (allowed).
    pub lost_at_reset: u64,
    /// Missing inside one session (a violation).
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Arrived, never sent.
    pub unknown: u64,
    /// The first few violations, described.
    pub examples: Vec<String>,
}

impl StreamAudit {
    pub fn violations(&self) -> u64 {
        self.lost + self.duplicates + self.reordered + self.unknown
    }
}

/// The soak's outcome.
#[derive(Debug, Clone)]
pub struct SoakReport {
    pub duration_s: f64,
    pub injections: Vec<Injection>,
    pub audits: Vec<StreamAudit>,
    /// Flows that differ between the switch and the controller's belief.
    pub flow_table_mismatches: Vec<String>,
    pub flows_believed: usize,
    /// Sessions seen by OVS and by the controller.
    pub ovs_sessions: u64,
    pub controller_sessions: u64,
    /// Lines OVS's log rate limiter dropped (the audit is incomplete if any).
    pub ovs_log_lines_dropped: u64,
}

impl SoakReport {
    pub fn messages_audited(&self) -> u64 {
        self.audits.iter().map(|a| a.sent).sum()
    }

    pub fn violations(&self) -> u64 {
        self.audits.iter().map(|a| a.violations()).sum::<u64>()
            + self.flow_table_mismatches.len() as u64
    }

    pub fn unrecovered(&self) -> usize {
        self.injections
            .iter()
            .filter(|i| i.recovered_ns.is_none())
            .count()
    }
}

/// xids of the app's messages start here (controllers/soak.py).
const XID_BASE: u64 = 0x4000_0000;
const MISS_COOKIE: u64 = 0x3fff_ffff;
const SLOT_PRIORITY: u32 = 100;
const HOST_IP: &str = "10.0.0.1";
/// A host that does not exist: its packets miss the table.
const MISS_IP: &str = "10.0.0.2";
const MISS_MAC: &str = "02:51:00:00:00:02";
const PACKET_INTERVAL: Duration = Duration::from_millis(500);
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);
const LINK_DOWN: Duration = Duration::from_secs(10);
const VCONN_DEBUG: &str = "--verbose=vconn:file:dbg";

/// One line of the controller app's event log.
#[derive(Debug, Clone, serde::Deserialize)]
struct Event {
    t: f64,
    ev: String,
    #[serde(default)]
    k: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    s: Option<u64>,
}

/// Reads the event log as it grows.
struct EventLog {
    path: PathBuf,
    offset: u64,
    partial: String,
    events: Vec<Event>,
}

impl EventLog {
    fn new(path: PathBuf) -> EventLog {
        EventLog {
            path,
            offset: 0,
            partial: String::new(),
            events: Vec::new(),
        }
    }

    /// Reads what was appended; returns the index of the first new event.
    fn refresh(&mut self) -> Result<usize> {
        let first = self.events.len();
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Ok(first);
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut text = String::new();
        self.offset += f.read_to_string(&mut text)? as u64;
        self.partial.push_str(&text);
        let complete = self.partial.rfind('\n').map_or(0, |i| i + 1);
        for line in self.partial[..complete].lines() {
            let e: Event = serde_json::from_str(line)
                .with_context(|| format!("{}: bad event {line:?}", self.path.display()))?;
            self.events.push(e);
        }
        self.partial.drain(..complete);
        Ok(first)
    }
}

/// Watches the event log for the path to work: an ECHO_REPLY to an
/// ECHO_REQUEST sent at or after a given time.
struct Watch {
    log: EventLog,
    echo_sent: HashMap<u64, f64>,
    /// (reply time, request time) of every echo round trip so far.
    echoes: Vec<(f64, f64)>,
}

impl Watch {
    fn poll(&mut self) -> Result<()> {
        let first = self.log.refresh()?;
        for e in &self.log.events[first..] {
            match (e.ev.as_str(), e.k.as_deref(), e.seq) {
                ("tx", Some("echo_request"), Some(seq)) => {
                    self.echo_sent.insert(seq, e.t);
                }
                ("rx", Some("echo_reply"), Some(seq)) => {
                    if let Some(sent) = self.echo_sent.get(&seq) {
                        self.echoes.push((e.t, *sent));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Waits for an echo round trip that began at or after `since_ns`; the
    /// time its reply arrived.
    fn wait_echo_after(&mut self, since_ns: u64, timeout: Duration) -> Result<Option<u64>> {
        let since = since_ns as f64 / 1e9;
        let deadline = Instant::now() + timeout;
        loop {
            self.poll()?;
            if let Some((rx, _)) = self.echoes.iter().find(|(_, tx)| *tx >= since) {
                return Ok(Some((*rx * 1e9) as u64));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A message of one stream, at one end.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Msg {
    seq: u64,
    /// Seconds, CLOCK_REALTIME.
    t: f64,
    session: u64,
}

/// The latest session that began at or before `t` (0: none yet).
fn session_at(starts: &[(u64, f64)], t: f64) -> u64 {
    starts
        .iter()
        .filter(|(_, at)| *at <= t)
        .map(|(s, _)| *s)
        .max()
        .unwrap_or(0)
}

/// Audits one stream: `sent` by one end (in sending order), `received` by
/// the other (in arrival order); `recv_starts` are the receiver's session
/// starts (session, time).
fn audit(
    stream: &'static str,
    direction: &'static str,
    sent: &[Msg],
    received: &[Msg],
    recv_starts: &[(u64, f64)],
    order_key: fn(u64) -> u64,
) -> StreamAudit {
    let mut a = StreamAudit {
        stream,
        direction,
        sent: sent.len() as u64,
        ..StreamAudit::default()
    };
    let sent_seqs: HashSet<u64> = sent.iter().map(|m| m.seq).collect();
    let mut seen: HashMap<u64, Msg> = HashMap::new();
    // The order is promised per key (the packet's flow for PACKET_INs).
    let mut max_seen: HashMap<u64, u64> = HashMap::new();
    let note = |a: &mut StreamAudit, what: String| {
        if a.examples.len() < 10 {
            a.examples.push(what);
        }
    };
    for m in received {
        if !sent_seqs.contains(&m.seq) {
            a.unknown += 1;
            note(&mut a, format!("{stream} {} arrived, never sent", m.seq));
            continue;
        }
        if seen.contains_key(&m.seq) {
            a.duplicates += 1;
            note(&mut a, format!("{stream} {} arrived twice", m.seq));
            continue;
        }
        let max = max_seen.entry(order_key(m.seq)).or_insert(m.seq);
        if m.seq < *max {
            a.reordered += 1;
            note(&mut a, format!("{stream} {} arrived after {}", m.seq, *max));
        }
        *max = (*max).max(m.seq);
        seen.insert(m.seq, *m);
    }
    a.delivered = seen.len() as u64;
    let last_sender_session = sent.iter().map(|m| m.session).max().unwrap_or(0);
    let last_recv_session = recv_starts.iter().map(|(s, _)| *s).max().unwrap_or(0);
    // The next delivered message after each sent one, scanning backwards.
    let mut next: Option<(Msg, Msg)> = None; // (as sent, as received)
    let mut next_after = vec![None; sent.len()];
    for (i, m) in sent.iter().enumerate().rev() {
        next_after[i] = next;
        if let Some(r) = seen.get(&m.seq) {
            next = Some((*m, *r));
        }
    }
    for (i, m) in sent.iter().enumerate() {
        if seen.contains_key(&m.seq) {
            continue;
        }
        let recv_then = session_at(recv_starts, m.t);
        let reset = match next_after[i] {
            Some((ns, nr)) => ns.session != m.session || nr.session != recv_then,
            None => m.session != last_sender_session || recv_then != last_recv_session,
        };
        if reset {
            a.lost_at_reset += 1;
        } else {
            a.lost += 1;
            note(
                &mut a,
                format!(
                    "{stream} {} (sent in session {} at {:.3}) never arrived, and no session ended",
                    m.seq, m.session, m.t
                ),
            );
        }
    }
    a
}

/// What OVS's log says about its controller connection.
#[derive(Debug, Default)]
struct OvsSide {
    /// (session, start) of each connection to the switch agent.
    starts: Vec<(u64, f64)>,
    received: BTreeMap<&'static str, Vec<Msg>>,
    sent: BTreeMap<&'static str, Vec<Msg>>,
    dropped_lines: u64,
}

fn xid_of(text: &str) -> Option<u64> {
    let at = text.find("(xid=0x")? + "(xid=0x".len();
    let end = text[at..].find(')')? + at;
    u64::from_str_radix(&text[at..end], 16).ok()
}

fn field(text: &str, name: &str) -> Option<u64> {
    let key = format!("{name}=");
    let at = text.find(&key)? + key.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// Parses `ovs-vswitchd.log` (with `vconn:file:dbg`): connections to
/// `socket`, and the app's messages on them.
fn parse_ovs_log(text: &str, socket: &str) -> OvsSide {
    let mut side = OvsSide::default();
    // Log entries with their continuation lines (a PACKET_IN's packet).
    let mut entries: Vec<(crate::ovs::LogLine, String)> = Vec::new();
    for line in text.lines() {
        match parse_log_line(line) {
            Some(l) => entries.push((l, String::new())),
            None => {
                if let Some((_, more)) = entries.last_mut() {
                    more.push_str(line);
                    more.push('\n');
                }
            }
        }
    }
    let mut session = 0;
    for (l, more) in &entries {
        let t = l.realtime_ns as f64 / 1e9;
        if l.text.contains("due to excessive rate") {
            // "Dropped 12 log messages in last 5 seconds ... due to excessive rate"
            let n = l
                .text
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok());
            side.dropped_lines += n.unwrap_or(1);
            continue;
        }
        if !l.text.contains(socket) {
            continue;
        }
        if l.module == "rconn" && l.text.ends_with(": connected") {
            session += 1;
            side.starts.push((session, t));
            continue;
        }
        if l.module != "vconn" {
            continue;
        }
        let (received, msg) = if let Some(i) = l.text.find(": received: ") {
            (true, &l.text[i + ": received: ".len()..])
        } else if let Some(i) = l.text.find(": sent (Success): ") {
            (false, &l.text[i + ": sent (Success): ".len()..])
        } else {
            continue;
        };
        let stamped = |seq: u64| Msg { seq, t, session };
        let by_xid = xid_of(msg)
            .filter(|x| *x >= XID_BASE)
            .map(|x| stamped(x - XID_BASE));
        let (stream, m) = if received {
            let stream = if msg.starts_with("OFPT_FLOW_MOD") {
                "flow_mod"
            } else if msg.starts_with("OFPT_ECHO_REQUEST") {
                "echo_request"
            } else if msg.starts_with("OFPST_DESC request") {
                "stats_request"
            } else {
                continue;
            };
            (stream, by_xid)
        } else if msg.starts_with("OFPT_PACKET_IN") {
            let packet = format!("{msg}\n{more}");
            if !packet.contains(&format!("nw_src={HOST_IP}")) || !packet.contains("udp") {
                continue;
            }
            let seq = match (
                field(&packet, "tp_src"),
                field(&packet, "tp_dst"),
                field(&packet, "nw_ttl"),
                field(&packet, "nw_tos"),
            ) {
                (Some(s), Some(d), Some(ttl), Some(tos)) => unstamp(s, d, ttl, tos),
                _ => None,
            };
            ("packet_in", seq.map(stamped))
        } else if msg.starts_with("OFPT_ECHO_REPLY") {
            ("echo_reply", by_xid)
        } else if msg.starts_with("OFPST_DESC reply") {
            ("stats_reply", by_xid)
        } else {
            continue;
        };
        let Some(m) = m else { continue };
        let to = if received {
            &mut side.received
        } else {
            &mut side.sent
        };
        to.entry(stream).or_default().push(m);
    }
    side
}

/// How many flows the host's packets belong to (round robin).
const FLOWS: u64 = 4;
/// Packets of one flow per port pair: TTL 1 to 250 times 64 DSCP values.
const PER_EPOCH: u64 = 250 * 64;

/// The stamp of packet `seq`: (source port, destination port, TTL, DSCP).
/// The ports name its flow (`seq % FLOWS`, and an epoch every `PER_EPOCH`
/// packets of a flow); TTL and DSCP count within the flow, so packets of one
/// flow, which the agents keep in order (OpenFlow 1.3.5 §7.4.1), carry
/// increasing stamps that Open vSwitch's log shows.
fn stamp(seq: u64) -> (u16, u16, u8, u8) {
    let (flow, k) = (seq % FLOWS, seq / FLOWS);
    (
        (1024 + flow) as u16,
        (1024 + k / PER_EPOCH) as u16,
        (1 + k % 250) as u8,
        ((k / 250) % 64) as u8,
    )
}

/// The inverse of [`stamp`], from the fields OVS prints (`nw_tos` is the DSCP
/// shifted left by 2).
fn unstamp(tp_src: u64, tp_dst: u64, ttl: u64, tos: u64) -> Option<u64> {
    if !(1024..1024 + FLOWS).contains(&tp_src) || tp_dst < 1024 || !(1..=250).contains(&ttl) {
        return None;
    }
    let k = (tp_dst - 1024) * PER_EPOCH + (tos >> 2) * 250 + (ttl - 1);
    Some(k * FLOWS + (tp_src - 1024))
}

/// The flow a packet of `seq` belongs to (its port pair).
fn packet_flow(seq: u64) -> u64 {
    let (s, d, _, _) = stamp(seq);
    (u64::from(s) << 16) | u64::from(d)
}

fn set_tos(s: &UdpSocket, tos: u8) -> Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::from(tos);
    // SAFETY: a valid socket and a c_int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_TOS,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        bail!("setting IP_TOS: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends sequence-stamped UDP packets from the host into a table miss until
/// `stop`; returns how many.
fn host_sender(host_ns: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Result<u64>> {
    std::thread::spawn(move || -> Result<u64> {
        in_netns(&host_ns, move || -> Result<u64> {
            let mut seq = 0u64;
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let (sport, dport, ttl, dscp) = stamp(seq);
                let s = UdpSocket::bind((HOST_IP, sport))
                    .with_context(|| format!("binding {HOST_IP}:{sport}"))?;
                s.set_ttl(u32::from(ttl))?;
                set_tos(&s, dscp << 2)?;
                s.send_to(&seq.to_be_bytes(), (MISS_IP, dport))?;
                seq += 1;
                next += PACKET_INTERVAL;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            Ok(seq)
        })?
    })
}

/// The flows the controller believes installed: (priority, nw_dst, cookie).
fn believed_flows(state: &serde_json::Value) -> Result<HashSet<(u32, String, u64)>> {
    let mut flows = HashSet::from([(0, String::new(), MISS_COOKIE)]);
    let slots = state["slots"]
        .as_object()
        .context("the controller's state has no slots")?;
    for (k, cookie) in slots {
        let k: u64 = k.parse().context("slot number")?;
        let cookie = cookie.as_u64().context("slot cookie")?;
        flows.insert((SLOT_PRIORITY, format!("10.9.0.{}", k + 1), cookie));
    }
    Ok(flows)
}

/// Parses `ovs-ofctl dump-flows` into (priority, nw_dst, cookie).
fn switch_flows(dump: &str) -> HashSet<(u32, String, u64)> {
    dump.lines()
        .filter(|l| l.contains("cookie="))
        .map(|l| {
            let cookie = l
                .split("cookie=0x")
                .nth(1)
                .and_then(|s| s.split(|c: char| !c.is_ascii_hexdigit()).next())
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .unwrap_or(0);
            let priority = field(l, "priority").unwrap_or(32768) as u32;
            let nw_dst = l
                .split("nw_dst=")
                .nth(1)
                .map(|s| s.split([',', ' ']).next().unwrap_or("").to_string())
                .unwrap_or_default();
            (priority, nw_dst, cookie)
        })
        .collect()
}

fn set_link(bed: &Testbed, patch: DirPatch) -> Result<()> {
    let rec = bed
        .link()
        .emulator
        .as_ref()
        .context("the control link has no emulator")?;
    rec.control().set_both(patch)?;
    Ok(())
}

/// The running soak: testbed, controller, watch.
struct Soak<'a> {
    args: &'a SoakArgs,
    bed: &'a mut Testbed,
    controller: RunningController,
    controller_spec: ControllerSpec,
    launcher_args: Vec<String>,
    watch: Watch,
    rebinds: u16,
}

impl Soak<'_> {
    /// Injects one fault; its detail, start and end (realtime ns).
    fn inject(&mut self, kind: FaultKind, round: usize) -> Result<(String, u64, u64)> {
        let start = realtime_ns();
        let detail = match kind {
            FaultKind::LossBurst => {
                let pct = if self.args.quick {
                    30
                } else {
                    [10, 20, 30][round % 3]
                };
                let secs = if self.args.quick { 5 } else { 10 };
                set_link(
                    self.bed,
                    DirPatch {
                        loss: Some(LossModel::Bernoulli {
                            p: f64::from(pct) / 100.0,
                        }),
                        ..DirPatch::default()
                    },
                )?;
                std::thread::sleep(Duration::from_secs(secs));
                set_link(
                    self.bed,
                    DirPatch {
                        loss: Some(LossModel::None),
                        ..DirPatch::default()
                    },
                )?;
                format!("{pct} % loss both ways for {secs} s")
            }
            FaultKind::LinkDown => {
                set_link(
                    self.bed,
                    DirPatch {
                        up: Some(false),
                        ..DirPatch::default()
                    },
                )?;
                std::thread::sleep(LINK_DOWN);
                set_link(
                    self.bed,
                    DirPatch {
                        up: Some(true),
                        ..DirPatch::default()
                    },
                )?;
                format!("both directions down for {} s", LINK_DOWN.as_secs())
            }
            FaultKind::KillSwitchAgent | FaultKind::KillControllerAgent => {
                let role = if kind == FaultKind::KillSwitchAgent {
                    AgentRole::Switch
                } else {
                    AgentRole::Controller
                };
                let pid = self.bed.agent_proc(role, 0)?.pid;
                // restart_agent kills with SIGKILL first, then starts it again.
                self.bed.restart_agent(role, 0)?;
                let new = self.bed.agent_proc(role, 0)?.pid;
                format!("SIGKILL to pid {pid}, started again as pid {new}")
            }
            FaultKind::ControllerRestart => {
                let old = self.controller.proc.pid;
                self.controller.stop()?;
                self.controller = start_controller_with(
                    &self.bed.ctl(),
                    &self.controller_spec,
                    &self.launcher_args,
                )?;
                format!(
                    "os-ken stopped (SIGTERM, pid {old}), started again (pid {})",
                    self.controller.proc.pid
                )
            }
            FaultKind::OvsRestart => {
                let old = self.bed.ovs().vswitchd.pid;
                self.bed.restart_vswitchd(&[VCONN_DEBUG])?;
                format!(
                    "ovs-vswitchd stopped (SIGTERM, pid {old}), started again (pid {})",
                    self.bed.ovs().vswitchd.pid
                )
            }
            FaultKind::NatRebind => {
                self.rebinds += 1;
                let port = self.args.nat_port + 20 * (self.rebinds % 5);
                self.bed.nat_rebind_switch(port)?;
                format!("the NAT's mappings are dropped; new ones from port {port}")
            }
            FaultKind::CertReload => self.reload_switch_certificate()?,
        };
        Ok((detail, start, realtime_ns()))
    }
}

impl Soak<'_> {
    /// Replaces the switch agent's certificate and key (a new serial from the
    /// lab's CA, each file renamed over the old one) and sends SIGHUP; done
    /// when the agent logs that new handshakes present the new certificate.
    /// The established connection must carry on: the audit sees any reset.
    fn reload_switch_certificate(&mut self) -> Result<String> {
        use quicsdn_transport::pki;
        let dir = self.bed.dir.join("pki");
        let (cert_file, key_file) = pki::cert_paths(&dir, "sw1");
        let (cert, key) = pki::issue_pem(&dir, "sw1", &[], pki::Validity::days(825))
            .context("issuing the switch's new certificate")?;
        let log = self.bed.switch_agent_log(0);
        let reloads = |text: &str| {
            text.matches("new handshakes present certificate serial")
                .count()
        };
        let before = reloads(&std::fs::read_to_string(&log).unwrap_or_default());
        for (path, pem) in [(&key_file, &key), (&cert_file, &cert)] {
            let tmp = path.with_extension("new");
            std::fs::write(&tmp, pem).with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
        }
        let agent = self.bed.agent_proc(AgentRole::Switch, 0)?;
        let pid = agent.pid;
        agent.hangup();
        let line = crate::wait::poll_until(
            "the switch agent to use its new certificate",
            Duration::from_secs(10),
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if let Some(refused) = text
                    .lines()
                    .find(|l| l.contains("refused the new certificate files"))
                {
                    bail!("the switch agent refused its new certificate: {refused}");
                }
                Ok((reloads(&text) > before).then(|| {
                    text.lines()
                        .rfind(|l| l.contains("new handshakes present certificate serial"))
                        .unwrap_or_default()
                        .to_string()
                }))
            },
        )?;
        let serial = line
            .split("certificate serial ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or("?");
        Ok(format!(
            "new switch certificate and key, SIGHUP to pid {pid}; new handshakes present serial {serial}"
        ))
    }
}

/// Runs the soak, writes the results, and fails if the audit found a
/// violation or a fault was not recovered from.
pub fn run(args: SoakArgs) -> Result<SoakReport> {
    let report = run_soak(&args)?;
    print!("{}", render_tables(&report));
    write_results(&args, &report)?;
    if report.violations() > 0 {
        bail!(
            "the audit found {} violations (see {})",
            report.violations(),
            args.out.join("summary.md").display()
        );
    }
    if report.unrecovered() > 0 {
        bail!("{} faults were not recovered from", report.unrecovered());
    }
    if report.ovs_log_lines_dropped > 0 {
        bail!(
            "OVS's rate limiter dropped {} of its message log lines: the audit is incomplete",
            report.ovs_log_lines_dropped
        );
    }
    Ok(report)
}

/// Copies the testbed's directory (logs and state) to OUT/logs.
fn keep_logs(bed: &Testbed, out: &std::path::Path) {
    let to = out.join("logs");
    let _ = std::fs::remove_dir_all(&to);
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&bed.dir)
        .arg(&to)
        .status();
    if copied.is_ok_and(|s| s.success()) {
        eprintln!("soak: logs kept in {}", to.display());
    }
}

fn run_soak(args: &SoakArgs) -> Result<SoakReport> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut bed = build_testbed(args)?;
    let result = soak_on(args, &mut bed);
    let failed = result
        .as_ref()
        .map_or(true, |r| r.violations() > 0 || r.unrecovered() > 0);
    if failed || args.keep_logs {
        keep_logs(&bed, &args.out);
    }
    result
}

fn build_testbed(args: &SoakArgs) -> Result<Testbed> {
    Testbed::build(
        &TestbedSpec {
            prefix: args.prefix.clone(),
            impairment: Impairment {
                delay: Some(Duration::from_millis(5)),
                ..Impairment::default()
            },
            via: Via::Agents {
                switch_args: vec![],
                controller_args: vec![],
            },
            hosts: 1,
        },
        &Targets {
            count: 1,
            agents: AgentLayout::PerTarget,
            listen: false,
        },
    )
}

/// Runs the soak on a built testbed (left in `bed` for its logs).
fn soak_on(args: &SoakArgs, bed: &mut Testbed) -> Result<SoakReport> {
    bed.ovs().appctl(&["vlog/set", "vconn:file:dbg"])?;
    bed.nat_rebind_switch(args.nat_port)?;
    bed.hosts[0].ip(&[
        "neigh", "replace", MISS_IP, "lladdr", MISS_MAC, "dev", "eth0",
    ])?;

    let repo = default_repo_dir();
    let app_dir = bed.dir.join("soak-controller");
    let controller_spec = ControllerSpec {
        kind: ControllerKind::Osken,
        listen_host: "127.0.0.1".into(),
        port: 6653,
        tls: None,
        work_dir: bed.dir.join("osken"),
        repo_dir: repo.clone(),
        venv_dir: None,
        faucet_yaml: None,
        ready_timeout: Duration::from_secs(60),
    };
    let launcher_args = vec![
        repo.join("controllers/soak.py").display().to_string(),
        format!("--soak-dir={}", app_dir.display()),
    ];
    let controller = start_controller_with(&bed.ctl(), &controller_spec, &launcher_args)?;
    bed.point_ovs()?;
    let mut soak = Soak {
        args,
        bed,
        controller,
        controller_spec,
        launcher_args,
        watch: Watch {
            log: EventLog::new(app_dir.join("events.jsonl")),
            echo_sent: HashMap::new(),
            echoes: Vec::new(),
        },
        rebinds: 0,
    };
    let start_ns = realtime_ns();
    if soak
        .watch
        .wait_echo_after(start_ns, Duration::from_secs(60))?
        .is_none()
    {
        bail!(
            "no echo round trip within 60 s of the start (controller log: {})",
            soak.controller.log.display()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sender = host_sender(soak.bed.hosts[0].name.clone(), stop.clone());

    let (calm, total) = if args.quick {
        (Duration::from_secs(3), Duration::ZERO)
    } else {
        (
            Duration::from_secs(15),
            Duration::from_secs_f64(args.minutes * 60.0),
        )
    };
    let began = Instant::now();
    let mut injections = Vec::new();
    let mut round = 0;
    'schedule: loop {
        for kind in FAULT_KINDS {
            std::thread::sleep(calm);
            let (detail, start, end) = soak.inject(kind, round)?;
            let recovered = soak.watch.wait_echo_after(end, RECOVERY_TIMEOUT)?;
            let inj = Injection {
                kind,
                detail,
                start_ns: start,
                end_ns: end,
                recovered_ns: recovered,
            };
            println!(
                "{:>7.1} s  {:<26} {}; {}",
                (start - start_ns) as f64 / 1e9,
                kind.name(),
                inj.detail,
                inj.recovery_s()
                    .map_or("NOT recovered".to_string(), |r| format!(
                        "recovered in {r:.2} s"
                    ))
            );
            injections.push(inj);
            if recovered.is_none() || (!args.quick && began.elapsed() >= total) {
                break 'schedule;
            }
        }
        round += 1;
        if args.quick {
            break;
        }
    }

    // Stop the workload, let what is in flight arrive, then audit.
    std::fs::write(app_dir.join("stop"), b"")?;
    stop.store(true, Ordering::Relaxed);
    let packets = sender.join().expect("host sender")?;
    std::thread::sleep(Duration::from_secs(4));
    let duration_s = (realtime_ns() - start_ns) as f64 / 1e9;

    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(app_dir.join("state.json"))
            .context("the controller's state.json")?,
    )?;
    let believed = believed_flows(&state)?;
    let actual = switch_flows(&soak.bed.ovs().dump_flows("br0")?);
    let mut flow_table_mismatches: Vec<String> = believed
        .difference(&actual)
        .map(|f| {
            format!(
                "missing at the switch: priority={} nw_dst={} cookie={:#x}",
                f.0, f.1, f.2
            )
        })
        .chain(actual.difference(&believed).map(|f| {
            format!(
                "at the switch, not believed: priority={} nw_dst={} cookie={:#x}",
                f.0, f.1, f.2
            )
        }))
        .collect();
    flow_table_mismatches.sort();

    soak.watch.poll()?;
    let events = &soak.watch.log.events;
    let ctl_starts: Vec<(u64, f64)> = events
        .iter()
        .filter(|e| e.ev == "up")
        .filter_map(|e| Some((e.s?, e.t)))
        .collect();
    let ctl_msgs = |ev: &str, k: &str| -> Vec<Msg> {
        events
            .iter()
            .filter(|e| e.ev == ev && e.k.as_deref() == Some(k))
            .filter_map(|e| {
                Some(Msg {
                    seq: e.seq?,
                    t: e.t,
                    session: e.s?,
                })
            })
            .collect()
    };
    let socket = soak.bed.openflow_socket(0).display().to_string();
    let ovs_log = std::fs::read_to_string(soak.bed.ovs().dir.join("ovs-vswitchd.log"))?;
    let ovs = parse_ovs_log(&ovs_log, &socket);
    let none = Vec::new();
    let mut audits = Vec::new();
    for k in ["flow_mod", "echo_request", "stats_request"] {
        audits.push(audit(
            k,
            "controller → switch",
            &ctl_msgs("tx", k),
            ovs.received.get(k).unwrap_or(&none),
            &ovs.starts,
            |_| 0,
        ));
    }
    for k in ["packet_in", "echo_reply", "stats_reply"] {
        audits.push(audit(
            k,
            "switch → controller",
            ovs.sent.get(k).unwrap_or(&none),
            &ctl_msgs("rx", k),
            &ctl_starts,
            if k == "packet_in" { packet_flow } else { |_| 0 },
        ));
    }
    println!(
        "host sent {packets} packets into the table miss; OVS sent {} PACKET_INs",
        ovs.sent.get("packet_in").map_or(0, Vec::len)
    );
    Ok(SoakReport {
        duration_s,
        injections,
        audits,
        flow_table_mismatches,
        flows_believed: believed.len(),
        ovs_sessions: ovs.starts.len() as u64,
        controller_sessions: ctl_starts.len() as u64,
        ovs_log_lines_dropped: ovs.dropped_lines,
    })
}

pub const INJECTIONS_HEADER: &[&str] = &[
    "n",
    "t_s",
    "kind",
    "detail",
    "fault_s",
    "recovered",
    "recovery_s",
];
pub const AUDIT_HEADER: &[&str] = &[
    "stream",
    "direction",
    "sent",
    "delivered",
    "lost_at_reset",
    "lost",
    "duplicates",
    "reordered",
    "unknown",
    "violations",
];
pub const FAULTS_HEADER: &[&str] = &[
    "kind",
    "injected",
    "recovered",
    "recovery_p50_s",
    "recovery_max_s",
];

fn fault_rows(r: &SoakReport) -> Vec<Vec<String>> {
    FAULT_KINDS
        .iter()
        .map(|k| {
            let of_kind: Vec<&Injection> = r.injections.iter().filter(|i| i.kind == *k).collect();
            let mut times: Vec<f64> = of_kind.iter().filter_map(|i| i.recovery_s()).collect();
            times.sort_by(f64::total_cmp);
            let p = |q: f64| {
                times
                    .get(((times.len() as f64 - 1.0) * q).round() as usize)
                    .map_or("-".to_string(), |t| format!("{t:.2}"))
            };
            vec![
                k.name().to_string(),
                of_kind.len().to_string(),
                times.len().to_string(),
                p(0.5),
                p(1.0),
            ]
        })
        .collect()
}

fn audit_rows(r: &SoakReport) -> Vec<Vec<String>> {
    r.audits
        .iter()
        .map(|a| {
            vec![
                a.stream.to_string(),
                a.direction.to_string(),
                a.sent.to_string(),
                a.delivered.to_string(),
                a.lost_at_reset.to_string(),
                a.lost.to_string(),
                a.duplicates.to_string(),
                a.reordered.to_string(),
                a.unknown.to_string(),
                a.violations().to_string(),
            ]
        })
        .collect()
}

fn injection_rows(r: &SoakReport) -> Vec<Vec<String>> {
    let t0 = r.injections.first().map_or(0, |i| i.start_ns);
    r.injections
        .iter()
        .enumerate()
        .map(|(n, i)| {
            vec![
                (n + 1).to_string(),
                format!("{:.1}", (i.start_ns - t0) as f64 / 1e9),
                i.kind.name().to_string(),
                i.detail.replace(',', ";"),
                format!("{:.1}", (i.end_ns - i.start_ns) as f64 / 1e9),
                i.recovered_ns.is_some().to_string(),
                i.recovery_s().map_or("-".into(), |t| format!("{t:.2}")),
            ]
        })
        .collect()
}

/// The headline and the two tables, as printed.
pub fn render_tables(r: &SoakReport) -> String {
    let mut s = format!(
        "soak: {:.1} min, {} faults injected, {} recovered; {} messages audited, {} violations; flow table {} ({} flows believed); sessions: OVS {}, controller {}\n\n",
        r.duration_s / 60.0,
        r.injections.len(),
        r.injections.len() - r.unrecovered(),
        r.messages_audited(),
        r.violations(),
        if r.flow_table_mismatches.is_empty() {
            "matches the controller"
        } else {
            "DIFFERS from the controller"
        },
        r.flows_believed,
        r.ovs_sessions,
        r.controller_sessions,
    );
    s += &md_table(FAULTS_HEADER, &fault_rows(r));
    s += "\n";
    s += &md_table(AUDIT_HEADER, &audit_rows(r));
    for a in &r.audits {
        for e in &a.examples {
            s += &format!("- violation: {e}\n");
        }
    }
    for m in &r.flow_table_mismatches {
        s += &format!("- flow table: {m}\n");
    }
    s
}

fn write_results(args: &SoakArgs, r: &SoakReport) -> Result<()> {
    let write = |name: &str, header: &'static [&'static str], rows: Vec<Vec<String>>| {
        let mut csv = Csv::new(header);
        for row in rows {
            csv.push(row);
        }
        csv.write(&args.out.join(name))
    };
    write("injections.csv", INJECTIONS_HEADER, injection_rows(r))?;
    write("audit.csv", AUDIT_HEADER, audit_rows(r))?;
    write("faults.csv", FAULTS_HEADER, fault_rows(r))?;
    let md = format!(
        "# Fault soak with a message audit\n\n{}\n\
         Real Open vSwitch 3.1 (userspace datapath, `fail_mode=secure`) and os-ken 4.2.2 \
         (`controllers/soak.py`) through the quicsdn agents (default settings), over the lab's \
         emulated control link (5 ms each way) with a NAT at the switch's end. The controller \
         sends a FLOW_MOD and an ECHO_REQUEST every second and a DESC stats request every \
         two; a host sends a UDP packet into a table miss every 500 ms (a PACKET_IN; four flows round robin, and PACKET_IN order is checked per flow, as the agents promise after OpenFlow 1.3.5 §7.4.1). Each \
         message carries a sequence number. The audit compares what OVS sent and received on \
         its controller connection (its `vconn` debug log) with what the controller sent and \
         received: exactly once and in order, or a session visibly reset (OVS logged a new \
         connection, or the controller saw one) between the message and the next that \
         arrived. Recovery: from the fault's end to the first echo round trip begun after it.\n\n\
         {}\n## Injection log\n\n{}",
        out::provenance(),
        render_tables(r),
        md_table(INJECTIONS_HEADER, &injection_rows(r)),
    );
    std::fs::write(args.out.join("summary.md"), md)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(_: u64) -> u64 {
        0
    }

    fn m(seq: u64, t: f64, session: u64) -> Msg {
        Msg { seq, t, session }
    }

    #[test]
    fn the_audit_excuses_only_losses_at_a_session_reset() {
        let sent = [m(1, 1.0, 1), m(2, 2.0, 1), m(3, 3.0, 1), m(4, 4.0, 2)];
        // 2 and 3 lost, then a new sender session: excused.
        let a = audit(
            "x",
            "d",
            &sent,
            &[m(1, 1.1, 1), m(4, 4.1, 1)],
            &[(1, 0.5)],
            one,
        );
        assert_eq!((a.lost_at_reset, a.violations()), (2, 0), "{a:?}");
        // 2 lost inside one session on both ends: a violation.
        let sent = [m(1, 1.0, 1), m(2, 2.0, 1), m(3, 3.0, 1)];
        let a = audit(
            "x",
            "d",
            &sent,
            &[m(1, 1.1, 1), m(3, 3.1, 1)],
            &[(1, 0.5)],
            one,
        );
        assert_eq!((a.lost, a.lost_at_reset), (1, 0), "{a:?}");
        // The same loss with a receiver reset between: excused.
        let a = audit(
            "x",
            "d",
            &sent,
            &[m(1, 1.1, 1), m(3, 3.1, 2)],
            &[(1, 0.5), (2, 2.5)],
            one,
        );
        assert_eq!((a.lost, a.lost_at_reset), (0, 1), "{a:?}");
        // The tail of the last session lost with no reset: a violation.
        let a = audit("x", "d", &sent, &[m(1, 1.1, 1)], &[(1, 0.5)], one);
        assert_eq!(a.lost, 2, "{a:?}");
        // Duplicates, reorders and strangers.
        let a = audit(
            "x",
            "d",
            &sent,
            &[
                m(1, 1.1, 1),
                m(3, 3.1, 1),
                m(2, 3.2, 1),
                m(3, 3.3, 1),
                m(9, 4.0, 1),
            ],
            &[(1, 0.5)],
            one,
        );
        assert_eq!(
            (a.duplicates, a.reordered, a.unknown, a.lost),
            (1, 1, 1, 0),
            "{a:?}"
        );
        // Order is checked per key only: 2 after 3 is fine if they differ.
        let a = audit(
            "x",
            "d",
            &sent,
            &[m(1, 1.1, 1), m(3, 3.1, 1), m(2, 3.2, 1)],
            &[(1, 0.5)],
            |seq| seq % 2,
        );
        assert_eq!((a.reordered, a.violations()), (0, 0), "{a:?}");
    }

    #[test]
    fn ovs_log_lines_give_sessions_and_messages() {
        let sock = "/run/x/quicsdn-openflow.sock";
        let log = format!(
            "2026-11-25T10:00:00.000Z|1|rconn|INFO|br0<->unix:{sock}: connected\n\
             2026-11-25T10:00:00.100Z|2|vconn|DBG|unix:{sock}: received: OFPT_FLOW_MOD (OF1.3) (xid=0x40000005): ADD priority=100,ip,nw_dst=10.9.0.6 cookie:0x5 actions=drop\n\
             2026-11-25T10:00:00.200Z|3|vconn|DBG|unix:{sock}: sent (Success): OFPT_PACKET_IN (OF1.3) (xid=0x0): table_id=0 cookie=0x3fffffff total_len=50 in_port=1 (via no_match) data_len=50 (unbuffered)\n\
             udp,vlan_tci=0x0000,dl_src=02:51:00:00:00:01,dl_dst=02:51:00:00:00:02,nw_src=10.0.0.1,nw_dst=10.0.0.2,nw_tos=4,nw_ecn=0,nw_ttl=3,nw_frag=no,tp_src=1025,tp_dst=1024 udp_csum:1234\n\
             2026-11-25T10:00:00.300Z|4|vconn|DBG|unix:{sock}: sent (Success): OFPT_ECHO_REPLY (OF1.3) (xid=0x40000007): 8 bytes of payload\n\
             2026-11-25T10:00:00.400Z|5|vconn|DBG|unix:{sock}: received: OFPT_ECHO_REQUEST (OF1.3) (xid=0x3): 0 bytes of payload\n\
             2026-11-25T10:00:00.500Z|6|vconn|DBG|unix:{sock}: sent (Resource temporarily unavailable): OFPT_ECHO_REPLY (OF1.3) (xid=0x40000008)\n\
             2026-11-25T10:00:01.000Z|7|rconn|INFO|br0<->unix:{sock}: connected\n\
             2026-11-25T10:00:01.100Z|8|vconn|DBG|unix:{sock}: received: OFPST_DESC request (OF1.3) (xid=0x40000009):\n"
        );
        let side = parse_ovs_log(&log, sock);
        assert_eq!(side.starts.len(), 2);
        let seqs = |v: Option<&Vec<Msg>>| -> Vec<(u64, u64)> {
            v.map(|v| v.iter().map(|m| (m.seq, m.session)).collect())
                .unwrap_or_default()
        };
        assert_eq!(seqs(side.received.get("flow_mod")), vec![(5, 1)]);
        // Flow 1, TTL 3 and DSCP 1: the 252nd packet of flow 1.
        assert_eq!(seqs(side.sent.get("packet_in")), vec![(252 * 4 + 1, 1)]);
        assert_eq!(seqs(side.sent.get("echo_reply")), vec![(7, 1)]);
        assert_eq!(seqs(side.received.get("echo_request")), vec![]);
        assert_eq!(seqs(side.received.get("stats_request")), vec![(9, 2)]);
        for seq in [0, 1, 5, 999, 252 * 4 + 1, 4 * PER_EPOCH * 3 + 7] {
            let (s, d, ttl, dscp) = stamp(seq);
            let back = unstamp(s.into(), d.into(), ttl.into(), u64::from(dscp) << 2);
            assert_eq!(back, Some(seq));
        }
        assert_eq!(packet_flow(1), packet_flow(5));
        assert_ne!(packet_flow(1), packet_flow(2));
    }

    #[test]
    fn flow_dumps_compare_with_the_belief() {
        let dump = " cookie=0x3fffffff, duration=1.0s, table=0, n_packets=3, n_bytes=1, priority=0 actions=CONTROLLER:65535\n \
                    cookie=0x40, duration=1.0s, table=0, n_packets=0, n_bytes=0, priority=100,ip,nw_dst=10.9.0.1 actions=drop\n";
        let state = serde_json::json!({"slots": {"0": 64}});
        assert_eq!(switch_flows(dump), believed_flows(&state).unwrap());
    }
}
