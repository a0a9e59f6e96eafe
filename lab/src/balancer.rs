//! A QUIC-LB load balancer for the lab: one UDP address in front of several
//! controller agents (each its own host in a deployment, `--server-id`),
//! routing every datagram by the server id in its destination connection ID
//! (draft-ietf-quic-load-balancers, unencrypted configuration) and, when the
//! ID carries none, by the switch's address.
//!
//! What it is for: showing which deployments keep migration and 0-RTT when
//! several controller agents share one address (docs/scale.md), in
//! `lab/tests/quic_lb_e2e.rs` and by hand (`quicsdn-lab balance`). A
//! production balancer (a QUIC-LB capable one, or an eBPF/XDP program) does
//! the same routing without the per-flow sockets below.
//!
//! * [`Router`]: the routing decision, sans-IO (a datagram and its source in,
//!   a backend out), with unit tests.
//! * [`Balancer`]: a thin tokio driver. A real balancer forwards with the
//!   switch's address as the source (or by direct server return); a userspace
//!   one cannot, so it keeps one upstream socket per switch address (a flow)
//!   and the controller agent sees that socket's address as the switch's. A
//!   switch whose address changes gets a new flow, so the agent sees a new
//!   address too: the migration of RFC 9000 §9, as behind a NAT.

use anyhow::{Context, Result, bail};
use quicsdn_transport::quic_lb::{self, ServerId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// A flow (one switch address) with no datagram either way for this long is
/// forgotten; QUIC's keep-alives and OVS's echo keep live ones busy.
pub const FLOW_IDLE: Duration = Duration::from_secs(60);

/// Switch addresses with a flow at once: each holds a socket, so a sender
/// spraying source addresses must not take every file descriptor. Datagrams
/// from further new addresses are dropped until flows expire.
pub const MAX_FLOWS: usize = 16_384;

/// The largest UDP payload forwarded (QUIC's datagrams are far smaller).
const MAX_DATAGRAM: usize = 65_535;

/// One controller agent behind the balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub server_id: ServerId,
    pub addr: SocketAddr,
}

impl std::str::FromStr for Backend {
    type Err = anyhow::Error;

    /// `HEX=IP:PORT`, e.g. `0a=192.0.2.1:6653`.
    fn from_str(text: &str) -> Result<Backend> {
        let (id, addr) = text.split_once('=').with_context(|| {
            format!("{text:?}: expected SERVER_ID=IP:PORT, e.g. 0a=192.0.2.1:6653")
        })?;
        Ok(Backend {
            server_id: id.parse().map_err(|e| anyhow::anyhow!("{text:?}: {e}"))?,
            addr: addr
                .parse()
                .with_context(|| format!("{text:?}: {addr:?} is not IP:PORT"))?,
        })
    }
}

/// How a datagram was routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// By the server id in its destination connection ID.
    ServerId,
    /// By the switch's address: no routable ID (a client's Initial and
    /// 0-RTT packets carry an ID the client chose), or a server id that no
    /// backend has.
    Address,
}

/// The routing decision for one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Index into the backends.
    pub backend: usize,
    pub by: By,
}

/// The balancer's configuration and its routing decision.
#[derive(Debug, Clone)]
pub struct Router {
    backends: Vec<Backend>,
    server_id_len: usize,
}

