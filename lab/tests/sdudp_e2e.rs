//! SDUDP beside real Open vSwitch: a line of 5 switches (one OVS 3.1 each,
//! userspace datapath), lossy emulated links between them (1 % per link and
//! direction), an SDUDP engine process beside every switch on a port of its
//! own (edge TCP engines on switches 1 and 5, retransmission engines on 2–4),
//! and the traffic steered to the engines by OpenFlow rules. Two unmodified
//! hosts carry file sets A and D over real TCP sockets.
//!
//! The rules are installed with `ovs-ofctl` here; a controller app through
//! the quicsdn agents is still to come (docs/sdudp.md). Prefix `q15s`.

mod common;

use quicsdn_lab::emulator::control::Accounting;
use quicsdn_lab::emulator::link::{LinkRecord, LinkSpec, create_link, destroy_link};
use quicsdn_lab::emulator::model::{DirSettings, LossModel};
use quicsdn_lab::host::{HostSpec, attach_host};
use quicsdn_lab::netns::{Netns, VethEnd, create_veth};
use quicsdn_lab::ovs::{BridgeConfig, Ovs};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const N: u32 = 5;
const P: &str = "q15s";

fn engine_mac(i: u32) -> String {
    format!("02:15:00:00:{i:02x}:fe")
}
fn host_mac(i: u32) -> String {
    format!("02:15:00:00:{i:02x}:01")
}
fn engine_ip(i: u32) -> String {
    format!("10.0.{i}.254")
}

/// The `quicsdn-sdudp` binary of this build (scripts/test builds every binary).
fn sdudp_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("quicsdn-sdudp");
    assert!(
        p.exists(),
        "{} missing: cargo build -p quicsdn-sdudp-engine",
        p.display()
    );
    p
}

#[derive(Default)]
struct Line {
    namespaces: Vec<Netns>,
    ovs: Vec<Ovs>,
    links: Vec<LinkRecord>,
    engines: Vec<Option<Child>>,
    dir: PathBuf,
}

