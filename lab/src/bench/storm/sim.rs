//! The storm bench's lightweight OpenFlow 1.3 peers: one simulated Open vSwitch
//! per switch agent, and a counting controller behind the controller agent.
//! Threads with blocking sockets; nothing here is timed against anything.
//!
//! **Simulated switch.** Connects to its switch agent's unix socket and
//! reconnects as Open vSwitch's `rconn` does (lib/rconn.c, OVS 3.x), so the
//! storm sees OVS's real timing on top of the agents':
//!
//! * an attempt stays CONNECTING until the controller's HELLO arrives (vconn's
//!   version negotiation), for at most max(1 s, backoff), else it failed;
//! * after a disconnect the backoff is 1 s if the last attempt started more than
//!   one backoff ago (a connection that lived), else it doubles up to
//!   `max_backoff` (8 s); the next attempt comes one backoff later;
//! * once connected it answers FEATURES_REQUEST, ECHO_REQUEST and
//!   BARRIER_REQUEST, and probes an idle connection with an ECHO_REQUEST after
//!   `inactivity_probe` (5 s), dropping it after another one without traffic.
//!
//! **Counting controller.** Accepts the controller agent's connections (one per
//! switch session, as it would accept OVS's), handshakes with
//! [`crate::openflow_peer::Controller`] (HELLO, FEATURES_REQUEST, FEATURES_REPLY)
//! and records each completed handshake with its datapath id and time, then
//! answers ECHO_REQUESTs until the connection ends.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use quicsdn_wire::openflow::build::{self, msg_type};
use quicsdn_wire::openflow::{HEADER_LEN, Header, OFP13_VERSION, message};

use crate::openflow_peer::Controller;

/// Stack of the peers' threads: they hold a few small buffers only.
const STACK: usize = 256 << 10;
/// How often a blocked peer looks at its stop flag.
const TICK: Duration = Duration::from_millis(200);
/// How long the counting controller waits for a FEATURES_REPLY. OVS gives up on
/// a connection without the controller's HELLO after 1 s; this only bounds a
/// stuck one.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(30);

/// One completed OpenFlow handshake at the counting controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Handshake {
    pub dpid: u64,
    /// When the FEATURES_REPLY arrived, since the controller started.
    pub at: Duration,
}

/// The counting controller.
pub struct CountingController {
    addr: SocketAddr,
    epoch: Instant,
    stop: Arc<AtomicBool>,
    handshakes: Arc<Mutex<Vec<Handshake>>>,
    /// Connections open now, per datapath id (after their handshake).
    live: Arc<Mutex<std::collections::HashMap<u64, u32>>>,
    accept: Option<JoinHandle<()>>,
}

impl CountingController {
    /// Listens on 127.0.0.1, on a port of the kernel's choosing.
    pub fn start() -> Result<CountingController> {
        let listener = TcpListener::bind("127.0.0.1:0").context("controller: bind")?;
        let addr = listener.local_addr()?;
        let epoch = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let live = Arc::new(Mutex::new(std::collections::HashMap::new()));
        let accept = {
            let (stop, handshakes, live) = (stop.clone(), handshakes.clone(), live.clone());
            std::thread::Builder::new()
                .name("storm-ctl".into())
                .stack_size(STACK)
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let Ok(conn) = conn else {
                            // EMFILE and the like: let the agent retry.
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        };
                        let (stop, handshakes, live) =
                            (stop.clone(), handshakes.clone(), live.clone());
                        let _ = std::thread::Builder::new()
                            .name("storm-ctl-conn".into())
                            .stack_size(STACK)
                            .spawn(move || serve(conn, epoch, &stop, &handshakes, &live));
                    }
                })?
        };
        Ok(CountingController {
            addr,
            epoch,
            stop,
            handshakes,
            live,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Now, on the clock of [`Handshake::at`].
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Every handshake so far, in the order completed.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.handshakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many datapaths have a live, handshaken connection now.
    pub fn live(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|&&n| n > 0)
            .count()
    }
}

