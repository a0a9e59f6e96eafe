//! Protocol classification of Ethernet frames for the per-class counters.
//!
//! Contract:
//! - Input is a whole Ethernet II frame as read from a TAP (`IFF_NO_PI`): 14-byte header,
//!   optionally one 802.1Q tag, no FCS.
//! - TCP with source or destination port in [`Classifier::openflow_ports`] (6653, 6633)
//!   is [`Class::OpenFlow`]; TCP port [`Classifier::ovsdb_port`] (6640) is [`Class::Ovsdb`];
//!   UDP port [`Classifier::quic_port`] (default 6653, the quicsdn default) is
//!   [`Class::Quic`]; other TCP/UDP is [`Class::TcpOther`]/[`Class::UdpOther`]; ICMP and
//!   ICMPv6 are [`Class::Icmp`]; ARP is [`Class::Arp`]; everything else (including
//!   non-first IPv4 fragments and IPv6 with extension headers) is [`Class::Other`].
//! - `payload` is the transport payload **carried in this frame**: IP length minus IP,
//!   TCP/UDP headers (so Ethernet padding and fragmentation never inflate it); 0 for
//!   non-TCP/UDP frames. Truncated or malformed headers classify as `Other`, payload 0.

use serde::{Deserialize, Serialize};

/// A protocol class. The discriminants index counter arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    OpenFlow = 0,
    Ovsdb = 1,
    TcpOther = 2,
    Quic = 3,
    UdpOther = 4,
    Icmp = 5,
    Arp = 6,
    Other = 7,
}

impl Class {
    pub const COUNT: usize = 8;
    pub const ALL: [Class; Class::COUNT] = [
        Class::OpenFlow,
        Class::Ovsdb,
        Class::TcpOther,
        Class::Quic,
        Class::UdpOther,
        Class::Icmp,
        Class::Arp,
        Class::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::OpenFlow => "openflow",
            Class::Ovsdb => "ovsdb",
            Class::TcpOther => "tcp_other",
            Class::Quic => "quic",
            Class::UdpOther => "udp_other",
            Class::Icmp => "icmp",
            Class::Arp => "arp",
            Class::Other => "other",
        }
    }

    pub fn from_index(i: usize) -> Class {
        Class::ALL[i]
    }
}

/// Result of classifying one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameClass {
    pub class: Class,
    /// Transport (TCP/UDP) payload bytes in this frame.
    pub payload: u32,
}

/// Port-based classifier. Cheap to copy; lives inside each direction's model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classifier {
    pub openflow_ports: Vec<u16>,
    pub ovsdb_port: u16,
    pub quic_port: u16,
}

impl Default for Classifier {
    fn default() -> Self {
        Self {
            openflow_ports: vec![6653, 6633],
            ovsdb_port: 6640,
            quic_port: 6653,
        }
    }
}

pub(crate) const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_8021Q: u16 = 0x8100;
const IPPROTO_ICMP: u8 = 1;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;

#[inline]
fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The EtherType of an Ethernet II frame and the offset of its network header,
/// past at most one 802.1Q tag.
pub(crate) fn network_header(f: &[u8]) -> Option<(u16, usize)> {
    let ethertype = be16(f, 12)?;
    if ethertype == ETH_P_8021Q {
        Some((be16(f, 16)?, 18))
    } else {
        Some((ethertype, 14))
    }
}

/// A UDP datagram with at most this many payload bytes counts as ACK-only (see
/// [`Classifier::is_ack_only`]).
pub const UDP_ACK_ONLY_MAX_PAYLOAD: usize = 64;

