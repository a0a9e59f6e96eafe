//! quicsdn-lab
use clap::{Parser, Subcommand};
use quicsdn_lab::emulator;

#[derive(Parser, Debug)]
#[command(
    name = "quicsdn-lab",
    version,
    about = "An emulated SDN testbed on one Linux machine"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Standalone emulated links: `emulate up|down|restart`.
    Emulate(emulator::cli::EmulateArgs),
    /// Change or inspect a running emulated link: `link set|show|reset`.
    Link(emulator::cli::LinkArgs),
    /// Benchmarks: `bench emulator`.
    Bench(emulator::cli::BenchArgs),
}

fn main() {
    let result = match Cli::parse().cmd {
        Command::Emulate(a) => emulator::cli::emulate(a),
        Command::Link(a) => emulator::cli::link(a),
        Command::Bench(a) => emulator::cli::bench(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
