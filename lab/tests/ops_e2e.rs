//! Operating the agents with real parts: Open vSwitch 3.1 with two hosts, the
//! os-ken L2 learning app and both agents with `--metrics`. Each agent's
//! `/metrics` is scraped from inside its namespace and parsed by the Python
//! `prometheus_client` parsers (OpenMetrics and the classic text format,
//! Debian's python3-prometheus-client); the counters move as predicted by
//! what the test does: pings (packet-ins, flow-mods), a controller-agent
//! restart (one reconnect), a rebind (one migration). Then the switch's
//! certificate is rotated with SIGHUP: OVS's session stays, the next
//! connection presents the new certificate, a corrupt file changes nothing.
//! Needs root.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::osken_bed::{Bed, PATIENCE};
use common::*;
use quicsdn_lab::netns::Netns;
use quicsdn_lab::wait::poll_until;

const PREFIX: &str = "q16m";
/// Both agents serve metrics on this port of their own namespace's loopback.
const METRICS_PORT: u16 = 41600;

/// Fetches an agent's `/metrics` and `/healthz` inside namespace `ns` and
/// parses them with the real parsers; prints JSON.
const SCRAPE: &str = r#"
import json, sys, urllib.request, urllib.error
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as classic
base = sys.argv[1]
req = urllib.request.Request(base + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
with urllib.request.urlopen(req, timeout=10) as r:
    ctype = r.headers["Content-Type"]
    text = r.read().decode()
assert ctype.startswith("application/openmetrics-text"), ctype
samples = {}
for family in openmetrics(text):
    for s in family.samples:
        labels = ",".join('%s="%s"' % kv for kv in sorted(s.labels.items()))
        samples["%s{%s}" % (s.name, labels)] = s.value
with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
    classic_samples = sum(len(f.samples) for f in classic(r.read().decode()))
try:
    with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
        health = r.status
except urllib.error.HTTPError as e:
    health = e.code
print(json.dumps({"samples": samples, "classic_samples": classic_samples, "healthz": health}))
"#;

/// One scrape, parsed.
struct Scrape {
    samples: HashMap<String, f64>,
    classic_samples: usize,
    healthz: u16,
}

impl Scrape {
    /// A sample by name and labels (in any order); 0 if absent.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut l: Vec<_> = labels.to_vec();
        l.sort();
        let labels: Vec<String> = l.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        let key = format!("{name}{{{}}}", labels.join(","));
        self.samples.get(&key).copied().unwrap_or(0.0)
    }

    /// The sum of every sample of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(k, _)| {
                k.split_once('{').is_some_and(|(n, rest)| {
                    n == name
                        && labels
                            .iter()
                            .all(|(lk, lv)| rest.contains(&format!("{lk}=\"{lv}\"")))
                })
            })
            .map(|(_, v)| v)
            .sum()
    }
}

