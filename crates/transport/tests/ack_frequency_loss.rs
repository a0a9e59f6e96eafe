//! quinn-proto is patched to send a lost ACK_FREQUENCY frame again
//! (third_party/quinn-proto/QUICSDN-PATCH.md). The agents ask each other for
//! their ACK delay with that frame (draft-ietf-quic-ack-frequency §4; the
//! controller agent's first request is made before any RTT sample and
//! corrected a moment later). Unpatched, a lost request that still said what
//! the sender wanted was never sent again (it is "in flight" for good), so
//! the peer kept the previous one, up to 200 ms of ACK delay on a LAN, for
//! the rest of the connection. The draft (ACK_FREQUENCY frame section):
//! "When an ACK_FREQUENCY frame is lost, the sender is encouraged to send
//! another ACK_FREQUENCY frame, unless an ACK_FREQUENCY frame with a larger
//! Sequence Number value has already been sent."
//!
//! Here two endpoints with the agents' configuration talk over a 10 ms RTT
//! on a virtual clock, each writing a little every 100 ms (the control
//! channel's sparse traffic), and the test drops one datagram carrying an
//! ACK_FREQUENCY frame: the frame must be sent again and arrive.

mod common;

use common::Peer;
use quicsdn_transport::quic::QuicOptions;
use quinn_proto::{Dir, StreamId};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const ONE_WAY: Duration = Duration::from_millis(5);
const WRITE_EVERY: Duration = Duration::from_millis(100);
const RUN_FOR: Duration = Duration::from_secs(3);

struct InFlight {
    at: Instant,
    to_server: bool,
    datagram: Vec<u8>,
}

/// Sends each of `peer`'s datagrams, but drops the one that carries its
/// `drop_nth` ACK_FREQUENCY frame (counting from 1) if `drop_nth` is set;
/// returns whether it dropped one.
fn send(
    peer: &mut Peer,
    now: Instant,
    to_server: bool,
    drop_nth: Option<u64>,
    wire: &mut VecDeque<InFlight>,
) -> bool {
    let mut dropped = false;
    loop {
        let before = peer.conn().stats().frame_tx.ack_frequency;
        let Some(datagram) = peer.transmit(now) else {
            break;
        };
        let after = peer.conn().stats().frame_tx.ack_frequency;
        if drop_nth.is_some_and(|n| before < n && n <= after) {
            dropped = true;
            continue;
        }
        wire.push_back(InFlight {
            at: now + ONE_WAY,
            to_server,
            datagram,
        });
    }
    peer.events();
    dropped
}

/// Runs the pair for [`RUN_FOR`], dropping the datagram with the `nth`
/// ACK_FREQUENCY frame of the server (controller agent) or the client, and
/// checks that the frame was sent again and that every frame but the lost one
/// arrived.
fn lose_one_ack_frequency_frame(from_server: bool, nth: u64) {
    let start = Instant::now();
    let (mut client, mut server) = common::agents(&QuicOptions::default(), start);
    let mut wire = VecDeque::new();
    let mut now = start;
    let mut dropped = false;
    let mut next_write = start;
    let mut streams: (Option<StreamId>, Option<StreamId>) = (None, None);
    while now < start + RUN_FOR {
        // Deliver what has arrived (a fixed delay keeps the queue in order).
        while wire.front().is_some_and(|d: &InFlight| d.at <= now) {
            let d = wire.pop_front().unwrap();
            if d.to_server {
                server.receive(now, client.addr, &d.datagram);
            } else {
                client.receive(now, server.addr, &d.datagram);
            }
        }
        client.timers(now);
        server.timers(now);
        if client.connected && server.connected && now >= next_write {
            for (peer, stream) in [(&mut client, &mut streams.0), (&mut server, &mut streams.1)] {
                let conn = peer.conn();
                let id = *stream.get_or_insert_with(|| conn.streams().open(Dir::Uni).unwrap());
                conn.send_stream(id).write(&[0x5a; 200]).unwrap();
            }
            next_write = now + WRITE_EVERY;
        }
        let drop_client = (!from_server && !dropped).then_some(nth);
        let drop_server = (from_server && !dropped).then_some(nth);
        dropped |= send(&mut client, now, true, drop_client, &mut wire);
        if server.conn.is_some() {
            dropped |= send(&mut server, now, false, drop_server, &mut wire);
        }
        for peer in [&mut client, &mut server] {
            if let Some(conn) = peer.conn.as_mut() {
                assert!(!conn.is_closed(), "a connection closed: {:?}", conn.poll());
            }
        }
        let mut next = [
            wire.front().map(|d| d.at),
            client.next_timer(),
            server.next_timer(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(start + RUN_FOR);
        if client.connected && server.connected {
            next = next.min(next_write);
        }
        now = next.max(now + Duration::from_micros(1));
    }
    assert!(client.connected && server.connected, "no handshake");
    assert!(
        dropped,
        "no ACK_FREQUENCY frame number {nth} was sent to drop"
    );
    let (sender, receiver) = if from_server {
        (&mut server, &mut client)
    } else {
        (&mut client, &mut server)
    };
    let sent = sender.conn().stats().frame_tx.ack_frequency;
    let received = receiver.conn().stats().frame_rx.ack_frequency;
    assert!(
        sent > nth,
        "the lost ACK_FREQUENCY frame was not sent again ({sent} sent)"
    );
    assert_eq!(received, sent - 1, "every frame but the lost one arrives");
}

#[test]
fn the_controller_agents_lost_correction_is_sent_again() {
    // The controller agent's first request is computed at quinn's initial
    // RTT estimate (333 ms, capped to 200 ms by `--ack-delay auto`), the
    // second from the first RTT sample (25 ms): lose the second.
    lose_one_ack_frequency_frame(true, 2);
}

#[test]
fn the_switch_agents_lost_request_is_sent_again() {
    // The switch agent has an RTT sample before its first 1-RTT packet, so
    // its first request is already the one it wants: lose it.
    lose_one_ack_frequency_frame(false, 1);
}
