//! Control-channel bicast: a switch's quicsdn control connection over two
//! paths at once. The multihomed lab in `bicast-both` mode (both directions
//! duplicated onto both emulated paths by groups of type ALL, installed by
//! os-ken through the lab's own agents) carries, between its client and
//! server namespaces, the control channel of a second, real switch: OVS in
//! the client namespace with two hosts, its `quicsdn switch` there, and
//! `quicsdn controller` with os-ken's L2 learning app in the server namespace.
//!
//! With path A dropping 30 % of frames and path B cut, for longer than OVS's
//! inactivity probe allows a silent channel (5 s + 5 s), the OpenFlow session
//! stays up and the hosts' first pings (ARP and ICMP as PACKET_INs, flows
//! installed by the controller) are answered.

mod common;

use std::time::{Duration, Instant};

use common::{lab_ok, require_root, serial};
use quicsdn_lab::controller::{ControllerSpec, start_controller};
use quicsdn_lab::emulator::{DirSettings, cli::parse_loss};
use quicsdn_lab::host::{HostSpec, attach_host, ping};
use quicsdn_lab::multihomed::{ControlledSwitch, Mode, Multihomed, MultihomedSpec};
use quicsdn_lab::netns::Netns;
use quicsdn_lab::topology::default_repo_dir;

const PREFIX: &str = "q14cc";
const HOSTS: [&str; 2] = ["q14cc-h1", "q14cc-h2"];

/// The data hosts' namespaces (the lab removes its own).
struct Hosts;
impl Drop for Hosts {
    fn drop(&mut self) {
        for h in HOSTS {
            if Netns::exists(h) {
                let n = Netns::named(h);
                let _ = n.kill_all(Duration::from_secs(2));
                let _ = n.delete();
            }
        }
    }
}

