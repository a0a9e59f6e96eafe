//! `quicsdn-lab bench stall`: bounded memory under a stalled peer (issue 17).
//!
//! The real `quicsdn` agents (two processes, loopback, default `safe` mode)
//! between a synthetic switch and a synthetic controller. After the OpenFlow
//! handshake, one side stops reading for `--seconds` while the other floods
//! it, as a DoS would (DELTA's packet-in flooding):
//!
//! * **stalled controller**: the switch floods PACKET_INs of 64 flows; the
//!   controller reads nothing, but sends ECHO_REQUESTs, which must keep
//!   reaching the switch on the priority lane;
//! * **stalled switch**: the controller floods FLOW_MODs; OVS reads nothing,
//!   but sends ECHO_REQUESTs, which must keep reaching the controller.
//!
//! Measured: each agent's peak RSS during the stall against its RSS before
//! (and against `--rss-bound-mib`), how many echoes got through during the
//! stall and how fast, and how much of the flood sat in buffers. After the
//! stall the peer reads everything: every message must arrive exactly once, in
//! the order the rules promise (PACKET_INs per flow; FLOW_MODs all in order).
//! The stall lasts at least `--seconds`, and until the flood is blocked by
//! backpressure and 5 echoes got through.

use anyhow::{Context, Result, bail};
use quicsdn_transport::pki::{self, Validity};
use quicsdn_wire::openflow::{self, Header, Kind};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::relay::{AgentProcess, free_port, free_udp_port};

#[derive(clap::Args, Debug, Clone)]
pub struct StallArgs {
    /// How long the stalled peer reads nothing, at least.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// The bound each agent's RSS growth during a stall must stay under (MiB);
    /// the command fails if it does not.
    #[arg(long, default_value_t = 64)]
    pub rss_bound_mib: u64,
    /// Interval between the stalled peer's ECHO_REQUESTs (ms).
    #[arg(long, default_value_t = 100)]
    pub echo_interval_ms: u64,
    /// The quicsdn binary (default: next to this one, or $QUICSDN_BIN).
    #[arg(long)]
    pub quicsdn: Option<std::path::PathBuf>,
}

/// One scenario's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StallResult {
    pub scenario: &'static str,
    pub stall_s: f64,
    /// Flood messages written before the stall ended (buffered somewhere).
    pub flood_sent_during_stall: u64,
    pub flood_total: u64,
    pub switch_agent_rss_before_mib: f64,
    pub switch_agent_rss_peak_mib: f64,
    pub controller_agent_rss_before_mib: f64,
    pub controller_agent_rss_peak_mib: f64,
    pub echoes_during_stall: u64,
    pub echo_p50_ms: f64,
    pub echo_max_ms: f64,
    /// Every flood message arrived once, in the promised order.
    pub delivered_exactly_once_in_order: bool,
}

impl StallResult {
    pub fn growth_mib(&self) -> f64 {
        (self.switch_agent_rss_peak_mib - self.switch_agent_rss_before_mib)
            .max(self.controller_agent_rss_peak_mib - self.controller_agent_rss_before_mib)
    }
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn now_ns(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

/// Reads one whole OpenFlow message.
fn read_message(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut m = vec![0u8; 8];
    s.read_exact(&mut m)?;
    let len = usize::from(Header::parse(&m).expect("8 bytes").length).max(8);
    m.resize(len, 0);
    s.read_exact(&mut m[8..])?;
    Ok(m)
}

/// A PACKET_IN (OpenFlow 1.3) of flow `flow`: an in_port OXM match and a small
/// IPv4/UDP frame whose addresses name the flow.
fn packet_in(xid: u32, flow: u8) -> Vec<u8> {
    let mut frame = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    frame.extend_from_slice(&[0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0]);
    frame.extend_from_slice(&[10, 0, flow, 1, 10, 0, 0, 2]);
    frame.extend_from_slice(&[0x30, 0x39, 0x00, 0x35, 0, 8, 0, 0]);
    let mut body = vec![0xff, 0xff, 0xff, 0xff];
    body.extend_from_slice(&(frame.len() as u16).to_be_bytes());
    body.extend_from_slice(&[0, 0]); // reason, table
    body.extend_from_slice(&[0; 8]); // cookie
    body.extend_from_slice(&[0, 1, 0, 12, 0x80, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0]);
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&frame);
    openflow::message(openflow::OFP13_VERSION, 10, xid, &body)
}

/// A FLOW_MOD ADD (OpenFlow 1.3) whose cookie is `seq`.
fn flow_mod(seq: u64) -> Vec<u8> {
    let mut body = seq.to_be_bytes().to_vec();
    body.extend_from_slice(&[0; 8]); // cookie mask
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x80, 0]); // table, ADD, timeouts, priority
    body.extend_from_slice(&[0xff; 4]); // buffer
    body.extend_from_slice(&[0xff; 8]); // out port, out group
    body.extend_from_slice(&[0; 4]); // flags, pad
    body.extend_from_slice(&[0, 1, 0, 12, 0x80, 0, 0, 4]);
    body.extend_from_slice(&((seq % 1000) as u32 + 1).to_be_bytes());
    body.extend_from_slice(&[0; 4]);
    openflow::message(openflow::OFP13_VERSION, 14, seq as u32, &body)
}

