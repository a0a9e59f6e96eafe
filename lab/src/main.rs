//! `quicsdn-lab up|down|status`: see `docs/lab.md`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use quicsdn_lab::control_link::{parse_duration, parse_percent, parse_rate};
use quicsdn_lab::controller::ControllerKind;
use quicsdn_lab::emulator;
use quicsdn_lab::state::DEFAULT_RUN_DIR;
use quicsdn_lab::topology::{self, DEFAULT_PREFIX, DownOutcome, LabConfig, UpAction};
use quicsdn_lab::transport::Transport;

#[derive(Parser)]
#[command(
    name = "quicsdn-lab",
    version,
    about = "An emulated SDN testbed: Open vSwitch instances, a controller, hosts, control links (needs root)"
)]
struct Cli {
    /// Name prefix of the lab's namespaces and state (labs with different prefixes coexist).
    #[arg(long, global = true, default_value = DEFAULT_PREFIX)]
    prefix: String,
    /// Where labs record their state, OVS files and logs.
    #[arg(long, global = true, env = "QUICSDN_LAB_RUN_DIR", default_value = DEFAULT_RUN_DIR)]
    run_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a lab (a no-op if the same lab is already up).
    Up(UpArgs),
    /// Remove everything a lab created, by recorded names and PIDs (idempotent).
    Down,
    /// Show what is up, link settings and counters.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run one workload over `tcp` and over `quic` and compare what each put on
    /// the control links (builds and removes its own labs).
    Demo(quicsdn_lab::demo::DemoArgs),
    /// Standalone emulated links: `emulate up|down|restart`.
    Emulate(emulator::cli::EmulateArgs),
    /// Change or inspect a running emulated link: `link set|show|reset`.
    Link(emulator::cli::LinkArgs),
    /// The bicast paper's multihomed lab (two emulated paths, OVS group of type
    /// ALL, an HTTP server, the QUIC proxy pair): `multihomed up|down|status`.
    Multihomed(quicsdn_lab::multihomed_cmd::MultihomedArgs),
    /// A QUIC-LB load balancer in front of several controller agents (each with
    /// its own `--server-id`): routes by the server id in the connection IDs,
    /// else by the switch's address (docs/scale.md).
    Balance(quicsdn_lab::balancer::BalanceArgs),
    /// Run a benchmark (prints numbers; needs release builds for meaningful ones).
    #[command(subcommand)]
    Bench(Bench),
    /// The quicSDN overhead model (Eqs. 1-5): Fig. 2, and validation against a file
    /// transfer and the overhead grid.
    Model(quicsdn_lab::bench::modelcmd::ModelArgs),
    /// Gather the latest bench results into one markdown report.
    Report(quicsdn_lab::bench::report::ReportArgs),
}

#[derive(Subcommand)]
enum Bench {
    /// Agents against direct TCP on loopback: messages/s and latency.
    Relay(quicsdn_lab::bench::relay::RelayArgs),
    /// Bulk throughput through the TCP↔QUIC proxy pair (`quicsdn proxy`) on
    /// loopback against direct TCP, with CPU per GB.
    Proxy(quicsdn_lab::bench::proxy::ProxyArgs),
    /// The bicast paper's Fig. 8: time to download a file over the multihomed lab
    /// (two emulated paths, OVS group of type ALL) vs loss, unicast and bicast,
    /// TCP (CUBIC, BBR) and QUIC through the proxy pair (BBR, CUBIC), sha256-checked.
    Bicast(quicsdn_lab::bench::bicast::BicastArgs),
    /// Control-channel bicast: a real OVS's control channel through the agents
    /// over two paths (every packet on both) against one path; ECHO round
    /// trips and flow-install delay under loss on one or both paths and a cut.
    ControlBicast(quicsdn_lab::bench::control_bicast::ControlBicastArgs),
    /// Bounded memory under a stalled peer: a controller that reads nothing under a
    /// PACKET_IN flood, a switch that reads nothing under a FLOW_MOD storm; agents'
    /// RSS, echo through the priority lane, and an exactly-once audit afterwards.
    Stall(quicsdn_lab::bench::stall::StallArgs),
    /// Fault soak with a message audit: real OVS and os-ken through the agents,
    /// sequence-stamped OpenFlow both ways, faults on a schedule (loss bursts,
    /// link down, kill -9 of either agent, controller and OVS restarts, NAT
    /// rebinding); every message exactly once and in order or its session
    /// visibly reset, and the final flow table as the controller believes it.
    Soak(quicsdn_lab::bench::soak::SoakArgs),
    /// Head-of-line blocking with real OVS: echo RTT during a stats storm, and
    /// PACKET_IN delay, over tcp, quic ordered and quic safe.
    Hol(quicsdn_lab::bench::hol::HolArgs),
    /// Reconnect storm: restart the controller agent under hundreds of switches;
    /// time until every switch is back, with and without 0-RTT and admission
    /// control, and the controller agent's CPU and memory per connection.
    Storm(quicsdn_lab::bench::storm::StormArgs),
    /// Emulator capacity: UDP blasted both ways through an unimpaired link; prints
    /// frames/s per direction and forwarder CPU time per frame.
    Emulator(emulator::bench::BenchOpts),
    /// Control-traffic overhead per transport, rate, loss and RTT (journal Figs. 8–9).
    Overhead(quicsdn_lab::bench::overhead::OverheadArgs),
    /// Message delivery delay per transport, size pair, RTT and loss (journal Fig. 10).
    Delay(quicsdn_lab::bench::delay::DelayArgs),
    /// Flow installation, queue configuration and statistics polling with real OVS
    /// (preprint Table I).
    Table1(quicsdn_lab::bench::table1::Table1Args),
    /// TCP vs UDP latency: echo, FLOW_MOD, stats request, with loss and delay (the OpenFlow-over-UDP paper's Table 2).
    Table2(quicsdn_lab::bench::table2::Table2Args),
    /// The agents' overhead settings (coalescing, ACK frequency, zero-length
    /// connection IDs): overhead and delay of each.
    Tuning(quicsdn_lab::bench::tuning::TuningArgs),
    /// Connection migration during a host-to-host transfer with stats polling
    /// (preprint Fig. 6): the switch is re-addressed mid-transfer, tcp vs quic.
    Migration(quicsdn_lab::bench::migration::MigrationArgs),
    /// Time from OVS's new connection to the first OpenFlow message delivered,
    /// in RTTs: quic with and without 0-RTT, tcp, tls.
    Reconnect(quicsdn_lab::bench::reconnect::ReconnectArgs),
    /// SDUDP against TCP over a line of real OVS switches (the SDUDP paper's
    /// Figs. 7–11 and Table 2): load per switch, host-to-host loss,
    /// accumulation, engine subsets, time at 10 Mbit/s.
    Sdudp(quicsdn_lab::bench::sdudp::SdudpBenchArgs),
}

