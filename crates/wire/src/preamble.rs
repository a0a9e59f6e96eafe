//! The few bytes quicsdn itself puts on a QUIC connection (protocol `quicsdn/1`).
//!
//! A connection carries two kinds of bidirectional stream:
//!
//! * one **control stream**, opened by the switch agent first, on which each side
//!   sends one [`Hello`] (varint length, then JSON) describing its services, so a
//!   mismatch is reported by name on both sides;
//! * **lane streams**, each opened by whichever side accepted a local connection
//!   (the session's *opener*). A lane stream starts with a [`LanePreamble`] naming
//!   the service, the session and the lane; after it, both directions carry the
//!   service's messages exactly as the local peers sent them. Nothing is added per
//!   message.
//!
//! Refusals and aborts travel as QUIC application error codes ([`code`]) in
//! RESET_STREAM / STOP_SENDING (RFC 9000 §19.4, §19.5) or CONNECTION_CLOSE
//! (§19.19), so a refused stream costs no extra bytes either.

use crate::varint;
use serde::{Deserialize, Serialize};

/// ALPN protocol identifier (RFC 9001 §8.1 requires ALPN for QUIC; RFC 7301).
pub const ALPN: &[u8] = b"quicsdn/1";

/// First byte of a lane stream.
const LANE_MAGIC: u8 = 0x71;
/// First byte of the control stream.
const CONTROL_MAGIC: u8 = 0x63;
/// Longest service name (names are short identifiers such as `openflow`).
pub const MAX_SERVICE_NAME: usize = 64;
/// Longest hello message.
pub const MAX_HELLO: usize = 64 * 1024;
/// Most lanes one session may use.
pub const MAX_LANES: u64 = 256;

/// QUIC application error codes used by the agents.
pub mod code {
    /// Stream: the receiving agent does not serve this service.
    pub const UNKNOWN_SERVICE: u32 = 0x01;
    /// Stream: the local peer (controller or switch) could not be reached.
    pub const LOCAL_CONNECT_FAILED: u32 = 0x02;
    /// Stream: a local peer sent a malformed message; its session is closed.
    pub const MALFORMED_MESSAGE: u32 = 0x03;
    /// Stream: the local connection failed or was reset.
    pub const LOCAL_ABORT: u32 = 0x04;
    /// Stream: the lane preamble was invalid.
    pub const BAD_PREAMBLE: u32 = 0x05;
    /// Stream or connection: the agent is shutting down.
    pub const SHUTDOWN: u32 = 0x06;
    /// Stream: the service exists but sessions for it are opened by the other side.
    pub const WRONG_DIRECTION: u32 = 0x07;
    /// Connection: the peer broke the quicsdn protocol.
    pub const PROTOCOL_VIOLATION: u32 = 0x10;
    /// Connection: a newer connection from the same switch identity replaced this one.
    pub const SUPERSEDED: u32 = 0x11;

    /// A human-readable name for logs.
    pub fn describe(code: u64) -> &'static str {
        match code as u32 {
            0 => "closed",
            UNKNOWN_SERVICE => "unknown service",
            LOCAL_CONNECT_FAILED => "local peer unreachable",
            MALFORMED_MESSAGE => "malformed message",
            LOCAL_ABORT => "local connection aborted",
            BAD_PREAMBLE => "bad lane preamble",
            SHUTDOWN => "agent shutting down",
            WRONG_DIRECTION => "service is opened from the other side",
            PROTOCOL_VIOLATION => "protocol violation",
            SUPERSEDED => "superseded by a newer connection",
            _ => "unrecognised error code",
        }
    }
}

/// What opens a lane stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanePreamble {
    /// Session identifier chosen by the opener, unique among its open sessions on
    /// this connection.
    pub session: u64,
    /// This lane's index, `0..lanes`.
    pub lane: u64,
    /// How many lanes the session uses.
    pub lanes: u64,
    /// The service, e.g. `openflow`.
    pub service: String,
}

