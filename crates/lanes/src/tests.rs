//! Checks of the lane contracts with no sockets: unit tests, and randomised
//! sessions pushed through a simulated lossy network on a virtual clock.

use super::*;
use crate::rules::{Direction, Placement, place_openflow};
use bytes::Bytes;
use proptest::prelude::*;
use quicsdn_wire::openflow::{self, OFP13_VERSION};
use quicsdn_wire::{FrameError, Framer, Framing};

const MAX: usize = 1 << 20;

fn of_message(i: usize, body_len: usize) -> Vec<u8> {
    let mut body = vec![0u8; body_len];
    for (j, b) in body.iter_mut().enumerate() {
        *b = (i * 31 + j) as u8;
    }
    openflow::message(OFP13_VERSION, (i % 30) as u8, i as u32, &body)
}

fn json_message(i: usize, pad: usize) -> Vec<u8> {
    format!(
        r#"{{"id":{i},"method":"transact","params":["{}","}}{{\"]"]}}"#,
        "x".repeat(pad)
    )
    .into_bytes()
}

fn split_messages(framing: Framing, bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut framer = Framer::new(framing, MAX);
    let mut at = 0;
    let mut out = Vec::new();
    while let Some(n) = framer.next_message(&bytes[at..]).unwrap() {
        out.push(bytes[at..at + n].to_vec());
        at += n;
    }
    assert_eq!(at, bytes.len());
    out
}

fn outbound(framing: Framing, mode: StreamMode, direction: Direction) -> Outbound {
    Outbound::new(framing, MAX, mode, direction, false)
}

/// Every batch an Outbound produces for `stream` fed in one piece.
fn batches(out: &mut Outbound, stream: &[u8]) -> Vec<Batch> {
    out.read_buf().extend_from_slice(stream);
    std::iter::from_fn(|| out.next_batch().unwrap()).collect()
}

/// An idle session's read buffer shrinks to MIN_READ_CHUNK; reads that fill it
/// grow it back to READ_CHUNK; and nothing read is lost on the way.
#[test]
fn the_read_buffer_follows_the_reads() {
    let mut out = outbound(
        Framing::OpenFlow,
        StreamMode::default(),
        Direction::ToSwitch,
    );
    let free = |out: &mut Outbound| {
        let b = out.read_buf();
        b.capacity() - b.len()
    };
    assert!(free(&mut out) >= crate::MIN_READ_CHUNK);
    assert!(out.read_buf().capacity() < 2 * crate::MIN_READ_CHUNK);
    // A burst: full reads grow it; then small reads (an echo each) shrink it
    // step by step, and the burst's buffer is given back once empty.
    for _ in 0..8 {
        let n = free(&mut out);
        out.read_done(n);
    }
    let burst = free(&mut out);
    assert!(burst >= crate::READ_CHUNK, "{burst}");
    let echo = of_message(1, 0);
    let mut sent = Vec::new();
    for _ in 0..8 {
        out.read_buf().extend_from_slice(&echo);
        out.read_done(echo.len());
        while let Some(b) = out.next_batch().unwrap() {
            sent.push(b);
        }
    }
    let idle = free(&mut out);
    assert!(
        (crate::MIN_READ_CHUNK..2 * crate::MIN_READ_CHUNK + echo.len()).contains(&idle),
        "{idle}"
    );
    assert!(out.read_buf().capacity() < 4 * crate::MIN_READ_CHUNK);
    // Reads that fill it double it, up to READ_CHUNK.
    let mut grown = idle;
    for _ in 0..8 {
        let n = free(&mut out);
        out.read_done(n);
        grown = free(&mut out);
    }
    assert!(grown >= crate::READ_CHUNK && grown > idle, "{grown}");
    assert_eq!(sent.len(), 8);
}

#[test]
fn stream_modes_parse_print_and_round_trip_the_wire() {
    assert_eq!("ordered".parse(), Ok(StreamMode::Ordered));
    assert_eq!("safe".parse(), Ok(StreamMode::Safe { keyed: 8 }));
    assert_eq!("safe:3".parse(), Ok(StreamMode::Safe { keyed: 3 }));
    assert_eq!("rr:16".parse(), Ok(StreamMode::RoundRobin { lanes: 16 }));
    for bad in ["rr:0", "rr:257", "rr:", "safe:0", "fifo", ""] {
        assert!(bad.parse::<StreamMode>().is_err(), "{bad}");
    }
    assert_eq!(StreamMode::default(), StreamMode::Safe { keyed: 8 });
    for m in [
        StreamMode::Ordered,
        StreamMode::RoundRobin { lanes: 4 },
        StreamMode::Safe { keyed: 2 },
    ] {
        assert_eq!(m.to_string().parse(), Ok(m));
        let (c, p) = m.to_wire();
        assert_eq!(StreamMode::from_wire(c, p), Some(m));
    }
    assert_eq!(StreamMode::from_wire(9, 1), None);
    assert_eq!(StreamMode::from_wire(1, 0), None);
    assert_eq!(
        StreamMode::RoundRobin { lanes: 4 }.lanes_for(Framing::Raw),
        1
    );
    assert_eq!(
        StreamMode::Safe { keyed: 8 }.lanes_for(Framing::OpenFlow),
        10
    );
    assert_eq!(StreamMode::Safe { keyed: 8 }.lanes_for(Framing::JsonRpc), 2);
}

