//! What the storm bench reads about processes and sockets: CPU time and memory
//! from `/proc`, drops at a UDP socket, the file-descriptor limit.

/// CPU time (user + system) of a process so far, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are f[11], f[12] after the command name.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

/// A `kB` field of `/proc/PID/status` (`VmRSS`, `VmHWM`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    kib_field(&s, field)
}

/// A `kB` field of `/proc/PID/smaps_rollup` (`Rss`, `Pss`, `Pss_Anon`), in KiB.
pub fn smaps_rollup_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    kib_field(&s, field)
}

fn kib_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The PIDs of `pid`'s child processes (field 4 of `/proc/N/stat`; this
/// kernel has no `/proc/PID/task/TID/children`): a `--workers` supervisor's
/// workers.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&n| parent(n) == Some(pid))
        .collect()
}

fn parent(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name: state, then the parent's PID.
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Datagrams dropped on arrival (receive buffer full) at the IPv4 UDP sockets
/// bound to `port` (`/proc/net/udp`, last column).
pub fn udp_drops(port: u16) -> u64 {
    let text = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    udp_drops_in(&text, port)
}

fn udp_drops_in(text: &str, port: u16) -> u64 {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let p = f
                .get(1)?
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())?;
            (p == port).then(|| f.last()?.parse::<u64>().ok())?
        })
        .sum()
}

/// Busy CPU seconds of the whole machine so far (`/proc/stat`: everything
/// but idle and iowait), to tell how much other processes ran meanwhile (the
/// machine may be shared).
pub fn machine_busy_seconds() -> f64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).unwrap_or(&0) + v.get(4).unwrap_or(&0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    total.saturating_sub(idle) as f64 / hz
}

/// Raises the limit on open files to at least `want` if it can: the soft
/// limit to the hard one, and, for a privileged process (the lab runs as
/// root), the hard limit too, up to the kernel's `fs.nr_open`. The bench holds
/// several descriptors per simulated switch, and its children (the controller
/// agent: two per switch) inherit the limit. Returns the soft limit now.
pub fn raise_fd_limit(want: u64) -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    // SAFETY: getrlimit/setrlimit read and write only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            if l.rlim_max < want {
                let raised = libc::rlimit {
                    rlim_cur: want.min(nr_open),
                    rlim_max: want.min(nr_open),
                };
                // Fails without CAP_SYS_RESOURCE: the hard limit stays.
                libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            }
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        }
    }
    l.rlim_cur
}

/// The processes the bench started (controller agents, the switch-agent
/// process, shard processes), stopped by [`teardown_on_signal`]'s thread.
static STARTED: std::sync::Mutex<Vec<crate::process::ProcRecord>> =
    std::sync::Mutex::new(Vec::new());
/// The work directory to remove then (none when it is kept).
static WORK_DIR: std::sync::Mutex<Option<std::path::PathBuf>> = std::sync::Mutex::new(None);

/// Removes `dir` too if the bench is interrupted.
pub fn remove_on_signal(dir: &std::path::Path) {
    *WORK_DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_path_buf());
}

/// Records a process the bench started, to stop it if the bench is
/// interrupted. A record of a process that has exited since matches nothing
/// (`ProcRecord` checks its start time), so none is ever removed.
pub fn track(proc: &crate::process::ProcRecord) {
    STARTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(proc.clone());
}

/// On SIGINT or SIGTERM, stops every process [`track`]ed (SIGTERM, SIGKILL
/// after 5 s) and exits with 128 + the signal, instead of leaving the
/// controller agent (its own process group, so a Ctrl-C does not reach it) and
/// the shard processes running. It installs signal *handlers* (tokio's), not
/// a blocked signal mask: a mask is inherited through fork and exec, so the
/// agents the bench starts would never see the SIGTERM the bench sends them
/// (they did, for a while: every "stop term" restart then waited out the
/// bench's 10 s grace and ended in SIGKILL). Handlers are reset by exec.
pub fn teardown_on_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if INSTALLED.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    // Registered here, before returning, so no signal is missed in between.
    let (mut int, mut term) = rt.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("storm-signals".into())
        .spawn(move || {
            let sig = rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => libc::SIGINT,
                    _ = term.recv() => libc::SIGTERM,
                }
            });
            eprintln!("storm: signal {sig}: stopping the processes the bench started");
            let started = STARTED.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for p in started.iter().rev() {
                if p.is_alive() {
                    eprintln!("storm: stopping {} (pid {})", p.name, p.pid);
                    let _ = p.terminate(std::time::Duration::from_secs(5));
                }
            }
            if let Some(dir) = WORK_DIR.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = std::fs::remove_dir_all(dir);
            }
            std::process::exit(128 + sig);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_readers() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some());
        assert!(status_kib(me, "VmRSS").unwrap() > 0);
        assert!(machine_busy_seconds() > 0.0);
        // A child of our own, stopped through its handle.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let found = children(me).contains(&child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(found, "a child of this process is listed");
        assert!(!children(me).contains(&child.id()), "a reaped child is not");
        assert_eq!(kib_field("Pss:   12 kB\n", "Pss"), Some(12));
        let udp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                   1: 0100007F:19FD 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 7\n\
                   2: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 9\n";
        assert_eq!(udp_drops_in(udp, 6653), 7);
        assert_eq!(udp_drops_in(udp, 53), 9);
        assert_eq!(udp_drops_in(udp, 1), 0);
    }
}
