//! `quicsdn-lab bench stall`, quick: the real agents stay under their memory
//! bound while a stalled controller reads nothing under a PACKET_IN flood and a
//! stalled switch reads nothing under a FLOW_MOD storm; echo keeps getting
//! through; afterwards every message arrives exactly once, in order. (The
//! bench's 60-second run: docs/results/stall/.)

use quicsdn_lab::bench::stall::{self, StallArgs};

#[test]
fn a_stalled_peer_keeps_the_agents_memory_bounded_and_echo_flowing() {
    let bound_mib = 64;
    let results = stall::run(StallArgs {
        seconds: 2,
        rss_bound_mib: bound_mib,
        echo_interval_ms: 100,
        quicsdn: None,
    })
    .expect("the stall bench");
    assert_eq!(results.len(), 2);
    for r in &results {
        assert!(r.growth_mib() < bound_mib as f64, "{r:?}");
        assert!(r.echoes_during_stall >= 5, "{r:?}");
        assert!(r.delivered_exactly_once_in_order, "{r:?}");
        // The flood was held back by backpressure, not dropped: what was
        // written during the stall is far more than the agents grew by.
        assert!(r.flood_sent_during_stall > 10_000, "{r:?}");
    }
}