#[test]
fn ordered_sends_every_buffered_message_in_one_batch() {
    let mut out = outbound(
        Framing::OpenFlow,
        StreamMode::Ordered,
        Direction::ToController,
    );
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
    let mut out = outbound(
        Framing::OpenFlow,
        StreamMode::RoundRobin { lanes: 3 },
        Direction::ToController,
    );
    let stream: Vec<u8> = (0..7).flat_map(|i| of_message(i, 0)).collect();
    let lanes: Vec<usize> = batches(&mut out, &stream).iter().map(|b| b.lane).collect();
    assert_eq!(lanes, [0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn raw_services_use_one_lane_and_forward_as_read() {
    let mut out = outbound(Framing::Raw, StreamMode::default(), Direction::ToController);
    assert_eq!(out.lanes(), 1);
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
    for mode in [StreamMode::Ordered, StreamMode::default()] {
        let mut out = outbound(Framing::OpenFlow, mode, Direction::ToSwitch);
        let good = [of_message(1, 4), of_message(2, 4)].concat();
        out.read_buf().extend_from_slice(&good);
        out.read_buf().extend_from_slice(&[4, 0, 0, 3, 0, 0, 0, 0]);
        let batch = out.next_batch().unwrap().unwrap();
        assert_eq!((batch.messages, &batch.bytes[..]), (2, &good[..]), "{mode}");
        assert!(matches!(
            out.next_batch(),
            Err(FrameError::OpenFlowLengthTooShort { length: 3, .. })
        ));
        assert!(out.next_batch().is_err(), "the error sticks");
    }
}

#[test]
fn safe_mode_refuses_version_zero_from_the_local_peer() {
    let mut out = outbound(
        Framing::OpenFlow,
        StreamMode::default(),
        Direction::ToSwitch,
    );
    out.read_buf()
        .extend_from_slice(&openflow::message(0, 0, 5, &[]));
    assert!(matches!(
        out.next_batch(),
        Err(FrameError::OpenFlowVersionZero { xid: 5, .. })
    ));
    // Other modes carry any version: they add no markers.
    let mut out = outbound(Framing::OpenFlow, StreamMode::Ordered, Direction::ToSwitch);
    out.read_buf()
        .extend_from_slice(&openflow::message(0, 0, 5, &[]));
    assert!(out.next_batch().unwrap().is_some());
}

#[test]
fn a_lane_ending_mid_message_is_reported() {
    let mut inbound = Inbound::new(
        Framing::OpenFlow,
        MAX,
        StreamMode::RoundRobin { lanes: 2 },
        Direction::ToSwitch,
    );
    let m = of_message(1, 20);
    assert!(
        inbound
            .push(1, Bytes::copy_from_slice(&m[..10]))
            .unwrap()
            .is_empty()
    );
    assert_eq!(inbound.finish(0), Ok(false));
    assert_eq!(inbound.finish(1), Err(TruncatedLane { lane: 1, bytes: 10 }));
}

#[test]
fn a_session_ends_only_once_every_lane_has_ended_even_lanes_never_used() {
    let mut inbound = Inbound::new(
        Framing::OpenFlow,
        MAX,
        StreamMode::RoundRobin { lanes: 4 },
        Direction::ToSwitch,
    );
    let m = of_message(1, 20);
    assert_eq!(
        inbound.push(0, Bytes::copy_from_slice(&m)).unwrap().len(),
        1
    );
    assert_eq!(
        inbound.push(4, Bytes::new()),
        Err(inbound::InboundError::BadLane(4))
    );
    assert_eq!(inbound.finish(0), Ok(false));
    // Lanes 1 and 3 never carried anything: still not done without them.
    assert_eq!(inbound.finish(2), Ok(false));
    assert_eq!(inbound.finish(1), Ok(false));
    assert!(!inbound.is_done());
    assert_eq!(inbound.finish(3), Ok(true));
}

#[test]
fn bad_peer_input_is_an_error_not_a_panic() {
    let mut inbound = Inbound::new(
        Framing::JsonRpc,
        1024,
        StreamMode::Ordered,
        Direction::ToSwitch,
    );
    assert!(
        inbound
            .push(0, Bytes::from_static(b"{\"a\":1}garbage"))
            .is_err()
    );
    let mut inbound = Inbound::new(
        Framing::OpenFlow,
        MAX,
        StreamMode::default(),
        Direction::ToSwitch,
    );
    assert!(matches!(
        inbound.push(12, Bytes::new()),
        Err(inbound::InboundError::BadLane(12))
    ));
    // A marker naming a lane the session does not have.
    let bad = marker::encode(&[(40, 1)]);
    assert!(matches!(
        inbound.push(0, Bytes::from(bad)),
        Err(inbound::InboundError::BadMarker(0))
    ));
}

#[test]
fn whole_messages_pass_through_without_copying() {
    let mut inbound = Inbound::new(
        Framing::OpenFlow,
        MAX,
        StreamMode::Ordered,
        Direction::ToSwitch,
    );
    let chunk = Bytes::from([of_message(1, 4), of_message(2, 4)].concat());
    let released = inbound.push(0, chunk.clone()).unwrap();
    assert_eq!(released[0].as_ptr(), chunk.as_ptr());
}

// ---- Messages with meaning, for the safe mode ------------------------------------

/// OpenFlow 1.3 message builders for the kinds the rules distinguish. Every
/// message carries a unique `tag` so each can be recognised after delivery.
mod of13 {
    use super::*;

    pub use openflow::build::msg_type::*;
    pub const EXPERIMENTER: u8 = 4;
    pub const SET_CONFIG: u8 = 9;
    pub const FLOW_REMOVED: u8 = 11;
    pub const PORT_STATUS: u8 = 12;
    pub const ROLE_REPLY: u8 = 25;

    pub fn plain(kind: u8, xid: u32, tag: u32) -> Vec<u8> {
        openflow::message(OFP13_VERSION, kind, xid, &tag.to_be_bytes())
    }

    fn oxm(v: u32) -> Vec<u8> {
        let mut m = vec![0, 1, 0, 12, 0x80, 0, 0, 4];
        m.extend_from_slice(&v.to_be_bytes());
        m.extend_from_slice(&[0; 4]);
        m
    }

    /// A PACKET_IN of flow `flow` (its IPv4 source), unique by `tag` (the TCP
    /// sequence number, not part of the flow).
    pub fn packet_in(flow: u8, tag: u32) -> Vec<u8> {
        let mut frame = vec![0xaa; 6];
        frame.extend_from_slice(&[0xbb; 6]);
        frame.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0]);
        frame.extend_from_slice(&[10, 0, 0, flow, 10, 0, 0, 1]);
        frame.extend_from_slice(&[0x10, 0x00, 0x00, 0x50]);
        frame.extend_from_slice(&tag.to_be_bytes());
        let mut body = vec![0xff; 4];
        body.extend_from_slice(&(frame.len() as u16).to_be_bytes());
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&[0; 8]);
        body.extend_from_slice(&oxm(1));
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&frame);
        openflow::message(OFP13_VERSION, PACKET_IN, 0, &body)
    }

    pub fn port_status(port: u32, tag: u32) -> Vec<u8> {
        let mut body = vec![0; 8];
        body.extend_from_slice(&port.to_be_bytes());
        body.extend_from_slice(&tag.to_be_bytes());
        body.extend_from_slice(&[0; 56]);
        openflow::message(OFP13_VERSION, PORT_STATUS, 0, &body)
    }

    pub fn flow_removed(entry: u32, tag: u32) -> Vec<u8> {
        let mut body = tag.to_be_bytes().to_vec();
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&100u16.to_be_bytes());
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&[0; 28]);
        body.extend_from_slice(&oxm(entry));
        openflow::message(OFP13_VERSION, FLOW_REMOVED, 0, &body)
    }

    pub fn multipart_reply(xid: u32, more: bool, tag: u32) -> Vec<u8> {
        let mut body = vec![0, 1, 0, if more { 1 } else { 0 }, 0, 0, 0, 0];
        body.extend_from_slice(&tag.to_be_bytes());
        openflow::message(OFP13_VERSION, MULTIPART_REPLY, xid, &body)
    }

    /// A FLOW_MOD on entry `entry` (its match) with `command` and `flags`.
    pub fn flow_mod(entry: u32, command: u8, flags: u16, tag: u32) -> Vec<u8> {
        let mut body = tag.to_be_bytes().to_vec();
        body.extend_from_slice(&[0; 12]);
        body.extend_from_slice(&[0, command, 0, 0, 0, 0]);
        body.extend_from_slice(&100u16.to_be_bytes());
        body.extend_from_slice(&[0; 12]);
        body.extend_from_slice(&flags.to_be_bytes());
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&oxm(entry));
        openflow::message(OFP13_VERSION, FLOW_MOD, 0, &body)
    }
}

