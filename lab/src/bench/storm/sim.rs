//! The storm bench's lightweight OpenFlow 1.3 peers: one simulated Open vSwitch
//! per switch agent, and a counting controller behind the controller agent.
//! Tokio tasks on a small runtime of their own (one task per simulated switch
//! and per controller connection, so 10,000 switches cost 10,000 small tasks,
//! not 10,000 threads); nothing here is timed against anything.
//!
//! **Simulated switch.** Connects to its switch agent's unix socket and
//! reconnects as Open vSwitch's `rconn` does, with OVS's timing from
//! [`super::rconn`] (the HELLO wait of max(1 s, backoff), the backoff doubling
//! up to 8 s and reset by a connection that lived, the inactivity probe every
//! 5 s), so the storm sees OVS's real timing on top of the agents'. Once
//! connected it answers FEATURES_REQUEST, ECHO_REQUEST and BARRIER_REQUEST.
//!
//! **Counting controller.** Accepts the controller agent's connections (one per
//! switch session, as it would accept OVS's), handshakes (HELLO,
//! FEATURES_REQUEST, FEATURES_REPLY) and records each completed handshake with
//! its datapath id and time, then answers ECHO_REQUESTs until the connection
//! ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use quicsdn_wire::openflow::build::{self, msg_type};
use quicsdn_wire::openflow::{HEADER_LEN, Header, OFP13_VERSION, message};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};
use tokio::runtime::Runtime;

use super::rconn::{Backoff, Probe, ProbeAction};

/// How long the counting controller waits for a FEATURES_REPLY. OVS gives up on
/// a connection without the controller's HELLO after 1 s; this only bounds a
/// stuck one.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(30);

/// The runtime of the simulated peers: one thread, apart from the switch
/// agents' runtime (the peers' work per message is a few bytes).
fn peer_runtime(name: &str) -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .with_context(|| format!("starting the {name} runtime"))
}

/// One completed OpenFlow handshake at the counting controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Handshake {
    pub dpid: u64,
    /// When the FEATURES_REPLY arrived, since the controller started.
    pub at: Duration,
}

#[derive(Default)]
struct Counts {
    handshakes: Mutex<Vec<Handshake>>,
    /// Connections open now, per datapath id (after their handshake).
    live: Mutex<HashMap<u64, u32>>,
}

/// The counting controller.
pub struct CountingController {
    addr: SocketAddr,
    epoch: Instant,
    counts: Arc<Counts>,
    /// Dropping it ends every connection.
    rt: Option<Runtime>,
}

