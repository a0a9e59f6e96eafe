//! The UDP transports (`udp-seed`, `udp-robust`) in the benches, end to end
//! (root: namespaces, emulated links, the real agents, real OVS): the
//! robust profile's exactly-once, in-order delivery under 5 % loss, audited
//! with the synthetic programs' sequence-stamped messages; the seed profile's
//! loss and reordering counts against its mechanism; and the `--quick`
//! table2 bench, whose UDP counters only these transports have. The quick
//! overhead, delay and table1 benches run both with every other transport in
//! `benches.rs`. Prefixes `qsdnU2`, `qsdnU3`, `qsdnU7`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use quicsdn_lab::bench::cell::{self, CellSpec, Dir, key};
use quicsdn_lab::bench::overhead::link_settings;
use quicsdn_lab::bench::pair::BenchTransport;
use quicsdn_lab::bench::synth::{Schedule, Service};
use quicsdn_lab::bench::table2;

/// 3000 messages each way on each service at 600/s, 5 % loss both ways.
fn lossy_cell(prefix: &str, t: BenchTransport) -> cell::CellResult {
    let mut schedules = BTreeMap::new();
    for (i, d) in Dir::BOTH.into_iter().enumerate() {
        for (j, svc) in Service::BOTH.into_iter().enumerate() {
            let size = match svc {
                Service::OpenFlow => 128,
                Service::Ovsdb => 300,
            };
            schedules.insert(
                (d, key(svc)),
                Schedule::poisson(3000, 600.0, vec![size], 7 + (2 * i + j) as u64),
            );
        }
    }
    cell::run(&CellSpec {
        prefix: prefix.into(),
        transport: t,
        link_seed: None,
        link: link_settings(0.002, 0.0, 5.0),
        schedules,
        settle: Duration::from_millis(300),
        timeout: Duration::from_secs(120),
        agent_args: Vec::new(),
        dir: std::env::temp_dir().join(format!("{prefix}-cell")),
    })
    .expect("cell")
}

#[test]
fn udp_robust_at_5_percent_loss_delivers_every_message_exactly_once_in_order() {
    let _s = serial();
    require_root();
    let r = lossy_cell("qsdnU2", BenchTransport::UdpRobust);
    assert!(
        r.sw_to_ctl.lost > 0 && r.ctl_to_sw.lost > 0,
        "the link lost nothing"
    );
    println!(
        "udp-robust, 5 % loss: frames lost on the link {} + {}",
        r.sw_to_ctl.lost, r.ctl_to_sw.lost
    );
    for ((d, k), f) in &r.flows {
        let what = format!("{} {k}", d.name());
        assert_eq!(f.sent, 3000, "{what}");
        // The cell already failed on any duplicate or missing message; the
        // audit: every sequence number once, in the order sent.
        let seqs: Vec<u64> = f.received.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, (0..3000).collect::<Vec<_>>(), "{what}");
        assert_eq!(f.out_of_order, 0, "{what}");
        assert_eq!(f.duplicates, 0, "{what}");
    }
}

#[test]
fn udp_seed_at_5_percent_loss_loses_about_p_to_the_fourth_and_reorders() {
    let _s = serial();
    require_root();
    let r = lossy_cell("qsdnU3", BenchTransport::UdpSeed);
    let (mut lost, mut late, mut sent) = (0, 0, 0);
    for ((d, k), f) in &r.flows {
        let what = format!("{} {k}", d.name());
        // What arrived is a subset of what was sent, each at most once.
        let mut seqs: Vec<u64> = f.received.iter().map(|m| m.seq).collect();
        seqs.sort();
        seqs.dedup();
        assert_eq!(seqs.len(), f.received.len(), "{what}");
        assert!(seqs.iter().all(|s| *s < f.sent), "{what}");
        lost += f.lost();
        late += f.out_of_order;
        sent += f.sent;
    }
    println!(
        "udp-seed, 5 % loss: {sent} sent, {lost} lost, {late} out of order; frames lost on the link {} + {}",
        r.sw_to_ctl.lost, r.ctl_to_sw.lost
    );
    // A message is lost only if all 4 transmissions are: p^4 = 6.25e-6, so
    // 12,000 messages expect 0.075 losses; 3 or more has probability < 1e-4.
    assert!(lost <= 2, "lost {lost} of {sent}");
    // Retransmitted messages arrive ~1 s late, behind later ones: counted, not
    // reordered (5 % of 12,000 sent within 5 s ≈ 600 retransmissions).
    assert!(late > 100, "only {late} out of order");
}

#[test]
fn table2_quick_measures_every_metric_and_reads_the_agents_counters() {
    let _s = serial();
    require_root();
    let dir = tempfile::tempdir().unwrap();
    table2::run(table2::Table2Args {
        out: dir.path().to_path_buf(),
        quick: true,
        transports: "tcp,udp-seed,udp-robust".into(),
        samples: None,
        conditions: None,
        prefix: "qsdnU7".into(),
        agent_args: Vec::new(),
    })
    .expect("table2 bench");
    let (csv, counters) = table2::read(dir.path()).expect("schema");
    // 2 conditions × 3 transports × 3 metrics.
    assert_eq!(csv.rows.len(), 2 * 3 * 3);
    for r in &csv.rows {
        assert_eq!(num(&csv, r, "samples"), 10);
        let (answered, lost) = (num(&csv, r, "answered"), num(&csv, r, "lost"));
        assert_eq!(answered + lost, 10, "{r:?}");
        if r[1] != "udp-seed" {
            assert_eq!(lost, 0, "{r:?}");
        }
        if answered > 0 {
            let mean: f64 = r[csv.col("mean_ms")].parse().unwrap();
            assert!(mean > 0.0, "{r:?}");
        }
    }
    // Each UDP run left OpenFlow counters from both agents, consistent with
    // each other: what one side received covers what the other sent.
    for cond in ["unimpaired", "5% loss"] {
        for t in ["udp-seed", "udp-robust"] {
            let rows: Vec<&Vec<String>> = counters
                .rows
                .iter()
                .filter(|r| r[0] == cond && r[1] == t && r[3] == "openflow")
                .collect();
            assert_eq!(rows.len(), 2, "{cond} {t}: {rows:?}");
            for r in &rows {
                let sent = num(&counters, r, "sent");
                assert!(sent > 30, "{r:?}");
                let packets = num(&counters, r, "packets");
                if t == "udp-seed" {
                    // One datagram per message, and its retransmissions.
                    assert!(packets >= sent, "{r:?}");
                } else {
                    // Messages queued behind a full window share packets.
                    assert!(packets > 0, "{r:?}");
                }
            }
            if cond == "unimpaired" {
                assert!(rows.iter().all(|r| num(&counters, r, "given_up") == 0));
            }
        }
    }
    let md = std::fs::read_to_string(dir.path().join("table2.md")).unwrap();
    assert!(md.contains("7.53") && md.contains("udp-seed"), "{md}");
}
