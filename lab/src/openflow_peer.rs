//! A minimal OpenFlow 1.3 controller endpoint for tests and benchmarks that
//! drive a real Open vSwitch directly: handshake, send, answer echo requests,
//! wait for barrier replies. Blocking I/O; one connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use quicsdn_wire::openflow::build::{self, msg_type};
use quicsdn_wire::openflow::{HEADER_LEN, Header};

/// One message received, with its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub header: Header,
    pub bytes: Vec<u8>,
}

/// A controller's side of one OpenFlow connection.
pub struct Controller {
    stream: TcpStream,
    buf: Vec<u8>,
    /// ERROR messages received so far.
    pub errors: Vec<Received>,
    /// Datapath id from the FEATURES_REPLY.
    pub datapath_id: u64,
}

impl Controller {
    /// Performs the handshake (HELLO both ways, FEATURES_REQUEST/REPLY) on an
    /// accepted connection.
    pub fn handshake(stream: TcpStream, timeout: Duration) -> Result<Controller> {
        stream.set_nodelay(true)?;
        let mut c = Controller {
            stream,
            buf: Vec::new(),
            errors: Vec::new(),
            datapath_id: 0,
        };
        c.send(&build::hello(1))?;
        c.send(&build::features_request(2))?;
        let reply = c.recv_until(timeout, |m| m.header.msg_type == msg_type::FEATURES_REPLY)?;
        c.datapath_id = u64::from_be_bytes(reply.bytes[8..16].try_into().expect("8 bytes"));
        Ok(c)
    }

    pub fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.stream.write_all(msg).context("sending to the switch")
    }

    /// Reads one whole message, or `None` once `deadline` passes. Echo requests
    /// are returned like anything else: the caller answers them.
    pub fn recv_by(&mut self, deadline: Instant) -> Result<Option<Received>> {
        loop {
            if let Some(h) = Header::parse(&self.buf) {
                let len = usize::from(h.length);
                if len < HEADER_LEN {
                    bail!("the switch sent a message of length {len}");
                }
                if self.buf.len() >= len {
                    let bytes: Vec<u8> = self.buf.drain(..len).collect();
                    return Ok(Some(Received { header: h, bytes }));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; 65536];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                Err(e) if crate::wait::timed_out(&e) => {
                    continue;
                }
                Err(e) => return Err(e).context("reading from the switch"),
            };
            if n == 0 {
                bail!("the switch closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Receives until `want` matches, answering echo requests and collecting
    /// errors on the way.
    pub fn recv_until(
        &mut self,
        timeout: Duration,
        want: impl Fn(&Received) -> bool,
    ) -> Result<Received> {
        match self.recv_until_by(Instant::now() + timeout, want)? {
            Some(m) => Ok(m),
            None => bail!("no message from the switch in time"),
        }
    }

    /// [`Self::recv_until`], with `None` once `deadline` passes: a reply that
    /// is late is not an error for a caller that counts timeouts.
    pub fn recv_until_by(
        &mut self,
        deadline: Instant,
        want: impl Fn(&Received) -> bool,
    ) -> Result<Option<Received>> {
        loop {
            let Some(m) = self.recv_by(deadline)? else {
                return Ok(None);
            };
            match m.header.msg_type {
                msg_type::ECHO_REQUEST => {
                    let reply = build::echo_reply(m.header.xid, &m.bytes[HEADER_LEN..]);
                    self.send(&reply)?;
                }
                msg_type::ERROR => self.errors.push(m.clone()),
                _ => {}
            }
            if want(&m) {
                return Ok(Some(m));
            }
        }
    }

    /// Sends a BARRIER_REQUEST and waits for its reply: everything sent before it
    /// has then been processed.
    pub fn barrier(&mut self, xid: u32, timeout: Duration) -> Result<()> {
        self.send(&build::barrier_request(xid))?;
        self.recv_until(timeout, |m| {
            m.header.msg_type == msg_type::BARRIER_REPLY && m.header.xid == xid
        })?;
        Ok(())
    }
}
