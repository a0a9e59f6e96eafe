//! A simulated line of engines on a virtual clock (tests only): edge A, relay
//! engines, edge B, with links that lose, duplicate, delay and reorder, and
//! two hosts that write and read stream bytes. Deterministic for a seed.

use crate::conn::{ConnEvent, ConnId, Edge, EdgeConfig, Output};
use crate::engine::Engine;
use crate::ipv4::{self, UdpHeader};
use crate::msg::{Control, Direction, FlowKey, RefuseReason, TcpOptions};
use bytes::Bytes;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// xorshift64*: a tiny deterministic generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub loss: f64,
    pub dup: f64,
    pub delay: Duration,
    /// Extra random delay up to this: reorders datagrams.
    pub jitter: Duration,
}

impl Link {
    pub fn clean(delay: Duration) -> Link {
        Link {
            loss: 0.0,
            dup: 0.0,
            delay,
            jitter: Duration::ZERO,
        }
    }
}

/// Rate-limited sending ports (see [`Sim::ports`]).
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub bits_per_second: u64,
    /// Most bytes waiting in one port's queue; more are dropped (drop-tail).
    pub queue_bytes: u64,
}

/// What travels on a simulated link: wire bytes, decoded on arrival.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Wire {
    /// An IPv4/UDP datagram (the ID carries the sequence number).
    Data(Vec<u8>),
    Control(Vec<u8>),
}

/// On the wire: (arrival, order, from node, to node, message).
type InFlight = (Instant, u64, usize, usize, Wire);

/// What a drop filter sees: (now, from node, to node, the message).
pub type DropFilter = Box<dyn FnMut(Instant, usize, usize, &Wire) -> bool>;

pub enum Node {
    Edge(Edge),
    Relay(Engine),
}

/// How the receiving host reads.
#[derive(Debug, Clone, Copy)]
pub struct Reader {
    /// Bytes read per read (None: everything waiting).
    pub chunk: Option<usize>,
    /// Time between reads.
    pub interval: Duration,
}

/// A further connection, opened beside the main one: A sends `data` and
/// closes; B reads everything and closes after A.
pub struct Pair {
    pub client_port: u16,
    pub data: Vec<u8>,
    pub written: usize,
    pub a_id: Option<ConnId>,
    pub b_id: Option<ConnId>,
    pub a_events: Vec<ConnEvent>,
    pub b_events: Vec<ConnEvent>,
    pub at_b: Vec<u8>,
    a_fin: bool,
    b_fin: bool,
}

pub struct Sim {
    pub now: Instant,
    pub start: Instant,
    /// 0 = edge A, last = edge B.
    pub nodes: Vec<Node>,
    /// links[i] joins nodes i and i+1 (both directions alike).
    pub links: Vec<Link>,
    pub rng: Rng,
    wire: BinaryHeap<Reverse<InFlight>>,
    order: u64,
    pub drop_if: Option<DropFilter>,
    /// Every sending port a drop-tail queue drained at a rate, as a switch
    /// port or the lab's emulated link is; `None`: links of unlimited rate.
    pub ports: Option<Ports>,
    /// When each direction's port (from, to) is next idle.
    port_busy: std::collections::HashMap<(usize, usize), Instant>,
    /// Datagrams the ports' queues dropped.
    pub port_drops: u64,
    pub a_flow: FlowKey,
    /// Host A's bytes to send, and how much it wrote.
    pub a_data: Vec<u8>,
    pub a_written: usize,
    /// Host A writes at most this many bytes per write, one write per interval.
    pub a_write: usize,
    pub a_interval: Duration,
    a_next_write: Instant,
    pub a_fin: bool,
    /// Host A closes (FIN) once it wrote everything.
    pub a_close: bool,
    /// Host B's bytes back to A (may be empty).
    pub b_data: Vec<u8>,
    pub b_written: usize,
    pub b_fin: bool,
    pub reader: Reader,
    b_next_read: Instant,
    pub refuse: Option<RefuseReason>,
    pub a_conn: Option<ConnId>,
    pub b_conn: Option<ConnId>,
    pub a_events: Vec<ConnEvent>,
    pub b_events: Vec<ConnEvent>,
    pub at_b: Vec<u8>,
    pub at_a: Vec<u8>,
    /// When host B had read all of host A's bytes.
    pub b_all_at: Option<Duration>,
    /// Most datagrams any relay held for one flow, and any edge's sender.
    pub max_edge_held: usize,
    /// Data datagrams that crossed each link (either direction), controls too.
    pub data_on_link: Vec<u64>,
    pub control_on_link: Vec<u64>,
    pub pairs: Vec<Pair>,
}