/// Where the flow number sits in [`packet_in`]'s message: the third byte of
/// the frame's IPv4 source address (header 8, fixed fields 16, match 16, pad 2,
/// Ethernet 14, IPv4 12).
const PACKET_IN_FLOW_AT: usize = 8 + 16 + 16 + 2 + 14 + 12 + 2;

/// Sets its flag when dropped: the flood writer has stopped, however it ended.
struct Finished(Arc<AtomicBool>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The agents, and where the synthetic ends meet them.
struct Agents {
    controller: AgentProcess,
    switch: AgentProcess,
    sink: TcpListener,
    switch_port: u16,
    _dir: tempfile::TempDir,
}

impl Agents {
    fn start(binary: &std::path::Path) -> Result<Agents> {
        let dir = tempfile::tempdir()?;
        pki::init_ca(dir.path(), "stall bench CA", Validity::days(1))?;
        pki::issue(dir.path(), "ctl", &[], Validity::days(1))?;
        pki::issue(dir.path(), "sw1", &[], Validity::days(1))?;
        let p = |f: &str| dir.path().join(f).display().to_string();
        let sink = TcpListener::bind("127.0.0.1:0")?;
        let quic_port = free_udp_port()?;
        let switch_port = free_port()?;
        let controller = AgentProcess::spawn(
            binary,
            "controller",
            &[
                "controller".into(),
                format!("--listen=127.0.0.1:{quic_port}"),
                format!("--ca={}", p("ca.crt")),
                format!("--cert={}", p("ctl.crt")),
                format!("--key={}", p("ctl.key")),
                format!("--service=openflow=tcp:{}", sink.local_addr()?),
            ],
            None,
        )?;
        let switch = AgentProcess::spawn(
            binary,
            "switch",
            &[
                "switch".into(),
                format!("--controller=127.0.0.1:{quic_port}"),
                "--server-name=ctl".into(),
                format!("--ca={}", p("ca.crt")),
                format!("--cert={}", p("sw1.crt")),
                format!("--key={}", p("sw1.key")),
                format!("--service=openflow=ptcp:{switch_port}:127.0.0.1"),
            ],
            None,
        )?;
        Ok(Agents {
            controller,
            switch,
            sink,
            switch_port,
            _dir: dir,
        })
    }

    /// A new OpenFlow session, handshaken (HELLO both ways, FEATURES_REQUEST and
    /// FEATURES_REPLY), so the `safe` lanes are in use: (switch end, controller end).
    fn session(&mut self) -> Result<(TcpStream, TcpStream)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut sw = loop {
            self.controller.check_alive()?;
            self.switch.check_alive()?;
            match TcpStream::connect(("127.0.0.1", self.switch_port)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => bail!("the switch agent never listened: {e}"),
            }
        };
        sw.write_all(&openflow::message(4, 0, 1, &[]))?;
        let (mut ctl, _) = self.sink.accept()?;
        for s in [&sw, &ctl] {
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            s.set_nodelay(true)?;
        }
        read_message(&mut ctl).context("HELLO to the controller")?;
        ctl.write_all(&openflow::message(4, 0, 1, &[]))?;
        ctl.write_all(&openflow::message(4, 5, 2, &[]))?;
        read_message(&mut sw)?;
        read_message(&mut sw)?;
        sw.write_all(&openflow::message(4, 6, 2, &[0; 24]))?;
        let reply = read_message(&mut ctl)?;
        if Header::parse(&reply).map(|h| h.kind()) != Some(Kind::FeaturesReply) {
            bail!("the controller got {reply:?}, not the FEATURES_REPLY");
        }
        Ok((sw, ctl))
    }

    fn pids(&self) -> (u32, u32) {
        (self.switch.child.id(), self.controller.child.id())
    }
}

