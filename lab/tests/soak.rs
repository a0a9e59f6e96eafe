//! `quicsdn-lab bench soak --quick`: real Open vSwitch and os-ken through the
//! agents, sequence-stamped OpenFlow both ways, and each fault kind once (a
//! 30 % loss burst, the control link down for 10 s, kill -9 of the switch
//! agent and of the controller agent, a controller restart, an OVS restart, a
//! NAT rebinding). Asserts the audit: no message lost inside a session,
//! duplicated, reordered or invented, the final flow table as the controller
//! believes it, every fault injected and recovered from, and the result files.
//! (The long run: docs/results/soak/.)
//!
//! Needs root, Open vSwitch, os-ken's venv and the `quicsdn` binary of the same
//! profile (`cargo build --workspace --bins`). The namespaces' prefix is
//! `qsdnSK`, or `$QUICSDN_SOAK_TEST_PREFIX`.

mod common;

use quicsdn_lab::bench::out::Csv;
use quicsdn_lab::bench::soak::{self, AUDIT_HEADER, FAULT_KINDS, FAULTS_HEADER, SoakArgs};

#[test]
fn soak_quick_every_fault_is_survived_without_an_audit_violation() {
    common::require_root();
    let _s = common::serial();
    let out = tempfile::tempdir().unwrap();
    let report = soak::run(SoakArgs {
        minutes: 0.0,
        quick: true,
        out: out.path().to_path_buf(),
        prefix: std::env::var("QUICSDN_SOAK_TEST_PREFIX").unwrap_or_else(|_| "qsdnSK".into()),
        nat_port: 40100,
        keep_logs: false,
    })
    .expect("the quick soak");

    assert_eq!(report.violations(), 0, "{}", soak::render_tables(&report));
    assert!(report.flow_table_mismatches.is_empty());
    assert!(report.flows_believed > 1, "the table-miss flow and slots");
    for kind in FAULT_KINDS {
        let of_kind: Vec<_> = report
            .injections
            .iter()
            .filter(|i| i.kind == kind)
            .collect();
        assert_eq!(of_kind.len(), 1, "{kind:?} injected once");
        assert!(of_kind[0].recovered_ns.is_some(), "{kind:?} recovered");
    }
    // Every stream carried messages, and most arrived.
    for a in &report.audits {
        assert!(a.sent > 5, "{a:?}");
        assert!(a.delivered * 2 > a.sent, "{a:?}");
    }
    // Faults that end sessions did: OVS and the controller saw new ones.
    assert!(report.ovs_sessions >= 4, "{}", report.ovs_sessions);
    assert!(
        report.controller_sessions >= 4,
        "{}",
        report.controller_sessions
    );
    assert_eq!(report.ovs_log_lines_dropped, 0);

    let audit = Csv::read(&out.path().join("audit.csv"), AUDIT_HEADER).unwrap();
    assert_eq!(audit.rows.len(), 6);
    let faults = Csv::read(&out.path().join("faults.csv"), FAULTS_HEADER).unwrap();
    assert_eq!(faults.rows.len(), FAULT_KINDS.len());
    let md = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(md.contains("Injection log"), "{md}");
}
