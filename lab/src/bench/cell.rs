//! One measurement: a fresh [`Pair`] with one transport and one link setting, the
//! synthetic programs connected over it (one connection per service), the link's
//! counters zeroed once every connection is up, every message of the schedules
//! sent and received, a settling interval for the last ACKs, then the counters.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::bench::pair::{BenchTransport, DirCount, Pair, PairSpec};
use crate::bench::synth::{self, EndReport, Schedule, Service};
use crate::emulator::{Accounting, DirSettings, sys};

/// The paper's convention: 28 bytes of Ethernet and physical headers per frame on
/// top of the IP packet (Table 1: `H_EP`): 14-byte Ethernet header + 14 more for
/// preamble, FCS and gap. The emulator's frame bytes include the 14-byte Ethernet
/// header, so 14 is added per frame.
pub fn paper_accounting() -> Accounting {
    Accounting {
        phy_overhead: 14,
        pad_to_min_frame: false,
    }
}

/// Direction of a message flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Dir {
    /// Switch to controller.
    SwToCtl,
    /// Controller to switch.
    CtlToSw,
}

impl Dir {
    pub const BOTH: [Dir; 2] = [Dir::SwToCtl, Dir::CtlToSw];
    pub fn name(self) -> &'static str {
        match self {
            Dir::SwToCtl => "sw->ctl",
            Dir::CtlToSw => "ctl->sw",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CellSpec {
    pub prefix: String,
    pub transport: BenchTransport,
    pub link: DirSettings,
    /// The link's loss seed: see [`PairSpec::link_seed`].
    pub link_seed: Option<u64>,
    /// What each side sends on each service.
    pub schedules: BTreeMap<(Dir, ServiceKey), Schedule>,
    /// Wait after the last message arrived before reading the counters.
    pub settle: Duration,
    /// Give up on a cell after this long.
    pub timeout: Duration,
    pub agent_args: Vec<String>,
    pub dir: PathBuf,
}

/// [`Service`] as an ordered map key.
pub type ServiceKey = u8;
pub fn key(s: Service) -> ServiceKey {
    match s {
        Service::OpenFlow => 0,
        Service::Ovsdb => 1,
    }
}

/// What one cell measured.
#[derive(Debug, Clone)]
pub struct CellResult {
    pub sw_to_ctl: DirCount,
    pub ctl_to_sw: DirCount,
    /// What each (sending direction, service) flow sent, and what arrived.
    pub flows: BTreeMap<(Dir, ServiceKey), FlowResult>,
}

#[derive(Debug, Clone, Default)]
pub struct FlowResult {
    pub sent: u64,
    pub sent_bytes: u64,
    pub send_span: f64,
    pub received: Vec<synth::Received>,
    pub received_bytes: u64,
    /// `udp-seed` only (lossy): duplicates dropped by the receiving program.
    pub duplicates: u64,
    /// Messages that arrived after one sent later than them.
    pub out_of_order: u64,
}

impl FlowResult {
    /// Messages sent and never received (only `udp-seed` may lose any).
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received.len() as u64)
    }
}

impl CellResult {
    pub fn wire(&self, d: Dir) -> &DirCount {
        match d {
            Dir::SwToCtl => &self.sw_to_ctl,
            Dir::CtlToSw => &self.ctl_to_sw,
        }
    }

    /// Application bytes sent in direction `d` (all services).
    pub fn payload(&self, d: Dir) -> u64 {
        self.flows
            .iter()
            .filter(|((fd, _), _)| *fd == d)
            .map(|(_, f)| f.sent_bytes)
            .sum()
    }

    pub fn messages(&self, d: Dir) -> u64 {
        self.flows
            .iter()
            .filter(|((fd, _), _)| *fd == d)
            .map(|(_, f)| f.sent)
            .sum()
    }

    pub fn delivered(&self, d: Dir) -> u64 {
        self.flows
            .iter()
            .filter(|((fd, _), _)| *fd == d)
            .map(|(_, f)| f.received.len() as u64)
            .sum()
    }

    /// Messages per second actually generated in direction `d` (all services).
    pub fn achieved_rate(&self, d: Dir) -> f64 {
        let span = self
            .flows
            .iter()
            .filter(|((fd, _), _)| *fd == d)
            .map(|(_, f)| f.send_span)
            .fold(0.0, f64::max);
        if span > 0.0 {
            self.messages(d) as f64 / span
        } else {
            0.0
        }
    }
}

fn service(k: ServiceKey) -> Service {
    if k == 0 {
        Service::OpenFlow
    } else {
        Service::Ovsdb
    }
}

type EndHandle = std::thread::JoinHandle<Result<EndReport>>;

