//! What may travel in 0-RTT: the replay-safe messages, and the gate that holds
//! everything else until the handshake is complete.
//!
//! RFC 9001 §5.6: "Application data that is received in 0-RTT could cause an
//! application at the server to process the data multiple times rather than just
//! once. [...] An application protocol that uses QUIC MUST include a profile
//! that defines acceptable use of 0-RTT". This is quicsdn's profile:
//!
//! * Only messages that change nothing when processed twice may be carried
//!   before the handshake completes ([`replay_safe`]): OpenFlow HELLO,
//!   ECHO_REQUEST/REPLY and FEATURES_REQUEST/REPLY; OVSDB `echo` and
//!   `get_schema` requests. A replayed HELLO or ECHO opens a connection that
//!   never gets further, since a TLS handshake cannot complete with replayed
//!   packets (RFC 9001 §5.6).
//! * The first message that is not replay-safe waits, and everything after it
//!   waits behind it (order is never changed), until the handshake completes:
//!   the client's data then goes in 1-RTT packets, which cannot be replayed into
//!   another connection.
//! * Both ends enforce it: the switch agent does not send such a message early
//!   ([`EarlyGate`] between OVS and the lanes), and the controller agent does not
//!   deliver one to the controller before its handshake completes (the same gate
//!   between the lanes and the controller), so a misbehaving client gains
//!   nothing.

use crate::rules::{JsonRpcMethod, jsonrpc_method};
use bytes::{Bytes, BytesMut};
use quicsdn_wire::openflow::{Header, Kind};
use quicsdn_wire::{Framer, Framing};

/// The rule, as one sentence for the documentation.
pub const ZERO_RTT_RULE: &str = "Before the QUIC handshake completes, a session may carry only OpenFlow HELLO, ECHO_REQUEST, ECHO_REPLY, FEATURES_REQUEST and FEATURES_REPLY, and OVSDB echo and get_schema requests; the first other message waits, with everything after it, until the handshake completes. RFC 9001 §5.6: \"An application protocol that uses QUIC MUST include a profile that defines acceptable use of 0-RTT\".";

/// True if `msg` (one whole message of `framing`) changes nothing when processed
/// twice, so it may be sent in 0-RTT.
pub fn replay_safe(framing: Framing, msg: &[u8]) -> bool {
    match framing {
        Framing::OpenFlow => Header::parse(msg).is_some_and(|h| {
            matches!(
                h.kind(),
                Kind::Hello
                    | Kind::EchoRequest
                    | Kind::EchoReply
                    | Kind::FeaturesRequest
                    | Kind::FeaturesReply
            )
        }),
        // RFC 7047 §4.1.11 (echo: liveness) and §4.1.2 (get_schema: a read).
        Framing::JsonRpc => matches!(
            jsonrpc_method(msg),
            Some(JsonRpcMethod::Echo | JsonRpcMethod::GetSchema)
        ),
        // No message boundaries: nothing can be judged, nothing goes early.
        Framing::Raw => false,
    }
}

/// Holds back one direction of a session's bytes from the first message that is
/// not replay-safe until [`EarlyGate::confirm`]. Pure: no I/O, no clock.
///
/// Bytes pass only as whole replay-safe messages before confirmation; a partial
/// message waits for the rest of it. Bytes that do not frame (a malformed
/// message) are held too, and released at confirmation so the normal path
/// reports the error.
#[derive(Debug)]
pub struct EarlyGate {
    framer: Framer,
    framing: Framing,
    /// Bytes not yet released, beginning at a message boundary.
    held: BytesMut,
    /// A message that is not replay-safe (or a framing error) is at the front of
    /// `held`: nothing more passes until confirmation.
    blocked: bool,
    confirmed: bool,
    passed_early: u64,
}

impl EarlyGate {
    /// A gate for a session that starts before the handshake completes.
    pub fn new(framing: Framing, max_message: usize) -> EarlyGate {
        EarlyGate {
            framer: Framer::new(framing, max_message),
            framing,
            held: BytesMut::new(),
            blocked: false,
            confirmed: false,
            passed_early: 0,
        }
    }

    /// Takes bytes in stream order and returns those that may go on now.
    pub fn push(&mut self, bytes: &[u8]) -> Bytes {
        if self.confirmed {
            return Bytes::copy_from_slice(bytes);
        }
        self.held.extend_from_slice(bytes);
        let mut pass = 0;
        while !self.blocked {
            match self.framer.next_message(&self.held[pass..]) {
                Ok(Some(n)) if replay_safe(self.framing, &self.held[pass..pass + n]) => {
                    pass += n;
                    self.passed_early += 1;
                }
                Ok(None) => break,
                // Not replay-safe, or not a message at all.
                Ok(Some(_)) | Err(_) => self.blocked = true,
            }
        }
        self.held.split_to(pass).freeze()
    }

    /// True while something waits for the handshake.
    pub fn is_holding(&self) -> bool {
        !self.confirmed && self.blocked
    }

    /// The handshake completed: returns everything held, and lets all later bytes
    /// straight through.
    pub fn confirm(&mut self) -> Bytes {
        self.confirmed = true;
        self.blocked = false;
        std::mem::take(&mut self.held).freeze()
    }

    pub fn is_confirmed(&self) -> bool {
        self.confirmed
    }

