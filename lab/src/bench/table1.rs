//! `quicsdn-lab bench table1`: the preprint's Table I with real Open vSwitch.
//!
//! For each transport a one-switch lab comes up (`--controller none --ovsdb`, no
//! impairment) and a benchmark controller program in the controller namespace,
//! speaking OpenFlow 1.3 and OVSDB (RFC 7047) itself, runs three experiments while
//! the control link counts every frame:
//!
//! * **flow installation**: FLOW_MOD ADDs (one `ipv4_dst` per flow, output LOCAL)
//!   paced at 10, 1k, 10k and 100k flows/s, then a BARRIER; OVS's flow count is
//!   checked afterwards;
//! * **queue configuration**: one OVSDB `transact` per queue (insert a Queue row and
//!   add it to a QoS row's `queues`, the paper's steps i–ii) with a `monitor` on
//!   Queue, so the server sends an `update` for each (step iii), paced at 100, 10k
//!   and 100k queues/s with at most 512 outstanding; every reply is checked;
//! * **statistics polling**: with 100, 10k or 100k flows installed (unmeasured),
//!   one OFPMP_FLOW request per second, each complete reply checked to list every flow.
//!
//! Reported: bytes/s on the control link (both directions, wire = IP + 28 B/frame)
//! over the experiment's duration, and the rate reached (work done ÷ time until the
//! switch confirmed it). Where OVS or this machine cannot reach the target rate,
//! the reached rate says so.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use quicsdn_wire::openflow;
use serde_json::{Value, json};

use crate::bench::cell::paper_accounting;
use crate::bench::out::{self, Csv, md_table};
use crate::bench::pair::{BenchTransport, parse_transports};
use crate::bench::synth::{self, Reader, TlsSide, Writer};
use crate::controller::ControllerKind;
use crate::emulator::sys;
use crate::state::LabState;
use crate::topology::{self, BRIDGE, LabConfig, OvsdbAddress};
use crate::transport::Transport;

pub const HEADER: &[&str] = &[
    "experiment",
    "level",
    "transport",
    "target_rate",
    "count",
    "seconds",
    "reached_rate",
    "frames",
    "wire_bytes",
    "bytes_per_s",
    "paper_tcp_bytes_per_s",
    "paper_quic_bytes_per_s",
];

/// The preprint's Table I: (experiment, level, tcpSDN bytes/s, quicSDN bytes/s).
pub const PAPER: [(&str, &str, f64, f64); 10] = [
    ("flow installation", "10", 38978.0, 29217.0),
    ("flow installation", "1000", 391896.0, 282063.0),
    ("flow installation", "10000", 1441000.0, 949000.0),
    ("flow installation", "100000", 6631000.0, 3313000.0),
    ("queue configuration", "100", 50283.0, 15472.0),
    ("queue configuration", "10000", 1901804.0, 1245871.0),
    ("queue configuration", "100000", 1119843000.0, 570093000.0),
    ("statistics polling", "100", 20070.0, 13953.0),
    ("statistics polling", "10000", 2527814.0, 1644596.0),
    ("statistics polling", "100000", 1701342468.0, 825151097.0),
];

#[derive(clap::Args, Debug, Clone)]
pub struct Table1Args {
    /// Where the CSV, PNG and markdown go.
    #[arg(long, default_value = "bench-results/table1")]
    pub out: PathBuf,
    /// CI size: the lowest two levels of each experiment, few operations.
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated: tcp,tls,quic,quic-rr16,quic-tuned,quic-old,kcptun,udp-seed,udp-robust (`quic-old`: the defaults before issue 13, for comparisons in one run).
    #[arg(
        long,
        default_value = "tcp,tls,quic,quic-rr16,quic-tuned,kcptun,udp-seed,udp-robust"
    )]
    pub transports: String,
    /// Lab prefix of the bench's labs (at most 12 characters).
    #[arg(long, default_value = "qsdnbench")]
    pub prefix: String,
    /// Extra option for both quicsdn agents of the QUIC transports
    /// (repeatable), e.g. `--agent-arg=--coalesce=off`.
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Skip the PNG plot.
    #[arg(long)]
    pub no_plots: bool,
}

/// (experiment, level, operations) of a run.
fn plan(quick: bool) -> Vec<(&'static str, u64, u64)> {
    if quick {
        vec![
            ("flow installation", 10, 10),
            ("flow installation", 1000, 300),
            ("queue configuration", 100, 30),
            ("queue configuration", 10000, 300),
            ("statistics polling", 100, 2),
            ("statistics polling", 10000, 2),
        ]
    } else {
        vec![
            ("flow installation", 10, 30),
            ("flow installation", 1000, 3000),
            ("flow installation", 10000, 20000),
            ("flow installation", 100000, 100000),
            ("queue configuration", 100, 300),
            ("queue configuration", 10000, 10000),
            ("queue configuration", 100000, 20000),
            ("statistics polling", 100, 5),
            ("statistics polling", 10000, 5),
            ("statistics polling", 100000, 3),
        ]
    }
}

