//! `--qlog-dir`: one qlog file per QUIC connection, named by the switch, in
//! the JSON-SEQ format qvis reads (RFC 7464 records: 0x1E, JSON, newline).
//! (`QLOGDIR` is checked on the binary: crates/cli/tests/qlogdir.rs.)

mod support;

use support::*;

/// The JSON records of a `.sqlog` file; panics on anything that is not one.
fn records(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split('\u{1e}')
        .filter(|r| !r.trim().is_empty())
        .map(|r| {
            serde_json::from_str(r.trim_end())
                .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {r}", path.display()))
        })
        .collect()
}

#[tokio::test]
async fn each_connection_writes_a_qlog_named_by_its_switch() {
    let dir = tempfile::tempdir().unwrap();
    let (sw_dir, ctl_dir) = (dir.path().join("sw"), dir.path().join("ctl"));
    let setup = OneService::start("openflow", |c, s| {
        c.common.qlog = Some(quicsdn_transport::quic::Qlog {
            dir: ctl_dir.clone(),
        });
        s.common.qlog = Some(quicsdn_transport::quic::Qlog {
            dir: sw_dir.clone(),
        });
    })
    .await;
    let (ovs, ctl) = setup.connect().await;
    let (mut ovs_r, mut ovs_w) = ovs.into_split();
    let (mut ctl_r, mut ctl_w) = ctl.into_split();
    let msgs = openflow_messages(3, 50);
    send_all(&mut ovs_w, &msgs).await;
    send_all(&mut ctl_w, &msgs).await;
    let len = msgs.iter().map(Vec::len).sum();
    read_exact_len(&mut ctl_r, len).await;
    read_exact_len(&mut ovs_r, len).await;
    // A second switch, idle, writing into the same directory: one more file
    // on each side, named by its own identity.
    let mut sw2 = switch_config(
        setup.pki.issue("sw2"),
        setup.controller.local_addr().unwrap(),
        &["openflow=ptcp:0".to_string()],
    );
    sw2.common.qlog = Some(quicsdn_transport::quic::Qlog {
        dir: sw_dir.clone(),
    });
    let sw2 = quicsdn_agent::SwitchAgent::start(sw2).await.unwrap();
    assert!(sw2.wait_connected(PATIENCE).await);
    sw2.shutdown().await;
    setup.shutdown().await;

    for (dir, role) in [(&sw_dir, "switch"), (&ctl_dir, "controller")] {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert_eq!(files.len(), 2, "{role}: {files:?}");
        for (file, switch) in files.iter().zip(["sw1", "sw2"]) {
            let name = file.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                name.starts_with(&format!("{switch}-"))
                    && name.ends_with(&format!("-{role}.sqlog")),
                "{name}"
            );
            let recs = records(file);
            assert!(recs[0]["qlog_format"] == "JSON-SEQ", "{}", recs[0]);
            let count = |event: &str| recs.iter().filter(|r| r["name"] == event).count();
            // sw1's connection carried 100 messages, sw2's only its handshake.
            let least = if switch == "sw1" { 10 } else { 0 };
            assert!(
                count("transport:packet_sent") > least,
                "{role} {switch}: {recs:?}"
            );
            assert!(
                count("transport:packet_received") > least,
                "{role} {switch}"
            );
        }
    }
}