impl Drop for CountingController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocking accept.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    stream: TcpStream,
    epoch: Instant,
    stop: &AtomicBool,
    handshakes: &Mutex<Vec<Handshake>>,
    live: &Mutex<std::collections::HashMap<u64, u32>>,
) {
    let Ok(mut c) = Controller::handshake(stream, HANDSHAKE_LIMIT) else {
        return;
    };
    let dpid = c.datapath_id;
    handshakes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Handshake {
            dpid,
            at: epoch.elapsed(),
        });
    *live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(dpid)
        .or_default() += 1;
    // Answer the switch's inactivity probes until the connection ends.
    while !stop.load(Ordering::Relaxed) {
        match c.recv_by(Instant::now() + TICK) {
            Ok(None) => {}
            Ok(Some(m)) if m.header.msg_type == msg_type::ECHO_REQUEST => {
                let reply = build::echo_reply(m.header.xid, &m.bytes[HEADER_LEN..]);
                if c.send(&reply).is_err() {
                    break;
                }
            }
            Ok(Some(_)) => {}
            Err(_) => break,
        }
    }
    if let Some(n) = live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&dpid)
    {
        *n -= 1;
    }
}

// ---------------------------------------------------------------------------
// Switches

/// Counters over every simulated switch.
#[derive(Debug, Default)]
pub struct FleetStats {
    /// Connection attempts (socket connects tried).
    pub attempts: AtomicU64,
    /// Attempts that got the controller's HELLO.
    pub connected: AtomicU64,
    /// Attempts abandoned because the HELLO did not come within max(1 s, backoff).
    pub hello_timeouts: AtomicU64,
    /// Connections dropped for an unanswered inactivity probe.
    pub probe_timeouts: AtomicU64,
}

/// Open vSwitch's timing, as configured by default.
#[derive(Debug, Clone, Copy)]
pub struct OvsTiming {
    pub max_backoff: Duration,
    pub inactivity_probe: Duration,
}

impl Default for OvsTiming {
    fn default() -> Self {
        OvsTiming {
            max_backoff: Duration::from_secs(8),
            inactivity_probe: Duration::from_secs(5),
        }
    }
}

/// Every simulated switch, one thread each.
pub struct Fleet {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    pub stats: Arc<FleetStats>,
}

impl Fleet {
    /// Starts one simulated switch per `(socket, datapath id)`.
    pub fn start(switches: Vec<(PathBuf, u64)>, timing: OvsTiming) -> Result<Fleet> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(FleetStats::default());
        let mut threads = Vec::with_capacity(switches.len());
        for (path, dpid) in switches {
            let (stop, stats) = (stop.clone(), stats.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("storm-sw{dpid}"))
                    .stack_size(STACK)
                    .spawn(move || Rconn::new(path, dpid, timing, &stop, &stats).run())?,
            );
        }
        Ok(Fleet {
            stop,
            threads,
            stats,
        })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What one read attempt gave.
enum Got {
    Message(Header, Vec<u8>),
    /// Nothing before the timeout.
    Nothing,
    /// The peer closed, reset, or sent something that is not OpenFlow.
    Closed,
}

/// The switch's end of an OpenFlow connection: whole messages in and out.
struct OfConn {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl OfConn {
    fn send(&mut self, msg: &[u8]) -> bool {
        self.stream.write_all(msg).is_ok()
    }

    /// One whole message, waiting at most `wait`.
    fn recv(&mut self, wait: Duration) -> Got {
        loop {
            if let Some(h) = Header::parse(&self.buf) {
                let len = usize::from(h.length);
                if len < HEADER_LEN {
                    return Got::Closed;
                }
                if self.buf.len() >= len {
                    let bytes: Vec<u8> = self.buf.drain(..len).collect();
                    return Got::Message(h, bytes);
                }
            }
            if self
                .stream
                .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
                .is_err()
            {
                return Got::Closed;
            }
            let mut chunk = [0u8; 2048];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Got::Closed,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Got::Nothing;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Got::Closed,
            }
        }
    }
}

/// One simulated switch's controller connection: OVS's `rconn` state machine.
struct Rconn<'a> {
    path: PathBuf,
    dpid: u64,
    timing: OvsTiming,
    stop: &'a AtomicBool,
    stats: &'a FleetStats,
    backoff: Duration,
    /// `None` stands for OVS's LLONG_MAX ("prevent resetting backoff").
    backoff_deadline: Option<Instant>,
}

/// How an attempt ended.
enum Ended {
    Failed,
    Closed,
    Stop,
}