#[test]
fn the_control_channel_survives_a_lossy_path_and_a_cut_one() {
    let _s = serial();
    require_root();
    drop(Hosts); // leftovers of a crashed run
    let dir = std::path::PathBuf::from("/run/quicsdn-lab/q14cc-e2e");
    let _ = std::fs::remove_dir_all(&dir);
    let path = DirSettings {
        delay_ns: 5_000_000,
        rate_bps: 100_000_000,
        ..Default::default()
    };
    let mut lab = Multihomed::up(&MultihomedSpec {
        prefix: PREFIX.into(),
        mode: Mode::BicastBoth,
        paths: [(path.clone(), path.clone()), (path.clone(), path)],
        dir: dir.join("lab"),
        repo_dir: default_repo_dir(),
        venv_dir: None,
    })
    .unwrap();
    let _hosts = Hosts;

    // The controlled switch's controller (L2 learning), on the server, then
    // the switch (OVS in the client namespace) and the agents, across the
    // two paths.
    let controller = start_controller(
        &lab.server_ns(),
        &ControllerSpec::osken_on_loopback(dir.join("ctl"), default_repo_dir()),
    )
    .unwrap();
    lab.adopt(controller.proc);
    let sw = ControlledSwitch::start(&mut lab, &dir.join("sw"), 0x10, "tcp:127.0.0.1:6653", &[])
        .unwrap();
    let ovs = sw.ovs;
    for (j, h) in HOSTS.iter().enumerate() {
        Netns::create(h).unwrap();
        attach_host(
            &HostSpec {
                netns: h.to_string(),
                ifname: "eth0".into(),
                mac: format!("02:cc:00:00:00:{:02x}", j + 1),
                cidr: format!("10.9.0.{}/24", j + 1),
                port: format!("h{}", j + 1),
                ofport: Some(j as u16 + 1),
            },
            &ovs,
            "br0",
        )
        .unwrap();
    }
    ovs.wait_connected("br0", Duration::from_secs(30)).unwrap();

    // Both paths carry the control channel, in both directions.
    lab.reset_counters().unwrap();
    std::thread::sleep(Duration::from_secs(4)); // a keep-alive or an echo each way
    let c = lab.path_counters().unwrap();
    for (p, name) in c.iter().zip(["A", "B"]) {
        assert!(p[0].frames > 0 && p[1].frames > 0, "path {name}: {c:?}");
    }
    assert_eq!(c[0][0].frames, c[1][0].frames, "duplicates differ: {c:?}");

    // Path A drops 30 %, path B is cut; for 12 s the session must hold.
    lab.set_loss(parse_loss("30%").unwrap()).unwrap();
    lab.set_path_up(1, false).unwrap();
    let impaired = Instant::now();
    let h1 = Netns::named(HOSTS[0]);
    let st = ping(&h1, "10.9.0.2", 10, 1.0).unwrap();
    assert!(
        st.received >= 3,
        "h1 -> h2 through flows learned over the lossy path: {st:?}; flows: {}",
        ovs.dump_flows("br0").unwrap_or_default()
    );
    while impaired.elapsed() < Duration::from_secs(12) {
        assert!(
            ovs.is_connected("br0").unwrap(),
            "OVS lost its controller after {:?} on one lossy path",
            impaired.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // One OpenFlow session from start to end: OVS never reconnected.
    let reconnects = ovs
        .log_lines()
        .unwrap()
        .into_iter()
        .filter(|l| l.module == "rconn" && l.text.contains("connected"))
        .count();
    assert_eq!(reconnects, 1, "OVS connected more than once");
    // The loss was applied: path A dropped frames. Counted over both
    // directions: one direction alone carries only about a dozen frames in
    // these 12 s, and 0.7^11 = 2 % of runs would lose none of them.
    let c = lab.path_counters().unwrap();
    assert!(
        c[0][0].lost + c[0][1].lost > 0,
        "path A dropped nothing: {c:?}"
    );
    // Passed: the lab's processes and namespaces go, then its logs (a
    // failure keeps them for reading).
    drop(lab);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `quicsdn-lab bench control-bicast --quick`: the control channel on one
/// path and on two, ECHO and flow-install probes through the agents to a real
/// OVS, with 30 % loss on path A and path A cut. Checks what it recorded
/// (never how fast): on two paths no probe went unanswered and no session
/// was lost, path B carried the channel only in bicast, and the controller
/// agent saw no connection migration from the duplicates.
#[test]
fn bench_control_bicast_quick_keeps_every_probe_answered_on_two_paths() {
    use quicsdn_lab::bench::control_bicast::CONDITIONS_HEADER;
    use quicsdn_lab::bench::out::Csv;

    let _s = serial();
    require_root();
    let out = tempfile::tempdir().unwrap();
    lab_ok(&[
        "bench",
        "control-bicast",
        "--quick",
        "--prefix=q14cq",
        &format!("--out={}", out.path().display()),
    ]);
    let t = Csv::read(&out.path().join("conditions.csv"), CONDITIONS_HEADER).unwrap();
    let c = |n: &str| t.col(n);
    let row = |mode: &str, cond: &str| {
        t.rows
            .iter()
            .find(|r| r[c("mode")] == mode && r[c("condition")] == cond)
            .unwrap_or_else(|| panic!("no {mode} {cond:?} in {}", t.render()))
    };
    let num = |r: &Vec<String>, n: &str| r[c(n)].parse::<u64>().unwrap();
    for cond in ["A 30 %", "A cut", "both 30 %", "A cut + B 30 %"] {
        let r = row("bicast-both", cond);
        assert!(num(r, "echo_n") > 0 && num(r, "flow_n") > 0, "{r:?}");
        assert_eq!(num(r, "timeouts"), 0, "{r:?}");
        assert_eq!(num(r, "sessions_lost"), 0, "{r:?}");
        assert!(num(r, "path_b_bytes") > 0, "path B idle in bicast: {r:?}");
        assert_eq!(
            num(r, "migrations"),
            0,
            "duplicates seen as a new path: {r:?}"
        );
    }
    for cond in ["A 30 %", "A cut"] {
        let r = row("unicast", cond);
        assert!(num(r, "echo_n") + num(r, "timeouts") > 0, "{r:?}");
        assert!(
            num(r, "path_b_bytes") < 1000,
            "path B used in unicast: {r:?}"
        );
    }
}
