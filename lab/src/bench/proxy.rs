//! `quicsdn-lab bench proxy`: bulk throughput through the TCP↔QUIC proxy pair
//! (`quicsdn proxy client` → QUIC → `quicsdn proxy server`, two real
//! processes) on loopback, against a direct TCP connection in the same run,
//! with the CPU time each path costs per gigabyte.
//!
//! Each run moves `--bytes` over `--connections` parallel TCP connections,
//! in one direction: `down` (the target sends, the application behind the
//! proxy client receives: a download, as in the paper's Fig. 8) or `up`. The
//! receiver checks every byte (each 8-byte word carries its offset), so a
//! fast wrong answer fails. CPU: the two proxy processes' user + system time
//! (`/proc/PID/stat`), and this process's (the sender and receiver).
//!
//! With `--rate`/`--rtt`/`--loss` the two sides are two network namespaces
//! joined by the lab's emulated link (namespaces `q14pb-s`, `q14pb-c`,
//! [`crate::bench::pair`]) instead of loopback: the application and the proxy
//! client on one side, the proxy server and the target on the other; direct
//! TCP crosses the same link with the congestion controllers of
//! `--tcp-congestion` (set per socket: this kernel's default is BBR, the
//! paper's TCP is CUBIC). Needs root.
//!
//! A benchmark: it prints numbers and ratios and asserts nothing about speed.

use crate::bench::relay::{AgentProcess, default_binary, free_port, free_udp_port};
use crate::emulator::sys::process_cpu_ns;
use anyhow::{Context, Result, anyhow, bail};
use quicsdn_transport::pki::{self, Validity};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Target → application (a download through the pair).
    Down,
    /// Application → target.
    Up,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Bytes per run (with k, M, G suffixes, powers of 1024).
    #[arg(long, default_value = "1G")]
    pub bytes: String,
    /// Parallel TCP connections per run (the bytes are split among them).
    #[arg(long, default_value_t = 1)]
    pub connections: u32,
    /// Runs per path; the best is reported and all are printed.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Direction(s) of the transfer.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "down,up")]
    pub direction: Vec<Direction>,
    /// Congestion controller(s) of the proxies, comma-separated (bbr-lt is
    /// the proxy's default, bbr quinn's BBR).
    #[arg(long, value_delimiter = ',', default_value = "bbr-lt")]
    pub congestion: Vec<String>,
    /// Worker threads of each proxy process (`quicsdn --threads`; default: one per CPU).
    #[arg(long)]
    pub proxy_threads: Option<usize>,
    /// Extra option for both proxies (repeatable), e.g. --proxy-arg=--stream-window=4M.
    #[arg(long = "proxy-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub proxy_args: Vec<String>,
    /// The quicsdn binary (default: next to this one).
    #[arg(long)]
    pub quicsdn: Option<PathBuf>,
    /// Across an emulated link of this rate (e.g. 100mbit) instead of loopback.
    #[arg(long)]
    pub rate: Option<String>,
    /// Round-trip time of the emulated link (half each way).
    #[arg(long, default_value = "0ms")]
    pub rtt: String,
    /// Random loss rate(s) of the emulated link, both directions, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub loss: Vec<String>,
    /// Congestion controller(s) of direct TCP over the emulated link.
    #[arg(long, value_delimiter = ',', default_value = "cubic")]
    pub tcp_congestion: Vec<String>,
}

/// Where the two ends of a path live.
#[derive(Clone)]
struct Sides {
    /// Namespaces (application side, target side); `None`: this one.
    app_ns: Option<String>,
    target_ns: Option<String>,
    /// The target side's address, as the application side reaches it.
    target_ip: std::net::IpAddr,
}

impl Sides {
    fn loopback() -> Sides {
        Sides {
            app_ns: None,
            target_ns: None,
            target_ip: [127, 0, 0, 1].into(),
        }
    }

    /// Runs `f` in the application side's namespace.
    fn at_app<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        in_ns(self.app_ns.as_deref(), f)
    }

    /// Runs `f` in the target side's namespace.
    fn at_target<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        in_ns(self.target_ns.as_deref(), f)
    }
}

/// Runs `f` in namespace `ns` (on a thread of its own), or here.
fn in_ns<T: Send + 'static>(ns: Option<&str>, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    Ok(match ns {
        Some(ns) => crate::emulator::sys::in_netns(ns, f)?,
        None => f(),
    })
}

/// Sets a socket's TCP congestion controller (TCP_CONGESTION).
pub(crate) fn set_tcp_congestion(fd: std::os::fd::RawFd, name: &str) -> Result<()> {
    // SAFETY: setsockopt with a valid fd and a buffer of the given length.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        bail!(
            "TCP congestion control {name:?}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub(crate) fn parse_bytes(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow!("--bytes {s:?}: expected a number with an optional k, M or G"))?;
    Ok(n * mult)
}