impl Router {
    /// All server ids have one length (the configuration's) and are unique.
    pub fn new(backends: Vec<Backend>) -> Result<Router> {
        let Some(first) = backends.first() else {
            bail!("a balancer needs at least one backend");
        };
        let server_id_len = first.server_id.as_bytes().len();
        for (i, b) in backends.iter().enumerate() {
            if b.server_id.as_bytes().len() != server_id_len {
                bail!(
                    "server id {} is {} octets, {} is {}: one configuration has one server id length",
                    b.server_id,
                    b.server_id.as_bytes().len(),
                    first.server_id,
                    server_id_len
                );
            }
            if backends[..i].iter().any(|o| o.server_id == b.server_id) {
                bail!("server id {} is given twice", b.server_id);
            }
        }
        Ok(Router {
            backends,
            server_id_len,
        })
    }

    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// Where `datagram` from `from` goes.
    pub fn route(&self, datagram: &[u8], from: SocketAddr) -> Route {
        let by_id = destination_cid(datagram)
            .and_then(|cid| quic_lb::route(cid, self.server_id_len))
            // One configuration: the agents' codepoint.
            .filter(|(rotation, _)| *rotation == quicsdn_transport::reuseport::CONFIG_ROTATION)
            .and_then(|(_, id)| {
                self.backends
                    .iter()
                    .position(|b| b.server_id.as_bytes() == id)
            });
        match by_id {
            Some(backend) => Route {
                backend,
                by: By::ServerId,
            },
            None => Route {
                backend: self.by_address(from),
                by: By::Address,
            },
        }
    }

    /// The draft's "baseline fallback algorithm", which "takes only the
    /// 4-tuple as an input": a fixed hash of the switch's address (the
    /// balancer's own is the same for every datagram), the same backend for
    /// one address as long as the backends are the same.
    pub fn by_address(&self, from: SocketAddr) -> usize {
        // FNV-1a: fixed, so a test can predict it.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let ip = match from.ip() {
            std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
            std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        for b in ip.iter().chain(&from.port().to_be_bytes()) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        (h % self.backends.len() as u64) as usize
    }
}

/// The destination connection ID of a QUIC packet (RFC 9000 §17.2, §17.3):
/// a long header's is at octet 6, its length at octet 5; a short header's
/// starts at octet 1 and its length is not in the packet (everything after
/// octet 0 is returned: the QUIC-LB first octet self-describes the length).
fn destination_cid(datagram: &[u8]) -> Option<&[u8]> {
    let first = *datagram.first()?;
    if first & 0x80 == 0 {
        return datagram.get(1..);
    }
    let len = usize::from(*datagram.get(5)?);
    // RFC 9000 §17.2: "In QUIC version 1, this value MUST NOT exceed 20".
    if len > 20 {
        return None;
    }
    datagram.get(6..6 + len)
}

/// Datagrams forwarded to one backend, by how they were routed (not those
/// dropped for want of a flow).
#[derive(Debug, Default)]
pub struct BackendCounts {
    pub by_server_id: AtomicU64,
    pub by_address: AtomicU64,
}

/// A running balancer; stops when dropped.
pub struct Balancer {
    addr: SocketAddr,
    router: Arc<Router>,
    counts: Arc<Vec<BackendCounts>>,
    flows: Arc<Mutex<HashMap<SocketAddr, Flow>>>,
    task: JoinHandle<()>,
}

struct Flow {
    upstream: Arc<UdpSocket>,
    returning: JoinHandle<()>,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
        for (_, flow) in self.flows.lock().expect("flows").drain() {
            flow.returning.abort();
        }
    }
}

impl Balancer {
    /// Listens on `listen` and forwards to the router's backends.
    pub async fn start(listen: SocketAddr, router: Router) -> Result<Balancer> {
        Balancer::start_limited(listen, router, MAX_FLOWS).await
    }

