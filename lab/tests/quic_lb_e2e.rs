//! Two controller-agent hosts behind one address: a QUIC-LB load balancer
//! (the lab's, `quicsdn_lab::balancer`) in front of two controller agents,
//! each as its own host with its own `--server-id` (0a, 0b) and session
//! store, host 0a with two worker processes on its port (`--workers 2`: the
//! balancer routes to the host by its server id, the host's reuseport program
//! to the worker by the octet after it), and 8 switches (real switch agents
//! with the storm bench's simulated OVS) whose `--controller` is the
//! balancer. Loopback only.
//!
//! Asserts, in order:
//! 1. each switch lands on the agent its address hashes to (the balancer's
//!    fallback for a client's first packets), so both agents have switches;
//! 2. **0-RTT**: agent 0a is restarted (SIGTERM, then the same command); its
//!    switches come back to it, every one resumed in 0-RTT (the ticket is in
//!    0a's store, and an unchanged address hashes to 0a again); 0b's
//!    switches are not disturbed;
//! 3. **migration**: every switch agent moves to a new port chosen so that
//!    its address now hashes to the *other* agent; every connection follows
//!    its switch to the new address at the agent (and worker) that owns it
//!    (the balancer routed by the server id in the connection IDs, host 0a's
//!    program by the worker octet), with no new OpenFlow handshake anywhere.
//!
//! Needs the `quicsdn` binary of the same profile (`cargo build -p quicsdn`).

mod common;

use quicsdn_agent::{CommonConfig, ControllerTarget, ServiceConfig, SwitchAgent, SwitchConfig};
use quicsdn_lab::agents::quicsdn_binary;
use quicsdn_lab::balancer::{Backend, Balancer, Router};
use quicsdn_lab::bench::storm::sim::CountingController;
use quicsdn_lab::pki::Pki;
use quicsdn_lab::process::{ProcRecord, spawn_service};
use quicsdn_lab::wait::poll_until;
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SWITCHES: usize = 8;
const SERVER_IDS: [&str; 2] = ["0a", "0b"];

/// A loopback UDP port nobody uses now whose address the balancer hashes to
/// `backend`.
fn port_hashing_to(router: &Router, backend: usize, taken: &[u16]) -> u16 {
    loop {
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        if router.by_address(addr) == backend && !taken.contains(&addr.port()) {
            return addr.port();
        }
    }
}

/// One controller agent "host": its command, control sockets and process.
struct Host {
    server_id: &'static str,
    workers: Option<u16>,
    port: u16,
    control: PathBuf,
    proc: Option<ProcRecord>,
}

impl Host {
    /// One control socket per worker (`PATH.i`), or the agent's.
    fn controls(&self) -> Vec<PathBuf> {
        match self.workers {
            Some(n) => (0..n)
                .map(|i| PathBuf::from(format!("{}.{i}", self.control.display())))
                .collect(),
            None => vec![self.control.clone()],
        }
    }

    /// The switches on this host (any worker) and their addresses there.
    fn switches(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let mut all = BTreeMap::new();
        for c in self.controls() {
            all.extend(common::connected_switches(&c)?);
        }
        Ok(all)
    }

    fn start(&mut self, pki: &Pki, controller: SocketAddr, work: &Path, log: &Path) {
        let ctl = pki.agent_files("ctl");
        let mut c = Command::new(quicsdn_binary().unwrap());
        c.args(["--log-level=info", "controller"])
            .arg(format!("--listen=127.0.0.1:{}", self.port))
            .arg(format!("--server-id={}", self.server_id))
            .arg(format!("--ca={}", ctl.ca.display()))
            .arg(format!("--cert={}", ctl.cert.display()))
            .arg(format!("--key={}", ctl.key.display()))
            .arg(format!("--service=openflow=tcp:{controller}"))
            .arg(format!("--control={}", self.control.display()))
            .arg(format!(
                "--session-store={}",
                work.join(format!("sessions-{}", self.server_id)).display()
            ));
        if let Some(n) = self.workers {
            c.arg(format!("--workers={n}"));
        }
        for c in self.controls() {
            let _ = std::fs::remove_file(c);
        }
        let proc =
            spawn_service(&format!("controller agent {}", self.server_id), &mut c, log).unwrap();
        poll_until(
            "the controller agent's control sockets",
            Duration::from_secs(20),
            || {
                anyhow::ensure!(
                    proc.is_alive(),
                    "controller agent {} exited",
                    self.server_id
                );
                Ok(self.switches().ok().map(|_| ()))
            },
        )
        .unwrap();
        self.proc = Some(proc);
    }

