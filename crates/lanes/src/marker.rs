//! Fence markers: the only bytes the `safe` mode adds to a stream, and only
//! around fences.
//!
//! A marker travels in a lane's byte stream framed like an OpenFlow message
//! with version 0, which no OpenFlow version uses (`ofp_version` counts from
//! 0x01), so the receiver tells it apart with the same framer; in `safe` mode
//! the sending agent refuses version-0 messages from its local peer. Markers
//! never reach a local peer.
//!
//! * `WAIT` (type 1): the message that follows on this lane is released only
//!   after each listed lane has released at least the listed number of bytes.
//! * `AFTER` (type 2): the same with one lane; written before the first message
//!   a lane carries after a fence.
//!
//! Offsets count every byte of a lane after its preamble, markers included.
//! They are taken when the fence is sent, so every wait points back in time and
//! waits can never form a cycle.

use quicsdn_wire::openflow::{HEADER_LEN, Header};
use quicsdn_wire::varint;

/// The OpenFlow version byte reserved for markers.
pub const MARKER_VERSION: u8 = 0;
const WAIT: u8 = 1;
const AFTER: u8 = 2;

/// A decoded marker: wait until each `(lane, offset)` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub waits: Vec<(usize, u64)>,
}

/// Encodes a marker for `waits` (one entry gives an `AFTER`, several a `WAIT`).
pub fn encode(waits: &[(usize, u64)]) -> Vec<u8> {
    let mut body = Vec::new();
    let kind = if let [(lane, offset)] = waits {
        varint::encode(*lane as u64, &mut body);
        varint::encode(*offset, &mut body);
        AFTER
    } else {
        varint::encode(waits.len() as u64, &mut body);
        for (lane, offset) in waits {
            varint::encode(*lane as u64, &mut body);
            varint::encode(*offset, &mut body);
        }
        WAIT
    };
    let mut out = Header {
        version: MARKER_VERSION,
        msg_type: kind,
        length: (HEADER_LEN + body.len()) as u16,
        xid: 0,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&body);
    out
}

/// True when a whole framed message is a marker.
pub fn is_marker(frame: &[u8]) -> bool {
    frame.first() == Some(&MARKER_VERSION)
}

/// Decodes a whole marker frame; `None` if it is malformed.
pub fn decode(frame: &[u8]) -> Option<Marker> {
    let header = Header::parse(frame)?;
    let mut body = frame.get(HEADER_LEN..)?;
    let mut next = || -> Option<u64> {
        let (v, n) = varint::decode(body)?;
        body = &body[n..];
        Some(v)
    };
    let waits = match header.msg_type {
        AFTER => vec![(usize::try_from(next()?).ok()?, next()?)],
        WAIT => {
            let n = next()?;
            if n > 1024 {
                return None;
            }
            (0..n)
                .map(|_| Some((usize::try_from(next()?).ok()?, next()?)))
                .collect::<Option<Vec<_>>>()?
        }
        _ => return None,
    };
    if !body.is_empty() {
        return None;
    }
    Some(Marker { waits })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_garbage_is_refused() {
        for waits in [vec![(0, 1234)], vec![(2, 0), (5, 1 << 40), (9, 7)], vec![]] {
            let bytes = encode(&waits);
            assert!(is_marker(&bytes));
            assert_eq!(Header::parse(&bytes).unwrap().length as usize, bytes.len());
            assert_eq!(decode(&bytes), Some(Marker { waits }));
        }
        let mut bad = encode(&[(1, 2)]);
        bad[1] = 9;
        assert_eq!(decode(&bad), None);
        let mut trailing = encode(&[(1, 2)]);
        trailing.push(0);
        assert_eq!(decode(&trailing), None);
    }
}
