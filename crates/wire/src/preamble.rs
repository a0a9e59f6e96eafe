//! The few bytes quicsdn itself puts on a QUIC connection (protocol `quicsdn/1`).
//!
//! A connection carries three kinds of stream:
//!
//! * one **control stream** (bidirectional), opened by the switch agent first, on
//!   which each side sends one [`Hello`] (varint length, then JSON) describing its
//!   services, so a mismatch is reported by name on both sides;
//! * one **session stream** (bidirectional) per session, opened by whichever side
//!   accepted the local connection (the session's *opener*), starting with a
//!   [`SessionPreamble`]: the session, its stream mode and its service. It is lane
//!   0 of both directions;
//! * **lane streams** (unidirectional), opened by either side for its direction's
//!   further lanes, starting with a [`LanePreamble`].
//!
//! After a preamble a stream carries the service's messages as the local peer
//! sent them; the `safe` stream mode adds small markers at fences only.
//!
//! Refusals and aborts travel as QUIC application error codes ([`code`]) in
//! RESET_STREAM / STOP_SENDING (RFC 9000 §19.4, §19.5) or CONNECTION_CLOSE
//! (§19.19), so a refused stream costs no extra bytes either.

use crate::varint;
use serde::{Deserialize, Serialize};

/// ALPN protocol identifier (RFC 9001 §8.1 requires ALPN for QUIC; RFC 7301).
pub const ALPN: &[u8] = b"quicsdn/1";

/// First byte of a session stream.
const SESSION_MAGIC: u8 = 0x71;
/// First byte of a lane stream.
const LANE_MAGIC: u8 = 0x75;
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
    /// Connection: the controller agent rejected 0-RTT; the switch agent starts
    /// afresh on a new connection.
    pub const ZERO_RTT_REJECTED: u32 = 0x12;
    /// Connection: the switch agent moved back to its preferred controller
    /// agent (`--controller` given several times).
    pub const FAILBACK: u32 = 0x13;
    /// Connection: nothing arrived from the peer for the grace period (up to
    /// twice it while the RTT estimate shows a busy peer); the sender gave
    /// the connection up (`quicsdn_transport::liveness`).
    pub const SILENT: u32 = 0x14;

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
            ZERO_RTT_REJECTED => "0-RTT rejected, reconnecting",
            FAILBACK => "moved back to the preferred controller agent",
            SILENT => "nothing heard past the grace period",
            _ => "unrecognised error code",
        }
    }
}

/// What opens a session stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPreamble {
    /// Session identifier chosen by the opener, unique among its sessions on this
    /// connection.
    pub session: u64,
    /// The stream mode as a code and a parameter (see `quicsdn_lanes::StreamMode`).
    pub mode: (u64, u64),
    /// The service, e.g. `openflow`.
    pub service: String,
}

/// What opens a lane stream (a unidirectional stream carrying lane `lane` of one
/// direction of a session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanePreamble {
    pub session: u64,
    /// True when the stream's sender opened the session (session ids are per
    /// opener, so this says whose id it is).
    pub opened_by_sender: bool,
    /// The lane, 1 or more (lane 0 is the session stream).
    pub lane: u64,
}

/// Why bytes at the start of a stream are not a valid preamble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreambleError {
    #[error("stream starts with {0:#04x}, not a quicsdn stream type")]
    BadMagic(u8),
    #[error("invalid service name ({0})")]
    BadServiceName(String),
    #[error("lane {lane} is out of range (1..{max})", max = MAX_LANES)]
    BadLane { lane: u64 },
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

/// Reads varints one after another from a buffer.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn varint(&mut self) -> Option<u64> {
        let (v, n) = varint::decode(&self.buf[self.at..])?;
        self.at += n;
        Some(v)
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.at)?;
        self.at += 1;
        Some(b)
    }
}

impl SessionPreamble {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.service.len());
        out.push(SESSION_MAGIC);
        varint::encode(self.session, &mut out);
        varint::encode(self.mode.0, &mut out);
        varint::encode(self.mode.1, &mut out);
        varint::encode(self.service.len() as u64, &mut out);
        out.extend_from_slice(self.service.as_bytes());
        out
    }

    /// Decodes a preamble at the start of `buf`: `Ok(None)` while incomplete,
    /// otherwise the preamble and how many bytes it took.
    pub fn decode(buf: &[u8]) -> Result<Option<(SessionPreamble, usize)>, PreambleError> {
        match buf.first() {
            None => return Ok(None),
            Some(&SESSION_MAGIC) => {}
            Some(&b) => return Err(PreambleError::BadMagic(b)),
        }
        let mut r = Reader { buf, at: 1 };
        let (Some(session), Some(code), Some(param), Some(name_len)) =
            (r.varint(), r.varint(), r.varint(), r.varint())
        else {
            return Ok(None);
        };
        if name_len == 0 || name_len > MAX_SERVICE_NAME as u64 {
            return Err(PreambleError::BadServiceName(format!("length {name_len}")));
        }
        let end = r.at + name_len as usize;
        let Some(name) = buf.get(r.at..end) else {
            return Ok(None);
        };
        let service = String::from_utf8(name.to_vec())
            .map_err(|_| PreambleError::BadServiceName("not UTF-8".into()))?;
        validate_service_name(&service)?;
        Ok(Some((
            SessionPreamble {
                session,
                mode: (code, param),
                service,
            },
            end,
        )))
    }
}