    /// SIGTERM (a supervisor stops its workers), and whatever is left killed.
    fn stop(&mut self) {
        if let Some(p) = self.proc.take() {
            let workers = p.children();
            p.terminate(Duration::from_secs(10)).unwrap();
            for w in workers {
                let _ = w.kill();
            }
        }
    }
}

#[test]
fn a_quic_lb_balancer_keeps_0rtt_and_migration_across_two_controller_agents() {
    let _s = common::serial();
    let dir = tempfile::Builder::new()
        .prefix("qsdnX-quiclb-")
        .tempdir()
        .unwrap();
    let work = dir.path();
    let pki = common::agents_pki(&work.join("pki"), SWITCHES);
    let controller = CountingController::start().unwrap();
    let mut hosts: Vec<Host> = SERVER_IDS
        .iter()
        .map(|id| Host {
            server_id: id,
            workers: (*id == "0a").then_some(2),
            port: UdpSocket::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port(),
            control: work.join(format!("ctl-{id}.sock")),
            proc: None,
        })
        .collect();
    let logs: Vec<PathBuf> = SERVER_IDS
        .iter()
        .map(|id| work.join(format!("ctl-{id}.log")))
        .collect();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for (h, log) in hosts.iter_mut().zip(&logs) {
            h.start(&pki, controller.addr(), work, log);
        }
        run(&pki, &controller, &mut hosts, work)
    }));
    for h in &mut hosts {
        h.stop();
    }
    if let Err(e) = result {
        for log in std::fs::read_dir(work).unwrap().flatten() {
            let path = log.path();
            if path.extension().is_some_and(|e| e == "log") {
                eprintln!(
                    "{}:\n{}",
                    path.display(),
                    std::fs::read_to_string(&path).unwrap_or_default()
                );
            }
        }
        std::panic::resume_unwind(e);
    }
}