/// Why bytes at the start of a stream are not a valid preamble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreambleError {
    #[error("stream starts with {0:#04x}, not a quicsdn stream type")]
    BadMagic(u8),
    #[error("invalid service name ({0})")]
    BadServiceName(String),
    #[error("lane {lane} of {lanes} is out of range (1..={max} lanes)", max = MAX_LANES)]
    BadLane { lane: u64, lanes: u64 },
    #[error("control message of {0} bytes exceeds the limit")]
    TooLarge(u64),
    #[error("invalid hello: {0}")]
    BadHello(String),
}

/// Service names: 1–64 characters of `[A-Za-z0-9_.-]`. They appear in file names
/// and logs, so nothing else is allowed.
pub fn validate_service_name(name: &str) -> Result<(), PreambleError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SERVICE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(PreambleError::BadServiceName(format!(
            "{name:?}: use 1 to {MAX_SERVICE_NAME} letters, digits, '_', '-' or '.'"
        )))
    }
}

impl LanePreamble {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.service.len());
        out.push(LANE_MAGIC);
        varint::encode(self.session, &mut out);
        varint::encode(self.lane, &mut out);
        varint::encode(self.lanes, &mut out);
        varint::encode(self.service.len() as u64, &mut out);
        out.extend_from_slice(self.service.as_bytes());
        out
    }

    /// Decodes a preamble at the start of `buf`: `Ok(None)` while incomplete,
    /// otherwise the preamble and how many bytes it took.
    pub fn decode(buf: &[u8]) -> Result<Option<(LanePreamble, usize)>, PreambleError> {
        let Some(&magic) = buf.first() else {
            return Ok(None);
        };
        if magic != LANE_MAGIC {
            return Err(PreambleError::BadMagic(magic));
        }
        let mut at = 1;
        let mut next = || -> Option<u64> {
            let (v, n) = varint::decode(&buf[at..])?;
            at += n;
            Some(v)
        };
        let (Some(session), Some(lane), Some(lanes), Some(name_len)) =
            (next(), next(), next(), next())
        else {
            return Ok(None);
        };
        if lanes == 0 || lanes > MAX_LANES || lane >= lanes {
            return Err(PreambleError::BadLane { lane, lanes });
        }
        if name_len == 0 || name_len > MAX_SERVICE_NAME as u64 {
            return Err(PreambleError::BadServiceName(format!("length {name_len}")));
        }
        let end = at + name_len as usize;
        let Some(name) = buf.get(at..end) else {
            return Ok(None);
        };
        let service = String::from_utf8(name.to_vec())
            .map_err(|_| PreambleError::BadServiceName("not UTF-8".into()))?;
        validate_service_name(&service)?;
        Ok(Some((
            LanePreamble {
                session,
                lane,
                lanes,
                service,
            },
            end,
        )))
    }
}

/// Which side accepts the local connections of a service, and so opens its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Opener {
    /// Open vSwitch connects to the switch agent (`punix:`/`ptcp:` on the switch side).
    Switch,
    /// A controller-side tool connects to the controller agent (`punix:`/`ptcp:` there).
    Controller,
}

/// One service as an agent describes it in its hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceOffer {
    pub name: String,
    pub framing: String,
    pub opener: Opener,
}

/// The first and only message each side sends on the control stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Software and version, e.g. `quicsdn 0.1.0`.
    pub agent: String,
    pub services: Vec<ServiceOffer>,
    /// The stream mode this side uses for sessions it opens, e.g. `ordered`.
    pub streams: String,
}

impl Hello {
    /// Control-stream bytes: the control magic byte, a varint length, the JSON.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("hello serialises");
        let mut out = vec![CONTROL_MAGIC];
        varint::encode(json.len() as u64, &mut out);
        out.extend_from_slice(&json);
        out
    }

    /// Decodes a hello at the start of `buf`, `Ok(None)` while incomplete.
    pub fn decode(buf: &[u8]) -> Result<Option<(Hello, usize)>, PreambleError> {
        let Some(&magic) = buf.first() else {
            return Ok(None);
        };
        if magic != CONTROL_MAGIC {
            return Err(PreambleError::BadMagic(magic));
        }
        let Some((len, n)) = varint::decode(&buf[1..]) else {
            return Ok(None);
        };
        if len > MAX_HELLO as u64 {
            return Err(PreambleError::TooLarge(len));
        }
        let end = 1 + n + len as usize;
        let Some(json) = buf.get(1 + n..end) else {
            return Ok(None);
        };
        let hello =
            serde_json::from_slice(json).map_err(|e| PreambleError::BadHello(e.to_string()))?;
        Ok(Some((hello, end)))
    }
}