    /// [`Balancer::start`] with at most `max_flows` switch addresses at once.
    pub async fn start_limited(
        listen: SocketAddr,
        router: Router,
        max_flows: usize,
    ) -> Result<Balancer> {
        let front = Arc::new(
            UdpSocket::bind(listen)
                .await
                .with_context(|| format!("cannot bind {listen}"))?,
        );
        let addr = front.local_addr()?;
        let counts = Arc::new(
            (0..router.backends.len())
                .map(|_| BackendCounts::default())
                .collect::<Vec<_>>(),
        );
        let router = Arc::new(router);
        let flows = Arc::new(Mutex::new(HashMap::new()));
        let task = tokio::spawn(forward(
            front,
            router.clone(),
            counts.clone(),
            flows.clone(),
            max_flows,
        ));
        Ok(Balancer {
            addr,
            router,
            counts,
            flows,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Datagrams forwarded to backend `i` so far: (by server id, by address).
    pub fn counts(&self, i: usize) -> (u64, u64) {
        let c = &self.counts[i];
        (
            c.by_server_id.load(Ordering::Relaxed),
            c.by_address.load(Ordering::Relaxed),
        )
    }

    /// The switch addresses with a flow.
    pub fn flows(&self) -> usize {
        self.flows.lock().expect("flows").len()
    }
}

/// Switch → agent: route each datagram and send it from the switch's flow.
async fn forward(
    front: Arc<UdpSocket>,
    router: Arc<Router>,
    counts: Arc<Vec<BackendCounts>>,
    flows: Arc<Mutex<HashMap<SocketAddr, Flow>>>,
    max_flows: usize,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut failing = false;
    loop {
        let (n, from) = match front.recv_from(&mut buf).await {
            Ok(r) => r,
            // ICMP errors surface here on Linux; one switch's is not fatal.
            Err(_) => continue,
        };
        let route = router.route(&buf[..n], from);
        let upstream = match flow_for(&front, &flows, &router, from, max_flows).await {
            Ok(u) => {
                failing = false;
                u
            }
            Err(e) => {
                // Once per run of failures, not once per datagram.
                if !failing {
                    eprintln!("balancer: no upstream socket for switch {from}: {e:#}");
                }
                failing = true;
                continue;
            }
        };
        let c = &counts[route.backend];
        match route.by {
            By::ServerId => c.by_server_id.fetch_add(1, Ordering::Relaxed),
            By::Address => c.by_address.fetch_add(1, Ordering::Relaxed),
        };
        // A backend that is down drops it, as on a real network.
        let _ = upstream
            .send_to(&buf[..n], router.backends[route.backend].addr)
            .await;
    }
}

/// The upstream socket of `from`'s flow, opened (with its return task) on
/// its first datagram.
async fn flow_for(
    front: &Arc<UdpSocket>,
    flows: &Arc<Mutex<HashMap<SocketAddr, Flow>>>,
    router: &Arc<Router>,
    from: SocketAddr,
    max_flows: usize,
) -> Result<Arc<UdpSocket>> {
    {
        let flows = flows.lock().expect("flows");
        if let Some(f) = flows.get(&from) {
            return Ok(f.upstream.clone());
        }
        if flows.len() >= max_flows {
            bail!("{max_flows} switch addresses have a flow already; dropped");
        }
    }
    let local = SocketAddr::new(front.local_addr()?.ip(), 0);
    let upstream = Arc::new(UdpSocket::bind(local).await?);
    let returning = tokio::spawn(give_back(
        front.clone(),
        upstream.clone(),
        router.clone(),
        flows.clone(),
        from,
    ));
    flows.lock().expect("flows").insert(
        from,
        Flow {
            upstream: upstream.clone(),
            returning,
        },
    );
    Ok(upstream)
}

/// Agent → switch for one flow, from the balancer's address, until the flow
/// is idle for [`FLOW_IDLE`] (then it is forgotten).
async fn give_back(
    front: Arc<UdpSocket>,
    upstream: Arc<UdpSocket>,
    router: Arc<Router>,
    flows: Arc<Mutex<HashMap<SocketAddr, Flow>>>,
    switch: SocketAddr,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        match tokio::time::timeout(FLOW_IDLE, upstream.recv_from(&mut buf)).await {
            Ok(Ok((n, from))) => {
                // Only the backends' datagrams go back to the switch.
                if router.backends.iter().any(|b| b.addr == from) {
                    let _ = front.send_to(&buf[..n], switch).await;
                }
            }
            // ICMP errors from a backend that is down: not fatal.
            Ok(Err(_)) => {}
            Err(_) => break,
        }
    }
    flows.lock().expect("flows").remove(&switch);
}

/// `quicsdn-lab balance`: a balancer by hand.
#[derive(clap::Args, Debug)]
pub struct BalanceArgs {
    /// UDP address the switch agents connect to (their `--controller`).
    #[arg(long, value_name = "IP:PORT")]
    pub listen: SocketAddr,
    /// A controller agent and its `--server-id`: `HEX=IP:PORT`, repeated (at
    /// least one; one server id length for all).
    #[arg(long = "backend", value_name = "HEX=IP:PORT", required = true)]
    pub backends: Vec<Backend>,
    /// Print each backend's datagram counts this often (0: never).
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    pub report: Duration,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let secs = text.strip_suffix('s').unwrap_or(text);
    secs.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("{text:?}: expected seconds, e.g. 10s"))
}

/// The next report, or never without reports.
async fn tick(report: &mut Option<tokio::time::Interval>) {
    match report {
        Some(r) => {
            r.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Runs a balancer until SIGINT or SIGTERM.
pub fn run(args: BalanceArgs) -> Result<()> {
    let router = Router::new(args.backends)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let lb = Balancer::start(args.listen, router).await?;
        println!("balancing on {} over:", lb.addr());
        for b in lb.router().backends() {
            println!("  server id {} -> {}", b.server_id, b.addr);
        }
        let (mut int, mut term) = (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        );
        let mut report = (!args.report.is_zero()).then(|| {
            tokio::time::interval_at(tokio::time::Instant::now() + args.report, args.report)
        });
        loop {
            tokio::select! {
                _ = int.recv() => break,
                _ = term.recv() => break,
                _ = tick(&mut report) => {
                    for (i, b) in lb.router().backends().iter().enumerate() {
                        let (by_id, by_addr) = lb.counts(i);
                        println!(
                            "{} ({}): {by_id} datagrams by server id, {by_addr} by address",
                            b.server_id, b.addr
                        );
                    }
                    println!("{} switch addresses", lb.flows());
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quicsdn_transport::quic_lb::ServerIdCidGenerator;
    use quinn_proto::ConnectionIdGenerator;

    fn router() -> Router {
        Router::new(vec![
            "0a=127.0.0.1:1".parse().unwrap(),
            "0b=127.0.0.1:2".parse().unwrap(),
            "0c=127.0.0.1:3".parse().unwrap(),
        ])
        .unwrap()
    }

    /// A connection ID as agent `host` (worker `worker`) issues it.
    fn cid(host: u8, worker: u8) -> Vec<u8> {
        let id = ServerId::new(&[host]).unwrap();
        let prefix = ServerId::prefix(Some(&id), worker);
        ServerIdCidGenerator::new(0, &prefix, 7)
            .unwrap()
            .generate_cid()
            .to_vec()
    }

    fn short(cid: &[u8]) -> Vec<u8> {
        let mut p = vec![0x41];
        p.extend_from_slice(cid);
        p.extend_from_slice(&[0x5a; 30]);
        p
    }

    fn long(dcid: &[u8]) -> Vec<u8> {
        let mut p = vec![0xe1, 0, 0, 0, 1, dcid.len() as u8];
        p.extend_from_slice(dcid);
        p.extend_from_slice(&[0; 31]);
        p
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 7], port))
    }

    #[test]
    fn a_connection_id_routes_to_its_agent_from_any_address() {
        let r = router();
        for (i, host) in [0x0a, 0x0b, 0x0c].into_iter().enumerate() {
            for worker in [0, 1] {
                let id = cid(host, worker);
                // The same connection before and after the switch's address
                // changed (a new port, a new IP): one agent.
                for from in [
                    addr(40_000),
                    addr(40_001),
                    "[2001:db8::1]:9".parse().unwrap(),
                ] {
                    for p in [short(&id), long(&id)] {
                        assert_eq!(
                            r.route(&p, from),
                            Route {
                                backend: i,
                                by: By::ServerId
                            }
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn what_carries_no_known_server_id_goes_by_address() {
        let r = router();
        // A client's Initial: an ID it chose (random, 8 to 20 octets).
        let initial = long(&[0x3c; 16]);
        // A server id no backend has, the unroutable codepoint, a foreign
        // config rotation, a short header too short for any ID.
        let unknown = short(&cid(0x0d, 0));
        let mut unroutable = cid(0x0a, 0);
        unroutable[0] |= 0b111 << 5;
        let mut rotated = cid(0x0a, 0);
        rotated[0] |= 0b001 << 5;
        for p in [
            initial,
            unknown,
            short(&unroutable),
            long(&rotated),
            vec![0x40, 0x12],
            long(&[0; 21]),
        ] {
            let from = addr(41_000);
            let route = r.route(&p, from);
            assert_eq!(route.by, By::Address, "{p:02x?}");
            assert_eq!(route.backend, r.by_address(from));
        }
        // The fallback spreads switch addresses over every backend and keeps
        // one address on one backend.
        let mut seen = [0usize; 3];
        for port in 50_000..50_300 {
            let b = r.by_address(addr(port));
            assert_eq!(b, r.by_address(addr(port)));
            seen[b] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }

    #[test]
    fn configurations_are_checked() {
        let e = Router::new(vec![]).unwrap_err().to_string();
        assert!(e.contains("at least one"), "{e}");
        let e = Router::new(vec![
            "0a=127.0.0.1:1".parse().unwrap(),
            "0a0b=127.0.0.1:2".parse().unwrap(),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("one server id length"), "{e}");
        let e = Router::new(vec![
            "0a=127.0.0.1:1".parse().unwrap(),
            "0a=127.0.0.1:2".parse().unwrap(),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("twice"), "{e}");
        for bad in ["0a", "zz=127.0.0.1:1", "0a=nowhere"] {
            assert!(bad.parse::<Backend>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn datagrams_reach_the_agent_their_id_names_and_replies_come_back() {
        let a = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let router = Router::new(vec![
            Backend {
                server_id: ServerId::new(&[0x0a]).unwrap(),
                addr: a.local_addr().unwrap(),
            },
            Backend {
                server_id: ServerId::new(&[0x0b]).unwrap(),
                addr: b.local_addr().unwrap(),
            },
        ])
        .unwrap();
        let lb = Balancer::start("127.0.0.1:0".parse().unwrap(), router)
            .await
            .unwrap();
        let switch = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut buf = [0u8; 2048];
        for (host, agent, i) in [(0x0a, &a, 0), (0x0b, &b, 1)] {
            let p = short(&cid(host, 0));
            switch.send_to(&p, lb.addr()).await.unwrap();
            let (n, seen_from) =
                tokio::time::timeout(Duration::from_secs(5), agent.recv_from(&mut buf))
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!(&buf[..n], &p[..]);
            assert_ne!(seen_from, switch.local_addr().unwrap(), "the flow's socket");
            assert_eq!(lb.counts(i).0, 1);
            // The agent's answer reaches the switch from the balancer's address.
            agent.send_to(b"answer", seen_from).await.unwrap();
            let (n, back_from) =
                tokio::time::timeout(Duration::from_secs(5), switch.recv_from(&mut buf))
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!((&buf[..n], back_from), (&b"answer"[..], lb.addr()));
        }
        assert_eq!(lb.flows(), 1, "one switch address, one flow");
    }

    /// The next datagram `agent` receives (within 5 s).
    async fn received(agent: &UdpSocket) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), agent.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        buf[..n].to_vec()
    }

    #[tokio::test]
    async fn switch_addresses_beyond_the_flow_limit_are_dropped_not_fatal() {
        let agent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let router = Router::new(vec![Backend {
            server_id: ServerId::new(&[0x0a]).unwrap(),
            addr: agent.local_addr().unwrap(),
        }])
        .unwrap();
        let lb = Balancer::start_limited("127.0.0.1:0".parse().unwrap(), router, 1)
            .await
            .unwrap();
        let first = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let second = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        first.send_to(b"one", lb.addr()).await.unwrap();
        assert_eq!(received(&agent).await, b"one");
        // The balancer handles datagrams in order: once "three" arrives,
        // "two" (from a second address, past the limit) was dropped.
        second.send_to(b"two", lb.addr()).await.unwrap();
        first.send_to(b"three", lb.addr()).await.unwrap();
        assert_eq!(received(&agent).await, b"three");
        assert_eq!(lb.flows(), 1);
        assert_eq!(lb.counts(0), (0, 2), "the dropped one is not counted");
    }
}
