//! `quicsdn-lab demo`: the same SDN workload over `tcp` and over `quic`, and
//! what each put on the control links.
//!
//! For each transport it brings up a lab (by default 2 switches × 2 hosts, the
//! os-ken L2 learning app, 20 ms one-way delay and 1 % loss on every control
//! link in each direction), lets it settle, zeroes the control links'
//! counters, then runs one workload:
//!
//! * hosts ping each other across the switches (the first packets of each pair
//!   go to the controller as PACKET_INs and come back as PACKET_OUTs and
//!   FLOW_MODs);
//! * a burst of controller traffic: one host ARPs for 100 addresses nobody has,
//!   so every broadcast becomes a PACKET_IN at each switch and a flooding
//!   PACKET_OUT from the controller.
//!
//! It waits until the control links are quiet, reads the emulator's counters
//! (frames and wire bytes, both directions) and the OpenFlow bytes the
//! controller sent and received on its sockets (`ss`'s `bytes_acked` and
//! `bytes_received`, so retransmissions are not counted as payload), tears the
//! lab down, and prints the two side by side. Overhead = wire bytes − OpenFlow
//! bytes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::control_link::{Impairment, parse_duration, parse_percent};
use crate::controller::ControllerKind;
use crate::emulator::{Accounting, LinkState};
use crate::host::ping;
use crate::netns::Netns;
use crate::state::LabState;
use crate::topology::{self, LabConfig, host_ip};
use crate::transport::Transport;
use crate::wait::poll_until;

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Switches, in a line.
    #[arg(long, default_value_t = 2)]
    pub switches: u32,
    /// Hosts per switch.
    #[arg(long, default_value_t = 2)]
    pub hosts_per_switch: u32,
    /// One-way delay of each control link, per direction.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    pub delay: Duration,
    /// Random loss of each control link, per direction.
    #[arg(long, default_value = "1%", value_parser = parse_percent)]
    pub loss: f64,
    /// Physical bytes counted per frame on top of the Ethernet frame (24:
    /// preamble, FCS, inter-frame gap; the quicSDN paper's Table 1 uses 28).
    #[arg(long, default_value_t = 24)]
    pub overhead: u32,
    /// After the workload, count this long of the idle channel (OVS's echo and
    /// the transport's keep-alives) separately. 0s: skip.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub idle: Duration,
    /// An extra quicsdn option for both agents of the quic run (repeatable),
    /// e.g. --agent-arg=--keepalive=2s.
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Lab name prefix used for the demo's labs.
    #[arg(long = "demo-prefix", default_value = "qsdndemo")]
    pub prefix: String,
}

/// What one transport's run put on the control links.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    frames: u64,
    /// Frames without application data (ACKs, keep-alives; see
    /// `Classifier::is_ack_only`).
    ack_only_frames: u64,
    ack_only_bytes: u64,
    /// Connection setup and teardown (`FrameKind::Handshake`).
    handshake_frames: u64,
    handshake_bytes: u64,
    wire_bytes: u64,
    openflow_bytes: u64,
    /// The idle period after the workload: frames and wire bytes.
    idle_frames: u64,
    idle_bytes: u64,
}

impl Totals {
    fn overhead(&self) -> u64 {
        self.wire_bytes.saturating_sub(self.openflow_bytes)
    }

    /// Adds what the control links carried (both directions).
    fn add_links(&mut self, state: &LabState, acc: &Accounting) -> Result<()> {
        for st in link_states(state)? {
            let r = st.report(acc);
            for d in [&r.a_to_b, &r.b_to_a] {
                let o = &d.total.offered;
                self.frames += o.frames;
                self.ack_only_frames += o.ack_only_frames;
                self.ack_only_bytes += o.ack_only_wire_bytes;
                self.handshake_frames += o.handshake_frames;
                self.handshake_bytes += o.handshake_wire_bytes;
                self.wire_bytes += o.wire_bytes;
            }
        }
        Ok(())
    }
}

fn reset_counters(state: &LabState) -> Result<()> {
    for l in &state.control_links {
        l.emulator
            .as_ref()
            .context("control link without an emulator")?
            .control()
            .reset_counters()?;
    }
    Ok(())
}

