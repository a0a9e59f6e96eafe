//! The switch agent's HELLO stand-in: OVS's OpenFlow connection is answered at
//! once, from the HELLO the controller sent in the previous session, before
//! the controller's own HELLO can arrive (when: the agent's `stand_in`
//! module). No I/O, no clock.
//!
//! Why: Open vSwitch gives a new controller connection one second (or its
//! backoff) to deliver the controller's HELLO (`rconn`'s CONNECTING state, the
//! vconn version negotiation) and otherwise drops it and doubles its backoff.
//! After a controller-agent restart the switch agent needs longer than that to
//! reconnect under a storm of switches, so without a stand-in OVS gave up
//! hundreds of times per 1,000 switches (issue 18).
//!
//! The exchange stays OpenFlow 1.3.5 §6.3.1: "each side of the connection must
//! immediately send an OFPT_HELLO message", and "upon receipt of this message,
//! the recipient must calculate the OpenFlow switch protocol version to be
//! used". OVS receives the controller's own earlier HELLO and negotiates with
//! it; OVS's HELLO is forwarded to the controller as usual, and the
//! controller's new HELLO, which must be the first message it sends, is
//! swallowed, so OVS sees exactly one. If that HELLO would make OVS negotiate
//! another version than the one it negotiated with the stand-in (the
//! controller was upgraded or reconfigured meanwhile), the two ends would
//! speak different versions: [`HelloStandIn::push`] fails and the session must
//! be closed, so OVS reconnects and negotiates afresh.

use bytes::{Bytes, BytesMut};
use quicsdn_wire::openflow::hello::{HelloError, HelloOffer};
use quicsdn_wire::openflow::{HEADER_LEN, Header};

/// Why the controller's first message cannot be swallowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StandInError {
    #[error("the controller's first message is not a valid HELLO: {0}")]
    NotHello(HelloError),
    #[error(
        "the controller's HELLO negotiates OpenFlow version 0x{controller:02x} with OVS, but OVS \
         negotiated 0x{ovs:02x} with the HELLO this agent sent on the controller's behalf \
         (remembered from the previous session)"
    )]
    Mismatch { ovs: u8, controller: u8 },
}

/// The first whole message of `bytes` if it is a HELLO: what to remember of a
/// session's first message from the controller.
pub fn leading_hello(bytes: &[u8]) -> Option<&[u8]> {
    // parse() checks the message is whole.
    HelloOffer::parse(bytes).ok()?;
    Some(&bytes[..usize::from(Header::parse(bytes)?.length)])
}

/// One OVS connection that got a stand-in HELLO: swallows the controller's.
#[derive(Debug)]
pub struct HelloStandIn {
    ovs: HelloOffer,
    negotiated: u8,
    /// The controller's bytes until its first message is whole.
    buf: BytesMut,
    /// The controller's HELLO, once it arrived and matched.
    swallowed: Option<Bytes>,
}

impl HelloStandIn {
    /// `sent`: the HELLO sent to OVS on the controller's behalf; `ovs`: OVS's
    /// HELLO (its first message).
    pub fn new(sent: &[u8], ovs: &[u8]) -> Result<HelloStandIn, HelloError> {
        let sent = HelloOffer::parse(sent)?;
        let ovs = HelloOffer::parse(ovs)?;
        Ok(HelloStandIn {
            negotiated: ovs.negotiate(&sent),
            ovs,
            buf: BytesMut::new(),
            swallowed: None,
        })
    }

    /// The version OVS negotiated with the stand-in HELLO.
    pub fn negotiated(&self) -> u8 {
        self.negotiated
    }

    /// The controller's HELLO, once swallowed.
    pub fn swallowed(&self) -> Option<&Bytes> {
        self.swallowed.as_ref()
    }

    /// Takes the controller's bytes in order and returns those to deliver to
    /// OVS: everything but its first message, the HELLO.
    pub fn push(&mut self, bytes: Bytes) -> Result<Bytes, StandInError> {
        if self.swallowed.is_some() {
            return Ok(bytes);
        }
        self.buf.extend_from_slice(&bytes);
        let Some(h) = Header::parse(&self.buf) else {
            return Ok(Bytes::new());
        };
        let len = usize::from(h.length).max(HEADER_LEN);
        if self.buf.len() < len {
            // A HELLO is small; anything else fails below once whole. A
            // length field below the header's size is left to parse().
            if usize::from(h.length) >= HEADER_LEN {
                return Ok(Bytes::new());
            }
        }
        let theirs = HelloOffer::parse(&self.buf).map_err(StandInError::NotHello)?;
        let controller = self.ovs.negotiate(&theirs);
        if controller != self.negotiated {
            return Err(StandInError::Mismatch {
                ovs: self.negotiated,
                controller,
            });
        }
        let mut rest = std::mem::take(&mut self.buf);
        self.swallowed = Some(rest.split_to(len).freeze());
        Ok(rest.freeze())
    }
}