// ---- OpenFlow 1.3 messages ----

const OFPT_HELLO: u8 = 0;
const OFPT_ERROR: u8 = 1;
pub(crate) const OFPT_ECHO_REQUEST: u8 = 2;
const OFPT_ECHO_REPLY: u8 = 3;
const OFPT_FEATURES_REQUEST: u8 = 5;
const OFPT_FEATURES_REPLY: u8 = 6;
const OFPT_FLOW_MOD: u8 = 14;
const OFPT_MULTIPART_REQUEST: u8 = 18;
pub(crate) const OFPT_MULTIPART_REPLY: u8 = 19;
pub(crate) const OFPT_BARRIER_REQUEST: u8 = 20;
pub(crate) const OFPT_BARRIER_REPLY: u8 = 21;

pub(crate) fn header(t: u8, len: usize, xid: u32) -> Vec<u8> {
    let mut m = openflow::Header {
        version: openflow::OFP13_VERSION,
        msg_type: t,
        length: len as u16,
        xid,
    }
    .encode()
    .to_vec();
    m.reserve(len - 8);
    m
}

/// FLOW_MOD ADD: table 0, priority 100, match `eth_type=0x0800, ipv4_dst=10.x.y.z`
/// (unique per `i`), apply-actions output:LOCAL. 96 bytes.
pub fn flow_mod_add(i: u32, xid: u32) -> Vec<u8> {
    let mut m = header(OFPT_FLOW_MOD, 96, xid);
    m.extend_from_slice(&(i as u64).to_be_bytes()); // cookie
    m.extend_from_slice(&0u64.to_be_bytes()); // cookie mask
    m.extend_from_slice(&[0, 0]); // table 0, OFPFC_ADD
    m.extend_from_slice(&0u16.to_be_bytes()); // idle timeout
    m.extend_from_slice(&0u16.to_be_bytes()); // hard timeout
    m.extend_from_slice(&100u16.to_be_bytes()); // priority
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes()); // buffer id: none
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes()); // out port: any
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes()); // out group: any
    m.extend_from_slice(&[0, 0, 0, 0]); // flags, pad
    // ofp_match: OXM, length 4 + 6 + 8 = 18, padded to 24.
    m.extend_from_slice(&[0, 1, 0, 18]);
    m.extend_from_slice(&[0x80, 0x00, 0x0a, 0x02, 0x08, 0x00]); // eth_type
    m.extend_from_slice(&[0x80, 0x00, 0x18, 0x04]); // ipv4_dst
    m.extend_from_slice(&(0x0a00_0000u32 | (i & 0x00ff_ffff)).to_be_bytes());
    m.extend_from_slice(&[0; 6]);
    // OFPIT_APPLY_ACTIONS with one OUTPUT:LOCAL.
    m.extend_from_slice(&[0, 4, 0, 24, 0, 0, 0, 0]);
    m.extend_from_slice(&[0, 0, 0, 16]);
    m.extend_from_slice(&0xffff_fffeu32.to_be_bytes());
    m.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    debug_assert_eq!(m.len(), 96);
    m
}

/// FLOW_MOD DELETE of every flow in every table.
pub fn flow_mod_delete_all(xid: u32) -> Vec<u8> {
    let mut m = header(OFPT_FLOW_MOD, 56, xid);
    m.extend_from_slice(&[0; 16]);
    m.extend_from_slice(&[0xff, 3]); // all tables, OFPFC_DELETE
    m.extend_from_slice(&[0; 6]);
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes());
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes());
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes());
    m.extend_from_slice(&[0, 0, 0, 0]);
    m.extend_from_slice(&[0, 1, 0, 4, 0, 0, 0, 0]); // empty match
    m
}

/// OFPMP_FLOW request for every flow of every table.
pub fn flow_stats_request(xid: u32) -> Vec<u8> {
    let mut m = header(OFPT_MULTIPART_REQUEST, 56, xid);
    m.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // OFPMP_FLOW, flags, pad
    m.extend_from_slice(&[0xff, 0, 0, 0]); // all tables
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes());
    m.extend_from_slice(&0xffff_ffffu32.to_be_bytes());
    m.extend_from_slice(&[0; 4]);
    m.extend_from_slice(&[0; 16]); // cookie, mask
    m.extend_from_slice(&[0, 1, 0, 4, 0, 0, 0, 0]);
    m
}

/// What the OpenFlow reader reports.
#[derive(Debug)]
pub(crate) enum OfEvent {
    /// An ECHO_REPLY: its xid.
    Echo(u32),
    Features,
    Barrier(u32),
    /// A flow-stats reply part: xid, entries, more to come.
    FlowStats(u32, u64, bool),
    Error(String),
    Closed(String),
}

