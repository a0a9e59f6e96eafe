//! Certificate rotation on loopback, without SIGHUP: the switch agent's files
//! are a Kubernetes-style secret volume (`cert.pem -> ..data/cert.pem`,
//! `..data` swapped to a new directory at once). The agent notices the swap
//! by itself, keeps its connection and OVS's session, and its next
//! connection presents the new certificate; a corrupt version is refused and
//! changes nothing. (lab/tests/ops_e2e.rs does the same with SIGHUP, real OVS
//! and os-ken.)

mod support;

use quicsdn_agent::ControllerAgent;
use quicsdn_transport::pki::{Validity, issue_pem};
use quicsdn_transport::tls::TlsFiles;
use quicsdn_wire::openflow::build;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;

/// One sample of an agent's metrics (OpenMetrics text), 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Waits until `f` holds for the metrics `encode` returns.
async fn until(what: &str, encode: impl Fn() -> String, f: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = encode();
        if f(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A new certificate for `name` from the test CA, written as `dir/..NAME/`.
fn version(pki: &Pki, dir: &Path, version: &str, name: &str) -> String {
    let ca = std::fs::read_to_string(pki.path().join("ca.crt")).unwrap();
    let (cert, key) = issue_pem(pki.path(), name, &[], Validity::days(1)).unwrap();
    let v = dir.join(version);
    std::fs::create_dir(&v).unwrap();
    std::fs::write(v.join("ca.pem"), &ca).unwrap();
    std::fs::write(v.join("cert.pem"), &cert).unwrap();
    std::fs::write(v.join("key.pem"), &key).unwrap();
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(cert.as_bytes()).unwrap();
    quicsdn_transport::identity::parse(&der).unwrap().serial
}

/// Points `..data` at `to` at once (a rename over the old symlink).
fn swap(dir: &Path, to: &str) {
    symlink(to, dir.join("..data.tmp")).unwrap();
    std::fs::rename(dir.join("..data.tmp"), dir.join("..data")).unwrap();
}

#[tokio::test]
async fn a_symlink_swap_rotates_the_switch_certificate_without_dropping_the_session() {
    let pki = Pki::new();
    let vol = tempfile::tempdir().unwrap();
    let d = vol.path();
    let first = version(&pki, d, "..v1", "sw1");
    symlink("..v1", d.join("..data")).unwrap();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        symlink(format!("..data/{f}"), d.join(f)).unwrap();
    }
    let tls = TlsFiles {
        ca: d.join("ca.pem"),
        cert: d.join("cert.pem"),
        key: d.join("key.pem"),
    };
    let fake = FakeController::new().await;
    let mut ccfg = controller_config(&pki, &[format!("openflow={}", fake.target())]);
    let controller = ControllerAgent::start(ccfg.clone()).await.unwrap();
    let listen = controller.local_addr().unwrap();
    let mut scfg = switch_config(tls, listen, &["openflow=ptcp:0".into()]);
    scfg.common.quic.cert_poll = Some(Duration::from_millis(25));
    let agent = quicsdn_agent::SwitchAgent::start(scfg).await.unwrap();
    assert!(agent.wait_connected(PATIENCE).await);
    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&build::hello(1)).await.unwrap();
    let mut ctl = fake.accept().await;
    assert_eq!(read_exact_len(&mut ctl, 8).await, build::hello(1));
    let sw_metrics = || agent.metrics().encode(true);
    let peer =
        |serial: &str| format!("quicsdn_peer_certificate{{switch=\"sw1\",serial=\"{serial}\"}}");
    assert_eq!(
        sample(&controller.metrics().encode(true), &peer(&first)),
        1.0
    );

    // The new version appears, then `..data` swaps to it.
    let second = version(&pki, d, "..v2", "sw1");
    assert_ne!(first, second);
    swap(d, "..v2");
    let own = |serial: &str| format!("quicsdn_certificate{{identity=\"sw1\",serial=\"{serial}\"}}");
    let text = until("the swap noticed", sw_metrics, |t| {
        sample(t, &own(&second)) == 1.0
    })
    .await;
    assert_eq!(
        sample(
            &text,
            "quicsdn_certificate_reloads_total{result=\"success\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(&text, &own(&first)),
        0.0,
        "one series per certificate in use"
    );
    // The connection and OVS's session stay: what OVS sends still arrives,
    // on the same session, and nobody reconnected.
    ovs.write_all(&build::echo_request(2, b"after"))
        .await
        .unwrap();
    assert_eq!(
        read_exact_len(&mut ctl, 13).await,
        build::echo_request(2, b"after")
    );
    let text = sw_metrics();
    assert_eq!(
        sample(
            &text,
            "quicsdn_connects_total{switch=\"sw1\",handshake=\"full\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "quicsdn_disconnects_total{switch=\"sw1\",reason=\"closed_by_peer\"}"
        ),
        0.0
    );

    // A corrupt version: refused, the certificate in use stays.
    std::fs::create_dir(d.join("..v3")).unwrap();
    for f in ["ca.pem", "key.pem"] {
        std::fs::copy(d.join("..v2").join(f), d.join("..v3").join(f)).unwrap();
    }
    std::fs::write(
        d.join("..v3/cert.pem"),
        "-----BEGIN CERTIFICATE-----\ngarbage\n",
    )
    .unwrap();
    swap(d, "..v3");
    let text = until("the corrupt version refused", sw_metrics, |t| {
        sample(t, "quicsdn_certificate_reloads_total{result=\"failure\"}") == 1.0
    })
    .await;
    assert_eq!(sample(&text, &own(&second)), 1.0);
    assert!(agent.is_connected());

    // The next connection (the controller agent restarts on its address)
    // is a full handshake presenting the new certificate: a resumed session
    // would carry the old one.
    controller.shutdown().await;
    ccfg.listen = listen;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let controller = loop {
        match ControllerAgent::start(ccfg.clone()).await {
            Ok(c) => break c,
            // The old socket may take a moment to be released.
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("in use"), "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let text = until(
        "the new connection",
        || controller.metrics().encode(true),
        |t| sample(t, &peer(&second)) == 1.0,
    )
    .await;
    assert_eq!(sample(&text, &peer(&first)), 0.0);
    agent.shutdown().await;
    controller.shutdown().await;
}

/// The controller agent, rotated on request (what SIGHUP does): switches
/// connected stay, the next switch agent to connect sees the new
/// certificate, and a key that does not match is refused.
#[tokio::test]
async fn a_reload_rotates_the_controller_certificate_for_new_handshakes() {
    use quicsdn_transport::rotation::Reloaded;
    let setup = OneService::start("openflow", |c, _| c.common.quic.cert_poll = None).await;
    let ctl_files = setup.pki.files("ctl");
    let first = quicsdn_transport::tls::Credentials::load(&ctl_files)
        .unwrap()
        .serial;
    let (cert, key) = issue_pem(setup.pki.path(), "ctl", &[], Validity::days(1)).unwrap();
    // A mismatched pair first: the new certificate with the old key.
    std::fs::write(&ctl_files.cert, &cert).unwrap();
    let e = setup
        .controller
        .reload_credentials()
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        e.to_string().contains("ctl.crt") && e.to_string().contains("ctl.key"),
        "{e}"
    );
    std::fs::write(&ctl_files.key, &key).unwrap();
    let second = match setup
        .controller
        .reload_credentials()
        .await
        .unwrap()
        .unwrap()
    {
        Reloaded::Replaced { serial, previous } => {
            assert_eq!(previous, first);
            serial
        }
        other => panic!("{other:?}"),
    };
    let text = setup.controller.metrics().encode(true);
    assert_eq!(
        sample(
            &text,
            "quicsdn_certificate_reloads_total{result=\"failure\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("quicsdn_certificate{{identity=\"ctl\",serial=\"{second}\"}}")
        ),
        1.0
    );
    // The connected switch stays; it still sees the certificate of its handshake.
    assert!(setup.agent.is_connected());
    let peer =
        |serial: &str| format!("quicsdn_peer_certificate{{switch=\"sw1\",serial=\"{serial}\"}}");
    assert_eq!(
        sample(&setup.agent.metrics().encode(true), &peer(&first)),
        1.0
    );
    // A new switch agent's handshake gets the new one.
    let other = quicsdn_agent::SwitchAgent::start(switch_config(
        setup.pki.issue("sw2"),
        setup.controller.local_addr().unwrap(),
        &["openflow=ptcp:0".into()],
    ))
    .await
    .unwrap();
    assert!(other.wait_connected(PATIENCE).await);
    let peer2 = format!("quicsdn_peer_certificate{{switch=\"sw2\",serial=\"{second}\"}}");
    until(
        "sw2's view",
        || other.metrics().encode(true),
        |t| sample(t, &peer2) == 1.0,
    )
    .await;
    assert!(setup.agent.is_connected());
    other.shutdown().await;
    setup.shutdown().await;
}