/// What a stream opened by the peer turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamStart {
    Control(Hello),
    Lane(LanePreamble),
}

impl StreamStart {
    /// Decodes whichever kind of stream `buf` starts, `Ok(None)` while incomplete.
    pub fn decode(buf: &[u8]) -> Result<Option<(StreamStart, usize)>, PreambleError> {
        match buf.first() {
            None => Ok(None),
            Some(&CONTROL_MAGIC) => {
                Ok(Hello::decode(buf)?.map(|(h, n)| (StreamStart::Control(h), n)))
            }
            Some(_) => Ok(LanePreamble::decode(buf)?.map(|(p, n)| (StreamStart::Lane(p), n))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_preamble_round_trips_at_every_split() {
        let p = LanePreamble {
            session: 1_000_000,
            lane: 15,
            lanes: 16,
            service: "openflow".into(),
        };
        let mut bytes = p.encode();
        bytes.extend_from_slice(b"payload");
        let whole = bytes.len() - 7;
        for cut in 0..whole {
            assert_eq!(LanePreamble::decode(&bytes[..cut]), Ok(None), "cut {cut}");
        }
        assert_eq!(LanePreamble::decode(&bytes), Ok(Some((p, whole))));
    }

    #[test]
    fn lane_preamble_rejects_nonsense() {
        assert_eq!(
            LanePreamble::decode(b"GET / HTTP/1.1"),
            Err(PreambleError::BadMagic(b'G'))
        );
        let mut p = LanePreamble {
            session: 0,
            lane: 2,
            lanes: 2,
            service: "openflow".into(),
        };
        assert!(matches!(
            LanePreamble::decode(&p.encode()),
            Err(PreambleError::BadLane { .. })
        ));
        p.lane = 0;
        p.service = "../etc".into();
        assert!(matches!(
            LanePreamble::decode(&p.encode()),
            Err(PreambleError::BadServiceName(_))
        ));
    }

    #[test]
    fn hello_round_trips() {
        let h = Hello {
            agent: "quicsdn 0.1.0".into(),
            services: vec![ServiceOffer {
                name: "ovsdb".into(),
                framing: "jsonrpc".into(),
                opener: Opener::Controller,
            }],
            streams: "rr:16".into(),
        };
        let bytes = h.encode();
        for cut in 0..bytes.len() {
            assert_eq!(Hello::decode(&bytes[..cut]), Ok(None));
        }
        assert_eq!(Hello::decode(&bytes), Ok(Some((h, bytes.len()))));
        assert!(matches!(
            Hello::decode(&[0x63, 3, b'{', b'x', b'}']),
            Err(PreambleError::BadHello(_))
        ));
    }

    #[test]
    fn stream_start_dispatches_on_the_first_byte() {
        let p = LanePreamble {
            session: 3,
            lane: 0,
            lanes: 1,
            service: "ovsdb".into(),
        };
        let bytes = p.encode();
        assert_eq!(
            StreamStart::decode(&bytes),
            Ok(Some((StreamStart::Lane(p), bytes.len())))
        );
        let h = Hello {
            agent: "a".into(),
            services: vec![],
            streams: "ordered".into(),
        };
        let bytes = h.encode();
        assert_eq!(
            StreamStart::decode(&bytes),
            Ok(Some((StreamStart::Control(h), bytes.len())))
        );
        assert_eq!(StreamStart::decode(&[]), Ok(None));
        assert_eq!(StreamStart::decode(&[0]), Err(PreambleError::BadMagic(0)));
    }

    #[test]
    fn service_names() {
        for ok in ["openflow", "ovsdb", "gauge-of", "a.b_c", &"x".repeat(64)] {
            assert!(validate_service_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(validate_service_name(bad).is_err(), "{bad}");
        }
    }
}
