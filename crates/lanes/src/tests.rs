//! Exhaustive and randomised checks of the lane contracts, with no sockets.

use super::*;
use proptest::prelude::*;
use quicsdn_wire::FrameError;
use quicsdn_wire::openflow;

fn of_message(i: usize, body_len: usize) -> Vec<u8> {
    let mut body = vec![0u8; body_len];
    for (j, b) in body.iter_mut().enumerate() {
        *b = (i * 31 + j) as u8;
    }
    openflow::message(openflow::OFP13_VERSION, (i % 30) as u8, i as u32, &body)
}

fn json_message(i: usize, pad: usize) -> Vec<u8> {
    format!(
        r#"{{"id":{i},"method":"echo","params":["{}","}}{{\"]"]}}"#,
        "x".repeat(pad)
    )
    .into_bytes()
}

/// Sends `messages` through an Outbound, delivers each lane's bytes cut into the
/// given chunk sizes, interleaving lanes in the order `schedule` picks, and returns
/// what the Inbound released.
fn run(
    framing: Framing,
    lanes: usize,
    messages: &[Vec<u8>],
    read_sizes: &[usize],
    chunk_sizes: &[usize],
    schedule: &[usize],
) -> (Vec<Vec<Vec<u8>>>, Vec<u8>) {
    let mut out = Outbound::new(framing, 1 << 20, lanes);
    let stream: Vec<u8> = messages.concat();
    let mut lane_bytes: Vec<Vec<u8>> = vec![Vec::new(); lanes];
    let mut lane_messages: Vec<Vec<Vec<u8>>> = vec![Vec::new(); lanes];
    let mut at = 0;
    let mut reads = read_sizes.iter().cycle();
    while at < stream.len() {
        let n = (*reads.next().unwrap()).clamp(1, stream.len() - at);
        out.read_buf().extend_from_slice(&stream[at..at + n]);
        at += n;
        while let Some(batch) = out.next_batch().unwrap() {
            lane_bytes[batch.lane].extend_from_slice(&batch.bytes);
            let msgs = split_messages(framing, &batch.bytes);
            assert_eq!(msgs.len(), batch.messages);
            assert!(
                lanes == 1 || batch.messages == 1,
                "one message per batch across lanes"
            );
            lane_messages[batch.lane].extend(msgs);
        }
    }
    assert_eq!(out.partial_len(), 0);

    let mut inbound = Inbound::new(framing, 1 << 20, lanes);
    let mut offsets = vec![0usize; lanes];
    let mut released = Vec::new();
    let mut chunks = chunk_sizes.iter().cycle();
    let mut picks = schedule.iter().cycle();
    let mut finished = 0;
    while finished < lanes {
        let pick = *picks.next().unwrap();
        let lane = (0..lanes)
            .map(|k| (pick + k) % lanes)
            .find(|&l| offsets[l] <= lane_bytes[l].len())
            .unwrap();
        if offsets[lane] == lane_bytes[lane].len() {
            offsets[lane] += 1; // mark ended
            finished += 1;
            let all = inbound.finish(lane).unwrap();
            assert_eq!(all, finished == lanes);
            continue;
        }
        let n = (*chunks.next().unwrap()).clamp(1, lane_bytes[lane].len() - offsets[lane]);
        let chunk = Bytes::copy_from_slice(&lane_bytes[lane][offsets[lane]..offsets[lane] + n]);
        offsets[lane] += n;
        if let Some(bytes) = inbound.push(lane, chunk).unwrap() {
            released.extend_from_slice(&bytes);
        }
    }
    (lane_messages, released)
}

fn split_messages(framing: Framing, bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut framer = Framer::new(framing, 1 << 20);
    let mut at = 0;
    let mut out = Vec::new();
    while let Some(n) = framer.next_message(&bytes[at..]).unwrap() {
        out.push(bytes[at..at + n].to_vec());
        at += n;
    }
    assert_eq!(at, bytes.len());
    out
}

#[test]
fn stream_modes_parse_and_print() {
    assert_eq!("ordered".parse(), Ok(StreamMode::Ordered));
    assert_eq!("rr:16".parse(), Ok(StreamMode::RoundRobin { lanes: 16 }));
    for bad in ["rr:0", "rr:257", "rr:", "rr:x", "fifo", ""] {
        assert!(bad.parse::<StreamMode>().is_err(), "{bad}");
    }
    assert_eq!(StreamMode::RoundRobin { lanes: 4 }.to_string(), "rr:4");
    assert_eq!(
        StreamMode::RoundRobin { lanes: 4 }.lanes_for(Framing::Raw),
        1
    );
    assert_eq!(
        StreamMode::RoundRobin { lanes: 4 }.lanes_for(Framing::JsonRpc),
        4
    );
}

#[test]
fn ordered_sends_every_buffered_message_in_one_batch() {
    let mut out = Outbound::new(Framing::OpenFlow, 65_535, 1);
    let msgs: Vec<Vec<u8>> = (0..5).map(|i| of_message(i, 10)).collect();
    let all = msgs.concat();
    out.read_buf().extend_from_slice(&all[..all.len() - 3]);
    let batch = out.next_batch().unwrap().unwrap();
    assert_eq!((batch.lane, batch.messages, batch.bytes.len()), (0, 4, 72));
    assert_eq!(out.next_batch().unwrap(), None);
    assert_eq!(out.partial_len(), 15);
}