/// Entries of an OFPMP_FLOW reply body (after the 8-byte multipart header).
fn flow_stats_entries(body: &[u8]) -> Result<u64> {
    let (mut at, mut n) = (0usize, 0u64);
    while at + 2 <= body.len() {
        let len = u16::from_be_bytes([body[at], body[at + 1]]) as usize;
        if len < 56 || at + len > body.len() {
            bail!("malformed flow stats entry");
        }
        at += len;
        n += 1;
    }
    Ok(n)
}

pub(crate) struct OfConn {
    pub(crate) wr: Arc<Mutex<Writer>>,
    pub(crate) events: Receiver<OfEvent>,
    xid: u32,
}

impl OfConn {
    fn start(rd: Reader, wr: Writer) -> OfConn {
        let wr = Arc::new(Mutex::new(wr));
        let (tx, rx) = channel();
        let w2 = wr.clone();
        std::thread::spawn(move || of_reader(rd, w2, tx));
        OfConn {
            wr,
            events: rx,
            xid: 1,
        }
    }

    pub(crate) fn send(&mut self, m: &[u8]) -> Result<()> {
        self.wr.lock().expect("writer").send(m)?;
        Ok(())
    }

    pub(crate) fn next_xid(&mut self) -> u32 {
        self.xid += 1;
        self.xid
    }

    pub(crate) fn event(&self, timeout: Duration) -> Result<OfEvent> {
        match self.events.recv_timeout(timeout) {
            Ok(OfEvent::Error(e)) => bail!("OpenFlow error from the switch: {e}"),
            Ok(OfEvent::Closed(e)) => bail!("the OpenFlow connection closed: {e}"),
            Ok(e) => Ok(e),
            Err(_) => bail!("no answer from the switch within {timeout:?}"),
        }
    }

    /// HELLO, then (once OVS reports the connection up, i.e. it has our HELLO:
    /// under `rr:N` a request sent right behind it could overtake it) FEATURES.
    /// Fails early if this connection ends first (OVS had already left it).
    pub(crate) fn handshake_within(&mut self, ovs: &crate::ovs::Ovs, t: Duration) -> Result<()> {
        self.send(&header(OFPT_HELLO, 8, 1))?;
        crate::wait::poll_until(
            &format!("{BRIDGE} in {} to connect to its controller", ovs.netns),
            t,
            || {
                match self.events.try_recv() {
                    Ok(OfEvent::Closed(e)) => {
                        bail!("the connection ended before OVS connected: {e}")
                    }
                    Ok(OfEvent::Error(e)) => bail!("OpenFlow error from the switch: {e}"),
                    _ => {}
                }
                Ok(ovs.is_connected(BRIDGE)?.then_some(()))
            },
        )?;
        let x = self.next_xid();
        self.send(&header(OFPT_FEATURES_REQUEST, 8, x))?;
        loop {
            if let OfEvent::Features = self.event(Duration::from_secs(20))? {
                return Ok(());
            }
        }
    }

    fn barrier(&mut self, timeout: Duration) -> Result<()> {
        let x = self.next_xid();
        self.send(&header(OFPT_BARRIER_REQUEST, 8, x))?;
        loop {
            if let OfEvent::Barrier(b) = self.event(timeout)?
                && b == x
            {
                return Ok(());
            }
        }
    }

    /// One complete flow-stats poll: the number of flows listed. The reply's parts
    /// are counted until the last one (no REPLY_MORE) has arrived and `expect` flows
    /// are listed; under `rr:N` parts may overtake the last one, so a last part
    /// short of `expect` waits up to 2 s for stragglers.
    fn poll_flows(&mut self, expect: u64, timeout: Duration) -> Result<u64> {
        let x = self.next_xid();
        self.send(&flow_stats_request(x))?;
        let (mut n, mut last) = (0, false);
        loop {
            let wait = if last {
                Duration::from_secs(2)
            } else {
                timeout
            };
            match self.events.recv_timeout(wait) {
                Ok(OfEvent::FlowStats(r, k, more)) if r == x => {
                    n += k;
                    last |= !more;
                    if last && n >= expect {
                        return Ok(n);
                    }
                }
                Ok(OfEvent::Error(e)) => bail!("OpenFlow error from the switch: {e}"),
                Ok(OfEvent::Closed(e)) => bail!("the OpenFlow connection closed: {e}"),
                Ok(_) => {}
                Err(_) if last => return Ok(n),
                Err(_) => bail!("no flow statistics within {timeout:?}"),
            }
        }
    }
}

