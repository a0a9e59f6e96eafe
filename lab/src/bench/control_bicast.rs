//! `quicsdn-lab bench control-bicast`: the control channel itself over two
//! paths (issue 14, "beyond the paper"), against one path, in the same run.
//!
//! The multihomed lab ([`crate::multihomed`]) carries, between its client and
//! server namespaces, the control channel of a second, real switch: Open
//! vSwitch (userspace datapath) in the client namespace with its `quicsdn
//! switch`, and `quicsdn controller` in the server namespace, whose OpenFlow
//! service is this bench's controller program ([`Controller`]) on the
//! server's loopback. In `bicast-both` mode the lab's switches put every
//! packet of both directions on both paths (OpenFlow groups of type ALL,
//! installed by os-ken through the lab's own agents); in `unicast` mode both
//! directions take path A only: the single-path baseline.
//!
//! Per condition (loss on path A, on both paths, a path cut for `--cut`), the
//! controller program runs rounds of two probes, one after the other:
//!
//! * **echo**: an OpenFlow ECHO_REQUEST to OVS, timed to its ECHO_REPLY;
//! * **flow**: a FLOW_MOD (a new flow each round) and a BARRIER_REQUEST, timed
//!   to the BARRIER_REPLY: the flow is installed when the reply arrives.
//!
//! A probe that is not answered within `--probe-timeout` counts as a timeout;
//! a controller connection that closes (the agents' session or OVS gave up)
//! counts as a lost session, and the next round waits for OVS to come back.
//! Recorded beside the delays: what each path carried (the emulator's
//! counters), and the controller agent's QUIC loss and migration counters,
//! which show whether duplicate packets are mistaken for loss or for a new
//! path. A benchmark: it asserts nothing about speed.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use quicsdn_wire::openflow::build::{self, Action, FlowMod, Oxm, msg_type};

use crate::agent_metrics::{CONTROLLER_METRICS_PORT, http_get, parse_text};
use crate::bench::out::{self, Csv, md_table};
use crate::bench::stats::{quantile, sorted};
use crate::control_link::parse_duration;
use crate::emulator::control::DirPatch;
use crate::emulator::model::LossModel;
use crate::emulator::sys::in_netns;
use crate::multihomed::{ControlledSwitch, Mode, Multihomed, MultihomedSpec};
use crate::openflow_peer::Controller;

/// Where the controller agent hands OpenFlow over, on the server's loopback.
const OPENFLOW_PORT: u16 = 6653;
/// The controlled switch's datapath id.
const DPID: u64 = 0xcb;

#[derive(clap::Args, Debug, Clone)]
pub struct ControlBicastArgs {
    /// Loss rates, in percent: each on path A alone, and (above 0) on both
    /// paths in bicast mode.
    #[arg(long, value_delimiter = ',', default_value = "0,1,5,10,20,30,39")]
    pub loss: Vec<f64>,
    /// How long a path is cut in the cut conditions.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub cut: Duration,
    /// Probe rounds (an echo and a flow install each) per loss condition.
    #[arg(long, default_value_t = 50)]
    pub rounds: u32,
    /// Pause between rounds.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub interval: Duration,
    /// Longest a probe may wait for its answer.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub probe_timeout: Duration,
    /// Round-trip time of each path.
    #[arg(long, default_value = "20ms")]
    pub rtt: String,
    /// Rate of each path, each direction.
    #[arg(long, default_value = "100mbit")]
    pub rate: String,
    /// A small run for the test suite: loss 30 % only, a 2 s cut, 10 rounds.
    #[arg(long)]
    pub quick: bool,
    /// Name prefix of the lab's namespaces and links (at most 8 characters).
    #[arg(long, default_value = "qcb")]
    pub prefix: String,
    /// Where the CSVs and the summary go.
    #[arg(long, default_value = "bench-results/control-bicast")]
    pub out: PathBuf,
    /// Controller venvs directory (default: $QUICSDN_VENV_DIR or <repo>/.venv).
    #[arg(long)]
    pub venv_dir: Option<PathBuf>,
}