pub const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 254);
pub const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 5, 254);

impl Sim {
    pub fn new(relays: usize, link: Link, cfg: EdgeConfig, seed: u64) -> Sim {
        let start = Instant::now();
        let mut nodes = vec![Node::Edge(Edge::new(cfg.clone()))];
        for _ in 0..relays {
            nodes.push(Node::Relay(Engine::new(cfg.hop.clone())));
        }
        nodes.push(Node::Edge(Edge::new(cfg)));
        Sim {
            now: start,
            start,
            links: vec![link; relays + 1],
            nodes,
            rng: Rng(seed | 1),
            wire: BinaryHeap::new(),
            order: 0,
            drop_if: None,
            ports: None,
            port_busy: std::collections::HashMap::new(),
            port_drops: 0,
            a_flow: FlowKey {
                src: A_ADDR,
                dst: B_ADDR,
                sport: 49_200,
                dport: 49_200,
            },
            a_data: Vec::new(),
            a_written: 0,
            a_write: usize::MAX,
            a_interval: Duration::ZERO,
            a_next_write: start,
            a_fin: false,
            a_close: true,
            b_data: Vec::new(),
            b_written: 0,
            b_fin: false,
            reader: Reader {
                chunk: None,
                interval: Duration::ZERO,
            },
            b_next_read: start,
            refuse: None,
            a_conn: None,
            b_conn: None,
            a_events: Vec::new(),
            b_events: Vec::new(),
            at_b: Vec::new(),
            at_a: Vec::new(),
            b_all_at: None,
            max_edge_held: 0,
            data_on_link: vec![0; relays + 1],
            control_on_link: vec![0; relays + 1],
            pairs: Vec::new(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn last(&self) -> usize {
        self.nodes.len() - 1
    }

    pub fn edge(&mut self, i: usize) -> &mut Edge {
        match &mut self.nodes[i] {
            Node::Edge(e) => e,
            Node::Relay(_) => panic!("node {i} is a relay"),
        }
    }

    pub fn relay(&self, i: usize) -> &Engine {
        match &self.nodes[i] {
            Node::Relay(r) => r,
            Node::Edge(_) => panic!("node {i} is an edge"),
        }
    }

    /// Host A connects.
    pub fn connect(&mut self) {
        let flow = self.a_flow;
        let now = self.now;
        let id = self.edge(0).open(
            now,
            flow,
            "10.0.1.1:40000".parse().unwrap(),
            "10.0.5.1:80".parse().unwrap(),
            [2, 0x51, 0, 0, 1, 1],
            TcpOptions {
                mss: 1460,
                wscale: Some(7),
                sack_permitted: true,
                timestamps: true,
            },
        );
        self.a_conn = Some(id);
    }

    /// Opens a further connection from host A (client port `client_port`,
    /// flow ports `flow_port`) that sends `data`.
    pub fn connect_pair(&mut self, client_port: u16, flow_port: u16, data: Vec<u8>) {
        let flow = FlowKey {
            src: A_ADDR,
            dst: B_ADDR,
            sport: flow_port,
            dport: flow_port,
        };
        let now = self.now;
        let id = self.edge(0).open(
            now,
            flow,
            std::net::SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), client_port),
            "10.0.5.1:80".parse().unwrap(),
            [2, 0x51, 0, 0, 1, 1],
            TcpOptions::default(),
        );
        self.pairs.push(Pair {
            client_port,
            data,
            written: 0,
            a_id: Some(id),
            b_id: None,
            a_events: Vec::new(),
            b_events: Vec::new(),
            at_b: Vec::new(),
            a_fin: false,
            b_fin: false,
        });
    }

    fn pair_hosts(&mut self) {
        let now = self.now;
        let last = self.last();
        for i in 0..self.pairs.len() {
            let (a, b) = (self.pairs[i].a_id, self.pairs[i].b_id);
            let accepted = self.pairs[i]
                .a_events
                .iter()
                .any(|e| matches!(e, ConnEvent::AcceptHost { .. }));
            if let Some(a) = a
                && accepted
            {
                let p = &self.pairs[i];
                let chunk = p.data[p.written..].to_vec();
                let n = self.edge(0).send(now, a, &chunk);
                let p = &mut self.pairs[i];
                p.written += n;
                if p.written == p.data.len() && !p.a_fin {
                    p.a_fin = true;
                    self.edge(0).host_fin(now, a);
                }
            }
            if let Some(b) = b {
                while let Some(d) = self.edge(last).peek_for_host(b) {
                    let d = d.to_vec();
                    self.pairs[i].at_b.extend_from_slice(&d);
                    self.edge(last).consume_for_host(now, b, d.len());
                }
                let p = &mut self.pairs[i];
                if !p.b_fin && p.b_events.contains(&ConnEvent::ShutdownHost) {
                    p.b_fin = true;
                    self.edge(last).host_fin(now, b);
                }
            }
        }
    }

    /// The node a message for `flow` going `dir` reaches from node `at`.
    fn neighbour(&self, flow: FlowKey, dir: Direction, at: usize) -> Option<usize> {
        let forward = flow.src == A_ADDR;
        let up = matches!(dir, Direction::Downstream) == forward;
        if up {
            (at < self.last()).then_some(at + 1)
        } else {
            at.checked_sub(1)
        }
    }

    fn send(&mut self, from: usize, to: usize, w: Wire) {
        let li = from.min(to);
        if let Some(f) = &mut self.drop_if
            && f(self.now, from, to, &w)
        {
            return;
        }
        match w {
            Wire::Data(_) => self.data_on_link[li] += 1,
            Wire::Control(_) => self.control_on_link[li] += 1,
        }
        let link = self.links[li];
        // The port: serialisation at its rate behind what is queued.
        let mut depart = self.now;
        if let Some(p) = self.ports {
            let len = match &w {
                Wire::Data(b) | Wire::Control(b) => b.len() as u64 + 14,
            };
            let busy = self.port_busy.entry((from, to)).or_insert(self.now);
            let start = (*busy).max(self.now);
            let queued = start - self.now;
            let byte_time = Duration::from_nanos(8_000_000_000 / p.bits_per_second);
            if queued > byte_time * p.queue_bytes as u32 {
                self.port_drops += 1;
                return;
            }
            *busy = start + byte_time * len as u32;
            depart = *busy;
        }
        if self.rng.chance(link.loss) {
            return;
        }
        let copies = if self.rng.chance(link.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let jitter = if link.jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_nanos(self.rng.next() % link.jitter.as_nanos() as u64)
            };
            self.order += 1;
            self.wire.push(Reverse((
                depart + link.delay + jitter,
                self.order,
                from,
                to,
                w.clone(),
            )));
        }
    }