#[test]
fn the_rules_place_messages_as_the_table_says() {
    use Direction::*;
    use of13::*;
    use openflow::fields::{OFPFF_CHECK_OVERLAP, command};
    let p = |d, m: &[u8], relaxed| place_openflow(d, m, relaxed);
    // Towards the switch: FIFO except echo.
    assert_eq!(
        p(ToSwitch, &plain(ECHO_REQUEST, 1, 0), false),
        Placement::Priority
    );
    assert_eq!(
        p(ToSwitch, &flow_mod(1, command::ADD, 0, 0), false),
        Placement::Main
    );
    assert_eq!(
        p(ToSwitch, &plain(PACKET_OUT, 1, 0), false),
        Placement::Main
    );
    assert_eq!(
        p(ToSwitch, &plain(BARRIER_REQUEST, 1, 0), false),
        Placement::Fence
    );
    assert_eq!(
        p(ToSwitch, &plain(GROUP_MOD, 1, 0), false),
        Placement::Fence
    );
    // --relaxed-flow-mods: strict mods keyed by entry, the same entry alike.
    let add = p(ToSwitch, &flow_mod(1, command::ADD, 0, 0), true);
    assert!(matches!(add, Placement::Keyed(_)));
    assert_eq!(
        p(ToSwitch, &flow_mod(1, command::DELETE_STRICT, 0, 9), true),
        add
    );
    assert_ne!(p(ToSwitch, &flow_mod(2, command::ADD, 0, 0), true), add);
    assert_eq!(
        p(ToSwitch, &flow_mod(1, command::DELETE, 0, 0), true),
        Placement::Fence
    );
    assert_eq!(
        p(ToSwitch, &flow_mod(1, command::MODIFY, 0, 0), true),
        Placement::Fence
    );
    assert_eq!(
        p(
            ToSwitch,
            &flow_mod(1, command::ADD, OFPFF_CHECK_OVERLAP, 0),
            true
        ),
        Placement::Fence
    );
    // Towards the controller.
    assert_eq!(
        p(ToController, &plain(ECHO_REPLY, 1, 0), false),
        Placement::Priority
    );
    assert_eq!(
        p(ToController, &packet_in(3, 1), false),
        p(ToController, &packet_in(3, 2), false)
    );
    assert_ne!(
        p(ToController, &packet_in(3, 1), false),
        p(ToController, &packet_in(4, 1), false)
    );
    assert_eq!(
        p(ToController, &port_status(7, 1), false),
        p(ToController, &port_status(7, 2), false)
    );
    assert_eq!(
        p(ToController, &flow_removed(5, 1), false),
        p(ToController, &flow_removed(5, 2), false)
    );
    assert_eq!(
        p(ToController, &multipart_reply(9, true, 1), false),
        p(ToController, &plain(ERROR, 9, 2), false),
        "a multipart sequence and errors of the same request share a stream"
    );
    for fence in [BARRIER_REPLY, ROLE_REPLY, EXPERIMENTER, HELLO, 77] {
        assert_eq!(
            p(ToController, &plain(fence, 1, 0), false),
            Placement::Fence,
            "type {fence}"
        );
    }
    assert_eq!(
        p(ToController, &[1, 2, 3], false),
        Placement::Fence,
        "unreadable: fence"
    );
}

#[test]
fn the_rules_table_in_the_docs_is_the_one_in_the_code() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/streams.md"
    ))
    .expect("docs/streams.md");
    let table = rules::markdown_table();
    assert!(
        docs.contains(&table),
        "docs/streams.md must contain the rules table exactly as the code has it:\n{table}"
    );
}

#[test]
fn the_handshake_uses_one_stream_and_its_end_is_a_fence() {
    use of13::*;
    let mut out = outbound(
        Framing::OpenFlow,
        StreamMode::default(),
        Direction::ToController,
    );
    let before = [
        plain(HELLO, 1, 0),
        plain(ECHO_REQUEST, 2, 0),
        packet_in(1, 0),
    ]
    .concat();
    let lanes: Vec<usize> = batches(&mut out, &before).iter().map(|b| b.lane).collect();
    assert_eq!(
        lanes,
        [MAIN_LANE],
        "everything before FEATURES_REPLY on the main stream"
    );
    let after = [
        plain(FEATURES_REPLY, 3, 0),
        packet_in(1, 1),
        plain(ECHO_REQUEST, 4, 0),
    ]
    .concat();
    let b = batches(&mut out, &after);
    assert_eq!(b[0].lane, MAIN_LANE);
    assert!(b[1].lane >= FIRST_KEYED_LANE);
    assert!(
        marker::is_marker(&b[1].bytes),
        "the first keyed message waits for the handshake"
    );
    assert_eq!(b[2].lane, PRIORITY_LANE);
}

