//! quinn-proto is patched to take no RTT sample from an ACK whose reported
//! ACK delay is more than a quarter beyond the peer's max_ack_delay
//! (third_party/quinn-proto/QUICSDN-PATCH.md). Such an ACK is not the
//! peer's promised, bounded wait (RFC 9000 §13.2.1): it repeats an ACK that
//! was lost, or acknowledges an ACK-only packet the peer was never asked to
//! acknowledge promptly, with the next thing the peer sent, which on a quiet
//! control channel may be seconds later. RFC 9002 §5.3 lets the sender
//! subtract at most max_ack_delay from the sample, so, unpatched, the rest of
//! that wait went into the RTT estimate and the probe timeout. That is how
//! sessions were lost at 30 % loss (docs/proxy.md, "Lost control sessions at
//! 30 % on one path").
//!
//! Two endpoints with the agents' configuration talk over a 10 ms RTT on a
//! virtual clock; the tests lose chosen datagrams so that the switch agent
//! (the client) acknowledges the controller agent's (the server's) packets
//! only a second late, and check the server's RTT estimate; and check that
//! ordinary ACKs still give samples, so the estimate follows a longer path.

mod common;

use common::{Link, Lose, Peer, lossless};
use quicsdn_transport::quic::QuicOptions;
use quinn_proto::StreamId;
use std::time::{Duration, Instant};

const ONE_WAY: Duration = Duration::from_millis(5);
const HELD: Duration = Duration::from_secs(1);
const WRITE_EVERY: Duration = Duration::from_millis(100);

/// The pair and the uni stream each has opened to the other.
struct Pair {
    link: Link,
    to_server: Option<StreamId>,
    to_client: Option<StreamId>,
}

impl Pair {
    /// Connected, after ten exchanges: both ends measured the 10 ms path.
    fn warmed_up() -> Pair {
        let mut link = Link::new(&QuicOptions::default(), ONE_WAY);
        link.connect(&mut lossless);
        let mut pair = Pair {
            link,
            to_server: None,
            to_client: None,
        };
        pair.exchange(10);
        let rtt = pair.link.server.conn().rtt();
        assert!(rtt < Duration::from_millis(15), "{rtt:?}");
        pair
    }

    /// Both write every [`WRITE_EVERY`], `rounds` times, losing nothing.
    fn exchange(&mut self, rounds: u32) {
        for _ in 0..rounds {
            self.client_writes();
            self.server_writes();
            let next = self.link.now + WRITE_EVERY;
            self.link.run_until(next, &mut lossless);
        }
    }

    fn client_writes(&mut self) {
        self.link.client.write(&mut self.to_server, 200);
    }

    fn server_writes(&mut self) {
        self.link.server.write(&mut self.to_client, 200);
    }

    /// Runs to `t + HELD` with `lose`; meanwhile no ACK reaches the
    /// server, so its RTT estimate stays `before`.
    fn hold(&mut self, t: Instant, before: Duration, lose: &mut Lose) {
        self.link.run_until(t + HELD, lose);
        assert_eq!(self.link.server.conn().rtt(), before);
    }

    /// After `t + HELD`, the client writes and its packet, with its ACK,
    /// reaches the server: the server's RTT estimate must not have moved
    /// by more than noise.
    fn late_ack_arrives(&mut self, before: Duration) {
        self.client_writes();
        let acks_before = self.link.server.conn().stats().frame_rx.acks;
        let arrived = self.link.now + ONE_WAY;
        self.link.run_until(arrived, &mut lossless);
        assert!(self.link.server.conn().stats().frame_rx.acks > acks_before);
        let after = self.link.server.conn().rtt();
        assert!(
            after < before * 2,
            "the server's RTT went from {before:?} to {after:?}: the late ACK was taken as a sample"
        );
    }
}

#[test]
fn a_lost_ack_repeated_a_second_later_does_not_enter_the_rtt() {
    let mut pair = Pair::warmed_up();
    let before = pair.link.server.conn().rtt();
    // The server writes at `t`; its data arrives. For a second, everything
    // else is lost: the client's ACK of the data and the server's probes.
    let t = pair.link.now;
    pair.server_writes();
    let (mut data_sent, mut lost) = (false, 0u32);
    let mut lose = |now: Instant, from_server: bool, _: &mut Peer, _: &[u8]| {
        let keep = from_server && !data_sent && now == t;
        data_sent |= keep;
        lost += u32::from(!keep);
        !keep
    };
    pair.hold(t, before, &mut lose);
    assert!(
        data_sent && lost >= 2,
        "the scene was not set ({lost} lost)"
    );
    // The client's next packet acknowledges the data, a second after it
    // arrived.
    pair.late_ack_arrives(before);
}

#[test]
fn an_ack_only_packet_acknowledged_a_second_later_does_not_enter_the_rtt() {
    let mut pair = Pair::warmed_up();
    let before = pair.link.server.conn().rtt();
    // Both write at `t`. The server's data and its ACK-only answer to the
    // client's data get through; until `t + HELD`, nothing else the server
    // sends and nothing the client sends after `t` does. The client's ACK of
    // the data is lost, and the ACK-only packet is the largest it has.
    let t = pair.link.now;
    pair.client_writes();
    pair.server_writes();
    let mut counted = pair.link.server.conn().stats().frame_tx;
    let (mut data_sent, mut ack_only_sent, mut lost) = (false, false, 0u32);
    let mut lose = |now: Instant, from_server: bool, sender: &mut Peer, _: &[u8]| {
        if !from_server {
            lost += u32::from(now > t);
            return now > t;
        }
        let frames = sender.conn().stats().frame_tx;
        let before = std::mem::replace(&mut counted, frames);
        let stream = frames.stream > before.stream;
        let ack_only = !stream
            && frames.acks > before.acks
            && frames.ping == before.ping
            && frames.ack_frequency == before.ack_frequency
            && frames.immediate_ack == before.immediate_ack;
        let keep = if !data_sent && stream {
            data_sent = true;
            true
        } else if data_sent && !ack_only_sent && ack_only {
            ack_only_sent = true;
            true
        } else {
            false
        };
        lost += u32::from(!keep);
        !keep
    };
    pair.hold(t, before, &mut lose);
    assert!(
        data_sent && ack_only_sent && lost >= 2,
        "the scene was not set ({lost} lost)"
    );
    // The client's next packet acknowledges the data and, as its largest,
    // the ACK-only packet it received a second before.
    pair.late_ack_arrives(before);
}

#[test]
fn ordinary_acks_still_give_samples_and_the_estimate_follows_a_longer_path() {
    // The ACKs of sparse traffic are mostly sent when the peer's ACK delay
    // expires, at max_ack_delay: they must still be sampled.
    let mut pair = Pair::warmed_up();
    pair.link.one_way = Duration::from_millis(50);
    pair.exchange(30);
    for (name, peer) in [
        ("client", &mut pair.link.client),
        ("server", &mut pair.link.server),
    ] {
        let rtt = peer.conn().rtt();
        assert!(
            rtt > Duration::from_millis(80),
            "the {name}'s RTT is {rtt:?} on a 100 ms path"
        );
    }
}