fn scrape(ns: &str) -> Scrape {
    let out = Netns::named(ns)
        .exec(&[
            "/usr/bin/python3",
            "-c",
            SCRAPE,
            &format!("http://127.0.0.1:{METRICS_PORT}"),
        ])
        .unwrap_or_else(|e| panic!("scraping the agent in {ns}: {e:#}"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    Scrape {
        samples: serde_json::from_value(v["samples"].clone()).unwrap(),
        classic_samples: v["classic_samples"].as_u64().unwrap() as usize,
        healthz: v["healthz"].as_u64().unwrap() as u16,
    }
}

fn sw_ns() -> String {
    format!("{PREFIX}-sw1")
}

fn ctl_ns() -> String {
    format!("{PREFIX}-ctl")
}

const SW: (&str, &str) = ("switch", "sw1");
const OF: (&str, &str) = ("service", "openflow");
const TO_CTL: (&str, &str) = ("direction", "to_controller");
const TO_SW: (&str, &str) = ("direction", "to_switch");

/// Waits until `f` holds for a fresh scrape of the agent in `ns`.
fn until(ns: &str, what: &str, f: impl Fn(&Scrape) -> bool) -> Scrape {
    poll_until(what, PATIENCE, || {
        let s = scrape(ns);
        Ok(f(&s).then_some(s))
    })
    .unwrap_or_else(|e| {
        let s = scrape(ns);
        let mut keys: Vec<_> = s.samples.iter().map(|(k, v)| format!("{k} {v}")).collect();
        keys.sort();
        panic!("{e:#}\n{}", keys.join("\n"))
    })
}

#[test]
fn metrics_of_real_ovs_and_os_ken_parse_and_move_as_predicted() {
    let _s = serial();
    require_root();
    let metrics = format!("--metrics=127.0.0.1:{METRICS_PORT}");
    let mut bed = Bed::up(PREFIX, Duration::from_millis(5), &[&metrics]);
    bed.ping_ok();

    // Both agents: connected, OpenFlow counted by type, both parsers agree
    // there is something to parse, the path is ready.
    let sw = until(&sw_ns(), "the switch agent ready", |s| s.healthz == 200);
    let ctl = until(&ctl_ns(), "the controller agent ready", |s| {
        s.healthz == 200
    });
    for s in [&sw, &ctl] {
        assert!(s.classic_samples > 20, "{}", s.classic_samples);
        assert_eq!(s.get("quicsdn_connected", &[SW]), 1.0);
        assert_eq!(s.get("quicsdn_sessions", &[SW, OF]), 1.0);
        assert!(
            s.get(
                "quicsdn_openflow_messages_total",
                &[SW, OF, TO_CTL, ("type", "PACKET_IN")]
            ) >= 1.0
        );
        assert!(
            s.get(
                "quicsdn_openflow_messages_total",
                &[SW, OF, TO_SW, ("type", "FLOW_MOD")]
            ) >= 1.0
        );
        assert!(
            s.get(
                "quicsdn_openflow_messages_total",
                &[SW, OF, TO_CTL, ("type", "FEATURES_REPLY")]
            ) == 1.0
        );
        assert!(
            s.get("quicsdn_quic_rtt_seconds", &[SW]) >= 0.010,
            "two 5 ms hops each way"
        );
        assert!(
            s.get(
                "quicsdn_certificate_expiry_timestamp_seconds",
                &[("certificate", "own")]
            ) > 1.7e9
        );
        assert!(s.get("process_resident_memory_bytes", &[]) > 1e6);
        assert!(s.samples.contains_key("process_cpu_seconds_total{}"));
    }

    // Messages and bytes: what the switch agent sent towards the controller
    // is what the controller agent delivered, message for message, and the
    // bytes are those of the messages (idle traffic is OVS's echo, which
    // both count alike; compare once they agree).
    let total = |s: &Scrape, dir| {
        (
            s.get("quicsdn_messages_total", &[SW, OF, dir]),
            s.get("quicsdn_payload_bytes_total", &[SW, OF, dir]),
        )
    };
    poll_until("both agents to agree on what crossed", PATIENCE, || {
        let (sw, ctl) = (scrape(&sw_ns()), scrape(&ctl_ns()));
        Ok(
            (total(&sw, TO_CTL) == total(&ctl, TO_CTL) && total(&sw, TO_SW) == total(&ctl, TO_SW))
                .then_some(()),
        )
    })
    .unwrap();

    // More pings through fresh flows: more packet-ins and flow-mods, more
    // messages and bytes, on both agents.
    let before = scrape(&sw_ns());
    bed.forget_learned_flows();
    bed.ping_through_fresh_flows();
    let after = until(&sw_ns(), "the new packet-ins counted", |s| {
        s.get(
            "quicsdn_openflow_messages_total",
            &[SW, OF, TO_SW, ("type", "FLOW_MOD")],
        ) > before.get(
            "quicsdn_openflow_messages_total",
            &[SW, OF, TO_SW, ("type", "FLOW_MOD")],
        )
    });
    for dir in [TO_CTL, TO_SW] {
        let (m0, b0) = total(&before, dir);
        let (m1, b1) = total(&after, dir);
        assert!(
            m1 > m0 && b1 >= b0 + 8.0 * (m1 - m0),
            "{dir:?}: {m0}/{b0} -> {m1}/{b1}"
        );
    }
    assert!(
        after.get(
            "quicsdn_openflow_messages_total",
            &[SW, OF, TO_CTL, ("type", "PACKET_IN")]
        ) > before.get(
            "quicsdn_openflow_messages_total",
            &[SW, OF, TO_CTL, ("type", "PACKET_IN")]
        )
    );
    assert_eq!(after.sum("quicsdn_connects_total", &[SW]), 1.0);
    assert_eq!(after.sum("quicsdn_disconnects_total", &[SW]), 0.0);

    // A controller-agent restart: the switch agent counts one disconnect (the
    // agent closed it on its way down) and one more connect; OVS's session
    // starts again on the new connection.
    bed.controller_agent
        .take()
        .unwrap()
        .terminate(PATIENCE)
        .unwrap();
    bed.start_controller_agent(2);
    // OVS opens its new session after its own reconnect backoff, some time
    // after the connection is back: wait for both, not just the connection.
    let sw = until(&sw_ns(), "the switch agent and OVS's session back", |s| {
        s.sum("quicsdn_connects_total", &[SW]) == 2.0
            && s.healthz == 200
            && s.get("quicsdn_sessions_opened_total", &[SW, OF]) >= 2.0
    });
    assert_eq!(
        sw.get(
            "quicsdn_disconnects_total",
            &[SW, ("reason", "closed_by_peer")]
        ),
        1.0
    );
    assert_eq!(sw.sum("quicsdn_disconnects_total", &[SW]), 1.0);
    assert_eq!(sw.get("quicsdn_connected", &[SW]), 1.0);
    assert_eq!(sw.get("quicsdn_sessions_opened_total", &[SW, OF]), 2.0);
    // The new controller agent counts from zero: one connection, OVS's new
    // session, and its handshake (FEATURES_REPLY once more).
    let features = [SW, OF, TO_CTL, ("type", "FEATURES_REPLY")];
    let ctl = until(&ctl_ns(), "the new controller agent's session", |s| {
        s.healthz == 200 && s.get("quicsdn_openflow_messages_total", &features) == 1.0
    });
    assert_eq!(ctl.sum("quicsdn_connects_total", &[SW]), 1.0);

    // A rebind (what a NAT rebinding does): the connection migrates; the
    // switch agent counts its move, the controller agent the new address.
    let sock = bed.switch_control();
    let answer = Netns::named(sw_ns())
        .exec(&[
            quicsdn_lab::agents::quicsdn_binary()
                .unwrap()
                .to_str()
                .unwrap(),
            "control",
            "--socket",
            sock.to_str().unwrap(),
            "rebind",
        ])
        .unwrap();
    assert!(answer.contains("local_addr"), "{answer}");
    until(&sw_ns(), "the switch agent's migration", |s| {
        s.get("quicsdn_migrations_total", &[SW]) == 1.0
    });
    // Traffic makes the move visible to the controller agent.
    bed.ping_ok();
    let ctl = until(&ctl_ns(), "the controller agent's migration", |s| {
        s.get("quicsdn_migrations_total", &[SW]) == 1.0
    });
    assert_eq!(
        ctl.sum("quicsdn_connects_total", &[SW]),
        1.0,
        "no reconnect"
    );
    assert_eq!(ctl.sum("quicsdn_handshake_refusals_total", &[]), 0.0);

    rotate_the_switch_certificate(&mut bed);
}

/// Certificate rotation with real OVS: the switch agent's certificate and
/// key are replaced (a new serial) and SIGHUP sent. OVS's OpenFlow session
/// stays up (its log shows no new connection), and so does the QUIC
/// connection; the next connection (the controller agent restarts)
/// presents the new certificate, as its log and metrics show. A corrupt
/// certificate file is refused and changes nothing.
fn rotate_the_switch_certificate(bed: &mut Bed) {
    let pki = bed.dir.join("pki");
    let (cert_file, key_file) = quicsdn_transport::pki::cert_paths(&pki, "sw1");
    let old = serial_of(&std::fs::read(&cert_file).unwrap());
    let switch_agent = bed
        .procs
        .iter()
        .find(|p| p.name.contains("switch agent"))
        .unwrap()
        .clone();
    let ovs_sessions = bed.ovs_connections();
    let sw0 = scrape(&sw_ns());
    let get_own = |s: &Scrape, serial: &str| {
        s.get(
            "quicsdn_certificate",
            &[("identity", "sw1"), ("serial", serial)],
        )
    };
    assert_eq!(get_own(&sw0, &old), 1.0);

    // Replace both files, each atomically, as `install` or certbot do.
    let (cert, key) = quicsdn_transport::pki::issue_pem(
        &pki,
        "sw1",
        &[],
        quicsdn_transport::pki::Validity::days(1),
    )
    .unwrap();
    let new = serial_of(cert.as_bytes());
    assert_ne!(new, old);
    replace(&key_file, key.as_bytes());
    replace(&cert_file, cert.as_bytes());
    switch_agent.hangup();
    let sw = until(&sw_ns(), "the new certificate in use", |s| {
        get_own(s, &new) == 1.0
    });
    assert_eq!(get_own(&sw, &old), 0.0);
    assert_eq!(
        sw.get(
            "quicsdn_certificate_reloads_total",
            &[("result", "success")]
        ),
        1.0
    );
    let log = std::fs::read_to_string(bed.dir.join("switch-agent.log")).unwrap();
    assert!(
        log.contains(&format!(
            "on request (SIGHUP); new handshakes present certificate serial {new}"
        )),
        "{log}"
    );
    // Nothing reconnected: not OVS, not the QUIC connection; OpenFlow works.
    bed.forget_learned_flows();
    bed.ping_through_fresh_flows();
    assert_eq!(bed.ovs_connections(), ovs_sessions, "OVS reconnected");
    let sw = scrape(&sw_ns());
    assert_eq!(
        sw.sum("quicsdn_connects_total", &[SW]),
        sw0.sum("quicsdn_connects_total", &[SW])
    );
    assert_eq!(sw.get("quicsdn_connected", &[SW]), 1.0);

    // A corrupt certificate file: refused, nothing changes.
    replace(
        &cert_file,
        b"-----BEGIN CERTIFICATE-----\nMIIB this is not a certificate\n-----END CERTIFICATE-----\n",
    );
    switch_agent.hangup();
    let sw = until(&sw_ns(), "the corrupt file refused", |s| {
        s.get(
            "quicsdn_certificate_reloads_total",
            &[("result", "failure")],
        ) == 1.0
    });
    assert_eq!(get_own(&sw, &new), 1.0, "the certificate in use stays");
    assert_eq!(sw.get("quicsdn_connected", &[SW]), 1.0);
    let log = std::fs::read_to_string(bed.dir.join("switch-agent.log")).unwrap();
    assert!(
        log.contains("refused the new certificate files read on request (SIGHUP)")
            && log.contains(&cert_file.display().to_string()),
        "{log}"
    );
    bed.ping_ok();
    assert_eq!(bed.ovs_connections(), ovs_sessions, "OVS reconnected");

    // The next connection presents the new certificate (a full handshake:
    // the rotation dropped the tickets, which carry the old one).
    bed.controller_agent
        .take()
        .unwrap()
        .terminate(PATIENCE)
        .unwrap();
    bed.start_controller_agent(3);
    let peer = [SW, ("serial", new.as_str())];
    let ctl = until(
        &ctl_ns(),
        "the new certificate at the controller agent",
        |s| s.healthz == 200 && s.get("quicsdn_peer_certificate", &peer) == 1.0,
    );
    assert_eq!(
        ctl.get("quicsdn_peer_certificate", &[SW, ("serial", old.as_str())]),
        0.0
    );
    let log = std::fs::read_to_string(bed.controller_log(3)).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("switch agent connected") && l.contains(&format!("serial={new}"))),
        "{log}"
    );
    bed.ping_ok();
}