/// OVS's ECHO_REQUESTs, answered on the controller's behalf while an OVS
/// connection that got a stand-in HELLO waits for the controller (when: the
/// agent's `stand_in` module). No I/O, no clock.
///
/// Why: once OVS has a HELLO it probes its controller after 5 s of silence
/// and drops the connection 5 s later without an answer (`rconn`'s
/// inactivity probe). After a controller-agent restart under thousands of
/// switches a session can wait longer than that for its turn, so OVS dropped
/// connections it had just been given (issue 18).
///
/// OpenFlow 1.3.5 §7.5.3: "An Echo Reply message consists of an OpenFlow
/// header plus the unmodified data field of an echo request message", so the
/// reply is the request with its type changed. OVS's bytes all still go to the
/// controller, its echo requests included: this only watches them. The
/// controller's own replies to those then reach OVS as well, and OVS takes an
/// echo reply it did not wait for as a sign of life and nothing more
/// (`rconn` counts any message received as activity).
#[derive(Debug)]
pub struct EchoStandIn {
    max_message: usize,
    /// Bytes of the message now passing that are still to come (not kept).
    skip: usize,
    /// The next message's first bytes: a partial header, or an ECHO_REQUEST
    /// still arriving.
    head: BytesMut,
    stopped: bool,
}

impl EchoStandIn {
    /// Watches OVS's bytes from a message boundary on; messages longer than
    /// `max_message` are never kept.
    pub fn new(max_message: usize) -> EchoStandIn {
        EchoStandIn {
            max_message,
            skip: 0,
            head: BytesMut::new(),
            stopped: false,
        }
    }

    /// Takes the bytes OVS sent, in order (they pass on unchanged, elsewhere),
    /// and returns an ECHO_REPLY for each ECHO_REQUEST they complete.
    pub fn observe(&mut self, mut bytes: &[u8]) -> Vec<Bytes> {
        let mut replies = Vec::new();
        while !self.stopped && !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            // The header first, then an echo request's body.
            let want = match Header::parse(&self.head) {
                None => HEADER_LEN,
                Some(h) => usize::from(h.length),
            };
            let n = want.saturating_sub(self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            let Some(h) = Header::parse(&self.head) else {
                continue;
            };
            let len = usize::from(h.length);
            if len < HEADER_LEN || len > self.max_message {
                // Malformed: the session's normal path reports it; from here
                // the boundaries cannot be trusted, so watch no further.
                self.stop();
                break;
            }
            if h.msg_type != ECHO_REQUEST {
                self.skip = len - self.head.len();
                self.head.clear();
            } else if self.head.len() == len {
                let mut reply = std::mem::take(&mut self.head);
                reply[1] = ECHO_REPLY;
                replies.push(reply.freeze());
            }
        }
        replies
    }

    /// The controller spoke (its HELLO arrived): it answers from now on.
    pub fn stop(&mut self) {
        self.stopped = true;
        self.head = BytesMut::new();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
}

/// OpenFlow message types (the same in every version, OpenFlow 1.3.5 §7.1).
const ECHO_REQUEST: u8 = 2;
const ECHO_REPLY: u8 = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use quicsdn_wire::openflow::{OFP10_VERSION, OFP13_VERSION, OFP15_VERSION, message};

    fn hello(version: u8, bitmap: u32) -> Vec<u8> {
        let mut e = vec![0, 1, 0, 8];
        e.extend_from_slice(&bitmap.to_be_bytes());
        message(version, 0, 1, &e)
    }
    const OVS13: u32 = 1 << 4;
    const RYU: u32 = 0b111_1110;

