#![allow(dead_code)] // each test file uses part of it
//! Two quinn-proto endpoints with the agents' QUIC configuration, driven by
//! hand on a virtual clock, for the tests of this project's changes to
//! quinn-proto (third_party/quinn-proto/QUICSDN-PATCH.md): the test sees and
//! may change or drop every datagram.

use bytes::BytesMut;
use quicsdn_transport::pki::{Validity, ca_paths, init_ca, issue};
use quicsdn_transport::quic::{QuicOptions, client_config, server_config};
use quicsdn_transport::resumption::SessionStore;
use quicsdn_transport::tls::{Credentials, TlsFiles};
use quinn_proto::{
    Connection, ConnectionError, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig,
    Event, StreamId,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Peer {
    pub endpoint: Endpoint,
    pub handle: Option<ConnectionHandle>,
    pub conn: Option<Connection>,
    pub addr: SocketAddr,
    pub connected: bool,
    /// Why the connection closed, once it has.
    pub lost: Option<ConnectionError>,
}

impl Peer {
    pub fn conn(&mut self) -> &mut Connection {
        self.conn.as_mut().unwrap()
    }

    /// Writes `len` bytes on this peer's uni stream `stream`, opening it the
    /// first time.
    pub fn write(&mut self, stream: &mut Option<StreamId>, len: usize) {
        let conn = self.conn();
        let id = *stream.get_or_insert_with(|| conn.streams().open(Dir::Uni).unwrap());
        conn.send_stream(id).write(&vec![0x5a; len]).unwrap();
    }

    /// Takes a datagram from the peer.
    pub fn receive(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) {
        let mut buf = Vec::new();
        match self
            .endpoint
            .handle(now, from, None, None, BytesMut::from(datagram), &mut buf)
        {
            Some(DatagramEvent::NewConnection(incoming)) => {
                let (h, c) = self
                    .endpoint
                    .accept(incoming, now, &mut buf, None)
                    .expect("the server accepts the attempt");
                self.handle = Some(h);
                self.conn = Some(c);
            }
            Some(DatagramEvent::ConnectionEvent(h, event)) => {
                assert_eq!(Some(h), self.handle);
                self.conn().handle_event(event);
            }
            Some(DatagramEvent::Response(_)) => panic!("a stateless response: {buf:?}"),
            None => {}
        }
    }

    /// The next datagram to send, if any.
    pub fn transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        let conn = self.conn.as_mut()?;
        let mut buf = Vec::new();
        let t = conn.poll_transmit(now, 1, &mut buf)?;
        Some(buf[..t.size].to_vec())
    }

    /// Handles the connection's endpoint and application events, noting
    /// `connected`.
    pub fn events(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        while let Some(event) = conn.poll_endpoint_events() {
            if let Some(back) = self.endpoint.handle_event(self.handle.unwrap(), event) {
                conn.handle_event(back);
            }
        }
        while let Some(event) = conn.poll() {
            match event {
                Event::Connected => self.connected = true,
                Event::ConnectionLost { reason } => self.lost = Some(reason),
                _ => {}
            }
        }
    }

    /// Every datagram there is to send, then the events.
    pub fn poll(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(d) = self.transmit(now) {
            out.push(d);
        }
        self.events();
        out
    }

    /// Runs the connection's timers that are due at `now`.
    pub fn timers(&mut self, now: Instant) {
        if let Some(conn) = self.conn.as_mut()
            && conn.poll_timeout().is_some_and(|t| t <= now)
        {
            conn.handle_timeout(now);
        }
    }

    /// When the connection's next timer is due.
    pub fn next_timer(&mut self) -> Option<Instant> {
        self.conn.as_mut()?.poll_timeout()
    }
}

fn credentials(dir: &std::path::Path, name: &str) -> Credentials {
    let (ca, _) = ca_paths(dir);
    let (cert, key) = issue(dir, name, &[], Validity::days(1)).unwrap();
    Credentials::load(&TlsFiles { ca, cert, key }).unwrap()
}