#[test]
fn ovsdb_echo_and_its_reply_take_the_priority_lane() {
    let mut out = Outbound::new(
        Framing::JsonRpc,
        MAX,
        StreamMode::default(),
        Direction::ToSwitch,
        false,
    );
    let stream = br#"{"id":1,"method":"transact","params":[]}{"id":"e","method":"echo","params":[]}{"id":"x","result":[],"error":null}"#;
    let lanes: Vec<usize> = batches(&mut out, stream).iter().map(|b| b.lane).collect();
    assert_eq!(lanes, [MAIN_LANE, PRIORITY_LANE, MAIN_LANE]);
    // A reply whose id the peer used for an echo request.
    out.echo_request_received("\"e2\"".into());
    let reply = br#"{"id":"e2","result":[],"error":null}"#;
    assert_eq!(batches(&mut out, reply)[0].lane, PRIORITY_LANE);
    // The receiving side reports echo requests so the reply can follow them.
    let mut inbound = Inbound::new(
        Framing::JsonRpc,
        MAX,
        StreamMode::default(),
        Direction::ToController,
    );
    inbound
        .push(
            0,
            Bytes::from_static(br#"{"id":"e3","method":"echo","params":[]}"#),
        )
        .unwrap();
    assert_eq!(
        inbound.take_events(),
        [InboundEvent::EchoRequest("\"e3\"".into())]
    );
}

// ---- A virtual network ------------------------------------------------------------

/// Deterministic pseudo-random numbers for the simulation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Sends `batches` (in order) over a network where each lane is a reliable,
/// in-order stream of packets: packets take 10–30 ms, a lost packet (with
/// probability `loss` %) arrives one or more 200 ms retransmission timeouts
/// later, and a lane delivers nothing past a missing packet (head-of-line
/// blocking within a stream, none across streams). Returns the chunks in the
/// order the receiver gets them: `(arrival time µs, lane, bytes)`.
fn transmit(batches: &[Batch], rng: &mut Rng, loss: u64) -> Vec<(u64, usize, Bytes)> {
    let lanes = batches.iter().map(|b| b.lane).max().unwrap_or(0) + 1;
    let mut lane_ready = vec![0u64; lanes];
    let mut chunks = Vec::new();
    let mut now = 0u64;
    for b in batches {
        now += rng.below(500);
        let mut at = 0;
        while at < b.bytes.len() {
            let n = (1 + rng.below(1400) as usize).min(b.bytes.len() - at);
            let mut arrival = now + 10_000 + rng.below(20_000);
            while rng.chance(loss) {
                arrival += 200_000;
            }
            // In-order delivery within the lane.
            let ready = arrival.max(lane_ready[b.lane]);
            lane_ready[b.lane] = ready;
            chunks.push((ready, b.lane, b.bytes.slice(at..at + n)));
            at += n;
        }
    }
    // Stable sort keeps each lane's chunks in order when times tie.
    chunks.sort_by_key(|c| c.0);
    chunks
}

/// Delivers `batches` through [`transmit`] into `inbound` and returns the bytes it
/// released, in release order.
fn deliver(inbound: &mut Inbound, batches: &[Batch], rng: &mut Rng, loss: u64) -> Vec<u8> {
    let mut got = Vec::new();
    for (_, lane, chunk) in transmit(batches, rng, loss) {
        let runs = inbound.push(lane, chunk).unwrap();
        // Each run names the lane it rode (for `quicsdn snoop`): the lane
        // whose chunk arrived, or one it unblocked.
        assert_eq!(inbound.run_lanes().len(), runs.len());
        assert!(inbound.run_lanes().iter().all(|&l| l < inbound.lanes()));
        for run in runs {
            got.extend_from_slice(&run);
        }
    }
    got
}

/// One simulated direction of a session: `messages` go through an Outbound (read
/// in random pieces), the lossy network and an Inbound. Returns the released
/// messages in release order.
fn simulate(
    messages: &[Vec<u8>],
    direction: Direction,
    relaxed: bool,
    seed: u64,
    loss: u64,
) -> Vec<Vec<u8>> {
    let mut rng = Rng(seed | 1);
    let mode = StreamMode::Safe {
        keyed: 1 + rng.below(8) as u16,
    };
    let mut out = Outbound::new(Framing::OpenFlow, MAX, mode, direction, relaxed);
    let stream = messages.concat();
    let mut sent = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let n = (1 + rng.below(3000) as usize).min(stream.len() - at);
        out.read_buf().extend_from_slice(&stream[at..at + n]);
        at += n;
        while let Some(b) = out.next_batch().unwrap() {
            sent.push(b);
        }
    }
    let mut inbound = Inbound::new(Framing::OpenFlow, MAX, mode, direction);
    let released = split_messages(
        Framing::OpenFlow,
        &deliver(&mut inbound, &sent, &mut rng, loss),
    );
    for lane in 0..inbound.lanes() {
        inbound.finish(lane).unwrap();
    }
    assert!(inbound.is_done(), "messages left undelivered (a deadlock?)");
    released
}

/// What the generator knows about each message it made.
#[derive(Debug, Clone, PartialEq)]
enum Role {
    Handshake,
    Echo,
    /// Must stay in order with messages of the same key.
    Keyed(String),
    /// A total-order point.
    Fence,
    /// In order with the other `Main` messages (towards the switch).
    Main,
}

fn switch_to_controller(seed: u64, n: usize) -> Vec<(Vec<u8>, Role)> {
    use of13::*;
    let mut rng = Rng(seed | 1);
    let mut msgs = vec![
        (plain(HELLO, 1, 0), Role::Handshake),
        (plain(FEATURES_REPLY, 2, 1), Role::Handshake),
    ];
    let mut open_multipart: Vec<u32> = Vec::new();
    for tag in 2..n as u32 {
        let m = match rng.below(12) {
            0..=2 => {
                let flow = rng.below(6) as u8;
                (packet_in(flow, tag), Role::Keyed(format!("flow {flow}")))
            }
            3 => {
                let port = rng.below(4) as u32;
                (port_status(port, tag), Role::Keyed(format!("port {port}")))
            }
            4 => {
                let entry = rng.below(4) as u32;
                (
                    flow_removed(entry, tag),
                    Role::Keyed(format!("entry {entry}")),
                )
            }
            5 | 6 => {
                // Continue an open multipart sequence or start one.
                let xid = match open_multipart.last() {
                    Some(&x) if rng.chance(70) => x,
                    _ => {
                        let x = 1000 + tag;
                        open_multipart.push(x);
                        x
                    }
                };
                let more = rng.chance(60);
                if !more {
                    open_multipart.retain(|&x| x != xid);
                }
                (
                    multipart_reply(xid, more, tag),
                    Role::Keyed(format!("xid {xid}")),
                )
            }
            7 => {
                let xid = 1000 + rng.below(u64::from(tag)) as u32;
                (plain(ERROR, xid, tag), Role::Keyed(format!("xid {xid}")))
            }
            8 => (
                plain(
                    if rng.chance(50) {
                        ECHO_REQUEST
                    } else {
                        ECHO_REPLY
                    },
                    tag,
                    tag,
                ),
                Role::Echo,
            ),
            9 => (plain(BARRIER_REPLY, tag, tag), Role::Fence),
            10 => (
                plain(
                    [ROLE_REPLY, EXPERIMENTER, 99][rng.below(3) as usize],
                    tag,
                    tag,
                ),
                Role::Fence,
            ),
            _ => (
                plain(7 /* GET_CONFIG_REPLY */, 5000 + tag, tag),
                Role::Keyed(format!("xid {}", 5000 + tag)),
            ),
        };
        msgs.push(m);
    }
    msgs
}