/// Runs one scenario: `flooder` writes `flood(seq)` until told to stop; the
/// stalled end reads nothing but writes ECHO_REQUESTs, which the flooder's
/// side reads; afterwards the stalled end reads the whole flood and `check`s it.
fn scenario(
    name: &'static str,
    args: &StallArgs,
    agents: &mut Agents,
    stalled_is_controller: bool,
) -> Result<StallResult> {
    let (sw, ctl) = agents.session()?;
    let (flooder, mut stalled) = if stalled_is_controller {
        (sw, ctl)
    } else {
        (ctl, sw)
    };
    let (sw_pid, ctl_pid) = agents.pids();
    let (sw_before, ctl_before) = (rss_mib(sw_pid), rss_mib(ctl_pid));
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));

    // The flood, written as fast as the agents take it.
    let mut w = flooder.try_clone()?;
    let (s, n, f) = (stop.clone(), sent.clone(), finished.clone());
    let writer = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut seq = 0u64;
        let _done = Finished(f);
        while !s.load(Ordering::Relaxed) {
            let m = if stalled_is_controller {
                packet_in(seq as u32, (seq % 64) as u8)
            } else {
                flow_mod(seq)
            };
            w.write_all(&m)?;
            seq += 1;
            n.store(seq, Ordering::Relaxed);
        }
        Ok(seq)
    });
    // The flooder's side reads the stalled peer's echoes.
    let mut r = flooder.try_clone()?;
    r.set_read_timeout(None)?;
    let echoes = Arc::new(AtomicU64::new(0));
    let e = echoes.clone();
    let echo_reader = std::thread::spawn(move || {
        let mut delays = Vec::new();
        while let Ok(m) = read_message(&mut r) {
            let h = Header::parse(&m).expect("a message");
            if h.kind() == Kind::EchoRequest && m.len() >= 16 {
                let sent_ns = u64::from_be_bytes(m[8..16].try_into().expect("8 bytes"));
                delays.push((now_ns(start), now_ns(start).saturating_sub(sent_ns)));
                e.fetch_add(1, Ordering::Relaxed);
            }
        }
        delays
    });
    // The stalled peer: echoes only.
    let mut echo_w = stalled.try_clone()?;
    let mut peak = (sw_before, ctl_before);
    let mut xid = 0u32;
    let mut last_sent = (0, Instant::now());
    let min_stall = Duration::from_secs(args.seconds);
    let mut stall_end = None;
    while stall_end.is_none() {
        xid += 1;
        echo_w.write_all(&openflow::message(4, 2, xid, &now_ns(start).to_be_bytes()))?;
        let tick = Instant::now() + Duration::from_millis(args.echo_interval_ms);
        while Instant::now() < tick {
            peak.0 = peak.0.max(rss_mib(sw_pid));
            peak.1 = peak.1.max(rss_mib(ctl_pid));
            std::thread::sleep(Duration::from_millis(10));
        }
        let now_sent = sent.load(Ordering::Relaxed);
        if now_sent != last_sent.0 {
            last_sent = (now_sent, Instant::now());
        }
        // Backpressure has reached the flooder: nothing accepted for 500 ms.
        let blocked = last_sent.1.elapsed() >= Duration::from_millis(500);
        if start.elapsed() >= min_stall && blocked && echoes.load(Ordering::Relaxed) >= 5 {
            stall_end = Some(start.elapsed());
        }
        if start.elapsed() > min_stall + Duration::from_secs(60) {
            bail!(
                "{name}: after {:?}, the flood is still accepted ({}) or echoes did not get through ({})",
                start.elapsed(),
                !blocked,
                echoes.load(Ordering::Relaxed)
            );
        }
        agents.controller.check_alive()?;
        agents.switch.check_alive()?;
    }
    let stall = stall_end.expect("set");
    let flood_during = sent.load(Ordering::Relaxed);

    // The stalled peer reads again: everything, exactly once, in order.
    stop.store(true, Ordering::Relaxed);
    let (n, f) = (sent.clone(), finished.clone());
    let reader = std::thread::spawn(move || -> Result<(u64, bool)> {
        let mut count = 0u64;
        let mut ok = true;
        let mut last_per_flow = std::collections::HashMap::new();
        let mut next = 0u64;
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        stalled.set_read_timeout(Some(Duration::from_millis(200)))?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match stalled.read(&mut chunk) {
                Ok(0) => break,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
            let mut at = 0;
            while let Some(h) = Header::parse(&buf[at..]) {
                let len = usize::from(h.length).max(8);
                if buf.len() - at < len {
                    break;
                }
                let m = &buf[at..at + len];
                match h.kind() {
                    // Packets of one flow keep their order (docs/streams.md).
                    Kind::PacketIn => {
                        let flow = m[PACKET_IN_FLOW_AT];
                        let last = last_per_flow.insert(flow, h.xid);
                        ok &= last.is_none_or(|l| l < h.xid);
                        count += 1;
                    }
                    // Everything towards the switch stays in order.
                    Kind::FlowMod => {
                        ok &= u64::from(h.xid) == next % (1 << 32);
                        next += 1;
                        count += 1;
                    }
                    _ => {}
                }
                at += len;
            }
            buf.drain(..at);
            if f.load(Ordering::Relaxed) && count >= n.load(Ordering::Relaxed) {
                break;
            }
            if Instant::now() > deadline {
                bail!("the flood was not delivered within 120 s of the stall's end");
            }
        }
        Ok((count, ok))
    });
    let total = writer
        .join()
        .expect("flood writer")
        .context("the flood writer failed")?;
    let (received, in_order) = reader.join().expect("reader")?;
    // Closing ends the session (and the echo reader, which holds a clone).
    let _ = flooder.shutdown(std::net::Shutdown::Both);
    let delays = echo_reader.join().expect("echo reader");
    let during: Vec<f64> = delays
        .iter()
        .filter(|(at, _)| *at <= stall.as_nanos() as u64)
        .map(|(_, d)| *d as f64 / 1e6)
        .collect();
    let mut sorted = during.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        sorted
            .get(((sorted.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Ok(StallResult {
        scenario: name,
        stall_s: stall.as_secs_f64(),
        flood_sent_during_stall: flood_during,
        flood_total: total,
        switch_agent_rss_before_mib: sw_before,
        switch_agent_rss_peak_mib: peak.0,
        controller_agent_rss_before_mib: ctl_before,
        controller_agent_rss_peak_mib: peak.1,
        echoes_during_stall: during.len() as u64,
        echo_p50_ms: pct(0.5),
        echo_max_ms: pct(1.0),
        delivered_exactly_once_in_order: in_order && received == total,
    })
}

/// Runs both scenarios and prints a table; fails if a bound is broken.
pub fn run(args: StallArgs) -> Result<Vec<StallResult>> {
    let binary = match &args.quicsdn {
        Some(b) => b.clone(),
        None => crate::agents::quicsdn_binary()?,
    };
    let mut agents = Agents::start(&binary)?;
    let results = vec![
        scenario(
            "stalled controller, PACKET_IN flood",
            &args,
            &mut agents,
            true,
        )?,
        scenario("stalled switch, FLOW_MOD storm", &args, &mut agents, false)?,
    ];
    println!(
        "stall benchmark: quicsdn agents (safe mode) on loopback; the stalled peer reads nothing for at least {} s, sending ECHO_REQUEST every {} ms",
        args.seconds, args.echo_interval_ms
    );
    println!(
        "{:<38} {:>7} {:>12} {:>10} {:>10} {:>10} {:>10} {:>7} {:>9} {:>9} {:>6}",
        "scenario",
        "stall s",
        "flood held",
        "sw MiB",
        "sw peak",
        "ctl MiB",
        "ctl peak",
        "echoes",
        "echo p50",
        "echo max",
        "audit"
    );
    for r in &results {
        println!(
            "{:<38} {:>7.1} {:>12} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>7} {:>7.1}ms {:>7.1}ms {:>6}",
            r.scenario,
            r.stall_s,
            r.flood_sent_during_stall,
            r.switch_agent_rss_before_mib,
            r.switch_agent_rss_peak_mib,
            r.controller_agent_rss_before_mib,
            r.controller_agent_rss_peak_mib,
            r.echoes_during_stall,
            r.echo_p50_ms,
            r.echo_max_ms,
            if r.delivered_exactly_once_in_order {
                "ok"
            } else {
                "FAILED"
            }
        );
    }
    for r in &results {
        if r.growth_mib() > args.rss_bound_mib as f64 {
            bail!(
                "{}: an agent's RSS grew {:.1} MiB, over the {} MiB bound",
                r.scenario,
                r.growth_mib(),
                args.rss_bound_mib
            );
        }
        if r.echoes_during_stall == 0 {
            bail!("{}: no echo got through during the stall", r.scenario);
        }
        if !r.delivered_exactly_once_in_order {
            bail!(
                "{}: the flood was not delivered exactly once, in order",
                r.scenario
            );
        }
    }
    Ok(results)
}
