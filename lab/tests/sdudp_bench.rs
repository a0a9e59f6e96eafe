//! `quicsdn-lab bench sdudp --quick`: one small cell of each experiment
//! (load, delay, accumulation, engines, time, proxy) on real OVS lines of 5
//! switches; checks the outputs are complete and consistent, never timings.
//! Prefix `q15q`.

mod common;

use common::LabGuard;
use quicsdn_lab::bench::out::Csv;
use quicsdn_lab::bench::sdudp::{self, CELLS_HEADER, RUNS_HEADER, SdudpBenchArgs};

const P: &str = "q15q";

#[test]
fn quick_bench_writes_every_cell_delivered_exactly_with_counters() {
    common::require_root();
    let _serial = common::serial();
    let _guard = LabGuard::new(P);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_path_buf();
    sdudp::run(SdudpBenchArgs {
        out: out.clone(),
        quick: true,
        kinds: "load,delay,accumulation,engines,time,proxy".into(),
        reps: 10,
        switches: None,
        loss: None,
        sets: None,
        delays: None,
        total_kb: None,
        carriers: Vec::new(),
        prefix: P.into(),
        tcp_congestion: "cubic".into(),
        file_gap_us: 0,
        summarize: false,
        resume: false,
    })
    .unwrap();

    let runs = Csv::read(&out.join("runs.csv"), RUNS_HEADER).unwrap();
    let cells = Csv::read(&out.join("cells.csv"), CELLS_HEADER).unwrap();
    let key = |r: &Vec<String>| r[..8].join(" ");
    let mut got: Vec<String> = cells.rows.iter().map(key).collect();
    got.sort();
    // Every cell of the quick grid, once: TCP, SDUDP and the QUIC proxy on
    // the same line (load, time, proxy), 20 ms (delay), no accumulation, odd
    // engines.
    assert_eq!(
        got,
        [
            "quic-proxy 5 1 1 10 - false A",
            "sdudp 5 1 1 10 all false A",
            "sdudp 5 1 1 10 all true A",
            "sdudp 5 1 1 10 all true D",
            "sdudp 5 1 1 10 odd true D",
            "sdudp 5 20 1 10 all true A",
            "tcp 5 1 1 10 - false A",
        ]
    );
    assert_eq!(runs.rows.len(), cells.rows.len(), "one run per quick cell");
    let num = |r: &Vec<String>, c: &str| -> f64 { r[runs.col(c)].parse().unwrap() };
    let mut retransmitted = 0.0;
    for r in &runs.rows {
        let payload = num(r, "files") * num(r, "file_bytes");
        assert_eq!(r[runs.col("delivered_exact")], "true", "{r:?}");
        assert!(payload >= 300_000.0, "{r:?}");
        // Four inter-switch links, counted both ways; each carries at least
        // the payload, and the mean is their total over four.
        assert!(num(r, "bytes_per_switch") >= payload, "{r:?}");
        assert!(
            (num(r, "link_bytes") / 4.0 - num(r, "bytes_per_switch")).abs() <= 0.1,
            "{r:?}"
        );
        assert!(num(r, "frames_per_switch") > 0.0, "{r:?}");
        assert!(num(r, "seconds") > 0.0, "{r:?}");
        let computed = num(r, "h2h_loss_computed");
        assert!((computed - (1.0 - 0.99f64.powi(4))).abs() < 1e-4, "{r:?}");
        let measured = num(r, "h2h_loss_measured");
        assert!((0.0..0.5).contains(&measured), "{r:?}");
        if r[0] == "sdudp" {
            retransmitted += num(r, "engine_retransmitted");
        } else {
            assert_eq!(num(r, "engine_retransmitted"), 0.0, "{r:?}");
        }
    }
    // 1 % loss on four links: the engines repaired something.
    assert!(retransmitted > 0.0, "{:?}", runs.rows);
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for section in [
        "Figs. 7–9",
        "Table 2",
        "Fig. 10",
        "§IV-E",
        "Fig. 11",
        "the QUIC proxy",
    ] {
        assert!(summary.contains(section), "{section}: {summary}");
    }
    // Each comparison found its partner cell.
    for row in [
        "| 5 | 1 ms | 1 % | 10 Mbit/s | A |",
        "| 5 | odd | D |",
        "| 5 | 1 % | A |",
    ] {
        assert!(summary.contains(row), "{row}: {summary}");
    }
    // The three carriers' row found TCP and SDUDP on the QUIC proxy's line,
    // and all three delivered exactly.
    let proxy = summary
        .split("the QUIC proxy (not in the paper)")
        .nth(1)
        .unwrap();
    assert!(
        proxy
            .lines()
            .any(|l| l.starts_with("| 5 | 1 ms | 1 % | 10 Mbit/s | A |")
                && l.ends_with("| true / true / true |")
                && !l.contains(" - /")),
        "{proxy}"
    );
}
