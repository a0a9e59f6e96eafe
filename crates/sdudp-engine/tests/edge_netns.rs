//! Two edge engine processes (`quicsdn-sdudp edge`) between two unmodified
//! Linux hosts, on one L2 segment (a Linux bridge in its own namespace): the
//! hosts use real TCP sockets, the engines' kernels terminate them
//! transparently, and the bytes cross between the engines as SDUDP. Needs
//! root. Namespaces `q15-e<pid>-*`, removed by name on drop.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const A_MAC: &str = "02:15:00:00:01:fe";
const B_MAC: &str = "02:15:00:00:05:fe";

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Bed {
    prefix: String,
    engines: Vec<Option<Child>>,
    dir: tempfile::TempDir,
}

impl Bed {
    fn ns(&self, n: &str) -> String {
        format!("{}-{n}", self.prefix)
    }

    fn x(&self, n: &str, args: &[&str]) {
        let ns = self.ns(n);
        let mut v = vec!["ip", "netns", "exec", ns.as_str()];
        v.extend_from_slice(args);
        sh(&v);
    }

    fn up() -> Bed {
        assert!(unsafe { libc::geteuid() } == 0, "this test needs root");
        let mut bed = Bed {
            prefix: format!("q15-e{}", std::process::id()),
            engines: Vec::new(),
            dir: tempfile::tempdir().unwrap(),
        };
        for n in ["br", "h1", "a", "b", "h2"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &bed.ns(n)])
                .output();
            sh(&["ip", "netns", "add", &bed.ns(n)]);
            bed.x(n, &["ip", "link", "set", "lo", "up"]);
            bed.x(n, &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
        }
        bed.x("br", &["ip", "link", "add", "br0", "type", "bridge"]);
        bed.x("br", &["ip", "link", "set", "br0", "up"]);
        for (n, ifname, mac, addr) in [
            ("h1", "eth0", "02:15:00:00:01:01", "10.0.1.1/16"),
            ("a", "sw", A_MAC, "10.0.1.254/16"),
            ("b", "sw", B_MAC, "10.0.5.254/16"),
            ("h2", "eth0", "02:15:00:00:05:01", "10.0.5.1/16"),
        ] {
            let peer = format!("p{n}");
            let ns = bed.ns(n);
            bed.x(
                "br",
                &[
                    "ip", "link", "add", &peer, "type", "veth", "peer", "name", ifname, "netns",
                    &ns,
                ],
            );
            bed.x("br", &["ip", "link", "set", &peer, "master", "br0", "up"]);
            bed.x(n, &["ip", "link", "set", ifname, "address", mac, "up"]);
            bed.x(n, &["ip", "addr", "add", addr, "dev", ifname]);
            bed.x(n, &["ethtool", "-K", ifname, "tx", "off"]);
        }
        // Each host reaches the other through its edge engine.
        bed.x(
            "h1",
            &[
                "ip",
                "neigh",
                "add",
                "10.0.5.1",
                "lladdr",
                A_MAC,
                "dev",
                "eth0",
                "nud",
                "permanent",
            ],
        );
        bed.x(
            "h2",
            &[
                "ip",
                "neigh",
                "add",
                "10.0.1.1",
                "lladdr",
                B_MAC,
                "dev",
                "eth0",
                "nud",
                "permanent",
            ],
        );
        for (n, ip, mac, nb, far) in [
            (
                "a",
                "10.0.1.254",
                A_MAC,
                format!("10.0.5.254,{B_MAC}"),
                "10.0.5.0/24=10.0.5.254",
            ),
            (
                "b",
                "10.0.5.254",
                B_MAC,
                format!("10.0.1.254,{A_MAC}"),
                "10.0.1.0/24=10.0.1.254",
            ),
        ] {
            let stats = bed.dir.path().join(format!("{n}.json"));
            let child = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &bed.ns(n),
                    env!("CARGO_BIN_EXE_quicsdn-sdudp"),
                    "edge",
                ])
                .args([
                    "--interface",
                    "sw",
                    "--ip",
                    ip,
                    "--mac",
                    mac,
                    "--neighbour",
                    &nb,
                ])
                .args(["--far-edge", far, "--stats"])
                .arg(&stats)
                .args(["--stats-interval", "50ms", "--connect-timeout", "3s"])
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            bed.engines.push(Some(child));
        }
        let t0 = Instant::now();
        while !["a", "b"]
            .iter()
            .all(|n| bed.dir.path().join(format!("{n}.json")).exists())
        {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "engines did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bed
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.engines[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `f` on a thread inside namespace `n`.
    fn spawn<T: Send + 'static>(
        &self,
        n: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.ns(n));
        std::thread::spawn(move || {
            let file = std::fs::File::open(path).unwrap();
            assert_eq!(
                unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            f()
        })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for i in 0..self.engines.len() {
            self.kill(i);
        }
        for n in ["h1", "a", "b", "h2", "br"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(n)])
                .output();
        }
    }
}

