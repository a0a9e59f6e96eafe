//! Real-traffic tests of the link emulator: namespaces, persistent TAPs, the forwarder
//! process (the built `quicsdn-lab` binary), UDP/TCP traffic from threads that entered the
//! namespaces. Need root. Every namespace, TAP and link name starts with `qsdnE` and is
//! removed by the guards that created it.
//!
//! The tests share the machine's two cores, so they run one at a time (a mutex) and never
//! assert timings beyond the accuracy bounds of issue 3.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quicsdn_lab::emulator::control::LinkState;
use quicsdn_lab::emulator::link::{LinkSpec, restart_forwarder};
use quicsdn_lab::emulator::model::{Pipe, PipeConfig, Tally, Verdict};
use quicsdn_lab::emulator::rng::Xoshiro256pp;
use quicsdn_lab::emulator::traffic::{
    LinkGuard, NetnsGuard, SendPlan, UdpReceiver, percentile, spawn_sender,
};
use quicsdn_lab::emulator::{Class, DirPatch, DirSettings, LossModel, sys};

const EXE: &str = env!("CARGO_BIN_EXE_quicsdn-lab");
const MS: u64 = 1_000_000;

static SERIAL: Mutex<()> = Mutex::new(());

fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("QUICSDN_LAB_SKIP_NETNS").is_some() {
        eprintln!("skipping: not root and QUICSDN_LAB_SKIP_NETNS is set");
        return false;
    }
    panic!("these tests need root (namespaces, TAPs); set QUICSDN_LAB_SKIP_NETNS=1 to skip");
}

struct Env {
    link: LinkGuard,
    a: Ipv4Addr,
    b: Ipv4Addr,
    ns_a: String,
    ns_b: String,
    run_dir: PathBuf,
    // Dropped last: after the link (field order is drop order).
    _nsb: NetnsGuard,
    _nsa: NetnsGuard,
}

impl Env {
    /// Two fresh namespaces `qsdnE<tag><pid>-a/-b` and a link `qsdnE<tag><pid>`.
    fn new(tag: &str, net: u8, settings: DirSettings) -> Env {
        Self::with_spec(tag, net, |s| *s = s.clone().with_settings(settings))
    }

    fn with_spec(tag: &str, net: u8, f: impl FnOnce(&mut LinkSpec)) -> Env {
        let id = format!("qsdnE{tag}{:04x}", std::process::id() & 0xffff);
        let nsa = NetnsGuard::create(&format!("{id}-a")).unwrap();
        let nsb = NetnsGuard::create(&format!("{id}-b")).unwrap();
        let a = Ipv4Addr::new(10, 254, net, 1);
        let b = Ipv4Addr::new(10, 254, net, 2);
        let run_dir = std::env::temp_dir().join(format!("{id}-run"));
        let mut spec = LinkSpec::new(&id, &nsa.name, &nsb.name, a, b);
        spec.run_dir = run_dir.clone();
        spec.seed = Some(0x5eed);
        f(&mut spec);
        let link = LinkGuard::create(&spec, Path::new(EXE)).unwrap();
        Env {
            link,
            a,
            b,
            ns_a: nsa.name.clone(),
            ns_b: nsb.name.clone(),
            run_dir,
            _nsb: nsb,
            _nsa: nsa,
        }
    }

    fn show(&self) -> LinkState {
        self.link.rec.control().show().unwrap()
    }

