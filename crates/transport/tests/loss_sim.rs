//! An experiment, not a test (`#[ignore]`d; it asserts nothing): a request
//! and its answer every 100 ms between two endpoints with the agents'
//! configuration, over a lossy link on a virtual clock. It prints the
//! exchange times, how many connections timed out idle, and the largest
//! smoothed RTT either end reached: the numbers behind quinn-proto's RTT
//! sample patch (third_party/quinn-proto/QUICSDN-PATCH.md). To compare,
//! run it again with the patch's condition disabled.
//!
//! `cargo test --release -p quicsdn-transport --test loss_sim -- --ignored
//! --nocapture`, with `SIM_LOSS` (each way, default 0.3), `SIM_ONE_WAY_MS`
//! (default 10) and `SIM_RUNS` (default 100) in the environment.

mod common;

use common::{Link, Peer, lossless};
use quicsdn_transport::quic::QuicOptions;
use quinn_proto::{Dir, StreamId};
use std::time::{Duration, Instant};

const EXCHANGES: usize = 100;
const MESSAGE: usize = 16;
const STEP: Duration = Duration::from_millis(1);

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic coin, so that a run loses the same datagrams each time.
struct Coin(u64);

impl Coin {
    fn lands_below(&mut self, p: f64) -> bool {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// The two ends' streams and what the server has read so far.
#[derive(Default)]
struct Streams {
    server_out: Option<StreamId>,
    server_in: Option<StreamId>,
    client_out: Option<StreamId>,
    client_in: Option<StreamId>,
    answered: usize,
}

fn read(peer: &mut Peer, stream: &mut Option<StreamId>) -> usize {
    let conn = peer.conn();
    if stream.is_none() {
        *stream = conn.streams().accept(Dir::Uni);
    }
    let Some(id) = *stream else { return 0 };
    let mut recv = conn.recv_stream(id);
    let Ok(mut chunks) = recv.read(true) else {
        return 0;
    };
    let mut n = 0;
    while let Ok(Some(chunk)) = chunks.next(usize::MAX) {
        n += chunk.bytes.len();
    }
    let _ = chunks.finalize();
    n
}

/// One millisecond of the link; the client answers what it read at once.
fn step(link: &mut Link, s: &mut Streams, lose: &mut common::Lose, rtt_max: &mut Duration) {
    let next = link.now + STEP;
    link.run_until(next, lose);
    let n = read(&mut link.client, &mut s.client_in);
    if n > 0 {
        link.client.write(&mut s.client_out, n);
    }
    s.answered += read(&mut link.server, &mut s.server_in);
    *rtt_max = (*rtt_max)
        .max(link.server.conn().rtt())
        .max(link.client.conn().rtt());
}

/// One connection's exchange times (ms) and largest smoothed RTT; panics
/// (caught by the caller) when the connection closes.
fn run(seed: u64, loss: f64, one_way: Duration) -> (Vec<f64>, Duration) {
    let mut link = Link::new(&QuicOptions::default(), one_way);
    link.connect(&mut lossless);
    let mut coin = Coin(seed * 7919);
    let mut lose = |_: Instant, _: bool, _: &mut Peer, _: &[u8]| coin.lands_below(loss);
    let mut s = Streams::default();
    let (mut times, mut rtt_max) = (Vec::new(), Duration::ZERO);
    for round in 1..=EXCHANGES {
        let asked = link.now;
        link.server.write(&mut s.server_out, MESSAGE);
        while s.answered < round * MESSAGE {
            step(&mut link, &mut s, &mut lose, &mut rtt_max);
        }
        times.push((link.now - asked).as_secs_f64() * 1e3);
        let next = link.now + Duration::from_millis(100);
        while link.now < next {
            step(&mut link, &mut s, &mut lose, &mut rtt_max);
        }
    }
    (times, rtt_max)
}

#[test]
#[ignore = "an experiment that prints numbers; run it by name"]
fn request_and_answer_over_a_lossy_link() {
    let loss = env("SIM_LOSS", 0.3);
    let one_way = Duration::from_millis(env("SIM_ONE_WAY_MS", 10));
    let runs = env("SIM_RUNS", 100u64);
    let (mut times, mut rtt_max, mut timed_out) = (Vec::new(), Vec::new(), 0);
    for seed in 1..=runs {
        match std::panic::catch_unwind(|| run(seed, loss, one_way)) {
            Ok((t, r)) => {
                times.extend(t);
                rtt_max.push(r.as_secs_f64() * 1e3);
            }
            Err(_) => timed_out += 1,
        }
    }
    times.sort_by(f64::total_cmp);
    rtt_max.sort_by(f64::total_cmp);
    let q = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p) as usize];
    println!(
        "loss {loss}, one-way {one_way:?}: {} exchanges, p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, \
         max {:.0} ms; {timed_out} of {runs} connections closed; largest smoothed RTT: median {:.1} ms, \
         max {:.1} ms",
        times.len(),
        q(&times, 0.5),
        q(&times, 0.9),
        q(&times, 0.99),
        q(&times, 1.0),
        q(&rtt_max, 0.5),
        q(&rtt_max, 1.0),
    );
}
