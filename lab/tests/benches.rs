//! The `--quick` benches, end to end (root: namespaces, emulated links, real
//! agents, kcptun, real OVS). They assert delivery, payload counts and CSV
//! schemas, never speed. Prefixes `qsdnB1`…`qsdnB7`, `qsdnWB7`…`qsdnWB9`; one
//! bench at a time, also across test binaries and checkouts (`common::serial`).

mod common;

use std::path::Path;
use std::time::Duration;

use quicsdn_lab::bench::out::Csv;
use quicsdn_lab::bench::overhead::{self, OPENFLOW_SIZE, OVSDB_SIZE, OverheadArgs};
use quicsdn_lab::bench::pair::BenchTransport;
use quicsdn_lab::bench::{delay, migration, modelcmd, reconnect, report, table1};

fn serial() -> common::Serial {
    common::require_root();
    common::serial()
}

fn all_transports() -> Vec<String> {
    BenchTransport::COMPARED
        .iter()
        .map(|t| t.as_str().to_string())
        .collect()
}

fn overhead_args(out: &Path, prefix: &str) -> OverheadArgs {
    common::quick_overhead_args(out, prefix, &all_transports().join(","))
}

#[test]
fn overhead_quick_delivers_every_message_over_every_transport() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    overhead::run(overhead_args(dir.path(), "qsdnB1")).expect("overhead bench");
    let csv = overhead::read(dir.path()).expect("schema");
    // 8 transports × 2 rates × 1 loss × 1 RTT × 2 directions.
    assert_eq!(csv.rows.len(), 8 * 2 * 2);
    for t in all_transports() {
        assert!(csv.rows.iter().any(|r| r[0] == t), "no rows for {t}");
    }
    for r in &csv.rows {
        let n = common::num(&csv, r, "messages");
        assert_eq!(
            n,
            overhead::default_messages(r[csv.col("rate")].parse().unwrap(), true)
        );
        if r[0] == "udp-seed" {
            // The paper's mechanism may lose messages (docs/benchmarks.md); what
            // arrived is never more than what was sent.
            assert!(common::num(&csv, r, "delivered") <= n, "{r:?}");
            continue;
        }
        assert_eq!(common::num(&csv, r, "delivered"), n, "{r:?}");
        // Half OpenFlow, half OVSDB (the odd one is OpenFlow).
        let want = n.div_ceil(2) * OPENFLOW_SIZE as u64 + n / 2 * OVSDB_SIZE as u64;
        assert_eq!(common::num(&csv, r, "payload_bytes"), want, "{r:?}");
        let wire = common::num(&csv, r, "wire_bytes");
        let overhead: i64 = r[csv.col("overhead_bytes")].parse().unwrap();
        assert_eq!(overhead, wire as i64 - want as i64);
        assert!(common::num(&csv, r, "frames") > 0);
        assert!(common::num(&csv, r, "ack_only_frames") < common::num(&csv, r, "frames"));
    }
    // Issue 13: with its defaults, quic puts fewer overhead bytes on the control
    // link than tcp where messages are dense enough to share packets (both
    // directions together). A direction, not a sized target: the benchmark
    // commands measure by how much. At 10 msg/s every message travels alone
    // over either transport and the two are within a few percent of each other
    // (docs/benchmarks.md), too close for a test that must never flake.
    let overhead_at_1k = |t: &str| -> i64 {
        csv.rows
            .iter()
            .filter(|r| r[0] == t && r[csv.col("rate")] == "1000")
            .map(|r| r[csv.col("overhead_bytes")].parse::<i64>().unwrap())
            .sum()
    };
    let (quic, tcp) = (overhead_at_1k("quic"), overhead_at_1k("tcp"));
    assert!(
        quic < tcp,
        "at 1k msg/s default quic carried {quic} overhead bytes, tcp {tcp}"
    );
    let md = std::fs::read_to_string(dir.path().join("overhead.md")).unwrap();
    assert!(md.contains("quic-tuned overhead"), "{md}");
    assert!(md.contains("- loss seed: "), "{md}");
    assert!(
        dir.path()
            .join("overhead-short.png")
            .metadata()
            .unwrap()
            .len()
            > 1000
    );
}

