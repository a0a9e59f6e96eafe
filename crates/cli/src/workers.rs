//! `quicsdn controller --workers N`: N controller-agent processes on one UDP
//! port, so a multi-core host is used (one agent process is bound by its
//! handshakes' CPU, docs/scale.md).
//!
//! Why a supervisor with worker processes, rather than independent agents
//! each joining a `SO_REUSEPORT` group: the steering program can only name a
//! socket by its position in the group, and positions move when an
//! independent process leaves and rejoins ([`quicsdn_transport::reuseport`]).
//! Here the supervisor opens all N sockets once, in order, and keeps them;
//! worker *i* is started on socket *i* (inherited, the fd named in
//! `QUICSDN_WORKER`) with worker octet *i* after the host's `--server-id` in
//! its connection IDs, and restarted on the same socket if
//! it dies. Processes rather than threads: a worker that crashes takes only
//! its own switches down, and they reconnect to whichever worker their
//! address hashes to. As an operator expects from nginx's or HAProxy's
//! workers, the supervisor forwards SIGTERM (stop all) and SIGHUP (reload
//! the certificate files) to every worker.
//!
//! What each worker keeps for itself: its connections and sessions, its TLS
//! session store (`--session-store FILE` becomes `FILE.i`), its control
//! socket (`--control PATH` becomes `PATH.i`) and its metrics (`--metrics
//! IP:PORT` becomes port `PORT+i`).

use anyhow::{Context, Result, bail};
use quicsdn_agent::ControllerConfig;
use quicsdn_agent::controller::Worker;
use quicsdn_transport::quic_lb::ServerId;
use quicsdn_transport::reuseport;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

/// Set by the supervisor for a worker: `INDEX,FD`.
const ENV: &str = "QUICSDN_WORKER";

/// How long a worker that died waits before it is started again, so a worker
/// that cannot start does not spin.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// This process's worker index and socket, if a supervisor started it.
pub fn from_env() -> Result<Option<(u8, UdpSocket)>> {
    let Ok(value) = std::env::var(ENV) else {
        return Ok(None);
    };
    let parse = || -> Option<(u8, RawFd)> {
        let (i, fd) = value.split_once(',')?;
        Some((i.parse().ok()?, fd.parse().ok()?))
    };
    let (index, fd) = parse().with_context(|| format!("{ENV}={value:?}: expected INDEX,FD"))?;
    // SAFETY: fstat/getsockopt on an fd number only read; a closed or
    // foreign fd makes them fail, checked below before the fd is owned.
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut kind as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || kind != libc::SOCK_DGRAM {
        bail!("{ENV}: fd {fd} is not a UDP socket (started by hand, not by `--workers`?)");
    }
    // SAFETY: the supervisor passed this fd to us alone; it is a datagram
    // socket (checked above) and nothing else in this process owns it.
    let socket = unsafe { UdpSocket::from_raw_fd(fd) };
    // Not inherited any further (the supervisor cleared close-on-exec).
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(Some((index, socket)))
}

/// What each worker must not share with the others (module docs).
pub fn per_worker(config: &mut ControllerConfig, index: u8) -> Result<()> {
    let suffix = |p: &std::path::Path| Worker::path(p, index);
    config.session_store = config.session_store.as_deref().map(suffix);
    config.common.control = config.common.control.as_deref().map(suffix);
    if let Some(m) = config.common.metrics.as_mut()
        && m.port() != 0
    {
        let port = m.port().checked_add(u16::from(index)).with_context(|| {
            format!("--metrics {m}: no port for worker {index} (port + worker index)")
        })?;
        m.set_port(port);
    }
    Ok(())
}

/// Opens the group on `listen` and runs `workers` worker processes (this
/// program, same arguments) until SIGTERM or SIGINT.
pub fn supervise(workers: usize, listen: SocketAddr, server_id: Option<&ServerId>) -> Result<()> {
    let host_id_len = server_id.map_or(0, |id| id.as_bytes().len());
    let sockets = reuseport::bind_group(listen, workers, host_id_len)?;
    let addr = sockets[0].local_addr()?;
    let exe = std::env::current_exe().context("cannot find this program to start workers")?;
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        let (stop_tx, stop) = watch::channel(false);
        let (hup_tx, _) = tokio::sync::broadcast::channel::<()>(4);
        let mut tasks = tokio::task::JoinSet::new();
        for (i, socket) in sockets.into_iter().enumerate() {
            let cmd = WorkerCommand {
                exe: exe.clone(),
                args: args.clone(),
                index: i,
                socket,
            };
            tasks.spawn(run_worker(cmd, stop.clone(), hup_tx.subscribe()));
        }
        info!(listen = %addr, workers, "controller agent workers started");
        crate::systemd::ready(&format!("controller agent on {addr}, {workers} workers"));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = hup.recv() => { let _ = hup_tx.send(()); }
            }
        }
        crate::systemd::stopping();
        info!("stopping the workers");
        let _ = stop_tx.send(true);
        while tasks.join_next().await.is_some() {}
        Ok(())
    })
}

struct WorkerCommand {
    exe: std::path::PathBuf,
    args: Vec<std::ffi::OsString>,
    index: usize,
    socket: UdpSocket,
}

impl WorkerCommand {
    fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        let fd = self.socket.as_raw_fd();
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(&self.args)
            .env(ENV, format!("{},{fd}", self.index))
            // The supervisor tells systemd; workers would be refused anyway.
            .env_remove("NOTIFY_SOCKET")
            .kill_on_drop(true);
        // SAFETY: between fork and exec only fcntl, async-signal-safe, on an
        // fd the child inherited.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn()
    }
}

/// Keeps worker `cmd.index` running until `stop`: restarts it (on the same
/// socket) when it exits, forwards SIGHUP, and sends SIGTERM at the end.
async fn run_worker(
    cmd: WorkerCommand,
    mut stop: watch::Receiver<bool>,
    mut hup: tokio::sync::broadcast::Receiver<()>,
) {
    let i = cmd.index;
    loop {
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                warn!(worker = i, "cannot start worker: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(RESTART_DELAY) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        let pid = child.id();
        info!(worker = i, pid, "worker started");
        loop {
            tokio::select! {
                status = child.wait() => {
                    warn!(worker = i, pid, "worker exited ({}); starting it again", match status {
                        Ok(s) => s.to_string(),
                        Err(e) => e.to_string(),
                    });
                    break;
                }
                _ = hup.recv() => signal(pid, libc::SIGHUP),
                _ = stop.changed() => {
                    signal(pid, libc::SIGTERM);
                    let _ = child.wait().await;
                    info!(worker = i, pid, "worker stopped");
                    return;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RESTART_DELAY) => {}
            _ = stop.changed() => return,
        }
    }
}

fn signal(pid: Option<u32>, sig: libc::c_int) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}
