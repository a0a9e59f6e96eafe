//! SDUDP beside real Open vSwitch, as `quicsdn-lab up --topology line
//! --switches 5 --link-delay 2ms --link-loss 1% --sdudp` builds it: one OVS
//! 3.1 per switch (userspace datapath), lossy emulated links between them (1 %
//! per link and direction), an SDUDP engine process beside every switch on a
//! port of its own (edge TCP engines on switches 1 and 5, retransmission
//! engines on 2–4), and the path's rules installed by the os-ken app
//! `controllers/sdudp_path.py` through the quicsdn agents (QUIC). Two
//! unmodified hosts carry file sets A and D over real TCP sockets. Prefix `q15s`.

mod common;

use common::LabGuard;
use quicsdn_lab::bench::bicast;
use quicsdn_lab::emulator::control::{Accounting, LinkReport};
use quicsdn_lab::emulator::link::LinkRecord;
use quicsdn_lab::fileset::{self, FileSetHasher};
use quicsdn_lab::netns::Netns;
use quicsdn_lab::process::ProcRecord;
use quicsdn_lab::state::{LabState, SdudpSettings, Topology};
use quicsdn_lab::topology;
use quicsdn_lab::transport::Transport;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const N: u32 = 5;
const P: &str = "q15s";

fn up() -> LabState {
    let mut cfg = common::config(P);
    let s = &mut cfg.settings;
    s.switches = N;
    s.hosts_per_switch = 1;
    s.topology = Topology::Line;
    s.link.delay = Some(Duration::from_millis(2));
    s.link.loss_percent = Some(1.0);
    s.sdudp = Some(SdudpSettings {
        engines: SdudpSettings::parse_engines("all", N).unwrap(),
        accumulate: true,
    });
    topology::up(&cfg).unwrap().state
}

fn in_ns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{name}");
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

/// A file set over one connection: `count` files of `size` bytes, written one
/// by one; the server answers the byte count and the sha256 of every file
/// (folded, `quicsdn_lab::fileset`).
fn send_set(port: u16, count: usize, size: usize, seed: u8) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(
        &format!("10.0.{N}.1:{port}").parse().unwrap(),
        Duration::from_secs(10),
    )
    .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    // The file size first: the server hashes file by file.
    s.write_all(&(size as u32).to_be_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut h = FileSetHasher::new(size);
    for f in 0..count {
        let file = fileset::file(seed, f, size);
        h.update(&file);
        s.write_all(&file).map_err(|e| format!("write: {e}"))?;
    }
    s.shutdown(Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    let want = h.finish();
    if reply != want {
        return Err(format!("reply {reply:?}, want {want:?}"));
    }
    Ok(())
}

/// Host 2's server on `port`: for each connection, reads the file size (4
/// bytes) and then files to EOF, and answers the length and the sha256 of
/// every file; reports each connection's outcome (the bytes after the size).
fn server(port: u16, tx: mpsc::Sender<Result<usize, ErrorKind>>) -> std::thread::JoinHandle<()> {
    in_ns(&format!("{P}-h{N}-1"), move || {
        let l = TcpListener::bind(("0.0.0.0", port)).unwrap();
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let r = (|| {
                    let mut size = [0u8; 4];
                    s.read_exact(&mut size)?;
                    let mut h = FileSetHasher::new(u32::from_be_bytes(size).max(1) as usize);
                    let mut buf = vec![0u8; 65_536];
                    let mut len = 0;
                    loop {
                        match s.read(&mut buf)? {
                            0 => break,
                            n => {
                                h.update(&buf[..n]);
                                len += n;
                            }
                        }
                    }
                    s.write_all(&h.finish())?;
                    Ok::<usize, std::io::Error>(len)
                })();
                let _ = tx.send(r.map_err(|e| e.kind()));
            });
        }
    })
}

fn stats(lab: &LabState, i: u32) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(&lab.engines[i as usize - 1].stats).unwrap()).unwrap()
}

/// Asserts that only UDP crossed a middle link since its counters were reset
/// (the hosts' TCP ends at the edge engines), both ways; returns its report.
fn only_udp_crossed(l: &LinkRecord) -> LinkReport {
    let report = l.control().show().unwrap().report(&Accounting::default());
    for d in [&report.a_to_b, &report.b_to_a] {
        let tcp = d.classes.get("tcp_other").map_or(0, |c| c.offered.frames);
        let udp = d.classes.get("udp_other").map_or(0, |c| c.offered.frames);
        assert_eq!(tcp, 0, "TCP on middle link {}: {}", l.name, d.summary);
        assert!(udp > 0, "no UDP on middle link {}", l.name);
    }
    report
}

