//! `quicsdn-wire`: the bytes on the wire, with no I/O.
//!
//! This is the bottom layer of quicsdn (`wire` → `lanes` → `transport` → `agent` → CLI),
//! playing the role of Open vSwitch's `vconn`: it turns a byte stream into whole
//! messages and back, and knows the few bytes quicsdn adds of its own.
//!
//! * [`framing`] splits a local connection's byte stream into whole messages:
//!   OpenFlow (header-length framing, any version), JSON-RPC as OVSDB speaks it
//!   (concatenated JSON objects), or raw bytes. Framers are pure state machines
//!   that accept input split or merged at any byte boundary.
//! * [`decode`] summarises whole messages in one line each (`quicsdn snoop`).
//! * [`openflow`] reads OpenFlow headers and names message types across versions.
//! * [`preamble`] encodes the few bytes that open each QUIC stream (which service,
//!   which session, which lane) and the agents' hello exchange.
//! * [`varint`] is the QUIC variable-length integer (RFC 9000 §16) used by the preamble.
//!
//! Nothing here allocates per message beyond what the caller hands in, touches a
//! socket, or reads a clock.

pub mod decode;
pub mod framing;
pub mod openflow;
pub mod preamble;
pub mod varint;

pub use framing::{FrameError, Framer, Framing};