    /// Waits until nothing is in flight in either direction (the emulator has decided the
    /// fate of every frame it read).
    fn wait_idle(&self) -> LinkState {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = self.show();
            if st.a_to_b.in_flight == 0 && st.b_to_a.in_flight == 0 {
                return st;
            }
            assert!(Instant::now() < deadline, "link never drained: {st:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Per-class offered frames and kernel statistics, for failure messages.
    fn diag(&self) -> String {
        let st = self.show();
        let per_class: Vec<String> = Class::ALL
            .iter()
            .map(|&c| {
                format!(
                    "{}={}",
                    c.name(),
                    st.a_to_b.counters.class(c).offered.frames
                )
            })
            .collect();
        format!(
            "a->b offered by class: {}\n{}",
            per_class.join(" "),
            self.kernel_drops()
        )
    }

    /// Kernel statistics that explain frames lost outside the emulator.
    fn kernel_drops(&self) -> String {
        let ip = |ns: &str, tap: &str| {
            let o = Command::new("ip")
                .args(["-n", ns, "-s", "link", "show", "dev", tap])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let nstat = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns_b,
                "nstat",
                "-az",
                "UdpRcvbufErrors",
                "UdpInErrors",
                "UdpInDatagrams",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!(
            "tap a: {}\ntap b: {}\nns b: {}",
            ip(&self.ns_a, &self.link.rec.tap_a),
            ip(&self.ns_b, &self.link.rec.tap_b),
            nstat
        )
    }

    /// Waits until the emulator has read at least `a_to_b` UDP frames from A's TAP (they may
    /// still sit in the kernel's TAP queue when the sender returns) and decided the fate
    /// of all of them. Gives up after 5 s: the caller's assertions then show the shortfall.
    fn wait_settled(&self, a_to_b: u64) -> LinkState {
        let deadline = Instant::now() + Duration::from_secs(5);
        let udp = |st: &LinkState| {
            let c = &st.a_to_b.counters;
            c.class(Class::UdpOther).offered.frames + c.class(Class::Quic).offered.frames
        };
        while udp(&self.show()) < a_to_b && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.wait_idle()
    }

    /// Sends `plan` from A to B (UDP port `port`), returns (sent, samples received).
    fn udp_a_to_b(
        &self,
        port: u16,
        plan: SendPlan,
    ) -> (u64, Vec<quicsdn_lab::emulator::traffic::Sample>) {
        let rx = UdpReceiver::start(&self.ns_b, SocketAddrV4::new(self.b, port), true).unwrap();
        let tx = spawn_sender(
            &self.ns_a,
            SocketAddrV4::new(self.a, 0),
            SocketAddrV4::new(self.b, port),
            plan,
        );
        let sent = tx.join().unwrap().unwrap().sent;
        let st = self.wait_settled(sent);
        let delivered = st.a_to_b.counters.class(Class::UdpOther).delivered.frames
            + st.a_to_b.counters.class(Class::Quic).delivered.frames;
        let samples = rx.finish(delivered, Duration::from_secs(5)).unwrap();
        (sent, samples)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

/// Sequence numbers that never arrived (at most 10).
fn missing(s: &[quicsdn_lab::emulator::traffic::Sample], sent: u64) -> Vec<u64> {
    let got: std::collections::HashSet<u64> = s.iter().map(|x| x.seq).collect();
    (0..sent).filter(|q| !got.contains(q)).take(10).collect()
}

fn delays_ms(samples: &[quicsdn_lab::emulator::traffic::Sample]) -> Vec<i64> {
    let mut d: Vec<i64> = samples.iter().map(|s| s.delay_ns()).collect();
    d.sort_unstable();
    d
}

fn ms(ns: i64) -> f64 {
    ns as f64 / 1e6
}

#[test]
fn delay_p50_is_within_0_2ms_of_50ms() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let env = Env::new("dl", 11, DirSettings::default());
    let plan = SendPlan {
        count: 3000,
        payload: 100,
        pps: 2000.0,
        realtime: true,
        ..Default::default()
    };
    // What the path costs without a delay (the emulator's read and write, the
    // kernel, the receiver's wake-up): on a busy VM its median alone can
    // reach 0.2 ms, and it is not the emulator's delay.
    let (sent0, zero) = env.udp_a_to_b(8999, plan.clone());
    assert_eq!(zero.len() as u64, sent0);
    let base = percentile(&delays_ms(&zero), 0.5);
    env.link
        .rec
        .control()
        .set_both(DirPatch {
            delay_ns: Some(50 * MS),
            ..Default::default()
        })
        .unwrap();
    let (sent, samples) = env.udp_a_to_b(9000, plan);
    assert_eq!(
        samples.len() as u64,
        sent,
        "no loss configured, every datagram arrives"
    );
    let d = delays_ms(&samples);
    let (p0, p50, p99) = (d[0], percentile(&d, 0.5), percentile(&d, 0.99));
    eprintln!(
        "one-way delay for 50ms: min {:.3} p50 {:.3} p99 {:.3} max {:.3} ms over {} frames; p50 without delay {:.3} ms",
        ms(p0),
        ms(p50),
        ms(p99),
        ms(*d.last().unwrap()),
        d.len(),
        ms(base)
    );
    // The delay the emulator adds: the median over the undelayed path's.
    let added = ms(p50 - base);
    assert!(
        (added - 50.0).abs() <= 0.2,
        "p50 {} ms, {added} ms over the undelayed path",
        ms(p50)
    );
    // Released no earlier than read + 50 ms, and the read follows the send.
    assert!(ms(p0) >= 49.99, "min {} ms", ms(p0));
    let st = env.show();
    assert_eq!(st.a_to_b.counters.total().offered.frames, sent0 + sent);
}

#[test]
fn jitter_without_then_with_reordering() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let env = Env::new("jt", 12, DirSettings::default());
    let plan = SendPlan {
        count: 4000,
        payload: 64,
        pps: 4000.0, // 0.25 ms apart: far closer than the 10 ms jitter span
        realtime: true,
        ..Default::default()
    };
    // What the path costs without delay or jitter, as in the delay test. The
    // upper bounds below are judged over it; the lower bounds need none.
    let (sent0, zero) = env.udp_a_to_b(8999, plan.clone());
    assert_eq!(zero.len() as u64, sent0);
    let base = ms(percentile(&delays_ms(&zero), 0.5));
    env.link
        .rec
        .control()
        .set_both(DirPatch {
            delay_ns: Some(20 * MS),
            jitter_ns: Some(5 * MS),
            ..Default::default()
        })
        .unwrap();
    // Without reordering: arrival order is send order, delays stay in [15, 25] ms plus
    // the waiting that monotonic release adds (bounded by the jitter span).
    let (sent, s) = env.udp_a_to_b(9000, plan.clone());
    assert_eq!(
        s.len() as u64,
        sent,
        "missing {:?}; {}",
        missing(&s, sent),
        env.diag()
    );
    let inversions = s.windows(2).filter(|w| w[1].seq < w[0].seq).count();
    assert_eq!(inversions, 0, "jitter without reorder must keep order");
    let d = delays_ms(&s);
    let (p5, p50, p90, p95) = (
        percentile(&d, 0.05),
        percentile(&d, 0.5),
        percentile(&d, 0.9),
        percentile(&d, 0.95),
    );
    eprintln!(
        "jitter 5ms no-reorder: min {:.2} p5 {:.2} p50 {:.2} p90 {:.2} p95 {:.2} max {:.2} ms; p50 without delay {base:.3} ms",
        ms(d[0]),
        ms(p5),
        ms(p50),
        ms(p90),
        ms(p95),
        ms(*d.last().unwrap())
    );
    assert!(ms(d[0]) >= 14.99, "min {}", ms(d[0]));
    // Upper bounds on percentiles, not the max. Monotonic release alone puts
    // the p90 at 24.4 ms and the p99 at 24.9 (20 simulated runs of this plan);
    // a doubled jitter would put them at 29.1 and 29.8. What the real path
    // adds on top is more than the undelayed path's median: a frame with a
    // late release holds back the ones behind it, they leave the emulator
    // together, and the last of a burst waits for the kernel and the receiver
    // to take the others. Seen: p90 0.6 ms over the model on this VM when idle
    // (the reordering run below, whose frames leave one by one, 0.1 ms), 1.1
    // ms in CI (25.506 ms failed the earlier bound of 25.5), and 0.1 ms under
    // two busy loops, which keep the vCPUs from sleeping.
    // A stall of any of the three processes delays every frame sent
    // meanwhile: p99 up to 28.3 ms seen. So the bulk (p90) must stay 2 ms
    // within the model and 2.6 ms clear of a doubled jitter, and the tail
    // (p99) within a stall (an unbounded wait would not pass).
    let (p90, p99) = (ms(p90) - base, ms(percentile(&d, 0.99)) - base);
    assert!(p90 <= 26.5, "p90 {p90} ms over the undelayed path");
    assert!(p99 <= 30.0, "p99 {p99} ms over the undelayed path");
    assert!(ms(p95) - ms(p5) > 1.0, "delays must actually vary");

    // Runtime change to reordering jitter: the raw uniform distribution shows.
    env.link
        .rec
        .control()
        .set_both(DirPatch {
            reorder: Some(true),
            ..Default::default()
        })
        .unwrap();
    let (sent, s) = env.udp_a_to_b(9001, plan);
    assert_eq!(
        s.len() as u64,
        sent,
        "missing {:?}; {}",
        missing(&s, sent),
        env.diag()
    );
    let inversions = s.windows(2).filter(|w| w[1].seq < w[0].seq).count();
    let d = delays_ms(&s);
    let q = |x| ms(percentile(&d, x)) - base;
    eprintln!(
        "jitter 5ms reorder over the undelayed path: min {:.2} p10 {:.2} p50 {:.2} p90 {:.2} max {:.2} ms, {inversions} inversions",
        ms(d[0]) - base,
        q(0.1),
        q(0.5),
        q(0.9),
        ms(*d.last().unwrap()) - base
    );
    assert!(
        inversions > 100,
        "reordering expected, got {inversions} inversions"
    );
    assert!(ms(d[0]) >= 14.99, "min {}", ms(d[0]));
    // The tail within a stall, as above; the quantiles below check the bulk.
    assert!(q(0.99) <= 30.0, "p99 {}", q(0.99));
    // Uniform on [15, 25]: p10 = 16, p50 = 20, p90 = 24 (4000 samples: ±0.3 is > 4 σ).
    assert!((q(0.5) - 20.0).abs() < 0.4, "p50 {}", q(0.5));
    assert!((q(0.1) - 16.0).abs() < 0.4, "p10 {}", q(0.1));
    assert!((q(0.9) - 24.0).abs() < 0.4, "p90 {}", q(0.9));
}

#[test]
fn bernoulli_loss_within_10_percent_over_200k_frames() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let env = Env::new(
        "ls",
        13,
        DirSettings {
            loss: LossModel::Bernoulli { p: 0.01 },
            ..Default::default()
        },
    );
    let plan = SendPlan {
        count: 200_000,
        payload: 32,
        pps: 60_000.0,
        batch: 8,
        ..Default::default()
    };
    let (sent, s) = env.udp_a_to_b(9000, plan);
    let st = env.show();
    let c = st.a_to_b.counters.total();
    // Every datagram reached the emulator; every delivered one reached the receiver.
    assert_eq!(c.offered.frames, sent, "{}", env.diag());
    assert_eq!(s.len() as u64, c.delivered.frames);
    assert_eq!(c.lost.frames + c.delivered.frames, sent);
    let measured = 1.0 - s.len() as f64 / sent as f64;
    eprintln!("loss for 1%: {:.4} % over {sent} frames", measured * 100.0);
    assert!(
        (measured / 0.01 - 1.0).abs() <= 0.10,
        "measured loss {measured}"
    );
}

#[test]
fn gilbert_elliott_loss_is_bursty_with_the_right_mean() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let model = LossModel::GilbertElliott {
        p: 0.01,
        r: 0.25,
        loss_good: 0.0,
        loss_bad: 1.0,
    };
    let env = Env::new(
        "ge",
        14,
        DirSettings {
            loss: model,
            ..Default::default()
        },
    );
    let plan = SendPlan {
        count: 150_000,
        payload: 32,
        pps: 60_000.0,
        batch: 8,
        ..Default::default()
    };
    let (sent, s) = env.udp_a_to_b(9000, plan);
    assert_eq!(
        env.show().a_to_b.counters.total().offered.frames,
        sent,
        "{}",
        env.diag()
    );
    // Bursts of consecutive missing sequence numbers at the receiver.
    let mut seqs: Vec<u64> = s.iter().map(|x| x.seq).collect();
    seqs.sort_unstable();
    let mut bursts = 0u64;
    let mut prev = None::<u64>;
    for &q in &seqs {
        let gap = match prev {
            None => q,
            Some(p) => q - p - 1,
        };
        bursts += (gap > 0) as u64;
        prev = Some(q);
    }
    let lost = sent - s.len() as u64;
    let rate = lost as f64 / sent as f64;
    let mean_burst = lost as f64 / bursts.max(1) as f64;
    eprintln!(
        "GE p=1% r=25%: loss {:.3} % (theory {:.3} %), mean burst {mean_burst:.2} (theory 4)",
        rate * 100.0,
        model.mean_loss() * 100.0
    );
    // The forwarder made exactly the decisions the model makes on a virtual clock with
    // the same seed: the I/O layer neither lost nor invented a frame.
    let mut model_pipe = Pipe::new(
        DirSettings {
            loss: model,
            ..Default::default()
        },
        PipeConfig::default(),
        Xoshiro256pp::seed_from_u64(0x5eed),
    );
    let frame = [0u8; 74];
    let predicted: Vec<u64> = (0..sent)
        .filter(|&i| {
            let lost = model_pipe.offer(i, &frame, 0) == Verdict::Lost;
            while model_pipe.poll_release(i).is_some() {}
            lost
        })
        .collect();
    let received: std::collections::HashSet<u64> = seqs.iter().copied().collect();
    let missing: Vec<u64> = (0..sent).filter(|i| !received.contains(i)).collect();
    assert_eq!(missing.len(), predicted.len());
    assert!(
        missing == predicted,
        "lost frames differ from the model's decisions"
    );
    // The burstiness makes the rate noisier than Bernoulli's: 150k frames give ~1400
    // bursts, σ ≈ 3.5 % relative; the seed is fixed so the run is reproducible.
    assert!(
        (rate / model.mean_loss() - 1.0).abs() <= 0.15,
        "loss {rate}"
    );
    assert!((mean_burst - 4.0).abs() <= 0.6, "mean burst {mean_burst}");
}

#[test]
fn rate_limit_within_3_percent_with_queue_drops() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let rate = 20_000_000u64;
    let env = Env::new(
        "rt",
        15,
        DirSettings {
            rate_bps: rate,
            queue_frames: 50,
            delay_ns: 5 * MS,
            ..Default::default()
        },
    );
    // 1000-byte payload: 1042-byte frames, 1066 bytes on the wire, 2345 frames/s at
    // 20 Mbit/s. Offer ~1.7 times that.
    let plan = SendPlan {
        count: 6000,
        payload: 1000,
        pps: 4000.0,
        ..Default::default()
    };
    let (sent, s) = env.udp_a_to_b(9000, plan);
    let st = env.show();
    let c = st.a_to_b.counters.total();
    assert_eq!(c.offered.frames, sent, "{}", env.diag());
    assert!(c.queue_dropped.frames > 1000, "queue must overflow: {c:?}");
    assert_eq!(c.queue_dropped.frames + c.delivered.frames, sent);
    assert_eq!(s.len() as u64, c.delivered.frames);
    let first = s.iter().map(|x| x.recv_ns).min().unwrap();
    let last = s.iter().map(|x| x.recv_ns).max().unwrap();
    let wire_bits = (s.len() as u64 - 1) * (1042 + 24) * 8;
    let measured = wire_bits as f64 / ((last - first) as f64 / 1e9);
    eprintln!(
        "rate for 20mbit: {:.3} Mbit/s line rate ({:.3} Mbit/s UDP payload), {} queue drops",
        measured / 1e6,
        measured / 1e6 * 1000.0 / 1066.0,
        c.queue_dropped.frames
    );
    assert!(
        (measured / rate as f64 - 1.0).abs() <= 0.03,
        "measured {measured}"
    );
}