fn of_reader(mut rd: Reader, wr: Arc<Mutex<Writer>>, tx: Sender<OfEvent>) {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let result = (|| -> Result<()> {
        loop {
            if rd.read_into(&mut buf)? == 0 {
                bail!("end of stream");
            }
            let mut at = 0;
            while let Some(h) = openflow::Header::parse(&buf[at..]) {
                let len = usize::from(h.length);
                if len < 8 {
                    bail!("malformed OpenFlow header {h:?}");
                }
                if buf.len() - at < len {
                    break;
                }
                let msg = &buf[at..at + len];
                let ev = match h.msg_type {
                    OFPT_ECHO_REQUEST => {
                        let mut r = msg.to_vec();
                        r[1] = OFPT_ECHO_REPLY;
                        wr.lock().expect("writer").send(&r)?;
                        None
                    }
                    OFPT_FEATURES_REPLY => Some(OfEvent::Features),
                    OFPT_ECHO_REPLY => Some(OfEvent::Echo(h.xid)),
                    OFPT_BARRIER_REPLY => Some(OfEvent::Barrier(h.xid)),
                    OFPT_MULTIPART_REPLY if len >= 16 && msg[8..10] == [0, 1] => {
                        let more = msg[11] & 1 == 1;
                        Some(OfEvent::FlowStats(
                            h.xid,
                            flow_stats_entries(&msg[16..])?,
                            more,
                        ))
                    }
                    OFPT_ERROR => Some(OfEvent::Error(format!(
                        "type/code {:02x?} for xid {}",
                        &msg[8..msg.len().min(12)],
                        h.xid
                    ))),
                    _ => None,
                };
                if let Some(ev) = ev
                    && tx.send(ev).is_err()
                {
                    return Ok(());
                }
                at += len;
            }
            buf.drain(..at);
        }
    })();
    if let Err(e) = result {
        let _ = tx.send(OfEvent::Closed(format!("{e:#}")));
    }
}

// ---- OVSDB (JSON-RPC) ----

enum DbEvent {
    Reply(u64, Value),
    Update,
    Closed(String),
}

pub(crate) struct DbConn {
    wr: Arc<Mutex<Writer>>,
    events: Receiver<DbEvent>,
    id: u64,
}

impl DbConn {
    fn start(rd: Reader, wr: Writer) -> DbConn {
        let wr = Arc::new(Mutex::new(wr));
        let (tx, rx) = channel();
        let w2 = wr.clone();
        std::thread::spawn(move || db_reader(rd, w2, tx));
        DbConn {
            wr,
            events: rx,
            id: 0,
        }
    }

    fn send(&mut self, method: &str, params: Value) -> Result<u64> {
        self.id += 1;
        let m = json!({"method": method, "params": params, "id": self.id});
        self.wr
            .lock()
            .expect("writer")
            .send(m.to_string().as_bytes())?;
        Ok(self.id)
    }

    fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.send(method, params)?;
        loop {
            match self.events.recv_timeout(Duration::from_secs(30)) {
                Ok(DbEvent::Reply(i, v)) if i == id => {
                    if !v["error"].is_null() {
                        bail!("OVSDB {method}: {}", v["error"]);
                    }
                    return Ok(v["result"].clone());
                }
                Ok(DbEvent::Closed(e)) => bail!("the OVSDB connection closed: {e}"),
                Ok(_) => {}
                Err(_) => bail!("no answer to OVSDB {method}"),
            }
        }
    }
}

fn db_reader(mut rd: Reader, wr: Arc<Mutex<Writer>>, tx: Sender<DbEvent>) {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut framer = quicsdn_wire::Framer::new(quicsdn_wire::Framing::JsonRpc, 1 << 30);
    let result = (|| -> Result<()> {
        loop {
            if rd.read_into(&mut buf)? == 0 {
                bail!("end of stream");
            }
            let mut at = 0;
            while let Some(len) = framer.next_message(&buf[at..])? {
                let v: Value = serde_json::from_slice(&buf[at..at + len])?;
                at += len;
                let ev = match v["method"].as_str() {
                    Some("echo") => {
                        let r = json!({"result": v["params"], "error": null, "id": v["id"]});
                        wr.lock().expect("writer").send(r.to_string().as_bytes())?;
                        None
                    }
                    Some("update") => Some(DbEvent::Update),
                    Some(_) => None,
                    None => v["id"].as_u64().map(|i| DbEvent::Reply(i, v)),
                };
                if let Some(ev) = ev
                    && tx.send(ev).is_err()
                {
                    return Ok(());
                }
            }
            buf.drain(..at);
        }
    })();
    if let Err(e) = result {
        let _ = tx.send(DbEvent::Closed(format!("{e:#}")));
    }
}

// ---- the experiments ----

/// A one-switch lab for transport `t`; `agent_args` go to both agents of the
/// QUIC transports (after the variant's own, e.g. `quic-tuned`'s, so they win).
pub(crate) fn lab_config(prefix: &str, t: BenchTransport, agent_args: &[String]) -> LabConfig {
    let mut cfg = LabConfig::new(prefix);
    let s = &mut cfg.settings;
    s.switches = 1;
    s.hosts_per_switch = 0;
    s.controller = ControllerKind::None;
    s.ovsdb = true;
    s.transport = t.lab_transport();
    s.streams = t.streams().map(str::to_string);
    if t.is_quic() {
        s.agent_args = t.setting_args().iter().map(|a| a.to_string()).collect();
        s.agent_args.extend(agent_args.iter().cloned());
    }
    cfg
}

