//! Replays, on the stable toolchain, every input the fuzzers keep:
//! `fuzz/regressions/TARGET/*` (crashes found and fixed, and inputs worth
//! keeping) and every seed (real OpenFlow messages from os-ken's test data,
//! which `scripts/test` installs with the controllers' venvs).

use quicsdn_fuzz_targets::{TARGETS, seeds};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(target: &str, name: &str, bytes: &[u8]) {
    let t = TARGETS
        .iter()
        .find(|t| t.name == target)
        .unwrap_or_else(|| panic!("{name}: no fuzz target {target:?}"));
    let result = std::panic::catch_unwind(|| (t.run)(bytes));
    assert!(result.is_ok(), "{target}: {name} fails again");
}

#[test]
fn every_kept_fuzz_input_passes() {
    let dir = repo().join("fuzz/regressions");
    let mut replayed = 0;
    for target in std::fs::read_dir(&dir)
        .expect("fuzz/regressions exists")
        .flatten()
    {
        let name = target.file_name().to_string_lossy().into_owned();
        for input in std::fs::read_dir(target.path())
            .expect("a target directory")
            .flatten()
        {
            let bytes = std::fs::read(input.path()).expect("readable");
            run(&name, &input.path().display().to_string(), &bytes);
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no regression inputs under {}", dir.display());
}

#[test]
fn every_seed_passes() {
    let osken = seeds::osken_tests(&repo()).expect(
        "os-ken's test data: run scripts/controllers-venv osken (scripts/test does), or set QUICSDN_OSKEN_TESTS",
    );
    let seeds = seeds::seeds(Some(&osken));
    let openflow = seeds
        .iter()
        .filter(|(t, _)| *t == "openflow_fields")
        .count();
    assert!(
        openflow >= 300,
        "only {openflow} os-ken OpenFlow messages found"
    );
    for (i, (target, bytes)) in seeds.iter().enumerate() {
        run(target, &format!("seed {i}"), bytes);
    }
    for t in TARGETS {
        assert!(
            seeds.iter().any(|(name, _)| *name == t.name),
            "no seeds for {}",
            t.name
        );
    }
}
