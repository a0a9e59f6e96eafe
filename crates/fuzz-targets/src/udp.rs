//! The UDP transport (`--transport udp`): its datagram decoder, one
//! association fed whatever anyone can send it, and two associations whose
//! robust channels must deliver every message's bytes once and in order over
//! any network, or fail visibly.

use arbitrary::{Arbitrary, Unstructured};
use quicsdn_udp::packet::{self, Packet};
use quicsdn_udp::{Association, Config, Event, MessageKind, Profile};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// `fuzz/fuzz_targets/udp_packet.rs`: whatever decodes re-encodes to a
/// datagram that decodes the same, and the demultiplexer's peek agrees.
pub fn udp_packet(data: &[u8]) {
    let decoded = packet::decode(data);
    let peeked = packet::peek(data);
    match &decoded {
        Ok((id, p)) => {
            let again = packet::encode(*id, p);
            assert_eq!(packet::decode(&again).as_ref(), Ok(&(*id, p.clone())));
            assert_eq!(peeked, Ok((*id, matches!(p, Packet::Hello { .. }))));
        }
        Err(_) => {
            if let Ok((id, _)) = peeked {
                assert_eq!(id, u32::from_be_bytes(data[2..6].try_into().unwrap()));
            }
        }
    }
}

/// Sequence numbers the fuzzer picks: mostly small (where the windows are),
/// sometimes anywhere in u32.
fn seq(s: u32) -> u32 {
    if s & 0x8000_0000 != 0 { s } else { s % 64 }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Raw(Vec<u8>),
    Data {
        channel: u8,
        seq: u32,
        first: bool,
        last: bool,
        kind: u8,
        payload: Vec<u8>,
    },
    Ack {
        channel: u8,
        cumulative: u32,
        window: u16,
        ranges: Vec<(u32, u32)>,
    },
    Ping(bool),
    Hello(bool),
    HelloAck(bool),
    Close(u16),
    Advance(u16),
    Send {
        channel: u8,
        len: u16,
    },
    End(u8),
}

#[derive(Arbitrary, Debug)]
struct Hostile {
    seed: bool,
    server: bool,
    /// The fuzzer's datagrams carry the association's id (else anything).
    ops: Vec<Op>,
}

const ID: u32 = 0x5157_0017;

fn kind(k: u8) -> MessageKind {
    [MessageKind::Data, MessageKind::Fin, MessageKind::Abort][usize::from(k % 3)]
}

fn profile(seed: bool) -> Profile {
    if seed { Profile::Seed } else { Profile::Robust }
}

/// Sends everything due, checking each datagram is one its own decoder takes.
fn transmit(a: &mut Association, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(d) = a.poll_transmit(now) {
        let decoded = packet::decode(&d);
        assert!(
            decoded.is_ok(),
            "sent a datagram its peer cannot decode: {decoded:?}"
        );
        out.push(d);
        assert!(out.len() < 100_000, "poll_transmit never stops");
    }
    out
}

/// Chunks the application takes from `a`, per channel; robust channels
/// deliver in sequence order.
fn receive(a: &mut Association, robust: bool, last_seq: &mut BTreeMap<u16, u32>) {
    for ch in a.readable() {
        while let Some(c) = a.recv(ch) {
            if robust {
                let last = last_seq.entry(ch).or_insert(0);
                assert!(c.seq > *last, "channel {ch}: seq {} after {}", c.seq, *last);
                *last = c.seq;
            }
        }
    }
}

/// `fuzz/fuzz_targets/udp_association.rs`.
pub fn udp_association(data: &[u8]) {
    let Ok(input) = Hostile::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let start = Instant::now();
    let mut now = start;
    let config = Config::new(profile(input.seed));
    let mut a = if input.server {
        let mut a = Association::server(ID, config.clone(), b"ctl".to_vec(), now);
        let hello = packet::encode(
            ID,
            &Packet::Hello {
                profile: profile(input.seed),
                hello: b"sw",
            },
        );
        a.handle_datagram(now, &hello).expect("a valid hello");
        a
    } else {
        Association::client(ID, config.clone(), b"sw".to_vec(), now)
    };
    let mut last_seq = BTreeMap::new();
    for op in input.ops.into_iter().take(256) {
        let datagram = match op {
            Op::Raw(bytes) => Some(bytes),
            Op::Data {
                channel,
                seq: s,
                first,
                last,
                kind: k,
                payload,
            } => Some(packet::encode(
                ID,
                &Packet::Data {
                    channel: u16::from(channel % 8),
                    seq: seq(s),
                    first,
                    last,
                    kind: kind(k),
                    payload: &payload,
                },
            )),
            Op::Ack {
                channel,
                cumulative,
                window,
                ranges,
            } => {
                let ranges: Vec<(u32, u32)> = ranges
                    .into_iter()
                    .map(|(s, e)| (seq(s), seq(e)))
                    .filter(|(s, e)| s < e)
                    .take(packet::MAX_RANGES)
                    .collect();
                Some(packet::encode(
                    ID,
                    &Packet::Ack {
                        channel: u16::from(channel % 8),
                        cumulative: seq(cumulative),
                        window,
                        ranges,
                    },
                ))
            }
            Op::Ping(reply) => Some(packet::encode(ID, &Packet::Ping { reply })),
            Op::Hello(seed) => Some(packet::encode(
                ID,
                &Packet::Hello {
                    profile: profile(seed),
                    hello: b"sw",
                },
            )),
            Op::HelloAck(seed) => Some(packet::encode(
                ID,
                &Packet::HelloAck {
                    profile: profile(seed),
                    hello: b"ctl",
                },
            )),
            Op::Close(code) => Some(packet::encode(
                ID,
                &Packet::Close {
                    code,
                    reason: "fuzz".into(),
                },
            )),
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms));
                a.handle_timeout(now);
                None
            }
            Op::Send { channel, len } => {
                let _ = a.send(
                    u16::from(channel % 8),
                    MessageKind::Data,
                    vec![0x5a; usize::from(len % 4096)],
                );
                None
            }
            Op::End(channel) => {
                a.end_channel(u16::from(channel % 8));
                None
            }
        };
        if let Some(d) = datagram {
            let _ = a.handle_datagram(now, &d);
        }
        transmit(&mut a, now);
        receive(&mut a, !input.seed, &mut last_seq);
        if let Some(t) = a.poll_timeout() {
            assert!(t >= start, "a deadline before the association began");
        }
        while a.poll_event().is_some() {}
    }
}