/// The benchmark controller's TLS server side and a client side, with the
/// lab's controller certificate.
pub(crate) fn tls_sides(state: &LabState) -> Result<(TlsSide, TlsSide)> {
    let dir = state.pki_dir.clone().context("no PKI")?;
    let creds = quicsdn_transport::tls::Credentials::load(&quicsdn_transport::tls::TlsFiles {
        ca: dir.join("ca.crt"),
        cert: dir.join("controller.crt"),
        key: dir.join("controller.key"),
    })?;
    Ok((
        TlsSide {
            server: Some(Arc::new(creds.server_config()?)),
            client: None,
        },
        TlsSide {
            server: None,
            client: Some((Arc::new(creds.client_config()?), "sw1".into())),
        },
    ))
}

/// Opens the benchmark controller's OpenFlow and OVSDB connections (in the
/// controller namespace) to switch 1.
pub(crate) fn connect(state: &LabState) -> Result<(OfConn, DbConn)> {
    let ovs = state.switches[0].ovs.clone().context("no OVS")?;
    let tls = if state.settings.transport == Transport::Tls {
        Some(tls_sides(state)?)
    } else {
        None
    };
    let listen_ip = match state.settings.transport {
        Transport::Tcp | Transport::Tls => "0.0.0.0",
        _ => "127.0.0.1",
    };
    let port = state.settings.openflow_port;
    let db_addr = topology::ovsdb_address(state, 1)?;
    let ctl_ns = state.ctl_netns.clone();
    let (srv, cli) = (
        tls.as_ref().map(|t| t.0.clone()),
        tls.as_ref().map(|t| t.1.clone()),
    );
    let (tx, rx) = channel::<Result<(Reader, Writer)>>();
    let target = state.switches[0].target.clone().context("no target")?;
    // OVS backs off while nothing listens: take its controller away before
    // listening (so no half-made connection is accepted), give it back after.
    ovs.vsctl(&["del-controller", BRIDGE])?;
    let listening = Arc::new(std::sync::Barrier::new(2));
    let l2 = listening.clone();
    // Every connection that carries data goes to the handshake below, in order:
    // a tunnel may still deliver a connection OVS made before its controller was
    // taken away, with OVS's HELLO and then its end, so the first is not always
    // the one OVS keeps.
    std::thread::spawn(move || {
        let r = (|| -> Result<()> {
            sys::enter_netns(&ctl_ns)?;
            let l = TcpListener::bind((listen_ip, port))?;
            l2.wait();
            loop {
                let s = synth::accept_one(&l, Duration::from_secs(30))?;
                s.set_read_timeout(Some(Duration::from_secs(10)))?;
                let alive = srv.is_some() || s.peek(&mut [0u8; 1]).map(|n| n > 0).unwrap_or(false);
                s.set_read_timeout(None)?;
                if alive && tx.send(synth::split(s, srv.as_ref())).is_err() {
                    return Ok(());
                }
            }
        })();
        if let Err(e) = r {
            let _ = tx.send(Err(e));
        }
    });
    listening.wait();
    ovs.set_controller(BRIDGE, &[target])?;
    let db = {
        let ctl_ns = state.ctl_netns.clone();
        std::thread::spawn(move || -> Result<(Reader, Writer)> {
            sys::enter_netns(&ctl_ns)?;
            Ok(match &db_addr {
                OvsdbAddress::Tcp(a) => {
                    synth::split(synth::connect(*a, Duration::from_secs(20))?, None)?
                }
                OvsdbAddress::Tls(a) => {
                    synth::split(synth::connect(*a, Duration::from_secs(20))?, cli.as_ref())?
                }
                OvsdbAddress::Unix(p) => {
                    let s = crate::wait::poll_until(
                        "the controller agent's OVSDB socket",
                        Duration::from_secs(20),
                        || Ok(std::os::unix::net::UnixStream::connect(p).ok()),
                    )?;
                    (Reader::Unix(s.try_clone()?), Writer::Unix(s))
                }
            })
        })
    };
    let mut last = None;
    let mut of = None;
    for _ in 0..8 {
        let (ofr, ofw) = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(r) => r?,
            Err(_) => break,
        };
        let mut c = OfConn::start(ofr, ofw);
        match c.handshake_within(&ovs, Duration::from_secs(20)) {
            Ok(()) => {
                of = Some(c);
                break;
            }
            // A connection OVS had already left: the next one is OVS's.
            Err(e) => last = Some(e),
        }
    }
    let of = match (of, last) {
        (Some(of), _) => of,
        (None, Some(e)) => return Err(e),
        (None, None) => bail!("the benchmark controller could not connect"),
    };
    let (dbr, dbw) = db
        .join()
        .map_err(|_| anyhow!("the OVSDB connection thread panicked"))??;
    let db = DbConn::start(dbr, dbw);
    Ok((of, db))
}