impl Drop for Line {
    fn drop(&mut self) {
        for c in self.engines.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for l in &self.links {
            let _ = destroy_link(l);
        }
        for o in &self.ovs {
            let _ = o.stop();
        }
        for n in &self.namespaces {
            let _ = n.kill_all(Duration::from_secs(1));
            let _ = n.delete();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ns(line: &mut Line, name: &str) -> Netns {
    let name = format!("{P}-{name}");
    if Netns::exists(&name) {
        let old = Netns::named(&name);
        let _ = old.kill_all(Duration::from_secs(1));
        let _ = old.delete();
    }
    let n = Netns::create(&name).unwrap();
    n.disable_ipv6().unwrap();
    line.namespaces.push(Netns::named(&name));
    n
}

fn flows(ovs: &Ovs, rules: &[String]) {
    let target = ovs.bridge_target("br0");
    for r in rules {
        ovs.ofctl(&["-O", "OpenFlow13", "add-flow", &target, r])
            .unwrap();
    }
}

fn up() -> Line {
    let mut line = Line::default();
    line.dir = PathBuf::from(format!("/run/quicsdn-lab/{P}"));
    let _ = std::fs::remove_dir_all(&line.dir);
    for i in 1..=N {
        let sw = ns(&mut line, &format!("sw{i}"));
        let ovs = Ovs::start(&sw, &line.dir.join(format!("sw{i}"))).unwrap();
        ovs.add_bridge(&BridgeConfig::new("br0")).unwrap();
        // The engine's port: a veth into the engine's namespace.
        let e = ns(&mut line, &format!("e{i}"));
        create_veth(
            &VethEnd::new(&e, "sw").with_mac(&engine_mac(i)),
            &VethEnd::new(&sw, "eng"),
        )
        .unwrap();
        e.add_addr("sw", &format!("{}/16", engine_ip(i))).unwrap();
        e.link_up("sw").unwrap();
        e.link_up("lo").unwrap();
        sw.link_up("eng").unwrap();
        ovs.add_port("br0", "eng", Some(100)).unwrap();
        line.ovs.push(ovs);
    }
    // Lossy links between neighbours, as OVS ports 1002 (right) and 1001 (left).
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_quicsdn-lab"));
    for i in 1..N {
        let mut spec = LinkSpec::new(
            &format!("{P}-d{i}"),
            &format!("{P}-sw{i}"),
            &format!("{P}-sw{}", i + 1),
            format!("10.253.{i}.1").parse().unwrap(),
            format!("10.253.{i}.2").parse().unwrap(),
        )
        .with_settings(DirSettings {
            delay_ns: 2_000_000,
            loss: LossModel::Bernoulli { p: 0.01 },
            ..DirSettings::default()
        });
        spec.seed = Some(u64::from(i));
        let rec = create_link(&spec, &exe).unwrap();
        line.ovs[i as usize - 1]
            .add_port("br0", &rec.tap_a, Some(1002))
            .unwrap();
        line.ovs[i as usize]
            .add_port("br0", &rec.tap_b, Some(1001))
            .unwrap();
        line.links.push(rec);
    }
    // The hosts, on the first and the last switch.
    for (i, h) in [(1, "h1"), (N, "h2")] {
        ns(&mut line, h);
        attach_host(
            &HostSpec {
                netns: format!("{P}-{h}"),
                ifname: "eth0".into(),
                mac: host_mac(i),
                cidr: format!("10.0.{i}.1/16"),
                port: h.into(),
                ofport: Some(1),
            },
            &line.ovs[i as usize - 1],
            "br0",
        )
        .unwrap();
    }
    let neigh = |n: &str, ip: String, mac: String, dev: &str| {
        Netns::named(format!("{P}-{n}"))
            .ip(&[
                "neigh",
                "replace",
                &ip,
                "lladdr",
                &mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])
            .unwrap();
    };
    // Hosts address each other as usual; the edge switches redirect their TCP
    // to the engines. The engines know their own host.
    neigh("h1", format!("10.0.{N}.1"), host_mac(N), "eth0");
    neigh("h2", "10.0.1.1".into(), host_mac(1), "eth0");
    neigh("e1", "10.0.1.1".into(), host_mac(1), "sw");
    neigh(&format!("e{N}"), format!("10.0.{N}.1"), host_mac(N), "sw");

    // OpenFlow: edges send host TCP to their engine and the engine's frames
    // to the host or along the line; every switch gives the engine the UDP
    // arriving from the line, and sends the engine's frames on by MAC.
    for i in 1..=N {
        let mut r = Vec::new();
        if i == 1 || i == N {
            let e = engine_mac(i);
            r.push(format!(
                "priority=20,in_port=1,tcp,actions=set_field:{e}->eth_dst,output:100"
            ));
            r.push(format!(
                "priority=20,in_port=100,dl_dst={},actions=output:1",
                host_mac(i)
            ));
        }
        if i > 1 {
            r.push("priority=10,in_port=1001,udp,actions=output:100".into());
            r.push(format!(
                "priority=10,in_port=100,dl_dst={},actions=output:1001",
                engine_mac(i - 1)
            ));
        }
        if i < N {
            r.push("priority=10,in_port=1002,udp,actions=output:100".into());
            r.push(format!(
                "priority=10,in_port=100,dl_dst={},actions=output:1002",
                engine_mac(i + 1)
            ));
        }
        flows(&line.ovs[i as usize - 1], &r);
    }

    // The engines.
    for i in 1..=N {
        let stats = line.dir.join(format!("e{i}.json"));
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{P}-e{i}")])
            .arg(sdudp_bin());
        let me = [
            "--ip".to_string(),
            engine_ip(i),
            "--mac".into(),
            engine_mac(i),
        ];
        if i == 1 || i == N {
            let (nb, far, far_net) = if i == 1 { (2, N, N) } else { (N - 1, 1, 1) };
            c.args(["edge", "--interface", "sw"]).args(&me);
            c.args([
                "--neighbour",
                &format!("{},{}", engine_ip(nb), engine_mac(nb)),
            ]);
            c.args([
                "--far-edge",
                &format!("10.0.{far_net}.0/24={}", engine_ip(far)),
            ]);
        } else {
            c.args(["relay", "--interface", "sw"]).args(&me);
            c.args([
                "--left",
                &format!("{},{}", engine_ip(i - 1), engine_mac(i - 1)),
            ]);
            c.args([
                "--right",
                &format!("{},{}", engine_ip(i + 1), engine_mac(i + 1)),
            ]);
        }
        c.arg("--stats")
            .arg(&stats)
            .args(["--stats-interval", "100ms"]);
        line.engines
            .push(Some(c.stdin(Stdio::null()).spawn().unwrap()));
    }
    let t0 = Instant::now();
    while !(1..=N).all(|i| line.dir.join(format!("e{i}.json")).exists()) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "engines did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    line
}

fn in_ns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{P}-{name}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: setns on this thread only, with a namespace file we opened.
        assert_eq!(
            unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) },
            0
        );
        f()
    })
}