/// Stops the HTTP server when the test ends, passed or not (by its PID and
/// start time, never by name).
struct Stop(ProcRecord);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.terminate(Duration::from_secs(2));
    }
}

fn single_file_by_curl(lab: &LabState) {
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let file = www.join("one.bin");
    bicast::make_file(&file, 1_000_000).unwrap();
    let (host_a, host_b) = (&lab.hosts[0], &lab.hosts[lab.hosts.len() - 1]);
    let server = Stop(
        bicast::start_http_server(
            &Netns::named(host_b.netns.clone()),
            dir.path(),
            "cubic",
            &host_b.ip,
            8081,
            &www,
        )
        .unwrap(),
    );
    let url = format!("http://{}:8081/one.bin", host_b.ip);
    let client = Netns::named(host_a.netns.clone());
    bicast::wait_http_from(&client, &url, || {
        anyhow::ensure!(server.0.is_alive(), "the HTTP server exited");
        Ok(())
    })
    .unwrap();
    let got = dir.path().join("got.bin");
    let out = client
        .command("curl")
        .args(["-sS", "--fail", "--max-time", "60", "-o"])
        .arg(&got)
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        bicast::sha256(&got).unwrap(),
        bicast::sha256(&file).unwrap(),
        "the file curl fetched across the SDUDP line differs"
    );
}

#[test]
fn file_sets_cross_five_switches_as_udp_and_an_engine_death_is_visible() {
    common::require_root();
    let _serial = common::serial();
    let _guard = LabGuard::new(P);
    let t0 = Instant::now();
    let lab = up();
    eprintln!("lab up in {:?}", t0.elapsed());

    // The path came from the controller app, through the switch agents
    // (OVS's controller target is the agent's socket, not the controller):
    // every switch sends the line's UDP to its engine (OpenFlow port 100).
    assert_eq!(lab.settings.transport, Transport::Quic);
    let status = topology::status(&common::run_dir(), P).unwrap().unwrap();
    for sw in &status.switches {
        assert!(
            sw.target
                .as_deref()
                .unwrap()
                .contains("quicsdn-openflow.sock"),
            "{sw:?}"
        );
        assert_eq!(sw.connected, Some(true), "{sw:?}");
    }
    for sw in &lab.switches {
        let flows = sw.ovs.as_ref().unwrap().dump_flows("br0").unwrap();
        assert!(
            flows.contains("udp") && flows.contains("actions=output:100"),
            "{}: {flows}",
            sw.name
        );
    }
    // `status --json` names every host's namespace and address.
    let hosts: Vec<_> = status
        .hosts
        .iter()
        .map(|h| (h.netns.as_str(), h.ipv4.as_str()))
        .collect();
    assert_eq!(
        hosts,
        [("q15s-h1-1", "10.0.1.1"), ("q15s-h5-1", "10.0.5.1")]
    );
    assert_eq!(status.engines.len(), N as usize);
    assert!(status.engines.iter().all(|e| e.running));

    let links: Vec<_> = lab
        .data_links
        .iter()
        .map(|l| l.emulated.clone().unwrap())
        .collect();
    let (tx, rx) = mpsc::channel::<Result<usize, ErrorKind>>();
    let _server = server(8080, tx);
    for l in &links {
        l.control().reset_counters().unwrap();
    }
    // File set A (6000 × 0.5 KB) and D (30 × 100 KB).
    for (count, size) in [(6000, 500), (30, 100_000)] {
        let t = Instant::now();
        let r = in_ns(&format!("{P}-h1-1"), move || send_set(8080, count, size, 7))
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
    for l in &links[1..links.len() - 1] {
        let report = only_udp_crossed(l);
        assert!(
            report.a_to_b.total.lost.frames > 0,
            "link {} lost nothing",
            l.name
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let retransmitted: u64 = (2..N)
        .map(|i| stats(&lab, i)["engine"]["retransmitted"].as_u64().unwrap())
        .sum();
    assert!(
        retransmitted > 0,
        "relays: {:?}",
        (2..N).map(|i| stats(&lab, i)).collect::<Vec<_>>()
    );

    // A single file the other way, as the single-file case: curl on
    // host A fetches it from a real HTTP server on host B (B → A is the
    // engines' reverse flow), and it arrives with the same sha256.
    for l in &links {
        l.control().reset_counters().unwrap();
    }
    single_file_by_curl(&lab);
    for l in &links[1..links.len() - 1] {
        only_udp_crossed(l);
    }

    // A relay engine dies mid-transfer: the host's connection fails visibly.
    let (sent_tx, sent_rx) = mpsc::channel();
    let client = in_ns(&format!("{P}-h1-1"), move || {
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
    lab.engines[2].proc.as_ref().unwrap().kill().unwrap();
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