impl LanePreamble {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![LANE_MAGIC];
        varint::encode(self.session, &mut out);
        out.push(u8::from(self.opened_by_sender));
        varint::encode(self.lane, &mut out);
        out
    }

    /// Decodes a preamble at the start of `buf`: `Ok(None)` while incomplete.
    pub fn decode(buf: &[u8]) -> Result<Option<(LanePreamble, usize)>, PreambleError> {
        match buf.first() {
            None => return Ok(None),
            Some(&LANE_MAGIC) => {}
            Some(&b) => return Err(PreambleError::BadMagic(b)),
        }
        let mut r = Reader { buf, at: 1 };
        let (Some(session), Some(flags), Some(lane)) = (r.varint(), r.byte(), r.varint()) else {
            return Ok(None);
        };
        if lane == 0 || lane >= MAX_LANES || flags > 1 {
            return Err(PreambleError::BadLane { lane });
        }
        Ok(Some((
            LanePreamble {
                session,
                opened_by_sender: flags == 1,
                lane,
            },
            r.at,
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
    Session(SessionPreamble),
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
            Some(&LANE_MAGIC) => {
                Ok(LanePreamble::decode(buf)?.map(|(p, n)| (StreamStart::Lane(p), n)))
            }
            Some(_) => Ok(SessionPreamble::decode(buf)?.map(|(p, n)| (StreamStart::Session(p), n))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preambles_round_trip_at_every_split() {
        let p = SessionPreamble {
            session: 1_000_000,
            mode: (2, 8),
            service: "openflow".into(),
        };
        let mut bytes = p.encode();
        bytes.extend_from_slice(b"payload");
        let whole = bytes.len() - 7;
        for cut in 0..whole {
            assert_eq!(
                SessionPreamble::decode(&bytes[..cut]),
                Ok(None),
                "cut {cut}"
            );
        }
        assert_eq!(SessionPreamble::decode(&bytes), Ok(Some((p, whole))));
        let l = LanePreamble {
            session: 70_000,
            opened_by_sender: true,
            lane: 9,
        };
        let bytes = l.encode();
        for cut in 0..bytes.len() {
            assert_eq!(LanePreamble::decode(&bytes[..cut]), Ok(None), "cut {cut}");
        }
        assert_eq!(LanePreamble::decode(&bytes), Ok(Some((l, bytes.len()))));
    }

    #[test]
    fn preambles_reject_nonsense() {
        assert_eq!(
            SessionPreamble::decode(b"GET / HTTP/1.1"),
            Err(PreambleError::BadMagic(b'G'))
        );
        let p = SessionPreamble {
            session: 0,
            mode: (0, 0),
            service: "../etc".into(),
        };
        assert!(matches!(
            SessionPreamble::decode(&p.encode()),
            Err(PreambleError::BadServiceName(_))
        ));
        for lane in [0, MAX_LANES] {
            let l = LanePreamble {
                session: 1,
                opened_by_sender: false,
                lane,
            };
            assert!(matches!(
                LanePreamble::decode(&l.encode()),
                Err(PreambleError::BadLane { .. })
            ));
        }
        assert!(matches!(
            LanePreamble::decode(&[0x75, 1, 7, 1]),
            Err(PreambleError::BadLane { .. })
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
        let p = SessionPreamble {
            session: 3,
            mode: (0, 0),
            service: "ovsdb".into(),
        };
        let bytes = p.encode();
        let session = StreamStart::Session(p);
        assert_eq!(
            StreamStart::decode(&bytes),
            Ok(Some((session, bytes.len())))
        );
        let l = LanePreamble {
            session: 3,
            opened_by_sender: false,
            lane: 1,
        };
        let bytes = l.encode();
        assert_eq!(
            StreamStart::decode(&bytes),
            Ok(Some((StreamStart::Lane(l), bytes.len())))
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