fn fnv(h: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}
const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// A file set over one connection: `count` files of `size` bytes, written one
/// by one; the server answers the byte count and hash of what it read.
fn send_set(port: u16, count: usize, size: usize, seed: u8) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(
        &format!("10.0.{N}.1:{port}").parse().unwrap(),
        Duration::from_secs(10),
    )
    .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut h = FNV0;
    for f in 0..count {
        let file: Vec<u8> = (0..size)
            .map(|i| (i as u8) ^ (f as u8).wrapping_mul(seed))
            .collect();
        h = fnv(h, &file);
        s.write_all(&file).map_err(|e| format!("write: {e}"))?;
    }
    s.shutdown(Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    let mut want = ((count * size) as u64).to_be_bytes().to_vec();
    want.extend_from_slice(&h.to_be_bytes());
    if reply != want {
        return Err(format!("reply {reply:?}, want {want:?}"));
    }
    Ok(())
}

/// Host 2's server on `port`: for each connection, reads to EOF and answers
/// the length and hash; reports each connection's outcome.
fn server(port: u16, tx: mpsc::Sender<Result<usize, ErrorKind>>) -> std::thread::JoinHandle<()> {
    in_ns("h2", move || {
        let l = TcpListener::bind(("0.0.0.0", port)).unwrap();
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let r = s.read_to_end(&mut got).map(|_| {
                    let mut reply = (got.len() as u64).to_be_bytes().to_vec();
                    reply.extend_from_slice(&fnv(FNV0, &got).to_be_bytes());
                    let _ = s.write_all(&reply);
                    got.len()
                });
                let _ = tx.send(r.map_err(|e| e.kind()));
            });
        }
    })
}

/// Frames and bytes offered on the middle links (both directions).
fn middle_load(line: &Line) -> (u64, u64) {
    let mut load = (0, 0);
    for l in &line.links[1..line.links.len() - 1] {
        let r = l.control().show().unwrap().report(&Accounting::default());
        for d in [&r.a_to_b, &r.b_to_a] {
            load.0 += d.total.offered.frames;
            load.1 += d.total.offered.bytes;
        }
    }
    load
}

/// Not a test: the direction of the paper's Figs. 7–8 on this line, SDUDP
/// against plain TCP (host CUBIC/BBR as the kernel has it) over the same
/// switches and links. `cargo test -p quicsdn-lab --test sdudp_e2e -- --ignored --nocapture`.
#[test]
#[ignore]
fn load_on_the_middle_links_sdudp_against_tcp() {
    common::require_root();
    let _serial = common::serial();
    let line = up();
    // Plain TCP to port 9090 passes the switches by L2 rules, bypassing the engines.
    for i in 1..=N {
        let mut r = Vec::new();
        if i == 1 {
            r.push("priority=30,in_port=1,tcp,tp_dst=9090,actions=output:1002".to_string());
            r.push("priority=30,in_port=1002,tcp,tp_src=9090,actions=output:1".into());
        } else if i == N {
            r.push("priority=30,in_port=1,tcp,tp_src=9090,actions=output:1001".to_string());
            r.push("priority=30,in_port=1001,tcp,tp_dst=9090,actions=output:1".into());
        } else {
            r.push("priority=30,in_port=1001,tcp,actions=output:1002".to_string());
            r.push("priority=30,in_port=1002,tcp,actions=output:1001".into());
        }
        flows(&line.ovs[i as usize - 1], &r);
    }
    let (tx, rx) = mpsc::channel();
    let _s1 = server(8080, tx.clone());
    let _s2 = server(9090, tx);
    for (name, count, size) in [("A", 6000, 500), ("D", 30, 100_000)] {
        for (transport, port) in [("sdudp", 8080), ("tcp", 9090)] {
            for l in &line.links {
                l.control().reset_counters().unwrap();
            }
            let t = Instant::now();
            let r = in_ns("h1", move || send_set(port, count, size, 3))
                .join()
                .unwrap();
            assert_eq!(r, Ok(()));
            let _ = rx.recv_timeout(Duration::from_secs(10));
            // Let the last releases and probes cross before counting.
            std::thread::sleep(Duration::from_millis(500));
            let (frames, bytes) = middle_load(&line);
            for i in 2..N {
                eprintln!("  relay {i}: {}", stats(&line, i)["engine"]);
            }
            eprintln!(
                "set {name} {transport}: {:.2} s, middle links: {frames} frames, {bytes} bytes ({:.0} frames, {:.0} bytes per link)",
                t.elapsed().as_secs_f64(),
                frames as f64 / f64::from(N - 3),
                bytes as f64 / f64::from(N - 3),
            );
        }
    }
}

