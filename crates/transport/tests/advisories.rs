//! The RustSec advisories against the QUIC stack quicsdn trusts, checked
//! against the versions Cargo.lock pins, by `cargo test` alone. The whole
//! database is checked by scripts/audit (cargo-deny, against the snapshot in
//! third_party/rustsec-advisory-db), which `scripts/test` runs first; but
//! quinn and quinn-proto are vendored path crates (third_party/), which
//! cargo-deny does not match against advisories, so for them this is the check.
//!
//! Each row is (advisory, crate, first fixed version, what it was), read from
//! the advisory's own `[versions] patched` field. A snapshot refresh that
//! brings a new advisory against these crates fails
//! `every_advisory_in_the_vendored_snapshot_has_a_row` until its row is added.

/// A version as (major, minor, patch).
type Version = (u64, u64, u64);

const FIXED_IN: &[(&str, &str, Version, &str)] = &[
    (
        "RUSTSEC-2026-0185",
        "quinn-proto",
        (0, 11, 15),
        "remote memory exhaustion from unbounded out-of-order stream reassembly",
    ),
    (
        "RUSTSEC-2026-0037",
        "quinn-proto",
        (0, 11, 14),
        "denial of service in Quinn endpoints",
    ),
    (
        "RUSTSEC-2024-0373",
        "quinn-proto",
        (0, 11, 7),
        "Endpoint::retry() calls can lead to panicking",
    ),
    (
        "RUSTSEC-2023-0063",
        "quinn-proto",
        (0, 10, 5),
        "denial of service in Quinn servers",
    ),
    (
        "RUSTSEC-2021-0035",
        "quinn",
        (0, 7, 0),
        "quinn invalidly assumes the memory layout of std::net::SocketAddr",
    ),
];

/// Every version of `name` in a Cargo.lock.
fn locked_versions(lock: &str, name: &str) -> Vec<Version> {
    let mut out = Vec::new();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == format!("name = \"{name}\"") {
            let v = lines.next().expect("a version line follows the name");
            let v = v
                .trim()
                .strip_prefix("version = \"")
                .expect("version")
                .trim_end_matches('"');
            let mut parts = v
                .split(['.', '-', '+'])
                .map(|p| p.parse::<u64>().unwrap_or(0));
            out.push((
                parts.next().unwrap_or(0),
                parts.next().unwrap_or(0),
                parts.next().unwrap_or(0),
            ));
        }
    }
    out
}

#[test]
fn the_pinned_quic_stack_has_every_known_advisory_fixed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    for (id, krate, fixed, what) in FIXED_IN {
        let versions = locked_versions(&text, krate);
        assert!(!versions.is_empty(), "Cargo.lock: no {krate} at all");
        for v in versions {
            assert!(
                v >= *fixed,
                "Cargo.lock: {krate} {v:?} is affected by {id} ({what}); fixed in {fixed:?}"
            );
        }
    }
}

#[test]
fn the_version_reader_reads_what_cargo_writes() {
    let lock = "[[package]]\nname = \"quinn-proto\"\nversion = \"0.11.13\"\nsource = \"x\"\n\n[[package]]\nname = \"quinn\"\nversion = \"0.11.12\"\n";
    assert_eq!(locked_versions(lock, "quinn-proto"), [(0, 11, 13)]);
    assert_eq!(locked_versions(lock, "quinn"), [(0, 11, 12)]);
    // 0.11.13 is below RUSTSEC-2026-0037's fix: the check would fail on it.
    assert!((0, 11, 13) < FIXED_IN[1].2);
}

/// The QUIC crates whose advisories the table must cover.
const QUIC_CRATES: &[&str] = &["quinn-proto", "quinn", "quinn-udp"];

#[test]
fn every_advisory_in_the_vendored_snapshot_has_a_row() {
    let db = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../third_party/rustsec-advisory-db/crates");
    let mut seen = 0;
    for krate in QUIC_CRATES {
        let Ok(dir) = std::fs::read_dir(db.join(krate)) else {
            continue; // no advisory was ever published against it
        };
        for file in dir {
            let path = file.unwrap().path();
            let id = path.file_stem().unwrap().to_str().unwrap().to_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let (_, row_krate, fixed, _) = FIXED_IN
                .iter()
                .find(|row| row.0 == id)
                .unwrap_or_else(|| panic!("{id} ({krate}) is in the snapshot but not in FIXED_IN"));
            assert_eq!(row_krate, krate, "{id}");
            let patched = text
                .lines()
                .find(|l| l.starts_with("patched = "))
                .unwrap_or_else(|| panic!("{}: no patched versions", path.display()));
            let fixed = format!("{}.{}.{}", fixed.0, fixed.1, fixed.2);
            assert!(
                patched.contains(&format!(">= {fixed}")),
                "{id}: FIXED_IN says fixed in {fixed}, the advisory says {patched}"
            );
            seen += 1;
        }
    }
    assert_eq!(
        seen,
        FIXED_IN.len(),
        "a FIXED_IN row has no advisory in the snapshot"
    );
}
