//! QUIC variable-length integers.
//!
//! RFC 9000 §16: "The QUIC variable-length integer encoding reserves the two most
//! significant bits of the first byte to encode the base-2 logarithm of the integer
//! encoding length in bytes. The integer value is encoded on the remaining bits, in
//! network byte order." Values up to 2^62-1 fit.

/// Largest value a varint can carry (2^62 - 1).
pub const MAX: u64 = (1 << 62) - 1;

/// Appends `value` in the shortest encoding. Panics if `value > MAX`, which is a
/// programming error: callers only encode counters they bounded themselves.
pub fn encode(value: u64, out: &mut Vec<u8>) {
    assert!(value <= MAX, "varint out of range: {value}");
    if value < 1 << 6 {
        out.push(value as u8);
    } else if value < 1 << 14 {
        out.extend_from_slice(&((value as u16) | 0x4000).to_be_bytes());
    } else if value < 1 << 30 {
        out.extend_from_slice(&((value as u32) | 0x8000_0000).to_be_bytes());
    } else {
        out.extend_from_slice(&(value | 0xc000_0000_0000_0000).to_be_bytes());
    }
}

/// Decodes a varint at the start of `buf`: `Some((value, bytes_used))`, or `None`
/// when `buf` is too short to hold the whole integer yet.
pub fn decode(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    let len = 1usize << (first >> 6);
    if buf.len() < len {
        return None;
    }
    let mut value = u64::from(first & 0x3f);
    for &b in &buf[1..len] {
        value = (value << 8) | u64::from(b);
    }
    Some((value, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc9000_appendix_a1_examples() {
        // RFC 9000 §A.1 sample encodings.
        let cases: [(&[u8], u64); 4] = [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, value) in cases {
            assert_eq!(decode(bytes), Some((value, bytes.len())));
            let mut out = Vec::new();
            encode(value, &mut out);
            assert_eq!(out, bytes);
        }
        // §A.1: "the two-byte sequence 0x40 0x25 also decodes to 37".
        assert_eq!(decode(&[0x40, 0x25]), Some((37, 2)));
    }

    #[test]
    fn boundaries_round_trip_and_short_input_waits() {
        for value in [0, 63, 64, 16_383, 16_384, (1 << 30) - 1, 1 << 30, MAX] {
            let mut out = Vec::new();
            encode(value, &mut out);
            assert_eq!(decode(&out), Some((value, out.len())));
            for cut in 0..out.len() {
                assert_eq!(decode(&out[..cut]), None, "value {value} cut at {cut}");
            }
        }
    }
}