#[test]
fn delay_quick_measures_every_message() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    delay::run(delay::DelayArgs {
        out: dir.path().to_path_buf(),
        quick: true,
        transports: all_transports().join(","),
        sizes: None,
        rtts: None,
        losses: None,
        reps: None,
        pairs: 5,
        prefix: "qsdnB2".into(),
        no_plots: true,
    })
    .expect("delay bench");
    let csv = delay::read(dir.path()).expect("schema");
    // 3 repetitions × 5 pairs × 2 messages per transport (udp-seed may lose some).
    for t in all_transports() {
        let rows: Vec<&Vec<String>> = csv.rows.iter().filter(|r| r[0] == t).collect();
        if t == "udp-seed" {
            let mut seqs: Vec<u64> = rows.iter().map(|r| common::num(&csv, r, "seq")).collect();
            seqs.sort();
            seqs.dedup();
            // An unimpaired link: the seed profile may lose, but hardly does.
            assert!(
                seqs.len() == rows.len() && (28..=30).contains(&rows.len()),
                "{t}"
            );
            continue;
        }
        assert_eq!(rows.len(), 30, "{t}");
        let mut seqs: Vec<u64> = rows.iter().map(|r| common::num(&csv, r, "seq")).collect();
        seqs.sort();
        assert_eq!(seqs, (0..30).collect::<Vec<_>>(), "{t}: every message once");
        for r in rows {
            let size = common::num(&csv, r, "size");
            let seq = common::num(&csv, r, "seq");
            assert_eq!(size, if seq.is_multiple_of(2) { 400 } else { 600 });
            assert_eq!(common::num(&csv, r, "rep"), seq / 10);
            let d: f64 = r[csv.col("delay_ms")].parse().unwrap();
            assert!(d > 0.0 && d < 10_000.0, "{t}: delay {d}");
        }
    }
}

#[test]
fn table1_quick_installs_configures_and_polls_with_real_ovs() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    // One transport of each family (TCP, QUIC, UDP): the quick overhead and
    // delay benches above take every transport through the same lab pair.
    table1::run(table1::Table1Args {
        out: dir.path().to_path_buf(),
        quick: true,
        transports: "tcp,quic,udp-robust".into(),
        prefix: "qsdnB3".into(),
        agent_args: Vec::new(),
        no_plots: true,
    })
    .expect("table1 bench (it checks every flow, transaction and stats reply itself)");
    let csv = table1::read(dir.path()).expect("schema");
    assert_eq!(csv.rows.len(), 3 * 6);
    for r in &csv.rows {
        assert!(common::num(&csv, r, "count") > 0);
        assert!(common::num(&csv, r, "wire_bytes") > 0, "{r:?}");
        let reached: f64 = r[csv.col("reached_rate")].parse().unwrap();
        assert!(reached > 0.0);
        let paper: f64 = r[csv.col("paper_tcp_bytes_per_s")].parse().unwrap();
        assert!(paper > 0.0, "every level is one of Table I's: {r:?}");
    }
    assert!(
        std::fs::read_to_string(dir.path().join("table1.md"))
            .unwrap()
            .contains("38978")
    );
}

#[test]
fn model_validates_against_a_file_transfer_and_the_grid_then_report_gathers_all() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut o = overhead_args(&dir.path().join("overhead"), "qsdnB4");
    o.transports = "tcp,quic-tuned".into();
    o.rates = Some("1000".into());
    o.messages = Some(200);
    o.no_plots = true;
    overhead::run(o).expect("overhead bench");
    modelcmd::run(modelcmd::ModelArgs {
        out: dir.path().join("model"),
        quick: true,
        file_bytes: None,
        overhead: None,
        no_transfer: false,
        prefix: "qsdnB5".into(),
        no_plots: true,
        calc: None,
    })
    .expect("model");
    let v = Csv::read(
        &dir.path().join("model/validation.csv"),
        modelcmd::VALIDATION_HEADER,
    )
    .expect("validation schema");
    assert_eq!(v.rows.len(), 4, "tcp and quic, two header sets each");
    for r in &v.rows {
        let measured: f64 = r[v.col("measured_overhead")].parse().unwrap();
        assert!(measured > 0.0);
        assert!(
            common::num(&v, r, "data_packets") >= common::num(&v, r, "predicted_data_packets") / 2
        );
    }
    let g = Csv::read(&dir.path().join("model/grid.csv"), modelcmd::GRID_HEADER).expect("grid");
    assert_eq!(g.rows.len(), 2, "tcp and quic-tuned (one cell)");
    Csv::read(&dir.path().join("model/fig2.csv"), modelcmd::FIG2_HEADER).expect("fig2");
    report::run(report::ReportArgs {
        results: dir.path().to_path_buf(),
    })
    .expect("report");
    let md = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
    for want in [
        "## Targets",
        "quic-tuned",
        "Control-traffic overhead",
        "overhead model",
    ] {
        assert!(md.contains(want), "report lacks {want:?}");
    }
}

