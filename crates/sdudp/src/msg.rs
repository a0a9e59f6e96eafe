//! Message formats.
//!
//! **Numbered datagrams** (edge to edge along the flow's path; UDP payload,
//! numbered by the IPv4 ID, see [`crate::ipv4`]): `u8 type`, then
//!
//! | type | body |
//! |---|---|
//! | 0x01 DATA | stream bytes |
//! | 0x02 OPEN | client addr (4) port (2), server addr (4) port (2), client MAC (6), [`TcpOptions`] (5) |
//! | 0x03 ACCEPT | server MAC (6), [`TcpOptions`] (5) of the far host |
//! | 0x04 REFUSE | u8 reason: 1 refused (the host answered RST), 2 unreachable |
//! | 0x05 FIN | — |
//! | 0x06 RESET | — |
//!
//! REFUSE, FIN and RESET are a flow's last message.
//!
//! **Hop control** (between adjacent engines only, never forwarded as is):
//! `u8 magic 0x5D, u8 version 2, u8 type`, the flow ([`FlowKey`], 12 bytes), then
//!
//! | type | body |
//! |---|---|
//! | 0x01 FEEDBACK (receiver → sender) | u16 cum (every ID before it arrived: free them), u16 limit (send only IDs before it), u16 beyond (IDs after cum that arrived out of order), u8 n, n × (u16 first, u16 count) missing (a NACK) |
//! | 0x02 PROBE (sender → receiver) | u16 next (every ID before it was sent); always answered with FEEDBACK |
//! | 0x03 FAIL | u8 direction (1 downstream, 2 upstream), u8 reason |
//!
//! All integers big-endian. Decoding never panics; anything malformed is a
//! [`MsgError`].

use bytes::{BufMut, Bytes, BytesMut};
use std::net::{Ipv4Addr, SocketAddrV4};

/// One direction of one connection between two edge engines: the UDP
/// four-tuple of its numbered datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
}

impl FlowKey {
    /// The same connection's other direction.
    pub fn reverse(&self) -> FlowKey {
        FlowKey {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }

    fn put(&self, b: &mut BytesMut) {
        b.put_slice(&self.src.octets());
        b.put_slice(&self.dst.octets());
        b.put_u16(self.sport);
        b.put_u16(self.dport);
    }

    fn get(r: &mut Reader) -> Result<FlowKey, MsgError> {
        Ok(FlowKey {
            src: r.addr()?,
            dst: r.addr()?,
            sport: r.u16()?,
            dport: r.u16()?,
        })
    }
}

impl std::fmt::Display for FlowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}->{}:{}",
            self.src, self.sport, self.dst, self.dport
        )
    }
}

/// The TCP options a host offered in its SYN (or SYN-ACK), which the far edge
/// repeats in the SYN (SYN-ACK) it forges, so both hosts see what they would
/// have negotiated with each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpOptions {
    /// Maximum segment size (RFC 9293 §3.7.1); 0 = not offered.
    pub mss: u16,
    /// Window scale shift (RFC 7323 §2), if offered.
    pub wscale: Option<u8>,
    pub sack_permitted: bool,
    pub timestamps: bool,
}

impl TcpOptions {
    fn put(&self, b: &mut BytesMut) {
        b.put_u16(self.mss);
        b.put_u8(self.wscale.unwrap_or(0xff));
        b.put_u8(self.sack_permitted as u8);
        b.put_u8(self.timestamps as u8);
    }

    fn get(r: &mut Reader) -> Result<TcpOptions, MsgError> {
        let mss = r.u16()?;
        let wscale = match r.u8()? {
            0xff => None,
            // RFC 7323 §2.3: a shift above 14 is used as 14.
            s => Some(s.min(14)),
        };
        Ok(TcpOptions {
            mss,
            wscale,
            sack_permitted: r.bool()?,
            timestamps: r.bool()?,
        })
    }
}