#[test]
fn round_robin_cycles_lanes_one_message_each() {
    let mut out = Outbound::new(Framing::OpenFlow, 65_535, 3);
    for i in 0..7 {
        out.read_buf().extend_from_slice(&of_message(i, 0));
    }
    let lanes: Vec<usize> = std::iter::from_fn(|| out.next_batch().unwrap())
        .map(|b| b.lane)
        .collect();
    assert_eq!(lanes, [0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn raw_services_use_one_lane_and_forward_as_read() {
    let mut out = Outbound::new(Framing::Raw, 0, 8);
    out.read_buf().extend_from_slice(b"abc");
    assert_eq!(out.next_batch().unwrap().unwrap().lane, 0);
    out.read_buf().extend_from_slice(b"de");
    assert_eq!(
        out.next_batch().unwrap().unwrap().bytes,
        Bytes::from_static(b"de")
    );
}

#[test]
fn messages_before_a_malformed_one_still_leave() {
    let mut out = Outbound::new(Framing::OpenFlow, 65_535, 1);
    let good = [of_message(1, 4), of_message(2, 4)].concat();
    out.read_buf().extend_from_slice(&good);
    out.read_buf().extend_from_slice(&[4, 0, 0, 3, 0, 0, 0, 0]);
    let batch = out.next_batch().unwrap().unwrap();
    assert_eq!((batch.messages, &batch.bytes[..]), (2, &good[..]));
    assert!(matches!(
        out.next_batch(),
        Err(FrameError::OpenFlowLengthTooShort { length: 3, .. })
    ));
    assert!(out.next_batch().is_err(), "the error sticks");
}

#[test]
fn a_lane_ending_mid_message_is_reported() {
    let mut inbound = Inbound::new(Framing::OpenFlow, 65_535, 2);
    let m = of_message(1, 20);
    assert_eq!(
        inbound.push(1, Bytes::copy_from_slice(&m[..10])).unwrap(),
        None
    );
    assert_eq!(inbound.finish(0), Ok(false));
    assert_eq!(inbound.finish(1), Err(TruncatedLane { lane: 1, bytes: 10 }));
}

#[test]
fn malformed_bytes_from_a_lane_are_an_error_not_a_panic() {
    let mut inbound = Inbound::new(Framing::JsonRpc, 1024, 1);
    assert!(
        inbound
            .push(0, Bytes::from_static(b"{\"a\":1}garbage"))
            .is_err()
    );
}

#[test]
fn whole_messages_pass_through_without_copying() {
    let mut inbound = Inbound::new(Framing::OpenFlow, 65_535, 1);
    let chunk = Bytes::from([of_message(1, 4), of_message(2, 4)].concat());
    let released = inbound.push(0, chunk.clone()).unwrap().unwrap();
    assert_eq!(released.as_ptr(), chunk.as_ptr());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Ordered: whatever the read and chunk boundaries, the receiver gets exactly the
    /// sent byte stream.
    #[test]
    fn ordered_is_byte_identical(
        sizes in prop::collection::vec(0usize..300, 1..40),
        json in any::<bool>(),
        reads in prop::collection::vec(1usize..200, 1..10),
        chunks in prop::collection::vec(1usize..200, 1..10),
    ) {
        let framing = if json { Framing::JsonRpc } else { Framing::OpenFlow };
        let messages: Vec<Vec<u8>> = sizes.iter().enumerate()
            .map(|(i, &s)| if json { json_message(i, s) } else { of_message(i, s) })
            .collect();
        let (_, released) = run(framing, 1, &messages, &reads, &chunks, &[0]);
        prop_assert_eq!(released, messages.concat());
    }

    /// Round robin: every message arrives exactly once and whole; each lane's
    /// messages keep their order; lanes interleave arbitrarily.
    #[test]
    fn round_robin_delivers_every_message_once(
        sizes in prop::collection::vec(0usize..300, 1..60),
        lanes in 1usize..17,
        json in any::<bool>(),
        reads in prop::collection::vec(1usize..500, 1..10),
        chunks in prop::collection::vec(1usize..200, 1..10),
        schedule in prop::collection::vec(0usize..17, 1..20),
    ) {
        let framing = if json { Framing::JsonRpc } else { Framing::OpenFlow };
        let messages: Vec<Vec<u8>> = sizes.iter().enumerate()
            .map(|(i, &s)| if json { json_message(i, s) } else { of_message(i, s) })
            .collect();
        let (per_lane, released) = run(framing, lanes, &messages, &reads, &chunks, &schedule);
        // Lane assignment is round robin over sent messages.
        for (lane, msgs) in per_lane.iter().enumerate() {
            let expected: Vec<Vec<u8>> = messages.iter().skip(lane).step_by(lanes).cloned().collect();
            prop_assert_eq!(msgs, &expected);
        }
        let got = split_messages(framing, &released);
        let mut sorted_got = got.clone();
        sorted_got.sort();
        let mut sorted_sent = messages.clone();
        sorted_sent.sort();
        prop_assert_eq!(sorted_got, sorted_sent);
        // Per-lane order survives the merge.
        for (lane, msgs) in per_lane.iter().enumerate() {
            let positions: Vec<usize> = msgs.iter()
                .map(|m| got.iter().position(|g| g == m).unwrap())
                .collect();
            prop_assert!(positions.windows(2).all(|w| w[0] < w[1]), "lane {} reordered", lane);
        }
    }
}
