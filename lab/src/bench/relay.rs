//! `quicsdn-lab bench relay`: how fast the agents relay OpenFlow, against a direct
//! TCP connection measured in the same run.
//!
//! A synthetic switch writes 100-byte OpenFlow messages; a synthetic controller
//! reads them, checking every header and that the xids arrive in order. Two paths:
//!
//! * **direct**: switch → TCP → controller, on loopback;
//! * **agents**: switch → `quicsdn switch` → QUIC → `quicsdn controller` → controller,
//!   with the real `quicsdn` binary in two processes.
//!
//! Throughput: as many messages as the path takes. The synthetic switch writes
//! each message with its own `write()`, as Open vSwitch does (its `vconn` sends
//! every OpenFlow message separately); `--batched` writes 64 KiB at a time
//! instead, which measures raw byte throughput and favours the direct path, where
//! it is a bare memory copy. Latency: one message every 100 µs (10k msg/s), each
//! carrying its send time; the sink records one-way delay on the same clock.
//!
//! This is a benchmark: it prints numbers and ratios and asserts nothing about
//! speed. It does check delivery (counts, order, framing), since a fast wrong
//! answer is no answer.

use anyhow::{Context, Result, anyhow, bail};
use quicsdn_transport::pki::{self, Validity};
use quicsdn_wire::openflow;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::stats::quantile;

/// Size of each benchmark message, header included.
const MESSAGE_LEN: usize = 100;

#[derive(clap::Args, Debug, Clone)]
pub struct RelayArgs {
    /// Messages per throughput run.
    #[arg(long, default_value_t = 2_000_000)]
    pub messages: u64,
    /// Throughput runs per path (the best is reported, and all are printed).
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Messages per latency run, sent at --rate.
    #[arg(long, default_value_t = 50_000)]
    pub latency_messages: u64,
    /// Message rate of the latency run, per second.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Stream mode of the agents (safe, ordered or rr:N).
    #[arg(long, default_value = "safe")]
    pub streams: String,
    /// Worker threads of each agent (`quicsdn --threads`; default: one per CPU).
    #[arg(long)]
    pub agent_threads: Option<usize>,
    /// Write 64 KiB batches instead of one write per message.
    #[arg(long)]
    pub batched: bool,
    /// The quicsdn binary (default: next to this one).
    #[arg(long)]
    pub quicsdn: Option<PathBuf>,
}

/// A `quicsdn` process (agent or proxy), killed (by PID) when dropped.
pub(crate) struct AgentProcess {
    pub(crate) child: Child,
    name: &'static str,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AgentProcess {
    pub(crate) fn spawn(
        binary: &Path,
        name: &'static str,
        args: &[String],
        threads: Option<usize>,
    ) -> Result<AgentProcess> {
        AgentProcess::spawn_in(None, binary, name, args, threads)
    }

    /// [`AgentProcess::spawn`] inside network namespace `ns`.
    pub(crate) fn spawn_in(
        ns: Option<&str>,
        binary: &Path,
        name: &'static str,
        args: &[String],
        threads: Option<usize>,
    ) -> Result<AgentProcess> {
        let mut cmd = match ns {
            Some(ns) => crate::netns::Netns::named(ns).command(binary),
            None => Command::new(binary),
        };
        let child = cmd
            .args(args)
            .args(threads.map(|n| format!("--threads={n}")))
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        Ok(AgentProcess { child, name })
    }

    pub(crate) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("the {} process exited early: {status}", self.name);
        }
        Ok(())
    }
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn free_udp_port() -> Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn default_binary() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let candidate = me.with_file_name("quicsdn");
    if candidate.exists() {
        Ok(candidate)
    } else {
        Err(anyhow!(
            "{} not found: build it first (cargo build --release -p quicsdn) or pass --quicsdn",
            candidate.display()
        ))
    }
}

/// The message stream: message `i` has xid `i` and, in its body, a send timestamp.
fn message(xid: u32, sent_ns: u64) -> [u8; MESSAGE_LEN] {
    let mut m = [0u8; MESSAGE_LEN];
    // ECHO_REQUEST, so any OpenFlow-aware party would forward it untouched.
    m[..8].copy_from_slice(
        &openflow::Header {
            version: openflow::OFP13_VERSION,
            msg_type: 2,
            length: MESSAGE_LEN as u16,
            xid,
        }
        .encode(),
    );
    m[8..16].copy_from_slice(&sent_ns.to_be_bytes());
    m
}

