//! The operators' packaging: the systemd units pass `systemd-analyze verify`,
//! `quicsdn check-config` accepts the sample configurations (given real
//! certificates) and explains what is wrong with a broken one, and
//! `scripts/build-deb` builds a package holding the binary, the units and the
//! sample configuration.

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;

use support::BIN;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(c: &mut Command) -> (bool, String) {
    let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_units_pass_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    for unit in ["quicsdn-switch.service", "quicsdn-controller.service"] {
        let text = std::fs::read_to_string(repo().join("packaging/systemd").join(unit)).unwrap();
        assert!(text.contains("Type=notify") && text.contains("WatchdogSec="));
        // verify checks that the binary exists: point it at the one just built.
        let text = text.replace("/usr/bin/quicsdn", BIN);
        std::fs::write(dir.path().join(unit), text).unwrap();
    }
    let switch = std::fs::read_to_string(dir.path().join("quicsdn-switch.service")).unwrap();
    assert!(switch.contains("After=network-online.target openvswitch-switch.service"));
    let (ok, out) = run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("quicsdn-switch.service"))
        .arg(dir.path().join("quicsdn-controller.service")));
    assert!(ok, "{out}");
    // verify reports problems it does not fail on (unknown directives) as warnings.
    assert!(
        !out.contains("Unknown key") && !out.contains("Unknown section"),
        "{out}"
    );
}

#[test]
fn check_config_accepts_the_samples_and_explains_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let pki = support::pki(dir.path(), &["sw1", "ctl"]);
    for (sample, role, identity) in [
        ("switch.toml", "switch", "sw1"),
        ("controller.toml", "controller", "ctl"),
    ] {
        let text = std::fs::read_to_string(repo().join("packaging/etc").join(sample)).unwrap();
        let text = text.replace("/etc/quicsdn/pki", pki.to_str().unwrap());
        let file = dir.path().join(sample);
        std::fs::write(&file, text).unwrap();
        let (ok, out) = run(Command::new(BIN).arg("check-config").arg(&file));
        assert!(ok, "{out}");
        assert!(out.contains(&format!("{role} agent")), "{out}");
        assert!(out.contains(&format!("identity \"{identity}\"")), "{out}");
        assert!(out.trim_end().ends_with("OK"), "{out}");
    }
    // Mistakes, each said plainly: a missing key file, an unknown setting, a
    // grace period OVS would not tolerate.
    let switch = std::fs::read_to_string(dir.path().join("switch.toml")).unwrap();
    for (change, words) in [
        (switch.replace("sw1.key", "missing.key"), "missing.key"),
        (format!("{switch}\nbogus = 1\n"), "unknown field `bogus`"),
        (format!("{switch}\ngrace = \"20s\"\n"), "fail-mode timeout"),
    ] {
        let file = dir.path().join("broken.toml");
        std::fs::write(&file, change).unwrap();
        let (ok, out) = run(Command::new(BIN).arg("check-config").arg(&file));
        assert!(!ok && out.contains(words), "{words}: {out}");
    }
}

#[test]
fn build_deb_packages_the_binary_units_and_sample_configuration() {
    let out = tempfile::tempdir().unwrap();
    let (ok, text) = run(Command::new(repo().join("scripts/build-deb"))
        .args(["--fast", "--binary", BIN, "--out"])
        .arg(out.path()));
    assert!(ok, "{text}");
    let deb = text.trim().lines().last().unwrap().to_string();
    let (ok, contents) = run(Command::new("dpkg-deb").args(["--contents", &deb]));
    assert!(ok, "{contents}");
    for path in [
        "./usr/bin/quicsdn",
        "./lib/systemd/system/quicsdn-switch.service",
        "./lib/systemd/system/quicsdn-controller.service",
        "./etc/quicsdn/switch.toml",
        "./etc/quicsdn/controller.toml",
        "./usr/share/doc/quicsdn/operations.md",
    ] {
        assert!(contents.contains(path), "{path} missing:\n{contents}");
    }
    let (ok, conffiles) = run(Command::new("dpkg-deb").args(["--ctrl-tarfile", &deb]));
    assert!(ok);
    assert!(conffiles.contains("conffiles"));
    let (_, package) = run(Command::new("dpkg-deb").args(["--field", &deb, "Package"]));
    assert_eq!(package.trim(), "quicsdn");
}
