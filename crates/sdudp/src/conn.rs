//! The TCP engine's sans-IO part at an edge switch (paper §III-A, §III-B1):
//! one [`Connection`] per TCP connection between a host on this edge and a
//! host on the far edge, and the [`Edge`] that holds them.
//!
//! Setup keeps TCP's meaning end to end: the ingress edge (the one that saw
//! the host's SYN) sends OPEN and completes its host's handshake only when
//! the far edge reports that the far host accepted ([`ConnEvent::AcceptHost`]);
//! a refusal there reaches the host as a refusal ([`ConnEvent::RefuseHost`]).
//! Each direction of the connection is one flow of numbered datagrams that
//! ends with a final message: FIN (the host closed its side: half-close
//! passes through), RESET (the host reset, or the far side did), or REFUSE.
//! A flow that fails at any engine resets the hosts' connections
//! ([`ConnEvent::ResetHost`] with a reason), never a silent truncation.
//!
//! The driver does the TCP with the hosts: it calls [`Edge::send`] with bytes
//! read from the host only up to [`Edge::send_capacity`] (so a full path
//! throttles the host through TCP's own flow control), and writes
//! [`Edge::peek_for_host`] to the host, reporting [`Edge::consume_for_host`].

use crate::Config;
use crate::accumulate::Accumulator;
use crate::hop::{HopReceiver, HopSender};
use crate::msg::{
    Control, DATA_OVERHEAD, Direction, FailReason, FlowKey, Message, RefuseReason, TcpOptions,
};
use crate::seq::id_of;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

pub use crate::engine::Output;

/// Which edge of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The edge of the host that sent the SYN.
    Ingress,
    /// The edge of the host that was connected to.
    Egress,
}

/// What the driver must do with a host's TCP connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// Egress: connect to `server` as `client` (same addresses, ports and
    /// options the near host used), then call [`Edge::host_connected`] or
    /// [`Edge::host_refused`].
    ConnectHost {
        client: SocketAddrV4,
        server: SocketAddrV4,
        client_mac: [u8; 6],
        options: TcpOptions,
    },
    /// Ingress: the far host accepted; answer the host's SYN with SYN-ACK.
    AcceptHost {
        server_mac: [u8; 6],
        options: TcpOptions,
    },
    /// Ingress: the far host refused (answer the SYN with RST) or could not
    /// be reached.
    RefuseHost(RefuseReason),
    /// Bytes for the host are waiting ([`Edge::peek_for_host`]).
    HostReadable,
    /// Every byte was delivered and the far host closed its side: shut down
    /// writing towards the host (FIN).
    ShutdownHost,
    /// Reset the host's connection: the far host reset (`failure` None) or
    /// the path failed.
    ResetHost { failure: Option<FailReason> },
    /// Nothing is left to do for this connection.
    Closed,
}

/// Identifies a connection at one edge.
pub type ConnId = u64;

/// Where the connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Ingress: OPEN sent, waiting for ACCEPT/REFUSE. Egress: connecting.
    Opening,
    Open,
    /// Reset, refused or failed: only finishing the flows.
    Aborted,
    Closed,
}

/// One TCP connection's two flows at an edge.
#[derive(Debug)]
pub struct Connection {
    role: Role,
    state: State,
    tx: HopSender,
    rx: HopReceiver,
    acc: Accumulator,
    /// Messages received in order, not yet fully handled (data waits for the host).
    inbox: VecDeque<Message>,
    /// Sequence number of the first message in `inbox`.
    inbox_seq: u64,
    /// Bytes of the front DATA message already written to the host.
    front_offset: usize,
    /// The host closed its side; FIN not pushed yet (no room).
    fin_pending: bool,
    /// A final message (FIN/RESET/REFUSE) was pushed on `tx`.
    tx_final: bool,
    /// A final message to push when there is room.
    final_pending: Option<Message>,
    events: VecDeque<ConnEvent>,
    readable_signalled: bool,
}

/// Bytes of stream one datagram carries at most.
pub fn max_data(mtu: usize) -> usize {
    // IPv4 header 20, UDP header 8 (RFC 768), DATA type byte.
    mtu - 20 - 8 - DATA_OVERHEAD
}

