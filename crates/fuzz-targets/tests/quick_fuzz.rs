//! The quick version of `scripts/fuzz`, on the stable toolchain: every fuzz
//! target's body gets a fixed number of inputs made by mutating its real seeds
//! (os-ken's OpenFlow test data and quicsdn's own messages) with the mutations
//! libFuzzer starts with: byte flips, inserted, erased and duplicated runs,
//! truncation and splicing two seeds.
//!
//! It is not coverage-guided; the long runs are `scripts/fuzz` (nightly,
//! libFuzzer), whose crashes land in `fuzz/regressions/` and are replayed by
//! `tests/regressions.rs`. This test catches what a change breaks near the
//! seeds, without a nightly toolchain or a second build of the dependencies.
//! The generator is seeded, so a run is deterministic; a failing input is
//! shrunk and printed as hex, to be kept under `fuzz/regressions/TARGET/`.
//!
//! `QUICSDN_QUICK_FUZZ_CASES` sets the inputs per target (default 2,000).

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use quicsdn_fuzz_targets::{TARGETS, seeds};
use std::path::Path;

#[derive(Debug, Clone)]
enum Mutation {
    /// XOR the byte at this position (modulo the length) with a non-zero mask.
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Erase(usize, usize),
    /// Copy a run of the input to another place in it.
    Duplicate(usize, usize, usize),
    Truncate(usize),
    /// Append the tail of another seed of the same target.
    Splice(usize, usize),
    /// Set a byte to a value parsers treat specially (0, 0xff, 0x7f, 0x80).
    Interesting(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = any::<usize>();
    prop_oneof![
        4 => (pos, 1u8..=255).prop_map(|(p, m)| Mutation::Flip(p, m)),
        2 => (pos, proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(p, b)| Mutation::Insert(p, b)),
        2 => (pos, 1usize..32).prop_map(|(p, n)| Mutation::Erase(p, n)),
        1 => (pos, pos, 1usize..64).prop_map(|(f, t, n)| Mutation::Duplicate(f, t, n)),
        1 => pos.prop_map(Mutation::Truncate),
        1 => (pos, pos).prop_map(|(s, p)| Mutation::Splice(s, p)),
        2 => (pos, prop::sample::select(vec![0u8, 0xff, 0x7f, 0x80])).prop_map(|(p, v)| Mutation::Interesting(p, v)),
    ]
}

fn apply(mut input: Vec<u8>, mutations: &[Mutation], seeds: &[&[u8]]) -> Vec<u8> {
    for m in mutations {
        let len = input.len();
        let at = |p: usize| if len == 0 { 0 } else { p % len };
        match m {
            Mutation::Flip(p, mask) if len > 0 => input[at(*p)] ^= mask,
            Mutation::Interesting(p, v) if len > 0 => input[at(*p)] = *v,
            Mutation::Insert(p, bytes) => {
                let p = if len == 0 { 0 } else { p % (len + 1) };
                input.splice(p..p, bytes.iter().copied());
            }
            Mutation::Erase(p, n) if len > 0 => {
                let p = at(*p);
                input.drain(p..(p + n).min(len));
            }
            Mutation::Duplicate(from, to, n) if len > 0 => {
                let from = at(*from);
                let run: Vec<u8> = input[from..(from + n).min(len)].to_vec();
                let to = at(*to);
                input.splice(to..to, run);
            }
            Mutation::Truncate(p) => input.truncate(if len == 0 { 0 } else { p % len }),
            Mutation::Splice(s, p) if !seeds.is_empty() => {
                let other = seeds[s % seeds.len()];
                let p = if other.is_empty() { 0 } else { p % other.len() };
                input.extend_from_slice(&other[p..]);
            }
            _ => {}
        }
        // libFuzzer's -max_len in scripts/fuzz.
        input.truncate(8192);
    }
    input
}

#[test]
fn every_target_survives_mutated_seeds() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let osken = seeds::osken_tests(&repo).expect(
        "os-ken's test data: run scripts/controllers-venv osken (scripts/test does), or set QUICSDN_OSKEN_TESTS",
    );
    let all = seeds::seeds(Some(&osken));
    let cases: u32 = std::env::var("QUICSDN_QUICK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    for (index, target) in TARGETS.iter().enumerate() {
        let mine: Vec<&[u8]> = all
            .iter()
            .filter(|(name, _)| *name == target.name)
            .map(|(_, bytes)| bytes.as_slice())
            .collect();
        assert!(!mine.is_empty(), "no seeds for {}", target.name);
        let mut runner = TestRunner::new(Config {
            cases,
            // A different fixed seed per target: the same inputs on every run.
            rng_seed: RngSeed::Fixed(0x5eed_0000 + index as u64),
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (0..mine.len(), proptest::collection::vec(mutation(), 1..8));
        let result = runner.run(&strategy, |(seed, mutations)| {
            let input = apply(mine[seed].to_vec(), &mutations, &mine);
            std::panic::catch_unwind(|| (target.run)(&input))
                .map_err(|_| TestCaseError::fail(format!("input (hex): {}", hex(&input))))
        });
        if let Err(e) = result {
            panic!(
                "{}: a mutated seed breaks the target; keep the input under fuzz/regressions/{}/: {e}",
                target.name, target.name
            );
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