#[test]
fn tuning_quick_measures_each_setting() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    quicsdn_lab::bench::tuning::run(quicsdn_lab::bench::tuning::TuningArgs {
        out: dir.path().to_path_buf(),
        quick: true,
        prefix: "qsdnB6".into(),
    })
    .expect("tuning bench (every cell checks delivery)");
    let csv = Csv::read(
        &dir.path().join("tuning.csv"),
        quicsdn_lab::bench::tuning::HEADER,
    )
    .expect("schema");
    assert_eq!(csv.rows.len(), 2);
    for r in &csv.rows {
        for (h, v) in csv.header.iter().zip(r).skip(1) {
            let v: f64 = v.parse().unwrap();
            assert!(v > 0.0, "{h}: {v}");
        }
    }
}

#[test]
fn hol_quick_measures_every_cell_with_real_ovs() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    quicsdn_lab::bench::hol::run(quicsdn_lab::bench::hol::HolArgs {
        out: dir.path().to_path_buf(),
        quick: true,
        agent_args: Vec::new(),
        old_defaults: false,
        seed: None,
        prefix: "qsdnB7".into(),
        no_plots: false,
    })
    .expect("hol bench (each packet-in cell checks that most packets came back)");
    let csv = quicsdn_lab::bench::hol::read(dir.path()).expect("schema");
    // echo at 2 %, packet-in at 1 % and 5 %; tcp, quic ordered, quic safe each.
    let mut cells = std::collections::BTreeMap::<(String, String, String), usize>::new();
    for r in &csv.rows {
        let ms: f64 = r[3].parse().unwrap();
        assert!(ms > 0.0 && ms < 60_000.0, "sample {r:?}");
        *cells
            .entry((r[0].clone(), r[1].clone(), r[2].clone()))
            .or_default() += 1;
    }
    assert_eq!(cells.len(), 9, "{cells:?}");
    assert!(dir.path().join("hol.png").exists());
    let md = std::fs::read_to_string(dir.path().join("hol.md")).unwrap();
    assert!(md.contains("quic (default: safe)") && md.contains("(hol.png)"));
}

/// The summary row of `transport`, as column name → value.
fn summary_row(csv: &Csv, transport: &str) -> std::collections::HashMap<String, String> {
    let row = csv
        .rows
        .iter()
        .find(|r| r[0] == transport)
        .unwrap_or_else(|| panic!("no summary row for {transport}"));
    csv.header
        .iter()
        .map(|h| h.to_string())
        .zip(row.iter().cloned())
        .collect()
}

#[test]
fn migration_quick_keeps_the_quic_session_and_breaks_the_tcp_one() {
    migration_quick(
        migration::Change::Readdress,
        "qsdnWB7",
        "switch re-addressed",
    );
}

#[test]
fn migration_quick_through_a_rebinding_nat_keeps_the_quic_session_and_breaks_the_tcp_one() {
    migration_quick(
        migration::Change::Nat,
        "qsdnWB9",
        "NAT in front of the switch rebound",
    );
}