/// Why the far edge could not connect to its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// The host answered the SYN with RST (nothing listens): the near host
    /// gets RST too, i.e. "connection refused".
    Refused,
    /// The host did not answer (or the address is not reachable).
    Unreachable,
}

/// What one numbered datagram carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Data(Bytes),
    Open {
        client: SocketAddrV4,
        server: SocketAddrV4,
        client_mac: [u8; 6],
        options: TcpOptions,
    },
    Accept {
        server_mac: [u8; 6],
        options: TcpOptions,
    },
    Refuse(RefuseReason),
    Fin,
    Reset,
}

pub const T_DATA: u8 = 1;
pub const T_OPEN: u8 = 2;
pub const T_ACCEPT: u8 = 3;
pub const T_REFUSE: u8 = 4;
pub const T_FIN: u8 = 5;
pub const T_RESET: u8 = 6;

/// Bytes a DATA datagram adds to the stream bytes it carries.
pub const DATA_OVERHEAD: usize = 1;

/// Whether a numbered datagram's payload is its flow's last message (a relay
/// reads only this first byte).
pub fn is_final(payload: &[u8]) -> bool {
    matches!(payload.first(), Some(&(T_REFUSE | T_FIN | T_RESET)))
}

impl Message {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Message::Data(d) => {
                b.reserve(1 + d.len());
                b.put_u8(T_DATA);
                b.put_slice(d);
            }
            Message::Open {
                client,
                server,
                client_mac,
                options,
            } => {
                b.put_u8(T_OPEN);
                b.put_slice(&client.ip().octets());
                b.put_u16(client.port());
                b.put_slice(&server.ip().octets());
                b.put_u16(server.port());
                b.put_slice(client_mac);
                options.put(&mut b);
            }
            Message::Accept {
                server_mac,
                options,
            } => {
                b.put_u8(T_ACCEPT);
                b.put_slice(server_mac);
                options.put(&mut b);
            }
            Message::Refuse(r) => {
                b.put_u8(T_REFUSE);
                b.put_u8(match r {
                    RefuseReason::Refused => 1,
                    RefuseReason::Unreachable => 2,
                });
            }
            Message::Fin => b.put_u8(T_FIN),
            Message::Reset => b.put_u8(T_RESET),
        }
        b.freeze()
    }

    pub fn decode(payload: &Bytes) -> Result<Message, MsgError> {
        let mut r = Reader::new(payload);
        let m = match r.u8()? {
            T_DATA => return Ok(Message::Data(payload.slice(1..))),
            T_OPEN => {
                let client = SocketAddrV4::new(r.addr()?, r.u16()?);
                let server = SocketAddrV4::new(r.addr()?, r.u16()?);
                let client_mac = r.mac()?;
                Message::Open {
                    client,
                    server,
                    client_mac,
                    options: TcpOptions::get(&mut r)?,
                }
            }
            T_ACCEPT => Message::Accept {
                server_mac: r.mac()?,
                options: TcpOptions::get(&mut r)?,
            },
            T_REFUSE => Message::Refuse(match r.u8()? {
                1 => RefuseReason::Refused,
                2 => RefuseReason::Unreachable,
                other => return Err(MsgError::BadValue("refuse reason", other)),
            }),
            T_FIN => Message::Fin,
            T_RESET => Message::Reset,
            other => return Err(MsgError::UnknownType(other)),
        };
        r.end()?;
        Ok(m)
    }
}

/// Which way along a flow's path a control message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// With the data, towards the far edge.
    Downstream,
    /// Against it, towards the sending edge.
    Upstream,
}

/// Why a flow failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// The neighbouring engine stopped answering.
    Silent,
    /// An engine had no room for another flow.
    NoRoom,
    /// The edge's connection was torn down (reset) for another reason.
    Aborted,
}