/// Bytes the controller has sent (acknowledged) and received on its OpenFlow
/// connections, summed over connections, from `ss -ti` in its namespace.
fn controller_socket_bytes(ctl: &Netns, port: u16) -> Result<(u64, u64)> {
    let filter = format!("( sport = :{port} )");
    let out = ctl.exec(&["ss", "-tinH", "state", "established", &filter])?;
    let field = |line: &str, key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    // `ss -i` prints each socket's details on the line after its addresses.
    Ok(out.lines().fold((0, 0), |(sent, received), l| {
        (
            sent + field(l, "bytes_acked:"),
            received + field(l, "bytes_received:"),
        )
    }))
}

fn link_states(state: &LabState) -> Result<Vec<LinkState>> {
    state.control_links.iter().map(|l| l.state()).collect()
}

fn offered_frames(state: &LabState) -> Result<u64> {
    Ok(link_states(state)?
        .iter()
        .map(|s| {
            s.a_to_b.counters.total().offered.frames + s.b_to_a.counters.total().offered.frames
        })
        .sum())
}

/// Waits until no frame crossed any control link for `quiet`.
fn wait_quiet(state: &LabState, quiet: Duration) -> Result<()> {
    let mut last = (offered_frames(state)?, Instant::now());
    poll_until(
        "the control links to go quiet",
        Duration::from_secs(60),
        || {
            let now = offered_frames(state)?;
            if now != last.0 {
                last = (now, Instant::now());
            }
            Ok((last.1.elapsed() >= quiet).then_some(()))
        },
    )
}

fn workload(cfg: &LabConfig) -> Result<()> {
    let s = &cfg.settings;
    let host = |i: u32, j: u32| Netns::named(topology::host_netns(&cfg.prefix, i, j));
    // Every host on switch 1 pings the host with the same number on the last switch.
    for j in 1..=s.hosts_per_switch {
        let dst = host_ip(s.switches, j).to_string();
        let st = ping(&host(1, j), &dst, 5, 0.2)?;
        if st.received == 0 {
            bail!("h1-{j} could not reach {dst} over {}: {st:?}", s.transport);
        }
    }
    // The burst: one ARP broadcast for each of 100 absent addresses.
    let h = host(1, 1);
    h.sysctl("net.ipv4.neigh.eth0.mcast_solicit", "1")?;
    let script =
        "for i in $(seq 1 100); do ping -n -c 1 -W 1 10.0.250.$i >/dev/null 2>&1 & done; wait";
    h.exec(&["sh", "-c", script])?;
    Ok(())
}

fn run_one(args: &DemoArgs, transport: Transport, acc: &Accounting) -> Result<Totals> {
    let mut cfg = LabConfig::new(&args.prefix);
    let s = &mut cfg.settings;
    s.switches = args.switches;
    s.hosts_per_switch = args.hosts_per_switch;
    s.transport = transport;
    if transport == Transport::Quic {
        s.agent_args = args.agent_args.clone();
    }
    s.controller = ControllerKind::Osken;
    s.impairment = Impairment {
        delay: Some(args.delay),
        loss_percent: Some(args.loss),
        ..Impairment::default()
    };
    println!("\n== {transport}: bringing up the lab");
    let _ = topology::down(&cfg.run_dir, &cfg.prefix);
    let state = topology::up(&cfg)?.state;
    let result = (|| -> Result<Totals> {
        let ctl = Netns::named(&state.ctl_netns);
        // Settle: the handshakes are done when `up` returns; let echoes and the
        // first flow installs pass, then count from zero.
        wait_quiet(&state, Duration::from_millis(500))?;
        reset_counters(&state)?;
        let before = controller_socket_bytes(&ctl, cfg.settings.openflow_port)?;
        println!("== {transport}: workload (pings across the switches, then 100 ARP broadcasts)");
        workload(&cfg)?;
        wait_quiet(&state, Duration::from_millis(1500))?;
        let after = controller_socket_bytes(&ctl, cfg.settings.openflow_port)?;
        let mut t = Totals {
            openflow_bytes: (after.0 - before.0) + (after.1 - before.1),
            ..Totals::default()
        };
        t.add_links(&state, acc)?;
        if !args.idle.is_zero() {
            println!(
                "== {transport}: idle for {:?} (OVS's echo, keep-alives)",
                args.idle
            );
            reset_counters(&state)?;
            // A measurement period, not a wait for readiness.
            std::thread::sleep(args.idle);
            let mut idle = Totals::default();
            idle.add_links(&state, acc)?;
            t.idle_frames = idle.frames;
            t.idle_bytes = idle.wire_bytes;
        }
        Ok(t)
    })();
    println!("== {transport}: tearing down");
    topology::down(&cfg.run_dir, &cfg.prefix)?;
    result
}