/// One end's thread once `setup` has made its connection: tells `ready` how
/// setup went, waits for the common start, sends `send` and expects `expect`
/// messages of `svc` (with `lossy`, whatever arrives), and tells `done` of a
/// failure.
fn run_side(
    setup: impl FnOnce() -> Result<(synth::Reader, synth::Writer)>,
    ready: mpsc::Sender<Result<()>>,
    start_rx: mpsc::Receiver<Instant>,
    (svc, sender, send, expect, lossy): (
        Service,
        synth::Sender,
        Schedule,
        u64,
        Option<synth::Lossy>,
    ),
    stop: Arc<AtomicBool>,
    done: mpsc::Sender<Result<(), String>>,
) -> Result<EndReport> {
    let (rd, wr) = match setup() {
        Ok(v) => {
            let _ = ready.send(Ok(()));
            v
        }
        Err(e) => {
            let _ = ready.send(Err(anyhow!("{e:#}")));
            return Err(e);
        }
    };
    let start = start_rx.recv().map_err(|_| anyhow!("no start"))?;
    let ctl = synth::EndControl {
        start,
        sender,
        lossy,
        stop,
        done: done.clone(),
    };
    let end = match sender {
        synth::Sender::Controller => "controller",
        synth::Sender::Switch => "switch",
    };
    let r = synth::run_end(svc, rd, wr, send, expect, ctl)
        .with_context(|| format!("the {end} program's {} connection", svc.name()));
    if let Err(e) = &r {
        let _ = done.send(Err(format!("{e:#}")));
    }
    r
}

/// `udp-seed` may lose messages: its receivers stop 6 s (longer than seed's
/// 4 s of retransmissions, plus the path) after the peer's schedule ended and
/// nothing more arrived.
fn lossy_for(spec: &CellSpec, peer: &Schedule) -> Option<synth::Lossy> {
    (spec.transport == BenchTransport::UdpSeed).then(|| synth::Lossy {
        peer_until: peer.at.last().copied().unwrap_or_default(),
        quiet: Duration::from_secs(6),
    })
}

/// Runs one cell. Fails if any message is lost, duplicated or malformed.
pub fn run(spec: &CellSpec) -> Result<CellResult> {
    let mut pair = Pair::up(&PairSpec {
        prefix: spec.prefix.clone(),
        transport: spec.transport,
        link: spec.link.clone(),
        link_seed: spec.link_seed,
        agent_args: spec.agent_args.clone(),
        dir: spec.dir.clone(),
    })
    .with_context(|| format!("bringing up {} for {}", spec.prefix, spec.transport))?;
    let result = run_on(&mut pair, spec);
    drop(pair);
    result
}

