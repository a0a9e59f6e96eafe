//! `quicsdn controller --workers 2`: two controller-agent processes on one
//! UDP port (SO_REUSEPORT, packets steered by the server id in the
//! connection IDs). 200 switches, each a real switch agent with a simulated
//! Open vSwitch (the storm bench's, with OVS's rconn timing) and an OpenFlow
//! session to a counting controller behind the agents, spread over both
//! workers. One worker is killed (SIGKILL, as a crash); the supervisor starts
//! it again on the same socket. Asserts: the switches are spread over both
//! workers; every switch of the killed worker completes a new OpenFlow
//! handshake and all 200 are connected again (on either worker); the other
//! worker's switches are not disturbed (no new handshake: the group's
//! sockets did not move, so neither did the steering nor the hash).
//!
//! Needs the `quicsdn` binary of the same profile (`cargo build -p quicsdn`).

mod common;

use quicsdn_agent::{CommonConfig, ControllerTarget, ServiceConfig, SwitchAgent, SwitchConfig};
use quicsdn_lab::agents::quicsdn_binary;
use quicsdn_lab::bench::storm::sim::CountingController;
use quicsdn_lab::pki::Pki;
use quicsdn_lab::process::{ProcRecord, spawn_service};
use quicsdn_lab::wait::poll_until;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SWITCHES: usize = 200;

/// The switches connected to the worker with control socket `sock`.
fn worker_switches(sock: &Path) -> anyhow::Result<BTreeSet<String>> {
    Ok(common::connected_switches(sock)?.into_keys().collect())
}

/// The supervisor's worker processes, by worker index (from their
/// `QUICSDN_WORKER` environment).
fn workers_of(supervisor: &ProcRecord) -> Vec<(u8, ProcRecord)> {
    let mut found = Vec::new();
    for child in supervisor.children() {
        let env = std::fs::read(format!("/proc/{}/environ", child.pid)).unwrap_or_default();
        for var in env.split(|&b| b == 0) {
            if let Some(v) = var.strip_prefix(b"QUICSDN_WORKER=")
                && let Some(i) = String::from_utf8_lossy(v)
                    .split(',')
                    .next()
                    .and_then(|i| i.parse().ok())
            {
                found.push((i, child.clone()));
            }
        }
    }
    found.sort_by_key(|(i, _)| *i);
    found
}

#[test]
fn two_workers_share_a_port_and_a_killed_one_gets_its_switches_back() {
    let _s = common::serial();
    let dir = tempfile::Builder::new()
        .prefix("qsdnX-reuseport-")
        .tempdir()
        .unwrap();
    let work = dir.path();
    let pki = common::agents_pki(&work.join("pki"), SWITCHES);
    let controller = CountingController::start().unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ctl = pki.agent_files("ctl");
    let control = work.join("ctl.sock");
    let control_of = |i: u8| PathBuf::from(format!("{}.{i}", control.display()));
    let log = work.join("ctl.log");
    let mut c = Command::new(quicsdn_binary().unwrap());
    c.args(["--log-level=info", "controller", "--workers=2"])
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg(format!("--ca={}", ctl.ca.display()))
        .arg(format!("--cert={}", ctl.cert.display()))
        .arg(format!("--key={}", ctl.key.display()))
        .arg(format!("--service=openflow=tcp:{}", controller.addr()))
        .arg(format!(
            "--service=ovsdb=punix:{}/ovsdb-{{switch}}.sock",
            work.display()
        ))
        .arg(format!("--control={}", control.display()))
        // Each worker keeps its own store (`sessions.0`, `sessions.1`), as a
        // deployment with 0-RTT across restarts runs them.
        .arg(format!(
            "--session-store={}",
            work.join("sessions").display()
        ));
    let supervisor = spawn_service("quicsdn controller --workers=2", &mut c, &log).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(&pki, &controller, port, &supervisor, &control_of, work)
    }));
    // The supervisor stops its workers on SIGTERM.
    let workers = supervisor.children();
    supervisor.terminate(Duration::from_secs(10)).unwrap();
    for w in workers {
        let _ = w.kill();
    }
    if let Err(e) = result {
        eprintln!(
            "controller agent log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::panic::resume_unwind(e);
    }
}