/// A hop-by-hop control message between adjacent engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// From a flow's receiver to the engine before it: IDs before `cum`
    /// arrived (free them), IDs from `limit` on may not be sent yet, `beyond`
    /// datagrams after `cum` arrived out of order (they left the link, so the
    /// sender's congestion window need not count them), and the `missing`
    /// ranges `(first, count)` are requested again (a NACK).
    Feedback {
        flow: FlowKey,
        cum: u16,
        limit: u16,
        beyond: u16,
        missing: Vec<(u16, u16)>,
    },
    /// From a flow's sender to the next engine: it has sent every ID before
    /// `next`. Reveals lost tails and keeps an idle flow alive; always answered.
    Probe { flow: FlowKey, next: u16 },
    /// The flow failed at some engine; passed on in `toward` until an edge.
    Fail {
        flow: FlowKey,
        toward: Direction,
        reason: FailReason,
    },
}

pub const CONTROL_MAGIC: u8 = 0x5D;
/// 2: FEEDBACK carries `beyond`. Engines of one path run one version; a
/// message of another is refused as malformed.
const CONTROL_VERSION: u8 = 2;
const C_FEEDBACK: u8 = 1;
const C_PROBE: u8 = 2;
const C_FAIL: u8 = 3;

impl Control {
    pub fn flow(&self) -> FlowKey {
        match self {
            Control::Feedback { flow, .. }
            | Control::Probe { flow, .. }
            | Control::Fail { flow, .. } => *flow,
        }
    }

    /// The direction this message travels along its flow's path.
    pub fn direction(&self) -> Direction {
        match self {
            Control::Feedback { .. } => Direction::Upstream,
            Control::Probe { .. } => Direction::Downstream,
            Control::Fail { toward, .. } => *toward,
        }
    }

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(32);
        b.put_u8(CONTROL_MAGIC);
        b.put_u8(CONTROL_VERSION);
        match self {
            Control::Feedback {
                flow,
                cum,
                limit,
                beyond,
                missing,
            } => {
                b.put_u8(C_FEEDBACK);
                flow.put(&mut b);
                b.put_u16(*cum);
                b.put_u16(*limit);
                b.put_u16(*beyond);
                let n = missing.len().min(255);
                b.put_u8(n as u8);
                for (first, count) in &missing[..n] {
                    b.put_u16(*first);
                    b.put_u16(*count);
                }
            }
            Control::Probe { flow, next } => {
                b.put_u8(C_PROBE);
                flow.put(&mut b);
                b.put_u16(*next);
            }
            Control::Fail {
                flow,
                toward,
                reason,
            } => {
                b.put_u8(C_FAIL);
                flow.put(&mut b);
                b.put_u8(match toward {
                    Direction::Downstream => 1,
                    Direction::Upstream => 2,
                });
                b.put_u8(match reason {
                    FailReason::Silent => 1,
                    FailReason::NoRoom => 2,
                    FailReason::Aborted => 3,
                });
            }
        }
        b.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<Control, MsgError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != CONTROL_MAGIC {
            return Err(MsgError::BadMagic);
        }
        let v = r.u8()?;
        if v != CONTROL_VERSION {
            return Err(MsgError::BadValue("version", v));
        }
        let t = r.u8()?;
        let flow = FlowKey::get(&mut r)?;
        let c = match t {
            C_FEEDBACK => {
                let cum = r.u16()?;
                let limit = r.u16()?;
                let beyond = r.u16()?;
                let n = r.u8()?;
                let mut missing = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let first = r.u16()?;
                    let count = r.u16()?;
                    if count == 0 {
                        return Err(MsgError::BadValue("missing count", 0));
                    }
                    missing.push((first, count));
                }
                Control::Feedback {
                    flow,
                    cum,
                    limit,
                    beyond,
                    missing,
                }
            }
            C_PROBE => Control::Probe {
                flow,
                next: r.u16()?,
            },
            C_FAIL => {
                let toward = match r.u8()? {
                    1 => Direction::Downstream,
                    2 => Direction::Upstream,
                    other => return Err(MsgError::BadValue("direction", other)),
                };
                let reason = match r.u8()? {
                    1 => FailReason::Silent,
                    2 => FailReason::NoRoom,
                    3 => FailReason::Aborted,
                    other => return Err(MsgError::BadValue("fail reason", other)),
                };
                Control::Fail {
                    flow,
                    toward,
                    reason,
                }
            }
            other => return Err(MsgError::UnknownType(other)),
        };
        r.end()?;
        Ok(c)
    }
}

