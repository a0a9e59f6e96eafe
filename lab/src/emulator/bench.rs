//! `quicsdn-lab bench emulator`: forwarder capacity with real frames. Prints numbers;
//! asserts nothing.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::link::{LinkSpec, default_exe};
use super::model::DirSettings;
use super::sys;
use super::traffic::{LinkGuard, NetnsGuard, SendPlan, UdpReceiver, spawn_sender};
use super::units::parse_duration_ns;

#[derive(Args, Debug, Clone)]
pub struct BenchOpts {
    /// Seconds of traffic.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Ethernet frame size in bytes (UDP payload = size - 42; at least 58).
    #[arg(long, default_value_t = 64)]
    pub frame: usize,
    /// Offered datagrams per second per direction (default: the 100k target plus 10 %);
    /// 0 = as fast as the senders can (saturation).
    #[arg(long, default_value_t = 110_000.0)]
    pub pps: f64,
    /// One-way delay on the link during the benchmark (exercises the delay line).
    #[arg(long, value_parser = parse_duration_ns, default_value = "0")]
    pub delay: u64,
    /// Only the A→B direction carries traffic.
    #[arg(long)]
    pub one_way: bool,
    /// Run the forwarder with normal scheduling instead of SCHED_FIFO (the lab's default).
    #[arg(long)]
    pub no_realtime: bool,
}

struct DirResult {
    sent: u64,
    offered: u64,
    delivered: u64,
    received: u64,
}

pub fn run(o: BenchOpts) -> Result<()> {
    let tag = format!("{:04x}", std::process::id() & 0xffff);
    let ns_a = NetnsGuard::create(&format!("qsdnEb{tag}-a"))?;
    let ns_b = NetnsGuard::create(&format!("qsdnEb{tag}-b"))?;
    let run_dir = std::env::temp_dir().join(format!("qsdnE-bench-{}", std::process::id()));
    let a = Ipv4Addr::new(10, 254, 253, 1);
    let b = Ipv4Addr::new(10, 254, 253, 2);
    let mut spec = LinkSpec::new(&format!("qsdnEb{tag}"), &ns_a.name, &ns_b.name, a, b)
        .with_settings(DirSettings {
            delay_ns: o.delay,
            ..Default::default()
        });
    spec.realtime = !o.no_realtime;
    spec.run_dir = run_dir.clone();
    spec.seed = Some(1);
    let link = LinkGuard::create(&spec, &default_exe()?)?;
    let ctl = link.rec.control();
    let pid = link.rec.pid;

    let payload = o.frame.max(58) - 42;
    let dur = Duration::from_secs_f64(o.seconds);
    let rx_b = UdpReceiver::start(&ns_b.name, SocketAddrV4::new(b, 9001), false)?;
    let rx_a = UdpReceiver::start(&ns_a.name, SocketAddrV4::new(a, 9002), false)?;
    let plan = SendPlan {
        count: u64::MAX,
        duration: Some(dur),
        payload,
        pps: o.pps,
        batch: 32,
        realtime: false,
    };
    ctl.reset_counters()?;
    let cpu0 = sys::process_cpu_ns(pid)?;
    let t0 = sys::monotonic_ns();
    let tx_ab = spawn_sender(
        &ns_a.name,
        SocketAddrV4::new(a, 0),
        SocketAddrV4::new(b, 9001),
        plan.clone(),
    );
    let tx_ba = (!o.one_way).then(|| {
        spawn_sender(
            &ns_b.name,
            SocketAddrV4::new(b, 0),
            SocketAddrV4::new(a, 9002),
            plan.clone(),
        )
    });
    let s_ab = tx_ab
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    let s_ba = match tx_ba {
        Some(h) => h.join().map_err(|_| anyhow::anyhow!("sender panicked"))??,
        None => Default::default(),
    };
    let elapsed = (sys::monotonic_ns() - t0) as f64 / 1e9;
    let cpu = sys::process_cpu_ns(pid)? - cpu0;
    let st = ctl.show()?;
    let exp_b = st.a_to_b.counters.total().delivered.frames;
    let exp_a = st.b_to_a.counters.total().delivered.frames;
    let got_b = rx_b.finish_count(exp_b, Duration::from_secs(2))?;
    let got_a = rx_a.finish_count(exp_a, Duration::from_secs(2))?;
    let st = ctl.show().context("final counters")?;
    let res = |s: &super::control::DirState, sent: u64, received: u64| DirResult {
        sent,
        offered: s.counters.total().offered.frames,
        delivered: s.counters.total().delivered.frames,
        received,
    };
    let r_ab = res(&st.a_to_b, s_ab.sent, got_b);
    let r_ba = res(&st.b_to_a, s_ba.sent, got_a);
    let total_fwd = r_ab.delivered + r_ba.delivered;
    println!(
        "emulator benchmark: {}-byte frames, {:.2} s, delay {}, forwarder {}",
        payload + 42,
        elapsed,
        super::units::fmt_duration_ns(o.delay),
        if o.no_realtime {
            "SCHED_OTHER"
        } else {
            "SCHED_FIFO"
        }
    );
    for (name, r) in [("a->b", &r_ab), ("b->a", &r_ba)] {
        if r.sent == 0 {
            continue;
        }
        println!(
            "  {name}: sent {:>9.0}/s  offered to emulator {:>9.0}/s  forwarded {:>9.0}/s  \
             received {:>9.0}/s  (dropped by the kernel before the emulator: {:.2} %)",
            r.sent as f64 / elapsed,
            r.offered as f64 / elapsed,
            r.delivered as f64 / elapsed,
            r.received as f64 / elapsed,
            100.0 * (r.sent - r.offered.min(r.sent)) as f64 / r.sent.max(1) as f64
        );
        if o.pps > 0.0 && (r.sent as f64 / elapsed) < 0.95 * o.pps {
            println!(
                "        (the sender reached only {:.0} % of --pps {}: the machine is short of CPU)",
                100.0 * r.sent as f64 / elapsed / o.pps,
                o.pps
            );
        }
    }
    println!(
        "  forwarder CPU: {:.3} s over {:.2} s ({:.0} % of one core), {:.2} us per forwarded frame",
        cpu as f64 / 1e9,
        elapsed,
        100.0 * cpu as f64 / 1e9 / elapsed,
        cpu as f64 / 1e3 / total_fwd.max(1) as f64
    );
    println!(
        "  capacity estimate at 100 % of one core: {:.0} frames/s total",
        total_fwd as f64 / (cpu as f64 / 1e9)
    );
    drop(link);
    let _ = std::fs::remove_dir_all(&run_dir);
    Ok(())
}
