//! Datagram formats. Every datagram starts with a 6-byte header:
//!
//! ```text
//! u8 magic (0xD5)  u8 type  u32 association id
//! ```
//!
//! | type | body |
//! |---|---|
//! | 0x01 HELLO | u8 profile, hello bytes (the agents put JSON here) |
//! | 0x02 HELLO_ACK | u8 profile, hello bytes |
//! | 0x03 DATA | u16 channel, u32 seq, u8 flags, payload |
//! | 0x04 ACK | u16 channel, u32 cumulative, u16 window, u8 n, n × (u32 start, u32 end) |
//! | 0x05 PING | optional u8: 1 asks the peer to answer with a PING at once |
//! | 0x06 CLOSE | u16 code, reason (UTF-8) |
//!
//! DATA flags: bit 0 first fragment of a message, bit 1 last fragment, bits 2–3
//! the message kind ([`MessageKind`]). ACK: every seq below `cumulative` was
//! received (0 says nothing), and so was every seq in each `[start, end)` range;
//! `window` is how many more packets the receiver will buffer.
//!
//! All integers are big-endian. Decoding never panics; anything malformed is a
//! [`PacketError`].

use crate::Profile;
use crate::channel::MessageKind;

pub const MAGIC: u8 = 0xD5;
pub const HEADER_LEN: usize = 6;
/// Header of a DATA datagram: the common header, channel, seq and flags.
pub const DATA_HEADER_LEN: usize = HEADER_LEN + 2 + 4 + 1;
/// Most SACK ranges one ACK carries.
pub const MAX_RANGES: usize = 16;

pub const FLAG_FIRST: u8 = 1;
pub const FLAG_LAST: u8 = 2;

const T_HELLO: u8 = 1;
const T_HELLO_ACK: u8 = 2;
const T_DATA: u8 = 3;
const T_ACK: u8 = 4;
const T_PING: u8 = 5;
const T_CLOSE: u8 = 6;

/// A decoded datagram (borrowing its payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    Hello {
        profile: Profile,
        hello: &'a [u8],
    },
    HelloAck {
        profile: Profile,
        hello: &'a [u8],
    },
    Data {
        channel: u16,
        seq: u32,
        first: bool,
        last: bool,
        kind: MessageKind,
        payload: &'a [u8],
    },
    Ack {
        channel: u16,
        cumulative: u32,
        window: u16,
        ranges: Vec<(u32, u32)>,
    },
    Ping {
        reply: bool,
    },
    Close {
        code: u16,
        reason: String,
    },
}

/// Why a datagram was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("datagram of {0} bytes is shorter than the 6-byte header")]
    Short(usize),
    #[error("not a quicsdn UDP datagram (first byte {0:#04x}, expected 0xd5)")]
    Magic(u8),
    #[error("unknown datagram type {0:#04x}")]
    Type(u8),
    #[error("{what} datagram truncated")]
    Truncated { what: &'static str },
    #[error("unknown profile {0}")]
    Profile(u8),
    #[error("invalid message kind {0} in a DATA datagram")]
    Kind(u8),
    #[error("ACK range [{0}, {1}) is empty or reversed")]
    Range(u32, u32),
}