/// Settings of the TCP engine's accumulation.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    pub hop: Config,
    /// Accumulate small writes into fuller datagrams.
    pub accumulate: bool,
    /// Send once this many stream bytes wait (paper: about 1.4 KB).
    pub accumulate_target: usize,
    /// Longest a partial datagram waits.
    pub accumulate_wait: Duration,
    /// Path MTU: the largest datagram is this, IPv4 header included.
    pub mtu: usize,
}

impl Default for EdgeConfig {
    fn default() -> EdgeConfig {
        EdgeConfig {
            hop: Config::default(),
            accumulate: true,
            // Fill datagrams completely: the fewest packets per byte.
            accumulate_target: max_data(1500),
            // 20 ms, not 5: the paper's paced sender (a 0.5 KB file every
            // 5 ms) fills datagrams only if the wait covers several writes;
            // on 9 switches at 0.5 % loss that is 1,031 frames per switch for
            // 1000 KB against 1,455 with 5 ms (docs/sdudp.md). The cost: a
            // lone small write waits up to 20 ms at the edge.
            accumulate_wait: Duration::from_millis(20),
            mtu: 1500,
        }
    }
}

impl Connection {
    fn new(role: Role, cfg: &EdgeConfig, tx: HopSender, rx: HopReceiver) -> Connection {
        Connection {
            role,
            state: State::Opening,
            tx,
            rx,
            acc: Accumulator::new(
                cfg.accumulate,
                cfg.accumulate_target,
                max_data(cfg.mtu),
                cfg.accumulate_wait,
            ),
            inbox: VecDeque::new(),
            inbox_seq: 0,
            front_offset: 0,
            fin_pending: false,
            tx_final: false,
            final_pending: None,
            events: VecDeque::new(),
            readable_signalled: false,
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn tx_flow(&self) -> FlowKey {
        self.tx.flow()
    }

    pub fn rx_flow(&self) -> FlowKey {
        self.rx.flow()
    }

    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Datagrams the sending half holds (bounded by the capacity).
    pub fn tx_held(&self) -> usize {
        self.tx.held()
    }

    /// Datagrams the receiving half holds, including those waiting for the host.
    pub fn rx_held(&self) -> usize {
        self.rx.held() + self.inbox.len()
    }

    fn send_capacity(&self) -> usize {
        if self.state != State::Open || self.fin_pending || self.tx_final {
            return 0;
        }
        self.acc.capacity_for(self.tx.room())
    }

    fn send(&mut self, now: Instant, data: &[u8]) -> usize {
        let n = data.len().min(self.send_capacity());
        let mut chunks = Vec::new();
        self.acc.push(now, &data[..n], &mut chunks);
        for c in chunks {
            self.tx.push(Message::Data(c).encode());
        }
        n
    }

    fn push_final(&mut self, m: Message) {
        if self.tx_final {
            return;
        }
        if self.tx.room() == 0 {
            self.final_pending = Some(m);
            return;
        }
        self.tx.push(m.encode());
        self.tx.finish();
        self.tx_final = true;
        self.final_pending = None;
    }

    /// Aborts: the far side is told with RESET (or the flows already failed).
    fn abort(&mut self, failure: Option<FailReason>, tell_host: bool) {
        if matches!(self.state, State::Aborted | State::Closed) {
            return;
        }
        self.state = State::Aborted;
        self.inbox.clear();
        self.front_offset = 0;
        if tell_host {
            self.events.push_back(ConnEvent::ResetHost { failure });
        }
        if failure.is_none() {
            self.fin_pending = false;
            self.acc = Accumulator::new(false, 1, 1, Duration::ZERO);
            self.push_final(Message::Reset);
        }
    }

    /// Handles in-order messages as far as the host allows.
    fn process_inbox(&mut self) {
        while let Some(front) = self.inbox.front() {
            match front {
                Message::Data(_) => {
                    if self.state == State::Aborted {
                        self.pop_inbox();
                        continue;
                    }
                    if !self.readable_signalled {
                        self.readable_signalled = true;
                        self.events.push_back(ConnEvent::HostReadable);
                    }
                    return;
                }
                Message::Open { .. } => {
                    // Only the egress's first message; handled at creation.
                    self.pop_inbox();
                }
                Message::Accept {
                    server_mac,
                    options,
                } => {
                    if self.role == Role::Ingress && self.state == State::Opening {
                        self.state = State::Open;
                        self.events.push_back(ConnEvent::AcceptHost {
                            server_mac: *server_mac,
                            options: *options,
                        });
                    }
                    self.pop_inbox();
                }
                Message::Refuse(reason) => {
                    let reason = *reason;
                    self.pop_inbox();
                    self.rx.finish();
                    if self.role == Role::Ingress && self.state == State::Opening {
                        self.events.push_back(ConnEvent::RefuseHost(reason));
                        self.state = State::Aborted;
                        // OPEN was this direction's only message: end it.
                        self.push_final(Message::Reset);
                    }
                }
                Message::Fin => {
                    self.pop_inbox();
                    self.rx.finish();
                    if self.state != State::Aborted {
                        self.events.push_back(ConnEvent::ShutdownHost);
                    }
                }
                Message::Reset => {
                    self.pop_inbox();
                    self.rx.finish();
                    if self.role == Role::Egress && self.state == State::Opening {
                        // The near host gave up before we connected.
                        self.events
                            .push_back(ConnEvent::ResetHost { failure: None });
                        self.state = State::Aborted;
                        self.push_final(Message::Reset);
                    } else {
                        self.abort(None, true);
                    }
                }
            }
        }
    }

    fn pop_inbox(&mut self) {
        self.inbox.pop_front();
        self.inbox_seq += 1;
        self.front_offset = 0;
        if !matches!(self.inbox.front(), Some(Message::Data(_))) {
            // The host has read everything: tell it when more comes.
            self.readable_signalled = false;
        }
    }

    fn peek_for_host(&self) -> Option<&[u8]> {
        match self.inbox.front() {
            Some(Message::Data(d)) if self.state != State::Aborted => Some(&d[self.front_offset..]),
            _ => None,
        }
    }

    fn consume_for_host(&mut self, n: usize) {
        let Some(Message::Data(d)) = self.inbox.front() else {
            assert!(n == 0, "consume_for_host({n}) with no data waiting");
            return;
        };
        let left = d.len() - self.front_offset;
        assert!(
            n <= left,
            "consume_for_host({n}) beyond the {left} bytes waiting"
        );
        self.front_offset += n;
        if self.front_offset == d.len() {
            self.pop_inbox();
        }
    }

    fn fail(&mut self, reason: FailReason, from: Option<Direction>, out: &mut VecDeque<Output>) {
        if self.state == State::Closed {
            return;
        }
        // Tell the engines of both flows, except whoever told us.
        if from != Some(Direction::Upstream) {
            out.push_back(Output::Control(Control::Fail {
                flow: self.tx.flow(),
                toward: Direction::Downstream,
                reason,
            }));
        }
        if from != Some(Direction::Downstream) {
            out.push_back(Output::Control(Control::Fail {
                flow: self.rx.flow(),
                toward: Direction::Upstream,
                reason,
            }));
        }
        if self.state != State::Aborted {
            self.events.push_back(ConnEvent::ResetHost {
                failure: Some(reason),
            });
        }
        self.state = State::Closed;
        self.events.push_back(ConnEvent::Closed);
    }

    /// Moves messages and datagrams; collects output; closes when done.
    fn pump(&mut self, now: Instant, out: &mut VecDeque<Output>) {
        if self.state == State::Closed {
            return;
        }
        while let Some(p) = self.rx.take_ready() {
            match Message::decode(&p) {
                Ok(m) => self.inbox.push_back(m),
                // A malformed message from the far edge: the stream cannot be
                // trusted any more. Reset, loudly.
                Err(_) => {
                    self.inbox.push_back(Message::Reset);
                }
            }
        }
        self.process_inbox();
        if self.fin_pending && self.tx.room() > 0 {
            let mut chunks = Vec::new();
            self.acc.flush(&mut chunks);
            for c in chunks {
                if self.tx.room() == 0 {
                    break;
                }
                self.tx.push(Message::Data(c).encode());
            }
            if self.acc.is_empty() && self.tx.room() > 0 {
                self.fin_pending = false;
                self.push_final(Message::Fin);
            }
        }
        if let Some(m) = self.final_pending.take() {
            self.push_final(m);
        }
        self.rx.set_base(self.inbox_seq);
        while let Some((id, payload)) = self.tx.poll_transmit(now) {
            out.push_back(Output::Data {
                flow: self.tx.flow(),
                id,
                payload,
            });
        }
        while let Some(c) = self.rx.poll_control(now) {
            out.push_back(Output::Control(c));
        }
        while let Some(c) = self.tx.poll_control(now) {
            out.push_back(Output::Control(c));
        }
        if self.rx.failed() || self.tx.failed() {
            self.fail(FailReason::Silent, None, out);
        } else if self.tx.is_done() && self.rx.is_finished() && self.inbox.is_empty() {
            self.state = State::Closed;
            self.events.push_back(ConnEvent::Closed);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        [
            self.tx.poll_timeout(),
            self.rx.poll_timeout(),
            self.acc.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut VecDeque<Output>) {
        let mut chunks = Vec::new();
        self.acc.handle_timeout(now, &mut chunks);
        for c in chunks {
            // `send` reserved room for every payload the accumulator emits.
            self.tx.push(Message::Data(c).encode());
        }
        self.tx.handle_timeout(now);
        self.rx.handle_timeout(now);
        self.pump(now, out);
    }
}

/// Counters of an edge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeStats {
    pub opened: u64,
    pub accepted: u64,
    pub closed: u64,
    pub failed: u64,
    pub late: u64,
}

#[derive(Debug, Clone, Copy)]
struct Gone {
    until: Instant,
    /// For the flow this edge received: the sequence number after its last
    /// message, to answer a previous engine that missed the final release.
    end: Option<u64>,
}

/// The TCP engine of one edge switch: its connections, by flow.
#[derive(Debug)]
pub struct Edge {
    cfg: EdgeConfig,
    conns: HashMap<ConnId, Connection>,
    by_flow: HashMap<FlowKey, ConnId>,
    /// Incoming flows whose OPEN has not arrived in order yet.
    pending: HashMap<FlowKey, HopReceiver>,
    gone: HashMap<FlowKey, Gone>,
    next_id: ConnId,
    out: VecDeque<Output>,
    events: VecDeque<(ConnId, ConnEvent)>,
    pub stats: EdgeStats,
}

impl Edge {
    /// Panics if the hop settings are invalid ([`Config::validate`]).
    pub fn new(cfg: EdgeConfig) -> Edge {
        if let Err(e) = cfg.hop.validate() {
            panic!("invalid SDUDP config: {e}");
        }
        assert!(cfg.mtu > 20 + 8 + DATA_OVERHEAD + 64, "MTU too small");
        Edge {
            cfg,
            conns: HashMap::new(),
            by_flow: HashMap::new(),
            pending: HashMap::new(),
            gone: HashMap::new(),
            next_id: 1,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: EdgeStats::default(),
        }
    }

    pub fn connection(&self, id: ConnId) -> Option<&Connection> {
        self.conns.get(&id)
    }

    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Ingress: a host sent SYN from `client` to `server`. `tx_flow` is the
    /// flow that will carry this direction (its reverse carries the other).
    pub fn open(
        &mut self,
        now: Instant,
        tx_flow: FlowKey,
        client: SocketAddrV4,
        server: SocketAddrV4,
        client_mac: [u8; 6],
        options: TcpOptions,
    ) -> ConnId {
        let tx = HopSender::new(tx_flow, &self.cfg.hop, now);
        let rx = HopReceiver::new(tx_flow.reverse(), &self.cfg.hop);
        let mut c = Connection::new(Role::Ingress, &self.cfg, tx, rx);
        c.tx.push(
            Message::Open {
                client,
                server,
                client_mac,
                options,
            }
            .encode(),
        );
        self.stats.opened += 1;
        self.insert(now, c)
    }

    fn insert(&mut self, now: Instant, c: Connection) -> ConnId {
        let id = self.next_id;
        self.next_id += 1;
        self.by_flow.insert(c.tx_flow(), id);
        self.by_flow.insert(c.rx_flow(), id);
        self.gone.remove(&c.tx_flow());
        self.gone.remove(&c.rx_flow());
        self.conns.insert(id, c);
        self.pump(now, id);
        id
    }

    /// Egress: the host accepted the connection.
    pub fn host_connected(
        &mut self,
        now: Instant,
        id: ConnId,
        server_mac: [u8; 6],
        options: TcpOptions,
    ) {
        if let Some(c) = self.conns.get_mut(&id)
            && c.role == Role::Egress
            && c.state == State::Opening
        {
            c.state = State::Open;
            c.tx.push(
                Message::Accept {
                    server_mac,
                    options,
                }
                .encode(),
            );
            self.stats.accepted += 1;
            self.pump(now, id);
        }
    }

    /// Egress: the host refused the connection or did not answer.
    pub fn host_refused(&mut self, now: Instant, id: ConnId, reason: RefuseReason) {
        if let Some(c) = self.conns.get_mut(&id)
            && c.role == Role::Egress
            && c.state == State::Opening
        {
            c.state = State::Aborted;
            c.push_final(Message::Refuse(reason));
            self.pump(now, id);
        }
    }

    /// Stream bytes the host may hand over now.
    pub fn send_capacity(&self, id: ConnId) -> usize {
        self.conns.get(&id).map_or(0, Connection::send_capacity)
    }

    /// Takes stream bytes from the host; returns how many were taken.
    pub fn send(&mut self, now: Instant, id: ConnId, data: &[u8]) -> usize {
        let Some(c) = self.conns.get_mut(&id) else {
            return 0;
        };
        let n = c.send(now, data);
        self.pump(now, id);
        n
    }

    /// The host closed its sending side (FIN).
    pub fn host_fin(&mut self, now: Instant, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id)
            && matches!(c.state, State::Open)
            && !c.tx_final
        {
            c.fin_pending = true;
            self.pump(now, id);
        }
    }

    /// The host reset the connection (RST), or the driver gave up on it.
    pub fn host_reset(&mut self, now: Instant, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.tx_final && !c.rx.is_finished() {
            // This direction already ended (FIN), so RESET cannot follow it in
            // the flow: fail the other direction hop by hop back to the far
            // edge, which resets its host.
            c.state = State::Aborted; // the host knows: no ResetHost for it
            c.fail(
                FailReason::Aborted,
                Some(Direction::Upstream),
                &mut self.out,
            );
        } else {
            c.abort(None, false);
        }
        self.pump(now, id);
    }

    /// Bytes waiting for the host (the front of the stream).
    pub fn peek_for_host(&self, id: ConnId) -> Option<&[u8]> {
        self.conns.get(&id).and_then(Connection::peek_for_host)
    }

    /// The host took `n` bytes of [`Self::peek_for_host`].
    pub fn consume_for_host(&mut self, now: Instant, id: ConnId, n: usize) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.consume_for_host(n);
            self.pump(now, id);
        }
    }

