//! `quicsdn-lab multihomed up|status|down`: the bicast lab as a standalone
//! command. Real OVS (two instances), os-ken with `controllers/bicast.py`
//! through the quicsdn agents, two emulated paths with 10 % loss, a real HTTP
//! server behind the QUIC proxy pair, and `curl` run by the test after `up`
//! has returned: the file arrives with its sha256, both paths carried it
//! (bicast), and `down` leaves no namespace, link or process behind.

mod common;

use std::path::Path;

use common::{lab_ok, require_root, serial};
use quicsdn_lab::emulator::{Accounting, LinkRecord};
use quicsdn_lab::multihomed_cmd::Record;
use quicsdn_lab::netns::Netns;

const PREFIX: &str = "q14mc";
const BYTES: u64 = 2 << 20;

fn lab(args: &[&str]) -> String {
    lab_ok(&[&["multihomed"], args].concat())
}

fn down_bytes(link: &str) -> u64 {
    let run_dir = Path::new(quicsdn_lab::emulator::link::DEFAULT_RUN_DIR);
    let rec = LinkRecord::load(run_dir, link).unwrap();
    let r = rec.control().show().unwrap().report(&Accounting::default());
    // a is the server-side switch: a_to_b is the server's direction.
    r.a_to_b.total.offered.bytes
}

#[test]
fn multihomed_up_serves_a_file_over_both_paths_and_down_removes_it() {
    let _s = serial();
    require_root();
    let up = lab(&[
        "up",
        &format!("--prefix={PREFIX}"),
        "--mode=bicast",
        "--variant=quic-bbr",
        "--rtt=20ms",
        "--loss=10%",
        "--file-size=2M",
    ]);
    assert!(up.contains("is up"), "{up}");
    let rec: Record =
        serde_json::from_str(&lab(&["status", &format!("--prefix={PREFIX}")])).unwrap();
    assert_eq!(rec.file_bytes, BYTES);
    let before = rec.links.clone().map(|l| down_bytes(&l));

    // The lab outlived the command: download through it now.
    let dest = tempfile::NamedTempFile::new().unwrap();
    let curl = Netns::named(&rec.client_netns)
        .command("curl")
        .args(["-sS", "--fail", "--max-time", "120", "-o"])
        .arg(dest.path())
        .arg(&rec.url)
        .output()
        .unwrap();
    assert!(
        curl.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    let got = quicsdn_lab::bench::bicast::sha256(dest.path()).unwrap();
    assert_eq!(got, rec.file_sha256, "the download arrived altered");
    // Bicast: each path carried at least the whole file server→client.
    for (i, l) in rec.links.iter().enumerate() {
        let carried = down_bytes(l) - before[i];
        assert!(carried >= BYTES, "path {l} carried {carried} bytes");
    }

    let down = lab(&["down", &format!("--prefix={PREFIX}")]);
    assert!(down.contains("removed"), "{down}");
    for ns in &rec.namespaces {
        assert!(!Netns::exists(ns), "namespace {ns} left behind");
    }
    for l in &rec.links {
        assert!(
            LinkRecord::load(Path::new(quicsdn_lab::emulator::link::DEFAULT_RUN_DIR), l).is_err(),
            "link {l} left behind"
        );
    }
    assert!(!rec.dir.exists(), "{} left behind", rec.dir.display());
    // Idempotent.
    let again = lab(&["down", &format!("--prefix={PREFIX}")]);
    assert!(again.contains("nothing to do"), "{again}");
}