fn controller_to_switch(seed: u64, n: usize, relaxed: bool) -> Vec<(Vec<u8>, Role)> {
    use of13::*;
    use openflow::fields::{OFPFF_CHECK_OVERLAP, command};
    let mut rng = Rng(seed | 1);
    let mut msgs = vec![
        (plain(HELLO, 1, 0), Role::Main),
        (plain(FEATURES_REQUEST, 2, 1), Role::Main),
    ];
    for tag in 2..n as u32 {
        let entry = rng.below(5) as u32;
        let keyed = |m| {
            if relaxed {
                (m, Role::Keyed(format!("entry {entry}")))
            } else {
                (m, Role::Main)
            }
        };
        let m = match rng.below(12) {
            0..=2 => keyed(flow_mod(entry, command::ADD, 0, tag)),
            3 => keyed(flow_mod(entry, command::MODIFY_STRICT, 0, tag)),
            4 => keyed(flow_mod(entry, command::DELETE_STRICT, 0, tag)),
            5 => {
                let c = [command::MODIFY, command::DELETE][rng.below(2) as usize];
                (
                    flow_mod(entry, c, 0, tag),
                    if relaxed { Role::Fence } else { Role::Main },
                )
            }
            6 => (
                flow_mod(entry, command::ADD, OFPFF_CHECK_OVERLAP, tag),
                if relaxed { Role::Fence } else { Role::Main },
            ),
            7 => (plain(BARRIER_REQUEST, tag, tag), Role::Fence),
            8 => (plain(GROUP_MOD, tag, tag), Role::Fence),
            9 => (
                plain(
                    if rng.chance(50) {
                        ECHO_REQUEST
                    } else {
                        ECHO_REPLY
                    },
                    tag,
                    tag,
                ),
                Role::Echo,
            ),
            10 => (plain(PACKET_OUT, tag, tag), Role::Main),
            _ => (
                plain(
                    [MULTIPART_REQUEST, SET_CONFIG][rng.below(2) as usize],
                    tag,
                    tag,
                ),
                Role::Main,
            ),
        };
        msgs.push(m);
    }
    msgs
}

/// Checks a delivery against the rules, from what the generator knows (not from
/// the scheduler's own decisions). `main_is_fifo`: towards the switch, `Main`
/// messages stay in order among themselves and with fences.
fn check(sent: &[(Vec<u8>, Role)], released: &[Vec<u8>]) {
    // Every message exactly once, byte for byte.
    let pos: Vec<usize> = sent
        .iter()
        .map(|(m, _)| {
            let found: Vec<usize> = released
                .iter()
                .enumerate()
                .filter(|(_, r)| *r == m)
                .map(|(i, _)| i)
                .collect();
            assert_eq!(
                found.len(),
                1,
                "message {:?} delivered {} times",
                &m[..8.min(m.len())],
                found.len()
            );
            found[0]
        })
        .collect();
    assert_eq!(released.len(), sent.len());
    let before = |a: usize, b: usize| pos[a] < pos[b];
    for (i, (_, ri)) in sent.iter().enumerate() {
        for (j, (_, rj)) in sent.iter().enumerate().skip(i + 1) {
            let ordered = match (ri, rj) {
                (Role::Echo, _) | (_, Role::Echo) => false,
                (Role::Handshake, _) | (_, Role::Handshake) => true,
                (Role::Fence, _) | (_, Role::Fence) => true,
                (Role::Keyed(a), Role::Keyed(b)) => a == b,
                (Role::Main, Role::Main) => true,
                (Role::Main, Role::Keyed(_)) | (Role::Keyed(_), Role::Main) => false,
            };
            if ordered {
                assert!(
                    before(i, j),
                    "message {i} ({ri:?}) was delivered after message {j} ({rj:?})"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// Switch to controller, random traffic and 0–10 % loss: every rule holds.
    #[test]
    fn safe_switch_to_controller_keeps_every_rule(seed in any::<u64>(), n in 3usize..150, loss in 0u64..10) {
        let sent = switch_to_controller(seed, n);
        let msgs: Vec<Vec<u8>> = sent.iter().map(|(m, _)| m.clone()).collect();
        check(&sent, &simulate(&msgs, Direction::ToController, false, seed ^ 0xabcd, loss));
    }

    /// Controller to switch: FIFO except echo.
    #[test]
    fn safe_controller_to_switch_is_fifo_but_for_echo(seed in any::<u64>(), n in 3usize..150, loss in 0u64..10) {
        let sent = controller_to_switch(seed, n, false);
        let msgs: Vec<Vec<u8>> = sent.iter().map(|(m, _)| m.clone()).collect();
        let released = simulate(&msgs, Direction::ToSwitch, false, seed ^ 0x1234, loss);
        check(&sent, &released);
        // And literally FIFO once echoes are removed.
        let is_echo = |m: &Vec<u8>| matches!(m[1], of13::ECHO_REQUEST | of13::ECHO_REPLY);
        let a: Vec<&Vec<u8>> = msgs.iter().filter(|m| !is_echo(m)).collect();
        let b: Vec<&Vec<u8>> = released.iter().filter(|m| !is_echo(m)).collect();
        prop_assert_eq!(a, b);
    }

    /// Controller to switch with --relaxed-flow-mods: per-entry order, fences.
    #[test]
    fn relaxed_flow_mods_keep_entry_order_and_fences(seed in any::<u64>(), n in 3usize..150, loss in 0u64..10) {
        let sent = controller_to_switch(seed, n, true);
        let msgs: Vec<Vec<u8>> = sent.iter().map(|(m, _)| m.clone()).collect();
        let released = {
            let mut rng = Rng(seed | 1);
            let mode = StreamMode::Safe { keyed: 1 + rng.below(8) as u16 };
            let mut out = Outbound::new(Framing::OpenFlow, MAX, mode, Direction::ToSwitch, true);
            out.handshake_complete();
            let sent_batches = batches(&mut out, &msgs.concat());
            let mut inbound = Inbound::new(Framing::OpenFlow, MAX, mode, Direction::ToSwitch);
            split_messages(Framing::OpenFlow, &deliver(&mut inbound, &sent_batches, &mut rng, loss))
        };
        check(&sent, &released);
    }

    /// Ordered: whatever the read and chunk boundaries, the receiver gets exactly the
    /// sent byte stream.
    #[test]
    fn ordered_is_byte_identical(
        sizes in prop::collection::vec(0usize..300, 1..40),
        json in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let framing = if json { Framing::JsonRpc } else { Framing::OpenFlow };
        let messages: Vec<Vec<u8>> = sizes.iter().enumerate()
            .map(|(i, &s)| if json { json_message(i, s) } else { of_message(i, s) })
            .collect();
        let mut rng = Rng(seed | 1);
        let mut out = Outbound::new(framing, MAX, StreamMode::Ordered, Direction::ToSwitch, false);
        let stream = messages.concat();
        let mut sent = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            let n = (1 + rng.below(200) as usize).min(stream.len() - at);
            out.read_buf().extend_from_slice(&stream[at..at + n]);
            at += n;
            while let Some(b) = out.next_batch().unwrap() {
                sent.push(b);
            }
        }
        let mut inbound = Inbound::new(framing, MAX, StreamMode::Ordered, Direction::ToSwitch);
        prop_assert_eq!(deliver(&mut inbound, &sent, &mut rng, 5), stream);
    }

    /// Round robin: every message arrives exactly once and whole; each lane's
    /// messages keep their order; lanes interleave arbitrarily.
    #[test]
    fn round_robin_delivers_every_message_once(
        sizes in prop::collection::vec(0usize..300, 1..60),
        lanes in 1u16..17,
        seed in any::<u64>(),
    ) {
        let messages: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &s)| of_message(i, s)).collect();
        let mode = StreamMode::RoundRobin { lanes };
        let mut out = Outbound::new(Framing::OpenFlow, MAX, mode, Direction::ToController, false);
        let sent = batches(&mut out, &messages.concat());
        for (i, b) in sent.iter().enumerate() {
            prop_assert_eq!(b.lane, i % usize::from(lanes));
        }
        let mut rng = Rng(seed | 1);
        let mut inbound = Inbound::new(Framing::OpenFlow, MAX, mode, Direction::ToController);
        let got = split_messages(Framing::OpenFlow, &deliver(&mut inbound, &sent, &mut rng, 5));
        let mut sorted_got = got.clone();
        sorted_got.sort();
        let mut sorted_sent = messages.clone();
        sorted_sent.sort();
        prop_assert_eq!(sorted_got, sorted_sent);
        for lane in 0..usize::from(lanes) {
            let positions: Vec<usize> = messages.iter().skip(lane).step_by(usize::from(lanes))
                .map(|m| got.iter().position(|g| g == m).unwrap())
                .collect();
            prop_assert!(positions.windows(2).all(|w| w[0] < w[1]), "lane {} reordered", lane);
        }
    }
}

/// The reason `rr:16` is for reproducing the paper only: under loss it delivers a
/// barrier before messages sent ahead of it.
#[test]
fn round_robin_breaks_barrier_order_under_loss() {
    use of13::*;
    let msgs: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            if i % 10 == 9 {
                plain(BARRIER_REQUEST, i, i)
            } else {
                plain(FLOW_MOD, i, i)
            }
        })
        .collect();
    let mode = StreamMode::RoundRobin { lanes: 16 };
    let mut out = Outbound::new(Framing::OpenFlow, MAX, mode, Direction::ToSwitch, false);
    let sent = batches(&mut out, &msgs.concat());
    let mut rng = Rng(42);
    let mut inbound = Inbound::new(Framing::OpenFlow, MAX, mode, Direction::ToSwitch);
    let got = split_messages(
        Framing::OpenFlow,
        &deliver(&mut inbound, &sent, &mut rng, 5),
    );
    assert_ne!(
        got, msgs,
        "rr:16 kept the order this time; the seed no longer shows the problem"
    );
}