#[derive(Arbitrary, Debug)]
enum NetOp {
    /// Delivers the `pick`-th datagram in flight towards the server (or client).
    Deliver {
        to_server: bool,
        pick: u8,
    },
    Drop {
        to_server: bool,
        pick: u8,
    },
    Duplicate {
        to_server: bool,
        pick: u8,
    },
    Advance(u8),
    /// The switch agent sends a message of this many bytes on this channel.
    Send {
        channel: u8,
        len: u16,
    },
}

#[derive(Arbitrary, Debug)]
struct Network {
    seed: bool,
    ops: Vec<NetOp>,
}

struct Side {
    assoc: Option<Association>,
    /// Datagrams in flight towards this side.
    incoming: Vec<Vec<u8>>,
    closed: bool,
    /// Per channel: whole messages received, and the one being reassembled
    /// (seed: one message per chunk).
    messages: BTreeMap<u16, Vec<Vec<u8>>>,
    partial: BTreeMap<u16, Vec<u8>>,
    /// Per channel: every byte received, in order (robust: queued messages
    /// share packets, so a chunk may hold several).
    bytes: BTreeMap<u16, Vec<u8>>,
}

impl Side {
    fn new(assoc: Option<Association>) -> Side {
        Side {
            assoc,
            incoming: Vec::new(),
            closed: false,
            messages: BTreeMap::new(),
            partial: BTreeMap::new(),
            bytes: BTreeMap::new(),
        }
    }

    fn poll(&mut self, now: Instant, peer: &mut Vec<Vec<u8>>) {
        let Some(a) = self.assoc.as_mut() else { return };
        peer.extend(transmit(a, now));
        for ch in a.readable() {
            while let Some(c) = a.recv(ch) {
                self.bytes
                    .entry(ch)
                    .or_default()
                    .extend_from_slice(&c.payload);
                let p = self.partial.entry(ch).or_default();
                p.extend_from_slice(&c.payload);
                if c.end {
                    let m = std::mem::take(p);
                    self.messages.entry(ch).or_default().push(m);
                }
            }
        }
        while let Some(e) = a.poll_event() {
            if matches!(e, Event::Closed(_)) {
                self.closed = true;
            }
        }
    }
}

/// A message the switch agent sends: its number in every byte's pattern, so
/// a mixed-up fragment shows.
fn message(i: usize, len: u16) -> Vec<u8> {
    // Byte j of the body is (7i + j) mod 256: copied from a table in slices,
    // not made byte by byte (libFuzzer's comparison tracing would run for
    // every byte of up to 5,000, and did, at half the target's time).
    const PATTERN: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut k = 0;
        while k < 256 {
            t[k] = k as u8;
            k += 1;
        }
        t
    };
    let len = usize::from(len % 5000);
    let mut m = Vec::with_capacity(4 + len);
    m.extend_from_slice(&(i as u32).to_be_bytes());
    let mut at = (i * 7) % 256;
    while m.len() < 4 + len {
        let n = (256 - at).min(4 + len - m.len());
        m.extend_from_slice(&PATTERN[at..at + n]);
        at = 0;
    }
    m
}