fn run_on(pair: &mut Pair, spec: &CellSpec) -> Result<CellResult> {
    let services: Vec<Service> = Service::BOTH
        .into_iter()
        .filter(|s| {
            Dir::BOTH
                .iter()
                .any(|d| spec.schedules.contains_key(&(*d, key(*s))))
        })
        .collect();
    let empty = Schedule {
        sizes: vec![100],
        at: Vec::new(),
    };
    let sched = |d: Dir, s: Service| spec.schedules.get(&(d, key(s))).unwrap_or(&empty).clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel::<Result<(), String>>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let mut starts: Vec<mpsc::Sender<Instant>> = Vec::new();
    let mut handles: Vec<((Dir, ServiceKey), EndHandle)> = Vec::new();
    let (tls_server, tls_client) = pair.tls();
    let connect_timeout = Duration::from_secs(20);

    for svc in &services {
        let svc = *svc;
        // Controller side: listen, accept, (TLS), wait for the start.
        let (start_tx, start_rx) = mpsc::channel::<Instant>();
        starts.push(start_tx);
        let (listening_tx, listening_rx) = mpsc::channel::<Result<()>>();
        let ctl_ns = pair.ctl.name.clone();
        let addr = pair.ctl_listen(svc);
        let tls = tls_server.clone();
        let (send, expect) = (sched(Dir::CtlToSw, svc), sched(Dir::SwToCtl, svc).count());
        let lossy = lossy_for(spec, &sched(Dir::SwToCtl, svc));
        let (stop2, done2, ready2) = (stop.clone(), done_tx.clone(), ready_tx.clone());
        let h = std::thread::spawn(move || -> Result<EndReport> {
            let setup = || -> Result<_> {
                sys::enter_netns(&ctl_ns)?;
                let l = std::net::TcpListener::bind(addr)
                    .with_context(|| format!("listening on {addr}"))?;
                let _ = listening_tx.send(Ok(()));
                let s = synth::accept_one(&l, connect_timeout)?;
                synth::split(s, tls.as_ref())
            };
            run_side(
                setup,
                ready2,
                start_rx,
                (svc, synth::Sender::Controller, send, expect, lossy),
                stop2,
                done2,
            )
        });
        handles.push(((Dir::CtlToSw, key(svc)), h));
        listening_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| anyhow!("the controller program did not start listening"))??;

        // Switch side: connect, (TLS), wait for the start.
        let (start_tx, start_rx) = mpsc::channel::<Instant>();
        starts.push(start_tx);
        let sw_ns = pair.sw.name.clone();
        let addr = pair.sw_connect(svc);
        let tls = tls_client.clone();
        let (send, expect) = (sched(Dir::SwToCtl, svc), sched(Dir::CtlToSw, svc).count());
        let lossy = lossy_for(spec, &sched(Dir::CtlToSw, svc));
        let (stop2, done2, ready2) = (stop.clone(), done_tx.clone(), ready_tx.clone());
        let h = std::thread::spawn(move || -> Result<EndReport> {
            let setup = || -> Result<_> {
                sys::enter_netns(&sw_ns)?;
                let s = synth::connect(addr, connect_timeout)?;
                synth::split(s, tls.as_ref())
            };
            run_side(
                setup,
                ready2,
                start_rx,
                (svc, synth::Sender::Switch, send, expect, lossy),
                stop2,
                done2,
            )
        });
        handles.push(((Dir::SwToCtl, key(svc)), h));
    }
    drop(done_tx);
    drop(ready_tx);

    let outcome = (|| -> Result<(DirCount, DirCount)> {
        for _ in 0..handles.len() {
            ready_rx
                .recv_timeout(connect_timeout + Duration::from_secs(5))
                .map_err(|_| anyhow!("the programs did not connect"))??;
        }
        // Every connection is up end to end: count from here.
        pair.reset_counters()?;
        let start = Instant::now() + Duration::from_millis(20);
        for s in &starts {
            let _ = s.send(start);
        }
        let deadline = Instant::now() + spec.timeout;
        for _ in 0..handles.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => bail!("{e}\n{}", pair.log_tails(15)),
                Err(_) => {
                    pair.check_alive()?;
                    bail!("not every message arrived within {:?}", spec.timeout);
                }
            }
        }
        // A measurement interval, not a readiness check: the last ACKs and any
        // retransmissions still cross the link.
        std::thread::sleep(spec.settle);
        pair.check_alive()?;
        let (ctl_to_sw, sw_to_ctl) = pair.counters(&paper_accounting())?;
        Ok((sw_to_ctl, ctl_to_sw))
    })();
    stop.store(true, Ordering::Relaxed);
    // Unblock ends still waiting for their start or their peer.
    drop(starts);
    if outcome.is_err() {
        // Threads blocked in reads are released when the pair's processes and
        // namespaces go away; do not wait for them.
        return Err(outcome.expect_err("checked"));
    }
    let (sw_to_ctl, ctl_to_sw) = outcome?;
    let mut flows = BTreeMap::new();
    for ((d, k), h) in handles {
        let rep = h.join().map_err(|_| anyhow!("an end panicked"))??;
        let f = flows.entry((d, k)).or_insert_with(FlowResult::default);
        f.sent = rep.sent;
        f.sent_bytes = rep.sent_bytes;
        f.send_span = rep.send_span;
        // What this end received was sent in the other direction.
        let other = match d {
            Dir::SwToCtl => Dir::CtlToSw,
            Dir::CtlToSw => Dir::SwToCtl,
        };
        let g = flows.entry((other, k)).or_insert_with(FlowResult::default);
        g.received = rep.received;
        g.received_bytes = rep.received_bytes;
        g.duplicates = rep.duplicates;
        g.out_of_order = rep.out_of_order;
    }
    let r = CellResult {
        sw_to_ctl,
        ctl_to_sw,
        flows,
    };
    for ((d, k), f) in &r.flows {
        let lossy = spec.transport == BenchTransport::UdpSeed;
        // udp-seed may lose messages (the paper's mechanism gives up after 3
        // retransmissions); what arrived must still be a subset of what was sent.
        let short = f.received.len() as u64 > f.sent || f.received_bytes > f.sent_bytes;
        if lossy && !short {
            continue;
        }
        if f.received.len() as u64 != f.sent || f.received_bytes != f.sent_bytes {
            bail!(
                "{} {}: sent {} messages ({} B), received {} ({} B)",
                d.name(),
                service(*k).name(),
                f.sent,
                f.sent_bytes,
                f.received.len(),
                f.received_bytes
            );
        }
    }
    Ok(r)
}