/// A decoded datagram's association id and body.
pub fn decode(buf: &[u8]) -> Result<(u32, Packet<'_>), PacketError> {
    if buf.len() < HEADER_LEN {
        return Err(PacketError::Short(buf.len()));
    }
    if buf[0] != MAGIC {
        return Err(PacketError::Magic(buf[0]));
    }
    let id = u32::from_be_bytes(buf[2..6].try_into().expect("4 bytes"));
    let body = &buf[HEADER_LEN..];
    let truncated = |what| PacketError::Truncated { what };
    let p = match buf[1] {
        t @ (T_HELLO | T_HELLO_ACK) => {
            let (&p, hello) = body.split_first().ok_or(truncated("HELLO"))?;
            let profile = Profile::from_wire(p).ok_or(PacketError::Profile(p))?;
            if t == T_HELLO {
                Packet::Hello { profile, hello }
            } else {
                Packet::HelloAck { profile, hello }
            }
        }
        T_DATA => {
            if body.len() < 7 {
                return Err(truncated("DATA"));
            }
            let flags = body[6];
            let kind = MessageKind::from_bits(flags >> 2).ok_or(PacketError::Kind(flags >> 2))?;
            Packet::Data {
                channel: u16::from_be_bytes([body[0], body[1]]),
                seq: u32::from_be_bytes(body[2..6].try_into().expect("4 bytes")),
                first: flags & FLAG_FIRST != 0,
                last: flags & FLAG_LAST != 0,
                kind,
                payload: &body[7..],
            }
        }
        T_ACK => {
            if body.len() < 9 {
                return Err(truncated("ACK"));
            }
            let n = body[8] as usize;
            if n > MAX_RANGES || body.len() != 9 + 8 * n {
                return Err(truncated("ACK"));
            }
            let mut ranges = Vec::with_capacity(n);
            for r in body[9..].chunks_exact(8) {
                let s = u32::from_be_bytes(r[0..4].try_into().expect("4 bytes"));
                let e = u32::from_be_bytes(r[4..8].try_into().expect("4 bytes"));
                if e <= s {
                    return Err(PacketError::Range(s, e));
                }
                ranges.push((s, e));
            }
            Packet::Ack {
                channel: u16::from_be_bytes([body[0], body[1]]),
                cumulative: u32::from_be_bytes(body[2..6].try_into().expect("4 bytes")),
                window: u16::from_be_bytes([body[6], body[7]]),
                ranges,
            }
        }
        T_PING => Packet::Ping {
            reply: body.first() == Some(&1),
        },
        T_CLOSE => {
            if body.len() < 2 {
                return Err(truncated("CLOSE"));
            }
            Packet::Close {
                code: u16::from_be_bytes([body[0], body[1]]),
                reason: String::from_utf8_lossy(&body[2..]).into_owned(),
            }
        }
        t => return Err(PacketError::Type(t)),
    };
    Ok((id, p))
}

fn header(id: u32, t: u8, cap: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + cap);
    v.push(MAGIC);
    v.push(t);
    v.extend_from_slice(&id.to_be_bytes());
    v
}

/// Encodes a datagram.
pub fn encode(id: u32, p: &Packet<'_>) -> Vec<u8> {
    match p {
        Packet::Hello { profile, hello } | Packet::HelloAck { profile, hello } => {
            let t = if matches!(p, Packet::Hello { .. }) {
                T_HELLO
            } else {
                T_HELLO_ACK
            };
            let mut v = header(id, t, 1 + hello.len());
            v.push(profile.to_wire());
            v.extend_from_slice(hello);
            v
        }
        Packet::Data {
            channel,
            seq,
            first,
            last,
            kind,
            payload,
        } => {
            let mut v = header(id, T_DATA, 7 + payload.len());
            v.extend_from_slice(&channel.to_be_bytes());
            v.extend_from_slice(&seq.to_be_bytes());
            let mut flags = kind.bits() << 2;
            if *first {
                flags |= FLAG_FIRST;
            }
            if *last {
                flags |= FLAG_LAST;
            }
            v.push(flags);
            v.extend_from_slice(payload);
            v
        }
        Packet::Ack {
            channel,
            cumulative,
            window,
            ranges,
        } => {
            let n = ranges.len().min(MAX_RANGES);
            let mut v = header(id, T_ACK, 9 + 8 * n);
            v.extend_from_slice(&channel.to_be_bytes());
            v.extend_from_slice(&cumulative.to_be_bytes());
            v.extend_from_slice(&window.to_be_bytes());
            v.push(n as u8);
            for (s, e) in &ranges[..n] {
                v.extend_from_slice(&s.to_be_bytes());
                v.extend_from_slice(&e.to_be_bytes());
            }
            v
        }
        Packet::Ping { reply } => {
            let mut v = header(id, T_PING, 1);
            if *reply {
                v.push(1);
            }
            v
        }
        Packet::Close { code, reason } => {
            let mut v = header(id, T_CLOSE, 2 + reason.len());
            v.extend_from_slice(&code.to_be_bytes());
            v.extend_from_slice(reason.as_bytes());
            v
        }
    }
}

/// The association id of a datagram and whether it is a HELLO, without
/// decoding the rest (for demultiplexing).
pub fn peek(buf: &[u8]) -> Result<(u32, bool), PacketError> {
    if buf.len() < HEADER_LEN {
        return Err(PacketError::Short(buf.len()));
    }
    if buf[0] != MAGIC {
        return Err(PacketError::Magic(buf[0]));
    }
    let id = u32::from_be_bytes(buf[2..6].try_into().expect("4 bytes"));
    Ok((id, buf[1] == T_HELLO))
}