pub const PROBES_HEADER: &[&str] = &["mode", "condition", "round", "kind", "status", "ms"];

pub const CONDITIONS_HEADER: &[&str] = &[
    "mode",
    "condition",
    "loss_a_pct",
    "loss_b_pct",
    "cut",
    "echo_n",
    "echo_median_ms",
    "echo_p99_ms",
    "echo_max_ms",
    "flow_n",
    "flow_median_ms",
    "flow_p99_ms",
    "flow_max_ms",
    "timeouts",
    "sessions_lost",
    "path_a_bytes",
    "path_b_bytes",
    "quic_lost_packets",
    "migrations",
];

/// One measured condition of the paths.
#[derive(Debug, Clone, Copy)]
struct Condition {
    loss: [f64; 2],
    /// The path cut for `--cut` while the rounds run.
    cut: Option<usize>,
}

impl Condition {
    fn name(&self) -> String {
        let path = |i: usize| ["A", "B"][i];
        match self.cut {
            Some(p) => {
                let other = 1 - p;
                if self.loss[other] > 0.0 {
                    format!("{} cut + {} {} %", path(p), path(other), self.loss[other])
                } else {
                    format!("{} cut", path(p))
                }
            }
            None if self.loss[1] > 0.0 => format!("both {} %", self.loss[0]),
            None => format!("A {} %", self.loss[0]),
        }
    }
}

/// The conditions of one mode. In unicast only path A carries the channel,
/// so loss on B and B's cut change nothing there and are not run.
fn conditions(mode: Mode, losses: &[f64]) -> Vec<Condition> {
    let mut v: Vec<Condition> = losses
        .iter()
        .map(|&l| Condition {
            loss: [l, 0.0],
            cut: None,
        })
        .collect();
    v.push(Condition {
        loss: [0.0, 0.0],
        cut: Some(0),
    });
    if mode == Mode::BicastBoth {
        v.extend(losses.iter().filter(|&&l| l > 0.0).map(|&l| Condition {
            loss: [l, l],
            cut: None,
        }));
        // The e2e test's case: one path cut, the other lossy.
        v.push(Condition {
            loss: [0.0, 30.0],
            cut: Some(0),
        });
    }
    v
}

fn apply_quick(a: &mut ControlBicastArgs) {
    a.loss = vec![30.0];
    a.cut = Duration::from_secs(2);
    a.rounds = 10;
}

/// The controller program's connection, re-accepted when a session is lost.
struct Channel {
    listener: TcpListener,
    conn: Option<Controller>,
    xid: u32,
}