/// FNV-1a: the server answers each upload with its length and hash.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn data(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed >> 3) as u8)
        .collect()
}

/// Host 2's server: for each connection, reads to EOF and answers the length
/// and hash; reports each connection's outcome (Ok(len) or the error kind).
fn server(bed: &Bed, results: mpsc::Sender<Result<usize, ErrorKind>>) {
    let _ = bed.spawn("h2", move || {
        let l = TcpListener::bind("0.0.0.0:8080").unwrap();
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let results = results.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let r = s.read_to_end(&mut got).map(|_| {
                    let mut reply = (got.len() as u64).to_be_bytes().to_vec();
                    reply.extend_from_slice(&fnv(&got).to_be_bytes());
                    let _ = s.write_all(&reply);
                    got.len()
                });
                let _ = results.send(r.map_err(|e| e.kind()));
            });
        }
    });
}

fn upload(n: usize, seed: u32) -> Result<(), String> {
    let body = data(n, seed);
    let mut s =
        TcpStream::connect_timeout(&"10.0.5.1:8080".parse().unwrap(), Duration::from_secs(10))
            .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(&body).map_err(|e| format!("write: {e}"))?;
    s.shutdown(Shutdown::Write)
        .map_err(|e| format!("shutdown: {e}"))?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    let mut want = (n as u64).to_be_bytes().to_vec();
    want.extend_from_slice(&fnv(&body).to_be_bytes());
    if reply != want {
        return Err(format!("reply {reply:?}, want {want:?}"));
    }
    Ok(())
}

#[test]
fn hosts_talk_tcp_through_sdudp_edges() {
    let mut bed = Bed::up();
    let (tx, rx) = mpsc::channel();
    server(&bed, tx);

    // One upload of 5 MB, byte-exact (length and hash both ways).
    let t = Instant::now();
    let r = bed.spawn("h1", || upload(5_000_000, 1)).join().unwrap();
    assert_eq!(r, Ok(()));
    eprintln!(
        "5 MB through two edge engines in {:?}: {:.1} Mbit/s",
        t.elapsed(),
        40.0 / t.elapsed().as_secs_f64()
    );
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(Ok(5_000_000)));

    // Refusal is refusal: nothing listens on 8081.
    let r = bed
        .spawn("h1", || {
            TcpStream::connect_timeout(
                &"10.0.5.1:8081".parse::<SocketAddr>().unwrap(),
                Duration::from_secs(10),
            )
            .map(|_| ())
            .map_err(|e| e.kind())
        })
        .join()
        .unwrap();
    assert_eq!(r, Err(ErrorKind::ConnectionRefused));

    // Many connections at once.
    let clients: Vec<_> = (0..20u32)
        .map(|i| bed.spawn("h1", move || upload(50_000 + i as usize * 1_000, i)))
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), Ok(()));
    }
    for _ in 0..20 {
        assert!(matches!(rx.recv_timeout(Duration::from_secs(5)), Ok(Ok(_))));
    }
    // Every connection went through the engines (the hosts reach each other
    // only through them: neither engine's kernel forwards).
    std::thread::sleep(Duration::from_millis(200));
    let stats = |n: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(bed.dir.path().join(format!("{n}.json"))).unwrap())
            .unwrap()
    };
    let (a, b) = (stats("a"), stats("b"));
    assert_eq!(a["edge"]["opened"], 22, "{a}");
    assert_eq!(a["edge"]["resets_sent"], 1, "{a}");
    assert_eq!(b["edge"]["accepted"], 21, "{b}");

    // Engine A dies mid-upload: host 1's connection is reset at once (its
    // sockets close with RST), host 2's when engine B notices (dead_after).
    let (sent_tx, sent_rx) = mpsc::channel();
    let client = bed.spawn("h1", move || {
        let mut s = TcpStream::connect("10.0.5.1:8080").unwrap();
        let chunk = data(65_536, 3);
        let mut sent = 0usize;
        loop {
            if let Err(e) = s.write_all(&chunk) {
                return e.kind();
            }
            sent += chunk.len();
            let _ = sent_tx.send(sent);
        }
    });
    // Kill once a few megabytes went through.
    while sent_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("upload stalled")
        < 4_000_000
    {}
    let killed = Instant::now();
    bed.kill(0);
    let r = client.join().unwrap();
    assert!(
        matches!(r, ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
        "{r:?}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    let server_side = rx.recv_timeout(Duration::from_secs(15)).unwrap();
    assert!(
        server_side.is_err(),
        "host 2 must see the connection fail: {server_side:?}"
    );
}
