//! The benches' synthetic switch-side and controller programs: threads (inside the
//! lab's namespaces) that send timestamped OpenFlow and OVSDB (JSON-RPC) messages
//! over plain TCP or TLS and check every message they receive.
//!
//! Messages are self-delimiting, so the agents (which frame OpenFlow by its header
//! and JSON-RPC by its grammar) carry them like real ones:
//!
//! * OpenFlow: an OpenFlow 1.3 header (`length` = the message size, `xid` = low
//!   32 bits of the sequence number), then `seq: u64`, `sent_ns: u64`
//!   (CLOCK_REALTIME, big endian), zero padding. The type is that of the bulk
//!   traffic each side sends: FLOW_MOD from the controller, PORT_STATUS from the
//!   switch — messages nobody waits for at once, which the agents may coalesce
//!   (`quicsdn_lanes::coalesce`; an ECHO_REQUEST, as the benches sent before,
//!   is urgent and never waits).
//! * OVSDB: one JSON object, `{"id":SEQ,"len":LEN,"ts":SENT_NS,"p":"xx…"}` with
//!   fixed-width (space-padded) numbers, padded to the message size; a valid JSON-RPC notification
//!   shape for the agents' JSON framing.
//!
//! Every sent message is recorded (count, bytes); every received one is parsed and
//! checked (framing, size, no duplicate sequence number), and its delay — from
//! generation (just before `write`) to complete reception by the application — is
//! recorded. One `write()` per message, as Open vSwitch does.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use quicsdn_wire::openflow;

use crate::emulator::sys;

/// The two services of the benches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Service {
    OpenFlow,
    Ovsdb,
}

impl Service {
    pub const BOTH: [Service; 2] = [Service::OpenFlow, Service::Ovsdb];

    pub fn name(self) -> &'static str {
        match self {
            Service::OpenFlow => "openflow",
            Service::Ovsdb => "ovsdb",
        }
    }

    /// The TCP port the controller program listens on.
    pub fn port(self) -> u16 {
        match self {
            Service::OpenFlow => 6653,
            Service::Ovsdb => 6640,
        }
    }

    /// The smallest message this format can carry.
    pub fn min_size(self) -> usize {
        match self {
            Service::OpenFlow => 24,
            Service::Ovsdb => JSON_PREFIX_LEN + 3,
        }
    }
}

/// Which program sends a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    Switch,
    Controller,
}

impl Sender {
    /// The OpenFlow 1.3 type of this side's messages.
    pub fn openflow_type(self) -> u8 {
        match self {
            Sender::Controller => openflow::build::msg_type::FLOW_MOD,
            Sender::Switch => PORT_STATUS,
        }
    }
}

/// OFPT_PORT_STATUS (OpenFlow 1.3.5 §7.1.1).
const PORT_STATUS: u8 = 12;

/// `{"id":` + 20 characters + `,"len":` + 6 + `,"ts":` + 20 + `,"p":"` (numbers
/// right-aligned with spaces: JSON allows white space, not leading zeros)
const JSON_PREFIX_LEN: usize = 6 + 20 + 7 + 6 + 6 + 20 + 6;

/// Encodes message `seq` of `size` bytes from `from`, generated at `sent_ns`.
pub fn encode(svc: Service, from: Sender, seq: u64, size: usize, sent_ns: u64) -> Vec<u8> {
    assert!(
        size >= svc.min_size() && size <= 65535,
        "message size {size}"
    );
    match svc {
        Service::OpenFlow => {
            let mut m = vec![0u8; size];
            m[..8].copy_from_slice(
                &openflow::Header {
                    version: openflow::OFP13_VERSION,
                    msg_type: from.openflow_type(),
                    length: size as u16,
                    xid: seq as u32,
                }
                .encode(),
            );
            m[8..16].copy_from_slice(&seq.to_be_bytes());
            m[16..24].copy_from_slice(&sent_ns.to_be_bytes());
            m
        }
        Service::Ovsdb => {
            let mut m =
                format!("{{\"id\":{seq:>20},\"len\":{size:>6},\"ts\":{sent_ns:>20},\"p\":\"")
                    .into_bytes();
            debug_assert_eq!(m.len(), JSON_PREFIX_LEN);
            m.resize(size - 2, b'x');
            m.extend_from_slice(b"\"}");
            m
        }
    }
}

