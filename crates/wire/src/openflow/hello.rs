//! OFPT_HELLO: the versions a peer offers, and the version two HELLOs negotiate.
//!
//! OpenFlow 1.3.5 §7.5.1: "The OFPT_HELLO message consists of an OpenFlow header
//! plus a set of variable size hello elements. [...] The version field part of
//! the header field (see 7.1) must be set to the highest OpenFlow switch
//! protocol version supported by the sender." Its one element type is
//! `OFPHET_VERSIONBITMAP` (1): "The bitmaps field indicates the set of versions
//! of the OpenFlow switch protocol a device supports [...] if bit `n` is set,
//! then the version number `n` is supported". A HELLO of 1.0 has no elements
//! (its body is ignored by older peers), so a HELLO without a bitmap is valid.

use super::{HEADER_LEN, Header};

/// `OFPHET_VERSIONBITMAP` (OpenFlow 1.3.5 §7.5.1, `enum ofp_hello_elem_type`).
pub const OFPHET_VERSIONBITMAP: u16 = 1;
/// `OFPT_HELLO`, the same in every version.
pub const OFPT_HELLO: u8 = 0;

/// What one HELLO offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloOffer {
    /// The header's version: the highest the sender supports.
    pub version: u8,
    /// The first 32 bits of the version bitmap (versions 0..=31), if the
    /// HELLO carried a `OFPHET_VERSIONBITMAP` element. Later bitmap words
    /// name versions that do not exist yet and are ignored.
    pub bitmap: Option<u32>,
}

/// Why a message is not a HELLO this module can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("not an OpenFlow message (shorter than its header or than its length field)")]
    Truncated,
    #[error("message type {0} where a HELLO (type 0) must come first")]
    NotHello(u8),
    #[error("HELLO element of length {0} runs past the message")]
    BadElement(u16),
}

impl HelloOffer {
    /// Reads one whole HELLO message (header and elements).
    pub fn parse(msg: &[u8]) -> Result<HelloOffer, HelloError> {
        let h = Header::parse(msg).ok_or(HelloError::Truncated)?;
        let len = usize::from(h.length);
        if len < HEADER_LEN || msg.len() < len {
            return Err(HelloError::Truncated);
        }
        if h.msg_type != OFPT_HELLO {
            return Err(HelloError::NotHello(h.msg_type));
        }
        let mut bitmap = None;
        // struct ofp_hello_elem_header { uint16_t type; uint16_t length; }:
        // "length" includes the header; elements are padded to 8 bytes.
        let mut rest = &msg[HEADER_LEN..len];
        while rest.len() >= 4 {
            let ty = u16::from_be_bytes([rest[0], rest[1]]);
            let elen = u16::from_be_bytes([rest[2], rest[3]]);
            let e = usize::from(elen);
            if e < 4 || e > rest.len() {
                return Err(HelloError::BadElement(elen));
            }
            if ty == OFPHET_VERSIONBITMAP && e >= 8 {
                bitmap = Some(u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]));
            }
            rest = &rest[e.next_multiple_of(8).min(rest.len())..];
        }
        Ok(HelloOffer {
            version: h.version,
            bitmap,
        })
    }

    /// The version a connection that exchanged `self` and `other` uses, per
    /// OpenFlow 1.3.5 §6.3.1: "If both the Hello message sent and the Hello
    /// message received contained a OFPHET_VERSIONBITMAP hello element, and if
    /// those bitmaps have some common bits set, the negotiated version must be
    /// the highest version set in both bitmaps. Otherwise, the negotiated
    /// version must be the smaller of the version number that was sent and the
    /// one that was received in the version fields." Symmetric, so both ends
    /// agree.
    pub fn negotiate(&self, other: &HelloOffer) -> u8 {
        if let (Some(a), Some(b)) = (self.bitmap, other.bitmap)
            && a & b != 0
        {
            return (31 - (a & b).leading_zeros()) as u8;
        }
        self.version.min(other.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openflow::{OFP10_VERSION, OFP13_VERSION, OFP15_VERSION, message};

    fn hello(version: u8, bitmap: Option<u32>) -> Vec<u8> {
        let body = bitmap.map_or(Vec::new(), |b| {
            let mut e = vec![0, 1, 0, 8];
            e.extend_from_slice(&b.to_be_bytes());
            e
        });
        message(version, OFPT_HELLO, 7, &body)
    }

    #[test]
    fn reads_the_version_and_bitmap() {
        let m = hello(OFP15_VERSION, Some(0b111_1110));
        assert_eq!(
            HelloOffer::parse(&m),
            Ok(HelloOffer {
                version: OFP15_VERSION,
                bitmap: Some(0b111_1110)
            })
        );
        assert_eq!(
            HelloOffer::parse(&hello(OFP10_VERSION, None))
                .unwrap()
                .bitmap,
            None
        );
        // An unknown element first, then the bitmap.
        let mut body = vec![0, 9, 0, 5, 1, 0, 0, 0];
        body.extend_from_slice(&[0, 1, 0, 8, 0, 0, 0, 0x10]);
        let m = message(OFP13_VERSION, OFPT_HELLO, 1, &body);
        assert_eq!(HelloOffer::parse(&m).unwrap().bitmap, Some(0x10));
    }

    #[test]
    fn rejects_what_is_not_a_hello() {
        let echo = message(OFP13_VERSION, 2, 1, &[]);
        assert_eq!(HelloOffer::parse(&echo), Err(HelloError::NotHello(2)));
        assert_eq!(
            HelloOffer::parse(&hello(4, None)[..7]),
            Err(HelloError::Truncated)
        );
        let bad = message(OFP13_VERSION, OFPT_HELLO, 1, &[0, 1, 0, 40, 0, 0, 0, 0]);
        assert_eq!(HelloOffer::parse(&bad), Err(HelloError::BadElement(40)));
    }

    #[test]
    fn negotiates_as_section_6_3_1_says() {
        let ovs13 = HelloOffer::parse(&hello(OFP13_VERSION, Some(1 << 4))).unwrap();
        // os-ken/Ryu: 1.0 to 1.5 in the bitmap, 1.5 in the header.
        let ryu = HelloOffer::parse(&hello(OFP15_VERSION, Some(0b111_1110))).unwrap();
        assert_eq!(ovs13.negotiate(&ryu), OFP13_VERSION);
        assert_eq!(ryu.negotiate(&ovs13), OFP13_VERSION);
        // Without a bitmap on one side: the smaller header version.
        let plain10 = HelloOffer::parse(&hello(OFP10_VERSION, None)).unwrap();
        assert_eq!(ryu.negotiate(&plain10), OFP10_VERSION);
        // Bitmaps with nothing in common: the smaller header version too.
        let only10 = HelloOffer::parse(&hello(OFP10_VERSION, Some(1 << 1))).unwrap();
        assert_eq!(ovs13.negotiate(&only10), OFP10_VERSION);
    }
}
