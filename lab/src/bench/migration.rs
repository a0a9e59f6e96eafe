//! `quicsdn-lab bench migration`: the quicSDN preprint's Fig. 6 (connection
//! migration during a file transfer), scaled to one machine, over `tcp` and
//! `quic` in the same run.
//!
//! One switch (real Open vSwitch, userspace datapath) with two hosts; a
//! benchmark controller program (the lab's [`Controller`]) installs the two
//! flows between the hosts' ports and polls flow statistics every second,
//! while host 1 sends a paced TCP stream to host 2. Mid-transfer the switch's
//! control link goes down, the switch namespace's control interface is
//! re-addressed (its old address removed), and the link comes back within
//! OVS's inactivity probe (5 s). Over `quic` the agents' connection migrates;
//! over `tcp` OVS's connection has lost its source address, so OVS must notice
//! (its probe) and reconnect from the new one.
//!
//! Recorded per transport (`timeline.csv`): data-plane bytes received by host
//! 2 per 100 ms; control-link frame bytes per 100 ms (the emulator's counters,
//! both directions); every stats request and reply at the controller, with
//! the flow's byte count; the controller's connection events; OVS's `rconn`
//! log lines; the link events. `summary.csv` and `summary.md` derive the
//! stall, the time back to normal, the extra control bytes and what the
//! controller saw; `migration.png` draws the timelines.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use quicsdn_wire::openflow::HEADER_LEN;
use quicsdn_wire::openflow::build::{self, Action, FlowMod, Oxm, msg_type};

use crate::bench::out::{self, Csv, md_table};
use crate::control_link::{Impairment, parse_duration, parse_rate};
use crate::emulator::control::DirPatch;
use crate::emulator::sys::{in_netns, realtime_ns};
use crate::openflow_peer::{Controller, Received};
use crate::testbed::{Testbed, TestbedSpec, Via};

#[derive(clap::Args, Debug, Clone)]
pub struct MigrationArgs {
    /// Where timeline.csv, summary.csv, summary.md and migration.png go.
    #[arg(long, default_value = "bench-results/migration")]
    pub out: PathBuf,
    /// A short run (cut at 3.5 s, 1 s outage, 10 s) instead of the full one
    /// (cut at 10.5 s, 2 s outage, 40 s).
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated: tcp, quic.
    #[arg(long, default_value = "tcp,quic")]
    pub transports: String,
    /// One-way delay of the control link, each direction.
    #[arg(long, default_value = "5ms", value_parser = parse_duration)]
    pub delay: Duration,
    /// Rate of the host-to-host transfer.
    #[arg(long, default_value = "20mbit", value_parser = parse_rate)]
    pub data_rate: u64,
    /// Name prefix of the namespaces.
    #[arg(long, default_value = "qsdnmig")]
    pub prefix: String,
    /// Skip the PNG.
    #[arg(long)]
    pub no_plots: bool,
    /// What changes during the outage: `readdress` (the switch namespace's
    /// control interface gets a new address), `nat` (a NAT in front of the
    /// switch rebinds: its traffic leaves from new ports, and what comes back
    /// to the old ones is dropped) or `rebind` (the switch agent moves to a new
    /// UDP port itself; quic only: OVS's TCP connection has no such knob).
    #[arg(long, value_enum, default_value_t = Change::Readdress)]
    pub change: Change,
}

/// What changes during the outage (`--change`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Change {
    Readdress,
    Nat,
    Rebind,
}

impl Change {
    /// The name `--change` takes, also the CSV's `change` column.
    fn name(self) -> &'static str {
        match self {
            Change::Readdress => "readdress",
            Change::Nat => "nat",
            Change::Rebind => "rebind",
        }
    }

    fn describe(self) -> String {
        match self {
            Change::Readdress => format!(
                "the switch namespace's control interface is re-addressed (10.254.1.2 → {NEW_ADDR})"
            ),
            Change::Nat => format!(
                "a NAT in front of the switch rebinds (its UDP and TCP leave from port {NAT_PORT} up; packets to the old ports are dropped)"
            ),
            Change::Rebind => "the switch agent moves to a new UDP port (`quicsdn control … rebind`, what a NAT rebinding does to the source port)".into(),
        }
    }
}

/// The switch agent's control socket.
fn control_socket(prefix: &str) -> PathBuf {
    PathBuf::from(format!("/run/quicsdn-lab/{prefix}-switch-agent.ctl"))
}