/// One received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub seq: u64,
    pub size: usize,
    pub sent_ns: u64,
    pub recv_ns: u64,
}

/// Parses the next whole message at the start of `buf`: `Ok(None)` if incomplete.
pub fn decode(svc: Service, buf: &[u8]) -> Result<Option<(u64, usize, u64)>> {
    match svc {
        Service::OpenFlow => {
            let Some(h) = openflow::Header::parse(buf) else {
                return Ok(None);
            };
            let len = usize::from(h.length);
            let types = [Sender::Switch, Sender::Controller].map(Sender::openflow_type);
            if len < 24 || !types.contains(&h.msg_type) {
                bail!("unexpected OpenFlow message {h:?}");
            }
            if buf.len() < len {
                return Ok(None);
            }
            let seq = u64::from_be_bytes(buf[8..16].try_into().expect("8"));
            let ts = u64::from_be_bytes(buf[16..24].try_into().expect("8"));
            if seq as u32 != h.xid {
                bail!("OpenFlow xid {} does not match sequence {seq}", h.xid);
            }
            Ok(Some((seq, len, ts)))
        }
        Service::Ovsdb => {
            if buf.len() < JSON_PREFIX_LEN {
                return Ok(None);
            }
            let num = |at: usize, n: usize| -> Result<u64> {
                std::str::from_utf8(&buf[at..at + n])
                    .ok()
                    .and_then(|s| s.trim_start().parse().ok())
                    .ok_or_else(|| anyhow!("malformed JSON message prefix"))
            };
            if &buf[..6] != b"{\"id\":" {
                bail!(
                    "malformed JSON message: {:?}",
                    String::from_utf8_lossy(&buf[..16])
                );
            }
            let seq = num(6, 20)?;
            let len = num(33, 6)? as usize;
            let ts = num(45, 20)?;
            if buf.len() < len {
                return Ok(None);
            }
            if &buf[len - 2..len] != b"\"}" {
                bail!("JSON message {seq} does not end where its length says");
            }
            Ok(Some((seq, len, ts)))
        }
    }
}

/// The read half of a connection (plain or TLS).
pub enum Reader {
    Plain(TcpStream),
    Unix(std::os::unix::net::UnixStream),
    Tls(TcpStream, Arc<Mutex<rustls::Connection>>),
}

/// The write half of a connection (plain or TLS).
pub enum Writer {
    Plain(TcpStream),
    Unix(std::os::unix::net::UnixStream),
    Tls(TcpStream, Arc<Mutex<rustls::Connection>>, Vec<u8>),
}

/// Moves what plaintext rustls holds into `out` (none is not an error).
fn drain_plaintext(c: &mut rustls::Connection, out: &mut Vec<u8>) -> io::Result<()> {
    match c.reader().read_to_end(out) {
        Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
        _ => Ok(()),
    }
}

impl Reader {
    /// Sets the read timeout of the underlying socket.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Reader::Plain(s) | Reader::Tls(s, _) => s.set_read_timeout(t),
            Reader::Unix(s) => s.set_read_timeout(t),
        }
    }

    /// Appends plaintext to `out`; `Ok(0)` at end of stream.
    pub fn read_into(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        let mut buf = [0u8; 65536];
        match self {
            Reader::Plain(s) => {
                let n = s.read(&mut buf)?;
                out.extend_from_slice(&buf[..n]);
                Ok(n)
            }
            Reader::Unix(s) => {
                let n = s.read(&mut buf)?;
                out.extend_from_slice(&buf[..n]);
                Ok(n)
            }
            Reader::Tls(s, conn) => loop {
                // Plaintext rustls already holds first: the record that ended the
                // handshake may have carried data too, and the socket may have
                // nothing more to say for a while.
                {
                    let mut c = conn.lock().expect("tls lock");
                    let before = out.len();
                    drain_plaintext(&mut c, out)?;
                    if out.len() > before {
                        return Ok(out.len() - before);
                    }
                }
                let n = s.read(&mut buf)?;
                if n == 0 {
                    return Ok(0);
                }
                let mut c = conn.lock().expect("tls lock");
                let mut rd = &buf[..n];
                let before = out.len();
                while !rd.is_empty() {
                    c.read_tls(&mut rd)?;
                    c.process_new_packets().map_err(io::Error::other)?;
                    // Drain as we go: rustls bounds its plaintext buffer.
                    drain_plaintext(&mut c, out)?;
                }
                if out.len() > before {
                    return Ok(out.len() - before);
                }
            },
        }
    }
}