/// Paces `count` operations at `rate`/s, calling `op(i)` for each.
fn paced(count: u64, rate: f64, mut op: impl FnMut(u64) -> Result<()>) -> Result<()> {
    let start = Instant::now();
    for i in 0..count {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        op(i)?;
    }
    Ok(())
}

fn ovs_flow_count(state: &LabState) -> Result<u64> {
    let ovs = state.switches[0].ovs.as_ref().context("no OVS")?;
    let out = ovs.ofctl(&[
        "-O",
        "OpenFlow13",
        "dump-aggregate",
        &ovs.bridge_target(BRIDGE),
    ])?;
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("flow_count="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("unexpected dump-aggregate output {out:?}"))
}

/// Installs `n` flows as fast as the switch takes them (with a barrier).
fn install(of: &mut OfConn, n: u64, base: u32) -> Result<()> {
    for i in 0..n {
        let x = of.next_xid();
        of.send(&flow_mod_add(base + i as u32, x))?;
    }
    of.barrier(Duration::from_secs(300))
}

fn clear_flows(state: &LabState, of: &mut OfConn) -> Result<()> {
    let x = of.next_xid();
    of.send(&flow_mod_delete_all(x))?;
    of.barrier(Duration::from_secs(120))?;
    crate::wait::poll_until("the flow table to empty", Duration::from_secs(60), || {
        Ok((ovs_flow_count(state)? == 0).then_some(()))
    })
}

/// The QoS row the queues go into, and the next queue number.
struct Queues {
    qos: String,
    next: u64,
}

struct Measured {
    count: u64,
    seconds: f64,
    frames: u64,
    wire: u64,
}

fn reset(state: &LabState) -> Result<()> {
    state.control_links[0]
        .emulator
        .as_ref()
        .context("no emulator")?
        .control()
        .reset_counters()?;
    Ok(())
}

fn counters(state: &LabState) -> Result<(u64, u64)> {
    let r = state.control_links[0].state()?.report(&paper_accounting());
    Ok((
        r.a_to_b.total.offered.frames + r.b_to_a.total.offered.frames,
        r.a_to_b.total.offered.wire_bytes + r.b_to_a.total.offered.wire_bytes,
    ))
}

fn run_experiment(
    state: &LabState,
    of: &mut OfConn,
    db: &mut DbConn,
    exp: &str,
    level: u64,
    count: u64,
    queues: &mut Queues,
) -> Result<Measured> {
    match exp {
        "flow installation" => {
            clear_flows(state, of)?;
            reset(state)?;
            let t0 = Instant::now();
            paced(count, level as f64, |i| {
                let x = of.next_xid();
                of.send(&flow_mod_add(i as u32, x))
            })?;
            of.barrier(Duration::from_secs(300))?;
            // Under rr:16 the barrier may overtake FLOW_MODs: also wait for the table.
            crate::wait::poll_until(
                "every flow to be installed",
                Duration::from_secs(120),
                || Ok((ovs_flow_count(state)? >= count).then_some(())),
            )?;
            let seconds = t0.elapsed().as_secs_f64();
            let (frames, wire) = counters(state)?;
            let installed = ovs_flow_count(state)?;
            if installed != count {
                bail!("{count} flows sent, {installed} installed");
            }
            Ok(Measured {
                count,
                seconds,
                frames,
                wire,
            })
        }
        "queue configuration" => {
            reset(state)?;
            let t0 = Instant::now();
            let mut outstanding: HashMap<u64, ()> = HashMap::new();
            let mut done = 0u64;
            let mut updates = 0u64;
            let mut drain =
                |db: &mut DbConn, outstanding: &mut HashMap<u64, ()>, block: bool| -> Result<()> {
                    loop {
                        let ev = if block {
                            db.events
                                .recv_timeout(Duration::from_secs(60))
                                .map_err(|_| anyhow!("OVSDB stopped answering"))?
                        } else {
                            match db.events.try_recv() {
                                Ok(e) => e,
                                Err(_) => return Ok(()),
                            }
                        };
                        match ev {
                            DbEvent::Reply(id, v) => {
                                if outstanding.remove(&id).is_some() {
                                    let errs = v["result"]
                                        .as_array()
                                        .map(|a| a.iter().any(|r| !r["error"].is_null()))
                                        .unwrap_or(true);
                                    if !v["error"].is_null() || errs {
                                        bail!("queue transaction failed: {v}");
                                    }
                                    done += 1;
                                }
                            }
                            DbEvent::Update => updates += 1,
                            DbEvent::Closed(e) => bail!("OVSDB connection closed: {e}"),
                        }
                        if block {
                            return Ok(());
                        }
                    }
                };
            paced(count, level as f64, |_| {
                while outstanding.len() >= 512 {
                    drain(db, &mut outstanding, true)?;
                }
                let q = queues.next;
                queues.next += 1;
                let id = db.send(
                    "transact",
                    json!(["Open_vSwitch",
                        {"op": "insert", "table": "Queue", "uuid-name": "nq",
                         "row": {"other_config": ["map", [["max-rate", "1000000"]]]}},
                        {"op": "mutate", "table": "QoS", "where": [["_uuid", "==", ["uuid", queues.qos]]],
                         "mutations": [["queues", "insert", ["map", [[q, ["named-uuid", "nq"]]]]]]}]),
                )?;
                outstanding.insert(id, ());
                drain(db, &mut outstanding, false)
            })?;
            while !outstanding.is_empty() {
                drain(db, &mut outstanding, true)?;
            }
            let seconds = t0.elapsed().as_secs_f64();
            let (frames, wire) = counters(state)?;
            if done != count {
                bail!("{count} queue transactions sent, {done} confirmed");
            }
            let _ = updates;
            Ok(Measured {
                count,
                seconds,
                frames,
                wire,
            })
        }
        "statistics polling" => {
            clear_flows(state, of)?;
            install(of, level, 0)?;
            crate::wait::poll_until(
                "the flows to be installed",
                Duration::from_secs(300),
                || Ok((ovs_flow_count(state)? >= level).then_some(())),
            )?;
            reset(state)?;
            let t0 = Instant::now();
            for p in 0..count {
                let due = t0 + Duration::from_secs(p);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let n = of.poll_flows(level, Duration::from_secs(120))?;
                if n != level {
                    bail!("flow statistics listed {n} flows, {level} are installed");
                }
            }
            // One polling period per poll.
            let seconds = (count as f64).max(t0.elapsed().as_secs_f64());
            let (frames, wire) = counters(state)?;
            Ok(Measured {
                count,
                seconds,
                frames,
                wire,
            })
        }
        other => bail!("unknown experiment {other}"),
    }
}

