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

use common::{Link, Peer};
use quicsdn_transport::quic::QuicOptions;
use quinn_proto::StreamId;
use std::time::Duration;

const ONE_WAY: Duration = Duration::from_millis(5);
const WRITE_EVERY: Duration = Duration::from_millis(100);
const RUN_FOR: Duration = Duration::from_secs(3);

/// Runs the pair for [`RUN_FOR`], dropping the datagram with the `nth`
/// ACK_FREQUENCY frame of the server (controller agent) or the client, and
/// checks that the frame was sent again and that every frame but the lost one
/// arrived.
fn lose_one_ack_frequency_frame(from_server: bool, nth: u64) {
    let mut link = Link::new(&QuicOptions::default(), ONE_WAY);
    // ACK_FREQUENCY frames each side had sent before its last datagram.
    let mut counted = [0u64; 2];
    let mut dropped = false;
    let mut lose = |_, by_server: bool, sender: &mut Peer, _: &[u8]| {
        let after = sender.conn().stats().frame_tx.ack_frequency;
        let before = std::mem::replace(&mut counted[usize::from(by_server)], after);
        let hit = by_server == from_server && !dropped && before < nth && nth <= after;
        dropped |= hit;
        hit
    };
    link.connect(&mut lose);
    let end = link.now + RUN_FOR;
    let mut streams: (Option<StreamId>, Option<StreamId>) = (None, None);
    while link.now < end {
        link.client.write(&mut streams.0, 200);
        link.server.write(&mut streams.1, 200);
        let next = (link.now + WRITE_EVERY).min(end);
        link.run_until(next, &mut lose);
    }
    assert!(
        dropped,
        "no ACK_FREQUENCY frame number {nth} was sent to drop"
    );
    let (sender, receiver) = if from_server {
        (&mut link.server, &mut link.client)
    } else {
        (&mut link.client, &mut link.server)
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