fn run(pki: &Pki, controller: &CountingController, hosts: &mut [Host], work: &Path) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let router = Router::new(
        hosts
            .iter()
            .map(|h| Backend {
                server_id: h.server_id.parse().unwrap(),
                addr: SocketAddr::from(([127, 0, 0, 1], h.port)),
            })
            .collect(),
    )
    .unwrap();
    let lb = rt
        .block_on(Balancer::start(
            "127.0.0.1:0".parse().unwrap(),
            router.clone(),
        ))
        .unwrap();

    // 1. Half the switches from addresses that hash to each agent.
    let mut ports = Vec::new();
    for i in 0..SWITCHES {
        let port = port_hashing_to(&router, i % 2, &ports);
        ports.push(port);
    }
    let name = |i: usize| format!("sw{}", i + 1);
    let agents: Vec<SwitchAgent> = rt.block_on(async {
        let mut v = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let sock = work.join(format!("{}.sock", name(i)));
            let services =
                vec![ServiceConfig::parse(&format!("openflow=punix:{}", sock.display())).unwrap()];
            let common = CommonConfig::new(pki.agent_files(&name(i)), services);
            let config = SwitchConfig {
                bind: Some(SocketAddr::from(([127, 0, 0, 1], *port))),
                ..SwitchConfig::new(ControllerTarget::new(lb.addr().to_string(), "ctl"), common)
            };
            v.push(SwitchAgent::start(config).await.unwrap());
        }
        v
    });
    for a in &agents {
        assert!(
            rt.block_on(a.wait_connected(Duration::from_secs(30))),
            "switch agent {} did not connect through the balancer",
            a.identity()
        );
    }
    let _fleet = common::fleet_all_live(
        controller,
        (0..SWITCHES)
            .map(|i| (work.join(format!("{}.sock", name(i))), i as u64 + 1))
            .collect(),
    );
    let on = |h: &Host| h.switches().unwrap();
    let expected = |backend: usize| -> Vec<String> {
        (0..SWITCHES)
            .filter(|i| i % 2 == backend)
            .map(name)
            .collect()
    };
    for (b, h) in hosts.iter().enumerate() {
        let got: Vec<String> = on(h).into_keys().collect();
        assert_eq!(got, expected(b), "the switches on agent {}", h.server_id);
    }

    // 2. Agent 0a restarts; its switches resume there in 0-RTT.
    let t0 = controller.now();
    hosts[0].stop();
    let log2 = work.join("ctl-0a-restarted.log");
    hosts[0].start(pki, controller.addr(), work, &log2);
    let dpid = |s: &str| s.trim_start_matches("sw").parse::<u64>().unwrap();
    poll_until(
        "agent 0a's switches to be back",
        Duration::from_secs(60),
        || {
            let back: Vec<u64> = controller
                .handshakes_since(t0)
                .iter()
                .map(|h| h.dpid)
                .collect();
            Ok((expected(0).iter().all(|s| back.contains(&dpid(s)))
                && controller.live() >= SWITCHES)
                .then_some(()))
        },
    )
    .unwrap();
    let disturbed: Vec<u64> = controller
        .handshakes_since(t0)
        .iter()
        .map(|h| h.dpid)
        .filter(|d| expected(1).iter().any(|s| dpid(s) == *d))
        .collect();
    assert!(
        disturbed.is_empty(),
        "agent 0b's switches reconnected: {disturbed:?}"
    );
    assert_eq!(
        on(&hosts[0]).into_keys().collect::<Vec<_>>(),
        expected(0),
        "back on agent 0a"
    );
    let log = std::fs::read_to_string(&log2).unwrap();
    for s in expected(0) {
        let connected: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("switch agent connected") && l.contains(&format!("switch={s} ")))
            .collect();
        assert!(
            !connected.is_empty() && connected.iter().all(|l| l.contains("zero_rtt=true")),
            "{s} did not resume in 0-RTT at the restarted agent: {connected:?}"
        );
    }

    // 3. Every switch moves to an address that hashes to the other agent.
    let t1 = controller.now();
    let before: Vec<BTreeMap<String, String>> = hosts.iter().map(on).collect();
    let counted: Vec<u64> = (0..hosts.len()).map(|b| lb.counts(b).0).collect();
    let mut taken = ports.clone();
    // Rebinding opens the new socket on the agents' runtime.
    let entered = rt.enter();
    for (i, a) in agents.iter().enumerate() {
        let other = 1 - i % 2;
        let port = port_hashing_to(&router, other, &taken);
        taken.push(port);
        let to = SocketAddr::from(([127, 0, 0, 1], port));
        assert_eq!(router.by_address(to), other);
        assert_eq!(a.rebind(to).unwrap(), to);
    }
    drop(entered);
    poll_until(
        "every connection to follow its switch to its new address",
        Duration::from_secs(30),
        || {
            let now: Vec<BTreeMap<String, String>> = hosts.iter().map(on).collect();
            let moved = now.iter().zip(&before).all(|(now, before)| {
                now.len() == before.len()
                    && before
                        .iter()
                        .all(|(s, r)| now.get(s).is_some_and(|n| n != r))
            });
            Ok(moved.then_some(()))
        },
    )
    .unwrap();
    let reconnected: Vec<u64> = controller
        .handshakes_since(t1)
        .iter()
        .map(|h| h.dpid)
        .collect();
    assert!(
        reconnected.is_empty(),
        "switches reconnected instead of migrating: {reconnected:?}"
    );
    assert_eq!(controller.live(), SWITCHES);
    for (b, h) in hosts.iter().enumerate() {
        assert_eq!(
            on(h).into_keys().collect::<Vec<_>>(),
            expected(b),
            "still on agent {}",
            h.server_id
        );
        assert!(
            lb.counts(b).0 > counted[b],
            "nothing routed to agent {} by server id after the move",
            h.server_id
        );
    }
    println!(
        "balancer: agent 0a {:?}, agent 0b {:?} datagrams (by server id, by address); {} flows",
        lb.counts(0),
        lb.counts(1),
        lb.flows()
    );
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for a in agents {
            set.spawn(a.shutdown());
        }
        while set.join_next().await.is_some() {}
    });
}