/// Reads messages until `count` arrived, checking framing and order; calls
/// `on_message(xid, sent_ns)` for each.
fn sink(mut conn: TcpStream, count: u64, mut on_message: impl FnMut(u32, u64)) -> Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let (mut have, mut next_xid) = (0usize, 0u64);
    while next_xid < count {
        let n = conn.read(&mut buf[have..])?;
        if n == 0 {
            bail!("the path closed after {next_xid} of {count} messages");
        }
        have += n;
        let mut at = 0;
        while have - at >= MESSAGE_LEN {
            let h = openflow::Header::parse(&buf[at..]).expect("8 bytes");
            if usize::from(h.length) != MESSAGE_LEN || u64::from(h.xid) != next_xid & 0xffff_ffff {
                bail!("message {next_xid} arrived as {h:?}: lost, reordered or altered");
            }
            let sent = u64::from_be_bytes(buf[at + 8..at + 16].try_into().expect("8 bytes"));
            on_message(h.xid, sent);
            at += MESSAGE_LEN;
            next_xid += 1;
        }
        buf.copy_within(at..have, 0);
        have -= at;
    }
    Ok(())
}

/// One throughput run: returns messages per second.
fn throughput(mut writer: TcpStream, reader: TcpStream, count: u64, batched: bool) -> Result<f64> {
    let sink_thread = std::thread::spawn(move || sink(reader, count, |_, _| {}));
    if !batched {
        let start = Instant::now();
        for xid in 0..count {
            writer.write_all(&message(xid as u32, 0))?;
        }
        sink_thread.join().map_err(|_| anyhow!("sink panicked"))??;
        return Ok(count as f64 / start.elapsed().as_secs_f64());
    }
    let per_batch = 65_536 / MESSAGE_LEN;
    let mut batch = Vec::with_capacity(per_batch * MESSAGE_LEN);
    let start = Instant::now();
    let mut xid = 0u64;
    while xid < count {
        batch.clear();
        let n = (count - xid).min(per_batch as u64);
        for i in 0..n {
            batch.extend_from_slice(&message((xid + i) as u32, 0));
        }
        writer.write_all(&batch)?;
        xid += n;
    }
    sink_thread.join().map_err(|_| anyhow!("sink panicked"))??;
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// One latency run at `rate`: returns one-way delays in microseconds, sorted.
fn latency(mut writer: TcpStream, reader: TcpStream, count: u64, rate: u64) -> Result<Vec<f64>> {
    let epoch = Instant::now();
    let sink_thread = std::thread::spawn(move || {
        let mut delays = Vec::with_capacity(count as usize);
        sink(reader, count, |_, sent| {
            let now = epoch.elapsed().as_nanos() as u64;
            delays.push((now - sent) as f64 / 1000.0);
        })
        .map(|()| delays)
    });
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    for i in 0..count {
        let due = interval * i as u32;
        if let Some(wait) = due.checked_sub(epoch.elapsed()) {
            std::thread::sleep(wait);
        }
        writer.write_all(&message(i as u32, epoch.elapsed().as_nanos() as u64))?;
    }
    let mut delays = sink_thread.join().map_err(|_| anyhow!("sink panicked"))??;
    delays.sort_by(f64::total_cmp);
    Ok(delays)
}

/// A path from a writer to the sink: connect, then accept the far end.
type Connect<'a> = dyn FnMut() -> Result<(TcpStream, TcpStream)> + 'a;

/// Connects a writer to `to` and accepts the far end on the sink's listener
/// (directly, or after the agents relayed the connection).
fn connector(
    listener: &TcpListener,
    to: SocketAddr,
) -> impl FnMut() -> Result<(TcpStream, TcpStream)> + '_ {
    move || {
        let w = TcpStream::connect(to)?;
        w.set_nodelay(true)?;
        let (r, _) = listener.accept()?;
        r.set_nodelay(true)?;
        Ok((w, r))
    }
}

struct PathResult {
    runs: Vec<f64>,
    delays: Vec<f64>,
}

fn measure(args: &RelayArgs, connect: &mut Connect<'_>) -> Result<PathResult> {
    let mut runs = Vec::new();
    for _ in 0..args.runs {
        let (w, r) = connect()?;
        runs.push(throughput(w, r, args.messages, args.batched)?);
    }
    let (w, r) = connect()?;
    let delays = latency(w, r, args.latency_messages, args.rate)?;
    Ok(PathResult { runs, delays })
}