/// Sends `len` bytes of the pattern (each 8-byte word is its offset), then FIN.
fn send_pattern(mut s: TcpStream, len: u64) -> Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        for (i, w) in buf[..n].chunks_mut(8).enumerate() {
            let word = (at + 8 * i as u64).to_le_bytes();
            w.copy_from_slice(&word[..w.len()]);
        }
        s.write_all(&buf[..n])?;
        at += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    Ok(())
}

/// Reads to the end, checking the pattern; returns the bytes read.
fn receive_pattern(mut s: TcpStream) -> Result<u64> {
    let mut buf = vec![0u8; 256 * 1024 + 8];
    let (mut at, mut have) = (0u64, 0usize);
    loop {
        let n = s.read(&mut buf[have..])?;
        if n == 0 {
            if have != 0 && !check_tail(&buf[..have], at) {
                bail!("the stream ended inside a word at byte {at}");
            }
            return Ok(at + have as u64);
        }
        have += n;
        let whole = have / 8 * 8;
        for (i, w) in buf[..whole].chunks(8).enumerate() {
            let expected = at + 8 * i as u64;
            if w != expected.to_le_bytes() {
                bail!("byte {expected} arrived altered");
            }
        }
        at += whole as u64;
        buf.copy_within(whole..have, 0);
        have -= whole;
    }
}

/// A final partial word.
fn check_tail(tail: &[u8], at: u64) -> bool {
    tail == &at.to_le_bytes()[..tail.len()]
}

struct RunResult {
    seconds: f64,
    bytes: u64,
    /// CPU seconds of the proxy processes (0 for direct).
    proxy_cpu: f64,
    /// CPU seconds of this process (sender and receiver).
    endpoint_cpu: f64,
}

fn own_cpu() -> f64 {
    process_cpu_ns(std::process::id()).unwrap_or(0) as f64 / 1e9
}

fn proxies_cpu(pids: &[u32]) -> f64 {
    pids.iter()
        .map(|p| process_cpu_ns(*p).unwrap_or(0) as f64 / 1e9)
        .sum()
}

/// One run: `connections` connections from the application side to
/// `connect_to`, accepted at `target`, `bytes` in all, in `direction`.
#[allow(clippy::too_many_arguments)]
fn run_once(
    sides: &Sides,
    target: &TcpListener,
    connect_to: SocketAddr,
    bytes: u64,
    connections: u32,
    direction: Direction,
    tcp_congestion: Option<&str>,
    proxy_pids: &[u32],
) -> Result<RunResult> {
    let per = bytes / u64::from(connections);
    let (cpu0, own0) = (proxies_cpu(proxy_pids), own_cpu());
    let start = Instant::now();
    let mut threads = Vec::new();
    for _ in 0..connections {
        let app = sides
            .at_app(move || TcpStream::connect(connect_to))?
            .with_context(|| format!("cannot connect to {connect_to}"))?;
        let (far, _) = target.accept()?;
        if let Some(cc) = tcp_congestion {
            use std::os::fd::AsRawFd;
            set_tcp_congestion(app.as_raw_fd(), cc)?;
            set_tcp_congestion(far.as_raw_fd(), cc)?;
        }
        let (sender, receiver) = match direction {
            Direction::Down => (far, app),
            Direction::Up => (app, far),
        };
        threads.push(std::thread::spawn(move || send_pattern(sender, per)));
        threads.push(std::thread::spawn(move || {
            let got = receive_pattern(receiver)?;
            if got != per {
                bail!("{got} of {per} bytes arrived");
            }
            Ok(())
        }));
    }
    for t in threads {
        t.join()
            .map_err(|_| anyhow!("a transfer thread panicked"))??;
    }
    Ok(RunResult {
        seconds: start.elapsed().as_secs_f64(),
        bytes: per * u64::from(connections),
        proxy_cpu: proxies_cpu(proxy_pids) - cpu0,
        endpoint_cpu: own_cpu() - own0,
    })
}

/// The proxy pair, running.
struct ProxyPair {
    server: AgentProcess,
    client: AgentProcess,
    /// Where the application connects (in its namespace).
    listen: SocketAddr,
}

