//! Running external tools (`ip`, `ovs-vsctl`, `openssl`, …) with errors that say
//! what failed.
//!
//! Every helper here runs the program to completion and returns its standard
//! output; a non-zero exit becomes an error naming the full command line and
//! quoting its standard error, so a failing lab step explains itself.

use std::ffi::OsStr;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The command line of `cmd`, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion (standard input closed) and returns its standard output.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{}`", describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `program args…` and returns its standard output.
pub fn run_args<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Result<String> {
    run(Command::new(program).args(args))
}

/// Fails unless running as root: namespaces, veths and OVS all need it.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "quicsdn-lab needs root (network namespaces, veth pairs, Open vSwitch); run it with sudo"
        );
    }
    Ok(())
}
