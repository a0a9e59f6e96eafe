//! The framers, at every split: a byte stream divided into reads any way at
//! all must frame into exactly the same messages, and fail at exactly the same
//! message with exactly the same error, as the stream read in one piece.

use crate::Splits;
use quicsdn_wire::openflow::{self, Header};
use quicsdn_wire::{FrameError, Framer, Framing};

/// What framing a stream produced.
#[derive(Debug, PartialEq, Eq)]
struct Framed {
    lengths: Vec<usize>,
    error: Option<FrameError>,
    /// The bytes left over when the stream ended hold part of a message.
    partial: bool,
}

/// Frames `stream` fed in pieces ending at each of `cuts` (increasing; the last
/// one is `stream.len()`), keeping the framer's contract: after `Some(n)` the
/// caller drops `n` bytes, otherwise it only appends.
fn frame(framing: Framing, max: usize, stream: &[u8], cuts: &[usize]) -> Framed {
    let mut framer = Framer::new(framing, max);
    let mut consumed = 0;
    let mut lengths = Vec::new();
    for &fed in cuts {
        loop {
            match framer.next_message(&stream[consumed..fed]) {
                Ok(Some(n)) => {
                    assert!(n > 0, "{framing:?}: an empty message");
                    assert!(consumed + n <= fed, "{framing:?}: a message past the data");
                    lengths.push(n);
                    consumed += n;
                }
                Ok(None) => break,
                Err(error) => {
                    return Framed {
                        lengths,
                        error: Some(error),
                        partial: false,
                    };
                }
            }
        }
    }
    Framed {
        lengths,
        error: None,
        partial: framer.is_partial(&stream[consumed..]),
    }
}

/// Every way of cutting the stream this target tries: in one piece, a byte at
/// a time, every split in two (for short streams), and random reads.
fn cut_plans(len: usize, splits: &mut Splits) -> Vec<Vec<usize>> {
    // Splitting in two everywhere costs a quadratic time: short streams only
    // (the fuzzer finds the interesting short ones).
    let mut plans = vec![vec![len], (1..=len).collect()];
    if len <= 96 {
        plans.extend((0..len).map(|cut| vec![cut, len]));
    }
    for _ in 0..2 {
        let mut cuts = Vec::new();
        let mut at = 0;
        while at < len {
            at = (at + splits.size(64)).min(len);
            cuts.push(at);
        }
        cuts.push(len);
        plans.push(cuts);
    }
    plans
}

fn at_every_split(framing: Framing, data: &[u8]) -> Framed {
    if data.len() < 3 {
        return Framed {
            lengths: vec![],
            error: None,
            partial: false,
        };
    }
    let (config, stream) = data.split_at(3);
    let max = match framing {
        Framing::OpenFlow => 8 + usize::from(u16::from_be_bytes([config[1], config[2]])),
        _ => 1 + usize::from(u16::from_be_bytes([config[1], config[2]])),
    };
    let mut splits = Splits::new(data);
    let mut plans = cut_plans(stream.len(), &mut splits).into_iter();
    let whole = frame(framing, max, stream, &plans.next().expect("one plan"));
    for cuts in plans {
        let split = frame(framing, max, stream, &cuts);
        assert_eq!(split, whole, "{framing:?}: reads ending at {cuts:?}");
    }
    whole
}

/// OpenFlow header-length framing (`fuzz/fuzz_targets/openflow_framer.rs`).
pub fn openflow_framer(data: &[u8]) {
    let framed = at_every_split(Framing::OpenFlow, data);
    let Some(stream) = data.get(3..) else { return };
    let mut at = 0;
    for n in framed.lengths {
        // OpenFlow 1.3.5 §7.1: "length" is the length including the header.
        let h = Header::parse(&stream[at..]).expect("a framed message has a header");
        assert_eq!(usize::from(h.length), n, "message length is the header's");
        assert!(n >= openflow::HEADER_LEN);
        at += n;
    }
    match framed.error {
        Some(FrameError::OpenFlowLengthTooShort { length, .. }) => {
            assert!(usize::from(length) < openflow::HEADER_LEN)
        }
        Some(FrameError::TooLarge { length, limit }) => assert!(length > limit),
        Some(other) => panic!("an OpenFlow framer reported {other}"),
        None => {}
    }
}

/// JSON-RPC object framing (`fuzz/fuzz_targets/jsonrpc_framer.rs`), checked
/// against serde_json both ways: whatever the framer calls one message, serde
/// reads as one JSON object, and wherever serde reads an object, the framer
/// finds a message of the same length.
pub fn jsonrpc_framer(data: &[u8]) {
    let framed = at_every_split(Framing::JsonRpc, data);
    let Some(stream) = data.get(3..) else { return };
    let max = 1 + usize::from(u16::from_be_bytes([data[1], data[2]]));
    let mut at = 0;
    for &n in &framed.lengths {
        let msg = &stream[at..at + n];
        let text = msg.trim_ascii_start();
        // The limit counts the message, not the white space before it.
        assert!(
            text.len() <= max,
            "a {}-byte message passed the {max}-byte limit",
            text.len()
        );
        assert!(
            text.first() == Some(&b'{') && text.last() == Some(&b'}'),
            "a JSON-RPC message is an object"
        );
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(msg) {
            assert!(
                serde_tolerated(&e),
                "the framer accepted {:?}, serde_json says {e}",
                String::from_utf8_lossy(msg)
            );
        }
        at += n;
    }
    // Where serde_json reads an object at the start of what is left, the framer
    // must have found it too (unless it exceeds the size limit).
    let rest = &stream[at..];
    if let Some(end) = serde_object_end(rest) {
        let space = rest.len() - rest.trim_ascii_start().len();
        assert!(
            end - space > max,
            "serde_json reads an object of {end} bytes at offset {at} that the framer did not return ({:?})",
            framed.error
        );
    }
}

/// Errors serde_json reports for text RFC 8259 allows but serde_json limits:
/// its nesting depth, numbers beyond f64, lone surrogates, non-UTF-8 strings.
fn serde_tolerated(e: &serde_json::Error) -> bool {
    let s = e.to_string();
    [
        "recursion limit",
        "out of range",
        "surrogate",
        "unicode",
        "UTF-8",
    ]
    .iter()
    .any(|t| s.contains(t))
}

/// The end of a JSON object serde_json reads at the start of `rest`, if any.
fn serde_object_end(rest: &[u8]) -> Option<usize> {
    if rest.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let mut values =
        serde_json::Deserializer::from_slice(rest).into_iter::<serde::de::IgnoredAny>();
    match values.next() {
        Some(Ok(_)) => Some(values.byte_offset()),
        _ => None,
    }
}