    /// A numbered datagram from the neighbouring engine.
    pub fn handle_data(&mut self, now: Instant, flow: FlowKey, id: u16, payload: Bytes) {
        if let Some(&cid) = self.by_flow.get(&flow) {
            let c = self.conns.get_mut(&cid).expect("indexed");
            if c.rx_flow() == flow {
                c.rx.on_data(now, id, payload);
                self.pump(now, cid);
            }
            return;
        }
        if self.answer_gone(flow) {
            return;
        }
        let rx = self
            .pending
            .entry(flow)
            .or_insert_with(|| HopReceiver::new(flow, &self.cfg.hop));
        rx.on_data(now, id, payload);
        self.pump_pending(now, flow);
    }

    /// A control message from the neighbouring engine.
    pub fn handle_control(&mut self, now: Instant, control: Control) {
        let flow = control.flow();
        if let Some(&cid) = self.by_flow.get(&flow) {
            let c = self.conns.get_mut(&cid).expect("indexed");
            match control {
                Control::Feedback {
                    cum,
                    limit,
                    beyond,
                    missing,
                    ..
                } if c.tx_flow() == flow => c.tx.on_feedback(now, cum, limit, beyond, &missing),
                Control::Probe { next, .. } if c.rx_flow() == flow => c.rx.on_probe(now, next),
                Control::Fail { reason, toward, .. } => {
                    c.fail(reason, Some(toward), &mut self.out);
                }
                _ => {}
            }
            self.pump(now, cid);
            return;
        }
        match control {
            Control::Probe { next, .. } => {
                if self.answer_gone(flow) {
                    return;
                }
                let rx = self
                    .pending
                    .entry(flow)
                    .or_insert_with(|| HopReceiver::new(flow, &self.cfg.hop));
                rx.on_probe(now, next);
                self.pump_pending(now, flow);
            }
            Control::Fail { .. } => {
                self.pending.remove(&flow);
            }
            Control::Feedback { .. } => self.stats.late += 1,
        }
    }