impl Channel {
    /// The OpenFlow connection, accepting OVS's next one if there is none.
    /// A connection that closes during the handshake (its session was lost
    /// again, e.g. while a path is still cut) is followed by the next one
    /// until `timeout`.
    fn connection(&mut self, timeout: Duration) -> Result<&mut Controller> {
        let deadline = Instant::now() + timeout;
        while self.conn.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let s = crate::bench::synth::accept_one(&self.listener, left)
                .context("waiting for OVS's OpenFlow connection through the agents")?;
            match Controller::handshake(s, left) {
                Ok(c) => self.conn = Some(c),
                Err(e) if Instant::now() < deadline => {
                    eprintln!("OVS's new OpenFlow connection closed in its handshake: {e:#}");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    fn next_xid(&mut self) -> u32 {
        self.xid = self.xid.wrapping_add(1).max(1000);
        self.xid
    }

    /// Sends `msg` and waits for the reply of type `reply` with `xid`:
    /// `Ok(Some(ms))`, `Ok(None)` on a timeout, `Err` when the connection
    /// closed (then dropped).
    fn probe(&mut self, msg: &[u8], reply: u8, xid: u32, timeout: Duration) -> Result<Option<f64>> {
        let conn = self.conn.as_mut().expect("connected");
        let start = Instant::now();
        let r = conn.send(msg).and_then(|()| {
            conn.recv_until_by(start + timeout, |m| {
                m.header.msg_type == reply && m.header.xid == xid
            })
        });
        match r {
            Ok(Some(_)) => Ok(Some(start.elapsed().as_secs_f64() * 1e3)),
            Ok(None) => Ok(None),
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }
}

/// The controller agent's QUIC lost packets and migrations, summed over
/// its switches (one here).
fn agent_counters(lab: &Multihomed) -> Result<(u64, u64)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], CONTROLLER_METRICS_PORT));
    let (code, text) = http_get(&lab.server_ns().name, addr, "/metrics")
        .context("reading the controller agent's metrics")?;
    if code != 200 {
        bail!("the controller agent's /metrics answered {code}");
    }
    let samples = parse_text(&text)?;
    let sum = |prefix: &str| -> Result<u64> {
        let mut found = samples
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .peekable();
        if found.peek().is_none() {
            bail!("no {prefix} in the controller agent's metrics (is the switch connected?)");
        }
        Ok(found.map(|s| s.value as u64).sum())
    };
    Ok((
        sum("quicsdn_quic_lost_packets")?,
        sum("quicsdn_migrations")?,
    ))
}

struct Measured {
    echo: Vec<f64>,
    flow: Vec<f64>,
    timeouts: usize,
    sessions_lost: usize,
}

/// Runs the rounds of one condition, recording every probe in `csv`.
fn measure(
    lab: &Multihomed,
    ch: &mut Channel,
    mode: Mode,
    cond: &Condition,
    args: &ControlBicastArgs,
    csv: &mut Csv,
) -> Result<Measured> {
    let (cut, interval, timeout) = (args.cut, args.interval, args.probe_timeout);
    let mut m = Measured {
        echo: Vec::new(),
        flow: Vec::new(),
        timeouts: 0,
        sessions_lost: 0,
    };
    let name = cond.name();
    // The cut path comes back on its own thread, at its time, even while a
    // probe waits; the rounds go on until 2 s after, whatever their count.
    let restore = match cond.cut {
        Some(p) => {
            let link = lab.path_control(p);
            link.set_both(DirPatch {
                up: Some(false),
                ..Default::default()
            })?;
            Some(std::thread::spawn(move || {
                std::thread::sleep(cut);
                link.set_both(DirPatch {
                    up: Some(true),
                    ..Default::default()
                })
            }))
        }
        None => None,
    };
    let started = Instant::now();
    let until = cond.cut.map(|_| cut + Duration::from_secs(2));
    let mut round = 0u32;
    loop {
        match until {
            Some(u) if started.elapsed() >= u => break,
            None if round >= args.rounds => break,
            _ => {}
        }
        round += 1;
        if ch.conn.is_none() {
            ch.connection(Duration::from_secs(60))?;
        }
        for kind in ["echo", "flow"] {
            let xid = ch.next_xid();
            let (msg, reply) = if kind == "echo" {
                (
                    build::echo_request(xid, b"control-bicast"),
                    msg_type::ECHO_REPLY,
                )
            } else {
                let mut f = FlowMod::add(
                    100,
                    vec![
                        Oxm::EthType(0x0800),
                        Oxm::Ipv4Dst(0x0ac8_0000 | (xid & 0xffff), None),
                    ],
                    vec![Action::Output(1)],
                );
                f.cookie = u64::from(xid);
                let mut msg = build::flow_mod(xid, &f);
                msg.extend_from_slice(&build::barrier_request(xid));
                (msg, msg_type::BARRIER_REPLY)
            };
            let (status, ms) = match ch.probe(&msg, reply, xid, timeout) {
                Ok(Some(ms)) => {
                    if kind == "echo" {
                        m.echo.push(ms);
                    } else {
                        m.flow.push(ms);
                    }
                    ("ok", format!("{ms:.3}"))
                }
                Ok(None) => {
                    m.timeouts += 1;
                    ("timeout", String::new())
                }
                Err(e) => {
                    eprintln!(
                        "{} {name}: the controller's connection closed: {e:#}",
                        mode.as_str()
                    );
                    m.sessions_lost += 1;
                    ("session-lost", String::new())
                }
            };
            csv.push(vec![
                mode.as_str().into(),
                name.clone(),
                round.to_string(),
                kind.into(),
                status.into(),
                ms,
            ]);
            if status == "session-lost" {
                break;
            }
        }
        std::thread::sleep(interval);
    }
    if let Some(t) = restore {
        t.join()
            .map_err(|_| anyhow::anyhow!("the thread restoring the path panicked"))??;
    }
    // The next condition (and the agent's counters) start from a session.
    ch.connection(Duration::from_secs(60))?;
    Ok(m)
}

