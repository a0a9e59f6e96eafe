//! `fuzz-seeds OUT_DIR`: writes every target's seed inputs to
//! `OUT_DIR/TARGET/seed-N` (`scripts/fuzz` seeds `fuzz/corpus/` with it).

use quicsdn_fuzz_targets::seeds;
use std::path::{Path, PathBuf};

fn main() {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fuzz-seeds OUT_DIR");
        std::process::exit(2);
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let osken = seeds::osken_tests(&repo);
    if osken.is_none() {
        eprintln!(
            "fuzz-seeds: os-ken's test data not found (run scripts/controllers-venv osken, or set QUICSDN_OSKEN_TESTS); writing quicsdn's own seeds only"
        );
    }
    let mut count = std::collections::BTreeMap::new();
    for (target, bytes) in seeds::seeds(osken.as_deref()) {
        let n = count.entry(target).or_insert(0);
        let dir = out.join(target);
        std::fs::create_dir_all(&dir).expect("create the corpus directory");
        std::fs::write(dir.join(format!("seed-{n}")), bytes).expect("write a seed");
        *n += 1;
    }
    for (target, n) in count {
        eprintln!("fuzz-seeds: {target}: {n} seeds");
    }
}