    #[test]
    fn swallows_the_controllers_hello_in_any_split_and_passes_the_rest() {
        let ctl = hello(OFP15_VERSION, RYU);
        let features = message(OFP13_VERSION, 5, 2, &[]);
        let stream = [ctl.clone(), features.clone()].concat();
        for cut in 0..stream.len() {
            let mut s = HelloStandIn::new(&ctl, &hello(OFP13_VERSION, OVS13)).unwrap();
            assert_eq!(s.negotiated(), OFP13_VERSION);
            let mut out = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                out.extend_from_slice(&s.push(Bytes::copy_from_slice(part)).unwrap());
            }
            assert_eq!(out, features, "cut at {cut}");
            assert_eq!(s.swallowed().map(|b| &b[..]), Some(&ctl[..]));
        }
    }

    #[test]
    fn a_controller_hello_that_changes_the_version_is_refused() {
        // Remembered: 1.0-1.5; now the controller offers 1.0 only.
        let mut s =
            HelloStandIn::new(&hello(OFP15_VERSION, RYU), &hello(OFP15_VERSION, RYU)).unwrap();
        assert_eq!(s.negotiated(), OFP15_VERSION);
        let e = s
            .push(Bytes::from(hello(OFP10_VERSION, 1 << 1)))
            .unwrap_err();
        assert_eq!(
            e,
            StandInError::Mismatch {
                ovs: OFP15_VERSION,
                controller: OFP10_VERSION
            }
        );
        assert!(e.to_string().contains("0x01"), "{e}");
        // A different bitmap that negotiates the same version is fine.
        let mut s =
            HelloStandIn::new(&hello(OFP15_VERSION, RYU), &hello(OFP13_VERSION, OVS13)).unwrap();
        let same = hello(OFP13_VERSION, OVS13 | 1 << 1);
        assert_eq!(s.push(Bytes::from(same)).unwrap(), Bytes::new());
    }

    #[test]
    fn a_first_message_that_is_not_a_hello_is_refused() {
        let mut s =
            HelloStandIn::new(&hello(OFP13_VERSION, OVS13), &hello(OFP13_VERSION, OVS13)).unwrap();
        let e = s
            .push(Bytes::from(message(OFP13_VERSION, 5, 2, &[])))
            .unwrap_err();
        assert!(matches!(e, StandInError::NotHello(HelloError::NotHello(5))));
        // A length field below the header's size cannot wait for more bytes.
        let mut s =
            HelloStandIn::new(&hello(OFP13_VERSION, OVS13), &hello(OFP13_VERSION, OVS13)).unwrap();
        assert!(
            s.push(Bytes::from_static(&[4, 0, 0, 4, 0, 0, 0, 1]))
                .is_err()
        );
        assert!(HelloStandIn::new(&message(4, 2, 1, &[]), &hello(4, OVS13)).is_err());
    }

    #[test]
    fn leading_hello_finds_only_a_whole_hello() {
        let h = hello(OFP13_VERSION, OVS13);
        let both = [h.clone(), message(OFP13_VERSION, 5, 2, &[])].concat();
        assert_eq!(leading_hello(&both), Some(&h[..]));
        assert_eq!(leading_hello(&h[..10]), None);
        assert_eq!(leading_hello(&both[h.len()..]), None);
    }

    fn echo(xid: u32, data: &[u8]) -> Vec<u8> {
        message(OFP13_VERSION, 2, xid, data)
    }

    #[test]
    fn answers_each_echo_request_in_any_split_and_lets_everything_pass() {
        let stream = [
            hello(OFP13_VERSION, OVS13),
            echo(7, b"probe"),
            message(OFP13_VERSION, 10, 3, &[9; 40]), // a PACKET_IN
            echo(8, &[]),
        ]
        .concat();
        let want = vec![
            Bytes::from(message(OFP13_VERSION, 3, 7, b"probe")),
            Bytes::from(message(OFP13_VERSION, 3, 8, &[])),
        ];
        for a in 0..stream.len() {
            for b in a..stream.len() {
                let mut w = EchoStandIn::new(1024);
                let mut got = Vec::new();
                for part in [&stream[..a], &stream[a..b], &stream[b..]] {
                    got.extend(w.observe(part));
                }
                assert_eq!(got, want, "cuts at {a}, {b}");
            }
        }
    }

    #[test]
    fn a_stopped_or_confused_watch_answers_nothing_more() {
        let mut w = EchoStandIn::new(1024);
        assert_eq!(w.observe(&echo(1, b"x")).len(), 1);
        w.stop();
        assert!(w.is_stopped());
        assert!(w.observe(&echo(2, b"x")).is_empty());
        // A length below the header's, or above the limit: stop, do not guess.
        for bad in [
            vec![4, 2, 0, 4, 0, 0, 0, 1],
            message(OFP13_VERSION, 2, 3, &[0; 100]),
        ] {
            let mut w = EchoStandIn::new(64);
            assert!(w.observe(&[bad, echo(4, b"")].concat()).is_empty());
            assert!(w.is_stopped());
        }
    }
}