impl<'a> Rconn<'a> {
    fn new(
        path: PathBuf,
        dpid: u64,
        timing: OvsTiming,
        stop: &'a AtomicBool,
        stats: &'a FleetStats,
    ) -> Rconn<'a> {
        Rconn {
            path,
            dpid,
            timing,
            stop,
            stats,
            backoff: Duration::ZERO,
            // LLONG_MIN: the first disconnect resets the backoff to 1 s.
            backoff_deadline: Some(Instant::now()),
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn run(mut self) {
        // rconn_connect(): the first attempt is immediate.
        loop {
            if self.stopped() {
                return;
            }
            if matches!(self.attempt(), Ended::Stop) {
                return;
            }
            self.disconnect();
            // S_BACKOFF for `backoff`.
            let until = Instant::now() + self.backoff;
            while Instant::now() < until {
                if self.stopped() {
                    return;
                }
                std::thread::sleep(TICK.min(until.saturating_duration_since(Instant::now())));
            }
        }
    }

    /// rconn's disconnect(): the next backoff.
    fn disconnect(&mut self) {
        let now = Instant::now();
        let second = Duration::from_secs(1);
        if self.backoff_deadline.is_some_and(|d| now >= d) {
            self.backoff = second;
        } else if self.backoff < self.timing.max_backoff / 2 {
            self.backoff = (self.backoff * 2).max(second);
        } else {
            self.backoff = self.timing.max_backoff;
        }
        self.backoff_deadline = Some(now + self.backoff);
    }

    /// reconnect(), S_CONNECTING and S_ACTIVE/S_IDLE of one connection.
    fn attempt(&mut self) -> Ended {
        self.stats.attempts.fetch_add(1, Ordering::Relaxed);
        let stream = match UnixStream::connect(&self.path) {
            Ok(s) => s,
            Err(_) => {
                self.backoff_deadline = None;
                return Ended::Failed;
            }
        };
        let entered = Instant::now();
        self.backoff_deadline = Some(entered + self.backoff);
        let mut c = OfConn {
            stream,
            buf: Vec::with_capacity(512),
        };
        if !c.send(&build::hello(0)) {
            return Ended::Closed;
        }
        // S_CONNECTING: until the peer's HELLO, at most max(1 s, backoff).
        let connect_timeout = self.backoff.max(Duration::from_secs(1));
        loop {
            if self.stopped() {
                return Ended::Stop;
            }
            let left = (entered + connect_timeout).saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.stats.hello_timeouts.fetch_add(1, Ordering::Relaxed);
                self.backoff_deadline = None;
                return Ended::Failed;
            }
            match c.recv(left.min(TICK)) {
                Got::Nothing => {}
                Got::Closed => return Ended::Closed,
                Got::Message(h, _) if h.msg_type == msg_type::HELLO => break,
                // Anything else before HELLO is a protocol error to vconn.
                Got::Message(..) => return Ended::Closed,
            }
        }
        self.stats.connected.fetch_add(1, Ordering::Relaxed);
        self.active(&mut c)
    }

    /// S_ACTIVE / S_IDLE: answer the controller, probe when idle.
    fn active(&mut self, c: &mut OfConn) -> Ended {
        let probe = self.timing.inactivity_probe;
        let mut last_activity = Instant::now();
        // When the probe was sent (S_IDLE), if it was.
        let mut idle_since: Option<Instant> = None;
        loop {
            if self.stopped() {
                return Ended::Stop;
            }
            let now = Instant::now();
            match idle_since {
                Some(t) if now >= t + probe => {
                    self.stats.probe_timeouts.fetch_add(1, Ordering::Relaxed);
                    return Ended::Closed;
                }
                None if now >= last_activity + probe => {
                    if !c.send(&build::echo_request(0, &[])) {
                        return Ended::Closed;
                    }
                    idle_since = Some(now);
                    last_activity = now;
                    continue;
                }
                _ => {}
            }
            let (h, bytes) = match c.recv(TICK) {
                Got::Nothing => continue,
                Got::Closed => return Ended::Closed,
                Got::Message(h, bytes) => (h, bytes),
            };
            last_activity = Instant::now();
            idle_since = None;
            let reply = match h.msg_type {
                msg_type::FEATURES_REQUEST => Some(build::features_reply(h.xid, self.dpid)),
                msg_type::ECHO_REQUEST => Some(build::echo_reply(h.xid, &bytes[HEADER_LEN..])),
                msg_type::BARRIER_REQUEST => {
                    Some(message(OFP13_VERSION, msg_type::BARRIER_REPLY, h.xid, &[]))
                }
                _ => None,
            };
            if let Some(r) = reply
                && !c.send(&r)
            {
                return Ended::Closed;
            }
        }
    }
}