impl Writer {
    /// Sends one message with one `write()` (TLS: one record, flushed at once).
    pub fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        match self {
            Writer::Plain(s) => s.write_all(msg),
            Writer::Unix(s) => s.write_all(msg),
            Writer::Tls(s, conn, out) => {
                out.clear();
                {
                    let mut c = conn.lock().expect("tls lock");
                    c.writer().write_all(msg)?;
                    while c.wants_write() {
                        c.write_tls(out)?;
                    }
                }
                s.write_all(out)
            }
        }
    }

    pub fn shutdown(&mut self) {
        match self {
            Writer::Plain(s) | Writer::Tls(s, ..) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Writer::Unix(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// TLS settings of a connection: the lab CA's credentials, on both ends.
#[derive(Clone)]
pub struct TlsSide {
    pub server: Option<Arc<rustls::ServerConfig>>,
    pub client: Option<(Arc<rustls::ClientConfig>, String)>,
}

/// Splits a connected stream into reader and writer, doing the TLS handshake
/// first if `tls` is given.
pub fn split(stream: TcpStream, tls: Option<&TlsSide>) -> Result<(Reader, Writer)> {
    stream.set_nodelay(true)?;
    let r = stream.try_clone()?;
    let Some(tls) = tls else {
        return Ok((Reader::Plain(r), Writer::Plain(stream)));
    };
    let mut conn: rustls::Connection = match (&tls.server, &tls.client) {
        (Some(cfg), _) => rustls::ServerConnection::new(cfg.clone())?.into(),
        (None, Some((cfg, name))) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone())?;
            rustls::ClientConnection::new(cfg.clone(), name)?.into()
        }
        (None, None) => bail!("TLS side without a configuration"),
    };
    let mut s = stream.try_clone()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut s).context("TLS handshake")?;
    }
    let conn = Arc::new(Mutex::new(conn));
    Ok((
        Reader::Tls(r, conn.clone()),
        Writer::Tls(stream, conn, Vec::new()),
    ))
}

/// What one end of one connection sends: `count` messages, message `i` of
/// `sizes[i % sizes.len()]` bytes, at the offsets (from the start) in `at`.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub sizes: Vec<usize>,
    /// Send offsets, non-decreasing.
    pub at: Vec<Duration>,
}

impl Schedule {
    /// `count` messages as a Poisson process of `rate` per second (seeded).
    pub fn poisson(count: u64, rate: f64, sizes: Vec<usize>, seed: u64) -> Schedule {
        use crate::emulator::rng::RandomSource;
        let mut rng = crate::emulator::rng::Xoshiro256pp::seed_from_u64(seed);
        let mut t = 0.0f64;
        let at = (0..count)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                t += -(1.0 - u).ln() / rate;
                Duration::from_secs_f64(t)
            })
            .collect();
        Schedule { sizes, at }
    }

    /// `bursts` bursts of `per_burst` messages sent back to back, `gap` apart.
    pub fn bursts(bursts: u64, per_burst: u64, gap: Duration, sizes: Vec<usize>) -> Schedule {
        let at = (0..bursts)
            .flat_map(|b| (0..per_burst).map(move |_| gap * b as u32))
            .collect();
        Schedule { sizes, at }
    }

    pub fn count(&self) -> u64 {
        self.at.len() as u64
    }

    pub fn size(&self, i: usize) -> usize {
        self.sizes[i % self.sizes.len()]
    }

    pub fn bytes(&self) -> u64 {
        (0..self.at.len()).map(|i| self.size(i) as u64).sum()
    }
}