// ---- Class-aware coalescing on a virtual clock ------------------------------------

mod coalescing {
    use super::*;
    use crate::coalesce::{self, CoalesceConfig, Coalescer};
    use crate::rules::{How, RULES};
    use std::time::{Duration, Instant};

    const WINDOW: Duration = Duration::from_millis(10);
    const PORT_MOD: u8 = 16;

    fn config(epoch: Instant) -> CoalesceConfig {
        CoalesceConfig::new(WINDOW, epoch)
    }

    /// Urgency as the generator knows it (not the coalescer's own decision).
    fn urgent_by_type(m: &[u8]) -> bool {
        use of13::*;
        match m[1] {
            FLOW_MOD | GROUP_MOD | SET_CONFIG | PORT_STATUS | FLOW_REMOVED => false,
            MULTIPART_REPLY => m[11] & 1 == 0,
            _ => true,
        }
    }

    /// Feeds `stream` to a coalescer in random pieces at random times (0–15 ms
    /// apart, so traffic is sometimes dense, sometimes isolated), waking up at
    /// every deadline as the agent does. Returns, per message, when it arrived
    /// (its last byte was read) and when the coalescer let it go, and the bytes
    /// in release order.
    fn run(framing: Framing, direction: Direction, messages: &[Vec<u8>], rng: &mut Rng) -> Run {
        let epoch = Instant::now();
        let mut co = Coalescer::new(framing, MAX, config(epoch));
        let mode = StreamMode::Safe {
            keyed: 1 + rng.below(8) as u16,
        };
        let mut out = Outbound::new(framing, MAX, mode, direction, false);
        let stream = messages.concat();
        let ends: Vec<usize> = messages
            .iter()
            .scan(0, |at, m| {
                *at += m.len();
                Some(*at)
            })
            .collect();
        let mut arrived = vec![None; messages.len()];
        let mut left = vec![None; messages.len()];
        let mut released = Vec::new();
        let mut batches = Vec::new();
        let mut now = epoch;
        let mut release = |bytes: Bytes, t: Instant, released: &mut Vec<u8>, out: &mut Outbound| {
            released.extend_from_slice(&bytes);
            for (i, &e) in ends.iter().enumerate() {
                if e <= released.len() && left[i].is_none() {
                    left[i] = Some(t - epoch);
                }
            }
            out.read_buf().extend_from_slice(&bytes);
            while let Some(b) = out.next_batch().unwrap() {
                batches.push(b);
            }
        };
        let mut at = 0;
        while at < stream.len() {
            let next = now + Duration::from_micros(rng.below(15_000));
            // Ticks before the next read.
            while let Some(d) = co.deadline().filter(|d| *d <= next) {
                assert!(d >= now, "a deadline in the past was missed");
                let b = co.take(d);
                assert!(!b.is_empty(), "a deadline with nothing to release");
                release(b, d, &mut released, &mut out);
                now = d;
            }
            now = next;
            let n = (1 + rng.below(700) as usize).min(stream.len() - at);
            co.read_buf().extend_from_slice(&stream[at..at + n]);
            at += n;
            for (i, &e) in ends.iter().enumerate() {
                if e <= at && arrived[i].is_none() {
                    arrived[i] = Some(now - epoch);
                }
            }
            co.arrived(now);
            let b = co.take(now);
            release(b, now, &mut released, &mut out);
        }
        if let Some(d) = co.deadline() {
            release(co.take(d), d, &mut released, &mut out);
        }
        assert!(!co.is_holding());
        let times = arrived
            .into_iter()
            .zip(left)
            .map(|(a, l)| (a.unwrap(), l.expect("every message released")))
            .collect();
        Run {
            times,
            released,
            batches,
            mode,
        }
    }