/// Why bytes were not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    #[error("truncated message")]
    Truncated,
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("not an SDUDP control message (bad magic)")]
    BadMagic,
    #[error("invalid {0}: {1}")]
    BadValue(&'static str, u8),
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgError> {
        if self.b.len() < n {
            return Err(MsgError::Truncated);
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, MsgError> {
        Ok(self.take(1)?[0])
    }
    fn bool(&mut self) -> Result<bool, MsgError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(MsgError::BadValue("flag", other)),
        }
    }
    fn u16(&mut self) -> Result<u16, MsgError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn addr(&mut self) -> Result<Ipv4Addr, MsgError> {
        let s = self.take(4)?;
        Ok(Ipv4Addr::new(s[0], s[1], s[2], s[3]))
    }
    fn mac(&mut self) -> Result<[u8; 6], MsgError> {
        let s = self.take(6)?;
        let mut m = [0; 6];
        m.copy_from_slice(s);
        Ok(m)
    }
    fn end(&self) -> Result<(), MsgError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(MsgError::Trailing(self.b.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn flow() -> FlowKey {
        FlowKey {
            src: Ipv4Addr::new(10, 0, 1, 1),
            dst: Ipv4Addr::new(10, 0, 5, 1),
            sport: 49_200,
            dport: 49_201,
        }
    }

    #[test]
    fn messages_round_trip() {
        let opts = TcpOptions {
            mss: 1460,
            wscale: Some(7),
            sack_permitted: true,
            timestamps: false,
        };
        for m in [
            Message::Data(Bytes::from_static(b"hello")),
            Message::Data(Bytes::new()),
            Message::Open {
                client: "10.0.1.1:40000".parse().unwrap(),
                server: "10.0.5.1:80".parse().unwrap(),
                client_mac: [2, 0x51, 0, 0, 1, 1],
                options: opts,
            },
            Message::Accept {
                server_mac: [2, 0x51, 0, 0, 5, 1],
                options: TcpOptions::default(),
            },
            Message::Refuse(RefuseReason::Refused),
            Message::Refuse(RefuseReason::Unreachable),
            Message::Fin,
            Message::Reset,
        ] {
            let e = m.encode();
            assert_eq!(Message::decode(&e).unwrap(), m);
            assert_eq!(
                is_final(&e),
                matches!(m, Message::Fin | Message::Reset | Message::Refuse(_))
            );
        }
        assert_eq!(
            Message::decode(&Bytes::from_static(&[9])),
            Err(MsgError::UnknownType(9))
        );
        assert_eq!(
            Message::decode(&Bytes::from_static(&[T_FIN, 0])),
            Err(MsgError::Trailing(1))
        );
        assert_eq!(Message::decode(&Bytes::new()), Err(MsgError::Truncated));
    }

    #[test]
    fn controls_round_trip() {
        for c in [
            Control::Feedback {
                flow: flow(),
                cum: 65_535,
                limit: 1000,
                beyond: 9,
                missing: vec![(65_535, 3), (7, 1)],
            },
            Control::Feedback {
                flow: flow(),
                cum: 0,
                limit: 1024,
                beyond: 0,
                missing: vec![],
            },
            Control::Probe {
                flow: flow(),
                next: 12,
            },
            Control::Fail {
                flow: flow(),
                toward: Direction::Upstream,
                reason: FailReason::Silent,
            },
        ] {
            assert_eq!(Control::decode(&c.encode()).unwrap(), c);
        }
        assert_eq!(Control::decode(&[0x00, 1, 1]), Err(MsgError::BadMagic));
        assert_eq!(flow().reverse().reverse(), flow());
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Control::decode(&bytes);
            let _ = Message::decode(&Bytes::from(bytes));
        }
    }
}