/// `fuzz/fuzz_targets/udp_reassembly.rs`.
pub fn udp_reassembly(data: &[u8]) {
    let Ok(input) = Network::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let robust = !input.seed;
    let config = Config::new(profile(input.seed));
    let start = Instant::now();
    let mut now = start;
    let mut client = Side::new(Some(Association::client(
        ID,
        config.clone(),
        b"sw".to_vec(),
        now,
    )));
    let mut server = Side::new(None);
    let mut sent: BTreeMap<u16, Vec<Vec<u8>>> = BTreeMap::new();
    let mut count = 0;

    let deliver = |side: &mut Side, d: &[u8], now: Instant, config: &Config| {
        if side.assoc.is_none() {
            // The controller agent creates an association on a HELLO.
            if let Ok((id, true)) = packet::peek(d) {
                side.assoc = Some(Association::server(
                    id,
                    config.clone(),
                    b"ctl".to_vec(),
                    now,
                ));
            } else {
                return;
            }
        }
        let a = side.assoc.as_mut().expect("set above");
        a.handle_datagram(now, d)
            .expect("the peer's datagrams decode");
    };

    let step = |client: &mut Side, server: &mut Side, now: Instant| {
        client.poll(now, &mut server.incoming);
        server.poll(now, &mut client.incoming);
    };

    for op in input.ops.into_iter().take(512) {
        step(&mut client, &mut server, now);
        match op {
            NetOp::Deliver { to_server, pick } | NetOp::Duplicate { to_server, pick } => {
                let dup = matches!(op, NetOp::Duplicate { .. });
                let side = if to_server { &mut server } else { &mut client };
                if side.incoming.is_empty() {
                    continue;
                }
                let i = usize::from(pick) % side.incoming.len();
                let d = if dup {
                    side.incoming[i].clone()
                } else {
                    side.incoming.remove(i)
                };
                deliver(side, &d, now, &config);
            }
            NetOp::Drop { to_server, pick } => {
                let side = if to_server { &mut server } else { &mut client };
                if !side.incoming.is_empty() {
                    let i = usize::from(pick) % side.incoming.len();
                    side.incoming.remove(i);
                }
            }
            NetOp::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms) * 4);
                for a in [&mut client.assoc, &mut server.assoc].into_iter().flatten() {
                    a.handle_timeout(now);
                }
            }
            NetOp::Send { channel, len } => {
                let ch = 1 + u16::from(channel % 3);
                let m = message(count, len);
                count += 1;
                let a = client.assoc.as_mut().expect("the client exists");
                if a.send(ch, MessageKind::Data, m.clone()).is_ok() {
                    sent.entry(ch).or_default().push(m);
                }
            }
        }
    }
    // Then a perfect network until everything arrived or something closed,
    // within a bounded virtual time.
    let deadline = now + Duration::from_secs(60);
    while now < deadline && !client.closed && !server.closed {
        step(&mut client, &mut server, now);
        let in_flight = !client.incoming.is_empty() || !server.incoming.is_empty();
        let done = sent.iter().all(|(ch, m)| {
            if robust {
                let want: usize = m.iter().map(Vec::len).sum();
                server.bytes.get(ch).map_or(0, Vec::len) == want
            } else {
                server.messages.get(ch).map_or(0, Vec::len) == m.len()
            }
        });
        if done && !in_flight {
            break;
        }
        for d in std::mem::take(&mut server.incoming) {
            deliver(&mut server, &d, now, &config);
        }
        for d in std::mem::take(&mut client.incoming) {
            deliver(&mut client, &d, now, &config);
        }
        // 5 ms per round trip while datagrams fly; with none in flight, on to
        // the next timer (a retransmission, a keepalive, the idle timeout),
        // rather than thousands of empty 5 ms steps after `seed` gave up.
        let step_to = now + Duration::from_millis(5);
        now = if in_flight {
            step_to
        } else {
            match [&client.assoc, &server.assoc]
                .into_iter()
                .flatten()
                .filter_map(Association::poll_timeout)
                .min()
            {
                // (Not clamp: 5 ms on may already be past the deadline.)
                Some(t) => t.max(step_to).min(deadline),
                // No timer and nothing in flight: nothing more can happen.
                None => break,
            }
        };
        for a in [&mut client.assoc, &mut server.assoc].into_iter().flatten() {
            a.handle_timeout(now);
        }
    }
    step(&mut client, &mut server, now);
    if robust {
        // Robust: exactly the bytes sent, in order (a prefix, if it closed).
        for (ch, got) in &server.bytes {
            let want: Vec<u8> = sent
                .get(ch)
                .into_iter()
                .flatten()
                .flatten()
                .copied()
                .collect();
            assert!(
                got.len() <= want.len(),
                "channel {ch}: more bytes than sent"
            );
            assert!(
                want[..got.len()] == got[..],
                "channel {ch}: lost, duplicated or reordered"
            );
        }
        if !client.closed && !server.closed {
            for (ch, m) in &sent {
                let want: usize = m.iter().map(Vec::len).sum();
                let got = server.bytes.get(ch).map_or(0, Vec::len);
                assert_eq!(got, want, "channel {ch}: bytes silently lost");
            }
        }
    } else {
        // Seed may lose and reorder, but neither invents nor duplicates.
        for (ch, got) in &server.messages {
            let want = sent.get(ch).map_or(&[][..], Vec::as_slice);
            let sent: std::collections::BTreeSet<&Vec<u8>> = want.iter().collect();
            let mut seen = std::collections::BTreeSet::new();
            for m in got {
                assert!(sent.contains(m), "channel {ch}: a message nobody sent");
                assert!(seen.insert(m.clone()), "channel {ch}: a duplicate");
            }
        }
    }
}
