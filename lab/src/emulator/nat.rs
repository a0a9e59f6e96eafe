//! A port-translating NAT at one end of the link, for emulating a NAT rebinding
//! in front of a switch (RFC 9000 §9.3: the peer's address changes without the
//! endpoint migrating on purpose).
//!
//! Why here and not the kernel's NAT: an nftables SNAT in the sending namespace
//! translates the sender's own UDP GSO batches before they are segmented, and
//! on a device without TX checksum offload (the lab's TAPs) Linux 6.18 then
//! sends every segment with a wrong UDP checksum. A real NAT is a middlebox
//! that only ever sees segmented packets, as this one does.
//!
//! Contract (sans-IO, one frame at a time, as read from a TAP):
//! - The NAT sits at the `inside` end. Frames leaving that end are
//!   [`Nat::outbound`], frames arriving there are [`Nat::inbound`].
//! - IPv4 UDP and TCP are translated; everything else (ARP, ICMP, IPv6, later
//!   fragments) passes untouched.
//! - Mappings are endpoint-independent (RFC 4787 §4.1, RFC 5382 §5.1): one
//!   outside port per protocol and inside address and port, allocated upwards
//!   from `first_port` on the first outbound packet, whatever it is (no TCP
//!   state is kept: a rebinding NAT forgets mid-connection flows, and the next
//!   segment gets a new port). The outside address is the inside address: only
//!   the port changes.
//! - An inbound packet to a port with no mapping is dropped, as a NAT drops
//!   unsolicited traffic (RFC 4787 §5, RFC 5382 §5.2). Without this, the peer's
//!   next packet to the old port would simply arrive and nothing would have
//!   rebound.
//! - Installing a new NAT (the control request `nat`) starts with no mappings:
//!   that is a rebind.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};

use super::classify::{ETH_P_IPV4, IPPROTO_TCP, IPPROTO_UDP, network_header};

/// One end of the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    A,
    B,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatSettings {
    /// The end the NAT sits at (its inside network).
    pub inside: Side,
    /// The first outside port handed out; later mappings take the next free ones.
    pub first_port: u16,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatCounters {
    /// Outbound packets whose source port was translated.
    pub translated_out: u64,
    /// Inbound packets whose destination port was translated back.
    pub translated_in: u64,
    /// Inbound packets dropped because no mapping matched (the link's counters
    /// still count them as delivered: the NAT is past the link's far end).
    pub dropped_unmapped: u64,
    /// Outbound packets dropped because every outside port was taken.
    pub dropped_exhausted: u64,
}

/// A translated transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    Udp,
    Tcp,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mapping {
    pub proto: Proto,
    pub inside: SocketAddrV4,
    pub outside_port: u16,
}

/// What `link show` reports about the NAT.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NatState {
    pub settings: NatSettings,
    pub mappings: Vec<Mapping>,
    pub counters: NatCounters,
}

pub struct Nat {
    settings: NatSettings,
    next_port: u16,
    by_inside: HashMap<(Proto, SocketAddrV4), u16>,
    by_outside: HashMap<(Proto, u16), SocketAddrV4>,
    counters: NatCounters,
}

/// Where the ports and checksum of an IPv4 UDP or TCP packet are in a frame.
struct Transport {
    proto: Proto,
    /// Offset of the UDP or TCP header: source port, then destination port.
    at: usize,
    /// Offset of the checksum.
    csum: usize,
    src: Ipv4Addr,
    dst: Ipv4Addr,
}

fn transport_of(frame: &[u8]) -> Option<Transport> {
    let (ethertype, off) = network_header(frame)?;
    let ip = frame.get(off..)?;
    if ethertype != ETH_P_IPV4 || ip.first()? >> 4 != 4 {
        return None;
    }
    let (proto, csum_at, header_len) = match *ip.get(9)? {
        IPPROTO_UDP => (Proto::Udp, 6, 8),
        IPPROTO_TCP => (Proto::Tcp, 16, 20),
        _ => return None,
    };
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    let fragment_offset = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x1fff;
    // Non-first fragments carry no ports. (Rewriting the first fragment's port
    // stays correct for the whole packet: the checksum update is a delta.)
    if ihl < 20 || fragment_offset != 0 || ip.len() < ihl + header_len {
        return None;
    }
    let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    Some(Transport {
        proto,
        at: off + ihl,
        csum: off + ihl + csum_at,
        src: addr(12),
        dst: addr(16),
    })
}