// ---- TCP helpers ----

fn tcp_server(ns: &str, addr: SocketAddrV4) -> TcpListener {
    let ns = ns.to_string();
    sys::in_netns(&ns, move || TcpListener::bind(addr))
        .unwrap()
        .unwrap()
}

fn tcp_connect(ns: &str, to: SocketAddrV4) -> TcpStream {
    let ns = ns.to_string();
    sys::in_netns(&ns, move || {
        TcpStream::connect_timeout(&to.into(), Duration::from_secs(5))
    })
    .unwrap()
    .unwrap()
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

#[test]
fn runtime_changes_down_up_and_restart_keep_a_tcp_connection() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let mut env = Env::new(
        "rc",
        16,
        DirSettings {
            delay_ns: 5 * MS,
            ..Default::default()
        },
    );
    let server_addr = SocketAddrV4::new(env.b, 6653);
    let listener = tcp_server(&env.ns_b, server_addr);
    let total = 3_000_000usize;
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        let mut got = 0usize;
        loop {
            let n = s.read(&mut buf).expect("connection must survive");
            if n == 0 {
                break;
            }
            for (k, &b) in buf[..n].iter().enumerate() {
                assert_eq!(b, pattern(got + k), "corrupt byte at {}", got + k);
            }
            got += n;
        }
        s.write_all(b"done").unwrap();
        got
    });
    let mut client = tcp_connect(&env.ns_a, server_addr);
    let ctl = env.link.rec.control();
    let chunk = 100_000;
    let mut rec = env.link.rec.clone();
    for (i, start) in (0..total).step_by(chunk).enumerate() {
        let data: Vec<u8> = (start..start + chunk).map(pattern).collect();
        client.write_all(&data).expect("connection must survive");
        match i {
            3 => {
                ctl.set_both(DirPatch {
                    delay_ns: Some(20 * MS),
                    jitter_ns: Some(2 * MS),
                    loss: Some(LossModel::Bernoulli { p: 0.02 }),
                    ..Default::default()
                })
                .unwrap();
            }
            6 => {
                ctl.set_both(DirPatch {
                    rate_bps: Some(50_000_000),
                    ..Default::default()
                })
                .unwrap();
            }
            9 => {
                ctl.set_both(DirPatch {
                    up: Some(false),
                    ..Default::default()
                })
                .unwrap();
                std::thread::sleep(Duration::from_millis(300)); // the outage itself
                let st = ctl
                    .set_both(DirPatch {
                        up: Some(true),
                        ..Default::default()
                    })
                    .unwrap();
                assert!(st.a_to_b.counters.total().down_dropped.frames > 0);
            }
            12 => {
                // A new forwarder process with new settings on the same persistent TAPs.
                let spec_path = env.run_dir.join(format!("{}.spec.json", rec.name));
                let mut spec: LinkSpec =
                    serde_json::from_str(&std::fs::read_to_string(spec_path).unwrap()).unwrap();
                spec = spec.with_settings(DirSettings {
                    delay_ns: 2 * MS,
                    ..Default::default()
                });
                let old = rec.pid;
                rec = restart_forwarder(&rec, &spec, Path::new(EXE)).unwrap();
                assert_ne!(rec.pid, old);
                assert!(sys::process_state(old).is_none_or(|s| s == 'Z'));
            }
            _ => {}
        }
    }
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let mut done = [0u8; 4];
    client.read_exact(&mut done).unwrap();
    assert_eq!(&done, b"done");
    assert_eq!(server.join().unwrap(), total);
    // The guard tears down by the *current* record (the restart changed the PID).
    env.link.rec = rec;
}