/// Asks the switch agent to move to a new local port; its new address.
fn rebind(socket: &Path) -> Result<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("the switch agent's control socket {}", socket.display()))?;
    writeln!(s, r#"{{"cmd":"rebind"}}"#)?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(&line).context("the agent's answer")?;
    if v["ok"] != true {
        bail!("the switch agent refused to rebind: {line}");
    }
    v["local_addr"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no local_addr in the agent's answer: {line}"))
}

pub const TIMELINE_HEADER: &[&str] = &["transport", "t_s", "series", "value", "detail"];

pub const SUMMARY_HEADER: &[&str] = &[
    "transport",
    "change",
    "cut_s",
    "outage_s",
    "polls",
    "replies",
    "unanswered_polls",
    "longest_reply_gap_s",
    "no_replies_after_cut_s",
    "back_to_normal_s",
    "ovs_connects_after_cut",
    "ovs_disconnects_after_cut",
    "controller_connections",
    "controller_disconnects_seen",
    "old_connections_left_open",
    "flows_pushed",
    "control_bytes_per_s_before",
    "control_bytes_after_cut",
    "extra_control_bytes",
    "extra_control_frames",
    "data_mbit_before",
    "data_mbit_after_cut",
    "data_mbit_5s_after_cut",
    "data_min_mbit_before",
    "data_min_mbit_after_cut",
    "data_bytes",
];

const TIMEOUT: Duration = Duration::from_secs(60);
const BIN: Duration = Duration::from_millis(100);
const DATA_PORT: u16 = 5001;
/// The switch side's address after the move (beside the link's 10.254.1.0/30).
const NEW_ADDR: Ipv4Addr = Ipv4Addr::new(10, 254, 1, 6);
/// The first port the NAT of `--change nat` hands out after the rebind.
const NAT_PORT: u16 = 40001;
/// Cookie of the host 1 → host 2 flow, whose statistics are polled.
const FLOW_COOKIE: u64 = 0x51;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tcp,
    Quic,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Quic => "quic",
        }
    }
}

fn parse_transports(s: &str) -> Result<Vec<Transport>> {
    s.split(',')
        .map(|t| match t.trim() {
            "tcp" => Ok(Transport::Tcp),
            "quic" => Ok(Transport::Quic),
            other => bail!("unknown transport {other:?} for bench migration (tcp, quic)"),
        })
        .collect()
}

/// The run's schedule (seconds from the start of polling).
#[derive(Debug, Clone, Copy)]
struct Plan {
    cut: f64,
    outage: f64,
    /// At least this long.
    duration: f64,
    /// And this long after the first stats reply that follows the outage.
    tail: f64,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                cut: 3.5,
                outage: 1.0,
                duration: 10.0,
                tail: 3.0,
            }
        } else {
            Plan {
                cut: 10.5,
                outage: 2.0,
                duration: 40.0,
                tail: 10.0,
            }
        }
    }
}

/// One row of the timeline.
#[derive(Debug, Clone)]
struct Event {
    t: f64,
    series: &'static str,
    value: f64,
    detail: String,
}

/// What one transport's run recorded.
struct Trace {
    transport: Transport,
    events: Vec<Event>,
    /// Data bytes received per 100 ms bin.
    data_bins: Vec<u64>,
    /// Cumulative control-link (t, frames, bytes), both directions.
    link_samples: Vec<(f64, u64, u64)>,
    /// Stats polls: (sent at, xid, answered at, flow byte count).
    polls: Vec<Poll>,
    controller_connections: usize,
    controller_disconnects: usize,
    old_left_open: usize,
    flows_pushed: usize,
    ovs: Vec<(f64, String)>,
    controller_row: String,
    agent_notes: String,
}

#[derive(Debug, Clone)]
struct Poll {
    sent: f64,
    xid: u32,
    reply: Option<(f64, u64)>,
}

/// Keeps only characters a plain CSV cell may hold.
fn cell(s: &str) -> String {
    s.replace([',', '"', '\n', '\r'], " ")
}

/// The flow's byte count in an OFPMP_FLOW reply, if the reply lists it.
fn flow_bytes(reply: &[u8], cookie: u64) -> Option<u64> {
    // ofp_multipart_reply: header, type, flags, pad; then ofp_flow_stats entries:
    // cookie at 24, packet_count at 32, byte_count at 40.
    let mut at = HEADER_LEN + 8;
    while at + 48 <= reply.len() {
        let len = u16::from_be_bytes([reply[at], reply[at + 1]]) as usize;
        if len < 48 || at + len > reply.len() {
            return None;
        }
        let e = &reply[at..at + len];
        if u64::from_be_bytes(e[24..32].try_into().ok()?) == cookie {
            return Some(u64::from_be_bytes(e[40..48].try_into().ok()?));
        }
        at += len;
    }
    None
}

