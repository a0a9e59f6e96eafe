//! A UDP socket for quinn that neither sends nor reports ECN codepoints.
//!
//! Why: quinn marks every packet ECT(0) and, once it has received marked
//! packets, acknowledges with ACK_ECN frames, which carry three counters
//! (ECT(0), ECT(1), CE; RFC 9000 §19.3.2) on top of a plain ACK. The ECT(0)
//! count grows with the connection's life, so on a long-lived control
//! connection the counters cost 3 bytes per ACK frame at first, then 4 (past
//! 63 packets), then 6 (past 16,383): measured on `bench overhead`'s 10 msg/s
//! cell, ACK frames averaged 10.5 bytes with ECN. Linux TCP, the baseline,
//! does not negotiate ECN unless the peer asks (`net.ipv4.tcp_ecn = 2`), and a
//! control channel of small messages gains little from it, so the agents
//! leave it off by default (`--ecn` turns it on). Without marks, quinn's ECN
//! validation never starts (RFC 9000 §13.4.2: an endpoint that receives no
//! ECN-marked packets does not report counts), so the peer sends plain ACK
//! frames; congestion is then signalled by loss alone, as for TCP here.
//!
//! quinn 0.11 has no setting for this, so it is done at the socket: the
//! outgoing datagram's codepoint is cleared before sending, and the codepoint
//! read from an incoming datagram is dropped before quinn sees it.

use quinn::udp::{RecvMeta, Transmit};

use crate::tapped::Tap;

/// The tap that clears codepoints both ways (a
/// [`crate::tapped::Tapped`] socket); see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct NoEcn;

impl Tap for NoEcn {
    fn outgoing<'a>(&self, transmit: &Transmit<'a>) -> Option<Transmit<'a>> {
        Some(without_ecn(transmit))
    }

    fn incoming(&self, _bufs: &[std::io::IoSliceMut<'_>], meta: &mut [RecvMeta]) {
        forget_ecn(meta);
    }
}

/// The same datagram(s), sent as Not-ECT.
fn without_ecn<'a>(t: &Transmit<'a>) -> Transmit<'a> {
    Transmit {
        destination: t.destination,
        ecn: None,
        contents: t.contents,
        segment_size: t.segment_size,
        src_ip: t.src_ip,
    }
}

/// Received as if unmarked.
fn forget_ecn(meta: &mut [RecvMeta]) {
    for m in meta {
        m.ecn = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::udp::EcnCodepoint;
    use std::net::SocketAddr;

    #[test]
    fn outgoing_codepoint_is_cleared_and_nothing_else_changes() {
        let to: SocketAddr = "192.0.2.1:6653".parse().unwrap();
        let payload = [1u8, 2, 3];
        let t = Transmit {
            destination: to,
            ecn: Some(EcnCodepoint::Ect0),
            contents: &payload,
            segment_size: Some(1),
            src_ip: None,
        };
        let u = without_ecn(&t);
        assert_eq!(u.ecn, None);
        assert_eq!(
            (u.destination, u.contents, u.segment_size),
            (to, &payload[..], Some(1))
        );
    }

    #[test]
    fn incoming_codepoints_are_dropped() {
        let mut meta = [RecvMeta::default(), RecvMeta::default()];
        meta[0].ecn = Some(EcnCodepoint::Ce);
        meta[1].ecn = Some(EcnCodepoint::Ect0);
        meta[1].len = 42;
        forget_ecn(&mut meta);
        assert!(meta.iter().all(|m| m.ecn.is_none()));
        assert_eq!(meta[1].len, 42);
    }
}
