//! The forwarder process: the thin I/O glue around two [`Pipe`]s.
//!
//! One single-threaded process per link. It attaches to the link's two persistent TAP
//! devices (entering each namespace with `setns` just long enough to open the TAP), then
//! runs one epoll loop over: both TAP fds, a `CLOCK_MONOTONIC` timerfd armed with the
//! earliest release time (absolute, so no drift and no 1 ms epoll rounding; early by the
//! host's measured wake-up lateness, see [`super::wake`]), the control socket, and a
//! signalfd for SIGTERM/SIGINT/SIGHUP.
//!
//! Each wake-up: read up to [`BATCH`] frames from each readable TAP into pooled buffers
//! (timestamped individually), offer them to the model, then write every frame whose
//! release time has passed to the other TAP. Buffers come from a free list that only grows
//! (bounded by `max_in_flight`), so the steady state allocates nothing per frame.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::control::{DirState, LinkState, Request, Response};
use super::link::LinkSpec;
use super::model::{Pipe, Verdict};
use super::nat::{Nat, Side};
use super::rng::Xoshiro256pp;
use super::sys::{self, Epoll, TimerFd};
use super::wake::WakePlanner;

/// Frames read from one TAP per wake-up before servicing releases and the other TAP.
pub const BATCH: usize = 64;

const TOK_TAP: [u64; 2] = [0, 1];
const TOK_TIMER: u64 = 2;
const TOK_LISTEN: u64 = 3;
const TOK_SIGNAL: u64 = 4;
const TOK_CONN0: u64 = 16;

struct Pool {
    bufs: Vec<Box<[u8]>>,
    lens: Vec<u32>,
    free: Vec<u32>,
    size: usize,
}

impl Pool {
    fn new(size: usize, prealloc: usize) -> Self {
        let mut p = Pool {
            bufs: Vec::new(),
            lens: Vec::new(),
            free: Vec::new(),
            size,
        };
        for _ in 0..prealloc {
            let t = p.grow();
            p.free.push(t);
        }
        p
    }

    fn grow(&mut self) -> u32 {
        self.bufs.push(vec![0u8; self.size].into_boxed_slice());
        self.lens.push(0);
        (self.bufs.len() - 1) as u32
    }

    #[inline]
    fn get(&mut self) -> u32 {
        match self.free.pop() {
            Some(t) => t,
            None => self.grow(),
        }
    }

    #[inline]
    fn put(&mut self, t: u32) {
        self.free.push(t);
    }
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
}

struct Forwarder {
    spec: LinkSpec,
    seed: u64,
    taps: [OwnedFd; 2],
    /// pipes[0]: a -> b (read from tap a, written to tap b); pipes[1]: b -> a.
    pipes: [Pipe<Xoshiro256pp>; 2],
    pools: [Pool; 2],
    counting_since: u64,
    /// A NAT at one end: it translates frames read from that end's TAP and
    /// frames about to be written to it.
    nat: Option<Nat>,
}

/// The NAT, if there is one and it sits at the end of `taps[tap]`.
fn nat_at(nat: &mut Option<Nat>, tap: usize) -> Option<&mut Nat> {
    let at = match nat.as_ref()?.settings().inside {
        Side::A => 0,
        Side::B => 1,
    };
    nat.as_mut().filter(|_| at == tap)
}