    fn flush(&mut self) {
        for i in 0..self.nodes.len() {
            loop {
                let o = match &mut self.nodes[i] {
                    Node::Edge(e) => e.poll_output(),
                    Node::Relay(r) => r.poll_output(),
                };
                let Some(o) = o else { break };
                match o {
                    Output::Data { flow, id, payload } => {
                        if let Some(to) = self.neighbour(flow, Direction::Downstream, i) {
                            let h = UdpHeader::for_flow(flow, id);
                            self.send(i, to, Wire::Data(ipv4::build(&h, &payload)));
                        }
                    }
                    Output::Control(c) => {
                        if let Some(to) = self.neighbour(c.flow(), c.direction(), i) {
                            self.send(i, to, Wire::Control(c.encode().to_vec()));
                        }
                    }
                }
            }
        }
    }

    fn deliver(&mut self, to: usize, w: Wire) {
        let now = self.now;
        match w {
            Wire::Data(d) => {
                let (h, range) = ipv4::parse(&d).expect("simulated links do not corrupt");
                let flow = FlowKey {
                    src: h.src,
                    dst: h.dst,
                    sport: h.sport,
                    dport: h.dport,
                };
                let payload = Bytes::copy_from_slice(&d[range]);
                match &mut self.nodes[to] {
                    Node::Edge(e) => e.handle_data(now, flow, h.id, payload),
                    Node::Relay(r) => r.handle_data(now, flow, h.id, payload),
                }
            }
            Wire::Control(c) => {
                let c = Control::decode(&c).expect("well-formed control");
                match &mut self.nodes[to] {
                    Node::Edge(e) => e.handle_control(now, c),
                    Node::Relay(r) => r.handle_control(now, c),
                }
            }
        }
    }