fn stats(line: &Line, i: u32) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(line.dir.join(format!("e{i}.json"))).unwrap()).unwrap()
}

#[test]
fn file_sets_cross_five_switches_as_udp_and_an_engine_death_is_visible() {
    common::require_root();
    let _serial = common::serial();
    let mut line = up();
    let (tx, rx) = mpsc::channel::<Result<usize, ErrorKind>>();
    let _server = server(8080, tx);
    for l in &line.links {
        l.control().reset_counters().unwrap();
    }
    // File set A (6000 × 0.5 KB) and D (30 × 100 KB).
    for (count, size) in [(6000, 500), (30, 100_000)] {
        let t = Instant::now();
        let r = in_ns("h1", move || send_set(8080, count, size, 7))
            .join()
            .unwrap();
        assert_eq!(r, Ok(()), "{count} × {size} B");
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Ok(Ok(count * size))
        );
        eprintln!("{count} × {size} B in {:?}", t.elapsed());
    }
    // Only UDP on the middle links (the hosts' TCP ends at the edges), and
    // the losses were repaired by the retransmission engines.
    for l in &line.links[1..line.links.len() - 1] {
        let report = l.control().show().unwrap().report(&Accounting::default());
        for d in [&report.a_to_b, &report.b_to_a] {
            let tcp = d.classes.get("tcp_other").map_or(0, |c| c.offered.frames);
            let udp = d.classes.get("udp_other").map_or(0, |c| c.offered.frames);
            assert_eq!(tcp, 0, "TCP on middle link {}: {}", l.name, d.summary);
            assert!(udp > 0, "no UDP on middle link {}", l.name);
        }
        assert!(
            report.a_to_b.total.lost.frames > 0,
            "link {} lost nothing",
            l.name
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let retransmitted: u64 = (2..N)
        .map(|i| stats(&line, i)["engine"]["retransmitted"].as_u64().unwrap())
        .sum();
    assert!(
        retransmitted > 0,
        "relays: {:?}",
        (2..N).map(|i| stats(&line, i)).collect::<Vec<_>>()
    );

    // A relay engine dies mid-transfer: the host's connection fails visibly.
    let (sent_tx, sent_rx) = mpsc::channel();
    let client = in_ns("h1", move || {
        let mut s = TcpStream::connect(format!("10.0.{N}.1:8080")).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        let chunk = vec![0x5a; 65_536];
        let mut sent = 0usize;
        loop {
            if let Err(e) = s.write_all(&chunk) {
                return e.kind();
            }
            sent += chunk.len();
            let _ = sent_tx.send(sent);
        }
    });
    while sent_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("upload stalled")
        < 2_000_000
    {}
    let killed = Instant::now();
    if let Some(mut c) = line.engines[2].take() {
        c.kill().unwrap();
        let _ = c.wait();
    }
    let r = client.join().unwrap();
    assert!(
        matches!(r, ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
        "{r:?}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "{:?}",
        killed.elapsed()
    );
    let server_side = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(server_side.is_err(), "host 2: {server_side:?}");
}