    /// Messages that passed before confirmation.
    pub fn passed_early(&self) -> u64 {
        self.passed_early
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quicsdn_wire::openflow::{self, OFP13_VERSION};

    const MAX: usize = 1 << 20;

    fn of(msg_type: u8, xid: u32) -> Vec<u8> {
        openflow::message(OFP13_VERSION, msg_type, xid, &[xid as u8; 4])
    }

    #[test]
    fn openflow_messages_that_may_go_early() {
        let safe: Vec<u8> = (0..=40u8)
            .filter(|&t| replay_safe(Framing::OpenFlow, &of(t, 1)))
            .collect();
        // HELLO, ECHO_REQUEST, ECHO_REPLY, FEATURES_REQUEST, FEATURES_REPLY.
        assert_eq!(safe, vec![0, 2, 3, 5, 6]);
        // Also for OpenFlow 1.0, whose numbers for these are the same.
        assert!(replay_safe(
            Framing::OpenFlow,
            &openflow::message(1, 0, 1, &[])
        ));
        assert!(!replay_safe(
            Framing::OpenFlow,
            &openflow::message(1, 14, 1, &[])
        ));
    }

    #[test]
    fn ovsdb_messages_that_may_go_early() {
        let safe = |s: &str| replay_safe(Framing::JsonRpc, s.as_bytes());
        assert!(safe(r#"{"method":"echo","params":[],"id":"echo"}"#));
        assert!(safe(
            r#"{"id":0,"method":"get_schema","params":["Open_vSwitch"]}"#
        ));
        assert!(!safe(
            r#"{"id":1,"method":"transact","params":["Open_vSwitch"]}"#
        ));
        assert!(!safe(r#"{"id":2,"method":"monitor_cond","params":[]}"#));
        // Replies say nothing about what they answer: they wait.
        assert!(!safe(r#"{"id":"echo","result":[],"error":null}"#));
        assert!(!safe("not json"));
        assert!(!replay_safe(Framing::Raw, b"anything"));
    }

    #[test]
    fn safe_messages_pass_the_first_other_one_waits_with_everything_after_it() {
        let mut g = EarlyGate::new(Framing::OpenFlow, MAX);
        let (hello, echo, port_status, echo2) = (of(0, 1), of(2, 2), of(12, 3), of(2, 4));
        let first = [hello, echo].concat();
        assert_eq!(&g.push(&first)[..], &first[..]);
        assert!(!g.is_holding());
        let later = [port_status, echo2].concat();
        assert!(g.push(&later).is_empty(), "PORT_STATUS is not replay-safe");
        assert!(g.is_holding());
        // Even a replay-safe message waits behind it: order is never changed.
        assert!(g.push(&of(0, 5)).is_empty());
        assert_eq!(&g.confirm()[..], &[later, of(0, 5)].concat()[..]);
        assert!(!g.is_holding());
        assert_eq!(&g.push(&of(14, 6))[..], &of(14, 6)[..]);
        assert_eq!(g.passed_early(), 2);
    }

    #[test]
    fn a_partial_message_waits_for_its_end() {
        let mut g = EarlyGate::new(Framing::OpenFlow, MAX);
        let hello = of(0, 1);
        assert!(g.push(&hello[..3]).is_empty());
        assert!(!g.is_holding(), "incomplete, not refused");
        assert_eq!(&g.push(&hello[3..])[..], &hello[..]);
    }

    #[test]
    fn malformed_bytes_are_held_for_the_normal_path_to_report() {
        let mut g = EarlyGate::new(Framing::OpenFlow, MAX);
        let bad = openflow::message(OFP13_VERSION, 0, 1, &[]);
        let mut bad = bad.clone();
        bad[2..4].copy_from_slice(&4u16.to_be_bytes()); // length below the header
        assert!(g.push(&bad).is_empty());
        assert!(g.is_holding());
        assert_eq!(&g.confirm()[..], &bad[..]);
    }

    #[test]
    fn every_split_of_a_mixed_stream_releases_the_same_prefix_then_the_rest() {
        let msgs = [of(0, 1), of(5, 2), of(6, 3), of(10, 4), of(2, 5)];
        let stream = msgs.concat();
        let safe_prefix = msgs[..3].concat().len();
        for cut in 0..=stream.len() {
            for cut2 in cut..=stream.len() {
                let mut g = EarlyGate::new(Framing::OpenFlow, MAX);
                let mut early = g.push(&stream[..cut]).to_vec();
                early.extend_from_slice(&g.push(&stream[cut..cut2]));
                assert!(early.len() <= safe_prefix);
                let mut all = early.clone();
                all.extend_from_slice(&g.confirm());
                all.extend_from_slice(&g.push(&stream[cut2..]));
                assert_eq!(all, stream, "cuts {cut}, {cut2}");
                if cut2 >= safe_prefix {
                    assert_eq!(early.len(), safe_prefix, "cuts {cut}, {cut2}");
                }
            }
        }
    }

    #[test]
    fn json_gate_passes_echo_and_holds_a_transaction() {
        let mut g = EarlyGate::new(Framing::JsonRpc, MAX);
        let echo = br#"{"method":"echo","params":[],"id":"echo"}"#;
        let tx = br#"{"id":1,"method":"transact","params":["Open_vSwitch",{"op":"insert"}]}"#;
        assert_eq!(&g.push(&[&echo[..], &tx[..]].concat())[..], &echo[..]);
        assert!(g.is_holding());
        assert_eq!(&g.confirm()[..], &tx[..]);
    }

    #[test]
    fn the_rule_in_the_docs_is_the_one_in_the_code() {
        let docs =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/agents.md"))
                .expect("docs/agents.md");
        assert!(
            docs.contains(ZERO_RTT_RULE),
            "docs/agents.md must quote the 0-RTT rule exactly as the code has it:\n{ZERO_RTT_RULE}"
        );
    }

    #[test]
    fn raw_services_send_nothing_early() {
        let mut g = EarlyGate::new(Framing::Raw, MAX);
        assert!(g.push(b"abc").is_empty());
        assert!(g.is_holding());
        assert_eq!(&g.confirm()[..], b"abc");
    }
}