fn start_pair(
    args: &ProxyArgs,
    binary: &std::path::Path,
    dir: &std::path::Path,
    sides: &Sides,
    target_port: u16,
    congestion: &str,
) -> Result<ProxyPair> {
    let p = |f: &str| dir.join(f).display().to_string();
    let udp = free_udp_port()?;
    let tcp = free_port()?;
    let mut common = vec![
        format!("--ca={}", p("ca.crt")),
        format!("--congestion={congestion}"),
    ];
    common.extend(args.proxy_args.iter().cloned());
    let listen_ip = if sides.target_ns.is_some() {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    };
    let mut server_args = vec![
        "proxy".to_string(),
        "server".into(),
        format!("--listen={listen_ip}:{udp}"),
        format!("--cert={}", p("server.crt")),
        format!("--key={}", p("server.key")),
        format!("--forward=bulk=tcp:127.0.0.1:{target_port}"),
    ];
    server_args.extend(common.iter().cloned());
    let mut client_args = vec![
        "proxy".to_string(),
        "client".into(),
        format!("--server={}:{udp}", sides.target_ip),
        "--server-name=server".into(),
        format!("--cert={}", p("client.crt")),
        format!("--key={}", p("client.key")),
        format!("--forward=bulk=ptcp:{tcp}"),
    ];
    client_args.extend(common);
    let server = AgentProcess::spawn_in(
        sides.target_ns.as_deref(),
        binary,
        "proxy server",
        &server_args,
        args.proxy_threads,
    )?;
    let client = AgentProcess::spawn_in(
        sides.app_ns.as_deref(),
        binary,
        "proxy client",
        &client_args,
        args.proxy_threads,
    )?;
    Ok(ProxyPair {
        server,
        client,
        listen: SocketAddr::from(([127, 0, 0, 1], tcp)),
    })
}

/// The emulated link's settings for one loss rate.
fn link_settings(rate: &str, rtt: &str, loss: &str) -> Result<crate::emulator::DirSettings> {
    use crate::emulator::units::{parse_duration_ns, parse_rate_bps};
    Ok(crate::emulator::DirSettings {
        delay_ns: parse_duration_ns(rtt).map_err(|e| anyhow!("--rtt: {e}"))? / 2,
        rate_bps: parse_rate_bps(rate).map_err(|e| anyhow!("--rate: {e}"))?,
        loss: crate::emulator::cli::parse_loss(loss).map_err(|e| anyhow!("--loss: {e}"))?,
        ..Default::default()
    })
}

pub fn run(args: ProxyArgs) -> Result<()> {
    let bytes = parse_bytes(&args.bytes)?;
    if args.connections == 0 || args.runs == 0 {
        bail!("--connections and --runs must be at least 1");
    }
    let binary = match &args.quicsdn {
        Some(b) => b.clone(),
        None => default_binary()?,
    };
    let dir = tempfile::tempdir()?;
    pki::init_ca(dir.path(), "proxy bench CA", Validity::days(30))?;
    pki::issue(dir.path(), "server", &[], Validity::days(30))?;
    pki::issue(dir.path(), "client", &[], Validity::days(30))?;
    let losses = match &args.rate {
        Some(_) => args.loss.clone(),
        None => vec!["0".to_string()],
    };
    println!(
        "proxy benchmark: {} MiB per run over {} connection(s), {} run(s) per path, {}; \
         proxies: {} worker thread(s) each{}",
        bytes >> 20,
        args.connections,
        args.runs,
        match &args.rate {
            Some(r) => format!("across an emulated link of {r}, RTT {}", args.rtt),
            None => "on loopback".into(),
        },
        args.proxy_threads
            .map_or("default".to_string(), |n| n.to_string()),
        if args.proxy_args.is_empty() {
            String::new()
        } else {
            format!(", {}", args.proxy_args.join(" "))
        }
    );
    println!(
        "\n{:<6} {:<6} {:<18} {:>10} {:>10} {:>8} {:>14} {:>16}   runs (MB/s)",
        "loss",
        "dir",
        "path",
        "best MB/s",
        "Mbit/s",
        "ratio",
        "proxy CPU s/GB",
        "endpoint CPU s/GB"
    );
    for loss in &losses {
        // The emulated link, if any: rebuilt for each loss rate.
        let (_link, sides) = match &args.rate {
            Some(rate) => {
                let spec = crate::bench::pair::PairSpec {
                    prefix: "q14pb".into(),
                    transport: crate::bench::pair::BenchTransport::Tcp,
                    link_seed: None,
                    link: link_settings(rate, &args.rtt, loss)?,
                    agent_args: vec![],
                    dir: dir.path().join("pair"),
                };
                let pair = crate::bench::pair::Pair::up(&spec)?;
                let sides = Sides {
                    app_ns: Some(pair.sw.name.clone()),
                    target_ns: Some(pair.ctl.name.clone()),
                    target_ip: crate::bench::pair::CTL_ADDR.into(),
                };
                (Some(pair), sides)
            }
            None => (None, Sides::loopback()),
        };
        let bind_ip = if sides.target_ns.is_some() {
            "0.0.0.0:0"
        } else {
            "127.0.0.1:0"
        };
        let target = sides.at_target(move || TcpListener::bind(bind_ip))??;
        let target_port = target.local_addr()?.port();
        let direct_addr = SocketAddr::new(sides.target_ip, target_port);
        let tcp_ccs: Vec<Option<&str>> = if args.rate.is_some() {
            args.tcp_congestion
                .iter()
                .map(|c| Some(c.as_str()))
                .collect()
        } else {
            vec![None]
        };
        for &direction in &args.direction {
            let dname = match direction {
                Direction::Down => "down",
                Direction::Up => "up",
            };
            let mut baseline = None;
            for cc in &tcp_ccs {
                let direct: Vec<RunResult> = (0..args.runs)
                    .map(|_| {
                        run_once(
                            &sides,
                            &target,
                            direct_addr,
                            bytes,
                            args.connections,
                            direction,
                            *cc,
                            &[],
                        )
                    })
                    .collect::<Result<_>>()?;
                let b = *baseline.get_or_insert(best(&direct));
                let name = match cc {
                    Some(cc) => format!("direct tcp {cc}"),
                    None => "direct tcp".into(),
                };
                print_row(loss, dname, &name, &direct, b);
            }
            let baseline = baseline.expect("at least one direct path");
            for congestion in &args.congestion {
                let mut pair =
                    start_pair(&args, &binary, dir.path(), &sides, target_port, congestion)?;
                wait_ready(&mut pair, &sides, &target)?;
                let pids = [pair.server.child.id(), pair.client.child.id()];
                let runs: Vec<RunResult> = (0..args.runs)
                    .map(|_| {
                        run_once(
                            &sides,
                            &target,
                            pair.listen,
                            bytes,
                            args.connections,
                            direction,
                            None,
                            &pids,
                        )
                    })
                    .collect::<Result<_>>()?;
                pair.server.check_alive()?;
                pair.client.check_alive()?;
                print_row(
                    loss,
                    dname,
                    &format!("proxy quic {congestion}"),
                    &runs,
                    baseline,
                );
            }
        }
    }
    println!(
        "\nratio: best MB/s against the first direct TCP path's best in the same run. CPU per GB: \
         user + system time of the two proxy processes, and of the sending and receiving \
         endpoints (this process)."
    );
    Ok(())
}