pub fn run(args: Table1Args) -> Result<()> {
    let transports = parse_transports(&args.transports)?;
    std::fs::create_dir_all(&args.out)?;
    let mut csv = Csv::new(HEADER);
    let started = Instant::now();
    for &t in &transports {
        let cfg = lab_config(&args.prefix, t, &args.agent_args);
        let _ = topology::down(&cfg.run_dir, &cfg.prefix);
        println!("== {t}: bringing up a one-switch lab");
        let state = topology::up(&cfg)?.state;
        let r = run_transport(&state, &args, t, &mut csv);
        topology::down(&cfg.run_dir, &cfg.prefix)?;
        r?;
    }
    csv.write(&args.out.join("table1.csv"))?;
    let plots = if args.no_plots {
        Vec::new()
    } else {
        out::plot("table1", &args.out)?
    };
    std::fs::write(
        args.out.join("table1.md"),
        summary(&csv, started.elapsed(), &plots, &args.agent_args),
    )?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn run_transport(
    state: &LabState,
    args: &Table1Args,
    t: BenchTransport,
    csv: &mut Csv,
) -> Result<()> {
    let (mut of, mut db) = connect(state)?;
    // A QoS row for the queues, referenced by the bridge's port (unreferenced QoS
    // rows are garbage-collected); `linux-noop` leaves the kernel alone.
    let r = db.call(
        "transact",
        json!(["Open_vSwitch",
            {"op": "insert", "table": "QoS", "uuid-name": "q", "row": {"type": "linux-noop"}},
            {"op": "update", "table": "Port", "where": [["name", "==", BRIDGE]],
             "row": {"qos": ["named-uuid", "q"]}}]),
    )?;
    let qos = r[0]["uuid"][1]
        .as_str()
        .ok_or_else(|| anyhow!("unexpected transact result {r}"))?
        .to_string();
    db.call(
        "monitor",
        json!(["Open_vSwitch", "queues", {"Queue": {"columns": ["other_config"]}}]),
    )?;
    let mut queues = Queues { qos, next: 0 };
    for (exp, level, count) in plan(args.quick) {
        let m = run_experiment(state, &mut of, &mut db, exp, level, count, &mut queues)
            .with_context(|| format!("{t}: {exp} at {level}"))?;
        let target = if exp == "statistics polling" {
            1.0
        } else {
            level as f64
        };
        let reached = m.count as f64 / m.seconds;
        let bps = m.wire as f64 / m.seconds;
        let paper = PAPER
            .iter()
            .find(|p| p.0 == exp && p.1 == level.to_string())
            .map(|p| (p.2, p.3))
            .unwrap_or((0.0, 0.0));
        println!(
            "{t:<10} {exp:<20} {level:>6}: {} ops in {:.2} s ({reached:.0}/s), {} frames, {:.0} B/s",
            m.count, m.seconds, m.frames, bps
        );
        csv.push(vec![
            exp.into(),
            level.to_string(),
            t.as_str().into(),
            format!("{target}"),
            m.count.to_string(),
            format!("{:.3}", m.seconds),
            format!("{reached:.1}"),
            m.frames.to_string(),
            m.wire.to_string(),
            format!("{bps:.0}"),
            format!("{:.0}", paper.0),
            format!("{:.0}", paper.1),
        ]);
    }
    Ok(())
}

fn summary(csv: &Csv, took: Duration, plots: &[PathBuf], agent_args: &[String]) -> String {
    let c = |n: &str| csv.col(n);
    let mut transports: Vec<String> = Vec::new();
    for r in &csv.rows {
        if !transports.contains(&r[c("transport")]) {
            transports.push(r[c("transport")].clone());
        }
    }
    let mut s = String::from(
        "# Flow installation, queue configuration, statistics polling (preprint Table I)\n\n",
    );
    s += &out::provenance();
    s += &format!("- run time: {:.0} s\n", took.as_secs_f64());
    if !agent_args.is_empty() {
        s += &format!(
            "- extra options of both agents of the QUIC transports: `{}`\n",
            agent_args.join(" ")
        );
    }
    s += "- one real Open vSwitch 3.1 (userspace datapath) per transport, a benchmark controller speaking OpenFlow 1.3 and OVSDB itself, no impairment on the control link; bytes/s = wire bytes (IP + 28 B/frame), both directions, ÷ the time until the switch confirmed the work (barrier reply and flow count; every transaction reply; every complete stats reply)\n";
    s += "- levels: flows/s and queues/s are target rates (the reached rate is in parentheses when it fell short by more than 5 %); statistics polling: flows installed, one poll per second\n\n";
    let mut header = vec![
        "experiment",
        "level",
        "paper tcpSDN",
        "paper quicSDN (vs tcp)",
    ];
    let names: Vec<String> = transports
        .iter()
        .map(|t| format!("{t} B/s (vs tcp)"))
        .collect();
    header.extend(names.iter().map(String::as_str));
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in &csv.rows {
        let k = (r[c("experiment")].clone(), r[c("level")].clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut rows = Vec::new();
    for (e, l) in &keys {
        let get = |t: &str| {
            csv.rows
                .iter()
                .find(|r| &r[c("experiment")] == e && &r[c("level")] == l && r[c("transport")] == t)
        };
        let num = |r: &Vec<String>, n: &str| r[c(n)].parse::<f64>().unwrap_or(0.0);
        let tcp = get("tcp").map(|r| num(r, "bytes_per_s"));
        let first = get(&transports[0]).expect("a row");
        let (pt, pq) = (
            num(first, "paper_tcp_bytes_per_s"),
            num(first, "paper_quic_bytes_per_s"),
        );
        let mut row = vec![
            e.clone(),
            l.clone(),
            format!("{pt:.0}"),
            format!("{pq:.0} ({})", out::pct_change(pq, pt)),
        ];
        for t in &transports {
            row.push(match get(t) {
                Some(r) => {
                    let b = num(r, "bytes_per_s");
                    let vs = match tcp {
                        Some(base) if t != "tcp" => format!(" ({})", out::pct_change(b, base)),
                        _ => String::new(),
                    };
                    let target = num(r, "target_rate");
                    let reached = num(r, "reached_rate");
                    let short = if e != "statistics polling" && reached < 0.95 * target {
                        format!(", reached {reached:.0}/s")
                    } else {
                        String::new()
                    };
                    format!("{b:.0}{vs}{short}")
                }
                None => "-".into(),
            });
        }
        rows.push(row);
    }
    s += &md_table(&header, &rows);
    s += "\nOperation counts, durations, frames and reached rates are in `table1.csv`.\n";
    s += &out::image_links(plots);
    s
}

/// Reads a Table I CSV (schema-checked).
pub fn read(dir: &Path) -> Result<Csv> {
    Csv::read(&dir.join("table1.csv"), HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openflow_messages_have_their_lengths() {
        let m = flow_mod_add(7, 9);
        assert_eq!(m.len(), 96);
        let h = openflow::Header::parse(&m).unwrap();
        assert_eq!((h.msg_type, h.length, h.xid), (OFPT_FLOW_MOD, 96, 9));
        assert_eq!(&m[72..80], &[0, 4, 0, 24, 0, 0, 0, 0], "apply-actions");
        assert_eq!(&m[80..84], &[0, 0, 0, 16], "output action");
        assert_eq!(flow_mod_delete_all(1).len(), 56);
        assert_eq!(flow_stats_request(1).len(), 56);
        let mut body = vec![0u8; 56 * 3];
        for i in 0..3 {
            body[i * 56 + 1] = 56;
        }
        assert_eq!(flow_stats_entries(&body).unwrap(), 3);
        assert!(flow_stats_entries(&[0, 10, 0, 0]).is_err());
    }
}