/// The serial of the first certificate in PEM `pem`.
fn serial_of(pem: &[u8]) -> String {
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(pem).unwrap();
    quicsdn_transport::identity::parse(&der).unwrap().serial
}

/// Replaces `path` at once (a new file renamed over it).
fn replace(path: &std::path::Path, data: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `quicsdn snoop` run as the real CLI against the switch agent's control
/// socket, with real OVS and os-ken: it prints the FLOW_MOD os-ken sends for
/// a learned flow, decoded, and its `--pcap` decodes as OpenFlow in tshark
/// and in `ovs-ofctl ofp-parse-pcap`.
#[test]
fn snoop_decodes_os_kens_flow_mods_and_its_pcap_reads_in_tshark_and_ovs_ofctl() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    let _s = serial();
    require_root();
    let bed = Bed::up("q19", Duration::from_millis(2), &[]);
    let quicsdn = quicsdn_lab::agents::quicsdn_binary().unwrap();

    // The controller agent says which switches there are when asked for one
    // that is not.
    let wrong = Command::new(&quicsdn)
        .args(["snoop", "--socket"])
        .arg(bed.controller_control())
        .args(["--switch", "sw9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && err.contains("\"sw9\"") && err.contains("sw1"),
        "{err}"
    );

    let pcap = bed.dir.join("snoop.pcap");
    let mut snoop = Command::new(&quicsdn)
        .args(["snoop", "--socket"])
        .arg(bed.switch_control())
        .arg("--pcap")
        .arg(&pcap)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = snoop.id();
    // The attach line comes once the agent has accepted the snoop.
    let mut stderr = BufReader::new(snoop.stderr.take().unwrap());
    let mut attached = String::new();
    stderr.read_line(&mut attached).unwrap();
    assert!(
        attached.contains("snooping on switch sw1 service openflow (openflow)"),
        "{attached}"
    );
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = BufReader::new(snoop.stdout.take().unwrap());
    let reader = std::thread::spawn(move || {
        for l in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });

    // Fresh packet-ins: os-ken answers with the learned flows.
    bed.forget_learned_flows();
    bed.ping_through_fresh_flows();
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + PATIENCE;
    let flow_mod = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no learned FLOW_MOD in:\n{}", seen.join("\n")));
        if line.contains("FLOW_MOD") && line.contains("eth_dst=02:51:00:00:00:02") {
            break line;
        }
        seen.push(line);
    };
    // The learned flow, as controllers/l2_learning.py sends it: h1 (port 1)
    // to h2, priority 10, idle 60 s, OXM fields in field order.
    for field in [
        " to_switch lane=",
        " stream=",
        "FLOW_MOD OF1.3 xid=0x",
        " cmd=ADD table=0 priority=10 cookie=0x0 idle_timeout=60 hard_timeout=0 buffer=none",
        " match=in_port=1,eth_dst=02:51:00:00:00:02,eth_src=02:51:00:00:00:01",
    ] {
        assert!(flow_mod.contains(field), "{field:?} not in {flow_mod}");
    }
    assert!(
        seen.iter().any(|l| l.contains(" to_controller ")
            && l.contains("PACKET_IN OF1.3")
            && l.contains("reason=NO_MATCH")),
        "{}",
        seen.join("\n")
    );

    // Ctrl-C: snoop closes its connections in the capture and exits cleanly.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0);
    let status = snoop.wait().unwrap();
    assert!(status.success(), "{status}");
    reader.join().unwrap();
    let pcap = pcap.to_str().unwrap();
    let tshark = Command::new("tshark")
        .args(["-r", pcap, "-Y", "openflow_v4.type == 14", "-T", "fields"])
        .args([
            "-e",
            "openflow_v4.flowmod.priority",
            "-e",
            "openflow_v4.flowmod.idle_timeout",
        ])
        .output()
        .unwrap();
    let rows = String::from_utf8_lossy(&tshark.stdout);
    assert!(
        tshark.status.success(),
        "{}",
        String::from_utf8_lossy(&tshark.stderr)
    );
    assert!(
        rows.lines()
            .any(|r| r.split_whitespace().collect::<Vec<_>>() == ["10", "60"]),
        "tshark found no learned flow mod:\n{rows}"
    );
    let parsed = Command::new("ovs-ofctl")
        .args(["ofp-parse-pcap", pcap])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&parsed.stdout);
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    assert!(
        text.lines().any(|l| l.contains("OFPT_FLOW_MOD")
            && l.contains("priority=10")
            && l.contains("dl_dst=02:51:00:00:00:02")),
        "ovs-ofctl ofp-parse-pcap:\n{text}"
    );

    // `--keylog`: the secrets of the next handshake (a controller-agent
    // restart makes one) let tshark decrypt a capture of the QUIC packets.
    let mut bed = bed;
    let quic_pcap = bed.dir.join("quic.pcap");
    let mut tcpdump = Command::new("ip")
        .args([
            "netns",
            "exec",
            "q19-sw1",
            "tcpdump",
            "-i",
            "any",
            "--immediate-mode",
            "-U",
            "-w",
        ])
        .arg(&quic_pcap)
        .arg("udp")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until tcpdump ends (it reports on stderr when it stops).
    let mut tcpdump_err = BufReader::new(tcpdump.stderr.take().unwrap());
    let mut listening = String::new();
    while !listening.contains("listening on") {
        listening.clear();
        assert!(
            tcpdump_err.read_line(&mut listening).unwrap() > 0,
            "tcpdump ended"
        );
    }
    let keys = bed.dir.join("keys.log");
    let mut snoop = Command::new(&quicsdn)
        .args(["snoop", "--follow", "--socket"])
        .arg(bed.switch_control())
        .arg("--keylog")
        .arg(&keys)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(snoop.stderr.take().unwrap());
    let mut attached = String::new();
    while !attached.contains("snooping on") {
        attached.clear();
        assert!(stderr.read_line(&mut attached).unwrap() > 0, "snoop ended");
    }
    let status = control_status(&bed.switch_control());
    assert!(
        status["keylog"]
            .as_str()
            .is_some_and(|k| k.contains("WARNING") && k.contains("snoop client")),
        "{status}"
    );
    bed.controller_agent
        .take()
        .unwrap()
        .terminate(PATIENCE)
        .unwrap();
    bed.start_controller_agent(2);
    bed.ping_ok();
    quicsdn_lab::wait::poll_until("the new handshake's secrets", PATIENCE, || {
        let k = std::fs::read_to_string(&keys).unwrap_or_default();
        Ok(
            (k.contains("CLIENT_TRAFFIC_SECRET_0 ") && k.contains("SERVER_TRAFFIC_SECRET_0 "))
                .then_some(()),
        )
    })
    .unwrap();
    // The new connection's packets are in the capture (its first flight
    // alone is over 1200 bytes: RFC 9000 §14.1) before tcpdump stops.
    quicsdn_lab::wait::poll_until("the QUIC packets captured", PATIENCE, || {
        let len = std::fs::metadata(&quic_pcap).map_or(0, |m| m.len());
        Ok((len > 4096).then_some(()))
    })
    .unwrap();
    for child in [&mut snoop, &mut tcpdump] {
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        assert!(child.wait().unwrap().success());
    }
    let stream_frames = |keylog: Option<&std::path::Path>| {
        let mut cmd = Command::new("tshark");
        cmd.arg("-r").arg(&quic_pcap);
        if let Some(k) = keylog {
            cmd.arg("-o")
                .arg(format!("tls.keylog_file:{}", k.display()));
        }
        let out = cmd
            .args([
                "-Y",
                "quic.stream.stream_id",
                "-T",
                "fields",
                "-e",
                "frame.number",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert_eq!(
        stream_frames(None),
        0,
        "STREAM frames visible without the keys"
    );
    assert!(
        stream_frames(Some(&keys)) > 0,
        "tshark decrypted nothing with {}",
        keys.display()
    );
    drop((tcpdump_err, stderr));
}
