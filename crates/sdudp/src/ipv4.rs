//! IPv4 and UDP headers of SDUDP's numbered datagrams: where a datagram's
//! sequence number is written into, and read from, the IPv4 Identification
//! field.
//!
//! RFC 6864 §4.1: "The IPv4 ID field MUST NOT be used for purposes other than
//! fragmentation and reassembly", but also "Originating sources MAY set the
//! IPv4 ID field of atomic datagrams to any value." SDUDP's datagrams are
//! atomic (DF set, never larger than the path MTU, never fragmented), so the
//! sending edge may number them as it likes and no reassembly ever reads the
//! ID. The retransmission engines reading it is exactly the "other purpose"
//! §4.1 forbids to devices in general; it is sound only because the engines
//! and the sending edge are parts of one system on a path the controller
//! fixed, where nothing rewrites the ID. A datagram that arrives fragmented is
//! rejected ([`Ipv4Error::Fragment`]), never reassembled into the sequence.

use std::net::Ipv4Addr;

pub const IPV4_HEADER: usize = 20;
pub const UDP_HEADER: usize = 8;
const PROTO_UDP: u8 = 17;
/// Flags and fragment offset: DF set, MF clear, offset 0 (an atomic datagram).
const FLAGS_DF: u16 = 0x4000;

/// The addressing of a UDP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// The IPv4 Identification: SDUDP's 16-bit sequence number.
    pub id: u16,
    pub ttl: u8,
    /// DSCP and ECN byte.
    pub tos: u8,
    pub sport: u16,
    pub dport: u16,
}

/// Why bytes are not an SDUDP datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ipv4Error {
    #[error("truncated IPv4/UDP datagram")]
    Truncated,
    #[error("not IPv4 (version {0})")]
    Version(u8),
    #[error("bad IPv4 header length {0}")]
    HeaderLength(usize),
    #[error("bad IPv4 header checksum")]
    HeaderChecksum,
    #[error("not UDP (protocol {0})")]
    Protocol(u8),
    #[error("IPv4 fragment (SDUDP datagrams are atomic, RFC 6864)")]
    Fragment,
    #[error("bad UDP length {0}")]
    UdpLength(usize),
    #[error("bad UDP checksum")]
    UdpChecksum,
}

