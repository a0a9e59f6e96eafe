//! The `--quick` benches, end to end (root: namespaces, emulated links, real
//! agents, kcptun, real OVS). They assert delivery, payload counts and CSV
//! schemas, never speed. Prefixes `qsdnB1`…`qsdnB5`; one bench at a time.

use std::path::Path;
use std::sync::Mutex;

use quicsdn_lab::bench::out::Csv;
use quicsdn_lab::bench::overhead::{self, OPENFLOW_SIZE, OVSDB_SIZE, OverheadArgs};
use quicsdn_lab::bench::pair::BenchTransport;
use quicsdn_lab::bench::{delay, modelcmd, report, table1};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the bench tests need root");
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn all_transports() -> Vec<String> {
    BenchTransport::ALL
        .iter()
        .map(|t| t.as_str().to_string())
        .collect()
}

fn overhead_args(out: &Path, prefix: &str) -> OverheadArgs {
    OverheadArgs {
        out: out.to_path_buf(),
        quick: true,
        transports: all_transports().join(","),
        rates: None,
        losses: None,
        rtts: None,
        long_rates: None,
        messages: None,
        agent_args: Vec::new(),
        prefix: prefix.into(),
        no_plots: false,
    }
}

fn col(csv: &Csv, row: &[String], name: &str) -> u64 {
    row[csv.col(name)]
        .parse()
        .unwrap_or_else(|_| panic!("{name}: {row:?}"))
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
        let n = col(&csv, r, "messages");
        assert_eq!(
            n,
            overhead::default_messages(r[csv.col("rate")].parse().unwrap(), true)
        );
        if r[0] == "udp-seed" {
            // The paper's mechanism may lose messages (docs/benchmarks.md); what
            // arrived is never more than what was sent.
            assert!(col(&csv, r, "delivered") <= n, "{r:?}");
            continue;
        }
        assert_eq!(col(&csv, r, "delivered"), n, "{r:?}");
        // Half OpenFlow, half OVSDB (the odd one is OpenFlow).
        let want = n.div_ceil(2) * OPENFLOW_SIZE as u64 + n / 2 * OVSDB_SIZE as u64;
        assert_eq!(col(&csv, r, "payload_bytes"), want, "{r:?}");
        let wire = col(&csv, r, "wire_bytes");
        let overhead: i64 = r[csv.col("overhead_bytes")].parse().unwrap();
        assert_eq!(overhead, wire as i64 - want as i64);
        assert!(col(&csv, r, "frames") > 0);
        assert!(col(&csv, r, "ack_only_frames") < col(&csv, r, "frames"));
    }
    let md = std::fs::read_to_string(dir.path().join("overhead.md")).unwrap();
    assert!(md.contains("quic-tuned overhead"), "{md}");
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
            let mut seqs: Vec<u64> = rows.iter().map(|r| col(&csv, r, "seq")).collect();
            seqs.sort();
            seqs.dedup();
            assert!(seqs.len() == rows.len() && rows.len() <= 30, "{t}");
            continue;
        }
        assert_eq!(rows.len(), 30, "{t}");
        let mut seqs: Vec<u64> = rows.iter().map(|r| col(&csv, r, "seq")).collect();
        seqs.sort();
        assert_eq!(seqs, (0..30).collect::<Vec<_>>(), "{t}: every message once");
        for r in rows {
            let size = col(&csv, r, "size");
            let seq = col(&csv, r, "seq");
            assert_eq!(size, if seq.is_multiple_of(2) { 400 } else { 600 });
            assert_eq!(col(&csv, r, "rep"), seq / 10);
            let d: f64 = r[csv.col("delay_ms")].parse().unwrap();
            assert!(d > 0.0 && d < 10_000.0, "{t}: delay {d}");
        }
    }
}

#[test]
fn table1_quick_installs_configures_and_polls_with_real_ovs() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    table1::run(table1::Table1Args {
        out: dir.path().to_path_buf(),
        quick: true,
        transports: all_transports().join(","),
        prefix: "qsdnB3".into(),
        no_plots: true,
    })
    .expect("table1 bench (it checks every flow, transaction and stats reply itself)");
    let csv = table1::read(dir.path()).expect("schema");
    assert_eq!(csv.rows.len(), 8 * 6);
    for r in &csv.rows {
        assert!(col(&csv, r, "count") > 0);
        assert!(col(&csv, r, "wire_bytes") > 0, "{r:?}");
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
        assert!(col(&v, r, "data_packets") >= col(&v, r, "predicted_data_packets") / 2);
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