fn port(frame: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([frame[at], frame[at + 1]])
}

/// Replaces the 16-bit port at `at` and updates the checksum at `t.csum`
/// incrementally: RFC 1624 §3, eqn. 3, HC' = ~(~HC + ~m + m').
fn rewrite_port(frame: &mut [u8], t: &Transport, at: usize, new: u16) {
    let old = port(frame, at);
    frame[at..at + 2].copy_from_slice(&new.to_be_bytes());
    let csum = t.csum;
    let hc = port(frame, csum);
    // RFC 768: a zero UDP checksum means the sender computed none; it stays so.
    if hc == 0 && t.proto == Proto::Udp {
        return;
    }
    let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let mut updated = !(sum as u16);
    // RFC 768: a computed UDP checksum of zero is transmitted as all ones.
    if updated == 0 && t.proto == Proto::Udp {
        updated = 0xffff;
    }
    frame[csum..csum + 2].copy_from_slice(&updated.to_be_bytes());
}

impl Nat {
    pub fn new(settings: NatSettings) -> Nat {
        Nat {
            settings,
            next_port: settings.first_port,
            by_inside: HashMap::new(),
            by_outside: HashMap::new(),
            counters: NatCounters::default(),
        }
    }

    pub fn settings(&self) -> NatSettings {
        self.settings
    }

    /// A frame leaving the inside end. Returns whether to forward it.
    pub fn outbound(&mut self, frame: &mut [u8]) -> bool {
        let Some(t) = transport_of(frame) else {
            return true;
        };
        let inside = SocketAddrV4::new(t.src, port(frame, t.at));
        let outside = match self.by_inside.get(&(t.proto, inside)) {
            Some(&p) => p,
            None => match self.allocate(t.proto) {
                Some(p) => {
                    self.by_inside.insert((t.proto, inside), p);
                    self.by_outside.insert((t.proto, p), inside);
                    p
                }
                None => {
                    self.counters.dropped_exhausted += 1;
                    return false;
                }
            },
        };
        rewrite_port(frame, &t, t.at, outside);
        self.counters.translated_out += 1;
        true
    }

    /// A frame arriving at the inside end. Returns whether to forward it.
    pub fn inbound(&mut self, frame: &mut [u8]) -> bool {
        let Some(t) = transport_of(frame) else {
            return true;
        };
        match self.by_outside.get(&(t.proto, port(frame, t.at + 2))) {
            Some(inside) if *inside.ip() == t.dst => {
                rewrite_port(frame, &t, t.at + 2, inside.port());
                self.counters.translated_in += 1;
                true
            }
            _ => {
                self.counters.dropped_unmapped += 1;
                false
            }
        }
    }

    /// The next free outside port at or above `first_port`, wrapping around.
    fn allocate(&mut self, proto: Proto) -> Option<u16> {
        let first = self.settings.first_port;
        let span = u32::from(u16::MAX - first) + 1;
        for _ in 0..span {
            let p = self.next_port;
            self.next_port = if p == u16::MAX { first } else { p + 1 };
            if !self.by_outside.contains_key(&(proto, p)) {
                return Some(p);
            }
        }
        None
    }