impl CountingController {
    /// Listens on 127.0.0.1, on a port of the kernel's choosing.
    pub fn start() -> Result<CountingController> {
        let rt = peer_runtime("storm-ctl")?;
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .context("controller: bind")?;
        let addr = listener.local_addr()?;
        let epoch = Instant::now();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        rt.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((conn, _)) => {
                        tokio::spawn(serve(conn, epoch, c.clone()));
                    }
                    // EMFILE and the like: let the agent retry.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
        Ok(CountingController {
            addr,
            epoch,
            counts,
            rt: Some(rt),
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
        lock(&self.counts.handshakes).clone()
    }

    /// Handshakes completed since `from` (on the clock of [`Self::now`]).
    pub fn handshakes_since(&self, from: Duration) -> Vec<Handshake> {
        let all = lock(&self.counts.handshakes);
        // Recorded in completion order, so the ones since `from` are a tail.
        let first = all.partition_point(|h| h.at < from);
        all[first..].to_vec()
    }

    /// How many datapaths have a live, handshaken connection now.
    pub fn live(&self) -> usize {
        lock(&self.counts.live).values().filter(|&&n| n > 0).count()
    }

    /// Waits up to `limit` until at least `switches` datapaths are live.
    pub fn wait_live(&self, switches: usize, what: &str, limit: Duration) -> Result<()> {
        crate::wait::poll_until(what, limit, || Ok((self.live() >= switches).then_some(())))
            .with_context(|| format!("{} of {switches} switches live", self.live()))
    }
}

impl Drop for CountingController {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn serve(stream: tokio::net::TcpStream, epoch: Instant, counts: Arc<Counts>) {
    let _ = stream.set_nodelay(true);
    let mut c = OfConn::new(stream);
    if !c.send(&build::hello(1)).await || !c.send(&build::features_request(2)).await {
        return;
    }
    let reply = tokio::time::timeout(HANDSHAKE_LIMIT, async {
        loop {
            match c.recv().await {
                Some((h, bytes)) if h.msg_type == msg_type::FEATURES_REPLY => {
                    return bytes
                        .get(8..16)
                        .map(|d| u64::from_be_bytes(d.try_into().expect("8 bytes")));
                }
                Some(_) => {}
                None => return None,
            }
        }
    })
    .await;
    let Ok(Some(dpid)) = reply else {
        return;
    };
    {
        // Under the lock, so the vector stays in completion order.
        let mut hs = lock(&counts.handshakes);
        hs.push(Handshake {
            dpid,
            at: epoch.elapsed(),
        });
    }
    *lock(&counts.live).entry(dpid).or_default() += 1;
    // Answer the switch's inactivity probes until the connection ends.
    while let Some((h, bytes)) = c.recv().await {
        if h.msg_type == msg_type::ECHO_REQUEST
            && !c
                .send(&build::echo_reply(h.xid, &bytes[HEADER_LEN..]))
                .await
        {
            break;
        }
    }
    if let Some(n) = lock(&counts.live).get_mut(&dpid) {
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

/// Every simulated switch, one task each.
pub struct Fleet {
    pub stats: Arc<FleetStats>,
    /// Dropping it stops every switch.
    rt: Option<Runtime>,
}

impl Fleet {
    /// Starts one simulated switch per `(socket, datapath id)`.
    pub fn start(switches: Vec<(PathBuf, u64)>, timing: OvsTiming) -> Result<Fleet> {
        let rt = peer_runtime("storm-ovs")?;
        let stats = Arc::new(FleetStats::default());
        for (path, dpid) in switches {
            rt.spawn(simulated_switch(path, dpid, timing, stats.clone()));
        }
        Ok(Fleet {
            stats,
            rt: Some(rt),
        })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// One end of an OpenFlow connection: whole messages in and out.
struct OfConn<S> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> OfConn<S> {
    fn new(stream: S) -> OfConn<S> {
        OfConn {
            stream,
            buf: Vec::with_capacity(512),
        }
    }

    async fn send(&mut self, msg: &[u8]) -> bool {
        self.stream.write_all(msg).await.is_ok()
    }

    /// One whole message, or `None` when the peer closed, reset, or sent
    /// something that is not OpenFlow. Cancel-safe: bytes read stay in the
    /// buffer.
    async fn recv(&mut self) -> Option<(Header, Vec<u8>)> {
        loop {
            if let Some(h) = Header::parse(&self.buf) {
                let len = usize::from(h.length);
                if len < HEADER_LEN {
                    return None;
                }
                if self.buf.len() >= len {
                    let bytes: Vec<u8> = self.buf.drain(..len).collect();
                    return Some((h, bytes));
                }
            }
            let mut chunk = [0u8; 2048];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// One simulated switch's controller connection, forever (the fleet's
/// runtime ends it).
async fn simulated_switch(path: PathBuf, dpid: u64, timing: OvsTiming, stats: Arc<FleetStats>) {
    let mut backoff = Backoff::new(Instant::now(), timing.max_backoff);
    // rconn_connect(): the first attempt is immediate.
    loop {
        let why = attempt(&path, dpid, timing, &stats, &mut backoff).await;
        // S_BACKOFF.
        let wait = backoff.disconnected(Instant::now());
        tracing::debug!(
            dpid,
            wait_ms = wait.as_millis() as u64,
            "simulated OVS: {why}; reconnecting"
        );
        tokio::time::sleep(wait).await;
    }
}

/// reconnect(), S_CONNECTING and S_ACTIVE/S_IDLE of one connection; returns
/// when it ends, with why (for the shard's debug log).
async fn attempt(
    path: &PathBuf,
    dpid: u64,
    timing: OvsTiming,
    stats: &FleetStats,
    backoff: &mut Backoff,
) -> &'static str {
    stats.attempts.fetch_add(1, Ordering::Relaxed);
    let Ok(stream) = UnixStream::connect(path).await else {
        backoff.attempt_failed();
        return "connect failed";
    };
    let hello_wait = backoff.connecting(Instant::now());
    let mut c = OfConn::new(stream);
    if !c.send(&build::hello(0)).await {
        return "sending HELLO failed";
    }
    // S_CONNECTING: until the peer's HELLO.
    match tokio::time::timeout(hello_wait, c.recv()).await {
        Err(_) => {
            tracing::info!(
                dpid,
                wait_ms = hello_wait.as_millis() as u64,
                "simulated OVS: no HELLO in time"
            );
            stats.hello_timeouts.fetch_add(1, Ordering::Relaxed);
            backoff.attempt_failed();
            return "no HELLO in time";
        }
        Ok(Some((h, _))) if h.msg_type == msg_type::HELLO => {}
        // Closed, or anything else before HELLO: a protocol error to vconn.
        Ok(_) => return "closed before HELLO",
    }
    stats.connected.fetch_add(1, Ordering::Relaxed);
    // S_ACTIVE / S_IDLE: answer the controller, probe when idle.
    let mut probe = Probe::new(Instant::now(), timing.inactivity_probe);
    loop {
        let until = match probe.poll(Instant::now()) {
            ProbeAction::Drop => {
                tracing::info!(dpid, "simulated OVS: no response to inactivity probe");
                stats.probe_timeouts.fetch_add(1, Ordering::Relaxed);
                return "no response to inactivity probe";
            }
            ProbeAction::SendEcho => {
                if !c.send(&build::echo_request(0, &[])).await {
                    return "closed (sending ECHO)";
                }
                continue;
            }
            ProbeAction::WaitUntil(t) => t,
        };
        let (h, bytes) =
            match tokio::time::timeout_at(tokio::time::Instant::from_std(until), c.recv()).await {
                Err(_) => continue,
                Ok(None) => return "closed by the switch agent",
                Ok(Some(m)) => m,
            };
        probe.activity(Instant::now());
        let reply = match h.msg_type {
            msg_type::FEATURES_REQUEST => Some(build::features_reply(h.xid, dpid)),
            msg_type::ECHO_REQUEST => Some(build::echo_reply(h.xid, &bytes[HEADER_LEN..])),
            msg_type::BARRIER_REQUEST => {
                Some(message(OFP13_VERSION, msg_type::BARRIER_REPLY, h.xid, &[]))
            }
            _ => None,
        };
        if let Some(r) = reply
            && !c.send(&r).await
        {
            return "closed (sending a reply)";
        }
    }
}
