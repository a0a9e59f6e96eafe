//! `quicsdn pki import` of certificates made by Open vSwitch's own `ovs-pki`
//! (in a temporary directory): both agents run with the imported files,
//! each trusting the other end's CA as OVS does, and connect; a certificate
//! for the wrong role, or a name ovs-pki made unique with a UUID, is refused
//! with the reason.

mod support;

use quicsdn_agent::{ControllerAgent, SwitchAgent};
use quicsdn_transport::ovs_pki::{AgentRole, import};
use std::path::Path;
use std::process::Command;
use support::*;

fn ovs_pki(dir: &Path, args: &[&str]) {
    let out = Command::new("ovs-pki")
        .arg(format!("--dir={}", dir.join("pki").display()))
        .arg("--batch")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("ovs-pki (Debian's openvswitch-common) is needed");
    assert!(out.status.success(), "ovs-pki {args:?}: {out:?}");
}

#[tokio::test]
async fn agents_run_with_certificates_imported_from_ovs_pki() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    ovs_pki(d, &["init"]);
    ovs_pki(d, &["-u", "req+sign", "sw1", "switch"]);
    ovs_pki(d, &["-u", "req+sign", "ctl", "controller"]);
    ovs_pki(d, &["req+sign", "sw2", "switch"]);
    let pki = d.join("pki");

    // The wrong role: a switch certificate is not a controller's.
    let e = import(&pki, d, "sw1", AgentRole::Controller, &d.join("bad")).unwrap_err();
    assert!(e.to_string().contains("controllerca"), "{e}");
    // A switch named with a UUID: imported, with a warning.
    let sw2 = import(&pki, d, "sw2", AgentRole::Switch, &d.join("sw2")).unwrap();
    assert!(sw2.identity.starts_with("sw2 id:"), "{}", sw2.identity);
    assert_eq!(sw2.warnings.len(), 1);

    let sw = import(&pki, d, "sw1", AgentRole::Switch, &d.join("sw")).unwrap();
    let ctl = import(&pki, d, "ctl", AgentRole::Controller, &d.join("ctl")).unwrap();
    assert_eq!(
        (sw.identity.as_str(), ctl.identity.as_str()),
        ("sw1", "ctl")
    );
    // Each end trusts the other's CA, as OVS's set-ssl does.
    assert_eq!(
        std::fs::read(&sw.files.ca).unwrap(),
        std::fs::read(pki.join("controllerca/cacert.pem")).unwrap()
    );
    assert_eq!(
        std::fs::read(&ctl.files.ca).unwrap(),
        std::fs::read(pki.join("switchca/cacert.pem")).unwrap()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&sw.files.key)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Nothing is overwritten.
    assert!(import(&pki, d, "sw1", AgentRole::Switch, &d.join("sw")).is_err());

    let fake = FakeController::new().await;
    let mut ccfg = controller_config(&Pki::new(), &[format!("openflow={}", fake.target())]);
    ccfg.common.tls = ctl.files.clone();
    let controller = ControllerAgent::start(ccfg).await.unwrap();
    let agent = SwitchAgent::start(switch_config(
        sw.files.clone(),
        controller.local_addr().unwrap(),
        &["openflow=ptcp:0".into()],
    ))
    .await
    .unwrap();
    assert!(agent.wait_connected(PATIENCE).await);
    assert_eq!(controller.switches().await, vec!["sw1".to_string()]);
    agent.shutdown().await;
    controller.shutdown().await;
}