/// The quick migration bench with `--change change`, whose link event says
/// `event`: over quic nothing reconnects, over tcp OVS does.
fn migration_quick(change: migration::Change, prefix: &str, event: &str) {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    migration::run(migration::MigrationArgs {
        out: dir.path().to_path_buf(),
        quick: true,
        transports: "tcp,quic".into(),
        delay: Duration::from_millis(5),
        data_rate: 20_000_000,
        prefix: prefix.into(),
        no_plots: false,
        change,
    })
    .expect("migration bench");
    let s = migration::read_summary(dir.path()).expect("summary schema");
    assert_eq!(s.rows.len(), 2);
    let n = |r: &std::collections::HashMap<String, String>, k: &str| -> u64 {
        r[k].parse().unwrap_or_else(|_| panic!("{k}: {r:?}"))
    };
    // quic: the connection migrated; OVS never reconnected, the controller saw
    // one connection that never closed, and every poll was answered.
    let q = summary_row(&s, "quic");
    assert_eq!(n(&q, "ovs_connects_after_cut"), 0, "{q:?}");
    assert_eq!(n(&q, "controller_connections"), 1, "{q:?}");
    assert_eq!(n(&q, "controller_disconnects_seen"), 0, "{q:?}");
    assert_eq!(n(&q, "unanswered_polls"), 0, "{q:?}");
    assert_eq!(n(&q, "flows_pushed"), 1, "{q:?}");
    assert!(n(&q, "replies") >= 8, "{q:?}");
    // tcp: the session broke; OVS reconnected from the new address or port,
    // the controller got a second connection and its polls were answered again.
    let t = summary_row(&s, "tcp");
    assert!(n(&t, "ovs_connects_after_cut") >= 1, "{t:?}");
    assert!(n(&t, "controller_connections") >= 2, "{t:?}");
    assert!(n(&t, "unanswered_polls") >= 1, "{t:?}");
    assert_ne!(t["back_to_normal_s"], "-", "{t:?}");
    for r in [&q, &t] {
        assert!(n(r, "data_bytes") > 0, "{r:?}");
    }
    let tl = migration::read_timeline(dir.path()).expect("timeline schema");
    for tr in ["tcp", "quic"] {
        for series in [
            "data_bytes",
            "control_bytes",
            "stats_request",
            "stats_reply",
        ] {
            assert!(
                tl.rows.iter().any(|r| r[0] == tr && r[2] == series),
                "{tr}: no {series} rows"
            );
        }
        for ev in ["down", "up", event] {
            assert!(
                tl.rows
                    .iter()
                    .any(|r| r[0] == tr && r[2] == "link" && r[4].starts_with(ev)),
                "{tr}: no link {ev}"
            );
        }
    }
    assert!(dir.path().join("migration.png").metadata().unwrap().len() > 1000);
    assert!(
        std::fs::read_to_string(dir.path().join("summary.md"))
            .unwrap()
            .contains("## quic")
    );
}

#[test]
fn reconnect_quick_delivers_every_first_message_and_resumes_in_0rtt() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    reconnect::run(reconnect::ReconnectArgs {
        out: dir.path().to_path_buf(),
        quick: true,
        transports: "quic,quic-no-0rtt,tcp,tls".into(),
        reps: 12,
        switch: "both".into(),
        rtt: Duration::from_millis(100),
        prefix: "qsdnWB8".into(),
        no_plots: true,
    })
    .expect("reconnect bench");
    let csv = reconnect::read(dir.path()).expect("schema");
    // 4 transports × 2 switches × 2 repetitions.
    assert_eq!(csv.rows.len(), 16);
    for r in &csv.rows {
        let (t, sw) = (&r[csv.col("transport")], &r[csv.col("switch")]);
        // Every repetition delivered OVS's (or the synthetic switch's) HELLO
        // first, then the FEATURES_REPLY, and the FLOW_MOD reached the switch.
        assert_eq!(r[csv.col("first_message")], "HELLO", "{r:?}");
        let at = |c: &str| -> f64 {
            r[csv.col(c)]
                .parse()
                .unwrap_or_else(|_| panic!("{c}: {r:?}"))
        };
        assert!(at("first_message_ms") > 0.0, "{r:?}");
        assert!(at("features_reply_ms") >= at("first_message_ms"), "{r:?}");
        assert!(
            at("flow_mod_at_switch_ms") > at("features_reply_ms") - 1.0,
            "{r:?}"
        );
        let want = match t.as_str() {
            "quic" => "true",
            "quic-no-0rtt" => "false",
            _ => "-",
        };
        assert_eq!(r[csv.col("zero_rtt")], want, "{t} {sw}: {r:?}");
    }
    assert!(
        std::fs::read_to_string(dir.path().join("summary.md"))
            .unwrap()
            .contains("| tls | synthetic |")
    );
}