/// The IP protocol number and transport segment of an IPv4 or IPv6 frame
/// (first fragments only; the segment ends where the IP length says).
/// `Some(None)`: not IP; `None`: malformed.
fn transport_segment(f: &[u8]) -> Option<Option<(u8, &[u8])>> {
    let (ethertype, off) = network_header(f)?;
    let ip = f.get(off..)?;
    Some(Some(match ethertype {
        ETH_P_IPV4 => {
            let ihl = ((*ip.first()? & 0x0f) as usize) * 4;
            let total = be16(ip, 2)? as usize;
            if ihl < 20 || total < ihl || total > ip.len() || be16(ip, 6)? & 0x1fff != 0 {
                return None;
            }
            (*ip.get(9)?, &ip[ihl..total])
        }
        ETH_P_IPV6 => {
            let plen = be16(ip, 4)? as usize;
            (*ip.get(6)?, ip.get(40..40 + plen)?)
        }
        _ => return Some(None),
    }))
}

/// What a frame carries, for the accounting of overhead by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrameKind {
    /// Application data (with whatever control rides along).
    #[default]
    Data,
    /// Transport control only: ACKs, keep-alive PINGs, window updates
    /// ([`Classifier::is_ack_only`]).
    AckOnly,
    /// Connection setup and teardown: TCP SYN, FIN or RST segments without
    /// payload; QUIC long-header packets (Initial, 0-RTT, Handshake, Retry) on
    /// the QUIC port.
    Handshake,
}

impl Classifier {
    /// The kind of a frame: handshake, ACK-only or data (see [`FrameKind`]).
    pub fn frame_kind(&self, f: &[u8]) -> FrameKind {
        if self.try_is_handshake(f).unwrap_or(false) {
            FrameKind::Handshake
        } else if self.is_ack_only(f) {
            FrameKind::AckOnly
        } else {
            FrameKind::Data
        }
    }

    fn try_is_handshake(&self, f: &[u8]) -> Option<bool> {
        let Some((proto, seg)) = transport_segment(f)? else {
            return Some(false);
        };
        match proto {
            IPPROTO_TCP => {
                let doff = ((*seg.get(12)? >> 4) as usize) * 4;
                let flags = *seg.get(13)?;
                // SYN, FIN or RST without payload (a FIN on a data segment is data).
                Some(seg.len() == doff && flags & 0x07 != 0)
            }
            IPPROTO_UDP => {
                let quic = be16(seg, 0)? == self.quic_port || be16(seg, 2)? == self.quic_port;
                Some(quic && seg.get(8).is_some_and(|b| b & 0x80 != 0))
            }
            _ => Some(false),
        }
    }

    /// Whether a frame carries only transport control, no application data.
    ///
    /// * TCP: no payload, ACK set, none of SYN, FIN, RST (a pure ACK, window update or
    ///   duplicate ACK). Exact.
    /// * UDP: **a size heuristic**, since QUIC and kcptun encrypt everything after the
    ///   header. A datagram with at most [`UDP_ACK_ONLY_MAX_PAYLOAD`] payload bytes
    ///   counts, except QUIC long-header packets (handshake) on the QUIC port. A QUIC
    ///   1-RTT packet with an ACK frame is about 1 + 8 (connection ID) + 1–4 (packet
    ///   number) + 5–20 (ACK) + 16 (AEAD tag) = 31–49 bytes; one carrying a STREAM
    ///   frame with a message of 100 bytes or more is over 120. The same packets also
    ///   count when they carry PING or flow-control credit instead: control only, no
    ///   data. Only valid for workloads whose messages are all larger than the
    ///   threshold (the benches' are ≥ 100 bytes).
    pub fn is_ack_only(&self, f: &[u8]) -> bool {
        self.try_is_ack_only(f).unwrap_or(false)
    }

    fn try_is_ack_only(&self, f: &[u8]) -> Option<bool> {
        let Some((proto, seg)) = transport_segment(f)? else {
            return Some(false);
        };
        match proto {
            IPPROTO_TCP => {
                let doff = ((*seg.get(12)? >> 4) as usize) * 4;
                let flags = *seg.get(13)?;
                const FIN: u8 = 0x01;
                const SYN: u8 = 0x02;
                const RST: u8 = 0x04;
                const ACK: u8 = 0x10;
                Some(
                    doff >= 20
                        && seg.len() == doff
                        && flags & ACK != 0
                        && flags & (FIN | SYN | RST) == 0,
                )
            }
            IPPROTO_UDP => {
                let payload = seg.get(8..)?;
                let quic = be16(seg, 0)? == self.quic_port || be16(seg, 2)? == self.quic_port;
                let long_header = payload.first().is_some_and(|b| b & 0x80 != 0);
                Some(payload.len() <= UDP_ACK_ONLY_MAX_PAYLOAD && !(quic && long_header))
            }
            _ => Some(false),
        }
    }