/// Ready when one byte makes it through the pair.
fn wait_ready(pair: &mut ProxyPair, sides: &Sides, target: &TcpListener) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        pair.server.check_alive()?;
        pair.client.check_alive()?;
        let listen = pair.listen;
        if let Ok(mut app) = sides.at_app(move || TcpStream::connect(listen))? {
            app.write_all(b"x")?;
            app.shutdown(std::net::Shutdown::Write)?;
            let (mut far, _) = target.accept()?;
            far.set_read_timeout(Some(Duration::from_secs(30)))?;
            let mut got = Vec::new();
            far.read_to_end(&mut got)
                .context("no byte made it through the proxies")?;
            if got == b"x" {
                return Ok(());
            }
            bail!("the probe arrived as {got:?}");
        }
        if Instant::now() > deadline {
            bail!("the proxy client never listened on {}", pair.listen);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mbps(r: &RunResult) -> f64 {
    r.bytes as f64 / r.seconds / 1e6
}

fn best(runs: &[RunResult]) -> f64 {
    runs.iter().map(mbps).fold(0.0, f64::max)
}

fn print_row(loss: &str, dir: &str, path: &str, runs: &[RunResult], direct_best: f64) {
    let gb: f64 = runs.iter().map(|r| r.bytes as f64 / 1e9).sum();
    let proxy_cpu: f64 = runs.iter().map(|r| r.proxy_cpu).sum();
    let endpoint_cpu: f64 = runs.iter().map(|r| r.endpoint_cpu).sum();
    println!(
        "{:<6} {:<6} {:<18} {:>10.1} {:>10.1} {:>7.3}x {:>14.2} {:>16.2}   {}",
        loss,
        dir,
        path,
        best(runs),
        best(runs) * 8.0,
        best(runs) / direct_best,
        proxy_cpu / gb,
        endpoint_cpu / gb,
        runs.iter()
            .map(|r| format!("{:.1}", mbps(r)))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_checks_every_byte() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let t = std::thread::spawn(move || send_pattern(a, 1_000_003));
        assert_eq!(receive_pattern(b).unwrap(), 1_000_003);
        t.join().unwrap().unwrap();
        // An altered byte is caught.
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut w = a;
        w.write_all(&0u64.to_le_bytes()).unwrap();
        w.write_all(&9u64.to_le_bytes()).unwrap();
        drop(w);
        assert!(
            receive_pattern(b)
                .unwrap_err()
                .to_string()
                .contains("byte 8")
        );
        assert_eq!(parse_bytes("64M").unwrap(), 64 << 20);
        assert!(parse_bytes("lots").is_err());
    }
}