pub fn run(args: RelayArgs) -> Result<()> {
    let binary = match &args.quicsdn {
        Some(b) => b.clone(),
        None => default_binary()?,
    };
    let dir = tempfile::tempdir()?;
    pki::init_ca(dir.path(), "relay bench CA", Validity::days(1))?;
    pki::issue(dir.path(), "ctl", &[], Validity::days(1))?;
    pki::issue(dir.path(), "sw1", &[], Validity::days(1))?;
    let p = |f: &str| dir.path().join(f).display().to_string();

    let sink_listener = TcpListener::bind("127.0.0.1:0")?;
    let sink_addr: SocketAddr = sink_listener.local_addr()?;
    let quic_port = free_udp_port()?;
    let switch_port = free_port()?;
    let mut controller = AgentProcess::spawn(
        &binary,
        "controller",
        &[
            "controller".into(),
            format!("--listen=127.0.0.1:{quic_port}"),
            format!("--ca={}", p("ca.crt")),
            format!("--cert={}", p("ctl.crt")),
            format!("--key={}", p("ctl.key")),
            format!("--service=openflow=tcp:{sink_addr}"),
            format!("--streams={}", args.streams),
        ],
        args.agent_threads,
    )?;
    let mut switch = AgentProcess::spawn(
        &binary,
        "switch",
        &[
            "switch".into(),
            format!("--controller=127.0.0.1:{quic_port}"),
            "--server-name=ctl".into(),
            format!("--ca={}", p("ca.crt")),
            format!("--cert={}", p("sw1.crt")),
            format!("--key={}", p("sw1.key")),
            format!("--service=openflow=ptcp:{switch_port}:127.0.0.1"),
            format!("--streams={}", args.streams),
        ],
        args.agent_threads,
    )?;
    // Ready when a message makes it through: poll the switch agent's port, then
    // send one message end to end.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut probe = loop {
        controller.check_alive()?;
        switch.check_alive()?;
        match TcpStream::connect(("127.0.0.1", switch_port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => bail!("the switch agent never listened on port {switch_port}: {e}"),
        }
    };
    probe.write_all(&message(0, 0))?;
    sink_listener.set_nonblocking(false)?;
    let (probe_sink, _) = sink_listener.accept()?;
    probe_sink.set_read_timeout(Some(Duration::from_secs(30)))?;
    sink(probe_sink, 1, |_, _| {}).context("no message made it through the agents")?;
    drop(probe);

    println!(
        "relay benchmark: {} messages of {MESSAGE_LEN} bytes per throughput run ({}), {} runs per path; \
         latency at {} msg/s over {} messages; agents in {} mode, {} worker thread(s) each",
        args.messages,
        if args.batched {
            "64 KiB writes"
        } else {
            "one write per message"
        },
        args.runs,
        args.rate,
        args.latency_messages,
        args.streams,
        args.agent_threads
            .map_or("default".to_string(), |n| n.to_string())
    );
    let direct_result = measure(&args, &mut connector(&sink_listener, sink_addr))?;
    let switch_addr = SocketAddr::from(([127, 0, 0, 1], switch_port));
    let agents_result = measure(&args, &mut connector(&sink_listener, switch_addr))?;
    controller.check_alive()?;
    switch.check_alive()?;

    let best = |r: &PathResult| r.runs.iter().copied().fold(0.0, f64::max);
    let fmt_runs = |r: &PathResult| {
        r.runs
            .iter()
            .map(|x| format!("{:.0}", x))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!();
    println!(
        "{:<10} {:>14} {:>12} {:>12}   runs (msg/s)",
        "path", "best msg/s", "p50 µs", "p99 µs"
    );
    for (name, r) in [("direct", &direct_result), ("agents", &agents_result)] {
        println!(
            "{:<10} {:>14.0} {:>12.1} {:>12.1}   {}",
            name,
            best(r),
            quantile(&r.delays, 0.5),
            quantile(&r.delays, 0.99),
            fmt_runs(r)
        );
    }
    println!();
    println!(
        "agents / direct throughput: {:.2}x; added latency at {} msg/s: p50 {:+.1} µs, p99 {:+.1} µs",
        best(&agents_result) / best(&direct_result),
        args.rate,
        quantile(&agents_result.delays, 0.5) - quantile(&direct_result.delays, 0.5),
        quantile(&agents_result.delays, 0.99) - quantile(&direct_result.delays, 0.99),
    );
    Ok(())
}