// ---- Accounting equals tcpdump ----

/// A tcpdump capturing one direction of one TAP into a pcap file.
struct Capture {
    child: Child,
    path: PathBuf,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Capture {
    /// Starts tcpdump and returns once it reports "listening on" (it is capturing).
    fn start(ns: &str, tap: &str, dir: &str, path: PathBuf) -> Capture {
        let mut child = Command::new("ip")
            .args([
                "netns", "exec", ns, "tcpdump", "-i", tap, "-Q", dir, "-n", "-s", "0", "-U",
            ])
            .args(["--immediate-mode", "-B", "16384", "-w"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (apt-get install tcpdump)");
        let err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains("listening on") => break,
                Ok(_) => {}
                Err(_) => panic!("tcpdump on {ns}/{tap} did not start"),
            }
        }
        Capture {
            child,
            path,
            stderr: rx,
        }
    }

    /// SIGINT (tcpdump flushes and prints its statistics), wait, return the stats lines.
    fn stop(mut self) -> String {
        // SAFETY: signalling the tcpdump child we spawned (ip netns exec execs it).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait().unwrap();
        let mut out = String::new();
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_secs(2)) {
            out.push_str(&l);
            out.push('\n');
        }
        out
    }
}

/// (frames, bytes) of a pcap file: bytes are the original frame lengths.
fn pcap_tally(path: &Path) -> (u64, u64) {
    let data = std::fs::read(path).unwrap_or_default();
    if data.len() < 24 {
        return (0, 0);
    }
    let magic = u32::from_le_bytes(data[0..4].try_into().unwrap());
    assert!(
        magic == 0xa1b2_c3d4 || magic == 0xa1b2_3c4d,
        "pcap magic {magic:x}"
    );
    let (mut off, mut frames, mut bytes) = (24usize, 0u64, 0u64);
    while off + 16 <= data.len() {
        let incl = u32::from_le_bytes(data[off + 8..off + 12].try_into().unwrap()) as usize;
        let orig = u32::from_le_bytes(data[off + 12..off + 16].try_into().unwrap()) as u64;
        if off + 16 + incl > data.len() {
            break; // partially written record
        }
        assert_eq!(incl as u64, orig, "snaplen cut a frame");
        frames += 1;
        bytes += orig;
        off += 16 + incl;
    }
    (frames, bytes)
}