fn run(
    pki: &Pki,
    controller: &CountingController,
    port: u16,
    supervisor: &ProcRecord,
    control_of: &dyn Fn(u8) -> PathBuf,
    work: &Path,
) {
    poll_until("both workers to listen", Duration::from_secs(20), || {
        anyhow::ensure!(supervisor.is_alive(), "the supervisor exited");
        Ok((control_of(0).exists() && control_of(1).exists()).then_some(()))
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut agents = Vec::new();
    for batch in (1..=SWITCHES).collect::<Vec<_>>().chunks(50) {
        let started: Vec<SwitchAgent> = rt.block_on(async {
            let mut v = Vec::new();
            for &i in batch {
                let sock = work.join(format!("sw{i}.sock"));
                let services = [
                    format!("openflow=punix:{}", sock.display()),
                    "ovsdb=tcp:127.0.0.1:1".to_string(),
                ]
                .iter()
                .map(|s| ServiceConfig::parse(s).unwrap())
                .collect();
                let common = CommonConfig::new(pki.agent_files(&format!("sw{i}")), services);
                let config = SwitchConfig {
                    bind: Some("127.0.0.1:0".parse().unwrap()),
                    ..SwitchConfig::new(
                        ControllerTarget::new(format!("127.0.0.1:{port}"), "ctl"),
                        common,
                    )
                };
                v.push(SwitchAgent::start(config).await.unwrap());
            }
            v
        });
        for a in &started {
            assert!(
                rt.block_on(a.wait_connected(Duration::from_secs(60))),
                "switch agent {} did not connect",
                a.identity()
            );
        }
        agents.extend(started);
    }
    let fleet = common::fleet_all_live(
        controller,
        (1..=SWITCHES)
            .map(|i| (work.join(format!("sw{i}.sock")), i as u64))
            .collect(),
    );
    let on0 = worker_switches(&control_of(0)).unwrap();
    let on1 = worker_switches(&control_of(1)).unwrap();
    println!(
        "switches on worker 0: {}, on worker 1: {}",
        on0.len(),
        on1.len()
    );
    assert_eq!(on0.len() + on1.len(), SWITCHES, "each switch on one worker");
    assert!(on0.is_disjoint(&on1));
    assert!(!on0.is_empty() && !on1.is_empty(), "spread over both");
    // Both started once: workers whose stores shared a temporary file failed
    // at start ("No such file or directory") and were started again.
    let log = std::fs::read_to_string(work.join("ctl.log")).unwrap();
    assert!(
        !log.contains("worker exited"),
        "a worker exited before any was killed:\n{log}"
    );

    let before = workers_of(supervisor);
    let (_, worker1) = before.iter().find(|(i, _)| *i == 1).expect("worker 1");
    let pid1 = worker1.pid;
    let t0 = controller.now();
    worker1.kill().unwrap();
    // Every switch of worker 1 back (a new OpenFlow handshake), all live.
    let dpid = |s: &str| s.trim_start_matches("sw").parse::<u64>().unwrap();
    let back = || -> BTreeSet<u64> {
        controller
            .handshakes()
            .into_iter()
            .filter(|h| h.at >= t0)
            .map(|h| h.dpid)
            .collect()
    };
    poll_until(
        "worker 1's switches to be back",
        Duration::from_secs(60),
        || {
            let b = back();
            Ok(
                (on1.iter().all(|s| b.contains(&dpid(s))) && controller.live() >= SWITCHES)
                    .then_some(()),
            )
        },
    )
    .unwrap_or_else(|e| {
        let b = back();
        panic!(
            "{e:#}: {} of worker 1's {} switches back",
            on1.iter().filter(|s| b.contains(&dpid(s))).count(),
            on1.len()
        )
    });
    let secs = (controller.now() - t0).as_secs_f64();
    let b = back();
    let disturbed: Vec<&String> = on0.iter().filter(|s| b.contains(&dpid(s))).collect();
    assert!(
        disturbed.is_empty(),
        "worker 0's switches were not to reconnect: {disturbed:?}"
    );
    // The supervisor started worker 1 again, and the switches are on either.
    let after = workers_of(supervisor);
    let new1 = after.iter().find(|(i, _)| *i == 1).expect("worker 1 again");
    assert_ne!(new1.1.pid, pid1);
    poll_until("worker 1's control socket", Duration::from_secs(10), || {
        Ok(worker_switches(&control_of(1)).ok())
    })
    .unwrap();
    let now0 = worker_switches(&control_of(0)).unwrap();
    let now1 = worker_switches(&control_of(1)).unwrap();
    assert_eq!(now0.len() + now1.len(), SWITCHES);
    println!(
        "worker 1 killed: its {} switches back in {secs:.2} s, now {} on worker 0 and {} on worker 1",
        on1.len(),
        now0.len(),
        now1.len()
    );
    drop(fleet);
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for a in agents {
            set.spawn(a.shutdown());
        }
        while set.join_next().await.is_some() {}
    });
}