/// Runs the forwarder for `spec` until a signal or a `shutdown` request. Prints `ready`
/// on stdout once both TAPs are attached and the control socket listens.
pub fn run(spec: LinkSpec) -> Result<()> {
    spec.validate()?;
    let l = spec.name.clone();
    sys::set_min_timer_slack();
    if spec.realtime
        && let Err(e) = sys::set_realtime(10)
    {
        eprintln!(
            "link {l}: warning: SCHED_FIFO not available ({e}); release times may slip under load"
        );
    }
    let home = sys::current_netns().with_context(|| format!("link {l}: reading own netns"))?;
    let attach = |ns: &str, tap: &str| -> Result<OwnedFd> {
        sys::enter_netns(ns).with_context(|| {
            format!(
                "link {l}: entering namespace {ns} ({})",
                sys::netns_path(ns).display()
            )
        })?;
        sys::open_tap(tap).with_context(|| {
            format!("link {l}: namespace {ns}: attaching to TAP {tap} (does it exist? created by `emulate up`?)")
        })
    };
    let tap_a = attach(&spec.ns_a, &spec.tap_a)?;
    let tap_b = attach(&spec.ns_b, &spec.tap_b)?;
    sys::enter_netns_fd(home.as_raw_fd())
        .with_context(|| format!("link {l}: returning to own netns"))?;
    drop(home);

    let listener = bind_control(&spec)?;
    listener.set_nonblocking(true)?;
    let sigfd = sys::termination_signalfd()?;
    let mut timer = TimerFd::new()?;
    let mut wake = WakePlanner::new();
    let epoll = Epoll::new()?;
    epoll.add(tap_a.as_raw_fd(), TOK_TAP[0])?;
    epoll.add(tap_b.as_raw_fd(), TOK_TAP[1])?;
    epoll.add(timer.fd(), TOK_TIMER)?;
    epoll.add(listener.as_raw_fd(), TOK_LISTEN)?;
    epoll.add(sigfd.as_raw_fd(), TOK_SIGNAL)?;

    let seed = spec.seed.unwrap_or_else(Xoshiro256pp::entropy_seed);
    let cfg = spec.pipe_config();
    let buf_size = (spec.mtu as usize + 64).next_power_of_two();
    let mut fw = Forwarder {
        seed,
        pipes: [
            Pipe::new(
                spec.a_to_b.clone(),
                cfg.clone(),
                Xoshiro256pp::seed_from_u64(seed),
            ),
            Pipe::new(
                spec.b_to_a.clone(),
                cfg,
                Xoshiro256pp::seed_from_u64(seed ^ 0x5bd1_e995_0000_0001),
            ),
        ],
        pools: [Pool::new(buf_size, 256), Pool::new(buf_size, 256)],
        taps: [tap_a, tap_b],
        counting_since: sys::monotonic_ns(),
        nat: None,
        spec,
    };
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 32];

    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    eprintln!(
        "link {l}: forwarding {}:{} <-> {}:{} (pid {}, seed {seed})",
        fw.spec.ns_a,
        fw.spec.tap_a,
        fw.spec.ns_b,
        fw.spec.tap_b,
        std::process::id()
    );

    let mut shutdown = false;
    while !shutdown {
        fw.release_due();
        let next = match (fw.pipes[0].next_release(), fw.pipes[1].next_release()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        timer
            .arm(wake.plan(sys::monotonic_ns(), next))
            .context("arming timerfd")?;
        let n = epoll.wait(&mut events, true).context("epoll_wait")?;
        for ev in &events[..n] {
            let token = ev.u64;
            match token {
                t if t == TOK_TAP[0] || t == TOK_TAP[1] => {
                    if let Err(e) = fw.read_batch(t as usize) {
                        let (ns, tap) = if t == 0 {
                            (&fw.spec.ns_a, &fw.spec.tap_a)
                        } else {
                            (&fw.spec.ns_b, &fw.spec.tap_b)
                        };
                        eprintln!("link {l}: namespace {ns}: TAP {tap} failed ({e}); exiting");
                        shutdown = true;
                    }
                }
                TOK_TIMER => {
                    wake.on_timer(sys::monotonic_ns());
                    timer.ack();
                }
                TOK_LISTEN => accept_all(&listener, &epoll, &mut conns),
                TOK_SIGNAL => {
                    eprintln!("link {l}: signal received, exiting");
                    shutdown = true;
                }
                t => {
                    let i = (t - TOK_CONN0) as usize;
                    if let Some(done) = fw.service_conn(&mut conns[i]) {
                        if let Some(c) = conns[i].take() {
                            epoll.delete(c.stream.as_raw_fd());
                        }
                        shutdown |= done;
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_file(fw.spec.ctl_path());
    Ok(())
}

fn bind_control(spec: &LinkSpec) -> Result<UnixListener> {
    let l = &spec.name;
    let path = spec.ctl_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("link {l}: creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            bail!(
                "link {l}: another forwarder already serves {}; stop it first",
                path.display()
            );
        }
        // Stale socket of a crashed forwarder.
        std::fs::remove_file(&path)
            .with_context(|| format!("link {l}: removing stale {}", path.display()))?;
    }
    UnixListener::bind(&path)
        .with_context(|| format!("link {l}: binding control socket {}", path.display()))
}

fn accept_all(listener: &UnixListener, epoll: &Epoll, conns: &mut Vec<Option<Conn>>) {
    while let Ok((stream, _)) = listener.accept() {
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let slot = match conns.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                conns.push(None);
                conns.len() - 1
            }
        };
        if epoll
            .add(stream.as_raw_fd(), TOK_CONN0 + slot as u64)
            .is_ok()
        {
            conns[slot] = Some(Conn {
                stream,
                buf: Vec::new(),
            });
        }
    }
}

impl Forwarder {
    /// Reads up to [`BATCH`] frames. `Err` means the TAP is gone (deleted, or its
    /// namespace removed): the link is dead, and level-triggered epoll would otherwise
    /// report the error forever.
    fn read_batch(&mut self, dir: usize) -> std::io::Result<()> {
        let fd: RawFd = self.taps[dir].as_raw_fd();
        let pool = &mut self.pools[dir];
        let pipe = &mut self.pipes[dir];
        let mut nat = nat_at(&mut self.nat, dir);
        for _ in 0..BATCH {
            let t = pool.get();
            let buf = &mut pool.bufs[t as usize];
            match sys::read(fd, buf) {
                Ok(n) if n > 0 => {
                    if let Some(nat) = nat.as_mut()
                        && !nat.outbound(&mut buf[..n])
                    {
                        pool.put(t);
                        continue;
                    }
                    pool.lens[t as usize] = n as u32;
                    let now = sys::monotonic_ns();
                    match pipe.offer(now, &buf[..n], t) {
                        Verdict::Scheduled { .. } => {}
                        _ => pool.put(t),
                    }
                }
                Ok(_) => {
                    pool.put(t);
                    break;
                }
                Err(e) => {
                    pool.put(t);
                    return match e.kind() {
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(()),
                        _ => Err(e),
                    };
                }
            }
        }
        Ok(())
    }

    fn release_due(&mut self) {
        let now = sys::monotonic_ns();
        for dir in 0..2 {
            let out: RawFd = self.taps[1 - dir].as_raw_fd();
            let mut nat = nat_at(&mut self.nat, 1 - dir);
            while let Some(r) = self.pipes[dir].poll_release(now) {
                let pool = &mut self.pools[dir];
                let len = pool.lens[r.token as usize] as usize;
                let frame = &mut pool.bufs[r.token as usize][..len];
                // The link delivered it; the NAT at the receiving end may still drop it.
                if r.deliver && nat.as_mut().is_none_or(|n| n.inbound(frame)) {
                    match sys::write(out, frame) {
                        Ok(n) if n == len => {}
                        _ => self.pipes[dir].note_tx_error(&r),
                    }
                }
                pool.put(r.token);
            }
        }
    }

    fn state(&self) -> LinkState {
        let dir = |p: &Pipe<Xoshiro256pp>| DirState {
            settings: p.settings().clone(),
            in_flight: p.in_flight() as u64,
            counters: *p.counters(),
        };
        LinkState {
            name: self.spec.name.clone(),
            pid: std::process::id(),
            ns_a: self.spec.ns_a.clone(),
            ns_b: self.spec.ns_b.clone(),
            tap_a: self.spec.tap_a.clone(),
            tap_b: self.spec.tap_b.clone(),
            phy_overhead: self.spec.phy_overhead,
            quic_port: self.spec.quic_port,
            seed: self.seed,
            counting_ns: sys::monotonic_ns() - self.counting_since,
            a_to_b: dir(&self.pipes[0]),
            b_to_a: dir(&self.pipes[1]),
            nat: self.nat.as_ref().map(Nat::state),
        }
    }

    fn handle(&mut self, req: Request) -> (Response, bool) {
        let ok = |s: &Self| Response {
            ok: true,
            error: None,
            state: Some(s.state()),
        };
        match req {
            Request::Show => (ok(self), false),
            Request::Set { a_to_b, b_to_a } => {
                let new: Vec<_> = [a_to_b, b_to_a]
                    .iter()
                    .zip(&self.pipes)
                    .map(|(p, pipe)| p.as_ref().map(|p| p.apply(pipe.settings())))
                    .collect();
                for (s, name) in new.iter().zip(["a_to_b", "b_to_a"]) {
                    if let Some(s) = s
                        && let Err(e) = s.validate()
                    {
                        let msg = format!("link {}: {name}: {e}", self.spec.name);
                        return (
                            Response {
                                ok: false,
                                error: Some(msg),
                                state: None,
                            },
                            false,
                        );
                    }
                }
                for (dir, s) in new.into_iter().enumerate() {
                    if let Some(s) = s {
                        eprintln!(
                            "link {}: {} now: {}",
                            self.spec.name,
                            ["a_to_b", "b_to_a"][dir],
                            s.summary()
                        );
                        self.pipes[dir].set_settings(s);
                    }
                }
                (ok(self), false)
            }
            Request::Nat { settings } => {
                match settings {
                    Some(s) => eprintln!(
                        "link {}: NAT at side {:?}, outside ports from {} (no mappings yet)",
                        self.spec.name, s.inside, s.first_port
                    ),
                    None => eprintln!("link {}: NAT removed", self.spec.name),
                }
                self.nat = settings.map(Nat::new);
                (ok(self), false)
            }
            Request::ResetCounters => {
                for p in &mut self.pipes {
                    p.reset_counters();
                }
                self.counting_since = sys::monotonic_ns();
                (ok(self), false)
            }
            Request::Shutdown => {
                eprintln!("link {}: shutdown requested", self.spec.name);
                (ok(self), true)
            }
        }
    }

    /// Reads what is available; once a full line is in, answers and returns
    /// `Some(shutdown)` (the connection is finished). `None`: keep waiting.
    fn service_conn(&mut self, slot: &mut Option<Conn>) -> Option<bool> {
        let conn = slot.as_mut()?;
        let mut chunk = [0u8; 4096];
        loop {
            match conn.stream.read(&mut chunk) {
                Ok(0) => return Some(false),
                Ok(n) => {
                    conn.buf.extend_from_slice(&chunk[..n]);
                    if conn.buf.len() > 1 << 20 {
                        return Some(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return Some(false),
            }
        }
        let end = conn.buf.iter().position(|&b| b == b'\n')?;
        let (resp, shutdown) = match serde_json::from_slice::<Request>(&conn.buf[..end]) {
            Ok(req) => self.handle(req),
            Err(e) => (
                Response {
                    ok: false,
                    error: Some(format!("link {}: bad request: {e}", self.spec.name)),
                    state: None,
                },
                false,
            ),
        };
        let mut out = serde_json::to_vec(&resp).unwrap_or_default();
        out.push(b'\n');
        // The answer is small; a bounded blocking write keeps the loop simple.
        let _ = conn.stream.set_nonblocking(false);
        let _ = conn
            .stream
            .set_write_timeout(Some(Duration::from_millis(500)));
        let _ = conn.stream.write_all(&out);
        Some(shutdown)
    }
}
