//! `quicsdn-lab up`/`down`/`status` through the real binary: idempotence,
//! clear refusals, and no leftovers (namespaces, processes, interfaces, state),
//! also after an `up` that was killed half-way. `status` reads the real
//! agents' Prometheus metrics, and they move when hosts ping. Needs root.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use quicsdn_lab::process::ProcRecord;
use quicsdn_lab::topology;
use quicsdn_lab::wait::poll_until;

const BIN: &str = env!("CARGO_BIN_EXE_quicsdn-lab");
/// How long the agents may take to show what the test did.
const PATIENCE: Duration = Duration::from_secs(30);

fn lab(prefix: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--prefix", prefix, "--run-dir"])
        .arg(run_dir())
        .args(args)
        .output()
        .expect("running quicsdn-lab")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(prefix: &str, args: &[&str]) -> String {
    let o = lab(prefix, args);
    assert!(
        o.status.success(),
        "quicsdn-lab {args:?} failed: {}",
        text(&o)
    );
    text(&o)
}

fn fails(prefix: &str, args: &[&str]) -> String {
    let o = lab(prefix, args);
    assert!(
        !o.status.success(),
        "quicsdn-lab {args:?} should fail: {}",
        text(&o)
    );
    text(&o)
}

#[test]
fn up_twice_down_twice_leaves_nothing() {
    let _s = serial();
    let p = "qsdnT3";
    let _g = LabGuard::new(p);
    let root_before = lab_like_root_interfaces();
    // The default transport (quic): OVS, the agents with their metrics, os-ken.
    let up = ["up", "--switches", "2", "--hosts-per-switch", "1"];

    let out = ok(p, &up);
    assert!(out.contains(&format!("lab {p} is up")), "{out}");
    let state = topology::load(&run_dir(), p)
        .unwrap()
        .expect("state recorded");
    assert!(state.complete);
    let procs = recorded_procs(&state);
    assert_eq!(
        procs.len(),
        8,
        "2 x (ovsdb-server, ovs-vswitchd) + controller + controller agent + 2 switch agents"
    );
    assert_eq!(state.metrics.len(), 3, "every agent's /metrics recorded");
    assert!(procs.iter().all(ProcRecord::is_alive));

    // Same settings again: nothing changes.
    let out = ok(p, &up);
    assert!(out.contains("already up"), "{out}");
    assert_eq!(topology::load(&run_dir(), p).unwrap().unwrap(), state);

    // Other settings while up: refused, lab untouched.
    let out = fails(p, &["up", "--switches", "3"]);
    assert!(out.contains("already up with other settings"), "{out}");
    assert!(procs.iter().all(ProcRecord::is_alive));

    // status, text and JSON.
    let out = ok(p, &["status"]);
    assert!(out.contains(&format!("lab {p}: up")), "{out}");
    assert_eq!(out.matches(" connected yes flows").count(), 2, "{out}");
    let json: serde_json::Value = serde_json::from_str(&ok(p, &["status", "--json"])).unwrap();
    assert_eq!(json["complete"], true);
    assert_eq!(json["switches"].as_array().unwrap().len(), 2);
    assert_eq!(json["switches"][0]["connected"], true);
    // The control link's forwarder counted the QUIC traffic it carried.
    let sw_to_ctl = &json["control_links"][0]["report"]["b_to_a"];
    assert!(
        sw_to_ctl["classes"]["quic"]["delivered"]["frames"]
            .as_u64()
            .unwrap()
            > 0,
        "no control traffic counted: {json}"
    );
    assert!(out.contains(&format!("link {p}-c1")), "{out}");
    agents_metrics_in_status(p, &out);

    let out = ok(p, &["down"]);
    assert!(out.contains("removed"), "{out}");
    let left = leftovers(p, &procs);
    assert!(left.is_empty(), "left behind: {left:#?}");
    let out = ok(p, &["down"]);
    assert!(out.contains("nothing to do"), "{out}");
    let out = ok(p, &["status"]);
    assert!(out.contains("no lab"), "{out}");
    assert_eq!(lab_like_root_interfaces(), root_before);
}

/// `status` scraped every agent's `/metrics` and `/healthz`: each switch's
/// agent is connected to the controller agent and OVS to it, and has carried
/// OpenFlow both ways; a ping between the hosts makes the counters grow
/// (PACKET_INs up, FLOW_MODs or PACKET_OUTs down).
fn agents_metrics_in_status(p: &str, text: &str) {
    assert_eq!(
        text.matches("agent: peer connected yes, OVS sessions openflow 1")
            .count(),
        2,
        "{text}"
    );
    let status =
        || -> serde_json::Value { serde_json::from_str(&ok(p, &["status", "--json"])).unwrap() };
    let agent = |json: &serde_json::Value, i: usize| -> serde_json::Value {
        let a = &json["switches"][i]["agent"];
        assert!(a["error"].is_null(), "sw{}: {a}", i + 1);
        a["metrics"].clone()
    };
    let count = |m: &serde_json::Value, dir: &str, field: &str| m[dir][field].as_u64().unwrap();
    let of =
        |m: &serde_json::Value, dir: &str, ty: &str| m[dir]["openflow"][ty].as_u64().unwrap_or(0);
    // `up` returned once OVS was connected; the agents' view may trail by a
    // moment (healthz counts OVS's session once its first bytes crossed).
    let json = poll_until("every agent ready", PATIENCE, || {
        let j = status();
        Ok((0..2).all(|i| agent(&j, i)["ready"] == true).then_some(j))
    })
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for i in 0..2 {
        let m = agent(&json, i);
        assert_eq!(m["connected_to_peer"], true, "{m}");
        assert_eq!(m["local_sessions"]["openflow"], 1, "{m}");
        for dir in ["to_controller", "to_switch"] {
            assert!(count(&m, dir, "messages") > 0, "{dir}: {m}");
            assert!(
                count(&m, dir, "bytes") >= 8 * count(&m, dir, "messages"),
                "{m}"
            );
        }
        assert_eq!(of(&m, "to_controller", "FEATURES_REPLY"), 1, "{m}");
        assert!(m["rtt_seconds"].as_f64().unwrap() > 0.0, "{m}");
        assert!(m["congestion_window_bytes"].as_u64().unwrap() > 1000, "{m}");
        assert_eq!(m["reconnects"], 0, "{m}");
        let expiry = m["certificate_expiry_timestamp_seconds"].as_f64().unwrap();
        assert!(expiry > now + 86_400.0, "{m}");
        assert!(
            m["peer_certificate_expiry_timestamp_seconds"]
                .as_f64()
                .unwrap()
                > now,
            "{m}"
        );
        assert!(m["seconds_since_connect"].as_f64().unwrap() >= 0.0, "{m}");
    }
    let ctl = &json["controller_agent"]["metrics"];
    assert_eq!(ctl["switches_connected"], 2, "{json}");

    // A ping from sw1's host to sw2's: os-ken learns through PACKET_INs.
    let before = agent(&json, 0);
    let h1 = quicsdn_lab::netns::Netns::named(topology::host_netns(p, 1, 1));
    let dst = topology::host_ip(2, 1).to_string();
    let stats = quicsdn_lab::host::ping(&h1, &dst, 3, 0.2).unwrap();
    assert!(stats.received > 0, "no ping got through: {stats:?}");
    poll_until("the ping counted in sw1's agent metrics", PATIENCE, || {
        let m = agent(&status(), 0);
        Ok(
            (of(&m, "to_controller", "PACKET_IN") > of(&before, "to_controller", "PACKET_IN")
                && count(&m, "to_controller", "messages")
                    > count(&before, "to_controller", "messages")
                && count(&m, "to_controller", "bytes") > count(&before, "to_controller", "bytes")
                && count(&m, "to_switch", "messages") > count(&before, "to_switch", "messages"))
            .then_some(()),
        )
    })
    .unwrap();
}

#[test]
fn refusals_are_clear_and_create_nothing() {
    let _s = serial();
    let p = "qsdnT4";
    let _g = LabGuard::new(p);
    let cases: &[(&[&str], &str)] = &[
        (&["up", "--transport", "tcp", "--loss", "1"], "%"),
        (&["up", "--transport", "tcp", "--loss", "101%"], "loss"),
        (&["up", "--transport", "tcp", "--delay", "25"], "unit"),
        (
            &["up", "--transport", "tcp", "--rate", "0bit"],
            "positive rate",
        ),
        (&["up", "--transport", "udp"], "unknown transport"),
        (&["up", "--controller", "pox"], "unknown controller"),
        (
            &["up", "--transport", "tcp", "--switches", "0"],
            "--switches",
        ),
        (
            &["up", "--transport", "tcp", "--switches", "251"],
            "--switches",
        ),
        (&["up", "--switches", "5", "--sdudp"], "--topology line"),
        (
            &["up", "--switches", "5", "--link-loss", "1%"],
            "--topology line",
        ),
        (
            &[
                "up",
                "--topology",
                "line",
                "--switches",
                "9",
                "--sdudp",
                "--engines",
                "2,9",
            ],
            "edges 1 and 9",
        ),
        (
            &[
                "up",
                "--topology",
                "line",
                "--switches",
                "5",
                "--sdudp",
                "--controller",
                "faucet",
            ],
            "os-ken",
        ),
        (&["up", "--topology", "ring"], "unknown topology"),
        (&["up", "--engines", "odd"], "--sdudp"),
    ];
    for (args, want) in cases {
        let out = fails(p, args);
        assert!(out.contains(want), "{args:?}: wanted {want:?} in: {out}");
        let left = leftovers(p, &[]);
        assert!(left.is_empty(), "{args:?} left: {left:#?}");
    }
    let out = fails("bad/prefix", &["up", "--transport", "tcp"]);
    assert!(out.contains("bad prefix"), "{out}");
}

/// Starts `up` and SIGKILLs it once the state records an OVS, hosts being
/// attached: a run that died half-way. Returns the state it left.
fn crash_up(p: &str) -> quicsdn_lab::state::LabState {
    let mut child = Command::new(BIN)
        .args(["--prefix", p, "--run-dir"])
        .arg(run_dir())
        .args(["up", "--switches", "3", "--hosts-per-switch", "4"])
        .args(["--transport", "tcp", "--controller", "none"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    poll_until("up to record a host", Duration::from_secs(30), || {
        Ok(topology::load(&run_dir(), p)
            .ok()
            .flatten()
            .filter(|s| s.namespaces.iter().any(|n| n.name.contains("-h"))))
    })
    .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let state = topology::load(&run_dir(), p).unwrap().unwrap();
    assert!(!state.complete, "up finished before it could be killed");
    assert!(!recorded_procs(&state).is_empty());
    state
}

#[test]
fn down_and_up_recover_from_a_crashed_up() {
    let _s = serial();
    let p = "qsdnT5";
    let _g = LabGuard::new(p);

    // A crashed run, then `down`: everything recorded goes.
    let state = crash_up(p);
    let procs = recorded_procs(&state);
    assert!(
        procs.iter().all(ProcRecord::is_alive),
        "OVS should outlive the killed `up`"
    );
    let out = ok(p, &["status"]);
    assert!(out.contains("incomplete"), "{out}");
    let out = ok(p, &["down"]);
    assert!(out.contains("removed"), "{out}");
    let left = leftovers(p, &procs);
    assert!(left.is_empty(), "left behind after a crashed up: {left:#?}");

    // A crashed run, then `up` again: the wreck is replaced by a working lab.
    let state = crash_up(p);
    let procs = recorded_procs(&state);
    let out = ok(
        p,
        &[
            "up",
            "--switches",
            "1",
            "--hosts-per-switch",
            "1",
            "--transport",
            "tcp",
            "--controller",
            "none",
        ],
    );
    assert!(out.contains("replaced the previous one"), "{out}");
    assert!(procs.iter().all(|p| !p.is_alive()), "old OVS still running");
    let new = topology::load(&run_dir(), p).unwrap().unwrap();
    assert!(new.complete);
    assert_eq!(new.switches.len(), 1);
    topology::check_health(&new).unwrap();
    let new_procs = recorded_procs(&new);
    ok(p, &["down"]);
    let left = leftovers(p, &new_procs);
    assert!(left.is_empty(), "left behind: {left:#?}");
}