    fn answer_gone(&mut self, flow: FlowKey) -> bool {
        let Some(g) = self.gone.get(&flow) else {
            return false;
        };
        self.stats.late += 1;
        if let Some(end) = g.end {
            self.out.push_back(Output::Control(Control::Feedback {
                flow,
                cum: id_of(end),
                limit: id_of(end + u64::from(self.cfg.hop.capacity)),
                beyond: 0,
                missing: Vec::new(),
            }));
        }
        true
    }

    fn pump_pending(&mut self, now: Instant, flow: FlowKey) {
        let Some(rx) = self.pending.get_mut(&flow) else {
            return;
        };
        while let Some(c) = rx.poll_control(now) {
            self.out.push_back(Output::Control(c));
        }
        if rx.failed() {
            self.pending.remove(&flow);
            return;
        }
        let Some(first) = rx.take_ready() else {
            return;
        };
        let mut rx = self.pending.remove(&flow).expect("present");
        match Message::decode(&first) {
            Ok(Message::Open {
                client,
                server,
                client_mac,
                options,
            }) => {
                let tx = HopSender::new(flow.reverse(), &self.cfg.hop, now);
                rx.set_base(1);
                let mut c = Connection::new(Role::Egress, &self.cfg, tx, rx);
                c.inbox_seq = 1;
                c.events.push_back(ConnEvent::ConnectHost {
                    client,
                    server,
                    client_mac,
                    options,
                });
                self.insert(now, c);
            }
            // A flow must begin with OPEN: anything else means its start was
            // never ours (e.g. this engine restarted). Fail it visibly.
            _ => {
                self.out.push_back(Output::Control(Control::Fail {
                    flow,
                    toward: Direction::Upstream,
                    reason: FailReason::Aborted,
                }));
                self.gone.insert(
                    flow,
                    Gone {
                        until: now + self.cfg.hop.linger,
                        end: None,
                    },
                );
            }
        }
    }