/// tcpdump's own BPF classification of a capture: (frames, bytes, transport payload).
fn tcpdump_filter(path: &Path, filter: &str, tmp: &Path) -> (u64, u64, u64) {
    let out = tmp.join("filtered.pcap");
    let st = Command::new("tcpdump")
        .args(["-r"])
        .arg(path)
        .arg("-w")
        .arg(&out)
        .arg(filter)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let (f, b) = pcap_tally(&out);
    // `-q` prints "... tcp N" / "... UDP, length N" with N the transport payload.
    let text = Command::new("tcpdump")
        .args(["-nn", "-q", "-r"])
        .arg(path)
        .arg(filter)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let payload: u64 = String::from_utf8_lossy(&text.stdout)
        .lines()
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("unparsed tcpdump line {l:?}"))
        })
        .sum();
    (f, b, payload)
}

fn eq_tally(what: &str, t: &Tally, pcap: (u64, u64)) {
    assert_eq!(
        (t.frames, t.bytes),
        pcap,
        "{what}: emulator (frames, bytes) vs tcpdump"
    );
}

#[test]
fn accounting_equals_tcpdump_exactly() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let env = Env::new(
        "ac",
        17,
        DirSettings {
            delay_ns: 2 * MS,
            ..Default::default()
        },
    );
    let tmp = env.run_dir.join("pcap");
    std::fs::create_dir_all(&tmp).unwrap();
    let (ta, tb) = (env.link.rec.tap_a.clone(), env.link.rec.tap_b.clone());
    let caps = [
        Capture::start(&env.ns_a, &ta, "out", tmp.join("a_out.pcap")),
        Capture::start(&env.ns_a, &ta, "in", tmp.join("a_in.pcap")),
        Capture::start(&env.ns_b, &tb, "out", tmp.join("b_out.pcap")),
        Capture::start(&env.ns_b, &tb, "in", tmp.join("b_in.pcap")),
    ];
    let ctl = env.link.rec.control();

    // Phase 1: OpenFlow-port and OVSDB-port TCP exchanges, no loss.
    for (port, up, down) in [(6653u16, 200_000usize, 30_000usize), (6640, 50_000, 10_000)] {
        let addr = SocketAddrV4::new(env.b, port);
        let l = tcp_server(&env.ns_b, addr);
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut v = Vec::new();
            s.read_to_end(&mut v).unwrap();
            s.write_all(&vec![7u8; down]).unwrap();
            v.len()
        });
        let mut c = tcp_connect(&env.ns_a, addr);
        c.write_all(&vec![9u8; up]).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert_eq!(back.len(), down);
        assert_eq!(srv.join().unwrap(), up);
    }

    // Phase 2: UDP both ways (QUIC port one way, another port back) with 5 % loss.
    ctl.set_both(DirPatch {
        loss: Some(LossModel::Bernoulli { p: 0.05 }),
        ..Default::default()
    })
    .unwrap();
    let rx_quic = UdpReceiver::start(&env.ns_b, SocketAddrV4::new(env.b, 6653), true).unwrap();
    let rx_udp = UdpReceiver::start(&env.ns_a, SocketAddrV4::new(env.a, 9000), true).unwrap();
    let plan = |count, payload| SendPlan {
        count,
        payload,
        pps: 5000.0,
        ..Default::default()
    };
    let t1 = spawn_sender(
        &env.ns_a,
        SocketAddrV4::new(env.a, 0),
        SocketAddrV4::new(env.b, 6653),
        plan(3000, 500),
    );
    let t2 = spawn_sender(
        &env.ns_b,
        SocketAddrV4::new(env.b, 0),
        SocketAddrV4::new(env.a, 9000),
        plan(2000, 300),
    );
    t1.join().unwrap().unwrap();
    t2.join().unwrap().unwrap();

    // Phase 3: loss off, then a marker each way. The link is FIFO, so once the markers
    // are through, so is everything sent before them.
    ctl.set_both(DirPatch {
        loss: Some(LossModel::None),
        ..Default::default()
    })
    .unwrap();
    for (ns, from, to) in [(&env.ns_a, env.a, env.b), (&env.ns_b, env.b, env.a)] {
        let rx = UdpReceiver::start(
            if to == env.b { &env.ns_b } else { &env.ns_a },
            SocketAddrV4::new(to, 7777),
            true,
        )
        .unwrap();
        spawn_sender(
            ns,
            SocketAddrV4::new(from, 0),
            SocketAddrV4::new(to, 7777),
            plan(1, 16),
        )
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(
            rx.finish(1, Duration::from_secs(5)).unwrap().len(),
            1,
            "marker"
        );
    }
    let st = env.wait_idle();
    let (ab, ba) = (&st.a_to_b.counters, &st.b_to_a.counters);
    let quic_samples = rx_quic
        .finish(
            ab.class(Class::Quic).delivered.frames,
            Duration::from_secs(5),
        )
        .unwrap();
    let udp_samples = rx_udp
        .finish(
            ba.class(Class::UdpOther).delivered.frames - 1,
            Duration::from_secs(5),
        )
        .unwrap();

    // tcpdump may still be writing the last frames: wait until each file holds at least
    // what the emulator counted (or give up after 5 s and let the comparison fail).
    let expect = [
        ab.total().offered.frames,
        ba.total().delivered.frames,
        ba.total().offered.frames,
        ab.total().delivered.frames,
    ];
    let deadline = Instant::now() + Duration::from_secs(5);
    while caps
        .iter()
        .zip(expect)
        .any(|(c, e)| pcap_tally(&c.path).0 < e)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let paths: Vec<PathBuf> = caps.iter().map(|c| c.path.clone()).collect();
    for c in caps {
        let stats = c.stop();
        assert!(
            stats
                .lines()
                .any(|l| l.trim() == "0 packets dropped by kernel"),
            "tcpdump dropped: {stats}"
        );
    }
    let [a_out, a_in, b_out, b_in] = [0, 1, 2, 3].map(|i| paths[i].clone());

    let (at, bt) = (ab.total(), ba.total());
    eprintln!(
        "a->b offered {} frames / {} bytes, lost {}, delivered {}; b->a offered {} / {}, lost {}, delivered {}",
        at.offered.frames,
        at.offered.bytes,
        at.lost.frames,
        at.delivered.frames,
        bt.offered.frames,
        bt.offered.bytes,
        bt.lost.frames,
        bt.delivered.frames
    );
    assert!(
        at.lost.frames > 50 && bt.lost.frames > 30,
        "loss must be exercised"
    );
    eq_tally("a->b offered (tap a, out)", &at.offered, pcap_tally(&a_out));
    eq_tally(
        "a->b delivered (tap b, in)",
        &at.delivered,
        pcap_tally(&b_in),
    );
    eq_tally("b->a offered (tap b, out)", &bt.offered, pcap_tally(&b_out));
    eq_tally(
        "b->a delivered (tap a, in)",
        &bt.delivered,
        pcap_tally(&a_in),
    );

    // Per class, against tcpdump's BPF filters (an independent classifier), including
    // the transport payload tcpdump prints.
    let classes = [
        (Class::OpenFlow, "tcp and (port 6653 or port 6633)"),
        (Class::Ovsdb, "tcp port 6640"),
        (Class::Quic, "udp port 6653"),
        (Class::UdpOther, "udp and not port 6653"),
    ];
    for (class, filter) in classes {
        for (what, t, file) in [
            ("a->b offered", &ab.class(class).offered, &a_out),
            ("a->b delivered", &ab.class(class).delivered, &b_in),
            ("b->a offered", &ba.class(class).offered, &b_out),
            ("b->a delivered", &ba.class(class).delivered, &a_in),
        ] {
            let (f, b, p) = tcpdump_filter(file, filter, &tmp);
            assert_eq!(
                (t.frames, t.bytes, t.payload_bytes),
                (f, b, p),
                "{} {what}: emulator (frames, bytes, payload) vs tcpdump `{filter}`",
                class.name()
            );
        }
    }
    // The application's own view of UDP payload matches too.
    let quic_bytes: u64 = quic_samples.iter().map(|s| s.len as u64).sum();
    assert_eq!(ab.class(Class::Quic).delivered.payload_bytes, quic_bytes);
    let udp_bytes: u64 = udp_samples.iter().map(|s| s.len as u64).sum();
    assert_eq!(
        ba.class(Class::UdpOther).delivered.payload_bytes,
        udp_bytes + 16
    );
    // Nothing else crossed the link (no ARP: static neighbours; no IPv6: disabled).
    assert_eq!(
        at.offered.frames,
        [Class::OpenFlow, Class::Ovsdb, Class::Quic, Class::UdpOther]
            .iter()
            .map(|&c| ab.class(c).offered.frames)
            .sum::<u64>()
    );
    assert_eq!(
        ab.class(Class::Arp).offered.frames + ba.class(Class::Arp).offered.frames,
        0
    );

    // Wire bytes in the report follow the stated convention.
    for (acc, ovh) in [
        (quicsdn_lab::emulator::Accounting::default(), 24u64),
        (
            quicsdn_lab::emulator::Accounting {
                phy_overhead: 28,
                pad_to_min_frame: false,
            },
            28,
        ),
    ] {
        let rep = st.report(&acc);
        let (f, b) = pcap_tally(&a_out);
        assert_eq!(rep.a_to_b.total.offered.wire_bytes, b + ovh * f);
        assert!(
            rep.accounting
                .convention
                .contains(&format!("{ovh} bytes/frame"))
        );
    }
}