    /// The hosts' side: events, writes, reads.
    fn hosts(&mut self) {
        let now = self.now;
        let last = self.last();
        while let Some((id, e)) = self.edge(0).poll_event() {
            if Some(id) == self.a_conn {
                self.a_events.push(e);
            } else {
                let p = self.pairs.iter_mut().find(|p| p.a_id == Some(id));
                p.expect("a known connection").a_events.push(e);
            }
        }
        while let Some((id, e)) = self.edge(last).poll_event() {
            if let ConnEvent::ConnectHost { client, .. } = &e
                && let Some(p) = self
                    .pairs
                    .iter_mut()
                    .find(|p| p.client_port == client.port())
            {
                p.b_id = Some(id);
                p.b_events.push(e);
                self.edge(last).host_connected(
                    now,
                    id,
                    [2, 0x51, 0, 0, 5, 1],
                    TcpOptions::default(),
                );
                continue;
            }
            if let Some(p) = self.pairs.iter_mut().find(|p| p.b_id == Some(id)) {
                p.b_events.push(e);
                continue;
            }
            if let ConnEvent::ConnectHost { .. } = e {
                self.b_conn = Some(id);
                match self.refuse {
                    None => self.edge(last).host_connected(
                        now,
                        id,
                        [2, 0x51, 0, 0, 5, 1],
                        TcpOptions::default(),
                    ),
                    Some(r) => self.edge(last).host_refused(now, id, r),
                }
            }
            self.b_events.push(e);
        }
        self.pair_hosts();
        // Host A writes once accepted.
        let accepted = self
            .a_events
            .iter()
            .any(|e| matches!(e, ConnEvent::AcceptHost { .. }));
        if let Some(a) = self.a_conn
            && accepted
        {
            while now >= self.a_next_write && self.a_written < self.a_data.len() {
                let end = self
                    .a_written
                    .saturating_add(self.a_write)
                    .min(self.a_data.len());
                let chunk = self.a_data[self.a_written..end].to_vec();
                let n = self.edge(0).send(now, a, &chunk);
                self.a_written += n;
                if n == 0 {
                    break;
                }
                if !self.a_interval.is_zero() {
                    self.a_next_write = now + self.a_interval;
                }
            }
            if self.a_close && self.a_written == self.a_data.len() && !self.a_fin {
                self.a_fin = true;
                self.edge(0).host_fin(now, a);
            }
            // Host A reads whatever B sends back.
            while let Some(d) = self.edge(0).peek_for_host(a) {
                let d = d.to_vec();
                self.at_a.extend_from_slice(&d);
                self.edge(0).consume_for_host(now, a, d.len());
            }
        }
        if let Some(b) = self.b_conn
            && self.refuse.is_none()
        {
            while self.b_written < self.b_data.len() {
                let chunk = self.b_data[self.b_written..].to_vec();
                let n = self.edge(last).send(now, b, &chunk);
                self.b_written += n;
                if n == 0 {
                    break;
                }
            }
            if self.b_written == self.b_data.len()
                && !self.b_fin
                && self
                    .b_events
                    .iter()
                    .any(|e| matches!(e, ConnEvent::ShutdownHost))
            {
                // Host B closes once A closed (a request/response exchange).
                self.b_fin = true;
                self.edge(last).host_fin(now, b);
            }
            if now >= self.b_next_read {
                let mut budget = self.reader.chunk.unwrap_or(usize::MAX);
                while budget > 0 {
                    let Some(d) = self.edge(last).peek_for_host(b) else {
                        break;
                    };
                    let n = d.len().min(budget);
                    let d = d[..n].to_vec();
                    self.at_b.extend_from_slice(&d);
                    if self.at_b.len() == self.a_data.len() && self.b_all_at.is_none() {
                        self.b_all_at = Some(self.now - self.start);
                    }
                    self.edge(last).consume_for_host(now, b, n);
                    budget -= n;
                }
                self.b_next_read = now + self.reader.interval;
            }
        }
    }