fn pct(quic: u64, tcp: u64) -> String {
    if tcp == 0 {
        return "-".into();
    }
    format!("{:+.0}%", (quic as f64 / tcp as f64 - 1.0) * 100.0)
}

pub fn run(args: DemoArgs) -> Result<()> {
    let acc = Accounting {
        phy_overhead: args.overhead,
        pad_to_min_frame: false,
    };
    let tcp = run_one(&args, Transport::Tcp, &acc)?;
    let quic = run_one(&args, Transport::Quic, &acc)?;
    println!(
        "\ncontrol-plane traffic of one workload: {} switches x {} hosts, os-ken L2 app, \
         control links with {:?} one-way delay and {}% loss per direction (both directions summed); \
         quic with the agents' defaults (class-aware coalescing, ACK frequency){}\n",
        args.switches,
        args.hosts_per_switch,
        args.delay,
        args.loss,
        if args.agent_args.is_empty() {
            String::new()
        } else {
            format!(" and {}", args.agent_args.join(" "))
        }
    );
    println!(
        "{:<22} {:>12} {:>12} {:>12}",
        "", "tcp", "quic", "quic vs tcp"
    );
    let rows = [
        ("packets on the wire", tcp.frames, quic.frames),
        (
            "  of them ACK-only",
            tcp.ack_only_frames,
            quic.ack_only_frames,
        ),
        (
            "  of them handshake",
            tcp.handshake_frames,
            quic.handshake_frames,
        ),
        ("wire bytes", tcp.wire_bytes, quic.wire_bytes),
        (
            "  in data packets",
            tcp.wire_bytes - tcp.ack_only_bytes - tcp.handshake_bytes,
            quic.wire_bytes - quic.ack_only_bytes - quic.handshake_bytes,
        ),
        (
            "  in ACK-only packets",
            tcp.ack_only_bytes,
            quic.ack_only_bytes,
        ),
        ("  in handshake", tcp.handshake_bytes, quic.handshake_bytes),
        ("OpenFlow bytes", tcp.openflow_bytes, quic.openflow_bytes),
        ("overhead bytes", tcp.overhead(), quic.overhead()),
    ];
    for (name, t, q) in rows {
        println!("{name:<22} {t:>12} {q:>12} {:>12}", pct(q, t));
    }
    if !args.idle.is_zero() {
        let per_hour = |x: u64| x as f64 * 3600.0 / args.idle.as_secs_f64();
        println!(
            "\nidle for {:?} after the workload (keep-alive: OVS's echo every 5 s, and quic's PINGs and their ACKs):",
            args.idle
        );
        for (name, t, q) in [
            ("packets", tcp.idle_frames, quic.idle_frames),
            ("wire bytes", tcp.idle_bytes, quic.idle_bytes),
        ] {
            println!(
                "{:<22} {t:>12} {q:>12} {:>12}   (per hour: tcp {:.0}, quic {:.0})",
                format!("  {name}"),
                pct(q, t),
                per_hour(t),
                per_hour(q)
            );
        }
    }
    println!("\n{}", acc.convention());
    println!(
        "overhead = wire bytes - OpenFlow bytes; OpenFlow bytes are what the controller sent and \
         received on its sockets (retransmissions excluded). ACK-only: packets without \
         application data (TCP pure ACKs; QUIC packets of at most 64 bytes of UDP payload: ACKs, \
         keep-alive PINGs); handshake: TCP SYN/FIN/RST, QUIC long-header packets."
    );
    Ok(())
}
