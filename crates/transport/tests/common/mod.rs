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
use quinn_proto::{Connection, ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, Event};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

pub struct Peer {
    pub endpoint: Endpoint,
    pub handle: Option<ConnectionHandle>,
    pub conn: Option<Connection>,
    pub addr: SocketAddr,
    pub connected: bool,
}

impl Peer {
    pub fn conn(&mut self) -> &mut Connection {
        self.conn.as_mut().unwrap()
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
            if let Event::Connected = event {
                self.connected = true;
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
    };
    let mut client = Peer {
        endpoint: Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None),
        handle: None,
        conn: None,
        addr: "127.0.0.1:40000".parse().unwrap(),
        connected: false,
    };
    let (h, c) = client
        .endpoint
        .connect(now, client_cfg, server.addr, "ctl")
        .unwrap();
    client.handle = Some(h);
    client.conn = Some(c);
    (client, server)
}
