//! The lanes: a session's messages spread over QUIC streams and merged back.
//!
//! `lanes_roundtrip` is structure-aware: it builds a valid message stream,
//! sends it through [`Outbound`] in arbitrary reads, delivers each lane's bytes
//! to [`Inbound`] in arbitrary chunks and interleavings (QUIC keeps each stream
//! in order, nothing more), and checks what `docs/streams.md` promises: every
//! message exactly once and unchanged; `ordered` byte for byte; per lane in
//! order; in `safe` mode, nothing but echo crosses a fence either way.
//!
//! `lanes_inbound` is what a hostile peer agent can do: arbitrary bytes on
//! arbitrary lanes of a session in any stream mode its preamble may name.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use quicsdn_lanes::rules::{self, Direction, Placement};
use quicsdn_lanes::{EarlyGate, Inbound, Outbound, PRIORITY_LANE, StreamMode, early, marker};
use quicsdn_wire::openflow::{self, Header, Kind};
use quicsdn_wire::{Framer, Framing};

const MAX_MESSAGE: usize = 1 << 20;

#[derive(Arbitrary, Debug)]
enum Mode {
    Ordered,
    RoundRobin(u8),
    Safe(u8),
}

#[derive(Arbitrary, Debug)]
enum Message {
    OpenFlow {
        version: u8,
        kind: u8,
        body: Vec<u8>,
    },
    Json {
        what: u8,
        pad: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct RoundTrip {
    mode: Mode,
    json: bool,
    to_controller: bool,
    relaxed: bool,
    messages: Vec<Message>,
    /// Sizes of the local peer's writes as the agent reads them.
    reads: Vec<u8>,
    /// Towards the switch: the handshake completes after this many reads.
    handshake_after: u8,
    /// (which lane with bytes left, how many bytes) per delivery.
    deliveries: Vec<(u8, u16)>,
}

/// Splits `bytes` (whole messages of `framing`) into its messages.
fn split(framing: Framing, bytes: &[u8]) -> Vec<&[u8]> {
    let mut framer = Framer::new(framing, usize::MAX);
    let mut at = 0;
    let mut out = Vec::new();
    while let Some(n) = framer.next_message(&bytes[at..]).expect("whole messages") {
        out.push(&bytes[at..at + n]);
        at += n;
    }
    assert_eq!(at, bytes.len(), "a partial message was released");
    out
}

fn build(framing: Framing, messages: &[Message]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate().take(64) {
        let bytes = match (framing, m) {
            (
                Framing::OpenFlow,
                Message::OpenFlow {
                    version,
                    kind,
                    body,
                },
            ) => {
                // Version 0 is the markers' (the agent refuses it from local peers);
                // the xid makes every message unique.
                let body = &body[..body.len().min(512)];
                openflow::message(1 + version % 6, kind % 40, i as u32, body)
            }
            (Framing::OpenFlow, Message::Json { what, .. }) => openflow::message(
                4,
                [2, 3, 10, 12, 11, 19, 20, 21, 14][*what as usize % 9],
                i as u32,
                &[],
            ),
            (Framing::JsonRpc, m) => {
                let (what, pad) = match m {
                    Message::Json { what, pad } => (*what, *pad),
                    Message::OpenFlow { kind, body, .. } => (*kind, body.len() as u8),
                };
                let space = " ".repeat(usize::from(pad % 3));
                match what % 3 {
                    0 => format!(r#"{space}{{"id":{i},"method":"echo","params":[]}}"#),
                    1 => format!(r#"{{"id":{i},"result":[],"error":null}}{space}"#),
                    _ => format!(
                        r#"{{"id":{i},"method":"transact","params":["{}"]}}"#,
                        "x".repeat(usize::from(pad))
                    ),
                }
                .into_bytes()
            }
            (Framing::Raw, _) => unreachable!(),
        };
        out.push(bytes);
    }
    out
}

/// `fuzz/fuzz_targets/lanes_roundtrip.rs`.
pub fn lanes_roundtrip(data: &[u8]) {
    let Ok(input) = RoundTrip::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let framing = if input.json {
        Framing::JsonRpc
    } else {
        Framing::OpenFlow
    };
    let mode = match input.mode {
        Mode::Ordered => StreamMode::Ordered,
        Mode::RoundRobin(n) => StreamMode::RoundRobin {
            lanes: 1 + u16::from(n % 8),
        },
        Mode::Safe(k) => StreamMode::Safe {
            keyed: 1 + u16::from(k % 8),
        },
    };
    let direction = if input.to_controller {
        Direction::ToController
    } else {
        Direction::ToSwitch
    };
    let mut stream: Vec<u8> = build(framing, &input.messages).concat();
    if framing == Framing::JsonRpc {
        // White space after the last message is no message: nothing carries it.
        stream.truncate(stream.trim_ascii_end().len());
    }
    // The messages as the framer divides the stream (white space between JSON
    // messages belongs to the one after it).
    let messages: Vec<Vec<u8>> = split(framing, &stream)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();

    // The sending agent: local reads of arbitrary sizes, batches drained after each.
    let mut out = Outbound::new(framing, MAX_MESSAGE, mode, direction, input.relaxed);
    let lanes = out.lanes();
    let mut wire: Vec<Vec<u8>> = vec![Vec::new(); lanes];
    let mut lane_of = Vec::new();
    // Index of the first message classified after the handshake (towards the switch).
    let mut handshake_at = None;
    let mut read = 0;
    let mut reads = input.reads.iter().map(|&r| usize::from(r.max(1)));
    let mut read_count = 0;
    while read < stream.len() {
        let n = reads
            .next()
            .unwrap_or(stream.len())
            .min(stream.len() - read);
        out.read_buf().extend_from_slice(&stream[read..read + n]);
        read += n;
        read_count += 1;
        while let Some(batch) = out.next_batch().expect("valid messages frame") {
            assert!(batch.lane < lanes);
            wire[batch.lane].extend_from_slice(&batch.bytes);
            lane_of.extend(std::iter::repeat_n(batch.lane, batch.messages));
        }
        if direction == Direction::ToSwitch
            && handshake_at.is_none()
            && read_count >= usize::from(input.handshake_after)
        {
            out.handshake_complete();
            handshake_at = Some(lane_of.len());
        }
    }
    assert_eq!(out.partial_len(), 0);
    assert_eq!(
        lane_of.len(),
        messages.len(),
        "every message left on a lane"
    );

    // The receiving agent: each lane in order, lanes interleaved at will.
    let mut inbound = Inbound::new(framing, MAX_MESSAGE, mode, direction);
    assert_eq!(inbound.lanes(), lanes);
    let mut sent = vec![0usize; lanes];
    let mut delivered = Vec::new();
    let mut deliveries = input.deliveries.iter().copied();
    loop {
        let open: Vec<usize> = (0..lanes).filter(|&l| sent[l] < wire[l].len()).collect();
        if open.is_empty() {
            break;
        }
        let (pick, size) = deliveries.next().unwrap_or((0, u16::MAX));
        let lane = open[usize::from(pick) % open.len()];
        let end = (sent[lane] + usize::from(size.max(1))).min(wire[lane].len());
        let chunk = Bytes::copy_from_slice(&wire[lane][sent[lane]..end]);
        sent[lane] = end;
        for run in inbound
            .push(lane, chunk)
            .expect("the peer's own lanes are valid")
        {
            delivered.extend_from_slice(&run);
        }
    }
    for lane in 0..lanes {
        inbound.finish(lane).expect("no lane ends mid-message");
    }
    assert!(inbound.is_done(), "everything sent was released");

    if mode == StreamMode::Ordered {
        assert_eq!(delivered, stream, "ordered: byte for byte");
        return;
    }
    // Exactly once, unchanged: position of each input message in the output.
    let got = split(framing, &delivered);
    assert_eq!(got.len(), messages.len(), "as many messages out as in");
    let mut position = vec![usize::MAX; messages.len()];
    for (pos, m) in got.iter().enumerate() {
        let i = messages
            .iter()
            .position(|x| x == m)
            .expect("an output message is an input message");
        assert_eq!(position[i], usize::MAX, "message {i} delivered twice");
        position[i] = pos;
    }
    // Each lane keeps its order.
    for i in 0..messages.len() {
        for j in i + 1..messages.len() {
            if lane_of[i] == lane_of[j] {
                assert!(
                    position[i] < position[j],
                    "lane {} reordered {i} and {j}",
                    lane_of[i]
                );
            }
        }
    }
    if !matches!(mode, StreamMode::Safe { .. }) || framing != Framing::OpenFlow {
        return;
    }
    // Fences: the handshake (FEATURES_REPLY towards the controller, the agent's
    // signal towards the switch) and, after it, what the rules call fences.
    let mut fences = Vec::new();
    let mut handshake_done = false;
    for (i, m) in messages.iter().enumerate() {
        if handshake_at == Some(i) {
            handshake_done = true;
            fences.push(i as f64 - 0.5);
        }
        let kind = Header::parse(m).expect("header").kind();
        if !handshake_done {
            if direction == Direction::ToController && kind == Kind::FeaturesReply {
                handshake_done = true;
                fences.push(i as f64);
            }
            continue;
        }
        if rules::place_openflow(direction, m, input.relaxed) == Placement::Fence {
            fences.push(i as f64);
        }
    }
    // A fence sits after every message before it and before every message
    // after it, echo (the priority lane) aside.
    for i in 0..messages.len() {
        for j in i + 1..messages.len() {
            let crossed = fences.iter().any(|&f| i as f64 <= f && f <= j as f64);
            if crossed && lane_of[i] != PRIORITY_LANE && lane_of[j] != PRIORITY_LANE {
                assert!(
                    position[i] < position[j],
                    "message {i} (lane {}) and {j} (lane {}) crossed a fence ({fences:?})",
                    lane_of[i],
                    lane_of[j]
                );
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Hostile {
    code: u8,
    param: u16,
    json: bool,
    to_controller: bool,
    max: u16,
    pushes: Vec<(u8, Vec<u8>)>,
    finishes: Vec<u8>,
    early: Vec<Vec<u8>>,
}

/// `fuzz/fuzz_targets/lanes_inbound.rs`.
pub fn lanes_inbound(data: &[u8]) {
    let Ok(input) = Hostile::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let framing = if input.json {
        Framing::JsonRpc
    } else {
        Framing::OpenFlow
    };
    let max = 8 + usize::from(input.max);
    let direction = if input.to_controller {
        Direction::ToController
    } else {
        Direction::ToSwitch
    };

    // The 0-RTT gate the controller agent puts between early lanes and the controller.
    let mut gate = EarlyGate::new(framing, max);
    let mut early_in = Vec::new();
    let mut early_out = Vec::new();
    for chunk in &input.early {
        early_in.extend_from_slice(chunk);
        let passed = gate.push(chunk);
        for m in split(framing, &passed) {
            assert!(
                early::replay_safe(framing, m),
                "a message unsafe to replay passed early"
            );
        }
        early_out.extend_from_slice(&passed);
    }
    early_out.extend_from_slice(&gate.confirm());
    assert_eq!(
        early_out, early_in,
        "the gate delays, never drops or reorders"
    );

    // A session as the peer's preamble names it (as link.rs accepts it).
    let Some(mode) = StreamMode::from_wire(u64::from(input.code % 4), u64::from(input.param))
    else {
        return;
    };
    let mut inbound = Inbound::new(framing, max, mode, direction);
    let lanes = inbound.lanes();
    let markers = matches!(mode, StreamMode::Safe { .. }) && framing == Framing::OpenFlow;
    let (mut bytes_in, mut bytes_out) = (0, 0);
    for (lane, chunk) in input.pushes {
        // Now and then a lane outside the session.
        let lane = usize::from(lane) % (lanes + 1);
        bytes_in += chunk.len();
        match inbound.push(lane, Bytes::from(chunk)) {
            Ok(runs) => {
                for run in runs {
                    bytes_out += run.len();
                    for m in split(framing, &run) {
                        // (White space before a JSON message does not count.)
                        let len = match framing {
                            Framing::JsonRpc => m.trim_ascii_start().len(),
                            _ => m.len(),
                        };
                        assert!(len <= max, "a message over the limit was released");
                        if markers {
                            assert!(!marker::is_marker(m), "a marker reached the local peer");
                        }
                    }
                }
            }
            // The agent closes the session here.
            Err(_) => return,
        }
        assert!(bytes_out <= bytes_in);
    }
    for lane in input.finishes {
        let _ = inbound.finish(usize::from(lane) % (lanes + 1));
    }
    let _ = inbound.is_done();
    let _ = inbound.take_events();
}