    pub fn state(&self) -> NatState {
        let mut mappings: Vec<Mapping> = self
            .by_inside
            .iter()
            .map(|(&(proto, inside), &outside_port)| Mapping {
                proto,
                inside,
                outside_port,
            })
            .collect();
        mappings.sort_by_key(|m| (m.proto, m.outside_port));
        NatState {
            settings: self.settings,
            mappings,
            counters: self.counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SW: [u8; 4] = [10, 254, 1, 2];
    const CTL: [u8; 4] = [10, 254, 1, 1];

    fn csum_at(proto: u8) -> usize {
        if proto == IPPROTO_UDP { 6 } else { 16 }
    }

    /// The checksum from scratch (RFC 768, RFC 9293 §3.1): pseudo-header, then
    /// the segment with its checksum field zeroed.
    fn checksum(proto: u8, src: [u8; 4], dst: [u8; 4], seg: &[u8]) -> u16 {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&src);
        bytes.extend_from_slice(&dst);
        bytes.extend_from_slice(&[0, proto]);
        bytes.extend_from_slice(&(seg.len() as u16).to_be_bytes());
        let c = csum_at(proto);
        bytes.extend_from_slice(&seg[..c]);
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(&seg[c + 2..]);
        if bytes.len() % 2 == 1 {
            bytes.push(0);
        }
        let mut sum: u32 = bytes
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// Whether a frame's transport checksum verifies: the ones'-complement sum
    /// over pseudo-header and segment, checksum included, is all ones (0 and
    /// 0xffff are the same number, so both encodings pass).
    fn verifies(f: &[u8]) -> bool {
        let seg = &f[34..];
        let proto = f[23];
        let stored = port(f, 34 + csum_at(proto));
        let fresh = checksum(
            proto,
            f[26..30].try_into().unwrap(),
            f[30..34].try_into().unwrap(),
            seg,
        );
        stored == fresh || (stored ^ fresh == 0xffff && (stored == 0 || fresh == 0))
    }

    /// An Ethernet + IPv4 + UDP or TCP frame with a correct checksum, or for
    /// UDP with `csum` false none.
    fn frame(
        proto: u8,
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        payload: &[u8],
        csum: bool,
    ) -> Vec<u8> {
        let mut seg = Vec::new();
        seg.extend_from_slice(&sport.to_be_bytes());
        seg.extend_from_slice(&dport.to_be_bytes());
        if proto == IPPROTO_UDP {
            seg.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            seg.extend_from_slice(&[0, 0]);
        } else {
            // seq, ack, data offset 5, ACK|PSH, window, checksum, urgent pointer
            seg.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        }
        seg.extend_from_slice(payload);
        if csum {
            let c = checksum(proto, src, dst, &seg);
            let c = if proto == IPPROTO_UDP && c == 0 {
                0xffff
            } else {
                c
            };
            seg[csum_at(proto)..csum_at(proto) + 2].copy_from_slice(&c.to_be_bytes());
        }
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETH_P_IPV4.to_be_bytes());
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&((20 + seg.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&seg);
        f
    }

    fn udp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
        frame(IPPROTO_UDP, src, sport, dst, dport, payload, true)
    }

    /// Source and destination port.
    fn ports(f: &[u8]) -> (u16, u16) {
        (port(f, 34), port(f, 36))
    }

    fn nat(first_port: u16) -> Nat {
        Nat::new(NatSettings {
            inside: Side::B,
            first_port,
        })
    }

    #[test]
    fn outbound_gets_a_mapping_and_replies_come_back_to_the_inside_port() {
        let mut n = nat(40001);
        let mut out = udp(SW, 35563, CTL, 6653, b"quic");
        assert!(n.outbound(&mut out));
        assert_eq!(ports(&out).0, 40001);
        // The same inside endpoint keeps its port.
        let mut again = udp(SW, 35563, CTL, 6653, b"more");
        assert!(n.outbound(&mut again));
        assert_eq!(ports(&again).0, 40001);
        // Another inside endpoint gets the next one.
        let mut other = udp(SW, 35564, CTL, 6653, b"x");
        assert!(n.outbound(&mut other));
        assert_eq!(ports(&other).0, 40002);

        let mut reply = udp(CTL, 6653, SW, 40001, b"reply");
        assert!(n.inbound(&mut reply));
        assert_eq!(ports(&reply).1, 35563);
        assert!([&out, &again, &other, &reply].iter().all(|f| verifies(f)));
        let s = n.state();
        assert_eq!(s.mappings.len(), 2);
        assert_eq!(s.counters.translated_out, 3);
        assert_eq!(s.counters.translated_in, 1);
    }

    #[test]
    fn tcp_is_translated_separately_from_udp() {
        let mut n = nat(40001);
        let mut seg = frame(IPPROTO_TCP, SW, 50000, CTL, 6653, b"openflow", true);
        assert!(n.outbound(&mut seg));
        assert_eq!(ports(&seg).0, 40001);
        assert!(verifies(&seg));
        // UDP to the port TCP got is not TCP's mapping.
        let mut udp_in = udp(CTL, 6653, SW, 40001, b"");
        assert!(!n.inbound(&mut udp_in));
        let mut back = frame(IPPROTO_TCP, CTL, 6653, SW, 40001, b"", true);
        assert!(n.inbound(&mut back));
        assert_eq!(ports(&back).1, 50000);
        assert!(verifies(&back));
        let m = &n.state().mappings[0];
        assert_eq!((m.proto, m.outside_port), (Proto::Tcp, 40001));
    }

    #[test]
    fn unmapped_inbound_is_dropped_and_a_new_nat_is_a_rebind() {
        let mut n = nat(40001);
        // Before anything went out, nothing comes in (the old, untranslated port).
        let mut stale = udp(CTL, 6653, SW, 35563, b"late");
        assert!(!n.inbound(&mut stale));
        let mut out = udp(SW, 35563, CTL, 6653, b"quic");
        assert!(n.outbound(&mut out));
        // A reply to the right port for another inside address is not a match.
        let mut wrong_host = udp(CTL, 6653, [10, 254, 1, 3], 40001, b"r");
        assert!(!n.inbound(&mut wrong_host));
        assert_eq!(n.state().counters.dropped_unmapped, 2);

        // Rebind: a fresh NAT from another port forgets 40001.
        let mut n = nat(41000);
        let mut to_old = udp(CTL, 6653, SW, 40001, b"r");
        assert!(!n.inbound(&mut to_old));
        let mut out = udp(SW, 35563, CTL, 6653, b"quic");
        assert!(n.outbound(&mut out));
        assert_eq!(ports(&out).0, 41000);
    }

    #[test]
    fn other_traffic_passes_untouched() {
        let mut n = nat(40001);
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let before = arp.clone();
        assert!(n.outbound(&mut arp) && n.inbound(&mut arp));
        assert_eq!(arp, before);
        let mut icmp = udp(SW, 35563, CTL, 6653, b"ping");
        icmp[23] = 1;
        let before = icmp.clone();
        assert!(n.outbound(&mut icmp) && n.inbound(&mut icmp));
        assert_eq!(icmp, before);
        // A later fragment has no ports to translate.
        let mut fragment = udp(SW, 35563, CTL, 6653, b"tail");
        fragment[20..22].copy_from_slice(&0x0010u16.to_be_bytes());
        let before = fragment.clone();
        assert!(n.outbound(&mut fragment));
        assert_eq!(fragment, before);
        assert_eq!(n.state().counters, NatCounters::default());
    }

    #[test]
    fn ports_run_out_at_the_top_and_then_outbound_is_dropped() {
        let mut n = nat(65534);
        for (i, sport) in [1000u16, 1001].into_iter().enumerate() {
            let mut f = udp(SW, sport, CTL, 6653, b"");
            assert!(n.outbound(&mut f));
            assert_eq!(ports(&f).0, 65534 + i as u16);
        }
        let mut f = udp(SW, 1002, CTL, 6653, b"");
        assert!(!n.outbound(&mut f));
        assert_eq!(n.state().counters.dropped_exhausted, 1);
    }

    #[test]
    fn a_zero_udp_checksum_stays_zero() {
        let mut n = nat(40001);
        let mut f = frame(IPPROTO_UDP, SW, 35563, CTL, 6653, b"no checksum", false);
        assert!(n.outbound(&mut f));
        assert_eq!((ports(&f), port(&f, 40)), ((40001, 6653), 0));
    }

    proptest! {
        /// After translation both ways the checksum verifies, for UDP and TCP,
        /// any ports and payload (RFC 1624's incremental update equals a
        /// recomputation).
        #[test]
        fn translated_checksums_verify(
            tcp in any::<bool>(), sport in 1u16.., dport in 1u16.., first in 1024u16..,
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let proto = if tcp { IPPROTO_TCP } else { IPPROTO_UDP };
            let mut n = nat(first);
            let mut out = frame(proto, SW, sport, CTL, dport, &payload, true);
            prop_assert!(n.outbound(&mut out));
            prop_assert_eq!(ports(&out).0, first);
            prop_assert!(verifies(&out));
            prop_assert!(proto == IPPROTO_TCP || port(&out, 40) != 0);

            let mut back = frame(proto, CTL, dport, SW, first, &payload, true);
            prop_assert!(n.inbound(&mut back));
            prop_assert_eq!(ports(&back).1, sport);
            prop_assert!(verifies(&back));
        }
    }
}
