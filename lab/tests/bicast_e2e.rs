//! `quicsdn-lab bench bicast --quick` on the multihomed lab: real OVS (two
//! instances), os-ken with `controllers/bicast.py` through the quicsdn agents,
//! two emulated paths with loss, a real HTTP server and curl, TCP CUBIC direct
//! and QUIC bbr-lt (the proxy's default) through the proxy pair, unicast and
//! bicast. Checks what the run produced (never how fast): every download
//! arrived with the file's sha256, bicast put the server's packets on both
//! paths (the emulator's counters), unicast on path A only, and OVS holds the
//! group of type ALL the controller installed.

mod common;

use common::{lab_ok, require_root, serial};
use quicsdn_lab::bench::bicast::CSV_HEADER;
use quicsdn_lab::bench::out::Csv;

const BYTES: u64 = 1 << 20;

#[test]
fn bench_bicast_quick_downloads_intact_over_one_and_both_paths() {
    let _s = serial();
    require_root();
    let out = tempfile::tempdir().unwrap();
    lab_ok(&[
        "bench",
        "bicast",
        "--quick",
        "--bytes=1M",
        "--prefix=q14bc",
        &format!("--out={}", out.path().display()),
    ]);

    let csv = Csv::read(&out.path().join("bicast.csv"), CSV_HEADER).unwrap();
    let c = |n: &str| csv.col(n);
    // 2 modes x 2 variants x 2 loss rates, one download each.
    assert_eq!(csv.rows.len(), 8, "{}", csv.render());
    let num = |r: &Vec<String>, n: &str| r[c(n)].parse::<u64>().unwrap();
    for r in &csv.rows {
        let status = r[c("status")].as_str();
        // A lossy TCP CUBIC download may time out on a loaded machine; a
        // lossless one, and every QUIC one, must arrive.
        let may_time_out = r[c("variant")] == "tcp-cubic" && r[c("loss_pct")] != "0";
        assert!(
            status == "ok" || (may_time_out && status == "timeout"),
            "{r:?}"
        );
        if status != "ok" {
            continue;
        }
        assert_eq!(r[c("sha256_ok")], "true", "{r:?}");
        assert_eq!(num(r, "bytes"), BYTES, "{r:?}");
        let (a, b) = (num(r, "path_a_down_bytes"), num(r, "path_b_down_bytes"));
        match r[c("mode")].as_str() {
            // Every server packet on both paths: each carried the whole file.
            "bicast" => assert!(a >= BYTES && b >= BYTES, "{r:?}"),
            // Path A only.
            "unicast" => assert!(a >= BYTES && b < BYTES / 100, "{r:?}"),
            m => panic!("mode {m}"),
        }
        // The client's packets (requests, ACKs) take path A in both modes.
        assert!(num(r, "path_a_up_bytes") > 0, "{r:?}");
        assert!(num(r, "path_b_up_bytes") < BYTES / 100, "{r:?}");
    }

    // What the controller installed, read back from OVS.
    let bicast = std::fs::read_to_string(out.path().join("tables-bicast.txt")).unwrap();
    let (server_side, client_side) = bicast.split_once("client-side switch").unwrap();
    assert!(
        server_side.contains("group_id=1,type=all,bucket=actions=output:2,bucket=actions=output:3"),
        "{bicast}"
    );
    assert!(
        server_side.contains("in_port=1 actions=group:1"),
        "{bicast}"
    );
    assert!(
        client_side.contains("in_port=3 actions=output:1"),
        "{bicast}"
    );
    let unicast = std::fs::read_to_string(out.path().join("tables-unicast.txt")).unwrap();
    assert!(!unicast.contains("type=all"), "{unicast}");
    assert!(unicast.contains("in_port=1 actions=output:2"), "{unicast}");

    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(summary.contains("## Targets"), "{summary}");
    assert!(summary.contains("## Network cost of bicast"), "{summary}");
}