/// RFC 1071 one's-complement sum of `bytes` (big-endian 16-bit words, an odd
/// last byte padded with zero) added to `acc`; finish with [`fold`].
pub fn sum(mut acc: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// Folds a [`sum`] to 16 bits (not complemented: a checksum is `!fold(..)`,
/// and a correct header sums to 0xffff).
pub fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

fn udp_checksum(h: &UdpHeader, udp: &[u8]) -> u16 {
    // RFC 768: the pseudo header (source, destination, zero, protocol, UDP length).
    let mut acc = sum(0, &h.src.octets());
    acc = sum(acc, &h.dst.octets());
    acc += u32::from(PROTO_UDP);
    acc += udp.len() as u32;
    acc = sum(acc, udp);
    let c = !fold(acc);
    // RFC 768: a computed zero is sent as all ones (zero means "no checksum").
    if c == 0 { 0xffff } else { c }
}

impl UdpHeader {
    /// The header of a numbered datagram of `flow` with sequence ID `id`.
    pub fn for_flow(flow: crate::FlowKey, id: u16) -> UdpHeader {
        UdpHeader {
            src: flow.src,
            dst: flow.dst,
            id,
            ttl: 64,
            tos: 0,
            sport: flow.sport,
            dport: flow.dport,
        }
    }
}

/// Builds an IPv4/UDP datagram; `h.id` becomes the IPv4 Identification.
pub fn build(h: &UdpHeader, payload: &[u8]) -> Vec<u8> {
    let udp_len = UDP_HEADER + payload.len();
    let total = IPV4_HEADER + udp_len;
    assert!(total <= usize::from(u16::MAX), "datagram of {total} bytes");
    let mut b = Vec::with_capacity(total);
    b.push(0x45);
    b.push(h.tos);
    b.extend_from_slice(&(total as u16).to_be_bytes());
    // The sequence number goes out as the ID of an atomic datagram (DF set):
    // RFC 6864 §4.1 lets its originating source set that to any value.
    b.extend_from_slice(&h.id.to_be_bytes());
    b.extend_from_slice(&FLAGS_DF.to_be_bytes());
    b.push(h.ttl);
    b.push(PROTO_UDP);
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&h.src.octets());
    b.extend_from_slice(&h.dst.octets());
    let hc = !fold(sum(0, &b[..IPV4_HEADER]));
    b[10..12].copy_from_slice(&hc.to_be_bytes());
    b.extend_from_slice(&h.sport.to_be_bytes());
    b.extend_from_slice(&h.dport.to_be_bytes());
    b.extend_from_slice(&(udp_len as u16).to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(payload);
    let uc = udp_checksum(h, &b[IPV4_HEADER..]);
    b[IPV4_HEADER + 6..IPV4_HEADER + 8].copy_from_slice(&uc.to_be_bytes());
    b
}

/// Parses and checks an IPv4/UDP datagram; returns its header and the range
/// of its payload in `b`.
pub fn parse(b: &[u8]) -> Result<(UdpHeader, std::ops::Range<usize>), Ipv4Error> {
    if b.len() < IPV4_HEADER {
        return Err(Ipv4Error::Truncated);
    }
    let version = b[0] >> 4;
    if version != 4 {
        return Err(Ipv4Error::Version(version));
    }
    let ihl = usize::from(b[0] & 0x0f) * 4;
    if ihl < IPV4_HEADER || b.len() < ihl {
        return Err(Ipv4Error::HeaderLength(ihl));
    }
    if fold(sum(0, &b[..ihl])) != 0xffff {
        return Err(Ipv4Error::HeaderChecksum);
    }
    let total = usize::from(u16::from_be_bytes([b[2], b[3]]));
    if total < ihl + UDP_HEADER || total > b.len() {
        return Err(Ipv4Error::Truncated);
    }
    if b[9] != PROTO_UDP {
        return Err(Ipv4Error::Protocol(b[9]));
    }
    let frag = u16::from_be_bytes([b[6], b[7]]);
    // MF set or a non-zero offset: a fragment, not an atomic datagram.
    if frag & 0x3fff != 0 {
        return Err(Ipv4Error::Fragment);
    }
    let h = UdpHeader {
        src: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
        dst: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
        id: u16::from_be_bytes([b[4], b[5]]),
        ttl: b[8],
        tos: b[1],
        sport: u16::from_be_bytes([b[ihl], b[ihl + 1]]),
        dport: u16::from_be_bytes([b[ihl + 2], b[ihl + 3]]),
    };
    let udp = &b[ihl..total];
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if udp_len < UDP_HEADER || udp_len != udp.len() {
        return Err(Ipv4Error::UdpLength(udp_len));
    }
    let sent = u16::from_be_bytes([udp[6], udp[7]]);
    if sent != 0 {
        let mut zeroed = udp.to_vec();
        zeroed[6] = 0;
        zeroed[7] = 0;
        if udp_checksum(&h, &zeroed) != sent {
            return Err(Ipv4Error::UdpChecksum);
        }
    }
    Ok((h, ihl + UDP_HEADER..total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(id: u16) -> UdpHeader {
        UdpHeader {
            src: Ipv4Addr::new(10, 0, 1, 254),
            dst: Ipv4Addr::new(10, 0, 5, 254),
            id,
            ttl: 64,
            tos: 0,
            sport: 49_200,
            dport: 49_201,
        }
    }

    #[test]
    fn known_header_checksum() {
        // RFC 1071's example words are covered by the round trip; this pins the
        // layout: version/IHL, DF, protocol, and the ID at bytes 4..6.
        let d = build(&header(0xBEEF), b"x");
        assert_eq!(d[0], 0x45);
        assert_eq!(&d[4..6], &[0xBE, 0xEF]);
        assert_eq!(&d[6..8], &[0x40, 0x00]);
        assert_eq!(d[9], 17);
        assert_eq!(d.len(), 20 + 8 + 1);
    }

    #[test]
    fn rejects_fragments_and_corruption() {
        let d = build(&header(7), b"payload");
        let mut f = d.clone();
        f[6] = 0x20; // MF, no DF
        let hc = !fold(sum(0, &{
            let mut h = f[..20].to_vec();
            h[10] = 0;
            h[11] = 0;
            h
        }));
        f[10..12].copy_from_slice(&hc.to_be_bytes());
        assert_eq!(parse(&f), Err(Ipv4Error::Fragment));
        let mut c = d.clone();
        c[25] ^= 1;
        assert!(parse(&c).is_err());
        let mut c = d.clone();
        *c.last_mut().unwrap() ^= 0x40;
        assert_eq!(parse(&c), Err(Ipv4Error::UdpChecksum));
        assert_eq!(parse(&d[..10]), Err(Ipv4Error::Truncated));
    }

    proptest! {
        #[test]
        fn round_trips(id in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let d = build(&header(id), &payload);
            let (h, range) = parse(&d).unwrap();
            prop_assert_eq!(h, header(id));
            prop_assert_eq!(&d[range], &payload[..]);
        }

        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = parse(&bytes);
        }
    }
}
