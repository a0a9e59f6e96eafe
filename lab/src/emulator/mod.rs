//! The native link emulator of quicsdn-lab.
//!
//! An emulated link joins two network namespaces. Each side has a persistent TAP device
//! with an IPv4 address and a static neighbour entry for the other side (so ARP never
//! crosses the lossy link). One forwarder process per link holds both TAP file descriptors
//! and moves frames between them through a per-direction impairment model: delay, jitter
//! (with or without reordering), Bernoulli or Gilbert–Elliott loss, rate limit with a
//! drop-tail queue, link down/up. Every setting changes at runtime over the link's Unix
//! control socket without disturbing the connections crossing it.
//!
//! # Layers
//! - [`model`]: the sans-IO state machine of one direction ([`model::Pipe`]) with an
//!   injected clock (`now` arguments) and RNG ([`rng::RandomSource`]); counters per
//!   protocol class ([`classify`]). All semantics are documented and unit-tested there.
//! - [`forwarder`]: the process: epoll + timerfd (absolute deadlines) + TAP reads/writes.
//! - [`wake`]: when to arm the timer, early by the host's measured wake-up lateness.
//! - [`control`]: the JSON control protocol, [`LinkControl`] client, [`LinkReport`].
//! - [`link`]: TAP setup, spawning and stopping forwarders, records for teardown.
//! - [`cli`]: `quicsdn-lab emulate …`, `link …`, `bench emulator`.
//! - [`traffic`]: UDP sender/receiver in namespaces, used by the tests and the benchmark.
//!
//! # API for the rest of the lab
//! ```no_run
//! use quicsdn_lab::emulator::{self, DirPatch, DirSettings, LinkSpec, LossModel};
//! # fn main() -> anyhow::Result<()> {
//! // Both namespaces must exist. TAP names default to "<name>a"/"<name>b" (≤ 15 chars).
//! let mut spec = LinkSpec::new(
//!     "qsdn-c1", "qsdn-sw1", "qsdn-ctl",
//!     "10.99.1.1".parse()?, "10.99.1.2".parse()?,
//! )
//! .with_settings(DirSettings {
//!     delay_ns: 25_000_000,
//!     loss: LossModel::Bernoulli { p: 0.01 },
//!     ..Default::default()
//! });
//! spec.run_dir = "/run/quicsdn-lab/emulator".into(); // the default
//! // Creates the TAPs, addresses and neighbours, starts the forwarder, waits until it
//! // forwards, writes <run_dir>/<name>.json. The forwarder outlives the caller.
//! let rec = emulator::create_link(&spec, &emulator::link::default_exe()?)?;
//! // Runtime changes (no connection is dropped):
//! rec.control().set_both(DirPatch { delay_ns: Some(50_000_000), ..Default::default() })?;
//! rec.control().set(Some(DirPatch { up: Some(false), ..Default::default() }), None)?;
//! // Counters, with the wire-accounting convention stated in the report:
//! let report = rec.control().show()?.report(&emulator::Accounting::default());
//! println!("{}", serde_json::to_string_pretty(&report)?);
//! // Teardown by recorded PID (checked against /proc cmdline) and TAP names; idempotent.
//! emulator::destroy_link(&rec)?;
//! // …or after a crash, from the record file alone:
//! emulator::destroy_link_by_name(&spec.run_dir, "qsdn-c1")?;
//! # Ok(()) }
//! ```
//! `create_link` takes the path of the `quicsdn-lab` executable because the forwarder is
//! that binary's hidden `emulate run --spec FILE` subcommand; inside `quicsdn-lab` use
//! [`link::default_exe`], in integration tests `env!("CARGO_BIN_EXE_quicsdn-lab")`.
//!
//! # Wire accounting
//! Raw counters ([`model::Tally`]) hold frames, frame bytes (14-byte Ethernet header, no
//! FCS: identical to tcpdump and interface counters), TCP/UDP payload bytes and the padding
//! short frames would need. [`Accounting`] turns them into `wire_bytes` with a stated
//! per-frame physical overhead (default 24 = preamble 8 + FCS 4 + gap 12; the quicSDN
//! paper's Table 1 uses 28); every [`LinkReport`] carries the convention it used.

pub mod bench;
pub mod classify;
pub mod cli;
pub mod control;
pub mod forwarder;
pub mod link;
pub mod model;
pub mod nat;
pub mod rng;
pub mod sys;
pub mod traffic;
pub mod units;
pub mod wake;

pub use classify::{Class, Classifier};
pub use control::{Accounting, DirPatch, LinkControl, LinkReport, LinkState};
pub use link::{
    LinkRecord, LinkSpec, create_link, destroy_link, destroy_link_by_name, restart_forwarder,
    spawn_forwarder,
};
pub use model::{DirSettings, JitterDist, LossModel};
pub use nat::{NatSettings, NatState, Side};