/// Installs the flows between the hosts' ports (1 ↔ 2) and waits for OVS to
/// have processed them.
fn push_flows(c: &mut Controller, xid: u32) -> Result<()> {
    for (cookie, from, to) in [(FLOW_COOKIE, 1, 2), (FLOW_COOKIE + 1, 2, 1)] {
        let mut f = FlowMod::add(100, vec![Oxm::InPort(from)], vec![Action::Output(to)]);
        f.cookie = cookie;
        c.send(&build::flow_mod(xid, &f))?;
    }
    c.barrier(xid + 1, TIMEOUT)
}

/// The host-to-host transfer: a paced TCP sender in host 1, a receiver in host
/// 2 counting bytes per 100 ms.
struct Transfer {
    /// Stops the sender, which then closes its side.
    stop: Arc<AtomicBool>,
    /// Stops the receiver, once the sender has stopped: a receiver that
    /// closed first would make the sender's last write fail (EPIPE).
    stop_receiving: Arc<AtomicBool>,
    bins: Arc<Mutex<Vec<u64>>>,
    sender: std::thread::JoinHandle<Result<u64>>,
    receiver: std::thread::JoinHandle<Result<u64>>,
}

impl Transfer {
    fn start(src: &str, dst: &str, rate_bps: u64, start: Instant) -> Result<Transfer> {
        let listener = in_netns(dst, || TcpListener::bind(("10.0.0.2", DATA_PORT)))?
            .context("listening in host 2")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_receiving = Arc::new(AtomicBool::new(false));
        let bins = Arc::new(Mutex::new(Vec::<u64>::new()));
        let receiver = {
            let (stop, bins) = (stop_receiving.clone(), bins.clone());
            std::thread::spawn(move || -> Result<u64> {
                let mut s = crate::bench::synth::accept_one(&listener, Duration::from_secs(20))?;
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                let (mut buf, mut total) = (vec![0u8; 1 << 16], 0u64);
                while !stop.load(Ordering::Relaxed) {
                    use std::io::Read;
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            total += n as u64;
                            let bin = (start.elapsed().as_nanos() / BIN.as_nanos()) as usize;
                            let mut b = bins.lock().expect("bins");
                            if b.len() <= bin {
                                b.resize(bin + 1, 0);
                            }
                            b[bin] += n as u64;
                        }
                        Err(e) if crate::wait::timed_out(&e) => {}
                        Err(e) => return Err(e).context("receiving the transfer"),
                    }
                }
                Ok(total)
            })
        };
        let sender = {
            let (stop, src) = (stop.clone(), src.to_string());
            std::thread::spawn(move || -> Result<u64> {
                in_netns(&src, move || -> Result<u64> {
                    use std::io::Write;
                    let mut s = TcpStream::connect_timeout(
                        &(Ipv4Addr::new(10, 0, 0, 2), DATA_PORT).into(),
                        Duration::from_secs(10),
                    )
                    .context("connecting host 1 to host 2")?;
                    s.set_write_timeout(Some(Duration::from_millis(500)))?;
                    // 10 ms chunks at the rate.
                    let chunk = vec![0x5au8; (rate_bps / 8 / 100).max(1) as usize];
                    let begin = Instant::now();
                    let mut sent = 0u64;
                    let mut i = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        let due = begin + Duration::from_millis(10) * i;
                        if let Some(w) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(w);
                        }
                        match s.write(&chunk) {
                            Ok(n) => sent += n as u64,
                            Err(e) if crate::wait::timed_out(&e) => {}
                            Err(e) => return Err(e).context("sending the transfer"),
                        }
                        i += 1;
                    }
                    let _ = s.shutdown(std::net::Shutdown::Write);
                    Ok(sent)
                })?
            })
        };
        Ok(Transfer {
            stop,
            stop_receiving,
            bins,
            sender,
            receiver,
        })
    }

    fn finish(self) -> Result<(Vec<u64>, u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self
            .sender
            .join()
            .map_err(|_| anyhow!("the sender panicked"));
        self.stop_receiving.store(true, Ordering::Relaxed);
        let sent = sent??;
        let received = self
            .receiver
            .join()
            .map_err(|_| anyhow!("the receiver panicked"))??;
        let bins = self.bins.lock().expect("bins").clone();
        Ok((bins, sent, received))
    }
}

fn link_totals(bed: &Testbed) -> Result<(u64, u64)> {
    let s = bed.link().state()?;
    let (a, b) = (
        s.a_to_b.counters.total().offered,
        s.b_to_a.counters.total().offered,
    );
    Ok((a.frames + b.frames, a.bytes + b.bytes))
}

fn set_link(bed: &Testbed, up: bool) -> Result<()> {
    let rec = bed
        .link()
        .emulator
        .as_ref()
        .context("the control link has no emulator")?;
    rec.control().set_both(DirPatch {
        up: Some(up),
        ..DirPatch::default()
    })?;
    Ok(())
}

