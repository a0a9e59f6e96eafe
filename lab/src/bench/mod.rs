//! Benchmarks: commands that measure and print numbers (never tests).

pub mod hol;
pub mod relay;
