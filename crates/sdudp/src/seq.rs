//! Sequence numbers. On the wire a datagram's number is its 16-bit IPv4
//! Identification; inside an engine it is a 64-bit count that never wraps.
//!
//! An engine only ever sees IDs within [`crate::MAX_CAPACITY`] of what it
//! expects next (a window behind for duplicates, the granted window ahead),
//! which is less than half of 2^16, so the nearest 64-bit value with the same
//! low 16 bits is the only candidate (serial number arithmetic, RFC 1982 §3.2).

/// The 64-bit sequence number whose low 16 bits are `id`, nearest to
/// `reference` (ties: ahead). Never below 0: an ID "before" sequence 0 is read
/// as the ahead candidate.
pub fn unwrap(id: u16, reference: u64) -> u64 {
    let delta = id.wrapping_sub(reference as u16) as i16 as i64;
    let candidate = reference as i64 + delta;
    if candidate < 0 {
        (candidate + (1 << 16)) as u64
    } else {
        candidate as u64
    }
}

/// The wire ID of a sequence number.
pub fn id_of(seq: u64) -> u16 {
    seq as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_forward_and_backward() {
        assert_eq!(unwrap(0, 65_535), 65_536);
        assert_eq!(unwrap(65_535, 65_536), 65_535);
        assert_eq!(unwrap(5, 65_530), 65_541);
        assert_eq!(unwrap(65_530, 65_541), 65_530);
        assert_eq!(unwrap(3, 0), 3);
        // Nothing precedes 0: an "older" ID near the start is read as ahead.
        assert_eq!(unwrap(65_535, 0), 65_535);
        assert_eq!(unwrap(7, 3 * 65_536 + 2), 3 * 65_536 + 7);
    }

    proptest! {
        #[test]
        fn round_trips_within_half_the_space(reference in 0u64..1 << 40, delta in -32_767i64..32_768) {
            let seq = reference as i64 + delta;
            prop_assume!(seq >= 0);
            prop_assert_eq!(unwrap(id_of(seq as u64), reference), seq as u64);
        }
    }
}
