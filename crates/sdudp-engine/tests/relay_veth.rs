//! The relay engine binary on a real interface: a network namespace with a
//! veth pair; `quicsdn-sdudp relay` holds one end, this test holds the other
//! and plays both neighbouring edges (sans-IO [`Edge`]s) with real frames,
//! losing some of them on purpose. Needs root (namespaces, AF_PACKET).

use quicsdn_sdudp::conn::{ConnEvent, ConnId, Edge, EdgeConfig, Output};
use quicsdn_sdudp::{FlowKey, TcpOptions};
use quicsdn_sdudp_engine::frame::{self, Incoming, Mac, Ports};
use quicsdn_sdudp_engine::packet::{FrameIo, PacketSocket};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LEFT: (Ipv4Addr, &str) = (Ipv4Addr::new(10, 99, 0, 1), "02:15:00:00:00:01");
const ME: (Ipv4Addr, &str) = (Ipv4Addr::new(10, 99, 0, 2), "02:15:00:00:00:02");
const RIGHT: (Ipv4Addr, &str) = (Ipv4Addr::new(10, 99, 0, 3), "02:15:00:00:00:03");
const CONTROL_PORT: u16 = 49_151;

fn mac(s: &str) -> Mac {
    s.parse().unwrap()
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespace and the engine process; removed on drop, by name and PID.
struct Bed {
    ns: String,
    engine: Option<Child>,
    stats: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Bed {
    fn up() -> Bed {
        assert!(
            unsafe { libc::geteuid() } == 0,
            "this test needs root (network namespaces, AF_PACKET)"
        );
        let ns = format!("q15-rv{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        sh(&["ip", "netns", "add", &ns]);
        let x = |a: &[&str]| {
            let mut v = vec!["ip", "netns", "exec", &ns];
            v.extend_from_slice(a);
            sh(&v);
        };
        x(&[
            "ip", "link", "add", "eng", "type", "veth", "peer", "name", "peer",
        ]);
        x(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
        x(&["ip", "link", "set", "eng", "up"]);
        x(&["ip", "link", "set", "peer", "up"]);
        let dir = tempfile::tempdir().unwrap();
        let stats = dir.path().join("stats.json");
        let engine = Command::new("ip")
            .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_quicsdn-sdudp")])
            .args(["relay", "--interface", "eng"])
            .args(["--ip", &ME.0.to_string(), "--mac", ME.1])
            .args(["--left", &format!("{},{}", LEFT.0, LEFT.1)])
            .args(["--right", &format!("{},{}", RIGHT.0, RIGHT.1)])
            .args(["--capacity", "128", "--initial-rto", "20ms"])
            .arg("--stats")
            .arg(&stats)
            .args(["--stats-interval", "50ms"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Bed {
            ns,
            engine: Some(engine),
            stats,
            _dir: dir,
        }
    }

    /// Enters the namespace on this thread (only this thread).
    fn enter(&self) {
        let f = std::fs::File::open(format!("/var/run/netns/{}", self.ns)).unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&self.stats).unwrap()).unwrap()
    }

    fn kill_engine(&mut self) {
        if let Some(mut c) = self.engine.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.kill_engine();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// Both edges, on the test's end of the veth.
struct Edges {
    io: PacketSocket,
    a: Edge,
    b: Edge,
    a_conn: ConnId,
    b_conn: Option<ConnId>,
    a_events: Vec<ConnEvent>,
    b_events: Vec<ConnEvent>,
    at_b: Vec<u8>,
    rng: u64,
    /// Frames lost on purpose in each direction.
    loss: f64,
    lost: u64,
}

impl Edges {
    fn lose(&mut self) -> bool {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let hit = (self.rng % 10_000) as f64 / 10_000.0 < self.loss;
        self.lost += hit as u64;
        hit
    }

    fn send_from(&mut self, left: bool) {
        let (src, edge) = if left {
            ((mac(LEFT.1), LEFT.0), &mut self.a)
        } else {
            ((mac(RIGHT.1), RIGHT.0), &mut self.b)
        };
        let mut frames = Vec::new();
        while let Some(o) = edge.poll_output() {
            frames.push(match o {
                Output::Data { flow, id, payload } => {
                    frame::data_frame(mac(ME.1), src.0, flow, id, &payload)
                }
                Output::Control(c) => {
                    frame::control_frame((mac(ME.1), ME.0), src, CONTROL_PORT, &c)
                }
            });
        }
        for f in frames {
            if !self.lose() {
                self.io.send(&f).unwrap();
            }
        }
    }

    fn step(&mut self, data: &[u8], written: &mut usize) {
        let now = Instant::now();
        let wait = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .map_or(Duration::from_millis(10), |t| {
                t.saturating_duration_since(now)
                    .min(Duration::from_millis(10))
            });
        self.io.wait(wait).unwrap();
        let mut buf = vec![0u8; 65_536];
        while let Some(n) = self.io.recv(&mut buf).unwrap() {
            let f = buf[..n].to_vec();
            if self.lose() {
                continue;
            }
            let now = Instant::now();
            let dst = Mac(f[..6].try_into().unwrap());
            for (who, ip) in [(LEFT.1, LEFT.0), (RIGHT.1, RIGHT.0)] {
                if dst != mac(who) {
                    continue;
                }
                let ports = Ports {
                    data: 49_152..=50_151,
                    control: CONTROL_PORT,
                };
                let edge = if who == LEFT.1 {
                    &mut self.a
                } else {
                    &mut self.b
                };
                match frame::classify(&f, ip, &ports).1 {
                    Incoming::Data { flow, id, payload } => {
                        edge.handle_data(now, flow, id, payload)
                    }
                    Incoming::Control(c) => edge.handle_control(now, c),
                    other => panic!("unexpected frame {other:?}"),
                }
            }
        }
        let now = Instant::now();
        self.a.handle_timeout(now);
        self.b.handle_timeout(now);
        while let Some((_, e)) = self.a.poll_event() {
            self.a_events.push(e);
        }
        while let Some((id, e)) = self.b.poll_event() {
            if let ConnEvent::ConnectHost { .. } = e {
                self.b_conn = Some(id);
                self.b
                    .host_connected(now, id, [2, 0, 0, 0, 0, 9], TcpOptions::default());
            }
            self.b_events.push(e);
        }
        let accepted = self
            .a_events
            .iter()
            .any(|e| matches!(e, ConnEvent::AcceptHost { .. }));
        if accepted && *written < data.len() {
            *written += self.a.send(now, self.a_conn, &data[*written..]);
            if *written == data.len() {
                self.a.host_fin(now, self.a_conn);
            }
        }
        if let Some(b) = self.b_conn {
            while let Some(d) = self.b.peek_for_host(b) {
                let d = d.to_vec();
                self.at_b.extend_from_slice(&d);
                self.b.consume_for_host(now, b, d.len());
            }
            if self.b_events.contains(&ConnEvent::ShutdownHost)
                && !self.b_events.contains(&ConnEvent::Closed)
            {
                self.b.host_fin(now, b);
            }
        }
        self.send_from(true);
        self.send_from(false);
    }
}

fn edges(bed: &Bed, sport: u16, loss: f64) -> Edges {
    bed.enter();
    let io = PacketSocket::open("peer").unwrap();
    // The same window as the engine's (as a controller configures a path);
    // a mismatch would still work, slower.
    let mut cfg = EdgeConfig::default();
    cfg.hop.capacity = 128;
    let mut a = Edge::new(cfg.clone());
    let b = Edge::new(cfg);
    let flow = FlowKey {
        src: LEFT.0,
        dst: RIGHT.0,
        sport,
        dport: sport,
    };
    let a_conn = a.open(
        Instant::now(),
        flow,
        "10.0.1.1:40000".parse().unwrap(),
        "10.0.5.1:80".parse().unwrap(),
        [2, 0, 0, 0, 0, 1],
        TcpOptions::default(),
    );
    Edges {
        io,
        a,
        b,
        a_conn,
        b_conn: None,
        a_events: Vec::new(),
        b_events: Vec::new(),
        at_b: Vec::new(),
        rng: 0x9E37_79B9_7F4A_7C15 ^ u64::from(sport),
        loss,
        lost: 0,
    }
}

#[test]
fn relay_binary_recovers_losses_and_its_death_fails_the_connection() {
    let mut bed = Bed::up();
    // Wait until the engine has written its first counters (it is running).
    let t0 = Instant::now();
    while !bed.stats.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "engine did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // 1. 3 MB with 2 % of the frames lost on each side of the engine.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut e = edges(&bed, 49_200, 0.02);
    let mut written = 0;
    let t0 = Instant::now();
    while !(e.a_events.contains(&ConnEvent::Closed) && e.b_events.contains(&ConnEvent::Closed)) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "transfer stuck: {} of {} bytes, A {:?}, B {:?}",
            e.at_b.len(),
            data.len(),
            e.a_events.last(),
            e.b_events.last()
        );
        e.step(&data, &mut written);
    }
    assert!(
        e.at_b == data,
        "{} bytes arrived of {}",
        e.at_b.len(),
        data.len()
    );
    assert!(e.lost > 0);
    // The edges keep answering (a lost last release is asked for again) until
    // the engine has retired both flows; its counters (rewritten every 50 ms)
    // show it at work.
    let t0 = Instant::now();
    let s = loop {
        let s = bed.stats();
        if s["engine"]["flows_active"] == 0 {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "flows not retired: {s}"
        );
        e.step(&data, &mut written);
    };
    let eng = &s["engine"];
    assert!(eng["retransmitted"].as_u64().unwrap() > 0, "{s}");
    assert!(eng["nacks"].as_u64().unwrap() > 0, "{s}");
    assert!(eng["max_held"].as_u64().unwrap() <= 128, "{s}");
    assert_eq!(eng["flows_done"].as_u64().unwrap(), 2, "{s}");
    assert_eq!(eng["flows_failed"].as_u64().unwrap(), 0, "{s}");

    // 2. The engine dies mid-transfer: both edges reset their hosts.
    let mut e = edges(&bed, 49_300, 0.0);
    let mut written = 0;
    let t0 = Instant::now();
    while e.at_b.len() < 500_000 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "second transfer stuck"
        );
        e.step(&data, &mut written);
    }
    bed.kill_engine();
    let killed = Instant::now();
    let failed = |ev: &[ConnEvent]| {
        ev.iter()
            .any(|x| matches!(x, ConnEvent::ResetHost { failure: Some(_) }))
    };
    while !(failed(&e.a_events) && failed(&e.b_events)) {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no reset: A {:?}, B {:?}",
            e.a_events,
            e.b_events
        );
        e.step(&data, &mut written);
    }
    assert!(e.at_b.len() < data.len() && data.starts_with(&e.at_b));
}