    fn pump(&mut self, now: Instant, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.pump(now, &mut self.out);
        let closed = c.is_closed();
        for e in c.events.drain(..) {
            self.events.push_back((id, e));
        }
        if closed {
            let c = self.conns.remove(&id).expect("present");
            let failed = c.rx.failed() || c.tx.failed();
            if failed {
                self.stats.failed += 1;
            } else {
                self.stats.closed += 1;
            }
            self.by_flow.remove(&c.tx_flow());
            self.by_flow.remove(&c.rx_flow());
            let until = now + self.cfg.hop.linger;
            self.gone.insert(
                c.rx_flow(),
                Gone {
                    until,
                    end: c.rx.is_finished().then(|| c.rx.next_seq()),
                },
            );
            self.gone.insert(c.tx_flow(), Gone { until, end: None });
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(Connection::poll_timeout);
        let pending = self.pending.values().filter_map(HopReceiver::poll_timeout);
        let gone = self.gone.values().map(|g| g.until);
        conns.chain(pending).chain(gone).min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.gone.retain(|_, g| g.until > now);
        let due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.poll_timeout().is_some_and(|t| t <= now))
            .map(|(k, _)| *k)
            .collect();
        for id in due {
            if let Some(c) = self.conns.get_mut(&id) {
                c.handle_timeout(now, &mut self.out);
            }
            self.pump(now, id);
        }
        let due: Vec<FlowKey> = self
            .pending
            .iter()
            .filter(|(_, r)| r.poll_timeout().is_some_and(|t| t <= now))
            .map(|(k, _)| *k)
            .collect();
        for flow in due {
            if let Some(rx) = self.pending.get_mut(&flow) {
                rx.handle_timeout(now);
            }
            self.pump_pending(now, flow);
        }
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<(ConnId, ConnEvent)> {
        self.events.pop_front()
    }
}