/// What one end saw.
#[derive(Debug, Default, Clone)]
pub struct EndReport {
    pub sent: u64,
    pub sent_bytes: u64,
    /// Seconds from the first to the last send.
    pub send_span: f64,
    pub received: Vec<Received>,
    pub received_bytes: u64,
    /// Lossy mode: messages that arrived a second time (dropped).
    pub duplicates: u64,
    /// Messages that arrived after one sent later than them.
    pub out_of_order: u64,
}

/// A transport allowed to lose messages (`udp-seed`): the receiver stops once
/// the peer's schedule is over and nothing arrived for `quiet`, instead of
/// waiting for every message, and counts duplicates instead of failing.
#[derive(Debug, Clone, Copy)]
pub struct Lossy {
    /// When the peer's last message is due, from the start.
    pub peer_until: Duration,
    pub quiet: Duration,
}

/// When an end starts, and how it reports and stops.
pub struct EndControl {
    pub start: Instant,
    /// Which program this end is.
    pub sender: Sender,
    pub lossy: Option<Lossy>,
    /// Set once the counters are read: the end may close its connection.
    pub stop: Arc<AtomicBool>,
    /// Told `Ok` when everything was sent and received.
    pub done: std::sync::mpsc::Sender<Result<(), String>>,
}

/// Runs one end of one connection: sends `schedule` (starting at `ctl.start`) and
/// receives `expect` messages of `svc`, checking each. Returns when both are done
/// and `ctl.stop` is set, or on error.
pub fn run_end(
    svc: Service,
    mut rd: Reader,
    mut wr: Writer,
    schedule: Schedule,
    expect: u64,
    ctl: EndControl,
) -> Result<EndReport> {
    let EndControl {
        start,
        sender,
        lossy,
        stop,
        done,
    } = ctl;
    if let Some(l) = lossy {
        // Wake up regularly to see whether the peer is done.
        rd.set_read_timeout(Some(l.quiet.min(Duration::from_millis(200))))?;
    }
    let received = std::thread::scope(|scope| -> Result<EndReport> {
        let recv = scope.spawn(move || -> Result<(Vec<Received>, u64, u64, u64)> {
            let mut buf = Vec::with_capacity(1 << 20);
            let mut got: Vec<Received> = Vec::with_capacity(expect as usize);
            let mut seen = vec![false; expect as usize];
            let mut bytes = 0u64;
            let (mut dups, mut late, mut highest) = (0u64, 0u64, None::<u64>);
            let mut last_arrival = Instant::now();
            while (got.len() as u64) < expect {
                let n = match rd.read_into(&mut buf) {
                    Ok(n) => n,
                    Err(e) if lossy.is_some() && crate::wait::timed_out(&e) => {
                        let l = lossy.expect("checked");
                        let now = Instant::now();
                        if now > start + l.peer_until && now - last_arrival > l.quiet {
                            break;
                        }
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                last_arrival = Instant::now();
                if n == 0 {
                    bail!(
                        "{}: connection closed after {} of {expect} messages",
                        svc.name(),
                        got.len()
                    );
                }
                let now = sys::realtime_ns();
                let mut at = 0;
                while let Some((seq, len, ts)) = decode(svc, &buf[at..])? {
                    let slot = seen
                        .get_mut(seq as usize)
                        .ok_or_else(|| anyhow!("{}: unexpected sequence {seq}", svc.name()))?;
                    if *slot {
                        if lossy.is_none() {
                            bail!("{}: message {seq} arrived twice", svc.name());
                        }
                        dups += 1;
                        at += len;
                        continue;
                    }
                    *slot = true;
                    if highest.is_some_and(|h| seq < h) {
                        late += 1;
                    }
                    highest = highest.max(Some(seq));
                    got.push(Received {
                        seq,
                        size: len,
                        sent_ns: ts,
                        recv_ns: now,
                    });
                    bytes += len as u64;
                    at += len;
                }
                buf.drain(..at);
            }
            Ok((got, bytes, dups, late))
        });
        let mut report = EndReport::default();
        let (mut first, mut last) = (None, None);
        for i in 0..schedule.at.len() {
            let due = start + schedule.at[i];
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let size = schedule.size(i);
            let sent_at = Instant::now();
            wr.send(&encode(svc, sender, i as u64, size, sys::realtime_ns()))?;
            first.get_or_insert(sent_at);
            last = Some(sent_at);
            report.sent += 1;
            report.sent_bytes += size as u64;
        }
        if let (Some(f), Some(l)) = (first, last) {
            report.send_span = (l - f).as_secs_f64();
        }
        let (got, bytes, dups, late) = recv.join().map_err(|_| anyhow!("receiver panicked"))??;
        report.received = got;
        report.received_bytes = bytes;
        report.duplicates = dups;
        report.out_of_order = late;
        let _ = done.send(Ok(()));
        // Keep the connection open (ACKs, retransmissions) until the counters are read.
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        wr.shutdown();
        Ok(report)
    })?;
    Ok(received)
}

/// Accepts one connection on `listener` within `timeout`.
pub fn accept_one(listener: &TcpListener, timeout: Duration) -> Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let s = crate::wait::poll_until(
        "a connection from the switch side",
        timeout,
        || match listener.accept() {
            Ok((s, _)) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        },
    )?;
    s.set_nonblocking(false)?;
    Ok(s)
}

/// Connects to `addr`, retrying while it refuses (a tunnel or agent coming up).
pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    crate::wait::poll_until(&format!("a connection to {addr}"), timeout, || {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
            Err(e) => Err(anyhow!("connecting to {addr}: {e}")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_are_valid_framing() {
        for svc in Service::BOTH {
            for size in [svc.min_size(), 128, 400, 3000] {
                let m = encode(svc, Sender::Switch, 77, size, 123_456_789);
                assert_eq!(m.len(), size);
                assert_eq!(decode(svc, &m).unwrap(), Some((77, size, 123_456_789)));
                assert_eq!(decode(svc, &m[..size - 1]).unwrap(), None);
                let mut two = m.clone();
                two.extend_from_slice(&encode(svc, Sender::Controller, 78, 200, 5));
                assert_eq!(decode(svc, &two).unwrap(), Some((77, size, 123_456_789)));
                assert_eq!(decode(svc, &two[size..]).unwrap(), Some((78, 200, 5)));
            }
        }
        // The agents' own framers accept them as whole messages.
        let m = encode(Service::Ovsdb, Sender::Switch, 1, 300, 2);
        let v: serde_json::Value = serde_json::from_slice(&m).unwrap();
        assert_eq!(v["id"], 1);
        let mut f = quicsdn_wire::framing::Framer::new(quicsdn_wire::Framing::JsonRpc, 1 << 20);
        let mut two = m.clone();
        two.extend_from_slice(&m);
        assert_eq!(f.next_message(&two).unwrap(), Some(300));
        let mut f = quicsdn_wire::framing::Framer::new(quicsdn_wire::Framing::OpenFlow, 65535);
        let of = encode(Service::OpenFlow, Sender::Controller, 9, 400, 1);
        assert_eq!(f.next_message(&of).unwrap(), Some(400));
        // Bulk types: the agents' coalescing may hold them (an echo it would not).
        assert!(!quicsdn_lanes::coalesce::openflow_is_urgent(&of, false));
        let of = encode(Service::OpenFlow, Sender::Switch, 9, 400, 1);
        assert!(!quicsdn_lanes::coalesce::openflow_is_urgent(&of, false));
        assert!(decode(Service::Ovsdb, b"{\"x\":1}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx").is_err());
    }

    #[test]
    fn schedules() {
        let s = Schedule::poisson(20_000, 1000.0, vec![100], 7);
        let span = s.at.last().unwrap().as_secs_f64();
        assert!((span - 20.0).abs() < 1.0, "20k at 1k/s took {span} s");
        assert!(s.at.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(s.bytes(), 2_000_000);
        let b = Schedule::bursts(3, 4, Duration::from_millis(100), vec![400, 600]);
        assert_eq!(b.count(), 12);
        assert_eq!(b.at[4], Duration::from_millis(100));
        assert_eq!(b.bytes(), 6000);
    }
}