// ---- The command line ----

fn lab(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(EXE)
        .args(args)
        .env("QUICSDN_LAB_EMULATOR_DIR", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn tap_exists(ns: &str, tap: &str) -> bool {
    Command::new("ip")
        .args(["-n", ns, "link", "show", "dev", tap])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[test]
fn cli_up_set_show_down_leaves_nothing_behind() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !require_root() {
        return;
    }
    let id = format!("qsdnEcl{:04x}", std::process::id() & 0xffff);
    let nsa = NetnsGuard::create(&format!("{id}-a")).unwrap();
    let nsb = NetnsGuard::create(&format!("{id}-b")).unwrap();
    let dir = std::env::temp_dir().join(format!("{id}-run"));
    let up = lab(
        &dir,
        &[
            "emulate",
            "up",
            "--name",
            &id,
            "--ns-a",
            &nsa.name,
            "--ns-b",
            &nsb.name,
            "--addr-a",
            "10.254.18.1",
            "--addr-b",
            "10.254.18.2",
            "--delay",
            "10ms",
            "--loss",
            "0.5%",
        ],
    );
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let rec: quicsdn_lab::emulator::LinkRecord = serde_json::from_slice(&up.stdout).unwrap();
    assert!(tap_exists(&nsa.name, &rec.tap_a) && tap_exists(&nsb.name, &rec.tap_b));

    let set = lab(
        &dir,
        &[
            "link",
            "set",
            &id,
            "--dir",
            "a2b",
            "--delay",
            "30ms",
            "--loss",
            "ge:p=1%,r=30%",
            "--rate",
            "10mbit",
        ],
    );
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let show = lab(&dir, &["link", "show", &id, "--overhead", "28"]);
    assert!(show.status.success());
    let rep: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(rep["a_to_b"]["settings"]["delay_ns"], 30_000_000);
    assert_eq!(rep["a_to_b"]["settings"]["rate_bps"], 10_000_000);
    assert_eq!(
        rep["a_to_b"]["settings"]["loss"]["model"],
        "gilbert_elliott"
    );
    assert_eq!(rep["b_to_a"]["settings"]["delay_ns"], 10_000_000);
    assert_eq!(rep["b_to_a"]["settings"]["loss"]["p"], 0.005);
    assert_eq!(rep["accounting"]["phy_overhead_per_frame"], 28);
    assert!(
        rep["accounting"]["convention"]
            .as_str()
            .unwrap()
            .contains("Table 1")
    );
    assert!(rep["a_to_b"]["classes"]["openflow"]["offered"]["wire_bytes"].is_u64());
    assert_eq!(rep["a_to_b"]["kernel_sending_tap"]["tx_dropped"], 0);
    assert!(rep["b_to_a"]["kernel_sending_tap"]["tx_packets"].is_u64());

    // Clear errors.
    let e = lab(&dir, &["link", "set", &id, "--delay", "25"]);
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("missing unit"));
    let e = lab(&dir, &["link", "set", &id]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("nothing to change"));
    let e = lab(&dir, &["link", "show", "qsdnE-nonexistent"]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("link qsdnE-nonexistent"));
    let e = lab(
        &dir,
        &[
            "emulate",
            "up",
            "--name",
            "qsdnEclx",
            "--ns-a",
            "qsdnE-missing-ns",
            "--ns-b",
            &nsb.name,
            "--addr-a",
            "10.254.19.1",
            "--addr-b",
            "10.254.19.2",
        ],
    );
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(
        msg.contains("qsdnEclx")
            && msg.contains("qsdnE-missing-ns")
            && msg.contains("does not exist"),
        "{msg}"
    );
    let help = lab(&dir, &["link", "set", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("25ms") && help.contains("100mbit") && help.contains("1%"),
        "{help}"
    );

    let down = lab(&dir, &["emulate", "down", &id]);
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(!tap_exists(&nsa.name, &rec.tap_a) && !tap_exists(&nsb.name, &rec.tap_b));
    assert!(
        sys::process_state(rec.pid).is_none_or(|s| s == 'Z'),
        "forwarder still running"
    );
    assert!(!rec.ctl_path.exists());
    // Idempotent teardown through the API; the CLI says there is nothing left.
    quicsdn_lab::emulator::destroy_link_by_name(&dir, &id).unwrap();
    let again = lab(&dir, &["emulate", "down", &id]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("no record"));
    let _ = std::fs::remove_dir_all(&dir);
}