fn run_one(t: Transport, args: &MigrationArgs, plan: Plan) -> Result<Trace> {
    let via = match t {
        Transport::Tcp => Via::Tcp,
        Transport::Quic => Via::Agents {
            switch_args: vec![format!(
                "--control={}",
                control_socket(&args.prefix).display()
            )],
            controller_args: vec![],
        },
    };
    let bed = Testbed::up(&TestbedSpec {
        prefix: args.prefix.clone(),
        impairment: Impairment {
            delay: Some(args.delay),
            ..Impairment::default()
        },
        via,
        hosts: 2,
    })?;
    let mut c = bed.accept_controller(TIMEOUT)?;
    let dpid = c.datapath_id;
    let mut flows_pushed = 1;
    push_flows(&mut c, 10)?;
    let (h1, h2) = (bed.hosts[0].name.clone(), bed.hosts[1].name.clone());
    let start = Instant::now();
    let start_rt = realtime_ns();
    let now = || start.elapsed().as_secs_f64();
    let transfer = Transfer::start(&h1, &h2, args.data_rate, start)?;
    let mut events = vec![Event {
        t: 0.0,
        series: "controller",
        value: 1.0,
        detail: format!("connected (datapath {dpid:#x}); flows pushed"),
    }];
    let stop = AtomicBool::new(false);
    let (tx, rx) = channel::<(f64, Controller)>();
    let samples = Mutex::new(Vec::new());
    let mut polls: Vec<Poll> = Vec::new();
    let (mut connections, mut disconnects) = (1usize, 0usize);
    let mut old: Vec<Controller> = Vec::new();
    let mut run_end = 0.0;
    let result = std::thread::scope(|s| -> Result<()> {
        // New connections from the switch (OVS reconnecting), handshaken.
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(c) = bed.accept_controller(Duration::from_millis(500)) {
                    let _ = tx.send((now(), c));
                }
            }
        });
        // The control link's counters every 100 ms.
        s.spawn(|| {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Ok((f, b)) = link_totals(&bed) {
                    samples.lock().expect("samples").push((now(), f, b));
                }
                next += BIN;
                if let Some(w) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(w);
                }
            }
        });
        let r = (|| -> Result<()> {
            let mut cur = Some(c);
            // When the current connection began: its polls can still be answered.
            let mut cur_since = 0.0;
            let (mut cut, mut restored) = (false, false);
            let mut next_poll = 1.0;
            let mut xid = 1000u32;
            // The first reply to a poll sent after the link came back.
            let recovered = |polls: &[Poll]| {
                polls
                    .iter()
                    .filter(|p| p.sent > plan.cut + plan.outage)
                    .find_map(|p| p.reply.map(|r| r.0))
            };
            loop {
                let t = now();
                let end = match recovered(&polls) {
                    Some(at) => plan.duration.max(at + plan.tail),
                    None => plan.cut + plan.outage + 60.0,
                };
                if t >= end {
                    break;
                }
                if !cut && t >= plan.cut {
                    set_link(&bed, false)?;
                    events.push(Event {
                        t: now(),
                        series: "link",
                        value: 0.0,
                        detail: "down".into(),
                    });
                    let detail = match args.change {
                        Change::Readdress => {
                            bed.readdress_switch(NEW_ADDR)?;
                            format!("switch re-addressed to {NEW_ADDR}")
                        }
                        Change::Nat => {
                            bed.nat_rebind_switch(NAT_PORT)?;
                            format!("NAT in front of the switch rebound (ports from {NAT_PORT})")
                        }
                        Change::Rebind => format!(
                            "switch agent rebound to {}",
                            cell(&rebind(&control_socket(&args.prefix))?)
                        ),
                    };
                    events.push(Event {
                        t: now(),
                        series: "link",
                        value: 0.0,
                        detail,
                    });
                    cut = true;
                }
                if cut && !restored && t >= plan.cut + plan.outage {
                    set_link(&bed, true)?;
                    events.push(Event {
                        t: now(),
                        series: "link",
                        value: 1.0,
                        detail: "up".into(),
                    });
                    restored = true;
                }
                if t >= next_poll {
                    next_poll += 1.0;
                    match cur.as_mut() {
                        Some(conn) => {
                            xid += 1;
                            conn.send(&build::flow_stats_request(xid))?;
                            polls.push(Poll {
                                sent: now(),
                                xid,
                                reply: None,
                            });
                            events.push(Event {
                                t: now(),
                                series: "stats_request",
                                value: xid as f64,
                                detail: String::new(),
                            });
                        }
                        None => events.push(Event {
                            t,
                            series: "stats_request",
                            value: 0.0,
                            detail: "skipped: no connection".into(),
                        }),
                    }
                }
                while let Ok((at, mut conn)) = rx.try_recv() {
                    connections += 1;
                    let replaced = cur.take();
                    let note = if replaced.is_some() {
                        "; the previous connection had not closed"
                    } else {
                        ""
                    };
                    events.push(Event {
                        t: at,
                        series: "controller",
                        value: 1.0,
                        detail: format!(
                            "new connection (datapath {:#x}){note}; flows pushed",
                            conn.datapath_id
                        ),
                    });
                    old.extend(replaced);
                    xid += 10;
                    push_flows(&mut conn, xid)?;
                    flows_pushed += 1;
                    cur = Some(conn);
                    cur_since = at;
                }
                let wait = [next_poll, plan.cut, plan.cut + plan.outage, now() + 0.05]
                    .into_iter()
                    .filter(|&x| x > now())
                    .fold(f64::INFINITY, f64::min);
                let deadline = start + Duration::from_secs_f64(wait);
                let Some(conn) = cur.as_mut() else {
                    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                    continue;
                };
                match conn.recv_by(deadline) {
                    Ok(Some(m)) => handle(conn, &m, &mut polls, &mut events, now())?,
                    Ok(None) => {}
                    Err(e) => {
                        disconnects += 1;
                        events.push(Event {
                            t: now(),
                            series: "controller",
                            value: 0.0,
                            detail: cell(&format!("disconnected: {e:#}")),
                        });
                        cur = None;
                    }
                }
            }
            // The replies to the last polls, which the end of the run may have
            // overtaken (a poll on a dead connection stays unanswered).
            let deadline = Instant::now() + Duration::from_secs(2);
            while let Some(conn) = cur.as_mut() {
                if !polls
                    .iter()
                    .any(|p| p.sent >= cur_since && p.reply.is_none())
                {
                    break;
                }
                match conn.recv_by(deadline)? {
                    Some(m) => handle(conn, &m, &mut polls, &mut events, now())?,
                    None => break,
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        run_end = now();
        r
    });
    let (data_bins, sent, received) = transfer.finish()?;
    result?;
    if received == 0 {
        bail!("{}: host 2 received nothing (sent {sent} bytes)", t.name());
    }
    // Replaced connections: did any of them ever see the switch close it?
    let mut old_left_open = 0;
    for mut o in old {
        match o.recv_by(Instant::now() + Duration::from_millis(20)) {
            Err(_) => disconnects += 1,
            Ok(_) => old_left_open += 1,
        }
    }
    let ovs: Vec<(f64, String)> = bed
        .ovs()
        .log_lines()?
        .into_iter()
        .filter(|l| l.module == "rconn" && l.realtime_ns >= start_rt)
        .map(|l| ((l.realtime_ns - start_rt) as f64 / 1e9, l.text))
        // Not what the end of the run itself caused.
        .filter(|(t, _)| *t <= run_end)
        .collect();
    for (at, text) in &ovs {
        events.push(Event {
            t: *at,
            series: "ovs",
            value: 0.0,
            detail: cell(text),
        });
    }
    let controller_row = bed
        .ovs()
        .vsctl(&["--columns=is_connected,status", "list", "controller"])?
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let agent_notes = match t {
        Transport::Tcp => String::new(),
        Transport::Quic => {
            let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
            let sw = read(bed.switch_agent_log(0));
            let ctl = read(bed.controller_agent_log(0));
            format!(
                "switch agent: {} connection(s) to the controller agent; controller agent: {} switch connection(s)",
                sw.matches("connected to the controller agent").count(),
                ctl.matches("switch agent connected").count()
            )
        }
    };
    events.sort_by(|a, b| a.t.total_cmp(&b.t));
    let link_samples = samples.into_inner().expect("samples");
    Ok(Trace {
        transport: t,
        events,
        data_bins,
        link_samples,
        polls,
        controller_connections: connections,
        controller_disconnects: disconnects,
        old_left_open,
        flows_pushed,
        ovs,
        controller_row,
        agent_notes,
    })
}

fn handle(
    conn: &mut Controller,
    m: &Received,
    polls: &mut [Poll],
    events: &mut Vec<Event>,
    t: f64,
) -> Result<()> {
    match m.header.msg_type {
        msg_type::ECHO_REQUEST => {
            conn.send(&build::echo_reply(m.header.xid, &m.bytes[HEADER_LEN..]))?;
        }
        msg_type::MULTIPART_REPLY => {
            let bytes = flow_bytes(&m.bytes, FLOW_COOKIE);
            if let Some(p) = polls
                .iter_mut()
                .find(|p| p.xid == m.header.xid && p.reply.is_none())
            {
                p.reply = Some((t, bytes.unwrap_or(0)));
                events.push(Event {
                    t,
                    series: "stats_reply",
                    value: bytes.unwrap_or(0) as f64,
                    detail: format!("xid {} after {:.0} ms", p.xid, (t - p.sent) * 1e3),
                });
            }
        }
        _ => {}
    }
    Ok(())
}

/// The numbers of one transport's run, in [`SUMMARY_HEADER`]'s order.
fn summarize(tr: &Trace, plan: Plan, change: Change) -> Vec<String> {
    let cut = tr
        .events
        .iter()
        .find(|e| e.series == "link" && e.detail == "down")
        .map_or(plan.cut, |e| e.t);
    let up = tr
        .events
        .iter()
        .find(|e| e.series == "link" && e.detail == "up")
        .map_or(cut + plan.outage, |e| e.t);
    let replies: Vec<(f64, f64)> = {
        let mut v: Vec<(f64, f64)> = tr
            .polls
            .iter()
            .filter_map(|p| p.reply.map(|r| (r.0, r.0 - p.sent)))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let gap = replies
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .fold(0.0, f64::max);
    let after_cut = replies.iter().find(|r| r.0 > cut).map(|r| r.0 - cut);
    // Normal: a poll sent after the link came back, answered within twice the
    // median latency before the cut (plus 20 ms).
    let mut before: Vec<f64> = replies.iter().filter(|r| r.0 < cut).map(|r| r.1).collect();
    before.sort_by(f64::total_cmp);
    let normal = before.get(before.len() / 2).copied().unwrap_or(0.0) * 2.0 + 0.02;
    let back = tr.polls.iter().filter(|p| p.sent >= up).find_map(|p| {
        p.reply
            .filter(|r| r.0 - p.sent <= normal)
            .map(|r| r.0 - cut)
    });
    let ovs_after = |needle: &str| {
        tr.ovs
            .iter()
            .filter(|(t, text)| *t > cut && text.contains(needle))
            .count()
    };
    // Control bytes: the rate before the cut (from the first poll), and what the
    // rest of the run carried beyond that rate.
    let at = |t: f64| {
        tr.link_samples
            .iter()
            .rev()
            .find(|s| s.0 <= t)
            .or(tr.link_samples.first())
            .copied()
            .unwrap_or((0.0, 0, 0))
    };
    let (t0, f0, b0) = at(0.9);
    let (t1, f1, b1) = at(cut);
    let (t2, f2, b2) = tr.link_samples.last().copied().unwrap_or((0.0, 0, 0));
    let span = (t1 - t0).max(1e-9);
    let (fr, br) = ((f1 - f0) as f64 / span, (b1 - b0) as f64 / span);
    let extra_b = (b2 - b1) as f64 - br * (t2 - t1);
    let extra_f = (f2 - f1) as f64 - fr * (t2 - t1);
    let mbit = |bytes: u64| bytes as f64 * 8.0 / BIN.as_secs_f64() / 1e6;
    let first = (1.0 / BIN.as_secs_f64()) as usize;
    let cut_bin = (cut / BIN.as_secs_f64()) as usize;
    let before_bins = tr.data_bins.get(first..cut_bin).unwrap_or_default();
    let data_before =
        before_bins.iter().map(|&b| mbit(b)).sum::<f64>() / before_bins.len().max(1) as f64;
    // Up to the last full bin.
    let after_bins = tr
        .data_bins
        .get(cut_bin..tr.data_bins.len().saturating_sub(1))
        .unwrap_or_default();
    let data_min = after_bins
        .iter()
        .map(|&b| mbit(b))
        .fold(f64::INFINITY, f64::min);
    let data_after =
        after_bins.iter().map(|&b| mbit(b)).sum::<f64>() / after_bins.len().max(1) as f64;
    let five = &after_bins[..after_bins.len().min(50)];
    let data_5s = five.iter().map(|&b| mbit(b)).sum::<f64>() / five.len().max(1) as f64;
    let min_before = before_bins
        .iter()
        .map(|&b| mbit(b))
        .fold(f64::INFINITY, f64::min);
    let f = |x: f64| format!("{x:.3}");
    let opt = |x: Option<f64>| x.map_or("-".to_string(), f);
    vec![
        tr.transport.name().into(),
        change.name().into(),
        f(cut),
        f(up - cut),
        tr.polls.len().to_string(),
        replies.len().to_string(),
        (tr.polls.len() - replies.len()).to_string(),
        f(gap),
        opt(after_cut),
        opt(back),
        ovs_after(": connected").to_string(),
        (ovs_after("connection dropped") + ovs_after("disconnecting")).to_string(),
        tr.controller_connections.to_string(),
        tr.controller_disconnects.to_string(),
        tr.old_left_open.to_string(),
        tr.flows_pushed.to_string(),
        format!("{br:.0}"),
        (b2 - b1).to_string(),
        format!("{extra_b:.0}"),
        format!("{extra_f:.0}"),
        format!("{data_before:.2}"),
        format!("{data_after:.2}"),
        format!("{data_5s:.2}"),
        if min_before.is_finite() {
            format!("{min_before:.2}")
        } else {
            "-".into()
        },
        if data_min.is_finite() {
            format!("{data_min:.2}")
        } else {
            "-".into()
        },
        tr.data_bins.iter().sum::<u64>().to_string(),
    ]
}

fn timeline_rows(tr: &Trace, csv: &mut Csv) {
    let name = tr.transport.name();
    // The last bin is cut short by the end of the run.
    let full = &tr.data_bins[..tr.data_bins.len().saturating_sub(1)];
    for (i, b) in full.iter().enumerate() {
        csv.push(vec![
            name.into(),
            format!("{:.1}", i as f64 * BIN.as_secs_f64()),
            "data_bytes".into(),
            b.to_string(),
            String::new(),
        ]);
    }
    for w in tr.link_samples.windows(2) {
        csv.push(vec![
            name.into(),
            format!("{:.3}", w[1].0),
            "control_bytes".into(),
            (w[1].2 - w[0].2).to_string(),
            format!("{} frames", w[1].1 - w[0].1),
        ]);
    }
    for e in &tr.events {
        csv.push(vec![
            name.into(),
            format!("{:.3}", e.t),
            e.series.into(),
            format!("{}", e.value),
            cell(&e.detail),
        ]);
    }
}

pub fn run(args: MigrationArgs) -> Result<()> {
    crate::cmd::require_root()?;
    let transports = parse_transports(&args.transports)?;
    if args.change == Change::Rebind && transports.contains(&Transport::Tcp) {
        bail!(
            "--change rebind is for quic only: OVS's TCP connection cannot change its port; use --transports quic (or --change nat for a NAT rebinding, which breaks tcp)"
        );
    }
    let plan = Plan::new(args.quick);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let started = Instant::now();
    let mut traces = Vec::new();
    for t in transports {
        println!(
            "migration over {}: cut at {} s, re-address, link back after {} s",
            t.name(),
            plan.cut,
            plan.outage
        );
        traces
            .push(run_one(t, &args, plan).with_context(|| format!("migration over {}", t.name()))?);
    }
    let mut timeline = Csv::new(TIMELINE_HEADER);
    let mut summary = Csv::new(SUMMARY_HEADER);
    for tr in &traces {
        timeline_rows(tr, &mut timeline);
        summary.push(summarize(tr, plan, args.change));
    }
    timeline.write(&args.out.join("timeline.csv"))?;
    summary.write(&args.out.join("summary.csv"))?;
    let plots = if args.no_plots {
        Vec::new()
    } else {
        out::plot("migration", &args.out)?
    };
    let md = markdown(&traces, &summary, &args, plan, started.elapsed(), &plots);
    std::fs::write(args.out.join("summary.md"), &md)?;
    println!("{md}");
    println!("wrote {}", args.out.display());
    Ok(())
}

fn markdown(
    traces: &[Trace],
    summary: &Csv,
    args: &MigrationArgs,
    plan: Plan,
    took: Duration,
    plots: &[PathBuf],
) -> String {
    let get = |row: &[String], col: &str| row[summary.col(col)].clone();
    let mut s = format!(
        "# Connection migration during a transfer (preprint Fig. 6){}\n\n",
        match args.change {
            Change::Nat => ": a NAT rebinds",
            Change::Rebind => ": the switch agent rebinds",
            Change::Readdress => "",
        }
    );
    s += &format!(
        "Generated by `quicsdn-lab bench migration` in {:.0} s. One switch (Open vSwitch 3.1, userspace datapath), two hosts, a benchmark controller that installs the flows between the hosts' ports and polls flow statistics every second; host 1 sends a paced TCP stream ({:.0} Mbit/s) to host 2. Control link: {:?} one-way delay. At {} s the control link goes down and {}; {} s later the link comes back, within OVS's 5 s inactivity probe. Method and definitions: [docs/benchmarks.md](../../benchmarks.md#bench-migration).\n\n",
        took.as_secs_f64(),
        args.data_rate as f64 / 1e6,
        args.delay,
        plan.cut,
        args.change.describe(),
        plan.outage
    );
    s += &out::provenance();
    s.push('\n');
    let rows: Vec<Vec<String>> = summary
        .rows
        .iter()
        .map(|r| {
            vec![
                get(r, "transport"),
                format!("{} / {}", get(r, "replies"), get(r, "polls")),
                get(r, "longest_reply_gap_s"),
                get(r, "no_replies_after_cut_s"),
                get(r, "back_to_normal_s"),
                get(r, "ovs_connects_after_cut"),
                format!(
                    "{} connection(s), {} close(s) seen, {} replaced while still open",
                    get(r, "controller_connections"),
                    get(r, "controller_disconnects_seen"),
                    get(r, "old_connections_left_open")
                ),
                get(r, "flows_pushed"),
                format!(
                    "{} B ({} frames); {} B in all after the cut, {} B/s before",
                    get(r, "extra_control_bytes"),
                    get(r, "extra_control_frames"),
                    get(r, "control_bytes_after_cut"),
                    get(r, "control_bytes_per_s_before")
                ),
                format!(
                    "{} → {} ({} in the 5 s after it); lowest 100 ms {} → {}",
                    get(r, "data_mbit_before"),
                    get(r, "data_mbit_after_cut"),
                    get(r, "data_mbit_5s_after_cut"),
                    get(r, "data_min_mbit_before"),
                    get(r, "data_min_mbit_after_cut")
                ),
            ]
        })
        .collect();
    s += &md_table(
        &[
            "transport",
            "stats replies / polls",
            "longest gap between replies (s)",
            "cut → first reply (s)",
            "cut → back to normal (s)",
            "OVS reconnects",
            "controller saw",
            "flow pushes",
            "extra control bytes",
            "data Mbit/s, mean before → after the cut",
        ],
        &rows,
    );
    s += "\nExtra control bytes: Ethernet frame bytes (both directions) the control link carried from the cut to the end of the run beyond the rate before the cut (from the first poll); negative when the link carried less (it was down). *Back to normal*: the first poll sent after the link came back that was answered within twice the median latency before the cut (+20 ms). The lowest 100 ms of the transfer, before and after the cut, show the scheduling stalls of this shared 2-core machine (the benches run at nice 19), which happen away from the event too.\n\n";
    for tr in traces {
        s += &format!("## {}\n\n", tr.transport.name());
        s += "OVS (`rconn` in ovs-vswitchd.log; s from the start of polling):\n\n";
        for (t, text) in &tr.ovs {
            s += &format!("- {t:.3} s: {text}\n");
        }
        if tr.ovs.is_empty() {
            s += "- nothing logged during the run\n";
        }
        s += "\nThe controller:\n\n";
        for e in tr
            .events
            .iter()
            .filter(|e| e.series == "controller" || e.series == "link")
        {
            s += &format!("- {:.3} s: {} {}\n", e.t, e.series, e.detail);
        }
        s += &format!(
            "\nOVS's Controller row at the end: `{}`\n",
            tr.controller_row
        );
        if !tr.agent_notes.is_empty() {
            s += &format!("\nAgents: {}.\n", tr.agent_notes);
        }
        s.push('\n');
    }
    for p in plots {
        if let Some(n) = p.file_name() {
            s += &format!("![{0}]({0})\n", n.to_string_lossy());
        }
    }
    s
}

/// Reads `summary.csv` of a run, checking its schema.
pub fn read_summary(dir: &Path) -> Result<Csv> {
    Csv::read(&dir.join("summary.csv"), SUMMARY_HEADER)
}

/// Reads `timeline.csv` of a run, checking its schema.
pub fn read_timeline(dir: &Path) -> Result<Csv> {
    Csv::read(&dir.join("timeline.csv"), TIMELINE_HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_bytes_finds_the_cookie() {
        let mut m = vec![0u8; HEADER_LEN + 8];
        for (cookie, bytes) in [(7u64, 1u64), (FLOW_COOKIE, 123_456)] {
            let mut e = vec![0u8; 56];
            e[0..2].copy_from_slice(&56u16.to_be_bytes());
            e[24..32].copy_from_slice(&cookie.to_be_bytes());
            e[40..48].copy_from_slice(&bytes.to_be_bytes());
            m.extend(e);
        }
        assert_eq!(flow_bytes(&m, FLOW_COOKIE), Some(123_456));
        assert_eq!(flow_bytes(&m, 99), None);
        m[HEADER_LEN + 8] = 0; // a zero length is malformed
        m[HEADER_LEN + 9] = 0;
        assert_eq!(flow_bytes(&m, FLOW_COOKIE), None);
        assert!(parse_transports("tcp,quic").is_ok());
        assert!(parse_transports("tls").is_err());
    }
}