/// A switch agent's endpoint (the client), its connection started at `now`,
/// and a controller agent's endpoint (the server), both with `opts`.
pub fn agents(opts: &QuicOptions, now: Instant) -> (Peer, Peer) {
    let dir = tempfile::tempdir().unwrap();
    init_ca(dir.path(), "CA", Validity::days(1)).unwrap();
    let server_cfg = server_config(
        &credentials(dir.path(), "ctl"),
        opts,
        Arc::new(SessionStore::in_memory(16)),
    )
    .unwrap();
    let client_cfg = client_config(&credentials(dir.path(), "sw1"), opts).unwrap();
    let server = Peer {
        endpoint: Endpoint::new(
            Arc::new(EndpointConfig::default()),
            Some(Arc::new(server_cfg)),
            true,
            None,
        ),
        handle: None,
        conn: None,
        addr: "127.0.0.1:6653".parse().unwrap(),
        connected: false,
        lost: None,
    };
    let mut client = Peer {
        endpoint: Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None),
        handle: None,
        conn: None,
        addr: "127.0.0.1:40000".parse().unwrap(),
        connected: false,
        lost: None,
    };
    let (h, c) = client
        .endpoint
        .connect(now, client_cfg, server.addr, "ctl")
        .unwrap();
    client.handle = Some(h);
    client.conn = Some(c);
    (client, server)
}

/// A datagram on the wire, delivered at `at`.
struct InFlight {
    at: Instant,
    to_server: bool,
    datagram: Vec<u8>,
}

/// Asked about every datagram a peer sends: whether the link loses it. The
/// arguments are the time, whether the server sent it, the sender (its
/// statistics already count the datagram's frames), and the datagram.
pub type Lose<'a> = dyn FnMut(Instant, bool, &mut Peer, &[u8]) -> bool + 'a;

/// A link that loses nothing.
pub fn lossless(_: Instant, _: bool, _: &mut Peer, _: &[u8]) -> bool {
    false
}

/// [`agents`] joined by a link with a fixed one-way delay (so datagrams
/// arrive in order), on a virtual clock that jumps from one event (a
/// delivery, a timer, the caller's deadline) to the next.
pub struct Link {
    pub client: Peer,
    pub server: Peer,
    pub now: Instant,
    /// Applies to datagrams sent from now on (the link stays in order: a
    /// shorter delay holds a datagram behind those already on the wire).
    pub one_way: Duration,
    wire: VecDeque<InFlight>,
}

impl Link {
    pub fn new(opts: &QuicOptions, one_way: Duration) -> Link {
        let start = Instant::now();
        let (client, server) = agents(opts, start);
        Link {
            client,
            server,
            now: start,
            one_way,
            wire: VecDeque::new(),
        }
    }

    pub fn connected(&self) -> bool {
        self.client.connected && self.server.connected
    }

    /// Runs the handshake (within a second of virtual time).
    pub fn connect(&mut self, lose: &mut Lose) {
        let deadline = self.now + Duration::from_secs(1);
        while !self.connected() {
            assert!(self.now < deadline, "no handshake within a second");
            let next = self
                .next_event(deadline)
                .max(self.now + Duration::from_micros(1));
            self.run_until(next, lose);
        }
    }

    /// Runs both peers until `until` (inclusive): delivers what arrives,
    /// fires timers, sends what there is to send, asking `lose` about each
    /// datagram. Panics if a connection closes.
    pub fn run_until(&mut self, until: Instant, lose: &mut Lose) {
        loop {
            while self.wire.front().is_some_and(|d| d.at <= self.now) {
                let d = self.wire.pop_front().unwrap();
                if d.to_server {
                    self.server.receive(self.now, self.client.addr, &d.datagram);
                } else {
                    self.client.receive(self.now, self.server.addr, &d.datagram);
                }
            }
            self.client.timers(self.now);
            self.server.timers(self.now);
            for from_server in [false, true] {
                let peer = if from_server {
                    &mut self.server
                } else {
                    &mut self.client
                };
                if peer.conn.is_none() {
                    continue;
                }
                while let Some(datagram) = peer.transmit(self.now) {
                    if !lose(self.now, from_server, peer, &datagram) {
                        self.wire.push_back(InFlight {
                            at: self.now + self.one_way,
                            to_server: !from_server,
                            datagram,
                        });
                    }
                }
                peer.events();
                assert!(
                    !peer.conn().is_closed(),
                    "a connection closed: {:?}",
                    peer.lost
                );
            }
            if self.now >= until {
                return;
            }
            // Always forward, so a timer quinn leaves due cannot stall us.
            self.now = self
                .next_event(until)
                .max(self.now + Duration::from_micros(1));
        }
    }

    /// The first of: the next delivery, either peer's next timer, `until`.
    fn next_event(&mut self, until: Instant) -> Instant {
        [
            self.wire.front().map(|d| d.at),
            self.client.next_timer(),
            self.server.next_timer(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map_or(until, |t| t.min(until))
    }
}