    fn next_time(&self) -> Option<Instant> {
        let nodes = self.nodes.iter().filter_map(|n| match n {
            Node::Edge(e) => e.poll_timeout(),
            Node::Relay(r) => r.poll_timeout(),
        });
        let wire = self.wire.peek().map(|Reverse((t, ..))| *t);
        let mut host = None;
        if self.a_written < self.a_data.len() && self.a_next_write > self.now {
            host = Some(self.a_next_write);
        }
        if self.reader.chunk.is_some() && self.b_next_read > self.now {
            host = host.min(Some(self.b_next_read)).or(Some(self.b_next_read));
        }
        nodes.chain(wire).chain(host).min()
    }

    fn closed(&self, events: &[ConnEvent]) -> bool {
        events.contains(&ConnEvent::Closed)
    }

    /// Runs until both connections closed (and the relays forgot the flows)
    /// or `limit` of virtual time passed.
    pub fn run(&mut self, limit: Duration) {
        let end = self.start + limit;
        loop {
            self.hosts();
            self.flush();
            let both_closed = (self.a_conn.is_none() || self.closed(&self.a_events))
                && (self.closed(&self.b_events) || self.b_conn.is_none())
                && self
                    .pairs
                    .iter()
                    .all(|p| self.closed(&p.a_events) && self.closed(&p.b_events));
            let relays_idle = self.nodes.iter().all(|n| match n {
                Node::Relay(r) => r.flows() == 0,
                Node::Edge(e) => e.connections() == 0,
            });
            if both_closed && relays_idle && self.wire.is_empty() {
                return;
            }
            let Some(t) = self.next_time() else {
                return;
            };
            if t > end {
                return;
            }
            self.now = self.now.max(t);
            while let Some(Reverse((t, ..))) = self.wire.peek()
                && *t <= self.now
            {
                let Reverse((_, _, _, to, w)) = self.wire.pop().unwrap();
                self.deliver(to, w);
            }
            let now = self.now;
            for n in &mut self.nodes {
                match n {
                    Node::Edge(e) => e.handle_timeout(now),
                    Node::Relay(r) => r.handle_timeout(now),
                }
            }
            for n in &self.nodes {
                if let Node::Edge(e) = n {
                    for c in [self.a_conn, self.b_conn].into_iter().flatten() {
                        if let Some(c) = e.connection(c) {
                            self.max_edge_held = self.max_edge_held.max(c.tx_held());
                        }
                    }
                }
            }
        }
    }
}