#[derive(clap::Args)]
struct UpArgs {
    /// Number of switches, connected in a line.
    #[arg(long, default_value_t = 1)]
    switches: u32,
    /// Hosts attached to each switch.
    #[arg(long, default_value_t = 2)]
    hosts_per_switch: u32,
    /// One-way delay of each control link, per direction (e.g. 25ms).
    #[arg(long, value_parser = parse_duration)]
    delay: Option<std::time::Duration>,
    /// Delay jitter, per direction (e.g. 5ms).
    #[arg(long, value_parser = parse_duration)]
    jitter: Option<std::time::Duration>,
    /// Random loss, per direction (e.g. 1%).
    #[arg(long, value_parser = parse_percent)]
    loss: Option<f64>,
    /// Rate limit, per direction (e.g. 100mbit).
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// tcp, tls, quic or kcptun.
    #[arg(long, default_value = "quic")]
    transport: Transport,
    /// quic: the agents' stream mode (ordered or rr:N).
    #[arg(long)]
    streams: Option<String>,
    /// quic: an extra quicsdn option for the agents (repeatable), e.g.
    /// --agent-arg=--coalesce=10ms.
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// Make each switch's OVSDB server reachable from the controller namespace over
    /// the transport (docs/lab.md).
    #[arg(long)]
    ovsdb: bool,
    /// osken, ryu, faucet or none.
    #[arg(long, default_value = "osken")]
    controller: ControllerKind,
    /// OpenFlow port the controller listens on (in the controller namespace).
    #[arg(long, default_value_t = 6653)]
    openflow_port: u16,
    /// Controller venvs directory (default: $QUICSDN_VENV_DIR or <repo>/.venv).
    #[arg(long)]
    venv_dir: Option<PathBuf>,
    /// flat (a host on every switch) or line (the SDUDP paper's: host A on the
    /// first switch, host B on the last, emulated data links).
    #[arg(long, default_value = "flat")]
    topology: quicsdn_lab::state::Topology,
    /// line: one-way delay of each data link, per direction (e.g. 20ms).
    #[arg(long, value_parser = parse_duration)]
    link_delay: Option<std::time::Duration>,
    /// line: random loss of each data link, per direction (e.g. 1%).
    #[arg(long, value_parser = parse_percent)]
    link_loss: Option<f64>,
    /// line: rate of each data link, per direction (e.g. 10mbit).
    #[arg(long, value_parser = parse_rate)]
    link_rate: Option<u64>,
    /// line: carry the hosts' TCP as SDUDP between the edge switches (docs/sdudp.md).
    #[arg(long)]
    sdudp: bool,
    /// --sdudp: switches with an engine: all, odd or a list such as 1,5,9
    /// (the edges always have one).
    #[arg(long, default_value = "all", requires = "sdudp")]
    engines: String,
    /// --sdudp: send each read from a host at once instead of filling datagrams.
    #[arg(long, requires = "sdudp")]
    no_accumulate: bool,
    /// On failure, leave what was built in place for debugging.
    #[arg(long)]
    keep_on_error: bool,
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Up(a) => {
            let mut cfg = LabConfig::new(&cli.prefix);
            cfg.run_dir = cli.run_dir;
            cfg.venv_dir = a.venv_dir;
            cfg.keep_on_error = a.keep_on_error;
            let s = &mut cfg.settings;
            s.switches = a.switches;
            s.hosts_per_switch = a.hosts_per_switch;
            s.impairment.delay = a.delay;
            s.impairment.jitter = a.jitter;
            s.impairment.loss_percent = a.loss;
            s.impairment.rate_bps = a.rate;
            s.transport = a.transport;
            s.controller = a.controller;
            s.openflow_port = a.openflow_port;
            s.streams = a.streams;
            s.agent_args = a.agent_args;
            s.ovsdb = a.ovsdb;
            s.topology = a.topology;
            s.link.delay = a.link_delay;
            s.link.loss_percent = a.link_loss;
            s.link.rate_bps = a.link_rate;
            if a.sdudp {
                s.sdudp = Some(quicsdn_lab::state::SdudpSettings {
                    engines: quicsdn_lab::state::SdudpSettings::parse_engines(
                        &a.engines, a.switches,
                    )?,
                    accumulate: !a.no_accumulate,
                });
            }
            let out = topology::up(&cfg)?;
            let p = &cfg.prefix;
            match out.action {
                UpAction::Created => println!("lab {p} is up"),
                UpAction::AlreadyUp => println!("lab {p} was already up with these settings"),
                UpAction::Replaced { reason } => {
                    println!("lab {p} is up (replaced the previous one: {reason})")
                }
            }
            if let Some(st) = topology::status(&cfg.run_dir, p)? {
                print!("{}", st.render());
            }
        }
        Command::Down => match topology::down(&cli.run_dir, &cli.prefix)? {
            DownOutcome::Removed => println!("lab {} removed", cli.prefix),
            DownOutcome::NothingToDo => println!("no lab {} recorded; nothing to do", cli.prefix),
        },
        Command::Bench(Bench::Relay(a)) => quicsdn_lab::bench::relay::run(a)?,
        Command::Bench(Bench::Proxy(a)) => quicsdn_lab::bench::proxy::run(a)?,
        Command::Bench(Bench::Bicast(a)) => quicsdn_lab::bench::bicast::run(a)?,
        Command::Bench(Bench::ControlBicast(a)) => quicsdn_lab::bench::control_bicast::run(a)?,
        Command::Multihomed(a) => quicsdn_lab::multihomed_cmd::run(a)?,
        Command::Bench(Bench::Soak(a)) => {
            quicsdn_lab::bench::soak::run(a)?;
        }
        Command::Bench(Bench::Stall(a)) => {
            quicsdn_lab::bench::stall::run(a)?;
        }
        Command::Bench(Bench::Hol(a)) => quicsdn_lab::bench::hol::run(a)?,
        Command::Bench(Bench::Storm(a)) => quicsdn_lab::bench::storm::run(a)?,
        Command::Bench(Bench::Emulator(o)) => emulator::bench::run(o)?,
        Command::Bench(Bench::Overhead(a)) => quicsdn_lab::bench::overhead::run(a)?,
        Command::Bench(Bench::Delay(a)) => quicsdn_lab::bench::delay::run(a)?,
        Command::Bench(Bench::Table1(a)) => quicsdn_lab::bench::table1::run(a)?,
        Command::Bench(Bench::Table2(a)) => quicsdn_lab::bench::table2::run(a)?,
        Command::Bench(Bench::Tuning(a)) => quicsdn_lab::bench::tuning::run(a)?,
        Command::Bench(Bench::Migration(a)) => quicsdn_lab::bench::migration::run(a)?,
        Command::Bench(Bench::Reconnect(a)) => quicsdn_lab::bench::reconnect::run(a)?,
        Command::Bench(Bench::Sdudp(a)) => quicsdn_lab::bench::sdudp::run(a)?,
        Command::Emulate(a) => emulator::cli::emulate(a)?,
        Command::Balance(a) => quicsdn_lab::balancer::run(a)?,
        Command::Demo(a) => quicsdn_lab::demo::run(a)?,
        Command::Model(a) => quicsdn_lab::bench::modelcmd::run(a)?,
        Command::Report(a) => quicsdn_lab::bench::report::run(a)?,
        Command::Link(a) => emulator::cli::link(a)?,
        Command::Status { json } => match topology::status(&cli.run_dir, &cli.prefix)? {
            Some(st) if json => println!("{}", serde_json::to_string_pretty(&st)?),
            Some(st) => print!("{}", st.render()),
            None if json => println!("null"),
            None => println!("no lab {} is up", cli.prefix),
        },
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quicsdn-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}
