//! SDUDP's parsers: the numbered datagrams' messages and the hop control
//! messages (`quicsdn_sdudp::msg`) and its IPv4/UDP decoder
//! (`quicsdn_sdudp::ipv4`); what an engine reads from its switch port is in
//! [`crate::sdudp_engine`]. Every one reads what any host or engine on the
//! path can send.

use bytes::Bytes;
use quicsdn_sdudp::ipv4;
use quicsdn_sdudp::msg::{self, Control, Message};

/// `fuzz/fuzz_targets/sdudp_msg.rs`: the input as a numbered datagram's
/// message and as a hop control message. Whatever decodes re-encodes to
/// something that decodes to the same (a window scale above 14 is read as 14,
/// RFC 7323 §2.3, so the bytes themselves may differ).
pub fn sdudp_msg(data: &[u8]) {
    let payload = Bytes::copy_from_slice(data);
    match Message::decode(&payload) {
        Ok(m) => {
            let again = m.encode();
            assert_eq!(Message::decode(&again).as_ref(), Ok(&m));
            assert_eq!(again.len(), data.len(), "{m:?}");
            // A relay decides "last message" from the first byte alone.
            let last = matches!(m, Message::Refuse(_) | Message::Fin | Message::Reset);
            assert_eq!(msg::is_final(data), last);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match Control::decode(data) {
        Ok(c) => {
            let again = c.encode();
            assert_eq!(again.len(), data.len(), "{c:?}");
            assert_eq!(Control::decode(&again).as_ref(), Ok(&c));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// `fuzz/fuzz_targets/sdudp_ipv4.rs`: a datagram that parses, rebuilt from
/// what the parser returned, parses to the same header and payload.
/// Byte 0 bit 0 repairs the IPv4 header checksum first, so the fuzzer gets
/// past it.
pub fn sdudp_ipv4(data: &[u8]) {
    let Some((&flags, b)) = data.split_first() else {
        return;
    };
    let b = repaired(flags, b, 0);
    check_ipv4(&b);
}

pub(crate) fn check_ipv4(b: &[u8]) {
    let Ok((h, range)) = ipv4::parse(b) else {
        return;
    };
    assert!(range.start >= ipv4::IPV4_HEADER + ipv4::UDP_HEADER && range.end <= b.len());
    let payload = &b[range];
    let again = ipv4::build(&h, payload);
    let (h2, r2) = ipv4::parse(&again).expect("a built datagram parses");
    assert_eq!(h2, h);
    assert_eq!(&again[r2], payload);
}

/// `b` with its IPv4 header checksum (at `ip`) recomputed when `flags` bit 0
/// is set and there is a header to sum.
pub(crate) fn repaired(flags: u8, b: &[u8], ip: usize) -> Vec<u8> {
    let mut b = b.to_vec();
    if flags & 1 == 1
        && let Some(&v) = b.get(ip)
    {
        let ihl = usize::from(v & 0x0f) * 4;
        if ihl >= ipv4::IPV4_HEADER && b.len() >= ip + ihl {
            b[ip + 10..ip + 12].fill(0);
            let c = !ipv4::fold(ipv4::sum(0, &b[ip..ip + ihl]));
            b[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        }
    }
    b
}