pub fn run(mut args: ControlBicastArgs) -> Result<()> {
    crate::cmd::require_root()?;
    if args.quick {
        apply_quick(&mut args);
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if let Some(l) = args.loss.iter().find(|l| !(0.0..100.0).contains(*l)) {
        bail!("--loss {l}: a percentage from 0 to below 100");
    }
    let path = crate::multihomed::path_settings(&args.rtt, &args.rate)?;
    std::fs::create_dir_all(&args.out)?;
    let work = PathBuf::from(crate::state::DEFAULT_RUN_DIR)
        .join(format!("{}-control-bicast", args.prefix));
    let _ = std::fs::remove_dir_all(&work);
    let load_before = out::loadavg();
    let started = Instant::now();
    let mut probes = Csv::new(PROBES_HEADER);
    let mut table = Csv::new(CONDITIONS_HEADER);
    for mode in [Mode::Unicast, Mode::BicastBoth] {
        let dir = work.join(mode.as_str());
        let mut lab = Multihomed::up(&MultihomedSpec::alike(
            &args.prefix,
            mode,
            path.clone(),
            dir.join("lab"),
            args.venv_dir.clone(),
        ))
        .with_context(|| format!("bringing up the multihomed lab ({})", mode.as_str()))?;
        let listener = in_netns(&lab.server_ns().name, || {
            TcpListener::bind(("127.0.0.1", OPENFLOW_PORT))
        })?
        .context("listening for the controller agent's OpenFlow connections")?;
        let sw = ControlledSwitch::start(
            &mut lab,
            &dir.join("sw"),
            DPID,
            &format!("tcp:127.0.0.1:{OPENFLOW_PORT}"),
            &[format!("--metrics=127.0.0.1:{CONTROLLER_METRICS_PORT}")],
        )?;
        let mut ch = Channel {
            listener,
            conn: None,
            xid: 0,
        };
        ch.connection(Duration::from_secs(60))?;
        sw.ovs
            .wait_connected(ControlledSwitch::BRIDGE, Duration::from_secs(30))?;
        for cond in conditions(mode, &args.loss) {
            let name = cond.name();
            for (p, l) in cond.loss.iter().enumerate() {
                lab.set_path_loss(p, LossModel::random(l / 100.0))?;
            }
            lab.reset_counters()?;
            let before = agent_counters(&lab)?;
            let m = measure(&lab, &mut ch, mode, &cond, &args, &mut probes)?;
            let after = agent_counters(&lab)?;
            let c = lab.path_counters()?;
            let path_bytes = |i: usize| c[i][0].bytes + c[i][1].bytes;
            let (echo, flow) = (sorted(&m.echo), sorted(&m.flow));
            let q = |v: &[f64], q: f64| {
                if v.is_empty() {
                    String::new()
                } else {
                    format!("{:.2}", quantile(v, q))
                }
            };
            let row = vec![
                mode.as_str().to_string(),
                name.clone(),
                format!("{}", cond.loss[0]),
                format!("{}", cond.loss[1]),
                cond.cut
                    .map(|_| format!("{:?}", args.cut))
                    .unwrap_or_default(),
                echo.len().to_string(),
                q(&echo, 0.5),
                q(&echo, 0.99),
                q(&echo, 1.0),
                flow.len().to_string(),
                q(&flow, 0.5),
                q(&flow, 0.99),
                q(&flow, 1.0),
                m.timeouts.to_string(),
                m.sessions_lost.to_string(),
                path_bytes(0).to_string(),
                path_bytes(1).to_string(),
                after.0.saturating_sub(before.0).to_string(),
                after.1.saturating_sub(before.1).to_string(),
            ];
            println!(
                "{:<11} {:<16} echo median {:>8} ms, max {:>8} ms; flow median {:>8} ms, max {:>8} ms; {} timeouts, {} sessions lost",
                mode.as_str(),
                name,
                row[table.col("echo_median_ms")],
                row[table.col("echo_max_ms")],
                row[table.col("flow_median_ms")],
                row[table.col("flow_max_ms")],
                m.timeouts,
                m.sessions_lost
            );
            table.push(row);
            probes.write(&args.out.join("probes.csv"))?;
            table.write(&args.out.join("conditions.csv"))?;
        }
        lab.check_alive()?;
        drop(sw);
        drop(ch);
    }
    // Only logs are left there; a failed run keeps them for a look.
    let _ = std::fs::remove_dir_all(&work);
    let summary = summarize(&table, &args, started.elapsed(), &load_before);
    std::fs::write(args.out.join("summary.md"), &summary)?;
    println!("\n{summary}");
    println!("wrote {}", args.out.display());
    Ok(())
}

fn summarize(t: &Csv, args: &ControlBicastArgs, elapsed: Duration, load_before: &str) -> String {
    let c = |n: &str| t.col(n);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Control-channel bicast: ECHO round trips and flow installs, one path against two\n\n\
         A real OVS and its `quicsdn switch` in the multihomed lab's client namespace, \
         `quicsdn controller` in its server namespace; the controller is this bench's \
         OpenFlow program. Paths of {} and {} RTT each. `unicast`: the channel on path A only; \
         `bicast-both`: every packet of both directions on both paths (groups of type ALL). \
         {} rounds per loss condition, {:?} apart; a cut lasts {:?} and its rounds run until 2 s \
         after it. Milliseconds; `timeouts`: probes not answered within {:?}; `sessions lost`: \
         the controller's OpenFlow connection closed.\n",
        args.rate, args.rtt, args.rounds, args.interval, args.cut, args.probe_timeout
    );
    let _ = writeln!(
        s,
        "{}- load average before: {load_before}, after: {}; run time {:.0} s.\n",
        out::provenance(),
        out::loadavg(),
        elapsed.as_secs_f64()
    );
    let header = [
        "mode",
        "condition",
        "echo median",
        "echo p99",
        "echo max",
        "flow median",
        "flow p99",
        "flow max",
        "timeouts",
        "sessions lost",
        "bytes A / B",
        "QUIC lost pkts",
        "migrations",
    ];
    let rows: Vec<Vec<String>> = t
        .rows
        .iter()
        .map(|r| {
            let b = |n: &str| out::bytes(r[c(n)].parse().unwrap_or(0.0));
            vec![
                r[c("mode")].clone(),
                r[c("condition")].clone(),
                r[c("echo_median_ms")].clone(),
                r[c("echo_p99_ms")].clone(),
                r[c("echo_max_ms")].clone(),
                r[c("flow_median_ms")].clone(),
                r[c("flow_p99_ms")].clone(),
                r[c("flow_max_ms")].clone(),
                r[c("timeouts")].clone(),
                r[c("sessions_lost")].clone(),
                format!("{} / {}", b("path_a_bytes"), b("path_b_bytes")),
                r[c("quic_lost_packets")].clone(),
                r[c("migrations")].clone(),
            ]
        })
        .collect();
    s += &md_table(&header, &rows);
    s
}