    /// What [`run`] saw: per message (arrival, release) on the virtual clock,
    /// the bytes in release order, the Outbound's batches and its mode.
    struct Run {
        times: Vec<(Duration, Duration)>,
        released: Vec<u8>,
        batches: Vec<Batch>,
        mode: StreamMode,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Switch to controller (packet-ins, echo, barriers, errors, multipart
        /// sequences, port status, …): urgent messages leave the instant they
        /// arrive, nothing waits longer than the window, the byte stream is
        /// unchanged, and after the lossy network every ordering rule holds.
        #[test]
        fn urgent_never_waits_others_within_the_window(seed in any::<u64>(), n in 3usize..150, loss in 0u64..10) {
            let sent = switch_to_controller(seed, n);
            let msgs: Vec<Vec<u8>> = sent.iter().map(|(m, _)| m.clone()).collect();
            let mut rng = Rng(seed ^ 0x5eed | 1);
            let Run { times, released, batches, mode } = run(Framing::OpenFlow, Direction::ToController, &msgs, &mut rng);
            prop_assert_eq!(&released, &msgs.concat());
            for (m, (arrived, left)) in msgs.iter().zip(&times) {
                prop_assert!(left >= arrived);
                if urgent_by_type(m) {
                    prop_assert_eq!(left, arrived, "urgent type {} waited", m[1]);
                } else {
                    prop_assert!(*left - *arrived <= WINDOW, "type {} waited {:?}", m[1], *left - *arrived);
                }
            }
            let mut inbound = Inbound::new(Framing::OpenFlow, MAX, mode, Direction::ToController);
            let got = split_messages(Framing::OpenFlow, &deliver(&mut inbound, &batches, &mut rng, loss));
            check(&sent, &got);
        }

        /// OVSDB: echo requests and replies never wait; transactions may, within
        /// the window.
        #[test]
        fn ovsdb_echo_and_replies_never_wait(seed in any::<u64>(), n in 1usize..80) {
            let mut rng = Rng(seed | 1);
            let msgs: Vec<(Vec<u8>, bool)> = (0..n)
                .map(|i| match rng.below(4) {
                    0 => (format!(r#"{{"id":"e{i}","method":"echo","params":[]}}"#).into_bytes(), true),
                    1 => (format!(r#"{{"id":{i},"result":[{{"rows":[]}}],"error":null}}"#).into_bytes(), true),
                    2 => (format!(r#"{{"id":null,"method":"update","params":[null,{{"x":"{}"}}]}}"#, "y".repeat(rng.below(2000) as usize)).into_bytes(), false),
                    _ => (json_message(i, rng.below(2000) as usize), false),
                })
                .collect();
            let bytes: Vec<Vec<u8>> = msgs.iter().map(|(m, _)| m.clone()).collect();
            let Run { times, released, .. } = run(Framing::JsonRpc, Direction::ToController, &bytes, &mut rng);
            prop_assert_eq!(released, bytes.concat());
            for ((_, urgent), (arrived, left)) in msgs.iter().zip(&times) {
                if *urgent {
                    prop_assert_eq!(left, arrived);
                } else {
                    prop_assert!(*left - *arrived <= WINDOW);
                }
            }
        }
    }

    /// The controller agent's side through the same lossy network with
    /// coalescing: FIFO but for echo.
    #[test]
    fn controller_to_switch_stays_fifo_with_coalescing() {
        for seed in 0..300u64 {
            let sent = controller_to_switch(seed, 120, false);
            let msgs: Vec<Vec<u8>> = sent.iter().map(|(m, _)| m.clone()).collect();
            let mut rng = Rng(seed ^ 0x77 | 1);
            let Run {
                times,
                released,
                batches,
                mode,
            } = run(Framing::OpenFlow, Direction::ToSwitch, &msgs, &mut rng);
            assert_eq!(released, msgs.concat());
            for (m, (arrived, left)) in msgs.iter().zip(&times) {
                if urgent_by_type(m) {
                    assert_eq!(left, arrived, "urgent type {} waited", m[1]);
                }
            }
            let mut inbound = Inbound::new(Framing::OpenFlow, MAX, mode, Direction::ToSwitch);
            let got = split_messages(
                Framing::OpenFlow,
                &deliver(&mut inbound, &batches, &mut rng, 5),
            );
            check(&sent, &got);
        }
    }

    #[test]
    fn everything_on_the_priority_lane_is_urgent() {
        for rule in RULES.iter().filter(|r| r.how == How::Priority) {
            for kind in rule.kinds {
                let code = (0..=255u8)
                    .find(|&c| openflow::Kind::of(OFP13_VERSION, c) == *kind)
                    .unwrap();
                assert!(
                    coalesce::openflow_is_urgent(&of13::plain(code, 1, 1), false),
                    "{kind:?}"
                );
            }
        }
        assert!(coalesce::jsonrpc_is_urgent(
            br#"{"id":"x","method":"echo","params":[]}"#
        ));
        assert!(coalesce::jsonrpc_is_urgent(
            br#"{"id":"x","result":[],"error":null}"#
        ));
        assert!(!coalesce::jsonrpc_is_urgent(
            br#"{"id":3,"method":"transact","params":["Open_vSwitch"]}"#
        ));
        // A big reply is found without parsing it; a big request is not one.
        let big = format!(
            r#"{{"id":7,"result":{{"k":"{}"}},"error":null}}"#,
            "}".repeat(3000)
        );
        assert!(coalesce::jsonrpc_is_urgent(big.as_bytes()));
        let big = format!(
            r#"{{"id":8,"method":"transact","params":["{}\"result\":1"]}}"#,
            "x".repeat(3000)
        );
        assert!(!coalesce::jsonrpc_is_urgent(big.as_bytes()));
    }

    #[test]
    fn an_urgent_message_takes_what_waits_before_it() {
        use of13::*;
        let epoch = Instant::now();
        let mut co = Coalescer::new(Framing::OpenFlow, MAX, config(epoch));
        let ms = Duration::from_millis(1);
        let t = |n: u32| epoch + ms * n;
        // The first read is isolated: it leaves at once.
        co.read_buf().extend_from_slice(&plain(FLOW_MOD, 1, 1));
        co.arrived(t(1));
        assert_eq!(co.take(t(1)).len(), 12);
        // Dense bulk waits for the tick (t = 10 ms).
        co.read_buf().extend_from_slice(&plain(FLOW_MOD, 2, 2));
        co.read_buf().extend_from_slice(&plain(PORT_MOD, 3, 3));
        co.arrived(t(2));
        assert!(co.take(t(2)).is_empty());
        assert_eq!(co.deadline(), Some(t(10)));
        // A barrier takes both along, in order; the flow mod behind it waits.
        let mut burst = plain(BARRIER_REQUEST, 4, 4);
        burst.extend_from_slice(&plain(FLOW_MOD, 5, 5));
        co.read_buf().extend_from_slice(&burst);
        co.arrived(t(3));
        let out = co.take(t(3));
        assert_eq!(
            out[..],
            [
                plain(FLOW_MOD, 2, 2),
                plain(PORT_MOD, 3, 3),
                plain(BARRIER_REQUEST, 4, 4)
            ]
            .concat()[..]
        );
        use coalesce::{Flush, FlushReason};
        let flushes = |co: &mut Coalescer| co.take_flushes().collect::<Vec<_>>();
        assert_eq!(
            flushes(&mut co),
            [Flush {
                reason: FlushReason::Urgent,
                held_for: ms,
                messages: 2
            }]
        );
        assert_eq!(co.deadline(), Some(t(10)));
        assert!(co.take(t(9)).is_empty());
        assert_eq!(co.take(t(10))[..], plain(FLOW_MOD, 5, 5)[..]);
        assert_eq!(co.stats().held, 3);
        assert_eq!(
            flushes(&mut co),
            [Flush {
                reason: FlushReason::Tick,
                held_for: ms * 7,
                messages: 1
            }]
        );
        // A FLOW_MOD answering a packet-in does not wait; long after, one does.
        co.packet_in_delivered(t(11));
        co.read_buf().extend_from_slice(&plain(FLOW_MOD, 6, 6));
        co.arrived(t(12));
        assert_eq!(co.take(t(12)).len(), 12);
        co.read_buf().extend_from_slice(&plain(FLOW_MOD, 7, 7));
        co.arrived(t(13));
        assert_eq!(co.take(t(13)).len(), 12, "answer window still open");
        co.read_buf().extend_from_slice(&plain(FLOW_MOD, 8, 8));
        co.arrived(t(118));
        co.read_buf().extend_from_slice(&plain(FLOW_MOD, 9, 9));
        co.arrived(t(119));
        assert_eq!(co.take(t(119)).len(), 12, "only the isolated one left");
        assert!(co.is_holding());
        // 4 KiB held leave at once; the rest of a partial message stays.
        let mut bulk: Vec<u8> = (0..400).flat_map(|i| plain(FLOW_MOD, 100 + i, i)).collect();
        bulk.extend_from_slice(&plain(FLOW_MOD, 1, 1)[..5]);
        co.read_buf().extend_from_slice(&bulk);
        co.arrived(t(120));
        assert_eq!(co.take(t(120)).len(), 12 + 400 * 12);
        assert!(!co.is_holding());
        // The isolated and the answering FLOW_MODs never waited: only the
        // byte limit's release is reported.
        assert_eq!(
            flushes(&mut co),
            [Flush {
                reason: FlushReason::Bytes,
                held_for: ms,
                messages: 401
            }]
        );
        assert_eq!(co.flush().len(), 5);
    }

    /// Drives `co` with one FLOW_MOD per read at `times` (µs after `epoch`),
    /// waking at every deadline as the agent does; returns how long each
    /// message waited (µs) and the releases' reasons.
    fn drive(
        co: &mut Coalescer,
        epoch: Instant,
        times: &[u64],
    ) -> (Vec<u64>, Vec<coalesce::FlushReason>) {
        let us = |n: u64| epoch + Duration::from_micros(n);
        let mut waits = Vec::new();
        let mut pending: std::collections::VecDeque<u64> = Default::default();
        let mut reasons = Vec::new();
        let mut release =
            |co: &mut Coalescer, now: u64, pending: &mut std::collections::VecDeque<u64>| {
                let n = co.take(us(now)).len() / 12;
                for _ in 0..n {
                    waits.push(now - pending.pop_front().expect("released what arrived"));
                }
                reasons.extend(co.take_flushes().map(|f| f.reason));
            };
        // The agent's timer fires at the deadline or just after (whole µs).
        let fire = |d: Instant| d.duration_since(epoch).as_nanos().div_ceil(1000) as u64;
        for (i, &t) in times.iter().enumerate() {
            // Every deadline before this read, as the agent's timer.
            while let Some(d) = co.deadline().filter(|&d| d < us(t)) {
                release(co, fire(d), &mut pending);
            }
            co.read_buf()
                .extend_from_slice(&of13::plain(of13::FLOW_MOD, i as u32, 0));
            co.arrived(us(t));
            pending.push_back(t);
            release(co, t, &mut pending);
        }
        while let Some(d) = co.deadline() {
            release(co, fire(d), &mut pending);
        }
        assert!(pending.is_empty());
        (waits, reasons)
    }

    #[test]
    fn a_bursts_tail_leaves_when_the_reads_go_quiet_not_at_the_tick() {
        use coalesce::{FlushReason, QUIET_MIN};
        let epoch = Instant::now();
        let mut co = Coalescer::new(Framing::OpenFlow, MAX, config(epoch));
        // Bursts of 10 reads 20 µs apart, 100 ms between bursts.
        let times: Vec<u64> = (0..30u64)
            .flat_map(|b| (0..10u64).map(move |i| 1_000 + b * 100_000 + i * 20))
            .collect();
        let (waits, reasons) = drive(&mut co, epoch, &times);
        assert!(
            co.quiet_after().unwrap() == QUIET_MIN,
            "{:?}",
            co.quiet_after()
        );
        // After the first burst (no gap known yet: the tick), the tail of
        // each leaves QUIET_MIN after its last read at the latest.
        let worst = waits[10..].iter().max().unwrap();
        assert!(
            *worst <= QUIET_MIN.as_micros() as u64 + 9 * 20,
            "worst wait {worst} µs"
        );
        assert!(
            reasons[1..].iter().all(|r| *r == FlushReason::Quiet),
            "{reasons:?}"
        );
        // Never longer than a window, whatever the gaps.
        assert!(waits.iter().all(|&w| w <= WINDOW.as_micros() as u64));
    }

    #[test]
    fn a_steady_stream_keeps_waiting_for_the_tick() {
        use coalesce::FlushReason;
        let epoch = Instant::now();
        let mut co = Coalescer::new(Framing::OpenFlow, MAX, config(epoch));
        // Poisson arrivals, 500 reads/s (a mean gap of 2 ms), from a seeded
        // generator: exponential gaps by inversion.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut t = 1_000.0;
        let times: Vec<u64> = (0..5_000)
            .map(|_| {
                let u = (rng.below(1 << 30) as f64 + 0.5) / (1u64 << 30) as f64;
                t += -2_000.0 * u.ln();
                t as u64
            })
            .collect();
        let (waits, reasons) = drive(&mut co, epoch, &times);
        let quiet = reasons.iter().filter(|r| **r == FlushReason::Quiet).count();
        let ticks = reasons.iter().filter(|r| **r == FlushReason::Tick).count();
        // About one gap in 90 exceeds the quiet threshold (module docs); a
        // release by the tick carries ~5 messages, one by quiet ~2.
        assert!(
            quiet * 100 < 5 * reasons.len(),
            "{quiet} quiet releases of {} ({ticks} by the tick)",
            reasons.len()
        );
        let batched = waits.len() as f64 / reasons.len() as f64;
        assert!(batched > 3.0, "{batched:.1} messages per release");
    }

    #[test]
    fn malformed_input_passes_through_for_the_outbound_to_report() {
        let epoch = Instant::now();
        let mut co = Coalescer::new(Framing::OpenFlow, MAX, config(epoch));
        co.read_buf()
            .extend_from_slice(&of13::plain(of13::FLOW_MOD, 1, 1));
        co.arrived(epoch);
        co.take(epoch);
        co.read_buf()
            .extend_from_slice(&of13::plain(of13::FLOW_MOD, 2, 2));
        co.read_buf().extend_from_slice(&[4, 0, 0, 3, 0, 0, 0, 0]);
        co.arrived(epoch + Duration::from_millis(1));
        assert_eq!(co.take(epoch + Duration::from_millis(1)).len(), 20);
        assert_eq!(co.deadline(), None);
    }
}