    pub fn classify(&self, frame: &[u8]) -> FrameClass {
        self.try_classify(frame).unwrap_or(FrameClass {
            class: Class::Other,
            payload: 0,
        })
    }

    fn try_classify(&self, f: &[u8]) -> Option<FrameClass> {
        let (ethertype, off) = network_header(f)?;
        let none = |class| FrameClass { class, payload: 0 };
        match ethertype {
            ETH_P_ARP => Some(none(Class::Arp)),
            ETH_P_IPV4 => {
                let ip = f.get(off..)?;
                let vihl = *ip.first()?;
                if vihl >> 4 != 4 {
                    return None;
                }
                let ihl = ((vihl & 0x0f) as usize) * 4;
                let total = be16(ip, 2)? as usize;
                let frag = be16(ip, 6)?;
                let proto = *ip.get(9)?;
                if ihl < 20 || total < ihl || total > ip.len() {
                    return None;
                }
                if frag & 0x1fff != 0 {
                    // Non-first fragment: no transport header to read ports from.
                    return Some(none(Class::Other));
                }
                self.transport(proto, &ip[ihl..total])
            }
            ETH_P_IPV6 => {
                let ip = f.get(off..)?;
                if *ip.first()? >> 4 != 6 {
                    return None;
                }
                let plen = be16(ip, 4)? as usize;
                let next = *ip.get(6)?;
                let body = ip.get(40..40 + plen)?;
                self.transport(next, body)
            }
            _ => Some(none(Class::Other)),
        }
    }

    /// `seg` is the IP payload (transport header + data) bounded by the IP length.
    fn transport(&self, proto: u8, seg: &[u8]) -> Option<FrameClass> {
        match proto {
            IPPROTO_TCP => {
                let sport = be16(seg, 0)?;
                let dport = be16(seg, 2)?;
                let doff = ((*seg.get(12)? >> 4) as usize) * 4;
                if doff < 20 || doff > seg.len() {
                    return None;
                }
                let port_is = |p: u16| sport == p || dport == p;
                let class = if self.openflow_ports.iter().any(|&p| port_is(p)) {
                    Class::OpenFlow
                } else if port_is(self.ovsdb_port) {
                    Class::Ovsdb
                } else {
                    Class::TcpOther
                };
                Some(FrameClass {
                    class,
                    payload: (seg.len() - doff) as u32,
                })
            }
            IPPROTO_UDP => {
                let sport = be16(seg, 0)?;
                let dport = be16(seg, 2)?;
                if seg.len() < 8 {
                    return None;
                }
                let class = if sport == self.quic_port || dport == self.quic_port {
                    Class::Quic
                } else {
                    Class::UdpOther
                };
                Some(FrameClass {
                    class,
                    payload: (seg.len() - 8) as u32,
                })
            }
            IPPROTO_ICMP | IPPROTO_ICMPV6 => Some(FrameClass {
                class: Class::Icmp,
                payload: 0,
            }),
            _ => Some(FrameClass {
                class: Class::Other,
                payload: 0,
            }),
        }
    }
}

/// Builders for synthetic frames, shared by the unit tests of this module and the model.
#[cfg(test)]
pub(crate) mod testframes {
    pub fn eth(ethertype: u16, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 0xb, 0x02, 0, 0, 0, 0, 0xa];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    pub fn ipv4(proto: u8, l4: &[u8]) -> Vec<u8> {
        let total = (20 + l4.len()) as u16;
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
        ip.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        ip.extend_from_slice(l4);
        ip
    }

    pub fn tcp(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(&sport.to_be_bytes());
        t.extend_from_slice(&dport.to_be_bytes());
        t.extend_from_slice(&[0; 8]);
        t.push(0x80); // data offset 8 words = 32 bytes (with options)
        t.extend_from_slice(&[0x18, 0, 0, 0, 0, 0, 0]);
        t.extend_from_slice(&[0; 12]);
        t.extend(std::iter::repeat_n(0xab, payload));
        t
    }

    pub fn udp(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
        let mut u = Vec::new();
        u.extend_from_slice(&sport.to_be_bytes());
        u.extend_from_slice(&dport.to_be_bytes());
        u.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend(std::iter::repeat_n(0xcd, payload));
        u
    }

    pub fn udp_frame(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
        eth(0x0800, &ipv4(17, &udp(sport, dport, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::testframes::*;
    use super::*;

    fn c(f: &[u8]) -> FrameClass {
        Classifier::default().classify(f)
    }

    #[test]
    fn tcp_classes_by_port_either_direction() {
        let f = eth(0x0800, &ipv4(6, &tcp(40000, 6653, 100)));
        assert_eq!(
            c(&f),
            FrameClass {
                class: Class::OpenFlow,
                payload: 100
            }
        );
        let f = eth(0x0800, &ipv4(6, &tcp(6633, 40000, 0)));
        assert_eq!(c(&f).class, Class::OpenFlow);
        let f = eth(0x0800, &ipv4(6, &tcp(6640, 40000, 7)));
        assert_eq!(
            c(&f),
            FrameClass {
                class: Class::Ovsdb,
                payload: 7
            }
        );
        let f = eth(0x0800, &ipv4(6, &tcp(22, 40000, 3)));
        assert_eq!(
            c(&f),
            FrameClass {
                class: Class::TcpOther,
                payload: 3
            }
        );
    }

    #[test]
    fn udp_quic_port_is_configurable_and_distinct_from_tcp() {
        let f = udp_frame(50000, 6653, 1200);
        assert_eq!(
            c(&f),
            FrameClass {
                class: Class::Quic,
                payload: 1200
            }
        );
        let f = udp_frame(50000, 4433, 10);
        assert_eq!(c(&f).class, Class::UdpOther);
        let cl = Classifier {
            quic_port: 4433,
            ..Classifier::default()
        };
        assert_eq!(cl.classify(&f).class, Class::Quic);
    }

    #[test]
    fn padding_does_not_count_as_payload() {
        // A bare ACK with a 20-byte TCP header: a 54-byte frame.
        let mut t = tcp(40000, 6653, 0);
        t.truncate(20);
        t[12] = 0x50;
        let mut f = eth(0x0800, &ipv4(6, &t));
        assert_eq!(f.len(), 54);
        f.resize(60, 0); // Ethernet minimum-size padding
        assert_eq!(
            c(&f),
            FrameClass {
                class: Class::OpenFlow,
                payload: 0
            }
        );
    }

    #[test]
    fn vlan_ipv6_arp_icmp_and_garbage() {
        let ip = ipv4(17, &udp(1, 6653, 5));
        let mut body = vec![0, 5, 0x08, 0x00];
        body.extend_from_slice(&ip);
        assert_eq!(
            c(&eth(0x8100, &body)),
            FrameClass {
                class: Class::Quic,
                payload: 5
            }
        );

        let l4 = tcp(40000, 6640, 11);
        let mut v6 = vec![0x60, 0, 0, 0];
        v6.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        v6.extend_from_slice(&[6, 64]);
        v6.extend_from_slice(&[0; 32]);
        v6.extend_from_slice(&l4);
        assert_eq!(
            c(&eth(0x86dd, &v6)),
            FrameClass {
                class: Class::Ovsdb,
                payload: 11
            }
        );

        assert_eq!(c(&eth(0x0806, &[0; 28])).class, Class::Arp);
        assert_eq!(c(&eth(0x0800, &ipv4(1, &[8, 0, 0, 0]))).class, Class::Icmp);
        assert_eq!(c(&[1, 2, 3]).class, Class::Other);
        // IP total length beyond the frame: malformed.
        let mut f = eth(0x0800, &ipv4(17, &udp(1, 6653, 5)));
        f.truncate(f.len() - 2);
        assert_eq!(
            c(&f),
            FrameClass {
                class: Class::Other,
                payload: 0
            }
        );
    }

    #[test]
    fn ack_only_tcp_is_exact_and_udp_is_by_size() {
        let cl = Classifier::default();
        let bare = |flags: u8, payload: usize| {
            let mut t = tcp(40000, 6653, payload);
            t[13] = flags;
            eth(0x0800, &ipv4(6, &t))
        };
        assert!(cl.is_ack_only(&bare(0x10, 0)), "pure ACK");
        assert!(!cl.is_ack_only(&bare(0x18, 1)), "ACK with data");
        assert!(!cl.is_ack_only(&bare(0x12, 0)), "SYN-ACK");
        assert!(!cl.is_ack_only(&bare(0x11, 0)), "FIN");
        assert!(!cl.is_ack_only(&bare(0x14, 0)), "RST");
        // QUIC short header (0x40..): small = control only, large = data.
        let mut f = udp_frame(50000, 6653, 40);
        let at = f.len() - 40;
        f[at] = 0x41;
        assert!(cl.is_ack_only(&f));
        f[at] = 0xc3; // long header: handshake, never ACK-only
        assert!(!cl.is_ack_only(&f));
        let mut f = udp_frame(50000, 6653, UDP_ACK_ONLY_MAX_PAYLOAD + 1);
        let at = f.len() - UDP_ACK_ONLY_MAX_PAYLOAD - 1;
        f[at] = 0x41;
        assert!(!cl.is_ack_only(&f));
        // Other UDP (kcptun): size only.
        assert!(cl.is_ack_only(&udp_frame(50000, 29900, 52)));
        assert!(!cl.is_ack_only(&udp_frame(50000, 29900, 300)));
        assert!(!cl.is_ack_only(&eth(0x0806, &[0; 28])));
    }

    #[test]
    fn frame_kinds_split_handshake_ack_only_and_data() {
        let cl = Classifier::default();
        let bare = |flags: u8, payload: usize| {
            let mut t = tcp(40000, 6653, payload);
            t[13] = flags;
            eth(0x0800, &ipv4(6, &t))
        };
        assert_eq!(cl.frame_kind(&bare(0x02, 0)), FrameKind::Handshake, "SYN");
        assert_eq!(cl.frame_kind(&bare(0x11, 0)), FrameKind::Handshake, "FIN");
        assert_eq!(cl.frame_kind(&bare(0x14, 0)), FrameKind::Handshake, "RST");
        assert_eq!(cl.frame_kind(&bare(0x10, 0)), FrameKind::AckOnly);
        assert_eq!(
            cl.frame_kind(&bare(0x19, 8)),
            FrameKind::Data,
            "FIN with data"
        );
        let mut f = udp_frame(50000, 6653, 300);
        let at = f.len() - 300;
        f[at] = 0xc3;
        assert_eq!(cl.frame_kind(&f), FrameKind::Handshake, "QUIC long header");
        f[at] = 0x41;
        assert_eq!(cl.frame_kind(&f), FrameKind::Data);
        let mut f = udp_frame(50000, 6653, 40);
        let at = f.len() - 40;
        f[at] = 0x41;
        assert_eq!(cl.frame_kind(&f), FrameKind::AckOnly);
        // A long-header-looking byte on another UDP port is not QUIC.
        let mut f = udp_frame(50000, 29900, 300);
        let at = f.len() - 300;
        f[at] = 0xc3;
        assert_eq!(cl.frame_kind(&f), FrameKind::Data);
    }

    #[test]
    fn non_first_fragment_is_other() {
        let mut ip = ipv4(17, &udp(1, 6653, 50));
        ip[6] = 0x00;
        ip[7] = 0x10; // fragment offset 16*8
        assert_eq!(c(&eth(0x0800, &ip)).class, Class::Other);
    }
}
